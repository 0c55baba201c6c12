//! Bytes ↔ structs for every structure of the format. No I/O here.

pub mod dtype;

pub use dtype::DType;
