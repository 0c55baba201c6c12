//! `hspack verify`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use hspack::verify::{count, verify, VerifyOptions};

use super::progress::bytes_bar;
use super::{rate_text, EXIT_DAMAGED, EXIT_ERROR};

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
            "not_read": report.problems.iter().filter(|p| !p.is_damage()).map(|p| p.to_string()).collect::<Vec<_>>(),
            "leftovers": paths(&report.leftovers), "unknown_files": paths(&report.unknown_files),
            "notes": report.notes(),
            "digest": report.proven_digest(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        for line in problem_lines(&report.problems) {
            println!("{line}");
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
                "full check of {counts}, {}, {:.2} GB hashed in {secs:.2} s ({})",
                count(report.chunks, "chunk"),
                report.bytes_hashed as f64 / 1e9,
                rate_text(report.bytes_hashed, secs),
            )
        };
        let not_read = report.problems.iter().filter(|p| !p.is_damage()).count();
        let verdict = match (report.problems.len(), not_read) {
            (0, _) => "OK".to_string(),
            (n, 0) => count(n as u64, "problem"),
            (n, m) => format!(
                "{}, {m} of them reads that failed (not damage: verify again once the \
                 storage reads)",
                count(n as u64, "problem")
            ),
        };
        println!("{}: {did}: {verdict}", a.dir.display());
    }
    Ok(ExitCode::from(exit_code(&report.problems)))
}

/// A line for each problem: `DAMAGED` for damage, `NOT READ` for a read that failed (a
/// request refused or timed out, a short read), which says nothing of the bytes: `hspack
/// repair` mends only the first.
pub(super) fn problem_lines(problems: &[hspack::Error]) -> Vec<String> {
    let line = |p: &hspack::Error| match p.is_damage() {
        true => format!("DAMAGED {p}"),
        false => format!("NOT READ {p}"),
    };
    problems.iter().map(line).collect()
}

/// 0 when verify found no problem, [`EXIT_DAMAGED`] when it found damage, [`EXIT_ERROR`]
/// when the only problems were reads that failed (it could not check those bytes).
pub(super) fn exit_code(problems: &[hspack::Error]) -> u8 {
    match (problems.is_empty(), problems.iter().any(|p| p.is_damage())) {
        (true, _) => 0,
        (false, true) => EXIT_DAMAGED,
        (false, false) => EXIT_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed_read() -> hspack::Error {
        hspack::Error::Io {
            path: "s3://b/ds/shard-000001.hsp".into(),
            op: "read",
            source: std::io::Error::new(std::io::ErrorKind::PermissionDenied, "403 Forbidden"),
        }
    }

    fn missing() -> hspack::Error {
        hspack::Error::Io {
            path: "ds/shard-000002.hsp".into(),
            op: "open",
            source: std::io::ErrorKind::NotFound.into(),
        }
    }

    #[test]
    fn a_read_that_failed_is_not_called_damage() {
        let lines = problem_lines(&[failed_read(), missing()]);
        assert!(lines[0].starts_with("NOT READ ") && lines[0].contains("shard-000001"));
        assert!(lines[1].starts_with("DAMAGED ") && lines[1].contains("shard-000002"));
        assert_eq!(exit_code(&[]), 0);
        assert_eq!(exit_code(&[failed_read()]), EXIT_ERROR);
        assert_eq!(exit_code(&[failed_read(), missing()]), EXIT_DAMAGED);
    }
}
