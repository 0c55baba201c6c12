//! Property tests: no input makes a parser panic, and what is written can be read back.

mod common;

use std::path::Path;

use common::{dtype_strategy, pt_fixtures};
use hspack::convert::pickle::{self, Value};
use hspack::convert::torch_zip::Archive;
use hspack::convert::{npy, safetensors_file, Limits, TorchFile};
use hspack::format::DType;
use proptest::prelude::*;

fn file() -> &'static Path {
    Path::new("prop.bin")
}

fn small_limits() -> Limits {
    Limits {
        max_decompressed_bytes: 1 << 20,
        max_tensor_bytes: 1 << 20,
    }
}

/// Runs every parser on `bytes`; only panics (and hangs) are failures.
fn feed(bytes: &[u8]) {
    let _ = pickle::parse(bytes, file());
    let _ = Archive::parse(bytes, file());
    let _ = safetensors_file::parse(bytes, file());
    let _ = npy::parse(bytes, file());
    if let Ok(t) = TorchFile::from_bytes(bytes.to_vec(), file(), small_limits()) {
        for (name, like) in t.tensors() {
            if let pickle::TensorLike::Tensor(r) = like {
                let _ = t.tensor_bytes_named(&name, r);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        feed(&bytes);
    }

    #[test]
    fn random_pickle_opcodes_never_panic(
        proto in 0u8..6,
        body in proptest::collection::vec(prop_oneof![
            Just(b'('), Just(b')'), Just(b']'), Just(b'}'), Just(b'N'), Just(b'a'), Just(b'e'),
            Just(b's'), Just(b'u'), Just(b't'), Just(b'l'), Just(b'd'), Just(b'2'), Just(b'0'),
            Just(b'1'), Just(b'R'), Just(b'b'), Just(b'Q'), Just(b'q'), Just(b'h'), Just(b'K'),
            Just(0x85u8), Just(0x86), Just(0x87), Just(0x88), Just(0x8f), Just(0x90), Just(0x91),
            Just(0x93), Just(0x94), Just(b'.'), any::<u8>(),
        ], 0..200),
    ) {
        let mut bytes = vec![0x80, proto];
        bytes.extend(body);
        let _ = pickle::parse(&bytes, file());
    }

    #[test]
    fn flipped_fixture_bytes_never_panic(
        which in 0usize..5,
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let name = ["specforge.ckpt", "views_legacy.pt", "hs_0.safetensors", "numpy.pt", "views_big_endian.pt"][which];
        let mut bytes = std::fs::read(pt_fixtures().join(name)).unwrap();
        for (at, v) in flips {
            let i = at.index(bytes.len());
            bytes[i] ^= v | 1;
        }
        feed(&bytes);
    }
}

// ---- round trips ----

/// A minimal protocol-2 pickle writer for plain values.
fn write_pickle(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::None => out.push(b'N'),
        Value::Bool(true) => out.push(0x88),
        Value::Bool(false) => out.push(0x89),
        Value::Int(i) => {
            if let Ok(i) = i32::try_from(*i) {
                out.push(b'J');
                out.extend_from_slice(&i.to_le_bytes());
            } else {
                out.extend_from_slice(&[0x8a, 8]);
                out.extend_from_slice(&i.to_le_bytes());
            }
        }
        Value::Float(f) => {
            out.push(b'G');
            out.extend_from_slice(&f.to_be_bytes());
        }
        Value::Str(s) => {
            out.push(b'X');
            out.extend_from_slice(&(s.len() as u32).to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        }
        Value::Bytes(b) => {
            out.push(b'B');
            out.extend_from_slice(&(b.len() as u32).to_le_bytes());
            out.extend_from_slice(b);
        }
        Value::List(items) => {
            out.extend_from_slice(b"](");
            items.iter().for_each(|i| write_pickle(i, out));
            out.push(b'e');
        }
        Value::Tuple(items) => {
            out.push(b'(');
            items.iter().for_each(|i| write_pickle(i, out));
            out.push(b't');
        }
        Value::Dict(items) => {
            out.extend_from_slice(b"}(");
            for (k, v) in items {
                write_pickle(k, out);
                write_pickle(v, out);
            }
            out.push(b'u');
        }
        other => panic!("not generated: {other:?}"),
    }
}

fn value_strategy() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::None),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::Int),
        any::<f64>()
            .prop_filter("NaN != NaN", |f| !f.is_nan())
            .prop_map(Value::Float),
        ".{0,12}".prop_map(Value::Str),
        proptest::collection::vec(any::<u8>(), 0..12).prop_map(Value::Bytes),
    ];
    leaf.prop_recursive(4, 64, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::List),
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Tuple),
            proptest::collection::btree_map("[a-z]{1,6}", inner, 0..6).prop_map(|m| Value::Dict(
                m.into_iter().map(|(k, v)| (Value::Str(k), v)).collect()
            )),
        ]
    })
}

fn st_name(d: DType) -> &'static str {
    match d {
        DType::Bool => "BOOL",
        DType::U8 => "U8",
        DType::I8 => "I8",
        DType::I16 => "I16",
        DType::I32 => "I32",
        DType::I64 => "I64",
        DType::F16 => "F16",
        DType::BF16 => "BF16",
        DType::F32 => "F32",
        DType::F64 => "F64",
        DType::F8E4M3FN => "F8_E4M3",
        DType::F8E5M2 => "F8_E5M2",
        _ => unreachable!(),
    }
}

proptest! {
    #[test]
    fn pickle_round_trip(v in value_strategy()) {
        let mut bytes = vec![0x80, 2];
        write_pickle(&v, &mut bytes);
        bytes.push(b'.');
        prop_assert_eq!(pickle::parse(&bytes, file()).unwrap(), v);
    }

    #[test]
    fn safetensors_round_trip(
        tensors in proptest::collection::btree_map(
            "[a-z_.0-9]{1,10}",
            (dtype_strategy(), proptest::collection::vec(0u64..4, 0..3)),
            0..5,
        ),
        seed in any::<u8>(),
    ) {
        let mut header = serde_json::Map::new();
        let mut data = Vec::new();
        let mut want = Vec::new();
        for (name, (dtype, shape)) in &tensors {
            let n = shape.iter().product::<u64>() as usize * dtype.size();
            let bytes: Vec<u8> = (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
            header.insert(name.clone(), serde_json::json!({
                "dtype": st_name(*dtype), "shape": shape, "data_offsets": [data.len(), data.len() + n],
            }));
            data.extend_from_slice(&bytes);
            want.push((name.clone(), *dtype, shape.clone(), bytes));
        }
        let json = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap();
        let mut file_bytes = (json.len() as u64).to_le_bytes().to_vec();
        file_bytes.extend_from_slice(&json);
        file_bytes.extend_from_slice(&data);
        let parsed = safetensors_file::parse(&file_bytes, file()).unwrap();
        prop_assert_eq!(parsed.tensors.len(), want.len());
        for (name, dtype, shape, bytes) in want {
            let t = parsed.tensors.iter().find(|t| t.name == name).unwrap();
            prop_assert_eq!(t.dtype, dtype);
            prop_assert_eq!(&t.shape, &shape);
            prop_assert_eq!(&file_bytes[t.data.clone()], &bytes[..]);
        }
    }

    #[test]
    fn npy_round_trip(
        code in proptest::sample::select(vec![("b1", 1usize), ("u1", 1), ("i1", 1), ("i2", 2), ("i4", 4), ("i8", 8), ("f2", 2), ("f4", 4), ("f8", 8)]),
        big in any::<bool>(),
        fortran in any::<bool>(),
        shape in proptest::collection::vec(1u64..4, 0..4),
    ) {
        let (code, size) = code;
        let order = if big && size > 1 { '>' } else { '<' };
        let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        let shape_lit = if dims.len() == 1 { format!("({},)", dims[0]) } else { format!("({})", dims.join(", ")) };
        let header = format!("{{'descr': '{order}{code}', 'fortran_order': {}, 'shape': {shape_lit}, }}\n", if fortran { "True" } else { "False" });
        let numel: u64 = shape.iter().product();
        // Element i (C order) has value bytes [i, i, ..] in little-endian with byte k = i + k.
        let elem = |i: u64| -> Vec<u8> { (0..size).map(|k| (i as u8).wrapping_add(k as u8)).collect() };
        // C index of each element in storage order.
        let mut storage = Vec::new();
        for s in 0..numel {
            let c_index = if fortran {
                // s enumerates with the first index fastest.
                let mut rem = s;
                let mut idx = vec![0u64; shape.len()];
                for (i, d) in idx.iter_mut().zip(&shape) { *i = rem % d; rem /= d; }
                idx.iter().zip(&shape).fold(0, |acc, (i, d)| acc * d + i)
            } else { s };
            let mut e = elem(c_index);
            if order == '>' { e.reverse(); }
            storage.extend(e);
        }
        let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
        bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend_from_slice(&storage);
        let tmp = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(tmp.path(), &bytes).unwrap();
        let src = hspack::convert::open_source(tmp.path()).unwrap();
        let t = src.tensor("").unwrap();
        let want: Vec<u8> = (0..numel).flat_map(elem).collect();
        prop_assert_eq!(&t.shape, &shape);
        prop_assert_eq!(&t.bytes[..], &want[..]);
    }
}
