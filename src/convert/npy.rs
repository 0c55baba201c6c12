//! `.npy` arrays (format versions 1.0, 2.0 and 3.0).

use std::borrow::Cow;
use std::ops::Range;
use std::path::{Path, PathBuf};

use super::bytes::Cursor;
use super::limits::Limits;
use super::mapped::{map_file, Backing};
use super::pickle::NdArray;
use super::strided::{contiguous_strides, fortran_strides, materialize, View};
use super::ConvertError;
use crate::format::DType;

/// The magic string every `.npy` file starts with.
pub const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// A parsed `.npy` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpyHeader {
    /// Format major version (1, 2 or 3).
    pub version: u8,
    /// Element type.
    pub dtype: DType,
    /// Whether elements are stored big-endian.
    pub big_endian: bool,
    /// Whether the data is in Fortran (column-major) order.
    pub fortran_order: bool,
    /// Size of each dimension.
    pub shape: Vec<u64>,
    /// Byte range of the data within the file.
    pub data: Range<usize>,
}

/// Parses the header of a `.npy` file held in `bytes` and checks that the data fits.
pub fn parse(bytes: &[u8], file: &Path) -> Result<NpyHeader, ConvertError> {
    let mut cur = Cursor::new(bytes, 0, file);
    if cur.take(6, "npy magic")? != MAGIC {
        return Err(ConvertError::UnknownFormat {
            file: file.to_path_buf(),
        });
    }
    let version = cur.u8("npy version")?;
    let _minor = cur.u8("npy version")?;
    let start = cur.pos();
    let header_len = match version {
        1 => u64::from(cur.u16("npy header length")?),
        2 | 3 => u64::from(cur.u32("npy header length")?),
        v => {
            return Err(ConvertError::malformed(
                file,
                "npy header",
                6,
                format!("format version {v} is not 1, 2 or 3; re-save with numpy.save"),
            ))
        }
    };
    let n = cur.bounded_len(header_len, start, "npy header")?;
    let text_bytes = cur.take(n, "npy header")?;
    let text = std::str::from_utf8(text_bytes)
        .map_err(|_| ConvertError::malformed(file, "npy header", start, "not UTF-8"))?;
    let bad = |reason: &str| ConvertError::malformed(file, "npy header", start, reason.to_string());
    if text.contains("'descr': [") || text.contains("\"descr\": [") {
        return Err(ConvertError::UnsupportedArray {
            file: file.to_path_buf(),
            tensor: String::new(),
            reason: "structured (record) dtypes have no tensor equivalent".into(),
        });
    }
    let dict = parse_dict(text).ok_or_else(|| bad("not a Python dict literal"))?;
    let mut descr = None;
    let mut fortran = None;
    let mut shape = None;
    for (k, v) in dict {
        match (k.as_str(), v) {
            ("descr", Lit::Str(s)) => descr = Some(s),
            ("fortran_order", Lit::Bool(b)) => fortran = Some(b),
            ("shape", Lit::Tuple(t)) => shape = Some(t),
            _ => return Err(bad(&format!("unexpected key {k:?} or value type"))),
        }
    }
    let (Some(descr), Some(fortran_order), Some(shape)) = (descr, fortran, shape) else {
        return Err(bad("needs descr, fortran_order and shape"));
    };
    let (dtype, big) =
        super::pickle::numpy_descr(&descr).ok_or_else(|| ConvertError::UnsupportedDType {
            file: file.to_path_buf(),
            tensor: String::new(),
            dtype: descr.clone(),
        })?;
    let data_start = cur.pos();
    let nbytes = shape
        .iter()
        .try_fold(dtype.size() as u64, |acc, &d| acc.checked_mul(d))
        .unwrap_or(u64::MAX);
    let n = cur.bounded_len(nbytes, data_start, "npy data")?;
    Ok(NpyHeader {
        version,
        dtype,
        big_endian: big.unwrap_or(false) && dtype.size() > 1,
        fortran_order,
        shape,
        data: data_start..data_start + n,
    })
}

enum Lit {
    Str(String),
    Bool(bool),
    Tuple(Vec<u64>),
}

/// Parses the restricted dict literal numpy writes: `{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }`.
fn parse_dict(text: &str) -> Option<Vec<(String, Lit)>> {
    let mut s = text.trim().strip_prefix('{')?.trim_start();
    let mut out = Vec::new();
    loop {
        if let Some(rest) = s.strip_prefix('}') {
            return rest.trim().is_empty().then_some(out);
        }
        let (key, rest) = quoted(s)?;
        s = rest.trim_start().strip_prefix(':')?.trim_start();
        let (lit, rest) = if let Some(r) = s.strip_prefix("True") {
            (Lit::Bool(true), r)
        } else if let Some(r) = s.strip_prefix("False") {
            (Lit::Bool(false), r)
        } else if s.starts_with('\'') || s.starts_with('"') {
            let (v, r) = quoted(s)?;
            (Lit::Str(v), r)
        } else {
            let body = s.strip_prefix('(')?;
            let close = body.find(')')?;
            let dims = body
                .get(..close)?
                .split(',')
                .map(str::trim)
                .filter(|d| !d.is_empty())
                .map(|d| d.trim_end_matches('L').parse::<u64>().ok())
                .collect::<Option<Vec<u64>>>()?;
            (Lit::Tuple(dims), body.get(close + 1..)?)
        };
        out.push((key, lit));
        s = rest.trim_start();
        if let Some(r) = s.strip_prefix(',') {
            s = r.trim_start();
        } else if !s.starts_with('}') {
            return None;
        }
    }
}

fn quoted(s: &str) -> Option<(String, &str)> {
    let q = s.chars().next().filter(|&c| c == '\'' || c == '"')?;
    let body = s.get(1..)?;
    let end = body.find(q)?;
    Some((body.get(..end)?.to_string(), body.get(end + 1..)?))
}

/// An open `.npy` file.
pub struct NpyFile {
    path: PathBuf,
    backing: Backing,
    header: NpyHeader,
    limits: Limits,
}

impl std::fmt::Debug for NpyFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NpyFile")
            .field("path", &self.path)
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

impl NpyFile {
    /// Maps and parses a `.npy` file.
    pub fn open(path: &Path) -> Result<NpyFile, ConvertError> {
        NpyFile::from_backing(path, map_file(path)?, Limits::default())
    }

    /// Parses a `.npy` file already in memory; `file` names it in errors.
    pub fn from_bytes(
        bytes: Vec<u8>,
        file: &Path,
        limits: Limits,
    ) -> Result<NpyFile, ConvertError> {
        NpyFile::from_backing(file, Backing::from_vec(bytes), limits)
    }

    pub(crate) fn from_backing(
        path: &Path,
        backing: Backing,
        limits: Limits,
    ) -> Result<NpyFile, ConvertError> {
        let header = parse(&backing, path)?;
        Ok(NpyFile {
            path: path.to_path_buf(),
            backing,
            header,
            limits,
        })
    }

    /// The parsed header.
    pub fn header(&self) -> &NpyHeader {
        &self.header
    }

    /// The array as C-contiguous little-endian bytes (Fortran-ordered data is transposed
    /// into C order, big-endian data byte-swapped).
    pub fn bytes(&self) -> Result<Cow<'_, [u8]>, ConvertError> {
        let h = &self.header;
        let oob = |reason: String| ConvertError::TensorOutOfBounds {
            file: self.path.clone(),
            tensor: String::new(),
            reason,
        };
        let strides = if h.fortran_order {
            fortran_strides(&h.shape)
        } else {
            contiguous_strides(&h.shape)
        }
        .ok_or_else(|| oob(format!("shape {:?} overflows", h.shape)))?;
        let data = self.backing.get(h.data.clone()).unwrap_or(&[]);
        let view = View {
            elem: h.dtype.size(),
            shape: &h.shape,
            strides: &strides,
            offset: 0,
            swap: h.big_endian,
        };
        materialize(data, &view, self.limits.max_tensor_bytes).map_err(oob)
    }

    /// The array as an owned [`NdArray`] (copies the data).
    pub fn to_ndarray(&self) -> NdArray {
        let h = &self.header;
        NdArray {
            dtype: h.dtype,
            shape: h.shape.clone(),
            fortran_order: h.fortran_order,
            big_endian: h.big_endian,
            data: self.backing.get(h.data.clone()).unwrap_or(&[]).to_vec(),
        }
    }
}
