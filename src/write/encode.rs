//! Splitting a sample's fields into row blocks and encoding and hashing them in parallel.

use std::borrow::Cow;

use rayon::prelude::*;

use crate::format::codec::EncodeFailure;
use crate::format::{fp8, Codec, Elements, Schema};

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

/// Why a field of a sample cannot be stored: a value fp8 cannot hold, or a stored form given
/// that breaks its rules.
#[derive(Debug, Clone, PartialEq)]
pub struct EncodeError {
    /// Field number.
    pub field: u16,
    /// What is wrong, and what to do.
    pub detail: String,
}

/// One row block to encode.
struct Job<'a> {
    field: u16,
    row_start: u64,
    row_count: u64,
    codec: Codec,
    elements: Elements,
    /// The block's values, or for a quantized field given in its stored form, its scales
    /// and its codes.
    input: Input<'a>,
}

enum Input<'a> {
    Values(&'a [u8]),
    Stored { scales: &'a [u8], codes: &'a [u8] },
}

/// Splits each field (`fields[i]` holds `rows` rows of field `i`, as values, or as its stored
/// form for a quantized field when `options.prequantized`) into row blocks, encodes and hashes
/// compressed or quantized ones on the rayon pool, and returns them in (field, row) order.
/// Uncompressed blocks borrow the input and are hashed later, while they are written.
pub fn encode_sample<'a>(
    schema: &Schema,
    fields: &[&'a [u8]],
    rows: u64,
    options: &WriteOptions,
) -> Result<Vec<EncodedChunk<'a>>, EncodeError> {
    let level = options.zstd_level;
    let mut jobs = Vec::new();
    for (f, (field, data)) in schema.fields.iter().zip(fields).enumerate() {
        let row_bytes = field.row_bytes();
        let per = options.rows_per_chunk(field);
        let codec = options.codec_of(field);
        let elements = Elements::of(field);
        let stored_form = field.quantized.is_some() && options.prequantized;
        // The stored form of the whole field: every row's scales, then every row's codes.
        let row_elems = elements.row_elems;
        let row_scales = 4 * (row_elems / elements.group.max(1));
        let (all_scales, all_codes) = data.split_at(if stored_form {
            rows as usize * row_scales
        } else {
            0
        });
        let mut start = 0;
        while start < rows {
            let count = per.min(rows - start);
            let (lo, hi) = (start as usize, (start + count) as usize);
            let input = match stored_form {
                true => Input::Stored {
                    scales: &all_scales[lo * row_scales..hi * row_scales],
                    codes: &all_codes[lo * row_elems..hi * row_elems],
                },
                false => Input::Values(&data[lo * row_bytes as usize..hi * row_bytes as usize]),
            };
            jobs.push(Job {
                field: f as u16,
                row_start: start,
                row_count: count,
                codec,
                elements,
                input,
            });
            start += count;
        }
    }
    let encode = |job: Job<'a>| -> Result<EncodedChunk<'a>, EncodeError> {
        let raw_len = job.row_count * (job.elements.row_elems * job.elements.dtype.size()) as u64;
        let (stored, hash): (Cow<[u8]>, _) = match (job.codec, job.input) {
            (Codec::None, Input::Values(raw)) => (Cow::Borrowed(raw), None),
            (codec, Input::Values(raw)) => {
                let stored = codec
                    .encode(raw, job.elements, level)
                    .map_err(|e| EncodeError {
                        field: job.field,
                        detail: match e {
                            EncodeFailure::NotFinite(e) => format!(
                                "row {} holds {} at element {}, and a field stored as fp8 \
                                 holds finite values only: fix the capture, or write this \
                                 field unquantized",
                                job.row_start + e.row,
                                e.value,
                                e.elem
                            ),
                            EncodeFailure::Zstd(said) => format!(
                                "zstd could not compress rows {} to {} ({said}): free memory, \
                                 or write this field uncompressed",
                                job.row_start,
                                job.row_start + job.row_count
                            ),
                        },
                    })?;
                let hash = *blake3::hash(&stored).as_bytes();
                (Cow::Owned(stored), Some(hash))
            }
            (_, Input::Stored { scales, codes }) => {
                let stored = [scales, codes].concat();
                let el = job.elements;
                fp8::Fp8Chunk::split(&stored, codes.len(), el.row_elems, el.group)
                    .and_then(|c| c.check_made(el.dtype))
                    .map_err(|e| EncodeError {
                        field: job.field,
                        detail: format!(
                            "the fp8 codes and scales given for rows {}..{} are not a valid \
                             stored form ({e}): a value was infinite or NaN, or the quantizer \
                             does not follow FORMAT.md §4.1 (a scale of amax / 448 per group)",
                            job.row_start,
                            job.row_start + job.row_count
                        ),
                    })?;
                let hash = *blake3::hash(&stored).as_bytes();
                (Cow::Owned(stored), Some(hash))
            }
        };
        Ok(EncodedChunk {
            field: job.field,
            row_start: job.row_start,
            row_count: job.row_count,
            raw_len,
            codec: job.codec,
            stored,
            hash,
        })
    };
    let bytes: usize = jobs
        .iter()
        .filter(|j| j.codec != Codec::None)
        .map(|j| match j.input {
            Input::Values(raw) => raw.len(),
            Input::Stored { codes, .. } => codes.len(),
        })
        .sum();
    if (bytes as u64) < crate::parallel::WORTH_THE_POOL {
        return jobs.into_iter().map(encode).collect();
    }
    crate::parallel::install(|| jobs.into_par_iter().map(encode).collect())
}
