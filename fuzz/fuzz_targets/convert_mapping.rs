#![no_main]

use hspack::convert::layout::{field_shape, LayoutOptions};
use hspack::convert::layouts::generic::{parse_field, Mapping};
use libfuzzer_sys::fuzz_target;

// The generic layout's `--field` syntax and the `--mapping` file: parse, then take the shape
// of a few source tensors, never panicking.
fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let options = LayoutOptions::default();
    let mut flags = vec![text.to_string()];
    if let Ok(m) = Mapping::parse(text, std::path::Path::new("fuzz.json")) {
        flags.extend(m.fields.iter().map(|f| f.to_flag()));
    }
    for flag in flags {
        if let Ok(spec) = parse_field(&flag, &options) {
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
