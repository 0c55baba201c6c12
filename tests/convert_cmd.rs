//! `hspack convert`, run as the built binary in temp folders: bytes against the torch fixtures,
//! resume without duplicates, and SIGKILL at many points with `--delete-source`.

mod common;

use common::cli::{hspack, text};
use common::dumps::{check_dataset, run_then_kill, write_dumps, V};
use common::{pt_fixtures, s};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use hspack::Dataset;
use safetensors::Dtype;

fn unhex(h: &str) -> Vec<u8> {
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
        .collect()
}

/// `expected.json`: file → tensor → raw bytes, as torch.load returned them.
fn expected(file: &str) -> BTreeMap<String, Vec<u8>> {
    let text = std::fs::read_to_string(pt_fixtures().join("expected.json")).unwrap();
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
        std::fs::copy(pt_fixtures().join(from), src.join(to)).unwrap();
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

/// [`convert_args`] without `-q`, for tests that read the report on stderr.
fn loud_args<'a>(src: &'a Path, ds: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = convert_args(src, ds, extra);
    a.retain(|x| *x != "-q");
    a
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
    let o = hspack(&loud_args(&src, &ds, &[]));
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(check_dataset(&ds).len(), 12);
    // The report counts the units skipped whole and their samples alike.
    assert!(
        text(&o).contains("(7 already in the dataset and skipped, 0 bad")
            && text(&o).contains("appended  5 samples (7 already in the dataset and skipped)"),
        "{}",
        text(&o)
    );
    let o = hspack(&convert_args(&src, &ds, &["--delete-source"]));
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(std::fs::read_dir(&src).unwrap().count(), 0);
    assert_eq!(check_dataset(&ds).len(), 12);
    assert!(hspack(&["verify", s(&ds)]).status.success());
}

/// An empty dataset of `schema`'s fields whose capture says `tool` made it, in `dir`.
fn empty_dataset(dir: &Path, tool: &str) {
    let mut schema = common::capture_schema(8);
    schema.capture = Some(hspack::format::CaptureInfo {
        model: "my/model".into(),
        revision: None,
        config_hash: None,
        num_layers: 32,
        hidden_size: 8,
        dtype: hspack::format::DType::BF16,
        tp_size: 1,
        tool: tool.into(),
        tool_version: "1".into(),
    });
    hspack::DatasetWriter::create(dir, schema, common::small_options())
        .unwrap()
        .finish()
        .unwrap();
}

/// The flags of [`convert_args`] with layer 6 for layer 7: fields not the dataset's.
fn other_flags<'a>(src: &'a Path, ds: &'a Path) -> Vec<&'a str> {
    let mut other = convert_args(src, ds, &[]);
    let at = other.iter().position(|a| *a == "hidden.7=h").unwrap();
    other[at] = "hidden.6=h";
    other
}

/// A first run stopped before its first commit (Ctrl-C) leaves a dataset of no samples, as a
/// writer makes its manifest first. The rerun with corrected flags was refused as "not the
/// dataset's" fields, although nothing was ever stored there; it now starts afresh. Only
/// that is removed: not an empty dataset a user made (capture metadata of their own), nor one
/// in a folder holding other files, nor any when the source is not there; and a dataset
/// holding samples still refuses other flags.
#[test]
fn a_first_run_stopped_before_its_first_commit_does_not_pin_the_flags() {
    let t = tempfile::tempdir().unwrap();
    let (src, ds) = (t.path().join("src"), t.path().join("ds"));
    write_dumps(&src, 0..4);
    empty_dataset(&ds, "hspack convert --layout generic");
    // A mistyped source fails, and leaves the dataset.
    let o = hspack(&convert_args(&t.path().join("nosuch"), &ds, &[]));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(Dataset::open(&ds).is_ok());
    let o = hspack(&convert_args(&src, &ds, &[]));
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(check_dataset(&ds).len(), 4);
    let o = hspack(&other_flags(&src, &ds));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("are not the dataset's"), "{}", text(&o));
    assert_eq!(check_dataset(&ds).len(), 4);
    // Kept: an empty dataset of the user's, and one beside other files.
    for (name, tool, beside) in [
        ("mine", "my capture tool", None),
        (
            "beside",
            "hspack convert --layout generic",
            Some("README.md"),
        ),
    ] {
        let kept = t.path().join(name);
        empty_dataset(&kept, tool);
        if let Some(file) = beside {
            std::fs::write(kept.join(file), "notes\n").unwrap();
        }
        let before = std::fs::read(kept.join("manifest.json")).unwrap();
        let o = hspack(&convert_args(&src, &kept, &[]));
        assert_eq!(o.status.code(), Some(2), "{name}: {}", text(&o));
        assert!(
            text(&o).contains("are not the dataset's"),
            "{name}: {}",
            text(&o)
        );
        assert_eq!(
            std::fs::read(kept.join("manifest.json")).unwrap(),
            before,
            "{name}"
        );
    }
}

/// The report of `--skip-bad` named inside a new dataset's folder: the writer took it for
/// someone else's file and refused the folder. And a dump folder holding a `manifest.json` of
/// its own (not an hspack manifest) is no dataset.
#[test]
fn convert_s_own_report_and_a_dump_tool_s_manifest_are_not_in_the_way() {
    let t = tempfile::tempdir().unwrap();
    let (src, ds) = (t.path().join("src"), t.path().join("ds"));
    write_dumps(&src, 0..3);
    let report = ds.join("bad.jsonl");
    let o = hspack(&convert_args(
        &src,
        &ds,
        &["--skip-bad", "--report", s(&report)],
    ));
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(check_dataset(&ds).len(), 3);
    std::fs::write(
        src.join("manifest.json"),
        r#"{"files": ["req_000.safetensors"]}"#,
    )
    .unwrap();
    let o = hspack(&convert_args(&src, &t.path().join("ds2"), &[]));
    assert!(o.status.success(), "{}", text(&o));
}

/// A dataset given as the source was read as dumps: its key run was "not a recognised
/// hidden-state dump", with advice to pass --skip-bad, which made a dataset of nothing.
#[test]
fn a_dataset_given_as_the_source_is_said_to_be_one() {
    let t = tempfile::tempdir().unwrap();
    let (src, ds) = (t.path().join("src"), t.path().join("ds"));
    write_dumps(&src, 0..3);
    assert!(hspack(&convert_args(&src, &ds, &[])).status.success());
    let again = t.path().join("again");
    for extra in [&[][..], &["--skip-bad"]] {
        let o = hspack(&convert_args(&ds, &again, extra));
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(
            text(&o).contains("is an hspack dataset, not hidden-state dumps to convert")
                && text(&o).contains("hspack cp"),
            "{}",
            text(&o)
        );
        assert!(!again.exists());
    }
}

/// A notebook's `.ipynb_checkpoints/` copy of a dump was converted as a sample of its own,
/// and any hidden file was taken for a dump; both are passed over now, and counted.
#[test]
fn hidden_files_and_folders_are_passed_over_and_counted() {
    let t = tempfile::tempdir().unwrap();
    let (src, ds) = (t.path().join("src"), t.path().join("ds"));
    write_dumps(&src, 0..2);
    std::fs::create_dir(src.join(".ipynb_checkpoints")).unwrap();
    let one = src.join("req_000.safetensors");
    std::fs::copy(&one, src.join(".ipynb_checkpoints/req_900.safetensors")).unwrap();
    std::fs::copy(&one, src.join(".req_901.safetensors")).unwrap();
    let o = hspack(&loud_args(&src, &ds, &[]));
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(check_dataset(&ds).len(), 2);
    assert!(text(&o).contains("2 other files ignored"), "{}", text(&o));
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
    // Short delays: a rerun continues from the last commit, so each kill lands further on. A
    // kill before the run's first commit (a loaded machine starts the process slowly)
    // lengthens the next delay, so kills land between commits however fast the machine is.
    let (mut delay_ms, mut before) = (3u64, 0usize);
    for round in 0..16 {
        let mut convert = Command::new(env!("CARGO_BIN_EXE_hspack"));
        convert.args(convert_args(&src, &ds, &["--delete-source", "--jobs", "4"]));
        let finished = run_then_kill(&mut convert, delay_ms);
        if !finished {
            kills += 1;
        }
        let committed = invariant(&format!("after kill {round} at {delay_ms} ms"));
        let left = std::fs::read_dir(&src).unwrap().count();
        eprintln!("kill at {delay_ms} ms: {committed} committed, {left} sources left");
        if !finished && committed > 0 && committed < N {
            partial += 1;
        }
        if !finished && committed == before {
            delay_ms = delay_ms * 3 / 2 + 2;
        }
        before = committed;
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
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
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
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
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

/// `hspack convert SRC DS` of ModelOpt dumps keyed by their stored `conversation_id`.
fn convert_modelopt_keyed(src: &Path, ds: &Path) -> std::process::Output {
    hspack(&[
        "convert",
        s(src),
        s(ds),
        "--layout",
        "modelopt",
        "--layers",
        "2,16,29,32",
        "--num-layers",
        "32",
        "--key-from",
        "conversation_id",
    ])
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
        std::fs::copy(pt_fixtures().join(from), src.join(format!("{i}.pt"))).unwrap();
    }
    let ds = t.path().join("ds");
    let args = |ds: &Path| convert_modelopt_keyed(&src, ds);
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
    std::fs::copy(pt_fixtures().join("modelopt_str.pt"), src.join("9.pt")).unwrap();
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

/// A file written again under its name (another conversation in `0.pt`) is read again on a
/// rerun, not skipped by the key its name gave before: the key log holds each unit's files'
/// identity (length, modification time, inode) beside its key.
#[test]
fn a_file_written_again_under_its_name_is_read_again() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::copy(pt_fixtures().join("modelopt_str.pt"), src.join("0.pt")).unwrap();
    let ds = t.path().join("ds");
    let convert = || convert_modelopt_keyed(&src, &ds);
    let o = convert();
    assert!(o.status.success(), "{}", text(&o));
    let o = convert();
    assert!(
        text(&o).contains("1 already in the dataset"),
        "{}",
        text(&o)
    );
    std::fs::remove_file(src.join("0.pt")).unwrap();
    std::fs::copy(pt_fixtures().join("modelopt_int.pt"), src.join("0.pt")).unwrap();
    let o = convert();
    assert!(o.status.success(), "{}", text(&o));
    let d = Dataset::open(&ds).unwrap();
    assert_eq!(d.len(), 2, "{}", text(&o));
    assert!(d.get_by_key("17").is_ok() && d.get_by_key("conv-a").is_ok());
}

/// Folder `dir` holding the SpecForge fixture as `data_0.ckpt`; returns it.
fn one_specforge_file(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::copy(
        pt_fixtures().join("specforge.ckpt"),
        dir.join("data_0.ckpt"),
    )
    .unwrap();
    dir.to_path_buf()
}

/// SpecForge files converted with the eagle layout, which reads only `hidden_state`: the
/// auxiliary layers would be lost (and with --delete-source, their only copy): refused,
/// naming the tensor, before anything is written or deleted.
#[test]
fn a_preset_that_would_leave_out_hidden_states_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let src = one_specforge_file(&t.path().join("src"));
    let ds = t.path().join("ds");
    let o = hspack(&[
        "convert",
        s(&src),
        s(&ds),
        "--layout",
        "eagle",
        "--layers",
        "61",
        "--num-layers",
        "61",
        "--delete-source",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("does not convert tensor `aux_hidden_state`")
            && text(&o).contains("--layout generic"),
        "{}",
        text(&o)
    );
    assert!(src.join("data_0.ckpt").exists());
    assert!(Dataset::open(&ds).is_err());
}

/// A ModelOpt-like dump in safetensors bytes (the name need not say so): `input_ids`, `hidden_states` [T, 8] and, where asked,
/// `aux_hidden_states` [T, 16] (two layers) and `loss_mask`.
fn write_modelopt_safetensors(path: &Path, tokens: usize, aux: bool, loss_mask: bool) {
    let le = |v: &[i64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let mut tensors = vec![
        (
            "input_ids",
            vec![tokens],
            Dtype::I64,
            le(&(0..tokens as i64).collect::<Vec<_>>()),
        ),
        (
            "hidden_states",
            vec![tokens, 8],
            Dtype::BF16,
            vec![7u8; tokens * 16],
        ),
    ];
    if aux {
        tensors.push((
            "aux_hidden_states",
            vec![tokens, 16],
            Dtype::BF16,
            vec![9u8; tokens * 32],
        ));
    }
    if loss_mask {
        tensors.push(("loss_mask", vec![tokens], Dtype::I64, le(&vec![1; tokens])));
    }
    write_safetensors(path, tensors);
}

/// The schema comes from the first file converted; a later file holding a tensor the layout
/// would read into a field that schema lacks (an optional part the first file had not) is
/// refused, naming the tensor, and never deleted: converting it would lose that tensor.
#[test]
fn a_later_file_holding_what_the_first_lacked_is_refused_not_cut_down() {
    for (extra, said) in [
        ("aux", "holds tensor `aux_hidden_states`"),
        ("mask", "reads into field `loss_mask`"),
    ] {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        std::fs::create_dir(&src).unwrap();
        write_modelopt_safetensors(&src.join("0.pt"), 4, false, false);
        write_modelopt_safetensors(&src.join("1.pt"), 5, extra == "aux", extra == "mask");
        let ds = t.path().join("ds");
        let o = hspack(&[
            "convert",
            s(&src),
            s(&ds),
            "--layout",
            "modelopt",
            "--layers",
            "32",
            "--num-layers",
            "32",
            "--delete-source",
        ]);
        assert!(!o.status.success(), "{extra}: {}", text(&o));
        assert!(
            text(&o).contains(said) && text(&o).contains("1.pt"),
            "{extra}: {}",
            text(&o)
        );
        assert!(src.join("1.pt").exists(), "{extra}: deleted");
        if let Ok(d) = Dataset::open(&ds) {
            assert!(d.get_by_key("1").is_err(), "{extra}: converted cut down");
        }
    }
}

/// A --group-by pattern that would give two files of one sample the same part (it names
/// `{part}` twice, and only the first was the part): refused before any file is read, naming
/// the pattern, and neither file deleted.
#[test]
fn two_files_of_one_part_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(src.join("k/a")).unwrap();
    write_modelopt_safetensors(&src.join("k/a/x.pt"), 4, false, false);
    write_modelopt_safetensors(&src.join("k/a/y.pt"), 4, false, false);
    let ds = t.path().join("ds");
    let o = hspack(&[
        "convert",
        s(&src),
        s(&ds),
        "--layout",
        "generic",
        "--group-by",
        "{key}/{part}/{part}.pt",
        "--field",
        "input_ids=a.input_ids",
        "--field",
        "hidden.7=a.hidden_states",
        "--delete-source",
    ]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains(
            "--group-by \"{key}/{part}/{part}.pt\": a pattern names {key} once and {part} once"
        ),
        "{}",
        text(&o)
    );
    assert!(src.join("k/a/x.pt").exists() && src.join("k/a/y.pt").exists());
    assert!(!ds.exists());
}

/// A destination inside the source folder: a rerun (the documented resume) does not take the
/// dataset's own files for dumps, and adds what was dumped since.
#[test]
fn a_destination_inside_the_source_is_not_read_as_dumps() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("dumps");
    write_dumps(&src, 0..4);
    let ds = src.join("out");
    let convert = || {
        hspack(&[
            "convert",
            s(&src),
            s(&ds),
            "--layout",
            "generic",
            "--field",
            "input_ids=ids",
            "--field",
            "hidden.7=h",
            "--shard-samples",
            "3",
        ])
    };
    let o = convert();
    assert!(o.status.success(), "{}", text(&o));
    write_dumps(&src, 4..6);
    let o = convert();
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("0 bad, 0 other files ignored"),
        "{}",
        text(&o)
    );
    assert_eq!(check_dataset(&ds).len(), 6);
}

/// Sources the layout does not read (SpecForge's layout reads `.ckpt` files): the error says
/// which file names it reads.
#[test]
fn no_source_files_says_which_files_the_layout_reads() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("st");
    write_dumps(&src, 0..1);
    let o = hspack(&[
        "convert",
        s(&src),
        s(&t.path().join("ds")),
        "--layout",
        "specforge",
        "--layers",
        "2,30,58,61",
        "--num-layers",
        "61",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("which reads files named *.ckpt, *.ckpt.gz (1 other files there)"),
        "{}",
        text(&o)
    );
}

#[test]
fn generic_stacks_one_tensor_per_layer() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::copy(pt_fixtures().join("aux_list.pt"), src.join("a.pt")).unwrap();
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
    // Neither --model nor --num-layers was given: `info` says so, and which flags record them.
    let info = text(&hspack(&["info", s(&ds)]));
    assert!(
        info.contains("model unknown: layer count unknown")
            && info.contains("--model and --num-layers record them"),
        "{info}"
    );
}

#[test]
fn split_by_a_file_beside_the_batch() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::copy(pt_fixtures().join("aux_list.pt"), src.join("b.pt")).unwrap();
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

/// With --delete-source, a split file holding a tensor beside the split one is refused before
/// anything is deleted (it was deleted with the batch, the tensor lost).
#[test]
fn a_split_file_holding_more_than_the_split_is_not_deleted() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::copy(pt_fixtures().join("aux_list.pt"), src.join("b.pt")).unwrap();
    let v = |dtype, shape: Vec<usize>, data: Vec<u8>| V { dtype, shape, data };
    let lens = v(
        Dtype::I32,
        vec![2],
        [1i32, 3].iter().flat_map(|x| x.to_le_bytes()).collect(),
    );
    let extra = v(
        Dtype::F32,
        vec![2],
        [0.5f32, 2.0].iter().flat_map(|x| x.to_le_bytes()).collect(),
    );
    let side = src.join("b.split.safetensors");
    let tensors = [("lens".to_string(), &lens), ("extra".to_string(), &extra)];
    safetensors::serialize_to_file(tensors, None, &side).unwrap();
    let ds = t.path().join("ds");
    let args = |delete: bool| {
        let mut a = vec![
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
        ];
        if delete {
            a.push("--delete-source");
        }
        a
    };
    let o = hspack(&args(true));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("b.split.safetensors")
            && text(&o).contains("`extra`")
            && text(&o).contains("--delete-source would delete it"),
        "{}",
        text(&o)
    );
    assert!(side.exists() && src.join("b.pt").exists(), "deleted");
    let o = hspack(&args(false));
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(Dataset::open(&ds).unwrap().len(), 2);
}

#[test]
fn mapping_file_holds_the_flags_and_refuses_conflicts() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::copy(pt_fixtures().join("aux_list.pt"), src.join("b.pt")).unwrap();
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

/// A generic conversion of `fwd_pass.pt`-like files: ids and hidden states split into requests
/// by `seq_lens`.
fn fwd_args<'a>(src: &'a Path, ds: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![
        "convert",
        s(src),
        s(ds),
        "--layout",
        "generic",
        "--field",
        "input_ids=input_ids",
        "--field",
        "hidden.7=hidden",
        "--split-by",
        "lengths:seq_lens",
    ];
    a.extend_from_slice(extra);
    a
}

/// Tensors as a safetensors file: name, shape, dtype, little-endian bytes.
fn write_safetensors(path: &Path, tensors: Vec<(&str, Vec<usize>, Dtype, Vec<u8>)>) {
    let views: Vec<(String, V)> = tensors
        .into_iter()
        .map(|(n, shape, dtype, data)| (n.to_string(), V { dtype, shape, data }))
        .collect();
    safetensors::serialize_to_file(views.iter().map(|(n, v)| (n.clone(), v)), None, path).unwrap();
}

/// A forward pass like `fwd_pass.pt` as safetensors: the request ids an integer tensor.
fn write_fwd_safetensors(path: &Path, rids: &[i64], lens: &[i64]) {
    let t: i64 = lens.iter().sum();
    let le = |v: &[i64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let tensors = vec![
        (
            "input_ids",
            vec![t as usize],
            Dtype::I64,
            le(&(0..t).collect::<Vec<_>>()),
        ),
        (
            "hidden",
            vec![t as usize, 8],
            Dtype::BF16,
            vec![7u8; t as usize * 16],
        ),
        ("seq_lens", vec![lens.len()], Dtype::I64, le(lens)),
        ("rids", vec![rids.len()], Dtype::I64, le(rids)),
    ];
    write_safetensors(path, tensors);
}

/// `input_ids` i64 `[tokens]` and `hidden` bf16 `[tokens, 8]`, as a safetensors file.
fn write_ids_hidden(path: &Path, tokens: usize) {
    let ids = (0..tokens as i64).flat_map(|x| x.to_le_bytes()).collect();
    let hidden = common::bytes(tokens as u64, tokens * 16);
    write_safetensors(
        path,
        vec![
            ("input_ids", vec![tokens], Dtype::I64, ids),
            ("hidden", vec![tokens, 8], Dtype::BF16, hidden),
        ],
    );
}

/// Two files with one key (`a.pt` and `a.safetensors`) are refused with `--split-by` as
/// without it: a unit reads one file, so the other would be ignored, then deleted with
/// `--delete-source`.
#[test]
fn two_files_with_one_key_are_refused_when_splitting_too() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    write_fwd_safetensors(&src.join("a.safetensors"), &[1, 2], &[3, 3]);
    write_fwd_safetensors(&src.join("a.bin"), &[3, 4], &[2, 4]);
    let ds = t.path().join("ds");
    let o = hspack(&fwd_args(&src, &ds, &["--delete-source"]));
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("both give sample key `a`"),
        "{}",
        text(&o)
    );
    for f in ["a.safetensors", "a.bin"] {
        assert!(src.join(f).exists(), "{f} was deleted");
    }
}

/// Links in the dump are followed: a linked file and a linked folder are converted (they were
/// skipped without a word); a link back up the tree is refused by name.
#[test]
fn linked_files_and_folders_are_converted_and_a_loop_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let (src, elsewhere) = (t.path().join("src"), t.path().join("elsewhere"));
    std::fs::create_dir_all(elsewhere.join("more")).unwrap();
    std::fs::create_dir(&src).unwrap();
    write_fwd_safetensors(&src.join("a.safetensors"), &[1, 2], &[3, 3]);
    write_fwd_safetensors(&elsewhere.join("b.safetensors"), &[3], &[4]);
    write_fwd_safetensors(&elsewhere.join("more/c.safetensors"), &[4, 5], &[1, 2]);
    std::os::unix::fs::symlink(elsewhere.join("b.safetensors"), src.join("b.safetensors")).unwrap();
    std::os::unix::fs::symlink(elsewhere.join("more"), src.join("more")).unwrap();
    // The same folder linked again (`latest -> step_1000`) is converted once; a link to
    // nothing is passed over. Both are counted with the files ignored.
    std::os::unix::fs::symlink(elsewhere.join("more"), src.join("zz-again")).unwrap();
    std::os::unix::fs::symlink(t.path().join("gone"), src.join("dangling.safetensors")).unwrap();
    // The same file reached again, through a link or a hard link, is converted once too (it
    // was stored under both keys), and said by name (it was counted with the files ignored);
    // a FIFO is passed over (it was passed over unsaid).
    std::os::unix::fs::symlink(src.join("a.safetensors"), src.join("zz-same.safetensors")).unwrap();
    std::fs::hard_link(src.join("a.safetensors"), src.join("zz-hard.safetensors")).unwrap();
    // A file whose first name (in order) is one the layout does not take is converted under
    // the name it takes (its sample was lost, and said converted as the other).
    write_fwd_safetensors(&src.join("m.safetensors"), &[6], &[2]);
    std::fs::hard_link(src.join("m.safetensors"), src.join("0-m.safetensors.bak")).unwrap();
    let fifo = src.join("zz-fifo.safetensors");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let ds = t.path().join("ds");
    let o = hspack(&fwd_args(&src, &ds, &[]));
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(Dataset::open(&ds).unwrap().len(), 6, "{}", text(&o));
    assert!(
        keys_in_order(&ds).iter().any(|k| k.starts_with("m/")),
        "{:?}",
        keys_in_order(&ds)
    );
    assert_eq!(
        keys_in_order(&ds)
            .iter()
            .filter(|k| k.starts_with("zz-"))
            .count(),
        0
    );
    assert!(text(&o).contains("4 other files ignored"), "{}", text(&o));
    assert!(!text(&o).contains(".bak is"), "{}", text(&o));
    assert!(
        text(&o).contains("linked    2 files under a second name (a hard link")
            && text(&o).contains("src/zz-hard.safetensors is ")
            && text(&o).contains("src/zz-same.safetensors is "),
        "{}",
        text(&o)
    );
    // A FIFO given as the source is refused by name (reading it waited for good).
    let o = hspack(&fwd_args(&fifo, &t.path().join("ds-fifo"), &[]));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("zz-fifo.safetensors") && text(&o).contains("not a file nor a folder"),
        "{}",
        text(&o)
    );
    std::fs::remove_file(&fifo).unwrap();
    std::os::unix::fs::symlink(&src, elsewhere.join("more/up")).unwrap();
    let o = hspack(&fwd_args(&src, &t.path().join("ds2"), &[]));
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("more/up") && text(&o).contains("a loop"),
        "{}",
        text(&o)
    );
}

/// A source whose key the dataset holds with other data (a second dump with the same file
/// names, or a rewritten file) is refused by name, never skipped as converted nor deleted; a
/// rerun over the same sources still resumes.
#[test]
fn a_key_the_dataset_holds_with_other_data_is_refused_not_deleted() {
    let t = tempfile::tempdir().unwrap();
    let (first, second) = (t.path().join("first"), t.path().join("second"));
    for dir in [&first, &second] {
        std::fs::create_dir(dir).unwrap();
    }
    write_fwd_safetensors(&first.join("a.safetensors"), &[1, 2], &[3, 3]);
    write_fwd_safetensors(&second.join("a.safetensors"), &[1, 2], &[3, 4]);
    let ds = t.path().join("ds");
    // Split by request: every request's key is compared as it comes. (Keyed by their rids:
    // a tensor nothing reads is refused with --delete-source.)
    let keyed = ["--key-from", "rids"];
    assert!(hspack(&fwd_args(&first, &ds, &keyed)).status.success());
    let o = hspack(&fwd_args(&first, &ds, &keyed));
    assert!(o.status.success(), "a rerun resumes: {}", text(&o));
    let o = hspack(&fwd_args(
        &second,
        &ds,
        &["--key-from", "rids", "--delete-source"],
    ));
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("which the dataset holds with other data"),
        "{}",
        text(&o)
    );
    assert!(second.join("a.safetensors").exists(), "deleted");
    // Whole units: with --delete-source, units held by key are compared before deletion.
    let (first, second) = (t.path().join("first_whole"), t.path().join("second_whole"));
    for (dir, tokens) in [(&first, 6), (&second, 7)] {
        std::fs::create_dir(dir).unwrap();
        write_ids_hidden(&dir.join("a.safetensors"), tokens);
    }
    let whole = |src: &Path, ds: &Path, extra: &[&str]| {
        let mut a = vec![
            "convert",
            s(src),
            s(ds),
            "--layout",
            "generic",
            "--field",
            "input_ids=input_ids",
            "--field",
            "hidden.7=hidden",
        ];
        a.extend_from_slice(extra);
        hspack(&a)
    };
    let ds = t.path().join("whole");
    assert!(whole(&first, &ds, &[]).status.success());
    let o = whole(&second, &ds, &["--delete-source"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("a.safetensors: gives sample key `a`"),
        "{}",
        text(&o)
    );
    assert!(second.join("a.safetensors").exists(), "deleted");
    // The same sources again: held, equal, and deleted.
    let o = whole(&first, &ds, &["--delete-source"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!first.join("a.safetensors").exists(), "kept");
    assert_eq!(Dataset::open(&ds).unwrap().len(), 1);
}

/// A rerun with `--capture-config` over split batches, after more batches came: the
/// requests the dataset holds are not copied from the store again (that was a duplicate key
/// error), and the new batch's are converted.
#[test]
fn a_rerun_with_a_capture_config_resumes_split_batches() {
    let t = tempfile::tempdir().unwrap();
    let (src, store) = (t.path().join("src"), t.path().join("store"));
    std::fs::create_dir(&src).unwrap();
    assert!(hspack(&["store", "init", s(&store)]).status.success());
    let config = common::dumps::write_capture_config(t.path());
    let ds = store.join("ds");
    let args = ["--capture-config", s(&config)];
    write_fwd_safetensors(&src.join("a.safetensors"), &[1, 2], &[3, 3]);
    let o = hspack(&fwd_args(&src, &ds, &args));
    assert!(o.status.success(), "{}", text(&o));
    write_fwd_safetensors(&src.join("b.safetensors"), &[3, 4], &[2, 5]);
    let o = hspack(&fwd_args(&src, &ds, &args));
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(keys_in_order(&ds), ["a/0", "a/1", "b/0", "b/1"]);
}

/// `--delete-source` with one file as the source deletes the file, not its folder.
#[test]
fn deleting_a_source_that_is_one_file_keeps_its_folder() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("solo/sub");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("a.safetensors");
    write_fwd_safetensors(&file, &[1, 2], &[3, 3]);
    let args = ["--key-from", "rids", "--delete-source"];
    let o = hspack(&fwd_args(&file, &t.path().join("ds"), &args));
    assert!(o.status.success(), "{}", text(&o));
    assert!(!file.exists() && dir.is_dir(), "{}", text(&o));
}

/// A mistyped `--split-by` tensor is the flag's fault: said so, naming the tensors the file
/// has (it was called a bad file, and `--skip-bad` then skipped every one); lengths that do
/// not add up say what they add up to.
#[test]
fn a_mistyped_split_tensor_and_lengths_that_do_not_add_up_say_so() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    write_fwd_safetensors(&src.join("a.safetensors"), &[1, 2], &[3, 3]);
    let ds = t.path().join("ds");
    let mut args = fwd_args(&src, &ds, &["--skip-bad"]);
    let at = args.iter().position(|a| *a == "lengths:seq_lens").unwrap();
    args[at] = "lengths:seq_len";
    let o = hspack(&args);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o)
            .contains("--split-by names tensor `seq_len`, which the file does not hold (it has: ")
            && text(&o).contains("seq_lens")
            && text(&o).contains("check the flag"),
        "{}",
        text(&o)
    );
    // Lengths of 5 and 6 for 12 tokens.
    let short = t.path().join("short");
    std::fs::create_dir(&short).unwrap();
    let (ids, hidden) = (vec![0u8; 12 * 8], vec![7u8; 12 * 16]);
    let lens: Vec<u8> = [5i64, 6].iter().flat_map(|v| v.to_le_bytes()).collect();
    let views = [
        (
            "input_ids",
            V {
                dtype: Dtype::I64,
                shape: vec![12],
                data: ids,
            },
        ),
        (
            "hidden",
            V {
                dtype: Dtype::BF16,
                shape: vec![12, 8],
                data: hidden,
            },
        ),
        (
            "seq_lens",
            V {
                dtype: Dtype::I64,
                shape: vec![2],
                data: lens,
            },
        ),
    ];
    safetensors::serialize_to_file(
        views.iter().map(|(n, v)| (n.to_string(), v)),
        None,
        &short.join("c.safetensors"),
    )
    .unwrap();
    let o = hspack(&fwd_args(&short, &t.path().join("ds2"), &[]));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("`seq_lens` does not split the 12 tokens: its 2 lengths add up to 11"),
        "{}",
        text(&o)
    );
}

fn keys_in_order(ds: &Path) -> Vec<String> {
    let d = Dataset::open(ds).unwrap();
    (0..d.len())
        .map(|i| d.sample(i).unwrap().key().to_string())
        .collect()
}

#[test]
fn per_forward_pass_dumps_key_each_request_by_its_id() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    // A list of str ids (torch), and an integer tensor of ids (safetensors).
    std::fs::copy(pt_fixtures().join("fwd_pass.pt"), src.join("00000.pt")).unwrap();
    write_fwd_safetensors(&src.join("00001.safetensors"), &[7, 9], &[1, 2]);
    let ds = t.path().join("ds");
    let o = hspack(&fwd_args(&src, &ds, &["--key-from", "rids"]));
    assert!(o.status.success(), "{}", text(&o));
    // Requests in file order, keyed by their ids.
    assert_eq!(keys_in_order(&ds), ["req-b", "req-a", "7", "9"]);
    let want = expected("fwd_pass.pt");
    let d = Dataset::open(&ds).unwrap();
    let read = |k: &str, f: &str| {
        d.get_by_key(k)
            .unwrap()
            .read(f, None)
            .unwrap()
            .bytes()
            .to_vec()
    };
    assert_eq!(read("req-b", "input_ids"), want["input_ids"][..2 * 8]);
    assert_eq!(read("req-a", "input_ids"), want["input_ids"][2 * 8..]);
    assert_eq!(read("req-a", "hidden.7"), want["hidden"][2 * 16..]);
    // Without --key-from, KEY/j remains.
    let plain = t.path().join("plain");
    let o = hspack(&fwd_args(&src, &plain, &[]));
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        keys_in_order(&plain),
        ["00000/0", "00000/1", "00001/0", "00001/1"]
    );
    // Ids must match the requests: as many, none twice; a list without --split-by is explained.
    let bad = t.path().join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    write_fwd_safetensors(&bad.join("a.safetensors"), &[1, 2, 3], &[1, 2]);
    let o = hspack(&fwd_args(
        &bad,
        &t.path().join("ds-bad"),
        &["--key-from", "rids"],
    ));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("a.safetensors") && text(&o).contains("3 ids"),
        "{}",
        text(&o)
    );
    let o = hspack(&[
        "convert",
        s(&src.join("00000.pt")),
        s(&t.path().join("ds-nosplit")),
        "--layout",
        "generic",
        "--field",
        "input_ids=input_ids",
        "--key-from",
        "rids",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--split-by"), "{}", text(&o));
    // Two passes giving one request id: an error naming both files.
    std::fs::copy(pt_fixtures().join("fwd_pass.pt"), src.join("00002.pt")).unwrap();
    let o = hspack(&fwd_args(
        &src,
        &t.path().join("dup"),
        &["--key-from", "rids"],
    ));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let msg = text(&o);
    assert!(
        msg.contains("00000.pt") && msg.contains("00002.pt") && msg.contains("`req-b`"),
        "{msg}"
    );
}

#[test]
fn grouped_files_name_values_as_fields_and_errors_name_the_file_at_fault() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::copy(
        pt_fixtures().join("fwd_pass.pt"),
        src.join("fwd_00000_meta.pt"),
    )
    .unwrap();
    // A bare int32 tensor of 5 entries, one per token.
    std::fs::copy(
        pt_fixtures().join("bare_tensor.pt"),
        src.join("fwd_00000_L2.pt"),
    )
    .unwrap();
    let run = |src: &Path, ds: &Path, extra: &[&str]| {
        let mut a = vec![
            "convert",
            s(src),
            s(ds),
            "--layout",
            "generic",
            "--group-by",
            "{key}_{part}.pt",
            "--field",
            "input_ids=meta.input_ids",
            "--field",
            "hidden.7=meta.hidden",
            "--field",
            "l2=L2:role=other",
            "--split-by",
            "lengths:meta.seq_lens",
        ];
        a.extend_from_slice(extra);
        hspack(&a)
    };
    // One naming rule: meta.rids, as meta.input_ids.
    let ds = t.path().join("ds");
    let o = run(&src, &ds, &["--key-from", "meta.rids"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(keys_in_order(&ds), ["req-b", "req-a"]);
    let l2 = Dataset::open(&ds)
        .unwrap()
        .get_by_key("req-a")
        .unwrap()
        .read("l2", None)
        .unwrap()
        .bytes()
        .to_vec();
    assert_eq!(l2, expected("bare_tensor.pt")[""][2 * 4..]);
    // The bare name is refused with the name to give, naming the file that holds it.
    let o = run(&src, &t.path().join("bare"), &["--key-from", "rids"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let msg = text(&o);
    assert!(msg.contains("--key-from meta.rids"), "{msg}");
    assert!(
        msg.contains("fwd_00000_meta.pt") && !msg.contains("fwd_00000_L2.pt"),
        "{msg}"
    );
    // A bad key value: the error names the file holding it, not the group's first file.
    let o = run(
        &src,
        &t.path().join("badkey"),
        &["--key-from", "meta.input_ids"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let msg = text(&o);
    assert!(
        msg.contains("fwd_00000_meta.pt") && !msg.contains("fwd_00000_L2.pt"),
        "{msg}"
    );
    // A group lacking a part: the missing file is named, not another file of the group.
    std::fs::copy(
        pt_fixtures().join("fwd_pass.pt"),
        src.join("fwd_00002_meta.pt"),
    )
    .unwrap();
    let o = run(&src, &t.path().join("missing"), &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let msg = text(&o);
    assert!(
        msg.contains("fwd_00002_L2.pt") && msg.contains("missing"),
        "{msg}"
    );
    assert!(!msg.contains("fwd_00002_meta.pt"), "{msg}");
    let o = run(&src, &t.path().join("skip"), &["--skip-bad", "--json"]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        v["bad"][0]["file"]
            .as_str()
            .unwrap()
            .ends_with("fwd_00002_L2.pt"),
        "{v}"
    );
}

#[test]
fn the_last_layer_is_the_final_norm_only_when_num_layers_says_so() {
    let t = tempfile::tempdir().unwrap();
    one_specforge_file(&t.path().join("src/rows_0-1"));
    let src = t.path().join("src");
    let run = |ds: &Path, extra: &[&str]| {
        let mut a = vec![
            "convert",
            s(&src),
            s(ds),
            "--layout",
            "specforge",
            "--layers",
            "2,30,58,60",
        ];
        a.extend_from_slice(extra);
        hspack(&a)
    };
    let ds = t.path().join("ds");
    let o = run(&ds, &["--num-layers", "61"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let msg = text(&o);
    assert!(msg.contains("--layers 2,30,58,61"), "{msg}");
    assert!(
        msg.contains("--point layer-input,layer-input,layer-input,layer-output"),
        "{msg}"
    );
    let o = run(&ds, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--num-layers 60"), "{}", text(&o));
    assert!(!ds.exists(), "a refused run leaves no dataset");
    // Said explicitly, either way, it converts.
    let o = run(&ds, &["--num-layers", "60"]);
    assert!(o.status.success(), "{}", text(&o));
    let points = run(
        &t.path().join("points"),
        &[
            "--point",
            "layer-input,layer-input,layer-input,layer-output",
            "--num-layers",
            "61",
        ],
    );
    assert!(points.status.success(), "{}", text(&points));
    let d = Dataset::open(t.path().join("points")).unwrap();
    assert_eq!(
        d.schema().fields[3].role,
        hspack::Role::HiddenState {
            layer: 60,
            point: hspack::CapturePoint::LayerOutput
        }
    );
}

#[test]
fn a_split_rerun_reports_what_it_skipped() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::copy(pt_fixtures().join("fwd_pass.pt"), src.join("a.pt")).unwrap();
    let ds = t.path().join("ds");
    let o = hspack(&fwd_args(&src, &ds, &[]));
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("converted 1 of 1 units"), "{}", text(&o));
    let o = hspack(&fwd_args(&src, &ds, &[]));
    let msg = text(&o);
    assert!(
        msg.contains("converted 0 of 1 units (1 already in the dataset"),
        "{msg}"
    );
    assert!(
        msg.contains("appended  0 samples (2 already in the dataset"),
        "{msg}"
    );
    let o = hspack(&fwd_args(&src, &ds, &["--json"]));
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (
            &v["converted"],
            &v["already_present"],
            &v["samples"],
            &v["samples_already_present"]
        ),
        (&0.into(), &1.into(), &0.into(), &2.into()),
        "{v}"
    );
}

#[test]
fn a_failed_first_run_leaves_no_dataset() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    write_dumps(&src, 0..3);
    std::fs::write(src.join("req_001.safetensors"), b"not a tensor file").unwrap();
    let ds = t.path().join("ds");
    let o = hspack(&convert_args(&src, &ds, &[]));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(!ds.exists(), "the run created {} and left it", ds.display());
    // A folder that was there stays, empty.
    std::fs::create_dir(&ds).unwrap();
    let o = hspack(&convert_args(&src, &ds, &[]));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let left: Vec<_> = std::fs::read_dir(&ds)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");
    // What was committed before a bad file stays: shards of three, req_003 is bad.
    let (src, ds) = (t.path().join("src2"), t.path().join("ds2"));
    write_dumps(&src, 0..5);
    std::fs::write(src.join("req_003.safetensors"), b"not a tensor file").unwrap();
    let o = hspack(&convert_args(&src, &ds, &["--jobs", "1"]));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert_eq!(check_dataset(&ds).len(), 3);
}

#[test]
fn skipped_bad_files_exit_3_and_are_listed() {
    let t = tempfile::tempdir().unwrap();
    let (src, ds) = (t.path().join("src"), t.path().join("ds"));
    write_dumps(&src, 0..6);
    let bad = [1, 2, 4, 5].map(|i| format!("req_{i:03}.safetensors"));
    for b in &bad {
        std::fs::write(src.join(b), b"not a tensor file").unwrap();
    }
    let o = hspack(&loud_args(&src, &ds, &["--skip-bad"]));
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let msg = text(&o);
    for b in &bad {
        assert!(msg.contains(b.as_str()), "{b}: {msg}");
    }
    let o = hspack(&convert_args(&src, &ds, &["--skip-bad", "--json"]));
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let listed: Vec<&str> = v["bad"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["file"].as_str().unwrap())
        .collect();
    assert_eq!(listed.len(), 4, "{v}");
    for (l, b) in listed.iter().zip(&bad) {
        assert!(l.ends_with(b.as_str()), "{l} {b}");
    }
    assert_eq!(check_dataset(&ds).len(), 2);
    // Documented where users look.
    let help = text(&hspack(&["convert", "--help"]));
    assert!(
        help.contains("3 with") && help.contains("--skip-bad"),
        "{help}"
    );
}

#[test]
fn numbered_files_convert_in_natural_order_and_resume_in_it() {
    let t = tempfile::tempdir().unwrap();
    let (src, ds) = (t.path().join("src"), t.path().join("ds"));
    write_dumps(&src, 0..12);
    let rename = |i: usize| {
        std::fs::rename(
            src.join(format!("req_{i:03}.safetensors")),
            src.join(format!("data_{i}.safetensors")),
        )
        .unwrap()
    };
    for i in 0..12 {
        rename(i);
    }
    let o = hspack(&convert_args(&src, &ds, &["--jobs", "3"]));
    assert!(o.status.success(), "{}", text(&o));
    let want: Vec<String> = (0..12).map(|i| format!("data_{i}")).collect();
    assert_eq!(keys_in_order(&ds), want);
    // New files come after, in their order; a rerun skips what is there.
    write_dumps(&src, 12..14);
    rename(12);
    rename(13);
    let o = hspack(&loud_args(&src, &ds, &[]));
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("12 already in the dataset"),
        "{}",
        text(&o)
    );
    let want: Vec<String> = (0..14).map(|i| format!("data_{i}")).collect();
    assert_eq!(keys_in_order(&ds), want);
    // With keys read from the files: the same order, and the key log still skips on a rerun.
    let (src, ds) = (t.path().join("src-ids"), t.path().join("ds-ids"));
    std::fs::create_dir_all(&src).unwrap();
    for i in 0..12 {
        let v = |dtype, shape: Vec<usize>, data: Vec<u8>| V { dtype, shape, data };
        let tensors = [
            (
                "ids",
                v(
                    Dtype::I32,
                    vec![2],
                    [1i32, 2].map(i32::to_le_bytes).concat(),
                ),
            ),
            ("h", v(Dtype::BF16, vec![1, 2, 4], vec![i as u8; 16])),
            (
                "cid",
                v(
                    Dtype::I64,
                    vec![1],
                    (1000 + i as i64).to_le_bytes().to_vec(),
                ),
            ),
        ];
        let path = src.join(format!("data_{i}.safetensors"));
        safetensors::serialize_to_file(
            tensors.iter().map(|(n, v)| (n.to_string(), v)),
            None,
            &path,
        )
        .unwrap();
    }
    let by_ids = || hspack(&loud_args(&src, &ds, &["--key-from", "cid"]));
    let o = by_ids();
    assert!(o.status.success(), "{}", text(&o));
    let want: Vec<String> = (1000..1012).map(|k| k.to_string()).collect();
    assert_eq!(keys_in_order(&ds), want);
    let o = by_ids();
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("12 already in the dataset"),
        "{}",
        text(&o)
    );
    assert_eq!(keys_in_order(&ds), want);
}

/// Thread counts and shard sizes no machine has (and no thread) are refused before anything is
/// read or made, naming the option and its limit (a count that overflowed divided by zero, one
/// beyond what the system starts failed a thread spawn; a shard size that overflowed made
/// 0-byte shards).
#[test]
fn jobs_and_shard_sizes_beyond_any_machine_are_refused_by_name() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    write_dumps(&src, 0..3);
    let ds = t.path().join("ds");
    for (flag, value, said) in [
        ("--jobs", "4611686018427387904", "give 1 to 4096"),
        ("--jobs", "1000000", "give 1 to 4096"),
        ("--jobs", "0", "give 1 to 4096"),
        ("--shard-mib", "0", "give 1 or more"),
        ("--shard-mib", "17592186044416", "at most 1048576"),
    ] {
        let o = hspack(&convert_args(&src, &ds, &[flag, value]));
        let out = text(&o);
        assert_eq!(o.status.code(), Some(2), "{flag} {value}: {out}");
        assert!(
            out.contains(&format!("{flag} {value}")) && out.contains(said),
            "{out}"
        );
        assert!(!out.contains("panicked"), "{out}");
        assert!(!ds.exists(), "{flag} {value}: made {}", ds.display());
    }
    let o = hspack(&convert_args(
        &src,
        &ds,
        &["--jobs", "4096", "--shard-mib", "1048576"],
    ));
    assert!(o.status.success(), "{}", text(&o));
}

/// Names that are not UTF-8 are said as text (U+FFFD in place), never a panic nor an empty
/// line: `convert --skip-bad --json` into such a folder, a bad file of such a name in the
/// bad-file list, and `info --json` of the dataset.
#[test]
fn names_that_are_not_utf8_are_said_not_lost() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    write_dumps(&src, 0..2);
    std::fs::write(
        src.join(OsStr::from_bytes(b"bad\xff.safetensors")),
        b"\x10\0\0\0",
    )
    .unwrap();
    let ds = t.path().join(OsStr::from_bytes(b"ds\xfe"));
    let placeholder = t.path().join("ds");
    let mut args: Vec<&OsStr> = convert_args(&src, &placeholder, &["--skip-bad", "--json"])
        .into_iter()
        .map(OsStr::new)
        .collect();
    args[2] = ds.as_os_str();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_hspack"))
        .args(&args)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["bad"][0]["file"].as_str().unwrap().rsplit('/').next(),
        Some("bad\u{fffd}.safetensors")
    );
    assert!(
        v["dataset"]["path"]
            .as_str()
            .unwrap()
            .ends_with("ds\u{fffd}"),
        "{v}"
    );
    let report = std::fs::read_to_string(ds.join("convert-report.jsonl")).unwrap();
    assert!(report.contains("bad\u{fffd}.safetensors"), "{report:?}");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_hspack"))
        .args([OsStr::new("info"), ds.as_os_str(), OsStr::new("--json")])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["path"].as_str().unwrap().ends_with("ds\u{fffd}"), "{v}");
}

/// A rerun that keys samples otherwise than the run that wrote the dataset (`--key-from`
/// added or dropped): the files converted before were appended again under the other keys,
/// every sample twice. Refused, naming the key log and both ways, with nothing appended.
#[test]
fn a_resume_keyed_otherwise_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    write_fwd_safetensors(&src.join("00001.safetensors"), &[7, 9], &[1, 2]);
    let keyed: &[&str] = &["--key-from", "rids"];
    for (name, first, then, said) in [
        (
            "a",
            keyed,
            &[][..],
            "by the value `rids` their files hold (--key-from rids), this one by their file names",
        ),
        (
            "b",
            &[][..],
            keyed,
            "by their file names, this one by the value `rids`",
        ),
    ] {
        let ds = t.path().join(name);
        let o = hspack(&fwd_args(&src, &ds, first));
        assert!(o.status.success(), "{}", text(&o));
        let o = hspack(&fwd_args(&src, &ds, then));
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(text(&o).contains(said), "{}", text(&o));
        assert_eq!(Dataset::open(&ds).unwrap().len(), 2);
    }
}

/// `--key-from` naming a value no file holds (a typo), on files not grouped into parts: every
/// file was called bad (with `--skip-bad` each listed, exit 3, and an empty dataset left). It
/// is the flag's mistake, said once, from the first file.
#[test]
fn a_key_from_that_names_no_value_is_the_flags_mistake() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    write_fwd_safetensors(&src.join("00001.safetensors"), &[7, 9], &[1, 2]);
    write_fwd_safetensors(&src.join("00002.safetensors"), &[8, 10], &[1, 2]);
    for extra in [&[][..], &["--skip-bad"][..]] {
        let ds = t.path().join(format!("ds{}", extra.len()));
        let mut args = vec!["--key-from", "ridz"];
        args.extend_from_slice(extra);
        let o = hspack(&fwd_args(&src, &ds, &args));
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(
            text(&o).contains("--key-from ridz: the file holds no value `ridz`"),
            "{}",
            text(&o)
        );
        assert!(!ds.join("manifest.json").exists());
    }
}

/// A rerun that splits files into requests otherwise than the runs before (`--split-by` added
/// or dropped): the file converted whole was appended again as its requests, every token
/// twice. Refused, naming the key log and both splits, with nothing appended.
#[test]
fn a_resume_split_otherwise_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    write_fwd_safetensors(&src.join("00001.safetensors"), &[7, 9], &[1, 2]);
    let whole = |ds: &Path| -> Vec<String> {
        fwd_args(&src, ds, &[])[..7]
            .iter()
            .map(|a| a.to_string())
            .collect()
    };
    for (name, split_first, said, held) in [
        (
            "a",
            true,
            "split its files with `--split-by lengths:seq_lens`, this one with no --split-by",
            2,
        ),
        (
            "b",
            false,
            "split its files with no --split-by, this one with `--split-by lengths:seq_lens`",
            1,
        ),
    ] {
        let ds = t.path().join(name);
        let split = fwd_args(&src, &ds, &[]);
        let unsplit = whole(&ds);
        let unsplit: Vec<&str> = unsplit.iter().map(String::as_str).collect();
        let (first, then) = match split_first {
            true => (&split, &unsplit),
            false => (&unsplit, &split),
        };
        let o = hspack(first);
        assert!(o.status.success(), "{}", text(&o));
        let o = hspack(then);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(
            text(&o).contains(said) && text(&o).contains("convert-keys.jsonl"),
            "{}",
            text(&o)
        );
        assert_eq!(Dataset::open(&ds).unwrap().len(), held);
    }
}

/// A dataset of a store removed, and made again under its name by `store add`: the removed
/// one's key log, left in `STORE/NAME/`, named units of a dataset no longer there, and a
/// rerun of its conversion skipped a file as converted while the new dataset held other data
/// under its key. The log is of the dataset it was written for: this one reads the file,
/// finds the other data and refuses it.
#[test]
fn a_key_log_of_a_removed_dataset_is_not_trusted_for_its_successor() {
    let t = tempfile::tempdir().unwrap();
    let (first, other, store) = (
        t.path().join("first"),
        t.path().join("other"),
        t.path().join("store"),
    );
    for dir in [&first, &other] {
        std::fs::create_dir_all(dir).unwrap();
    }
    write_fwd_safetensors(&first.join("a.safetensors"), &[7], &[2]);
    write_fwd_safetensors(&other.join("b.safetensors"), &[7], &[3]);
    assert!(hspack(&["store", "init", s(&store)]).status.success());
    let x = store.join("x");
    let o = hspack(&fwd_args(&first, &x, &["--key-from", "rids"]));
    assert!(o.status.success(), "{}", text(&o));
    assert!(x.join("convert-keys.jsonl").exists());
    assert!(hspack(&["store", "rm", s(&store), "x"]).status.success());
    // The same key, other data, made into a dataset apart and added under the name.
    let apart = t.path().join("apart");
    let o = hspack(&fwd_args(&other, &apart, &["--key-from", "rids"]));
    assert!(o.status.success(), "{}", text(&o));
    let o = hspack(&["store", "add", s(&store), s(&apart), "--name", "x"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = hspack(&fwd_args(&first, &x, &["--key-from", "rids"]));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains(
            "a.safetensors: gives sample key `7`, which the dataset holds with other data"
        ),
        "{}",
        text(&o)
    );
    let d = Dataset::open(&x).unwrap();
    assert_eq!(d.len(), 1);
    assert_eq!(d.sample(0).unwrap().rows(), 3);
}

/// A store's dataset named as one of the store's folders (made before such names were
/// refused) is not converted into: its key log went among the store's files, which `store gc`
/// deleted.
#[test]
fn a_store_dataset_named_as_a_store_folder_is_not_converted_into() {
    let t = tempfile::tempdir().unwrap();
    let (src, store) = (t.path().join("src"), t.path().join("st"));
    std::fs::create_dir_all(&src).unwrap();
    write_fwd_safetensors(&src.join("a.safetensors"), &[7], &[2]);
    assert!(hspack(&["store", "init", s(&store)]).status.success());
    let o = hspack(&fwd_args(&src, &store.join("x"), &[]));
    assert!(o.status.success(), "{}", text(&o));
    // Its file renamed, as an older hspack let a dataset be named.
    let datasets = store.join("datasets");
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(datasets.join("x.json")).unwrap()).unwrap();
    v["name"] = "packs".into();
    std::fs::write(datasets.join("packs.json"), serde_json::to_vec(&v).unwrap()).unwrap();
    std::fs::remove_file(datasets.join("x.json")).unwrap();
    assert_eq!(Dataset::open(store.join("packs")).unwrap().len(), 1);
    let o = hspack(&fwd_args(&src, &store.join("packs"), &[]));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains(
            "`packs` is the name of one of the store's own folders, where convert's key log"
        ),
        "{}",
        text(&o)
    );
    assert!(!store.join("packs/convert-keys.jsonl").exists());
}
