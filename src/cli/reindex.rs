//! `hspack reindex`.

use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    #[arg(help = super::DATASET)]
    dir: PathBuf,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let rewritten = hspack::write::reindex(&a.dir)?;
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
