//! The thread pool hspack's parallel work runs on, made anew in a process forked from one
//! that used it.
//!
//! A forked child inherits the memory of rayon's global pool but none of its threads: work
//! handed to it waits forever. DataLoader workers and `multiprocessing` fork by default on
//! Linux, after the parent may have written, read or verified. So hspack never uses the global
//! pool: every parallel section runs through [`install`], on a pool that belongs to the
//! current process id.

use std::sync::Arc;

use rayon::prelude::*;
use rayon::{ThreadPool, ThreadPoolBuilder};

use crate::per_process::PerProcess;

static POOL: PerProcess<ThreadPool> = PerProcess::new();

/// The most threads a `jobs` option starts (`--jobs` of convert, cp, sync): one is started
/// for each, so a number past what a machine runs is refused, not tried.
pub const MAX_JOBS: usize = 4096;

/// What is wrong with `jobs` as a number of threads to start, if anything: it takes 1 to
/// [`MAX_JOBS`].
pub fn jobs_problem(jobs: usize) -> Option<String> {
    (!(1..=MAX_JOBS).contains(&jobs)).then(|| {
        format!(
            "give 1 to {MAX_JOBS} (one thread is started for each; the cores here: {})",
            std::thread::available_parallelism().map_or(1, |n| n.get())
        )
    })
}

/// `jobs` of option `option`, checked ([`jobs_problem`]).
pub fn checked_jobs(option: &'static str, jobs: usize) -> crate::Result<usize> {
    match jobs_problem(jobs) {
        None => Ok(jobs),
        Some(problem) => Err(crate::Error::BadOption {
            option,
            detail: format!("{jobs} threads: {problem}"),
        }),
    }
}

/// Bytes of work below which a section runs on the calling thread: waking the pool's threads
/// (and their spinning while idle) costs more than they save on a sample of a few tokens.
pub const WORTH_THE_POOL: u64 = 1 << 20;

/// This process's pool, built on first use in each process.
fn pool() -> Arc<ThreadPool> {
    let build = |threads| {
        ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("hspack-{i}"))
            .build()
    };
    // When the machine refuses threads, one is tried before giving up.
    POOL.get(|| build(0).or_else(|_| build(1)))
        .expect("hspack: the operating system refused to start a worker thread")
}

/// Runs `op` on this process's pool: rayon's parallel iterators and `join` inside it use
/// that pool.
///
/// From a thread of another pool (a caller's, e.g. `hspack cp`'s), `op` runs on ours while
/// the calling thread blocks. Rayon's own cross-pool `install` would have the caller run its
/// pool's other jobs while it waits; a caller that holds a lock one of those jobs takes (a
/// stored dataset's write state, held while a file is added) would then wait for itself.
pub fn install<R: Send>(op: impl FnOnce() -> R + Send) -> R {
    let pool = pool();
    if rayon::current_thread_index().is_none() {
        return pool.install(op);
    }
    if pool.current_thread_index().is_some() {
        return op(); // already on ours
    }
    std::thread::scope(|s| {
        s.spawn(|| pool.install(op))
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// Adds `bytes` to `hasher`, a large input on this process's pool (BLAKE3's own parallel
/// hashing), never on rayon's global pool: a child forked after the global pool hashed has
/// none of its threads, and would wait for them forever.
/// On a thread of another pool (`hspack cp`'s, hashing many chunks at once) it hashes there:
/// handing each chunk to ours would cost a thread per chunk and gain nothing.
pub fn blake3_update(hasher: &mut blake3::Hasher, bytes: &[u8]) {
    let on_another_pool =
        rayon::current_thread_index().is_some() && pool().current_thread_index().is_none();
    if (bytes.len() as u64) < WORTH_THE_POOL || on_another_pool {
        hasher.update(bytes);
    } else {
        // On our pool: `install` makes it the one rayon's `join` inside uses.
        #[allow(clippy::disallowed_methods)]
        install(|| {
            hasher.update_rayon(bytes);
        });
    }
}

/// The BLAKE3 hash of `bytes`, as [`blake3_update`] hashes them.
pub fn blake3_hash(bytes: &[u8]) -> blake3::Hash {
    let mut hasher = blake3::Hasher::new();
    blake3_update(&mut hasher, bytes);
    hasher.finalize()
}

/// Bytes a thread of the pool copies at a time in [`fill`].
const FILL_PIECE: usize = 1 << 20;

/// Fills each destination with its source's bytes (of the same length), or with zeros where
/// the source is `None`, on the pool in pieces of 1 MiB; work smaller in all than
/// [`WORTH_THE_POOL`] runs on the calling thread. For gathers whose caller is one thread (the
/// DataLoader's pin-memory thread padding a batch) on a machine with cores to spare.
///
/// # Panics
///
/// When a source's length differs from its destination's.
pub fn fill(parts: Vec<(&mut [u8], Option<&[u8]>)>) {
    let one = |dst: &mut [u8], src: Option<&[u8]>| match src {
        Some(src) => dst.copy_from_slice(src),
        None => dst.fill(0),
    };
    let total: usize = parts.iter().map(|(dst, _)| dst.len()).sum();
    if (total as u64) < WORTH_THE_POOL {
        parts.into_iter().for_each(|(dst, src)| one(dst, src));
        return;
    }
    let mut pieces: Vec<(&mut [u8], Option<&[u8]>)> = Vec::new();
    for (dst, src) in parts {
        assert!(
            src.is_none_or(|s| s.len() == dst.len()),
            "fill: lengths differ"
        );
        for (i, d) in dst.chunks_mut(FILL_PIECE).enumerate() {
            let s = src.map(|s| &s[i * FILL_PIECE..][..d.len()]);
            pieces.push((d, s));
        }
    }
    install(|| pieces.into_par_iter().for_each(|(dst, src)| one(dst, src)));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs parallel work through [`install`] and checks that every piece ran on our pool.
    fn assert_runs_on_our_pool() {
        let names: Vec<String> = install(|| {
            (0..64)
                .into_par_iter()
                .map(|_| std::thread::current().name().unwrap_or("").to_string())
                .collect()
        });
        assert!(names.iter().all(|n| n.starts_with("hspack-")), "{names:?}");
    }

    #[test]
    fn large_inputs_hash_as_blake3_does_on_one_thread() {
        let bytes: Vec<u8> = (0..3 * WORTH_THE_POOL as usize + 5)
            .map(|i| (i % 251) as u8)
            .collect();
        for n in [0, 1000, WORTH_THE_POOL as usize, bytes.len()] {
            assert_eq!(
                blake3_hash(&bytes[..n]),
                blake3::hash(&bytes[..n]),
                "{n} bytes"
            );
        }
    }

    #[test]
    fn work_runs_on_the_process_pool() {
        assert_runs_on_our_pool();
        assert_eq!(install(|| 6 * 7), 42);
    }

    #[test]
    fn a_thread_of_another_pool_holding_a_lock_waits_without_running_its_pools_jobs() {
        // Each job of the other pool takes the lock, then runs work on ours: a waiting thread
        // that ran its pool's next job would take the lock it holds, and hang.
        let other = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let lock = std::sync::Mutex::new(0u32);
        other.install(|| {
            (0..32).into_par_iter().for_each(|_| {
                let mut held = lock.lock().unwrap();
                assert_runs_on_our_pool();
                *held += 1;
            })
        });
        assert_eq!(*lock.lock().unwrap(), 32);
    }

    #[test]
    fn fill_copies_and_zeroes_large_work_in_pieces_and_small_work_at_once() {
        let src: Vec<u8> = (0..5 * FILL_PIECE + 17)
            .map(|i| (i % 251) as u8 + 1)
            .collect();
        let mut dst = vec![7u8; src.len() + 3 * FILL_PIECE + 5];
        let (a, rest) = dst.split_at_mut(src.len());
        let (b, _) = rest.split_at_mut(3 * FILL_PIECE);
        fill(vec![(a, Some(&src)), (b, None)]);
        assert_eq!(&dst[..src.len()], &src[..]);
        assert!(dst[src.len()..src.len() + 3 * FILL_PIECE]
            .iter()
            .all(|&x| x == 0));
        assert_eq!(&dst[src.len() + 3 * FILL_PIECE..], &[7; 5]);
        let mut small = [9u8; 6];
        let (x, y) = small.split_at_mut(3);
        fill(vec![(x, Some(&[1, 2, 3])), (y, None)]);
        assert_eq!(small, [1, 2, 3, 0, 0, 0]);
    }
}
