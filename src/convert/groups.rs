//! Planning: which units the run converts, and the groups of consecutive units whose shards one
//! thread writes.

use std::collections::HashSet;
use std::ops::Range;

use crate::write::{DatasetWriter, WriteOptions};

use super::job::RunError;
use super::keys::KeyLog;
use super::units::Unit;

/// Groups are planned no smaller than this unless shards are.
const MIN_GROUP_BYTES: u64 = 64 << 20;

/// Refuses two files with one key (split or not: a unit reads one file per part, so the
/// second would be ignored, and deleted with `--delete-source`). The keys of split units'
/// requests are checked as they come.
pub(super) fn check_duplicates(units: &[Unit]) -> Result<(), RunError> {
    // Units are sorted by key and grouped, so equal keys can only come from one group: a
    // group of unnamed parts holds two files with one key (`a.pt` and `a.pt.gz`).
    for u in units {
        if u.files.len() > 1 && u.files.iter().all(|(p, _)| p.is_empty()) {
            return Err(RunError::DuplicateKey {
                key: u.key.clone(),
                a: u.files[0].1.clone(),
                b: u.files[1].1.clone(),
            });
        }
        // Named parts: two files of one part (a pattern naming `{part}` twice, names that
        // differ only where the pattern does not look).
        let mut by_part: Vec<&(String, std::path::PathBuf)> = u.files.iter().collect();
        by_part.sort_by(|x, y| x.0.cmp(&y.0));
        if let Some(w) = by_part.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(RunError::DuplicatePart {
                key: u.key.clone(),
                part: w[0].0.clone(),
                a: w[0].1.clone(),
                b: w[1].1.clone(),
            });
        }
    }
    Ok(())
}

/// The units this run converts, those it skips whole because the dataset holds their
/// samples, and the keys of the units the key log says gave what the dataset holds (their
/// files' identity is the one logged); units found bad are in none. With a key log, a unit is
/// skipped whole only where the log says its files, as they are, gave its key: one whose files
/// changed, or that the log does not know, is converted, and the samples the dataset holds compared
/// with its own. Split units are never skipped whole: their keys are known only once decoded.
pub(super) fn to_convert(
    units: Vec<Unit>,
    bad: &HashSet<String>,
    keys: Option<&KeyLog>,
    writer: &DatasetWriter,
    split: bool,
) -> (Vec<Unit>, Vec<Unit>, HashSet<String>) {
    let mut todo = Vec::with_capacity(units.len());
    let mut present = Vec::new();
    let mut trusted = HashSet::new();
    for u in units {
        if bad.contains(&u.key) {
            continue;
        }
        // Without a key log (a dataset in object storage keeps none), a held key
        // is trusted, as before the log: comparing every held sample there would read the
        // whole dataset back on each rerun. The report counts those skipped.
        let key = match keys {
            Some(log) => log.key_of(&u.key, u.identity()),
            None => Some(u.key.as_str()),
        };
        if key.is_some() {
            trusted.insert(u.key.clone());
        }
        if !split && key.is_some_and(|k| writer.contains_key(k)) {
            present.push(u);
        } else {
            todo.push(u);
        }
    }
    (todo, present, trusted)
}

/// Consecutive units whose shards one thread writes. Each group is planned to fill one shard
/// (its source bytes under the shard size, its units under the shard's sample count, by
/// [`WriteOptions::shard_is_full`]); the planned shard size shrinks, down to
/// `MIN_GROUP_BYTES`, so that every thread gets several groups.
pub(super) fn shard_groups(todo: &[Unit], write: &WriteOptions, jobs: usize) -> Vec<Range<usize>> {
    let total: u64 = todo.iter().map(|u| u.bytes).sum();
    // Under `shard_bytes` by a margin: a shard also holds headers and alignment padding, and
    // a group that overflows its shard gets a second one.
    let full = write.shard_bytes - write.shard_bytes / 8;
    let planned = WriteOptions {
        shard_bytes: (total / (jobs as u64).saturating_mul(4).max(1))
            .clamp(MIN_GROUP_BYTES.min(full), full.max(1)),
        ..write.clone()
    };
    let mut groups = Vec::new();
    let (mut start, mut bytes) = (0, 0u64);
    for (i, u) in todo.iter().enumerate() {
        if planned.shard_is_full(bytes, (i - start) as u64, u.bytes) {
            groups.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += u.bytes;
    }
    if start < todo.len() {
        groups.push(start..todo.len());
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    fn units(bytes: &[u64]) -> Vec<Unit> {
        bytes
            .iter()
            .enumerate()
            .map(|(i, &bytes)| Unit {
                key: i.to_string(),
                files: vec![(String::new(), format!("{i}.pt").into())],
                bytes,
                split_file: None,
                missing: Vec::new(),
                identity: Default::default(),
            })
            .collect()
    }

    #[test]
    fn groups_fill_a_shard_by_the_writers_rule() {
        let write = WriteOptions {
            shard_bytes: 800 << 20,
            shard_samples: 3,
            ..WriteOptions::default()
        };
        let mib = |n: u64| n << 20;
        // Planned 700 MiB per group, an eighth under the shard size: two 400 MiB units would
        // fit the shard but not the plan.
        let groups = shard_groups(&units(&[mib(400); 12]), &write, 1);
        assert_eq!(groups, (0..12).map(|i| i..i + 1).collect::<Vec<_>>());
        // Small units: at most `shard_samples` a group.
        let groups = shard_groups(&units(&[mib(10); 7]), &write, 1);
        assert_eq!(groups, [0..3, 3..6, 6..7]);
        // One unit larger than a shard still makes a group of its own.
        let groups = shard_groups(&units(&[mib(900)]), &write, 1);
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0], 0..1);
        assert!(shard_groups(&[], &write, 4).is_empty());
    }
}
