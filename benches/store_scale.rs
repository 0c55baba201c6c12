//! The store as it grows: what adding a dataset costs (time and memory) into a store whose
//! index holds 10^5, 10^6 and 10^7 blobs, and how long `du` and `gc` take at each size.
//!
//! The store is grown with synthetic 64-byte blobs (each its own content, so each indexed
//! once) committed a million at a time, as many adds would leave it: packs, index runs
//! merged 8 to a level. At each size a child process (fresh memory) adds the same small
//! dataset (60 ragged samples, 2 × 1024 bf16 layers) under a new name and reports its wall
//! time and memory: peak resident set (`VmHWM`, mapped file pages included) and, at the end,
//! anonymous (`RssAnon`: heap) and file-backed (`RssFile`: mapped pages of runs and packs,
//! which the kernel can drop) resident bytes. `du` and `gc` run in this process; the synthetic
//! blobs belong to no dataset, so `gc` at the end drops them all (its sweep, not its mark).
//!
//! `cargo bench --bench store_scale` (`SIZES=100000,1000000,10000000`, `HSPACK_BENCH_DIR`
//! default the temp folder; about 2 GB of disk at 10^7).

use std::sync::Arc;
use std::time::Instant;

use hspack::store::{gc, usage, Ingest, Store};
use hspack::{CapturePoint, DType, Dataset, DatasetWriter, Field, Role, Schema, WriteOptions};

const CHILD: &str = "HSPACK_STORE_SCALE_CHILD";

fn probe_dataset(dir: &std::path::Path) {
    let layer = |l: u32| {
        Field::new(
            format!("hidden.{l}"),
            DType::BF16,
            &[1024],
            Role::HiddenState {
                layer: l,
                point: CapturePoint::LayerInput,
            },
        )
    };
    let schema = Schema::new(vec![layer(2), layer(30)]);
    let options = WriteOptions {
        durable: false,
        ..Default::default()
    };
    let mut w = DatasetWriter::create(dir, schema, options).unwrap();
    for i in 0..60u64 {
        let rows = 64 + (i * 37 % 200) as usize;
        let f: Vec<Vec<u8>> = (0..2)
            .map(|f| {
                (0..rows * 2048)
                    .map(|b| ((b as u64 * 2654435761 + i * 97 + f) >> 7) as u8)
                    .collect()
            })
            .collect();
        w.append(
            &format!("s{i}"),
            &[("hidden.2", &f[0][..]), ("hidden.30", &f[1][..])],
        )
        .unwrap();
    }
    w.finish().unwrap();
}

fn status(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

/// In the child: add the probe dataset and print `secs hwm anon file`.
fn child(spec: &str) {
    let (store, rest) = spec.split_once('|').unwrap();
    let (src, name) = rest.split_once('|').unwrap();
    let t = Instant::now();
    let store = Arc::new(Store::open(store).unwrap());
    let ds = Dataset::open(src).unwrap();
    hspack::transfer::add_to_store(&store, &ds, name, &|_| {}).unwrap();
    println!(
        "{:.3} {} {} {}",
        t.elapsed().as_secs_f64(),
        status("VmHWM:"),
        status("RssAnon:"),
        status("RssFile:")
    );
}

fn grow(store: &Arc<Store>, from: u64, to: u64) {
    let mut next = from;
    while next < to {
        let end = (next + 1_000_000).min(to);
        let mut ingest = Ingest::new(store).unwrap();
        for i in next..end {
            let mut blob = [0u8; 64];
            blob[..8].copy_from_slice(&i.to_le_bytes());
            blob[8..16].copy_from_slice(b"synthblb");
            let id = *blake3::hash(&blob).as_bytes();
            ingest.put(id, &blob, false).unwrap();
        }
        ingest.commit().unwrap();
        next = end;
    }
}

fn mb(b: u64) -> f64 {
    b as f64 / 1e6
}

fn main() {
    if let Ok(spec) = std::env::var(CHILD) {
        return child(&spec);
    }
    let sizes: Vec<u64> = std::env::var("SIZES")
        .unwrap_or_else(|_| "100000,1000000,10000000".into())
        .split(',')
        .map(|s| s.trim().parse().unwrap())
        .collect();
    let base = std::env::var("HSPACK_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| std::env::temp_dir());
    let dir = tempfile::tempdir_in(base).unwrap();
    let probe = dir.path().join("probe");
    probe_dataset(&probe);
    let store_dir = dir.path().join("store");
    let store = Arc::new(Store::init(&store_dir).unwrap());
    println!("| blobs in the index | index MB | add: s | add: peak RSS MB | add: RssAnon MB | add: RssFile MB | du: s | runs |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut have = 0;
    for &n in &sizes {
        grow(&store, have, n);
        have = n;
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .env(
                CHILD,
                format!("{}|{}|probe-{n}", store_dir.display(), probe.display()),
            )
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let v: Vec<f64> = text
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        let t = Instant::now();
        let u = usage::usage(&store).unwrap();
        let du = t.elapsed().as_secs_f64();
        let index = store.index().unwrap();
        println!(
            "| {n} | {:.0} | {:.3} | {:.1} | {:.1} | {:.1} | {du:.3} | {} |",
            mb(u.index_bytes),
            v[0],
            v[1] / 1e6,
            v[2] / 1e6,
            v[3] / 1e6,
            index.root.runs.len()
        );
    }
    let t = Instant::now();
    let r = gc::collect(&store, false).unwrap();
    println!(
        "gc dropping {} unreferenced blobs ({} live, {} packs deleted): {:.2} s",
        r.blobs_removed,
        r.blobs_live,
        r.packs_deleted,
        t.elapsed().as_secs_f64()
    );
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "load average {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
}
