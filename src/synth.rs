//! Synthetic, activation-like data for demos, benchmarks and golden files.
//!
//! Hidden states of large models are not white noise: each channel has its own scale, and a
//! few channels carry outliers tens of times larger than the rest. The generator reproduces
//! that shape so compression ratios and speeds measured on it mean something.

use half::bf16;

use crate::format::{eagle3, CaptureInfo, CapturePoint, DType, Field, Role, Schema};

/// A small, fast, deterministic generator (SplitMix64).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        match (hi - lo).checked_add(1) {
            Some(n) => lo + self.next_u64() % n,
            None => self.next_u64(), // the whole of u64
        }
    }

    /// Roughly standard normal (sum of four uniforms, rescaled): cheap and bell-shaped.
    pub fn normalish(&mut self) -> f32 {
        let s: f32 = (0..4).map(|_| self.unit()).sum();
        (s - 2.0) * 1.732
    }
}

/// Per-channel scales of one layer: log-normal-ish, with ~0.5% outlier channels 20–80× larger.
pub fn channel_scales(rng: &mut Rng, hidden: usize) -> Vec<f32> {
    (0..hidden)
        .map(|_| {
            let base = (rng.normalish() * 0.5).exp() * 0.6;
            if rng.unit() < 0.005 {
                base * (20.0 + 60.0 * rng.unit())
            } else {
                base
            }
        })
        .collect()
}

/// `rows` rows of activation-like bf16 with the given channel scales, as little-endian bytes.
pub fn activations(rng: &mut Rng, rows: usize, scales: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(rows * scales.len() * 2);
    for _ in 0..rows {
        for &s in scales {
            out.extend_from_slice(&bf16::from_f32(rng.normalish() * s).to_le_bytes());
        }
    }
    out
}

/// The schema of a capture of `layers` (layer inputs) of a model with hidden size `hidden`:
/// `input_ids` (i32), `loss_mask` (u8) and `hidden.{layer}` (bf16) fields.
pub fn capture_schema(model: &str, num_layers: u32, hidden: u64, layers: &[u32]) -> Schema {
    let mut fields = vec![
        Field::new(eagle3::INPUT_IDS, DType::I32, &[], Role::TokenIds),
        Field::new(eagle3::LOSS_MASK, DType::U8, &[], Role::LossMask),
    ];
    for &layer in layers {
        fields.push(Field::new(
            eagle3::hidden_field(layer),
            DType::BF16,
            &[hidden],
            Role::HiddenState {
                layer,
                point: CapturePoint::LayerInput,
            },
        ));
    }
    Schema {
        fields,
        capture: Some(CaptureInfo {
            model: model.to_string(),
            revision: None,
            config_hash: None,
            num_layers,
            hidden_size: hidden,
            dtype: DType::BF16,
            tp_size: 1,
            tool: "hspack synth".into(),
            tool_version: env!("CARGO_PKG_VERSION").into(),
        }),
    }
}

/// One synthetic sample for [`capture_schema`]: field name and bytes, in schema order. Loss
/// mask: zero for a prompt of ~30% of the rows, one after.
pub fn capture_sample(rng: &mut Rng, rows: usize, scales: &[Vec<f32>]) -> Vec<(String, Vec<u8>)> {
    let ids: Vec<u8> = (0..rows)
        .flat_map(|_| (rng.range(0, 163_839) as i32).to_le_bytes())
        .collect();
    let prompt = rows * 3 / 10;
    let mask: Vec<u8> = (0..rows).map(|r| u8::from(r >= prompt)).collect();
    let mut out = vec![
        (eagle3::INPUT_IDS.to_string(), ids),
        (eagle3::LOSS_MASK.to_string(), mask),
    ];
    for (i, s) in scales.iter().enumerate() {
        out.push((format!("#{i}"), activations(rng, rows, s)));
    }
    out
}

/// Like [`capture_sample`], with the hidden fields named after `layers`.
pub fn named_capture_sample(
    rng: &mut Rng,
    rows: usize,
    layers: &[u32],
    scales: &[Vec<f32>],
) -> Vec<(String, Vec<u8>)> {
    let mut s = capture_sample(rng, rows, scales);
    for (entry, layer) in s[2..].iter_mut().zip(layers) {
        entry.0 = eagle3::hidden_field(*layer);
    }
    s
}
