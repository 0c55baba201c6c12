//! Writing one shard: header, chunks, index, footer, into a temp file that is published only
//! when complete.
//!
//! A shard's place in the dataset (its sequence number, file name and first ordinal) is given
//! when it finishes, not when it starts: payloads are written as they come, and the headers
//! that name the place (the shard header and every chunk header) are written at
//! [`ShardWriter::finish`]. So several shards can be written at once and committed in order.

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::failpoint::failpoint;
use crate::format::manifest::hex;
use crate::format::{
    ChunkEntry, ChunkHeader, Codec, ExtentEntry, Footer, IndexBuilder, ShardHeader, ShardRecord,
};

use crate::io::{NewFile, Storage};

use super::encode::EncodedChunk;

/// A shard being written.
pub struct ShardWriter {
    out: Box<dyn NewFile>,
    pos: u64,
    dataset_id: [u8; 16],
    schema_hash: [u8; 32],
    align_log2: u8,
    index: IndexBuilder,
    raw_bytes: u64,
    /// Why the shard cannot be finished: a write of a sample's chunks failed part way, so
    /// bytes of a sample the index does not list may lie past its end or in its padding.
    unfit: Option<String>,
}

/// Where a finished shard goes in its dataset.
#[derive(Debug, Clone)]
pub struct ShardPlace {
    /// The shard file's name, published where no file is.
    pub name: String,
    /// Its sequence number: its position in the manifest.
    pub seq: u32,
    /// The ordinal of its first sample.
    pub first_ordinal: u64,
}

impl ShardWriter {
    /// Starts a shard in `storage` under the temp name `temp` (a name ending in `.tmp`, so
    /// that a writer reopening the dataset removes it if this one never finishes).
    pub fn create(
        storage: &dyn Storage,
        temp: &str,
        dataset_id: [u8; 16],
        schema_hash: [u8; 32],
        align_log2: u8,
    ) -> Result<Self> {
        let mut w = ShardWriter {
            out: storage.create(temp)?,
            pos: 0,
            dataset_id,
            schema_hash,
            align_log2,
            index: IndexBuilder::new(0),
            raw_bytes: 0,
            unfit: None,
        };
        // The header is written again at finish, with the shard's sequence number.
        w.put(&[0; ShardHeader::SIZE])?;
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

    /// Why the shard cannot be finished, if it cannot: a write into it failed part way.
    pub fn unfit(&self) -> Option<&str> {
        self.unfit.as_deref()
    }

    /// Samples added so far.
    pub fn sample_count(&self) -> u64 {
        self.index.sample_count()
    }

    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        self.out.write_at(self.pos, bytes)?;
        self.pos += bytes.len() as u64;
        Ok(())
    }

    /// Writes the chunks of the shard's next sample (`dtypes[i]`: the dtype code of chunk
    /// `i`'s field) and returns their numbers. Chunks not hashed yet are hashed on the rayon
    /// pool while their payloads are copied into the file, so hashing and writing overlap;
    /// chunk headers are written at finish. Padding is left as a hole: it reads as zeros.
    pub fn write_chunks(&mut self, chunks: &[EncodedChunk<'_>], dtypes: &[u8]) -> Result<Vec<u32>> {
        const HEADER: u64 = ChunkHeader::SIZE as u64;
        let align = 1u64 << self.align_log2;
        let mut places = Vec::with_capacity(chunks.len());
        let mut pos = self.pos;
        for c in chunks {
            if c.codec == Codec::None {
                // The payload, right after the header, starts on an alignment boundary.
                pos = (pos + HEADER).next_multiple_of(align) - HEADER;
            }
            places.push(pos);
            pos += HEADER + c.stored.len() as u64;
        }
        let out = &mut self.out;
        let bytes: u64 = chunks.iter().map(|c| c.stored.len() as u64).sum();
        let hash = |c: &EncodedChunk<'_>| {
            c.hash
                .unwrap_or_else(|| *blake3::hash(&c.stored).as_bytes())
        };
        let (written, hashes) = if out.keeps_payloads() {
            // The file keeps each payload by its hash: payloads are handed over in order as
            // their hashes come in from the pool.
            hand_over(out, chunks, &places, bytes, &hash)
        } else if bytes < crate::parallel::WORTH_THE_POOL {
            let written = chunks
                .iter()
                .zip(&places)
                .try_for_each(|(c, &at)| out.write_at(at + HEADER, &c.stored));
            (written, chunks.iter().map(hash).collect())
        } else {
            crate::parallel::install(|| {
                rayon::join(
                    || {
                        chunks
                            .iter()
                            .zip(&places)
                            .try_for_each(|(c, &at)| out.write_at(at + HEADER, &c.stored))
                    },
                    || -> Vec<[u8; 32]> { chunks.par_iter().map(hash).collect() },
                )
            })
        };
        if let Err(e) = written {
            self.unfit = Some(e.to_string());
            return Err(e);
        }
        let sample = self.index.sample_count();
        let ids = chunks
            .iter()
            .enumerate()
            .map(|(i, c)| {
                self.index.push_chunk(ChunkEntry {
                    offset: places[i],
                    raw_len: c.raw_len,
                    stored_len: c.stored.len() as u64,
                    row_count: c.row_count,
                    sample,
                    row_start: c.row_start,
                    field: c.field,
                    codec: c.codec.code(),
                    dtype: dtypes[i],
                    reserved0: 0,
                    hash: hashes[i],
                    reserved1: 0,
                })
            })
            .collect();
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

    /// Flushes the payloads written so far to the disk, so that the fsync at finish has little
    /// left to do.
    pub fn sync_data(&mut self) -> Result<()> {
        self.out.sync_data()
    }

    /// Writes the headers that name the shard's place, the index and the footer, syncs, and
    /// publishes the file as `place.name`. The shard is not yet part of the dataset: the
    /// manifest commits it.
    pub fn finish(mut self, place: &ShardPlace, durable: bool) -> Result<ShardRecord> {
        if let Some(cause) = self.unfit.take() {
            self.out.abandon();
            return Err(Error::Io {
                path: place.name.clone().into(),
                op: "finish",
                source: std::io::Error::other(format!(
                    "a write into this shard failed ({cause}), so it is not published"
                )),
            });
        }
        let seq = place.seq;
        self.index.rebase(place.first_ordinal);
        let header = ShardHeader::new(seq, self.dataset_id, self.schema_hash, self.align_log2);
        self.out.write_at(0, bytemuck::bytes_of(&header))?;
        for (chunk_id, e) in self.index.chunks().iter().enumerate() {
            let header = ChunkHeader {
                magic: [0; 8],
                chunk_id: chunk_id as u32,
                shard_seq: seq,
                codec: e.codec,
                dtype: e.dtype,
                field: e.field,
                reserved0: 0,
                sample: e.sample,
                row_start: e.row_start,
                row_count: e.row_count,
                raw_len: e.raw_len,
                stored_len: e.stored_len,
                hash: e.hash,
                reserved1: [0; 24],
                check: 0,
            }
            .seal();
            self.out.write_at(e.offset, bytemuck::bytes_of(&header))?;
        }
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
            shard_seq: seq,
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
        if durable {
            if let Err(e) = self.out.sync_all() {
                self.out.abandon();
                return Err(e);
            }
        }
        failpoint!("shard-synced");
        self.out.publish_new(&place.name, durable)?;
        failpoint!("shard-published");
        Ok(ShardRecord {
            file: place.name.clone(),
            seq,
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
        self.out.abandon();
    }
}

/// Hashes `chunks` and hands each payload (at `places[i]` + the chunk header) to `out` with
/// its hash, in order. The calling thread hands a payload over as soon as its hash is known
/// and, while the next one is not, hashes the first chunk nobody has taken; the pool's other
/// threads hash ahead of it. Hashing and handing over so share every thread, as a plain
/// write's hashing and writing do: a writer that only waited for hashes left one core idle.
fn hand_over(
    out: &mut Box<dyn NewFile>,
    chunks: &[EncodedChunk<'_>],
    places: &[u64],
    bytes: u64,
    hash: &(dyn Fn(&EncodedChunk<'_>) -> [u8; 32] + Sync),
) -> (Result<()>, Vec<[u8; 32]>) {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
    use std::sync::OnceLock;
    const HEADER: u64 = ChunkHeader::SIZE as u64;
    if bytes < crate::parallel::WORTH_THE_POOL {
        let hashes: Vec<[u8; 32]> = chunks.iter().map(hash).collect();
        let written = chunks
            .iter()
            .zip(places)
            .zip(&hashes)
            .try_for_each(|((c, &at), h)| out.write_payload(at + HEADER, &c.stored, h));
        return (written, hashes);
    }
    let taken = AtomicUsize::new(0);
    let hashes: Vec<OnceLock<[u8; 32]>> = chunks.iter().map(|_| OnceLock::new()).collect();
    let stop = AtomicBool::new(false);
    // Hashes the first chunk nobody has taken; false when every chunk is taken.
    let hash_one = || {
        let i = taken.fetch_add(1, Relaxed);
        let Some(c) = chunks.get(i) else {
            return false;
        };
        let _ = hashes[i].set(hash(c));
        true
    };
    let written = crate::parallel::install(|| {
        rayon::scope(|s| {
            for _ in 1..rayon::current_num_threads() {
                s.spawn(|_| {
                    while !stop.load(Relaxed) {
                        if !hash_one() {
                            break;
                        }
                    }
                });
            }
            let written = chunks.iter().enumerate().try_for_each(|(i, c)| {
                let h = loop {
                    match hashes[i].get() {
                        Some(h) => break h,
                        // Another thread is hashing it: hash one more meanwhile.
                        None if hash_one() => {}
                        None => std::thread::yield_now(),
                    }
                };
                out.write_payload(places[i] + HEADER, &c.stored, h)
            });
            stop.store(true, Relaxed);
            written
        })
    });
    if written.is_err() {
        // The caller returns the error; the hashes are not used.
        return (written, Vec::new());
    }
    let hashes = hashes
        .into_iter()
        .map(|h| {
            h.into_inner()
                .expect("every chunk hashed before it was handed over")
        })
        .collect();
    (written, hashes)
}
