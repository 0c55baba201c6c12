//! The built `hspack` binary, run in temp folders.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::cli::{hspack_in, stderr, stdout, text};

fn demo(cwd: &Path) -> Output {
    hspack_in(
        &[
            "demo",
            "--out",
            "ds",
            "--samples",
            "5",
            "--min-tokens",
            "1",
            "--max-tokens",
            "40",
            "--hidden",
            "256",
        ],
        cwd,
    )
}

#[test]
fn demo_writes_verifies_and_reads_back() {
    let t = tempfile::tempdir().unwrap();
    let o = demo(t.path());
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    for step in [
        "write :",
        "verify:",
        "read  : every sample read back bit-identical",
        "random:",
    ] {
        assert!(out.contains(step), "missing {step}: {out}");
    }
    // Running it again replaces the earlier demo.
    assert!(demo(t.path()).status.success());
}

/// `cp` into a destination that holds another dataset is refused with what to do, and does
/// not also say that running it again would resume.
#[test]
fn a_refused_copy_does_not_say_to_rerun() {
    let t = tempfile::tempdir().unwrap();
    assert!(demo(t.path()).status.success());
    let o = hspack_in(
        &["demo", "--out", "other", "--samples", "2", "--hidden", "64"],
        t.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = hspack_in(&["cp", "ds", "other"], t.path());
    assert!(!o.status.success());
    assert!(text(&o).contains("holds another dataset"), "{}", text(&o));
    assert!(
        !text(&o).contains("again to resume") && !text(&o).contains("rerun"),
        "{}",
        text(&o)
    );
}

/// A temp folder holding a small demo dataset `a` and its copy `b` (`hspack cp a b`), and the
/// copy's path.
fn demo_copied() -> (tempfile::TempDir, std::path::PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let o = hspack_in(
        &["demo", "--out", "a", "--samples", "6", "--hidden", "64"],
        t.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(hspack_in(&["cp", "a", "b"], t.path()).status.success());
    let b = t.path().join("b");
    (t, b)
}

/// `cp` over a complete copy that lost a segment since restores it; over one whose listed
/// shard is damaged, it is refused with the `repair` command that mends it (a copy never
/// overwrites what the destination's manifest lists), which then works.
#[test]
fn cp_over_a_complete_copy_restores_a_lost_segment_and_points_a_damaged_shard_to_repair() {
    let (t, b) = demo_copied();
    let ds = hspack::Dataset::open(&b).unwrap();
    let segment = (ds.manifest().listed_files().iter())
        .map(|f| f.file.to_string())
        .find(|f| f.starts_with("segment-"))
        .unwrap();
    let shard = b.join(&ds.manifest().shards[0].file);
    drop(ds);
    std::fs::remove_file(b.join(&segment)).unwrap();
    let o = hspack_in(&["cp", "a", "b"], t.path());
    assert!(o.status.success(), "{}", text(&o));
    assert!(b.join(&segment).exists());
    let mut bytes = std::fs::read(&shard).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 1;
    std::fs::write(&shard, bytes).unwrap();
    let o = hspack_in(&["cp", "a", "b"], t.path());
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("damaged there") && text(&o).contains("hspack repair b --from a"),
        "{}",
        text(&o)
    );
    assert!(hspack_in(&["repair", "b", "--from", "a"], t.path())
        .status
        .success());
    assert!(hspack_in(&["verify", "b"], t.path()).status.success());
}

/// A shard `cp --no-reread` finds at the destination (a killed copy left it, then it was
/// damaged at rest) is read back before it counts as there and right: it is sent again, and
/// the copy verifies.
#[test]
fn cp_without_reread_reads_back_the_shards_it_finds() {
    let (t, b) = demo_copied();
    let ds = hspack::Dataset::open(&b).unwrap();
    let record = ds.manifest().shards[0].clone();
    let entry = ds.shard(0).unwrap().index().chunk(0).unwrap();
    drop(ds);
    // A payload byte flipped: the shard's size, footer and index are as they were.
    let shard = b.join(&record.file);
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[entry.offset as usize + hspack::format::ChunkHeader::SIZE] ^= 1;
    std::fs::write(&shard, bytes).unwrap();
    std::fs::remove_file(b.join("manifest.json")).unwrap();
    let o = hspack_in(&["cp", "--no-reread", "a", "b"], t.path());
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        stdout(&o).contains("1 shard sent") && stdout(&o).contains("0 shards already there"),
        "{}",
        text(&o)
    );
    let o = hspack_in(&["verify", "b"], t.path());
    assert!(o.status.success(), "{}", text(&o));
}

/// A copy onto its own source, however spelled (`.`, a trailing slash, a link), is refused
/// before anything is touched: it would send nothing and report a copy made.
#[test]
fn cp_and_sync_onto_the_source_itself_are_refused() {
    let (t, _b) = demo_copied();
    std::os::unix::fs::symlink(t.path().join("a"), t.path().join("link")).unwrap();
    for (verb, dst) in [
        ("cp", "a"),
        ("cp", "./a/"),
        ("sync", "link"),
        ("cp", "b/../a"),
    ] {
        let o = hspack_in(&[verb, "a", dst], t.path());
        assert_eq!(o.status.code(), Some(2), "{verb} a {dst}: {}", text(&o));
        assert!(
            stderr(&o).contains("it is the source itself"),
            "{verb} a {dst}: {}",
            text(&o)
        );
    }
    assert!(hspack_in(&["verify", "a"], t.path()).status.success());
}

/// A copy into a folder inside its source, or around it, is refused before anything is
/// made: it was made, and `verify` of the source then named the copy as a file not of the
/// dataset (and `rm -r` of the source removed the copy).
#[test]
fn a_copy_inside_its_source_or_around_it_is_refused() {
    let (t, _b) = demo_copied();
    for (verb, src, dst, said) in [
        ("cp", "a", "a/sub", "lies inside the source dataset"),
        ("sync", "a", "./a/x/y", "lies inside the source dataset"),
        (
            "cp",
            "a",
            "a/../b/../a/sub",
            "lies inside the source dataset",
        ),
    ] {
        let o = hspack_in(&[verb, src, dst], t.path());
        assert_eq!(o.status.code(), Some(2), "{verb} {src} {dst}: {}", text(&o));
        assert!(
            stderr(&o).contains(said),
            "{verb} {src} {dst}: {}",
            text(&o)
        );
    }
    std::fs::create_dir(t.path().join("outer")).unwrap();
    let o = hspack_in(&["cp", "a", "outer/in"], t.path());
    assert!(o.status.success(), "{}", text(&o));
    let o = hspack_in(&["cp", "outer/in", "outer"], t.path());
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        stderr(&o).contains("the source dataset lies inside it"),
        "{}",
        text(&o)
    );
    assert!(!t.path().join("outer/manifest.json").exists());
    let v = hspack_in(&["verify", "a"], t.path());
    assert!(
        v.status.success() && !text(&v).contains("NOTE"),
        "{}",
        text(&v)
    );
    assert_eq!(
        std::fs::read_dir(t.path().join("a"))
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_type().unwrap().is_dir())
            .count(),
        0
    );
}

/// `--jobs` past what a machine runs is refused at once, before anything is made: one thread
/// is started for each (`cp --jobs 10000` started thousands and ran for minutes), and 0 is
/// refused, not taken for 1. (Convert's, the same rule: `convert_cmd.rs`.)
#[test]
fn a_number_of_jobs_a_machine_cannot_run_is_refused_before_anything_is_made() {
    let (t, _b) = demo_copied();
    for (verb, jobs) in [("cp", "0"), ("cp", "10000"), ("sync", "99999999999")] {
        let o = hspack_in(&[verb, "a", "c", "--jobs", jobs], t.path());
        assert_eq!(
            o.status.code(),
            Some(2),
            "{verb} --jobs {jobs}: {}",
            text(&o)
        );
        assert!(
            stderr(&o).contains("give 1 to 4096"),
            "{verb} --jobs {jobs}: {}",
            text(&o)
        );
        assert!(!t.path().join("c").exists(), "{verb} --jobs {jobs}");
    }
    let o = hspack_in(&["cp", "a", "c", "--jobs", "3"], t.path());
    assert!(o.status.success(), "{}", text(&o));
}

/// A dataset a newer hspack wrote (its manifest of a higher version, holding what this one
/// cannot decode) is no damage: every command says to upgrade, exit 2, and none says to
/// restore the manifest or calls the dataset damaged.
#[test]
fn a_newer_manifest_says_upgrade_not_damaged() {
    let (t, b) = demo_copied();
    let path = b.join("manifest.json");
    let text_of = std::fs::read_to_string(&path).unwrap();
    let mut m: serde_json::Value = serde_json::from_str(&text_of).unwrap();
    m["version"] = serde_json::json!(99);
    m["schema"]["fields"][0]["dtype"] = serde_json::json!("fp4");
    std::fs::write(&path, serde_json::to_vec(&m).unwrap()).unwrap();
    for args in [
        &["verify", "b"][..],
        &["info", "b"],
        &["ls", "b"],
        &["digest", "b"],
        &["cp", "b", "c"],
    ] {
        let o = hspack_in(args, t.path());
        let said = text(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {said}");
        assert!(
            said.contains("format version 99") && said.contains("upgrade hspack"),
            "{args:?}: {said}"
        );
        assert!(
            !said.contains("DAMAGED") && !said.contains("restore") && !said.contains("damaged"),
            "{args:?}: {said}"
        );
    }
}

/// A version a shard's header does not know, under a manifest this build reads, is a flipped
/// bit: damage, which `repair` mends (it was taken for a newer hspack's, "not damage", and
/// repair refused).
#[test]
fn an_unknown_version_in_a_shard_is_damage_that_repair_mends() {
    let (t, b) = demo_copied();
    let shard = b.join(&hspack::Dataset::open(&b).unwrap().manifest().shards[0].file);
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[8] ^= 2; // the header's version word
    std::fs::write(&shard, bytes).unwrap();
    let o = hspack_in(&["verify", "b"], t.path());
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("DAMAGED"), "{}", text(&o));
    let o = hspack_in(&["repair", "b", "--from", "a"], t.path());
    assert!(o.status.success(), "{}", text(&o));
    assert!(hspack_in(&["verify", "b"], t.path()).status.success());
}

/// `digest` of several datasets does every one, whatever the others are, and exits with the
/// worst met; a dataset that lost a segment is damage (exit 1) to every command that opens
/// it, as to `verify`.
#[test]
fn digest_does_every_dataset_and_a_lost_segment_is_damage_everywhere() {
    let t = tempfile::tempdir().unwrap();
    let o = hspack_in(
        &["demo", "--out", "a", "--samples", "3", "--hidden", "64"],
        t.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = hspack_in(&["digest", "a", "nothing-here", "a"], t.path());
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert_eq!(stdout(&o).lines().count(), 2, "{}", text(&o));
    assert!(stderr(&o).contains("nothing-here"), "{}", text(&o));
    let ds = hspack::Dataset::open(t.path().join("a")).unwrap();
    let segment = (ds.manifest().listed_files().iter())
        .map(|f| f.file.to_string())
        .find(|f| f.starts_with("segment-"))
        .unwrap();
    drop(ds);
    std::fs::remove_file(t.path().join("a").join(&segment)).unwrap();
    for args in [
        &["verify", "a"][..],
        &["ls", "a"],
        &["info", "a"],
        &["show", "a", "#0"],
        &[
            "export",
            "a",
            "#0",
            "--to",
            "safetensors",
            "--out",
            "x.safetensors",
        ],
        &["compare", "a", "a"],
        &["digest", "a"],
    ] {
        let o = hspack_in(args, t.path());
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(&segment), "{args:?}: {}", text(&o));
    }
}

/// A file given where a folder goes: each command says it is a file and what to give, and
/// none says that running it again would help.
#[test]
fn a_file_given_for_a_folder_is_named_as_a_file() {
    let t = tempfile::tempdir().unwrap();
    let o = hspack_in(
        &["demo", "--out", "a", "--samples", "2", "--hidden", "64"],
        t.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    std::fs::write(t.path().join("notes.py"), "x = 1\n").unwrap();
    for args in [
        &["cp", "a", "notes.py"][..],
        &[
            "demo",
            "--out",
            "notes.py",
            "--samples",
            "2",
            "--hidden",
            "64",
        ],
        &["info", "notes.py"],
        // Into a file, or a folder under one (said as "cannot read
        // notes.py/convert-keys.jsonl: Not a directory").
        &["convert", "a", "notes.py", "--layout", "specforge"],
        &["cp", "a", "notes.py/copy"],
        &[
            "demo",
            "--out",
            "notes.py/d",
            "--samples",
            "2",
            "--hidden",
            "64",
        ],
    ] {
        let o = hspack_in(args, t.path());
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        let said = text(&o);
        assert!(
            said.contains("notes.py") && said.contains("is a file"),
            "{args:?}: {said}"
        );
        assert!(
            !said.contains("again") && !said.contains("os error"),
            "{args:?}: {said}"
        );
        assert!(!said.contains(": ?"), "{args:?}: {said}");
    }
    // A layer the demo's model does not have: refused before anything is written.
    let o = hspack_in(&["demo", "--out", "b", "--layers", "2,70"], t.path());
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("--layers 70: the demo's model has 61 layers"),
        "{}",
        text(&o)
    );
    assert!(!t.path().join("b").exists());
    // Sizes whose products overflowed (a panic, or an abort allocating them): refused first.
    for (args, said) in [
        (
            &["--hidden", "4611686018427387904"][..],
            "--hidden 4611686018427387904: the demo takes at most 65536",
        ),
        (
            &["--min-tokens", "1", "--max-tokens", "18446744073709551615"][..],
            "--max-tokens 18446744073709551615: the demo takes at most 1048576",
        ),
        // Samples of no tokens: the random-read line divided by them.
        (
            &["--min-tokens", "0", "--max-tokens", "0"][..],
            "need --samples >= 1 and 1 <= --min-tokens <= --max-tokens",
        ),
        (
            &["--samples", "9999999999"][..],
            "--samples 9999999999: the demo takes at most 1048576",
        ),
        // It said `option schema: ... row bytes is 0`; and --max-tokens alone under the
        // default --min-tokens did not say that default.
        (
            &["--hidden", "0"][..],
            "--hidden 0: a hidden state of no values; give 1 or more",
        ),
        (
            &["--max-tokens", "16"][..],
            "(given 24, 64 and 16; --min-tokens is 64 unless given)",
        ),
    ] {
        let o = hspack_in(&[&["demo", "--out", "b"][..], args].concat(), t.path());
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(
            text(&o).contains(said) && !text(&o).contains("panicked"),
            "{}",
            text(&o)
        );
        assert!(!t.path().join("b").exists());
    }
    let err = hspack::DatasetWriter::create(
        t.path().join("notes.py"),
        hspack::synth::capture_schema("m", 4, 8, &[1]),
        Default::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("it is a file"), "{err}");
    assert_eq!(
        std::fs::read_to_string(t.path().join("notes.py")).unwrap(),
        "x = 1\n"
    );
}

/// Replacing its earlier demo, the demo removes only the files named as a writer names its
/// own: files of the user's beside them, even named like a dataset's, stay.
#[test]
fn the_demo_replacing_its_own_keeps_the_users_files_beside_it() {
    let t = tempfile::tempdir().unwrap();
    assert!(demo(t.path()).status.success());
    let mine = [
        "samples_stats.parquet",
        "shard-000001-old.hsp",
        "segment-notes.json",
        "keys-mine.bin",
        "notes.txt",
    ];
    for name in mine {
        std::fs::write(t.path().join("ds").join(name), name).unwrap();
    }
    let o = demo(t.path());
    assert!(o.status.success(), "{}", text(&o));
    for name in mine {
        assert_eq!(
            std::fs::read_to_string(t.path().join("ds").join(name)).unwrap(),
            name
        );
    }
    assert_eq!(hspack::Dataset::open(t.path().join("ds")).unwrap().len(), 5);
}

/// The demo into a store's dataset (`STORE/NAME`) runs again over its earlier demo, and
/// says how to remove it from the store (it said `rm -r STORE/NAME`, a folder that is not
/// there, and a second run was refused as a dataset already there).
#[test]
fn the_demo_into_a_store_runs_again_and_says_how_to_remove_it() {
    let t = tempfile::tempdir().unwrap();
    assert!(hspack_in(&["store", "init", "st"], t.path())
        .status
        .success());
    let args = ["demo", "--out", "st/d", "--samples", "2", "--hidden", "64"];
    for _ in 0..2 {
        let o = hspack_in(&args, t.path());
        assert!(o.status.success(), "{}", text(&o));
        assert!(text(&o).contains("store rm st d`, then `"), "{}", text(&o));
    }
    assert_eq!(
        hspack::Dataset::open(t.path().join("st/d")).unwrap().len(),
        2
    );
    for args in [&["store", "rm", "st", "d"][..], &["store", "gc", "st"]] {
        let o = hspack_in(args, t.path());
        assert!(o.status.success(), "{}", text(&o));
    }
    assert!(hspack::Dataset::open(t.path().join("st/d")).is_err());
}

/// The demo replaces only its own earlier dataset: another dataset in `--out` is refused
/// and left whole.
#[test]
fn the_demo_refuses_to_replace_another_dataset() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("ds");
    let schema = hspack::synth::capture_schema("org/real-model", 61, 64, &[2, 30]);
    let mut w =
        hspack::DatasetWriter::create(&dir, schema, hspack::WriteOptions::default()).unwrap();
    let mut rng = hspack::synth::Rng::new(1);
    let scales = vec![hspack::synth::channel_scales(&mut rng, 64); 2];
    let sample = hspack::synth::named_capture_sample(&mut rng, 3, &[2, 30], &scales);
    let fields: Vec<(&str, &[u8])> = sample.iter().map(|(n, b)| (n.as_str(), &b[..])).collect();
    w.append("mine", &fields).unwrap();
    w.finish().unwrap();
    let before = std::fs::read(dir.join("manifest.json")).unwrap();
    let o = demo(t.path());
    assert!(!o.status.success());
    assert!(
        text(&o).contains(
            "holds a dataset the demo did not write (a dataset of model `org/real-model`)"
        ),
        "{}",
        text(&o)
    );
    assert_eq!(std::fs::read(dir.join("manifest.json")).unwrap(), before);
    let ds = hspack::Dataset::open(&dir).unwrap();
    assert_eq!(ds.sample(0).unwrap().key(), "mine");
}

#[test]
fn info_ls_show_and_export() {
    let t = tempfile::tempdir().unwrap();
    assert!(demo(t.path()).status.success());
    let o = hspack_in(&["info", "ds", "--json"], t.path());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["samples"], 5);
    assert_eq!(v["schema"]["fields"][2]["role"]["point"], "layer_input");
    let o = hspack_in(&["ls", "ds", "--json"], t.path());
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 5);
    assert_eq!(lines[3]["key"], "demo-00003");
    let o = hspack_in(&["show", "ds", "demo-00001", "--json"], t.path());
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["fields"][2]["name"], "hidden.2");
    let o = hspack_in(
        &[
            "export",
            "ds",
            "demo-00001",
            "--to",
            "safetensors",
            "--out",
            "s.safetensors",
        ],
        t.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    let st = std::fs::read(t.path().join("s.safetensors")).unwrap();
    let n = u64::from_le_bytes(st[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&st[8..8 + n]).unwrap();
    assert_eq!(header["hidden.58"]["dtype"], "BF16");
    let o = hspack_in(
        &[
            "export",
            "ds",
            "#2",
            "--to",
            "npy",
            "--out",
            "npy",
            "--fields",
            "input_ids,hidden.2",
        ],
        t.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    let npy = std::fs::read(t.path().join("npy/hidden.2.npy")).unwrap();
    assert!(npy.starts_with(b"\x93NUMPY"));
    assert!(String::from_utf8_lossy(&npy[..128]).contains("'descr': '<u2'"));
    // bf16 as its raw bits is said, with how to view it; int32 needs no note.
    assert!(
        text(&o).contains("hidden.2.npy: bf16 stored as its raw bits (uint16: numpy has no bf16)")
            && text(&o).contains("view it as bf16 with ml_dtypes")
            && text(&o).contains("torch.from_numpy(a).view(torch.bfloat16)")
            && !text(&o).contains("input_ids.npy:"),
        "{}",
        text(&o)
    );
    assert!(!t.path().join("npy/loss_mask.npy").exists());
    // A field named twice: refused, not a panic in the writer.
    let o = hspack_in(
        &[
            "export",
            "ds",
            "#0",
            "--to",
            "safetensors",
            "--out",
            "twice.safetensors",
            "--fields",
            "hidden.2,hidden.2",
        ],
        t.path(),
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("names `hidden.2` twice"), "{}", text(&o));
    let o = hspack_in(&["show", "ds", "no-such-key"], t.path());
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("no sample has key `no-such-key`"));
    // A number that is no key: how to ask for an ordinal.
    let o = hspack_in(&["show", "ds", "3"], t.path());
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("write '#3'") && text(&o).contains("no sample has key `3`"),
        "{}",
        text(&o)
    );
    // No sample named: each way to name one, not a `<KEY>` called required (the usage says
    // `[KEY]`, and `--ordinal N` alone is enough).
    for args in [
        &["show", "ds"][..],
        &["export", "ds", "--to", "npy", "-o", "x"],
    ] {
        let o = hspack_in(args, t.path());
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(
            text(&o).contains("name the sample: its key, '#N'")
                && text(&o).contains("--ordinal N")
                && !text(&o).contains("<KEY>"),
            "{}",
            text(&o)
        );
    }
    assert!(hspack_in(&["export", "--help"], t.path()).status.success());
    let usage = stdout(&hspack_in(&["export", "--help"], t.path()));
    assert!(usage.contains("<DIR> [KEY]"), "{usage}");
}

#[test]
fn verify_and_digest_exit_codes_name_the_damage() {
    let t = tempfile::tempdir().unwrap();
    assert!(demo(t.path()).status.success());
    let o = hspack_in(&["verify", "ds"], t.path());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // A copy has the same digest.
    std::fs::create_dir(t.path().join("copy")).unwrap();
    for e in std::fs::read_dir(t.path().join("ds")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), t.path().join("copy").join(e.file_name())).unwrap();
    }
    let a = hspack_in(&["digest", "ds"], t.path());
    let b = hspack_in(&["digest", "copy"], t.path());
    let first = |o: &Output| {
        String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    assert_eq!(first(&a), first(&b));
    assert_eq!(first(&a).len(), 64);
    // Damage the copy: verify exits 1 naming the sample, digest refuses.
    let shard = t.path().join("copy/shard-000000.hsp");
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[4096 + 1] ^= 1; // the first payload: input_ids of sample 0
    std::fs::write(&shard, bytes).unwrap();
    let o = hspack_in(&["verify", "copy", "--json"], t.path());
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], false);
    assert!(
        v["problems"][0].as_str().unwrap().contains("demo-00000"),
        "{v}"
    );
    assert_eq!(
        hspack_in(&["digest", "copy"], t.path()).status.code(),
        Some(1)
    );
    // Quick verify does not read payloads.
    assert_eq!(
        hspack_in(&["verify", "copy", "--quick"], t.path())
            .status
            .code(),
        Some(0)
    );
    // Not a dataset: exit 2 with a hint.
    let o = hspack_in(&["verify", "nowhere"], t.path());
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("nowhere is not an hspack dataset: there is nothing there"),
        "{}",
        text(&o)
    );
    // A file (the manifest itself), and a store: each said, with what to give instead.
    let o = hspack_in(&["info", "copy/manifest.json"], t.path());
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("it is a file; give the dataset's folder"),
        "{}",
        text(&o)
    );
    assert!(hspack_in(&["store", "init", "st"], t.path())
        .status
        .success());
    let o = hspack_in(&["info", "st"], t.path());
    assert!(
        text(&o).contains("it is a store of datasets: name one as st/NAME"),
        "{}",
        text(&o)
    );
}

/// Every file under `dir`, relative to it.
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push(p.strip_prefix(dir).unwrap().to_path_buf());
            }
        }
    }
    out.sort();
    out
}

/// An `--out` in a folder that is not there names that folder, not the temporary file that
/// export writes first.
#[test]
fn export_into_a_folder_that_is_not_there_names_the_folder() {
    let t = tempfile::tempdir().unwrap();
    assert!(demo(t.path()).status.success());
    let o = hspack_in(
        &[
            "export",
            "ds",
            "#0",
            "--to",
            "safetensors",
            "--out",
            "nofolder/x.safetensors",
        ],
        t.path(),
    );
    assert!(!o.status.success(), "{}", text(&o));
    let e = stderr(&o);
    assert!(
        e.contains("there is no folder nofolder") && e.contains("mkdir -p") && !e.contains(".tmp"),
        "{e}"
    );
    assert!(!t.path().join("nofolder").exists());
}

#[test]
fn export_refuses_a_field_name_that_leaves_the_output_folder() {
    use hspack::format::manifest::{hex, MANIFEST_FILE};
    use hspack::format::schema::FIELD_NAME_RULE;
    use hspack::format::Manifest;

    let t = tempfile::tempdir().unwrap();
    assert!(demo(t.path()).status.success());
    let path = t.path().join("ds").join(MANIFEST_FILE);
    let original = std::fs::read(&path).unwrap();
    let absolute = t.path().join("abs/PWN").to_string_lossy().into_owned();
    for hostile in ["../../PWN", absolute.as_str()] {
        // The writer refuses such a name, so edit a real manifest: everything else stays
        // consistent (schema hash included), only the naming rule stands in the way.
        let mut m = Manifest::decode(&original).unwrap();
        m.schema.fields[0].name = hostile.to_string();
        m.schema_blake3 = hex(&m.schema.hash());
        std::fs::write(&path, m.encode()).unwrap();
        let before = files_under(t.path());
        let o = hspack_in(
            &["export", "ds", "#0", "--to", "npy", "--out", "a/b/out"],
            t.path(),
        );
        // A manifest that fails its checks is damage, exit 1, as `verify` says.
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        let e = text(&o);
        assert!(e.contains(&format!("{hostile:?}")), "{e}");
        assert!(e.contains(FIELD_NAME_RULE), "{e}");
        assert_eq!(files_under(t.path()), before, "export wrote files");
        assert!(!t.path().join("a").exists());
    }
}

#[test]
fn info_refuses_shard_sizes_that_add_up_past_2_64() {
    let t = tempfile::tempdir().unwrap();
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("format-spec/golden/v1/none");
    let ds = t.path().join("ds");
    common::copy_dir(&golden, &ds);
    let o = hspack_in(&["info", "ds", "--json"], t.path());
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let bytes = v["bytes"].as_u64().unwrap();
    assert!(bytes > 0);
    let mut m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ds.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(m["shards"].as_array().unwrap().len(), 2);
    for field in ["bytes", "raw_bytes"] {
        let mut bad = m.clone();
        bad["shards"][0][field] = u64::MAX.into();
        std::fs::write(ds.join("manifest.json"), serde_json::to_vec(&bad).unwrap()).unwrap();
        for args in [&["info", "ds"][..], &["info", "ds", "--json"]] {
            let o = hspack_in(args, t.path());
            assert_eq!(o.status.code(), Some(1), "{}", text(&o));
            let e = text(&o);
            assert!(e.contains(&format!("shard {field} is {}", u64::MAX)), "{e}");
            assert!(e.contains("below 2^64"), "{e}");
            assert!(!e.contains("MiB"), "{e}");
        }
    }
    // A size that fits is still printed.
    m["shards"][0]["bytes"] = (u64::MAX - bytes).into();
    std::fs::write(ds.join("manifest.json"), serde_json::to_vec(&m).unwrap()).unwrap();
    let o = hspack_in(&["info", "ds", "--json"], t.path());
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["bytes"].as_u64().unwrap() > u64::MAX - bytes);
}

#[test]
fn reindex_rewrites_a_lost_or_damaged_table_part_or_key_run() {
    let t = tempfile::tempdir().unwrap();
    assert!(demo(t.path()).status.success());
    let info: serde_json::Value =
        serde_json::from_slice(&hspack_in(&["info", "ds", "--json"], t.path()).stdout).unwrap();
    let part = info["table_files"][0].as_str().unwrap().to_string();
    let run = std::fs::read_dir(t.path().join("ds"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("keys-"))
        .unwrap();
    let digest = text(&hspack_in(&["digest", "ds"], t.path()));
    for name in [part, run] {
        let file = t.path().join("ds").join(&name);
        let good = std::fs::read(&file).unwrap();
        for damage in ["flip", "remove"] {
            match damage {
                "flip" => {
                    let mut bad = good.clone();
                    bad[good.len() / 2] ^= 1;
                    std::fs::write(&file, bad).unwrap();
                }
                _ => std::fs::remove_file(&file).unwrap(),
            }
            let o = hspack_in(&["verify", "ds"], t.path());
            assert_eq!(o.status.code(), Some(1), "{name} {damage}: {}", text(&o));
            assert!(text(&o).contains("hspack reindex"), "{}", text(&o));
            assert!(text(&o).contains(&name), "{}", text(&o));
            let o = hspack_in(&["reindex", "ds"], t.path());
            assert!(o.status.success(), "{}", text(&o));
            assert!(text(&o).contains(&name), "{}", text(&o));
            let o = hspack_in(&["verify", "ds"], t.path());
            assert_eq!(o.status.code(), Some(0), "{name} {damage}: {}", text(&o));
            assert_eq!(std::fs::read(&file).unwrap(), good, "the same file again");
            assert_eq!(text(&hspack_in(&["digest", "ds"], t.path())), digest);
        }
    }
    let o = hspack_in(&["reindex", "ds"], t.path());
    assert!(text(&o).contains("nothing rewritten"), "{}", text(&o));
}

#[test]
fn export_of_a_damaged_sample_exits_1_as_verify_does() {
    let t = tempfile::tempdir().unwrap();
    assert!(demo(t.path()).status.success());
    let shard = t.path().join("ds/shard-000000.hsp");
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[4096 + 1] ^= 1; // the first payload: input_ids of sample 0
    std::fs::write(&shard, bytes).unwrap();
    assert_eq!(
        hspack_in(&["verify", "ds"], t.path()).status.code(),
        Some(1)
    );
    for to in ["npy", "safetensors"] {
        let o = hspack_in(
            &["export", "ds", "#0", "--to", to, "--out", "out"],
            t.path(),
        );
        assert_eq!(o.status.code(), Some(1), "{to}: {}", text(&o));
        assert!(text(&o).contains("demo-00000"), "{}", text(&o));
        assert!(text(&o).contains("hspack verify"), "{}", text(&o));
    }
    // Errors that are not damage stay exit 2.
    let o = hspack_in(
        &["export", "ds", "no-such-key", "--to", "npy", "--out", "out"],
        t.path(),
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    // An intact sample of the damaged dataset exports.
    let o = hspack_in(
        &["export", "ds", "#1", "--to", "npy", "--out", "out1"],
        t.path(),
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // `show` reads the same way.
    let o = hspack_in(&["show", "ds", "#0"], t.path());
    assert_eq!(o.status.code(), Some(1), "show: {}", text(&o));
    assert!(text(&o).contains("hspack verify"), "{}", text(&o));
    assert_eq!(
        hspack_in(&["show", "ds", "no-such-key"], t.path())
            .status
            .code(),
        Some(2)
    );
    assert_eq!(
        hspack_in(&["show", "ds", "#1"], t.path()).status.code(),
        Some(0)
    );
}

/// The commands between backticks on the demo's `next  :` line.
fn suggested_commands(out: &str) -> Vec<String> {
    let line = out
        .lines()
        .find(|l| l.starts_with("next  :"))
        .unwrap_or_else(|| panic!("no `next  :` line: {out}"));
    line.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

#[test]
fn demo_says_where_it_writes_and_suggests_commands_that_run() {
    let t = tempfile::tempdir().unwrap();
    let o = demo(t.path());
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    let first = out.lines().take(2).collect::<Vec<_>>().join("\n");
    let folder = std::path::absolute(t.path().join("ds")).unwrap();
    assert!(
        first.contains("writing ") && first.contains(&folder.display().to_string()),
        "the first lines say neither the size nor the folder: {first}"
    );
    let commands = suggested_commands(&out);
    assert_eq!(commands.len(), 3, "{out}");
    for command in commands {
        // A shell without the binary's folder on PATH, as a newcomer's after `cargo run`.
        let o = Command::new("sh")
            .args(["-c", &command])
            .env("PATH", "/usr/bin:/bin")
            .current_dir(t.path())
            .output()
            .unwrap();
        assert!(o.status.success(), "`{command}` failed: {}", text(&o));
    }
    // With the binary first on PATH (after `cargo install`), its plain name.
    let bin = t.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_hspack"), bin.join("hspack")).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_hspack"))
        .args(["demo", "--out", "ds", "--samples", "2", "--hidden", "64"])
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .current_dir(t.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        suggested_commands(&text(&o)),
        ["hspack info ds", "hspack ls ds", "hspack verify ds"]
    );
}

#[test]
fn the_demo_folder_is_git_ignored() {
    let t = tempfile::tempdir().unwrap();
    let help = String::from_utf8(hspack_in(&["demo", "--help"], t.path()).stdout).unwrap();
    let out = help
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("--out"))
        .find_map(|l| l.split("[default: ").nth(1))
        .and_then(|d| d.split(']').next())
        .unwrap_or_else(|| panic!("no default for --out: {help}"))
        .to_string();
    let o = Command::new("git")
        .args(["check-ignore", "--no-index", "-q", &out])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(o.status.success(), "`{out}` is not in .gitignore");
}

#[test]
fn human_output_reads_as_prose() {
    let t = tempfile::tempdir().unwrap();
    let o = hspack_in(
        &[
            "demo",
            "--out",
            "ds",
            "--samples",
            "1",
            "--min-tokens",
            "1",
            "--max-tokens",
            "1",
            "--hidden",
            "64",
        ],
        t.path(),
    );
    let demo = text(&o);
    assert!(o.status.success(), "{demo}");
    assert!(demo.contains("write : 1 sample, 1 shard,"), "{demo}");
    let o = hspack_in(&["info", "ds"], t.path());
    let info = text(&o);
    assert!(o.status.success(), "{info}");
    assert_eq!(info.matches("61 layers").count(), 1, "{info}");
    for line in [
        "token ids",
        "loss mask",
        "hidden state, layer 2 input",
        "hidden state, layer 60 input",
    ] {
        assert!(info.contains(line), "missing `{line}`: {info}");
    }
    let o = hspack_in(&["show", "ds", "demo-00000"], t.path());
    let show = text(&o);
    assert!(o.status.success(), "{show}");
    assert!(show.contains(": 1 token, "), "{show}");
    assert!(
        show.contains("1 loss token\n") || show.contains("0 loss tokens\n"),
        "{show}"
    );
    let o = hspack_in(&["ls", "ds"], t.path());
    let ls = text(&o);
    assert!(o.status.success(), "{ls}");
    for output in [&demo, &info, &show, &ls] {
        for debug in [
            "Some(",
            "None",
            "HiddenState",
            "TokenIds",
            "LayerInput",
            " 1 samples",
            " 1 shards",
            " 1 tokens",
        ] {
            assert!(!output.contains(debug), "`{debug}` in {output}");
        }
    }
}

#[test]
fn a_manifest_edited_by_hand_is_damage_and_a_missing_folder_an_error() {
    let t = tempfile::tempdir().unwrap();
    assert!(demo(t.path()).status.success());
    let manifest = t.path().join("ds/manifest.json");
    let mut m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    m["samples"] = serde_json::json!(m["samples"].as_u64().unwrap() + 1);
    std::fs::write(&manifest, serde_json::to_vec(&m).unwrap()).unwrap();
    for args in [
        &["verify", "ds"][..],
        &["verify", "--quick", "ds"],
        &["digest", "ds"],
    ] {
        let o = hspack_in(args, t.path());
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", text(&o));
        assert_eq!(text(&o).matches("DAMAGED").count(), 1, "{}", text(&o));
        assert_eq!(
            text(&o).matches("samples").count(),
            1,
            "said once: {}",
            text(&o)
        );
    }
    let o = hspack_in(&["verify", "--json", "ds"], t.path());
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], false);
    let o = hspack_in(&["verify", "no-such-folder"], t.path());
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

/// What a new user gets wrong first gets an error saying the next step: `merge` with too few
/// paths, `info` on a folder of dumps, `convert` into a folder of other files, a layer id the
/// model has not, and a bare tensor where a layout wants a dict.
#[test]
fn first_mistakes_name_the_next_step() {
    let t = tempfile::tempdir().unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pt");
    let refused = |args: &[&str], want: &[&str]| {
        let o = hspack_in(args, t.path());
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        let said = text(&o);
        for w in want {
            assert!(said.contains(w), "{args:?}: wanted {w:?} in {said}");
        }
    };
    refused(&["merge", "a", "b"], &["two or more datasets", "(2 given)"]);

    let dumps = t.path().join("dumps");
    std::fs::create_dir_all(dumps.join("rows_0")).unwrap();
    std::fs::copy(
        fixtures.join("specforge.ckpt"),
        dumps.join("rows_0/data_0.ckpt"),
    )
    .unwrap();
    refused(
        &["info", "dumps"],
        &[
            "holds files to convert",
            "rows_0/data_0.ckpt",
            "hspack convert dumps OUT",
        ],
    );

    // A folder of datasets (it was said to hold files to convert, a key run's `.bin`).
    for name in ["many/sm_b", "many/sm_a"] {
        let o = hspack_in(
            &["demo", "--out", name, "--samples", "1", "--hidden", "64"],
            t.path(),
        );
        assert!(o.status.success(), "{}", text(&o));
    }
    refused(
        &["info", "many"],
        &["it is a folder of datasets (sm_a, sm_b): give one of them, as many/sm_a"],
    );

    let occupied = t.path().join("occupied");
    std::fs::create_dir_all(&occupied).unwrap();
    std::fs::write(occupied.join("notes.txt"), "mine\n").unwrap();
    let convert = |dst: &str, extra: &[&str]| {
        let mut args = vec!["convert", "dumps", dst, "--layout", "specforge"];
        args.extend_from_slice(extra);
        args.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let args = convert(
        "occupied",
        &["--layers", "2,30,58,61", "--num-layers", "61"],
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    refused(&args, &["notes.txt", "give a new or empty folder"]);
    assert_eq!(
        std::fs::read_dir(&occupied).unwrap().count(),
        1,
        "nothing written beside notes.txt"
    );
    // What a run killed before its first commit leaves (temp files), and a volume's
    // lost+found, are no other files: the run goes on there.
    let left = t.path().join("left");
    std::fs::create_dir_all(left.join("lost+found")).unwrap();
    std::fs::write(
        left.join("shard-000000.hsp.tmp"),
        b"a shard of a killed run",
    )
    .unwrap();
    std::fs::write(left.join("convert-keys.jsonl"), b"").unwrap();
    let args = convert("left", &["--layers", "2,30,58,61", "--num-layers", "61"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = hspack_in(&args, t.path());
    assert!(o.status.success(), "{}", text(&o));
    assert!(hspack_in(&["verify", "left"], t.path()).status.success());

    let args = convert(
        "bad_layers",
        &[
            "--layers",
            "2,30,58,61",
            "--num-layers",
            "61",
            "--point",
            "layer-input",
        ],
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    refused(
        &args,
        &[
            "--layers 61 with --point layer-input",
            "layers 0 to 60",
            "final-norm",
        ],
    );

    // A tensor name one letter off, in the generic layout: the closest name, and no advice
    // to use the generic layout.
    let args = convert("typo", &["--layers", "2,30,58,61"]);
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    args.truncate(4);
    args.extend(["generic", "--field", "hidden.61=hidden_states"]);
    refused(
        &args,
        &[
            "did you mean `hidden_state`?",
            "name a tensor the file has in --field",
        ],
    );
    let said = text(&hspack_in(&args, t.path()));
    assert!(!said.contains("--layout generic --field"), "{said}");

    let bare = t.path().join("bare");
    std::fs::create_dir_all(&bare).unwrap();
    std::fs::copy(fixtures.join("bare_tensor.pt"), bare.join("data_0.ckpt")).unwrap();
    refused(
        &[
            "convert",
            "bare",
            "bare_ds",
            "--layout",
            "specforge",
            "--layers",
            "2,30,58,61",
        ],
        &["a bare tensor (not a dict of named ones)"],
    );
}

/// `export` writes no file over another: a file there is refused (replaced with --force, by a
/// new file renamed over it), and a path inside the dataset's folder always, so the shard it
/// reads from is never cut short under it (that died of SIGBUS and lost the shard) nor the
/// manifest replaced. A field safetensors cannot name is refused, not written unreadable.
#[test]
fn export_writes_over_no_file_and_never_into_the_dataset() {
    let t = tempfile::tempdir().unwrap();
    assert!(demo(t.path()).status.success());
    let ds = t.path().join("ds");
    let before = files_under(&ds);
    let bytes = |p: &str| std::fs::read(ds.join(p)).unwrap();
    let (shard, manifest) = (bytes("shard-000000.hsp"), bytes("manifest.json"));
    for to in ["safetensors", "npy"] {
        for out in [
            "ds/shard-000000.hsp",
            "ds/manifest.json",
            "ds",
            "ds/new/x",
            "./ds/../ds/y",
        ] {
            let o = hspack_in(
                &["export", "ds", "#0", "--to", to, "--out", out, "--force"],
                t.path(),
            );
            assert_eq!(o.status.code(), Some(2), "{to} {out}: {}", text(&o));
            assert!(
                text(&o).contains("inside the dataset's folder"),
                "{}",
                text(&o)
            );
        }
    }
    assert_eq!(files_under(&ds), before);
    assert_eq!(bytes("shard-000000.hsp"), shard);
    assert_eq!(bytes("manifest.json"), manifest);
    assert_eq!(
        hspack_in(&["verify", "ds"], t.path()).status.code(),
        Some(0)
    );

    let mine = t.path().join("mine.st");
    std::fs::write(&mine, "precious").unwrap();
    let export = |to: &str, out: &str, force: bool| {
        let mut args = vec!["export", "ds", "#0", "--to", to, "--out", out];
        args.extend(force.then_some("--force"));
        hspack_in(&args, t.path())
    };
    let o = export("safetensors", "mine.st", false);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("exists") && text(&o).contains("--force"),
        "{}",
        text(&o)
    );
    assert_eq!(std::fs::read(&mine).unwrap(), b"precious");
    let o = export("safetensors", "mine.st", true);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let st = std::fs::read(&mine).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&st).unwrap();
    assert!(tensors.tensor("input_ids").is_ok());
    // Into a folder: every file checked before any is written.
    assert_eq!(export("npy", "npy", false).status.code(), Some(0));
    let written = files_under(&t.path().join("npy"));
    std::fs::remove_file(t.path().join("npy/input_ids.npy")).unwrap();
    let o = export("npy", "npy", false);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        !t.path().join("npy/input_ids.npy").exists(),
        "wrote before refusing"
    );
    assert_eq!(export("npy", "npy", true).status.code(), Some(0));
    assert_eq!(
        files_under(&t.path().join("npy")),
        written,
        "temp files left"
    );
    assert!(!files_under(t.path())
        .iter()
        .any(|f| f.to_string_lossy().contains(".tmp")));
}

/// A field named as safetensors names its metadata cannot be a tensor there: refused, with
/// `--to npy` as the way; nothing written.
#[test]
fn export_refuses_a_field_safetensors_cannot_name() {
    use hspack::{DType, DatasetWriter, Field, Role, Schema, WriteOptions};
    let t = tempfile::tempdir().unwrap();
    let schema = Schema::new(vec![
        Field::new("input_ids", DType::I32, &[], Role::TokenIds),
        Field::new("__metadata__", DType::F32, &[2], Role::Other),
    ]);
    let mut w =
        DatasetWriter::create(t.path().join("ds"), schema, WriteOptions::default()).unwrap();
    w.append(
        "k",
        &[
            ("input_ids", &[0u8; 4][..]),
            ("__metadata__", &[0u8; 8][..]),
        ],
    )
    .unwrap();
    w.finish().unwrap();
    let o = hspack_in(
        &["export", "ds", "k", "--to", "safetensors", "--out", "k.st"],
        t.path(),
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--to npy"), "{}", text(&o));
    assert!(!t.path().join("k.st").exists());
    let o = hspack_in(
        &["export", "ds", "k", "--to", "npy", "--out", "k"],
        t.path(),
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

/// A schema of token ids alone: samples of a few bytes, for tests of what commands say.
fn ids_only() -> hspack::Schema {
    use hspack::{DType, Field, Role};
    hspack::Schema::new(vec![Field::new(
        "input_ids",
        DType::I32,
        &[],
        Role::TokenIds,
    )])
}

/// `#N` names the sample at ordinal N; where a sample is keyed `#N` too, it names two, and is
/// refused saying how to name each: it silently read the other one.
#[test]
fn an_ordinal_that_is_also_a_key_is_refused_naming_both() {
    use hspack::{DatasetWriter, WriteOptions};
    let t = tempfile::tempdir().unwrap();
    let schema = ids_only();
    let mut w =
        DatasetWriter::create(t.path().join("ds"), schema, WriteOptions::default()).unwrap();
    for (key, tokens) in [("#2", 1), ("x", 2), ("y", 3)] {
        w.append(key, &[("input_ids", &vec![0u8; 4 * tokens][..])])
            .unwrap();
    }
    w.finish().unwrap();
    let show = |key: &str| hspack_in(&["show", "ds", key], t.path());
    let o = show("#2");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("names two samples") && text(&o).contains("--ordinal 2 or --ordinal 0"),
        "{}",
        text(&o)
    );
    // --ordinal names each sample whatever the keys are (keys like each other's ordinals
    // made every '#N' ambiguous), and is refused beside a key.
    for (ordinal, key) in [("2", "`y`"), ("0", "`#2`")] {
        let o = hspack_in(&["show", "ds", "--ordinal", ordinal], t.path());
        assert_eq!(o.status.code(), Some(0), "{ordinal}: {}", text(&o));
        assert!(text(&o).contains(key), "{ordinal}: {}", text(&o));
    }
    let o = hspack_in(&["show", "ds", "y", "--ordinal", "1"], t.path());
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    for (key, said) in [("#0", "`#2`"), ("#1", "`x`"), ("y", "`y`")] {
        let o = show(key);
        assert_eq!(o.status.code(), Some(0), "{key}: {}", text(&o));
        assert!(text(&o).contains(said), "{key}: {}", text(&o));
    }
    let o = show("1");
    assert!(text(&o).contains("write '#1' (quoted"), "{}", text(&o));
}

/// `reindex` leaves a dataset of an earlier version whose table is intact as it is (it made
/// it version 4: a new digest, and `repair` then refused its copies); a damaged table is
/// written anew, saying that the version and digest changed.
#[test]
fn reindex_leaves_an_intact_earlier_version_as_it_is() {
    let t = tempfile::tempdir().unwrap();
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("format-spec/golden/v1/none");
    let ds = t.path().join("ds");
    common::copy_dir(&golden, &ds);
    let files = |dir: &Path| -> Vec<(std::ffi::OsString, Vec<u8>)> {
        let mut f: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.file_name(), std::fs::read(e.path()).unwrap())
            })
            .collect();
        f.sort();
        f
    };
    let before = files(&ds);
    let digest = text(&hspack_in(&["digest", "ds"], t.path()));
    let o = hspack_in(&["reindex", "ds"], t.path());
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("nothing rewritten"), "{}", text(&o));
    assert!(files(&ds) == before, "reindex changed files");
    assert_eq!(text(&hspack_in(&["digest", "ds"], t.path())), digest);
    // A damaged table is rewritten, and the new version said.
    let table = ds.join("samples.parquet");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&table, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut bytes = std::fs::read(&table).unwrap();
    bytes[10] ^= 1;
    std::fs::write(&table, bytes).unwrap();
    let o = hspack_in(&["reindex", "ds"], t.path());
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("made format version 4 (from 1)"),
        "{}",
        text(&o)
    );
    // It names the files it wrote (it named the old table, which no manifest listed then),
    // and the old table goes (verify called it a leftover).
    assert!(
        text(&o).contains("samples-000000-000001.parquet") && !table.exists(),
        "{}",
        text(&o)
    );
    let o = hspack_in(&["verify", "ds"], t.path());
    assert_eq!(o.status.code(), Some(0));
    assert!(!text(&o).contains("not in the manifest"), "{}", text(&o));
}

/// A URL with a slash missing (`s3:/bucket/ds`) is refused, not taken for a folder named
/// `s3:` (a copy to it wrote the whole dataset here, and said it had copied it).
#[test]
fn a_url_with_a_slash_missing_is_refused_not_written_as_a_folder() {
    let t = tempfile::tempdir().unwrap();
    assert!(demo(t.path()).status.success());
    for to in [
        "s3:/bucket/ds",
        "s3:bucket/ds",
        "gs:/b/ds",
        "HTTPS:/host/ds",
    ] {
        let o = hspack_in(&["cp", "ds", to], t.path());
        assert_eq!(o.status.code(), Some(2), "{to}: {}", text(&o));
        assert!(text(&o).contains("two slashes"), "{}", text(&o));
    }
    let o = hspack_in(&["info", "s3:/bucket/ds"], t.path());
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert_eq!(
        files_under(t.path())
            .iter()
            .filter(|p| p.starts_with("s3:") || p.starts_with("gs:"))
            .count(),
        0
    );
    // Written as a folder, it is one.
    let o = hspack_in(&["cp", "ds", "./s3:/b"], t.path());
    assert!(o.status.success(), "{}", text(&o));
}

/// What a new user points a command at by mistake is named with what to do: a dump file (to
/// convert), and a folder an interrupted copy left shards in (run the copy again).
#[test]
fn a_dump_file_and_an_interrupted_copy_are_said_with_what_to_do() {
    let t = tempfile::tempdir().unwrap();
    std::fs::write(t.path().join("x.pt"), b"PK").unwrap();
    let o = hspack_in(&["info", "x.pt"], t.path());
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("hspack convert . OUT"), "{}", text(&o));
    std::fs::create_dir(t.path().join("copy")).unwrap();
    std::fs::write(t.path().join("copy/shard-000000.hsp.tmp"), b"").unwrap();
    let o = hspack_in(&["info", "copy"], t.path());
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("running it again resumes"),
        "{}",
        text(&o)
    );
}

/// `sync` onto a copy that was written to after it parted from the source is refused, saying
/// the two diverged and where (it said "another dataset", giving two equal ids).
#[test]
fn a_sync_onto_a_copy_that_diverged_says_so() {
    use hspack::{Dataset, DatasetWriter, WriteOptions};
    let t = tempfile::tempdir().unwrap();
    let schema = ids_only();
    let append = |dir: &str, key: &str, create: bool| {
        let path = t.path().join(dir);
        let mut w = match create {
            true => DatasetWriter::create(path, schema.clone(), WriteOptions::default()),
            false => DatasetWriter::open(path, schema.clone(), WriteOptions::default()),
        }
        .unwrap();
        w.append(key, &[("input_ids", &[0u8; 4][..])]).unwrap();
        w.finish().unwrap();
    };
    append("a", "first", true);
    assert!(hspack_in(&["cp", "a", "b"], t.path()).status.success());
    append("a", "x", false);
    append("b", "y", false);
    let o = hspack_in(&["sync", "a", "b"], t.path());
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("diverged") && text(&o).contains("shard-000001.hsp"),
        "{}",
        text(&o)
    );
    assert!(!text(&o).contains("another dataset"), "{}", text(&o));
    assert_eq!(Dataset::open(t.path().join("b")).unwrap().len(), 2);
}

/// An S3 endpoint of plain http on another host: the client refuses the scheme, which the
/// error said only deep in its cause ("builder error"), with no word of how to allow it.
#[test]
fn a_plain_http_endpoint_says_how_to_allow_it() {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_hspack"))
        .args(["info", "s3://bucket/ds"])
        .env("AWS_ENDPOINT_URL", "http://192.0.2.1:9000")
        .env("AWS_ACCESS_KEY_ID", "x")
        .env("AWS_SECRET_ACCESS_KEY", "y")
        .env_remove("AWS_ALLOW_HTTP")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("use https, or allow http (AWS_ALLOW_HTTP=true"),
        "{}",
        text(&o)
    );
}

/// `hspack cp ds .`, as `cp -r` is typed, spread the dataset's files among the working
/// folder's own (exit 0); so did sync, merge, store export and a writer given a folder of
/// other files. Each is refused now, naming a file there, and leaves the folder as it was;
/// convert refused it already. A folder holding only what an interrupted copy leaves (its
/// shards, published before its manifest) is resumed as before.
#[test]
fn no_dataset_is_written_among_other_files() {
    let (t, _) = demo_copied();
    let proj = t.path().join("proj");
    std::fs::create_dir(&proj).unwrap();
    std::fs::write(proj.join("notes.txt"), "mine\n").unwrap();
    let o = hspack_in(&["store", "init", "st"], t.path());
    assert!(o.status.success(), "{}", text(&o));
    let o = hspack_in(&["store", "add", "st", "a", "--name", "a"], t.path());
    assert!(o.status.success(), "{}", text(&o));
    for (name, seed) in [("x", 1), ("y", 2)] {
        let opts = common::small_options();
        let mut w =
            hspack::DatasetWriter::create(t.path().join(name), common::capture_schema(8), opts)
                .unwrap();
        let smp = common::capture_sample(seed, 3, 8);
        w.append(&format!("{name}0"), &common::as_fields(&smp))
            .unwrap();
        w.finish().unwrap();
    }
    for args in [
        &["cp", "a", "proj"][..],
        &["sync", "a", "proj"],
        &["merge", "x", "y", "proj"],
        &["store", "export", "st/a", "proj"],
    ] {
        let o = hspack_in(args, t.path());
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(
            stderr(&o).contains("such as notes.txt") && stderr(&o).contains("new or empty folder"),
            "{args:?}: {}",
            text(&o)
        );
        let left: Vec<_> = std::fs::read_dir(&proj).unwrap().flatten().collect();
        assert_eq!(left.len(), 1, "{args:?}: {left:?}");
    }
    let schema = hspack::Dataset::open(t.path().join("a"))
        .unwrap()
        .schema()
        .clone();
    let e = hspack::DatasetWriter::create(&proj, schema, hspack::WriteOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("such as notes.txt"), "{e}");
    // Hidden files hold no one's data: a folder kept in git by its `.gitkeep` takes a copy.
    let kept = t.path().join("kept");
    std::fs::create_dir(&kept).unwrap();
    std::fs::write(kept.join(".gitkeep"), "").unwrap();
    let o = hspack_in(&["cp", "a", "kept"], t.path());
    assert!(o.status.success(), "{}", text(&o));
    // An interrupted copy's shards, without the manifest: the copy goes on.
    let c = t.path().join("c");
    std::fs::create_dir(&c).unwrap();
    let ds = hspack::Dataset::open(t.path().join("a")).unwrap();
    let shard = &ds.manifest().shards[0].file;
    std::fs::copy(t.path().join("a").join(shard), c.join(shard)).unwrap();
    let o = hspack_in(&["cp", "a", "c"], t.path());
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        stdout(&o).contains("1 shard already there and right"),
        "{}",
        text(&o)
    );
}
