//! Verify passes over every byte of a dataset once, so the memory it holds must not grow with
//! the dataset: a 512 MB dataset is fully verified with the process's peak resident memory
//! (reset just before) under 160 MB; and the regions it maps must not grow with the shard
//! count. Alone in their test binary, one at a time, so no other test's memory counts.

mod common;

use hspack::verify::{verify, VerifyOptions};
use hspack::{DType, DatasetWriter, Field, Role, Schema, WriteOptions};

fn status(field: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    kb << 10
}

/// The tests of this binary run one at a time.
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn verify_holds_little_memory_whatever_the_dataset_size() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    const SAMPLES: u64 = 64;
    const ROWS: usize = 1024;
    const HIDDEN: u64 = 4096; // 8 MiB a sample
    let dir = tempfile::tempdir().unwrap();
    let schema = Schema::new(vec![Field::new(
        "hidden",
        DType::BF16,
        &[HIDDEN],
        Role::Other,
    )]);
    let options = WriteOptions {
        durable: false,
        ..WriteOptions::default()
    };
    let mut w = DatasetWriter::create(dir.path(), schema, options).unwrap();
    for i in 0..SAMPLES {
        let bytes = common::bytes(i, ROWS * HIDDEN as usize * 2);
        w.append(&format!("s{i}"), &[("hidden", &bytes[..])])
            .unwrap();
    }
    w.finish().unwrap();
    // Reset the peak (Linux: "5" to clear_refs), so that only verify's counts.
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let before = status("VmHWM:");
    let report = verify(dir.path(), VerifyOptions::default(), &|_| {}).unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    assert_eq!(report.bytes_hashed, SAMPLES * ROWS as u64 * HIDDEN * 2);
    let peak = status("VmHWM:");
    eprintln!(
        "verify of {} MB: peak resident {} MB (before {} MB, peak reset: {reset})",
        report.bytes_hashed >> 20,
        peak >> 20,
        before >> 20
    );
    assert!(
        peak < 160 << 20,
        "verify held {} MB at its peak for a {} MB dataset",
        peak >> 20,
        report.bytes_hashed >> 20
    );
}

/// A process maps at most `vm.max_map_count` regions (65530 by default): verify kept every
/// shard mapped, so a dataset of more shards than that died (`memory allocation failed`,
/// SIGABRT). It lets each batch of shards go once checked: here, 3000 shards, and the regions
/// mapped while it runs stay well under that count.
#[test]
fn verify_maps_a_bounded_number_of_shards_at_once() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    const SHARDS: u64 = 3000;
    let dir = tempfile::tempdir().unwrap();
    many_shards(dir.path(), SHARDS);
    let base = regions();
    let calls = std::sync::atomic::AtomicU64::new(0);
    let most = std::sync::atomic::AtomicUsize::new(0);
    let report = verify(dir.path(), VerifyOptions::default(), &|_| {
        if calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .is_multiple_of(97)
        {
            most.fetch_max(regions(), std::sync::atomic::Ordering::Relaxed);
        }
    })
    .unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    assert_eq!(report.shards, SHARDS);
    let most = most.into_inner();
    eprintln!("verify of {SHARDS} shards: at most {most} regions mapped ({base} before)");
    assert!(
        most > 0 && most < base + 2000,
        "{most} regions mapped ({base} before)"
    );
    // A writer reopening the dataset, and a merge of it, walk its shards letting each go:
    // they kept every one mapped, and past `vm.max_map_count` shards a dataset could not be
    // resumed nor merged.
    let base = regions();
    let w = DatasetWriter::open(dir.path(), schema_of(dir.path()), Default::default()).unwrap();
    assert_eq!(w.len(), SHARDS);
    assert!(
        regions() < base + 100,
        "{} regions mapped ({base} before)",
        regions()
    );
    drop(w);
    let base = regions();
    let most = std::sync::atomic::AtomicUsize::new(0);
    let source = hspack::Dataset::open(dir.path()).unwrap();
    let into = tempfile::tempdir().unwrap();
    let merged = hspack::transfer::merge(
        std::slice::from_ref(&source),
        hspack::io::open_location(into.path().join("m")).unwrap(),
        WriteOptions {
            durable: false,
            ..WriteOptions::default()
        },
        &|_| {
            most.fetch_max(regions(), std::sync::atomic::Ordering::Relaxed);
        },
    )
    .unwrap();
    assert_eq!(merged.samples, SHARDS);
    let most = most.into_inner();
    assert!(
        most > 0 && most < base + 200,
        "merge: {most} regions mapped ({base} before)"
    );
}

/// A dataset of `shards` one-sample shards, keyed `s0`, `s1`, ….
fn many_shards(dir: &std::path::Path, shards: u64) {
    let schema = Schema::new(vec![Field::new("ids", DType::I32, &[], Role::TokenIds)]);
    let options = WriteOptions {
        durable: false,
        shard_samples: 1,
        align_log2: Some(6),
        ..WriteOptions::default()
    };
    let mut w = DatasetWriter::create(dir, schema, options).unwrap();
    for i in 0..shards {
        let id = (i as i32).to_le_bytes();
        w.append(&format!("s{i}"), &[("ids", &id[..])]).unwrap();
    }
    w.finish().unwrap();
}

fn regions() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .count()
}

/// A reader kept every shard it read mapped: reading through a dataset of more shards than
/// a process may map failed (`compare` of two 32,700-shard datasets aborted, and a Python
/// pass over 65,000 shards failed, then the interpreter died). It keeps at most
/// `mapped_shards`, the one mapped longest let go first, whatever the order of the reads.
#[test]
fn a_reader_keeps_at_most_its_mapped_shards() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    const SHARDS: u64 = 3000;
    let dir = tempfile::tempdir().unwrap();
    many_shards(dir.path(), SHARDS);
    let options = || hspack::ReadOptions {
        mapped_shards: Some(100),
        ..hspack::ReadOptions::default()
    };
    let base = regions();
    let a = hspack::Dataset::open_with(dir.path(), options()).unwrap();
    let b = hspack::Dataset::open_with(dir.path(), options()).unwrap();
    let mut most = 0;
    for i in 0..SHARDS {
        let s = a.sample(i).unwrap();
        assert_eq!(
            s.read("ids", None).unwrap().bytes(),
            (i as i32).to_le_bytes()
        );
        // By key, in another order.
        let k = (i * 7919) % SHARDS;
        let s = b.get_by_key(&format!("s{k}")).unwrap();
        assert_eq!(s.ordinal(), k);
        if i % 100 == 0 {
            most = most.max(regions());
        }
    }
    let compared = hspack::compare::compare(&a, &b, &Default::default()).unwrap();
    assert_eq!(compared.samples, SHARDS);
    most = most.max(regions());
    assert!(most < base + 600, "{most} regions mapped ({base} before)");
    // What a reader holds stays mapped past the limit, and reads the same.
    let first = a.sample(0).unwrap();
    for i in 1..300 {
        a.sample(i).unwrap();
    }
    assert_eq!(first.read("ids", None).unwrap().bytes(), 0i32.to_le_bytes());
}

/// `store add` opened every pack it wrote to read it back, and kept each open: a dataset of
/// more shards than a process may map could not be added (it aborted after 66,000). A store
/// handle keeps at most 4096 packs open.
#[test]
fn a_store_keeps_a_bounded_number_of_packs_open() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    const SHARDS: u64 = 6000;
    let dir = tempfile::tempdir().unwrap();
    many_shards(&dir.path().join("src"), SHARDS);
    let store = dir.path().join("store");
    hspack::store::Store::init(&store).unwrap();
    let st = std::sync::Arc::new(hspack::store::Store::open(&store).unwrap());
    let src = hspack::Dataset::open(dir.path().join("src")).unwrap();
    let base = regions();
    let most = std::sync::atomic::AtomicUsize::new(0);
    let calls = std::sync::atomic::AtomicU64::new(0);
    let (report, _) = hspack::transfer::add_to_store(&st, &src, "many", &|_| {
        if calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .is_multiple_of(50)
        {
            most.fetch_max(regions(), std::sync::atomic::Ordering::Relaxed);
        }
    })
    .unwrap();
    assert_eq!(report.samples, SHARDS);
    let most = most.into_inner().max(regions());
    eprintln!("store add of {SHARDS} shards: at most {most} regions mapped ({base} before)");
    assert!(most < base + 5000, "{most} regions mapped ({base} before)");
}

fn schema_of(dir: &std::path::Path) -> Schema {
    hspack::Dataset::open(dir).unwrap().schema().clone()
}
