//! Shard lanes: shards of one dataset written at the same time, on any threads, and committed
//! in the order the caller chooses.
//!
//! Writes into one file do not scale with threads; writes into several files do. A lane is a
//! shard that does not know its place yet: it is written into a temp file, and
//! [`DatasetWriter::commit_lane`](super::DatasetWriter::commit_lane) gives it the next
//! sequence number and ordinals, writes its headers, index and footer, and commits it. A lane
//! dropped before its commit deletes its temp file; one a crash leaves is removed when the
//! dataset is next opened for writing, like any temp file.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::format::manifest::lane_file_name;
use crate::format::Schema;
use crate::io::{temp_name, Storage};

use super::options::WriteOptions;
use super::sample;
use super::shard_writer::ShardWriter;

/// Opens lanes for one dataset writer; cheap to clone, shareable between threads.
#[derive(Debug, Clone)]
pub struct Lanes {
    pub(super) storage: Arc<dyn Storage>,
    pub(super) dataset_id: [u8; 16],
    pub(super) schema: Arc<Schema>,
    pub(super) options: WriteOptions,
    pub(super) opened: Arc<AtomicU64>,
    /// The writer's tag, so lanes of writers on other hosts sharing the folder never share
    /// a temp name.
    pub(super) tag: String,
}

impl Lanes {
    /// Starts a new lane: an empty shard in a temp file of the dataset folder.
    pub fn open(&self) -> Result<ShardLane> {
        let n = self.opened.fetch_add(1, Ordering::Relaxed);
        let temp = temp_name(&lane_file_name(&self.tag, n));
        let shard = ShardWriter::create(
            &*self.storage,
            &temp,
            self.dataset_id,
            self.schema.hash(),
            self.options.payload_align_log2(),
        )?;
        Ok(ShardLane {
            dataset_id: self.dataset_id,
            schema: Arc::clone(&self.schema),
            options: self.options.clone(),
            shard: Some(shard),
            keys: HashSet::new(),
        })
    }
}

/// A shard being written apart from its dataset writer; see [`Lanes`].
pub struct ShardLane {
    pub(super) dataset_id: [u8; 16],
    schema: Arc<Schema>,
    options: WriteOptions,
    pub(super) shard: Option<ShardWriter>,
    pub(super) keys: HashSet<String>,
}

impl std::fmt::Debug for ShardLane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardLane")
            .field("samples", &self.sample_count())
            .field("bytes", &self.len())
            .finish()
    }
}

impl ShardLane {
    fn shard(&mut self) -> &mut ShardWriter {
        self.shard
            .as_mut()
            .expect("a lane holds its shard until committed or dropped")
    }

    /// Appends a sample, as [`DatasetWriter::append`](super::DatasetWriter::append) does;
    /// returns its position in the lane. A key given twice to one lane is refused here; a key
    /// the dataset already holds is refused when the lane is committed.
    pub fn append(&mut self, key: &str, fields: &[(&str, &[u8])]) -> Result<u64> {
        if self.keys.contains(key) {
            return Err(Error::DuplicateKey {
                key: key.to_string(),
            });
        }
        if let Some(cause) = self.shard.as_ref().and_then(|s| s.unfit()) {
            return Err(Error::Io {
                path: "lane".into(),
                op: "append",
                source: std::io::Error::other(format!(
                    "a write into this lane's shard failed ({cause}), so it takes no more \
                     samples and is not committed: drop it and append its samples to a new lane"
                )),
            });
        }
        let schema = Arc::clone(&self.schema);
        let checked = sample::check(&schema, key, fields, self.options.prequantized)?;
        let position = self.sample_count();
        let options = self.options.clone();
        sample::write(self.shard(), &schema, &options, key, &checked)?;
        self.keys.insert(key.to_string());
        Ok(position)
    }

    /// Samples appended.
    pub fn sample_count(&self) -> u64 {
        self.shard.as_ref().map_or(0, |s| s.sample_count())
    }

    /// Bytes written so far.
    pub fn len(&self) -> u64 {
        self.shard.as_ref().map_or(0, |s| s.len())
    }

    /// True when no sample was appended.
    pub fn is_empty(&self) -> bool {
        self.sample_count() == 0
    }

    /// True when `key` was appended to this lane.
    pub fn contains_key(&self, key: &str) -> bool {
        self.keys.contains(key)
    }

    /// Flushes the payloads to the disk now, on this thread, so that the commit's fsync has
    /// little left to do.
    pub fn sync_data(&mut self) -> Result<()> {
        match self.shard.as_mut() {
            Some(s) => s.sync_data(),
            None => Ok(()),
        }
    }
}

impl Drop for ShardLane {
    fn drop(&mut self) {
        if let Some(shard) = self.shard.take() {
            shard.abandon();
        }
    }
}
