//! Reading a manifest with its segments (version 4): the shard list a reader works with.

use rayon::prelude::*;

use crate::error::{format, Error, Result};
use crate::format::manifest::MANIFEST_FILE;
use crate::format::segment::Segment;
use crate::format::Manifest;
use crate::io::Storage;

/// Times a reader reads the manifest again when a segment it lists is gone because a commit
/// replaced it meanwhile.
const ATTEMPTS: usize = 8;

/// The manifest of the dataset in `storage`, with every segment it lists added and the whole
/// checked, and the manifest file's bytes; `None` where there is no manifest. A writer removes
/// the segments a merge replaced once its manifest no longer lists them: a segment missing
/// under a manifest that has changed since it was read is read from the new one.
pub fn load_manifest(storage: &dyn Storage) -> Result<Option<(Manifest, Vec<u8>)>> {
    let mut attempt = 0;
    loop {
        let Some(bytes) = storage.read(MANIFEST_FILE)? else {
            return Ok(None);
        };
        let mut manifest = Manifest::decode(&bytes).map_err(format(storage.path(MANIFEST_FILE)))?;
        match add_segments(storage, &mut manifest) {
            Ok(()) => return Ok(Some((manifest, bytes))),
            Err(Error::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound
                    && attempt + 1 < ATTEMPTS
                    && storage.read(MANIFEST_FILE)?.is_some_and(|now| now != bytes) =>
            {
                attempt += 1;
            }
            // A part the manifest lists and that is not there is damage, as a damaged one is.
            Err(Error::Io { path, source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
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
                let Some(bytes) = storage.read(&at.file)? else {
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
