#![no_main]
//! Any bytes as the store's files (FORMAT.md §11): a pack (its table), an index run, a capture
//! file (also with its trailing hash made right, to get past it), a named dataset,
//! `index.json` or `store.json` (JSON), or a shard skeleton. Decoding never panics; what decodes
//! is consistent, and JSON that decodes re-encodes to JSON that decodes equal.

use hspack::io::FileBytes;
use hspack::store::captures::CaptureFile;
use hspack::store::index::{IndexRoot, Run};
use hspack::store::pack::{check_header, decode_table, PACK_ENTRY, PACK_FOOTER};
use hspack::store::skeleton::map_skeleton;
use hspack::store::{Snapshot, StoreConfig};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.starts_with(b"HSPKPACK") {
        let _ = check_header(data, &[0; 16]);
        pack_table(data);
        // Also with the table's hash made right, so a mutated table reaches the checks of
        // its entries.
        if let Some(sealed) = resealed(data) {
            pack_table(&sealed);
        }
        return;
    }
    if data.starts_with(b"HSPKSIDX") {
        if let Ok(run) = Run::parse(FileBytes::copy_of(data)) {
            for i in 0..run.len() {
                let e = run.decode(i).expect("parse checked every entry");
                assert_eq!(run.find(&e.blob.id), Some(e));
            }
        }
        return;
    }
    if data.starts_with(b"HSPKCAPT") {
        let _ = CaptureFile::decode(data);
        if data.len() >= 32 {
            let mut fixed = data[..data.len() - 32].to_vec();
            let hash = blake3::hash(&fixed);
            fixed.extend_from_slice(hash.as_bytes());
            if let Ok(f) = CaptureFile::decode(&fixed) {
                let (_, again) = f.encode();
                assert_eq!(CaptureFile::decode(&again).expect("re-encodes"), f);
                for e in &f.entries {
                    assert_eq!(f.find(&e.key), Some(e));
                }
            }
        }
        return;
    }
    if data.first() == Some(&b'{') {
        if let Ok(s) = Snapshot::decode(data) {
            assert_eq!(Snapshot::decode(&s.encode()).expect("re-encodes"), s);
        }
        if let Ok(r) = IndexRoot::decode(data) {
            assert_eq!(IndexRoot::decode(&r.encode()).expect("re-encodes"), r);
        }
        if let Ok(c) = StoreConfig::decode(data, "store.json".into()) {
            assert_eq!(c.id.len(), 32);
            let again = serde_json::to_vec(&c).expect("encodes");
            assert_eq!(
                StoreConfig::decode(&again, "store.json".into()).expect("re-decodes"),
                c
            );
        }
        return;
    }
    if let Ok(map) = map_skeleton(data) {
        let mut at = 0;
        for (start, len, _) in &map.pieces {
            assert_eq!(*start, at);
            at += len;
        }
        assert_eq!(at, map.file_len);
    }
});

/// A pack's table read from the whole pack, and from its second half (which asks for more
/// where the table does not fit, never reading past what it was given).
fn pack_table(data: &[u8]) {
    let len = data.len() as u64;
    let tail = &data[data.len() / 2..];
    for given in [data, tail] {
        match decode_table(given, len) {
            Ok(Ok(table)) => {
                for e in table {
                    assert!(e.offset + e.stored_len <= len);
                }
            }
            Ok(Err(need)) => assert!(need > given.len() as u64 && need <= len),
            Err(_) => {}
        }
    }
}

/// `data` with the footer's table hash set to the BLAKE3 of the table the footer points at.
fn resealed(data: &[u8]) -> Option<Vec<u8>> {
    let footer = data.len().checked_sub(PACK_FOOTER)?;
    let entries = u64::from_le_bytes(data[footer + 8..footer + 16].try_into().ok()?);
    let table_len = usize::try_from(entries.checked_mul(PACK_ENTRY as u64)?).ok()?;
    let start = footer.checked_sub(table_len)?;
    let mut out = data.to_vec();
    let hash = blake3::hash(&data[start..footer]);
    out[footer + 16..footer + 48].copy_from_slice(hash.as_bytes());
    Some(out)
}
