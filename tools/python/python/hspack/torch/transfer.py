"""Sending tensors from DataLoader workers to the main process without copying them: mapped
shards as file ranges, samples built in a worker as loans of its shared memory.

A DataLoader worker normally sends a tensor through shared memory: it allocates a shared
segment and copies the tensor into it, and the main process maps the segment. For a tensor
that is a view of a mapped shard, hspack sends `(shard path, file offset, file identity,
dtype, shape, strides)` instead, and the main process views that range of its own mapping of
the file: the same bytes with no copy, read-only like every tensor over a shard in the process
that reads it (write to a `.clone()`). Each file is mapped once per process and kept, so its
pages stay mapped from one tensor (and epoch) to the next, until `release()` (called for a
dataset's folder when the last hspack torch dataset object of that folder is collected). A file replaced before the main
process first mapped it is refused with an error naming it.

A tensor a view built in a worker (the EAGLE-3 concatenation of per-layer captures) lies in
shared memory the worker lends (`views.shared_empty`, `hspack::io::loan`): hspack sends the
memory's identity with a loan taken out, the main process maps it (once: it keeps the mapping
for the next loan of the same memory), and the loan ends when the last tensor over it there
is collected; only then does the worker reuse the memory for another sample. The main
process may write to these tensors.

`install()` registers this for `torch.Tensor` in the calling process; the hspack torch
datasets call it when they open the dataset inside a DataLoader worker. Other tensors go
through torch's usual path.
"""

from __future__ import annotations

import os
from typing import Any

from .. import _hspack
from .._tensors import to_torch

_INSTALLED = False


def installed() -> bool:
    """True when this process sends views of mapped shards as file ranges."""
    return _INSTALLED


def install() -> None:
    """Sends views of mapped shards as file ranges from this process (idempotent)."""
    global _INSTALLED
    if _INSTALLED:
        return
    import torch
    from multiprocessing.reduction import ForkingPickler

    ForkingPickler.register(torch.Tensor, reduce_tensor)
    _INSTALLED = True


def release(under: str | os.PathLike | None = None) -> None:
    """Lets go of the files this process keeps mapped for tensors received from workers
    (those in folder `under`, or all), so their pages can be evicted (or a deleted file's
    space freed) once no tensor over them lives; later tensors map their files again."""
    _hspack.release_received(None if under is None else os.fspath(under))


def _plain_storage(t: Any) -> Any:
    """`t`'s storage when `t` is a plain CPU tensor over some bytes, else None."""
    import torch

    if type(t) is not torch.Tensor or t.device.type != "cpu" or t.requires_grad or t.layout != torch.strided:
        return None
    s = t.untyped_storage()
    return s if s.nbytes() else None


def origin(t: Any) -> tuple | None:
    """`(path, offset, dev, ino)` of the file range behind tensor `t`'s storage when it is a
    view of a mapped shard of this process, else None."""
    s = _plain_storage(t)
    return None if s is None else _hspack.origin(s.data_ptr(), s.nbytes())


def reduce_tensor(t: Any) -> tuple:
    """The pickle reduction of `t`: a file range for a view of a mapped shard, a loan of the
    shared memory a view built it in, else torch's."""
    o = origin(t)
    if o is None:
        return _reduce_unmapped(t)
    path, offset, dev, ino = o
    return (rebuild, (os.fspath(path), offset, dev, ino) + _meta(t))


def _meta(t: Any) -> tuple:
    dtype = str(t.dtype).removeprefix("torch.")
    return (t.untyped_storage().nbytes(), dtype, t.storage_offset(), tuple(t.size()), tuple(t.stride()))


def _reduce_unmapped(t: Any) -> tuple:
    s = _plain_storage(t)
    lent = None if s is None else _hspack.lend(s.data_ptr(), s.nbytes())
    if lent is None:
        from torch.multiprocessing.reductions import reduce_tensor as torch_reduce

        return torch_reduce(t)
    return (rebuild_lent, lent + _meta(t))


def rebuild(path: str, offset: int, dev: int, ino: int, nbytes: int, dtype: str, storage_offset: int, size: tuple, stride: tuple) -> Any:
    """The tensor `reduce_tensor` described, over this process's mapping of its file."""
    try:
        raw = to_torch(_hspack.map_received(path, offset, nbytes, dev, ino))
    except Exception as e:
        return _unreadable(e)
    return _over(raw, dtype, storage_offset, size, stride)


def rebuild_lent(pid: int, fd: int, dev: int, ino: int, offset: int, nbytes: int, dtype: str, storage_offset: int, size: tuple, stride: tuple) -> Any:
    """The tensor `reduce_tensor` described, over the shared memory its worker lent: this
    process's until the tensor (and every view of it) is collected, then the worker's again."""
    try:
        raw = to_torch(_hspack.receive_lent(pid, fd, dev, ino, offset, nbytes))
    except Exception as e:
        return _unreadable(e)
    return _over(raw, dtype, storage_offset, size, stride)


class Unreadable:
    """What a tensor that could not be rebuilt becomes where it is received: any use of it
    raises the error. Unpickling must not raise: the DataLoader unpickles what a worker sent
    after taking its index off the books, so an error raised there loses the batch's place and
    the next `next()` waits for it forever (and in the pin-memory thread, outside its error
    handling, it ends the thread). `HspackLoader` and `PadCollate` raise the error as soon as
    the batch is theirs; a plain DataLoader hands the sample on, and its first use raises."""

    def __init__(self, error: BaseException):
        object.__setattr__(self, "_error", error)

    @property
    def error(self) -> BaseException:
        """The error, for a collate that raises it before using the samples."""
        return self._error

    def __getattr__(self, name: str) -> Any:
        raise self._error

    def __repr__(self) -> str:
        return f"<hspack tensor that could not be received: {self._error}>"


def _unreadable(error: BaseException) -> Any:
    """`error` as an `Unreadable`: raised while unpickling, it would hang the DataLoader."""
    return Unreadable(error)


def raise_unreadable(value: Any) -> None:
    """Raises the error of the first `Unreadable` in `value` (a tensor, or a dict, list or
    tuple of them, as samples and batches are)."""
    if isinstance(value, Unreadable):
        raise value.error
    if isinstance(value, dict):
        value = value.values()
    if isinstance(value, (list, tuple, type({}.values()))):
        for v in value:
            raise_unreadable(v)


def _over(raw: Any, dtype: str, storage_offset: int, size: tuple, stride: tuple) -> Any:
    import torch

    return torch.empty(0, dtype=getattr(torch, dtype)).set_(raw.untyped_storage(), storage_offset, size, stride)
