//! [`CudaWriter`]: device tensors → pinned ring → dataset, off the caller's thread.

use std::any::Any;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use crate::write::{DatasetWriter, WriteOptions};
use crate::{Error, Schema};

use super::driver::{driver, Context, Event, Pinned, Stream};
use super::error::CaptureError;
use super::ring::{Ring, Slot, SlotSize};
use super::sink::check_sample;
use crate::write::SampleSink;

/// Options of a [`CudaWriter`].
#[derive(Debug, Clone)]
pub struct CudaWriterOptions {
    /// CUDA device ordinal whose tensors this writer copies. Default 0.
    pub device: i32,
    /// Pinned slots in the ring. Default 8.
    pub slots: usize,
    /// Bytes of a slot. Default `None`: as big as the largest field captured so far, rounded
    /// up to a power of two from 1 MiB to 1 GiB, so that a field is read in place (a field
    /// split over slots is joined by a host copy). A sample larger than the ring gets a
    /// one-off pinned buffer (one at a time).
    pub slot_bytes: Option<usize>,
    /// Options of the dataset writer.
    pub write: WriteOptions,
}

impl Default for CudaWriterOptions {
    fn default() -> Self {
        CudaWriterOptions {
            device: 0,
            slots: 8,
            slot_bytes: None,
            write: WriteOptions::default(),
        }
    }
}

/// One field of a sample to capture: `bytes` bytes of device memory at address `ptr`
/// (little-endian, C order, as the schema's field expects).
#[derive(Debug, Clone, Copy)]
pub struct DeviceField<'a> {
    /// Field name.
    pub name: &'a str,
    /// Device address (a `CUdeviceptr`, e.g. PyTorch's `data_ptr()`).
    pub ptr: u64,
    /// Bytes.
    pub bytes: usize,
}

/// The streams whose work produces a sample's tensors.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Producer {
    /// Raw stream handles: PyTorch's `torch.cuda.current_stream().cuda_stream`, 0 for the
    /// legacy default stream; one per stream when the tensors come from several (a
    /// `__cuda_array_interface__` names its own). The copies start after the work queued so
    /// far on every one of them; none means the legacy default stream.
    pub streams: Vec<u64>,
    /// True when the producer will write these buffers in place again (static buffers, CUDA
    /// graphs): its later work then waits, on the device, for the copies to finish. Leave it
    /// false for fresh tensors (a model's outputs), whose memory the keepalive protects.
    pub reuses_buffers: bool,
}

impl Producer {
    /// The streams the copies wait for: those given, or the legacy default stream.
    fn waited(&self) -> &[u64] {
        match self.streams.is_empty() {
            true => &[0],
            false => &self.streams,
        }
    }
}

/// What a [`CudaWriter`] did so far.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CaptureStats {
    /// Pinned slots in the ring.
    pub slots: usize,
    /// Bytes of a slot.
    pub slot_bytes: usize,
    /// Slots in use now.
    pub busy: usize,
    /// Times `append` blocked because no slot (or the oversize buffer) was free.
    pub waits: u64,
    /// Seconds `append` spent blocked.
    pub wait_seconds: f64,
    /// Seconds spent in `append` in all (checks, queueing copies, and the blocked time).
    pub append_seconds: f64,
    /// Bytes copied from the device and confirmed complete.
    pub bytes_copied: u64,
    /// Samples given to `append` and accepted.
    pub samples_given: u64,
    /// Samples handed to the sink successfully.
    pub samples_written: u64,
    /// Samples larger than the ring, copied through a one-off pinned buffer.
    pub oversize: u64,
    /// Samples accepted but not written because of an error (reported at the next call).
    pub unwritten: u64,
}

/// Alignment of a field's start in a slot.
const FIELD_ALIGN: usize = 256;

/// A contiguous part of a field in one slot of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    /// Slot number within the job (0-based, in order of use).
    pub(crate) slot: usize,
    /// Byte offset in the slot.
    pub(crate) offset: usize,
    /// Bytes.
    pub(crate) len: usize,
}

/// Lays fields one after another through slots of `slot_bytes`, each field starting at a
/// multiple of [`FIELD_ALIGN`]. A field that fits in a slot but not in what is left of the
/// current one starts in the next slot (so it is read in place); only a field larger than a
/// slot is split across slots. Returns the pieces of each field and the number of slots used.
pub(crate) fn plan(lens: &[usize], slot_bytes: usize) -> (Vec<Vec<Piece>>, usize) {
    assert!(slot_bytes > 0, "slot_bytes must be positive");
    let (mut slot, mut offset) = (0usize, 0usize);
    let mut used = 0usize;
    let mut out = Vec::with_capacity(lens.len());
    for &len in lens {
        let mut pieces = Vec::new();
        if len <= slot_bytes && offset > 0 && offset.saturating_add(len) > slot_bytes {
            slot += 1;
            offset = 0;
        }
        let mut left = len;
        while left > 0 {
            if offset >= slot_bytes {
                slot += 1;
                offset = 0;
            }
            let n = left.min(slot_bytes - offset);
            pieces.push(Piece {
                slot,
                offset,
                len: n,
            });
            used = used.max(slot + 1);
            offset += n;
            left -= n;
        }
        offset = offset.div_ceil(FIELD_ALIGN) * FIELD_ALIGN;
        out.push(pieces);
    }
    (out, used)
}

/// Where a job's bytes are.
#[derive(Debug)]
enum Storage {
    /// Ring slots, in order of use; the first one's event marks completion.
    Ring(Vec<usize>),
    /// A one-off buffer for a sample larger than the ring.
    Oversize(Slot),
}

/// One sample in flight.
struct Job {
    key: String,
    fields: Vec<(String, Vec<Piece>)>,
    storage: Storage,
    bytes: u64,
    keepalive: Option<Box<dyn Any + Send>>,
    error: Option<CaptureError>,
}

enum Msg {
    Job(Job),
    Flush(Sender<()>),
}

#[derive(Debug, Default)]
struct Failure {
    first: Option<CaptureError>,
    reported: bool,
    unwritten: u64,
}

type SharedSink = Arc<Mutex<Option<Box<dyn SampleSink>>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Copies device tensors into a dataset without stalling the device.
///
/// [`append`](CudaWriter::append) records an event on the producer's stream, makes the
/// writer's own copy stream wait for it, enqueues device-to-host copies into pinned slots of a
/// ring and returns: no device-wide synchronisation, and the producer may overwrite its
/// buffers with later work on the same stream. A completion thread waits for each sample's
/// copies, then releases what kept its device memory alive; a writer thread hands the bytes to
/// the dataset and frees the slots. When every slot is busy, `append` blocks (counted in
/// [`CaptureStats::waits`]); it never drops a sample. An error on the threads is returned by
/// the next call. One writer (and one ring) per device.
pub struct CudaWriter {
    tx: Option<Sender<Msg>>,
    threads: Vec<JoinHandle<()>>,
    sink: SharedSink,
    failure: Arc<Mutex<Failure>>,
    /// Quantized fields come as their stored form (`WriteOptions::prequantized`).
    prequantized: bool,
    schema: Schema,
    /// Keys in the sink at open, and keys given since: duplicates are refused up front,
    /// without taking the sink (the writer thread holds it while it writes).
    keys: std::collections::HashSet<String>,
    device: i32,
    ready: Event,
    copy_stream: Stream,
    ring: Arc<Ring>,
    ctx: Arc<Context>,
}

impl std::fmt::Debug for CudaWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaWriter")
            .field("device", &self.device)
            .field("stats", &self.stats())
            .finish()
    }
}

/// The CUDA driver's version (e.g. 13000 for 13.0), or why there is no driver.
pub fn driver_version() -> Result<i32, CaptureError> {
    driver()?.version()
}

impl CudaWriter {
    /// Opens (or creates) the dataset in `dir` and a ring on `options.device`.
    pub fn open(
        dir: impl AsRef<Path>,
        schema: Schema,
        options: CudaWriterOptions,
    ) -> Result<Self, CaptureError> {
        // Fail on the driver before the dataset is touched.
        driver()?;
        let writer = DatasetWriter::open(dir, schema.clone(), options.write.clone())?;
        Self::with_sink(Box::new(writer), schema, options)
    }

    /// A writer that hands samples to `sink` (a [`DatasetWriter`], [`Discard`](super::Discard),
    /// or another).
    pub fn with_sink(
        sink: Box<dyn SampleSink>,
        schema: Schema,
        options: CudaWriterOptions,
    ) -> Result<Self, CaptureError> {
        if options.slots == 0 {
            return Err(CaptureError::BadOption {
                option: "slots",
                detail: "must be at least 1".into(),
            });
        }
        if options.slot_bytes.is_some_and(|b| b < FIELD_ALIGN) {
            return Err(CaptureError::BadOption {
                option: "slot_bytes",
                detail: format!(
                    "must be at least {FIELD_ALIGN}, or left out to size slots from the fields"
                ),
            });
        }
        let drv = driver()?;
        let ctx = Arc::new(Context::primary(drv, options.device)?);
        ctx.bind()?;
        let size = options
            .slot_bytes
            .map_or(SlotSize::FromFields, SlotSize::Fixed);
        let ring = Arc::new(Ring::new(drv, options.slots, size)?);
        let copy_stream = Stream::new(drv)?;
        let ready = Event::new(drv)?;
        let keys = sink.existing_keys()?.into_iter().collect();
        let sink: SharedSink = Arc::new(Mutex::new(Some(sink)));
        let failure = Arc::new(Mutex::new(Failure::default()));

        let (tx, rx) = channel::<Msg>();
        let (wtx, wrx) = channel::<Msg>();
        let completion = {
            let (ctx, ring) = (Arc::clone(&ctx), Arc::clone(&ring));
            std::thread::Builder::new()
                .name(format!("hspack-cuda{}-done", options.device))
                .spawn(move || completion_loop(&ctx, &ring, rx, wtx))
                .map_err(|e| CaptureError::BadOption {
                    option: "threads",
                    detail: format!("cannot start a thread: {e}"),
                })?
        };
        let writer = {
            let (ctx, ring) = (Arc::clone(&ctx), Arc::clone(&ring));
            let (sink, failure) = (Arc::clone(&sink), Arc::clone(&failure));
            std::thread::Builder::new()
                .name(format!("hspack-cuda{}-write", options.device))
                .spawn(move || writer_loop(&ctx, &ring, &sink, &failure, wrx))
                .map_err(|e| CaptureError::BadOption {
                    option: "threads",
                    detail: format!("cannot start a thread: {e}"),
                })?
        };
        Ok(CudaWriter {
            tx: Some(tx),
            threads: vec![completion, writer],
            sink,
            failure,
            schema,
            prequantized: options.write.prequantized,
            keys,
            device: options.device,
            ready,
            copy_stream,
            ring,
            ctx,
        })
    }

    /// The schema.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The device ordinal.
    pub fn device(&self) -> i32 {
        self.device
    }

    /// True when a sample with `key` was given to this writer or was in the dataset when it
    /// opened. Never waits for the writer thread.
    pub fn contains_key(&self, key: &str) -> bool {
        self.keys.contains(key)
    }

    /// Counters.
    pub fn stats(&self) -> CaptureStats {
        let c = &self.ring.counters;
        CaptureStats {
            slots: self.ring.len(),
            slot_bytes: self.ring.slot_bytes(),
            busy: self.ring.busy(),
            waits: c.waits.load(Ordering::Relaxed),
            wait_seconds: c.wait_ns.load(Ordering::Relaxed) as f64 * 1e-9,
            append_seconds: c.append_ns.load(Ordering::Relaxed) as f64 * 1e-9,
            bytes_copied: c.bytes_copied.load(Ordering::Relaxed),
            samples_given: c.samples_given.load(Ordering::Relaxed),
            samples_written: c.samples_written.load(Ordering::Relaxed),
            oversize: c.oversize.load(Ordering::Relaxed),
            unwritten: lock(&self.failure).unwritten,
        }
    }

    /// Returns an error of the writer threads not yet reported.
    fn check_threads(&self) -> Result<(), CaptureError> {
        let mut f = lock(&self.failure);
        if let Some(e) = f.first.take() {
            f.reported = true;
            return Err(e);
        }
        if f.reported {
            return Err(CaptureError::Stopped {
                unwritten: f.unwritten,
            });
        }
        Ok(())
    }

    /// Queues one sample for capture and returns once its copies are enqueued.
    ///
    /// `fields` gives device memory of this writer's device for every field of the schema.
    /// The copies start after the work queued so far on `producer.streams`; nothing waits on
    /// the host. `keepalive` must own the device memory (e.g. the tensor objects); it is
    /// dropped on the writer's thread once the copies are complete, so the producer's
    /// allocator cannot hand the memory out again before. Blocks while every slot is busy.
    pub fn append(
        &mut self,
        key: &str,
        fields: &[DeviceField<'_>],
        producer: Producer,
        keepalive: Box<dyn Any + Send>,
    ) -> Result<(), CaptureError> {
        let started = std::time::Instant::now();
        let result = self.append_inner(key, fields, producer, keepalive);
        self.ring
            .counters
            .append_ns
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        result
    }

    fn append_inner(
        &mut self,
        key: &str,
        fields: &[DeviceField<'_>],
        producer: Producer,
        keepalive: Box<dyn Any + Send>,
    ) -> Result<(), CaptureError> {
        self.check_threads()?;
        check_sample(&self.schema, key, fields, self.prequantized)?;
        if self.contains_key(key) {
            return Err(Error::DuplicateKey {
                key: key.to_string(),
            }
            .into());
        }
        self.ctx.bind()?;
        for f in fields {
            self.check_memory(key, f)?;
        }
        // Ordering after the producer: everything queued on its streams so far happens
        // before our copies; nothing waits on the host. A wait takes the event as recorded
        // when it is queued, so one event serves every stream in turn.
        for &stream in producer.waited() {
            self.ready.record_raw(stream)?;
            self.copy_stream.wait(&self.ready)?;
        }

        let lens: Vec<usize> = fields.iter().map(|f| f.bytes).collect();
        let bytes: u64 = lens.iter().map(|&l| l as u64).sum();
        let slot_bytes = self.ring.slot_bytes_for(&lens);
        let (mut pieces, used) = plan(&lens, slot_bytes);
        let mut storage = if used <= self.ring.len() {
            Storage::Ring(Vec::with_capacity(used))
        } else {
            if !self.ring.acquire_oversize() {
                return Err(self.stopped());
            }
            let total = lens
                .iter()
                .map(|l| l.div_ceil(FIELD_ALIGN) * FIELD_ALIGN)
                .sum();
            match Slot::new(self.ctx.driver(), total) {
                Ok(slot) => {
                    (pieces, _) = plan(&lens, total.max(FIELD_ALIGN));
                    self.ring.counters.oversize.fetch_add(1, Ordering::Relaxed);
                    Storage::Oversize(slot)
                }
                Err(e) => {
                    self.ring.release_oversize();
                    return Err(e);
                }
            }
        };
        if let Err(e) = self.enqueue(fields, &pieces, slot_bytes, &mut storage, &producer) {
            // Copies may be queued into the slots: let them finish before the slots go back.
            let _ = self.copy_stream.synchronize();
            self.give_back(storage);
            return Err(e);
        }
        let job = Job {
            key: key.to_string(),
            fields: fields
                .iter()
                .zip(pieces)
                .map(|(f, p)| (f.name.to_string(), p))
                .collect(),
            storage,
            bytes,
            keepalive: Some(keepalive),
            error: None,
        };
        self.keys.insert(key.to_string());
        self.ring
            .counters
            .samples_given
            .fetch_add(1, Ordering::Relaxed);
        self.send(Msg::Job(job))
    }

    /// Enqueues the copies of one sample into slots of `slot_bytes` (growing a slot taken
    /// that is smaller) and records its completion event; when the producer reuses its
    /// buffers, its stream waits for that event.
    fn enqueue(
        &self,
        fields: &[DeviceField<'_>],
        pieces: &[Vec<Piece>],
        slot_bytes: usize,
        storage: &mut Storage,
        producer: &Producer,
    ) -> Result<(), CaptureError> {
        for (f, ps) in fields.iter().zip(pieces) {
            let mut src = f.ptr;
            for p in ps {
                let slot = match storage {
                    Storage::Ring(slots) => {
                        while slots.len() <= p.slot {
                            let i = self.ring.acquire().ok_or_else(|| self.stopped())?;
                            slots.push(i);
                            self.ring.fit(i, slot_bytes)?;
                        }
                        self.ring.slot(slots[p.slot])
                    }
                    Storage::Oversize(slot) => slot,
                };
                self.copy_stream
                    .copy_to_host(&slot.buf(), p.offset, src, p.len)?;
                src += p.len as u64;
            }
        }
        let done = match storage {
            Storage::Ring(slots) => {
                if slots.is_empty() {
                    slots.push(self.ring.acquire().ok_or_else(|| self.stopped())?);
                }
                &self.ring.slot(slots[0]).done
            }
            Storage::Oversize(slot) => &slot.done,
        };
        done.record(&self.copy_stream)?;
        if producer.reuses_buffers {
            // The producer's later in-place writes, on any of its streams, wait for our
            // reads, on the device.
            for &stream in producer.waited() {
                done.wait_on_raw(stream)?;
            }
        }
        Ok(())
    }

    fn give_back(&self, storage: Storage) {
        match storage {
            Storage::Ring(slots) => self.ring.release(&slots),
            Storage::Oversize(slot) => {
                drop(slot);
                self.ring.release_oversize();
            }
        }
    }

    fn check_memory(&self, key: &str, f: &DeviceField<'_>) -> Result<(), CaptureError> {
        if f.bytes == 0 {
            return Ok(());
        }
        let bad = |detail: String| CaptureError::BadTensor {
            key: key.to_string(),
            field: f.name.to_string(),
            detail,
        };
        let (ordinal, start, size) = self.ctx.allocation_of(f.ptr)?.ok_or_else(|| {
            bad(format!(
                "address {:#x} is not CUDA memory: pass a tensor on the GPU",
                f.ptr
            ))
        })?;
        if ordinal != self.device {
            return Err(bad(format!(
                "the tensor is on device {ordinal}, this writer copies from device {}: use one writer per device",
                self.device
            )));
        }
        let end = f.ptr.checked_add(f.bytes as u64);
        if end.is_none_or(|end| end > start.saturating_add(size)) {
            return Err(bad(format!(
                "{} bytes at {:#x} overrun the allocation {:#x}..{:#x}: pass a contiguous tensor",
                f.bytes,
                f.ptr,
                start,
                start.saturating_add(size)
            )));
        }
        Ok(())
    }

    fn stopped(&self) -> CaptureError {
        CaptureError::Stopped {
            unwritten: lock(&self.failure).unwritten,
        }
    }

    fn send(&self, msg: Msg) -> Result<(), CaptureError> {
        let tx = self.tx.as_ref().expect("sender lives until drop");
        if tx.send(msg).is_err() {
            // The threads ended: only a panic does that while the writer lives.
            return Err(self.stopped());
        }
        Ok(())
    }

    /// Blocks until every sample given so far was handed to the sink (or failed), and
    /// reports a failure.
    pub fn flush(&mut self) -> Result<(), CaptureError> {
        let (tx, rx) = channel();
        self.send(Msg::Flush(tx))?;
        let _ = rx.recv();
        self.check_threads()
    }

    /// Flushes and commits the dataset: what was given so far survives a crash.
    pub fn commit(&mut self) -> Result<(), CaptureError> {
        self.flush()?;
        if let Some(sink) = lock(&self.sink).as_mut() {
            if let Err(e) = sink.commit() {
                // The samples of a failed commit are not in the dataset: `contains` says so
                // from now on (every sample given was handed to the sink by the flush). The
                // dataset writer stopped: what is given next fails, naming those samples;
                // a writer opened again resumes after the last commit.
                if let Ok(held) = sink.existing_keys() {
                    self.keys = held.into_iter().collect();
                }
                return Err(e.into());
            }
        }
        Ok(())
    }

    /// Flushes, finishes the dataset and stops the threads. Returns the final counters, or
    /// the first error not yet reported.
    pub fn finish(mut self) -> Result<CaptureStats, CaptureError> {
        let flushed = self.flush();
        self.stop();
        flushed?;
        let sink = lock(&self.sink).take();
        if let Some(sink) = sink {
            sink.finish()?;
        }
        Ok(self.stats())
    }

    /// Ends the threads after they drained their queues.
    fn stop(&mut self) {
        self.tx = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for CudaWriter {
    fn drop(&mut self) {
        // The threads finish the samples in flight (uncommitted, like a dropped
        // DatasetWriter), so no copy outlives the buffers and keepalives it needs.
        self.stop();
        let _ = self.ctx.bind();
    }
}

fn completion_loop(ctx: &Context, ring: &Ring, rx: Receiver<Msg>, wtx: Sender<Msg>) {
    // Event waits do not need a current context; binding is for the driver's bookkeeping.
    let _ = ctx.bind();
    for msg in rx {
        let msg = match msg {
            Msg::Job(mut job) => {
                let done = match &job.storage {
                    Storage::Ring(slots) => &ring.slot(slots[0]).done,
                    Storage::Oversize(slot) => &slot.done,
                };
                match done.synchronize() {
                    // The copies are complete: the producer's memory may go.
                    Ok(()) => {
                        drop(job.keepalive.take());
                        ring.counters
                            .bytes_copied
                            .fetch_add(job.bytes, Ordering::Relaxed);
                    }
                    // A failed wait does not prove the copy engine is done with the memory:
                    // keep it alive (leak it) and stop handing out slots.
                    Err(e) => {
                        std::mem::forget(job.keepalive.take());
                        ring.poison();
                        job.error = Some(e);
                    }
                }
                Msg::Job(job)
            }
            other => other,
        };
        if wtx.send(msg).is_err() {
            break;
        }
    }
}

fn writer_loop(
    ctx: &Context,
    ring: &Ring,
    sink: &Mutex<Option<Box<dyn SampleSink>>>,
    failure: &Mutex<Failure>,
    rx: Receiver<Msg>,
) {
    let _ = ctx.bind();
    for msg in rx {
        let mut job = match msg {
            Msg::Job(job) => job,
            Msg::Flush(reply) => {
                let _ = reply.send(());
                continue;
            }
        };
        let stopped = {
            let f = lock(failure);
            f.first.is_some() || f.reported
        };
        // A job whose wait failed keeps its buffers: the copy engine may still write them.
        let waited = job.error.is_none();
        let result = match job.error.take() {
            Some(e) => Err(e),
            None if stopped => Ok(false),
            None => write_job(ring, sink, &job).map(|()| true),
        };
        match result {
            Ok(true) => {
                ring.counters
                    .samples_written
                    .fetch_add(1, Ordering::Relaxed);
            }
            Ok(false) => {
                let mut f = lock(failure);
                f.unwritten += 1;
                if let Some(CaptureError::Write { after, .. }) = f.first.as_mut() {
                    *after += 1;
                }
            }
            Err(e) => {
                let mut f = lock(failure);
                f.unwritten += 1;
                if f.first.is_none() && !f.reported {
                    f.first = Some(CaptureError::Write {
                        key: job.key.clone(),
                        source: Box::new(e),
                        after: 0,
                    });
                }
            }
        }
        match job.storage {
            Storage::Ring(slots) if waited => ring.release(&slots),
            Storage::Oversize(slot) if waited => {
                drop(slot);
                ring.release_oversize();
            }
            storage => std::mem::forget(storage),
        }
    }
}

/// Hands one completed job to the sink.
fn write_job(
    ring: &Ring,
    sink: &Mutex<Option<Box<dyn SampleSink>>>,
    job: &Job,
) -> Result<(), CaptureError> {
    // The job owns its slots: their locks are free.
    let bufs: Vec<MutexGuard<'_, Pinned>> = match &job.storage {
        Storage::Ring(slots) => slots.iter().map(|&i| ring.slot(i).buf()).collect(),
        Storage::Oversize(s) => vec![s.buf()],
    };
    let buf = |slot: usize| -> &Pinned {
        match &job.storage {
            Storage::Ring(_) => &bufs[slot],
            Storage::Oversize(_) => &bufs[0],
        }
    };
    // A field in one piece is read in place; one split across slots is joined.
    let joined: Vec<Option<Vec<u8>>> = job
        .fields
        .iter()
        .map(|(_, ps)| {
            (ps.len() > 1).then(|| {
                let mut v = Vec::with_capacity(ps.iter().map(|p| p.len).sum());
                for p in ps {
                    v.extend_from_slice(buf(p.slot).bytes(p.offset, p.len));
                }
                v
            })
        })
        .collect();
    let views: Vec<(&str, &[u8])> = job
        .fields
        .iter()
        .zip(&joined)
        .map(|((name, ps), j)| {
            let bytes: &[u8] = match (j, ps.first()) {
                (Some(v), _) => v,
                (None, Some(p)) => buf(p.slot).bytes(p.offset, p.len),
                (None, None) => &[],
            };
            (name.as_str(), bytes)
        })
        .collect();
    let mut guard = lock(sink);
    let sink = guard
        .as_mut()
        .ok_or(CaptureError::Stopped { unwritten: 0 })?;
    sink.append(&job.key, &views)?;
    Ok(())
}
