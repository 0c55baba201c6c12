//! Publishing files so that a crash never leaves half of one: write a temp file in the same
//! folder, fsync it, rename it over the target, fsync the folder.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{io, Error, Result};
use crate::failpoint::failpoint;

pub use crate::format::manifest::TEMP_SUFFIX;

/// The temp name used while writing `target`.
pub fn temp_path(target: &Path) -> PathBuf {
    let mut name = target.file_name().unwrap_or_default().to_os_string();
    name.push(TEMP_SUFFIX);
    target.with_file_name(name)
}

/// Flushes a folder's entries (renames, creations) to disk.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir, "fsync folder"))
}

/// Renames a finished, synced temp file over `target` and syncs the folder.
pub fn publish(temp: &Path, target: &Path, durable: bool) -> Result<()> {
    std::fs::rename(temp, target).map_err(io(target, "rename into place"))?;
    sync_parent(target, durable)
}

/// Publishes a finished, synced temp file as `target`, which must not exist: a file already
/// there (another writer's) is never replaced. The temp file is linked to its new name, an
/// exclusive create that also holds over NFS, then removed. On a filesystem without hard links
/// it is renamed after a check that `target` is absent (a check the writer lock keeps true).
/// Refused with [`Error::CommitConflict`], the temp file stays for the caller to remove.
pub fn publish_new(temp: &Path, target: &Path, durable: bool) -> Result<()> {
    let taken = || Error::CommitConflict {
        path: target.to_path_buf(),
        detail: "a file with this name exists already".into(),
    };
    match std::fs::hard_link(temp, target) {
        Ok(()) => std::fs::remove_file(temp).map_err(io(temp, "remove after publishing"))?,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Err(taken()),
        Err(_) if target.exists() => return Err(taken()),
        Err(_) => std::fs::rename(temp, target).map_err(io(target, "rename into place"))?,
    }
    sync_parent(target, durable)
}

fn sync_parent(target: &Path, durable: bool) -> Result<()> {
    match target.parent() {
        Some(dir) if durable => sync_dir(dir),
        _ => Ok(()),
    }
}

/// Writes `bytes` to the temp file of `target`, synced when `durable`; returns its path.
fn write_temp(target: &Path, bytes: &[u8], durable: bool) -> Result<PathBuf> {
    let temp = temp_path(target);
    let mut f = File::create(&temp).map_err(io(&temp, "create"))?;
    f.write_all(bytes).map_err(io(&temp, "write"))?;
    if durable {
        f.sync_all().map_err(io(&temp, "fsync"))?;
    }
    failpoint!("atomic-temp-synced");
    Ok(temp)
}

/// Writes `bytes` to `target` atomically, replacing what is there.
pub fn write_atomic(target: &Path, bytes: &[u8], durable: bool) -> Result<()> {
    publish(&write_temp(target, bytes, durable)?, target, durable)
}

/// Writes `bytes` to `target` atomically where no file is: never over one (see
/// [`publish_new`]); the temp file is removed when refused.
pub fn write_new(target: &Path, bytes: &[u8], durable: bool) -> Result<()> {
    let temp = write_temp(target, bytes, durable)?;
    publish_new(&temp, target, durable).inspect_err(|_| {
        let _ = std::fs::remove_file(&temp);
    })
}
