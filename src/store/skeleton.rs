//! A shard in the store (FORMAT.md §11.4): its chunk payloads are blobs of their own, keyed by
//! the hash the shard's index already records for them, and everything else (shard header,
//! chunk headers, padding, index, footer) is one *skeleton* blob: the file with the payloads
//! cut out. The shard's own footer and index, at the skeleton's end, say where the payloads
//! go back, so a stored shard is named by its skeleton's id alone.

use std::ops::Range;

use crate::format::{ChunkHeader, Footer, FormatError, Index, ShardHeader};

use super::pack::invalid;

/// A chunk payload's place in its shard file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Payload {
    /// Offset in the shard file.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
    /// BLAKE3 of the bytes (the chunk's hash in the index): the blob's id.
    pub id: [u8; 32],
}

/// The payloads of a shard whose index is `index`, in file order, each once (chunks that
/// share a payload are one), empty ones left out. Refuses payloads that overlap, or that lie
/// outside the data region (after the shard header and a chunk header, before the index).
pub fn payloads(index: &Index<'_>, index_offset: u64) -> Result<Vec<Payload>, FormatError> {
    let mut out: Vec<Payload> = (0..index.chunk_count())
        .filter_map(|c| index.chunk(c))
        .filter(|e| e.stored_len > 0)
        .map(|e| Payload {
            offset: e.offset.saturating_add(ChunkHeader::SIZE as u64),
            len: e.stored_len,
            id: e.hash,
        })
        .collect();
    out.sort_by_key(|p| p.offset);
    out.dedup();
    let mut end = (ShardHeader::SIZE + ChunkHeader::SIZE) as u64;
    for p in &out {
        let stop = p.offset.checked_add(p.len);
        if p.offset < end || stop.is_none_or(|s| s > index_offset) {
            return Err(invalid(
                "stored shard",
                "payload offset",
                p.offset,
                "payloads apart from one another, between the shard header and the index",
            ));
        }
        end = stop.expect("checked");
    }
    Ok(out)
}

/// Where each byte of a stored shard file comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Bytes of the skeleton's literal text (`literal[range]`).
    Literal(Range<usize>),
    /// Zeros (padding).
    Zeros,
    /// A payload blob.
    Payload([u8; 32]),
}

/// A stored shard file, mapped: pieces in file order, with the skeleton's non-zero bytes.
#[derive(Debug, Clone)]
pub struct ShardMap {
    /// The file's length.
    pub file_len: u64,
    /// `(start in the file, length, piece)`, in file order, covering the file.
    pub pieces: Vec<(u64, u64, Piece)>,
    /// The skeleton's bytes other than runs of zeros.
    pub literal: Vec<u8>,
}

/// Runs of zeros at least this long are kept as [`Piece::Zeros`], not as literal bytes.
const ZERO_RUN: usize = 256;

/// The footer (the skeleton's last 128 bytes) and the index just before it, checked against
/// the footer's index hash.
pub fn skeleton_index(skeleton: &[u8]) -> Result<(Footer, Index<'_>), FormatError> {
    const S: &str = "shard skeleton";
    if skeleton.len() < ShardHeader::SIZE + Footer::SIZE {
        return Err(FormatError::Truncated {
            structure: S,
            needed: (ShardHeader::SIZE + Footer::SIZE) as u64,
            available: skeleton.len() as u64,
        });
    }
    let tail = &skeleton[skeleton.len() - Footer::SIZE..];
    let file_len = u64::from_le_bytes(tail[104..112].try_into().expect("8"));
    let footer = Footer::decode(tail, file_len)?;
    let index_len = usize::try_from(footer.index_len)
        .ok()
        .filter(|&n| n <= skeleton.len() - Footer::SIZE)
        .ok_or_else(|| invalid(S, "index length", footer.index_len, "inside the skeleton"))?;
    let index_bytes =
        &skeleton[skeleton.len() - Footer::SIZE - index_len..skeleton.len() - Footer::SIZE];
    if blake3::hash(index_bytes).as_bytes() != &footer.index_hash {
        return Err(invalid(S, "index blake3", 0, "the footer's index hash"));
    }
    Ok((footer, Index::parse(index_bytes)?))
}

/// Maps a shard from its skeleton's bytes: the footer is their last 128 bytes, the index just
/// before it (checked against the footer's index hash), and the payloads the index names go
/// between the skeleton's stretches. Refuses a skeleton whose lengths do not add up.
pub fn map_skeleton(skeleton: &[u8]) -> Result<ShardMap, FormatError> {
    const S: &str = "shard skeleton";
    let (footer, index) = skeleton_index(skeleton)?;
    let (file_len, index_len) = (footer.file_len, footer.index_len as usize);
    let payloads = payloads(&index, footer.index_offset)?;
    let payload_bytes: u64 = payloads.iter().map(|p| p.len).sum();
    if (skeleton.len() as u64).checked_add(payload_bytes) != Some(file_len)
        || footer.index_offset != file_len - Footer::SIZE as u64 - index_len as u64
    {
        return Err(invalid(
            S,
            "file length",
            file_len,
            "the skeleton's length plus its payloads'",
        ));
    }
    let mut map = ShardMap {
        file_len,
        pieces: Vec::with_capacity(payloads.len() * 3 + 2),
        literal: Vec::new(),
    };
    let (mut at, mut sk) = (0u64, 0usize);
    for p in payloads.iter().map(Some).chain([None]) {
        let gap_end = p.map_or(file_len, |p| p.offset);
        let gap = &skeleton[sk..sk + (gap_end - at) as usize];
        map.add_gap(at, gap);
        sk += gap.len();
        at = gap_end;
        if let Some(p) = p {
            map.pieces.push((at, p.len, Piece::Payload(p.id)));
            at += p.len;
        }
    }
    Ok(map)
}

/// How many bytes at the start of `b` are zero: a word at a time (a skeleton is mostly the
/// padding before aligned payloads).
fn leading_zeros(b: &[u8]) -> usize {
    let mut words = b.chunks_exact(8);
    let mut n = 0;
    for w in words.by_ref() {
        let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        if w != 0 {
            return n + (w.trailing_zeros() / 8) as usize;
        }
        n += 8;
    }
    n + words.remainder().iter().take_while(|&&x| x == 0).count()
}

impl ShardMap {
    fn add_gap(&mut self, at: u64, gap: &[u8]) {
        let (mut i, mut lit) = (0usize, 0usize);
        let flush = |map: &mut ShardMap, from: usize, to: usize| {
            if from < to {
                let start = map.literal.len();
                map.literal.extend_from_slice(&gap[from..to]);
                let piece = Piece::Literal(start..map.literal.len());
                map.pieces
                    .push((at + from as u64, (to - from) as u64, piece));
            }
        };
        while i < gap.len() {
            if gap[i] != 0 {
                i += 1;
                continue;
            }
            let zeros = leading_zeros(&gap[i..]);
            if zeros >= ZERO_RUN {
                flush(self, lit, i);
                self.pieces
                    .push((at + i as u64, zeros as u64, Piece::Zeros));
                lit = i + zeros;
            }
            i += zeros;
        }
        flush(self, lit, gap.len());
    }

    /// The piece holding file offset `offset`: its number.
    pub fn piece_at(&self, offset: u64) -> Option<usize> {
        let i = self.pieces.partition_point(|(s, _, _)| *s <= offset);
        (i > 0 && offset < self.file_len).then(|| i - 1)
    }

    /// Ids of the payload blobs, in file order.
    pub fn payload_ids(&self) -> impl Iterator<Item = &[u8; 32]> {
        self.pieces.iter().filter_map(|(_, _, p)| match p {
            Piece::Payload(id) => Some(id),
            _ => None,
        })
    }
}

/// Cuts the payloads out of a shard file's bytes, given the payloads: the skeleton.
pub fn skeleton_of(
    read: &mut dyn FnMut(Range<u64>) -> crate::Result<Vec<u8>>,
    file_len: u64,
    payloads: &[Payload],
) -> crate::Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut at = 0u64;
    for p in payloads {
        out.extend_from_slice(&read(at..p.offset)?);
        at = p.offset + p.len;
    }
    out.extend_from_slice(&read(at..file_len)?);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn leading_zeros_counts_the_zero_bytes_before_the_first_other(
            zeros in 0usize..80,
            tail in proptest::collection::vec(any::<u8>(), 0..40),
        ) {
            let mut b = vec![0u8; zeros];
            b.extend_from_slice(&tail);
            let naive = b.iter().take_while(|&&x| x == 0).count();
            prop_assert_eq!(leading_zeros(&b), naive);
        }
    }
}
