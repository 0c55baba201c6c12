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
    resolved(a) == resolved(b)
}

/// Refuses destination `dst` where it lies inside dataset `src`, or holds it in a folder of
/// its own (places compared as [`same_place`] compares them): the one's files would lie among
/// the other's, which `verify` then names as files not of the dataset, and removing the outer
/// one would remove both.
pub(crate) fn refuse_nested(src: &Path, dst: &Path) -> crate::Result<()> {
    let (s, d) = (resolved(src), resolved(dst));
    let detail = if d != s && d.starts_with(&s) {
        "it lies inside the source dataset"
    } else if d != s && s.starts_with(&d) {
        "the source dataset lies inside it"
    } else {
        return Ok(());
    };
    Err(crate::Error::CopyRefused {
        path: dst.to_path_buf(),
        detail: format!(
            "{detail} ({}): each one's files would lie among the other's, and removing the \
             outer one would remove both; nothing was written: name a place apart from it",
            src.display()
        ),
    })
}

/// `p` resolved: a folder through links, `.` and `..`; a URL up to repeated and trailing
/// slashes.
fn resolved(p: &Path) -> PathBuf {
    let local = p.to_string_lossy();
    let local = Path::new(local.strip_prefix("file://").unwrap_or(&local));
    match crate::io::is_remote(p) {
        true => p.components().collect(),
        false => resolved_local(local),
    }
}

/// `path` with the deepest part of it that exists resolved (links, `.` and `..`) and the rest
/// appended as written: a store's dataset, `STORE/NAME`, is no folder, and its store is.
fn resolved_local(path: &Path) -> PathBuf {
    let mut rest = Vec::new();
    let mut at = path;
    loop {
        if let Ok(found) = at.canonicalize() {
            return rest.iter().rev().fold(found, |p, name| p.join(name));
        }
        match (at.parent(), at.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name);
                at = match parent.as_os_str().is_empty() {
                    true => Path::new("."),
                    false => parent,
                };
            }
            _ => return path.components().collect(),
        }
    }
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
    // A name taken by another dataset: said as such (the copy would say "choose an empty
    // destination"). One whose manifest does not decode is left to the copy to judge.
    let taken = storage
        .read(crate::format::manifest::MANIFEST_FILE)?
        .and_then(|bytes| crate::format::Manifest::decode(&bytes).ok())
        .filter(|there| there.dataset_id != src.manifest().dataset_id);
    if let Some(there) = taken {
        return Err(crate::Error::CopyRefused {
            path: storage.root().to_path_buf(),
            detail: format!(
                "the store has another dataset named `{name}` (its id {}, {} samples; the \
                 source's id is {}); nothing was sent: give another name (`--name`), or remove \
                 that one first (`hspack store rm {} {name}`)",
                there.dataset_id,
                there.samples,
                src.manifest().dataset_id,
                store.root().display()
            ),
        });
    }
    let report = copy(src, &storage, &CopyOptions::default(), progress)?;
    Ok((report, dst.added()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A path that does not exist past a folder (a store's dataset) names one place however
    /// the folder is reached.
    #[test]
    fn a_store_dataset_is_one_place_by_any_path_to_its_store() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("ST")).unwrap();
        std::os::unix::fs::symlink(t.path().join("ST"), t.path().join("link")).unwrap();
        let x = t.path().join("ST/x");
        for other in ["link/x", "ST/../ST/x", "ST/./x", "ST//x/"] {
            assert!(same_place(&x, &t.path().join(other)), "{other}");
        }
        for other in ["ST/y", "link/x/y", "ST", "x"] {
            assert!(!same_place(&x, &t.path().join(other)), "{other}");
        }
    }
}
