//! The thread pool hspack's parallel work runs on, made anew in a process forked from one
//! that used it.
//!
//! A forked child inherits the memory of rayon's global pool but none of its threads: work
//! handed to it waits forever. DataLoader workers and `multiprocessing` fork by default on
//! Linux, after the parent may have written, read or verified. So hspack never uses the global
//! pool: every parallel section runs through [`install`], on a pool that belongs to the
//! current process id.

use std::sync::Arc;

use rayon::{ThreadPool, ThreadPoolBuilder};

use crate::per_process::PerProcess;

static POOL: PerProcess<ThreadPool> = PerProcess::new();

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

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

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
}
