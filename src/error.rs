//! Errors of the reading, writing and verifying layers: each names the file, and where one is
//! concerned the sample, field and rows, and says what to do next.

use std::ops::Range;
use std::path::PathBuf;

use crate::format::FormatError;

/// Where a damaged chunk lies and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkSite {
    /// Shard file.
    pub shard: PathBuf,
    /// Chunk number in the shard.
    pub chunk: u64,
    /// Key of the (first) sample that uses the chunk.
    pub key: String,
    /// Ordinal of that sample.
    pub ordinal: u64,
    /// Field name.
    pub field: String,
    /// Rows of the sample held by the chunk.
    pub rows: Range<u64>,
}

impl std::fmt::Display for ChunkSite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: chunk {} (sample {} `{}`, field `{}`, rows {}..{})",
            self.shard.display(),
            self.chunk,
            self.ordinal,
            self.key,
            self.field,
            self.rows.start,
            self.rows.end
        )
    }
}

/// An error of hspack's dataset layers.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The operating system refused an operation.
    #[error("cannot {op} {}: {source}", path.display())]
    Io {
        /// File or folder.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// Cause.
        source: std::io::Error,
    },
    /// A structure of a file does not decode.
    #[error("{}: {source}", path.display())]
    Format {
        /// File.
        path: PathBuf,
        /// Cause.
        source: FormatError,
    },
    /// The folder has no manifest.
    #[error("{} is not an hspack dataset: {why}", path.display())]
    NotADataset {
        /// Folder.
        path: PathBuf,
        /// What is there instead, and what to do.
        why: String,
    },
    /// A dataset exists where a new one was to be created.
    #[error("{} already holds a dataset: open it to append, or choose another folder", path.display())]
    AlreadyExists {
        /// Folder.
        path: PathBuf,
    },
    /// A shard file does not match what the manifest records.
    #[error("{}: the manifest records {what} {expected}, the file has {found}: {held} is damaged, or was replaced since the manifest was written; restore it from an intact copy with `hspack repair DATASET --from COPY`", shard.display())]
    ShardMismatch {
        /// Shard file.
        shard: PathBuf,
        /// The shard and the samples it holds, in words: `shard 3 holding the samples of
        /// ordinals 24 to 31`.
        held: String,
        /// What differs.
        what: &'static str,
        /// Value in the manifest.
        expected: String,
        /// Value in the file.
        found: String,
    },
    /// A shard did not open as the manifest read at open records it because the dataset was
    /// written anew since (its manifest now names another dataset): the samples this reader's
    /// ordinals name are gone.
    #[error("{}: the dataset was written anew since this reader opened it (its manifest now names dataset {now}, the one opened was {opened}): the samples its ordinals named are gone; open the dataset again (in a training run, make the dataset object again)", path.display())]
    DatasetRewritten {
        /// The dataset.
        path: PathBuf,
        /// The dataset id when it was opened.
        opened: String,
        /// The dataset id its manifest names now.
        now: String,
    },
    /// A shard did not open because the dataset was removed since the reader opened it (no
    /// manifest is there now: a folder deleted, or `store rm` then `store gc`).
    #[error("{}: the dataset was removed since this reader opened it (no manifest is there now; in a store, `store rm`, and `store gc` collected its blobs): the samples its ordinals named are gone; nothing is damaged", path.display())]
    DatasetRemoved {
        /// The dataset.
        path: PathBuf,
    },
    /// A shard belongs to another dataset.
    #[error("{}: the shard belongs to dataset {found}, this dataset is {expected}: a file from another dataset was copied in; copy the right shard from the source", shard.display())]
    ForeignShard {
        /// Shard file.
        shard: PathBuf,
        /// Id in the manifest.
        expected: String,
        /// Id in the shard.
        found: String,
    },
    /// A chunk's bytes do not hash to the value in the index.
    #[error("{site}: stored bytes hash to {found}, the index records {expected}: the data is damaged; copy this shard again from the source")]
    ChecksumMismatch {
        /// Where.
        site: Box<ChunkSite>,
        /// Hash in the index, hex.
        expected: String,
        /// Hash of the bytes, hex.
        found: String,
    },
    /// A chunk header does not describe the chunk the index expects there.
    #[error("{site}: the chunk header holds {what} {found}, the index expects {expected}: chunks were shifted or swapped by a bad copy; copy this shard again")]
    ChunkMisplaced {
        /// Where.
        site: Box<ChunkSite>,
        /// Which header value differs.
        what: &'static str,
        /// Value the index expects.
        expected: u64,
        /// Value in the header.
        found: u64,
    },
    /// A chunk header or payload does not decode.
    #[error("{site}: {source}")]
    BadChunk {
        /// Where.
        site: Box<ChunkSite>,
        /// Cause.
        source: FormatError,
    },
    /// Bytes that must be zero (alignment padding) are not.
    #[error("{}: padding at byte {offset} is not zero: the file is damaged; copy it again", shard.display())]
    DirtyPadding {
        /// Shard file.
        shard: PathBuf,
        /// Offset of the first non-zero byte.
        offset: u64,
    },
    /// The samples table does not match the manifest.
    #[error("{}: {detail}: rewrite it from the shards with `hspack reindex DATASET`", path.display())]
    SamplesTable {
        /// Table file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// A key run (manifest version 4) does not match its segment or its shards.
    #[error("{}: {detail}: rewrite it from the shards with `hspack reindex DATASET`, or restore it from an intact copy with `hspack repair DATASET --from COPY`", path.display())]
    KeyRun {
        /// Key run file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// An ordinal past the end.
    #[error("sample {ordinal} does not exist: the dataset has {len} samples (0..{len})")]
    NoSuchSample {
        /// Ordinal asked for.
        ordinal: u64,
        /// Samples in the dataset.
        len: u64,
    },
    /// A key that no sample has.
    #[error("no sample has key `{key}`: list the keys with `hspack ls DATASET`")]
    NoSuchKey {
        /// Key asked for.
        key: String,
    },
    /// A field the schema does not have.
    #[error("the schema has no field `{name}`; it has: {available}")]
    NoSuchField {
        /// Name asked for.
        name: String,
        /// Names the schema has.
        available: String,
    },
    /// Rows outside a sample.
    #[error("rows {start}..{end} are outside sample `{key}`, which has {rows} rows")]
    RowsOutOfRange {
        /// Sample key.
        key: String,
        /// Start asked for.
        start: u64,
        /// End asked for.
        end: u64,
        /// Rows in the sample.
        rows: u64,
    },
    /// A sample to append does not fit the schema.
    #[error("sample `{key}`, field `{field}`: {detail}")]
    BadSample {
        /// Sample key.
        key: String,
        /// Field name.
        field: String,
        /// What is wrong and what was expected.
        detail: String,
    },
    /// A key already in the dataset.
    #[error("sample key `{key}` is already in the dataset: keys are unique (skip it with `contains_key`, in Python `Writer.contains`, to resume)")]
    DuplicateKey {
        /// Key.
        key: String,
    },
    /// A commit of a writer sharing its dataset found one of its keys committed by another.
    #[error("{}: sample key `{key}` was committed first by another writer sharing the dataset, so this writer's commit of {samples} samples was refused and none of them is committed; give each writer its own keys, then append what is missing again (`contains_key`, in Python `Writer.contains`, says which)", path.display())]
    KeyTaken {
        /// The dataset.
        path: PathBuf,
        /// The key.
        key: String,
        /// Samples of the refused commit.
        samples: u64,
    },
    /// Appending a sample failed before any of it was written into the open shard (a new
    /// shard could not be made, a write into an empty one failed): the writer goes on, and
    /// the sample can be appended again once the cause is gone.
    #[error("`{key}` was not appended, and nothing of it is in the dataset: {cause}. The writer goes on: {}, then append `{key}` again", remedy(cause))]
    NotAppended {
        /// The sample's key.
        key: String,
        /// What failed.
        cause: Box<Error>,
    },
    /// A writer whose open shard could not be committed: its commit failed (inside `append`,
    /// the shard being full, or asked for), or a write into it failed part way. The samples
    /// it held, accepted (and given ordinals) by earlier appends, may not be in the dataset;
    /// the writer takes no more samples, so none of their ordinals is given again.
    #[error("{}: {commit}", path.display())]
    WriterStopped {
        /// The dataset.
        path: PathBuf,
        /// The commit that failed.
        commit: Box<StoppedCommit>,
    },
    /// Appending (or merging) with a schema other than the dataset's.
    #[error("{}: {detail}", path.display())]
    SchemaMismatch {
        /// Folder.
        path: PathBuf,
        /// What differs.
        detail: String,
    },
    /// Another writer holds the dataset.
    #[error("{}: another writer holds this dataset ({holder}); wait for it to finish, or stop it (a folder's lock is released when its process ends; a lease in object storage expires once its writer stops renewing it)", path.display())]
    Locked {
        /// Folder.
        path: PathBuf,
        /// Who holds the lock, as its lock file says.
        holder: String,
    },
    /// A commit found the dataset changed under it: it published nothing over what it found.
    #[error("{}: {detail}; another writer changed the dataset while this one held it, so nothing was replaced and this writer's uncommitted samples were not committed; reopen the dataset to append after what is there", path.display())]
    CommitConflict {
        /// The file that was not replaced.
        path: PathBuf,
        /// What was found.
        detail: String,
    },
    /// A writer used in a process forked from the one that opened it.
    #[error("{}: this writer was opened by the parent of this forked process, which holds the dataset; open a writer in this process once the parent's is finished", path.display())]
    ForkedWriter {
        /// Folder.
        path: PathBuf,
    },
    /// The storage cannot do what was asked.
    #[error("{}: {detail}", path.display())]
    Unsupported {
        /// The dataset or file.
        path: PathBuf,
        /// What it cannot do, and what to do instead.
        detail: String,
    },
    /// A store refused what was asked.
    #[error("{}: {detail}", path.display())]
    Store {
        /// The store, dataset or file.
        path: PathBuf,
        /// Why, and what to do instead.
        detail: String,
    },
    /// A store's file does not hold what its record says.
    #[error("{}: {detail}", path.display())]
    StoreDamage {
        /// The damaged file.
        path: PathBuf,
        /// What does not match, and what to do.
        detail: String,
    },
    /// A copy was refused before anything was sent.
    #[error("cannot copy to {}: {detail}", path.display())]
    CopyRefused {
        /// The destination.
        path: PathBuf,
        /// Why, and what to do instead.
        detail: String,
    },
    /// A bad option value.
    #[error("option {option}: {detail}")]
    BadOption {
        /// Option name.
        option: &'static str,
        /// What is wrong.
        detail: String,
    },
}

impl Error {
    /// Whether this error, met reading the committed data of a dataset that opened, is damage
    /// that `verify` reports as a problem (exit code 1 in the command line), rather than a
    /// wrong argument or an unreadable input: a checksum or chunk that does not match its
    /// index, dirty padding, a shard replaced, foreign, undecodable or missing (or something
    /// else than a file under its name), a damaged samples table or key run.
    pub fn is_damage(&self) -> bool {
        match self {
            Error::ChecksumMismatch { .. }
            | Error::ChunkMisplaced { .. }
            | Error::BadChunk { .. }
            | Error::DirtyPadding { .. }
            | Error::ShardMismatch { .. }
            | Error::ForeignShard { .. }
            | Error::SamplesTable { .. }
            | Error::KeyRun { .. }
            | Error::StoreDamage { .. } => true,
            // A dataset or store a newer hspack wrote is not damage: this one cannot read it.
            Error::Format { source, .. } => {
                !crate::format::version::written_by_a_newer_hspack(source)
            }
            Error::Io { source, .. } => not_there_as_a_file(source),
            _ => false,
        }
    }
}

/// True for a file that is not there as a file (gone, or a folder, FIFO or device under its
/// name): no retry reads it, so it is damage. Other failed reads say nothing of the bytes.
pub(crate) fn not_there_as_a_file(source: &std::io::Error) -> bool {
    use std::io::ErrorKind::{IsADirectory, NotADirectory, NotFound};
    matches!(source.kind(), NotFound | IsADirectory | NotADirectory)
        || source.raw_os_error() == Some(libc::ENODEV)
        || crate::io::local::is_not_a_file(source)
}

/// `n` and `noun`, in the plural unless `n` is 1: "1 shard", "2 shards".
pub fn count(n: u64, noun: &str) -> String {
    match n {
        1 => format!("1 {noun}"),
        _ => format!("{n} {noun}s"),
    }
}

/// Result of the dataset layers.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Adds a path to an I/O error.
pub(crate) fn io(
    path: impl Into<PathBuf>,
    op: &'static str,
) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.into();
    move |source| Error::Io { path, op, source }
}

/// Adds a path to a format error.
pub(crate) fn format(path: impl Into<PathBuf>) -> impl FnOnce(FormatError) -> Error {
    let path = path.into();
    move |source| Error::Format { path, source }
}

/// What to do before appending again after `cause` ([`Error::NotAppended`]).
fn remedy(cause: &Error) -> &'static str {
    use std::io::ErrorKind;
    match cause {
        Error::Io { source, .. }
            if matches!(
                source.kind(),
                ErrorKind::StorageFull | ErrorKind::QuotaExceeded
            ) =>
        {
            "free space where the dataset is"
        }
        _ => "remove the cause",
    }
}

/// What stopped a writer ([`Error::WriterStopped`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopCause {
    /// Appending this key first committed the full open shard, and that commit failed.
    CommitBefore(String),
    /// Writing this key's sample into the open shard failed part way: the shard holds bytes
    /// its index does not list and is not committed.
    Write(String),
    /// A commit asked for (`commit`, `finish`) failed.
    Commit,
}

/// The open shard's commit that failed and stopped a writer ([`Error::WriterStopped`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoppedCommit {
    /// What failed.
    pub what: StopCause,
    /// Samples of the open shard, now not committed.
    pub samples: u64,
    /// Its first key.
    pub first: String,
    /// Its last key.
    pub last: String,
    /// Its ordinals, where the writer gave them (not when sharing the dataset).
    pub ordinals: Option<std::ops::RangeInclusive<u64>>,
    /// Why the commit failed.
    pub cause: String,
}

impl std::fmt::Display for StoppedCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let StoppedCommit {
            what,
            samples,
            first,
            last,
            ordinals,
            cause,
        } = self;
        let ordinals = match ordinals {
            Some(o) => format!(", ordinals {} to {}", o.start(), o.end()),
            None => String::new(),
        };
        let (failed, not_appended) = match what {
            StopCause::CommitBefore(key) => (
                format!(
                    "appending `{key}` first commits the full open shard, and that commit \
                     failed ({cause})"
                ),
                format!(", and `{key}` was not appended"),
            ),
            StopCause::Write(key) => (
                format!(
                    "writing `{key}` into the open shard failed part way ({cause}), so that \
                     shard is not committed"
                ),
                format!(", and `{key}` was not appended"),
            ),
            StopCause::Commit => (
                format!("the commit of the open shard failed ({cause})"),
                String::new(),
            ),
        };
        write!(
            f,
            "this writer stopped: {failed}. Its {samples} samples (`{first}` to \
             `{last}`{ordinals}) may not be in the dataset{not_appended}; open the dataset \
             again (writing resumes after its last commit) and append from `{first}` on \
             (`contains_key`, in Python `Writer.contains`, says which samples it holds)"
        )
    }
}
