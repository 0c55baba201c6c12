#![no_main]
//! Any bytes as a manifest: decode never panics, and what decodes re-encodes to an equal value.

use hspack::format::Manifest;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Manifest::decode(data) {
        let again = Manifest::decode(&m.encode()).expect("an accepted manifest re-encodes");
        assert_eq!(m, again);
    }
});
