//! The inert value tree a pickle decodes to.

use crate::format::DType;

/// A decoded pickle value. Nothing in it is callable: globals stay symbolic, and the
/// few allowed constructors (tensors, storages, numpy arrays, ordered dicts) are
/// already resolved into data.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Value {
    /// Python `None`.
    None,
    /// Python `bool`.
    Bool(bool),
    /// A Python `int` that fits in 64 bits.
    Int(i64),
    /// A larger Python `int`, as little-endian two's-complement bytes.
    BigInt(Vec<u8>),
    /// Python `float`.
    Float(f64),
    /// Python `str`.
    Str(String),
    /// Python `bytes` or `bytearray` (or a legacy byte string that is not UTF-8).
    Bytes(Vec<u8>),
    /// Python `list`.
    List(Vec<Value>),
    /// Python `tuple` (also `torch.Size`).
    Tuple(Vec<Value>),
    /// Python `set` or `frozenset`.
    Set(Vec<Value>),
    /// Python `dict` or `collections.OrderedDict`, in insertion order.
    Dict(Vec<(Value, Value)>),
    /// A reference to an allowed global that was not called (a class or dtype object).
    Global {
        /// Module, e.g. `torch`.
        module: String,
        /// Name within the module, e.g. `bfloat16`.
        name: String,
    },
    /// A `torch.device`.
    Device(String),
    /// A storage named by a persistent id.
    Storage(StorageRef),
    /// A tensor view of a storage.
    Tensor(TensorRef),
    /// A numpy array whose bytes are inside the pickle.
    NdArray(NdArray),
    /// A tensor of a dtype hspack does not store (complex, unsigned wider than 8 bits, ...):
    /// kept as a marker so that a file is refused only when a field uses it.
    UnsupportedTensor {
        /// The dtype as torch names it, e.g. `torch.complex64` or `torch.ComplexFloatStorage`.
        dtype: String,
        /// Size of each dimension.
        shape: Vec<u64>,
    },
}

/// The element type a storage was saved with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StorageKind {
    /// The Python class name, e.g. `BFloat16Storage` or `UntypedStorage`.
    pub class: &'static str,
    /// The hspack dtype, if the storage holds one hspack supports (`None` for untyped storages
    /// and foreign dtypes such as complex numbers).
    pub dtype: Option<DType>,
    /// Bytes per storage element; also the unit torch byte-swaps big-endian data in.
    pub element_size: u64,
}

/// A storage named by a pickle's persistent id.
#[derive(Debug, Clone, PartialEq)]
pub struct StorageRef {
    /// The key naming the storage's bytes (`data/<key>` in a zip, or the legacy key).
    pub key: String,
    /// The element type the storage was saved with.
    pub kind: StorageKind,
    /// Number of elements declared by the pickle.
    pub numel: u64,
    /// Device the storage lived on when saved (`cpu`, `cuda:0`, ...).
    pub location: String,
    /// Legacy format only: this storage is a view `(offset, numel)`, in elements, of `key`.
    pub view: Option<(u64, u64)>,
}

/// A tensor as a strided view into a storage.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorRef {
    /// Element type.
    pub dtype: DType,
    /// Size of each dimension.
    pub shape: Vec<u64>,
    /// Step between elements along each dimension, in elements.
    pub strides: Vec<i64>,
    /// Index of the first element within the storage, in elements of `dtype`.
    pub storage_offset: u64,
    /// The storage holding the bytes.
    pub storage: StorageRef,
    /// Whether the tensor was saved with `requires_grad` (e.g. an `nn.Parameter`).
    pub requires_grad: bool,
}

impl TensorRef {
    /// Number of elements, or `None` if it overflows `u64`.
    pub fn numel(&self) -> Option<u64> {
        self.shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
    }
}

/// A numpy array stored inline in a pickle.
#[derive(Debug, Clone, PartialEq)]
pub struct NdArray {
    /// Element type.
    pub dtype: DType,
    /// Size of each dimension.
    pub shape: Vec<u64>,
    /// Whether `data` is in Fortran (column-major) order.
    pub fortran_order: bool,
    /// Whether elements are big-endian.
    pub big_endian: bool,
    /// The raw element bytes.
    pub data: Vec<u8>,
}

/// A tensor-like leaf found while walking a value tree.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TensorLike<'a> {
    /// A torch tensor backed by a storage.
    Tensor(&'a TensorRef),
    /// A numpy array with inline bytes.
    NdArray(&'a NdArray),
}

impl TensorLike<'_> {
    /// Element type.
    pub fn dtype(&self) -> DType {
        match self {
            TensorLike::Tensor(t) => t.dtype,
            TensorLike::NdArray(a) => a.dtype,
        }
    }

    /// Shape.
    pub fn shape(&self) -> &[u64] {
        match self {
            TensorLike::Tensor(t) => &t.shape,
            TensorLike::NdArray(a) => &a.shape,
        }
    }
}

impl Value {
    /// The value under a string key, if `self` is a dict holding one.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Dict(items) => items.iter().find_map(|(k, v)| match k {
                Value::Str(s) if s == key => Some(v),
                _ => None,
            }),
            _ => None,
        }
    }

    /// Items of a list, tuple or set.
    pub fn items(&self) -> Option<&[Value]> {
        match self {
            Value::List(v) | Value::Tuple(v) | Value::Set(v) => Some(v),
            _ => None,
        }
    }

    /// The string, if this is a `str`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The integer, if this is an `int` that fits in 64 bits (or a bool).
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Bool(b) => Some(i64::from(*b)),
            _ => None,
        }
    }

    /// The tensor, if this is one.
    pub fn as_tensor(&self) -> Option<&TensorRef> {
        match self {
            Value::Tensor(t) => Some(t),
            _ => None,
        }
    }

    /// What the value is, in words: `a str`, `an int`, `a tensor`, ...
    pub fn kind(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "a bool",
            Value::Int(_) => "an int",
            Value::BigInt(_) => "an int wider than 64 bits",
            Value::Float(_) => "a float",
            Value::Str(_) => "a str",
            Value::Bytes(_) => "bytes",
            Value::List(_) => "a list",
            Value::Tuple(_) => "a tuple",
            Value::Set(_) => "a set",
            Value::Dict(_) => "a dict",
            Value::Global { .. } => "a class or dtype",
            Value::Device(_) => "a torch.device",
            Value::Storage(_) => "a storage",
            Value::Tensor(_) => "a tensor",
            Value::NdArray(_) => "a numpy array",
            Value::UnsupportedTensor { .. } => "a tensor of a dtype hspack does not store",
        }
    }

    /// Every value in the tree that holds data but is not a tensor (a str, a number, bytes, a
    /// bare storage), with its path (as in [`Value::tensors`]) and [`Value::kind`]: what a
    /// dataset, which keeps tensors, does not hold. `None`, dtypes and devices say nothing of
    /// a sample and are left out.
    pub fn values(&self) -> Vec<(String, &'static str)> {
        let mut out = Vec::new();
        walk(self, &mut String::new(), &mut |path, v| match v {
            Value::Bool(_)
            | Value::Int(_)
            | Value::BigInt(_)
            | Value::Float(_)
            | Value::Str(_)
            | Value::Bytes(_)
            | Value::Storage(_) => out.push((path.to_string(), v.kind())),
            _ => {}
        });
        out
    }

    /// Every tensor of a dtype hspack does not store, with its path (as in [`Value::tensors`]),
    /// dtype name and shape.
    pub fn unsupported_tensors(&self) -> Vec<crate::convert::UnsupportedInfo> {
        let mut out = Vec::new();
        walk(self, &mut String::new(), &mut |path, v| {
            if let Value::UnsupportedTensor { dtype, shape } = v {
                out.push(crate::convert::UnsupportedInfo {
                    name: path.to_string(),
                    dtype: dtype.clone(),
                    shape: shape.clone(),
                });
            }
        });
        out
    }

    /// Every tensor and numpy array in the tree with its path: dict keys and list indices
    /// joined by `.` (e.g. `hidden_states`, `aux.0`). A root tensor has the empty path.
    /// Dict keys that are not strings, ints or bools are skipped along with their values.
    pub fn tensors(&self) -> Vec<(String, TensorLike<'_>)> {
        let mut out = Vec::new();
        walk(self, &mut String::new(), &mut |path, v| match v {
            Value::Tensor(t) => out.push((path.to_string(), TensorLike::Tensor(t))),
            Value::NdArray(a) => out.push((path.to_string(), TensorLike::NdArray(a))),
            _ => {}
        });
        out
    }
}

/// Calls `leaf(path, value)` for every value in the tree that is not a list, tuple, set or
/// dict, with its path: dict keys and list indices joined by `.`. Dict keys that are not
/// strings, ints or bools are skipped along with their values.
fn walk<'a>(v: &'a Value, path: &mut String, leaf: &mut dyn FnMut(&str, &'a Value)) {
    let mut child = |segment: &str, child: &'a Value, path: &mut String| {
        let len = path.len();
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(segment);
        walk(child, path, leaf);
        path.truncate(len);
    };
    match v {
        Value::List(items) | Value::Tuple(items) | Value::Set(items) => {
            for (i, item) in items.iter().enumerate() {
                child(&i.to_string(), item, path);
            }
        }
        Value::Dict(items) => {
            for (k, item) in items {
                let segment = match k {
                    Value::Str(s) => s.clone(),
                    Value::Int(i) => i.to_string(),
                    Value::Bool(b) => b.to_string(),
                    _ => continue,
                };
                child(&segment, item, path);
            }
        }
        _ => leaf(path, v),
    }
}

impl Value {
    /// Every storage referenced in the tree (directly or through a tensor), in tree order,
    /// possibly with repeats.
    pub fn storages(&self) -> Vec<&StorageRef> {
        let mut out = Vec::new();
        collect_storages(self, &mut out);
        out
    }
}

fn collect_storages<'a>(v: &'a Value, out: &mut Vec<&'a StorageRef>) {
    match v {
        Value::Storage(s) => out.push(s),
        Value::Tensor(t) => out.push(&t.storage),
        Value::List(items) | Value::Tuple(items) | Value::Set(items) => {
            items.iter().for_each(|i| collect_storages(i, out));
        }
        Value::Dict(items) => items.iter().for_each(|(k, v)| {
            collect_storages(k, out);
            collect_storages(v, out);
        }),
        _ => {}
    }
}
