//! Crafted files that pass every checksum (re-sealed after the edit, as an attacker or a buggy
//! writer would leave them) are refused with an error naming what is wrong: never a panic (the
//! tests run with overflow checks), never an abort, never taken for intact.

mod common;

use std::path::{Path, PathBuf};

use hspack::format::layout::{ExtentEntry, IndexHeader, KeyEntry, SampleEntry};
use hspack::format::manifest::{hex, ShardRecord, TableRecord};
use hspack::format::segment::{KeyRunRecord, Segment, SegmentRef, SEGMENT_FORMAT, SEGMENT_VERSION};
use hspack::format::{ChunkEntry, DType, Field, Footer, Index, IndexBuilder, Manifest, Role};
use hspack::format::{FormatError, Schema};
use hspack::verify::{verify, VerifyOptions};
use hspack::{Dataset, DatasetWriter, Error, WriteOptions};

fn golden(set: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("format-spec/golden")
        .join(set)
}

/// A copy of golden dataset `set` (a folder of plain files) in a temp folder.
fn copy_of(set: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    common::copy_dir(&golden(set), dir.path());
    dir
}

fn footer_of(shard: &[u8]) -> Footer {
    bytemuck::pod_read_unaligned(&shard[shard.len() - Footer::SIZE..])
}

fn problems(dir: &Path) -> Vec<Error> {
    verify(dir, VerifyOptions::default(), &|_| {})
        .unwrap()
        .problems
}

/// Where the tables of an index start: (chunks, keys), in bytes from its start.
fn tables(index: &[u8]) -> (usize, usize) {
    let h: IndexHeader = bytemuck::pod_read_unaligned(&index[..IndexHeader::SIZE]);
    let chunks = IndexHeader::SIZE
        + h.sample_count as usize * SampleEntry::SIZE
        + h.extent_count as usize * ExtentEntry::SIZE;
    (chunks, chunks + h.chunk_count as usize * ChunkEntry::SIZE)
}

/// Edits the index of shard `seq` of the version-1 dataset in `dir` in place (`edit` gets
/// the index bytes and keeps their length), then re-seals it: the index hash in the footer
/// and the manifest, the footer's check word.
fn edit_v1_index(dir: &Path, seq: usize, edit: impl FnOnce(&mut [u8])) {
    let mut m = Manifest::decode(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    let path = dir.join(&m.shards[seq].file);
    let mut shard = std::fs::read(&path).unwrap();
    let mut footer = footer_of(&shard);
    let index = footer.index_offset as usize..(footer.index_offset + footer.index_len) as usize;
    edit(&mut shard[index.clone()]);
    footer.index_hash = *blake3::hash(&shard[index]).as_bytes();
    let at = shard.len() - Footer::SIZE;
    shard[at..].copy_from_slice(bytemuck::bytes_of(&footer.seal()));
    std::fs::write(&path, &shard).unwrap();
    m.shards[seq].index_blake3 = hex(&footer.index_hash);
    std::fs::write(dir.join("manifest.json"), m.encode()).unwrap();
}

/// The manifest of `dir` as JSON, edited by `edit`, written back (nothing covers a version 1
/// manifest's bytes but the digest a reader computes).
fn edit_manifest_json(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("manifest.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut m);
    std::fs::write(&path, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
}

fn record(seq: u32, first_ordinal: u64, samples: u64) -> ShardRecord {
    ShardRecord {
        file: format!("shard-{seq:06}.hsp"),
        seq,
        bytes: 4096,
        index_blake3: hex(&[1; 32]),
        first_ordinal,
        samples,
        chunks: 1,
        raw_bytes: 12,
    }
}

/// Bug: `Segment::reference` summed the shards' samples unchecked, and `Segment::decode`
/// called it before its own checks: "attempt to add with overflow".
#[test]
fn a_segment_whose_shards_samples_pass_2_pow_64_is_refused() {
    let id = hex(&[7; 16]);
    let s = Segment {
        format: SEGMENT_FORMAT.into(),
        version: SEGMENT_VERSION,
        dataset_id: id.clone(),
        level: 0,
        shards: vec![record(0, 0, u64::MAX), record(1, u64::MAX, 1)],
        keys: KeyRunRecord {
            file: "keys-000000-000001.bin".into(),
            bytes: 16,
            blake3: hex(&[2; 32]),
            entries: 1,
        },
        tables: vec![TableRecord {
            file: "samples-000000-000001.parquet".into(),
            bytes: 100,
            blake3: hex(&[3; 32]),
            samples: 1,
        }],
    };
    let bytes = s.encode();
    // What a manifest would say of these bytes, each claim of the total tried.
    for samples in [0, 1, u64::MAX] {
        let at = SegmentRef {
            file: "segment-000000-000001.json".into(),
            bytes: bytes.len() as u64,
            blake3: hex(blake3::hash(&bytes).as_bytes()),
            level: 0,
            first_seq: 0,
            shards: 2,
            first_ordinal: 0,
            samples,
        };
        let err = Segment::decode(&bytes, &at, &id).unwrap_err();
        assert!(
            matches!(
                err,
                FormatError::Invalid {
                    what: "shard samples",
                    value: u64::MAX,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("2^64"), "{err}");
    }
    // The entry of such a segment, asked for anyway, saturates.
    assert_eq!(s.reference("s.json", &bytes).samples, u64::MAX);
}

/// Bug: the message of a misplaced chunk added the index's first row and row count
/// unchecked (`Shard::site`), and nothing checks a chunk entry's own first row.
#[test]
fn a_chunk_entry_whose_rows_pass_2_pow_64_is_named_not_a_panic() {
    let dir = copy_of("v1/none");
    edit_v1_index(dir.path(), 0, |index| {
        let (chunks, _) = tables(index);
        let row_start = chunks + 40; // chunk 0's row_start
        index[row_start..row_start + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    });
    let ds = Dataset::open(dir.path()).unwrap();
    let e = ds.shard(0).unwrap().index().chunk(0).unwrap();
    let f = &ds.schema().fields[e.field as usize].name;
    let err = ds.sample(e.sample).unwrap().read(f, None).unwrap_err();
    assert!(
        matches!(
            &err,
            Error::ChunkMisplaced {
                what: "first row",
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains(&format!("rows {}..{}", u64::MAX, u64::MAX)),
        "{err}"
    );
    let found = problems(dir.path());
    assert!(
        found.iter().any(|e| matches!(
            e,
            Error::ChunkMisplaced {
                what: "first row",
                ..
            }
        )),
        "{found:?}"
    );
}

/// Bug: `read_quantized` sized its buffers from the rows an index declares,
/// `Vec::with_capacity(rows × row elements)`: a crafted index whose extents reuse one chunk
/// declares terabytes with a few MiB, and the allocation aborted the process.
#[test]
fn a_quantized_read_of_terabytes_an_index_declares_is_an_error_naming_the_sample() {
    // Under `vm.overcommit_memory = 1` any allocation is granted and the read would go on
    // through terabytes: nothing a process can refuse.
    if std::fs::read_to_string("/proc/sys/vm/overcommit_memory").is_ok_and(|m| m.trim() == "1") {
        // CI runs it: a machine that grants every allocation cannot, and must say so.
        assert!(
            std::env::var_os("CI").is_none(),
            "vm.overcommit_memory = 1 grants any allocation: this test cannot run in CI here"
        );
        eprintln!("skipped: vm.overcommit_memory = 1 grants any allocation");
        return;
    }
    const ELEMS: u64 = 1 << 23; // a row: 8 MiB of codes
    const COPIES: u64 = 1 << 18; // 8 MiB of extents: 2^41 bytes of codes declared
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    let schema = Schema::new(vec![
        Field::new("h", DType::BF16, &[ELEMS], Role::Other).quantize_fp8(None)
    ]);
    let one = half::bf16::from_f32(1.5).to_le_bytes();
    let row: Vec<u8> = one
        .iter()
        .copied()
        .cycle()
        .take(2 * ELEMS as usize)
        .collect();
    let options = WriteOptions {
        durable: false,
        ..WriteOptions::default()
    };
    let mut w = DatasetWriter::create(dir, schema, options).unwrap();
    w.append("big", &[("h", &row[..])]).unwrap();
    w.finish().unwrap();
    drop(row);

    // The sample again, its extents repeated COPIES times: every check but memory passes.
    let mut m = Manifest::decode(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    let seg_file = m.segments[0].file.clone();
    let mut seg: Segment =
        serde_json::from_slice(&std::fs::read(dir.join(&seg_file)).unwrap()).unwrap();
    let path = dir.join(&seg.shards[0].file);
    let shard = std::fs::read(&path).unwrap();
    let mut footer = footer_of(&shard);
    let start = footer.index_offset as usize;
    let old = Index::parse(&shard[start..start + footer.index_len as usize]).unwrap();
    let s = old.sample(0).unwrap();
    let extents: Vec<ExtentEntry> = old.extents_of(&s).collect();
    let mut b = IndexBuilder::new(0);
    for c in 0..old.chunk_count() {
        b.push_chunk(old.chunk(c).unwrap());
    }
    let repeated: Vec<ExtentEntry> = (0..COPIES)
        .flat_map(|k| {
            extents.iter().map(move |x| ExtentEntry {
                row_start: x.row_start + k * s.rows,
                ..*x
            })
        })
        .collect();
    let raw = COPIES * s.raw_bytes;
    b.push_sample(
        old.key_of(&s).unwrap(),
        COPIES * s.rows,
        s.loss_rows,
        raw,
        &repeated,
    );
    let index = b.encode();
    let mut crafted = shard[..start].to_vec();
    crafted.extend_from_slice(&index);
    footer.index_len = index.len() as u64;
    footer.index_hash = *blake3::hash(&index).as_bytes();
    footer.file_len = (crafted.len() + Footer::SIZE) as u64;
    crafted.extend_from_slice(bytemuck::bytes_of(&footer.seal()));
    std::fs::write(&path, &crafted).unwrap();
    let r = &mut seg.shards[0];
    (r.bytes, r.index_blake3, r.raw_bytes) = (crafted.len() as u64, hex(&footer.index_hash), raw);
    let seg_bytes = seg.encode();
    std::fs::write(dir.join(&seg_file), &seg_bytes).unwrap();
    m.segments[0] = seg.reference(&seg_file, &seg_bytes);
    std::fs::write(dir.join("manifest.json"), m.encode()).unwrap();

    let ds = Dataset::open(dir).unwrap();
    let sample = ds.sample(0).unwrap();
    assert_eq!(sample.rows(), COPIES);
    let err = sample.read_quantized(0, None).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(&err, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::OutOfMemory),
        "{text}"
    );
    assert!(
        text.contains("sample `big` (ordinal 0)") && text.contains("more memory"),
        "{text}"
    );
    // A few rows of it read as they should.
    let few = sample.read_quantized(0, Some(3..5)).unwrap();
    assert_eq!(few.codes.len() as u64, 2 * ELEMS);
}

/// Bug: opening a shard compared its samples, chunks and first ordinal with the manifest's
/// record but not `raw_bytes`, which in manifest versions 1 to 3 nothing else covers.
#[test]
fn a_manifest_recording_wrong_raw_bytes_is_refused_by_reads_and_verify() {
    let dir = copy_of("v1/none");
    let recorded = Manifest::decode(&std::fs::read(dir.path().join("manifest.json")).unwrap())
        .unwrap()
        .shards[1]
        .raw_bytes;
    assert!(problems(dir.path()).is_empty());
    edit_manifest_json(dir.path(), |m| {
        m["shards"][1]["raw_bytes"] = (recorded + 1).into();
    });
    let ds = Dataset::open(dir.path()).unwrap();
    let err = ds.sample(ds.len() - 1).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(&err, Error::ShardMismatch { expected, found, .. }
            if *expected == (recorded + 1).to_string() && *found == recorded.to_string()),
        "{text}"
    );
    assert!(
        text.contains("shard-000001.hsp") && text.contains("raw_bytes"),
        "{text}"
    );
    let found = problems(dir.path());
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].to_string(), text);
}

/// Bug: the shard check compared the manifest's hex as text with lowercase `hex()`, so an
/// intact shard named by uppercase hex (which `unhex` takes, and FORMAT.md's "hex" allows)
/// was "damaged".
#[test]
fn an_index_hash_in_uppercase_hex_names_the_same_bytes() {
    let dir = copy_of("v1/none");
    edit_manifest_json(dir.path(), |m| {
        for s in m["shards"].as_array_mut().unwrap() {
            let up = s["index_blake3"].as_str().unwrap().to_ascii_uppercase();
            s["index_blake3"] = up.into();
        }
    });
    let found = problems(dir.path());
    assert!(found.is_empty(), "{found:?}");
    let ds = Dataset::open(dir.path()).unwrap();
    for i in 0..ds.len() {
        let s = ds.sample(i).unwrap();
        for f in &ds.schema().fields {
            s.read(&f.name, None).unwrap();
        }
    }
}

/// Bug: `unhex` took a sign (`u8::from_str_radix("+9", 16)` is `Ok(9)`), so a manifest with
/// `+` in a hash passed its check.
#[test]
fn a_sign_in_an_index_hash_is_refused_with_the_manifest() {
    // Even where `+X` would parse to the right byte `0X`.
    let dir = copy_of("v1/none");
    let m = Manifest::decode(&std::fs::read(dir.path().join("manifest.json")).unwrap()).unwrap();
    let (seq, at) = (m.shards.iter().enumerate())
        .find_map(|(seq, s)| {
            let at = (0..64)
                .step_by(2)
                .find(|&i| &s.index_blake3[i..i + 1] == "0")?;
            Some((seq, at))
        })
        .expect("a byte below 0x10 in some index hash");
    edit_manifest_json(dir.path(), |m| {
        let h = m["shards"][seq]["index_blake3"].as_str().unwrap();
        let signed = format!("{}+{}", &h[..at], &h[at + 1..]);
        m["shards"][seq]["index_blake3"] = signed.into();
    });
    let err = Dataset::open(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("manifest.json") && err.contains("index_blake3"),
        "{err}"
    );
}

/// Bug: a missing shard was a bare OS error ("cannot map …: No such file or directory").
#[test]
fn a_missing_shard_is_named_with_its_samples_and_the_repair() {
    let dir = copy_of("v1/none");
    std::fs::remove_file(dir.path().join("shard-000001.hsp")).unwrap();
    let ds = Dataset::open(dir.path()).unwrap();
    let err = ds.sample(6).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(&err, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound),
        "{text}"
    );
    assert!(err.is_damage(), "{text}");
    for part in [
        "shard-000001.hsp",
        "missing",
        "shard 1",
        "ordinals 5 to 8",
        "hspack repair DATASET --from COPY",
    ] {
        assert!(text.contains(part), "{part:?} not in {text}");
    }
    // Verify names it the same way.
    let found = problems(dir.path());
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].to_string(), text);
    // The other shard still reads.
    ds.sample(0).unwrap();
}

/// Bug: a key entry's reserved word was never checked (FORMAT.md §3.5, §8).
#[test]
fn a_key_entry_with_reserved_bytes_set_is_refused() {
    let dir = copy_of("v1/none");
    edit_v1_index(dir.path(), 0, |index| {
        let (_, keys) = tables(index);
        let reserved = keys + KeyEntry::SIZE + 12; // key entry 1's reserved word
        index[reserved] = 1;
    });
    let ds = Dataset::open(dir.path()).unwrap();
    let err = ds.sample(0).unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Format {
                source: FormatError::ReservedNotZero { offset: 12, .. },
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("shard-000000.hsp"), "{err}");
    assert_eq!(problems(dir.path()).len(), 1);
}

/// An index whose sample claims more loss-mask rows than it has rows, or any count where the
/// schema has no loss mask (FORMAT.md §3: `u64::MAX` then), is refused naming the field:
/// `ls`, `show` and `lengths()` would report it as it is.
#[test]
fn a_loss_row_count_the_sample_cannot_have_is_refused() {
    use hspack::format::ShardHeader;
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    let schema = Schema::new(vec![
        Field::new("ids", DType::I32, &[], Role::TokenIds),
        Field::new("mask", DType::U8, &[], Role::LossMask),
    ]);
    let options = WriteOptions {
        durable: false,
        ..WriteOptions::default()
    };
    let mut w = DatasetWriter::create(dir, schema.clone(), options).unwrap();
    w.append("s", &[("ids", &[0u8; 12][..]), ("mask", &[1, 0, 1][..])])
        .unwrap();
    w.finish().unwrap();
    let ds = Dataset::open(dir).unwrap();
    assert_eq!(ds.sample(0).unwrap().loss_rows(), Some(2));
    let shard = std::fs::read(dir.join(&ds.manifest().shards[0].file)).unwrap();
    let footer = footer_of(&shard);
    let start = footer.index_offset as usize;
    let old = Index::parse(&shard[start..start + footer.index_len as usize]).unwrap();
    let s = old.sample(0).unwrap();
    let extents: Vec<ExtentEntry> = old.extents_of(&s).collect();
    let with_loss_rows = |loss_rows: u64| {
        let mut b = IndexBuilder::new(0);
        for c in 0..old.chunk_count() {
            b.push_chunk(old.chunk(c).unwrap());
        }
        b.push_sample(
            old.key_of(&s).unwrap(),
            s.rows,
            loss_rows,
            s.raw_bytes,
            &extents,
        );
        b.encode()
    };
    let data = ShardHeader::SIZE as u64..footer.index_offset;
    let no_mask = Schema::new(vec![
        Field::new("ids", DType::I32, &[], Role::TokenIds),
        Field::new("mask", DType::U8, &[], Role::Other),
    ]);
    for (schema, loss_rows, ok) in [
        (&schema, 2, true),
        (&schema, 3, true),
        (&schema, 4, false),
        (&schema, u64::MAX, false),
        (&no_mask, u64::MAX, true),
        (&no_mask, 0, false),
    ] {
        let bytes = with_loss_rows(loss_rows);
        let checked = Index::parse(&bytes)
            .unwrap()
            .validate(schema, data.clone(), 4096);
        match ok {
            true => checked.unwrap(),
            false => assert!(
                checked
                    .as_ref()
                    .is_err_and(|e| e.to_string().contains("loss_rows")),
                "{loss_rows}: {checked:?}"
            ),
        }
    }
}

/// Shard `seq` of the version-1 dataset in `dir` with its index rebuilt, each sample given
/// as `edit` returns it from its key and loss rows, then re-sealed (the shard's length, the
/// index hash in the footer and the manifest, the footer's check word): bytes a writer that
/// recorded them wrongly would have made.
fn rebuild_v1_index(dir: &Path, seq: usize, edit: impl Fn(u64, &str, u64) -> (String, u64)) {
    let mut m = Manifest::decode(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    let path = dir.join(&m.shards[seq].file);
    let shard = std::fs::read(&path).unwrap();
    let mut footer = footer_of(&shard);
    let at = footer.index_offset as usize;
    let old = Index::parse(&shard[at..at + footer.index_len as usize]).unwrap();
    let mut b = IndexBuilder::new(old.header().first_ordinal);
    for c in 0..old.chunk_count() {
        b.push_chunk(old.chunk(c).unwrap());
    }
    for i in 0..old.sample_count() {
        let s = old.sample(i).unwrap();
        let extents: Vec<ExtentEntry> = old.extents_of(&s).collect();
        let (key, loss_rows) = edit(s.ordinal, old.key_of(&s).unwrap(), s.loss_rows);
        b.push_sample(&key, s.rows, loss_rows, s.raw_bytes, &extents);
    }
    let index = b.encode();
    footer.index_len = index.len() as u64;
    footer.index_hash = *blake3::hash(&index).as_bytes();
    let mut out = shard[..at].to_vec();
    out.extend_from_slice(&index);
    out.extend_from_slice(bytemuck::bytes_of(&footer.seal()));
    std::fs::write(&path, &out).unwrap();
    m.shards[seq].index_blake3 = hex(&footer.index_hash);
    m.shards[seq].bytes = out.len() as u64;
    std::fs::write(dir.join("manifest.json"), m.encode()).unwrap();
}

/// Bug: verify passed a key given to two samples of two shards (a shard's index refuses a
/// repeat within it only) and a sample whose recorded loss rows are not the rows its mask
/// sets (FORMAT.md §3.2): both pass every hash, the writer having recorded them. A read by
/// key found one of the two samples; `ls` and `lengths()` reported the wrong count.
#[test]
fn a_key_given_twice_and_a_loss_count_not_the_masks_are_named_by_verify() {
    let dir = copy_of("v1/none");
    let ds = Dataset::open(dir.path()).unwrap();
    let (first, shard0) = (
        ds.sample(0).unwrap().key().to_string(),
        ds.manifest().shards[0].samples,
    );
    let masked = ds.sample(shard0 + 1).unwrap().loss_rows().unwrap();
    // Within the sample's rows, so the index stays valid: only the mask says it is wrong.
    let wrong = if masked > 0 { masked - 1 } else { 1 };
    assert!(wrong <= ds.sample(shard0 + 1).unwrap().rows());
    drop(ds);
    assert!(problems(dir.path()).is_empty());
    rebuild_v1_index(dir.path(), 1, |ordinal, key, loss_rows| {
        match ordinal - shard0 {
            0 => (first.clone(), loss_rows),
            1 => (key.to_string(), wrong),
            _ => (key.to_string(), loss_rows),
        }
    });
    let found: Vec<String> = problems(dir.path()).iter().map(|e| e.to_string()).collect();
    assert_eq!(found.len(), 2, "{found:#?}");
    let said = found.join("\n");
    for part in [
        format!("shard-000001.hsp: shard index: sample ordinal is {shard0}"),
        format!("key `{first}` is sample 0's too"),
        format!("sample loss_rows is {wrong}, but must be {masked}"),
        format!("the loss mask of sample {}", shard0 + 1),
    ] {
        assert!(said.contains(&part), "{part}: {said}");
    }
    // The quick check reads no mask, and still finds the key.
    let quick = verify(dir.path(), VerifyOptions { quick: true }, &|_| {}).unwrap();
    assert_eq!(quick.problems.len(), 1, "{:?}", quick.problems);
}
