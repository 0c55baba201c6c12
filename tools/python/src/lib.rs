//! The native module `hspack._hspack`: thin bindings of the hspack library. The Python package
//! `hspack` builds its API on top of it.

// `hspack::Error` is the library's (large, context-rich) error; results carry it by value.
#![allow(clippy::result_large_err)]

mod borrowed;
#[cfg(feature = "cuda")]
mod cuda_writer;
mod dataset;
mod detach;
mod eagle3;
mod errors;
mod gather;
mod loan;
mod origin;
mod tensor_buffer;
mod transfer;
mod verify;
mod writer;

use pyo3::prelude::*;

#[pymodule]
fn _hspack(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    // Tensors over mapped shards are read-only and torch cannot say so: a write into one is
    // explained on standard error before the process dies of it.
    hspack::io::mmap::explain_write_faults();
    m.add("HspackError", py.get_type::<errors::HspackError>())?;
    m.add("ERROR_CONTEXT", errors::CONTEXT.to_vec())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("EAGLE3", eagle3::names(py)?)?;
    m.add_class::<dataset::Dataset>()?;
    m.add_class::<writer::Writer>()?;
    m.add_class::<tensor_buffer::TensorBuffer>()?;
    m.add_class::<loan::SharedBuffer>()?;
    m.add_function(wrap_pyfunction!(verify::verify, m)?)?;
    m.add_function(wrap_pyfunction!(verify::compare_json, m)?)?;
    m.add_function(wrap_pyfunction!(transfer::copy, m)?)?;
    m.add_function(wrap_pyfunction!(transfer::init_store, m)?)?;
    m.add_function(wrap_pyfunction!(writer::capture_key, m)?)?;
    m.add_function(wrap_pyfunction!(writer::quantize_schema, m)?)?;
    m.add_function(wrap_pyfunction!(loan::take_shared, m)?)?;
    m.add_function(wrap_pyfunction!(loan::lend, m)?)?;
    m.add_function(wrap_pyfunction!(loan::receive_lent, m)?)?;
    m.add_function(wrap_pyfunction!(origin::origin, m)?)?;
    m.add_function(wrap_pyfunction!(origin::map_received, m)?)?;
    m.add_function(wrap_pyfunction!(origin::release_received, m)?)?;
    m.add_function(wrap_pyfunction!(gather::gather_into, m)?)?;
    m.add_function(wrap_pyfunction!(explain_faults_again, m)?)?;
    #[cfg(feature = "cuda")]
    m.add_class::<cuda_writer::CudaWriter>()?;
    Ok(())
}

/// Puts hspack's explanation of a fault on a mapped shard back in front of a handler
/// installed since (a DataLoader worker's, which blames shared memory).
#[pyfunction]
fn explain_faults_again() {
    hspack::io::mmap::explain_faults_again();
}
