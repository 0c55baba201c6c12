"""A store's datasets, as Python sees them: written with `hspack.Writer` into `STORE/NAME`,
read with `hspack.open`, the same tensors as written; the same samples written again under
another name store (almost) nothing new."""

from __future__ import annotations

import pytest
import torch

import hspack
from conftest import write_eagle


def test_writer_into_a_store_and_reads_back(tmp_path):
    store = tmp_path / "store"
    hspack.init_store(store)
    write_eagle(store / "a", 12)
    write_eagle(tmp_path / "plain", 12)
    ds, plain = hspack.open(store / "a"), hspack.open(tmp_path / "plain")
    assert len(ds) == len(plain) == 12
    for i in range(12):
        got, want = ds[i], plain[i]
        assert got.keys() == want.keys()
        for name in want:
            assert torch.equal(got[name].view(torch.uint8), want[name].view(torch.uint8)), (i, name)


def packs_bytes(store):
    return sum(f.stat().st_size for f in (store / "packs").iterdir())


def test_samples_written_again_store_only_their_headers(tmp_path):
    store = tmp_path / "store"
    hspack.init_store(store)
    schema = [hspack.token_ids(), hspack.hidden_state(2, 4096, dtype="bf16")]
    g = torch.Generator().manual_seed(3)
    samples = [
        {"input_ids": torch.randint(0, 1000, (n,), generator=g, dtype=torch.int32),
         "hidden.2": torch.randn(n, 4096, generator=g).to(torch.bfloat16)}
        for n in (64, 200, 31, 128)
    ]
    for name in ("first", "second"):
        with hspack.Writer(store / name, schema, durable=False) as w:
            for i, s in enumerate(samples):
                w.append(f"s{i}", **s)
        if name == "first":
            before = packs_bytes(store)
    added = packs_bytes(store) - before
    assert added < 0.02 * before, (before, added)
    again = hspack.open(store / "second")
    for i, s in enumerate(samples):
        assert torch.equal(again[i]["hidden.2"].view(torch.int16), s["hidden.2"].view(torch.int16))


def test_torch_datasets_read_a_store_dataset_in_worker_processes(tmp_path):
    """The hspack.torch datasets and loaders over `STORE/NAME`, with workers (whose tensors
    travel as file ranges of the mapped packs), give exactly the written samples."""
    from conftest import LAYERS, eagle_sample
    from hspack.torch import HspackDataset, HspackIterableDataset, HspackLoader, PadCollate

    store = tmp_path / "store"
    hspack.init_store(store)
    write_eagle(store / "eagle", 21, shard_samples=8)
    path = str(store / "eagle")
    seen = []
    for context in ("fork", "spawn"):
        ds = HspackIterableDataset(path, ["input_ids", "hidden.5"], seed=2)
        loader = HspackLoader(ds, batch_size=4, num_workers=2, multiprocessing_context=context, collate_fn=PadCollate())
        for batch in loader:
            for b, o in enumerate(batch["ordinal"].tolist()):
                n = int(batch["lengths"][b])
                assert torch.equal(batch["hidden.5"][b, :n], eagle_sample(o)["hidden.5"])
                seen.append(o)
    assert sorted(seen) == sorted(list(range(21)) * 2)
    mapped = HspackDataset(path, view="eagle3")
    loader = torch.utils.data.DataLoader(mapped, batch_size=None, num_workers=2)
    for s in loader:
        w = eagle_sample(s["ordinal"])
        want = torch.cat([w[f"hidden.{layer}"] for layer in LAYERS], dim=-1)
        assert torch.equal(s["aux_hidden_state"], want)
        assert torch.equal(s["hidden_state"], w["hidden.7"])


def test_a_failed_commit_forgets_the_capture_records_of_its_samples(tmp_path):
    """Samples of a failed commit (the store's dataset file cannot be replaced) are not in
    the dataset: the writer stops (every later call says which samples were lost), and the
    writer opened again commits other samples, and records its own captures (a commit failed
    on the stale records before)."""
    from conftest import eagle_sample, eagle_schema

    store = tmp_path / "store"
    hspack.init_store(store)
    config = {"model": "m", "revision": None, "config_hash": None, "engine": "transformers", "deterministic": True,
              "dtype": "bf16", "layers": [3], "fields": [f["name"] for f in eagle_schema()]}
    w = hspack.Writer(store / "d", eagle_schema(), durable=False)
    w.append("s0", capture_key=hspack.capture_key(config, [0]), **eagle_sample(0))
    w.commit()
    blocker = store / "datasets" / "d.json.tmp"
    blocker.mkdir()
    w.append("s1", capture_key=hspack.capture_key(config, [1]), **eagle_sample(1))
    try:
        w.commit()
        raise AssertionError("the commit landed over the blocker")
    except hspack.HspackError:
        pass
    blocker.rmdir()
    try:
        w.append("s2", capture_key=hspack.capture_key(config, [2]), **eagle_sample(2))
        raise AssertionError("a stopped writer took a sample")
    except hspack.HspackError as e:
        assert "`s1` to `s1`" in str(e), e
    w.abort()
    w = hspack.Writer(store / "d", eagle_schema(), durable=False)
    w.append("s2", capture_key=hspack.capture_key(config, [2]), **eagle_sample(2))
    w.finish()
    assert hspack.open(store / "d").keys() == ["s0", "s2"]
    # The captures recorded are those of s0 and s2, not of s1, whose commit failed.
    other = hspack.Writer(store / "x", eagle_schema(), durable=False)
    done, stale = other.reuse_captured([(f"c{i}", hspack.capture_key(config, [i])) for i in range(3)])
    assert (done, stale) == ([True, False, True], 0)
    # A key held already, or given twice, is refused before any sample is appended: refused
    # part way, the samples before it were appended, their captures unrecorded, unsaid.
    for items in ([("new0", 0), ("c0", 2)], [("new0", 0), ("new0", 2)]):
        with pytest.raises(hspack.HspackError, match="`c0` is already in the dataset|given twice") as e:
            other.reuse_captured([(k, hspack.capture_key(config, [i])) for k, i in items])
        assert e.value.key == items[-1][0]
        assert not other.contains("new0")
    other.abort()


def test_a_forked_child_keeps_no_lock_of_a_store_dataset(tmp_path):
    """A process forked while a writer of `STORE/NAME` is open (a DataLoader worker, say)
    shares the lock file's open descriptor: once the parent's writer finishes, the next writer
    takes the dataset at once, while the child lives on."""
    import os

    from conftest import eagle_sample, eagle_schema

    store = tmp_path / "store"
    hspack.init_store(store)
    w = hspack.Writer(store / "d", eagle_schema(), durable=False)
    w.append("s0", **eagle_sample(0))
    done, told = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(told)
        os.read(done, 1)  # returns once the parent closes its end
        os._exit(0)
    os.close(done)
    try:
        w.finish()
        again = hspack.Writer(store / "d", eagle_schema(), durable=False)
        again.append("s1", **eagle_sample(1))
        again.finish()
    finally:
        os.close(told)
        os.waitpid(pid, 0)
    assert hspack.open(store / "d").keys() == ["s0", "s1"]
