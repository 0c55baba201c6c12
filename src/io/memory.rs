//! A dataset held in memory: the second backend that keeps [`Storage`] honest, and the one
//! tests use to inject faults (short reads, failed publishes, publishes that land but are not
//! durable, a writer that dies holding the lock); it takes writers sharing a dataset (a count
//! of them, and a commit lock they wait for); and it cuts the power: it records what
//! each call made durable and rebuilds what a folder would hold after a power cut at any point
//! ([`MemoryStorage::after_power_cut`]).

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{Error, Result};

use super::bytes::FileBytes;
use super::local::{out_of_file, usize_range};
use super::power_cut::DiskLog;
use super::{FileReader, NewFile, Storage, WriterLease};

/// Faults a [`MemoryStorage`] injects.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Every ranged read of a file whose name contains this returns one byte fewer than asked,
    /// as a backend cut short would.
    pub short_reads_of: Option<String>,
    /// Publishes (new files and replacements) that succeed before every later one fails.
    pub publishes_before_failure: Option<u32>,
    /// Deletions fail, as they do for a writer that died before making them: with a failed
    /// publish, the state a crash leaves.
    pub deletes_fail: bool,
    /// Publishes of files whose name contains this fail.
    pub failing_publishes_of: Option<String>,
    /// A failing publish lands all the same, as one whose response was lost.
    pub failed_publishes_land: bool,
    /// Publishes of files whose name contains this land, then fail as a rename whose folder's
    /// fsync failed does ([`super::local::landed_not_durable`]).
    pub unsynced_publishes_of: Option<String>,
    /// Whole-file reads of files whose name contains this fail.
    pub failing_reads_of: Option<String>,
    /// Writes into files being written that succeed before every later one fails, as on a
    /// full disk (counted from when the faults are set).
    pub writes_before_failure: Option<u32>,
    /// `(part, file, bytes)`: while the first publish of a file whose name contains `part`
    /// is on its way (a slow put its client retries, past its writer's lease), another
    /// writer takes the lock over and puts `bytes` as `file`. The publish then lands.
    pub taken_over_during_publish_of: Option<(String, String, Vec<u8>)>,
}

#[derive(Debug, Default)]
struct State {
    files: BTreeMap<String, FileBytes>,
    faults: Faults,
    publishes: u32,
    writes: u32,
    /// The process holding the writer lock, if any.
    locked_by: Option<u32>,
    /// Writers sharing the dataset ([`Storage::join`]).
    joined: u32,
    /// True while a sharing writer holds the commit lock.
    committing: bool,
    /// The token of the leases handed out, as object storage's are ([`MemoryStorage::lease_as`]).
    lease: Option<String>,
}

/// The holder of a lock taken over ([`Faults::taken_over_during_publish_of`]): no process.
const TAKEN_OVER: u32 = u32::MAX;

/// Files in memory, shared by every clone.
#[derive(Debug, Clone)]
pub struct MemoryStorage {
    root: PathBuf,
    state: Arc<Mutex<State>>,
    /// What each call made durable, in the log of the disk this folder is on.
    disk: Arc<Mutex<DiskLog>>,
    /// This folder's name on its disk.
    folder: String,
}

impl MemoryStorage {
    /// An empty storage, named `name` in messages (`memory://name`).
    pub fn new(name: &str) -> MemoryStorage {
        MemoryStorage {
            root: PathBuf::from(format!("memory://{name}")),
            state: Arc::default(),
            disk: Arc::default(),
            folder: name.to_string(),
        }
    }

    /// Another folder, empty, named `name`, on the disk this one is on: its durability events
    /// go into the same log, so a power cut falls on both at once.
    pub fn sibling(&self, name: &str) -> MemoryStorage {
        MemoryStorage {
            disk: Arc::clone(&self.disk),
            ..MemoryStorage::new(name)
        }
    }

    /// The refusal of a writer while `holder` holds the dataset.
    fn locked(&self, holder: String) -> Error {
        Error::Locked {
            path: self.root.clone(),
            holder,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The disk's log; taken after [`MemoryStorage::state`] where both are.
    fn disk(&self) -> MutexGuard<'_, DiskLog> {
        self.disk.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the faults to inject from now on (counting publishes from now).
    pub fn set_faults(&self, faults: Faults) {
        let mut s = self.state();
        s.faults = faults;
        s.publishes = 0;
        s.writes = 0;
    }

    /// The bytes of `name`, if there is such a file.
    pub fn get(&self, name: &str) -> Option<Vec<u8>> {
        self.state().files.get(name).map(|b| b.to_vec())
    }

    /// Puts `bytes` as `name`, over whatever is there: damage, for tests.
    pub fn overwrite(&self, name: &str, bytes: &[u8]) {
        let bytes = FileBytes::copy_of(bytes);
        let mut s = self.state();
        let mut disk = self.disk();
        let file = disk.new_file();
        disk.synced(file, bytes.clone());
        disk.named(&self.folder, name, Some(file));
        disk.folder_synced(&self.folder);
        s.files.insert(name.to_string(), bytes);
    }

    /// Durability events so far on this folder's disk (a file's bytes fsynced, a name given
    /// or removed, a folder fsynced): a power cut can fall after any number of them,
    /// `0..=durability_events()`.
    pub fn durability_events(&self) -> usize {
        self.disk().len()
    }

    /// The name changes a power cut after the first `at` durability events may or may not
    /// keep: those of the disk's folders not followed by an fsync of their folder before it.
    pub fn unsynced_name_changes(&self, at: usize) -> usize {
        self.disk().unsynced_name_changes(at)
    }

    /// A new storage holding what this one, a folder, holds after a power cut that falls
    /// after the first `at` durability events of its disk: the names an fsync of their folder
    /// made durable, plus the name changes not yet durable (of the disk's folders, in the
    /// order made, [`MemoryStorage::unsynced_name_changes`]) whose bit is set in `kept` (bit
    /// `i` keeps the `i`th), each file with the bytes last fsynced (a file never fsynced is
    /// empty). Nothing is locked there: the writer died with the power.
    pub fn after_power_cut(&self, at: usize, kept: u64) -> MemoryStorage {
        let files = self.disk().survivors(&self.folder, at, kept);
        let cut = MemoryStorage::new(&format!("{}-cut-{at}-{kept:b}", self.folder));
        for (name, bytes) in files {
            cut.overwrite(&name, &bytes);
        }
        cut
    }

    /// Hands out writer locks that are leases with `token`, as object storage does: writers
    /// then fence the manifest with it and name their files after it.
    ///
    /// # Panics
    ///
    /// When `token` is not 32 lowercase hex digits, as every lease's is.
    pub fn lease_as(&self, token: &str) {
        assert!(
            crate::format::manifest::is_lease_token(token),
            "a lease token is 32 lowercase hex digits (FORMAT.md §1.1), not {token:?}"
        );
        self.state().lease = Some(token.to_string());
    }

    /// Releases the writer lock as the kernel does when its holder dies: for tests of a
    /// writer that crashed (forgotten with `std::mem::forget`).
    pub fn release_lock_of_dead_writer(&self) {
        self.state().locked_by = None;
    }

    /// Puts `bytes` as `name` when `check` passes: the bytes of `file` (a new file for
    /// `None`, fsynced first when `durable`), renamed or linked into place, then the folder
    /// fsynced when `durable`. `temp`, the name `file` was written under, goes either way
    /// (after the link, before the folder's fsync, as a local folder's publish removes it).
    fn publish(
        &self,
        name: &str,
        bytes: FileBytes,
        (file, temp): (Option<u64>, Option<&str>),
        durable: bool,
        check: impl FnOnce(&State) -> Result<()>,
    ) -> Result<()> {
        let result = self.publish_named(name, bytes, (file, temp), durable, check);
        if let (Some(temp), Err(_)) = (temp, &result) {
            // Not published: the temp file is removed all the same.
            self.disk().named(&self.folder, temp, None);
        }
        result
    }

    fn publish_named(
        &self,
        name: &str,
        bytes: FileBytes,
        (file, temp): (Option<u64>, Option<&str>),
        durable: bool,
        check: impl FnOnce(&State) -> Result<()>,
    ) -> Result<()> {
        let mut s = self.state();
        let fails = s
            .faults
            .publishes_before_failure
            .is_some_and(|n| s.publishes >= n)
            || (s.faults.failing_publishes_of)
                .as_deref()
                .is_some_and(|part| name.contains(part));
        let failed = || Error::Io {
            path: self.path(name),
            op: "publish",
            source: std::io::Error::other("injected fault: the publish failed"),
        };
        if fails && !s.faults.failed_publishes_land {
            return Err(failed());
        }
        if let Some((_, file, other)) = s
            .faults
            .taken_over_during_publish_of
            .take_if(|(part, _, _)| name.contains(part.as_str()))
        {
            s.locked_by = Some(TAKEN_OVER);
            s.files.insert(file, FileBytes::from_vec(other));
        }
        check(&s)?;
        s.publishes += 1;
        let mut disk = self.disk();
        let file = match file {
            Some(f) => f,
            None => {
                let f = disk.new_file();
                if durable {
                    disk.synced(f, bytes.clone());
                }
                f
            }
        };
        disk.named(&self.folder, name, Some(file));
        if let Some(temp) = temp {
            disk.named(&self.folder, temp, None);
        }
        s.files.insert(name.to_string(), bytes);
        let unsynced = (s.faults.unsynced_publishes_of)
            .as_deref()
            .is_some_and(|part| name.contains(part));
        if durable && !fails && !unsynced {
            disk.folder_synced(&self.folder);
        }
        drop(disk);
        match (fails, unsynced) {
            (true, _) => Err(failed()),
            (false, true) => Err(Error::Io {
                path: self.root.clone(),
                op: super::local::SYNC_AFTER_PUBLISH,
                source: std::io::Error::other("injected fault: the folder's fsync failed"),
            }),
            (false, false) => Ok(()),
        }
    }
}

impl Storage for MemoryStorage {
    fn root(&self) -> &Path {
        &self.root
    }

    fn create_root(&self) -> Result<()> {
        Ok(())
    }

    fn list(&self) -> Result<Vec<String>> {
        Ok(self.state().files.keys().cloned().collect())
    }

    fn read(&self, name: &str) -> Result<Option<Vec<u8>>> {
        let fails = (self.state().faults.failing_reads_of)
            .as_deref()
            .is_some_and(|part| name.contains(part));
        if fails {
            return Err(Error::Io {
                path: self.path(name),
                op: "read",
                source: std::io::Error::other("injected fault: the read failed"),
            });
        }
        Ok(self.get(name))
    }

    fn open(&self, name: &str) -> Result<Arc<dyn FileReader>> {
        let s = self.state();
        let bytes = s.files.get(name).cloned().ok_or_else(|| Error::Io {
            path: self.path(name),
            op: "open",
            source: std::io::ErrorKind::NotFound.into(),
        })?;
        let short = s
            .faults
            .short_reads_of
            .as_deref()
            .is_some_and(|part| name.contains(part));
        Ok(Arc::new(MemoryFile {
            path: self.path(name),
            bytes,
            short,
        }))
    }

    fn create(&self, temp: &str) -> Result<Box<dyn NewFile>> {
        let mut disk = self.disk();
        let file = disk.new_file();
        // Named in the folder, as a local temp file is: a cut may leave it.
        disk.named(&self.folder, temp, Some(file));
        Ok(Box::new(MemoryNewFile {
            storage: self.clone(),
            temp: temp.to_string(),
            file,
            bytes: Vec::new(),
        }))
    }

    fn replace(
        &self,
        name: &str,
        bytes: &[u8],
        expected: Option<blake3::Hash>,
        durable: bool,
    ) -> Result<()> {
        let path = self.path(name);
        self.publish(
            name,
            FileBytes::copy_of(bytes),
            (None, None),
            durable,
            |s| {
                let Some(expected) = expected else {
                    return Ok(());
                };
                match s.files.get(name) {
                    Some(found) if blake3::hash(found) == expected => Ok(()),
                    found => Err(Error::CommitConflict {
                        path,
                        detail: match found {
                            None => "the file is gone".into(),
                            Some(_) => "it is not the one this writer last read or wrote".into(),
                        },
                    }),
                }
            },
        )
    }

    fn delete(&self, name: &str) -> Result<()> {
        let mut s = self.state();
        if s.faults.deletes_fail {
            return Err(Error::Io {
                path: self.path(name),
                op: "remove",
                source: std::io::Error::other("injected fault: the deletion failed"),
            });
        }
        if s.files.remove(name).is_some() {
            self.disk().named(&self.folder, name, None);
        }
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        self.disk().folder_synced(&self.folder);
        Ok(())
    }

    fn lock(&self) -> Result<Box<dyn WriterLease>> {
        let mut s = self.state();
        if let Some(pid) = s.locked_by {
            return Err(self.locked(format!("pid {pid}, a writer of this memory storage")));
        }
        if s.joined > 0 {
            return Err(self.locked(format!("{} writers sharing this memory storage", s.joined)));
        }
        let pid = std::process::id();
        s.locked_by = Some(pid);
        Ok(Box::new(MemoryLease {
            storage: self.clone(),
            pid,
            token: s.lease.clone(),
            held: Held::Sole,
        }))
    }

    fn join(&self, alone: &mut dyn FnMut() -> Result<()>) -> Result<Box<dyn WriterLease>> {
        let first = {
            let mut s = self.state();
            if let Some(pid) = s.locked_by {
                return Err(self.locked(format!("pid {pid}, a sole writer of this memory storage")));
            }
            s.joined += 1;
            s.joined == 1
        };
        let lease = MemoryLease {
            storage: self.clone(),
            pid: std::process::id(),
            token: None,
            held: Held::Shared,
        };
        if first {
            alone()?;
        }
        Ok(Box::new(lease))
    }

    fn commit_lock(&self) -> Result<Box<dyn WriterLease>> {
        loop {
            {
                let mut s = self.state();
                if !s.committing {
                    s.committing = true;
                    break;
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        Ok(Box::new(MemoryLease {
            storage: self.clone(),
            pid: std::process::id(),
            token: None,
            held: Held::Commit,
        }))
    }
}

/// Bytes in memory, read as a published file.
#[derive(Debug)]
pub struct MemoryFile {
    path: PathBuf,
    bytes: FileBytes,
    short: bool,
}

impl MemoryFile {
    /// `bytes`, as the file at `path` (for messages).
    pub fn new(path: PathBuf, bytes: Vec<u8>) -> Self {
        MemoryFile {
            path,
            bytes: FileBytes::from_vec(bytes),
            short: false,
        }
    }
}

impl FileReader for MemoryFile {
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    fn read(&self, range: Range<u64>) -> Result<FileBytes> {
        let got = usize_range(&range)
            .and_then(|r| self.bytes.slice(r))
            .ok_or_else(|| out_of_file(&self.path, &range, self.len()))?;
        let got = match self.short && !got.is_empty() {
            true => got.slice(0..got.len() - 1).expect("inside"),
            false => got,
        };
        super::expect_whole(&self.path, &range, got)
    }

    fn whole(&self) -> Option<FileBytes> {
        (!self.short).then(|| self.bytes.clone())
    }
}

#[derive(Debug)]
struct MemoryNewFile {
    storage: MemoryStorage,
    temp: String,
    /// Its number in the storage's [`DiskLog`].
    file: u64,
    bytes: Vec<u8>,
}

impl MemoryNewFile {
    fn synced(&self) {
        let bytes = FileBytes::copy_of(&self.bytes);
        self.storage.disk().synced(self.file, bytes);
    }
}

impl NewFile for MemoryNewFile {
    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> Result<()> {
        {
            let mut s = self.storage.state();
            s.writes += 1;
            if (s.faults.writes_before_failure).is_some_and(|n| s.writes > n) {
                return Err(Error::Io {
                    path: self.storage.path(&self.temp),
                    op: "write",
                    source: std::io::Error::new(
                        std::io::ErrorKind::StorageFull,
                        "injected fault: no space left",
                    ),
                });
            }
        }
        let range = offset..offset.saturating_add(bytes.len() as u64);
        let Some(r) = usize_range(&range) else {
            return Err(out_of_file(
                &self.storage.path(&self.temp),
                &range,
                self.bytes.len() as u64,
            ));
        };
        if self.bytes.len() < r.end {
            self.bytes.resize(r.end, 0);
        }
        self.bytes[r].copy_from_slice(bytes);
        Ok(())
    }

    fn sync_data(&mut self) -> Result<()> {
        self.synced();
        Ok(())
    }

    fn sync_all(&mut self) -> Result<()> {
        self.synced();
        Ok(())
    }

    fn publish_new(self: Box<Self>, name: &str, durable: bool) -> Result<()> {
        let path = self.storage.path(name);
        let bytes = FileBytes::copy_of(&self.bytes);
        self.storage.publish(
            name,
            bytes,
            (Some(self.file), Some(&self.temp)),
            durable,
            |s| match s.files.contains_key(name) {
                true => Err(Error::CommitConflict {
                    path,
                    detail: "a file with this name exists already".into(),
                }),
                false => Ok(()),
            },
        )
    }

    fn abandon(self: Box<Self>) {
        let mut disk = self.storage.disk();
        disk.named(&self.storage.folder, &self.temp, None);
    }
}

#[derive(Debug)]
struct MemoryLease {
    storage: MemoryStorage,
    pid: u32,
    token: Option<String>,
    held: Held,
}

/// Which lock a [`MemoryLease`] holds.
#[derive(Debug, Clone, Copy)]
enum Held {
    /// The one-writer lock.
    Sole,
    /// A share of the dataset among writers sharing it.
    Shared,
    /// The commit lock of writers sharing the dataset.
    Commit,
}

impl WriterLease for MemoryLease {
    fn is_owner(&self) -> bool {
        self.pid == std::process::id()
    }

    fn confirm(&self) -> Result<()> {
        let s = self.storage.state();
        match self.held {
            Held::Sole if s.locked_by != Some(self.pid) => Err(Error::CommitConflict {
                path: self.storage.root.clone(),
                detail: "another writer took the lock over".into(),
            }),
            _ => Ok(()),
        }
    }

    fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }
}

impl Drop for MemoryLease {
    fn drop(&mut self) {
        if self.is_owner() {
            let mut s = self.storage.state();
            match self.held {
                Held::Sole if s.locked_by == Some(self.pid) => s.locked_by = None,
                Held::Sole => {}
                Held::Shared => s.joined = s.joined.saturating_sub(1),
                Held::Commit => s.committing = false,
            }
        }
    }
}
