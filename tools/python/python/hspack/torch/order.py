"""Epoch orders: deterministic shuffles that read shard-local runs, and partitions of an
order across ranks and DataLoader workers.

The shuffle for `(seed, epoch)`: every shard's ordinals are cut into blocks of
`block_size` consecutive samples; the blocks are shuffled; then each window of
`window_blocks` consecutive (shuffled) blocks is shuffled sample by sample. A reader thus
touches about `window_blocks` runs of neighbouring samples at a time, while any sample can
land anywhere in the epoch.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from .._dataset import grown_from, shards_of


def rng(seed: int, epoch: int, *extra: int) -> np.random.Generator:
    """The generator of `(seed, epoch, *extra)`: the same on every rank and worker."""
    return np.random.Generator(np.random.PCG64([int(seed), int(epoch), *map(int, extra)]))


def blocks(shard_ranges: Sequence[tuple[int, int]], block_size: int) -> list[tuple[int, int]]:
    """`(start, stop)` runs of at most `block_size` ordinals that never cross a shard."""
    out = []
    for first, count in shard_ranges:
        for start in range(first, first + count, block_size):
            out.append((start, min(start + block_size, first + count)))
    return out


def epoch_order(
    shard_ranges: Sequence[tuple[int, int]],
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
    block_size: int = 64,
    window_blocks: int = 16,
) -> np.ndarray:
    """Every ordinal exactly once, in the order of `(seed, epoch)`; in ordinal order when
    `shuffle` is false."""
    runs = blocks(shard_ranges, max(1, block_size))
    if not shuffle:
        return np.concatenate([np.arange(a, b) for a, b in runs]) if runs else np.zeros(0, np.int64)
    g = rng(seed, epoch)
    perm = g.permutation(len(runs))
    out = []
    w = max(1, window_blocks)
    for i in range(0, len(perm), w):
        window = np.concatenate([np.arange(*runs[j]) for j in perm[i : i + w]])
        g.shuffle(window)
        out.append(window)
    return np.concatenate(out).astype(np.int64) if out else np.zeros(0, np.int64)


def partition(order: np.ndarray, parts: int, part: int, drop_last: bool = False, pad: bool = False) -> np.ndarray:
    """Part `part` of `parts` contiguous slices of `order`.

    Default: every sample exactly once; when `len(order)` does not divide evenly the first
    `len(order) % parts` parts hold one sample more. `drop_last`: every part holds
    `len // parts`; the last `len % parts` samples of this epoch's order are skipped (shuffled,
    other samples in other epochs; in order, the same ones every epoch, as torch's
    `DistributedSampler` does). `pad`: every part holds `ceil(len / parts)`, the
    shortfall filled by repeating the order from its start (those samples are seen twice).
    """
    n = len(order)
    if drop_last:
        per = n // parts
        return order[part * per : (part + 1) * per]
    if pad and n:
        per = -(-n // parts)
        total = per * parts
        padded = np.concatenate([order] * (-(-total // n)))[:total]
        return padded[part * per : (part + 1) * per]
    base, extra = divmod(n, parts)
    start = part * base + min(part, extra)
    return order[start : start + base + (1 if part < extra else 0)]


def interleave_batches(seq: np.ndarray, workers: int, worker: int, batch_size: int) -> np.ndarray:
    """The share of DataLoader worker `worker` of `seq` such that, with the DataLoader's
    round-robin over workers and batches of `batch_size`, the loader yields `seq` in order:
    batch k of `seq` goes to worker `k % workers`."""
    if workers <= 1:
        return seq
    b = max(1, batch_size)
    idx = [seq[k * b : (k + 1) * b] for k in range(worker, -(-len(seq) // b), workers)]
    return np.concatenate(idx) if idx else seq[:0]


def world(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """`(rank, world size)`: the pair given, checked; with neither, the default
    torch.distributed group's, `(0, 1)` without one. Refused: one of the two alone (the other
    would silently default and every rank read the whole epoch), a world size below 1, a rank
    outside `0 .. world_size - 1` (an empty or overlapping share)."""
    if rank is None and world_size is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1
    if rank is None or world_size is None:
        given, missing = ("rank", "world_size") if world_size is None else ("world_size", "rank")
        raise ValueError(f"{given} given without {missing}: pass both (rank=r, world_size=n) or neither (both then come from torch.distributed)")
    rank, world_size = int(rank), int(world_size)
    if world_size < 1:
        raise ValueError(f"world_size={world_size}: must be 1 or more (the number of ranks)")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} is not a rank of world_size={world_size}: pass a rank from 0 to {world_size - 1}")
    return rank, world_size


def digest(values: Any) -> str:
    """A short digest of integers (shard ranges, sample lengths): what an order depends on
    beyond the sample count, recorded in a resume state and compared when loading one."""
    import hashlib

    return hashlib.blake2b(np.ascontiguousarray(values, dtype=np.int64).tobytes(), digest_size=8).hexdigest()


def samples(shard_ranges: Sequence[tuple[int, int]]) -> int:
    """The samples of `shard_ranges` (ordinals `0 ..` this)."""
    return sum(int(count) for _, count in shard_ranges)




def agreed(ds: Any, rank: int | None = None, world_size: int | None = None) -> list[tuple[int, int]]:
    """The shards (`(first ordinal, samples)`) of `hspack.Dataset` `ds` that every rank orders. With the ranks of
    torch.distributed (`rank` and `world_size` not given), the first shards that every rank's
    dataset holds: a capture that commits while the ranks open the dataset makes ranks that
    opened it later see more (appended) shards, and ranks ordering different samples would
    read some twice and skip others. A collective, as the partition already assumes: every
    rank of the group builds the sampler or dataset (one built on some ranks only takes
    `rank` and `world_size`). On a group of NCCL alone it runs on this rank's CUDA device,
    and is left out, with a warning, while that device is not set yet
    (`torch.cuda.set_device`). Refused when the ranks' first shards differ (the dataset was
    rewritten between their opens, or they opened other datasets: each shard is named by its
    index's hash too). Given `rank` and `world_size`: every shard of `ds` (the caller
    agrees)."""
    path = ds.path
    shards = shards_of(ds)
    ranges = [(first, count) for first, count, _ in shards]
    if rank is not None or world_size is not None:
        return ranges
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return ranges
    if not _device_set_for(dist.get_backend()):
        import warnings

        warnings.warn(
            f"{path}: the ranks did not check that they order the same samples (a capture committing while they open "
            "the dataset makes them differ): the process group is NCCL alone and this rank's CUDA device is not set yet; "
            "call torch.cuda.set_device(local_rank) before building hspack's sampler or dataset",
            stacklevel=3,
        )
        return ranges
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, shards)
    shortest = min(everyone, key=len)
    if not all(grown_from(r, shortest) for r in everyone):
        from .._errors import make_error

        raise make_error("Io", f"{path}: the ranks opened different datasets (their first shards differ: it was rewritten between their opens, or the ranks name other datasets); give every rank the same dataset and make the dataset objects again", path=path)
    return ranges[: len(shortest)]


def _device_set_for(backend: str) -> bool:
    """False for a process group of NCCL alone while this process's CUDA device is not the
    one its launcher gave it (`LOCAL_RANK`): objects then gather through that device, and
    ranks on one device fail."""
    if "gloo" in backend or "nccl" not in backend:
        return True
    import torch

    local = os.environ.get("LOCAL_RANK")
    try:
        return local is None or torch.cuda.current_device() == int(local)
    except (RuntimeError, ValueError):  # no CUDA here, or a LOCAL_RANK that is no number
        return False
