//! The conversion job: plan units, cut them into runs that fill a shard each, let every
//! thread decode its run into its own shard (a [`ShardLane`]), commit the shards in source
//! order, delete sources once their shard is durable and verified, and report.
//!
//! Writes into one file do not get faster with more threads; writes into several files do, so
//! threads write shards, not samples. Ordinals follow the source order whatever the threads.
//! Memory is bounded: a thread holds one decoded unit at a time, and at most `1.5 × jobs`
//! runs are started ahead of the next commit. Resuming is by key: a unit whose key the dataset
//! already holds is skipped, so a rerun after any interruption continues where the last commit
//! left off and never appends a sample twice.

use crate::failpoint::failpoint;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use rayon::prelude::*;

use crate::format::manifest::MANIFEST_FILE;
use crate::read::Dataset;
use crate::write::{DatasetWriter, Lanes, ShardLane, WriteOptions, WriteStats};

use super::keys::{misnamed, KeyLog};
use super::layout::{derive_schema, specs_for, LayoutError, LayoutOptions, Preset};
use super::prepare::{Decoder, Prepared, SplitBy, Trim};
use super::units::{plan, Inputs, Unit};
use super::{ConvertError, Limits};

/// Default name of the bad-file report, in the destination folder.
pub const REPORT_FILE: &str = "convert-report.jsonl";

/// What to convert and how.
#[derive(Debug, Clone)]
pub struct ConvertOptions {
    /// Source folder (walked recursively) or file.
    pub src: PathBuf,
    /// Dataset folder, created or resumed.
    pub dst: PathBuf,
    /// The layout of the source files.
    pub preset: Preset,
    /// Layer ids, points, model, generic fields.
    pub layout: LayoutOptions,
    /// Group files into one sample by a pattern with `{key}` and `{part}`.
    pub group_by: Option<String>,
    /// Split each file into requests.
    pub split_by: Option<SplitBy>,
    /// The file beside each batch holding its split tensor: a name with `{stem}`.
    pub split_file: Option<String>,
    /// Take each file's sample key from this stored value (e.g. `conversation_id`).
    pub key_from: Option<String>,
    /// Drop padding rows.
    pub trim: Option<Trim>,
    /// Delete each source file once its samples are committed and verified.
    pub delete_source: bool,
    /// List bad files in the report and go on, instead of stopping.
    pub skip_bad: bool,
    /// Where bad files are listed (default: `REPORT_FILE` in `dst`).
    pub report_path: Option<PathBuf>,
    /// Decoding threads.
    pub jobs: usize,
    /// Writer options.
    pub write: WriteOptions,
    /// Limits for reading source files.
    pub limits: Limits,
}

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

/// A source file that could not be converted.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BadFile {
    /// The file at fault: the one whose content is bad, or that is missing from its group
    /// (else the first of the group).
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
    /// Source bytes of the converted units.
    pub source_bytes: u64,
    /// Files skipped as bad (only with `skip_bad`): a run that skipped any did not convert
    /// everything.
    pub bad: Vec<BadFile>,
    /// Where bad files are listed, when `skip_bad`.
    pub report_path: Option<PathBuf>,
    /// Files the layout did not take.
    pub ignored: u64,
    /// Source files deleted.
    pub deleted: u64,
    /// The dataset after the run.
    pub stats: WriteStats,
    /// Wall time.
    pub elapsed: Duration,
}

/// Why a run stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// A source file is bad; rerun with `--skip-bad` to list it and go on.
    #[error("{}: {error}; fix or remove the file, or rerun with --skip-bad to list it in a report and go on", file.display())]
    BadFile {
        /// The file.
        file: PathBuf,
        /// Why.
        error: String,
    },
    /// The layout cannot map the source (a flag is missing or wrong).
    #[error("{}: {error}", file.display())]
    Layout {
        /// The first file.
        file: PathBuf,
        /// What to give.
        error: LayoutError,
    },
    /// Reading the source folder failed.
    #[error(transparent)]
    Source(#[from] ConvertError),
    /// The dataset layers failed.
    #[error(transparent)]
    Dataset(#[from] crate::Error),
    /// Two source units give the same key.
    #[error("{} and {} both give sample key `{key}`; keep one of them (or key samples another way)", a.display(), b.display())]
    DuplicateKey {
        /// The key.
        key: String,
        /// One file.
        a: PathBuf,
        /// The other.
        b: PathBuf,
    },
    /// No source file matches the layout.
    #[error("{}: no source files for the {layout} layout ({ignored} other files); check the path and --layout", src.display())]
    NoSources {
        /// Source path.
        src: PathBuf,
        /// Layout name.
        layout: &'static str,
        /// Files ignored.
        ignored: u64,
    },
    /// A committed shard did not verify, so no source was deleted.
    #[error("{0}; no source file was deleted: run `hspack verify` on the dataset")]
    Verify(crate::Error),
    /// The report or a deletion failed.
    #[error("cannot {op} {}: {source}", path.display())]
    Io {
        /// File.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// Cause.
        source: std::io::Error,
    },
    /// Options contradict each other.
    #[error("{0}")]
    BadOptions(String),
    /// A bug: a thread failed while converting these files. Nothing of their run was
    /// committed; a rerun resumes before them.
    #[error("internal error while converting {}: {detail}; please report it with the file", file.display())]
    Internal {
        /// The first file of the run.
        file: PathBuf,
        /// The panic message.
        detail: String,
    },
}

fn is_layout_flag_error(e: &LayoutError) -> bool {
    matches!(
        e,
        LayoutError::Layers { .. } | LayoutError::FinalNormId { .. } | LayoutError::BadOption(_)
    )
}

/// Runs a conversion. `progress` is called on the calling thread.
///
/// A run that fails before committing anything to a folder that held no dataset leaves no
/// dataset behind: the manifest (and key log) it created go, and the folder too when the run
/// created it and nothing else is in it.
pub fn run(o: &ConvertOptions, progress: &mut dyn FnMut(Progress)) -> Result<Report, RunError> {
    let fresh = !o.dst.join(MANIFEST_FILE).exists();
    let folder_existed = o.dst.exists();
    let result = convert(o, progress);
    if result.is_err() && fresh {
        remove_empty_dataset(o, folder_existed);
    }
    result
}

/// Removes the dataset a failed run created in `o.dst` when it holds no shard: the manifest,
/// the key log, an empty bad-file report, and the folder when the run created it and it is
/// then empty. Best effort: the run's own error is what the caller sees.
fn remove_empty_dataset(o: &ConvertOptions, folder_existed: bool) {
    let manifest = o.dst.join(MANIFEST_FILE);
    if manifest.exists() {
        match Dataset::open(&o.dst) {
            Ok(ds) if ds.manifest().shards.is_empty() => {}
            _ => return,
        }
        let _ = std::fs::remove_file(&manifest);
        let _ = std::fs::remove_file(o.dst.join(super::keys::KEYS_FILE));
    }
    let report = o
        .report_path
        .clone()
        .unwrap_or_else(|| o.dst.join(REPORT_FILE));
    if std::fs::metadata(&report).is_ok_and(|m| m.len() == 0) {
        let _ = std::fs::remove_file(&report);
    }
    if !folder_existed {
        // Only when empty: never a file the run did not create.
        let _ = std::fs::remove_dir(&o.dst);
    }
}

fn convert(o: &ConvertOptions, progress: &mut dyn FnMut(Progress)) -> Result<Report, RunError> {
    let started = Instant::now();
    if o.delete_source && !o.write.durable {
        return Err(RunError::BadOptions(
            "--delete-source needs durable commits: sources are deleted only after their shard is fsynced".into(),
        ));
    }
    if o.split_file.is_some() && (o.split_by.is_none() || o.group_by.is_some()) {
        return Err(RunError::BadOptions(
            "a split file beside each batch (--split-by-file) needs --split-by lengths[:TENSOR] \
             or cu_seqlens[:TENSOR], and does not combine with --group-by"
                .into(),
        ));
    }
    if o.split_file
        .as_deref()
        .is_some_and(|p| !p.contains("{stem}") || p.contains('/'))
    {
        return Err(RunError::BadOptions(
            "--split-by-file takes a file name with {stem}, the batch file's name without its \
             extension, e.g. '{stem}.lens.pt'"
                .into(),
        ));
    }
    let plan = plan(
        &o.src,
        o.preset,
        o.group_by.as_deref(),
        o.split_file.as_deref(),
    )?;
    check_duplicates(&plan.units, o.split_by.is_some())?;
    let mut run = Run::new(o, plan.ignored.len() as u64)?;
    if plan.units.is_empty() {
        if o.dst.join(MANIFEST_FILE).exists() {
            run.report.stats = DatasetWriter::open(
                &o.dst,
                Dataset::open(&o.dst)?.schema().clone(),
                o.write.clone(),
            )?
            .stats();
            run.report.elapsed = started.elapsed();
            return Ok(run.report);
        }
        return Err(RunError::NoSources {
            src: o.src.clone(),
            layout: o.preset.name(),
            ignored: plan.ignored.len() as u64,
        });
    }
    run.report.units = plan.units.len() as u64;
    let Some(decoder) = run.decoder(&plan.units)? else {
        run.report.elapsed = started.elapsed();
        return Ok(run.report);
    };
    let mut writer = DatasetWriter::open(&o.dst, decoder.schema.clone(), o.write.clone())?;
    let split = o.split_by.is_some();
    let mut todo = Vec::with_capacity(plan.units.len());
    let mut present = Vec::new();
    for u in plan.units {
        if run.bad_units.contains(&u.key) {
            continue;
        }
        let key = match &run.keys {
            Some(log) => log.key_of(&u.key),
            None => Some(u.key.as_str()),
        };
        if !split && key.is_some_and(|k| writer.contains_key(k)) {
            present.push(u);
        } else {
            todo.push(u);
        }
    }
    run.report.present = present.len() as u64;
    run.verified = writer.stats().shards;
    if o.delete_source && !present.is_empty() {
        // Samples of an interrupted run: verify what is committed, then their sources may go.
        run.verified = 0;
        run.verify_new(writer.stats().shards)?;
        for u in &present {
            run.delete(u)?;
        }
    }
    progress(Progress::Start {
        units: todo.len() as u64,
        bytes: todo.iter().map(|u| u.bytes).sum(),
    });
    run.pipeline(&decoder, &todo, &mut writer, progress)?;
    let stats = writer.finish()?;
    run.report.stats = stats;
    run.report.elapsed = started.elapsed();
    Ok(run.report)
}

fn check_duplicates(units: &[Unit], split: bool) -> Result<(), RunError> {
    if split {
        return Ok(());
    }
    // Units are sorted by key and grouped, so equal keys can only come from one group: a
    // group of unnamed parts holds two files with one key (`a.pt` and `a.pt.gz`).
    for u in units {
        if u.files.len() > 1 && u.files.iter().all(|(p, _)| p.is_empty()) {
            return Err(RunError::DuplicateKey {
                key: u.key.clone(),
                a: u.files[0].1.clone(),
                b: u.files[1].1.clone(),
            });
        }
    }
    Ok(())
}

struct Run<'o> {
    o: &'o ConvertOptions,
    report: Report,
    report_file: Option<std::fs::File>,
    bad_units: std::collections::HashSet<String>,
    verified: u64,
    /// With `key_from`, which unit gave which key.
    keys: Option<KeyLog>,
    /// Keys read per request (`key_from` naming a list of ids), and the file of each.
    request_keys: HashMap<String, PathBuf>,
}

impl<'o> Run<'o> {
    fn new(o: &'o ConvertOptions, ignored: u64) -> Result<Self, RunError> {
        let report_path = o.skip_bad.then(|| {
            o.report_path
                .clone()
                .unwrap_or_else(|| o.dst.join(REPORT_FILE))
        });
        let report_file = match &report_path {
            Some(p) => {
                if let Some(parent) = p.parent() {
                    std::fs::create_dir_all(parent).map_err(|source| RunError::Io {
                        path: parent.to_path_buf(),
                        op: "create",
                        source,
                    })?;
                }
                Some(std::fs::File::create(p).map_err(|source| RunError::Io {
                    path: p.clone(),
                    op: "create",
                    source,
                })?)
            }
            None => None,
        };
        Ok(Run {
            o,
            report: Report {
                units: 0,
                converted: 0,
                present: 0,
                samples: 0,
                samples_present: 0,
                source_bytes: 0,
                bad: Vec::new(),
                report_path,
                ignored,
                deleted: 0,
                stats: WriteStats {
                    samples: 0,
                    shards: 0,
                    bytes: 0,
                    raw_bytes: 0,
                },
                elapsed: Duration::ZERO,
            },
            report_file,
            bad_units: Default::default(),
            request_keys: HashMap::new(),
            verified: 0,
            keys: match &o.key_from {
                Some(_) => Some(KeyLog::open(&o.dst).map_err(|source| RunError::Io {
                    path: o.dst.join(super::keys::KEYS_FILE),
                    op: "read",
                    source,
                })?),
                None => None,
            },
        })
    }

    /// Records a bad unit, or stops the run without `skip_bad`. An error that starts with
    /// one of `files` (as reader errors start with theirs) is that file's; others are `files[0]`'s.
    fn bad<'p>(
        &mut self,
        files: impl IntoIterator<Item = &'p Path>,
        error: String,
    ) -> Result<(), RunError> {
        let mut files = files.into_iter();
        let first = files.next().unwrap_or(Path::new(""));
        let (file, error) = std::iter::once(first)
            .chain(files)
            .find_map(|f| {
                let rest = error.strip_prefix(&format!("{}: ", f.display()))?;
                Some((f, rest.to_string()))
            })
            .unwrap_or((first, error));
        let Some(f) = self.report_file.as_mut() else {
            return Err(RunError::BadFile {
                file: file.to_path_buf(),
                error,
            });
        };
        let entry = BadFile {
            file: file.to_path_buf(),
            error,
        };
        let path = self.report.report_path.clone().unwrap_or_default();
        let line = serde_json::to_string(&entry).unwrap_or_default();
        writeln!(f, "{line}")
            .and_then(|_| f.flush())
            .map_err(|source| RunError::Io {
                path,
                op: "write",
                source,
            })?;
        self.report.bad.push(entry);
        Ok(())
    }

    /// The decoder from the first unit whose tensors fit the layout; `None` when every unit is
    /// bad (with `skip_bad`).
    fn decoder(&mut self, units: &[Unit]) -> Result<Option<Decoder>, RunError> {
        let o = self.o;
        for u in units {
            let first = &u.files[0].1;
            let inputs = match Inputs::open(u, o.limits) {
                Ok(i) => i,
                Err(e) => {
                    self.bad(u.paths(), e.to_string())?;
                    self.bad_units.insert(u.key.clone());
                    continue;
                }
            };
            let tensors = inputs.tensors();
            let derived = specs_for(o.preset, &tensors, &o.layout)
                .and_then(|s| derive_schema(o.preset, &s, &tensors, &o.layout).map(|d| (s, d)));
            match derived {
                Ok((specs, schema)) => {
                    if let Some(e) = o.key_from.as_deref().and_then(|k| misnamed(&inputs, k)) {
                        return Err(RunError::BadOptions(e));
                    }
                    return Ok(Some(Decoder {
                        specs,
                        schema,
                        split_by: o.split_by.clone(),
                        key_from: o.key_from.clone(),
                        trim: o.trim,
                        limits: o.limits,
                        pool: Default::default(),
                    }));
                }
                Err(LayoutError::MissingTensor { tensor, .. })
                    if inputs.unsupported(&tensor).is_some() =>
                {
                    let e = inputs.unsupported(&tensor).map(|e| e.to_string());
                    self.bad(u.paths(), e.unwrap_or_default())?;
                    self.bad_units.insert(u.key.clone());
                }
                Err(e) if is_layout_flag_error(&e) => {
                    return Err(RunError::Layout {
                        file: first.clone(),
                        error: e,
                    })
                }
                Err(e) => {
                    self.bad(u.paths(), e.to_string())?;
                    self.bad_units.insert(u.key.clone());
                }
            }
        }
        Ok(None)
    }

    fn pipeline(
        &mut self,
        decoder: &Decoder,
        todo: &[Unit],
        writer: &mut DatasetWriter,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<(), RunError> {
        let jobs = self.o.jobs.max(1);
        let groups = shard_groups(todo, &self.o.write, jobs);
        // Groups started ahead of the next commit: enough to keep every thread busy while one
        // finishes late, few enough that uncommitted shards stay a bounded share of the disk.
        let window = jobs + jobs.div_ceil(2);
        // Units whose samples the dataset holds were left out of `todo` by key, except split
        // units (keys known only once decoded) and keys taken from the files: with those, a
        // sample already committed is skipped as it comes, even when the key log is gone.
        let present = if self.o.split_by.is_some() || self.o.key_from.is_some() {
            writer.keys().map(str::to_string).collect()
        } else {
            HashSet::new()
        };
        let lane = LaneJob {
            decoder,
            todo,
            lanes: writer.lanes(),
            write: &self.o.write,
            stop_at_bad: !self.o.skip_bad,
            present: &present,
            stop: AtomicBool::new(false),
        };
        let (job_tx, job_rx) = mpsc::channel::<usize>();
        let job_rx = Mutex::new(job_rx);
        std::thread::scope(|scope| {
            // Owned by this closure: however it returns, the queue closes and the threads end.
            let job_tx = job_tx;
            let (msg_tx, msg_rx) = mpsc::channel::<Message>();
            for _ in 0..jobs {
                let msg_tx = msg_tx.clone();
                let (job_rx, lane, groups) = (&job_rx, &lane, &groups);
                scope.spawn(move || loop {
                    let next = job_rx.lock().map(|rx| rx.recv());
                    let Ok(Ok(g)) = next else { break };
                    let first = &todo[groups[g].start].files[0].1;
                    let done = caught(first, || lane.run(groups[g].clone(), &msg_tx));
                    if msg_tx.send(Message::Group(g, done)).is_err() {
                        break;
                    }
                });
            }
            drop(msg_tx);
            let stopping = |e: RunError| {
                lane.stop.store(true, Ordering::Relaxed);
                Err(e)
            };
            let mut fed = 0;
            let mut ready = BTreeMap::new();
            for next in 0..groups.len() {
                while fed < groups.len() && fed < next + window {
                    let _ = job_tx.send(fed);
                    fed += 1;
                }
                let done = loop {
                    if let Some(done) = ready.remove(&next) {
                        break done;
                    }
                    match msg_rx.recv() {
                        Ok(Message::Unit { bytes }) => progress(Progress::Advance { bytes }),
                        Ok(Message::Group(g, done)) => {
                            ready.insert(g, done);
                        }
                        Err(_) => unreachable!("workers stay while groups are queued"),
                    }
                };
                let committed = match done {
                    Ok(done) => self.commit_group(&todo[groups[next].clone()], done, writer),
                    Err(e) => Err(e),
                };
                if let Err(e) = committed {
                    return stopping(e);
                }
            }
            Ok(())
        })
    }

    /// Records what a group's units gave, commits its shards in order, and with
    /// `--delete-source` verifies them and deletes the group's sources.
    fn commit_group(
        &mut self,
        units: &[Unit],
        done: GroupDone,
        writer: &mut DatasetWriter,
    ) -> Result<(), RunError> {
        let mut converted = Vec::with_capacity(units.len());
        for (unit, outcome) in units.iter().zip(done.outcomes) {
            let file = &unit.files[0].1;
            match outcome {
                Outcome::Bad(e) => self.bad(unit.paths(), e)?,
                Outcome::Converted {
                    key,
                    stored_key,
                    appended,
                    present,
                    request_keys,
                } => {
                    for k in request_keys {
                        match self.request_keys.get(&k) {
                            Some(other) if other != file => {
                                return Err(RunError::DuplicateKey {
                                    key: k,
                                    a: other.clone(),
                                    b: file.clone(),
                                })
                            }
                            _ => {
                                self.request_keys.insert(k, file.clone());
                            }
                        }
                    }
                    if let Some(log) = self.keys.as_mut().filter(|_| stored_key) {
                        match log.unit_of(&key) {
                            Some((other, other_file)) if other != unit.key => {
                                return Err(RunError::DuplicateKey {
                                    key,
                                    a: other_file.to_path_buf(),
                                    b: file.clone(),
                                })
                            }
                            _ => {}
                        }
                        // Flushed before the samples commit, so every committed key has its line.
                        log.record(&unit.key, file, &key)
                            .map_err(|source| RunError::Io {
                                path: log.path().to_path_buf(),
                                op: "write",
                                source,
                            })?;
                    }
                    self.report.samples += appended;
                    self.report.samples_present += present;
                    // A unit whose every sample the dataset held was skipped, not converted.
                    if appended == 0 && present > 0 {
                        self.report.present += 1;
                    } else {
                        self.report.converted += 1;
                        self.report.source_bytes += unit.bytes;
                    }
                    converted.push(unit);
                }
            }
        }
        for lane in done.lanes {
            writer.commit_lane(lane)?;
        }
        failpoint!("convert-committed");
        if self.o.delete_source {
            self.verify_new(writer.stats().shards)?;
            for unit in converted {
                self.delete(unit)?;
            }
        }
        Ok(())
    }

    /// Hashes every chunk of the shards committed since the last check.
    fn verify_new(&mut self, shards: u64) -> Result<(), RunError> {
        if shards <= self.verified {
            return Ok(());
        }
        let ds = Dataset::open(&self.o.dst)?;
        let schema = ds.schema().clone();
        for seq in self.verified..shards {
            let shard = ds.shard(seq as usize).map_err(RunError::Verify)?;
            crate::parallel::install(|| {
                (0..shard.footer().chunk_count)
                    .into_par_iter()
                    .try_for_each(|c| match shard.index().chunk(c) {
                        Some(e) => shard.check_chunk_hash(c, &e, &schema),
                        None => Ok(()),
                    })
            })
            .map_err(RunError::Verify)?;
        }
        self.verified = shards;
        Ok(())
    }

    fn delete(&mut self, unit: &Unit) -> Result<(), RunError> {
        for path in unit.files.iter().map(|f| &f.1).chain(&unit.split_file) {
            match std::fs::remove_file(path) {
                Ok(()) => {
                    failpoint!("convert-source-deleted");
                    self.report.deleted += 1;
                    // A folder the deletion emptied goes too (never the source root).
                    if let Some(dir) = path.parent().filter(|d| *d != self.o.src) {
                        let _ = std::fs::remove_dir(dir);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(RunError::Io {
                        path: path.clone(),
                        op: "delete",
                        source,
                    })
                }
            }
        }
        Ok(())
    }
}

/// Consecutive units whose shards one thread writes. Each group is planned to fill one shard
/// (its source bytes under the shard size, its units under the shard's sample count); the
/// shard size shrinks, down to `MIN_GROUP_BYTES`, so that every thread gets several groups.
fn shard_groups(todo: &[Unit], write: &WriteOptions, jobs: usize) -> Vec<Range<usize>> {
    let total: u64 = todo.iter().map(|u| u.bytes).sum();
    // Under the shard size by a margin: a shard also holds headers and alignment padding, and
    // a group that overflows its shard gets a second one.
    let full = write.shard_bytes - write.shard_bytes / 8;
    let target = (total / (4 * jobs as u64)).clamp(MIN_GROUP_BYTES.min(full), full.max(1));
    let mut groups = Vec::new();
    let (mut start, mut bytes) = (0, 0u64);
    for (i, u) in todo.iter().enumerate() {
        let count = (i - start) as u64;
        if count > 0 && (bytes + u.bytes > target || count >= write.shard_samples) {
            groups.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += u.bytes;
    }
    if start < todo.len() {
        groups.push(start..todo.len());
    }
    groups
}

/// Runs `f`, turning a panic (a bug) into an error naming `file`: a thread that panicked must
/// end the run with an error, not leave the committing thread waiting for its group.
fn caught<T>(file: &Path, f: impl FnOnce() -> Result<T, RunError>) -> Result<T, RunError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let detail = match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
            (Some(s), _) => s.to_string(),
            (_, Some(s)) => s.clone(),
            _ => "a thread panicked".into(),
        };
        Err(RunError::Internal {
            file: file.to_path_buf(),
            detail,
        })
    })
}

/// Groups are planned no smaller than this unless shards are.
const MIN_GROUP_BYTES: u64 = 64 << 20;

/// From the threads writing groups to the thread committing them.
enum Message {
    /// A unit was decoded and written (or found bad), of `bytes` source bytes.
    Unit { bytes: u64 },
    /// A group is written.
    Group(usize, Result<GroupDone, RunError>),
}

/// A written group: its shards, and what became of each unit, in order. A group stopped at a
/// bad unit (without `--skip-bad`) ends with that unit.
struct GroupDone {
    lanes: Vec<ShardLane>,
    outcomes: Vec<Outcome>,
}

enum Outcome {
    /// Samples appended, and samples skipped as committed before, of the unit's key.
    Converted {
        key: String,
        /// Whether `key` was read from the files and goes to the key log.
        stored_key: bool,
        appended: u64,
        present: u64,
        /// The sample keys, when read one per request (`key_from` naming a list of ids).
        request_keys: Vec<String>,
    },
    /// Why the unit's file is bad.
    Bad(String),
}

/// What every writing thread shares.
struct LaneJob<'a> {
    decoder: &'a Decoder,
    todo: &'a [Unit],
    lanes: Lanes,
    write: &'a WriteOptions,
    stop_at_bad: bool,
    /// Keys committed before this run, with split units or `--key-from` (others are skipped
    /// whole before the run).
    present: &'a HashSet<String>,
    /// Set when the run fails: threads leave their groups.
    stop: AtomicBool,
}

impl LaneJob<'_> {
    /// Decodes the group's units one at a time and appends their samples to its shards.
    fn run(&self, group: Range<usize>, msg: &mpsc::Sender<Message>) -> Result<GroupDone, RunError> {
        let mut done = GroupDone {
            lanes: vec![self.lanes.open()?],
            outcomes: Vec::with_capacity(group.len()),
        };
        let mut first_unit_of: HashMap<String, &Path> = HashMap::new();
        for unit in &self.todo[group] {
            if self.stop.load(Ordering::Relaxed) {
                break;
            }
            let outcome = match self.decoder.prepare(unit) {
                Ok(p) => {
                    let file = &unit.files[0].1;
                    let per_request = self.decoder.key_from.is_some() && !p.stored_key;
                    let keys: Vec<&String> = match per_request {
                        true => p.samples.iter().map(|s| &s.0).collect(),
                        false => vec![&p.key],
                    };
                    for key in keys {
                        if let Some(other) = first_unit_of.insert(key.clone(), file) {
                            return Err(RunError::DuplicateKey {
                                key: key.clone(),
                                a: other.to_path_buf(),
                                b: file.clone(),
                            });
                        }
                    }
                    let outcome = self.append(&p, &mut done.lanes);
                    self.decoder.recycle(p);
                    outcome?
                }
                Err(e) => Outcome::Bad(e),
            };
            let stop = self.stop_at_bad && matches!(outcome, Outcome::Bad(_));
            done.outcomes.push(outcome);
            let _ = msg.send(Message::Unit { bytes: unit.bytes });
            if stop {
                break;
            }
        }
        if self.write.durable {
            for lane in &mut done.lanes {
                lane.sync_data()?;
            }
        }
        Ok(done)
    }

    fn append(&self, p: &Prepared, lanes: &mut Vec<ShardLane>) -> Result<Outcome, RunError> {
        let decoder = self.decoder;
        let mut fields = Vec::with_capacity(decoder.specs.len());
        for f in 0..decoder.specs.len() {
            match decoder.field(p, f) {
                Ok(b) => fields.push(b),
                Err(e) => return Ok(Outcome::Bad(e)),
            }
        }
        let (mut appended, mut present) = (0, 0);
        for (key, rows) in &p.samples {
            if self.present.contains(key) {
                present += 1;
                continue;
            }
            let named: Vec<(&str, &[u8])> = decoder
                .schema
                .fields
                .iter()
                .zip(&fields)
                .map(|(f, b)| {
                    let rb = f.row_bytes() as usize;
                    (
                        f.name.as_str(),
                        &b[rows.start as usize * rb..rows.end as usize * rb],
                    )
                })
                .collect();
            let raw: u64 = named.iter().map(|(_, b)| b.len() as u64).sum();
            let lane = lanes.last_mut().expect("a group has a lane");
            if self
                .write
                .shard_is_full(lane.len(), lane.sample_count(), raw)
            {
                lanes.push(self.lanes.open()?);
            }
            lanes
                .last_mut()
                .expect("a group has a lane")
                .append(key, &named)?;
            appended += 1;
        }
        let per_request = decoder.key_from.is_some() && !p.stored_key;
        Ok(Outcome::Converted {
            key: p.key.clone(),
            stored_key: p.stored_key,
            appended,
            present,
            request_keys: match per_request {
                true => p.samples.iter().map(|s| s.0.clone()).collect(),
                false => Vec::new(),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_error_naming_the_file() {
        let file = Path::new("/src/rows_0-16/data_3.ckpt");
        let e = caught::<()>(file, || panic!("index {} out of range", 7)).unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, RunError::Internal { .. }), "{e:?}");
        assert!(
            text.contains("data_3.ckpt") && text.contains("index 7 out of range"),
            "{text}"
        );
        assert_eq!(caught(file, || Ok(5)).unwrap(), 5);
    }
}
