//! One shard: opened against its manifest record, read chunk by chunk through storage
//! (zero-copy slices of the mapping for a local folder).

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::error::{format, ChunkSite, Error, Result};
use crate::format::manifest::{hex, unhex};
use crate::format::{
    ChunkEntry, ChunkHeader, Codec, Elements, Footer, Index, SampleEntry, Schema, ShardHeader,
    ShardRecord,
};

use crate::io::mmap::SharedFlags;
use crate::io::{FileBytes, FileReader, Storage};

/// Which chunks were checked: in this process, or in a memo shared between processes.
enum Checked {
    Local(Vec<AtomicBool>),
    Shared(SharedFlags),
}

impl Checked {
    fn get(&self, c: u64) -> bool {
        match self {
            Checked::Local(v) => v.get(c as usize).is_some_and(|f| f.load(Ordering::Relaxed)),
            Checked::Shared(m) => m.get(c as usize),
        }
    }

    fn set(&self, c: u64) {
        match self {
            Checked::Local(v) => {
                if let Some(f) = v.get(c as usize) {
                    f.store(true, Ordering::Relaxed);
                }
            }
            Checked::Shared(m) => m.set(c as usize),
        }
    }
}

/// Bytes a scan in file order fetches at once from a storage that cannot map.
pub const SCAN_AHEAD: u64 = 64 << 20;

/// When chunk payloads are hashed on read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CheckPolicy {
    /// The first read of each chunk hashes it (default): first in this process, or in all
    /// processes sharing a checked-chunk memo (`ReadOptions::checked_memo`). In this process,
    /// first while the shard stays mapped: a shard the dataset let go
    /// (`ReadOptions::mapped_shards`) hashes its chunks again when read again.
    #[default]
    Once,
    /// Every read hashes the chunk.
    Always,
    /// Reads trust the bytes (headers are still checked); run `verify` separately.
    Never,
}

/// A shard whose footer, header and index were checked against the manifest.
pub struct Shard {
    path: PathBuf,
    file: Arc<dyn FileReader>,
    index_bytes: FileBytes,
    header: ShardHeader,
    footer: Footer,
    checked: Checked,
    /// True when the storage maps the file: reads are slices, nothing is fetched ahead.
    mapped: bool,
    /// Bytes fetched ahead from a storage that cannot map (see [`Shard::fetch_ahead`]).
    window: std::sync::Mutex<Option<(u64, FileBytes)>>,
}

impl std::fmt::Debug for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard").field("path", &self.path).finish()
    }
}

fn mismatch(
    path: &Path,
    record: &ShardRecord,
    what: &'static str,
    expected: impl ToString,
    found: impl ToString,
) -> Error {
    Error::ShardMismatch {
        shard: path.to_path_buf(),
        held: held_by(record),
        what,
        expected: expected.to_string(),
        found: found.to_string(),
    }
}

impl Shard {
    /// Opens shard `record.file` of `storage` and checks footer, header and index against
    /// `record`, the dataset id and the schema. Costs one hash of the index, not of the data.
    pub fn open(
        storage: &dyn Storage,
        record: &ShardRecord,
        dataset_id: [u8; 16],
        schema: &Schema,
        checked_memo: Option<&Path>,
    ) -> Result<Shard> {
        let path = &storage.path(&record.file);
        let file = storage.open(&record.file).map_err(|e| missing(e, record))?;
        let len = file.len();
        let tail = file.read(len.saturating_sub(Footer::SIZE as u64)..len)?;
        let footer = Footer::decode(&tail, len).map_err(|e| match len == record.bytes {
            true => format(path)(e),
            // A short or long file explains a bad footer best.
            false => mismatch(path, record, "size", record.bytes, len),
        })?;
        if footer.dataset_id != dataset_id {
            return Err(Error::ForeignShard {
                shard: path.to_path_buf(),
                expected: hex(&dataset_id),
                found: hex(&footer.dataset_id),
            });
        }
        if len != record.bytes {
            return Err(mismatch(path, record, "size", record.bytes, len));
        }
        if footer.shard_seq != record.seq {
            return Err(mismatch(
                path,
                record,
                "shard sequence number",
                record.seq,
                footer.shard_seq,
            ));
        }
        let index_end = footer.index_offset.saturating_add(footer.index_len);
        let index_bytes = file.read(footer.index_offset..index_end)?;
        let index_hash = *blake3::hash(&index_bytes).as_bytes();
        // As bytes: the manifest's hex may be in either case (FORMAT.md §6 says "hex").
        if unhex(&record.index_blake3).as_deref() != Some(&index_hash[..]) {
            return Err(mismatch(
                path,
                record,
                "index blake3",
                &record.index_blake3,
                hex(&index_hash),
            ));
        }
        if index_hash != footer.index_hash {
            return Err(mismatch(
                path,
                record,
                "footer's index blake3",
                hex(&footer.index_hash),
                hex(&index_hash),
            ));
        }
        let head = file.read(0..(ShardHeader::SIZE as u64).min(len))?;
        let header = ShardHeader::decode(&head).map_err(format(path))?;
        if header.dataset_id != dataset_id {
            return Err(Error::ForeignShard {
                shard: path.to_path_buf(),
                expected: hex(&dataset_id),
                found: hex(&header.dataset_id),
            });
        }
        if header.shard_seq != record.seq {
            return Err(mismatch(
                path,
                record,
                "header's shard sequence number",
                record.seq,
                header.shard_seq,
            ));
        }
        if header.schema_hash != schema.hash() {
            return Err(mismatch(
                path,
                record,
                "schema blake3",
                hex(&schema.hash()),
                hex(&header.schema_hash),
            ));
        }
        let index = Index::parse(&index_bytes).map_err(format(path))?;
        let counts = (
            index.sample_count(),
            index.chunk_count(),
            index.header().first_ordinal,
        );
        if counts
            != (
                footer.sample_count,
                footer.chunk_count,
                footer.first_ordinal,
            )
            || counts != (record.samples, record.chunks, record.first_ordinal)
        {
            return Err(mismatch(
                path,
                record,
                "(samples, chunks, first ordinal)",
                format!(
                    "{:?}",
                    (record.samples, record.chunks, record.first_ordinal)
                ),
                format!("{counts:?}"),
            ));
        }
        let data = ShardHeader::SIZE as u64..footer.index_offset;
        index
            .validate(schema, data, 1 << header.align_log2)
            .map_err(format(path))?;
        // Nothing else covers a version 1 to 3 manifest's `raw_bytes` (FORMAT.md §6).
        let raw_bytes = index.raw_bytes();
        if raw_bytes != Some(record.raw_bytes) {
            return Err(mismatch(
                path,
                record,
                "raw_bytes (the sum of its samples' raw_bytes)",
                record.raw_bytes,
                raw_bytes.map_or_else(|| "2^64 or more".into(), |n| n.to_string()),
            ));
        }
        let checked = match checked_memo {
            Some(dir) if footer.chunk_count > 0 => {
                // Named after the dataset, the shard's index (every chunk's hash) and the file
                // itself: a memo folder given to another dataset, to one written again at the
                // same path, or to a copy of this one (damaged since, as the memo cannot
                // see), never vouches for its chunks.
                let name = format!(
                    "{}-shard-{:06}-{}-{}.checked",
                    hex(&dataset_id),
                    record.seq,
                    hex(&index_hash[..16]),
                    file_identity(&*file, path)
                );
                Checked::Shared(SharedFlags::open(
                    &dir.join(name),
                    footer.chunk_count as usize,
                )?)
            }
            _ => Checked::Local(
                (0..footer.chunk_count)
                    .map(|_| AtomicBool::new(false))
                    .collect(),
            ),
        };
        Ok(Shard {
            path: path.to_path_buf(),
            mapped: file.maps_ranges(),
            file,
            index_bytes,
            header,
            footer,
            checked,
            window: std::sync::Mutex::new(None),
        })
    }

    /// The shard file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file, for ranged reads.
    pub fn file(&self) -> &Arc<dyn FileReader> {
        &self.file
    }

    /// True when the storage maps the file (a local folder): reads are zero-copy slices.
    pub fn is_mapped(&self) -> bool {
        self.mapped
    }

    /// Drops bytes `range` of a mapped shard from this process's memory (they are read again
    /// on the next access): for passes over a whole shard, such as verify's.
    pub fn release(&self, range: Range<u64>) {
        if let (Some(whole), Ok(start), Ok(end)) = (
            self.file.whole(),
            usize::try_from(range.start),
            usize::try_from(range.end),
        ) {
            whole.release(start..end);
        }
    }

    /// Bytes `range` of the file (zero-copy where the storage maps it).
    pub fn read(&self, range: Range<u64>) -> Result<FileBytes> {
        match self.kept(&range) {
            Some(hit) => Ok(hit),
            None => self.file.read(range),
        }
    }

    /// Bytes `range` from what [`Shard::fetch_ahead`] kept, if they are there.
    fn kept(&self, range: &Range<u64>) -> Option<FileBytes> {
        if self.mapped || range.start > range.end {
            return None;
        }
        let window = self.window()?;
        let (at, bytes) = window.as_ref()?;
        let start = range.start.checked_sub(*at)?;
        bytes.slice(start as usize..(range.end - at) as usize)
    }

    /// Fetches bytes `range` in one read and keeps them for the reads that follow, replacing
    /// what was kept: a sample's chunks, or the next stretch of a scan, in one request
    /// instead of one each. Nothing to do where the storage maps the file.
    pub fn fetch_ahead(&self, range: Range<u64>) -> Result<()> {
        if self.mapped || range.is_empty() {
            return Ok(());
        }
        let end = range.end.min(self.file.len());
        let bytes = self.file.read(range.start..end)?;
        if let Some(mut window) = self.window() {
            *window = Some((range.start, bytes));
        }
        Ok(())
    }

    /// What [`Shard::fetch_ahead`] kept; `None` in a child forked while another thread held
    /// it (reads then go to the file, never hang).
    fn window(&self) -> Option<std::sync::MutexGuard<'_, Option<(u64, FileBytes)>>> {
        crate::per_process::lock_for_an_instant(&self.window)
    }

    /// Bytes `from..to` of padding (between the header, chunks and index), which must be zero:
    /// [`Error::DirtyPadding`] names the first that is not.
    pub fn padding(&self, from: u64, to: u64) -> Result<FileBytes> {
        let gap = self.read(from..to)?;
        match gap.iter().position(|&b| b != 0) {
            Some(i) => Err(Error::DirtyPadding {
                shard: self.path.clone(),
                offset: from + i as u64,
            }),
            None => Ok(gap),
        }
    }

    /// Drops the bytes [`Shard::fetch_ahead`] kept.
    pub fn forget_ahead(&self) {
        if let Some(mut window) = self.window() {
            *window = None;
        }
    }

    /// Makes sure the bytes `range` are kept ahead, fetching from its start at least
    /// [`SCAN_AHEAD`] bytes (not past `limit`): for scans in file order (verify, copies).
    pub fn scan_to(&self, range: Range<u64>, limit: u64) -> Result<()> {
        if self.mapped || self.kept(&range).is_some() {
            return Ok(());
        }
        let end = range.end.max((range.start + SCAN_AHEAD).min(limit));
        self.fetch_ahead(range.start..end)
    }

    /// The header.
    pub fn header(&self) -> &ShardHeader {
        &self.header
    }

    /// The footer.
    pub fn footer(&self) -> &Footer {
        &self.footer
    }

    /// The index (validated at open).
    pub fn index(&self) -> Index<'_> {
        Index::parse(&self.index_bytes).expect("validated when the shard was opened")
    }

    /// Where chunk `c` lies, for error messages.
    pub fn site(&self, c: u64, schema: &Schema) -> Box<ChunkSite> {
        let index = self.index();
        let e = index.chunk(c).unwrap_or_else(bytemuck::Zeroable::zeroed);
        let local = e.sample.checked_sub(index.header().first_ordinal);
        let key = local
            .and_then(|l| index.sample(l))
            .and_then(|s: SampleEntry| index.key_of(&s))
            .unwrap_or("?")
            .to_string();
        Box::new(ChunkSite {
            shard: self.path.clone(),
            chunk: c,
            key,
            ordinal: e.sample,
            field: schema
                .field(e.field.into())
                .map(|f| f.name.clone())
                .unwrap_or_else(|| format!("#{}", e.field)),
            // The index check leaves a chunk's own first row unchecked (its extents are).
            rows: e.row_start..e.row_start.saturating_add(e.row_count),
        })
    }

    /// The header check: the chunk header at the offset the index gives must describe the
    /// chunk the index describes, so shifted or swapped chunks are caught.
    pub fn check_chunk_header(&self, c: u64, e: &ChunkEntry, schema: &Schema) -> Result<()> {
        let bytes = self.read(e.offset..e.offset + ChunkHeader::SIZE as u64)?;
        self.check_header_bytes(c, e, &bytes, schema)
    }

    fn check_header_bytes(
        &self,
        c: u64,
        e: &ChunkEntry,
        bytes: &[u8],
        schema: &Schema,
    ) -> Result<()> {
        let header = ChunkHeader::decode(bytes).map_err(|source| Error::BadChunk {
            site: self.site(c, schema),
            source,
        })?;
        let pairs: [(&'static str, u64, u64); 10] = [
            ("chunk id", c, header.chunk_id.into()),
            (
                "shard sequence number",
                self.header.shard_seq.into(),
                header.shard_seq.into(),
            ),
            ("field", e.field.into(), header.field.into()),
            ("codec", e.codec.into(), header.codec.into()),
            ("dtype", e.dtype.into(), header.dtype.into()),
            ("sample ordinal", e.sample, header.sample),
            ("first row", e.row_start, header.row_start),
            ("row count", e.row_count, header.row_count),
            ("raw length", e.raw_len, header.raw_len),
            ("stored length", e.stored_len, header.stored_len),
        ];
        for (what, expected, found) in pairs {
            if expected != found {
                return Err(Error::ChunkMisplaced {
                    site: self.site(c, schema),
                    what,
                    expected,
                    found,
                });
            }
        }
        if header.hash != e.hash {
            return Err(Error::ChecksumMismatch {
                site: self.site(c, schema),
                expected: hex(&e.hash),
                found: format!("{} (in the chunk header)", hex(&header.hash)),
            });
        }
        Ok(())
    }

    /// Checks chunk `c` as held in `bytes` (its header, then its stored payload, as in the
    /// file): the header against the index entry `e`, the payload against its hash.
    pub fn check_chunk_bytes(
        &self,
        c: u64,
        e: &ChunkEntry,
        bytes: &[u8],
        schema: &Schema,
    ) -> Result<()> {
        let (header, stored) = bytes.split_at(ChunkHeader::SIZE.min(bytes.len()));
        self.check_header_bytes(c, e, header, schema)?;
        self.check_stored_hash(c, e, stored, schema)
    }

    /// Hashes chunk `c`'s stored bytes against the index.
    pub fn check_chunk_hash(&self, c: u64, e: &ChunkEntry, schema: &Schema) -> Result<()> {
        self.check_stored_hash(c, e, &self.stored(e)?, schema)
    }

    fn check_stored_hash(
        &self,
        c: u64,
        e: &ChunkEntry,
        stored: &[u8],
        schema: &Schema,
    ) -> Result<()> {
        // A large chunk is hashed on the pool's threads: a first read of one sample, or a
        // chunk read alone, then runs at both cores' speed, not one.
        let hash = crate::parallel::blake3_hash(stored);
        if hash.as_bytes() != &e.hash {
            return Err(Error::ChecksumMismatch {
                site: self.site(c, schema),
                expected: hex(&e.hash),
                found: hash.to_hex().to_string(),
            });
        }
        self.checked.set(c);
        Ok(())
    }

    fn stored(&self, e: &ChunkEntry) -> Result<FileBytes> {
        let start = e.offset + ChunkHeader::SIZE as u64;
        self.read(start..start + e.stored_len)
    }

    /// The stored bytes of chunk `c`, checked per `policy`, with its index entry.
    pub fn chunk(
        &self,
        c: u64,
        schema: &Schema,
        policy: CheckPolicy,
    ) -> Result<(ChunkEntry, FileBytes)> {
        let e = self.index().chunk(c).ok_or_else(|| Error::BadChunk {
            site: self.site(c, schema),
            source: crate::format::FormatError::Invalid {
                structure: "shard index",
                what: "chunk",
                value: c,
                rule: "a chunk of this shard".into(),
            },
        })?;
        let seen = self.checked.get(c);
        let check = match policy {
            CheckPolicy::Always => true,
            CheckPolicy::Once => !seen,
            CheckPolicy::Never => false,
        };
        // Header and payload in one read, or in two where the storage maps ranges: both are
        // then views, and the payload stays one even where the header lives apart from it
        // (a shard in a store keeps its headers in the skeleton, its payloads in packs).
        let at = e.offset + ChunkHeader::SIZE as u64;
        let (header, stored) = if self.mapped {
            (self.read(e.offset..at)?, self.read(at..at + e.stored_len)?)
        } else {
            let whole = self.read(e.offset..at + e.stored_len)?;
            let stored = whole
                .slice(ChunkHeader::SIZE..whole.len())
                .expect("the read holds the header and the payload");
            (whole, stored)
        };
        if check || !seen {
            self.check_header_bytes(c, &e, &header[..ChunkHeader::SIZE], schema)?;
        }
        if check {
            self.check_stored_hash(c, &e, &stored, schema)?;
        }
        Ok((e, stored))
    }

    /// Decodes chunk `c` into `out`, exactly its raw length.
    pub fn decode_chunk_into(
        &self,
        c: u64,
        e: &ChunkEntry,
        stored: &[u8],
        schema: &Schema,
        out: &mut [u8],
    ) -> Result<()> {
        let codec = Codec::from_code(e.codec).unwrap_or(Codec::None);
        let elem = elements(schema, e);
        thread_local! {
            static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        SCRATCH
            .with(|scratch| codec.decode_into(stored, out, elem, &mut scratch.borrow_mut()))
            .map_err(|source| Error::BadChunk {
                site: self.site(c, schema),
                source,
            })
    }

    /// Rows `rows` of chunk `c`, a chunk of codec fp8, as stored: their scales and codes,
    /// checked.
    pub fn fp8_rows<'s>(
        &self,
        c: u64,
        e: &ChunkEntry,
        stored: &'s [u8],
        schema: &Schema,
        rows: Range<usize>,
    ) -> Result<(Vec<f32>, &'s [u8])> {
        self.fp8_chunk(c, e, stored, schema, |chunk| chunk.rows(rows))
    }

    /// `f` of the payload of chunk `c` (codec fp8) seen as its scales and codes; its errors
    /// name the chunk.
    fn fp8_chunk<'s, T>(
        &self,
        c: u64,
        e: &ChunkEntry,
        stored: &'s [u8],
        schema: &Schema,
        f: impl FnOnce(
            crate::format::fp8::Fp8Chunk<'s>,
        ) -> std::result::Result<T, crate::format::FormatError>,
    ) -> Result<T> {
        let el = elements(schema, e);
        crate::format::fp8::Fp8Chunk::split(
            stored,
            e.row_count as usize * el.row_elems,
            el.row_elems,
            el.group,
        )
        .and_then(f)
        .map_err(|source| Error::BadChunk {
            site: self.site(c, schema),
            source,
        })
    }

    /// Decodes rows `rows` of chunk `c`, a chunk of codec fp8, into `out` (exactly those
    /// rows): the other rows are not touched.
    pub fn decode_fp8_rows_into(
        &self,
        c: u64,
        e: &ChunkEntry,
        stored: &[u8],
        schema: &Schema,
        rows: Range<usize>,
        out: &mut [u8],
    ) -> Result<()> {
        let dtype = elements(schema, e).dtype;
        self.fp8_chunk(c, e, stored, schema, |chunk| {
            chunk.dequantize_rows_into(rows, out, dtype)
        })
    }

    /// Decodes chunk `c` (zero-copy for codec none).
    pub fn decode_chunk<'a>(
        &'a self,
        c: u64,
        e: &ChunkEntry,
        stored: &'a [u8],
        schema: &Schema,
    ) -> Result<std::borrow::Cow<'a, [u8]>> {
        let codec = Codec::from_code(e.codec).unwrap_or(Codec::None);
        if codec == Codec::None {
            return Ok(std::borrow::Cow::Borrowed(stored));
        }
        let elem = elements(schema, e);
        codec
            .decode(stored, e.raw_len, elem)
            .map(std::borrow::Cow::Owned)
            .map_err(|source| Error::BadChunk {
                site: self.site(c, schema),
                source,
            })
    }
}

/// `e`, met opening the shard of `record`; a file that is not there (`NotFound`) is named as
/// a shard the manifest lists but that is missing, with the samples it holds and how to restore
/// it (still `NotFound`: damage, that `verify` reports and `repair` mends).
fn missing(e: Error, record: &ShardRecord) -> Error {
    let path = match e {
        Error::Io { path, source, .. } if source.kind() == std::io::ErrorKind::NotFound => path,
        e => return e,
    };
    Error::Io {
        path,
        op: "open",
        source: std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!(
                "the file is missing, but the manifest lists it as {}; restore it from an \
                 intact copy with `hspack repair DATASET --from COPY`",
                held_by(record)
            ),
        ),
    }
}

/// What the shard of `record` holds, for messages: `shard 3 holding the samples of ordinals
/// 24 to 31`.
pub(crate) fn held_by(record: &ShardRecord) -> String {
    let samples = match record.samples {
        0 => "no samples".to_string(),
        n => format!(
            "the samples of ordinals {} to {}",
            record.first_ordinal,
            record.first_ordinal.saturating_add(n - 1)
        ),
    };
    format!("shard {} holding {samples}", record.seq)
}

/// The elements of the field chunk `e` holds (the index check made sure there is one).
fn elements(schema: &Schema, e: &ChunkEntry) -> Elements {
    schema
        .field(e.field.into())
        .map(Elements::of)
        .unwrap_or(Elements::plain(crate::format::DType::U8))
}

/// What names a shard file in a memo of checked chunks, beyond its dataset and index: the
/// mapped file's device, inode and status change time (a file copied over a deleted one may
/// get its inode number at once), an object's version, else its path (a store's file).
fn file_identity(file: &dyn FileReader, path: &Path) -> String {
    if let Some(m) = file.whole().and_then(|b| b.mapping()) {
        let (s, ns) = m.changed;
        return format!("{:x}.{:x}.{s:x}.{ns:x}", m.file.dev, m.file.ino);
    }
    let named = match file.version() {
        Some(v) => blake3::hash(v.as_bytes()),
        None => blake3::hash(path.as_os_str().as_encoded_bytes()),
    };
    hex(&named.as_bytes()[..8])
}
