//! A shard's index: sample, extent, chunk and key tables plus the key blob.
//!
//! ```text
//! IndexHeader (64) | SampleEntry × S (64 each) | ExtentEntry × E (32 each)
//!                  | ChunkEntry × C (96 each) | KeyEntry × S (16 each) | key bytes (K)
//! ```

use std::ops::Range;

use bytemuck::Pod;

use super::layout::{ChunkEntry, ExtentEntry, IndexHeader, KeyEntry, SampleEntry, INDEX_MAGIC};
use super::{key_hash, Codec, FormatError, Schema};

/// Largest decoded chunk (256 MiB): a declared size above it is refused before allocating.
pub const MAX_CHUNK_BYTES: u64 = 256 << 20;

const S: &str = "shard index";

fn invalid(what: &'static str, value: u64, rule: impl Into<String>) -> FormatError {
    FormatError::Invalid {
        structure: S,
        what,
        value,
        rule: rule.into(),
    }
}

/// A decoded, validated view of index bytes. Entries are read on access, so the bytes need no
/// alignment.
#[derive(Debug, Clone, Copy)]
pub struct Index<'a> {
    header: IndexHeader,
    samples: &'a [u8],
    extents: &'a [u8],
    chunks: &'a [u8],
    keys: &'a [u8],
    blob: &'a [u8],
}

fn entry<T: Pod>(table: &[u8], i: u64) -> Option<T> {
    let size = std::mem::size_of::<T>();
    let start = usize::try_from(i).ok()?.checked_mul(size)?;
    let bytes = table.get(start..start.checked_add(size)?)?;
    Some(bytemuck::pod_read_unaligned(bytes))
}

fn table_len(count: u64, size: usize) -> Result<usize, FormatError> {
    count
        .checked_mul(size as u64)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| invalid("table size", count, "addressable on this machine"))
}

impl<'a> Index<'a> {
    /// Splits `bytes` into tables. Checks the header and that the sizes add up; call
    /// [`Index::validate`] to check the entries.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, FormatError> {
        let head = bytes
            .get(..IndexHeader::SIZE)
            .ok_or(FormatError::Truncated {
                structure: S,
                needed: IndexHeader::SIZE as u64,
                available: bytes.len() as u64,
            })?;
        let header: IndexHeader = bytemuck::pod_read_unaligned(head);
        if header.magic != INDEX_MAGIC {
            return Err(FormatError::BadMagic {
                structure: S,
                found: header.magic,
                expected: "HSPKINDX",
            });
        }
        if let Some(i) = header.reserved.iter().position(|&b| b != 0) {
            return Err(FormatError::ReservedNotZero {
                structure: S,
                offset: 48 + i,
            });
        }
        let lens = [
            table_len(header.sample_count, SampleEntry::SIZE)?,
            table_len(header.extent_count, ExtentEntry::SIZE)?,
            table_len(header.chunk_count, ChunkEntry::SIZE)?,
            table_len(header.sample_count, KeyEntry::SIZE)?,
            table_len(header.keys_len, 1)?,
        ];
        let total = lens
            .iter()
            .try_fold(IndexHeader::SIZE, |acc, &n| acc.checked_add(n))
            .ok_or_else(|| invalid("table sizes", u64::MAX, "a sum addressable on this machine"))?;
        if total != bytes.len() {
            return Err(invalid(
                "length",
                bytes.len() as u64,
                format!("{total}, the size its header declares"),
            ));
        }
        let mut rest = &bytes[IndexHeader::SIZE..];
        let mut take = |n: usize| {
            let (a, b) = rest.split_at(n);
            rest = b;
            a
        };
        Ok(Index {
            header,
            samples: take(lens[0]),
            extents: take(lens[1]),
            chunks: take(lens[2]),
            keys: take(lens[3]),
            blob: take(lens[4]),
        })
    }

    /// The header.
    pub fn header(&self) -> &IndexHeader {
        &self.header
    }

    /// Samples in the shard.
    pub fn sample_count(&self) -> u64 {
        self.header.sample_count
    }

    /// Chunks in the shard.
    pub fn chunk_count(&self) -> u64 {
        self.header.chunk_count
    }

    /// Sample `i` of the shard.
    pub fn sample(&self, i: u64) -> Option<SampleEntry> {
        entry(self.samples, i)
    }

    /// Extent `i` of the extent table.
    pub fn extent(&self, i: u64) -> Option<ExtentEntry> {
        entry(self.extents, i)
    }

    /// Chunk `i`.
    pub fn chunk(&self, i: u64) -> Option<ChunkEntry> {
        entry(self.chunks, i)
    }

    /// Key table entry `i`.
    pub fn key_entry(&self, i: u64) -> Option<KeyEntry> {
        entry(self.keys, i)
    }

    /// Decoded bytes of all samples: the sum of their `raw_bytes`, `None` where it reaches
    /// 2^64 (what the manifest's record of the shard must hold, FORMAT.md §6).
    pub fn raw_bytes(&self) -> Option<u64> {
        (0..self.header.sample_count)
            .try_fold(0u64, |sum, i| sum.checked_add(self.sample(i)?.raw_bytes))
    }

    /// The key of a sample entry.
    pub fn key_of(&self, s: &SampleEntry) -> Option<&'a str> {
        let start = usize::try_from(s.key_offset).ok()?;
        let bytes = self
            .blob
            .get(start..start.checked_add(s.key_len as usize)?)?;
        std::str::from_utf8(bytes).ok()
    }

    /// The extents of a sample entry.
    pub fn extents_of(&self, s: &SampleEntry) -> impl Iterator<Item = ExtentEntry> + '_ {
        let start = s.extent_start;
        (0..u64::from(s.extent_count)).filter_map(move |i| self.extent(start.checked_add(i)?))
    }

    /// The shard-local position of the sample with `key`.
    pub fn find_key(&self, key: &str) -> Option<u64> {
        let h = key_hash(key);
        let n = self.header.sample_count;
        // First entry with hash >= h.
        let (mut lo, mut hi) = (0u64, n);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.key_entry(mid)?.hash < h {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        (lo..n)
            .map_while(|i| self.key_entry(i).filter(|e| e.hash == h))
            .map(|e| u64::from(e.sample))
            .find(|&i| self.sample(i).and_then(|s| self.key_of(&s)) == Some(key))
    }

    /// Checks every entry against the schema and the file region that holds chunks:
    /// ordinals count up, keys are UTF-8, unique and in the key table, chunks lie in
    /// `data`, in order and apart, and each field of each sample is covered exactly by its
    /// extents.
    pub fn validate(
        &self,
        schema: &Schema,
        data: Range<u64>,
        align: u64,
    ) -> Result<(), FormatError> {
        let nfields = schema.fields.len();
        let mut prev_end = data.start;
        for c in 0..self.header.chunk_count {
            let e = self
                .chunk(c)
                .ok_or_else(|| invalid("chunk", c, "present"))?;
            let field = schema.field(e.field as usize).ok_or_else(|| {
                invalid("chunk field", e.field.into(), format!("below {nfields}"))
            })?;
            let codec = Codec::from_code(e.codec)
                .ok_or_else(|| invalid("chunk codec", e.codec.into(), "0, 1, 2 or 3"))?;
            if (codec == Codec::Fp8) != field.quantized.is_some() {
                return Err(invalid(
                    "chunk codec",
                    e.codec.into(),
                    format!(
                        "3 (fp8) in a field the schema quantizes and only there (field `{}`)",
                        field.name
                    ),
                ));
            }
            if e.dtype != field.dtype.code() {
                return Err(invalid(
                    "chunk dtype",
                    e.dtype.into(),
                    format!("{} as the schema says", field.dtype.code()),
                ));
            }
            if e.row_count.checked_mul(field.row_bytes()) != Some(e.raw_len) || e.row_count == 0 {
                return Err(invalid(
                    "chunk raw_len",
                    e.raw_len,
                    "rows × row bytes, rows ≥ 1",
                ));
            }
            if e.raw_len > MAX_CHUNK_BYTES {
                return Err(invalid(
                    "chunk raw_len",
                    e.raw_len,
                    format!("at most {MAX_CHUNK_BYTES}"),
                ));
            }
            let payload = e
                .payload_offset()
                .ok_or_else(|| invalid("chunk offset", e.offset, "below 2^64"))?;
            let end = payload
                .checked_add(e.stored_len)
                .ok_or_else(|| invalid("chunk stored_len", e.stored_len, "inside the file"))?;
            if e.offset < prev_end || end > data.end {
                return Err(invalid(
                    "chunk offset",
                    e.offset,
                    "after the previous chunk and before the index",
                ));
            }
            if codec == Codec::None && (e.stored_len != e.raw_len || payload % align != 0) {
                return Err(invalid(
                    "chunk offset",
                    e.offset,
                    "aligned, and stored_len == raw_len, for codec none",
                ));
            }
            if codec == Codec::Fp8
                && Some(e.stored_len)
                    != super::fp8::stored_len(e.row_count, field.row_elems(), field.group())
            {
                return Err(invalid(
                    "chunk stored_len",
                    e.stored_len,
                    "a scale (4 bytes) per group and a byte per element, for codec fp8",
                ));
            }
            if e.reserved0 != 0 || e.reserved1 != 0 {
                return Err(FormatError::ReservedNotZero {
                    structure: S,
                    offset: 52,
                });
            }
            prev_end = end;
        }
        let has_loss_mask = schema
            .fields
            .iter()
            .any(|f| f.role == super::Role::LossMask);
        let mut ext_next = 0u64;
        for i in 0..self.header.sample_count {
            let s = self
                .sample(i)
                .ok_or_else(|| invalid("sample", i, "present"))?;
            if Some(s.ordinal) != self.header.first_ordinal.checked_add(i) {
                return Err(invalid(
                    "sample ordinal",
                    s.ordinal,
                    "first ordinal + position",
                ));
            }
            let key = self
                .key_of(&s)
                .ok_or_else(|| invalid("sample key", s.key_offset, "UTF-8 inside the key blob"))?;
            if self.find_key(key) != Some(i) {
                return Err(invalid(
                    "key table",
                    i,
                    "to list every key once, sorted by hash",
                ));
            }
            match (has_loss_mask, s.loss_rows) {
                (false, u64::MAX) => {}
                (true, n) if n <= s.rows => {}
                (false, n) => {
                    return Err(invalid(
                        "sample loss_rows",
                        n,
                        "u64::MAX: the schema has no loss-mask field",
                    ))
                }
                (true, n) => {
                    return Err(invalid(
                        "sample loss_rows",
                        n,
                        format!("at most its {} rows", s.rows),
                    ))
                }
            }
            if s.extent_start != ext_next {
                return Err(invalid(
                    "sample extent_start",
                    s.extent_start,
                    format!("{ext_next}: extents follow in order"),
                ));
            }
            ext_next = s
                .extent_start
                .checked_add(s.extent_count.into())
                .filter(|&n| n <= self.header.extent_count)
                .ok_or_else(|| {
                    invalid(
                        "sample extent_count",
                        s.extent_count.into(),
                        "inside the extent table",
                    )
                })?;
            let mut field = 0usize;
            let mut row = 0u64;
            let mut raw = 0u64;
            for x in self.extents_of(&s) {
                while (x.field as usize) > field && row == s.rows {
                    field += 1;
                    row = 0;
                }
                let c = self.chunk(x.chunk.into()).ok_or_else(|| {
                    invalid("extent chunk", x.chunk.into(), "a chunk of this shard")
                })?;
                let fits = x
                    .chunk_row
                    .checked_add(x.row_count)
                    .is_some_and(|n| n <= c.row_count);
                if x.field as usize != field
                    || x.row_start != row
                    || c.field != x.field
                    || !fits
                    || x.row_count == 0
                {
                    return Err(invalid(
                        "extent",
                        x.row_start,
                        format!("rows {row}.. of field {field} inside its chunk"),
                    ));
                }
                if x.reserved != 0 {
                    return Err(FormatError::ReservedNotZero {
                        structure: S,
                        offset: 30,
                    });
                }
                row = row
                    .checked_add(x.row_count)
                    .filter(|&r| r <= s.rows)
                    .ok_or_else(|| invalid("extent rows", x.row_count, "within the sample"))?;
                raw = raw.saturating_add(x.row_count * schema.fields[field].row_bytes());
            }
            while row == s.rows && field + 1 < nfields {
                field += 1;
                row = 0;
            }
            if nfields > 0 && (field + 1 != nfields || row != s.rows) && s.rows != 0 {
                return Err(invalid(
                    "sample extents",
                    i,
                    "to cover every row of every field",
                ));
            }
            if s.raw_bytes != raw || s.reserved != 0 {
                return Err(invalid(
                    "sample raw_bytes",
                    s.raw_bytes,
                    format!("{raw}, the sum of its extents"),
                ));
            }
        }
        if ext_next != self.header.extent_count {
            return Err(invalid(
                "extent table",
                self.header.extent_count,
                format!("{ext_next} entries, all used"),
            ));
        }
        let mut prev: Option<KeyEntry> = None;
        for i in 0..self.header.sample_count {
            let k = self
                .key_entry(i)
                .ok_or_else(|| invalid("key entry", i, "present"))?;
            if k.reserved != 0 {
                return Err(FormatError::ReservedNotZero {
                    structure: S,
                    offset: 12,
                });
            }
            if prev.is_some_and(|p| p >= k) {
                return Err(invalid(
                    "key table",
                    i,
                    "sorted by (hash, sample) without repeats",
                ));
            }
            prev = Some(k);
        }
        Ok(())
    }
}

/// Builds index bytes.
#[derive(Debug, Default, Clone)]
pub struct IndexBuilder {
    first_ordinal: u64,
    samples: Vec<SampleEntry>,
    extents: Vec<ExtentEntry>,
    chunks: Vec<ChunkEntry>,
    keys: Vec<KeyEntry>,
    blob: Vec<u8>,
}

impl IndexBuilder {
    /// An empty index whose first sample has ordinal `first_ordinal`.
    pub fn new(first_ordinal: u64) -> Self {
        IndexBuilder {
            first_ordinal,
            ..Default::default()
        }
    }

    /// Adds a chunk; returns its number.
    pub fn push_chunk(&mut self, e: ChunkEntry) -> u32 {
        self.chunks.push(e);
        (self.chunks.len() - 1) as u32
    }

    /// Chunks added so far.
    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// Samples added so far.
    pub fn sample_count(&self) -> u64 {
        self.samples.len() as u64
    }

    /// Ordinal of the first sample.
    pub fn header_first_ordinal(&self) -> u64 {
        self.first_ordinal
    }

    /// Chunks added so far, in chunk-number order.
    pub fn chunks(&self) -> &[ChunkEntry] {
        &self.chunks
    }

    /// Moves every ordinal so that the first sample has `first_ordinal`: a shard written
    /// before its place in the dataset was known gets it at commit.
    pub fn rebase(&mut self, first_ordinal: u64) {
        let old = self.first_ordinal;
        let moved = |o: u64| first_ordinal + (o - old);
        for s in &mut self.samples {
            s.ordinal = moved(s.ordinal);
        }
        for c in &mut self.chunks {
            c.sample = moved(c.sample);
        }
        self.first_ordinal = first_ordinal;
    }

    /// Adds a sample with its extents (sorted by field, then row).
    pub fn push_sample(
        &mut self,
        key: &str,
        rows: u64,
        loss_rows: u64,
        raw_bytes: u64,
        extents: &[ExtentEntry],
    ) {
        let i = self.samples.len() as u64;
        self.samples.push(SampleEntry {
            ordinal: self.first_ordinal + i,
            rows,
            key_offset: self.blob.len() as u64,
            key_len: key.len() as u32,
            extent_count: extents.len() as u32,
            extent_start: self.extents.len() as u64,
            loss_rows,
            raw_bytes,
            reserved: 0,
        });
        self.blob.extend_from_slice(key.as_bytes());
        self.extents.extend_from_slice(extents);
        self.keys.push(KeyEntry {
            hash: key_hash(key),
            sample: i as u32,
            reserved: 0,
        });
    }

    /// The index bytes.
    pub fn encode(mut self) -> Vec<u8> {
        self.keys.sort_unstable();
        let header = IndexHeader {
            magic: INDEX_MAGIC,
            sample_count: self.samples.len() as u64,
            extent_count: self.extents.len() as u64,
            chunk_count: self.chunks.len() as u64,
            keys_len: self.blob.len() as u64,
            first_ordinal: self.first_ordinal,
            reserved: [0; 16],
        };
        let mut out = Vec::new();
        out.extend_from_slice(bytemuck::bytes_of(&header));
        out.extend_from_slice(bytemuck::cast_slice(&self.samples));
        out.extend_from_slice(bytemuck::cast_slice(&self.extents));
        out.extend_from_slice(bytemuck::cast_slice(&self.chunks));
        out.extend_from_slice(bytemuck::cast_slice(&self.keys));
        out.extend_from_slice(&self.blob);
        out
    }
}
