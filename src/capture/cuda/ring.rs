//! The ring of pinned host slots and the counters users see.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Instant;

use super::driver::{Driver, Event, Pinned};
use super::error::CaptureError;

/// One pinned buffer and the event that marks the end of the copies into it.
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) buf: Pinned,
    pub(crate) done: Event,
}

#[derive(Debug, Default)]
struct State {
    free: VecDeque<usize>,
    oversize_live: bool,
    poisoned: bool,
}

/// Counters shared by the caller and the writer threads.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) waits: AtomicU64,
    pub(crate) wait_ns: AtomicU64,
    pub(crate) append_ns: AtomicU64,
    pub(crate) bytes_copied: AtomicU64,
    pub(crate) samples_given: AtomicU64,
    pub(crate) samples_written: AtomicU64,
    pub(crate) oversize: AtomicU64,
}

/// Fixed pinned slots handed out in first-freed-first-used order. A slot belongs to one job
/// from `acquire` until `release`; only its owner enqueues copies into it or reads it.
#[derive(Debug)]
pub(crate) struct Ring {
    slots: Vec<Slot>,
    slot_bytes: usize,
    state: Mutex<State>,
    freed: Condvar,
    pub(crate) counters: Counters,
}

impl Ring {
    /// Allocates `count` slots of `slot_bytes` in the current context.
    pub(crate) fn new(
        drv: &'static Driver,
        count: usize,
        slot_bytes: usize,
    ) -> Result<Self, CaptureError> {
        let mut slots = Vec::with_capacity(count);
        for _ in 0..count {
            slots.push(Slot {
                buf: Pinned::new(drv, slot_bytes)?,
                done: Event::new(drv)?,
            });
        }
        Ok(Ring {
            slots,
            slot_bytes,
            state: Mutex::new(State {
                free: (0..count).collect(),
                oversize_live: false,
                poisoned: false,
            }),
            freed: Condvar::new(),
            counters: Counters::default(),
        })
    }

    /// Slots.
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Bytes of a slot.
    pub(crate) fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Slot `i`.
    pub(crate) fn slot(&self, i: usize) -> &Slot {
        &self.slots[i]
    }

    /// Slots in use.
    pub(crate) fn busy(&self) -> usize {
        self.slots.len() - self.lock().free.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves the free list consistent (every update is one
        // push or pop), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn count_wait(&self, since: Instant) {
        let c = &self.counters;
        c.waits.fetch_add(1, Ordering::Relaxed);
        c.wait_ns
            .fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// Takes a free slot, blocking (and counting a wait) while none is free; `None` once the
    /// ring is poisoned.
    pub(crate) fn acquire(&self) -> Option<usize> {
        let mut st = self.lock();
        if let Some(i) = st.free.pop_front() {
            return Some(i);
        }
        let since = Instant::now();
        loop {
            if st.poisoned {
                return None;
            }
            st = self.freed.wait(st).unwrap_or_else(|p| p.into_inner());
            if let Some(i) = st.free.pop_front() {
                drop(st);
                self.count_wait(since);
                return Some(i);
            }
        }
    }

    /// Stops handing out slots: a copy's completion could not be confirmed, so its slots
    /// stay out of use and waiting for them could last forever.
    pub(crate) fn poison(&self) {
        self.lock().poisoned = true;
        self.freed.notify_all();
    }

    /// Gives slots back.
    pub(crate) fn release(&self, slots: &[usize]) {
        if slots.is_empty() {
            return;
        }
        self.lock().free.extend(slots.iter().copied());
        self.freed.notify_all();
    }

    /// Takes the one place for a sample larger than the ring, blocking (and counting a wait)
    /// while another such sample is in flight; false once the ring is poisoned.
    pub(crate) fn acquire_oversize(&self) -> bool {
        let mut st = self.lock();
        if !st.oversize_live {
            st.oversize_live = true;
            return true;
        }
        let since = Instant::now();
        while st.oversize_live {
            if st.poisoned {
                return false;
            }
            st = self.freed.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        st.oversize_live = true;
        drop(st);
        self.count_wait(since);
        true
    }

    /// Gives the oversize place back.
    pub(crate) fn release_oversize(&self) {
        self.lock().oversize_live = false;
        self.freed.notify_all();
    }
}
