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
//! the destination are not copied again. A destination that is not such a merge (it holds
//! other samples, the sources' samples in another order, or other contents under a source's
//! key in the first sample of one of its shards or in its last) is refused before anything
//! is written.

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::io::Storage;
use crate::read::{Dataset, Sample, Tensor};
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
    if let Some(ds) = sources
        .iter()
        .find(|ds| super::same_place(ds.dir(), dst.root()))
    {
        return Err(refused(format!(
            "it is one of the datasets to merge ({}); nothing was written: merge into a new \
             folder",
            ds.dir().display()
        )));
    }
    for ds in sources {
        super::refuse_nested(ds.dir(), dst.root())?;
    }
    for ds in &sources[1..] {
        if ds.schema() != first.schema() {
            return Err(Error::SchemaMismatch {
                path: ds.dir().to_path_buf(),
                detail: format!(
                    "it cannot be merged with {}: {}; only datasets of one schema (fields, \
                     how they are stored, and capture metadata) merge: convert the odd one \
                     out to the others' schema first",
                    first.dir().display(),
                    describe_difference(
                        ds.schema(),
                        first.schema(),
                        ["in it", &format!("in {}", first.dir().display())]
                    )
                ),
            });
        }
    }
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, ds) in sources.iter().enumerate() {
        for part in ds.keys_by_shard() {
            for key in part.keys? {
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
    }
    let done = merged_so_far(sources, &dst, &options, &refused)?;
    let mut w = DatasetWriter::open_in(dst, first.schema().clone(), options)?;
    let mut report = MergeReport::default();
    let mut skip = done;
    for ds in sources {
        report
            .sources
            .push((ds.dir().display().to_string(), ds.len()));
        let resumed = skip.min(ds.len());
        skip -= resumed;
        let mut apart: Option<(usize, Arc<crate::read::Shard>)> = None;
        for ordinal in resumed..ds.len() {
            let (seq, local) = ds.locate(ordinal)?;
            if apart.as_ref().is_none_or(|(s, _)| *s != seq) {
                apart = Some((seq, ds.shard_apart(seq)?));
            }
            let shard = &apart.as_ref().expect("set above").1;
            let sample = ds
                .sample_of(shard, local)
                .expect("locate keeps local below the shard's count");
            let tensors = read_all(ds, &sample)?;
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

/// Every field of `sample` (of `ds`), in schema order.
fn read_all(ds: &Dataset, sample: &Sample<'_>) -> Result<Vec<Tensor>> {
    (0..ds.schema().fields.len())
        .map(|f| sample.read_field(f, None))
        .collect()
}

/// How many samples of the merge an interrupted run committed to `dst` (0 when it holds no
/// dataset): its samples must be the first of the sources' in order, key for key, and byte
/// for byte where checked (the first sample of each of its shards, and its last: a rerun does
/// not read again all it copied), else the destination is another dataset and the merge is
/// refused.
fn merged_so_far(
    sources: &[Dataset],
    dst: &Arc<dyn Storage>,
    options: &WriteOptions,
    refused: &dyn Fn(String) -> Error,
) -> Result<u64> {
    let given_id = options.dataset_id;
    let held = match Dataset::open_in(Arc::clone(dst), Default::default()) {
        Ok(d) => d,
        Err(Error::NotADataset { .. }) => return Ok(0),
        Err(e) => return Err(e),
    };
    // A merge's dataset has an id of its own (a new one, unless the options give it): one
    // with a source's is a copy of that source (whose first samples are the merge's too),
    // which the merge would append to.
    let id = held.manifest().dataset_id_bytes();
    if let Some(ds) = sources
        .iter()
        .find(|ds| ds.manifest().dataset_id_bytes() == id && given_id != Some(id))
    {
        return Err(refused(format!(
            "it holds a copy of {} (the same dataset id), not an interrupted merge of these \
             sources; nothing was written: merge into a new folder",
            ds.dir().display()
        )));
    }
    let mut wanted = sources
        .iter()
        .flat_map(|ds| (0..ds.len()).map(move |o| (ds, o)));
    let checked: std::collections::HashSet<u64> = (held.manifest().shards.iter())
        .map(|s| s.first_ordinal)
        .chain(held.len().checked_sub(1))
        .collect();
    for ordinal in 0..held.len() {
        let there = held.sample(ordinal)?;
        let not_ours = |what: String| {
            refused(format!(
                "it holds a dataset that is not an interrupted merge of these sources: its \
                 sample {ordinal} ({:?}) {what}; nothing was written: merge into a new folder",
                there.key()
            ))
        };
        let Some((ds, o)) = wanted.next() else {
            return Err(not_ours("is past the sources' last sample".into()));
        };
        let source = ds.sample(o)?;
        if source.key() != there.key() {
            return Err(not_ours(format!(
                "is where this merge puts {:?} of {}",
                source.key(),
                ds.dir().display()
            )));
        }
        if !checked.contains(&ordinal) {
            continue;
        }
        for (f, (a, b)) in (ds.schema().fields.iter())
            .zip(read_all(ds, &source)?.iter().zip(&read_all(&held, &there)?))
        {
            if a.bytes() != b.bytes() {
                return Err(not_ours(format!(
                    "differs in field {:?} from the sample of that key in {}",
                    f.name,
                    ds.dir().display()
                )));
            }
        }
    }
    // Resumed, the merge writes with the codec it began with: a rerun's other --codec would
    // apply to the samples left only, and the report would say nothing of it.
    if !held.manifest().shards.is_empty() {
        let shard = held.shard_apart(0)?;
        let index = shard.index();
        for e in (0..index.chunk_count()).map_while(|c| index.chunk(c)) {
            let Some(field) = held.schema().fields.get(usize::from(e.field)) else {
                continue;
            };
            let want = options.codec_of(field);
            if e.codec != want.code() {
                let began =
                    crate::format::Codec::from_code(e.codec).map_or("another", |c| c.name());
                return Err(refused(format!(
                    "it holds an interrupted merge written with codec {began} (field `{}`), not \
                     {}; nothing was written: give --codec {began} to resume it, or merge into \
                     a new folder",
                    field.name,
                    want.name()
                )));
            }
        }
    }
    Ok(held.len())
}
