//! `hspack repair`: what verify finds damaged in one copy, replaced from another copy of the
//! same dataset (the same digest), then verified again.
//!
//! The unit replaced is the shard file: a damaged shard is deleted and sent again from the
//! good copy, every chunk checked as it passes and read back where it landed, as `hspack cp`
//! does. A damaged or missing samples table, segment, key run or table part is copied again
//! (a copy whose segments are damaged does not open: `restore_listed` comes first). The
//! manifest, the root of trust, is never replaced: the two copies must already share it byte
//! for byte.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::format::manifest::MANIFEST_FILE;
use crate::io::Storage;
use crate::read::Dataset;
use crate::verify::{verify_dataset, Report, VerifyOptions};

use super::copy::{check_at, copy_listed_files, prove, send_shard, still_held, Stats};

/// What a repair did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RepairReport {
    /// Problems the first verification found, as text.
    pub problems_found: Vec<String>,
    /// Shard files replaced from the good copy.
    pub shards_replaced: Vec<String>,
    /// Other files the manifest covers copied again: samples tables, key runs.
    pub files_replaced: Vec<String>,
    /// Problems left after the repair (empty when it worked).
    pub problems_left: Vec<String>,
    /// The dataset digest, where the copy verified intact (after the repair, or before when
    /// there was nothing to repair).
    pub digest: Option<String>,
}

/// The file a problem is in.
fn problem_file(e: &Error) -> Option<&Path> {
    match e {
        Error::ChecksumMismatch { site, .. }
        | Error::ChunkMisplaced { site, .. }
        | Error::BadChunk { site, .. } => Some(&site.shard),
        Error::ShardMismatch { shard, .. }
        | Error::ForeignShard { shard, .. }
        | Error::DirtyPadding { shard, .. } => Some(shard),
        Error::Io { path, .. }
        | Error::Format { path, .. }
        | Error::SamplesTable { path, .. }
        | Error::KeyRun { path, .. } => Some(path),
        _ => None,
    }
}

/// Copies again, from `good`, the files besides shards that the manifest of the dataset in
/// `dst` lists and that are missing there or differ from their hash (segments, key runs,
/// samples table parts): what a dataset needs to open. Refused unless the two manifests are
/// the same bytes. Returns the files copied.
///
/// In a store, the manifest's own blob may be what was lost: it is put again from the copy,
/// where the dataset's record names those very bytes (their BLAKE3, which the store's
/// `replace` checks), so the root of trust is the one it was.
pub fn restore_listed(dst: &Arc<dyn Storage>, good: &Dataset) -> Result<Vec<String>> {
    refuse_same_copy(dst.root(), good.dir())?;
    let mut restored = Vec::new();
    // No writer or copy may be at work there meanwhile.
    let lock = dst.lock()?;
    match dst.read(MANIFEST_FILE) {
        Ok(Some(there)) if there == good.manifest_bytes() => {}
        Err(e) if e.is_damage() && dst.check_copies_found() => {
            let bytes = good.manifest_bytes();
            still_held(&*lock, dst)?;
            dst.replace(MANIFEST_FILE, bytes, Some(blake3::hash(bytes)), true)
                .map_err(|e| match e {
                    Error::CommitConflict { .. } => not_a_copy(dst.root(), good),
                    e => e,
                })?;
            restored.push(MANIFEST_FILE.to_string());
        }
        Err(e) => return Err(e),
        Ok(_) => return Err(not_a_copy(dst.root(), good)),
    }
    restored.extend(copy_listed_files(good, dst, &*lock, &|_| true)?);
    Ok(restored)
}

/// Refuses `from` when it is the copy at `damaged` itself (another spelling of the path): a
/// repair deletes a damaged shard before sending it again from the good copy.
pub fn refuse_same_copy(damaged: &Path, from: &Path) -> Result<()> {
    if !super::same_place(damaged, from) {
        return Ok(());
    }
    Err(Error::CopyRefused {
        path: damaged.to_path_buf(),
        detail: format!(
            "--from names the same copy ({}); nothing was changed: repair from another copy \
             of the dataset (`hspack cp` makes one; `hspack verify` names what is damaged)",
            from.display()
        ),
    })
}

fn not_a_copy(damaged: &Path, good: &Dataset) -> Error {
    Error::CopyRefused {
        path: damaged.to_path_buf(),
        detail: format!(
            "{} is not a copy of the same dataset (their manifests differ); repair takes \
             its parts only from a copy with the same digest (where this copy's own \
             manifest.json is what was damaged, it cannot be mended in place: copy the dataset \
             again from the intact copy, `hspack cp COPY NEW`)",
            good.dir().display()
        ),
    }
}

/// Repairs `damaged` from `good`, two copies of one dataset.
pub fn repair(damaged: &Dataset, good: &Dataset) -> Result<RepairReport> {
    refuse_same_copy(damaged.dir(), good.dir())?;
    if damaged.manifest_bytes() != good.manifest_bytes() {
        return Err(not_a_copy(damaged.dir(), good));
    }
    let first = verify_dataset(damaged, VerifyOptions::default(), &|_| {})?;
    let intact = verify_dataset(good, VerifyOptions::default(), &|_| {})?;
    if !intact.is_ok() {
        return Err(Error::CopyRefused {
            path: damaged.dir().to_path_buf(),
            detail: format!(
                "the copy to repair from, {}, is damaged too ({}); repair from an intact copy",
                good.dir().display(),
                intact.problems[0]
            ),
        });
    }
    let mut report = RepairReport {
        problems_found: first.problems.iter().map(Error::to_string).collect(),
        digest: first.proven_digest().map(str::to_string),
        ..RepairReport::default()
    };
    if first.is_ok() {
        return Ok(report);
    }
    // A read refused or cut short says nothing of the file's bytes: nothing is deleted on
    // its word.
    if let Some(e) = first.problems.iter().find(|e| !e.is_damage()) {
        return Err(Error::CopyRefused {
            path: damaged.dir().to_path_buf(),
            detail: format!(
                "{e}; that is a failed read, not damage (the file may be intact), so nothing \
                 was changed: run repair again once the storage reads (check access, the \
                 network or the disk)"
            ),
        });
    }
    let names = damaged_files(&first);
    // A store's lost or damaged blob is the store's file, and any of the dataset's files
    // may reference it: each of them is proven again below, and only those that fail are
    // sent again.
    let store_damage = first
        .problems
        .iter()
        .any(|e| matches!(e, Error::StoreDamage { .. }));
    let wanted = |name: &str| store_damage || names.contains(name);
    let dst: Arc<dyn crate::io::Storage> = Arc::clone(damaged.storage());
    // No writer or copy may be at work there while shards are replaced.
    let lock = dst.lock()?;
    // In a store, bytes sent again are found there: the damaged copy must not be found.
    dst.check_copies_found();
    let stats = Stats::default();
    for (seq, record) in damaged.manifest().shards.iter().enumerate() {
        if !wanted(record.file.as_str()) {
            continue;
        }
        still_held(&*lock, &dst)?;
        // Proven again under the lock, as a copy proves a shard it finds: only a shard that
        // is damaged now is deleted (a writer or copy may have mended it meanwhile).
        match prove(good, &dst, record, true, &stats) {
            Ok(()) => continue,
            Err(e) if e.is_damage() => {}
            Err(e) => return Err(e),
        }
        dst.delete(&record.file)?;
        send_shard(good, seq, &dst, &stats, &|_| {})?;
        prove(good, &dst, record, true, &stats)?;
        check_at(good, &dst, record)?;
        report.shards_replaced.push(record.file.clone());
    }
    report.files_replaced = copy_listed_files(good, &dst, &*lock, &wanted)?;
    let after = verify_dataset(damaged, VerifyOptions::default(), &|_| {})?;
    report.problems_left = after.problems.iter().map(Error::to_string).collect();
    report.digest = after.proven_digest().map(str::to_string);
    Ok(report)
}

/// The names of the files `report`'s problems are in.
fn damaged_files(report: &Report) -> BTreeSet<&str> {
    report
        .problems
        .iter()
        .filter_map(problem_file)
        .filter_map(|p| p.file_name()?.to_str())
        .collect()
}
