//! The version of a JSON structure, read before the rest of it: a structure a newer hspack
//! wrote may hold fields, dtypes or roles this one does not know, and must be refused as a
//! version to upgrade for, not decoded as damage (whose advice is to restore the file).

use serde::Deserialize;

use super::FormatError;

/// Refuses JSON `bytes` of `structure` whose `version` is outside `min..=max`. Bytes that do
/// not decode this far (not JSON, no whole-number `version`) pass: the full decode names
/// what is wrong with them.
pub fn refuse_unknown_version(
    bytes: &[u8],
    structure: &'static str,
    min: u64,
    max: u64,
) -> Result<(), FormatError> {
    #[derive(Deserialize)]
    struct Versioned {
        version: u64,
    }
    match serde_json::from_slice::<Versioned>(bytes) {
        Ok(Versioned { version }) if !(min..=max).contains(&version) => {
            Err(FormatError::UnsupportedVersion {
                structure,
                found: version,
                min,
                max,
            })
        }
        _ => Ok(()),
    }
}

/// The structures whose version says which hspack wrote a dataset or store: one newer than
/// this build reads is no damage, a newer hspack wrote it. Every other versioned structure (a
/// shard's header and footer, a segment, a pack) sits under one of these that this build
/// read, so a version there it does not know is damage (a flipped bit), as before.
const WRITER_VERSIONED: [&str; 3] = ["manifest", "store index.json", "stored dataset"];

/// True when `e` says a newer hspack wrote the dataset or store: not damage.
pub fn written_by_a_newer_hspack(e: &FormatError) -> bool {
    matches!(e, FormatError::UnsupportedVersion { structure, .. } if WRITER_VERSIONED.contains(structure))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_version_outside_the_range_is_refused() {
        let refused = |json: &str| refuse_unknown_version(json.as_bytes(), "manifest", 1, 5);
        for json in [
            r#"{"version": 6, "dtype": "fp4"}"#,
            r#"{"version": 70000}"#,
            r#"{"version": 0}"#,
        ] {
            let err = refused(json).unwrap_err();
            assert!(err.to_string().contains("upgrade hspack"), "{json}: {err}");
        }
        for json in [
            r#"{"version": 5}"#,
            r#"{"version": 1, "x": [1, 2]}"#,
            r#"{"version": "5"}"#,
            r#"{"version": -1}"#,
            r#"{"no": 1}"#,
            "not json",
        ] {
            assert!(refused(json).is_ok(), "{json}");
        }
    }
}
