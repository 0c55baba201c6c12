//! Round trips of every fixed structure and of the index, and decoders that never panic.

use hspack::format::{
    ChunkHeader, DType, ExtentEntry, Field, Footer, Index, IndexBuilder, Manifest, Role, Schema,
    ShardHeader,
};
use proptest::prelude::*;

proptest! {
    #[test]
    fn shard_header_round_trips(seq in any::<u32>(), id in any::<[u8; 16]>(), schema in any::<[u8; 32]>(), align in 6u8..=20) {
        let h = ShardHeader::new(seq, id, schema, align);
        prop_assert_eq!(ShardHeader::decode(bytemuck::bytes_of(&h)).unwrap(), h);
    }

    #[test]
    fn chunk_header_round_trips(id in any::<u32>(), seq in any::<u32>(), field in any::<u16>(), rows in any::<u64>(), hash in any::<[u8; 32]>()) {
        let h = ChunkHeader { magic: [0; 8], chunk_id: id, shard_seq: seq, codec: 1, dtype: 8, field, reserved0: 0,
            sample: 7, row_start: 3, row_count: rows, raw_len: 11, stored_len: 5, hash, reserved1: [0; 24], check: 0 }.seal();
        prop_assert_eq!(ChunkHeader::decode(bytemuck::bytes_of(&h)).unwrap(), h);
    }

    #[test]
    fn footer_round_trips(index_len in 0u64..1 << 40, samples in any::<u64>(), id in any::<[u8; 16]>()) {
        let f = Footer { magic: [0; 8], version: 0, reserved0: 0, shard_seq: 3, dataset_id: id, index_offset: 128,
            index_len, index_hash: [5; 32], sample_count: samples, chunk_count: 2, first_ordinal: 9,
            file_len: 256 + index_len, check: 0, end_magic: [0; 8] }.seal();
        prop_assert_eq!(Footer::decode(bytemuck::bytes_of(&f), 256 + index_len).unwrap(), f);
        prop_assert!(Footer::decode(bytemuck::bytes_of(&f), 255 + index_len).is_err());
    }

    #[test]
    fn any_single_bit_flip_in_a_header_is_caught(bit in 0usize..(128 * 8)) {
        let h = ShardHeader::new(1, [2; 16], [3; 32], 12);
        let mut b = bytemuck::bytes_of(&h).to_vec();
        b[bit / 8] ^= 1 << (bit % 8);
        prop_assert!(ShardHeader::decode(&b).is_err());
    }

    #[test]
    fn index_round_trips(keys in proptest::collection::vec("[a-z0-9/._-]{0,12}", 0..40), first in 0u64..1 << 40) {
        let mut keys = keys;
        keys.sort();
        keys.dedup();
        let mut b = IndexBuilder::new(first);
        for (i, k) in keys.iter().enumerate() {
            let x = ExtentEntry { row_start: 0, row_count: 1, chunk_row: 0, chunk: 0, field: 0, reserved: 0 };
            b.push_sample(k, i as u64, u64::MAX, 0, &[x]);
        }
        let bytes = b.encode();
        let index = Index::parse(&bytes).unwrap();
        prop_assert_eq!(index.sample_count(), keys.len() as u64);
        for (i, k) in keys.iter().enumerate() {
            prop_assert_eq!(index.find_key(k), Some(i as u64));
            let s = index.sample(i as u64).unwrap();
            prop_assert_eq!(s.ordinal, first + i as u64);
            prop_assert_eq!(index.key_of(&s), Some(k.as_str()));
        }
        prop_assert_eq!(index.find_key("not-a-key-UPPER"), None);
    }

    #[test]
    fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = ShardHeader::decode(&bytes);
        let _ = ChunkHeader::decode(&bytes);
        let _ = Footer::decode(&bytes, bytes.len() as u64);
        let _ = Index::parse(&bytes);
        let _ = Manifest::decode(&bytes);
    }

    #[test]
    fn manifest_round_trips(n in 1usize..6, dtype in proptest::sample::select(DType::ALL.to_vec())) {
        let fields = (0..n).map(|i| Field::new(format!("f{i}"), dtype, &[i as u64 + 1], Role::Other)).collect();
        let m = Manifest::new([4; 16], Schema::new(fields));
        prop_assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
    }
}
