//! Shard lanes: shards written at the same time on several threads and committed in order
//! give the very bytes the one-shard-at-a-time writer gives; refusals leave the dataset as it
//! was; what a lane leaves behind is removed.

mod common;

use common::*;
use hspack::verify::{verify, VerifyOptions};
use hspack::write::ShardLane;
use hspack::{Dataset, DatasetWriter, Error};

const HIDDEN: usize = 32;

fn samples(n: u64) -> Vec<(String, SampleBytes)> {
    (0..n)
        .map(|i| {
            (
                format!("req-{i:03}"),
                capture_sample(i, (i as usize * 7) % 23, HIDDEN),
            )
        })
        .collect()
}

fn files(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .filter(|(n, _)| n != "samples.parquet" && n != ".hspack-writer.lock")
        .collect();
    out.sort();
    out
}

#[test]
fn lanes_on_threads_write_the_bytes_of_the_sequential_writer() {
    let all = samples(40);
    let groups: Vec<&[(String, SampleBytes)]> = all.chunks(6).collect();
    // Shards end only where the test commits; chunks stay small so samples span several.
    let mut options = small_options();
    options.shard_samples = 1000;
    options.shard_bytes = 1 << 30;

    let seq_dir = tempfile::tempdir().unwrap();
    let mut w = DatasetWriter::create(
        seq_dir.path(),
        capture_schema(HIDDEN as u64),
        options.clone(),
    )
    .unwrap();
    for g in &groups {
        for (key, s) in g.iter() {
            w.append(key, &as_fields(s)).unwrap();
        }
        w.commit().unwrap();
    }
    w.finish().unwrap();

    let lane_dir = tempfile::tempdir().unwrap();
    let mut w =
        DatasetWriter::create(lane_dir.path(), capture_schema(HIDDEN as u64), options).unwrap();
    let lanes = w.lanes();
    // Every group on its own thread, all at once; they finish in any order.
    let written: Vec<ShardLane> = std::thread::scope(|scope| {
        let handles: Vec<_> = groups
            .iter()
            .rev()
            .map(|g| {
                let lanes = lanes.clone();
                scope.spawn(move || {
                    let mut lane = lanes.open().unwrap();
                    for (i, (key, s)) in g.iter().enumerate() {
                        assert_eq!(lane.append(key, &as_fields(s)).unwrap(), i as u64);
                    }
                    lane
                })
            })
            .collect();
        let mut v: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        v.reverse();
        v
    });
    for lane in written {
        w.commit_lane(lane).unwrap();
    }
    let stats = w.finish().unwrap();
    assert_eq!(stats.samples, 40);
    assert_eq!(stats.shards, groups.len() as u64);

    let (a, b) = (files(seq_dir.path()), files(lane_dir.path()));
    assert_eq!(
        a.iter().map(|f| &f.0).collect::<Vec<_>>(),
        b.iter().map(|f| &f.0).collect::<Vec<_>>()
    );
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        assert!(
            x == y,
            "{name} differs between the sequential and the lane writer"
        );
    }
    let ds = Dataset::open(lane_dir.path()).unwrap();
    for (o, (key, s)) in all.iter().enumerate() {
        let sample = ds.get_by_key(key).unwrap();
        assert_eq!(sample.ordinal(), o as u64);
        for (field, bytes) in s {
            assert_eq!(sample.read(field, None).unwrap().bytes(), &bytes[..]);
        }
    }
    assert!(verify(lane_dir.path(), VerifyOptions::default(), &|_| {})
        .unwrap()
        .is_ok());
}

#[test]
fn a_lane_and_the_open_shard_commit_in_call_order() {
    let dir = tempfile::tempdir().unwrap();
    let all = samples(4);
    let mut w =
        DatasetWriter::create(dir.path(), capture_schema(HIDDEN as u64), small_options()).unwrap();
    let mut lane = w.lanes().open().unwrap();
    lane.append(&all[2].0, &as_fields(&all[2].1)).unwrap();
    lane.append(&all[3].0, &as_fields(&all[3].1)).unwrap();
    w.append(&all[0].0, &as_fields(&all[0].1)).unwrap();
    w.append(&all[1].0, &as_fields(&all[1].1)).unwrap();
    // The open shard (req-000, req-001) is committed before the lane.
    w.commit_lane(lane).unwrap();
    w.finish().unwrap();
    let ds = Dataset::open(dir.path()).unwrap();
    let keys: Vec<_> = (0..4)
        .map(|o| ds.sample(o).unwrap().key().to_string())
        .collect();
    assert_eq!(keys, ["req-000", "req-001", "req-002", "req-003"]);
}

#[test]
fn refused_lanes_leave_the_dataset_and_no_file_behind() {
    let dir = tempfile::tempdir().unwrap();
    let all = samples(3);
    let mut w =
        DatasetWriter::create(dir.path(), capture_schema(HIDDEN as u64), small_options()).unwrap();
    w.append(&all[0].0, &as_fields(&all[0].1)).unwrap();
    w.commit().unwrap();
    let before = files(dir.path());

    // A key the dataset holds: refused at commit, nothing changes.
    let mut lane = w.lanes().open().unwrap();
    lane.append(&all[1].0, &as_fields(&all[1].1)).unwrap();
    lane.append(&all[0].0, &as_fields(&all[0].1)).unwrap();
    assert!(matches!(w.commit_lane(lane), Err(Error::DuplicateKey { key }) if key == all[0].0));
    assert_eq!(files(dir.path()), before);

    // A key given twice to one lane: refused at append.
    let mut lane = w.lanes().open().unwrap();
    lane.append(&all[1].0, &as_fields(&all[1].1)).unwrap();
    assert!(matches!(
        lane.append(&all[1].0, &as_fields(&all[2].1)),
        Err(Error::DuplicateKey { .. })
    ));
    // A bad sample: refused at append, the lane goes on.
    let mut bad = all[2].1.clone();
    bad[0].1.pop();
    assert!(matches!(
        lane.append(&all[2].0, &as_fields(&bad)),
        Err(Error::BadSample { .. })
    ));
    lane.append(&all[2].0, &as_fields(&all[2].1)).unwrap();

    // A lane from another dataset's writer is refused.
    let other = tempfile::tempdir().unwrap();
    let mut options = small_options();
    options.dataset_id = Some([7; 16]);
    let w2 = DatasetWriter::create(other.path(), capture_schema(HIDDEN as u64), options).unwrap();
    let foreign = w2.lanes().open().unwrap();
    assert!(matches!(
        w.commit_lane(foreign),
        Err(Error::BadOption { .. })
    ));

    // A dropped lane deletes its file.
    let dropped = w.lanes().open().unwrap();
    drop(dropped);
    w.commit_lane(lane).unwrap();
    w.finish().unwrap();
    let ds = Dataset::open(dir.path()).unwrap();
    assert_eq!(ds.len(), 3);
    let left: Vec<_> = files(dir.path()).into_iter().map(|f| f.0).collect();
    assert!(left.iter().all(|n| !n.ends_with(".tmp")), "{left:?}");
}

const LANE_CRASH_DIR: &str = "HSPACK_LANE_CRASH_DIR";

/// Runs in the child process only: commits a sample, writes a lane, and dies without any
/// clean-up, as a killed process does (its writer lock is released by the kernel).
#[test]
fn lane_crash_child() {
    let Ok(dir) = std::env::var(LANE_CRASH_DIR) else {
        return;
    };
    let all = samples(2);
    let mut w =
        DatasetWriter::create(&dir, capture_schema(HIDDEN as u64), small_options()).unwrap();
    w.append(&all[0].0, &as_fields(&all[0].1)).unwrap();
    w.commit().unwrap();
    let mut lane = w.lanes().open().unwrap();
    lane.append(&all[1].0, &as_fields(&all[1].1)).unwrap();
    std::process::abort();
}

#[test]
fn a_lane_a_crash_leaves_is_removed_on_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "lane_crash_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(LANE_CRASH_DIR, dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(!status.success(), "the child died");
    assert!(files(dir.path()).iter().any(|f| f.0.starts_with("lane-")));
    let w =
        DatasetWriter::open(dir.path(), capture_schema(HIDDEN as u64), small_options()).unwrap();
    assert!(!files(dir.path()).iter().any(|f| f.0.starts_with("lane-")));
    assert_eq!(w.len(), 1);
    drop(w);
    assert!(verify(dir.path(), VerifyOptions::default(), &|_| {})
        .unwrap()
        .is_ok());
}
