//! Several writers appending to one dataset folder at once (`WriteOptions::shared`), each in
//! its own process: every sample lands once, bit for bit, ordinals dense, verify clean; a
//! reader opened meanwhile always sees a whole dataset; a writer killed mid-run costs the
//! others nothing; keys must differ across writers; a sole writer and shared writers refuse
//! each other.

mod common;

use std::path::Path;

use common::shared_writer::{self, check, committed, key, rank_changes, spawn, verify_clean};
use common::{as_fields, capture_schema};
use hspack::{DatasetWriter, Error, WriteOptions};

/// Runs in the child processes only.
#[test]
fn shared_writer_child() {
    shared_writer::child_main();
}

fn schema() -> hspack::Schema {
    capture_schema(shared_writer::HIDDEN as u64)
}

#[test]
fn eight_writers_append_to_one_folder_at_once() {
    const RANKS: u64 = 8;
    const COUNT: u64 = 30;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ds");
    let go = tmp.path().join("go");
    // A pause before each sample, as a capture's forward pass makes: on a loaded machine a
    // writer could otherwise make all its commits in one run, and the check that commits
    // interleave failed (the rank changed 7 times, once a writer).
    let pause = [("HSPACK_TEST_APPEND_PAUSE_MS", "2")];
    let children: Vec<_> = (0..RANKS)
        .map(|r| spawn("shared_writer_child", &dir, r, COUNT, &go, &pause))
        .collect();
    std::fs::write(&go, b"").unwrap();
    // A reader opening the dataset while they commit sees a whole dataset each time.
    let mut looks = 0;
    let mut grew = Vec::new();
    let outputs = std::thread::scope(|scope| {
        let waiting = scope.spawn(|| {
            children
                .into_iter()
                .map(|c| c.wait_with_output().unwrap())
                .collect::<Vec<_>>()
        });
        while !waiting.is_finished() {
            if dir.join("manifest.json").exists() {
                let seen: u64 = check(&dir).values().sum();
                grew.push(seen);
                looks += 1;
            }
        }
        waiting.join().unwrap()
    });
    for out in &outputs {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(committed(out), COUNT);
    }
    let counts = check(&dir);
    assert_eq!(counts.len() as u64, RANKS);
    assert!(counts.values().all(|&n| n == COUNT), "{counts:?}");
    verify_clean(&dir);
    let changes = rank_changes(&dir);
    assert!(
        changes >= RANKS as usize,
        "commits interleaved: the rank changes {changes} times along the shards"
    );
    assert!(grew.windows(2).all(|w| w[0] <= w[1]), "{grew:?}");
    assert!(looks > 0);
    eprintln!(
        "{RANKS} writers × {COUNT} samples: rank changes along the shards {changes}, {looks} \
         reads meanwhile, sizes seen {:?}",
        grew.iter()
            .step_by(grew.len().div_ceil(8).max(1))
            .collect::<Vec<_>>()
    );
}

#[test]
fn a_killed_writer_costs_the_others_nothing() {
    const RANKS: u64 = 4;
    const COUNT: u64 = 24;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ds");
    let go = tmp.path().join("go");
    let mut children: Vec<_> = (0..RANKS)
        .map(|r| spawn("shared_writer_child", &dir, r, COUNT, &go, &[]))
        .collect();
    std::fs::write(&go, b"").unwrap();
    // Kill rank 0 once it has committed twice.
    {
        use std::io::{BufRead, BufReader};
        let out = BufReader::new(children[0].stdout.take().unwrap());
        let mut lines = out.lines().map_while(Result::ok);
        let mut seen = 0;
        for line in lines.by_ref() {
            if line.starts_with("COMMITTED ") {
                seen += 1;
                if seen == 2 {
                    break;
                }
            }
        }
        children[0].kill().unwrap();
    }
    let outputs: Vec<_> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    for out in &outputs[1..] {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let counts = check(&dir);
    assert!((1..=3).all(|r| counts[&r] == COUNT), "{counts:?}");
    let killed = counts.get(&0).copied().unwrap_or(0);
    assert!((6..COUNT).contains(&killed), "{counts:?}");
    verify_clean(&dir);
    // The killed rank resumes alone: it removes what it left, and completes.
    shared_writer::write_rank(&dir, 0, COUNT);
    let counts = check(&dir);
    assert!((0..RANKS).all(|r| counts[&r] == COUNT), "{counts:?}");
    verify_clean(&dir);
    let report =
        hspack::verify::verify(&dir, hspack::verify::VerifyOptions::default(), &|_| {}).unwrap();
    assert!(
        report.notes().is_empty(),
        "a writer alone removed every leftover: {:?}",
        report.notes()
    );
}

#[test]
fn keys_must_differ_across_writers() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ds");
    let mut a = DatasetWriter::open(&dir, schema(), shared_writer::options()).unwrap();
    let mut b = DatasetWriter::open(&dir, schema(), shared_writer::options()).unwrap();
    let fields = |i| shared_writer::sample(0, i);
    assert_eq!(
        a.append(&key(0, 0), &as_fields(&fields(0))).unwrap(),
        hspack::write::ORDINAL_AT_COMMIT
    );
    b.append(&key(0, 0), &as_fields(&fields(0))).unwrap();
    b.append(&key(0, 1), &as_fields(&fields(1))).unwrap();
    a.commit().unwrap();
    let err = b.commit().unwrap_err();
    assert!(
        matches!(&err, Error::KeyTaken { key: k, samples: 2, .. } if *k == key(0, 0)),
        "{err}"
    );
    // The refused shard's samples are not committed, and the writer says so.
    assert!(
        b.contains_key(&key(0, 0)),
        "the other writer's sample is there"
    );
    assert!(!b.contains_key(&key(0, 1)), "this one was not committed");
    b.append(&key(0, 1), &as_fields(&fields(1))).unwrap();
    b.finish().unwrap();
    a.finish().unwrap();
    assert_eq!(check(&dir)[&0], 2);
    verify_clean(&dir);
}

/// Shared options with 2 samples a shard, so that a third append commits the first two.
fn two_a_shard() -> WriteOptions {
    WriteOptions {
        shard_samples: 2,
        ..shared_writer::options()
    }
}

/// Appends sample `i` of rank `rank` (`shared_writer::sample`, under its key) to `w`.
fn put(w: &mut DatasetWriter, rank: u64, i: u64) {
    w.append(&key(rank, i), &as_fields(&shared_writer::sample(rank, i)))
        .unwrap();
}

/// The keys of the dataset at `dir`, in ordinal order.
fn keys_of(dir: &Path) -> Vec<String> {
    let ds = hspack::Dataset::open(dir).unwrap();
    (0..ds.len())
        .map(|o| ds.sample(o).unwrap().key().to_string())
        .collect()
}

/// No file is left under a temp name (a refused lane's included).
fn no_temp_files(dir: &Path) {
    let temps: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(temps.is_empty(), "{temps:?}");
}

/// A's append of a key B committed after A last committed, where that append first commits
/// A's full shard (catching up with B's commit): refused, never written a second time.
#[test]
fn a_key_another_writer_committed_is_refused_after_the_append_commits_a_full_shard() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ds");
    let mut a = DatasetWriter::open(&dir, schema(), two_a_shard()).unwrap();
    let mut b = DatasetWriter::open(&dir, schema(), two_a_shard()).unwrap();
    let taken = key(1, 0);
    put(&mut a, 0, 0);
    put(&mut a, 0, 1);
    put(&mut b, 1, 0);
    b.commit().unwrap();
    assert!(!a.contains_key(&taken), "A has not seen B's commit yet");
    let err = a
        .append(&taken, &as_fields(&shared_writer::sample(1, 0)))
        .unwrap_err();
    assert!(
        matches!(&err, Error::DuplicateKey { key } if *key == taken),
        "{err}"
    );
    assert!(a.contains_key(&taken), "A now knows B's key");
    assert_eq!(a.stats().samples, 3, "A's full shard was committed");
    put(&mut a, 0, 2);
    a.finish().unwrap();
    b.finish().unwrap();
    assert_eq!(keys_of(&dir), [key(1, 0), key(0, 0), key(0, 1), key(0, 2)]);
    assert_eq!(check(&dir), [(0, 3), (1, 1)].into());
    verify_clean(&dir);
}

/// The same through a lane: A's commit of its open shard, which `commit_lane` makes first,
/// catches up with B's commit of a key the lane holds; the lane is refused, and deleted.
#[test]
fn a_lane_holding_a_key_another_writer_committed_is_refused_after_the_open_shard_commits() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ds");
    let mut a = DatasetWriter::open(&dir, schema(), two_a_shard()).unwrap();
    let mut b = DatasetWriter::open(&dir, schema(), two_a_shard()).unwrap();
    let taken = key(1, 0);
    put(&mut a, 0, 0);
    put(&mut b, 1, 0);
    b.commit().unwrap();
    let mut lane = a.lanes().open().unwrap();
    lane.append(&key(0, 1), &as_fields(&shared_writer::sample(0, 1)))
        .unwrap();
    lane.append(&taken, &as_fields(&shared_writer::sample(1, 0)))
        .unwrap();
    let err = a.commit_lane(lane).unwrap_err();
    assert!(
        matches!(&err, Error::DuplicateKey { key } if *key == taken),
        "{err}"
    );
    assert!(
        !a.contains_key(&key(0, 1)),
        "the lane's samples are not committed"
    );
    no_temp_files(&dir);
    let mut lane = a.lanes().open().unwrap();
    lane.append(&key(0, 1), &as_fields(&shared_writer::sample(0, 1)))
        .unwrap();
    a.commit_lane(lane).unwrap();
    a.finish().unwrap();
    b.finish().unwrap();
    assert_eq!(keys_of(&dir), [key(1, 0), key(0, 0), key(0, 1)]);
    assert_eq!(check(&dir), [(0, 2), (1, 1)].into());
    verify_clean(&dir);
    no_temp_files(&dir);
}

#[test]
fn a_sole_writer_and_shared_writers_refuse_each_other() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ds");
    let sole = DatasetWriter::open(&dir, schema(), WriteOptions::default()).unwrap();
    let t = std::time::Instant::now();
    let err = DatasetWriter::open(&dir, schema(), shared_writer::options()).unwrap_err();
    assert!(matches!(err, Error::Locked { .. }), "{err}");
    assert!(
        t.elapsed().as_secs() < 5,
        "refused at once, not after a wait"
    );
    drop(sole);
    let shared = DatasetWriter::open(&dir, schema(), shared_writer::options()).unwrap();
    let err = DatasetWriter::open(&dir, schema(), WriteOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Locked { .. }), "{err}");
    assert!(err.to_string().contains("sharing"), "{err}");
    let second = DatasetWriter::open(&dir, schema(), shared_writer::options()).unwrap();
    drop(shared);
    drop(second);
    assert!(
        !Path::new(&dir)
            .join(hspack::write::dataset_writer::LOCK_FILE)
            .exists(),
        "the last writer out deletes the lock file"
    );
    DatasetWriter::open(&dir, schema(), WriteOptions::default()).unwrap();
}
