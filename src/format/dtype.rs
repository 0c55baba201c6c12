//! Element types a field may hold.

use serde::{Deserialize, Serialize};

/// The element type of a field. The numeric code is what the format stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum DType {
    /// One byte, 0 or 1.
    Bool,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 8-bit integer.
    I8,
    /// Signed 16-bit integer.
    I16,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// IEEE 754 half precision.
    F16,
    /// bfloat16: the high half of an f32.
    BF16,
    /// IEEE 754 single precision.
    F32,
    /// IEEE 754 double precision.
    F64,
    /// 8-bit float, 4 exponent bits, 3 mantissa bits, finite only (OCP FP8 E4M3FN).
    F8E4M3FN,
    /// 8-bit float, 5 exponent bits, 2 mantissa bits (OCP FP8 E5M2).
    F8E5M2,
}

impl DType {
    /// The integers of little-endian elements of this dtype; `None` for a dtype that is not
    /// an integer or bool, or bytes that are not whole elements.
    pub fn ints(self, bytes: &[u8]) -> Option<Vec<i64>> {
        let n = self.size();
        if !bytes.len().is_multiple_of(n) {
            return None;
        }
        let conv = |c: &[u8]| -> Option<i64> {
            Some(match self {
                DType::I64 => i64::from_le_bytes(c.try_into().ok()?),
                DType::I32 => i32::from_le_bytes(c.try_into().ok()?) as i64,
                DType::I16 => i16::from_le_bytes(c.try_into().ok()?) as i64,
                DType::I8 => c[0] as i8 as i64,
                DType::U8 | DType::Bool => c[0] as i64,
                _ => return None,
            })
        };
        bytes.chunks_exact(n).map(conv).collect()
    }

    /// Every dtype, in code order.
    pub const ALL: [DType; 12] = [
        DType::Bool,
        DType::U8,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::F8E4M3FN,
        DType::F8E5M2,
    ];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::Bool | DType::U8 | DType::I8 | DType::F8E4M3FN | DType::F8E5M2 => 1,
            DType::I16 | DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    /// The code stored in the format.
    pub const fn code(self) -> u8 {
        match self {
            DType::Bool => 1,
            DType::U8 => 2,
            DType::I8 => 3,
            DType::I16 => 4,
            DType::I32 => 5,
            DType::I64 => 6,
            DType::F16 => 7,
            DType::BF16 => 8,
            DType::F32 => 9,
            DType::F64 => 10,
            DType::F8E4M3FN => 11,
            DType::F8E5M2 => 12,
        }
    }

    /// The dtype for a stored code, if the code is known.
    pub fn from_code(code: u8) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.code() == code)
    }

    /// The name used in schemas and on the command line (`bf16`, `f8e4m3fn`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "u8",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F8E4M3FN => "f8e4m3fn",
            DType::F8E5M2 => "f8e5m2",
        }
    }

    /// The dtype with this name, if any.
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_code(d.code()), Some(d));
            assert_eq!(DType::from_name(d.name()), Some(d));
        }
        assert_eq!(DType::from_code(0), None);
        assert_eq!(DType::from_code(13), None);
    }
}
