//! A local, size-bounded cache of the files a dataset reads from object storage, so that
//! the second and later epochs of a training run read local disk instead of the network.
//!
//! [`CachedStorage`] wraps a [`Storage`] and delegates everything to it except
//! [`Storage::open`]: the reader it returns serves ranged reads from fixed-size, aligned
//! blocks ([`BLOCK`] bytes; a file's last block may be short) kept as files in a local folder,
//! and fetches only the blocks missing there, contiguous missing blocks in one read of the
//! wrapped storage. Files the wrapped storage maps (a local folder's) pass through: they are
//! read in place already. Reads inside a file's last [`TAIL`] bytes go straight to the wrapped
//! reader too, which for object storage holds them since open.
//!
//! A block file is named by a key that no other object can share: the BLAKE3 of the storage
//! root, the file name, its length, its last 128 bytes (a shard's footer, which holds its
//! index hash), its version where the backend names one (an object's version id or ETag: a
//! shard put again whole by `hspack repair` is another version) and the block size. It starts with a BLAKE3 of its payload keyed by that key
//! (and the block number), checked on every hit: a damaged or truncated block file is deleted
//! and fetched again, never served. Above that, the bytes go through the shard reader's own
//! chunk checks (`CheckPolicy`) exactly as uncached bytes do.
//!
//! Several processes (DataLoader workers) may share the folder: blocks are written under a
//! temp name and renamed, so a reader never sees half of one. When the folder grows past
//! `max_bytes`, the least recently used blocks (by modification time, touched on each hit)
//! are deleted until it holds about 90% of that; blocks other processes delete or add
//! meanwhile are taken in stride. Only files named as the cache names its blocks and temp
//! files are ever deleted: the folder may hold others. The cache never fails a read: a folder
//! that cannot be written (or a full disk) leaves the read to the wrapped storage, counted in
//! [`CacheStats::failed_writes`]; while it keeps nothing (a write failed within the last
//! [`KEEPS_NOTHING_FOR`], or a bound under one block, `cache_bytes=0`), missing blocks are not
//! fetched whole, only the bytes asked for (fetching 4 MiB blocks it could not keep made a
//! read of a few rows cost tens of times the traffic of no cache).

use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::error::{Error, Result};

use super::bytes::{AlignedBytes, Backing, FileBytes};
use super::{FileReader, NewFile, Storage, WriterLease};

/// Bytes in a cached block (the last block of a file may be shorter).
pub const BLOCK: u64 = 4 << 20;

/// Bytes at the end of a file that are read from the wrapped reader, not cached: object
/// storage fetches them when it opens a file and serves them without another request.
pub const TAIL: u64 = super::object::TAIL;

/// The cache's size when none is given: 64 GiB.
pub const DEFAULT_MAX_BYTES: u64 = 64 << 30;

/// Temp files this process has created, for their names.
static TEMPS: AtomicU64 = AtomicU64::new(0);

/// Bytes of the checksum at the start of each block file.
const CHECKSUM: usize = 32;

/// The last bytes of a file that go into its key (a shard's footer).
const KEY_TAIL: u64 = 128;

/// Verified blocks kept in memory per cache, so small reads of one block do not read and
/// hash it again each time.
const RECENT: usize = 4;

/// Temp files older than this were left by a process that died; eviction removes them.
const STALE_TEMP: Duration = Duration::from_secs(600);

/// How long after a failed block write the cache keeps nothing: reads fetch only what they
/// ask for, then a write is tried again.
pub const KEEPS_NOTHING_FOR: Duration = Duration::from_secs(60);

/// Where the cache lives and how large it may grow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheOptions {
    /// The folder (made on first write); processes given the same folder share it.
    pub dir: PathBuf,
    /// Bytes the folder may hold before the least recently used blocks are deleted.
    pub max_bytes: u64,
}

impl CacheOptions {
    /// A cache in `dir` of [`DEFAULT_MAX_BYTES`].
    pub fn new(dir: impl Into<PathBuf>) -> CacheOptions {
        CacheOptions {
            dir: dir.into(),
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }
}

/// What a cache did, in this process, since it was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Blocks served from the cache.
    pub hits: u64,
    /// Blocks fetched from the wrapped storage.
    pub misses: u64,
    /// Reads of the wrapped storage that filled blocks (contiguous missing blocks are
    /// fetched in one).
    pub fetches: u64,
    /// Bytes fetched from the wrapped storage to fill blocks.
    pub fetched_bytes: u64,
    /// Bytes of reads served from cached blocks.
    pub served_bytes: u64,
    /// Bytes of reads passed to the wrapped reader: inside a file's tail, or while the cache
    /// keeps nothing.
    pub passed_bytes: u64,
    /// Block files found damaged (wrong length or checksum), deleted and fetched again.
    pub damaged: u64,
    /// Block files deleted to keep the folder under its bound.
    pub evicted: u64,
    /// Blocks that could not be written (folder not writable, disk full).
    pub failed_writes: u64,
}

#[derive(Debug, Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    fetches: AtomicU64,
    fetched_bytes: AtomicU64,
    served_bytes: AtomicU64,
    passed_bytes: AtomicU64,
    damaged: AtomicU64,
    evicted: AtomicU64,
    failed_writes: AtomicU64,
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// A block file's contents: the keyed checksum, then the payload.
type BlockFile = Arc<Vec<u8>>;

/// A block: its file's key and its number.
type BlockId = ([u8; 32], u64);

/// Blocks verified lately, oldest first.
type Recent = VecDeque<(BlockId, BlockFile)>;

/// A folder of cached blocks; cheap to clone (clones share the counters).
#[derive(Debug, Clone)]
pub struct ChunkCache {
    inner: Arc<CacheInner>,
}

struct CacheInner {
    dir: PathBuf,
    max_bytes: u64,
    block: u64,
    tail: u64,
    counters: Counters,
    /// The folder's size as last measured, plus what this process wrote since.
    estimate: AtomicU64,
    /// Bytes this process wrote since it last measured the folder.
    since_scan: AtomicU64,
    /// True once this process measured the folder.
    scanned: AtomicBool,
    /// One eviction at a time in this process.
    evicting: Mutex<()>,
    /// Blocks verified lately: (key, block number) and the block file.
    recent: Mutex<Recent>,
    /// When a block write last failed (seconds since the Unix epoch; 0: never).
    failed_at: AtomicU64,
}

impl std::fmt::Debug for CacheInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkCache")
            .field("dir", &self.dir)
            .field("max_bytes", &self.max_bytes)
            .field("block", &self.block)
            .finish()
    }
}

impl ChunkCache {
    /// A cache per `options`, of [`BLOCK`]-byte blocks, with each file's last [`TAIL`] bytes
    /// left to the wrapped reader.
    pub fn new(options: CacheOptions) -> ChunkCache {
        ChunkCache::with_geometry(options, BLOCK, TAIL)
    }

    /// A cache of `block`-byte blocks (at least 1) whose files' last `tail` bytes are left to
    /// the wrapped reader: smaller blocks for tests and tuning. Blocks of different sizes
    /// never share a key.
    pub fn with_geometry(options: CacheOptions, block: u64, tail: u64) -> ChunkCache {
        ChunkCache {
            inner: Arc::new(CacheInner {
                dir: options.dir,
                max_bytes: options.max_bytes,
                block: block.max(1),
                tail,
                counters: Counters::default(),
                estimate: AtomicU64::new(0),
                since_scan: AtomicU64::new(0),
                scanned: AtomicBool::new(false),
                evicting: Mutex::new(()),
                recent: Mutex::new(VecDeque::new()),
                failed_at: AtomicU64::new(0),
            }),
        }
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Bytes the folder may hold.
    pub fn max_bytes(&self) -> u64 {
        self.inner.max_bytes
    }

    /// Bytes in a block.
    pub fn block_bytes(&self) -> u64 {
        self.inner.block
    }

    /// What the cache did so far, in this process.
    pub fn stats(&self) -> CacheStats {
        let c = &self.inner.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CacheStats {
            hits: get(&c.hits),
            misses: get(&c.misses),
            fetches: get(&c.fetches),
            fetched_bytes: get(&c.fetched_bytes),
            served_bytes: get(&c.served_bytes),
            passed_bytes: get(&c.passed_bytes),
            damaged: get(&c.damaged),
            evicted: get(&c.evicted),
            failed_writes: get(&c.failed_writes),
        }
    }

    /// Bytes the cache's block files hold now (temp files not counted).
    pub fn size_on_disk(&self) -> u64 {
        self.blocks().iter().map(|b| b.len).sum()
    }

    fn counters(&self) -> &Counters {
        &self.inner.counters
    }

    /// The key of a file: no other object, in this storage or another, nor another version
    /// of it (`version`, where the backend names versions), has it.
    fn key(
        &self,
        root: &Path,
        name: &str,
        len: u64,
        tail: &[u8],
        version: Option<&str>,
    ) -> [u8; 32] {
        let mut h = blake3::Hasher::new_derive_key("hspack 2025 chunk cache block key v2");
        let root = root.as_os_str().as_encoded_bytes();
        let version = version.unwrap_or_default().as_bytes();
        for part in [root, name.as_bytes(), tail, version] {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part);
        }
        h.update(&len.to_le_bytes());
        h.update(&self.inner.block.to_le_bytes());
        *h.finalize().as_bytes()
    }

    /// True while blocks are not kept: a bound under one block, or a write failed lately.
    fn keeps_nothing(&self) -> bool {
        let failed = self.inner.failed_at.load(Ordering::Relaxed);
        self.inner.max_bytes < self.inner.block
            || (failed > 0 && unix_secs().saturating_sub(failed) < KEEPS_NOTHING_FOR.as_secs())
    }

    fn block_path(&self, key: &[u8; 32], n: u64) -> PathBuf {
        let key = blake3::Hash::from(*key).to_hex();
        self.inner.dir.join(format!("{key}-{n:x}.blk"))
    }

    /// The checksum a block file starts with.
    fn checksum(key: &[u8; 32], n: u64, payload: &[u8]) -> [u8; 32] {
        let mut h = blake3::Hasher::new_keyed(key);
        h.update(&n.to_le_bytes());
        h.update(payload);
        *h.finalize().as_bytes()
    }

    /// The blocks read last; `None` in a child forked while another thread held them (it
    /// then reads block files without them, never hangs).
    fn recent(&self) -> Option<std::sync::MutexGuard<'_, Recent>> {
        crate::per_process::lock_for_an_instant(&self.inner.recent)
    }

    fn remember(&self, id: BlockId, file: BlockFile) {
        let Some(mut recent) = self.recent() else {
            return;
        };
        recent.retain(|(i, _)| *i != id);
        if recent.len() >= RECENT {
            recent.pop_front();
        }
        recent.push_back((id, file));
    }

    /// Block `n` of the file `key`, `len` payload bytes, when the cache holds it intact. A
    /// block file of the wrong length or checksum is deleted.
    fn load(&self, key: &[u8; 32], n: u64, len: u64) -> Option<BlockFile> {
        let hit = (self.recent()).and_then(|r| {
            r.iter()
                .find(|(i, _)| *i == (*key, n))
                .map(|(_, f)| Arc::clone(f))
        });
        if hit.is_some() {
            return hit;
        }
        let path = self.block_path(key, n);
        // Not a blocking open: a FIFO under a block's name would hang every reader.
        let mut f = match super::local::open_regular(&path) {
            Ok(f) => f,
            Err(e) if super::local::is_not_a_file(&e) => {
                // Something else under the block's name (a FIFO, a folder): damage, removed
                // where it can be (a folder only when empty), so the block can be kept again.
                add(&self.counters().damaged, 1);
                let _ = std::fs::remove_file(&path).or_else(|_| std::fs::remove_dir(&path));
                return None;
            }
            // Not there, or a folder that cannot be read: a miss.
            Err(_) => return None,
        };
        let want = len + CHECKSUM as u64;
        let mut bytes = Vec::new();
        let read = f.metadata().ok().filter(|m| m.len() == want).and_then(|_| {
            bytes.reserve_exact(want as usize);
            f.read_to_end(&mut bytes).ok()
        });
        let (sum, payload) = bytes.split_at(CHECKSUM.min(bytes.len()));
        if read.is_none()
            || bytes.len() as u64 != want
            || sum != ChunkCache::checksum(key, n, payload)
        {
            add(&self.counters().damaged, 1);
            let _ = std::fs::remove_file(&path);
            return None;
        }
        let _ = f.set_modified(SystemTime::now()); // recently used
        let file = Arc::new(bytes);
        self.remember((*key, n), Arc::clone(&file));
        Some(file)
    }

    /// Writes block `n` of file `key`; a failure is counted, never returned.
    fn store(&self, key: &[u8; 32], n: u64, payload: &[u8]) {
        let mut file = Vec::with_capacity(CHECKSUM + payload.len());
        file.extend_from_slice(&ChunkCache::checksum(key, n, payload));
        file.extend_from_slice(payload);
        let path = self.block_path(key, n);
        let written = self.publish(&path, &file).or_else(|e| {
            match e.kind() == std::io::ErrorKind::NotFound {
                true => std::fs::create_dir_all(&self.inner.dir)
                    .and_then(|()| self.publish(&path, &file)),
                false => Err(e),
            }
        });
        match written {
            Ok(()) => {
                let len = file.len() as u64;
                self.inner.estimate.fetch_add(len, Ordering::Relaxed);
                self.inner.since_scan.fetch_add(len, Ordering::Relaxed);
                self.remember((*key, n), Arc::new(file));
                self.evict_if_needed();
            }
            Err(_) => {
                add(&self.counters().failed_writes, 1);
                self.inner
                    .failed_at
                    .store(unix_secs().max(1), Ordering::Relaxed);
            }
        }
    }

    /// Writes `bytes` under a temp name beside `path`, then renames it to `path`. The temp
    /// name is unique in the folder: the process id and a counter shared by every cache of
    /// the process (two caches of one process on one folder must not share a temp). No fsync:
    /// a block damaged by a crash fails its checksum and is fetched again.
    fn publish(&self, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let temp = self.inner.dir.join(format!(
            ".{name}.{}.{}.tmp",
            std::process::id(),
            TEMPS.fetch_add(1, Ordering::Relaxed)
        ));
        let written = File::create(&temp)
            .and_then(|mut f| f.write_all(bytes))
            .and_then(|()| std::fs::rename(&temp, path));
        if written.is_err() {
            let _ = std::fs::remove_file(&temp);
        }
        written
    }

    /// [`ChunkCache::evict_if_needed`], where this process never measured the folder.
    fn evict_if_never_measured(&self) {
        if !self.inner.scanned.load(Ordering::Relaxed) {
            self.evict_if_needed();
        }
    }

    /// Deletes the least recently used blocks when the folder may be over its bound: when
    /// this process's estimate says so, or when it wrote a sixteenth of the bound since it
    /// last measured (other processes write too).
    fn evict_if_needed(&self) {
        let inner = &self.inner;
        let over = inner.estimate.load(Ordering::Relaxed) > inner.max_bytes;
        let stale = inner.since_scan.load(Ordering::Relaxed) >= inner.max_bytes / 16
            || !inner.scanned.load(Ordering::Relaxed);
        if !(over || stale) {
            return;
        }
        let Ok(_one) = inner.evicting.try_lock() else {
            return; // another thread of this process is at it
        };
        inner.since_scan.store(0, Ordering::Relaxed);
        inner.scanned.store(true, Ordering::Relaxed);
        let mut blocks = self.blocks();
        let mut total: u64 = blocks.iter().map(|b| b.len).sum();
        if total > inner.max_bytes {
            let keep = inner.max_bytes / 10 * 9;
            blocks.sort_by_key(|b| b.used);
            for b in blocks {
                if total <= keep {
                    break;
                }
                match std::fs::remove_file(&b.path) {
                    Ok(()) => add(&self.counters().evicted, 1),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {} // another process
                    Err(_) => continue,
                }
                total -= b.len;
            }
        }
        inner.estimate.store(total, Ordering::Relaxed);
    }

    /// The block files in the folder, as found (files that vanish meanwhile are skipped);
    /// temp files a dead process left are removed.
    fn blocks(&self) -> Vec<Found> {
        let Ok(entries) = std::fs::read_dir(&self.inner.dir) else {
            return Vec::new();
        };
        let now = SystemTime::now();
        let mut found = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let Ok(meta) = entry.metadata() else { continue };
            let used = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            if is_block_name(&name) && meta.is_file() {
                found.push(Found {
                    path: entry.path(),
                    len: meta.len(),
                    used,
                });
            } else if is_temp_name(&name)
                && now.duration_since(used).is_ok_and(|age| age > STALE_TEMP)
            {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        found
    }
}

/// Seconds since the Unix epoch.
fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// True for a name as [`ChunkCache::block_path`] makes them: `<64 hex>-<hex>.blk`. Eviction
/// deletes no other file (a user's `disk-image.blk` in a shared folder was deleted).
fn is_block_name(name: &str) -> bool {
    let hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
    name.strip_suffix(".blk")
        .and_then(|stem| stem.split_once('-'))
        .is_some_and(|(key, n)| key.len() == 64 && hex(key) && hex(n))
}

/// True for a temp name as [`ChunkCache::publish`] makes them: `.<block name>.<pid>.<n>.tmp`.
fn is_temp_name(name: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    name.strip_prefix('.')
        .and_then(|s| s.strip_suffix(".tmp"))
        .and_then(|s| s.split_once(".blk."))
        .is_some_and(|(stem, rest)| {
            is_block_name(&format!("{stem}.blk"))
                && rest
                    .split_once('.')
                    .is_some_and(|(p, n)| digits(p) && digits(n))
        })
}

/// A block file found in the folder.
struct Found {
    path: PathBuf,
    len: u64,
    used: SystemTime,
}

/// A [`Storage`] whose files are read through a [`ChunkCache`].
#[derive(Debug, Clone)]
pub struct CachedStorage {
    inner: Arc<dyn Storage>,
    cache: ChunkCache,
}

impl CachedStorage {
    /// `inner`, read through `cache`.
    pub fn new(inner: Arc<dyn Storage>, cache: ChunkCache) -> CachedStorage {
        CachedStorage { inner, cache }
    }

    /// The cache.
    pub fn cache(&self) -> &ChunkCache {
        &self.cache
    }

    /// The wrapped storage.
    pub fn inner(&self) -> &Arc<dyn Storage> {
        &self.inner
    }
}

impl Storage for CachedStorage {
    fn root(&self) -> &Path {
        self.inner.root()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.inner.path(name)
    }

    fn create_root(&self) -> Result<()> {
        self.inner.create_root()
    }

    fn list(&self) -> Result<Vec<String>> {
        self.inner.list()
    }

    fn read(&self, name: &str) -> Result<Option<Vec<u8>>> {
        self.inner.read(name)
    }

    fn read_bounded(&self, name: &str, max: u64) -> Result<Option<Vec<u8>>> {
        self.inner.read_bounded(name, max)
    }

    fn open(&self, name: &str) -> Result<Arc<dyn FileReader>> {
        let file = self.inner.open(name)?;
        if file.whole().is_some_and(|b| b.is_mapped()) {
            return Ok(file); // read in place already
        }
        let len = file.len();
        let tail = file.read(len.saturating_sub(KEY_TAIL)..len)?;
        Ok(Arc::new(CachedFile {
            key: self
                .cache
                .key(self.inner.root(), name, len, &tail, file.version()),
            path: self.inner.path(name),
            cache: self.cache.clone(),
            file,
        }))
    }

    fn create(&self, temp: &str) -> Result<Box<dyn NewFile>> {
        self.inner.create(temp)
    }

    fn put_new(&self, name: &str, bytes: &[u8], durable: bool) -> Result<()> {
        self.inner.put_new(name, bytes, durable)
    }

    fn replace(
        &self,
        name: &str,
        bytes: &[u8],
        expected: Option<blake3::Hash>,
        durable: bool,
    ) -> Result<()> {
        self.inner.replace(name, bytes, expected, durable)
    }

    fn delete(&self, name: &str) -> Result<()> {
        self.inner.delete(name)
    }

    fn sync(&self) -> Result<()> {
        self.inner.sync()
    }

    fn check_copies_found(&self) -> bool {
        self.inner.check_copies_found()
    }

    fn lock(&self) -> Result<Box<dyn WriterLease>> {
        self.inner.lock()
    }

    fn join(&self, alone: &mut dyn FnMut() -> Result<()>) -> Result<Box<dyn WriterLease>> {
        self.inner.join(alone)
    }

    fn commit_lock(&self) -> Result<Box<dyn WriterLease>> {
        self.inner.commit_lock()
    }
}

/// A file read through the cache.
#[derive(Debug)]
struct CachedFile {
    file: Arc<dyn FileReader>,
    cache: ChunkCache,
    key: [u8; 32],
    path: PathBuf,
}

impl CachedFile {
    /// Bytes of block `n`.
    fn block_range(&self, n: u64) -> Range<u64> {
        let b = self.cache.inner.block;
        n * b..((n + 1) * b).min(self.file.len())
    }
}

/// Copies the part of `block` (bytes `at..` of the file) that lies in `range` into `out`,
/// which holds `range`; returns the bytes copied.
fn copy_part(out: &mut [u8], range: &Range<u64>, at: u64, block: &[u8]) -> u64 {
    let start = range.start.max(at);
    let end = range.end.min(at + block.len() as u64);
    let dst = (start - range.start) as usize..(end - range.start) as usize;
    let src = (start - at) as usize..(end - at) as usize;
    out[dst].copy_from_slice(&block[src]);
    end - start
}

impl FileReader for CachedFile {
    fn len(&self) -> u64 {
        self.file.len()
    }

    fn version(&self) -> Option<&str> {
        self.file.version()
    }

    fn read(&self, range: Range<u64>) -> Result<FileBytes> {
        let len = self.file.len();
        let c = self.cache.counters();
        if range.start >= range.end || range.end > len {
            return self.file.read(range); // empty, or the wrapped reader's error
        }
        if range.start >= len.saturating_sub(self.cache.inner.tail) {
            add(&c.passed_bytes, range.end - range.start);
            return self.file.read(range);
        }
        let size = usize::try_from(range.end - range.start).map_err(|_| Error::Io {
            path: self.path.clone(),
            op: "read",
            source: std::io::Error::other("the range does not fit in memory"),
        })?;
        if self.cache.keeps_nothing() {
            // A folder filled under a larger bound is brought under this one all the same
            // (eviction otherwise follows a block kept).
            self.cache.evict_if_never_measured();
        }
        let mut out = AlignedBytes::zeroed(size);
        let b = self.cache.inner.block;
        let blocks = range.start / b..(range.end - 1) / b + 1;
        let mut missing: Vec<Range<u64>> = Vec::new();
        for n in blocks {
            let r = self.block_range(n);
            match self.cache.load(&self.key, n, r.end - r.start) {
                Some(file) => {
                    let served = copy_part(out.as_bytes_mut(), &range, r.start, &file[CHECKSUM..]);
                    add(&c.hits, 1);
                    add(&c.served_bytes, served);
                }
                None => match missing.last_mut() {
                    Some(run) if run.end == n => run.end = n + 1,
                    _ => missing.push(n..n + 1),
                },
            }
        }
        for run in missing {
            let at = run.start * b;
            if self.cache.keeps_nothing() {
                // Blocks it could not keep are not fetched whole: the bytes asked for only.
                let want = range.start.max(at)..range.end.min(self.block_range(run.end - 1).end);
                let got = self.file.read(want.clone())?;
                let into = (want.start - range.start) as usize..(want.end - range.start) as usize;
                out.as_bytes_mut()[into].copy_from_slice(&got);
                add(&c.passed_bytes, want.end - want.start);
                continue;
            }
            let fetched = self.file.read(at..self.block_range(run.end - 1).end)?;
            add(&c.misses, run.end - run.start);
            add(&c.fetches, 1);
            add(&c.fetched_bytes, fetched.len() as u64);
            for n in run {
                let r = self.block_range(n);
                let block = &fetched[(r.start - at) as usize..(r.end - at) as usize];
                copy_part(out.as_bytes_mut(), &range, r.start, block);
                self.cache.store(&self.key, n, block);
            }
        }
        Ok(FileBytes::new(Backing::Aligned(out)))
    }

    fn whole(&self) -> Option<FileBytes> {
        self.file.whole()
    }
}

#[cfg(test)]
mod tests;
