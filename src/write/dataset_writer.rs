//! Writing a dataset: rolling shards, commits through the manifest, resume on reopen.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result, StopCause, StoppedCommit};
use crate::failpoint::failpoint;
use crate::format::manifest::{
    hex, is_temp_file_name, shard_file_name, MANIFEST_FILE, TEMP_SUFFIX,
};
use crate::format::segment::is_tagged;
use crate::format::{Manifest, Schema, ShardRecord};
use crate::io::local::landed_not_durable;
use crate::io::{temp_name, Storage, WriterLease};
use crate::read::{Dataset, ReadOptions};

use super::lane::{Lanes, ShardLane};
use super::options::{WriteOptions, WriteStats};
use super::sample::{self, field_names};
use super::segments::{Mark, Segments};
use super::shard_writer::{ShardPlace, ShardWriter};

pub use crate::io::lock::LOCK_FILE;

/// Writes samples into a dataset folder.
///
/// Samples become visible to readers when their shard is committed: when it fills, at
/// [`DatasetWriter::commit`] and at [`DatasetWriter::finish`]. Dropping a writer without
/// finishing leaves the dataset as of its last commit. Reopening a dataset resumes it.
///
/// One writer holds a dataset, unless every writer opens it with [`WriteOptions::shared`]:
/// then each writes its shards apart and commits them in turn, under the dataset's commit
/// lock, after whatever the others committed.
pub struct DatasetWriter {
    storage: Arc<dyn Storage>,
    manifest: Manifest,
    options: WriteOptions,
    current: Option<ShardWriter>,
    keys: HashSet<String>,
    /// Keys of the open shard's samples: forgotten again if its commit fails.
    current_keys: Vec<String>,
    /// Keys of this writer's failed commit that another writer committed first.
    taken: HashSet<String>,
    /// Why this writer takes no more samples: a commit inside `append` failed
    /// ([`Error::WriterStopped`]).
    stopped: Option<StoppedCommit>,
    schema: std::sync::Arc<Schema>,
    lanes_opened: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// BLAKE3 of the manifest as this writer last read or wrote it: a commit publishes only
    /// over that one.
    manifest_hash: blake3::Hash,
    lock: Box<dyn WriterLease>,
    /// Hex digits no other writer has, in the names of this writer's files when it shares
    /// the dataset.
    tag: String,
}

/// What [`DatasetWriter::append`] returns for a writer sharing its dataset: the ordinal is
/// given at commit, after what the other writers committed.
pub const ORDINAL_AT_COMMIT: u64 = u64::MAX;

impl std::fmt::Debug for DatasetWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatasetWriter")
            .field("dir", &self.storage.root())
            .finish()
    }
}

impl DatasetWriter {
    /// Creates a dataset in `dir` (which may exist but must hold no dataset, nor files named
    /// as a dataset's other than what a failed first commit leaves, which is removed: others
    /// are refused, [`Error::NotADataset`] naming them, and nothing is deleted).
    pub fn create(dir: impl AsRef<Path>, schema: Schema, options: WriteOptions) -> Result<Self> {
        Self::create_in(crate::store::open_location(dir)?, schema, options)
    }

    /// Creates a dataset in `storage` (which must hold no dataset).
    pub fn create_in(
        storage: Arc<dyn Storage>,
        schema: Schema,
        options: WriteOptions,
    ) -> Result<Self> {
        if storage.read(MANIFEST_FILE)?.is_some() {
            return Err(Error::AlreadyExists {
                path: storage.root().to_path_buf(),
            });
        }
        // Checked again under the lock: another `create` may have made it meanwhile.
        Self::open_or_create(storage, schema, options, true)
    }

    /// Opens the dataset in `dir` for appending, creating it when there is none. An existing
    /// dataset must have the same schema (capture metadata included); appending resumes after
    /// its last committed sample, and files an interrupted writer left are removed.
    pub fn open(dir: impl AsRef<Path>, schema: Schema, options: WriteOptions) -> Result<Self> {
        Self::open_in(crate::store::open_location(dir)?, schema, options)
    }

    /// [`DatasetWriter::open`], for a dataset in `storage`.
    pub fn open_in(
        storage: Arc<dyn Storage>,
        schema: Schema,
        options: WriteOptions,
    ) -> Result<Self> {
        Self::open_or_create(storage, schema, options, false)
    }

    /// [`DatasetWriter::open`] for a caller that applied
    /// [`refuse_foreign_folder`](super::destination::refuse_foreign_folder) itself, before
    /// putting a file of its own there (convert's `--report`), or that replaces a dataset of its
    /// own keeping the user's files beside it (the demo): those would now be refused as someone
    /// else's.
    pub fn open_checked_by_caller(
        dir: &Path,
        schema: Schema,
        options: WriteOptions,
    ) -> Result<Self> {
        Self::open_or_create_in(
            crate::store::open_location(dir)?,
            schema,
            options,
            false,
            false,
        )
    }

    /// Opens the dataset in `storage`; with `new`, only where there is none once the lock is
    /// held.
    fn open_or_create(
        storage: Arc<dyn Storage>,
        schema: Schema,
        options: WriteOptions,
        new: bool,
    ) -> Result<Self> {
        Self::open_or_create_in(storage, schema, options, new, true)
    }

    /// [`DatasetWriter::open_or_create`]; `check_destination`: refuse a folder of other files.
    fn open_or_create_in(
        storage: Arc<dyn Storage>,
        schema: Schema,
        mut options: WriteOptions,
        new: bool,
        check_destination: bool,
    ) -> Result<Self> {
        crate::store::refuse_root(&*storage)?;
        let defaults = storage.write_defaults();
        options.block_rows = options.block_rows.or(defaults.block_rows);
        options.align_log2 = options.align_log2.or(defaults.align_log2);
        options.validate()?;
        schema.validate_given().map_err(|detail| Error::BadOption {
            option: "schema",
            detail,
        })?;
        if check_destination {
            super::destination::refuse_foreign_folder(&*storage)?;
        }
        storage.create_root()?;
        let lock = match options.shared {
            false => storage.lock()?,
            true => storage.join(&mut || match crate::read::load_manifest(&*storage)? {
                Some((manifest, _)) => remove_leftovers(&*storage, &manifest),
                None => Ok(()),
            })?,
        };
        // Writers sharing the dataset read (or create) its manifest one at a time.
        let commit = match options.shared {
            true => Some(storage.commit_lock()?),
            false => None,
        };
        let token = commit.as_ref().and_then(|c| c.token()).or(lock.token());
        let mut keys = HashSet::new();
        let created = storage.read(MANIFEST_FILE)?.is_none();
        let (manifest, manifest_hash) = if !created {
            if new {
                return Err(Error::AlreadyExists {
                    path: storage.root().to_path_buf(),
                });
            }
            let ds = Dataset::open_in(Arc::clone(&storage), ReadOptions::default())?;
            if ds.schema() != &schema {
                let advice = match (&ds.schema().capture, &schema.capture) {
                    (Some(_), None) => {
                        ": give the dataset's own to append to it (in Python, \
                         capture=hspack.open(PATH).capture)"
                    }
                    _ => "",
                };
                return Err(Error::SchemaMismatch {
                    path: storage.root().to_path_buf(),
                    detail: format!(
                        "the dataset's schema differs from the one given ({}{advice}); write to \
                         a new folder",
                        describe_difference(ds.schema(), &schema, ["here", "given"])
                    ),
                });
            }
            for part in ds.keys_by_shard() {
                keys.extend(part.keys?);
            }
            (ds.manifest().clone(), blake3::hash(ds.manifest_bytes()))
        } else {
            let id = options.dataset_id.unwrap_or_else(|| {
                crate::io::unique_id(storage.root().as_os_str().as_encoded_bytes())
            });
            let mut m = Manifest::new(id, schema.clone());
            clear_for_creation(&*storage, &m)?;
            if let Some(token) = token {
                m.set_lease(token);
            }
            let bytes = m.encode();
            storage.put_new(MANIFEST_FILE, &bytes, options.durable)?;
            (m, blake3::hash(&bytes))
        };
        drop(commit);
        let tag = hex(&crate::io::unique_id(
            storage.root().as_os_str().as_encoded_bytes(),
        ));
        let mut writer = DatasetWriter {
            schema: std::sync::Arc::new(schema),
            lanes_opened: Default::default(),
            storage,
            manifest,
            options,
            current: None,
            keys,
            current_keys: Vec::new(),
            taken: HashSet::new(),
            stopped: None,
            manifest_hash,
            lock,
            tag,
        };
        if !writer.options.shared {
            writer.fence()?;
            // A dataset created just now has no leftovers: `clear_for_creation` saw to it.
            if !created {
                remove_leftovers(&*writer.storage, &writer.manifest)?;
            }
        }
        Ok(writer)
    }

    /// Where the lock is a lease that can be taken over, writes this writer's token into the
    /// manifest before anything else, so the commits of a writer it took over from fail
    /// (their manifest is no longer the one there) and the leftovers removed next can never
    /// be listed by one of them.
    fn fence(&mut self) -> Result<()> {
        let Some(token) = self.lock.token() else {
            return Ok(());
        };
        if self.manifest.writer.lease.as_deref() == Some(token) {
            return Ok(());
        }
        let mut next = self.manifest.clone();
        next.set_lease(token);
        self.publish_manifest(next)
    }

    /// Where the dataset is: its folder, or a URL.
    pub fn dir(&self) -> &Path {
        self.storage.root()
    }

    /// The storage the dataset is written to.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// The schema.
    pub fn schema(&self) -> &Schema {
        &self.manifest.schema
    }

    /// The dataset's id (hex), which its manifest records: a dataset made again where one was
    /// removed has another.
    pub fn dataset_id(&self) -> &str {
        &self.manifest.dataset_id
    }

    /// True when a sample with `key` was appended (committed or not): skip it to resume.
    pub fn contains_key(&self, key: &str) -> bool {
        self.keys.contains(key)
    }

    /// Keys of the samples appended since the last commit, in order: what dropping the
    /// writer without a commit leaves out of the dataset.
    pub fn uncommitted_keys(&self) -> &[String] {
        &self.current_keys
    }

    /// Keys of the samples appended, committed or not.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(String::as_str)
    }

    /// Samples appended, committed or not (with [`WriteOptions::shared`]: the samples of the
    /// dataset as of this writer's last commit, and its own since).
    pub fn len(&self) -> u64 {
        self.manifest.samples + self.current.as_ref().map_or(0, |s| s.sample_count())
    }

    /// True when no sample was appended.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends a sample: `fields` gives bytes (little-endian, C order) for every field of the
    /// schema, by name; every field must hold the same number of rows. Returns the ordinal,
    /// or [`ORDINAL_AT_COMMIT`] for a writer sharing the dataset.
    pub fn append(&mut self, key: &str, fields: &[(&str, &[u8])]) -> Result<u64> {
        self.check_owner()?;
        self.check_not_stopped()?;
        self.refuse_held([key])?;
        let schema = std::sync::Arc::clone(&self.schema);
        let checked = sample::check(&schema, key, fields, self.options.prequantized)?;
        self.roll_if_full(key, checked.raw)?;
        // Rolling committed the full shard after catching up with what the writers sharing
        // the dataset committed: one of them may have committed `key` since the check above.
        self.refuse_held([key])?;
        let ordinal = match self.options.shared {
            true => ORDINAL_AT_COMMIT,
            false => self.len(),
        };
        let options = self.options.clone();
        let shard = self.current_shard().map_err(|e| not_appended(key, e))?;
        if let Err(e) = sample::write(shard, &schema, &options, key, &checked) {
            if shard.unfit().is_some() {
                return self.stop_after_failed_write(key, e);
            }
            return Err(not_appended(key, e));
        }
        self.keys.insert(key.to_string());
        self.current_keys.push(key.to_string());
        Ok(ordinal)
    }

    /// A write into the open shard failed part way: the shard is dropped. The writer stops
    /// when it held samples, which earlier appends gave ordinals; an empty one is only
    /// started again.
    fn stop_after_failed_write(&mut self, key: &str, e: Error) -> Result<u64> {
        let Some(shard) = self.current.take() else {
            return Err(e);
        };
        if shard.sample_count() == 0 {
            shard.abandon();
            return Err(not_appended(key, e));
        }
        self.stop(StopCause::Write(key.to_string()), e, Some(shard))
    }

    /// Stops the writer: the open shard (`shard`, or the one whose commit just failed) is
    /// not committed, its samples forgotten (those another writer sharing the dataset
    /// committed first excepted), and every later call refused with what happened. Returns
    /// [`Error::WriterStopped`], or for a commit asked for, the commit's own error.
    fn stop<T>(&mut self, what: StopCause, cause: Error, shard: Option<ShardWriter>) -> Result<T> {
        let samples = shard
            .as_ref()
            .map_or(self.current_keys.len() as u64, |s| s.sample_count());
        if let Some(shard) = shard {
            shard.abandon();
        }
        let keys = std::mem::take(&mut self.current_keys);
        for k in keys.iter().filter(|k| !self.taken.contains(*k)) {
            self.keys.remove(k);
        }
        let first_ordinal = self.manifest.samples;
        let stopped = StoppedCommit {
            what,
            samples,
            first: keys.first().cloned().unwrap_or_default(),
            last: keys.last().cloned().unwrap_or_default(),
            ordinals: (!self.options.shared)
                .then(|| first_ordinal..=first_ordinal + samples.saturating_sub(1)),
            cause: cause.to_string(),
        };
        let error = match stopped.what {
            // Asked for: the commit's own error, which says why; later calls say the rest.
            StopCause::Commit => cause,
            _ => self.stopped_error(&stopped),
        };
        self.stopped = Some(stopped);
        Err(error)
    }

    /// Commits the open shard before `key`'s sample of `incoming` bytes when it is full. Where
    /// that commit fails, the writer stops ([`Error::WriterStopped`]): the shard's samples were
    /// accepted, and given ordinals, by earlier appends, and a writer that went on would give
    /// those ordinals to the next samples. A commit refused for a key another writer sharing
    /// the dataset committed first stays [`Error::KeyTaken`], which says what to append again.
    fn roll_if_full(&mut self, key: &str, incoming: u64) -> Result<()> {
        let Some(s) = &self.current else {
            return Ok(());
        };
        if !self
            .options
            .shard_is_full(s.len(), s.sample_count(), incoming)
        {
            return Ok(());
        }
        self.commit_or_stop(StopCause::CommitBefore(key.to_string()))
    }

    /// Refuses a sample key this writer appended or saw committed ([`Error::DuplicateKey`]):
    /// the one check of a new key against the dataset, made before each write of one. A
    /// writer sharing the dataset learns the others' keys when it commits, so a caller makes
    /// it again after any commit it causes before the write (the keys of a commit's own
    /// samples are checked by the commit, [`Error::KeyTaken`]).
    fn refuse_held<'k>(&self, keys: impl IntoIterator<Item = &'k str>) -> Result<()> {
        // The least, so that the error names the same key each time.
        match keys.into_iter().filter(|k| self.keys.contains(*k)).min() {
            Some(key) => Err(Error::DuplicateKey {
                key: key.to_string(),
            }),
            None => Ok(()),
        }
    }

    /// Refuses every call once the writer stopped ([`Error::WriterStopped`]).
    fn check_not_stopped(&self) -> Result<()> {
        match &self.stopped {
            Some(stopped) => Err(self.stopped_error(stopped)),
            None => Ok(()),
        }
    }

    fn stopped_error(&self, stopped: &StoppedCommit) -> Error {
        Error::WriterStopped {
            path: self.storage.root().to_path_buf(),
            commit: Box::new(stopped.clone()),
        }
    }

    fn current_shard(&mut self) -> Result<&mut ShardWriter> {
        if self.current.is_none() {
            let w = ShardWriter::create(
                &*self.storage,
                &temp_name(&self.next_place(None).name),
                self.manifest.dataset_id_bytes(),
                self.manifest.schema.hash(),
                self.options.payload_align_log2(),
            )?;
            self.current = Some(w);
        }
        Ok(self.current.as_mut().expect("just set"))
    }

    /// Where the next committed shard goes, as this writer sees the manifest. Under `commit`,
    /// the lock a writer sharing the dataset commits under, the name carries its token.
    fn next_place(&self, commit: Option<&dyn WriterLease>) -> ShardPlace {
        let seq = self.manifest.shards.len() as u32;
        ShardPlace {
            name: shard_file_name(seq, self.name_tag(commit)),
            seq,
            first_ordinal: self.manifest.samples,
        }
    }

    /// What names this writer's files apart from other writers': the token of the lease it
    /// commits under, or, sharing a folder, its tag.
    fn name_tag<'a>(&'a self, commit: Option<&'a dyn WriterLease>) -> Option<&'a str> {
        commit
            .and_then(|c| c.token())
            .or(self.lock.token())
            .or(self.options.shared.then_some(self.tag.as_str()))
    }

    /// Commits the open shard: after this, its samples survive a crash and readers see them.
    /// Where the commit fails, its error is returned and the writer stops, as after a commit
    /// inside `append`: every later call is refused with [`Error::WriterStopped`], which names
    /// the samples not committed. A commit refused for a key another writer sharing the
    /// dataset committed first ([`Error::KeyTaken`]) leaves the writer going.
    pub fn commit(&mut self) -> Result<WriteStats> {
        self.check_owner()?;
        self.check_not_stopped()?;
        self.commit_or_stop(StopCause::Commit)?;
        Ok(self.stats())
    }

    /// Commits the open shard, stopping the writer as `what` where that fails.
    fn commit_or_stop(&mut self, what: StopCause) -> Result<()> {
        let Some(shard) = self.current.take() else {
            return Ok(());
        };
        match self.commit_shard(shard, &HashSet::new()) {
            Ok(()) => {
                self.current_keys.clear();
                Ok(())
            }
            Err(e @ Error::KeyTaken { .. }) => {
                // Not committed: a resumed run must not skip these samples (those another
                // writer committed first are there, though).
                for k in std::mem::take(&mut self.current_keys) {
                    if !self.taken.contains(&k) {
                        self.keys.remove(&k);
                    }
                }
                Err(e)
            }
            Err(e) => self.stop(what, e, None),
        }
    }

    /// Refuses to act in a process forked from the one that opened the writer: the parent
    /// holds the lock and owns the open shard's file.
    fn check_owner(&self) -> Result<()> {
        if self.lock.is_owner() {
            return Ok(());
        }
        Err(Error::ForkedWriter {
            path: self.storage.root().to_path_buf(),
        })
    }

    /// Publishes the shard, then a manifest that lists it. The shard goes only where no file
    /// is and the manifest only over the one this writer last wrote, so a second writer
    /// (were the lock ever broken) can make a commit fail but never replace committed data.
    /// A writer sharing the dataset does this under its commit lock, after catching up with
    /// what the others committed; `lane_keys` are the shard's keys when it is a lane's.
    fn commit_shard(&mut self, shard: ShardWriter, lane_keys: &HashSet<String>) -> Result<()> {
        if shard.sample_count() == 0 {
            shard.abandon();
            return Ok(());
        }
        let commit = match self.begin_commit(lane_keys, shard.sample_count()) {
            Ok(commit) => commit,
            Err(e) => {
                shard.abandon();
                return Err(e);
            }
        };
        let commit = commit.as_deref();
        let place = self.next_place(commit);
        let record = shard.finish(&place, self.options.durable)?;
        self.publish_commit(commit, Some(record))
    }

    /// Whether files this writer created may be removed without knowing what the manifest
    /// lists: not when the lock is a lease another writer may have taken over, which may by
    /// now have put files of its own under those names (the next writer removes them as
    /// leftovers).
    fn may_take_back(&self, commit: Option<&dyn WriterLease>) -> bool {
        self.lock.token().is_none() && commit.and_then(|c| c.token()).is_none()
    }

    /// Whether the files created for a commit whose manifest did not land, read back as
    /// `there`, are listed nowhere and may be taken back; `put` is how the manifest's put
    /// ended (`None`: it was not tried). Not when the read failed: the manifest may have
    /// landed. Under a lease (object storage), only when `there` is the manifest this writer
    /// last wrote (no other writer published since, so none lists files named after this
    /// writer's lease) and the put was not tried or was refused: one that failed in transit
    /// may still land after the read. The next commit can then make them again.
    fn unlisted(
        &self,
        commit: Option<&dyn WriterLease>,
        there: &Result<Option<Vec<u8>>>,
        put: Option<&Error>,
    ) -> bool {
        let refused = put.is_none_or(|e| matches!(e, Error::CommitConflict { .. }));
        match there {
            Err(_) => false,
            Ok(_) if self.may_take_back(commit) => true,
            Ok(found) => {
                refused
                    && found
                        .as_ref()
                        .is_some_and(|f| blake3::hash(f) == self.manifest_hash)
            }
        }
    }

    /// Lists the published shard `record` (if any) in a new segment with its key run and
    /// table part, and publishes the manifest; the manifest this writer holds is changed in
    /// place (its shard list is never copied) and put back as it was when this fails.
    fn publish_commit(
        &mut self,
        commit: Option<&dyn WriterLease>,
        record: Option<ShardRecord>,
    ) -> Result<()> {
        let mark = Mark::of(&self.manifest);
        let first_new = self.manifest.shards.len();
        let shard_file = record.as_ref().map(|r| r.file.clone());
        if let Some(record) = record {
            self.manifest.samples += record.samples;
            self.manifest.shards.push(record);
        }
        let tag = self.name_tag(commit).map(str::to_string);
        let segments = Segments::new(&*self.storage, tag.as_deref(), self.options.durable);
        let mut result = segments.add_commit(&mut self.manifest, first_new);
        let published = segments.published.take();
        let created = segments.created.take();
        let put_tried = result.is_ok();
        if put_tried {
            if let Some(token) = commit.and_then(|c| c.token()) {
                self.manifest.set_lease(token);
            }
            result = self.publish_current();
        }
        let Err(e) = result else {
            self.remove_replaced(&mark, &published);
            return Ok(());
        };
        // A replacement can land and still report an error (a lost response, a retried
        // conditional put that then finds its own write): what is there decides.
        let bytes = self.manifest.encode();
        let there = self.storage.read(MANIFEST_FILE);
        if matches!(&there, Ok(Some(found)) if *found == bytes) {
            if landed_not_durable(&e) {
                // Readers see it, but a power cut may yet undo it: not committed, so the writer
                // stops (its callers stop it on this error) and nothing is removed, neither
                // this commit's files nor those a merge replaced, which the manifest left after
                // a power cut may list.
                mark.restore(&mut self.manifest);
                return Err(e);
            }
            self.manifest_hash = blake3::hash(&bytes);
            self.remove_replaced(&mark, &published);
            return Ok(());
        }
        mark.restore(&mut self.manifest);
        // The files made for this commit, its shard among them, are taken back where they are
        // listed nowhere, so that the next commit can make them again.
        if self.unlisted(commit, &there, Some(&e).filter(|_| put_tried)) {
            for name in shard_file.iter().chain(&created) {
                let _ = self.storage.delete(name);
            }
        }
        // Another writer replaced the manifest (it took the dataset over): that, not what
        // failed after, is why this commit cannot land.
        self.check_manifest_unchanged()?;
        Err(e)
    }

    /// Removes the segment files and key runs that the manifest listed at `mark` and no longer
    /// does (a merge replaced them), now that it is published: still under the commit lock of
    /// a writer sharing the dataset. A reader that read the earlier manifest reads the new one
    /// when it finds a segment gone, and searches the shards of a segment whose key run is
    /// gone; what cannot be removed now is a leftover for later.
    fn remove_replaced(&self, mark: &Mark, published: &[String]) {
        for name in mark.files_replaced_in(&self.manifest, published) {
            let _ = self.storage.delete(&name);
        }
    }

    /// Checks that this writer may commit; for a writer sharing the dataset, takes the
    /// commit lock (returned: hold it until the manifest is replaced) and catches up.
    fn begin_commit(
        &mut self,
        lane_keys: &HashSet<String>,
        samples: u64,
    ) -> Result<Option<Box<dyn WriterLease>>> {
        self.lock.check()?;
        if !self.options.shared {
            return Ok(None);
        }
        let commit = self.storage.commit_lock()?;
        self.catch_up(lane_keys, samples)?;
        Ok(Some(commit))
    }

    /// Adopts the manifest as the other writers sharing the dataset left it: their shards
    /// must follow the ones this writer saw, and none of their keys may be one this writer
    /// appended ([`Error::KeyTaken`], for a commit of `samples`; `lane_keys` too). Reads the
    /// indexes of their new shards only.
    fn catch_up(&mut self, lane_keys: &HashSet<String>, samples: u64) -> Result<()> {
        let ds = Dataset::open_in(Arc::clone(&self.storage), ReadOptions::default())?;
        let found = ds.manifest();
        let seen = &self.manifest.shards;
        if found.dataset_id != self.manifest.dataset_id
            || found.schema_blake3 != self.manifest.schema_blake3
            || found.shards.get(..seen.len()) != Some(seen)
        {
            return Err(Error::CommitConflict {
                path: self.storage.path(MANIFEST_FILE),
                detail: "the manifest no longer lists the shards this writer saw committed".into(),
            });
        }
        self.taken.clear();
        for ordinal in self.manifest.samples..found.samples {
            let key = ds.sample(ordinal)?.key().to_string();
            if self.keys.contains(&key) || lane_keys.contains(&key) {
                self.taken.insert(key.clone());
            }
            self.keys.insert(key);
        }
        self.manifest_hash = blake3::hash(ds.manifest_bytes());
        self.manifest = found.clone();
        match self.taken.iter().min() {
            Some(key) => Err(Error::KeyTaken {
                path: self.storage.root().to_path_buf(),
                key: key.clone(),
                samples,
            }),
            None => Ok(()),
        }
    }

    /// A maker of [`ShardLane`]s: shards written on other threads, at the same time, and
    /// committed in the order the caller chooses with [`DatasetWriter::commit_lane`].
    pub fn lanes(&self) -> Lanes {
        Lanes {
            storage: Arc::clone(&self.storage),
            dataset_id: self.manifest.dataset_id_bytes(),
            schema: std::sync::Arc::clone(&self.schema),
            options: self.options.clone(),
            opened: std::sync::Arc::clone(&self.lanes_opened),
            tag: self.tag.clone(),
        }
    }

    /// Commits a lane's shard after the samples committed so far (and after the open shard,
    /// which is committed first): its samples get the next ordinals. Refused, and the lane
    /// deleted, when it holds a key the dataset holds or comes from another writer.
    pub fn commit_lane(&mut self, mut lane: ShardLane) -> Result<WriteStats> {
        self.check_owner()?;
        if lane.dataset_id != self.manifest.dataset_id_bytes() {
            return Err(Error::BadOption {
                option: "lane",
                detail: "the lane was opened for another dataset".into(),
            });
        }
        self.refuse_held(lane.keys.iter().map(String::as_str))?;
        self.commit()?;
        // That commit caught up with what the writers sharing the dataset committed: one of
        // them may have committed a key of the lane since the check above.
        self.refuse_held(lane.keys.iter().map(String::as_str))?;
        if let Some(shard) = lane.shard.take() {
            match self.commit_shard(shard, &lane.keys) {
                Ok(()) => self.keys.extend(std::mem::take(&mut lane.keys)),
                // It may be in the dataset or not (a power cut decides): the writer stops, as
                // for the open shard's commit, naming the lane's samples.
                Err(e) if landed_not_durable(&e) => {
                    let mut keys: Vec<String> = lane.keys.drain().collect();
                    keys.sort_unstable();
                    self.current_keys = keys;
                    return self.stop(StopCause::Commit, e, None);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(self.stats())
    }

    /// Fails unless `manifest.json` is the one this writer last read or wrote.
    fn check_manifest_unchanged(&self) -> Result<()> {
        let path = self.storage.path(MANIFEST_FILE);
        let Some(found) = self.storage.read(MANIFEST_FILE)? else {
            return Err(Error::CommitConflict {
                path,
                detail: "the manifest is gone".into(),
            });
        };
        if blake3::hash(&found) != self.manifest_hash {
            return Err(Error::CommitConflict {
                path,
                detail: "the manifest is not the one this writer last read or wrote".into(),
            });
        }
        Ok(())
    }

    /// Publishes `next` over the manifest this writer last wrote, and adopts it.
    fn publish_manifest(&mut self, next: Manifest) -> Result<()> {
        let previous = std::mem::replace(&mut self.manifest, next);
        let result = self.publish_current();
        if result.is_err() {
            self.manifest = previous;
        }
        result
    }

    /// Publishes the manifest this writer holds over the one it last wrote.
    fn publish_current(&mut self) -> Result<()> {
        let bytes = self.manifest.encode();
        self.storage.replace(
            MANIFEST_FILE,
            &bytes,
            Some(self.manifest_hash),
            self.options.durable,
        )?;
        failpoint!("manifest-published");
        self.manifest_hash = blake3::hash(&bytes);
        Ok(())
    }

    /// What is committed.
    pub fn stats(&self) -> WriteStats {
        WriteStats::of(&self.manifest)
    }

    /// Commits and releases the dataset. A dataset of manifest version 1 to 3 is made version
    /// 4 (its samples table then stays current at every commit). The segment files and key
    /// runs that merges replaced are removed (under the commit lock, for a writer sharing the
    /// dataset: every such file is published under it, so none is in progress).
    pub fn finish(mut self) -> Result<WriteStats> {
        self.commit()?;
        let commit = self.begin_commit(&HashSet::new(), 0)?;
        if commit.is_none() {
            self.check_manifest_unchanged()?;
        }
        if !self.manifest.is_segmented() {
            self.publish_commit(commit.as_deref(), None)?;
        }
        let listed = self.manifest.listed_names();
        // Under a lease, another writer may have taken the dataset over since the check
        // above (this one hung past the lease's life) and published files this manifest does
        // not list: only files named after this writer's lease are its to remove.
        let tag = self.name_tag(commit.as_deref());
        let mine = |name: &str| {
            self.may_take_back(commit.as_deref()) || tag.is_some_and(|t| is_tagged(name, t))
        };
        failpoint!("finish-listing");
        for name in self.storage.list()? {
            let replaced = name.starts_with("segment-") || name.starts_with("keys-");
            if replaced && !name.ends_with(TEMP_SUFFIX) && listed.is_leftover(&name) && mine(&name)
            {
                self.storage.delete(&name)?;
            }
        }
        Ok(self.stats())
    }
}

impl Drop for DatasetWriter {
    fn drop(&mut self) {
        let Some(shard) = self.current.take() else {
            return;
        };
        if self.lock.is_owner() {
            shard.abandon();
        } else {
            // A forked child's copy: its buffered bytes would land in the parent's file
            // (the file offset is shared), and the temp file is the parent's to delete.
            std::mem::forget(shard);
        }
        // The lock is released by `WriterLock`'s own drop, in the owning process only.
    }
}

/// Rewrites the files derived from the shards' indexes, which the manifest covers: the key
/// runs and samples table parts (version 4) that are missing or damaged, each bit for bit
/// as its segment records it. A dataset of version 1 to 3 is left as it is where its table is
/// intact (made version 4, its digest would change, and its copies no longer count as copies
/// of it for `repair`); else it is made version 4, its table written anew. The repair when
/// verify finds one of them missing, stale or damaged. Takes the writer lock like any writer.
/// Returns the files rewritten.
pub fn reindex(dir: impl AsRef<Path>) -> Result<Vec<String>> {
    reindex_in(crate::store::open_location(dir)?)
}

/// [`reindex`], for a dataset in `storage`.
pub fn reindex_in(storage: Arc<dyn Storage>) -> Result<Vec<String>> {
    let ds = Dataset::open_in(Arc::clone(&storage), ReadOptions::default())?;
    if !ds.manifest().is_segmented() && crate::verify::samples_tables_intact(&ds) {
        return Ok(Vec::new());
    }
    let schema = ds.schema().clone();
    drop(ds);
    let w = DatasetWriter::open_in(storage, schema, WriteOptions::default())?;
    if !w.manifest.is_segmented() {
        // Written anew as version 4 (its segment, key run and table part made from the
        // shards): those are the files rewritten, and the old table, which no manifest lists
        // then, goes (`verify` would call it a leftover).
        let old = w.manifest.samples_table.clone();
        let storage = Arc::clone(&w.storage);
        w.finish()?;
        let ds = Dataset::open_in(Arc::clone(&storage), ReadOptions::default())?;
        let written: Vec<String> = (ds.manifest().listed_files().iter())
            .map(|f| f.file.to_string())
            .collect();
        if let Some(old) = old.filter(|t| !written.contains(&t.file)) {
            storage.delete(&old.file)?;
        }
        return Ok(written);
    }
    let segments = Segments::new(&*w.storage, None, w.options.durable);
    segments.rewrite_derived(&w.manifest)
}

/// What differs between two schemas, in words: the first field that differs (dtype, shape,
/// what it holds), the field names, or the capture metadata's first differing entry. `have`'s
/// side is said as `h` (`here`), `given`'s as `g` (`given`).
pub(crate) fn describe_difference(have: &Schema, given: &Schema, [h, g]: [&str; 2]) -> String {
    let differing = have.fields.iter().zip(&given.fields).find(|(a, b)| a != b);
    let field = |f: &crate::format::Field| {
        let quantized = if f.quantized.is_some() {
            ", stored as fp8"
        } else {
            ""
        };
        format!("{} {:?} ({}{quantized})", f.dtype.name(), f.shape, f.role)
    };
    if let (true, Some((a, b))) = (have.fields.len() == given.fields.len(), differing) {
        let named = match a.name == b.name {
            true => format!("field `{}`", a.name),
            false => format!("field `{}` ({g}: `{}`)", a.name, b.name),
        };
        format!("{named}: {} {h}, {} {g}", field(a), field(b))
    } else if have.fields != given.fields {
        format!(
            "fields {} {h}, {} {g}",
            field_names(have),
            field_names(given)
        )
    } else {
        // Capture metadata given for one and not the other is said as such (every entry
        // compared with nothing read as `null here, null given`).
        let (a, b) = match (&have.capture, &given.capture) {
            (Some(_), None) => return format!("capture metadata {h}, none {g}"),
            (None, Some(_)) => return format!("no capture metadata {h}, some {g}"),
            (a, b) => (
                serde_json::to_value(a).unwrap_or_default(),
                serde_json::to_value(b).unwrap_or_default(),
            ),
        };
        let entry = a
            .as_object()
            .into_iter()
            .flatten()
            .find(|(k, v)| b.get(k.as_str()) != Some(v))
            .map(|(k, v)| match b.get(k.as_str()) {
                Some(w) => format!("capture `{k}`: {v} {h}, {w} {g}"),
                None => format!("capture `{k}`: {v} {h}, none {g}"),
            });
        entry.unwrap_or_else(|| "the capture metadata differs".into())
    }
}

/// Readies a folder (or prefix) that holds no manifest for a dataset whose new manifest is
/// `manifest`: removes hspack's temp files there ([`is_temp_file_name`]: what a writer killed
/// while creating the manifest leaves), but refuses, removing nothing, where other files are
/// named as a dataset's ([`Manifest::is_leftover`]). No writer leaves those without a manifest:
/// every writer creates the manifest before any of its files, and a run of `hspack convert`
/// that failed before its first commit removes them before its manifest. So they are someone
/// else's (or a dataset whose manifest was lost), which a writer would take for leftovers and
/// delete.
fn clear_for_creation(storage: &dyn Storage, manifest: &Manifest) -> Result<()> {
    let listed = manifest.listed_names();
    let (ours, mut theirs): (Vec<String>, Vec<String>) = (storage.list()?.into_iter())
        .filter(|name| listed.is_leftover(name))
        .partition(|name| is_temp_file_name(name));
    if theirs.is_empty() {
        for name in &ours {
            storage.delete(name)?;
        }
        return match ours.is_empty() {
            true => Ok(()),
            false => storage.sync(),
        };
    }
    theirs.sort();
    const SHOWN: usize = 5;
    let mut named = theirs[..theirs.len().min(SHOWN)].join(", ");
    if theirs.len() > SHOWN {
        named.push_str(&format!(" and {} more", theirs.len() - SHOWN));
    }
    Err(Error::NotADataset {
        path: storage.root().to_path_buf(),
        why: format!(
            "it has no {MANIFEST_FILE} but holds files named as a dataset's ({named}), which a \
             writer would take for an interrupted writer's and delete; move them out of the \
             folder, or create the dataset in another folder (if they are a dataset whose \
             {MANIFEST_FILE} was lost, put a copy of it back)"
        ),
    })
}

/// Removes what an interrupted writer left ([`Manifest::is_leftover`]).
pub(crate) fn remove_leftovers(storage: &dyn Storage, manifest: &Manifest) -> Result<()> {
    let mut removed = false;
    let listed = manifest.listed_names();
    for name in storage.list()? {
        if listed.is_leftover(&name) {
            storage.delete(&name)?;
            failpoint!("leftover-removed");
            removed = true;
        }
    }
    if removed {
        storage.sync()?;
    }
    Ok(())
}

/// `cause`, which kept `key` from the dataset before any of it was written: a storage
/// failure said as such, with the writer going on; any other error (a sample refused for
/// what it holds) as it is.
fn not_appended(key: &str, cause: Error) -> Error {
    match cause {
        Error::Io { .. } => Error::NotAppended {
            key: key.to_string(),
            cause: Box::new(cause),
        },
        other => other,
    }
}
