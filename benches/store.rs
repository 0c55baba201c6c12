//! The store against a plain dataset, same data, same run: write throughput (a capture
//! written into a folder vs into `STORE/NAME`), read throughput (every field of every sample
//! read and summed, warm page cache, a fresh reader each time), and what `du` and `gc` take.
//!
//! The data is a synthetic capture like the dedup issue describes: ragged samples of 128 to
//! 1024 tokens, 2 layers of 4096 bf16 plus token ids; a third of the samples share a 96-token
//! system prompt (rows equal byte for byte, as a deterministic capture gives), a tenth repeat
//! an earlier sample. Rounds interleave plain and store (A, B, A, B, ...), `ROUNDS` (default
//! 5) of them, and print min and median of each and the ratios of mins and of medians, with the load
//! average. Physical bytes of the store against the plain dataset are printed too.
//!
//! `cargo bench --bench store` (`SAMPLES=60`, `ROUNDS=5`, `HSPACK_BENCH_DIR` default the temp
//! folder).

use std::sync::Arc;
use std::time::Instant;

use hspack::store::{gc, usage, Store};
use hspack::{CapturePoint, DType, Dataset, DatasetWriter, Field, Role, Schema, WriteOptions};

const HIDDEN: u64 = 4096;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn schema() -> Schema {
    let layer = |l: u32| {
        Field::new(
            format!("hidden.{l}"),
            DType::BF16,
            &[HIDDEN],
            Role::HiddenState {
                layer: l,
                point: CapturePoint::LayerInput,
            },
        )
    };
    Schema::new(vec![
        Field::new("input_ids", DType::I32, &[], Role::TokenIds),
        layer(2),
        layer(30),
    ])
}

fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The capture's samples: (key, fields).
fn samples(n: u64) -> Vec<(String, Vec<Vec<u8>>)> {
    let row = [4usize, HIDDEN as usize * 2, HIDDEN as usize * 2];
    let prompt: Vec<Vec<u8>> = row
        .iter()
        .enumerate()
        .map(|(f, r)| noise(7 + f as u64, 96 * r))
        .collect();
    let mut out: Vec<(String, Vec<Vec<u8>>)> = Vec::new();
    for i in 0..n {
        let fields = if i % 10 == 9 {
            out[(i as usize * i as usize * 31 + 5) % out.len()]
                .1
                .clone()
        } else {
            let rows = 128 + (i * 389 % 897) as usize;
            let mut fields: Vec<Vec<u8>> = row
                .iter()
                .enumerate()
                .map(|(f, r)| noise(1000 + i * 10 + f as u64, rows * r))
                .collect();
            if i % 3 == 0 {
                for (f, p) in fields.iter_mut().zip(&prompt) {
                    f[..p.len()].copy_from_slice(p);
                }
            }
            fields
        };
        out.push((format!("req-{i:06}"), fields));
    }
    out
}

fn write(path: &std::path::Path, data: &[(String, Vec<Vec<u8>>)], block_rows: Option<u64>) -> f64 {
    let t = Instant::now();
    // Durable, as writers are by default: a store syncs its packs and index whatever the
    // option says, so a plain write without its fsyncs would not be the same work.
    let options = WriteOptions {
        block_rows,
        ..WriteOptions::default()
    };
    let mut w = DatasetWriter::create(path, schema(), options).unwrap();
    let names = ["input_ids", "hidden.2", "hidden.30"];
    for (key, fields) in data {
        let views: Vec<(&str, &[u8])> = names
            .iter()
            .copied()
            .zip(fields.iter().map(|f| f.as_slice()))
            .collect();
        w.append(key, &views).unwrap();
    }
    w.finish().unwrap();
    t.elapsed().as_secs_f64()
}

fn read(path: &std::path::Path) -> (f64, u64) {
    let t = Instant::now();
    let ds = Dataset::open(path).unwrap();
    let mut sum = 0u64;
    for i in 0..ds.len() {
        let s = ds.sample(i).unwrap();
        for f in 0..3 {
            let t = s.read_field(f, None).unwrap();
            sum = sum.wrapping_add(t.bytes().iter().step_by(64).map(|&b| b as u64).sum::<u64>());
        }
    }
    (t.elapsed().as_secs_f64(), sum)
}

fn stats(v: &[f64]) -> (f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (s[0], s[s.len() / 2])
}

fn main() {
    let n = env("SAMPLES", 60);
    let rounds = env("ROUNDS", 5) as usize;
    let base = std::env::var("HSPACK_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| std::env::temp_dir());
    let dir = tempfile::tempdir_in(base).unwrap();
    let data = samples(n);
    let logical: u64 = data
        .iter()
        .flat_map(|(_, f)| f.iter().map(|b| b.len() as u64))
        .sum();
    println!(
        "{n} samples, {:.2} GB of fields; {rounds} rounds, plain and store interleaved",
        logical as f64 / 1e9
    );
    let (mut wp, mut ws, mut rp, mut rs) = (vec![], vec![], vec![], vec![]);
    let (mut ww, mut rw) = (vec![], vec![]);
    let mut last = None;
    for r in 0..rounds {
        let plain = dir.path().join(format!("plain{r}"));
        let store_dir = dir.path().join(format!("store{r}"));
        Store::init(&store_dir).unwrap();
        let stored = store_dir.join("cap");
        // Whole fields as chunks (block_rows over any sample's rows): repeats are kept once,
        // shared prefixes are not, and a field reads in place.
        let whole = store_dir.join("whole");
        // The order rotates each round.
        let mut order = [0usize, 1, 2];
        order.rotate_left(r % 3);
        for m in order {
            match m {
                0 => wp.push(write(&plain, &data, None)),
                1 => ws.push(write(&stored, &data, None)),
                _ => ww.push(write(&whole, &data, Some(1 << 20))),
            }
        }
        for m in order {
            let (t, sum) = read([&plain, &stored, &whole][m]);
            assert_eq!(sum, *last.get_or_insert(sum), "a reader read other bytes");
            [&mut rp, &mut rs, &mut rw][m].push(t);
        }
        if r + 1 < rounds {
            let _ = std::fs::remove_dir_all(&plain);
            let _ = std::fs::remove_dir_all(&store_dir);
        } else {
            let st = Arc::new(Store::open(&store_dir).unwrap());
            let plain_bytes: u64 = std::fs::read_dir(&plain)
                .unwrap()
                .map(|e| e.unwrap().metadata().unwrap().len())
                .sum();
            st.remove("whole").unwrap();
            gc::collect(&st, false).unwrap();
            let t = Instant::now();
            let u = usage::usage(&st).unwrap();
            let du = t.elapsed().as_secs_f64();
            println!(
                "plain dataset {:.1} MB on disk; store {:.1} MB (packs {:.1} MB, index {:.3} MB): {:.3}x of plain; saved: whole samples {:.1} MB, shared rows {:.1} MB; du {:.3} s",
                plain_bytes as f64 / 1e6,
                (u.pack_bytes + u.index_bytes) as f64 / 1e6,
                u.pack_bytes as f64 / 1e6,
                u.index_bytes as f64 / 1e6,
                (u.pack_bytes + u.index_bytes) as f64 / plain_bytes as f64,
                u.saved_whole_samples as f64 / 1e6,
                u.saved_shared_rows as f64 / 1e6,
                du
            );
            hspack::transfer::add_to_store(&st, &Dataset::open(&plain).unwrap(), "import", &|_| {})
                .unwrap();
            st.remove("cap").unwrap();
            let t = Instant::now();
            let g = gc::collect(&st, false).unwrap();
            println!(
                "gc after removing a dataset another shares: {:.3} s ({} blobs live, {} removed)",
                t.elapsed().as_secs_f64(),
                g.blobs_live,
                g.blobs_removed
            );
        }
    }
    let (l1, l5, l15) = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| {
            let v: Vec<f64> = s
                .split_whitespace()
                .take(3)
                .filter_map(|x| x.parse().ok())
                .collect();
            Some((*v.first()?, *v.get(1)?, *v.get(2)?))
        })
        .unwrap_or_default();
    println!("load average {l1} {l5} {l15}");
    println!(
        "| measure | seconds min, median | GB/s at the median | throughput / plain (mins) | throughput / plain (medians) |"
    );
    println!("|---|---:|---:|---:|---:|");
    let gbs = |secs: f64| logical as f64 / secs / 1e9;
    for (what, v, base) in [
        ("write, plain folder", &wp, &wp),
        ("write, store (16-row blocks)", &ws, &wp),
        ("write, store (whole-field chunks)", &ww, &wp),
        ("read, plain folder", &rp, &rp),
        ("read, store (16-row blocks)", &rs, &rp),
        ("read, store (whole-field chunks)", &rw, &rp),
    ] {
        let ((min, med), (bmin, bmed)) = (stats(v), stats(base));
        println!(
            "| {what} | {min:.3}, {med:.3} | {:.2} | {:.2}x | {:.2}x |",
            gbs(med),
            bmin / min,
            bmed / med
        );
    }
}
