//! Pack files: blobs laid one after another, then a table of them and a footer (FORMAT.md
//! §11.2). A pack is written once under a temp name and published whole; its table makes it
//! self-describing: `store verify` checks the index's entries against it.

use crate::error::Result;
use crate::format::manifest::hex;
use crate::format::FormatError;
use crate::io::{NewFile, Storage};

/// Magic at the start of a pack.
pub const PACK_MAGIC: &[u8; 8] = b"HSPKPACK";
/// Magic at the end of a pack.
pub const PACK_END_MAGIC: &[u8; 8] = b"HSPKPEND";
/// Pack format version.
pub const PACK_VERSION: u16 = 1;
/// Bytes of the pack header.
pub const PACK_HEADER: usize = 64;
/// Bytes of the pack footer.
pub const PACK_FOOTER: usize = 64;
/// Bytes of one table entry.
pub const PACK_ENTRY: usize = 64;
/// Every blob starts at a multiple of this, so a tensor payload read in place is aligned for
/// any dtype.
pub const BLOB_ALIGN: u64 = 64;
/// A pack is closed once its blobs pass this many bytes.
pub const PACK_TARGET: u64 = 64 << 20;

/// How a blob's bytes are held in its pack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlobCodec {
    /// As they are.
    None,
    /// One zstd frame.
    Zstd,
}

impl BlobCodec {
    /// The code in pack tables and index runs.
    pub fn code(self) -> u8 {
        match self {
            BlobCodec::None => 0,
            BlobCodec::Zstd => 1,
        }
    }

    /// The codec of `code`.
    pub fn from_code(code: u8) -> Option<Self> {
        match code {
            0 => Some(BlobCodec::None),
            1 => Some(BlobCodec::Zstd),
            _ => None,
        }
    }
}

/// Where a blob is in its pack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlobEntry {
    /// BLAKE3 of the blob's bytes (before its codec).
    pub id: [u8; 32],
    /// Offset of its stored bytes in the pack.
    pub offset: u64,
    /// Stored bytes.
    pub stored_len: u64,
    /// Bytes once decoded.
    pub raw_len: u64,
    /// Codec of the stored bytes.
    pub codec: BlobCodec,
}

pub(crate) fn invalid(
    structure: &'static str,
    what: &'static str,
    value: u64,
    rule: &str,
) -> FormatError {
    FormatError::Invalid {
        structure,
        what,
        value,
        rule: rule.into(),
    }
}

/// Refuses `found` (8 bytes) when it is not `expected`.
pub(crate) fn magic(
    found: &[u8],
    expected: &'static [u8; 8],
    structure: &'static str,
) -> Result<(), FormatError> {
    let found: [u8; 8] = found.try_into().expect("8 magic bytes");
    crate::format::layout::expect_magic(found, expected, structure)
}

/// Refuses a version other than `known`.
pub(crate) fn version(found: u16, known: u16, structure: &'static str) -> Result<(), FormatError> {
    crate::format::layout::expect_version_in(found, known..=known, structure)
}

pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl BlobEntry {
    /// The 64-byte table form.
    pub fn encode(&self) -> [u8; PACK_ENTRY] {
        let mut b = [0u8; PACK_ENTRY];
        b[..32].copy_from_slice(&self.id);
        b[32..40].copy_from_slice(&self.offset.to_le_bytes());
        b[40..48].copy_from_slice(&self.stored_len.to_le_bytes());
        b[48..56].copy_from_slice(&self.raw_len.to_le_bytes());
        b[56] = self.codec.code();
        b
    }

    /// Reads a table entry; a codec no reader knows, reserved bytes that are not zero, or a
    /// plain blob whose lengths differ are refused.
    pub fn decode(b: &[u8]) -> Result<Self, FormatError> {
        if b.len() < PACK_ENTRY {
            return Err(invalid("pack table", "entry bytes", b.len() as u64, "64"));
        }
        let codec = BlobCodec::from_code(b[56])
            .ok_or_else(|| invalid("pack table", "codec", b[56].into(), "0 or 1"))?;
        if b[57..64].iter().any(|&x| x != 0) {
            return Err(invalid("pack table", "reserved", 1, "zero"));
        }
        let e = BlobEntry {
            id: b[..32].try_into().expect("32 bytes"),
            offset: u64_at(b, 32),
            stored_len: u64_at(b, 40),
            raw_len: u64_at(b, 48),
            codec,
        };
        if e.codec == BlobCodec::None && e.stored_len != e.raw_len {
            return Err(invalid(
                "pack table",
                "stored length",
                e.stored_len,
                "the raw length for a blob stored as it is",
            ));
        }
        Ok(e)
    }
}

/// Reads a pack's table from the pack's bytes `tail` (its last `tail.len()` bytes; pass at
/// least the footer) given the pack's length: `Ok(Err(n))` asks for the last `n` bytes
/// instead, when the table does not fit in `tail`.
pub fn decode_table(
    tail: &[u8],
    pack_len: u64,
) -> Result<std::result::Result<Vec<BlobEntry>, u64>, FormatError> {
    if tail.len() < PACK_FOOTER || pack_len < (PACK_HEADER + PACK_FOOTER) as u64 {
        return Err(invalid(
            "pack footer",
            "pack length",
            pack_len,
            "at least 128",
        ));
    }
    let f = &tail[tail.len() - PACK_FOOTER..];
    magic(&f[56..64], PACK_END_MAGIC, "pack footer")?;
    let table_offset = u64_at(f, 0);
    let entries = u64_at(f, 8);
    let table_len = entries
        .checked_mul(PACK_ENTRY as u64)
        .filter(|&n| {
            table_offset >= PACK_HEADER as u64
                && table_offset.is_multiple_of(BLOB_ALIGN)
                && table_offset.checked_add(n) == Some(pack_len - PACK_FOOTER as u64)
        })
        .ok_or_else(|| {
            invalid(
                "pack footer",
                "table offset",
                table_offset,
                "a multiple of 64, and table offset + 64 × entries = pack length − 64",
            )
        })?;
    if u64_at(f, 48) != 0 {
        return Err(invalid("pack footer", "reserved", u64_at(f, 48), "zero"));
    }
    let need = table_len + PACK_FOOTER as u64;
    if (tail.len() as u64) < need {
        return Ok(Err(need));
    }
    let table = &tail[tail.len() - need as usize..tail.len() - PACK_FOOTER];
    if blake3::hash(table).as_bytes() != &f[16..48] {
        return Err(invalid(
            "pack footer",
            "table blake3",
            0,
            "the BLAKE3 of the table",
        ));
    }
    let mut out = Vec::with_capacity(entries as usize);
    let mut end = PACK_HEADER as u64;
    for b in table.chunks_exact(PACK_ENTRY) {
        let e = BlobEntry::decode(b)?;
        let stop = e.offset.checked_add(e.stored_len);
        if e.offset < end || e.offset % BLOB_ALIGN != 0 || stop.is_none_or(|s| s > table_offset) {
            return Err(invalid(
                "pack table",
                "blob offset",
                e.offset,
                "blobs in order, 64-aligned, after the header and before the table",
            ));
        }
        end = stop.expect("checked");
        out.push(e);
    }
    Ok(Ok(out))
}

/// Checks a pack header.
pub fn check_header(b: &[u8], pack_id: &[u8; 16]) -> Result<(), FormatError> {
    if b.len() < PACK_HEADER {
        return Err(FormatError::Truncated {
            structure: "pack header",
            needed: PACK_HEADER as u64,
            available: b.len() as u64,
        });
    }
    magic(&b[..8], PACK_MAGIC, "pack header")?;
    version(
        u16::from_le_bytes([b[8], b[9]]),
        PACK_VERSION,
        "pack header",
    )?;
    if b[10..16].iter().chain(&b[32..PACK_HEADER]).any(|&z| z != 0) {
        return Err(invalid("pack header", "reserved", 0, "zero"));
    }
    if &b[16..32] != pack_id {
        return Err(invalid(
            "pack header",
            "pack id",
            0,
            "the id in the pack's name",
        ));
    }
    Ok(())
}

/// Whether a pack of an id, holding these entries, is there, and sound
/// ([`PackWriter::finish`]).
pub type PackThere<'a> = dyn Fn(&[u8; 16], &[BlobEntry]) -> Result<Option<bool>> + 'a;

/// A pack being written. Its id (the first 16 bytes of the BLAKE3 of its table) is known
/// once it is finished; the header, which holds it, is written then.
pub struct PackWriter {
    out: Box<dyn NewFile>,
    pos: u64,
    entries: Vec<BlobEntry>,
}

impl std::fmt::Debug for PackWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackWriter")
            .field("blobs", &self.entries.len())
            .field("bytes", &self.pos)
            .finish()
    }
}

/// The file name of pack `id`.
pub fn pack_name(id: &[u8; 16]) -> String {
    format!("{}.pack", hex(id))
}

impl PackWriter {
    /// Starts a pack in `packs` under a temp name.
    pub fn create(packs: &dyn Storage) -> Result<Self> {
        let temp = format!("{}.pack", hex(&crate::io::unique_id(b"pack")));
        let out = packs.create(&crate::io::temp_name(&temp))?;
        Ok(PackWriter {
            out,
            pos: PACK_HEADER as u64,
            entries: Vec::new(),
        })
    }

    /// Bytes so far.
    pub fn len(&self) -> u64 {
        self.pos
    }

    /// True with no blob yet.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Appends a blob whose id is `id`, stored as `stored` with `codec`, `raw_len` bytes once
    /// decoded; returns its entry (its pack's id is known at [`PackWriter::finish`]).
    pub fn push(
        &mut self,
        id: [u8; 32],
        stored: &[u8],
        raw_len: u64,
        codec: BlobCodec,
    ) -> Result<BlobEntry> {
        let offset = self.pos.next_multiple_of(BLOB_ALIGN);
        self.out.write_at(offset, stored)?;
        self.pos = offset + stored.len() as u64;
        let e = BlobEntry {
            id,
            offset,
            stored_len: stored.len() as u64,
            raw_len,
            codec,
        };
        self.entries.push(e);
        Ok(e)
    }

    /// Writes the table, footer and header and publishes the pack; returns its id and
    /// entries. A pack of the same id already there holds the same blobs at the same places
    /// (its id hashes its table, which names every blob by its hash): where `there` finds it
    /// sound (`Some(true)`), this one is dropped; where damaged (`Some(false)`: a blob stored
    /// anew over its damaged copy, laid out as that copy's pack was), a filler blob of unique
    /// bytes, referenced by nothing, makes this pack another. `there` gives `None` where no
    /// pack has the id.
    pub fn finish(
        mut self,
        durable: bool,
        there: &PackThere<'_>,
    ) -> Result<([u8; 16], Vec<BlobEntry>)> {
        let (mut table, mut table_hash, mut id);
        loop {
            table = self
                .entries
                .iter()
                .flat_map(|e| e.encode())
                .collect::<Vec<u8>>();
            table_hash = blake3::hash(&table);
            id = table_hash.as_bytes()[..16].try_into().expect("16");
            match there(&id, &self.entries)? {
                None => break,
                Some(true) => {
                    self.out.abandon();
                    return Ok((id, self.entries));
                }
                Some(false) => {
                    let filler = crate::io::unique_id(b"pack filler");
                    self.push(
                        *blake3::hash(&filler).as_bytes(),
                        &filler,
                        16,
                        BlobCodec::None,
                    )?;
                }
            }
        }
        let table_offset = self.pos.next_multiple_of(BLOB_ALIGN);
        let mut f = [0u8; PACK_FOOTER];
        f[0..8].copy_from_slice(&table_offset.to_le_bytes());
        f[8..16].copy_from_slice(&(self.entries.len() as u64).to_le_bytes());
        f[16..48].copy_from_slice(table_hash.as_bytes());
        f[56..64].copy_from_slice(PACK_END_MAGIC);
        let mut h = [0u8; PACK_HEADER];
        h[..8].copy_from_slice(PACK_MAGIC);
        h[8..10].copy_from_slice(&PACK_VERSION.to_le_bytes());
        h[16..32].copy_from_slice(&id);
        let written = self
            .out
            .write_at(table_offset, &table)
            .and_then(|()| self.out.write_at(table_offset + table.len() as u64, &f))
            .and_then(|()| self.out.write_at(0, &h))
            .and_then(|()| match durable {
                true => self.out.sync_all(),
                false => Ok(()),
            });
        if let Err(e) = written {
            self.out.abandon();
            return Err(e);
        }
        match self.out.publish_new(&pack_name(&id), durable) {
            Ok(()) | Err(crate::Error::CommitConflict { .. }) => Ok((id, self.entries)),
            Err(e) => Err(e),
        }
    }

    /// Deletes the unfinished pack.
    pub fn abandon(self) {
        self.out.abandon();
    }
}
