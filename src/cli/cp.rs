//! `hspack cp` and `hspack sync`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use hspack::transfer::{copy, CopyMode, CopyOptions};
use hspack::verify::count;

use super::progress::bytes_bar;
use super::{human_bytes, rate_text};

#[derive(clap::Args)]
pub struct Args {
    /// The dataset: a folder, a store's dataset STORE/NAME, or a URL (s3://bucket/prefix, gs://,
    /// az://, https://).
    src: PathBuf,
    /// Where the copy goes: a folder, a store's dataset STORE/NAME, or a URL (s3://, gs://,
    /// az://).
    dst: PathBuf,
    /// Prove a shard this run sends by its size, footer, header and index hash only: skip
    /// reading every chunk back from the destination (they were checked as they passed). A
    /// shard found there already is read back all the same: nothing checked its chunks.
    #[arg(long)]
    no_reread: bool,
    /// Shards copied at once.
    #[arg(long, default_value_t = 4)]
    jobs: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args, mode: CopyMode) -> anyhow::Result<ExitCode> {
    let start = Instant::now();
    let src = match hspack::Dataset::open(&a.src) {
        Ok(ds) => ds,
        Err(e) => return super::open_failed(e, a.json),
    };
    let dst = hspack::store::open_location(&a.dst)?;
    let total = src.manifest().shard_bytes().unwrap_or(0);
    let verb = match mode {
        CopyMode::Copy => "cp",
        CopyMode::Sync => "sync",
    };
    let bar = bytes_bar(total, verb, a.json);
    let options = CopyOptions {
        mode,
        reread: !a.no_reread,
        jobs: a.jobs,
    };
    let report = match copy(&src, &dst, &options, &|n| bar.inc(n)) {
        Ok(r) => r,
        Err(e) => {
            bar.finish_and_clear();
            if super::rerun_helps(&e) {
                eprintln!(
                    "hspack: the copy stopped before its manifest, so the destination is not a \
                     copy yet; run the same command again to resume (what was sent and checked \
                     is kept)"
                );
            }
            return Ok(super::read_failed(e.into()));
        }
    };
    bar.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    if a.json {
        let mut v = serde_json::to_value(&report)?;
        v["seconds"] = serde_json::json!(secs);
        v["src"] = serde_json::json!(a.src.display().to_string());
        v["dst"] = serde_json::json!(a.dst.display().to_string());
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ExitCode::SUCCESS);
    }
    for file in &report.shards_replaced {
        println!(
            "NOTE {}/{file}: was at the destination but not right (cut short or another \
             dataset's); sent again",
            a.dst.display()
        );
    }
    println!(
        "{} -> {}: {}, {}: {} sent ({} in {secs:.2} s, {}), {} already there and \
         right; {} checked as they passed{}; manifest {}",
        a.src.display(),
        a.dst.display(),
        count(report.shards, "shard"),
        count(report.samples, "sample"),
        count(report.shards_sent, "shard"),
        human_bytes(report.bytes_sent),
        rate_text(report.bytes_sent, secs),
        count(report.shards_present, "shard"),
        count(report.chunks_checked, "chunk"),
        // Shards found there are read back even without reread.
        match options.reread || report.bytes_reread > 0 {
            true => format!(
                ", {} read back and hashed",
                human_bytes(report.bytes_reread)
            ),
            false => String::new(),
        },
        match report.manifest_published {
            true => "published last",
            false => "was there already",
        },
    );
    println!("digest {}", report.digest);
    Ok(ExitCode::SUCCESS)
}
