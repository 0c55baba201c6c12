//! Every corruption is caught and named; readers return an error, never wrong data.

mod common;

use std::path::Path;

use common::*;
use hspack::format::Footer;
use hspack::verify::{verify, verify_dataset, VerifyOptions};
use hspack::{Codec, Dataset, DatasetWriter, Error, WriteOptions};

const HIDDEN: usize = 64;

/// A dataset of 8 samples in 2 shards of 4 (chunks of 4 rows of hidden state).
fn dataset(codec: Codec) -> (tempfile::TempDir, Vec<SampleBytes>) {
    dataset_with_id(codec, [9; 16])
}

/// [`dataset`], with dataset id `id`.
fn dataset_with_id(codec: Codec, id: [u8; 16]) -> (tempfile::TempDir, Vec<SampleBytes>) {
    let dir = tempfile::tempdir().unwrap();
    let opts = WriteOptions {
        chunk_bytes: Some(4 * HIDDEN as u64 * 2),
        shard_samples: 4,
        shard_bytes: u64::MAX,
        codec,
        dataset_id: Some(id),
        ..small_options()
    };
    let mut w = DatasetWriter::create(dir.path(), capture_schema(HIDDEN as u64), opts).unwrap();
    let samples: Vec<_> = (0..8)
        .map(|i| capture_sample(i * 7, 6 + i as usize, HIDDEN))
        .collect();
    for (i, s) in samples.iter().enumerate() {
        w.append(&format!("req-{i}"), &as_fields(s)).unwrap();
    }
    w.finish().unwrap();
    (dir, samples)
}

/// Offset of the payload of chunk `c` of shard `seq`.
fn chunk_entry(dir: &Path, seq: usize, c: u64) -> hspack::format::ChunkEntry {
    let ds = Dataset::open(dir).unwrap();
    let shard = ds.shard(seq).unwrap();
    shard.index().chunk(c).unwrap()
}

fn problems(dir: &Path) -> Vec<Error> {
    verify(dir, VerifyOptions::default(), &|_| {})
        .unwrap()
        .problems
}

#[test]
fn intact_dataset_verifies() {
    for codec in Codec::LOSSLESS {
        let (dir, _) = dataset(codec);
        assert!(problems(dir.path()).is_empty());
    }
}

#[test]
fn bit_flip_in_a_payload_is_named_by_read_and_verify() {
    for codec in Codec::LOSSLESS {
        let (dir, samples) = dataset(codec);
        // Chunk 2 of shard 1: sample 4 (`req-4`, 10 rows): ids, mask, hidden.2 rows 0..4.
        let e = chunk_entry(dir.path(), 1, 2);
        flip(
            &shard_path(dir.path(), 1),
            e.offset + 128 + e.stored_len / 2,
        );
        let ds = Dataset::open(dir.path()).unwrap();
        let s = ds.get_by_key("req-4").unwrap();
        let err = s.read("hidden.2", None).unwrap_err();
        match &err {
            Error::ChecksumMismatch { site, .. } => {
                assert_eq!(site.key, "req-4");
                assert_eq!(site.field, "hidden.2");
                assert_eq!(site.rows, 0..4);
                assert!(site.shard.ends_with("shard-000001.hsp"));
            }
            other => panic!("{codec:?}: {other}"),
        }
        let msg = err.to_string();
        assert!(
            msg.contains("req-4") && msg.contains("hidden.2") && msg.contains("rows 0..4"),
            "{msg}"
        );
        // Rows in other chunks and other samples are still served, and are right.
        let t = s.read("hidden.2", Some(4..10)).unwrap();
        assert_eq!(t.bytes(), &samples[4][2].1[4 * HIDDEN * 2..]);
        assert_eq!(
            ds.get_by_key("req-5")
                .unwrap()
                .read("hidden.2", None)
                .unwrap()
                .bytes(),
            samples[5][2].1.as_slice()
        );
        // A second read still refuses: a failed check is not remembered as passed.
        assert!(s.read("hidden.2", Some(0..1)).is_err());
        let p = problems(dir.path());
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            matches!(&p[0], Error::ChecksumMismatch { site, .. } if site.key == "req-4" && site.chunk == 2)
        );
    }
}

#[test]
fn bit_flip_in_an_index_fails_the_shard() {
    let (dir, _) = dataset(Codec::None);
    let path = shard_path(dir.path(), 0);
    let len = std::fs::metadata(&path).unwrap().len();
    flip(&path, len - Footer::SIZE as u64 - 20);
    let ds = Dataset::open(dir.path()).unwrap();
    assert!(matches!(
        ds.sample(0),
        Err(Error::ShardMismatch {
            what: "index blake3",
            ..
        })
    ));
    // Shard 1 is unaffected.
    assert!(ds.sample(4).is_ok());
    let p = problems(dir.path());
    assert_eq!(p.len(), 1);
    assert!(p[0].to_string().contains("shard-000000.hsp"), "{}", p[0]);
    // With the samples it holds and what mends it (it said "the shard was replaced or the
    // manifest is stale; copy the dataset again from its source").
    assert!(
        p[0].to_string()
            .contains("shard 0 holding the samples of ordinals 0 to 3 is damaged")
            && p[0]
                .to_string()
                .contains("hspack repair DATASET --from COPY"),
        "{}",
        p[0]
    );
}

#[test]
fn bit_flip_in_a_footer_fails_the_shard() {
    let (dir, _) = dataset(Codec::None);
    let path = shard_path(dir.path(), 1);
    let len = std::fs::metadata(&path).unwrap().len();
    for at in [len - 1, len - 30, len - 100, len - 128] {
        let (dir, _) = dataset(Codec::None);
        let path = shard_path(dir.path(), 1);
        flip(&path, at);
        let ds = Dataset::open(dir.path()).unwrap();
        let err = ds.sample(5).unwrap_err();
        assert!(matches!(err, Error::Format { .. }), "flip at {at}: {err}");
        assert!(err.to_string().contains("shard-000001.hsp"));
        assert_eq!(problems(dir.path()).len(), 1);
    }
}

#[test]
fn bit_flips_in_the_manifest_are_refused() {
    let (dir, _) = dataset(Codec::None);
    let path = dir.path().join("manifest.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let other = |h: &str| format!("{}{}", if h.starts_with('0') { "1" } else { "0" }, &h[1..]);
    // A changed segment hash: the segment no longer matches, and nothing opens.
    let m = hspack::format::Manifest::decode(text.as_bytes()).unwrap();
    let segment = &m.segments[0];
    std::fs::write(
        &path,
        text.replace(&segment.blake3, &other(&segment.blake3)),
    )
    .unwrap();
    let err = Dataset::open(dir.path()).unwrap_err();
    assert!(matches!(err, Error::Format { .. }), "{err}");
    assert!(err.to_string().contains(&segment.file), "{err}");
    // A changed index hash in the segment: the segment no longer hashes to its entry.
    std::fs::write(&path, &text).unwrap();
    let segment_path = dir.path().join(&segment.file);
    let segment_text = std::fs::read_to_string(&segment_path).unwrap();
    let h = segment_text.split("\"index_blake3\": \"").nth(1).unwrap()[..64].to_string();
    std::fs::write(&segment_path, segment_text.replace(&h, &other(&h))).unwrap();
    let err = Dataset::open(dir.path()).unwrap_err();
    assert!(err.to_string().contains("BLAKE3 differs"), "{err}");
    std::fs::write(&segment_path, &segment_text).unwrap();
    // A changed sample count: the manifest contradicts itself.
    std::fs::write(&path, text.replace("\"samples\": 8", "\"samples\": 9")).unwrap();
    assert!(matches!(
        Dataset::open(dir.path()),
        Err(Error::Format { .. })
    ));
    // A changed schema: the schema hash disagrees.
    std::fs::write(&path, text.replace("\"bf16\"", "\"f16\"")).unwrap();
    assert!(matches!(
        Dataset::open(dir.path()),
        Err(Error::Format { .. })
    ));
    // Broken JSON.
    std::fs::write(&path, &text[..text.len() / 2]).unwrap();
    let err = Dataset::open(dir.path()).unwrap_err();
    assert!(err.to_string().contains("manifest.json"), "{err}");
}

#[test]
fn a_truncated_shard_is_named() {
    let (dir, _) = dataset(Codec::None);
    let path = shard_path(dir.path(), 0);
    let len = std::fs::metadata(&path).unwrap().len();
    for cut in [0, 1, 127, 128, 4096, len / 2, len - 129, len - 1] {
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(cut).unwrap();
        let ds = Dataset::open(dir.path()).unwrap();
        let err = ds.sample(1).unwrap_err();
        assert!(
            matches!(err, Error::ShardMismatch { what: "size", .. }),
            "cut {cut}: {err}"
        );
    }
}

/// A FIFO, a folder or a socket under the name of a file the manifest lists: the open of a
/// FIFO waited for a writer forever (`verify`, `ls`, `show` never ended). Each is damage that
/// names the file, found by opening the dataset or by `verify`, within the time allowed.
#[test]
fn something_other_than_a_file_under_a_listed_name_is_damage_not_a_hang() {
    let (dir, _) = dataset(Codec::None);
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    assert!(names.len() >= 5, "{names:?}"); // manifest, shards, segment, key run, table
    for name in &names {
        for kind in ["FIFO", "folder", "socket"] {
            let copy = tempfile::tempdir().unwrap();
            copy_dir(dir.path(), copy.path());
            let path = copy.path().join(name);
            std::fs::remove_file(&path).unwrap();
            // (A socket cannot be opened at all: it read as a failed read, to retry.)
            let _listening = match kind {
                "FIFO" => {
                    let made = std::process::Command::new("mkfifo").arg(&path).status();
                    assert!(made.unwrap().success());
                    None
                }
                "socket" => Some(std::os::unix::net::UnixListener::bind(&path).unwrap()),
                _ => {
                    std::fs::create_dir(&path).unwrap();
                    None
                }
            };
            let (tx, rx) = std::sync::mpsc::channel();
            let root = copy.path().to_path_buf();
            std::thread::spawn(move || {
                let found: Vec<Error> = match Dataset::open(&root) {
                    Err(e) => vec![e],
                    Ok(_) => problems(&root),
                };
                let _ = tx.send(found);
            });
            let found = rx
                .recv_timeout(std::time::Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("{kind} as {name}: still waiting after 60 s"));
            assert!(
                found
                    .iter()
                    .any(|e| e.is_damage() && e.to_string().contains(name.as_str())),
                "{kind} as {name}: {found:?}"
            );
        }
    }
}

#[test]
fn swapped_chunks_are_caught_by_their_headers() {
    let (dir, samples) = dataset(Codec::None);
    let path = shard_path(dir.path(), 0);
    // Chunks 2 and 3: rows 0..4 and 4..6 of hidden.2 of sample 0 — swap two equal-sized
    // chunks instead: hidden.2 rows 0..4 (chunk 2) and hidden.30 rows 0..4 (chunk 4).
    let (a, b) = (chunk_entry(dir.path(), 0, 2), chunk_entry(dir.path(), 0, 4));
    assert_eq!(a.stored_len, b.stored_len);
    let mut bytes = std::fs::read(&path).unwrap();
    let n = 128 + a.stored_len as usize;
    let (x, y) = (a.offset as usize, b.offset as usize);
    let chunk_a = bytes[x..x + n].to_vec();
    let chunk_b = bytes[y..y + n].to_vec();
    bytes[x..x + n].copy_from_slice(&chunk_b);
    bytes[y..y + n].copy_from_slice(&chunk_a);
    std::fs::write(&path, bytes).unwrap();
    let ds = Dataset::open(dir.path()).unwrap();
    let s = ds.sample(0).unwrap();
    let err = s.read("hidden.2", None).unwrap_err();
    assert!(
        matches!(
            err,
            Error::ChunkMisplaced {
                what: "chunk id",
                ..
            }
        ),
        "{err}"
    );
    assert!(s.read("hidden.30", None).is_err());
    assert_eq!(
        s.read("input_ids", None).unwrap().bytes(),
        samples[0][0].1.as_slice()
    );
    let p = problems(dir.path());
    assert_eq!(
        p.iter()
            .filter(|e| matches!(e, Error::ChunkMisplaced { .. }))
            .count(),
        2,
        "{p:?}"
    );
}

#[test]
fn a_shifted_chunk_is_caught() {
    let (dir, _) = dataset(Codec::Zstd);
    let path = shard_path(dir.path(), 0);
    let e = chunk_entry(dir.path(), 0, 3);
    let mut bytes = std::fs::read(&path).unwrap();
    // A copy bug that drops one byte before the chunk and pads after it.
    let at = e.offset as usize - 1;
    bytes.remove(at);
    bytes.insert(e.offset as usize + 100, 0);
    std::fs::write(&path, bytes).unwrap();
    let ds = Dataset::open(dir.path()).unwrap();
    let err = ds.sample(0).unwrap().read("hidden.2", None).unwrap_err();
    assert!(
        matches!(
            err,
            Error::BadChunk { .. } | Error::ChunkMisplaced { .. } | Error::ChecksumMismatch { .. }
        ),
        "{err}"
    );
    assert!(!problems(dir.path()).is_empty());
}

#[test]
fn a_shard_from_another_dataset_is_named() {
    let (dir, _) = dataset(Codec::None);
    let other = tempfile::tempdir().unwrap();
    let opts = WriteOptions {
        dataset_id: Some([1; 16]),
        chunk_bytes: Some(4 * HIDDEN as u64 * 2),
        shard_samples: 4,
        shard_bytes: u64::MAX,
        ..small_options()
    };
    let mut w = DatasetWriter::create(other.path(), capture_schema(HIDDEN as u64), opts).unwrap();
    for i in 0..8 {
        w.append(
            &format!("req-{i}"),
            &as_fields(&capture_sample(i * 7, 6 + i as usize, HIDDEN)),
        )
        .unwrap();
    }
    w.finish().unwrap();
    std::fs::copy(shard_path(other.path(), 1), shard_path(dir.path(), 1)).unwrap();
    let ds = Dataset::open(dir.path()).unwrap();
    let err = ds.sample(6).unwrap_err();
    assert!(matches!(err, Error::ForeignShard { .. }), "{err}");
    assert!(err.to_string().contains("01010101"), "{err}");
    assert!(ds.sample(0).is_ok());
}

#[test]
fn a_stale_manifest_and_a_stale_key_run_are_reported() {
    let (dir, _) = dataset(Codec::None);
    let old_manifest = std::fs::read(dir.path().join("manifest.json")).unwrap();
    let old_run = std::fs::read(dir.path().join("keys-000001-000001.bin")).unwrap();
    let mut w = DatasetWriter::open(
        dir.path(),
        capture_schema(HIDDEN as u64),
        WriteOptions {
            shard_samples: 4,
            ..small_options()
        },
    )
    .unwrap();
    for i in 8..12 {
        w.append(
            &format!("req-{i}"),
            &as_fields(&capture_sample(i, 3, HIDDEN)),
        )
        .unwrap();
    }
    w.finish().unwrap();
    assert!(problems(dir.path()).is_empty());
    // An old manifest copied over the new one: the new shard is not listed. The committed
    // data (what the manifest lists) is intact; the shard is what a writer interrupted before
    // its commit leaves, and is reported as such.
    let new_manifest = std::fs::read(dir.path().join("manifest.json")).unwrap();
    std::fs::write(dir.path().join("manifest.json"), &old_manifest).unwrap();
    let r = verify(dir.path(), VerifyOptions::default(), &|_| {}).unwrap();
    assert!(r.is_ok(), "{:?}", r.problems);
    let names: Vec<String> = (r.leftovers.iter())
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for new in [
        "shard-000002.hsp",
        "segment-000002-000002.json",
        "keys-000002-000002.bin",
        "samples-000002-000002.parquet",
    ] {
        assert!(names.iter().any(|n| n == new), "{new} not in {names:?}");
    }
    // A key run of an earlier dataset beside the new manifest (a run of another segment,
    // whose ordinals lie elsewhere).
    std::fs::write(dir.path().join("manifest.json"), &new_manifest).unwrap();
    let run = dir.path().join("keys-000002-000002.bin");
    std::fs::write(&run, &old_run).unwrap();
    let p = problems(dir.path());
    assert!(matches!(&p[..], [Error::KeyRun { .. }]), "{p:?}");
    assert!(p[0].to_string().contains("keys-000002-000002.bin"), "{p:?}");
}

/// A key run whose entries decode and whose hashes match their records, but which sends a
/// key to another sample than the shards hold it in (two ordinals swapped, the records
/// hashed again): reported naming the entry, both key hashes and samples, in words.
#[test]
fn a_key_run_that_sends_a_key_to_another_sample_is_reported() {
    let (dir, _) = dataset(Codec::None);
    let d = dir.path();
    let hash = |b: &[u8]| blake3::hash(b).to_hex().to_string();
    let manifest_path = d.join("manifest.json");
    let mut m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&manifest_path).unwrap()).unwrap();
    let seg_file = m["segments"][0]["file"].as_str().unwrap().to_string();
    let mut seg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join(&seg_file)).unwrap()).unwrap();
    let run_file = seg["keys"]["file"].as_str().unwrap().to_string();
    let mut run = std::fs::read(d.join(&run_file)).unwrap();
    let (first, second) = (run[8..16].to_vec(), run[24..32].to_vec());
    run[8..16].copy_from_slice(&second);
    run[24..32].copy_from_slice(&first);
    std::fs::write(d.join(&run_file), &run).unwrap();
    seg["keys"]["blake3"] = hash(&run).into();
    let seg_bytes = serde_json::to_vec(&seg).unwrap();
    std::fs::write(d.join(&seg_file), &seg_bytes).unwrap();
    m["segments"][0]["bytes"] = seg_bytes.len().into();
    m["segments"][0]["blake3"] = hash(&seg_bytes).into();
    std::fs::write(&manifest_path, serde_json::to_vec(&m).unwrap()).unwrap();
    let p = problems(d);
    assert!(matches!(&p[..], [Error::KeyRun { .. }]), "{p:?}");
    let said = p[0].to_string();
    let ordinal = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap());
    let entry = format!(
        "entry 0 holds key hash {:016x} at sample {}, where the shards' key tables give key hash {:016x} at sample {}",
        ordinal(&run[0..8]),
        ordinal(&second),
        ordinal(&run[0..8]),
        ordinal(&first)
    );
    assert!(said.contains(&entry), "{said}\nwanted: {entry}");
    assert!(said.contains("hspack reindex"), "{said}");
}

#[test]
fn damaged_chunk_headers_shard_headers_and_padding_are_reported() {
    let (dir, _) = dataset(Codec::None);
    let path = shard_path(dir.path(), 0);
    let e = chunk_entry(dir.path(), 0, 1);
    flip(&path, e.offset + 40);
    let ds = Dataset::open(dir.path()).unwrap();
    assert!(matches!(
        ds.sample(0).unwrap().read("loss_mask", None),
        Err(Error::BadChunk { .. })
    ));
    let p = problems(dir.path());
    assert!(matches!(&p[..], [Error::BadChunk { .. }]), "{p:?}");

    let (dir, _) = dataset(Codec::None);
    let path = shard_path(dir.path(), 0);
    let e = chunk_entry(dir.path(), 0, 1);
    flip(&path, e.offset - 5);
    let p = problems(dir.path());
    assert!(matches!(&p[..], [Error::DirtyPadding { .. }]), "{p:?}");

    let (dir, _) = dataset(Codec::None);
    flip(&shard_path(dir.path(), 0), 20);
    let ds = Dataset::open(dir.path()).unwrap();
    assert!(matches!(ds.sample(0), Err(Error::Format { .. })));
}

#[test]
fn quick_verify_reads_no_payloads_but_checks_indexes() {
    let (dir, _) = dataset(Codec::None);
    let e = chunk_entry(dir.path(), 0, 2);
    flip(&shard_path(dir.path(), 0), e.offset + 128);
    let quick = verify(dir.path(), VerifyOptions { quick: true }, &|_| {}).unwrap();
    assert!(quick.is_ok() && quick.bytes_hashed == 0);
    assert_eq!(problems(dir.path()).len(), 1);
    let len = std::fs::metadata(shard_path(dir.path(), 1)).unwrap().len();
    flip(&shard_path(dir.path(), 1), len - 200);
    assert_eq!(
        verify(dir.path(), VerifyOptions { quick: true }, &|_| {})
            .unwrap()
            .problems
            .len(),
        1
    );
}

#[test]
fn check_policy_never_trusts_bytes_and_always_rechecks() {
    use hspack::{CheckPolicy, ReadOptions};
    let (dir, samples) = dataset(Codec::None);
    let e = chunk_entry(dir.path(), 0, 2);
    let ds = Dataset::open_with(
        dir.path(),
        ReadOptions {
            check: CheckPolicy::Always,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(
        ds.sample(0)
            .unwrap()
            .read("hidden.2", None)
            .unwrap()
            .bytes(),
        samples[0][2].1.as_slice()
    );
    flip(&shard_path(dir.path(), 0), e.offset + 128);
    // Always: the flip after the first read is still caught on the mapping.
    assert!(ds.sample(0).unwrap().read("hidden.2", None).is_err());
    let never = Dataset::open_with(
        dir.path(),
        ReadOptions {
            check: CheckPolicy::Never,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(never.sample(0).unwrap().read("hidden.2", None).is_ok());
}

/// The dataset at `dir`, each chunk checked once by all readers sharing memo folder `memo`.
fn open_with_memo(dir: &Path, memo: &Path) -> Dataset {
    let options = hspack::ReadOptions {
        check: hspack::CheckPolicy::Once,
        checked_memo: Some(memo.to_path_buf()),
        ..hspack::ReadOptions::default()
    };
    Dataset::open_with(dir, options).unwrap()
}

/// A memo folder shared by the readers of a dataset and of a copy of it (`cp -r`: the same
/// dataset id and index hashes, other files) vouches for no chunk of the copy: the copy,
/// damaged since, is found damaged.
#[test]
fn a_shared_memo_vouches_for_no_chunk_of_a_copy() {
    let (dir, _) = dataset(Codec::None);
    let memo = tempfile::tempdir().unwrap();
    let open = |at: &Path| open_with_memo(at, memo.path());
    let original = open(dir.path());
    for i in 0..original.len() {
        original.sample(i).unwrap().read("hidden.2", None).unwrap();
    }
    let copy = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(dir.path()).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), copy.path().join(e.file_name())).unwrap();
    }
    let e0 = chunk_entry(copy.path(), 0, 2);
    flip(&shard_path(copy.path(), 0), e0.offset + 128);
    let err = open(copy.path())
        .sample(0)
        .unwrap()
        .read("hidden.2", None)
        .unwrap_err();
    assert!(matches!(err, Error::ChecksumMismatch { .. }), "{err}");
    assert!(original.sample(0).unwrap().read("hidden.2", None).is_ok());
}

/// A shard changed since a reader that has exited checked it (in place here; a copy put at
/// its path after it was deleted may get its inode number at once, on ext4): the memo named
/// the file by device and inode only, and vouched for the changed bytes. Its status change
/// time names it too now: the next reader hashes the chunk and finds the damage.
#[test]
fn a_shared_memo_vouches_for_no_chunk_of_a_file_changed_since() {
    let (dir, _) = dataset(Codec::None);
    let memo = tempfile::tempdir().unwrap();
    let open = || open_with_memo(dir.path(), memo.path());
    let first = open();
    first.sample(0).unwrap().read("hidden.2", None).unwrap();
    drop(first);
    std::thread::sleep(std::time::Duration::from_millis(20));
    let e0 = chunk_entry(dir.path(), 0, 2);
    flip(&shard_path(dir.path(), 0), e0.offset + 128);
    let err = open()
        .sample(0)
        .unwrap()
        .read("hidden.2", None)
        .unwrap_err();
    assert!(matches!(err, Error::ChecksumMismatch { .. }), "{err}");
}

#[test]
fn a_shared_memo_spares_other_readers_the_hash_and_only_holds_checked_chunks() {
    use hspack::{CheckPolicy, ReadOptions};
    let (dir, _) = dataset(Codec::None);
    let memo = tempfile::tempdir().unwrap();
    let with_memo = || open_with_memo(dir.path(), memo.path());
    let e0 = chunk_entry(dir.path(), 0, 2);
    let e1 = {
        let ds = Dataset::open(dir.path()).unwrap();
        let f = ds.field_index("hidden.2").unwrap();
        let c = ds.sample(1).unwrap().extents(f)[0].chunk;
        chunk_entry(dir.path(), 0, c.into())
    };
    // A damaged chunk is never recorded as checked: every reader still fails on it.
    flip(&shard_path(dir.path(), 0), e1.offset + 128);
    let first = with_memo();
    assert!(first.sample(1).unwrap().read("hidden.2", None).is_err());
    assert!(with_memo()
        .sample(1)
        .unwrap()
        .read("hidden.2", None)
        .is_err());
    // A chunk one reader checked is recorded where every reader of the same file sharing the
    // memo finds it (the point: DataLoader workers hash each chunk once in all): one memo
    // file, the chunk's flag set, and a second reader adds none.
    first.sample(0).unwrap().read("hidden.2", None).unwrap();
    let memo_files = || {
        let mut files: Vec<_> = std::fs::read_dir(memo.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        files
    };
    let files = memo_files();
    assert_eq!(files.len(), 1, "{files:?}");
    assert_eq!(
        std::fs::read(&files[0]).unwrap()[2],
        1,
        "chunk 2 is checked"
    );
    with_memo()
        .sample(0)
        .unwrap()
        .read("hidden.2", None)
        .unwrap();
    assert_eq!(memo_files(), files);
    // Changed since (damaged in place): the memo names the file as it was, and vouches for
    // none of its chunks.
    std::thread::sleep(std::time::Duration::from_millis(20));
    flip(&shard_path(dir.path(), 0), e0.offset + 128);
    assert!(with_memo()
        .sample(0)
        .unwrap()
        .read("hidden.2", None)
        .is_err());
    // A dataset written again at the same path, with the same shapes (and the same damage)
    // under another id: the memo vouches for none of its chunks.
    let before = std::fs::read_dir(memo.path()).unwrap().count();
    let (again, _) = dataset_with_id(Codec::None, [7; 16]);
    std::fs::remove_dir_all(dir.path()).unwrap();
    std::fs::rename(again.path(), dir.path()).unwrap();
    flip(&shard_path(dir.path(), 0), e0.offset + 128);
    assert!(with_memo()
        .sample(0)
        .unwrap()
        .read("hidden.2", None)
        .is_err());
    assert!(std::fs::read_dir(memo.path()).unwrap().count() > before);
    // A memo file of another shape is refused, naming the file (the one of this dataset's
    // shard: the memo holds files of the one written before it at this path too).
    let memo_file = std::fs::read_dir(memo.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .find(|n| n.starts_with(&format!("{}-shard-000000", "07".repeat(16))))
        .unwrap();
    let other = tempfile::tempdir().unwrap();
    std::fs::write(other.path().join(&memo_file), [0u8; 3]).unwrap();
    let options = ReadOptions {
        check: CheckPolicy::Once,
        checked_memo: Some(other.path().to_path_buf()),
        ..ReadOptions::default()
    };
    let ds = Dataset::open_with(dir.path(), options).unwrap();
    let e = ds.sample(0).unwrap_err().to_string();
    assert!(
        e.contains(&memo_file) && e.contains("own memo folder"),
        "{e}"
    );
}

#[test]
fn every_user_error_names_what_to_fix() {
    let (dir, _) = dataset(Codec::None);
    let ds = Dataset::open(dir.path()).unwrap();
    assert!(matches!(
        ds.sample(8),
        Err(Error::NoSuchSample { ordinal: 8, len: 8 })
    ));
    assert!(matches!(ds.get_by_key("x"), Err(Error::NoSuchKey { .. })));
    let s = ds.sample(0).unwrap();
    let e = s.read("hidden.3", None).unwrap_err();
    assert!(matches!(&e, Error::NoSuchField { available, .. } if available.contains("hidden.30")));
    assert!(matches!(
        s.read("hidden.2", Some(2..99)),
        Err(Error::RowsOutOfRange { rows: 6, .. })
    ));
    let empty = tempfile::tempdir().unwrap();
    assert!(matches!(
        Dataset::open(empty.path()),
        Err(Error::NotADataset { .. })
    ));
    assert!(matches!(
        DatasetWriter::create(dir.path(), capture_schema(HIDDEN as u64), small_options()),
        Err(Error::AlreadyExists { .. })
    ));
    assert!(matches!(
        DatasetWriter::open(dir.path(), capture_schema(32), small_options()),
        Err(Error::SchemaMismatch { .. })
    ));
    assert!(matches!(
        DatasetWriter::open(
            empty.path(),
            capture_schema(8),
            WriteOptions {
                chunk_bytes: Some(0),
                ..small_options()
            }
        ),
        Err(Error::BadOption {
            option: "chunk_bytes",
            ..
        })
    ));
    let _w =
        DatasetWriter::open(dir.path(), capture_schema(HIDDEN as u64), small_options()).unwrap();
    // A live writer in this process holds the lock; one from a live process refuses.
    std::fs::write(dir.path().join(".hspack-writer.lock"), "1").unwrap();
    assert!(matches!(
        DatasetWriter::open(dir.path(), capture_schema(HIDDEN as u64), small_options()),
        Err(Error::Locked { .. })
    ));
    let missing = dir.path().join("nope");
    std::fs::write(&missing, "").unwrap();
    assert!(matches!(
        Dataset::open(missing.join("x")),
        Err(Error::NotADataset { why, .. }) if why.contains("there is nothing there")
    ));
}

/// A dataset of many shards looks keys up through its key directory: every key is found,
/// with the right sample; a shard damaged before the directory is built does not hide the
/// others' keys, and its own keys, and keys in no shard, get its error (the key may be there).
#[test]
fn lookups_by_key_over_many_shards_survive_a_damaged_shard() {
    let dir = tempfile::tempdir().unwrap();
    let options = WriteOptions {
        shard_samples: 2,
        ..small_options()
    };
    let mut w =
        DatasetWriter::create(dir.path(), capture_schema(HIDDEN as u64), options.clone()).unwrap();
    for i in 0..30u64 {
        w.append(&format!("k{i}"), &as_fields(&capture_sample(i, 3, HIDDEN)))
            .unwrap();
    }
    w.finish().unwrap();
    let ds = Dataset::open(dir.path()).unwrap();
    assert_eq!(ds.manifest().shards.len(), 15);
    for i in (0..30u64).rev() {
        let s = ds.get_by_key(&format!("k{i}")).unwrap();
        assert_eq!((s.ordinal(), s.key()), (i, format!("k{i}").as_str()));
        let ids = s.read("input_ids", None).unwrap();
        assert_eq!(ids.bytes(), &capture_sample(i, 3, HIDDEN)[0].1[..]);
    }
    assert!(matches!(
        ds.get_by_key("nope"),
        Err(Error::NoSuchKey { .. })
    ));

    // Shard 3 (k6, k7): a byte of its index flipped.
    let path = shard_path(dir.path(), 3);
    let len = std::fs::metadata(&path).unwrap().len();
    flip(&path, len - Footer::SIZE as u64 - 20);
    let ds = Dataset::open(dir.path()).unwrap();
    for i in [0u64, 5, 8, 29] {
        assert_eq!(ds.get_by_key(&format!("k{i}")).unwrap().ordinal(), i);
    }
    for key in ["k6", "k7"] {
        let err = ds.get_by_key(key).unwrap_err();
        assert!(
            !matches!(err, Error::NoSuchKey { .. }) && err.to_string().contains("shard-000003"),
            "{key}: {err}"
        );
    }
    // The key runs, covered by the manifest, say that no shard holds "nope".
    assert!(matches!(
        ds.get_by_key("nope"),
        Err(Error::NoSuchKey { .. })
    ));

    // A damaged key run is not trusted: its segment's shards are searched instead.
    let dir = tempfile::tempdir().unwrap();
    let mut w = DatasetWriter::create(dir.path(), capture_schema(HIDDEN as u64), options).unwrap();
    for i in 0..30u64 {
        w.append(&format!("k{i}"), &as_fields(&capture_sample(i, 3, HIDDEN)))
            .unwrap();
    }
    w.finish().unwrap();
    let ds = Dataset::open(dir.path()).unwrap();
    let runs: Vec<String> = (ds.manifest().segment_files.iter())
        .map(|f| f.keys.as_ref().unwrap().file.clone())
        .collect();
    assert!(
        runs.len() > 1 && runs[0] == "keys-000000-000007.bin",
        "{runs:?}"
    );
    let run = dir.path().join(&runs[0]);
    let mut bytes = std::fs::read(&run).unwrap();
    bytes.swap(0, 16 * 5); // two hashes exchanged: every lookup of them would miss
    bytes[3] ^= 0x40;
    std::fs::write(&run, bytes).unwrap();
    let ds = Dataset::open(dir.path()).unwrap();
    for i in 0..30u64 {
        assert_eq!(ds.get_by_key(&format!("k{i}")).unwrap().ordinal(), i);
    }
    assert!(matches!(
        ds.get_by_key("nope"),
        Err(Error::NoSuchKey { .. })
    ));
}

/// A manifest (version 3) whose shards claim 2^40 samples each: a lookup by key is an error
/// naming a shard, never an allocation sized by the claim (which aborts the process).
#[test]
fn a_manifest_claiming_huge_shards_fails_a_lookup_cleanly() {
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("format-spec/golden/v3/leased");
    let mut m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(golden.join("manifest.json")).unwrap()).unwrap();
    let template = m["shards"][0].clone();
    let claim = 1u64 << 40;
    let shards: Vec<serde_json::Value> = (0..9u64)
        .map(|seq| {
            let mut s = template.clone();
            s["file"] = format!("shard-{seq:06}.hsp").into();
            s["seq"] = seq.into();
            s["first_ordinal"] = (seq * claim).into();
            s["samples"] = claim.into();
            s
        })
        .collect();
    m["shards"] = shards.into();
    m["samples"] = (9 * claim).into();
    m["samples_table"] = serde_json::Value::Null;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("manifest.json"),
        serde_json::to_vec(&m).unwrap(),
    )
    .unwrap();
    let ds = match Dataset::open(dir.path()) {
        Ok(ds) => ds,
        // Refusing the claim when the manifest is read is as good.
        Err(e) => return assert!(e.to_string().contains("manifest.json"), "{e}"),
    };
    let err = ds.find("req-0").unwrap_err().to_string();
    assert!(err.contains("shard-000000.hsp"), "{err}");
}

/// A dataset written anew under an open reader (removed, then written again at its path): a
/// shard the reader had not opened yet was said to be a foreign file copied in, with advice
/// (copy the right shard from the source) that could fix nothing.
#[test]
fn a_dataset_written_anew_under_a_reader_is_said_so() {
    let (dir, _) = dataset(Codec::None);
    let ds = Dataset::open(dir.path()).unwrap();
    ds.sample(0).unwrap();
    std::fs::remove_dir_all(dir.path()).unwrap();
    let (again, _) = dataset_with_id(Codec::None, [7; 16]);
    std::fs::rename(again.path(), dir.path()).unwrap();
    let e = ds.sample(ds.len() - 1).unwrap_err();
    assert!(matches!(e, Error::DatasetRewritten { .. }), "{e:?}");
    assert!(
        e.to_string()
            .contains("the dataset was written anew since this reader opened it"),
        "{e}"
    );
}

/// A dataset removed under a reader (a folder deleted; a store's `rm` then `gc`): its next
/// shard was "missing, but the manifest lists it; restore it ... with `hspack repair`".
#[test]
fn a_dataset_removed_under_a_reader_is_said_so() {
    let (dir, _) = dataset(Codec::None);
    let ds = Dataset::open(dir.path()).unwrap();
    ds.sample(0).unwrap();
    remove_every_file(dir.path());
    let e = ds.sample(ds.len() - 1).unwrap_err();
    assert!(matches!(e, Error::DatasetRemoved { .. }), "{e:?}");
    assert!(
        e.to_string()
            .contains("the dataset was removed since this reader opened it")
            && !e.to_string().contains("repair"),
        "{e}"
    );
}

/// A verification of a dataset removed, or written anew under its name, after it was opened:
/// every file it lists was reported missing or other as damage, with advice to repair. It is
/// one error saying what happened, and no damage.
#[test]
fn a_dataset_removed_or_rewritten_under_verify_is_said_so_and_is_no_damage() {
    let (dir, _) = dataset(Codec::None);
    let ds = Dataset::open(dir.path()).unwrap();
    // Removed once the verification has begun hashing.
    let removed = std::sync::Once::new();
    let remove = |_| {
        removed.call_once(|| {
            remove_every_file(dir.path());
        })
    };
    let said = |report: &hspack::verify::Report| -> Vec<String> {
        report.problems.iter().map(|e| format!("{e:?}")).collect()
    };
    let report = verify_dataset(&ds, VerifyOptions::default(), &remove).unwrap();
    assert_eq!(report.problems.len(), 1, "{:?}", said(&report));
    assert!(
        matches!(report.problems[0], Error::DatasetRemoved { .. }),
        "{:?}",
        said(&report)
    );
    // Another dataset written there since.
    let (dir, _) = dataset(Codec::None);
    let ds = Dataset::open(dir.path()).unwrap();
    let rewritten = std::sync::Once::new();
    let rewrite = |_| {
        rewritten.call_once(|| {
            remove_every_file(dir.path());
            let mut w = DatasetWriter::create(
                dir.path(),
                capture_schema(HIDDEN as u64),
                WriteOptions::default(),
            )
            .unwrap();
            w.append("other", &as_fields(&capture_sample(3, 5, HIDDEN)))
                .unwrap();
            w.finish().unwrap();
        })
    };
    let report = verify_dataset(&ds, VerifyOptions::default(), &rewrite).unwrap();
    assert_eq!(report.problems.len(), 1, "{:?}", said(&report));
    assert!(
        matches!(report.problems[0], Error::DatasetRewritten { .. }),
        "{:?}",
        said(&report)
    );
    assert!(!report.problems[0].is_damage());
}

/// Removes the files of folder `dir`, as a user removing a dataset does.
fn remove_every_file(dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }
}
