//! Tensors read from a dataset: zero-copy views of the shard file, or owned decoded bytes.

use crate::format::DType;
pub use crate::io::{AlignedBytes, FileBytes};

/// The bytes behind a tensor.
#[derive(Debug, Clone)]
pub enum Buffer {
    /// Bytes of the shard file itself: zero-copy (a range of its mapping, for a local
    /// folder). Holding them keeps the mapping alive.
    File(FileBytes),
    /// Decoded or gathered bytes, 8-byte aligned.
    Owned(AlignedBytes),
}

impl Buffer {
    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Buffer::File(b) => b,
            Buffer::Owned(b) => b.as_bytes(),
        }
    }

    /// True when the bytes are the shard's mapping itself.
    pub fn is_mapped(&self) -> bool {
        matches!(self, Buffer::File(b) if b.is_mapped())
    }

    /// The shard file's bytes, when the tensor is a view of them.
    pub fn file_bytes(&self) -> Option<&FileBytes> {
        match self {
            Buffer::File(b) => Some(b),
            Buffer::Owned(_) => None,
        }
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

    /// The elements as f64 (exact for every dtype but i64 beyond 2^53); for the fp8 dtypes
    /// the values of their codes (a scale a model keeps beside them is not applied; an
    /// E4M3FN NaN code is NaN).
    pub fn to_f64(&self) -> Vec<f64> {
        let b = self.bytes();
        let v = match self.dtype {
            DType::Bool | DType::U8 => b.iter().map(|&x| x as f64).collect(),
            DType::I8 => b.iter().map(|&x| x as i8 as f64).collect(),
            DType::I16 => b
                .chunks_exact(2)
                .map(|c| i16::from_le_bytes([c[0], c[1]]) as f64)
                .collect(),
            DType::I32 => b
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")) as f64)
                .collect(),
            DType::I64 => b
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")) as f64)
                .collect(),
            DType::F16 => b
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64())
                .collect(),
            DType::BF16 => b
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64())
                .collect(),
            DType::F32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")) as f64)
                .collect(),
            DType::F64 => b
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect(),
            DType::F8E4M3FN => b
                .iter()
                .map(|&c| crate::format::fp8::decode_e4m3(c).map_or(f64::NAN, f64::from))
                .collect(),
            // E5M2 is the high byte of an IEEE half.
            DType::F8E5M2 => b
                .iter()
                .map(|&c| half::f16::from_bits(u16::from(c) << 8).to_f64())
                .collect(),
        };
        v
    }

    /// Rows.
    pub fn rows(&self) -> u64 {
        self.shape.first().copied().unwrap_or(0)
    }
}
