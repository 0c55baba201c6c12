//! How a dataset is written (`WriteOptions`) and what writing it left (`WriteStats`).

use crate::error::{Error, Result};
use crate::format::{Codec, Field, DEFAULT_ALIGN_LOG2, MAX_ALIGN_LOG2, MIN_ALIGN_LOG2};

/// Options for writing.
#[derive(Debug, Clone)]
pub struct WriteOptions {
    /// Target bytes of a chunk (a row block); rows are never split. `None` (the default)
    /// picks by codec: uncompressed, 256 MiB (the largest chunk), so a field of a sample is
    /// one chunk and reading it is zero-copy; compressed, 2 MiB, so a token range decodes
    /// little. A token-range read hashes its whole chunk on first touch (`check="once"`):
    /// datasets read mostly in small random ranges may prefer smaller chunks.
    pub chunk_bytes: Option<u64>,
    /// Token blocks: when set, every chunk of a field starts at a multiple of this many rows
    /// and holds whole blocks, as few as make 64 KiB (16 rows of 7168 bf16: one block, 229
    /// KB), whatever `chunk_bytes` says. Samples that share a prefix of rows then share their
    /// first chunks byte for byte, which a store keeps once. Default `None`; writing into a
    /// store (`STORE/NAME`) defaults to 16.
    pub block_rows: Option<u64>,
    /// A shard is committed once it holds this many bytes. Default 2 GiB.
    pub shard_bytes: u64,
    /// A shard is committed once it holds this many samples. Default 65 536.
    pub shard_samples: u64,
    /// Codec of new chunks of fields stored exactly: a lossless one. Default none (zero-copy
    /// reads). A field the schema marks quantized is stored with its own (`fp8`).
    pub codec: Codec,
    /// zstd level for the zstd codecs. Default 3.
    pub zstd_level: i32,
    /// log2 of the payload alignment of uncompressed chunks. `None` (the default): 12 (4
    /// KiB), so shards map zero-copy and direct I/O reads them; writing into a store, 6 (64
    /// bytes), the alignment of its packs' blobs: there payloads are read from the packs, and
    /// a shard's own padding would only pad its skeleton.
    pub align_log2: Option<u8>,
    /// fsync files and folders at commits. Default true; turn off only for scratch data: off,
    /// a crash of the process still loses nothing committed (the kernel has every byte), but
    /// a power cut may lose commits or leave the dataset unreadable (its manifest empty).
    pub durable: bool,
    /// Dataset id of a new dataset; random when `None` (set it only for reproducible files).
    pub dataset_id: Option<[u8; 16]>,
    /// Let other writers append to the dataset at the same time: the ranks of one job, or
    /// processes on several nodes sharing a folder or a bucket, each opening its own writer
    /// with `shared` on. Each commit takes the dataset's commit lock for a moment, reads the
    /// manifest, and appends its shard after what the others committed, so a sample's ordinal
    /// is known only once it is committed (find samples by key). Keys must differ across the
    /// writers: a commit holding a key another writer committed first is refused. Default off:
    /// one writer holds the dataset, and a second is refused.
    pub shared: bool,
    /// Quantized fields arrive in their stored form (FORMAT.md §4.1) instead of as values: for
    /// a sample of T rows of E elements in groups of G, T·E/G little-endian f32 scales, then
    /// T·E FP8 codes, as a capture writer that quantizes on the GPU copies them. The writer
    /// checks them (scales finite and positive, no NaN code) and cuts them into chunks.
    /// Default off: quantized fields are given as values and quantized here.
    pub prequantized: bool,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            chunk_bytes: None,
            block_rows: None,
            shard_bytes: 2 << 30,
            shard_samples: 65_536,
            codec: Codec::None,
            zstd_level: 3,
            align_log2: None,
            durable: true,
            dataset_id: None,
            shared: false,
            prequantized: false,
        }
    }
}

/// Default chunk target of uncompressed chunks: the largest chunk the format allows.
pub const RAW_CHUNK_BYTES: u64 = crate::format::index::MAX_CHUNK_BYTES;
/// The least bytes of a chunk made of token blocks ([`WriteOptions::block_rows`]).
pub const BLOCK_CHUNK_BYTES: u64 = 64 << 10;
/// Default chunk target of compressed chunks.
pub const COMPRESSED_CHUNK_BYTES: u64 = 2 << 20;

impl WriteOptions {
    /// The payload alignment in effect: `align_log2`, else the default (4 KiB).
    pub fn payload_align_log2(&self) -> u8 {
        self.align_log2.unwrap_or(DEFAULT_ALIGN_LOG2)
    }

    /// The chunk target in effect for chunks of `codec`: `chunk_bytes`, else the codec's
    /// default.
    pub fn chunk_target(&self, codec: Codec) -> u64 {
        self.chunk_bytes.unwrap_or(match codec {
            Codec::None => RAW_CHUNK_BYTES,
            _ => COMPRESSED_CHUNK_BYTES,
        })
    }

    /// The codec of `field`'s chunks: `fp8` where the schema quantizes it, else `codec`.
    pub fn codec_of(&self, field: &Field) -> Codec {
        match field.quantized {
            Some(_) => Codec::Fp8,
            None => self.codec,
        }
    }

    /// Rows per chunk of `field`: whole token blocks of at least [`BLOCK_CHUNK_BYTES`] when
    /// `block_rows` is set, else as many rows as fit the chunk target of its codec; never more
    /// than the format allows in one chunk (a block of wide rows is cut to that).
    pub fn rows_per_chunk(&self, field: &Field) -> u64 {
        let row_bytes = field.row_bytes().max(1);
        let rows = match self.block_rows {
            Some(block) => block * BLOCK_CHUNK_BYTES.div_ceil(block * row_bytes).max(1),
            None => self.chunk_target(self.codec_of(field)) / row_bytes,
        };
        rows.min(crate::format::index::MAX_CHUNK_BYTES / row_bytes)
            .max(1)
    }

    /// The "shard is full" rule: whether a shard of `bytes` bytes holding `samples` samples
    /// must be committed before a sample of `incoming` raw bytes goes in. An empty shard is
    /// never full: a sample larger than `shard_bytes` gets a shard of its own.
    pub fn shard_is_full(&self, bytes: u64, samples: u64, incoming: u64) -> bool {
        samples > 0
            && (bytes.saturating_add(incoming) > self.shard_bytes || samples >= self.shard_samples)
    }

    pub(crate) fn validate(&self) -> Result<()> {
        // Each refusal says the value given.
        let bad = |option, given: &dyn std::fmt::Display, rule: &str| {
            Err(Error::BadOption {
                option,
                detail: format!("{given}: {rule}"),
            })
        };
        let chunk = self.chunk_target(self.codec);
        if chunk == 0 || chunk > crate::format::index::MAX_CHUNK_BYTES {
            return bad("chunk_bytes", &chunk, "must be in 1..=268435456 (256 MiB)");
        }
        if !Codec::LOSSLESS.contains(&self.codec) {
            return bad(
                "codec",
                &self.codec.name(),
                "must be none, zstd or zstd-bytegroup: fp8 is lossy, chosen per field by \
                 quantizing it (`--quantize fp8`, `quantize=`), never for every field",
            );
        }
        if let Some(b) = self.block_rows.filter(|&b| b == 0 || b > 1 << 20) {
            return bad("block_rows", &b, "must be in 1..=1048576");
        }
        if self.shard_samples == 0 || self.shard_samples > u32::MAX.into() {
            return bad(
                "shard_samples",
                &self.shard_samples,
                "must be in 1..=4294967295",
            );
        }
        let align = self.payload_align_log2();
        if !(MIN_ALIGN_LOG2..=MAX_ALIGN_LOG2).contains(&align) {
            return bad("align_log2", &align, "must be in 6..=20");
        }
        // zstd takes any level and uses the nearest it has: 100 was written at 22, unsaid.
        let levels = zstd::compression_level_range();
        if !levels.contains(&self.zstd_level) {
            return bad(
                "zstd_level",
                &self.zstd_level,
                &format!(
                    "must be in {}..={} (negative: faster; 0: the default, 3)",
                    levels.start(),
                    levels.end()
                ),
            );
        }
        Ok(())
    }
}

/// What a commit or finish leaves behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteStats {
    /// Samples committed.
    pub samples: u64,
    /// Shards committed.
    pub shards: u64,
    /// Bytes of committed shard files.
    pub bytes: u64,
    /// Decoded bytes of committed samples.
    pub raw_bytes: u64,
}

impl WriteStats {
    /// What `manifest` holds committed.
    pub fn of(manifest: &crate::format::Manifest) -> WriteStats {
        WriteStats {
            samples: manifest.samples,
            shards: manifest.shards.len() as u64,
            bytes: manifest.shard_bytes().unwrap_or(u64::MAX),
            raw_bytes: manifest.raw_bytes().unwrap_or(u64::MAX),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::index::MAX_CHUNK_BYTES;
    use crate::format::{DType, Role};

    #[test]
    fn a_zstd_level_zstd_does_not_have_is_refused() {
        for (level, ok) in [
            (3, true),
            (22, true),
            (-5, true),
            (0, true),
            (23, false),
            (100, false),
        ] {
            let options = WriteOptions {
                zstd_level: level,
                ..WriteOptions::default()
            };
            match options.validate() {
                Ok(()) => assert!(ok, "{level}"),
                Err(Error::BadOption { option, .. }) => {
                    assert!(!ok && option == "zstd_level", "{level}")
                }
                Err(e) => panic!("{level}: {e}"),
            }
        }
    }

    /// Each refusal says the value given, beside the rule.
    #[test]
    fn a_refused_option_is_said_with_its_value() {
        let said = |o: WriteOptions| o.validate().unwrap_err().to_string();
        let e = said(WriteOptions {
            align_log2: Some(40),
            ..WriteOptions::default()
        });
        assert!(e.contains("align_log2: 40: must be in 6..=20"), "{e}");
        let e = said(WriteOptions {
            zstd_level: 100,
            ..WriteOptions::default()
        });
        assert!(e.contains("zstd_level: 100: must be in"), "{e}");
        let e = said(WriteOptions {
            shard_samples: 0,
            ..WriteOptions::default()
        });
        assert!(e.contains("shard_samples: 0: must be in 1..="), "{e}");
        let e = said(WriteOptions {
            block_rows: Some(0),
            ..WriteOptions::default()
        });
        assert!(e.contains("block_rows: 0: must be in 1..="), "{e}");
    }

    #[test]
    fn no_chunk_is_larger_than_the_format_allows() {
        for width in [1u64, 7168, 65536, 1 << 20] {
            let field = Field::new("h", DType::BF16, &[width], Role::Other);
            for block_rows in [None, Some(1), Some(64), Some(4096), Some(1 << 20)] {
                let options = WriteOptions {
                    block_rows,
                    ..WriteOptions::default()
                };
                let rows = options.rows_per_chunk(&field);
                assert!(rows >= 1);
                assert!(
                    rows * field.row_bytes() <= MAX_CHUNK_BYTES,
                    "width {width}, block_rows {block_rows:?}: {rows} rows"
                );
            }
        }
    }
}
