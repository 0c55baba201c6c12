//! Write → read round trips: every dtype, empty and 1-row samples, row-block boundaries,
//! every codec, keys, row ranges, zero-copy views.

mod common;

use common::*;
use hspack::read::Buffer;
use hspack::{Codec, Dataset, DatasetWriter, Field, Role, Schema, WriteOptions};
use proptest::prelude::*;

#[test]
fn capture_like_dataset_round_trips_by_ordinal_key_and_rows() {
    let dir = tempfile::tempdir().unwrap();
    let hidden = 64;
    let lens = [0usize, 1, 3, 4, 5, 7, 8, 9, 40, 2];
    let mut w =
        DatasetWriter::create(dir.path(), capture_schema(hidden as u64), small_options()).unwrap();
    let samples: Vec<_> = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| capture_sample(i as u64 * 10, n, hidden))
        .collect();
    for (i, s) in samples.iter().enumerate() {
        assert_eq!(
            w.append(&format!("req-{i}"), &as_fields(s)).unwrap(),
            i as u64
        );
    }
    let stats = w.finish().unwrap();
    assert_eq!(stats.samples, lens.len() as u64);
    assert!(stats.shards >= 2, "small shards roll: {stats:?}");

    let ds = Dataset::open(dir.path()).unwrap();
    assert_eq!(ds.len(), lens.len() as u64);
    for (i, s) in samples.iter().enumerate() {
        let by_ord = ds.sample(i as u64).unwrap();
        let by_key = ds.get_by_key(&format!("req-{i}")).unwrap();
        assert_eq!(by_ord.ordinal(), by_key.ordinal());
        assert_eq!(by_ord.rows(), lens[i] as u64);
        let mask_rows = s[1].1.iter().filter(|&&b| b != 0).count() as u64;
        assert_eq!(by_ord.loss_rows(), Some(mask_rows));
        for (name, data) in s {
            let t = by_ord.read(name, None).unwrap();
            assert_eq!(t.bytes(), data.as_slice(), "sample {i} field {name}");
            assert_eq!(t.rows(), lens[i] as u64);
        }
        // Every row range of the hidden state.
        let n = lens[i] as u64;
        for a in 0..=n.min(10) {
            for b in a..=n.min(10) {
                let t = by_key.read("hidden.30", Some(a..b)).unwrap();
                let row = hidden * 2;
                assert_eq!(t.bytes(), &s[3].1[a as usize * row..b as usize * row]);
            }
        }
        assert!(by_ord.read("hidden.2", Some(0..n + 1)).is_err());
    }
    assert!(ds.sample(lens.len() as u64).is_err());
    assert!(ds.find("nope").unwrap().is_none());
    assert!(ds.sample(0).unwrap().read("nope", None).is_err());
}

#[test]
fn uncompressed_single_chunk_reads_are_zero_copy_and_aligned() {
    let dir = tempfile::tempdir().unwrap();
    let opts = WriteOptions {
        durable: false,
        ..WriteOptions::default()
    };
    let mut w = DatasetWriter::create(dir.path(), capture_schema(128), opts).unwrap();
    let s = capture_sample(1, 16, 128);
    w.append("a", &as_fields(&s)).unwrap();
    w.finish().unwrap();
    let ds = Dataset::open(dir.path()).unwrap();
    let t = ds.sample(0).unwrap().read("hidden.2", None).unwrap();
    assert!(matches!(t.data, Buffer::File(_)) && t.data.is_mapped());
    assert_eq!(t.bytes().as_ptr() as usize % 4096, 0);
    let view = t.as_bf16().unwrap();
    assert_eq!(view.len(), 16 * 128);
    assert_eq!(bytemuck::cast_slice::<_, u8>(view), s[2].1.as_slice());
}

#[test]
fn appending_resumes_after_reopen_and_refuses_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = DatasetWriter::create(dir.path(), capture_schema(8), small_options()).unwrap();
    w.append("a", &as_fields(&capture_sample(1, 3, 8))).unwrap();
    w.finish().unwrap();
    assert!(DatasetWriter::create(dir.path(), capture_schema(8), small_options()).is_err());
    assert!(DatasetWriter::open(dir.path(), capture_schema(16), small_options()).is_err());
    let mut w = DatasetWriter::open(dir.path(), capture_schema(8), small_options()).unwrap();
    assert!(w.contains_key("a"));
    assert!(matches!(
        w.append("a", &as_fields(&capture_sample(1, 3, 8))),
        Err(hspack::Error::DuplicateKey { .. })
    ));
    assert_eq!(
        w.append("b", &as_fields(&capture_sample(2, 5, 8))).unwrap(),
        1
    );
    w.finish().unwrap();
    let ds = Dataset::open(dir.path()).unwrap();
    assert_eq!(ds.len(), 2);
    assert_eq!(ds.get_by_key("b").unwrap().rows(), 5);
    assert!(
        hspack::verify::verify(dir.path(), Default::default(), &|_| {})
            .unwrap()
            .is_ok()
    );
}

#[test]
fn bad_samples_are_refused_with_their_field_named() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = DatasetWriter::create(dir.path(), capture_schema(8), small_options()).unwrap();
    let mut s = capture_sample(1, 3, 8);
    s[2].1.pop();
    let e = w.append("k", &as_fields(&s)).unwrap_err().to_string();
    assert!(e.contains("`k`") && e.contains("hidden.2"), "{e}");
    let mut s = capture_sample(1, 3, 8);
    s[3].1.extend_from_slice(&[0; 16]);
    let e = w.append("k", &as_fields(&s)).unwrap_err().to_string();
    assert!(
        e.contains("field `hidden.30`") && e.contains("hidden.30 4)"),
        "{e}"
    );
    let s = capture_sample(1, 3, 8);
    let e = w.append("k", &as_fields(&s[..3])).unwrap_err().to_string();
    assert!(e.contains("hidden.30") && e.contains("missing"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn every_dtype_codec_and_block_boundary_round_trips(
        dtype in dtype_strategy(),
        width in 1u64..5,
        lens in proptest::collection::vec(0usize..12, 1..6),
        chunk_rows in 1u64..6,
        codec in proptest::sample::select(Codec::LOSSLESS.to_vec()),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let schema = Schema::new(vec![Field::new("x", dtype, &[width], Role::Other)]);
        let row = width * dtype.size() as u64;
        let opts = WriteOptions { chunk_bytes: Some(chunk_rows * row), codec, ..small_options() };
        let mut w = DatasetWriter::create(dir.path(), schema, opts).unwrap();
        let data: Vec<Vec<u8>> = lens.iter().enumerate().map(|(i, &n)| bytes(i as u64, n * row as usize)).collect();
        for (i, d) in data.iter().enumerate() {
            w.append(&i.to_string(), &[("x", d)]).unwrap();
        }
        w.finish().unwrap();
        let ds = Dataset::open(dir.path()).unwrap();
        for (i, d) in data.iter().enumerate() {
            let s = ds.get_by_key(&i.to_string()).unwrap();
            let t = s.read("x", None).unwrap();
            prop_assert_eq!(t.bytes(), d.as_slice());
            let n = lens[i] as u64;
            if n > 1 {
                let t = s.read("x", Some(1..n)).unwrap();
                prop_assert_eq!(t.bytes(), &d[row as usize..]);
            }
        }
        let report = hspack::verify::verify(dir.path(), Default::default(), &|_| {}).unwrap();
        prop_assert!(report.is_ok(), "{:?}", report.problems);
    }
}

/// The EAGLE-3 concatenation (row r of every field, side by side) equals the fields read one
/// by one and joined by hand: small samples (copied on the calling thread) and one of several
/// MiB over many chunks (read and copied on the pool), stored as-is and compressed, over
/// row ranges that start and end inside chunks.
#[test]
fn concatenated_reads_equal_the_fields_joined_by_hand() {
    let widths = [1000u64, 2000, 700];
    let schema = Schema::new(
        widths
            .iter()
            .enumerate()
            .map(|(i, &w)| Field::new(format!("h{i}"), hspack::DType::BF16, &[w], Role::Other))
            .collect(),
    );
    let lens = [0usize, 1, 5, 300];
    for codec in [Codec::None, Codec::ZstdByteGroup] {
        let dir = tempfile::tempdir().unwrap();
        let opts = WriteOptions {
            chunk_bytes: Some(64 << 10),
            codec,
            durable: false,
            ..WriteOptions::default()
        };
        let mut w = DatasetWriter::create(dir.path(), schema.clone(), opts).unwrap();
        let data: Vec<Vec<Vec<u8>>> = lens
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let fields = widths.iter().enumerate();
                fields
                    .map(|(f, &w)| bytes((i * 3 + f) as u64, n * w as usize * 2))
                    .collect()
            })
            .collect();
        for (i, fields) in data.iter().enumerate() {
            let named: Vec<(String, &Vec<u8>)> = fields
                .iter()
                .enumerate()
                .map(|(f, d)| (format!("h{f}"), d))
                .collect();
            let named: Vec<(&str, &[u8])> = named
                .iter()
                .map(|(n, d)| (n.as_str(), d.as_slice()))
                .collect();
            w.append(&i.to_string(), &named).unwrap();
        }
        w.finish().unwrap();
        let ds = Dataset::open(dir.path()).unwrap();
        // Fields in another order than the schema's, as a view may ask.
        let order = [2usize, 0, 1];
        let stride: usize = order.iter().map(|&f| widths[f] as usize * 2).sum();
        for (i, fields) in data.iter().enumerate() {
            let n = lens[i] as u64;
            let s = ds.sample(i as u64).unwrap();
            for rows in [
                0..n,
                n.min(7)..n.saturating_sub(7).max(n.min(7)),
                0..n.min(1),
            ] {
                let mut want = Vec::new();
                for r in rows.clone() {
                    for &f in &order {
                        let w = widths[f] as usize * 2;
                        want.extend_from_slice(&fields[f][r as usize * w..][..w]);
                    }
                }
                let mut out = vec![0xAAu8; (rows.end - rows.start) as usize * stride];
                s.read_concat_into(&order, rows.clone(), &mut out).unwrap();
                assert!(out == want, "{codec:?} sample {i} rows {rows:?}");
            }
            let mut short = vec![0u8; n as usize * stride + 1];
            let e = s.read_concat_into(&order, 0..n, &mut short).unwrap_err();
            assert!(e.to_string().contains("out"), "{e}");
        }
    }
}

/// Fields of different dtypes are never concatenated: their bytes side by side would read as
/// wrong values under one dtype (f16 under bf16, here of the same width).
#[test]
fn concatenating_fields_of_different_dtypes_is_refused() {
    let schema = Schema::new(vec![
        Field::new("a", hspack::DType::F16, &[4], Role::Other),
        Field::new("b", hspack::DType::BF16, &[4], Role::Other),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let opts = WriteOptions {
        durable: false,
        ..WriteOptions::default()
    };
    let mut w = DatasetWriter::create(dir.path(), schema, opts).unwrap();
    w.append("s", &[("a", &[0u8; 16][..]), ("b", &[0u8; 16][..])])
        .unwrap();
    w.finish().unwrap();
    let ds = Dataset::open(dir.path()).unwrap();
    let s = ds.sample(0).unwrap();
    let mut out = vec![0u8; 32];
    let e = s.read_concat_into(&[0, 1], 0..2, &mut out).unwrap_err();
    assert!(e.to_string().contains("share a dtype"), "{e}");
    let e = s.read_concat(&[0, 1], 0..2).unwrap_err();
    assert!(e.to_string().contains("share a dtype"), "{e}");
    s.read_concat_into(&[1], 0..2, &mut out[..16]).unwrap();
}

/// A field or shard number the dataset does not have, given to any read of the public API, is
/// an error naming it and what there is, never a panic.
#[test]
fn field_and_shard_numbers_the_dataset_lacks_are_errors() {
    let schema = Schema::new(vec![Field::new("a", hspack::DType::F16, &[4], Role::Other)]);
    let dir = tempfile::tempdir().unwrap();
    let opts = WriteOptions {
        durable: false,
        ..WriteOptions::default()
    };
    let mut w = DatasetWriter::create(dir.path(), schema, opts).unwrap();
    w.append("s", &[("a", &[0u8; 16][..])]).unwrap();
    w.finish().unwrap();
    let ds = Dataset::open(dir.path()).unwrap();
    let s = ds.sample(0).unwrap();
    let mut out = vec![0u8; 16];
    let said = |e: hspack::Error| e.to_string();
    let errors = [
        said(s.read_field(1, None).unwrap_err()),
        said(s.read_into(7, 0..2, &mut out).unwrap_err()),
        said(s.read_concat(&[0, 1], 0..2).unwrap_err()),
        said(
            s.read_concat_into(&[usize::MAX], 0..2, &mut out)
                .unwrap_err(),
        ),
        said(s.read_quantized(3, None).unwrap_err()),
        said(s.prefetch(&[2], false).unwrap_err()),
    ];
    for e in &errors {
        assert!(e.contains("number ") && e.contains("0: a"), "{e}");
    }
    let e = said(ds.shard(1).unwrap_err());
    assert!(
        e.contains("1 is not a shard number") && e.contains("has 1 shards"),
        "{e}"
    );
    ds.shard(0).unwrap();
    assert_eq!(s.read_field(0, None).unwrap().bytes(), &[0u8; 16][..]);
}
