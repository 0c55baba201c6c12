//! The ring of pinned host slots and the counters users see.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

use super::driver::{Driver, Event, Pinned};
use super::error::CaptureError;

/// The smallest slot a ring sized from what is captured uses.
pub(crate) const MIN_AUTO_SLOT: usize = 1 << 20;
/// The largest: a field over 1 GiB (more than 74,000 rows of 7168 bf16) is split over
/// slots and joined by a host copy, rather than pinning gigabytes per slot.
pub(crate) const MAX_AUTO_SLOT: usize = 1 << 30;

/// One pinned buffer and the event that marks the end of the copies into it. The buffer is
/// behind a lock only so that a ring sized from what is captured can replace it with a
/// larger one; the slot's owner is the only one who ever takes the lock.
#[derive(Debug)]
pub(crate) struct Slot {
    buf: Mutex<Pinned>,
    pub(crate) done: Event,
}

impl Slot {
    /// A slot of `bytes` pinned bytes.
    pub(crate) fn new(drv: &'static Driver, bytes: usize) -> Result<Self, CaptureError> {
        Ok(Slot {
            buf: Mutex::new(Pinned::new(drv, bytes)?),
            done: Event::new(drv)?,
        })
    }

    /// The buffer; call only as the slot's owner.
    pub(crate) fn buf(&self) -> MutexGuard<'_, Pinned> {
        // Every update replaces the buffer whole, so a poisoned lock is still consistent.
        self.buf.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// How big a ring's slots are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotSize {
    /// Slots of this many bytes, allocated up front.
    Fixed(usize),
    /// Slots as big as the largest field captured so far, rounded up to a power of two
    /// within [`MIN_AUTO_SLOT`]..=[`MAX_AUTO_SLOT`]; each grows when it is next taken.
    FromFields,
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
    drv: &'static Driver,
    slots: Vec<Slot>,
    size: SlotSize,
    /// Bytes of a slot now: the fixed size, or the size fields captured so far asked for.
    slot_bytes: AtomicUsize,
    state: Mutex<State>,
    freed: Condvar,
    pub(crate) counters: Counters,
}

impl Ring {
    /// Makes `count` slots in the current context: allocated now when their size is fixed,
    /// on first use when it comes from the fields.
    pub(crate) fn new(
        drv: &'static Driver,
        count: usize,
        size: SlotSize,
    ) -> Result<Self, CaptureError> {
        let bytes = match size {
            SlotSize::Fixed(bytes) => bytes,
            SlotSize::FromFields => 0,
        };
        let slots = (0..count)
            .map(|_| Slot::new(drv, bytes))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Ring {
            drv,
            slots,
            size,
            slot_bytes: AtomicUsize::new(bytes),
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

    /// Bytes of a slot now.
    pub(crate) fn slot_bytes(&self) -> usize {
        self.slot_bytes.load(Ordering::Relaxed)
    }

    /// The slot size to lay out a sample with these field lengths: the fixed size, or one
    /// grown to hold the largest field (see [`SlotSize::FromFields`]).
    pub(crate) fn slot_bytes_for(&self, lens: &[usize]) -> usize {
        match self.size {
            SlotSize::Fixed(bytes) => bytes,
            SlotSize::FromFields => {
                let largest = lens.iter().copied().max().unwrap_or(0);
                let want = largest
                    .checked_next_power_of_two()
                    .unwrap_or(MAX_AUTO_SLOT)
                    .clamp(MIN_AUTO_SLOT, MAX_AUTO_SLOT);
                self.slot_bytes.fetch_max(want, Ordering::Relaxed).max(want)
            }
        }
    }

    /// Makes slot `i` (held by the caller) at least `bytes` long, replacing its buffer.
    pub(crate) fn fit(&self, i: usize, bytes: usize) -> Result<(), CaptureError> {
        let mut buf = self.slots[i].buf();
        if buf.len() < bytes {
            // The old buffer goes first (an empty one allocates nothing), so the ring never
            // holds both.
            *buf = Pinned::new(self.drv, 0)?;
            *buf = Pinned::new(self.drv, bytes)?;
        }
        Ok(())
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
