//! `verify`: the full (or quick) check of a dataset, as a dict.

use crate::detach::detached;
use hspack::verify::{verify as verify_dataset, VerifyOptions};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{to_py, IntoPy};

/// Verifies the dataset in `path`. Returns a dict: `ok`, `shards`, `samples`,
/// `chunk_headers`, `chunks`, `bytes_hashed`, `shard_bytes`, `digest`, `problems`, a list of
/// `HspackError` objects (not raised) naming each problem, `leftovers` and `unknown_files`
/// (paths that are not damage) and `notes` (text about them). Raises only when the manifest
/// cannot be read.
#[pyfunction]
#[pyo3(signature = (path, quick = false))]
pub fn verify<'py>(
    py: Python<'py>,
    path: std::path::PathBuf,
    quick: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let report = detached(py, || {
        verify_dataset(path, VerifyOptions { quick }, &|_| {})
    })
    .py_err()?;
    let d = PyDict::new(py);
    d.set_item("ok", report.is_ok())?;
    d.set_item("notes", report.notes())?;
    d.set_item("shards", report.shards)?;
    d.set_item("samples", report.samples)?;
    d.set_item("chunk_headers", report.chunk_headers)?;
    d.set_item("chunks", report.chunks)?;
    d.set_item("bytes_hashed", report.bytes_hashed)?;
    d.set_item("shard_bytes", report.shard_bytes)?;
    d.set_item("digest", report.proven_digest())?;
    d.set_item("leftovers", report.leftovers)?;
    d.set_item("unknown_files", report.unknown_files)?;
    let problems: Vec<PyObject> = report
        .problems
        .into_iter()
        .map(|e| to_py(e).into_value(py).into_any())
        .collect();
    d.set_item("problems", problems)?;
    Ok(d)
}

/// Compares the dataset in `b` with the one in `a` (the same samples, by key), value by
/// value; returns `hspack compare --json`'s object as JSON: `samples`, `rows`, and `fields`,
/// each `field`, `layer`, `stored`, `values`, `differing`, `non_finite`, `max_abs`, `rel_l2`,
/// `cosine_mean`, `cosine_min`.
#[pyfunction]
#[pyo3(signature = (a, b, samples = None))]
pub fn compare_json(
    py: Python<'_>,
    a: std::path::PathBuf,
    b: std::path::PathBuf,
    samples: Option<u64>,
) -> PyResult<String> {
    detached(py, || {
        let (x, y) = (hspack::Dataset::open(a)?, hspack::Dataset::open(b)?);
        let c = hspack::compare::compare(&x, &y, &hspack::compare::CompareOptions { samples })?;
        Ok(serde_json::to_string(&c).expect("a comparison serializes"))
    })
    .py_err()
}
