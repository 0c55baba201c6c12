//! `hspack store`: a deduplicating store of datasets.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use hspack::store::{gc, usage, Store};
use hspack::transfer::{copy, CopyOptions};
use hspack::verify::count;

use super::human_bytes;
use super::progress::bytes_bar;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Make a new store in a folder or an object-store prefix (s3://bucket/prefix).
    Init {
        /// The store's folder or URL.
        store: PathBuf,
    },
    /// Import a dataset (verified copy; blobs already stored are referenced, not stored again).
    Add {
        /// The store.
        store: PathBuf,
        /// The dataset: a folder or a URL.
        dataset: PathBuf,
        /// Its name in the store (default: the folder's name).
        #[arg(long)]
        name: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List the datasets: name, samples, files, bytes.
    Ls {
        /// The store.
        store: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Logical and physical bytes per dataset and in all, and what each kind of dedup saved.
    Du {
        /// The store.
        store: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove a dataset (its bytes are freed by `store gc`).
    Rm {
        /// The store.
        store: PathBuf,
        /// The dataset's name.
        name: String,
    },
    /// Delete the blobs no dataset references; safe against a crash and against writers.
    Gc {
        /// The store.
        store: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Hash every blob of every pack, check the index against the packs and every dataset's
    /// references; exit 1 when something is damaged or missing.
    Verify {
        /// The store.
        store: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write a stored dataset out as a plain dataset (same digest as the one imported).
    Export {
        /// The stored dataset: STORE/NAME.
        src: PathBuf,
        /// Where it goes: a folder or a URL.
        dst: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

fn open(path: &PathBuf) -> anyhow::Result<Arc<Store>> {
    Ok(Arc::new(Store::open(path)?))
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    match a.command {
        Command::Init { store } => {
            Store::init(&store)?;
            println!(
                "{}: a new store; add datasets with `hspack store add {} DATASET`, or write into {}/NAME",
                store.display(),
                store.display(),
                store.display()
            );
        }
        Command::Add {
            store,
            dataset,
            name,
            json,
        } => {
            let start = Instant::now();
            let st = open(&store)?;
            let name = match name {
                Some(n) => n,
                None => dataset
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .ok_or_else(|| anyhow::anyhow!("give the dataset a name with --name"))?,
            };
            let src = match hspack::Dataset::open(&dataset) {
                Ok(ds) => ds,
                Err(e) => return super::open_failed(e, json),
            };
            let bar = bytes_bar(src.manifest().shard_bytes().unwrap_or(0), "add", json);
            let (report, added) =
                match hspack::transfer::add_to_store(&st, &src, &name, &|n| bar.inc(n)) {
                    Ok(r) => r,
                    Err(e) => {
                        bar.finish_and_clear();
                        if super::rerun_helps(&e) {
                            eprintln!(
                                "hspack: the store has what was committed so far; run the same \
                             command again to resume"
                            );
                        }
                        return Ok(super::read_failed(e.into()));
                    }
                };
            bar.finish_and_clear();
            if json {
                let v = serde_json::json!({"name": name, "copy": report, "added": added});
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!(
                    "{}/{name}: {} ({}), every chunk checked; stored {} new ({} in packs), {} found already stored, in {:.2} s",
                    store.display(),
                    count(report.samples, "sample"),
                    human_bytes(src.manifest().shard_bytes().unwrap_or(0)),
                    human_bytes(added.bytes_new),
                    human_bytes(added.bytes_stored),
                    human_bytes(added.bytes_found),
                    start.elapsed().as_secs_f64()
                );
                println!("digest {}", report.digest);
            }
        }
        Command::Ls { store, json } => {
            let st = open(&store)?;
            let u = usage::usage(&st)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&u.datasets)?);
            } else {
                println!(
                    "{:<32} {:>12} {:>8} {:>12}",
                    "name", "samples", "files", "bytes"
                );
                for d in &u.datasets {
                    println!(
                        "{:<32} {:>12} {:>8} {:>12}",
                        d.name,
                        d.samples,
                        d.files,
                        human_bytes(d.logical_bytes)
                    );
                }
            }
            if say_damaged(&store, &u) {
                return Ok(ExitCode::from(super::EXIT_DAMAGED));
            }
        }
        Command::Du { store, json } => {
            let st = open(&store)?;
            let u = usage::usage(&st)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&u)?);
            } else {
                println!("{:<32} {:>12} {:>14}", "dataset", "logical", "only its own");
                for d in &u.datasets {
                    println!(
                        "{:<32} {:>12} {:>14}",
                        d.name,
                        human_bytes(d.logical_bytes),
                        human_bytes(d.own_bytes)
                    );
                }
                let physical = u.pack_bytes + u.index_bytes;
                println!(
                    "logical {} in {}; physical {} (packs {}, index {}): {:.2}x",
                    human_bytes(u.logical_bytes),
                    count(u.datasets.len() as u64, "dataset"),
                    human_bytes(physical),
                    human_bytes(u.pack_bytes),
                    human_bytes(u.index_bytes),
                    u.logical_bytes as f64 / physical.max(1) as f64
                );
                println!(
                    "saved: whole samples {}, shared row blocks {}, across datasets {}, compressing shard skeletons and small files {}",
                    human_bytes(u.saved_whole_samples),
                    human_bytes(u.saved_shared_rows),
                    human_bytes(u.saved_across_datasets),
                    human_bytes(u.saved_compression.max(0) as u64)
                );
            }
            if say_damaged(&store, &u) {
                return Ok(ExitCode::from(super::EXIT_DAMAGED));
            }
        }
        Command::Rm { store, name } => {
            open(&store)?.remove(&name)?;
            println!(
                "{}/{name}: removed; `hspack store gc {}` frees the bytes no other dataset uses",
                store.display(),
                store.display()
            );
        }
        Command::Gc { store, json } => {
            let start = Instant::now();
            let said = |what: &str| eprintln!("{}: {what}", store.display());
            let r = gc::collect_telling(&open(&store)?, true, &said)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                println!(
                    "{}: {} live, {} removed; packs: {} kept, {} rewritten, {} deleted; freed {}, wrote {}; {} of removed datasets and {} of dead writers deleted; in {:.2} s",
                    store.display(),
                    count(r.blobs_live, "blob"),
                    count(r.blobs_removed, "blob"),
                    r.packs_kept,
                    r.packs_rewritten,
                    r.packs_deleted,
                    human_bytes(r.bytes_freed),
                    human_bytes(r.bytes_written),
                    count(r.capture_files_removed, "capture file"),
                    count(r.staged_files_removed, "staged file"),
                    start.elapsed().as_secs_f64()
                );
            }
        }
        Command::Verify { store, json } => {
            let c = usage::check(&open(&store)?)?;
            let ok = c.problems.is_empty();
            if json {
                let mut v = serde_json::to_value(&c)?;
                v["ok"] = ok.into();
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                for p in &c.problems {
                    println!("DAMAGED {p}");
                }
                println!(
                    "{}: {}, {} ({}) hashed, {} whole, {}: {}",
                    store.display(),
                    count(c.packs, "pack"),
                    count(c.blobs, "blob"),
                    human_bytes(c.bytes),
                    count(c.datasets, "dataset"),
                    count(c.capture_files, "capture file"),
                    if ok { "OK" } else { "DAMAGED" }
                );
            }
            if !ok {
                return Ok(ExitCode::from(super::EXIT_DAMAGED));
            }
        }
        Command::Export { src, dst, json } => {
            let ds = match hspack::Dataset::open(&src) {
                Ok(ds) => ds,
                Err(e) => return super::open_failed(e, json),
            };
            let to = hspack::store::open_location(&dst)?;
            let report = match copy(&ds, &to, &CopyOptions::default(), &|_| {}) {
                Ok(r) => r,
                Err(e) => return Ok(super::read_failed(e.into())),
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                println!(
                    "{}: {} exported, every chunk checked and read back",
                    dst.display(),
                    count(report.samples, "sample")
                );
                println!("digest {}", report.digest);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Names on standard error each dataset whose sizes are partial (a file of it cannot be
/// read), with what to do; true when there is one.
fn say_damaged(store: &Path, u: &usage::StoreUsage) -> bool {
    let damaged: Vec<_> = u.datasets.iter().filter(|d| d.damaged.is_some()).collect();
    for d in &damaged {
        let said = d.damaged.as_deref().unwrap_or_default();
        if said.contains("hspack store rm") {
            // It says what to do already (a dataset's file that does not decode).
            eprintln!("hspack: {}/{}: DAMAGED: {said}", store.display(), d.name);
            continue;
        }
        eprintln!(
            "hspack: {}/{}: DAMAGED, its sizes are partial: {}; `hspack store verify {}` \
             names what is wrong: restore the dataset from a copy, or remove it with \
             `hspack store rm {} {}`",
            store.display(),
            d.name,
            d.damaged.as_deref().unwrap_or_default(),
            store.display(),
            store.display(),
            d.name
        );
    }
    !damaged.is_empty()
}
