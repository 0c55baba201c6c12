//! Bytes ↔ structs for every structure of the format. No I/O here: decoders take `&[u8]`.
//!
//! `format-spec/FORMAT.md` is the normative description; this module is its code.

pub mod codec;
pub mod dtype;
pub mod eagle3;
pub mod error;
pub mod fp8;
pub mod index;
pub mod layout;
pub mod manifest;
pub mod quantize;
pub mod schema;
pub mod segment;
pub mod version;

pub use codec::{Codec, Elements};
pub use dtype::DType;
pub use error::FormatError;
pub use index::{Index, IndexBuilder};
pub use layout::*;
pub use manifest::{Manifest, ShardRecord, TableRecord};
pub use quantize::QuantizeSpec;
pub use schema::{CaptureInfo, CapturePoint, Field, QuantScheme, Quantized, Role, Schema};
