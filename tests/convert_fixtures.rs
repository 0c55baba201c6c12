//! Every fixture written by `tests/fixtures/pt/make_fixtures.py` is read with hspack's
//! reader and each tensor compared bit for bit with what torch/numpy/safetensors loaded.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::pt_fixtures;
use hspack::convert::{open_source, ConvertError, SourceFile, Value};
use serde::Deserialize;

#[derive(Deserialize, Debug)]
struct Expected {
    dtype: String,
    shape: Vec<u64>,
    hex: String,
}

fn expected() -> BTreeMap<String, BTreeMap<String, Expected>> {
    let text = std::fs::read_to_string(pt_fixtures().join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn check_file(name: &str, want: &BTreeMap<String, Expected>) -> SourceFile {
    let src = open_source(&pt_fixtures().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let listed: BTreeMap<String, _> = src
        .tensors()
        .into_iter()
        .map(|t| (t.name.clone(), t))
        .collect();
    let want_names: Vec<&String> = want.keys().collect();
    let got_names: Vec<&String> = listed.keys().collect();
    assert_eq!(got_names, want_names, "{name}: tensor names");
    for (path, exp) in want {
        let t = src
            .tensor(path)
            .unwrap_or_else(|e| panic!("{name}/{path}: {e}"));
        assert_eq!(t.dtype.name(), exp.dtype, "{name}/{path}: dtype");
        assert_eq!(t.shape, exp.shape, "{name}/{path}: shape");
        assert_eq!(hex(&t.bytes), exp.hex, "{name}/{path}: bytes");
        let info = listed.get(path).unwrap();
        assert_eq!(
            (info.dtype, &info.shape),
            (t.dtype, &t.shape),
            "{name}/{path}: listing"
        );
    }
    src
}

#[test]
fn every_fixture_matches_torch() {
    let all = expected();
    let on_disk: Vec<String> = std::fs::read_dir(pt_fixtures())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.ends_with(".py") && n != "expected.json")
        .collect();
    assert_eq!(
        on_disk.len(),
        all.len(),
        "every fixture on disk has expectations"
    );
    assert!(all.len() >= 20);
    for (name, want) in &all {
        check_file(name, want);
    }
}

#[test]
fn contiguous_little_endian_tensors_are_borrowed() {
    let src = open_source(&pt_fixtures().join("specforge.ckpt")).unwrap();
    let t = src.tensor("hidden_state").unwrap();
    assert!(matches!(t.bytes, std::borrow::Cow::Borrowed(_)));
    assert_eq!(t.shape, vec![1, 6, 16]);
    let views = open_source(&pt_fixtures().join("views.pt")).unwrap();
    assert!(matches!(
        views.tensor("transposed").unwrap().bytes,
        std::borrow::Cow::Owned(_)
    ));
    assert!(matches!(
        views.tensor("rows").unwrap().bytes,
        std::borrow::Cow::Borrowed(_)
    ));
}

#[test]
fn gzip_and_formats_are_reported() {
    let gz = open_source(&pt_fixtures().join("specforge.ckpt.gz")).unwrap();
    assert!(gz.gzipped());
    let torch = gz.as_torch().unwrap();
    assert!(matches!(
        torch.format(),
        hspack::convert::TorchFormat::Zip { .. }
    ));
    let legacy = open_source(&pt_fixtures().join("nested_legacy.pt")).unwrap();
    assert_eq!(
        legacy.as_torch().unwrap().format(),
        &hspack::convert::TorchFormat::Legacy
    );
    let be = hspack::convert::load_torch(&pt_fixtures().join("views_big_endian.pt")).unwrap();
    assert_eq!(be.byte_order(), hspack::convert::torch_zip::ByteOrder::Big);
}

#[test]
fn value_tree_keeps_non_tensor_data() {
    let f = hspack::convert::load_torch(&pt_fixtures().join("nested.pt")).unwrap();
    let meta = f.value().get("meta").unwrap();
    assert_eq!(meta.get("n"), Some(&Value::Int(3)));
    assert_eq!(meta.get("name").and_then(Value::as_str), Some("x"));
    assert_eq!(meta.get("f"), Some(&Value::Float(0.5)));
    assert_eq!(meta.get("none"), Some(&Value::None));
    assert_eq!(meta.get("flag"), Some(&Value::Bool(true)));
    assert_eq!(
        meta.get("t"),
        Some(&Value::Tuple(vec![Value::Int(1), Value::Str("two".into())]))
    );
    let param = f.value().get("param").and_then(Value::as_tensor).unwrap();
    assert!(param.requires_grad);
    let frozen = f.value().get("frozen").and_then(Value::as_tensor).unwrap();
    assert!(!frozen.requires_grad);
    let od = f.value().get("od").unwrap();
    let Value::Dict(items) = od else {
        panic!("od is {od:?}")
    };
    let keys: Vec<_> = items.iter().map(|(k, _)| k.as_str().unwrap()).collect();
    assert_eq!(keys, ["b", "a"]);
}

#[test]
fn shared_storages_are_one_storage() {
    for name in ["shared.pt", "shared_legacy.pt"] {
        let f = hspack::convert::load_torch(&pt_fixtures().join(name)).unwrap();
        let items = f.value().items().unwrap();
        let keys: Vec<_> = items
            .iter()
            .map(|t| t.as_tensor().unwrap().storage.key.clone())
            .collect();
        assert!(keys.windows(2).all(|w| w[0] == w[1]), "{name}: {keys:?}");
        assert_eq!(items[2].as_tensor().unwrap().storage_offset, 50);
    }
}

/// Cutting a fixture anywhere must give an error, never a panic, and never a wrong tensor
/// without an error for cuts that remove tensor data.
#[test]
fn every_prefix_of_every_fixture_is_handled() {
    let all = expected();
    let tmp = tempfile::tempdir().unwrap();
    for name in [
        "specforge.ckpt",
        "nested_legacy.pt",
        "hs_0.safetensors",
        "array_fortran.npy",
        "numpy.pt",
        "specforge.ckpt.gz",
    ] {
        let bytes = std::fs::read(pt_fixtures().join(name)).unwrap();
        let want = &all[name];
        let step = if bytes.len() > 2000 { 3 } else { 1 };
        for cut in (0..bytes.len()).step_by(step) {
            let path = tmp.path().join(format!("cut_{cut}"));
            std::fs::write(&path, &bytes[..cut]).unwrap();
            match open_source(&path) {
                Err(_) => {}
                Ok(src) => {
                    // A shorter file may still parse (e.g. trailing padding); every tensor
                    // it yields must then be either correct or an error.
                    for t in src.tensors() {
                        if let Ok(got) = src.tensor(&t.name) {
                            if let Some(exp) = want.get(&t.name) {
                                assert_eq!(
                                    hex(&got.bytes),
                                    exp.hex,
                                    "{name} cut at {cut}: {}",
                                    t.name
                                );
                            }
                        }
                    }
                }
            }
            std::fs::remove_file(&path).unwrap();
        }
    }
}

#[test]
fn missing_file_is_an_io_error() {
    let err = open_source(Path::new("/nonexistent/hs.pt")).unwrap_err();
    assert!(matches!(err, ConvertError::Io { .. }));
    assert!(err.to_string().contains("/nonexistent/hs.pt"));
}
