//! hspack: store and move LLM hidden states.
//!
//! A dataset is a folder: a `manifest.json` (the root of trust), shard files of checksummed
//! chunks with an index at the end, and a `samples.parquet` table. [`write::DatasetWriter`]
//! writes one, [`read::Dataset`] reads it, [`verify`] checks every byte.
#![deny(missing_docs)]
#![deny(unsafe_code)]

#[cfg(target_endian = "big")]
compile_error!("hspack maps little-endian structures directly; big-endian hosts are not supported");

pub mod capture;
pub mod compare;
pub mod convert;
pub mod error;
pub mod failpoint;
pub mod format;
pub mod io;
pub mod parallel;
mod per_process;
pub mod read;
pub mod store;
pub mod synth;
pub mod transfer;
pub mod verify;
pub mod write;

pub use error::{Error, Result};
pub use format::{CaptureInfo, CapturePoint, Codec, DType, Field, Role, Schema};
pub use read::{CheckPolicy, Dataset, ReadOptions, Sample, Tensor};
pub use write::{DatasetWriter, WriteOptions};

/// The README's Rust examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
