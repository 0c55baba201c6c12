//! One entry point for every supported source format, chosen by content.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use super::limits::Limits;
use super::mapped::{map_file, Backing};
use super::npy::{self, NpyFile};
use super::pickle::TensorLike;
use super::safetensors_file::SafetensorsFile;
use super::torch_file::{array_bytes, gunzip, is_gzip, is_zip, TorchFile};
use super::{torch_legacy, ConvertError};
use crate::format::DType;

/// Name and layout of a tensor in a source file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Flattened path (`hidden_states`, `aux_hidden_states.0`, ...); empty for a file that
    /// holds a single bare tensor or array.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Size of each dimension.
    pub shape: Vec<u64>,
}

/// A tensor of a dtype hspack does not store (complex, unsigned wider than 8 bits, ...): left
/// out of [`SourceFile::tensors`], refused when a field reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnsupportedInfo {
    /// Flattened path, as in [`TensorInfo::name`].
    pub name: String,
    /// The dtype as the file names it (`torch.uint16`, `C64`, ...).
    pub dtype: String,
    /// Size of each dimension.
    pub shape: Vec<u64>,
}

/// A value in a source file that holds data but is not a tensor (a str, a number, bytes):
/// what a dataset, which keeps tensors, does not hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueInfo {
    /// Flattened path, as in [`TensorInfo::name`].
    pub name: String,
    /// What it is, in words (`a str`, `an int`, `a metadata string`).
    pub kind: &'static str,
}

/// A tensor's data: C-contiguous, little-endian, borrowed from the file when possible.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceTensor<'a> {
    /// Flattened path, as in [`TensorInfo::name`].
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Size of each dimension.
    pub shape: Vec<u64>,
    /// The elements in C order, little-endian.
    pub bytes: Cow<'a, [u8]>,
}

/// The format a source file was recognised as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SourceFormat {
    /// `torch.save` output (zip or legacy; see [`TorchFile::format`]).
    Torch,
    /// `.safetensors`.
    Safetensors,
    /// `.npy`.
    Npy,
}

enum Inner {
    Torch(Box<TorchFile>),
    Safetensors(SafetensorsFile),
    Npy(NpyFile),
}

/// An open source file of any supported format.
pub struct SourceFile {
    path: PathBuf,
    gzipped: bool,
    inner: Inner,
}

impl std::fmt::Debug for SourceFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceFile")
            .field("path", &self.path)
            .field("format", &self.format())
            .field("gzipped", &self.gzipped)
            .finish()
    }
}

/// Opens a hidden-state dump, recognising the format by its content: zip or legacy
/// `torch.save` files, `.safetensors`, `.npy`, and gzip-compressed versions of these.
/// No pickle code is executed. The file must not be modified while it is open.
///
/// A gzip-compressed file is decompressed into memory, streaming, and at most to the size
/// given by [`gzip_limit`](super::torch_file::gzip_limit), which also bounds the memory
/// used. Its content is recognised from the first decompressed bytes by the same rule as
/// a plain file's, so content that is not a dump is refused after decompressing 512 bytes.
pub fn open_source(path: &Path) -> Result<SourceFile, ConvertError> {
    open_source_with(path, Limits::default())
}

/// [`open_source`] with explicit [`Limits`].
pub fn open_source_with(path: &Path, limits: Limits) -> Result<SourceFile, ConvertError> {
    let backing = map_file(path)?;
    let (backing, gzipped) = if is_gzip(&backing) {
        let inner = gunzip(&backing, path, limits.max_decompressed_bytes, |head| {
            sniff(head).is_some()
        })?;
        (Backing::from_vec(inner), true)
    } else {
        (backing, false)
    };
    let inner = from_backing(path, backing, limits)?;
    let file = SourceFile {
        path: path.to_path_buf(),
        gzipped,
        inner,
    };
    if let Some(t) = file.tensors().iter().find(|t| t.shape.len() > MAX_RANK) {
        return Err(ConvertError::DeclaredSizeTooLarge {
            file: path.to_path_buf(),
            what: format!("the rank of tensor `{}`", t.name),
            declared: t.shape.len() as u64,
            limit: MAX_RANK as u64,
        });
    }
    Ok(file)
}

/// The most dimensions a tensor of a dump may have: far more than any hidden state's, and few
/// enough that shapes cost nothing to compare.
const MAX_RANK: usize = 64;

/// What a file's first bytes say it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sniffed {
    /// A zip archive (`torch.save` since torch 1.6).
    TorchZip,
    /// The tar container of torch before 0.4 (refused with its own error).
    TorchTar,
    /// The legacy `torch.save` pickle stream.
    TorchLegacy,
    /// A `.npy` array.
    Npy,
    /// A `.safetensors` file.
    Safetensors,
}

/// Bytes [`sniff`] may look at; a longer input is recognised by this prefix alone.
pub(crate) const SNIFF_BYTES: usize = 512;

/// Recognises a format from the first [`SNIFF_BYTES`] bytes of a file or of its
/// decompressed content: the one rule for both.
pub(crate) fn sniff(bytes: &[u8]) -> Option<Sniffed> {
    let head = bytes.get(..bytes.len().min(SNIFF_BYTES)).unwrap_or(&[]);
    if is_zip(head) {
        Some(Sniffed::TorchZip)
    } else if torch_legacy::is_tar(head) {
        Some(Sniffed::TorchTar)
    } else if torch_legacy::has_magic(head) {
        Some(Sniffed::TorchLegacy)
    } else if head.starts_with(npy::MAGIC) {
        Some(Sniffed::Npy)
    } else if looks_like_safetensors(head) {
        Some(Sniffed::Safetensors)
    } else {
        None
    }
}

fn from_backing(path: &Path, backing: Backing, limits: Limits) -> Result<Inner, ConvertError> {
    match sniff(&backing) {
        Some(Sniffed::TorchZip | Sniffed::TorchTar | Sniffed::TorchLegacy) => {
            TorchFile::from_backing(path, backing, limits).map(|t| Inner::Torch(Box::new(t)))
        }
        Some(Sniffed::Npy) => NpyFile::from_backing(path, backing, limits).map(Inner::Npy),
        Some(Sniffed::Safetensors) => {
            SafetensorsFile::from_backing(path, backing, limits).map(Inner::Safetensors)
        }
        None => Err(ConvertError::UnknownFormat {
            file: path.to_path_buf(),
        }),
    }
}

/// A header length followed by `{` (the length itself is checked by the parser).
fn looks_like_safetensors(bytes: &[u8]) -> bool {
    bytes.get(8) == Some(&b'{')
}

impl SourceFile {
    /// The file this was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The recognised format.
    pub fn format(&self) -> SourceFormat {
        match self.inner {
            Inner::Torch(_) => SourceFormat::Torch,
            Inner::Safetensors(_) => SourceFormat::Safetensors,
            Inner::Npy(_) => SourceFormat::Npy,
        }
    }

    /// Whether the file was gzip-compressed.
    pub fn gzipped(&self) -> bool {
        self.gzipped
    }

    /// The torch file, when the source is one (for walking its full value tree).
    pub fn as_torch(&self) -> Option<&TorchFile> {
        match &self.inner {
            Inner::Torch(t) => Some(t),
            _ => None,
        }
    }

    /// Every tensor in the file. For torch files, tensors and numpy arrays anywhere in the
    /// value tree are listed under their flattened path; when two paths flatten to the same
    /// name the first is kept.
    pub fn tensors(&self) -> Vec<TensorInfo> {
        match &self.inner {
            Inner::Torch(t) => {
                let mut seen = std::collections::HashSet::new();
                t.tensors()
                    .into_iter()
                    .filter(|(name, _)| seen.insert(name.clone()))
                    .map(|(name, like)| TensorInfo {
                        name,
                        dtype: like.dtype(),
                        shape: like.shape().to_vec(),
                    })
                    .collect()
            }
            Inner::Safetensors(s) => s
                .header()
                .tensors
                .iter()
                .map(|t| TensorInfo {
                    name: t.name.clone(),
                    dtype: t.dtype,
                    shape: t.shape.clone(),
                })
                .collect(),
            Inner::Npy(n) => vec![TensorInfo {
                name: String::new(),
                dtype: n.header().dtype,
                shape: n.header().shape.clone(),
            }],
        }
    }

    /// Tensors of a dtype hspack does not store (named as in [`SourceFile::tensors`], which
    /// leaves them out). Reading one is an [`ConvertError::UnsupportedDType`] error; the rest
    /// of the file reads.
    pub fn unsupported(&self) -> Vec<UnsupportedInfo> {
        match &self.inner {
            Inner::Torch(t) => t.value().unsupported_tensors(),
            Inner::Safetensors(s) => {
                let h = s.header();
                let shapes = h.unsupported_shapes.iter();
                h.unsupported
                    .iter()
                    .zip(shapes)
                    .map(|((name, dtype), shape)| UnsupportedInfo {
                        name: name.clone(),
                        dtype: dtype.clone(),
                        shape: shape.clone(),
                    })
                    .collect()
            }
            Inner::Npy(_) => Vec::new(),
        }
    }

    /// The values that hold data but are not tensors (named as in [`SourceFile::tensors`]):
    /// a torch file's strs, numbers and bytes, a `.safetensors` file's `__metadata__` entries
    /// (but `format`, which says only which library wrote it). A dataset does not hold them.
    pub fn values(&self) -> Vec<ValueInfo> {
        match &self.inner {
            Inner::Torch(t) => t
                .value()
                .values()
                .into_iter()
                .map(|(name, kind)| ValueInfo { name, kind })
                .collect(),
            Inner::Safetensors(s) => s
                .header()
                .metadata
                .keys()
                .filter(|k| *k != "format")
                .map(|k| ValueInfo {
                    name: format!("__metadata__.{k}"),
                    kind: "a metadata string",
                })
                .collect(),
            Inner::Npy(_) => Vec::new(),
        }
    }

    /// The tensor called `name` (as listed by [`SourceFile::tensors`]) with its bytes.
    pub fn tensor(&self, name: &str) -> Result<SourceTensor<'_>, ConvertError> {
        let missing = || match self.unsupported().into_iter().find(|u| u.name == name) {
            Some(u) => ConvertError::UnsupportedDType {
                file: self.path.clone(),
                tensor: name.to_string(),
                dtype: u.dtype,
            },
            None => ConvertError::Missing {
                file: self.path.clone(),
                what: "tensor",
                key: name.to_string(),
            },
        };
        match &self.inner {
            Inner::Torch(t) => {
                let mut named = t.tensors().into_iter().filter(|(n, _)| n == name);
                let (_, like) = named.next().ok_or_else(missing)?;
                let others = named.count();
                if others > 0 {
                    return Err(ConvertError::AmbiguousName {
                        file: self.path.clone(),
                        name: name.to_string(),
                        count: others + 1,
                    });
                }
                let bytes = match like {
                    TensorLike::Tensor(r) => t.tensor_bytes_named(name, r)?,
                    TensorLike::NdArray(a) => array_bytes(&self.path, name, a, u64::MAX)?,
                };
                Ok(SourceTensor {
                    name: name.to_string(),
                    dtype: like.dtype(),
                    shape: like.shape().to_vec(),
                    bytes,
                })
            }
            Inner::Safetensors(s) => {
                let (info, bytes) = s.tensor_bytes(name).map_err(|e| match e {
                    ConvertError::Missing { .. } => missing(),
                    e => e,
                })?;
                Ok(SourceTensor {
                    name: name.to_string(),
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    bytes: Cow::Borrowed(bytes),
                })
            }
            Inner::Npy(n) => {
                if !name.is_empty() {
                    return Err(missing());
                }
                Ok(SourceTensor {
                    name: String::new(),
                    dtype: n.header().dtype,
                    shape: n.header().shape.clone(),
                    bytes: n.bytes()?,
                })
            }
        }
    }
}
