"""Datasets in S3, against a real S3-compatible server (moto, started here): a local dataset
copied up and down keeps its digest, `hspack.open("s3://...")` returns the same tensors, a
PyTorch DataLoader with worker processes over the URL sees every sample once, and a
deduplicating store in S3 skips captures it holds."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import hspack
from conftest import H, eagle_sample, eagle_schema, write_eagle
from hspack.torch import HspackDataset, HspackIterableDataset, HspackLoader


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(port: int, process: subprocess.Popen, what: str) -> None:
    """Returns once `process` listens on `port` of 127.0.0.1 (30 s at most)."""
    deadline = time.time() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert process.poll() is None, f"{what} exited"
            assert time.time() < deadline, f"{what} did not listen within 30 s"
            time.sleep(0.1)


@pytest.fixture(scope="module")
def s3():
    """A moto server on 127.0.0.1 with bucket `hspack-test`; the AWS variables point at it."""
    try:
        import boto3  # moto's own dependency
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("NOT RUN: needs moto[server] (pip install 'moto[server]')")
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    _wait_listening(port, server, "moto.server (pip install 'moto[server]')")
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_REGION": "us-east-1",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="hspack-test")
    yield "s3://hspack-test"
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    server.terminate()
    server.wait()


@pytest.fixture(scope="module")
def remote(s3, tmp_path_factory):
    """37 samples in 3 shards, written locally and copied to S3."""
    local = tmp_path_factory.mktemp("s3src") / "ds"
    write_eagle(local, 37, shard_samples=13)
    report = hspack.copy(local, f"{s3}/eagle")
    assert report["shards_sent"] == 3 and report["manifest_published"]
    assert report["chunks_checked"] > 0 and report["bytes_reread"] > 0
    return str(local), f"{s3}/eagle"


def test_a_copy_up_and_back_keeps_the_digest(remote, tmp_path):
    local, url = remote
    back = tmp_path / "back"
    report = hspack.copy(url, back)
    assert report["shards_sent"] == 3
    digests = {hspack.verify(p)["digest"] for p in (local, url, back)}
    assert len(digests) == 1
    again = hspack.copy(local, url)
    assert again["shards_sent"] == 0 and again["shards_present"] == 3 and not again["manifest_published"]


def test_open_s3_returns_the_same_tensors(remote):
    local, url = remote
    a, b = hspack.open(local), hspack.open(url)
    assert len(a) == len(b) == 37
    for i in range(37):
        x, y = a[i], b[i]
        assert x.keys() == y.keys()
        for name in x:
            assert torch.equal(x[name], y[name]), (i, name)
            assert torch.equal(y[name], eagle_sample(i)[name])
    assert b.sample(5).key == "s0005"


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_over_s3_see_every_sample_once(remote, context):
    _, url = remote
    ds = HspackIterableDataset(url, ["input_ids", "hidden.5"], seed=2)
    loader = HspackLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=context)
    seen = []
    for sample in loader:
        o = sample["ordinal"]
        assert torch.equal(sample["hidden.5"], eagle_sample(o)["hidden.5"])
        seen.append(o)
    assert sorted(seen) == list(range(37))

    mapped = HspackDataset(url, view="eagle3")
    loader = torch.utils.data.DataLoader(mapped, batch_size=None, num_workers=2, multiprocessing_context=context)
    assert [s["ordinal"] for s in loader] == list(range(37))


def test_a_copy_over_a_slow_uplink_finishes(s3, tmp_path):
    """A shard's first 32 MiB part over an uplink of 1 MB/s takes longer than the 30 s a
    request is given by default: it is sent once and lands, not cut off and sent again until
    the copy fails (every copy from a link slower than its parts in flight need did)."""
    local = tmp_path / "big"
    tokens, hidden = 2200, 8192  # 36 MB: parts of 32 MiB and 2.4 MiB
    schema = [hspack.token_ids(), hspack.hidden_state(1, hidden)]
    capture = {"model": "test/model", "num_layers": 2, "hidden_size": hidden, "dtype": "bf16"}
    g = torch.Generator().manual_seed(0)
    with hspack.Writer(local, schema, capture, durable=False) as w:
        states = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
        w.append("big", input_ids=torch.arange(tokens, dtype=torch.int32), **{"hidden.1": states})
    server = os.environ["AWS_ENDPOINT_URL"].rsplit(":", 1)[1]
    port = _free_port()
    link = Path(__file__).with_name("slow_link.py")
    proxy = subprocess.Popen([sys.executable, str(link), str(port), server, "1000000"])
    try:
        _wait_listening(port, proxy, "slow_link.py")
        os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{port}"
        start = time.monotonic()
        report = hspack.copy(local, f"{s3}/slow")
        took = time.monotonic() - start
    finally:
        os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{server}"
        proxy.terminate()
        proxy.wait()
    assert report["shards_sent"] == 1 and report["manifest_published"]
    # The link was as slow as meant: the parts alone needed more than 30 s.
    assert took > 32, took
    assert hspack.verify(f"{s3}/slow")["digest"] == hspack.verify(local)["digest"]


def test_a_writer_writes_straight_into_s3(s3):
    url = f"{s3}/direct"
    write_eagle(url, 20, shard_samples=7)
    ds = hspack.open(url)
    assert len(ds) == 20 and len(ds.shards) == 3
    assert ds.manifest["version"] == 4 and ds.manifest["writer"]["lease"]
    lease = ds.manifest["writer"]["lease"][:16]
    # The samples table, one part per commit, current after every commit, named after the lease.
    assert len(ds.table_files()) == 3
    assert all(f.startswith(url) and f.endswith(f"-{lease}.parquet") for f in ds.table_files())
    for i in range(20):
        got = ds.get(f"s{i:04d}")
        for name, t in eagle_sample(i).items():
            assert torch.equal(got[name], t), (i, name)
    assert hspack.verify(url)["ok"]
    # One writer at a time: the second is refused while the first holds the lease.
    capture = {"model": "test/model", "num_layers": 8, "hidden_size": H, "dtype": "bf16"}
    with hspack.Writer(url, eagle_schema(), capture, durable=False) as w:
        with pytest.raises(hspack.HspackError, match="hspack-writer.lease"):
            hspack.Writer(url, eagle_schema(), capture)
        w.append("s9999", **eagle_sample(9999))
    assert len(hspack.open(url)) == 21


def test_hf_capture_writes_straight_into_s3(s3, tmp_path):
    from test_capture_hf import LAYERS, alone, causal_lm_for_tests, chat_tokenizer

    from hspack.capture.hf import extract

    lm = causal_lm_for_tests().to(torch.bfloat16)
    lm.save_pretrained(tmp_path / "model")
    chat_tokenizer().save_pretrained(tmp_path / "model")
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"id": "a", "input_ids": [5, 6, 7, 8], "loss_mask": [0, 0, 1, 1]}\n'
                    '{"id": "b", "input_ids": [9, 3], "loss_mask": [1, 1]}\n')
    url = f"{s3}/hf-capture"
    assert extract(str(tmp_path / "model"), str(data), LAYERS, url, batch_size=2) == 2
    ds = hspack.open(url)
    assert sorted(ds.keys()) == ["a", "b"]
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.bfloat16).eval()
    ref = alone(loaded, [5, 6, 7, 8])
    for layer in LAYERS:
        assert torch.equal(ds.get("a")[f"hidden.{layer}"], ref[layer][0]), layer
    # A rerun resumes from what is in S3: nothing new.
    assert extract(str(tmp_path / "model"), str(data), LAYERS, url, batch_size=2) == 0
    assert hspack.verify(url)["ok"]


def test_capture_skip_into_a_store_in_s3(s3):
    """A store in S3: a capture into `s3://.../store/NAME`, then a reordered superset of its
    prompts runs the model only for the new ones; every sample reads back bitwise equal to a
    capture without the store, through `hspack.open` and `hspack.torch`."""
    import random

    from test_capture_hf import LAYERS, causal_lm_for_tests
    from test_capture_skip import capture, prompts, schema_and_config

    from hspack.capture import MemorySink
    from hspack.capture.hf import capture_samples
    from hspack.capture.prompts import Sample

    lm = causal_lm_for_tests().to(torch.bfloat16)
    store = f"{s3}/store"
    hspack.init_store(store)
    schema, config = schema_and_config(lm)
    first = prompts(6, seed=1, system=[1] * 8)
    counts, n = capture(lm, store, "run1", first, schema, config)
    assert (counts.forward, counts.reused, n) == (6, 0, 6)
    second = [Sample(key=f"q{i}", input_ids=s.input_ids, loss_mask=s.loss_mask)
              for i, s in enumerate(first + prompts(2, seed=2, system=[1] * 8, start=100))]
    random.Random(3).shuffle(second)
    counts, n = capture(lm, store, "run2", second, schema, config)
    assert (counts.reused, counts.forward, n) == (6, 2, 2), counts

    reference = MemorySink(schema)
    capture_samples(lm, second, LAYERS, reference, batch_size=1)
    ds = hspack.open(f"{store}/run2")
    assert sorted(ds.keys()) == sorted(s.key for s in second)
    for s in second:
        got = ds.get(s.key)
        for name, want in reference[s.key].items():
            assert torch.equal(got[name], want), (s.key, name)
    assert hspack.verify(f"{store}/run2")["ok"]
    loaded = list(torch.utils.data.DataLoader(HspackDataset(f"{store}/run2"), batch_size=None))
    assert len(loaded) == len(second)
    for i, sample in enumerate(loaded):
        want = ds[i]
        for name in want:
            assert torch.equal(sample[name], want[name]), (i, name)
