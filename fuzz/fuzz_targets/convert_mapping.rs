#![no_main]

use hspack::convert::layout::field_shape;
use hspack::convert::spec::{FieldArg, Mapping};
use libfuzzer_sys::fuzz_target;

// The generic layout's `--field` syntax and the `--mapping` file: parse and resolve, then take
// the shape of a few source tensors, never panicking.
fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut fields = vec![FieldArg::Flag(text.to_string())];
    if let Ok(m) = Mapping::parse(text, std::path::Path::new("fuzz.json")) {
        fields.extend(m.fields);
    }
    for field in fields {
        let _ = field.text();
        if let Ok(spec) = field.resolve(&[], None) {
            for shape in [
                &[1, 4, 12][..],
                &[4, 3, 4],
                &[2, 2],
                &[0, 3, 0],
                &[u64::MAX, 2],
            ] {
                let _ = field_shape(&spec, shape);
            }
        }
    }
});
