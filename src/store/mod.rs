//! The deduplicating store (FORMAT.md §11): many datasets in one folder or object-store
//! prefix, each blob stored once. A blob is a chunk payload (keyed by the hash a shard's
//! index records for it), a shard's skeleton (the shard with its payloads cut out), or a
//! whole small file (manifest, segments, key runs, table parts). Blobs live in pack files,
//! found through the blob index; a named dataset lists its files and their blobs. A stored
//! dataset reads like a folder ([`StoreDataset`] is a [`crate::io::Storage`]), so every
//! reader, writer and command works on `STORE/NAME` as on a dataset folder.

pub mod captures;
pub mod gc;
pub mod index;
pub mod ingest;
pub mod locks;
pub mod pack;
pub mod skeleton;
pub mod snapshot;
pub mod storage;
pub mod usage;

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::format::manifest::{hex, unhex};
use crate::format::FormatError;
use crate::io::held::Held;
use crate::io::{FileBytes, FileReader, LocalStorage, ObjectStorage, Storage};
use crate::per_process::lock_for_an_instant;

pub use index::{BlobIndex, Location};
pub use ingest::{Ingest, IngestStats};
pub use locks::{Locks, StoreLock};
pub use pack::{BlobCodec, BlobEntry};
pub use snapshot::{FileRecord, Snapshot};
pub use storage::StoreDataset;

/// The file that makes a folder a store.
pub const STORE_FILE: &str = "store.json";
/// The `format` of `store.json`.
pub const STORE_FORMAT: &str = "hspack-store";
/// Store format version.
pub const STORE_VERSION: u32 = 1;

/// `store.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// [`STORE_FORMAT`].
    pub format: String,
    /// [`STORE_VERSION`].
    pub version: u32,
    /// 16 random bytes, hex.
    pub id: String,
}

/// Where the parts of a store are (FORMAT.md §11.1): a store in a folder or under a prefix
/// has them in its subfolders ([`Store::open`]).
pub struct StoreParts {
    /// `store.json`, the blob index and its runs.
    pub meta: Arc<dyn Storage>,
    /// The packs.
    pub packs: Arc<dyn Storage>,
    /// The datasets' files (`NAME.json`).
    pub datasets: Arc<dyn Storage>,
    /// The capture files.
    pub captures: Arc<dyn Storage>,
    /// Where files being written are staged.
    pub staging: Arc<LocalStorage>,
    /// The store's locks.
    pub locks: Locks,
}

/// `store.json` of a new store with id `id`.
fn config_bytes(id: [u8; 16]) -> Vec<u8> {
    let config = StoreConfig {
        format: STORE_FORMAT.into(),
        version: STORE_VERSION,
        id: hex(&id),
    };
    let mut bytes = serde_json::to_vec_pretty(&config).expect("serializable");
    bytes.push(b'\n');
    bytes
}

/// `store.json` of the store at `root` whose `meta` part is given, checked.
fn read_config(root: &Path, meta: &dyn Storage) -> Result<StoreConfig> {
    let bytes = meta.read(STORE_FILE)?.ok_or_else(|| Error::Store {
        path: root.to_path_buf(),
        detail: "not a store: it has no store.json (make one with `hspack store init`)".into(),
    })?;
    StoreConfig::decode(&bytes, meta.path(STORE_FILE))
}

impl StoreConfig {
    /// `store.json`'s bytes, read from `path` (for messages), checked: the format and version
    /// this hspack reads, and an id of 32 hex digits.
    pub fn decode(bytes: &[u8], path: PathBuf) -> Result<StoreConfig> {
        let newer = |found: &dyn std::fmt::Display, format: &str| Error::Store {
            path: path.clone(),
            detail: format!(
                "format {format} version {found}; this hspack reads {STORE_FORMAT} version \
             {STORE_VERSION}: upgrade hspack"
            ),
        };
        // A newer store's file may hold fields this one does not know: refused by its version,
        // not called damaged.
        let version = STORE_VERSION.into();
        if let Err(FormatError::UnsupportedVersion { found, .. }) =
            crate::format::version::refuse_unknown_version(bytes, "store.json", version, version)
        {
            return Err(newer(&found, STORE_FORMAT));
        }
        let config: StoreConfig = serde_json::from_slice(bytes).map_err(|e| Error::Store {
            path: path.clone(),
            detail: format!(
                "not a store file ({e}): it is damaged or was not written by hspack; restore it \
             from a copy of the store"
            ),
        })?;
        if config.format != STORE_FORMAT || config.version != STORE_VERSION {
            return Err(newer(&config.version, &config.format));
        }
        // The id names this machine's staging folder of a store in object storage: only the 32
        // hex digits a store is made with (FORMAT.md §11), never a path.
        if unhex(&config.id).is_none_or(|id| id.len() != 16) {
            return Err(Error::Store {
                path,
                detail: format!(
                    "its id {:?} is not 32 hex digits: the file is damaged or was not written by \
                 hspack; restore it from a copy of the store",
                    config.id
                ),
            });
        }
        Ok(config)
    }
}

/// A store, open.
pub struct Store {
    root: PathBuf,
    config: StoreConfig,
    meta: Arc<dyn Storage>,
    packs: Arc<dyn Storage>,
    datasets: Arc<dyn Storage>,
    captures: Arc<dyn Storage>,
    staging: Arc<LocalStorage>,
    locks: Locks,
    /// The packs opened, kept up to [`OPEN_PACKS`].
    open_packs: Held<[u8; 16], Arc<dyn FileReader>>,
    /// The index as last read to find blobs a collection moved ([`Store::with_moved`]).
    latest_index: Mutex<Option<Arc<BlobIndex>>>,
    /// Packs a read found gone, whose blobs were found moved: later reads of their blobs
    /// look in the index first, not at the pack again.
    gone_packs: Mutex<std::collections::HashSet<[u8; 16]>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("root", &self.root).finish()
    }
}

/// Rows of a token block in a dataset written into a store
/// ([`crate::WriteOptions::block_rows`]).
pub const STORE_BLOCK_ROWS: u64 = 16;

/// The packs a store handle keeps open for later reads, the one opened longest let go first:
/// a store of more packs than a process may map (`vm.max_map_count`) is read through too.
const OPEN_PACKS: usize = 4096;

/// True when `dir` (a folder or a URL) is a store: it holds `store.json`. False where that
/// cannot be read (for messages; [`split_store_path`] says why).
pub fn is_store(dir: &Path) -> bool {
    has_file(dir, STORE_FILE).unwrap_or(false)
}

/// Refuses `root` as a dataset's folder where it is a file, or lies under one (`notes.txt/ds`,
/// where no folder can be made: it was said as "cannot stat .../store.json: Not a
/// directory").
pub fn refuse_a_file_path(root: &Path) -> Result<()> {
    if crate::io::is_remote(root) {
        return Ok(());
    }
    if root.is_file() {
        return Err(Error::NotADataset {
            path: root.to_path_buf(),
            why: "it is a file: give a folder to write the dataset in (a new one, or one \
                  holding the dataset)"
                .into(),
        });
    }
    if let Some(file) = root.ancestors().skip(1).find(|a| a.is_file()) {
        return Err(Error::NotADataset {
            path: root.to_path_buf(),
            why: format!(
                "{} is a file, so no folder can be made under it: give a folder path to write \
                 the dataset in",
                file.display()
            ),
        });
    }
    Ok(())
}

/// Refuses `storage` as where a dataset is written when it is a file, or a store's root: the
/// dataset's files would lie beside the store's, where neither the store nor a reader of the
/// folder finds it. A dataset goes into a store as `STORE/NAME`.
pub fn refuse_root(storage: &dyn Storage) -> Result<()> {
    refuse_a_file_path(storage.root())?;
    if storage.size(STORE_FILE)?.is_none() {
        return Ok(());
    }
    let root = storage.root().display();
    Err(Error::Store {
        path: storage.root().to_path_buf(),
        detail: format!(
            "it is a store of datasets, not a dataset's folder; nothing was written: write the \
             dataset into it as {root}/NAME (`hspack store ls {root}` lists those there)"
        ),
    })
}

/// Whether `dir` (a folder or a URL) holds file `name`: an error where that cannot be told
/// (an object store that does not answer, or fails the request). Taken for "no", a store's
/// `store.json` that did not answer once made its `STORE/NAME` a plain folder: a copy wrote a
/// dataset among the store's files, which later hid the store's dataset of that name, and
/// each command waited out a second round of retries before it failed.
///
/// A request refused for want of rights is "no": S3 answers 403 for a missing object to a
/// reader who may not list the bucket (a read-only policy on one prefix), and a dataset's
/// folder above it is then asked for a `store.json` that is not there. So is a location no
/// storage opens (a store made of parts, `memory://`).
pub(crate) fn has_file(dir: &Path, name: &str) -> Result<bool> {
    if !crate::io::is_remote(dir) {
        return Ok(dir.join(name).is_file());
    }
    let size = ObjectStorage::open(&dir.to_string_lossy()).and_then(|s| s.size(name));
    match size {
        Ok(size) => Ok(size.is_some()),
        Err(Error::Unsupported { .. }) => Ok(false),
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::PermissionDenied => {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// The folders of a store in a folder: no new dataset takes one's name (its `STORE/NAME/`
/// folder, where convert keeps its key log, would be the store's own).
pub const STORE_FOLDERS: [&str; 5] = [PACKS, DATASETS, LOCKS, STAGING, captures::CAPTURES_DIR];

/// The store's folders (in object storage, prefixes) of packs, of named datasets, of locks,
/// and (in a folder) of files being written.
const PACKS: &str = "packs";
const DATASETS: &str = "datasets";
const LOCKS: &str = "locks";
const STAGING: &str = "staging";

/// When `path` is `STORE/NAME` (the parent a store, and no dataset at `path` itself), the
/// store's folder or URL and the name. A name no dataset may have is given too, for
/// [`StoreDataset::new`] to refuse: taken for a folder, it would be written among the store's
/// files, where neither the store nor a reader of the store finds it. Refused where the
/// store has a dataset `NAME` and a dataset of its own lies at `path` too: which one is meant
/// cannot be told, and reading either could serve the other's samples.
pub fn split_store_path(path: &Path) -> Result<Option<(PathBuf, String)>> {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return Ok(None);
    };
    let Some(parent) = path.parent() else {
        return Ok(None);
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    if crate::io::is_remote(path) && parent.to_string_lossy().ends_with(':') {
        return Ok(None); // `s3://bucket`: a bucket, not a store's dataset
    }
    if !has_file(parent, STORE_FILE)? {
        return Ok(None);
    }
    if !has_file(path, "manifest.json")? {
        return Ok(Some((parent.to_path_buf(), name.to_string())));
    }
    if snapshot::is_dataset_name(name) && Store::open(parent)?.read_snapshot(name)?.is_some() {
        return Err(two_datasets_at(path, parent, name));
    }
    Ok(None)
}

/// The error for `STORE/NAME` where a dataset lies beside the store's dataset `name`.
fn two_datasets_at(path: &Path, store: &Path, name: &str) -> Error {
    Error::Store {
        path: path.to_path_buf(),
        detail: format!(
            "two datasets answer to this path: one of its own (its manifest.json is there, \
             written beside the store rather than into it) and the dataset `{name}` of the \
             store {store}; either could be meant, so neither is read. Move the one beside the \
             store elsewhere (then `hspack store add {store} MOVED --name OTHER` adds it), or \
             remove the store's (`hspack store rm {store} {name}`)",
            store = store.display()
        ),
    }
}

/// `source` with `advice` (what to do) added where it has a detail to add it to: a
/// malformed file's error keeps its type (commands count it as damage), and says what to do.
pub(crate) fn advised(
    source: crate::format::FormatError,
    advice: &str,
) -> crate::format::FormatError {
    match source {
        crate::format::FormatError::Json { structure, detail } => {
            crate::format::FormatError::Json {
                structure,
                detail: format!("{detail}; {advice}"),
            }
        }
        other => other,
    }
}

/// The storage of `sub`, a part of the store at `root` (a folder or a URL).
fn part(root: &Path, sub: &str) -> Result<Arc<dyn Storage>> {
    if !crate::io::is_remote(root) {
        return Ok(Arc::new(LocalStorage::new(root.join(sub))));
    }
    Ok(Arc::new(ObjectStorage::open(&part_url(root, sub))?))
}

fn part_url(root: &Path, sub: &str) -> String {
    let root = root.to_string_lossy();
    let root = root.trim_end_matches('/');
    match sub {
        "" => root.to_string(),
        _ => format!("{root}/{sub}"),
    }
}

/// The storage at `location`: a dataset `NAME` of the store in folder `STORE` for
/// `STORE/NAME` (also as `file://STORE/NAME`), else what [`crate::io::open_location`] opens (a
/// folder or a URL). Readers, writers and commands open datasets through this.
pub fn open_location(location: impl AsRef<Path>) -> Result<Arc<dyn Storage>> {
    let location = location.as_ref();
    let text = location.to_string_lossy();
    let path = match text.split_once("://") {
        Some(("file", path)) => Path::new(path),
        Some(_) if !crate::io::is_remote(location) => return crate::io::open_location(location),
        _ => location,
    };
    match split_store_path(path)? {
        Some((store, name)) => Ok(Arc::new(StoreDataset::new(
            Arc::new(Store::open(store)?),
            &name,
        )?)),
        None => crate::io::open_location(location),
    }
}

/// What a reader of a stored file that does not read is told to do (`store verify` names the
/// datasets that lost blobs, and what mends them).
pub(crate) const RUN_STORE_VERIFY: &str = "run `hspack store verify`";

impl Store {
    /// Makes a new store in `dir`, a folder (created if missing) or an object-store URL
    /// (`s3://bucket/prefix`); refused where a store or a dataset is.
    pub fn init(dir: impl AsRef<Path>) -> Result<Self> {
        Self::init_with_id(dir, crate::io::unique_id(b"store"))
    }

    /// [`Store::init`] with a given store id (for reproducible files).
    pub fn init_with_id(dir: impl AsRef<Path>, id: [u8; 16]) -> Result<Self> {
        let dir = dir.as_ref();
        if has_file(dir, STORE_FILE)? || has_file(dir, "manifest.json")? {
            return Err(Error::Store {
                path: dir.to_path_buf(),
                detail: "a store or a dataset is already there; choose another place".into(),
            });
        }
        if !crate::io::is_remote(dir) {
            for sub in ["", PACKS, DATASETS, LOCKS, captures::CAPTURES_DIR] {
                crate::io::local::create_dir_durable(&dir.join(sub))?;
            }
        }
        let meta = part(dir, "")?;
        meta.create_root()?;
        meta.put_new(STORE_FILE, &config_bytes(id), true)?;
        Self::open(dir)
    }

    /// Makes a new store whose parts are `parts`, with store id `id`; refused where a store
    /// is ([`Error::CommitConflict`] on its `store.json`). For a store whose parts are not the folders of one folder (tests of what a power
    /// cut leaves of one in memory).
    pub fn init_parts(root: &Path, parts: StoreParts, id: [u8; 16]) -> Result<Self> {
        parts.meta.put_new(STORE_FILE, &config_bytes(id), true)?;
        Self::open_parts(root, parts)
    }

    /// Opens the store whose parts are `parts`, called `root` in messages.
    pub fn open_parts(root: &Path, parts: StoreParts) -> Result<Self> {
        let config = read_config(root, &*parts.meta)?;
        Ok(Self::from_parts(root.to_path_buf(), config, parts))
    }

    /// Opens the store in `dir`, a folder or an object-store URL.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let meta = part(dir, "")?;
        let config = read_config(dir, &*meta)?;
        let (staging, locks) = match crate::io::is_remote(dir) {
            false => (dir.join(STAGING), Locks::Folder(dir.join(LOCKS))),
            // Files being written are staged on this machine, in a folder of this store.
            true => (
                std::env::temp_dir()
                    .join("hspack-store-staging")
                    .join(&config.id),
                Locks::Objects(ObjectStorage::open(&part_url(dir, LOCKS))?),
            ),
        };
        let parts = StoreParts {
            meta,
            packs: part(dir, PACKS)?,
            datasets: part(dir, DATASETS)?,
            captures: part(dir, captures::CAPTURES_DIR)?,
            staging: Arc::new(LocalStorage::new(staging)),
            locks,
        };
        Ok(Self::from_parts(
            PathBuf::from(part_url(dir, "")),
            config,
            parts,
        ))
    }

    fn from_parts(root: PathBuf, config: StoreConfig, parts: StoreParts) -> Self {
        Store {
            root,
            config,
            meta: parts.meta,
            packs: parts.packs,
            datasets: parts.datasets,
            captures: parts.captures,
            staging: parts.staging,
            locks: parts.locks,
            open_packs: Held::new(OPEN_PACKS),
            latest_index: Mutex::new(None),
            gone_packs: Mutex::new(Default::default()),
        }
    }

    /// The store's folder or URL.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// True when the store is in object storage.
    pub fn is_remote(&self) -> bool {
        crate::io::is_remote(&self.root)
    }

    /// The store's locks.
    pub fn locks(&self) -> &Locks {
        &self.locks
    }

    /// Where files of its datasets being written are staged until they are added: the
    /// store's `staging/` folder, or for a store in object storage a folder of this
    /// machine's temp folder named after the store's id.
    pub fn staging(&self) -> &Arc<LocalStorage> {
        &self.staging
    }

    /// Where the capture files are.
    pub fn captures(&self) -> &Arc<dyn Storage> {
        &self.captures
    }

    /// `store.json`.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// Where `store.json`, `index.json` and the index runs are.
    pub fn meta(&self) -> &Arc<dyn Storage> {
        &self.meta
    }

    /// Where the packs are.
    pub fn packs(&self) -> &Arc<dyn Storage> {
        &self.packs
    }

    /// Where the named datasets' files are.
    pub fn datasets(&self) -> &Arc<dyn Storage> {
        &self.datasets
    }

    /// The blob index as it is now.
    pub fn index(&self) -> Result<BlobIndex> {
        let index = BlobIndex::open(&*self.meta)?;
        // No `index.json` is a store no add has committed into yet: one that holds datasets
        // has lost it (taken for empty, its blobs would all be garbage to a collection).
        if index.root_hash.is_none() && !self.names()?.is_empty() {
            return Err(Error::StoreDamage {
                path: self.meta.path(index::INDEX_ROOT),
                detail: format!(
                    "index.json is missing, but the store holds datasets, whose blobs it \
                     lists; {}",
                    index::INDEX_DAMAGE
                ),
            });
        }
        Ok(index)
    }

    /// Names of the datasets, sorted.
    pub fn names(&self) -> Result<Vec<String>> {
        let mut names: Vec<String> = self
            .datasets
            .list()?
            .into_iter()
            .filter_map(|f| f.strip_suffix(".json").map(str::to_string))
            .filter(|n| snapshot::is_dataset_name(n))
            .collect();
        names.sort();
        Ok(names)
    }

    /// Dataset `name` as committed, with its file's BLAKE3; `None` when there is none. A file
    /// that does not decode is [`Error::Format`], naming it and what to do.
    pub fn snapshot(&self, name: &str) -> Result<Option<(Snapshot, blake3::Hash)>> {
        self.read_snapshot(name)?.transpose()
    }

    /// Dataset `name`'s file: `None` when there is none, else the dataset, or the damage
    /// that keeps it from decoding. The outer error is the storage's (it could not be read).
    fn read_snapshot(&self, name: &str) -> Result<Option<Result<(Snapshot, blake3::Hash)>>> {
        let file = snapshot::snapshot_file(name);
        let Some(bytes) = self.datasets.read(&file)? else {
            return Ok(None);
        };
        let decoded = Snapshot::decode(&bytes).and_then(|s| match s.name == name {
            true => Ok(s),
            // Copied under another name by hand: a writer of either would take it for its own.
            false => Err(crate::format::FormatError::Json {
                structure: "stored dataset",
                detail: format!(
                    "it records the name `{}`, not `{name}`, its file's name (§11.5)",
                    s.name
                ),
            }),
        });
        Ok(Some(match decoded {
            Ok(s) => Ok((s, blake3::hash(&bytes))),
            Err(source) => Err(Error::Format {
                path: self.datasets.path(&file),
                source: advised(
                    source,
                    &format!(
                        "what dataset `{name}` holds is unknown: restore this file from a copy \
                         of the store, or remove the dataset (`hspack store rm {} {name}`)",
                        self.root.display()
                    ),
                ),
            }),
        }))
    }

    /// Dataset `name`, or an error saying which names there are.
    pub fn snapshot_or_err(&self, name: &str) -> Result<(Snapshot, blake3::Hash)> {
        self.snapshot(name)?.ok_or_else(|| self.no_dataset(name))
    }

    fn no_dataset(&self, name: &str) -> Error {
        Error::Store {
            path: self.root.join(name),
            detail: format!(
                "the store has no dataset `{name}`; it has: {} (add one with `hspack store add`)",
                self.names().map(|n| n.join(", ")).unwrap_or_default()
            ),
        }
    }

    /// Pack `id`, opened once per store handle (its memories are locked for an instant,
    /// never across a read).
    pub fn pack(&self, id: &[u8; 16]) -> Result<Arc<dyn FileReader>> {
        if let Some(f) = self.open_packs.get(id) {
            return Ok(f);
        }
        let name = pack::pack_name(id);
        let f = self.packs.open(&name).map_err(|e| match e {
            // Not a shard missing (which the reader would say of a file not found, and
            // `repair` could send again): the store lost a pack, which every dataset
            // referencing its blobs misses.
            Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                Error::StoreDamage {
                    path: self.packs.path(&name),
                    detail: format!(
                        "the pack is missing, but the store's index lists it: run `hspack store \
                         verify {}` to see the datasets that lost blobs, then repair each from a \
                         copy (`hspack repair STORE/NAME --from COPY`), or remove them (`hspack \
                         store rm`)",
                        self.root.display()
                    ),
                }
            }
            e => e,
        })?;
        // Another thread may have opened it meanwhile: the first one stays.
        Ok(self.open_packs.keep(*id, f))
    }

    /// Whether a pack of id `id`, holding `entries`, is there, and then whether every blob of
    /// it checks against its id ([`pack::PackWriter::finish`] asks, before it publishes one).
    pub fn pack_there_sound(
        &self,
        id: &[u8; 16],
        entries: &[pack::BlobEntry],
    ) -> Result<Option<bool>> {
        if self.packs.size(&pack::pack_name(id))?.is_none() {
            return Ok(None);
        }
        for e in entries {
            match self.blob(&Location {
                pack: *id,
                blob: *e,
            }) {
                Ok(_) => {}
                Err(e) if e.is_damage() => return Ok(Some(false)),
                Err(e) => return Err(e),
            }
        }
        Ok(Some(true))
    }

    /// Forgets the packs opened so far (after a collection replaced some).
    pub fn forget_packs(&self) {
        self.open_packs.clear();
    }

    /// `read` of the blob at `at`, found before a collection may have moved it (copied into
    /// a new pack, and deleted its pack): where `read` fails there, the blob is looked up in
    /// the index as last read, then as read now, and read where it is now. The error of the
    /// first read stands when the index has it nowhere else, or reading there fails too.
    pub fn with_moved<T>(&self, at: &Location, read: impl Fn(&Location) -> Result<T>) -> Result<T> {
        let gone = || lock_for_an_instant(&self.gone_packs);
        let known_gone = gone().is_some_and(|g| g.contains(&at.pack));
        let first = match known_gone {
            true => None,
            false => match read(at) {
                Ok(v) => return Ok(v),
                Err(e) => Some(e),
            },
        };
        let latest = || lock_for_an_instant(&self.latest_index);
        let known = latest().and_then(|l| l.clone());
        let now = || -> Result<Arc<BlobIndex>> {
            let index = Arc::new(self.index()?);
            let old = latest().and_then(|mut l| l.replace(Arc::clone(&index)));
            drop(old); // unmapped outside the lock
            Ok(index)
        };
        let indexes = known.map(Ok).into_iter().chain(std::iter::once_with(now));
        for index in indexes {
            let Ok(index) = index else { break };
            let moved = index.find(&at.blob.id).filter(|m| m.pack != at.pack);
            if let Some(Ok(v)) = moved.map(|m| read(&m)) {
                if let (false, Some(mut gone)) = (known_gone, gone()) {
                    gone.insert(at.pack);
                }
                return Ok(v);
            }
        }
        match first {
            Some(e) => Err(e),
            None => read(at),
        }
    }

    /// The stored bytes of the blob at `at` (zero-copy where the pack is mapped), unchecked.
    pub fn stored(&self, at: &Location) -> Result<FileBytes> {
        let b = &at.blob;
        let end = b.offset.checked_add(b.stored_len).ok_or_else(|| {
            self.damaged(
                at,
                format!("is {} bytes long, past the end of any file", b.stored_len),
            )
        })?;
        self.pack_range(at, b.offset..end)
    }

    /// Bytes `range` of the pack of the blob at `at`: a range past the pack's end (a pack cut
    /// short) is damage, named with the blob, not a failed read.
    pub(crate) fn pack_range(&self, at: &Location, range: Range<u64>) -> Result<FileBytes> {
        let pack = self.pack(&at.pack)?;
        if range.end > pack.len() {
            return Err(self.damaged(
                at,
                format!(
                    "lies past the end of its pack's {} bytes: the pack was cut short",
                    pack.len()
                ),
            ));
        }
        pack.read(range)
    }

    /// The bytes of the blob at `at`, decoded and checked against its id.
    pub fn blob(&self, at: &Location) -> Result<FileBytes> {
        self.checked(at, self.stored(at)?)
    }

    /// `stored`, the bytes of the blob at `at` as its pack holds them, decoded and checked
    /// against its id.
    pub(crate) fn checked(&self, at: &Location, stored: FileBytes) -> Result<FileBytes> {
        let bytes = match at.blob.codec {
            BlobCodec::None => stored,
            BlobCodec::Zstd => {
                // The length the index records and the one the frame declares must agree
                // before any memory is taken for it; a crafted length that cannot be
                // allocated is an error, not an abort.
                let raw_len = at.blob.raw_len;
                let declared = zstd::zstd_safe::get_frame_content_size(&stored);
                if let Ok(Some(n)) = declared.as_ref().map(|d| d.filter(|&n| n != raw_len)) {
                    return Err(self.damaged(
                        at,
                        format!("declares {n} bytes where the index records {raw_len}"),
                    ));
                }
                let mut raw = Vec::new();
                usize::try_from(raw_len)
                    .ok()
                    .and_then(|n| raw.try_reserve_exact(n).ok())
                    .ok_or_else(|| {
                        self.damaged(at, format!("holds {raw_len} bytes, more than memory"))
                    })?;
                zstd::bulk::Decompressor::new()
                    .and_then(|mut d| d.decompress_to_buffer(&stored, &mut raw))
                    .map_err(|e| self.damaged(at, format!("does not decode ({e})")))?;
                FileBytes::from_vec(raw)
            }
        };
        if bytes.len() as u64 != at.blob.raw_len || blake3::hash(&bytes).as_bytes() != &at.blob.id {
            return Err(self.damaged(at, "does not hash to its id".into()));
        }
        Ok(bytes)
    }

    /// The blob `id`, found through `index`, decoded and checked.
    pub fn blob_by_id(&self, index: &BlobIndex, id: &[u8; 32]) -> Result<FileBytes> {
        let at = index.find(id).ok_or_else(|| Error::StoreDamage {
            path: self.root.clone(),
            detail: format!(
                "blob {} is in no pack of the index: the store lost it; run `hspack store verify` and restore the dataset from a copy",
                hex(id)
            ),
        })?;
        self.blob(&at)
    }

    pub(crate) fn damaged(&self, at: &Location, what: String) -> Error {
        Error::StoreDamage {
            path: self.packs.path(&pack::pack_name(&at.pack)),
            detail: format!(
                "blob {} at byte {} {what}: the pack is damaged; {RUN_STORE_VERIFY}",
                hex(&at.blob.id),
                at.blob.offset
            ),
        }
    }
}

impl Store {
    /// Dataset `name` of this store, as a [`Storage`].
    pub fn dataset(self: &Arc<Self>, name: &str) -> Result<StoreDataset> {
        StoreDataset::new(Arc::clone(self), name)
    }

    /// Removes dataset `name` (its blobs stay until `store gc`); a dataset whose file does not
    /// decode is removed all the same.
    pub fn remove(&self, name: &str) -> Result<()> {
        let _lock = self.locks.dataset(&self.root, name)?;
        if self.read_snapshot(name)?.is_none() {
            return Err(self.no_dataset(name));
        }
        self.datasets.delete(&snapshot::snapshot_file(name))?;
        self.datasets.sync()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store holding dataset "d" of 3 synthetic samples, under `dir`.
    pub(crate) fn store_with_a_dataset(dir: &std::path::Path) -> Arc<Store> {
        let src = dir.join("src");
        let schema = crate::synth::capture_schema("m", 4, 64, &[1, 2]);
        let mut rng = crate::synth::Rng::new(7);
        let scales: Vec<_> = (0..2)
            .map(|_| crate::synth::channel_scales(&mut rng, 64))
            .collect();
        let mut w = crate::DatasetWriter::create(&src, schema, Default::default()).unwrap();
        for i in 0..3 {
            let sample = crate::synth::named_capture_sample(&mut rng, 40, &[1, 2], &scales);
            let fields: Vec<(&str, &[u8])> = sample
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_slice()))
                .collect();
            w.append(&format!("s{i}"), &fields).unwrap();
        }
        w.finish().unwrap();
        let store = Arc::new(Store::init(dir.join("store")).unwrap());
        let ds = crate::Dataset::open(&src).unwrap();
        crate::transfer::add_to_store(&store, &ds, "d", &|_| {}).unwrap();
        store
    }

    /// A zstd blob whose frame declares the huge length its index entry also records (a
    /// crafted or damaged store) is named as damaged before any memory is taken for it: no
    /// abort on a failed allocation.
    #[test]
    fn a_blob_declaring_more_than_memory_is_damage_not_an_abort() {
        let t = tempfile::tempdir().unwrap();
        let store = Store::init(t.path().join("store")).unwrap();
        let huge = 1u64 << 60;
        // A zstd frame: magic, single segment with an 8-byte content size, one empty raw last
        // block.
        let mut frame = vec![0x28, 0xb5, 0x2f, 0xfd, 0xe0];
        frame.extend_from_slice(&huge.to_le_bytes());
        frame.extend_from_slice(&[0x01, 0x00, 0x00]);
        assert!(
            matches!(zstd::zstd_safe::get_frame_content_size(&frame), Ok(Some(n)) if n == huge)
        );
        let mut w = pack::PackWriter::create(&**store.packs()).unwrap();
        w.push([7; 32], &frame, huge, pack::BlobCodec::Zstd)
            .unwrap();
        let (pack, blobs) = w.finish(false, &|_, _| Ok(None)).unwrap();
        let at = index::Location {
            pack,
            blob: blobs[0],
        };
        let err = store.blob(&at).unwrap_err().to_string();
        assert!(
            err.contains(&format!("holds {huge} bytes, more than memory")),
            "{err}"
        );
    }

    /// A forked child inherits the store's memories locked for good when another thread of
    /// its parent held them at the fork: reads do without them, rather than hang. Held by
    /// this thread here, as the child sees it.
    #[test]
    fn a_pack_opens_while_its_memories_are_held_elsewhere() {
        let t = tempfile::tempdir().unwrap();
        let store = store_with_a_dataset(t.path());
        let index = store.index().unwrap();
        let at = index.entries().next().unwrap();
        let held = (
            store.open_packs.hold(),
            store.gone_packs.lock().unwrap(),
            store.latest_index.lock().unwrap(),
        );
        let bytes = store.with_moved(&at, |at| store.blob(at)).unwrap();
        assert_eq!(bytes.len() as u64, at.blob.raw_len);
        store.forget_packs();
        drop(held);
    }
}
