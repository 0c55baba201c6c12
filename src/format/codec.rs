//! Chunk codecs: stored bytes ↔ raw bytes.

use super::FormatError;

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
}

impl Codec {
    /// Every codec, in code order.
    pub const ALL: [Codec; 3] = [Codec::None, Codec::Zstd, Codec::ZstdByteGroup];

    /// The code stored in the format.
    pub const fn code(self) -> u8 {
        match self {
            Codec::None => 0,
            Codec::Zstd => 1,
            Codec::ZstdByteGroup => 2,
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
        }
    }

    /// The codec with this name, if any.
    pub fn from_name(name: &str) -> Option<Codec> {
        Codec::ALL.into_iter().find(|c| c.name() == name)
    }

    /// Encodes `raw`, whose elements are `elem_size` bytes, at zstd `level`.
    pub fn encode(self, raw: &[u8], elem_size: usize, level: i32) -> Vec<u8> {
        match self {
            Codec::None => raw.to_vec(),
            Codec::Zstd => zstd_compress(raw, level),
            Codec::ZstdByteGroup => zstd_compress(&group_bytes(raw, elem_size), level),
        }
    }

    /// Decodes `stored` into exactly `raw_len` bytes.
    pub fn decode(
        self,
        stored: &[u8],
        raw_len: u64,
        elem_size: usize,
    ) -> Result<Vec<u8>, FormatError> {
        let len = usize::try_from(raw_len).map_err(|_| FormatError::Invalid {
            structure: "chunk payload",
            what: "raw_len",
            value: raw_len,
            rule: "addressable on this machine".into(),
        })?;
        let mut out = vec![0u8; len];
        self.decode_into(stored, &mut out, elem_size, &mut Vec::new())?;
        Ok(out)
    }

    /// Decodes `stored` into `out`, which must be exactly the raw length: straight into it
    /// for zstd, through `scratch` (reused between calls) for byte-grouped zstd.
    pub fn decode_into(
        self,
        stored: &[u8],
        out: &mut [u8],
        elem_size: usize,
        scratch: &mut Vec<u8>,
    ) -> Result<(), FormatError> {
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

fn zstd_compress(raw: &[u8], level: i32) -> Vec<u8> {
    // Compressing into a Vec cannot fail for in-range levels; clamp to be sure.
    let level = level.clamp(1, 19);
    zstd::bulk::compress(raw, level).unwrap_or_else(|_| raw.to_vec())
}

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
        fn every_codec_round_trips(raw in proptest::collection::vec(any::<u8>(), 0..2000), elem in 1usize..9) {
            for codec in Codec::ALL {
                let stored = codec.encode(&raw, elem, 3);
                prop_assert_eq!(codec.decode(&stored, raw.len() as u64, elem).unwrap(), raw.clone());
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
    fn decode_refuses_wrong_length() {
        let stored = Codec::Zstd.encode(&[7u8; 100], 1, 3);
        assert!(Codec::Zstd.decode(&stored, 99, 1).is_err());
        assert!(Codec::Zstd.decode(&stored, 101, 1).is_err());
        assert!(Codec::None.decode(&[1, 2, 3], 4, 1).is_err());
        assert!(Codec::Zstd.decode(b"not zstd", 10, 1).is_err());
    }

    #[test]
    fn codes_round_trip() {
        for c in Codec::ALL {
            assert_eq!(Codec::from_code(c.code()), Some(c));
            assert_eq!(Codec::from_name(c.name()), Some(c));
        }
        assert_eq!(Codec::from_code(3), None);
    }
}
