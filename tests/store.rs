//! The deduplicating store: datasets stored once, read and exported bit-exact, damage named,
//! garbage collected without losing what a dataset references, even when killed.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::cli::{hspack, stdout, text};
use common::{as_fields, bytes, capture_sample, capture_schema, s, same_samples, small_options};
use hspack::store::{gc, usage, Store};
use hspack::{Dataset, DatasetWriter, WriteOptions};

fn write_plain(dir: &Path, n: u64, seed: u64) {
    let mut w = DatasetWriter::create(dir, capture_schema(64), small_options()).unwrap();
    for i in 0..n {
        let smp = capture_sample(seed + i * 10, 3 + (i as usize * 7) % 40, 64);
        w.append(&format!("s{i}"), &as_fields(&smp)).unwrap();
    }
    w.finish().unwrap();
}

fn add(
    store: &Arc<Store>,
    ds: &Dataset,
    name: &str,
    _: &(dyn Fn(u64) + Sync),
) -> hspack::Result<(hspack::transfer::CopyReport, hspack::store::IngestStats)> {
    hspack::transfer::add_to_store(store, ds, name, &|_| {})
}

fn digest(dir: &Path) -> String {
    let ds = Dataset::open(dir).unwrap();
    blake3::hash(ds.manifest_bytes()).to_hex().to_string()
}

#[test]
fn a_dataset_added_twice_is_stored_once_and_exports_bit_exact() {
    let t = tempfile::tempdir().unwrap();
    let (src, store_dir) = (t.path().join("src"), t.path().join("store"));
    write_plain(&src, 23, 1);
    let store = Arc::new(Store::init(&store_dir).unwrap());
    let ds = Dataset::open(&src).unwrap();
    let (first, added) = add(&store, &ds, "a", &|_| {}).unwrap();
    assert!(added.bytes_new > 0 && first.digest == digest(&src));
    let (_, again) = add(&store, &ds, "b", &|_| {}).unwrap();
    assert_eq!(again.bytes_new, 0, "a re-import stores nothing: {again:?}");
    assert!(again.bytes_found >= added.bytes_new);
    // Read through the store: the same samples, bit for bit.
    let stored = Dataset::open(store_dir.join("b")).unwrap();
    same_samples(&ds, &stored, |_| {});
    // Export: a plain dataset with the original digest.
    let out = hspack(&[
        "store",
        "export",
        s(&store_dir.join("b")),
        s(&t.path().join("out")),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(digest(&t.path().join("out")), digest(&src));
    assert!(stdout(&out).contains(&digest(&src)));
    let u = usage::usage(&store).unwrap();
    assert_eq!(u.logical_bytes, 2 * u.datasets[0].logical_bytes);
    assert!(
        u.saved_across_datasets >= u.datasets[0].logical_bytes * 99 / 100,
        "{u:?}"
    );
    let v = hspack(&["store", "verify", s(&store_dir)]);
    assert!(
        v.status.success() && stdout(&v).contains("OK"),
        "{}",
        text(&v)
    );
}

/// A dataset of many small shards shares packs with them: an add indexes and proves the
/// shards it sends a group at a time. It used to publish a pack, an index run and
/// `index.json` per shard (and fsync each): 120 shards made more than 120 packs.
#[test]
fn a_dataset_of_many_small_shards_is_stored_in_few_packs() {
    let t = tempfile::tempdir().unwrap();
    let (src, store_dir) = (t.path().join("src"), t.path().join("store"));
    write_small_shards(&src, 120);
    let ds = Dataset::open(&src).unwrap();
    assert_eq!(ds.manifest().shards.len(), 120);
    let store = Arc::new(Store::init(&store_dir).unwrap());
    let (report, added) = add(&store, &ds, "a", &|_| {}).unwrap();
    assert_eq!((report.shards_sent, report.digest), (120, digest(&src)));
    assert_eq!(
        report.bytes_sent, report.bytes_reread,
        "every shard read back"
    );
    assert!(added.blobs_new > 120, "{added:?}");
    let packs = std::fs::read_dir(store_dir.join("packs")).unwrap().count();
    assert!(packs <= 8, "{packs} packs for 120 small shards");
    same_samples(&ds, &Dataset::open(store_dir.join("a")).unwrap(), |_| {});
    // Added again under another name: every blob found, nothing stored.
    let (_, again) = add(&store, &ds, "b", &|_| {}).unwrap();
    assert_eq!(again.blobs_new, 0, "{again:?}");
    let v = hspack(&["store", "verify", s(&store_dir)]);
    assert!(v.status.success(), "{}", text(&v));
    // A sync of more shards onto those there: proving the shards there published the pack
    // being filled, so a sync left dozens of small packs.
    let half = t.path().join("half");
    write_small_shards(&half, 60);
    let packs = || std::fs::read_dir(store_dir.join("packs")).unwrap().count();
    let o = hspack(&["cp", s(&half), s(&store_dir.join("c"))]);
    assert!(o.status.success(), "{}", text(&o));
    let before = packs();
    let o = hspack(&["sync", s(&src), s(&store_dir.join("c"))]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(packs() <= before + 3, "{before} packs, then {}", packs());
    assert_eq!(digest(&store_dir.join("c")), digest(&src));
}

/// A sample met again after the pack holding its blobs filled and was indexed (an add of more
/// than a pack's 64 MiB): its blobs are referenced, not stored twice.
#[test]
fn a_sample_repeated_after_a_pack_filled_is_stored_once() {
    let t = tempfile::tempdir().unwrap();
    let (src, store_dir) = (t.path().join("src"), t.path().join("store"));
    let options = WriteOptions {
        shard_samples: 1,
        chunk_bytes: Some(1 << 20),
        shard_bytes: 1 << 30,
        ..small_options()
    };
    let mut w = DatasetWriter::create(&src, capture_schema(4096), options).unwrap();
    let (a, b) = (
        capture_sample(1, 2500, 4096),
        capture_sample(100, 2500, 4096),
    );
    for (key, smp) in [("a", &a), ("b", &b), ("a-again", &a)] {
        w.append(key, &as_fields(smp)).unwrap();
    }
    w.finish().unwrap();
    let one: u64 = a.iter().map(|(_, v)| v.len() as u64).sum();
    let store = Arc::new(Store::init(&store_dir).unwrap());
    // One shard at a time, in order: `a` again comes once the pack `b` filled is indexed.
    let dst = Arc::new(store.dataset("d").unwrap());
    let options = hspack::transfer::CopyOptions {
        jobs: 1,
        ..Default::default()
    };
    let dst_storage: Arc<dyn hspack::io::Storage> = dst.clone();
    hspack::transfer::copy(
        &Dataset::open(&src).unwrap(),
        &dst_storage,
        &options,
        &|_| {},
    )
    .unwrap();
    let added = dst.added();
    assert!(added.bytes_found >= one, "{added:?}, {one} bytes a sample");
    assert!(
        added.bytes_new < 2 * one + (1 << 20),
        "{added:?}, {one} bytes a sample"
    );
    same_samples(
        &Dataset::open(&src).unwrap(),
        &Dataset::open(store_dir.join("d")).unwrap(),
        |_| {},
    );
}

/// A dataset of `n` samples, a shard each.
fn write_small_shards(dir: &Path, n: u64) {
    let options = WriteOptions {
        shard_samples: 1,
        ..small_options()
    };
    let mut w = DatasetWriter::create(dir, capture_schema(64), options).unwrap();
    for i in 0..n {
        let smp = capture_sample(i * 10, 3 + (i as usize * 7) % 40, 64);
        w.append(&format!("s{i}"), &as_fields(&smp)).unwrap();
    }
    w.finish().unwrap();
}

/// A pack cut short and the dataset repaired from a copy: the blobs the cut lost are stored
/// anew, the others still read where they are. `store verify` named the dataset as damaged
/// and advised removing it, until a collection ran; it names only the pack, and the
/// collection that rewrites it.
#[test]
fn a_pack_cut_short_and_repaired_is_left_to_gc_and_no_dataset_is_named() {
    let t = tempfile::tempdir().unwrap();
    let (src, store_dir) = (t.path().join("src"), t.path().join("store"));
    write_small_shards(&src, 120);
    let store = Arc::new(Store::init(&store_dir).unwrap());
    add(&store, &Dataset::open(&src).unwrap(), "a", &|_| {}).unwrap();
    drop(store);
    let biggest = std::fs::read_dir(store_dir.join("packs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap();
    let len = std::fs::metadata(&biggest).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&biggest)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let o = hspack(&["repair", s(&store_dir.join("a")), "--from", s(&src)]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(digest(&store_dir.join("a")), digest(&src));
    let v = hspack(&["store", "verify", s(&store_dir)]);
    let said = text(&v);
    assert!(
        !v.status.success()
            && said.contains("hspack store gc")
            && !said.contains("dataset `a`")
            && said.contains("1 dataset whole"),
        "{said}"
    );
    let o = hspack(&["store", "gc", s(&store_dir)]);
    assert!(o.status.success(), "{}", text(&o));
    let v = hspack(&["store", "verify", s(&store_dir)]);
    assert!(v.status.success(), "{}", text(&v));
    assert_eq!(digest(&store_dir.join("a")), digest(&src));
}

/// Two adds of the same dataset at once write the same index runs (runs are named by what
/// they hold): one merging a run away must never leave `index.json` naming it for the other.
/// Before, 8 of 40 such pairs left a store no command could open.
#[test]
fn two_adds_of_the_same_blobs_at_once_leave_a_store_that_opens() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    // Many shards (a run for each), so that adds merge runs while the other writes them.
    let mut w = DatasetWriter::create(
        &src,
        capture_schema(64),
        WriteOptions {
            shard_samples: 2,
            ..small_options()
        },
    )
    .unwrap();
    for i in 0..24u64 {
        let smp = capture_sample(i * 10, 3 + (i as usize * 7) % 40, 64);
        w.append(&format!("s{i}"), &as_fields(&smp)).unwrap();
    }
    w.finish().unwrap();
    for round in 0..20 {
        let store_dir = t.path().join(format!("store{round}"));
        Store::init(&store_dir).unwrap();
        let adds: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|name| {
                let (src, store_dir) = (src.clone(), store_dir.clone());
                std::thread::spawn(move || {
                    let store = Arc::new(Store::open(&store_dir).unwrap());
                    let ds = Dataset::open(&src).unwrap();
                    add(&store, &ds, name, &|_| {}).map(|_| ())
                })
            })
            .collect();
        for a in adds {
            a.join().unwrap().unwrap();
        }
        let v = hspack(&["store", "verify", s(&store_dir)]);
        assert!(v.status.success(), "round {round}: {}", text(&v));
        for name in ["a", "b"] {
            let stored = Dataset::open(store_dir.join(name)).unwrap();
            same_samples(&Dataset::open(&src).unwrap(), &stored, |_| {});
        }
    }
}

/// `rows` rows of a sample whose first `prefix` rows are those of `shared_seed`.
fn prefixed(
    seed: u64,
    shared_seed: u64,
    rows: usize,
    prefix: usize,
    hidden: usize,
) -> common::SampleBytes {
    let mut smp = capture_sample(seed, rows, hidden);
    let shared = capture_sample(shared_seed, prefix, hidden);
    for ((_, f), (_, p)) in smp.iter_mut().zip(&shared) {
        let n = p.len();
        f[..n].copy_from_slice(p);
    }
    smp
}

#[test]
fn writing_into_a_store_keeps_repeats_and_shared_prefixes_once() {
    // Rows of 2 × 2048 bf16 (8 KiB): token blocks of 16 rows are one 64 KiB chunk per field.
    const HIDDEN: usize = 2048;
    let t = tempfile::tempdir().unwrap();
    let store_dir = t.path().join("store");
    let store = Arc::new(Store::init(&store_dir).unwrap());
    let options = WriteOptions {
        durable: false,
        shard_samples: 16,
        ..WriteOptions::default()
    };
    let mut w = DatasetWriter::create(
        store_dir.join("cap"),
        capture_schema(HIDDEN as u64),
        options,
    )
    .unwrap();
    // 60 samples, ragged; every 3rd shares a 96-row prefix; every 10th repeats an earlier one.
    let mut unique = 0u64;
    let row = (4 + 1 + 2 * 2 * HIDDEN) as u64;
    let mut written: Vec<common::SampleBytes> = Vec::new();
    for i in 0..60u64 {
        let rows = 100 + ((i * 37) % 200) as usize;
        let smp = if i % 10 == 9 {
            written[(i as usize * i as usize * 31 + 5) % written.len()].clone()
        } else if i % 3 == 0 {
            // The prefix's hidden rows count once, its token ids and mask are in every chunk.
            unique += (rows as u64 - 96) * row + 96 * 5 + if i == 0 { 96 * (row - 5) } else { 0 };
            prefixed(1000 + i * 10, 7, rows, 96, HIDDEN)
        } else {
            unique += rows as u64 * row;
            capture_sample(1000 + i * 10, rows, HIDDEN)
        };
        w.append(&format!("k{i}"), &as_fields(&smp)).unwrap();
        written.push(smp);
    }
    w.finish().unwrap();
    let ds = Dataset::open(store_dir.join("cap")).unwrap();
    assert_eq!(ds.len(), 60);
    let (mut viewed, mut copied) = (0, 0);
    for (i, smp) in written.iter().enumerate() {
        let got = ds.get_by_key(&format!("k{i}")).unwrap();
        for (f, (_, b)) in smp.iter().enumerate() {
            let t = got.read_field(f, None).unwrap();
            assert_eq!(t.bytes(), &b[..], "k{i} field {f}");
            if ds.schema().fields[f].row_bytes() < 4096 {
                continue; // token ids and mask: one chunk of many blocks
            }
            // A hidden field of several 16-row blocks: one view of the pack where its blocks
            // lie one after another there (a new sample, or a repeat of one), a copy where its
            // first blocks are an earlier sample's prefix.
            let fresh = i % 3 != 0 && i % 10 != 9;
            if fresh {
                assert!(
                    t.data.is_mapped(),
                    "k{i} field {f}: blocks laid in order read in place"
                );
                viewed += 1;
            } else if i % 3 == 0 && i > 0 && i % 10 != 9 {
                assert!(
                    !t.data.is_mapped(),
                    "k{i} field {f}: a shared prefix is read by copy"
                );
                copied += 1;
            }
        }
    }
    assert!(viewed > 0 && copied > 0, "{viewed} views, {copied} copies");
    // Shards written into a store align payloads as a pack's blobs are (64 bytes): exported,
    // the shard's header says so; a plain dataset keeps 4 KiB.
    let exported = t.path().join("exported");
    let out = hspack(&["store", "export", s(&store_dir.join("cap")), s(&exported)]);
    assert!(out.status.success(), "{}", text(&out));
    let shard = std::fs::read_dir(&exported)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "hsp"))
        .unwrap();
    assert_eq!(
        std::fs::read(&shard).unwrap()[10],
        6,
        "align_log2 of {shard:?}"
    );
    let plain = t.path().join("plain");
    write_plain(&plain, 2, 1);
    let shard = plain.join("shard-000000.hsp");
    assert_eq!(
        std::fs::read(&shard).unwrap()[10],
        12,
        "align_log2 of {shard:?}"
    );
    let u = usage::usage(&store).unwrap();
    let physical = u.pack_bytes + u.index_bytes;
    eprintln!(
        "physical {physical}, unique {unique}, logical {}",
        u.logical_bytes
    );
    assert!(
        physical as f64 <= unique as f64 * 1.02,
        "physical {physical} bytes, unique {unique}: {u:?}"
    );
    assert!(
        u.saved_whole_samples > 0 && u.saved_shared_rows > 0,
        "{u:?}"
    );
    let v = hspack(&["verify", s(&store_dir.join("cap"))]);
    assert!(v.status.success(), "{}", text(&v));
}

#[test]
fn damage_in_a_pack_is_named_by_store_verify_and_by_verify() {
    let t = tempfile::tempdir().unwrap();
    let (src, store_dir) = (t.path().join("src"), t.path().join("store"));
    write_plain(&src, 12, 5);
    let store = Arc::new(Store::init(&store_dir).unwrap());
    add(&store, &Dataset::open(&src).unwrap(), "d", &|_| {}).unwrap();
    // The largest pack holds the payloads; flip a byte in its first blob.
    let mut packs: Vec<_> = std::fs::read_dir(store_dir.join("packs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    packs.sort_by_key(|p| std::fs::metadata(p).unwrap().len());
    let pack = packs.last().unwrap();
    common::flip(pack, 64 + 10);
    let v = hspack(&["store", "verify", s(&store_dir)]);
    assert_eq!(v.status.code(), Some(1), "{}", text(&v));
    let name = pack.file_name().unwrap().to_str().unwrap();
    assert!(
        stdout(&v).contains("DAMAGED") && stdout(&v).contains(name),
        "{}",
        text(&v)
    );
    // It names the dataset and what mends it, and does not send the reader to itself.
    assert!(
        !text(&v).contains("run `hspack store verify`") && text(&v).contains("store/d"),
        "{}",
        text(&v)
    );
    let d = hspack(&["verify", s(&store_dir.join("d"))]);
    assert_eq!(d.status.code(), Some(1), "{}", text(&d));
    // Every pack damaged near its end, where the small files and skeletons lie: the dataset
    // is said to reference what does not read, again without that advice.
    for pack in &packs {
        let len = std::fs::metadata(pack).unwrap().len();
        for at in [len * 3 / 4, len - 200] {
            common::flip(pack, at);
        }
    }
    let v = hspack(&["store", "verify", s(&store_dir)]);
    assert_eq!(v.status.code(), Some(1), "{}", text(&v));
    assert!(
        text(&v).contains("references what does not read")
            && !text(&v).contains("run `hspack store verify`"),
        "{}",
        text(&v)
    );
}

/// `store add` of another dataset under a name taken is refused saying so, with what to do
/// (it said "choose an empty destination"); the dataset there stays.
#[test]
fn an_add_under_a_name_another_dataset_has_says_the_name_is_taken() {
    let t = tempfile::tempdir().unwrap();
    let store_dir = t.path().join("store");
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    write_plain(&a, 3, 1);
    // Another dataset (its own id, as every demo gets one).
    let o = hspack(&["demo", "--out", s(&b), "--samples", "2", "--hidden", "64"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(hspack(&["store", "init", s(&store_dir)]).status.success());
    let o = hspack(&["store", "add", s(&store_dir), s(&a), "--name", "x"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = hspack(&["store", "add", s(&store_dir), s(&b), "--name", "x"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("another dataset named `x`")
            && text(&o).contains("--name")
            && text(&o).contains("hspack store rm"),
        "{}",
        text(&o)
    );
    assert_eq!(Dataset::open(store_dir.join("x")).unwrap().len(), 3);
}

#[test]
fn gc_frees_what_no_dataset_references_and_keeps_the_rest() {
    let t = tempfile::tempdir().unwrap();
    let store_dir = t.path().join("store");
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    write_plain(&a, 15, 1);
    write_plain(&b, 15, 500);
    let store = Arc::new(Store::init(&store_dir).unwrap());
    add(&store, &Dataset::open(&a).unwrap(), "a", &|_| {}).unwrap();
    add(&store, &Dataset::open(&b).unwrap(), "b", &|_| {}).unwrap();
    let before = usage::usage(&store).unwrap().pack_bytes;
    assert!(hspack(&["store", "rm", s(&store_dir), "a"])
        .status
        .success());
    let r = gc::collect(&store, false).unwrap();
    assert!(r.blobs_removed > 0 && r.bytes_freed > 0, "{r:?}");
    let after = usage::usage(&store).unwrap();
    assert!(
        after.pack_bytes < before * 7 / 10,
        "{} then {}",
        before,
        after.pack_bytes
    );
    same_samples(
        &Dataset::open(&b).unwrap(),
        &Dataset::open(store_dir.join("b")).unwrap(),
        |_| {},
    );
    assert!(Dataset::open(store_dir.join("a")).is_err());
    // A second collection finds nothing to do.
    let again = gc::collect(&store, false).unwrap();
    assert_eq!(
        (again.blobs_removed, again.packs_deleted),
        (0, 0),
        "{again:?}"
    );
}

/// A live blob a collection would move into a new pack, damaged at rest: the collection
/// stops, naming the pack, and deletes nothing (it copied the bytes on unchecked).
#[test]
fn gc_does_not_move_a_damaged_blob_on() {
    let t = tempfile::tempdir().unwrap();
    let store_dir = t.path().join("store");
    let (a, c) = (t.path().join("a"), t.path().join("c"));
    write_plain(&a, 12, 1);
    // a's first samples in other shards: their payloads are a's blobs, their skeletons not.
    let options = WriteOptions {
        shard_samples: 3,
        ..small_options()
    };
    let mut w = DatasetWriter::create(&c, capture_schema(64), options).unwrap();
    for i in 0..6u64 {
        let smp = capture_sample(1 + i * 10, 3 + (i as usize * 7) % 40, 64);
        w.append(&format!("c{i}"), &as_fields(&smp)).unwrap();
    }
    w.finish().unwrap();
    let store = Arc::new(Store::init(&store_dir).unwrap());
    add(&store, &Dataset::open(&a).unwrap(), "a", &|_| {}).unwrap();
    let of_a: Vec<_> = store.index().unwrap().entries().collect();
    add(&store, &Dataset::open(&c).unwrap(), "c", &|_| {}).unwrap();
    store.remove("a").unwrap();
    for e in &of_a {
        let pack = store_dir
            .join("packs")
            .join(hspack::store::pack::pack_name(&e.pack));
        common::flip(&pack, e.blob.offset + e.blob.stored_len / 2);
    }
    let packs = || std::fs::read_dir(store_dir.join("packs")).unwrap().count();
    let before = packs();
    let err = gc::collect(&store, false).unwrap_err().to_string();
    assert!(
        err.contains("damaged") && !err.contains("dataset `c`"),
        "{err}"
    );
    assert_eq!(packs(), before);
}

/// Flips a byte in the middle of the copy of blob `id` that the store in `store_dir` reads.
fn damage_blob(store_dir: &Path, id: &[u8; 32]) {
    let at = Store::open(store_dir)
        .unwrap()
        .index()
        .unwrap()
        .find(id)
        .unwrap();
    let pack = store_dir
        .join("packs")
        .join(hspack::store::pack::pack_name(&at.pack));
    common::flip(&pack, at.blob.offset + at.blob.stored_len / 2);
}

/// A store holding datasets `a` and `b` of the same samples, whose payload blob of `a`'s
/// first chunk is damaged at rest.
fn store_with_a_damaged_payload(t: &Path) -> (PathBuf, PathBuf) {
    let (store_dir, a) = (t.join("store"), t.join("a"));
    write_plain(&a, 12, 1);
    let store = Arc::new(Store::init(&store_dir).unwrap());
    let ds = Dataset::open(&a).unwrap();
    add(&store, &ds, "a", &|_| {}).unwrap();
    add(&store, &ds, "b", &|_| {}).unwrap();
    let hash = ds.shard(0).unwrap().index().chunk(0).unwrap().hash;
    damage_blob(&store_dir, &hash);
    assert!(!hspack(&["verify", s(&store_dir.join("b"))])
        .status
        .success());
    (store_dir, a)
}

/// A store (`T/store`) holding dataset `T/a` of 6 samples as `a`: its folder, the dataset's,
/// and the store.
fn store_holding_a(t: &Path) -> (PathBuf, PathBuf, Arc<Store>) {
    let (store_dir, a) = (t.join("store"), t.join("a"));
    write_plain(&a, 6, 1);
    let store = Arc::new(Store::init(&store_dir).unwrap());
    add(&store, &Dataset::open(&a).unwrap(), "a", &|_| {}).unwrap();
    (store_dir, a, store)
}

fn reads_as(store_dir: &Path, names: &[&str], a: &Path) {
    for name in names {
        let o = hspack(&["verify", s(&store_dir.join(name))]);
        assert!(o.status.success(), "{name}: {}", text(&o));
        same_samples(
            &Dataset::open(a).unwrap(),
            &Dataset::open(store_dir.join(name)).unwrap(),
            |_| {},
        );
    }
}

/// A store found the bytes `repair` sent under their hash and referred them to the damaged
/// copy unread: the repair failed, after deleting the shard, and the dataset lost samples it
/// read before. The bytes are stored anew, and every dataset referencing them reads them.
#[test]
fn repair_in_a_store_stores_anew_a_payload_damaged_at_rest() {
    let t = tempfile::tempdir().unwrap();
    let (store_dir, a) = store_with_a_damaged_payload(t.path());
    let o = hspack(&["repair", s(&store_dir.join("a")), "--from", s(&a)]);
    assert!(o.status.success(), "{}", text(&o));
    reads_as(&store_dir, &["a", "b"], &a);
    // The damaged copy is one no read finds: no damage of the store's, and collected.
    let o = hspack(&["store", "verify", s(&store_dir)]);
    assert!(o.status.success(), "{}", text(&o));
    let r = gc::collect(&Arc::new(Store::open(&store_dir).unwrap()), false).unwrap();
    assert!(r.packs_rewritten + r.packs_deleted > 0, "{r:?}");
    reads_as(&store_dir, &["a", "b"], &a);
}

/// A pack the index lists gone: a read called it a missing shard to `repair`, and `store
/// verify` said which pack but not which datasets lost blobs.
#[test]
fn a_lost_pack_is_the_stores_damage_and_store_verify_names_the_datasets_it_hits() {
    let t = tempfile::tempdir().unwrap();
    let (store_dir, a) = store_with_a_damaged_payload(t.path());
    let ds = Dataset::open(&a).unwrap();
    let hash = ds.shard(0).unwrap().index().chunk(0).unwrap().hash;
    let store = Store::open(&store_dir).unwrap();
    let at = store.index().unwrap().find(&hash).unwrap();
    std::fs::remove_file(
        store_dir
            .join("packs")
            .join(hspack::store::pack::pack_name(&at.pack)),
    )
    .unwrap();
    let said = text(&hspack(&["verify", s(&store_dir.join("a"))]));
    assert!(
        said.contains("the pack is missing") && !said.contains("manifest lists it"),
        "{said}"
    );
    // With the samples it held, as a plain dataset's damage is named.
    assert!(
        said.contains("; lost with it: shard 0 holding the samples of ordinals 0 to"),
        "{said}"
    );
    let o = hspack(&["store", "verify", s(&store_dir)]);
    assert!(!o.status.success());
    let said = text(&o);
    assert!(
        said.contains("dataset `a` references")
            && said.contains("dataset `b` references")
            && said.contains("store rm"),
        "{said}"
    );
    // As it says: added again from a copy, what the store lost is stored anew.
    assert!(hspack(&["store", "rm", s(&store_dir), "a"])
        .status
        .success());
    let o = hspack(&["store", "add", s(&store_dir), s(&a), "--name", "a"]);
    assert!(o.status.success(), "{}", text(&o));
    reads_as(&store_dir, &["a"], &a);
}

/// Any one pack lost (each in turn, in a store of `a` and `b` holding the same samples):
/// `repair STORE/a --from A` found the damage and replaced nothing, as the lost blob was the
/// store's file and not the shard's, and where the pack held the manifest's or a segment's
/// blob the dataset did not open. Now whatever the pack held is stored anew from the copy,
/// and both datasets read again.
#[test]
fn repair_from_a_copy_restores_any_pack_a_store_lost() {
    let t = tempfile::tempdir().unwrap();
    let a = t.path().join("a");
    write_plain(&a, 12, 1);
    let other = t.path().join("other");
    write_plain(&other, 12, 2);
    let mut lost_manifest = false;
    for k in 0.. {
        let store_dir = t.path().join(format!("store{k}"));
        let store = Arc::new(Store::init(&store_dir).unwrap());
        let ds = Dataset::open(&a).unwrap();
        add(&store, &ds, "a", &|_| {}).unwrap();
        add(&store, &ds, "b", &|_| {}).unwrap();
        drop(store);
        let mut packs: Vec<PathBuf> = std::fs::read_dir(store_dir.join("packs"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        packs.sort();
        if k == packs.len() {
            assert!(k >= 3, "{packs:?}");
            break;
        }
        std::fs::remove_file(&packs[k]).unwrap();
        let opens = Dataset::open(store_dir.join("a")).is_ok();
        if !opens {
            // A copy of another dataset gives nothing, the manifest least of all.
            let o = hspack(&["repair", s(&store_dir.join("a")), "--from", s(&other)]);
            assert!(!o.status.success(), "pack {k}: {}", text(&o));
            assert!(Dataset::open(store_dir.join("a")).is_err(), "pack {k}");
        }
        let o = hspack(&["repair", s(&store_dir.join("a")), "--from", s(&a)]);
        let said = text(&o);
        assert!(o.status.success(), "pack {k}: {said}");
        lost_manifest |= said.contains("its manifest.json restored");
        reads_as(&store_dir, &["a", "b"], &a);
        let o = hspack(&["store", "verify", s(&store_dir)]);
        assert!(o.status.success(), "pack {k}: {}", text(&o));
    }
    assert!(lost_manifest, "no pack held the manifest's blob");
}

/// A dataset's file recording a shard one byte longer than its blobs hold: every read of it
/// fails, advising `store verify`, which said OK.
#[test]
fn store_verify_checks_the_lengths_a_dataset_records_as_a_read_does() {
    let t = tempfile::tempdir().unwrap();
    let (store_dir, _, _) = store_holding_a(t.path());
    let file = store_dir.join("datasets").join("a.json");
    let mut snap: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let shard = snap["files"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|f| f["shard"] == true)
        .unwrap();
    shard["bytes"] = (shard["bytes"].as_u64().unwrap() + 1).into();
    std::fs::write(&file, serde_json::to_vec(&snap).unwrap()).unwrap();
    assert!(!hspack(&["verify", s(&store_dir.join("a"))])
        .status
        .success());
    let o = hspack(&["store", "verify", s(&store_dir)]);
    assert!(!o.status.success(), "{}", text(&o));
    let said = text(&o);
    assert!(
        said.contains("the dataset records") && said.contains("store rm"),
        "{said}"
    );
}

/// The same bytes added under another name: the copy proved what landed and failed, and
/// left an empty dataset listed. The shard is sent once more, with what the store finds
/// checked.
#[test]
fn an_add_into_a_store_holding_a_damaged_copy_of_its_bytes_stores_them_anew() {
    let t = tempfile::tempdir().unwrap();
    let (store_dir, a) = store_with_a_damaged_payload(t.path());
    let o = hspack(&["store", "add", s(&store_dir), s(&a), "--name", "c"]);
    assert!(o.status.success(), "{}", text(&o));
    reads_as(&store_dir, &["a", "b", "c"], &a);
}

/// An `index.json` restored from an older copy lists not the runs (nor the packs) of a later
/// add: a collection would delete those packs as unlisted, though a dataset references their
/// blobs. It stops, naming the dataset, and deletes nothing; with the index put back, the
/// dataset reads.
#[test]
fn gc_deletes_nothing_while_a_dataset_references_a_blob_the_index_does_not_list() {
    let t = tempfile::tempdir().unwrap();
    let store_dir = t.path().join("store");
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    write_plain(&a, 6, 1);
    write_plain(&b, 6, 500);
    let store = Arc::new(Store::init(&store_dir).unwrap());
    add(&store, &Dataset::open(&a).unwrap(), "a", &|_| {}).unwrap();
    // A copy of the store's index as it was: `index.json` and the runs it lists.
    let index_files = || {
        std::fs::read_dir(&store_dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file() && p.file_name().unwrap() != "store.json")
            .map(|p| (p.clone(), std::fs::read(&p).unwrap()))
            .collect::<Vec<_>>()
    };
    let older = index_files();
    add(&store, &Dataset::open(&b).unwrap(), "b", &|_| {}).unwrap();
    let current = index_files();
    for (path, bytes) in &older {
        std::fs::write(path, bytes).unwrap();
    }
    let files = |dir: &str| {
        let mut names: Vec<_> = std::fs::read_dir(store_dir.join(dir))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        names
    };
    let (packs, runs) = (files("packs"), files(""));
    let store = Arc::new(Store::open(&store_dir).unwrap());
    let err = gc::collect(&store, false).unwrap_err().to_string();
    assert!(
        err.contains("dataset `b`") && err.contains("deletes nothing"),
        "{err}"
    );
    assert_eq!((files("packs"), files("")), (packs, runs));
    for (path, bytes) in &current {
        std::fs::write(path, bytes).unwrap();
    }
    let store = Arc::new(Store::open(&store_dir).unwrap());
    gc::collect(&store, false).unwrap();
    same_samples(
        &Dataset::open(&b).unwrap(),
        &Dataset::open(store_dir.join("b")).unwrap(),
        |_| {},
    );
}

/// A store's root is not a dataset's folder: a copy, a writer or a merge into it is refused
/// with what to name instead, and the store stays as it was.
#[test]
fn a_dataset_written_into_a_stores_root_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let (a, store_dir) = (t.path().join("a"), t.path().join("store"));
    write_plain(&a, 3, 1);
    Store::init(&store_dir).unwrap();
    let o = hspack(&["cp", s(&a), s(&store_dir)]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let said = text(&o);
    assert!(
        said.contains("is a store of datasets")
            && said.contains(&format!("{}/NAME", s(&store_dir))),
        "{said}"
    );
    let err = DatasetWriter::create(&store_dir, capture_schema(64), small_options()).unwrap_err();
    assert!(err.to_string().contains("is a store of datasets"), "{err}");
    let into = hspack::store::open_location(&store_dir).unwrap();
    let sources = [Dataset::open(&a).unwrap()];
    let err = hspack::transfer::merge(&sources, into, Default::default(), &|_| {}).unwrap_err();
    assert!(err.to_string().contains("is a store of datasets"), "{err}");
    assert!(!store_dir.join("manifest.json").exists());
    // A name no stored dataset may have was written as a folder among the store's files.
    for bad in ["bad name", ".hidden"] {
        let o = hspack(&["cp", s(&a), s(&store_dir.join(bad))]);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(text(&o).contains("a dataset name is"), "{}", text(&o));
        assert!(!store_dir.join(bad).exists());
    }
    assert!(hspack(&["cp", s(&a), s(&store_dir.join("a"))])
        .status
        .success());
}

/// `store gc` while a writer is between finding blobs and publishing what references them
/// (it holds `gc.lock` shared) says what it waits for, then collects once the writer is done.
#[test]
fn gc_says_it_waits_for_a_committing_writer_and_then_collects() {
    use std::io::Read;
    let t = tempfile::tempdir().unwrap();
    let store_dir = t.path().join("store");
    write_plain(&t.path().join("a"), 5, 1);
    let store = Arc::new(Store::init(&store_dir).unwrap());
    add(
        &store,
        &Dataset::open(t.path().join("a")).unwrap(),
        "a",
        &|_| {},
    )
    .unwrap();
    let writer = store.locks().adding().unwrap();
    let mut gc = Command::new(env!("CARGO_BIN_EXE_hspack"))
        .args(["store", "gc", s(&store_dir)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = gc.stderr.take().unwrap();
    let (said, heard) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = Vec::new();
        let mut byte = [0u8];
        while err.read(&mut byte).unwrap_or(0) == 1 && byte[0] != b'\n' {
            line.push(byte[0]);
        }
        said.send(String::from_utf8_lossy(&line).into_owned())
            .unwrap();
    });
    let line = heard.recv_timeout(Duration::from_secs(60)).unwrap();
    assert!(
        line.contains("waiting for the writers") && line.contains(s(&store_dir)),
        "{line}"
    );
    assert!(
        gc.try_wait().unwrap().is_none(),
        "gc ran while a writer held the store"
    );
    drop(writer);
    let out = gc.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("live"));
}

/// A store lock held past the wait (by a process that is stuck, or by a worker forked from a
/// killed writer, which keeps the lock file open): `store gc` and `store add` stop, naming
/// what holds it and how to find it, and change nothing; once it is let go, both run.
#[test]
fn a_store_lock_held_past_the_wait_is_named_and_nothing_changes() {
    let (t, store) = store_of_one_dataset();
    let store_dir = t.path().join("store");
    write_plain(&t.path().join("b"), 5, 2);
    let run = |args: &[&str]| {
        let start = std::time::Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_hspack"))
            .args(args)
            .env("HSPACK_COMMIT_WAIT_SECS", "1")
            .output()
            .unwrap();
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{args:?} waited on"
        );
        out
    };
    let gc_lock = store_dir.join("locks").join("gc.lock");
    let writer = store.locks().adding().unwrap();
    let out = run(&["store", "gc", s(&store_dir)]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("writers adding to the store")
            && said.contains(&format!("fuser -v {}", gc_lock.display())),
        "{said}"
    );
    drop(writer);
    let collecting = store.locks().collecting(&|_| {}).unwrap();
    let out = run(&[
        "store",
        "add",
        s(&store_dir),
        s(&t.path().join("b")),
        "--name",
        "b",
    ]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("a collection (`hspack store gc`)") && said.contains("fuser -v"),
        "{said}"
    );
    assert!(Dataset::open(store_dir.join("b")).is_err(), "b was added");
    drop(collecting);
    assert!(hspack(&[
        "store",
        "add",
        s(&store_dir),
        s(&t.path().join("b")),
        "--name",
        "b"
    ])
    .status
    .success());
    assert!(hspack(&["store", "gc", s(&store_dir)]).status.success());
    assert_eq!(Dataset::open(store_dir.join("b")).unwrap().len(), 5);
}

/// A dataset removed while `du` runs (listed, then its file gone: here a link to nothing)
/// has no entry, and what each other dataset alone holds is charged to it (the index into
/// the entries was shifted: bytes went to the next dataset, or out of bounds).
#[test]
fn usage_skips_a_dataset_removed_while_it_runs() {
    let t = tempfile::tempdir().unwrap();
    let store_dir = t.path().join("store");
    let store = Arc::new(Store::init(&store_dir).unwrap());
    for (name, seed) in [("b", 1), ("c", 500)] {
        let dir = t.path().join(name);
        write_plain(&dir, 5, seed);
        add(&store, &Dataset::open(&dir).unwrap(), name, &|_| {}).unwrap();
    }
    let alone = usage::usage(&store).unwrap();
    std::os::unix::fs::symlink(
        t.path().join("gone.json"),
        store_dir.join("datasets/a.json"),
    )
    .unwrap();
    assert_eq!(store.names().unwrap(), ["a", "b", "c"]);
    let u = usage::usage(&store).unwrap();
    let own = |u: &usage::StoreUsage| -> Vec<(String, u64)> {
        u.datasets
            .iter()
            .map(|d| (d.name.clone(), d.own_bytes))
            .collect()
    };
    assert_eq!(own(&u), own(&alone));
    assert!(u.datasets.iter().all(|d| d.own_bytes > 0), "{u:?}");
}

/// A store in `root/store` holding datasets `a` and `b` of 5 samples each (written plain
/// beside it, then added); its folder and the store.
fn store_of_a_and_b(root: &Path) -> (PathBuf, Arc<Store>) {
    let store_dir = root.join("store");
    let store = Arc::new(Store::init(&store_dir).unwrap());
    for (name, seed) in [("a", 1), ("b", 500)] {
        let dir = root.join(name);
        write_plain(&dir, 5, seed);
        add(&store, &Dataset::open(&dir).unwrap(), name, &|_| {}).unwrap();
    }
    (store_dir, store)
}

/// A dataset whose shard's skeleton the store lost: `ls` and `du` still list every dataset,
/// naming the damaged one and what to do (exit 1); `gc` deletes nothing and names it (one
/// such dataset stopped all three with a message naming only the store).
#[test]
fn a_damaged_dataset_is_named_by_ls_du_and_gc_and_does_not_hide_the_others() {
    let t = tempfile::tempdir().unwrap();
    let (store_dir, _) = store_of_a_and_b(t.path());
    let file = store_dir.join("datasets/a.json");
    let mut snap: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let shard = snap["files"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|f| f["shard"] == true)
        .unwrap();
    shard["blob"] = serde_json::json!("ab".repeat(32));
    std::fs::write(&file, serde_json::to_vec(&snap).unwrap()).unwrap();
    for command in ["ls", "du"] {
        let o = hspack(&["store", command, s(&store_dir)]);
        assert_eq!(o.status.code(), Some(1), "{command}: {}", text(&o));
        assert!(stdout(&o).contains('b'), "{command}: {}", text(&o));
        assert!(
            text(&o).contains("/a: DAMAGED") && text(&o).contains("store rm"),
            "{command}: {}",
            text(&o)
        );
    }
    let packs = std::fs::read_dir(store_dir.join("packs")).unwrap().count();
    let o = hspack(&["store", "gc", s(&store_dir)]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("dataset `a`") && text(&o).contains("deletes nothing"),
        "{}",
        text(&o)
    );
    assert_eq!(
        std::fs::read_dir(store_dir.join("packs")).unwrap().count(),
        packs
    );
}

/// A dataset's file that does not decode (garbage in `datasets/a.json`): `ls` and `du` list
/// the others and name `a` as damaged (exit 1), `store verify` names the file (exit 1);
/// `gc` refuses, naming the file and the `store rm` that removes it, and deletes nothing
/// (`a`'s blobs would look dead); `store rm` removes it (it refused, as every command but
/// `init` did), and then `gc` runs and `b` reads and verifies. (One such file stopped `ls`,
/// `du` and `gc` with no word of what to do.)
/// A stored dataset's record of its manifest claiming a terabyte is refused on the record,
/// before the blob is opened: a compressed blob is decoded whole when opened, so the claim
/// (with an index entry to match) would have been decoded into memory first.
#[test]
fn a_stored_file_recorded_longer_than_it_may_be_is_refused_before_it_is_read() {
    let t = tempfile::tempdir().unwrap();
    let (store_dir, _store) = store_of_a_and_b(t.path());
    let file = store_dir.join("datasets/a.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let files = v["files"].as_array_mut().unwrap();
    let manifest = files
        .iter_mut()
        .find(|f| f["name"] == "manifest.json")
        .unwrap();
    manifest["bytes"] = serde_json::json!(1u64 << 40);
    std::fs::write(&file, serde_json::to_vec(&v).unwrap()).unwrap();
    let err = Dataset::open(store_dir.join("a")).unwrap_err();
    let said = err.to_string();
    assert!(
        err.is_damage()
            && said.contains("the store records 1099511627776 bytes for it, more than the")
            && said.contains("manifest.json"),
        "{said}"
    );
}

#[test]
fn a_dataset_file_that_does_not_decode_is_named_and_can_be_removed() {
    let t = tempfile::tempdir().unwrap();
    let (store_dir, store) = store_of_a_and_b(t.path());
    let file = store_dir.join("datasets/a.json");
    std::fs::write(&file, b"garbage, not JSON").unwrap();
    let root = s(&store_dir);
    let rm = format!("hspack store rm {root} a");
    for command in ["ls", "du"] {
        let o = hspack(&["store", command, root]);
        assert_eq!(o.status.code(), Some(1), "{command}: {}", text(&o));
        assert!(stdout(&o).contains('b'), "{command}: {}", text(&o));
        assert!(
            text(&o).contains("/a: DAMAGED") && text(&o).contains(&rm),
            "{command}: {}",
            text(&o)
        );
    }
    let v = hspack(&["store", "verify", root]);
    assert_eq!(v.status.code(), Some(1), "{}", text(&v));
    assert!(stdout(&v).contains("DAMAGED") && stdout(&v).contains("a.json"));

    let packs = std::fs::read_dir(store_dir.join("packs")).unwrap().count();
    let o = hspack(&["store", "gc", root]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains(&*file.to_string_lossy())
            && text(&o).contains(&rm)
            && text(&o).contains("deletes nothing"),
        "{}",
        text(&o)
    );
    assert_eq!(
        std::fs::read_dir(store_dir.join("packs")).unwrap().count(),
        packs
    );

    let o = hspack(&["store", "rm", root, "a"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!file.exists());
    let r = gc::collect(&store, false).unwrap();
    assert!(r.blobs_removed > 0, "{r:?}");
    same_samples(
        &Dataset::open(t.path().join("b")).unwrap(),
        &Dataset::open(store_dir.join("b")).unwrap(),
        |_| {},
    );
    let v = hspack(&["store", "verify", root]);
    assert!(v.status.success(), "{}", text(&v));
    let o = hspack(&["store", "ls", root]);
    assert!(
        o.status.success() && !stdout(&o).contains("DAMAGED"),
        "{}",
        text(&o)
    );
}

/// A capture file that does not decode is a hint no lookup can use: lookups and `gc` pass
/// over it, and leave it for `store verify` to name (it stopped both, gc after it had
/// replaced the index).
#[test]
fn a_damaged_capture_file_is_passed_over() {
    let t = tempfile::tempdir().unwrap();
    let store_dir = t.path().join("store");
    let store = Arc::new(Store::init(&store_dir).unwrap());
    let src = t.path().join("src");
    write_plain(&src, 5, 1);
    add(&store, &Dataset::open(&src).unwrap(), "a", &|_| {}).unwrap();
    let bad = store_dir
        .join("captures")
        .join(format!("{}.capt", "0f".repeat(16)));
    std::fs::create_dir_all(bad.parent().unwrap()).unwrap();
    std::fs::write(&bad, b"not a capture file").unwrap();
    assert_eq!(store.find_captures(&[[7; 32]]).unwrap(), [None]);
    let r = gc::collect(&store, false).unwrap();
    assert_eq!(r.capture_files_removed, 0, "{r:?}");
    assert!(bad.exists());
    let check = usage::check(&store).unwrap();
    assert!(
        check.problems.iter().any(|p| p.contains("0f0f0f0f")),
        "{:?}",
        check.problems
    );
}

/// A store in a temp folder holding dataset `a` of 5 samples.
fn store_of_one_dataset() -> (tempfile::TempDir, Arc<Store>) {
    let t = tempfile::tempdir().unwrap();
    let store_dir = t.path().join("store");
    let src = t.path().join("src");
    write_plain(&src, 5, 1);
    let store = Arc::new(Store::init(&store_dir).unwrap());
    add(&store, &Dataset::open(&src).unwrap(), "a", &|_| {}).unwrap();
    (t, store)
}

/// A crafted index entry (or pack table) claiming a huge decoded length is damage named by
/// the blob, never an abort on the allocation (2^56 bytes was one).
#[test]
fn a_blob_claiming_a_huge_length_is_damage_not_an_abort() {
    use hspack::store::pack::BlobCodec;
    let (_t, store) = store_of_one_dataset();
    let index = store.index().unwrap();
    let zstd = index
        .entries()
        .find(|at| at.blob.codec == BlobCodec::Zstd)
        .expect("a compressed blob (a skeleton)");
    store.blob(&zstd).unwrap();
    for raw_len in [1 << 56, u64::MAX, zstd.blob.raw_len + 1] {
        let mut crafted = zstd;
        crafted.blob.raw_len = raw_len;
        let err = store.blob(&crafted).unwrap_err().to_string();
        assert!(
            err.contains(&format!(
                "declares {} bytes where the index records {raw_len}",
                zstd.blob.raw_len
            )),
            "{err}"
        );
    }
}

/// A crafted index entry whose offset and length add up past 2^64 is damage named by the
/// blob: the sum is not wrapped round to bytes at the start of the pack.
#[test]
fn a_blob_lying_past_the_end_of_any_file_is_damage_not_other_bytes() {
    let (_t, store) = store_of_one_dataset();
    let at = store.index().unwrap().entries().next().unwrap();
    store.stored(&at).unwrap();
    let mut crafted = at;
    crafted.blob.offset = u64::MAX - 4095;
    crafted.blob.stored_len = 8192;
    let err = store.stored(&crafted).unwrap_err().to_string();
    assert!(
        err.contains("past the end of any file") && err.contains("store verify"),
        "{err}"
    );
}

/// A pack cut short is damage named by its pack (`verify` and `store verify` exit 1), not a
/// read that failed and might work if run again.
#[test]
fn a_pack_cut_short_is_damage_not_a_failed_read() {
    let (t, store) = store_of_one_dataset();
    let store_dir = t.path().join("store");
    let last = (store.index().unwrap().entries())
        .max_by_key(|e| e.blob.offset + e.blob.stored_len)
        .unwrap();
    let name = hspack::store::pack::pack_name(&last.pack);
    let pack = store_dir.join("packs").join(&name);
    let f = std::fs::OpenOptions::new().write(true).open(&pack).unwrap();
    f.set_len(last.blob.offset + 1).unwrap();
    drop(f);
    for args in [
        &["verify", &format!("{}/a", s(&store_dir))][..],
        &["store", "verify", s(&store_dir)],
    ] {
        let o = hspack(args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", text(&o));
        assert!(
            stdout(&o).contains("DAMAGED") && text(&o).contains(&name),
            "{args:?}: {}",
            text(&o)
        );
    }
}

/// A trainer reads a stored dataset on while `store gc` rewrites the packs its samples are in
/// (another dataset that shared them went): the reader, opened before, finds every blob where
/// the collection moved it.
#[test]
fn a_reader_opened_before_a_collection_rewrote_its_packs_reads_on() {
    let t = tempfile::tempdir().unwrap();
    let store_dir = t.path().join("store");
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    write_plain(&a, 12, 1);
    // The same samples in other shards: its shards' skeletons are its own, their payloads a's.
    let mut w = DatasetWriter::create(
        &b,
        capture_schema(64),
        WriteOptions {
            shard_samples: 2,
            ..small_options()
        },
    )
    .unwrap();
    let source = Dataset::open(&a).unwrap();
    for i in 0..source.len() {
        let smp = capture_sample(1 + i * 10, 3 + (i as usize * 7) % 40, 64);
        w.append(&format!("s{i}"), &as_fields(&smp)).unwrap();
    }
    w.finish().unwrap();
    let store = Arc::new(Store::init(&store_dir).unwrap());
    add(&store, &source, "a", &|_| {}).unwrap();
    let (_, stats) = add(&store, &Dataset::open(&b).unwrap(), "b", &|_| {}).unwrap();
    assert!(stats.blobs_found > 0, "{stats:?}");
    let reader = Dataset::open(store_dir.join("b")).unwrap();
    store.remove("a").unwrap();
    let r = gc::collect(&store, false).unwrap();
    assert!(r.packs_rewritten > 0, "{r:?}");
    same_samples(&Dataset::open(&b).unwrap(), &reader, |_| {});
}

#[test]
fn killing_gc_while_a_writer_adds_loses_no_committed_chunk() {
    let t = tempfile::tempdir().unwrap();
    let store_dir = t.path().join("store");
    let (base, scratch) = (t.path().join("base"), t.path().join("scratch"));
    write_plain(&base, 20, 1);
    write_plain(&scratch, 20, 900);
    let store = Arc::new(Store::init(&store_dir).unwrap());
    add(&store, &Dataset::open(&base).unwrap(), "base", &|_| {}).unwrap();
    // The writer: a dataset written into the store, committing as it goes, on another thread,
    // while collections start and are killed.
    let writer_dir = store_dir.join("live");
    let writer = std::thread::spawn(move || {
        let mut w =
            DatasetWriter::create(&writer_dir, capture_schema(64), small_options()).unwrap();
        for i in 0..60u64 {
            let smp = capture_sample(3000 + i, 5 + i as usize % 30, 64);
            w.append(&format!("w{i}"), &as_fields(&smp)).unwrap();
            if i % 4 == 3 {
                w.commit().unwrap();
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        w.finish().unwrap();
    });
    let delays = bytes(77, 20);
    let (mut killed, mut finished) = (0, 0);
    for (round, d) in delays.iter().enumerate() {
        // Garbage for each collection: a dataset added and removed.
        let name = format!("scratch{round}");
        add(&store, &Dataset::open(&scratch).unwrap(), &name, &|_| {}).unwrap();
        store.remove(&name).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_hspack"))
            .args(["store", "gc", s(&store_dir)])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_micros(u64::from(*d) * 40));
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        match out.status.code() {
            Some(0) => finished += 1,
            None => killed += 1,
            Some(other) => panic!(
                "gc failed with exit code {other}: {}",
                String::from_utf8_lossy(&out.stderr)
            ),
        }
        // Whatever the collection had done, every committed dataset reads.
        same_samples(
            &Dataset::open(&base).unwrap(),
            &Dataset::open(store_dir.join("base")).unwrap(),
            |_| {},
        );
    }
    writer.join().unwrap();
    eprintln!("collections killed: {killed}, finished before the kill: {finished}");
    assert!(killed >= 10, "killed {killed} of 20");
    let live = Dataset::open(store_dir.join("live")).unwrap();
    assert_eq!(live.len(), 60);
    for i in 0..60u64 {
        let smp = capture_sample(3000 + i, 5 + i as usize % 30, 64);
        let got = live.get_by_key(&format!("w{i}")).unwrap();
        for (f, (_, b)) in smp.iter().enumerate() {
            assert_eq!(got.read_field(f, None).unwrap().bytes(), &b[..]);
        }
    }
    let done = hspack(&["store", "gc", s(&store_dir)]);
    assert!(done.status.success(), "{}", text(&done));
    let v = hspack(&["store", "verify", s(&store_dir)]);
    assert!(
        v.status.success() && stdout(&v).contains("2 datasets whole, 0 capture files: OK"),
        "{}",
        text(&v)
    );
    assert_eq!(digest(&store_dir.join("base")), digest(&base));
}

#[test]
fn capture_keys_find_stored_samples_until_their_dataset_goes() {
    use hspack::store::captures::{reuse_captured, sample_digest, sample_tensors, CaptureConfig};
    let t = tempfile::tempdir().unwrap();
    let (store_dir, _, store) = store_holding_a(t.path());
    let stored = Dataset::open(store_dir.join("a")).unwrap();
    let config = CaptureConfig {
        model: "m".into(),
        revision: None,
        config_hash: None,
        engine: "transformers".into(),
        deterministic: true,
        dtype: "bf16".into(),
        layers: vec![2],
        fields: vec![],
    };
    let key = |i: i64| config.key(&[i, i + 1], None);
    let records: Vec<_> = (0..6)
        .map(|i| {
            let t = sample_tensors(&stored, i).unwrap();
            let digest = sample_digest(t.iter().map(|(n, t)| (n.as_str(), t.bytes())));
            (key(i as i64), digest, format!("s{i}"))
        })
        .collect();
    store.record_captures("a", &records).unwrap();
    let hits = store.find_captures(&[key(4), key(40)]).unwrap();
    assert_eq!(
        hits[0].as_ref().map(|h| (h.dataset.as_str(), h.ordinal)),
        Some(("a", 4))
    );
    assert!(hits[1].is_none());

    // Reused into another dataset: the same bytes, under the new key.
    let mut w = DatasetWriter::create_in(
        Arc::new(store.dataset("b").unwrap()),
        capture_schema(64),
        WriteOptions::default(),
    )
    .unwrap();
    let (done, stats) = reuse_captured(
        &store,
        &mut w,
        &[("x".into(), key(4)), ("y".into(), key(9))],
    )
    .unwrap();
    assert_eq!(
        (done[0], done[1].is_none(), stats.reused),
        (Some(records[4].1), true, 1)
    );
    w.finish().unwrap();
    // Not into a dataset whose fields are of another dtype of the same width: the bytes
    // would pass every length check and mean other values.
    let mut f16 = capture_schema(64);
    for f in &mut f16.fields {
        if f.dtype == hspack::DType::BF16 {
            f.dtype = hspack::DType::F16;
        }
    }
    assert_ne!(f16, capture_schema(64));
    let mut w16 = DatasetWriter::create_in(
        Arc::new(store.dataset("f16").unwrap()),
        f16,
        WriteOptions::default(),
    )
    .unwrap();
    let (done, stats) = reuse_captured(&store, &mut w16, &[("x".into(), key(4))]).unwrap();
    assert_eq!((done[0], stats.reused, w16.len()), (None, 0, 0));
    drop(w16);
    let b = Dataset::open(store_dir.join("b")).unwrap();
    assert_eq!(b.len(), 1);
    assert_eq!(
        sample_tensors(&b, 0)
            .unwrap()
            .iter()
            .map(|(n, t)| (n.clone(), t.bytes().to_vec()))
            .collect::<Vec<_>>(),
        sample_tensors(&stored, 4)
            .unwrap()
            .iter()
            .map(|(n, t)| (n.clone(), t.bytes().to_vec()))
            .collect::<Vec<_>>()
    );

    // Verify names a damaged capture file; gc drops the files of removed datasets.
    let file = std::fs::read_dir(store_dir.join("captures"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let good = std::fs::read(&file).unwrap();
    let mut bad = good.clone();
    bad[200] ^= 1;
    std::fs::write(&file, &bad).unwrap();
    let check = usage::check(&store).unwrap();
    assert!(
        check
            .problems
            .iter()
            .any(|p| p.contains(&*file.to_string_lossy()) && p.contains("damaged")),
        "{:?}",
        check.problems
    );
    // Lookups pass over a damaged capture file (a hint), which verify names.
    assert!(store.find_captures(&[key(4)]).unwrap()[0].is_none());
    std::fs::write(&file, &good).unwrap();
    assert_eq!(usage::check(&store).unwrap().capture_files, 1);
    assert!(hspack(&["store", "rm", s(&store_dir), "a"])
        .status
        .success());
    assert!(store.find_captures(&[key(4)]).unwrap()[0].is_none());
    let r = gc::collect(&store, false).unwrap();
    assert_eq!(r.capture_files_removed, 1, "{r:?}");
    assert!(!file.exists());
    same_samples(&Dataset::open(store_dir.join("b")).unwrap(), &b, |_| {});
}

#[test]
fn a_damaged_index_run_is_named_by_store_verify_in_a_process_that_opened_it() {
    let t = tempfile::tempdir().unwrap();
    let store_dir = t.path().join("store");
    let a = t.path().join("a");
    write_plain(&a, 4, 7);
    let store = Arc::new(Store::init(&store_dir).unwrap());
    add(&store, &Dataset::open(&a).unwrap(), "a", &|_| {}).unwrap();
    let index = store.index().unwrap();
    let run = store_dir.join(&index.root.runs[0].file);
    assert!(usage::check(&store).unwrap().problems.is_empty());
    let mut bytes = std::fs::read(&run).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&run, &bytes).unwrap();
    let problems = usage::check(&store).unwrap().problems;
    assert!(
        problems
            .iter()
            .any(|p| p.contains(&*run.to_string_lossy()) && p.contains("BLAKE3")),
        "{problems:?}"
    );
}

/// An index that cannot be opened (`index.json` garbage, a run gone, a run's byte flipped):
/// `store verify` reports it DAMAGED (exit 1), not as an error (exit 2), and every command
/// that meets it says what to do.
#[test]
fn a_damaged_index_is_damage_named_with_what_to_do() {
    let t = tempfile::tempdir().unwrap();
    let store_dir = t.path().join("store");
    let a = t.path().join("a");
    write_plain(&a, 4, 7);
    let store = Arc::new(Store::init(&store_dir).unwrap());
    add(&store, &Dataset::open(&a).unwrap(), "a", &|_| {}).unwrap();
    let run = store_dir.join(&store.index().unwrap().root.runs[0].file);
    let index = store_dir.join("index.json");
    type Damage = fn(&Path);
    let damages: [(&str, &Path, Damage); 4] = [
        ("index.json garbage", &index, |p| {
            std::fs::write(p, b"{").unwrap()
        }),
        ("index.json gone", &index, |p| {
            std::fs::remove_file(p).unwrap()
        }),
        ("run gone", &run, |p| std::fs::remove_file(p).unwrap()),
        ("run flipped", &run, |p| common::flip(p, 70)),
    ];
    for (what, file, damage) in damages {
        let kept = std::fs::read(file).unwrap();
        damage(file);
        let v = hspack(&["store", "verify", s(&store_dir)]);
        assert_eq!(v.status.code(), Some(1), "{what}: {}", text(&v));
        assert!(
            stdout(&v).contains("DAMAGED") && stdout(&v).contains("restore index.json"),
            "{what}: {}",
            text(&v)
        );
        let ls = hspack(&["store", "ls", s(&store_dir)]);
        assert!(!ls.status.success(), "{what}: {}", text(&ls));
        assert!(
            text(&ls).contains("restore index.json"),
            "{what}: {}",
            text(&ls)
        );
        // A collection stops before it deletes anything.
        let packs = || std::fs::read_dir(store_dir.join("packs")).unwrap().count();
        let before = packs();
        let gc = hspack(&["store", "gc", s(&store_dir)]);
        assert!(!gc.status.success(), "{what}: {}", text(&gc));
        assert_eq!(packs(), before, "{what}: {}", text(&gc));
        std::fs::write(file, kept).unwrap();
        let v = hspack(&["store", "verify", s(&store_dir)]);
        assert!(v.status.success(), "{what}: {}", text(&v));
    }
}

#[test]
fn convert_into_a_store_dataset_killed_and_resumed_loses_nothing() {
    use common::dumps::{convert_command, run_then_kill, sample, write_dumps};
    const N: usize = 30;
    let t = tempfile::tempdir().unwrap();
    let (src, store_dir) = (t.path().join("src"), t.path().join("store"));
    write_dumps(&src, 0..N);
    Store::init(&store_dir).unwrap();
    let ds = store_dir.join("conv");
    let committed = || -> Vec<String> {
        match Dataset::open(&ds) {
            Ok(d) => (0..d.len())
                .map(|o| d.sample(o).unwrap().key().to_string())
                .collect(),
            Err(e) => {
                assert!(
                    matches!(e, hspack::Error::NotADataset { .. }),
                    "the dataset does not open: {e}"
                );
                Vec::new()
            }
        }
    };
    // Kills land at growing delays until one falls between commits; each run resumes.
    let (mut delay_ms, mut partial) = (5u64, 0);
    for _ in 0..10 {
        let finished = run_then_kill(&mut convert_command(&src, &ds), delay_ms);
        let n = committed().len();
        // `--delete-source`: a source goes only once its sample is committed.
        for i in 0..N {
            let key = format!("req_{i:03}");
            assert!(
                src.join(format!("{key}.safetensors")).exists() || committed().contains(&key),
                "{key} is neither a source nor committed"
            );
        }
        if !finished && n > 0 && n < N {
            partial += 1;
        }
        if n == 0 {
            delay_ms = delay_ms * 3 / 2 + 2;
        }
    }
    assert!(convert_command(&src, &ds).status().unwrap().success());
    let d = Dataset::open(&ds).unwrap();
    assert_eq!(d.len(), N as u64);
    for o in 0..d.len() {
        let s = d.sample(o).unwrap();
        let (ids, h) = sample(s.key()["req_".len()..].parse().unwrap());
        assert_eq!(s.read("input_ids", None).unwrap().bytes(), &ids[..]);
        assert_eq!(s.read("hidden.7", None).unwrap().bytes(), &h[..]);
    }
    assert!(partial > 0, "no kill landed between two commits");
    let v = hspack(&["store", "verify", s(&store_dir)]);
    assert!(v.status.success(), "{}", text(&v));
    let v = hspack(&["verify", s(&ds)]);
    assert!(v.status.success(), "{}", text(&v));
}

#[test]
fn gc_removes_what_dead_writers_staged_and_keeps_what_live_ones_stage() {
    use hspack::io::Storage;
    let t = tempfile::tempdir().unwrap();
    let store_dir = t.path().join("store");
    let store = Arc::new(Store::init(&store_dir).unwrap());
    let staged = || {
        std::fs::read_dir(store_dir.join("staging"))
            .unwrap()
            .count()
    };
    // A writer that died mid-shard: its staged file stays, its lock is gone.
    {
        let dead = store.dataset("dead").unwrap();
        let mut f = dead.create("shard-000000.hshard").unwrap();
        f.write_at(0, &[7; 4096]).unwrap();
    }
    // A writer at work: its dataset's lock is held while it stages.
    let live = store.dataset("live").unwrap();
    let mut f = live.create("shard-000000.hshard").unwrap();
    f.write_at(0, &[8; 4096]).unwrap();
    assert_eq!(staged(), 2);
    let r = gc::collect(&store, false).unwrap();
    assert_eq!(r.staged_files_removed, 1, "{r:?}");
    assert_eq!(staged(), 1);
    f.abandon();
    drop(live);
    assert_eq!(staged(), 0);
    // The collection let the dead dataset's lock go: it can be written.
    let again = store.dataset("dead").unwrap();
    again.create("x").unwrap().abandon();
}

#[test]
fn a_collection_waits_while_a_staged_shard_holds_payloads_no_commit_references() {
    use hspack::io::Storage;
    use std::sync::atomic::{AtomicBool, Ordering};
    let t = tempfile::tempdir().unwrap();
    let store_dir = t.path().join("store");
    let store = Arc::new(Store::init(&store_dir).unwrap());
    let ds = store.dataset("x").unwrap();
    // A shard being written hands a payload to the store ...
    let mut shard = ds.create("shard-000001.hshard").unwrap();
    assert!(shard.keeps_payloads());
    let payload = vec![9u8; 8192];
    shard
        .write_payload(4096, &payload, blake3::hash(&payload).as_bytes())
        .unwrap();
    // ... and another file's commit publishes the dataset meanwhile.
    ds.put_new("manifest.json", b"{}", false).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let gc = {
        let (store, done) = (Arc::clone(&store), Arc::clone(&done));
        std::thread::spawn(move || {
            let r = gc::collect(&store, false).unwrap();
            done.store(true, Ordering::SeqCst);
            r
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !done.load(Ordering::SeqCst),
        "a collection ran while a staged shard's payload was referenced by nothing published"
    );
    // Once the shard is abandoned and the writer gone, the collection runs and drops it.
    shard.abandon();
    drop(ds);
    let r = gc.join().unwrap();
    assert!(done.load(Ordering::SeqCst));
    assert_eq!(r.blobs_removed, 1, "{r:?}");
}

#[test]
fn convert_with_a_capture_config_copies_what_the_store_holds_without_reading_it() {
    use common::dumps::{sample, write_dumps, HIDDEN};
    let t = tempfile::tempdir().unwrap();
    let store_dir = t.path().join("store");
    Store::init(&store_dir).unwrap();
    let config = common::dumps::write_capture_config(t.path());
    let command = |src: &Path, dst: &Path| {
        let mut c = common::dumps::convert_command(src, dst);
        c.args(["--capture-config", s(&config), "--json"]);
        c
    };
    let convert = |src: &Path, name: &str| -> serde_json::Value {
        let out = command(src, &store_dir.join(name)).output().unwrap();
        assert!(out.status.success(), "{}", text(&out));
        serde_json::from_str(&stdout(&out)).unwrap()
    };
    // A first conversion: 12 requests, each recorded as a capture of its token ids.
    let first = t.path().join("first");
    write_dumps(&first, 0..12);
    // Captures are a store's: into a plain folder the option is refused, naming what to do.
    let out = command(&first, &t.path().join("plain")).output().unwrap();
    assert!(!out.status.success());
    assert!(text(&out).contains("STORE/NAME"), "{}", text(&out));
    let r = convert(&first, "run1");
    assert_eq!(
        (r["samples"].as_u64(), r["samples_reused"].as_u64()),
        (Some(12), Some(0))
    );
    // The key is FORMAT.md §11.7's, as `hspack.capture_key` makes it: tokens alone here.
    let st = Arc::new(Store::open(&store_dir).unwrap());
    let cfg = hspack::store::captures::CaptureConfig {
        model: "org/model".into(),
        revision: Some("abc".into()),
        config_hash: None,
        engine: "sglang".into(),
        deterministic: true,
        dtype: "bf16".into(),
        layers: vec![7],
        fields: vec!["input_ids".into(), "hidden.7".into()],
    };
    let tokens = |i: usize| -> Vec<i64> {
        sample(i)
            .0
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64)
            .collect()
    };
    let hit = st.find_captures(&[cfg.key(&tokens(4), None)]).unwrap();
    assert_eq!(hit[0].as_ref().map(|h| h.dataset.as_str()), Some("run1"));
    // A reordered superset under other file names, whose first 12 dumps have had their
    // hidden states overwritten: copied from the store, they are never read.
    let second = t.path().join("second");
    write_dumps(&second, 0..16);
    for i in 0..16 {
        let from = second.join(format!("req_{i:03}.safetensors"));
        let to = second.join(format!("prompt_{:03}.safetensors", 15 - i));
        if i < 12 {
            let bytes = std::fs::read(&from).unwrap();
            let h = sample(i).1;
            let at = bytes.windows(h.len()).position(|w| w == h).unwrap();
            let mut damaged = bytes.clone();
            damaged[at..at + h.len()].fill(0x5a);
            std::fs::write(&from, damaged).unwrap();
        }
        std::fs::rename(from, to).unwrap();
    }
    let third = t.path().join("third");
    std::fs::create_dir(&third).unwrap();
    for e in std::fs::read_dir(&second).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), third.join(e.file_name())).unwrap();
    }
    let r = convert(&second, "run2");
    assert_eq!(r["samples_reused"].as_u64(), Some(12), "{r}");
    assert_eq!(r["reused"].as_u64(), Some(12), "{r}");
    assert_eq!(
        r["samples"].as_u64(),
        Some(4),
        "only the new dumps are converted: {r}"
    );
    let ds = Dataset::open(store_dir.join("run2")).unwrap();
    assert_eq!(ds.len(), 16);
    for i in 0..16 {
        let s = ds.get_by_key(&format!("prompt_{:03}", 15 - i)).unwrap();
        let (ids, h) = sample(i);
        assert_eq!(s.read("input_ids", None).unwrap().bytes(), &ids[..], "{i}");
        assert_eq!(s.read("hidden.7", None).unwrap().bytes(), &h[..], "{i}");
        assert_eq!(s.rows() as usize * HIDDEN * 2, h.len());
    }
    // `--delete-source`: a source goes once committed and, where its sample was copied from
    // the store, once its hidden states are read and found equal to what the store holds;
    // the 12 whose hidden states differ are kept: their bytes are nowhere else.
    assert_eq!(
        (r["deleted"].as_u64(), r["kept"].as_u64()),
        (Some(4), Some(12)),
        "{r}"
    );
    let left: Vec<_> = std::fs::read_dir(&second).unwrap().collect();
    assert_eq!(left.len(), 12, "{left:?}");
    // Run again, they are samples the dataset holds under the same capture: compared, and
    // kept again.
    let r = convert(&second, "run2");
    assert_eq!(
        (
            r["samples"].as_u64(),
            r["deleted"].as_u64(),
            r["kept"].as_u64()
        ),
        (Some(0), Some(0), Some(12)),
        "{r}"
    );
    assert_eq!(std::fs::read_dir(&second).unwrap().count(), 12);
    // The 4 converted in run2 were recorded by the lanes: a third run copies all 16.
    let r = convert(&third, "run3");
    assert_eq!(
        (r["samples_reused"].as_u64(), r["samples"].as_u64()),
        (Some(16), Some(0)),
        "{r}"
    );
    let v = hspack(&["store", "verify", s(&store_dir)]);
    assert!(v.status.success(), "{}", text(&v));
}

/// A writer whose commit fails because the file naming the dataset's state cannot be
/// replaced (`blocker`, that file's temp name, is taken by a folder): the commit says so,
/// readers find the last commit, the writer stops, and one opened again goes on from the last
/// commit once the cause is gone.
fn a_commit_that_cannot_be_published_fails_and_the_last_commit_stays(dir: &Path, blocker: &Path) {
    let mut w = DatasetWriter::create(dir, capture_schema(64), small_options()).unwrap();
    w.append("a", &as_fields(&capture_sample(1, 5, 64)))
        .unwrap();
    w.commit().unwrap();
    std::fs::create_dir(blocker).unwrap();
    w.append("b", &as_fields(&capture_sample(2, 5, 64)))
        .unwrap();
    let err = w.commit().expect_err("the dataset's file was not replaced");
    let name = blocker.file_name().unwrap().to_str().unwrap();
    assert!(err.to_string().contains(name), "{err}");
    assert_eq!(
        Dataset::open(dir).unwrap().len(),
        1,
        "only `a` is committed"
    );
    std::fs::remove_dir(blocker).unwrap();
    // The writer stopped: `b` was given an ordinal, and is not in the dataset.
    let stopped = w
        .append("c", &as_fields(&capture_sample(3, 5, 64)))
        .unwrap_err();
    assert!(stopped.to_string().contains("`b` to `b`"), "{stopped}");
    drop(w);
    let mut w = DatasetWriter::open(dir, capture_schema(64), small_options()).unwrap();
    w.append("c", &as_fields(&capture_sample(3, 5, 64)))
        .unwrap();
    w.finish().unwrap();
    let ds = Dataset::open(dir).unwrap();
    let keys: Vec<String> = ds.samples().map(|s| s.unwrap().key.to_string()).collect();
    assert_eq!(keys, ["a", "c"]);
    let v = hspack(&["verify", s(dir)]);
    assert!(v.status.success(), "{}", text(&v));
}

#[test]
fn a_commit_whose_dataset_file_cannot_be_published_fails_and_the_last_commit_stays() {
    let t = tempfile::tempdir().unwrap();
    let store_dir = t.path().join("store");
    Store::init(&store_dir).unwrap();
    let plain = t.path().join("plain");
    a_commit_that_cannot_be_published_fails_and_the_last_commit_stays(
        &plain,
        &plain.join("manifest.json.tmp"),
    );
    let blocker = store_dir.join("datasets").join("cap.json.tmp");
    a_commit_that_cannot_be_published_fails_and_the_last_commit_stays(
        &store_dir.join("cap"),
        &blocker,
    );
}

/// The store's id names this machine's staging folder of a store in object storage (and
/// `store gc` deletes there): a `store.json` whose id is not 32 hex digits is refused at open,
/// naming the file, before anything uses it as a path.
#[test]
fn a_store_whose_id_is_not_32_hex_digits_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    Store::init(&store_dir).unwrap();
    let file = store_dir.join("store.json");
    let good = std::fs::read_to_string(&file).unwrap();
    let config: serde_json::Value = serde_json::from_str(&good).unwrap();
    let id = config["id"].as_str().unwrap().to_string();
    for bad in ["../../home/u/x", "", &id[..31], &format!("{}/", &id[..31])] {
        std::fs::write(&file, good.replace(&id, bad)).unwrap();
        let said = Store::open(&store_dir).unwrap_err().to_string();
        assert!(
            said.contains("store.json") && said.contains("not 32 hex digits"),
            "{bad:?}: {said}"
        );
    }
    std::fs::write(&file, good).unwrap();
    Store::open(&store_dir).unwrap();
}

/// A stored dataset's file copied by hand under another name (FORMAT.md §11.5: the name it
/// records is its file's): read as the other dataset, a writer of either took it for its own.
#[test]
fn a_stored_datasets_file_under_another_name_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let store_dir = t.path().join("store");
    let a = t.path().join("a");
    write_plain(&a, 3, 1);
    let store = Arc::new(Store::init(&store_dir).unwrap());
    add(&store, &Dataset::open(&a).unwrap(), "a", &|_| {}).unwrap();
    let datasets = store_dir.join("datasets");
    std::fs::copy(datasets.join("a.json"), datasets.join("c.json")).unwrap();
    let o = hspack(&["verify", s(&store_dir.join("c"))]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("records the name `a`, not `c`"),
        "{}",
        text(&o)
    );
    assert!(hspack(&["verify", s(&store_dir.join("a"))])
        .status
        .success());
}

/// A pack's header bytes FORMAT.md §11.2 says are zero, not zero: `store verify` said OK.
#[test]
fn store_verify_checks_a_packs_reserved_header_bytes() {
    let t = tempfile::tempdir().unwrap();
    let store_dir = t.path().join("store");
    let a = t.path().join("a");
    write_plain(&a, 3, 1);
    let store = Arc::new(Store::init(&store_dir).unwrap());
    add(&store, &Dataset::open(&a).unwrap(), "a", &|_| {}).unwrap();
    let pack = std::fs::read_dir(store_dir.join("packs"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    assert!(hspack(&["store", "verify", s(&store_dir)]).status.success());
    common::flip(&pack, 40);
    let o = hspack(&["store", "verify", s(&store_dir)]);
    assert!(!o.status.success());
    assert!(text(&o).contains("reserved"), "{}", text(&o));
}

/// A blob of a small file damaged at rest (a dataset's table part), and the dataset added
/// again from a copy as `store verify` advises: the add referred the part to the damaged copy
/// unread and failed (the dataset was removed already). Put once more, the store checking
/// what it finds, it is stored anew.
#[test]
fn a_dataset_whose_table_part_is_damaged_in_the_store_is_added_again_from_a_copy() {
    let t = tempfile::tempdir().unwrap();
    let (store_dir, a, _) = store_holding_a(t.path());
    let snap: serde_json::Value =
        serde_json::from_slice(&std::fs::read(store_dir.join("datasets").join("a.json")).unwrap())
            .unwrap();
    let part = snap["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"].as_str().unwrap().starts_with("samples-"))
        .unwrap();
    let id: [u8; 32] = blake3::Hash::from_hex(part["blob"].as_str().unwrap())
        .unwrap()
        .into();
    damage_blob(&store_dir, &id);
    let o = hspack(&["store", "verify", s(&store_dir)]);
    assert!(!o.status.success());
    assert!(text(&o).contains("store rm"), "{}", text(&o));
    assert!(hspack(&["store", "rm", s(&store_dir), "a"])
        .status
        .success());
    let o = hspack(&["store", "add", s(&store_dir), s(&a), "--name", "a"]);
    assert!(o.status.success(), "{}", text(&o));
    reads_as(&store_dir, &["a"], &a);
    // Damaged again where it was stored anew (a pack of its own): stored anew once more, not
    // at that place, so not in a pack of that name.
    for _ in 0..2 {
        damage_blob(&store_dir, &id);
        assert!(hspack(&["store", "rm", s(&store_dir), "a"])
            .status
            .success());
        let o = hspack(&["store", "add", s(&store_dir), s(&a), "--name", "a"]);
        assert!(o.status.success(), "{}", text(&o));
        reads_as(&store_dir, &["a"], &a);
    }
}

/// A new dataset named as one of the store's own folders is refused: converted into, its key
/// log went among the packs (counted by `du` as a pack, deleted by `gc`), and a convert into
/// `STORE/locks` was refused as a folder holding other files.
#[test]
fn a_dataset_named_as_a_folder_of_the_store_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let (store_dir, a, store) = store_holding_a(t.path());
    for name in hspack::store::STORE_FOLDERS {
        let e = add(&store, &Dataset::open(&a).unwrap(), name, &|_| {}).unwrap_err();
        assert!(
            e.to_string().contains(&format!(
                "`{name}` is the name of one of the store's own folders"
            )),
            "{e}"
        );
        let e = DatasetWriter::create(
            store_dir.join(name),
            Dataset::open(&a).unwrap().schema().clone(),
            Default::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("choose another name"), "{e}");
    }
    reads_as(&store_dir, &["a"], &a);
}

/// A dataset beside a store under `STORE/NAME` (copied there before `store init`, or by hand)
/// was read in place of the store's dataset `NAME`: `store add` said it stored one dataset,
/// and `digest`, `verify`, `export` and readers of `STORE/NAME` gave the other's samples. A
/// store's dataset is not made under such a name, and where both are there (the store's
/// made first), neither is read.
#[test]
fn a_dataset_beside_a_store_never_stands_for_the_stores_dataset() {
    let t = tempfile::tempdir().unwrap();
    let (root, plain, other) = (
        t.path().join("st"),
        t.path().join("st/run"),
        t.path().join("alt"),
    );
    write_plain(&plain, 4, 1);
    write_plain(&other, 4, 500);
    let store = Arc::new(Store::init(&root).unwrap());
    // The dataset already there is read as itself.
    same_samples(
        &Dataset::open(&plain).unwrap(),
        &Dataset::open(&plain).unwrap(),
        |_| {},
    );
    let e = add(&store, &Dataset::open(&other).unwrap(), "run", &|_| {}).unwrap_err();
    assert!(
        e.to_string()
            .contains("a dataset not in the store lies there"),
        "{e}"
    );
    let o = hspack(&["store", "add", s(&root), s(&other), "--name", "run"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("Choose another name"), "{}", text(&o));
    assert!(store.names().unwrap().is_empty());
    // The store's made first, a dataset copied beside it by hand afterwards.
    std::fs::rename(&plain, t.path().join("moved")).unwrap();
    add(&store, &Dataset::open(&other).unwrap(), "run", &|_| {}).unwrap();
    reads_as(&root, &["run"], &other);
    std::fs::rename(t.path().join("moved"), &plain).unwrap();
    let e = Dataset::open(&plain).unwrap_err();
    assert!(
        e.to_string().contains("two datasets answer to this path"),
        "{e}"
    );
    for args in [
        vec!["digest", s(&plain)],
        vec!["verify", s(&plain)],
        vec!["store", "export", s(&plain), s(&t.path().join("out"))],
    ] {
        let o = hspack(&args);
        assert!(!o.status.success(), "{args:?}: {}", text(&o));
        assert!(
            text(&o).contains("two datasets answer to this path"),
            "{args:?}: {}",
            text(&o)
        );
    }
    assert!(!t.path().join("out").exists());
}

/// A second writer of a store's dataset was refused with "another process writing, adding or
/// removing this dataset", naming no one: where the holder had been killed and a child it
/// forked held the lock still, nothing said so. The lock now records its holder, as a
/// folder's does (whose words, the exited holder and `fuser -v` among them, it shares).
#[test]
fn a_stores_dataset_lock_names_its_holder() {
    let t = tempfile::tempdir().unwrap();
    let store_dir = t.path().join("store");
    Store::init(&store_dir).unwrap();
    let first =
        DatasetWriter::create(store_dir.join("w"), capture_schema(8), small_options()).unwrap();
    let err =
        DatasetWriter::open(store_dir.join("w"), capture_schema(8), small_options()).unwrap_err();
    let said = err.to_string();
    assert!(matches!(err, hspack::Error::Locked { .. }), "{said}");
    assert!(
        said.contains(&format!("pid {} on ", std::process::id()))
            && said.contains("another writer of this process"),
        "{said}"
    );
    drop(first);
}
