"""hspack.torch: orders, partitions, DataLoader workers, resume, batching, EAGLE-3 view."""

from __future__ import annotations

import re
import shutil

import hspack
import numpy as np
import pytest
import torch

from conftest import LAYERS, eagle_sample, write_eagle
from hspack.torch import (
    Eagle3View,
    HspackDataset,
    HspackIterableDataset,
    HspackLoader,
    HspackSampler,
    PadCollate,
    TokenBudgetBatchSampler,
    epoch_order,
    partition,
)

# (first ordinal, samples) of each shard of `eagle_path`: 37 samples, 13 a shard.
SHARDS = [(0, 13), (13, 13), (26, 11)]


def reference_order(shards, seed, epoch, block_size=64, window_blocks=16) -> list:
    """The epoch order as `hspack.torch.order` documents it, written out here: each shard cut
    into blocks of `block_size` ordinals, the blocks permuted, then each window of
    `window_blocks` blocks shuffled sample by sample, all drawn from one PCG64 seeded with
    `[seed, epoch]`."""
    g = np.random.Generator(np.random.PCG64([seed, epoch]))
    runs = [
        list(range(start, min(start + block_size, first + count)))
        for first, count in shards
        for start in range(first, first + count, block_size)
    ]
    perm = g.permutation(len(runs))
    out = []
    for i in range(0, len(runs), window_blocks):
        window = np.array([o for j in perm[i : i + window_blocks] for o in runs[j]])
        g.shuffle(window)
        out += window.tolist()
    return out


def test_epoch_order_is_a_deterministic_mixing_permutation():
    a = epoch_order(SHARDS, seed=1, epoch=0, block_size=4, window_blocks=2)
    assert a.tolist() == reference_order(SHARDS, 1, 0, block_size=4, window_blocks=2)
    assert sorted(a.tolist()) == list(range(37))
    assert np.array_equal(a, epoch_order(SHARDS, seed=1, epoch=0, block_size=4, window_blocks=2))
    assert not np.array_equal(a, epoch_order(SHARDS, seed=1, epoch=1, block_size=4, window_blocks=2))
    assert not np.array_equal(a, np.arange(37))
    big = epoch_order([(0, 100_000)], seed=3, epoch=0)
    # Shard-local runs: each window of 16 blocks of 64 spans at most 16 blocks...
    assert len(np.unique(big[:1024] // 64)) <= 16
    # ...yet the epoch mixes: the first tenth of the order comes from all over the dataset.
    assert np.histogram(big[:10_000], bins=10, range=(0, 100_000))[0].min() > 300


@pytest.mark.parametrize("parts", [1, 2, 3, 5])
def test_partition_policies(parts):
    order = np.arange(37)
    every = np.concatenate([partition(order, parts, p) for p in range(parts)])
    assert np.array_equal(every, order)
    dropped = [partition(order, parts, p, drop_last=True) for p in range(parts)]
    assert {len(d) for d in dropped} == {37 // parts}
    padded = [partition(order, parts, p, pad=True) for p in range(parts)]
    assert {len(d) for d in padded} == {-(-37 // parts)}
    assert set(np.concatenate(padded).tolist()) == set(range(37))


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_with_two_workers(eagle_path, context):
    ds = HspackIterableDataset(eagle_path, ["input_ids", "hidden.5"], seed=4)
    loader = HspackLoader(ds, batch_size=3, num_workers=2, multiprocessing_context=context, collate_fn=PadCollate())
    seen = []
    for batch in loader:
        for b, o in enumerate(batch["ordinal"].tolist()):
            n = int(batch["lengths"][b])
            assert torch.equal(batch["hidden.5"][b, :n], eagle_sample(o)["hidden.5"])
            seen.append(o)
    # Every sample once, in the epoch order of seed 4, epoch 0 (one rank).
    assert seen == reference_order(SHARDS, 4, 0)
    assert sorted(seen) == list(range(37))

    mapped = HspackDataset(eagle_path, view="eagle3")
    loader = torch.utils.data.DataLoader(mapped, batch_size=None, num_workers=2, multiprocessing_context=context)
    ords = [s["ordinal"] for s in loader]
    assert ords == list(range(37))


def test_loaders_of_other_batch_sizes_over_one_iterable_each_deal_their_own(eagle_path):
    """Workers deal the order out a batch each: a second loader over the same dataset object,
    with another batch size (one to look at samples), must not change how the first one's
    workers deal, or its batches come out of order and a resume skips and repeats samples."""
    ds = HspackIterableDataset(eagle_path, ["input_ids"], seed=7)
    train = HspackLoader(ds, batch_size=4, num_workers=2)
    peek = HspackLoader(ds, batch_size=1)
    assert [o for b in train for o in b["ordinal"].tolist()] == reference_order(SHARDS, 7, 0)
    assert [int(b["ordinal"][0]) for b in peek] == reference_order(SHARDS, 7, 0)
    ds.set_epoch(1)
    first = []
    for k, batch in enumerate(train):
        first += batch["ordinal"].tolist()
        if k == 2:
            break
    state = train.state_dict()
    fresh = HspackIterableDataset(eagle_path, ["input_ids"], seed=7)
    resumed = HspackLoader(fresh, batch_size=4, num_workers=2)
    HspackLoader(fresh, batch_size=1)
    resumed.load_state_dict(state)
    rest = [o for b in resumed for o in b["ordinal"].tolist()]
    assert first + rest == reference_order(SHARDS, 7, 1)


@pytest.mark.parametrize("workers", [0, 2])
def test_iterable_resume_gives_exactly_the_rest(eagle_path, workers):
    def loader_of(ds):
        return HspackLoader(ds, batch_size=4, num_workers=workers, collate_fn=PadCollate())

    ds = HspackIterableDataset(eagle_path, ["input_ids"], seed=7)
    loader = loader_of(ds)
    loader.set_epoch(2)
    full = [o for b in loader for o in b["ordinal"].tolist()]
    assert full == reference_order(SHARDS, 7, 2)
    loader.set_epoch(2)
    first = []
    for k, batch in enumerate(loader):
        first += batch["ordinal"].tolist()
        if k == 4:
            break
    state = loader.state_dict()
    assert state["consumed"] == 20 and state["epoch"] == 2
    fresh = HspackIterableDataset(eagle_path, ["input_ids"], seed=7)
    loader2 = loader_of(fresh)
    loader2.load_state_dict(state)
    rest = [o for b in loader2 for o in b["ordinal"].tolist()]
    assert first + rest == full
    assert sorted(full) == list(range(37))


def test_persistent_workers_follow_set_epoch_and_load_state_dict(eagle_path):
    def epoch_of(loader):
        return [o for b in loader for o in b["ordinal"].tolist()]

    ref = HspackLoader(HspackIterableDataset(eagle_path, ["input_ids"], seed=5), batch_size=4, collate_fn=PadCollate())
    want = {}
    for e in (0, 1):
        ref.set_epoch(e)
        want[e] = epoch_of(ref)
        assert want[e] == reference_order(SHARDS, 5, e)
    assert want[0] != want[1]
    ds = HspackIterableDataset(eagle_path, ["input_ids"], seed=5)
    loader = HspackLoader(ds, batch_size=4, num_workers=2, persistent_workers=True, collate_fn=PadCollate())
    assert epoch_of(loader) == want[0]
    loader.set_epoch(1)
    assert epoch_of(loader) == want[1]
    # Mid-epoch resume into the same persistent workers.
    loader.load_state_dict({"seed": 5, "epoch": 0, "consumed": 12, "rank": 0, "world_size": 1})
    assert epoch_of(loader) == want[0][12:]


def test_sampler_resume(eagle_path):
    ds = HspackDataset(eagle_path, ["input_ids"])
    sampler = HspackSampler(ds, seed=3)
    loader = HspackLoader(ds, batch_size=5, sampler=sampler, num_workers=2, collate_fn=PadCollate())
    full = [o for b in loader for o in b["ordinal"].tolist()]
    assert full == reference_order(SHARDS, 3, 0)
    sampler.set_epoch(0)
    it = iter(loader)
    first = next(it)["ordinal"].tolist() + next(it)["ordinal"].tolist()
    del it
    s2 = HspackSampler(ds, seed=3)
    s2.load_state_dict(sampler.state_dict())
    rest = [o for b in HspackLoader(ds, batch_size=5, sampler=s2, collate_fn=PadCollate()) for o in b["ordinal"].tolist()]
    assert first + rest == full and sorted(full) == list(range(37))
    # Something else than a loader state (a whole checkpoint, a model's state, None) is said
    # so; it raised a bare KeyError or AttributeError from inside the package.
    for wrong, said in (({"model": {}, "loader": sampler.state_dict()}, "a dict of keys ['loader', 'model']"), (None, "a NoneType")):
        with pytest.raises(ValueError, match=rf"not an hspack loader state \({re.escape(said)}; one holds `epoch` and `consumed`\)"):
            HspackSampler(ds, seed=3).load_state_dict(wrong)


def test_token_budget_batches(eagle_path):
    ds = HspackDataset(eagle_path, ["input_ids", "loss_mask"])
    lengths = ds.hspack.lengths
    sampler = TokenBudgetBatchSampler(ds, max_tokens=64, bucket_size=16, seed=1)
    batches = list(sampler)
    assert sorted(o for b in batches for o in b) == list(range(37))
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[b]) <= 64
    # Ranks split the samples; even_batches equalizes the counts.
    per_rank = [TokenBudgetBatchSampler(ds, 64, bucket_size=16, rank=r, world_size=2, even_batches=True).batches() for r in range(2)]
    assert len(per_rank[0]) == len(per_rank[1])
    loader = HspackLoader(ds, batch_sampler=sampler, collate_fn=PadCollate(max_len=20), num_workers=0)
    seen = []
    for k, batch in enumerate(loader):
        assert batch["input_ids"].shape[1] <= 20
        seen.append(batch["ordinal"].tolist())
        if k == 2:
            break
    assert seen == batches[:3] and loader.state_dict()["consumed"] == 3
    s2 = TokenBudgetBatchSampler(ds, max_tokens=64, bucket_size=16, seed=1)
    s2.load_state_dict(loader.state_dict())
    assert list(s2) == batches[3:]


def test_pad_collate_masks(eagle_path):
    ds = HspackDataset(eagle_path, ["input_ids", "loss_mask"])
    batch = PadCollate(max_len=10, pad_id=-1)([ds[0], ds[1]])
    n0, n1 = (min(10, int(ds.hspack.lengths[i])) for i in (0, 1))
    assert batch["input_ids"].shape == (2, max(n0, n1))
    assert batch["attention_mask"][0].sum() == n0 and batch["attention_mask"][1].sum() == n1
    short = 0 if n0 < n1 else 1
    n = min(n0, n1)
    assert (batch["input_ids"][short, n:] == -1).all()
    assert (batch["loss_mask"][short, n:] == 0).all()
    assert torch.equal(batch["loss_mask"][0, :n0], eagle_sample(0)["loss_mask"][:n0])


def test_eagle3_view_matches_the_written_tensors(eagle_path):
    ds = HspackDataset(eagle_path, view="eagle3")
    for i in (0, 9, 36):
        s, w = ds[i], eagle_sample(i)
        t = w["input_ids"].shape[0]
        assert s["aux_hidden_state"].shape == (t, 3 * 16)
        assert s["hidden_state"].shape == (t, 16)
        want = torch.cat([w[f"hidden.{layer}"] for layer in LAYERS], dim=-1)
        assert torch.equal(s["aux_hidden_state"], want)
        assert torch.equal(s["hidden_state"], w["hidden.7"])
        assert torch.equal(s["input_ids"], w["input_ids"])
        assert torch.equal(s["loss_mask"], w["loss_mask"])
    sf = HspackDataset(eagle_path, view=Eagle3View(layout="specforge", max_len=8))[9]
    w = eagle_sample(9)
    assert set(sf) == {"input_ids", "loss_mask", "attention_mask", "hidden_state", "target"}
    assert sf["hidden_state"].shape == (1, 8, 48) and sf["target"].shape == (1, 8, 16)
    assert sf["loss_mask"][0, -1] == 0 and torch.equal(sf["loss_mask"][0, :-1], w["loss_mask"][:7])
    assert torch.equal(sf["input_ids"][0], w["input_ids"][:8])
    assert sf["attention_mask"].dtype == torch.int64 and sf["attention_mask"].sum() == 8


# The three resumable kinds, each through `HspackLoader` with seed 7; "iterable-workers" has
# persistent workers, which read where each iteration starts from shared memory.
KINDS = ["iterable", "iterable-workers", "sampler", "token-budget"]


def loader_of(kind: str, path: str) -> HspackLoader:
    if kind.startswith("iterable"):
        workers = {"num_workers": 2, "persistent_workers": True} if kind == "iterable-workers" else {}
        return HspackLoader(HspackIterableDataset(path, ["input_ids"], seed=7), batch_size=4, **workers)
    ds = HspackDataset(path, ["input_ids"])
    if kind == "sampler":
        return HspackLoader(ds, batch_size=4, sampler=HspackSampler(ds, seed=7))
    return HspackLoader(ds, batch_sampler=TokenBudgetBatchSampler(ds, max_tokens=64, bucket_size=16, seed=7))


def one_for(loader: HspackLoader, stop: int | None = None) -> list:
    """The batches (lists of ordinals) of one `for` over `loader`, broken off after `stop`."""
    out = []
    for batch in loader:
        out.append(batch["ordinal"].tolist())
        if len(out) == stop:
            break
    return out


def flat(batches: list) -> list:
    return [o for b in batches for o in b]


@pytest.mark.parametrize("kind", KINDS)
def test_set_epoch_after_load_state_dict_keeps_the_resumed_position(eagle_path, kind):
    # The documented resume: load_state_dict, then set_epoch(e) for e from the saved epoch on.
    ref = loader_of(kind, eagle_path)
    want = {}
    for e in (2, 3):
        ref.set_epoch(e)
        want[e] = flat(one_for(ref))
    run = loader_of(kind, eagle_path)
    run.set_epoch(2)
    first = flat(one_for(run, stop=3))
    state = run.state_dict()
    resumed = loader_of(kind, eagle_path)
    resumed.load_state_dict(state)
    seen = {}
    for epoch in range(state["epoch"], 4):
        resumed.set_epoch(epoch)
        seen[epoch] = flat(one_for(resumed))
    assert first + seen[2] == want[2]  # each sample of epoch 2 once
    assert seen[3] == want[3]
    # set_epoch to another epoch than the loaded one starts that epoch from its beginning.
    other = loader_of(kind, eagle_path)
    other.load_state_dict(state)
    other.set_epoch(3)
    assert flat(one_for(other)) == want[3]


@pytest.mark.parametrize("kind", KINDS)
def test_resume_from_a_state_saved_at_the_end_of_an_epoch_moves_on(eagle_path, kind):
    run = loader_of(kind, eagle_path)
    run.set_epoch(2)
    one_for(run)
    state = run.state_dict()
    ref = loader_of(kind, eagle_path)
    ref.set_epoch(3)
    resumed = loader_of(kind, eagle_path)
    resumed.load_state_dict(state)
    seen = {}
    for epoch in range(state["epoch"], 4):
        resumed.set_epoch(epoch)
        seen[epoch] = one_for(resumed)
    assert seen == {2: [], 3: one_for(ref)}  # epoch 2 is not trained twice


@pytest.mark.parametrize("kind", KINDS)
def test_a_new_iteration_after_a_complete_epoch_starts_it_again(eagle_path, kind):
    loader = loader_of(kind, eagle_path)  # no set_epoch at all
    epoch = one_for(loader)
    assert sorted(flat(epoch)) == list(range(37))
    assert one_for(loader) == epoch  # not empty: the same epoch again, in the same order
    assert len(loader) == len(epoch)  # what the next `for` yields: the whole epoch, not 0
    # Broken off midway, the next `for` gives exactly the rest.
    head = one_for(loader, stop=2)
    assert len(loader) == len(epoch) - 2
    assert head + one_for(loader) == epoch


@pytest.mark.parametrize("make", [
    lambda ds, path, **kw: HspackSampler(ds, **kw),
    lambda ds, path, **kw: HspackIterableDataset(path, ["input_ids"], **kw),
    lambda ds, path, **kw: TokenBudgetBatchSampler(ds, 64, **kw),
], ids=["sampler", "iterable", "token-budget"])
@pytest.mark.parametrize("given, message", [
    ({"rank": 1}, "rank given without world_size"),
    ({"world_size": 2}, "world_size given without rank"),
    ({"rank": 2, "world_size": 2}, "rank=2 is not a rank of world_size=2"),
    ({"rank": -1, "world_size": 2}, "rank=-1 is not a rank of world_size=2"),
    ({"rank": 0, "world_size": 0}, "world_size=0"),
])
def test_rank_and_world_size_are_checked(eagle_path, make, given, message):
    ds = HspackDataset(eagle_path, ["input_ids"])
    with pytest.raises(ValueError, match=message):
        make(ds, eagle_path, **given)
    assert make(ds, eagle_path, rank=1, world_size=2).state_dict()["rank"] == 1


def test_token_budget_state_refuses_another_world_size(eagle_path):
    ds = HspackDataset(eagle_path, ["input_ids"])

    def sampler(world_size=2, max_tokens=64):
        return TokenBudgetBatchSampler(ds, max_tokens, bucket_size=16, seed=1, rank=0, world_size=world_size)

    saved = sampler()
    saved.advance(2)
    state = saved.state_dict()
    assert state["world_size"] == 2 and state["max_tokens"] == 64
    with pytest.raises(ValueError, match="world_size=2, this run has world_size=1"):
        sampler(world_size=1).load_state_dict(state)
    with pytest.raises(ValueError, match="max_tokens=64, this run has max_tokens=128"):
        sampler(max_tokens=128).load_state_dict(state)
    same = sampler()
    same.load_state_dict(state)
    assert list(same) == saved.batches()[2:]
    # A state of an earlier version (seed, epoch, consumed only) loads as before.
    old = sampler()
    old.load_state_dict({"seed": 1, "epoch": 0, "consumed": 2})
    assert list(old) == saved.batches()[2:]


def test_eagle3_view_refuses_a_dataset_without_token_ids(tmp_path):
    import hspack

    path = str(tmp_path / "no-ids")
    schema = [hspack.hidden_state(layer, 16) for layer in LAYERS] + [hspack.hidden_state(7, 16, point="final_norm")]
    with hspack.Writer(path, schema, durable=False) as w:
        for i in range(2):
            s = eagle_sample(i)
            w.append(f"s{i}", **{k: v for k, v in s.items() if k.startswith("hidden.")})
    # Refused where the torch dataset is built, naming the dataset and the field.
    for view in ("eagle3", "eagle3-specforge"):
        with pytest.raises(hspack.HspackError, match=f"dataset {path} has no token_ids field") as err:
            HspackDataset(path, view=view)
        assert err.value.field == "token_ids" and err.value.path == path
        with pytest.raises(hspack.HspackError, match="no token_ids field"):
            HspackIterableDataset(path, view=view)
    with pytest.raises(hspack.HspackError, match="no token_ids field"):
        Eagle3View()(hspack.open(path), 0)


def test_spawned_workers_order_the_samples_the_dataset_object_was_made_with(tmp_path):
    """A capture commits more samples while a loader is made and started: workers that reopen
    the dataset (spawn) order the samples the main process saw, each once; a dataset rewritten
    (not appended to) in between is refused by name, never read under the old ordinals."""
    path = tmp_path / "ds"
    write_eagle(path, 20, shard_samples=5)
    ds = HspackIterableDataset(path, ["input_ids"], seed=3)
    write_eagle(path, 31, first=20, shard_samples=5)
    loader = HspackLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="spawn")
    got = [o for b in loader for o in b["ordinal"].tolist()]
    assert sorted(got) == list(range(20)), got
    assert got == list(ds.state.rank_order(ds.shard_ranges))

    other = tmp_path / "other"
    write_eagle(other, 20, shard_samples=7)
    shutil.rmtree(path)
    shutil.copytree(other, path)
    loader = HspackLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="spawn")
    with pytest.raises(Exception, match="changed since"):
        list(loader)


def test_spawned_workers_refuse_a_map_style_dataset_rewritten_with_the_same_layout(tmp_path):
    """Workers of a map-style dataset that reopen it (spawn) check it is still the one the
    main process ordered, down to each shard's index: a dataset rewritten with the same shard
    layout and other samples is refused, never read under the old ordinals."""
    path = tmp_path / "ds"
    write_eagle(path, 20, shard_samples=5)
    ds = HspackDataset(path, ["input_ids"])
    other = tmp_path / "other"
    write_eagle(other, 120, first=100, shard_samples=5)
    assert hspack.open(other).shard_ranges == ds.hspack.shard_ranges
    shutil.rmtree(path)
    shutil.copytree(other, path)
    loader = HspackLoader(ds, batch_size=4, sampler=HspackSampler(ds, seed=3), num_workers=1, multiprocessing_context="spawn")
    with pytest.raises(Exception, match="changed since"):
        list(loader)


@pytest.mark.parametrize("kind", ["sampler", "iterable", "iterable-workers"])
def test_drop_last_never_leaves_later_epochs_empty(eagle_path, kind):
    # 37 samples in batches of 4: the last sample is dropped, and the epoch is complete all
    # the same: each `for` (no set_epoch) is the whole epoch again, never the one left over.
    if kind == "sampler":
        ds = HspackDataset(eagle_path, ["input_ids"])
        loader = HspackLoader(ds, batch_size=4, sampler=HspackSampler(ds, seed=7), drop_last=True)
    else:
        workers = {"num_workers": 2, "persistent_workers": True} if kind == "iterable-workers" else {}
        loader = HspackLoader(HspackIterableDataset(eagle_path, ["input_ids"], seed=7), batch_size=4, drop_last=True, **workers)
    first = one_for(loader)
    assert len(first) == 9 and all(len(b) == 4 for b in first)
    assert loader.state_dict()["consumed"] == 37
    assert len(loader) == 9
    assert one_for(loader) == first
    loader.set_epoch(1)
    assert len(one_for(loader)) == 9


def test_an_unbatched_item_counts_as_one_sample_whatever_its_structure(eagle_path):
    # A view returning a tuple: unbatched, the DataLoader hands it on as a list of 2.
    ds = HspackIterableDataset(eagle_path, view=lambda d, i: (d.read(i)["input_ids"], i), seed=7)
    loader = HspackLoader(ds, batch_size=None)
    got = []
    for item in loader:
        got.append(item[1])
        if len(got) == 5:
            break
    assert loader.state_dict()["consumed"] == 5
    rest = [item[1] for item in loader]
    assert sorted(got + rest) == list(range(37))


def test_out_of_order_batches_are_refused(eagle_path):
    ds = HspackIterableDataset(eagle_path, ["input_ids"])
    with pytest.raises(ValueError, match="in_order=True"):
        HspackLoader(ds, batch_size=4, num_workers=2, in_order=False)


def test_a_specforge_item_cut_by_the_collate_is_masked_as_specforge_masks_it(eagle_path):
    # SpecForge cuts a sample to its max length, then zeroes the loss mask's last position:
    # PadCollate(max_len) over the uncut view gives what the view cut to max_len gives.
    whole = HspackDataset(eagle_path, view="eagle3-specforge")
    cut = HspackDataset(eagle_path, view="eagle3-specforge", max_len=8)
    long = [i for i in range(len(whole)) if whole[i]["input_ids"].shape[1] > 8]
    short = [i for i in range(len(whole)) if whole[i]["input_ids"].shape[1] <= 8]
    assert long and short
    collate = PadCollate(max_len=8)
    for i in long[:5] + short[:2]:
        batch = collate([whole[i]])
        want = cut[i]["loss_mask"][0]
        assert torch.equal(batch["loss_mask"][0, : want.shape[0]], want.to(batch["loss_mask"].dtype)), i
    batch = collate([whole[long[0]], whole[short[0]]])
    n = int(batch["lengths"][1])
    assert batch["loss_mask"][0, 7] == 0 and batch["loss_mask"][1, n - 1] == 0


def test_a_state_of_the_same_samples_cut_into_other_shards_or_of_other_lengths_is_refused(tmp_path):
    """A shuffled order follows shard boundaries, and token-budget batches the lengths: a
    state saved over the same count of samples laid out otherwise (the dataset re-converted
    or quantized with another shard size) would resume at the wrong place. Without shuffle
    the order is the ordinals', whatever the shards, and such a state loads."""
    a, b = tmp_path / "a", tmp_path / "b"
    write_eagle(a, 37, shard_samples=13)
    write_eagle(b, 37, shard_samples=10)
    da, db = HspackDataset(a, ["input_ids"]), HspackDataset(b, ["input_ids"])
    saved = HspackSampler(da, seed=3)
    saved.advance(20)
    with pytest.raises(ValueError, match=r"saved over 37 samples cut into other shards .* set_epoch\(1\)"):
        HspackSampler(db, seed=3).load_state_dict(saved.state_dict())
    with pytest.raises(ValueError, match="cut into other shards"):
        HspackIterableDataset(b, ["input_ids"], seed=3).load_state_dict(saved.state_dict())
    in_order = HspackSampler(da, shuffle=False)
    in_order.advance(20)
    resumed = HspackSampler(db, shuffle=False)
    resumed.load_state_dict(in_order.state_dict())
    assert list(resumed) == list(range(20, 37))
    # Batches follow the lengths: the same samples clipped at another length differ.
    tb = TokenBudgetBatchSampler(da, 64, seed=1)
    tb.advance(2)
    with pytest.raises(ValueError, match="max_len=None, this run has max_len=3"):
        TokenBudgetBatchSampler(da, 64, seed=1, max_len=3).load_state_dict(tb.state_dict())
    state = tb.state_dict()
    state["max_len"] = 3  # as if saved with max_len=3 over samples whose lengths differ
    with pytest.raises(ValueError, match="of other lengths"):
        TokenBudgetBatchSampler(da, 64, seed=1, max_len=3).load_state_dict(state)


def test_uneven_ranks_under_ddp_are_warned_of(eagle_path):
    """37 samples over 2 ranks: one rank runs a step more, which under DDP hangs at its
    gradient sync; the sampler says so and what to pass, and is quiet when told."""
    import warnings

    ds = HspackDataset(eagle_path, ["input_ids"])
    with pytest.warns(UserWarning, match="pass drop_last=True .* or pad=True"):
        HspackSampler(ds, rank=0, world_size=2)
    with pytest.warns(UserWarning, match="pass even_batches=True"):
        TokenBudgetBatchSampler(ds, 64, rank=0, world_size=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        HspackSampler(ds, rank=0, world_size=2, drop_last=True)
        HspackSampler(ds, rank=0, world_size=2, pad=True)
        HspackSampler(ds)
        TokenBudgetBatchSampler(ds, 64, rank=0, world_size=2, even_batches=True)


def test_a_state_of_the_other_kind_of_sampler_is_refused(eagle_path):
    """One counts samples, the other batches: each one's consumed count read as the other's
    would skip or repeat samples."""
    ds = HspackDataset(eagle_path, ["input_ids"])
    samples = HspackSampler(ds, seed=1)
    samples.advance(20)
    batches = TokenBudgetBatchSampler(ds, 64, seed=1)
    batches.advance(3)
    with pytest.raises(ValueError, match="the state counts samples .* this one counts batches"):
        TokenBudgetBatchSampler(ds, 64, seed=1).load_state_dict(samples.state_dict())
    with pytest.raises(ValueError, match="the state counts batches .* this one counts samples"):
        HspackSampler(ds, seed=1).load_state_dict(batches.state_dict())


def test_a_state_saved_before_a_capture_grew_the_dataset_says_what_to_do(tmp_path):
    path = tmp_path / "ds"
    write_eagle(path, 20, shard_samples=5)
    ds = HspackDataset(path, ["input_ids"])
    sampler = HspackSampler(ds, seed=3)
    sampler.set_epoch(2)
    sampler.advance(7)
    state = sampler.state_dict()
    write_eagle(path, 30, first=20, shard_samples=5)
    grown = HspackDataset(path, ["input_ids"])
    with pytest.raises(ValueError, match=r"saved over 20 samples, the dataset holds 30 now .* call set_epoch\(3\)"):
        HspackSampler(grown, seed=3).load_state_dict(state)


def test_ordering_flags_are_bools_and_drop_last_with_pad_is_refused(eagle_path):
    """`drop_last="false"` (a config file's string) was taken as True and left samples out;
    `drop_last=True, pad=True` left one out unsaid (drop_last won)."""
    ds = HspackDataset(eagle_path)
    for option in ("shuffle", "drop_last", "pad"):
        with pytest.raises(hspack.HspackError, match=f"option {option}: 'false' must be True or False"):
            HspackSampler(ds, **{option: "false"})
        with pytest.raises(hspack.HspackError, match=f"option {option}: 'false' must be True or False"):
            HspackIterableDataset(eagle_path, **{option: "false"})
    with pytest.raises(hspack.HspackError, match="option even_batches: 1 must be True or False"):
        TokenBudgetBatchSampler(ds, 512, even_batches=1)
    for make in (lambda r: HspackSampler(ds, rank=r, world_size=2, drop_last=True, pad=True),
                 lambda r: HspackIterableDataset(eagle_path, rank=r, world_size=2, drop_last=True, pad=True)):
        with pytest.raises(hspack.HspackError, match="option pad: drop_last=True and pad=True ask for opposite things"):
            make(0)
    # Each alone covers every sample as documented: pad repeats, drop_last leaves the odd one out.
    padded = [o for r in range(2) for o in HspackSampler(ds, rank=r, world_size=2, pad=True)]
    assert set(padded) == set(range(37)) and len(padded) == 38
    dropped = [o for r in range(2) for o in HspackSampler(ds, rank=r, world_size=2, drop_last=True)]
    assert len(set(dropped)) == len(dropped) == 36


def test_a_state_with_a_negative_count_is_refused_and_a_batch_size_is_checked(eagle_path):
    """A state of `consumed=-5` resumed 32 samples on, skipping them unsaid; a batch size of
    2.5 became 2 and one of 0 was taken."""
    sampler = HspackSampler(HspackDataset(eagle_path), shuffle=False)
    for bad in ({"epoch": 0, "consumed": -5}, {"epoch": -1, "consumed": 0}, {"epoch": 0, "consumed": 2.5}):
        with pytest.raises(ValueError, match="not an hspack loader state"):
            sampler.load_state_dict({**sampler.state_dict(), **bad})
    assert list(sampler) == list(range(37))
    for bad in (0, -3, 2.5, True):
        with pytest.raises(hspack.HspackError, match="option batch_size"):
            HspackIterableDataset(eagle_path, batch_size=bad)


def test_fields_given_as_one_string_is_that_field(eagle_path):
    tds = HspackDataset(eagle_path, fields="input_ids")
    assert sorted(tds[0]) == ["input_ids", "ordinal"]


def test_the_final_norm_state_is_the_eagle3_target_whatever_its_layer_id(tmp_path):
    """A final-norm field named after a layer before one captured (`hidden_state(5,
    point="final_norm")` beside layer 6's output) sorted among the layers: layer 6's output
    became the target and the final norm an auxiliary block, shapes unchanged."""
    h = 8
    schema = [hspack.token_ids(), hspack.hidden_state(1, h), hspack.hidden_state(3, h),
              hspack.hidden_state(6, h, point="layer_output"), hspack.hidden_state(5, h, point="final_norm", name="final")]
    g = torch.Generator().manual_seed(0)
    x = {n: torch.randn(2, h, generator=g).to(torch.bfloat16) for n in ("hidden.1", "hidden.3", "hidden.6", "final")}
    with hspack.Writer(tmp_path / "ds", schema, {"model": "m", "num_layers": 7, "hidden_size": h, "dtype": "bf16"}, durable=False) as w:
        w.append("a", input_ids=torch.zeros(2, dtype=torch.int32), **x)
    v = HspackDataset(str(tmp_path / "ds"), view="eagle3")[0]
    assert torch.equal(v["hidden_state"], x["final"])
    assert torch.equal(v["aux_hidden_state"], torch.cat([x["hidden.1"], x["hidden.3"], x["hidden.6"]], dim=-1))
