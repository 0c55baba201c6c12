//! The manifest: the root of trust of a dataset.
//!
//! It names every committed shard with its size, the BLAKE3 of its index (which holds the
//! BLAKE3 of every chunk) and its sample range, plus the schema and the samples table. The
//! dataset digest is the BLAKE3 of the manifest's bytes.

use serde::{Deserialize, Serialize};

use super::{FormatError, Schema, MIN_VERSION};

/// Newest manifest version this code reads. Version 2 adds stacked-layer fields
/// ([`super::Role::HiddenStates`]), version 3 the writer lease ([`WriterInfo::lease`]); a
/// manifest is written with the lowest version it needs ([`Manifest::needed_version`]).
/// Shard bytes are the same in all.
pub const MANIFEST_VERSION: u16 = 3;
/// The manifest version that carries [`WriterInfo::lease`].
pub const LEASE_VERSION: u16 = 3;

/// Name of the manifest file in a dataset folder.
pub const MANIFEST_FILE: &str = "manifest.json";
/// Name of the samples table in a dataset folder.
pub const SAMPLES_TABLE_FILE: &str = "samples.parquet";
/// Largest manifest accepted (256 MiB).
pub const MAX_MANIFEST_BYTES: u64 = 256 << 20;
/// The `format` value of every manifest.
pub const FORMAT_NAME: &str = "hspack";

/// A committed shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardRecord {
    /// File name within the dataset folder.
    pub file: String,
    /// Sequence number; shard `i` of the list has sequence `i`.
    pub seq: u32,
    /// File length in bytes.
    pub bytes: u64,
    /// BLAKE3 of the shard's index, hex.
    pub index_blake3: String,
    /// Ordinal of the first sample.
    pub first_ordinal: u64,
    /// Samples held.
    pub samples: u64,
    /// Chunks held.
    pub chunks: u64,
    /// Decoded bytes of all samples.
    pub raw_bytes: u64,
}

/// The samples table, when written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableRecord {
    /// File name within the dataset folder.
    pub file: String,
    /// File length in bytes.
    pub bytes: u64,
    /// BLAKE3 of the file, hex.
    pub blake3: String,
    /// Rows: one per sample.
    pub samples: u64,
}

/// Which tool wrote the dataset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriterInfo {
    /// Tool name.
    pub tool: String,
    /// Tool version.
    pub version: String,
    /// The lease of the writer that last wrote the manifest into object storage (manifest
    /// version 3): a writer that takes a dataset over writes its own, so the commits of the
    /// one it took over from find the manifest changed and fail. Readers ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
}

/// The manifest of a dataset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always `hspack`.
    pub format: String,
    /// Format version.
    pub version: u16,
    /// Random id of the dataset, hex (16 bytes).
    pub dataset_id: String,
    /// Fields and capture metadata.
    pub schema: Schema,
    /// BLAKE3 of the schema's canonical JSON, hex.
    pub schema_blake3: String,
    /// Committed shards, in sequence order.
    pub shards: Vec<ShardRecord>,
    /// Samples in all shards.
    pub samples: u64,
    /// The samples table, when it covers every sample.
    pub samples_table: Option<TableRecord>,
    /// Which tool wrote the dataset.
    pub writer: WriterInfo,
}

impl Manifest {
    /// An empty manifest for a new dataset.
    pub fn new(dataset_id: [u8; 16], schema: Schema) -> Self {
        let schema_blake3 = hex(&schema.hash());
        Manifest {
            format: FORMAT_NAME.into(),
            version: schema.manifest_version(),
            dataset_id: hex(&dataset_id),
            schema,
            schema_blake3,
            shards: Vec::new(),
            samples: 0,
            samples_table: None,
            writer: WriterInfo {
                tool: "hspack".into(),
                version: env!("CARGO_PKG_VERSION").into(),
                lease: None,
            },
        }
    }

    /// The lowest version that holds this manifest: 3 with a writer lease, else what the
    /// schema needs.
    pub fn needed_version(&self) -> u16 {
        match self.writer.lease {
            Some(_) => LEASE_VERSION.max(self.schema.manifest_version()),
            None => self.schema.manifest_version(),
        }
    }

    /// Records the lease of the writer about to write the manifest, raising the version to
    /// one that carries it.
    pub fn set_lease(&mut self, token: &str) {
        self.writer.lease = Some(token.to_string());
        self.version = self.version.max(self.needed_version());
    }

    /// The dataset id as bytes.
    pub fn dataset_id_bytes(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        // `decode` checked the hex; a manifest built in memory has a valid id too.
        if let Some(bytes) = unhex(&self.dataset_id) {
            if bytes.len() == 16 {
                out.copy_from_slice(&bytes);
            }
        }
        out
    }

    /// The bytes written to `manifest.json`: pretty JSON and a final newline.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(self).expect("a manifest always serializes");
        out.push(b'\n');
        out
    }

    /// Bytes of all shard files: what the dataset takes on disk, the samples table aside.
    /// Errors when the recorded sizes add up past 2^64, which [`Manifest::decode`] refuses.
    pub fn shard_bytes(&self) -> Result<u64, FormatError> {
        total("shard bytes", self.shards.iter().map(|s| s.bytes))
    }

    /// Decoded bytes of all samples. Errors when the recorded sizes add up past 2^64, which
    /// [`Manifest::decode`] refuses.
    pub fn raw_bytes(&self) -> Result<u64, FormatError> {
        total("shard raw_bytes", self.shards.iter().map(|s| s.raw_bytes))
    }

    /// Decodes and checks a manifest.
    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        const S: &str = "manifest";
        if bytes.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(FormatError::Invalid {
                structure: S,
                what: "size",
                value: bytes.len() as u64,
                rule: format!("at most {MAX_MANIFEST_BYTES} bytes"),
            });
        }
        let m: Manifest = serde_json::from_slice(bytes).map_err(|e| FormatError::Json {
            structure: S,
            detail: format!("{e}; the manifest is damaged: restore it from the source copy"),
        })?;
        m.validate()?;
        Ok(m)
    }

    /// Checks what JSON parsing alone cannot: version, ids, contiguous shards and ordinals.
    pub fn validate(&self) -> Result<(), FormatError> {
        const S: &str = "manifest";
        let invalid = |what, value: u64, rule: String| FormatError::Invalid {
            structure: S,
            what,
            value,
            rule,
        };
        if self.format != FORMAT_NAME {
            return Err(FormatError::Json {
                structure: S,
                detail: format!("`format` is {:?}, expected \"hspack\"", self.format),
            });
        }
        if !(MIN_VERSION..=MANIFEST_VERSION).contains(&self.version) {
            return Err(FormatError::UnsupportedVersion {
                structure: S,
                found: self.version.into(),
                min: MIN_VERSION.into(),
                max: MANIFEST_VERSION.into(),
            });
        }
        if self.version < self.schema.manifest_version() {
            return Err(FormatError::Json {
                structure: S,
                detail: format!(
                    "`version` is {} but the schema stacks layers in one field, which needs version {}",
                    self.version,
                    self.schema.manifest_version()
                ),
            });
        }
        if self.version < self.needed_version() {
            return Err(FormatError::Json {
                structure: S,
                detail: format!(
                    "`version` is {} but `writer.lease` needs version {LEASE_VERSION}",
                    self.version
                ),
            });
        }
        if let Some(lease) = &self.writer.lease {
            if lease.is_empty() || lease.len() > 64 || !lease.bytes().all(|b| b.is_ascii_hexdigit())
            {
                return Err(FormatError::Json {
                    structure: S,
                    detail: "`writer.lease` must be 1 to 64 hex digits".into(),
                });
            }
        }
        if unhex(&self.dataset_id).map(|b| b.len()) != Some(16) {
            return Err(FormatError::Json {
                structure: S,
                detail: "`dataset_id` must be 32 hex digits".into(),
            });
        }
        self.schema.validate()?;
        if self.schema_blake3 != hex(&self.schema.hash()) {
            return Err(FormatError::Json {
                structure: S,
                detail: "`schema_blake3` does not match the schema: the manifest was edited or is damaged".into(),
            });
        }
        let mut next_ordinal = 0u64;
        for (i, s) in self.shards.iter().enumerate() {
            if s.seq as usize != i {
                return Err(invalid(
                    "shard seq",
                    s.seq.into(),
                    format!("{i}, its position in the list"),
                ));
            }
            if s.first_ordinal != next_ordinal {
                return Err(invalid(
                    "shard first_ordinal",
                    s.first_ordinal,
                    format!("{next_ordinal}, the count of samples before it"),
                ));
            }
            if !is_plain_file_name(&s.file) {
                return Err(FormatError::Json {
                    structure: S,
                    detail: format!("shard file name {:?} must be a plain file name", s.file),
                });
            }
            if unhex(&s.index_blake3).map(|b| b.len()) != Some(32) {
                return Err(FormatError::Json {
                    structure: S,
                    detail: format!("`index_blake3` of {} must be 64 hex digits", s.file),
                });
            }
            next_ordinal = next_ordinal
                .checked_add(s.samples)
                .ok_or_else(|| invalid("shard samples", s.samples, "a total below 2^64".into()))?;
        }
        self.shard_bytes()?;
        self.raw_bytes()?;
        if self.samples != next_ordinal {
            return Err(invalid(
                "samples",
                self.samples,
                format!("{next_ordinal}, the sum over shards"),
            ));
        }
        if let Some(t) = &self.samples_table {
            if !is_plain_file_name(&t.file) || unhex(&t.blake3).map(|b| b.len()) != Some(32) {
                return Err(FormatError::Json {
                    structure: S,
                    detail: "`samples_table` needs a plain file name and 64 hex digits of blake3"
                        .into(),
                });
            }
        }
        Ok(())
    }
}

/// The sum of `values`, or an error naming `what` and its largest value (the likely culprit)
/// when the sum reaches 2^64.
fn total(
    what: &'static str,
    values: impl Iterator<Item = u64> + Clone,
) -> Result<u64, FormatError> {
    values
        .clone()
        .try_fold(0u64, u64::checked_add)
        .ok_or_else(|| FormatError::Invalid {
            structure: "manifest",
            what,
            value: values.max().unwrap_or(0),
            rule: "small enough that the total over all shards stays below 2^64".into(),
        })
}

/// The name of shard `seq`'s file: `shard-NNNNNN.hsp`, or, from a writer holding a lease
/// (object storage), `shard-NNNNNN-LLLLLLLLLLLLLLLL.hsp` (the lease's first 16 hex digits), so
/// that a writer whose lease was taken over never publishes under a name the new holder uses.
pub fn shard_file_name(seq: u32, lease: Option<&str>) -> String {
    match lease {
        None => format!("shard-{seq:06}.hsp"),
        Some(lease) => format!("shard-{seq:06}-{}.hsp", lease_in_name(lease)),
    }
}

/// The name of the samples table: `samples.parquet`, or, from a writer holding a lease,
/// `samples-LLLLLLLLLLLLLLLL.parquet`.
pub fn samples_table_file_name(lease: Option<&str>) -> String {
    match lease {
        None => SAMPLES_TABLE_FILE.into(),
        Some(lease) => format!("samples-{}.parquet", lease_in_name(lease)),
    }
}

/// Suffix of files being written: a writer publishes them under their final name, or a
/// writer that next opens the dataset deletes them.
pub const TEMP_SUFFIX: &str = ".tmp";

/// Hex digits of the writer lease in the names of the files a leased writer publishes.
const LEASE_IN_NAMES: usize = 16;

impl Manifest {
    /// True for a file that an interrupted writer, or one whose lease was taken over, leaves
    /// in the dataset: a temp file, a shard file the manifest does not list, or a samples
    /// table that is not the manifest's. A writer that opens the dataset removes exactly
    /// these; verify notes them.
    pub fn is_leftover(&self, name: &str) -> bool {
        let shard = name.starts_with("shard-") && name.ends_with(".hsp");
        let table = name.starts_with("samples") && name.ends_with(".parquet");
        name.ends_with(TEMP_SUFFIX)
            || (shard && !self.shards.iter().any(|s| s.file == name))
            || (table && self.samples_table.as_ref().is_none_or(|t| t.file != name))
    }
}

fn lease_in_name(lease: &str) -> &str {
    lease.get(..LEASE_IN_NAMES).unwrap_or(lease)
}

/// True for a name with no folder part and no special meaning.
pub fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\', '\0'])
        && name.len() <= 255
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Bytes of lowercase or uppercase hex, if it is hex.
pub fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{DType, Field, Role};

    fn manifest() -> Manifest {
        let schema = Schema::new(vec![Field::new("ids", DType::I32, &[], Role::TokenIds)]);
        let mut m = Manifest::new([7; 16], schema);
        m.shards.push(ShardRecord {
            file: shard_file_name(0, None),
            seq: 0,
            bytes: 4096,
            index_blake3: hex(&[1; 32]),
            first_ordinal: 0,
            samples: 3,
            chunks: 3,
            raw_bytes: 12,
        });
        m.samples = 3;
        m
    }

    #[test]
    fn round_trips() {
        let m = manifest();
        assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
    }

    #[test]
    fn rejects_inconsistent_manifests() {
        let mut m = manifest();
        m.samples = 4;
        assert!(Manifest::decode(&m.encode()).is_err());
        let mut m = manifest();
        m.shards[0].seq = 1;
        assert!(Manifest::decode(&m.encode()).is_err());
        let mut m = manifest();
        m.shards[0].file = "../etc/passwd".into();
        assert!(Manifest::decode(&m.encode()).is_err());
        let mut m = manifest();
        m.version = MANIFEST_VERSION + 1;
        assert!(matches!(
            Manifest::decode(&m.encode()),
            Err(FormatError::UnsupportedVersion { .. })
        ));
        let mut m = manifest();
        m.set_lease("00ff");
        assert_eq!(m.version, LEASE_VERSION);
        assert!(Manifest::decode(&m.encode()).is_ok());
        m.writer.lease = Some("lease/../x".into());
        assert!(Manifest::decode(&m.encode()).is_err());
        m.writer.lease = Some("00ff".into());
        m.version = 1;
        assert!(Manifest::decode(&m.encode()).is_err());
        let mut m = manifest();
        m.schema.fields[0].dtype = DType::I64;
        assert!(Manifest::decode(&m.encode()).is_err());
        assert!(Manifest::decode(b"{").is_err());
    }

    #[test]
    fn refuses_sizes_that_add_up_past_2_64() {
        let mut m = manifest();
        let mut second = m.shards[0].clone();
        second.seq = 1;
        second.first_ordinal = 3;
        second.file = shard_file_name(1, None);
        m.shards.push(second);
        m.samples = 6;
        assert_eq!(m.shard_bytes(), Ok(8192));
        assert_eq!(m.raw_bytes(), Ok(24));
        for (what, set) in [
            (
                "shard bytes",
                (|s| s.bytes = u64::MAX) as fn(&mut ShardRecord),
            ),
            ("shard raw_bytes", |s| s.raw_bytes = u64::MAX),
        ] {
            let mut bad = m.clone();
            set(&mut bad.shards[1]);
            let e = Manifest::decode(&bad.encode()).unwrap_err();
            assert!(
                matches!(e, FormatError::Invalid { what: w, value: u64::MAX, .. } if w == what),
                "{e}"
            );
            // One shard alone of that size does not overflow the sum.
            bad.shards.truncate(1);
            set(&mut bad.shards[0]);
            bad.samples = 3;
            assert!(Manifest::decode(&bad.encode()).is_ok());
        }
    }

    #[test]
    fn hex_round_trips() {
        assert_eq!(unhex(&hex(&[0, 1, 255])), Some(vec![0, 1, 255]));
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
    }
}
