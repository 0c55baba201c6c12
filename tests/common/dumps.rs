//! Dumps of the kind convert reads (one safetensors file per request) and the check that a
//! dataset holds them bit for bit.

use std::borrow::Cow;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use hspack::Dataset;
use safetensors::{Dtype, View};

/// A tensor to serialize.
pub struct V {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl View for &V {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// Hidden size of the dumps.
pub const HIDDEN: usize = 256;

/// Sample `i`: `ids` i32 `[T]` and `h` bf16 `[T, HIDDEN]`, T = 1 + i % 13.
pub fn sample(i: usize) -> (Vec<u8>, Vec<u8>) {
    let t = 1 + i % 13;
    let ids = (0..t as i32)
        .flat_map(|x| (x * 7 + i as i32).to_le_bytes())
        .collect();
    (ids, super::bytes(i as u64 + 1, t * HIDDEN * 2))
}

/// Writes `req_NNN.safetensors` for each `i` in `range`.
pub fn write_dumps(dir: &Path, range: std::ops::Range<usize>) {
    std::fs::create_dir_all(dir).unwrap();
    for i in range {
        let (ids, h) = sample(i);
        let t = ids.len() / 4;
        let tensors = [
            (
                "ids".to_string(),
                V {
                    dtype: Dtype::I32,
                    shape: vec![t],
                    data: ids,
                },
            ),
            (
                "h".to_string(),
                V {
                    dtype: Dtype::BF16,
                    shape: vec![1, t, HIDDEN],
                    data: h,
                },
            ),
        ];
        let path = dir.join(format!("req_{i:03}.safetensors"));
        safetensors::serialize_to_file(tensors.iter().map(|(n, v)| (n.clone(), v)), None, &path)
            .unwrap();
    }
}

/// Keys in the dataset, checking each sample's bytes; panics on a duplicate.
pub fn check_dataset(ds: &Path) -> HashSet<String> {
    let mut keys = HashSet::new();
    let storage = hspack::io::open_location(ds).unwrap();
    if storage.read("manifest.json").unwrap().is_none() {
        return keys;
    }
    let d = Dataset::open(ds).unwrap();
    for o in 0..d.len() {
        let s = d.sample(o).unwrap();
        let i: usize = s.key()["req_".len()..].parse().unwrap();
        let (ids, h) = sample(i);
        assert_eq!(s.read("input_ids", None).unwrap().bytes(), &ids[..]);
        assert_eq!(s.read("hidden.7", None).unwrap().bytes(), &h[..]);
        assert!(keys.insert(s.key().to_string()), "duplicate {}", s.key());
    }
    keys
}

/// `hspack convert` of the dumps in `src` into `ds`: the generic layout (`ids`, `h` as
/// `input_ids`, `hidden.7`), 3 samples a shard, 2 jobs, `--delete-source`, quiet.
pub fn convert_command(src: &Path, ds: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_hspack"));
    c.args([
        "convert",
        super::s(src),
        super::s(ds),
        "--layout",
        "generic",
    ])
    .args(["--field", "input_ids=ids", "--field", "hidden.7=h"])
    .args([
        "--shard-samples",
        "3",
        "-q",
        "--delete-source",
        "--jobs",
        "2",
    ]);
    c
}

/// Runs `command` quietly for `delay_ms`, then kills it if it is still running; true when it
/// had finished by then.
pub fn run_then_kill(command: &mut Command, delay_ms: u64) -> bool {
    let mut child = command
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(delay_ms));
    let finished = child.try_wait().unwrap().is_some();
    if !finished {
        child.kill().unwrap();
    }
    child.wait().unwrap();
    finished
}

/// Writes `capture.json` into `dir`: the `--capture-config` of the dumps these tests convert
/// (layer 7 of `org/model`, captured with SGLang); returns its path.
pub fn write_capture_config(dir: &Path) -> PathBuf {
    let config = dir.join("capture.json");
    std::fs::write(
        &config,
        r#"{"model": "org/model", "revision": "abc", "config_hash": null, "engine": "sglang",
            "deterministic": true, "dtype": "bf16", "layers": [7]}"#,
    )
    .unwrap();
    config
}
