//! `hspack digest`.

use std::path::PathBuf;
use std::process::ExitCode;

use hspack::verify::{count, verify, VerifyOptions};

use super::EXIT_DAMAGED;

#[derive(clap::Args)]
pub struct Args {
    /// The datasets: folders, URLs (s3://bucket/prefix, gs://, az://, https://) or STORE/NAME.
    #[arg(required = true)]
    dirs: Vec<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    // Every dataset is done, whatever the others are; the exit code is the worst met: an
    // error (2) over damage (1) over none.
    let mut worst = 0u8;
    for dir in a.dirs {
        let report = match verify(&dir, VerifyOptions::default(), &|_| {}) {
            Ok(report) => report,
            Err(e) => {
                worst = match super::open_failed(e, false) {
                    Ok(_) => worst.max(EXIT_DAMAGED),
                    Err(e) => {
                        eprintln!("hspack: error: {}", super::error_text(&e));
                        worst.max(super::EXIT_ERROR)
                    }
                };
                continue;
            }
        };
        for n in report.notes() {
            eprintln!("NOTE {}: {n}", dir.display());
        }
        if report.is_ok() {
            println!("{}  {}", report.digest, dir.display());
        } else {
            for p in &report.problems {
                eprintln!("DAMAGED {p}");
            }
            eprintln!(
                "{}: damaged, {}, no digest",
                dir.display(),
                count(report.problems.len() as u64, "problem")
            );
            worst = worst.max(EXIT_DAMAGED);
        }
    }
    Ok(ExitCode::from(worst))
}
