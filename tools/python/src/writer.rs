//! `Writer`: appends samples to a dataset folder; every append releases the GIL.

use crate::detach::detached;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use hspack::store::captures::{reuse_captured, written_digest, CaptureConfig};
use hspack::store::Store;
use hspack::{Codec, DatasetWriter, Schema, WriteOptions};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict};

use crate::borrowed::ByteView;
use crate::errors::{bad_option, IntoPy};

type Stats = (u64, u64, u64, u64);

fn stats(s: hspack::write::WriteStats) -> Stats {
    (s.samples, s.shards, s.bytes, s.raw_bytes)
}

/// The writer options a user gives, as an unknown one is answered: those matched below but
/// `prequantized` (`CudaWriter`'s own), and `quantize`, which the Python writer takes first.
const USER_OPTIONS: &str = "chunk_bytes, block_rows, shard_bytes, shard_samples, codec, \
                            zstd_level, align_log2, durable, shared, quantize";

/// Whose options [`write_options`] reads: `CudaWriter`'s also say the quantized fields come
/// as codes and scales (`prequantized`), which only its own quantizer gives.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Face {
    Writer,
    CudaWriter,
}

/// Option `k`'s value as a `T`; a value of another type is a `BadOption` naming `k` and what
/// it was given.
fn option<'py, T: FromPyObject<'py>>(k: &str, v: &Bound<'py, PyAny>, want: &str) -> PyResult<T> {
    v.extract().map_err(|_| {
        let given = v.repr().map_or_else(|_| "?".to_string(), |r| r.to_string());
        bad_option(k, &format!("must be {want}, not {given}"))
    })
}

/// Option `k`'s value as an integer: an int, not a bool, which Python takes for 0 or 1
/// (`chunk_bytes=True` would cut chunks of one byte's worth of rows).
fn integer<'py, T: FromPyObject<'py>>(k: &str, v: &Bound<'py, PyAny>, want: &str) -> PyResult<T> {
    if v.is_instance_of::<PyBool>() {
        return Err(bad_option(k, &format!("must be {want}, not a bool ({v})")));
    }
    option(k, v, want)
}

pub(crate) fn write_options(
    options: Option<&Bound<'_, PyDict>>,
    face: Face,
) -> PyResult<WriteOptions> {
    let mut o = WriteOptions::default();
    let Some(options) = options else {
        return Ok(o);
    };
    const COUNT: &str = "a non-negative integer that fits in 64 bits";
    let mut level_given = false;
    for (k, v) in options.iter() {
        let k: String = option("options", &k, "named by a str")?;
        match k.as_str() {
            "chunk_bytes" => o.chunk_bytes = Some(integer(&k, &v, COUNT)?),
            "block_rows" => o.block_rows = Some(integer(&k, &v, COUNT)?),
            "shard_bytes" => o.shard_bytes = integer(&k, &v, COUNT)?,
            "shard_samples" => o.shard_samples = integer(&k, &v, COUNT)?,
            "zstd_level" => {
                o.zstd_level = integer(&k, &v, "an integer level (up to 22)")?;
                level_given = true;
            }
            "align_log2" => o.align_log2 = Some(integer(&k, &v, "an integer from 0 to 255")?),
            "durable" => o.durable = option(&k, &v, "True or False")?,
            "shared" => o.shared = option(&k, &v, "True or False")?,
            "prequantized" if face == Face::CudaWriter => {
                o.prequantized = option(&k, &v, "True or False")?
            }
            "codec" => {
                let name: String = option(&k, &v, "\"none\", \"zstd\" or \"zstd-bytegroup\"")?;
                o.codec = Codec::from_name(&name)
                    .filter(|c| Codec::LOSSLESS.contains(c))
                    .ok_or_else(|| {
                        bad_option(
                            "codec",
                            "must be \"none\", \"zstd\" or \"zstd-bytegroup\" (fp8 is quantize=\"fp8\")",
                        )
                    })?;
            }
            other => {
                return Err(bad_option(
                    "options",
                    &format!("unknown option `{other}`; known: {USER_OPTIONS}"),
                ))
            }
        }
    }
    if level_given && o.codec == Codec::None {
        // The samples would be written uncompressed, the level passed over unsaid.
        return Err(bad_option(
            "zstd_level",
            &format!(
                "{} compresses nothing with codec \"none\" (the default): give codec=\"zstd\" \
                 or \"zstd-bytegroup\" too, or leave zstd_level out",
                o.zstd_level
            ),
        ));
    }
    Ok(o)
}

/// A dataset writer (the native half of `hspack.Writer`).
#[pyclass(module = "hspack._hspack", frozen)]
pub struct Writer {
    inner: Mutex<Option<DatasetWriter>>,
    /// The store and the name, for a dataset `STORE/NAME`.
    store: Option<(Arc<Store>, String)>,
    /// Capture keys of the samples appended since the last commit: (key, digest, sample key).
    captured: Mutex<Vec<Captured>>,
    /// The process that opened it: a forked copy refuses every call before it takes a lock
    /// (a thread of the parent may have held one at the fork, for good in the child), and its
    /// drop says nothing.
    pid: u32,
    /// The dataset, for the error a forked copy gives.
    path: std::path::PathBuf,
}

impl Drop for Writer {
    /// Says so when samples appended since the last commit are dropped with the writer
    /// (neither `finish` nor `abort` was called): they are not in the dataset.
    fn drop(&mut self) {
        let inner = self.inner.get_mut().unwrap_or_else(|e| e.into_inner());
        let Some(w) = inner.as_ref().filter(|_| std::process::id() == self.pid) else {
            return;
        };
        let (Some(first), Some(last)) = (w.uncommitted_keys().first(), w.uncommitted_keys().last())
        else {
            return;
        };
        let said = format!(
            "hspack.Writer for {} was dropped with {} samples appended since its last commit \
             (`{first}` to `{last}`), which are not in the dataset: call finish() (or write in \
             `with hspack.Writer(...) as w:`), or abort() to drop them on purpose",
            w.dir().display(),
            w.uncommitted_keys().len(),
        );
        Python::with_gil(|py| {
            let category = py.get_type::<pyo3::exceptions::PyUserWarning>();
            let text = std::ffi::CString::new(said.replace('\0', " ")).unwrap_or_default();
            if let Err(e) = PyErr::warn(py, &category, &text, 1) {
                e.write_unraisable(py, None);
            }
        });
    }
}

type Captured = ([u8; 32], [u8; 32], String);

fn capture_key_bytes(key: &[u8]) -> PyResult<[u8; 32]> {
    key.try_into().map_err(|_| {
        bad_option(
            "capture_key",
            "must be the 32 bytes hspack.capture_key returns",
        )
    })
}

impl Writer {
    /// Refuses a copy of the writer in a process forked from the one that opened it.
    fn owned(&self) -> PyResult<()> {
        if std::process::id() == self.pid {
            return Ok(());
        }
        Err(hspack::Error::ForkedWriter {
            path: self.path.clone(),
        })
        .py_err()
    }

    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut DatasetWriter) -> hspack::Result<T> + Send,
    ) -> PyResult<T> {
        self.owned()?;
        detached(py, || {
            let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            match guard.as_mut() {
                Some(w) => Ok(f(w)),
                None => Err(()),
            }
        })
        .map_err(|()| bad_option("writer", "the writer is finished; open a new one to append"))?
        .py_err()
    }

    fn store(&self) -> PyResult<&(Arc<Store>, String)> {
        self.store.as_ref().ok_or_else(|| {
            bad_option(
                "capture_key",
                "capture keys are kept by a store: write into STORE/NAME (make a store with hspack.init_store)",
            )
        })
    }

    /// Records the capture keys of the samples appended and committed (called after a commit
    /// that landed: asked, or a full shard's, inside `append`); those of the samples in
    /// `uncommitted` wait. Records that fail to be recorded are kept for the next commit.
    fn record_captured(&self, py: Python<'_>, uncommitted: &HashSet<String>) -> PyResult<()> {
        self.owned()?;
        let Some((store, name)) = &self.store else {
            return Ok(());
        };
        let (records, waiting): (Vec<_>, Vec<_>) =
            std::mem::take(&mut *self.captured.lock().unwrap_or_else(|e| e.into_inner()))
                .into_iter()
                .partition(|(_, _, key)| !uncommitted.contains(key));
        self.captured
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(waiting);
        if records.is_empty() {
            return Ok(());
        }
        let recorded = detached(py, || store.record_captures(name, &records).map(|_| ()));
        let Err(e) = recorded else {
            return Ok(());
        };
        let n = records.len();
        self.captured
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(records);
        Err(hspack::Error::Store {
            path: store.root().join(name),
            detail: format!(
                "the commit landed, but the capture records of {n} samples were not recorded ({e}); \
                 the next commit tries again (until then, runs capture them again instead of \
                 reusing them)"
            ),
        })
        .py_err()
    }

    /// Forgets the capture records of samples a failed commit left out of the dataset.
    fn forget_uncommitted(&self, py: Python<'_>) {
        if self.owned().is_err() {
            return;
        }
        let records = std::mem::take(&mut *self.captured.lock().unwrap_or_else(|e| e.into_inner()));
        let kept = self.with(py, move |w| {
            Ok(records
                .into_iter()
                .filter(|(_, _, key)| w.contains_key(key))
                .collect::<Vec<_>>())
        });
        if let Ok(kept) = kept {
            *self.captured.lock().unwrap_or_else(|e| e.into_inner()) = kept;
        }
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
        let options = write_options(options, Face::Writer)?;
        // Before the dataset is made: a path that fails here leaves nothing behind.
        let store = match hspack::store::split_store_path(&path).py_err()? {
            Some((root, name)) => Some((Arc::new(Store::open(root).py_err()?), name)),
            None => None,
        };
        let w = detached(py, || {
            if create {
                DatasetWriter::create(&path, schema, options)
            } else {
                DatasetWriter::open(&path, schema, options)
            }
        })
        .py_err()?;
        Ok(Writer {
            inner: Mutex::new(Some(w)),
            store,
            captured: Mutex::new(Vec::new()),
            pid: std::process::id(),
            path,
        })
    }

    /// Appends a sample: `fields` is `[(name, buffer)]`, each buffer C-contiguous bytes.
    /// Returns the ordinal, or `None` for a writer sharing the dataset (given at commit).
    /// With `capture_key`, the store records at the next commit that this sample is that
    /// capture.
    #[pyo3(signature = (key, fields, capture_key = None))]
    fn append(
        &self,
        py: Python<'_>,
        key: &str,
        fields: Vec<(String, Bound<'_, PyAny>)>,
        capture_key: Option<&[u8]>,
    ) -> PyResult<Option<u64>> {
        let capture_key = match capture_key {
            Some(k) => {
                self.store()?;
                Some(capture_key_bytes(k)?)
            }
            None => None,
        };
        let views = fields
            .iter()
            .map(|(name, obj)| ByteView::new(obj, name))
            .collect::<PyResult<Vec<_>>>()?;
        let pairs: Vec<(&str, &[u8])> = fields
            .iter()
            .zip(&views)
            .map(|((name, _), v)| (name.as_str(), v.as_slice()))
            .collect();
        let (ordinal, digest, rolled) = self.with(py, |w| {
            let before = w.uncommitted_keys().len();
            let ordinal = w.append(key, &pairs)?;
            // The digest of the sample as it reads back (quantized fields decoded).
            let digest = capture_key.map(|_| written_digest(w.schema(), &pairs));
            // A full shard was committed before this sample went into a new one: its
            // samples' captures are recorded now, not lost with a run that fails later.
            let rolled = w.uncommitted_keys().len() != before + 1;
            let uncommitted: Option<HashSet<String>> =
                rolled.then(|| w.uncommitted_keys().iter().cloned().collect());
            Ok((ordinal, digest, uncommitted))
        })?;
        if let (Some(k), Some(d)) = (capture_key, digest) {
            self.captured
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((k, d, key.to_string()));
        }
        if let Some(uncommitted) = rolled {
            // A failure keeps the records for the next commit, which reports it: this
            // sample was appended.
            let _ = self.record_captured(py, &uncommitted);
        }
        Ok((ordinal != hspack::write::ORDINAL_AT_COMMIT).then_some(ordinal))
    }

    /// For each `(sample key, capture key)`, appends under the sample key the sample the
    /// store holds for that capture key, checked against its recorded digest. Returns which
    /// were appended, and how many keys named a sample that is gone or changed.
    fn reuse_captured(
        &self,
        py: Python<'_>,
        items: Vec<(String, Vec<u8>)>,
    ) -> PyResult<(Vec<bool>, u64)> {
        let store = Arc::clone(&self.store()?.0);
        let items = items
            .into_iter()
            .map(|(k, c)| Ok((k, capture_key_bytes(&c)?)))
            .collect::<PyResult<Vec<_>>>()?;
        let (digests, stats) = self.with(py, |w| reuse_captured(&store, w, &items))?;
        let mut captured = self.captured.lock().unwrap_or_else(|e| e.into_inner());
        let done = items
            .iter()
            .zip(&digests)
            .map(|((key, ck), d)| {
                if let Some(d) = d {
                    captured.push((*ck, *d, key.clone()));
                }
                d.is_some()
            })
            .collect();
        Ok((done, stats.stale))
    }

    /// True for a dataset `STORE/NAME` (capture keys can be given and reused).
    fn in_store(&self) -> bool {
        self.store.is_some()
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
        let s = self.with(py, |w| w.commit().map(stats)).inspect_err(|_| {
            self.forget_uncommitted(py);
        })?;
        self.record_captured(py, &HashSet::new())?;
        Ok(s)
    }

    /// Commits and closes: `(samples, shards, bytes, raw_bytes)`.
    fn finish(&self, py: Python<'_>) -> PyResult<Stats> {
        self.owned()?;
        let w = detached(py, || {
            let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            guard.take()
        });
        let w = w.ok_or_else(|| bad_option("writer", "the writer is already finished"))?;
        let s = detached(py, || w.finish()).map(stats).py_err()?;
        self.record_captured(py, &HashSet::new())?;
        Ok(s)
    }

    /// Closes without committing what was appended since the last commit.
    /// In a forked copy, nothing: the writer is the parent's.
    fn abort(&self, py: Python<'_>) {
        if self.owned().is_err() {
            return;
        }
        let w = detached(py, || {
            let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            guard.take()
        });
        detached(py, move || drop(w));
    }
}

/// The capture key (FORMAT.md §11.7) of `tokens` (and the loss mask, where the dataset
/// stores one) under the capture config given as JSON.
#[pyfunction]
#[pyo3(signature = (config_json, tokens, loss_mask = None))]
pub fn capture_key<'py>(
    py: Python<'py>,
    config_json: &str,
    tokens: Vec<i64>,
    loss_mask: Option<Vec<i64>>,
) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
    let config: CaptureConfig = serde_json::from_str(config_json)
        .map_err(|e| bad_option("capture config", &e.to_string()))?;
    let key = config.key(&tokens, loss_mask.as_deref());
    Ok(pyo3::types::PyBytes::new(py, &key))
}

/// The schema given as JSON with the fields `spec` names stored quantized (`fp8` for every
/// hidden-state field, `fp8:NAME,NAME`), as JSON.
#[pyfunction]
pub fn quantize_schema(schema_json: &str, spec: &str) -> PyResult<String> {
    let mut schema: Schema =
        serde_json::from_str(schema_json).map_err(|e| bad_option("schema", &e.to_string()))?;
    let spec: hspack::format::QuantizeSpec = spec
        .parse()
        .map_err(|e: String| bad_option("quantize", &e))?;
    spec.apply(&mut schema)
        .map_err(|e| bad_option("quantize", &e))?;
    Ok(String::from_utf8(schema.canonical_json()).expect("JSON is UTF-8"))
}
