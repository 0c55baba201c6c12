//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod cli;
pub mod crash_writer;
pub mod dumps;
pub mod fault_proxy;
pub mod http_files;
pub mod moto;
pub mod shared_writer;

use std::path::{Path, PathBuf};

use hspack::{CapturePoint, DType, Field, Role, Schema, WriteOptions};
use proptest::strategy::Strategy;

/// A schema like a capture's: token ids, loss mask, two hidden-state layers of width `hidden`.
pub fn capture_schema(hidden: u64) -> Schema {
    Schema::new(vec![
        Field::new("input_ids", DType::I32, &[], Role::TokenIds),
        Field::new("loss_mask", DType::U8, &[], Role::LossMask),
        Field::new(
            "hidden.2",
            DType::BF16,
            &[hidden],
            Role::HiddenState {
                layer: 2,
                point: CapturePoint::LayerInput,
            },
        ),
        Field::new(
            "hidden.30",
            DType::BF16,
            &[hidden],
            Role::HiddenState {
                layer: 30,
                point: CapturePoint::LayerInput,
            },
        ),
    ])
}

/// Deterministic bytes: a simple generator so tests need no randomness crate.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Field names and bytes of one sample.
pub type SampleBytes = Vec<(String, Vec<u8>)>;

/// One sample's fields for [`capture_schema`].
pub fn capture_sample(seed: u64, rows: usize, hidden: usize) -> SampleBytes {
    vec![
        ("input_ids".into(), bytes(seed, rows * 4)),
        (
            "loss_mask".into(),
            bytes(seed + 1, rows).iter().map(|b| b & 1).collect(),
        ),
        ("hidden.2".into(), bytes(seed + 2, rows * hidden * 2)),
        ("hidden.30".into(), bytes(seed + 3, rows * hidden * 2)),
    ]
}

/// Borrowed view for `DatasetWriter::append`.
pub fn as_fields(sample: &[(String, Vec<u8>)]) -> Vec<(&str, &[u8])> {
    sample
        .iter()
        .map(|(n, b)| (n.as_str(), b.as_slice()))
        .collect()
}

/// Small chunks and shards so tests cross every boundary; no fsync.
pub fn small_options() -> WriteOptions {
    WriteOptions {
        chunk_bytes: Some(1024),
        shard_bytes: 64 << 10,
        shard_samples: 5,
        durable: false,
        dataset_id: Some([9; 16]),
        ..WriteOptions::default()
    }
}

/// Copies the files of folder `from` into folder `to` (made if missing).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// `p` as a command-line argument.
pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Shard `seq` of the dataset in `dir`.
pub fn shard_path(dir: &Path, seq: u32) -> PathBuf {
    dir.join(format!("shard-{seq:06}.hsp"))
}

/// Flips one bit of the byte at `offset` of the file at `path`.
pub fn flip(path: &Path, offset: u64) {
    let mut b = std::fs::read(path).unwrap();
    b[offset as usize] ^= 0x10;
    std::fs::write(path, b).unwrap();
}

/// The torch fixtures written by `tests/fixtures/pt/make_fixtures.py`, and their
/// `expected.json`.
pub fn pt_fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pt")
}

/// Any dtype.
pub fn dtype_strategy() -> impl Strategy<Value = DType> {
    proptest::sample::select(DType::ALL.to_vec())
}

/// Reads every field of every sample of `b` and checks it against `a`, bitwise; calls
/// `after` after each sample.
pub fn same_samples(a: &hspack::Dataset, b: &hspack::Dataset, mut after: impl FnMut(u64)) {
    assert_eq!(a.len(), b.len());
    for i in 0..a.len() {
        let (x, y) = (a.sample(i).unwrap(), b.sample(i).unwrap());
        assert_eq!(x.key(), y.key());
        for f in 0..a.schema().fields.len() {
            let (tx, ty) = (
                x.read_field(f, None).unwrap(),
                y.read_field(f, None).unwrap(),
            );
            assert_eq!(tx.bytes(), ty.bytes(), "sample {i} field {f}");
            assert_eq!(tx.shape, ty.shape);
        }
        after(i);
    }
}
