//! Splitting a sample's fields into row blocks and encoding and hashing them in parallel.

use std::borrow::Cow;

use rayon::prelude::*;

use crate::format::{Codec, Elements, Schema};

use super::options::WriteOptions;

/// A row block ready to be written.
#[derive(Debug)]
pub struct EncodedChunk<'a> {
    /// Field number.
    pub field: u16,
    /// First row within the sample.
    pub row_start: u64,
    /// Rows.
    pub row_count: u64,
    /// Decoded length.
    pub raw_len: u64,
    /// Codec the bytes are stored with.
    pub codec: Codec,
    /// Bytes to store: borrowed from the input when uncompressed.
    pub stored: Cow<'a, [u8]>,
    /// BLAKE3 of `stored`; `None` until the shard writer hashes it (uncompressed chunks are
    /// hashed while their bytes are written).
    pub hash: Option<[u8; 32]>,
}

/// A value a quantized field cannot hold: its field, and its place in the sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Unquantizable {
    /// Field number.
    pub field: u16,
    /// Row of the sample.
    pub row: u64,
    /// Element of the row.
    pub elem: u64,
    /// The value.
    pub value: f32,
}

/// Splits each field (`fields[i]` holds `rows` rows of field `i`) into row blocks, encodes and
/// hashes compressed or quantized ones on the rayon pool, and returns them in (field, row)
/// order. Uncompressed blocks borrow the input and are hashed later, while they are written.
pub fn encode_sample<'a>(
    schema: &Schema,
    fields: &[&'a [u8]],
    rows: u64,
    options: &WriteOptions,
) -> Result<Vec<EncodedChunk<'a>>, Unquantizable> {
    let level = options.zstd_level;
    let mut jobs = Vec::new();
    for (f, (field, data)) in schema.fields.iter().zip(fields).enumerate() {
        let row_bytes = field.row_bytes();
        let per = options.rows_per_chunk(field);
        let codec = options.codec_of(field);
        let mut start = 0;
        while start < rows {
            let count = per.min(rows - start);
            let lo = (start * row_bytes) as usize;
            let hi = ((start + count) * row_bytes) as usize;
            jobs.push((
                f as u16,
                start,
                count,
                codec,
                Elements::of(field),
                &data[lo..hi],
            ));
            start += count;
        }
    }
    let encode = |(field, row_start, row_count, codec, elements, raw): (
        u16,
        u64,
        u64,
        Codec,
        Elements,
        &'a [u8],
    )| {
        let (stored, hash): (Cow<[u8]>, _) = match codec {
            Codec::None => (Cow::Borrowed(raw), None),
            _ => {
                let stored = codec
                    .encode(raw, elements, level)
                    .map_err(|e| Unquantizable {
                        field,
                        row: row_start + e.row,
                        elem: e.elem,
                        value: e.value,
                    })?;
                let hash = *blake3::hash(&stored).as_bytes();
                (Cow::Owned(stored), Some(hash))
            }
        };
        Ok(EncodedChunk {
            field,
            row_start,
            row_count,
            raw_len: raw.len() as u64,
            codec,
            stored,
            hash,
        })
    };
    let bytes: usize = jobs
        .iter()
        .filter(|j| j.3 != Codec::None)
        .map(|j| j.5.len())
        .sum();
    if (bytes as u64) < crate::parallel::WORTH_THE_POOL {
        return jobs.into_iter().map(encode).collect();
    }
    crate::parallel::install(|| jobs.into_par_iter().map(encode).collect())
}
