//! Asynchronous capture of CUDA device tensors into a dataset (feature `cuda`).
//!
//! ```text
//! producer stream ──record──▶ ready ──wait──▶ copy stream: DtoH into pinned slot ─▶ done
//!                                                                                   │
//!        completion thread: cuEventSynchronize(done), drop the tensors' owner ◀────┘
//!        writer thread: DatasetWriter::append(slot bytes), free the slot
//! ```
//!
//! The driver is loaded at run time: without one, [`CudaWriter::open`] and [`driver_version`]
//! return [`CaptureError::NoDriver`]. `unsafe` code of hspack's CUDA path lives in this module
//! (`driver.rs`), each block with the hazard it guards against.

// The dataset layer's `Error` is large; it crosses these functions once per sample, not in
// a hot loop, so it is not boxed there.
#![allow(clippy::result_large_err)]

#[allow(unsafe_code)] // the driver calls; each block says what it guards against
mod driver;
mod error;
mod ring;
mod sink;
mod writer;

pub use crate::write::{Discard, SampleSink};
pub use driver::LIBCUDA_ENV;
pub use error::CaptureError;
pub use writer::{
    driver_version, CaptureStats, CudaWriter, CudaWriterOptions, DeviceField, Producer,
};

#[cfg(test)]
mod tests;
