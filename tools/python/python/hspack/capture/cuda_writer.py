"""`hspack.capture.CudaWriter`: capture GPU tensors into a dataset without stalling the GPU.

    w = CudaWriter("out/", [hspack.hidden_state(l, 7168) for l in (2, 20, 40, 60)])
    w.append("s0", **{"hidden.2": h2, ...})   # torch / CuPy / JAX tensors on the GPU
    w.stats()                                 # slots, busy, waits, bytes_copied, ...
    w.finish()

Each append orders its device-to-host copies after the work queued so far on the producer's
stream (PyTorch's current stream unless `stream=` says otherwise), copies into a ring of
pinned host buffers, and returns; the dataset is written on the writer's own threads, without
the GIL. The tensors are held until their copies are complete. When every buffer is busy,
append blocks (counted in `stats()["waits"]`); nothing is dropped.
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

STATS = ("slots", "slot_bytes", "busy", "waits", "wait_seconds", "append_seconds", "bytes_copied", "samples_given", "samples_written", "oversize", "unwritten")

#: `__cuda_array_interface__` typestr -> hspack dtype names it may hold (bf16 and fp8 travel
#: as raw unsigned integers of their width).
_TYPESTR = {
    "|b1": ("bool",),
    "|u1": ("u8", "f8e4m3fn", "f8e5m2"),
    "|i1": ("i8",),
    "<i2": ("i16",),
    "<u2": ("bf16",),
    "<i4": ("i32",),
    "<i8": ("i64",),
    "<f2": ("f16",),
    "<f4": ("f32",),
    "<f8": ("f64",),
}


def _native():
    from .. import _hspack

    native = getattr(_hspack, "CudaWriter", None)
    if native is None:
        from .._errors import make_error

        raise make_error("NoCuda", "this build of hspack has no CUDA support: build the wheel with `maturin build --features cuda`", option="cuda")
    return native


def _bad(key: str, name: str, detail: str) -> Exception:
    from .._errors import make_error

    return make_error("BadSample", f"sample `{key}`, field `{name}`: {detail}", key=key, field=name)


def _is_torch(value: Any) -> bool:
    mod = type(value).__module__
    return mod.startswith("torch") and hasattr(value, "data_ptr")


def _torch_view(key: str, name: str, field: dict, t: Any) -> tuple[int, int, Any, int | None]:
    from .._dtypes import hspack_name_of

    if not t.is_cuda:
        raise _bad(key, name, f"the tensor is on {t.device}; pass a tensor on the GPU")
    got = hspack_name_of(t)
    if got != field["dtype"]:
        raise _bad(key, name, f"dtype {t.dtype}, the schema says {field['dtype']}")
    _check_shape(key, name, field, tuple(t.shape))
    if not t.is_contiguous():
        t = t.contiguous()  # a copy on the current stream, held like the tensor
    return t.data_ptr(), t.numel() * t.element_size(), t, t.device.index


def _check_shape(key: str, name: str, field: dict, shape: tuple) -> None:
    row = tuple(field["shape"])
    if len(shape) != 1 + len(row) or tuple(shape[1:]) != row:
        want = ", ".join(["rows", *map(str, row)])
        raise _bad(key, name, f"shape {shape}, the schema needs [{want}]")


def _cai_view(key: str, name: str, field: dict, value: Any, cai: dict) -> tuple[int, int, Any, int | None, int | None]:
    typestr = cai["typestr"]
    if field["dtype"] not in _TYPESTR.get(typestr, ()):
        raise _bad(key, name, f"typestr {typestr}, the schema says {field['dtype']}")
    shape = tuple(int(d) for d in cai["shape"])
    _check_shape(key, name, field, shape)
    itemsize = int(typestr[2:])
    strides = cai.get("strides")
    if strides is not None:
        expect, acc = [], itemsize
        for d in reversed(shape):
            expect.append(acc)
            acc *= d
        if tuple(strides) != tuple(reversed(expect)) and 0 not in shape:
            raise _bad(key, name, "the array is not C-contiguous; pass a contiguous copy")
    n = itemsize
    for d in shape:
        n *= d
    stream = cai.get("stream")
    return int(cai["data"][0]), n, value, None, (int(stream) if stream is not None else None)


def _device_view(key: str, name: str, field: dict, value: Any) -> tuple[int, int, Any, int | None, int | None]:
    """(address, bytes, owner to hold, device or None, producer stream or None)."""
    if _is_torch(value):
        ptr, n, owner, dev = _torch_view(key, name, field, value)
        return ptr, n, owner, dev, None
    try:
        cai = value.__cuda_array_interface__
    except Exception:  # absent, or refused for this dtype (JAX with bf16): try DLPack
        cai = None
    dlpack = hasattr(type(value), "__dlpack__")
    if cai is not None and (not dlpack or cai.get("typestr") in _TYPESTR):
        return _cai_view(key, name, field, value, cai)
    if dlpack:
        ptr, n, owner, dev = _torch_view(key, name, field, _from_dlpack(field, value))
        return ptr, n, (value, owner), dev, None
    raise _not_an_array(key, name, value)


def _not_an_array(key: str, name: str, value: Any) -> Exception:
    return _bad(key, name, f"{type(value).__name__} is not a GPU array (no __cuda_array_interface__ or __dlpack__)")


def _from_dlpack(field: dict, value: Any) -> Any:
    """A torch view of a DLPack array; bf16 bits held as uint16 (CuPy has no bf16) as bf16."""
    import torch

    t = torch.from_dlpack(value)
    if t.dtype == torch.uint16 and field["dtype"] == "bf16":
        t = t.view(torch.bfloat16)
    return t


def _fp8_on_device(key: str, name: str, field: dict, value: Any) -> tuple[int, int, Any, int | None, int | None]:
    """A quantized field's stored form (FORMAT.md §4.1), made on the GPU on the current
    stream: every row's f32 scales (amax / 448 per group, 1 for zeros), then every row's
    E4M3FN codes, as one contiguous byte tensor to copy."""
    import torch

    if not _is_torch(value):
        # Read as the unquantized path reads it: through DLPack (uint16 as bf16), else
        # through `__cuda_array_interface__` (as torch takes it: on the array's device).
        if hasattr(type(value), "__dlpack__"):
            value = _from_dlpack(field, value)
        elif hasattr(value, "__cuda_array_interface__"):
            named = value.__cuda_array_interface__.get("stream")
            value = torch.as_tensor(value)
            if named is not None:
                # torch takes the array without waiting for the stream it names: the
                # quantization, on the current stream, must come after its producer's work.
                producer = torch.cuda.ExternalStream(int(named), device=value.device)
                torch.cuda.current_stream(value.device).wait_stream(producer)
            if value.dtype == torch.uint16 and field["dtype"] == "bf16":
                value = value.view(torch.bfloat16)
        else:
            raise _not_an_array(key, name, value)
    ptr, n, t, dev = _torch_view(key, name, field, value)
    group = int(field["quantized"]["group"])
    flat = t.reshape(-1, group).float()
    amax = flat.abs().amax(dim=1, keepdim=True)
    # A true division by a tensor: torch divides by a Python number as a multiplication by
    # its reciprocal on the GPU, which rounds differently from amax / 448.
    scale = torch.div(amax, torch.full_like(amax, 448.0))
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    codes = (flat / scale).clamp_(-448.0, 448.0).to(torch.float8_e4m3fn)
    stored = torch.cat([scale.reshape(-1).view(torch.uint8), codes.reshape(-1).view(torch.uint8)])
    return stored.data_ptr(), stored.numel(), stored, dev, None


def _on_stream(stream: int | None, device: int):
    """A context in which torch's work runs on stream handle `stream` of `device` (nothing
    changes when it is None: torch's current stream, which the copy then waits on)."""
    import contextlib

    if stream is None:
        return contextlib.nullcontext()
    import torch

    return torch.cuda.stream(torch.cuda.ExternalStream(int(stream), device=torch.device("cuda", device)))


def _producer_streams(given: int | None, named: list[int], on_base: bool, device: int) -> list[int]:
    """Every stream the copies of one sample wait for: the one `stream=` gives (else torch's
    current stream) where a field is a torch tensor, was made by this writer, or names no
    stream, and every stream a `__cuda_array_interface__` named. Tensors from several streams
    are each copied only after their own producer's work."""
    base = int(given) if given is not None else None
    if base is None and (on_base or not named):
        base = _torch_current_stream(device)
    streams = [base] if base is not None else []
    return streams + [int(s) for s in named if s != base]


class CudaWriter:
    """Writes (or resumes) the dataset in folder `path` from GPU tensors.

    `schema` and `capture` are as for `hspack.Writer`. `device` is the CUDA device whose
    tensors this writer copies (default: PyTorch's current device, else 0); one writer per
    device. `slots` pinned buffers form the ring (default 8). By default each is as big as
    the largest field captured so far, rounded up to a power of two from 1 MiB to 1 GiB
    (8192 rows × 7168 bf16 = 117 MB: 128 MiB slots, 1 GiB pinned), and grows when a larger
    field comes; `slot_bytes=N` fixes the size instead, and a field larger than a slot is
    then split over slots and joined by a host copy. A sample larger than the ring goes
    through a one-off pinned buffer. `discard=True` drops the bytes instead of writing them
    (to measure the copy path). Other options (`chunk_bytes`, `codec`, `durable`, ...) go
    to the dataset writer.

    `quantize="fp8"` (every hidden-state field) or `"fp8:NAME,NAME"` stores those fields as
    FP8 with a scale per row and layer, as `hspack.Writer` does, but quantizes on the GPU
    before the copy (torch tensors): half the device-to-host bytes. Append the original
    tensors.

    One dataset writer stores about 2–3 GB/s (it encodes, hashes and writes one file on one
    thread). `writers=N` opens N of them, sharing the dataset (`shared=True`), each with its
    own ring of `slots` and its own shard files, and deals samples to them in turn: N times
    the storage rate. The dataset's order is then the order of the writers' commits, not of
    `append` (find samples by key).
    """

    def __init__(
        self,
        path: str | os.PathLike | None,
        schema: Sequence[Any],
        capture: dict | None = None,
        *,
        device: int | None = None,
        slots: int = 8,
        slot_bytes: int | None = None,
        create: bool = False,
        discard: bool = False,
        writers: int = 1,
        **options: Any,
    ):
        from .. import _hspack
        from .._schema import capture_metadata, normalize

        native = _native()
        self.path = None if path is None else os.fspath(path)
        doc: dict = {"fields": normalize(schema), "capture": None}
        if capture is not None:
            doc["capture"] = capture_metadata(capture, "hspack.capture.CudaWriter", _hspack.__version__)
        quantize = options.pop("quantize", None)
        if quantize is not None:
            from .._writer import quantized_fields

            doc["fields"] = quantized_fields(doc["fields"], quantize)
            options = {**options, "prequantized": True}
        self.fields = doc["fields"]
        self._by_name = {f["name"]: f for f in self.fields}
        if device is None:
            device = _torch_current_device()
        self.device = int(device)
        if self.path is None and not discard:
            from .._errors import make_error

            raise make_error("BadOption", "option path: give a folder, or discard=True", option="path")
        from .._dataset import count_option

        writers, slots = count_option("writers", writers, 1), count_option("slots", slots, 1)
        slot_bytes = None if slot_bytes is None else count_option("slot_bytes", slot_bytes, 1)
        if writers > 1:
            options = {**options, "shared": True}
        self._natives = [native(self.path or "", json.dumps(doc), self.device, slots, slot_bytes, create and i == 0, discard, options) for i in range(writers)]
        self._native = self._natives[0]
        self._dealt = 0

    def append(self, key: str, stream: int | None = None, overwrite: bool = False, **tensors: Any) -> None:
        """Queues sample `key`: one GPU tensor per field (`[rows, *row shape]`, the field's
        dtype). Returns once the copies are queued; blocks while every buffer is busy.

        `stream` is the producer's stream handle (default: PyTorch's current stream of the
        writer's device); a `__cuda_array_interface__` array is also waited for on the
        stream it names, so fields from several streams are each copied after their own
        producer's work. Set `overwrite`
        when the producer will write these same buffers in place again (static buffers, CUDA
        graphs): its later work then waits on the device for the copies.
        """
        parts = []
        owners = []
        named = []  # streams a `__cuda_array_interface__` named, each waited for
        on_base = False  # a tensor of torch's (or made by this writer) on the base stream
        # What this writer computes from the tensors (a contiguous copy, the FP8 form) runs on
        # the producer's stream when one is given: after the work that produces them, and
        # before the copy, which waits on that stream.
        with _on_stream(stream, self.device):
            for name, value in tensors.items():
                f = self._by_name.get(name)
                if f is None:
                    raise _bad(key, name, f"the schema has no such field; it has {', '.join(self._by_name)}")
                if f.get("quantized"):
                    ptr, n, owner, dev, s = _fp8_on_device(key, name, f, value)
                else:
                    ptr, n, owner, dev, s = _device_view(key, name, f, value)
                if dev is not None and dev != self.device:
                    raise _bad(key, name, f"the tensor is on cuda:{dev}, this writer copies from cuda:{self.device}; use one writer per device")
                parts.append((name, ptr, n))
                owners.append(owner)
                if s is None:
                    on_base = True
                elif s not in named:
                    named.append(s)
        streams = _producer_streams(stream, named, on_base, self.device)
        if len(self._natives) > 1 and self.contains(key):
            from .._errors import make_error

            raise make_error("DuplicateKey", f"sample key `{key}` was given to this writer already", key=key)
        native = self._natives[self._dealt % len(self._natives)]
        native.append(key, parts, streams, bool(overwrite), tuple(owners))
        self._dealt += 1

    def contains(self, key: str) -> bool:
        """True when sample `key` was given to this writer or is in the dataset."""
        return any(n.contains(key) for n in self._natives)

    __contains__ = contains

    def stats(self) -> dict:
        """Counters: `slots`, `slot_bytes`, `busy`, `waits` (appends that blocked),
        `wait_seconds`, `append_seconds` (all time in append), `bytes_copied`, `samples_given`, `samples_written`, `oversize`,
        `unwritten` (samples lost to an error, which the next call raised). `slot_bytes` is the
        size of a slot now (0 before the first sample when slots are sized from the fields).
        With `writers=N`, summed over the writers (`slot_bytes` is the largest slot's)."""
        return _summed([n.stats() for n in self._natives])

    def flush(self) -> None:
        """Blocks until every sample given so far is written (or raises its error)."""
        for n in self._natives:
            n.flush()

    def commit(self) -> None:
        """Flushes and commits: what was given so far survives a crash and is readable."""
        for n in self._natives:
            n.commit()

    def finish(self) -> dict:
        """Flushes, commits, writes the samples table and closes. Returns `stats()`."""
        got, error = [], None
        for n in self._natives:
            try:
                got.append(n.finish())
            except Exception as e:  # finish the others, then raise the first error
                error = error or e
        if error is not None:
            raise error
        return _summed(got)

    close = finish

    def abort(self) -> None:
        """Stops without committing the open shard; what was committed stays. The samples
        given before the abort are still copied (no copy outlives its memory) and handed to
        the dataset in order, so a shard they fill commits as the next one comes, as with
        `hspack.Writer`: with small shards, most of what was given may be committed."""
        for n in self._natives:
            n.abort()

    def __enter__(self) -> "CudaWriter":
        return self

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        if exc_type is None:
            self.finish()
        else:
            self.abort()


def _summed(stats: list) -> dict:
    """Counters of several writers added up; `slot_bytes` is the largest slot's."""
    out = dict(zip(STATS, stats[0]))
    for more in stats[1:]:
        for name, value in zip(STATS, more):
            out[name] = max(out[name], value) if name == "slot_bytes" else out[name] + value
    return out


def _torch_current_device() -> int:
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return int(torch.cuda.current_device())
    return 0


def _torch_current_stream(device: int) -> int:
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return int(torch.cuda.current_stream(device).cuda_stream)
    return 0


__all__ = ["CudaWriter"]
