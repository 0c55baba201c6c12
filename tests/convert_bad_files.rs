//! Every file in `tests/bad_files/convert/` (written by `make_bad_files.py` there) is read
//! and must fail with the right error, without panicking and without running anything.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};

use common::pt_fixtures;
use hspack::convert::torch_file::{gzip_limit, GZIP_MIN_LIMIT};
use hspack::convert::{load_torch, open_source, open_source_with, ConvertError, Limits};

const MARKER: &str = "/tmp/hspack-convert-test-pwned";

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bad_files/convert")
}

/// Opens the file and materialises every tensor, returning the first error.
fn read_all(path: &Path) -> Result<usize, ConvertError> {
    let src = open_source(path)?;
    let mut n = 0;
    for t in src.tensors() {
        n += src.tensor(&t.name)?.bytes.len();
    }
    for u in src.unsupported() {
        n += src.tensor(&u.name)?.bytes.len();
    }
    Ok(n)
}

type Check = fn(&ConvertError) -> bool;

fn table() -> Vec<(&'static str, Check)> {
    use ConvertError as E;
    vec![
        (
            "os_system.pt",
            |e| matches!(e, E::RefusedGlobal { module, name, .. } if module == "os" && name == "system"),
        ),
        (
            "builtins_eval.pt",
            |e| matches!(e, E::RefusedGlobal { module, name, .. } if module == "builtins" && name == "eval"),
        ),
        (
            "subprocess_popen.pt",
            |e| matches!(e, E::RefusedGlobal { module, name, .. } if module == "subprocess" && name == "Popen"),
        ),
        (
            "storage_too_short.pt",
            |e| matches!(e, E::TensorOutOfBounds { tensor, .. } if tensor == "t"),
        ),
        (
            "storage_entry_short.pt",
            |e| matches!(e, E::TruncatedStorage { key, len: 12, needed: 16, .. } if key == "0"),
        ),
        (
            "truncated_zip.pt",
            |e| matches!(e, E::TruncatedZip { size: 309, ends, .. } if ends.contains("\"archive/data/0\"")),
        ),
        (
            "gzip_of_zeros.pt.gz",
            |e| matches!(e, E::GzipNotADump { head, inspected, .. } if head == &[0; 16] && *inspected <= 512),
        ),
        (
            "shape_overflow.pt",
            |e| matches!(e, E::TensorOutOfBounds { reason, .. } if reason.contains("overflow")),
        ),
        ("stride_overflow.pt", |e| {
            matches!(e, E::TensorOutOfBounds { .. })
        }),
        (
            "negative_stride.pt",
            |e| matches!(e, E::TensorOutOfBounds { reason, .. } if reason.contains("negative")),
        ),
        (
            "missing_storage.pt",
            |e| matches!(e, E::Missing { what: "storage", key, .. } if key == "0"),
        ),
        (
            "path_dotdot.pt",
            |e| matches!(e, E::UnsafeEntryName { reason, .. } if reason.contains("..")),
        ),
        ("path_absolute.pt", |e| {
            matches!(
                e,
                E::UnsafeEntryName {
                    reason: "absolute path",
                    ..
                }
            )
        }),
        ("path_backslash.pt", |e| {
            matches!(
                e,
                E::UnsafeEntryName {
                    reason: "contains a backslash",
                    ..
                }
            )
        }),
        ("deflated.pt", |e| {
            matches!(e, E::CompressedEntry { method: 8, .. })
        }),
        ("no_data_pkl.pt", |e| matches!(e, E::NotATorchFile { .. })),
        ("declared_size_huge.pt", |e| {
            matches!(e, E::DeclaredSizeTooLarge { .. })
        }),
        (
            "entry_count_huge.pt",
            |e| matches!(e, E::DeclaredSizeTooLarge { what, .. } if what == "zip entry count"),
        ),
        (
            "overlapping_entries.pt",
            |e| matches!(e, E::OverlappingEntries { entry, other, .. } if entry == "archive/byteorder" && other == "archive/data.pkl"),
        ),
        ("legacy_tar.pt", |e| matches!(e, E::LegacyTarFormat { .. })),
        (
            "crc_mismatch.pt",
            |e| matches!(e, E::ChecksumMismatch { entry, of, .. } if entry == "archive/data/0" && of.contains("the bytes of tensor `")),
        ),
        ("legacy_storage_short.pt", |e| {
            matches!(e, E::Truncated { .. })
        }),
        (
            "st_overlap.safetensors",
            |e| matches!(e, E::TensorOutOfBounds { tensor, reason, .. } if tensor == "b" && reason.contains("overlaps")),
        ),
        (
            "st_name_twice.safetensors",
            |e| matches!(e, E::Malformed { reason, .. } if reason.contains("\"a\" is named twice")),
        ),
        (
            "st_past_end.safetensors",
            |e| matches!(e, E::TensorOutOfBounds { tensor, .. } if tensor == "a"),
        ),
        (
            "st_bad_dtype.safetensors",
            |e| matches!(e, E::UnsupportedDType { dtype, .. } if dtype == "C64"),
        ),
        ("st_size_mismatch.safetensors", |e| {
            matches!(e, E::TensorOutOfBounds { .. })
        }),
        (
            "st_header_huge.safetensors",
            |e| matches!(e, E::DeclaredSizeTooLarge { declared, .. } if *declared == 1 << 40),
        ),
        ("npy_bad_version.npy", |e| matches!(e, E::Malformed { .. })),
        ("npy_data_short.npy", |e| matches!(e, E::Truncated { .. })),
        ("npy_structured.npy", |e| {
            matches!(e, E::UnsupportedArray { .. })
        }),
    ]
}

#[test]
fn every_bad_file_fails_with_its_error() {
    let _ = std::fs::remove_file(MARKER);
    let table = table();
    let mut on_disk: Vec<String> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.ends_with(".py") && n != "valid_small.pt")
        .collect();
    on_disk.sort();
    let mut covered: Vec<String> = table.iter().map(|(n, _)| n.to_string()).collect();
    covered.sort();
    assert_eq!(on_disk, covered, "every bad file needs a check");
    for (name, check) in table {
        let err = read_all(&dir().join(name)).expect_err(name);
        assert!(check(&err), "{name}: wrong error: {err:?}");
        let msg = err.to_string();
        assert!(
            msg.contains(name),
            "{name}: the message names the file: {msg}"
        );
    }
    assert!(!Path::new(MARKER).exists(), "a pickle ran code");
}

#[test]
fn the_uncorrupted_original_reads() {
    assert_eq!(read_all(&dir().join("valid_small.pt")).unwrap(), 16);
}

#[test]
fn refusal_message_says_what_to_do() {
    let msg = read_all(&dir().join("os_system.pt"))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("`os.system`") && msg.contains("never executes pickle code"),
        "{msg}"
    );
    assert!(
        msg.contains("re-save the tensors with safetensors"),
        "{msg}"
    );
    let msg = read_all(&dir().join("legacy_tar.pt"))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("torch>=1.6"), "{msg}");
}

#[test]
fn broadcast_views_are_bounded_by_the_tensor_limit() {
    // A stride-0 view can describe far more bytes than the file holds.
    let src =
        open_source(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pt/views.pt"))
            .unwrap();
    let torch = src.as_torch().unwrap();
    let t = torch
        .value()
        .get("expanded")
        .and_then(|v| v.as_tensor())
        .unwrap()
        .clone();
    let mut wide = t.clone();
    wide.shape = vec![1 << 40, 1 << 20];
    wide.strides = vec![0, 0];
    let err = torch.tensor_bytes(&wide).unwrap_err();
    assert!(
        matches!(err, ConvertError::TensorOutOfBounds { .. }),
        "{err:?}"
    );
    assert_eq!(torch.tensor_bytes(&t).unwrap().len(), 12 * 4);
}

#[test]
fn garbage_is_an_unknown_format() {
    let tmp = tempfile::tempdir().unwrap();
    for (i, bytes) in [
        &b""[..],
        b"hello world",
        b"PK\x03\x04",
        b"\x93NUMPY",
        b"\x1f\x8b\x08\x00",
    ]
    .iter()
    .enumerate()
    {
        let path = tmp.path().join(format!("g{i}"));
        std::fs::write(&path, bytes).unwrap();
        assert!(open_source(&path).is_err(), "{bytes:?}");
    }
}

#[test]
fn an_unsupported_dtype_fails_only_the_tensor() {
    let src = open_source(&dir().join("st_bad_dtype.safetensors")).unwrap();
    assert!(src.tensors().is_empty());
    let unsupported: Vec<(String, String)> = src
        .unsupported()
        .into_iter()
        .map(|u| (u.name, u.dtype))
        .collect();
    assert_eq!(unsupported, [("a".to_string(), "C64".to_string())]);
    let msg = src.tensor("a").unwrap_err().to_string();
    assert!(
        msg.contains("st_bad_dtype.safetensors") && msg.contains("\"a\"") && msg.contains("C64"),
        "{msg}"
    );
    assert!(msg.contains("re-save"), "{msg}");
}

/// A gzip of `head` followed by zeros up to `total` bytes, compressed as it is produced.
fn gzip_of(head: &[u8], total: usize) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    enc.write_all(head).unwrap();
    let zeros = vec![0u8; 1 << 20];
    let mut left = total - head.len();
    while left > 0 {
        let n = left.min(zeros.len());
        enc.write_all(&zeros[..n]).unwrap();
        left -= n;
    }
    enc.finish().unwrap()
}

fn write_tmp(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn a_gzip_of_zeros_is_refused_after_its_first_bytes() {
    // 1 GiB of zeros in about 1 MB: refused from its first bytes, not decompressed whole.
    let tmp = tempfile::tempdir().unwrap();
    let path = write_tmp(&tmp, "bomb.ckpt.gz", &gzip_of(b"", 1 << 30));
    for err in [
        open_source(&path).unwrap_err(),
        load_torch(&path).unwrap_err(),
    ] {
        assert!(
            matches!(&err, ConvertError::GzipNotADump { head, inspected, .. }
                if head == &[0; 16] && *inspected <= 512),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("bomb.ckpt.gz") && msg.contains("00 00 00"),
            "{msg}"
        );
        assert!(msg.contains("not a hidden-state dump"), "{msg}");
    }
}

#[test]
fn a_gzip_that_starts_like_a_zip_stops_at_its_limit() {
    // Starts like a torch zip, then 1 GiB of zeros: decompression stops at the limit that
    // follows the compressed size (64 MiB here), long before the end.
    let tmp = tempfile::tempdir().unwrap();
    let gz = gzip_of(b"PK\x03\x04", 1 << 30);
    let path = write_tmp(&tmp, "bomb.pt.gz", &gz);
    let cap = Limits::default().max_decompressed_bytes;
    let want = gzip_limit(gz.len() as u64, cap);
    assert!((GZIP_MIN_LIMIT..1 << 27).contains(&want), "{want}");
    let err = open_source(&path).unwrap_err();
    assert!(
        matches!(&err, ConvertError::GzipTooLarge { limit, compressed, cap: c, .. }
            if *limit == want && *compressed == gz.len() as u64 && *c == cap),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("bomb.pt.gz") && msg.contains(&want.to_string()) && msg.contains("gunzip -k"),
        "{msg}"
    );
}

#[test]
fn the_configured_cap_bounds_a_gzip_below_its_ratio() {
    let tmp = tempfile::tempdir().unwrap();
    let path = write_tmp(&tmp, "capped.pt.gz", &gzip_of(b"PK\x03\x04", 8 << 20));
    let limits = Limits {
        max_decompressed_bytes: 1 << 20,
        ..Limits::default()
    };
    let err = open_source_with(&path, limits).unwrap_err();
    assert!(
        matches!(err, ConvertError::GzipTooLarge { limit, cap, .. } if limit == 1 << 20 && cap == 1 << 20),
        "{err:?}"
    );
    // The same content within the limit gets past decompression to the zip parser.
    let err = open_source(&path).unwrap_err();
    assert!(
        matches!(err, ConvertError::TruncatedZip { size, .. } if size == 8 << 20),
        "{err:?}"
    );
}

#[test]
fn genuine_gzip_files_still_convert() {
    let tmp = tempfile::tempdir().unwrap();
    // torch.save fixtures, zip and legacy, and a gzip of a plain one, read like the plain file.
    for (gz, plain) in [
        (
            pt_fixtures().join("specforge.ckpt.gz"),
            pt_fixtures().join("specforge.ckpt"),
        ),
        (
            pt_fixtures().join("nested_legacy.pt.gz"),
            pt_fixtures().join("nested_legacy.pt"),
        ),
        (
            {
                let mut enc =
                    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                enc.write_all(&std::fs::read(dir().join("valid_small.pt")).unwrap())
                    .unwrap();
                write_tmp(&tmp, "valid_small.pt.gz", &enc.finish().unwrap())
            },
            dir().join("valid_small.pt"),
        ),
    ] {
        let a = open_source(&gz).unwrap();
        let b = open_source(&plain).unwrap();
        assert!(a.gzipped(), "{gz:?}");
        assert_eq!(a.tensors(), b.tensors(), "{gz:?}");
        for t in a.tensors() {
            assert_eq!(a.tensor(&t.name).unwrap(), b.tensor(&t.name).unwrap());
        }
        assert!(load_torch(&gz).unwrap().gzipped());
    }
    // Padding compresses ~1000x: a file under the floor converts whatever its ratio.
    let hdr = b"{'descr': '<f4', 'fortran_order': False, 'shape': (2048, 4096), }          \n";
    let mut npy = b"\x93NUMPY\x01\x00".to_vec();
    npy.extend_from_slice(&(hdr.len() as u16).to_le_bytes());
    npy.extend_from_slice(hdr);
    let total = npy.len() + 2048 * 4096 * 4;
    let gz = gzip_of(&npy, total);
    assert!(gz.len() * 1000 < total, "{}", gz.len());
    let path = write_tmp(&tmp, "padded.npy.gz", &gz);
    let src = open_source(&path).unwrap();
    assert_eq!(src.tensor("").unwrap().bytes.len(), 2048 * 4096 * 4);
}

#[test]
fn a_truncated_torch_zip_says_where_it_ends() {
    // Real torch output (entries closed by data descriptors), cut at several places.
    let raw = std::fs::read(pt_fixtures().join("specforge.ckpt")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let start = |name: &str| {
        raw.windows(name.len())
            .position(|w| w == name.as_bytes())
            .unwrap()
            - 30
    };
    let data1 = start("specforge/data/1");
    let central = raw.windows(4).position(|w| w == b"PK\x01\x02").unwrap();
    for (cut, ends) in [
        (data1 - 40, "inside entry \"specforge/data/0\""),
        (data1, "after entry \"specforge/data/0\""),
        (data1 + 10, "inside the local header at offset"),
        (central + 50, "inside the central directory"),
        (central, "before the central directory"),
    ] {
        let path = write_tmp(&tmp, "cut.ckpt", &raw[..cut]);
        let err = open_source(&path).unwrap_err();
        assert!(
            matches!(&err, ConvertError::TruncatedZip { size, ends: e, .. }
                if *size == cut as u64 && e.contains(ends)),
            "cut at {cut}: {err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("cut.ckpt")
                && msg.contains("truncated")
                && msg.contains("copy the file again"),
            "{msg}"
        );
    }
    // Also when the cut file was gzip-compressed.
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(&raw[..data1 - 40]).unwrap();
    let path = write_tmp(&tmp, "cut.ckpt.gz", &enc.finish().unwrap());
    let err = open_source(&path).unwrap_err();
    assert!(matches!(err, ConvertError::TruncatedZip { .. }), "{err:?}");
}

#[test]
fn a_truncated_storage_names_its_key_and_lengths() {
    let msg = read_all(&dir().join("storage_entry_short.pt"))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("storage_entry_short.pt")
            && msg.contains("storage \"0\" is truncated")
            && msg.contains("12 bytes")
            && msg.contains("need 16")
            && msg.contains("re-save"),
        "{msg}"
    );
}

/// A tensor of a million dimensions (a few bytes of data, megabytes of header) is refused when
/// the file is opened, naming the tensor: shapes are compared many times per file.
#[test]
fn a_tensor_of_too_many_dimensions_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ranks.safetensors");
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![1; 100_000], &[0u8; 4])
            .unwrap();
    safetensors::serialize_to_file([("hidden_state", view)], None, &path).unwrap();
    let t0 = std::time::Instant::now();
    let Err(err) = open_source(&path) else {
        panic!("a tensor of 100000 dimensions was read");
    };
    assert!(
        matches!(
            &err,
            ConvertError::DeclaredSizeTooLarge {
                declared: 100_000,
                limit: 64,
                ..
            }
        ) && err.to_string().contains("`hidden_state`"),
        "{err}"
    );
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(10),
        "{:?}",
        t0.elapsed()
    );
}
