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

/// Groups of at least this many values are decoded through a table of their scale's 256
/// values.
const LOOKUP_GROUP: usize = 1024;

/// Bytes a chunk of `rows` rows of `row_elems` elements in groups of `group` stores.
pub fn stored_len(rows: u64, row_elems: u64, group: u64) -> Option<u64> {
    let groups = rows.checked_mul(row_elems / group.max(1))?;
    groups
        .checked_mul(4)?
        .checked_add(rows.checked_mul(row_elems)?)
}

/// The E4M3FN code nearest to `v` (ties to even), `v` clamped to ±448 first. `v` is finite.
/// Without branches, so that loops over it vectorize.
#[inline]
pub fn encode_e4m3(v: f32) -> u8 {
    let sign = (v.to_bits() >> 24) & 0x80;
    let a = v.abs().min(E4M3_MAX);
    // Below 2^-6 the codes are subnormal: multiples of 2^-9 (8 of them is 2^-6, code 8),
    // a·512 rounded to the nearest integer, ties to even, by adding and taking away 2^23.
    let subnormal = ((a * 512.0 + 8_388_608.0) - 8_388_608.0) as u32;
    // A normal f32 cut to 3 mantissa bits, rounded to nearest even on its bits (a carry out
    // of the mantissa moves to the next exponent by itself), exponent rebiased 127 → 7.
    let bits = a.to_bits();
    let normal = ((bits + 0x7ffff + ((bits >> 20) & 1)) >> 20).wrapping_sub((127 - 7) << 3);
    let magnitude = if a < 1.0 / 64.0 { subnormal } else { normal };
    (sign | magnitude) as u8
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

/// Elements `from..from + out.len()` of little-endian `raw` of dtype `dtype` (f16, bf16 or
/// f32) as f32, into `out`.
fn load(raw: &[u8], dtype: DType, from: usize, out: &mut [f32]) {
    let n = out.len();
    match dtype {
        DType::F32 => {
            for (o, b) in out
                .iter_mut()
                .zip(raw[4 * from..4 * (from + n)].chunks_exact(4))
            {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        DType::BF16 => {
            for (o, b) in out
                .iter_mut()
                .zip(raw[2 * from..2 * (from + n)].chunks_exact(2))
            {
                *o = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
            }
        }
        _ => {
            for (o, b) in out
                .iter_mut()
                .zip(raw[2 * from..2 * (from + n)].chunks_exact(2))
            {
                *o = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
    }
}

/// Writes `values`, each rounded to nearest even, as elements `from..` of `out` of dtype
/// `dtype`. The values are finite (codes times finite scales).
fn store(out: &mut [u8], dtype: DType, from: usize, values: &[f32]) {
    let n = values.len();
    match dtype {
        DType::F32 => {
            for (o, v) in out[4 * from..4 * (from + n)]
                .chunks_exact_mut(4)
                .zip(values)
            {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        DType::BF16 => {
            // Rounded to nearest even on the bits: exact for finite values (a carry into the
            // exponent gives the next binade, or infinity past the largest bf16).
            for (o, v) in out[2 * from..2 * (from + n)]
                .chunks_exact_mut(2)
                .zip(values)
            {
                let bits = v.to_bits();
                let rounded = ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u16;
                o.copy_from_slice(&rounded.to_le_bytes());
            }
        }
        _ => {
            for (o, v) in out[2 * from..2 * (from + n)]
                .chunks_exact_mut(2)
                .zip(values)
            {
                o.copy_from_slice(&half::f16::from_f32(*v).to_le_bytes());
            }
        }
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

/// The first value of `raw` (whole rows of `row_elems` elements of `dtype`) that FP8 cannot
/// hold: infinite or NaN.
pub fn first_non_finite(raw: &[u8], dtype: DType, row_elems: usize) -> Option<NotFinite> {
    let elems = raw.len() / dtype.size();
    let mut values = vec![0f32; elems.min(4096)];
    let mut from = 0;
    while from < elems {
        let n = values.len().min(elems - from);
        load(raw, dtype, from, &mut values[..n]);
        let top = values[..n]
            .iter()
            .map(|v| v.to_bits() & 0x7fff_ffff)
            .max()
            .unwrap_or(0);
        if top >= 0x7f80_0000 {
            let at = values[..n].iter().position(|v| !v.is_finite())?;
            let i = from + at;
            return Some(NotFinite {
                row: (i / row_elems.max(1)) as u64,
                elem: (i % row_elems.max(1)) as u64,
                value: values[at],
            });
        }
        from += n;
    }
    None
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
    let mut values = vec![0f32; group];
    for (g, (scale_bytes, codes)) in scales
        .chunks_exact_mut(4)
        .zip(codes.chunks_exact_mut(group))
        .enumerate()
    {
        let base = g * group;
        load(raw, dtype, base, &mut values);
        // The largest magnitude by the bits (for non-negative floats their order is the
        // integers'): a loop that vectorizes; infinity and NaN lie above every finite value.
        let amax_bits = values
            .iter()
            .map(|v| v.to_bits() & 0x7fff_ffff)
            .max()
            .unwrap_or(0);
        if amax_bits >= 0x7f80_0000 {
            let at = values.iter().position(|v| !v.is_finite()).unwrap_or(0);
            let i = base + at;
            return Err(NotFinite {
                row: (i / row_elems) as u64,
                elem: (i % row_elems) as u64,
                value: values[at],
            });
        }
        let scale = scale_of(f32::from_bits(amax_bits));
        scale_bytes.copy_from_slice(&scale.to_le_bytes());
        for (c, &v) in codes.iter_mut().zip(&values) {
            *c = encode_e4m3(v / scale);
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
        let invalid = |what, value: u64, rule: String| FormatError::Invalid {
            structure: "fp8 chunk payload",
            what,
            value,
            rule,
        };
        let held = self.codes.len() / self.row_elems;
        if rows.start > rows.end || rows.end > held {
            return Err(invalid(
                "last row asked",
                rows.end as u64,
                format!("a range of the chunk's {held} rows, not {rows:?}"),
            ));
        }
        let scales = &self.scales[rows.start * per_row * 4..rows.end * per_row * 4];
        let codes = &self.codes[rows.start * self.row_elems..rows.end * self.row_elems];
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
        // Any NaN code, by a loop that does not stop early (it vectorizes); then where.
        let nan = codes
            .iter()
            .fold(0u8, |acc, &c| acc | u8::from(c & 0x7f == 0x7f));
        if let Some(at) = (nan != 0)
            .then(|| codes.iter().position(|&c| c & 0x7f == 0x7f))
            .flatten()
        {
            return Err(invalid(
                "code",
                (rows.start * self.row_elems + at) as u64,
                "not NaN (0x7f or 0xff)".into(),
            ));
        }
        Ok((scales, codes))
    }

    /// Checks that the chunk is as FORMAT.md §4.1 makes it from finite values of `dtype`,
    /// beyond what [`Fp8Chunk::rows`] checks: a group of zeros has scale 1; any other group
    /// whose scale is a normal f32 has 448 as its largest code (its largest magnitude over
    /// the scale); and every decoded value is finite in `dtype`. What a quantizer given as
    /// codes and scales (`CudaWriter(quantize=)`) must meet.
    pub fn check_made(&self, dtype: DType) -> Result<(), FormatError> {
        let rows = self.codes.len() / self.row_elems;
        let (scales, codes) = self.rows(0..rows)?;
        let invalid = |what, group: usize, rule: String| FormatError::Invalid {
            structure: "fp8 chunk payload",
            what,
            value: group as u64,
            rule,
        };
        for (g, (&scale, codes)) in scales
            .iter()
            .zip(codes.chunks_exact(self.group))
            .enumerate()
        {
            let top = codes.iter().fold(0u8, |m, &c| m.max(c & 0x7f));
            if top == 0 {
                if scale != 1.0 {
                    return Err(invalid(
                        "scale of a group of zeros",
                        g,
                        format!("1, not {scale}"),
                    ));
                }
                continue;
            }
            if scale.is_normal() && top != 0x7e {
                let value = decode_e4m3(top).unwrap_or(f32::NAN);
                return Err(invalid(
                    "largest code of group",
                    g,
                    format!("448 (the group's largest magnitude over its scale), not {value}"),
                ));
            }
            let largest = decode_e4m3(top).unwrap_or(f32::NAN) * scale;
            let (mut out, mut back) = ([0u8; 4], [0f32]);
            store(&mut out, dtype, 0, &[largest]);
            load(&out, dtype, 0, &mut back);
            if !back[0].is_finite() {
                return Err(invalid(
                    "scale of group",
                    g,
                    format!("one whose values are finite {}, not {scale}", dtype.name()),
                ));
            }
        }
        Ok(())
    }

    /// Decodes rows `rows` into `out` (exactly those rows, of dtype `dtype`).
    pub fn dequantize_rows_into(
        &self,
        rows: std::ops::Range<usize>,
        out: &mut [u8],
        dtype: DType,
    ) -> Result<(), FormatError> {
        let size = dtype.size();
        let want = rows.len() * self.row_elems * size;
        if out.len() != want {
            return Err(FormatError::Invalid {
                structure: "fp8 chunk payload",
                what: "bytes to decode into",
                value: out.len() as u64,
                rule: format!(
                    "{want}: rows {rows:?} of {} {}",
                    self.row_elems,
                    dtype.name()
                ),
            });
        }
        let (scales, codes) = self.rows(rows)?;
        let table = table();
        if self.group < LOOKUP_GROUP {
            let mut values = vec![0f32; self.group];
            for (g, (&scale, codes)) in scales
                .iter()
                .zip(codes.chunks_exact(self.group))
                .enumerate()
            {
                for (v, &c) in values.iter_mut().zip(codes) {
                    *v = table[c as usize] * scale;
                }
                store(out, dtype, g * self.group, &values);
            }
            return Ok(());
        }
        // A group of many values: each of the 256 codes decoded once for its scale, the same
        // arithmetic, then every value is a lookup.
        let mut values = [0f32; 256];
        let mut decoded = [0u8; 256 * 4];
        for ((&scale, codes), out) in scales
            .iter()
            .zip(codes.chunks_exact(self.group))
            .zip(out.chunks_exact_mut(self.group * size))
        {
            for (v, &t) in values.iter_mut().zip(table.iter()) {
                *v = t * scale;
            }
            store(&mut decoded, dtype, 0, &values);
            match size {
                2 => {
                    let lut: [u16; 256] = std::array::from_fn(|c| {
                        u16::from_le_bytes([decoded[2 * c], decoded[2 * c + 1]])
                    });
                    match bytemuck::try_cast_slice_mut::<u8, u16>(out) {
                        Ok(out) => {
                            for (o, &c) in out.iter_mut().zip(codes) {
                                *o = lut[c as usize].to_le();
                            }
                        }
                        Err(_) => {
                            for (o, &c) in out.chunks_exact_mut(2).zip(codes) {
                                o.copy_from_slice(&lut[c as usize].to_le_bytes());
                            }
                        }
                    }
                }
                _ => {
                    for (o, &c) in out.chunks_exact_mut(4).zip(codes) {
                        let at = 4 * c as usize;
                        o.copy_from_slice(&decoded[at..at + 4]);
                    }
                }
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

    /// What `quantize` makes passes `check_made`, extremes included; codes and scales given by
    /// another quantizer that §4.1 would not make are refused: a scale that decodes to
    /// infinity, a group of zeros not scaled by 1, a largest code that is not 448.
    #[test]
    fn check_made_passes_what_quantize_makes_and_refuses_the_rest() {
        let f32s = [
            0.0,
            -0.0,
            1.0,
            -3.5,
            1e-3,
            f32::MIN_POSITIVE,
            1e-44,
            f32::MAX,
            -f32::MAX,
            65504.0,
            3.3895e38,
        ];
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let mut raw = vec![0u8; f32s.len() * 4 * dtype.size()];
            for (i, v) in f32s.iter().cycle().take(f32s.len() * 4).enumerate() {
                let v = match dtype {
                    DType::F16 => v.clamp(-65504.0, 65504.0),
                    DType::BF16 => v.clamp(-3.3895e38, 3.3895e38),
                    _ => *v,
                };
                store(&mut raw, dtype, i, &[v]);
            }
            for group in [1, 2, 4, 11] {
                let stored = quantize(&raw, dtype, 44, group).unwrap();
                let chunk = Fp8Chunk::split(&stored, 44, 44, group).unwrap();
                chunk
                    .check_made(dtype)
                    .unwrap_or_else(|e| panic!("{dtype:?} {group}: {e}"));
            }
        }
        let chunk = |scales: &[f32], codes: &[u8]| -> Vec<u8> {
            let mut out: Vec<u8> = scales.iter().flat_map(|s| s.to_le_bytes()).collect();
            out.extend_from_slice(codes);
            out
        };
        let check = |stored: &[u8], dtype| {
            let c = Fp8Chunk::split(stored, 4, 4, 4).unwrap();
            c.check_made(dtype).map_err(|e| e.to_string())
        };
        let huge = chunk(&[1e38], &[0x7e, 0x3f, 0x00, 0x80]);
        assert!(check(&huge, DType::BF16)
            .unwrap_err()
            .contains("finite bf16"));
        assert!(check(&chunk(&[1.0], &[0x7e, 0, 0, 0]), DType::F16).is_ok());
        assert!(check(&chunk(&[200.0], &[0x7e, 0, 0, 0]), DType::F16).is_err());
        let zeros = chunk(&[2.0], &[0, 0x80, 0, 0]);
        assert!(check(&zeros, DType::F32)
            .unwrap_err()
            .contains("group of zeros"));
        let low = chunk(&[1.0], &[0x38, 0x38, 0x38, 0x38]);
        assert!(check(&low, DType::F32).unwrap_err().contains("448"));
    }

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
    fn large_groups_decode_through_a_table_to_the_same_values() {
        // Groups of 2048 take the table path; each value must be its code times its scale,
        // rounded once to the dtype, in an aligned output and in one shifted by a byte.
        let mut rng = crate::synth::Rng::new(9);
        for dtype in [DType::BF16, DType::F16, DType::F32] {
            let values: Vec<f32> = (0..2 * 2048)
                .map(|i| rng.normalish() * if i % 97 == 0 { 300.0 } else { 2.0 })
                .collect();
            let mut raw = vec![0u8; values.len() * dtype.size()];
            store(&mut raw, dtype, 0, &values);
            let stored = quantize(&raw, dtype, 4096, 2048).unwrap();
            let (scales, codes) = stored.split_at(8);
            let mut want = vec![0u8; raw.len()];
            for (i, &c) in codes.iter().enumerate() {
                let s = f32::from_le_bytes(scales[4 * (i / 2048)..][..4].try_into().unwrap());
                let v = decode_e4m3(c).unwrap() * s;
                match dtype {
                    DType::BF16 => {
                        want[2 * i..][..2].copy_from_slice(&half::bf16::from_f32(v).to_le_bytes())
                    }
                    DType::F16 => {
                        want[2 * i..][..2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes())
                    }
                    _ => want[4 * i..][..4].copy_from_slice(&v.to_le_bytes()),
                }
            }
            let mut buf = vec![0u8; raw.len() + 1];
            for shift in [0, 1] {
                let out = &mut buf[shift..shift + raw.len()];
                dequantize_into(&stored, out, dtype, 4096, 2048).unwrap();
                assert!(out == want.as_slice(), "{dtype} shifted {shift}");
            }
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

    /// A range of a chunk's rows decodes to those rows of the whole chunk; a range past its
    /// rows, backwards, or into room of another size is refused (an index declaring more rows
    /// than a chunk holds reached a slice out of bounds, a panic).
    #[test]
    fn a_range_of_rows_decodes_as_its_part_of_the_chunk_or_is_refused() {
        let values: Vec<f32> = (0..3 * 4).map(|i| i as f32 - 5.5).collect();
        let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let stored = quantize(&raw, DType::F32, 4, 2).unwrap();
        let mut whole = vec![0u8; raw.len()];
        dequantize_into(&stored, &mut whole, DType::F32, 4, 2).unwrap();
        let chunk = Fp8Chunk::split(&stored, 12, 4, 2).unwrap();
        for (a, b) in [(0, 3), (1, 2), (2, 3), (1, 1)] {
            let mut part = vec![0u8; (b - a) * 16];
            chunk
                .dequantize_rows_into(a..b, &mut part, DType::F32)
                .unwrap();
            assert_eq!(part, whole[a * 16..b * 16]);
        }
        for (a, b) in [(2, 4), (0, 9), (4, 5)] {
            let mut part = vec![0u8; (b - a) * 16];
            let err = chunk.dequantize_rows_into(a..b, &mut part, DType::F32);
            assert!(err.unwrap_err().to_string().contains("3 rows"));
            assert!(chunk.rows(a..b).is_err());
        }
        #[allow(clippy::reversed_empty_ranges)]
        let backwards = 2..1;
        assert!(chunk.rows(backwards).is_err());
        let mut short = vec![0u8; 31];
        assert!(chunk
            .dequantize_rows_into(0..2, &mut short, DType::F32)
            .is_err());
    }
}
