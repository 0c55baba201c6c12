//! Reading hidden-state dumps written by other tools, without executing pickle code.
//!
//! [`open_source`] recognises a file by its content and lists its tensors by name:
//!
//! - `torch.save` files, both the zip format (torch >= 1.6) and the legacy pickle stream,
//!   optionally gzip-compressed (`.pt.gz`, `.ckpt.gz`); see [`load_torch`];
//! - `.safetensors` files; see [`SafetensorsFile`];
//! - `.npy` arrays; see [`NpyFile`].
//!
//! Pickles are decoded by [`pickle`], a machine that refuses every Python global outside a
//! small allowlist of tensor constructors and never calls anything. Tensor bytes are
//! borrowed from a memory map where the layout allows, and bounds-checked everywhere.
//!
//! [`run`] converts a tree of dumps into a dataset: [`units`] finds and groups the files,
//! [`layout`] and [`layouts`] map their tensors to fields, [`prepare`] decodes them on worker
//! threads, `lanes` writes them into shards on several threads and [`job`] commits,
//! resumes, verifies and deletes sources; [`report`] says what a run did.

mod bytes;
mod error;
mod groups;
pub mod job;
pub mod keys;
mod lanes;
pub mod layout;
pub mod layouts;
mod limits;
mod mapped;
pub mod npy;
pub mod pickle;
pub mod prepare;
pub mod report;
pub mod safetensors_file;
mod source;
pub mod spec;
mod strided;
pub mod torch_file;
pub mod torch_legacy;
pub mod torch_zip;
pub mod unit_error;
pub mod units;

pub use error::ConvertError;
pub use job::{run, RunError};
pub use layout::{FieldSpec, LayoutOptions, Op, Preset};
pub use limits::Limits;
pub use npy::NpyFile;
pub use pickle::{TensorRef, Value};
pub use prepare::{SplitBy, Trim};
pub use report::{BadFile, Progress, Report, REPORT_FILE};
pub use safetensors_file::SafetensorsFile;
pub use source::{
    open_source, open_source_with, SourceFile, SourceFormat, SourceTensor, TensorInfo,
    UnsupportedInfo, ValueInfo,
};
pub use spec::{ConvertSpec, Mapping, SpecError};
pub use torch_file::{load_torch, load_torch_with, TorchFile, TorchFormat};
pub use unit_error::UnitError;
