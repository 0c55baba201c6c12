//! Power cuts: a kill leaves every byte the writer handed the kernel, a power cut keeps only
//! what was fsynced. The memory backend records each fsync of a file, each name given or
//! removed and each fsync of the folder, and rebuilds what a folder holds after the power was
//! cut at any of those points (names given or removed since their folder's last fsync kept or
//! not, any of them; a file never fsynced empty). At every such point, with every choice of
//! kept names (where there are more than 6, the first few of them and each alone): every
//! sample whose commit returned is there bit for bit, nothing there is damaged (`verify`), and
//! the next writer takes the dataset on and commits. The same for writers sharing a dataset,
//! a copy, a merge, a reindex, and a store's adds, removal and collection.

mod common;

use std::sync::Arc;

use common::*;
use hspack::format::manifest::TEMP_SUFFIX;
use hspack::io::{LocalStorage, MemoryStorage, Storage};
use hspack::store::snapshot::snapshot_file;
use hspack::store::{Locks, Store, StoreParts};
use hspack::transfer::{copy, merge, CopyOptions};
use hspack::verify::{verify_dataset, VerifyOptions};
use hspack::write::dataset_writer::reindex_in;
use hspack::{Dataset, DatasetWriter, Error, ReadOptions, WriteOptions};

const HIDDEN: usize = 16;

fn sample(i: u64) -> SampleBytes {
    capture_sample(i, 1 + (i as usize * 5) % 13, HIDDEN)
}

fn durable() -> WriteOptions {
    WriteOptions {
        durable: true,
        ..small_options()
    }
}

/// Samples `s{n}` for `n` in `keys`, appended by two writers one after the other, committed
/// in groups of one to three (enough commits for segments to be merged); returns the
/// durability event after which each count of samples was committed, in order.
fn write_in_commits(storage: &MemoryStorage, keys: std::ops::Range<u64>) -> Vec<(usize, u64)> {
    write_in_commits_to(
        &|| Arc::new(storage.clone()),
        &|| storage.durability_events(),
        keys,
    )
}

/// [`write_in_commits`], into the storage `open` gives, whose disk has had `events()`
/// durability events.
fn write_in_commits_to(
    open: &dyn Fn() -> Arc<dyn Storage>,
    events: &dyn Fn() -> usize,
    keys: std::ops::Range<u64>,
) -> Vec<(usize, u64)> {
    let (first, total) = (keys.start, keys.end);
    let mut committed = vec![];
    let mut next = first;
    for session in 0..2 {
        let mut w =
            DatasetWriter::open_in(open(), capture_schema(HIDDEN as u64), durable()).unwrap();
        let end = if session == 0 {
            (first + total) / 2
        } else {
            total
        };
        while next < end {
            let group = 1 + next % 3;
            // The second writer commits every other group through a lane, as convert does.
            let mut lane = (session == 1 && group != 2).then(|| w.lanes().open().unwrap());
            for i in next..(next + group).min(end) {
                let (key, fields) = (format!("s{i}"), sample(i));
                match &mut lane {
                    Some(lane) => lane.append(&key, &as_fields(&fields)).unwrap(),
                    None => w.append(&key, &as_fields(&fields)).unwrap(),
                };
            }
            next = (next + group).min(end);
            match lane {
                Some(lane) => w.commit_lane(lane).unwrap(),
                None => w.commit().unwrap(),
            };
            committed.push((events(), next - first));
        }
        w.finish().unwrap();
    }
    committed
}

/// What the power cut left of samples written in key order: sample `s{i}` at ordinal `i`,
/// each the one written under its key, and verify finds nothing damaged.
fn check_intact(ds: &Dataset, at: &str) {
    check_in_order(ds, at);
    check_samples(ds, at);
    check_verified(ds, at);
}

/// Sample `s{i}` at ordinal `i`.
fn check_in_order(ds: &Dataset, at: &str) {
    for i in 0..ds.len() {
        assert_eq!(ds.sample(i).unwrap().key(), format!("s{i}"), "{at}");
    }
}

/// Every sample the dataset lists (keys `s{n}`, in any order) is the one written under its
/// key, and found by it.
fn check_samples(ds: &Dataset, at: &str) {
    for i in 0..ds.len() {
        let s = ds.sample(i).unwrap();
        let n: u64 = s.key()[1..].parse().unwrap();
        for (field, data) in sample(n) {
            let got = (s.read(&field, None)).unwrap_or_else(|e| panic!("{at}: s{n}: {e}"));
            assert_eq!(got.bytes(), &data[..], "{at}: s{n} {field}");
        }
        let by_key =
            (ds.get_by_key(s.key())).unwrap_or_else(|e| panic!("{at}: s{n} by its key: {e}"));
        assert_eq!(by_key.ordinal(), i, "{at}");
    }
}

/// `verify` finds nothing damaged.
fn check_verified(ds: &Dataset, at: &str) {
    let report = verify_dataset(ds, VerifyOptions::default(), &|_| {}).unwrap();
    assert!(report.is_ok(), "{at}: {:?}", report.problems);
}

/// The largest count of samples `commits` (event, count) says was committed within the first
/// `at` events.
fn committed_by(commits: &[(usize, u64)], at: usize) -> u64 {
    (commits.iter())
        .filter(|(event, _)| *event <= at)
        .map(|(_, n)| *n)
        .max()
        .unwrap_or(0)
}

/// How a failure names the cut.
fn cut_label(at: usize, done: usize, kept: u64) -> String {
    format!("power cut after event {at} of {done}, unsynced name changes kept: {kept:b}")
}

/// The next writer takes the dataset the cut left on (removing what the cut writer left
/// half done) and commits one more sample after those there.
fn next_writer_commits(cut: &MemoryStorage, there: u64, at: &str) {
    let mut w = DatasetWriter::open_in(
        Arc::new(cut.clone()),
        capture_schema(HIDDEN as u64),
        durable(),
    )
    .unwrap_or_else(|e| panic!("{at}: the next writer: {e}"));
    assert_eq!(w.len(), there, "{at}");
    w.append(&format!("s{there}"), &as_fields(&sample(there)))
        .unwrap();
    w.finish().unwrap();
    let ds = Dataset::open_in(Arc::new(cut.clone()), ReadOptions::default()).unwrap();
    assert_eq!(ds.len(), there + 1, "{at}");
    check_intact(&ds, at);
}

/// Every cut point of `storage`'s disk, each with every choice of the name changes not yet
/// durable that it keeps (as a mask, [`MemoryStorage::after_power_cut`]); beyond 6 such
/// changes, the first `k` of them for every `k`, and each alone.
fn cuts(storage: &MemoryStorage) -> Vec<(usize, u64)> {
    let mut all = vec![];
    for at in 0..=storage.durability_events() {
        let n = storage.unsynced_name_changes(at).min(63);
        match n <= 6 {
            true => all.extend((0..1u64 << n).map(|kept| (at, kept))),
            false => {
                all.extend((0..=n).map(|k| (at, (1u64 << k) - 1)));
                all.extend((1..n).map(|i| (at, 1u64 << i)));
            }
        }
    }
    all
}

#[test]
fn a_power_cut_anywhere_keeps_every_committed_sample() {
    let storage = MemoryStorage::new("power");
    let total = 24;
    let committed = write_in_commits(&storage, 0..total);
    assert!(committed.len() >= 12, "enough commits to merge segments");
    let (mut with_dataset, mut unsynced_kept, mut with_temp) = (0, 0, 0);
    for (at, kept) in cuts(&storage) {
        let label = cut_label(at, storage.durability_events(), kept);
        let cut = storage.after_power_cut(at, kept);
        let must_have = committed_by(&committed, at);
        let there = match Dataset::open_in(Arc::new(cut.clone()), ReadOptions::default()) {
            Ok(ds) => {
                assert!(
                    ds.len() >= must_have && ds.len() <= total,
                    "{label}: {} samples, {must_have} committed",
                    ds.len()
                );
                check_intact(&ds, &label);
                with_dataset += 1;
                ds.len()
            }
            Err(Error::NotADataset { .. }) if must_have == 0 => 0,
            Err(e) => panic!("{label}: {must_have} committed, the dataset does not open: {e}"),
        };
        unsynced_kept += usize::from(kept != 0);
        let temp = |cut: &MemoryStorage| {
            (cut.list().unwrap().into_iter()).find(|n| n.ends_with(TEMP_SUFFIX))
        };
        with_temp += usize::from(temp(&cut).is_some());
        next_writer_commits(&cut, there, &label);
        assert_eq!(
            temp(&cut),
            None,
            "{label}: the next writer removed the temp files"
        );
    }
    eprintln!(
        "{} power cuts over {} events: {with_dataset} left a dataset, {unsynced_kept} kept unsynced name changes, {with_temp} a temp file",
        cuts(&storage).len(),
        storage.durability_events()
    );
    assert!(with_dataset > 100, "{with_dataset} cuts found a dataset");
    assert!(
        unsynced_kept > 10,
        "{unsynced_kept} cuts kept unsynced names"
    );
}

#[test]
fn a_power_cut_during_a_copy_leaves_a_destination_the_copy_finishes() {
    let source = MemoryStorage::new("copy-source");
    let total = 16;
    write_in_commits(&source, 0..total);
    let src = Dataset::open_in(Arc::new(source), ReadOptions::default()).unwrap();
    let dst = MemoryStorage::new("copy-destination");
    let dst_arc: Arc<dyn Storage> = Arc::new(dst.clone());
    copy(&src, &dst_arc, &CopyOptions::default(), &|_| {}).unwrap();
    let done = dst.durability_events();
    let mut whole = 0;
    for (at, kept) in cuts(&dst) {
        let label = cut_label(at, done, kept);
        let cut = dst.after_power_cut(at, kept);
        if at == done {
            let ds = Dataset::open_in(Arc::new(cut.clone()), ReadOptions::default())
                .unwrap_or_else(|e| panic!("{label}: the copy returned: {e}"));
            assert_eq!(ds.len(), total, "{label}");
        }
        match Dataset::open_in(Arc::new(cut.clone()), ReadOptions::default()) {
            Ok(ds) => {
                assert_eq!(ds.len(), total, "{label}: a copy is whole or not there");
                check_intact(&ds, &label);
                whole += 1;
            }
            Err(Error::NotADataset { .. }) => {}
            Err(e) => panic!("{label}: {e}"),
        }
        let cut_arc: Arc<dyn Storage> = Arc::new(cut.clone());
        copy(&src, &cut_arc, &CopyOptions::default(), &|_| {})
            .unwrap_or_else(|e| panic!("{label}: the copy again: {e}"));
        let ds = Dataset::open_in(cut_arc, ReadOptions::default()).unwrap();
        assert_eq!(ds.len(), total, "{label}");
        check_intact(&ds, &label);
    }
    assert!(whole >= 1, "the finished copy was seen whole");
}

#[test]
fn a_power_cut_during_a_merge_leaves_a_destination_the_merge_finishes() {
    let (a, b) = (MemoryStorage::new("merge-a"), MemoryStorage::new("merge-b"));
    write_in_commits(&a, 0..7);
    write_in_commits(&b, 7..15);
    let open =
        |m: &MemoryStorage| Dataset::open_in(Arc::new(m.clone()), ReadOptions::default()).unwrap();
    let sources = [open(&a), open(&b)];
    let dst = MemoryStorage::new("merge-destination");
    merge(&sources, Arc::new(dst.clone()), durable(), &|_| {}).unwrap();
    let done = dst.durability_events();
    let mut partial = 0;
    for (at, kept) in cuts(&dst) {
        let label = cut_label(at, done, kept);
        let cut = dst.after_power_cut(at, kept);
        match Dataset::open_in(Arc::new(cut.clone()), ReadOptions::default()) {
            Ok(ds) => {
                check_intact(&ds, &label);
                assert!(at < done || ds.len() == 15, "{label}: the merge returned");
                partial += usize::from(!ds.is_empty() && ds.len() < 15);
            }
            Err(Error::NotADataset { .. }) => assert!(at < done, "{label}"),
            Err(e) => panic!("{label}: {e}"),
        }
        let report = merge(&sources, Arc::new(cut.clone()), durable(), &|_| {})
            .unwrap_or_else(|e| panic!("{label}: the merge again: {e}"));
        assert_eq!(report.samples, 15, "{label}");
        check_intact(&open(&cut), &label);
    }
    assert!(partial > 0, "some cuts fell between the merge's commits");
}

#[test]
fn a_power_cut_during_a_reindex_loses_nothing_and_the_reindex_finishes() {
    let storage = MemoryStorage::new("reindex");
    write_in_commits(&storage, 0..12);
    let mut derived: Vec<String> = (storage.list().unwrap().into_iter())
        .filter(|n| n.starts_with("keys-") || n.starts_with("samples-"))
        .collect();
    derived.sort();
    assert!(derived.len() >= 2, "{derived:?}");
    for name in &derived[..2] {
        storage.delete(name).unwrap();
    }
    storage.sync().unwrap();
    let start = storage.durability_events();
    let rewritten = reindex_in(Arc::new(storage.clone())).unwrap();
    assert_eq!(rewritten.len(), 2, "{rewritten:?}");
    let done = storage.durability_events();
    assert!(done > start);
    for (at, kept) in cuts(&storage).into_iter().filter(|(at, _)| *at >= start) {
        let label = format!(
            "{} (the reindex from event {start})",
            cut_label(at, done, kept)
        );
        let cut = storage.after_power_cut(at, kept);
        let ds = Dataset::open_in(Arc::new(cut.clone()), ReadOptions::default())
            .unwrap_or_else(|e| panic!("{label}: {e}"));
        assert_eq!(ds.len(), 12, "{label}");
        check_in_order(&ds, &label);
        check_samples(&ds, &label);
        if at == done {
            check_intact(&ds, &label);
        }
        reindex_in(Arc::new(cut.clone())).unwrap_or_else(|e| panic!("{label}: reindex again: {e}"));
        let ds = Dataset::open_in(Arc::new(cut.clone()), ReadOptions::default()).unwrap();
        check_intact(&ds, &label);
    }
}

/// A store's parts: `meta`, `packs`, `datasets` and `captures` in memory, staging and locks
/// in real folders under `dir`, outside the cut (staged files are never committed data).
fn store_parts(folders: [MemoryStorage; 4], dir: &std::path::Path) -> StoreParts {
    let [meta, packs, datasets, captures] = folders;
    std::fs::create_dir_all(dir.join("locks")).unwrap();
    StoreParts {
        meta: Arc::new(meta),
        packs: Arc::new(packs),
        datasets: Arc::new(datasets),
        captures: Arc::new(captures),
        staging: Arc::new(LocalStorage::new(dir.join("staging"))),
        locks: Locks::Folder(dir.join("locks")),
    }
}

#[test]
fn a_power_cut_anywhere_in_a_store_keeps_every_committed_sample() {
    let dir = tempfile::tempdir().unwrap();
    let meta = MemoryStorage::new("meta");
    let folders = ["packs", "datasets", "captures"].map(|f| meta.sibling(f));
    let store = Arc::new(
        Store::init_parts(
            std::path::Path::new("memory://store"),
            store_parts(
                [&meta, &folders[0], &folders[1], &folders[2]].map(MemoryStorage::clone),
                dir.path(),
            ),
            [7; 16],
        )
        .unwrap(),
    );
    let events = || meta.durability_events();
    let initialized = events();
    let open = |name: &str| -> Arc<dyn Storage> { Arc::new(store.dataset(name).unwrap()) };
    // `b` shares its first samples with `a` (the same bytes under the same keys): stored once.
    let a = write_in_commits_to(&|| open("a"), &events, 0..6);
    let b = write_in_commits_to(&|| open("b"), &events, 0..9);
    store.remove("a").unwrap();
    let removed = events();
    let report = hspack::store::gc::collect(&store, true).unwrap();
    assert!(report.packs_deleted > 0, "{report:?}");
    let done = events();
    let mut checked = 0;
    for (at, kept) in cuts(&meta) {
        let label = format!(
            "{} (`a` removed at {removed}, then collected)",
            cut_label(at, done, kept)
        );
        let cut_dir = tempfile::tempdir().unwrap();
        let cut_parts = store_parts(
            [&meta, &folders[0], &folders[1], &folders[2]].map(|f| f.after_power_cut(at, kept)),
            cut_dir.path(),
        );
        let cut = match Store::open_parts(std::path::Path::new("memory://cut"), cut_parts) {
            Ok(s) => Arc::new(s),
            Err(Error::Store { .. }) if at < initialized => continue,
            Err(e) => panic!("{label}: the store does not open: {e}"),
        };
        let check = |cut: &Arc<Store>, when: &str| {
            for (name, commits, gone_at) in [("a", &a, Some(removed)), ("b", &b, None)] {
                let must = committed_by(commits, at);
                let listed = (cut.datasets().size(&snapshot_file(name)).unwrap()).is_some();
                let opened = cut
                    .dataset(name)
                    .and_then(|d| Dataset::open_in(Arc::new(d), ReadOptions::default()));
                match opened {
                    Ok(ds) => {
                        assert!(listed, "{label}, {when}: `{name}` opens unlisted");
                        assert!(
                            gone_at.is_none_or(|g| at < g),
                            "{label}, {when}: `{name}` was removed"
                        );
                        assert!(
                            ds.len() >= must,
                            "{label}, {when}: `{name}` has {} of {must}",
                            ds.len()
                        );
                        check_intact(&ds, &format!("{label}, {when}: `{name}`"));
                    }
                    // Not listed: never committed, or removed (its removal's deletion among
                    // the events the cut kept: the one before the last of `remove`).
                    Err(e) => assert!(
                        !listed && (must == 0 || gone_at.is_some_and(|g| at + 1 >= g)),
                        "{label}, {when}: `{name}` ({must} committed, listed: {listed}) does not open: {e}"
                    ),
                }
            }
        };
        check(&cut, "as the cut left it");
        hspack::store::gc::collect(&cut, true)
            .unwrap_or_else(|e| panic!("{label}: a collection of the cut store: {e}"));
        check(&cut, "after a collection");
        let there = cut
            .dataset("b")
            .and_then(|d| Dataset::open_in(Arc::new(d), ReadOptions::default()))
            .map_or(0, |ds| ds.len());
        let mut w = DatasetWriter::open_in(
            Arc::new(cut.dataset("b").unwrap()),
            capture_schema(HIDDEN as u64),
            durable(),
        )
        .unwrap_or_else(|e| panic!("{label}: the next writer: {e}"));
        w.append(&format!("s{there}"), &as_fields(&sample(there)))
            .unwrap();
        w.finish().unwrap();
        let ds =
            Dataset::open_in(Arc::new(cut.dataset("b").unwrap()), ReadOptions::default()).unwrap();
        assert_eq!(ds.len(), there + 1, "{label}");
        check_intact(&ds, &label);
        checked += 1;
    }
    eprintln!("{checked} power cuts of the store checked over {done} events");
    assert!(checked > 100, "{checked}");
}

#[test]
fn a_power_cut_while_writers_share_a_dataset_keeps_every_committed_sample() {
    let storage = MemoryStorage::new("shared");
    let shared = WriteOptions {
        shared: true,
        ..durable()
    };
    let open = |s: &MemoryStorage| {
        DatasetWriter::open_in(
            Arc::new(s.clone()),
            capture_schema(HIDDEN as u64),
            shared.clone(),
        )
    };
    let mut writers = [open(&storage).unwrap(), open(&storage).unwrap()];
    let sole = DatasetWriter::open_in(
        Arc::new(storage.clone()),
        capture_schema(HIDDEN as u64),
        durable(),
    );
    assert!(
        matches!(sole, Err(Error::Locked { .. })),
        "a sole writer joins sharing writers"
    );
    // Each writer commits one sample a round, in turn: 16 commits, segments merged.
    let mut committed: Vec<(usize, u64)> = vec![];
    for round in 0..8u64 {
        for (i, w) in writers.iter_mut().enumerate() {
            let n = round * 2 + i as u64;
            w.append(&format!("s{n}"), &as_fields(&sample(n))).unwrap();
            w.commit().unwrap();
            committed.push((storage.durability_events(), n));
        }
    }
    for w in writers {
        w.finish().unwrap();
    }
    let done = storage.durability_events();
    let mut checked = 0;
    for (at, kept) in cuts(&storage) {
        let label = cut_label(at, done, kept);
        let cut = storage.after_power_cut(at, kept);
        let must: Vec<u64> = (committed.iter())
            .filter(|(event, _)| *event <= at)
            .map(|(_, n)| *n)
            .collect();
        match Dataset::open_in(Arc::new(cut.clone()), ReadOptions::default()) {
            Ok(ds) => {
                check_samples(&ds, &label);
                check_verified(&ds, &label);
                for n in &must {
                    ds.get_by_key(&format!("s{n}"))
                        .unwrap_or_else(|e| panic!("{label}: committed s{n}: {e}"));
                }
                checked += 1;
            }
            Err(Error::NotADataset { .. }) if must.is_empty() => {}
            Err(e) => panic!(
                "{label}: {} committed, the dataset does not open: {e}",
                must.len()
            ),
        }
        let mut w = open(&cut).unwrap_or_else(|e| panic!("{label}: the next writer: {e}"));
        w.append("s100", &as_fields(&sample(100))).unwrap();
        w.finish().unwrap();
        let ds = Dataset::open_in(Arc::new(cut.clone()), ReadOptions::default()).unwrap();
        check_samples(&ds, &label);
        check_verified(&ds, &label);
        assert!(ds.get_by_key("s100").is_ok(), "{label}");
    }
    assert!(checked > 100, "{checked}");
}
