//! Every failpoint (src/failpoint.rs) crashes a writer (committing with fsync, and without)
//! or `hspack convert --delete-source` in turn, at several passes; after each crash the
//! dataset holds every sample committed before it, bit for bit, and nothing uncommitted; a
//! rerun completes it. Each point must really be hit. Needs the `failpoints` feature:
//! `cargo test --features failpoints --test failpoints`.
#![cfg(feature = "failpoints")]

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use common::dumps::{check_dataset, convert_command, write_dumps};
use common::*;
use hspack::failpoint::ALL;
use hspack::verify::{verify, VerifyOptions};
use hspack::{Dataset, DatasetWriter, WriteOptions};

const HIDDEN: usize = 64;
const TOTAL: u64 = 24;
const CHILD_ENV: &str = "HSPACK_FAILPOINT_CHILD_DIR";
/// `0` in the child's environment: commits without fsync (a crash of the process must lose
/// nothing committed all the same: the kernel has every byte).
const DURABLE_ENV: &str = "HSPACK_FAILPOINT_DURABLE";

fn options() -> WriteOptions {
    WriteOptions {
        chunk_bytes: Some(4 << 10),
        shard_samples: 3,
        durable: std::env::var(DURABLE_ENV).as_deref() != Ok("0"),
        ..WriteOptions::default()
    }
}

fn sample(i: u64) -> SampleBytes {
    capture_sample(i, 3 + (i as usize * 5) % 17, HIDDEN)
}

/// Appends samples `len()..TOTAL` and finishes, saying what is committed after each commit
/// and each sample appended.
fn write_until_done(dir: &Path) {
    let mut w = DatasetWriter::open(dir, capture_schema(HIDDEN as u64), options()).unwrap();
    for i in w.len()..TOTAL {
        w.append(&format!("req-{i}"), &as_fields(&sample(i)))
            .unwrap();
        println!("APPENDED {} COMMITTED {}", i + 1, w.stats().samples);
    }
    println!("APPENDED {TOTAL} COMMITTED {}", w.finish().unwrap().samples);
}

/// Runs in the child process only.
#[test]
fn failpoint_child() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        let _scenario = fail::FailScenario::setup();
        write_until_done(Path::new(&dir));
    }
}

/// Samples `0..len` are the ones written, bit for bit; `committed <= len <= appended`.
fn check(dir: &Path, committed: u64, appended: u64) -> u64 {
    if !dir.join("manifest.json").exists() {
        assert_eq!(committed, 0);
        return 0;
    }
    let ds = Dataset::open(dir).unwrap();
    let len = ds.len();
    assert!(
        (committed..=appended.max(committed)).contains(&len),
        "{committed} committed, {appended} appended, {len} visible"
    );
    for i in 0..len {
        let s = ds.sample(i).unwrap();
        assert_eq!(s.key(), format!("req-{i}"));
        for (name, data) in sample(i) {
            assert_eq!(s.read(&name, None).unwrap().bytes(), &data[..]);
        }
    }
    let report = verify(dir, VerifyOptions::default(), &|_| {}).unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    len
}

/// Runs the writer child with `failpoints`; returns (crashed at, committed, appended).
/// The passes at which a point is crashed: those crossed once a run, at the first only.
fn passes(point: &str) -> &'static [u32] {
    match point {
        // 8 commits a run: one merge of their segments.
        "segments-merged" | "leftover-removed" | "finish-listing" => &[0],
        _ => &[0, 1, 4],
    }
}

fn run_writer(dir: &Path, failpoints: &str, durable: bool) -> (Option<String>, u64, u64) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "failpoint_child",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, dir)
        .env("FAILPOINTS", failpoints)
        .env(DURABLE_ENV, if durable { "1" } else { "0" })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let (mut committed, mut appended) = (0, 0);
    for line in BufReader::new(&out.stdout[..])
        .lines()
        .map_while(Result::ok)
    {
        let mut words = line.split_whitespace();
        if words.next() == Some("APPENDED") {
            appended = words.next().unwrap().parse().unwrap();
            committed = words.nth(1).unwrap().parse().unwrap();
        }
    }
    (crash_point(&out.stderr), committed, appended)
}

fn crash_point(stderr: &[u8]) -> Option<String> {
    String::from_utf8_lossy(stderr).lines().find_map(|l| {
        l.strip_prefix("hspack: failpoint ")
            .and_then(|r| r.strip_suffix(": crashing"))
            .map(str::to_string)
    })
}

#[test]
fn a_writer_crashed_at_every_failpoint_loses_no_committed_sample() {
    let writer_points = ALL.iter().filter(|p| {
        !p.starts_with("convert-")
            && !p.starts_with("gc-")
            && !p.starts_with("store-")
            && !p.starts_with("verify-")
    });
    let mut hits = 0;
    let writer_points: Vec<&&str> = writer_points.collect();
    for (durable, &point) in [true, false]
        .into_iter()
        .flat_map(|d| writer_points.iter().map(move |p| (d, p)))
    {
        for &pass in passes(point) {
            let dir = tempfile::tempdir().unwrap();
            // The reopen after the first crash is where leftovers are removed: that point is
            // crossed by the second run, after a crash that left some.
            let (first, second) = if *point == "leftover-removed" {
                (
                    "shard-synced=2*off->return".to_string(),
                    format!("{point}=return"),
                )
            } else {
                (format!("{point}={pass}*off->return"), String::new())
            };
            let (at, committed, appended) = run_writer(dir.path(), &first, durable);
            check(dir.path(), committed, appended);
            let mut crashed_at = at;
            if !second.is_empty() {
                // It crashes while reopening: nothing new is appended or committed.
                let (at, _, _) = run_writer(dir.path(), &second, durable);
                check(dir.path(), committed, appended);
                crashed_at = at;
            }
            assert_eq!(
                crashed_at.as_deref(),
                Some(*point),
                "{point} at pass {pass}, durable {durable}"
            );
            hits += 1;
            // Rerun without failpoints: the dataset completes, each sample once.
            let (at, _, _) = run_writer(dir.path(), "", durable);
            assert_eq!(at, None);
            assert_eq!(check(dir.path(), TOTAL, TOTAL), TOTAL);
        }
    }
    eprintln!("writer failpoints: {hits} crashes, each checked and resumed");
}

fn convert(src: &Path, ds: &Path, failpoints: &str) -> Option<String> {
    let out = convert_command(src, ds)
        .env("FAILPOINTS", failpoints)
        .output()
        .unwrap();
    crash_point(&out.stderr)
}

#[test]
fn convert_crashed_at_every_failpoint_loses_no_sample() {
    const N: usize = 20;
    let mut hits = 0;
    // Leftovers are removed on reopen after a crash, and segments merged every 8 commits
    // (convert commits fewer here): the writer test crosses those points.
    let crossed = |p: &&&str| {
        !["leftover-removed", "segments-merged"].contains(*p)
            && !p.starts_with("gc-")
            && !p.starts_with("store-")
            && !p.starts_with("verify-")
    };
    for point in ALL.iter().filter(crossed) {
        for &pass in passes(point).iter().take(2) {
            let t = tempfile::tempdir().unwrap();
            let (src, ds) = (t.path().join("src"), t.path().join("ds"));
            write_dumps(&src, 0..N);
            let at = convert(&src, &ds, &format!("{point}={pass}*off->return"));
            assert_eq!(at.as_deref(), Some(*point), "{point} at pass {pass}");
            hits += 1;
            // Every sample is a source file still, or in the dataset, bit for bit.
            let in_ds = check_dataset(&ds);
            for i in 0..N {
                let key = format!("req_{i:03}");
                let file = src.join(format!("{key}.safetensors"));
                assert!(file.exists() || in_ds.contains(&key), "{point}: {key} lost");
            }
            assert_eq!(convert(&src, &ds, ""), None);
            assert_eq!(check_dataset(&ds).len(), N);
            assert_eq!(std::fs::read_dir(&src).unwrap().count(), 0);
            assert!(verify(&ds, VerifyOptions::default(), &|_| {})
                .unwrap()
                .is_ok());
        }
    }
    eprintln!("convert failpoints: {hits} crashes, each checked and resumed");
}

/// A new dataset at `url` whose writer committed sample "first", and the options it has.
fn committed_first(url: &str) -> (DatasetWriter, WriteOptions) {
    let no_sync = WriteOptions {
        durable: false,
        ..options()
    };
    let mut w = DatasetWriter::create(url, capture_schema(HIDDEN as u64), no_sync.clone()).unwrap();
    w.append("first", &as_fields(&sample(0))).unwrap();
    w.commit().unwrap();
    (w, no_sync)
}

/// A writer into S3 paused after publishing a shard and before listing it, while another
/// writer takes its lease over (it hung past the lease's life) and removes that shard as a
/// leftover: the paused writer's commit must then fail, never list the removed shard.
fn a_writer_taken_over_mid_commit_never_lists_a_removed_shard(moto: &common::moto::Moto) {
    moto.bucket("hspack-fence");
    let url = "s3://hspack-fence/ds";
    let storage = hspack::io::open_location(url).unwrap();
    let (mut stale, no_sync) = committed_first(url);
    stale.append("stale", &as_fields(&sample(1))).unwrap();
    let listed = || {
        Dataset::open(url)
            .unwrap()
            .manifest()
            .shards
            .iter()
            .map(|s| s.file.clone())
            .collect::<Vec<_>>()
    };
    let unlisted = |storage: &dyn hspack::io::Storage| {
        let listed = listed();
        storage
            .list()
            .unwrap()
            .into_iter()
            .filter(|n| n.starts_with("shard-") && !listed.contains(n))
            .collect::<Vec<_>>()
    };

    // Failpoints are global to the process: the scenario keeps the other tests that set
    // one out until this test is done.
    let _scenario = fail::FailScenario::setup();
    hspack::failpoint::set("shard-published", "pause").unwrap();
    let paused = std::thread::spawn(move || stale.commit().map(drop));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while unlisted(&*storage).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the shard was never published"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // The lease, as another machine sees it once it expired; that machine's writer opens.
    common::moto::expire_lease(&*storage, hspack::io::object_lease::LEASE_FILE, false);
    let mut next = DatasetWriter::open(url, capture_schema(HIDDEN as u64), no_sync).unwrap();
    assert_eq!(
        unlisted(&*storage),
        Vec::<String>::new(),
        "the leftover is removed"
    );
    hspack::failpoint::set("shard-published", "off").unwrap();

    let err = paused.join().unwrap().unwrap_err();
    assert!(
        matches!(err, hspack::Error::CommitConflict { .. }),
        "the paused writer's commit went through: {err}"
    );
    for name in listed() {
        assert!(storage.open(&name).is_ok(), "{name} is listed but gone");
    }
    next.append("next", &as_fields(&sample(2))).unwrap();
    next.finish().unwrap();
    let ds = Dataset::open(url).unwrap();
    let keys: Vec<String> = (0..ds.len())
        .map(|i| ds.sample(i).unwrap().key().to_string())
        .collect();
    assert_eq!(keys, ["first", "next"]);
    let report = hspack::verify::verify_dataset(&ds, VerifyOptions::default(), &|_| {}).unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
}

/// A writer into S3 finishing hangs after checking its manifest and before removing the
/// segment files and key runs it no longer lists, while another writer takes its lease over
/// and commits: the finishing writer must not remove the other's files.
fn a_writer_taken_over_while_finishing_leaves_the_new_writers_files(moto: &common::moto::Moto) {
    moto.bucket("hspack-finish");
    let url = "s3://hspack-finish/ds";
    let (stale, no_sync) = committed_first(url);

    let _scenario = fail::FailScenario::setup();
    let taken = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let taken_in_point = taken.clone();
    fail::cfg_callback("finish-listing", move || {
        if taken_in_point.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return; // the new writer's own finish
        }
        // The lease, as another machine sees it once it expired; that machine's writer
        // opens and commits.
        let storage = hspack::io::open_location(url).unwrap();
        common::moto::expire_lease(&*storage, hspack::io::object_lease::LEASE_FILE, false);
        let mut next =
            DatasetWriter::open(url, capture_schema(HIDDEN as u64), no_sync.clone()).unwrap();
        next.append("next", &as_fields(&sample(2))).unwrap();
        next.finish().unwrap();
    })
    .unwrap();
    // Its commit landed before the takeover: finishing succeeds, removing none of the
    // new writer's files.
    let finished = stale.finish().unwrap();
    assert_eq!(finished.samples, 1, "{finished:?}");
    fail::remove("finish-listing");
    assert!(
        taken.load(std::sync::atomic::Ordering::SeqCst),
        "never reached"
    );

    let ds = Dataset::open(url).unwrap();
    let keys: Vec<String> = (0..ds.len())
        .map(|i| ds.sample(i).unwrap().key().to_string())
        .collect();
    assert_eq!(keys, ["first", "next"]);
    let report = hspack::verify::verify_dataset(&ds, VerifyOptions::default(), &|_| {}).unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
}

/// A collection of a store in S3 stops after replacing the index and before deleting what it
/// no longer lists, past its lease's life; an add on another machine then stores a new
/// dataset. The collection must delete none of that add's packs or runs.
fn a_collection_that_lost_its_lease_deletes_nothing_an_add_published_since(
    moto: &common::moto::Moto,
) {
    use hspack::store::{gc, Store};
    moto.bucket("hspack-gc");
    let url = "s3://hspack-gc/store";
    let t = tempfile::tempdir().unwrap();
    let write = |name: &str, seed: u64| {
        let dir = t.path().join(name);
        let mut w = DatasetWriter::create(&dir, capture_schema(HIDDEN as u64), options()).unwrap();
        for i in 0..4 {
            w.append(&format!("{name}{i}"), &as_fields(&sample(seed + i)))
                .unwrap();
        }
        w.finish().unwrap();
        Dataset::open(&dir).unwrap()
    };
    let (old, new) = (write("old", 100), write("new", 200));
    let store = std::sync::Arc::new(Store::init(url).unwrap());
    hspack::transfer::add_to_store(&store, &old, "old", &|_| {}).unwrap();
    store.remove("old").unwrap(); // garbage for the collection

    let _scenario = fail::FailScenario::setup();
    let added = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let added_in_point = added.clone();
    fail::cfg_callback("gc-index-replaced", move || {
        // The collection's lease, as another machine sees it once it expired.
        let locks = hspack::io::open_location(format!("{url}/locks")).unwrap();
        common::moto::expire_lease(&*locks, "gc.lease", false);
        let other = std::sync::Arc::new(Store::open(url).unwrap());
        hspack::transfer::add_to_store(&other, &new, "new", &|_| {}).unwrap();
        added_in_point.store(true, std::sync::atomic::Ordering::SeqCst);
    })
    .unwrap();
    let collected = gc::collect(&store, false);
    fail::remove("gc-index-replaced");
    assert!(
        added.load(std::sync::atomic::Ordering::SeqCst),
        "never reached"
    );
    let err = collected.expect_err("the collection's lease was taken over");
    assert!(err.to_string().contains("lease"), "{err}");

    let stored = Dataset::open(format!("{url}/new")).unwrap();
    same_samples(
        &Dataset::open(t.path().join("new")).unwrap(),
        &stored,
        |_| {},
    );
    let report =
        hspack::verify::verify_dataset(&stored, VerifyOptions::default(), &|_| {}).unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    // The next collection, holding its lease, frees the garbage and keeps the new dataset.
    gc::collect(&store, false).unwrap();
    assert_eq!(Dataset::open(format!("{url}/new")).unwrap().len(), 4);
}

/// A collection of a store in S3 marks dataset `x`'s blobs dead (it was removed), then stops
/// after taking the index's lease and before replacing `index.json`, past its own lease's
/// life; an add on another machine revokes that lease and stores `x`'s content again as `y`
/// (every blob found in the index, which it leaves as it is). The collection must not
/// publish its index, which lacks `y`'s blobs: it fails, `index.json` is unchanged, `y`
/// reads and verifies, and the next collection keeps it.
fn a_collection_that_lost_its_lease_before_replacing_the_index_publishes_nothing(
    moto: &common::moto::Moto,
) {
    use hspack::store::index::INDEX_ROOT;
    use hspack::store::{gc, usage, Store};
    moto.bucket("hspack-gc-locked");
    let url = "s3://hspack-gc-locked/store";
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("x");
    let mut w = DatasetWriter::create(&dir, capture_schema(HIDDEN as u64), options()).unwrap();
    for i in 0..4 {
        w.append(&format!("x{i}"), &as_fields(&sample(300 + i)))
            .unwrap();
    }
    w.finish().unwrap();
    let src = Dataset::open(&dir).unwrap();
    let store = std::sync::Arc::new(Store::init(url).unwrap());
    hspack::transfer::add_to_store(&store, &src, "x", &|_| {}).unwrap();
    store.remove("x").unwrap(); // every blob of it dead to the collection
    let index_before = store.meta().read(INDEX_ROOT).unwrap().unwrap();

    let _scenario = fail::FailScenario::setup();
    let added = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let added_in_point = added.clone();
    fail::cfg_callback("gc-index-locked", move || {
        // The collection's lease, as another machine sees it once it expired.
        let locks = hspack::io::open_location(format!("{url}/locks")).unwrap();
        common::moto::expire_lease(&*locks, "gc.lease", false);
        let other = std::sync::Arc::new(Store::open(url).unwrap());
        let (_, stats) = hspack::transfer::add_to_store(&other, &src, "y", &|_| {}).unwrap();
        assert_eq!(stats.bytes_new, 0, "every blob found: {stats:?}");
        added_in_point.store(true, std::sync::atomic::Ordering::SeqCst);
    })
    .unwrap();
    let collected = gc::collect(&store, false);
    fail::remove("gc-index-locked");
    assert!(
        added.load(std::sync::atomic::Ordering::SeqCst),
        "never reached"
    );
    let err = collected.expect_err("the collection's lease was taken over");
    assert!(err.to_string().contains("lease"), "{err}");
    let index_now = store.meta().read(INDEX_ROOT).unwrap().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&index_now),
        String::from_utf8_lossy(&index_before),
        "the collection replaced index.json after losing its lease"
    );

    let check_y = || {
        let stored = Dataset::open(format!("{url}/y")).unwrap();
        same_samples(&Dataset::open(&dir).unwrap(), &stored, |_| {});
        let report =
            hspack::verify::verify_dataset(&stored, VerifyOptions::default(), &|_| {}).unwrap();
        assert!(report.is_ok(), "{:?}", report.problems);
        let c = usage::check(&store).unwrap();
        assert!(c.problems.is_empty(), "{:?}", c.problems);
    };
    check_y();
    // The next collection, holding its lease, keeps what `y` references.
    let r = gc::collect(&store, false).unwrap();
    assert_eq!(r.blobs_removed, 0, "{r:?}");
    check_y();
}

/// A writer with `commits` one-sample commits (samples 0..commits) in a new dataset.
fn committed(dir: &Path, commits: u64) -> DatasetWriter {
    let opts = WriteOptions {
        durable: false,
        ..options()
    };
    let mut w = DatasetWriter::create(dir, capture_schema(HIDDEN as u64), opts).unwrap();
    for i in 0..commits {
        w.append(&format!("s{i}"), &as_fields(&sample(i))).unwrap();
        w.commit().unwrap();
    }
    w
}

/// Verifies `ds` while `w` appends its next sample and finishes, between verify's read of the
/// manifest and its checks (failpoint `verify-opened`).
fn verify_while_committing(ds: &Dataset, w: DatasetWriter) -> hspack::verify::Report {
    let _scenario = fail::FailScenario::setup();
    let verifier = std::thread::current().id();
    let writer = std::sync::Mutex::new(Some(w));
    fail::cfg_callback("verify-opened", move || {
        if std::thread::current().id() != verifier {
            return; // another test's verify
        }
        if let Some(mut w) = writer.lock().unwrap().take() {
            let next = w.stats().samples;
            w.append(&format!("s{next}"), &as_fields(&sample(next)))
                .unwrap();
            w.finish().unwrap();
        }
    })
    .unwrap();
    let report = hspack::verify::verify_dataset(ds, VerifyOptions::default(), &|_| {}).unwrap();
    fail::remove("verify-opened");
    report
}

/// A writer commits while `verify` runs (after verify read the manifest, before it reads the
/// key runs), and its commit merges segments: the key runs and segments the merge replaced
/// are removed. Verify must not call the dataset damaged for that (it said "DAMAGED ... the
/// file is missing: ... `hspack repair`"), nor the writer's new files leftovers: it reports
/// the files replaced meanwhile, and gives no proven digest.
#[test]
fn a_commit_during_verify_is_no_damage() {
    let dir = tempfile::tempdir().unwrap();
    // Seven segments of level 0: the eighth commit merges them.
    let w = committed(dir.path(), 7);
    let ds = Dataset::open(dir.path()).unwrap();
    let before = ds.manifest().listed_files().len();
    let report = verify_while_committing(&ds, w);
    assert!(report.is_ok(), "{:?}", report.problems);
    assert!(
        !report.replaced_meanwhile.is_empty() && report.replaced_meanwhile.len() <= before,
        "{:?}",
        report.replaced_meanwhile
    );
    assert!(report.leftovers.is_empty(), "{:?}", report.leftovers);
    assert_eq!(report.proven_digest(), None);
    assert!(report
        .notes()
        .iter()
        .any(|n| n.contains("a writer committed while this ran")));
    // Run again, on the new state: all of it checked.
    let again = verify(dir.path(), VerifyOptions::default(), &|_| {}).unwrap();
    assert!(
        again.is_ok() && again.replaced_meanwhile.is_empty() && again.proven_digest().is_some()
    );
    assert_eq!(Dataset::open(dir.path()).unwrap().len(), 8);
}

/// A key run deleted (damage), then a writer commits while `verify` runs: the manifest
/// changed, but the new one still lists the key run, so it is reported missing all the same
/// (a commit during verify must not hide damage).
#[test]
fn a_commit_during_verify_hides_no_damage() {
    let dir = tempfile::tempdir().unwrap();
    // The eighth commit merges the eight into one segment of level 1.
    let w = committed(dir.path(), 8);
    let ds = Dataset::open(dir.path()).unwrap();
    assert_eq!(ds.manifest().segments.len(), 1);
    let run = ds.manifest().segment_files[0]
        .keys
        .as_ref()
        .unwrap()
        .file
        .clone();
    std::fs::remove_file(dir.path().join(&run)).unwrap();
    // The next commit adds a segment of level 0 beside it.
    let report = verify_while_committing(&ds, w);
    assert!(
        report.replaced_meanwhile.is_empty(),
        "{:?}",
        report.replaced_meanwhile
    );
    let said: Vec<String> = report.problems.iter().map(|e| e.to_string()).collect();
    assert!(
        said.iter()
            .any(|p| p.contains(&run) && p.contains("missing")),
        "{said:?}"
    );
}

/// `store verify` runs while, between its read of the datasets and index and its checks
/// (failpoint `store-verify-opened`), other processes remove dataset `c`, add dataset `d` and
/// collect (rewriting the pack `c` shared with `b`, deleting the others, merging the runs).
/// Verify must not call the store damaged for that: it said DAMAGED for the packs and runs
/// the collection replaced, and for a dataset committed meanwhile whose blobs the index it
/// had read lacked.
#[test]
fn a_commit_and_a_collection_during_store_verify_are_no_damage() {
    use hspack::store::{usage, Store};
    let t = tempfile::tempdir().unwrap();
    let write = |name: &str, n: u64, seed: u64| {
        let dir = t.path().join(name);
        let mut w = DatasetWriter::create(&dir, capture_schema(HIDDEN as u64), options()).unwrap();
        for i in 0..n {
            w.append(&format!("{name}{i}"), &as_fields(&sample(seed + i)))
                .unwrap();
        }
        w.finish().unwrap();
        dir.to_str().unwrap().to_string()
    };
    // `b`'s payloads are the first half of `c`'s, found in `c`'s packs.
    let (c, b, d) = (write("c", 8, 0), write("b", 4, 0), write("d", 4, 100));
    let store_dir = t.path().join("store");
    let root = store_dir.to_str().unwrap().to_string();
    // Written by other processes, so that no pack is mapped by this one before verify.
    hspack_ok(&["store", "init", &root]);
    hspack_ok(&["store", "add", &root, &c, "--name", "c"]);
    hspack_ok(&["store", "add", &root, &b, "--name", "b"]);
    let store = std::sync::Arc::new(Store::open(&store_dir).unwrap());
    let packs_before = std::fs::read_dir(store_dir.join("packs")).unwrap().count();

    let _scenario = fail::FailScenario::setup();
    let verifier = std::thread::current().id();
    let pending = std::sync::Mutex::new(Some((root.clone(), d.clone())));
    fail::cfg_callback("store-verify-opened", move || {
        if std::thread::current().id() != verifier {
            return;
        }
        let Some((root, d)) = pending.lock().unwrap().take() else {
            return;
        };
        hspack_ok(&["store", "rm", &root, "c"]);
        hspack_ok(&["store", "add", &root, &d, "--name", "d"]);
        hspack_ok(&["store", "gc", &root]);
    })
    .unwrap();
    let report = usage::check(&store).unwrap();
    fail::remove("store-verify-opened");
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert!(
        report.packs < packs_before as u64,
        "no pack was collected meanwhile: {report:?}"
    );
    assert_eq!(report.datasets, 1, "{report:?}"); // `b`; `c` went, `d` came later
                                                  // Run again, on the new state: all of it checked.
    let again = usage::check(&store).unwrap();
    assert!(again.problems.is_empty(), "{:?}", again.problems);
    assert_eq!(again.datasets, 2, "{again:?}");
    for (name, src) in [("b", &b), ("d", &d)] {
        same_samples(
            &Dataset::open(src).unwrap(),
            &Dataset::open(store_dir.join(name)).unwrap(),
            |_| {},
        );
    }
}

/// Runs the built `hspack` with `args`, which must succeed.
fn hspack_ok(args: &[&str]) {
    let out = common::cli::hspack(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        common::cli::text(&out)
    );
}

/// A reader opens a store's blob index while an add (another process) merges the runs the
/// index listed and deletes them: the reader, which had read `index.json` before, reads it
/// again and opens the runs that replaced them, instead of failing on a missing run.
#[test]
fn a_reader_opening_the_index_while_an_add_merges_its_runs_reads_the_new_index() {
    use hspack::store::index::{IndexRoot, INDEX_ROOT};
    use hspack::store::Store;
    let t = tempfile::tempdir().unwrap();
    let store_dir = t.path().join("store");
    let datasets: Vec<String> = (0..4u64)
        .map(|d| {
            let dir = t.path().join(format!("d{d}"));
            let mut w =
                DatasetWriter::create(&dir, capture_schema(HIDDEN as u64), options()).unwrap();
            for i in 0..6 {
                w.append(&format!("d{d}-{i}"), &as_fields(&sample(100 * d + i)))
                    .unwrap();
            }
            w.finish().unwrap();
            dir.to_str().unwrap().to_string()
        })
        .collect();
    let store = store_dir.to_str().unwrap().to_string();
    hspack_ok(&["store", "init", &store]);
    hspack_ok(&["store", "add", &store, &datasets[0], "--name", "d0"]);
    let runs_listed = {
        let root = store_dir.clone();
        move || {
            let bytes = std::fs::read(root.join(INDEX_ROOT)).unwrap();
            IndexRoot::decode(&bytes)
                .unwrap()
                .runs
                .into_iter()
                .map(|r| r.file)
        }
    };
    let _scenario = fail::FailScenario::setup();
    let merged = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let merged_in_point = merged.clone();
    let (store_in_point, datasets_in_point) = (store.clone(), datasets.clone());
    let root = store_dir.clone();
    let reader = std::thread::current().id();
    fail::cfg_callback("store-index-read", move || {
        if std::thread::current().id() != reader
            || merged_in_point.swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return;
        }
        // Adds until one of the runs the reader is about to open is gone.
        let read: Vec<String> = runs_listed().collect();
        for (d, dataset) in datasets_in_point.iter().enumerate().skip(1) {
            hspack_ok(&[
                "store",
                "add",
                &store_in_point,
                dataset,
                "--name",
                &format!("d{d}"),
            ]);
            if read.iter().any(|f| !root.join(f).exists()) {
                return;
            }
        }
        panic!("no add merged the runs read");
    })
    .unwrap();
    let index = Store::open(&store_dir).unwrap().index();
    fail::remove("store-index-read");
    assert!(
        merged.load(std::sync::atomic::Ordering::SeqCst),
        "never reached"
    );
    let index = index.unwrap();
    assert!(index.runs().len() < 8, "{} runs", index.runs().len());
    let store = Store::open(&store_dir).unwrap();
    let names = store.names().unwrap();
    for (d, dataset) in datasets.iter().enumerate() {
        let name = format!("d{d}");
        if names.contains(&name) {
            same_samples(
                &Dataset::open(dataset).unwrap(),
                &Dataset::open(store_dir.join(&name)).unwrap(),
                |_| {},
            );
        }
    }
}

/// The races staged against object storage, on one S3 server: its address is in this
/// process's environment, so one test runs them all.
#[test]
fn writers_and_collections_taken_over_in_s3() {
    let Some(moto) = common::moto::Moto::start() else {
        return;
    };
    a_writer_taken_over_mid_commit_never_lists_a_removed_shard(&moto);
    a_writer_taken_over_while_finishing_leaves_the_new_writers_files(&moto);
    a_collection_that_lost_its_lease_deletes_nothing_an_add_published_since(&moto);
    a_collection_that_lost_its_lease_before_replacing_the_index_publishes_nothing(&moto);
    a_shared_writer_that_hung_past_its_commit_lease_never_commits(&moto);
}

/// Runs in the child processes of the shared-writer test only.
#[test]
fn shared_writer_child() {
    if std::env::var(common::shared_writer::CHILD_ENV).is_ok() {
        let _scenario = fail::FailScenario::setup();
        common::shared_writer::child_main();
    }
}

/// One of four writers sharing a folder crashes at each step of a commit in turn (holding
/// the commit lock): the others finish, every sample committed is there once and intact,
/// verify finds nothing wrong; the crashed writer, rerun, completes its part.
#[test]
fn a_shared_writer_crashed_at_every_commit_step_costs_the_others_nothing() {
    use common::shared_writer::{check, committed, spawn, verify_clean, write_rank};
    const COUNT: u64 = 12;
    for point in [
        "shard-synced",
        "shard-published",
        "segment-published",
        "manifest-published",
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let (dir, go) = (tmp.path().join("ds"), tmp.path().join("go"));
        let crash = format!("{point}=1*off->return");
        let children: Vec<_> = (0..4)
            .map(|rank| {
                let failpoints = if rank == 0 { crash.as_str() } else { "" };
                spawn(
                    "shared_writer_child",
                    &dir,
                    rank,
                    COUNT,
                    &go,
                    &[("FAILPOINTS", failpoints)],
                )
            })
            .collect();
        std::fs::write(&go, b"").unwrap();
        let outs: Vec<_> = children
            .into_iter()
            .map(|c| c.wait_with_output().unwrap())
            .collect();
        assert_eq!(crash_point(&outs[0].stderr).as_deref(), Some(point));
        for out in &outs[1..] {
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let counts = check(&dir);
        assert!((1..4).all(|r| counts[&r] == COUNT), "{point}: {counts:?}");
        let crashed = counts.get(&0).copied().unwrap_or(0);
        assert!(crashed >= committed(&outs[0]), "{point}: {counts:?}");
        assert!(crashed < COUNT, "{point}: {counts:?}");
        verify_clean(&dir);
        write_rank(&dir, 0, COUNT);
        assert!((0..4).all(|r| check(&dir)[&r] == COUNT), "{point}");
        verify_clean(&dir);
    }
}

/// A writer sharing a dataset in S3 pauses after publishing a shard, holding the commit
/// lease, until the lease expires (it hung) and another writer commits: the paused writer's
/// commit must then fail, and its shard is never listed.
fn a_shared_writer_that_hung_past_its_commit_lease_never_commits(moto: &common::moto::Moto) {
    moto.bucket("hspack-shared-fence");
    let url = "s3://hspack-shared-fence/ds";
    let storage = hspack::io::open_location(url).unwrap();
    let shared = WriteOptions {
        durable: false,
        shared: true,
        ..options()
    };
    let schema = capture_schema(common::shared_writer::HIDDEN as u64);
    let mut hung = DatasetWriter::open(url, schema, shared).unwrap();
    let fields = common::shared_writer::sample(0, 0);
    hung.append("hung", &as_fields(&fields)).unwrap();
    // Failpoints are global to the process: the scenario keeps the other tests that set
    // one out until this test is done.
    let _scenario = fail::FailScenario::setup();
    hspack::failpoint::set("shard-published", "pause").unwrap();
    let paused = std::thread::spawn(move || hung.commit().map(drop));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !storage
        .list()
        .unwrap()
        .iter()
        .any(|n| n.starts_with("shard-"))
    {
        assert!(std::time::Instant::now() < deadline, "never published");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // The commit lease, as another machine sees it once it expired.
    common::moto::expire_lease(&*storage, hspack::io::object_lease::LEASE_FILE, true);
    // Another writer (a process of its own: the pause holds every thread of this one)
    // commits one sample.
    let tmp = tempfile::tempdir().unwrap();
    let go = tmp.path().join("go");
    std::fs::write(&go, b"").unwrap();
    let other = common::shared_writer::spawn(
        "shared_writer_child",
        std::path::Path::new(url),
        1,
        1,
        &go,
        &[],
    )
    .wait_with_output()
    .unwrap();
    assert!(
        other.status.success(),
        "{}",
        String::from_utf8_lossy(&other.stderr)
    );
    hspack::failpoint::set("shard-published", "off").unwrap();
    let err = paused.join().unwrap().unwrap_err();
    assert!(
        matches!(err, hspack::Error::CommitConflict { .. }),
        "the hung writer's commit went through: {err}"
    );
    let ds = Dataset::open(url).unwrap();
    let keys: Vec<String> = (0..ds.len())
        .map(|i| ds.sample(i).unwrap().key().to_string())
        .collect();
    assert_eq!(keys, [common::shared_writer::key(1, 0)]);
    let report = hspack::verify::verify_dataset(&ds, VerifyOptions::default(), &|_| {}).unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
}

/// A source file written again under its name while `convert --delete-source` ran, after the
/// run read it and before it deleted it (a producer rewriting dumps in place): it was deleted,
/// and the dataset held only the bytes read before. It is kept now, and counted as kept.
#[test]
fn convert_delete_source_keeps_a_file_written_again_after_it_was_read() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, ds, other) = (
        tmp.path().join("src"),
        tmp.path().join("ds"),
        tmp.path().join("other"),
    );
    write_dumps(&src, 0..6);
    write_dumps(&other, 50..51);
    let child = convert_command(&src, &ds)
        .env("FAILPOINTS", "convert-committed=1*sleep(3000)")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Paused after its first commit: a file of a sample it committed is written again.
    let started = std::time::Instant::now();
    let key = loop {
        let first = Dataset::open(&ds)
            .ok()
            .filter(|d| !d.is_empty())
            .map(|d| d.sample(0).unwrap().key().to_string());
        if let Some(key) = first {
            break key;
        }
        assert!(started.elapsed().as_secs() < 60, "no commit");
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    let rewritten = src.join(format!("{key}.safetensors"));
    std::fs::write(
        &rewritten,
        std::fs::read(other.join("req_050.safetensors")).unwrap(),
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(rewritten.exists(), "the file written again was deleted");
    let left: Vec<_> = std::fs::read_dir(&src).unwrap().collect();
    assert_eq!(left.len(), 1, "only the file written again stays");
    assert_eq!(check_dataset(&ds).len(), 6);
}
