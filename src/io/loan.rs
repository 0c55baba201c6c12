//! Memory a process lends to others: where a DataLoader worker builds a sample, so that the
//! trainer process maps it rather than receiving a copy, and the worker reuses it once the
//! trainer is done with it.
//!
//! Torch sends a worker's tensor through a new shared segment each time: fresh memory, whose
//! every page faults and is zeroed in the worker, then faults again in the trainer. For the
//! EAGLE-3 view of per-layer captures (one 126 MB concatenation per sample) that held 2 workers
//! to 2.3 GB/s on a 2-core VM, below one process reading alone.
//!
//! The protocol, over a [`SharedRegion`] (an in-memory file whose header counts loans):
//! - the owner [`take`]s a region no one uses (no handle in this process, no loan out) and
//!   writes the data;
//! - to hand it over it takes a loan out ([`lend`]) and sends the region's descriptor;
//! - the receiver maps the region ([`Loan::receive`]) and ends the loan when its [`Loan`] is
//!   dropped (when the last tensor over it is collected);
//! - only then may the owner [`take`] the region again and overwrite it.
//!
//! A loan sent but never received (a message dropped at shutdown) keeps its region out of use
//! until the owner exits: memory held, never data overwritten. A forked process starts with
//! no regions: the ones it inherits are its parent's. Nor does it end the loans it inherits
//! (a trainer forking with a batch in hand): only the process that received a loan ends it.

use std::sync::{Arc, Mutex};

use super::mmap::{FileId, SharedRegion};

/// Bytes of regions free for reuse that a process keeps; the oldest beyond go.
pub const KEEP: usize = 512 << 20;

/// Sizes of regions for more than half of this are multiples of it.
const GRAIN: usize = 2 << 20;

/// The smallest region.
const PAGE: usize = 4096;

/// Bytes of received regions that no loan uses a process keeps mapped; the oldest beyond go.
pub const RECEIVED_KEEP: usize = 1 << 30;

static POOL: Mutex<Pool> = Mutex::new(Pool::new(KEEP));

static RECEIVED: Mutex<Received> = Mutex::new(Received::new(RECEIVED_KEEP));

/// A region of at least `len` bytes of data, for this process to write and then [`lend`]: one
/// that nobody uses any more (the smallest that fits), else a new one. A region stays in use
/// while the returned handle (or a clone) lives, and while a loan on it is out.
pub fn take(len: usize) -> std::io::Result<Arc<SharedRegion>> {
    take_in(&POOL, len)
}

fn take_in(pool: &Mutex<Pool>, len: usize) -> std::io::Result<Arc<SharedRegion>> {
    let Some(mut guard) = lock(pool) else {
        return SharedRegion::create(len).map(Arc::new);
    };
    if let Some(region) = guard.reuse(len) {
        return Ok(region);
    }
    guard.trim(len);
    drop(guard); // making a region takes milliseconds: others may lend meanwhile
    let region = Arc::new(SharedRegion::create(Pool::size_for(len))?);
    if let Some(mut guard) = lock(pool) {
        guard.mine().push(region.clone());
    }
    Ok(region)
}

/// The region of this process that holds bytes `addr..addr + len`, and where `addr` lies in
/// its data, with a loan taken out on it for a process the region is about to be sent to;
/// None when no region of this process holds them.
pub fn lend(addr: usize, len: usize) -> Option<(Arc<SharedRegion>, usize)> {
    let region = lock(&POOL)?.holding(addr, len)?;
    region.lend();
    let offset = addr - region.data_ptr() as usize;
    Some((region, offset))
}

/// The pool (or the received regions), waiting at most about 10 ms for it (a DataLoader
/// worker takes memory on one thread while its queue's thread lends what it sends, each
/// holding the lock for microseconds). Never waiting for good: a process forked while another thread held the
/// lock finds it held forever, and does without.
fn lock<T>(m: &Mutex<T>) -> Option<std::sync::MutexGuard<'_, T>> {
    crate::per_process::lock_briefly(m, 100)
}

/// A region received from the process that lent it: the data `offset..offset + len` are this
/// process's to read and write until the loan is dropped, which ends it.
#[derive(Debug)]
pub struct Loan {
    region: Arc<SharedRegion>,
    offset: usize,
    len: usize,
    /// The process that received it, the only one that ends it: a child forked from it
    /// inherits a copy that must not end the loan a second time while the parent still
    /// reads (the owner would reuse the memory under it).
    receiver: u32,
}

impl Loan {
    /// The region that process `pid` holds open as descriptor `fd`, of identity `id`, for its
    /// data `offset..offset + len`; the owner took the loan out ([`lend`]). A region received
    /// before is not opened again: the process keeps received regions mapped while their owner
    /// may lend them again (up to [`RECEIVED_KEEP`] bytes of them unused), so their pages stay
    /// in place from one sample to the next. A new one is opened through `/proc` (no
    /// descriptor passing, which costs a round trip to the owner per sample).
    pub fn receive(
        pid: u32,
        fd: i32,
        id: FileId,
        offset: usize,
        len: usize,
    ) -> std::io::Result<Loan> {
        let open = || {
            let path = format!("/proc/{pid}/fd/{fd}");
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path);
            let file = file.map_err(|e| {
                std::io::Error::new(e.kind(), format!("{path}: {e} (did the worker exit?)"))
            })?;
            if FileId::of_open(&file)? != id {
                return Err(std::io::Error::other(format!(
                    "{path} is no longer the shared memory sent (did the worker exit?)"
                )));
            }
            Ok(file)
        };
        let region = match lock(&RECEIVED) {
            Some(mut received) => received.get(id, open)?,
            None => Arc::new(SharedRegion::map_received(open()?)?),
        };
        if offset
            .checked_add(len)
            .is_none_or(|end| end > region.data_len())
        {
            // Refused, the loan ends here: the owner may reuse its region.
            region.end_loan();
            return Err(std::io::Error::other(
                "range past the end of the shared region",
            ));
        }
        Ok(Loan {
            region,
            offset,
            len,
            receiver: std::process::id(),
        })
    }

    /// The first byte of the data lent.
    pub fn as_ptr(&self) -> *const u8 {
        self.region.data_ptr().wrapping_add(self.offset)
    }

    /// Bytes lent.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no bytes were lent.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Loan {
    fn drop(&mut self) {
        if self.receiver == std::process::id() {
            self.region.end_loan();
        }
    }
}

/// This process's regions, oldest first.
struct Pool {
    regions: Vec<Arc<SharedRegion>>,
    keep: usize,
    owner: u32,
}

impl Pool {
    const fn new(keep: usize) -> Self {
        Pool {
            regions: Vec::new(),
            keep,
            owner: 0,
        }
    }

    /// The regions, emptied first in a process other than the one that made them.
    fn mine(&mut self) -> &mut Vec<Arc<SharedRegion>> {
        let pid = std::process::id();
        if self.owner != pid {
            self.regions.clear();
            self.owner = pid;
        }
        &mut self.regions
    }

    fn free(region: &Arc<SharedRegion>) -> bool {
        Arc::strong_count(region) == 1 && region.loans() == 0
    }

    /// The smallest free region that holds `len` bytes.
    fn reuse(&mut self, len: usize) -> Option<Arc<SharedRegion>> {
        self.mine()
            .iter()
            .filter(|r| Pool::free(r) && r.data_len() >= len)
            .min_by_key(|r| r.data_len())
            .cloned()
    }

    /// The size of a new region for `len` bytes: with room to spare, so later samples a
    /// little longer reuse it too; a power of two (from a page) for small tensors (a batch's
    /// masks and token ids).
    fn size_for(len: usize) -> usize {
        if len <= GRAIN / 2 {
            len.max(PAGE).next_power_of_two()
        } else {
            (len + len / 4).next_multiple_of(GRAIN)
        }
    }

    /// Drops the oldest free regions until the free ones, with `coming` bytes more, fit in
    /// the limit.
    fn trim(&mut self, coming: usize) {
        let free_bytes = |rs: &[Arc<SharedRegion>]| -> usize {
            rs.iter()
                .filter(|r| Pool::free(r))
                .map(|r| r.data_len())
                .sum()
        };
        while free_bytes(&self.regions) + coming > self.keep {
            match self.regions.iter().position(Pool::free) {
                Some(i) => self.regions.remove(i).retire(),
                None => break,
            }
        }
    }

    fn holding(&mut self, addr: usize, len: usize) -> Option<Arc<SharedRegion>> {
        let end = addr.checked_add(len)?;
        self.mine()
            .iter()
            .find(|r| {
                let start = r.data_ptr() as usize;
                addr >= start && end <= start + r.data_len()
            })
            .cloned()
    }
}

/// Regions this process received, oldest first.
struct Received {
    regions: Vec<(FileId, Arc<SharedRegion>)>,
    keep: usize,
}

impl Received {
    const fn new(keep: usize) -> Self {
        Received {
            regions: Vec::new(),
            keep,
        }
    }

    /// The region of identity `id`: the mapping kept from an earlier loan, else a new one of
    /// the file `open` gives, kept. Regions no loan uses are let go first when their owner let go of them or
    /// exited, then the oldest beyond the limit.
    fn get(
        &mut self,
        id: FileId,
        open: impl FnOnce() -> std::io::Result<std::fs::File>,
    ) -> std::io::Result<Arc<SharedRegion>> {
        // While kept here the file lives, so no other file can take its identity.
        if let Some((_, region)) = self.regions.iter().find(|(k, _)| *k == id) {
            return Ok(region.clone());
        }
        let unused = |r: &Arc<SharedRegion>| Arc::strong_count(r) == 1;
        let gone = |pid: u64| !std::path::Path::new(&format!("/proc/{pid}")).exists();
        self.regions
            .retain(|(_, r)| !(unused(r) && (r.retired() || gone(r.owner()))));
        let region = Arc::new(SharedRegion::map_received(open()?)?);
        self.regions.push((id, region.clone()));
        loop {
            let mut idle = self.regions.iter().filter(|(_, r)| unused(r));
            if idle.clone().map(|(_, r)| r.data_len()).sum::<usize>() <= self.keep {
                break;
            }
            let oldest = idle.next().map(|(k, _)| *k);
            self.regions.retain(|(k, _)| Some(*k) != oldest);
        }
        Ok(region)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::os::fd::AsRawFd;

    /// A loan on `region`, received as another process receives it.
    fn receive(region: &SharedRegion, offset: usize, len: usize) -> std::io::Result<Loan> {
        let id = region.id();
        Loan::receive(std::process::id(), region.fd().unwrap(), id, offset, len)
    }

    const MIB: usize = 1 << 20;

    #[test]
    fn a_region_is_reused_only_when_no_handle_and_no_loan_is_left() {
        let pool = Mutex::new(Pool::new(64 * MIB));
        let a = take_in(&pool, 3 * MIB).unwrap();
        assert!(a.data_len() >= 3 * MIB && a.data_len().is_multiple_of(GRAIN));
        let at = a.data_ptr();
        // Still held here: a second request gets another region.
        let b = take_in(&pool, MIB).unwrap();
        assert_ne!(b.data_ptr(), at);
        drop(b);
        // Lent, then the handle dropped: the loan keeps it out of use.
        let (lent, offset) = {
            let region = pool.lock().unwrap().holding(at as usize + 100, 10).unwrap();
            region.lend();
            (region, 100)
        };
        drop(lent);
        drop(a);
        let c = take_in(&pool, 3 * MIB).unwrap();
        assert_ne!(c.data_ptr(), at, "a region with a loan out is not reused");
        drop(c);
        // The receiver ends the loan: the region is free again.
        let region = pool.lock().unwrap().holding(at as usize, 1).unwrap();
        let loan = receive(&region, offset, 10).unwrap();
        drop(region);
        assert_ne!(
            take_in(&pool, 3 * MIB).unwrap().data_ptr(),
            at,
            "still lent"
        );
        drop(loan);
        let again = take_in(&pool, 3 * MIB).unwrap();
        assert_eq!(again.data_ptr(), at, "reused once the loan ended");
    }

    #[test]
    fn a_loan_maps_the_range_asked_and_ends_when_dropped() {
        let region = SharedRegion::create(MIB).unwrap();
        region.lend();
        let loan = receive(&region, 4096, 8).unwrap();
        assert_eq!(loan.len(), 8);
        assert_eq!(
            loan.as_ptr() as usize - loan.region.data_ptr() as usize,
            4096
        );
        assert_eq!(region.loans(), 1);
        drop(loan);
        assert_eq!(region.loans(), 0);
    }

    #[test]
    fn a_copy_of_a_loan_dropped_in_another_process_leaves_it_out() {
        let region = SharedRegion::create(MIB).unwrap();
        region.lend();
        let mut loan = receive(&region, 0, 8).unwrap();
        loan.receiver = std::process::id() + 1; // as a forked child's copy sees it
        drop(loan);
        assert_eq!(region.loans(), 1, "the receiver still holds it");
    }

    #[test]
    fn a_descriptor_of_another_file_or_a_range_past_the_end_is_refused() {
        let file = tempfile::tempfile().unwrap();
        file.set_len(1 << 16).unwrap();
        let id = FileId::of_open(&file).unwrap();
        let me = std::process::id();
        assert!(
            Loan::receive(me, file.as_raw_fd(), id, 0, 16).is_err(),
            "no magic"
        );
        let region = SharedRegion::create(MIB).unwrap();
        region.lend();
        region.lend();
        assert!(receive(&region, MIB, 1).is_err(), "past the end");
        assert!(receive(&region, usize::MAX, 2).is_err());
        assert_eq!(
            region.loans(),
            0,
            "a refused loan ends: the owner may reuse it"
        );
        let other = Loan::receive(me, region.fd().unwrap(), id, 0, 1).unwrap_err();
        assert!(
            other
                .to_string()
                .contains("no longer the shared memory sent"),
            "{other}"
        );
        let fresh = SharedRegion::create(MIB).unwrap();
        assert!(Loan::receive(me, -1, fresh.id(), 0, 1).is_err());
        assert_eq!(region.loans(), 0);
    }

    #[test]
    fn a_received_region_holds_no_descriptor_open() {
        let open_fds = || std::fs::read_dir("/proc/self/fd").unwrap().count();
        let regions: Vec<_> = (0..64)
            .map(|_| {
                let region = SharedRegion::create(PAGE).unwrap();
                region.lend();
                region
            })
            .collect();
        let before = open_fds();
        let mut received = Received::new(RECEIVED_KEEP);
        for r in &regions {
            let path = format!("/proc/self/fd/{}", r.fd().unwrap());
            let open = || std::fs::File::options().read(true).write(true).open(path);
            let got = received.get(r.id(), open).unwrap();
            assert_eq!(got.fd(), None);
            assert_eq!(got.id(), r.id());
        }
        assert_eq!(received.regions.len(), 64, "all kept mapped");
        // Other tests may open files meanwhile: 64 more would be the received ones.
        assert!(open_fds() < before + 32, "{before} -> {}", open_fds());
        // The mapping still holds the owner's memory: its loan count is the owner's.
        let (_, first) = &received.regions[0];
        first.end_loan();
        assert_eq!(regions[0].loans(), 0);
    }

    #[test]
    fn small_requests_take_a_power_of_two_large_ones_room_to_spare() {
        let sizes = [1, 5000, MIB, GRAIN, 3 * MIB].map(Pool::size_for);
        assert_eq!(sizes, [PAGE, 8192, MIB, 2 * GRAIN, 2 * GRAIN]);
    }

    #[test]
    fn free_regions_beyond_the_limit_go_oldest_first_and_a_child_starts_empty() {
        let pool = Mutex::new(Pool::new(16 * MIB));
        let held: Vec<_> = (0..4).map(|_| take_in(&pool, GRAIN).unwrap()).collect();
        let newest = held[3].data_ptr();
        drop(held);
        // 4 free regions of 4 MiB (the limit): a 10 MiB request makes room for itself.
        let big = take_in(&pool, 10 * MIB).unwrap();
        let kept: Vec<_> = pool
            .lock()
            .unwrap()
            .regions
            .iter()
            .map(|r| r.data_ptr())
            .collect();
        assert_eq!(kept, [newest, big.data_ptr()]);
        drop(big);
        pool.lock().unwrap().owner = std::process::id() + 1; // a forked child's view
        let fresh = take_in(&pool, MIB).unwrap();
        assert_eq!(
            pool.lock().unwrap().regions.len(),
            1,
            "the parent's are not reused"
        );
        drop(fresh);
    }

    #[test]
    fn a_received_region_is_mapped_once_and_let_go_when_retired_or_beyond_the_limit() {
        let mut received = Received::new(2 * MIB);
        let mut get = |r: &SharedRegion| {
            let path = format!("/proc/self/fd/{}", r.fd().unwrap());
            let open = || {
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(path)
            };
            let got = received.get(r.id(), open).unwrap();
            let kept: Vec<_> = received.regions.iter().map(|(k, _)| *k).collect();
            (got, kept)
        };
        let [a, b, c, d] = [2, 2, 1, 3].map(|mib| SharedRegion::create(mib * MIB).unwrap());
        let ids = [&a, &b, &c, &d].map(|r| r.id());
        let (first, _) = get(&a);
        let (again, _) = get(&a);
        assert!(Arc::ptr_eq(&first, &again), "mapped once");
        drop((first, again));
        assert_eq!(get(&b).1, [ids[0], ids[1]]);
        a.retire();
        let (held, kept) = get(&c);
        assert_eq!(kept, [ids[1], ids[2]], "a retired region no loan uses goes");
        let (held_d, kept) = get(&d);
        assert_eq!(
            kept,
            [ids[1], ids[2], ids[3]],
            "2 MiB unused: within the limit"
        );
        drop(held);
        // Unused: b and c (3 MiB), over the limit: the older goes.
        assert_eq!(get(&a).1, [ids[2], ids[3], ids[0]]);
        drop(held_d);
    }
}
