//! `hspack ls`.

use std::path::PathBuf;
use std::process::ExitCode;

use hspack::Dataset;

#[derive(clap::Args)]
pub struct Args {
    /// Dataset folder.
    dir: PathBuf,
    /// Print JSON lines.
    #[arg(long)]
    json: bool,
    /// List at most this many samples.
    #[arg(long)]
    limit: Option<u64>,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let ds = Dataset::open(&a.dir)?;
    let n = a.limit.map_or(ds.len(), |l| l.min(ds.len()));
    if !a.json {
        println!(
            "{:>8}  {:>7}  {:>7}  {:>12}  {:<18}  key",
            "ordinal", "tokens", "loss", "bytes", "shard"
        );
    }
    for i in 0..n {
        let s = ds.sample(i)?;
        let shard = s
            .shard()
            .path()
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        if a.json {
            let v = serde_json::json!({
                "ordinal": s.ordinal(), "key": s.key(), "tokens": s.rows(),
                "loss_tokens": s.loss_rows(), "bytes": s.raw_bytes(), "shard": shard,
            });
            println!("{v}");
        } else {
            let loss = s.loss_rows().map_or("-".to_string(), |l| l.to_string());
            println!(
                "{:>8}  {:>7}  {:>7}  {:>12}  {:<18}  {}",
                s.ordinal(),
                s.rows(),
                loss,
                s.raw_bytes(),
                shard,
                s.key()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
