//! Where a zero-copy tensor's bytes come from, so a DataLoader worker can send the main
//! process a file range instead of the bytes.
//!
//! Every shard mapping a read hands out is registered with its path and file identity. While
//! a tensor over a mapping lives, the mapping lives, so an address inside a live registered
//! mapping can only belong to a view of it: [`origin`] is exact, never a guess. The main
//! process maps the range privately ([`map_private`]) and gets the same bytes, writable
//! copy-on-write, without a copy.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use hspack::io::mmap::{map_private_range, FileId};
use hspack::io::{FileBytes, MappingRef};
use memmap2::MmapMut;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::IntoPy;

struct Entry {
    map: MappingRef,
    path: PathBuf,
    id: FileId,
}

static MAPPINGS: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

fn entries() -> std::sync::MutexGuard<'static, Vec<Entry>> {
    MAPPINGS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Registers the mapping `bytes` lie in, of shard file `path`, unless it is registered
/// already; bytes that are not mapped are not registered.
pub fn register(bytes: &FileBytes, path: &Path) {
    let Some(map) = bytes.mapping() else {
        return;
    };
    let mut all = entries();
    if all.iter().any(|e| e.map.same_as(&map)) {
        return;
    }
    let Ok(file) = std::fs::File::open(path) else {
        return; // unregistered tensors are simply sent as bytes
    };
    let Ok(id) = FileId::of(&file, path) else {
        return;
    };
    all.retain(|e| e.map.is_alive());
    all.push(Entry {
        map,
        path: path.to_path_buf(),
        id,
    });
}

/// `(path, file offset, dev, ino)` of bytes `addr..addr + len` when they lie inside one live
/// shard mapping of this process, else None.
#[pyfunction]
pub fn origin(addr: usize, len: usize) -> Option<(PathBuf, u64, u64, u64)> {
    let all = entries();
    all.iter()
        .filter(|e| e.map.is_alive())
        .find(|e| {
            addr >= e.map.base
                && addr
                    .checked_add(len)
                    .is_some_and(|end| end <= e.map.base + e.map.len)
        })
        .map(|e| {
            let offset = (addr - e.map.base) as u64;
            (e.path.clone(), offset, e.id.dev, e.id.ino)
        })
}

/// A private (copy-on-write) mapping of a file range, as a writable byte array for numpy;
/// the mapping lives as long as this object (numpy arrays over it hold it as their base).
#[pyclass(module = "hspack._hspack", frozen)]
pub struct PrivateMap {
    _map: MmapMut,
    addr: usize,
    len: usize,
}

/// Maps `len` bytes at `offset` of `path` privately; the file must still be `(dev, ino)`.
#[pyfunction]
pub fn map_private(
    py: Python<'_>,
    path: PathBuf,
    offset: u64,
    len: usize,
    dev: u64,
    ino: u64,
) -> PyResult<PrivateMap> {
    let mut map = py
        .allow_threads(|| map_private_range(&path, offset, len, FileId { dev, ino }))
        .py_err()?;
    let addr = map.as_mut_ptr() as usize;
    Ok(PrivateMap {
        _map: map,
        addr,
        len,
    })
}

#[pymethods]
impl PrivateMap {
    fn __len__(&self) -> usize {
        self.len
    }

    /// The numpy array interface (version 3): writable bytes.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", (self.len,))?;
        d.set_item("typestr", "|u1")?;
        d.set_item("data", (self.addr, false))?;
        Ok(d)
    }
}
