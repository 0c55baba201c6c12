//! The conversion job: plan units, write them in lanes (`lanes.rs`), commit the shards
//! in source order, delete sources once their shard is durable and verified, and report
//! ([`super::report`]).
//!
//! Resuming is by key: a unit whose key the dataset already holds is skipped, so a rerun after
//! any interruption continues where the last commit left off and never appends a sample twice.
//! It is skipped unread where the key log says its files, unchanged, gave that key; otherwise
//! (files written again, another dump under the same names, no log) its samples are compared
//! with what the dataset holds first, and one holding other data is refused.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;

use crate::failpoint::failpoint;
use crate::format::manifest::MANIFEST_FILE;
use crate::format::Schema;
use crate::read::Dataset;
use crate::store::captures::{reuse_captured, CaptureConfig};
use crate::store::Store;
use crate::write::DatasetWriter;

use super::groups::{check_duplicates, to_convert};
use super::keys::{misnamed, stored_keys, KeyError, KeyLog};
use super::lanes::{write_in_lanes, GroupDone, LaneOptions, Outcome};
use super::layout::{derive_schema, refuse_left_out, specs_for, LayoutError, Preset};
use super::prepare::{Decoder, SplitBy};
use super::report::{BadFile, BadLog, Progress, Report};
use super::spec::{ConvertOptions, ConvertSpec, SpecError};
use super::unit_error::{UnitError, UnitProblem};
use super::units::{natural_cmp, plan, Inputs, Unit};
use super::ConvertError;

pub use super::report::REPORT_FILE;

/// Removes the key log kept for the dataset at `dst` (a local file, also for `STORE/NAME`).
fn forget_key_log(dst: &Path) {
    if !crate::io::is_remote(dst) {
        let _ = std::fs::remove_file(dst.join(super::keys::KEYS_FILE));
    }
}

/// Units of fields other than the dataset's a run reads, none of the dataset's among them,
/// before it stops to say so (with `--skip-bad` it reads on, listing them).
const OTHER_KINDS_TRIED: usize = 64;

/// A way of keying samples ([`RunError::KeyedOtherwise`]) in words.
fn keying(keyed: &str) -> String {
    match keyed.strip_prefix("key-from ") {
        Some(name) => format!("the value `{name}` their files hold (--key-from {name})"),
        None => "their file names".into(),
    }
}

/// Split flags in words: none said as such.
fn said(flags: &str) -> String {
    match flags {
        "" => "no --split-by".into(),
        f => format!("`{f}`"),
    }
}

/// The flags that key samples as `keyed` does.
fn flag(keyed: &str) -> String {
    match keyed.strip_prefix("key-from ") {
        Some(name) => format!("--key-from {name}"),
        None => "no --key-from".into(),
    }
}

/// How `o` splits files into requests, as its flags say (empty for none): recorded in the key
/// log, so that a resume splitting otherwise is refused ([`RunError::SplitOtherwise`]).
fn split_flags(o: &ConvertOptions) -> String {
    let by = match &o.split_by {
        None => return String::new(),
        Some(SplitBy::Lengths(t)) => format!("--split-by lengths:{t}"),
        Some(SplitBy::CuSeqlens(t)) => format!("--split-by cu_seqlens:{t}"),
    };
    match &o.split_file {
        Some(p) => format!("{by} --split-by-file {p}"),
        None => by,
    }
}

/// Why a run stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// A source file is bad; rerun with `--skip-bad` to list it and go on.
    #[error("{}: {}; fix or remove the file, or rerun with --skip-bad to list it in a report and go on", file.display(), error.detail())]
    BadFile {
        /// The file at fault ([`UnitError::file`]).
        file: PathBuf,
        /// Why.
        #[source]
        error: Box<UnitError>,
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
    /// Two files of one unit give the same part (a --group-by pattern that matches both).
    #[error("{} and {} both give part `{part}` of sample `{key}`: a sample reads one file per part, so the other would be left out (and deleted with --delete-source); make --group-by tell them apart, or keep one of them", a.display(), b.display())]
    DuplicatePart {
        /// The sample's key.
        key: String,
        /// The part.
        part: String,
        /// One file.
        a: PathBuf,
        /// The other.
        b: PathBuf,
    },
    /// A source gives a key the dataset holds, with other data: not skipped as converted
    /// before, nor deleted.
    #[error("{}: gives sample key `{key}`, which the dataset holds with other data (a file converted before gave it); this file was neither skipped nor deleted: key its samples another way (--key-from), or convert it into another dataset", file.display())]
    KeyHeldWithOtherData {
        /// The key.
        key: String,
        /// The unit's file.
        file: PathBuf,
    },
    /// A source file `--delete-source` would delete is a symbolic link or has other hard
    /// links: its bytes would stay under the other name, which a rerun converts again.
    #[error("{}: is a symbolic link, or has other hard links: --delete-source would delete this name and leave the bytes under the other, which a later run would convert again under another key; convert without --delete-source, or replace the link with the file itself", file.display())]
    LinkedSource {
        /// The file.
        file: PathBuf,
    },
    /// A resume that keys samples otherwise than the runs that wrote the dataset: the files
    /// converted before would be appended again under other keys.
    #[error("{}: the runs that wrote this dataset keyed its samples by {}, this one by {}: resumed, the files converted before would be appended again under other keys; run with the same keying ({}), or convert into a new dataset", log.display(), keying(before), keying(now), flag(before))]
    KeyedOtherwise {
        /// The key log.
        log: PathBuf,
        /// How earlier runs keyed samples (`name`, `key-from NAME`).
        before: String,
        /// How this one does.
        now: String,
    },
    /// A resume that splits files into requests otherwise than the runs before: the files
    /// converted before would be appended again as other samples.
    #[error("{}: the runs that wrote this dataset split its files with {}, this one with {}: resumed, the files converted before would be appended again as other samples; run with the same flags, or convert into a new dataset", log.display(), said(before), said(now))]
    SplitOtherwise {
        /// The key log.
        log: PathBuf,
        /// The split flags of earlier runs (empty for none).
        before: String,
        /// This run's.
        now: String,
    },
    /// No source file matches the layout.
    #[error("{}: no source files for the {layout} layout, which reads files named {names}{grouped} ({ignored} other files there); check the path and --layout", src.display())]
    NoSources {
        /// Source path.
        src: PathBuf,
        /// Layout name.
        layout: &'static str,
        /// The names of the files it reads.
        names: String,
        /// `--group-by`'s pattern, when given, in words.
        grouped: String,
        /// Files ignored.
        ignored: u64,
    },
    /// The source is an hspack dataset, not dumps to convert.
    #[error("{}: is an hspack dataset, not hidden-state dumps to convert; copy it with `hspack cp {} DST`, or join it with others with `hspack merge` (which also takes --codec)", src.display(), src.display())]
    SourceIsADataset {
        /// Source path.
        src: PathBuf,
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
    /// The spec is wrong: an option, or options together.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// `--key-from` names no value of the first unit's files (a mistake in the flag).
    #[error(transparent)]
    KeyFrom(KeyError),
    /// `--split-by` names a tensor the first unit does not hold (a mistake in the flag, not
    /// a bad file).
    #[error("{}: --split-by names tensor `{tensor}`, which the file does not hold (it has: {have}){instead}; check the flag", file.display())]
    SplitTensor {
        /// The first unit's file.
        file: PathBuf,
        /// What the file holds under that name instead, where it is a list, in words
        /// (`; \`seq_lens\` is a list of 2 ints there, ...`), or nothing.
        instead: String,
        /// The tensor named.
        tensor: String,
        /// The tensors the unit has.
        have: String,
    },
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

/// `e`, where it is a tensor missing that the files hold as a list of values (token ids
/// saved as a Python list), saying so: the tensors it lists leave the name out.
fn not_a_tensor(e: LayoutError, inputs: &Inputs) -> LayoutError {
    match e {
        LayoutError::MissingTensor {
            layout,
            tensor,
            have,
            next,
        } => {
            let next = match inputs.not_a_tensor(&tensor) {
                Some(is) => format!(
                    "`{tensor}` is {is} in this file, not a tensor: save it as one \
                     (`torch.tensor(...)`)"
                ),
                None => next,
            };
            LayoutError::MissingTensor {
                layout,
                tensor,
                have,
                next,
            }
        }
        e => e,
    }
}

/// Whether the first unit's error says the flags are wrong, not the file: a flag, or what
/// the fields leave out that every file likely holds.
fn is_layout_flag_error(e: &LayoutError) -> bool {
    matches!(
        e,
        LayoutError::Layers { .. }
            | LayoutError::FinalNormId { .. }
            | LayoutError::BadOption(_)
            | LayoutError::LeftOut { .. }
            | LayoutError::Unread { .. }
            | LayoutError::UnreadValue { .. }
            | LayoutError::UnreadPart { .. }
            | LayoutError::AmbiguousStack { .. }
    )
}

/// Runs a conversion. `progress` is called on the calling thread. The spec is checked
/// first ([`ConvertSpec::check`]); a spec that fails touches nothing.
///
/// A run that fails before committing anything to a folder that held no dataset leaves no
/// dataset behind: the manifest (and key log) it created go, and the folder too when the run
/// created it and nothing else is in it.
///
/// A dataset of no shards there is what a first run killed before its first commit (Ctrl-C)
/// leaves: it is removed first, so that the run starts afresh with the flags given now
/// (which a user often corrects after such a stop) instead of refusing them as not the
/// dataset's.
pub fn run(spec: &ConvertSpec, progress: &mut dyn FnMut(Progress)) -> Result<Report, RunError> {
    let o = &spec.resolve()?;
    let report = (o.report_path.clone()).unwrap_or_else(|| o.dst.join(REPORT_FILE));
    if first_run_stopped(o)? {
        remove_empty_dataset(&o.dst, &report, true);
    }
    let fresh = !has_dataset(&o.dst)?;
    let folder_existed = o.dst.exists();
    let result = convert(o, progress);
    if result.is_err() && fresh {
        remove_empty_dataset(&o.dst, &report, folder_existed);
    }
    result
}

/// True when `o.dst` holds what a first run of convert stopped before its first commit leaves,
/// and nothing else: a dataset convert made (its capture says so) that lists no shard, in a
/// local folder holding only hspack's files. A dataset a user made empty on purpose (with
/// capture metadata of their own), one in object storage (where writers sharing it hold no
/// lease between commits), or a folder holding other files is left as it is; so is every
/// dataset when the source is not there to convert.
fn first_run_stopped(o: &ConvertOptions) -> Result<bool, RunError> {
    if !o.src.exists() || is_a_dataset(&o.src) || !has_dataset(&o.dst)? {
        return Ok(false);
    }
    let storage = crate::store::open_location(&o.dst)?;
    if !crate::write::destination::holds_only_ours(&*storage)? {
        return Ok(false);
    }
    let Ok(ds) = Dataset::open_in(storage, Default::default()) else {
        return Ok(false);
    };
    let by_convert = (ds.schema().capture.as_ref())
        .is_some_and(|c| c.tool.starts_with(crate::convert::layout::CONVERT_TOOL));
    Ok(by_convert && ds.manifest().shards.is_empty())
}

/// True when `path` is a folder holding an hspack manifest (one that loads, not any
/// `manifest.json`: dump tools write their own).
fn is_a_dataset(path: &Path) -> bool {
    path.join(MANIFEST_FILE).is_file()
        && crate::read::load_manifest(&crate::io::LocalStorage::new(path))
            .is_ok_and(|m| m.is_some())
}

/// Refuses a destination that is a file, a store's own folder, or a folder holding files and
/// no dataset ([`refuse_foreign_folder`](crate::write::destination::refuse_foreign_folder)).
fn refuse_foreign_folder(dst: &Path) -> Result<(), RunError> {
    crate::store::refuse_a_file_path(dst)?;
    // A store's dataset named as one of its folders (made before such names were refused):
    // its key log would lie among the store's own files, which `store gc` deletes.
    if let Some((store, name)) = crate::store::split_store_path(dst)?
        .filter(|(_, name)| crate::store::STORE_FOLDERS.contains(&name.as_str()))
    {
        return Err(RunError::Dataset(crate::Error::Store {
            path: dst.to_path_buf(),
            detail: format!(
                "`{name}` is the name of one of the store's own folders, where convert's key log \
                 would lie among the store's files: convert into another name of {}",
                store.display()
            ),
        }));
    }
    crate::write::destination::refuse_foreign_folder(&*crate::store::open_location(dst)?)?;
    Ok(())
}

/// True when `dst` (a folder or a URL) holds a dataset.
fn has_dataset(dst: &Path) -> Result<bool, RunError> {
    Ok(crate::store::open_location(dst)?
        .read(MANIFEST_FILE)?
        .is_some())
}

/// Removes the dataset a failed run created in `dst` when it holds no shard: the manifest,
/// the key log, an empty bad-file report (`report`), and the folder when the run created it
/// and it is then empty. Under the writer lock, or not at all: another run that created the
/// dataset meanwhile (this one may have failed on its lock) holds it, and its manifest and
/// files being written are not this run's to remove. Best effort: the run's own error is
/// what the caller sees.
fn remove_empty_dataset(dst: &Path, report: &Path, folder_existed: bool) {
    let Ok(storage) = crate::store::open_location(dst) else {
        return;
    };
    let Ok(_lock) = storage.lock() else {
        return;
    };
    if let Ok(ds) = Dataset::open_in(Arc::clone(&storage), Default::default()) {
        if !ds.manifest().shards.is_empty() {
            return;
        }
        // What the failed first commit left goes before the manifest (a crash in between
        // leaves the manifest, and the next writer removes them): without a manifest, a
        // writer takes files named as a dataset's for someone else's and refuses the folder.
        let _ = crate::write::dataset_writer::remove_leftovers(storage.as_ref(), ds.manifest());
        let _ = storage.delete(MANIFEST_FILE);
        forget_key_log(dst);
    }
    if std::fs::metadata(report).is_ok_and(|m| m.len() == 0) {
        let _ = std::fs::remove_file(report);
    }
    drop(_lock);
    if !folder_existed {
        // Only when empty: never a file the run did not create.
        let _ = std::fs::remove_dir(dst);
    }
}

fn convert(o: &ConvertOptions, progress: &mut dyn FnMut(Progress)) -> Result<Report, RunError> {
    let started = Instant::now();
    let plan = plan(
        &o.src,
        &o.dst,
        o.preset,
        o.group_by.as_deref(),
        o.split_file.as_deref(),
    )?;
    check_duplicates(&plan.units)?;
    refuse_foreign_folder(&o.dst)?;
    if is_a_dataset(&o.src) {
        return Err(RunError::SourceIsADataset { src: o.src.clone() });
    }
    let mut run = Run::new(o, plan.ignored.len() as u64)?;
    run.report.aliases = plan.aliases.clone();
    if plan.units.is_empty() {
        if has_dataset(&o.dst)? {
            run.report.stats = DatasetWriter::open_checked_by_caller(
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
            names: o.preset.file_names(),
            grouped: o
                .group_by
                .as_deref()
                .map(|p| format!(" matching --group-by '{p}'"))
                .unwrap_or_default(),
            ignored: plan.ignored.len() as u64,
        });
    }
    run.report.units = plan.units.len() as u64;
    let Some(decoder) = run.decoder(&plan.units)? else {
        // Every unit bad: the dataset is as it was.
        if let Ok(ds) = Dataset::open(&o.dst) {
            run.report.stats = crate::write::WriteStats::of(ds.manifest());
        }
        run.report.elapsed = started.elapsed();
        return Ok(run.report);
    };
    // The folder was checked before this run's report went into it.
    let mut writer =
        DatasetWriter::open_checked_by_caller(&o.dst, decoder.schema.clone(), o.write.clone())?;
    if let Some(log) = run.keys.as_mut() {
        log.bind(writer.dataset_id());
    }
    let (mut todo, present, trusted) = to_convert(
        plan.units,
        &run.bad_units,
        run.keys.as_ref(),
        &writer,
        o.split_by.is_some(),
    );
    // With --delete-source, the units the dataset holds by key (samples of an interrupted
    // run) are decoded too: each sample is compared with what the dataset holds under its
    // key, and a file goes only once its samples match and what is committed is verified.
    let recheck = o.delete_source && !present.is_empty();
    if o.delete_source {
        for unit in todo.iter().chain(&present) {
            if let Some(file) = unit.linked_file() {
                return Err(RunError::LinkedSource { file: file.clone() });
            }
            // What a file is like before it is read: a file written again under its name
            // since is not deleted (`Run::delete`).
            unit.identity();
        }
    }
    run.verified = writer.stats().shards;
    if recheck {
        run.verified = 0;
        todo.extend(present);
        todo.sort_by(|a, b| natural_cmp(&a.key, &b.key));
    } else {
        // Skipped whole: a unit not split is one sample.
        run.report.present = present.len() as u64;
        run.report.samples_present = present.len() as u64;
    }
    let captures = match &o.capture {
        Some(config) => Some(Captures::of(o, config, &decoder.schema)?),
        None => None,
    };
    let (todo, partly_reused) = match &captures {
        Some(c) => run.reuse_captured(c, &decoder, todo, &mut writer)?,
        None => (todo, false),
    };
    progress(Progress::Start {
        units: todo.len() as u64,
        bytes: todo.iter().map(|u| u.bytes).sum(),
    });
    let lanes = LaneOptions {
        jobs: o.jobs,
        write: &o.write,
        stop_at_bad: !o.skip_bad,
        // Units whose samples the dataset holds were left out of `todo` by key where the key
        // log says their files gave them, except split units (keys known only once decoded):
        // the others' samples the dataset holds are skipped as they come, once compared with
        // what it holds under their keys. Keys taken from the files are known only once read,
        // even when the key log is gone. A unit some of whose samples were copied from the
        // store goes on from the others. With --delete-source, units held by key are decoded
        // too (`recheck`), and every skipped sample is compared before its file goes.
        skip_present: o.split_by.is_some()
            || o.key_from.is_some()
            || partly_reused
            || recheck
            || todo.iter().any(|u| writer.contains_key(&u.key)),
        compare_all: o.delete_source,
        trusted: &trusted,
        capture: captures.as_ref().map(|c| &c.config),
    };
    write_in_lanes(
        &decoder,
        &todo,
        &mut writer,
        lanes,
        progress,
        &mut |units, done, writer| run.commit_group(units, done, writer, captures.as_ref()),
    )
    .map_err(|e| match e {
        // The key log knows which file gave a key read from the files: both are named.
        RunError::KeyHeldWithOtherData { key, file } if o.key_from.is_some() => {
            match run.keys.as_ref().and_then(|log| log.unit_of(&key)) {
                Some((_, other)) if other != file => RunError::DuplicateKey {
                    key,
                    a: other.to_path_buf(),
                    b: file,
                },
                _ => RunError::KeyHeldWithOtherData { key, file },
            }
        }
        e => e,
    })?;
    let stats = writer.finish()?;
    run.report.stats = stats;
    run.report.elapsed = started.elapsed();
    Ok(run.report)
}

/// The captures of a run with a capture config: the store of the destination `STORE/NAME`,
/// and the config for the converted schema.
struct Captures {
    store: Arc<Store>,
    name: String,
    config: CaptureConfig,
}

impl Captures {
    fn of(o: &ConvertOptions, config: &CaptureConfig, schema: &Schema) -> Result<Self, RunError> {
        let bad = |detail: String| {
            RunError::Dataset(crate::Error::BadOption {
                option: "capture",
                detail,
            })
        };
        let (store, name) = crate::store::split_store_path(&o.dst)?.ok_or_else(|| {
            bad(format!(
                "{}: captures are recorded in a store: convert into STORE/NAME (make a store with `hspack store init`)",
                o.dst.display()
            ))
        })?;
        let config = config.clone().for_schema(schema).map_err(bad)?;
        Ok(Captures {
            store: Arc::new(Store::open(store)?),
            name,
            config,
        })
    }
}

/// Whether the run keeps a key log: beside a dataset in a local folder or store
/// (`STORE/NAME/`), and wherever `--key-from` needs one (refused for object storage). Without
/// it (object storage), a unit whose key the dataset holds is skipped by its key
/// ([`to_convert`]).
fn key_log_kept(o: &ConvertOptions) -> bool {
    o.key_from.is_some() || !crate::io::is_remote(&o.dst)
}

struct Run<'o> {
    o: &'o ConvertOptions,
    report: Report,
    report_file: Option<BadLog>,
    bad_units: HashSet<String>,
    verified: u64,
    /// Which unit gave which key, from which files ([`key_log_kept`]).
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
        let report_file = report_path.as_deref().map(BadLog::create).transpose()?;
        Ok(Run {
            o,
            report: Report::new(report_path, ignored),
            report_file,
            bad_units: Default::default(),
            request_keys: HashMap::new(),
            verified: 0,
            keys: match key_log_kept(o) {
                true => {
                    // A log beside no dataset is of one removed (or of a first run that failed):
                    // it names nothing there, and this run's dataset starts a new one; so is a
                    // log of another dataset (one removed, whose name was given again).
                    let dataset = match has_dataset(&o.dst)? {
                        true => Some(Dataset::open(&o.dst)?.manifest().dataset_id.clone()),
                        false => {
                            forget_key_log(&o.dst);
                            None
                        }
                    };
                    let split = split_flags(o);
                    let log =
                        KeyLog::open(&o.dst, o.key_from.as_deref(), &split, dataset.as_deref())
                            .map_err(|source| RunError::Io {
                                path: o.dst.join(super::keys::KEYS_FILE),
                                op: "read",
                                source,
                            })?;
                    if let Some(before) = log.split_before() {
                        return Err(RunError::SplitOtherwise {
                            log: log.path().to_path_buf(),
                            before: before.to_string(),
                            now: split,
                        });
                    }
                    if let Some(before) = log.keyed_before() {
                        return Err(RunError::KeyedOtherwise {
                            log: log.path().to_path_buf(),
                            before: before.to_string(),
                            now: match &o.key_from {
                                Some(name) => format!("key-from {name}"),
                                None => "name".into(),
                            },
                        });
                    }
                    Some(log)
                }
                false => None,
            },
        })
    }

    /// Records a bad unit, or stops the run without `skip_bad`.
    fn bad(&mut self, error: UnitError) -> Result<(), RunError> {
        let file = error.file().to_path_buf();
        let Some(f) = self.report_file.as_mut() else {
            return Err(RunError::BadFile {
                file,
                error: Box::new(error),
            });
        };
        let entry = BadFile {
            file,
            error: error.detail(),
        };
        f.write(&entry)?;
        self.report.bad.push(entry);
        Ok(())
    }

    /// Records `others`, units whose fields are not the dataset's (file, key, what differs),
    /// as bad, emptying it.
    fn bad_of_another_kind(
        &mut self,
        others: &mut Vec<(PathBuf, String, String)>,
    ) -> Result<(), RunError> {
        for (file, key, difference) in others.drain(..) {
            self.bad(UnitError::Unit {
                file,
                problem: Box::new(UnitProblem::NotTheDatasets { difference }),
            })?;
            self.bad_units.insert(key);
        }
        Ok(())
    }

    /// The decoder from the first unit whose tensors fit the layout; `None` when every unit is
    /// bad (with `skip_bad`).
    fn decoder(&mut self, units: &[Unit]) -> Result<Option<Decoder>, RunError> {
        let o = self.o;
        // Appending to a dataset: the first unit whose fields are the dataset's (one of
        // another kind left first after a run that deleted the good ones is bad, not the
        // layout of the run).
        let existing = match has_dataset(&o.dst)? {
            true => Some(Dataset::open(&o.dst)?.schema().clone()),
            false => None,
        };
        // Units whose fields are not the dataset's, before the first that are: bad files
        // once one fits; else the flags are not the earlier runs' (or every file is of
        // another kind), said once.
        let mut others: Vec<(PathBuf, String, String)> = Vec::new();
        for u in units {
            if others.len() >= OTHER_KINDS_TRIED && !o.skip_bad {
                break;
            }
            let first = &u.files[0].1;
            let inputs = match Inputs::open(u, o.limits) {
                Ok(i) => i,
                Err(e) => {
                    self.bad(e.into())?;
                    self.bad_units.insert(u.key.clone());
                    continue;
                }
            };
            let held = inputs.held();
            let tensors = &held.tensors;
            let derived = specs_for(o.preset, tensors, &o.layout)
                .and_then(|s| derive_schema(o.preset, &s, tensors, &o.layout).map(|d| (s, d)))
                .and_then(|d| refuse_left_out(o.preset, &d.0, &held, &o.layout).map(|()| d))
                .map_err(|e| not_a_tensor(e, &inputs));
            match derived {
                Ok((specs, mut schema)) => {
                    if let Some(q) = &o.quantize {
                        q.apply(&mut schema).map_err(|detail| {
                            RunError::Dataset(crate::Error::BadOption {
                                option: "quantize",
                                detail,
                            })
                        })?;
                    }
                    if let Some(have) = existing.as_ref().filter(|&have| *have != schema) {
                        let difference = crate::write::dataset_writer::describe_difference(
                            have,
                            &schema,
                            ["in the dataset", "from this file"],
                        );
                        others.push((first.clone(), u.key.clone(), difference));
                        continue;
                    }
                    self.bad_of_another_kind(&mut others)?;
                    if let Some(e) = o.key_from.as_deref().and_then(|k| misnamed(&inputs, k)) {
                        return Err(RunError::KeyFrom(e));
                    }
                    // A name the first unit whose fields fit holds no value under, starting a
                    // dataset: a typo in the flag, not every file bad (as a field's tensor
                    // under the generic layout). Appending, the dataset shows the flag held.
                    if let Some(k) = o.key_from.as_deref().filter(|_| existing.is_none()) {
                        match stored_keys(&inputs, k, None) {
                            Err(e) if e.is_no_value() => return Err(RunError::KeyFrom(e)),
                            _ => {}
                        }
                    }
                    if let (Some(SplitBy::Lengths(name) | SplitBy::CuSeqlens(name)), None) =
                        (&o.split_by, &u.split_file)
                    {
                        if let Err(ConvertError::Missing { what: "tensor", .. }) =
                            inputs.tensor(name)
                        {
                            return Err(RunError::SplitTensor {
                                file: first.clone(),
                                instead: inputs
                                    .not_a_tensor(name)
                                    .map(|is| format!("; `{name}` is {is} there, not a tensor: save it as one (`torch.tensor(...)`)"))
                                    .unwrap_or_default(),
                                tensor: name.clone(),
                                have: tensors
                                    .iter()
                                    .map(|t| t.name.as_str())
                                    .collect::<Vec<_>>()
                                    .join(", "),
                            });
                        }
                    }
                    return Ok(Some(Decoder {
                        layout: (o.preset, o.layout.clone()),
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
                    if let Some(e) = inputs.unsupported(&tensor) {
                        self.bad(e.into())?;
                    }
                    self.bad_units.insert(u.key.clone());
                }
                // A field's tensor the first readable unit lacks, under the generic layout: the
                // --field is wrong (a typo), not every file. A group lacking the part is bad.
                Err(e)
                    if is_layout_flag_error(&e)
                        || o.preset == Preset::Generic
                            && matches!(&e, LayoutError::MissingTensor { tensor, .. }
                                if inputs.missing_part_of(tensor).is_none()) =>
                {
                    let file = match e.tensor() {
                        Some(t) => inputs.file_of(t).to_path_buf(),
                        None => first.clone(),
                    };
                    return Err(RunError::Layout { file, error: e });
                }
                Err(e) => {
                    self.bad(UnitError::Unit {
                        file: first.clone(),
                        problem: Box::new(e.into()),
                    })?;
                    self.bad_units.insert(u.key.clone());
                }
            }
        }
        if o.skip_bad {
            // Every unit bad: listed, each with what differs.
            self.bad_of_another_kind(&mut others)?;
        }
        if let Some((file, _, difference)) = others.first() {
            return Err(RunError::Dataset(crate::Error::SchemaMismatch {
                path: o.dst.clone(),
                detail: format!(
                    "the fields this run makes of the first {} are not the dataset's ({}: \
                     {difference}): give the flags the runs that wrote it gave, or, where those \
                     files are of another kind, list them with --skip-bad; or convert into a \
                     new dataset",
                    crate::error::count(others.len() as u64, "file"),
                    file.display()
                ),
            }));
        }
        Ok(None)
    }

    /// Records what a group's units gave, commits its shards in order, and with
    /// `--delete-source` verifies them and deletes the group's sources.
    fn commit_group(
        &mut self,
        units: &[Unit],
        done: GroupDone,
        writer: &mut DatasetWriter,
        captures: Option<&Captures>,
    ) -> Result<(), RunError> {
        let mut converted = Vec::with_capacity(units.len());
        let mut captured = Vec::new();
        for (unit, outcome) in units.iter().zip(done.outcomes) {
            let file = &unit.files[0].1;
            match outcome {
                Outcome::Bad(e) => self.bad(e)?,
                Outcome::Converted {
                    key,
                    stored_key,
                    appended,
                    present,
                    request_keys,
                    captures,
                    kept,
                } => {
                    captured.extend(captures);
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
                    if let Some(log) = self.keys.as_mut() {
                        match log.unit_of(&key) {
                            Some((other, other_file)) if stored_key && other != unit.key => {
                                return Err(RunError::DuplicateKey {
                                    key,
                                    a: other_file.to_path_buf(),
                                    b: file.clone(),
                                })
                            }
                            _ => {}
                        }
                        // Flushed before the samples commit, so every committed key has its
                        // line, beside the identity of the files that gave it.
                        log.record(&unit.key, file, unit.identity(), &key)
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
                    if kept {
                        self.report.kept += 1;
                    } else {
                        converted.push(unit);
                    }
                }
            }
        }
        if let Some(log) = self.keys.as_ref().filter(|_| self.o.write.durable) {
            log.sync().map_err(|source| RunError::Io {
                path: log.path().to_path_buf(),
                op: "fsync",
                source,
            })?;
        }
        for lane in done.lanes {
            writer.commit_lane(lane)?;
        }
        failpoint!("convert-committed");
        if let Some(c) = captures {
            c.store.record_captures(&c.name, &captured)?;
        }
        if self.o.delete_source {
            self.verify_new(writer.stats().shards)?;
            for unit in converted {
                self.delete(unit)?;
            }
        }
        Ok(())
    }

    /// Copies from the store, under their sample keys, the samples of `todo` whose capture
    /// it holds (checked against the recorded digest), reading only their token ids, commits
    /// them and records them as captures of this dataset too. Returns the units left to
    /// convert, and whether some of those had samples copied or held already (the lanes then
    /// skip those).
    fn reuse_captured(
        &mut self,
        c: &Captures,
        decoder: &Decoder,
        todo: Vec<Unit>,
        writer: &mut DatasetWriter,
    ) -> Result<(Vec<Unit>, bool), RunError> {
        if c.store.capture_names()?.is_empty() {
            return Ok((todo, false)); // nothing recorded: no file is opened twice
        }
        // A unit whose token ids cannot be read is converted, and reported bad there.
        let keys: Vec<_> = crate::parallel::install(|| {
            todo.par_iter()
                .map(|u| decoder.capture_keys(u, &c.config).ok())
                .collect()
        });
        let items: Vec<(String, [u8; 32])> = keys.iter().flatten().flatten().cloned().collect();
        // Keys the dataset holds (a rerun) are not copied again: the lanes compare those
        // samples with the sources and skip them.
        let held: Vec<bool> = items.iter().map(|(k, _)| writer.contains_key(k)).collect();
        let fresh: Vec<(String, [u8; 32])> = items
            .iter()
            .zip(&held)
            .filter(|(_, &h)| !h)
            .map(|(item, _)| item.clone())
            .collect();
        let (fresh_digests, stats) = reuse_captured(&c.store, writer, &fresh)?;
        let mut fresh_digests = fresh_digests.into_iter();
        let digests: Vec<Option<[u8; 32]>> = held
            .iter()
            .map(|&h| match h {
                true => None,
                false => fresh_digests.next().flatten(),
            })
            .collect();
        let records: Vec<([u8; 32], [u8; 32], String)> = items
            .iter()
            .zip(&digests)
            .filter_map(|((key, capture), d)| d.map(|d| (*capture, d, key.clone())))
            .collect();
        if !records.is_empty() {
            writer.commit()?;
            c.store.record_captures(&c.name, &records)?;
        }
        self.report.samples_reused += stats.reused;
        self.report.captures_stale += stats.stale;
        let mut copied = digests.iter().map(Option::is_some);
        let (mut rest, mut reused, mut partly) = (Vec::new(), Vec::new(), false);
        for (unit, keys) in todo.into_iter().zip(&keys) {
            let n = keys.as_ref().map_or(0, Vec::len);
            let got = copied.by_ref().take(n).filter(|&c| c).count();
            if n > 0 && got == n {
                reused.push(unit);
            } else {
                partly |= got > 0;
                rest.push(unit);
            }
        }
        self.report.reused = reused.len() as u64;
        if self.o.delete_source && !reused.is_empty() {
            self.verify_new(writer.stats().shards)?;
            // A file is deleted only where the dataset holds its bytes: its hidden states,
            // never read to reuse the capture, are read and compared now.
            let copied: HashMap<&str, [u8; 32]> = items
                .iter()
                .zip(&digests)
                .filter_map(|((key, _), d)| Some((key.as_str(), (*d)?)))
                .collect();
            let same: Vec<bool> = crate::parallel::install(|| {
                reused
                    .par_iter()
                    .map(|unit| {
                        decoder.sample_digests(unit).is_ok_and(|d| {
                            d.iter()
                                .all(|(key, digest)| copied.get(key.as_str()) == Some(digest))
                        })
                    })
                    .collect()
            });
            for (unit, same) in reused.iter().zip(same) {
                match same {
                    true => self.delete(unit)?,
                    false => self.report.kept += 1,
                }
            }
        }
        Ok((rest, partly || held.contains(&true)))
    }

    /// Hashes every chunk of the shards committed since the last check.
    fn verify_new(&mut self, shards: u64) -> Result<(), RunError> {
        if shards <= self.verified {
            return Ok(());
        }
        let ds = Dataset::open(&self.o.dst)?;
        let schema = ds.schema().clone();
        for seq in self.verified..shards {
            let shard = ds.shard_apart(seq as usize).map_err(RunError::Verify)?;
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
        // Written again under its name since the run read it (another process producing
        // dumps): the dataset holds the bytes read, not these, so they stay.
        if unit.identity().is_empty() || unit.identity_now() != unit.identity() {
            self.report.kept += 1;
            return Ok(());
        }
        for path in unit.own_files() {
            match std::fs::remove_file(path) {
                Ok(()) => {
                    failpoint!("convert-source-deleted");
                    self.report.deleted += 1;
                    // A folder the deletion emptied goes too: never the source folder, nor
                    // one that holds it (the folder of a source that is one file).
                    if let Some(dir) = path.parent().filter(|d| !self.o.src.starts_with(d)) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Two runs into one new folder: the one that failed on the other's lock cleaned up as if
    /// the dataset were its own, deleting the other's manifest and the shard it was writing.
    #[test]
    fn a_failed_runs_cleanup_leaves_a_dataset_another_writer_holds() {
        let t = tempfile::tempdir().unwrap();
        let dst = t.path().join("ds");
        let schema = crate::synth::capture_schema("m", 4, 64, &[1, 2]);
        let mut rng = crate::synth::Rng::new(7);
        let scales: Vec<_> = (0..2)
            .map(|_| crate::synth::channel_scales(&mut rng, 64))
            .collect();
        let mut w = crate::DatasetWriter::create(&dst, schema, Default::default()).unwrap();
        let sample = crate::synth::named_capture_sample(&mut rng, 40, &[1, 2], &scales);
        let fields: Vec<(&str, &[u8])> = sample
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        w.append("a", &fields).unwrap();
        remove_empty_dataset(&dst, &dst.join(REPORT_FILE), false);
        assert!(dst.join(MANIFEST_FILE).exists());
        w.finish().unwrap();
        assert_eq!(Dataset::open(&dst).unwrap().len(), 1);
        // Once no writer holds it, an empty dataset a failed run made goes, folder and all.
        let empty = t.path().join("empty");
        crate::DatasetWriter::create(
            &empty,
            crate::synth::capture_schema("m", 4, 64, &[1]),
            Default::default(),
        )
        .unwrap()
        .finish()
        .unwrap();
        remove_empty_dataset(&empty, &empty.join(REPORT_FILE), false);
        assert!(!empty.exists());
    }
}
