//! The async runtime object storage runs on, one per process: a runtime (and the HTTP
//! connections on it) inherited through `fork` would hang in the child, as rayon's pool did
//! (see `crate::parallel`), so a forked DataLoader worker builds its own.

use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::runtime::Runtime;

static RUNTIME: Mutex<Option<(u32, Arc<Runtime>)>> = Mutex::new(None);

/// This process's runtime, built on first use.
pub fn runtime() -> std::io::Result<Arc<Runtime>> {
    let pid = std::process::id();
    let mut slot = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((owner, rt)) = &*slot {
        if *owner == pid {
            return Ok(Arc::clone(rt));
        }
    }
    if let Some((_, inherited)) = slot.take() {
        // The parent's: its threads do not exist here, so it must never be dropped.
        std::mem::forget(inherited);
    }
    let rt = Arc::new(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .thread_name("hspack-io")
            .enable_all()
            .build()?,
    );
    *slot = Some((pid, Arc::clone(&rt)));
    Ok(rt)
}

/// Runs `future` to completion on this process's runtime, from synchronous code.
pub fn block_on<F: Future>(future: F) -> std::io::Result<F::Output> {
    Ok(runtime()?.block_on(future))
}
