//! Sample keys taken from a value stored in each file (`--key-from NAME`), and the log that
//! lets a rerun resume without opening converted files and refuse two files with one key.
//!
//! A stored key is a Python `str` or `int` (ModelOpt's `conversation_id`, copied from the
//! input JSONL), or an integer tensor of one element. The log, `convert-keys.jsonl` in the
//! dataset folder, holds one line `{"unit": ..., "key": ..., "files": ...}` per converted unit
//! (its source path without extension, the key it gave: the stored one, else its file name's,
//! and its files' identity), written and flushed before the unit's samples are appended, and
//! made durable before they are committed (where commits are), so every committed key has its
//! line. Every run into a local dataset folder keeps it, with
//! `--key-from` or without: a held key is trusted as the resume it is only where the log says
//! the unit's files, as they are, gave it.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use super::pickle::Value;
use super::units::Inputs;
use super::{ConvertError, SourceFile};
use crate::format::DType;

/// File name of the key log, in the dataset folder.
pub const KEYS_FILE: &str = "convert-keys.jsonl";

/// The keys a unit's files store under `--key-from NAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoredKeys {
    /// One key for the unit (samples `KEY/0`, `KEY/1`, ... when it is split).
    One(String),
    /// One key per request of a split unit, in order (a list of ids, or a 1-D integer tensor).
    PerRequest(Vec<String>),
}

/// Why a unit's stored key cannot be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The file holding the value could not be read, or the group lacks its part.
    #[error(transparent)]
    Source(#[from] ConvertError),
    /// The value under `--key-from NAME` is absent or not a key.
    #[error("{}: --key-from {name}: {problem}", file.display())]
    Value {
        /// The file that holds, or lacks, the value.
        file: PathBuf,
        /// The `--key-from` name.
        name: String,
        /// What is wrong and what to give.
        problem: KeyProblem,
    },
}

/// What is wrong with a stored key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyProblem {
    /// No value of that name in the file.
    #[error(
        "the file holds no value `{inner}`; name a value every file holds, or leave \
         --key-from out to key samples by file name"
    )]
    NoValue {
        /// The name inside the file.
        inner: String,
    },
    /// In a group, the value named without its part.
    #[error(
        "in a group of files, values are named PART.NAME like the fields' tensors: give \
         --key-from {part}.{name}"
    )]
    Unqualified {
        /// The part whose file holds the value.
        part: String,
        /// The name given.
        name: String,
    },
    /// In a group, no part holds the value.
    #[error(
        "no part of this group holds it; in a group of files, values are named PART.NAME \
         (the parts here: {parts})"
    )]
    NoPart {
        /// The group's parts, comma-separated.
        parts: String,
    },
    /// A list of ids for a file that is not split.
    #[error(
        "the value is {kind} of {count} ids, one per request: give --split-by to split the \
         file into its requests, each keyed by its id; without it, name a str, an int or a \
         one-element integer tensor"
    )]
    ListUnsplit {
        /// `a list` or `a tuple`.
        kind: &'static str,
        /// Its length.
        count: usize,
    },
    /// An entry of a list of ids that is not one.
    #[error("entry {index} is {kind}, not a str or an int")]
    Entry {
        /// Its place in the list.
        index: usize,
        /// What it is.
        kind: &'static str,
    },
    /// A value that is no key.
    #[error(
        "the value is {kind}, not a str, an int, a one-element integer tensor, or (with \
         --split-by) a list of ids; name another value"
    )]
    NotAKey {
        /// What it is.
        kind: &'static str,
    },
    /// A tensor that holds no key.
    #[error(
        "tensor `{inner}` is {dtype} {shape:?}; a key tensor holds one integer, or (with \
         --split-by) one integer per request"
    )]
    Tensor {
        /// The tensor's name inside the file.
        inner: String,
        /// Its dtype.
        dtype: DType,
        /// Its shape.
        shape: Vec<u64>,
    },
    /// Not one id per request.
    #[error(
        "holds {ids} ids but the file splits into {requests} requests; every request needs its id"
    )]
    Count {
        /// Ids stored.
        ids: usize,
        /// Requests of the file.
        requests: usize,
    },
    /// One id for two requests.
    #[error("id `{id}` is there twice; every request needs its own id")]
    Twice {
        /// The id.
        id: String,
    },
    /// An empty key.
    #[error("the stored key is empty; every sample needs a key")]
    Empty,
}

impl KeyError {
    /// The file the error is about.
    pub fn file(&self) -> &Path {
        match self {
            KeyError::Source(e) => e.file(),
            KeyError::Value { file, .. } => file,
        }
    }

    /// True when the file holds no value under the name (rather than one that does not key
    /// samples): on the first unit read, the flag's mistake, not the file's.
    pub fn is_no_value(&self) -> bool {
        matches!(
            self,
            KeyError::Value {
                problem: KeyProblem::NoValue { .. },
                ..
            }
        )
    }

    /// The message without the file it starts with.
    pub fn detail(&self) -> String {
        match self {
            KeyError::Source(e) => e.detail(),
            KeyError::Value { name, problem, .. } => format!("--key-from {name}: {problem}"),
        }
    }
}

/// A [`KeyError`] about the value `name` in `file`.
fn problem(file: &Path, name: &str, problem: KeyProblem) -> KeyError {
    KeyError::Value {
        file: file.to_path_buf(),
        name: name.to_string(),
        problem,
    }
}

/// The key(s) stored under `name` in the unit's files (dotted for nested dicts and lists).
/// `requests` is the number of requests when the unit is split: a list, tuple or 1-D tensor
/// then gives one key per request. In a group of files, `name` is `PART.NAME` (or `PART` for
/// a file holding only the value), as field sources are; errors name the file that holds, or
/// lacks, the value.
pub fn stored_keys(
    inputs: &Inputs,
    name: &str,
    requests: Option<usize>,
) -> Result<StoredKeys, KeyError> {
    let grouped = inputs.files().iter().any(|(p, _)| !p.is_empty());
    for (part, f) in inputs.files() {
        let Some(inner) = super::units::in_part(part, name) else {
            continue;
        };
        let no_value = || {
            problem(
                f.path(),
                name,
                KeyProblem::NoValue {
                    inner: inner.to_string(),
                },
            )
        };
        if let Some(t) = f.as_torch() {
            let mut v = Some(t.value());
            for seg in inner.split('.').filter(|_| !inner.is_empty()) {
                v = v.and_then(|v| match v {
                    Value::Dict(_) => v.get(seg),
                    _ => seg.parse::<usize>().ok().and_then(|i| v.items()?.get(i)),
                });
            }
            let Some(v) = v else {
                if grouped {
                    return Err(no_value());
                }
                continue;
            };
            return value_keys(f, name, inner, v, requests);
        }
        if f.tensors().iter().any(|t| t.name == inner) {
            return tensor_keys(f, name, inner, requests);
        }
        if grouped {
            return Err(no_value());
        }
    }
    if let Some(missing) = inputs.missing_part_of(name) {
        return Err(missing.into());
    }
    Err(misnamed(inputs, name).unwrap_or_else(|| {
        problem(
            inputs.path(),
            name,
            KeyProblem::NoValue {
                inner: name.to_string(),
            },
        )
    }))
}

/// Why `name` names no value in a group of files whose parts it does not start with, as
/// `--key-from rids` for the `meta` part's `rids`; `None` when it does, or the files are not
/// grouped. A mistake in the flag, found on the first unit.
pub fn misnamed(inputs: &Inputs, name: &str) -> Option<KeyError> {
    let grouped = inputs.files().iter().any(|(p, _)| !p.is_empty());
    let in_a_part = inputs
        .files()
        .iter()
        .any(|(part, _)| super::units::in_part(part, name).is_some());
    if !grouped || in_a_part || inputs.missing_part_of(name).is_some() {
        return None;
    }
    // The value under its bare name in one part: say how to name it.
    for (part, f) in inputs.files() {
        let held = match f.as_torch() {
            Some(t) => t.value().get(name).is_some(),
            None => f.tensors().iter().any(|t| t.name == name),
        };
        if held {
            return Some(problem(
                f.path(),
                name,
                KeyProblem::Unqualified {
                    part: part.clone(),
                    name: name.to_string(),
                },
            ));
        }
    }
    let parts: Vec<&str> = inputs.files().iter().map(|(p, _)| p.as_str()).collect();
    Some(problem(
        inputs.path(),
        name,
        KeyProblem::NoPart {
            parts: parts.join(", "),
        },
    ))
}

fn value_keys(
    f: &SourceFile,
    name: &str,
    inner: &str,
    v: &Value,
    requests: Option<usize>,
) -> Result<StoredKeys, KeyError> {
    let at = |p| problem(f.path(), name, p);
    let one = |key: String| check(key).map(StoredKeys::One).map_err(at);
    match v {
        Value::Str(s) => one(s.clone()),
        Value::Int(i) => one(i.to_string()),
        Value::Tensor(_) => tensor_keys(f, name, inner, requests),
        Value::List(items) | Value::Tuple(items) => {
            let Some(n) = requests else {
                return Err(at(KeyProblem::ListUnsplit {
                    kind: v.kind(),
                    count: items.len(),
                }));
            };
            let mut keys = Vec::with_capacity(items.len());
            for (index, item) in items.iter().enumerate() {
                keys.push(match item {
                    Value::Str(s) => s.clone(),
                    Value::Int(i) => i.to_string(),
                    other => {
                        return Err(at(KeyProblem::Entry {
                            index,
                            kind: other.kind(),
                        }))
                    }
                });
            }
            per_request(keys, n).map_err(at)
        }
        other => Err(at(KeyProblem::NotAKey { kind: other.kind() })),
    }
}

/// One key per request, checked: as many as requests, none empty, none twice.
fn per_request(keys: Vec<String>, requests: usize) -> Result<StoredKeys, KeyProblem> {
    if keys.len() != requests {
        return Err(KeyProblem::Count {
            ids: keys.len(),
            requests,
        });
    }
    let mut seen = std::collections::HashSet::with_capacity(keys.len());
    for k in &keys {
        check(k.clone())?;
        if !seen.insert(k.as_str()) {
            return Err(KeyProblem::Twice { id: k.clone() });
        }
    }
    Ok(StoredKeys::PerRequest(keys))
}

fn check(key: String) -> Result<String, KeyProblem> {
    if key.is_empty() {
        return Err(KeyProblem::Empty);
    }
    Ok(key)
}

fn tensor_keys(
    f: &SourceFile,
    name: &str,
    inner: &str,
    requests: Option<usize>,
) -> Result<StoredKeys, KeyError> {
    let t = f.tensor(inner)?;
    let ints = t.dtype.ints(&t.bytes).filter(|_| t.dtype != DType::Bool);
    let bad = || {
        problem(
            f.path(),
            name,
            KeyProblem::Tensor {
                inner: inner.to_string(),
                dtype: t.dtype,
                shape: t.shape.clone(),
            },
        )
    };
    let ints = ints.ok_or_else(bad)?;
    match requests {
        // A 1-D tensor of one id for a batch of several is one key, for all its requests.
        Some(n) if t.shape.len() == 1 && (ints.len() != 1 || n == 1) => {
            per_request(ints.iter().map(i64::to_string).collect(), n)
                .map_err(|p| problem(f.path(), name, p))
        }
        _ if ints.len() == 1 => Ok(StoredKeys::One(ints[0].to_string())),
        _ => Err(bad()),
    }
}

/// The key log of a dataset folder: which unit gave which stored key.
#[derive(Debug)]
pub struct KeyLog {
    path: PathBuf,
    /// A unit's key, and the identity of its files when it gave it.
    by_unit: HashMap<String, (String, String)>,
    by_key: HashMap<String, (String, PathBuf)>,
    file: Option<std::fs::File>,
    /// How this run keys samples ([`KeyLog::open`]), written on each line.
    keyed: String,
    /// Another way earlier runs keyed samples, where one did.
    keyed_before: Option<String>,
    /// How this run splits files into requests: its `--split-by` and `--split-by-file` flags,
    /// empty for none; written on each line.
    split: String,
    /// Another split earlier runs made, where one did.
    split_before: Option<String>,
    /// The id of the dataset the lines are of, once known ([`KeyLog::bind`]), written on each
    /// line.
    dataset: Option<String>,
}

/// One line of the log.
#[derive(serde::Serialize, serde::Deserialize)]
struct Line {
    unit: String,
    /// Named in messages only (a name that is not UTF-8 kept as text).
    #[serde(serialize_with = "super::report::lossy_path")]
    file: PathBuf,
    key: String,
    /// The identity of the unit's files ([`Unit::identity`]); absent in logs of earlier
    /// versions, whose units are read again.
    #[serde(default)]
    files: String,
    /// How the run keyed samples: `name` (file names) or `key-from NAME`; absent in logs of
    /// earlier versions.
    #[serde(default)]
    keyed: String,
    /// How the run split files into requests ([`KeyLog::split`]); absent (not known) in logs
    /// of earlier versions.
    #[serde(default)]
    split: Option<String>,
    /// The id of the dataset the unit's samples went into; absent in logs of earlier versions.
    #[serde(default)]
    dataset: Option<String>,
}

impl KeyLog {
    /// Reads the log in `dst` (empty when there is none), for a run keying samples by
    /// `key_from` (the value named), else by file name, and splitting files as `split` says
    /// (its flags, empty for none), into dataset `dataset` (its id; `None` where there is
    /// none yet). A log of another dataset (one removed, whose name was given again) names
    /// nothing in this one: it is deleted, and this run starts a new one.
    pub fn open(
        dst: &Path,
        key_from: Option<&str>,
        split: &str,
        dataset: Option<&str>,
    ) -> Result<KeyLog, std::io::Error> {
        let path = dst.join(KEYS_FILE);
        let keyed = match key_from {
            Some(name) => format!("key-from {name}"),
            None => "name".to_string(),
        };
        let mut log = KeyLog {
            path,
            by_unit: HashMap::new(),
            by_key: HashMap::new(),
            file: None,
            keyed,
            keyed_before: None,
            split: split.to_string(),
            split_before: None,
            dataset: dataset.map(String::from),
        };
        let f = match crate::io::local::open_regular(&log.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(log),
            Err(e) => return Err(e),
        };
        for line in std::io::BufReader::new(f).lines() {
            // A line cut by a crash is the last one, of a unit that was not appended.
            let Ok(l) = serde_json::from_str::<Line>(&line?) else {
                continue;
            };
            if l.dataset.is_some() && l.dataset.as_deref() != dataset {
                std::fs::remove_file(&log.path)?;
                return KeyLog::open(dst, key_from, split, dataset);
            }
            if !l.keyed.is_empty() && l.keyed != log.keyed {
                log.keyed_before.get_or_insert(l.keyed.clone());
            }
            if let Some(before) = l.split.filter(|s| *s != log.split) {
                log.split_before.get_or_insert(before);
            }
            log.by_key.insert(l.key.clone(), (l.unit.clone(), l.file));
            log.by_unit.insert(l.unit, (l.key, l.files));
        }
        Ok(log)
    }

    /// Names the dataset the lines written from now on are of: the one this run made, where
    /// there was none when the log was opened.
    pub fn bind(&mut self, dataset: &str) {
        self.dataset = Some(dataset.to_string());
    }

    /// The split earlier runs made (their `--split-by` and `--split-by-file` flags, empty for
    /// none), where it is not this run's: resumed, the files converted before would be
    /// appended again as other samples.
    pub fn split_before(&self) -> Option<&str> {
        self.split_before.as_deref()
    }

    /// How an earlier run keyed samples, where it did otherwise than this one: resumed, the
    /// same files would be appended again under other keys.
    pub fn keyed_before(&self) -> Option<&str> {
        self.keyed_before.as_deref()
    }

    /// The path of the log.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Makes the lines written so far durable (`fdatasync`): before a commit whose samples
    /// they name, so a power cut cannot keep the samples and lose their lines.
    pub fn sync(&self) -> Result<(), std::io::Error> {
        match &self.file {
            Some(f) => f.sync_data(),
            None => Ok(()),
        }
    }

    /// The key `unit` gave in an earlier run, while its files are the same (`files`, their
    /// [`Unit::identity`]): a file written again under its name is read again.
    pub fn key_of(&self, unit: &str, files: &str) -> Option<&str> {
        self.by_unit
            .get(unit)
            .filter(|(_, was)| !was.is_empty() && was == files)
            .map(|(key, _)| key.as_str())
    }

    /// The unit that gave `key`, and its first file.
    pub fn unit_of(&self, key: &str) -> Option<(&str, &Path)> {
        self.by_key.get(key).map(|(u, f)| (u.as_str(), f.as_path()))
    }

    /// Records that `unit` (first file `file`, its files' identity `files`) gives `key`,
    /// flushed to the log before its samples are appended.
    pub fn record(
        &mut self,
        unit: &str,
        file: &Path,
        files: &str,
        key: &str,
    ) -> Result<(), std::io::Error> {
        if self.key_of(unit, files) == Some(key) {
            return Ok(());
        }
        let f = match &mut self.file {
            Some(f) => f,
            None => {
                if let Some(dir) = self.path.parent() {
                    std::fs::create_dir_all(dir)?;
                }
                self.file.insert(
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&self.path)?,
                )
            }
        };
        let line = serde_json::to_string(&Line {
            unit: unit.to_string(),
            file: file.to_path_buf(),
            key: key.to_string(),
            files: files.to_string(),
            keyed: self.keyed.clone(),
            split: Some(self.split.clone()),
            dataset: self.dataset.clone(),
        })
        .unwrap_or_default();
        // A previous line cut by a crash would swallow this one: start on a fresh line.
        writeln!(f, "\n{line}")?;
        f.flush()?;
        self.by_key
            .insert(key.to_string(), (unit.to_string(), file.to_path_buf()));
        self.by_unit
            .insert(unit.to_string(), (key.to_string(), files.to_string()));
        Ok(())
    }
}
