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

/// A copy whose segment is missing, and whose other segment is damaged, does not open:
/// verify says so as damage naming the file and the command, and repair restores both from
/// an intact copy.
#[test]
fn a_missing_or_damaged_segment_is_named_and_repaired_from_a_copy() {
    use common::cli::{hspack, text};
    let t = tempfile::tempdir().unwrap();
    let (good, bad) = (t.path().join("good"), t.path().join("bad"));
    let options = WriteOptions {
        shard_samples: 2,
        ..small_options()
    };
    let mut w =
        DatasetWriter::create(&good, capture_schema(HIDDEN as u64), options.clone()).unwrap();
    for i in 0..6u64 {
        w.append(&format!("k{i}"), &as_fields(&capture_sample(i, 2, HIDDEN)))
            .unwrap();
        if i % 2 == 1 {
            w.commit().unwrap();
        }
    }
    w.finish().unwrap();
    std::fs::create_dir_all(&bad).unwrap();
    for e in std::fs::read_dir(&good).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), bad.join(e.file_name())).unwrap();
    }
    let ds = Dataset::open(&good).unwrap();
    let segments: Vec<String> = (ds.manifest().listed_files().iter())
        .map(|f| f.file.to_string())
        .filter(|f| f.starts_with("segment-"))
        .collect();
    assert!(segments.len() >= 2, "{segments:?}");
    std::fs::remove_file(bad.join(&segments[0])).unwrap();
    let damaged = bad.join(&segments[1]);
    let mut bytes = std::fs::read(&damaged).unwrap();
    bytes[10] ^= 1;
    std::fs::write(&damaged, bytes).unwrap();
    let s = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let v = hspack(&["verify", &s(&bad)]);
    assert_eq!(v.status.code(), Some(1), "{}", text(&v));
    assert!(
        text(&v).contains(&segments[0])
            && text(&v).contains("hspack repair DATASET --from COPY")
            && !text(&v).contains("the manifest is the root of trust"),
        "{}",
        text(&v)
    );
    // From a copy of another dataset: refused, saying why.
    let other = t.path().join("other");
    let mut w = DatasetWriter::create(&other, capture_schema(HIDDEN as u64), options).unwrap();
    w.append("x", &as_fields(&capture_sample(99, 2, HIDDEN)))
        .unwrap();
    w.finish().unwrap();
    let r = hspack(&["repair", &s(&bad), "--from", &s(&other)]);
    assert_eq!(r.status.code(), Some(2), "{}", text(&r));
    assert!(
        text(&r).contains("restoring its parts from")
            && text(&r).contains("not a copy of the same dataset"),
        "{}",
        text(&r)
    );
    // From the copy itself, spelled otherwise: refused before anything is deleted.
    let r = hspack(&[
        "repair",
        &s(&bad),
        "--from",
        &format!("{}/../bad/", s(&bad)),
    ]);
    assert_eq!(r.status.code(), Some(2), "{}", text(&r));
    assert!(text(&r).contains("names the same copy"), "{}", text(&r));
    // While a writer (or a copy) holds the copy to repair: refused.
    let held = hspack::io::Storage::lock(&hspack::io::LocalStorage::new(&bad)).unwrap();
    let r = hspack(&["repair", &s(&bad), "--from", &s(&good)]);
    assert_ne!(r.status.code(), Some(0), "{}", text(&r));
    assert!(text(&r).contains("writer"), "{}", text(&r));
    drop(held);
    let r = hspack(&["repair", &s(&bad), "--from", &s(&good), "--json"]);
    assert!(r.status.success(), "{}", text(&r));
    let report: serde_json::Value = serde_json::from_str(&common::cli::stdout(&r)).unwrap();
    let replaced = report["files_replaced"].as_array().unwrap();
    for name in &segments[..2] {
        assert!(replaced.contains(&serde_json::json!(name)), "{report}");
    }
    assert_eq!(report["problems_left"], serde_json::json!([]));
    let v = hspack(&["verify", &s(&bad)]);
    assert_eq!(v.status.code(), Some(0), "{}", text(&v));
}

/// A copy of a dataset opened before a writer's commit merged its segments (every eighth
/// commit replaces the level's segments and key runs by one) says the source changed and to
/// run again, not that it is damaged; the rerun, of the dataset as it is now, goes through.
#[test]
fn a_copy_of_a_source_that_merged_segments_meanwhile_says_run_again() {
    let t = tempfile::tempdir().unwrap();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    let options = WriteOptions {
        shard_samples: 1,
        ..small_options()
    };
    let mut w = DatasetWriter::create(&src, capture_schema(HIDDEN as u64), options).unwrap();
    for i in 0..7u64 {
        w.append(&format!("k{i}"), &as_fields(&capture_sample(i, 2, HIDDEN)))
            .unwrap();
        w.commit().unwrap();
    }
    let opened = Dataset::open(&src).unwrap();
    w.append("k7", &as_fields(&capture_sample(7, 2, HIDDEN)))
        .unwrap();
    w.commit().unwrap();
    let to = hspack::io::open_location(&dst).unwrap();
    let err = hspack::transfer::copy(&opened, &to, &Default::default(), &|_| {}).unwrap_err();
    assert!(!err.is_damage(), "{err}");
    assert!(
        err.to_string().contains("has since replaced it")
            && err.to_string().contains("run the copy again"),
        "{err}"
    );
    assert!(!dst.join("manifest.json").exists());
    w.finish().unwrap();
    // A part gone while the manifest stays the same is the source's damage, not a change.
    let now = Dataset::open(&src).unwrap();
    let keys = (now.manifest().listed_files().iter())
        .map(|f| f.file.to_string())
        .find(|f| f.starts_with("keys-"))
        .unwrap();
    let saved = std::fs::read(src.join(&keys)).unwrap();
    std::fs::remove_file(src.join(&keys)).unwrap();
    let err = hspack::transfer::copy(&now, &to, &Default::default(), &|_| {}).unwrap_err();
    assert!(
        err.is_damage() && err.to_string().contains("hspack reindex"),
        "{err}"
    );
    std::fs::write(src.join(&keys), saved).unwrap();
    hspack::transfer::copy(&now, &to, &Default::default(), &|_| {}).unwrap();
    same_samples(&now, &Dataset::open(&dst).unwrap(), |_| {});
}

/// `sync` over an earlier copy, once the source's eighth commit merged its segments: the
/// destination lists the merged segment and keeps none of those it replaced.
#[test]
fn a_sync_leaves_no_segment_the_source_merged_away() {
    let t = tempfile::tempdir().unwrap();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    let options = WriteOptions {
        shard_samples: 1,
        ..small_options()
    };
    let mut w = DatasetWriter::create(&src, capture_schema(HIDDEN as u64), options).unwrap();
    let to = hspack::io::open_location(&dst).unwrap();
    let sync = hspack::transfer::CopyOptions {
        mode: hspack::transfer::CopyMode::Sync,
        ..Default::default()
    };
    for i in 0..8u64 {
        w.append(&format!("k{i}"), &as_fields(&capture_sample(i, 2, HIDDEN)))
            .unwrap();
        w.commit().unwrap();
        let now = Dataset::open(&src).unwrap();
        hspack::transfer::copy(&now, &to, &sync, &|_| {}).unwrap();
    }
    w.finish().unwrap();
    let now = Dataset::open(&src).unwrap();
    hspack::transfer::copy(&now, &to, &sync, &|_| {}).unwrap();
    let copy = Dataset::open(&dst).unwrap();
    let mut listed: Vec<String> = (copy.manifest().listed_files().iter())
        .map(|f| f.file.to_string())
        .chain(copy.manifest().shards.iter().map(|s| s.file.clone()))
        .collect();
    listed.push("manifest.json".into());
    let mut there: Vec<String> = std::fs::read_dir(&dst)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.starts_with('.'))
        .collect();
    listed.sort();
    there.sort();
    assert_eq!(there, listed);
    same_samples(&now, &copy, |_| {});
}

/// A segment or key run longer than the manifest records (a file grown by a bad copy, or a
/// crafted one naming a huge file) is refused on its length, read no further than that.
#[test]
fn files_longer_than_the_manifest_records_are_refused_on_their_length() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("ds");
    let opts = WriteOptions {
        durable: false,
        ..WriteOptions::default()
    };
    let mut w = DatasetWriter::create(&dir, capture_schema(HIDDEN as u64), opts).unwrap();
    w.append("a", &as_fields(&capture_sample(0, 3, HIDDEN)))
        .unwrap();
    w.finish().unwrap();
    let ds = Dataset::open(&dir).unwrap();
    let files = &ds.manifest().segment_files[0];
    let run = dir.join(&files.keys.as_ref().unwrap().file);
    let segment = dir.join(&ds.manifest().segments[0].file);
    drop(ds);
    let grow = |path: &std::path::Path| {
        let mut bytes = std::fs::read(path).unwrap();
        bytes.extend_from_slice(&[0u8; 1 << 20]);
        std::fs::write(path, bytes).unwrap();
    };
    grow(&run);
    let report = hspack::verify::verify(&dir, Default::default(), &|_| {}).unwrap();
    let said: Vec<String> = report.problems.iter().map(|e| e.to_string()).collect();
    assert!(
        said.iter()
            .any(|p| p.contains("more than the") && p.contains("keys-")),
        "{said:?}"
    );
    grow(&segment);
    let err = Dataset::open(&dir).unwrap_err().to_string();
    assert!(
        err.contains("read no further") && err.contains("segment-"),
        "{err}"
    );
}
