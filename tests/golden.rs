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

/// Every golden dataset folder, relative to the root.
fn datasets() -> Vec<String> {
    let mut v: Vec<String> = Codec::ALL
        .iter()
        .map(|c| format!("v1/{}", c.name()))
        .collect();
    v.push("v2/stacked".into());
    v.push("v3/leased".into());
    v
}

fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn golden_vectors_are_current() {
    let fresh = tempfile::tempdir().unwrap();
    golden::write_all(fresh.path()).unwrap();
    for set in datasets() {
        let (a, b) = (root().join(&set), fresh.path().join(&set));
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
    for codec in Codec::ALL {
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
