//! A value owned by the current process, made anew in a process forked from one that made it.
//!
//! A forked child inherits the parent's memory but none of its threads: a thread pool, an
//! async runtime or an HTTP client inherited that way hangs when used. The inherited value is
//! never dropped either (dropping it would signal threads that do not exist): it is forgotten.
//!
//! The lock is held only to read or swap one pointer, never while a value is made (which
//! starts threads): a process forked while another thread made one would otherwise inherit
//! the lock held, for good. It is tried for a while, never waited on without end: a child
//! forked in the instant a thread held it makes a value for each use instead of hanging.

use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

type Slot<T> = Option<(u32, Arc<T>)>;

/// One `T` per process id.
pub(crate) struct PerProcess<T>(Mutex<Slot<T>>);

impl<T> PerProcess<T> {
    /// Empty: the first [`PerProcess::get`] of each process makes the value.
    pub(crate) const fn new() -> Self {
        PerProcess(Mutex::new(None))
    }

    /// This process's value, made with `make` on first use in this process.
    pub(crate) fn get<E>(&self, make: impl FnOnce() -> Result<T, E>) -> Result<Arc<T>, E> {
        let pid = std::process::id();
        let mine = |slot: &Slot<T>| match slot {
            Some((owner, value)) if *owner == pid => Some(Arc::clone(value)),
            _ => None,
        };
        if let Some(value) = self.lock().and_then(|slot| mine(&slot)) {
            return Ok(value);
        }
        let value = Arc::new(make()?);
        let Some(mut slot) = self.lock() else {
            return Ok(value);
        };
        if let Some(first) = mine(&slot) {
            return Ok(first); // another thread made one meanwhile
        }
        if let Some(inherited) = slot.replace((pid, Arc::clone(&value))) {
            std::mem::forget(inherited);
        }
        Ok(value)
    }

    /// The slot, waiting at most about 100 ms for it.
    fn lock(&self) -> Option<MutexGuard<'_, Slot<T>>> {
        lock_for_an_instant(&self.0)
    }
}

/// `m`, a lock threads hold for an instant, tried for about 100 ms ([`lock_briefly`]).
pub(crate) fn lock_for_an_instant<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    lock_briefly(m, 1000)
}

/// `m`, tried [`YIELDS`] times yielding between tries, then up to `tries` times every 0.1 ms
/// (a poisoned lock is taken as it is); `None` when it stays held. For locks a thread holds
/// for an instant, in memory a fork copies: a child forked in that instant inherits the lock
/// held for good, and does without what it guards rather than hang.
pub(crate) fn lock_briefly<T>(m: &Mutex<T>, tries: u32) -> Option<MutexGuard<'_, T>> {
    for i in 0..YIELDS + tries {
        match m.try_lock() {
            Ok(guard) => return Some(guard),
            Err(TryLockError::Poisoned(p)) => return Some(p.into_inner()),
            Err(TryLockError::WouldBlock) if i < YIELDS => std::thread::yield_now(),
            Err(TryLockError::WouldBlock) => {
                std::thread::sleep(std::time::Duration::from_micros(100))
            }
        }
    }
    None
}

/// Tries of [`lock_briefly`] that yield rather than sleep: threads reading one dataset meet
/// at a lock held for a lookup, which a sleep of 0.1 ms would make the cost of a read.
const YIELDS: u32 = 64;

impl<T> std::fmt::Debug for PerProcess<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PerProcess")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_being_made_holds_no_lock_and_one_value_wins() {
        static SLOT: PerProcess<u32> = PerProcess::new();
        let (started, wait) = std::sync::mpsc::channel();
        let (release, go) = std::sync::mpsc::channel::<()>();
        let slow = std::thread::spawn(move || {
            SLOT.get(|| {
                started.send(()).unwrap();
                go.recv().unwrap();
                Ok::<_, ()>(1)
            })
        });
        wait.recv().unwrap();
        // While the slow thread makes its value, another gets through at once.
        let (done, fast) = std::sync::mpsc::channel();
        std::thread::spawn(move || done.send(SLOT.get(|| Ok::<_, ()>(2)).unwrap()));
        let fast = fast
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("a get waited for another thread's make");
        release.send(()).unwrap();
        let slow = slow.join().unwrap().unwrap();
        assert_eq!(
            (*fast, *slow),
            (2, 2),
            "the value stored first is everyone's"
        );
        assert_eq!(*SLOT.get(|| Ok::<_, ()>(3)).unwrap(), 2);
    }
}
