//! Named points where a test can crash the process, as `kill -9` would, at each publish step.
//!
//! Built only with the `failpoints` feature (for tests): the `fail` crate then reads the
//! `FAILPOINTS` environment variable (`NAME=2*off->return`: crash at the third pass), and a
//! point set to `return` aborts the process there: no destructor runs, no buffer is flushed,
//! no temp file is removed. Without the feature a point is nothing.

/// Marks a failpoint named `$name` (one of [`ALL`]).
macro_rules! failpoint {
    ($name:literal) => {
        #[cfg(feature = "failpoints")]
        fail::fail_point!($name, |_| $crate::failpoint::crash($name));
    };
}
pub(crate) use failpoint;

/// Every failpoint, in the order a commit passes them.
pub const ALL: &[&str] = &[
    "shard-synced",
    "shard-published",
    "atomic-temp-synced",
    "segment-published",
    "segments-merged",
    "manifest-published",
    "leftover-removed",
    "finish-listing",
    "convert-committed",
    "convert-source-deleted",
    "gc-index-locked",
    "gc-index-replaced",
    "store-index-read",
    "verify-opened",
    "store-verify-opened",
];

/// Ends the process at failpoint `name`, saying so on stderr first.
#[cfg(feature = "failpoints")]
pub fn crash(name: &str) -> ! {
    eprintln!("hspack: failpoint {name}: crashing");
    std::process::abort()
}

/// Sets failpoint `name` of this process to `action`, a `fail` crate action (`pause` holds
/// every thread that reaches it until the point is set again, e.g. to `off`): for tests that
/// stage a race at a publish step.
#[cfg(feature = "failpoints")]
pub fn set(name: &str, action: &str) -> Result<(), String> {
    fail::cfg(name, action)
}
