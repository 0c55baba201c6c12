//! A value owned by the current process, made anew in a process forked from one that made it.
//!
//! A forked child inherits the parent's memory but none of its threads: a thread pool, an
//! async runtime or an HTTP client inherited that way hangs when used. The inherited value is
//! never dropped either (dropping it would signal threads that do not exist): it is forgotten.

use std::sync::{Arc, Mutex};

/// One `T` per process id.
pub(crate) struct PerProcess<T>(Mutex<Option<(u32, Arc<T>)>>);

impl<T> PerProcess<T> {
    /// Empty: the first [`PerProcess::get`] of each process makes the value.
    pub(crate) const fn new() -> Self {
        PerProcess(Mutex::new(None))
    }

    /// This process's value, made with `make` on first use in this process.
    pub(crate) fn get<E>(&self, make: impl FnOnce() -> Result<T, E>) -> Result<Arc<T>, E> {
        let pid = std::process::id();
        // A child forked while another thread held this lock would find it poisoned or held;
        // the lock is only held to read or set one pointer, so poisoning is all that can be
        // seen.
        let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((owner, value)) = &*slot {
            if *owner == pid {
                return Ok(Arc::clone(value));
            }
        }
        let value = Arc::new(make()?);
        if let Some(inherited) = slot.replace((pid, Arc::clone(&value))) {
            std::mem::forget(inherited);
        }
        Ok(value)
    }
}

impl<T> std::fmt::Debug for PerProcess<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PerProcess")
    }
}
