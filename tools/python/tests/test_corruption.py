"""A damaged payload raises an error naming shard, key and field; it is never replaced."""

from __future__ import annotations

import os
import shutil

import pytest

import hspack
from conftest import eagle_sample


@pytest.fixture()
def damaged(eagle_path, tmp_path):
    """A copy of the dataset with one byte flipped inside sample 15's `hidden.3` payload."""
    path = tmp_path / "ds"
    shutil.copytree(eagle_path, path)
    ds = hspack.open(path)
    t = ds[15]["hidden.3"]
    seq = next(i for i, (first, n) in enumerate(ds.shard_ranges) if first <= 15 < first + n)
    start, _ = ds._mapping_range(seq)
    offset = t.data_ptr() - start + 5
    shard = os.path.join(path, ds.shards[seq]["file"])
    del t, ds
    with open(shard, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))
    return str(path), shard


def test_damaged_chunk_raises_with_context(damaged):
    path, shard = damaged
    ds = hspack.open(path)
    with pytest.raises(hspack.HspackError) as e:
        ds[15]
    err = e.value
    assert err.kind == "ChecksumMismatch"
    assert err.shard == shard
    assert (err.key, err.ordinal, err.field) == ("s0015", 15, "hidden.3")
    assert err.rows[0] == 0
    assert "s0015" in str(err) and "hidden.3" in str(err)
    # Other samples still read.
    assert ds[14]["input_ids"].shape[0] == eagle_sample(14)["input_ids"].shape[0]
    # And the damaged one keeps failing under check="always".
    always = hspack.open(path, check="always")
    for _ in range(2):
        with pytest.raises(hspack.HspackError):
            always[15]


def test_check_never_returns_the_bytes_as_stored(damaged):
    path, _ = damaged
    got = hspack.open(path, check="never")[15]["hidden.3"]
    assert not got.equal(eagle_sample(15)["hidden.3"])  # damaged bytes, documented


def test_verify_names_the_damage(damaged):
    path, shard = damaged
    r = hspack.verify(path)
    assert not r["ok"] and r["digest"] is None  # no digest stands for damaged bytes
    assert hspack.verify(path, quick=True)["digest"] is None  # nor for bytes not hashed
    [p] = r["problems"]
    assert isinstance(p, hspack.HspackError)
    assert (p.kind, p.shard, p.key, p.field) == ("ChecksumMismatch", shard, "s0015", "hidden.3")


def test_a_manifest_claiming_huge_shards_is_an_error_not_an_abort(tmp_path):
    """Shards that claim 2^40 samples each (a crafted manifest): listing keys or lengths is
    an error naming a shard, never an allocation sized by the claim."""
    import json
    from pathlib import Path

    golden = Path(__file__).resolve().parents[3] / "format-spec/golden/v3/leased/manifest.json"
    m = json.loads(golden.read_text())
    claim = 1 << 40
    m["shards"] = [dict(m["shards"][0], file=f"shard-{seq:06d}.hsp", seq=seq, first_ordinal=seq * claim, samples=claim) for seq in range(9)]
    m["samples"] = 9 * claim
    m["samples_table"] = None
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    ds = hspack.open(tmp_path)
    with pytest.raises(hspack.HspackError, match="shard-000000.hsp"):
        ds.keys()
    with pytest.raises(hspack.HspackError, match="shard-000000.hsp"):
        ds.lengths


class _Claims:
    """An object that claims to be an array at an address it does not own."""

    __array_interface__ = {"data": (8, False), "shape": (1 << 20,), "typestr": "|u1", "version": 3}


def test_an_object_claiming_an_array_it_does_not_hold_is_refused(eagle_path, tmp_path):
    """The native calls that borrow array memory take numpy's own arrays only: an object whose
    `__array_interface__` names memory it does not hold is an error, never a read or write
    of that memory."""
    import numpy as np

    from hspack import _hspack

    ds = hspack.open(eagle_path)
    with pytest.raises(hspack.HspackError) as e:
        ds.native.read_concat_into(0, ["hidden.3"], (0, 1), _Claims())
    assert "numpy array" in str(e.value), e.value
    with pytest.raises(hspack.HspackError) as e:
        _hspack.gather_into(_Claims(), [(0, np.zeros(4, np.uint8))], [])
    assert "numpy array" in str(e.value), e.value
    w = hspack.Writer(tmp_path / "ds", [hspack.hidden_state(2, 4)])
    with pytest.raises(hspack.HspackError) as e:
        w._native.append("k", [("hidden.2", _Claims())], None)
    assert "numpy array" in str(e.value), e.value
    w.abort()
