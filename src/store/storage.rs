//! A named dataset of a store seen as a dataset folder: [`StoreDataset`] is a
//! [`Storage`], so readers, writers, `cp` and `verify` work on `STORE/NAME` unchanged.
//!
//! Reading: a file is its blob, or a shard rebuilt from its skeleton and payload blobs; a
//! range inside one payload is a slice of the mapped pack (zero-copy). Writing: a new file is
//! written into `STORE/staging/`, and publishing it adds its blobs to the store (what is there
//! is referenced, not stored again); publishing or replacing the manifest, or replacing any
//! file, commits: packs, index run, then `datasets/NAME.json`, which readers see.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{Error, Result};
use crate::format::manifest::{hex, is_shard_file_name, MANIFEST_FILE};
use crate::io::{FileBytes, FileReader, LocalStorage, NewFile, Storage, WriterLease};
use crate::per_process::lock_for_an_instant;

use super::index::{BlobIndex, Location};
use super::ingest::Ingest;
use super::locks::StoreLock;
use super::pack::BlobCodec;
use super::skeleton::{map_skeleton, Piece, ShardMap};
use super::snapshot::{blob_id, snapshot_file, FileRecord, Snapshot};
use super::{Store, RUN_STORE_VERIFY};

/// Between the dataset's name and the rest of a staged file's name (no dataset name holds it).
pub const STAGED_SEPARATOR: char = '+';

/// The dataset a staged file belongs to.
pub fn staged_dataset(file: &str) -> Option<&str> {
    file.split_once(STAGED_SEPARATOR)
        .map(|(name, _)| name)
        .filter(|n| super::snapshot::is_dataset_name(n))
}

/// Dataset `name` of a store, as a [`Storage`].
#[derive(Debug)]
pub struct StoreDataset {
    store: Arc<Store>,
    name: String,
    path: PathBuf,
    staging: Arc<LocalStorage>,
    state: Arc<Mutex<WriteState>>,
    /// The index as last read for this dataset's reads, shared by its handles; dropped when
    /// this dataset adds blobs (a blob stored anew is then found where it is now).
    index: Arc<Mutex<Option<Arc<BlobIndex>>>>,
    /// The committed dataset's files as last read, by name, shared by its handles: a read
    /// finds a file's record here, not in the dataset's file decoded anew at each open (a
    /// dataset of 3000 shards took 34 s to verify). Read again for the manifest, which
    /// commits replace, for a name not here, and where a file does not open from its record.
    committed_files: Arc<Mutex<KeptRecords>>,
    /// The process that opened the handle: only it writes through it (see
    /// [`StoreDataset::state`]).
    pid: u32,
}

/// A dataset's files by name.
type FileRecords = HashMap<String, FileRecord>;

/// [`StoreDataset::committed_files`]: the records, and how many times they were kept, so that
/// a read that began before another was kept does not replace that one with older records.
#[derive(Debug, Default)]
struct KeptRecords {
    files: Option<Arc<FileRecords>>,
    kept: u64,
}

#[derive(Debug, Default)]
struct WriteState {
    /// The files as this handle will publish them; loaded at the first write.
    files: Option<BTreeMap<String, FileRecord>>,
    /// BLAKE3 of the dataset's file as last read or written here.
    snapshot_hash: Option<blake3::Hash>,
    ingest: Option<Ingest>,
    /// Files added through the handle whose blobs `ingest` holds, not yet all published and
    /// indexed: a read of one publishes them first ([`StoreDataset::open_record`]).
    unflushed: std::collections::HashSet<String>,
    /// Why a step of the ingest failed (a pack, an index run or `index.json` not published):
    /// blobs of files added may then be in no index, so the handle commits nothing more.
    broken: Option<String>,
    /// The dataset's lock, and the hold of `gc.lock`.
    holds: Holds,
    /// What the commits through this handle stored and found.
    added: super::IngestStats,
    /// Staged files that handed payloads to the store and are not published or abandoned:
    /// while there are any, the hold of `gc.lock` is kept across commits, since those
    /// payloads are referenced by nothing published yet.
    handing: usize,
    /// Blobs found in the store are checked before they are referenced
    /// ([`Storage::check_copies_found`]).
    check_found: bool,
    /// Files deleted from the committed dataset through this handle: one put again under
    /// its name is committed at once (`hspack repair` sends a damaged file again and
    /// publishes no manifest, whose publish commits the other files).
    deleted: std::collections::HashSet<String>,
}

/// The locks a writing handle holds besides its open ingest's.
#[derive(Debug, Default)]
struct Holds {
    /// The dataset's lock, taken at the first write.
    dataset: Option<Arc<StoreLock>>,
    /// The shared hold of `gc.lock` from the first blob added or found until the dataset's
    /// file that references them is published.
    gc: Option<Arc<StoreLock>>,
}

impl WriteState {
    /// Every lock the handle holds now: the dataset's, the hold of `gc.lock` kept across
    /// commits, and the open ingest's. Shared, so that they are read again without the state
    /// lock (the handle's [`DatasetLease`] does).
    fn locks(&self) -> Vec<Arc<StoreLock>> {
        [
            self.holds.dataset.clone(),
            self.holds.gc.clone(),
            self.ingest.as_ref().map(Ingest::hold),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// Fails when one of `locks` is lost (read now): a lease that expired and was revoked or
/// taken over. A writer whose hold of `gc.lock` was revoked learns it so, not from the blobs
/// the collection removed meanwhile.
fn check_held(locks: &[Arc<StoreLock>]) -> Result<()> {
    locks.iter().try_for_each(|lock| lock.check())
}

impl StoreDataset {
    /// Dataset `name` of `store` (it need not exist yet).
    pub fn new(store: Arc<Store>, name: &str) -> Result<Self> {
        if !super::snapshot::is_dataset_name(name) {
            return Err(Error::Store {
                path: store.root().join(name),
                detail: "a dataset name is 1 to 128 of A-Z a-z 0-9 . _ - (not starting with .)"
                    .into(),
            });
        }
        let new = || -> Result<bool> { Ok(store.read_snapshot(name)?.is_none()) };
        // A dataset of that name made before this rule stays readable.
        if super::STORE_FOLDERS.contains(&name) && new()? {
            return Err(Error::Store {
                path: store.root().join(name),
                detail: format!(
                    "`{name}` is the name of one of the store's own folders ({}): choose \
                     another name for the dataset",
                    super::STORE_FOLDERS.join(", ")
                ),
            });
        }
        // A dataset beside the store under `STORE/NAME` (written there before the store was
        // made, or by a copy that did not see it) would be read in place of this one.
        if super::has_file(&store.root().join(name), MANIFEST_FILE)? && new()? {
            return Err(Error::Store {
                path: store.root().join(name),
                detail: format!(
                    "a dataset not in the store lies there (its manifest.json): a store's \
                     dataset of that name would be hidden by it. Choose another name, or move \
                     that dataset elsewhere and add it with `hspack store add {} MOVED --name \
                     {name}`",
                    store.root().display()
                ),
            });
        }
        Ok(StoreDataset {
            path: store.root().join(name),
            staging: Arc::clone(store.staging()),
            name: name.into(),
            store,
            state: Arc::new(Mutex::new(WriteState::default())),
            index: Arc::new(Mutex::new(None)),
            committed_files: Arc::new(Mutex::new(KeptRecords::default())),
            pid: std::process::id(),
        })
    }

    /// Another handle on this dataset that shares its writes (for a file being staged).
    fn handle(&self) -> StoreDataset {
        StoreDataset {
            store: Arc::clone(&self.store),
            name: self.name.clone(),
            path: self.path.clone(),
            staging: Arc::clone(self.store.staging()),
            state: Arc::clone(&self.state),
            index: Arc::clone(&self.index),
            committed_files: Arc::clone(&self.committed_files),
            pid: self.pid,
        }
    }

    /// The store.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// The dataset's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What the commits through this handle stored and found so far (nothing, in a process
    /// forked from the one that opened it).
    pub fn added(&self) -> super::IngestStats {
        self.state().map(|st| st.added).unwrap_or_default()
    }

    /// The write state, in the process that opened the handle. A process forked from it
    /// (a DataLoader worker) reads what is committed and writes nothing: the state is its
    /// parent's, and a parent thread writing through the handle at the fork (an add holds
    /// the lock while it packs and syncs) would leave the lock held in the child for good.
    fn state(&self) -> Result<MutexGuard<'_, WriteState>> {
        if self.pid != std::process::id() {
            return Err(Error::Store {
                path: self.path.clone(),
                detail: format!(
                    "this handle on the stored dataset was opened in process {}, and this \
                     process was forked from it: open the dataset again in this process to \
                     write to it",
                    self.pid
                ),
            });
        }
        Ok(self.state.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The files this handle will publish, where it writes and has loaded them.
    fn pending<R>(&self, f: impl FnOnce(&BTreeMap<String, FileRecord>) -> R) -> Option<R> {
        self.state().ok()?.files.as_ref().map(f)
    }

    fn committed(&self) -> Result<Option<Snapshot>> {
        Ok(self.store.snapshot(&self.name)?.map(|(s, _)| s))
    }

    fn record(&self, name: &str) -> Result<Option<FileRecord>> {
        Ok(self.record_kept(name)?.map(|(record, _)| record))
    }

    /// File `name`'s record, and whether it is the committed one as last read (not read now):
    /// see [`StoreDataset::committed_files`].
    fn record_kept(&self, name: &str) -> Result<Option<(FileRecord, bool)>> {
        if let Some(record) = self.pending(|files| files.get(name).cloned()) {
            return Ok(record.map(|r| (r, false)));
        }
        let (kept, count) = lock_for_an_instant(&self.committed_files)
            .map(|k| (k.files.clone(), k.kept))
            .unwrap_or((None, u64::MAX));
        if name != MANIFEST_FILE {
            if let Some(record) = kept.and_then(|files| files.get(name).cloned()) {
                return Ok(Some((record, true)));
            }
        }
        let files: Arc<FileRecords> = Arc::new(
            self.committed()?
                .map(|s| s.files.into_iter().map(|f| (f.name.clone(), f)).collect())
                .unwrap_or_default(),
        );
        if let Some(mut kept) = lock_for_an_instant(&self.committed_files) {
            if kept.kept == count {
                kept.files = Some(Arc::clone(&files));
                kept.kept += 1;
            }
        }
        Ok(files.get(name).cloned().map(|r| (r, false)))
    }

    /// `f` of file `name`'s record: where the record kept does not do (the dataset was
    /// removed, or written again, since it was read), of the record read now.
    fn with_record<T>(
        &self,
        name: &str,
        f: impl Fn(&FileRecord) -> Result<T>,
    ) -> Result<Option<T>> {
        match self.record_kept(name)? {
            None => Ok(None),
            Some((record, false)) => f(&record).map(Some),
            Some((record, true)) => match f(&record) {
                Ok(t) => Ok(Some(t)),
                Err(_) => {
                    if let Some(mut kept) = lock_for_an_instant(&self.committed_files) {
                        kept.files = None;
                        kept.kept += 1;
                    }
                    self.record(name)?.map(|r| f(&r)).transpose()
                }
            },
        }
    }

    fn not_found(&self, name: &str) -> Error {
        Error::Io {
            path: self.path(name),
            op: "open",
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "the stored dataset has no such file",
            ),
        }
    }

    /// The bytes of the file of `record` (`name`), refused where it is recorded longer than
    /// `max` before its blob is read: a compressed blob is decoded whole when opened, so a
    /// record (and an index entry) claiming terabytes would be decoded into memory first.
    fn read_record_bounded(&self, name: &str, record: &FileRecord, max: u64) -> Result<Vec<u8>> {
        if record.bytes > max {
            return Err(Error::StoreDamage {
                path: self.path(name),
                detail: format!(
                    "the store records {} bytes for it, more than the {max} it may hold: the \
                     store's record of the dataset is damaged; {RUN_STORE_VERIFY}",
                    record.bytes
                ),
            });
        }
        let file = self.open_record(record)?;
        Ok(file.read(0..file.len())?.to_vec())
    }

    /// Opens the file of `record`. A file this handle added whose blobs are not all published
    /// yet has them published first (packs, index run), so that it reads back what it wrote:
    /// a copy proves what landed. A committed file is read as it is, leaving the open pack
    /// to fill (a sync proves the shards there before it sends more).
    pub fn open_record(&self, record: &FileRecord) -> Result<Arc<dyn FileReader>> {
        if let Ok(mut st) = self.state() {
            if st.unflushed.contains(&record.name) {
                self.flush_blobs(&mut st)?;
            }
        }
        // The index as last read; read again once when it lacks a blob (a commit or a
        // collection since may have added or moved it).
        // Held for an instant, and tried for one: a forked child that inherited it held does
        // without it.
        let cached = lock_for_an_instant(&self.index).and_then(|i| i.clone());
        if let Some(index) = cached {
            if let Ok(file) = open_file(
                &self.store,
                &index,
                record,
                self.path(&record.name),
                RUN_STORE_VERIFY,
            ) {
                return Ok(file);
            }
        }
        let index = Arc::new(self.store.index()?);
        if let Some(mut cached) = lock_for_an_instant(&self.index) {
            *cached = Some(Arc::clone(&index));
        }
        let opened = open_file(
            &self.store,
            &index,
            record,
            self.path(&record.name),
            RUN_STORE_VERIFY,
        );
        // A writer reading back what it added, whose hold a collection revoked (it hung past
        // its lease) and whose blobs it removed: that is the error to report.
        opened.map_err(|e| self.explained(e))
    }
}

/// Opens a stored file, checking what the dataset records of it against the blobs the index
/// lists: every blob there, of the lengths recorded. `advice`: what a message says to do.
pub fn open_file(
    store: &Arc<Store>,
    index: &BlobIndex,
    record: &FileRecord,
    path: PathBuf,
    advice: &str,
) -> Result<Arc<dyn FileReader>> {
    let id = blob_id(&record.blob).expect("checked when the dataset was read");
    let missing = |id: &[u8; 32]| Error::StoreDamage {
        path: path.clone(),
        detail: format!(
            "blob {} is in no pack of the store's index: the store lost it; {advice}",
            hex(id)
        ),
    };
    let at = index.find(&id).ok_or_else(|| missing(&id))?;
    if !record.shard {
        if at.blob.raw_len != record.bytes {
            return Err(Error::StoreDamage {
                path,
                detail: format!(
                    "its blob holds {} bytes, the dataset records {}: {advice}",
                    at.blob.raw_len, record.bytes
                ),
            });
        }
        let bytes = match at.blob.codec {
            // Read in place, range by range: a blob stored raw holds exactly its bytes, or
            // reads would run into the next blob of the pack.
            BlobCodec::None if at.blob.stored_len != at.blob.raw_len => {
                return Err(store.damaged(
                    &at,
                    format!(
                        "is stored in {} bytes but holds {} uncompressed",
                        at.blob.stored_len, at.blob.raw_len
                    ),
                ));
            }
            // A larger file (a key run, a table part) is checked by the dataset's reader
            // against the hash its segment records; a small one (the manifest, a segment),
            // like a compressed one, is read and checked against its id once, here.
            BlobCodec::None if record.bytes > CHECKED_AT_OPEN => None,
            BlobCodec::None | BlobCodec::Zstd => Some(store.blob(&at)?),
        };
        return Ok(Arc::new(StoreFile {
            store: Arc::clone(store),
            path,
            len: record.bytes,
            content: Content::Whole { at, bytes },
        }));
    }
    let skeleton = store.blob(&at)?;
    let map = map_skeleton(&skeleton).map_err(|source| Error::Format {
        path: path.clone(),
        source,
    })?;
    if map.file_len != record.bytes {
        return Err(Error::StoreDamage {
            path,
            detail: format!(
                "its skeleton describes {} bytes, the dataset records {}: {advice}",
                map.file_len, record.bytes
            ),
        });
    }
    // Each piece's blob, found once (a read then costs one search for its piece).
    let locations = map
        .pieces
        .iter()
        .map(|(_, len, p)| match p {
            Piece::Payload(id) => {
                let at = index.find(id).ok_or_else(|| missing(id))?;
                // A piece reads its blob and nothing past it (a blob stored as is lies among
                // others in its pack).
                if at.blob.raw_len != *len {
                    return Err(Error::StoreDamage {
                        path: path.clone(),
                        detail: format!(
                            "its skeleton names blob {} for {len} bytes, and the blob holds {}: \
                             {advice}",
                            hex(id),
                            at.blob.raw_len
                        ),
                    });
                }
                Ok(Some(at))
            }
            _ => Ok(None),
        })
        .collect::<Result<Vec<_>>>()?;
    let literal = FileBytes::from_vec(map.literal.clone());
    Ok(Arc::new(StoreFile {
        store: Arc::clone(store),
        path,
        len: record.bytes,
        content: Content::Shard {
            map,
            literal,
            locations,
        },
    }))
}

#[derive(Debug)]
enum Content {
    /// One blob: ranges of the pack where stored as it is, else the decoded bytes.
    Whole {
        at: Location,
        bytes: Option<FileBytes>,
    },
    /// A shard: skeleton pieces and, for each payload piece, its blob.
    Shard {
        map: ShardMap,
        literal: FileBytes,
        locations: Vec<Option<Location>>,
    },
}

/// A file of a stored dataset, for reading.
#[derive(Debug)]
struct StoreFile {
    store: Arc<Store>,
    path: PathBuf,
    len: u64,
    content: Content,
}

/// Whole files of a stored dataset up to this size are hashed when opened (16 MiB).
const CHECKED_AT_OPEN: u64 = 16 << 20;

impl StoreFile {
    /// Bytes `range` of the blob at `at`, or where a collection moved it since this file was
    /// opened (a trainer reads on while `store gc` runs).
    fn blob_range(&self, at: &Location, range: Range<u64>) -> Result<FileBytes> {
        self.store.with_moved(at, |at| match at.blob.codec {
            BlobCodec::None => {
                let start = at.blob.offset.checked_add(range.start);
                let end = at.blob.offset.checked_add(range.end);
                let (Some(start), Some(end)) = (start, end) else {
                    return Err(self
                        .store
                        .damaged(at, "lies past the end of any file".into()));
                };
                self.store.pack_range(at, start..end)
            }
            BlobCodec::Zstd => {
                let all = self.store.blob(at)?;
                Ok(all
                    .slice(range.start as usize..range.end as usize)
                    .expect("inside the blob"))
            }
        })
    }

    /// Bytes `range` of piece `i` (the range inside it).
    fn piece_bytes(&self, i: usize, range: Range<u64>) -> Result<FileBytes> {
        let Content::Shard {
            map,
            literal,
            locations,
        } = &self.content
        else {
            unreachable!("pieces are a shard's")
        };
        let (start, _, piece) = &map.pieces[i];
        let (a, b) = (range.start - start, range.end - start);
        match piece {
            Piece::Literal(r) => Ok(literal
                .slice(r.start + a as usize..r.start + b as usize)
                .expect("inside the literal bytes")),
            Piece::Zeros => Ok(FileBytes::from_vec(vec![0; (b - a) as usize])),
            Piece::Payload(_) => {
                let at = locations[i]
                    .as_ref()
                    .expect("found for every payload piece");
                self.blob_range(at, a..b)
            }
        }
    }
}

impl FileReader for StoreFile {
    fn len(&self) -> u64 {
        self.len
    }

    fn read(&self, range: Range<u64>) -> Result<FileBytes> {
        if range.start > range.end || range.end > self.len {
            return Err(crate::io::local::out_of_file(&self.path, &range, self.len));
        }
        if range.is_empty() {
            return Ok(FileBytes::from_vec(Vec::new()));
        }
        let map = match &self.content {
            Content::Whole { at, bytes: None } => return self.blob_range(at, range),
            Content::Whole {
                bytes: Some(all), ..
            } => {
                return Ok(all
                    .slice(range.start as usize..range.end as usize)
                    .expect("inside the file"))
            }
            Content::Shard { map, .. } => map,
        };
        let first = map.piece_at(range.start).expect("inside the file");
        let (s, l, _) = map.pieces[first];
        if range.end <= s + l {
            return self.piece_bytes(first, range);
        }
        let mut out = Vec::with_capacity((range.end - range.start) as usize);
        let mut i = first;
        while (out.len() as u64) < range.end - range.start {
            let (s, l, _) = map.pieces[i];
            let from = range.start.max(s);
            let to = range.end.min(s + l);
            out.extend_from_slice(&self.piece_bytes(i, from..to)?);
            i += 1;
        }
        Ok(FileBytes::from_vec(out))
    }

    fn whole(&self) -> Option<FileBytes> {
        match &self.content {
            Content::Whole { bytes: Some(b), .. } => Some(b.clone()),
            _ => None,
        }
    }

    fn maps_ranges(&self) -> bool {
        true
    }
}

/// The lease of a stored dataset's writer: the dataset's lock and the hold of `gc.lock`,
/// held by the handle.
#[derive(Debug)]
struct DatasetLease {
    pid: u32,
    state: Arc<Mutex<WriteState>>,
}

impl WriterLease for DatasetLease {
    fn is_owner(&self) -> bool {
        self.pid == std::process::id()
    }

    /// Reads the locks again (a lease can lapse unnoticed while its holder is stopped): a
    /// copy asks before each step that changes the destination, and when what it sent does
    /// not read back.
    fn confirm(&self) -> Result<()> {
        // A forked child writes nothing through the handle (its state refuses it), and the
        // state's lock it inherited may be held for good.
        if !self.is_owner() {
            return Ok(());
        }
        let locks = self.state.lock().unwrap_or_else(|p| p.into_inner()).locks();
        check_held(&locks)
    }
}

impl StoreDataset {
    /// Loads the files to write over, taking the dataset's lock.
    fn begin<'a>(&self, st: &'a mut WriteState) -> Result<&'a mut BTreeMap<String, FileRecord>> {
        if st.holds.dataset.is_none() {
            let lock = self.store.locks().dataset(self.store.root(), &self.name)?;
            st.holds.dataset = Some(Arc::new(lock));
        }
        if st.files.is_none() {
            let found = self.store.snapshot(&self.name)?;
            st.snapshot_hash = found.as_ref().map(|(_, h)| *h);
            st.files = Some(
                found
                    .map(|(s, _)| s.files.into_iter().map(|f| (f.name.clone(), f)).collect())
                    .unwrap_or_default(),
            );
        }
        Ok(st.files.as_mut().expect("loaded"))
    }

    fn ingest<'a>(&self, st: &'a mut WriteState) -> Result<&'a mut Ingest> {
        if st.ingest.is_none() {
            let mut ingest = match st.holds.gc {
                // A collection waits for this writer's commit: it must not wait for one.
                Some(_) => Ingest::beside_held(&self.store)?,
                None => Ingest::new(&self.store)?,
            };
            if st.check_found {
                ingest.check_found();
            }
            st.ingest = Some(ingest);
        }
        Ok(st.ingest.as_mut().expect("started"))
    }

    /// Adds file `name` from `file` and records it; commits when it is the manifest.
    fn add_file(
        &self,
        name: &str,
        file: &dyn FileReader,
        durable: bool,
        replace: bool,
    ) -> Result<()> {
        self.add_staged(name, file, durable, replace, &HashMap::new())
    }

    /// [`StoreDataset::add_file`] of a staged file whose payloads `handed` (by offset) were put
    /// into the ingest as they were written.
    fn add_staged(
        &self,
        name: &str,
        file: &dyn FileReader,
        durable: bool,
        replace: bool,
        handed: &HashMap<u64, [u8; 32]>,
    ) -> Result<()> {
        let mut st = self.state()?;
        let files = self.begin(&mut st)?;
        if !replace && files.contains_key(name) {
            return Err(Error::CommitConflict {
                path: self.path(name),
                detail: "a file of that name is there already".into(),
            });
        }
        let shard = is_shard_file_name(name);
        let ingest = self.ingest(&mut st)?;
        // Many files' blobs share a pack, indexed as it fills (`Ingest::put`); the open pack
        // is published when the commit, or a read of this handle, needs it (`open_record`).
        // The dataset's file, which others read, waits for the commit.
        let record = match ingest.put_file(name, file, &self.path(name), shard, handed) {
            Ok(record) => record,
            Err(e) => return Err(failed_ingest(&mut st, e)),
        };
        st.unflushed.insert(name.into());
        let restored = st.deleted.remove(name);
        let files = st.files.as_mut().expect("loaded");
        let before = files.insert(name.into(), record);
        if replace || restored || name == MANIFEST_FILE {
            if let Err(e) = self.commit(&mut st, durable) {
                // Not published: the file stays the one committed, so that a writer reading
                // its manifest back after a failed commit finds the old one, not the one that
                // did not land.
                let files = st.files.as_mut().expect("loaded");
                match before {
                    Some(record) => files.insert(name.into(), record),
                    None => files.remove(name),
                };
                if restored {
                    st.deleted.insert(name.into());
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Publishes the blobs added so far (packs and an index run), keeping the hold of
    /// `gc.lock` until the commit.
    fn flush_blobs(&self, st: &mut WriteState) -> Result<()> {
        if let Some(ingest) = st.ingest.take() {
            let (stats, held) = match ingest.commit() {
                Ok(done) => done,
                Err(e) => return Err(failed_ingest(st, e)),
            };
            st.unflushed.clear();
            st.added.add(&stats);
            st.holds.gc.get_or_insert(held);
            self.forget_index();
        }
        Ok(())
    }

    /// `e`, a failed write through this handle, or, where a collection revoked the handle's
    /// hold of the store meanwhile (it hung past its lease) and removed what it had staged,
    /// the lost lease: that is what happened. Called without the state lock held.
    fn explained(&self, e: Error) -> Error {
        let Ok(locks) = self.state().map(|st| st.locks()) else {
            return e;
        };
        match check_held(&locks) {
            Err(lost) => lost,
            Ok(()) => e,
        }
    }

    /// Drops the index this dataset's reads use: read again, it finds the blobs just indexed.
    fn forget_index(&self) {
        if let Some(mut cached) = lock_for_an_instant(&self.index) {
            *cached = None;
        }
    }

    /// Publishes the pending blobs, then the dataset's file.
    fn commit(&self, st: &mut WriteState, durable: bool) -> Result<()> {
        if let Some(why) = &st.broken {
            return Err(Error::Store {
                path: self.path.clone(),
                detail: format!(
                    "an earlier write through this handle failed ({why}), so what it added \
                     may not all be stored: it publishes nothing more. Run again (what was \
                     committed before stays)"
                ),
            });
        }
        self.flush_blobs(st)?;
        let mut snap = Snapshot::new(&self.name);
        snap.files = st
            .files
            .as_ref()
            .expect("loaded")
            .values()
            .cloned()
            .collect();
        let bytes = snap.encode();
        let file = snapshot_file(&self.name);
        let datasets = self.store.datasets();
        // An add that hung until a collection revoked its hold must not publish: the blobs
        // it found may be gone. That hold is read last, just before the put: the dataset's
        // lease guards against another writer, whom the compare-and-swap catches too.
        check_held(&st.locks())?;
        let put = match st.snapshot_hash {
            Some(h) => datasets.replace(&file, &bytes, Some(h), durable),
            None => datasets.put_new(&file, &bytes, durable),
        };
        let hash = blake3::hash(&bytes);
        if let Err(e) = put {
            // A put can land and still report an error (a lost response): what is there
            // decides.
            let landed = self.store.snapshot(&self.name);
            if !matches!(landed, Ok(Some((_, h))) if h == hash) {
                return Err(e);
            }
        }
        st.snapshot_hash = Some(hash);
        if st.handing == 0 {
            st.holds.gc = None;
        }
        Ok(())
    }
}

/// `e`, the failure of a step of the handle's ingest: a pack it filled may be unpublished, or
/// its blobs in no index, and the blobs of files added before may be among them. The ingest
/// is let go with those files, and the handle commits nothing more
/// ([`WriteState::broken`]): no dataset's file may list a blob the index lacks.
fn failed_ingest(st: &mut WriteState, e: Error) -> Error {
    st.ingest = None;
    let added = std::mem::take(&mut st.unflushed);
    if let Some(files) = st.files.as_mut() {
        files.retain(|name, _| !added.contains(name));
    }
    st.broken.get_or_insert_with(|| e.to_string());
    e
}

/// A file being written for a stored dataset, in the store's staging folder.
#[derive(Debug)]
struct StagedFile {
    inner: Box<dyn NewFile>,
    staged: String,
    owner: StoreDataset,
    /// Payloads handed to the store as they were written, by offset: not in the staged file.
    handed: HashMap<u64, [u8; 32]>,
}

impl StagedFile {
    /// Ends the file's handing of payloads (published or abandoned).
    fn done_handing(&self) {
        if !self.handed.is_empty() {
            if let Ok(mut st) = self.owner.state() {
                st.handing -= 1;
            }
        }
    }
}

impl NewFile for StagedFile {
    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> Result<()> {
        self.inner.write_at(offset, bytes)
    }

    fn keeps_payloads(&self) -> bool {
        true
    }

    /// The payload goes straight into the store's open pack (or nowhere, where the store has
    /// it); the staged file keeps a hole there.
    fn write_payload(&mut self, offset: u64, bytes: &[u8], hash: &[u8; 32]) -> Result<()> {
        let mut st = self.owner.state()?;
        if let Err(e) = self.owner.ingest(&mut st)?.put(*hash, bytes, false) {
            return Err(failed_ingest(&mut st, e));
        }
        if self.handed.is_empty() {
            st.handing += 1;
        }
        self.handed.insert(offset, *hash);
        Ok(())
    }

    fn sync_data(&mut self) -> Result<()> {
        Ok(())
    }

    fn sync_all(&mut self) -> Result<()> {
        Ok(())
    }

    fn publish_new(self: Box<Self>, name: &str, durable: bool) -> Result<()> {
        let StagedFile {
            inner,
            staged,
            owner,
            handed,
        } = *self;
        let added = inner.publish_new(&staged, false).and_then(|()| {
            let added = owner
                .staging
                .open(&staged)
                .and_then(|file| owner.add_staged(name, &*file, durable, false, &handed));
            added.and(owner.staging.delete(&staged))
        });
        if !handed.is_empty() {
            if let Ok(mut st) = owner.state() {
                st.handing -= 1;
            }
        }
        added.map_err(|e| owner.explained(e))
    }

    fn abandon(self: Box<Self>) {
        self.done_handing();
        self.inner.abandon();
    }
}

impl Storage for StoreDataset {
    fn root(&self) -> &Path {
        &self.path
    }

    fn create_root(&self) -> Result<()> {
        Ok(())
    }

    fn list(&self) -> Result<Vec<String>> {
        if let Some(names) = self.pending(|files| files.keys().cloned().collect()) {
            return Ok(names);
        }
        Ok(self
            .committed()?
            .map(|s| s.files.into_iter().map(|f| f.name).collect())
            .unwrap_or_default())
    }

    fn read(&self, name: &str) -> Result<Option<Vec<u8>>> {
        self.with_record(name, |record| {
            let file = self.open_record(record)?;
            Ok(file.read(0..file.len())?.to_vec())
        })
    }

    /// See [`StoreDataset::read_record_bounded`].
    fn read_bounded(&self, name: &str, max: u64) -> Result<Option<Vec<u8>>> {
        self.with_record(name, |record| self.read_record_bounded(name, record, max))
    }

    fn open(&self, name: &str) -> Result<Arc<dyn FileReader>> {
        self.with_record(name, |record| self.open_record(record))?
            .ok_or_else(|| self.not_found(name))
    }

    fn create(&self, temp: &str) -> Result<Box<dyn NewFile>> {
        // The dataset's lock is held before a file of it is staged, so a collection that can
        // take the lock knows the dataset's staged files are leftovers of a writer that died.
        self.begin(&mut *self.state()?)?;
        self.staging.create_root()?;
        let staged = format!(
            "{}{STAGED_SEPARATOR}{}-{}",
            self.name,
            hex(&crate::io::unique_id(temp.as_bytes())),
            temp.replace('/', "_")
        );
        Ok(Box::new(StagedFile {
            inner: self.staging.create(&crate::io::temp_name(&staged))?,
            staged,
            owner: self.handle(),
            handed: HashMap::new(),
        }))
    }

    fn replace(
        &self,
        name: &str,
        bytes: &[u8],
        expected: Option<blake3::Hash>,
        durable: bool,
    ) -> Result<()> {
        if let Some(expected) = expected {
            let now = self.record(name)?;
            let same = now
                .as_ref()
                .is_some_and(|r| !r.shard && r.blob == expected.to_hex().as_str());
            if !same {
                return Err(Error::CommitConflict {
                    path: self.path(name),
                    detail: "it is not the one this writer last read or wrote".into(),
                });
            }
        }
        let file = crate::io::MemoryFile::new(self.path(name), bytes.to_vec());
        self.add_file(name, &file, durable, true)
    }

    fn delete(&self, name: &str) -> Result<()> {
        let mut st = self.state()?;
        let files = self.begin(&mut st)?;
        if files.remove(name).is_none() {
            return Ok(());
        }
        // A file the committed dataset does not list (one added through this handle and not
        // committed: a shard a copy failed to prove) is only dropped: a commit here would
        // publish the other pending files, or a dataset of no files where none was.
        let listed = st.snapshot_hash.is_some()
            && self
                .committed()?
                .is_some_and(|snap| snap.file(name).is_some());
        if listed {
            let emptied = st.files.as_ref().is_some_and(|f| f.is_empty());
            match emptied {
                // A dataset of no files is none (a failed first run's manifest deleted): its
                // file goes, not one listing nothing, which `store ls` would list.
                true => {
                    // As a commit replaces it: while this handle holds the dataset, and only
                    // the file it last read or wrote.
                    check_held(&st.locks())?;
                    let now = self.store.snapshot(&self.name)?.map(|(_, hash)| hash);
                    if now != st.snapshot_hash {
                        return Err(Error::CommitConflict {
                            path: self.path(name),
                            detail: "the stored dataset's file changed since this handle read it"
                                .into(),
                        });
                    }
                    let datasets = self.store.datasets();
                    datasets.delete(&snapshot_file(&self.name))?;
                    datasets.sync()?;
                    st.snapshot_hash = None;
                }
                // Should this commit fail, the file stays out of the next.
                false => self.commit(&mut st, true)?,
            }
            st.deleted.insert(name.to_string());
        }
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        Ok(())
    }

    fn check_copies_found(&self) -> bool {
        let Ok(mut st) = self.state() else {
            return false;
        };
        st.check_found = true;
        if let Some(ingest) = &mut st.ingest {
            ingest.check_found();
        }
        true
    }

    fn batches_new_files(&self) -> bool {
        true
    }

    fn write_defaults(&self) -> crate::io::WriteDefaults {
        crate::io::WriteDefaults {
            block_rows: Some(super::STORE_BLOCK_ROWS),
            align_log2: Some(super::pack::BLOB_ALIGN.trailing_zeros() as u8),
        }
    }

    fn lock(&self) -> Result<Box<dyn WriterLease>> {
        let mut st = self.state()?;
        self.begin(&mut st)?;
        Ok(Box::new(DatasetLease {
            pid: std::process::id(),
            state: Arc::clone(&self.state),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A DataLoader worker forked while a thread of the trainer wrote through the same handle
    /// (or opened an index run) inherits those locks held for good: it reads what is
    /// committed without them, and refuses to write, rather than hang. The handle is marked
    /// as another process's and its locks held by this thread, as the child sees them.
    #[test]
    fn a_forked_reader_reads_while_the_handles_locks_are_held_and_writes_nothing() {
        let t = tempfile::tempdir().unwrap();
        let store = super::super::tests::store_with_a_dataset(t.path());
        let expected = crate::Dataset::open(t.path().join("src")).unwrap();
        let mut ds = StoreDataset::new(Arc::clone(&store), "d").unwrap();
        ds.list().unwrap(); // loads the index into the handle's memory
        ds.pid = 0;
        let ds = Arc::new(ds);
        let held = (
            ds.state.lock().unwrap(),
            ds.index.lock().unwrap(),
            super::super::index::opened_runs().unwrap(),
        );
        let read = crate::Dataset::open_in(Arc::clone(&ds) as _, Default::default()).unwrap();
        assert_eq!(read.len(), 3);
        for i in 0..3 {
            assert_eq!(
                read.sample(i)
                    .unwrap()
                    .read("hidden.1", None)
                    .unwrap()
                    .bytes(),
                expected
                    .sample(i)
                    .unwrap()
                    .read("hidden.1", None)
                    .unwrap()
                    .bytes()
            );
        }
        let refused = ds.create("x.tmp").map(|_| ()).unwrap_err().to_string();
        assert!(
            refused.contains("forked") && refused.contains("open the dataset again"),
            "{refused}"
        );
        assert!(ds.delete("manifest.json").is_err());
        drop(held);
    }

    /// A file a copy put and then deleted (its proof failed) before any commit of a new
    /// dataset: the deletion published a dataset of no files, which `store ls` listed.
    #[test]
    fn a_file_deleted_before_its_dataset_was_committed_publishes_nothing() {
        let t = tempfile::tempdir().unwrap();
        let store = super::super::tests::store_with_a_dataset(t.path());
        let ds = StoreDataset::new(Arc::clone(&store), "new").unwrap();
        ds.put_new("samples-000000.parquet", b"not committed", true)
            .unwrap();
        ds.delete("samples-000000.parquet").unwrap();
        assert!(store.snapshot("new").unwrap().is_none());
        assert_eq!(store.names().unwrap(), ["d"]);
        // A committed dataset whose last file is deleted (a failed first run of `convert`
        // taking back its manifest) is no dataset: `store ls` listed one of no files.
        ds.put_new("manifest.json", b"{}", true).unwrap();
        assert_eq!(store.names().unwrap(), ["d", "new"]);
        ds.delete("manifest.json").unwrap();
        assert!(store.snapshot("new").unwrap().is_none());
        assert_eq!(store.names().unwrap(), ["d"]);
    }

    /// A read finds a file's record in what the handle read of the dataset's file, not in
    /// that file decoded anew at each open (verify of a dataset of 3000 shards took 34 s, of
    /// which all but 0.3 s decoding it). The manifest, which commits replace, is read anew.
    #[test]
    fn a_dataset_s_file_is_decoded_once_for_its_reads_and_anew_for_its_manifest() {
        let t = tempfile::tempdir().unwrap();
        let store = super::super::tests::store_with_a_dataset(t.path());
        let ds = StoreDataset::new(Arc::clone(&store), "d").unwrap();
        let names = ds.list().unwrap();
        assert!(names.len() > 2, "{names:?}");
        ds.open(&names[0]).unwrap();
        let file = t.path().join("store/datasets/d.json");
        let sound = std::fs::read(&file).unwrap();
        std::fs::write(&file, b"not a dataset").unwrap();
        for name in names.iter().filter(|n| *n != MANIFEST_FILE) {
            ds.open(name).unwrap();
        }
        let err = ds.read(MANIFEST_FILE).unwrap_err().to_string();
        assert!(err.contains("d.json"), "{err}");
        std::fs::write(&file, sound).unwrap();
        assert!(ds.read(MANIFEST_FILE).unwrap().is_some());
    }

    /// A pack or index run that fails to publish may leave the blobs of files added before it
    /// in no index: the handle commits nothing more, so no dataset's file lists such a blob.
    #[test]
    fn a_handle_whose_blobs_failed_to_publish_commits_nothing_more() {
        use crate::io::{Faults, MemoryStorage};
        let t = tempfile::tempdir().unwrap();
        let meta = MemoryStorage::new("meta");
        let [packs, datasets, captures] =
            ["packs", "datasets", "captures"].map(|f| meta.sibling(f));
        std::fs::create_dir_all(t.path().join("locks")).unwrap();
        let parts = super::super::StoreParts {
            meta: Arc::new(meta.clone()),
            packs: Arc::new(packs),
            datasets: Arc::new(datasets),
            captures: Arc::new(captures),
            staging: Arc::new(LocalStorage::new(t.path().join("staging"))),
            locks: super::super::locks::Locks::Folder(t.path().join("locks")),
        };
        let store = Arc::new(Store::init_parts(Path::new("memory://s"), parts, [3; 16]).unwrap());
        let ds = StoreDataset::new(Arc::clone(&store), "d").unwrap();
        ds.put_new("samples-000000.parquet", b"added, not indexed", true)
            .unwrap();
        meta.set_faults(Faults {
            failing_publishes_of: Some("index".into()),
            ..Faults::default()
        });
        // Reading it back publishes its pack, then fails to index it.
        assert!(ds.read("samples-000000.parquet").is_err());
        meta.set_faults(Faults::default());
        let refused = ds
            .put_new(MANIFEST_FILE, b"{}", true)
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("an earlier write through this handle failed"),
            "{refused}"
        );
        assert!(store.snapshot("d").unwrap().is_none());
        // A handle opened anew writes.
        drop(ds);
        let again = StoreDataset::new(Arc::clone(&store), "d").unwrap();
        again.put_new(MANIFEST_FILE, b"{}", true).unwrap();
        assert_eq!(store.names().unwrap(), ["d"]);
    }
}
