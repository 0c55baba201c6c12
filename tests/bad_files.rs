//! Every file directly in `tests/bad_files/` is refused with the error it was made to trigger.
//! (`tests/bad_files/make_bad_files.py` writes them from the golden vectors.)

use std::path::Path;

use hspack::format::schema::FIELD_NAME_RULE;
use hspack::format::{ChunkHeader, Footer, FormatError, Index, Manifest, ShardHeader};

fn expected(name: &str) -> Option<fn(&FormatError) -> bool> {
    Some(match name {
        "manifest_future_version.json" => {
            |e| matches!(e, FormatError::UnsupportedVersion { found: 99, .. })
        }
        "manifest_truncated.json" => |e| matches!(e, FormatError::Json { .. }),
        "manifest_path_escape.json" => {
            |e| matches!(e, FormatError::Json { detail, .. } if detail.contains("plain file name"))
        }
        "manifest_field_name_escape.json" => |e| {
            matches!(e, FormatError::Json { structure: "schema", detail, .. }
                if detail.contains("\"../../PWN\"") && detail.contains(FIELD_NAME_RULE))
        },
        "manifest_wrong_total.json" => |e| {
            matches!(
                e,
                FormatError::Invalid {
                    what: "samples",
                    ..
                }
            )
        },
        "footer_bad_end_magic.bin" => |e| matches!(e, FormatError::BadMagic { .. }),
        "footer_bad_check.bin" => |e| matches!(e, FormatError::CheckMismatch { .. }),
        "footer_too_short.bin" => |e| matches!(e, FormatError::Truncated { .. }),
        "index_bad_magic.bin" => |e| matches!(e, FormatError::BadMagic { .. }),
        "index_wrong_length.bin" => |e| matches!(e, FormatError::Invalid { what: "length", .. }),
        "index_reserved_set.bin" => |e| matches!(e, FormatError::ReservedNotZero { .. }),
        "shard_header_future_version.bin" => {
            |e| matches!(e, FormatError::UnsupportedVersion { found: 2, .. })
        }
        "shard_header_bad_check.bin" => |e| matches!(e, FormatError::CheckMismatch { .. }),
        "chunk_header_bad_magic.bin" => |e| matches!(e, FormatError::BadMagic { .. }),
        "chunk_header_bad_check.bin" => |e| matches!(e, FormatError::CheckMismatch { .. }),
        _ => return None,
    })
}

fn decode(name: &str, bytes: &[u8]) -> Result<(), FormatError> {
    match name.split('_').next().unwrap() {
        "manifest" => Manifest::decode(bytes).map(drop),
        "footer" => Footer::decode(bytes, bytes.len().max(256) as u64).map(drop),
        "index" => Index::parse(bytes).map(drop),
        "shard" => ShardHeader::decode(bytes).map(drop),
        "chunk" => ChunkHeader::decode(bytes).map(drop),
        other => panic!("no decoder for {other}"),
    }
}

#[test]
fn every_bad_file_is_refused_with_its_error() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bad_files");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        // Sub-folders belong to other suites (`convert/`: tests/convert_bad_files.rs).
        if name.ends_with(".py") || path.is_dir() {
            continue;
        }
        let check =
            expected(&name).unwrap_or_else(|| panic!("{name} has no test: add it to `expected`"));
        let bytes = std::fs::read(&path).unwrap();
        match decode(&name, &bytes) {
            Err(e) => assert!(check(&e), "{name}: unexpected error {e}"),
            Ok(()) => panic!("{name} was accepted"),
        }
        seen += 1;
    }
    assert_eq!(seen, 15);
}
