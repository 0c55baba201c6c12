//! The store's blob index (FORMAT.md §11.3): sorted runs of 64-byte entries, found by a
//! 256-way fan-out and a binary search, listed by `index.json`. Each add writes one run of
//! what it stored; when the last 8 runs share a level they are merged into one of the next
//! level, so a store lists a few runs per level and a lookup costs a few searches, whatever
//! its size. Runs are mapped, not loaded: memory does not grow with the store.

use std::borrow::Borrow;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::failpoint::failpoint;
use crate::format::manifest::hex;
use crate::format::FormatError;
use crate::io::{FileBytes, Storage};

use super::pack::{invalid, magic, u64_at, version, BlobCodec, BlobEntry};

/// Magic of an index run.
pub const RUN_MAGIC: &[u8; 8] = b"HSPKSIDX";
/// Index run format version.
pub const RUN_VERSION: u16 = 1;
/// Bytes of a run header.
pub const RUN_HEADER: usize = 64;
/// Bytes of a run entry.
pub const RUN_ENTRY: usize = 64;
/// Fan-out buckets (by the id's first byte).
pub const FANOUT: usize = 256;
/// Runs of one level merged into one of the next.
pub const MERGE_WIDTH: usize = 8;
/// The index root's file name.
pub const INDEX_ROOT: &str = "index.json";
/// What to do about a blob index that cannot be opened, said by every error that names one.
pub const INDEX_DAMAGE: &str = "the store's blob index is damaged, and every dataset of the \
     store is read through it: restore index.json and the runs it lists from a copy of the \
     store (hspack has no command that rebuilds the index from the packs' tables)";

/// Where a blob is: its pack and its place there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    /// The pack's id.
    pub pack: [u8; 16],
    /// The blob in the pack.
    pub blob: BlobEntry,
}

/// One run as `index.json` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    /// File name.
    pub file: String,
    /// Bytes.
    pub bytes: u64,
    /// BLAKE3 of the file.
    pub blake3: String,
    /// Entries.
    pub entries: u64,
    /// Merge level: 0 for an add's run.
    pub level: u32,
}

/// `index.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IndexRoot {
    /// `hspack-store-index`.
    pub format: String,
    /// 1.
    pub version: u32,
    /// Runs, oldest first.
    pub runs: Vec<RunRecord>,
}

/// The `format` of `index.json`.
pub const INDEX_FORMAT: &str = "hspack-store-index";

impl IndexRoot {
    /// An empty index.
    pub fn empty() -> Self {
        IndexRoot {
            format: INDEX_FORMAT.into(),
            version: 1,
            runs: Vec::new(),
        }
    }

    /// Parses `index.json`, refusing another format or version and names that are not runs.
    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        crate::format::version::refuse_unknown_version(bytes, "store index.json", 1, 1)?;
        let root: IndexRoot = serde_json::from_slice(bytes).map_err(|e| FormatError::Json {
            structure: "store index.json",
            detail: e.to_string(),
        })?;
        if root.format != INDEX_FORMAT {
            return Err(FormatError::Json {
                structure: "store index.json",
                detail: format!("format is `{}`, not `{INDEX_FORMAT}`", root.format),
            });
        }
        if root.version != 1 {
            return Err(FormatError::UnsupportedVersion {
                structure: "store index.json",
                found: root.version.into(),
                min: 1,
                max: 1,
            });
        }
        for r in &root.runs {
            if !is_run_name(&r.file)
                || r.blake3.len() != 64
                || run_len(r.entries, 0).is_none_or(|least| r.bytes < least)
            {
                return Err(FormatError::Json {
                    structure: "store index.json",
                    detail: format!("run `{}` is not a run record", r.file),
                });
            }
        }
        Ok(root)
    }

    /// The canonical bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).expect("serializable");
        v.push(b'\n');
        v
    }
}

/// True for a run's file name: `index-<32 hex>.run`.
pub fn is_run_name(name: &str) -> bool {
    name.strip_prefix("index-")
        .and_then(|s| s.strip_suffix(".run"))
        .is_some_and(|h| h.len() == 32 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Bytes of a run of `entries` entries naming `packs` packs.
fn run_len(entries: u64, packs: u64) -> Option<u64> {
    (RUN_HEADER as u64 + FANOUT as u64 * 8)
        .checked_add(packs.checked_mul(16)?)?
        .checked_add(entries.checked_mul(RUN_ENTRY as u64)?)
}

fn entry_bytes(e: &Location, pack: u32) -> [u8; RUN_ENTRY] {
    let mut b = [0u8; RUN_ENTRY];
    b[..32].copy_from_slice(&e.blob.id);
    b[32..36].copy_from_slice(&pack.to_le_bytes());
    b[36] = e.blob.codec.code();
    b[40..48].copy_from_slice(&e.blob.offset.to_le_bytes());
    b[48..56].copy_from_slice(&e.blob.stored_len.to_le_bytes());
    b[56..64].copy_from_slice(&e.blob.raw_len.to_le_bytes());
    b
}

/// Entries of a run checked between two releases of their pages (8 MiB).
const RELEASE_ENTRIES: u64 = 1 << 17;

/// A run, checked and ready for lookups.
#[derive(Debug)]
pub struct Run {
    bytes: FileBytes,
    packs: Vec<[u8; 16]>,
    fanout: Vec<u64>,
    entries: u64,
    start: usize,
}

impl Run {
    /// Checks a run's bytes: header, pack table, fan-out, and every entry in strictly
    /// increasing id order with a known codec and a pack of its table.
    pub fn parse(bytes: FileBytes) -> Result<Self, FormatError> {
        let b: &[u8] = &bytes;
        if b.len() < RUN_HEADER + FANOUT * 8 {
            return Err(FormatError::Truncated {
                structure: "index run",
                needed: (RUN_HEADER + FANOUT * 8) as u64,
                available: b.len() as u64,
            });
        }
        magic(&b[..8], RUN_MAGIC, "index run")?;
        version(u16::from_le_bytes([b[8], b[9]]), RUN_VERSION, "index run")?;
        let packs = u32::from_le_bytes(b[12..16].try_into().expect("4")) as u64;
        let entries = u64_at(b, 16);
        if b[10..12].iter().chain(&b[24..64]).any(|&x| x != 0) {
            return Err(FormatError::ReservedNotZero {
                structure: "index run header",
                offset: 10,
            });
        }
        if run_len(entries, packs) != Some(b.len() as u64) {
            return Err(invalid(
                "index run",
                "file length",
                b.len() as u64,
                "64 + 2048 + 16 × packs + 64 × entries",
            ));
        }
        let mut at = RUN_HEADER;
        let pack_ids: Vec<[u8; 16]> = (0..packs)
            .map(|i| {
                let o = at + 16 * i as usize;
                b[o..o + 16].try_into().expect("16")
            })
            .collect();
        at += 16 * packs as usize;
        let fanout: Vec<u64> = (0..FANOUT).map(|i| u64_at(b, at + 8 * i)).collect();
        at += FANOUT * 8;
        if fanout.windows(2).any(|w| w[0] > w[1]) || fanout[FANOUT - 1] != entries {
            return Err(invalid(
                "index run",
                "fan-out",
                fanout[FANOUT - 1],
                "non-decreasing, ending at the entry count",
            ));
        }
        let run = Run {
            packs: pack_ids,
            fanout,
            entries,
            start: at,
            bytes,
        };
        let mut prev: Option<[u8; 32]> = None;
        for i in 0..entries {
            let raw = run.raw(i);
            let id: [u8; 32] = raw[..32].try_into().expect("32");
            if prev.is_some_and(|p| p >= id) {
                return Err(invalid("index run", "entry", i, "ids strictly increasing"));
            }
            let bucket = id[0] as usize;
            let lo = if bucket == 0 {
                0
            } else {
                run.fanout[bucket - 1]
            };
            if i < lo || i >= run.fanout[bucket] {
                return Err(invalid(
                    "index run",
                    "entry",
                    i,
                    "inside its fan-out bucket",
                ));
            }
            run.decode(i)?;
            prev = Some(id);
            // Pages checked are let go as the check walks on: opening a run of 10^7 entries
            // does not keep its 640 MB resident (lookups fault in what they touch).
            if (i + 1) % RELEASE_ENTRIES == 0 {
                let end = run.start + (i + 1) as usize * RUN_ENTRY;
                run.bytes
                    .release(end - RELEASE_ENTRIES as usize * RUN_ENTRY..end);
            }
        }
        run.bytes.release(0..run.bytes.len());
        Ok(run)
    }

    fn raw(&self, i: u64) -> &[u8] {
        let o = self.start + i as usize * RUN_ENTRY;
        &self.bytes[o..o + RUN_ENTRY]
    }

    /// Entries.
    pub fn len(&self) -> u64 {
        self.entries
    }

    /// True without entries.
    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// Entry `i`.
    pub fn decode(&self, i: u64) -> Result<Location, FormatError> {
        let b = self.raw(i);
        let pack = u32::from_le_bytes(b[32..36].try_into().expect("4"));
        let codec = BlobCodec::from_code(b[36])
            .ok_or_else(|| invalid("index run", "codec", b[36].into(), "0 or 1"))?;
        if b[37..40].iter().any(|&x| x != 0) {
            return Err(FormatError::ReservedNotZero {
                structure: "index run entry",
                offset: 37,
            });
        }
        let pack = *self.packs.get(pack as usize).ok_or_else(|| {
            invalid(
                "index run",
                "pack",
                pack.into(),
                "an entry of the pack table",
            )
        })?;
        let blob = BlobEntry {
            id: b[..32].try_into().expect("32"),
            offset: u64_at(b, 40),
            stored_len: u64_at(b, 48),
            raw_len: u64_at(b, 56),
            codec,
        };
        if codec == BlobCodec::None && blob.stored_len != blob.raw_len {
            return Err(invalid(
                "index run",
                "stored length",
                blob.stored_len,
                "the raw length for a blob stored as it is",
            ));
        }
        Ok(Location { pack, blob })
    }

    /// The entry for `id`.
    pub fn find(&self, id: &[u8; 32]) -> Option<Location> {
        let bucket = id[0] as usize;
        let (mut lo, mut hi) = (
            if bucket == 0 {
                0
            } else {
                self.fanout[bucket - 1]
            },
            self.fanout[bucket],
        );
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.raw(mid)[..32].cmp(id.as_slice()) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return self.decode(mid).ok(),
            }
        }
        None
    }

    /// The packs its entries name.
    pub fn packs(&self) -> &[[u8; 16]] {
        &self.packs
    }
}

/// Writes a run of `entries` (sorted by id, unique) as a new file of `storage`; returns its
/// record at `level`.
pub fn write_run(
    storage: &dyn Storage,
    entries: impl IntoIterator<Item = Location>,
    count: u64,
    packs: &[[u8; 16]],
    level: u32,
    durable: bool,
) -> Result<RunRecord> {
    let temp = format!("index-{}.run", hex(&crate::io::unique_id(b"index run")));
    let pack_no: BTreeMap<[u8; 16], u32> = packs
        .iter()
        .enumerate()
        .map(|(i, p)| (*p, i as u32))
        .collect();
    let mut out = storage.create(&crate::io::temp_name(&temp))?;
    // The run's name hashes what it holds (its pack table and entries, then its header), so
    // the same run written twice has the same name.
    let mut namer = blake3::Hasher::new();
    let written = (|| -> Result<u64> {
        let mut head = vec![0u8; RUN_HEADER];
        head[..8].copy_from_slice(RUN_MAGIC);
        head[8..10].copy_from_slice(&RUN_VERSION.to_le_bytes());
        head[12..16].copy_from_slice(&(packs.len() as u32).to_le_bytes());
        head[16..24].copy_from_slice(&count.to_le_bytes());
        for p in packs {
            head.extend_from_slice(p);
        }
        // Entries first, the header and fan-out (known at the end) last.
        let mut fanout = [0u64; FANOUT];
        let mut body = Vec::with_capacity(1 << 20);
        let mut pos = (head.len() + FANOUT * 8) as u64;
        let (mut n, mut prev) = (0u64, None::<[u8; 32]>);
        let bug = |detail: String| Error::Unsupported {
            path: storage.path(&temp),
            detail: format!("{detail} (a bug): nothing was published"),
        };
        for e in entries {
            if prev.is_some_and(|p| p >= e.blob.id) {
                return Err(bug("index entries out of order".into()));
            }
            prev = Some(e.blob.id);
            fanout[e.blob.id[0] as usize] += 1;
            let pack = *pack_no
                .get(&e.pack)
                .ok_or_else(|| bug("an entry's pack is not in the run's pack table".into()))?;
            body.extend_from_slice(&entry_bytes(&e, pack));
            n += 1;
            if body.len() >= 1 << 20 {
                namer.update(&body);
                out.write_at(pos, &body)?;
                pos += body.len() as u64;
                body.clear();
            }
        }
        namer.update(&body);
        out.write_at(pos, &body)?;
        pos += body.len() as u64;
        if n != count {
            return Err(bug(format!("{n} index entries, {count} announced")));
        }
        for i in 1..FANOUT {
            fanout[i] += fanout[i - 1];
        }
        for f in fanout {
            head.extend_from_slice(&f.to_le_bytes());
        }
        namer.update(&head);
        namer.update(&level.to_le_bytes());
        out.write_at(0, &head)?;
        if durable {
            out.sync_all()?;
        }
        Ok(pos)
    })();
    let bytes = match written {
        Ok(b) => b,
        Err(e) => {
            out.abandon();
            return Err(e);
        }
    };
    let name = format!("index-{}.run", &namer.finalize().to_hex()[..32]);
    match out.publish_new(&name, durable) {
        // The same run, written before (its name hashes its contents).
        Ok(()) | Err(Error::CommitConflict { .. }) => {}
        Err(e) => return Err(e),
    }
    // Hashed in file order, now that the header is there.
    let file = storage.open(&name)?;
    let blake3 = hex(blake3::hash(&file.read(0..file.len())?).as_bytes());
    Ok(RunRecord {
        file: name,
        bytes,
        blake3,
        entries: count,
        level,
    })
}

/// The store's index: every run of `index.json`, opened.
#[derive(Debug)]
pub struct BlobIndex {
    /// What `index.json` holds.
    pub root: IndexRoot,
    /// Its bytes' BLAKE3, for the compare-and-swap that replaces it.
    pub root_hash: Option<blake3::Hash>,
    runs: Vec<Arc<Run>>,
}

impl BlobIndex {
    /// Reads `index.json` and opens its runs, each checked against its record.
    pub fn open(storage: &dyn Storage) -> Result<Self> {
        let mut retries = 0;
        loop {
            let Some(bytes) = storage.read(INDEX_ROOT)? else {
                return Ok(BlobIndex {
                    root: IndexRoot::empty(),
                    root_hash: None,
                    runs: Vec::new(),
                });
            };
            let root = IndexRoot::decode(&bytes).map_err(|source| Error::Format {
                path: storage.path(INDEX_ROOT),
                source: super::advised(source, INDEX_DAMAGE),
            })?;
            failpoint!("store-index-read");
            let runs = match root
                .runs
                .iter()
                .map(|r| open_run_once(storage, r))
                .collect::<Result<Vec<_>>>()
            {
                Ok(runs) => runs,
                // A run that an add merged, or a collection dropped, once `index.json` was
                // read: the index read again lists what replaced it.
                Err(_)
                    if retries < 8
                        && storage
                            .read(INDEX_ROOT)
                            .is_ok_and(|now| now.as_deref() != Some(&bytes[..])) =>
                {
                    retries += 1;
                    continue;
                }
                Err(e) => return Err(e),
            };
            forget_runs_but(storage, &root);
            return Ok(BlobIndex {
                root,
                root_hash: Some(blake3::hash(&bytes)),
                runs,
            });
        }
    }

    /// Where blob `id` is, newest run first.
    pub fn find(&self, id: &[u8; 32]) -> Option<Location> {
        self.runs.iter().rev().find_map(|r| r.find(id))
    }

    /// The runs.
    pub fn runs(&self) -> &[Arc<Run>] {
        &self.runs
    }

    /// Every entry, in id order, each id once (the newest run's where several hold it).
    pub fn entries(&self) -> impl Iterator<Item = Location> + '_ {
        merged(&self.runs)
    }

    /// The entries newer ones hide ([`superseded`]).
    pub fn superseded(&self) -> impl Iterator<Item = Location> + '_ {
        superseded(&self.runs)
    }
}

/// The runs this process opened, by file and recorded BLAKE3. A run's file never changes (its
/// name comes from its content, and it is published once), so each is hashed and parsed once
/// per process, not at every open of the index: a commit into a large store then costs what
/// it adds, not the size of the index.
type OpenedRuns = HashMap<(PathBuf, String), Arc<Run>>;

/// The runs opened so far. The lock is held for an instant, and tried for one (`lock_for_an_instant`): a process
/// forked while another thread held it (a trainer's thread committing into the store as
/// DataLoader workers are forked) inherits it held for good, and opens runs uncached rather
/// than hang.
pub(super) fn opened_runs() -> Option<std::sync::MutexGuard<'static, OpenedRuns>> {
    static OPENED: OnceLock<Mutex<OpenedRuns>> = OnceLock::new();
    crate::per_process::lock_for_an_instant(OPENED.get_or_init(Default::default))
}

/// [`open_run`], once per process for each run.
pub(crate) fn open_run_once(storage: &dyn Storage, r: &RunRecord) -> Result<Arc<Run>> {
    let key = (storage.path(&r.file), r.blake3.clone());
    if let Some(run) = opened_runs().and_then(|o| o.get(&key).cloned()) {
        return Ok(run);
    }
    let run = Arc::new(open_run(storage, r)?);
    if let Some(mut opened) = opened_runs() {
        opened.insert(key, Arc::clone(&run));
    }
    Ok(run)
}

/// Drops the opened runs of `storage`'s folder that `root` no longer lists (merged or
/// collected away), so their mappings go.
fn forget_runs_but(storage: &dyn Storage, root: &IndexRoot) {
    let listed: HashSet<PathBuf> = root.runs.iter().map(|r| storage.path(&r.file)).collect();
    let folder = storage.path(INDEX_ROOT);
    let folder = folder.parent();
    if let Some(mut opened) = opened_runs() {
        opened.retain(|(path, _), _| path.parent() != folder || listed.contains(path));
    }
}

/// Opens run `r` of `storage`, checking its length and BLAKE3 against the record.
pub fn open_run(storage: &dyn Storage, r: &RunRecord) -> Result<Run> {
    let path = storage.path(&r.file);
    let file = storage.open(&r.file).map_err(|e| match e {
        Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            Error::StoreDamage {
                path: path.clone(),
                detail: format!("index.json lists this run, which is gone; {INDEX_DAMAGE}"),
            }
        }
        e => e,
    })?;
    let bytes = match file.whole() {
        Some(b) => b,
        None => file.read(0..file.len())?,
    };
    let damaged = |detail: String| Error::StoreDamage {
        path: path.clone(),
        detail: format!("{detail}; {INDEX_DAMAGE}"),
    };
    if bytes.len() as u64 != r.bytes {
        return Err(damaged(format!(
            "{} bytes, index.json records {}",
            bytes.len(),
            r.bytes
        )));
    }
    let mut hasher = blake3::Hasher::new();
    for at in (0..bytes.len()).step_by(RELEASE_ENTRIES as usize * RUN_ENTRY) {
        let end = (at + RELEASE_ENTRIES as usize * RUN_ENTRY).min(bytes.len());
        hasher.update(&bytes[at..end]);
        bytes.release(at..end);
    }
    let got = hex(hasher.finalize().as_bytes());
    if got != r.blake3 {
        return Err(damaged(format!(
            "BLAKE3 {got}, index.json records {}",
            r.blake3
        )));
    }
    let run = Run::parse(bytes).map_err(|source| Error::Format {
        path: path.clone(),
        source,
    })?;
    if run.len() != r.entries {
        return Err(damaged(format!(
            "{} entries, index.json records {}",
            run.len(),
            r.entries
        )));
    }
    Ok(run)
}

/// The entries of `runs` in id order, each id once: where several runs hold an id, the
/// latest run's entry.
pub fn merged<R: Borrow<Run>>(runs: &[R]) -> impl Iterator<Item = Location> + '_ {
    every_entry(runs).filter_map(|(e, newest)| newest.then_some(e))
}

/// The entries of `runs` that a newer run's entry of the same id, in another pack, hides:
/// copies of a blob stored again (a damaged one, stored anew where an add checks what it
/// finds), which no read finds. A collection drops them.
pub fn superseded<R: Borrow<Run>>(runs: &[R]) -> impl Iterator<Item = Location> + '_ {
    let mut newest: Option<[u8; 16]> = None;
    every_entry(runs).filter_map(move |(e, is_newest)| match is_newest {
        true => {
            newest = Some(e.pack);
            None
        }
        false => (newest != Some(e.pack)).then_some(e),
    })
}

/// Every entry of `runs` in id order, newest run first among those of one id, each with
/// whether it is its id's newest.
fn every_entry<R: Borrow<Run>>(runs: &[R]) -> impl Iterator<Item = (Location, bool)> + '_ {
    let runs: Vec<&Run> = runs.iter().map(Borrow::borrow).collect();
    // A min-heap of (id, newest run first, position).
    let mut heap = BinaryHeap::new();
    for (i, r) in runs.iter().enumerate() {
        if !r.is_empty() {
            heap.push(Reverse((id_at(r, 0), Reverse(i), 0u64)));
        }
    }
    let mut last: Option<[u8; 32]> = None;
    std::iter::from_fn(move || loop {
        let Reverse((id, Reverse(i), pos)) = heap.pop()?;
        if pos + 1 < runs[i].len() {
            heap.push(Reverse((id_at(runs[i], pos + 1), Reverse(i), pos + 1)));
        }
        let newest = last != Some(id);
        last = Some(id);
        if let Ok(e) = runs[i].decode(pos) {
            return Some((e, newest));
        }
    })
}

fn id_at(r: &Run, i: u64) -> [u8; 32] {
    r.raw(i)[..32].try_into().expect("32")
}
