#![no_main]
//! A valid golden dataset whose first shard's index and chunk headers are mutated, then
//! re-sealed (chunk-header check words, the index hash in the footer and the manifest, the
//! footer's check word), so the mutation passes every checksum and reaches the index
//! validation, the chunk-header cross-checks and the decoders. Opening, reading every sample
//! and verifying must refuse or return, never panic.

use std::path::PathBuf;

use hspack::format::manifest::hex;
use hspack::format::{ChunkHeader, Footer, Manifest};
use hspack::verify::{verify, VerifyOptions};
use hspack::Dataset;
use libfuzzer_sys::fuzz_target;

const GOLDEN: [(&[u8], &[u8], &[u8]); 2] = [
    (
        include_bytes!("../../format-spec/golden/v1/none/manifest.json"),
        include_bytes!("../../format-spec/golden/v1/none/shard-000000.hsp"),
        include_bytes!("../../format-spec/golden/v1/none/shard-000001.hsp"),
    ),
    (
        include_bytes!("../../format-spec/golden/v1/zstd-bytegroup/manifest.json"),
        include_bytes!("../../format-spec/golden/v1/zstd-bytegroup/shard-000000.hsp"),
        include_bytes!("../../format-spec/golden/v1/zstd-bytegroup/shard-000001.hsp"),
    ),
];

fn dir() -> PathBuf {
    std::env::temp_dir().join(format!("hspack-fuzz-resealed-{}", std::process::id()))
}

fn read_footer(shard: &[u8]) -> Footer {
    bytemuck::pod_read_unaligned(&shard[shard.len() - Footer::SIZE..])
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, edits)) = data.split_first() else {
        return;
    };
    let (manifest, shard0, shard1) = GOLDEN[usize::from(mode & 1)];
    let mut shard = shard0.to_vec();
    let footer = read_footer(&shard);
    let index = footer.index_offset as usize..(footer.index_offset + footer.index_len) as usize;
    let chunk_headers: Vec<usize> = {
        let ds_index = hspack::format::Index::parse(&shard[index.clone()]).unwrap();
        (0..ds_index.chunk_count())
            .map(|c| ds_index.chunk(c).unwrap().offset as usize)
            .collect()
    };
    // Each edit: 2 bytes of position, 1 byte to XOR; into the index or a chunk header.
    for e in edits.chunks_exact(3) {
        let pos = usize::from(u16::from_le_bytes([e[0], e[1]]));
        if mode & 2 == 0 || chunk_headers.is_empty() {
            let at = index.start + pos % index.len();
            shard[at] ^= e[2];
        } else {
            let h = chunk_headers[pos % chunk_headers.len()];
            shard[h + (pos / chunk_headers.len()) % 120] ^= e[2];
        }
    }
    // Re-seal what the edits broke.
    for &h in &chunk_headers {
        let c: ChunkHeader = bytemuck::pod_read_unaligned(&shard[h..h + ChunkHeader::SIZE]);
        shard[h..h + ChunkHeader::SIZE].copy_from_slice(bytemuck::bytes_of(&c.seal()));
    }
    let index_hash = *blake3::hash(&shard[index.clone()]).as_bytes();
    let mut f = read_footer(&shard);
    f.index_hash = index_hash;
    let at = shard.len() - Footer::SIZE;
    shard[at..].copy_from_slice(bytemuck::bytes_of(&f.seal()));
    let mut m = Manifest::decode(manifest).unwrap();
    m.shards[0].index_blake3 = hex(&index_hash);
    let dir = dir();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("manifest.json"), m.encode()).unwrap();
    std::fs::write(dir.join("shard-000000.hsp"), &shard).unwrap();
    std::fs::write(dir.join("shard-000001.hsp"), shard1).unwrap();
    let _ = std::fs::remove_file(dir.join("samples.parquet"));
    if let Ok(ds) = Dataset::open(&dir) {
        let names: Vec<String> = ds.schema().fields.iter().map(|f| f.name.clone()).collect();
        for i in 0..ds.len() {
            if let Ok(s) = ds.sample(i) {
                for name in &names {
                    let _ = s.read(name, None);
                    let _ = s.read(name, Some(0..1));
                }
            }
        }
    }
    let _ = verify(&dir, VerifyOptions::default(), &|_| {});
});
