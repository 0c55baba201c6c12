//! `torch.save` files of either format, optionally gzip-compressed.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::limits::Limits;
use super::mapped::{map_file, Backing};
use super::pickle::{self, NdArray, StorageRef, TensorLike, TensorRef, Value};
use super::source::{sniff, Sniffed, SNIFF_BYTES};
use super::strided::{contiguous_strides, fortran_strides, materialize, View};
use super::torch_legacy::LegacyFile;
use super::torch_zip::{Archive, ByteOrder};
use super::ConvertError;

/// Which container a torch file used.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TorchFormat {
    /// The zip format of torch >= 1.6.
    Zip {
        /// Folder name inside the archive.
        prefix: String,
        /// The `version` record.
        version: Option<String>,
        /// The `.format_version` record.
        format_version: Option<String>,
        /// The `.storage_alignment` record.
        storage_alignment: Option<String>,
    },
    /// The legacy pickle stream.
    Legacy,
}

/// A loaded `torch.save` file: its decoded value tree and access to tensor bytes.
pub struct TorchFile {
    path: PathBuf,
    backing: Backing,
    value: Value,
    /// Each storage's bytes, with the zip entry's CRC-32 (none in the legacy format).
    storages: HashMap<String, (Range<usize>, Option<u32>)>,
    /// Storages whose CRC-32 was checked.
    crc_checked: Mutex<HashSet<String>>,
    byte_order: ByteOrder,
    format: TorchFormat,
    gzipped: bool,
    limits: Limits,
}

impl std::fmt::Debug for TorchFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TorchFile")
            .field("path", &self.path)
            .field("format", &self.format)
            .field("byte_order", &self.byte_order)
            .field("gzipped", &self.gzipped)
            .finish_non_exhaustive()
    }
}

/// Loads a `torch.save` file (zip or legacy format, plain or gzip-compressed) without
/// executing any pickle code.
pub fn load_torch(path: &Path) -> Result<TorchFile, ConvertError> {
    load_torch_with(path, Limits::default())
}

/// [`load_torch`] with explicit [`Limits`].
pub fn load_torch_with(path: &Path, limits: Limits) -> Result<TorchFile, ConvertError> {
    let backing = map_file(path)?;
    TorchFile::from_backing(path, backing, limits)
}

/// Whether `bytes` starts like a gzip stream.
pub(crate) fn is_gzip(bytes: &[u8]) -> bool {
    bytes.starts_with(&[0x1f, 0x8b])
}

/// Whether `bytes` starts like a zip archive.
pub(crate) fn is_zip(bytes: &[u8]) -> bool {
    bytes.starts_with(b"PK\x03\x04") || bytes.starts_with(b"PK\x05\x06")
}

/// Bytes passed from the gzip decoder to the output buffer at a time.
const GZIP_CHUNK: usize = 64 << 10;

/// Decompressed bytes allowed per compressed byte of a gzip file (see [`gzip_limit`]).
pub const GZIP_MAX_RATIO: u64 = 64;

/// Decompressed bytes always allowed for a gzip file, however small (see [`gzip_limit`]).
pub const GZIP_MIN_LIMIT: u64 = 64 << 20;

/// The most a gzip file of `compressed` bytes may decompress to:
/// `min(cap, max(GZIP_MIN_LIMIT, GZIP_MAX_RATIO * compressed))`, where `cap` is
/// [`Limits::max_decompressed_bytes`].
///
/// Hidden states (bf16, fp32) compress 1.1-1.5x and token ids and masks a few times more,
/// so a genuine dump stays far below 64x; a decompression bomb (deflate reaches ~1000x)
/// is stopped there. A genuine file that compresses better is converted after `gunzip -k`.
///
/// Memory: the output buffer never holds more than `limit + 1` bytes, plus a 64 KiB chunk
/// and the decoder's state. It is reserved once from the gzip trailer's ISIZE when that is
/// below the limit (exact for a single-member file under 4 GiB), else grows by doubling,
/// and a reallocation that copies may briefly need up to twice the limit.
pub fn gzip_limit(compressed: u64, cap: u64) -> u64 {
    compressed
        .saturating_mul(GZIP_MAX_RATIO)
        .max(GZIP_MIN_LIMIT)
        .min(cap)
}

/// Decompresses a gzip stream (all its members) into memory, streaming, within
/// [`gzip_limit`]. The first 512 bytes (what [`sniff`] reads) are decompressed first and
/// passed to `accept`: content it refuses fails with [`ConvertError::GzipNotADump`] before
/// anything more is decompressed.
pub(crate) fn gunzip(
    bytes: &[u8],
    file: &Path,
    cap: u64,
    accept: impl Fn(&[u8]) -> bool,
) -> Result<Vec<u8>, ConvertError> {
    let compressed = bytes.len() as u64;
    let limit = gzip_limit(compressed, cap);
    let mut decoder = flate2::read::MultiGzDecoder::new(bytes);
    let mut out = Vec::new();
    fill(&mut decoder, &mut out, SNIFF_BYTES, file, compressed)?;
    if !accept(&out) {
        return Err(ConvertError::GzipNotADump {
            file: file.to_path_buf(),
            head: out.iter().take(16).copied().collect(),
            inspected: out.len() as u64,
        });
    }
    // The trailer's ISIZE (the last member's size mod 2^32) is a capacity hint only.
    let isize_hint = bytes
        .len()
        .checked_sub(4)
        .and_then(|i| bytes.get(i..))
        .and_then(|t| <[u8; 4]>::try_from(t).ok())
        .map(u32::from_le_bytes)
        .unwrap_or(0);
    let upto = usize::try_from(limit.saturating_add(1)).unwrap_or(usize::MAX);
    let hint = (isize_hint as usize).min(upto);
    let more = hint.saturating_sub(out.len());
    if more > 0 {
        reserve(&mut out, more, file)?;
    }
    fill(&mut decoder, &mut out, upto, file, compressed)?;
    if out.len() as u64 > limit {
        return Err(ConvertError::GzipTooLarge {
            file: file.to_path_buf(),
            compressed,
            limit,
            cap,
        });
    }
    Ok(out)
}

/// Reads from `decoder` into `out` until it holds `upto` bytes or the stream ends; the
/// buffer's capacity never exceeds `upto`, and the decoder is never asked for more.
fn fill(
    decoder: &mut impl Read,
    out: &mut Vec<u8>,
    upto: usize,
    file: &Path,
    compressed: u64,
) -> Result<(), ConvertError> {
    let mut chunk = vec![0u8; GZIP_CHUNK.min(upto)];
    while out.len() < upto {
        let want = (upto - out.len()).min(chunk.len());
        let n = match decoder.read(chunk.get_mut(..want).unwrap_or_default()) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(ConvertError::Truncated {
                    file: file.to_path_buf(),
                    what: "gzip stream".into(),
                    offset: 0,
                    needed: compressed + 1,
                    len: compressed,
                })
            }
            Err(e) => {
                return Err(ConvertError::malformed(
                    file,
                    "gzip stream",
                    0,
                    e.to_string(),
                ))
            }
        };
        if out.capacity() - out.len() < n {
            let grow = out.capacity().max(n).min(upto - out.len());
            reserve(out, grow, file)?;
        }
        out.extend_from_slice(chunk.get(..n).unwrap_or_default());
    }
    Ok(())
}

/// Reserves exactly `more` bytes, failing as an I/O error when memory runs out.
fn reserve(out: &mut Vec<u8>, more: usize, file: &Path) -> Result<(), ConvertError> {
    out.try_reserve_exact(more).map_err(|e| ConvertError::Io {
        file: file.to_path_buf(),
        source: std::io::Error::new(
            std::io::ErrorKind::OutOfMemory,
            format!("cannot allocate {more} more bytes to decompress it ({e}); decompress it first (gunzip -k)"),
        ),
    })
}

impl TorchFile {
    /// Reads a torch file from bytes already in memory (zip, legacy or gzip of either).
    /// `file` names it in errors.
    pub fn from_bytes(
        bytes: Vec<u8>,
        file: &Path,
        limits: Limits,
    ) -> Result<TorchFile, ConvertError> {
        TorchFile::from_backing(file, Backing::from_vec(bytes), limits)
    }

    pub(crate) fn from_backing(
        path: &Path,
        backing: Backing,
        limits: Limits,
    ) -> Result<TorchFile, ConvertError> {
        if is_gzip(&backing) {
            let inner = gunzip(&backing, path, limits.max_decompressed_bytes, |head| {
                matches!(
                    sniff(head),
                    Some(Sniffed::TorchZip | Sniffed::TorchTar | Sniffed::TorchLegacy)
                )
            })?;
            let mut t = TorchFile::from_backing(path, Backing::from_vec(inner), limits)?;
            t.gzipped = true;
            return Ok(t);
        }
        let bytes: &[u8] = &backing;
        let (value, storages, byte_order, format) = match sniff(bytes) {
            Some(Sniffed::TorchZip) => {
                let archive = Archive::parse(bytes, path)?;
                if let Some(e) = archive.record("data.pkl") {
                    Archive::check_crc(e, bytes, path)?;
                }
                let pkl = bytes.get(archive.pickle.clone()).unwrap_or(&[]);
                let value = pickle::parse(pkl, path)?;
                let data_prefix = format!("{}/data/", archive.prefix);
                let storages = archive
                    .entries
                    .iter()
                    .filter_map(|e| {
                        Some((
                            e.name.strip_prefix(&data_prefix)?.to_string(),
                            (e.data.clone(), Some(e.crc32)),
                        ))
                    })
                    .collect();
                let format = TorchFormat::Zip {
                    prefix: archive.prefix.clone(),
                    version: archive.version.clone(),
                    format_version: archive.format_version.clone(),
                    storage_alignment: archive.storage_alignment.clone(),
                };
                (value, storages, archive.byte_order, format)
            }
            Some(Sniffed::TorchTar) => {
                return Err(ConvertError::LegacyTarFormat {
                    file: path.to_path_buf(),
                });
            }
            Some(Sniffed::TorchLegacy) => {
                let legacy = LegacyFile::parse(bytes, path)?;
                let storages = legacy
                    .storages
                    .into_iter()
                    .map(|(k, r)| (k, (r, None)))
                    .collect();
                (
                    legacy.value,
                    storages,
                    ByteOrder::Little,
                    TorchFormat::Legacy,
                )
            }
            _ => {
                return Err(ConvertError::UnknownFormat {
                    file: path.to_path_buf(),
                });
            }
        };
        check_storage_lengths(path, &value, &storages)?;
        Ok(TorchFile {
            path: path.to_path_buf(),
            backing,
            value,
            storages,
            crc_checked: Mutex::new(HashSet::new()),
            byte_order,
            format,
            gzipped: false,
            limits,
        })
    }

    /// The file this was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The decoded top-level object.
    pub fn value(&self) -> &Value {
        &self.value
    }

    /// The container format.
    pub fn format(&self) -> &TorchFormat {
        &self.format
    }

    /// The byte order of the storages.
    pub fn byte_order(&self) -> ByteOrder {
        self.byte_order
    }

    /// Whether the file was gzip-compressed.
    pub fn gzipped(&self) -> bool {
        self.gzipped
    }

    /// Every tensor and numpy array with its path (see [`Value::tensors`]).
    pub fn tensors(&self) -> Vec<(String, TensorLike<'_>)> {
        self.value.tensors()
    }

    /// The tensor's elements as C-contiguous little-endian bytes: borrowed from the file
    /// when the view is contiguous and little-endian, else gathered and byte-swapped.
    pub fn tensor_bytes(&self, t: &TensorRef) -> Result<Cow<'_, [u8]>, ConvertError> {
        self.tensor_bytes_named(&format!("<tensor on storage {}>", t.storage.key), t)
    }

    /// Like [`TorchFile::tensor_bytes`], naming the tensor `name` in errors.
    pub fn tensor_bytes_named(
        &self,
        name: &str,
        t: &TensorRef,
    ) -> Result<Cow<'_, [u8]>, ConvertError> {
        let oob = |reason: String| ConvertError::TensorOutOfBounds {
            file: self.path.clone(),
            tensor: name.to_string(),
            reason,
        };
        if t.numel() == Some(0) {
            return Ok(Cow::Borrowed(&[]));
        }
        let s = &t.storage;
        let (range, crc) = self
            .storages
            .get(&s.key)
            .ok_or_else(|| ConvertError::Missing {
                file: self.path.clone(),
                what: "storage",
                key: s.key.clone(),
            })?;
        let entry = self.backing.get(range.clone()).unwrap_or(&[]);
        if let Some(crc) = *crc {
            self.check_storage_crc(name, &s.key, entry, crc)?;
        }
        let nbytes = storage_len(&self.path, s, entry.len())?;
        let storage = entry.get(..nbytes).unwrap_or_default();
        let storage = match s.view {
            None => storage,
            Some((off, len)) => {
                let e = s.kind.element_size;
                off.checked_mul(e)
                    .zip(off.checked_add(len).and_then(|end| end.checked_mul(e)))
                    .and_then(|(a, b)| {
                        storage.get(usize::try_from(a).ok()?..usize::try_from(b).ok()?)
                    })
                    .ok_or_else(|| {
                        oob(format!(
                            "storage view ({off}, {len}) exceeds storage {:?}",
                            s.key
                        ))
                    })?
            }
        };
        let elem = t.dtype.size();
        let swap = match self.byte_order {
            ByteOrder::Little => false,
            ByteOrder::Big if s.kind.element_size <= 1 => false,
            ByteOrder::Big if s.kind.element_size == elem as u64 => true,
            ByteOrder::Big => {
                return Err(oob(format!(
                    "big-endian storage of {}-byte elements viewed as {}",
                    s.kind.element_size, t.dtype
                )))
            }
        };
        let view = View {
            elem,
            shape: &t.shape,
            strides: &t.strides,
            offset: t.storage_offset,
            swap,
        };
        materialize(storage, &view, self.limits.max_tensor_bytes).map_err(oob)
    }

    /// Checks a storage's entry against its CRC-32 once per file: one pass over bytes that
    /// are read anyway, which also maps them in before the writer copies them.
    fn check_storage_crc(
        &self,
        tensor: &str,
        key: &str,
        entry: &[u8],
        want: u32,
    ) -> Result<(), ConvertError> {
        if self.crc_checked.lock().is_ok_and(|c| c.contains(key)) {
            return Ok(());
        }
        let got = crc32fast::hash(entry);
        if got != want {
            let prefix = match &self.format {
                TorchFormat::Zip { prefix, .. } => prefix.as_str(),
                TorchFormat::Legacy => "",
            };
            return Err(ConvertError::ChecksumMismatch {
                file: self.path.clone(),
                entry: format!("{prefix}/data/{key}"),
                of: format!(" (the bytes of tensor `{tensor}`)"),
                expected: want,
                got,
            });
        }
        if let Ok(mut c) = self.crc_checked.lock() {
            c.insert(key.to_string());
        }
        Ok(())
    }

    /// A numpy array's elements as C-contiguous little-endian bytes.
    pub fn ndarray_bytes<'a>(
        &self,
        name: &str,
        a: &'a NdArray,
    ) -> Result<Cow<'a, [u8]>, ConvertError> {
        array_bytes(&self.path, name, a, self.limits.max_tensor_bytes)
    }
}

/// Checks every storage the pickle refers to against the bytes the file holds for it, so
/// that a file cut short fails when it is opened, naming the storage.
fn check_storage_lengths(
    file: &Path,
    value: &Value,
    storages: &HashMap<String, (Range<usize>, Option<u32>)>,
) -> Result<(), ConvertError> {
    for s in value.storages() {
        if let Some((range, _)) = storages.get(&s.key) {
            storage_len(file, s, range.len())?;
        }
    }
    Ok(())
}

/// The bytes storage `s` declares, which must fit in the `have` bytes stored for it.
fn storage_len(file: &Path, s: &StorageRef, have: usize) -> Result<usize, ConvertError> {
    let needed = s.numel.checked_mul(s.kind.element_size).ok_or_else(|| {
        ConvertError::DeclaredSizeTooLarge {
            file: file.to_path_buf(),
            what: format!("storage {:?} element count", s.key),
            declared: s.numel,
            limit: have as u64 / s.kind.element_size.max(1),
        }
    })?;
    match usize::try_from(needed) {
        Ok(n) if n <= have => Ok(n),
        _ => Err(ConvertError::TruncatedStorage {
            file: file.to_path_buf(),
            key: s.key.clone(),
            len: have as u64,
            needed,
        }),
    }
}

/// C-contiguous little-endian bytes of an inline numpy array.
pub(crate) fn array_bytes<'a>(
    file: &Path,
    name: &str,
    a: &'a NdArray,
    limit: u64,
) -> Result<Cow<'a, [u8]>, ConvertError> {
    let oob = |reason: String| ConvertError::TensorOutOfBounds {
        file: file.to_path_buf(),
        tensor: name.to_string(),
        reason,
    };
    let strides = if a.fortran_order {
        fortran_strides(&a.shape)
    } else {
        contiguous_strides(&a.shape)
    }
    .ok_or_else(|| oob(format!("shape {:?} overflows", a.shape)))?;
    let view = View {
        elem: a.dtype.size(),
        shape: &a.shape,
        strides: &strides,
        offset: 0,
        swap: a.big_endian,
    };
    materialize(&a.data, &view, limit).map_err(oob)
}
