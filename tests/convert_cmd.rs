//! `hspack convert`, run as the built binary in temp folders: bytes against the torch fixtures,
//! resume without duplicates, and SIGKILL at many points with `--delete-source`.

mod common;

use common::dumps::{check_dataset, write_dumps, V};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use hspack::Dataset;
use safetensors::Dtype;

fn hspack(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hspack"))
        .args(args)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pt")
}

fn unhex(h: &str) -> Vec<u8> {
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
        .collect()
}

/// `expected.json`: file → tensor → raw bytes, as torch.load returned them.
fn expected(file: &str) -> BTreeMap<String, Vec<u8>> {
    let text = std::fs::read_to_string(fixtures().join("expected.json")).unwrap();
    let all: serde_json::Value = serde_json::from_str(&text).unwrap();
    all[file]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), unhex(v["hex"].as_str().unwrap())))
        .collect()
}

#[test]
fn specforge_fixtures_convert_bit_for_bit() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src/rows_0-3");
    std::fs::create_dir_all(&src).unwrap();
    let files = [
        ("specforge.ckpt", "data_0.ckpt"),
        ("specforge.ckpt.gz", "data_1.ckpt.gz"),
        ("specforge_zip64.ckpt", "data_2.ckpt"),
    ];
    for (from, to) in files {
        std::fs::copy(fixtures().join(from), src.join(to)).unwrap();
    }
    let src = t.path().join("src");
    for split in [false, true] {
        let ds = t.path().join(format!("ds-{split}"));
        let mut args = vec![
            "convert",
            s(&src),
            s(&ds),
            "--layout",
            "specforge",
            "--layers",
            "2,30,58,61",
            "--num-layers",
            "61",
        ];
        if split {
            args.push("--split-layers");
        }
        let o = hspack(&args);
        assert!(o.status.success(), "{}", text(&o));
        let d = Dataset::open(&ds).unwrap();
        assert_eq!(d.len(), 3);
        let names: Vec<&str> = d.schema().fields.iter().map(|f| f.name.as_str()).collect();
        if split {
            assert_eq!(
                names,
                [
                    "input_ids",
                    "loss_mask",
                    "hidden.2",
                    "hidden.30",
                    "hidden.58",
                    "hidden.61"
                ]
            );
        } else {
            assert_eq!(
                names,
                ["input_ids", "loss_mask", "aux_hidden_state", "hidden.61"]
            );
            let aux = &d.schema().fields[2];
            assert_eq!(aux.shape, [3, 16]);
            assert_eq!(
                aux.role,
                hspack::Role::HiddenStates {
                    layers: vec![2, 30, 58],
                    point: hspack::CapturePoint::LayerInput
                }
            );
            assert_eq!(d.schema().capture.as_ref().unwrap().hidden_size, 16);
        }
        for (i, (from, _)) in files.iter().enumerate() {
            let want = expected(from);
            let sample = d.get_by_key(&format!("rows_0-3/data_{i}")).unwrap();
            let read = |f: &str| sample.read(f, None).unwrap().bytes().to_vec();
            assert_eq!(read("input_ids"), want["input_ids"]);
            assert_eq!(read("loss_mask"), want["loss_mask"]);
            assert_eq!(read("hidden.61"), want["hidden_state"]);
            let aux = &want["aux_hidden_state"];
            if !split {
                // The stacked field is the source's bytes: [1, T, 3H] read as [T, 3, H].
                assert_eq!(&read("aux_hidden_state"), aux);
                continue;
            }
            // aux_hidden_state is [1, T, 3H] bf16: layer j is columns j*H..(j+1)*H of every row.
            let h = 16 * 2;
            for (j, layer) in [2, 30, 58].into_iter().enumerate() {
                let part: Vec<u8> = aux
                    .chunks_exact(3 * h)
                    .flat_map(|row| row[j * h..(j + 1) * h].to_vec())
                    .collect();
                assert_eq!(read(&format!("hidden.{layer}")), part, "layer {layer}");
            }
        }
    }
}

fn convert_args<'a>(src: &'a Path, ds: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![
        "convert",
        s(src),
        s(ds),
        "--layout",
        "generic",
        "--field",
        "input_ids=ids",
        "--field",
        "hidden.7=h",
        "--shard-samples",
        "3",
        "-q",
    ];
    a.extend_from_slice(extra);
    a
}

#[test]
fn rerun_resumes_without_duplicates() {
    let t = tempfile::tempdir().unwrap();
    let (src, ds) = (t.path().join("src"), t.path().join("ds"));
    write_dumps(&src, 0..7);
    let o = hspack(&convert_args(&src, &ds, &[]));
    assert!(o.status.success(), "{}", text(&o));
    write_dumps(&src, 7..12);
    let o = hspack(&convert_args(&src, &ds, &[]));
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(check_dataset(&ds).len(), 12);
    let o = hspack(&convert_args(&src, &ds, &["--delete-source"]));
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(std::fs::read_dir(&src).unwrap().count(), 0);
    assert_eq!(check_dataset(&ds).len(), 12);
    assert!(hspack(&["verify", s(&ds)]).status.success());
}

#[test]
fn sigkill_with_delete_source_loses_nothing() {
    const N: usize = 50;
    let t = tempfile::tempdir().unwrap();
    let (src, ds) = (t.path().join("src"), t.path().join("ds"));
    write_dumps(&src, 0..N);
    let all: Vec<String> = (0..N).map(|i| format!("req_{i:03}")).collect();
    let invariant = |when: &str| {
        let in_ds = check_dataset(&ds);
        for k in &all {
            let file = src.join(format!("{k}.safetensors"));
            assert!(
                file.exists() || in_ds.contains(k),
                "{when}: sample {k} is neither a source file nor in the dataset"
            );
        }
        in_ds.len()
    };
    let (mut kills, mut partial) = (0, 0);
    // Short delays: a rerun continues from the last commit, so each kill lands further on.
    for (round, delay_ms) in (0..16u64).map(|i| 3 + (i * 5) % 11).enumerate() {
        let mut child = Command::new(env!("CARGO_BIN_EXE_hspack"))
            .args(convert_args(&src, &ds, &["--delete-source", "--jobs", "4"]))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        let finished = child.try_wait().unwrap().is_some();
        if !finished {
            child.kill().unwrap();
            kills += 1;
        }
        child.wait().unwrap();
        let committed = invariant(&format!("after kill {round} at {delay_ms} ms"));
        let left = std::fs::read_dir(&src).unwrap().count();
        eprintln!("kill at {delay_ms} ms: {committed} committed, {left} sources left");
        if !finished && committed > 0 && committed < N {
            partial += 1;
        }
    }
    assert!(kills > 0, "the conversion always finished before the kill");
    assert!(
        partial > 0,
        "no kill landed between the first and the last commit"
    );
    let o = hspack(&convert_args(&src, &ds, &["--delete-source"]));
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(invariant("after the final run"), N);
    let left: Vec<_> = std::fs::read_dir(&src).unwrap().collect();
    assert!(left.is_empty(), "sources left: {left:?}");
    assert!(hspack(&["verify", s(&ds)]).status.success());
}

#[test]
fn refusals_name_the_file_and_the_fix() {
    let t = tempfile::tempdir().unwrap();
    let (src, ds) = (t.path().join("src"), t.path().join("ds"));
    write_dumps(&src, 0..2);
    std::fs::write(
        src.join("req_005.safetensors"),
        b"\x10\0\0\0\0\0\0\0{\"a\":1",
    )
    .unwrap();
    let o = hspack(&convert_args(&src, &ds, &[]));
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("req_005.safetensors"), "{}", text(&o));
    let o = hspack(&convert_args(&src, &ds, &["--skip-bad"]));
    assert!(o.status.success(), "{}", text(&o));
    let report = std::fs::read_to_string(ds.join("convert-report.jsonl")).unwrap();
    assert_eq!(report.lines().count(), 1);
    assert!(report.contains("req_005.safetensors"));
    assert_eq!(check_dataset(&ds).len(), 2);
    let o = hspack(&["convert", s(&src), s(&ds), "--layout", "generic"]);
    assert!(text(&o).contains("--field"), "{}", text(&o));
    let o = hspack(&convert_args(&src, &ds, &["--delete-source", "--no-fsync"]));
    assert!(!o.status.success());
}

/// (key, field bytes) of every sample, in ordinal order.
fn samples_in_order(ds: &Path) -> Vec<(String, Vec<u8>, Vec<u8>)> {
    let d = Dataset::open(ds).unwrap();
    (0..d.len())
        .map(|o| {
            let s = d.sample(o).unwrap();
            let ids = s.read("input_ids", None).unwrap().bytes().to_vec();
            let h = s.read("hidden.7", None).unwrap().bytes().to_vec();
            (s.key().to_string(), ids, h)
        })
        .collect()
}

#[test]
fn threads_write_shards_at_once_and_the_dataset_is_the_one_thread_dataset() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    write_dumps(&src, 0..40);
    let one = t.path().join("one");
    let o = hspack(&convert_args(&src, &one, &["--jobs", "1"]));
    assert!(o.status.success(), "{}", text(&o));
    let many = t.path().join("many");
    let o = hspack(&convert_args(&src, &many, &["--jobs", "5"]));
    assert!(o.status.success(), "{}", text(&o));
    let expected = samples_in_order(&one);
    assert_eq!(expected.len(), 40);
    // Ordinals follow the source order whatever the threads.
    let keys: Vec<_> = expected.iter().map(|s| s.0.clone()).collect();
    assert_eq!(
        keys,
        (0..40).map(|i| format!("req_{i:03}")).collect::<Vec<_>>()
    );
    assert!(samples_in_order(&many) == expected, "the datasets differ");
    let shards = |ds: &Path| Dataset::open(ds).unwrap().manifest().shards.len();
    // --shard-samples 3: 14 shards either way.
    assert_eq!((shards(&one), shards(&many)), (14, 14));
    assert!(hspack(&["verify", s(&many)]).status.success());
}

#[test]
fn a_bad_file_among_many_threads_stops_after_what_precedes_it() {
    let t = tempfile::tempdir().unwrap();
    let (src, ds) = (t.path().join("src"), t.path().join("ds"));
    write_dumps(&src, 0..30);
    let bad = src.join("req_016.safetensors");
    std::fs::write(&bad, b"not a tensor file").unwrap();
    let o = hspack(&convert_args(
        &src,
        &ds,
        &["--jobs", "4", "--delete-source"],
    ));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("req_016.safetensors"), "{}", text(&o));
    // Whole shards of three before the bad file are committed, and their sources deleted;
    // nothing after it is committed, and every other source is still there.
    let keys = check_dataset(&ds);
    assert_eq!(keys.len(), 15, "{keys:?}");
    for i in 0..30 {
        let k = format!("req_{i:03}");
        let source = src.join(format!("{k}.safetensors")).exists();
        assert_eq!(source, i >= 15, "{k}: source exists = {source}");
        assert_eq!(keys.contains(&k), i < 15, "{k}");
    }
    let left: Vec<_> = std::fs::read_dir(&ds)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let o = hspack(&convert_args(&src, &ds, &["--jobs", "4", "--skip-bad"]));
    assert!(o.status.success(), "{}", text(&o));
    let report = std::fs::read_to_string(ds.join("convert-report.jsonl")).unwrap();
    assert_eq!(report.lines().count(), 1, "{report}");
    assert!(report.contains("req_016.safetensors"));
    assert_eq!(check_dataset(&ds).len(), 29);
    assert!(hspack(&["verify", s(&ds)]).status.success());
}

/// Rows of `n` tensors of `row` bytes each, interleaved per token: `[T, n, ...]`.
fn interleave(parts: &[&[u8]], row: usize) -> Vec<u8> {
    let tokens = parts[0].len() / row;
    let mut out = Vec::new();
    for t in 0..tokens {
        for p in parts {
            out.extend_from_slice(&p[t * row..(t + 1) * row]);
        }
    }
    out
}

#[test]
fn modelopt_keys_from_the_stored_conversation_id() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    let files = [
        ("modelopt_str.pt", "conv-a"),
        ("modelopt_int.pt", "17"),
        ("modelopt_tensor.pt", "42"),
    ];
    for (i, (from, _)) in files.iter().enumerate() {
        std::fs::copy(fixtures().join(from), src.join(format!("{i}.pt"))).unwrap();
    }
    let ds = t.path().join("ds");
    let args = |ds: &Path| {
        hspack(&[
            "convert",
            s(&src),
            s(ds),
            "--layout",
            "modelopt",
            "--layers",
            "2,16,29,32",
            "--key-from",
            "conversation_id",
        ])
    };
    let o = args(&ds);
    assert!(o.status.success(), "{}", text(&o));
    let d = Dataset::open(&ds).unwrap();
    assert_eq!(d.len(), 3);
    for (from, key) in files {
        let want = expected(from);
        let sample = d.get_by_key(key).unwrap();
        let read = |f: &str| sample.read(f, None).unwrap().bytes().to_vec();
        assert_eq!(read("input_ids"), want["input_ids"]);
        assert_eq!(read("aux_hidden_state"), want["aux_hidden_states"]);
        assert_eq!(read("hidden.32"), want["hidden_states"]);
    }
    // A rerun opens nothing new and appends nothing.
    let o = args(&ds);
    assert!(
        text(&o).contains("3 already in the dataset"),
        "{}",
        text(&o)
    );
    assert_eq!(Dataset::open(&ds).unwrap().len(), 3);
    // Two files with one stored key: an error naming both, in a rerun and in a fresh run.
    std::fs::copy(fixtures().join("modelopt_str.pt"), src.join("9.pt")).unwrap();
    for ds in [ds.clone(), t.path().join("fresh")] {
        let o = args(&ds);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        let msg = text(&o);
        assert!(
            msg.contains("0.pt") && msg.contains("9.pt") && msg.contains("`conv-a`"),
            "{msg}"
        );
    }
    assert_eq!(Dataset::open(&ds).unwrap().len(), 3);
    // Without the second file, the interrupted fresh run completes.
    std::fs::remove_file(src.join("9.pt")).unwrap();
    let fresh = t.path().join("fresh");
    let o = args(&fresh);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(Dataset::open(&fresh).unwrap().len(), 3);
    // Without its key log, a rerun opens every file again and appends nothing.
    std::fs::remove_file(ds.join("convert-keys.jsonl")).unwrap();
    let o = args(&ds);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("appended  0 samples"), "{}", text(&o));
    assert_eq!(Dataset::open(&ds).unwrap().len(), 3);
}

#[test]
fn generic_stacks_one_tensor_per_layer() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::copy(fixtures().join("aux_list.pt"), src.join("a.pt")).unwrap();
    let ds = t.path().join("ds");
    let o = hspack(&[
        "convert",
        s(&src),
        s(&ds),
        "--layout",
        "generic",
        "--field",
        "input_ids=input_ids",
        "--field",
        "aux_hidden_state=aux.0+aux.1+aux.2:layers=2,30,58",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let want = expected("aux_list.pt");
    let d = Dataset::open(&ds).unwrap();
    let got = d
        .get_by_key("a")
        .unwrap()
        .read("aux_hidden_state", None)
        .unwrap();
    let parts = [&want["aux.0"][..], &want["aux.1"][..], &want["aux.2"][..]];
    assert_eq!(got.bytes(), &interleave(&parts, 8 * 2)[..]);
    assert_eq!(d.schema().fields[1].shape, [3, 8]);
}

#[test]
fn split_by_a_file_beside_the_batch() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::copy(fixtures().join("aux_list.pt"), src.join("b.pt")).unwrap();
    let lens = V {
        dtype: Dtype::I32,
        shape: vec![2],
        data: [1i32, 3].iter().flat_map(|x| x.to_le_bytes()).collect(),
    };
    let side = src.join("b.split.safetensors");
    safetensors::serialize_to_file([("lens".to_string(), &lens)], None, &side).unwrap();
    let ds = t.path().join("ds");
    let o = hspack(&[
        "convert",
        s(&src),
        s(&ds),
        "--layout",
        "generic",
        "--field",
        "input_ids=input_ids",
        "--field",
        "aux=aux.0+aux.1+aux.2:layers=1,2,3",
        "--split-by",
        "lengths:lens",
        "--split-by-file",
        "{stem}.split.safetensors",
        "--delete-source",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let d = Dataset::open(&ds).unwrap();
    let keys: Vec<String> = (0..d.len())
        .map(|i| d.sample(i).unwrap().key().to_string())
        .collect();
    assert_eq!(keys, ["b/0", "b/1"]);
    let want = expected("aux_list.pt");
    let ids = |k: &str| {
        d.get_by_key(k)
            .unwrap()
            .read("input_ids", None)
            .unwrap()
            .bytes()
            .to_vec()
    };
    assert_eq!(ids("b/0"), want["input_ids"][..8]);
    assert_eq!(ids("b/1"), want["input_ids"][8..]);
    assert!(
        !side.exists() && !src.join("b.pt").exists(),
        "both files deleted"
    );
}

#[test]
fn mapping_file_holds_the_flags_and_refuses_conflicts() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::copy(fixtures().join("aux_list.pt"), src.join("b.pt")).unwrap();
    let mapping = t.path().join("mapping.json");
    std::fs::write(
        &mapping,
        r#"{
          "fields": [
            "input_ids=input_ids",
            {"name": "aux", "source": ["aux.0", "aux.1", "aux.2"], "layers": [2, 30, 58],
             "point": "layer-output"}
          ],
          "split_by": {"lengths": "lens"},
          "model": "org/model"
        }"#,
    )
    .unwrap();
    let ds = t.path().join("ds");
    let run = |ds: &Path, extra: &[&str]| {
        let mut args = vec![
            "convert",
            s(&src),
            s(ds),
            "--layout",
            "generic",
            "--mapping",
            s(&mapping),
        ];
        args.extend_from_slice(extra);
        hspack(&args)
    };
    let o = run(&ds, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let d = Dataset::open(&ds).unwrap();
    assert_eq!(d.len(), 2);
    let want = expected("aux_list.pt");
    let parts = [&want["aux.0"][..], &want["aux.1"][..], &want["aux.2"][..]];
    let all = interleave(&parts, 16);
    let aux = d.get_by_key("b/1").unwrap().read("aux", None).unwrap();
    assert_eq!(aux.bytes(), &all[3 * 16..]);
    assert_eq!(
        d.schema().fields[1].role,
        hspack::Role::HiddenStates {
            layers: vec![2, 30, 58],
            point: hspack::CapturePoint::LayerOutput
        }
    );
    assert_eq!(d.schema().capture.as_ref().unwrap().model, "org/model");
    for (extra, key) in [
        (&["--field", "x=lens"][..], "`fields`"),
        (&["--split-by", "cu_seqlens:lens"][..], "`split_by`"),
        (&["--model", "m"][..], "`model`"),
    ] {
        let o = run(&t.path().join("conflict"), extra);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        let msg = text(&o);
        assert!(
            msg.contains("mapping.json") && msg.contains(key) && msg.contains(extra[0]),
            "{msg}"
        );
    }
    std::fs::write(&mapping, r#"{"feilds": []}"#).unwrap();
    let o = run(&t.path().join("typo"), &[]);
    assert!(
        text(&o).contains("mapping.json") && text(&o).contains("feilds"),
        "{}",
        text(&o)
    );
}

#[test]
fn an_unreadable_tensor_is_named_as_such_not_as_missing() {
    let t = tempfile::tempdir().unwrap();
    let (src, ds) = (t.path().join("src"), t.path().join("ds"));
    std::fs::create_dir_all(&src).unwrap();
    let bad = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bad_files/convert");
    std::fs::copy(bad.join("crc_mismatch.pt"), src.join("a.pt")).unwrap();
    let args = ["convert", s(&src), s(&ds), "--layout", "generic"];
    let o = hspack(&[&args[..], &["--field", "x=t"]].concat());
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains("a.pt"), "{out}");
    assert!(out.contains("CRC"), "{out}");
    assert!(!out.contains("missing tensor"), "{out}");
}
