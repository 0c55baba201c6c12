#![no_main]
//! Any bytes as a segment file (when they start as JSON does) or as a key run (otherwise):
//! decode never panics, and a segment that decodes re-encodes to one that decodes equal.

use hspack::format::manifest::hex;
use hspack::format::segment::{decode_key_run, Segment, SegmentRef};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.first() != Some(&b'{') {
        for ordinals in [0..100, 0..u64::MAX] {
            if let Ok(entries) = decode_key_run(data, ordinals.clone()) {
                assert!(entries.windows(2).all(|w| w[0] < w[1]));
                assert!(entries.iter().all(|e| ordinals.contains(&e.ordinal)));
            }
        }
        return;
    }
    // The entry a manifest would hold for these bytes, taken from what they say, so that the
    // checks past the file's length and hash are reached; a made-up one otherwise.
    let (at, id) = match serde_json::from_slice::<Segment>(data) {
        Ok(s) => (s.reference("segment.json", data), s.dataset_id),
        Err(_) => (
            SegmentRef {
                file: "segment.json".into(),
                bytes: data.len() as u64,
                blake3: hex(blake3::hash(data).as_bytes()),
                level: 0,
                first_seq: 0,
                shards: 1,
                first_ordinal: 0,
                samples: 0,
            },
            hex(&[0; 16]),
        ),
    };
    if let Ok(s) = Segment::decode(data, &at, &id) {
        let again = s.encode();
        let back = Segment::decode(&again, &s.reference("segment.json", &again), &id)
            .expect("an accepted segment re-encodes");
        assert_eq!(s, back);
    }
});
