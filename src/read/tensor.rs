//! Tensors read from a dataset: zero-copy views of the mapping, or owned decoded bytes.

use std::ops::Range;
use std::sync::Arc;

use memmap2::Mmap;

use crate::format::DType;

/// The bytes behind a tensor.
#[derive(Debug, Clone)]
pub enum Buffer {
    /// A range of a mapped shard: zero-copy. The `Arc` keeps the mapping alive.
    Mapped {
        /// The mapping.
        map: Arc<Mmap>,
        /// Byte range within it.
        range: Range<usize>,
    },
    /// Decoded or gathered bytes, 8-byte aligned.
    Owned(AlignedBytes),
}

impl Buffer {
    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Buffer::Mapped { map, range } => &map[range.clone()],
            Buffer::Owned(b) => b.as_bytes(),
        }
    }

    /// True when the bytes are the mapping itself.
    pub fn is_mapped(&self) -> bool {
        matches!(self, Buffer::Mapped { .. })
    }
}

/// Bytes in 8-byte aligned storage, so every dtype can be viewed in place.
#[derive(Debug, Clone, Default)]
pub struct AlignedBytes {
    words: Vec<u64>,
    len: usize,
}

impl AlignedBytes {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> Self {
        AlignedBytes {
            words: vec![0; len.div_ceil(8)],
            len,
        }
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }

    /// The bytes, writable.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }
}

/// A tensor: `shape[0]` rows of one field.
#[derive(Debug, Clone)]
pub struct Tensor {
    /// Element type.
    pub dtype: DType,
    /// Rows, then the row shape.
    pub shape: Vec<u64>,
    /// Little-endian, C-order bytes.
    pub data: Buffer,
}

impl Tensor {
    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        self.data.as_bytes()
    }

    /// The elements as `T`, in place, when `T` has the dtype's size and the bytes are aligned
    /// for it (always true for mapped uncompressed chunks and owned buffers).
    pub fn as_slice<T: bytemuck::Pod>(&self) -> Option<&[T]> {
        if std::mem::size_of::<T>() != self.dtype.size() {
            return None;
        }
        bytemuck::try_cast_slice(self.bytes()).ok()
    }

    /// The elements as bf16, in place.
    pub fn as_bf16(&self) -> Option<&[half::bf16]> {
        (self.dtype == DType::BF16)
            .then(|| self.as_slice())
            .flatten()
    }

    /// Rows.
    pub fn rows(&self) -> u64 {
        self.shape.first().copied().unwrap_or(0)
    }
}
