//! `.safetensors` files: an 8-byte little-endian header length, a JSON header, then data.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use super::limits::Limits;
use super::mapped::{map_file, Backing};
use super::ConvertError;
use crate::format::DType;

/// Largest JSON header accepted, in bytes.
pub const MAX_HEADER_BYTES: u64 = 100 << 20;

/// One tensor described by a safetensors header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SafeTensorInfo {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Size of each dimension.
    pub shape: Vec<u64>,
    /// Byte range of the data within the whole file.
    pub data: Range<usize>,
}

/// A parsed safetensors header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Tensors in data order.
    pub tensors: Vec<SafeTensorInfo>,
    /// The `__metadata__` string map.
    pub metadata: BTreeMap<String, String>,
    /// Tensors of a dtype hspack does not store, with that dtype's name: left out of
    /// `tensors`, refused only when read.
    pub unsupported: Vec<(String, String)>,
    /// The shape of each tensor of `unsupported`, in its order.
    pub unsupported_shapes: Vec<Vec<u64>>,
}

/// The safetensors dtype names hspack reads.
pub fn dtype_from_name(name: &str) -> Option<DType> {
    Some(match name {
        "BOOL" => DType::Bool,
        "U8" => DType::U8,
        "I8" => DType::I8,
        "I16" => DType::I16,
        "I32" => DType::I32,
        "I64" => DType::I64,
        "F16" => DType::F16,
        "BF16" => DType::BF16,
        "F32" => DType::F32,
        "F64" => DType::F64,
        "F8_E4M3" => DType::F8E4M3FN,
        "F8_E5M2" => DType::F8E5M2,
        _ => return None,
    })
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInfo {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: (u64, u64),
}

/// A header's entries in file order, each name once: serde_json's map keeps the last of two
/// entries of one name, which would leave a tensor out unsaid (the reference library refuses
/// such a file).
struct Entries(Vec<(String, serde_json::Value)>);

impl<'de> serde::Deserialize<'de> for Entries {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object of tensors")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Entries, A::Error> {
                let mut seen = std::collections::HashSet::new();
                let mut entries = Vec::new();
                while let Some((name, value)) = map.next_entry::<String, serde_json::Value>()? {
                    if !seen.insert(name.clone()) {
                        return Err(serde::de::Error::custom(format!(
                            "{name:?} is named twice (a tensor would be lost); the file is \
                             damaged or was not written by safetensors"
                        )));
                    }
                    entries.push((name, value));
                }
                Ok(Entries(entries))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// Parses the header of a safetensors file held in `bytes`, validating every tensor's
/// dtype, shape and data range (within the file, sized to match, non-overlapping).
pub fn parse(bytes: &[u8], file: &Path) -> Result<Header, ConvertError> {
    let len_bytes: [u8; 8] = bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| {
            ConvertError::truncated(file, "safetensors header length", 0, 8, bytes.len())
        })?;
    let n = u64::from_le_bytes(len_bytes);
    let available = bytes.len() as u64 - 8;
    if n > MAX_HEADER_BYTES || n > available {
        return Err(ConvertError::DeclaredSizeTooLarge {
            file: file.to_path_buf(),
            what: "safetensors JSON header".into(),
            declared: n,
            limit: MAX_HEADER_BYTES.min(available),
        });
    }
    let header_end = 8 + n as usize;
    let json = bytes.get(8..header_end).unwrap_or(&[]);
    let Entries(raw) = serde_json::from_slice(json)
        .map_err(|e| ConvertError::malformed(file, "safetensors header", 8, e.to_string()))?;
    let data_len = bytes.len() - header_end;
    let mut metadata = BTreeMap::new();
    let mut tensors = Vec::with_capacity(raw.len());
    let mut unsupported = Vec::new();
    let mut unsupported_shapes = Vec::new();
    for (name, v) in raw {
        if name == "__metadata__" {
            metadata = serde_json::from_value(v).map_err(|e| {
                ConvertError::malformed(file, "safetensors __metadata__", 8, e.to_string())
            })?;
            continue;
        }
        let info: RawInfo = serde_json::from_value(v).map_err(|e| {
            ConvertError::malformed(
                file,
                "safetensors header",
                8,
                format!("tensor {name:?}: {e}"),
            )
        })?;
        let (b, e) = info.data_offsets;
        let Some(dtype) = dtype_from_name(&info.dtype) else {
            if b > e || e > data_len as u64 {
                return Err(ConvertError::TensorOutOfBounds {
                    file: file.to_path_buf(),
                    tensor: name,
                    reason: format!("data_offsets [{b}, {e}] outside the {data_len} data bytes"),
                });
            }
            unsupported.push((name, info.dtype));
            unsupported_shapes.push(info.shape);
            continue;
        };
        let expected = info
            .shape
            .iter()
            .try_fold(dtype.size() as u64, |acc, &d| acc.checked_mul(d));
        let oob = |reason: String| ConvertError::TensorOutOfBounds {
            file: file.to_path_buf(),
            tensor: name.clone(),
            reason,
        };
        if b > e || e > data_len as u64 {
            return Err(oob(format!(
                "data_offsets [{b}, {e}] outside the {data_len} data bytes"
            )));
        }
        match expected {
            Some(n) if n == e - b => {}
            Some(n) => {
                return Err(oob(format!(
                    "shape {:?} of {dtype} needs {n} bytes but data_offsets span {}",
                    info.shape,
                    e - b
                )))
            }
            None => {
                return Err(oob(format!(
                    "the byte size of shape {:?} overflows",
                    info.shape
                )))
            }
        }
        tensors.push(SafeTensorInfo {
            name,
            dtype,
            shape: info.shape,
            data: (header_end + b as usize)..(header_end + e as usize),
        });
    }
    tensors.sort_by_key(|t| (t.data.start, t.data.end));
    for pair in tensors.windows(2) {
        if let [a, b] = pair {
            if b.data.start < a.data.end {
                return Err(ConvertError::TensorOutOfBounds {
                    file: file.to_path_buf(),
                    tensor: b.name.clone(),
                    reason: format!("its data overlaps tensor {:?}", a.name),
                });
            }
        }
    }
    Ok(Header {
        tensors,
        metadata,
        unsupported,
        unsupported_shapes,
    })
}

/// An open safetensors file.
pub struct SafetensorsFile {
    path: PathBuf,
    backing: Backing,
    header: Header,
}

impl std::fmt::Debug for SafetensorsFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsFile")
            .field("path", &self.path)
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

impl SafetensorsFile {
    /// Maps and parses a safetensors file.
    pub fn open(path: &Path) -> Result<SafetensorsFile, ConvertError> {
        SafetensorsFile::from_backing(path, map_file(path)?, Limits::default())
    }

    pub(crate) fn from_backing(
        path: &Path,
        backing: Backing,
        _limits: Limits,
    ) -> Result<SafetensorsFile, ConvertError> {
        let header = parse(&backing, path)?;
        Ok(SafetensorsFile {
            path: path.to_path_buf(),
            backing,
            header,
        })
    }

    /// The parsed header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The file this was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The bytes of tensor `name` (safetensors data is C-contiguous little-endian already).
    pub fn tensor_bytes(&self, name: &str) -> Result<(&SafeTensorInfo, &[u8]), ConvertError> {
        let info = self
            .header
            .tensors
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| ConvertError::Missing {
                file: self.path.clone(),
                what: "tensor",
                key: name.to_string(),
            })?;
        let bytes =
            self.backing
                .get(info.data.clone())
                .ok_or_else(|| ConvertError::TensorOutOfBounds {
                    file: self.path.clone(),
                    tensor: name.to_string(),
                    reason: "data range outside the file".into(),
                })?;
        Ok((info, bytes))
    }
}
