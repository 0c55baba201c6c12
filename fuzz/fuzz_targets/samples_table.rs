#![no_main]
//! Any bytes as `samples.parquet`: its keys and ordinals decode or are refused.
//!
//! The parquet decoder panics on some malformed files; `decode_keys` catches that and refuses
//! the table. libFuzzer's panic hook would abort on the caught panic too, so the hook is
//! replaced by a quiet one: a panic that escapes `decode_keys` still aborts the run.

use libfuzzer_sys::fuzz_target;

static QUIET_PANICS: std::sync::Once = std::sync::Once::new();

fuzz_target!(|data: &[u8]| {
    QUIET_PANICS.call_once(|| std::panic::set_hook(Box::new(|_| {})));
    let path = std::path::Path::new("samples.parquet");
    let _ = hspack::write::samples_table::decode_keys(data.to_vec(), path);
});
