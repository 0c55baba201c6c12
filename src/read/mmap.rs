//! Read-only file mappings: the one place the reader uses `unsafe`.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use memmap2::Mmap;

use crate::error::{io, Result};

/// Maps `path` read-only.
pub fn map_file(path: &Path) -> Result<Arc<Mmap>> {
    let file = File::open(path).map_err(io(path, "open"))?;
    // SAFETY: a mapping is only sound while nobody truncates or rewrites the file. hspack
    // never modifies a file after publishing it: shards and manifests are written to a temp
    // file and renamed into place, so a live mapping keeps the old inode. Another program
    // truncating a shard under a live mapping would make reads fault (SIGBUS); that is the
    // documented hazard of reading datasets others are editing in place.
    let map = unsafe { Mmap::map(&file) }.map_err(io(path, "map"))?;
    Ok(Arc::new(map))
}
