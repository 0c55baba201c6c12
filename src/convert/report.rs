//! What a conversion did: progress events, the report returned at the end, and the list of
//! bad files (`convert-report.jsonl`, with `--skip-bad`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::write::WriteStats;

use super::job::RunError;

/// Default name of the bad-file report, in the destination folder.
pub const REPORT_FILE: &str = "convert-report.jsonl";

/// Progress events, sent from the calling thread.
#[derive(Debug, Clone, Copy)]
pub enum Progress {
    /// The work ahead: source files and their bytes.
    Start {
        /// Units to convert.
        units: u64,
        /// Their bytes.
        bytes: u64,
    },
    /// One more unit done (converted, present or bad), of `bytes` source bytes.
    Advance {
        /// Source bytes of the unit.
        bytes: u64,
    },
}

/// A path as JSON writes it: as text, a name that is not UTF-8 with U+FFFD in its place (not
/// an error, which left a line of the bad-file list empty).
pub(crate) fn lossy_path<S: serde::Serializer>(path: &Path, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&path.to_string_lossy())
}

/// A source file that could not be converted.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BadFile {
    /// The file at fault: the one whose content is bad, or that is missing from its group
    /// (else the first of the group).
    #[serde(serialize_with = "lossy_path")]
    pub file: PathBuf,
    /// Why.
    pub error: String,
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct Report {
    /// Units (files, or groups of files) found.
    pub units: u64,
    /// Units converted in this run.
    pub converted: u64,
    /// Units whose samples the dataset already held: skipped, nothing appended.
    pub present: u64,
    /// Samples appended in this run.
    pub samples: u64,
    /// Samples of this run's units skipped because the dataset already held their keys.
    pub samples_present: u64,
    /// Units whose every sample was copied from the store (`capture`): their hidden states
    /// were not read.
    pub reused: u64,
    /// Samples copied from the store as captures it held (`capture`).
    pub samples_reused: u64,
    /// Captures the store recorded whose sample was gone or changed: converted instead.
    pub captures_stale: u64,
    /// Source bytes of the converted units.
    pub source_bytes: u64,
    /// Files skipped as bad (only with `skip_bad`): a run that skipped any did not convert
    /// everything.
    pub bad: Vec<BadFile>,
    /// Where bad files are listed, when `skip_bad`.
    pub report_path: Option<PathBuf>,
    /// Files the layout did not take.
    pub ignored: u64,
    /// Dump files reached again under another name (a hard link, a link to a file), each
    /// with the name it was converted under ([`Plan::aliases`](super::units::Plan::aliases)).
    pub aliases: Vec<(PathBuf, PathBuf)>,
    /// Source files deleted.
    pub deleted: u64,
    /// Units not deleted with `delete_source` although the dataset holds their samples: the
    /// samples it holds (copied from the store, or converted earlier) hold other hidden
    /// states than these files, the files could not be read again, or they were written
    /// again under their names after the run read them.
    pub kept: u64,
    /// The dataset after the run.
    pub stats: WriteStats,
    /// Wall time.
    pub elapsed: Duration,
}

impl Report {
    /// An empty report of a run listing bad files in `report_path`.
    pub(super) fn new(report_path: Option<PathBuf>, ignored: u64) -> Report {
        Report {
            units: 0,
            converted: 0,
            present: 0,
            samples: 0,
            samples_present: 0,
            reused: 0,
            samples_reused: 0,
            captures_stale: 0,
            source_bytes: 0,
            bad: Vec::new(),
            report_path,
            ignored,
            aliases: Vec::new(),
            deleted: 0,
            kept: 0,
            stats: WriteStats {
                samples: 0,
                shards: 0,
                bytes: 0,
                raw_bytes: 0,
            },
            elapsed: Duration::ZERO,
        }
    }
}

/// The bad-file report being written: one JSON line per bad file, flushed as it is found.
pub(super) struct BadLog {
    path: PathBuf,
    file: std::fs::File,
}

impl BadLog {
    /// Creates (or empties) the report at `path`, and its folder.
    pub(super) fn create(path: &Path) -> Result<BadLog, RunError> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|source| RunError::Io {
                path: parent.to_path_buf(),
                op: "create",
                source,
            })?;
        }
        let file = std::fs::File::create(path).map_err(|source| RunError::Io {
            path: path.to_path_buf(),
            op: "create",
            source,
        })?;
        Ok(BadLog {
            path: path.to_path_buf(),
            file,
        })
    }

    /// Appends `entry` and flushes it.
    pub(super) fn write(&mut self, entry: &BadFile) -> Result<(), RunError> {
        let line = serde_json::to_string(entry).unwrap_or_default();
        writeln!(self.file, "{line}")
            .and_then(|_| self.file.flush())
            .map_err(|source| RunError::Io {
                path: self.path.clone(),
                op: "write",
                source,
            })
    }
}
