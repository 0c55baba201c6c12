//! Where a zero-copy tensor's bytes come from, so a DataLoader worker can send the main
//! process a file range instead of the bytes.
//!
//! Every shard mapping a read hands out is registered with its path and file identity. While
//! a tensor over a mapping lives, the mapping lives, so an address inside a live registered
//! mapping can only belong to a view of it: [`origin`] is exact, never a guess. The main
//! process maps the file ([`map_received`]) and gets the same bytes without a copy: read-only,
//! like every view of a shard in the process that read it.
//!
//! The receiving process maps each file once and keeps the mapping (up to
//! [`RECEIVED_FILES`] files): a tensor is then a slice of a mapping whose pages are already in
//! place, rather than a new mapping that faults in every page and is torn down after.

use crate::detach::detached;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use hspack::io::mmap::{map_identified, replaced, FileId};
use hspack::io::{FileBytes, MappingRef};
use hspack::read::Buffer;
use hspack::{DType, Tensor};
use pyo3::prelude::*;

use crate::errors::IntoPy;
use crate::tensor_buffer::TensorBuffer;

struct Entry {
    map: MappingRef,
    path: PathBuf,
    id: FileId,
}

/// The registered mappings by base address, and how many entries there were after the last
/// sweep of those no longer alive. Looked up by address, not scanned: a trainer reading a
/// dataset of tens of thousands of shards registers as many mappings, and a scan per read
/// made a pass over it quadratic.
static MAPPINGS: Mutex<Registry> = Mutex::new(Registry {
    by_base: BTreeMap::new(),
    swept: 0,
});

struct Registry {
    by_base: BTreeMap<usize, Entry>,
    swept: usize,
}

impl Registry {
    /// The live entry whose mapping holds `addr..addr + len`. Live mappings do not overlap,
    /// so the one with the highest base at or below `addr` is the only candidate; entries no
    /// longer alive (their memory may be mapped again since) are passed over.
    fn holding(&self, addr: usize, len: usize) -> Option<&Entry> {
        let end = addr.checked_add(len)?;
        let e = self
            .by_base
            .range(..=addr)
            .rev()
            .map(|(_, e)| e)
            .find(|e| e.map.is_alive())?;
        (end <= e.map.base + e.map.len).then_some(e)
    }

    /// Adds the entry of `map` (replacing one of a mapping gone whose memory it reuses); the
    /// entries no longer alive are swept whenever their number has doubled since the last
    /// sweep, so a sweep costs nothing per mapping on average.
    fn push(&mut self, map: MappingRef, path: &Path) {
        self.by_base.insert(
            map.base,
            Entry {
                id: map.file,
                map,
                path: path.to_path_buf(),
            },
        );
        if self.by_base.len() > 2 * self.swept.max(64) {
            self.by_base.retain(|_, e| e.map.is_alive());
            self.swept = self.by_base.len();
        }
    }
}

/// The registry, or None while another thread holds it. Never waits: a DataLoader worker is
/// forked while the trainer's pin-memory thread may be registering a received file, and a lock
/// held by a thread the fork did not copy would be held forever in the child. Whoever finds
/// it held does without: an unregistered tensor is sent as bytes, as torch sends it.
fn entries() -> Option<std::sync::MutexGuard<'static, Registry>> {
    match MAPPINGS.try_lock() {
        Ok(all) => Some(all),
        Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// Registers the mapping `bytes` lie in, of shard file `path`, unless it is registered
/// already; bytes that are not mapped are not registered, nor are those of a mapping that is
/// not of the file at `path` now (a pack of a store, or a shard replaced since it was
/// mapped): those are sent as bytes, never named as a range of another file.
pub fn register(bytes: &FileBytes, path: &Path) {
    let Some(map) = bytes.mapping() else {
        return;
    };
    let Some(mut all) = entries() else {
        return;
    };
    if all
        .by_base
        .get(&map.base)
        .is_some_and(|e| e.map.same_as(&map))
    {
        return;
    }
    let Ok(file) = std::fs::File::open(path) else {
        return;
    };
    if FileId::of(&file, path).is_ok_and(|id| id == map.file) {
        all.push(map, path);
    }
}

/// `(path, file offset, dev, ino)` of bytes `addr..addr + len` when they lie inside one live
/// shard mapping of this process, else None. The path goes to Python as a `str` (a
/// `pathlib.Path` costs more to make than the rest: this runs for every tensor a worker sends).
#[pyfunction]
pub fn origin(addr: usize, len: usize) -> Option<(std::ffi::OsString, u64, u64, u64)> {
    let all = entries()?;
    all.holding(addr, len).map(|e| {
        let offset = (addr - e.map.base) as u64;
        (e.path.clone().into_os_string(), offset, e.id.dev, e.id.ino)
    })
}

/// How many received files a process keeps mapped; past it, the file received longest ago is
/// dropped from the cache (tensors over it keep their mapping alive).
const RECEIVED_FILES: usize = 1024;

/// The files this process mapped for tensors received from others, oldest first.
static RECEIVED: Mutex<Vec<(FileId, PathBuf, FileBytes)>> = Mutex::new(Vec::new());

/// The mapping of the file `path` must still be, `(dev, ino)`: the one kept from an earlier
/// tensor, or a new one, kept and registered (so a tensor received can be handed on as a file
/// range too).
fn received_file(path: &Path, id: FileId) -> hspack::Result<FileBytes> {
    let mut kept = RECEIVED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, _, bytes)) = kept.iter().find(|(k, _, _)| *k == id) {
        return Ok(bytes.clone());
    }
    let bytes = map_identified(path, id)?;
    if let (Some(map), Some(mut all)) = (bytes.mapping(), entries()) {
        all.push(map, path);
    }
    if kept.len() == RECEIVED_FILES {
        kept.remove(0);
    }
    kept.push((id, path.to_path_buf(), bytes.clone()));
    Ok(bytes)
}

/// Drops this process's kept mappings of received files (those under folder `under`, or all):
/// their pages can then leave the page cache (`posix_fadvise(DONTNEED)`, or a deleted file's
/// space be freed) once no tensor over them lives. The next tensor received maps its file
/// again.
#[pyfunction]
#[pyo3(signature = (under = None))]
pub fn release_received(under: Option<PathBuf>) {
    let mut kept = RECEIVED.lock().unwrap_or_else(|e| e.into_inner());
    kept.retain(|(_, path, _)| under.as_ref().is_some_and(|u| !path.starts_with(u)));
}

/// Bytes `offset..offset + len` of `path`, which must still be the file `(dev, ino)`, as a
/// read-only byte tensor over this process's one mapping of the file.
#[pyfunction]
pub fn map_received(
    py: Python<'_>,
    path: PathBuf,
    offset: usize,
    len: usize,
    dev: u64,
    ino: u64,
) -> PyResult<TensorBuffer> {
    let data = detached(py, || {
        let file = received_file(&path, FileId { dev, ino })?;
        let end = offset.checked_add(len).ok_or_else(|| replaced(&path))?;
        file.slice(offset..end).ok_or_else(|| replaced(&path))
    })
    .py_err()?;
    Ok(TensorBuffer::new(Tensor {
        dtype: DType::U8,
        shape: vec![len as u64],
        data: Buffer::File(data),
    }))
}
