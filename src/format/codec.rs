//! Chunk codecs: stored bytes ↔ raw bytes.

use super::{fp8, DType, Field, FormatError};

/// What a codec needs to know of a chunk's elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elements {
    /// Their dtype (the decoded one).
    pub dtype: DType,
    /// Elements of a row.
    pub row_elems: usize,
    /// Elements sharing a scale (codec `fp8`).
    pub group: usize,
}

impl Elements {
    /// The elements of `field`.
    pub fn of(field: &Field) -> Self {
        Elements {
            dtype: field.dtype,
            row_elems: field.row_elems() as usize,
            group: field.group() as usize,
        }
    }

    /// Elements of `dtype`, a row each (the lossless codecs need only the dtype).
    pub fn plain(dtype: DType) -> Self {
        Elements {
            dtype,
            row_elems: 1,
            group: 1,
        }
    }
}

/// How a chunk's payload is stored.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Codec {
    /// Raw bytes, aligned in the file: readable zero-copy from a mapping.
    #[default]
    None,
    /// Zstandard.
    Zstd,
    /// Zstandard after byte grouping: for elements of n bytes, byte k of every element is
    /// stored together (k = 0..n). Floats' exponent bytes then sit together and compress.
    ZstdByteGroup,
    /// FP8 E4M3FN codes with one f32 scale per group (lossy, FORMAT.md §4.1): only in fields
    /// the schema marks quantized, and in all of their chunks.
    Fp8,
}

impl Codec {
    /// Every codec, in code order.
    pub const ALL: [Codec; 4] = [Codec::None, Codec::Zstd, Codec::ZstdByteGroup, Codec::Fp8];
    /// The codecs that give back the bytes they were given: those a writer may use for any
    /// field (`WriteOptions::codec`).
    pub const LOSSLESS: [Codec; 3] = [Codec::None, Codec::Zstd, Codec::ZstdByteGroup];

    /// The code stored in the format.
    pub const fn code(self) -> u8 {
        match self {
            Codec::None => 0,
            Codec::Zstd => 1,
            Codec::ZstdByteGroup => 2,
            Codec::Fp8 => 3,
        }
    }

    /// The codec with this code, if known.
    pub fn from_code(code: u8) -> Option<Codec> {
        Codec::ALL.into_iter().find(|c| c.code() == code)
    }

    /// The name used on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            Codec::None => "none",
            Codec::Zstd => "zstd",
            Codec::ZstdByteGroup => "zstd-bytegroup",
            Codec::Fp8 => "fp8",
        }
    }

    /// The codec with this name, if any.
    pub fn from_name(name: &str) -> Option<Codec> {
        Codec::ALL.into_iter().find(|c| c.name() == name)
    }

    /// Encodes `raw`, whole rows of `elements`, at zstd `level`. `fp8` refuses a value that
    /// is not finite; zstd fails only where it cannot allocate.
    pub fn encode(
        self,
        raw: &[u8],
        elements: Elements,
        level: i32,
    ) -> Result<Vec<u8>, EncodeFailure> {
        let elem_size = elements.dtype.size();
        Ok(match self {
            Codec::None => raw.to_vec(),
            Codec::Zstd => zstd_compress(raw, level)?,
            Codec::ZstdByteGroup => zstd_compress(&group_bytes(raw, elem_size), level)?,
            Codec::Fp8 => fp8::quantize(raw, elements.dtype, elements.row_elems, elements.group)
                .map_err(EncodeFailure::NotFinite)?,
        })
    }

    /// Decodes `stored` into exactly `raw_len` bytes.
    pub fn decode(
        self,
        stored: &[u8],
        raw_len: u64,
        elements: Elements,
    ) -> Result<Vec<u8>, FormatError> {
        let len = usize::try_from(raw_len).map_err(|_| FormatError::Invalid {
            structure: "chunk payload",
            what: "raw_len",
            value: raw_len,
            rule: "addressable on this machine".into(),
        })?;
        let mut out = vec![0u8; len];
        self.decode_into(stored, &mut out, elements, &mut Vec::new())?;
        Ok(out)
    }

    /// Decodes `stored` into `out`, which must be exactly the raw length: straight into it
    /// for zstd and fp8, through `scratch` (reused between calls) for byte-grouped zstd.
    pub fn decode_into(
        self,
        stored: &[u8],
        out: &mut [u8],
        elements: Elements,
        scratch: &mut Vec<u8>,
    ) -> Result<(), FormatError> {
        let elem_size = elements.dtype.size();
        let got = match self {
            Codec::None => {
                if stored.len() == out.len() {
                    out.copy_from_slice(stored);
                }
                stored.len()
            }
            Codec::Zstd => zstd_decompress_into(stored, out)?,
            Codec::ZstdByteGroup => {
                scratch.resize(out.len(), 0);
                let n = zstd_decompress_into(stored, scratch)?;
                if n == out.len() {
                    ungroup_into(scratch, out, elem_size);
                }
                n
            }
            Codec::Fp8 => {
                if !out
                    .len()
                    .is_multiple_of(elem_size * elements.row_elems.max(1))
                {
                    return Err(FormatError::Invalid {
                        structure: "chunk payload",
                        what: "raw length",
                        value: out.len() as u64,
                        rule: format!("whole rows of {} elements", elements.row_elems),
                    });
                }
                fp8::dequantize_into(
                    stored,
                    out,
                    elements.dtype,
                    elements.row_elems,
                    elements.group,
                )?;
                out.len()
            }
        };
        if got != out.len() {
            return Err(FormatError::Invalid {
                structure: "chunk payload",
                what: "decoded length",
                value: got as u64,
                rule: format!("the chunk's raw length, {}", out.len()),
            });
        }
        Ok(())
    }
}

/// Why [`Codec::encode`] failed.
#[derive(Debug, Clone, PartialEq)]
pub enum EncodeFailure {
    /// A value FP8 cannot stand for.
    NotFinite(fp8::NotFinite),
    /// zstd could not compress (it could not allocate): what it said.
    Zstd(String),
}

fn zstd_compress(raw: &[u8], level: i32) -> Result<Vec<u8>, EncodeFailure> {
    // Levels out of range are clamped; what is left to fail is an allocation. Never the raw
    // bytes under the zstd codec: they would not decode.
    let level = level.clamp(1, 19);
    zstd::bulk::compress(raw, level).map_err(|e| EncodeFailure::Zstd(e.to_string()))
}

/// The first bytes of a zstd frame (0xFD2FB528, little-endian).
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

/// Decompresses the one frame `stored` into `out`; the bytes written. A frame that would not
/// fit is an error: a hostile frame cannot grow the output.
fn zstd_decompress_into(stored: &[u8], out: &mut [u8]) -> Result<usize, FormatError> {
    let cap = out.len();
    let invalid = |e: std::io::Error| FormatError::Invalid {
        structure: "chunk payload",
        what: "zstd frame",
        value: stored.len() as u64,
        rule: format!("a valid zstd frame of at most {cap} bytes ({e})"),
    };
    // One zstd frame and nothing else (FORMAT.md §4): the library would also take several
    // frames in a row, skippable frames of any bytes, and the frames of zstd before 1.0.
    let one_frame = stored.starts_with(&ZSTD_MAGIC)
        && zstd::zstd_safe::find_frame_compressed_size(stored) == Ok(stored.len());
    if !one_frame {
        return Err(invalid(std::io::Error::other(
            "not one zstd frame: another magic number, or bytes after the frame",
        )));
    }
    thread_local! {
        static CONTEXT: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
            const { std::cell::RefCell::new(None) };
    }
    CONTEXT.with(|context| {
        let mut context = context.borrow_mut();
        let decompressor = match &mut *context {
            Some(d) => d,
            None => context.insert(zstd::bulk::Decompressor::new().map_err(invalid)?),
        };
        decompressor
            .decompress_to_buffer(stored, out)
            .map_err(invalid)
    })
}

/// Byte-groups `raw`: all byte 0s of each `elem_size`-byte element, then all byte 1s, ...
/// A trailing partial element is kept as is.
pub fn group_bytes(raw: &[u8], elem_size: usize) -> Vec<u8> {
    if elem_size <= 1 {
        return raw.to_vec();
    }
    let n = raw.len() / elem_size;
    let mut out = vec![0u8; raw.len()];
    for k in 0..elem_size {
        let dst = &mut out[k * n..(k + 1) * n];
        for (d, e) in dst.iter_mut().zip(raw.chunks_exact(elem_size)) {
            *d = e[k];
        }
    }
    out[n * elem_size..].copy_from_slice(&raw[n * elem_size..]);
    out
}

/// Inverse of [`group_bytes`].
pub fn ungroup_bytes(grouped: &[u8], elem_size: usize) -> Vec<u8> {
    let mut out = vec![0u8; grouped.len()];
    ungroup_into(grouped, &mut out, elem_size);
    out
}

/// [`ungroup_bytes`] into `out` (as long as `grouped`). Two- and four-byte elements (bf16,
/// f16, f32, i32), the common case, take loops the compiler vectorizes.
pub fn ungroup_into(grouped: &[u8], out: &mut [u8], elem_size: usize) {
    debug_assert_eq!(grouped.len(), out.len());
    if elem_size <= 1 {
        out.copy_from_slice(grouped);
        return;
    }
    let n = grouped.len() / elem_size;
    match elem_size {
        2 => {
            let (lo, hi) = grouped[..2 * n].split_at(n);
            for ((o, &a), &b) in out.chunks_exact_mut(2).zip(lo).zip(hi) {
                o.copy_from_slice(&u16::from_le_bytes([a, b]).to_le_bytes());
            }
        }
        4 => {
            let (b0, rest) = grouped[..4 * n].split_at(n);
            let (b1, rest) = rest.split_at(n);
            let (b2, b3) = rest.split_at(n);
            let planes = b0.iter().zip(b1).zip(b2).zip(b3);
            for (o, (((&a, &b), &c), &d)) in out.chunks_exact_mut(4).zip(planes) {
                o.copy_from_slice(&[a, b, c, d]);
            }
        }
        _ => {
            for k in 0..elem_size {
                let src = &grouped[k * n..(k + 1) * n];
                for (s, e) in src.iter().zip(out.chunks_exact_mut(elem_size)) {
                    e[k] = *s;
                }
            }
        }
    }
    out[n * elem_size..].copy_from_slice(&grouped[n * elem_size..]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn every_lossless_codec_round_trips(raw in proptest::collection::vec(any::<u8>(), 0..2000), dtype in proptest::sample::select(DType::ALL.to_vec())) {
            for codec in Codec::LOSSLESS {
                let elements = Elements::plain(dtype);
                let stored = codec.encode(&raw, elements, 3).unwrap();
                prop_assert_eq!(codec.decode(&stored, raw.len() as u64, elements).unwrap(), raw.clone());
            }
        }

        #[test]
        fn grouping_round_trips(raw in proptest::collection::vec(any::<u8>(), 0..500), elem in 1usize..9) {
            prop_assert_eq!(ungroup_bytes(&group_bytes(&raw, elem), elem), raw);
        }

        #[test]
        fn ungrouping_matches_the_definition(raw in proptest::collection::vec(any::<u8>(), 0..500), elem in 1usize..9) {
            // Byte j of element i comes from plane j, position i; a partial tail is copied.
            let out = ungroup_bytes(&raw, elem);
            let n = raw.len() / elem;
            for (i, e) in out[..n * elem].chunks(elem).enumerate() {
                for (j, b) in e.iter().enumerate() {
                    prop_assert_eq!(*b, raw[j * n + i]);
                }
            }
            prop_assert_eq!(&out[n * elem..], &raw[n * elem..]);
        }
    }

    #[test]
    fn only_one_zstd_frame_decodes() {
        let raw: Vec<u8> = (0..1024u32).map(|i| (i % 7) as u8).collect();
        let elements = Elements::plain(DType::U8);
        let one = Codec::Zstd.encode(&raw, elements, 3).unwrap();
        assert_eq!(Codec::Zstd.decode(&one, 1024, elements).unwrap(), raw);
        let half = Codec::Zstd.encode(&raw[..512], elements, 3).unwrap();
        // Two frames, which decode to 1024 bytes together.
        let two = [half.clone(), half].concat();
        // A skippable frame (magic 0x184D2A50, length 7) of any bytes after the frame.
        let mut skippable = one.clone();
        skippable.extend_from_slice(&[0x50, 0x2A, 0x4D, 0x18, 7, 0, 0, 0]);
        skippable.extend_from_slice(b"GARBAGE");
        let mut leading = vec![0x50, 0x2A, 0x4D, 0x18, 0, 0, 0, 0];
        leading.extend_from_slice(&one);
        for (what, stored) in [
            ("two frames", two),
            ("skippable after", skippable),
            ("skippable before", leading),
        ] {
            let e = Codec::Zstd.decode(&stored, 1024, elements).unwrap_err();
            assert!(e.to_string().contains("not one zstd frame"), "{what}: {e}");
        }
    }

    #[test]
    fn decode_refuses_wrong_length() {
        let u8s = Elements::plain(DType::U8);
        let stored = Codec::Zstd.encode(&[7u8; 100], u8s, 3).unwrap();
        assert!(Codec::Zstd.decode(&stored, 99, u8s).is_err());
        assert!(Codec::Zstd.decode(&stored, 101, u8s).is_err());
        assert!(Codec::None.decode(&[1, 2, 3], 4, u8s).is_err());
        assert!(Codec::Zstd.decode(b"not zstd", 10, u8s).is_err());
        let bf16 = Elements {
            dtype: DType::BF16,
            row_elems: 4,
            group: 2,
        };
        let stored = Codec::Fp8.encode(&[0x80, 0x3f].repeat(8), bf16, 3).unwrap();
        assert_eq!(stored.len(), 4 * 4 + 8);
        assert_eq!(
            Codec::Fp8.decode(&stored, 16, bf16).unwrap(),
            [0x80, 0x3f].repeat(8)
        );
        assert!(Codec::Fp8.decode(&stored, 14, bf16).is_err());
        assert!(Codec::Fp8.decode(&stored, 18, bf16).is_err());
    }

    #[test]
    fn codes_round_trip() {
        for c in Codec::ALL {
            assert_eq!(Codec::from_code(c.code()), Some(c));
            assert_eq!(Codec::from_name(c.name()), Some(c));
        }
        assert_eq!(Codec::from_code(4), None);
    }
}
