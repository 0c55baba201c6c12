"""Two torch.distributed (gloo) ranks see disjoint samples that cover the epoch."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(rank: int, path: str, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    from hspack.torch import HspackIterableDataset, HspackLoader, PadCollate

    ds = HspackIterableDataset(path, ["input_ids"], seed=11)
    loader = HspackLoader(ds, batch_size=4, num_workers=2, collate_fn=PadCollate())
    mine = torch.tensor([o for b in loader for o in b["ordinal"].tolist()])
    padded = torch.full((37,), -1, dtype=torch.int64)
    padded[: len(mine)] = mine
    gathered = [torch.empty(37, dtype=torch.int64) for _ in range(2)]
    dist.all_gather(gathered, padded)
    if rank == 0:
        torch.save([g[g >= 0] for g in gathered], out)
    dist.destroy_process_group()


def test_two_ranks_partition_the_epoch(eagle_path, tmp_path):
    init = f"file://{tmp_path}/rendezvous"
    out = str(tmp_path / "seen.pt")
    mp.spawn(_rank, args=(eagle_path, init, out), nprocs=2, join=True)
    a, b = torch.load(out)
    assert len(a) + len(b) == 37 and abs(len(a) - len(b)) <= 1
    assert not set(a.tolist()) & set(b.tolist())
    assert sorted(a.tolist() + b.tolist()) == list(range(37))
    assert os.path.exists(out)
