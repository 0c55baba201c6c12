//! A named dataset of a store (FORMAT.md §11.5): `datasets/<NAME>.json`, the list of the
//! dataset's files and the blob that holds each (a shard: its skeleton's).

use serde::{Deserialize, Serialize};

use crate::format::FormatError;

/// The `format` of a named dataset's file.
pub const SNAPSHOT_FORMAT: &str = "hspack-store-dataset";

/// One file of a stored dataset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileRecord {
    /// File name in the dataset.
    pub name: String,
    /// Bytes of the file.
    pub bytes: u64,
    /// The blob holding it: the file itself, or a shard's skeleton.
    pub blob: String,
    /// True for a shard stored as a skeleton and its payload blobs.
    pub shard: bool,
}

/// `datasets/<NAME>.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Snapshot {
    /// [`SNAPSHOT_FORMAT`].
    pub format: String,
    /// 1.
    pub version: u32,
    /// The dataset's name in the store.
    pub name: String,
    /// Its files, by name.
    pub files: Vec<FileRecord>,
}

/// True for a name a store takes for a dataset: 1 to 128 of `A-Z a-z 0-9 . _ -`, not
/// starting with `.`.
pub fn is_dataset_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// The file of dataset `name` in the store's `datasets/` folder.
pub fn snapshot_file(name: &str) -> String {
    format!("{name}.json")
}

impl Snapshot {
    /// An empty dataset `name`.
    pub fn new(name: &str) -> Self {
        Snapshot {
            format: SNAPSHOT_FORMAT.into(),
            version: 1,
            name: name.into(),
            files: Vec::new(),
        }
    }

    /// Parses a named dataset's file, refusing another format or version, bad names, blob
    /// ids that are not 64 hex digits, and a file named twice.
    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        let bad = |detail: String| FormatError::Json {
            structure: "stored dataset",
            detail,
        };
        crate::format::version::refuse_unknown_version(bytes, "stored dataset", 1, 1)?;
        let s: Snapshot = serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
        if s.format != SNAPSHOT_FORMAT {
            return Err(bad(format!(
                "format is `{}`, not `{SNAPSHOT_FORMAT}`",
                s.format
            )));
        }
        if s.version != 1 {
            return Err(FormatError::UnsupportedVersion {
                structure: "stored dataset",
                found: s.version.into(),
                min: 1,
                max: 1,
            });
        }
        if !is_dataset_name(&s.name) {
            return Err(bad(format!("`{}` is not a dataset name", s.name)));
        }
        for w in s.files.windows(2) {
            if w[0].name >= w[1].name {
                return Err(bad(format!("files not sorted by name at `{}`", w[1].name)));
            }
        }
        for f in &s.files {
            if !crate::format::manifest::is_plain_file_name(&f.name) || blob_id(&f.blob).is_none() {
                return Err(bad(format!("file `{}` is not a file record", f.name)));
            }
        }
        Ok(s)
    }

    /// The canonical bytes (files sorted by name).
    pub fn encode(&self) -> Vec<u8> {
        let mut s = self.clone();
        s.files.sort_by(|a, b| a.name.cmp(&b.name));
        let mut v = serde_json::to_vec_pretty(&s).expect("serializable");
        v.push(b'\n');
        v
    }

    /// The record of file `name`.
    pub fn file(&self, name: &str) -> Option<&FileRecord> {
        self.files
            .binary_search_by(|f| f.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.files[i])
    }
}

/// A blob id from its 64 hex digits.
pub fn blob_id(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 {
        return None;
    }
    crate::format::manifest::unhex(text)?.try_into().ok()
}
