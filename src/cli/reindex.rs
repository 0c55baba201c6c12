//! `hspack reindex`.

use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    #[arg(help = super::DATASET)]
    dir: PathBuf,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let version = || hspack::Dataset::open(&a.dir).map(|d| d.manifest().version);
    let before = version()?;
    let rewritten = hspack::write::reindex(&a.dir)?;
    if let Ok(after) = version().map_err(|e| eprintln!("hspack: cannot read it back: {e}")) {
        if after != before {
            println!(
                "{}: made format version {after} (from {before}) to rewrite its table: its \
                 digest is new, so copies of the version-{before} dataset are not copies of it \
                 for `hspack repair`; `hspack cp` it to them again",
                a.dir.display()
            );
        }
    }
    match rewritten.is_empty() {
        true => println!(
            "{}: every key run and samples table part is intact; nothing rewritten",
            a.dir.display()
        ),
        false => println!(
            "{}: rewritten from the shards: {}",
            a.dir.display(),
            rewritten.join(", ")
        ),
    }
    Ok(ExitCode::SUCCESS)
}
