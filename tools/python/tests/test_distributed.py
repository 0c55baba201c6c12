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


def _rank_opening_around_a_commit(rank: int, path: str, init: str, out: str) -> None:
    """Rank 0 opens the dataset before a commit adds a shard, rank 1 after it; then each
    orders its share with the sampler, the token-budget sampler and the iterable dataset
    (whose rank 0, once it has opened the dataset, commits another shard before agreeing,
    and rank 1 builds it after that commit)."""
    import time

    from conftest import write_eagle

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    from hspack.torch import HspackDataset, HspackIterableDataset, HspackSampler, TokenBudgetBatchSampler
    from hspack.torch import order

    if rank == 0:
        ds = HspackDataset(path, ["input_ids"])
    dist.barrier()
    if rank == 0:
        write_eagle(path, 39, first=26, shard_samples=13)
    dist.barrier()
    if rank == 1:
        ds = HspackDataset(path, ["input_ids"])
    seen = {"sampler": list(HspackSampler(ds, seed=3))}
    seen["tokens"] = [i for b in TokenBudgetBatchSampler(ds, max_tokens=64, seed=3) for i in b]
    flag = f"{out}.committed"
    agreed = order.agreed
    if rank == 0:

        def commit_then_agree(*args, **kwargs):
            write_eagle(path, 52, first=39, shard_samples=13)
            open(flag, "w").close()
            return agreed(*args, **kwargs)

        order.agreed = commit_then_agree
    else:
        while not os.path.exists(flag):
            time.sleep(0.05)
    it = HspackIterableDataset(path, ["input_ids"], seed=3)
    order.agreed = agreed
    seen["iterable"] = [int(s["ordinal"]) for s in it]
    seen["opened"] = [len(ds.hspack), len(it.hspack)]
    everyone: list = [None, None]
    dist.all_gather_object(everyone, seen)
    if rank == 0:
        torch.save(everyone, out)
    dist.destroy_process_group()


def test_ranks_that_opened_the_dataset_before_and_after_a_commit_order_the_same_samples(tmp_path):
    """A capture commits while the ranks of a job open the dataset: every rank orders the
    samples all of them opened (the first ones, which a commit only appends to), so together
    they read each of those once; without agreeing, the rank that opened later ordered more
    samples, reading some twice and skipping others."""
    from conftest import write_eagle

    path = str(tmp_path / "ds")
    write_eagle(path, 26, shard_samples=13)
    init = f"file://{tmp_path}/rendezvous"
    out = str(tmp_path / "seen.pt")
    mp.spawn(_rank_opening_around_a_commit, args=(path, init, out), nprocs=2, join=True)
    a, b = torch.load(out)
    assert a["opened"][0] == 26 and b["opened"][0] == 39, (a["opened"], b["opened"])
    assert a["opened"][1] == 39 and b["opened"][1] == 52, (a["opened"], b["opened"])
    assert sorted(a["sampler"] + b["sampler"]) == list(range(26))
    assert sorted(a["tokens"] + b["tokens"]) == list(range(26))
    assert sorted(a["iterable"] + b["iterable"]) == list(range(39))


def _rank_opening_its_own_dataset(rank: int, paths: list, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    import hspack
    from hspack.torch import HspackSampler

    try:
        HspackSampler(hspack.open(paths[rank]), seed=3)
        said = None
    except Exception as e:  # noqa: BLE001 - what each rank was told is the result
        said = f"{type(e).__name__}: {e}"
    everyone: list = [None, None]
    dist.all_gather_object(everyone, said)
    if rank == 0:
        torch.save(everyone, out)
    dist.destroy_process_group()


def test_ranks_that_opened_different_datasets_of_the_same_shard_sizes_are_refused(tmp_path):
    """Two datasets whose shards hold as many samples each (the same run written twice, once
    compressed): ranks given different ones are refused, as the ordinals would name other
    samples on each rank; shard sizes alone did not tell them apart."""
    from conftest import write_eagle

    paths = [str(tmp_path / "plain"), str(tmp_path / "zstd")]
    write_eagle(paths[0], 26, shard_samples=13)
    write_eagle(paths[1], 26, shard_samples=13, codec="zstd")
    out = str(tmp_path / "said.pt")
    mp.spawn(_rank_opening_its_own_dataset, args=(paths, f"file://{tmp_path}/rendezvous", out), nprocs=2, join=True)
    said = torch.load(out)
    for told in said:
        assert told is not None and "the ranks opened different datasets" in told, said


def test_ranks_agree_through_the_cpu_or_this_ranks_cuda_device(monkeypatch):
    """The agreement gathers through gloo where the group has it; on NCCL alone, only once
    this rank's CUDA device is the one its launcher gave it (else objects would gather on one
    device for every rank)."""
    from hspack.torch import order

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert order._device_set_for("gloo")
    assert order._device_set_for("cpu:gloo,cuda:nccl")
    assert order._device_set_for("nccl")  # no launcher said which device: as the user set it
    monkeypatch.setenv("LOCAL_RANK", "3")  # while this process's device is still 0 (or none)
    assert not order._device_set_for("nccl")
