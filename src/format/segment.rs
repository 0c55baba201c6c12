//! Segments (manifest version 4, FORMAT.md §6.3) and key runs (§6.4).
//!
//! A segment is an immutable JSON file holding the entries of a run of consecutive shards,
//! their key run and their samples table parts. The manifest lists segments, not shards, so a
//! commit writes what it adds plus a manifest whose size depends on the number of segments.

use serde::{Deserialize, Serialize};

use super::manifest::{hex, is_plain_file_name, unhex, ShardRecord, TableRecord};
use super::FormatError;

/// The `format` value of every segment file.
pub const SEGMENT_FORMAT: &str = "hspack-segment";
/// Segment file version.
pub const SEGMENT_VERSION: u16 = 1;
/// Largest segment file accepted (256 MiB).
pub const MAX_SEGMENT_BYTES: u64 = 256 << 20;
/// Highest segment level accepted.
pub const MAX_LEVEL: u8 = 32;
/// Bytes of one key run entry.
pub const KEY_RUN_ENTRY: usize = 16;

/// A segment as the manifest lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentRef {
    /// File name within the dataset folder.
    pub file: String,
    /// File length in bytes.
    pub bytes: u64,
    /// BLAKE3 of the file, hex.
    pub blake3: String,
    /// 0 for the segment of one commit; k + 1 for one that replaced 8 segments of level k.
    pub level: u8,
    /// Sequence number of its first shard.
    pub first_seq: u32,
    /// Shards it holds.
    pub shards: u32,
    /// Ordinal of its first sample.
    pub first_ordinal: u64,
    /// Samples it holds.
    pub samples: u64,
}

/// A file a segment names, with its length and BLAKE3.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRunRecord {
    /// File name within the dataset folder.
    pub file: String,
    /// File length in bytes: 16 × `entries`.
    pub bytes: u64,
    /// BLAKE3 of the file, hex.
    pub blake3: String,
    /// Entries: one per sample of the segment.
    pub entries: u64,
}

/// A segment file's contents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// Always `hspack-segment`.
    pub format: String,
    /// Segment file version.
    pub version: u16,
    /// The dataset's id, hex.
    pub dataset_id: String,
    /// As in the manifest's entry.
    pub level: u8,
    /// The shards' entries, in sequence order.
    pub shards: Vec<ShardRecord>,
    /// The key run.
    pub keys: KeyRunRecord,
    /// The samples table parts, in ordinal order.
    pub tables: Vec<TableRecord>,
}

/// What a loaded segment names besides its shards: the shards themselves join the manifest's
/// list ([`super::Manifest::shards`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SegmentFiles {
    /// The key run.
    pub keys: Option<KeyRunRecord>,
    /// The samples table parts, in ordinal order (shared: a writer's manifest is cheap to
    /// copy however many parts a segment lists).
    pub tables: std::sync::Arc<Vec<TableRecord>>,
}

impl Segment {
    /// The bytes of the segment file: pretty JSON and a final newline.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(self).expect("a segment always serializes");
        out.push(b'\n');
        out
    }

    /// The manifest's entry for this segment, whose file holds `bytes`. Its `samples`
    /// saturates at 2^64 - 1 where the shards' add up past it, which [`Segment::decode`]
    /// refuses.
    pub fn reference(&self, file: &str, bytes: &[u8]) -> SegmentRef {
        let first = self.shards.first();
        SegmentRef {
            file: file.to_string(),
            bytes: bytes.len() as u64,
            blake3: hex(blake3::hash(bytes).as_bytes()),
            level: self.level,
            first_seq: first.map_or(0, |s| s.seq),
            shards: self.shards.len() as u32,
            first_ordinal: first.map_or(0, |s| s.first_ordinal),
            samples: self.samples().unwrap_or(u64::MAX),
        }
    }

    /// Samples in all the shards, `None` where they add up to 2^64 or more.
    fn samples(&self) -> Option<u64> {
        self.shards
            .iter()
            .try_fold(0u64, |sum, s| sum.checked_add(s.samples))
    }

    /// Decodes the segment file `bytes` and checks it against the manifest's entry `at` and
    /// the dataset id (FORMAT.md §6.3). The shards' own rules are checked with the whole list
    /// ([`super::Manifest::validate`]).
    pub fn decode(bytes: &[u8], at: &SegmentRef, dataset_id: &str) -> Result<Self, FormatError> {
        const S: &str = "segment";
        let json = |detail: String| FormatError::Json {
            structure: S,
            detail: format!("{}: {detail}", at.file),
        };
        let invalid = |what, value: u64, rule: String| FormatError::Invalid {
            structure: S,
            what,
            value,
            rule: format!("{rule} ({})", at.file),
        };
        if bytes.len() as u64 != at.bytes {
            return Err(invalid(
                "file length",
                bytes.len() as u64,
                format!("{}, the manifest's `bytes`", at.bytes),
            ));
        }
        if hex(blake3::hash(bytes).as_bytes()) != at.blake3.to_ascii_lowercase() {
            return Err(json(
                "its BLAKE3 differs from the manifest's: the segment, or the manifest's record \
                 of it, is damaged; restore it from an intact copy with `hspack repair DATASET \
                 --from COPY`"
                    .into(),
            ));
        }
        super::version::refuse_unknown_version(
            bytes,
            S,
            SEGMENT_VERSION.into(),
            SEGMENT_VERSION.into(),
        )?;
        let s: Segment = serde_json::from_slice(bytes).map_err(|e| json(e.to_string()))?;
        if s.format != SEGMENT_FORMAT {
            return Err(json(format!(
                "`format` is {:?}, expected {SEGMENT_FORMAT:?}",
                s.format
            )));
        }
        if s.version != SEGMENT_VERSION {
            return Err(FormatError::UnsupportedVersion {
                structure: S,
                found: s.version.into(),
                min: SEGMENT_VERSION.into(),
                max: SEGMENT_VERSION.into(),
            });
        }
        if !s.dataset_id.eq_ignore_ascii_case(dataset_id) {
            return Err(json(format!(
                "`dataset_id` is {}, the manifest's is {dataset_id}",
                s.dataset_id
            )));
        }
        if s.level != at.level {
            return Err(invalid(
                "level",
                s.level.into(),
                format!("{}, the manifest's", at.level),
            ));
        }
        if s.samples().is_none() {
            let largest = s.shards.iter().map(|r| r.samples).max().unwrap_or(0);
            return Err(invalid(
                "shard samples",
                largest,
                "small enough that the total over the segment's shards stays below 2^64".into(),
            ));
        }
        let mine = s.reference(&at.file, bytes);
        for (what, found, want) in [
            ("shard count", mine.shards.into(), at.shards.into()),
            (
                "first shard seq",
                mine.first_seq.into(),
                at.first_seq.into(),
            ),
            ("first ordinal", mine.first_ordinal, at.first_ordinal),
            ("samples", mine.samples, at.samples),
        ] {
            if found != want {
                return Err(invalid(what, found, format!("{want}, the manifest's")));
            }
        }
        let keys = &s.keys;
        check_file(&keys.file, &keys.blake3, S)?;
        if keys.entries != at.samples {
            return Err(invalid(
                "key run entries",
                keys.entries,
                format!("{}, the segment's samples", at.samples),
            ));
        }
        if Some(keys.bytes) != keys.entries.checked_mul(KEY_RUN_ENTRY as u64) {
            return Err(invalid(
                "key run bytes",
                keys.bytes,
                format!("16 × {} entries", keys.entries),
            ));
        }
        let mut rows = 0u64;
        for t in &s.tables {
            check_file(&t.file, &t.blake3, S)?;
            rows = rows
                .checked_add(t.samples)
                .ok_or_else(|| invalid("table samples", t.samples, "a total below 2^64".into()))?;
        }
        if rows != at.samples {
            return Err(invalid(
                "table parts' samples",
                rows,
                format!("{}, the segment's samples", at.samples),
            ));
        }
        Ok(s)
    }

    /// Splits the segment into its shards and the files it names.
    pub fn into_parts(self) -> (Vec<ShardRecord>, SegmentFiles) {
        let files = SegmentFiles {
            keys: Some(self.keys),
            tables: std::sync::Arc::new(self.tables),
        };
        (self.shards, files)
    }
}

/// Checks that a file a segment or manifest names is a plain name with a hex BLAKE3.
pub(crate) fn check_file(
    file: &str,
    blake3: &str,
    structure: &'static str,
) -> Result<(), FormatError> {
    if !is_plain_file_name(file) || unhex(blake3).map(|b| b.len()) != Some(32) {
        return Err(FormatError::Json {
            structure,
            detail: format!("{file:?} needs a plain file name and 64 hex digits of blake3"),
        });
    }
    Ok(())
}

/// One entry of a key run: a sample's key hash and ordinal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct KeyRunEntry {
    /// First 8 bytes of BLAKE3 of the key ([`super::key_hash`]).
    pub hash: u64,
    /// The sample's ordinal in the dataset.
    pub ordinal: u64,
}

impl KeyRunEntry {
    /// The entry's 16 bytes.
    pub fn to_bytes(self) -> [u8; KEY_RUN_ENTRY] {
        let mut out = [0u8; KEY_RUN_ENTRY];
        out[..8].copy_from_slice(&self.hash.to_le_bytes());
        out[8..].copy_from_slice(&self.ordinal.to_le_bytes());
        out
    }

    /// The entry at the start of `bytes` (at least 16 of them).
    pub fn from_bytes(bytes: &[u8]) -> Self {
        let word = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(w)
        };
        KeyRunEntry {
            hash: word(0),
            ordinal: word(8),
        }
    }
}

/// The bytes of a key run of `entries`, which must be sorted.
pub fn encode_key_run(entries: &[KeyRunEntry]) -> Vec<u8> {
    entries.iter().flat_map(|e| e.to_bytes()).collect()
}

/// Decodes a whole key run and checks its rules (§6.4): whole entries, sorted, ordinals
/// within `ordinals`.
pub fn decode_key_run(
    bytes: &[u8],
    ordinals: std::ops::Range<u64>,
) -> Result<Vec<KeyRunEntry>, FormatError> {
    const S: &str = "key run";
    if !bytes.len().is_multiple_of(KEY_RUN_ENTRY) {
        return Err(FormatError::Invalid {
            structure: S,
            what: "length",
            value: bytes.len() as u64,
            rule: "a multiple of 16".into(),
        });
    }
    let entries: Vec<KeyRunEntry> = bytes
        .chunks_exact(KEY_RUN_ENTRY)
        .map(KeyRunEntry::from_bytes)
        .collect();
    if let Some(i) = entries.windows(2).position(|w| w[0] >= w[1]) {
        return Err(FormatError::Invalid {
            structure: S,
            what: "entry order",
            value: i as u64 + 1,
            rule: "entries sorted by (hash, ordinal), each once".into(),
        });
    }
    if let Some(e) = entries.iter().find(|e| !ordinals.contains(&e.ordinal)) {
        return Err(FormatError::Invalid {
            structure: S,
            what: "ordinal",
            value: e.ordinal,
            rule: format!("within the segment's ordinals {ordinals:?}"),
        });
    }
    Ok(entries)
}

/// The name of a segment file holding shards `first..=last`, with the tag of a writer holding a
/// lease or sharing the dataset.
pub fn segment_file_name(first: u32, last: u32, tag: Option<&str>) -> String {
    tagged("segment", first, last, tag, "json")
}

/// The name of a segment's key run.
pub fn key_run_file_name(first: u32, last: u32, tag: Option<&str>) -> String {
    tagged("keys", first, last, tag, "bin")
}

/// The name of the samples table part of a commit of shards `first..=last`.
pub fn table_part_file_name(first: u32, last: u32, tag: Option<&str>) -> String {
    tagged("samples", first, last, tag, "parquet")
}

/// True for the name of a segment file, key run or table part made by the writer whose names
/// carry `tag`.
pub fn is_tagged(name: &str, tag: &str) -> bool {
    let tag = super::manifest::lease_in_name(tag);
    name.rsplit_once('.')
        .and_then(|(stem, _)| stem.strip_suffix(tag))
        .is_some_and(|rest| rest.ends_with('-'))
}

fn tagged(stem: &str, first: u32, last: u32, tag: Option<&str>, ext: &str) -> String {
    match tag {
        None => format!("{stem}-{first:06}-{last:06}.{ext}"),
        Some(tag) => format!(
            "{stem}-{first:06}-{last:06}-{}.{ext}",
            super::manifest::lease_in_name(tag)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_tagged_by_the_writer_that_made_it_only() {
        let lease = "0123456789abcdef0123456789abcdef";
        for name in [
            segment_file_name(0, 3, Some(lease)),
            key_run_file_name(4, 4, Some(lease)),
            table_part_file_name(4, 4, Some(lease)),
        ] {
            assert!(is_tagged(&name, lease), "{name}");
            assert!(
                !is_tagged(&name, "fedcba9876543210fedcba9876543210"),
                "{name}"
            );
        }
        assert!(!is_tagged(&segment_file_name(0, 3, None), lease));
        assert!(!is_tagged(
            "segment-000000-000003-x0123456789abcdef.json",
            "0123456789abcdef"
        ));
    }

    fn segment() -> Segment {
        Segment {
            format: SEGMENT_FORMAT.into(),
            version: SEGMENT_VERSION,
            dataset_id: hex(&[7; 16]),
            level: 0,
            shards: vec![ShardRecord {
                file: "shard-000000.hsp".into(),
                seq: 0,
                bytes: 4096,
                index_blake3: hex(&[1; 32]),
                first_ordinal: 0,
                samples: 3,
                chunks: 3,
                raw_bytes: 12,
            }],
            keys: KeyRunRecord {
                file: key_run_file_name(0, 0, None),
                bytes: 48,
                blake3: hex(&[2; 32]),
                entries: 3,
            },
            tables: vec![TableRecord {
                file: table_part_file_name(0, 0, None),
                bytes: 100,
                blake3: hex(&[3; 32]),
                samples: 3,
            }],
        }
    }

    #[test]
    fn round_trips_and_checks_against_its_entry() {
        let s = segment();
        let bytes = s.encode();
        let at = s.reference("segment-000000-000000.json", &bytes);
        let id = hex(&[7; 16]);
        assert_eq!(Segment::decode(&bytes, &at, &id).unwrap(), s);
        let mut other = at.clone();
        other.samples = 4;
        assert!(Segment::decode(&bytes, &other, &id).is_err());
        let mut other = at.clone();
        other.level = 1;
        assert!(Segment::decode(&bytes, &other, &id).is_err());
        assert!(Segment::decode(&bytes, &at, &hex(&[8; 16])).is_err());
        let mut damaged = bytes.clone();
        damaged[10] ^= 1;
        assert!(Segment::decode(&damaged, &at, &id).is_err());
        for change in [
            (|s: &mut Segment| s.keys.entries = 4) as fn(&mut Segment),
            |s| s.keys.bytes = 47,
            |s| s.tables[0].samples = 2,
            |s| s.keys.file = "../x".into(),
            |s| s.version = 2,
            |s| s.format = "x".into(),
        ] {
            let mut bad = segment();
            change(&mut bad);
            let bytes = bad.encode();
            let at = SegmentRef {
                samples: 3,
                ..bad.reference("s.json", &bytes)
            };
            assert!(Segment::decode(&bytes, &at, &id).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn key_runs_must_be_sorted_and_in_range() {
        let entries = [
            KeyRunEntry {
                hash: 1,
                ordinal: 5,
            },
            KeyRunEntry {
                hash: 1,
                ordinal: 6,
            },
            KeyRunEntry {
                hash: 9,
                ordinal: 4,
            },
        ];
        let bytes = encode_key_run(&entries);
        assert_eq!(decode_key_run(&bytes, 4..7).unwrap(), entries);
        assert!(decode_key_run(&bytes, 5..7).is_err());
        assert!(decode_key_run(&bytes[1..], 4..7).is_err());
        let swapped = encode_key_run(&[entries[1], entries[0], entries[2]]);
        assert!(decode_key_run(&swapped, 4..7).is_err());
        let twice = encode_key_run(&[entries[0], entries[0]]);
        assert!(decode_key_run(&twice, 4..7).is_err());
    }

    #[test]
    fn names_carry_the_range_and_the_tag() {
        assert_eq!(segment_file_name(0, 7, None), "segment-000000-000007.json");
        assert_eq!(
            key_run_file_name(8, 8, Some("0123456789abcdef0123")),
            "keys-000008-000008-0123456789abcdef.bin"
        );
        assert_eq!(
            table_part_file_name(1, 2, None),
            "samples-000001-000002.parquet"
        );
    }
}
