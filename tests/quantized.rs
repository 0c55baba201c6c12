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
    let quantized = ds.schema().quantized_fields();
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

/// Writes `req_NNN.safetensors` dumps of finite activations (`ids` i32 `[T]`, `h` bf16
/// `[T, 256]`), or of random bytes (some of which are NaN or infinity) when `random`.
fn finite_dumps(dir: &std::path::Path, n: usize, random: bool) {
    use common::dumps::V;
    use safetensors::Dtype;
    std::fs::create_dir_all(dir).unwrap();
    let mut rng = Rng::new(3);
    let scales = channel_scales(&mut rng, 256);
    for i in 0..n {
        let t = 1 + i % 13;
        let h = match random {
            false => activations(&mut rng, t, &scales),
            true => bytes(i as u64 + 1, t * 256 * 2),
        };
        let tensors = [
            (
                "ids",
                V {
                    dtype: Dtype::I32,
                    shape: vec![t],
                    data: (0..t as i32).flat_map(i32::to_le_bytes).collect(),
                },
            ),
            (
                "h",
                V {
                    dtype: Dtype::BF16,
                    shape: vec![t, 256],
                    data: h,
                },
            ),
        ];
        let path = dir.join(format!("req_{i:03}.safetensors"));
        safetensors::serialize_to_file(
            tensors.iter().map(|(n, v)| (n.to_string(), v)),
            None,
            &path,
        )
        .unwrap();
    }
}

fn convert(src: &std::path::Path, dst: &std::path::Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "convert",
        s(src),
        s(dst),
        "--layout",
        "generic",
        "--field",
        "input_ids=ids",
        "--field",
        "hidden.7=h",
        "-q",
    ];
    args.extend_from_slice(extra);
    common::cli::hspack(&args)
}

#[test]
fn convert_quantize_info_and_compare_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let (src, exact, q) = (
        dir.path().join("src"),
        dir.path().join("exact"),
        dir.path().join("q"),
    );
    finite_dumps(&src, 20, false);
    assert!(convert(&src, &exact, &[]).status.success());
    let out = convert(&src, &q, &["--quantize", "fp8:hidden.7"]);
    assert!(out.status.success(), "{}", common::cli::text(&out));
    let info = common::cli::stdout(&common::cli::hspack(&["info", s(&q)]));
    assert!(
        info.contains("LOSSY: stored fp8-e4m3fn, a scale per 256 values"),
        "{info}"
    );
    assert!(
        info.contains("lossy     hidden.7 read back approximately"),
        "{info}"
    );
    let show = common::cli::stdout(&common::cli::hspack(&["show", s(&q), "#3"]));
    assert!(show.contains("lossy: hidden.7 decoded from fp8"), "{show}");
    let plain = common::cli::stdout(&common::cli::hspack(&["info", s(&exact)]));
    assert!(
        !plain.contains("LOSSY") && !plain.contains("lossy"),
        "{plain}"
    );

    let out = common::cli::hspack(&["compare", s(&exact), s(&q), "--json"]);
    assert!(out.status.success(), "{}", common::cli::text(&out));
    let c: serde_json::Value = serde_json::from_str(&common::cli::stdout(&out)).unwrap();
    assert_eq!(c["samples"], 20);
    let fields = c["fields"].as_array().unwrap();
    let ids = fields.iter().find(|f| f["field"] == "input_ids").unwrap();
    assert_eq!(
        (ids["differing"].as_u64(), ids["stored"].as_str()),
        (Some(0), Some("exact"))
    );
    let h = fields.iter().find(|f| f["field"] == "hidden.7").unwrap();
    assert_eq!(h["stored"], "fp8-e4m3fn");
    let (rel, cos) = (
        h["rel_l2"].as_f64().unwrap(),
        h["cosine_min"].as_f64().unwrap(),
    );
    // E4M3 keeps 3 mantissa bits: a few percent of error, cosine above 0.99.
    assert!(rel > 0.005 && rel < 0.06, "rel err {rel}");
    assert!(cos > 0.99 && cos < 1.0, "cosine {cos}");
    let table = common::cli::stdout(&common::cli::hspack(&["compare", s(&exact), s(&q)]));
    assert!(
        table.contains("20 samples") && table.contains("fp8-e4m3fn"),
        "{table}"
    );
    // The exact dataset against itself: no difference at all.
    let same = common::cli::hspack(&["compare", s(&exact), s(&exact), "--json"]);
    let c: serde_json::Value = serde_json::from_str(&common::cli::stdout(&same)).unwrap();
    assert!(c["fields"]
        .as_array()
        .unwrap()
        .iter()
        .all(|f| f["differing"] == 0 && f["rel_l2"] == 0.0));
    // Datasets of other samples are refused, naming the sample.
    let other = dir.path().join("other");
    finite_dumps(&dir.path().join("src2"), 25, false);
    assert!(convert(&dir.path().join("src2"), &other, &[])
        .status
        .success());
    let out = common::cli::hspack(&["compare", s(&other), s(&exact)]);
    assert!(!out.status.success());
    assert!(
        common::cli::text(&out)
            .contains("sample `req_020` of the first dataset is not in the second"),
        "{}",
        common::cli::text(&out)
    );
}

#[test]
fn convert_refuses_to_quantize_a_value_fp8_cannot_hold_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (src, q) = (dir.path().join("src"), dir.path().join("q"));
    finite_dumps(&src, 30, true);
    let out = convert(&src, &q, &["--quantize", "fp8:hidden.7"]);
    assert!(!out.status.success());
    let text = common::cli::text(&out);
    // The file at fault, the field, the token and what to do.
    assert!(
        text.contains(".safetensors: field `hidden.7` (tensor `h`) holds"),
        "{text}"
    );
    assert!(
        text.contains("at token") && text.contains("--quantize") && text.contains("--skip-bad"),
        "{text}"
    );
    // `fp8` alone takes every hidden-state field: the generic layout's `hidden.7` is one.
    // With --skip-bad the bad files are listed and the rest converted; none is half written.
    let out = convert(
        &src,
        &dir.path().join("q2"),
        &["--quantize", "fp8", "--skip-bad", "--json"],
    );
    let report: serde_json::Value = serde_json::from_str(&common::cli::stdout(&out)).unwrap();
    let bad = report["bad"].as_array().expect("bad files listed");
    assert!(!bad.is_empty(), "{report}");
    assert!(
        bad.iter()
            .all(|b| b.to_string().contains("(tensor `h`) holds")),
        "{report}"
    );
    let written = match dir.path().join("q2").join("manifest.json").exists() {
        true => Dataset::open(dir.path().join("q2")).unwrap().len(),
        false => 0,
    };
    assert_eq!(written as usize + bad.len(), 30, "{report}");
}

#[test]
fn fields_given_as_codes_and_scales_are_stored_as_given_and_checked() {
    use hspack::format::{fp8, DType};
    let (values, given) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let data = samples(10);
    let s = schema(Some("fp8"));
    write(values.path(), s.clone(), &data);
    // The stored form of a whole field is what quantizing all its rows at once gives: every
    // row's scales, then every row's codes (as a GPU quantizer hands it over).
    let stored =
        |raw: &[u8]| fp8::quantize(raw, DType::BF16, HIDDEN as usize, HIDDEN as usize).unwrap();
    let options = WriteOptions {
        durable: false,
        prequantized: true,
        ..WriteOptions::default()
    };
    let mut w = DatasetWriter::create(given.path(), s, options).unwrap();
    for (i, sample) in data.iter().enumerate() {
        let fields: Vec<(String, Vec<u8>)> = sample
            .iter()
            .map(|(n, b)| match n.starts_with("hidden") {
                true => (n.clone(), stored(b)),
                false => (n.clone(), b.clone()),
            })
            .collect();
        w.append(&format!("s{i}"), &as_fields(&fields)).unwrap();
    }
    // A NaN code and a scale of zero are refused, naming the rows.
    let mut bad: Vec<(String, Vec<u8>)> = data[3]
        .iter()
        .map(|(n, b)| (n.clone(), b.clone()))
        .collect();
    for (n, b) in bad.iter_mut() {
        if n.starts_with("hidden") {
            *b = stored(b);
        }
    }
    let rows = 17;
    let codes_at = rows * 4;
    bad[3].1[codes_at + 5] = 0x7f;
    match w.append("bad", &as_fields(&bad)) {
        Err(Error::BadSample { field, detail, .. }) => {
            assert_eq!(field, "hidden.30");
            assert!(
                detail.contains("rows 0..17") && detail.contains("NaN"),
                "{detail}"
            );
        }
        other => panic!("{other:?}"),
    }
    bad[3].1[codes_at + 5] = 0x00;
    bad[2].1[..4].copy_from_slice(&0f32.to_le_bytes());
    assert!(matches!(
        w.append("bad", &as_fields(&bad)),
        Err(Error::BadSample { .. })
    ));
    // A scale that decodes past bf16's largest value, and a group whose largest code is not
    // 448 (§4.1's scale is the largest magnitude over 448), are refused too: verify would pass
    // such chunks, and readers hand out infinities.
    bad[2].1[..4].copy_from_slice(&1e38f32.to_le_bytes());
    match w.append("bad", &as_fields(&bad)) {
        Err(Error::BadSample { field, detail, .. }) => {
            assert_eq!(field, "hidden.2");
            assert!(detail.contains("finite bf16"), "{detail}")
        }
        other => panic!("{other:?}"),
    }
    bad[2].1[..4].copy_from_slice(&stored(&data[3][2].1)[..4]);
    let row0 = &mut bad[2].1[codes_at..codes_at + HIDDEN as usize];
    for c in row0.iter_mut().filter(|c| **c & 0x7f == 0x7e) {
        *c = (*c & 0x80) | 0x76;
    }
    match w.append("bad", &as_fields(&bad)) {
        Err(Error::BadSample { detail, .. }) => assert!(detail.contains("448"), "{detail}"),
        other => panic!("{other:?}"),
    }
    // A stored form of the wrong length is refused as not whole rows.
    bad[2].1.pop();
    match w.append("bad", &as_fields(&bad)) {
        Err(Error::BadSample { detail, .. }) => {
            assert!(detail.contains("fp8 codes and scales"), "{detail}")
        }
        other => panic!("{other:?}"),
    }
    w.finish().unwrap();
    let (a, b) = (
        Dataset::open(values.path()).unwrap(),
        Dataset::open(given.path()).unwrap(),
    );
    assert_eq!(a.len(), b.len());
    for i in 0..a.len() {
        let (x, y) = (a.sample(i).unwrap(), b.sample(i).unwrap());
        for f in &a.schema().fields {
            assert_eq!(
                x.read(&f.name, None).unwrap().bytes(),
                y.read(&f.name, None).unwrap().bytes(),
                "{} of s{i}",
                f.name
            );
        }
    }
}

/// `compare` counts integers exactly (two i64 past 2^53 one apart differ by 1, though their
/// f64 are equal) and leaves NaN and infinities out of the error sums, counting them apart: a
/// dataset compared with itself reads rel err 0 and cos 1, not inf and NaN.
#[test]
fn compare_counts_integers_exactly_and_non_finite_values_apart() {
    use hspack::compare::{compare, CompareOptions};
    use hspack::{DType, Field, Role};
    let t = tempfile::tempdir().unwrap();
    let schema = Schema::new(vec![
        Field::new("input_ids", DType::I32, &[], Role::TokenIds),
        Field::new("logits", DType::F32, &[2], Role::Other),
        Field::new("ids64", DType::I64, &[], Role::Other),
    ]);
    let write = |name: &str, last: i64| {
        let mut w =
            DatasetWriter::create(t.path().join(name), schema.clone(), WriteOptions::default())
                .unwrap();
        let logits: Vec<u8> = [1.0f32, 2.0, f32::NAN, 1.0, f32::NEG_INFINITY, 3.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let ids: Vec<u8> = [(1i64 << 60) + last, 1, 2]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        w.append(
            "a",
            &[
                ("input_ids", &[0u8; 12][..]),
                ("logits", &logits),
                ("ids64", &ids),
            ],
        )
        .unwrap();
        w.finish().unwrap();
        Dataset::open(t.path().join(name)).unwrap()
    };
    let (a, b) = (write("a", 0), write("b", 1));
    // Comparing no sample is refused: nothing compared read as a perfect match.
    let e = compare(&a, &b, &CompareOptions { samples: Some(0) }).unwrap_err();
    assert!(
        e.to_string().contains("option samples: 0 compares nothing"),
        "{e}"
    );
    let same = compare(&a, &a, &CompareOptions::default()).unwrap();
    let logits = &same.fields[1];
    assert_eq!((logits.differing, logits.non_finite), (0, 2), "{logits:?}");
    assert_eq!((logits.max_abs, logits.rel_l2), (0.0, 0.0), "{logits:?}");
    assert_eq!(
        (logits.cosine_mean, logits.cosine_min),
        (1.0, 1.0),
        "{logits:?}"
    );
    let ids = &compare(&a, &b, &CompareOptions::default()).unwrap().fields[2];
    assert_eq!((ids.differing, ids.max_abs), (1, 1.0), "{ids:?}");
    // The command line says so; `show` gives min, max and mean of the finite values.
    let a = t.path().join("a");
    let out = common::cli::stdout(&common::cli::hspack(&["compare", s(&a), s(&a)]));
    assert!(
        out.contains("NOTE logits: 2 values NaN or infinite"),
        "{out}"
    );
    let out = common::cli::stdout(&common::cli::hspack(&["show", s(&a), "a"]));
    let line = out.lines().find(|l| l.contains("logits")).unwrap();
    assert!(line.contains("min 1") && line.contains("max 3"), "{line}");
    assert!(line.contains("(1 NaN, 1 infinite"), "{line}");
}

/// Fields whose dtype is an fp8 one (codes a model wrote, its scales elsewhere) are compared
/// by their codes' values, layer by layer: they were compared by bytes, every layer counted
/// under the first, with no error figures (0 and a cosine of 1 for values that differ).
#[test]
fn compare_gives_fp8_dtype_fields_their_figures_layer_by_layer() {
    use hspack::compare::{compare, CompareOptions};
    use hspack::format::CapturePoint;
    use hspack::{DType, Field, Role};
    let t = tempfile::tempdir().unwrap();
    let schema = Schema::new(vec![
        Field::new("input_ids", DType::I32, &[], Role::TokenIds),
        Field::new(
            "codes",
            DType::F8E4M3FN,
            &[2, 4],
            Role::HiddenStates {
                layers: vec![2, 3],
                point: CapturePoint::LayerInput,
            },
        ),
        Field::new("e5m2", DType::F8E5M2, &[4], Role::Other),
    ]);
    // Codes 0x38 = 1.0 (E4M3FN) and 0x3c = 1.0 (E5M2); layer 2's first value 2.0 (0x40) in b.
    let write = |name: &str, first: u8| {
        let mut w =
            DatasetWriter::create(t.path().join(name), schema.clone(), WriteOptions::default())
                .unwrap();
        let mut codes = vec![0x38u8; 3 * 8];
        codes[0] = first;
        w.append(
            "a",
            &[
                ("input_ids", &[0u8; 12][..]),
                ("codes", &codes),
                ("e5m2", &[0x3cu8; 12]),
            ],
        )
        .unwrap();
        w.finish().unwrap();
        Dataset::open(t.path().join(name)).unwrap()
    };
    let (a, b) = (write("a", 0x38), write("b", 0x40));
    let c = compare(&a, &b, &CompareOptions::default()).unwrap();
    let (layer2, layer3, e5m2) = (&c.fields[1], &c.fields[2], &c.fields[3]);
    assert_eq!(
        (layer2.layer, layer2.values, layer2.differing),
        (Some(2), 12, 1),
        "{layer2:?}"
    );
    assert_eq!(layer2.max_abs, 1.0, "{layer2:?}");
    assert!(layer2.rel_l2 > 0.0 && layer2.cosine_min < 1.0, "{layer2:?}");
    assert_eq!(
        (layer3.layer, layer3.values, layer3.differing),
        (Some(3), 12, 0),
        "{layer3:?}"
    );
    assert_eq!(
        (e5m2.values, e5m2.differing, e5m2.max_abs),
        (12, 0, 0.0),
        "{e5m2:?}"
    );
    let shown = a.sample(0).unwrap().read("e5m2", None).unwrap().to_f64();
    assert_eq!(shown, vec![1.0; 12]);
}
