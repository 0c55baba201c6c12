//! FP8 storage of a float field (codec `fp8`, FORMAT.md §4.1): values as OCP FP8 E4M3FN with
//! one f32 scale per group of `group` consecutive elements of a row (a row and a layer of a
//! hidden state). Lossy; used only where the schema marks the field quantized.
//!
//! A chunk of `n` rows of `e` elements in groups of `g` stores its `n·e/g` scales (f32, row by
//! row) and then its `n·e` codes. A group's scale is its largest magnitude over 448 (the
//! largest E4M3FN value), 1 for a group of zeros; a value's code is the E4M3FN value nearest
//! (ties to even) to the value over its scale, clamped to ±448; the decoded value is the code
//! times the scale, in f32, rounded (to nearest even) to the field's dtype.

use super::{DType, FormatError};

/// Largest finite E4M3FN value.
pub const E4M3_MAX: f32 = 448.0;

/// Bytes a chunk of `rows` rows of `row_elems` elements in groups of `group` stores.
pub fn stored_len(rows: u64, row_elems: u64, group: u64) -> Option<u64> {
    let groups = rows.checked_mul(row_elems / group.max(1))?;
    groups
        .checked_mul(4)?
        .checked_add(rows.checked_mul(row_elems)?)
}

/// The E4M3FN code nearest to `v` (ties to even), `v` clamped to ±448 first. `v` is finite.
pub fn encode_e4m3(v: f32) -> u8 {
    let sign = if v.is_sign_negative() { 0x80 } else { 0 };
    let a = v.abs().min(E4M3_MAX);
    // Below 2^-6 the codes are subnormal: multiples of 2^-9 (8 of them is 2^-6, code 8).
    let magnitude = if a < 1.0 / 64.0 {
        (a * 512.0).round_ties_even() as u8
    } else {
        // A normal f32 cut to 3 mantissa bits, rounded to nearest even on its bits (a carry
        // out of the mantissa moves to the next exponent by itself), exponent rebiased 127 → 7.
        let bits = a.to_bits();
        let rounded = (bits + 0x7ffff + ((bits >> 20) & 1)) >> 20;
        (rounded - ((127 - 7) << 3)) as u8
    };
    sign | magnitude
}

/// The value of E4M3FN code `c`; `None` for the two NaN codes.
pub fn decode_e4m3(c: u8) -> Option<f32> {
    let (exp, man) = ((c >> 3) & 0x0f, c & 0x07);
    if exp == 0x0f && man == 0x07 {
        return None;
    }
    let magnitude = match exp {
        0 => f32::from(man) / 512.0,
        _ => f32::from(8 + man) * f32::powi(2.0, i32::from(exp) - 10),
    };
    Some(if c & 0x80 != 0 { -magnitude } else { magnitude })
}

/// Every code's value (NaN codes as NaN), so decoding a code is one load.
fn table() -> &'static [f32; 256] {
    static TABLE: std::sync::OnceLock<[f32; 256]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| std::array::from_fn(|c| decode_e4m3(c as u8).unwrap_or(f32::NAN)))
}

/// The element at `i` of little-endian `raw` of dtype `dtype` (f16, bf16 or f32), as f32.
fn load(raw: &[u8], dtype: DType, i: usize) -> f32 {
    match dtype {
        DType::F32 => f32::from_le_bytes(raw[4 * i..4 * i + 4].try_into().expect("4 bytes")),
        DType::BF16 => half::bf16::from_le_bytes([raw[2 * i], raw[2 * i + 1]]).to_f32(),
        _ => half::f16::from_le_bytes([raw[2 * i], raw[2 * i + 1]]).to_f32(),
    }
}

/// Writes `v`, rounded to nearest even, as element `i` of `out` of dtype `dtype`.
fn store(out: &mut [u8], dtype: DType, i: usize, v: f32) {
    match dtype {
        DType::F32 => out[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes()),
        DType::BF16 => {
            out[2 * i..2 * i + 2].copy_from_slice(&half::bf16::from_f32(v).to_le_bytes())
        }
        _ => out[2 * i..2 * i + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes()),
    }
}

/// Whether fields of `dtype` may be stored as FP8.
pub fn quantizable(dtype: DType) -> bool {
    matches!(dtype, DType::F16 | DType::BF16 | DType::F32)
}

/// A value FP8 cannot stand for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NotFinite {
    /// Row within the rows given.
    pub row: u64,
    /// Element within the row.
    pub elem: u64,
    /// The value.
    pub value: f32,
}

/// Quantizes `raw` (whole rows of `row_elems` elements of `dtype`) into the stored bytes of a
/// chunk. Every value must be finite.
pub fn quantize(
    raw: &[u8],
    dtype: DType,
    row_elems: usize,
    group: usize,
) -> Result<Vec<u8>, NotFinite> {
    let elems = raw.len() / dtype.size();
    let groups = elems / group;
    let mut out = vec![0u8; groups * 4 + elems];
    let (scales, codes) = out.split_at_mut(groups * 4);
    for g in 0..groups {
        let base = g * group;
        let mut amax = 0f32;
        for i in base..base + group {
            let v = load(raw, dtype, i);
            if !v.is_finite() {
                return Err(NotFinite {
                    row: (i / row_elems) as u64,
                    elem: (i % row_elems) as u64,
                    value: v,
                });
            }
            amax = amax.max(v.abs());
        }
        let scale = scale_of(amax);
        scales[4 * g..4 * g + 4].copy_from_slice(&scale.to_le_bytes());
        for i in base..base + group {
            codes[i] = encode_e4m3(load(raw, dtype, i) / scale);
        }
    }
    Ok(out)
}

/// The scale of a group whose largest magnitude is `amax`: `amax / 448`, or 1 where that is 0.
pub fn scale_of(amax: f32) -> f32 {
    let scale = amax / E4M3_MAX;
    if scale > 0.0 {
        scale
    } else {
        1.0
    }
}

/// A chunk's stored bytes seen as its scales and its codes.
#[derive(Debug, Clone, Copy)]
pub struct Fp8Chunk<'a> {
    scales: &'a [u8],
    codes: &'a [u8],
    row_elems: usize,
    group: usize,
}

impl<'a> Fp8Chunk<'a> {
    /// Splits `stored`, a chunk of rows of `row_elems` elements in groups of `group` holding
    /// `raw_elems` elements in all, checking its length.
    pub fn split(
        stored: &'a [u8],
        raw_elems: usize,
        row_elems: usize,
        group: usize,
    ) -> Result<Self, FormatError> {
        let group = group.max(1);
        let groups = raw_elems / group;
        if stored.len() != groups * 4 + raw_elems
            || !raw_elems.is_multiple_of(group)
            || !row_elems.is_multiple_of(group)
        {
            return Err(FormatError::Invalid {
                structure: "fp8 chunk payload",
                what: "stored length",
                value: stored.len() as u64,
                rule: format!("{groups} scales of 4 bytes and {raw_elems} codes"),
            });
        }
        let (scales, codes) = stored.split_at(groups * 4);
        Ok(Fp8Chunk {
            scales,
            codes,
            row_elems: row_elems.max(1),
            group,
        })
    }

    /// Rows `rows` of the chunk: their scales (f32, a row's groups in order) and their codes,
    /// checked: every scale finite and positive, no NaN code.
    pub fn rows(&self, rows: std::ops::Range<usize>) -> Result<(Vec<f32>, &'a [u8]), FormatError> {
        let per_row = self.row_elems / self.group;
        let scales = &self.scales[rows.start * per_row * 4..rows.end * per_row * 4];
        let codes = &self.codes[rows.start * self.row_elems..rows.end * self.row_elems];
        let invalid = |what, value: u64, rule: String| FormatError::Invalid {
            structure: "fp8 chunk payload",
            what,
            value,
            rule,
        };
        let scales: Vec<f32> = scales
            .chunks_exact(4)
            .map(|s| f32::from_le_bytes(s.try_into().expect("4 bytes")))
            .collect();
        if let Some((g, s)) = scales
            .iter()
            .enumerate()
            .find(|(_, s)| !(s.is_finite() && **s > 0.0))
        {
            return Err(invalid(
                "scale",
                (rows.start * per_row + g) as u64,
                format!("finite and positive, not {s}"),
            ));
        }
        if let Some(at) = codes.iter().position(|&c| c & 0x7f == 0x7f) {
            return Err(invalid(
                "code",
                (rows.start * self.row_elems + at) as u64,
                "not NaN (0x7f or 0xff)".into(),
            ));
        }
        Ok((scales, codes))
    }

    /// Decodes rows `rows` into `out` (exactly those rows, of dtype `dtype`).
    pub fn dequantize_rows_into(
        &self,
        rows: std::ops::Range<usize>,
        out: &mut [u8],
        dtype: DType,
    ) -> Result<(), FormatError> {
        let (scales, codes) = self.rows(rows)?;
        let table = table();
        for (g, &scale) in scales.iter().enumerate() {
            for i in g * self.group..(g + 1) * self.group {
                store(out, dtype, i, table[codes[i] as usize] * scale);
            }
        }
        Ok(())
    }
}

/// Decodes a chunk's stored bytes into `out`: its raw length, of dtype `dtype`, in rows of
/// `row_elems` elements.
pub fn dequantize_into(
    stored: &[u8],
    out: &mut [u8],
    dtype: DType,
    row_elems: usize,
    group: usize,
) -> Result<(), FormatError> {
    let elems = out.len() / dtype.size();
    let chunk = Fp8Chunk::split(stored, elems, row_elems, group)?;
    chunk.dequantize_rows_into(0..elems / row_elems.max(1), out, dtype)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips_through_its_value() {
        for c in 0..=255u8 {
            match decode_e4m3(c) {
                None => assert_eq!(c & 0x7f, 0x7f),
                // -0.0 keeps its sign bit, so every code comes back as itself.
                Some(v) => assert_eq!(encode_e4m3(v), c, "code {c:#04x} = {v}"),
            }
        }
        assert_eq!(decode_e4m3(0x7e), Some(448.0));
        assert_eq!(decode_e4m3(0x01), Some(1.0 / 512.0));
        assert_eq!(decode_e4m3(0x08), Some(1.0 / 64.0));
    }

    #[test]
    fn rounding_is_to_nearest_even_and_saturates() {
        // Between 1.0 (0x38) and 1.125 (0x39): the midpoint goes to the even code.
        assert_eq!(encode_e4m3(1.0625), 0x38);
        assert_eq!(encode_e4m3(1.0626), 0x39);
        // Between 1.125 and 1.25 (0x3a): the midpoint goes up to the even code.
        assert_eq!(encode_e4m3(1.1875), 0x3a);
        // Subnormal midpoint 1.5 × 2^-9 goes to 2 × 2^-9.
        assert_eq!(encode_e4m3(1.5 / 512.0), 0x02);
        assert_eq!(encode_e4m3(0.4 / 512.0), 0x00);
        assert_eq!(encode_e4m3(-0.4 / 512.0), 0x80);
        assert_eq!(encode_e4m3(1e9), 0x7e);
        assert_eq!(encode_e4m3(-1e9), 0xfe);
        // The largest subnormal rounds up to the smallest normal.
        assert_eq!(encode_e4m3(7.9 / 512.0), 0x08);
    }

    #[test]
    fn a_group_keeps_its_largest_value_and_its_zeros() {
        let values = [0.0f32, -3.5, 1.0, 2.0, 0.0, 0.0, 0.0, 0.0];
        let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let stored = quantize(&raw, DType::F32, 8, 4).unwrap();
        assert_eq!(stored.len(), 2 * 4 + 8);
        let mut out = vec![0u8; raw.len()];
        dequantize_into(&stored, &mut out, DType::F32, 8, 4).unwrap();
        let back: Vec<f32> = out
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(back[1], -3.5);
        assert_eq!(back[4..], [0.0; 4]);
        // The zero group's scale is 1.
        assert_eq!(&stored[4..8], &1f32.to_le_bytes());
        for (a, b) in values.iter().zip(&back) {
            assert!((a - b).abs() <= a.abs() / 16.0, "{a} {b}");
        }
    }

    #[test]
    fn a_non_finite_value_is_refused_with_its_place() {
        let values = [1.0f32, 2.0, 3.0, f32::INFINITY];
        let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let err = quantize(&raw, DType::F32, 2, 2).unwrap_err();
        assert_eq!((err.row, err.elem), (1, 1));
    }

    #[test]
    fn damaged_payloads_are_refused() {
        let raw: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let stored = quantize(&raw, DType::F32, 2, 2).unwrap();
        let mut out = vec![0u8; 8];
        assert!(dequantize_into(&stored[..5], &mut out, DType::F32, 2, 2).is_err());
        let mut nan_code = stored.clone();
        nan_code[4] = 0x7f;
        assert!(dequantize_into(&nan_code, &mut out, DType::F32, 2, 2).is_err());
        let mut bad_scale = stored.clone();
        bad_scale[..4].copy_from_slice(&(-1f32).to_le_bytes());
        assert!(dequantize_into(&bad_scale, &mut out, DType::F32, 2, 2).is_err());
        bad_scale[..4].copy_from_slice(&f32::NAN.to_le_bytes());
        assert!(dequantize_into(&bad_scale, &mut out, DType::F32, 2, 2).is_err());
    }
}
