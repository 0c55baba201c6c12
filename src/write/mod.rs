//! Writing datasets: row blocks encoded and hashed on a worker pool, shards published
//! atomically, commits through the manifest, resume on reopen.

pub mod dataset_writer;
pub mod destination;
pub mod encode;
pub mod lane;
pub mod options;
pub mod sample;
pub mod samples_table;
pub(crate) mod segments;
pub mod shard_writer;
pub mod sink;

pub use dataset_writer::{reindex, reindex_in, DatasetWriter, ORDINAL_AT_COMMIT};
pub use lane::{Lanes, ShardLane};
pub use options::{WriteOptions, WriteStats, BLOCK_CHUNK_BYTES};
pub use sink::{Discard, SampleSink};
