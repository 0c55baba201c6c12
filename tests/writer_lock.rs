//! One writer per dataset, and commits that never replace what another writer committed:
//! racing writers on threads, a second writer of one process, a manifest or shard that
//! changed under a writer (as a broken lock would let happen).

mod common;

use std::sync::{Arc, Barrier};

use common::*;
use hspack::verify::{verify, VerifyOptions};
use hspack::{Dataset, DatasetWriter, Error};

const HIDDEN: usize = 16;

fn one_sample_dataset(dir: &std::path::Path) {
    let mut w = DatasetWriter::create(dir, capture_schema(HIDDEN as u64), small_options()).unwrap();
    w.append("first", &as_fields(&capture_sample(0, 3, HIDDEN)))
        .unwrap();
    w.finish().unwrap();
}

fn keys(dir: &std::path::Path) -> Vec<String> {
    let ds = Dataset::open(dir).unwrap();
    let mut keys: Vec<String> = (0..ds.len())
        .map(|i| ds.sample(i).unwrap().key().to_string())
        .collect();
    keys.sort();
    keys
}

#[test]
fn racing_writers_on_threads_never_lose_a_committed_sample() {
    const WRITERS: usize = 4;
    const TRIALS: usize = 50;
    let root = tempfile::tempdir().unwrap();
    let dirs: Vec<_> = (0..TRIALS)
        .map(|t| {
            let d = root.path().join(format!("trial-{t}"));
            one_sample_dataset(&d);
            d
        })
        .collect();
    let dirs = Arc::new(dirs);
    let barrier = Arc::new(Barrier::new(WRITERS));
    let handles: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (dirs, barrier) = (Arc::clone(&dirs), Arc::clone(&barrier));
            std::thread::spawn(move || {
                let mut won = Vec::new();
                for (t, dir) in dirs.iter().enumerate() {
                    barrier.wait();
                    let opened =
                        DatasetWriter::open(dir, capture_schema(HIDDEN as u64), small_options());
                    let mut writer = match opened {
                        Ok(writer) => writer,
                        Err(Error::Locked { .. }) => continue,
                        Err(e) => panic!("trial {t}, writer {w}: {e}"),
                    };
                    let key = format!("w{w}");
                    let sample = capture_sample(w as u64 + 1, 2, HIDDEN);
                    writer.append(&key, &as_fields(&sample)).unwrap();
                    writer.finish().unwrap();
                    won.push((t, key));
                }
                won
            })
        })
        .collect();
    let mut committed = vec![vec!["first".to_string()]; TRIALS];
    for h in handles {
        for (t, key) in h.join().unwrap() {
            committed[t].push(key);
        }
    }
    for (t, dir) in dirs.iter().enumerate() {
        let mut expected = committed[t].clone();
        expected.sort();
        assert_eq!(
            keys(dir),
            expected,
            "trial {t}: every finished writer's sample is there"
        );
        assert!(verify(dir, VerifyOptions::default(), &|_| {})
            .unwrap()
            .is_ok());
    }
    // Every trial let at least one writer in.
    assert!(committed.iter().all(|c| c.len() >= 2));
}

#[test]
fn a_second_writer_of_one_process_is_refused_and_the_first_keeps_its_data() {
    let dir = tempfile::tempdir().unwrap();
    one_sample_dataset(dir.path());
    let schema = || capture_schema(HIDDEN as u64);
    let mut first = DatasetWriter::open(dir.path(), schema(), small_options()).unwrap();
    first
        .append("a", &as_fields(&capture_sample(1, 2, HIDDEN)))
        .unwrap();
    let err = DatasetWriter::open(dir.path(), schema(), small_options()).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Locked { .. }), "{msg}");
    assert!(msg.contains("this process"), "{msg}");
    first.finish().unwrap();
    // Once the first is finished, the folder opens again.
    let mut second = DatasetWriter::open(dir.path(), schema(), small_options()).unwrap();
    second
        .append("b", &as_fields(&capture_sample(2, 2, HIDDEN)))
        .unwrap();
    second.finish().unwrap();
    assert_eq!(keys(dir.path()), ["a", "b", "first"]);
}

#[test]
fn a_commit_over_a_manifest_it_did_not_write_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    one_sample_dataset(dir.path());
    let manifest = dir.path().join("manifest.json");
    let mut w =
        DatasetWriter::open(dir.path(), capture_schema(HIDDEN as u64), small_options()).unwrap();
    w.append("late", &as_fields(&capture_sample(5, 2, HIDDEN)))
        .unwrap();
    // Another writer's commit, as a broken lock would let one happen: the same dataset with
    // one more byte of whitespace is a different manifest.
    let mut theirs = std::fs::read(&manifest).unwrap();
    theirs.push(b'\n');
    std::fs::write(&manifest, &theirs).unwrap();

    let err = w.commit().unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::CommitConflict { .. }), "{msg}");
    assert!(msg.contains("manifest.json"), "{msg}");
    assert_eq!(std::fs::read(&manifest).unwrap(), theirs, "not replaced");
    drop(w);
    let left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("shard-"))
        .collect();
    assert_eq!(
        left,
        ["shard-000000.hsp"],
        "the refused shard is not left behind"
    );
    assert_eq!(keys(dir.path()), ["first"]);
}

#[test]
fn a_shard_is_never_published_over_a_file_that_is_there() {
    let dir = tempfile::tempdir().unwrap();
    one_sample_dataset(dir.path());
    let mut w =
        DatasetWriter::open(dir.path(), capture_schema(HIDDEN as u64), small_options()).unwrap();
    w.append("late", &as_fields(&capture_sample(5, 2, HIDDEN)))
        .unwrap();
    // Another writer's shard at the name this one will publish as.
    let theirs = dir.path().join("shard-000001.hsp");
    std::fs::write(&theirs, b"another writer's shard").unwrap();
    let manifest_before = std::fs::read(dir.path().join("manifest.json")).unwrap();

    let err = w.commit().unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::CommitConflict { .. }), "{msg}");
    assert!(msg.contains("shard-000001.hsp"), "{msg}");
    assert_eq!(std::fs::read(&theirs).unwrap(), b"another writer's shard");
    assert_eq!(
        std::fs::read(dir.path().join("manifest.json")).unwrap(),
        manifest_before
    );
    assert!(!dir.path().join("shard-000001.hsp.tmp").exists());
}

#[test]
fn a_new_dataset_is_not_created_over_a_manifest_that_appeared() {
    // The writer lock makes this a race no test can stage; the refusal itself is checked
    // through the publish step every manifest creation takes.
    let dir = tempfile::tempdir().unwrap();
    let temp = dir.path().join("x.tmp");
    let target = dir.path().join("x");
    std::fs::write(&temp, b"new").unwrap();
    std::fs::write(&target, b"old").unwrap();
    let err = hspack::io::local::publish_new(&temp, &target, false).unwrap_err();
    assert!(matches!(err, Error::CommitConflict { .. }), "{err}");
    assert_eq!(std::fs::read(&target).unwrap(), b"old");
}

/// A child forked while the commit lock is held (a worker pool started by another
/// thread) does not keep the other writers out once the parent lets the lock go.
#[test]
fn a_forked_child_does_not_keep_the_commit_lock() {
    let dir = tempfile::tempdir().unwrap();
    let lock = hspack::io::lock::CommitLock::take(dir.path()).unwrap();
    // SAFETY: the child calls only async-signal-safe functions (`sleep`, `_exit`), then
    // ends; the parent kills and reaps it below.
    let child = unsafe { libc::fork() };
    if child == 0 {
        unsafe {
            libc::sleep(30);
            libc::_exit(0);
        }
    }
    assert!(child > 0, "fork failed");
    drop(lock);
    let (tx, rx) = std::sync::mpsc::channel();
    let path = dir.path().to_path_buf();
    std::thread::spawn(move || tx.send(hspack::io::lock::CommitLock::take(&path).map(drop)));
    let taken = rx.recv_timeout(std::time::Duration::from_secs(5));
    // SAFETY: `child` is this test's own child process.
    unsafe {
        libc::kill(child, libc::SIGKILL);
        libc::waitpid(child, std::ptr::null_mut(), 0);
    }
    assert!(
        matches!(taken, Ok(Ok(()))),
        "the lock was not free: {taken:?}"
    );
}
