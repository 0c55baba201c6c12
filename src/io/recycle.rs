//! Memory a process reuses for reads that overwrite every byte of a new buffer (a sample's
//! concatenated auxiliary states, a decoded or gathered range).
//!
//! A new buffer of tens of MB is fresh memory: the first write to each 4 KiB page faults and
//! the kernel zeroes it. On a 2-core VM that made filling a new 126 MB sample 3.7 GB/s
//! against 13.3 GB/s into memory already faulted in. Buffers made by [`take`] go back here
//! when dropped ([`give_back`]), up to [`KEEP`] bytes in all, and a later request reuses the
//! smallest that holds it (or grows the largest), old bytes and all: callers write every
//! byte.
//!
//! The list is only ever tried, never waited for: a process forked while another thread held
//! it (a DataLoader worker) just allocates anew. A forked process starts with an empty list:
//! the buffers it inherits are its parent's pages, shared copy-on-write, and writing one would
//! copy every page.

use std::sync::Mutex;

/// Bytes of dropped buffers a process keeps for reuse.
pub const KEEP: usize = 256 << 20;

/// Buffers smaller than this come from the allocator's own free lists: not kept.
const SMALLEST: usize = 1 << 20;

static FREE: Mutex<Free> = Mutex::new(Free::new(KEEP));

/// At least `words` words: a kept buffer where one fits (holding an earlier buffer's bytes,
/// and perhaps longer than asked: callers use the first `words`), else new zeroed ones;
/// `None` when that much memory cannot be had (a length a damaged or crafted index declares:
/// an error for the caller to name, not an abort).
pub(crate) fn take(words: usize) -> Option<Vec<u64>> {
    if let Some(kept) = FREE.try_lock().ok().and_then(|mut free| free.take(words)) {
        return Some(kept);
    }
    // Asked first, then taken zeroed (`calloc`: fresh pages, not written here).
    Vec::<u64>::new().try_reserve_exact(words).ok()?;
    Some(vec![0; words])
}

/// Keeps `words` for a later [`take`] (or drops them, when the list is busy).
pub(crate) fn give_back(words: Vec<u64>) {
    if let Ok(mut free) = FREE.try_lock() {
        free.give_back(words);
    }
}

/// Kept buffers, oldest first, at their full length (never truncated: shortening and
/// lengthening again would write every byte in between), and the process they belong to.
struct Free {
    buffers: Vec<Vec<u64>>,
    limit: usize,
    owner: u32,
}

impl Free {
    const fn new(limit: usize) -> Self {
        Free {
            buffers: Vec::new(),
            limit,
            owner: 0,
        }
    }

    /// The list, emptied first in a process other than the one that filled it.
    fn mine(&mut self) -> &mut Vec<Vec<u64>> {
        let pid = std::process::id();
        if self.owner != pid {
            self.buffers.clear();
            self.owner = pid;
        }
        &mut self.buffers
    }

    fn bytes(&self) -> usize {
        self.buffers.iter().map(|v| v.len() * 8).sum()
    }

    /// The smallest kept buffer of at least `words` words, else the largest one grown to
    /// `words` (only the added part is new memory: a large buffer grows by remapping its
    /// pages, not by copying them).
    fn take(&mut self, words: usize) -> Option<Vec<u64>> {
        if words.saturating_mul(8) < SMALLEST || self.mine().is_empty() {
            return None;
        }
        let all = self.buffers.iter().enumerate();
        let fits = all.clone().filter(|(_, v)| v.len() >= words);
        let (i, _) =
            (fits.min_by_key(|(_, v)| v.len())).or_else(|| all.max_by_key(|(_, v)| v.len()))?;
        let mut v = self.buffers.swap_remove(i);
        if v.len() < words {
            // Not the doubling `resize` alone would do; more than memory holds: none.
            if v.try_reserve_exact(words - v.len()).is_err() {
                self.buffers.push(v);
                return None;
            }
            v.resize(words, 0);
        }
        Some(v)
    }

    /// Keeps `words`, dropping the oldest kept buffers beyond the limit.
    fn give_back(&mut self, words: Vec<u64>) {
        if !(SMALLEST..=self.limit).contains(&(words.len() * 8)) {
            return;
        }
        self.mine().push(words);
        while self.bytes() > self.limit {
            self.buffers.remove(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn requests_reuse_the_smallest_buffer_that_holds_them_else_grow_the_largest() {
        let mut free = Free::new(64 * MIB);
        let words = 4 * MIB / 8;
        for (size, fill) in [(words, 7u64), (2 * words, 8)] {
            free.give_back(vec![fill; size]);
        }
        assert_eq!(free.bytes(), 12 * MIB);
        let a = free.take(words / 2).unwrap();
        assert_eq!(a.len(), words, "whole: the caller uses what it asked for");
        assert!(
            a.iter().all(|&w| w == 7),
            "the smaller one, its old bytes in place"
        );
        let at = a.as_ptr();
        free.give_back(a);
        assert_eq!(free.bytes(), 12 * MIB);
        // Larger than any: the largest grows; the new part is zeros.
        let b = free.take(3 * words).unwrap();
        assert_eq!((b.len(), b.capacity()), (3 * words, 3 * words));
        assert!(b[..2 * words].iter().all(|&w| w == 8) && b[2 * words..].iter().all(|&w| w == 0));
        let c = free.take(words).unwrap();
        assert_eq!(c.as_ptr(), at);
        assert!(free.take(words).is_none(), "none left");
        drop((b, c));
    }

    /// More than memory holds, asked of the list (its largest buffer would grow) and of the
    /// allocator: none, not an abort.
    #[test]
    fn more_than_memory_is_none() {
        let mut free = Free::new(64 * MIB);
        free.give_back(vec![1; 4 * MIB / 8]);
        assert!(free.take(usize::MAX / 16).is_none());
        assert_eq!(free.bytes(), 4 * MIB, "the kept buffer stays");
        assert!(take(usize::MAX / 16).is_none());
        assert!(take(usize::MAX).is_none());
    }

    #[test]
    fn a_forked_process_does_not_reuse_its_parents_buffers() {
        let mut free = Free::new(64 * MIB);
        free.give_back(vec![1; 4 * MIB / 8]);
        free.owner = std::process::id() + 1; // as a child sees its parent's list
        assert!(free.take(MIB / 8).is_none());
        assert_eq!(free.bytes(), 0);
        free.give_back(vec![2; 4 * MIB / 8]);
        assert_eq!(free.take(MIB / 8).unwrap()[0], 2, "its own are reused");
    }

    #[test]
    fn the_oldest_go_beyond_the_limit_and_odd_sizes_are_not_kept() {
        let mut free = Free::new(16 * MIB);
        for i in 0..6u64 {
            free.give_back(vec![i; 4 * MIB / 8]);
        }
        assert_eq!(free.bytes(), 16 * MIB);
        let firsts: Vec<u64> = free.buffers.iter().map(|v| v[0]).collect();
        assert_eq!(firsts, [2, 3, 4, 5]);
        free.give_back(vec![0; 16]);
        free.give_back(vec![0; 32 * MIB / 8]);
        assert_eq!(free.bytes(), 16 * MIB);
        assert!(
            free.take(16).is_none(),
            "small requests go to the allocator"
        );
    }
}
