//! `hspack ls`.

use std::path::PathBuf;
use std::process::ExitCode;

use hspack::verify::count;
use hspack::{Dataset, Sample};

#[derive(clap::Args)]
pub struct Args {
    #[arg(help = super::DATASET)]
    dir: PathBuf,
    /// Print JSON lines.
    #[arg(long)]
    json: bool,
    /// List at most this many samples.
    #[arg(long)]
    limit: Option<u64>,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let ds = match Dataset::open(&a.dir) {
        Ok(ds) => ds,
        Err(e) => return super::open_failed(e, a.json),
    };
    let n = a.limit.map_or(ds.len(), |l| l.min(ds.len()));
    if !a.json {
        println!(
            "{:>8}  {:>7}  {:>7}  {:>12}  {:<18}  key",
            "ordinal", "tokens", "loss", "bytes", "shard"
        );
    }
    let mut exit = 0u8;
    // Shard by shard, so that a damaged shard does not hide the samples of the others.
    for (seq, record) in ds.manifest().shards.iter().enumerate() {
        let ordinals = record.first_ordinal..(record.first_ordinal + record.samples).min(n);
        if ordinals.is_empty() {
            continue;
        }
        // Opened apart, and let go after its samples: a dataset of more shards than a
        // process may map is listed too.
        let shard = match ds.shard_apart(seq) {
            Ok(shard) => shard,
            Err(e) => {
                let missing = ordinals.end - ordinals.start;
                let which = if missing == 1 {
                    format!("ordinal {}", ordinals.start)
                } else {
                    format!("ordinals {} to {}", ordinals.start, ordinals.end - 1)
                };
                // A read that failed says nothing of the bytes: exit 2, as `show` and `verify`.
                let (failed, advice) = match e.is_damage() {
                    true => (
                        super::EXIT_DAMAGED,
                        "run `hspack verify` to check the whole dataset",
                    ),
                    false => (
                        super::EXIT_ERROR,
                        "a read failed, not a check: run `hspack ls` again once the storage reads",
                    ),
                };
                eprintln!(
                    "hspack: {e}\nhspack: {} ({which}) not listed; {advice}",
                    count(missing, "sample")
                );
                exit = exit.max(failed);
                continue;
            }
        };
        for i in ordinals {
            let sample = ds.sample_of(&shard, i - record.first_ordinal);
            print_sample(
                &sample.expect("the manifest's count of the shard's samples"),
                a.json,
            );
        }
    }
    Ok(ExitCode::from(exit))
}

fn print_sample(s: &Sample<'_>, json: bool) {
    let shard = s
        .shard()
        .path()
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    if json {
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
