"""`hspack.verify`: the full check of a dataset after a transfer."""

from __future__ import annotations

import os

from . import _hspack


def verify(path: str | os.PathLike, quick: bool = False) -> dict:
    """Checks the dataset in `path`: with `quick`, footers, headers, indexes and the samples
    table; otherwise also every payload byte against its BLAKE3 and all padding.

    Returns a dict: `ok`, `shards`, `samples`, `chunks`, `bytes_hashed`, `shard_bytes`,
    `digest` and `problems`, a list of `HspackError` objects (not raised), each naming shard,
    sample, field and rows where it can. Raises `HspackError` only when the manifest cannot
    be read."""
    return _hspack.verify(os.fspath(path), quick)
