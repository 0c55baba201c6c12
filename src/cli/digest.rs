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
            // As `verify` says them: a read that failed is no damage.
            for line in super::verify::problem_lines(&report.problems) {
                eprintln!("{line}");
            }
            let damaged = report.problems.iter().any(|p| p.is_damage());
            eprintln!(
                "{}: {}, {}, no digest",
                dir.display(),
                match damaged {
                    true => "damaged",
                    false => "not read whole (verify again once the storage reads)",
                },
                count(report.problems.len() as u64, "problem")
            );
            worst = worst.max(super::verify::exit_code(&report.problems));
        }
    }
    Ok(ExitCode::from(worst))
}
