//! Reading a manifest with its segments (version 4): the shard list a reader works with.

use rayon::prelude::*;

use crate::error::{format, Error, Result};
use crate::format::manifest::{MANIFEST_FILE, MAX_MANIFEST_BYTES};
use crate::format::segment::{Segment, MAX_SEGMENT_BYTES};
use crate::format::FormatError;
use crate::format::Manifest;
use crate::io::Storage;

/// Times a reader reads the manifest again at once when a segment it lists is gone because a
/// commit replaced it meanwhile; later attempts wait a little first, up to [`KEEPS_CHANGING`].
const ATTEMPTS: usize = 8;

/// How long a reader goes on reading a manifest that keeps changing under it (a writer
/// committing faster than the dataset opens) before it says so.
const KEEPS_CHANGING: std::time::Duration = std::time::Duration::from_secs(30);

/// The manifest of the dataset in `storage`, with every segment it lists added and the whole
/// checked, and the manifest file's bytes; `None` where there is no manifest. A writer removes
/// the segments a merge replaced once its manifest no longer lists them: a segment missing
/// under a manifest that has changed since it was read is read from the new one.
pub fn load_manifest(storage: &dyn Storage) -> Result<Option<(Manifest, Vec<u8>)>> {
    let started = std::time::Instant::now();
    let mut attempt = 0;
    loop {
        // Read no further than a manifest may be long: decoding refuses a longer one.
        let Some(bytes) = storage.read_bounded(MANIFEST_FILE, MAX_MANIFEST_BYTES)? else {
            return Ok(None);
        };
        let mut manifest = Manifest::decode(&bytes).map_err(format(storage.path(MANIFEST_FILE)))?;
        match add_segments(storage, &mut manifest) {
            Ok(()) => return Ok(Some((manifest, bytes))),
            Err(Error::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound
                    && storage.read(MANIFEST_FILE)?.is_some_and(|now| now != bytes) =>
            {
                // A commit replaced the manifest: read the new one.
                attempt += 1;
                if started.elapsed() > KEEPS_CHANGING {
                    return Err(Error::Io {
                        path: storage.path(MANIFEST_FILE),
                        op: "open the dataset at",
                        source: std::io::Error::other(format!(
                            "a writer replaced the manifest {attempt} times in {} s while this \
                             reader read the segments it listed (it commits faster than the \
                             dataset opens); nothing is damaged: open it again, or while \
                             commits are fewer",
                            KEEPS_CHANGING.as_secs()
                        )),
                    });
                }
                if attempt >= ATTEMPTS {
                    std::thread::sleep(std::time::Duration::from_millis(
                        (10 << (attempt - ATTEMPTS).min(5)) as u64,
                    ));
                }
            }
            // A part the manifest lists and that is not there is damage, as a damaged one is.
            Err(Error::Io { path, source, .. }) if crate::error::not_there_as_a_file(&source) => {
                return Err(Error::Format {
                    path,
                    source: crate::format::FormatError::Json {
                        structure: "segment",
                        detail: source.to_string(),
                    },
                })
            }
            Err(e) => return Err(e),
        }
    }
}

/// Reads the segments of `manifest` not added yet (all of them, for a manifest just decoded),
/// on the thread pool, checks each against its entry and adds it; then checks the shard list.
pub fn add_segments(storage: &dyn Storage, manifest: &mut Manifest) -> Result<()> {
    let todo = &manifest.segments[manifest.segment_files.len()..];
    let id = manifest.dataset_id.as_str();
    let read: Vec<Result<Segment>> = crate::parallel::install(|| {
        todo.par_iter()
            .map(|at| {
                let path = storage.path(&at.file);
                if at.bytes > MAX_SEGMENT_BYTES {
                    return Err(format(path)(FormatError::Invalid {
                        structure: "segment",
                        what: "bytes",
                        value: at.bytes,
                        rule: format!("at most {MAX_SEGMENT_BYTES}"),
                    }));
                }
                // No more than the entry records is read: a longer file is refused on its size.
                let Some(bytes) = storage.read_bounded(&at.file, at.bytes)? else {
                    return Err(Error::Io {
                        path,
                        op: "read",
                        source: std::io::Error::new(
                            std::io::ErrorKind::NotFound,
                            "the manifest lists it but it is missing: restore it from an intact \
                             copy with `hspack repair DATASET --from COPY`",
                        ),
                    });
                };
                if bytes.len() as u64 > at.bytes {
                    return Err(format(path)(FormatError::Invalid {
                        structure: "segment",
                        what: "file length",
                        value: bytes.len() as u64,
                        rule: format!("{}, the manifest's `bytes` (read no further)", at.bytes),
                    }));
                }
                Segment::decode(&bytes, at, id).map_err(format(path))
            })
            .collect()
    });
    for segment in read {
        manifest.add_segment(segment?);
    }
    manifest
        .validate_shards()
        .map_err(format(storage.path(MANIFEST_FILE)))
}
