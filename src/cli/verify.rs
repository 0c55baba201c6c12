//! `hspack verify`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use hspack::verify::{verify, VerifyOptions};

use super::progress::bytes_bar;
use super::{gbps, EXIT_DAMAGED};

#[derive(clap::Args)]
pub struct Args {
    /// Dataset folder.
    dir: PathBuf,
    /// Check footers, headers and indexes only, not the payload bytes.
    #[arg(long)]
    quick: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let start = Instant::now();
    let total = hspack::Dataset::open(&a.dir)?
        .manifest()
        .shards
        .iter()
        .map(|s| s.bytes)
        .sum();
    let bar = bytes_bar(total, "verify", a.json || a.quick);
    let report = verify(&a.dir, VerifyOptions { quick: a.quick }, &|n| bar.inc(n))?;
    bar.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    if a.json {
        let v = serde_json::json!({
            "ok": report.is_ok(), "quick": a.quick, "shards": report.shards, "samples": report.samples,
            "chunks": report.chunks, "bytes_hashed": report.bytes_hashed, "seconds": secs,
            "problems": report.problems.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
            "digest": report.is_ok().then_some(&report.digest),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        for p in &report.problems {
            println!("DAMAGED {p}");
        }
        let what = if a.quick { "quick check" } else { "full check" };
        println!(
            "{}: {what} of {} shards, {} samples, {} chunks, {:.2} GB hashed in {secs:.2} s ({:.2} GB/s): {}",
            a.dir.display(),
            report.shards,
            report.samples,
            report.chunks,
            report.bytes_hashed as f64 / 1e9,
            gbps(report.bytes_hashed, secs),
            if report.is_ok() { "OK".to_string() } else { format!("{} problems", report.problems.len()) }
        );
    }
    Ok(if report.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_DAMAGED)
    })
}
