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

/// How many times its own bytes a source may make the reader build by repeating them (a
/// view with a stride of 0, a pickle's shared references) ...
pub const EXPANSION: u64 = 16;
/// ... or this many bytes, whichever is more.
pub const EXPANDED_BYTES: u64 = 256 << 20;

/// The bytes a reader may build from `stored` bytes by repeating them.
pub fn expansion_cap(stored: u64) -> u64 {
    stored.saturating_mul(EXPANSION).max(EXPANDED_BYTES)
}
