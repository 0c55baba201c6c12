//! `hspack verify`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use hspack::verify::{count, verify, VerifyOptions};

use super::progress::bytes_bar;
use super::{gbps, EXIT_DAMAGED};

#[derive(clap::Args)]
pub struct Args {
    #[arg(help = super::DATASET)]
    dir: PathBuf,
    /// Check footers, indexes, and shard and chunk headers only, not the payload bytes.
    #[arg(long)]
    quick: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let start = Instant::now();
    let total = match hspack::Dataset::open(&a.dir) {
        Ok(ds) => ds.manifest().shard_bytes().unwrap_or(0),
        Err(e) => return super::open_failed(e, a.json),
    };
    let bar = bytes_bar(total, "verify", a.json || a.quick);
    let report = match verify(&a.dir, VerifyOptions { quick: a.quick }, &|n| bar.inc(n)) {
        Ok(report) => report,
        Err(e) => return super::open_failed(e, a.json),
    };
    bar.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    if a.json {
        let paths = |v: &[std::path::PathBuf]| {
            v.iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
        };
        let v = serde_json::json!({
            "ok": report.is_ok(), "quick": a.quick, "shards": report.shards, "samples": report.samples,
            "chunk_headers": report.chunk_headers, "chunks": report.chunks,
            "bytes_hashed": report.bytes_hashed, "seconds": secs,
            "problems": report.problems.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
            "leftovers": paths(&report.leftovers), "unknown_files": paths(&report.unknown_files),
            "notes": report.notes(),
            "digest": report.proven_digest(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        for p in &report.problems {
            println!("DAMAGED {p}");
        }
        for n in report.notes() {
            println!("NOTE {}: {n}", a.dir.display());
        }
        let counts = format!(
            "{}, {}",
            count(report.shards, "shard"),
            count(report.samples, "sample")
        );
        let did = if a.quick {
            format!(
                "quick check of {counts}, {}",
                count(report.chunk_headers, "chunk header")
            )
        } else {
            format!(
                "full check of {counts}, {}, {:.2} GB hashed in {secs:.2} s ({:.2} GB/s)",
                count(report.chunks, "chunk"),
                report.bytes_hashed as f64 / 1e9,
                gbps(report.bytes_hashed, secs),
            )
        };
        let verdict = match report.problems.len() {
            0 => "OK".to_string(),
            n => count(n as u64, "problem"),
        };
        println!("{}: {did}: {verdict}", a.dir.display());
    }
    Ok(if report.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_DAMAGED)
    })
}
