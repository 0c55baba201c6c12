//! Read-only file contents: a memory map, or bytes owned in memory (e.g. after gunzip).

use std::fs::File;
use std::ops::Deref;
use std::path::Path;

use memmap2::Mmap;

use super::ConvertError;

/// The bytes of a source file.
pub(crate) enum Backing {
    /// A read-only memory map of the whole file.
    Mapped(Mmap),
    /// Bytes held in memory.
    Owned(Vec<u8>),
}

impl Deref for Backing {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Backing::Mapped(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// Maps `path` read-only. Empty files are returned as empty owned bytes, since some
/// platforms refuse zero-length maps.
pub(crate) fn map_file(path: &Path) -> Result<Backing, ConvertError> {
    let io = |source| ConvertError::Io {
        file: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    if len == 0 {
        return Ok(Backing::Owned(Vec::new()));
    }
    // SAFETY: the map is read-only and private to this process. The hazard is another
    // process truncating or rewriting the file while it is mapped, which would make reads
    // fault or change under us; source files are inputs that hspack only reads, and every
    // access is bounds-checked against the length captured here, so the map is sound as
    // long as the file is not modified during conversion (documented on `open_source`).
    let map = unsafe { Mmap::map(&file) }.map_err(io)?;
    Ok(Backing::Mapped(map))
}
