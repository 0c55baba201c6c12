//! What `verify` and key listing report: interrupted work apart from damage, every chunk
//! header checked by the quick check, counts that say what was done, each cause said once.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::cli::{hspack_in, stderr, stdout, text};
use common::*;
use hspack::error::ChunkSite;
use hspack::verify::{verify, Report, VerifyOptions};
use hspack::{Dataset, DatasetWriter, Error, WriteOptions};

const HIDDEN: usize = 64;

fn options(shard_samples: u64) -> WriteOptions {
    WriteOptions {
        chunk_bytes: Some(4 * HIDDEN as u64 * 2),
        shard_samples,
        shard_bytes: u64::MAX,
        ..small_options()
    }
}

/// `n` samples `req-0..` in shards of `per_shard`, in `dir`.
fn write(dir: &Path, n: u64, per_shard: u64) {
    let mut w =
        DatasetWriter::open(dir, capture_schema(HIDDEN as u64), options(per_shard)).unwrap();
    for i in w.len()..n {
        let s = capture_sample(i * 7, 6 + i as usize, HIDDEN);
        w.append(&format!("req-{i}"), &as_fields(&s)).unwrap();
    }
    w.finish().unwrap();
}

/// 8 samples in 2 shards of 4.
fn dataset() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), 8, 4);
    dir
}

fn check(dir: &Path, quick: bool) -> Report {
    verify(dir, VerifyOptions { quick }, &|_| {}).unwrap()
}

fn names(paths: &[PathBuf]) -> Vec<String> {
    paths
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect()
}

/// What a writer killed mid-shard leaves, after it had published shard 2 but not the manifest
/// that lists it; plus one file hspack knows nothing of.
fn interrupt(dir: &Path) {
    let manifest = std::fs::read(dir.join("manifest.json")).unwrap();
    write(dir, 12, 4);
    std::fs::write(dir.join("manifest.json"), manifest).unwrap();
    std::fs::write(dir.join("shard-000003.hsp.tmp"), [7u8; 300]).unwrap();
    std::fs::write(
        dir.join("lane-5eed5eed5eed5eed5eed5eed5eed5eed-000001.hsp.tmp"),
        [7u8; 100],
    )
    .unwrap();
    std::fs::write(dir.join("manifest.json.tmp"), b"{").unwrap();
    std::fs::write(
        dir.join(".hspack-writer.lock"),
        std::process::id().to_string(),
    )
    .unwrap();
    std::fs::write(dir.join("notes.txt"), b"copied on monday").unwrap();
}

const LEFTOVER_NOTE: &str = "being written by a writer that holds the dataset now, or left by \
     an interrupted one, which reopening the dataset for writing removes once no writer holds it";

#[test]
fn files_of_an_interrupted_writer_are_a_note_not_damage() {
    let t = dataset();
    let dir = t.path();
    interrupt(dir);
    for quick in [false, true] {
        let r = check(dir, quick);
        assert!(r.is_ok(), "{:?}", r.problems);
        assert_eq!(
            names(&r.leftovers),
            [
                "keys-000002-000002.bin",
                "lane-5eed5eed5eed5eed5eed5eed5eed5eed-000001.hsp.tmp",
                "manifest.json.tmp",
                "samples-000002-000002.parquet",
                "segment-000002-000002.json",
                "shard-000002.hsp",
                "shard-000003.hsp.tmp"
            ]
        );
        assert_eq!(names(&r.unknown_files), ["notes.txt"]);
    }

    let o = hspack_in(&["verify", "."], dir);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = stdout(&o);
    assert!(!out.contains("DAMAGED"), "{out}");
    assert!(out.contains(LEFTOVER_NOTE), "{out}");
    for f in [
        "lane-5eed5eed5eed5eed5eed5eed5eed5eed-000001.hsp.tmp",
        "manifest.json.tmp",
        "segment-000002-000002.json",
        "shard-000002.hsp",
        "shard-000003.hsp.tmp",
        "notes.txt",
    ] {
        assert!(out.contains(f), "{f}: {out}");
    }
    assert!(!out.contains(".hspack-writer.lock"), "{out}");

    let o = hspack_in(&["verify", ".", "--json"], dir);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["problems"].as_array().unwrap().len(), 0, "{v}");
    assert_eq!(v["leftovers"].as_array().unwrap().len(), 7, "{v}");
    assert_eq!(v["unknown_files"].as_array().unwrap().len(), 1, "{v}");
    assert!(v["digest"].is_string(), "{v}");

    let o = hspack_in(&["verify", ".", "--quick"], dir);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = hspack_in(&["digest", "."], dir);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    // Damage of committed data is still damage, beside the note.
    let len = std::fs::metadata(shard_path(dir, 1)).unwrap().len();
    flip(&shard_path(dir, 1), len - 200);
    let o = hspack_in(&["verify", ".", "--quick"], dir);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(stdout(&o).contains("DAMAGED"), "{}", text(&o));
    assert!(stdout(&o).contains(LEFTOVER_NOTE), "{}", text(&o));
    flip(&shard_path(dir, 1), len - 200);

    // The note tells the truth: reopening for writing removes the leftovers, and only them.
    DatasetWriter::open(dir, capture_schema(HIDDEN as u64), options(4))
        .unwrap()
        .finish()
        .unwrap();
    let r = check(dir, false);
    assert!(r.is_ok() && r.leftovers.is_empty(), "{r:?}");
    assert_eq!(names(&r.unknown_files), ["notes.txt"]);
    assert_eq!(r.samples, 8);
}

/// The site a chunk problem names, if it is one.
fn site(e: &Error) -> Option<&ChunkSite> {
    match e {
        Error::BadChunk { site, .. }
        | Error::ChunkMisplaced { site, .. }
        | Error::ChecksumMismatch { site, .. } => Some(site),
        _ => None,
    }
}

#[test]
fn quick_verify_finds_a_flip_anywhere_in_any_chunk_header() {
    let t = dataset();
    let dir = t.path();
    let ds = Dataset::open(dir).unwrap();
    let chunks: u64 = ds.manifest().shards.iter().map(|s| s.chunks).sum();
    let e = ds.shard(1).unwrap().index().chunk(3).unwrap();
    let (key, field) = {
        let s = ds.shard(1).unwrap().site(3, ds.schema());
        (s.key.clone(), s.field.clone())
    };
    drop(ds);
    let intact = check(dir, true);
    assert!(intact.is_ok(), "{:?}", intact.problems);
    assert_eq!((intact.chunk_headers, intact.bytes_hashed), (chunks, 0));
    // magic, chunk id, shard seq, codec, dtype, field, reserved, sample, first row, row
    // count, raw length, stored length, hash, reserved, check word.
    for at in [
        0u64, 7, 8, 12, 16, 17, 18, 20, 24, 32, 40, 48, 56, 64, 95, 96, 119, 120, 127,
    ] {
        let path = shard_path(dir, 1);
        flip(&path, e.offset + at);
        let r = check(dir, true);
        assert_eq!(r.problems.len(), 1, "byte {at}: {:?}", r.problems);
        let s = site(&r.problems[0]).unwrap_or_else(|| panic!("byte {at}: {}", r.problems[0]));
        assert!(s.shard.ends_with("shard-000001.hsp"), "byte {at}: {s}");
        assert_eq!((s.chunk, &s.key, &s.field), (3, &key, &field), "byte {at}");
        assert_eq!(r.bytes_hashed, 0);
        flip(&path, e.offset + at);
    }
    assert!(check(dir, true).is_ok());
}

#[test]
fn verify_says_what_it_did_with_plurals_right() {
    let t = tempfile::tempdir().unwrap();
    write(&t.path().join("one"), 1, 4);
    write(&t.path().join("two"), 8, 4);
    let o = hspack_in(&["verify", "two", "--quick"], t.path());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let chunks: u64 = Dataset::open(t.path().join("two"))
        .unwrap()
        .manifest()
        .shards
        .iter()
        .map(|s| s.chunks)
        .sum();
    let out = stdout(&o);
    assert!(
        out.contains(&format!(
            "quick check of 2 shards, 8 samples, {chunks} chunk headers: OK"
        )),
        "{out}"
    );
    assert!(!out.contains("hashed"), "{out}");
    let o = hspack_in(&["verify", "two", "--quick", "--json"], t.path());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["chunk_headers"], chunks, "{v}");

    let o = hspack_in(&["verify", "one"], t.path());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = stdout(&o);
    assert!(out.contains("of 1 shard, 1 sample, "), "{out}");
    let e = Dataset::open(t.path().join("one"))
        .unwrap()
        .shard(0)
        .unwrap()
        .index()
        .chunk(0)
        .unwrap();
    flip(&t.path().join("one/shard-000000.hsp"), e.offset + 130);
    // The quick check hashes no payload: it finds nothing, and proves no digest.
    let o = hspack_in(&["verify", "one", "--quick", "--json"], t.path());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["ok"] == true && v["digest"].is_null(), "{v}");
    let o = hspack_in(&["verify", "one", "--json"], t.path());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["ok"] == false && v["digest"].is_null(), "{v}");
    let o = hspack_in(&["verify", "one"], t.path());
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(stdout(&o).contains(": 1 problem\n"), "{}", text(&o));
    let o = hspack_in(&["digest", "one"], t.path());
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(stderr(&o).contains("1 problem,"), "{}", text(&o));
}

#[test]
fn a_damaged_shard_does_not_hide_the_keys_of_the_others() {
    let t = dataset();
    let dir = t.path();
    let path = shard_path(dir, 0);
    let len = std::fs::metadata(&path).unwrap().len();
    flip(&path, len - hspack::format::Footer::SIZE as u64 - 20);
    let ds = Dataset::open(dir).unwrap();
    let parts: Vec<_> = ds.keys_by_shard().collect();
    assert_eq!(parts.len(), 2);
    assert_eq!(parts[0].ordinals, 0..4);
    let err = parts[0].keys.as_ref().unwrap_err();
    assert!(err.to_string().contains("shard-000000.hsp"), "{err}");
    assert_eq!(parts[1].ordinals, 4..8);
    assert_eq!(
        parts[1].keys.as_ref().unwrap(),
        &["req-4", "req-5", "req-6", "req-7"]
    );
    // A key of an intact shard is found; one that may be in the damaged shard is an error
    // naming it, not "no such key".
    assert_eq!(ds.find("req-6").unwrap().unwrap().ordinal(), 6);
    let err = ds.find("req-1").unwrap_err();
    assert!(err.to_string().contains("shard-000000.hsp"), "{err}");
    drop(ds);

    let o = hspack_in(&["ls", "."], dir);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = stdout(&o);
    for k in ["req-4", "req-5", "req-6", "req-7"] {
        assert!(out.contains(k), "{k}: {out}");
    }
    assert!(stderr(&o).contains("shard-000000.hsp"), "{}", text(&o));
    assert!(
        stderr(&o).contains("4 samples (ordinals 0 to 3) not listed"),
        "{}",
        text(&o)
    );
    let o = hspack_in(&["ls", ".", "--json"], dir);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(stdout(&o).lines().count(), 4, "{}", text(&o));
    let o = hspack_in(&["show", ".", "req-5"], dir);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn an_os_error_is_said_once() {
    let t = dataset();
    let dir = t.path();
    // The cause, said once: the system's error, or what is under the name (a folder).
    let os = |o: &Output| {
        let all = text(o);
        let said = all.matches("(os error ").count() + all.matches("not a regular file").count();
        assert_eq!(said, 1, "{all}");
    };
    // The manifest cannot be read: the command fails (exit 2).
    std::fs::rename(dir.join("manifest.json"), dir.join("m")).unwrap();
    std::fs::create_dir(dir.join("manifest.json")).unwrap();
    for cmd in ["verify", "digest", "ls"] {
        let o = hspack_in(&[cmd, "."], dir);
        assert_eq!(o.status.code(), Some(2), "{cmd}: {}", text(&o));
        assert!(stderr(&o).contains("manifest.json"), "{}", text(&o));
        os(&o);
    }
    std::fs::remove_dir(dir.join("manifest.json")).unwrap();
    std::fs::rename(dir.join("m"), dir.join("manifest.json")).unwrap();
    // A shard that is a folder cannot be read: that is damage (exit 1, to every command
    // meeting it), named once.
    std::fs::remove_file(shard_path(dir, 1)).unwrap();
    std::fs::create_dir(shard_path(dir, 1)).unwrap();
    let o = hspack_in(&["verify", "."], dir);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(stdout(&o).contains("DAMAGED"), "{}", text(&o));
    os(&o);
    let o = hspack_in(&["show", ".", "req-5"], dir);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    os(&o);
}

/// A shard that cannot be opened is reported once: the key-run check, which opens each
/// segment's shards again, said the same failure a second time.
#[test]
fn a_shard_that_does_not_open_is_reported_once() {
    let t = tempfile::tempdir().unwrap();
    let options = WriteOptions {
        shard_samples: 1,
        ..small_options()
    };
    let mut w = DatasetWriter::create(t.path(), capture_schema(8), options).unwrap();
    for i in 0..6 {
        let sample = capture_sample(i, 2, 8);
        w.append(&format!("s{i}"), &as_fields(&sample)).unwrap();
    }
    w.finish().unwrap();
    let shard = t.path().join("shard-000002.hsp");
    std::fs::remove_file(&shard).unwrap();
    std::os::unix::fs::symlink("shard-000002.hsp", &shard).unwrap();
    let report = verify(t.path(), VerifyOptions::default(), &|_| {}).unwrap();
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    assert!(
        report.problems[0].to_string().contains("shard-000002.hsp"),
        "{}",
        report.problems[0]
    );
}
