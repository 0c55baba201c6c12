#![no_main]
//! Any bytes as a whole convert job (the JSON a mapping file and the Python face give,
//! checked as a run checks it), and as the names and option strings convert reads: the first
//! line a `--group-by` pattern, the others relative paths and option values. Nothing panics
//! or runs long; a pattern's match lies in the name; the order of samples is a total order.

use std::cmp::Ordering;
use std::path::Path;

use hspack::convert::prepare::{SplitBy, Trim};
use hspack::convert::spec::{parse_point, ConvertSpec};
use hspack::convert::units::{in_part, key_of, match_pattern, natural_cmp, split_file_of};
use hspack::format::quantize::QuantizeSpec;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(spec) = serde_json::from_slice::<ConvertSpec>(data) {
        let _ = spec.check();
    }
    let text = String::from_utf8_lossy(data);
    let mut lines = text.split('\n');
    let pattern = lines.next().unwrap_or_default();
    let names: Vec<&str> = lines.take(16).collect();
    for name in &names {
        if let Some((key, part)) = match_pattern(pattern, name) {
            assert!(!key.is_empty() && !part.is_empty());
            assert!(
                name.contains(&key) && name.contains(&part),
                "{pattern:?} {name:?}"
            );
        }
        let _ = key_of(name);
        let _ = split_file_of(pattern, Path::new(name));
        let _ = in_part(pattern, name);
        let _ = name.parse::<SplitBy>();
        let _ = name.parse::<Trim>();
        let _ = name.parse::<QuantizeSpec>();
        let _ = parse_point(name);
    }
    // Units are keyed and sorted by this order (a `BTreeMap`, `sort_by`): two names are equal
    // only when they are the same name, and the order is antisymmetric and transitive, or two
    // files could be taken for one sample and a sort could panic.
    let few = &names[..names.len().min(6)];
    for a in few {
        for b in few {
            let ab = natural_cmp(a, b);
            assert_eq!(ab, natural_cmp(b, a).reverse(), "{a:?} {b:?}");
            assert_eq!(ab == Ordering::Equal, a == b, "{a:?} {b:?}");
            for c in few {
                if ab != Ordering::Greater && natural_cmp(b, c) != Ordering::Greater {
                    assert_ne!(natural_cmp(a, c), Ordering::Greater, "{a:?} {b:?} {c:?}");
                }
            }
        }
    }
});
