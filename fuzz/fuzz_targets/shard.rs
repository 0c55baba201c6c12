#![no_main]
//! Any bytes as a whole shard file, read the way the reader does: footer, header, index
//! (structure checks against each schema the seeds were written with, and a fixed one with a
//! field stored as fp8), then every chunk header and payload decode.
//! Nothing may panic or read out of bounds, whatever the bytes claim.

use std::sync::OnceLock;

use hspack::format::{
    ChunkHeader, Codec, DType, Elements, Field, Footer, Index, Manifest, Role, Schema, ShardHeader,
};
use libfuzzer_sys::fuzz_target;

/// The manifests of the golden datasets whose shards seed this target: an index validates
/// only against the schema it was written with, so without theirs no seed would get past
/// the index to its chunks.
const MANIFESTS: [&[u8]; 5] = [
    include_bytes!("../../format-spec/golden/v1/none/manifest.json"),
    include_bytes!("../../format-spec/golden/v2/stacked/manifest.json"),
    include_bytes!("../../format-spec/golden/v4/segments/manifest.json"),
    include_bytes!("../../format-spec/golden/v4/stacked/manifest.json"),
    include_bytes!("../../format-spec/golden/v5/quantized/manifest.json"),
];

fn schemas() -> &'static [Schema] {
    static SCHEMAS: OnceLock<Vec<Schema>> = OnceLock::new();
    SCHEMAS.get_or_init(|| {
        let mut schemas = vec![Schema::new(vec![
            Field::new("ids", DType::I32, &[], Role::TokenIds),
            Field::new("h", DType::BF16, &[3], Role::Other),
            Field::new("q", DType::BF16, &[2, 3], Role::Other).quantize_fp8(None),
        ])];
        for m in MANIFESTS {
            let schema = Manifest::decode(m).expect("a golden manifest").schema;
            if !schemas.contains(&schema) {
                schemas.push(schema);
            }
        }
        schemas
    })
}

fuzz_target!(|data: &[u8]| {
    let len = data.len() as u64;
    let Ok(footer) = Footer::decode(data, len) else {
        return;
    };
    let Ok(header) = ShardHeader::decode(data) else {
        return;
    };
    let start = footer.index_offset as usize;
    let Some(index_bytes) = data.get(start..start + footer.index_len as usize) else {
        panic!("a decoded footer points inside the file");
    };
    let Ok(index) = Index::parse(index_bytes) else {
        return;
    };
    for schema in schemas() {
        if index
            .validate(
                schema,
                ShardHeader::SIZE as u64..footer.index_offset,
                1 << header.align_log2,
            )
            .is_ok()
        {
            chunks_and_samples(data, &index, schema);
        }
    }
});

/// Every chunk header and payload, every sample's key and extents, of an index validated
/// against `schema`.
fn chunks_and_samples(data: &[u8], index: &Index, schema: &Schema) {
    for c in 0..index.chunk_count() {
        let e = index.chunk(c).expect("validated");
        let at = e.offset as usize;
        let _ = ChunkHeader::decode(&data[at..at + ChunkHeader::SIZE]);
        let stored = &data[at + ChunkHeader::SIZE..at + ChunkHeader::SIZE + e.stored_len as usize];
        let codec = Codec::from_code(e.codec).expect("validated");
        let elements = Elements::of(&schema.fields[e.field as usize]);
        if let Ok(raw) = codec.decode(stored, e.raw_len, elements) {
            assert_eq!(raw.len() as u64, e.raw_len);
        }
    }
    for i in 0..index.sample_count() {
        let s = index.sample(i).expect("validated");
        let key = index.key_of(&s).expect("validated");
        assert_eq!(index.find_key(key), Some(i));
        for x in index.extents_of(&s) {
            assert!(index.chunk(x.chunk.into()).is_some());
        }
    }
}
