"""Stacked-layer fields, file-range transfer from DataLoader workers, and the shared memo of
checked chunks."""

from __future__ import annotations

import gc
import json
import os
import shutil

import numpy as np
import pytest
import torch

import hspack
from hspack.torch import HspackDataset, HspackLoader, HspackSampler, PadCollate, transfer
from hspack.torch.batching import CollateToPinned, Uncollated

H = 16
AUX = [1, 3, 5]


def stacked_sample(i: int) -> dict:
    g = torch.Generator().manual_seed(100 + i)
    t = 4 + (i * 5) % 23
    layers = [torch.randn(t, H, generator=g).to(torch.bfloat16) for _ in AUX]
    return {
        "input_ids": torch.randint(0, 1000, (t,), generator=g, dtype=torch.int32),
        "loss_mask": (torch.rand(t, generator=g) > 0.3).to(torch.uint8),
        "layers": layers,
        "hidden.7": torch.randn(t, H, generator=g).to(torch.bfloat16),
    }


def stacked_schema() -> list:
    return [hspack.token_ids(), hspack.loss_mask(), hspack.hidden_states(AUX, H), hspack.hidden_state(7, H, point="final_norm")]


@pytest.fixture(scope="module")
def stacked_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("stacked") / "ds"
    with hspack.Writer(path, stacked_schema(), durable=False, shard_samples=5) as w:
        for i in range(12):
            s = stacked_sample(i)
            layers = s.pop("layers")
            # Both input shapes: [T, k, H] and the EAGLE-3 concatenation [T, k*H].
            aux = torch.stack(layers, 1) if i % 2 else torch.cat(layers, -1)
            w.append(f"s{i:03d}", aux_hidden_state=aux, **s)
    return str(path)


def test_stacked_fields_take_a_matching_shape(stacked_path, tmp_path):
    # Writers write manifest version 4 (segments), stacked fields or not.
    with open(os.path.join(stacked_path, "manifest.json")) as f:
        assert json.load(f)["version"] == 4
    plain = tmp_path / "plain"
    with hspack.Writer(plain, [hspack.token_ids()], durable=False) as w:
        w.append("a", input_ids=torch.zeros(2, dtype=torch.int32))
    with open(plain / "manifest.json") as f:
        assert json.load(f)["version"] == 4
    with hspack.Writer(tmp_path / "bad", stacked_schema(), durable=False) as w:
        with pytest.raises(hspack.HspackError, match="aux_hidden_state"):
            w.append("x", aux_hidden_state=torch.zeros(3, 2 * H, dtype=torch.bfloat16), input_ids=torch.zeros(3, dtype=torch.int32), loss_mask=torch.zeros(3, dtype=torch.uint8), **{"hidden.7": torch.zeros(3, H, dtype=torch.bfloat16)})


def test_eagle3_view_of_a_stacked_field_is_zero_copy(stacked_path):
    ds = HspackDataset(stacked_path, view="eagle3")
    native = ds.hspack.native
    for i in range(12):
        want = stacked_sample(i)
        got = ds[i]
        assert got["aux_hidden_state"].shape == (len(want["input_ids"]), len(AUX) * H)
        assert torch.equal(got["aux_hidden_state"], torch.cat(want["layers"], -1))
        assert torch.equal(got["hidden_state"], want["hidden.7"])
        seq = next(k for k, (a, n) in enumerate(ds.hspack.shard_ranges) if a <= i < a + n)
        base, size = native.mapping_range(seq)
        ptr = got["aux_hidden_state"].data_ptr()
        assert base <= ptr < base + size, "aux_hidden_state is not a view of the mapped shard"
        # One layer alone is a strided view of the same bytes.
        one = ds.hspack[i]["aux_hidden_state"][:, 1]
        assert torch.equal(one, want["layers"][1])


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_send_mapped_tensors_as_file_ranges(stacked_path, context):
    ref = [stacked_sample(i) for i in range(12)]
    for mode in ("map", "copy"):
        ds = HspackDataset(stacked_path, view="eagle3", transfer=mode)
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=context)
        got = list(loader)
        assert [g["ordinal"] for g in got] == list(range(12))
        for g, want in zip(got, ref):
            assert torch.equal(g["aux_hidden_state"], torch.cat(want["layers"], -1))
            assert torch.equal(g["hidden_state"], want["hidden.7"])
            # Shared memory is torch's copy; a file range arrives as a view of the file's mapping.
            assert g["aux_hidden_state"].is_shared() == (mode == "copy")
            assert g["hidden_state"].is_shared() == (mode == "copy")
        if mode == "map":
            # This process maps each shard once and keeps it: a later epoch receives the same
            # samples as the same bytes, views of the shard file they came from.
            again = list(loader)
            for g, h in zip(got, again):
                assert h["aux_hidden_state"].data_ptr() == g["aux_hidden_state"].data_ptr()
                assert torch.equal(h["aux_hidden_state"], g["aux_hidden_state"])
                path, *_ = transfer.origin(h["hidden_state"])
                assert os.path.basename(path).startswith("shard-") and os.path.dirname(path) == stacked_path


def received(rebuild, args):
    """What `rebuild(*args)` received: the tensor, or the error of an `Unreadable`, raised
    (unpickling never raises: it would hang the DataLoader)."""
    got = rebuild(*args)
    transfer.raise_unreadable(got)
    return got


def test_a_replaced_shard_is_refused_by_name(stacked_path, tmp_path):
    copy = tmp_path / "ds"
    shutil.copytree(stacked_path, copy)
    ds = hspack.open(copy)
    first, last = ds[0]["aux_hidden_state"], ds[len(ds) - 1]["aux_hidden_state"]
    rebuild, args = transfer.reduce_tensor(first)
    assert rebuild is transfer.rebuild
    assert torch.equal(rebuild(*args), first)
    _, last_args = transfer.reduce_tensor(last)
    for name in ("shard-000000.hsp", os.path.basename(last_args[0])):
        shard = copy / name
        shutil.copy(shard, tmp_path / "new")
        os.replace(tmp_path / "new", shard)  # same bytes, another file
    # The file this process mapped when it first received from it is the one the sender
    # read: kept, it still gives the sender's bytes.
    assert torch.equal(rebuild(*args), first)
    # Let go (as when the dataset objects are collected), that file is out of reach.
    transfer.release()
    with pytest.raises(hspack.HspackError, match="shard-000000.hsp.*replaced"):
        received(rebuild, args)
    # A file replaced before this process mapped it is refused, by name.
    with pytest.raises(hspack.HspackError, match=r"shard-00000\d.hsp.*replaced"):
        received(rebuild, last_args)
    # Tensors that are not views of a shard take torch's path.
    assert transfer.reduce_tensor(torch.zeros(3))[0] is not transfer.rebuild


def test_a_shard_replaced_after_it_was_mapped_and_before_it_was_read_is_sent_as_bytes(stacked_path, tmp_path):
    """A sender never names a range of the file at the path now when it read another (the one
    it mapped before it was replaced): the trainer must never get another file's bytes under a
    sample's name. Such a tensor goes as its bytes."""
    copy = tmp_path / "ds"
    shutil.copytree(stacked_path, copy)
    ds = hspack.open(copy)
    ds._mapping_range(0)  # the shard mapped (its index read), no tensor read yet
    shard = copy / "shard-000000.hsp"
    garbage = tmp_path / "new"
    garbage.write_bytes(os.urandom(shard.stat().st_size))
    os.replace(garbage, shard)
    t = ds[0]["aux_hidden_state"]  # read from the file mapped before
    want = hspack.open(stacked_path)[0]["aux_hidden_state"]
    assert torch.equal(t, want)
    transfer.release()
    rebuild, args = transfer.reduce_tensor(t)
    assert rebuild is not transfer.rebuild, "named as a range of the file at the path now"
    assert torch.equal(rebuild(*args), want)


def test_kept_mappings_live_while_a_dataset_object_of_their_folder_does(stacked_path, tmp_path):
    copy = tmp_path / "ds"
    shutil.copytree(stacked_path, copy)
    a, b = HspackDataset(copy, view="eagle3"), HspackDataset(copy, view="eagle3")
    other = HspackDataset(stacked_path, view="eagle3")
    rebuild, args = transfer.reduce_tensor(a[0]["aux_hidden_state"])
    first = rebuild(*args)
    shard = copy / "shard-000000.hsp"
    shutil.copy(shard, tmp_path / "new")
    os.replace(tmp_path / "new", shard)  # only a kept mapping still reaches the old file
    del b, other
    gc.collect()
    assert torch.equal(rebuild(*args), first), "a lives: its folder's files stay mapped"
    del a
    gc.collect()
    with pytest.raises(hspack.HspackError, match="shard-000000.hsp.*replaced"):
        received(rebuild, args)


def test_workers_share_one_memo_of_checked_chunks(stacked_path, tmp_path):
    ds = HspackDataset(stacked_path, view="eagle3")
    memo = ds.checked_memo
    assert memo and os.path.isdir(memo)
    list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))
    flags = b"".join(open(os.path.join(memo, f), "rb").read() for f in sorted(os.listdir(memo)))
    # Every chunk of the dataset was read once, so every flag is set, by whichever worker.
    assert len(flags) > 0 and set(flags) == {1}
    del ds
    gc.collect()
    assert not os.path.exists(memo)


def test_a_copy_of_a_dataset_object_keeps_its_memo_when_the_original_goes(stacked_path):
    """`copy.deepcopy` in the process that made the object: the copy gets a memo of its own,
    so it reads on after the original (and its folder) is collected."""
    import copy

    ds = HspackDataset(stacked_path, view="eagle3")
    twin = copy.deepcopy(ds)
    assert twin.checked_memo != ds.checked_memo and os.path.isdir(twin.checked_memo)
    del ds
    gc.collect()
    assert [twin[i]["ordinal"] for i in range(12)] == list(range(12))


def test_memo_folders_of_killed_processes_are_removed(stacked_path):
    """A memo folder is removed when its object is collected, which a killed process never
    does: the next dataset object made removes those of processes that are gone."""
    import signal
    import subprocess
    import sys

    code = (
        "import os, signal, sys\n"
        "from hspack.torch import HspackDataset\n"
        f"ds = HspackDataset({stacked_path!r}, view='eagle3')\n"
        "ds[0]\n"
        "print(ds.checked_memo, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == -signal.SIGKILL, run.stderr
    left = run.stdout.strip()
    assert os.path.isdir(left) and os.listdir(left)
    ds = HspackDataset(stacked_path, view="eagle3")
    assert not os.path.exists(left) and os.path.isdir(ds.checked_memo)


def test_a_copy_dataset_beside_a_map_dataset_in_one_worker_sends_writable_copies(stacked_path):
    """`transfer` is the dataset's: one with "copy" read by the same worker as one with "map"
    still hands out writable shared-memory copies, not read-only file ranges."""
    mapped = HspackDataset(stacked_path, view="eagle3", transfer="map")
    copied = HspackDataset(stacked_path, view="eagle3", transfer="copy")
    both = torch.utils.data.ConcatDataset([mapped, copied])
    got = list(torch.utils.data.DataLoader(both, batch_size=None, num_workers=1))
    assert len(got) == 24
    for g in got[:12]:
        assert transfer.origin(g["hidden_state"]) is not None
    for g in got[12:]:
        assert transfer.origin(g["hidden_state"]) is None and g["hidden_state"].is_shared()
        g["hidden_state"].add_(1)  # writable: a file range would fault here


class _Gone:
    """Unpickles as `transfer.rebuild` of a shard that is not there."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (transfer.rebuild, (self.path, 0, 1, 2, 64, "bfloat16", 0, (2, 16), (16, 1)))


def test_a_tensor_not_received_in_the_pin_memory_thread_reaches_the_trainer(tmp_path, monkeypatch):
    """Torch's pin-memory thread unpickles what workers send outside its error handling: a
    file range that cannot be mapped there (the shard deleted since) comes out as a value
    whose pinning raises the error, which torch's loop hands to the trainer as a worker's
    error, rather than ending the thread with the error lost. Elsewhere (the main thread,
    another thread of the trainer) it comes out as the same value, whose first use raises:
    raised while unpickling, it would lose the batch's place in the DataLoader."""
    import multiprocessing
    import queue
    import threading

    from torch.utils.data._utils.pin_memory import _pin_memory_loop

    gone = str(tmp_path / "shard-000000.hsp")
    got = pickle_roundtrip(_Gone(gone))
    with pytest.raises(hspack.HspackError, match="shard-000000.hsp"):
        got.sum()
    with pytest.raises(hspack.HspackError, match="shard-000000.hsp"):
        transfer.raise_unreadable({"hidden_state": got})
    raised = []
    other = threading.Thread(target=lambda: raised.append(pytest.raises(hspack.HspackError, lambda: pickle_roundtrip(_Gone(gone)).sum())))
    other.start()
    other.join()
    assert raised
    # The loop itself, on this machine's CPU (it sets the accelerator's device first).
    monkeypatch.setattr(torch.accelerator, "set_device_index", lambda index: None)
    into, out, done = multiprocessing.Queue(), queue.Queue(), threading.Event()
    into.put((0, {"hidden_state": _Gone(gone)}))
    loop = threading.Thread(target=_pin_memory_loop, args=(into, out, 0, done, "cpu"), daemon=True)
    loop.start()
    try:
        index, got = out.get(timeout=60)
    finally:
        done.set()
    assert index == 0 and "shard-000000.hsp" in got.exc_msg, got
    with pytest.raises(hspack.HspackError, match="shard-000000.hsp"):
        got.reraise()


def test_a_damaged_chunk_raises_in_a_worker_every_epoch(stacked_path, tmp_path):
    copy = tmp_path / "ds"
    shutil.copytree(stacked_path, copy)
    shard = copy / "shard-000000.hsp"
    probe = hspack.open(copy, check="never")
    base, _ = probe.native.mapping_range(0)
    at = probe[3]["aux_hidden_state"].data_ptr() - base  # sample 3's aux payload in the file
    del probe
    data = bytearray(shard.read_bytes())
    data[at + 5] ^= 0xFF
    shard.write_bytes(bytes(data))
    ds = HspackDataset(copy, view="eagle3")
    for _ in range(2):
        with pytest.raises(hspack.HspackError, match="shard-000000.hsp"):
            list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))




@pytest.mark.parametrize("mode", ["hint", "load"])
def test_readahead_modes_read_the_same_data(tmp_path, mode):
    """`readahead` is kept as given, both modes return the written values, and an unknown
    mode is refused. (How many pages a mode brings in depends on the kernel: not tested.)"""
    path = tmp_path / "ds"
    rows, width = 1024, 1024
    with hspack.Writer(path, [hspack.token_ids(), hspack.hidden_states([1, 2, 3], width)], durable=False) as w:
        for i in range(2):
            w.append(f"s{i}", input_ids=torch.arange(rows, dtype=torch.int32), aux_hidden_state=torch.full((rows, 3, width), float(i), dtype=torch.bfloat16))
    ds = hspack.open(path, check="never", readahead=mode)
    assert ds.readahead == mode
    got = ds.read(1)
    assert torch.equal(got["input_ids"], torch.arange(rows, dtype=torch.int32))
    assert torch.equal(got["aux_hidden_state"], torch.ones(rows, 3, width, dtype=torch.bfloat16))
    with pytest.raises(hspack.HspackError, match="readahead"):
        hspack.open(path, readahead="eager")
    with pytest.raises(hspack.HspackError, match="readahead"):
        ds.readahead = "eager"

def pick_readahead(ds, ordinal):
    return {"readahead": ds.readahead, "ordinal": ordinal}


@pytest.mark.parametrize("mode", ["map", "copy"])
def test_workers_that_send_file_ranges_load_each_sample_themselves(stacked_path, mode):
    """Under `transfer="map"` the trainer maps what a worker read: the worker loads the pages
    (readahead="load"), so cold reads run in the workers; the trainer's own dataset hints."""
    ds = HspackDataset(stacked_path, view=pick_readahead, transfer=mode)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    seen = {s["readahead"] for s in loader}
    assert seen == ({"load"} if mode == "map" else {"hint"})
    assert ds.hspack.readahead == "hint"
    assert pickle_roundtrip(ds.hspack).readahead == "hint"


def pickle_roundtrip(obj):
    import pickle

    return pickle.loads(pickle.dumps(obj))


def test_every_dataset_in_a_worker_loads_its_samples(stacked_path):
    """Two hspack datasets read by the same workers: both switch to readahead="load"."""
    a = HspackDataset(stacked_path, view=pick_readahead)
    b = HspackDataset(stacked_path, view=pick_readahead)
    loader = torch.utils.data.DataLoader(torch.utils.data.ConcatDataset([a, b]), batch_size=None, num_workers=2)
    assert {s["readahead"] for s in loader} == {"load"}


def batches_of(ds, size):
    order = list(HspackSampler(ds, shuffle=False))
    return [order[i : i + size] for i in range(0, len(order), size)]


def assert_same_batch(got, want):
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert torch.equal(got[k], v) if torch.is_tensor(v) else got[k] == v, k


def test_batches_to_pin_come_from_workers_uncollated_with_nothing_copied(stacked_path):
    ds = HspackDataset(stacked_path, view="eagle3")
    collate = PadCollate()
    want = [collate([ds[i] for i in b]) for b in batches_of(ds, 5)]
    to_pin = CollateToPinned(collate)
    to_pin.pin = True  # as on a machine with an accelerator, here too
    loader = torch.utils.data.DataLoader(ds, batch_size=5, sampler=HspackSampler(ds, shuffle=False), num_workers=2, collate_fn=to_pin)
    got = list(loader)
    assert len(got) == len(want) == 3
    for pending, w in zip(got, want):
        assert isinstance(pending, Uncollated)
        for s in pending.samples:
            # Views of the shards, sent as file ranges: the worker copied no hidden state.
            for k in ("aux_hidden_state", "hidden_state"):
                assert not s[k].is_shared() and transfer.origin(s[k]) is not None
        assert_same_batch(pending.collated(), w)
        # A plain DataLoader that did not pin hands it on as it came: it reads as the batch.
        assert_same_batch(pending, w)
        assert pending["aux_hidden_state"] is pending.collated()["aux_hidden_state"]
    # A loader that ends up not pinning still hands out collated batches.
    plain = HspackLoader(ds, batch_size=5, sampler=HspackSampler(ds, shuffle=False), num_workers=2, collate_fn=to_pin)
    for g, w in zip(plain, want):
        assert_same_batch(g, w)


@pytest.mark.parametrize("workers", [0, 2])
def test_collate_to_pinned_in_a_plain_dataloader_gives_batches_with_or_without_an_accelerator(stacked_path, workers):
    """As the README shows it: `DataLoader(..., pin_memory=True, collate_fn=CollateToPinned(
    PadCollate()))`. Without an accelerator torch pins nothing: batches were `Uncollated`
    objects (workers) or failed to pin (no workers)."""
    ds = HspackDataset(stacked_path, view="eagle3")
    collate = PadCollate()
    want = [collate([ds[i] for i in b]) for b in batches_of(ds, 5)]
    loader = torch.utils.data.DataLoader(ds, batch_size=5, sampler=HspackSampler(ds, shuffle=False), num_workers=workers,
                                         pin_memory=True, collate_fn=CollateToPinned(collate))
    got = list(loader)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert isinstance(g, dict), type(g)
        assert_same_batch(g, w)


def test_padding_on_the_pool_equals_torch_padding():
    from hspack.torch.batching import _pad_on_the_pool

    g = torch.Generator().manual_seed(3)
    big = torch.randn(3000, 96, generator=g).to(torch.bfloat16)  # over 1 MiB a batch: the pool
    strided = torch.randn(96, 7, generator=g).to(torch.bfloat16).t()  # torch copies it
    rows = [big[:2500], big[100:900], big[:0], strided, big[5:6]]
    batch = torch.full((len(rows), 2500, 96), 7.0, dtype=torch.bfloat16)
    _pad_on_the_pool(batch, rows)
    for b, r in enumerate(rows):
        assert torch.equal(batch[b, : len(r)], r)
        assert not batch[b, len(r) :].any()
    with pytest.raises(RuntimeError):  # a row of another width is refused, never smeared
        _pad_on_the_pool(torch.empty(1, 4, 96, dtype=torch.bfloat16), [torch.zeros(4, 95, dtype=torch.bfloat16)])
    with pytest.raises(hspack.HspackError, match="overlap"):
        hspack._hspack.gather_into(np.zeros(8, np.uint8), [(0, np.ones(6, np.uint8)), (4, np.ones(2, np.uint8))], [])
    out = np.zeros(8, np.uint8)
    with pytest.raises(hspack.HspackError, match="shares memory"):
        hspack._hspack.gather_into(out, [(0, out[4:])], [])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here: pinned memory needs one (run on a GPU machine, see benches/README-cuda.md)")
@pytest.mark.parametrize("workers", [0, 2])
def test_pinned_batches_are_collated_into_pinned_memory(stacked_path, workers):
    ds = HspackDataset(stacked_path, view="eagle3")
    want = [PadCollate()([ds[i] for i in b]) for b in batches_of(ds, 5)]
    loader = HspackLoader(ds, batch_size=5, sampler=HspackSampler(ds, shuffle=False), num_workers=workers, pin_memory=True)
    assert isinstance(loader.collate_fn, CollateToPinned)
    got = list(loader)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_same_batch(g, w)
        for k, v in g.items():
            assert not torch.is_tensor(v) or v.is_pinned(), k
        on_gpu = g["aux_hidden_state"].cuda(non_blocking=True)
        torch.cuda.synchronize()
        assert torch.equal(on_gpu.cpu(), w["aux_hidden_state"])


@pytest.fixture(scope="module")
def layers_path(tmp_path_factory):
    """The samples of `stacked_path` as captures write them: one field per layer."""
    path = tmp_path_factory.mktemp("layers") / "ds"
    schema = [hspack.token_ids(), hspack.loss_mask()] + [hspack.hidden_state(layer, H) for layer in AUX]
    schema.append(hspack.hidden_state(7, H, point="final_norm"))
    with hspack.Writer(path, schema, durable=False, shard_samples=5) as w:
        for i in range(12):
            s = stacked_sample(i)
            layers = s.pop("layers")
            w.append(f"s{i:03d}", **s, **{f"hidden.{layer}": x for layer, x in zip(AUX, layers)})
    return str(path)


def lent_region(t: torch.Tensor) -> int:
    """The inode of the worker's shared memory that `t` lies in, as this process maps it."""
    addr = t.untyped_storage().data_ptr()
    with open("/proc/self/maps") as f:
        for line in f:
            span, _, _, _, inode, *name = line.split()
            lo, hi = (int(x, 16) for x in span.split("-"))
            if lo <= addr < hi:
                assert " ".join(name).startswith("/memfd:hspack-loan"), line
                return int(inode)
    raise AssertionError("not mapped")


def test_samples_built_in_workers_are_lent_and_reused_only_once_dropped(layers_path):
    ref = [torch.cat(stacked_sample(i)["layers"], -1) for i in range(12)]
    ds = HspackDataset(layers_path, view="eagle3")
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, prefetch_factor=2, persistent_workers=True)
    # Every sample of 3 epochs kept: none is overwritten, each has memory of its own.
    held = []
    for _ in range(3):
        for g in loader:
            assert torch.equal(g["aux_hidden_state"], ref[g["ordinal"]])
            held.append((g["ordinal"], g["aux_hidden_state"]))
    assert len({lent_region(t) for _, t in held}) == len(held) == 36
    for i, t in held:
        assert torch.equal(t, ref[i]), f"sample {i} changed while this process held it"
    held[0][1].zero_()  # this process's to write while it holds it
    del held, t
    gc.collect()
    # Each sample dropped as the next arrives: the workers reuse their memory. A worker has at
    # most 2 samples queued, 1 being built and 1 in this process (received, or being dropped).
    regions = []
    for _ in range(3):
        for g in loader:
            assert torch.equal(g["aux_hidden_state"], ref[g["ordinal"]])
            regions.append(lent_region(g["aux_hidden_state"]))
    assert len(regions) == 36 and len(set(regions)) <= 2 * 4, len(set(regions))


def test_a_forked_child_dropping_a_lent_sample_leaves_it_lent_to_the_parent(layers_path):
    """A trainer forks holding a sample (a `multiprocessing` helper, an evaluation process): the
    child's copy, collected there, must not end the loan, or the worker would build later
    samples in the memory the trainer still reads."""
    ref = [torch.cat(stacked_sample(i)["layers"], -1) for i in range(12)]
    ds = HspackDataset(layers_path, view="eagle3")
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, prefetch_factor=2, persistent_workers=True)
    it = iter(loader)
    g = next(it)
    i, held = g["ordinal"], g["aux_hidden_state"]
    region = lent_region(held)
    del g
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            del held
            gc.collect()
            code = 0
        finally:
            os._exit(code)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    later = [(g["ordinal"], lent_region(g["aux_hidden_state"])) for g in it]
    for _ in range(3):
        later += [(g["ordinal"], lent_region(g["aux_hidden_state"])) for g in loader]
    assert len(later) == 11 + 36
    assert all(r != region for _, r in later), "a worker reused memory this process holds"
    assert torch.equal(held, ref[i]), "the sample held changed"
    del held
    gc.collect()
    # Once this process drops it, the worker reuses it.
    assert region in {lent_region(g["aux_hidden_state"]) for _ in range(2) for g in loader}


def test_lent_samples_arrive_through_spawned_workers_and_without_the_file_ranges(layers_path):
    ref = [torch.cat(stacked_sample(i)["layers"], -1) for i in range(12)]
    for mode, context in (("map", "spawn"), ("copy", "fork")):
        ds = HspackDataset(layers_path, view="eagle3", transfer=mode)
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=context)
        got = list(loader)
        assert [g["ordinal"] for g in got] == list(range(12))
        for g in got:
            assert torch.equal(g["aux_hidden_state"], ref[g["ordinal"]])
            # Lent memory comes with the file ranges; without them, torch's own shared memory.
            assert g["aux_hidden_state"].is_shared() == (mode == "copy")


def test_batches_collated_in_workers_stay_intact_while_held(layers_path):
    ds = HspackDataset(layers_path, view="eagle3")
    want = [PadCollate()([ds[i] for i in b]) for b in batches_of(ds, 5)]
    loader = HspackLoader(ds, batch_size=5, sampler=HspackSampler(ds, shuffle=False), num_workers=2, persistent_workers=True)
    held = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        held += list(loader)
    assert len(held) == 3 * len(want)
    for i, got in enumerate(held):
        assert_same_batch(got, want[i % len(want)])
    # Every padded tensor of every batch came in memory a worker lent, none shared by two.
    regions = [lent_region(t) for b in held for t in b.values() if torch.is_tensor(t) and t.dim() >= 2]
    assert len(regions) == 3 * len(want) * 5  # input_ids, loss_mask, attention_mask, the states
    assert len(set(regions)) == len(regions)


def test_a_shard_replaced_while_workers_send_it_raises_and_never_hangs(tmp_path):
    """A tensor whose file was replaced after a worker sent it cannot be received: the loader
    raises the error naming the shard, before the sample counts as consumed (the next
    iteration starts with it), and a plain DataLoader hands on the sample, whose first use
    raises; neither waits forever for a batch whose place an unpickling error lost."""
    path = tmp_path / "ds"
    with hspack.Writer(path, stacked_schema(), shard_samples=6, durable=False) as w:
        for i in range(18):
            s = stacked_sample(i)
            w.append(f"s{i:03d}", input_ids=s["input_ids"], loss_mask=s["loss_mask"], aux_hidden_state=torch.cat(s["layers"], -1), **{"hidden.7": s["hidden.7"]})
    # The second run reads a copy: the trainer keeps the files it mapped for the first.
    again = tmp_path / "again"
    shutil.copytree(path, again)

    class Replacing:
        """The view `hidden.7`, which replaces shard 1 by a copy of itself (same bytes, another
        file) once, right after reading the first sample of it."""

        def __init__(self, at):
            self.at = at

        def __call__(self, ds, i):
            out = ds.read(i, ["hidden.7"])
            out["ordinal"] = i
            flag = self.at / ".replaced"
            if i == 6 and not flag.exists():
                flag.touch()
                shard = self.at / "shard-000001.hsp"
                shutil.copy(shard, self.at / ".new")
                os.replace(self.at / ".new", shard)
            return out

    ds = HspackDataset(path, view=Replacing(path))
    # A plain DataLoader: every sample comes, the unreceivable ones raising on use.
    got, failed = [], []
    # One worker: it reads shard 1 (and maps it) before it replaces it, so every sample of that
    # shard it sends names the file gone (with two, the trainer could map the old file first
    # through the other's samples, received out of order).
    for item in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1, timeout=60):
        try:
            item["hidden.7"].sum()
            got.append(item["ordinal"])
        except hspack.HspackError as e:
            assert "shard-000001.hsp" in str(e) and "replaced" in str(e), e
            failed.append(item["ordinal"])
    assert failed and sorted(got + failed) == list(range(18)), (got, failed)
    assert failed == list(range(6, 12)), failed
    # HspackLoader raises it before the sample counts.
    ds = HspackDataset(again, view=Replacing(again))
    loader = HspackLoader(ds, batch_size=None, sampler=HspackSampler(ds, shuffle=False), num_workers=1, timeout=60)
    seen = []
    with pytest.raises(hspack.HspackError, match="shard-000001.hsp.*replaced"):
        for item in loader:
            seen.append(item["ordinal"])
    assert seen == list(range(len(seen))) and loader.state_dict()["consumed"] == len(seen)
