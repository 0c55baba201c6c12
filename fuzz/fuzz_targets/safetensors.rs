#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let file = std::path::Path::new("fuzz.safetensors");
    if let Ok(header) = hspack::convert::safetensors_file::parse(data, file) {
        for t in &header.tensors {
            assert!(t.data.end <= data.len());
            assert!(!header.unsupported.iter().any(|(n, _)| *n == t.name));
        }
    }
});
