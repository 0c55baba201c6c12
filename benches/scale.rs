//! Datasets of many samples: what opening, random reads by ordinal and by key, a reader's
//! memory and a commit cost as the sample and shard counts grow.
//!
//! Samples are index-heavy and payload-light (1 row of a 4-byte token field, codec zstd, so no
//! chunk is padded to 4 KiB): what is measured is the manifest and the shard indexes, which
//! is what grows with the sample count. For each (samples, shards) it writes a dataset into
//! `HSPACK_SCALE_DIR` (default the temp folder), then, with the page cache warm:
//! - `open`: `Dataset::open` (reads and checks the manifest), min of 5;
//! - random reads of `READS` (default 2000) samples by ordinal (`sample(o)` and its field
//!   read), then by key (`get_by_key`), each from a freshly opened dataset: total time, p50
//!   and p99 per read; the first read of a shard maps it and hashes and checks its index;
//! - the reader's resident memory grown by those reads (VmRSS).
//!
//! Then commits: a dataset grown one 1-sample shard a commit (no fsync: the metadata cost
//! alone) to `COMMITS` (default 10000) shards. At 10, 100, 1000 and 10000 shards it prints,
//! over the last 64 commits (all of them at 10): the median and mean commit time, and the
//! metadata bytes a commit wrote on average (manifest, segments, key runs, table parts: all
//! but the shard itself, merges included), and the manifest's size.
//!
//! `cargo bench --bench scale` (`SCALE_MAX=10000000` samples at most; `READS=2000`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use hspack::io::{FileReader, NewFile, Storage, WriterLease};

use hspack::{Codec, DType, Dataset, DatasetWriter, Field, Role, Schema, WriteOptions};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn schema() -> Schema {
    Schema::new(vec![Field::new(
        "input_ids",
        DType::I32,
        &[],
        Role::TokenIds,
    )])
}

fn key(i: u64) -> String {
    format!("prompt-{i:09}")
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// A small deterministic generator.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

fn write(dir: &std::path::Path, samples: u64, shards: u64) -> f64 {
    let options = WriteOptions {
        codec: Codec::Zstd,
        shard_samples: samples.div_ceil(shards),
        durable: false,
        ..WriteOptions::default()
    };
    let t = Instant::now();
    let mut w = DatasetWriter::create(dir, schema(), options).unwrap();
    for i in 0..samples {
        let ids = (i as u32).to_le_bytes();
        w.append(&key(i), &[("input_ids", &ids[..])]).unwrap();
    }
    w.commit().unwrap();
    drop(w); // no samples table: it is not what is measured
    t.elapsed().as_secs_f64()
}

fn reads(dir: &std::path::Path, samples: u64, n: u64, by_key: bool) -> (f64, f64, f64, u64) {
    let before = rss_bytes();
    let ds = Dataset::open(dir).unwrap();
    let mut rng = Lcg(7 + by_key as u64);
    let mut each = Vec::with_capacity(n as usize);
    let t = Instant::now();
    for _ in 0..n {
        let o = rng.below(samples);
        let t = Instant::now();
        let s = match by_key {
            false => ds.sample(o).unwrap(),
            true => ds.get_by_key(&key(o)).unwrap(),
        };
        let ids = s.read("input_ids", None).unwrap();
        assert_eq!(ids.bytes(), &(o as u32).to_le_bytes()[..]);
        each.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let total = t.elapsed().as_secs_f64();
    let grown = rss_bytes().saturating_sub(before);
    (
        total,
        percentile(&mut each, 0.5),
        percentile(&mut each, 0.99),
        grown,
    )
}

fn commits(dir: &std::path::Path, max: u64) {
    let options = WriteOptions {
        codec: Codec::Zstd,
        shard_samples: 1,
        durable: false,
        ..WriteOptions::default()
    };
    const WINDOW: u64 = 64;
    let points = [10u64, 100, 1000, 10_000, 100_000];
    let counted = Arc::new(Counted {
        inner: hspack::io::local(dir),
        bytes: Arc::new(AtomicU64::new(0)),
    });
    let mut w = DatasetWriter::create_in(counted.clone(), schema(), options).unwrap();
    let mut times = Vec::new();
    let mut before = counted.bytes.load(Ordering::Relaxed);
    println!(
        "\n| shards | commit ms, median | commit ms, mean | metadata bytes written a commit (mean) | manifest bytes |\n|---:|---:|---:|---:|---:|"
    );
    for i in 0..max {
        let n = i + 1;
        if points.contains(&(n + WINDOW - 1).max(WINDOW)) || (n == 1 && points[0] < WINDOW) {
            // The window of the next point starts here.
            (times, before) = (Vec::new(), counted.bytes.load(Ordering::Relaxed));
        }
        let ids = (i as u32).to_le_bytes();
        w.append(&key(i), &[("input_ids", &ids[..])]).unwrap();
        let t = Instant::now();
        w.commit().unwrap();
        times.push(t.elapsed().as_secs_f64() * 1e3);
        if points.contains(&n) {
            let manifest = std::fs::metadata(dir.join("manifest.json")).unwrap().len();
            let commits = times.len() as f64;
            let written = (counted.bytes.load(Ordering::Relaxed) - before) as f64;
            let mean = times.iter().sum::<f64>() / commits;
            println!(
                "| {n} | {:.3} | {mean:.3} | {:.0} | {manifest} |",
                percentile(&mut times.clone(), 0.5),
                written / commits
            );
        }
    }
    w.finish().unwrap();
    // Reopening for writing reads every key and asks of every file whether it is a leftover.
    let t = Instant::now();
    let w = DatasetWriter::open(dir, schema(), WriteOptions::default()).unwrap();
    println!(
        "\nwriter reopened at {max} shards ({} files): {:.0} ms",
        std::fs::read_dir(dir).unwrap().count(),
        t.elapsed().as_secs_f64() * 1e3
    );
    drop(w);
}

/// A folder whose publishes are counted: the bytes of every file published but shards (the
/// manifest, segments, key runs, table parts), merged-away ones included.
#[derive(Debug)]
struct Counted {
    inner: Arc<dyn Storage>,
    bytes: Arc<AtomicU64>,
}

fn count(bytes: &AtomicU64, name: &str, n: u64) {
    if !name.starts_with("shard-") {
        bytes.fetch_add(n, Ordering::Relaxed);
    }
}

#[derive(Debug)]
struct CountedFile {
    inner: Box<dyn NewFile>,
    bytes: Arc<AtomicU64>,
    written: u64,
}

impl NewFile for CountedFile {
    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> hspack::Result<()> {
        self.written = self.written.max(offset + bytes.len() as u64);
        self.inner.write_at(offset, bytes)
    }
    fn sync_data(&mut self) -> hspack::Result<()> {
        self.inner.sync_data()
    }
    fn sync_all(&mut self) -> hspack::Result<()> {
        self.inner.sync_all()
    }
    fn publish_new(self: Box<Self>, name: &str, durable: bool) -> hspack::Result<()> {
        count(&self.bytes, name, self.written);
        self.inner.publish_new(name, durable)
    }
    fn abandon(self: Box<Self>) {
        self.inner.abandon()
    }
}

impl Storage for Counted {
    fn root(&self) -> &std::path::Path {
        self.inner.root()
    }
    fn create_root(&self) -> hspack::Result<()> {
        self.inner.create_root()
    }
    fn list(&self) -> hspack::Result<Vec<String>> {
        self.inner.list()
    }
    fn read(&self, name: &str) -> hspack::Result<Option<Vec<u8>>> {
        self.inner.read(name)
    }
    fn open(&self, name: &str) -> hspack::Result<Arc<dyn FileReader>> {
        self.inner.open(name)
    }
    fn create(&self, temp: &str) -> hspack::Result<Box<dyn NewFile>> {
        Ok(Box::new(CountedFile {
            inner: self.inner.create(temp)?,
            bytes: Arc::clone(&self.bytes),
            written: 0,
        }))
    }
    fn replace(
        &self,
        name: &str,
        bytes: &[u8],
        expected: Option<blake3::Hash>,
        durable: bool,
    ) -> hspack::Result<()> {
        count(&self.bytes, name, bytes.len() as u64);
        self.inner.replace(name, bytes, expected, durable)
    }
    fn delete(&self, name: &str) -> hspack::Result<()> {
        self.inner.delete(name)
    }
    fn sync(&self) -> hspack::Result<()> {
        self.inner.sync()
    }
    fn lock(&self) -> hspack::Result<Box<dyn WriterLease>> {
        self.inner.lock()
    }
}

fn main() {
    let max = env("SCALE_MAX", 10_000_000);
    let n = env("READS", 2000);
    let base = std::env::var_os("HSPACK_SCALE_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "load average: {}; {} cpus; reads: {n} random samples, warm page cache",
        load.trim(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "\n| samples | shards | write s | shard MB | open ms (min of 5) | by ordinal: total s, p50 ms, p99 ms | by key: total s, p50 ms, p99 ms | reader RSS grown MB |"
    );
    println!("|---:|---:|---:|---:|---:|---|---|---:|");
    for (samples, shards) in [
        (10_000u64, 1_000u64),
        (1_000_000, 1_000),
        (1_000_000, 10_000),
        (10_000_000, 1_000),
    ] {
        if samples > max {
            continue;
        }
        let tmp = tempfile::tempdir_in(&base).unwrap();
        let dir = tmp.path().join("ds");
        let wrote = write(&dir, samples, shards);
        let ds = Dataset::open(&dir).unwrap();
        let shard_mb = ds.manifest().shard_bytes().unwrap() as f64 / 1e6;
        assert_eq!(ds.len(), samples);
        drop(ds);
        let open = (0..5)
            .map(|_| {
                let t = Instant::now();
                let ds = Dataset::open(&dir).unwrap();
                let e = t.elapsed().as_secs_f64() * 1e3;
                assert_eq!(ds.len(), samples);
                e
            })
            .fold(f64::MAX, f64::min);
        let (ot, o50, o99, orss) = reads(&dir, samples, n, false);
        let (kt, k50, k99, krss) = reads(&dir, samples, n, true);
        println!(
            "| {samples} | {shards} | {wrote:.1} | {shard_mb:.0} | {open:.2} | {ot:.2}, {o50:.3}, {o99:.2} | {kt:.2}, {k50:.3}, {k99:.2} | {:.0} |",
            orss.max(krss) as f64 / 1e6
        );
    }
    let tmp = tempfile::tempdir_in(&base).unwrap();
    commits(&tmp.path().join("commits"), env("COMMITS", 10_000));
}
