//! Opening a dataset and reading samples by ordinal or key.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use crate::error::{Error, Result};
use crate::format::{ChunkHeader, DType, ExtentEntry, Manifest, SampleEntry, Schema};
use crate::io::cache::{CacheOptions, CachedStorage, ChunkCache};
use crate::io::held::Held;
use crate::io::Storage;

use super::key_directory::{self, KeyDirectory};
use super::key_runs::KeyRuns;
use super::shard::{CheckPolicy, Shard};
use super::tensor::{AlignedBytes, Buffer, Tensor};

/// Bytes of a concatenated read a thread of the pool fills at a time.
const CONCAT_BLOCK: usize = 1 << 20;

/// Rows of one extent of one field in a concatenated read: where they go in each row of the
/// output, and which of the read's rows they are (counted from its first).
struct ConcatPart {
    f: usize,
    column: usize,
    width: usize,
    rows: Range<u64>,
}

/// The largest span of a sample's chunks [`Sample::prefetch`] fetches in one request.
pub const MAX_PREFETCH: u64 = 256 << 20;

/// The shards a dataset keeps mapped unless [`ReadOptions::mapped_shards`] says otherwise:
/// with a checked-chunk memo, two regions each, a quarter of the regions a process may map
/// by default (`vm.max_map_count`, 65,530).
pub const DEFAULT_MAPPED_SHARDS: usize = 8192;

/// Options for reading.
#[derive(Debug, Clone, Default)]
pub struct ReadOptions {
    /// When chunk payloads are hashed.
    pub check: CheckPolicy,
    /// A folder (e.g. in `/dev/shm`) where [`CheckPolicy::Once`] records which chunks were
    /// checked, shared by every process that opens the dataset with the same folder: the
    /// DataLoader workers of one training run hash each chunk once in all, not once each and
    /// every epoch. One small file per shard (a byte per chunk), named after the dataset and
    /// the shard's index, so that a folder given to another dataset vouches for none of its
    /// chunks. A memo lives as long as one reading session: what it records was checked then.
    /// `None`: per process.
    pub checked_memo: Option<PathBuf>,
    /// A local folder that keeps the blocks of files read from object storage, shared by
    /// every process given the same folder, so later epochs read local disk
    /// ([`crate::io::cache`]). Files a storage maps, as a local folder's are, are read in
    /// place and never cached. Used by [`Dataset::open_with`]. `None`: no cache.
    pub cache: Option<CacheOptions>,
    /// At most this many shards stay mapped for later reads, the one mapped longest let go
    /// first (it stays mapped while a sample or tensor read from it lives). `None`:
    /// [`DEFAULT_MAPPED_SHARDS`]. A process maps at most `vm.max_map_count` regions, so a
    /// dataset of more shards than that could not be read through if every shard stayed. A
    /// shard let go and read again is checked again: its index, and under
    /// [`CheckPolicy::Once`] without a `checked_memo`, its chunks (what it checked went with
    /// it); with a memo, the chunks are not hashed again.
    pub mapped_shards: Option<usize>,
}

/// An open dataset. Opening reads the manifest only; shards are mapped and checked on first
/// use, and kept mapped up to [`ReadOptions::mapped_shards`]. Share it between threads by
/// reference or `Arc`.
#[derive(Debug)]
pub struct Dataset {
    storage: Arc<dyn Storage>,
    manifest: Manifest,
    manifest_bytes: Vec<u8>,
    dataset_id: [u8; 16],
    /// The shards opened and kept, by number.
    shards: Held<usize, Arc<Shard>>,
    options: ReadOptions,
    cache: Option<ChunkCache>,
    /// Which shards hold a key, built on the first lookup by key of a dataset of many shards.
    key_directory: OnceLock<KeyDirectory>,
    /// The segments' key runs (manifest version 4), opened on the first lookup by key.
    key_runs: KeyRuns,
}

/// The error for a location with no manifest, saying what is there instead.
fn not_a_dataset(root: &Path) -> Error {
    let local = !crate::io::is_remote(root);
    let why = if local && !root.exists() {
        "there is nothing there; check the path (`hspack demo` writes a dataset to try)".into()
    } else if local && root.is_file() {
        let folder = root
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map_or(".".into(), |p| p.display().to_string());
        let (extensions, _) = crate::convert::layout::Preset::Generic.extensions();
        let named = |e: &str| {
            let name = root.file_name().unwrap_or_default().to_string_lossy();
            name.ends_with(e) || name.ends_with(&format!("{e}.gz"))
        };
        match extensions.iter().any(|e| named(e)) {
            true => format!(
                "it is a file, a dump to convert? `hspack convert {folder} OUT --layout ...` \
                 makes a dataset of the dumps in its folder (see `hspack convert --help`); \
                 else give the dataset's folder (the one holding manifest.json)"
            ),
            false => format!(
                "it is a file; give the dataset's folder, the one holding manifest.json \
                 (`{folder}`, this file's folder, if it is one)"
            ),
        }
    } else if local && holds_shards(root) {
        "it holds a dataset's shards but no manifest.json: a copy (`hspack cp`) or a writer \
         stopped before its first commit left them, and running it again resumes; if the \
         manifest was lost, copy the dataset again from an intact copy"
            .into()
    } else if crate::store::is_store(root) {
        format!(
            "it is a store of datasets: name one as {}/NAME (`hspack store ls {}` lists them)",
            root.display(),
            root.display()
        )
    } else if let Some(first) = local.then(|| datasets_in(root)).filter(|d| !d.is_empty()) {
        format!(
            "it is a folder of datasets ({}): give one of them, as {}",
            first.join(", "),
            root.join(&first[0]).display()
        )
    } else if let Some(dump) = local.then(|| convertible_file(root)).flatten() {
        format!(
            "it has no manifest.json, and holds files to convert (such as {dump}): `hspack \
             convert {} OUT` makes a dataset of them",
            root.display()
        )
    } else {
        "it has no manifest.json (write one with hspack's writer, or run `hspack demo`)".into()
    };
    Error::NotADataset {
        path: root.to_path_buf(),
        why,
    }
}

/// The names of up to 5 datasets (folders holding a `manifest.json`) among the first 256
/// entries of folder `dir`, in order.
fn datasets_in(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<String> = entries
        .flatten()
        .take(256)
        .filter(|e| {
            e.path()
                .join(crate::format::manifest::MANIFEST_FILE)
                .is_file()
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    found.sort();
    found.truncate(5);
    found
}

/// Whether folder `dir` holds shards, or shards being written (a look at its first 4096
/// entries).
fn holds_shards(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().take(4096).any(|e| {
        let name = e.file_name();
        let name = name.to_string_lossy();
        name.starts_with("shard-") && name.contains(".hsp")
    })
}

/// The name of a file in folder `dir` (or a folder in it) that `hspack convert` reads, if any:
/// a look at the first 256 entries of each, no deeper. None where `dir` holds a dataset's
/// files (one that lost its manifest, whose key runs end in `.bin` as some dumps do).
fn convertible_file(dir: &Path) -> Option<String> {
    let (extensions, _) = crate::convert::layout::Preset::Generic.extensions();
    let names = |d: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(d)
            .map(|r| r.flatten().take(256).map(|e| e.path()).collect())
            .unwrap_or_default()
    };
    let top = names(dir);
    let data_file = |p: &PathBuf| {
        p.file_name()
            .is_some_and(|n| crate::format::manifest::is_data_file_name(&n.to_string_lossy()))
    };
    if top.iter().any(data_file) {
        return None;
    }
    let below = top.iter().filter(|p| p.is_dir()).flat_map(|d| names(d));
    top.iter().cloned().chain(below).find_map(|p| {
        let name = p.file_name()?.to_string_lossy().into_owned();
        let base = name.strip_suffix(".gz").unwrap_or(&name);
        extensions
            .iter()
            .any(|x| base.ends_with(x))
            .then(|| p.strip_prefix(dir).unwrap_or(&p).display().to_string())
    })
}

impl Dataset {
    /// Opens the dataset in folder `dir`.
    pub fn open(dir: impl AsRef<Path>) -> Result<Dataset> {
        Self::open_with(dir, ReadOptions::default())
    }

    /// Opens the dataset in folder `dir` with `options`; with `options.cache`, reads go
    /// through that cache.
    pub fn open_with(dir: impl AsRef<Path>, options: ReadOptions) -> Result<Dataset> {
        if options
            .cache
            .as_ref()
            .is_some_and(|c| c.dir.as_os_str().is_empty())
        {
            // It would cache into whatever folder the process runs in, which no eviction
            // lists: unbounded.
            return Err(Error::BadOption {
                option: "cache_dir",
                detail: "an empty path names no folder: give the cache's folder (\".\" for \
                         this one)"
                    .into(),
            });
        }
        let storage = crate::store::open_location(dir)?;
        let Some(cache) = options.cache.clone().map(ChunkCache::new) else {
            return Self::open_in(storage, options);
        };
        let storage = Arc::new(CachedStorage::new(storage, cache.clone()));
        let mut ds = Self::open_in(storage, options)?;
        ds.cache = Some(cache);
        Ok(ds)
    }

    /// Opens the dataset in `storage` with `options`.
    pub fn open_in(storage: Arc<dyn Storage>, options: ReadOptions) -> Result<Dataset> {
        let Some((manifest, manifest_bytes)) = super::load_manifest(&*storage)? else {
            return Err(not_a_dataset(storage.root()));
        };
        let shards = Held::new(options.mapped_shards.unwrap_or(DEFAULT_MAPPED_SHARDS));
        let key_runs = KeyRuns::new(manifest.segments.len());
        Ok(Dataset {
            dataset_id: manifest.dataset_id_bytes(),
            storage,
            manifest,
            manifest_bytes,
            shards,
            options,
            cache: None,
            key_directory: OnceLock::new(),
            key_runs,
        })
    }

    /// Where the dataset is: its folder, or a URL.
    pub fn dir(&self) -> &Path {
        self.storage.root()
    }

    /// The storage the dataset is read from.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The manifest's bytes, as read.
    pub fn manifest_bytes(&self) -> &[u8] {
        &self.manifest_bytes
    }

    /// The schema.
    pub fn schema(&self) -> &Schema {
        &self.manifest.schema
    }

    /// Samples in the dataset.
    pub fn len(&self) -> u64 {
        self.manifest.samples
    }

    /// True when the dataset has no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The read options.
    pub fn options(&self) -> &ReadOptions {
        &self.options
    }

    /// The block cache reads go through ([`ReadOptions::cache`]), for its counters.
    pub fn cache(&self) -> Option<&ChunkCache> {
        self.cache.as_ref()
    }

    /// Shard `seq`, mapped and checked on first use and kept for later reads (up to
    /// [`ReadOptions::mapped_shards`]).
    pub fn shard(&self, seq: usize) -> Result<Arc<Shard>> {
        if let Some(s) = self.kept_shard(seq)? {
            return Ok(s);
        }
        let shard = Arc::new(self.open_shard(seq)?);
        Ok(self.shards.keep(seq, shard))
    }

    /// Shard `seq` for a pass over every shard (a listing, a copy, a writer reopening the
    /// dataset): the one the dataset keeps where it has it, else opened anew and not kept, so
    /// it is let go once the caller and the samples read through it ([`Dataset::sample_of`])
    /// drop it, and the pass does not push out the shards a reader keeps.
    pub fn shard_apart(&self, seq: usize) -> Result<Arc<Shard>> {
        match self.kept_shard(seq)? {
            Some(s) => Ok(s),
            None => self.open_shard(seq).map(Arc::new),
        }
    }

    /// The shard `seq` the dataset keeps, if it does; an error past its shards.
    fn kept_shard(&self, seq: usize) -> Result<Option<Arc<Shard>>> {
        if seq >= self.manifest.shards.len() {
            return Err(self.no_such_shard(seq));
        }
        Ok(self.shards.get(&seq))
    }

    fn no_such_shard(&self, seq: usize) -> Error {
        Error::BadOption {
            option: "shard",
            detail: format!(
                "{seq} is not a shard number of {}, which has {} shards",
                self.storage.root().display(),
                self.manifest.shards.len()
            ),
        }
    }

    /// Shard `seq` (a shard number of the dataset) opened anew and checked as [`Dataset::shard`]
    /// opens it, not kept by the dataset: for a pass over every shard that lets each go when
    /// done with it (a process maps at most `vm.max_map_count` regions, 65530 by default).
    pub(crate) fn open_shard(&self, seq: usize) -> Result<Shard> {
        Shard::open(
            &*self.storage,
            &self.manifest.shards[seq],
            self.dataset_id,
            self.schema(),
            self.options.checked_memo.as_deref(),
        )
        .map_err(|e| self.rewritten_or(e))
    }

    /// `e`, a shard's failure to open, or [`Error::DatasetRewritten`] where the manifest there
    /// now names another dataset: a shard of the new one read as a foreign shard copied in,
    /// and the advice (copy the right shard in) could fix nothing; or
    /// [`Error::DatasetRemoved`] where a shard is gone and so is the manifest (advice to
    /// repair could fix nothing either).
    fn rewritten_or(&self, e: Error) -> Error {
        let shard_gone =
            matches!(&e, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound);
        if !(shard_gone || matches!(e, Error::ForeignShard { .. } | Error::ShardMismatch { .. })) {
            return e;
        }
        self.moved_on(shard_gone).unwrap_or(e)
    }

    /// [`Error::DatasetRewritten`] where the manifest there now names another dataset, or,
    /// where `gone` (a file it lists was found missing), [`Error::DatasetRemoved`] where the
    /// manifest is gone too; `None` while the dataset there is still this one.
    pub(crate) fn moved_on(&self, gone: bool) -> Option<Error> {
        match super::load_manifest(&*self.storage) {
            Ok(Some((now, _))) if now.dataset_id_bytes() != self.dataset_id => {
                Some(Error::DatasetRewritten {
                    path: self.storage.root().to_path_buf(),
                    opened: self.manifest.dataset_id.clone(),
                    now: now.dataset_id,
                })
            }
            Ok(None) if gone => Some(Error::DatasetRemoved {
                path: self.storage.root().to_path_buf(),
            }),
            _ => None,
        }
    }

    /// The shard number and shard-local position of `ordinal`.
    pub fn locate(&self, ordinal: u64) -> Result<(usize, u64)> {
        if ordinal >= self.len() {
            return Err(Error::NoSuchSample {
                ordinal,
                len: self.len(),
            });
        }
        let shards = &self.manifest.shards;
        let seq = shards.partition_point(|s| s.first_ordinal + s.samples <= ordinal);
        Ok((seq, ordinal - shards[seq].first_ordinal))
    }

    /// Sample `ordinal`.
    pub fn sample(&self, ordinal: u64) -> Result<Sample<'_>> {
        let (seq, local) = self.locate(ordinal)?;
        self.sample_in(seq, local)
    }

    /// Sample `local` of `shard`, a shard of this dataset opened apart
    /// ([`Dataset::shard_apart`]); `None` past its samples.
    pub fn sample_of(&self, shard: &Arc<Shard>, local: u64) -> Option<Sample<'_>> {
        let entry = shard.index().sample(local)?;
        Some(Sample {
            ds: self,
            shard: Arc::clone(shard),
            entry,
        })
    }

    fn sample_in(&self, seq: usize, local: u64) -> Result<Sample<'_>> {
        Ok(self
            .sample_of(&self.shard(seq)?, local)
            .expect("locate keeps local below the shard's count"))
    }

    /// The sample with `key`, or `None`. A shard that cannot be opened does not hide the keys
    /// of the others: the key is looked up in every shard that opens, and only when it is in
    /// none of them is the first shard's error returned (the key may be in that shard).
    pub fn find(&self, key: &str) -> Result<Option<Sample<'_>>> {
        if self.manifest.is_segmented() {
            return self.find_by_runs(key);
        }
        if self.manifest.shards.len() > key_directory::FROM_SHARDS {
            let directory = self.key_directory.get_or_init(|| KeyDirectory::build(self));
            let hash = crate::format::key_hash(key);
            let candidates = directory.shards_for(hash);
            return self.find_in(key, candidates.chain(directory.unindexed().iter().copied()));
        }
        self.find_in(key, 0..self.manifest.shards.len())
    }

    /// [`Dataset::find`] through the segments' key runs: the shards their entries name, then
    /// (when the key is in none) every shard of a segment whose run could not be read.
    fn find_by_runs(&self, key: &str) -> Result<Option<Sample<'_>>> {
        let runs: Vec<_> = (self.manifest.segment_files.iter())
            .map(|f| f.keys.as_ref())
            .collect();
        let found = (self.key_runs).candidates(&*self.storage, &runs, crate::format::key_hash(key));
        let mut seqs = Vec::new();
        for ordinal in found.ordinals.into_iter().filter(|&o| o < self.len()) {
            seqs.push(self.locate(ordinal)?.0);
        }
        seqs.dedup();
        let unread = found.unread.into_iter().flat_map(|i| {
            let g = &self.manifest.segments[i];
            g.first_seq as usize..(g.first_seq + g.shards) as usize
        });
        self.find_in(key, seqs.into_iter().chain(unread))
    }

    /// The sample with `key` in one of `shards`; the first error of a shard that fails to
    /// open, when the key is in none of those that open.
    fn find_in(
        &self,
        key: &str,
        shards: impl Iterator<Item = usize>,
    ) -> Result<Option<Sample<'_>>> {
        let mut failed = None;
        for seq in shards {
            match self.shard(seq) {
                Ok(shard) => {
                    // Read through the shard in hand: looked up again, it may have been let
                    // go meanwhile (`mapped_shards`), and opened and checked once more.
                    if let Some(local) = shard.index().find_key(key) {
                        return Ok(self.sample_of(&shard, local));
                    }
                }
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        failed.map_or(Ok(None), Err)
    }

    /// The keys of shard `seq` (below the shard count) in ordinal order, or the error that
    /// shard fails to open with; the shard opened apart ([`Dataset::shard_apart`]).
    fn shard_keys(&self, seq: usize) -> Result<Vec<String>> {
        let shard = self.shard_apart(seq)?;
        let index = shard.index();
        Ok((0..index.sample_count())
            .map(|i| index.sample(i).and_then(|s| index.key_of(&s)).unwrap_or(""))
            .map(str::to_string)
            .collect())
    }

    /// Every key in ordinal order, shard by shard: one item per shard, holding that shard's
    /// keys or the error it fails to open with, so that one damaged shard does not hide the
    /// keys of the others. Each shard is let go once its keys are taken: a dataset of more
    /// shards than a process may map is walked too.
    pub fn keys_by_shard(&self) -> impl Iterator<Item = ShardKeys> + '_ {
        self.manifest
            .shards
            .iter()
            .enumerate()
            .map(|(seq, record)| ShardKeys {
                seq,
                file: self.storage.path(&record.file),
                ordinals: record.first_ordinal..record.first_ordinal + record.samples,
                keys: self.shard_keys(seq),
            })
    }

    /// Every sample's index entry and key, in ordinal order. A shard that cannot be opened
    /// yields its error in its place (once); the walk goes on with the next shard, so the
    /// caller decides whether to stop. Each shard is opened apart ([`Dataset::shard_apart`]).
    pub fn samples(&self) -> impl Iterator<Item = Result<SampleInfo>> + '_ {
        (0..self.manifest.shards.len()).flat_map(move |seq| {
            let items: Vec<Result<SampleInfo>> = match self.shard_apart(seq) {
                Ok(shard) => {
                    let index = shard.index();
                    (0..index.sample_count())
                        .filter_map(|i| {
                            let entry = index.sample(i)?;
                            let key = index.key_of(&entry).unwrap_or("").to_string();
                            Some(Ok(SampleInfo { seq, key, entry }))
                        })
                        .collect()
                }
                Err(e) => vec![Err(e)],
            };
            items
        })
    }

    /// The sample with `key`; an error names the key when there is none.
    pub fn get_by_key(&self, key: &str) -> Result<Sample<'_>> {
        self.find(key)?.ok_or_else(|| Error::NoSuchKey {
            key: key.to_string(),
        })
    }

    /// Field number `f` of the schema.
    pub fn field(&self, f: usize) -> Result<&crate::format::Field> {
        self.schema()
            .fields
            .get(f)
            .ok_or_else(|| Error::NoSuchField {
                name: format!("number {f}"),
                available: self.field_names(),
            })
    }

    /// The schema's fields, numbered, for errors.
    fn field_names(&self) -> String {
        (self.schema().fields.iter())
            .enumerate()
            .map(|(i, f)| format!("{i}: {}", f.name))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The number of the field named `name`.
    pub fn field_index(&self, name: &str) -> Result<usize> {
        self.schema()
            .field_index(name)
            .ok_or_else(|| Error::NoSuchField {
                name: name.to_string(),
                available: self.field_names(),
            })
    }
}

/// The keys of one shard, from [`Dataset::keys_by_shard`].
#[derive(Debug)]
pub struct ShardKeys {
    /// Shard number.
    pub seq: usize,
    /// Shard file.
    pub file: PathBuf,
    /// Ordinals of the shard's samples, from the manifest.
    pub ordinals: Range<u64>,
    /// The keys in ordinal order, or the error the shard fails to open with.
    pub keys: Result<Vec<String>>,
}

/// What a shard's index says of one sample, from [`Dataset::samples`].
#[derive(Debug, Clone)]
pub struct SampleInfo {
    /// The shard's number.
    pub seq: usize,
    /// The key.
    pub key: String,
    /// The index entry: ordinal, rows, loss rows, raw bytes.
    pub entry: SampleEntry,
}

impl SampleInfo {
    /// Rows whose loss mask is set, when the schema has a loss mask.
    pub fn loss_rows(&self) -> Option<u64> {
        self.entry.loss_rows()
    }
}

/// One sample of an open dataset.
#[derive(Debug, Clone)]
pub struct Sample<'d> {
    pub(super) ds: &'d Dataset,
    pub(super) shard: Arc<Shard>,
    pub(super) entry: SampleEntry,
}

impl<'d> Sample<'d> {
    /// Ordinal in the dataset.
    pub fn ordinal(&self) -> u64 {
        self.entry.ordinal
    }

    /// Rows (tokens).
    pub fn rows(&self) -> u64 {
        self.entry.rows
    }

    /// Rows whose loss mask is set, when the schema has a loss mask.
    pub fn loss_rows(&self) -> Option<u64> {
        self.entry.loss_rows()
    }

    /// Decoded bytes of all fields.
    pub fn raw_bytes(&self) -> u64 {
        self.entry.raw_bytes
    }

    /// The key.
    pub fn key(&self) -> &str {
        // Validated when the shard was opened.
        self.shard.index().key_of(&self.entry).unwrap_or("")
    }

    /// The shard holding the sample.
    pub fn shard(&self) -> &Arc<Shard> {
        &self.shard
    }

    /// Memory for `rows` rows of `row_bytes` bytes of this sample, or an error naming it where
    /// that much cannot be had (rows a damaged or crafted index declares): never an abort.
    fn memory_for(&self, rows: u64, row_bytes: u64) -> Result<AlignedBytes> {
        let bytes = rows.checked_mul(row_bytes);
        bytes
            .and_then(|n| usize::try_from(n).ok())
            .and_then(AlignedBytes::for_overwrite)
            .ok_or_else(|| self.no_memory_for(rows, row_bytes))
    }

    /// Room in `v` for `rows` more rows of `per_row` items of this sample, or the error of
    /// [`Sample::memory_for`]: never an abort.
    pub(super) fn reserve<T>(&self, v: &mut Vec<T>, rows: u64, per_row: u64) -> Result<()> {
        let items = rows.checked_mul(per_row);
        match items.and_then(|n| usize::try_from(n).ok()) {
            Some(n) if v.try_reserve_exact(n).is_ok() => Ok(()),
            _ => Err(self.no_memory_for(
                rows,
                per_row.saturating_mul(std::mem::size_of::<T>() as u64),
            )),
        }
    }

    /// Why `rows` rows of `row_bytes` bytes of this sample could not be had.
    fn no_memory_for(&self, rows: u64, row_bytes: u64) -> Error {
        Error::Io {
            path: self.shard.path().to_path_buf(),
            op: "allocate",
            source: std::io::Error::new(
                std::io::ErrorKind::OutOfMemory,
                format!(
                    "sample `{}` (ordinal {}): {rows} rows of {row_bytes} bytes are more \
                     memory than this process can have; its shard's index declares them \
                     (run `hspack verify` if the sample is not that large)",
                    self.key(),
                    self.ordinal()
                ),
            ),
        }
    }

    /// The extents of field number `field`.
    pub fn extents(&self, field: usize) -> Vec<ExtentEntry> {
        self.shard
            .index()
            .extents_of(&self.entry)
            .filter(|x| x.field as usize == field)
            .collect()
    }

    /// Refuses a field number the schema does not have.
    fn check_fields(&self, fields: &[usize]) -> Result<()> {
        fields.iter().try_for_each(|&f| self.ds.field(f).map(drop))
    }

    pub(super) fn check_rows(&self, rows: &Range<u64>) -> Result<()> {
        if rows.start > rows.end || rows.end > self.rows() {
            return Err(Error::RowsOutOfRange {
                key: self.key().to_string(),
                start: rows.start,
                end: rows.end,
                rows: self.rows(),
            });
        }
        Ok(())
    }

    /// Rows `rows` (all rows when `None`) of the field named `name`. Zero-copy when they lie in
    /// one uncompressed chunk; otherwise decoded and gathered into one buffer.
    pub fn read(&self, name: &str, rows: Option<Range<u64>>) -> Result<Tensor> {
        let f = self.ds.field_index(name)?;
        self.read_field(f, rows)
    }

    /// Like [`Sample::read`], by field number.
    pub fn read_field(&self, f: usize, rows: Option<Range<u64>>) -> Result<Tensor> {
        let field = self.ds.field(f)?;
        let rows = rows.unwrap_or(0..self.rows());
        self.check_rows(&rows)?;
        let row_bytes = field.row_bytes() as usize;
        let mut shape = vec![rows.end - rows.start];
        shape.extend_from_slice(&field.shape);
        let extents = self.extents(f);
        let touching: Vec<&ExtentEntry> = extents
            .iter()
            .filter(|x| x.row_start < rows.end && rows.start < x.row_start + x.row_count)
            .collect();
        if let Some(data) = self.stored_as_is(&touching, &rows, row_bytes)? {
            return Ok(Tensor {
                dtype: field.dtype,
                shape,
                data,
            });
        }
        let mut out = self.memory_for(rows.end - rows.start, row_bytes as u64)?;
        self.read_into(f, rows, out.as_bytes_mut())?;
        Ok(Tensor {
            dtype: field.dtype,
            shape,
            data: Buffer::Owned(out),
        })
    }

    /// Rows `rows` of the extents `touching` (in row order), when every chunk is stored as
    /// it is and they tile the rows: one view of the storage's bytes where there is one chunk
    /// or their parts lie one after another in the same mapping (the row blocks of a field
    /// laid in order in a store's pack), else a copy of the parts, each chunk read once. `None` for chunks with
    /// a codec, or extents with gaps: the caller decodes.
    fn stored_as_is(
        &self,
        touching: &[&ExtentEntry],
        rows: &Range<u64>,
        row_bytes: usize,
    ) -> Result<Option<Buffer>> {
        use rayon::prelude::*;
        let schema = self.ds.schema();
        let index = self.shard.index();
        let stored_as_is = |x: &&ExtentEntry| {
            index
                .chunk(x.chunk.into())
                .is_some_and(|e| e.codec == crate::format::Codec::None.code())
        };
        let tiled = touching
            .iter()
            .zip(touching.iter().skip(1))
            .all(|(a, b)| a.row_start + a.row_count == b.row_start);
        let covered = touching.first().is_some_and(|x| x.row_start <= rows.start)
            && touching
                .last()
                .is_some_and(|x| x.row_start + x.row_count >= rows.end);
        if !covered || !tiled || !touching.iter().all(stored_as_is) {
            return Ok(None);
        }
        // Each chunk is checked on first read: several on the pool, as one large chunk's
        // hash is (one alone on this thread: handing it over would cost more).
        let chunk = |x: &&ExtentEntry| {
            self.shard
                .chunk(x.chunk.into(), schema, self.ds.options.check)
                .map(|(_, stored)| stored)
        };
        let bytes = (rows.end - rows.start) * row_bytes as u64;
        let pooled = touching.len() > 1 && bytes >= crate::parallel::WORTH_THE_POOL;
        let chunks: Vec<crate::io::FileBytes> = if pooled {
            crate::parallel::install(|| touching.par_iter().map(chunk).collect::<Result<_>>())?
        } else {
            touching.iter().map(chunk).collect::<Result<_>>()?
        };
        let mut parts = Vec::with_capacity(chunks.len());
        for (x, stored) in touching.iter().zip(&chunks) {
            let lo = x.row_start.max(rows.start);
            let hi = (x.row_start + x.row_count).min(rows.end);
            let first = (x.chunk_row + lo - x.row_start) as usize * row_bytes;
            let part = stored
                .slice(first..first + (hi - lo) as usize * row_bytes)
                .expect("the index was validated: extents lie inside their chunks");
            parts.push(part);
        }
        let joined = parts[1..]
            .iter()
            .try_fold(parts[0].clone(), |view, part| view.joined(part));
        if let Some(view) = joined {
            return Ok(Some(Buffer::File(view)));
        }
        let mut out = self.memory_for(1, bytes)?;
        let mut at = 0;
        for part in &parts {
            out.as_bytes_mut()[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        Ok(Some(Buffer::Owned(out)))
    }

    /// Asks the storage to read ahead every chunk of fields `fields` (numbers). Shards are
    /// mapped for random access (no readahead), so a cold sample would otherwise fault in
    /// page by page. With `load`, reads them into the page cache before returning, for
    /// readers whose tensors another process maps: the disk reads then happen here, in
    /// parallel across DataLoader workers, not page by page in the trainer.
    ///
    /// From a storage that cannot map (object storage), fetches the span of those chunks in
    /// one request, kept for the reads that follow, when it is at most [`MAX_PREFETCH`]: until
    /// the next prefetch in the shard or [`Shard::forget_ahead`](super::Shard::forget_ahead),
    /// which a reader of many shards calls after the sample.
    pub fn prefetch(&self, fields: &[usize], load: bool) -> Result<()> {
        self.check_fields(fields)?;
        let index = self.shard.index();
        let Some(whole) = self.shard.file().whole() else {
            let chunks = fields
                .iter()
                .flat_map(|&f| self.extents(f))
                .filter_map(|x| index.chunk(x.chunk.into()));
            let span = chunks.fold(None, |acc: Option<Range<u64>>, e| {
                let r = e.offset..e.offset + ChunkHeader::SIZE as u64 + e.stored_len;
                Some(acc.map_or(r.clone(), |a| a.start.min(r.start)..a.end.max(r.end)))
            });
            return match span {
                Some(r) if r.end - r.start <= MAX_PREFETCH => self.shard.fetch_ahead(r),
                _ => Ok(()),
            };
        };
        for &f in fields {
            for x in self.extents(f) {
                if let Some(e) = index.chunk(x.chunk.into()) {
                    let start = e.offset as usize;
                    let len = ChunkHeader::SIZE + e.stored_len as usize;
                    whole.will_need(start..start + len, load);
                }
            }
        }
        Ok(())
    }

    /// Rows `rows` of fields `fields` (numbers), side by side in a new buffer of shape
    /// `[rows, elements of every field's row]`: see [`Sample::read_concat_into`]. The fields
    /// must share a dtype. The buffer's memory is reused from earlier such buffers this
    /// process dropped, where one fits (see [`crate::io::recycle`]).
    pub fn read_concat(&self, fields: &[usize], rows: Range<u64>) -> Result<Tensor> {
        let schema = self.ds.schema();
        let dtype = self.shared_dtype(fields)?;
        self.check_rows(&rows)?;
        let stride: u64 = fields.iter().map(|&f| schema.fields[f].row_bytes()).sum();
        let n = rows.end - rows.start;
        let mut out = self.memory_for(n, stride)?;
        self.read_concat_into(fields, rows, out.as_bytes_mut())?;
        Ok(Tensor {
            dtype,
            shape: vec![n, stride / dtype.size() as u64],
            data: Buffer::Owned(out),
        })
    }

    /// The dtype fields `fields` (numbers) share: refused when they are none, one the schema
    /// lacks, or of several (bytes of one dtype concatenated with another's would read as
    /// wrong values).
    fn shared_dtype(&self, fields: &[usize]) -> Result<DType> {
        self.check_fields(fields)?;
        let schema = self.ds.schema();
        let Some(&first) = fields.first() else {
            return Err(Error::BadOption {
                option: "fields",
                detail: "name at least one field to concatenate".into(),
            });
        };
        let dtype = schema.fields[first].dtype;
        match fields.iter().find(|&&f| schema.fields[f].dtype != dtype) {
            None => Ok(dtype),
            Some(&f) => Err(Error::BadOption {
                option: "fields",
                detail: format!(
                    "{} is {} and {} is {}: concatenated fields share a dtype",
                    schema.fields[first].name,
                    dtype.name(),
                    schema.fields[f].name,
                    schema.fields[f].dtype.name()
                ),
            }),
        }
    }

    /// Copies rows `rows` of fields `fields` (numbers, of one dtype) into `out`, concatenated
    /// along the last axis: row r of `out` is row r of every field, in the order given (the
    /// EAGLE-3 auxiliary states, side by side). `out` must hold exactly those rows. One copy from
    /// the shard for uncompressed chunks; a large sample's chunks are read (and checked) and
    /// its rows copied on the pool.
    pub fn read_concat_into(
        &self,
        fields: &[usize],
        rows: Range<u64>,
        out: &mut [u8],
    ) -> Result<()> {
        use rayon::prelude::*;
        self.shared_dtype(fields)?;
        let schema = self.ds.schema();
        let widths: Vec<usize> = fields
            .iter()
            .map(|&f| schema.fields[f].row_bytes() as usize)
            .collect();
        let stride: usize = widths.iter().sum();
        self.check_rows(&rows)?;
        let n = (rows.end - rows.start) as usize;
        let want = n * stride;
        if out.len() != want {
            return Err(Error::BadOption {
                option: "out",
                detail: format!(
                    "sample `{}`: the buffer holds {} bytes, rows {}..{} of the fields \
                     concatenated need {want}",
                    self.key(),
                    out.len(),
                    rows.start,
                    rows.end
                ),
            });
        }
        if want == 0 {
            return Ok(());
        }
        // One part per extent the rows touch: its field's column in `out`, and its rows.
        let mut parts = Vec::new();
        let mut column = 0;
        for (&f, &width) in fields.iter().zip(&widths) {
            for (_, held) in self.extents_over(f, &rows)? {
                let rows = held.start - rows.start..held.end - rows.start;
                parts.push(ConcatPart {
                    f,
                    column,
                    width,
                    rows,
                });
            }
            column += width;
        }
        let pooled = want as u64 >= crate::parallel::WORTH_THE_POOL;
        let read = |p: &ConcatPart| {
            let base = rows.start;
            self.read_field(p.f, Some(base + p.rows.start..base + p.rows.end))
        };
        let read: Vec<Tensor> = if pooled && parts.len() > 1 {
            crate::parallel::install(|| parts.par_iter().map(read).collect::<Result<_>>())?
        } else {
            parts.iter().map(read).collect::<Result<_>>()?
        };
        // Rows `block` (number `b`) of `out`, from every part that holds some of them.
        let rows_per_block = if pooled {
            (CONCAT_BLOCK / stride).max(1)
        } else {
            n
        };
        let fill = |(b, block): (usize, &mut [u8])| {
            let first = (b * rows_per_block) as u64;
            let last = first + (block.len() / stride) as u64;
            for (p, t) in parts.iter().zip(&read) {
                let src = t.bytes();
                for r in p.rows.start.max(first)..p.rows.end.min(last) {
                    let from = (r - p.rows.start) as usize * p.width;
                    let at = (r - first) as usize * stride + p.column;
                    block[at..at + p.width].copy_from_slice(&src[from..from + p.width]);
                }
            }
        };
        if pooled {
            let blocks = out.par_chunks_mut(rows_per_block * stride).enumerate();
            crate::parallel::install(|| blocks.for_each(fill));
        } else {
            fill((0, out));
        }
        Ok(())
    }

    /// The extents of field `f` that hold rows `rows`, in row order, each with the rows it
    /// holds. Refused where they leave a row uncovered or cover one twice: an index that passed
    /// its checks never does, and a read would leave bytes of its buffer unwritten.
    fn extents_over(&self, f: usize, rows: &Range<u64>) -> Result<Vec<(ExtentEntry, Range<u64>)>> {
        let untiled = |at: u64| Error::Format {
            path: self.shard.path().to_path_buf(),
            source: crate::format::FormatError::Invalid {
                structure: "shard index",
                what: "extent row_start",
                value: at,
                rule: format!(
                    "the extents of field {f} cover each row of sample {} once, in order",
                    self.ordinal()
                ),
            },
        };
        let mut over = Vec::new();
        let mut at = rows.start;
        for x in self.extents(f) {
            let lo = x.row_start.max(rows.start);
            let hi = (x.row_start + x.row_count).min(rows.end);
            if lo >= hi {
                continue;
            }
            if lo != at {
                return Err(untiled(at));
            }
            at = hi;
            over.push((x, lo..hi));
        }
        if at != rows.end {
            return Err(untiled(at));
        }
        Ok(over)
    }

    /// Copies rows `rows` of field number `f` into `out`, which must hold exactly those rows.
    pub fn read_into(&self, f: usize, rows: Range<u64>, out: &mut [u8]) -> Result<()> {
        let row_bytes = self.ds.field(f)?.row_bytes() as usize;
        let schema = self.ds.schema();
        self.check_rows(&rows)?;
        let want = (rows.end - rows.start) as usize * row_bytes;
        if out.len() != want {
            return Err(Error::BadOption {
                option: "out",
                detail: format!("buffer holds {} bytes, the rows need {want}", out.len()),
            });
        }
        // Each extent the rows touch, with the part of `out` it fills.
        let extents = self.extents_over(f, &rows)?;
        let mut pieces = Vec::new();
        let mut rest = out;
        for (x, held) in &extents {
            let (dst, tail) = std::mem::take(&mut rest)
                .split_at_mut((held.end - held.start) as usize * row_bytes);
            rest = tail;
            pieces.push((x, held.start, dst));
        }
        let fill = |(x, lo, dst): (&ExtentEntry, u64, &mut [u8])| -> Result<()> {
            let (e, stored) = self
                .shard
                .chunk(x.chunk.into(), schema, self.ds.options.check)?;
            let first = (x.chunk_row + lo - x.row_start) as usize;
            let src = first * row_bytes;
            if src == 0 && dst.len() as u64 == e.raw_len {
                // The whole chunk: decoded straight into place.
                return self
                    .shard
                    .decode_chunk_into(x.chunk.into(), &e, &stored, schema, dst);
            }
            if e.codec == crate::format::Codec::Fp8.code() {
                // Rows decode apart: only those wanted.
                let rows = first..first + dst.len() / row_bytes;
                return self.shard.decode_fp8_rows_into(
                    x.chunk.into(),
                    &e,
                    &stored,
                    schema,
                    rows,
                    dst,
                );
            }
            let raw = self
                .shard
                .decode_chunk(x.chunk.into(), &e, &stored, schema)?;
            dst.copy_from_slice(&raw[src..src + dst.len()]);
            Ok(())
        };
        let index = self.shard.index();
        let compressed = pieces.len() > 1
            && pieces.iter().any(|(x, _, _)| {
                index
                    .chunk(x.chunk.into())
                    .is_some_and(|e| e.codec != crate::format::Codec::None.code())
            });
        if compressed || (pieces.len() > 1 && want as u64 >= crate::parallel::WORTH_THE_POOL) {
            // Chunks checked, decoded and copied on the thread pool, each into its own part
            // of `out`.
            use rayon::prelude::*;
            return crate::parallel::install(|| pieces.into_par_iter().try_for_each(fill));
        }
        pieces.into_iter().try_for_each(fill)
    }
}
