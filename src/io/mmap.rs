//! File mappings: with `capture/cuda/`, the only place hspack uses `unsafe`.
#![allow(unsafe_code)]

use std::fs::File;
use std::ops::Range;
use std::path::Path;

use memmap2::Mmap;

use super::bytes::{Backing, FileBytes};
use crate::error::{io, Result};

/// Maps the file at `path` read-only; an empty file gives empty bytes (some platforms refuse
/// zero-length mappings).
///
/// A mapping is only sound while nobody truncates or rewrites the file. hspack never modifies
/// a file after publishing it (a new file is written to a temp name and published by link or
/// rename, so a live mapping keeps the old inode), and only reads the inputs it converts.
/// Another program truncating a mapped file would make reads fault (SIGBUS): the documented
/// hazard of reading files others are editing in place.
pub fn map_path(path: &Path) -> std::io::Result<FileBytes> {
    map_open(&super::local::open_regular(path)?, path)
}

/// [`map_path`] of a file already open, found at `path`.
fn map_open(file: &File, path: &Path) -> std::io::Result<FileBytes> {
    use std::os::unix::fs::MetadataExt;
    let meta = file.metadata()?;
    if meta.len() == 0 {
        return Ok(FileBytes::from_vec(Vec::new()));
    }
    // SAFETY: read-only and private to this process; see the hazard above: published files
    // are never modified in place, and every access is bounds-checked against the length
    // captured here.
    let map = unsafe { Mmap::map(file) }?;
    let mut map = ReadOnlyMap::listed(map, path, mincore_tells(meta.uid(), effective_uid()));
    map.changed = (meta.ctime(), meta.ctime_nsec());
    Ok(FileBytes::new(Backing::Mapped(map, FileId::of_meta(&meta))))
}

/// A read-only file mapping, listed while it lives (once [`explain_write_faults`] was
/// called) so that a write into it is explained before the process dies.
#[derive(Debug)]
pub struct ReadOnlyMap {
    map: Mmap,
    slot: Option<usize>,
    /// Whether `mincore` tells which of its pages are in the page cache ([`mincore_tells`]).
    tells_residency: bool,
    /// The file's status change time when mapped (seconds, nanoseconds): with its device
    /// and inode, it tells this file from a later one given the inode number once this one
    /// was deleted, as ext4 does at once.
    pub changed: (i64, i64),
}

impl ReadOnlyMap {
    fn listed(map: Mmap, path: &Path, tells_residency: bool) -> ReadOnlyMap {
        let slot = written::list(map.as_ptr() as usize, map.len(), path);
        ReadOnlyMap {
            map,
            slot,
            tells_residency,
            changed: (0, 0),
        }
    }
}

/// True when `mincore` tells which pages of a file owned by `file_uid` are in the page cache,
/// for a process of effective uid `euid`. Since Linux 5.0 it does only for a file the process
/// owns or may write, or with `CAP_FOWNER` (root); of any other file it says every page is
/// there, which would make [`resident`] skip every read-ahead of a dataset another user wrote.
/// Write permission through a group is not worked out: such a file is hinted as if uncached.
fn mincore_tells(file_uid: u32, euid: u32) -> bool {
    euid == 0 || file_uid == euid
}

fn effective_uid() -> u32 {
    // SAFETY: `geteuid` reads the process's credentials; it has no memory effects and never
    // fails.
    unsafe { libc::geteuid() }
}

impl std::ops::Deref for ReadOnlyMap {
    type Target = Mmap;
    fn deref(&self) -> &Mmap {
        &self.map
    }
}

impl Drop for ReadOnlyMap {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            written::unlist(slot);
        }
    }
}

/// Makes a write into a read-only mapping of a dataset's file (a zero-copy tensor written in
/// place: torch has no read-only tensors), and a read of one past the end of its file (cut
/// short in place by another program since), say what happened before the process dies of it:
/// the signal's disposition before this call is put back, so the process then dies as it
/// would have (a core dump, Python's `faulthandler`). For a process that hands mapped bytes
/// to code that may write them (the Python package calls it when imported).
pub fn explain_write_faults() {
    written::install();
}

/// [`explain_write_faults`] again, where another handler replaced it since (a PyTorch
/// DataLoader worker's): a worker reading a shard cut short then says which file, not that
/// shared memory ran out. Does nothing where it was never installed.
pub fn explain_faults_again() {
    written::reinstall();
}

/// The mappings a write fault is checked against, and the handler that checks.
mod written {
    use std::path::Path;
    use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
    use std::sync::Once;

    /// As many as the mappings a process may hold by default (`vm.max_map_count`, 65530):
    /// a reader past 4096 shards mapped died of a write into one unexplained. Statics of
    /// zeroes, so memory is taken only for the slots used.
    const SLOTS: usize = 1 << 16;
    /// Where the search for a free slot starts: after the slot last taken, so taking one costs
    /// little however many are listed (slots free up about in the order they were taken).
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    /// `si_code` of a fault on a page whose protection refuses the access (`<signal.h>`;
    /// the `libc` crate does not export it).
    const SEGV_ACCERR: libc::c_int = 2;
    /// `start`, `end` of each listed mapping (0, 0: a free slot), and its file's path.
    static STARTS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
    static ENDS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
    static PATHS: [AtomicPtr<Vec<u8>>; SLOTS] =
        [const { AtomicPtr::new(std::ptr::null_mut()) }; SLOTS];
    static ON: AtomicBool = AtomicBool::new(false);
    /// Set by the thread that says what happened; `SAID` once it has.
    static SAYING: AtomicBool = AtomicBool::new(false);
    static SAID: AtomicBool = AtomicBool::new(false);
    static INSTALL: Once = Once::new();
    /// The dispositions before ours of `SIGSEGV` and `SIGBUS`, put back by the handler.
    static PREVIOUS: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());
    static PREVIOUS_BUS: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());

    pub(super) fn list(start: usize, len: usize, path: &Path) -> Option<usize> {
        if !ON.load(Ordering::Acquire) {
            return None;
        }
        let from = NEXT.load(Ordering::Relaxed);
        let slot = (from..SLOTS).chain(0..from).find(|&i| {
            ENDS[i]
                .compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })?;
        NEXT.store((slot + 1) % SLOTS, Ordering::Relaxed);
        let name = Box::into_raw(Box::new(path.as_os_str().as_encoded_bytes().to_vec()));
        let old = PATHS[slot].swap(name, Ordering::AcqRel);
        if !old.is_null() {
            // SAFETY: the pointer came from `Box::into_raw` in this function, and the swap
            // took it out of the table, so no one else frees it.
            drop(unsafe { Box::from_raw(old) });
        }
        // The end first: a slot matches only once its start is set, and never past its end.
        ENDS[slot].store(start + len, Ordering::Release);
        STARTS[slot].store(start, Ordering::Release);
        Some(slot)
    }

    pub(super) fn unlist(slot: usize) {
        STARTS[slot].store(0, Ordering::Release);
        ENDS[slot].store(0, Ordering::Release);
    }

    /// The disposition that runs [`on_fault`].
    fn ours() -> libc::sigaction {
        // SAFETY: a zeroed `sigaction` is a valid value, filled in before use.
        let mut ours: libc::sigaction = unsafe { std::mem::zeroed() };
        ours.sa_sigaction = on_fault as *const () as usize;
        ours.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // SAFETY: `sigemptyset` of a live structure.
        unsafe { libc::sigemptyset(&mut ours.sa_mask) };
        ours
    }

    /// Installs the handler again where another replaced it since [`install`] (PyTorch's
    /// DataLoader workers install their own for `SIGBUS` and `SIGSEGV`, which blames shared
    /// memory and names no file): the disposition found becomes the one put back.
    pub(super) fn reinstall() {
        if !ON.load(Ordering::Acquire) {
            return;
        }
        let ours = ours();
        for (signal, slot) in [(libc::SIGSEGV, &PREVIOUS), (libc::SIGBUS, &PREVIOUS_BUS)] {
            // SAFETY: plain `sigaction` calls with a zeroed, then filled, structure; the
            // disposition found is kept (leaked: the handler may be reading the one before).
            unsafe {
                let mut now: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(signal, std::ptr::null(), &mut now) != 0
                    || now.sa_sigaction == ours.sa_sigaction
                {
                    continue;
                }
                slot.store(Box::into_raw(Box::new(now)), Ordering::Release);
                libc::sigaction(signal, &ours, std::ptr::null_mut());
            }
        }
    }

    pub(super) fn install() {
        INSTALL.call_once(|| {
            let ours = ours();
            // SAFETY: plain `sigaction` calls with zeroed, then filled, structures; the old
            // dispositions are kept (leaked) for the handler to put back.
            unsafe {
                let mut on = false;
                for (signal, slot) in [(libc::SIGSEGV, &PREVIOUS), (libc::SIGBUS, &PREVIOUS_BUS)] {
                    let previous = Box::into_raw(Box::new(std::mem::zeroed::<libc::sigaction>()));
                    if libc::sigaction(signal, std::ptr::null(), previous) != 0 {
                        continue;
                    }
                    slot.store(previous, Ordering::Release);
                    ON.store(true, Ordering::Release);
                    on |= libc::sigaction(signal, &ours, std::ptr::null_mut()) == 0;
                }
                ON.store(on, Ordering::Release);
            }
        });
    }

    /// Says what happened when the fault is a write into a listed mapping (once, however many
    /// threads fault at once: the others wait for it), then puts the previous disposition
    /// back and returns: the write faults again, and the previous disposition acts. A signal
    /// sent (`kill`, `raise`) rather than a fault is raised again, to be delivered that way.
    /// Only async-signal-safe calls (`sigaction`, `write`, `raise`).
    extern "C" fn on_fault(signal: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
        let bus = signal == libc::SIGBUS;
        let previous = match bus {
            true => PREVIOUS_BUS.load(Ordering::Acquire),
            false => PREVIOUS.load(Ordering::Acquire),
        };
        let put_back = || {
            // SAFETY: `previous` was stored before this handler was installed for `signal`
            // and is never freed.
            unsafe { libc::sigaction(signal, previous, std::ptr::null_mut()) };
        };
        // SAFETY: `info` is the kernel's, valid for this call.
        let (addr, code) = unsafe { ((*info).si_addr() as usize, (*info).si_code) };
        if code <= 0 {
            put_back();
            // SAFETY: raising a signal; it is blocked in this handler, so it is delivered,
            // with the disposition put back, once the handler returns.
            unsafe { libc::raise(signal) };
            return;
        }
        // A write into a read-only page; or (SIGBUS) a read past the end of a file cut short
        // since it was mapped.
        let slot = (bus || code == SEGV_ACCERR)
            .then(|| {
                (0..SLOTS).find(|&i| {
                    let start = STARTS[i].load(Ordering::Acquire);
                    start != 0 && start <= addr && addr < ENDS[i].load(Ordering::Acquire)
                })
            })
            .flatten();
        let Some(slot) = slot else {
            put_back();
            return;
        };
        if SAYING.swap(true, Ordering::AcqRel) {
            while !SAID.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
            return;
        }
        let say = |bytes: &[u8]| {
            // SAFETY: `write` of a live buffer to standard error.
            unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
        };
        let (what, why): (&[u8], &[u8]) = match bus {
            true => (
                b"hspack: this process read memory that maps a dataset's file (",
                b") past the file's end: the file was cut short or written over in place \
                  while it was mapped (a copy or rsync onto the dataset's folder?); hspack \
                  never changes a file it published, so another program did: copy a dataset \
                  to a new folder (`hspack cp`), never over one in use, then verify it. The \
                  process stops here.\n",
            ),
            false => (
                b"hspack: this process wrote into memory that maps a dataset's file read-only (",
                b"): a tensor hspack reads without copying shares the file's pages and must \
                  not be written in place; write to a copy (`t.clone()`, or read with \
                  copy=True). The process stops here.\n",
            ),
        };
        say(what);
        let path = PATHS[slot].load(Ordering::Acquire);
        if !path.is_null() {
            // SAFETY: a path is freed only when its slot is listed again, and the slot is
            // listed (its range matched just now).
            say(unsafe { &*path });
        }
        say(why);
        put_back();
        SAID.store(true, Ordering::Release);
    }
}

/// Drops bytes `start..start + len` of a read-only file mapping from this process's memory
/// (`MADV_DONTNEED`): the next access reads them again from the page cache or the file. For
/// reads that pass over a file once (verify), so that what the process holds stays small.
pub(super) fn release(map: &Mmap, start: usize, len: usize) {
    // SAFETY: `map` is a read-only mapping of a file that is never modified in place (see
    // `map_path`), so it has no private pages to lose: dropped pages read back the same bytes
    // on the next access, through any live slice of the mapping. The range is within it (the
    // caller's bounds), and a refusal is harmless (the pages just stay).
    let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, len) };
}

/// True when every page of bytes `start..start + len` of `map` is in the page cache
/// (`mincore`); false when some are not, or the kernel cannot tell ([`mincore_tells`]).
/// Cheaper than loading pages already there (`MADV_POPULATE_READ` takes each page in turn),
/// which a DataLoader worker otherwise does for every sample of every epoch.
pub(super) fn resident(map: &ReadOnlyMap, start: usize, len: usize) -> bool {
    if !map.tells_residency {
        return false;
    }
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    // SAFETY: `sysconf` reads a constant of the system; it has no memory effects.
    let page = *PAGE.get_or_init(|| match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as usize,
        _ => 4096,
    });
    if len == 0 || start.checked_add(len).is_none_or(|end| end > map.len()) {
        return false;
    }
    let addr = map.as_ptr() as usize + start;
    let first = addr & !(page - 1);
    let pages = (addr + len - first).div_ceil(page);
    let mut flags = vec![0u8; pages];
    // SAFETY: `first..first + pages * page` lies within `map`'s pages (a mapping starts on a
    // page boundary and covers whole pages, and the range was checked against its length),
    // `flags` holds one byte per page, and `mincore` only writes `flags`.
    let ok = unsafe {
        libc::mincore(
            first as *mut libc::c_void,
            pages * page,
            flags.as_mut_ptr().cast(),
        )
    } == 0;
    ok && flags.iter().all(|f| f & 1 == 1)
}

/// Starts writing bytes `range` of `file` to disk without waiting for them (Linux
/// `sync_file_range(SYNC_FILE_RANGE_WRITE)`): the disk works while the writer goes on, and the
/// fsync before the file is published finds little left to write. Durability still comes only
/// from that fsync; where the call fails or does not exist, nothing happens.
pub(super) fn start_writeback(file: &File, range: Range<u64>) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let (Ok(start), Ok(len)) = (
            i64::try_from(range.start),
            i64::try_from(range.end.saturating_sub(range.start)),
        ) else {
            return;
        };
        // SAFETY: a system call on a descriptor `file` keeps open; it reads and writes no
        // memory of this process, and a refusal (an unsupported file system) is harmless.
        let _ = unsafe {
            libc::sync_file_range(file.as_raw_fd(), start, len, libc::SYNC_FILE_RANGE_WRITE)
        };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, range);
}

/// [`map_path`], with the error naming the file.
pub fn map_file(path: &Path) -> Result<FileBytes> {
    map_path(path).map_err(map_failed(path))
}

/// The error of a mapping of `path` that failed; where the process maps all the regions the
/// kernel allows (`ENOMEM`), it says so and what to do.
fn map_failed(path: &Path) -> impl FnOnce(std::io::Error) -> crate::error::Error + '_ {
    move |e| {
        if e.raw_os_error() != Some(libc::ENOMEM) {
            return io(path, "map")(e);
        }
        let limit = std::fs::read_to_string("/proc/sys/vm/max_map_count")
            .map_or_else(|_| "?".into(), |t| t.trim().to_string());
        io(path, "map")(std::io::Error::new(
            e.kind(),
            format!(
                "{e}: the process may map no more regions (the kernel's vm.max_map_count is \
                 {limit}, and every shard read stays mapped); read fewer shards in one \
                 process, write larger shards, or raise the limit (`sysctl -w \
                 vm.max_map_count=1048576`)"
            ),
        ))
    }
}

/// The identity of a file: device and inode numbers. A mapping handed to another process
/// names its file by path and identity, so a file replaced in between is noticed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    /// Device number.
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
}

impl FileId {
    /// The identity of `file`.
    pub fn of(file: &File, path: &Path) -> Result<FileId> {
        FileId::of_open(file).map_err(io(path, "stat"))
    }

    /// The identity of `file`, the error naming no path.
    pub fn of_open(file: &File) -> std::io::Result<FileId> {
        Ok(FileId::of_meta(&file.metadata()?))
    }

    fn of_meta(m: &std::fs::Metadata) -> FileId {
        use std::os::unix::fs::MetadataExt;
        FileId {
            dev: m.dev(),
            ino: m.ino(),
        }
    }
}

/// Maps the file at `path` read-only, as [`map_path`] does, provided it is still the file
/// `expect` names. A mapping handed to another process by path and identity is refused this
/// way when the file was replaced in between.
pub fn map_identified(path: &Path, expect: FileId) -> Result<FileBytes> {
    let file = super::local::open_regular(path).map_err(io(path, "open"))?;
    if FileId::of(&file, path)? != expect {
        return Err(replaced(path));
    }
    map_open(&file, path).map_err(map_failed(path))
}

/// The error for a file that is no longer the one a mapping handed over named, or is shorter
/// than the range it named.
pub fn replaced(path: &Path) -> crate::error::Error {
    crate::error::Error::Io {
        path: path.to_path_buf(),
        op: "map",
        source: std::io::Error::other(
            "the shard file was replaced or truncated since it was read; reopen the dataset",
        ),
    }
}

/// Flags (one byte each) in a file mapped shared, so several processes see each other's
/// `set`s: the cross-process memo of checked chunks.
pub struct SharedFlags {
    map: memmap2::MmapMut,
}

impl SharedFlags {
    /// Opens `path` (created when missing) as `n` flags, all clear in a new file. Fails when
    /// the file holds another number of flags: it belongs to something else.
    pub fn open(path: &Path, n: usize) -> Result<SharedFlags> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(io(path, "open"))?;
        let len = file.metadata().map_err(io(path, "stat"))?.len();
        if len == 0 {
            // Several processes may race here; each sets the same length.
            file.set_len(n as u64).map_err(io(path, "resize"))?;
        } else if len != n as u64 {
            return Err(crate::error::Error::Io {
                path: path.to_path_buf(),
                op: "open",
                source: std::io::Error::other(format!(
                    "the checked-chunk memo holds {len} flags, the shard has {n} chunks; \
                     give each dataset its own memo folder"
                )),
            });
        }
        // SAFETY: the file is a plain byte array that only `SharedFlags` of hspack processes
        // touch, and only through atomic byte loads and stores (below), so concurrent writers
        // in other processes cannot cause a data race; its length was set or checked above.
        let map = unsafe { memmap2::MmapMut::map_mut(&file) }.map_err(io(path, "map"))?;
        Ok(SharedFlags { map })
    }

    fn flags(&self) -> &[std::sync::atomic::AtomicU8] {
        // SAFETY: `AtomicU8` has the size and alignment of `u8`, the mapping lives as long as
        // `self`, and every access to these bytes (in any process) is atomic.
        unsafe {
            std::slice::from_raw_parts(
                self.map.as_ptr().cast::<std::sync::atomic::AtomicU8>(),
                self.map.len(),
            )
        }
    }

    /// Whether flag `i` is set (false when out of range).
    pub fn get(&self, i: usize) -> bool {
        self.flags()
            .get(i)
            .is_some_and(|f| f.load(std::sync::atomic::Ordering::Relaxed) != 0)
    }

    /// Sets flag `i` (ignored when out of range).
    pub fn set(&self, i: usize) {
        if let Some(f) = self.flags().get(i) {
            f.store(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// Bytes before a [`SharedRegion`]'s data: its header (magic, the count of loans, the owner's
/// process id, whether the owner let go of it), a page so the data starts page-aligned.
pub const REGION_HEADER: usize = 4096;

/// What a [`SharedRegion`]'s header starts with.
const REGION_MAGIC: u64 = u64::from_le_bytes(*b"hspklend");

/// Memory that other processes can map by file descriptor: an in-memory file (`memfd`), its
/// first page a header that counts the loans other processes hold on its data (see
/// `io::loan`), the rest the data.
///
/// Every page is allocated when the region is made (`posix_fallocate`), so running out of
/// memory is an error here, never a `SIGBUS` on a later write; and the pages are mapped in
/// ahead (`MAP_POPULATE`), so writing the data takes no page faults.
///
/// The owner keeps the region's descriptor open, for others to open it through `/proc`; a
/// process that maps a region it received closes its descriptor at once (the mapping keeps
/// the file, and its identity, alive), so receiving regions costs no descriptors.
#[derive(Debug)]
pub struct SharedRegion {
    /// The owner's descriptor; None in a process that received the region.
    file: Option<File>,
    id: FileId,
    map: memmap2::MmapMut,
}

impl SharedRegion {
    /// A new region of `data_len` bytes of data, no loans.
    pub fn create(data_len: usize) -> std::io::Result<SharedRegion> {
        let len = REGION_HEADER
            .checked_add(data_len)
            .ok_or_else(|| std::io::Error::other("shared region too large"))?;
        // SAFETY: `memfd_create` reads the NUL-terminated name and returns a new descriptor
        // (or -1); it touches no memory of ours.
        let fd = unsafe { libc::memfd_create(c"hspack-loan".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by `memfd_create` and nothing else owns it.
        let file = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        // SAFETY: `fd` is open (owned by `file`); `posix_fallocate` only changes the file.
        match unsafe { libc::posix_fallocate(fd, 0, len as libc::off_t) } {
            0 => {}
            e => return Err(std::io::Error::from_raw_os_error(e)),
        }
        let region = SharedRegion::map(&file, len)?.keeping(file);
        let header = region.header();
        header[2].store(
            u64::from(std::process::id()),
            std::sync::atomic::Ordering::Relaxed,
        );
        header[0].store(REGION_MAGIC, std::sync::atomic::Ordering::Release);
        Ok(region)
    }

    /// The region another process made, from its file, mapped whole; the file is closed
    /// once mapped. Fails when the file is not an hspack region.
    pub fn map_received(file: File) -> std::io::Result<SharedRegion> {
        let not_region = || std::io::Error::other("not an hspack shared region");
        let len = usize::try_from(file.metadata()?.len()).map_err(|_| not_region())?;
        if len < REGION_HEADER {
            return Err(not_region());
        }
        let region = SharedRegion::map(&file, len)?;
        if region.header()[0].load(std::sync::atomic::Ordering::Acquire) != REGION_MAGIC {
            return Err(not_region());
        }
        Ok(region)
    }

    /// `len` bytes of the region's file, mapped shared and writable, pages mapped in ahead;
    /// the descriptor is not kept.
    fn map(file: &File, len: usize) -> std::io::Result<SharedRegion> {
        let id = FileId::of_open(file)?;
        // SAFETY: a region's file is never resized after it is made (`len` bytes, allocated
        // up front), and every process that maps it follows the protocol of `io::loan`: the
        // header is touched only through atomics; the data is written by its owner only when
        // no loan is out, and read or written by another process only while it holds a loan
        // the owner took out for it.
        let map = unsafe {
            memmap2::MmapOptions::new()
                .len(len)
                .populate()
                .map_mut(file)
        }?;
        Ok(SharedRegion {
            file: None,
            id,
            map,
        })
    }

    /// The region, keeping its owner's descriptor open.
    fn keeping(self, file: File) -> SharedRegion {
        SharedRegion {
            file: Some(file),
            ..self
        }
    }

    /// Magic, loans, the owner's process id, whether the owner let go of it.
    fn header(&self) -> &[std::sync::atomic::AtomicU64; 4] {
        // SAFETY: the mapping is page-aligned and at least `REGION_HEADER` bytes long, lives
        // as long as `self`, and every process touches these 32 bytes only atomically.
        unsafe {
            &*self
                .map
                .as_ptr()
                .cast::<[std::sync::atomic::AtomicU64; 4]>()
        }
    }

    /// The process that made the region.
    pub fn owner(&self) -> u64 {
        self.header()[2].load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Says the owner will not lend the region again.
    pub fn retire(&self) {
        self.header()[3].store(1, std::sync::atomic::Ordering::Release);
    }

    /// True once the owner said it will not lend the region again.
    pub fn retired(&self) -> bool {
        self.header()[3].load(std::sync::atomic::Ordering::Acquire) != 0
    }

    /// The identity of the region's file.
    pub fn id(&self) -> FileId {
        self.id
    }

    /// Loans out (taken by [`lend`](Self::lend), ended by [`end_loan`](Self::end_loan)).
    pub fn loans(&self) -> u64 {
        self.header()[1].load(std::sync::atomic::Ordering::Acquire)
    }

    /// Takes a loan out, for a process about to receive the region.
    pub fn lend(&self) {
        self.header()[1].fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// Ends a loan: the receiving process no longer reads or writes the data.
    pub fn end_loan(&self) {
        self.header()[1].fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// The data's first byte. Writes through it are the owner's, while no loan is out, or a
    /// borrower's, while it holds one.
    pub fn data_ptr(&self) -> *const u8 {
        self.map[REGION_HEADER..].as_ptr()
    }

    /// Bytes of data mapped.
    pub fn data_len(&self) -> usize {
        self.map.len() - REGION_HEADER
    }

    /// The region's file descriptor, for another process to open it by (None where the
    /// region was received: only its owner lends it).
    pub fn fd(&self) -> Option<std::os::fd::RawFd> {
        self.file.as_ref().map(std::os::fd::AsRawFd::as_raw_fd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_tells_pages_in_the_page_cache_from_holes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = File::create(&path).unwrap();
        // A hole: no page of it is cached. 64 MiB, so a read of one page (which reads ahead,
        // up to the device's `read_ahead_kb`) leaves most of it out.
        file.set_len(64 << 20).unwrap();
        drop(file);
        // SAFETY: a file of this test's own, not changed while mapped.
        let mapped = unsafe { Mmap::map(&File::open(&path).unwrap()) }.unwrap();
        let map = ReadOnlyMap::listed(mapped, &path, true);
        assert!(!resident(&map, 0, 64 << 20));
        assert_eq!(map[(32 << 20) + 5..(32 << 20) + 9], [0; 4]); // reads (caches) that page
        assert!(resident(&map, (32 << 20) + 5, 4));
        assert!(!resident(&map, 0, 64 << 20));
        assert!(
            !resident(&map, 64 << 20, 1),
            "out of range is never resident"
        );
        assert!(!resident(&map, 0, 0));
        // A mapping whose residency the kernel does not tell is never called resident, so
        // it is always read ahead.
        // SAFETY: as above.
        let again = unsafe { Mmap::map(&File::open(&path).unwrap()) }.unwrap();
        let untold = ReadOnlyMap::listed(again, &path, false);
        assert!(!resident(&untold, (32 << 20) + 5, 4));
    }

    #[test]
    fn mincore_is_trusted_for_the_owner_and_root_only() {
        assert!(mincore_tells(1000, 1000));
        assert!(mincore_tells(1000, 0));
        assert!(!mincore_tells(0, 1000));
        assert!(!mincore_tells(1001, 1000));
    }
}
