//! Borrowing the bytes of numpy arrays (and of tensors seen through numpy) by their
//! `__array_interface__`: the one module of this crate with `unsafe`. (The buffer protocol is
//! not in the stable ABI before Python 3.11; this crate targets abi3-py39.)

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::bad_option;

static NDARRAY: pyo3::sync::GILOnceCell<Py<pyo3::types::PyType>> = pyo3::sync::GILOnceCell::new();

/// A C-contiguous byte view of a numpy array; holds a reference to the array while it lives.
pub struct ByteView {
    _owner: Py<PyAny>,
    addr: usize,
    len: usize,
    readonly: bool,
}

impl ByteView {
    /// Views `obj`, which must export a C-contiguous `__array_interface__` (no strides).
    pub fn new(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Self> {
        let bad = |detail: &str| bad_option(what, detail);
        // Only numpy's own arrays: the interface of any other object (one that only claims
        // an address and a shape) is not a promise that the memory is there.
        let ndarray = NDARRAY.import(obj.py(), "numpy", "ndarray")?;
        if !obj.is_instance(ndarray)? {
            return Err(bad(
                "expected a numpy array or a CPU torch tensor, not another object",
            ));
        }
        let iface = obj.getattr("__array_interface__")?;
        let iface = iface
            .downcast::<PyDict>()
            .map_err(|_| bad("bad __array_interface__"))?;
        let strides = iface.get_item("strides")?;
        if strides.is_some_and(|s| !s.is_none()) {
            return Err(bad(
                "the array is not C-contiguous; pass a contiguous array",
            ));
        }
        if iface.get_item("mask")?.is_some_and(|m| !m.is_none()) {
            return Err(bad("masked arrays are not supported"));
        }
        let (addr, readonly): (usize, bool) = iface
            .get_item("data")?
            .ok_or_else(|| bad("the array exports no data pointer"))?
            .extract()
            .map_err(|_| bad("the array's data is not a (pointer, read-only) pair"))?;
        let shape: Vec<usize> = iface
            .get_item("shape")?
            .ok_or_else(|| bad("the array exports no shape"))?
            .extract()?;
        let typestr: String = iface
            .get_item("typestr")?
            .ok_or_else(|| bad("the array exports no type"))?
            .extract()?;
        let item: usize = typestr
            .get(2..)
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| bad("the array's type string has no item size"))?;
        let len = shape
            .iter()
            .try_fold(item, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| bad("the array is too large"))?;
        Ok(ByteView {
            _owner: obj.clone().unbind(),
            addr,
            len,
            readonly,
        })
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        if self.len == 0 || self.addr == 0 {
            return &[];
        }
        // SAFETY: numpy guarantees that a C-contiguous array's `len` bytes at `addr` stay
        // valid and unmoved while the array lives, and `_owner` holds a reference to it for as
        // long as the slice, which borrows `self`. The hazard left is another thread writing
        // the array while we read it with the GIL released: callers must not mutate arrays
        // they have handed to hspack until the call returns.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }

    /// The bytes, writable; an error when the array is read-only.
    pub fn as_mut_slice(&mut self, what: &str) -> PyResult<&mut [u8]> {
        if self.readonly {
            return Err(bad_option(
                what,
                "the array is read-only; pass a writable array",
            ));
        }
        if self.len == 0 || self.addr == 0 {
            return Ok(&mut []);
        }
        // SAFETY: as in `as_slice`, and numpy declared the array writable. `&mut self` makes
        // this the only Rust view of the bytes; Python code must not touch the array while
        // the call that fills it runs.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len) })
    }
}
