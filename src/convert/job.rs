//! The conversion job: plan units, decode them on worker threads, append them in key order,
//! delete sources once their shard is durable and verified, and report.
//!
//! Memory is bounded: at most `2 × jobs` units are decoded ahead of the writer. Resuming is
//! by key: a unit whose key the dataset already holds is skipped, so a rerun after any
//! interruption continues where the last commit left off and never appends a sample twice.

use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use rayon::prelude::*;

use crate::format::manifest::MANIFEST_FILE;
use crate::read::Dataset;
use crate::write::{DatasetWriter, WriteOptions, WriteStats};

use super::keys::KeyLog;
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
    /// The file (the first of its group).
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
    /// Units whose samples the dataset already held.
    pub present: u64,
    /// Samples appended in this run.
    pub samples: u64,
    /// Source bytes of the converted units.
    pub source_bytes: u64,
    /// Files skipped as bad (only with `skip_bad`).
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
}

fn is_layout_flag_error(e: &LayoutError) -> bool {
    matches!(e, LayoutError::Layers { .. } | LayoutError::BadOption(_))
}

/// Runs a conversion. `progress` is called on the calling thread.
pub fn run(o: &ConvertOptions, progress: &mut dyn FnMut(Progress)) -> Result<Report, RunError> {
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
    if o.delete_source {
        run.verify_new(stats.shards)?;
        while let Some((unit, _)) = run.pending.pop_front() {
            run.delete(&unit)?;
        }
    }
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
    /// Converted units not yet deleted, with the ordinal after their last sample.
    pending: VecDeque<(Unit, u64)>,
    verified: u64,
    /// With `key_from`, which unit gave which key.
    keys: Option<KeyLog>,
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
            pending: VecDeque::new(),
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

    fn bad(&mut self, file: &Path, error: String) -> Result<(), RunError> {
        // Reader errors start with the file already.
        let error = match error.strip_prefix(&format!("{}: ", file.display())) {
            Some(rest) => rest.to_string(),
            None => error,
        };
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
                    self.bad(first, e.to_string())?;
                    self.bad_units.insert(u.key.clone());
                    continue;
                }
            };
            let tensors = inputs.tensors();
            let derived = specs_for(o.preset, &tensors, &o.layout)
                .and_then(|s| derive_schema(o.preset, &s, &tensors, &o.layout).map(|d| (s, d)));
            match derived {
                Ok((specs, schema)) => {
                    return Ok(Some(Decoder {
                        specs,
                        schema,
                        split_by: o.split_by.clone(),
                        key_from: o.key_from.clone(),
                        trim: o.trim,
                        limits: o.limits,
                        pool: Default::default(),
                    }))
                }
                Err(LayoutError::MissingTensor { tensor, .. })
                    if inputs.unsupported(&tensor).is_some() =>
                {
                    let e = inputs.unsupported(&tensor).map(|e| e.to_string());
                    self.bad(first, e.unwrap_or_default())?;
                    self.bad_units.insert(u.key.clone());
                }
                Err(e) if is_layout_flag_error(&e) => {
                    return Err(RunError::Layout {
                        file: first.clone(),
                        error: e,
                    })
                }
                Err(e) => {
                    self.bad(first, e.to_string())?;
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
        let window = 2 * jobs;
        let (job_tx, job_rx) = mpsc::channel::<usize>();
        let job_rx = Mutex::new(job_rx);
        let (res_tx, res_rx) = mpsc::channel::<(usize, Result<Prepared, String>)>();
        std::thread::scope(|scope| {
            for _ in 0..jobs {
                let res_tx = res_tx.clone();
                let job_rx = &job_rx;
                scope.spawn(move || loop {
                    let next = job_rx.lock().map(|rx| rx.recv());
                    let Ok(Ok(i)) = next else { break };
                    if res_tx.send((i, decoder.prepare(&todo[i]))).is_err() {
                        break;
                    }
                });
            }
            drop(res_tx);
            let mut fed = 0;
            let mut ready = BTreeMap::new();
            for next in 0..todo.len() {
                while fed < todo.len() && fed < next + window {
                    let _ = job_tx.send(fed);
                    fed += 1;
                }
                let result = loop {
                    if let Some(r) = ready.remove(&next) {
                        break r;
                    }
                    match res_rx.recv() {
                        Ok((i, r)) => {
                            ready.insert(i, r);
                        }
                        Err(_) => unreachable!("workers stay while jobs are queued"),
                    }
                };
                let unit = &todo[next];
                match result {
                    Ok(prepared) => self.append(decoder, unit, prepared, writer)?,
                    Err(e) => self.bad(&unit.files[0].1, e)?,
                }
                progress(Progress::Advance { bytes: unit.bytes });
            }
            drop(job_tx);
            Ok(())
        })
    }

    fn append(
        &mut self,
        decoder: &Decoder,
        unit: &Unit,
        p: Prepared,
        writer: &mut DatasetWriter,
    ) -> Result<(), RunError> {
        if let Some(log) = &mut self.keys {
            let file = &unit.files[0].1;
            match log.unit_of(&p.key) {
                Some((other, other_file)) if other != unit.key => {
                    return Err(RunError::DuplicateKey {
                        key: p.key.clone(),
                        a: other_file.to_path_buf(),
                        b: file.clone(),
                    })
                }
                _ => {}
            }
            log.record(&unit.key, file, &p.key)
                .map_err(|source| RunError::Io {
                    path: log.path().to_path_buf(),
                    op: "write",
                    source,
                })?;
        }
        let mut fields = Vec::with_capacity(decoder.specs.len());
        for f in 0..decoder.specs.len() {
            match decoder.field(&p, f) {
                Ok(b) => fields.push(b),
                Err(e) => return self.bad(&unit.files[0].1, e),
            }
        }
        let mut appended = 0;
        for (key, rows) in &p.samples {
            if writer.contains_key(key) {
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
            writer.append(key, &named)?;
            appended += 1;
        }
        drop(fields);
        decoder.recycle(p);
        self.report.samples += appended;
        self.report.converted += 1;
        self.report.source_bytes += unit.bytes;
        if self.o.delete_source {
            self.pending.push_back((unit.clone(), writer.len()));
            let stats = writer.stats();
            if stats.shards > self.verified {
                self.verify_new(stats.shards)?;
                while self.pending.front().is_some_and(|p| p.1 <= stats.samples) {
                    if let Some((u, _)) = self.pending.pop_front() {
                        self.delete(&u)?;
                    }
                }
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
            (0..shard.footer().chunk_count)
                .into_par_iter()
                .try_for_each(|c| match shard.index().chunk(c) {
                    Some(e) => shard.check_chunk_hash(c, &e, &schema),
                    None => Ok(()),
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
