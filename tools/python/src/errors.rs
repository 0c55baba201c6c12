//! `HspackError`: one Python exception class carrying the context of [`hspack::Error`].

use std::path::Path;

use hspack::error::ChunkSite;
use hspack::Error;
use pyo3::prelude::*;
use pyo3::IntoPyObjectExt;

pyo3::create_exception!(
    hspack._hspack,
    HspackError,
    pyo3::exceptions::PyException,
    "An hspack error. `kind` names the Rust variant; `path`, `shard`, `chunk`, `key`, \
     `ordinal`, `field`, `rows`, `expected`, `found`, `option` and `detail` hold its context \
     (None where the variant has none)."
);

/// The attributes every `HspackError` carries.
pub const CONTEXT: [&str; 11] = [
    "path", "shard", "chunk", "key", "ordinal", "field", "rows", "expected", "found", "option",
    "detail",
];

#[derive(Default)]
struct Context {
    path: Option<String>,
    shard: Option<String>,
    chunk: Option<u64>,
    key: Option<String>,
    ordinal: Option<u64>,
    field: Option<String>,
    rows: Option<(u64, u64)>,
    expected: Option<String>,
    found: Option<String>,
    option: Option<String>,
    detail: Option<String>,
}

fn text(p: &Path) -> Option<String> {
    Some(p.display().to_string())
}

impl Context {
    fn site(site: &ChunkSite) -> Self {
        Context {
            shard: text(&site.shard),
            chunk: Some(site.chunk),
            key: Some(site.key.clone()),
            ordinal: Some(site.ordinal),
            field: Some(site.field.clone()),
            rows: Some((site.rows.start, site.rows.end)),
            ..Context::default()
        }
    }

    fn of(err: &Error) -> (&'static str, Context) {
        let c = Context::default();
        match err {
            Error::Io { path, op, .. } => (
                "Io",
                Context {
                    path: text(path),
                    detail: Some(op.to_string()),
                    ..c
                },
            ),
            Error::Format { path, source } => (
                "Format",
                Context {
                    path: text(path),
                    detail: Some(source.to_string()),
                    ..c
                },
            ),
            Error::NotADataset { path, why } => (
                "NotADataset",
                Context {
                    path: text(path),
                    detail: Some(why.clone()),
                    ..c
                },
            ),
            Error::AlreadyExists { path } => (
                "AlreadyExists",
                Context {
                    path: text(path),
                    ..c
                },
            ),
            Error::ShardMismatch {
                shard,
                what,
                expected,
                found,
                ..
            } => (
                "ShardMismatch",
                Context {
                    shard: text(shard),
                    detail: Some(what.to_string()),
                    expected: Some(expected.clone()),
                    found: Some(found.clone()),
                    ..c
                },
            ),
            Error::ForeignShard {
                shard,
                expected,
                found,
            } => (
                "ForeignShard",
                Context {
                    shard: text(shard),
                    expected: Some(expected.clone()),
                    found: Some(found.clone()),
                    ..c
                },
            ),
            Error::ChecksumMismatch {
                site,
                expected,
                found,
            } => (
                "ChecksumMismatch",
                Context {
                    expected: Some(expected.clone()),
                    found: Some(found.clone()),
                    ..Context::site(site)
                },
            ),
            Error::ChunkMisplaced {
                site,
                what,
                expected,
                found,
            } => (
                "ChunkMisplaced",
                Context {
                    detail: Some(what.to_string()),
                    expected: Some(expected.to_string()),
                    found: Some(found.to_string()),
                    ..Context::site(site)
                },
            ),
            Error::BadChunk { site, source } => (
                "BadChunk",
                Context {
                    detail: Some(source.to_string()),
                    ..Context::site(site)
                },
            ),
            Error::DirtyPadding { shard, offset } => (
                "DirtyPadding",
                Context {
                    shard: text(shard),
                    detail: Some(format!("offset {offset}")),
                    ..c
                },
            ),
            Error::SamplesTable { path, detail } => (
                "SamplesTable",
                Context {
                    path: text(path),
                    detail: Some(detail.clone()),
                    ..c
                },
            ),
            Error::NoSuchSample { ordinal, .. } => (
                "NoSuchSample",
                Context {
                    ordinal: Some(*ordinal),
                    ..c
                },
            ),
            Error::NoSuchKey { key } => (
                "NoSuchKey",
                Context {
                    key: Some(key.clone()),
                    ..c
                },
            ),
            Error::NoSuchField { name, available } => (
                "NoSuchField",
                Context {
                    field: Some(name.clone()),
                    detail: Some(available.clone()),
                    ..c
                },
            ),
            Error::RowsOutOfRange {
                key, start, end, ..
            } => (
                "RowsOutOfRange",
                Context {
                    key: Some(key.clone()),
                    rows: Some((*start, *end)),
                    ..c
                },
            ),
            Error::BadSample { key, field, detail } => (
                "BadSample",
                Context {
                    key: Some(key.clone()),
                    field: Some(field.clone()),
                    detail: Some(detail.clone()),
                    ..c
                },
            ),
            Error::NotAppended { key, cause } => {
                let (_, inner) = Context::of(cause);
                (
                    "NotAppended",
                    Context {
                        key: Some(key.clone()),
                        detail: Some(cause.to_string()),
                        ..inner
                    },
                )
            }
            Error::DatasetRewritten { path, opened, now } => (
                "DatasetRewritten",
                Context {
                    path: text(path),
                    expected: Some(opened.clone()),
                    found: Some(now.clone()),
                    ..c
                },
            ),
            Error::DatasetRemoved { path } => (
                "DatasetRemoved",
                Context {
                    path: text(path),
                    ..c
                },
            ),
            Error::DuplicateKey { key } => (
                "DuplicateKey",
                Context {
                    key: Some(key.clone()),
                    ..c
                },
            ),
            Error::KeyTaken { path, key, .. } => (
                "KeyTaken",
                Context {
                    path: text(path),
                    key: Some(key.clone()),
                    ..c
                },
            ),
            Error::SchemaMismatch { path, detail } => (
                "SchemaMismatch",
                Context {
                    path: text(path),
                    detail: Some(detail.clone()),
                    ..c
                },
            ),
            Error::Locked { path, holder } => (
                "Locked",
                Context {
                    path: text(path),
                    detail: Some(holder.clone()),
                    ..c
                },
            ),
            Error::WriterStopped { path, commit } => (
                "WriterStopped",
                Context {
                    path: text(path),
                    key: Some(commit.first.clone()),
                    detail: Some(commit.cause.clone()),
                    ..c
                },
            ),
            Error::ForkedWriter { path } => (
                "ForkedWriter",
                Context {
                    path: text(path),
                    ..c
                },
            ),
            Error::CommitConflict { path, detail } => (
                "CommitConflict",
                Context {
                    path: text(path),
                    detail: Some(detail.clone()),
                    ..c
                },
            ),
            Error::Unsupported { path, detail } => (
                "Unsupported",
                Context {
                    path: text(path),
                    detail: Some(detail.clone()),
                    ..c
                },
            ),
            Error::CopyRefused { path, detail } => (
                "CopyRefused",
                Context {
                    path: text(path),
                    detail: Some(detail.clone()),
                    ..c
                },
            ),
            Error::BadOption { option, detail } => (
                "BadOption",
                Context {
                    option: Some(option.to_string()),
                    detail: Some(detail.clone()),
                    ..c
                },
            ),
            _ => ("Other", c),
        }
    }
}

/// Builds the exception object for `kind` with `message` and context.
fn build(py: Python<'_>, kind: &str, message: String, c: Context) -> PyErr {
    let err = HspackError::new_err(message);
    let v = err.value(py);
    let set = |name: &str, value: PyResult<Bound<'_, PyAny>>| {
        if let Ok(value) = value {
            let _ = v.setattr(name, value);
        }
    };
    set("kind", kind.into_bound_py_any(py));
    set("path", c.path.into_bound_py_any(py));
    set("shard", c.shard.into_bound_py_any(py));
    set("chunk", c.chunk.into_bound_py_any(py));
    set("key", c.key.into_bound_py_any(py));
    set("ordinal", c.ordinal.into_bound_py_any(py));
    set("field", c.field.into_bound_py_any(py));
    set("rows", c.rows.into_bound_py_any(py));
    set("expected", c.expected.into_bound_py_any(py));
    set("found", c.found.into_bound_py_any(py));
    set("option", c.option.into_bound_py_any(py));
    set("detail", c.detail.into_bound_py_any(py));
    err
}

/// Converts a library error into an `HspackError`.
pub fn to_py(err: Error) -> PyErr {
    let (kind, context) = Context::of(&err);
    Python::with_gil(|py| build(py, kind, err.to_string(), context))
}

/// An `HspackError` of `kind` for errors outside the dataset layers (CUDA capture).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub fn other(
    kind: &str,
    message: String,
    key: Option<String>,
    field: Option<String>,
    detail: Option<String>,
) -> PyErr {
    Python::with_gil(|py| {
        build(
            py,
            kind,
            message,
            Context {
                key,
                field,
                detail,
                ..Context::default()
            },
        )
    })
}

/// An `HspackError` of kind `BadOption`.
pub fn bad_option(option: &str, detail: &str) -> PyErr {
    Python::with_gil(|py| {
        build(
            py,
            "BadOption",
            format!("option {option}: {detail}"),
            Context {
                option: Some(option.to_string()),
                detail: Some(detail.to_string()),
                ..Context::default()
            },
        )
    })
}

/// Extension trait: `?` on library results inside `#[pymethods]`.
pub trait IntoPy<T> {
    /// Converts the error side.
    fn py_err(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for hspack::Result<T> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}
