//! `hspack store gc`: mark and sweep (FORMAT.md §11.6).
//!
//! Under the exclusive hold of `gc.lock` (so no add is between finding a blob and publishing
//! what references it, and no pack is being written): mark every blob the named datasets
//! reference (their files, and for shards the payloads their skeletons name); keep the packs
//! whose blobs all live, copy the live blobs of the others into new packs, publish one index
//! run of every live blob, replace `index.json`, and only then delete the packs and runs it
//! no longer lists. A crash before the replacement leaves the old index and its packs
//! (the new packs are unlisted); after it, the new ones (the old packs are unlisted): either
//! way every committed dataset reads, and the next collection removes what is unlisted.
//!
//! In object storage the hold is a lease, which a collection stopped past its life loses:
//! it checks its lease before replacing the index and again before deleting, and deletes
//! only packs and runs that were there when it began, never one an add published since.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::failpoint::failpoint;
use crate::format::manifest::{hex, TEMP_SUFFIX};
use crate::io::Storage;

use super::index::{self, IndexRoot, Location, INDEX_ROOT};
use super::pack::{pack_name, PackWriter, PACK_TARGET};
use super::skeleton::map_skeleton;
use super::snapshot::blob_id;
use super::Store;

/// What a collection did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct GcReport {
    /// Blobs the datasets reference.
    pub blobs_live: u64,
    /// Blobs dropped from the index.
    pub blobs_removed: u64,
    /// Packs kept as they were.
    pub packs_kept: u64,
    /// Packs whose live blobs were copied into new packs.
    pub packs_rewritten: u64,
    /// Packs deleted (no live blob, or rewritten, or listed by no index).
    pub packs_deleted: u64,
    /// Bytes of the packs deleted.
    pub bytes_freed: u64,
    /// Bytes of the new packs.
    pub bytes_written: u64,
    /// Capture files deleted: those of datasets the store no longer has (§11.7).
    pub capture_files_removed: u64,
    /// Staged files deleted: left by writers that died before publishing them.
    pub staged_files_removed: u64,
}

/// The blobs the datasets of `store` reference: files, skeletons and their payloads.
pub fn live_blobs(store: &Store, index: &index::BlobIndex) -> Result<HashSet<[u8; 32]>> {
    let mut live = HashSet::new();
    let root = store.root().display();
    for name in store.names()? {
        // A dataset whose file does not decode references blobs no one can name: they would
        // be judged dead, so the collection stops, before anything is deleted.
        let snap = match store.snapshot(&name) {
            Ok(Some((snap, _))) => snap,
            Ok(None) => continue,
            Err(Error::Format { path, source }) => {
                return Err(Error::StoreDamage {
                    path,
                    detail: format!(
                        "{source}; gc cannot see what dataset `{name}` references, so it \
                         deletes nothing: collect again once it is restored or removed"
                    ),
                })
            }
            Err(e) => return Err(e),
        };
        for f in &snap.files {
            let id = blob_id(&f.blob).expect("checked when read");
            // A blob the index does not list may still lie in a pack the index no longer
            // lists (an `index.json` restored from an older copy): that pack would be deleted
            // as unlisted, so the collection stops, before anything is deleted.
            let listed = |id: &[u8; 32]| match index.find(id) {
                Some(_) => Ok(()),
                None => Err(Error::StoreDamage {
                    path: store.root().join(&name).join(&f.name),
                    detail: format!(
                        "blob {}, which dataset `{name}` references, is in no pack of the \
                         index, so gc deletes nothing (a pack the index does not list, which \
                         may hold it, would be deleted): run `hspack store verify {root}` to \
                         see what is lost, restore the store's `index.json` from a copy or \
                         remove the dataset (`hspack store rm {root} {name}`), then collect \
                         again",
                        hex(id)
                    ),
                }),
            };
            listed(&id)?;
            live.insert(id);
            if f.shard {
                // A collection marks everything each dataset references; one it cannot read
                // stops it, before anything is deleted.
                let skeleton = store
                    .blob_by_id(index, &id)
                    .map_err(|e| Error::StoreDamage {
                        path: store.root().join(&name).join(&f.name),
                        detail: format!(
                            "{e}; gc cannot see what dataset `{name}` references, so it deletes \
                         nothing: restore the dataset from a copy, or remove it (`hspack store \
                         rm {root} {name}`), then collect again"
                        ),
                    })?;
                let map = map_skeleton(&skeleton).map_err(|source| crate::Error::Format {
                    path: store.root().join(&name).join(&f.name),
                    source,
                })?;
                for id in map.payload_ids() {
                    listed(id)?;
                    live.insert(*id);
                }
            }
        }
    }
    Ok(live)
}

fn finish_pack(
    store: &Store,
    w: PackWriter,
    durable: bool,
    moved: &mut HashMap<[u8; 32], Location>,
    new_packs: &mut Vec<[u8; 16]>,
    report: &mut GcReport,
) -> Result<()> {
    report.bytes_written += w.len();
    let (pack, blobs) = w.finish(durable, &|id, entries| store.pack_there_sound(id, entries))?;
    new_packs.push(pack);
    for blob in blobs {
        moved.insert(blob.id, Location { pack, blob });
    }
    Ok(())
}

/// Collects `store`'s garbage; see the module documentation.
pub fn collect(store: &Arc<Store>, durable: bool) -> Result<GcReport> {
    collect_telling(store, durable, &|_| {})
}

/// [`collect`], telling `waiting` when it must first wait for writers to finish their commits.
pub fn collect_telling(
    store: &Arc<Store>,
    durable: bool,
    waiting: &dyn Fn(&str),
) -> Result<GcReport> {
    let held = store.locks().collecting(waiting)?;
    // The runs and packs there now are all this collection may remove: one an add publishes
    // later (were this collection's lease to lapse, a process stopped past its life) is not
    // this collection's to judge.
    let runs_before: HashSet<String> = store.meta().list()?.into_iter().collect();
    let packs_before: HashSet<String> = store.packs().list()?.into_iter().collect();
    let index = store.index()?;
    let live = live_blobs(store, &index)?;
    let mut report = GcReport::default();

    // Per pack: live and dead entries of the index.
    let mut per_pack: HashMap<[u8; 16], (u64, u64)> = HashMap::new();
    let mut live_count = 0u64;
    for e in index.entries() {
        let slot = per_pack.entry(e.pack).or_default();
        if live.contains(&e.blob.id) {
            slot.0 += 1;
            live_count += 1;
        } else {
            slot.1 += 1;
        }
    }
    // Copies of a blob stored again hold their packs' space for nothing: such packs are
    // rewritten without them.
    let mut superseded = 0u64;
    for e in index.superseded() {
        per_pack.entry(e.pack).or_default().1 += 1;
        superseded += 1;
    }
    report.blobs_live = live_count;
    report.blobs_removed = index.entries().count() as u64 - live_count + superseded;
    let rewrite: HashSet<[u8; 16]> = per_pack
        .iter()
        .filter(|(_, (l, d))| *d > 0 && *l > 0)
        .map(|(p, _)| *p)
        .collect();

    // Live blobs of packs being rewritten go into new packs, in id order.
    let mut moved: HashMap<[u8; 32], Location> = HashMap::new();
    let mut out: Option<PackWriter> = None;
    let mut new_packs = Vec::new();
    for e in index.entries() {
        if !live.contains(&e.blob.id) || !rewrite.contains(&e.pack) {
            continue;
        }
        // Checked before it moves: a blob damaged at rest is not copied on as if sound (a
        // reader's memo of checked chunks names a stored file by its path, not its pack).
        let stored = store.stored(&e)?;
        store.checked(&e, stored.clone())?;
        let w = match &mut out {
            Some(w) => w,
            None => out.insert(PackWriter::create(&**store.packs())?),
        };
        w.push(e.blob.id, &stored, e.blob.raw_len, e.blob.codec)?;
        if w.len() >= PACK_TARGET {
            let w = out.take().expect("open");
            finish_pack(store, w, durable, &mut moved, &mut new_packs, &mut report)?;
        }
    }
    if let Some(w) = out.take() {
        finish_pack(store, w, durable, &mut moved, &mut new_packs, &mut report)?;
    }

    // One run of every live blob.
    let mut packs: Vec<[u8; 16]> = per_pack
        .iter()
        .filter(|(p, (l, _))| *l > 0 && !rewrite.contains(*p))
        .map(|(p, _)| *p)
        .chain(new_packs.iter().copied())
        .collect();
    packs.sort();
    let meta = &**store.meta();
    let entries = index
        .entries()
        .filter(|e| live.contains(&e.blob.id))
        .map(|e| moved.get(&e.blob.id).copied().unwrap_or(e));
    let level = index.root.runs.iter().map(|r| r.level).max().unwrap_or(0);
    let run = index::write_run(meta, entries, live_count, &packs, level, durable)?;
    let run_file = run.file.clone();
    // A collection whose lease lapsed while it marked may have judged dead a blob that an
    // add has found since: it must not publish, nor remove anything. Checked here, before
    // waiting for the index's lock, and again last, just before the replacement: a
    // collection that stalled while it took that lock (or while checking it) past its own
    // lease's life would otherwise publish an index without blobs an add found meanwhile.
    held.check()?;
    {
        let index_lock = store.locks().index()?;
        let root = IndexRoot {
            runs: vec![run],
            ..IndexRoot::empty()
        };
        let bytes = root.encode();
        failpoint!("gc-index-locked");
        index_lock.check()?;
        held.check()?;
        match index.root_hash {
            Some(h) => meta.replace(INDEX_ROOT, &bytes, Some(h), durable)?,
            None => meta.put_new(INDEX_ROOT, &bytes, durable)?,
        }
    }
    store.forget_packs();
    failpoint!("gc-index-replaced");
    held.check()?;

    // What the new index does not list: old runs, dropped and rewritten packs, and runs,
    // packs and temp files an interrupted add or collection left.
    for name in meta.list()? {
        let stale = (index::is_run_name(&name) && name != run_file) || name.ends_with(TEMP_SUFFIX);
        if stale && runs_before.contains(&name) {
            meta.delete(&name)?;
        }
    }
    let kept: HashSet<String> = packs.iter().map(pack_name).collect();
    for name in store.packs().list()? {
        if kept.contains(&name) || !packs_before.contains(&name) {
            continue;
        }
        let bytes = store.packs().size(&name)?.unwrap_or(0);
        store.packs().delete(&name)?;
        report.packs_deleted += 1;
        report.bytes_freed += bytes;
    }
    let names = store.names()?;
    let captures = store.captures();
    // A capture file that does not decode is passed over (`capture_files`).
    for (file, f) in store.capture_files()? {
        if names.binary_search(&f.dataset).is_err() {
            captures.delete(&file)?;
            report.capture_files_removed += 1;
        }
    }
    report.staged_files_removed = remove_dead_staging(store)?;
    report.packs_rewritten = rewrite.len() as u64;
    report.packs_kept = (packs.len() - new_packs.len()) as u64;
    if durable {
        store.packs().sync()?;
        meta.sync()?;
    }
    Ok(report)
}

/// Deletes the staged files of datasets no process is writing: a writer holds its dataset's
/// lock before it stages a file, so a lock this collection can take means the files were left
/// by a writer that died.
fn remove_dead_staging(store: &Store) -> Result<u64> {
    let staging = store.staging();
    if !staging.root().is_dir() {
        return Ok(0);
    }
    let mut removed = 0;
    let mut free: HashMap<String, bool> = HashMap::new();
    // Held for the sweep, so no writer of these datasets starts staging meanwhile.
    let mut held = Vec::new();
    for file in staging.list()? {
        let Some(name) = super::storage::staged_dataset(&file) else {
            continue;
        };
        let idle = match free.get(name) {
            Some(&idle) => idle,
            None => {
                let lock = store.locks().dataset(store.root(), name).ok();
                let idle = lock.is_some();
                held.extend(lock);
                free.insert(name.to_string(), idle);
                idle
            }
        };
        if idle {
            staging.delete(&file)?;
            removed += 1;
        }
    }
    Ok(removed)
}
