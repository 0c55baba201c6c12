//! The CUDA driver, loaded at run time, and owning wrappers of its handles.
//!
//! `libcuda.so.1` (`nvcuda.dll` on Windows) is opened on first use, so hspack builds and runs
//! on machines without CUDA and reports [`CaptureError::NoDriver`] only when a writer is
//! opened. Handle and flag types come from `cudarc`'s driver bindings; the entry points are
//! resolved here, one by one and only those this module calls, so that a driver that lacks an
//! unrelated symbol of a newer toolkit still works, and nothing panics when the library is
//! missing. Results are read as plain integers, never as a Rust enum, so an unknown code from
//! a newer driver stays defined behaviour.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

use cudarc::driver::sys::{
    CUcontext, CUdevice, CUdeviceptr, CUevent, CUevent_flags_enum, CUstream, CUstream_flags_enum,
    CU_MEMHOSTALLOC_PORTABLE,
};

use super::error::CaptureError;

/// Environment variable naming the driver library to open instead of the default.
pub const LIBCUDA_ENV: &str = "HSPACK_LIBCUDA";

#[cfg(windows)]
const DEFAULT_LIB: &str = "nvcuda.dll";
#[cfg(not(windows))]
const DEFAULT_LIB: &str = "libcuda.so.1";

type Res = c_int;
const SUCCESS: Res = 0;
const POINTER_DEVICE_ORDINAL: c_int = 9;
const POINTER_RANGE_START: c_int = 11;
const POINTER_RANGE_SIZE: c_int = 12;

/// The entry points this module calls.
pub(crate) struct Driver {
    _lib: libloading::Library,
    init: unsafe extern "C" fn(c_uint) -> Res,
    driver_get_version: unsafe extern "C" fn(*mut c_int) -> Res,
    device_get_count: unsafe extern "C" fn(*mut c_int) -> Res,
    device_get: unsafe extern "C" fn(*mut CUdevice, c_int) -> Res,
    primary_ctx_retain: unsafe extern "C" fn(*mut CUcontext, CUdevice) -> Res,
    primary_ctx_release: unsafe extern "C" fn(CUdevice) -> Res,
    ctx_set_current: unsafe extern "C" fn(CUcontext) -> Res,
    stream_create: unsafe extern "C" fn(*mut CUstream, c_uint) -> Res,
    stream_destroy: unsafe extern "C" fn(CUstream) -> Res,
    stream_wait_event: unsafe extern "C" fn(CUstream, CUevent, c_uint) -> Res,
    stream_synchronize: unsafe extern "C" fn(CUstream) -> Res,
    event_create: unsafe extern "C" fn(*mut CUevent, c_uint) -> Res,
    event_destroy: unsafe extern "C" fn(CUevent) -> Res,
    event_record: unsafe extern "C" fn(CUevent, CUstream) -> Res,
    event_synchronize: unsafe extern "C" fn(CUevent) -> Res,
    mem_host_alloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> Res,
    mem_free_host: unsafe extern "C" fn(*mut c_void) -> Res,
    memcpy_dtoh_async: unsafe extern "C" fn(*mut c_void, CUdeviceptr, usize, CUstream) -> Res,
    pointer_get_attributes:
        unsafe extern "C" fn(c_uint, *mut c_int, *mut *mut c_void, CUdeviceptr) -> Res,
    get_error_name: unsafe extern "C" fn(Res, *mut *const c_char) -> Res,
    get_error_string: unsafe extern "C" fn(Res, *mut *const c_char) -> Res,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Driver")
    }
}

/// Why loading failed, kept so that every later call reports the same error.
#[derive(Debug, Clone)]
enum LoadFailure {
    NoLibrary {
        library: String,
        detail: String,
    },
    MissingSymbol {
        symbol: &'static str,
        detail: String,
    },
    Init {
        code: Res,
    },
}

impl LoadFailure {
    fn to_error(&self) -> CaptureError {
        match self {
            LoadFailure::NoLibrary { library, detail } => CaptureError::NoDriver {
                library: library.clone(),
                detail: detail.clone(),
            },
            LoadFailure::MissingSymbol { symbol, detail } => CaptureError::OldDriver {
                symbol,
                detail: detail.clone(),
            },
            LoadFailure::Init { code } => CaptureError::Driver {
                call: "cuInit",
                code: *code,
                name: format!("CUresult {code}"),
                message: "the driver did not initialise (no GPU visible, or a driver/kernel module mismatch)".into(),
            },
        }
    }
}

/// The library to open: [`LIBCUDA_ENV`] if set, else the platform's default name.
fn library_name() -> String {
    std::env::var(LIBCUDA_ENV).unwrap_or_else(|_| DEFAULT_LIB.to_string())
}

/// The driver of this process, loaded and initialised on first use.
pub(crate) fn driver() -> Result<&'static Driver, CaptureError> {
    static DRIVER: OnceLock<Result<Driver, LoadFailure>> = OnceLock::new();
    DRIVER
        .get_or_init(|| Driver::load(&library_name()))
        .as_ref()
        .map_err(LoadFailure::to_error)
}

/// Opens `library` and reports the first problem as [`CaptureError`]; used by tests to check
/// the message without touching the process-wide driver.
#[cfg(test)]
pub(crate) fn probe(library: &str) -> Result<(), CaptureError> {
    Driver::load(library).map(drop).map_err(|f| f.to_error())
}

macro_rules! load {
    ($lib:expr, $name:literal) => {{
        // SAFETY: the hazard is calling through a pointer of the wrong signature. The field's
        // type, fixed by the struct above, is the C prototype of `$name` in cuda.h (CUDA 12 and
        // 13; the `_v2` names are the ones cuda.h maps the plain names to).
        match unsafe { $lib.get($name.as_bytes()) } {
            Ok(sym) => *sym,
            Err(e) => {
                return Err(LoadFailure::MissingSymbol {
                    symbol: $name,
                    detail: e.to_string(),
                })
            }
        }
    }};
}

impl Driver {
    fn load(library: &str) -> Result<Driver, LoadFailure> {
        // SAFETY: the hazard is running a library's initialisers; libcuda's are those every
        // CUDA program runs, and no other library is named here unless the user names it.
        let lib =
            unsafe { libloading::Library::new(library) }.map_err(|e| LoadFailure::NoLibrary {
                library: library.to_string(),
                detail: e.to_string(),
            })?;
        let d = Driver {
            init: load!(lib, "cuInit"),
            driver_get_version: load!(lib, "cuDriverGetVersion"),
            device_get_count: load!(lib, "cuDeviceGetCount"),
            device_get: load!(lib, "cuDeviceGet"),
            primary_ctx_retain: load!(lib, "cuDevicePrimaryCtxRetain"),
            primary_ctx_release: load!(lib, "cuDevicePrimaryCtxRelease_v2"),
            ctx_set_current: load!(lib, "cuCtxSetCurrent"),
            stream_create: load!(lib, "cuStreamCreate"),
            stream_destroy: load!(lib, "cuStreamDestroy_v2"),
            stream_wait_event: load!(lib, "cuStreamWaitEvent"),
            stream_synchronize: load!(lib, "cuStreamSynchronize"),
            event_create: load!(lib, "cuEventCreate"),
            event_destroy: load!(lib, "cuEventDestroy_v2"),
            event_record: load!(lib, "cuEventRecord"),
            event_synchronize: load!(lib, "cuEventSynchronize"),
            mem_host_alloc: load!(lib, "cuMemHostAlloc"),
            mem_free_host: load!(lib, "cuMemFreeHost"),
            memcpy_dtoh_async: load!(lib, "cuMemcpyDtoHAsync_v2"),
            pointer_get_attributes: load!(lib, "cuPointerGetAttributes"),
            get_error_name: load!(lib, "cuGetErrorName"),
            get_error_string: load!(lib, "cuGetErrorString"),
            _lib: lib,
        };
        // SAFETY: cuInit takes flags by value (0 is the only defined value) and touches no
        // memory of ours.
        let code = unsafe { (d.init)(0) };
        if code != SUCCESS {
            return Err(LoadFailure::Init { code });
        }
        Ok(d)
    }

    /// Turns a result code into an error naming the call.
    pub(crate) fn check(&self, call: &'static str, code: Res) -> Result<(), CaptureError> {
        if code == SUCCESS {
            return Ok(());
        }
        let text = |f: unsafe extern "C" fn(Res, *mut *const c_char) -> Res| {
            let mut p: *const c_char = std::ptr::null();
            // SAFETY: the hazard is reading a dangling string. The driver writes a pointer to
            // a static NUL-terminated string, or leaves null for an unknown code (checked).
            unsafe {
                if f(code, &mut p) == SUCCESS && !p.is_null() {
                    CStr::from_ptr(p).to_string_lossy().into_owned()
                } else {
                    format!("CUresult {code}")
                }
            }
        };
        Err(CaptureError::Driver {
            call,
            code,
            name: text(self.get_error_name),
            message: text(self.get_error_string),
        })
    }

    /// The driver's CUDA version, e.g. 13000 for 13.0.
    pub(crate) fn version(&self) -> Result<i32, CaptureError> {
        let mut v = 0;
        // SAFETY: writes one int through a valid pointer.
        self.check("cuDriverGetVersion", unsafe {
            (self.driver_get_version)(&mut v)
        })?;
        Ok(v)
    }

    /// Devices visible to this process.
    pub(crate) fn device_count(&self) -> Result<i32, CaptureError> {
        let mut n = 0;
        // SAFETY: writes one int through a valid pointer.
        self.check("cuDeviceGetCount", unsafe {
            (self.device_get_count)(&mut n)
        })?;
        Ok(n)
    }
}

/// The primary context of one device, retained while this lives.
#[derive(Debug)]
pub(crate) struct Context {
    drv: &'static Driver,
    device: CUdevice,
    ctx: CUcontext,
}

// SAFETY: a CUcontext handle may be used from any thread (the driver API is thread-safe);
// each thread binds it with `bind` before it calls the driver.
unsafe impl Send for Context {}
// SAFETY: as above; `&Context` only binds the handle or reads it.
unsafe impl Sync for Context {}

impl Context {
    /// Retains the primary context of `ordinal`: the one PyTorch, CuPy and JAX use, so their
    /// pointers and streams are valid in it.
    pub(crate) fn primary(drv: &'static Driver, ordinal: i32) -> Result<Self, CaptureError> {
        let count = drv.device_count()?;
        if ordinal < 0 || ordinal >= count {
            return Err(CaptureError::NoDevice {
                device: ordinal,
                count,
            });
        }
        let mut device: CUdevice = 0;
        // SAFETY: writes one device handle through a valid pointer; the ordinal is in range.
        drv.check("cuDeviceGet", unsafe {
            (drv.device_get)(&mut device, ordinal)
        })?;
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: writes one context handle through a valid pointer; released in Drop.
        drv.check("cuDevicePrimaryCtxRetain", unsafe {
            (drv.primary_ctx_retain)(&mut ctx, device)
        })?;
        Ok(Context { drv, device, ctx })
    }

    /// Makes the context current on the calling thread.
    pub(crate) fn bind(&self) -> Result<(), CaptureError> {
        // SAFETY: the handle is retained until Drop, so it is live.
        self.drv.check("cuCtxSetCurrent", unsafe {
            (self.drv.ctx_set_current)(self.ctx)
        })
    }

    /// The driver.
    pub(crate) fn driver(&self) -> &'static Driver {
        self.drv
    }

    /// The device ordinal holding `ptr` and the allocation `[start, start + size)` around it;
    /// `None` when `ptr` is not CUDA memory. One driver call.
    pub(crate) fn allocation_of(&self, ptr: u64) -> Result<Option<(i32, u64, u64)>, CaptureError> {
        let d = self.drv;
        let mut ordinal: c_int = -1;
        let mut start: CUdeviceptr = 0;
        let mut size: usize = 0;
        let mut attrs = [
            POINTER_DEVICE_ORDINAL,
            POINTER_RANGE_START,
            POINTER_RANGE_SIZE,
        ];
        let mut data: [*mut c_void; 3] = [
            (&mut ordinal as *mut c_int).cast(),
            (&mut start as *mut CUdeviceptr).cast(),
            (&mut size as *mut usize).cast(),
        ];
        // SAFETY: the hazard is the driver writing through `data`. Each entry points to a live
        // local of the type the matching attribute is documented to write (int, CUdeviceptr,
        // size_t), and both arrays hold exactly the 3 entries the count says. The driver only
        // looks `ptr` up, it does not dereference it.
        d.check("cuPointerGetAttributes", unsafe {
            (d.pointer_get_attributes)(3, attrs.as_mut_ptr(), data.as_mut_ptr(), ptr)
        })?;
        // For an address the driver does not know, it reports success and ordinal -2.
        Ok((ordinal >= 0).then_some((ordinal, start, size as u64)))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `primary`; every stream, event and pinned buffer of
        // this context is dropped before it (the writer owns them and drops them first).
        unsafe {
            (self.drv.primary_ctx_release)(self.device);
        }
    }
}

/// A stream of the writer's own, non-blocking with respect to the legacy default stream.
#[derive(Debug)]
pub(crate) struct Stream {
    drv: &'static Driver,
    raw: CUstream,
}

// SAFETY: stream handles may be used from any thread with the context bound.
unsafe impl Send for Stream {}
// SAFETY: as above; the driver serialises work submitted to one stream.
unsafe impl Sync for Stream {}

impl Stream {
    /// A new stream in the current context.
    pub(crate) fn new(drv: &'static Driver) -> Result<Self, CaptureError> {
        let mut raw: CUstream = std::ptr::null_mut();
        let flags = CUstream_flags_enum::CU_STREAM_NON_BLOCKING as c_uint;
        // SAFETY: writes one stream handle through a valid pointer; destroyed in Drop.
        drv.check("cuStreamCreate", unsafe {
            (drv.stream_create)(&mut raw, flags)
        })?;
        Ok(Stream { drv, raw })
    }

    /// Makes later work on this stream wait for `event`'s last record.
    pub(crate) fn wait(&self, event: &Event) -> Result<(), CaptureError> {
        // SAFETY: both handles are live (owned by their wrappers).
        self.drv.check("cuStreamWaitEvent", unsafe {
            (self.drv.stream_wait_event)(self.raw, event.raw, 0)
        })
    }

    /// Blocks until all work on this stream is done.
    pub(crate) fn synchronize(&self) -> Result<(), CaptureError> {
        // SAFETY: the handle is live.
        self.drv.check("cuStreamSynchronize", unsafe {
            (self.drv.stream_synchronize)(self.raw)
        })
    }

    /// Copies `len` bytes from device address `src` into `dst[offset..offset + len]`,
    /// asynchronously on this stream.
    ///
    /// The bounds of `dst` are checked here. The device range must lie in one allocation
    /// (checked by the caller with [`Context::allocation_of`]); `dst` must not be read, reused
    /// or freed until an event recorded after this call has completed, which the ring's slot
    /// ownership guarantees.
    pub(crate) fn copy_to_host(
        &self,
        dst: &Pinned,
        offset: usize,
        src: u64,
        len: usize,
    ) -> Result<(), CaptureError> {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= dst.len),
            "copy of {len} bytes at {offset} overruns a pinned buffer of {}",
            dst.len
        );
        // SAFETY: the hazards are a host overrun and a buffer reused while the copy engine
        // still writes it. The range is inside `dst` (asserted above). `dst` stays allocated
        // and unread until the completion event recorded after this copy is synchronised:
        // its slot belongs to one job until the writer thread releases it, after that event.
        self.drv.check("cuMemcpyDtoHAsync", unsafe {
            (self.drv.memcpy_dtoh_async)(dst.ptr.add(offset).cast(), src, len, self.raw)
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: the handle is live and not used after this; pending work still completes.
        unsafe {
            (self.drv.stream_destroy)(self.raw);
        }
    }
}

/// An event without timing; waits on it block the thread instead of spinning.
#[derive(Debug)]
pub(crate) struct Event {
    drv: &'static Driver,
    raw: CUevent,
}

// SAFETY: event handles may be used from any thread with the context bound.
unsafe impl Send for Event {}
// SAFETY: as above; recording and waiting are serialised by the writer's protocol.
unsafe impl Sync for Event {}

impl Event {
    /// A new event in the current context.
    pub(crate) fn new(drv: &'static Driver) -> Result<Self, CaptureError> {
        let mut raw: CUevent = std::ptr::null_mut();
        let flags = CUevent_flags_enum::CU_EVENT_DISABLE_TIMING as c_uint
            | CUevent_flags_enum::CU_EVENT_BLOCKING_SYNC as c_uint;
        // SAFETY: writes one event handle through a valid pointer; destroyed in Drop.
        drv.check("cuEventCreate", unsafe {
            (drv.event_create)(&mut raw, flags)
        })?;
        Ok(Event { drv, raw })
    }

    /// Records the event on `stream`, a raw handle of any stream of the context: the
    /// producer's (PyTorch's current stream), 0 for the legacy default stream, or ours.
    pub(crate) fn record_raw(&self, stream: u64) -> Result<(), CaptureError> {
        // SAFETY: the event is live. A stale or foreign stream handle makes the driver return
        // an error (or, for a destroyed stream, is undefined in CUDA): the caller passes the
        // producer's current stream, which its framework keeps alive.
        self.drv.check("cuEventRecord", unsafe {
            (self.drv.event_record)(self.raw, stream as usize as CUstream)
        })
    }

    /// Records the event on one of our streams.
    pub(crate) fn record(&self, stream: &Stream) -> Result<(), CaptureError> {
        // SAFETY: both handles are live.
        self.drv.check("cuEventRecord", unsafe {
            (self.drv.event_record)(self.raw, stream.raw)
        })
    }

    /// Makes later work on the raw stream `stream` wait for this event's last record.
    pub(crate) fn wait_on_raw(&self, stream: u64) -> Result<(), CaptureError> {
        // SAFETY: the event is live; the stream handle is the producer's, as in `record_raw`.
        self.drv.check("cuStreamWaitEvent", unsafe {
            (self.drv.stream_wait_event)(stream as usize as CUstream, self.raw, 0)
        })
    }

    /// Blocks the calling thread until the work before the last record is done.
    pub(crate) fn synchronize(&self) -> Result<(), CaptureError> {
        // SAFETY: the handle is live.
        self.drv.check("cuEventSynchronize", unsafe {
            (self.drv.event_synchronize)(self.raw)
        })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: the handle is live and not used after this.
        unsafe {
            (self.drv.event_destroy)(self.raw);
        }
    }
}

/// Page-locked host memory, reachable by the copy engines.
#[derive(Debug)]
pub(crate) struct Pinned {
    drv: &'static Driver,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is plain host memory owned by this value; who may write it (the copy
// engine, between a copy and its completion event) and who may read it (the writer thread,
// after that event) is decided by the ring's slot ownership, never by two parties at once.
unsafe impl Send for Pinned {}
// SAFETY: as above; shared references only read after the completion event.
unsafe impl Sync for Pinned {}

impl Pinned {
    /// Allocates `len` bytes in the current context, portable to all contexts; no memory for
    /// `len` 0 (a slot not used yet).
    pub(crate) fn new(drv: &'static Driver, len: usize) -> Result<Self, CaptureError> {
        let mut p: *mut c_void = std::ptr::null_mut();
        if len > 0 {
            // SAFETY: writes one pointer through a valid pointer; freed in Drop.
            drv.check("cuMemHostAlloc", unsafe {
                (drv.mem_host_alloc)(&mut p, len, CU_MEMHOSTALLOC_PORTABLE)
            })?;
        }
        Ok(Pinned {
            drv,
            ptr: p.cast(),
            len,
        })
    }

    /// Bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Reads `len` bytes at `offset`.
    ///
    /// Call only after the completion event of every copy into this range has been
    /// synchronised, while holding the buffer's slot.
    pub(crate) fn bytes(&self, offset: usize, len: usize) -> &[u8] {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len),
            "read of {len} bytes at {offset} overruns a pinned buffer of {}",
            self.len
        );
        if len == 0 {
            return &[];
        }
        // SAFETY: the hazard is reading memory the copy engine still writes. The range is in
        // bounds (asserted); the writer reads a slot only after synchronising the completion
        // event recorded after its copies, and nobody writes it until the slot is released,
        // which needs this borrow to end.
        unsafe { std::slice::from_raw_parts(self.ptr.add(offset), len) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if self.ptr.is_null() {
            return;
        }
        // SAFETY: the hazard is freeing memory a copy still writes: a buffer is dropped only
        // after its last completion event was synchronised (or its stream synchronised).
        unsafe {
            (self.drv.mem_free_host)(self.ptr.cast());
        }
    }
}
