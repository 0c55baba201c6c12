//! `TensorBuffer`: a read tensor as a Python object that numpy can view without copying.
//!
//! It exports `__array_interface__` (pointer, shape, type string), so `numpy.asarray(buf)`
//! makes an array over the bytes whose `base` is the buffer object. The object owns the
//! [`hspack::Tensor`], whose bytes keep a mapped shard alive as long as any array or
//! torch tensor made from it exists, even after the dataset is closed.

use hspack::{DType, Tensor};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// The numpy type string of a dtype. Types numpy lacks (bf16, fp8) come as unsigned integers
/// of the same size; the Python side views them as the right torch dtype.
pub fn typestr(dtype: DType) -> &'static str {
    match dtype {
        DType::Bool => "|b1",
        DType::U8 | DType::F8E4M3FN | DType::F8E5M2 => "|u1",
        DType::I8 => "|i1",
        DType::I16 => "<i2",
        DType::I32 => "<i4",
        DType::I64 => "<i8",
        DType::F16 => "<f2",
        DType::BF16 => "<u2",
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        _ => "|V1",
    }
}

/// A tensor read from a dataset.
#[pyclass(module = "hspack._hspack", frozen)]
pub struct TensorBuffer {
    tensor: Tensor,
}

impl TensorBuffer {
    /// Wraps a tensor.
    pub fn new(tensor: Tensor) -> Self {
        TensorBuffer { tensor }
    }
}

#[pymethods]
impl TensorBuffer {
    /// The dtype name (`bf16`, `f8e4m3fn`, ...).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.tensor.dtype.name()
    }

    /// Rows, then the row shape.
    #[getter]
    fn shape(&self) -> Vec<u64> {
        self.tensor.shape.clone()
    }

    /// True when the bytes are the shard mapping itself (zero-copy).
    #[getter]
    fn is_mapped(&self) -> bool {
        self.tensor.data.is_mapped()
    }

    /// Bytes.
    fn __len__(&self) -> usize {
        self.tensor.bytes().len()
    }

    /// The numpy array interface (version 3), read-only.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", pyo3::types::PyTuple::new(py, &self.tensor.shape)?)?;
        d.set_item("typestr", typestr(self.tensor.dtype))?;
        d.set_item("data", (self.tensor.bytes().as_ptr() as usize, true))?;
        Ok(d)
    }
}
