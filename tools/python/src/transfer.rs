//! `copy`: a dataset copied between folders and object storage, proven (`hspack cp`/`sync`).

use crate::detach::detached;
use hspack::transfer::{copy as copy_dataset, CopyMode, CopyOptions};
use pyo3::prelude::*;

use crate::errors::IntoPy;

/// Copies the dataset at `src` to `dst` (folders or URLs) and returns the report as JSON.
#[pyfunction]
#[pyo3(signature = (src, dst, sync = false, reread = true, jobs = 4))]
pub fn copy(
    py: Python<'_>,
    src: std::path::PathBuf,
    dst: std::path::PathBuf,
    sync: bool,
    reread: bool,
    jobs: usize,
) -> PyResult<String> {
    let options = CopyOptions {
        mode: if sync { CopyMode::Sync } else { CopyMode::Copy },
        reread,
        jobs,
    };
    let report = detached(py, || {
        let src = hspack::Dataset::open(&src)?;
        let dst = hspack::store::open_location(&dst)?;
        copy_dataset(&src, &dst, &options, &|_| {})
    })
    .py_err()?;
    Ok(serde_json::to_string(&report).expect("a report is plain data"))
}

/// Makes a new store in folder `path`: its datasets are then written and read as
/// `path/NAME` wherever a dataset goes.
#[pyfunction]
pub fn init_store(py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
    detached(py, || hspack::store::Store::init(&path).map(|_| ())).py_err()
}
