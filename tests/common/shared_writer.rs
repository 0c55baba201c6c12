//! Writers that share one dataset (`WriteOptions::shared`), each in its own process: what the
//! many-writer tests run and check. Rank `r` appends samples `r{r}-0000`, `r{r}-0001`, … with
//! commits every 3 samples, printing `COMMITTED n` (its own samples committed) after each.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use hspack::verify::{verify, VerifyOptions};
use hspack::{Dataset, DatasetWriter, WriteOptions};

use super::{as_fields, capture_sample, capture_schema, SampleBytes};

/// Hidden size of the samples.
pub const HIDDEN: usize = 128;
/// The variable that makes a test binary's `shared_writer_child` write: `DIR RANK COUNT [GO]`,
/// where `GO` is a file the child waits for before it starts, so that all start together.
pub const CHILD_ENV: &str = "HSPACK_SHARED_WRITER";

/// Shared, durable, commits every 3 samples, 8 KiB chunks.
pub fn options() -> WriteOptions {
    WriteOptions {
        chunk_bytes: Some(8 << 10),
        shard_samples: 3,
        durable: true,
        shared: true,
        ..WriteOptions::default()
    }
}

/// Key of sample `i` of rank `rank`.
pub fn key(rank: u64, i: u64) -> String {
    format!("r{rank}-{i:04}")
}

/// Sample `i` of rank `rank`: 2 to 21 rows.
pub fn sample(rank: u64, i: u64) -> SampleBytes {
    capture_sample(rank * 100_000 + i, 2 + (i * 7 + rank) as usize % 20, HIDDEN)
}

/// Appends rank `rank`'s samples `0..count` not yet in the dataset, and finishes.
pub fn write_rank(dir: &Path, rank: u64, count: u64) {
    let mut w = DatasetWriter::open(dir, capture_schema(HIDDEN as u64), options()).unwrap();
    let mut committed = (0..count)
        .filter(|&i| w.contains_key(&key(rank, i)))
        .count();
    let mut pending = 0;
    // Writers of a capture spend their time on the forward pass, not on commits: a pause
    // before each sample (HSPACK_TEST_APPEND_PAUSE_MS) leaves the commit lock free between
    // commits as a capture does, so the writers' commits interleave.
    let pause = std::env::var("HSPACK_TEST_APPEND_PAUSE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(std::time::Duration::from_millis);
    for i in 0..count {
        if w.contains_key(&key(rank, i)) {
            continue;
        }
        if let Some(pause) = pause {
            std::thread::sleep(pause);
        }
        let before = w.stats().shards;
        w.append(&key(rank, i), &as_fields(&sample(rank, i)))
            .unwrap();
        pending += 1;
        if w.stats().shards != before {
            // The append committed the previous shard: all pending samples but this one.
            committed += pending - 1;
            pending = 1;
            println!("COMMITTED {committed}");
        }
    }
    w.finish().unwrap();
    println!("COMMITTED {}", committed + pending);
}

/// What `shared_writer_child` runs when [`CHILD_ENV`] is set.
pub fn child_main() {
    let Ok(args) = std::env::var(CHILD_ENV) else {
        return;
    };
    let args: Vec<&str> = args.split(' ').collect();
    if let Some(go) = args.get(3) {
        while !Path::new(go).exists() {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
    write_rank(
        Path::new(args[0]),
        args[1].parse().unwrap(),
        args[2].parse().unwrap(),
    );
}

/// Starts rank `rank`'s writer: the test binary running its test `child_test`, with `env`.
pub fn spawn(
    child_test: &str,
    dir: &Path,
    rank: u64,
    count: u64,
    go: &Path,
    env: &[(&str, &str)],
) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([child_test, "--exact", "--nocapture", "--test-threads=1"])
        .env(
            CHILD_ENV,
            format!(
                "{} {rank} {count} {}",
                dir.to_str().unwrap(),
                go.to_str().unwrap()
            ),
        )
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The last `COMMITTED n` a finished child printed (0 if none).
pub fn committed(out: &std::process::Output) -> u64 {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("COMMITTED "))
        .filter_map(|n| n.parse().ok())
        .max()
        .unwrap_or(0)
}

/// Checks the dataset at `dir`: every sample is one a rank wrote, bit for bit, and appears
/// once; each rank's samples are a prefix `0..n` of what it appends (its commits land in
/// order); the manifest's ordinals are dense (`Dataset::open` checks). Returns `n` per rank.
pub fn check(dir: &Path) -> HashMap<u64, u64> {
    let ds = Dataset::open(dir).unwrap();
    let mut seen: HashMap<u64, Vec<u64>> = HashMap::new();
    for o in 0..ds.len() {
        let s = ds.sample(o).unwrap();
        let (rank, i) = s.key()[1..].split_once('-').unwrap();
        let (rank, i): (u64, u64) = (rank.parse().unwrap(), i.parse().unwrap());
        assert_eq!(s.ordinal(), o);
        for (name, data) in sample(rank, i) {
            assert_eq!(
                s.read(&name, None).unwrap().bytes(),
                &data[..],
                "{} {name}",
                s.key()
            );
        }
        seen.entry(rank).or_default().push(i);
    }
    seen.into_iter()
        .map(|(rank, got)| {
            let n = got.len() as u64;
            assert_eq!(
                got,
                (0..n).collect::<Vec<_>>(),
                "rank {rank}, in ordinal order"
            );
            (rank, n)
        })
        .collect()
}

/// Full verification of the dataset at `dir` (a folder or URL) finds nothing wrong.
pub fn verify_clean(dir: &Path) {
    let report = verify(dir, VerifyOptions::default(), &|_| {}).unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
}

/// How many times the rank of a shard's first sample changes along the manifest: more than
/// the number of ranks minus one only when commits of different ranks interleaved.
pub fn rank_changes(dir: &Path) -> usize {
    let ds = Dataset::open(dir).unwrap();
    let ranks: Vec<String> = ds
        .manifest()
        .shards
        .iter()
        .map(|s| {
            let key = ds.sample(s.first_ordinal).unwrap().key().to_string();
            key.split_once('-').unwrap().0.to_string()
        })
        .collect();
    ranks.windows(2).filter(|w| w[0] != w[1]).count()
}
