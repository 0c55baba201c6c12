#![no_main]
//! Any bytes as a `.npy` file: the header parses or is refused, and what parses fits the file.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let file = std::path::Path::new("fuzz.npy");
    if let Ok(h) = hspack::convert::npy::parse(data, file) {
        assert!(h.data.start <= h.data.end && h.data.end <= data.len());
    }
});
