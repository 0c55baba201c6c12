//! The segments a commit adds (manifest version 4, FORMAT.md §6.3): one of level 0 for the
//! shards it commits, with their key run and samples table part; then, while the last
//! [`MERGE_FANOUT`] segments share a level, one segment of the next level in their place, key
//! runs merged as they stream. What a commit writes does not grow with the dataset.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::ops::Range;
use std::sync::Arc;

use crate::error::{format, Error, Result};
use crate::failpoint::failpoint;
use crate::format::manifest::{hex, TableRecord, SEGMENTS_VERSION};
use crate::format::segment::{
    encode_key_run, key_run_file_name, segment_file_name, table_part_file_name, KeyRunEntry,
    KeyRunRecord, Segment, SegmentFiles, SegmentRef, MAX_SEGMENT_BYTES, SEGMENT_FORMAT,
    SEGMENT_VERSION,
};
use crate::format::{FormatError, Manifest, ShardRecord};
use crate::io::{temp_name, FileReader, Storage};
use crate::read::Shard;

use super::samples_table::{self, SampleRow};

/// Segments of one level that are replaced by one of the next level.
pub const MERGE_FANOUT: usize = 8;

/// Segments whose files together hold more than this are not merged (FORMAT.md §6.3): a
/// merged segment is no larger than those it replaces, so every segment a writer makes stays
/// well inside the [`MAX_SEGMENT_BYTES`] readers accept.
pub const MERGED_SEGMENT_BYTES: u64 = MAX_SEGMENT_BYTES / 2;

/// Entries of a key run read or written at a time while runs are merged (1 MiB).
const RUN_BLOCK: usize = 1 << 16;

/// Where and how a writer publishes segments.
pub(crate) struct Segments<'a> {
    pub(crate) storage: &'a dyn Storage,
    /// The tag in the names of the writer's files (a lease's token, a sharing writer's tag).
    pub(crate) tag: Option<&'a str>,
    pub(crate) durable: bool,
    /// The segment files and key runs published so far: those a merge of the same commit
    /// replaced are removed once the manifest is published.
    pub(crate) published: std::cell::RefCell<Vec<String>>,
    /// Every file this commit created (segment files, key runs, table parts): none is listed
    /// by the manifest as it was before the commit, so a commit that fails may remove them.
    pub(crate) created: std::cell::RefCell<Vec<String>>,
    /// The largest segment file published: [`MAX_SEGMENT_BYTES`], what readers accept.
    segment_limit: u64,
}

impl<'a> Segments<'a> {
    /// Segments published into `storage`, named with `tag`.
    pub(crate) fn new(storage: &'a dyn Storage, tag: Option<&'a str>, durable: bool) -> Self {
        Segments {
            storage,
            tag,
            durable,
            published: Default::default(),
            created: Default::default(),
            segment_limit: MAX_SEGMENT_BYTES,
        }
    }

    /// Publishes `bytes` as the new file `name`, one of this commit's.
    fn put_new(&self, name: &str, bytes: &[u8]) -> Result<()> {
        self.storage.put_new(name, bytes, self.durable)?;
        self.created.borrow_mut().push(name.to_string());
        Ok(())
    }

    /// Lists `manifest.shards[first_new..]` (committed shards the manifest does not list in a
    /// segment yet) in a new level-0 segment, then merges. A manifest of version 1 to 3 is
    /// made version 4 first, its earlier shards one segment.
    pub(crate) fn add_commit(&self, manifest: &mut Manifest, first_new: usize) -> Result<()> {
        if !manifest.is_segmented() {
            self.upgrade(manifest, first_new)?;
        }
        let new = first_new..manifest.shards.len();
        if new.is_empty() {
            return Ok(());
        }
        let (mut entries, rows) = self.read_shards(manifest, new.clone())?;
        entries.sort_unstable();
        let part = self.publish_part(manifest, new.clone(), &rows)?;
        let keys = self.publish_run(&key_run_name(new.clone(), self.tag), &entries)?;
        let added = self.publish_segment(manifest, 0, new, keys, vec![part])?;
        list(manifest, added);
        failpoint!("segment-published");
        self.merge(manifest)
    }

    /// Makes a manifest of version 1 to 3 version 4: its first `shards` shards one segment,
    /// whose one part is its samples table when it has one.
    fn upgrade(&self, manifest: &mut Manifest, shards: usize) -> Result<()> {
        let table = manifest.samples_table.take();
        manifest.version = SEGMENTS_VERSION;
        if shards == 0 {
            return Ok(());
        }
        let old = 0..shards;
        let (mut entries, rows) = self.read_shards(manifest, old.clone())?;
        entries.sort_unstable();
        let samples: u64 = manifest.shards[old.clone()].iter().map(|s| s.samples).sum();
        let part = match table {
            Some(t) if t.samples == samples && self.intact(&t.file, t.bytes, &t.blake3) => t,
            _ => self.publish_part(manifest, old.clone(), &rows)?,
        };
        let keys = self.publish_run(&key_run_name(old.clone(), self.tag), &entries)?;
        let added = self.publish_segment(manifest, 0, old, keys, vec![part])?;
        list(manifest, added);
        Ok(())
    }

    /// True when `file` is there with `bytes` bytes hashing to `blake3`.
    fn intact(&self, file: &str, bytes: u64, blake3: &str) -> bool {
        self.storage.read(file).ok().flatten().is_some_and(|b| {
            b.len() as u64 == bytes
                && hex(blake3::hash(&b).as_bytes()) == blake3.to_ascii_lowercase()
        })
    }

    /// Rewrites the key runs and table parts of `manifest`'s segments that are missing or do
    /// not hash to their records, each from the shards' indexes, bit for bit: refused where
    /// the bytes rebuilt differ from the record (a file written by another release). Returns
    /// the names rewritten.
    pub(crate) fn rewrite_derived(&self, manifest: &Manifest) -> Result<Vec<String>> {
        let mut rewritten = Vec::new();
        for (g, files) in manifest.segments.iter().zip(&manifest.segment_files) {
            let run = files
                .keys
                .as_ref()
                .filter(|k| !self.intact(&k.file, k.bytes, &k.blake3));
            let parts: Vec<(u64, &TableRecord)> = (files.tables.iter())
                .scan(g.first_ordinal, |at, t| {
                    *at += t.samples;
                    Some((*at - t.samples, t))
                })
                .filter(|(_, t)| !self.intact(&t.file, t.bytes, &t.blake3))
                .collect();
            if run.is_none() && parts.is_empty() {
                continue;
            }
            let seqs = g.first_seq as usize..(g.first_seq + g.shards) as usize;
            let (mut entries, rows) = self.read_shards(manifest, seqs)?;
            entries.sort_unstable();
            let mut rebuilt: Vec<(&str, &str, Vec<u8>)> = Vec::new();
            if let Some(k) = run {
                rebuilt.push((&k.file, &k.blake3, encode_key_run(&entries)));
            }
            for (start, t) in parts {
                let first = (start - g.first_ordinal) as usize;
                let mine = &rows[first..first + t.samples as usize];
                let path = self.storage.path(&t.file);
                rebuilt.push((&t.file, &t.blake3, samples_table::encode(mine, &path)?));
            }
            for (file, want, bytes) in rebuilt {
                if hex(blake3::hash(&bytes).as_bytes()) != want.to_ascii_lowercase() {
                    return Err(format(self.storage.path(file))(FormatError::Json {
                        structure: "segment",
                        detail: "rebuilt from the shards, the file differs from what its segment \
                                 records (another release wrote it): restore it from a copy with \
                                 `hspack repair`"
                            .into(),
                    }));
                }
                self.storage.replace(file, &bytes, None, self.durable)?;
                rewritten.push(file.to_string());
            }
        }
        Ok(rewritten)
    }

    /// The key run entries and table rows of shards `seqs`, from their indexes.
    fn read_shards(
        &self,
        manifest: &Manifest,
        seqs: Range<usize>,
    ) -> Result<(Vec<KeyRunEntry>, Vec<SampleRow>)> {
        let (mut entries, mut rows) = (Vec::new(), Vec::new());
        for record in &manifest.shards[seqs] {
            let shard = Shard::open(
                self.storage,
                record,
                manifest.dataset_id_bytes(),
                &manifest.schema,
                None,
            )?;
            rows.extend(samples_table::rows_of(&shard, record));
        }
        for row in &rows {
            entries.push(KeyRunEntry {
                hash: crate::format::key_hash(&row.key),
                ordinal: row.ordinal,
            });
        }
        Ok((entries, rows))
    }

    fn publish_part(
        &self,
        manifest: &Manifest,
        seqs: Range<usize>,
        rows: &[SampleRow],
    ) -> Result<TableRecord> {
        let (first, last) = ends(&manifest.shards, seqs);
        let name = table_part_file_name(first, last, self.tag);
        let bytes = samples_table::encode(rows, &self.storage.path(&name))?;
        self.put_new(&name, &bytes)?;
        Ok(TableRecord {
            file: name,
            bytes: bytes.len() as u64,
            blake3: hex(blake3::hash(&bytes).as_bytes()),
            samples: rows.len() as u64,
        })
    }

    fn publish_run(&self, name: &str, entries: &[KeyRunEntry]) -> Result<KeyRunRecord> {
        let bytes = encode_key_run(entries);
        self.put_new(name, &bytes)?;
        self.published.borrow_mut().push(name.to_string());
        Ok(KeyRunRecord {
            file: name.to_string(),
            bytes: bytes.len() as u64,
            blake3: hex(blake3::hash(&bytes).as_bytes()),
            entries: entries.len() as u64,
        })
    }

    /// Publishes the segment file of the manifest's shards `seqs`; returns its entry and files.
    fn publish_segment(
        &self,
        manifest: &Manifest,
        level: u8,
        seqs: Range<usize>,
        keys: KeyRunRecord,
        tables: Vec<TableRecord>,
    ) -> Result<(SegmentRef, SegmentFiles)> {
        let (first, last) = ends(&manifest.shards, seqs.clone());
        let segment = Segment {
            format: SEGMENT_FORMAT.into(),
            version: SEGMENT_VERSION,
            dataset_id: manifest.dataset_id.clone(),
            level,
            shards: manifest.shards[seqs].to_vec(),
            keys,
            tables,
        };
        let name = segment_file_name(first, last, self.tag);
        let bytes = segment.encode();
        if bytes.len() as u64 > self.segment_limit {
            // Merges stay far below; one commit of very many shards, or the upgrade of a
            // manifest that listed that many, does not: a dataset readers refuse is not made.
            return Err(Error::Unsupported {
                path: self.storage.path(&name),
                detail: format!(
                    "the segment of shards {first} to {last} would be {} bytes, more than the \
                     {} readers accept (FORMAT.md §6.3); nothing was committed: commit fewer \
                     shards at a time (larger shards, or commits more often)",
                    bytes.len(),
                    self.segment_limit
                ),
            });
        }
        self.put_new(&name, &bytes)?;
        self.published.borrow_mut().push(name.clone());
        let reference = segment.reference(&name, &bytes);
        Ok((reference, segment.into_parts().1))
    }

    /// While the last [`MERGE_FANOUT`] segments share a level and hold no more than
    /// [`MERGED_SEGMENT_BYTES`] together, replaces them by one segment of the next level.
    fn merge(&self, manifest: &mut Manifest) -> Result<()> {
        loop {
            let n = manifest.segments.len();
            let Some(start) = n.checked_sub(MERGE_FANOUT) else {
                return Ok(());
            };
            let last = &manifest.segments[start..];
            let level = last[MERGE_FANOUT - 1].level;
            let bytes = last.iter().map(|g| g.bytes).fold(0u64, u64::saturating_add);
            if last.iter().any(|g| g.level != level) || bytes > MERGED_SEGMENT_BYTES {
                return Ok(());
            }
            let first = manifest.segments[start].first_seq as usize;
            let seqs = first..manifest.shards.len();
            let runs: Vec<&KeyRunRecord> = (manifest.segment_files[start..].iter())
                .filter_map(|f| f.keys.as_ref())
                .collect();
            let keys = self.merge_runs(&runs, &key_run_name(seqs.clone(), self.tag))?;
            let tables = (manifest.segment_files[start..].iter())
                .flat_map(|f| f.tables.iter().cloned())
                .collect();
            let merged = self.publish_segment(manifest, level + 1, seqs, keys, tables)?;
            failpoint!("segments-merged");
            manifest.segments.truncate(start);
            manifest.segment_files.truncate(start);
            list(manifest, merged);
        }
    }

    /// Merges sorted key runs into one, streaming: each input is hashed as it is read and
    /// must match its record (damage is never carried into a run with a fresh hash), the
    /// output must come out strictly sorted.
    fn merge_runs(&self, runs: &[&KeyRunRecord], name: &str) -> Result<KeyRunRecord> {
        let mut cursors = runs
            .iter()
            .map(|r| RunCursor::open(self.storage, r))
            .collect::<Result<Vec<_>>>()?;
        let mut heap = BinaryHeap::new();
        for (i, c) in cursors.iter_mut().enumerate() {
            if let Some(e) = c.next()? {
                heap.push(Reverse((e, i)));
            }
        }
        let mut out = self.storage.create(&temp_name(name))?;
        let (mut hasher, mut block) = (blake3::Hasher::new(), Vec::with_capacity(RUN_BLOCK * 16));
        let (mut written, mut entries, mut last) = (0u64, 0u64, None);
        let result = (|| {
            while let Some(Reverse((e, i))) = heap.pop() {
                if last.is_some_and(|l| l >= e) {
                    return Err(run_error(
                        self.storage,
                        name,
                        "its inputs overlap or are unsorted",
                    ));
                }
                last = Some(e);
                block.extend_from_slice(&e.to_bytes());
                entries += 1;
                if block.len() >= RUN_BLOCK * 16 {
                    out.write_at(written, &block)?;
                    hasher.update(&block);
                    written += block.len() as u64;
                    block.clear();
                }
                if let Some(next) = cursors[i].next()? {
                    heap.push(Reverse((next, i)));
                }
            }
            out.write_at(written, &block)?;
            hasher.update(&block);
            written += block.len() as u64;
            for c in &cursors {
                c.check_whole()?;
            }
            if self.durable {
                out.sync_all()?;
            }
            Ok(())
        })();
        if let Err(e) = result {
            out.abandon();
            return Err(e);
        }
        out.publish_new(name, self.durable)?;
        self.created.borrow_mut().push(name.to_string());
        self.published.borrow_mut().push(name.to_string());
        Ok(KeyRunRecord {
            file: name.to_string(),
            bytes: written,
            blake3: hex(hasher.finalize().as_bytes()),
            entries,
        })
    }
}

/// Lists a published segment after the manifest's segments.
fn list(manifest: &mut Manifest, (reference, files): (SegmentRef, SegmentFiles)) {
    manifest.segments.push(reference);
    manifest.segment_files.push(files);
}

/// A key run read in blocks, hashed as it goes.
struct RunCursor<'a> {
    storage: &'a dyn Storage,
    record: &'a KeyRunRecord,
    file: Arc<dyn FileReader>,
    block: Vec<KeyRunEntry>,
    at: usize,
    read: u64,
    hasher: blake3::Hasher,
}

impl<'a> RunCursor<'a> {
    fn open(storage: &'a dyn Storage, record: &'a KeyRunRecord) -> Result<Self> {
        let file = storage.open(&record.file)?;
        if file.len() != record.bytes {
            return Err(run_error(
                storage,
                &record.file,
                &format!("{} bytes, its segment records {}", file.len(), record.bytes),
            ));
        }
        Ok(RunCursor {
            storage,
            record,
            file,
            block: Vec::new(),
            at: 0,
            read: 0,
            hasher: blake3::Hasher::new(),
        })
    }

    fn next(&mut self) -> Result<Option<KeyRunEntry>> {
        if self.at == self.block.len() {
            let end = (self.read + (RUN_BLOCK * 16) as u64).min(self.record.bytes);
            if self.read == end {
                return Ok(None);
            }
            let bytes = self.file.read(self.read..end)?;
            self.hasher.update(&bytes);
            self.block = bytes
                .chunks_exact(16)
                .map(KeyRunEntry::from_bytes)
                .collect();
            self.read = end;
            self.at = 0;
        }
        self.at += 1;
        Ok(self.block.get(self.at - 1).copied())
    }

    /// Fails unless the whole run was read and hashes to its record.
    fn check_whole(&self) -> Result<()> {
        let hash = hex(self.hasher.finalize().as_bytes());
        if self.read != self.record.bytes || hash != self.record.blake3.to_ascii_lowercase() {
            return Err(run_error(
                self.storage,
                &self.record.file,
                "it does not hash to its record in the segment: it is damaged; restore it from \
                 a copy with `hspack repair`, or rewrite it from the shards with `hspack reindex`",
            ));
        }
        Ok(())
    }
}

fn run_error(storage: &dyn Storage, name: &str, detail: &str) -> Error {
    format(storage.path(name))(FormatError::Json {
        structure: "key run",
        detail: detail.to_string(),
    })
}

fn key_run_name(seqs: Range<usize>, tag: Option<&str>) -> String {
    key_run_file_name(seqs.start as u32, (seqs.end - 1) as u32, tag)
}

/// The sequence numbers of the first and last shard of `seqs`.
fn ends(shards: &[ShardRecord], seqs: Range<usize>) -> (u32, u32) {
    (shards[seqs.start].seq, shards[seqs.end - 1].seq)
}

/// A writer's manifest as it was before a commit changed it: what a failed commit restores.
pub(crate) struct Mark {
    shards: usize,
    samples: u64,
    version: u16,
    lease: Option<String>,
    samples_table: Option<TableRecord>,
    segments: Vec<SegmentRef>,
    segment_files: Vec<SegmentFiles>,
}

impl Mark {
    /// Everything a commit changes, but the shard list (only ever appended to): O(segments).
    pub(crate) fn of(m: &Manifest) -> Mark {
        Mark {
            shards: m.shards.len(),
            samples: m.samples,
            version: m.version,
            lease: m.writer.lease.clone(),
            samples_table: m.samples_table.clone(),
            segments: m.segments.clone(),
            segment_files: m.segment_files.clone(),
        }
    }

    /// The segment files and key runs listed at the mark, or `published` since, that `m` does
    /// not list.
    pub(crate) fn files_replaced_in(&self, m: &Manifest, published: &[String]) -> Vec<String> {
        let listed = |name: &str| {
            (m.segments.iter().any(|g| g.file == name))
                || (m.segment_files.iter()).any(|f| f.keys.as_ref().is_some_and(|k| k.file == name))
        };
        let old = (self.segments.iter().map(|g| g.file.as_str()))
            .chain(
                (self.segment_files.iter())
                    .filter_map(|f| f.keys.as_ref().map(|k| k.file.as_str())),
            )
            .chain(published.iter().map(String::as_str));
        old.filter(|name| !listed(name))
            .map(str::to_string)
            .collect()
    }

    /// Puts `m` back as it was.
    pub(crate) fn restore(self, m: &mut Manifest) {
        m.shards.truncate(self.shards);
        m.samples = self.samples;
        m.version = self.version;
        m.writer.lease = self.lease;
        m.samples_table = self.samples_table;
        m.segments = self.segments;
        m.segment_files = self.segment_files;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Schema;
    use crate::io::MemoryStorage;

    /// A manifest of [`MERGE_FANOUT`] level-0 segments of one shard each, `bytes` each.
    fn manifest_of(bytes: u64) -> Manifest {
        let mut m = Manifest::new([0; 16], Schema::new(vec![]));
        for seq in 0..MERGE_FANOUT as u32 {
            m.shards.push(ShardRecord {
                file: crate::format::manifest::shard_file_name(seq, None),
                seq,
                bytes: 4096,
                index_blake3: hex(&[0; 32]),
                first_ordinal: 0,
                samples: 0,
                chunks: 0,
                raw_bytes: 0,
            });
            let reference = SegmentRef {
                file: segment_file_name(seq, seq, None),
                bytes,
                blake3: hex(&[0; 32]),
                level: 0,
                first_seq: seq,
                shards: 1,
                first_ordinal: 0,
                samples: 0,
            };
            list(&mut m, (reference, SegmentFiles::default()));
        }
        m
    }

    #[test]
    fn segments_too_large_together_are_not_merged() {
        let storage = MemoryStorage::new("merge-cap");
        let segments = Segments::new(&storage, None, false);
        let mut big = manifest_of(MERGED_SEGMENT_BYTES / MERGE_FANOUT as u64 + 1);
        segments.merge(&mut big).unwrap();
        assert_eq!(
            big.segments.len(),
            MERGE_FANOUT,
            "merged past the size limit"
        );
        assert!(
            storage.list().unwrap().is_empty(),
            "wrote {:?}",
            storage.list()
        );

        // Just inside the limit, the same segments merge into one of level 1.
        let mut small = manifest_of(MERGED_SEGMENT_BYTES / MERGE_FANOUT as u64);
        segments.merge(&mut small).unwrap();
        assert_eq!(small.segments.len(), 1);
        assert_eq!(small.segments[0].level, 1);
    }

    #[test]
    fn a_segment_larger_than_readers_accept_is_refused_unwritten() {
        let storage = MemoryStorage::new("segment-limit");
        let mut segments = Segments::new(&storage, None, false);
        let m = manifest_of(1);
        let keys = segments.publish_run("keys-000000-000007.bin", &[]).unwrap();
        let fits = segments.publish_segment(&m, 0, 0..8, keys.clone(), vec![]);
        let bytes = fits.unwrap().0.bytes;
        segments.segment_limit = bytes - 1;
        let before = storage.list().unwrap();
        let err = segments
            .publish_segment(&m, 0, 0..8, keys, vec![])
            .unwrap_err();
        let said = err.to_string();
        assert!(matches!(err, Error::Unsupported { .. }), "{said}");
        assert!(
            said.contains("shards 0 to 7") && said.contains("commit fewer shards"),
            "{said}"
        );
        assert_eq!(storage.list().unwrap(), before, "published something");
    }
}
