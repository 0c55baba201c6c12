//! Fixed-size little-endian structures of a shard, as `bytemuck` plain-old-data.
//!
//! Every structure here has a size that is a multiple of 8 and no implicit padding, so it can
//! be read straight from a mapped file. Decoders take `&[u8]`, copy the structure out (no
//! alignment needed), check magic, version, check value and reserved bytes, and return it.
//! Values that refer to other parts of the file are checked by the index layer.

use bytemuck::{Pod, Zeroable};

use super::FormatError;

/// Current format version, written into shard headers, footers and the manifest.
pub const VERSION: u16 = 1;
/// Oldest format version this library reads.
pub const MIN_VERSION: u16 = 1;

/// Magic of a shard header.
pub const SHARD_MAGIC: [u8; 8] = *b"HSPKSHRD";
/// Magic of a chunk header.
pub const CHUNK_MAGIC: [u8; 8] = *b"HSPKCHNK";
/// Magic of an index header.
pub const INDEX_MAGIC: [u8; 8] = *b"HSPKINDX";
/// Magic at both ends of a footer.
pub const FOOTER_MAGIC: [u8; 8] = *b"HSPKFOOT";

/// Smallest payload alignment a shard may declare (log2): 64 bytes.
pub const MIN_ALIGN_LOG2: u8 = 6;
/// Largest payload alignment a shard may declare (log2): 1 MiB.
pub const MAX_ALIGN_LOG2: u8 = 20;
/// Default payload alignment (log2): 4 KiB, the page size, for zero-copy mapping and direct I/O.
pub const DEFAULT_ALIGN_LOG2: u8 = 12;

/// The first 8 bytes of the BLAKE3 hash of `bytes`, as a little-endian u64.
pub fn check64(bytes: &[u8]) -> u64 {
    let hash = blake3::hash(bytes);
    let mut first = [0u8; 8];
    first.copy_from_slice(&hash.as_bytes()[..8]);
    u64::from_le_bytes(first)
}

/// The 8-byte hash of a sample key used by the key table.
pub fn key_hash(key: &str) -> u64 {
    check64(key.as_bytes())
}

fn read_pod<T: Pod>(bytes: &[u8], structure: &'static str) -> Result<T, FormatError> {
    let size = std::mem::size_of::<T>();
    let src = bytes.get(..size).ok_or(FormatError::Truncated {
        structure,
        needed: size as u64,
        available: bytes.len() as u64,
    })?;
    Ok(bytemuck::pod_read_unaligned(src))
}

/// Refuses magic bytes other than `expected`.
pub(crate) fn expect_magic(
    found: [u8; 8],
    expected: &'static [u8; 8],
    structure: &'static str,
) -> Result<(), FormatError> {
    if &found == expected {
        Ok(())
    } else {
        Err(FormatError::BadMagic {
            structure,
            found,
            expected: std::str::from_utf8(expected).unwrap_or("?"),
        })
    }
}

fn expect_version(found: u16, structure: &'static str) -> Result<(), FormatError> {
    expect_version_in(found, MIN_VERSION..=VERSION, structure)
}

/// Refuses a version outside `known`.
pub(crate) fn expect_version_in(
    found: u16,
    known: std::ops::RangeInclusive<u16>,
    structure: &'static str,
) -> Result<(), FormatError> {
    if known.contains(&found) {
        Ok(())
    } else {
        Err(FormatError::UnsupportedVersion {
            structure,
            found: found.into(),
            min: (*known.start()).into(),
            max: (*known.end()).into(),
        })
    }
}

fn expect_zero(bytes: &[u8], base: usize, structure: &'static str) -> Result<(), FormatError> {
    match bytes.iter().position(|&b| b != 0) {
        None => Ok(()),
        Some(i) => Err(FormatError::ReservedNotZero {
            structure,
            offset: base + i,
        }),
    }
}

fn expect_check(covered: &[u8], stored: u64, structure: &'static str) -> Result<(), FormatError> {
    let computed = check64(covered);
    if computed == stored {
        Ok(())
    } else {
        Err(FormatError::CheckMismatch {
            structure,
            stored,
            computed,
        })
    }
}

/// The first 128 bytes of a shard file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct ShardHeader {
    /// `HSPKSHRD`.
    pub magic: [u8; 8],
    /// Format version.
    pub version: u16,
    /// log2 of the payload alignment of uncompressed chunks.
    pub align_log2: u8,
    /// Zero.
    pub reserved0: u8,
    /// Sequence number of the shard in its dataset.
    pub shard_seq: u32,
    /// Random id of the dataset the shard belongs to.
    pub dataset_id: [u8; 16],
    /// BLAKE3 of the canonical schema JSON.
    pub schema_hash: [u8; 32],
    /// Zero.
    pub reserved1: [u8; 56],
    /// `check64` of bytes 0..120.
    pub check: u64,
}

impl ShardHeader {
    /// Size in bytes.
    pub const SIZE: usize = 128;

    /// A header with its check value filled in.
    pub fn new(
        shard_seq: u32,
        dataset_id: [u8; 16],
        schema_hash: [u8; 32],
        align_log2: u8,
    ) -> Self {
        let mut h = ShardHeader {
            magic: SHARD_MAGIC,
            version: VERSION,
            align_log2,
            reserved0: 0,
            shard_seq,
            dataset_id,
            schema_hash,
            reserved1: [0; 56],
            check: 0,
        };
        h.check = check64(&bytemuck::bytes_of(&h)[..120]);
        h
    }

    /// Decodes and checks a header from the start of `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        const S: &str = "shard header";
        let h: ShardHeader = read_pod(bytes, S)?;
        expect_magic(h.magic, &SHARD_MAGIC, S)?;
        expect_version(h.version, S)?;
        expect_check(&bytemuck::bytes_of(&h)[..120], h.check, S)?;
        expect_zero(&[h.reserved0], 11, S)?;
        expect_zero(&h.reserved1, 64, S)?;
        if !(MIN_ALIGN_LOG2..=MAX_ALIGN_LOG2).contains(&h.align_log2) {
            return Err(FormatError::Invalid {
                structure: S,
                what: "align_log2",
                value: h.align_log2.into(),
                rule: format!("in {MIN_ALIGN_LOG2}..={MAX_ALIGN_LOG2}"),
            });
        }
        Ok(h)
    }
}

/// The 128 bytes in front of every chunk payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct ChunkHeader {
    /// `HSPKCHNK`.
    pub magic: [u8; 8],
    /// Position of the chunk in the shard's chunk table.
    pub chunk_id: u32,
    /// Sequence number of the shard.
    pub shard_seq: u32,
    /// Codec code.
    pub codec: u8,
    /// DType code of the elements.
    pub dtype: u8,
    /// Field number in the schema.
    pub field: u16,
    /// Zero.
    pub reserved0: u32,
    /// Ordinal of the sample the chunk was written for.
    pub sample: u64,
    /// First row of that sample held by the chunk.
    pub row_start: u64,
    /// Rows held.
    pub row_count: u64,
    /// Bytes after decoding.
    pub raw_len: u64,
    /// Bytes stored after this header.
    pub stored_len: u64,
    /// BLAKE3 of the stored bytes.
    pub hash: [u8; 32],
    /// Zero.
    pub reserved1: [u8; 24],
    /// `check64` of bytes 0..120.
    pub check: u64,
}

impl ChunkHeader {
    /// Size in bytes.
    pub const SIZE: usize = 128;

    /// Fills in magic and check value.
    pub fn seal(mut self) -> Self {
        self.magic = CHUNK_MAGIC;
        self.check = check64(&bytemuck::bytes_of(&self)[..120]);
        self
    }

    /// Decodes and checks a chunk header from the start of `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        const S: &str = "chunk header";
        let h: ChunkHeader = read_pod(bytes, S)?;
        expect_magic(h.magic, &CHUNK_MAGIC, S)?;
        expect_check(&bytemuck::bytes_of(&h)[..120], h.check, S)?;
        expect_zero(&h.reserved0.to_le_bytes(), 20, S)?;
        expect_zero(&h.reserved1, 96, S)?;
        Ok(h)
    }
}

/// The last 128 bytes of a shard file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct Footer {
    /// `HSPKFOOT`.
    pub magic: [u8; 8],
    /// Format version.
    pub version: u16,
    /// Zero.
    pub reserved0: u16,
    /// Sequence number of the shard.
    pub shard_seq: u32,
    /// Random id of the dataset.
    pub dataset_id: [u8; 16],
    /// Offset of the index from the start of the file.
    pub index_offset: u64,
    /// Length of the index.
    pub index_len: u64,
    /// BLAKE3 of the index bytes.
    pub index_hash: [u8; 32],
    /// Samples in the shard.
    pub sample_count: u64,
    /// Chunks in the shard.
    pub chunk_count: u64,
    /// Ordinal of the shard's first sample in the dataset.
    pub first_ordinal: u64,
    /// Length of the whole file, this footer included.
    pub file_len: u64,
    /// `check64` of bytes 0..112.
    pub check: u64,
    /// `HSPKFOOT` again: the last 8 bytes of every shard.
    pub end_magic: [u8; 8],
}

impl Footer {
    /// Size in bytes.
    pub const SIZE: usize = 128;

    /// Fills in magics, version and check value.
    pub fn seal(mut self) -> Self {
        self.magic = FOOTER_MAGIC;
        self.end_magic = FOOTER_MAGIC;
        self.version = VERSION;
        self.check = check64(&bytemuck::bytes_of(&self)[..112]);
        self
    }

    /// Decodes and checks the footer at the end of a file of `file_len` bytes, given its last
    /// [`Footer::SIZE`] bytes.
    pub fn decode(tail: &[u8], file_len: u64) -> Result<Self, FormatError> {
        const S: &str = "shard footer";
        if (tail.len() as u64) < Self::SIZE as u64
            || file_len < (ShardHeader::SIZE + Self::SIZE) as u64
        {
            return Err(FormatError::Truncated {
                structure: S,
                needed: (ShardHeader::SIZE + Self::SIZE) as u64,
                available: file_len.min(tail.len() as u64),
            });
        }
        let f: Footer = read_pod(&tail[tail.len() - Self::SIZE..], S)?;
        expect_magic(f.end_magic, &FOOTER_MAGIC, S)?;
        expect_magic(f.magic, &FOOTER_MAGIC, S)?;
        expect_version(f.version, S)?;
        expect_check(&bytemuck::bytes_of(&f)[..112], f.check, S)?;
        expect_zero(&f.reserved0.to_le_bytes(), 10, S)?;
        if f.file_len != file_len {
            return Err(FormatError::Invalid {
                structure: S,
                what: "file_len",
                value: f.file_len,
                rule: format!("the file's length, {file_len}"),
            });
        }
        let index_end = f.index_offset.checked_add(f.index_len);
        if f.index_offset < ShardHeader::SIZE as u64
            || index_end != Some(file_len - Self::SIZE as u64)
        {
            return Err(FormatError::Invalid {
                structure: S,
                what: "index_offset",
                value: f.index_offset,
                rule: "after the shard header, with the index ending where the footer starts"
                    .into(),
            });
        }
        Ok(f)
    }
}

/// The head of a shard's index: counts of the tables that follow it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct IndexHeader {
    /// `HSPKINDX`.
    pub magic: [u8; 8],
    /// Entries in the sample table and in the key table.
    pub sample_count: u64,
    /// Entries in the extent table.
    pub extent_count: u64,
    /// Entries in the chunk table.
    pub chunk_count: u64,
    /// Bytes in the key blob.
    pub keys_len: u64,
    /// Ordinal of the first sample.
    pub first_ordinal: u64,
    /// Zero.
    pub reserved: [u8; 16],
}

impl IndexHeader {
    /// Size in bytes.
    pub const SIZE: usize = 64;
}

/// One sample of a shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct SampleEntry {
    /// Ordinal in the dataset.
    pub ordinal: u64,
    /// Rows (tokens) of every field.
    pub rows: u64,
    /// Offset of the key in the key blob.
    pub key_offset: u64,
    /// Length of the key in bytes (UTF-8).
    pub key_len: u32,
    /// Extents of the sample.
    pub extent_count: u32,
    /// Position of the first extent in the extent table.
    pub extent_start: u64,
    /// Rows whose loss mask is set, or `u64::MAX` where the schema has no loss mask.
    pub loss_rows: u64,
    /// Decoded bytes of all fields.
    pub raw_bytes: u64,
    /// Zero.
    pub reserved: u64,
}

/// Rows of loss mask `mask` (rows of `row_bytes` bytes) that are set: any byte non-zero.
/// What a sample's `loss_rows` records.
pub fn loss_rows_of(mask: &[u8], row_bytes: usize) -> u64 {
    mask.chunks_exact(row_bytes.max(1))
        .filter(|r| r.iter().any(|&b| b != 0))
        .count() as u64
}

impl SampleEntry {
    /// Rows whose loss mask is set, when the schema has a loss mask (`loss_rows` holds
    /// `u64::MAX` when it has none).
    pub fn loss_rows(&self) -> Option<u64> {
        (self.loss_rows != u64::MAX).then_some(self.loss_rows)
    }

    /// Size in bytes.
    pub const SIZE: usize = 64;
}

/// A run of rows of one field of one sample, held by one chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct ExtentEntry {
    /// First row within the sample.
    pub row_start: u64,
    /// Rows.
    pub row_count: u64,
    /// First row within the chunk.
    pub chunk_row: u64,
    /// Chunk table position.
    pub chunk: u32,
    /// Field number in the schema.
    pub field: u16,
    /// Zero.
    pub reserved: u16,
}

impl ExtentEntry {
    /// Size in bytes.
    pub const SIZE: usize = 32;
}

/// Where a chunk lies and what it must hash to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct ChunkEntry {
    /// Offset of the chunk header in the file; the payload follows the header.
    pub offset: u64,
    /// Bytes after decoding.
    pub raw_len: u64,
    /// Bytes stored.
    pub stored_len: u64,
    /// Rows held.
    pub row_count: u64,
    /// Ordinal of the sample the chunk was written for.
    pub sample: u64,
    /// First row of that sample held by the chunk.
    pub row_start: u64,
    /// Field number in the schema.
    pub field: u16,
    /// Codec code.
    pub codec: u8,
    /// DType code.
    pub dtype: u8,
    /// Zero.
    pub reserved0: u32,
    /// BLAKE3 of the stored bytes.
    pub hash: [u8; 32],
    /// Zero.
    pub reserved1: u64,
}

impl ChunkEntry {
    /// Size in bytes.
    pub const SIZE: usize = 96;

    /// The offset of the payload: right after the chunk header.
    pub fn payload_offset(&self) -> Option<u64> {
        self.offset.checked_add(ChunkHeader::SIZE as u64)
    }
}

/// A key hash and the shard-local sample it belongs to; the table is sorted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Pod, Zeroable)]
#[repr(C)]
pub struct KeyEntry {
    /// [`key_hash`] of the key.
    pub hash: u64,
    /// Position of the sample in the shard's sample table.
    pub sample: u32,
    /// Zero.
    pub reserved: u32,
}

impl KeyEntry {
    /// Size in bytes.
    pub const SIZE: usize = 16;
}

const _: () = {
    assert!(std::mem::size_of::<ShardHeader>() == ShardHeader::SIZE);
    assert!(std::mem::size_of::<ChunkHeader>() == ChunkHeader::SIZE);
    assert!(std::mem::size_of::<Footer>() == Footer::SIZE);
    assert!(std::mem::size_of::<IndexHeader>() == IndexHeader::SIZE);
    assert!(std::mem::size_of::<SampleEntry>() == SampleEntry::SIZE);
    assert!(std::mem::size_of::<ExtentEntry>() == ExtentEntry::SIZE);
    assert!(std::mem::size_of::<ChunkEntry>() == ChunkEntry::SIZE);
    assert!(std::mem::size_of::<KeyEntry>() == KeyEntry::SIZE);
};
