use super::*;
use crate::io::{LocalStorage, MemoryStorage};

const B: u64 = 1000;

/// Bytes that differ at every offset, so a block served from the wrong place shows.
fn data(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

fn memory_with(name: &str, bytes: &[u8]) -> Arc<dyn Storage> {
    let m = MemoryStorage::new("cache-test");
    m.overwrite(name, bytes);
    Arc::new(m)
}

fn cache_in(dir: &Path, max_bytes: u64) -> ChunkCache {
    let options = CacheOptions {
        dir: dir.to_path_buf(),
        max_bytes,
    };
    ChunkCache::with_geometry(options, B, 0)
}

fn block_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    v.retain(|p| p.extension().is_some_and(|e| e == "blk"));
    v.sort();
    v
}

#[test]
fn reads_across_blocks_fetch_each_missing_run_once() {
    let tmp = tempfile::tempdir().unwrap();
    let bytes = data(9_500, 0);
    let cached = CachedStorage::new(memory_with("f", &bytes), cache_in(tmp.path(), u64::MAX));
    let f = cached.open("f").unwrap();
    assert_eq!(f.len(), 9_500);

    // Inside one block.
    assert_eq!(&*f.read(10..20).unwrap(), &bytes[10..20]);
    let s = cached.cache().stats();
    assert_eq!((s.misses, s.fetches, s.fetched_bytes, s.hits), (1, 1, B, 0));

    // Spanning blocks 0 (cached), 1 and 2 (missing, one fetch).
    assert_eq!(&*f.read(990..2010).unwrap(), &bytes[990..2010]);
    let s = cached.cache().stats();
    assert_eq!(
        (s.misses, s.fetches, s.fetched_bytes, s.hits),
        (3, 2, 3 * B, 1)
    );
    assert_eq!(s.served_bytes, 10);

    // The last block is short: 9000..9500.
    assert_eq!(&*f.read(9_400..9_500).unwrap(), &bytes[9_400..9_500]);
    let files = block_files(tmp.path());
    let last = files
        .iter()
        .find(|p| p.to_string_lossy().ends_with("-9.blk"))
        .unwrap();
    assert_eq!(
        std::fs::metadata(last).unwrap().len(),
        500 + CHECKSUM as u64
    );

    // The whole file: blocks 3..=8 missing, fetched in one read; the rest served.
    let before = cached.cache().stats();
    assert_eq!(&*f.read(0..9_500).unwrap(), &bytes[..]);
    let s = cached.cache().stats();
    assert_eq!(s.misses - before.misses, 6);
    assert_eq!(s.fetches - before.fetches, 1);
    assert_eq!(s.fetched_bytes - before.fetched_bytes, 6 * B);
    assert_eq!(s.hits - before.hits, 4);
    assert_eq!(block_files(tmp.path()).len(), 10);

    // Everything again: all hits, nothing fetched.
    let before = cached.cache().stats();
    assert_eq!(&*f.read(0..9_500).unwrap(), &bytes[..]);
    assert_eq!(&*f.read(1_999..2_001).unwrap(), &bytes[1_999..2_001]);
    let s = cached.cache().stats();
    assert_eq!(
        (s.misses, s.fetched_bytes),
        (before.misses, before.fetched_bytes)
    );
    assert_eq!(s.hits - before.hits, 12);
    assert_eq!(s.served_bytes - before.served_bytes, 9_502);

    // An empty range reads nothing; a range past the end is the wrapped reader's error.
    assert!(f.read(5..5).unwrap().is_empty());
    assert_eq!(cached.cache().stats(), s);
    let e = f.read(9_000..9_501).unwrap_err().to_string();
    assert!(
        e.contains("memory://cache-test/f") && e.contains("9000..9501"),
        "{e}"
    );
    assert_eq!(
        f.read(0..9_500).unwrap().as_ptr() as usize % 8,
        0,
        "aligned"
    );
}

#[test]
fn a_new_cache_over_the_same_folder_is_warm() {
    let tmp = tempfile::tempdir().unwrap();
    let bytes = data(4_321, 7);
    let storage = memory_with("f", &bytes);
    let first = CachedStorage::new(Arc::clone(&storage), cache_in(tmp.path(), u64::MAX));
    first.open("f").unwrap().read(0..4_321).unwrap();
    let second = CachedStorage::new(storage, cache_in(tmp.path(), u64::MAX));
    assert_eq!(
        &*second.open("f").unwrap().read(0..4_321).unwrap(),
        &bytes[..]
    );
    let s = second.cache().stats();
    assert_eq!(
        (s.hits, s.misses, s.fetched_bytes, s.served_bytes),
        (5, 0, 0, 4_321)
    );
}

#[test]
fn damaged_or_truncated_blocks_are_fetched_again() {
    let tmp = tempfile::tempdir().unwrap();
    let bytes = data(3_000, 1);
    let storage = memory_with("f", &bytes);
    CachedStorage::new(Arc::clone(&storage), cache_in(tmp.path(), u64::MAX))
        .open("f")
        .unwrap()
        .read(0..3_000)
        .unwrap();
    let files = block_files(tmp.path());
    assert_eq!(files.len(), 3);
    let mut flipped = std::fs::read(&files[0]).unwrap();
    flipped[CHECKSUM + 17] ^= 0x40;
    std::fs::write(&files[0], &flipped).unwrap();
    let short = std::fs::read(&files[1]).unwrap();
    std::fs::write(&files[1], &short[..short.len() - 1]).unwrap();

    let again = CachedStorage::new(storage, cache_in(tmp.path(), u64::MAX));
    assert_eq!(
        &*again.open("f").unwrap().read(0..3_000).unwrap(),
        &bytes[..]
    );
    let s = again.cache().stats();
    assert_eq!((s.damaged, s.misses, s.hits, s.fetches), (2, 2, 1, 1));
    // Both were written anew, intact.
    let fresh = CachedStorage::new(again.inner().clone(), cache_in(tmp.path(), u64::MAX));
    fresh.open("f").unwrap().read(0..3_000).unwrap();
    assert_eq!(fresh.cache().stats().hits, 3);
    assert_eq!(fresh.cache().stats().damaged, 0);
}

#[test]
fn another_object_under_the_same_name_is_never_served() {
    let tmp = tempfile::tempdir().unwrap();
    let m = MemoryStorage::new("cache-test");
    let old = data(2_500, 2);
    m.overwrite("f", &old);
    let storage: Arc<dyn Storage> = Arc::new(m.clone());
    let cache = cache_in(tmp.path(), u64::MAX);
    let cached = CachedStorage::new(storage, cache.clone());
    cached.open("f").unwrap().read(0..2_500).unwrap();
    // Same length, different bytes (and so a different tail).
    let new = data(2_500, 3);
    m.overwrite("f", &new);
    assert_eq!(
        &*cached.open("f").unwrap().read(0..2_500).unwrap(),
        &new[..]
    );
    assert_eq!(cache.stats().hits, 0);
    // Same tail, another length.
    let mut longer = vec![9u8; 100];
    longer.extend_from_slice(&new);
    m.overwrite("f", &longer);
    assert_eq!(
        &*cached.open("f").unwrap().read(0..2_600).unwrap(),
        &longer[..]
    );
    assert_eq!(cache.stats().hits, 0);
    assert_eq!(cache.stats().misses, 9);
}

#[test]
fn the_folder_stays_under_its_bound() {
    let tmp = tempfile::tempdir().unwrap();
    let bytes = data(20_000, 4);
    let max = 3 * (B + CHECKSUM as u64) + 10;
    let cached = CachedStorage::new(memory_with("f", &bytes), cache_in(tmp.path(), max));
    let f = cached.open("f").unwrap();
    for round in 0..2 {
        for start in (0..20_000).step_by(700) {
            let end = (start + 1_500).min(20_000);
            assert_eq!(
                &*f.read(start..end).unwrap(),
                &bytes[start as usize..end as usize]
            );
            let size = cached.cache().size_on_disk();
            assert!(size <= max, "round {round} at {start}: {size} > {max}");
        }
    }
    let s = cached.cache().stats();
    assert!(s.evicted >= 17, "{s:?}");
    assert!(block_files(tmp.path()).len() <= 3);
}

#[test]
fn eviction_takes_the_least_recently_used() {
    let tmp = tempfile::tempdir().unwrap();
    let bytes = data(4_000, 5);
    let max = 3 * (B + CHECKSUM as u64);
    let cache = cache_in(tmp.path(), max);
    let cached = CachedStorage::new(memory_with("f", &bytes), cache.clone());
    let f = cached.open("f").unwrap();
    f.read(0..3_000).unwrap();
    let files = block_files(tmp.path());
    // Block 0 used last, block 1 first.
    let t = SystemTime::now();
    let times = [
        t - Duration::from_secs(10),
        t - Duration::from_secs(30),
        t - Duration::from_secs(20),
    ];
    for (p, when) in files.iter().zip(times) {
        File::options()
            .write(true)
            .open(p)
            .unwrap()
            .set_modified(when)
            .unwrap();
    }
    f.read(3_000..4_000).unwrap(); // a fourth block: over the bound
    let left: Vec<_> = block_files(tmp.path());
    assert_eq!(left.len(), 2, "down to 90%: {left:?}");
    assert!(!left.contains(&files[1]) && !left.contains(&files[2]));
    assert!(left.contains(&files[0]));
}

#[test]
fn an_unwritable_folder_does_not_fail_reads() {
    let tmp = tempfile::tempdir().unwrap();
    let blocker = tmp.path().join("a-file");
    std::fs::write(&blocker, b"x").unwrap();
    let bytes = data(2_200, 6);
    let cache = cache_in(&blocker.join("cache"), u64::MAX);
    let cached = CachedStorage::new(memory_with("f", &bytes), cache.clone());
    let f = cached.open("f").unwrap();
    for _ in 0..2 {
        assert_eq!(&*f.read(100..2_200).unwrap(), &bytes[100..]);
    }
    // The first read fetched its blocks whole and could keep none; the second asks for its
    // bytes only (whole blocks it cannot keep cost more than no cache).
    let s = cache.stats();
    assert_eq!((s.failed_writes, s.misses, s.hits), (3, 3, 0), "{s:?}");
    assert_eq!((s.fetched_bytes, s.passed_bytes), (2_200, 2_100), "{s:?}");
    // A folder that cannot be read is no damaged block (nothing is deleted on its word).
    assert_eq!(s.damaged, 0, "{s:?}");
}

#[test]
fn a_bound_under_one_block_fetches_only_what_is_asked() {
    let tmp = tempfile::tempdir().unwrap();
    let bytes = data(5_000, 7);
    let cache = cache_in(tmp.path(), 0);
    let cached = CachedStorage::new(memory_with("f", &bytes), cache.clone());
    let f = cached.open("f").unwrap();
    assert_eq!(&*f.read(10..20).unwrap(), &bytes[10..20]);
    assert_eq!(&*f.read(900..3_100).unwrap(), &bytes[900..3_100]);
    let s = cache.stats();
    assert_eq!(
        (s.fetched_bytes, s.passed_bytes, s.misses),
        (0, 2_210, 0),
        "{s:?}"
    );
    assert!(block_files(tmp.path()).is_empty());
    // A folder filled under a larger bound is brought under this one.
    let filled = CachedStorage::new(memory_with("f", &bytes), cache_in(tmp.path(), u64::MAX));
    filled.open("f").unwrap().read(0..5_000).unwrap();
    assert_eq!(block_files(tmp.path()).len(), 5);
    let small = CachedStorage::new(memory_with("f", &bytes), cache_in(tmp.path(), 0));
    assert_eq!(
        &*small.open("f").unwrap().read(0..5_000).unwrap(),
        &bytes[..]
    );
    assert!(
        block_files(tmp.path()).is_empty(),
        "{:?}",
        small.cache().stats()
    );
}

#[test]
fn only_the_caches_own_files_are_ever_deleted() {
    let tmp = tempfile::tempdir().unwrap();
    let old = SystemTime::now() - 2 * STALE_TEMP;
    let theirs = [
        "disk-image.blk",
        "report.tmp",
        ".notes.blk.1.2.tmp",
        "keep.txt",
    ];
    let stale_ours = format!(".{}-0.blk.12.3.tmp", "ab".repeat(32));
    for name in theirs.iter().copied().chain([stale_ours.as_str()]) {
        let p = tmp.path().join(name);
        std::fs::write(&p, vec![0u8; 5_000]).unwrap();
        File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_modified(old)
            .unwrap();
    }
    let bytes = data(6_000, 8);
    let max = 2 * (B + CHECKSUM as u64);
    let cached = CachedStorage::new(memory_with("f", &bytes), cache_in(tmp.path(), max));
    let f = cached.open("f").unwrap();
    assert_eq!(&*f.read(0..6_000).unwrap(), &bytes[..]);
    assert!(cached.cache().stats().evicted >= 4);
    for name in theirs {
        assert!(tmp.path().join(name).exists(), "{name} was deleted");
    }
    assert!(
        !tmp.path().join(&stale_ours).exists(),
        "a stale temp of the cache's stays"
    );
    assert!(is_block_name(&format!("{}-1f.blk", "0a".repeat(32))));
    assert!(!is_block_name(&format!("{}-1f.blk", "0a".repeat(31))));
}

#[test]
fn a_fifo_or_folder_under_a_blocks_name_is_damage_not_a_hang() {
    let tmp = tempfile::tempdir().unwrap();
    let bytes = data(1_500, 9);
    let cache = cache_in(tmp.path(), u64::MAX);
    let cached = CachedStorage::new(memory_with("f", &bytes), cache.clone());
    let f = cached.open("f").unwrap();
    f.read(0..1_500).unwrap();
    let blocks = block_files(tmp.path());
    assert_eq!(blocks.len(), 2);
    std::fs::remove_file(&blocks[0]).unwrap();
    assert!(std::process::Command::new("mkfifo")
        .arg(&blocks[0])
        .status()
        .unwrap()
        .success());
    std::fs::remove_file(&blocks[1]).unwrap();
    std::fs::create_dir(&blocks[1]).unwrap();
    for _ in 0..2 {
        // A fresh cache over the folder: nothing held in memory.
        let again = CachedStorage::new(memory_with("f", &bytes), cache_in(tmp.path(), u64::MAX));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let f = again.open("f").unwrap();
            let _ = tx.send((f.read(0..1_500).map(|b| b.to_vec()), again.cache().stats()));
        });
        let (got, _) = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the read still waits on the FIFO after 30 s");
        assert_eq!(got.unwrap(), bytes);
    }
    // Both were found damaged once, removed, and the blocks kept again as files.
    for p in &blocks {
        assert!(std::fs::metadata(p).unwrap().is_file(), "{}", p.display());
    }
}

#[test]
fn tails_and_mapped_files_pass_through() {
    let tmp = tempfile::tempdir().unwrap();
    let bytes = data(5_000, 8);
    let options = CacheOptions::new(tmp.path().join("cache"));
    assert_eq!(options.max_bytes, DEFAULT_MAX_BYTES);
    let cache = ChunkCache::with_geometry(options, B, 1_200);
    let cached = CachedStorage::new(memory_with("f", &bytes), cache.clone());
    let f = cached.open("f").unwrap();
    assert_eq!(&*f.read(3_800..5_000).unwrap(), &bytes[3_800..]);
    let s = cache.stats();
    assert_eq!((s.passed_bytes, s.misses), (1_200, 0));
    assert_eq!(&*f.read(3_799..3_801).unwrap(), &bytes[3_799..3_801]);
    assert_eq!(cache.stats().misses, 1);

    let folder = tmp.path().join("folder");
    std::fs::create_dir(&folder).unwrap();
    std::fs::write(folder.join("g"), &bytes).unwrap();
    let local = CachedStorage::new(Arc::new(LocalStorage::new(&folder)), cache.clone());
    let g = local.open("g").unwrap();
    assert!(g.whole().is_some_and(|w| w.is_mapped()));
    assert!(g.read(0..10).unwrap().is_mapped());
    assert_eq!(cache.stats().misses, 1, "a mapped file is not cached");
}

/// The blocks read last are locked for an instant, never waited on: with them held elsewhere
/// for good (as a child forked mid-read finds them), reads go on from the block files.
#[test]
fn reads_go_on_while_the_recent_blocks_are_held_elsewhere() {
    let tmp = tempfile::tempdir().unwrap();
    let bytes = data(3_000, 5);
    let cached = CachedStorage::new(memory_with("f", &bytes), cache_in(tmp.path(), u64::MAX));
    let f = cached.open("f").unwrap();
    assert_eq!(&*f.read(0..2_500).unwrap(), &bytes[0..2_500]);
    let held = cached.cache().inner.recent.lock().unwrap();
    let again = cached.open("f").unwrap();
    assert_eq!(&*again.read(100..2_900).unwrap(), &bytes[100..2_900]);
    drop(held);
    assert!(cached.cache().stats().hits > 0);
}
