//! The store's locks (FORMAT.md §11.6).
//!
//! In a folder, `flock(2)` on files of `locks/`, released by the kernel when their process
//! ends, however it ends:
//! - `gc.lock`: held shared by everything that adds blobs, from its first lookup of an
//!   existing blob until the dataset that references the new and found blobs is published;
//!   held exclusive by `store gc`. So a collection never runs between a writer finding a
//!   blob and that blob becoming referenced, and never sees a pack an add is still writing.
//! - `index.lock`: exclusive, while `index.json` is read and replaced.
//! - `dataset-NAME.lock`: exclusive, by the one writer (or add, or rm) of dataset NAME.
//!
//! In object storage, which has no lock a dead process releases, lease objects of `locks/`
//! ([`crate::io::object_lease`]: taken by conditional puts, renewed while their holder
//! lives, expiring when it stops):
//! - an add puts its own `add-TOKEN.lease`, then looks for a live `gc.lease`: while there is
//!   one it takes its lease back and waits; an expired one it revokes, so that a collection
//!   that hung learns it lost its lease before it deletes anything. A collection takes `gc.lease`, then waits until
//!   no `add-*.lease` is live, revoking the expired ones (rewritten as revoked, so their
//!   holders' renewals fail; deleted by a collection an hour later). Each side writes
//!   before it looks, and listings are strongly consistent, so of an add and a collection
//!   that start together at least one sees the other.
//! - `index.lease`, taken waiting, while `index.json` is read and replaced (which is also a
//!   compare-and-swap);
//! - `dataset-NAME.lease`, by the one writer of dataset NAME (whose commits are also a
//!   compare-and-swap of `datasets/NAME.json`).
//!
//! An add whose lease expired (it hung past the lease's life) and was revoked by a collection
//! fails before it publishes its dataset ([`StoreLock::check`]).

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{io, Error, Result};
use crate::io::lock::{lock_waiting, WaitOrError};
use crate::io::object_lease::{self, Backoff, ObjectLease};
use crate::io::{ObjectStorage, Storage};

/// Where a store's locks are.
#[derive(Debug, Clone)]
pub enum Locks {
    /// `flock`s on files of this folder.
    Folder(PathBuf),
    /// Lease objects under this prefix.
    Objects(ObjectStorage),
}

/// A held lock; dropping it releases it.
#[derive(Debug)]
pub struct StoreLock {
    held: Held,
    pid: u32,
}

#[derive(Debug)]
enum Held {
    File(File),
    Lease(ObjectLease),
}

impl StoreLock {
    fn new(held: Held) -> StoreLock {
        StoreLock {
            held,
            pid: std::process::id(),
        }
    }

    /// True in the process that took it (not in a forked child).
    pub fn is_owner(&self) -> bool {
        self.pid == std::process::id()
    }

    /// Fails when the lock is lost: a lease that expired and was revoked or taken over (read
    /// now, not as last renewed). A `flock` is never lost while its process lives.
    pub fn check(&self) -> Result<()> {
        match &self.held {
            Held::File(_) => Ok(()),
            Held::Lease(lease) => lease.confirm().map_err(|e| match e {
                // Not a conflict with another writer of the dataset, which a copy resolves by
                // reading what that writer published: this writer's hold on the store is gone.
                Error::CommitConflict { path, .. } => Error::Store {
                    path,
                    detail: "this writer's lease on the store expired (it stopped renewing it \
                             for longer than the lease's life) and another process took it \
                             over or a collection revoked it, so what it added may be gone; \
                             this commit was not published: run again (what was committed \
                             before stays)"
                        .into(),
                },
                e => e,
            }),
        }
    }
}

impl Drop for StoreLock {
    /// Releases a folder's `flock` now, in the process that took it: a child forked meanwhile
    /// shares the open file, and would otherwise hold the lock until it exits. A forked
    /// child's copy releases nothing. A lease releases itself ([`ObjectLease`]'s drop).
    fn drop(&mut self) {
        if let (Held::File(file), true) = (&self.held, self.is_owner()) {
            let _ = file.unlock();
        }
    }
}

/// The name of the lease a new add puts.
fn add_lease_name() -> String {
    format!(
        "add-{}.lease",
        crate::format::manifest::hex(&crate::io::unique_id(b"add"))
    )
}

const GC_LEASE: &str = "gc.lease";

/// What holds `gc.lock` while an add waits for it, said where the wait runs out.
const COLLECTING: &str = "a collection (`hspack store gc`)";

/// What holds `gc.lock` while a collection waits for it.
const ADDING: &str = "writers adding to the store (until their commits), or another collection";

/// What holds `index.lock`.
const INDEXING: &str = "a process replacing the store's index";

/// A folder lock's wait that ran out, as the store's error; `who` holds the lock.
fn waited_for(e: WaitOrError, store: &Path, who: &str) -> Error {
    match e {
        WaitOrError::Waited(w) => Error::Store {
            path: store.to_path_buf(),
            detail: format!("{}; run again once it is done", w.holder(who)),
        },
        WaitOrError::Error(e) => e,
    }
}

/// What a collection waits for when writers are committing.
const WAITING_FOR_ADDS: &str = "waiting for the writers adding to the store to finish their \
     commits, or for another collection (a collection starts between commits; a process that \
     is stuck holds it up: see `ps` for hspack processes)";

impl Locks {
    fn file(dir: &Path, name: &str) -> Result<File> {
        let path = dir.join(name);
        OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io(&path, "open lock"))
    }

    /// Waits for lock file `name`, shared or exclusive, up to
    /// [`commit_wait`](object_lease::commit_wait); past it, says what holds it (`who`).
    fn hold(dir: &Path, name: &str, shared: bool, who: &str) -> Result<StoreLock> {
        let path = dir.join(name);
        let file = lock_waiting(Locks::file(dir, name)?, &path, shared)
            .map_err(|e| waited_for(e, dir, who))?;
        Ok(StoreLock::new(Held::File(file)))
    }

    /// Waits while a collection runs, then holds what keeps one from starting.
    pub fn adding(&self) -> Result<StoreLock> {
        let leases = match self {
            Locks::Folder(dir) => return Locks::hold(dir, "gc.lock", true, COLLECTING),
            Locks::Objects(leases) => leases,
        };
        let deadline = Instant::now() + object_lease::commit_wait();
        let mut pause = Backoff::up_to(Duration::from_secs(1));
        loop {
            let mine = ObjectLease::take_new(leases, &add_lease_name())?;
            // A collection whose lease expired (it hung) is revoked, so that it learns so
            // before it deletes what this add may find and reference.
            match object_lease::revoke_expired(leases, GC_LEASE)? {
                None => return Ok(StoreLock::new(Held::Lease(mine))),
                Some(gc) if Instant::now() >= deadline => return Err(gc),
                Some(_) => {
                    drop(mine);
                    pause.wait();
                }
            }
        }
    }

    /// What [`Locks::adding`] holds, taken by an add whose writer holds one already (from an
    /// earlier part of the same commit): no collection can get past its wait for adds while
    /// that one is held, so this one does not wait for a collection, which would wait for
    /// this writer's commit (each for the other, until the collection gave up).
    pub fn adding_beside_held(&self) -> Result<StoreLock> {
        match self {
            Locks::Folder(dir) => Locks::hold(dir, "gc.lock", true, COLLECTING),
            Locks::Objects(leases) => Ok(StoreLock::new(Held::Lease(ObjectLease::take_new(
                leases,
                &add_lease_name(),
            )?))),
        }
    }

    /// Takes the collector's lock, then waits until no add holds its lock (in a folder: waits
    /// for another collection too; in object storage, refused while another runs); `waiting`
    /// is told once, with what it waits for, when it must.
    pub fn collecting(&self, waiting: &dyn Fn(&str)) -> Result<StoreLock> {
        let leases = match self {
            Locks::Folder(dir) => {
                let file = Locks::file(dir, "gc.lock")?;
                match file.try_lock() {
                    Ok(()) => return Ok(StoreLock::new(Held::File(file))),
                    Err(TryLockError::WouldBlock) => waiting(WAITING_FOR_ADDS),
                    Err(TryLockError::Error(e)) => return Err(io(dir.join("gc.lock"), "lock")(e)),
                }
                return Ok(StoreLock::new(Held::File(
                    lock_waiting(file, &dir.join("gc.lock"), false)
                        .map_err(|e| waited_for(e, dir, ADDING))?,
                )));
            }
            Locks::Objects(leases) => leases,
        };
        let mine = ObjectLease::take_file(leases, GC_LEASE)?;
        let deadline = Instant::now() + object_lease::commit_wait();
        let mut pause = Backoff::up_to(Duration::from_secs(1));
        let mut told = false;
        loop {
            let mut adding = None;
            for name in leases.list()? {
                if name.starts_with("add-") && name.ends_with(".lease") {
                    adding = object_lease::revoke_expired(leases, &name)?.or(adding);
                }
            }
            match adding {
                None => return Ok(StoreLock::new(Held::Lease(mine))),
                Some(add) if Instant::now() >= deadline => return Err(add),
                Some(_) => {
                    if !told {
                        waiting(WAITING_FOR_ADDS);
                        told = true;
                    }
                    pause.wait()
                }
            }
        }
    }

    /// Waits for the index's lock.
    pub fn index(&self) -> Result<StoreLock> {
        match self {
            Locks::Folder(dir) => Locks::hold(dir, "index.lock", false, INDEXING),
            Locks::Objects(leases) => Ok(StoreLock::new(Held::Lease(ObjectLease::take_waiting(
                leases,
                "index.lease",
            )?))),
        }
    }

    /// Takes dataset `name`'s lock, or says that another process holds it.
    pub fn dataset(&self, store: &Path, name: &str) -> Result<StoreLock> {
        let dir = match self {
            Locks::Folder(dir) => dir,
            Locks::Objects(leases) => {
                let file = format!("dataset-{name}.lease");
                return Ok(StoreLock::new(Held::Lease(ObjectLease::take_file(
                    leases, &file,
                )?)));
            }
        };
        let path = dir.join(format!("dataset-{name}.lock"));
        let mut file = Locks::file(dir, &format!("dataset-{name}.lock"))?;
        match file.try_lock() {
            Ok(()) => {
                crate::io::lock::write_holder(&mut file, &path)?;
                Ok(StoreLock::new(Held::File(file)))
            }
            Err(TryLockError::WouldBlock) => Err(Error::Locked {
                path: store.join(name),
                holder: format!(
                    "another process writing, adding or removing this dataset of the store: {}",
                    crate::io::lock::holder_text(&mut file, &path)
                ),
            }),
            Err(TryLockError::Error(e)) => {
                Err(io(dir.join(format!("dataset-{name}.lock")), "lock")(e))
            }
        }
    }
}
