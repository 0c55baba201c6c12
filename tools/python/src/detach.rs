//! Running Rust code with the GIL released, safely at interpreter exit.

use pyo3::Python;

/// `py.allow_threads(f)`, without the abort at interpreter exit: a thread that takes the GIL
/// back while Python finalizes (a daemon thread inside `Writer.append` when the main thread
/// returns) is ended by `pthread_exit`, whose forced unwind reaching pyo3's panic trap aborted
/// the process ("FATAL: exception not rethrown", exit status 134). Such a thread is parked for
/// good here instead, as Python 3.14 itself does, and goes with the process. A panic in `f`
/// unwinds as before (it is not a forced unwind: `std::thread::panicking` tells them apart).
pub fn detached<T: Send>(py: Python<'_>, f: impl FnOnce() -> T + Send) -> T {
    struct ParkOnForcedUnwind;
    impl Drop for ParkOnForcedUnwind {
        fn drop(&mut self) {
            if !std::thread::panicking() {
                loop {
                    std::thread::park();
                }
            }
        }
    }
    let guard = ParkOnForcedUnwind;
    let out = py.allow_threads(f);
    std::mem::forget(guard);
    out
}
