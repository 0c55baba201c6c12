//! Storage: where a dataset's files live, and the few things hspack asks of it.
//!
//! A dataset is a flat set of named files (FORMAT.md §1: a folder, or an object-store
//! prefix). Files are written whole, published once under their name and never changed
//! after; only the manifest is replaced, and only over the one its writer last read or wrote.
//! [`Storage`] is that contract: list the names, read a file (a range of it, or a view of the
//! whole where the backend can map), publish a new file where none is, replace the manifest
//! by compare-and-swap, delete, and hold the one-writer lock. Readers, writers and verify go
//! through it; [`LocalStorage`] is a folder (zero-copy maps, temp → fsync → link or rename →
//! fsync folder), [`MemoryStorage`] holds files in memory and can inject faults.
//!
//! Modelled on tantivy's `Directory` (atomic writes, ranged reads of immutable files) and
//! lance-io's `Reader` (size known, `get_range`).

pub mod aws_profile;
pub mod bytes;
pub mod cache;
pub(crate) mod held;
pub mod loan;
pub mod local;
pub mod lock;
pub mod memory;
pub mod mmap;
pub mod object;
pub mod object_lease;
mod object_upload;
mod power_cut;
pub mod recycle;
pub mod runtime;

use std::fmt::Debug;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::Result;
use crate::failpoint::failpoint;

pub use bytes::{AlignedBytes, FileBytes, MappingRef};
pub use local::LocalStorage;
pub use memory::{Faults, MemoryFile, MemoryStorage};
pub use object::ObjectStorage;

/// A storage's defaults for the layout options a writer leaves unset (see
/// [`Storage::write_defaults`]): a store's token blocks, so shared prefixes deduplicate, and
/// its packs' blob alignment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteDefaults {
    /// [`crate::WriteOptions::block_rows`].
    pub block_rows: Option<u64>,
    /// [`crate::WriteOptions::align_log2`].
    pub align_log2: Option<u8>,
}

/// A published file, for reading: its size is known and its bytes never change.
pub trait FileReader: Send + Sync + Debug {
    /// Bytes in the file.
    fn len(&self) -> u64;

    /// True when the file is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes `range`; fails when the range is not inside the file or the backend returns
    /// fewer bytes than asked (a short read is an error, never fewer bytes).
    fn read(&self, range: Range<u64>) -> Result<FileBytes>;

    /// The whole file, zero-copy, where the backend holds or maps it whole; `None` elsewhere.
    fn whole(&self) -> Option<FileBytes>;

    /// True when reads of ranges cost no copy (the file, or each of its parts, is mapped or
    /// held), so a reader has nothing to gain by fetching ahead.
    fn maps_ranges(&self) -> bool {
        self.whole().is_some()
    }

    /// What the backend calls this version of the file (an object's ETag or version id),
    /// where it has one: a file put again under its name (`hspack repair` sends a damaged
    /// shard again, with the same length and tail) is another version, so a cache of its
    /// bytes keyed by it never serves the old ones.
    fn version(&self) -> Option<&str> {
        None
    }
}

/// A file being written under a temp name: bytes written at offsets, then published under
/// its final name or abandoned.
pub trait NewFile: Send + Debug {
    /// Writes `bytes` at `offset`; bytes never written read as zeros.
    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> Result<()>;

    /// Pushes what was written towards durable storage now, so the final sync has little
    /// left to do.
    fn sync_data(&mut self) -> Result<()>;

    /// Makes every byte written durable.
    fn sync_all(&mut self) -> Result<()>;

    /// Publishes the file as `name` (after [`NewFile::sync_all`] for a durable file), never
    /// over a file that is there ([`crate::Error::CommitConflict`] then); with `durable`, the
    /// new name is made durable too. The temp file is gone either way.
    fn publish_new(self: Box<Self>, name: &str, durable: bool) -> Result<()>;

    /// Deletes the unfinished file.
    fn abandon(self: Box<Self>);

    /// True when the file keeps chunk payloads by their hash ([`NewFile::write_payload`]):
    /// a writer then hashes a payload before handing it over.
    fn keeps_payloads(&self) -> bool {
        false
    }

    /// Writes the payload of a chunk, whose BLAKE3 the writer computed from these bytes, at
    /// `offset`. A file of a store keeps it by its hash (stored once, not written where the
    /// store has it); every other file writes it as [`NewFile::write_at`] does.
    fn write_payload(&mut self, offset: u64, bytes: &[u8], hash: &[u8; 32]) -> Result<()> {
        let _ = hash;
        self.write_at(offset, bytes)
    }
}

/// The one-writer lock of a dataset, released when dropped by the process that took it.
pub trait WriterLease: Send + Sync + Debug {
    /// True in the process that took the lock; false in a child forked from it, which must
    /// neither release the lock nor touch the writer's files.
    fn is_owner(&self) -> bool;

    /// The token a writer writes into the manifest (`writer.lease`) where the lock is a lease
    /// that can expire and be taken over (object storage): a writer that takes a dataset over
    /// writes its token first, so the commits of the writer it took over from fail. `None`
    /// where the lock alone keeps other writers out while its holder lives.
    fn token(&self) -> Option<&str> {
        None
    }

    /// Fails when the lock is known to be lost (a lease another writer took over).
    fn check(&self) -> Result<()> {
        Ok(())
    }

    /// [`WriterLease::check`], after reading the lock again where it can be lost unnoticed
    /// (a lease whose holder stalled past its life and another took over): asked just before
    /// publishing what the lock alone fences (a copy's manifest, the source's bytes, can
    /// carry no token).
    fn confirm(&self) -> Result<()> {
        self.check()
    }
}

/// Where a dataset's files live.
pub trait Storage: Send + Sync + Debug {
    /// Where the dataset is, for messages: a folder, or a URL.
    fn root(&self) -> &Path;

    /// Where file `name` is, for messages.
    fn path(&self, name: &str) -> PathBuf {
        self.root().join(name)
    }

    /// Makes the root exist, for a new dataset.
    fn create_root(&self) -> Result<()>;

    /// Names of the files, in no order.
    fn list(&self) -> Result<Vec<String>>;

    /// The whole of a small file, or `None` when there is none.
    fn read(&self, name: &str) -> Result<Option<Vec<u8>>>;

    /// [`Storage::read`], for a file that must hold at most `max` bytes: a longer one comes
    /// back as its first `max + 1` bytes (where the backend can stop there, nothing more is
    /// read), so the caller refuses it without holding all of it.
    fn read_bounded(&self, name: &str, max: u64) -> Result<Option<Vec<u8>>> {
        Ok(self.read(name)?.map(|mut b| {
            b.truncate(usize::try_from(max.saturating_add(1)).unwrap_or(usize::MAX));
            b
        }))
    }

    /// A published file, for ranged reads.
    fn open(&self, name: &str) -> Result<Arc<dyn FileReader>>;

    /// Bytes in published file `name`, or `None` when there is none.
    fn size(&self, name: &str) -> Result<Option<u64>> {
        match self.open(name) {
            Ok(f) => Ok(Some(f.len())),
            Err(crate::Error::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Starts a file under the temp name `temp` (a name [`crate::format::Manifest::is_leftover`]
    /// knows, so that what a crashed writer leaves is removed).
    fn create(&self, temp: &str) -> Result<Box<dyn NewFile>>;

    /// Publishes `bytes` as `name`, never over a file that is there.
    fn put_new(&self, name: &str, bytes: &[u8], durable: bool) -> Result<()> {
        let mut file = self.create(&temp_name(name))?;
        file.write_at(0, bytes)?;
        if durable {
            file.sync_all()?;
        }
        failpoint!("atomic-temp-synced");
        file.publish_new(name, durable)
    }

    /// Replaces `name` with `bytes` atomically (readers see the old file or the new one),
    /// only when the file there now hashes to `expected` (BLAKE3); otherwise
    /// [`crate::Error::CommitConflict`] and nothing changes. `expected: None` replaces
    /// whatever is there (files derived from committed data, e.g. `samples.parquet`).
    fn replace(
        &self,
        name: &str,
        bytes: &[u8],
        expected: Option<blake3::Hash>,
        durable: bool,
    ) -> Result<()>;

    /// Deletes `name`; a file already gone is not an error.
    fn delete(&self, name: &str) -> Result<()>;

    /// Makes the deletions done so far durable.
    fn sync(&self) -> Result<()>;

    /// Where this storage keeps one copy of bytes that many files hold (a deduplicating
    /// store) and refers a new file to it unread: from now on, reads and checks such a copy
    /// first, and stores the bytes anew where it is damaged. True where that applies; a
    /// storage that writes every file whole says false. What `hspack repair` and a copy
    /// sending a shard again ask, so that what they send lands as sent.
    fn check_copies_found(&self) -> bool {
        false
    }

    /// True where new files are published into a batch that a read of one of them closes (a
    /// deduplicating store packs the blobs of many files and indexes them together): a copy
    /// then proves what it sent a group of files at a time, not each file as it lands, so
    /// that a dataset of many small shards is not stored a pack per shard.
    fn batches_new_files(&self) -> bool {
        false
    }

    /// Takes the dataset's one-writer lock, or says who holds it ([`crate::Error::Locked`]).
    fn lock(&self) -> Result<Box<dyn WriterLease>>;

    /// Joins the dataset as one of several writers appending at once
    /// (`WriteOptions::shared`), for the writer's life; refused while a sole writer holds
    /// it. `alone` runs first where this writer is the only one and may remove what
    /// interrupted writers left (a folder; in object storage leftovers are only removed by
    /// a sole writer).
    fn join(&self, alone: &mut dyn FnMut() -> Result<()>) -> Result<Box<dyn WriterLease>> {
        let _ = alone;
        Err(self.no_shared_writers())
    }

    /// Takes the lock that orders the commits of writers sharing the dataset, waiting for the
    /// one that holds it; held from reading the manifest to replacing it.
    fn commit_lock(&self) -> Result<Box<dyn WriterLease>> {
        Err(self.no_shared_writers())
    }

    /// How writers lay chunks out here unless told otherwise.
    fn write_defaults(&self) -> WriteDefaults {
        WriteDefaults::default()
    }

    /// The refusal of a storage that takes one writer at a time only.
    fn no_shared_writers(&self) -> crate::Error {
        crate::Error::Unsupported {
            path: self.root().to_path_buf(),
            detail: "this storage takes one writer at a time; write with shared off".into(),
        }
    }
}

/// 16 bytes no other call returns: the time, the process and `salt`, hashed.
pub fn unique_id(salt: &[u8]) -> [u8; 16] {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = blake3::Hasher::new();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    h.update(&now.as_nanos().to_le_bytes());
    h.update(&std::process::id().to_le_bytes());
    h.update(
        &CALLS
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .to_le_bytes(),
    );
    h.update(lock::host_name().as_bytes());
    h.update(salt);
    let mut id = [0u8; 16];
    id.copy_from_slice(&h.finalize().as_bytes()[..16]);
    id
}

/// The temp name `name` is written under until it is published.
pub fn temp_name(name: &str) -> String {
    format!("{name}{}", crate::format::manifest::TEMP_SUFFIX)
}

/// The storage of `dir`, a folder.
pub fn local(dir: impl AsRef<Path>) -> Arc<dyn Storage> {
    Arc::new(LocalStorage::new(dir.as_ref()))
}

/// The storage at `location`: a URL (`s3://bucket/prefix`, `gs://`, `az://`, `http(s)://`,
/// `file://`) or a folder.
pub fn open_location(location: impl AsRef<Path>) -> Result<Arc<dyn Storage>> {
    let location = location.as_ref();
    let text = location.to_string_lossy();
    match text.split_once("://") {
        Some(("file", path)) => Ok(local(path)),
        _ if is_remote(location) => Ok(Arc::new(ObjectStorage::open(&text)?)),
        _ => {
            refuse_mistyped_url(&text)?;
            Ok(local(location))
        }
    }
}

/// The URL schemes of the storages hspack reaches, and `file`.
const SCHEMES: [&str; 9] = [
    "s3", "gs", "gcs", "az", "azure", "abfs", "abfss", "http", "https",
];

/// Refuses a path that begins as a URL of object storage with a slash missing (`s3:/b/ds`,
/// `s3:b/ds`): taken for a folder, it would be written here, silently.
fn refuse_mistyped_url(text: &str) -> Result<()> {
    let Some((scheme, rest)) = text.split_once(':') else {
        return Ok(());
    };
    if !(SCHEMES.contains(&scheme.to_ascii_lowercase().as_str()) || scheme == "file") {
        return Ok(());
    }
    let bucket = rest.trim_start_matches('/');
    Err(crate::Error::BadOption {
        option: "location",
        detail: format!(
            "`{text}` would be a folder named `{scheme}:` here; a URL is written with two \
             slashes: `{scheme}://{bucket}`; for a folder of that name, write `./{text}`"
        ),
    })
}

/// True when `location` is a URL of object storage (`s3://`, `gs://`, `az://`, `http(s)://`),
/// not a folder (`file://` URLs are folders).
pub fn is_remote(location: &Path) -> bool {
    let text = location.to_string_lossy();
    matches!(text.split_once("://"), Some((scheme, _)) if scheme != "file" && is_scheme(scheme))
}

/// True for a URL scheme (RFC 3986: a letter, then letters, digits, `+`, `-`, `.`).
fn is_scheme(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
}

/// `got`, the bytes a backend returned for `range` of `path`, when they are all of them; a
/// short read is an error, never fewer bytes.
pub fn expect_whole(path: &Path, range: &Range<u64>, got: FileBytes) -> Result<FileBytes> {
    let want = range.end.saturating_sub(range.start);
    if got.len() as u64 == want {
        return Ok(got);
    }
    let (kind, what) = match (got.len() as u64) < want {
        true => (std::io::ErrorKind::UnexpectedEof, "a short read"),
        false => (std::io::ErrorKind::InvalidData, "more than asked for"),
    };
    Err(crate::Error::Io {
        path: path.to_path_buf(),
        op: "read",
        source: std::io::Error::new(
            kind,
            format!(
                "asked for bytes {}..{}, got {}: {what}; retry, and if it persists check the storage",
                range.start,
                range.end,
                got.len()
            ),
        ),
    })
}
