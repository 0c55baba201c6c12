//! The bytes of a source file: mapped through the I/O layer ([`crate::io::mmap`]), or held in
//! memory (e.g. after gunzip).

use std::path::Path;

use super::ConvertError;

/// The bytes of a source file.
pub(crate) use crate::io::FileBytes as Backing;

/// Maps `path` read-only. Source files are inputs hspack only reads; the map is sound as
/// long as the file is not modified during conversion (documented on `open_source`).
pub(crate) fn map_file(path: &Path) -> Result<Backing, ConvertError> {
    crate::io::mmap::map_path(path).map_err(|source| ConvertError::Io {
        file: path.to_path_buf(),
        source,
    })
}
