//! One writer per dataset: an OS file lock on `.hspack-writer.lock`, held for the writer's life;
//! or several that share it ([`SharedLock`], each commit under the [`CommitLock`]).
//!
//! The lock is `flock(2)` on the lock file (through [`std::fs::File::try_lock`]), so it is
//! taken atomically, is released by the kernel when the holding process dies however it dies,
//! and is refused to a second writer of the same process (each open of the file is a separate
//! lock). The holder deletes the file while it still holds the lock, when it is done; a writer
//! that locked a file and then finds the name no longer leads to that file (it was deleted
//! meanwhile) lets it go and tries again, so two writers never hold two files of one name.
//! A file a killed writer left is unlocked and is simply taken. Its text, the holder's
//! process id and host, is only for the error message a refused writer prints.
//!
//! On NFS, Linux maps `flock` to byte-range locks that the server arbitrates (NFSv4, or v3
//! with the lock manager). Commits do not rely on the lock alone: a shard is published only
//! where no file is, and the manifest only over the one the writer last read or wrote
//! (see [`crate::write::dataset_writer`]), so even a broken lock cannot replace committed data.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::error::{io, Error, Result};

/// Name of the lock file a writer holds in the dataset folder.
pub const LOCK_FILE: &str = ".hspack-writer.lock";

/// The held lock of one dataset; released on drop by the process that took it.
#[derive(Debug)]
pub struct WriterLock {
    file: File,
    path: PathBuf,
    pid: u32,
}

impl WriterLock {
    /// Takes the lock of the dataset in `dir`, or says who holds it.
    pub fn take(dir: &Path) -> Result<Self> {
        let path = dir.join(LOCK_FILE);
        // Each retry follows a holder that deleted the file between our open and our lock.
        for _ in 0..64 {
            let mut file = open_lock_file(&path)?;
            match file.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => {
                    return Err(Error::Locked {
                        path: dir.to_path_buf(),
                        holder: holder_text(&mut file, &path),
                    })
                }
                Err(TryLockError::Error(e)) => return Err(io(&path, "lock")(e)),
            }
            if !still_named(&file, &path)? {
                continue;
            }
            write_holder(&mut file, &path)?;
            let pid = std::process::id();
            return Ok(WriterLock { file, path, pid });
        }
        Err(Error::Locked {
            path: dir.to_path_buf(),
            holder: "writers that keep opening and closing it".into(),
        })
    }

    /// True in the process that took the lock, false in a child forked from it: a child must
    /// neither release the parent's lock nor delete the parent's files.
    pub fn is_owner(&self) -> bool {
        self.pid == std::process::id()
    }
}

impl super::WriterLease for WriterLock {
    fn is_owner(&self) -> bool {
        WriterLock::is_owner(self)
    }
}

impl Drop for WriterLock {
    fn drop(&mut self) {
        // A forked child shares the lock with its parent; only the parent releases it.
        if self.is_owner() {
            // Deleted while still locked: see the module's doc. Only while it names the file
            // this writer holds: one deleted by hand and taken since is the next writer's.
            if still_named(&self.file, &self.path).unwrap_or(false) {
                let _ = std::fs::remove_file(&self.path);
            }
            let _ = self.file.unlock();
        }
    }
}

/// Name of the lock file that orders the commits of writers sharing a dataset.
pub const COMMIT_LOCK_FILE: &str = ".hspack-commit.lock";

/// How long a writer joining a dataset waits for one that is removing leftovers.
const JOIN_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Times (20 ms apart) a joining writer reads a sole writer's text in the lock before it is
/// refused: the text may be a dead sole writer's that a joining writer holding the lock is
/// about to replace.
const SOLE_READS: usize = 10;

/// One of several writers appending to a dataset at once (`WriteOptions::shared`): a shared
/// `flock` on [`LOCK_FILE`], held for the writer's life. A sole writer (which needs the lock
/// exclusively) is refused while any is there, and they are refused while it is.
#[derive(Debug)]
pub struct SharedLock {
    file: File,
    path: PathBuf,
    pid: u32,
}

impl SharedLock {
    /// Joins the writers of the dataset in `dir`. When none is there, `alone` runs first,
    /// with the lock held exclusively (it removes what interrupted writers left, which is
    /// safe only while no live writer has files in progress).
    pub fn join(dir: &Path, alone: &mut dyn FnMut() -> Result<()>) -> Result<Self> {
        let path = dir.join(LOCK_FILE);
        let deadline = std::time::Instant::now() + JOIN_WAIT;
        // How often a sole writer's text was read: a joining writer that has just taken the
        // lock exclusively has not yet written its own over a dead sole writer's.
        let mut sole = 0;
        loop {
            let mut file = open_lock_file(&path)?;
            match file.try_lock() {
                Ok(()) if still_named(&file, &path)? => {
                    let text =
                        format!("{SHARED_HOLDER}{} on {}\n", std::process::id(), host_name());
                    file.set_len(0)
                        .and_then(|()| file.rewind())
                        .and_then(|()| file.write_all(text.as_bytes()))
                        .map_err(io(&path, "write lock holder"))?;
                    alone()?;
                    // Exclusive to shared never conflicts: no other writer can slip in.
                    file.lock_shared().map_err(io(&path, "lock"))?;
                    return Ok(SharedLock::held(file, path));
                }
                Ok(()) => continue,
                Err(TryLockError::WouldBlock) => {}
                Err(TryLockError::Error(e)) => return Err(io(&path, "lock")(e)),
            }
            match file.try_lock_shared() {
                Ok(()) if still_named(&file, &path)? => return Ok(SharedLock::held(file, path)),
                Ok(()) => continue,
                // A sole writer (refused at once), or a joining one removing leftovers.
                Err(TryLockError::WouldBlock) => {
                    let holder = holder_text(&mut file, &path);
                    sole += usize::from(holder.starts_with("pid "));
                    if sole > SOLE_READS || std::time::Instant::now() >= deadline {
                        return Err(Error::Locked {
                            path: dir.to_path_buf(),
                            holder,
                        });
                    }
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(TryLockError::Error(e)) => return Err(io(&path, "lock")(e)),
            }
        }
    }

    fn held(file: File, path: PathBuf) -> SharedLock {
        SharedLock {
            file,
            path,
            pid: std::process::id(),
        }
    }
}

impl super::WriterLease for SharedLock {
    fn is_owner(&self) -> bool {
        self.pid == std::process::id()
    }
}

impl Drop for SharedLock {
    fn drop(&mut self) {
        // The last writer out (the only one that can lock exclusively) deletes the file, as
        // a sole writer does; a failed try gives up this writer's shared lock, as leaving does.
        if self.pid != std::process::id() {
            return;
        }
        if self.file.try_lock().is_ok() && still_named(&self.file, &self.path).unwrap_or(false) {
            let _ = std::fs::remove_file(&self.path);
        }
        // Released outright: a child forked meanwhile holds the same open file until it exits.
        let _ = self.file.unlock();
    }
}

/// The lock that orders the commits of writers sharing a dataset: an exclusive `flock` on
/// [`COMMIT_LOCK_FILE`], waited for, held from reading the manifest to replacing it. The
/// file is never deleted (a writer waiting on it must not end up holding a file no other
/// writer sees).
#[derive(Debug)]
pub struct CommitLock {
    file: File,
    pid: u32,
}

impl CommitLock {
    /// Takes the commit lock of the dataset in `dir`, waiting for the writer holding it (up
    /// to [`commit_wait`](super::object_lease::commit_wait)).
    pub fn take(dir: &Path) -> Result<Self> {
        let path = dir.join(COMMIT_LOCK_FILE);
        let file = open_lock_file(&path)?;
        let file = lock_waiting(file, &path, false).map_err(|e| {
            e.or_locked(
                dir,
                "a writer committing (another of the writers sharing it)",
            )
        })?;
        Ok(CommitLock {
            file,
            pid: std::process::id(),
        })
    }
}

/// A wait for a lock that ran out: the lock file and how long it was waited for.
#[derive(Debug)]
pub(crate) struct WaitedTooLong {
    path: PathBuf,
    waited: std::time::Duration,
}

impl WaitedTooLong {
    /// Who holds the lock, for [`Error::Locked`]: `who` (the holder it is there for), and
    /// how to find one that is not.
    pub(crate) fn holder(&self, who: &str) -> String {
        format!(
            "{who}, still after {} s waiting for its lock {}: a process holding it is stuck, \
             or a process forked without exec (a DataLoader or multiprocessing worker) from \
             one that was killed holds it still; `fuser -v {}` names them: stop the one that \
             should not be there (HSPACK_COMMIT_WAIT_SECS sets the wait)",
            self.waited.as_secs(),
            self.path.display(),
            self.path.display()
        )
    }
}

/// Locks `file` (at `path`), shared or exclusively, waiting while another open file holds
/// it, up to [`commit_wait`](super::object_lease::commit_wait). Polled, with pauses that grow
/// from 1 to 50 ms: a blocking `flock` cannot be given up when the wait runs out (a thread
/// left in it holds a descriptor of the file, and the lock once it comes, for as long as the
/// holder lives).
pub(crate) fn lock_waiting(
    file: File,
    path: &Path,
    shared: bool,
) -> std::result::Result<File, WaitOrError> {
    lock_waiting_up_to(file, path, shared, super::object_lease::commit_wait())
}

/// [`lock_waiting`], waiting up to `wait`.
fn lock_waiting_up_to(
    file: File,
    path: &Path,
    shared: bool,
    wait: std::time::Duration,
) -> std::result::Result<File, WaitOrError> {
    let deadline = std::time::Instant::now() + wait;
    let mut pause = std::time::Duration::from_millis(1);
    loop {
        let tried = match shared {
            true => file.try_lock_shared(),
            false => file.try_lock(),
        };
        match tried {
            Ok(()) => return Ok(file),
            Err(TryLockError::WouldBlock) => {}
            Err(TryLockError::Error(e)) => return Err(WaitOrError::Error(io(path, "lock")(e))),
        }
        let now = std::time::Instant::now();
        if now >= deadline {
            return Err(WaitOrError::Waited(WaitedTooLong {
                path: path.to_path_buf(),
                waited: wait,
            }));
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(std::time::Duration::from_millis(50));
    }
}

/// A lock wait that ran out, or failed.
#[derive(Debug)]
pub(crate) enum WaitOrError {
    Waited(WaitedTooLong),
    Error(Error),
}

impl WaitOrError {
    /// The error: a wait that ran out as [`Error::Locked`] of `path`, held by `who`.
    pub(crate) fn or_locked(self, path: &Path, who: &str) -> Error {
        match self {
            WaitOrError::Waited(w) => Error::Locked {
                path: path.to_path_buf(),
                holder: w.holder(who),
            },
            WaitOrError::Error(e) => e,
        }
    }
}

impl super::WriterLease for CommitLock {
    fn is_owner(&self) -> bool {
        self.pid == std::process::id()
    }
}

impl Drop for CommitLock {
    fn drop(&mut self) {
        // Released outright, not by closing the file: a child forked meanwhile holds the same
        // open file, and with it the lock, until it exits. Only the process that took it.
        if self.pid == std::process::id() {
            let _ = self.file.unlock();
        }
    }
}

fn open_lock_file(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(io(path, "open lock file"))
}

/// True when `path` still names the file `file` is open on.
fn still_named(file: &File, path: &Path) -> Result<bool> {
    let held = file.metadata().map_err(io(path, "stat lock file"))?;
    match std::fs::metadata(path) {
        Ok(named) => Ok(named.dev() == held.dev() && named.ino() == held.ino()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io(path, "stat lock file")(e)),
    }
}

/// What the lock file of writers sharing a dataset says, before the first one's process id
/// and host.
const SHARED_HOLDER: &str = "writers sharing the dataset, the first of them pid ";

/// Writes who holds the lock of `file` (at `path`), which this process just took: `pid N on
/// HOST`, what [`holder_text`] reads back to another process refused it.
pub(crate) fn write_holder(file: &mut File, path: &Path) -> Result<()> {
    let text = format!("pid {} on {}\n", std::process::id(), host_name());
    file.set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| file.write_all(text.as_bytes()))
        .map_err(io(path, "write lock holder"))
}

/// Who holds the lock of `file` (at `path`), as its holder wrote it, and where that process
/// has exited, what holds it still (a child it forked) and how to find it.
pub(crate) fn holder_text(file: &mut File, path: &Path) -> String {
    let mut text = String::new();
    let _ = file.take(256).read_to_string(&mut text);
    match text.trim() {
        "" => "a writer that has not written its process id yet".into(),
        t if t.starts_with(&format!("pid {} ", std::process::id())) => {
            format!("{t}: another writer of this process; finish or drop it first")
        }
        t if holder_exited(t) && t.starts_with(SHARED_HOLDER) => format!(
            "{t}, which has exited: the others sharing the dataset hold the lock, or a process \
             one of them forked without exec (a DataLoader or multiprocessing worker) inherited \
             it; `fuser -v {}` names them: wait for them, or stop them",
            path.display()
        ),
        t if holder_exited(t) => format!(
            "{t}, which has exited: a process it forked without exec (a DataLoader or \
             multiprocessing worker) inherited the lock and still holds it; `fuser -v {}` \
             names it: stop it",
            path.display()
        ),
        t => t.to_string(),
    }
}

/// True when lock text `t` names a process of this host (`pid N on HOST`, also after the
/// words of writers sharing the dataset) that no longer runs. The lock is held all the same:
/// by a child forked from it, which shares the open lock file (or by the others sharing the
/// dataset). False where this cannot be told (no `/proc`).
fn holder_exited(t: &str) -> bool {
    let named = t
        .strip_prefix("pid ")
        .or_else(|| t.strip_prefix(SHARED_HOLDER));
    let Some((pid, host)) = named.and_then(|r| r.split_once(" on ")) else {
        return false;
    };
    pid.parse::<u32>().is_ok_and(|pid| exited_here(pid, host))
}

/// True when process `pid` of host `host` is of this host and no longer runs; false where
/// this cannot be told (no `/proc`).
pub(crate) fn exited_here(pid: u32, host: &str) -> bool {
    let proc = Path::new("/proc");
    host == host_name() && proc.join("self").exists() && !proc.join(pid.to_string()).exists()
}

pub(crate) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "this host".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_and_the_first_drop_releases_it() {
        let dir = tempfile::tempdir().unwrap();
        let first = WriterLock::take(dir.path()).unwrap();
        let err = WriterLock::take(dir.path()).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, Error::Locked { .. }), "{msg}");
        assert!(
            msg.contains(&format!("pid {}", std::process::id())),
            "{msg}"
        );
        assert!(msg.contains("this process"), "{msg}");
        drop(first);
        assert!(
            !dir.path().join(LOCK_FILE).exists(),
            "the holder deletes it"
        );
        let again = WriterLock::take(dir.path()).unwrap();
        assert!(again.is_owner());
        assert!(dir.path().join(LOCK_FILE).exists());
        drop(again);
        assert!(!dir.path().join(LOCK_FILE).exists());
    }

    /// A lock file deleted by hand lets a second writer in (the manifest check stops one of
    /// them at its commit); the first one's drop must not delete the second's file too, which
    /// let a third in while the second held the dataset.
    #[test]
    fn a_drop_deletes_only_the_lock_file_it_holds() {
        let dir = tempfile::tempdir().unwrap();
        let first = WriterLock::take(dir.path()).unwrap();
        std::fs::remove_file(dir.path().join(LOCK_FILE)).unwrap();
        let second = WriterLock::take(dir.path()).unwrap();
        drop(first);
        assert!(
            dir.path().join(LOCK_FILE).exists(),
            "the second's file went"
        );
        assert!(matches!(
            WriterLock::take(dir.path()),
            Err(Error::Locked { .. })
        ));
        drop(second);
        assert!(!dir.path().join(LOCK_FILE).exists());
    }

    /// A lock another open file holds: the wait runs out, says where to look, and leaves
    /// nothing waiting for the lock (a thread left blocked in `flock` took it, and held a
    /// descriptor of the file, for as long as the holder lived).
    #[test]
    fn a_lock_wait_runs_out_and_leaves_nothing_held() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(COMMIT_LOCK_FILE);
        let holder = open_lock_file(&path).unwrap();
        holder.lock().unwrap();
        let start = std::time::Instant::now();
        let wait = std::time::Duration::from_millis(300);
        let err = match lock_waiting_up_to(open_lock_file(&path).unwrap(), &path, false, wait) {
            Err(e) => e.or_locked(dir.path(), "a writer committing"),
            Ok(_) => panic!("the lock was taken while another file held it"),
        };
        assert!(start.elapsed() >= wait, "{:?}", start.elapsed());
        let said = err.to_string();
        assert!(matches!(err, Error::Locked { .. }), "{said}");
        assert!(
            said.contains("a writer committing")
                && said.contains(&format!("fuser -v {}", path.display()))
                && said.contains("HSPACK_COMMIT_WAIT_SECS"),
            "{said}"
        );
        // Nothing waits on after the wait ran out: the lock is free once the holder lets go.
        holder.unlock().unwrap();
        let next = open_lock_file(&path).unwrap();
        assert!(
            next.try_lock().is_ok(),
            "a wait that ran out still holds or waits"
        );
    }

    /// A wait the holder ends in time returns the file locked, shared or exclusive.
    #[test]
    fn a_lock_wait_gets_the_lock_once_the_holder_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gc.lock");
        for shared in [false, true] {
            let holder = open_lock_file(&path).unwrap();
            holder.lock().unwrap();
            let release = std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(200));
                holder.unlock().unwrap();
            });
            let wait = std::time::Duration::from_secs(30);
            let Ok(got) = lock_waiting_up_to(open_lock_file(&path).unwrap(), &path, shared, wait)
            else {
                panic!("the wait ran out though the holder let go");
            };
            release.join().unwrap();
            let other = open_lock_file(&path).unwrap();
            assert!(other.try_lock().is_err(), "not locked");
            assert_eq!(other.try_lock_shared().is_ok(), shared);
            drop((got, other));
        }
    }

    /// A dead sole writer's text left in the lock file, and a joining writer that has taken
    /// the lock exclusively but not yet written its own: a second joining writer waits for it
    /// (it was refused at once, told that a forked child of the dead writer held the lock).
    #[test]
    fn a_joining_writer_waits_for_one_replacing_a_dead_sole_writers_text() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOCK_FILE);
        std::fs::write(&path, "pid 1 on elsewhere\n").unwrap();
        let first = open_lock_file(&path).unwrap();
        first.lock().unwrap();
        let joined = std::thread::spawn({
            let dir = dir.path().to_path_buf();
            move || SharedLock::join(&dir, &mut || Ok(()))
        });
        std::thread::sleep(std::time::Duration::from_millis(60));
        std::fs::write(&path, "writers sharing the dataset\n").unwrap();
        first.lock_shared().unwrap();
        let second = joined.join().unwrap().unwrap();
        drop((first, second));
    }

    /// A lock whose file names a process of this host that exited is held by a child it
    /// forked: the refusal says so and how to find it. One naming a live process says only
    /// who holds it.
    #[test]
    fn a_lock_held_after_its_writer_exited_names_the_forked_child() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOCK_FILE);
        let held = open_lock_file(&path).unwrap();
        held.try_lock().unwrap();
        let parent = std::os::unix::process::parent_id();
        for (pid, exited) in [(u32::MAX, true), (parent, false)] {
            // Also as writers sharing the dataset name the first of them: it said only that.
            for before in ["pid ", SHARED_HOLDER] {
                std::fs::write(&path, format!("{before}{pid} on {}\n", host_name())).unwrap();
                let msg = WriterLock::take(dir.path()).unwrap_err().to_string();
                assert!(msg.contains(&format!("pid {pid} on ")), "{msg}");
                assert_eq!(msg.contains("which has exited"), exited, "{msg}");
                assert_eq!(msg.contains("fuser -v"), exited, "{msg}");
            }
        }
    }

    #[test]
    fn a_lock_on_a_file_deleted_meanwhile_is_let_go() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOCK_FILE);
        // What a late opener holds after the holder deleted the name: a locked, nameless file.
        let orphan = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(!still_named(&orphan, &path).unwrap());
        orphan.try_lock().unwrap();
        // The name is free: a new writer takes a new file, and holds it alone.
        let lock = WriterLock::take(dir.path()).unwrap();
        assert!(still_named(&lock.file, &path).unwrap());
        assert!(WriterLock::take(dir.path()).is_err());
    }

    #[test]
    fn a_lock_file_left_by_a_dead_writer_is_taken() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(LOCK_FILE), "pid 4294967 on elsewhere\n").unwrap();
        let lock = WriterLock::take(dir.path()).unwrap();
        let text = std::fs::read_to_string(dir.path().join(LOCK_FILE)).unwrap();
        assert!(
            text.starts_with(&format!("pid {} on ", std::process::id())),
            "{text}"
        );
        drop(lock);
    }
}
