#![no_main]
//! Any text as an AWS CLI credentials or config file, any section name: the pairs read are
//! those of that section, keys lowercased and trimmed, values trimmed and never empty; the
//! profile resolved from it (as both files) holds only such values.

use hspack::io::aws_profile::{resolve, section};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let at = (usize::from(cut) % (text.len() + 1)).min(text.len());
    let Some((name, text)) = text.split_at_checked(at) else {
        return;
    };
    for (key, value) in section(text, name.trim()) {
        assert_eq!(key, key.trim().to_ascii_lowercase());
        assert!(!value.is_empty() && value == value.trim());
    }
    let p = resolve(name.trim(), text, text);
    let (id, secret) = p
        .keys
        .map(|(id, secret, _)| (id, secret))
        .unwrap_or_default();
    for value in [p.region, p.endpoint]
        .into_iter()
        .flatten()
        .chain([id, secret])
    {
        assert_eq!(value, value.trim());
    }
});
