//! `hspack cp` and `hspack sync`: a dataset copied from any storage to any storage, proven.
//!
//! Each shard is read from the source once and checked as it passes: its size, footer and
//! index against the source manifest, every chunk header against the index, every payload
//! against its BLAKE3, every padding byte zero. Then what landed is proven: the shard is
//! opened again at the destination (size, footer, header, index hash against the manifest)
//! and, unless `reread` is off, every chunk read back and hashed (as it lands; into a store,
//! which packs the blobs of many files together, once a group of shards is sent). The samples
//! table is copied and checked against its hash. The manifest goes last: until it is
//! published the destination is not a dataset, so an interrupted copy is never taken for one,
//! and a rerun sends only the shards that are not already there, whole and right (each one
//! found read back, whatever `reread` says). A copy holds the destination's writer lock
//! throughout, so a writer or another copy there is refused, not raced.

use std::collections::HashSet;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rayon::prelude::*;

use crate::error::{format, Error, Result};
use crate::format::manifest::{hex, ListedFile, MANIFEST_FILE};
use crate::format::{ChunkHeader, Manifest, ShardHeader, ShardRecord};
use crate::io::{temp_name, Storage, WriterLease};
use crate::read::{Dataset, Shard};

/// What the destination may hold already.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CopyMode {
    /// No dataset, or this one (a copy being resumed or already done): `hspack cp`.
    #[default]
    Copy,
    /// Also an earlier state of this dataset, whose shards are a prefix of the source's: only
    /// the new shards and the new manifest are sent (`hspack sync`).
    Sync,
}

/// How to copy.
#[derive(Debug, Clone, Copy)]
pub struct CopyOptions {
    /// What the destination may hold.
    pub mode: CopyMode,
    /// Read every chunk back from the destination and hash it (default true). Off, a sent
    /// shard is proven by its size, footer, header and index hash only; a shard found at the
    /// destination is read back either way (nothing checked its chunks on the way).
    pub reread: bool,
    /// Shards copied at once.
    pub jobs: usize,
}

impl Default for CopyOptions {
    fn default() -> Self {
        CopyOptions {
            mode: CopyMode::Copy,
            reread: true,
            jobs: 4,
        }
    }
}

/// What a copy did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CopyReport {
    /// Shards in the source.
    pub shards: u64,
    /// Samples in the source.
    pub samples: u64,
    /// Shards sent.
    pub shards_sent: u64,
    /// Bytes of the shards sent.
    pub bytes_sent: u64,
    /// Shards found at the destination, whole and right, and not sent again.
    pub shards_present: u64,
    /// Bytes of those.
    pub bytes_present: u64,
    /// Shards found at the destination that were not right (another dataset's, or cut
    /// short), replaced: bytes sent again.
    pub shards_replaced: Vec<String>,
    /// Chunks checked against their BLAKE3 as they passed.
    pub chunks_checked: u64,
    /// Bytes read back from the destination and hashed.
    pub bytes_reread: u64,
    /// True when this run published the manifest (false: the destination had it already).
    pub manifest_published: bool,
    /// The dataset digest, the same at both ends.
    pub digest: String,
}

/// Copies `src` to `dst`; see the module's documentation. `progress` is called with bytes as
/// they are sent or found present.
pub fn copy(
    src: &Dataset,
    dst: &Arc<dyn Storage>,
    options: &CopyOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<CopyReport> {
    let manifest = src.manifest();
    let jobs = crate::parallel::checked_jobs("jobs", options.jobs)?;
    crate::store::refuse_root(&**dst)?;
    if super::same_place(src.dir(), dst.root()) {
        // Nothing would be sent, and the report would read as a copy made.
        return Err(Error::CopyRefused {
            path: dst.root().to_path_buf(),
            detail: "it is the source itself (the same folder or URL); name where the copy \
                     goes"
                .into(),
        });
    }
    super::refuse_nested(src.dir(), dst.root())?;
    crate::write::destination::refuse_foreign_folder(&**dst)?;
    dst.create_root()?;
    // The destination's writer lock, held until the manifest is published: a writer there
    // (or another copy) would otherwise race this one for its shard names, and this copy
    // would remove a shard it had just published as one that is not listed. Taken before
    // the destination's manifest is read; a refusal (only where a manifest is, so the folder
    // was there) sends nothing.
    let lock = dst.lock()?;
    let existing = destination_manifest(src, dst, options.mode)?;
    let present: HashSet<String> = dst.list()?.into_iter().collect();
    let listed: HashSet<&str> = existing
        .as_ref()
        .map(|(m, _, _)| m.shards.iter().map(|s| s.file.as_str()).collect())
        .unwrap_or_default();
    let same_state = existing
        .as_ref()
        .is_some_and(|(_, _, bytes)| bytes[..] == *src.manifest_bytes());
    let stats = Stats::default();
    let replaced = std::sync::Mutex::new(Vec::new());
    let pool = rayon::ThreadPoolBuilder::new()
        // No more threads than shards to send.
        .num_threads(jobs.min(manifest.shards.len()).max(1))
        .build()
        .map_err(|e| Error::BadOption {
            option: "jobs",
            detail: e.to_string(),
        })?;
    // A writer committing to the source replaces segments and key runs as it merges them:
    // one gone already is said before any shard is sent. (They are sent last, as a store
    // destination has always added them.)
    for f in manifest.listed_files() {
        if src.storage().size(f.file)?.is_none() {
            return Err(source_changed(src, dst, f.file));
        }
    }
    // A shard found at the destination is proven before it counts; one sent, right after it
    // lands, or, where the destination batches new files, once its group is sent.
    let batched = dst.batches_new_files();
    let place = |seq: usize| -> Result<Option<usize>> {
        let record = &manifest.shards[seq];
        if present.contains(&record.file) {
            // Read back whatever `reread` says: no run checked its bytes on the way (a copy
            // killed between a put and its proof leaves one, and so does damage at rest), so
            // its index alone proves nothing of its chunks.
            match prove(src, dst, record, true, &stats) {
                Ok(()) => {
                    stats.shards_present.fetch_add(1, Ordering::Relaxed);
                    stats
                        .bytes_present
                        .fetch_add(record.bytes, Ordering::Relaxed);
                    progress(record.bytes);
                    return Ok(None);
                }
                // A shard the destination's own manifest lists is its committed data: damage
                // there is for `hspack repair`, never silently overwritten.
                Err(e) if listed.contains(record.file.as_str()) => {
                    // Unless the lease was lost: the shard may be another's since.
                    still_held(&*lock, dst)?;
                    return Err(listed_shard_failed(e, src, dst, record, same_state));
                }
                Err(_) => {
                    // Not this copy's to delete once another holds the destination: the
                    // lease is read again right before.
                    still_held(&*lock, dst)?;
                    dst.delete(&record.file)?;
                    replaced
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(record.file.clone());
                }
            }
        }
        // A copy that stalled past its lease sends nothing more: the destination may be
        // another copy's or writer's now.
        still_held(&*lock, dst)?;
        send_shard(src, seq, dst, &stats, progress)?;
        match batched {
            true => Ok(Some(seq)),
            false => prove_sent(src, seq, dst, &*lock, options.reread, &stats).map(|()| None),
        }
    };
    for group in shard_groups(manifest, batched, jobs) {
        let sent = pool.install(|| {
            group
                .into_par_iter()
                .filter_map(|seq| place(seq).transpose())
                .collect::<Result<Vec<usize>>>()
        })?;
        pool.install(|| {
            sent.into_par_iter()
                .try_for_each(|seq| prove_sent(src, seq, dst, &*lock, options.reread, &stats))
        })?;
    }
    // The files besides shards: each put where none is, or over the one read there, and
    // only while the destination is still this copy's.
    copy_listed_files(src, dst, &*lock, &|_| true)?;
    let published = publish_manifest(src, dst, existing.as_ref(), &*lock)?;
    if let (true, Some((before, _, _))) = (published, &existing) {
        // A sync over an earlier state: the segments and key runs the source's merges
        // replaced, as a writer removes them once its manifest is published.
        for name in crate::write::segments::Mark::of(before).files_replaced_in(manifest, &[]) {
            let _ = dst.delete(&name);
        }
    }
    let mut replaced = replaced.into_inner().unwrap_or_else(|e| e.into_inner());
    replaced.sort();
    Ok(CopyReport {
        shards: manifest.shards.len() as u64,
        samples: manifest.samples,
        shards_sent: stats.shards_sent.into_inner(),
        bytes_sent: stats.bytes_sent.into_inner(),
        shards_present: stats.shards_present.into_inner(),
        bytes_present: stats.bytes_present.into_inner(),
        shards_replaced: replaced,
        chunks_checked: stats.chunks_checked.into_inner(),
        bytes_reread: stats.bytes_reread.into_inner(),
        manifest_published: published,
        digest: hex(blake3::hash(src.manifest_bytes()).as_bytes()),
    })
}

/// Fails unless the destination's lock is still this copy's, read again now
/// ([`WriterLease::confirm`]): asked right before each change a copy or repair makes there
/// beyond its own new shards. A lost lease is said as what it means for a copy.
pub(crate) fn still_held(lock: &dyn WriterLease, dst: &Arc<dyn Storage>) -> Result<()> {
    lock.confirm().map_err(|e| match e {
        Error::CommitConflict { detail, .. } => Error::CopyRefused {
            path: dst.root().to_path_buf(),
            detail: format!(
                "{detail}; another copy or writer may hold the destination now, so this run \
                 stopped before changing anything more there: see what the destination holds \
                 with `hspack verify {}`, then run again",
                dst.root().display()
            ),
        },
        e => e,
    })
}

#[derive(Default)]
pub(crate) struct Stats {
    shards_sent: AtomicU64,
    bytes_sent: AtomicU64,
    shards_present: AtomicU64,
    bytes_present: AtomicU64,
    chunks_checked: AtomicU64,
    bytes_reread: AtomicU64,
}

/// The destination's manifest and its hash, when it has one this copy may go on from;
/// refuses the others before anything is sent.
fn destination_manifest(
    src: &Dataset,
    dst: &Arc<dyn Storage>,
    mode: CopyMode,
) -> Result<Option<(Manifest, blake3::Hash, Vec<u8>)>> {
    let Some(bytes) = dst.read(MANIFEST_FILE)? else {
        return Ok(None);
    };
    let refuse = |detail: String| Error::CopyRefused {
        path: dst.root().to_path_buf(),
        detail,
    };
    if bytes == src.manifest_bytes() {
        // The copy is there, or was published and lost a part since: what it lists is
        // proven or sent again below, as for a new copy.
        let theirs = src.manifest().clone();
        return Ok(Some((theirs, blake3::hash(&bytes), bytes)));
    }
    let mut theirs = Manifest::decode(&bytes).map_err(|e| {
        refuse(format!(
            "it holds a manifest.json that does not decode ({e}); nothing was sent: choose \
             an empty destination"
        ))
    })?;
    crate::read::manifest_load::add_segments(&**dst, &mut theirs).map_err(|e| {
        refuse(format!(
            "the segments its manifest.json lists do not read ({e}); nothing was sent: \
             choose an empty destination"
        ))
    })?;
    let ours = src.manifest();
    let found = Some((theirs.clone(), blake3::hash(&bytes), bytes.clone()));
    let prefix = theirs.dataset_id == ours.dataset_id
        && theirs.schema == ours.schema
        && theirs.shards.len() <= ours.shards.len()
        && theirs.shards.iter().zip(&ours.shards).all(|(a, b)| a == b);
    match (prefix, mode) {
        (true, CopyMode::Sync) => Ok(found),
        (true, CopyMode::Copy) => Err(refuse(format!(
            "it holds an earlier state of this dataset ({} of the source's {} shards); \
             nothing was sent: `hspack sync` sends the new shards and the new manifest",
            theirs.shards.len(),
            ours.shards.len()
        ))),
        (false, _) if theirs.dataset_id == ours.dataset_id => Err(refuse(format!(
            "it holds a copy of this dataset (id {}) that is not an earlier state of the \
             source: {}; the two have diverged (each was written to after they parted), so \
             nothing was sent or replaced: copy into an empty destination (what only the \
             destination holds stays there)",
            ours.dataset_id,
            divergence(&theirs, ours)
        ))),
        (false, _) => Err(refuse(format!(
            "it holds another dataset (its id {}, {} samples; the source's id is {}); nothing \
             was sent or replaced: choose an empty destination",
            theirs.dataset_id, theirs.samples, ours.dataset_id
        ))),
    }
}

/// Where `theirs`, a manifest of the same dataset, parts from `ours`, in words.
fn divergence(theirs: &Manifest, ours: &Manifest) -> String {
    if theirs.schema != ours.schema {
        return "its schema differs".into();
    }
    if theirs.shards.len() > ours.shards.len() {
        return format!(
            "it holds {} shards, the source {}",
            theirs.shards.len(),
            ours.shards.len()
        );
    }
    match theirs
        .shards
        .iter()
        .zip(&ours.shards)
        .position(|(a, b)| a != b)
    {
        Some(at) => format!("their shard {} differs", theirs.shards[at].file),
        None => "it differs from the source".into(),
    }
}

/// Opens shard `record` at the destination and checks it against the source's manifest.
pub(crate) fn check_at(
    src: &Dataset,
    dst: &Arc<dyn Storage>,
    record: &ShardRecord,
) -> Result<Shard> {
    Shard::open(
        &**dst,
        record,
        src.manifest().dataset_id_bytes(),
        src.schema(),
        None,
    )
}

/// Streams shard `seq` to the destination, checking every chunk as it passes, and publishes
/// it where no file is.
pub(crate) fn send_shard(
    src: &Dataset,
    seq: usize,
    dst: &Arc<dyn Storage>,
    stats: &Stats,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<()> {
    // Opened for this copy only: a dataset of more shards than a process may map is sent.
    let shard = src.open_shard(seq)?;
    let record = &src.manifest().shards[seq];
    let schema = src.schema();
    let mut out = dst.create(&temp_name(&record.file))?;
    let mut pos = 0u64;
    let mut put = |bytes: &[u8], pos: &mut u64| -> Result<()> {
        out.write_at(*pos, bytes)?;
        *pos += bytes.len() as u64;
        progress(bytes.len() as u64);
        Ok(())
    };
    put(&shard.read(0..ShardHeader::SIZE as u64)?, &mut pos)?;
    let index = shard.index();
    let index_at = shard.footer().index_offset;
    for c in 0..index.chunk_count() {
        let e = index.chunk(c).expect("in range");
        shard.scan_to(pos..e.offset, index_at)?;
        put(&shard.padding(pos, e.offset)?, &mut pos)?;
        let end = e.offset + ChunkHeader::SIZE as u64 + e.stored_len;
        shard.scan_to(pos..end, index_at)?;
        let bytes = shard.read(e.offset..end)?;
        shard.check_chunk_bytes(c, &e, &bytes, schema)?;
        stats.chunks_checked.fetch_add(1, Ordering::Relaxed);
        put(&bytes, &mut pos)?;
    }
    put(&shard.padding(pos, index_at)?, &mut pos)?;
    shard.forget_ahead();
    // The index and footer were checked against the manifest when the shard was opened.
    put(&shard.read(index_at..record.bytes)?, &mut pos)?;
    out.sync_all()?;
    match out.publish_new(&record.file, true) {
        Ok(()) => Ok(()),
        // Another copy published it meanwhile: right, or an error below.
        Err(Error::CommitConflict { .. }) => check_at(src, dst, record).map(drop),
        Err(e) => Err(e),
    }
}

/// The shards of `manifest` in the groups a copy sends before it proves them: all in one,
/// proven each as it lands, unless the destination batches new files; then groups of up to
/// 1024 shards or 1 GiB, each of at least `jobs` shards, so that shards are still sent
/// `jobs` at a time.
fn shard_groups(manifest: &Manifest, batched: bool, jobs: usize) -> Vec<Range<usize>> {
    const GROUP_SHARDS: usize = 1024;
    const GROUP_BYTES: u64 = 1 << 30;
    let n = manifest.shards.len();
    if !batched {
        return std::iter::once(0..n).collect();
    }
    let mut groups = Vec::new();
    let (mut start, mut bytes) = (0, 0u64);
    for (seq, record) in manifest.shards.iter().enumerate() {
        let len = seq - start;
        if len >= GROUP_SHARDS || (bytes >= GROUP_BYTES && len >= jobs) {
            groups.push(start..seq);
            (start, bytes) = (seq, 0);
        }
        bytes += record.bytes;
    }
    groups.push(start..n);
    groups
}

/// Proves shard `seq`, just sent; a store that referred what it found to a damaged copy is
/// sent it once more. What fails to prove is deleted.
fn prove_sent(
    src: &Dataset,
    seq: usize,
    dst: &Arc<dyn Storage>,
    lock: &dyn WriterLease,
    reread: bool,
    stats: &Stats,
) -> Result<()> {
    let record = &src.manifest().shards[seq];
    let mut proven = prove(src, dst, record, reread, stats);
    // A store refers what it finds to its copy unread: a copy damaged at rest is what
    // landed. Sent once more, with what the store finds checked first.
    if matches!(&proven, Err(e) if e.is_damage()) && dst.check_copies_found() {
        still_held(lock, dst)?;
        dst.delete(&record.file)?;
        send_shard(src, seq, dst, stats, &|_| {})?;
        proven = prove(src, dst, record, reread, stats);
    }
    if let Err(e) = proven {
        // What landed is not what was sent: never to be taken for the shard (a rerun
        // without --reread would check only its index). Deleted only while the destination
        // is still this copy's: else the object there may be the copy's that took it over.
        // Where the lease was lost, that is what happened: the object there may be the
        // other's, which is no damage and no reason to run again.
        still_held(lock, dst)?;
        let _ = dst.delete(&record.file);
        return Err(e);
    }
    stats.shards_sent.fetch_add(1, Ordering::Relaxed);
    stats.bytes_sent.fetch_add(record.bytes, Ordering::Relaxed);
    Ok(())
}

/// Proves what landed: the shard opens at the destination against the manifest; with
/// `reread`, it is checked as verify checks it (every chunk header and payload hash, every
/// padding byte zero): the bytes the hash tree does not cover are zero and the others are
/// covered, so a shard that passes is the source's, byte for byte.
pub(crate) fn prove(
    src: &Dataset,
    dst: &Arc<dyn Storage>,
    record: &ShardRecord,
    reread: bool,
    stats: &Stats,
) -> Result<()> {
    let landed = check_at(src, dst, record)?;
    if !reread {
        return Ok(());
    }
    let (problems, _) = crate::verify::check_layout(&landed, src.schema(), true, true, &|_| {});
    if let Some(first) = problems.into_iter().next() {
        return Err(first);
    }
    stats
        .bytes_reread
        .fetch_add(record.bytes, Ordering::Relaxed);
    Ok(())
}

/// Copies the files the manifest lists besides shards (the samples table; segments, key runs
/// and table parts) that `wanted` names and the destination lacks or holds damaged, each
/// checked against its hash in the manifest at both ends. Returns the names copied.
pub(crate) fn copy_listed_files(
    src: &Dataset,
    dst: &Arc<dyn Storage>,
    lock: &dyn WriterLease,
    wanted: &dyn Fn(&str) -> bool,
) -> Result<Vec<String>> {
    let hash = |b: &[u8]| hex(blake3::hash(b).as_bytes());
    let mut copied = Vec::new();
    let mut sent = Vec::new();
    let batched = dst.batches_new_files();
    for f in src.manifest().listed_files() {
        let want = f.blake3.to_ascii_lowercase();
        if !wanted(f.file) {
            continue;
        }
        let there = match dst.read(f.file) {
            Ok(there) => there,
            // A store's blob of it lost or damaged at rest: put anew, with what the store
            // finds checked first.
            Err(e) if e.is_damage() && dst.check_copies_found() => {
                still_held(lock, dst)?;
                dst.delete(f.file)?;
                None
            }
            Err(e) => return Err(e),
        };
        if there.as_ref().is_some_and(|b| hash(b) == want) {
            continue;
        }
        let bytes = read_listed(src, dst, f)?;
        // Put only where nothing is, or over the bytes just read there: a copy that stalled
        // past its lease never overwrites what the copy that took over wrote since.
        still_held(lock, dst)?;
        match &there {
            None => dst.put_new(f.file, &bytes, true),
            Some(found) => dst.replace(f.file, &bytes, Some(blake3::hash(found)), true),
        }
        .map_err(|e| changed_meanwhile(e, dst))?;
        match batched {
            // Read back once all are put, as shards are.
            true => sent.push(f),
            false => prove_put(src, dst, lock, f)?,
        }
        copied.push(f.file.to_string());
    }
    for f in sent {
        prove_put(src, dst, lock, f)?;
    }
    Ok(copied)
}

/// Listed file `f` read from the source, checked against what the manifest records of it.
fn read_listed(src: &Dataset, dst: &Arc<dyn Storage>, f: ListedFile<'_>) -> Result<Vec<u8>> {
    let Some(bytes) = src.storage().read(f.file)? else {
        return Err(source_changed(src, dst, f.file));
    };
    let hash = hex(blake3::hash(&bytes).as_bytes());
    if hash != f.blake3.to_ascii_lowercase() || bytes.len() as u64 != f.bytes {
        return Err(Error::SamplesTable {
            path: src.storage().path(f.file),
            detail: "it does not match its hash in the manifest; run `hspack reindex` on the \
                     source, then copy again"
                .into(),
        });
    }
    Ok(bytes)
}

/// Proves listed file `f`, just put: it reads back as the manifest records it. A store refers
/// the bytes to a copy it holds, unread: one damaged or lost at rest is what landed, so it is
/// put once more (read from the source again), with what the store finds checked first.
fn prove_put(
    src: &Dataset,
    dst: &Arc<dyn Storage>,
    lock: &dyn WriterLease,
    f: ListedFile<'_>,
) -> Result<()> {
    let want = f.blake3.to_ascii_lowercase();
    let sound = |landed: Result<Option<Vec<u8>>>| match landed {
        Ok(Some(b)) => Ok(hex(blake3::hash(&b).as_bytes()) == want),
        Ok(None) => Ok(false),
        Err(e) if e.is_damage() => Ok(false),
        Err(e) => Err(e),
    };
    let mut landed = sound(dst.read(f.file))?;
    if !landed && dst.check_copies_found() {
        let bytes = read_listed(src, dst, f)?;
        still_held(lock, dst)?;
        dst.delete(f.file)?;
        dst.put_new(f.file, &bytes, true)
            .map_err(|e| changed_meanwhile(e, dst))?;
        landed = sound(dst.read(f.file))?;
    }
    match landed {
        true => Ok(()),
        false => Err(Error::SamplesTable {
            path: dst.path(f.file),
            detail: "what landed does not match its hash; copy again".into(),
        }),
    }
}

/// File `file` the source's manifest lists is gone. When the manifest there is another now, a
/// writer committing to the source merged its segments since it was opened and removed those
/// this copy was to send: the source changed, it is not damaged. Else the source lost it.
fn source_changed(src: &Dataset, dst: &Arc<dyn Storage>, file: &str) -> Error {
    let path = src.storage().path(file);
    match src.storage().read(MANIFEST_FILE) {
        Ok(Some(now)) if now == src.manifest_bytes() => Error::SamplesTable {
            path,
            detail: "the source's manifest lists it and it is missing; run `hspack reindex` on \
                     the source (or `hspack repair` from another copy), then copy again"
                .into(),
        },
        _ => Error::CopyRefused {
            path: dst.root().to_path_buf(),
            detail: format!(
                "the source's {} was listed by its manifest when the copy began, and a writer \
                 committing to the source has since replaced it; the source's manifest was not \
                 published here: run the copy again (what was sent is kept)",
                path.display()
            ),
        },
    }
}

/// Why a shard the destination's manifest lists failed its proof, `e`: damage is refused with
/// how to mend it (`repair` from the source where the destination holds the source's state,
/// `same_state`; else from a copy of its own state), any other error is returned as it is.
fn listed_shard_failed(
    e: Error,
    src: &Dataset,
    dst: &Arc<dyn Storage>,
    record: &ShardRecord,
    same_state: bool,
) -> Error {
    if !e.is_damage() {
        return e;
    }
    let mend = match same_state {
        true => format!(
            "run `hspack repair {} --from {}`, which sends it again",
            dst.root().display(),
            src.dir().display()
        ),
        false => format!(
            "the destination holds an earlier state of the dataset: repair it from a copy of \
             that state (`hspack repair {} --from COPY`), or copy into a new destination",
            dst.root().display()
        ),
    };
    Error::CopyRefused {
        path: dst.path(&record.file),
        detail: format!(
            "the destination's manifest lists this shard and it is damaged there ({e}); a copy \
             never overwrites what a manifest lists: {mend}"
        ),
    }
}

/// Publishes the source's manifest at the destination, last: where none is, or over the
/// earlier state whose hash is `existing` (never over anything else). False when the
/// destination has it already.
///
/// The destination's lock is read again first: a copy that stalled past its lease's life,
/// which another copy or writer then took, publishes nothing (its shards, proven before, may
/// since have been replaced by the other's). A manifest read back other than the one put is
/// taken back only while the lock is still this copy's.
fn publish_manifest(
    src: &Dataset,
    dst: &Arc<dyn Storage>,
    existing: Option<&(Manifest, blake3::Hash, Vec<u8>)>,
    lock: &dyn WriterLease,
) -> Result<bool> {
    let previous: &[u8] = existing.map_or(&[], |(_, _, b)| b);
    let existing = existing.map(|(_, h, _)| *h);
    let bytes = src.manifest_bytes();
    still_held(lock, dst)?;
    let published = match existing {
        None => {
            dst.put_new(MANIFEST_FILE, bytes, true)
                .map_err(|e| changed_meanwhile(e, dst))?;
            true
        }
        Some(hash) if hash == blake3::hash(bytes) => false,
        Some(hash) => {
            dst.replace(MANIFEST_FILE, bytes, Some(hash), true)
                .map_err(|e| changed_meanwhile(e, dst))?;
            true
        }
    };
    let landed = dst.read(MANIFEST_FILE)?.unwrap_or_default();
    if landed != bytes {
        // Damaged on the way: taken back, so that nothing takes it for the dataset (unless
        // another holds the destination now: what is there is then its own).
        still_held(lock, dst)?;
        match existing {
            None => dst.delete(MANIFEST_FILE)?,
            // Only over what landed: another manifest there now is not this copy's.
            Some(_) => dst.replace(MANIFEST_FILE, previous, Some(blake3::hash(&landed)), true)?,
        }
        return Err(format(dst.path(MANIFEST_FILE))(
            crate::format::FormatError::Invalid {
                structure: "manifest",
                what: "bytes read back",
                value: landed.len() as u64,
                rule: "the source's manifest, byte for byte".into(),
            },
        ));
    }
    // A put can land long after the lease was last read (a client retrying a slow put): a
    // copy or writer that took the destination over meanwhile may have replaced what this
    // one sent. Where the lease is this copy's no longer, what the manifest lists is checked
    // again before the copy is said to have landed.
    if published && still_held(lock, dst).is_err() {
        recheck_listed(src, dst).map_err(|e| Error::CopyRefused {
            path: dst.root().to_path_buf(),
            detail: format!(
                "this copy's hold on the destination lapsed while its manifest was on the way, \
                 and another copy or writer changed what is there: {e}; the manifest this copy \
                 put lists files it did not write: verify the destination (`hspack verify`), \
                 then copy again"
            ),
        })?;
    }
    Ok(published)
}

/// A put refused because the file is not what the copy found there (a writer's conflict),
/// said as what it means for a copy.
fn changed_meanwhile(e: Error, dst: &Arc<dyn Storage>) -> Error {
    match e {
        Error::CommitConflict { path, detail } => Error::CopyRefused {
            path,
            detail: format!(
                "{detail}; another copy or writer changed the destination while this copy \
                 held it, so this file was not put: see what {} holds (`hspack verify`), then \
                 copy again",
                dst.root().display()
            ),
        },
        e => e,
    }
}

/// What `src`'s manifest lists, checked again at `dst`: the files besides shards by their
/// hashes, and each shard opened against its record (its dataset, place and index).
fn recheck_listed(src: &Dataset, dst: &Arc<dyn Storage>) -> Result<()> {
    for f in src.manifest().listed_files() {
        let there = dst.read(f.file)?;
        let want = f.blake3.to_ascii_lowercase();
        if there.is_none_or(|b| hex(blake3::hash(&b).as_bytes()) != want) {
            return Err(Error::SamplesTable {
                path: dst.path(f.file),
                detail: "it is not the file the manifest lists".into(),
            });
        }
    }
    crate::parallel::install(|| {
        src.manifest()
            .shards
            .par_iter()
            .try_for_each(|record| check_at(src, dst, record).map(drop))
    })
}
