//! Sample keys taken from a value stored in each file (`--key-from NAME`), and the log that
//! lets a rerun resume without opening converted files and refuse two files with one key.
//!
//! A stored key is a Python `str` or `int` (ModelOpt's `conversation_id`, copied from the
//! input JSONL), or an integer tensor of one element. The log, `convert-keys.jsonl` in the
//! dataset folder, holds one line `{"unit": ..., "key": ...}` per converted unit (its source
//! path without extension, and the stored key), written and flushed before the unit's samples
//! are appended, so every committed key has its line.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use super::pickle::Value;
use super::units::Inputs;
use crate::format::DType;

/// File name of the key log, in the dataset folder.
pub const KEYS_FILE: &str = "convert-keys.jsonl";

/// The key stored under `name` in the unit's files (dotted for nested dicts and lists).
pub fn stored_key(inputs: &Inputs, name: &str) -> Result<String, String> {
    for (_, f) in inputs.files() {
        if let Some(t) = f.as_torch() {
            let mut v = Some(t.value());
            for seg in name.split('.') {
                v = v.and_then(|v| match v {
                    Value::Dict(_) => v.get(seg),
                    _ => seg.parse::<usize>().ok().and_then(|i| v.items()?.get(i)),
                });
            }
            let Some(v) = v else { continue };
            let key = match v {
                Value::Str(s) => s.clone(),
                Value::Int(i) => i.to_string(),
                Value::Tensor(_) => tensor_key(inputs, name)?,
                other => {
                    return Err(format!(
                        "--key-from {name}: the value is {}, not a str, an int or a one-element \
                         integer tensor; name another value",
                        kind(other)
                    ))
                }
            };
            return check(name, key);
        }
        if f.tensors().iter().any(|t| t.name == name) {
            return check(name, tensor_key(inputs, name)?);
        }
    }
    Err(format!(
        "--key-from {name}: the file holds no value `{name}`; name a value every file holds, or \
         leave --key-from out to key samples by file name"
    ))
}

fn check(name: &str, key: String) -> Result<String, String> {
    if key.is_empty() {
        return Err(format!(
            "--key-from {name}: the stored key is empty; every sample needs a key"
        ));
    }
    Ok(key)
}

fn tensor_key(inputs: &Inputs, name: &str) -> Result<String, String> {
    let t = inputs.tensor(name).map_err(|e| e.to_string())?;
    let n = t.dtype.size();
    let int = match (t.dtype, t.bytes.len() == n) {
        (_, false) => None,
        (DType::I64, true) => t
            .bytes
            .get(..8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap_or_default())),
        (DType::I32, true) => t
            .bytes
            .get(..4)
            .map(|b| i32::from_le_bytes(b.try_into().unwrap_or_default()) as i64),
        (DType::I16, true) => t
            .bytes
            .get(..2)
            .map(|b| i16::from_le_bytes(b.try_into().unwrap_or_default()) as i64),
        (DType::I8, true) => t.bytes.first().map(|&b| b as i8 as i64),
        (DType::U8, true) => t.bytes.first().map(|&b| b as i64),
        _ => None,
    };
    int.map(|i| i.to_string()).ok_or_else(|| {
        format!(
            "--key-from {name}: tensor `{name}` is {} {:?}; a key tensor holds one integer",
            t.dtype, t.shape
        )
    })
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::None => "None",
        Value::Bool(_) => "a bool",
        Value::BigInt(_) => "an int wider than 64 bits",
        Value::Float(_) => "a float",
        Value::Bytes(_) => "bytes",
        Value::List(_) => "a list",
        Value::Tuple(_) => "a tuple",
        Value::Dict(_) => "a dict",
        _ => "not a key",
    }
}

/// The key log of a dataset folder: which unit gave which stored key.
#[derive(Debug)]
pub struct KeyLog {
    path: PathBuf,
    by_unit: HashMap<String, String>,
    by_key: HashMap<String, (String, PathBuf)>,
    file: Option<std::fs::File>,
}

/// One line of the log.
#[derive(serde::Serialize, serde::Deserialize)]
struct Line {
    unit: String,
    file: PathBuf,
    key: String,
}

impl KeyLog {
    /// Reads the log in `dst` (empty when there is none).
    pub fn open(dst: &Path) -> Result<KeyLog, std::io::Error> {
        let path = dst.join(KEYS_FILE);
        let mut log = KeyLog {
            path,
            by_unit: HashMap::new(),
            by_key: HashMap::new(),
            file: None,
        };
        let f = match std::fs::File::open(&log.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(log),
            Err(e) => return Err(e),
        };
        for line in std::io::BufReader::new(f).lines() {
            // A line cut by a crash is the last one, of a unit that was not appended.
            if let Ok(l) = serde_json::from_str::<Line>(&line?) {
                log.by_key.insert(l.key.clone(), (l.unit.clone(), l.file));
                log.by_unit.insert(l.unit, l.key);
            }
        }
        Ok(log)
    }

    /// The path of the log.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The key a unit gave in an earlier run.
    pub fn key_of(&self, unit: &str) -> Option<&str> {
        self.by_unit.get(unit).map(String::as_str)
    }

    /// The unit that gave `key`, and its first file.
    pub fn unit_of(&self, key: &str) -> Option<(&str, &Path)> {
        self.by_key.get(key).map(|(u, f)| (u.as_str(), f.as_path()))
    }

    /// Records that `unit` (first file `file`) gives `key`, flushed to the log before its
    /// samples are appended.
    pub fn record(&mut self, unit: &str, file: &Path, key: &str) -> Result<(), std::io::Error> {
        if self.key_of(unit) == Some(key) {
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
        })
        .unwrap_or_default();
        // A previous line cut by a crash would swallow this one: start on a fresh line.
        writeln!(f, "\n{line}")?;
        f.flush()?;
        self.by_key
            .insert(key.to_string(), (unit.to_string(), file.to_path_buf()));
        self.by_unit.insert(unit.to_string(), key.to_string());
        Ok(())
    }
}
