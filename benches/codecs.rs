//! Criterion micro-benchmarks of the per-chunk work: hashing, codecs, index lookups.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use hspack::format::{Codec, DType, Elements, Index, IndexBuilder};
use hspack::synth::{activations, channel_scales, Rng};

fn chunk() -> Vec<u8> {
    let mut rng = Rng::new(1);
    let scales = channel_scales(&mut rng, 7168);
    // 146 rows of 7168 bf16: one 2 MiB chunk.
    activations(&mut rng, 146, &scales)
}

fn codecs(c: &mut Criterion) {
    let raw = chunk();
    let mut g = c.benchmark_group("chunk_2MiB_bf16");
    g.throughput(Throughput::Bytes(raw.len() as u64));
    g.bench_function("blake3", |b| b.iter(|| blake3::hash(&raw)));
    // One scale per row of 7168 for fp8, as for one layer of a hidden state.
    let elements = Elements {
        dtype: DType::BF16,
        row_elems: 7168,
        group: 7168,
    };
    for codec in Codec::ALL {
        let stored = codec.encode(&raw, elements, 3).unwrap();
        g.bench_with_input(BenchmarkId::new("encode", codec.name()), &raw, |b, raw| {
            b.iter(|| codec.encode(raw, elements, 3).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("decode", codec.name()), &stored, |b, s| {
            b.iter(|| codec.decode(s, raw.len() as u64, elements).unwrap())
        });
    }
    g.finish();
}

fn index(c: &mut Criterion) {
    let mut g = c.benchmark_group("index");
    for n in [10_000u64, 1_000_000] {
        let mut ib = IndexBuilder::new(0);
        for i in 0..n {
            ib.push_sample(&format!("k{i}"), 1, u64::MAX, 0, &[]);
        }
        let bytes = ib.encode();
        let index = Index::parse(&bytes).unwrap();
        let mut rng = Rng::new(2);
        g.bench_function(BenchmarkId::new("find_key", n), |b| {
            b.iter(|| {
                index
                    .find_key(&format!("k{}", rng.range(0, n - 1)))
                    .unwrap()
            })
        });
        g.bench_function(BenchmarkId::new("sample", n), |b| {
            b.iter(|| index.sample(rng.range(0, n - 1)).unwrap())
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(2));
    targets = codecs, index
}
criterion_main!(benches);
