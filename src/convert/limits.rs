//! Bounds on what a source file may make the reader allocate.

/// Bounds applied while reading a source file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Largest decompressed size of a gzip-compressed file, in bytes.
    pub max_decompressed_bytes: u64,
    /// Largest tensor that is gathered into a new buffer (non-contiguous, byte-swapped or
    /// broadcast views), in bytes.
    pub max_tensor_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_decompressed_bytes: 64 << 30,
            max_tensor_bytes: 64 << 30,
        }
    }
}
