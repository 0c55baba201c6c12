//! Fields stored as FP8 with a scale per row and layer (FORMAT.md §4.1): written from bf16,
//! read back dequantized within FP8's error, read as stored (codes and scales), half the
//! bytes, refused where the values cannot be held, and never mistaken for exact data.

mod common;

use common::*;
use hspack::format::fp8::{decode_e4m3, E4M3_MAX};
use hspack::format::QuantizeSpec;
use hspack::synth::{activations, channel_scales, Rng};
use hspack::{Dataset, DatasetWriter, Error, Schema, WriteOptions};

const HIDDEN: u64 = 256;

fn schema(quantize: Option<&str>) -> Schema {
    let mut s = capture_schema(HIDDEN);
    if let Some(q) = quantize {
        q.parse::<QuantizeSpec>().unwrap().apply(&mut s).unwrap();
    }
    s
}

fn bf16s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(2)
        .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect()
}

/// Samples of `capture_schema(HIDDEN)`: ids, mask, two hidden layers with outlier channels.
fn samples(n: usize) -> Vec<Vec<(String, Vec<u8>)>> {
    let mut rng = Rng::new(7);
    let scales = channel_scales(&mut rng, HIDDEN as usize);
    (0..n)
        .map(|i| {
            let rows = [0, 1, 5, 17, 64][i % 5];
            let ids: Vec<u8> = (0..rows as i32)
                .flat_map(|r| (r * 7).to_le_bytes())
                .collect();
            let mask: Vec<u8> = (0..rows).map(|r| u8::from(r > 2)).collect();
            vec![
                ("input_ids".to_string(), ids),
                ("loss_mask".to_string(), mask),
                ("hidden.2".to_string(), activations(&mut rng, rows, &scales)),
                (
                    "hidden.30".to_string(),
                    activations(&mut rng, rows, &scales),
                ),
            ]
        })
        .collect()
}

fn write(dir: &std::path::Path, schema: Schema, samples: &[Vec<(String, Vec<u8>)>]) {
    let options = WriteOptions {
        durable: false,
        ..WriteOptions::default()
    };
    let mut w = DatasetWriter::create(dir, schema, options).unwrap();
    for (i, s) in samples.iter().enumerate() {
        w.append(&format!("s{i}"), &as_fields(s)).unwrap();
    }
    w.finish().unwrap();
}

#[test]
fn hidden_states_come_back_within_fp8_error_and_the_rest_exact() {
    let dir = tempfile::tempdir().unwrap();
    let data = samples(10);
    write(dir.path(), schema(Some("fp8")), &data);
    let ds = Dataset::open(dir.path()).unwrap();
    assert_eq!(
        ds.manifest().version,
        5,
        "a quantized schema needs version 5"
    );
    let quantized: Vec<&str> = ds
        .schema()
        .fields
        .iter()
        .filter(|f| f.quantized.is_some())
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(quantized, ["hidden.2", "hidden.30"]);
    let (mut changed, mut total) = (0usize, 0usize);
    for (i, s) in data.iter().enumerate() {
        let sample = ds.sample(i as u64).unwrap();
        for (name, original) in s {
            let got = sample.read(name, None).unwrap();
            if !name.starts_with("hidden") {
                assert_eq!(got.bytes(), original.as_slice(), "{name} stays exact");
                continue;
            }
            let (x, y) = (bf16s(original), bf16s(got.bytes()));
            for (row_x, row_y) in x.chunks(HIDDEN as usize).zip(y.chunks(HIDDEN as usize)) {
                let amax = row_x.iter().fold(0f32, |m, v| m.max(v.abs()));
                let scale = amax / E4M3_MAX;
                // FP8 keeps 3 mantissa bits (half an ulp: 1/16 of the value) down to 2^-6
                // of the scale, steps of 2^-9 below; bf16 rounds once more (1/256).
                for (&a, &b) in row_x.iter().zip(row_y) {
                    let bound = a.abs() / 16.0 + scale / 1024.0 + a.abs().max(b.abs()) / 256.0;
                    assert!(
                        (a - b).abs() <= bound,
                        "sample {i} {name}: {a} came back {b}"
                    );
                }
                // The largest value of every row and layer survives exactly.
                assert!(row_y.iter().any(|v| v.abs() == amax), "amax {amax} lost");
            }
            changed += x.iter().zip(&y).filter(|(a, b)| a != b).count();
            total += x.len();
        }
    }
    assert!(
        changed * 4 > total,
        "most values change: {changed} of {total} (else the field was not quantized)"
    );
}

#[test]
fn stored_codes_and_scales_are_what_reads_decode_and_row_ranges_agree() {
    let dir = tempfile::tempdir().unwrap();
    let data = samples(5);
    write(dir.path(), schema(Some("fp8:hidden.30")), &data);
    let ds = Dataset::open(dir.path()).unwrap();
    let f = ds.field_index("hidden.30").unwrap();
    let sample = ds.sample(4).unwrap();
    let rows = sample.rows();
    assert_eq!(rows, 64);
    let whole = bf16s(sample.read("hidden.30", None).unwrap().bytes());
    let q = sample.read_quantized(f, None).unwrap();
    assert_eq!(q.group, HIDDEN);
    assert_eq!(q.codes.len(), (rows * HIDDEN) as usize);
    assert_eq!(q.scales.len(), rows as usize);
    for (i, (&c, &y)) in q.codes.iter().zip(&whole).enumerate() {
        let v = decode_e4m3(c).unwrap() * q.scales[i / HIDDEN as usize];
        assert_eq!(half::bf16::from_f32(v).to_f32(), y);
    }
    // A row range reads the same rows as the whole, dequantized or stored.
    for (a, b) in [(0, 1), (3, 17), (63, 64), (10, 10)] {
        let part = bf16s(sample.read("hidden.30", Some(a..b)).unwrap().bytes());
        let h = HIDDEN as usize;
        assert_eq!(part, whole[a as usize * h..b as usize * h]);
        let qp = sample.read_quantized(f, Some(a..b)).unwrap();
        assert_eq!(qp.codes, q.codes[a as usize * h..b as usize * h]);
        assert_eq!(qp.scales, q.scales[a as usize..b as usize]);
    }
    // hidden.2 was not named: exact, and not readable as quantized.
    let exact = ds.field_index("hidden.2").unwrap();
    assert_eq!(
        sample.read("hidden.2", None).unwrap().bytes(),
        data[4][2].1.as_slice()
    );
    match sample.read_quantized(exact, None) {
        Err(Error::BadOption { detail, .. }) => assert!(detail.contains("stored exactly")),
        other => panic!("{other:?}"),
    }
}

#[test]
fn fp8_stores_about_half_the_bytes_of_bf16() {
    let (plain, fp8) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let data = samples(40);
    write(plain.path(), schema(None), &data);
    write(fp8.path(), schema(Some("fp8")), &data);
    let bytes = |p: &std::path::Path| -> u64 {
        let ds = Dataset::open(p).unwrap();
        ds.manifest().shards.iter().map(|s| s.bytes).sum()
    };
    let ratio = bytes(fp8.path()) as f64 / bytes(plain.path()) as f64;
    // 1 byte instead of 2 per value plus a 4-byte scale per 256 values, and unpadded chunks.
    assert!((0.45..0.56).contains(&ratio), "fp8 / bf16 bytes = {ratio}");
}

#[test]
fn a_value_fp8_cannot_hold_is_refused_with_its_sample_field_and_row() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = DatasetWriter::create(dir.path(), schema(Some("fp8")), small_options()).unwrap();
    let mut s = samples(5).remove(3);
    // Row 4, element 9 of hidden.30: +inf in bf16.
    let at = (4 * HIDDEN as usize + 9) * 2;
    s[3].1[at..at + 2].copy_from_slice(&half::bf16::INFINITY.to_le_bytes());
    match w.append("bad", &as_fields(&s)) {
        Err(Error::BadSample { key, field, detail }) => {
            assert_eq!((key.as_str(), field.as_str()), ("bad", "hidden.30"));
            assert!(
                detail.contains("row 4") && detail.contains("element 9"),
                "{detail}"
            );
            assert!(detail.contains("unquantized"), "says what to do: {detail}");
        }
        other => panic!("{other:?}"),
    }
    // The writer goes on: the bad sample left nothing behind.
    w.append("good", &as_fields(&samples(5)[3])).unwrap();
    w.finish().unwrap();
    let ds = Dataset::open(dir.path()).unwrap();
    assert_eq!(ds.len(), 1);
}

#[test]
fn a_quantized_schema_in_an_older_manifest_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), schema(Some("fp8")), &samples(2));
    let path = dir.path().join("manifest.json");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("\"version\": 5"), "{text}");
    std::fs::write(&path, text.replace("\"version\": 5", "\"version\": 4")).unwrap();
    let err = Dataset::open(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("quantized field") && err.contains("version 5"),
        "{err}"
    );
}

#[test]
fn the_lossy_codec_is_never_a_dataset_wide_option() {
    let dir = tempfile::tempdir().unwrap();
    let options = WriteOptions {
        codec: hspack::Codec::Fp8,
        ..small_options()
    };
    match DatasetWriter::create(dir.path(), schema(None), options) {
        Err(Error::BadOption { option, detail }) => {
            assert_eq!(option, "codec");
            assert!(detail.contains("--quantize fp8"), "{detail}");
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
}
