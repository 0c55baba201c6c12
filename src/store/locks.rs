//! The store's locks (FORMAT.md §11.6): `flock(2)` on files of `locks/`, released by the
//! kernel when their process ends, however it ends.
//!
//! - `gc.lock`: held shared by everything that adds blobs, from its first lookup of an
//!   existing blob until the dataset that references the new and found blobs is published;
//!   held exclusive by `store gc`. So a collection never runs between a writer finding a
//!   blob and that blob becoming referenced, and never sees a pack an add is still writing.
//! - `index.lock`: exclusive, while `index.json` is read and replaced.
//! - `dataset-NAME.lock`: exclusive, by the one writer (or add, or rm) of dataset NAME.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};

use crate::error::{io, Error, Result};

/// A held lock; dropping it releases it.
#[derive(Debug)]
pub struct StoreLock {
    _file: File,
    pid: u32,
}

impl StoreLock {
    /// True in the process that took it (not in a forked child).
    pub fn is_owner(&self) -> bool {
        self.pid == std::process::id()
    }
}

fn lock_path(store: &Path, name: &str) -> PathBuf {
    store.join("locks").join(name)
}

fn open(path: &Path) -> Result<File> {
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .map_err(io(path, "open lock"))
}

/// Waits for lock file `name`, shared or exclusive.
fn hold(store: &Path, name: &str, shared: bool) -> Result<StoreLock> {
    let path = lock_path(store, name);
    let file = open(&path)?;
    let held = if shared {
        file.lock_shared()
    } else {
        file.lock()
    };
    held.map_err(io(&path, "lock"))?;
    Ok(StoreLock {
        _file: file,
        pid: std::process::id(),
    })
}

/// Waits for the shared hold of `gc.lock`.
pub fn adding(store: &Path) -> Result<StoreLock> {
    hold(store, "gc.lock", true)
}

/// Waits for the exclusive hold of `gc.lock`.
pub fn collecting(store: &Path) -> Result<StoreLock> {
    hold(store, "gc.lock", false)
}

/// Waits for `index.lock`.
pub fn index(store: &Path) -> Result<StoreLock> {
    hold(store, "index.lock", false)
}

/// Takes dataset `name`'s lock, or says that another process holds it.
pub fn dataset(store: &Path, name: &str) -> Result<StoreLock> {
    let path = lock_path(store, &format!("dataset-{name}.lock"));
    let file = open(&path)?;
    match file.try_lock() {
        Ok(()) => Ok(StoreLock {
            _file: file,
            pid: std::process::id(),
        }),
        Err(TryLockError::WouldBlock) => Err(Error::Locked {
            path: store.join(name),
            holder: "another process writing, adding or removing this dataset of the store".into(),
        }),
        Err(TryLockError::Error(e)) => Err(io(&path, "lock")(e)),
    }
}
