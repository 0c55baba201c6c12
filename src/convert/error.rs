//! Errors raised while reading foreign hidden-state dumps.

use std::path::{Path, PathBuf};

/// Why a source file could not be read.
///
/// Every variant names the file, and where it applies the entry, key or tensor
/// that was being read, so the message alone is enough to find the problem.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConvertError {
    /// The file could not be opened, mapped or read.
    #[error("{}: cannot read the file: {source}; check the path and its permissions", file.display())]
    Io {
        /// The file being read.
        file: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// The content matches none of the formats this reader knows.
    #[error(
        "{}: not a recognised hidden-state dump (expected a torch.save file, .safetensors, .npy \
         or a gzip of one of these); re-save the tensors with safetensors",
        file.display()
    )]
    UnknownFormat {
        /// The file being read.
        file: PathBuf,
    },

    /// A gzip file whose content is not a hidden-state dump, refused after decompressing
    /// only its first bytes.
    #[error(
        "{}: the gzip-compressed content is not a hidden-state dump: it starts with {} \
         (expected a torch.save file, .safetensors or .npy inside); decompression stopped after \
         {inspected} bytes; check that this is the file you meant, and re-save the tensors with \
         safetensors if it is",
        file.display(),
        hex(head)
    )]
    GzipNotADump {
        /// The file being read.
        file: PathBuf,
        /// The first decompressed bytes (at most 16).
        head: Vec<u8>,
        /// How many bytes were decompressed before refusing.
        inspected: u64,
    },

    /// A gzip file that decompresses to more than its limit; decompression stopped there.
    #[error(
        "{}: decompresses to more than {limit} bytes, the limit for {compressed} compressed bytes \
         ({}x the compressed size, at least {} bytes, at most the configured cap of {cap}); \
         decompression stopped there. If the file is genuine, decompress it first (gunzip -k) \
         and convert the uncompressed file; otherwise it is a decompression bomb",
        file.display(),
        crate::convert::torch_file::GZIP_MAX_RATIO,
        crate::convert::torch_file::GZIP_MIN_LIMIT
    )]
    GzipTooLarge {
        /// The file being read.
        file: PathBuf,
        /// Size of the compressed file.
        compressed: u64,
        /// The decompressed size allowed for this file.
        limit: u64,
        /// The configured cap ([`Limits::max_decompressed_bytes`](super::Limits)).
        cap: u64,
    },

    /// A zip archive that starts like one but has no end record: the file was cut short.
    #[error(
        "{}: the zip archive looks truncated: the file is {size} bytes and ends {ends}, with no \
         end-of-central-directory record; copy the file again from its source, or re-save it \
         with torch.save",
        file.display()
    )]
    TruncatedZip {
        /// The file being read.
        file: PathBuf,
        /// Size of the file (or of its decompressed content).
        size: u64,
        /// Where the content stops (inside or after which entry).
        ends: String,
    },

    /// A storage holds fewer bytes than its declared elements need.
    #[error(
        "{}: storage {key:?} is truncated: it holds {len} bytes but its tensors need {needed}; \
         the file was cut short or damaged: re-save it with torch.save, or copy it again",
        file.display()
    )]
    TruncatedStorage {
        /// The file being read.
        file: PathBuf,
        /// The storage's key (`<folder>/data/<key>` in a zip).
        key: String,
        /// Bytes stored for it.
        len: u64,
        /// Bytes its declared element count needs.
        needed: u64,
    },

    /// A zip archive that is not a `torch.save` archive.
    #[error("{}: zip archive has no `<folder>/data.pkl` entry ({reason}); this is not a torch.save file", file.display())]
    NotATorchFile {
        /// The file being read.
        file: PathBuf,
        /// What was missing or wrong.
        reason: String,
    },

    /// The tar container used by torch before 0.4.
    #[error(
        "{}: this is the tar-based torch format from before torch 0.4, which hspack does not read; \
         load it with torch and re-save it with torch>=1.6 (the default zip format) or safetensors",
        file.display()
    )]
    LegacyTarFormat {
        /// The file being read.
        file: PathBuf,
    },

    /// The input ended before a structure was complete.
    #[error("{}: truncated while reading {what}: needed {needed} bytes at offset {offset}, the input has {len}; the file is incomplete, copy it again", file.display())]
    Truncated {
        /// The file being read.
        file: PathBuf,
        /// The structure being read.
        what: String,
        /// Byte offset where the structure starts.
        offset: u64,
        /// Bytes the structure needs.
        needed: u64,
        /// Bytes available in the input.
        len: u64,
    },

    /// A size declared in the file exceeds what the file can hold or a fixed limit.
    #[error("{}: {what} is declared as {declared} but at most {limit} is possible here; the file is corrupt or hostile", file.display())]
    DeclaredSizeTooLarge {
        /// The file being read.
        file: PathBuf,
        /// The structure that declared the size.
        what: String,
        /// The declared size.
        declared: u64,
        /// The largest size accepted here.
        limit: u64,
    },

    /// The bytes break the structure of the format in a way not covered by a more precise variant.
    #[error("{}: malformed {what} at offset {offset}: {reason}; the file is corrupt", file.display())]
    Malformed {
        /// The file being read.
        file: PathBuf,
        /// The structure being read.
        what: &'static str,
        /// Byte offset of the problem (within the structure being parsed).
        offset: u64,
        /// What is wrong.
        reason: String,
    },

    /// A pickle asks for a Python global outside the allowlist.
    #[error(
        "{}: the pickle refuses to call `{module}.{name}`: hspack never executes pickle code; \
         if this file should be trusted, load it with torch and re-save the tensors with safetensors",
        file.display()
    )]
    RefusedGlobal {
        /// The file being read.
        file: PathBuf,
        /// Python module of the global.
        module: String,
        /// Name of the global within its module.
        name: String,
    },

    /// A pickle opcode that this reader refuses (extension registry, out-of-band buffers, ...).
    #[error(
        "{}: pickle opcode {opcode} at offset {offset} is not supported ({reason}); \
         load the file with torch and re-save the tensors with safetensors",
        file.display()
    )]
    UnsupportedOpcode {
        /// The file being read.
        file: PathBuf,
        /// Opcode name.
        opcode: &'static str,
        /// Byte offset of the opcode in the pickle.
        offset: u64,
        /// Why it is refused.
        reason: &'static str,
    },

    /// An allowed global was called with arguments it does not accept.
    #[error("{}: pickle calls `{callable}` with unexpected arguments at offset {offset}: {reason}; the file is corrupt or not from torch", file.display())]
    BadCall {
        /// The file being read.
        file: PathBuf,
        /// `module.name` of the callable.
        callable: String,
        /// Byte offset of the calling opcode.
        offset: u64,
        /// What was expected.
        reason: String,
    },

    /// The pickle value tree is nested too deeply or expands too far.
    #[error("{}: pickle value {what} exceeds the limit of {limit}; the file is corrupt or hostile", file.display())]
    PickleTooComplex {
        /// The file being read.
        file: PathBuf,
        /// Which bound was hit.
        what: &'static str,
        /// The bound.
        limit: u64,
    },

    /// A zip entry name that could escape a folder or is otherwise unsafe.
    #[error("{}: zip entry name {entry:?} is unsafe ({reason}); the archive is hostile or corrupt", file.display())]
    UnsafeEntryName {
        /// The file being read.
        file: PathBuf,
        /// The offending name (lossily decoded).
        entry: String,
        /// What makes it unsafe.
        reason: &'static str,
    },

    /// A zip entry is compressed; torch writes stored entries only.
    #[error(
        "{}: zip entry {entry:?} is compressed with method {method}; torch.save writes uncompressed \
         entries: re-save the file with torch.save instead of re-zipping it",
        file.display()
    )]
    CompressedEntry {
        /// The file being read.
        file: PathBuf,
        /// The entry name.
        entry: String,
        /// The zip compression method code.
        method: u16,
    },

    /// Two zip entries claim the same bytes, or an entry runs past its bounds.
    #[error("{}: zip entry {entry:?} overlaps {other:?}; the archive is corrupt or hostile", file.display())]
    OverlappingEntries {
        /// The file being read.
        file: PathBuf,
        /// One entry.
        entry: String,
        /// The entry it overlaps.
        other: String,
    },

    /// A zip entry's bytes do not match the CRC-32 its central directory records.
    #[error(
        "{}: zip entry {entry:?}{of} has CRC-32 {got:08x} but the archive records \
         {expected:08x}; the file was damaged after torch wrote it: copy it again from its \
         origin, or re-save it",
        file.display()
    )]
    ChecksumMismatch {
        /// The file being read.
        file: PathBuf,
        /// The entry.
        entry: String,
        /// What the entry holds, where it is a tensor's bytes (` (the bytes of tensor
        /// \`hidden\`)`), or nothing.
        of: String,
        /// The CRC-32 in the central directory.
        expected: u32,
        /// The CRC-32 of the bytes.
        got: u32,
    },

    /// A storage or entry the pickle refers to does not exist.
    #[error("{}: missing {what} {key:?}; the file is incomplete", file.display())]
    Missing {
        /// The file being read.
        file: PathBuf,
        /// What kind of thing is missing (`storage`, `entry`, `tensor`).
        what: &'static str,
        /// Its key or name.
        key: String,
    },

    /// Two tensors whose paths in the file flatten to one name (a dict key holding a dot
    /// beside nested dicts, or the key `0` beside `"0"`): neither is read in place of the
    /// other.
    #[error("{}: {count} tensors have the name `{name}` (paths are dict keys joined by `.`: a key holding a dot, or the key 0 beside \"0\"); rename one of them in the dump", file.display())]
    AmbiguousName {
        /// The file being read.
        file: PathBuf,
        /// The name.
        name: String,
        /// Tensors that have it.
        count: usize,
    },

    /// A group of files (`--group-by`) lacks a part other groups have.
    #[error("{}: missing: group `{group}` has no part `{part}` (other groups have one), so `{wanted}` cannot be read; add the file, or move the group's other files out of the source folder", file.display())]
    MissingPart {
        /// The file the group pattern names for the part.
        file: PathBuf,
        /// The group's key.
        group: String,
        /// The part.
        part: String,
        /// The tensor or value asked for.
        wanted: String,
    },

    /// A tensor's dtype is not one hspack stores.
    #[error("{}: tensor {tensor:?} has dtype {dtype}, which hspack does not store; cast it to a stored dtype (e.g. float32, or int64 for unsigned ids) and re-save, or leave it out of the fields", file.display())]
    UnsupportedDType {
        /// The file being read.
        file: PathBuf,
        /// The tensor (path in the value tree, or name).
        tensor: String,
        /// The foreign dtype name.
        dtype: String,
    },

    /// A tensor's view reaches outside its storage, or its shape overflows.
    #[error("{}: tensor {tensor:?} is out of bounds: {reason}; the file is corrupt", file.display())]
    TensorOutOfBounds {
        /// The file being read.
        file: PathBuf,
        /// The tensor.
        tensor: String,
        /// What does not fit.
        reason: String,
    },

    /// A numpy array layout this reader does not handle.
    #[error("{}: array {tensor:?} is not supported: {reason}; re-save it with numpy.save of a C-ordered array", file.display())]
    UnsupportedArray {
        /// The file being read.
        file: PathBuf,
        /// The array.
        tensor: String,
        /// Why.
        reason: String,
    },
}

impl ConvertError {
    /// The file the error is about: every message starts with it.
    pub fn file(&self) -> &Path {
        match self {
            ConvertError::Io { file, .. }
            | ConvertError::UnknownFormat { file, .. }
            | ConvertError::GzipNotADump { file, .. }
            | ConvertError::GzipTooLarge { file, .. }
            | ConvertError::TruncatedZip { file, .. }
            | ConvertError::TruncatedStorage { file, .. }
            | ConvertError::NotATorchFile { file, .. }
            | ConvertError::LegacyTarFormat { file, .. }
            | ConvertError::Truncated { file, .. }
            | ConvertError::DeclaredSizeTooLarge { file, .. }
            | ConvertError::Malformed { file, .. }
            | ConvertError::RefusedGlobal { file, .. }
            | ConvertError::UnsupportedOpcode { file, .. }
            | ConvertError::BadCall { file, .. }
            | ConvertError::PickleTooComplex { file, .. }
            | ConvertError::UnsafeEntryName { file, .. }
            | ConvertError::CompressedEntry { file, .. }
            | ConvertError::OverlappingEntries { file, .. }
            | ConvertError::ChecksumMismatch { file, .. }
            | ConvertError::Missing { file, .. }
            | ConvertError::AmbiguousName { file, .. }
            | ConvertError::MissingPart { file, .. }
            | ConvertError::UnsupportedDType { file, .. }
            | ConvertError::TensorOutOfBounds { file, .. }
            | ConvertError::UnsupportedArray { file, .. } => file,
        }
    }

    /// The message without the file it starts with, for lists that name the file apart
    /// (the bad-file report).
    pub fn detail(&self) -> String {
        let text = self.to_string();
        let file = format!("{}: ", self.file().display());
        match text.strip_prefix(&file) {
            Some(rest) => rest.to_string(),
            None => text,
        }
    }
    /// Shorthand for [`ConvertError::Truncated`].
    pub(crate) fn truncated(
        file: &std::path::Path,
        what: impl Into<String>,
        offset: usize,
        needed: usize,
        len: usize,
    ) -> Self {
        ConvertError::Truncated {
            file: file.to_path_buf(),
            what: what.into(),
            offset: offset as u64,
            needed: needed as u64,
            len: len as u64,
        }
    }

    /// Shorthand for [`ConvertError::Malformed`].
    pub(crate) fn malformed(
        file: &std::path::Path,
        what: &'static str,
        offset: usize,
        reason: impl Into<String>,
    ) -> Self {
        ConvertError::Malformed {
            file: file.to_path_buf(),
            what,
            offset: offset as u64,
            reason: reason.into(),
        }
    }
}

/// Bytes as space-separated hex, for messages.
fn hex(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        return "nothing (it is empty)".into();
    }
    let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    hex.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_starts_with_its_file() {
        let file = PathBuf::from("/src/a.pt");
        let errors = [
            ConvertError::UnknownFormat { file: file.clone() },
            ConvertError::truncated(&file, "a header", 3, 8, 5),
            ConvertError::MissingPart {
                file: file.clone(),
                group: "g".into(),
                part: "L2".into(),
                wanted: "L2".into(),
            },
            ConvertError::Io {
                file: file.clone(),
                source: std::io::Error::other("gone"),
            },
        ];
        for e in errors {
            assert_eq!(e.file(), file);
            assert_eq!(e.to_string(), format!("/src/a.pt: {}", e.detail()));
        }
    }
}
