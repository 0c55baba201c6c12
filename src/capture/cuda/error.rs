//! Errors of the CUDA capture writer.

/// An error of [`CudaWriter`](super::CudaWriter).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaptureError {
    /// The CUDA driver library could not be opened.
    #[error("no CUDA driver: cannot load {library} ({detail}); run on a machine with an NVIDIA GPU and driver, or set HSPACK_LIBCUDA to the driver library's path")]
    NoDriver {
        /// Library name or path tried.
        library: String,
        /// The loader's message.
        detail: String,
    },
    /// The driver lacks an entry point the writer needs.
    #[error("the CUDA driver has no {symbol} ({detail}): it is older than CUDA 12; update the NVIDIA driver")]
    OldDriver {
        /// Entry point.
        symbol: &'static str,
        /// The loader's message.
        detail: String,
    },
    /// A driver call failed.
    #[error("{call} failed: {name}: {message}")]
    Driver {
        /// Driver function.
        call: &'static str,
        /// CUresult code.
        code: i32,
        /// Code name, e.g. `CUDA_ERROR_INVALID_VALUE`.
        name: String,
        /// The driver's description.
        message: String,
    },
    /// The device ordinal does not exist.
    #[error("CUDA device {device} does not exist: {count} devices are visible (check CUDA_VISIBLE_DEVICES)")]
    NoDevice {
        /// Ordinal asked for.
        device: i32,
        /// Devices visible.
        count: i32,
    },
    /// A field's memory is not device memory of this writer's device, or overruns it.
    #[error("sample `{key}`, field `{field}`: {detail}")]
    BadTensor {
        /// Sample key.
        key: String,
        /// Field name.
        field: String,
        /// What is wrong and what to do.
        detail: String,
    },
    /// The dataset layer refused something (opening, a sample that does not fit the schema, a
    /// duplicate key, committing).
    #[error(transparent)]
    Dataset(Box<crate::Error>),
    /// The writer thread could not write a sample; it and the samples after it were not
    /// written.
    #[error("sample `{key}` was not written: {source}; it and {after} samples after it are lost from this writer: fix the cause, reopen the dataset (it resumes after its last commit) and capture them again")]
    Write {
        /// Key of the first sample not written.
        key: String,
        /// Cause.
        #[source]
        source: Box<CaptureError>,
        /// Samples given after it that were not written either (so far).
        after: u64,
    },
    /// The writer stopped after an error that was already reported.
    #[error("the writer stopped after an earlier error (reported then); {unwritten} samples given to it were not written: reopen the dataset to go on")]
    Stopped {
        /// Samples given to the writer and not written.
        unwritten: u64,
    },
    /// A bad option value.
    #[error("option {option}: {detail}")]
    BadOption {
        /// Option name.
        option: &'static str,
        /// What is wrong.
        detail: String,
    },
}

impl From<crate::Error> for CaptureError {
    fn from(e: crate::Error) -> Self {
        CaptureError::Dataset(Box::new(e))
    }
}
