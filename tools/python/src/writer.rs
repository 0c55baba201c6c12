//! `Writer`: appends samples to a dataset folder; every append releases the GIL.

use std::sync::Mutex;

use hspack::{Codec, DatasetWriter, Schema, WriteOptions};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::borrowed::ByteView;
use crate::errors::{bad_option, IntoPy};

type Stats = (u64, u64, u64, u64);

fn stats(s: hspack::write::WriteStats) -> Stats {
    (s.samples, s.shards, s.bytes, s.raw_bytes)
}

pub(crate) fn write_options(options: Option<&Bound<'_, PyDict>>) -> PyResult<WriteOptions> {
    let mut o = WriteOptions::default();
    let Some(options) = options else {
        return Ok(o);
    };
    for (k, v) in options.iter() {
        let k: String = k.extract()?;
        match k.as_str() {
            "chunk_bytes" => o.chunk_bytes = Some(v.extract()?),
            "block_rows" => o.block_rows = Some(v.extract()?),
            "shard_bytes" => o.shard_bytes = v.extract()?,
            "shard_samples" => o.shard_samples = v.extract()?,
            "zstd_level" => o.zstd_level = v.extract()?,
            "align_log2" => o.align_log2 = v.extract()?,
            "durable" => o.durable = v.extract()?,
            "shared" => o.shared = v.extract()?,
            "codec" => {
                let name: String = v.extract()?;
                o.codec = Codec::from_name(&name).ok_or_else(|| {
                    bad_option("codec", "must be \"none\", \"zstd\" or \"zstd-bytegroup\"")
                })?;
            }
            other => {
                return Err(bad_option(
                    "options",
                    &format!("unknown option `{other}`; known: chunk_bytes, block_rows, shard_bytes, shard_samples, codec, zstd_level, align_log2, durable, shared"),
                ))
            }
        }
    }
    Ok(o)
}

/// A dataset writer (the native half of `hspack.Writer`).
#[pyclass(module = "hspack._hspack", frozen)]
pub struct Writer {
    inner: Mutex<Option<DatasetWriter>>,
}

impl Writer {
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut DatasetWriter) -> hspack::Result<T> + Send,
    ) -> PyResult<T> {
        py.allow_threads(|| {
            let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            match guard.as_mut() {
                Some(w) => Ok(f(w)),
                None => Err(()),
            }
        })
        .map_err(|()| bad_option("writer", "the writer is finished; open a new one to append"))?
        .py_err()
    }
}

#[pymethods]
impl Writer {
    /// Opens (creating or resuming) the dataset in `path` with the schema given as JSON.
    #[new]
    #[pyo3(signature = (path, schema_json, create = false, options = None))]
    fn new(
        py: Python<'_>,
        path: std::path::PathBuf,
        schema_json: &str,
        create: bool,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let schema: Schema =
            serde_json::from_str(schema_json).map_err(|e| bad_option("schema", &e.to_string()))?;
        let options = write_options(options)?;
        let w = py
            .allow_threads(|| {
                if create {
                    DatasetWriter::create(&path, schema, options)
                } else {
                    DatasetWriter::open(&path, schema, options)
                }
            })
            .py_err()?;
        Ok(Writer {
            inner: Mutex::new(Some(w)),
        })
    }

    /// Appends a sample: `fields` is `[(name, buffer)]`, each buffer C-contiguous bytes.
    /// Returns the ordinal, or `None` for a writer sharing the dataset (given at commit).
    fn append(
        &self,
        py: Python<'_>,
        key: &str,
        fields: Vec<(String, Bound<'_, PyAny>)>,
    ) -> PyResult<Option<u64>> {
        let views = fields
            .iter()
            .map(|(name, obj)| ByteView::new(obj, name))
            .collect::<PyResult<Vec<_>>>()?;
        let pairs: Vec<(&str, &[u8])> = fields
            .iter()
            .zip(&views)
            .map(|((name, _), v)| (name.as_str(), v.as_slice()))
            .collect();
        let ordinal = self.with(py, |w| w.append(key, &pairs))?;
        Ok((ordinal != hspack::write::ORDINAL_AT_COMMIT).then_some(ordinal))
    }

    /// True when a sample with `key` was appended (committed or not).
    fn contains(&self, py: Python<'_>, key: &str) -> PyResult<bool> {
        self.with(py, |w| Ok(w.contains_key(key)))
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, |w| Ok(w.len() as usize))
    }

    /// Commits what was appended: `(samples, shards, bytes, raw_bytes)`.
    fn commit(&self, py: Python<'_>) -> PyResult<Stats> {
        self.with(py, |w| w.commit().map(stats))
    }

    /// Commits and closes: `(samples, shards, bytes, raw_bytes)`.
    fn finish(&self, py: Python<'_>) -> PyResult<Stats> {
        let w = py.allow_threads(|| {
            let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            guard.take()
        });
        let w = w.ok_or_else(|| bad_option("writer", "the writer is already finished"))?;
        py.allow_threads(|| w.finish()).map(stats).py_err()
    }

    /// Closes without committing what was appended since the last commit.
    fn abort(&self, py: Python<'_>) {
        let w = py.allow_threads(|| {
            let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            guard.take()
        });
        py.allow_threads(move || drop(w));
    }
}
