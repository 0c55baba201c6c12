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
pub fn install<R: Send>(op: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        // Already on a pool's thread (ours, or a caller's pool of this process): stay there.
        return op();
    }
    pool().install(op)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    #[test]
    fn work_runs_on_the_process_pool() {
        let names: Vec<String> = install(|| {
            (0..64)
                .into_par_iter()
                .map(|_| std::thread::current().name().unwrap_or("").to_string())
                .collect()
        });
        assert!(names.iter().all(|n| n.starts_with("hspack-")), "{names:?}");
        assert_eq!(install(|| 6 * 7), 42);
    }
}
