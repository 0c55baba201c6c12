//! The local block cache of datasets read from object storage, against a real S3-compatible
//! server (moto, started here): a second epoch fetches nothing and reads bitwise the same
//! bytes as the local dataset; a small bound keeps the folder small; a damaged block is
//! fetched again; readers that share the folder at once each read right.
//!
//! One `#[test]` runs every part against one server, in turn.

mod common;

use std::path::{Path, PathBuf};

use common::moto::Moto;
use common::*;
use hspack::io::cache::{CacheOptions, CacheStats, BLOCK};
use hspack::io::open_location;
use hspack::transfer::{copy, CopyOptions};
use hspack::{CheckPolicy, Dataset, DatasetWriter, ReadOptions, WriteOptions};

const URL: &str = "s3://hspack-cache/big";
const HIDDEN: usize = 1024;

/// A local dataset of 4 shards of several blocks each, and a copy of it in S3.
fn datasets(dir: &Path) -> Dataset {
    let options = WriteOptions {
        shard_samples: 4,
        durable: false,
        ..WriteOptions::default()
    };
    let mut w = DatasetWriter::open(dir, capture_schema(HIDDEN as u64), options).unwrap();
    for i in 0..16u64 {
        let rows = 300 + (i as usize * 37) % 400;
        w.append(
            &format!("b{i}"),
            &as_fields(&capture_sample(i, rows, HIDDEN)),
        )
        .unwrap();
    }
    w.finish().unwrap();
    let local = Dataset::open(dir).unwrap();
    copy(
        &local,
        &open_location(URL).unwrap(),
        &CopyOptions::default(),
        &|_| {},
    )
    .unwrap();
    local
}

fn open_cached(dir: &Path, max_bytes: u64) -> Dataset {
    let options = ReadOptions {
        check: CheckPolicy::Always,
        cache: Some(CacheOptions {
            dir: dir.to_path_buf(),
            max_bytes,
        }),
        ..ReadOptions::default()
    };
    Dataset::open_with(URL, options).unwrap()
}

fn stats(ds: &Dataset) -> CacheStats {
    ds.cache().expect("a cache").stats()
}

fn block_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    v.retain(|p| p.extension().is_some_and(|e| e == "blk"));
    v
}

fn folder_bytes(dir: &Path) -> u64 {
    block_files(dir)
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

#[test]
fn chunk_cache_over_s3() {
    let Some(moto) = Moto::start() else { return };
    moto.bucket("hspack-cache");
    let tmp = tempfile::tempdir().unwrap();
    let local = datasets(&tmp.path().join("local"));
    let shard_bytes: u64 = local.manifest().shards.iter().map(|s| s.bytes).sum();
    assert!(
        local.manifest().shards.iter().all(|s| s.bytes > BLOCK),
        "every shard spans several blocks: {:?}",
        local
            .manifest()
            .shards
            .iter()
            .map(|s| s.bytes)
            .collect::<Vec<_>>()
    );

    let warm = tmp.path().join("warm");
    second_epoch_fetches_nothing(&local, &warm, shard_bytes);
    a_damaged_block_is_fetched_again(&local, &warm);
    a_repaired_shard_is_not_served_from_the_cache(&local, &warm);
    a_small_bound_keeps_the_folder_small(&local, &tmp.path().join("small"));
    readers_share_a_folder(&local, &tmp.path().join("shared"));
    a_local_folder_is_not_cached(&tmp.path().join("local"), &tmp.path().join("unused"));
}

fn second_epoch_fetches_nothing(local: &Dataset, dir: &Path, shard_bytes: u64) {
    let ds = open_cached(dir, u64::MAX);
    same_samples(local, &ds, |_| {});
    let first = stats(&ds);
    assert!(first.misses > 0 && first.fetched_bytes > 0, "{first:?}");
    assert!(
        first.fetched_bytes <= shard_bytes,
        "each block fetched once: {first:?}, shards hold {shard_bytes}"
    );
    assert_eq!((first.damaged, first.failed_writes), (0, 0));
    assert_eq!(folder_bytes(dir), first.fetched_bytes + 32 * first.misses);

    // The same dataset, again.
    same_samples(local, &ds, |_| {});
    let again = stats(&ds);
    assert_eq!(
        (again.misses, again.fetched_bytes),
        (first.misses, first.fetched_bytes)
    );

    // Another epoch, another open (as a new process would): all from the folder.
    let epoch2 = open_cached(dir, u64::MAX);
    same_samples(local, &epoch2, |_| {});
    let s = stats(&epoch2);
    assert_eq!((s.misses, s.fetches, s.fetched_bytes), (0, 0, 0), "{s:?}");
    assert!(s.hits >= first.misses && s.served_bytes > 0, "{s:?}");
}

fn a_damaged_block_is_fetched_again(local: &Dataset, dir: &Path) {
    let full = block_files(dir)
        .into_iter()
        .find(|p| std::fs::metadata(p).unwrap().len() == BLOCK + 32)
        .expect("a whole block");
    let mut bytes = std::fs::read(&full).unwrap();
    bytes[32 + BLOCK as usize / 2] ^= 0x01;
    std::fs::write(&full, &bytes).unwrap();

    let ds = open_cached(dir, u64::MAX);
    same_samples(local, &ds, |_| {});
    let s = stats(&ds);
    assert_eq!((s.damaged, s.misses, s.fetches), (1, 1, 1), "{s:?}");
    assert_eq!(s.fetched_bytes, BLOCK);
    let mended = std::fs::read(&full).unwrap();
    assert_eq!(
        mended[32 + BLOCK as usize / 2],
        bytes[32 + BLOCK as usize / 2] ^ 0x01
    );
}

/// A shard damaged in the bucket and read through the cache, then put back whole (as `hspack
/// repair` does: the same name, length and footer): the cache keys blocks by the object's
/// version too, so the repaired shard reads right, not the damaged blocks kept.
fn a_repaired_shard_is_not_served_from_the_cache(local: &Dataset, dir: &Path) {
    let s3 = open_location(URL).unwrap();
    let name = &local.manifest().shards[1].file;
    let good = s3.read(name).unwrap().unwrap();
    let mut bad = good.clone();
    bad[good.len() / 2] ^= 0x40;
    s3.replace(name, &bad, None, false).unwrap();
    let ds = open_cached(dir, u64::MAX);
    let failed = (0..ds.len())
        .filter(|&i| {
            let s = ds.sample(i).unwrap();
            (0..ds.schema().fields.len()).any(|f| s.read_field(f, None).is_err())
        })
        .count();
    assert!(failed > 0, "the damaged shard read clean");
    s3.replace(name, &good, None, false).unwrap();
    same_samples(local, &open_cached(dir, u64::MAX), |_| {});
}

fn a_small_bound_keeps_the_folder_small(local: &Dataset, dir: &Path) {
    let max = 2 * BLOCK + BLOCK / 4;
    let ds = open_cached(dir, max);
    for _ in 0..2 {
        same_samples(local, &ds, |i| {
            let size = folder_bytes(dir);
            assert!(size <= max, "after sample {i}: {size} > {max}");
        });
    }
    let s = stats(&ds);
    assert!(s.evicted > 0 && s.misses > s.evicted / 2, "{s:?}");
    assert!(folder_bytes(dir) > 0);
}

fn readers_share_a_folder(local: &Dataset, dir: &Path) {
    let got: Vec<CacheStats> = std::thread::scope(|scope| {
        let readers: Vec<_> = (0..3)
            .map(|_| {
                scope.spawn(|| {
                    let ds = open_cached(dir, u64::MAX);
                    same_samples(local, &ds, |_| {});
                    stats(&ds)
                })
            })
            .collect();
        readers.into_iter().map(|r| r.join().unwrap()).collect()
    });
    for s in &got {
        assert_eq!((s.damaged, s.failed_writes), (0, 0), "{s:?}");
    }
    let after = open_cached(dir, u64::MAX);
    same_samples(local, &after, |_| {});
    let s = stats(&after);
    assert_eq!((s.misses, s.fetched_bytes, s.damaged), (0, 0, 0), "{s:?}");
    assert!(
        !std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with(".tmp")),
        "no temp file left"
    );
}

fn a_local_folder_is_not_cached(folder: &Path, dir: &Path) {
    let options = ReadOptions {
        cache: Some(CacheOptions::new(dir)),
        ..ReadOptions::default()
    };
    let ds = Dataset::open_with(folder, options).unwrap();
    assert!(ds.shard(0).unwrap().is_mapped());
    same_samples(&Dataset::open(folder).unwrap(), &ds, |_| {});
    assert_eq!(stats(&ds), CacheStats::default());
    assert!(!dir.exists());
}
