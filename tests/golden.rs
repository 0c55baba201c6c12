//! The golden vectors in `format-spec/golden` must match what this code writes, and must
//! read back. When the format changes on purpose: bump the version, update FORMAT.md, and run
//! `cargo run --bin hspack-golden`.

#[path = "../format-spec/golden.rs"]
mod golden;

use std::path::{Path, PathBuf};

use hspack::verify::{verify, VerifyOptions};
use hspack::{Codec, Dataset};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("format-spec/golden")
}

fn committed() -> PathBuf {
    root().join("v1")
}

fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn golden_vectors_are_current() {
    let fresh = tempfile::tempdir().unwrap();
    golden::write_all(fresh.path()).unwrap();
    for set in golden::WRITTEN {
        let (a, b) = (root().join(set), fresh.path().join(set));
        assert_eq!(files(&a), files(&b), "{set}: file lists differ");
        for name in files(&a) {
            let (x, y) = (
                std::fs::read(a.join(&name)).unwrap(),
                std::fs::read(b.join(&name)).unwrap(),
            );
            assert!(
                x == y,
                "{set}/{name} is stale: the writer's bytes changed. If on purpose, bump the format version, update format-spec/FORMAT.md and run `cargo run --bin hspack-golden`"
            );
        }
    }
}

#[test]
fn golden_vectors_read_back_and_verify() {
    for codec in Codec::LOSSLESS {
        let dir = committed().join(codec.name());
        let report = verify(&dir, VerifyOptions::default(), &|_| {}).unwrap();
        assert!(report.is_ok(), "{:?}", report.problems);
        assert_eq!(report.shards, 2);
        let ds = Dataset::open(&dir).unwrap();
        assert_eq!(ds.len(), golden::LENGTHS.len() as u64);
        for (i, &rows) in golden::LENGTHS.iter().enumerate() {
            let s = ds.get_by_key(&format!("golden-{i}")).unwrap();
            assert_eq!(s.rows(), rows as u64);
            for f in &ds.schema().fields {
                let t = s.read(&f.name, None).unwrap();
                assert_eq!(t.bytes().len() as u64, rows as u64 * f.row_bytes());
            }
        }
    }
    // The same data under every codec.
    let a = Dataset::open(committed().join("none")).unwrap();
    for codec in [Codec::Zstd, Codec::ZstdByteGroup] {
        let b = Dataset::open(committed().join(codec.name())).unwrap();
        for i in 0..a.len() {
            for f in &a.schema().fields {
                let x = a.sample(i).unwrap().read(&f.name, None).unwrap();
                let y = b.sample(i).unwrap().read(&f.name, None).unwrap();
                assert_eq!(x.bytes(), y.bytes());
            }
        }
    }
}

#[test]
fn leased_golden_vector_is_version_3_and_reads_as_v1_does() {
    let dir = root().join("v3/leased");
    let report = verify(&dir, VerifyOptions::default(), &|_| {}).unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    assert!(report.leftovers.is_empty() && report.unknown_files.is_empty());
    let ds = Dataset::open(&dir).unwrap();
    assert_eq!(ds.manifest().version, 3);
    assert_eq!(ds.manifest().writer.lease.as_deref(), Some(golden::LEASE));
    assert_eq!(
        ds.manifest().shards[1].file,
        "shard-000001-6c6561736564676f.hsp"
    );
    // The same samples as v1/none, written without a lease.
    let v1 = Dataset::open(root().join("v1/none")).unwrap();
    assert_eq!(ds.len(), v1.len());
    for i in 0..ds.len() {
        let (a, b) = (ds.sample(i).unwrap(), v1.sample(i).unwrap());
        assert_eq!(a.key(), b.key());
        for f in &ds.schema().fields {
            let x = a.read(&f.name, None).unwrap();
            let y = b.read(&f.name, None).unwrap();
            assert_eq!(x.bytes(), y.bytes());
        }
    }
    // A version-2 manifest cannot carry a lease.
    let mut m = ds.manifest().clone();
    m.version = 2;
    let err = hspack::format::Manifest::decode(&m.encode()).unwrap_err();
    assert!(err.to_string().contains("writer.lease"), "{err}");
}

#[test]
fn stacked_golden_vector_is_version_2_and_reads_back() {
    let dir = root().join("v2/stacked");
    let report = verify(&dir, VerifyOptions::default(), &|_| {}).unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    let ds = Dataset::open(&dir).unwrap();
    assert_eq!(ds.manifest().version, 2);
    assert_eq!(ds.schema(), &golden::stacked_schema());
    let s = ds.get_by_key("golden-6").unwrap();
    let t = s.read("aux_hidden_state", None).unwrap();
    assert_eq!(t.shape, vec![16, 3, 4]);
    assert_eq!(t.bytes().len(), 16 * 3 * 4 * 2);
}

/// The samples of `a` and `b` are the same: keys and every field's bytes.
fn same_samples(a: &Dataset, b: &Dataset) {
    assert_eq!(a.len(), b.len());
    for i in 0..a.len() {
        let (x, y) = (a.sample(i).unwrap(), b.sample(i).unwrap());
        assert_eq!(x.key(), y.key());
        for f in &a.schema().fields {
            let (p, q) = (
                x.read(&f.name, None).unwrap(),
                y.read(&f.name, None).unwrap(),
            );
            assert_eq!(p.bytes(), q.bytes(), "sample {i} field {}", f.name);
        }
    }
}

#[test]
fn segments_golden_vectors_are_version_4_and_read_as_v1_does() {
    for (set, older) in [
        ("v4/segments", "v1/none"),
        ("v4/stacked", "v2/stacked"),
        ("v4/leased", "v3/leased"),
    ] {
        let dir = root().join(set);
        let report = verify(&dir, VerifyOptions::default(), &|_| {}).unwrap();
        assert!(report.is_ok(), "{set}: {:?}", report.problems);
        assert!(report.leftovers.is_empty() && report.unknown_files.is_empty());
        let ds = Dataset::open(&dir).unwrap();
        assert_eq!(ds.manifest().version, 4);
        same_samples(&ds, &Dataset::open(root().join(older)).unwrap());
        for i in 0..ds.len() {
            let s = ds.get_by_key(&format!("golden-{i}")).unwrap();
            assert_eq!(s.ordinal(), i);
        }
        assert!(ds.get_by_key("golden-99").is_err());
        // One table part per commit, never merged.
        let rows: u64 = ds.manifest().table_files().iter().map(|t| t.samples).sum();
        assert_eq!(rows, ds.len());
        assert_eq!(
            ds.manifest().table_files().len(),
            ds.manifest().shards.len()
        );
    }
    // Nine commits of one shard each: the first eight merged into one segment of level 1.
    let ds = Dataset::open(root().join("v4/segments")).unwrap();
    let m = ds.manifest();
    let shape: Vec<(u8, u32, u32, &str)> = (m.segments.iter())
        .map(|g| (g.level, g.first_seq, g.shards, g.file.as_str()))
        .collect();
    assert_eq!(
        shape,
        [
            (1, 0, 8, "segment-000000-000007.json"),
            (0, 8, 1, "segment-000008-000008.json")
        ]
    );
    let leased = Dataset::open(root().join("v4/leased")).unwrap();
    assert_eq!(
        leased.manifest().segments[0].file,
        "segment-000000-000000-6c6561736564676f.json"
    );
}

#[test]
fn a_writer_appending_to_a_version_1_dataset_writes_version_4() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("ds");
    std::fs::create_dir(&dir).unwrap();
    for name in files(&root().join("v1/none")) {
        std::fs::copy(root().join("v1/none").join(&name), dir.join(&name)).unwrap();
    }
    let v1 = Dataset::open(&dir).unwrap();
    assert_eq!(v1.manifest().version, 1);
    let mut w = hspack::DatasetWriter::open(&dir, golden::schema(), Default::default()).unwrap();
    // One row of zeros in every field.
    let fields: Vec<(String, Vec<u8>)> = (golden::schema().fields.iter())
        .map(|f| (f.name.clone(), vec![0u8; f.row_bytes() as usize]))
        .collect();
    let fields: Vec<(&str, &[u8])> = fields.iter().map(|(n, b)| (n.as_str(), &b[..])).collect();
    w.append("new", &fields).unwrap();
    w.finish().unwrap();
    let ds = Dataset::open(&dir).unwrap();
    let m = ds.manifest();
    assert_eq!(m.version, 4);
    assert_eq!(ds.len(), v1.len() + 1);
    // The earlier shards: one segment, whose part is the earlier table, kept as it was.
    assert_eq!((m.segments[0].first_seq, m.segments[0].shards), (0, 2));
    assert_eq!(m.table_files()[0].file, "samples.parquet");
    assert_eq!(ds.get_by_key("new").unwrap().ordinal(), v1.len());
    assert_eq!(ds.get_by_key("golden-3").unwrap().ordinal(), 3);
    let report = verify(&dir, VerifyOptions::default(), &|_| {}).unwrap();
    assert!(report.is_ok() && report.leftovers.is_empty(), "{report:?}");
}

#[test]
fn store_golden_vector_reads_as_the_datasets_it_holds() {
    let store = root().join("store-v1");
    for (name, plain) in [
        ("segments", "v4/segments"),
        ("again", "v4/segments"),
        ("stacked", "v4/stacked"),
    ] {
        let (a, b) = (
            Dataset::open(root().join(plain)).unwrap(),
            Dataset::open(store.join(name)).unwrap(),
        );
        assert_eq!(a.manifest_bytes(), b.manifest_bytes(), "{name}");
        same_samples(&a, &b);
        let report = verify(store.join(name), VerifyOptions::default(), &|_| {}).unwrap();
        assert!(report.problems.is_empty(), "{name}: {:?}", report.problems);
    }
}

#[test]
fn quantized_golden_vector_is_version_5_and_reads_back_near_its_values() {
    let dir = root().join("v5/quantized");
    let report = verify(&dir, VerifyOptions::default(), &|_| {}).unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    let ds = Dataset::open(&dir).unwrap();
    assert_eq!(ds.manifest().version, 5);
    assert_eq!(ds.schema(), &golden::quantized_schema());
    // Every row of every field, against the generator: the exact field bit for bit, the
    // quantized ones within FP8's error (what `tests/spec_reader` checks bit for bit).
    let mut rng = hspack::synth::Rng::new(5);
    for (i, &rows) in golden::LENGTHS.iter().enumerate() {
        let s = ds.sample(i as u64).unwrap();
        for f in &ds.schema().fields {
            let t = s.read(&f.name, None).unwrap();
            let got: Vec<f32> = match f.dtype {
                hspack::format::DType::I32 => t
                    .bytes()
                    .chunks_exact(4)
                    .map(|b| i32::from_le_bytes(b.try_into().unwrap()) as f32)
                    .collect(),
                hspack::format::DType::F32 => t
                    .bytes()
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                    .collect(),
                hspack::format::DType::F16 => t
                    .bytes()
                    .chunks_exact(2)
                    .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect(),
                _ => t
                    .bytes()
                    .chunks_exact(2)
                    .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect(),
            };
            let mut want = Vec::new();
            for r in 0..rows {
                for _ in 0..f.row_elems() {
                    let v = match (i + r) % 5 {
                        0 => 0.0,
                        _ => golden::quantized_value(&mut rng),
                    };
                    want.push(match f.dtype {
                        hspack::format::DType::I32 => r as f32,
                        hspack::format::DType::F32 => v,
                        hspack::format::DType::F16 => half::f16::from_f32(v).to_f32(),
                        _ => half::bf16::from_f32(v).to_f32(),
                    });
                }
            }
            assert_eq!(got.len(), want.len(), "{} of golden-{i}", f.name);
            let group = f.group() as usize;
            for (g, (a, b)) in want.chunks(group).zip(got.chunks(group)).enumerate() {
                if f.quantized.is_none() {
                    assert_eq!(a, b, "{} of golden-{i} is exact", f.name);
                    continue;
                }
                let scale = a.iter().fold(0f32, |m, v| m.max(v.abs())) / 448.0;
                for (x, y) in a.iter().zip(b) {
                    let bound = x.abs() / 16.0 + scale / 1024.0 + x.abs().max(y.abs()) / 256.0;
                    assert!(
                        (x - y).abs() <= bound,
                        "{} of golden-{i}, group {g}: {x} read {y}",
                        f.name
                    );
                }
            }
        }
    }
}
