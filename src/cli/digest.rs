//! `hspack digest`.

use std::path::PathBuf;
use std::process::ExitCode;

use hspack::verify::{count, verify, VerifyOptions};

use super::EXIT_DAMAGED;

#[derive(clap::Args)]
pub struct Args {
    /// Dataset folders.
    #[arg(required = true)]
    dirs: Vec<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let mut code = ExitCode::SUCCESS;
    for dir in a.dirs {
        let report = match verify(&dir, VerifyOptions::default(), &|_| {}) {
            Ok(report) => report,
            Err(e) => {
                code = super::open_failed(e, false)?;
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
            code = ExitCode::from(EXIT_DAMAGED);
        }
    }
    Ok(code)
}
