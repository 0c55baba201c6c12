//! Shared memory a DataLoader worker builds samples in and lends to the trainer process
//! (`hspack::io::loan`): [`take_shared`] in the worker, [`lend`] when a tensor over it is
//! sent, [`receive_lent`] in the trainer.

use crate::detach::detached;
use std::sync::Arc;

use hspack::io::loan::{self, Loan};
use hspack::io::mmap::{FileId, SharedRegion};
use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

enum Holder {
    /// This process's region: reused once no buffer over it and no loan on it is left.
    Owned(Arc<SharedRegion>),
    /// Another process's region, lent to this one until dropped.
    Lent(Loan),
}

/// Bytes of shared memory, writable, as a Python object numpy can view (`u8`).
#[pyclass(module = "hspack._hspack", frozen)]
pub struct SharedBuffer {
    holder: Holder,
    len: usize,
}

impl SharedBuffer {
    fn ptr(&self) -> usize {
        match &self.holder {
            Holder::Owned(region) => region.data_ptr() as usize,
            Holder::Lent(loan) => loan.as_ptr() as usize,
        }
    }
}

#[pymethods]
impl SharedBuffer {
    /// Always `u8`: callers view the bytes as their dtype.
    #[getter]
    fn dtype(&self) -> &'static str {
        "u8"
    }

    /// Bytes.
    fn __len__(&self) -> usize {
        self.len
    }

    /// The numpy array interface (version 3), writable.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", (self.len,))?;
        d.set_item("typestr", "|u1")?;
        d.set_item("data", (self.ptr(), false))?;
        Ok(d)
    }
}

/// `nbytes` of shared memory for this process to write and send: memory an earlier sample used,
/// once nothing holds it any more, else new. Raises OSError when none can be had.
#[pyfunction]
pub fn take_shared(py: Python<'_>, nbytes: usize) -> PyResult<SharedBuffer> {
    let region = detached(py, || loan::take(nbytes))
        .map_err(|e| PyOSError::new_err(format!("shared memory of {nbytes} bytes: {e}")))?;
    Ok(SharedBuffer {
        holder: Holder::Owned(region),
        len: nbytes,
    })
}

/// What the receiver of a loan is sent: `(pid, fd, dev, ino, offset)`.
type Sent = (u32, i32, u64, u64, usize);

/// `(pid, fd, dev, ino, offset)` of the shared memory of this process holding bytes
/// `addr..addr + len` (this process, the region's descriptor and file identity, where the bytes
/// start in it), with a loan taken out for the process it is about to be sent to (which maps
/// it with [`receive_lent`]); None when no shared memory of this process holds them.
#[pyfunction]
pub fn lend(addr: usize, len: usize) -> PyResult<Option<Sent>> {
    let Some((region, offset)) = loan::lend(addr, len) else {
        return Ok(None);
    };
    // The pool holds only regions this process made, which keep their descriptor.
    let Some(fd) = region.fd() else {
        region.end_loan();
        return Err(PyOSError::new_err(
            "shared memory to send has no descriptor",
        ));
    };
    let id = region.id();
    Ok(Some((std::process::id(), fd, id.dev, id.ino, offset)))
}

/// The bytes `offset..offset + len` of the shared memory that process `pid` lent this one
/// (its descriptor `fd`, file identity `(dev, ino)`): writable, this process's until the
/// buffer is collected.
#[pyfunction]
pub fn receive_lent(
    py: Python<'_>,
    pid: u32,
    fd: i32,
    dev: u64,
    ino: u64,
    offset: usize,
    len: usize,
) -> PyResult<SharedBuffer> {
    let id = FileId { dev, ino };
    let lent = detached(py, || Loan::receive(pid, fd, id, offset, len)).map_err(|e| {
        PyOSError::new_err(format!(
            "a sample a DataLoader worker built in shared memory: {e}; \
                 transfer=\"copy\" sends samples as torch does"
        ))
    })?;
    Ok(SharedBuffer {
        holder: Holder::Lent(lent),
        len,
    })
}
