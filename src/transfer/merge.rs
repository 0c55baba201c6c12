//! `hspack merge`: datasets written apart with one schema (the ranks of a job that wrote a
//! dataset each, captures of several machines) made one dataset, their samples in the order
//! given, each source's in its own order.
//!
//! A shard carries its dataset's id, its sequence number and its first ordinal in its header,
//! every chunk header, its index and its footer, so shards of one dataset cannot be listed
//! by another as they are: merging copies the samples. Every chunk is checked against its
//! hash as it is read; the destination is verified when the merge ends. Keys must be unique
//! across the sources, checked before anything is written. A merge that stops (killed, a
//! failed write) resumes when run again with the same sources: samples already committed to
//! the destination are not copied again.

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::io::Storage;
use crate::read::Dataset;
use crate::verify::{verify_dataset, VerifyOptions};
use crate::write::dataset_writer::describe_difference;
use crate::write::{DatasetWriter, WriteOptions};

/// What a merge did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct MergeReport {
    /// Samples of each source, in the order given.
    pub sources: Vec<(String, u64)>,
    /// Samples copied by this run (those committed by an earlier, interrupted run are not).
    pub samples_copied: u64,
    /// Samples in the destination.
    pub samples: u64,
    /// Shards in the destination.
    pub shards: u64,
    /// Bytes of the destination's shards.
    pub bytes: u64,
    /// The destination's digest, after it verified clean.
    pub digest: String,
}

/// Merges `sources` into the dataset in `dst` (a new one, or one an interrupted merge of the
/// same sources left), written with `options`; `progress` gets the bytes copied.
pub fn merge(
    sources: &[Dataset],
    dst: Arc<dyn Storage>,
    options: WriteOptions,
    progress: &dyn Fn(u64),
) -> Result<MergeReport> {
    let refused = |detail: String| Error::CopyRefused {
        path: dst.root().to_path_buf(),
        detail,
    };
    let Some(first) = sources.first() else {
        return Err(refused("no dataset to merge was given".into()));
    };
    for ds in &sources[1..] {
        if ds.schema() != first.schema() {
            return Err(Error::SchemaMismatch {
                path: ds.dir().to_path_buf(),
                detail: format!(
                    "it cannot be merged with {}: {}",
                    first.dir().display(),
                    describe_difference(first.schema(), ds.schema())
                ),
            });
        }
    }
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, ds) in sources.iter().enumerate() {
        for s in ds.samples() {
            let key = s?.key.to_string();
            if let Some(&other) = seen.get(&key) {
                return Err(refused(format!(
                    "key {key:?} is in both {} and {}; nothing was written: keys must be \
                     unique in the merged dataset",
                    sources[other].dir().display(),
                    ds.dir().display()
                )));
            }
            seen.insert(key, i);
        }
    }
    let mut w = DatasetWriter::open_in(dst, first.schema().clone(), options)?;
    let mut report = MergeReport::default();
    for ds in sources {
        report
            .sources
            .push((ds.dir().display().to_string(), ds.len()));
        for ordinal in 0..ds.len() {
            let sample = ds.sample(ordinal)?;
            if w.contains_key(sample.key()) {
                continue;
            }
            let tensors = (ds.schema().fields.iter())
                .map(|f| sample.read(&f.name, None))
                .collect::<Result<Vec<_>>>()?;
            let fields: Vec<(&str, &[u8])> = (ds.schema().fields.iter())
                .zip(&tensors)
                .map(|(f, t)| (f.name.as_str(), t.bytes()))
                .collect();
            w.append(sample.key(), &fields)?;
            report.samples_copied += 1;
            progress(sample.raw_bytes());
        }
    }
    let storage = Arc::clone(w.storage());
    let stats = w.finish()?;
    let merged = Dataset::open_in(storage, Default::default())?;
    let verified = verify_dataset(&merged, VerifyOptions::default(), &|_| {})?;
    if let Some(first) = verified.problems.into_iter().next() {
        return Err(first);
    }
    report.samples = stats.samples;
    report.shards = stats.shards;
    report.bytes = stats.bytes;
    report.digest = verified.digest;
    Ok(report)
}
