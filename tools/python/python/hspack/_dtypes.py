"""The dtype table: hspack names, numpy and torch types, and bytes in and out."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ._errors import kind_of, make_error

#: hspack dtype name -> numpy dtype used for its bytes. bf16 and the fp8 types have no numpy
#: type: these are their raw bits (uint16 / uint8); `ml_dtypes()` gives the real types.
NUMPY = {
    "bool": np.dtype(np.bool_),
    "u8": np.dtype(np.uint8),
    "i8": np.dtype(np.int8),
    "i16": np.dtype("<i2"),
    "i32": np.dtype("<i4"),
    "i64": np.dtype("<i8"),
    "f16": np.dtype("<f2"),
    "bf16": np.dtype("<u2"),
    "f32": np.dtype("<f4"),
    "f64": np.dtype("<f8"),
    "f8e4m3fn": np.dtype(np.uint8),
    "f8e5m2": np.dtype(np.uint8),
}

_TORCH: dict[str, Any] | None = None
_ML: dict[str, np.dtype] | None = None

#: The dtypes numpy lacks, by hspack name -> ml_dtypes attribute.
_ML_NAMES = {"bf16": "bfloat16", "f8e4m3fn": "float8_e4m3fn", "f8e5m2": "float8_e5m2"}


def ml_dtypes() -> dict[str, np.dtype]:
    """hspack name -> numpy dtype from the `ml_dtypes` package (bf16, fp8), or `{}` when it
    is not installed (arrays of those types then hold raw bits)."""
    global _ML
    if _ML is None:
        try:
            import ml_dtypes as m
        except ImportError:
            _ML = {}
        else:
            _ML = {name: np.dtype(getattr(m, attr)) for name, attr in _ML_NAMES.items()}
    return _ML


def torch_dtypes() -> dict[str, Any]:
    """hspack dtype name -> torch dtype (torch is imported on first use)."""
    global _TORCH
    if _TORCH is None:
        import torch

        _TORCH = {
            "bool": torch.bool,
            "u8": torch.uint8,
            "i8": torch.int8,
            "i16": torch.int16,
            "i32": torch.int32,
            "i64": torch.int64,
            "f16": torch.float16,
            "bf16": torch.bfloat16,
            "f32": torch.float32,
            "f64": torch.float64,
            "f8e4m3fn": torch.float8_e4m3fn,
            "f8e5m2": torch.float8_e5m2,
        }
    return _TORCH


def hspack_name_of(array: Any) -> str | None:
    """The hspack dtype name of a torch tensor or numpy array, or None."""
    if isinstance(array, np.ndarray):
        for name, dt in ml_dtypes().items():
            if array.dtype == dt:
                return name
        for name, dt in NUMPY.items():
            if array.dtype == dt and name not in _ML_NAMES:
                return name
        return None
    for name, dt in torch_dtypes().items():
        if array.dtype == dt:
            return name
    return None


#: Integer dtypes, by hspack name.
INTEGERS = ("u8", "i8", "i16", "i32", "i64")


def _token_ids_as(key: str, name: str, want: str, value: Any) -> Any:
    """Token ids of any integer width as the schema's dtype `want` (tokenizers return int64,
    schemas usually say i32): converted when every id fits, else an error naming the first id
    that does not and its position. Anything else is returned as it is, for the usual checks."""
    if want not in INTEGERS:
        return value
    is_numpy = isinstance(value, np.ndarray)
    if not is_numpy and _off_cpu(value) is not None:
        return value  # refused by the usual check, naming the device
    got = hspack_name_of(value)
    if got == want or got not in INTEGERS:
        return value
    ids = value if is_numpy else value.detach().numpy()
    info = np.iinfo(NUMPY[want])
    bad = np.flatnonzero((ids.reshape(-1) < info.min) | (ids.reshape(-1) > info.max))
    if bad.size:
        at = np.unravel_index(int(bad[0]), ids.shape)
        position = int(at[0]) if len(at) == 1 else tuple(int(i) for i in at)
        raise make_error(
            "BadSample",
            f"sample `{key}`, field `{name}`: token id {ids[at]} at position {position} does not fit the schema's {want} ({info.min}..={info.max}); store ids in a wider dtype (hspack.token_ids(dtype=\"i64\"))",
            key=key,
            field=name,
        )
    return ids.astype(NUMPY[want])


def _off_cpu(value: Any) -> str | None:
    """Where `value`, a tensor that is not a numpy array, lives when that is not the CPU, else
    None: torch gives a device with a `.type`, other arrays may give a string ("cpu")."""
    device = getattr(value, "device", None)
    if device is None or callable(device):
        return None
    return None if str(getattr(device, "type", device)) == "cpu" else str(device)


def _numpy_fix(dtype: np.dtype, want: str) -> str:
    """What to do with a numpy array of `dtype` for a field of hspack dtype `want`."""
    if dtype.byteorder == ">" and dtype.newbyteorder("<") == NUMPY.get(want):
        return f" (the same type, big-endian); convert it: .astype('{NUMPY[want].name}')"
    if want in _ML_NAMES:
        return f"; numpy has no {want}: pass a torch tensor (torch.from_numpy(a).to(...)), an ml_dtypes array, or the raw bits as {NUMPY[want]}"
    return f"; convert it: .astype('{NUMPY[want].name}')" if want in NUMPY else ""


def input_bytes(key: str, name: str, field: dict, value: Any) -> np.ndarray:
    """The bytes of one field of a sample to append, as a flat uint8 numpy array that shares
    memory with `value` when it is contiguous. Checks dtype and row shape against `field`."""
    want = field["dtype"]
    row_shape = tuple(field["shape"])
    if isinstance(value, np.generic):
        value = np.asarray(value)  # a numpy scalar: a 0-d array, which has no rows
    # Before anything asks its shape: a nested tensor has none.
    layout = str(getattr(value, "layout", "torch.strided"))
    if getattr(value, "is_nested", False) or layout != "torch.strided":
        what = "nested" if getattr(value, "is_nested", False) else layout.removeprefix("torch.")
        raise make_error(
            "BadSample",
            f"sample `{key}`, field `{name}`: a {what} tensor; give a dense one (.to_dense(); each tensor of a nested one is a sample of its own)",
            key=key,
            field=name,
        )
    if not isinstance(value, np.ndarray) and not (hasattr(value, "dtype") and hasattr(value, "shape")):
        raise make_error(
            "BadSample",
            f"sample `{key}`, field `{name}`: {kind_of(value)}, not a tensor; pass a torch tensor or a numpy array (torch.tensor(...) makes one)",
            key=key,
            field=name,
        )
    if field["role"].get("kind") == "token_ids":
        value = _token_ids_as(key, name, want, value)
    if isinstance(value, np.ndarray):
        got = hspack_name_of(value)
        raw_ok = want in ("bf16", "f8e4m3fn", "f8e5m2") and value.dtype == NUMPY[want]
        if got != want and not raw_ok:
            raise make_error("BadSample", f"sample `{key}`, field `{name}`: dtype {value.dtype}, the schema says {want}{_numpy_fix(value.dtype, want)}", key=key, field=name)
        shape = value.shape
        flat = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
    else:
        device = _off_cpu(value)
        if device is not None:
            raise make_error("BadSample", f"sample `{key}`, field `{name}`: the tensor is on {device}; move it to the CPU", key=key, field=name)
        got = hspack_name_of(value)
        if got != want:
            to = torch_dtypes().get(want)
            fix = f"; convert it: .to({to})" if to is not None else ""
            torch = sys.modules.get("torch")  # a torch tensor means torch is imported
            if to is not None and torch is not None and isinstance(value, torch.Tensor) and to.is_floating_point and not value.dtype.is_floating_point and value.element_size() == to.itemsize:
                # Integers of the width of a float type may be its bit patterns (as numpy holds
                # bf16), which .to() would convert as numbers into other values.
                fix = f"; if these are its values, convert them: .to({to}); if they are {want} bit patterns, view them: .view({to})"
            raise make_error("BadSample", f"sample `{key}`, field `{name}`: dtype {value.dtype}, the schema says {want}{fix}", key=key, field=name)
        shape = tuple(value.shape)
        import torch

        flat = value.detach().contiguous().reshape(-1)
        if flat.stride(0) != 1:
            # A tensor of one or no elements counts as contiguous whatever its stride (a
            # column of one row, an expanded scalar); viewing it as bytes needs stride 1.
            flat = flat.clone(memory_format=torch.contiguous_format)
        flat = flat.view(torch.uint8).numpy()
    if len(shape) == 0:
        need = ", ".join(["rows", *map(str, row_shape)])
        raise make_error(
            "BadSample",
            f"sample `{key}`, field `{name}`: a single value (shape ()), not rows; the schema needs [{need}]: give an array of that shape, its first dimension the rows (np.array([value]) is one row of one value)",
            key=key,
            field=name,
        )
    stacked_flat = field["role"].get("kind") == "hidden_states" and len(shape) == 2 and len(row_shape) == 2 and shape[1] == row_shape[0] * row_shape[1]
    if not stacked_flat and (len(shape) != 1 + len(row_shape) or tuple(shape[1:]) != row_shape):
        raise make_error(
            "BadSample",
            f"sample `{key}`, field `{name}`: shape {tuple(shape)}, the schema needs [rows, {', '.join(map(str, row_shape))}]".replace(", ]", "]"),
            key=key,
            field=name,
        )
    return flat
