//! Lookups by key through the segments' key runs (manifest version 4, FORMAT.md §6.4): one
//! binary search per segment, so a lookup costs O(segments × log samples), whatever the number
//! of shards, and in object storage reads a few 16-byte ranges of each run, never a whole one.

use std::sync::{Arc, OnceLock};

use crate::error::Result;
use crate::format::manifest::hex;
use crate::format::segment::{KeyRunEntry, KeyRunRecord, KEY_RUN_ENTRY};
use crate::io::{FileReader, Storage};

/// The key runs of a dataset's segments, each opened on first use.
#[derive(Debug)]
pub(crate) struct KeyRuns {
    runs: Vec<OnceLock<std::result::Result<Arc<dyn FileReader>, ()>>>,
}

/// Where a key may be: the ordinals a run names for its hash, and the segments whose run
/// could not be read (their shards' own key tables are searched instead).
#[derive(Debug, Default)]
pub(crate) struct Candidates {
    pub(crate) ordinals: Vec<u64>,
    pub(crate) unread: Vec<usize>,
}

impl KeyRuns {
    /// Runs of `segments` segments, none opened yet.
    pub(crate) fn new(segments: usize) -> Self {
        KeyRuns {
            runs: (0..segments).map(|_| OnceLock::new()).collect(),
        }
    }

    /// The ordinals of samples whose key hashes to `hash`, in every segment's run. A run the
    /// storage maps is hashed when first opened and, unless it matches its record, not used
    /// (its segment is listed in [`Candidates::unread`]); a run in object storage is read by
    /// ranges, trusted as `verify` last found it.
    pub(crate) fn candidates(
        &self,
        storage: &dyn Storage,
        records: &[Option<&KeyRunRecord>],
        hash: u64,
    ) -> Candidates {
        let mut out = Candidates::default();
        for (segment, (cell, record)) in self.runs.iter().zip(records).enumerate() {
            let run = cell.get_or_init(|| {
                let record = record.ok_or(())?;
                let file = storage.open(&record.file).map_err(drop)?;
                let intact = file.len() == record.bytes
                    && file.whole().is_none_or(|bytes| {
                        hex(blake3::hash(&bytes).as_bytes()) == record.blake3.to_ascii_lowercase()
                    });
                intact.then_some(file).ok_or(())
            });
            match run.as_ref().map(|r| search(&**r, hash)) {
                Ok(Ok(found)) => out.ordinals.extend(found),
                _ => out.unread.push(segment),
            }
        }
        out
    }
}

/// The ordinals of `run`'s entries with `hash`: a binary search over its entries, on the
/// mapped bytes where the storage maps the file, else by ranged reads of single entries.
fn search(run: &dyn FileReader, hash: u64) -> Result<Vec<u64>> {
    let n = run.len() / KEY_RUN_ENTRY as u64;
    if let Some(whole) = run.whole() {
        let bytes: &[u8] = &whole;
        let entry = |i: u64| {
            let at = i as usize * KEY_RUN_ENTRY;
            KeyRunEntry::from_bytes(&bytes[at..at + KEY_RUN_ENTRY])
        };
        return matches(n, hash, |i| Ok(entry(i)));
    }
    matches(n, hash, |i| {
        let at = i * KEY_RUN_ENTRY as u64;
        Ok(KeyRunEntry::from_bytes(
            &run.read(at..at + KEY_RUN_ENTRY as u64)?,
        ))
    })
}

/// The ordinals of the entries with `hash` among `n` sorted entries read by `entry`.
fn matches(n: u64, hash: u64, entry: impl Fn(u64) -> Result<KeyRunEntry>) -> Result<Vec<u64>> {
    let (mut lo, mut hi) = (0u64, n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if entry(mid)?.hash < hash {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    let mut out = Vec::new();
    while lo < n {
        let e = entry(lo)?;
        if e.hash != hash {
            break;
        }
        out.push(e.ordinal);
        lo += 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_every_entry_of_a_hash() {
        let entries: Vec<KeyRunEntry> = [(1, 0), (3, 4), (3, 7), (9, 2)]
            .into_iter()
            .map(|(hash, ordinal)| KeyRunEntry { hash, ordinal })
            .collect();
        let at = |i: u64| Ok(entries[i as usize]);
        assert_eq!(matches(4, 3, at).unwrap(), vec![4, 7]);
        assert_eq!(matches(4, 1, at).unwrap(), vec![0]);
        assert_eq!(matches(4, 9, at).unwrap(), vec![2]);
        assert!(matches(4, 2, at).unwrap().is_empty());
        assert!(matches(4, 10, at).unwrap().is_empty());
        assert!(matches(0, 3, at).unwrap().is_empty());
    }
}
