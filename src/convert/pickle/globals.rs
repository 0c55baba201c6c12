//! The allowlist of Python globals a pickle may name, mirroring what
//! `torch.load(weights_only=True)` accepts for plain tensor checkpoints.

use super::value::StorageKind;
use crate::format::DType;

/// An allowed global, decoded from its `module.name`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Allowed {
    /// `torch._utils._rebuild_tensor_v2`.
    RebuildTensorV2,
    /// `torch._utils._rebuild_tensor_v3`.
    RebuildTensorV3,
    /// `torch._utils._rebuild_parameter`.
    RebuildParameter,
    /// `torch._utils._rebuild_parameter_with_state`.
    RebuildParameterWithState,
    /// `torch._tensor._rebuild_from_type_v2`.
    RebuildFromTypeV2,
    /// `torch.Tensor` or `torch.nn.Parameter` as a class argument.
    TensorClass,
    /// `collections.OrderedDict`.
    OrderedDict,
    /// `torch.Size`.
    TorchSize,
    /// `torch.device`.
    TorchDevice,
    /// A storage class such as `torch.FloatStorage` or `torch.UntypedStorage`.
    Storage(StorageKind),
    /// A torch dtype object such as `torch.bfloat16` (`None` when hspack has no equivalent).
    TorchDType(Option<DType>),
    /// `builtins.set`.
    Set,
    /// `builtins.frozenset`.
    FrozenSet,
    /// `builtins.bytearray`.
    ByteArray,
    /// `_codecs.encode`, used for `bytes` by protocols below 3.
    CodecsEncode,
    /// `numpy.core.multiarray._reconstruct`.
    NpReconstruct,
    /// `numpy.ndarray`.
    NpNdarray,
    /// `numpy.dtype`.
    NpDType,
    /// `numpy.core.numeric._frombuffer` (protocol 5 arrays).
    NpFromBuffer,
}

const fn storage(class: &'static str, dtype: Option<DType>, element_size: u64) -> StorageKind {
    StorageKind {
        class,
        dtype,
        element_size,
    }
}

/// Storage classes torch has written, with their element types.
const STORAGES: &[StorageKind] = &[
    storage("BoolStorage", Some(DType::Bool), 1),
    storage("ByteStorage", Some(DType::U8), 1),
    storage("CharStorage", Some(DType::I8), 1),
    storage("ShortStorage", Some(DType::I16), 2),
    storage("IntStorage", Some(DType::I32), 4),
    storage("LongStorage", Some(DType::I64), 8),
    storage("HalfStorage", Some(DType::F16), 2),
    storage("BFloat16Storage", Some(DType::BF16), 2),
    storage("FloatStorage", Some(DType::F32), 4),
    storage("DoubleStorage", Some(DType::F64), 8),
    storage("ComplexFloatStorage", None, 8),
    storage("ComplexDoubleStorage", None, 16),
    storage("QUInt8Storage", None, 1),
    storage("QInt8Storage", None, 1),
    storage("QInt32Storage", None, 4),
    storage("QUInt4x2Storage", None, 1),
    storage("QUInt2x4Storage", None, 1),
];

/// The untyped byte storage used by `_rebuild_tensor_v3`.
pub(crate) const UNTYPED: StorageKind = storage("UntypedStorage", None, 1);

/// Torch dtype objects by attribute name.
const TORCH_DTYPES: &[(&str, Option<DType>)] = &[
    ("bool", Some(DType::Bool)),
    ("uint8", Some(DType::U8)),
    ("int8", Some(DType::I8)),
    ("int16", Some(DType::I16)),
    ("short", Some(DType::I16)),
    ("int32", Some(DType::I32)),
    ("int", Some(DType::I32)),
    ("int64", Some(DType::I64)),
    ("long", Some(DType::I64)),
    ("float16", Some(DType::F16)),
    ("half", Some(DType::F16)),
    ("bfloat16", Some(DType::BF16)),
    ("float32", Some(DType::F32)),
    ("float", Some(DType::F32)),
    ("float64", Some(DType::F64)),
    ("double", Some(DType::F64)),
    ("float8_e4m3fn", Some(DType::F8E4M3FN)),
    ("float8_e5m2", Some(DType::F8E5M2)),
    ("float8_e4m3fnuz", None),
    ("float8_e5m2fnuz", None),
    ("float8_e8m0fnu", None),
    ("float4_e2m1fn_x2", None),
    ("uint16", None),
    ("uint32", None),
    ("uint64", None),
    ("complex32", None),
    ("complex64", None),
    ("complex128", None),
    ("cfloat", None),
    ("cdouble", None),
    ("chalf", None),
    ("qint8", None),
    ("quint8", None),
    ("qint32", None),
    ("quint4x2", None),
    ("quint2x4", None),
    ("bits8", None),
    ("bits16", None),
];

/// Looks up a global; `None` means it is refused.
pub(crate) fn lookup(module: &str, name: &str) -> Option<Allowed> {
    let numpy_multiarray = matches!(module, "numpy.core.multiarray" | "numpy._core.multiarray");
    let found = match (module, name) {
        ("torch._utils", "_rebuild_tensor_v2") => Allowed::RebuildTensorV2,
        ("torch._utils", "_rebuild_tensor_v3") => Allowed::RebuildTensorV3,
        ("torch._utils", "_rebuild_parameter") => Allowed::RebuildParameter,
        ("torch._utils", "_rebuild_parameter_with_state") => Allowed::RebuildParameterWithState,
        ("torch._tensor", "_rebuild_from_type_v2") => Allowed::RebuildFromTypeV2,
        ("torch" | "torch._tensor", "Tensor") => Allowed::TensorClass,
        ("torch.nn.parameter" | "torch.nn" | "torch", "Parameter") => Allowed::TensorClass,
        ("collections", "OrderedDict") => Allowed::OrderedDict,
        ("torch", "Size") => Allowed::TorchSize,
        ("torch", "device") => Allowed::TorchDevice,
        ("torch" | "torch.storage", "UntypedStorage") => Allowed::Storage(UNTYPED),
        ("builtins" | "__builtin__", "set") => Allowed::Set,
        ("builtins" | "__builtin__", "frozenset") => Allowed::FrozenSet,
        ("builtins" | "__builtin__", "bytearray") => Allowed::ByteArray,
        ("_codecs", "encode") => Allowed::CodecsEncode,
        (_, "_reconstruct") if numpy_multiarray => Allowed::NpReconstruct,
        ("numpy", "ndarray") => Allowed::NpNdarray,
        (_, "ndarray") if numpy_multiarray => Allowed::NpNdarray,
        ("numpy", "dtype") => Allowed::NpDType,
        (_, "dtype") if numpy_multiarray => Allowed::NpDType,
        ("numpy.core.numeric" | "numpy._core.numeric", "_frombuffer") => Allowed::NpFromBuffer,
        ("torch" | "torch.cuda", _) => {
            if let Some(kind) = STORAGES.iter().find(|s| s.class == name) {
                Allowed::Storage(*kind)
            } else if module == "torch" {
                let (_, dtype) = TORCH_DTYPES.iter().find(|(n, _)| *n == name)?;
                Allowed::TorchDType(*dtype)
            } else {
                return None;
            }
        }
        _ => return None,
    };
    Some(found)
}

/// The hspack dtype and byte order for a numpy type string such as `<f4`, `|b1` or `f4`.
/// Returns `None` for types hspack does not store.
pub(crate) fn numpy_descr(descr: &str) -> Option<(DType, Option<bool>)> {
    let (big_endian, code) = match descr.as_bytes().first()? {
        b'<' => (Some(false), descr.get(1..)?),
        b'>' => (Some(true), descr.get(1..)?),
        b'|' | b'=' => (None, descr.get(1..)?),
        _ => (None, descr),
    };
    let dtype = match code {
        "b1" | "?" => DType::Bool,
        "u1" | "B" => DType::U8,
        "i1" | "b" => DType::I8,
        "i2" | "h" => DType::I16,
        "i4" | "i" => DType::I32,
        "i8" | "q" | "l" => DType::I64,
        "f2" | "e" => DType::F16,
        "f4" | "f" => DType::F32,
        "f8" | "d" => DType::F64,
        _ => return None,
    };
    Some((dtype, big_endian))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_code_execution_globals() {
        for (m, n) in [
            ("os", "system"),
            ("posix", "system"),
            ("builtins", "eval"),
            ("builtins", "exec"),
            ("__builtin__", "eval"),
            ("subprocess", "Popen"),
            ("builtins", "getattr"),
            ("torch", "load"),
            ("torch", "from_numpy"),
            ("torch.cuda", "bfloat16"),
            ("numpy", "load"),
            ("copyreg", "_reconstructor"),
        ] {
            assert_eq!(lookup(m, n), None, "{m}.{n}");
        }
    }

    #[test]
    fn accepts_torch_checkpoint_globals() {
        assert_eq!(
            lookup("torch", "BFloat16Storage"),
            Some(Allowed::Storage(StorageKind {
                class: "BFloat16Storage",
                dtype: Some(DType::BF16),
                element_size: 2
            }))
        );
        assert_eq!(
            lookup("torch", "float8_e5m2"),
            Some(Allowed::TorchDType(Some(DType::F8E5M2)))
        );
        assert_eq!(
            lookup("numpy._core.multiarray", "_reconstruct"),
            Some(Allowed::NpReconstruct)
        );
        assert_eq!(numpy_descr("<f4"), Some((DType::F32, Some(false))));
        assert_eq!(numpy_descr(">i8"), Some((DType::I64, Some(true))));
        assert_eq!(numpy_descr("|b1"), Some((DType::Bool, None)));
        assert_eq!(numpy_descr("<c8"), None);
    }
}
