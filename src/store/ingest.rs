//! Adding blobs to a store: what is there is found by id and referenced, what is new goes
//! into a pack; each pack, once full or at the commit, is published, then an index run for
//! its blobs; then (the caller) the dataset that references them, all under the shared hold
//! of `gc.lock`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::format::manifest::hex;
use crate::format::{Footer, Index};
use crate::io::FileReader;

use super::index::{self, IndexRoot, Location, RunRecord, INDEX_ROOT, MERGE_WIDTH};
use super::locks::StoreLock;
use super::pack::{BlobCodec, PackWriter, PACK_TARGET};
use super::skeleton::{map_skeleton, payloads, skeleton_of};
use super::snapshot::FileRecord;
use super::Store;

/// What an ingest stored and found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct IngestStats {
    /// Blobs stored.
    pub blobs_new: u64,
    /// Their bytes, before any codec.
    pub bytes_new: u64,
    /// Their bytes as stored in packs.
    pub bytes_stored: u64,
    /// Blobs found in the store (or earlier in this ingest) and referenced.
    pub blobs_found: u64,
    /// Their bytes.
    pub bytes_found: u64,
}

impl IngestStats {
    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &IngestStats) {
        self.blobs_new += other.blobs_new;
        self.bytes_new += other.bytes_new;
        self.bytes_stored += other.bytes_stored;
        self.blobs_found += other.blobs_found;
        self.bytes_found += other.bytes_found;
    }
}

/// Blobs being added; see the module documentation.
pub struct Ingest {
    store: Arc<Store>,
    index: super::BlobIndex,
    pack: Option<PackWriter>,
    /// Blobs in the open pack.
    open: HashSet<[u8; 32]>,
    /// Blobs in packs published by this ingest.
    new: BTreeMap<[u8; 32], Location>,
    /// What was stored and found so far.
    pub stats: IngestStats,
    lock: Arc<StoreLock>,
    /// Whether a blob found in the index is read and checked before it is referenced
    /// ([`Ingest::check_found`]).
    check_found: bool,
    /// Blobs found in the index and checked.
    found_sound: HashSet<[u8; 32]>,
}

impl std::fmt::Debug for Ingest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ingest")
            .field("stats", &self.stats)
            .finish()
    }
}

/// Skeletons and whole files are compressed when that saves at least an eighth.
fn compressed(bytes: &[u8]) -> Option<Vec<u8>> {
    let z = zstd::bulk::compress(bytes, 3).ok()?;
    (z.len() < bytes.len() - bytes.len() / 8).then_some(z)
}

impl Ingest {
    /// Starts adding to `store`: waits while a collection runs. Packs, index runs and
    /// `index.json` are always synced, whatever the writer's durability: other datasets come
    /// to reference the blobs of this one, so a writer without fsync (scratch data) risks only
    /// its own dataset's file.
    pub fn new(store: &Arc<Store>) -> Result<Self> {
        Ingest::with_lock(store, store.locks().adding()?)
    }

    /// [`Ingest::new`] for a writer holding an add's lock already, from an earlier ingest of
    /// the commit it is making ([`Locks::adding_beside_held`](super::locks::Locks::adding_beside_held)):
    /// it does not wait for a collection, which waits for that commit.
    pub fn beside_held(store: &Arc<Store>) -> Result<Self> {
        Ingest::with_lock(store, store.locks().adding_beside_held()?)
    }

    fn with_lock(store: &Arc<Store>, lock: StoreLock) -> Result<Self> {
        let index = store.index()?;
        Ok(Ingest {
            store: Arc::clone(store),
            index,
            pack: None,
            open: HashSet::new(),
            new: BTreeMap::new(),
            stats: IngestStats::default(),
            lock: Arc::new(lock),
            check_found: false,
            found_sound: HashSet::new(),
        })
    }

    /// From now on, a blob found in the index is read and checked against its id before it
    /// is referenced, and stored anew where its copy is damaged (or its pack gone): a lookup
    /// finds the newest copy, so every dataset referencing it reads the sound one. Without
    /// this, what is found is referenced unread, and a copy damaged at rest stays damaged
    /// however often its bytes are added again (what `hspack repair` sends).
    pub fn check_found(&mut self) {
        self.check_found = true;
    }

    /// True when blob `id` is in the store (and sound, where found ones are checked) or was
    /// added by this ingest.
    pub fn has(&mut self, id: &[u8; 32]) -> Result<bool> {
        if self.open.contains(id) || self.new.contains_key(id) || self.found_sound.contains(id) {
            return Ok(true);
        }
        let Some(at) = self.index.find(id) else {
            return Ok(false);
        };
        if !self.check_found {
            return Ok(true);
        }
        match self.store.blob(&at) {
            Ok(_) => {
                self.found_sound.insert(*id);
                Ok(true)
            }
            Err(e) if e.is_damage() => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn found(&mut self, len: u64) {
        self.stats.blobs_found += 1;
        self.stats.bytes_found += len;
    }

    /// Adds blob `bytes` (whose BLAKE3 is `id`, checked by the caller) unless it is there;
    /// `compress` tries zstd. True when stored.
    pub fn put(&mut self, id: [u8; 32], bytes: &[u8], compress: bool) -> Result<bool> {
        if self.has(&id)? {
            self.found(bytes.len() as u64);
            return Ok(false);
        }
        let pack = match &mut self.pack {
            Some(p) => p,
            None => self.pack.insert(PackWriter::create(&**self.store.packs())?),
        };
        let z = if compress { compressed(bytes) } else { None };
        let (stored, codec) = match &z {
            Some(z) => (z.as_slice(), BlobCodec::Zstd),
            None => (bytes, BlobCodec::None),
        };
        pack.push(id, stored, bytes.len() as u64, codec)?;
        self.open.insert(id);
        self.stats.blobs_new += 1;
        self.stats.bytes_new += bytes.len() as u64;
        self.stats.bytes_stored += stored.len() as u64;
        if pack.len() >= PACK_TARGET {
            self.close_pack()?;
        }
        Ok(true)
    }

    fn close_pack(&mut self) -> Result<()> {
        if let Some(p) = self.pack.take() {
            let store = &self.store;
            let (pack, blobs) =
                p.finish(true, &|id, entries| store.pack_there_sound(id, entries))?;
            for blob in blobs {
                self.new.insert(blob.id, Location { pack, blob });
            }
            self.open.clear();
            // Indexed at once: a rerun of an add killed later finds them.
            self.index_new()?;
        }
        Ok(())
    }

    /// Adds file `name` of a dataset, read from `file` (`path` for messages): a shard as its
    /// skeleton and payloads, any other file whole. Payloads already stored are not read.
    /// `handed`: payloads the writer already put into this ingest, by offset, with the hash
    /// it computed (their bytes are not in `file`).
    pub fn put_file(
        &mut self,
        name: &str,
        file: &dyn FileReader,
        path: &Path,
        shard: bool,
        handed: &HashMap<u64, [u8; 32]>,
    ) -> Result<FileRecord> {
        let len = file.len();
        if !shard {
            let bytes = file.read(0..len)?;
            let id = *blake3::hash(&bytes).as_bytes();
            self.put(id, &bytes, true)?;
            return Ok(FileRecord {
                name: name.into(),
                bytes: len,
                blob: hex(&id),
                shard: false,
            });
        }
        let format = |source| Error::Format {
            path: path.to_path_buf(),
            source,
        };
        let tail = file.read(len.saturating_sub(Footer::SIZE as u64)..len)?;
        let footer = Footer::decode(&tail, len).map_err(format)?;
        let index_bytes = file.read(footer.index_offset..footer.index_offset + footer.index_len)?;
        let index = Index::parse(&index_bytes).map_err(format)?;
        let payloads = payloads(&index, footer.index_offset).map_err(format)?;
        // Payloads not stored yet are read and hashed on the pool, a batch at a time, and
        // packed in file order.
        let damaged = |p: &super::skeleton::Payload| {
            Error::StoreDamage {
            path: path.to_path_buf(),
            detail: format!(
                "the chunk payload at byte {} does not hash to the {} its index records: the shard is damaged; nothing of it was stored (verify the source with `hspack verify`)",
                p.offset,
                hex(&p.id)
            ),
        }
        };
        let is_handed = |p: &super::skeleton::Payload| handed.get(&p.offset) == Some(&p.id);
        for batch in payloads.chunks(64) {
            let mut todo: Vec<&super::skeleton::Payload> = Vec::new();
            for p in batch {
                if !is_handed(p) && !self.has(&p.id)? {
                    todo.push(p);
                }
            }
            todo.sort_by_key(|p| p.id);
            todo.dedup_by_key(|p| p.id);
            let read: Vec<([u8; 32], Result<crate::io::FileBytes>)> =
                crate::parallel::install(|| {
                    todo.par_iter()
                        .map(|p| {
                            let got = file.read(p.offset..p.offset + p.len).and_then(|bytes| {
                                match blake3::hash(&bytes).as_bytes() == &p.id {
                                    true => Ok(bytes),
                                    false => Err(damaged(p)),
                                }
                            });
                            (p.id, got)
                        })
                        .collect()
                });
            let mut read: std::collections::HashMap<[u8; 32], Result<crate::io::FileBytes>> =
                read.into_iter().collect();
            for p in batch {
                if is_handed(p) {
                    // Stored (or found) when handed over; counted then.
                    if !self.has(&p.id)? {
                        return Err(Error::StoreDamage {
                            path: path.to_path_buf(),
                            detail: format!(
                                "the chunk payload at byte {} ({}) was handed to the store while the shard was written but is gone: nothing of the shard was published; write it again",
                                p.offset,
                                hex(&p.id)
                            ),
                        });
                    }
                    continue;
                }
                if self.has(&p.id)? {
                    self.found(p.len);
                    continue;
                }
                let bytes = read
                    .remove(&p.id)
                    .expect("read: not stored before this batch")?;
                self.put(p.id, &bytes, false)?;
            }
        }
        let skeleton = skeleton_of(&mut |r| Ok(file.read(r)?.to_vec()), len, &payloads)?;
        map_skeleton(&skeleton).map_err(format)?;
        let id = *blake3::hash(&skeleton).as_bytes();
        self.put(id, &skeleton, true)?;
        Ok(FileRecord {
            name: name.into(),
            bytes: len,
            blob: hex(&id),
            shard: true,
        })
    }

    /// The shared hold of `gc.lock` this ingest took: a writer reads it again to learn
    /// whether a collection revoked it.
    pub fn hold(&self) -> Arc<StoreLock> {
        Arc::clone(&self.lock)
    }

    /// Publishes the last pack and an index run for the new blobs, and adds the run to
    /// `index.json` (merging runs where 8 share a level). Returns the stats and the shared
    /// hold of `gc.lock`: publish what references the blobs, then drop it.
    pub fn commit(mut self) -> Result<(IngestStats, Arc<StoreLock>)> {
        self.close_pack()?;
        Ok((self.stats, self.lock))
    }

    /// Writes an index run for the blobs of the pack just published, and adds it to
    /// `index.json` (merging runs where 8 share a level).
    fn index_new(&mut self) -> Result<()> {
        if !self.new.is_empty() {
            let mut packs: Vec<[u8; 16]> = self.new.values().map(|l| l.pack).collect();
            packs.sort();
            packs.dedup();
            let meta = &**self.store.meta();
            let count = self.new.len() as u64;
            // The run is written and listed under `index.lock`: runs are named by what they
            // hold, so another add of the same blobs writes the same run, and one that
            // merged it away (deleting it) between this write and this listing would leave
            // `index.json` naming a file that is gone.
            let _index = self.store.locks().index()?;
            let run = index::write_run(
                meta,
                std::mem::take(&mut self.new).into_values(),
                count,
                &packs,
                0,
                true,
            )?;
            // The index's lease must still be this add's: an add that hung past it while
            // another took it over (and merged away, and deleted, a run of the same name as
            // this one) would list a run that is gone. And the packs must still be there: a
            // collection deletes unlisted packs once it has revoked the hold of an add that
            // stopped renewing it. That hold is read last, just before `index.json` is
            // replaced, as its loss is the one no compare-and-swap catches.
            let lock = &self.lock;
            add_run(&self.store, run, &|| {
                _index.check()?;
                lock.check()
            })?;
            // The blobs indexed are no longer among `new`: the index read again finds them, so
            // a blob this ingest meets again is referenced, not stored twice.
            self.index = self.store.index()?;
        }
        Ok(())
    }
}

/// Adds `run` to `index.json`, merging the last runs while 8 of them share a level; the runs
/// merged are deleted once the new `index.json` is published. The caller holds `index.lock`;
/// `check` runs just before `index.json` is replaced. A run `index.json` lists already (the
/// same blobs, added by another add) is not listed twice.
fn add_run(store: &Store, run: RunRecord, check: &dyn Fn() -> Result<()>) -> Result<()> {
    let meta = &**store.meta();
    let current = meta.read(INDEX_ROOT)?;
    let mut root = match &current {
        Some(b) => IndexRoot::decode(b).map_err(|source| Error::Format {
            path: meta.path(INDEX_ROOT),
            source,
        })?,
        None => IndexRoot::empty(),
    };
    if root.runs.iter().any(|r| r.file == run.file) {
        return check();
    }
    root.runs.push(run);
    let mut replaced = Vec::new();
    loop {
        let n = root.runs.len();
        let level = root.runs[n - 1].level;
        if n < MERGE_WIDTH
            || root.runs[n - MERGE_WIDTH..]
                .iter()
                .any(|r| r.level != level)
        {
            break;
        }
        let inputs: Vec<RunRecord> = root.runs.split_off(n - MERGE_WIDTH);
        let opened = inputs
            .iter()
            .map(|r| index::open_run_once(meta, r))
            .collect::<Result<Vec<_>>>()?;
        let count = index::merged(&opened).count() as u64;
        let mut packs: Vec<[u8; 16]> = opened.iter().flat_map(|r| r.packs().to_vec()).collect();
        packs.sort();
        packs.dedup();
        let merged =
            index::write_run(meta, index::merged(&opened), count, &packs, level + 1, true)?;
        root.runs.push(merged);
        replaced.extend(inputs.into_iter().map(|r| r.file));
    }
    let bytes = root.encode();
    check()?;
    match &current {
        // Synced always (see `Ingest::new`).
        Some(old) => meta.replace(INDEX_ROOT, &bytes, Some(blake3::hash(old)), true)?,
        None => meta.put_new(INDEX_ROOT, &bytes, true)?,
    }
    for f in replaced {
        meta.delete(&f)?;
    }
    Ok(())
}
