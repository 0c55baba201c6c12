"""`hspack.Writer`: appending samples from torch tensors or numpy arrays."""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

from . import _hspack
from ._dtypes import input_bytes
from ._schema import capture_metadata, normalize

TOOL = "hspack.python"


class Writer:
    """Writes (or resumes) the dataset in folder `path`, or at an object-storage URL
    (`s3://bucket/prefix`, `gs://`, `az://`): there each shard is spooled in `TMPDIR` and
    uploaded when it rolls, and one writer at a time holds the dataset's lease.

    `schema` is a list of fields (dicts or `hspack.field` / `hidden_state` / `token_ids` /
    `loss_mask`); `capture`, where given, describes the capture: `model`, `num_layers`,
    `hidden_size` and `dtype` (those four needed), `revision`, `config_hash`, `tp_size`. Options: `chunk_bytes`, `shard_bytes`, `shard_samples`,
    `codec` (`"none"`, `"zstd"`, `"zstd-bytegroup"`), `zstd_level`, `align_log2`, `durable`
    (default True; False skips fsync, for scratch data: a crash of the process still loses
    nothing committed, a power cut can lose commits or leave the dataset unreadable;
    into a store `STORE/NAME` only the dataset's own file, as the store's packs and index,
    which other datasets share, are always synced), `shared`, `quantize`.

    `quantize="fp8"` stores every hidden-state field as FP8 E4M3FN with one f32 scale per row
    and layer (lossy, about half the bytes of bf16); `quantize="fp8:NAME,NAME"` (or a list of
    names) the fields named. Token ids, loss masks and fields not named stay exact. Append the
    original tensors: the writer quantizes them. Readers hand out the original dtype
    (dequantized) unless asked for the stored codes (`Dataset.quantized`).

    `shared=True` lets several writers append to one dataset at once (the ranks of a job, or
    processes on several nodes sharing a folder or a bucket), each opening its own `Writer`
    with it: every commit takes the dataset's commit lock for a moment and appends after what
    the others committed. Keys must differ across writers; ordinals are given at commit, so
    `append` returns `None`.

    Reopening an existing dataset resumes it (same schema required); skip done samples with
    `contains(key)`. As a context manager it finishes (commits) on success and leaves the
    dataset as of its last commit on an exception.
    """

    def __init__(self, path: str | os.PathLike, schema: Sequence[Any], capture: dict | None = None, *, create: bool = False, **options: Any):
        self.path = os.fspath(path)
        doc: dict = {"fields": normalize(schema), "capture": None}
        if capture is not None:
            doc["capture"] = capture_metadata(capture, TOOL, _hspack.__version__)
        quantize = options.pop("quantize", None)
        if quantize is not None:
            doc["fields"] = quantized_fields(doc["fields"], quantize)
        self.fields = doc["fields"]
        self._by_name = {f["name"]: f for f in self.fields}
        if "capture_key" in self._by_name:
            from ._errors import make_error

            # append(capture_key=...) would take the field's tensor for a capture key.
            raise make_error("BadOption", f"{self.path}: a field named `capture_key` cannot be appended: append() takes a capture key under that keyword; name the field otherwise", option="schema", field="capture_key")
        self._native = _hspack.Writer(self.path, json.dumps(doc), create, options)

    def append(self, key: str, /, *, capture_key: bytes | None = None, **tensors: Any) -> int | None:
        """Appends sample `key` with one tensor per field (`[rows, *row shape]`, the field's
        dtype, CPU). Contiguous inputs are read in place. Returns the ordinal (`None` with
        `shared=True`: it is given at commit).

        `capture_key` (from `hspack.capture_key`, for a dataset `STORE/NAME` only): the store
        records at the next commit that this sample is that capture, so later runs into the
        store reuse it (`reuse_captured`) instead of running the model again."""
        from ._errors import kind_of, make_error

        if not isinstance(key, str):
            raise make_error("BadSample", f"sample key {key!r}: {kind_of(key)}, not a str; keys are strings (str({key!r}) makes one)", key=str(key))
        try:
            key.encode("utf-8")
        except UnicodeEncodeError as e:
            shown = key.encode("utf-8", "replace").decode("utf-8")
            raise make_error(
                "BadSample",
                f"sample key {key!r}: not UTF-8 text ({e.reason} at {e.start}; a file name decoded with surrogateescape holds such characters); keys are UTF-8: give one that is (key.encode('utf-8', 'replace').decode() makes one)",
                key=shown,
            ) from None
        parts = []
        for name, value in tensors.items():
            f = self._by_name.get(name)
            if f is None:
                raise make_error("BadSample", f"sample `{key}`, field `{name}`: the schema has no such field; it has {', '.join(self._by_name)}", key=key, field=name)
            parts.append((name, input_bytes(key, name, f, value)))
        return self._native.append(key, parts, capture_key)

    def reuse_captured(self, items: Sequence[tuple[str, bytes]]) -> tuple[list[bool], int]:
        """For each `(sample key, capture key)`, appends under the sample key the sample the
        store already holds for that capture key (from any of its datasets), after checking its
        bytes against the digest recorded with it. Returns which samples were appended (capture
        the others) and how many keys named a sample that is gone or changed. Only for a
        dataset `STORE/NAME`."""
        done, stale = self._native.reuse_captured([(k, bytes(c)) for k, c in items])
        return list(done), stale

    @property
    def in_store(self) -> bool:
        """True for a dataset `STORE/NAME`: capture keys are recorded and reused."""
        return self._native.in_store()

    def contains(self, key: str) -> bool:
        """True when sample `key` was appended (committed or not)."""
        return self._native.contains(key)

    __contains__ = contains

    def __len__(self) -> int:
        return len(self._native)

    def commit(self) -> dict:
        """Makes what was appended visible to readers."""
        return _stats(self._native.commit())

    def finish(self) -> dict:
        """Commits and closes."""
        return _stats(self._native.finish())

    def abort(self) -> None:
        """Closes without committing: the samples appended since the last commit are
        dropped (a writer dropped that way unasked warns)."""
        self._native.abort()

    def __enter__(self) -> "Writer":
        return self

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        if exc_type is None:
            self.finish()
        else:
            self.abort()


def quantize_spec(quantize: Any) -> str:
    """The `quantize=` option as the writer takes it: `"fp8"`, `"fp8:NAME,NAME"`, or a list
    of field names (stored as fp8)."""
    if isinstance(quantize, str):
        return quantize
    if isinstance(quantize, (list, tuple)) and all(isinstance(n, str) for n in quantize):
        return "fp8:" + ",".join(quantize)
    from ._errors import make_error

    raise make_error(
        "BadOption",
        f'option quantize: must be "fp8", "fp8:NAME,NAME" or a list of field names, not {quantize!r}',
        option="quantize",
    )


def quantized_fields(fields: Sequence[Any], quantize: Any) -> list[dict]:
    """`fields` with those `quantize` names marked stored as fp8 (`"fp8"`: every hidden-state
    field; `"fp8:NAME,NAME"` or a list of names: those), as the writers store them."""
    doc = {"fields": normalize(fields), "capture": None}
    return json.loads(_hspack.quantize_schema(json.dumps(doc), quantize_spec(quantize)))["fields"]


def capture_key(config: dict, input_ids: Any, loss_mask: Any = None) -> bytes:
    """The capture key (32 bytes) of `input_ids` under `config`: `model`, `engine`,
    `deterministic`, `dtype`, `layers` (ids), `fields` (the dataset's field names in schema
    order), and optionally `revision` and `config_hash`. Give `loss_mask` where the dataset
    stores one: a reused sample brings its stored mask. Equal keys mean the same capture of the
    same tokens (FORMAT.md §11.7)."""
    def ints(v: Any) -> list:
        return [int(t) for t in (v.tolist() if hasattr(v, "tolist") else v)]

    mask = None if loss_mask is None else ints(loss_mask)
    return _hspack.capture_key(json.dumps(config), ints(input_ids), mask)


def _stats(t: tuple) -> dict:
    return dict(zip(("samples", "shards", "bytes", "raw_bytes"), t))
