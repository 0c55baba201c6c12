//! `hspack merge`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use hspack::transfer::merge;
use hspack::verify::count;
use hspack::{Codec, WriteOptions};

use super::human_bytes;

#[derive(clap::Args)]
pub struct Args {
    /// The datasets to merge (two or more), in order, then the destination: a new folder or
    /// URL, or one an interrupted merge of the same datasets left (the merge resumes).
    #[arg(num_args = 1.., required = true, value_name = "PATH")]
    paths: Vec<PathBuf>,
    /// Chunk codec of the destination: none, zstd, zstd-bytegroup.
    #[arg(long, default_value = "none")]
    codec: String,
    /// log2 of the payload alignment of uncompressed chunks in the destination (6 to 20): by
    /// default a store's own (64 bytes) for a store's dataset, else the first dataset's (a
    /// merge of datasets packed at 64 bytes was aligned at 4 KiB, many times their size for
    /// small samples).
    #[arg(long, value_name = "N")]
    align_log2: Option<u8>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let start = Instant::now();
    if a.paths.len() < 3 {
        anyhow::bail!(
            "give two or more datasets to merge, then the destination: `hspack merge DS1 DS2 \
             [DS3 ...] DST` ({} given)",
            a.paths.len()
        );
    }
    let (dst, sources) = a.paths.split_last().expect("three paths at least");
    let Some(codec) = Codec::from_name(&a.codec) else {
        anyhow::bail!("--codec {:?}: choose none, zstd or zstd-bytegroup", a.codec);
    };
    let mut opened = Vec::new();
    for path in sources {
        match hspack::Dataset::open(path) {
            Ok(ds) => opened.push(ds),
            Err(e) => return super::open_failed(e, a.json),
        }
    }
    let storage = hspack::store::open_location(dst)?;
    // Given, else where the destination has its own (a store's 64 bytes), else the first
    // source's.
    let align_log2 = a
        .align_log2
        .or(storage.write_defaults().align_log2)
        .or_else(|| {
            let first = opened.first()?;
            (!first.manifest().shards.is_empty())
                .then(|| first.shard_apart(0).ok().map(|s| s.header().align_log2))
                .flatten()
        });
    let options = WriteOptions {
        codec,
        align_log2,
        ..WriteOptions::default()
    };
    let report = match merge(&opened, storage, options, &|_| {}) {
        Ok(r) => r,
        Err(e) => {
            // A refusal comes before anything is written: there is nothing to resume.
            if super::rerun_helps(&e) {
                eprintln!(
                    "hspack: {} holds what was committed so far; run the same command again \
                     to resume",
                    dst.display()
                );
            }
            return Ok(super::read_failed(e.into()));
        }
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(ExitCode::SUCCESS);
    }
    for (path, samples) in &report.sources {
        println!("  {path}: {}", count(*samples, "sample"));
    }
    println!(
        "{}: {} in {} ({}), {} copied in {:.2} s, every chunk checked as it was read; \
         verified: OK",
        dst.display(),
        count(report.samples, "sample"),
        count(report.shards, "shard"),
        human_bytes(report.bytes),
        count(report.samples_copied, "sample"),
        start.elapsed().as_secs_f64()
    );
    println!("digest {}", report.digest);
    Ok(ExitCode::SUCCESS)
}
