//! The async runtime object storage runs on, one per process: a runtime (and the HTTP
//! connections on it) inherited through `fork` would hang in the child, as rayon's pool did
//! (see `crate::parallel`), so a forked DataLoader worker builds its own
//! ([`PerProcess`]).

use std::future::Future;
use std::sync::Arc;

use tokio::runtime::Runtime;

use crate::per_process::PerProcess;

static RUNTIME: PerProcess<Runtime> = PerProcess::new();

/// This process's runtime, built on first use.
pub fn runtime() -> std::io::Result<Arc<Runtime>> {
    RUNTIME.get(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .thread_name("hspack-io")
            .enable_all()
            .build()
    })
}

/// Runs `future` to completion on this process's runtime, from synchronous code.
pub fn block_on<F: Future>(future: F) -> std::io::Result<F::Output> {
    Ok(runtime()?.block_on(future))
}
