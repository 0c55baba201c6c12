//! Writing one shard: header, chunks, index, footer, into a temp file that is published only
//! when complete.

use std::fs::File;
use std::io::{BufWriter, Seek, Write};
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use crate::error::{io, Result};
use crate::format::manifest::hex;
use crate::format::{
    ChunkEntry, ChunkHeader, Codec, ExtentEntry, Footer, IndexBuilder, ShardHeader, ShardRecord,
};

use super::atomic::{publish, temp_path};
use super::encode::EncodedChunk;

/// A shard being written.
pub struct ShardWriter {
    path: PathBuf,
    temp: PathBuf,
    out: BufWriter<File>,
    pos: u64,
    seq: u32,
    dataset_id: [u8; 16],
    align: u64,
    index: IndexBuilder,
    raw_bytes: u64,
}

impl ShardWriter {
    /// Starts shard `seq` at `path` (written as `path.tmp` until [`ShardWriter::finish`]).
    pub fn create(
        path: &Path,
        seq: u32,
        dataset_id: [u8; 16],
        schema_hash: [u8; 32],
        align_log2: u8,
        first_ordinal: u64,
    ) -> Result<Self> {
        let temp = temp_path(path);
        let file = File::create(&temp).map_err(io(&temp, "create"))?;
        let mut w = ShardWriter {
            path: path.to_path_buf(),
            temp,
            out: BufWriter::with_capacity(1 << 20, file),
            pos: 0,
            seq,
            dataset_id,
            align: 1 << align_log2,
            index: IndexBuilder::new(first_ordinal),
            raw_bytes: 0,
        };
        let header = ShardHeader::new(seq, dataset_id, schema_hash, align_log2);
        w.put(bytemuck::bytes_of(&header))?;
        Ok(w)
    }

    /// Bytes written so far.
    pub fn len(&self) -> u64 {
        self.pos
    }

    /// True before any chunk is written.
    pub fn is_empty(&self) -> bool {
        self.index.chunk_count() == 0
    }

    /// Samples added so far.
    pub fn sample_count(&self) -> u64 {
        self.index.sample_count()
    }

    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        self.out.write_all(bytes).map_err(io(&self.temp, "write"))?;
        self.pos += bytes.len() as u64;
        Ok(())
    }

    /// Writes the chunks of sample `ordinal` (`dtypes[i]`: the dtype code of chunk `i`'s
    /// field) and returns their numbers. Chunks not hashed yet are hashed on the rayon pool
    /// while their payloads are copied into the file, so hashing and writing overlap; headers,
    /// which carry the hashes, are written after. Padding is left as a hole: it reads as zeros.
    pub fn write_chunks(
        &mut self,
        chunks: &[EncodedChunk<'_>],
        ordinal: u64,
        dtypes: &[u8],
    ) -> Result<Vec<u32>> {
        use std::os::unix::fs::FileExt;
        const HEADER: u64 = ChunkHeader::SIZE as u64;
        self.out.flush().map_err(io(&self.temp, "write"))?;
        let mut places = Vec::with_capacity(chunks.len());
        let mut pos = self.pos;
        for c in chunks {
            if c.codec == Codec::None {
                // The payload, right after the header, starts on an alignment boundary.
                pos = (pos + HEADER).next_multiple_of(self.align) - HEADER;
            }
            places.push(pos);
            pos += HEADER + c.stored.len() as u64;
        }
        let file = self.out.get_ref();
        let (written, hashes) = rayon::join(
            || {
                chunks
                    .iter()
                    .zip(&places)
                    .try_for_each(|(c, &at)| file.write_all_at(&c.stored, at + HEADER))
            },
            || -> Vec<[u8; 32]> {
                chunks
                    .par_iter()
                    .map(|c| {
                        c.hash
                            .unwrap_or_else(|| *blake3::hash(&c.stored).as_bytes())
                    })
                    .collect()
            },
        );
        written.map_err(io(&self.temp, "write"))?;
        let mut ids = Vec::with_capacity(chunks.len());
        for (i, c) in chunks.iter().enumerate() {
            let chunk_id = self.index.chunk_count() as u32;
            let dtype = dtypes[i];
            let header = ChunkHeader {
                magic: [0; 8],
                chunk_id,
                shard_seq: self.seq,
                codec: c.codec.code(),
                dtype,
                field: c.field,
                reserved0: 0,
                sample: ordinal,
                row_start: c.row_start,
                row_count: c.row_count,
                raw_len: c.raw_len,
                stored_len: c.stored.len() as u64,
                hash: hashes[i],
                reserved1: [0; 24],
                check: 0,
            }
            .seal();
            file.write_all_at(bytemuck::bytes_of(&header), places[i])
                .map_err(io(&self.temp, "write"))?;
            ids.push(self.index.push_chunk(ChunkEntry {
                offset: places[i],
                raw_len: c.raw_len,
                stored_len: c.stored.len() as u64,
                row_count: c.row_count,
                sample: ordinal,
                row_start: c.row_start,
                field: c.field,
                codec: c.codec.code(),
                dtype,
                reserved0: 0,
                hash: hashes[i],
                reserved1: 0,
            }));
        }
        self.out
            .seek(std::io::SeekFrom::Start(pos))
            .map_err(io(&self.temp, "seek"))?;
        self.pos = pos;
        Ok(ids)
    }

    /// Records a sample whose chunks are written.
    pub fn push_sample(
        &mut self,
        key: &str,
        rows: u64,
        loss_rows: u64,
        raw_bytes: u64,
        extents: &[ExtentEntry],
    ) {
        self.raw_bytes += raw_bytes;
        self.index
            .push_sample(key, rows, loss_rows, raw_bytes, extents);
    }

    /// Writes index and footer, syncs, and renames the file into place. The shard is not yet
    /// part of the dataset: the manifest commits it.
    pub fn finish(mut self, durable: bool) -> Result<ShardRecord> {
        let first_ordinal = self.index.header_first_ordinal();
        let samples = self.index.sample_count();
        let chunks = self.index.chunk_count() as u64;
        let index = std::mem::take(&mut self.index).encode();
        let index_offset = self.pos;
        let index_hash = *blake3::hash(&index).as_bytes();
        self.put(&index)?;
        let footer = Footer {
            magic: [0; 8],
            version: 0,
            reserved0: 0,
            shard_seq: self.seq,
            dataset_id: self.dataset_id,
            index_offset,
            index_len: index.len() as u64,
            index_hash,
            sample_count: samples,
            chunk_count: chunks,
            first_ordinal,
            file_len: self.pos + Footer::SIZE as u64,
            check: 0,
            end_magic: [0; 8],
        }
        .seal();
        self.put(bytemuck::bytes_of(&footer))?;
        let file = self
            .out
            .into_inner()
            .map_err(|e| io(&self.temp, "write")(e.into_error()))?;
        if durable {
            file.sync_all().map_err(io(&self.temp, "fsync"))?;
        }
        drop(file);
        publish(&self.temp, &self.path, durable)?;
        Ok(ShardRecord {
            file: self
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            seq: self.seq,
            bytes: self.pos,
            index_blake3: hex(&index_hash),
            first_ordinal,
            samples,
            chunks,
            raw_bytes: self.raw_bytes,
        })
    }

    /// Deletes the unfinished temp file.
    pub fn abandon(self) {
        let temp = self.temp.clone();
        drop(self.out);
        let _ = std::fs::remove_file(temp);
    }
}
