//! hspack: store and move LLM hidden states.
#![deny(missing_docs)]

#[cfg(target_endian = "big")]
compile_error!("hspack maps little-endian structures directly; big-endian hosts are not supported");

pub mod convert;
pub mod format;
