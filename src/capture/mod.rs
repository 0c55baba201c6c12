//! Capturing hidden states from a running model.
//!
//! The model-side hooks (Hugging Face, SGLang) live in the Python package `hspack.capture`.
//! This module holds what runs beside the model in Rust: with the `cuda` feature,
//! [`cuda::CudaWriter`] copies device tensors into a dataset asynchronously, ordered after the
//! producer's stream.

#[cfg(feature = "cuda")]
pub mod cuda;
