//! Writes the golden test vectors: `hspack-golden [OUT]` (default `format-spec/golden`).
//!
//! What this writes is manifest version 4: `v4/segments`, a field of every dtype and samples
//! whose lengths sit at row-block boundaries ±1, one sample a shard, so that 8 commits'
//! segments are merged into one of level 1 and a ninth follows; `v4/stacked`, a dataset with a
//! stacked-layer field; `v4/leased`, written under a writer lease (`writer.lease`, file names
//! after it); `v5/quantized` (manifest version 5), fields stored as fp8. Deterministic: a
//! fixed dataset id and generated data, so the bytes only change when the format does.
//!
//! The older vectors are kept as they were written, to be read: `v1/` (one dataset per codec,
//! two shards), `v2/stacked` (manifest version 2), `v3/leased` (manifest version 3).

use std::path::{Path, PathBuf};

use hspack::format::{CapturePoint, DType};
use hspack::io::Storage;
use hspack::synth::Rng;
use hspack::{Codec, DatasetWriter, Field, Role, Schema, WriteOptions};

/// Row lengths: 0, 1, and around the 4-row blocks of the 24-byte f64 rows and the 16-row
/// blocks of the 6-byte 16-bit rows.
pub const LENGTHS: [usize; 9] = [0, 1, 3, 4, 5, 15, 16, 17, 2];

/// The golden schema: one `[3]`-shaped field per dtype.
pub fn schema() -> Schema {
    let fields = DType::ALL
        .iter()
        .map(|&d| {
            let role = match d {
                DType::I32 => Role::TokenIds,
                DType::U8 => Role::LossMask,
                _ => Role::Other,
            };
            Field::new(d.name(), d, &[3], role)
        })
        .collect();
    Schema::new(fields)
}

/// The stacked schema: token ids, three layers stacked in one `[3, 4]` bf16 field, and one
/// final-norm layer.
pub fn stacked_schema() -> Schema {
    Schema::new(vec![
        Field::new("input_ids", DType::I32, &[], Role::TokenIds),
        Field::new(
            "aux_hidden_state",
            DType::BF16,
            &[3, 4],
            Role::HiddenStates {
                layers: vec![2, 30, 58],
                point: CapturePoint::LayerInput,
            },
        ),
        Field::new(
            "hidden.61",
            DType::BF16,
            &[4],
            Role::HiddenState {
                layer: 61,
                point: CapturePoint::FinalNorm,
            },
        ),
    ])
}

/// The quantized schema (manifest version 5): token ids, three layers stacked in a `[3, 4]`
/// bf16 field stored as fp8 with a scale per layer, an f32 `[4]` field stored as fp8 with a
/// scale per 2 elements, an f16 `[6]` field stored as fp8, and a bf16 `[4]` field stored
/// exactly.
pub fn quantized_schema() -> Schema {
    let hidden = |name: &str, dtype, shape: &[u64], layer| {
        Field::new(
            name,
            dtype,
            shape,
            Role::HiddenState {
                layer,
                point: CapturePoint::LayerInput,
            },
        )
    };
    Schema::new(vec![
        Field::new("input_ids", DType::I32, &[], Role::TokenIds),
        Field::new(
            "aux_hidden_state",
            DType::BF16,
            &[3, 4],
            Role::HiddenStates {
                layers: vec![2, 30, 58],
                point: CapturePoint::LayerInput,
            },
        )
        .quantize_fp8(None),
        hidden("hidden.f32", DType::F32, &[4], 7).quantize_fp8(Some(2)),
        hidden("hidden.f16", DType::F16, &[6], 8).quantize_fp8(None),
        hidden("hidden.exact", DType::BF16, &[4], 9),
    ])
}

/// A value of the quantized golden samples: `m · 2^e`, `m` in -1000..=1000 and `e` in
/// -16..=5 drawn from one `next_u64`, so one group spans large values, small ones and FP8's
/// subnormals; every row whose sample number plus row number is a multiple of 5 is zeros.
pub fn quantized_value(rng: &mut Rng) -> f32 {
    let r = rng.next_u64();
    let m = ((r >> 11) % 2001) as f32 - 1000.0;
    let e = ((r >> 3) % 22) as i32 - 16;
    m * f32::powi(2.0, e)
}

/// The folders [`write_all`] writes, relative to its root.
pub const WRITTEN: [&str; 8] = [
    "v4/segments",
    "v4/stacked",
    "v4/leased",
    "v5/quantized",
    "store-v1",
    "store-v1/packs",
    "store-v1/datasets",
    "store-v1/captures",
];

/// The capture config the golden capture file (§11.7) records the `stacked` samples under,
/// each keyed by its `input_ids`.
pub fn capture_config() -> hspack::store::captures::CaptureConfig {
    hspack::store::captures::CaptureConfig {
        model: "golden/model".into(),
        revision: None,
        config_hash: Some("0123abcd".into()),
        engine: "transformers".into(),
        deterministic: true,
        dtype: "bf16".into(),
        layers: vec![2, 30, 58, 61],
        fields: stacked_schema()
            .fields
            .iter()
            .map(|f| f.name.clone())
            .collect(),
    }
}

pub fn write_all(root: &Path) -> hspack::Result<()> {
    let v4 = root.join("v4");
    write_one(
        &v4.join("segments"),
        schema(),
        Codec::None,
        *b"hspack-golden-v4",
        1,
    )?;
    write_one(
        &v4.join("stacked"),
        stacked_schema(),
        Codec::Zstd,
        *b"hspack-golden-v4",
        5,
    )?;
    write_leased(&v4.join("leased"))?;
    write_quantized(&root.join("v5").join("quantized"))?;
    write_store(&root.join("store-v1"), &v4)
}

/// `v5/quantized`: [`LENGTHS`] samples of [`quantized_schema`], values from
/// [`quantized_value`] (token ids: the row numbers), one shard, chunks of at most 96 stored
/// bytes' worth of rows.
fn write_quantized(dir: &Path) -> hspack::Result<()> {
    let _ = std::fs::remove_dir_all(dir);
    let schema = quantized_schema();
    let options = WriteOptions {
        chunk_bytes: Some(96),
        align_log2: Some(6),
        durable: false,
        dataset_id: Some(*b"hspack-golden-v5"),
        ..WriteOptions::default()
    };
    let mut w = DatasetWriter::create(dir, schema.clone(), options)?;
    let mut rng = Rng::new(5);
    for (i, &rows) in LENGTHS.iter().enumerate() {
        let data: Vec<Vec<u8>> = schema
            .fields
            .iter()
            .map(|f| {
                let mut out = Vec::new();
                for r in 0..rows {
                    for _ in 0..f.row_elems() {
                        let v = match (i + r) % 5 {
                            0 => 0.0,
                            _ => quantized_value(&mut rng),
                        };
                        match f.dtype {
                            DType::I32 => out.extend_from_slice(&(r as i32).to_le_bytes()),
                            DType::F32 => out.extend_from_slice(&v.to_le_bytes()),
                            DType::F16 => {
                                out.extend_from_slice(&half::f16::from_f32(v).to_le_bytes())
                            }
                            _ => out.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes()),
                        }
                    }
                }
                out
            })
            .collect();
        let fields: Vec<(&str, &[u8])> = schema
            .fields
            .iter()
            .zip(&data)
            .map(|(f, d)| (f.name.as_str(), d.as_slice()))
            .collect();
        w.append(&format!("golden-{i}"), &fields)?;
    }
    w.finish()?;
    Ok(())
}

/// `store-v1`: a store holding `v4/segments` as `segments` and again as `again` (a
/// re-import: nothing new stored) and `v4/stacked` as `stacked`, one shard at a time so the
/// packs and runs come out the same on every run; and one capture file recording every
/// `stacked` sample under [`capture_config`].
fn write_store(dir: &Path, v4: &Path) -> hspack::Result<()> {
    use hspack::store::Store;
    use std::sync::Arc;
    let _ = std::fs::remove_dir_all(dir);
    let store = Arc::new(Store::init_with_id(dir, *b"hspack-golden-st")?);
    let options = hspack::transfer::CopyOptions {
        jobs: 1,
        ..Default::default()
    };
    for (name, src) in [
        ("segments", "segments"),
        ("stacked", "stacked"),
        ("again", "segments"),
    ] {
        let src = hspack::Dataset::open(v4.join(src))?;
        let dst: Arc<dyn Storage> = Arc::new(store.dataset(name)?);
        hspack::transfer::copy(&src, &dst, &options, &|_| {})?;
    }
    use hspack::store::captures::{sample_digest, sample_tensors};
    let stacked = hspack::Dataset::open(dir.join("stacked"))?;
    let records = (0..stacked.len())
        .map(|i| {
            let tensors = sample_tensors(&stacked, i)?;
            let tokens: Vec<i64> = tensors[0]
                .1
                .as_slice::<i32>()
                .expect("i32 input_ids")
                .iter()
                .map(|&t| t.into())
                .collect();
            let digest = sample_digest(tensors.iter().map(|(n, t)| (n.as_str(), t.bytes())));
            Ok((
                capture_config().key(&tokens, None),
                digest,
                stacked.sample(i)?.key().to_string(),
            ))
        })
        .collect::<hspack::Result<Vec<_>>>()?;
    store.record_captures("stacked", &records)?;
    for transient in ["locks", "staging"] {
        let _ = std::fs::remove_dir_all(dir.join(transient));
    }
    Ok(())
}

/// `v3/leased`: the v1 schema written under a writer lease (manifest version 3), as a writer
/// into object storage writes it; files from memory storage, so the lease is fixed.
fn write_leased(dir: &Path) -> hspack::Result<()> {
    let memory = hspack::io::MemoryStorage::new("golden-v3");
    memory.lease_as(LEASE);
    let storage: std::sync::Arc<dyn Storage> = std::sync::Arc::new(memory.clone());
    write_into(storage, schema(), Codec::None, *b"hspack-golden-v4", 5)?;
    let _ = std::fs::remove_dir_all(dir);
    let failed = |path: &Path, op| {
        let path = path.to_path_buf();
        move |source| hspack::Error::Io { path, op, source }
    };
    std::fs::create_dir_all(dir).map_err(failed(dir, "create"))?;
    for name in memory.list()? {
        let bytes = memory.get(&name).unwrap_or_default();
        let path = dir.join(&name);
        std::fs::write(&path, bytes).map_err(failed(&path, "write"))?;
    }
    Ok(())
}

/// The writer lease of `v3/leased`.
pub const LEASE: &str = "6c6561736564676f6c64656e2d763321";

fn write_one(
    dir: &Path,
    schema: Schema,
    codec: Codec,
    id: [u8; 16],
    shard_samples: u64,
) -> hspack::Result<()> {
    let _ = std::fs::remove_dir_all(dir);
    write_into(
        hspack::io::open_location(dir)?,
        schema,
        codec,
        id,
        shard_samples,
    )
}

fn write_into(
    storage: std::sync::Arc<dyn Storage>,
    schema: Schema,
    codec: Codec,
    id: [u8; 16],
    shard_samples: u64,
) -> hspack::Result<()> {
    let options = WriteOptions {
        chunk_bytes: Some(96),
        shard_samples,
        codec,
        align_log2: Some(6),
        durable: false,
        dataset_id: Some(id),
        ..WriteOptions::default()
    };
    let mut w = DatasetWriter::create_in(storage, schema.clone(), options)?;
    let mut rng = Rng::new(1);
    for (i, &rows) in LENGTHS.iter().enumerate() {
        let data: Vec<Vec<u8>> = schema
            .fields
            .iter()
            .map(|f| {
                let n = rows * f.row_bytes() as usize;
                match f.dtype {
                    DType::Bool | DType::U8 => (0..n).map(|_| (rng.next_u64() & 1) as u8).collect(),
                    _ => (0..n).map(|_| rng.next_u64() as u8).collect(),
                }
            })
            .collect();
        let fields: Vec<(&str, &[u8])> = schema
            .fields
            .iter()
            .zip(&data)
            .map(|(f, d)| (f.name.as_str(), d.as_slice()))
            .collect();
        w.append(&format!("golden-{i}"), &fields)?;
    }
    w.finish()?;
    Ok(())
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    let out = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("format-spec/golden"));
    match write_all(&out) {
        Ok(()) => {
            println!("wrote golden vectors to {}", out.display());
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("hspack-golden: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
