"""The local block cache of datasets in S3 (`cache_dir`), against a real S3-compatible server
(moto, started by `test_object_storage`'s fixture): a second open reads only the folder and
returns the same tensors, DataLoader workers share the folder and see every sample once."""

from __future__ import annotations

import pytest
import torch

import hspack
from hspack.torch import HspackDataset, HspackIterableDataset, HspackLoader
from test_object_storage import s3  # noqa: F401 (the fixture)

H = 1024
N = 24


def sample(i: int) -> dict:
    g = torch.Generator().manual_seed(i)
    t = 150 + (i * 37) % 200
    return {
        "input_ids": torch.randint(0, 1000, (t,), generator=g, dtype=torch.int32),
        "hidden.3": torch.randn(t, H, generator=g).to(torch.bfloat16),
    }


@pytest.fixture(scope="module")
def big(s3, tmp_path_factory):  # noqa: F811
    """24 samples of ~500 KiB in 3 shards of a few MiB, written locally and copied to S3."""
    local = tmp_path_factory.mktemp("cachesrc") / "ds"
    with hspack.Writer(local, [hspack.token_ids(), hspack.hidden_state(3, H)], shard_samples=8, durable=False) as w:
        for i in range(N):
            w.append(f"s{i:04d}", **sample(i))
    report = hspack.copy(local, f"{s3}/cached")
    assert report["shards_sent"] == 3 and report["manifest_published"]
    return str(local), f"{s3}/cached"


def read_all(ds) -> None:
    for i in range(N):
        got = ds[i]
        want = sample(i)
        for name in want:
            assert torch.equal(got[name], want[name]), (i, name)


def test_a_second_open_reads_only_the_folder(big, tmp_path):
    local, url = big
    cache = tmp_path / "cache"
    first = hspack.open(url, cache_dir=cache, check="always")
    read_all(first)
    s1 = first.cache_stats()
    assert s1["misses"] > 0 and s1["fetched_bytes"] > 0 and s1["failed_writes"] == 0, s1
    blocks = list(cache.glob("*.blk"))
    assert len(blocks) == s1["misses"]

    second = hspack.open(url, cache_dir=cache, check="always")
    read_all(second)
    s2 = second.cache_stats()
    assert (s2["misses"], s2["fetches"], s2["fetched_bytes"]) == (0, 0, 0), s2
    assert s2["hits"] >= s1["misses"] and s2["served_bytes"] > 0, s2

    # A damaged block is fetched again, and the tensors are still right.
    damaged = max(blocks, key=lambda p: p.stat().st_size)
    raw = bytearray(damaged.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    damaged.write_bytes(bytes(raw))
    third = hspack.open(url, cache_dir=cache, check="always")
    read_all(third)
    s3 = third.cache_stats()
    assert (s3["damaged"], s3["misses"]) == (1, 1), s3

    assert hspack.open(url).cache_stats() is None
    assert hspack.open(local, cache_dir=tmp_path / "unused").cache_stats()["misses"] == 0
    assert not (tmp_path / "unused").exists()


def test_a_small_bound_keeps_the_folder_small(big, tmp_path):
    _, url = big
    cache = tmp_path / "cache"
    bound = 5 << 20
    ds = hspack.open(url, cache_dir=cache, cache_bytes=bound)
    read_all(ds)
    assert ds.cache_stats()["evicted"] > 0
    assert sum(p.stat().st_size for p in cache.glob("*.blk")) <= bound


def test_cache_bytes_needs_cache_dir(big):
    _, url = big
    with pytest.raises(hspack.HspackError, match="cache_dir"):
        hspack.open(url, cache_bytes=1 << 30)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_share_the_folder(big, tmp_path, context):
    _, url = big
    cache = tmp_path / "cache"
    ds = HspackIterableDataset(url, ["input_ids", "hidden.3"], seed=3, cache_dir=cache)
    loader = HspackLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=context)
    seen = []
    for s in loader:
        o = s["ordinal"]
        assert torch.equal(s["hidden.3"], sample(o)["hidden.3"])
        seen.append(o)
    assert sorted(seen) == list(range(N))
    assert list(cache.glob("*.blk")), "the workers filled the folder"

    # Everything the workers read is in the folder now: a map-style pass fetches nothing.
    mapped = HspackDataset(url, cache_dir=cache)
    loader = torch.utils.data.DataLoader(mapped, batch_size=None, num_workers=2, multiprocessing_context=context)
    assert [s["ordinal"] for s in loader] == list(range(N))
    after = hspack.open(url, cache_dir=cache)
    read_all(after)
    assert after.cache_stats()["misses"] == 0, after.cache_stats()


def test_cache_options_that_name_no_cache_are_refused_naming_the_option(eagle_path):
    """An empty cache_dir cached into the folder the process ran in, past any bound (no
    eviction listed it); a negative cache_bytes raised a bare OverflowError."""
    with pytest.raises(hspack.HspackError, match="option cache_dir: an empty path") as e:
        hspack.open(eagle_path, cache_dir="")[0]
    assert e.value.option == "cache_dir"
    for bad in (-1, 2**64, 1.5):
        with pytest.raises(hspack.HspackError, match="option cache_bytes: .* must be a count of bytes") as e:
            hspack.open(eagle_path, cache_dir="c", cache_bytes=bad)[0]
        assert e.value.option == "cache_bytes"

