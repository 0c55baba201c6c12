//! Checking a dataset after a transfer: every problem is named, down to shard, sample, field
//! and rows.
//!
//! The quick check opens every shard against the manifest (size, footer, header, index hash,
//! index structure), checks every chunk header against its index entry (the headers only, no
//! payload), every key given once in the dataset, and the samples table (by its hash). The
//! full check also reads every other byte: each payload against its BLAKE3, every padding
//! byte zero, and each sample's recorded loss rows against its loss mask.
//!
//! Files of the folder that no committed data uses are not damage: what an interrupted writer
//! left (temp files, shards past the manifest's) and files hspack does not know are listed
//! apart, as notes.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::format::manifest::{hex, MANIFEST_FILE};
use crate::format::{ChunkHeader, ShardHeader};
use crate::io::lock::LOCK_FILE;
use crate::read::{Dataset, Shard};

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
    /// Chunk headers checked against the index (both checks).
    pub chunk_headers: u64,
    /// Chunk payloads hashed (the full check only).
    pub chunks: u64,
    /// Payload bytes hashed.
    pub bytes_hashed: u64,
    /// Bytes of all shard files.
    pub shard_bytes: u64,
    /// Every problem found; empty when the dataset is intact.
    pub problems: Vec<Error>,
    /// Files an interrupted writer left (temp files, shard files past the manifest's): no
    /// committed data is in them, and reopening the dataset for writing removes them. Not
    /// damage.
    pub leftovers: Vec<PathBuf>,
    /// Other files in the folder that the dataset does not use; hspack ignores them. Not
    /// damage.
    pub unknown_files: Vec<PathBuf>,
    /// False where the storage lists no folder (a dataset served over http(s)): leftovers and
    /// unknown files were not looked for.
    pub files_listed: bool,
    /// The dataset digest (BLAKE3 of the manifest), which covers every byte through the hash
    /// tree; only meaningful when `problems` is empty (see [`Report::proven_digest`]).
    pub digest: String,
    /// True for the quick check, which hashes no payload.
    pub quick: bool,
    /// Files the manifest listed when the verification began, found missing, while a writer
    /// replaced the manifest meanwhile (its merges remove the segments and key runs they
    /// replace): not damage, and not checked. Empty when the manifest stayed the same.
    pub replaced_meanwhile: Vec<PathBuf>,
}

impl Report {
    /// The digest, where this verification proved the bytes behind it: a full check that
    /// found nothing wrong. `None` after the quick check (it hashes no payload, so damaged
    /// bytes can be behind the manifest), when something is damaged, or when files it lists
    /// were replaced before they were checked.
    pub fn proven_digest(&self) -> Option<&str> {
        (self.is_ok() && !self.quick && self.replaced_meanwhile.is_empty())
            .then_some(self.digest.as_str())
    }

    /// True when nothing is wrong.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }

    /// What is worth knowing but is not damage, one line each: the files an interrupted
    /// writer left, and the files hspack does not know.
    pub fn notes(&self) -> Vec<String> {
        let them = |files: &[PathBuf]| if files.len() == 1 { "it" } else { "them" };
        let mut notes = Vec::new();
        if !self.files_listed {
            notes.push(
                "the storage lists no folder (a dataset served over http(s)): files an \
                 interrupted writer left were not looked for; everything the manifest lists \
                 was checked"
                    .into(),
            );
        }
        if !self.leftovers.is_empty() {
            notes.push(format!(
                "{} not in the manifest ({}): being written by a writer that holds the dataset \
                 now, or left by an interrupted one, which reopening the dataset for writing \
                 removes once no writer holds it (no committed data is in {2})",
                count(self.leftovers.len() as u64, "file"),
                file_names(&self.leftovers),
                them(&self.leftovers),
            ));
        }
        if !self.replaced_meanwhile.is_empty() {
            notes.push(format!(
                "a writer committed while this ran: {} the manifest listed at the start ({}) \
                 {} replaced since, and {} not checked; the state checked is the one of digest \
                 {}; run verify again for the new one",
                count(self.replaced_meanwhile.len() as u64, "file"),
                file_names(&self.replaced_meanwhile),
                if self.replaced_meanwhile.len() == 1 {
                    "was"
                } else {
                    "were"
                },
                if self.replaced_meanwhile.len() == 1 {
                    "is"
                } else {
                    "are"
                },
                self.digest,
            ));
        }
        if !self.unknown_files.is_empty() {
            notes.push(format!(
                "{} not part of the dataset ({}): hspack does not use {2}; verify skipped {2}",
                count(self.unknown_files.len() as u64, "file"),
                file_names(&self.unknown_files),
                them(&self.unknown_files),
            ));
        }
        notes
    }
}

pub use crate::error::count;

fn file_names(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| {
            p.file_name().map_or_else(
                || p.display().to_string(),
                |f| f.to_string_lossy().into_owned(),
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Verifies the dataset in `dir`. `progress` is called with payload bytes as they are hashed.
/// Returns `Err` only when the manifest itself or the folder's listing cannot be read;
/// everything else is a problem (or a note) in the report.
pub fn verify(
    dir: impl Into<PathBuf>,
    options: VerifyOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Report> {
    verify_dataset(&Dataset::open(dir.into())?, options, progress)
}

/// [`verify`], for a dataset already open (in any storage). Opens every shard again, so
/// that nothing the dataset checked before is taken on trust.
pub fn verify_dataset(
    opened: &Dataset,
    options: VerifyOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Report> {
    let ds = Dataset::open_in(std::sync::Arc::clone(opened.storage()), Default::default())?;
    crate::failpoint::failpoint!("verify-opened");
    let manifest = ds.manifest();
    let schema = ds.schema();
    let mut problems = Vec::new();
    let (leftovers, unknown_files, files_listed) = match files_not_in_use(&ds) {
        Ok((leftovers, unknown)) => (leftovers, unknown, true),
        Err(Error::Unsupported { .. }) => (Vec::new(), Vec::new(), false),
        Err(e) => return Err(e),
    };
    let mut missing = Vec::new();
    let mut report = Report {
        shards: manifest.shards.len() as u64,
        samples: manifest.samples,
        chunk_headers: 0,
        chunks: 0,
        bytes_hashed: 0,
        // A decoded manifest's totals fit in u64: decoding checks them.
        shard_bytes: manifest.shard_bytes().unwrap_or(u64::MAX),
        problems: Vec::new(),
        leftovers,
        unknown_files,
        files_listed,
        digest: hex(blake3::hash(ds.manifest_bytes()).as_bytes()),
        quick: options.quick,
        replaced_meanwhile: Vec::new(),
    };
    let hashed = AtomicU64::new(0);
    // Every sample's key hash, to find a key given twice.
    let mut keys: Vec<u64> = Vec::new();
    // The shards that did not open, each reported once.
    let mut unopened = std::collections::HashSet::new();
    // A batch of shards at a time, each let go once checked: a process maps at most
    // `vm.max_map_count` regions (65530 by default), fewer than a large dataset's shards.
    for seqs in (0..manifest.shards.len())
        .collect::<Vec<_>>()
        .chunks(VERIFY_BATCH)
    {
        let mut shards: Vec<Arc<Shard>> = Vec::with_capacity(seqs.len());
        for &seq in seqs {
            match ds.open_shard(seq) {
                Ok(s) => shards.push(Arc::new(s)),
                Err(e) => {
                    unopened.insert(seq);
                    let record = &manifest.shards[seq];
                    problems.push(lost_under(e, || crate::read::shard::held_by(record)))
                }
            }
        }
        problems.extend(check_shards(&shards, schema, &options, &hashed, progress));
        if !options.quick {
            problems.extend(check_loss_rows(&ds, &shards));
        }
        keys.extend(shards.iter().flat_map(|s| key_hashes(s)));
        report.chunk_headers += shards.iter().map(|s| s.footer().chunk_count).sum::<u64>();
    }
    problems.extend(check_unique_keys(&ds, keys));
    if !options.quick {
        report.chunks = report.chunk_headers;
        report.bytes_hashed = hashed.into_inner();
    }
    problems.extend(check_samples_tables(&ds, &mut missing));
    problems.extend(check_key_runs(&ds, &mut missing, &unopened));
    let any_missing = !missing.is_empty();
    if !missing.is_empty()
        && ds.storage().read(MANIFEST_FILE)?.as_deref() != Some(ds.manifest_bytes())
    {
        // A writer committed meanwhile: a missing file the manifest now there no longer lists
        // was replaced by its merges, and a file that manifest lists is no leftover. A file
        // still listed and missing is damage all the same. (A manifest that does not load
        // leaves the report as it is.)
        if let Ok(Some((now, _))) = crate::read::load_manifest(&**ds.storage()) {
            let listed = now.listed_names();
            let name = |p: &PathBuf| p.file_name().map(|n| n.to_string_lossy().into_owned());
            let replaced: Vec<PathBuf> = missing
                .into_iter()
                .filter(|p| name(p).is_some_and(|n| !listed.contains(&n)))
                .collect();
            problems.retain(|e| !matches!(e, Error::KeyRun { path, .. } | Error::SamplesTable { path, .. } if replaced.contains(path)));
            report
                .leftovers
                .retain(|p| name(p).is_none_or(|n| listed.is_leftover(&n)));
            report.replaced_meanwhile = replaced;
        }
    }
    // The dataset removed, or another written under its name, while this ran: what it found
    // missing or other since is no damage, and no repair could mend it. One error says so.
    let moved = |e: &Error| {
        matches!(
            e,
            Error::DatasetRemoved { .. } | Error::DatasetRewritten { .. }
        )
    };
    let said_moved = problems.iter().any(moved);
    if said_moved || problems.iter().any(Error::is_damage) {
        if let Some(now) = ds.moved_on(said_moved || any_missing) {
            problems.retain(|e| !e.is_damage() && !moved(e));
            problems.push(now);
        }
    }
    report.problems = problems;
    Ok(report)
}

/// Shards [`verify_dataset`] opens and checks at a time, then lets go.
const VERIFY_BATCH: usize = 1024;

/// The problems of `shards`: each one's layout (with `options.quick`, headers and indexes
/// only), and every chunk's hash. Shards a storage maps are hashed chunk by chunk on every
/// core; the others (object storage) are scanned in file order, several shards at once, in
/// large reads.
fn check_shards(
    shards: &[Arc<Shard>],
    schema: &crate::format::Schema,
    options: &VerifyOptions,
    hashed: &AtomicU64,
    progress: &(dyn Fn(u64) + Sync),
) -> Vec<Error> {
    let scanned: Vec<Vec<Error>> = crate::parallel::install(|| {
        shards
            .par_iter()
            .map(|shard| {
                let hash = !options.quick && !shard.is_mapped();
                let (found, bytes) = check_layout(shard, schema, !options.quick, hash, progress);
                hashed.fetch_add(bytes, Ordering::Relaxed);
                found
            })
            .collect()
    });
    let mut problems: Vec<Error> = scanned.into_iter().flatten().collect();
    if options.quick {
        return problems;
    }
    let jobs: Vec<(usize, u64)> = shards
        .iter()
        .enumerate()
        .filter(|(_, s)| s.is_mapped())
        .flat_map(|(i, s)| (0..s.footer().chunk_count).map(move |c| (i, c)))
        .collect();
    let mut found: Vec<(usize, u64, Error)> = crate::parallel::install(|| {
        jobs.par_iter()
            .filter_map(|&(i, c)| {
                let shard = &shards[i];
                let e = shard.index().chunk(c)?;
                let result = shard.check_chunk_hash(c, &e, schema);
                // Hashed once: its pages need not stay in this process.
                shard.release(e.offset..e.offset + ChunkHeader::SIZE as u64 + e.stored_len);
                hashed.fetch_add(e.stored_len, Ordering::Relaxed);
                progress(e.stored_len);
                result.err().map(|err| (i, c, err))
            })
            .collect()
    });
    found.sort_by_key(|(i, c, _)| (*i, *c));
    problems.extend(found.into_iter().map(|(_, _, e)| e));
    problems
}

/// `err`, met opening a shard or reading a chunk: where a store lost what held it (a pack
/// gone, a blob damaged), with what that held (`held`: the shard's samples, or the chunk's
/// sample, field and rows), as damage in a plain dataset is named. It said only the pack.
fn lost_under(err: Error, held: impl FnOnce() -> String) -> Error {
    match err {
        Error::StoreDamage { path, detail } => Error::StoreDamage {
            path,
            detail: format!("{detail}; lost with it: {}", held()),
        },
        e => e,
    }
}

/// Each sample's `loss_rows` against the rows its loss mask sets (§3.2), where the schema has
/// one: a count that is not the mask's passes every hash (the writer recorded it), and a
/// trainer filtering by loss tokens would drop or keep the sample wrongly. In shards a
/// storage maps (a folder): elsewhere each mask would be a request of its own.
fn check_loss_rows(ds: &Dataset, shards: &[Arc<Shard>]) -> Vec<Error> {
    let Some(mask) = ds.schema().loss_mask_field() else {
        return Vec::new();
    };
    let row_bytes = ds.schema().fields[mask].row_bytes() as usize;
    let found: Vec<Vec<Error>> = crate::parallel::install(|| {
        shards
            .par_iter()
            .filter(|shard| shard.is_mapped())
            .map(|shard| {
                (0..shard.index().sample_count())
                    .filter_map(|i| {
                        let sample = ds.sample_of(shard, i)?;
                        // A mask that does not read is named by the chunk checks.
                        let read = sample.read_field(mask, None).ok()?;
                        let set = crate::format::loss_rows_of(read.bytes(), row_bytes);
                        let recorded = sample.loss_rows()?;
                        (set != recorded).then(|| Error::Format {
                            path: shard.path().to_path_buf(),
                            source: crate::format::FormatError::Invalid {
                                structure: "shard index",
                                what: "sample loss_rows",
                                value: recorded,
                                rule: format!(
                                    "{set}, the rows the loss mask of sample {} (`{}`) sets",
                                    sample.ordinal(),
                                    sample.key()
                                ),
                            },
                        })
                    })
                    .collect()
            })
            .collect()
    });
    found.into_iter().flatten().collect()
}

/// The hash of every key of `shard`, in ordinal order.
fn key_hashes(shard: &Shard) -> Vec<u64> {
    let index = shard.index();
    (0..index.sample_count())
        .filter_map(|i| Some(crate::format::key_hash(index.key_of(&index.sample(i)?)?)))
        .collect()
}

/// A key given to two samples (§3.2: keys are unique in the dataset; a shard's index refuses
/// a repeat within it, not one across shards). A read by key finds one of them only. Each
/// sample of a repeated key after the first is named. `hashes` are every key's hash (8 bytes
/// a sample are all verify holds for this); where two are equal, the samples are read to
/// compare their keys.
fn check_unique_keys(ds: &Dataset, mut hashes: Vec<u64>) -> Vec<Error> {
    hashes.sort_unstable();
    let repeated: std::collections::HashSet<u64> = hashes
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| w[0])
        .collect();
    drop(hashes);
    let mut problems = Vec::new();
    if repeated.is_empty() {
        return problems;
    }
    let mut seen: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    for ordinal in 0..ds.len() {
        // A sample that does not read is named by the other checks.
        let Ok(sample) = ds.sample(ordinal) else {
            continue;
        };
        if !repeated.contains(&crate::format::key_hash(sample.key())) {
            continue;
        }
        let key = sample.key().to_string();
        match seen.get(&key) {
            Some(&first) => problems.push(Error::Format {
                path: sample.shard().path().to_path_buf(),
                source: crate::format::FormatError::Invalid {
                    structure: "shard index",
                    what: "sample ordinal",
                    value: ordinal,
                    rule: format!(
                        "that of a sample with a key of its own: key `{key}` is sample \
                         {first}'s too (keys are unique in a dataset; a read by key finds one \
                         of them only)"
                    ),
                },
            }),
            None => {
                seen.insert(key, ordinal);
            }
        }
    }
    problems
}

/// Every chunk header against its index entry; with `padding` the padding between header,
/// chunks and index, which must be zero; with `hash` every payload against its BLAKE3 too
/// (`progress` gets the bytes hashed). Reading all of it, the shard is scanned in file order,
/// fetched [`SCAN_AHEAD`](crate::read::shard::SCAN_AHEAD) bytes at a time from a storage that
/// cannot map. Returns the problems and the payload bytes hashed.
pub(crate) fn check_layout(
    shard: &Shard,
    schema: &crate::format::Schema,
    padding: bool,
    hash: bool,
    progress: &(dyn Fn(u64) + Sync),
) -> (Vec<Error>, u64) {
    let mut problems = Vec::new();
    let mut hashed = 0;
    let index = shard.index();
    let index_at = shard.footer().index_offset;
    let scan = |range: std::ops::Range<u64>| match padding || hash {
        true => shard.scan_to(range, index_at),
        false => Ok(()),
    };
    let mut pos = ShardHeader::SIZE as u64;
    let check_gap = |from: u64, to: u64, problems: &mut Vec<Error>| {
        if !padding || from >= to {
            return;
        }
        if let Err(e) = scan(from..to).and_then(|()| shard.padding(from, to)) {
            problems.push(e);
        }
    };
    for c in 0..index.chunk_count() {
        let Some(e) = index.chunk(c) else { break };
        check_gap(pos, e.offset, &mut problems);
        let end = e.offset + ChunkHeader::SIZE as u64 + e.stored_len;
        let checked = match hash {
            true => scan(e.offset..end)
                .and_then(|()| shard.read(e.offset..end))
                .map_err(|err| lost_under(err, || shard.site(c, schema).to_string()))
                .and_then(|bytes| {
                    hashed += e.stored_len;
                    progress(e.stored_len);
                    shard.check_chunk_bytes(c, &e, &bytes, schema)
                }),
            false => shard.check_chunk_header(c, &e, schema),
        };
        if let Err(err) = checked {
            problems.push(err);
        }
        pos = end;
    }
    check_gap(pos, index_at, &mut problems);
    shard.forget_ahead();
    (problems, hashed)
}

/// The files of the folder that no committed data uses: those an interrupted writer left,
/// and the others, each sorted by name.
fn files_not_in_use(ds: &Dataset) -> Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    let manifest = ds.manifest();
    let mut used: std::collections::HashSet<&str> = manifest
        .shards
        .iter()
        .map(|s| s.file.as_str())
        .chain([
            MANIFEST_FILE,
            LOCK_FILE,
            crate::io::lock::COMMIT_LOCK_FILE,
            crate::io::object_lease::LEASE_FILE,
            crate::convert::keys::KEYS_FILE,
            crate::convert::job::REPORT_FILE,
        ])
        .collect();
    used.extend(manifest.listed_files().iter().map(|f| f.file));
    let listed = manifest.listed_names();
    let (mut leftovers, mut unknown) = (Vec::new(), Vec::new());
    let storage = ds.storage();
    for name in storage.list()? {
        if used.contains(name.as_str()) {
            continue;
        }
        match listed.is_leftover(&name) {
            true => leftovers.push(storage.path(&name)),
            false => unknown.push(storage.path(&name)),
        }
    }
    leftovers.sort();
    unknown.sort();
    Ok((leftovers, unknown))
}

/// The samples table (versions 1 to 3) or its parts (version 4), each against its length and
/// hash. A table is checked as everything else is, by its hash in the manifest; its parquet is
/// never decoded here (a decoder fed hostile bytes is a risk the hash makes needless).
fn check_samples_tables(ds: &Dataset, missing: &mut Vec<PathBuf>) -> Vec<Error> {
    let manifest = ds.manifest();
    let mut problems = Vec::new();
    for t in manifest.table_files() {
        let problem = |detail: String| Error::SamplesTable {
            path: ds.storage().path(&t.file),
            detail,
        };
        if let Err(detail) = read_listed(ds, &t.file, t.bytes, &t.blake3, missing) {
            problems.push(problem(detail));
        }
        if let Some(whole) = manifest
            .samples_table
            .as_ref()
            .filter(|w| w.samples != ds.len())
        {
            problems.push(problem(format!(
                "the manifest records {} rows, the dataset has {} samples",
                whole.samples,
                ds.len()
            )));
        }
    }
    problems
}

/// Whether the samples table (versions 1 to 3) or its parts (version 4) are as the manifest
/// records them: what `reindex` leaves alone.
pub(crate) fn samples_tables_intact(ds: &Dataset) -> bool {
    check_samples_tables(ds, &mut Vec::new()).is_empty()
}

/// Every key run (version 4) against its length and hash, its rules (§6.4), and the keys of
/// its segment's shards: one entry per sample, none missing, none more. `unopened`: the shards
/// the shard pass could not open, whose error it reported.
fn check_key_runs(
    ds: &Dataset,
    missing: &mut Vec<PathBuf>,
    unopened: &std::collections::HashSet<usize>,
) -> Vec<Error> {
    let manifest = ds.manifest();
    let mut problems = Vec::new();
    for (g, files) in manifest.segments.iter().zip(&manifest.segment_files) {
        let Some(run) = &files.keys else { continue };
        let problem = |detail: String| Error::KeyRun {
            path: ds.storage().path(&run.file),
            detail,
        };
        let bytes = match read_listed(ds, &run.file, run.bytes, &run.blake3, missing) {
            Ok(bytes) => bytes,
            Err(detail) => {
                problems.push(problem(detail));
                continue;
            }
        };
        let ordinals = g.first_ordinal..g.first_ordinal + g.samples;
        let found = match crate::format::segment::decode_key_run(&bytes, ordinals) {
            Ok(found) => found,
            Err(e) => {
                problems.push(problem(e.to_string()));
                continue;
            }
        };
        let mut want = Vec::with_capacity(found.len());
        let seqs = g.first_seq as usize..(g.first_seq + g.shards) as usize;
        // One shard mapped at a time (a segment may hold more than a process may map), each
        // let go once its keys are taken. A shard that does not open leaves this check
        // undone: said by the shard pass where it failed there too, else here (it passed
        // unsaid, and verify called the dataset intact).
        let mut unread = None;
        for seq in seqs {
            let shard = match ds.open_shard(seq) {
                Ok(shard) => shard,
                Err(e) => {
                    unread = Some((seq, e));
                    break;
                }
            };
            let index = shard.index();
            want.extend((0..index.sample_count()).filter_map(|i| {
                let entry = index.sample(i)?;
                Some(crate::format::segment::KeyRunEntry {
                    hash: crate::format::key_hash(index.key_of(&entry)?),
                    ordinal: entry.ordinal,
                })
            }));
        }
        if let Some((seq, e)) = unread {
            if !unopened.contains(&seq) {
                problems.push(e);
            }
            continue;
        }
        want.sort_unstable();
        if let Some(i) = (0..want.len().max(found.len())).find(|&i| want.get(i) != found.get(i)) {
            let said = |e: Option<&crate::format::segment::KeyRunEntry>| match e {
                Some(e) => format!("key hash {:016x} at sample {}", e.hash, e.ordinal),
                None => "nothing (past the end)".to_string(),
            };
            problems.push(problem(format!(
                "entry {i} holds {}, where the shards' key tables give {}",
                said(found.get(i)),
                said(want.get(i))
            )));
        }
    }
    problems
}

/// The bytes of a file the manifest lists, or why they are not what it records (a missing
/// one also added to `missing`).
fn read_listed(
    ds: &Dataset,
    file: &str,
    bytes: u64,
    blake3: &str,
    missing: &mut Vec<PathBuf>,
) -> std::result::Result<Vec<u8>, String> {
    // No more than the manifest records is read: a longer file is refused on its length.
    let found = match ds.storage().read_bounded(file, bytes) {
        Ok(Some(b)) => b,
        Ok(None) => {
            missing.push(ds.storage().path(file));
            return Err("the file is missing".into());
        }
        Err(e) => return Err(format!("cannot read it ({e})")),
    };
    let hash = hex(blake3::hash(&found).as_bytes());
    if found.len() as u64 > bytes {
        return Err(format!("more than the {bytes} bytes the manifest records"));
    }
    if found.len() as u64 != bytes || hash != blake3.to_ascii_lowercase() {
        return Err(format!(
            "{} bytes hashing to {hash}, the manifest records {bytes} bytes hashing to {blake3}",
            found.len(),
        ));
    }
    Ok(found)
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
