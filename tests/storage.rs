//! The reader, writer and verify through both storage backends: a local folder and memory.
//! The same assertions run on each, and both must write the same bytes. Faults the memory
//! backend injects (short reads, failed publishes, a writer that dies between publishing a
//! shard and the manifest) never lose a committed sample and never return wrong bytes.

mod common;

use std::sync::Arc;

use common::*;
use hspack::io::{Faults, LocalStorage, MemoryStorage, Storage};
use hspack::verify::{verify_dataset, VerifyOptions};
use hspack::{CheckPolicy, Codec, Dataset, DatasetWriter, Error, ReadOptions, WriteOptions};

const HIDDEN: usize = 32;

fn sample(i: u64) -> SampleBytes {
    capture_sample(i, 1 + (i as usize * 7) % 23, HIDDEN)
}

/// A backend under test, with a way to damage its files.
enum Backend {
    Local(std::path::PathBuf),
    Memory(MemoryStorage),
}

impl Backend {
    fn storage(&self) -> Arc<dyn Storage> {
        match self {
            Backend::Local(dir) => Arc::new(LocalStorage::new(dir)),
            Backend::Memory(m) => Arc::new(m.clone()),
        }
    }

    /// Puts `bytes` as file `name`, over what is there: damage.
    fn overwrite(&self, name: &str, bytes: &[u8]) {
        match self {
            Backend::Local(dir) => std::fs::write(dir.join(name), bytes).unwrap(),
            Backend::Memory(m) => m.overwrite(name, bytes),
        }
    }
}

/// Both backends, each with a name for messages; the tempdir lives as long as the list.
fn backends() -> (tempfile::TempDir, Vec<(&'static str, Backend)>) {
    let dir = tempfile::tempdir().unwrap();
    let local = Backend::Local(dir.path().join("ds"));
    let memory = Backend::Memory(MemoryStorage::new("ds"));
    (dir, vec![("local", local), ("memory", memory)])
}

fn write(storage: &Arc<dyn Storage>, range: std::ops::Range<u64>, options: WriteOptions) {
    let mut w =
        DatasetWriter::open_in(storage.clone(), capture_schema(HIDDEN as u64), options).unwrap();
    for i in range {
        w.append(&format!("s{i}"), &as_fields(&sample(i))).unwrap();
    }
    w.finish().unwrap();
}

/// A writer of the dataset in `storage`, as `write` opens it.
fn reopen(storage: &Arc<dyn Storage>) -> DatasetWriter {
    DatasetWriter::open_in(
        storage.clone(),
        capture_schema(HIDDEN as u64),
        small_options(),
    )
    .unwrap()
}

fn open(storage: &Arc<dyn Storage>) -> Dataset {
    Dataset::open_in(storage.clone(), ReadOptions::default()).unwrap()
}

/// Every sample `0..n` reads back bit for bit, by ordinal and by key, whole and by rows.
fn check_all(name: &str, ds: &Dataset, n: u64) {
    assert_eq!(ds.len(), n, "{name}");
    for i in 0..n {
        let s = ds.sample(i).unwrap();
        assert_eq!(s.key(), format!("s{i}"), "{name}");
        let by_key = ds.get_by_key(&format!("s{i}")).unwrap();
        assert_eq!(by_key.ordinal(), i, "{name}");
        for (field, data) in sample(i) {
            assert_eq!(
                s.read(&field, None).unwrap().bytes(),
                &data[..],
                "{name} {i}"
            );
            let rows = s.rows();
            if rows >= 2 {
                let f = ds.field_index(&field).unwrap();
                let width = ds.schema().fields[f].row_bytes() as usize;
                let part = s.read(&field, Some(1..rows)).unwrap();
                assert_eq!(part.bytes(), &data[width..], "{name} {i} {field}");
            }
        }
    }
}

#[test]
fn both_backends_write_the_same_bytes_and_read_them_back() {
    for codec in [Codec::None, Codec::Zstd] {
        let (_dir, all) = backends();
        let options = WriteOptions {
            codec,
            ..small_options()
        };
        for (name, backend) in &all {
            let storage = &backend.storage();
            write(storage, 0..12, options.clone());
            let ds = open(storage);
            check_all(name, &ds, 12);
            assert!(ds.manifest().shards.len() >= 3, "{name}: several shards");
            let report = verify_dataset(&ds, VerifyOptions::default(), &|_| {}).unwrap();
            assert!(report.is_ok(), "{name}: {:?}", report.problems);
            assert!(report.chunks > 0 && report.bytes_hashed > 0, "{name}");
        }
        let names = |s: &Arc<dyn Storage>| {
            let mut n = s.list().unwrap();
            n.sort();
            n
        };
        let (local, memory) = (&all[0].1.storage(), &all[1].1.storage());
        assert_eq!(names(local), names(memory));
        for file in names(local) {
            assert_eq!(
                local.read(&file).unwrap(),
                memory.read(&file).unwrap(),
                "{file} differs between the backends"
            );
        }
    }
}

#[test]
fn resume_duplicates_and_the_lock_hold_on_both_backends() {
    let (_dir, all) = backends();
    for (name, backend) in &all {
        let storage = &backend.storage();
        write(storage, 0..4, small_options());
        let schema = capture_schema(HIDDEN as u64);
        let mut w =
            DatasetWriter::open_in(storage.clone(), schema.clone(), small_options()).unwrap();
        assert!(w.contains_key("s3"), "{name}: keys of committed samples");
        let err = w.append("s1", &as_fields(&sample(1))).unwrap_err();
        assert!(matches!(err, Error::DuplicateKey { .. }), "{name}: {err}");
        let second = DatasetWriter::open_in(storage.clone(), schema, small_options());
        assert!(
            matches!(second, Err(Error::Locked { .. })),
            "{name}: a second writer is refused"
        );
        for i in 4..9 {
            w.append(&format!("s{i}"), &as_fields(&sample(i))).unwrap();
        }
        drop(w); // uncommitted samples are gone, committed ones stay
        let ds = open(storage);
        assert!((4..9).contains(&ds.len()), "{name}: {}", ds.len());
        check_all(name, &ds, ds.len());
        let next = ds.len();
        drop(ds);
        write(storage, next..10, small_options());
        check_all(name, &open(storage), 10);
    }
}

#[test]
fn damage_is_named_on_both_backends() {
    let (_dir, all) = backends();
    for (name, backend) in &all {
        let storage = &backend.storage();
        write(storage, 0..6, small_options());
        let ds = open(storage);
        let shard = ds.manifest().shards[1].file.clone();
        let mut bytes = storage.read(&shard).unwrap().unwrap();
        // A payload byte of the first chunk (payloads start at the 4 KiB alignment).
        bytes[4096] ^= 0x40;
        drop(ds);
        backend.overwrite(&shard, &bytes);
        let ds = open(storage);
        let report = verify_dataset(&ds, VerifyOptions::default(), &|_| {}).unwrap();
        assert_eq!(report.problems.len(), 1, "{name}: {:?}", report.problems);
        let msg = report.problems[0].to_string();
        assert!(
            msg.contains(&shard) && msg.contains("sample"),
            "{name}: {msg}"
        );
        let quick = verify_dataset(&ds, VerifyOptions { quick: true }, &|_| {}).unwrap();
        assert!(quick.is_ok(), "{name}: the quick check reads no payload");
        let first = ds.manifest().shards[1].first_ordinal;
        let s = ds.sample(first).unwrap();
        let err = ["input_ids", "loss_mask", "hidden.2", "hidden.30"]
            .iter()
            .find_map(|f| s.read(f, None).err())
            .expect("the damaged chunk fails to read");
        assert!(
            matches!(err, Error::ChecksumMismatch { .. }),
            "{name}: {err}"
        );
    }
}

#[test]
fn a_short_read_is_an_error_never_fewer_bytes() {
    let m = MemoryStorage::new("short");
    let storage: Arc<dyn Storage> = Arc::new(m.clone());
    write(&storage, 0..6, small_options());
    m.set_faults(Faults {
        short_reads_of: Some("shard-000001".into()),
        ..Faults::default()
    });
    let ds = Dataset::open_in(
        storage.clone(),
        ReadOptions {
            check: CheckPolicy::Never,
            ..ReadOptions::default()
        },
    )
    .unwrap();
    // Shard 0 reads; shard 1 fails to open, naming the file and the short read.
    assert_eq!(ds.sample(0).unwrap().key(), "s0");
    let first = ds.manifest().shards[1].first_ordinal;
    let err = ds.sample(first).unwrap_err().to_string();
    assert!(
        err.contains("shard-000001") && err.contains("short read"),
        "{err}"
    );
    let report = verify_dataset(&ds, VerifyOptions::default(), &|_| {}).unwrap();
    assert!(!report.is_ok());
    assert!(report
        .problems
        .iter()
        .all(|p| p.to_string().contains("shard-000001")));
}

/// Appends samples `0..total`, committing every `every`; returns the samples committed when
/// the first error came (and the error), or `total` when none came.
fn write_until_failure(storage: &Arc<dyn Storage>, total: u64, every: u64) -> (u64, Option<Error>) {
    let mut w = match DatasetWriter::open_in(
        storage.clone(),
        capture_schema(HIDDEN as u64),
        small_options(),
    ) {
        Ok(w) => w,
        Err(e) => return (0, Some(e)),
    };
    let start = w.len();
    for i in start..total {
        let committed = w.stats().samples;
        let step = w
            .append(&format!("s{i}"), &as_fields(&sample(i)))
            .and_then(|_| match (i + 1) % every {
                0 => w.commit().map(drop),
                _ => Ok(()),
            });
        if let Err(e) = step {
            // The writer "dies" here: nothing it would do on drop happens.
            std::mem::forget(w);
            return (committed, Some(e));
        }
    }
    let committed = w.stats().samples;
    match w.finish() {
        Ok(stats) => (stats.samples, None),
        // A failed finish may have committed the last shard, or not.
        Err(e) => (committed, Some(e)),
    }
}

#[test]
fn a_failed_publish_at_any_step_loses_no_committed_sample() {
    const TOTAL: u64 = 14;
    for fail_after in 0.. {
        let m = MemoryStorage::new("faults");
        let storage: Arc<dyn Storage> = Arc::new(m.clone());
        // The first run dies at the failed publish, its deletions failing too: the state a
        // crash between publishing a shard and publishing the manifest leaves.
        m.set_faults(Faults {
            publishes_before_failure: Some(fail_after),
            deletes_fail: true,
            ..Faults::default()
        });
        let (committed, err) = write_until_failure(&storage, TOTAL, 3);
        let Some(err) = err else {
            // Past the run's last publish: every one of them was made to fail in turn.
            assert!(
                fail_after >= 10,
                "a run publishes a manifest and shards, {fail_after}"
            );
            break;
        };
        assert!(err.to_string().contains("injected fault"), "{err}");
        m.set_faults(Faults::default());
        m.release_lock_of_dead_writer();
        if m.get("manifest.json").is_none() {
            assert_eq!(committed, 0);
        } else {
            let ds = open(&storage);
            assert!(
                ds.len() >= committed,
                "{fail_after}: {} < {committed}",
                ds.len()
            );
            check_all("after the failure", &ds, ds.len());
            let report = verify_dataset(&ds, VerifyOptions::default(), &|_| {}).unwrap();
            assert!(report.is_ok(), "{fail_after}: {:?}", report.problems);
        }
        // A second run removes what the first left and completes the dataset.
        let (done, err) = write_until_failure(&storage, TOTAL, 3);
        assert!(err.is_none(), "{fail_after}: {err:?}");
        assert_eq!(done, TOTAL);
        let ds = open(&storage);
        check_all("after the rerun", &ds, TOTAL);
        let report = verify_dataset(&ds, VerifyOptions::default(), &|_| {}).unwrap();
        assert!(
            report.is_ok() && report.leftovers.is_empty(),
            "{fail_after}: {report:?}"
        );
    }
}

#[test]
fn a_shard_published_without_its_manifest_is_a_leftover_not_damage() {
    let m = MemoryStorage::new("orphan");
    let storage: Arc<dyn Storage> = Arc::new(m.clone());
    write(&storage, 0..5, small_options()); // one shard, its segment, the manifest
                                            // The next commit publishes its shard, table part, key run and segment, then fails to
                                            // publish the manifest, and cannot take the shard back.
    m.set_faults(Faults {
        publishes_before_failure: Some(4),
        deletes_fail: true,
        ..Faults::default()
    });
    let mut w = reopen(&storage);
    for i in 5..8 {
        w.append(&format!("s{i}"), &as_fields(&sample(i))).unwrap();
    }
    let err = w.commit().unwrap_err();
    assert!(err.to_string().contains("manifest.json"), "{err}");
    std::mem::forget(w);
    m.set_faults(Faults::default());
    m.release_lock_of_dead_writer();
    assert!(
        m.get("shard-000001.hsp").is_some(),
        "the orphan shard is there"
    );
    let ds = open(&storage);
    check_all("with an orphan shard", &ds, 5);
    let report = verify_dataset(&ds, VerifyOptions::default(), &|_| {}).unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    assert_eq!(report.leftovers.len(), 4, "{report:?}");
    // The next writer removes them and writes its own shard 1.
    write(&storage, 5..9, small_options());
    check_all("after the next writer", &open(&storage), 9);
}

/// A writer removes what an interrupted writer left and nothing else: files of the user's in
/// the dataset folder whose names only resemble a writer's survive, byte for byte, and verify
/// calls only the real leftovers leftovers.
#[test]
fn files_that_only_look_like_a_writers_survive_the_next_writer() {
    let dir = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(LocalStorage::new(dir.path()));
    write(&storage, 0..5, small_options());
    let theirs = [
        "samples_stats.parquet",
        "samples-old.parquet",
        "shard-000001-old.hsp",
        "shard-a.hsp",
        "segment-notes.json",
        "keys-backup.bin",
        "lane-notes.hsp.tmp",
        "notes.tmp",
    ];
    for (i, name) in theirs.iter().enumerate() {
        std::fs::write(dir.path().join(name), format!("the user's file {i}")).unwrap();
    }
    // What an interrupted writer leaves: a shard the manifest does not list, a temp file.
    let leftovers = ["shard-000009.hsp", "shard-000001.hsp.tmp"];
    for name in leftovers {
        std::fs::write(dir.path().join(name), b"half a shard").unwrap();
    }
    let report = verify_dataset(&open(&storage), VerifyOptions::default(), &|_| {}).unwrap();
    let mut named: Vec<String> = (report.leftovers.iter())
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    named.sort();
    assert_eq!(
        named,
        ["shard-000001.hsp.tmp", "shard-000009.hsp"],
        "{report:?}"
    );

    write(&storage, 5..9, small_options());
    check_all("after the next writer", &open(&storage), 9);
    for (i, name) in theirs.iter().enumerate() {
        let kept = std::fs::read_to_string(dir.path().join(name));
        assert_eq!(
            kept.ok().as_deref(),
            Some(format!("the user's file {i}").as_str()),
            "{name}"
        );
    }
    for name in leftovers {
        assert!(!dir.path().join(name).exists(), "{name} is still there");
    }
}

/// A commit inside `append` (the open shard is full) that fails stops the writer: the shard's
/// samples were accepted, and given ordinals, by earlier appends, so every later call is
/// refused with an error naming them, and no ordinal is given twice. Reopened, the dataset
/// resumes after its last commit and takes them again.
#[test]
fn a_failed_commit_inside_append_stops_the_writer() {
    let m = MemoryStorage::new("stopped");
    let storage: Arc<dyn Storage> = Arc::new(m.clone());
    let five_a_shard = WriteOptions {
        shard_bytes: 1 << 30,
        ..small_options()
    };
    write(&storage, 0..5, five_a_shard.clone());
    let mut w =
        DatasetWriter::open_in(storage.clone(), capture_schema(HIDDEN as u64), five_a_shard)
            .unwrap();
    for i in 5..10 {
        assert_eq!(
            w.append(&format!("s{i}"), &as_fields(&sample(i))).unwrap(),
            i
        );
    }
    m.set_faults(Faults {
        failing_publishes_of: Some("segment-".into()),
        ..Faults::default()
    });
    let err = w.append("s10", &as_fields(&sample(10))).unwrap_err();
    m.set_faults(Faults::default());
    let said = err.to_string();
    assert!(matches!(err, Error::WriterStopped { .. }), "{err:?}");
    for part in [
        "`s5` to `s9`",
        "ordinals 5 to 9",
        "5 samples",
        "`s10` was not appended",
        "injected fault",
        "open the dataset again",
    ] {
        assert!(said.contains(part), "{part:?} is not in: {said}");
    }
    // Every later call is refused the same way: no ordinal 5 for another sample, and no
    // commit that reports success over the lost ones.
    let again = w.append("s11", &as_fields(&sample(11))).unwrap_err();
    assert!(matches!(again, Error::WriterStopped { .. }), "{again:?}");
    assert!(matches!(
        w.commit().unwrap_err(),
        Error::WriterStopped { .. }
    ));
    assert!(
        !w.contains_key("s5"),
        "a lost sample is not reported as held"
    );
    assert!(matches!(
        w.finish().unwrap_err(),
        Error::WriterStopped { .. }
    ));
    check_all("after the stop", &open(&storage), 5);
    write(&storage, 5..11, small_options());
    check_all("reopened and appended again", &open(&storage), 11);
}

/// A write into the open shard that fails part way (a full disk) leaves bytes of a sample its
/// index does not list: the shard is dropped, never committed over them, and the writer
/// stops, naming the samples it held; with no sample held, it only starts the shard again.
#[test]
fn a_failed_write_into_the_open_shard_stops_the_writer_and_commits_nothing_damaged() {
    let m = MemoryStorage::new("full-disk");
    let storage: Arc<dyn Storage> = Arc::new(m.clone());
    write(&storage, 0..5, small_options());
    let mut w = reopen(&storage);
    // The first sample of a new shard fails: nothing was given an ordinal, so the writer
    // goes on with a fresh shard.
    m.set_faults(Faults {
        writes_before_failure: Some(1),
        ..Faults::default()
    });
    let err = w.append("s5", &as_fields(&sample(5))).unwrap_err();
    assert!(matches!(err, Error::NotAppended { .. }), "{err:?}");
    let said = err.to_string();
    for part in [
        "`s5` was not appended, and nothing of it is in the dataset",
        "no space left",
        "The writer goes on: free space where the dataset is, then append `s5` again",
    ] {
        assert!(said.contains(part), "{part:?} is not in: {said}");
    }
    m.set_faults(Faults::default());
    for i in 5..8 {
        assert_eq!(
            w.append(&format!("s{i}"), &as_fields(&sample(i))).unwrap(),
            i
        );
    }
    // The second chunk of the next sample fails, its first one written.
    m.set_faults(Faults {
        writes_before_failure: Some(1),
        ..Faults::default()
    });
    let err = w.append("s8", &as_fields(&sample(8))).unwrap_err();
    m.set_faults(Faults::default());
    let said = err.to_string();
    assert!(matches!(err, Error::WriterStopped { .. }), "{err:?}");
    for part in [
        "writing `s8` into the open shard failed part way",
        "`s5` to `s7`",
        "ordinals 5 to 7",
        "3 samples",
        "`s8` was not appended",
        "no space left",
        "open the dataset again",
    ] {
        assert!(said.contains(part), "{part:?} is not in: {said}");
    }
    let again = w.append("s9", &as_fields(&sample(9))).unwrap_err();
    assert!(matches!(again, Error::WriterStopped { .. }), "{again:?}");
    assert!(!w.contains_key("s5"), "a sample not committed is not held");
    assert!(matches!(
        w.finish().unwrap_err(),
        Error::WriterStopped { .. }
    ));
    let ds = open(&storage);
    check_all("after the stop", &ds, 5);
    let report = verify_dataset(&ds, VerifyOptions::default(), &|_| {}).unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    write(&storage, 5..10, small_options());
    check_all("reopened and appended again", &open(&storage), 10);
}

/// A commit asked for that fails returns its error and stops the writer too: the samples it
/// held were given ordinals, and a writer that went on would give them again.
#[test]
fn a_failed_commit_stops_the_writer() {
    let m = MemoryStorage::new("commit-fails");
    let storage: Arc<dyn Storage> = Arc::new(m.clone());
    write(&storage, 0..5, small_options());
    let mut w = reopen(&storage);
    for i in 5..8 {
        w.append(&format!("s{i}"), &as_fields(&sample(i))).unwrap();
    }
    m.set_faults(Faults {
        failing_publishes_of: Some("segment-".into()),
        ..Faults::default()
    });
    let err = w.commit().unwrap_err();
    m.set_faults(Faults::default());
    assert!(err.to_string().contains("injected fault"), "{err}");
    let again = w.append("s5", &as_fields(&sample(5))).unwrap_err();
    assert!(matches!(again, Error::WriterStopped { .. }), "{again:?}");
    let said = again.to_string();
    for part in [
        "the commit of the open shard failed",
        "`s5` to `s7`",
        "ordinals 5 to 7",
        "injected fault",
    ] {
        assert!(said.contains(part), "{part:?} is not in: {said}");
    }
    drop(w);
    check_all("after the stop", &open(&storage), 5);
    write(&storage, 5..8, small_options());
    check_all("reopened and appended again", &open(&storage), 8);
}

/// A commit whose manifest landed while its publish reported an error, and whose read-back
/// failed too: the writer cannot tell whether it landed, so it takes nothing back.
#[test]
fn a_commit_that_may_have_landed_takes_back_none_of_its_files() {
    let m = MemoryStorage::new("unsure");
    let storage: Arc<dyn Storage> = Arc::new(m.clone());
    write(&storage, 0..5, small_options());
    let mut w = reopen(&storage);
    for i in 5..8 {
        w.append(&format!("s{i}"), &as_fields(&sample(i))).unwrap();
    }
    m.set_faults(Faults {
        failing_publishes_of: Some("manifest.json".into()),
        failed_publishes_land: true,
        failing_reads_of: Some("manifest.json".into()),
        ..Faults::default()
    });
    let err = w.commit().unwrap_err();
    assert!(err.to_string().contains("injected fault"), "{err}");
    m.set_faults(Faults::default());
    drop(w);
    // The manifest that landed lists the commit's files: they are all there.
    let ds = open(&storage);
    check_all("after the unsure commit", &ds, 8);
    let report = verify_dataset(&ds, VerifyOptions::default(), &|_| {}).unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
}

/// Under a lease, a commit that failed before its manifest's put leaves its files (named after
/// the lease) listed nowhere: taken back, and the writer reopened makes them again and
/// lands. One whose manifest put failed in transit keeps them: that put may still land.
#[test]
fn a_leased_writer_takes_back_only_what_no_manifest_can_list() {
    let m = MemoryStorage::new("leased");
    m.lease_as("a11ce5a11ce5a11ce5a11ce5a11ce5a1");
    let storage: Arc<dyn Storage> = Arc::new(m.clone());
    write(&storage, 0..5, small_options());
    let mut w = reopen(&storage);
    let append = |w: &mut DatasetWriter| {
        for i in 5..8 {
            w.append(&format!("s{i}"), &as_fields(&sample(i))).unwrap();
        }
    };
    let failing = |part: &str| {
        m.set_faults(Faults {
            failing_publishes_of: Some(part.into()),
            ..Faults::default()
        })
    };
    // The segment fails: no manifest put was tried.
    append(&mut w);
    let before = storage.list().unwrap();
    failing("segment-");
    let err = w.commit().unwrap_err();
    assert!(err.to_string().contains("injected fault"), "{err}");
    assert_eq!(storage.list().unwrap(), before, "all taken back");
    m.set_faults(Faults::default());
    // Its samples were not committed: the writer stopped; reopened, it appends them again
    // and commits them under the same names.
    assert!(matches!(
        w.append("s5", &as_fields(&sample(5))).unwrap_err(),
        Error::WriterStopped { .. }
    ));
    drop(w);
    let mut w = reopen(&storage);
    append(&mut w);
    w.commit().unwrap();
    check_all("after the second commit", &open(&storage), 8);
    // The manifest's put fails in transit: the next commit's files stay.
    for i in 8..10 {
        w.append(&format!("s{i}"), &as_fields(&sample(i))).unwrap();
    }
    let before = storage.list().unwrap();
    failing("manifest.json");
    w.commit().unwrap_err();
    m.set_faults(Faults::default());
    let after = storage.list().unwrap();
    assert!(
        after
            .iter()
            .any(|f| f.starts_with("shard-") && !before.contains(f)),
        "the shard is kept: {after:?}"
    );
    drop(w);
    let ds = open(&storage);
    check_all("after the failed put", &ds, 8);
    let report = verify_dataset(&ds, VerifyOptions::default(), &|_| {}).unwrap();
    assert!(report.is_ok() && !report.leftovers.is_empty(), "{report:?}");
}

/// The files of `storage`, sorted.
fn listed(storage: &Arc<dyn Storage>) -> Vec<String> {
    let mut names = storage.list().unwrap();
    names.sort();
    names
}

/// A folder holding no dataset but the user's own files, one named as hspack names a
/// dataset's (a shard 0: a dataset whose manifest was lost?): creating a dataset there
/// deletes nothing and is refused, naming a file and what to do. Moved out, the dataset is
/// created: hspack's temp files, what a writer killed while creating the dataset leaves, are
/// removed, and the next writer leaves the user's files put beside it alone, those whose
/// names only resemble hspack's too (`notes.tmp`, `samples_train.parquet`); verify calls them
/// unknown.
#[test]
fn a_writer_never_deletes_files_of_a_folder_that_holds_no_dataset() {
    let (_tmp, backends) = backends();
    let theirs = [
        "keys-of-my-house.bin",
        "notes.tmp",
        "readme.txt",
        "samples_train.parquet",
        "shard-000000.hsp",
    ];
    let first_commit = [
        "lane-0a1b2c3d4e5f60718293a4b5c6d7e8f9-000003.hsp.tmp",
        "manifest.json.tmp",
        "segment-000000-000000-0123456789abcdef.json.tmp",
        "shard-000000.hsp.tmp",
    ];
    for (name, backend) in &backends {
        let storage = backend.storage();
        storage.create_root().unwrap();
        for file in theirs.iter().chain(&first_commit) {
            backend.overwrite(file, file.as_bytes());
        }
        let mut all: Vec<&str> = theirs.iter().chain(&first_commit).copied().collect();
        all.sort();
        let schema = || capture_schema(HIDDEN as u64);
        // Memory takes one writer at a time.
        let sharing: &[bool] = match backend {
            Backend::Local(_) => &[false, true],
            Backend::Memory(_) => &[false],
        };
        for &shared in sharing {
            let options = WriteOptions {
                shared,
                ..small_options()
            };
            let create = DatasetWriter::create_in(storage.clone(), schema(), options.clone());
            let open = DatasetWriter::open_in(storage.clone(), schema(), options);
            // A folder of the user's is refused whole (write/destination.rs); a storage that
            // is no local folder, for the files named as a dataset's.
            let parts: &[&str] = match backend {
                Backend::Local(_) => &[
                    "it holds other files (such as keys-of-my-house.bin) and no dataset",
                    "give a new or empty folder",
                ],
                Backend::Memory(_) => &[
                    "no manifest.json",
                    "(shard-000000.hsp)",
                    "move them out of the folder",
                ],
            };
            for err in [create.unwrap_err(), open.unwrap_err()] {
                assert!(matches!(err, Error::NotADataset { .. }), "{name}: {err}");
                let said = err.to_string();
                for part in parts {
                    assert!(said.contains(part), "{name}: {part:?} is not in: {said}");
                }
            }
            let left: Vec<_> = (listed(&storage).into_iter())
                .filter(|f| !f.starts_with(".hspack-"))
                .collect();
            assert_eq!(
                left, all,
                "{name}: nothing deleted or added (lock files aside)"
            );
        }
        let kept = [
            "keys-of-my-house.bin",
            "notes.tmp",
            "readme.txt",
            "samples_train.parquet",
        ];
        // Moved out, the dataset is created (the temp files of a first commit removed); the
        // user's files put beside it once it is there, the next writer, which removes what an
        // interrupted one left, leaves them alone.
        for file in theirs {
            storage.delete(file).unwrap();
        }
        write(&storage, 0..3, small_options());
        for file in kept {
            backend.overwrite(file, file.as_bytes());
        }
        write(&storage, 3..5, small_options());
        check_all(name, &open(&storage), 5);
        for file in kept {
            assert_eq!(
                storage.read(file).unwrap().as_deref(),
                Some(file.as_bytes()),
                "{name}: {file}"
            );
        }
        let report = verify_dataset(&open(&storage), VerifyOptions::default(), &|_| {}).unwrap();
        assert!(
            report.is_ok() && report.leftovers.is_empty(),
            "{name}: {report:?}"
        );
        let unknown: Vec<_> = (report.unknown_files.iter())
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(unknown, kept, "{name}");
    }
}

/// A commit whose manifest landed but whose folder's fsync then failed (a power cut may undo
/// it): not reported committed. The writer stops, naming the samples, and deletes nothing,
/// not even the segments the commit's merge replaced, which the manifest a power cut leaves
/// lists. Reopened, the next writer finds what is there and resumes.
#[test]
fn a_commit_whose_folder_sync_failed_stops_the_writer_and_deletes_nothing() {
    let m = MemoryStorage::new("unsynced");
    let storage: Arc<dyn Storage> = Arc::new(m.clone());
    let mut w = reopen(&storage);
    // Seven commits of one segment each: the eighth merges them.
    for i in 0..7 {
        w.append(&format!("s{i}"), &as_fields(&sample(i))).unwrap();
        w.commit().unwrap();
    }
    w.append("s7", &as_fields(&sample(7))).unwrap();
    let before = listed(&storage);
    m.set_faults(Faults {
        unsynced_publishes_of: Some("manifest.json".into()),
        ..Faults::default()
    });
    let err = w.commit().unwrap_err();
    m.set_faults(Faults::default());
    assert!(hspack::io::local::landed_not_durable(&err), "{err}");
    assert!(err.to_string().contains("fsync"), "{err}");
    let after = listed(&storage);
    let gone: Vec<_> = before.iter().filter(|f| !after.contains(f)).collect();
    assert!(gone.is_empty(), "deleted: {gone:?}");
    let again = w.append("s8", &as_fields(&sample(8))).unwrap_err();
    assert!(matches!(again, Error::WriterStopped { .. }), "{again:?}");
    let said = again.to_string();
    for part in [
        "`s7` to `s7`",
        "ordinals 7 to 7",
        "may not be in the dataset",
    ] {
        assert!(said.contains(part), "{part:?} is not in: {said}");
    }
    drop(w);
    // It landed: the reopened writer finds `s7` committed and removes what the merge replaced.
    let mut w = reopen(&storage);
    assert!(w.contains_key("s7"));
    w.append("s8", &as_fields(&sample(8))).unwrap();
    w.finish().unwrap();
    let ds = open(&storage);
    check_all("reopened after the unsynced commit", &ds, 9);
    let report = verify_dataset(&ds, VerifyOptions::default(), &|_| {}).unwrap();
    assert!(report.is_ok() && report.leftovers.is_empty(), "{report:?}");
}

#[test]
fn a_file_written_out_of_order_past_the_write_behind_size_publishes_every_byte() {
    // The local backend sets the disk to writing every 32 MiB written; the bytes written
    // before and after (a header rewritten at the start, a hole filled later) all land.
    let (_dir, backends) = backends();
    let mib = 1usize << 20;
    let piece = |i: usize| vec![(i % 251) as u8 + 1; 3 * mib];
    for (name, b) in &backends {
        let storage = b.storage();
        storage.create_root().unwrap();
        let mut f = storage.create("shard-000000.hsp.tmp").unwrap();
        // Pieces 0..30 of 3 MiB, piece 7 left as a hole until the end.
        for i in (0..30).filter(|&i| i != 7) {
            f.write_at((i * 3 * mib) as u64, &piece(i)).unwrap();
        }
        f.write_at(0, b"header").unwrap();
        f.write_at((7 * 3 * mib) as u64, &piece(7)).unwrap();
        f.sync_all().unwrap();
        f.publish_new("shard-000000.hsp", true).unwrap();
        let bytes = storage
            .open("shard-000000.hsp")
            .unwrap()
            .read(0..90 * mib as u64)
            .unwrap();
        let mut expected: Vec<u8> = (0..30).flat_map(piece).collect();
        expected[..6].copy_from_slice(b"header");
        assert!(
            bytes[..] == expected[..],
            "{name}: the file read back differs"
        );
    }
}

/// A shard that fails to read (a short read: the storage failed, not the bytes) is not
/// damage: `repair` deletes nothing on its word, even where sending the shard again would
/// fail too, and the copy is whole once the storage reads again.
#[test]
fn repair_deletes_nothing_for_a_read_that_failed() {
    let m = MemoryStorage::new("repaired");
    let storage: Arc<dyn Storage> = Arc::new(m.clone());
    write(&storage, 0..12, small_options());
    let good: Arc<dyn Storage> = Arc::new(MemoryStorage::new("good"));
    let src = Dataset::open_in(storage.clone(), ReadOptions::default()).unwrap();
    hspack::transfer::copy(&src, &good, &Default::default(), &|_| {}).unwrap();
    let good = Dataset::open_in(good, ReadOptions::default()).unwrap();
    m.set_faults(Faults {
        short_reads_of: Some("shard-000001".into()),
        failing_publishes_of: Some("shard-000001".into()),
        ..Faults::default()
    });
    let damaged = Dataset::open_in(storage.clone(), ReadOptions::default()).unwrap();
    let err = hspack::transfer::repair(&damaged, &good)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("shard-000001") && err.contains("nothing was changed"),
        "{err}"
    );
    m.set_faults(Faults::default());
    let after = Dataset::open_in(storage, ReadOptions::default()).unwrap();
    let report = verify_dataset(&after, VerifyOptions::default(), &|_| {}).unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    assert_eq!(after.len(), 12);
}

/// A copy whose hold on the destination lapsed while its manifest was on the way (a slow put
/// its client retried), during which another copy took the destination over and put a file
/// of its own: the manifest landed over it and the copy said it was proven. The files the
/// manifest lists are checked again where the lease was lost: a file changed fails the copy,
/// naming it; a takeover that changed nothing leaves a proven copy.
#[test]
fn a_copy_whose_lease_lapsed_while_its_manifest_was_on_the_way_checks_what_is_there() {
    let src_storage: Arc<dyn Storage> = Arc::new(MemoryStorage::new("src"));
    write(&src_storage, 0..12, small_options());
    let src = open(&src_storage);
    let listed = src.manifest().listed_files()[0].file.to_string();
    let same = src_storage.read(&listed).unwrap().unwrap();
    for (put, fails) in [(b"another copy's file".to_vec(), true), (same, false)] {
        let dst = MemoryStorage::new("dst");
        dst.set_faults(Faults {
            taken_over_during_publish_of: Some(("manifest.json".into(), listed.clone(), put)),
            ..Faults::default()
        });
        let dst: Arc<dyn Storage> = Arc::new(dst);
        let copied = hspack::transfer::copy(&src, &dst, &Default::default(), &|_| {});
        match fails {
            true => {
                let err = copied.unwrap_err().to_string();
                assert!(
                    err.contains("lapsed while its manifest was on the way")
                        && err.contains(&listed),
                    "{err}"
                );
            }
            false => {
                copied.unwrap();
                check_all("memory", &open(&dst), 12);
            }
        }
    }
    // The other copy put its manifest first: said as a copy refused, not as a writer's
    // uncommitted samples.
    let dst = MemoryStorage::new("dst");
    dst.set_faults(Faults {
        taken_over_during_publish_of: Some((
            "manifest.json".into(),
            "manifest.json".into(),
            b"{}".to_vec(),
        )),
        ..Faults::default()
    });
    let dst: Arc<dyn Storage> = Arc::new(dst);
    let err = hspack::transfer::copy(&src, &dst, &Default::default(), &|_| {})
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("another copy or writer changed the destination while this copy held it")
            && !err.contains("uncommitted samples"),
        "{err}"
    );
}
