//! Datasets in object storage, against a real S3-compatible server (moto, started here):
//! local → S3 → local round trips with one digest, reads of `s3://` URLs bitwise equal to the
//! local dataset, copies that resume and refuse what they must, conditional puts that refuse
//! to clobber, damage at rest named by verify, and `hspack cp` killed at random points: no
//! manifest is ever published before every shard it lists is intact.
//!
//! One `#[test]` runs every part against one server, in turn.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use common::fault_proxy::FaultProxy;
use common::moto::Moto;
use common::*;
use hspack::io::{open_location, Storage};
use hspack::transfer::{copy, CopyMode, CopyOptions};
use hspack::verify::{verify_dataset, VerifyOptions};
use hspack::{CheckPolicy, Dataset, DatasetWriter, Error, ReadOptions, WriteOptions};

const HIDDEN: usize = 64;

fn sample(i: u64) -> SampleBytes {
    capture_sample(i, 3 + (i as usize * 11) % 40, HIDDEN)
}

fn options() -> WriteOptions {
    WriteOptions {
        shard_samples: 4,
        durable: false,
        ..WriteOptions::default()
    }
}

/// A local dataset of samples `0..n`.
fn local_dataset(dir: &Path, n: u64) {
    let mut w = DatasetWriter::open(dir, capture_schema(HIDDEN as u64), options()).unwrap();
    for i in w.len()..n {
        w.append(&format!("s{i}"), &as_fields(&sample(i))).unwrap();
    }
    w.finish().unwrap();
}

fn digest(location: &str) -> String {
    let ds = Dataset::open(location).unwrap();
    let report = verify_dataset(&ds, VerifyOptions::default(), &|_| {}).unwrap();
    assert!(report.is_ok(), "{location}: {:?}", report.problems);
    report.digest
}

fn cp(src: &str, dst: &str, mode: CopyMode) -> hspack::Result<hspack::transfer::CopyReport> {
    let src = Dataset::open(src)?;
    copy(
        &src,
        &open_location(dst)?,
        &CopyOptions {
            mode,
            ..CopyOptions::default()
        },
        &|_| {},
    )
}

#[test]
fn datasets_in_s3() {
    let Some(moto) = Moto::start() else { return };
    moto.bucket("hspack-test");
    let tmp = tempfile::tempdir().unwrap();
    let local = tmp.path().join("local");
    local_dataset(&local, 14);
    let local = local.to_str().unwrap().to_string();

    round_trip(&local, tmp.path());
    credentials_from_the_aws_cli_profile(&moto, tmp.path());
    stores_in_s3(&local, tmp.path());
    resume_and_refusals(&local, tmp.path());
    conditional_puts_refuse_to_clobber();
    damage_at_rest_is_named();
    repair_replaces_what_is_damaged(&local);
    writers_write_into_s3(&local);
    a_writer_taken_over_cannot_commit();
    a_copy_whose_lease_was_taken_over_publishes_nothing(&local);
    a_shard_written_again_while_read_is_an_error(tmp.path());
    a_lease_renewal_whose_response_was_lost_keeps_the_lease();
    a_lease_nearly_expired_as_others_read_it_stops_a_publish();
    a_bucket_that_is_not_there_is_named(&local);
    puts_whose_responses_were_lost(&moto, &local);
    a_server_ignoring_conditional_writes_is_refused(&moto);
    an_upload_that_fails_is_aborted(&moto);
    killed_writers_lose_no_committed_sample();
    shared_writers_write_into_s3();
    convert_into_s3(tmp.path());
    faults_are_retried_or_named(&local, &moto);
    a_store_probe_refused_or_failing(&local, &moto);
    let big = tmp.path().join("big");
    let mut w = DatasetWriter::open(&big, capture_schema(2048), options()).unwrap();
    for i in 0..16u64 {
        let rows = 100 + (i as usize * 37) % 200;
        w.append(&format!("b{i}"), &as_fields(&capture_sample(i, rows, 2048)))
            .unwrap();
    }
    w.finish().unwrap();
    killed_copies_never_publish_a_partial_dataset(big.to_str().unwrap());
}

/// Every open of `PREFIX/NAME` asks whether `PREFIX` is a store (its `store.json`). A reader
/// who may not list the bucket gets 403, not 404, for a missing object: that is "no store",
/// and the dataset opens. A store's `store.json` that fails (503, every retry) is an error:
/// taken for "no store", a copy wrote a plain dataset among the store's files, which later
/// hid the store's dataset of that name.
fn a_store_probe_refused_or_failing(local: &str, moto: &Moto) {
    cp(local, "s3://hspack-test/team/ds", CopyMode::Copy).unwrap();
    let forbidding = FaultProxy::answering(
        moto.port,
        "HEAD /hspack-test/team/store.json ",
        "403 Forbidden",
    );
    std::env::set_var("AWS_ENDPOINT_URL", forbidding.endpoint());
    let opened = Dataset::open("s3://hspack-test/team/ds");
    std::env::set_var("AWS_ENDPOINT_URL", moto.endpoint());
    let opened = opened.unwrap();
    common::same_samples(&Dataset::open(local).unwrap(), &opened, |_| {});
    hspack::store::Store::init("s3://hspack-test/st503").unwrap();
    let failing = FaultProxy::answering(
        moto.port,
        "HEAD /hspack-test/st503/store.json ",
        "503 Service Unavailable",
    );
    std::env::set_var("AWS_ENDPOINT_URL", failing.endpoint());
    // As `hspack cp` opens its destination: `STORE/NAME` is the store's dataset.
    let copied = hspack::store::open_location("s3://hspack-test/st503/x").and_then(|dst| {
        copy(
            &Dataset::open(local)?,
            &dst,
            &CopyOptions::default(),
            &|_| {},
        )
    });
    std::env::set_var("AWS_ENDPOINT_URL", moto.endpoint());
    let e = copied.unwrap_err();
    assert!(e.to_string().contains("st503/store.json"), "{e}");
    let beside = open_location("s3://hspack-test/st503/x").unwrap();
    assert!(beside.list().unwrap().is_empty(), "{:?}", beside.list());
    assert!(hspack::store::Store::open("s3://hspack-test/st503")
        .unwrap()
        .names()
        .unwrap()
        .is_empty());
}

/// With no keys in the environment, `hspack` takes them (and the region and endpoint) from
/// the AWS CLI's profile, as `aws configure` writes it; with none there either, the error says
/// what to set.
fn credentials_from_the_aws_cli_profile(moto: &Moto, tmp: &Path) {
    let aws = tmp.join("aws");
    std::fs::create_dir_all(&aws).unwrap();
    std::fs::write(
        aws.join("credentials"),
        "[default]\n# no keys here: only the profile named has them\n\n\
         [lab]\naws_access_key_id = test\naws_secret_access_key = test\n",
    )
    .unwrap();
    std::fs::write(
        aws.join("config"),
        format!(
            "[default]\nregion = eu-west-1\n\n[profile lab]\nregion = us-east-1\n\
             endpoint_url = {}\n",
            moto.endpoint()
        ),
    )
    .unwrap();
    // The profile is named by `profile_var` (`AWS_PROFILE` or the older `AWS_DEFAULT_PROFILE`).
    let info = |credentials: &Path, profile_var: &str| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_hspack"));
        cmd.args(["info", "s3://hspack-test/rt"]);
        for var in [
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_ENDPOINT_URL",
            "AWS_REGION",
            "AWS_PROFILE",
            "AWS_DEFAULT_PROFILE",
        ] {
            cmd.env_remove(var);
        }
        // No instance metadata service answers there, on any machine.
        cmd.env("AWS_METADATA_ENDPOINT", "http://127.0.0.1:9")
            .env("AWS_SHARED_CREDENTIALS_FILE", credentials)
            .env("AWS_CONFIG_FILE", aws.join("config"))
            .env(profile_var, "lab");
        cmd.output().unwrap()
    };
    for profile_var in ["AWS_PROFILE", "AWS_DEFAULT_PROFILE"] {
        let out = info(&aws.join("credentials"), profile_var);
        assert!(out.status.success(), "{profile_var}: {}", said(&out));
        let samples = said(&out)
            .lines()
            .find_map(|l| l.strip_prefix("samples").map(|n| n.trim().to_string()));
        assert_eq!(samples.as_deref(), Some("14"), "{}", said(&out));
    }
    let out = info(&aws.join("none"), "AWS_PROFILE");
    assert!(!out.status.success());
    assert!(
        said(&out).contains("no AWS credentials found: profile lab (named by AWS_PROFILE"),
        "{}",
        said(&out)
    );
}

fn round_trip(local: &str, tmp: &Path) {
    let report = cp(local, "s3://hspack-test/rt", CopyMode::Copy).unwrap();
    assert_eq!(report.shards_sent, 4);
    assert!(report.bytes_reread > 0 && report.chunks_checked > 0);
    assert!(report.manifest_published);
    let back = tmp.join("back");
    cp(
        "s3://hspack-test/rt",
        back.to_str().unwrap(),
        CopyMode::Copy,
    )
    .unwrap();
    let d = digest(local);
    assert_eq!(digest("s3://hspack-test/rt"), d);
    assert_eq!(digest(back.to_str().unwrap()), d);
    same_samples(
        &Dataset::open(local).unwrap(),
        &Dataset::open("s3://hspack-test/rt").unwrap(),
        |_| {},
    );
    // Over plain http(s) (read-only) from a static file server: ranged GETs only.
    let server = common::http_files::HttpFiles::start(Path::new(local).parent().unwrap());
    let http = format!("{}/local", server.url());
    same_samples(
        &Dataset::open(local).unwrap(),
        &Dataset::open(&http).unwrap(),
        |_| {},
    );
    assert_eq!(digest(&http), d);
    // A static server lists no folder (WebDAV `PROPFIND` answered 501, retried for minutes):
    // verify checks what the manifest lists and says what it did not look for.
    let report = verify_dataset(
        &Dataset::open(&http).unwrap(),
        VerifyOptions::default(),
        &|_| {},
    )
    .unwrap();
    assert!(!report.files_listed && report.notes()[0].contains("lists no folder"));
    let err = DatasetWriter::open(&http, capture_schema(HIDDEN as u64), options()).unwrap_err();
    assert!(err.to_string().contains("read-only"), "{err}");
    // Token ranges of a remote sample: only those rows.
    let remote = Dataset::open("s3://hspack-test/rt").unwrap();
    let s = remote.sample(5).unwrap();
    let t = s.read("hidden.30", Some(1..3)).unwrap();
    assert_eq!(t.bytes(), &sample(5)[3].1[HIDDEN * 2..3 * HIDDEN * 2]);
    assert!(!t.data.is_mapped());
}

fn resume_and_refusals(local: &str, tmp: &Path) {
    cp(local, "s3://hspack-test/resume", CopyMode::Copy).unwrap();
    // An interrupted copy: no manifest, and a shard missing.
    let dst = open_location("s3://hspack-test/resume").unwrap();
    dst.delete("manifest.json").unwrap();
    dst.delete("shard-000002.hsp").unwrap();
    let report = cp(local, "s3://hspack-test/resume", CopyMode::Copy).unwrap();
    assert_eq!(
        (report.shards_sent, report.shards_present),
        (1, 3),
        "{report:?}"
    );
    assert_eq!(digest("s3://hspack-test/resume"), digest(local));
    // A copy that is whole: nothing sent, nothing published.
    let again = cp(local, "s3://hspack-test/resume", CopyMode::Copy).unwrap();
    assert_eq!((again.shards_sent, again.manifest_published), (0, false));

    // The dataset grows: cp refuses the earlier copy, sync sends the new shards only.
    let grown = tmp.join("grown");
    local_dataset(&grown, 14);
    let grown = grown.to_str().unwrap();
    cp(grown, "s3://hspack-test/grow", CopyMode::Copy).unwrap();
    local_dataset(Path::new(grown), 23);
    let err = cp(grown, "s3://hspack-test/grow", CopyMode::Copy).unwrap_err();
    assert!(
        matches!(err, Error::CopyRefused { .. }) && err.to_string().contains("hspack sync"),
        "{err}"
    );
    let synced = cp(grown, "s3://hspack-test/grow", CopyMode::Sync).unwrap();
    // Shard 3 held 2 samples before and 4 after? No: a reopened writer starts a new shard.
    assert!(
        synced.shards_present >= 4 && synced.shards_sent >= 1,
        "{synced:?}"
    );
    assert_eq!(digest("s3://hspack-test/grow"), digest(grown));

    // Another dataset at the destination is never overwritten.
    let err = cp(local, "s3://hspack-test/grow", CopyMode::Sync).unwrap_err();
    assert!(err.to_string().contains("another dataset"), "{err}");
    assert_eq!(digest("s3://hspack-test/grow"), digest(grown));

    // A writer at the destination (here or on another machine) keeps a copy out until it
    // is done, in S3 and in a folder: the two would race for the next shard's name.
    let folder = tmp.join("written");
    for dst in ["s3://hspack-test/written", folder.to_str().unwrap()] {
        cp(local, dst, CopyMode::Copy).unwrap();
        let mut w = DatasetWriter::open(dst, capture_schema(HIDDEN as u64), options()).unwrap();
        w.append("w0", &as_fields(&sample(100))).unwrap();
        let err = cp(local, dst, CopyMode::Sync).unwrap_err();
        assert!(matches!(err, Error::Locked { .. }), "{dst}: {err}");
        w.finish().unwrap();
        let ds = Dataset::open(dst).unwrap();
        assert_eq!(ds.len(), 15, "{dst}: the writer's commit stays");
        // Once it is done, the destination is no earlier state of the source.
        let err = cp(local, dst, CopyMode::Sync).unwrap_err();
        assert!(err.to_string().contains("diverged"), "{dst}: {err}");
    }
}

fn conditional_puts_refuse_to_clobber() {
    let s3 = open_location("s3://hspack-test/cas").unwrap();
    s3.put_new("x", b"first", true).unwrap();
    let err = s3.put_new("x", b"second", true).unwrap_err();
    assert!(matches!(err, Error::CommitConflict { .. }), "{err}");
    assert_eq!(s3.read("x").unwrap().unwrap(), b"first");
    let stale = blake3::hash(b"not what is there");
    let err = s3.replace("x", b"third", Some(stale), true).unwrap_err();
    assert!(matches!(err, Error::CommitConflict { .. }), "{err}");
    s3.replace("x", b"fourth", Some(blake3::hash(b"first")), true)
        .unwrap();
    assert_eq!(s3.read("x").unwrap().unwrap(), b"fourth");
    // Large enough for a multipart upload: refused up front where an object is.
    let mut big = s3.create("x.tmp").unwrap();
    let part = vec![7u8; hspack::io::object::PART];
    let err = big.write_at(0, &part).unwrap_err();
    assert!(matches!(err, Error::CommitConflict { .. }), "{err}");
    // A name taken while the upload went on (another copy that took the destination over
    // while this one stalled): the completion is refused, and the other's object stays.
    let mut late = s3.create("y.tmp").unwrap();
    late.write_at(0, &part).unwrap(); // the upload starts: no object is there yet
    late.write_at(part.len() as u64, b"tail").unwrap();
    s3.put_new("y", b"the other's", true).unwrap();
    let err = late.publish_new("y", true).unwrap_err();
    assert!(
        matches!(err, Error::CommitConflict { .. }) && err.to_string().contains("while this one"),
        "{err}"
    );
    assert_eq!(s3.read("y").unwrap().unwrap(), b"the other's");
    // With the name free, the same upload goes through whole.
    let mut free = s3.create("z.tmp").unwrap();
    free.write_at(0, &part).unwrap();
    free.write_at(part.len() as u64, b"tail").unwrap();
    free.publish_new("z", true).unwrap();
    let landed = s3.read("z").unwrap().unwrap();
    assert_eq!(landed.len(), part.len() + 4);
    assert!(landed.ends_with(b"tail") && landed[..part.len()] == part[..]);
}

fn damage_at_rest_is_named() {
    let s3: Arc<dyn Storage> = open_location("s3://hspack-test/rt").unwrap();
    let ds = Dataset::open("s3://hspack-test/rt").unwrap();
    let record = ds.manifest().shards[2].clone();
    let mut bytes = s3.read(&record.file).unwrap().unwrap();
    bytes[4096 + 7] ^= 1;
    s3.replace(&record.file, &bytes, None, true).unwrap();
    let report = verify_dataset(&ds, VerifyOptions::default(), &|_| {}).unwrap();
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    let msg = report.problems[0].to_string();
    assert!(
        msg.contains("s3://hspack-test/rt/shard-000002.hsp") && msg.contains("sample"),
        "{msg}"
    );
    // A copy from the damaged dataset stops at the damage and publishes nothing.
    let err = cp(
        "s3://hspack-test/rt",
        "s3://hspack-test/from-damaged",
        CopyMode::Copy,
    )
    .unwrap_err();
    assert!(err.is_damage(), "{err}");
    let dst = open_location("s3://hspack-test/from-damaged").unwrap();
    assert!(dst.read("manifest.json").unwrap().is_none());
}

fn repair_replaces_what_is_damaged(local: &str) {
    // s3://hspack-test/rt has a flipped byte in shard 2 (above); the local folder is intact.
    let out = Command::new(env!("CARGO_BIN_EXE_hspack"))
        .args(["repair", "s3://hspack-test/rt", "--from", local, "--json"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        report["shards_replaced"],
        serde_json::json!(["shard-000002.hsp"])
    );
    assert_eq!(report["problems_found"].as_array().unwrap().len(), 1);
    assert_eq!(report["problems_left"], serde_json::json!([]));
    assert_eq!(digest("s3://hspack-test/rt"), digest(local));
    // A copy of another dataset is refused as a source.
    let other = tempfile::tempdir().unwrap();
    local_dataset(other.path(), 3);
    let ds = Dataset::open("s3://hspack-test/rt").unwrap();
    let err = hspack::transfer::repair(&ds, &Dataset::open(other.path()).unwrap()).unwrap_err();
    assert!(
        err.to_string().contains("not a copy of the same dataset"),
        "{err}"
    );
}

/// Through a proxy that flips bytes, cuts connections and stalls, in both directions: every
/// read returns the right bytes or an error naming the object; every copy either completes
/// intact or publishes no manifest.
fn faults_are_retried_or_named(local: &str, moto: &Moto) {
    let proxy = FaultProxy::start(moto.port, 7, 3);
    let through = |on: bool| {
        let endpoint = match on {
            true => proxy.endpoint(),
            false => moto.endpoint(),
        };
        std::env::set_var("AWS_ENDPOINT_URL", endpoint);
    };
    let truth = Dataset::open(local).unwrap();
    let fields = truth.schema().fields.len();
    let (mut right, mut named, mut wrong) = (0, 0, 0);
    through(true);
    for _ in 0..3 {
        let options = ReadOptions {
            check: CheckPolicy::Always,
            ..ReadOptions::default()
        };
        let remote = match Dataset::open_with("s3://hspack-test/rt", options) {
            Ok(ds) => ds,
            Err(e) => {
                assert!(e.to_string().contains("s3://hspack-test/rt"), "{e}");
                named += 1;
                continue;
            }
        };
        for i in 0..truth.len() {
            for f in 0..fields {
                let want = truth.sample(i).unwrap().read_field(f, None).unwrap();
                match remote.sample(i).and_then(|s| s.read_field(f, None)) {
                    Ok(t) if t.bytes() == want.bytes() => right += 1,
                    Ok(_) => wrong += 1,
                    Err(e) => {
                        assert!(e.to_string().contains("s3://hspack-test/rt"), "{e}");
                        named += 1;
                    }
                }
            }
        }
    }
    let want = digest(local);
    let (mut done, mut refused) = (0, 0);
    for round in 0..6 {
        let dst = format!("s3://hspack-test/faulty-{round}");
        through(true);
        let result = cp(local, &dst, CopyMode::Copy);
        through(false);
        match result {
            Ok(_) => {
                assert_eq!(digest(&dst), want, "round {round}");
                done += 1;
            }
            Err(e) => {
                let at = open_location(&dst).unwrap();
                assert!(
                    at.read("manifest.json").unwrap().is_none(),
                    "round {round}: {e}"
                );
                refused += 1;
                // Its lease may be left too (the release went through the faults), until it
                // expires: expired here, as a minute later. The rerun, without faults,
                // completes the copy.
                common::moto::expire_lease(&*at, hspack::io::object_lease::LEASE_FILE, false);
                cp(local, &dst, CopyMode::Copy).unwrap();
                assert_eq!(digest(&dst), want, "round {round}");
            }
        }
    }
    through(false);
    let injected = proxy.injected.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "faulty proxy: {injected} faults injected; reads: {right} right, {named} failed naming \
         the object, {wrong} wrong; copies: {done} completed intact, {refused} failed with no \
         manifest published (then completed by a rerun)"
    );
    assert_eq!(wrong, 0, "wrong bytes returned");
    assert!(injected >= 10, "{injected} faults");
    assert!(right > 0 && done + refused == 6);
}

/// Samples written straight into S3: under a lease, in shards named after it, uploaded in
/// parts when large; a second writer is refused while the lease lives.
fn writers_write_into_s3(local: &str) {
    let url = "s3://hspack-test/w";
    let mut w = DatasetWriter::create(url, capture_schema(HIDDEN as u64), options()).unwrap();
    for i in 0..14 {
        w.append(&format!("s{i}"), &as_fields(&sample(i))).unwrap();
    }
    let err = DatasetWriter::open(url, capture_schema(HIDDEN as u64), options()).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Locked { .. }), "{msg}");
    assert!(
        msg.contains(&format!("pid {}", std::process::id())),
        "{msg}"
    );
    assert!(msg.contains(".hspack-writer.lease"), "{msg}");
    w.finish().unwrap();
    digest(url);
    same_samples(
        &Dataset::open(local).unwrap(),
        &Dataset::open(url).unwrap(),
        |_| {},
    );
    let ds = Dataset::open(url).unwrap();
    let m = ds.manifest();
    assert_eq!(m.version, 4);
    let lease = m.writer.lease.clone().expect("a lease in the manifest");
    assert_eq!(m.shards.len(), 4);
    for s in &m.shards {
        assert_eq!(s.file, format!("shard-{:06}-{}.hsp", s.seq, &lease[..16]));
    }
    for t in m.table_files() {
        assert!(
            t.file.ends_with(&format!("-{}.parquet", &lease[..16])),
            "{}",
            t.file
        );
    }
    for g in &m.segments {
        assert!(
            g.file.ends_with(&format!("-{}.json", &lease[..16])),
            "{}",
            g.file
        );
    }
    assert_eq!(ds.get_by_key("s3").unwrap().ordinal(), 3);

    // A shard larger than one part goes up in parts, from the spool file.
    let big = "s3://hspack-test/big-shard";
    let schema = capture_schema(4096);
    let many = WriteOptions {
        shard_samples: 1000,
        ..options()
    };
    let mut w = DatasetWriter::create(big, schema.clone(), many).unwrap();
    let written: Vec<SampleBytes> = (0..4).map(|i| capture_sample(i, 1200, 4096)).collect();
    for (i, s) in written.iter().enumerate() {
        w.append(&format!("b{i}"), &as_fields(s)).unwrap();
    }
    w.finish().unwrap();
    let ds = Dataset::open(big).unwrap();
    assert_eq!(ds.manifest().shards.len(), 1);
    assert!(ds.manifest().shards[0].bytes > hspack::io::object::PART as u64);
    for (i, s) in written.iter().enumerate() {
        let got = ds.sample(i as u64).unwrap();
        for (name, bytes) in s {
            assert_eq!(
                got.read(name, None).unwrap().bytes(),
                &bytes[..],
                "b{i} {name}"
            );
        }
    }
    digest(big);
}

/// A writer whose lease was taken over (it hung past the lease's life) fails its next commit,
/// and what it published is never listed; the new holder's samples are intact.
/// A renewal of a writer's lease lands but its response is lost (a retried conditional put
/// then fails on the version it moved): the writer finds its lease still its own and goes on
/// committing.
fn a_lease_renewal_whose_response_was_lost_keeps_the_lease() {
    let url = "s3://hspack-test/renewed";
    let storage = open_location(url).unwrap();
    std::env::set_var("HSPACK_WRITER_LEASE_SECS", "3");
    let mut w = DatasetWriter::create(url, capture_schema(HIDDEN as u64), options()).unwrap();
    std::env::remove_var("HSPACK_WRITER_LEASE_SECS");
    w.append("a", &as_fields(&sample(0))).unwrap();
    w.commit().unwrap();
    // What the lost renewal wrote: the same lease, expiring later, under a new version.
    let lease = hspack::io::object_lease::LEASE_FILE;
    let text = String::from_utf8(storage.read(lease).unwrap().unwrap()).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let at = v["expires_unix_ms"].as_u64().unwrap();
    let renewed = text.replace(&at.to_string(), &(at + 2000).to_string());
    storage
        .replace(lease, renewed.as_bytes(), None, false)
        .unwrap();
    // The writer's next renewals (a second apart) run on the version it knew.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    w.append("b", &as_fields(&sample(1))).unwrap();
    w.commit().unwrap();
    w.finish().unwrap();
    assert_eq!(Dataset::open(url).unwrap().len(), 2);
}

/// A holder confirms its lease before a publish the lease alone fences (a copy's manifest,
/// a store's deletions) by the expiry others read in the lease object, not by its own
/// memory of it (a renewal in flight, or one that hangs, has not landed): with less than a
/// third of its life left there, it stops.
fn a_lease_nearly_expired_as_others_read_it_stops_a_publish() {
    let url = "s3://hspack-test/nearly-expired";
    let storage = open_location(url).unwrap();
    std::env::set_var("HSPACK_WRITER_LEASE_SECS", "30");
    let lock = storage.lock().unwrap();
    std::env::remove_var("HSPACK_WRITER_LEASE_SECS");
    lock.confirm().unwrap();
    // The lease as a renewal that never landed leaves it: this holder's, 2 s of life left.
    let lease = hspack::io::object_lease::LEASE_FILE;
    let text = String::from_utf8(storage.read(lease).unwrap().unwrap()).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let at = v["expires_unix_ms"].as_u64().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let nearly = text.replace(&at.to_string(), &(now + 2000).to_string());
    storage
        .replace(lease, nearly.as_bytes(), None, false)
        .unwrap();
    let err = lock.confirm().unwrap_err().to_string();
    assert!(err.contains("less than a third"), "{err}");
}

/// Through a proxy that hides the conditional-write headers from the server (as a server that
/// ignores them would), a writer is refused before it writes anything, naming the cause; its
/// lease is not left behind: straight to the server, the next writer goes in.
fn a_server_ignoring_conditional_writes_is_refused(moto: &Moto) {
    let url = "s3://hspack-test/unconditional";
    let proxy = FaultProxy::ignoring_conditions(moto.port);
    std::env::set_var("AWS_ENDPOINT_URL", proxy.endpoint());
    let refused = DatasetWriter::create(url, capture_schema(HIDDEN as u64), options());
    std::env::set_var("AWS_ENDPOINT_URL", moto.endpoint());
    let Err(err) = refused else {
        panic!("a writer is refused")
    };
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("ignores conditional writes (If-None-Match)"),
        "{err}"
    );
    let mut w = DatasetWriter::create(url, capture_schema(HIDDEN as u64), options()).unwrap();
    w.append("a", &as_fields(&sample(0))).unwrap();
    w.finish().unwrap();
    assert_eq!(Dataset::open(url).unwrap().len(), 1);
}

/// A multipart upload that started and then failed (here: published under another name than
/// it was started for) is aborted, not left to be billed.
fn an_upload_that_fails_is_aborted(moto: &Moto) {
    let storage = open_location("s3://hspack-test/aborted").unwrap();
    let mut file = storage.create("big.bin.tmp").unwrap();
    let part = vec![7u8; 33 << 20];
    file.write_at(0, &part).unwrap();
    assert!(
        moto.multipart_uploads("hspack-test")
            .iter()
            .any(|k| k == "aborted/big.bin"),
        "the upload started"
    );
    let err = file.publish_new("other.bin", false).unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    let left = moto.multipart_uploads("hspack-test");
    assert!(!left.iter().any(|k| k.starts_with("aborted/")), "{left:?}");
}

/// Puts that land but whose responses are lost (the client retries each, and the server
/// refuses the retry, whose condition the landed put has changed): the one that takes a
/// writer's lease, those that publish a commit's new files, and the one that releases the
/// lease. The writer finds the lease its own and its files in place, every commit lands, and
/// the next writer gets in at once, not a lease's life later.
fn puts_whose_responses_were_lost(moto: &Moto, local: &str) {
    let url = "s3://hspack-test/lost";
    let lease = format!(
        "PUT /hspack-test/lost/{}",
        hspack::io::object_lease::LEASE_FILE
    );
    let proxy = FaultProxy::losing_responses(moto.port);
    let lost = || proxy.injected.load(std::sync::atomic::Ordering::SeqCst);
    std::env::set_var("AWS_ENDPOINT_URL", proxy.endpoint());
    proxy.lose(&lease, 1);
    let writer = DatasetWriter::create(url, capture_schema(HIDDEN as u64), options());
    std::env::set_var("AWS_ENDPOINT_URL", moto.endpoint());
    let mut writer = writer.unwrap();
    assert_eq!(lost(), 1);
    for (i, key) in ["a", "b"].iter().enumerate() {
        writer.append(key, &as_fields(&sample(i as u64))).unwrap();
        // Every put of the commit: its shard, its segment, the manifest.
        let before = proxy.lost().len();
        proxy.lose("PUT /hspack-test/lost/", 100);
        writer.commit().unwrap();
        proxy.lose("", 0);
        let puts = proxy.lost()[before..].join("\n");
        assert!(
            ["shard-", "segment-", "manifest.json"]
                .iter()
                .all(|f| puts.contains(f)),
            "commit {i}: lost {puts}"
        );
    }
    let before = lost();
    proxy.lose(&lease, 1);
    writer.finish().unwrap();
    assert_eq!(lost(), before + 1);
    let mut next = DatasetWriter::open(url, capture_schema(HIDDEN as u64), options()).unwrap();
    next.append("c", &as_fields(&sample(2))).unwrap();
    next.finish().unwrap();
    let ds = Dataset::open(url).unwrap();
    assert_eq!(ds.len(), 3);
    let report = verify_dataset(&ds, VerifyOptions::default(), &|_| {}).unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);

    // A store: the replacement of its `index.json` by an add (over the version read).
    let store_url = "s3://hspack-test/lost-store";
    std::env::set_var("AWS_ENDPOINT_URL", proxy.endpoint());
    let store = hspack::store::Store::init(store_url).map(Arc::new);
    std::env::set_var("AWS_ENDPOINT_URL", moto.endpoint());
    let store = store.unwrap();
    hspack::transfer::add_to_store(&store, &ds, "x", &|_| {}).unwrap();
    let before = lost();
    proxy.lose("PUT /hspack-test/lost-store/index.json", 1);
    let src = Dataset::open(local).unwrap();
    hspack::transfer::add_to_store(&store, &src, "y", &|_| {}).unwrap();
    assert_eq!(lost(), before + 1);
    same_samples(
        &src,
        &Dataset::open(format!("{store_url}/y")).unwrap(),
        |_| {},
    );
    same_samples(
        &ds,
        &Dataset::open(format!("{store_url}/x")).unwrap(),
        |_| {},
    );

    // A multipart upload's completion that lands and whose response is lost: its retry is
    // refused on the condition (the object is there now), and the object, of the upload's
    // length, is taken for it.
    std::env::set_var("AWS_ENDPOINT_URL", proxy.endpoint());
    let big = open_location("s3://hspack-test/lost-big");
    std::env::set_var("AWS_ENDPOINT_URL", moto.endpoint());
    let big = big.unwrap();
    let part = vec![3u8; hspack::io::object::PART + 5];
    let mut file = big.create("big.bin.tmp").unwrap();
    file.write_at(0, &part).unwrap();
    let before = lost();
    proxy.lose("POST /hspack-test/lost-big/big.bin?uploadId=", 1);
    file.publish_new("big.bin", true).unwrap();
    assert_eq!(lost(), before + 1, "the completion's response was lost");
    assert_eq!(big.read("big.bin").unwrap().unwrap(), part);
}

/// A copy that stalls past its lease's life (a suspended machine) while another process takes
/// the destination over publishes no manifest when it goes on: its shards, proven before the
/// stall, may since have been replaced by the other's. The lease is expired and taken while
/// the copy sends its first shard; one shard at a time, the copy sends no other shard after
/// it (it sent them all into the other's dataset, and said its own lost lease as damage or
/// as a copy to run again).
fn a_copy_whose_lease_was_taken_over_publishes_nothing(local: &str) {
    let url = "s3://hspack-test/taken-copy";
    let dst = open_location(url).unwrap();
    let src = Dataset::open(local).unwrap();
    let other = std::sync::Mutex::new(None);
    let taken = |_: u64| {
        let mut other = other.lock().unwrap();
        if other.is_none() {
            common::moto::expire_lease(&*dst, hspack::io::object_lease::LEASE_FILE, false);
            *other = Some(open_location(url).unwrap().lock().unwrap());
        }
    };
    let one_at_a_time = CopyOptions {
        jobs: 1,
        ..CopyOptions::default()
    };
    let err = copy(&src, &dst, &one_at_a_time, &taken).unwrap_err();
    assert!(
        matches!(
            err,
            Error::CommitConflict { .. } | Error::CopyRefused { .. }
        ) && err.to_string().contains("taken over"),
        "{err}"
    );
    assert!(dst.read("manifest.json").unwrap().is_none());
    let shards = (dst.list().unwrap().iter())
        .filter(|n| n.ends_with(".hsp"))
        .count();
    assert!(
        src.manifest().shards.len() > 1 && shards <= 1,
        "{shards} shards sent"
    );
    // Once the other holder is done, the copy goes through.
    drop(other.into_inner().unwrap());
    cp(local, url, CopyMode::Copy).unwrap();
    assert_eq!(digest(url), digest(local));
}

/// A shard object written again (other bytes under its name) while a reader has the dataset
/// open: the reader's next read of it is an error saying to reopen, never the new bytes
/// served under chunks it checked in the old ones (`CheckPolicy::Once` hashes a chunk once).
fn a_shard_written_again_while_read_is_an_error(tmp: &Path) {
    // Shards past the 64 KiB tail an open fetches, so that reads go to the object.
    let local = tmp.join("rewritten");
    let mut w = DatasetWriter::open(&local, capture_schema(2048), options()).unwrap();
    for i in 0..4u64 {
        w.append(&format!("r{i}"), &as_fields(&capture_sample(i, 40, 2048)))
            .unwrap();
    }
    w.finish().unwrap();
    let url = "s3://hspack-test/rewritten";
    cp(local.to_str().unwrap(), url, CopyMode::Copy).unwrap();
    let options = ReadOptions {
        check: CheckPolicy::Once,
        ..ReadOptions::default()
    };
    let ds = Dataset::open_with(url, options).unwrap();
    let first = ds.sample(0).unwrap().read("hidden.2", None).unwrap();
    let s3 = open_location(url).unwrap();
    let name = ds.manifest().shards[0].file.clone();
    let mut bytes = s3.read(&name).unwrap().unwrap();
    let at = 4096;
    bytes[at] ^= 0x10;
    s3.replace(&name, &bytes, None, false).unwrap();
    let again = ds.sample(0).and_then(|s| s.read("hidden.2", None));
    match again {
        Err(e) => assert!(e.to_string().contains("open the dataset again"), "{e}"),
        Ok(t) => assert_eq!(t.bytes(), first.bytes(), "the new bytes were served"),
    }
    let err = (0..ds.len())
        .map(|i| ds.sample(i).and_then(|s| s.read("hidden.2", None)))
        .find_map(|r| r.err())
        .expect("every read of the written-again shard went through");
    assert!(err.to_string().contains("open the dataset again"), "{err}");
}

fn a_writer_taken_over_cannot_commit() {
    let url = "s3://hspack-test/w";
    let storage = open_location(url).unwrap();
    let mut stale = DatasetWriter::open(url, capture_schema(HIDDEN as u64), options()).unwrap();
    stale.append("stale", &as_fields(&sample(100))).unwrap();
    // Its lease, as another machine sees it once it expired.
    common::moto::expire_lease(&*storage, hspack::io::object_lease::LEASE_FILE, false);
    let mut next = DatasetWriter::open(url, capture_schema(HIDDEN as u64), options()).unwrap();
    next.append("next", &as_fields(&sample(101))).unwrap();
    next.commit().unwrap();
    let err = stale.commit().unwrap_err();
    assert!(matches!(err, Error::CommitConflict { .. }), "{err}");
    drop(stale);
    next.finish().unwrap();
    let ds = Dataset::open(url).unwrap();
    assert_eq!(ds.len(), 15);
    assert_eq!(ds.sample(14).unwrap().key(), "next");
    assert!(ds.find("stale").unwrap().is_none());
    let report = verify_dataset(&ds, VerifyOptions::default(), &|_| {}).unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    // The stale writer's shard is a leftover, removed by the next writer to open.
    let stale_shards = |names: Vec<String>| {
        let listed: Vec<&str> = ds
            .manifest()
            .shards
            .iter()
            .map(|s| s.file.as_str())
            .collect();
        names
            .into_iter()
            .filter(|n| n.starts_with("shard-") && !listed.contains(&n.as_str()))
            .count()
    };
    assert_eq!(stale_shards(storage.list().unwrap()), 1);
    DatasetWriter::open(url, capture_schema(HIDDEN as u64), options())
        .unwrap()
        .finish()
        .unwrap();
    assert_eq!(stale_shards(storage.list().unwrap()), 0);
}

/// `hspack convert` into S3: every sample bit for bit, sources deleted only once committed
/// there; a rerun with more dumps appends; options that keep a local file beside the dataset
/// are refused with what to do.
fn convert_into_s3(tmp: &Path) {
    use common::dumps::{check_dataset, convert_command, write_dumps};
    let url = "s3://hspack-test/converted";
    let src = tmp.join("dumps");
    write_dumps(&src, 0..10);
    let out = convert_command(&src, Path::new(url)).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(check_dataset(Path::new(url)).len(), 10);
    assert_eq!(
        std::fs::read_dir(&src).unwrap().count(),
        0,
        "sources deleted"
    );
    write_dumps(&src, 10..17);
    let out = convert_command(&src, Path::new(url)).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(check_dataset(Path::new(url)).len(), 17);
    digest(url);
    write_dumps(&src, 17..18);
    let out = convert_command(&src, Path::new(url))
        .args(["--key-from", "id"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("hspack cp"), "{err}");
    assert_eq!(check_dataset(Path::new(url)).len(), 17);
}

const KILLED_WRITER_URL: &str = "HSPACK_S3_WRITER_URL";

/// Runs in the child process only: the writer `killed_writers_lose_no_committed_sample` kills.
#[test]
fn s3_writer_child() {
    if let Ok(url) = std::env::var(KILLED_WRITER_URL) {
        common::crash_writer::write_until_done(Path::new(&url), 40);
    }
}

/// Writers into S3 killed at several points: every committed sample survives; the next
/// writer is refused while the dead one's lease lives, then takes over and finishes.
fn killed_writers_lose_no_committed_sample() {
    use std::io::{BufRead, BufReader};
    let url = "s3://hspack-test/killed-writers";
    let exe = std::env::current_exe().unwrap();
    let (mut committed, mut refused, mut kills) = (0, 0, 0);
    for round in 0..12u64 {
        let mut child = Command::new(&exe)
            .args([
                "s3_writer_child",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(KILLED_WRITER_URL, url)
            .env("HSPACK_WRITER_LEASE_SECS", "1")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let mut seen = 0;
        let mut lines = out.lines().map_while(Result::ok);
        let wait_for = 1 + round % 3;
        for line in lines.by_ref() {
            if let Some(n) = line.strip_prefix("COMMITTED ") {
                committed = committed.max(n.parse::<u64>().unwrap());
                seen += 1;
                if seen == wait_for {
                    break;
                }
            }
        }
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap();
            kills += 1;
        }
        let status = child.wait().unwrap();
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        if err.contains("Locked {") && err.contains(".hspack-writer.lease") {
            refused += 1;
            std::thread::sleep(std::time::Duration::from_millis(1200));
        } else {
            assert!(status.success() || !err.contains("panicked"), "{err}");
        }
        // A writer that said it committed must have left a manifest holding that much.
        if committed > 0 || storage_has_manifest(url) {
            committed = committed.max(common::crash_writer::check_committed(
                Path::new(url),
                committed,
                40,
            ));
        }
        if committed == 40 {
            break;
        }
    }
    assert!(kills >= 3, "{kills} kills");
    assert!(
        refused >= 1,
        "a dead writer's live lease refused the next one"
    );
    std::thread::sleep(std::time::Duration::from_millis(1200));
    common::crash_writer::write_until_done(Path::new(url), 40);
    common::crash_writer::check_committed(Path::new(url), 40, 40);
    digest(url);
}

/// Runs in the child processes of `shared_writers_write_into_s3` only.
#[test]
fn s3_shared_writer_child() {
    common::shared_writer::child_main();
}

/// Eight writers sharing one dataset in S3, each in its own process, one of them killed
/// after its second commit: every sample of the others lands once, the killed one's
/// committed samples stay, ordinals dense, verify clean; the killed rank, rerun, completes.
fn shared_writers_write_into_s3() {
    use common::shared_writer::{check, rank_changes, spawn, verify_clean, write_rank};
    use std::io::{BufRead, BufReader};
    const RANKS: u64 = 8;
    const COUNT: u64 = 12;
    let url = Path::new("s3://hspack-test/shared");
    let tmp = tempfile::tempdir().unwrap();
    let go = tmp.path().join("go");
    let mut children: Vec<_> = (0..RANKS)
        .map(|r| {
            spawn(
                "s3_shared_writer_child",
                url,
                r,
                COUNT,
                &go,
                &[
                    ("HSPACK_WRITER_LEASE_SECS", "2"),
                    ("HSPACK_TEST_APPEND_PAUSE_MS", "40"),
                ],
            )
        })
        .collect();
    std::fs::write(&go, b"").unwrap();
    let out = BufReader::new(children[0].stdout.take().unwrap());
    let commits = out
        .lines()
        .map_while(Result::ok)
        .filter(|l| l.starts_with("COMMITTED "))
        .take(2)
        .count();
    assert_eq!(commits, 2);
    children[0].kill().unwrap();
    for child in children {
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() || !err.contains("panicked"), "{err}");
    }
    let counts = check(url);
    assert!((1..RANKS).all(|r| counts[&r] == COUNT), "{counts:?}");
    let killed = counts.get(&0).copied().unwrap_or(0);
    assert!((6..COUNT).contains(&killed), "{counts:?}");
    verify_clean(url);
    let changes = rank_changes(url);
    assert!(changes >= RANKS as usize, "{changes} rank changes");
    write_rank(url, 0, COUNT);
    assert!((0..RANKS).all(|r| check(url)[&r] == COUNT));
    verify_clean(url);
    eprintln!("{RANKS} writers into S3, one killed: rank changes along the shards {changes}");
}

fn storage_has_manifest(url: &str) -> bool {
    open_location(url)
        .unwrap()
        .read("manifest.json")
        .unwrap()
        .is_some()
}

fn killed_copies_never_publish_a_partial_dataset(local: &str) {
    let want = digest(local);
    let shards = Dataset::open(local).unwrap().manifest().shards.len();
    let run = || {
        Command::new(env!("CARGO_BIN_EXE_hspack"))
            .args([
                "cp",
                "--jobs",
                "2",
                local,
                "s3://hspack-test/killed",
                "--json",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let dst = open_location("s3://hspack-test/killed").unwrap();
    // How long a whole copy takes here, so the kills land inside copies.
    let start = std::time::Instant::now();
    assert!(run().wait().unwrap().success());
    let whole = start.elapsed();
    let forget_half = |round: u64| {
        dst.delete("manifest.json").unwrap();
        for k in 0..shards.div_ceil(2) {
            let seq = (round as usize + k * 2) % shards;
            dst.delete(&format!("shard-{seq:06}.hsp")).unwrap();
        }
    };
    forget_half(0);
    let mut killed = 0;
    let mut said_gone = false;
    for round in 1..=20u64 {
        // Somewhere in the first 90% of a copy of half the shards.
        let at = 0.05 + 0.85 * ((round * 7919) % 101) as f64 / 100.0;
        let mut child = run();
        std::thread::sleep(whole.mul_f64(at / 2.0));
        let was_killed = child.try_wait().unwrap().is_none();
        if was_killed {
            child.kill().unwrap();
            killed += 1;
        }
        child.wait().unwrap();
        if was_killed && !said_gone && dst.read("manifest.json").unwrap().is_none() {
            // Run again at once, the lease of the copy killed is live still: the refusal
            // says no such process runs here, and when to run again.
            let again = hspack_cli(&["cp", local, "s3://hspack-test/killed"]);
            let why = said(&again);
            if !again.status.success() {
                assert!(
                    why.contains("no process of that id runs here")
                        && why.contains("run again once its lease expires"),
                    "{why}"
                );
                said_gone = true;
            }
        }
        // A killed copy's lease on the destination stays until it expires (a minute): the
        // next copy is refused until then. Expired here, as a minute later.
        common::moto::expire_lease(&*dst, hspack::io::object_lease::LEASE_FILE, false);
        if dst.read("manifest.json").unwrap().is_some() {
            // Published: then every shard it lists is there and intact.
            assert_eq!(digest("s3://hspack-test/killed"), want, "round {round}");
            forget_half(round);
        }
    }
    assert!(
        killed >= 10,
        "only {killed} of 20 copies were killed mid-way"
    );
    assert!(said_gone, "no copy run again after a kill was refused");
    let report = cp(local, "s3://hspack-test/killed", CopyMode::Copy).unwrap();
    assert_eq!(digest("s3://hspack-test/killed"), want);
    assert_eq!(report.shards_sent + report.shards_present, shards as u64);
    eprintln!(
        "killed {killed} of 20 copies; the last run sent {} shards ({} bytes) and found {} \
         ({} bytes) intact",
        report.shards_sent, report.bytes_sent, report.shards_present, report.bytes_present
    );
}

/// A bucket that does not exist is said so (exit 2), not taken for a damaged dataset, a
/// missing manifest or a copy to resume.
fn a_bucket_that_is_not_there_is_named(local: &str) {
    for args in [
        &["cp", local, "s3://no-such-bucket/ds"][..],
        &["verify", "s3://no-such-bucket/ds"],
    ] {
        let o = hspack_cli(args);
        let text = said(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {text}");
        assert!(
            text.contains("the bucket (or container) does not exist")
                && !text.contains("again to resume")
                && !text.contains("damaged")
                && !text.contains("no manifest.json"),
            "{args:?}: {text}"
        );
    }
}

fn hspack_cli(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_hspack"))
        .args(args)
        .output()
        .unwrap()
}

fn said(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The lease objects of the store at `url` whose names start with `prefix`.
fn leases(url: &str, prefix: &str) -> Vec<String> {
    open_location(format!("{url}/locks"))
        .unwrap()
        .list()
        .unwrap()
        .into_iter()
        .filter(|n| n.starts_with(prefix))
        .collect()
}

/// A store in S3: datasets added, written and read through `s3://…/STORE/NAME`, stored once,
/// collected, verified and exported; the lease protocol between adds and collections, with
/// an add killed and an add that hangs past its lease.
fn stores_in_s3(local: &str, tmp: &Path) {
    use hspack::store::{gc, usage, Store};
    let url = "s3://hspack-test/store";
    let init = hspack_cli(&["store", "init", url]);
    assert!(init.status.success(), "{}", said(&init));
    let again = hspack_cli(&["store", "init", url]);
    assert!(
        !again.status.success() && said(&again).contains("already there"),
        "{}",
        said(&again)
    );
    let store = Arc::new(Store::open(url).unwrap());
    let src = Dataset::open(local).unwrap();

    // Added twice: stored once, read back bitwise, the digest kept.
    let (first, added) = hspack::transfer::add_to_store(&store, &src, "a", &|_| {}).unwrap();
    assert!(added.bytes_new > 0);
    assert_eq!(first.digest, digest(local));
    let add_b = hspack_cli(&["store", "add", url, local, "--name", "b"]);
    assert!(add_b.status.success(), "{}", said(&add_b));
    let u = usage::usage(&store).unwrap();
    assert_eq!(u.datasets.len(), 2);
    assert!(
        u.saved_across_datasets >= u.datasets[0].logical_bytes * 99 / 100,
        "{u:?}"
    );
    let b = Dataset::open(format!("{url}/b")).unwrap();
    same_samples(&src, &b, |_| {});
    assert_eq!(digest(&format!("{url}/b")), digest(local));

    // Written straight into the store by a writer: repeats of stored samples add nothing new.
    let mut w = DatasetWriter::create(format!("{url}/w"), capture_schema(HIDDEN as u64), options())
        .unwrap();
    for i in 0..14 {
        w.append(&format!("s{i}"), &as_fields(&sample(i))).unwrap();
    }
    w.append("new", &as_fields(&sample(99))).unwrap();
    w.finish().unwrap();
    let written = Dataset::open(format!("{url}/w")).unwrap();
    assert_eq!(written.len(), 15);
    for i in 0..14 {
        let (x, y) = (src.sample(i).unwrap(), written.sample(i).unwrap());
        for f in 0..src.schema().fields.len() {
            assert_eq!(
                x.read_field(f, None).unwrap().bytes(),
                y.read_field(f, None).unwrap().bytes()
            );
        }
    }
    let ls = hspack_cli(&["store", "ls", url]);
    assert!(
        ls.status.success() && ["a", "b", "w"].iter().all(|n| said(&ls).contains(n)),
        "{}",
        said(&ls)
    );

    // Removed and collected: what the others reference stays, the rest goes.
    let scratch = tmp.join("scratch");
    let mut sw = DatasetWriter::create(&scratch, capture_schema(HIDDEN as u64), options()).unwrap();
    for i in 0..6u64 {
        sw.append(&format!("x{i}"), &as_fields(&sample(500 + i)))
            .unwrap();
    }
    sw.finish().unwrap();
    let scratch_ds = Dataset::open(&scratch).unwrap();
    hspack::transfer::add_to_store(&store, &scratch_ds, "scratch", &|_| {}).unwrap();
    store.remove("scratch").unwrap();
    store.remove("a").unwrap();
    let r = gc::collect(&store, true).unwrap();
    assert!(r.blobs_removed > 0 && r.bytes_freed > 0, "{r:?}");
    same_samples(&src, &Dataset::open(format!("{url}/b")).unwrap(), |_| {});
    assert!(Dataset::open(format!("{url}/a")).is_err());
    let v = hspack_cli(&["store", "verify", url]);
    assert!(
        v.status.success() && said(&v).contains("OK"),
        "{}",
        said(&v)
    );
    let out = tmp.join("exported");
    let e = hspack_cli(&[
        "store",
        "export",
        &format!("{url}/b"),
        out.to_str().unwrap(),
    ]);
    assert!(e.status.success(), "{}", said(&e));
    assert_eq!(digest(out.to_str().unwrap()), digest(local));

    // The lease protocol: a collection waits for an add, an add for a collection.
    std::env::set_var("HSPACK_COMMIT_WAIT_SECS", "1");
    let adding = store.locks().adding().unwrap();
    assert_eq!(leases(url, "add-").len(), 1);
    let refused = gc::collect(&store, false).unwrap_err();
    assert!(
        matches!(refused, Error::Locked { .. }) && refused.to_string().contains("add-"),
        "{refused}"
    );
    drop(adding);
    assert!(
        leases(url, "add-").is_empty(),
        "a released add lease is deleted"
    );
    let collecting = store.locks().collecting(&|_| {}).unwrap();
    let refused = store.locks().adding().unwrap_err();
    assert!(refused.to_string().contains("gc.lease"), "{refused}");
    drop(collecting);
    std::env::remove_var("HSPACK_COMMIT_WAIT_SECS");

    // A writer between the shards of one commit (holding an add's lease since its first) and
    // a collection started meanwhile: the collection waits for the commit, and the commit
    // does not wait for the collection (each waited for the other until one gave up).
    std::env::set_var("HSPACK_COMMIT_WAIT_SECS", "30");
    let mut w2 = DatasetWriter::create(
        format!("{url}/w2"),
        capture_schema(HIDDEN as u64),
        options(),
    )
    .unwrap();
    for i in 0..5 {
        w2.append(&format!("c{i}"), &as_fields(&sample(300 + i)))
            .unwrap();
    }
    let collecting = {
        let store = Arc::clone(&store);
        std::thread::spawn(move || gc::collect(&store, false))
    };
    let locks = hspack::io::open_location(format!("{url}/locks")).unwrap();
    let started = std::time::Instant::now();
    while !locks.list().unwrap().iter().any(|f| f == "gc.lease") {
        assert!(
            started.elapsed().as_secs() < 30,
            "the collection did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let t = std::time::Instant::now();
    w2.finish().unwrap();
    let took = t.elapsed();
    collecting.join().unwrap().unwrap();
    std::env::remove_var("HSPACK_COMMIT_WAIT_SECS");
    assert!(
        took.as_secs() < 10,
        "the commit waited {took:?} for the collection"
    );
    assert_eq!(Dataset::open(format!("{url}/w2")).unwrap().len(), 5);

    // An add killed mid-way: its lease expires, the collection revokes it and runs.
    let big = tmp.join("big-src");
    let mut bw = DatasetWriter::create(&big, capture_schema(2048), options()).unwrap();
    for i in 0..24u64 {
        bw.append(
            &format!("b{i}"),
            &as_fields(&capture_sample(
                7000 + i,
                200 + (i as usize * 37) % 200,
                2048,
            )),
        )
        .unwrap();
    }
    bw.finish().unwrap();
    let big = big.to_str().unwrap();
    for (round, stop) in [("killed", "-KILL"), ("hung", "-STOP")] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_hspack"))
            .args(["store", "add", url, big, "--name", round])
            .env("HSPACK_WRITER_LEASE_SECS", "2")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let locks = hspack::io::ObjectStorage::open(&format!("{url}/locks")).unwrap();
        let live = || {
            leases(url, "add-").iter().any(|add| {
                hspack::io::object_lease::live_holder(&locks, add)
                    .unwrap()
                    .is_some()
            })
        };
        while !live() {
            assert!(
                std::time::Instant::now() < deadline,
                "the add took no lease"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let pid = child.id().to_string();
        assert!(Command::new("kill")
            .args([stop, &pid])
            .status()
            .unwrap()
            .success());
        let t0 = std::time::Instant::now();
        let r = gc::collect(&store, true).unwrap();
        assert!(
            t0.elapsed() >= std::time::Duration::from_millis(500),
            "the collection waited for the lease to expire ({:?})",
            t0.elapsed()
        );
        // The dead or hung add's lease is revoked, not live.
        let adds = leases(url, "add-");
        assert!(!adds.is_empty(), "{r:?}");
        for add in adds {
            let text = String::from_utf8(locks.read(&add).unwrap().unwrap()).unwrap();
            assert!(text.contains("revoked_unix_ms"), "{text}");
            assert!(hspack::io::object_lease::live_holder(&locks, &add)
                .unwrap()
                .is_none());
        }
        if stop == "-STOP" {
            // Woken after the collection removed what it had stored: it must not publish.
            Command::new("kill").args(["-CONT", &pid]).status().unwrap();
            let out = child.wait_with_output().unwrap();
            assert!(!out.status.success(), "{}", said(&out));
            let why = said(&out);
            assert!(
                why.contains("lease on the store expired") && !why.contains("lost"),
                "{why}"
            );
        } else {
            child.wait().unwrap();
        }
        assert!(store.snapshot(round).unwrap().is_none(), "{round}");
        let v = hspack_cli(&["store", "verify", url]);
        assert!(
            v.status.success() && said(&v).contains("OK"),
            "{}",
            said(&v)
        );
        same_samples(&src, &Dataset::open(format!("{url}/b")).unwrap(), |_| {});
    }
    a_revoked_store_hold_is_a_lost_lease(&store, url);

    // Run again, the add completes; its dataset exports with the source's digest.
    let add = hspack_cli(&["store", "add", url, big, "--name", "hung"]);
    assert!(add.status.success(), "{}", said(&add));
    assert_eq!(digest(&format!("{url}/hung")), digest(big));
    let gc_cli = hspack_cli(&["store", "gc", url]);
    assert!(gc_cli.status.success(), "{}", said(&gc_cli));
    let v = hspack_cli(&["store", "verify", url]);
    assert!(
        v.status.success() && said(&v).contains("OK"),
        "{}",
        said(&v)
    );

    // A collection that hangs past its lease (stopped while it waits for an add to finish):
    // an add meanwhile revokes the expired lease and goes on; woken, the collection learns it
    // lost its lease and deletes nothing. Without an add it learns so all the same: its
    // renewals never bring an expired lease back to life.
    let locks = hspack::io::ObjectStorage::open(&format!("{url}/locks")).unwrap();
    for with_add in [true, false] {
        let adding = store.locks().adding().unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_hspack"))
            .args(["store", "gc", url])
            .env("HSPACK_WRITER_LEASE_SECS", "2")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while hspack::io::object_lease::live_holder(&locks, "gc.lease")
            .unwrap()
            .is_none()
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the collection took no lease"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let pid = child.id().to_string();
        assert!(Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .unwrap()
            .success());
        std::thread::sleep(std::time::Duration::from_millis(3000));
        drop(adding);
        if with_add {
            let add = hspack_cli(&["store", "add", url, big, "--name", "during-gc"]);
            assert!(add.status.success(), "{}", said(&add));
            let text = String::from_utf8(locks.read("gc.lease").unwrap().unwrap()).unwrap();
            assert!(text.contains("revoked_unix_ms"), "{text}");
        }
        Command::new("kill").args(["-CONT", &pid]).status().unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(!out.status.success(), "with_add {with_add}: {}", said(&out));
        assert!(
            said(&out).contains("lease on the store expired"),
            "with_add {with_add}: {}",
            said(&out)
        );
        let v = hspack_cli(&["store", "verify", url]);
        assert!(
            v.status.success() && said(&v).contains("OK"),
            "{}",
            said(&v)
        );
    }
    assert_eq!(digest(&format!("{url}/during-gc")), digest(big));

    // A reader reads on while a collection rewrites the packs its samples are in: the same
    // samples in other shards (their payloads those of `b`'s packs), read from a handle opened
    // before `b` went.
    let resharded = tmp.join("resharded");
    let mut rw = DatasetWriter::create(
        &resharded,
        capture_schema(HIDDEN as u64),
        WriteOptions {
            shard_samples: 3,
            ..options()
        },
    )
    .unwrap();
    for i in 0..src.len() {
        rw.append(&format!("s{i}"), &as_fields(&sample(i))).unwrap();
    }
    rw.finish().unwrap();
    hspack::transfer::add_to_store(&store, &Dataset::open(&resharded).unwrap(), "c", &|_| {})
        .unwrap();
    let reader = Dataset::open(format!("{url}/c")).unwrap();
    store.remove("b").unwrap();
    let r = gc::collect(&store, true).unwrap();
    assert!(r.packs_rewritten > 0, "{r:?}");
    same_samples(&src, &reader, |_| {});
}

/// A copy into a store reads its lease again before each change and when what it sent does
/// not read back. Where a collection revoked the add's hold of `gc.lock` (the add hung past
/// its life) and removed its blobs, that lease is lost, though the dataset's own lock is not:
/// the add says its lease expired, not that the store lost blobs (as the woken add above
/// sometimes did).
fn a_revoked_store_hold_is_a_lost_lease(store: &Arc<hspack::store::Store>, url: &str) {
    let ds: Arc<dyn Storage> = Arc::new(store.dataset("revoked").unwrap());
    let lease = ds.lock().unwrap();
    lease.confirm().unwrap();
    let before = leases(url, "add-");
    ds.put_new("notes.txt", b"held until the commit", true)
        .unwrap();
    let held: Vec<String> = leases(url, "add-")
        .into_iter()
        .filter(|n| !before.contains(n))
        .collect();
    assert_eq!(held.len(), 1, "{held:?}");
    lease.confirm().unwrap();
    // Revoked, as a collection revokes a lease that expired.
    let locks = open_location(format!("{url}/locks")).unwrap();
    let text = locks.read(&held[0]).unwrap().unwrap();
    let mut revoked: serde_json::Value = serde_json::from_slice(&text).unwrap();
    revoked["revoked_unix_ms"] = serde_json::json!(1);
    let revoked = serde_json::to_vec(&revoked).unwrap();
    locks
        .replace(&held[0], &revoked, Some(blake3::hash(&text)), true)
        .unwrap();
    let err = lease.confirm().unwrap_err().to_string();
    assert!(
        err.contains("lease on the store expired") && !err.contains("lost"),
        "{err}"
    );
    // A file being staged, which the collection removed from the staging folder: its publish
    // says the lease expired (it said "cannot rename into place", and called it damage).
    let mut staged = ds.create("shard-000009.hsp.tmp").unwrap();
    staged.write_at(0, b"a shard being written").unwrap();
    let staging = store.staging().root().to_path_buf();
    for f in std::fs::read_dir(&staging).unwrap() {
        let f = f.unwrap().path();
        if f.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("revoked+")
        {
            std::fs::remove_file(f).unwrap();
        }
    }
    let err = staged
        .publish_new("shard-000009.hsp", true)
        .unwrap_err()
        .to_string();
    assert!(err.contains("lease on the store expired"), "{err}");
    let commit = ds.put_new(hspack::format::manifest::MANIFEST_FILE, b"{}", true);
    let err = commit.unwrap_err().to_string();
    assert!(err.contains("lease on the store expired"), "{err}");
    assert!(store.snapshot("revoked").unwrap().is_none());
}

/// A server that sends no ETag (a static file host), and an object written again in place
/// while a dataset was open: ranged reads were pinned to nothing, and chunks checked once
/// were served changed. They are pinned to the last-modified time now: the read fails,
/// saying the object was written again.
#[test]
fn an_object_written_again_on_a_server_without_etags_is_refused_not_read() {
    let t = tempfile::tempdir().unwrap();
    let local = t.path().join("ds");
    // Samples of 400 rows: a shard larger than the tail a read fetches at open.
    let big = |i: u64| capture_sample(i, 400, HIDDEN);
    let mut w = DatasetWriter::open(&local, capture_schema(HIDDEN as u64), options()).unwrap();
    for i in 0..8 {
        w.append(&format!("s{i}"), &as_fields(&big(i))).unwrap();
    }
    w.finish().unwrap();
    let server = common::http_files::HttpFiles::start_without_etags(t.path());
    let url = format!("{}/ds", server.url());
    let options = ReadOptions {
        check: CheckPolicy::Once,
        ..ReadOptions::default()
    };
    let ds = Dataset::open_in(open_location(&url).unwrap(), options).unwrap();
    let field = |i: u64| {
        ds.sample(i)
            .unwrap()
            .read("hidden.30", None)
            .map(|t| t.bytes().to_vec())
    };
    for i in 0..8 {
        assert_eq!(field(i).unwrap(), big(i)[3].1);
    }
    // The first shard written again in place, one byte of a payload changed, a second later.
    let shard = local.join(&ds.manifest().shards[0].file);
    let mut bytes = std::fs::read(&shard).unwrap();
    let at = ds.shard(0).unwrap().index().chunk(0).unwrap().offset as usize + 200;
    bytes[at] ^= 0x10;
    std::fs::write(&shard, &bytes).unwrap();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    std::fs::File::options()
        .write(true)
        .open(&shard)
        .unwrap()
        .set_modified(later)
        .unwrap();
    let mut refused = 0;
    for i in 0..ds.manifest().shards[0].samples {
        match field(i) {
            Ok(got) => assert_eq!(got, big(i)[3].1, "sample {i} read changed"),
            Err(e) => {
                assert!(
                    e.to_string()
                        .contains("written again since the dataset was opened"),
                    "{e}"
                );
                refused += 1;
            }
        }
    }
    assert!(refused > 0);
}
