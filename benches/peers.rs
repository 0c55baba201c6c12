//! hspack against the tools users already trust, on the same bytes in the same run.
//!
//! `cargo bench --bench peers` (env `HSPACK_BENCH_GB`, default 1, sets the dataset size;
//! `HSPACK_BENCH_DIR` the folder, default the system temp dir; `ROUNDS`, default 5). Each
//! round writes the dataset again and runs every measure and its peers on it, interleaved
//! (the write and `cp` take turns going first, and the first of the read group rotates each
//! round; `cp` copies the first shard of a dataset written before the rounds). Prints a markdown table of medians and
//! bests (of the rates: the best is the shortest time), the ratio of the medians, hspack /
//! peer, and the load average, and writes it to `target/bench-peers.md`. The open and lookup
//! latencies at the end have no peer and run once. Peers: `cp`, `cat`,
//! `b3sum --num-threads 2` (install with `cargo install b3sum`), `sha256sum`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use hspack::synth::{capture_schema, channel_scales, named_capture_sample, Rng};
use hspack::verify::{verify, VerifyOptions};
use hspack::{Codec, DType, Dataset, DatasetWriter, Field, Role, Schema, WriteOptions};

/// A measure: its median and best value over the rounds (the same twice for one run), and
/// its peer's.
struct Row {
    what: String,
    ours: (f64, f64),
    peer: Option<(String, (f64, f64))>,
    unit: &'static str,
    higher_is_better: bool,
}

const WRITE: &str = "write, fsync'd";
const CP: &str = "cp + sync of its first shard";
const VERIFY: &str = "verify, warm cache";
const B3SUM: &str = "b3sum --num-threads 2";
const SHA: &str = "sha256sum";
const READ_ONCE: &str = "sequential read into a buffer, warm cache, chunks hashed once";
const READ_NEVER: &str = "sequential read into a buffer, warm cache, CheckPolicy::Never";
const CAT: &str = "cat > /dev/null";

fn secs(f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

fn run(cmd: &str, args: &[&str]) -> Option<f64> {
    let t = Instant::now();
    let ok = Command::new(cmd).args(args).output().ok()?.status.success();
    ok.then(|| t.elapsed().as_secs_f64())
}

fn shards(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let p = e.ok()?.path();
            p.extension()
                .is_some_and(|x| x == "hsp")
                .then(|| p.to_string_lossy().into_owned())
        })
        .collect();
    v.sort();
    v
}

/// Reads every field of every sample in order: (bytes read, seconds).
/// Reads every field of every sample and copies its bytes into one reused buffer, as `cat`
/// copies file pages into its own: a zero-copy read that touched nothing would time nothing.
fn read_everything(ds: &Dataset) -> (u64, f64) {
    let mut read = 0u64;
    let mut buffer: Vec<u8> = Vec::new();
    let t = secs(|| {
        for i in 0..ds.len() {
            let s = ds.sample(i).unwrap();
            for f in 0..ds.schema().fields.len() {
                let t = s.read_field(f, None).unwrap();
                let bytes = t.bytes();
                if buffer.len() < bytes.len() {
                    buffer.resize(bytes.len(), 0);
                }
                buffer[..bytes.len()].copy_from_slice(bytes);
                read += bytes.len() as u64;
                std::hint::black_box(&buffer);
            }
        }
    });
    (read, t)
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("RssAnon:"))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// A dataset of `n` tiny samples, for open time, lookup latency and memory.
fn tiny_dataset(dir: &Path, n: u64) {
    let schema = Schema::new(vec![Field::new(
        "input_ids",
        DType::I32,
        &[],
        Role::TokenIds,
    )]);
    let opts = WriteOptions {
        align_log2: Some(6),
        durable: false,
        ..WriteOptions::default()
    };
    let mut w = DatasetWriter::create(dir, schema, opts).unwrap();
    for i in 0..n {
        w.append(
            &format!("k{i}"),
            &[("input_ids", &(i as i32).to_le_bytes())],
        )
        .unwrap();
    }
    w.finish().unwrap();
}

fn latency(dir: &Path, n: u64, rows: &mut Vec<Row>) {
    let before = rss_kib();
    let t = Instant::now();
    let ds = Dataset::open(dir).unwrap();
    let open_us = t.elapsed().as_secs_f64() * 1e6;
    let mut rng = Rng::new(7);
    // Touch every shard once, then time random gets.
    for seq in 0..ds.manifest().shards.len() {
        ds.shard(seq).unwrap();
    }
    let mut lat: Vec<f64> = (0..20_000)
        .map(|_| {
            let i = rng.range(0, n - 1);
            let t = Instant::now();
            let s = ds.sample(i).unwrap();
            let v = s.read_field(0, None).unwrap();
            assert_eq!(v.bytes(), (i as i32).to_le_bytes());
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    lat.sort_by(f64::total_cmp);
    let mut key_lat: Vec<f64> = (0..2_000)
        .map(|_| {
            let i = rng.range(0, n - 1);
            let t = Instant::now();
            let s = ds.get_by_key(&format!("k{i}")).unwrap();
            assert_eq!(s.ordinal(), i);
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    key_lat.sort_by(f64::total_cmp);
    let grown = rss_kib().saturating_sub(before);
    for (what, v) in [
        (format!("open, {n} samples (µs)"), open_us),
        (
            format!("get(ordinal) p50, {n} samples (µs)"),
            lat[lat.len() / 2],
        ),
        (
            format!("get(ordinal) p99, {n} samples (µs)"),
            lat[lat.len() * 99 / 100],
        ),
        (
            format!("get_by_key p50, {n} samples (µs)"),
            key_lat[key_lat.len() / 2],
        ),
        (
            format!("private memory (RssAnon) growth after open + 22K gets, {n} samples (MiB)"),
            grown as f64 / 1024.0,
        ),
    ] {
        rows.push(Row {
            what,
            ours: (v, v),
            peer: None,
            unit: "",
            higher_is_better: false,
        });
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let gb: f64 = std::env::var("HSPACK_BENCH_GB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1.0);
    let base = std::env::var("HSPACK_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| std::env::temp_dir());
    let work = tempfile::tempdir_in(&base).unwrap();
    let dir = work.path().join("ds");
    let hidden = 7168u64;
    let layers = [2u32, 30, 58, 60];
    let schema = capture_schema("bench", 61, hidden, &layers);
    let per_token: u64 = schema.fields.iter().map(|f| f.row_bytes()).sum();
    let mut rng = Rng::new(3);
    let scales: Vec<Vec<f32>> = layers
        .iter()
        .map(|_| channel_scales(&mut rng, hidden as usize))
        .collect();
    let target = (gb * 1e9) as u64;
    let mut samples = Vec::new();
    let mut total = 0;
    while total < target {
        let n = rng.range(128, 4096) as usize;
        let s = named_capture_sample(&mut rng, n, &layers, &scales);
        total += n as u64 * per_token;
        samples.push(s);
    }
    eprintln!(
        "bench: {} samples, {:.2} GB, in {}",
        samples.len(),
        total as f64 / 1e9,
        work.path().display()
    );
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let write = |dir: &Path| {
        let mut w = DatasetWriter::create(
            dir,
            schema.clone(),
            WriteOptions {
                codec: Codec::None,
                ..WriteOptions::default()
            },
        )
        .unwrap();
        for (i, s) in samples.iter().enumerate() {
            let f: Vec<(&str, &[u8])> = s.iter().map(|(k, v)| (k.as_str(), v.as_slice())).collect();
            w.append(&format!("s{i}"), &f).unwrap();
        }
        w.finish().unwrap();
    };
    // Every measure and its peers, round after round (A, B, A, B, ...), each round on a
    // dataset written in that round; within a group the first to run rotates.
    let mut rates: Vec<(String, Vec<f64>)> = Vec::new();
    let mut add = |name: &str, rate: f64| match rates.iter_mut().find(|(n, _)| n == name) {
        Some((_, v)) => v.push(rate),
        None => rates.push((name.to_string(), vec![rate])),
    };
    // The first shard `cp` copies: one written before the rounds, so that the write and the
    // copy can take turns going first (a write's writeback slows whatever follows it).
    let copied = work.path().join("copied");
    write(&copied);
    let source = shards(&copied).swap_remove(0);
    let first = std::fs::metadata(&source).unwrap().len();
    let copy = work.path().join("copy.hsp");
    let cp = format!(
        "cp {} {} && sync {}",
        source,
        copy.display(),
        copy.display()
    );
    let copy_rate = || {
        let rate = run("sh", &["-c", &cp]).map_or(f64::NAN, |t| first as f64 / t / 1e9);
        let _ = std::fs::remove_file(&copy);
        rate
    };
    for round in 0..rounds {
        let _ = std::fs::remove_dir_all(&dir);
        if round % 2 == 1 {
            add(CP, copy_rate());
        }
        add(WRITE, total as f64 / secs(|| write(&dir)) / 1e9);
        if round % 2 == 0 {
            add(CP, copy_rate());
        }
        let files = shards(&dir);
        let shard_bytes: u64 = files
            .iter()
            .map(|f| std::fs::metadata(f).unwrap().len())
            .sum();
        let cat = format!("cat {} > /dev/null", files.join(" "));
        let _ = run("sh", &["-c", &cat]); // warm
        let mut b3 = vec!["--num-threads", "2"];
        b3.extend(files.iter().map(String::as_str));
        let sha: Vec<&str> = files.iter().map(String::as_str).collect();
        let read = |check| {
            let options = hspack::ReadOptions {
                check,
                ..Default::default()
            };
            let (bytes, t) = read_everything(&Dataset::open_with(&dir, options).unwrap());
            Some(t * shard_bytes as f64 / bytes as f64)
        };
        type Timed<'a> = (&'static str, Box<dyn Fn() -> Option<f64> + 'a>);
        let mut group: Vec<Timed> = vec![
            (
                VERIFY,
                Box::new(|| {
                    Some(secs(|| {
                        assert!(verify(&dir, VerifyOptions::default(), &|_| {})
                            .unwrap()
                            .is_ok())
                    }))
                }),
            ),
            (B3SUM, Box::new(|| run("b3sum", &b3))),
            (SHA, Box::new(|| run("sha256sum", &sha))),
            (READ_ONCE, Box::new(|| read(hspack::CheckPolicy::Once))),
            (READ_NEVER, Box::new(|| read(hspack::CheckPolicy::Never))),
            (CAT, Box::new(|| run("sh", &["-c", &cat]))),
        ];
        let lead = round % group.len();
        group.rotate_left(lead);
        for (name, timed) in &group {
            add(
                name,
                timed().map_or(f64::NAN, |t| shard_bytes as f64 / t / 1e9),
            );
        }
        eprintln!("round {} of {rounds} done", round + 1);
    }
    let series = |name: &str| {
        let mut v = rates.iter().find(|(n, _)| n == name).unwrap().1.clone();
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[v.len() - 1]) // (median rate, best rate = min time)
    };
    let mut rows = Vec::new();
    for (ours, peer) in [
        (WRITE, CP),
        (VERIFY, B3SUM),
        (VERIFY, SHA),
        (READ_ONCE, CAT),
        (READ_NEVER, CAT),
    ] {
        rows.push(Row {
            what: format!("{ours} (GB/s)"),
            ours: series(ours),
            peer: Some((peer.to_string(), series(peer))),
            unit: "GB/s",
            higher_is_better: true,
        });
    }

    for n in [10_000u64, 1_000_000] {
        let d = work.path().join(format!("tiny{n}"));
        tiny_dataset(&d, n);
        latency(&d, n, &mut rows);
    }

    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut table = format!(
        "load average at the end: {}\n\n| measure | hspack median (best) | peer | peer median (best) | ratio of medians (hspack / peer) |\n|---|---|---|---|---|\n",
        load.trim()
    );
    for r in &rows {
        let (median, best) = r.ours;
        match &r.peer {
            Some((name, (v, v_best))) => {
                let ratio = if r.higher_is_better {
                    median / v
                } else {
                    v / median
                };
                table += &format!(
                    "| {} | {median:.3} ({best:.3}) {} | {name} | {v:.3} ({v_best:.3}) | {ratio:.2}× |\n",
                    r.what, r.unit
                );
            }
            None => table += &format!("| {} | {median:.2} | | | |\n", r.what),
        }
    }
    println!("{table}");
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-peers.md");
    let _ = std::fs::write(&out, &table);
    eprintln!("wrote {}", out.display());
}
