//! Crash safety: a writing process is killed (SIGKILL) at many points; on reopen every
//! committed sample is intact, nothing uncommitted is visible, and appending resumes.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::crash_writer::{check_committed, write_until_done};
use hspack::verify::{verify, VerifyOptions};

const TOTAL: u64 = 60;
const CHILD_ENV: &str = "HSPACK_CRASH_CHILD_DIR";

/// Runs in the child process only.
#[test]
fn crash_child() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        write_until_done(std::path::Path::new(&dir), TOTAL);
    }
}

#[test]
fn sigkill_at_many_points_loses_no_committed_sample() {
    let exe = std::env::current_exe().unwrap();
    let mut kill_points = 0;
    let mut visible_counts = std::collections::BTreeSet::new();
    for round in 0..16u64 {
        let dir = tempfile::tempdir().unwrap();
        let mut committed = 0;
        // Kill the same dataset's writer up to three times at different moments, then finish.
        for attempt in 0..3u64 {
            let mut child = Command::new(&exe)
                .args(["crash_child", "--exact", "--nocapture", "--test-threads=1"])
                .env(CHILD_ENV, dir.path())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let out = child.stdout.take().unwrap();
            let (tx, rx) = std::sync::mpsc::channel();
            let lines = std::thread::spawn(move || {
                BufReader::new(out)
                    .lines()
                    .map_while(Result::ok)
                    .filter_map(|l| {
                        l.strip_prefix("COMMITTED ")
                            .and_then(|n| n.parse::<u64>().ok())
                    })
                    .inspect(|&n| {
                        let _ = tx.send(n);
                    })
                    .collect::<Vec<u64>>()
            });
            // Kill after a number of commits that varies by round and attempt, then a short
            // varying delay, so kills land at many points of the writing whatever the load.
            let wait_for = (round + attempt * 5) % 14;
            let mut seen_commits = 0;
            while seen_commits < wait_for {
                match rx.recv_timeout(Duration::from_secs(30)) {
                    Ok(_) => seen_commits += 1,
                    Err(_) => break,
                }
            }
            std::thread::sleep(Duration::from_micros((round * 7 + attempt * 3) % 11 * 300));
            // A kill counts only if it found the writer still running.
            let killed = child.try_wait().unwrap().is_none();
            if killed {
                child.kill().unwrap();
                kill_points += 1;
            }
            let status = child.wait().unwrap();
            assert!(
                killed || status.success(),
                "round {round}: the writer failed: {status}"
            );
            let seen = lines.join().unwrap();
            if let Some(&last) = seen.last() {
                committed = committed.max(last);
            }
            // A writer that said it committed must have left a manifest holding that much.
            if committed > 0 || std::fs::metadata(dir.path().join("manifest.json")).is_ok() {
                committed = committed.max(check_committed(dir.path(), committed, TOTAL));
                visible_counts.insert(committed);
            }
        }
        // Resume: the writer cleans up and appends the rest; each sample exactly once.
        write_until_done(dir.path(), TOTAL);
        assert_eq!(check_committed(dir.path(), TOTAL, TOTAL), TOTAL);
        let report = verify(dir.path(), VerifyOptions::default(), &|_| {}).unwrap();
        assert!(report.is_ok(), "round {round}: {:?}", report.problems);
    }
    assert!(
        kill_points >= 24,
        "only {kill_points} of 48 kills found the writer running"
    );
    // The kills landed at many different points of the writing, not all before or after it.
    let mid = visible_counts
        .iter()
        .filter(|&&n| n > 0 && n < TOTAL)
        .count();
    assert!(
        mid >= 4,
        "kills hit too few distinct points: {visible_counts:?}"
    );
}
