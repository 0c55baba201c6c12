"""A store's datasets, as Python sees them: written with `hspack.Writer` into `STORE/NAME`,
read with `hspack.open`, the same tensors as written; the same samples written again under
another name store (almost) nothing new."""

from __future__ import annotations

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
