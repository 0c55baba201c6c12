"""`hspack.Writer`: appending samples from torch tensors or numpy arrays."""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

from . import _hspack
from ._dtypes import input_bytes
from ._schema import normalize

TOOL = "hspack.python"


class Writer:
    """Writes (or resumes) the dataset in folder `path`, or at an object-storage URL
    (`s3://bucket/prefix`, `gs://`, `az://`): there each shard is spooled in `TMPDIR` and
    uploaded when it rolls, and one writer at a time holds the dataset's lease.

    `schema` is a list of fields (dicts or `hspack.field` / `hidden_state` / `token_ids` /
    `loss_mask`); `capture` optionally describes the capture (`model`, `num_layers`,
    `hidden_size`, `dtype`, ...). Options: `chunk_bytes`, `shard_bytes`, `shard_samples`,
    `codec` (`"none"`, `"zstd"`, `"zstd-bytegroup"`), `zstd_level`, `align_log2`, `durable`,
    `shared`.

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
        self.fields = normalize(schema)
        self._by_name = {f["name"]: f for f in self.fields}
        doc: dict = {"fields": self.fields, "capture": None}
        if capture is not None:
            capture = dict(capture)
            capture.setdefault("tool", TOOL)
            capture.setdefault("tool_version", _hspack.__version__)
            doc["capture"] = capture
        self._native = _hspack.Writer(self.path, json.dumps(doc), create, options)

    def append(self, key: str, **tensors: Any) -> int | None:
        """Appends sample `key` with one tensor per field (`[rows, *row shape]`, the field's
        dtype, CPU). Contiguous inputs are read in place. Returns the ordinal (`None` with
        `shared=True`: it is given at commit)."""
        from ._errors import make_error

        parts = []
        for name, value in tensors.items():
            f = self._by_name.get(name)
            if f is None:
                raise make_error("BadSample", f"sample `{key}`, field `{name}`: the schema has no such field; it has {', '.join(self._by_name)}", key=key, field=name)
            parts.append((name, input_bytes(key, name, f, value)))
        return self._native.append(key, parts)

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

    def __enter__(self) -> "Writer":
        return self

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        if exc_type is None:
            self.finish()
        else:
            self._native.abort()


def _stats(t: tuple) -> dict:
    return dict(zip(("samples", "shards", "bytes", "raw_bytes"), t))
