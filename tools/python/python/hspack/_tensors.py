"""Turning native tensor buffers into torch tensors or numpy arrays without copying."""

from __future__ import annotations

import importlib.util
import sys
import warnings
from typing import Any

import numpy as np

from ._dtypes import ml_dtypes, torch_dtypes

# Tensors over a mapped shard are read-only; torch has no read-only tensors and warns (once
# per process) when it wraps a read-only array. The contract is documented instead (do not
# write to views; ask for `copy=True`), so the one warning is spent here, silenced.
_SPENT = False


def _spend_torch_readonly_warning() -> None:
    global _SPENT
    import torch

    _SPENT = True
    a = np.zeros(1)
    a.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.from_numpy(a)


FORMATS = ("torch", "numpy")

#: What to do when `format="torch"` (the default) meets a Python without torch.
NO_TORCH = (
    'format="torch" (the default) needs PyTorch, which is not installed: install it with '
    '`pip install "./tools/python[torch]"` (or `pip install torch`), or pass format="numpy"'
)


def torch_installed() -> bool:
    """True when `import torch` can succeed (checked without importing it)."""
    if "torch" in sys.modules:
        return sys.modules["torch"] is not None
    return importlib.util.find_spec("torch") is not None


def no_torch_error() -> Exception:
    """The `HspackError` that says how to get torch, or to read numpy instead."""
    from ._errors import make_error

    return make_error("BadOption", f"option format: {NO_TORCH}", option="format")


def to_numpy(buf: Any) -> np.ndarray:
    """A read-only numpy array over the buffer. bf16 and fp8 arrays have `ml_dtypes`' types
    when that package is installed, else hold the raw bits as uint16 / uint8."""
    a = np.asarray(buf)
    ml = ml_dtypes().get(buf.dtype)
    return a.view(ml) if ml is not None else a


def to_torch(buf: Any) -> Any:
    """A torch tensor over the buffer, with its true dtype (bf16 and fp8 included)."""
    try:
        import torch
    except ImportError as e:
        raise no_torch_error() from e

    if not _SPENT:
        _spend_torch_readonly_warning()
    t = torch.from_numpy(np.asarray(buf))
    dtype = torch_dtypes()[buf.dtype]
    if t.dtype != dtype:
        t = t.view(dtype)
    return t


def convert(buf: Any, format: str, copy: bool) -> Any:
    """The buffer as `format`; a private writable copy when `copy`."""
    if format == "torch":
        t = to_torch(buf)
        return t.clone() if copy else t
    a = to_numpy(buf)
    return a.copy() if copy else a
