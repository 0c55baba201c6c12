#![no_main]

use hspack::convert::torch_zip::Archive;
use hspack::convert::{Limits, TorchFile};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let file = std::path::Path::new("fuzz.pt");
    let _ = Archive::parse(data, file);
    // Through the whole reader: container, pickle, then every tensor's bytes.
    let limits = Limits {
        max_decompressed_bytes: 1 << 20,
        max_tensor_bytes: 1 << 20,
    };
    if let Ok(torch) = TorchFile::from_bytes(data.to_vec(), file, limits) {
        for (name, t) in torch.tensors() {
            match t {
                hspack::convert::pickle::TensorLike::Tensor(t) => {
                    let _ = torch.tensor_bytes_named(&name, t);
                }
                hspack::convert::pickle::TensorLike::NdArray(a) => {
                    let _ = torch.ndarray_bytes(&name, a);
                }
            }
        }
    }
});
