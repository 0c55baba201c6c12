//! Which shards may hold a key: the key hashes of every shard of a dataset, sorted, so that a
//! lookup by key searches one table and then the one shard (rarely two) the hash points to,
//! instead of every shard's key table in turn.
//!
//! Built on the first lookup by key of a dataset of more than [`FROM_SHARDS`] shards, from the
//! shards' key tables (each shard is opened and checked as any read opens it, on the thread
//! pool): 12 bytes a sample, in memory. A shard that fails to open is listed apart, and a
//! lookup whose key is in no indexed shard tries those again, so one damaged shard never hides
//! the keys of the others and a key it may hold is answered with its error.

use rayon::prelude::*;

use super::Dataset;

/// Datasets of at most this many shards search the shards' key tables in turn.
pub const FROM_SHARDS: usize = 8;

/// The key hashes of a dataset's shards, sorted, with the shard each came from.
#[derive(Debug)]
pub(crate) struct KeyDirectory {
    hashes: Vec<u64>,
    shards: Vec<u32>,
    /// Shards that failed to open when the directory was built.
    unindexed: Vec<usize>,
}

impl KeyDirectory {
    /// The directory of `ds`'s shards.
    pub(crate) fn build(ds: &Dataset) -> KeyDirectory {
        let per_shard: Vec<Result<Vec<(u64, u32)>, usize>> = crate::parallel::install(|| {
            (0..ds.manifest().shards.len())
                .into_par_iter()
                .map(|seq| {
                    let shard = ds.shard_apart(seq).map_err(|_| seq)?;
                    let index = shard.index();
                    Ok((0..index.sample_count())
                        .filter_map(|i| index.key_entry(i))
                        .map(|e| (e.hash, seq as u32))
                        .collect())
                })
                .collect()
        });
        let mut unindexed = Vec::new();
        // Sized by what the shards hold, not by the manifest's counts (a crafted manifest
        // may claim any number of samples).
        let found: usize = per_shard.iter().flatten().map(Vec::len).sum();
        let mut pairs = Vec::with_capacity(found);
        for shard in per_shard {
            match shard {
                Ok(found) => pairs.extend(found),
                Err(seq) => unindexed.push(seq),
            }
        }
        crate::parallel::install(|| pairs.par_sort_unstable());
        let (hashes, shards) = pairs.into_iter().unzip();
        KeyDirectory {
            hashes,
            shards,
            unindexed,
        }
    }

    /// Shards holding a key whose hash is `hash`, in shard order, possibly repeated.
    pub(crate) fn shards_for(&self, hash: u64) -> impl Iterator<Item = usize> + '_ {
        let start = self.hashes.partition_point(|&h| h < hash);
        self.hashes[start..]
            .iter()
            .zip(&self.shards[start..])
            .take_while(move |(&h, _)| h == hash)
            .map(|(_, &seq)| seq as usize)
    }

    /// Shards that failed to open when the directory was built.
    pub(crate) fn unindexed(&self) -> &[usize] {
        &self.unindexed
    }
}
