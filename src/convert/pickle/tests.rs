//! Byte-level tests of the pickle machine.

use std::path::{Path, PathBuf};

use super::{parse, Value};
use crate::convert::ConvertError;

fn file() -> &'static Path {
    Path::new("test.pkl")
}

fn fixture(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/pickle")
        .join(name);
    std::fs::read(p).unwrap()
}

fn s(x: &str) -> Value {
    Value::Str(x.to_string())
}

fn refused(bytes: &[u8]) -> (String, String) {
    match parse(bytes, file()) {
        Err(ConvertError::RefusedGlobal { module, name, .. }) => (module, name),
        other => panic!("expected RefusedGlobal, got {other:?}"),
    }
}

#[test]
fn os_system_is_refused_and_nothing_runs() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("pwned");
    let cmd = format!("touch {}", marker.display());
    // Protocol 0: cos\nsystem\n(S'touch ...'\ntR.
    let p0 = format!("cos\nsystem\n(S'{cmd}'\ntR.").into_bytes();
    // Protocol 2 with a memoised global, as pickle.dumps writes it.
    let mut p2 = b"\x80\x02cposix\nsystem\nq\x00X".to_vec();
    p2.extend_from_slice(&(cmd.len() as u32).to_le_bytes());
    p2.extend_from_slice(cmd.as_bytes());
    p2.extend_from_slice(b"q\x01\x85q\x02Rq\x03.");
    assert_eq!(refused(&p0), ("os".into(), "system".into()));
    assert_eq!(refused(&p2), ("posix".into(), "system".into()));
    let msg = parse(&p0, file()).unwrap_err().to_string();
    assert!(msg.contains("`os.system`"), "{msg}");
    assert!(msg.contains("never executes pickle code"), "{msg}");
    assert!(msg.contains("safetensors"), "{msg}");
    assert!(!marker.exists(), "the pickle must not have run");
}

#[test]
fn other_code_execution_paths_are_refused() {
    // STACK_GLOBAL builtins.eval (protocol 4).
    let body = b"\x8c\x08builtins\x94\x8c\x04eval\x94\x93\x94\x8c\x031+1\x94\x85\x94R\x94.";
    let mut eval = b"\x80\x04\x95".to_vec();
    eval.extend_from_slice(&(body.len() as u64).to_le_bytes());
    eval.extend_from_slice(body);
    assert_eq!(refused(&eval), ("builtins".into(), "eval".into()));
    // INST subprocess Popen.
    assert_eq!(
        refused(b"(S'ls'\nisubprocess\nPopen\n."),
        ("subprocess".into(), "Popen".into())
    );
    // The refusal happens at the global, before any argument is looked at.
    assert_eq!(
        refused(b"\x80\x02cbuiltins\ngetattr\n"),
        ("builtins".into(), "getattr".into())
    );
    // A torch function that is not a rebuild helper.
    assert_eq!(refused(b"ctorch\nload\n."), ("torch".into(), "load".into()));
    // A legitimate-looking rebuild naming a forbidden inner function.
    let inner = b"\x80\x02ctorch._tensor\n_rebuild_from_type_v2\n(cos\nsystem\n";
    assert_eq!(refused(inner), ("os".into(), "system".into()));
}

#[test]
fn refused_opcodes_name_themselves() {
    for (bytes, opcode) in [
        (&b"\x80\x02\x82\x01."[..], "EXT"),
        (&b"\x80\x02\x83\x01\x00."[..], "EXT"),
        (&b"\x80\x02\x84\x01\x00\x00\x00."[..], "EXT"),
        (&b"\x80\x05\x97."[..], "NEXT_BUFFER"),
        (&b"P1\n."[..], "PERSID"),
    ] {
        match parse(bytes, file()) {
            Err(ConvertError::UnsupportedOpcode { opcode: o, .. }) => assert_eq!(o, opcode),
            other => panic!("{bytes:?}: {other:?}"),
        }
    }
}

#[test]
fn plain_pickles_of_every_protocol() {
    let big = |hex: &str| {
        let mut v: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        v.reverse();
        Value::BigInt(v)
    };
    let want = Value::Dict(vec![
        (
            s("a"),
            Value::List(vec![
                Value::Int(1),
                Value::Int(-2),
                Value::Float(3.5),
                Value::None,
                Value::Bool(true),
                s("é\n"),
                Value::Bytes(vec![0, 0xff]),
                Value::Tuple(vec![Value::Int(1), Value::Int(2)]),
                big("400000000000000000"),
                big("c00000000000000000"),
                Value::Set(vec![Value::Int(1), Value::Int(2)]),
                Value::Set(vec![]),
                Value::Bytes(b"x".to_vec()),
                s(&"k".repeat(300)),
            ]),
        ),
        (s("big"), big("008000000000000000")),
        (s("neg"), Value::Int(i64::MIN)),
    ]);
    for proto in 0..=5 {
        let got = parse(&fixture(&format!("plain_p{proto}.pkl")), file())
            .unwrap_or_else(|e| panic!("protocol {proto}: {e}"));
        assert_eq!(got, want, "protocol {proto}");
    }
}

#[test]
fn memoised_objects_are_seen_with_their_final_contents() {
    let list = Value::List(vec![Value::Int(7)]);
    let want = Value::Dict(vec![
        (s("p"), list.clone()),
        (s("q"), list),
        (s("dup"), Value::Dict(vec![(s("k"), Value::Int(1))])),
    ]);
    for proto in 0..=5 {
        let got = parse(&fixture(&format!("shared_p{proto}.pkl")), file()).unwrap();
        assert_eq!(got, want, "protocol {proto}");
    }
}

#[test]
fn cycles_and_expansion_bombs_are_bounded() {
    match parse(&fixture("cyclic.pkl"), file()) {
        Err(ConvertError::PickleTooComplex { what, .. }) => assert_eq!(what, "nesting depth"),
        other => panic!("{other:?}"),
    }
    // A list holding the previous list twice, 60 times over: 2^60 leaves if expanded.
    let mut bomb = b"\x80\x02]q\x00".to_vec();
    for i in 0..60u8 {
        bomb.extend_from_slice(&[b'h', i, b'h', i, 0x86, b'q', i + 1]);
    }
    bomb.push(b'.');
    // A memoised 100k-item tuple passed as arguments over and over.
    let mut repeat = b"\x80\x02cbuiltins\nset\nq\x00(".to_vec();
    repeat.extend(std::iter::repeat_n(b'N', 100_000));
    repeat.extend_from_slice(b"tq\x01\x85q\x02");
    for _ in 0..200_000 {
        repeat.extend_from_slice(b"h\x00h\x02R0");
    }
    repeat.extend_from_slice(b"N.");
    assert!(matches!(
        parse(&repeat, file()),
        Err(ConvertError::PickleTooComplex { .. })
    ));
    // The same tuple DAG used as a dict key (2^60 leaves): hashing the key stops at its cost
    // cap, and the dict holding it is refused by the expansion budget. A walk of the whole
    // DAG would not end.
    let mut key_bomb = b"\x80\x02}q\x00)q\x010".to_vec();
    for i in 1..61u8 {
        key_bomb.extend_from_slice(&[b'h', i, b'h', i, 0x86, b'q', i + 1, b'0']);
    }
    key_bomb.extend_from_slice(b"h\x3dNs.");
    assert!(matches!(
        parse(&key_bomb, file()),
        Err(ConvertError::PickleTooComplex {
            what: "expanded size in bytes",
            ..
        })
    ));
    assert!(matches!(
        parse(&bomb, file()),
        Err(ConvertError::PickleTooComplex {
            what: "expanded size in bytes",
            ..
        })
    ));
}

/// One large byte string referenced many times: refused once its copies pass 16 times the
/// pickle or 256 MiB, not at 256 times the pickle (a 4 MiB string, memoised and appended 500
/// times, expanded to a gigabyte before it was refused).
#[test]
fn shared_references_to_large_values_expand_a_bounded_amount() {
    let big = 4 << 20;
    let mut p = b"\x80\x02]q\x00(B".to_vec();
    p.extend_from_slice(&(big as u32).to_le_bytes());
    p.extend(std::iter::repeat_n(b'x', big));
    p.extend_from_slice(b"q\x01");
    for _ in 0..100 {
        p.extend_from_slice(b"h\x01");
    }
    p.extend_from_slice(b"e.");
    assert!(matches!(
        parse(&p, file()),
        Err(ConvertError::PickleTooComplex {
            what: "expanded size in bytes",
            ..
        })
    ));
    // Ten copies are within the bound.
    let keep = p.len() - 2 - 90 * 2;
    let mut ten = p[..keep].to_vec();
    ten.extend_from_slice(b"e.");
    assert!(matches!(parse(&ten, file()), Ok(Value::List(items)) if items.len() == 11));
}

#[test]
fn repeated_dict_keys_keep_the_last_value_in_first_position() {
    // {'a': 1, 'b': 2, 'a': 3} via SETITEMS.
    let p = b"}(X\x01\x00\x00\x00aK\x01X\x01\x00\x00\x00bK\x02X\x01\x00\x00\x00aK\x03u.";
    assert_eq!(
        parse(p, file()).unwrap(),
        Value::Dict(vec![(s("a"), Value::Int(3)), (s("b"), Value::Int(2))])
    );
}

#[test]
fn malformed_pickles_are_errors() {
    for bytes in [
        &b""[..],
        b"\x80\x06N.",        // protocol too new
        b"\x80\x02",          // no STOP
        b"0.",                // pop from an empty stack
        b"t.",                // TUPLE without MARK
        b"h\x05.",            // GET of an unknown memo key
        b"Na.",               // APPEND to a non-list
        b"(Ns.",              // SETITEM below a mark
        b"X\xff\xff\xff\xff", // length beyond the input
        b"\x8d\xff\xff\xff\xff\xff\xff\xff\xff",
        b"\xff",                    // unknown opcode
        b"X\x02\x00\x00\x00\xc3(.", // invalid UTF-8
        b"S'unterminated\n.",
        b"I12x\n.",
        b"\x95\xff\xff\xff\xff\xff\xff\xff\x7f.",
        b"ccollections\nOrderedDict\nN\x85R.", // bad OrderedDict argument
        b"ctorch._utils\n_rebuild_tensor_v2\n)R.", // missing arguments
        b"ctorch\nFloatStorage\n)R.",          // a class that cannot be called
        b"N)R.",                               // calling None
    ] {
        assert!(parse(bytes, file()).is_err(), "{bytes:?}");
    }
}

#[test]
fn persistent_ids_must_be_torch_storages() {
    // ('storage', torch.FloatStorage, '0', 'cpu', 4) -> a storage.
    let ok = b"\x80\x02(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x04tQ.";
    match parse(ok, file()).unwrap() {
        Value::Storage(st) => {
            assert_eq!(
                (st.key.as_str(), st.numel, st.kind.element_size),
                ("0", 4, 4)
            );
            assert_eq!(st.location, "cpu");
        }
        other => panic!("{other:?}"),
    }
    for bad in [
        &b"\x80\x02NQ."[..],
        b"\x80\x02(X\x03\x00\x00\x00fooK\x01tQ.",
        b"\x80\x02(X\x07\x00\x00\x00storageNX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x04tQ.",
        b"\x80\x02(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuJ\xff\xff\xff\xfftQ.",
    ] {
        assert!(parse(bad, file()).is_err(), "{bad:?}");
    }
}
