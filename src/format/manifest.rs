//! The manifest: the root of trust of a dataset.
//!
//! It names every committed shard with its size, the BLAKE3 of its index (which holds the
//! BLAKE3 of every chunk) and its sample range, plus the schema and the samples table. The
//! dataset digest is the BLAKE3 of the manifest's bytes.
//!
//! From version 4 the file lists segments ([`super::segment`]), which list the shards: the
//! file decoded alone holds no shards until a reader adds the segments' ([`Manifest::add_segment`]).

use serde::{Deserialize, Serialize};

use super::segment::{check_file, Segment, SegmentFiles, SegmentRef, MAX_LEVEL};
use super::{FormatError, Schema, MIN_VERSION};

/// Newest manifest version this code reads. Version 2 adds stacked-layer fields
/// ([`super::Role::HiddenStates`]), version 3 the writer lease ([`WriterInfo::lease`]),
/// version 4 segments instead of a shard list ([`SEGMENTS_VERSION`]), version 5 quantized
/// fields ([`QUANTIZED_VERSION`], with the chunks of codec `fp8` they hold).
pub const MANIFEST_VERSION: u16 = 5;
/// The manifest version a schema with a quantized field needs ([`super::Quantized`]); it lists
/// segments, as version 4 does.
pub const QUANTIZED_VERSION: u16 = 5;
/// The manifest version that carries [`WriterInfo::lease`].
pub const LEASE_VERSION: u16 = 3;
/// The manifest version that lists segments: what this code writes.
pub const SEGMENTS_VERSION: u16 = 4;

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
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// Committed shards, in sequence order (version 4: those of the segments added so far).
    pub shards: Vec<ShardRecord>,
    /// Samples in all shards.
    pub samples: u64,
    /// The samples table, when it covers every sample (versions 1 to 3).
    pub samples_table: Option<TableRecord>,
    /// Which tool wrote the dataset.
    pub writer: WriterInfo,
    /// The segments (version 4), in shard order.
    pub segments: Vec<SegmentRef>,
    /// What each segment names besides its shards, once added ([`Manifest::add_segment`]).
    pub segment_files: Vec<SegmentFiles>,
}

/// The manifest file as parsed, before its rules are checked: fields a version lacks are
/// `None`, so that a version-4 manifest with a shard list is refused, not taken for empty.
#[derive(Deserialize)]
struct ManifestFile {
    format: String,
    version: u16,
    dataset_id: String,
    schema: Schema,
    schema_blake3: String,
    shards: Option<Vec<ShardRecord>>,
    segments: Option<Vec<SegmentRef>>,
    samples: u64,
    #[serde(default, deserialize_with = "present")]
    samples_table: Option<Option<TableRecord>>,
    writer: WriterInfo,
}

/// `Some` for a field that is there, even as `null`.
fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// The manifest file as written: the fields of its version, in their order.
#[derive(Serialize)]
struct ManifestView<'a> {
    format: &'a str,
    version: u16,
    dataset_id: &'a str,
    schema: &'a Schema,
    schema_blake3: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    shards: Option<&'a [ShardRecord]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    segments: Option<&'a [SegmentRef]>,
    samples: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    samples_table: Option<&'a Option<TableRecord>>,
    writer: &'a WriterInfo,
}

impl Manifest {
    /// An empty manifest for a new dataset.
    pub fn new(dataset_id: [u8; 16], schema: Schema) -> Self {
        let schema_blake3 = hex(&schema.hash());
        Manifest {
            format: FORMAT_NAME.into(),
            version: SEGMENTS_VERSION.max(schema.manifest_version()),
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
            segments: Vec::new(),
            segment_files: Vec::new(),
        }
    }

    /// True for a manifest that lists segments (version 4 on): what writers write now.
    pub fn is_segmented(&self) -> bool {
        self.version >= SEGMENTS_VERSION
    }

    /// The lowest version that holds this manifest: 4 with segments; else 3 with a writer
    /// lease, else what the schema needs.
    pub fn needed_version(&self) -> u16 {
        let unsegmented = match self.writer.lease {
            Some(_) => LEASE_VERSION.max(self.schema.manifest_version()),
            None => self.schema.manifest_version(),
        };
        match self.is_segmented() {
            true => SEGMENTS_VERSION.max(self.schema.manifest_version()),
            false => unsegmented,
        }
    }

    /// Adds a decoded segment: its shards join [`Manifest::shards`], the rest
    /// [`Manifest::segment_files`]. A reader adds every segment of [`Manifest::segments`] in
    /// order, then checks the whole with [`Manifest::validate_shards`].
    pub fn add_segment(&mut self, segment: Segment) {
        let (shards, files) = segment.into_parts();
        self.shards.extend(shards);
        self.segment_files.push(files);
    }

    /// True once every segment the manifest lists was added.
    pub fn is_complete(&self) -> bool {
        self.segment_files.len() == self.segments.len()
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

    /// The bytes written to `manifest.json`: pretty JSON and a final newline. Version 4 lists
    /// the segments and none of the shards, so its size does not grow with them.
    pub fn encode(&self) -> Vec<u8> {
        let segmented = self.is_segmented();
        let view = ManifestView {
            format: &self.format,
            version: self.version,
            dataset_id: &self.dataset_id,
            schema: &self.schema,
            schema_blake3: &self.schema_blake3,
            shards: (!segmented).then_some(&self.shards[..]),
            segments: segmented.then_some(&self.segments[..]),
            samples: self.samples,
            samples_table: (!segmented).then_some(&self.samples_table),
            writer: &self.writer,
        };
        let mut out = serde_json::to_vec_pretty(&view).expect("a manifest always serializes");
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
        super::version::refuse_unknown_version(
            bytes,
            S,
            MIN_VERSION.into(),
            MANIFEST_VERSION.into(),
        )?;
        let f: ManifestFile = serde_json::from_slice(bytes).map_err(|e| FormatError::Json {
            structure: S,
            detail: format!("{e}; the manifest is damaged: restore it from the source copy"),
        })?;
        if !(MIN_VERSION..=MANIFEST_VERSION).contains(&f.version) {
            return Err(FormatError::UnsupportedVersion {
                structure: S,
                found: f.version.into(),
                min: MIN_VERSION.into(),
                max: MANIFEST_VERSION.into(),
            });
        }
        let segmented = f.version >= SEGMENTS_VERSION;
        let json = |detail: &str| FormatError::Json {
            structure: S,
            detail: detail.into(),
        };
        match segmented {
            true if f.shards.is_some() || f.samples_table.is_some() => {
                return Err(json(
                    "a version 4 manifest lists segments, not `shards` or a `samples_table`",
                ))
            }
            true if f.segments.is_none() => return Err(json("missing field `segments`")),
            false if f.segments.is_some() => {
                return Err(json("`segments` needs manifest version 4"))
            }
            false if f.shards.is_none() => return Err(json("missing field `shards`")),
            false if f.samples_table.is_none() => {
                return Err(json("missing field `samples_table`"))
            }
            _ => {}
        }
        let m = Manifest {
            format: f.format,
            version: f.version,
            dataset_id: f.dataset_id,
            schema: f.schema,
            schema_blake3: f.schema_blake3,
            shards: f.shards.unwrap_or_default(),
            samples: f.samples,
            samples_table: f.samples_table.flatten(),
            writer: f.writer,
            segments: f.segments.unwrap_or_default(),
            segment_files: Vec::new(),
        };
        m.validate_root()?;
        if !segmented {
            m.validate_shards()?;
        }
        Ok(m)
    }

    /// Checks everything: [`Manifest::validate_root`], then, once every segment was added,
    /// [`Manifest::validate_shards`].
    pub fn validate(&self) -> Result<(), FormatError> {
        self.validate_root()?;
        if self.is_complete() {
            self.validate_shards()?;
        }
        Ok(())
    }

    /// Checks what JSON parsing alone cannot, in the manifest file itself: version, ids,
    /// schema, the segments' running sums.
    pub fn validate_root(&self) -> Result<(), FormatError> {
        const S: &str = "manifest";
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
        let (needs, why) = self.schema.version_need();
        if self.version < needs {
            return Err(FormatError::Json {
                structure: S,
                detail: format!(
                    "`version` is {} but {why}, which needs version {needs}",
                    self.version,
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
        if unhex(&self.schema_blake3).as_deref() != Some(&self.schema.hash()[..]) {
            return Err(FormatError::Json {
                structure: S,
                detail: "`schema_blake3` does not match the schema: the manifest was edited or is damaged".into(),
            });
        }
        if let Some(t) = &self.samples_table {
            check_file(&t.file, &t.blake3, S)?;
        }
        let (mut next_seq, mut next_ordinal) = (0u64, 0u64);
        for g in &self.segments {
            check_file(&g.file, &g.blake3, S)?;
            if g.level > MAX_LEVEL {
                return Err(invalid(
                    "segment level",
                    g.level.into(),
                    format!("at most {MAX_LEVEL}"),
                ));
            }
            if g.shards == 0 {
                return Err(invalid("segment shards", 0, "at least 1".into()));
            }
            if u64::from(g.first_seq) != next_seq {
                return Err(invalid(
                    "segment first_seq",
                    g.first_seq.into(),
                    format!("{next_seq}, the count of shards before it"),
                ));
            }
            if g.first_ordinal != next_ordinal {
                return Err(invalid(
                    "segment first_ordinal",
                    g.first_ordinal,
                    format!("{next_ordinal}, the count of samples before it"),
                ));
            }
            next_seq += u64::from(g.shards);
            next_ordinal = next_ordinal.checked_add(g.samples).ok_or_else(|| {
                invalid("segment samples", g.samples, "a total below 2^64".into())
            })?;
        }
        if next_seq > u64::from(u32::MAX) {
            return Err(invalid(
                "segment shards",
                next_seq,
                "a total below 2^32".into(),
            ));
        }
        if self.is_segmented() && self.samples != next_ordinal {
            return Err(invalid(
                "samples",
                self.samples,
                format!("{next_ordinal}, the sum over segments"),
            ));
        }
        Ok(())
    }

    /// Checks the shard list: numbered from 0, ordinals running, plain names, sums below
    /// 2^64 and equal to `samples`.
    pub fn validate_shards(&self) -> Result<(), FormatError> {
        const S: &str = "manifest";
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
        Ok(())
    }

    /// The files the manifest covers besides shards, with their length and BLAKE3: the
    /// samples table (versions 1 to 3); the segments, their key runs and table parts
    /// (version 4, once added).
    pub fn listed_files(&self) -> Vec<ListedFile<'_>> {
        let mut out: Vec<ListedFile<'_>> = Vec::new();
        fn table(t: &TableRecord) -> ListedFile<'_> {
            ListedFile {
                file: &t.file,
                bytes: t.bytes,
                blake3: &t.blake3,
            }
        }
        out.extend(self.samples_table.iter().map(table));
        for (g, files) in self.segments.iter().zip(&self.segment_files) {
            out.push(ListedFile {
                file: &g.file,
                bytes: g.bytes,
                blake3: &g.blake3,
            });
            out.extend(files.keys.iter().map(|k| ListedFile {
                file: &k.file,
                bytes: k.bytes,
                blake3: &k.blake3,
            }));
            out.extend(files.tables.iter().map(table));
        }
        out
    }

    /// The samples table's files in ordinal order: the parts of every segment (version 4),
    /// or the one table (versions 1 to 3, when written).
    pub fn table_files(&self) -> Vec<&TableRecord> {
        self.samples_table
            .iter()
            .chain(self.segment_files.iter().flat_map(|f| f.tables.iter()))
            .collect()
    }
}

/// A file the manifest covers, besides shards ([`Manifest::listed_files`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListedFile<'a> {
    /// File name within the dataset folder.
    pub file: &'a str,
    /// File length in bytes.
    pub bytes: u64,
    /// BLAKE3 of the file, hex.
    pub blake3: &'a str,
}

/// A manifest value `what` that breaks `rule`.
fn invalid(what: &'static str, value: u64, rule: String) -> FormatError {
    FormatError::Invalid {
        structure: "manifest",
        what,
        value,
        rule,
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
    /// in the dataset ([`ListedNames::is_leftover`]). To ask of many files, ask
    /// [`Manifest::listed_names`] once.
    pub fn is_leftover(&self, name: &str) -> bool {
        self.listed_names().is_leftover(name)
    }

    /// The names of the files the manifest lists (shards, and the others of
    /// [`Manifest::listed_files`]), for many [`ListedNames::is_leftover`] questions in a row.
    pub fn listed_names(&self) -> ListedNames<'_> {
        let files = self.listed_files().into_iter().map(|f| f.file);
        ListedNames {
            names: self
                .shards
                .iter()
                .map(|s| s.file.as_str())
                .chain(files)
                .collect(),
        }
    }
}

/// The names a manifest lists ([`Manifest::listed_names`]).
#[derive(Debug)]
pub struct ListedNames<'a> {
    names: std::collections::HashSet<&'a str>,
}

impl ListedNames<'_> {
    /// True when the manifest lists file `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.names.contains(name)
    }

    /// True for a file that an interrupted writer, or one whose lease was taken over, leaves
    /// in the dataset: one of hspack's temp files (a data file's, the manifest's or a lane's
    /// name, then [`TEMP_SUFFIX`]; not any other name ending so), or a shard, samples table
    /// (or part), segment or key run the manifest does not list. A writer that opens the
    /// dataset removes exactly these; verify notes them.
    pub fn is_leftover(&self, name: &str) -> bool {
        is_temp_file_name(name) || (is_data_file_name(name) && !self.names.contains(name))
    }
}

/// True for one of hspack's temp files: a data file's, the manifest's or a lane's name, then
/// [`TEMP_SUFFIX`] (not any other name ending so, which is someone else's).
pub fn is_temp_file_name(name: &str) -> bool {
    name.strip_suffix(TEMP_SUFFIX).is_some_and(|stem| {
        stem == MANIFEST_FILE || is_data_file_name(stem) || is_lane_file_name(stem)
    })
}

/// The name of lane `n` of the writer whose names carry `tag` (`lane-TAG-NNNNNN.hsp`), which
/// it is written under, with [`TEMP_SUFFIX`], until its commit gives it a shard's name.
pub fn lane_file_name(tag: &str, n: u64) -> String {
    format!("lane-{tag}-{n:06}.hsp")
}

/// True for a name of the form of [`lane_file_name`]: `lane-`, a writer's tag (16 or more
/// lowercase hex digits), `-`, a number of 6 or more digits, `.hsp`.
pub fn is_lane_file_name(name: &str) -> bool {
    let Some(rest) = name
        .strip_prefix("lane-")
        .and_then(|r| r.strip_suffix(".hsp"))
    else {
        return false;
    };
    rest.split_once('-')
        .is_some_and(|(tag, n)| tag.len() >= LEASE_IN_NAMES && is_lower_hex(tag) && is_number(n))
}

/// True for the name of a file a writer makes besides the manifest, exactly of a form of
/// FORMAT.md §1's table: a shard, samples table (or part), segment or key run. A name that
/// only resembles one (`samples-old.parquet`, `shard-a.hsp`) is someone else's file, which
/// no writer takes for its leftover.
pub fn is_data_file_name(name: &str) -> bool {
    let numbered = |prefix: &str, suffix: &str, numbers: usize| {
        name.strip_prefix(prefix)
            .and_then(|r| r.strip_suffix(suffix))
            .is_some_and(|r| is_numbered(r, numbers))
    };
    is_shard_file_name(name)
        || name == SAMPLES_TABLE_FILE
        || name
            .strip_prefix("samples-")
            .and_then(|r| r.strip_suffix(".parquet"))
            .is_some_and(is_tag_in_name)
        || numbered("samples-", ".parquet", 2)
        || numbered("segment-", ".json", 2)
        || numbered("keys-", ".bin", 2)
}

/// True for the name of a shard file ([`shard_file_name`]): `shard-NNNNNN.hsp` or
/// `shard-NNNNNN-LLLLLLLLLLLLLLLL.hsp`.
pub fn is_shard_file_name(name: &str) -> bool {
    name.strip_prefix("shard-")
        .and_then(|r| r.strip_suffix(".hsp"))
        .is_some_and(|r| is_numbered(r, 1))
}

/// True for `numbers` numbers of 6 or more digits, then optionally the tag of a writer in
/// names ([`is_tag_in_name`]), joined by `-`.
fn is_numbered(rest: &str, numbers: usize) -> bool {
    let parts: Vec<&str> = rest.split('-').collect();
    let (numbered, tag) = match parts.len() {
        n if n == numbers => (&parts[..], None),
        n if n == numbers + 1 => (&parts[..numbers], Some(parts[numbers])),
        _ => return false,
    };
    numbered.iter().all(|n| is_number(n)) && tag.is_none_or(is_tag_in_name)
}

/// A sequence number or lane number in a name: 6 or more decimal digits.
fn is_number(s: &str) -> bool {
    s.len() >= 6 && s.bytes().all(|b| b.is_ascii_digit())
}

/// True for a lease token (or a sharing writer's tag) as writers make them: 32 lowercase hex
/// digits (FORMAT.md §1.1), of which names carry the first 16 ([`lease_in_name`]).
pub fn is_lease_token(s: &str) -> bool {
    s.len() == 2 * LEASE_IN_NAMES && is_lower_hex(s)
}

/// The tag of a writer in the names it publishes ([`lease_in_name`]): 16 lowercase hex digits.
fn is_tag_in_name(s: &str) -> bool {
    s.len() == LEASE_IN_NAMES && is_lower_hex(s)
}

fn is_lower_hex(s: &str) -> bool {
    s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

pub(crate) fn lease_in_name(lease: &str) -> &str {
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

/// Bytes of lowercase or uppercase hex, if it is hex: pairs of digits `0-9`, `a-f`, `A-F`
/// and nothing else (no sign: `u8::from_str_radix` alone takes `+9`). Compare hashes as the
/// bytes this returns, not as text, so that either case matches [`hex`]'s lowercase.
pub fn unhex(text: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let text = text.as_bytes();
    if !text.len().is_multiple_of(2) {
        return None;
    }
    text.chunks_exact(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{DType, Field, Role};

    fn manifest() -> Manifest {
        let schema = Schema::new(vec![Field::new("ids", DType::I32, &[], Role::TokenIds)]);
        let mut m = Manifest::new([7; 16], schema);
        // A shard list in the manifest file: version 1.
        m.version = 1;
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
        // A newer writer's manifest may hold what this reader cannot decode (a new dtype):
        // it is refused by its version, not called damaged.
        let mut m = manifest();
        m.version = MANIFEST_VERSION + 1;
        let newer = String::from_utf8(m.encode())
            .unwrap()
            .replace("\"i32\"", "\"fp4\"");
        assert!(newer.contains("fp4"));
        let err = Manifest::decode(newer.as_bytes()).unwrap_err();
        assert!(
            matches!(err, FormatError::UnsupportedVersion { .. })
                && err.to_string().contains("upgrade hspack")
                && !err.to_string().contains("damaged"),
            "{err}"
        );
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
    fn version_4_lists_segments_not_shards() {
        let mut m = manifest();
        m.version = SEGMENTS_VERSION;
        m.segments.push(SegmentRef {
            file: "segment-000000-000000.json".into(),
            bytes: 10,
            blake3: hex(&[4; 32]),
            level: 0,
            first_seq: 0,
            shards: 1,
            first_ordinal: 0,
            samples: 3,
        });
        let bytes = m.encode();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(
            !text.contains("\"shards\": [") && !text.contains("samples_table"),
            "{text}"
        );
        let back = Manifest::decode(&bytes).unwrap();
        assert!(back.shards.is_empty() && !back.is_complete());
        assert_eq!(back.segments, m.segments);
        let refused = |change: fn(&mut Manifest)| {
            let mut bad = m.clone();
            change(&mut bad);
            Manifest::decode(&bad.encode()).is_err()
        };
        assert!(refused(|m| m.segments[0].first_ordinal = 1));
        assert!(refused(|m| m.segments[0].first_seq = 1));
        assert!(refused(|m| m.segments[0].shards = 0));
        assert!(refused(|m| m.segments[0].level = MAX_LEVEL + 1));
        assert!(refused(|m| m.samples = 4));
        assert!(refused(|m| m.segments[0].file = "a/b".into()));
        let edited = |field: &str, value: serde_json::Value| {
            let mut v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            v[field] = value;
            Manifest::decode(&serde_json::to_vec(&v).unwrap())
        };
        assert!(edited("shards", serde_json::json!([])).is_err());
        assert!(edited("samples_table", serde_json::Value::Null).is_err());
        assert!(edited("version", 3.into()).is_err());
        let mut v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        v.as_object_mut().unwrap().remove("segments");
        assert!(Manifest::decode(&serde_json::to_vec(&v).unwrap()).is_err());
    }

    #[test]
    fn the_names_a_writer_makes_are_its_and_look_alikes_are_not() {
        use crate::format::segment::{key_run_file_name, segment_file_name, table_part_file_name};
        let tag = hex(&crate::io::unique_id(b"names"));
        let ours = [
            shard_file_name(0, None),
            shard_file_name(u32::MAX, Some(&tag)),
            samples_table_file_name(None),
            samples_table_file_name(Some(&tag)),
            segment_file_name(0, 7, None),
            segment_file_name(8, 9, Some(&tag)),
            key_run_file_name(1, 2, Some(&tag)),
            table_part_file_name(3, 4, None),
        ];
        for name in &ours {
            assert!(is_data_file_name(name), "{name}");
            assert!(is_temp_file_name(&format!("{name}{TEMP_SUFFIX}")), "{name}");
        }
        let lane = lane_file_name(&tag, 12);
        assert!(is_lane_file_name(&lane) && is_temp_file_name(&format!("{lane}{TEMP_SUFFIX}")));
        let theirs = [
            "shard-a.hsp",
            "shard-00001.hsp",
            "shard-000001-old.hsp",
            "shard-000001-0123456789ABCDEF.hsp",
            "shard-000001.hsp.bak",
            "samples_stats.parquet",
            "samples-old.parquet",
            "samples-000001.parquet",
            "samples-000001-000002-x.parquet",
            "segment-notes.json",
            "segment-000001-000002-000003-0123456789abcdef.json",
            "keys-000001-000002.bin.gz",
            "keys-.bin",
            "lane-notes.hsp",
            "lane-0123-000001.hsp",
        ];
        for name in theirs {
            assert!(
                !is_data_file_name(name) && !is_lane_file_name(name),
                "{name}"
            );
            assert!(
                !is_temp_file_name(&format!("{name}{TEMP_SUFFIX}")),
                "{name}"
            );
        }
    }

    #[test]
    fn hex_round_trips() {
        assert_eq!(unhex(&hex(&[0, 1, 255])), Some(vec![0, 1, 255]));
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
        assert_eq!(unhex("0aFf"), Some(vec![0x0a, 0xff]));
        for signed in ["+9", "-9", "+f", "0+", " 9", "9 ", "\u{e9}"] {
            assert_eq!(unhex(signed), None, "{signed:?}");
        }
    }
}
