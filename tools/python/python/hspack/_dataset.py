"""`hspack.Dataset`: reading samples as dicts of torch tensors or numpy arrays."""

from __future__ import annotations

import json
import operator
import os
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from . import _hspack
from ._errors import make_error
from ._tensors import FORMATS, convert, no_torch_error, torch_installed

CHECKS = ("once", "always", "never")
READAHEADS = ("hint", "load")


#: Names a SpecForge-trained user asks a sample for, which the EAGLE-3 view hands out.
_EAGLE3_NAMES = ("hidden_state", "aux_hidden_state", "target", "hidden_states")


class Fields(dict):
    """`{field name: tensor}` of one sample: a name it has not raises a `KeyError` that lists
    the names it has (and, for SpecForge's names, where to find them)."""

    def __missing__(self, name: Any) -> Any:
        said = f"no field {name!r} in this sample; it has: {', '.join(self)}"
        if name in _EAGLE3_NAMES:
            said += '; SpecForge\'s names come from the EAGLE-3 view: hspack.torch.HspackDataset(path, view="eagle3-specforge") (or view="eagle3")'
        raise _MissingField(said)


class _MissingField(KeyError):
    """A `KeyError` whose message reads as written (a plain one shows its quoted repr)."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass
class Sample:
    """One sample: its identity and its tensors (`{field name: tensor}`)."""

    key: str
    ordinal: int
    rows: int
    loss_rows: int | None
    tensors: dict

    def __getitem__(self, name: str) -> Any:
        return self.tensors[name]


def _names(fields: Sequence[str] | str | None) -> list[str] | None:
    """Field names as a list: one name given as a string is that one field (not its letters)."""
    if fields is None:
        return None
    return [fields] if isinstance(fields, str) else list(fields)


def shards_of(ds: Any) -> list[tuple[int, int, str]]:
    """What names each shard of `hspack.Dataset` `ds`: its first ordinal, its samples and its
    index's hash (so two datasets whose shards hold as many samples still differ)."""
    return _shard_names(ds.shards)


def _shard_names(shards: list[dict]) -> list[tuple[int, int, str]]:
    return [(int(s["first_ordinal"]), int(s["samples"]), str(s["index_blake3"])[:32]) for s in shards]


def grown_from(now: Sequence[tuple], before: Sequence[tuple]) -> bool:
    """True when shards `now` (`shards_of`) start with `before`: the same dataset, appended to
    since (a commit adds shards after the last), not rewritten."""
    return [tuple(r) for r in now[: len(before)]] == [tuple(r) for r in before]


def _as_index(v: Any) -> int | None:
    """`v` as an int where it is one (an int, a numpy integer, a 0-d integer tensor: anything
    with `__index__`), else None; a bool is no index (`ds[True]` read sample 1)."""
    if isinstance(v, (bool, np.bool_)):
        return None
    try:
        return operator.index(v)
    except TypeError:
        return None


def count_option(option: str, value: Any, least: int) -> int:
    """`value` of `option` as an int of `least` or more, else an `HspackError` naming the
    option (every option that counts something: sizes, seeds, epochs, layers)."""
    n = _as_index(value)
    if n is None or n < least:
        raise make_error("BadOption", f"option {option}: {value!r} must be an int of {least} or more", option=option)
    return n


def _rows_option(rows: Any, i: int) -> tuple[int, int] | None:
    """`rows` as `(start, stop)`, refused naming the sample where it is no pair of
    non-negative ints."""
    if rows is None:
        return None
    try:
        pair = [_as_index(r) for r in rows] if len(rows) == 2 else None
    except TypeError:
        pair = None
    if pair is None or any(r is None or r < 0 for r in pair):
        raise make_error("BadOption", f"option rows of sample {i}: {rows!r} must be (start, stop), two ints 0 or more (token rows start to stop - 1)", option="rows")
    return (pair[0], pair[1])


def _readahead_option(mode: str) -> None:
    if mode not in READAHEADS:
        raise make_error("BadOption", "option readahead: must be \"hint\" or \"load\"", option="readahead")


class Dataset:
    """An open hspack dataset.

    `ds[i]` is `{field name: tensor}` for sample `i` (negative counts from the end);
    `ds.sample(i)` adds the key, ordinal and row count. Tensors are views of the mapped
    shard when a field's rows lie in one uncompressed chunk, else freshly decoded. Views are
    read-only (writing to one faults): pass `copy=True` for writable tensors. A view keeps its
    shard mapped after the dataset is closed or deleted.

    The dataset pickles as its path and options; the mapping is reopened lazily in the
    process that unpickles it (DataLoader workers, fork or spawn).
    """

    def __init__(self, path: str | os.PathLike, check: str = "once", format: str = "torch", *, checked_memo: str | None = None, readahead: str = "hint", cache_dir: str | os.PathLike | None = None, cache_bytes: int | None = None, mapped_shards: int | None = None):
        if check not in CHECKS:
            raise make_error("BadOption", "option check: must be \"once\", \"always\" or \"never\"", option="check")
        if format not in FORMATS:
            raise make_error("BadOption", "option format: must be \"torch\" or \"numpy\"", option="format")
        if format == "torch" and not torch_installed():
            raise no_torch_error()
        _readahead_option(readahead)
        self._readahead = readahead
        self.path = os.fspath(path)
        self.check = check
        self.format = format
        self.checked_memo = checked_memo
        self.cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        self.cache_bytes = cache_bytes
        self.mapped_shards = None if mapped_shards is None else count_option("mapped_shards", mapped_shards, 1)
        self._native: _hspack.Dataset | None = None
        self._schema: dict | None = None
        self._lengths: tuple | None = None
        # The shards first opened (`shards_of`): what a reopened dataset must start with.
        self._opened: list | None = None
        self.native  # open now, so a missing dataset fails here

    # -- lifecycle -----------------------------------------------------------------------
    @property
    def native(self) -> _hspack.Dataset:
        """The native dataset, opened on first use; opened again (in a process it was pickled
        to, or after `close`) only where it is the dataset opened first, appended to since:
        one rewritten meanwhile is refused, since an ordinal would name another sample."""
        if self._native is None:
            native = _hspack.Dataset(self.path, self.check, self.checked_memo, self._readahead, self.cache_dir, self.cache_bytes, self.mapped_shards)
            if self._opened is not None and not grown_from(_shard_names(json.loads(native.shards_json())), self._opened):
                raise make_error(
                    "Io",
                    f"{self.path}: the dataset changed since this dataset object first opened it (its shards are no longer "
                    f"the {len(self._opened)} it had: it was rewritten, not appended to); open it again with hspack.open",
                    path=self.path,
                )
            self._lengths = None  # samples may have been appended since
            self._native = native
        return self._native

    def cache_stats(self) -> dict[str, int] | None:
        """What the block cache (`cache_dir`) did in this process: `hits` and `misses`
        (blocks), `fetches` and `fetched_bytes` (reads of the object store), `served_bytes`
        (from the cache), `passed_bytes` (file tails, held since open), `damaged` (blocks
        fetched again), `evicted`, `failed_writes`; None without a cache."""
        return self.native.cache_stats()

    @property
    def readahead(self) -> str:
        """`"hint"` or `"load"`: see `hspack.open`. Settable."""
        return self._readahead

    @readahead.setter
    def readahead(self, mode: str) -> None:
        _readahead_option(mode)
        if self._native is not None:
            self._native.set_readahead(mode)
        self._readahead = mode

    def _remember(self) -> None:
        """The shards first opened (`_opened`), taken from the open mapping before a reopen
        can follow (a close, a pickle): not at every open, where it would cost each one."""
        if self._opened is None and self._native is not None:
            self._opened = _shard_names(json.loads(self._native.shards_json()))

    def close(self) -> None:
        """Drops this object's handle on the mapping (views already made stay valid). A later
        use opens the dataset again, refused where it was rewritten meanwhile."""
        self._remember()
        self._native = None
        self._lengths = None

    def __getstate__(self) -> dict:
        self._remember()
        return {"path": self.path, "check": self.check, "format": self.format, "checked_memo": self.checked_memo, "_readahead": self._readahead, "cache_dir": self.cache_dir, "cache_bytes": self.cache_bytes, "mapped_shards": self.mapped_shards, "_opened": self._opened}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("_readahead", "hint")
        self.__dict__.setdefault("cache_dir", None)
        self.__dict__.setdefault("cache_bytes", None)
        self.__dict__.setdefault("mapped_shards", None)
        self.__dict__.setdefault("_opened", None)
        self._native = None
        self._schema = None
        self._lengths = None

    def __enter__(self) -> "Dataset":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"hspack.Dataset({self.path!r}, samples={len(self)}, check={self.check!r})"

    # -- metadata ------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.native)

    def _schema_dict(self) -> dict:
        if self._schema is None:
            self._schema = json.loads(self.native.schema_json())
        return self._schema

    @property
    def schema(self) -> list[dict]:
        """The fields: dicts with `name`, `dtype`, `shape` (of one row) and `role`."""
        return self._schema_dict()["fields"]

    @property
    def capture(self) -> dict | None:
        """How the hidden states were captured (model, layers, hidden size, ...), or None."""
        return self._schema_dict().get("capture")

    @property
    def fields(self) -> list[str]:
        """Field names in storage order."""
        return [f["name"] for f in self.schema]

    @property
    def manifest(self) -> dict:
        """The manifest file: schema, sample count, segments (or shards, in manifest
        versions 1 to 3), writer."""
        return json.loads(self.native.manifest_json())

    @property
    def shards(self) -> list[dict]:
        """Every shard's manifest entry (`file`, `seq`, `bytes`, `first_ordinal`, `samples`,
        ...), in order."""
        return json.loads(self.native.shards_json())

    @property
    def shard_ranges(self) -> list[tuple[int, int]]:
        """`(first ordinal, samples)` of every shard, in order."""
        return [(s["first_ordinal"], s["samples"]) for s in self.shards]

    def table_files(self) -> list[str]:
        """The samples table's parquet files, in ordinal order (current after every commit):
        `pandas.concat(map(pandas.read_parquet, ds.table_files()))`, or duckdb's
        `read_parquet([...])`."""
        return self.native.table_files()

    def _length_arrays(self) -> tuple:
        if self._lengths is None:
            raw = np.frombuffer(self.native.lengths(), dtype="<u8")
            n = raw.size // 2
            rows = raw[:n].astype(np.int64)
            unknown = raw[n:] == np.iinfo(np.uint64).max
            loss = raw[n:].astype(np.int64)  # unknown (u64::MAX) wraps to -1 ...
            loss[unknown] = -1  # ... and is set explicitly, for every numpy version
            self._lengths = (rows, loss)
        return self._lengths

    @property
    def lengths(self) -> np.ndarray:
        """Rows (tokens) of every sample, from the shard indexes (no data is read)."""
        return self._length_arrays()[0]

    @property
    def loss_lengths(self) -> np.ndarray:
        """Rows with the loss mask set, per sample; -1 where the schema has no loss mask."""
        return self._length_arrays()[1]

    def keys(self) -> list[str]:
        """Sample keys in ordinal order."""
        return self.native.keys()

    def ordinal(self, key: str) -> int | None:
        """The ordinal of the sample with `key`, or None."""
        return self.native.find(key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.native.find(key) is not None

    # -- reading -------------------------------------------------------------------------
    def _index(self, i: int) -> int:
        n = len(self)
        given = _as_index(i)
        if given is None:
            by_key = "; a sample by its key: ds.get(key)" if isinstance(i, str) else ""
            raise TypeError(f"sample index must be an int, not {type(i).__name__}{by_key}")
        i = given + n if given < 0 else given
        if not 0 <= i < n:
            raise IndexError(f"sample {given} is out of range: the dataset has {n} samples (0 to {n - 1}, or -{n} to -1 from the end)")
        return i

    def rows_of(self, i: int) -> int:
        """Rows (tokens) of sample `i`, from its shard's index alone (`lengths` reads every
        shard's)."""
        i = self._index(i)
        if self._lengths is not None:
            return int(self._lengths[0][i])
        return int(self.native.info(i)[1])

    def read(
        self,
        i: int,
        fields: Sequence[str] | None = None,
        rows: tuple[int, int] | None = None,
        copy: bool = False,
    ) -> dict:
        """`{field: tensor}` of sample `i`: only `fields` (all when None), only token rows
        `rows = (start, stop)` (all when None)."""
        i = self._index(i)
        parts = self.native.read(i, _names(fields), _rows_option(rows, i))
        return Fields((name, convert(buf, self.format, copy)) for name, buf in parts)

    def read_concat(self, i: int, fields: Sequence[str], rows: tuple[int, int] | None = None) -> Any:
        """Token rows `rows` (all when None) of `fields` side by side, `[T, sum of widths]`:
        row t is row t of every field, in the order given (the EAGLE-3 auxiliary states).
        The fields share a dtype. One copy from the shards, on the thread pool for a large
        sample, into memory reused from earlier such results this process dropped."""
        i = self._index(i)
        start, stop = _rows_option(rows, i) or (0, self.rows_of(i))
        return convert(self.native.read_concat(i, _names(fields), (start, stop)), self.format, False)

    def __getitem__(self, i: int) -> dict:
        return self.read(i)

    def __iter__(self) -> Iterator[dict]:
        for i in range(len(self)):
            yield self.read(i)

    def sample(self, i: int, fields: Sequence[str] | None = None, rows: tuple[int, int] | None = None, copy: bool = False) -> Sample:
        """Sample `i` with its key, ordinal and rows."""
        i = self._index(i)
        key, n, loss = self.native.info(i)
        return Sample(key=key, ordinal=i, rows=n, loss_rows=loss, tensors=self.read(i, fields, rows, copy))

    def get(self, key: str, fields: Sequence[str] | None = None, rows: tuple[int, int] | None = None, copy: bool = False) -> dict:
        """`{field: tensor}` of the sample with `key`; `HspackError` (kind `NoSuchKey`) when
        there is none."""
        if not isinstance(key, str):
            raise TypeError(f"a sample key is a str, not {type(key).__name__}" + ("; the sample at ordinal i: ds[i]" if isinstance(key, (int, np.integer)) else ""))
        i = self.native.find(key)
        if i is None:
            raise make_error("NoSuchKey", f"no sample has key `{key}`: list the keys with `hspack ls DATASET`", key=key)
        return self.read(i, fields, rows, copy)

    def quantized(self, i: int, field: str, rows: tuple[int, int] | None = None) -> dict:
        """A quantized field of sample `i` as stored, for trainers that consume FP8:
        `{"codes": [rows, *shape] float8_e4m3fn, "scales": [rows, groups] float32}` where
        a value is its code times its group's scale (groups of `group` consecutive values of
        a row: one per row and layer by default). With `format="numpy"` the codes are uint8
        (the E4M3FN bits). Reading the field normally gives the dequantized values."""
        i = self._index(i)
        codes, scales, group = self.native.read_quantized(i, field, _rows_option(rows, i))
        f = next(f for f in self.schema if f["name"] == field)
        shape = [int(d) for d in f["shape"]]
        per_row = int(np.prod(shape, dtype=np.int64)) if shape else 1
        n = len(codes) // per_row
        c = np.frombuffer(codes, dtype=np.uint8).reshape([n, *shape])
        s = np.frombuffer(scales, dtype="<f4").reshape([n, per_row // group])
        if self.format == "numpy":
            return {"codes": c, "scales": s, "group": group}
        import torch

        return {
            "codes": torch.from_numpy(c.copy()).view(torch.float8_e4m3fn),
            "scales": torch.from_numpy(s.copy()),
            "group": group,
        }

    def _mapping_range(self, shard: int) -> tuple[int, int]:
        """`(address, length)` of shard `shard`'s mapping in this process."""
        return self.native.mapping_range(shard)


def open(path: str | os.PathLike, check: str = "once", format: str = "torch", *, checked_memo: str | None = None, readahead: str = "hint", cache_dir: str | os.PathLike | None = None, cache_bytes: int | None = None, mapped_shards: int | None = None) -> Dataset:
    """Opens the dataset in folder `path`. Reads only the manifest; shards are mapped and
    checked on first use.

    `check`: `"once"` hashes each chunk the first time this process reads it (default),
    `"always"` on every read, `"never"` trusts the bytes (chunk headers are still checked;
    a damaged payload is then returned as is: run `hspack.verify` separately).
    `format`: `"torch"` (needs PyTorch: `pip install torch`, or `pip install "./tools/python[torch]"` from a checkout) or `"numpy"` (bf16 / fp8
    arrays have `ml_dtypes` types when that package is installed, else hold the raw bits as
    uint16 / uint8). Without torch installed, `format="torch"` is refused here, saying so.
    `checked_memo`: a folder (in `/dev/shm`, say) shared by processes that should hash each
    chunk once in all under `check="once"`; `hspack.torch`'s datasets make one per run.
    `readahead`: `"hint"` asks the kernel to read a sample's chunks ahead and returns at once
    (default); `"load"` returns once they are in the page cache, so the disk reads happen in
    the reading process: DataLoader workers whose tensors the trainer maps use it
    (`hspack.torch` sets it), so cold reads run in parallel in the workers.
    `cache_dir`: for a dataset in object storage (`s3://`, ...), a local folder that keeps
    the blocks read (4 MiB each), so later epochs read local disk instead of the network;
    processes given the same folder (DataLoader workers, later runs) share it. Every cached
    block is checked against its checksum on each use (a damaged one is fetched again), and
    chunks are checked per `check` as always. `cache_bytes` bounds the folder (default
    64 GiB): past it the least recently used blocks are deleted. A local folder is mapped
    and read in place, never cached. `Dataset.cache_stats()` says what the cache did.
    `mapped_shards`: how many shards stay mapped for later reads (default 8192), the one
    mapped longest let go first; a tensor read from a shard keeps it mapped while it lives.
    A process may map only so many regions (`vm.max_map_count`, 65,530 by default).
    """
    return Dataset(path, check=check, format=format, checked_memo=checked_memo, readahead=readahead, cache_dir=cache_dir, cache_bytes=cache_bytes, mapped_shards=mapped_shards)
