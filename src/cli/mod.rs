//! Subcommands, one file each, each with a `run()`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod compare;
mod convert;
mod cp;
mod demo;
mod digest;
mod export;
mod info;
mod ls;
mod merge;
mod progress;
mod reindex;
mod repair;
mod show;
mod store;
mod verify;

/// What a dataset argument may be, as `--help` says it: every command opens it with
/// `hspack::store::open_location`.
const DATASET: &str =
    "The dataset: a folder, a URL (s3://bucket/prefix, gs://, az://, https://) or \
     STORE/NAME, a dataset in a store";

/// Store and move LLM hidden states: checksummed, indexed, zero-copy.
#[derive(Parser)]
#[command(name = "hspack", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write a realistic synthetic capture, verify it and read it back, timing each step.
    Demo(demo::Args),
    /// Summarize a dataset: schema, capture metadata, sizes.
    Info(info::Args),
    /// List samples: ordinal, key, tokens, loss tokens, bytes, shard.
    Ls(ls::Args),
    /// Show one sample's fields, shapes and value statistics.
    Show(show::Args),
    /// Check every byte (or, with --quick, footers and indexes) and name what is damaged.
    Verify(verify::Args),
    /// Verify, then print the dataset digest: one line that two intact copies share.
    Digest(digest::Args),
    /// Compare two datasets holding the same samples value by value, per field and layer:
    /// how far a quantized copy (`convert --quantize fp8`) is from the exact one.
    Compare(compare::Args),
    /// Rewrite key runs and samples table parts from the shards' indexes (when verify finds one missing or damaged).
    Reindex(reindex::Args),
    /// Write one sample's fields to a .safetensors file or .npy files.
    Export(export::Args),
    /// Copy a dataset between folders and object storage (s3://, gs://, az://), proving every
    /// chunk; the manifest goes last, and a rerun resumes.
    Cp(cp::Args),
    /// Like cp, onto an earlier copy of a dataset that grew: sends the new shards only.
    Sync(cp::Args),
    /// Replace what verify finds damaged in a copy from an intact copy (same digest), then
    /// verify again.
    Repair(repair::Args),
    /// Make one dataset of several written apart with one schema: their samples copied in the
    /// order given, every chunk checked, the result verified; a rerun resumes.
    Merge(merge::Args),
    /// A deduplicating store of datasets: init, add, ls, du, rm, gc, verify, export. Its
    /// datasets read and write as STORE/NAME wherever a dataset goes.
    Store(store::Args),
    /// Turn hidden-state dumps (SpecForge, EAGLE, ModelOpt, speculators, ad-hoc) into a dataset.
    Convert(Box<convert::Args>),
}

/// Exit code when a check found damage.
pub const EXIT_DAMAGED: u8 = 1;
/// Exit code for errors: bad arguments, unreadable input.
pub const EXIT_ERROR: u8 = 2;
/// Exit code of `convert --skip-bad` when it skipped a bad file: the dataset lacks its samples.
pub const EXIT_SKIPPED: u8 = 3;

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(a) => demo::run(a),
        Command::Info(a) => info::run(a),
        Command::Ls(a) => ls::run(a),
        Command::Show(a) => show::run(a),
        Command::Verify(a) => verify::run(a),
        Command::Digest(a) => digest::run(a),
        Command::Compare(a) => compare::run(a),
        Command::Export(a) => export::run(a),
        Command::Reindex(a) => reindex::run(a),
        Command::Convert(a) => convert::run(*a),
        Command::Cp(a) => cp::run(a, hspack::transfer::CopyMode::Copy),
        Command::Sync(a) => cp::run(a, hspack::transfer::CopyMode::Sync),
        Command::Repair(a) => repair::run(a),
        Command::Merge(a) => merge::run(a),
        Command::Store(a) => store::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("hspack: error: {}", error_text(&e));
            ExitCode::from(EXIT_ERROR)
        }
    }
}

/// Whether the same command run again can get further: it failed in transit (I/O), not on a
/// refusal, a missing file, a missing permission (credentials) or a place that is not there
/// (a bucket), which say what to do.
pub fn rerun_helps(e: &hspack::Error) -> bool {
    use std::io::ErrorKind;
    match e {
        hspack::Error::Io { source, .. } => !matches!(
            source.kind(),
            ErrorKind::NotFound | ErrorKind::PermissionDenied | ErrorKind::InvalidInput
        ),
        hspack::Error::NotAppended { cause, .. } => rerun_helps(cause),
        _ => false,
    }
}

/// Which sample a command is about: a key (or `'#N'`), or `--ordinal N`. Neither is required
/// on its own, as the usage says (`<DIR> [KEY]`, `--ordinal`); naming none is refused by
/// [`SampleArg::sample`] (clap's own refusal listed `<KEY>` as required).
#[derive(clap::Args)]
pub struct SampleArg {
    /// Sample key, or '#ORDINAL' (quoted: a shell takes # for a comment), e.g. '#0'.
    key: Option<String>,
    /// The sample at this ordinal (0 is the first), whatever the keys are.
    #[arg(long, conflicts_with = "key")]
    ordinal: Option<u64>,
}

impl SampleArg {
    /// The sample named.
    pub fn sample<'d>(&self, ds: &'d hspack::Dataset) -> anyhow::Result<hspack::Sample<'d>> {
        match (&self.key, self.ordinal) {
            (_, Some(ordinal)) => Ok(ds.sample(ordinal)?),
            (Some(key), None) => sample_named(ds, key),
            (None, None) => anyhow::bail!(
                "name the sample: its key, '#N' for the sample at ordinal N (quoted: a shell \
                 takes # for a comment), or --ordinal N; `hspack ls {}` lists them",
                ds.storage().root().display()
            ),
        }
    }
}

/// The sample `key` names on the command line: `#N` the sample at ordinal N, anything else a
/// sample key (one that no sample has and reads as a number says how to ask for an ordinal).
/// `#N` that is also a sample's key names two samples: refused, saying how to name each.
fn sample_named<'d>(ds: &'d hspack::Dataset, key: &str) -> anyhow::Result<hspack::Sample<'d>> {
    if let Some(ordinal) = key.strip_prefix('#').and_then(|n| n.parse::<u64>().ok()) {
        let at = ds.sample(ordinal);
        return match ds.get_by_key(key) {
            Err(hspack::Error::NoSuchKey { .. }) => Ok(at?),
            Err(e) => Err(e.into()),
            Ok(keyed) => match at {
                Err(hspack::Error::NoSuchSample { .. }) => Ok(keyed),
                Err(e) => Err(e.into()),
                Ok(at) if at.ordinal() == keyed.ordinal() => Ok(at),
                Ok(at) => anyhow::bail!(
                    "'{key}' names two samples: the one at ordinal {ordinal} (key `{}`) and the \
                     one keyed `{key}` (ordinal {}); name the one you mean by its ordinal: \
                     --ordinal {ordinal} or --ordinal {}",
                    at.key(),
                    keyed.ordinal(),
                    keyed.ordinal()
                ),
            },
        };
    }
    ds.get_by_key(key).map_err(|e| {
        let numeric = matches!(e, hspack::Error::NoSuchKey { .. }) && key.parse::<u64>().is_ok();
        match numeric {
            true => anyhow::anyhow!(
                "{e}; for the sample at ordinal {key}, write '#{key}' (quoted: a shell takes # \
                 for a comment)"
            ),
            false => e.into(),
        }
    })
}

/// The exit code for an error met reading a dataset that opened: [`EXIT_DAMAGED`] for damage
/// (as `verify` reports it, [`hspack::Error::is_damage`]), else [`EXIT_ERROR`]. Prints the error.
pub fn read_failed(e: anyhow::Error) -> ExitCode {
    eprintln!("hspack: error: {}", error_text(&e));
    let damaged = e.chain().any(|c| {
        c.downcast_ref::<hspack::Error>()
            .is_some_and(hspack::Error::is_damage)
    });
    if damaged {
        eprintln!("hspack: the dataset is damaged: run `hspack verify` on it to list what is");
        ExitCode::from(EXIT_DAMAGED)
    } else {
        ExitCode::from(EXIT_ERROR)
    }
}

/// A dataset whose manifest cannot be opened: a manifest that is there but fails its checks
/// (edited, truncated, corrupted) is damage, exit 1, like any other; a folder or manifest that
/// cannot be read at all is an error, exit 2.
pub fn open_failed(e: hspack::Error, json: bool) -> anyhow::Result<ExitCode> {
    // Not damage: a manifest a newer hspack wrote, say, which this one cannot read.
    if !e.is_damage() || !matches!(e, hspack::Error::Format { .. }) {
        return Err(e.into());
    }
    if json {
        let v = serde_json::json!({"ok": false, "problems": [e.to_string()]});
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else if is_manifest_damage(&e) {
        eprintln!("DAMAGED {e}");
        eprintln!("the manifest is the root of trust: restore it from an intact copy");
    } else {
        eprintln!("DAMAGED {e}");
    }
    Ok(ExitCode::from(EXIT_DAMAGED))
}

/// Whether `e` is damage in the manifest itself (not in a part it lists).
pub fn is_manifest_damage(e: &hspack::Error) -> bool {
    matches!(e, hspack::Error::Format { path, .. }
        if path.file_name().and_then(|n| n.to_str()) == Some(hspack::format::manifest::MANIFEST_FILE))
}

/// The error and its causes, each said once: hspack's errors put their cause in their own
/// message and also return it as `source()`, so a cause whose text is already there is not
/// repeated.
pub fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

/// Human-readable bytes.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// GB/s (10^9 bytes per second).
pub fn gbps(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / secs.max(1e-9) / 1e9
}

/// A rate as people read it: `2.41 GB/s`, and below 1 GB/s in MB/s (`1.95 MB/s`, not
/// `0.00 GB/s`: what a copy over a slow link shows).
pub fn rate_text(bytes: u64, secs: f64) -> String {
    match gbps(bytes, secs) {
        r if r >= 1.0 => format!("{r:.2} GB/s"),
        r => format!("{:.2} MB/s", r * 1e3),
    }
}

/// A shape as people write it: `[905, 7168]`; `scalar` for `[]` (one value per row).
pub fn shape_text(shape: &[u64]) -> String {
    if shape.is_empty() {
        return "scalar".to_string();
    }
    let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
    format!("[{}]", dims.join(", "))
}
