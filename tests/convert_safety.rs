//! `hspack convert` never loses what it does not store, nor skips a sample it was not shown
//! to hold: `--delete-source` refuses units holding a tensor no field reads (and lossy
//! options, unless acknowledged), a held key is skipped only where the key log says its files
//! gave it or its data is compared, and what the first file cannot tell is asked for.

mod common;

use common::cli::{hspack, text};
use common::dumps::V;
use common::s;

use std::path::{Path, PathBuf};

use hspack::Dataset;
use safetensors::Dtype;

/// A tensor to write: name, shape, dtype, little-endian bytes.
type T<'a> = (&'a str, Vec<usize>, Dtype, Vec<u8>);

/// Writes `tensors` as a safetensors file at `path` (whatever its extension: sources are
/// recognised by content), creating its folder.
fn write(path: &Path, tensors: Vec<T<'_>>) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let views: Vec<(String, V)> = tensors
        .into_iter()
        .map(|(n, shape, dtype, data)| (n.to_string(), V { dtype, shape, data }))
        .collect();
    safetensors::serialize_to_file(views.iter().map(|(n, v)| (n.clone(), v)), None, path).unwrap();
}

fn ids(tokens: usize) -> T<'static> {
    let b = (0..tokens as i64).flat_map(|x| x.to_le_bytes()).collect();
    ("ids", vec![tokens], Dtype::I64, b)
}

/// An f32 `[tokens, 8]` tensor of bytes from `seed`.
fn hidden(name: &str, tokens: usize, seed: u64) -> T<'_> {
    // Small finite floats: the low bytes vary, the exponent stays tame.
    let b = common::bytes(seed, tokens * 8)
        .iter()
        .flat_map(|&x| (f32::from(x) / 16.0).to_le_bytes())
        .collect();
    (name, vec![tokens, 8], Dtype::F32, b)
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// `--group-by` with a part no field reads (`L30`), and a file with a tensor no field reads
/// (`h30`): with `--delete-source`, refused up front naming the file, the part or tensor and
/// what to do; every file kept, no dataset. Without `--delete-source`, they convert.
#[test]
fn delete_source_refuses_what_no_field_reads() {
    let t = tempfile::tempdir().unwrap();
    let group = t.path().join("group");
    for k in 0..2 {
        write(&group.join(format!("s{k}_meta.st")), vec![ids(4)]);
        write(&group.join(format!("s{k}_L2.st")), vec![hidden("h", 4, k)]);
        write(
            &group.join(format!("s{k}_L30.st")),
            vec![hidden("h", 4, 9 + k)],
        );
    }
    let ds = t.path().join("group-ds");
    let grouped = |extra: &[&str]| {
        let mut a = vec!["convert", s(&group), s(&ds), "--layout", "generic"];
        a.extend([
            "--group-by",
            "{key}_{part}.st",
            "--field",
            "input_ids=meta.ids",
            "--field",
            "hidden.2=L2.h",
        ]);
        a.extend_from_slice(extra);
        hspack(&a)
    };
    let o = grouped(&["--delete-source"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let msg = text(&o);
    assert!(
        msg.contains("s0_L30.st")
            && msg.contains("part `L30`")
            && msg.contains("--field NAME=L30.TENSOR")
            && msg.contains("leave out --delete-source"),
        "{msg}"
    );
    assert_eq!(files_in(&group).len(), 6);
    assert!(Dataset::open(&ds).is_err());
    let o = grouped(&["-q"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(Dataset::open(&ds).unwrap().len(), 2);

    // One file: `h30` read by no field.
    let src = t.path().join("one");
    let three = |seed| vec![ids(4), hidden("h2", 4, seed), hidden("h30", 4, seed + 1)];
    write(&src.join("a.safetensors"), three(1));
    let ds = t.path().join("one-ds");
    let fields = ["--field", "input_ids=ids", "--field", "hidden.2=h2"];
    let one = |src: &Path, extra: &[&str]| {
        let mut a = vec!["convert", s(src), s(&ds), "--layout", "generic"];
        a.extend(fields);
        a.extend_from_slice(extra);
        hspack(&a)
    };
    let o = one(&src, &["--delete-source"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let msg = text(&o);
    assert!(
        msg.contains("a.safetensors")
            && msg.contains("tensor `h30` (f32 [4, 8]) is read by no field")
            && msg.contains("--field NAME=h30"),
        "{msg}"
    );
    assert!(src.join("a.safetensors").exists());
    assert!(Dataset::open(&ds).is_err());

    // A later file holding what the first lacks is a bad file, kept; the others go.
    let later = t.path().join("later");
    write(
        &later.join("a.safetensors"),
        vec![ids(4), hidden("h2", 4, 1)],
    );
    write(&later.join("b.safetensors"), three(3));
    write(
        &later.join("c.safetensors"),
        vec![ids(4), hidden("h2", 4, 5)],
    );
    let o = one(&later, &["--delete-source", "--skip-bad", "-q"]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert_eq!(files_in(&later), ["b.safetensors"]);
    assert_eq!(Dataset::open(&ds).unwrap().len(), 2);
}

/// A SpecForge file (safetensors bytes under a `.ckpt` name) with one more `[1, T, H]`
/// tensor no field of the preset reads.
fn specforge_file(path: &Path, extra: Option<T<'_>>) {
    let t = 4;
    let bf16 = |n: usize, seed| common::bytes(seed, n * 2);
    write(
        path,
        vec![
            ("input_ids", vec![t], Dtype::I64, ids(t).3),
            ("loss_mask", vec![t], Dtype::I64, ids(t).3),
            (
                "aux_hidden_state",
                vec![1, t, 24],
                Dtype::BF16,
                bf16(t * 24, 1),
            ),
            ("hidden_state", vec![1, t, 8], Dtype::BF16, bf16(t * 8, 2)),
        ]
        .into_iter()
        .chain(extra)
        .collect(),
    );
}

fn specforge_args<'a>(src: &'a Path, ds: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["convert", s(src), s(ds), "--layout", "specforge", "-q"];
    a.extend(["--layers", "1,2,3,4", "--num-layers", "4"]);
    a.extend_from_slice(extra);
    a
}

/// A preset's files holding an fp8 `[1, T, H]` tensor it does not read are refused, as other
/// floats are; one of a dtype hspack does not store (uint16: bf16 bits, maybe) is harmless
/// unless `--delete-source` would delete it.
#[test]
fn a_preset_refuses_fp8_and_unstored_tensors_it_would_lose() {
    let t = tempfile::tempdir().unwrap();
    let fp8 = t.path().join("fp8");
    let fp8_file = fp8.join("rows_0/data_0.ckpt");
    let target = ("target_fp8", vec![1, 4, 8], Dtype::F8_E4M3, vec![0x38; 32]);
    specforge_file(&fp8_file, Some(target));
    let ds = t.path().join("ds");
    let o = hspack(&specforge_args(&fp8, &ds, &["--delete-source"]));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("does not convert tensor `target_fp8` (f8e4m3fn [1, 4, 8])"),
        "{}",
        text(&o)
    );
    assert!(fp8_file.exists());

    let u16 = t.path().join("u16");
    let u16_file = u16.join("rows_0/data_0.ckpt");
    specforge_file(
        &u16_file,
        Some(("last_u16", vec![1, 4, 8], Dtype::U16, vec![0; 64])),
    );
    let o = hspack(&specforge_args(&u16, &ds, &["--delete-source"]));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("tensor `last_u16` (U16, a dtype hspack does not store"),
        "{}",
        text(&o)
    );
    assert!(u16_file.exists());
    let o = hspack(&specforge_args(&u16, &ds, &[]));
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(Dataset::open(&ds).unwrap().len(), 1);
}

/// `--quantize` and `--trim-padding` store less than the sources hold: `--delete-source`
/// refuses them before touching anything, unless `--delete-lossy-source` says to go on.
#[test]
fn lossy_options_with_delete_source_need_saying_so() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    let file = src.join("rows_0/data_0.ckpt");
    // A tensor the preset does not read, however small, would be deleted with its file.
    specforge_file(&file, Some(("step", vec![1], Dtype::I64, vec![0; 8])));
    let ds = t.path().join("ds");
    let o = hspack(&specforge_args(&src, &ds, &["--delete-source"]));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("tensor `step` (i64 [1]) is read by no field"),
        "{}",
        text(&o)
    );
    assert!(file.exists() && !ds.exists());
    specforge_file(&file, None);
    for lossy in [["--quantize", "fp8"], ["--trim-padding", "mask"]] {
        let o = hspack(&specforge_args(
            &src,
            &ds,
            &[&lossy[..], &["--delete-source"]].concat(),
        ));
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        let msg = text(&o);
        assert!(
            msg.contains(&format!("--delete-source with {} {}", lossy[0], lossy[1]))
                && msg.contains("--delete-lossy-source"),
            "{msg}"
        );
        assert!(file.exists() && !ds.exists());
    }
    let o = hspack(&specforge_args(&src, &ds, &["--delete-lossy-source"]));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let args = [
        "--quantize",
        "fp8",
        "--delete-source",
        "--delete-lossy-source",
    ];
    let o = hspack(&specforge_args(&src, &ds, &args));
    assert!(o.status.success(), "{}", text(&o));
    assert!(!file.exists());
    assert_eq!(Dataset::open(&ds).unwrap().len(), 1);
}

/// SpecForge-like dumps `rows_0/data_{0,1,2}.ckpt` of `tokens` tokens, bytes from `seed`.
fn dump(dir: &Path, tokens: usize, seed: u64) -> PathBuf {
    for i in 0..3 {
        let bf16 = |n: usize, s| common::bytes(seed * 10 + i + s, n * 2);
        write(
            &dir.join(format!("rows_0/data_{i}.ckpt")),
            vec![
                ("input_ids", vec![tokens], Dtype::I64, ids(tokens).3),
                ("loss_mask", vec![tokens], Dtype::I64, ids(tokens).3),
                (
                    "aux_hidden_state",
                    vec![1, tokens, 24],
                    Dtype::BF16,
                    bf16(tokens * 24, 1),
                ),
                (
                    "hidden_state",
                    vec![1, tokens, 8],
                    Dtype::BF16,
                    bf16(tokens * 8, 2),
                ),
            ],
        );
    }
    dir.to_path_buf()
}

/// A second, different dump under the same file names, converted into the same dataset: its
/// keys are held with other data, so it is refused, never skipped as converted before. A
/// rerun over the first dump resumes (skipped whole by the key log), as does one whose key
/// log is gone or whose files were touched (compared first, then skipped).
#[test]
fn a_different_dump_under_held_keys_is_refused_not_skipped() {
    let t = tempfile::tempdir().unwrap();
    let first = dump(&t.path().join("first"), 5, 1);
    let second = dump(&t.path().join("second"), 6, 2);
    let ds = t.path().join("ds");
    let run = |src: &Path, extra: &[&str]| {
        let mut a = specforge_args(src, &ds, extra);
        a.retain(|x| *x != "-q");
        hspack(&a)
    };
    // Interrupted after two files: the rerun converts the third.
    let third = first.join("rows_0/data_2.ckpt");
    let aside = t.path().join("data_2.ckpt");
    std::fs::rename(&third, &aside).unwrap();
    assert!(run(&first, &[]).status.success());
    std::fs::rename(&aside, &third).unwrap();
    let o = run(&first, &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("converted 1 of 3 units (2 already in the dataset and skipped"),
        "{}",
        text(&o)
    );
    let o = run(&second, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("second/rows_0/data_0.ckpt: gives sample key `rows_0/data_0`, which the dataset holds with other data"),
        "{}",
        text(&o)
    );
    assert_eq!(Dataset::open(&ds).unwrap().len(), 3);
    let resumed = "converted 0 of 3 units (3 already in the dataset and skipped";
    let o = run(&first, &[]);
    assert!(
        o.status.success() && text(&o).contains(resumed),
        "{}",
        text(&o)
    );
    // Skipped unread where the log names the files as they are: zeros written over a file in
    // place, its size and time kept, are never opened (compared, they would not decode).
    let overwrite = |bytes: &[u8], modified: std::time::SystemTime| {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&third)
            .unwrap();
        f.write_all(bytes).unwrap();
        f.set_modified(modified).unwrap();
    };
    let saved = std::fs::read(&third).unwrap();
    let modified = std::fs::metadata(&third).unwrap().modified().unwrap();
    overwrite(&vec![0; saved.len()], modified);
    let o = run(&first, &[]);
    assert!(
        o.status.success() && text(&o).contains(resumed),
        "{}",
        text(&o)
    );
    overwrite(&saved, modified);
    // Without the key log, or with files touched, held keys are compared, then skipped.
    std::fs::remove_file(ds.join("convert-keys.jsonl")).unwrap();
    let o = run(&first, &[]);
    assert!(
        o.status.success() && text(&o).contains(resumed),
        "{}",
        text(&o)
    );
    let copy = t.path().join("copy");
    std::fs::copy(&third, &copy).unwrap();
    std::fs::remove_file(&third).unwrap();
    std::fs::rename(&copy, &third).unwrap();
    let o = run(&first, &[]);
    assert!(
        o.status.success() && text(&o).contains(resumed),
        "{}",
        text(&o)
    );
    let o = run(&second, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert_eq!(Dataset::open(&ds).unwrap().len(), 3);
}

/// A stacked field whose first source `[1, 3, 12]` reads as 3 layers on an axis (1 token) and
/// as 3 concatenated layers (3 tokens) is refused, naming both readings; `stack=` settles it.
#[test]
fn an_ambiguous_stacked_field_asks_for_stack() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    let aux = (
        "aux",
        vec![1, 3, 12],
        Dtype::F32,
        common::bytes(1, 3 * 12 * 4),
    );
    write(&src.join("s0.safetensors"), vec![ids(3), aux]);
    let ds = t.path().join("ds");
    let run = |field: &str| {
        let a = ["convert", s(&src), s(&ds), "--layout", "generic", "-q"];
        hspack(&[&a[..], &["--field", "input_ids=ids", "--field", field]].concat())
    };
    let o = run("aux=aux:layers=1,2,3");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let msg = text(&o);
    assert!(
        msg.contains("s0.safetensors")
            && msg.contains("[T=1, 3 layers, H=12] (stack=axis)")
            && msg.contains("[T=3, 3 layers, H=4] (stack=concat)"),
        "{msg}"
    );
    assert!(Dataset::open(&ds).is_err());
    let o = run("aux=aux:layers=1,2,3:stack=concat");
    assert!(o.status.success(), "{}", text(&o));
    let d = Dataset::open(&ds).unwrap();
    let aux = d.schema().field_index("aux").unwrap();
    assert_eq!(d.schema().fields[aux].shape, [3, 4]);
    assert_eq!(d.sample(0).unwrap().rows(), 3);
}

/// A `--field` naming a tensor the first readable file lacks is the flag's fault: one error
/// with the closest name, exit 2, even with `--skip-bad` (which listed every file as bad).
#[test]
fn a_mistyped_field_tensor_is_a_flag_error() {
    let t = tempfile::tempdir().unwrap();
    let (src, ds) = (t.path().join("src"), t.path().join("ds"));
    common::dumps::write_dumps(&src, 0..3);
    let o = hspack(&[
        "convert",
        s(&src),
        s(&ds),
        "--layout",
        "generic",
        "--field",
        "input_ids=ids",
        "--field",
        "hidden.7=hh",
        "--skip-bad",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let msg = text(&o);
    assert!(
        msg.contains("needs tensor `hh`") && msg.contains("did you mean `h`?"),
        "{msg}"
    );
    assert_eq!(msg.matches("needs tensor").count(), 1, "{msg}");
    assert!(Dataset::open(&ds).is_err());
}

/// A source reached through a symbolic link, or with a second hard link: `--delete-source`
/// deleted the name it converted and the bytes stayed under the other, which the next run
/// converted again under another key (a sample twice, one under a wrong key). Refused, naming
/// the file, with nothing deleted.
#[test]
fn delete_source_refuses_a_source_with_another_name() {
    let t = tempfile::tempdir().unwrap();
    type Link = fn(&Path, &Path) -> std::io::Result<()>;
    let hard: Link = |a, b| std::fs::hard_link(a, b);
    let soft: Link = |a, b| std::os::unix::fs::symlink(a, b);
    // The walk takes each file once, under the first of its names: the link's here.
    for (link, make) in [
        ("req_009.safetensors", hard),
        ("req_000b.safetensors", soft),
    ] {
        let (src, ds) = (
            t.path().join(link).join("src"),
            t.path().join(link).join("ds"),
        );
        common::dumps::write_dumps(&src, 0..3);
        make(&src.join("req_001.safetensors"), &src.join(link)).unwrap();
        let before = files_in(&src);
        let o = common::dumps::convert_command(&src, &ds).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(
            text(&o).contains("symbolic link, or has other hard links"),
            "{}",
            text(&o)
        );
        assert_eq!(files_in(&src), before);
    }
}

/// A rerun with `--skip-bad` after `--delete-source` took the good files: the first file left
/// was a bad one (another hidden size), whose fields the run took for the dataset's, and it
/// stopped at the dataset's schema naming no file, converting none of the good files added
/// since. The bad ones are listed, the good ones converted.
#[test]
fn a_skip_bad_rerun_whose_first_file_is_of_another_kind_converts_the_rest() {
    let t = tempfile::tempdir().unwrap();
    let (src, ds) = (t.path().join("src"), t.path().join("ds"));
    let file = |i: usize, width: usize| {
        let h = common::bytes(i as u64, 4 * width * 4);
        write(
            &src.join(format!("req_{i:03}.safetensors")),
            vec![ids(4), ("h", vec![4, width], Dtype::F32, h)],
        )
    };
    for i in 0..3 {
        file(i, 8);
    }
    for i in 3..5 {
        file(i, 4);
    }
    let args = |extra: &'static [&'static str]| {
        let mut a = vec![
            "convert",
            s(&src),
            s(&ds),
            "--layout",
            "generic",
            "--field",
            "input_ids=ids",
            "--field",
            "hidden.7=h",
            "--delete-source",
            "--skip-bad",
            "-q",
        ];
        a.extend_from_slice(extra);
        a
    };
    let o = hspack(&args(&[]));
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    for i in 5..8 {
        file(i, 8);
    }
    let o = hspack(&args(&[]));
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert_eq!(Dataset::open(&ds).unwrap().len(), 6);
    assert_eq!(
        files_in(&src),
        ["req_003.safetensors", "req_004.safetensors"]
    );
    // Without --skip-bad, the first file of another kind is named, with what differs, once
    // a file of the dataset's kind shows the flags are the earlier runs'.
    file(11, 8);
    let plain = [
        "convert",
        s(&src),
        s(&ds),
        "--layout",
        "generic",
        "--field",
        "input_ids=ids",
        "--field",
        "hidden.7=h",
    ];
    let o = hspack(&plain);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("req_003.safetensors: its fields are not the dataset's"),
        "{}",
        text(&o)
    );
    // Flags other than the earlier runs' (every file then differs): said once, without
    // --skip-bad (with it, each file is listed with what differs).
    let o = hspack(&[
        "convert",
        s(&src),
        s(&ds),
        "--layout",
        "generic",
        "--field",
        "input_ids=ids",
        "--field",
        "hidden.9=h",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("the fields this run makes of the first 3 files are not the dataset's")
            && text(&o).contains("give the flags the runs that wrote it gave"),
        "{}",
        text(&o)
    );
}
