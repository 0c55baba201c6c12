//! `hspack repair`.

use std::path::PathBuf;
use std::process::ExitCode;

use hspack::transfer::repair::{refuse_same_copy, repair, restore_listed};
use hspack::verify::count;

use super::EXIT_DAMAGED;

#[derive(clap::Args)]
pub struct Args {
    /// The damaged copy: a folder, STORE/NAME, or a URL.
    damaged: PathBuf,
    /// An intact copy of the same dataset (same digest): a folder, STORE/NAME, or a URL.
    #[arg(long)]
    from: PathBuf,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    refuse_same_copy(&a.damaged, &a.from)?;
    let good = hspack::Dataset::open(&a.from)?;
    let mut restored = Vec::new();
    let damaged = match hspack::Dataset::open(&a.damaged) {
        Ok(ds) => ds,
        // Its manifest is intact and a segment it lists is not, or a store lost a blob of
        // either: restored first, from the copy.
        Err(e @ (hspack::Error::Format { .. } | hspack::Error::StoreDamage { .. }))
            if !super::is_manifest_damage(&e) =>
        {
            let storage = hspack::store::open_location(&a.damaged)?;
            match restore_listed(&storage, &good) {
                Ok(files) if !files.is_empty() => restored = files,
                // Nothing to restore: the damage is not in what the copy can give.
                Ok(_) => return super::open_failed(e, a.json),
                Err(why) => {
                    return Err(anyhow::Error::new(why).context(format!(
                        "{} does not open ({e}); restoring its parts from {} failed",
                        a.damaged.display(),
                        a.from.display()
                    )))
                }
            }
            hspack::Dataset::open(&a.damaged)?
        }
        Err(e) => return super::open_failed(e, a.json),
    };
    let mut report = repair(&damaged, &good)?;
    if !restored.is_empty() {
        report.problems_found.insert(
            0,
            format!(
                "{} did not open: its {} restored",
                a.damaged.display(),
                restored.join(", ")
            ),
        );
        restored.extend(std::mem::take(&mut report.files_replaced));
        report.files_replaced = restored;
    }
    let ok = report.problems_left.is_empty();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for p in &report.problems_found {
            println!("FOUND {p}");
        }
        for f in &report.shards_replaced {
            println!(
                "REPLACED {}/{f} from {}",
                a.damaged.display(),
                a.from.display()
            );
        }
        for f in &report.files_replaced {
            println!(
                "REPLACED {}/{f} from {}",
                a.damaged.display(),
                a.from.display()
            );
        }
        for p in &report.problems_left {
            println!("DAMAGED {p}");
        }
        let verdict = match (report.problems_found.len(), ok) {
            (0, _) => "nothing to repair: OK".to_string(),
            (_, true) => format!(
                "{} repaired ({} replaced); verified: OK",
                count(report.problems_found.len() as u64, "problem"),
                count(report.shards_replaced.len() as u64, "shard"),
            ),
            (_, false) => format!(
                "{} left after the repair",
                count(report.problems_left.len() as u64, "problem")
            ),
        };
        println!("{}: {verdict}", a.damaged.display());
        if let Some(digest) = &report.digest {
            println!("digest {digest}");
        }
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_DAMAGED)
    })
}
