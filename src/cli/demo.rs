//! `hspack demo`: a realistic synthetic capture, written, verified and read back.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context};
use hspack::format::manifest::{is_data_file_name, is_temp_file_name, MANIFEST_FILE};
use hspack::io::lock::{COMMIT_LOCK_FILE, LOCK_FILE};
use hspack::synth::{capture_schema, channel_scales, named_capture_sample, Rng};
use hspack::verify::{count, verify, VerifyOptions};
use hspack::{Codec, Dataset, DatasetWriter, WriteOptions};

use super::progress::bytes_bar;
use super::{gbps, human_bytes};

/// Where the demo writes unless `--out` says otherwise (git-ignored in this repository).
const DEFAULT_OUT: &str = "hspack-demo";

/// The model a demo dataset names: what marks a dataset the demo may replace.
const DEMO_MODEL: &str = "synthetic DeepSeek-V3-style";
/// Decoder layers of the demo's model (a DeepSeek-V3 / Kimi-K2.5 shape).
const DEMO_LAYERS: u32 = 61;

#[derive(clap::Args)]
pub struct Args {
    /// Folder to write (replaced if it holds an earlier demo's dataset; any other dataset is
    /// refused); about 812 MB with the
    /// default sizes.
    #[arg(long, default_value = DEFAULT_OUT)]
    out: PathBuf,
    /// Samples to write.
    #[arg(long, default_value_t = 24)]
    samples: u64,
    /// Fewest tokens per sample.
    #[arg(long, default_value_t = 64)]
    min_tokens: u64,
    /// Most tokens per sample.
    #[arg(long, default_value_t = 1024)]
    max_tokens: u64,
    /// Hidden size.
    #[arg(long, default_value_t = 7168)]
    hidden: u64,
    /// Captured layers (layer inputs), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "2,30,58,60")]
    layers: Vec<u32>,
    /// Chunk codec: none, zstd, zstd-bytegroup.
    #[arg(long, default_value = "none")]
    codec: String,
}

/// Only an earlier demo is replaced: a dataset that fails to open, or names another model,
/// may be someone's data.
fn refuse_other_than_a_demo(dir: &Path) -> anyhow::Result<()> {
    let model = Dataset::open(dir)
        .map_err(|e| e.to_string())
        .and_then(|ds| match ds.schema().capture.as_ref() {
            Some(c) if c.model == DEMO_MODEL => Ok(()),
            Some(c) => Err(format!("a dataset of model `{}`", c.model)),
            None => Err("a dataset with no capture metadata".into()),
        });
    if let Err(what) = model {
        bail!(
            "{} holds a dataset the demo did not write ({what}); the demo replaces only its own: \
             choose another --out",
            dir.display()
        );
    }
    Ok(())
}

fn clear_previous(dir: &Path) -> anyhow::Result<()> {
    // A store's dataset (`STORE/NAME`): an earlier demo there is removed from the store.
    if let Some((store, name)) = hspack::store::split_store_path(dir)? {
        let store = hspack::store::Store::open(store)?;
        if store.names()?.contains(&name) {
            refuse_other_than_a_demo(dir)?;
            store.remove(&name)?;
        }
        return Ok(());
    }
    if !dir.exists() {
        return Ok(());
    }
    if !dir.is_dir() {
        bail!(
            "{} is a file: choose another --out (a folder)",
            dir.display()
        );
    }
    if !dir.join("manifest.json").exists() {
        hspack::write::destination::refuse_foreign_folder(&hspack::io::LocalStorage::new(dir))?;
        return Ok(());
    }
    refuse_other_than_a_demo(dir)?;
    // Only the files named exactly as a writer names its own: a file of yours beside them
    // whose name merely resembles one (`samples_stats.parquet`, `shard-1-old.hsp`) stays.
    let ours = |name: &str| {
        name == MANIFEST_FILE
            || is_data_file_name(name)
            || is_temp_file_name(name)
            || name == LOCK_FILE
            || name == COMMIT_LOCK_FILE
    };
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if ours(&entry.file_name().to_string_lossy()) {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

/// The most samples, and tokens a sample, a demo writes.
const DEMO_MAX: u64 = 1 << 20;
/// The widest hidden state a demo writes.
const DEMO_MAX_HIDDEN: u64 = 1 << 16;

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let codec = Codec::from_name(&a.codec).with_context(|| {
        format!(
            "unknown codec {}: use none, zstd or zstd-bytegroup",
            a.codec
        )
    })?;
    if a.min_tokens > a.max_tokens || a.samples == 0 || a.min_tokens == 0 {
        bail!(
            "need --samples >= 1 and 1 <= --min-tokens <= --max-tokens (given {}, {} and {}; \
             --min-tokens is 64 unless given)",
            a.samples,
            a.min_tokens,
            a.max_tokens
        );
    }
    if a.hidden == 0 {
        bail!("--hidden 0: a hidden state of no values; give 1 or more");
    }
    // A demo's sizes: every product below stays far inside 64 bits.
    for (option, value, max) in [
        ("--samples", a.samples, DEMO_MAX),
        ("--max-tokens", a.max_tokens, DEMO_MAX),
        ("--hidden", a.hidden, DEMO_MAX_HIDDEN),
    ] {
        if value > max {
            bail!("{option} {value}: the demo takes at most {max}");
        }
    }
    if let Some(l) = a.layers.iter().find(|&&l| l >= DEMO_LAYERS) {
        bail!(
            "--layers {l}: the demo's model has {DEMO_LAYERS} layers, whose inputs are ids 0 to {}",
            DEMO_LAYERS - 1
        );
    }
    clear_previous(&a.out)?;
    let schema = capture_schema(DEMO_MODEL, DEMO_LAYERS, a.hidden, &a.layers);
    let mut rng = Rng::new(42);
    let scales: Vec<Vec<f32>> = a
        .layers
        .iter()
        .map(|_| channel_scales(&mut rng, a.hidden as usize))
        .collect();
    let lens: Vec<u64> = (0..a.samples)
        .map(|_| rng.range(a.min_tokens, a.max_tokens))
        .collect();
    let per_token = schema.fields.iter().map(|f| f.row_bytes()).sum::<u64>();
    let total: u64 = lens.iter().sum::<u64>() * per_token;
    println!(
        "demo: {} of {}..={} tokens, layers {} of hidden {} (bf16): {} per token",
        count(a.samples, "sample"),
        a.min_tokens,
        a.max_tokens,
        a.layers
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        a.hidden,
        human_bytes(per_token),
    );
    let choose = if a.out == Path::new(DEFAULT_OUT) {
        " (choose another folder with --out)"
    } else {
        ""
    };
    println!(
        "demo: writing {} (codec {}) into {}{choose}",
        human_bytes(total),
        codec.name(),
        shown_path(&a.out),
    );

    // Write. Generation is not timed; appends are.
    let options = WriteOptions {
        codec,
        ..WriteOptions::default()
    };
    // The folder was checked above (an earlier demo's files removed, the user's kept).
    let mut w = DatasetWriter::open_checked_by_caller(&a.out, schema, options)?;
    let bar = bytes_bar(total, "write ", false);
    let mut hashes = Vec::new();
    let mut write_secs = 0.0;
    for (i, &n) in lens.iter().enumerate() {
        let sample = named_capture_sample(&mut rng, n as usize, &a.layers, &scales);
        let mut h = blake3::Hasher::new();
        sample.iter().for_each(|(_, b)| {
            h.update(b);
        });
        hashes.push(h.finalize());
        let fields: Vec<(&str, &[u8])> = sample
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        let t = Instant::now();
        w.append(&format!("demo-{i:05}"), &fields)?;
        write_secs += t.elapsed().as_secs_f64();
        bar.inc(fields.iter().map(|f| f.1.len() as u64).sum());
    }
    let t = Instant::now();
    let stats = w.finish()?;
    write_secs += t.elapsed().as_secs_f64();
    bar.finish_and_clear();
    println!(
        "write : {}, {}, {} on disk ({:.2}x the raw bytes) in {write_secs:.2} s: {:.2} GB/s (fsync'd, atomic commit)",
        count(stats.samples, "sample"),
        count(stats.shards as u64, "shard"),
        human_bytes(stats.bytes),
        stats.bytes as f64 / stats.raw_bytes as f64,
        gbps(stats.raw_bytes, write_secs)
    );

    // Verify every byte.
    let t = Instant::now();
    let report = verify(&a.out, VerifyOptions::default(), &|_| {})?;
    let secs = t.elapsed().as_secs_f64();
    if !report.is_ok() {
        for p in &report.problems {
            println!("DAMAGED {p}");
        }
        bail!("verification failed");
    }
    println!(
        "verify: {}, {} hashed in {secs:.2} s: {:.2} GB/s; digest {}",
        count(report.chunks, "chunk"),
        human_bytes(report.bytes_hashed),
        gbps(report.bytes_hashed, secs),
        report.digest
    );

    // Read everything back and compare with what was written.
    let ds = Dataset::open(&a.out)?;
    let t = Instant::now();
    let mut read = 0u64;
    for (i, expected) in hashes.iter().enumerate() {
        let s = ds.sample(i as u64)?;
        let mut h = blake3::Hasher::new();
        for f in &ds.schema().fields {
            let tensor = s.read(&f.name, None)?;
            read += tensor.bytes().len() as u64;
            h.update(tensor.bytes());
        }
        if h.finalize() != *expected {
            bail!("sample {i} read back differs from what was written");
        }
    }
    let secs = t.elapsed().as_secs_f64();
    println!("read  : every sample read back bit-identical, {} in {secs:.2} s: {:.2} GB/s (chunk hashes checked)", human_bytes(read), gbps(read, secs));

    // Random access: a 16-token window of one layer of a random sample, its bytes copied out
    // as a trainer's batch does (a view alone touches none of them).
    let mut lat = Vec::new();
    let mut out = Vec::new();
    for _ in 0..2000 {
        let i = rng.range(0, ds.len() - 1);
        let t = Instant::now();
        let s = ds.sample(i)?;
        let rows = s.rows();
        let start = rng.range(0, rows.saturating_sub(16));
        let tensor = s.read(
            &ds.schema().fields[2].name,
            Some(start..(start + 16).min(rows)),
        )?;
        out.clear();
        out.extend_from_slice(tensor.bytes());
        std::hint::black_box(&out);
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    lat.sort_by(f64::total_cmp);
    println!(
        "random: 2000 reads of 16 tokens × 1 layer, copied out ({}): p50 {:.1} µs, p99 {:.1} µs",
        human_bytes(out.len() as u64),
        lat[lat.len() / 2],
        lat[lat.len() * 99 / 100]
    );
    let exe = invocation();
    let ds = shell_word(&a.out.display().to_string());
    let remove = match hspack::store::split_store_path(&a.out).ok().flatten() {
        Some((store, name)) => {
            let store = shell_word(&store.display().to_string());
            format!(
                "`{exe} store rm {store} {}`, then `{exe} store gc {store}`",
                shell_word(&name)
            )
        }
        None => format!("`rm -r {ds}`"),
    };
    println!(
        "done  : {} holds the dataset ({} on disk; remove it with {remove})",
        shown_path(&a.out),
        human_bytes(stats.bytes)
    );
    println!("next  : `{exe} info {ds}`, `{exe} ls {ds}`, `{exe} verify {ds}`");
    Ok(ExitCode::SUCCESS)
}

/// `path` as an absolute path where it can be made one, for saying where the demo writes.
fn shown_path(path: &Path) -> String {
    std::path::absolute(path)
        .unwrap_or_else(|_| path.to_path_buf())
        .display()
        .to_string()
}

/// How to run this binary again from the current folder: `hspack` when that name on `PATH`
/// is this binary, else its path (`./target/release/hspack` under `cargo run`), so the
/// commands the demo suggests work as printed.
fn invocation() -> String {
    let Ok(exe) = std::env::current_exe().and_then(std::fs::canonicalize) else {
        return "hspack".to_string();
    };
    let name = exe
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    // The first `hspack` a shell finds on PATH must be this one.
    let on_path = std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(&name))
            .find(|candidate| candidate.is_file())
            .and_then(|found| std::fs::canonicalize(found).ok())
            .is_some_and(|found| found == exe)
    });
    if on_path {
        return shell_word(&name.to_string_lossy());
    }
    let relative = std::env::current_dir()
        .and_then(std::fs::canonicalize)
        .ok()
        .and_then(|cwd| exe.strip_prefix(cwd).ok().map(|r| Path::new(".").join(r)));
    shell_word(&relative.unwrap_or(exe).display().to_string())
}

/// `word` quoted for a POSIX shell where it needs quoting.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./+:=@%,".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}
