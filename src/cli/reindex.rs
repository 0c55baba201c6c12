//! `hspack reindex`.

use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// Dataset folder.
    dir: PathBuf,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let stats = hspack::write::reindex(&a.dir)?;
    println!(
        "{}: samples.parquet rewritten from {} shards, {} samples",
        a.dir.display(),
        stats.shards,
        stats.samples
    );
    Ok(ExitCode::SUCCESS)
}
