#![no_main]
//! FP8 payloads (FORMAT.md §4.1): any bytes as a chunk's stored form are decoded or refused,
//! never a panic, and any range of the rows of one that decodes decodes to those rows of the
//! whole (a range not within them is refused); any bytes as values are quantized (or refused
//! when not finite), and what is quantized decodes, to values within FP8's error of the input.

use hspack::format::codec::EncodeFailure;
use hspack::format::{fp8, Codec, DType, Elements};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&shape, rest)) = data.split_first() else {
        return;
    };
    let dtype = [DType::BF16, DType::F16, DType::F32][usize::from(shape % 3)];
    let group = 1 + usize::from(shape >> 2) % 8;
    let row_elems = group * (1 + usize::from(shape >> 5) % 3);
    let elements = Elements {
        dtype,
        row_elems,
        group,
    };
    let size = dtype.size();
    // As a stored form: for any raw length of whole rows, decoded or refused.
    for rows in 0..4u64 {
        let raw_len = rows * (row_elems * size) as u64;
        if let Ok(out) = Codec::Fp8.decode(rest, raw_len, elements) {
            assert_eq!(out.len() as u64, raw_len);
            assert_eq!(
                fp8::stored_len(rows, row_elems as u64, group as u64),
                Some(rest.len() as u64)
            );
            row_ranges(rest, &out, rows as usize, elements);
        }
    }
    // As values: whole rows of them.
    let row_bytes = row_elems * size;
    let raw = &rest[..rest.len() / row_bytes * row_bytes];
    match Codec::Fp8.encode(raw, elements, 0) {
        Err(EncodeFailure::NotFinite(e)) => assert!(!e.value.is_finite()),
        Err(e) => panic!("fp8 encoding failed otherwise: {e:?}"),
        Ok(stored) => {
            let back = Codec::Fp8
                .decode(&stored, raw.len() as u64, elements)
                .expect("what is quantized decodes");
            let value = |b: &[u8], i: usize| -> f32 {
                match dtype {
                    DType::F32 => f32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap()),
                    DType::BF16 => half::bf16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32(),
                    _ => half::f16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32(),
                }
            };
            for g in 0..raw.len() / size / group {
                let xs: Vec<f32> = (g * group..(g + 1) * group)
                    .map(|i| value(raw, i))
                    .collect();
                let scale = f32::from_le_bytes(stored[4 * g..4 * g + 4].try_into().unwrap());
                if scale < f32::MIN_POSITIVE {
                    continue; // a scale below f32's normals keeps too few bits to bound
                }
                for (k, &x) in xs.iter().enumerate() {
                    let y = value(&back, g * group + k);
                    // 3 mantissa bits, subnormal steps of scale · 2^-9, one rounding to dtype
                    // (f16 may also flush what is below its own subnormals).
                    let bound =
                        x.abs() / 16.0 + scale / 1024.0 + x.abs().max(y.abs()) / 128.0 + 1e-7;
                    assert!(
                        (x - y).abs() <= bound || !y.is_finite(),
                        "{dtype} {x} -> {y} (scale {scale})"
                    );
                }
            }
        }
    }
});

/// Ranges of the rows of `stored`, which decodes whole to `whole` (`rows` rows): each within
/// them decodes to its part of `whole`, with its scales and codes; one not within is refused.
fn row_ranges(stored: &[u8], whole: &[u8], rows: usize, el: Elements) {
    let row_bytes = el.row_elems * el.dtype.size();
    let chunk = fp8::Fp8Chunk::split(stored, rows * el.row_elems, el.row_elems, el.group)
        .expect("it decoded whole");
    let (all_scales, all_codes) = chunk.rows(0..rows).expect("it decoded whole");
    let per_row = el.row_elems / el.group;
    for (a, b) in [
        (0, rows),
        (1, rows),
        (rows / 2, rows),
        (0, rows / 2),
        (1, rows + 1),
        (rows, 0),
    ] {
        let within = a <= b && b <= rows;
        let mut part = vec![0u8; b.saturating_sub(a) * row_bytes];
        match chunk.dequantize_rows_into(a..b, &mut part, el.dtype) {
            Ok(()) => assert_eq!(part, whole[a * row_bytes..b * row_bytes], "rows {a}..{b}"),
            Err(_) => assert!(!within, "rows {a}..{b} of {rows} refused"),
        }
        match chunk.rows(a..b) {
            Ok((scales, codes)) => {
                assert!(within);
                assert_eq!(scales, all_scales[a * per_row..b * per_row]);
                assert_eq!(codes, &all_codes[a * el.row_elems..b * el.row_elems]);
            }
            Err(_) => assert!(!within, "rows {a}..{b} of {rows} refused"),
        }
    }
    // Room for other rows than those asked is refused, not filled in part.
    if rows > 0 {
        let mut short = vec![0u8; rows * row_bytes - 1];
        assert!(chunk
            .dequantize_rows_into(0..rows, &mut short, el.dtype)
            .is_err());
    }
}
