"""`hspack.verify`: the full check of a dataset after a transfer; `hspack.copy`, the transfer;
`hspack.compare`, how far a lossy copy is from the exact one."""

from __future__ import annotations

import json
import os

from . import _hspack


def verify(path: str | os.PathLike, quick: bool = False) -> dict:
    """Checks the dataset in `path`: with `quick`, footers, headers, indexes and the samples
    table; otherwise also every payload byte against its BLAKE3 and all padding.

    Returns a dict: `ok`, `shards`, `samples`, `chunks`, `bytes_hashed`, `shard_bytes`,
    `digest` (the BLAKE3 of the manifest, which stands for every byte: only after a full check
    that found nothing wrong, else None) and `problems`, a list of `HspackError` objects (not raised), each naming shard,
    sample, field and rows where it can. Raises `HspackError` only when the manifest cannot
    be read."""
    return _hspack.verify(os.fspath(path), quick)


def copy(src: str | os.PathLike, dst: str | os.PathLike, *, sync: bool = False, reread: bool = True, jobs: int = 4) -> dict:
    """Copies the dataset at `src` to `dst`, each a folder or a URL (`s3://bucket/prefix`,
    `gs://`, `az://`; `https://` as a source): every chunk is checked against its BLAKE3 as it
    passes, what landed is read back (`reread`; a shard found at `dst` is read back either way), and the manifest is published last, so an
    interrupted copy is never taken for a dataset and a rerun sends only what is missing.
    `sync`: `dst` may hold an earlier state of the dataset; only the new shards are sent.

    Returns the report: `shards_sent`, `bytes_sent`, `shards_present`, `bytes_present`,
    `shards_replaced`, `chunks_checked`, `bytes_reread`, `manifest_published`, `digest`."""
    return json.loads(_hspack.copy(os.fspath(src), os.fspath(dst), sync, reread, jobs))


def compare(a: str | os.PathLike, b: str | os.PathLike, samples: int | None = None) -> dict:
    """Compares dataset `b` with dataset `a` (the same samples, by key; e.g. a copy written
    with `quantize="fp8"` against the exact one), value by value, as `hspack compare` does.

    Returns `samples`, `rows` and `fields`: for each field (each layer of a field that stacks
    layers) `field`, `layer`, `stored` (`"exact"` or the scheme `b` stores it with), `values`,
    `differing`, `non_finite` (NaN or infinite in either, left out of the next four),
    `max_abs`, `rel_l2` (‖a − b‖ / ‖a‖; `inf` where `a` is all zeros and `b` is not), `cosine_mean` and
    `cosine_min` (of each token's row), floats. Only the first `samples` samples of `a` when given."""
    found = json.loads(_hspack.compare_json(os.fspath(a), os.fspath(b), samples))
    for f in found["fields"]:
        for figure in ("max_abs", "rel_l2", "cosine_mean", "cosine_min"):
            f[figure] = float(f[figure])  # JSON has no inf or NaN: they come as "inf", "NaN"
    return found
