//! What the allowed globals mean: each "call" builds inert data, nothing is executed.

use std::collections::HashMap;

use super::globals::{self, Allowed, UNTYPED};
use super::value::{NdArray, StorageKind, StorageRef, TensorRef, Value};
use super::vm::{Id, Machine, Node};
use crate::convert::ConvertError;
use crate::format::DType;

fn bad_call(m: &Machine<'_>, callable: &str, at: usize, reason: impl Into<String>) -> ConvertError {
    ConvertError::BadCall {
        file: m.file.to_path_buf(),
        callable: callable.to_string(),
        offset: at as u64,
        reason: reason.into(),
    }
}

fn expand_all(m: &mut Machine<'_>, args: &[Id]) -> Result<Vec<Value>, ConvertError> {
    args.iter().map(|&id| m.expand(id, 1)).collect()
}

fn as_u64(v: &Value) -> Option<u64> {
    v.as_i64().and_then(|i| u64::try_from(i).ok())
}

fn int_list<T: TryFrom<i64>>(v: &Value) -> Option<Vec<T>> {
    v.items()?
        .iter()
        .map(|x| x.as_i64().and_then(|i| T::try_from(i).ok()))
        .collect()
}

/// Interprets a torch persistent id: `('storage', storage_type, key, location, numel[, view])`.
pub(super) fn persistent_load(
    m: &mut Machine<'_>,
    pid: Value,
    at: usize,
) -> Result<StorageRef, ConvertError> {
    let what = "persistent_load";
    let Value::Tuple(items) = pid else {
        return Err(bad_call(m, what, at, "persistent id is not a tuple"));
    };
    let (tag, class, key, location, numel, view) = match items.as_slice() {
        [t, c, k, l, n] => (t, c, k, l, n, None),
        [t, c, k, l, n, v] => (t, c, k, l, n, Some(v)),
        _ => {
            return Err(bad_call(
                m,
                what,
                at,
                "persistent id must have 5 or 6 items",
            ))
        }
    };
    let tag_ok = match tag {
        Value::Str(s) => s == "storage",
        Value::Bytes(b) => b == b"storage",
        _ => false,
    };
    if !tag_ok {
        return Err(bad_call(
            m,
            what,
            at,
            "only 'storage' persistent ids are known",
        ));
    }
    let kind = match class {
        Value::Global { module, name } => match globals::lookup(module, name) {
            Some(Allowed::Storage(kind)) => kind,
            _ => {
                return Err(bad_call(
                    m,
                    what,
                    at,
                    format!("{module}.{name} is not a storage class"),
                ))
            }
        },
        _ => return Err(bad_call(m, what, at, "storage type is not a class")),
    };
    let key = match key {
        Value::Str(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        _ => return Err(bad_call(m, what, at, "storage key is not a string")),
    };
    let location = match location {
        Value::Str(s) => s.clone(),
        Value::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
        _ => String::new(),
    };
    let numel = as_u64(numel)
        .ok_or_else(|| bad_call(m, what, at, "storage size is not a non-negative int"))?;
    let view = match view {
        None | Some(Value::None) => None,
        Some(Value::Tuple(v)) => match v.as_slice() {
            [_view_key, off, size] => match (as_u64(off), as_u64(size)) {
                (Some(o), Some(s)) => Some((o, s)),
                _ => return Err(bad_call(m, what, at, "bad storage view offsets")),
            },
            _ => return Err(bad_call(m, what, at, "storage view must have 3 items")),
        },
        Some(_) => return Err(bad_call(m, what, at, "storage view is not a tuple")),
    };
    Ok(StorageRef {
        key,
        kind,
        numel,
        location,
        view,
    })
}

/// The result of calling an allowed global with arguments, as a new arena node.
pub(super) fn call(
    m: &mut Machine<'_>,
    allowed: Allowed,
    args: Vec<Id>,
    at: usize,
) -> Result<Id, ConvertError> {
    if let Some(node) = numpy_placeholder(m, allowed, &args, at)? {
        return Ok(m.push_node(node));
    }
    let node = match allowed {
        Allowed::OrderedDict => {
            let id = m.push_node(Node::Dict(Vec::new(), HashMap::new()));
            if let Some(&first) = args.first() {
                // OrderedDict(iterable of pairs)
                let pairs = match m.nodes.get(first) {
                    Some(Node::List(items) | Node::Tuple(items)) => items.clone(),
                    _ => {
                        return Err(bad_call(
                            m,
                            "collections.OrderedDict",
                            at,
                            "argument is not a list of pairs",
                        ))
                    }
                };
                m.charge(pairs.len() as u64 * 16)?;
                let mut flat = Vec::new();
                for p in pairs {
                    match m.nodes.get(p) {
                        Some(Node::Tuple(kv) | Node::List(kv)) if kv.len() == 2 => {
                            flat.extend(kv.iter().copied())
                        }
                        _ => {
                            return Err(bad_call(
                                m,
                                "collections.OrderedDict",
                                at,
                                "item is not a pair",
                            ))
                        }
                    }
                }
                m.set_items(id, flat, at)?;
            }
            return Ok(id);
        }
        Allowed::TorchSize => match args.first().map(|&a| m.nodes.get(a)) {
            None => Node::Tuple(Vec::new()),
            Some(Some(Node::Tuple(items) | Node::List(items))) => {
                let items = items.clone();
                m.charge(items.len() as u64 * 8)?;
                Node::Tuple(items)
            }
            _ => return Err(bad_call(m, "torch.Size", at, "argument is not a tuple")),
        },
        Allowed::Set | Allowed::FrozenSet => match args.first().map(|&a| m.nodes.get(a)) {
            None => Node::Set(Vec::new()),
            Some(Some(Node::Tuple(items) | Node::List(items) | Node::Set(items))) => {
                let items = items.clone();
                m.charge(items.len() as u64 * 8)?;
                Node::Set(items)
            }
            _ => {
                return Err(bad_call(
                    m,
                    "builtins.set",
                    at,
                    "argument is not a sequence",
                ))
            }
        },
        _ => {
            let values = expand_all(m, &args)?;
            Node::Leaf(call_on_values(m, allowed, values, at)?)
        }
    };
    Ok(m.push_node(node))
}

fn call_on_values(
    m: &mut Machine<'_>,
    allowed: Allowed,
    values: Vec<Value>,
    at: usize,
) -> Result<Value, ConvertError> {
    match allowed {
        Allowed::RebuildTensorV2 | Allowed::RebuildTensorV3 => {
            rebuild_tensor(m, allowed, values, at)
        }
        Allowed::RebuildParameter | Allowed::RebuildParameterWithState => {
            let name = "torch._utils._rebuild_parameter";
            let mut it = values.into_iter();
            match (it.next(), it.next()) {
                (Some(Value::Tensor(mut t)), Some(rg)) => {
                    t.requires_grad = matches!(rg, Value::Bool(true));
                    Ok(Value::Tensor(t))
                }
                (Some(Value::NdArray(a)), _) => Ok(Value::NdArray(a)),
                _ => Err(bad_call(
                    m,
                    name,
                    at,
                    "expected (tensor, requires_grad, hooks)",
                )),
            }
        }
        Allowed::RebuildFromTypeV2 => {
            let name = "torch._tensor._rebuild_from_type_v2";
            let mut it = values.into_iter();
            let (
                Some(Value::Global {
                    module,
                    name: fname,
                }),
                Some(new_type),
                Some(Value::Tuple(args)),
            ) = (it.next(), it.next(), it.next())
            else {
                return Err(bad_call(m, name, at, "expected (func, type, args, state)"));
            };
            match &new_type {
                Value::Global { module, name }
                    if globals::lookup(module, name) == Some(Allowed::TensorClass) => {}
                _ => {
                    return Err(bad_call(
                        m,
                        name,
                        at,
                        "only torch.Tensor and torch.nn.Parameter types are allowed",
                    ))
                }
            }
            let inner =
                globals::lookup(&module, &fname).ok_or_else(|| ConvertError::RefusedGlobal {
                    file: m.file.to_path_buf(),
                    module: module.clone(),
                    name: fname.clone(),
                })?;
            match inner {
                Allowed::RebuildTensorV2
                | Allowed::RebuildTensorV3
                | Allowed::RebuildParameter
                | Allowed::RebuildParameterWithState => call_on_values(m, inner, args, at),
                _ => Err(bad_call(
                    m,
                    name,
                    at,
                    "the inner function is not a tensor rebuild",
                )),
            }
        }
        Allowed::TorchDevice => match values.first() {
            Some(Value::Str(s)) => Ok(Value::Device(match values.get(1).and_then(Value::as_i64) {
                Some(i) => format!("{s}:{i}"),
                None => s.clone(),
            })),
            _ => Err(bad_call(m, "torch.device", at, "expected a device string")),
        },
        Allowed::ByteArray => match values.first() {
            None => Ok(Value::Bytes(Vec::new())),
            Some(Value::Bytes(b)) => Ok(Value::Bytes(b.clone())),
            Some(Value::Str(s)) => latin1(m, s, at).map(Value::Bytes),
            _ => Err(bad_call(m, "builtins.bytearray", at, "expected bytes")),
        },
        Allowed::CodecsEncode => match (values.first(), values.get(1)) {
            (Some(Value::Str(s)), Some(Value::Str(enc))) if enc == "latin1" || enc == "latin-1" => {
                latin1(m, s, at).map(Value::Bytes)
            }
            _ => Err(bad_call(
                m,
                "_codecs.encode",
                at,
                "only encode(str, 'latin1') is allowed",
            )),
        },
        Allowed::NpFromBuffer => {
            let name = "numpy.core.numeric._frombuffer";
            let mut it = values.into_iter();
            let (Some(Value::Bytes(data)), Some(dtype), Some(shape), order) =
                (it.next(), it.next(), it.next(), it.next())
            else {
                return Err(bad_call(
                    m,
                    name,
                    at,
                    "expected (buffer, dtype, shape, order)",
                ));
            };
            let (dtype, big_endian) = np_dtype(m, &dtype, at)?;
            let shape =
                int_list::<u64>(&shape).ok_or_else(|| bad_call(m, name, at, "bad shape"))?;
            let fortran_order = matches!(order, Some(Value::Str(ref s)) if s == "F");
            ndarray(m, dtype, big_endian, shape, fortran_order, data, at)
        }
        Allowed::Storage(_)
        | Allowed::TorchDType(_)
        | Allowed::TensorClass
        | Allowed::NpNdarray
        | Allowed::NpReconstruct
        | Allowed::NpDType
        | Allowed::OrderedDict
        | Allowed::TorchSize
        | Allowed::Set
        | Allowed::FrozenSet => Err(bad_call(
            m,
            "global",
            at,
            "this global cannot be called here",
        )),
    }
}

fn latin1(m: &Machine<'_>, s: &str, at: usize) -> Result<Vec<u8>, ConvertError> {
    s.chars()
        .map(|c| u8::try_from(u32::from(c)).ok())
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(|| {
            bad_call(
                m,
                "_codecs.encode",
                at,
                "string has characters above U+00FF",
            )
        })
}

fn rebuild_tensor(
    m: &mut Machine<'_>,
    allowed: Allowed,
    values: Vec<Value>,
    at: usize,
) -> Result<Value, ConvertError> {
    let name = if allowed == Allowed::RebuildTensorV3 {
        "torch._utils._rebuild_tensor_v3"
    } else {
        "torch._utils._rebuild_tensor_v2"
    };
    let mut it = values.into_iter();
    let (
        Some(Value::Storage(storage)),
        Some(offset),
        Some(size),
        Some(stride),
        requires_grad,
        _hooks,
        dtype_arg,
    ) = (
        it.next(),
        it.next(),
        it.next(),
        it.next(),
        it.next(),
        it.next(),
        it.next(),
    )
    else {
        return Err(bad_call(
            m,
            name,
            at,
            "expected (storage, offset, size, stride, requires_grad, hooks, ...)",
        ));
    };
    let storage_offset = as_u64(&offset)
        .ok_or_else(|| bad_call(m, name, at, "storage offset is not a non-negative int"))?;
    let shape = int_list::<u64>(&size)
        .ok_or_else(|| bad_call(m, name, at, "size is not a tuple of non-negative ints"))?;
    let strides = int_list::<i64>(&stride)
        .ok_or_else(|| bad_call(m, name, at, "stride is not a tuple of ints"))?;
    if shape.len() != strides.len() {
        return Err(bad_call(
            m,
            name,
            at,
            "size and stride have different lengths",
        ));
    }
    // A dtype hspack does not store leaves an inert marker: harmless unless a field uses it.
    let dtype = if allowed == Allowed::RebuildTensorV3 {
        match dtype_arg {
            Some(Value::Global {
                module,
                name: dname,
            }) => match globals::lookup(&module, &dname) {
                Some(Allowed::TorchDType(Some(d))) => d,
                Some(Allowed::TorchDType(None)) => {
                    return Ok(Value::UnsupportedTensor {
                        dtype: format!("torch.{dname}"),
                        shape,
                    })
                }
                _ => return Err(bad_call(m, name, at, "dtype argument is not a torch dtype")),
            },
            _ => return Err(bad_call(m, name, at, "missing dtype argument")),
        }
    } else if storage.kind.dtype.is_none() && storage.kind != UNTYPED {
        return Ok(Value::UnsupportedTensor {
            dtype: storage_dtype_name(storage.kind.class),
            shape,
        });
    } else {
        storage_dtype(m, &storage.kind, at)?
    };
    Ok(Value::Tensor(TensorRef {
        dtype,
        shape,
        strides,
        storage_offset,
        storage,
        requires_grad: matches!(requires_grad, Some(Value::Bool(true))),
    }))
}

/// The torch dtype a legacy typed storage class holds, for messages.
fn storage_dtype_name(class: &str) -> String {
    let name = match class {
        "ComplexHalfStorage" => "complex32",
        "ComplexFloatStorage" => "complex64",
        "ComplexDoubleStorage" => "complex128",
        "QInt8Storage" => "qint8",
        "QUInt8Storage" => "quint8",
        "QInt32Storage" => "qint32",
        "QUInt4x2Storage" => "quint4x2",
        "QUInt2x4Storage" => "quint2x4",
        other => return format!("torch.{other}"),
    };
    format!("torch.{name}")
}

fn storage_dtype(m: &Machine<'_>, kind: &StorageKind, at: usize) -> Result<DType, ConvertError> {
    match kind.dtype {
        Some(d) => Ok(d),
        None if *kind == UNTYPED => Err(bad_call(
            m,
            "torch._utils._rebuild_tensor_v2",
            at,
            "an untyped storage needs _rebuild_tensor_v3",
        )),
        None => Err(unsupported(m, kind.class, at)),
    }
}

fn unsupported(m: &Machine<'_>, dtype: &str, at: usize) -> ConvertError {
    ConvertError::UnsupportedDType {
        file: m.file.to_path_buf(),
        tensor: format!("tensor built at pickle offset {at}"),
        dtype: dtype.to_string(),
    }
}

fn np_dtype(m: &Machine<'_>, v: &Value, at: usize) -> Result<(DType, bool), ConvertError> {
    // Expanded numpy dtypes are carried as `Global { module: "numpy", name: "dtype(<descr>)" }`.
    let descr = match v {
        Value::Global { module, name } if module == "numpy" => name
            .strip_prefix("dtype(")
            .and_then(|s| s.strip_suffix(')')),
        _ => None,
    }
    .ok_or_else(|| bad_call(m, "numpy.dtype", at, "expected a numpy dtype"))?;
    let (dtype, big) =
        globals::numpy_descr(descr).ok_or_else(|| ConvertError::UnsupportedDType {
            file: m.file.to_path_buf(),
            tensor: format!("numpy array at pickle offset {at}"),
            dtype: descr.to_string(),
        })?;
    Ok((dtype, big.unwrap_or(false)))
}

fn ndarray(
    m: &Machine<'_>,
    dtype: DType,
    big_endian: bool,
    shape: Vec<u64>,
    fortran_order: bool,
    data: Vec<u8>,
    at: usize,
) -> Result<Value, ConvertError> {
    let bytes = shape
        .iter()
        .try_fold(dtype.size() as u64, |acc, &d| acc.checked_mul(d));
    if bytes != Some(data.len() as u64) {
        return Err(bad_call(
            m,
            "numpy array",
            at,
            format!(
                "{} data bytes do not match shape {shape:?} of {dtype}",
                data.len()
            ),
        ));
    }
    Ok(Value::NdArray(NdArray {
        dtype,
        shape,
        fortran_order,
        big_endian: big_endian && dtype.size() > 1,
        data,
    }))
}

/// `BUILD`: applies a state to the object on top of the stack.
pub(super) fn build(
    m: &mut Machine<'_>,
    target: Id,
    state: Id,
    at: usize,
) -> Result<(), ConvertError> {
    match m.nodes.get(target) {
        Some(Node::NpDType { descr, .. }) => {
            let descr = descr.clone();
            let state = m.expand(state, 1)?;
            // (version, endian, subarray, names, fields, elsize, alignment, flags)
            let endian = state.items().and_then(|s| s.get(1)).and_then(Value::as_str);
            let big_endian = match endian {
                Some(">") => Some(true),
                Some("<") => Some(false),
                _ => None,
            };
            let full = match (big_endian, globals::numpy_descr(&descr)) {
                (Some(true), Some(_)) => {
                    format!(">{}", descr.trim_start_matches(['<', '>', '|', '=']))
                }
                (Some(false), Some(_)) => {
                    format!("<{}", descr.trim_start_matches(['<', '>', '|', '=']))
                }
                _ => descr,
            };
            m.replace(target, Node::NpDType { descr: full }, at)
        }
        Some(Node::NpPending) => {
            let name = "numpy.ndarray.__setstate__";
            let state = m.expand(state, 1)?;
            // (version, shape, dtype, is_fortran, rawdata)
            let Value::Tuple(items) = state else {
                return Err(bad_call(m, name, at, "state is not a tuple"));
            };
            let mut it = items.into_iter();
            let (Some(_version), Some(shape), Some(dtype), Some(fortran), Some(raw)) =
                (it.next(), it.next(), it.next(), it.next(), it.next())
            else {
                return Err(bad_call(
                    m,
                    name,
                    at,
                    "expected (version, shape, dtype, is_fortran, data)",
                ));
            };
            let (dtype, big_endian) = np_dtype(m, &dtype, at)?;
            let shape =
                int_list::<u64>(&shape).ok_or_else(|| bad_call(m, name, at, "bad shape"))?;
            let data = match raw {
                Value::Bytes(b) => b,
                Value::Str(s) => latin1(m, &s, at)?,
                _ => {
                    return Err(bad_call(
                        m,
                        name,
                        at,
                        "array data is not bytes (object arrays are refused)",
                    ))
                }
            };
            let value = ndarray(
                m,
                dtype,
                big_endian,
                shape,
                matches!(fortran, Value::Bool(true)),
                data,
                at,
            )?;
            m.replace(target, Node::Leaf(value), at)
        }
        Some(Node::Dict(..)) => {
            let items = match m.nodes.get(state) {
                Some(Node::Dict(items, _)) => {
                    items.iter().flat_map(|(k, v)| [*k, *v]).collect::<Vec<_>>()
                }
                Some(Node::Leaf(Value::None)) => return Ok(()),
                _ => return Err(bad_call(m, "BUILD", at, "dict state is not a dict")),
            };
            m.charge(items.len() as u64 * 8)?;
            m.set_items(target, items, at)
        }
        _ => match m.nodes.get(state) {
            Some(Node::Leaf(Value::None)) => Ok(()),
            Some(Node::Dict(items, _)) if items.is_empty() => Ok(()),
            _ => Err(bad_call(
                m,
                "BUILD",
                at,
                "state can only be applied to numpy arrays, numpy dtypes and dicts",
            )),
        },
    }
}

/// `numpy.core.multiarray._reconstruct(ndarray, shape, typecode)` and `numpy.dtype(descr, ...)`
/// produce placeholders that `BUILD` completes.
pub(super) fn numpy_placeholder(
    m: &mut Machine<'_>,
    allowed: Allowed,
    args: &[Id],
    at: usize,
) -> Result<Option<Node>, ConvertError> {
    match allowed {
        Allowed::NpReconstruct => Ok(Some(Node::NpPending)),
        Allowed::NpDType => {
            let descr = match args.first().map(|&a| m.nodes.get(a)) {
                Some(Some(Node::Leaf(Value::Str(s)))) => s.clone(),
                _ => return Err(bad_call(m, "numpy.dtype", at, "expected a type string")),
            };
            Ok(Some(Node::NpDType { descr }))
        }
        _ => Ok(None),
    }
}
