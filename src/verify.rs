//! Checking a dataset after a transfer: every problem is named, down to shard, sample, field
//! and rows.
//!
//! The quick check opens every shard against the manifest (size, footer, header, index hash,
//! index structure) and checks the samples table. The full check also reads every byte: each
//! chunk header against the index, each payload against its BLAKE3, every padding byte zero.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rayon::prelude::*;

use crate::error::{io, Error, Result};
use crate::format::manifest::hex;
use crate::format::{ChunkHeader, ShardHeader};
use crate::read::{Dataset, Shard};
use crate::write::samples_table::decode_keys;

/// What to check.
#[derive(Debug, Clone, Copy, Default)]
pub struct VerifyOptions {
    /// Footers, headers, indexes and the samples table only; no payload bytes.
    pub quick: bool,
}

/// What a verification found.
#[derive(Debug)]
pub struct Report {
    /// Shards in the manifest.
    pub shards: u64,
    /// Samples in the manifest.
    pub samples: u64,
    /// Chunks checked.
    pub chunks: u64,
    /// Payload bytes hashed.
    pub bytes_hashed: u64,
    /// Bytes of all shard files.
    pub shard_bytes: u64,
    /// Every problem found; empty when the dataset is intact.
    pub problems: Vec<Error>,
    /// The dataset digest (BLAKE3 of the manifest), which covers every byte through the hash
    /// tree; only meaningful when `problems` is empty.
    pub digest: String,
}

impl Report {
    /// True when nothing is wrong.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Verifies the dataset in `dir`. `progress` is called with payload bytes as they are hashed.
/// Returns `Err` only when the manifest itself cannot be read; everything else is a problem in
/// the report.
pub fn verify(
    dir: impl Into<PathBuf>,
    options: VerifyOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Report> {
    let dir = dir.into();
    let ds = Dataset::open(&dir)?;
    let manifest = ds.manifest();
    let mut problems = Vec::new();
    let mut shards: Vec<Arc<Shard>> = Vec::new();
    for seq in 0..manifest.shards.len() {
        match ds.shard(seq) {
            Ok(s) => shards.push(s.clone()),
            Err(e) => problems.push(e),
        }
    }
    problems.extend(unlisted_shards(&ds)?);
    problems.extend(check_samples_table(&ds));
    let mut report = Report {
        shards: manifest.shards.len() as u64,
        samples: manifest.samples,
        chunks: 0,
        bytes_hashed: 0,
        shard_bytes: manifest.shards.iter().map(|s| s.bytes).sum(),
        problems: Vec::new(),
        digest: hex(blake3::hash(ds.manifest_bytes()).as_bytes()),
    };
    if !options.quick {
        let schema = ds.schema();
        for shard in &shards {
            problems.extend(check_layout(shard, schema));
        }
        let jobs: Vec<(usize, u64)> = shards
            .iter()
            .enumerate()
            .flat_map(|(i, s)| (0..s.footer().chunk_count).map(move |c| (i, c)))
            .collect();
        let hashed = AtomicU64::new(0);
        let mut found: Vec<(usize, u64, Error)> = crate::parallel::install(|| {
            jobs.par_iter()
                .filter_map(|&(i, c)| {
                    let shard = &shards[i];
                    let e = shard.index().chunk(c)?;
                    let result = shard.check_chunk_hash(c, &e, schema);
                    hashed.fetch_add(e.stored_len, Ordering::Relaxed);
                    progress(e.stored_len);
                    result.err().map(|err| (i, c, err))
                })
                .collect()
        });
        found.sort_by_key(|(i, c, _)| (*i, *c));
        problems.extend(found.into_iter().map(|(_, _, e)| e));
        report.chunks = jobs.len() as u64;
        report.bytes_hashed = hashed.into_inner();
    }
    report.problems = problems;
    Ok(report)
}

/// Chunk headers against the index, and zero padding between header, chunks and index.
fn check_layout(shard: &Shard, schema: &crate::format::Schema) -> Vec<Error> {
    let mut problems = Vec::new();
    let index = shard.index();
    let map = shard.map();
    let mut pos = ShardHeader::SIZE as u64;
    let check_gap = |from: u64, to: u64, problems: &mut Vec<Error>| {
        if let Some(i) = map[from as usize..to as usize].iter().position(|&b| b != 0) {
            problems.push(Error::DirtyPadding {
                shard: shard.path().to_path_buf(),
                offset: from + i as u64,
            });
        }
    };
    for c in 0..index.chunk_count() {
        let Some(e) = index.chunk(c) else { break };
        check_gap(pos, e.offset, &mut problems);
        if let Err(err) = shard.check_chunk_header(c, &e, schema) {
            problems.push(err);
        }
        pos = e.offset + ChunkHeader::SIZE as u64 + e.stored_len;
    }
    check_gap(pos, shard.footer().index_offset, &mut problems);
    problems
}

fn unlisted_shards(ds: &Dataset) -> Result<Vec<Error>> {
    let listed: std::collections::HashSet<&str> = ds
        .manifest()
        .shards
        .iter()
        .map(|s| s.file.as_str())
        .collect();
    let mut out = Vec::new();
    let dir = ds.dir();
    for entry in std::fs::read_dir(dir).map_err(io(dir, "list"))? {
        let entry = entry.map_err(io(dir, "list"))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("shard-") && name.ends_with(".hsp") && !listed.contains(name.as_str()) {
            out.push(Error::UnlistedShard {
                shard: entry.path(),
            });
        }
    }
    out.sort_by_key(|a| a.to_string());
    Ok(out)
}

fn check_samples_table(ds: &Dataset) -> Option<Error> {
    let t = ds.manifest().samples_table.as_ref()?;
    let path = ds.dir().join(&t.file);
    let problem = |detail: String| {
        Some(Error::SamplesTable {
            path: path.clone(),
            detail,
        })
    };
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) => return problem(format!("cannot read it ({e})")),
    };
    let hash = hex(blake3::hash(&bytes).as_bytes());
    if bytes.len() as u64 != t.bytes || hash != t.blake3 {
        return problem(format!(
            "{} bytes hashing to {hash}, the manifest records {} bytes hashing to {}",
            bytes.len(),
            t.bytes,
            t.blake3
        ));
    }
    match decode_keys(bytes, &path) {
        Ok(rows) if rows.len() as u64 == ds.len() && t.samples == ds.len() => None,
        Ok(rows) => problem(format!(
            "{} rows, the dataset has {} samples",
            rows.len(),
            ds.len()
        )),
        Err(e) => Some(e),
    }
}

/// The dataset digest of `dir` after a full verification: one line that two intact copies
/// share. Fails with the first problem when the dataset is damaged.
pub fn digest(dir: impl Into<PathBuf>) -> Result<String> {
    let dir = dir.into();
    let mut report = verify(&dir, VerifyOptions::default(), &|_| {})?;
    if let Some(first) = report.problems.drain(..).next() {
        return Err(first);
    }
    Ok(report.digest)
}
