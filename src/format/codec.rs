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
        const S: &str = "chunk payload";
        let raw_len_usize = usize::try_from(raw_len).map_err(|_| FormatError::Invalid {
            structure: S,
            what: "raw_len",
            value: raw_len,
            rule: "addressable on this machine".into(),
        })?;
        let out = match self {
            Codec::None => stored.to_vec(),
            Codec::Zstd => zstd_decompress(stored, raw_len_usize)?,
            Codec::ZstdByteGroup => {
                ungroup_bytes(&zstd_decompress(stored, raw_len_usize)?, elem_size)
            }
        };
        if out.len() as u64 != raw_len {
            return Err(FormatError::Invalid {
                structure: S,
                what: "decoded length",
                value: out.len() as u64,
                rule: format!("the chunk's raw length, {raw_len}"),
            });
        }
        Ok(out)
    }
}

fn zstd_compress(raw: &[u8], level: i32) -> Vec<u8> {
    // Compressing into a Vec cannot fail for in-range levels; clamp to be sure.
    let level = level.clamp(1, 19);
    zstd::bulk::compress(raw, level).unwrap_or_else(|_| raw.to_vec())
}

fn zstd_decompress(stored: &[u8], raw_len: usize) -> Result<Vec<u8>, FormatError> {
    // `decompress` never writes past `raw_len`, so a hostile frame cannot grow the output.
    zstd::bulk::decompress(stored, raw_len).map_err(|e| FormatError::Invalid {
        structure: "chunk payload",
        what: "zstd frame",
        value: stored.len() as u64,
        rule: format!("a valid zstd frame of at most {raw_len} bytes ({e})"),
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
    if elem_size <= 1 {
        return grouped.to_vec();
    }
    let n = grouped.len() / elem_size;
    let mut out = vec![0u8; grouped.len()];
    for k in 0..elem_size {
        let src = &grouped[k * n..(k + 1) * n];
        for (s, e) in src.iter().zip(out.chunks_exact_mut(elem_size)) {
            e[k] = *s;
        }
    }
    out[n * elem_size..].copy_from_slice(&grouped[n * elem_size..]);
    out
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
