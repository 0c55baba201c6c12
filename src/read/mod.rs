//! Reading datasets: open in O(1) in the number of samples (the manifest only), map shards on
//! first use, read samples by ordinal or key, fields by name, rows by range.

pub mod dataset;
mod key_directory;
mod key_runs;
pub mod manifest_load;
pub mod quantized;
pub mod shard;
pub mod tensor;

pub use dataset::{Dataset, ReadOptions, Sample, SampleInfo, ShardKeys};
pub use manifest_load::load_manifest;
pub use quantized::QuantizedRows;
pub use shard::{CheckPolicy, Shard};
pub use tensor::{AlignedBytes, Buffer, Tensor};
