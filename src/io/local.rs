//! A dataset in a local folder: files mapped for reading, published so that a crash never
//! leaves half of one (temp file in the same folder → fsync → link or rename → fsync folder).

use std::fs::File;
use std::io::Write;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{io, Error, Result};
use crate::failpoint::failpoint;

use super::bytes::FileBytes;
use super::lock::WriterLock;
use super::{FileReader, NewFile, Storage, WriterLease};

pub use crate::format::manifest::TEMP_SUFFIX;

/// A dataset folder.
#[derive(Debug, Clone)]
pub struct LocalStorage {
    dir: PathBuf,
}

impl LocalStorage {
    /// The folder `dir` (which need not exist yet).
    pub fn new(dir: impl Into<PathBuf>) -> LocalStorage {
        LocalStorage { dir: dir.into() }
    }
}

impl Storage for LocalStorage {
    fn root(&self) -> &Path {
        &self.dir
    }

    fn create_root(&self) -> Result<()> {
        create_dir_durable(&self.dir)
    }

    fn list(&self) -> Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(io(&self.dir, "list"))? {
            let entry = entry.map_err(io(&self.dir, "list"))?;
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
        Ok(names)
    }

    fn size(&self, name: &str) -> Result<Option<u64>> {
        let path = self.dir.join(name);
        match std::fs::metadata(&path) {
            Ok(m) => Ok(Some(m.len())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(&path, "stat")(e)),
        }
    }

    fn read(&self, name: &str) -> Result<Option<Vec<u8>>> {
        use std::io::Read;
        let path = self.dir.join(name);
        let read = open_regular(&path).and_then(|mut f| {
            let mut bytes = Vec::new();
            f.read_to_end(&mut bytes).map(|_| bytes)
        });
        match read {
            Ok(b) => Ok(Some(b)),
            // No such file, or the folder is a file: the file is not there.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(io(&path, "read")(e)),
        }
    }

    fn read_bounded(&self, name: &str, max: u64) -> Result<Option<Vec<u8>>> {
        use std::io::Read;
        let path = self.dir.join(name);
        let file = match open_regular(&path) {
            Ok(f) => f,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                return Ok(None)
            }
            Err(e) => return Err(io(&path, "read")(e)),
        };
        let mut bytes = Vec::new();
        file.take(max.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(io(&path, "read"))?;
        Ok(Some(bytes))
    }

    fn open(&self, name: &str) -> Result<Arc<dyn FileReader>> {
        let path = self.dir.join(name);
        let bytes = super::mmap::map_file(&path)?;
        Ok(Arc::new(LocalFile { path, bytes }))
    }

    fn create(&self, temp: &str) -> Result<Box<dyn NewFile>> {
        let temp = self.dir.join(temp);
        let file = create_temp(&temp)?;
        Ok(Box::new(LocalNewFile {
            file,
            temp,
            unsent: None,
        }))
    }

    fn replace(
        &self,
        name: &str,
        bytes: &[u8],
        expected: Option<blake3::Hash>,
        durable: bool,
    ) -> Result<()> {
        let target = self.dir.join(name);
        if let Some(expected) = expected {
            // Not atomic with the rename: the writer lock keeps other hspack writers out.
            let found = self.read(name)?.ok_or_else(|| Error::CommitConflict {
                path: target.clone(),
                detail: "the file is gone".into(),
            })?;
            if blake3::hash(&found) != expected {
                return Err(Error::CommitConflict {
                    path: target,
                    detail: "it is not the one this writer last read or wrote".into(),
                });
            }
        }
        write_atomic(&target, bytes, durable)
    }

    fn delete(&self, name: &str) -> Result<()> {
        let path = self.dir.join(name);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io(&path, "remove")(e)),
        }
    }

    fn sync(&self) -> Result<()> {
        sync_dir(&self.dir)
    }

    fn lock(&self) -> Result<Box<dyn WriterLease>> {
        Ok(Box::new(WriterLock::take(&self.dir)?))
    }

    fn join(&self, alone: &mut dyn FnMut() -> Result<()>) -> Result<Box<dyn WriterLease>> {
        Ok(Box::new(super::lock::SharedLock::join(&self.dir, alone)?))
    }

    fn commit_lock(&self) -> Result<Box<dyn WriterLease>> {
        Ok(Box::new(super::lock::CommitLock::take(&self.dir)?))
    }
}

/// A mapped file of a dataset folder.
#[derive(Debug)]
struct LocalFile {
    path: PathBuf,
    bytes: FileBytes,
}

impl FileReader for LocalFile {
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    fn read(&self, range: Range<u64>) -> Result<FileBytes> {
        usize_range(&range)
            .and_then(|r| self.bytes.slice(r))
            .ok_or_else(|| out_of_file(&self.path, &range, self.len()))
    }

    fn whole(&self) -> Option<FileBytes> {
        Some(self.bytes.clone())
    }
}

/// Why a file hspack reads is not there as a file: something else under its name (a FIFO,
/// which an open would wait on forever, a socket, a device, a folder). Damage: no retry
/// reads it ([`Error::is_damage`]).
#[derive(Debug)]
pub struct NotAFile(&'static str);

impl std::fmt::Display for NotAFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "it is {}, not a regular file: hspack reads files only; put the file itself \
             under this name (from an intact copy)",
            self.0
        )
    }
}

impl std::error::Error for NotAFile {}

/// True for the error [`open_regular`] gives for something other than a file under the
/// name (a folder, FIFO, socket or device): no retry reads it.
pub fn is_not_a_file(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::IsADirectory
        || e.get_ref().is_some_and(|inner| inner.is::<NotAFile>())
}

/// The regular file at `path`, open for reading; anything else under its name refused
/// ([`NotAFile`]) before a byte is read. Opened without blocking: a FIFO's open would wait
/// for a writer forever (a verify that never ends).
pub fn open_regular(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path);
    let file = match opened {
        // A socket cannot be opened at all (ENXIO), which reads as a failed read.
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
            return match std::fs::metadata(path) {
                Ok(m) if m.file_type().is_socket() => {
                    Err(std::io::Error::other(NotAFile("a socket")))
                }
                _ => Err(e),
            }
        }
        opened => opened?,
    };
    let kind = file.metadata()?.file_type();
    let what = match () {
        _ if kind.is_file() => return Ok(file),
        _ if kind.is_dir() => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::IsADirectory,
                NotAFile("a folder"),
            ))
        }
        _ if kind.is_fifo() => "a FIFO (named pipe)",
        _ if kind.is_socket() => "a socket",
        _ if kind.is_block_device() => "a block device",
        _ if kind.is_char_device() => "a character device",
        _ => "not a file",
    };
    Err(std::io::Error::other(NotAFile(what)))
}

pub(crate) fn usize_range(range: &Range<u64>) -> Option<Range<usize>> {
    Some(usize::try_from(range.start).ok()?..usize::try_from(range.end).ok()?)
}

/// The error of a read outside a file.
pub(crate) fn out_of_file(path: &Path, range: &Range<u64>, len: u64) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        op: "read",
        source: std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!(
                "bytes {}..{} lie outside the file's {len} bytes",
                range.start, range.end
            ),
        ),
    }
}

/// Bytes written into a new file before the disk is set to writing them
/// ([`super::mmap::start_writeback`]).
const WRITE_BEHIND: u64 = 32 << 20;

/// The most bytes one `pwrite` writes. A whole sample at once (hundreds of MiB) made the
/// kernel's copy into the page cache swing from run to run, up to several times slower, on
/// ext4 and tmpfs alike; 1 MiB pieces cost the same every time
/// (`benches/results/convert_disk_local_2cpu.md`).
const WRITE_PIECE: usize = 1 << 20;

/// Writes `bytes` at `offset` of `file` in `pwrite`s of at most [`WRITE_PIECE`] bytes, calling
/// `written` with the range of each piece once it is written.
pub(super) fn write_in_pieces(
    file: &File,
    offset: u64,
    bytes: &[u8],
    mut written: impl FnMut(Range<u64>),
) -> std::io::Result<()> {
    let mut at = offset;
    for piece in bytes.chunks(WRITE_PIECE) {
        file.write_all_at(piece, at)?;
        let end = at + piece.len() as u64;
        written(at..end);
        at = end;
    }
    Ok(())
}

/// A file being written in a dataset folder under its temp name.
#[derive(Debug)]
struct LocalNewFile {
    temp: PathBuf,
    file: File,
    /// The bytes written since the disk was last set to writing (first to last offset).
    unsent: Option<Range<u64>>,
}

impl NewFile for LocalNewFile {
    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> Result<()> {
        let LocalNewFile { file, temp, unsent } = self;
        write_in_pieces(file, offset, bytes, |piece| {
            let range = match unsent.take() {
                Some(r) => r.start.min(piece.start)..r.end.max(piece.end),
                None => piece,
            };
            match range.end - range.start >= WRITE_BEHIND {
                true => super::mmap::start_writeback(file, range),
                false => *unsent = Some(range),
            }
        })
        .map_err(io(&*temp, "write"))?;
        Ok(())
    }

    fn sync_data(&mut self) -> Result<()> {
        self.file.sync_data().map_err(io(&self.temp, "fsync"))
    }

    fn sync_all(&mut self) -> Result<()> {
        self.file.sync_all().map_err(io(&self.temp, "fsync"))
    }

    fn publish_new(self: Box<Self>, name: &str, durable: bool) -> Result<()> {
        let target = self.temp.with_file_name(name);
        drop(self.file);
        let result = publish_new(&self.temp, &target, durable);
        if result.is_err() {
            let _ = std::fs::remove_file(&self.temp);
        }
        result
    }

    fn abandon(self: Box<Self>) {
        drop(self.file);
        let _ = std::fs::remove_file(&self.temp);
    }
}

/// The temp name used while writing `target`.
pub fn temp_path(target: &Path) -> PathBuf {
    let mut name = target.file_name().unwrap_or_default().to_os_string();
    name.push(TEMP_SUFFIX);
    target.with_file_name(name)
}

/// Creates folder `dir` and the missing folders above it, each made durable in the folder it
/// is in (an fsync of that folder), so that a power cut after the first commit in a new
/// folder does not take the folder, and the commit with it, away. A folder above that this
/// process may not open for reading is not fsynced (nothing can be done about it here).
pub fn create_dir_durable(dir: &Path) -> Result<()> {
    let missing: Vec<&Path> = dir
        .ancestors()
        .take_while(|d| !d.as_os_str().is_empty() && !d.exists())
        .collect();
    std::fs::create_dir_all(dir).map_err(io(dir, "create folder"))?;
    for made in missing.iter().rev() {
        let parent = match made.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        match File::open(parent) {
            Ok(d) => d.sync_all().map_err(io(parent, "fsync folder"))?,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {}
            Err(e) => return Err(io(parent, "open folder to fsync it")(e)),
        }
    }
    Ok(())
}

/// Flushes a folder's entries (renames, creations) to disk.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir, "fsync folder"))
}

/// Renames a finished, synced temp file over `target` and syncs the folder.
pub fn publish(temp: &Path, target: &Path, durable: bool) -> Result<()> {
    std::fs::rename(temp, target).map_err(io(target, "rename into place"))?;
    sync_parent(target, durable)
}

/// Publishes a finished, synced temp file as `target`, which must not exist: a file already
/// there (another writer's) is never replaced. The temp file is linked to its new name, an
/// exclusive create that also holds over NFS, then removed. On a filesystem without hard links
/// it is renamed after a check that `target` is absent (a check the writer lock keeps true).
/// Refused with [`Error::CommitConflict`], the temp file stays for the caller to remove.
pub fn publish_new(temp: &Path, target: &Path, durable: bool) -> Result<()> {
    let taken = || Error::CommitConflict {
        path: target.to_path_buf(),
        detail: "a file with this name exists already".into(),
    };
    match std::fs::hard_link(temp, target) {
        Ok(()) => std::fs::remove_file(temp).map_err(io(temp, "remove after publishing"))?,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Err(taken()),
        Err(_) if target.exists() => return Err(taken()),
        Err(_) => std::fs::rename(temp, target).map_err(io(target, "rename into place"))?,
    }
    sync_parent(target, durable)
}

/// The `op` of the [`Error::Io`] of a publish whose file landed (renamed or linked into place,
/// readers see it) but whose folder's fsync then failed: it may not survive a power cut.
pub const SYNC_AFTER_PUBLISH: &str = "fsync the folder after publishing into it";

/// True for the error of a publish whose file landed but may not be durable
/// ([`SYNC_AFTER_PUBLISH`]): not a failed publish, nor a committed one.
pub fn landed_not_durable(e: &Error) -> bool {
    matches!(e, Error::Io { op, .. } if *op == SYNC_AFTER_PUBLISH)
}

fn sync_parent(target: &Path, durable: bool) -> Result<()> {
    match target.parent() {
        Some(dir) if durable => File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io(dir, SYNC_AFTER_PUBLISH)),
        _ => Ok(()),
    }
}

/// Writes `bytes` to the temp file of `target`, synced when `durable`; returns its path.
/// Creates temp file `temp` anew. One left there is unlinked first, never truncated: a
/// writer killed between linking a temp file to its published name and removing the temp
/// name leaves the temp a second name of the published file, whose bytes a truncate would
/// wipe (a store's `index.json` was left empty so).
fn create_temp(temp: &Path) -> Result<File> {
    match std::fs::remove_file(temp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(temp, "remove a leftover temp file")(e)),
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(temp)
        .map_err(io(temp, "create"))
}

fn write_temp(target: &Path, bytes: &[u8], durable: bool) -> Result<PathBuf> {
    let temp = temp_path(target);
    let mut f = create_temp(&temp)?;
    f.write_all(bytes).map_err(io(&temp, "write"))?;
    if durable {
        f.sync_all().map_err(io(&temp, "fsync"))?;
    }
    failpoint!("atomic-temp-synced");
    Ok(temp)
}

/// Writes `bytes` to `target` atomically, replacing what is there.
pub fn write_atomic(target: &Path, bytes: &[u8], durable: bool) -> Result<()> {
    publish(&write_temp(target, bytes, durable)?, target, durable)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer killed between linking a temp file to its published name and removing the
    /// temp name leaves two names of one file: the next temp of that name must be a new
    /// file, not the published one truncated (a store's `index.json` was left empty).
    #[test]
    fn a_temp_left_as_a_second_name_of_a_published_file_is_not_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let storage = LocalStorage::new(dir.path());
        storage.put_new("index.json", b"committed", false).unwrap();
        let (published, temp) = (
            dir.path().join("index.json"),
            dir.path().join("index.json.tmp"),
        );
        std::fs::hard_link(&published, &temp).unwrap();
        let started = storage.create("index.json.tmp").unwrap();
        assert_eq!(std::fs::read(&published).unwrap(), b"committed");
        started.abandon();
        std::fs::hard_link(&published, &temp).unwrap();
        let written = write_temp(&published, b"next", false).unwrap();
        assert_eq!(std::fs::read(&published).unwrap(), b"committed");
        publish(&written, &published, false).unwrap();
        assert_eq!(std::fs::read(&published).unwrap(), b"next");
    }

    #[test]
    fn a_new_folder_is_made_with_the_missing_folders_above_it() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a").join("b").join("ds");
        create_dir_durable(&deep).unwrap();
        assert!(deep.is_dir());
        create_dir_durable(&deep).unwrap();
        let file = dir.path().join("a").join("f");
        std::fs::write(&file, b"x").unwrap();
        let e = create_dir_durable(&file.join("ds")).unwrap_err();
        assert!(e.to_string().contains("create folder"), "{e}");
    }
}
