//! The writer that crash tests kill: durable commits every 3 samples, small chunks, and a
//! `COMMITTED n` line on stdout after each commit, so the killer knows what must survive.

use std::path::Path;

use hspack::{Dataset, DatasetWriter, WriteOptions};

use super::{as_fields, capture_sample, capture_schema, SampleBytes};

/// Hidden size of the samples.
pub const HIDDEN: usize = 256;

/// Durable commits every 3 samples, 8 KiB chunks.
pub fn options() -> WriteOptions {
    WriteOptions {
        chunk_bytes: Some(8 << 10),
        shard_samples: 3,
        durable: true,
        ..WriteOptions::default()
    }
}

/// Sample `i`, keyed `req-{i}`: 5 to 44 rows.
pub fn sample(i: u64) -> SampleBytes {
    capture_sample(i, 5 + (i as usize * 13) % 40, HIDDEN)
}

/// Appends samples `len()..total` and finishes, printing the committed count after each
/// commit.
pub fn write_until_done(dir: &Path, total: u64) {
    let mut w = DatasetWriter::open(dir, capture_schema(HIDDEN as u64), options()).unwrap();
    for i in w.len()..total {
        let before = w.stats().samples;
        w.append(&format!("req-{i}"), &as_fields(&sample(i)))
            .unwrap();
        if w.stats().samples != before {
            println!("COMMITTED {}", w.stats().samples);
        }
    }
    println!("COMMITTED {}", w.finish().unwrap().samples);
}

/// Every sample visible is one that was written, bit for bit, in order; at least `at_least`
/// and at most `total` are. Returns how many.
pub fn check_committed(dir: &Path, at_least: u64, total: u64) -> u64 {
    let ds = Dataset::open(dir).unwrap();
    assert!(
        ds.len() >= at_least,
        "{at_least} committed, {} visible",
        ds.len()
    );
    assert!(ds.len() <= total);
    for i in 0..ds.len() {
        let s = ds.sample(i).unwrap();
        assert_eq!(s.key(), format!("req-{i}"));
        for (name, data) in sample(i) {
            assert_eq!(
                s.read(&name, None).unwrap().bytes(),
                &data[..],
                "{i} {name}"
            );
        }
    }
    ds.len()
}
