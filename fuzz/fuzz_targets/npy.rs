#![no_main]
//! Any bytes as a `.npy` file: the header parses or is refused, what parses fits the file,
//! and its bytes (C order, little-endian, within the limits) come out or are refused.

use hspack::convert::{Limits, NpyFile};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let file = std::path::Path::new("fuzz.npy");
    if let Ok(h) = hspack::convert::npy::parse(data, file) {
        assert!(h.data.start <= h.data.end && h.data.end <= data.len());
    }
    let limits = Limits {
        max_decompressed_bytes: 1 << 20,
        max_tensor_bytes: 1 << 20,
    };
    if let Ok(npy) = NpyFile::from_bytes(data.to_vec(), file, limits) {
        if let Ok(bytes) = npy.bytes() {
            let h = npy.header();
            let len = match h.shape.contains(&0) {
                true => Some(0),
                false => h
                    .shape
                    .iter()
                    .try_fold(h.dtype.size() as u64, |a, &d| a.checked_mul(d)),
            };
            assert_eq!(Some(bytes.len() as u64), len);
        }
    }
});
