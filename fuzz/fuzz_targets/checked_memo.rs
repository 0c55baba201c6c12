#![no_main]
//! Any bytes as a checked-chunk memo file shared between processes: it opens for as many
//! chunks as it has bytes or is refused, and flags read back as set.

use hspack::io::mmap::SharedFlags;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&n, bytes)) = data.split_first() else {
        return;
    };
    let path = std::env::temp_dir().join(format!("hspack-fuzz-memo-{}", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    let n = if n % 2 == 0 {
        bytes.len()
    } else {
        usize::from(n)
    };
    if let Ok(flags) = SharedFlags::open(&path, n) {
        let i = bytes.len() / 2;
        flags.set(i);
        assert!(i >= n.max(bytes.len()) || flags.get(i));
        assert!(!flags.get(usize::MAX));
    }
});
