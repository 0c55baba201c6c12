//! `hspack store du` and `hspack store verify`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::failpoint::failpoint;
use crate::format::manifest::hex;

use super::index::{BlobIndex, INDEX_DAMAGE};
use super::pack::{check_header, decode_table, pack_name, PACK_HEADER};
use super::skeleton::{map_skeleton, skeleton_index};
use super::snapshot::blob_id;
use super::Store;

/// One dataset's sizes.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct DatasetUsage {
    /// Its name.
    pub name: String,
    /// Files.
    pub files: u64,
    /// Samples (from its shards' indexes).
    pub samples: u64,
    /// Bytes of its files: what it takes as a plain dataset.
    pub logical_bytes: u64,
    /// Stored bytes of the blobs no other dataset references.
    pub own_bytes: u64,
    /// Why its sizes are partial: a file of it that cannot be read (the others are counted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub damaged: Option<String>,
}

/// Where the bytes went.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct StoreUsage {
    /// Per dataset.
    pub datasets: Vec<DatasetUsage>,
    /// Sum of the datasets' file bytes.
    pub logical_bytes: u64,
    /// Bytes of the distinct blobs the datasets reference, before codecs.
    pub unique_bytes: u64,
    /// Bytes of those blobs as stored.
    pub stored_bytes: u64,
    /// Bytes of the pack files (stored blobs, pack tables and headers, and garbage until
    /// `store gc`).
    pub pack_bytes: u64,
    /// Bytes of the index runs.
    pub index_bytes: u64,
    /// Saved by samples stored once though given more than once (every payload of the sample
    /// was stored already, by the same dataset).
    pub saved_whole_samples: u64,
    /// Saved by payloads shared between samples that differ (row blocks of a common prefix).
    pub saved_shared_rows: u64,
    /// Saved by blobs another dataset stored first (re-imports, overlapping datasets).
    pub saved_across_datasets: u64,
    /// Saved by compressing skeletons and small files.
    pub saved_compression: i64,
}

/// Sizes of `store`, and how much each kind of deduplication saved.
pub fn usage(store: &Store) -> Result<StoreUsage> {
    // The datasets first, then the index: a writer publishes its blobs' index before the
    // dataset that references them, so a dataset committed meanwhile is not taken for damaged.
    let mut snapshots = Vec::new();
    for name in store.names()? {
        // A name removed since it was listed has no entry; one whose file does not decode is
        // named as damaged, and the others counted.
        match store.snapshot(&name) {
            Ok(Some((snap, _))) => snapshots.push((name, Ok(snap))),
            Ok(None) => {}
            Err(e @ Error::Format { .. }) => snapshots.push((name, Err(e.to_string()))),
            Err(e) => return Err(e),
        }
    }
    let index = store.index()?;
    let mut u = StoreUsage::default();
    // id -> (first dataset, references by dataset)
    let mut first: HashMap<[u8; 32], usize> = HashMap::new();
    let mut users: HashMap<[u8; 32], HashSet<usize>> = HashMap::new();
    let mut seen = |id: [u8; 32], d: usize| -> Option<usize> {
        users.entry(id).or_default().insert(d);
        match first.get(&id) {
            Some(&f) => Some(f),
            None => {
                first.insert(id, d);
                None
            }
        }
    };
    for (d, (name, snap)) in snapshots.into_iter().enumerate() {
        let snap = match snap {
            Ok(snap) => snap,
            Err(damaged) => {
                u.datasets.push(DatasetUsage {
                    name,
                    damaged: Some(damaged),
                    ..DatasetUsage::default()
                });
                continue;
            }
        };
        let mut du = DatasetUsage {
            name: name.clone(),
            files: snap.files.len() as u64,
            ..DatasetUsage::default()
        };
        // A file that cannot be read is named on its dataset; the rest is counted.
        let mut damaged = None;
        let mut count = |f: &super::snapshot::FileRecord| -> Result<()> {
            du.logical_bytes = du.logical_bytes.saturating_add(f.bytes);
            let id = blob_id(&f.blob).expect("checked when read");
            let skeleton = f.shard.then(|| store.blob_by_id(&index, &id)).transpose()?;
            let skeleton_len = skeleton.as_ref().map_or(f.bytes, |s| s.len() as u64);
            if let Some(prev) = seen(id, d) {
                if prev != d {
                    u.saved_across_datasets = u.saved_across_datasets.saturating_add(skeleton_len);
                }
            }
            let Some(skeleton) = skeleton else {
                return Ok(());
            };
            let path = store.root().join(&name).join(&f.name);
            let format = |source| Error::Format {
                path: path.clone(),
                source,
            };
            map_skeleton(&skeleton).map_err(format)?;
            let (_, idx) = skeleton_index(&skeleton).map_err(format)?;
            du.samples = du.samples.saturating_add(idx.sample_count());
            // Payloads by sample: a sample all of whose payloads were stored already by this
            // dataset is a whole repeat.
            let mut by_sample: Vec<Vec<([u8; 32], u64)>> =
                vec![Vec::new(); idx.sample_count() as usize];
            for c in 0..idx.chunk_count() {
                let e = idx.chunk(c).expect("in range");
                if e.stored_len > 0 {
                    // A sample out of the shard's range (damage `store verify` names) is
                    // counted nowhere.
                    let at = e.sample.checked_sub(idx.header().first_ordinal);
                    if let Some(v) = at.and_then(|at| by_sample.get_mut(at as usize)) {
                        v.push((e.hash, e.stored_len));
                    }
                }
            }
            for payloads in by_sample {
                let before: Vec<Option<usize>> =
                    payloads.iter().map(|(id, _)| seen(*id, d)).collect();
                let whole = !payloads.is_empty() && before.iter().all(|b| *b == Some(d));
                for ((_, len), b) in payloads.iter().zip(before) {
                    match b {
                        Some(p) if p != d => {
                            u.saved_across_datasets = u.saved_across_datasets.saturating_add(*len)
                        }
                        Some(_) if whole => {
                            u.saved_whole_samples = u.saved_whole_samples.saturating_add(*len)
                        }
                        Some(_) => u.saved_shared_rows = u.saved_shared_rows.saturating_add(*len),
                        None => {}
                    }
                }
            }
            Ok(())
        };
        for f in &snap.files {
            match count(f) {
                Ok(()) => {}
                // Damage is named on its dataset; any other failure (I/O) is the command's.
                Err(e) if e.is_damage() => {
                    damaged.get_or_insert_with(|| e.to_string());
                }
                Err(e) => return Err(e),
            }
        }
        du.damaged = damaged;
        u.logical_bytes = u.logical_bytes.saturating_add(du.logical_bytes);
        u.datasets.push(du);
    }
    for (id, ds) in &users {
        let Some(at) = index.find(id) else { continue };
        u.unique_bytes = u.unique_bytes.saturating_add(at.blob.raw_len);
        u.stored_bytes = u.stored_bytes.saturating_add(at.blob.stored_len);
        if ds.len() == 1 {
            let d = *ds.iter().next().expect("one");
            u.datasets[d].own_bytes = u.datasets[d].own_bytes.saturating_add(at.blob.stored_len);
        }
    }
    u.saved_compression = (i128::from(u.unique_bytes) - i128::from(u.stored_bytes))
        .clamp(i64::MIN.into(), i64::MAX.into()) as i64;
    for name in store.packs().list()? {
        u.pack_bytes = u
            .pack_bytes
            .saturating_add(store.packs().size(&name)?.unwrap_or(0));
    }
    u.index_bytes = (index.root.runs.iter()).fold(0u64, |a, r| a.saturating_add(r.bytes));
    Ok(u)
}

/// What `store verify` found.
#[derive(Debug, Default, serde::Serialize)]
pub struct StoreCheck {
    /// Packs read.
    pub packs: u64,
    /// Blobs hashed.
    pub blobs: u64,
    /// Bytes hashed.
    pub bytes: u64,
    /// Datasets whose references all resolve.
    pub datasets: u64,
    /// Capture files read and checked (§11.7).
    pub capture_files: u64,
    /// What is wrong, one line each.
    pub problems: Vec<String>,
}

/// Hashes every index run; reads every pack the index lists and hashes every blob; checks every index entry against
/// its pack's table, and that every blob a dataset references (shard payloads included) is
/// in the index.
///
/// Writers and collections may run meanwhile. The datasets are read before the index (a
/// writer publishes its blobs' index before the dataset that references them); a dataset
/// whose blobs are not found is read again, with the index as it is now, before it is called
/// damaged (it was removed or rewritten, and collected); a run or pack that cannot be read
/// is damage only while the index as it is now still lists it (a collection or a merge
/// replaced it). An index that cannot be opened is damage, named.
pub fn check(store: &Arc<Store>) -> Result<StoreCheck> {
    let mut c = StoreCheck::default();
    let mut snapshots = Vec::new();
    for name in store.names()? {
        match store.snapshot(&name) {
            Ok(Some((snap, _))) => snapshots.push((name, snap)),
            Ok(None) => {}
            Err(e) if e.is_damage() => c.problems.push(e.to_string()),
            Err(e) => return Err(e),
        }
    }
    let index = match store.index() {
        Ok(index) => index,
        Err(e) if e.is_damage() => {
            let e = e.to_string();
            c.problems.push(match e.contains(INDEX_DAMAGE) {
                true => e,
                false => format!("{e}; {INDEX_DAMAGE}"),
            });
            return Ok(c);
        }
        Err(e) => return Err(e),
    };
    failpoint!("store-verify-opened");
    // The index as it is now, read once, for what this one lists and cannot be read.
    let mut now: Option<Result<BlobIndex>> = None;
    let mut listed_now = |run: Option<&str>, pack: Option<&[u8; 16]>| -> bool {
        match now.get_or_insert_with(|| store.index()) {
            Ok(i) => {
                run.is_some_and(|f| i.root.runs.iter().any(|r| r.file == f))
                    || pack.is_some_and(|p| i.runs().iter().any(|r| r.packs().contains(p)))
            }
            Err(_) => true,
        }
    };
    // Every run hashed again here, even one this process already checked.
    for r in &index.root.runs {
        if let Err(e) = super::index::open_run(&**store.meta(), r) {
            if listed_now(Some(&r.file), None) {
                c.problems.push(e.to_string());
            }
        }
    }
    let mut tables: HashMap<[u8; 16], HashMap<[u8; 32], super::BlobEntry>> = HashMap::new();
    // Blobs the index finds that do not read: the datasets referencing them are named.
    let mut lost: HashSet<[u8; 32]> = HashSet::new();
    let packs: HashSet<[u8; 16]> = index
        .runs()
        .iter()
        .flat_map(|r| r.packs().to_vec())
        .collect();
    for pack in &packs {
        let name = pack_name(pack);
        let path = store.packs().path(&name);
        let mut problems = Vec::new();
        let result = (|| -> Result<()> {
            let file = store.pack(pack)?;
            let len = file.len();
            let all = file.read(0..len)?;
            let format = |source| Error::Format {
                path: path.clone(),
                source,
            };
            check_header(&all[..PACK_HEADER.min(all.len())], pack).map_err(format)?;
            let table = match decode_table(&all, len).map_err(format)? {
                Ok(t) => t,
                Err(_) => unreachable!("the whole pack was given"),
            };
            let mut t = HashMap::new();
            for e in table {
                let at = super::Location {
                    pack: *pack,
                    blob: e,
                };
                match store.blob(&at) {
                    Ok(b) => {
                        c.blobs += 1;
                        c.bytes += b.len() as u64;
                    }
                    // A copy stored again elsewhere (this one damaged): no read finds this
                    // one, and a collection drops it.
                    Err(_) if index.find(&e.id).is_some_and(|at| at.pack != *pack) => {}
                    Err(err) => {
                        lost.insert(e.id);
                        problems.push(said_here(&err));
                    }
                }
                t.insert(e.id, e);
            }
            tables.insert(*pack, t);
            Ok(())
        })();
        if let Err(e) = result {
            if !listed_now(None, Some(pack)) {
                // Collected since this index was read: not this store's to judge any more.
                continue;
            }
            // What reads find in it: the copies the index finds nowhere newer.
            let held: Vec<super::Location> = index.entries().filter(|e| e.pack == *pack).collect();
            // Every blob of it stored again elsewhere (a repair sent what it held): as for a
            // damaged copy above, no read finds this pack, and a collection drops it.
            if held.is_empty() {
                c.packs += 1;
                continue;
            }
            // A pack whose table is damaged may still hold sound blobs where the index says:
            // only the datasets referencing those that do not read lost anything.
            let unread: Vec<[u8; 32]> = held
                .iter()
                .filter(|at| store.blob(at).is_err())
                .map(|at| at.blob.id)
                .collect();
            let rewritten = unread.is_empty() && index.superseded().any(|e| e.pack == *pack);
            problems.push(match rewritten {
                true => format!(
                    "{e}; every blob reads find in it reads, and the others are stored again \
                     elsewhere: `hspack store gc {}` rewrites it without them",
                    store.root().display()
                ),
                false => e.to_string(),
            });
            lost.extend(unread);
        }
        c.packs += 1;
        c.problems.extend(problems);
    }
    for e in index.entries() {
        let ok = tables
            .get(&e.pack)
            .and_then(|t| t.get(&e.blob.id))
            .is_some_and(|t| *t == e.blob);
        if !ok && tables.contains_key(&e.pack) {
            c.problems.push(format!(
                "{}: blob {} is listed by the index at byte {} but the pack's table disagrees: \
                 the index or the pack is damaged; restore the store from a copy",
                store.packs().path(&pack_name(&e.pack)).display(),
                hex(&e.blob.id),
                e.blob.offset
            ));
        }
    }
    // Datasets removed or rewritten since they were read, and collected (their blobs gone
    // from the index, or their packs rewritten): read again, every dataset first, then the
    // index once, so that none was rewritten after the index it is checked against.
    let mut again = Vec::new();
    for (name, snap) in snapshots {
        if referenced_present(store, &index, &name, &snap, &lost).is_ok() {
            c.datasets += 1;
            continue;
        }
        match store.snapshot(&name) {
            Ok(Some((snap, _))) => again.push((name, snap)),
            Ok(None) => {}
            Err(e) if e.is_damage() => c.problems.push(e.to_string()),
            Err(e) => return Err(e),
        }
    }
    if !again.is_empty() {
        let index_now = store.index()?;
        for (name, snap) in again {
            match referenced_present(store, &index_now, &name, &snap, &lost) {
                Ok(()) => c.datasets += 1,
                // A blob that cannot be read (a pack cut short) is named too, as damage.
                Err(e) => c.problems.push(e.to_string()),
            }
        }
    }
    let captures = store.captures();
    for name in store.capture_names()? {
        let checked = captures
            .read(&name)
            .map(|b| b.map(|b| super::captures::CaptureFile::decode(&b).map(|_| ())));
        match checked {
            Ok(Some(Ok(()))) => c.capture_files += 1,
            Ok(Some(Err(source))) => c.problems.push(format!(
                "{}: {source}: delete it (capture files only let capture runs skip samples the store has)",
                captures.path(&name).display()
            )),
            Ok(None) => {}
            Err(e) => c.problems.push(e.to_string()),
        }
    }
    Ok(c)
}

/// Error `e` of a read of the store, as `store verify` says it: without the advice to run
/// `store verify`, which readers are given (this is it: it names the datasets to mend).
fn said_here(e: &Error) -> String {
    let said = e.to_string();
    let advice = format!("; {}", super::RUN_STORE_VERIFY);
    said.strip_suffix(&advice).unwrap_or(&said).to_string()
}

/// Fails unless every file of dataset `name` opens as a read opens it (its blobs listed, of
/// the lengths recorded) and none of its blobs is one of `lost`, found damaged or missing.
fn referenced_present(
    store: &Arc<Store>,
    index: &BlobIndex,
    name: &str,
    snap: &super::Snapshot,
    lost: &HashSet<[u8; 32]>,
) -> Result<()> {
    let root = store.root().display();
    let advice = format!(
        "add the dataset again from a copy (`hspack store rm {root} {name}`, then `hspack store \
         add {root} COPY --name {name}`: what the store finds damaged of it is stored anew), or \
         remove it"
    );
    let mut hit: Option<(&str, usize)> = None;
    let mut files = 0;
    for f in &snap.files {
        let path = store.root().join(name).join(&f.name);
        // An error of the dataset's own records names it; one of the store's (a pack
        // damaged or gone) is said as what it costs the dataset.
        let named = |e: Error| match e {
            Error::StoreDamage { path: ref p, .. } if *p != path => Error::StoreDamage {
                path: path.clone(),
                detail: format!(
                    "dataset `{name}` references what does not read ({}): {advice}",
                    said_here(&e)
                ),
            },
            e => e,
        };
        super::storage::open_file(store, index, f, path.clone(), &advice).map_err(named)?;
        let id = blob_id(&f.blob).expect("checked when read");
        let mut n = usize::from(lost.contains(&id));
        if f.shard && !lost.is_empty() {
            let skeleton = store.blob_by_id(index, &id).map_err(named)?;
            let map = map_skeleton(&skeleton).map_err(|source| Error::Format { path, source })?;
            n += map.payload_ids().filter(|p| lost.contains(*p)).count();
        }
        if n > 0 {
            files += 1;
            let (_, total) = hit.get_or_insert((f.name.as_str(), 0));
            *total += n;
        }
    }
    match hit {
        None => Ok(()),
        Some((first, n)) => Err(Error::StoreDamage {
            path: store.root().join(name).join(first),
            detail: format!(
                "dataset `{name}` references {} damaged or missing (above), in {}: {advice}",
                crate::error::count(n as u64, "blob"),
                crate::error::count(files as u64, "file")
            ),
        }),
    }
}
