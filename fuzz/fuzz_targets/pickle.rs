#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let file = std::path::Path::new("fuzz.pkl");
    if let Ok(value) = hspack::convert::pickle::parse(data, file) {
        let _ = value.tensors();
        let _ = value.storages();
        let _ = value.unsupported_tensors();
    }
});
