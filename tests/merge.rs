//! `hspack merge`: datasets written apart, made one; refusals before anything is written;
//! a rerun resumes and adds nothing twice.

mod common;

use std::path::Path;

use common::cli::{hspack_in, text};
use common::*;
use hspack::transfer::merge;
use hspack::{Codec, Dataset, DatasetWriter, Error, WriteOptions};

const HIDDEN: usize = 16;

fn write(dir: &Path, prefix: &str, n: u64, hidden: usize) {
    write_samples(dir, prefix, n, hidden, 0);
}

/// `write`, the samples' bytes drawn from other seeds (`shift` added).
fn write_seeded(dir: &Path, prefix: &str, n: u64, shift: u64) {
    write_samples(dir, prefix, n, HIDDEN, shift);
}

fn write_samples(dir: &Path, prefix: &str, n: u64, hidden: usize, shift: u64) {
    // Each dataset its own id, as every writer gives one: a merge's destination with a
    // source's id is a copy of that source.
    let options = WriteOptions {
        shard_samples: 3,
        dataset_id: None,
        ..small_options()
    };
    let mut w = DatasetWriter::create(dir, capture_schema(hidden as u64), options).unwrap();
    for i in 0..n {
        let sample = capture_sample(seed(prefix, i) + shift, 2 + i as usize % 5, hidden);
        w.append(&format!("{prefix}{i}"), &as_fields(&sample))
            .unwrap();
    }
    w.finish().unwrap();
}

fn seed(prefix: &str, i: u64) -> u64 {
    prefix.bytes().map(u64::from).sum::<u64>() * 1000 + i
}

/// Merging `sources` (folders of `t`) into folder `into` is refused, saying `why` and that
/// nothing was written.
fn assert_refused(t: &Path, sources: &[&str], into: &str, why: &str) {
    let dst = hspack::io::open_location(t.join(into)).unwrap();
    let err = merge(&open_all(t, sources), dst, Default::default(), &|_| {}).unwrap_err();
    assert!(matches!(err, Error::CopyRefused { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(why) && msg.contains("nothing was written"),
        "{msg}"
    );
}

fn open_all(t: &Path, names: &[&str]) -> Vec<Dataset> {
    names
        .iter()
        .map(|n| Dataset::open(t.join(n)).unwrap())
        .collect()
}

#[test]
fn merged_samples_are_the_sources_in_order_bit_for_bit() {
    let t = tempfile::tempdir().unwrap();
    write(&t.path().join("a"), "a", 10, HIDDEN);
    write(&t.path().join("b"), "b", 7, HIDDEN);
    let sources = open_all(t.path(), &["a", "b"]);
    let dst = hspack::io::open_location(t.path().join("ab")).unwrap();
    let options = WriteOptions {
        codec: Codec::Zstd,
        ..WriteOptions::default()
    };
    let report = merge(&sources, dst, options, &|_| {}).unwrap();
    assert_eq!((report.samples, report.samples_copied), (17, 17));
    let merged = Dataset::open(t.path().join("ab")).unwrap();
    let mut ordinal = 0;
    for (prefix, n) in [("a", 10u64), ("b", 7)] {
        for i in 0..n {
            let s = merged.sample(ordinal).unwrap();
            assert_eq!(s.key(), format!("{prefix}{i}"));
            let want = capture_sample(seed(prefix, i), 2 + i as usize % 5, HIDDEN);
            for (name, bytes) in &want {
                assert_eq!(
                    s.read(name, None).unwrap().bytes(),
                    &bytes[..],
                    "{prefix}{i}"
                );
            }
            assert_eq!(
                merged
                    .get_by_key(&format!("{prefix}{i}"))
                    .unwrap()
                    .ordinal(),
                ordinal
            );
            ordinal += 1;
        }
    }
    // A rerun (with the codec the merge began with) finds every sample there: nothing
    // copied, the same dataset.
    let dst = hspack::io::open_location(t.path().join("ab")).unwrap();
    let options = WriteOptions {
        codec: Codec::Zstd,
        ..WriteOptions::default()
    };
    let again = merge(&sources, dst, options, &|_| {}).unwrap();
    assert_eq!((again.samples, again.samples_copied), (17, 0));
    assert_eq!(again.digest, report.digest);
}

#[test]
fn a_shared_key_or_another_schema_is_refused_before_anything_is_written() {
    let t = tempfile::tempdir().unwrap();
    write(&t.path().join("a"), "k", 4, HIDDEN);
    write(&t.path().join("b"), "k", 2, HIDDEN);
    write(&t.path().join("wide"), "w", 2, 2 * HIDDEN);
    let dst = || hspack::io::open_location(t.path().join("out")).unwrap();
    assert_refused(t.path(), &["a", "b"], "out", "\"k0\"");
    let err = merge(
        &open_all(t.path(), &["a", "wide"]),
        dst(),
        Default::default(),
        &|_| {},
    )
    .unwrap_err();
    assert!(matches!(err, Error::SchemaMismatch { .. }), "{err}");
    assert!(err.to_string().contains("wide"), "{err}");
    // Said in words, with advice that fits a merge (not "write to a new folder").
    let said = err.to_string();
    assert!(
        said.contains(&format!("[{HIDDEN}] (hidden state, layer"))
            && said.contains(&format!("[{}] (hidden state, layer", 2 * HIDDEN))
            && said.contains("only datasets of one schema")
            // `wide` is the dataset the message names first: its schema is said first, "in it".
            && said.find(&format!("[{}] (hidden state", 2 * HIDDEN))
                < said.find(&format!("[{HIDDEN}] (hidden state"))
            && !said.contains("new folder")
            && !said.contains("HiddenState"),
        "{said}"
    );
    assert!(
        !t.path().join("out").exists(),
        "the refused merges wrote nothing"
    );
}

#[test]
fn a_source_given_as_the_destination_is_refused() {
    let t = tempfile::tempdir().unwrap();
    write(&t.path().join("a"), "a", 4, HIDDEN);
    write(&t.path().join("b"), "b", 3, HIDDEN);
    assert_refused(t.path(), &["a", "b"], "a/.", "one of the datasets to merge");
    assert_eq!(Dataset::open(t.path().join("a")).unwrap().len(), 4);
    // Nor inside one of them, or around one: their files would lie among each other's.
    assert_refused(
        t.path(),
        &["a", "b"],
        "b/sub",
        "lies inside the source dataset",
    );
    assert_refused(
        t.path(),
        &["a", "b"],
        ".",
        "the source dataset lies inside it",
    );
    assert!(!t.path().join("b/sub").exists());
    assert!(!t.path().join("manifest.json").exists());
    // A store's dataset is no folder: the same one spelled otherwise is refused too (it was
    // taken for an interrupted merge into it, and the other source appended to it).
    let o = hspack_in(&["store", "init", "ST"], t.path());
    assert!(o.status.success(), "{}", text(&o));
    let o = hspack_in(&["store", "add", "ST", "a", "--name", "x"], t.path());
    assert!(o.status.success(), "{}", text(&o));
    let absolute = t.path().join("ST/x").to_string_lossy().into_owned();
    for into in ["./ST/x", absolute.as_str(), "ST/../ST/x"] {
        let o = hspack_in(&["merge", "ST/x", "b", into], t.path());
        assert_eq!(o.status.code(), Some(2), "{into}: {}", text(&o));
        assert!(
            text(&o).contains("one of the datasets to merge"),
            "{}",
            text(&o)
        );
    }
    assert_eq!(Dataset::open(t.path().join("ST/x")).unwrap().len(), 4);
}

#[test]
fn the_command_line_merges_and_says_what_it_did() {
    let t = tempfile::tempdir().unwrap();
    write(&t.path().join("r0"), "r0-", 5, HIDDEN);
    write(&t.path().join("r1"), "r1-", 6, HIDDEN);
    write(&t.path().join("r2"), "r2-", 1, HIDDEN);
    let o = hspack_in(
        &["merge", "r0", "r1", "r2", "all", "--codec", "zstd"],
        t.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("12 samples"), "{}", text(&o));
    assert!(text(&o).contains("verified: OK"), "{}", text(&o));
    let o = hspack_in(&["verify", "all"], t.path());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // Run again with another codec: it said "0 samples copied ... verified: OK", the
    // dataset still zstd. The same codec resumes (nothing left to copy).
    let o = hspack_in(
        &["merge", "r0", "r1", "r2", "all", "--codec", "none"],
        t.path(),
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("written with codec zstd") && text(&o).contains("give --codec zstd"),
        "{}",
        text(&o)
    );
    let o = hspack_in(
        &["merge", "r0", "r1", "r2", "all", "--codec", "zstd"],
        t.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = hspack_in(&["merge", "r0", "all"], t.path());
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    // `all` is not a merge of r1 then r0: refused, with nothing to resume.
    let o = hspack_in(&["merge", "r1", "r0", "all"], t.path());
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("merge into a new folder"), "{}", text(&o));
    assert!(!text(&o).contains("to resume"), "{}", text(&o));
    let o = hspack_in(&["merge", "r0", "r1", "bad", "--codec", "lz4"], t.path());
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("zstd-bytegroup"), "{}", text(&o));
}

/// A merge keeps the sources' payload alignment unless told otherwise: datasets packed at 64
/// bytes were merged at 4 KiB, many times their size for small samples.
#[test]
fn the_command_line_merge_keeps_the_sources_alignment() {
    let t = tempfile::tempdir().unwrap();
    for (name, n) in [("p0", 30), ("p1", 30)] {
        let options = WriteOptions {
            align_log2: Some(6),
            dataset_id: None,
            ..small_options()
        };
        let mut w = DatasetWriter::create(t.path().join(name), capture_schema(8), options).unwrap();
        for i in 0..n {
            let sample = capture_sample(seed(name, i), 1, 8);
            w.append(&format!("{name}-{i}"), &as_fields(&sample))
                .unwrap();
        }
        w.finish().unwrap();
    }
    let align = |name: &str| {
        let ds = Dataset::open(t.path().join(name)).unwrap();
        let a = ds.shard(0).unwrap().header().align_log2;
        let bytes: u64 = ds.manifest().shards.iter().map(|s| s.bytes).sum();
        (a, bytes)
    };
    let o = hspack_in(&["merge", "p0", "p1", "kept"], t.path());
    assert!(o.status.success(), "{}", text(&o));
    let (a0, b0) = align("p0");
    let (a1, b1) = align("p1");
    let (kept, bytes) = align("kept");
    assert_eq!((a0, a1, kept), (6, 6, 6));
    assert!(
        bytes < 2 * (b0 + b1),
        "{bytes} bytes merged from {b0} and {b1}"
    );
    let o = hspack_in(
        &["merge", "p0", "p1", "paged", "--align-log2", "12"],
        t.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(align("paged").0, 12);
    // Into a store's dataset, the store's own 64 bytes, whatever the sources' (4 KiB here).
    write(&t.path().join("r0"), "r0-", 3, HIDDEN);
    write(&t.path().join("r1"), "r1-", 3, HIDDEN);
    assert_eq!(align("r0").0, 12);
    assert!(hspack_in(&["store", "init", "st"], t.path())
        .status
        .success());
    let o = hspack_in(&["merge", "r0", "r1", "st/m"], t.path());
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(align("st/m").0, 6);
}

#[test]
fn a_destination_that_is_not_an_interrupted_merge_of_the_sources_is_refused() {
    let t = tempfile::tempdir().unwrap();
    write(&t.path().join("a"), "k", 6, HIDDEN);
    write(&t.path().join("b"), "b", 4, HIDDEN);
    // Other contents under the same keys (a capture run again, say).
    write_seeded(&t.path().join("other"), "k", 6, 7);
    let dst = |name: &str| hspack::io::open_location(t.path().join(name)).unwrap();
    let other = Dataset::open(t.path().join("other")).unwrap();
    let before = other.sample(0).unwrap().read("hidden.2", None).unwrap();
    let keys = |ds: &Dataset| -> Vec<String> {
        ds.samples().map(|s| s.unwrap().key.to_string()).collect()
    };
    let refusals = [
        // Same keys, other bytes: nothing of `a` would be copied.
        (vec!["a"], "other", "differs in field"),
        // Another order of the same sources.
        (vec!["b", "a"], "ab", "is where this merge puts \"b0\""),
        // More samples than the sources have.
        (vec!["a"], "ab", "is past the sources' last sample"),
        // A copy of the first source: its samples are the merge's first ones, but the merge
        // would have appended to the user's copy.
        (vec!["a", "b"], "a_copy", "holds a copy of"),
    ];
    copy_dir(&t.path().join("a"), &t.path().join("a_copy"));
    merge(
        &open_all(t.path(), &["a", "b"]),
        dst("ab"),
        Default::default(),
        &|_| {},
    )
    .unwrap();
    for (sources, into, why) in refusals {
        let held = Dataset::open(t.path().join(into)).unwrap();
        assert_refused(t.path(), &sources, into, why);
        let after = Dataset::open(t.path().join(into)).unwrap();
        assert_eq!(keys(&after), keys(&held), "{sources:?} into {into}");
    }
    let other = Dataset::open(t.path().join("other")).unwrap();
    assert_eq!(
        other
            .sample(0)
            .unwrap()
            .read("hidden.2", None)
            .unwrap()
            .bytes(),
        before.bytes()
    );
    // A merge of a prefix of the sources, then of all of them, goes on from where it was.
    merge(
        &open_all(t.path(), &["a"]),
        dst("a_then_b"),
        Default::default(),
        &|_| {},
    )
    .unwrap();
    let report = merge(
        &open_all(t.path(), &["a", "b"]),
        dst("a_then_b"),
        Default::default(),
        &|_| {},
    )
    .unwrap();
    assert_eq!((report.samples, report.samples_copied), (10, 4));
}
