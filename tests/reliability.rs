//! The reliability suite: `kill -9` at random points of a writer and of
//! `hspack convert --delete-source`, corruption injected by kind, every committed bad input,
//! and a full disk (a small tmpfs, when run as root). Each part counts the trials it tried and
//! those that held; the table is printed at the end, and any trial that did not hold fails.
//!
//! On its own, with the table shown:
//! `cargo test --release --test reliability -- --nocapture`
//! (`HSPACK_RELIABILITY_SEED` and `HSPACK_RELIABILITY_KILLS` change the seed and the kills).

mod common;

use std::io::{BufRead, BufReader};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::crash_writer::{self, options, sample, write_until_done, HIDDEN};
use common::dumps::{check_dataset, write_dumps};
use common::*;
use hspack::format::{ChunkHeader, Footer, ShardHeader};
use hspack::verify::{verify, VerifyOptions};
use hspack::{Dataset, DatasetWriter};

const TOTAL: u64 = 40;
const CHILD_ENV: &str = "HSPACK_RELIABILITY_CHILD_DIR";

/// A small, seeded generator: every random point of a run can be replayed from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What one part of the suite tried, what held, and what did not.
struct Tally {
    part: &'static str,
    tried: u64,
    held: u64,
    failures: Vec<String>,
    note: String,
}

impl Tally {
    fn new(part: &'static str) -> Self {
        Tally {
            part,
            tried: 0,
            held: 0,
            failures: Vec::new(),
            note: String::new(),
        }
    }

    /// Runs one trial: it holds when `check` returns without panicking.
    fn trial(&mut self, what: String, check: impl FnOnce()) {
        self.tried += 1;
        match catch_unwind(AssertUnwindSafe(check)) {
            Ok(()) => self.held += 1,
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                self.failures.push(format!("{what}: {msg}"));
            }
        }
    }
}

/// Runs in the child process only.
#[test]
fn writer_child() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        write_until_done(Path::new(&dir), TOTAL);
    }
}

/// Samples `0..len` are the ones written, bit for bit, in order, and verify finds nothing;
/// returns `len`.
fn check_committed(dir: &Path, at_least: u64) -> u64 {
    let len = crash_writer::check_committed(dir, at_least, TOTAL);
    let report = verify(dir, VerifyOptions::default(), &|_| {}).unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    len
}

fn writer_child_command(dir: &Path) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["writer_child", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, dir)
        .stderr(Stdio::null());
    c
}

fn writer_kills(rng: &mut Rng, kills: u64) -> Tally {
    let mut t = Tally::new("kill -9 of a writer");
    // The time a whole run takes here: kills land uniformly within it.
    let calibrate = tempfile::tempdir().unwrap();
    let start = Instant::now();
    let status = writer_child_command(calibrate.path())
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let run = start.elapsed();
    let mut mid_run = 0;
    for k in 0..kills {
        let dir = tempfile::tempdir().unwrap();
        let delay = Duration::from_micros(rng.below(run.as_micros() as u64));
        let mut child = writer_child_command(dir.path())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let lines = std::thread::spawn(move || {
            BufReader::new(out)
                .lines()
                .map_while(Result::ok)
                .filter_map(|l| l.strip_prefix("COMMITTED ")?.parse::<u64>().ok())
                .max()
                .unwrap_or(0)
        });
        std::thread::sleep(delay);
        let _ = child.kill();
        let _ = child.wait();
        let committed = lines.join().unwrap();
        if committed > 0 && committed < TOTAL {
            mid_run += 1;
        }
        t.trial(format!("kill {k} after {delay:?}"), || {
            // A writer that said it committed must have left a manifest holding that much.
            if committed > 0 || dir.path().join("manifest.json").exists() {
                check_committed(dir.path(), committed);
            }
            let status = writer_child_command(dir.path())
                .stdout(Stdio::null())
                .status()
                .unwrap();
            assert!(status.success(), "the resumed writer failed");
            assert_eq!(check_committed(dir.path(), TOTAL), TOTAL);
        });
    }
    t.note = format!("{mid_run} kills between the first and the last commit; run {run:?}");
    // Kills that all landed before the first commit or after the last would prove nothing.
    if mid_run < kills / 4 {
        t.failures.push(format!(
            "only {mid_run} of {kills} kills landed between commits"
        ));
    }
    t
}

/// [`common::dumps::convert_command`], printing nothing.
fn convert_command(src: &Path, ds: &Path) -> Command {
    let mut c = common::dumps::convert_command(src, ds);
    c.stdout(Stdio::null()).stderr(Stdio::null());
    c
}

fn convert_kills(rng: &mut Rng, kills: u64) -> Tally {
    const N: usize = 40;
    let mut t = Tally::new("kill -9 of convert --delete-source");
    let calibrate = tempfile::tempdir().unwrap();
    let calibrate_src = calibrate.path().join("src");
    write_dumps(&calibrate_src, 0..N);
    // The time a whole run takes here, and when its first source file goes (after its first
    // commit): on a loaded machine the start can take most of the run, so every other kill
    // lands after that.
    let start = Instant::now();
    let mut child = convert_command(&calibrate_src, &calibrate.path().join("ds"))
        .spawn()
        .unwrap();
    let mut first = None;
    let status = loop {
        let left = std::fs::read_dir(&calibrate_src).map_or(0, |d| d.count());
        if first.is_none() && left < N {
            first = Some(start.elapsed());
        }
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        std::thread::sleep(Duration::from_micros(200));
    };
    assert!(status.success());
    let run = start.elapsed();
    let first = first.unwrap_or_default().min(run);
    let mut mid_run = 0;
    for k in 0..kills {
        let dir = tempfile::tempdir().unwrap();
        let (src, ds) = (dir.path().join("src"), dir.path().join("ds"));
        write_dumps(&src, 0..N);
        let delay = match k % 2 {
            0 => Duration::from_micros(rng.below(run.as_micros() as u64)),
            _ => first + Duration::from_micros(rng.below((run - first).as_micros().max(1) as u64)),
        };
        let mut child = convert_command(&src, &ds).spawn().unwrap();
        std::thread::sleep(delay);
        let _ = child.kill();
        let _ = child.wait();
        t.trial(format!("kill {k} after {delay:?}"), || {
            // Every sample is a source file still, or in the dataset: never neither.
            let in_ds = check_dataset(&ds);
            for i in 0..N {
                let key = format!("req_{i:03}");
                let file = src.join(format!("{key}.safetensors"));
                assert!(file.exists() || in_ds.contains(&key), "{key} was lost");
            }
            if !in_ds.is_empty() && in_ds.len() < N {
                mid_run += 1;
            }
            let status = convert_command(&src, &ds).status().unwrap();
            assert!(status.success(), "the rerun failed");
            assert_eq!(check_dataset(&ds).len(), N);
            assert_eq!(std::fs::read_dir(&src).unwrap().count(), 0, "sources left");
            let report = verify(&ds, VerifyOptions::default(), &|_| {}).unwrap();
            assert!(report.is_ok(), "{:?}", report.problems);
        });
    }
    t.note = format!("{mid_run} kills between the first and the last commit; run {run:?}");
    // Kills that all landed before the first commit or after the last would prove nothing.
    if mid_run < kills / 4 {
        t.failures.push(format!(
            "only {mid_run} of {kills} kills landed between commits"
        ));
    }
    t
}

/// Byte ranges of one kind of structure in a dataset's files.
fn ranges(dir: &Path, kind: &str) -> Vec<(PathBuf, u64, u64)> {
    let ds = Dataset::open(dir).unwrap();
    let mut out = Vec::new();
    for seq in 0..ds.manifest().shards.len() {
        let shard = ds.shard(seq).unwrap();
        let path = dir.join(&ds.manifest().shards[seq].file);
        let len = std::fs::metadata(&path).unwrap().len();
        let footer = shard.footer();
        match kind {
            "shard header" => out.push((path, 0, ShardHeader::SIZE as u64)),
            "footer" => out.push((path, len - Footer::SIZE as u64, len)),
            "index" => out.push((
                path,
                footer.index_offset,
                footer.index_offset + footer.index_len,
            )),
            "chunk header" | "chunk payload" => {
                for c in 0..footer.chunk_count {
                    let e = shard.index().chunk(c).unwrap();
                    let header = e.offset + ChunkHeader::SIZE as u64;
                    out.push(match kind {
                        "chunk header" => (path.clone(), e.offset, header),
                        _ => (path.clone(), header, header + e.stored_len),
                    });
                }
            }
            _ => unreachable!("{kind}"),
        }
    }
    out
}

/// Reads every sample: each read returns the bytes written, or an error; never other bytes.
fn no_wrong_bytes(dir: &Path) {
    let Ok(ds) = Dataset::open(dir) else { return };
    for i in 0..ds.len().min(TOTAL) {
        let Ok(s) = ds.sample(i) else { continue };
        let Some(n) = s.key().strip_prefix("req-").and_then(|n| n.parse().ok()) else {
            panic!("sample {i} has key {:?}, which was never written", s.key());
        };
        for (name, data) in sample(n) {
            if let Ok(t) = s.read(&name, None) {
                assert_eq!(t.bytes(), &data[..], "sample {i} field {name}: wrong bytes");
            }
        }
    }
}

/// Damage is named by verify (or the dataset refuses to open), and no read returns wrong bytes.
fn detected(dir: &Path, pristine_digest: &str) {
    no_wrong_bytes(dir);
    match verify(dir, VerifyOptions::default(), &|_| {}) {
        Err(_) => {}
        // The manifest is the root of trust: a change to it that still decodes and matches
        // every shard (a model name, say) is what the digest exists to show.
        Ok(r) => assert!(
            !r.is_ok() || r.digest != pristine_digest,
            "verify found nothing and the digest is unchanged"
        ),
    }
}

fn corruption(rng: &mut Rng) -> Tally {
    const PER_KIND: u64 = 8;
    let mut t = Tally::new("corruption injected by kind");
    let root = tempfile::tempdir().unwrap();
    let pristine = root.path().join("pristine");
    write_until_done(&pristine, TOTAL);
    let digest = verify(&pristine, VerifyOptions::default(), &|_| {})
        .unwrap()
        .digest;
    let shards: Vec<PathBuf> = Dataset::open(&pristine)
        .unwrap()
        .manifest()
        .shards
        .iter()
        .map(|r| PathBuf::from(&r.file))
        .collect();
    let structures = [
        "shard header",
        "chunk header",
        "chunk payload",
        "index",
        "footer",
    ];
    let kinds = structures.iter().copied().chain([
        "manifest byte",
        "samples table part byte",
        "shard truncated",
        "shard deleted",
        "bytes appended to a shard",
    ]);
    for kind in kinds {
        for k in 0..PER_KIND {
            let dir = root.path().join(format!("{kind}-{k}").replace(' ', "_"));
            copy_dir(&pristine, &dir);
            let shard = dir.join(&shards[rng.below(shards.len() as u64) as usize]);
            let what = match kind {
                "manifest byte" | "samples table part byte" => {
                    let file = dir.join(match kind {
                        "manifest byte" => "manifest.json",
                        _ => "samples-000000-000000.parquet",
                    });
                    let mut bytes = std::fs::read(&file).unwrap();
                    let at = rng.below(bytes.len() as u64) as usize;
                    bytes[at] ^= 1 << rng.below(8);
                    std::fs::write(&file, bytes).unwrap();
                    format!("byte {at}")
                }
                "shard truncated" => {
                    let len = std::fs::metadata(&shard).unwrap().len();
                    let keep = rng.below(len);
                    std::fs::OpenOptions::new()
                        .write(true)
                        .open(&shard)
                        .unwrap()
                        .set_len(keep)
                        .unwrap();
                    format!("{} cut to {keep} bytes", shard.display())
                }
                "shard deleted" => {
                    std::fs::remove_file(&shard).unwrap();
                    format!("{} deleted", shard.display())
                }
                "bytes appended to a shard" => {
                    let mut bytes = std::fs::read(&shard).unwrap();
                    bytes.extend((0..1 + rng.below(64)).map(|_| rng.next() as u8));
                    std::fs::write(&shard, bytes).unwrap();
                    format!("{} grown", shard.display())
                }
                _ => {
                    let all = ranges(&dir, kind);
                    let (file, lo, hi) = all[rng.below(all.len() as u64) as usize].clone();
                    let mut bytes = std::fs::read(&file).unwrap();
                    let at = (lo + rng.below(hi - lo)) as usize;
                    bytes[at] ^= 1 << rng.below(8);
                    std::fs::write(&file, bytes).unwrap();
                    format!("{} byte {at}", file.display())
                }
            };
            t.trial(format!("{kind}: {what}"), || detected(&dir, &digest));
        }
    }
    t.note = format!("{PER_KIND} random places for each of 10 kinds");
    t
}

fn bad_inputs() -> Tally {
    let mut t = Tally::new("committed bad inputs");
    let bad = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bad_files");
    let mut files: Vec<PathBuf> = std::fs::read_dir(bad.join("convert"))
        .unwrap()
        .chain(std::fs::read_dir(&bad).unwrap())
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e != "py"))
        .filter(|p| p.file_name().is_some_and(|n| n != "valid_small.pt"))
        .collect();
    files.sort();
    for file in files {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let dir = tempfile::tempdir().unwrap();
        let is_manifest = name.starts_with("manifest_");
        let out = if is_manifest {
            // A hostile or broken manifest, read as a dataset's.
            let ds = dir.path().join("ds");
            std::fs::create_dir_all(&ds).unwrap();
            std::fs::copy(&file, ds.join("manifest.json")).unwrap();
            Command::new(env!("CARGO_BIN_EXE_hspack"))
                .args(["verify", s(&ds)])
                .output()
                .unwrap()
        } else if file.parent().is_some_and(|p| p.ends_with("convert")) {
            let src = dir.path().join("src");
            std::fs::create_dir_all(&src).unwrap();
            std::fs::copy(&file, src.join(&name)).unwrap();
            Command::new(env!("CARGO_BIN_EXE_hspack"))
                .args(["convert", s(&src), s(&dir.path().join("ds"))])
                .args(["--layout", "generic", "--field", "x=t"])
                .output()
                .unwrap()
        } else {
            // A damaged shard structure: its own test decodes it; here it must not crash
            // the reader of a folder that holds it.
            let ds = dir.path().join("ds");
            std::fs::create_dir_all(&ds).unwrap();
            std::fs::copy(&file, ds.join("shard-000000.hsp")).unwrap();
            Command::new(env!("CARGO_BIN_EXE_hspack"))
                .args(["verify", s(&ds)])
                .output()
                .unwrap()
        };
        t.trial(name.clone(), || {
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(!text.contains("panicked"), "{text}");
            assert!(
                matches!(out.status.code(), Some(1) | Some(2)),
                "exit {:?}: {text}",
                out.status.code()
            );
            assert!(
                text.contains("hspack: error") || text.contains("DAMAGED"),
                "{text}"
            );
        });
    }
    t.note = "each refused with exit 1 or 2 and a message, never a panic".into();
    t
}

/// A tmpfs of a given size, unmounted on drop.
struct SmallDisk(PathBuf);

impl SmallDisk {
    /// A tmpfs of `size` at `at`, or why it could not be mounted.
    fn mount(at: &Path, size: &str) -> Result<SmallDisk, String> {
        std::fs::create_dir_all(at).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs", s(at)])
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        match out.status.success() {
            true => Ok(SmallDisk(at.to_path_buf())),
            false => Err(String::from_utf8_lossy(&out.stderr).trim().to_string()),
        }
    }
    fn grow(&self, size: &str) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,size={size}"), s(&self.0)])
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn disk_full() -> Tally {
    let mut t = Tally::new("disk full (tmpfs)");
    let root = tempfile::tempdir().unwrap();
    for (k, size) in ["256k", "600k", "1m", "1500k"].into_iter().enumerate() {
        let at = root.path().join(format!("disk-{k}"));
        let disk = match SmallDisk::mount(&at, size) {
            Ok(disk) => disk,
            // In CI (root) the disk-full trials must run: a mount that fails there fails.
            Err(why) => {
                assert!(
                    std::env::var_os("CI").is_none(),
                    "mounting a tmpfs failed in CI: {why}"
                );
                t.note = format!("not run: mounting a tmpfs failed ({why}); it needs root");
                return t;
            }
        };
        t.trial(format!("a {size} disk"), || {
            let dir = disk.0.join("ds");
            let mut w =
                DatasetWriter::open(&dir, capture_schema(HIDDEN as u64), options()).unwrap();
            let mut failed = None;
            for i in 0..TOTAL {
                if let Err(e) = w.append(&format!("req-{i}"), &as_fields(&sample(i))) {
                    failed = Some(e);
                    break;
                }
            }
            let e = match failed {
                Some(e) => {
                    drop(w);
                    e
                }
                None => w
                    .finish()
                    .expect_err("the disk is too small for every sample"),
            };
            let msg = e.to_string();
            assert!(msg.contains("No space left"), "{msg}");
            assert!(msg.contains(s(&dir)), "the error names the file: {msg}");
            let committed = if dir.join("manifest.json").exists() {
                check_committed(&dir, 0)
            } else {
                0
            };
            disk.grow("64m");
            write_until_done(&dir, TOTAL);
            assert_eq!(check_committed(&dir, TOTAL), TOTAL);
            eprintln!("  {size}: full after {committed} committed samples; resumed to {TOTAL}");
        });
    }
    t.note =
        "the error names the file; committed samples intact; resumed once space is back".into();
    t
}

#[test]
fn reliability_suite() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let seed = env_u64("HSPACK_RELIABILITY_SEED", 1);
    let kills = env_u64("HSPACK_RELIABILITY_KILLS", 20);
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let tallies = [
        writer_kills(&mut rng, kills),
        convert_kills(&mut rng, kills),
        corruption(&mut rng),
        bad_inputs(),
        disk_full(),
    ];
    eprintln!("\nreliability suite, seed {seed}:");
    eprintln!("{:<36} {:>6} {:>6}  notes", "part", "tried", "held");
    for t in &tallies {
        eprintln!("{:<36} {:>6} {:>6}  {}", t.part, t.tried, t.held, t.note);
    }
    let failures: Vec<&String> = tallies.iter().flat_map(|t| &t.failures).collect();
    for f in &failures {
        eprintln!("DID NOT HOLD {f}");
    }
    assert!(
        failures.is_empty(),
        "{} trials did not hold",
        failures.len()
    );
}
