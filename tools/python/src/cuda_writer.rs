//! `CudaWriter`: the native half of `hspack.capture.CudaWriter` (feature `cuda`).
//!
//! The Python side turns tensors (PyTorch, `__cuda_array_interface__`, DLPack) into
//! `(name, device address, bytes)` and passes the objects that own the memory; they are held
//! until the copies are complete and then released on the writer's thread, without the GIL.

use crate::detach::detached;
use std::sync::Mutex;

use hspack::capture::cuda::{
    CaptureError, CaptureStats, CudaWriter as Inner, CudaWriterOptions, DeviceField, Discard,
    Producer,
};
use hspack::{DatasetWriter, Schema};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{bad_option, other, to_py};
use crate::writer::{write_options, Face};

type Stats = (usize, usize, usize, u64, f64, f64, u64, u64, u64, u64, u64);

fn stats(s: CaptureStats) -> Stats {
    (
        s.slots,
        s.slot_bytes,
        s.busy,
        s.waits,
        s.wait_seconds,
        s.append_seconds,
        s.bytes_copied,
        s.samples_given,
        s.samples_written,
        s.oversize,
        s.unwritten,
    )
}

/// A capture error as an `HspackError` with the same context fields.
fn capture_err(err: CaptureError) -> PyErr {
    let message = err.to_string();
    match err {
        CaptureError::Dataset(e) => to_py(*e),
        CaptureError::NoDriver { detail, .. } => {
            other("NoDriver", message, None, None, Some(detail))
        }
        CaptureError::OldDriver { detail, .. } => {
            other("OldDriver", message, None, None, Some(detail))
        }
        CaptureError::Driver { name, .. } => other("Driver", message, None, None, Some(name)),
        CaptureError::NoDevice { .. } => other("NoDevice", message, None, None, None),
        CaptureError::BadTensor { key, field, detail } => {
            other("BadTensor", message, Some(key), Some(field), Some(detail))
        }
        CaptureError::Write { key, .. } => other("Write", message, Some(key), None, None),
        CaptureError::Stopped { .. } => other("Stopped", message, None, None, None),
        CaptureError::BadOption { option, detail } => bad_option(option, &detail),
        _ => other("Other", message, None, None, None),
    }
}

/// The native CUDA capture writer.
#[pyclass(module = "hspack._hspack", frozen)]
pub struct CudaWriter {
    inner: Mutex<Option<Inner>>,
    /// The process that opened it: its copy and writer threads, its CUDA context and pinned
    /// buffers are that process's.
    pid: u32,
}

impl Drop for CudaWriter {
    /// In a process forked from the one that opened it, the writer is forgotten, not stopped:
    /// stopping waits for threads the fork did not copy.
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            let inner = self.inner.get_mut().unwrap_or_else(|e| e.into_inner());
            std::mem::forget(inner.take());
        }
    }
}

impl CudaWriter {
    /// Refuses in a process forked from the one that opened the writer (a DataLoader worker,
    /// `os.fork()`): the threads that copy and write are the parent's, so a flush there would
    /// wait for good, and CUDA does not work across a fork.
    fn check_owner(&self) -> PyResult<()> {
        if self.pid == std::process::id() {
            return Ok(());
        }
        Err(bad_option(
            "writer",
            &format!(
                "this CudaWriter was opened in process {}, and this process was forked from it; \
                 its threads and CUDA buffers are that process's: append from there, or open a \
                 new CudaWriter in this process (to its own dataset, or with shared writers)",
                self.pid
            ),
        ))
    }

    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut Inner) -> Result<T, CaptureError> + Send,
    ) -> PyResult<T> {
        self.check_owner()?;
        detached(py, || {
            let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            guard.as_mut().map(f)
        })
        .ok_or_else(|| bad_option("writer", "the writer is finished; open a new one to append"))?
        .map_err(capture_err)
    }
}

#[pymethods]
impl CudaWriter {
    /// Opens (creating or resuming) the dataset in `path` (schema as JSON) and a ring of
    /// `slots` pinned buffers of `slot_bytes` (default: sized from the fields captured) on
    /// CUDA device `device`. With `discard`, samples
    /// are dropped instead of written and `path` is not used.
    #[new]
    #[pyo3(signature = (path, schema_json, device = 0, slots = 8, slot_bytes = None, create = false, discard = false, options = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: std::path::PathBuf,
        schema_json: &str,
        device: i32,
        slots: usize,
        slot_bytes: Option<usize>,
        create: bool,
        discard: bool,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let schema: Schema =
            serde_json::from_str(schema_json).map_err(|e| bad_option("schema", &e.to_string()))?;
        let write = write_options(options, Face::CudaWriter)?;
        let opts = CudaWriterOptions {
            device,
            slots,
            slot_bytes,
            write: write.clone(),
        };
        let w = detached(py, || {
            if discard {
                Inner::with_sink(Box::new(Discard), schema, opts)
            } else if create {
                // Fail on the driver before a dataset is created.
                hspack::capture::cuda::driver_version()?;
                let dw = DatasetWriter::create(&path, schema.clone(), write)?;
                Inner::with_sink(Box::new(dw), schema, opts)
            } else {
                Inner::open(&path, schema, opts)
            }
        });
        Ok(CudaWriter {
            inner: Mutex::new(Some(w.map_err(capture_err)?)),
            pid: std::process::id(),
        })
    }

    /// Queues a sample: `fields` is `[(name, device address, bytes)]`, produced by the work
    /// queued on `streams`; `owners` keeps the memory alive until the copies are done.
    /// Releases the GIL, also while it blocks.
    fn append(
        &self,
        py: Python<'_>,
        key: &str,
        fields: Vec<(String, u64, usize)>,
        streams: Vec<u64>,
        overwrite: bool,
        owners: PyObject,
    ) -> PyResult<()> {
        let producer = Producer {
            streams,
            reuses_buffers: overwrite,
        };
        self.with(py, move |w| {
            let device: Vec<DeviceField<'_>> = fields
                .iter()
                .map(|(name, ptr, bytes)| DeviceField {
                    name,
                    ptr: *ptr,
                    bytes: *bytes,
                })
                .collect();
            w.append(key, &device, producer, Box::new(owners))
        })
    }

    /// True when a sample with `key` was given to this writer or is in the dataset.
    fn contains(&self, py: Python<'_>, key: &str) -> PyResult<bool> {
        self.with(py, |w| Ok(w.contains_key(key)))
    }

    /// Counters, as a tuple in the order of `hspack.capture.cuda_writer.STATS`.
    fn stats(&self, py: Python<'_>) -> PyResult<Stats> {
        self.with(py, |w| Ok(stats(w.stats())))
    }

    /// Blocks until every sample given so far is written; raises a writer-thread error.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |w| w.flush())
    }

    /// Flushes and commits.
    fn commit(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |w| w.commit())
    }

    /// Flushes, finishes the dataset and stops the threads; returns the counters.
    fn finish(&self, py: Python<'_>) -> PyResult<Stats> {
        self.check_owner()?;
        let w = detached(py, || {
            let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            guard.take()
        });
        let w = w.ok_or_else(|| bad_option("writer", "the writer is already finished"))?;
        detached(py, || w.finish()).map(stats).map_err(capture_err)
    }

    /// Stops without committing what was given since the last commit (samples in flight are
    /// still copied, so no copy outlives its memory).
    fn abort(&self, py: Python<'_>) -> PyResult<()> {
        self.check_owner()?;
        detached(py, || {
            let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            drop(guard.take());
        });
        Ok(())
    }
}
