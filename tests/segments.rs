//! Manifest version 4 as a writer grows it commit by commit: the manifest lists segments, not
//! shards, and stays small; the samples table is current after every commit; every key is
//! found through the key runs; a reader opened at any commit sees exactly what was committed.

mod common;

use arrow_array::{Array, StringArray, UInt64Array};
use common::*;
use hspack::{Dataset, DatasetWriter, WriteOptions};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

const HIDDEN: usize = 8;

/// (key, ordinal) of every row of the samples table's parts, in order.
fn table_rows(ds: &Dataset) -> Vec<(String, u64)> {
    let mut rows = Vec::new();
    for t in ds.manifest().table_files() {
        let bytes = std::fs::read(ds.dir().join(&t.file)).unwrap();
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes::Bytes::from(bytes))
            .unwrap()
            .build()
            .unwrap();
        for batch in reader {
            let batch = batch.unwrap();
            let keys = batch.column_by_name("key").unwrap();
            let keys = keys.as_any().downcast_ref::<StringArray>().unwrap();
            let ordinals = batch.column_by_name("ordinal").unwrap();
            let ordinals = ordinals.as_any().downcast_ref::<UInt64Array>().unwrap();
            for i in 0..batch.num_rows() {
                rows.push((keys.value(i).to_string(), ordinals.value(i)));
            }
        }
    }
    rows
}

#[test]
fn every_commit_leaves_a_current_table_and_a_small_manifest() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("ds");
    let options = WriteOptions {
        shard_samples: 2,
        ..small_options()
    };
    let mut w = DatasetWriter::create(&dir, capture_schema(HIDDEN as u64), options).unwrap();
    let mut largest_manifest = 0;
    const COMMITS: u64 = 150;
    for c in 0..COMMITS {
        for j in 0..2 {
            let i = 2 * c + j;
            w.append(&format!("k{i}"), &as_fields(&capture_sample(i, 2, HIDDEN)))
                .unwrap();
        }
        w.commit().unwrap();
        let ds = Dataset::open(&dir).unwrap();
        let m = ds.manifest();
        assert_eq!(ds.len(), 2 * (c + 1));
        // The table: one row per committed sample, in ordinal order, right after the commit.
        let rows = table_rows(&ds);
        let want: Vec<(String, u64)> = (0..ds.len()).map(|i| (format!("k{i}"), i)).collect();
        assert_eq!(rows, want, "after commit {c}");
        // At most 7 segments of a level, levels falling, one part per commit.
        let levels: Vec<u8> = m.segments.iter().map(|g| g.level).collect();
        assert!(levels.windows(2).all(|w| w[0] >= w[1]), "{levels:?}");
        for level in 0..4u8 {
            assert!(
                levels.iter().filter(|&&l| l == level).count() < 8,
                "{levels:?}"
            );
        }
        assert_eq!(m.table_files().len() as u64, c + 1);
        // What a merge replaced is removed once the manifest no longer lists it.
        let listed: Vec<&str> = m.listed_files().iter().map(|f| f.file).collect();
        for e in std::fs::read_dir(&dir).unwrap() {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            if name.starts_with("segment-") || name.starts_with("keys-") {
                assert!(
                    listed.contains(&name.as_str()),
                    "{name} left after commit {c}"
                );
            }
        }
        // The manifest names segments, never shards: its size follows the segments.
        let text = std::fs::read_to_string(dir.join("manifest.json")).unwrap();
        assert!(!text.contains("shard-"), "a shard named in the manifest");
        largest_manifest = largest_manifest.max(text.len());
        if c % 37 == 0 {
            for i in 0..ds.len() {
                assert_eq!(ds.get_by_key(&format!("k{i}")).unwrap().ordinal(), i);
            }
        }
    }
    // 150 commits: levels 2, 2, 1, 1, 0 x6 → 10 segments.
    let ds = Dataset::open(&dir).unwrap();
    let levels: Vec<u8> = ds.manifest().segments.iter().map(|g| g.level).collect();
    assert_eq!(levels, [2, 2, 1, 1, 0, 0, 0, 0, 0, 0]);
    let level2 = std::fs::read(
        Dataset::open(&dir)
            .unwrap()
            .dir()
            .join("segment-000000-000063.json"),
    );
    assert!(level2.is_ok(), "the level-2 segment of shards 0..=63");
    assert!(largest_manifest < 8 << 10, "{largest_manifest} bytes");
    w.finish().unwrap();
    // Finishing removes what merges replaced; everything left is listed.
    let report = hspack::verify::verify(&dir, Default::default(), &|_| {}).unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    assert!(report.leftovers.is_empty(), "{:?}", report.leftovers);
    assert!(
        report.unknown_files.is_empty(),
        "{:?}",
        report.unknown_files
    );
    for i in 0..2 * COMMITS {
        assert_eq!(ds.get_by_key(&format!("k{i}")).unwrap().ordinal(), i);
    }
    assert!(matches!(
        ds.get_by_key("k-none"),
        Err(hspack::Error::NoSuchKey { .. })
    ));
}

#[test]
fn a_reader_open_across_commits_keeps_its_snapshot() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("ds");
    let options = WriteOptions {
        shard_samples: 1,
        ..small_options()
    };
    let mut w = DatasetWriter::create(&dir, capture_schema(HIDDEN as u64), options).unwrap();
    for i in 0..5u64 {
        w.append(&format!("k{i}"), &as_fields(&capture_sample(i, 2, HIDDEN)))
            .unwrap();
    }
    w.commit().unwrap();
    let early = Dataset::open(&dir).unwrap();
    // Enough commits that the segments the early reader read are merged away.
    for i in 5..80u64 {
        w.append(&format!("k{i}"), &as_fields(&capture_sample(i, 2, HIDDEN)))
            .unwrap();
    }
    w.finish().unwrap();
    assert_eq!(early.len(), 5);
    for i in 0..5u64 {
        let s = early.get_by_key(&format!("k{i}")).unwrap();
        assert_eq!(s.ordinal(), i);
        let ids = s.read("input_ids", None).unwrap();
        assert_eq!(ids.bytes(), &capture_sample(i, 2, HIDDEN)[0].1[..]);
    }
    assert!(early.get_by_key("k6").is_err(), "committed after it opened");
    assert_eq!(Dataset::open(&dir).unwrap().len(), 80);
}
