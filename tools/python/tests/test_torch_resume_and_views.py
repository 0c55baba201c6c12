"""hspack.torch: resume with DataLoader workers, copies of an iterable dataset, views that
refuse what they cannot serve, and the pinned collate of a tensor that could not be received."""

from __future__ import annotations

import copy
import os
import pickle
import re

import hspack
import pytest
import torch

from conftest import eagle_sample
from hspack._errors import make_error
from hspack.torch import (
    Eagle3View,
    FieldsView,
    HspackDataset,
    HspackIterableDataset,
    HspackLoader,
    HspackSampler,
    PadCollate,
    TokenBudgetBatchSampler,
)
from hspack.torch.batching import Uncollated
from hspack.torch.transfer import Unreadable


def sampler_loader(kind: str, path: str, workers: int) -> HspackLoader:
    """A loader over `path` with the sampler `kind` ("sampler", unbatched, or
    "token-budget"), seed 5."""
    ds = HspackDataset(path, ["input_ids"])
    if kind == "token-budget":
        return HspackLoader(ds, batch_sampler=TokenBudgetBatchSampler(ds, max_tokens=60, seed=5), num_workers=workers)
    return HspackLoader(ds, batch_size=None, sampler=HspackSampler(ds, seed=5), num_workers=workers)


def ordinals(loader: HspackLoader) -> list:
    """The ordinals of one `for` over `loader`, batched or not."""
    out = []
    for item in loader:
        o = item["ordinal"]
        out += o.tolist() if torch.is_tensor(o) else [o]
    return out


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", ["sampler", "token-budget"])
def test_a_state_saved_at_the_end_of_an_epoch_resumes_with_nothing_left_with_workers(eagle_path, kind, workers):
    """A DataLoader with workers makes its sampler's iterator twice per iteration: the
    iteration begins once, so the resumed epoch is not replayed."""
    run = sampler_loader(kind, eagle_path, workers)
    run.set_epoch(0)
    assert sorted(ordinals(run)) == list(range(37))
    state = run.state_dict()
    ref = sampler_loader(kind, eagle_path, 0)
    ref.set_epoch(1)
    want = ordinals(ref)
    resumed = sampler_loader(kind, eagle_path, workers)
    resumed.load_state_dict(state)
    seen = {}
    for epoch in range(state["epoch"], 2):
        resumed.set_epoch(epoch)
        seen[epoch] = ordinals(resumed)
    assert seen == {0: [], 1: want}


@pytest.mark.parametrize("kind", ["sampler", "token-budget"])
def test_a_sampler_iteration_begins_at_its_first_item(eagle_path, kind):
    """An iterator made and dropped unused (as the DataLoader's first) moves nothing."""
    ds = HspackDataset(eagle_path, ["input_ids"])
    sampler = HspackSampler(ds, seed=5) if kind == "sampler" else TokenBudgetBatchSampler(ds, max_tokens=60, seed=5)
    whole = list(sampler)
    sampler.advance(len(whole))
    sampler.finish()
    sampler.load_state_dict(sampler.state_dict())
    iter(sampler)
    assert list(sampler) == []  # the resumed epoch had nothing left
    assert list(sampler) == whole  # then a complete epoch starts again


def epoch_orders(ds: HspackIterableDataset, workers: int) -> dict:
    """The ordinals of epochs 0 and 1 over `ds` (persistent workers when there are any)."""
    options = {"num_workers": workers, "persistent_workers": True} if workers else {}
    loader = HspackLoader(ds, batch_size=4, **options)
    out = {}
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        out[epoch] = ordinals(loader)
    return out


@pytest.mark.parametrize("make_copy", [copy.deepcopy, lambda ds: pickle.loads(pickle.dumps(ds))], ids=["deepcopy", "pickle"])
def test_a_copied_iterable_dataset_shares_its_epoch_with_persistent_workers(eagle_path, make_copy):
    original = HspackIterableDataset(eagle_path, ["input_ids"], seed=3)
    ds = make_copy(original)
    assert ds.state._shared.is_shared()
    assert ds.state._shared.data_ptr() != original.state._shared.data_ptr()  # its own
    want = epoch_orders(HspackIterableDataset(eagle_path, ["input_ids"], seed=3), 0)
    assert want[0] != want[1]
    assert epoch_orders(ds, 2) == want
    assert original.state.epoch == 0 and original.state.published() == (0, 0)


def test_an_unpickled_position_keeps_shared_memory_it_arrived_in(eagle_path):
    """What torch's multiprocessing sends (a spawned worker's copy) stays the same memory."""
    from multiprocessing.reduction import ForkingPickler

    ds = HspackIterableDataset(eagle_path, ["input_ids"], seed=3)
    got = pickle.loads(ForkingPickler.dumps(ds.state))
    ds.set_epoch(4)
    assert got.published() == (4, 0)


def write_aux(path: str, dtypes: list[str]) -> None:
    """Two samples: token ids, one hidden state of each of `dtypes` (layers 1, 2, ...) and a
    final-norm target."""
    h = 8
    schema = [hspack.token_ids(), *[hspack.hidden_state(i + 1, h, dtype=d) for i, d in enumerate(dtypes)], hspack.hidden_state(9, h, point="final_norm")]
    torch_dtype = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
    with hspack.Writer(path, schema, durable=False) as w:
        for s in range(2):
            hidden = {f"hidden.{i + 1}": torch.ones(5, h, dtype=torch_dtype[d]) for i, d in enumerate(dtypes)}
            w.append(f"k{s}", input_ids=torch.arange(5, dtype=torch.int32), **hidden, **{"hidden.9": torch.zeros(5, h, dtype=torch.bfloat16)})


@pytest.mark.parametrize("view", ["eagle3", "eagle3-specforge", Eagle3View(), Eagle3View(aux_fields=["hidden.1", "hidden.2"])])
@pytest.mark.parametrize("dtypes", [["f16", "bf16"], ["f32", "bf16"]])
def test_auxiliary_fields_of_mixed_dtypes_are_refused(tmp_path, view, dtypes):
    path = str(tmp_path / "mixed")
    write_aux(path, dtypes)
    listed = f"hidden.1 ({dtypes[0]}), hidden.2 ({dtypes[1]})"
    for make in (HspackDataset, HspackIterableDataset):
        with pytest.raises(hspack.HspackError, match=re.escape(f"dataset {path} have different dtypes: {listed};")) as err:
            make(path, view=view)
        assert "Convert them to one dtype, or read them with a FieldsView" in str(err.value)
        assert err.value.path == path and err.value.field == "hidden.2"
    # The fields themselves read as they are.
    assert HspackDataset(path, ["hidden.1", "hidden.2"])[0]["hidden.2"].dtype == torch.bfloat16


def test_auxiliary_fields_of_one_dtype_are_served(tmp_path):
    path = str(tmp_path / "f16")
    write_aux(path, ["f16", "f16"])
    item = HspackDataset(path, view="eagle3")[0]
    assert item["aux_hidden_state"].dtype == torch.float16 and item["aux_hidden_state"].shape == (5, 16)


@pytest.mark.parametrize("view, field, option", [
    (Eagle3View(aux_fields=["hidden.9"]), "hidden.9", "aux_fields"),
    (Eagle3View(aux_fields=["hidden.1", "hidden.9"]), "hidden.9", "aux_fields"),
    (Eagle3View(target_field="hidden.last"), "hidden.last", "target_field"),
    (FieldsView(fields=["input_ids", "hidden.9"]), "hidden.9", "fields"),
], ids=["aux", "one-aux-of-two", "target", "fields"])
def test_fields_the_dataset_has_not_are_refused_at_construction(eagle_path, view, field, option):
    for make in (HspackDataset, HspackIterableDataset):
        with pytest.raises(hspack.HspackError, match=re.escape(f"option {option}: dataset {eagle_path} has no field '{field}'; it has: input_ids, loss_mask, hidden.1,")) as err:
            make(eagle_path, view=view)
        assert err.value.path == eagle_path and err.value.field == field and err.value.option == option
    with pytest.raises(hspack.HspackError, match=f"has no field '{field}'"):
        HspackDataset(eagle_path, fields=[field]) if option == "fields" else view(hspack.open(eagle_path), 0)


def test_no_auxiliary_field_is_refused_at_construction(eagle_path):
    for make in (HspackDataset, HspackIterableDataset):
        with pytest.raises(hspack.HspackError, match="option aux_fields: .* none is named; name at least one") as err:
            make(eagle_path, view=Eagle3View(aux_fields=[]))
        assert err.value.path == eagle_path and err.value.option == "aux_fields"


def test_fields_given_with_a_view_are_refused(eagle_path):
    """A view picks its own fields: `fields=` beside it was ignored without a word."""
    for make in (HspackDataset, HspackIterableDataset):
        with pytest.raises(hspack.HspackError, match=r"option fields: \['nonsense'\] with view='eagle3'; a view picks its own fields") as err:
            make(eagle_path, fields=["nonsense"], view="eagle3")
        assert err.value.option == "fields"


def test_named_fields_the_dataset_has_are_served(eagle_path):
    view = Eagle3View(aux_fields=["hidden.3"], target_field="hidden.5")
    item = HspackDataset(eagle_path, view=view)[4]
    want = eagle_sample(4)
    assert torch.equal(item["aux_hidden_state"], want["hidden.3"]) and torch.equal(item["hidden_state"], want["hidden.5"])
    assert set(HspackDataset(eagle_path, fields=["loss_mask"])[0]) == {"loss_mask", "ordinal"}


@pytest.mark.parametrize("at", [0, 2])
def test_a_tensor_that_could_not_be_received_raises_its_error_in_the_collate(eagle_path, at):
    """In torch's pin-memory thread a tensor that could not be received is an `Unreadable`:
    collating it raises its error, not a TypeError or a batch holding it in a list."""
    ds = HspackDataset(eagle_path, view="eagle3")
    samples = [dict(ds[i]) for i in range(3)]
    samples[at]["hidden_state"] = Unreadable(make_error("Io", "shard-000000.hsp: gone since it was sent"))
    for collate in (PadCollate(), PadCollate(max_len=4)):
        with pytest.raises(hspack.HspackError, match="shard-000000.hsp: gone"):
            collate(samples)
        with pytest.raises(hspack.HspackError, match="shard-000000.hsp: gone"):
            Uncollated(samples, collate).pin_memory()  # before any pinned memory is asked for


def test_a_dataset_without_a_loss_mask_warns_that_every_token_is_trained_on(tmp_path):
    """The EAGLE-3 view hands out a mask of ones where the dataset has none: said once, when
    the torch dataset is built, not left to be found in the loss curve."""
    path = str(tmp_path / "nomask")
    with hspack.Writer(path, [hspack.token_ids(), hspack.hidden_state(1, 8), hspack.hidden_state(2, 8)], durable=False) as w:
        w.append("a", input_ids=torch.zeros(3, dtype=torch.int32), **{"hidden.1": torch.ones(3, 8, dtype=torch.bfloat16), "hidden.2": torch.ones(3, 8, dtype=torch.bfloat16)})
    with pytest.warns(UserWarning, match="has no loss mask field .* trains on every token"):
        ds = HspackDataset(path, view="eagle3")
    assert torch.equal(ds[0]["loss_mask"], torch.ones(3, dtype=ds[0]["loss_mask"].dtype))


def test_a_dataset_with_a_loss_mask_builds_without_a_warning(eagle_path):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        HspackDataset(eagle_path, view="eagle3")


def ordinal_only(ds, i):
    """A view whose samples hold no tensor."""
    return {"ordinal": i}


def test_samples_without_tensors_are_refused_not_an_empty_epoch(eagle_path):
    """`fields=[]` reads nothing and is refused when built; a view of its own whose samples
    hold no tensor fails in the collate with an error: a StopIteration out of the collate ended
    the epoch at once, and the loader recorded every sample as consumed."""
    for make in (HspackDataset, HspackIterableDataset):
        with pytest.raises(hspack.HspackError, match=r"option fields: \[\] reads no field") as err:
            make(eagle_path, fields=[])
        assert err.value.option == "fields"
    ds = HspackDataset(eagle_path, view=ordinal_only)
    for workers in (0, 2):
        loader = HspackLoader(ds, sampler=HspackSampler(ds), batch_size=4, num_workers=workers)
        with pytest.raises(Exception, match="PadCollate: the samples hold no tensor") as err:
            list(loader)
        assert loader.state_dict()["consumed"] == 0, (workers, err.value)


def test_max_len_with_a_view_object_is_refused(eagle_path):
    """A view object cuts its own samples: `max_len` beside it was ignored without a word."""
    assert HspackDataset(eagle_path, view="eagle3", max_len=4)[1]["input_ids"].shape[0] == 4
    assert HspackDataset(eagle_path, view=Eagle3View(max_len=4))[1]["input_ids"].shape[0] == 4
    for make in (HspackDataset, HspackIterableDataset):
        with pytest.raises(hspack.HspackError, match="option max_len: 4 with a view object") as err:
            make(eagle_path, view=Eagle3View(), max_len=4)
        assert err.value.option == "max_len"


def test_a_negative_index_counts_from_the_end(eagle_path):
    for view in (None, "eagle3", Eagle3View()):
        ds = HspackDataset(eagle_path, view=view)
        assert ds[-1]["ordinal"] == 36 and torch.equal(ds[-1]["input_ids"], ds[36]["input_ids"])
        with pytest.raises(IndexError, match="sample -38 is out of range|sample -1 is out of range"):
            ds[-38]


@pytest.mark.parametrize("workers", [0, 2])
def test_an_iterable_dataset_an_hspack_loader_went_through_is_whole_for_a_plain_loop(eagle_path, workers):
    """After `HspackLoader` completes an epoch of an `HspackIterableDataset`, an iteration no
    loader begins (a plain DataLoader, an eval pass, a `for` over the dataset) yields the whole
    epoch again, not nothing (it read the workers' start as the epoch's end)."""
    ds = HspackIterableDataset(eagle_path, ["input_ids"], seed=3)
    epoch = ordinals(HspackLoader(ds, batch_size=None, num_workers=workers))
    assert sorted(epoch) == list(range(37))
    assert [s["ordinal"] for s in ds] == epoch
    plain = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)
    assert sorted(int(s["ordinal"]) for s in plain) == sorted(epoch)
    # The loader's own next `for` starts the complete epoch again too.
    assert ordinals(HspackLoader(ds, batch_size=None, num_workers=workers)) == epoch
    # A state saved at the epoch's end still resumes with nothing left.
    state = ds.state_dict()
    resumed = HspackIterableDataset(eagle_path, ["input_ids"], seed=3)
    resumed.load_state_dict(state)
    assert ordinals(HspackLoader(resumed, batch_size=None, num_workers=workers)) == []


def test_a_dataset_rewritten_since_it_was_opened_is_refused_by_a_copy_and_after_close(tmp_path):
    """A dataset pickled into a worker, or closed and used again, opens the folder again:
    rewritten meanwhile (same keys, other values), it read the new values silently, and a
    closed one kept its old lengths (read_concat cut samples short). Refused now; one appended
    to reads on, with the new samples' lengths."""
    import shutil
    from conftest import write_eagle

    path = str(tmp_path / "ds")
    write_eagle(path, 6, shard_samples=3)
    ds = hspack.open(path)
    before = ds[0]["hidden.1"].clone()
    assert len(ds.lengths) == 6
    sent = pickle.dumps(ds)  # what a spawned DataLoader worker gets
    ds.close()
    write_eagle(path, 9, first=6, shard_samples=3)  # appended to: reads on
    assert len(ds) == 9 and len(ds.lengths) == 9 and len(pickle.loads(sent)) == 9
    assert ds.read_concat(8, ["hidden.1", "hidden.3"]).shape[0] == ds.rows_of(8)
    shutil.rmtree(path)
    write_eagle(path, 6, first=3, shard_samples=3)  # rewritten: other samples at ordinal 0
    for reopened in (pickle.loads(sent), ds):
        reopened.close()
        with pytest.raises(hspack.HspackError, match="the dataset changed since this dataset object first opened it") as e:
            reopened[0]
        assert e.value.kind == "Io" and e.value.path == path
    assert torch.equal(before, hspack.open(path)[0]["hidden.1"]) is False


def test_an_index_that_is_no_int_is_refused_not_read_as_another_sample(eagle_path):
    import numpy as np

    ds, hd = hspack.open(eagle_path), HspackDataset(eagle_path)
    # What is an index is taken: a numpy integer, a 0-d integer tensor (a Subset of a
    # randperm gives those), rows as an array.
    order = torch.randperm(len(hd))
    assert torch.equal(torch.utils.data.Subset(hd, order)[0]["input_ids"], hd[int(order[0])]["input_ids"])
    assert torch.equal(ds[np.int64(3)]["input_ids"], ds[torch.tensor(3)]["input_ids"])
    assert ds.read(0, rows=np.array([0, 2]))["input_ids"].shape[0] == 2
    for bad in (True, 2.7, [1, 2]):
        for reader in (ds, hd):
            with pytest.raises(TypeError, match="sample index must be an int"):
                reader[bad]
    with pytest.raises(IndexError, match=r"sample -38 is out of range: the dataset has 37 samples \(0 to 36, or -37 to -1"):
        ds[-38]
    for rows in ((-1, 3), 5, (1, 2, 3), (True, 2)):
        with pytest.raises(hspack.HspackError, match=re.escape(f"option rows of sample 0: {rows!r} must be (start, stop)")):
            ds.read(0, rows=rows)
    with pytest.raises(TypeError, match=r"a sample key is a str, not int; the sample at ordinal i: ds\[i\]"):
        ds.get(3)
    for max_len in (-3, 0, 1.5):
        for view in ("eagle3", None):
            with pytest.raises(hspack.HspackError, match=re.escape(f"option max_len: {max_len!r} must be an int of 1 or more")):
                HspackDataset(eagle_path, view=view, max_len=max_len)


def test_batching_and_ordering_options_are_checked_where_they_are_given(eagle_path):
    """A collate that cuts samples to 0 tokens trained on nothing through a whole epoch (saved
    as consumed); a negative seed, epoch, bucket or multiple failed at the first batch, in a
    worker, in numpy's or torch's words. Each is refused where it is given, naming it."""
    def refused(option, value, make):
        with pytest.raises(hspack.HspackError, match=re.escape(f"option {option}: {value!r} must be an int of")) as e:
            make()
        assert e.value.kind == "BadOption" and e.value.option == option

    for max_len in (0, -1, 2.5):
        refused("max_len", max_len, lambda: PadCollate(max_len=max_len))
        refused("max_len", max_len, lambda: TokenBudgetBatchSampler(HspackDataset(eagle_path), 64, max_len=max_len))
    for multiple in (0, -4):
        refused("pad_to_multiple_of", multiple, lambda: PadCollate(pad_to_multiple_of=multiple))
    refused("seed", -1, lambda: HspackSampler(HspackDataset(eagle_path), seed=-1))
    refused("seed", -1, lambda: HspackIterableDataset(eagle_path, seed=-1))
    sampler = HspackSampler(HspackDataset(eagle_path))
    refused("epoch", -1, lambda: sampler.set_epoch(-1))
    for option in ("bucket_size", "max_tokens"):
        refused(option, 0, lambda: TokenBudgetBatchSampler(HspackDataset(eagle_path), **{"max_tokens": 64, option: 0}))
    refused("block_size", 0, lambda: HspackSampler(HspackDataset(eagle_path), block_size=0))
    # What they allow still batches every sample once.
    collate = PadCollate(max_len=8, pad_to_multiple_of=4)
    batches = [collate([HspackDataset(eagle_path)[i] for i in b]) for b in TokenBudgetBatchSampler(HspackDataset(eagle_path), 64, max_len=8, bucket_size=5, seed=3)]
    assert sorted(int(o) for b in batches for o in b["ordinal"]) == list(range(37))
    assert all(b["input_ids"].shape[1] % 4 == 0 and b["input_ids"].shape[1] <= 8 for b in batches)


def test_a_stacked_field_out_of_layer_order_serves_the_shallowest_layer_first(tmp_path):
    """The EAGLE-3 view hands out the auxiliary states shallowest first, whether they are
    separate fields or one field stacking them: stacked as [30, 2, 16], they came out in that
    order, unlike the same capture stored as separate fields."""
    path = str(tmp_path / "stacked")
    layers, h, t = [30, 2, 16], 4, 3
    schema = [hspack.token_ids(), hspack.hidden_states(layers, h, dtype="f32"), hspack.hidden_state(40, h, point="final_norm", dtype="f32")]
    stacked = torch.stack([torch.full((t, h), float(layer)) for layer in layers], dim=1)
    fields = {f["name"]: f for f in schema}
    name = [n for n, f in fields.items() if f["role"]["kind"] == "hidden_states"][0]
    with hspack.Writer(path, schema, durable=False) as w:
        w.append("a", **{"input_ids": torch.arange(t, dtype=torch.int32), name: stacked, "hidden.40": torch.zeros(t, h)})
    aux = HspackDataset(path, view="eagle3")[0]["aux_hidden_state"]
    assert aux.shape == (t, 3 * h)
    assert aux[0].tolist() == [2.0] * h + [16.0] * h + [30.0] * h


def test_a_missing_shard_fails_only_the_samples_it_holds_in_a_view(eagle_path, tmp_path):
    """The views took a sample's length from every shard's index (`lengths`): one shard gone
    failed every read, of samples in intact shards too."""
    import shutil

    path = str(tmp_path / "ds")
    shutil.copytree(eagle_path, path)
    ds = hspack.open(path)
    last = ds.shards[-1]
    os.remove(os.path.join(path, last["file"]))
    for view in ("eagle3", None):
        hd = HspackDataset(path, view=view, max_len=8)
        assert hd[0]["input_ids" if view is None else "input_ids"].shape[0] == min(8, ds.rows_of(0))
        with pytest.raises(hspack.HspackError, match=last["file"]):
            hd[last["first_ordinal"]]
