//! Moving datasets between storages, with every byte proven on the way.

pub mod copy;
pub mod merge;
pub mod repair;

pub use copy::{copy, CopyMode, CopyOptions, CopyReport};
pub use merge::{merge, MergeReport};
pub use repair::{repair, RepairReport};

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
