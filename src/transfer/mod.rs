//! Moving datasets between storages, with every byte proven on the way.

pub mod copy;
pub mod merge;
pub mod repair;

pub use copy::{copy, CopyMode, CopyOptions, CopyReport};
pub use merge::{merge, MergeReport};
pub use repair::{repair, RepairReport};

use std::path::{Path, PathBuf};

/// True when `a` and `b` name one place: the same folder (through links, `.` and `..`), or
/// the same URL up to repeated and trailing slashes. A job that reads one copy and writes
/// another (repair, merge) refuses to be given one place twice.
pub(crate) fn same_place(a: &Path, b: &Path) -> bool {
    let resolved = |p: &Path| -> PathBuf {
        let local = p.to_string_lossy();
        let local = Path::new(local.strip_prefix("file://").unwrap_or(&local));
        match crate::io::is_remote(p) {
            true => p.components().collect(),
            false => local
                .canonicalize()
                .unwrap_or_else(|_| local.components().collect()),
        }
    };
    resolved(a) == resolved(b)
}

/// Imports dataset `src` into `store` as `name`: a verified copy ([`copy`]: every chunk
/// checked as it passes and read back from the store), whose blobs already stored are
/// referenced, not stored again. A rerun of an interrupted add resumes. Returns the copy's
/// report and what was stored and found.
pub fn add_to_store(
    store: &std::sync::Arc<crate::store::Store>,
    src: &crate::Dataset,
    name: &str,
    progress: &(dyn Fn(u64) + Sync),
) -> crate::Result<(CopyReport, crate::store::IngestStats)> {
    let dst = std::sync::Arc::new(store.dataset(name)?);
    let storage: std::sync::Arc<dyn crate::io::Storage> = dst.clone();
    let report = copy(src, &storage, &CopyOptions::default(), progress)?;
    Ok((report, dst.added()))
}
