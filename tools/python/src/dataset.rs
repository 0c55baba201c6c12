//! `Dataset`: an open dataset. Every read releases the GIL.

use crate::detach::detached;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use hspack::io::cache::{CacheOptions, DEFAULT_MAX_BYTES};
use hspack::{CheckPolicy, ReadOptions};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::borrowed::ByteView;
use crate::errors::{bad_option, IntoPy};
use crate::tensor_buffer::TensorBuffer;

/// Parses a check policy name.
pub fn check_policy(name: &str) -> PyResult<CheckPolicy> {
    match name {
        "once" => Ok(CheckPolicy::Once),
        "always" => Ok(CheckPolicy::Always),
        "never" => Ok(CheckPolicy::Never),
        _ => Err(bad_option(
            "check",
            "must be \"once\", \"always\" or \"never\"",
        )),
    }
}

/// Parses a readahead mode name: `"load"` is true.
pub fn readahead_mode(name: &str) -> PyResult<bool> {
    match name {
        "hint" => Ok(false),
        "load" => Ok(true),
        _ => Err(bad_option("readahead", "must be \"hint\" or \"load\"")),
    }
}

fn row_range(rows: Option<(u64, u64)>) -> Option<Range<u64>> {
    rows.map(|(a, b)| a..b)
}

/// An open dataset (the native half of `hspack.Dataset`).
#[pyclass(module = "hspack._hspack", frozen)]
pub struct Dataset {
    inner: Arc<hspack::Dataset>,
    /// `readahead="load"`: see [`hspack::Sample::prefetch`].
    load: AtomicBool,
    /// Whether the zero-copy tensors it reads may go to another process as file ranges
    /// (`origin::register`); a torch dataset with `transfer="copy"` says no.
    sends_ranges: AtomicBool,
}

impl Dataset {
    fn field_numbers(&self, fields: Option<Vec<String>>) -> PyResult<Vec<usize>> {
        match fields {
            None => Ok((0..self.inner.schema().fields.len()).collect()),
            Some(names) => names
                .iter()
                .map(|n| self.inner.field_index(n).py_err())
                .collect(),
        }
    }

    /// `read` on sample `ordinal`, the GIL released, after asking the storage for fields
    /// `numbers` ahead; what that kept (object storage) is let go after, not kept past the
    /// sample.
    fn with_sample<T: Send>(
        &self,
        py: Python<'_>,
        ordinal: u64,
        numbers: &[usize],
        read: impl FnOnce(&hspack::Sample<'_>) -> hspack::Result<T> + Send,
    ) -> PyResult<T> {
        let load = self.load.load(Ordering::Relaxed);
        detached(py, || {
            let s = self.inner.sample(ordinal)?;
            s.prefetch(numbers, load)?;
            let got = read(&s);
            s.shard().forget_ahead();
            got
        })
        .py_err()
    }
}

#[pymethods]
impl Dataset {
    /// Opens the dataset in folder `path`; reads the manifest only. `checked_memo`: a folder
    /// shared by processes that should hash each chunk once in all (`check="once"`).
    /// `readahead`: `"hint"` or `"load"` (see [`hspack::Sample::prefetch`]). `cache_dir`: a
    /// folder that keeps the blocks read from object storage, shared by processes given the
    /// same folder; `cache_bytes` bounds it (default [`DEFAULT_MAX_BYTES`]). `mapped_shards`:
    /// how many shards stay mapped (see [`ReadOptions::mapped_shards`]), checked by the
    /// Python class.
    #[new]
    #[pyo3(signature = (path, check = "once", checked_memo = None, readahead = "hint", cache_dir = None, cache_bytes = None, mapped_shards = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: std::path::PathBuf,
        check: &str,
        checked_memo: Option<std::path::PathBuf>,
        readahead: &str,
        cache_dir: Option<std::path::PathBuf>,
        cache_bytes: Option<Bound<'_, PyAny>>,
        mapped_shards: Option<usize>,
    ) -> PyResult<Self> {
        let load = readahead_mode(readahead)?;
        // Said of the option (pyo3's own refusal was a bare OverflowError).
        let cache_bytes = cache_bytes
            .map(|b| {
                b.extract::<u64>().map_err(|_| {
                    bad_option(
                        "cache_bytes",
                        &format!("{b}: must be a count of bytes, 0 or more (0 keeps nothing)"),
                    )
                })
            })
            .transpose()?;
        let cache = match (cache_dir, cache_bytes) {
            (Some(dir), bytes) => Some(CacheOptions {
                dir,
                max_bytes: bytes.unwrap_or(DEFAULT_MAX_BYTES),
            }),
            (None, None) => None,
            (None, Some(_)) => {
                return Err(bad_option(
                    "cache_bytes",
                    "bounds the cache in cache_dir: give cache_dir too",
                ))
            }
        };
        let options = ReadOptions {
            check: check_policy(check)?,
            checked_memo,
            cache,
            mapped_shards,
        };
        let inner = detached(py, || hspack::Dataset::open_with(&path, options)).py_err()?;
        Ok(Dataset {
            inner: Arc::new(inner),
            load: AtomicBool::new(load),
            sends_ranges: AtomicBool::new(true),
        })
    }

    /// The block cache's counters in this process (`hits`, `misses`, `fetches`,
    /// `fetched_bytes`, `served_bytes`, `passed_bytes`, `damaged`, `evicted`,
    /// `failed_writes`), or None without a cache.
    fn cache_stats(&self) -> Option<std::collections::BTreeMap<&'static str, u64>> {
        let s = self.inner.cache()?.stats();
        Some(
            [
                ("hits", s.hits),
                ("misses", s.misses),
                ("fetches", s.fetches),
                ("fetched_bytes", s.fetched_bytes),
                ("served_bytes", s.served_bytes),
                ("passed_bytes", s.passed_bytes),
                ("damaged", s.damaged),
                ("evicted", s.evicted),
                ("failed_writes", s.failed_writes),
            ]
            .into(),
        )
    }

    fn __len__(&self) -> usize {
        self.inner.len() as usize
    }

    /// Whether the zero-copy tensors read from now on may be sent to another process as file
    /// ranges (`hspack.torch.transfer`); the default is yes.
    fn set_sends_ranges(&self, yes: bool) {
        self.sends_ranges.store(yes, Ordering::Relaxed);
    }

    /// Sets the readahead mode: `"hint"` or `"load"` (see [`hspack::Sample::prefetch`]).
    fn set_readahead(&self, mode: &str) -> PyResult<()> {
        self.load.store(readahead_mode(mode)?, Ordering::Relaxed);
        Ok(())
    }

    /// The schema (fields and capture) as JSON.
    fn schema_json(&self) -> String {
        String::from_utf8_lossy(&self.inner.schema().canonical_json()).into_owned()
    }

    /// The manifest as JSON.
    fn manifest_json(&self) -> String {
        String::from_utf8_lossy(self.inner.manifest_bytes()).into_owned()
    }

    /// Every shard's manifest entry, in order, as JSON (from the segments, in manifest
    /// version 4).
    fn shards_json(&self) -> String {
        serde_json::to_string(&self.inner.manifest().shards).unwrap_or_default()
    }

    /// Where the samples table's files are, in ordinal order: paths or URLs.
    fn table_files(&self) -> Vec<String> {
        let storage = self.inner.storage();
        (self.inner.manifest().table_files().iter())
            .map(|t| storage.path(&t.file).to_string_lossy().into_owned())
            .collect()
    }

    /// `(key, rows, loss_rows or None)` of sample `ordinal`.
    fn info(&self, py: Python<'_>, ordinal: u64) -> PyResult<(String, u64, Option<u64>)> {
        detached(py, || {
            let s = self.inner.sample(ordinal)?;
            Ok((s.key().to_string(), s.rows(), s.loss_rows()))
        })
        .py_err()
    }

    /// The ordinal of the sample with `key`, or None.
    fn find(&self, py: Python<'_>, key: &str) -> PyResult<Option<u64>> {
        detached(py, || Ok(self.inner.find(key)?.map(|s| s.ordinal()))).py_err()
    }

    /// Keys in ordinal order; raises naming the first shard that cannot be opened.
    fn keys(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        detached(py, || {
            let mut keys = Vec::with_capacity(claimed(self.inner.len()));
            for part in self.inner.keys_by_shard() {
                keys.extend(part.keys?);
            }
            Ok(keys)
        })
        .py_err()
    }

    /// Rows and loss rows (u64::MAX when unknown) of every sample, from the shard indexes,
    /// as little-endian u64 bytes: `2 * len` values, rows first.
    fn lengths<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let bytes = detached(py, || {
            let n = claimed(self.inner.len());
            let mut rows = Vec::with_capacity(16 * n);
            let mut loss = Vec::with_capacity(8 * n);
            // Shard by shard, as `keys`: no data is read, and no shard stays mapped for it.
            for seq in 0..self.inner.manifest().shards.len() {
                let shard = self.inner.shard_apart(seq)?;
                let index = shard.index();
                for entry in (0..index.sample_count()).filter_map(|i| index.sample(i)) {
                    rows.extend_from_slice(&entry.rows.to_le_bytes());
                    loss.extend_from_slice(&entry.loss_rows.to_le_bytes());
                }
            }
            rows.extend_from_slice(&loss);
            Ok(rows)
        })
        .py_err()?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Reads `fields` (all when None) of sample `ordinal`, rows `rows` (all when None):
    /// `[(name, TensorBuffer)]`, zero-copy where a field's rows lie in one uncompressed chunk.
    #[pyo3(signature = (ordinal, fields = None, rows = None))]
    fn read(
        &self,
        py: Python<'_>,
        ordinal: u64,
        fields: Option<Vec<String>>,
        rows: Option<(u64, u64)>,
    ) -> PyResult<Vec<(String, TensorBuffer)>> {
        let numbers = self.field_numbers(fields)?;
        let tensors = self.with_sample(py, ordinal, &numbers, |s| {
            let tensors = (numbers.iter())
                .map(|&f| s.read_field(f, row_range(rows)))
                .collect::<hspack::Result<Vec<_>>>()?;
            let mapped = tensors.iter().find_map(|t| t.data.file_bytes());
            if let Some(mapped) = mapped.filter(|_| self.sends_ranges.load(Ordering::Relaxed)) {
                crate::origin::register(mapped, s.shard().path());
            }
            Ok(tensors)
        })?;
        let schema = self.inner.schema();
        Ok(numbers
            .iter()
            .zip(tensors)
            .map(|(&f, t)| (schema.fields[f].name.clone(), TensorBuffer::new(t)))
            .collect())
    }

    /// Rows `rows` (all when None) of quantized field `field` of sample `ordinal` as stored:
    /// `(codes, scales, group)`, codes one E4M3FN byte a value, scales little-endian f32,
    /// one per `group` values.
    #[pyo3(signature = (ordinal, field, rows = None))]
    fn read_quantized<'py>(
        &self,
        py: Python<'py>,
        ordinal: u64,
        field: String,
        rows: Option<(u64, u64)>,
    ) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>, u64)> {
        let f = self.field_numbers(Some(vec![field]))?[0];
        let q = detached(py, || {
            self.inner
                .sample(ordinal)?
                .read_quantized(f, row_range(rows))
        })
        .py_err()?;
        let scales: Vec<u8> = q.scales.iter().flat_map(|s| s.to_le_bytes()).collect();
        Ok((
            PyBytes::new(py, &q.codes),
            PyBytes::new(py, &scales),
            q.group,
        ))
    }

    /// Copies rows `rows` of `fields` of sample `ordinal` into `out`, concatenated along the
    /// last dimension: row r of `out` is row r of every field, in the order given. `out` must
    /// be a writable C-contiguous byte buffer of exactly `rows * sum(row bytes)` bytes. One
    /// copy from the mapping for uncompressed chunks; the GIL is released.
    fn read_concat_into(
        &self,
        py: Python<'_>,
        ordinal: u64,
        fields: Vec<String>,
        rows: (u64, u64),
        out: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let numbers = self.field_numbers(Some(fields))?;
        let mut view = ByteView::new(out, "out")?;
        let out = view.as_mut_slice("out")?;
        self.with_sample(py, ordinal, &numbers, |s| {
            s.read_concat_into(&numbers, rows.0..rows.1, out)
        })
    }

    /// Rows `rows` of `fields` side by side, `[rows, elements]`, in a buffer reused from
    /// earlier ones this process dropped where one fits: the EAGLE-3 auxiliary concatenation.
    fn read_concat(
        &self,
        py: Python<'_>,
        ordinal: u64,
        fields: Vec<String>,
        rows: (u64, u64),
    ) -> PyResult<TensorBuffer> {
        let numbers = self.field_numbers(Some(fields))?;
        let t = self.with_sample(py, ordinal, &numbers, |s| {
            s.read_concat(&numbers, rows.0..rows.1)
        })?;
        Ok(TensorBuffer::new(t))
    }

    /// `(address, length)` of shard `seq`'s mapping, mapping it if needed: lets tests check
    /// that a tensor's data lies inside the mapped file.
    fn mapping_range(&self, py: Python<'_>, seq: usize) -> PyResult<(usize, usize)> {
        if seq >= self.inner.manifest().shards.len() {
            return Err(bad_option("seq", "no such shard"));
        }
        detached(py, || {
            let shard = self.inner.shard(seq)?;
            let whole = shard.file().whole();
            Ok(whole.map_or((0, 0), |b| (b.as_ptr() as usize, b.len())))
        })
        .py_err()
    }
}

/// Room to reserve for `samples` entries, as the manifest counts them: a crafted manifest may
/// claim any number, so no more than a million up front (the vectors grow past it as read).
fn claimed(samples: u64) -> usize {
    samples.min(1 << 20) as usize
}
