//! The legacy `torch.save` stream (`_use_new_zipfile_serialization=False`, and torch < 1.6).
//!
//! Layout: a pickled magic number `0x1950a86a20f9469cfc6c`, the pickled protocol version
//! `1001`, a pickled `sys_info` dict, the main pickle, a pickled list of storage keys, then
//! for each key in that order a little-endian `int64` element count followed by the
//! storage's raw little-endian bytes. The older tar container is recognised and refused.

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;

use super::bytes::Cursor;
use super::pickle::{self, Value};
use super::ConvertError;

/// The magic number as the little-endian bytes of a pickled `LONG1`.
pub const MAGIC: [u8; 10] = [0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19];

/// The legacy stream protocol version.
pub const PROTOCOL_VERSION: i64 = 1001;

/// A parsed legacy stream. Holds offsets only; the bytes stay in the caller's buffer.
#[derive(Debug, Clone)]
pub struct LegacyFile {
    /// The main pickle's value.
    pub value: Value,
    /// The `sys_info` dict.
    pub sys_info: Value,
    /// Byte range of each storage's data, by key.
    pub storages: HashMap<String, Range<usize>>,
}

/// Whether `bytes` is a tar archive (the container torch used before 0.4).
pub fn is_tar(bytes: &[u8]) -> bool {
    bytes.get(257..262) == Some(b"ustar")
}

/// Whether `bytes` starts with a pickled legacy magic number, in binary (`LONG1`, any
/// protocol >= 2) or text (`LONG`, protocols 0 and 1) form. [`LegacyFile::parse`] checks
/// it properly.
pub fn has_magic(bytes: &[u8]) -> bool {
    let head = bytes.get(..bytes.len().min(48)).unwrap_or(&[]);
    let mut binary = [0u8; 12];
    binary[0] = 0x8a;
    binary[1] = 0x0a;
    binary[2..].copy_from_slice(&MAGIC);
    head.windows(binary.len()).any(|w| w == binary)
        || head.windows(24).any(|w| w == b"119547037146038801333356")
}

impl LegacyFile {
    /// Parses a legacy stream held in `bytes`. `file` names it in errors.
    pub fn parse(bytes: &[u8], file: &Path) -> Result<LegacyFile, ConvertError> {
        if is_tar(bytes) {
            return Err(ConvertError::LegacyTarFormat {
                file: file.to_path_buf(),
            });
        }
        let mut pos = 0;
        let mut loaded = Vec::new();
        let mut next = |what: &'static str| -> Result<(Value, usize), ConvertError> {
            let rest = bytes.get(pos..).unwrap_or(&[]);
            let (v, used, storages) =
                pickle::parse_prefix(rest, file).map_err(|e| with_context(e, what))?;
            loaded.extend(storages);
            let at = pos;
            pos += used;
            Ok((v, at))
        };
        let (magic, _) = next("magic number")?;
        if magic != Value::BigInt(MAGIC.to_vec()) {
            return Err(ConvertError::UnknownFormat {
                file: file.to_path_buf(),
            });
        }
        let (proto, at) = next("protocol version")?;
        if proto != Value::Int(PROTOCOL_VERSION) {
            return Err(ConvertError::malformed(
                file,
                "torch legacy protocol version",
                at,
                format!("expected {PROTOCOL_VERSION}, found {proto:?}"),
            ));
        }
        let (sys_info, _) = next("sys_info")?;
        let (value, _) = next("main pickle")?;
        let (keys, at) = next("storage keys")?;
        let keys: Vec<String> = keys
            .items()
            .and_then(|items| {
                items
                    .iter()
                    .map(|k| k.as_str().map(str::to_string))
                    .collect()
            })
            .ok_or_else(|| {
                ConvertError::malformed(
                    file,
                    "torch legacy storage keys",
                    at,
                    "not a list of strings",
                )
            })?;

        // Sized by every storage a persistent id named, not only those the value holds: the
        // file holds the bytes of all of them, in the order of `keys`.
        let mut sizes: HashMap<&str, u64> = HashMap::new();
        for s in &loaded {
            sizes.entry(s.key.as_str()).or_insert(s.kind.element_size);
        }
        let mut cur = Cursor::new(bytes, pos, file);
        let mut storages = HashMap::with_capacity(keys.len().min(bytes.len()));
        for key in keys {
            let elem = *sizes
                .get(key.as_str())
                .ok_or_else(|| ConvertError::Missing {
                    file: file.to_path_buf(),
                    what: "storage",
                    key: key.clone(),
                })?;
            let start = cur.pos();
            let what = format!("storage {key:?}");
            let numel = cur.u64(&what)?;
            let nbytes = numel.saturating_mul(elem);
            let n = cur.bounded_len(nbytes, start, &what)?;
            let data_start = cur.pos();
            cur.take(n, &what)?;
            storages.insert(key, data_start..data_start + n);
        }
        Ok(LegacyFile {
            value,
            sys_info,
            storages,
        })
    }
}

fn with_context(e: ConvertError, what: &'static str) -> ConvertError {
    match e {
        ConvertError::Truncated {
            file,
            what: inner,
            offset,
            needed,
            len,
        } => ConvertError::Truncated {
            file,
            what: format!("{inner} in the legacy {what}"),
            offset,
            needed,
            len,
        },
        other => other,
    }
}
