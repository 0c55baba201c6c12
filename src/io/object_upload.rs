//! A multipart upload that publishes its object only where none is.
//!
//! `object_store`'s own uploads complete with no condition, so a name checked free when the
//! upload started could be taken before it completes (a copy that stalled past its lease
//! while another copy took the destination over and published the same shard name): the
//! completion would replace that object. Here the parts go up through the store, several at
//! once, and the completion goes through a second client of the same store that sends
//! `If-None-Match: *` with it (S3: a completion the server refuses with 412 where an object
//! is). Other stores complete through the store itself, after the check at the start.

use std::sync::Arc;

use bytes::Bytes;
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path as ObjectPath;
use object_store::{MultipartId, PutPayload};
use tokio::task::JoinSet;

/// The clients an upload uses: parts through `parts`, the completion through `complete`.
#[derive(Clone)]
pub(super) struct Uploader {
    pub parts: Arc<dyn MultipartStore>,
    pub complete: Arc<dyn MultipartStore>,
}

impl std::fmt::Debug for Uploader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Uploader").finish_non_exhaustive()
    }
}

/// How long a failed upload waits for its abort.
const ABORT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// One multipart upload in progress.
pub(super) struct Upload {
    uploader: Uploader,
    path: ObjectPath,
    id: MultipartId,
    next: usize,
    in_flight: JoinSet<object_store::Result<(usize, PartId)>>,
    done: Vec<(usize, PartId)>,
}

impl Upload {
    /// Starts an upload to `path`.
    pub async fn start(uploader: &Uploader, path: ObjectPath) -> object_store::Result<Upload> {
        let id = uploader.parts.create_multipart(&path).await?;
        Ok(Upload {
            uploader: uploader.clone(),
            path,
            id,
            next: 0,
            in_flight: JoinSet::new(),
            done: Vec::new(),
        })
    }

    /// Sends `bytes` as the next part (on the runtime entered by the caller).
    pub fn write(&mut self, bytes: Bytes) {
        let (store, path, id, idx) = (
            Arc::clone(&self.uploader.parts),
            self.path.clone(),
            self.id.clone(),
            self.next,
        );
        self.next += 1;
        self.in_flight.spawn(async move {
            let part = store
                .put_part(&path, &id, idx, PutPayload::from(bytes))
                .await?;
            Ok((idx, part))
        });
    }

    /// Waits until fewer than `max` parts are in flight; a failed part is the error.
    pub async fn wait_for_capacity(&mut self, max: usize) -> object_store::Result<()> {
        while self.in_flight.len() >= max.max(1) {
            self.join_one().await?;
        }
        Ok(())
    }

    async fn join_one(&mut self) -> object_store::Result<()> {
        match self.in_flight.join_next().await {
            Some(Ok(part)) => {
                self.done.push(part?);
                Ok(())
            }
            Some(Err(e)) => Err(object_store::Error::Generic {
                store: "upload",
                source: Box::new(e),
            }),
            None => Ok(()),
        }
    }

    /// Waits for every part and completes the upload: refused (`Precondition` or
    /// `AlreadyExists`) where the completion is conditional and an object is there. An
    /// upload that fails is aborted (as far as the network lets), so its parts are not kept.
    pub async fn finish(mut self) -> object_store::Result<()> {
        let mut result = Ok(());
        while result.is_ok() && !self.in_flight.is_empty() {
            result = self.join_one().await;
        }
        if result.is_ok() {
            let mut done = std::mem::take(&mut self.done);
            done.sort_by_key(|(idx, _)| *idx);
            let parts = done.into_iter().map(|(_, p)| p).collect();
            result = self
                .uploader
                .complete
                .complete_multipart(&self.path, &self.id, parts)
                .await
                .map(drop);
        }
        if result.is_err() {
            let _ = tokio::time::timeout(ABORT_WAIT, self.abort()).await;
        }
        result
    }

    /// Stops the parts in flight and aborts the upload, so its parts are not kept.
    pub async fn abort(mut self) -> object_store::Result<()> {
        self.in_flight.abort_all();
        while self.in_flight.join_next().await.is_some() {}
        self.uploader
            .parts
            .abort_multipart(&self.path, &self.id)
            .await
    }
}
