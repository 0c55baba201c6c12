//! Decoding a zstd-bytegroup dataset against the `zstd` command line tool on the same frames.
//!
//! Writes activation-like bf16 samples (hidden 7168, 512 to 2048 rows each) into a dataset
//! with codec zstd-bytegroup (level 3, 2 MiB chunks), then copies every chunk's stored frame
//! into one file of concatenated frames. Interleaved, `ROUNDS` times (default 5):
//! - hspack: every sample's field read whole (`read_field`: the chunks of a sample decoded on
//!   the thread pool, straight into the output, byte groups undone), chunks not hashed
//!   (`CheckPolicy::Never`: decoding alone) and hashed (`Always`);
//! - `zstd -d -c FRAMES > /dev/null`: the same frames, one thread (zstd decompresses on one).
//!
//! Both read from the page cache (a warm-up pass first). Prints the load average, min and
//! median GB/s of decoded bytes, and the ratio of the medians. Then the latency of a random
//! 16-row read (what a sampler of token windows asks) against the chunk size, with and
//! without compression: a compressed chunk is decoded whole to read any row of it.
//!
//! `cargo bench --bench decode_vs_zstd` (`HSPACK_BENCH_MB=512 ROUNDS=5 CHUNK_KB=2048` by default; needs
//! `zstd` on the PATH).

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Instant;

use hspack::synth::{activations, channel_scales, Rng};
use hspack::{CheckPolicy, Codec, Dataset, DatasetWriter, Field, ReadOptions, Role, Schema};
use hspack::{DType, WriteOptions};

const HIDDEN: usize = 7168;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// A dataset of `budget` bytes of activation-like samples in `dir`.
fn write(dir: &std::path::Path, budget: usize, codec: Codec, chunk_bytes: u64) -> usize {
    let schema = Schema::new(vec![Field::new(
        "hidden",
        DType::BF16,
        &[HIDDEN as u64],
        Role::Other,
    )]);
    let options = WriteOptions {
        codec,
        chunk_bytes: Some(chunk_bytes),
        durable: false,
        ..WriteOptions::default()
    };
    let mut w = DatasetWriter::create(dir, schema, options).unwrap();
    let mut rng = Rng::new(7);
    let scales = channel_scales(&mut rng, HIDDEN);
    let mut raw = 0usize;
    while raw < budget {
        let rows = 512 + rng.range(0, 1536) as usize;
        let bytes = activations(&mut rng, rows, &scales);
        raw += bytes.len();
        w.append(&format!("s{raw}"), &[("hidden", &bytes[..])])
            .unwrap();
    }
    w.finish().unwrap();
    raw
}

/// Median and 99th percentile microseconds of random 16-row reads of the dataset in `dir`,
/// and its compression ratio (raw bytes / shard bytes).
fn random_reads(dir: &std::path::Path) -> (f64, f64, f64) {
    let ds = Dataset::open(dir).unwrap();
    let m = ds.manifest();
    let ratio = m.raw_bytes().unwrap() as f64 / m.shard_bytes().unwrap() as f64;
    let mut rng = Rng::new(3);
    let mut us: Vec<f64> = (0..400)
        .map(|_| {
            let s = ds.sample(rng.range(0, ds.len() - 1)).unwrap();
            let start = rng.range(0, s.rows() - 16);
            let t = Instant::now();
            let got = s.read_field(0, Some(start..start + 16)).unwrap();
            // The rows copied out, as a trainer's batch copy would: a view of a mapped chunk
            // is touched here, not only located.
            let copied = got.bytes().to_vec();
            let us = t.elapsed().as_secs_f64() * 1e6;
            assert_eq!(copied.len(), 16 * HIDDEN * 2);
            us
        })
        .collect();
    us.sort_by(f64::total_cmp);
    (us[us.len() / 2], us[us.len() * 99 / 100], ratio)
}

fn main() {
    let budget = env("HSPACK_BENCH_MB", 512) << 20;
    let rounds = env("ROUNDS", 5);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ds");
    let chunk = (env("CHUNK_KB", 2048) as u64) << 10;
    let raw = write(&dir, budget, Codec::ZstdByteGroup, chunk);

    // The stored frames, concatenated, for the command line tool.
    let ds = Dataset::open(&dir).unwrap();
    let frames = tmp.path().join("frames.zst");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&frames).unwrap());
    let (mut stored, mut chunks) = (0u64, 0u64);
    for seq in 0..ds.manifest().shards.len() {
        let shard = ds.shard(seq).unwrap();
        for c in 0..shard.index().chunk_count() {
            let (_, bytes) = shard.chunk(c, ds.schema(), CheckPolicy::Never).unwrap();
            out.write_all(&bytes).unwrap();
            stored += bytes.len() as u64;
            chunks += 1;
        }
    }
    out.flush().unwrap();
    drop(out);

    let read_all = |check: CheckPolicy| {
        let ds = Dataset::open_with(
            &dir,
            ReadOptions {
                check,
                ..ReadOptions::default()
            },
        )
        .unwrap();
        let start = Instant::now();
        let mut n = 0usize;
        for i in 0..ds.len() {
            n += ds
                .sample(i)
                .unwrap()
                .read_field(0, None)
                .unwrap()
                .bytes()
                .len();
        }
        assert_eq!(n, raw);
        raw as f64 / start.elapsed().as_secs_f64() / 1e9
    };
    let cli = || {
        let start = Instant::now();
        let status = Command::new("zstd")
            .args(["-d", "-c", "-q"])
            .arg(&frames)
            .stdout(Stdio::null())
            .status()
            .expect("zstd on the PATH (apt-get install zstd)");
        assert!(status.success());
        raw as f64 / start.elapsed().as_secs_f64() / 1e9
    };
    // Warm-up: the page cache holds both files.
    read_all(CheckPolicy::Never);
    cli();
    let before = load_average();
    let mut results: Vec<(&str, Vec<f64>)> = vec![
        ("hspack read_field, chunks not hashed", vec![]),
        ("hspack read_field, every chunk hashed", vec![]),
        ("zstd -d -c FRAMES > /dev/null", vec![]),
    ];
    for _ in 0..rounds {
        results[0].1.push(read_all(CheckPolicy::Never));
        results[1].1.push(read_all(CheckPolicy::Always));
        results[2].1.push(cli());
    }
    println!(
        "zstd-bytegroup level 3, {} KiB chunks: {:.0} MiB decoded from {:.0} MiB in {chunks} frames ({:.2}x); {rounds} rounds, interleaved; {} CPUs; load average before {before}, after {}",
        chunk >> 10,
        raw as f64 / (1 << 20) as f64,
        stored as f64 / (1 << 20) as f64,
        raw as f64 / stored as f64,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_average()
    );
    println!();
    println!("| decoder | min GB/s | median GB/s | / zstd CLI (medians) |");
    println!("|---|---:|---:|---:|");
    let peer = median(&results[2].1);
    for (name, v) in &results {
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        println!(
            "| {name} | {min:.2} | {:.2} | {:.2}x |",
            median(v),
            median(v) / peer
        );
    }

    println!();
    println!("Random 16-row reads copied out (400 after 400 of warm-up, from the page cache, each chunk hashed on its first read), by chunk size:");
    println!();
    println!("| codec | chunk | raw / stored | p50 µs | p99 µs |");
    println!("|---|---:|---:|---:|---:|");
    for chunk in [256u64 << 10, 1 << 20, 2 << 20, 8 << 20] {
        for codec in [Codec::None, Codec::ZstdByteGroup] {
            let dir = tmp.path().join(format!("lat-{}-{chunk}", codec.name()));
            write(&dir, 64 << 20, codec, chunk);
            random_reads(&dir); // warm: the page cache
            let (p50, p99, ratio) = random_reads(&dir);
            println!(
                "| {} | {} KiB | {ratio:.2}x | {p50:.0} | {p99:.0} |",
                codec.name(),
                chunk >> 10
            );
        }
    }
}
