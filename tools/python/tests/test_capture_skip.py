"""Capture-skip (hspack.capture.reuse): a second run over a reordered superset of the
prompts runs the model only for the new ones, keyed by content, not by position or id.

Real transformers (the tiny random 61-layer DeepSeek-V3 of test_capture_hf), bf16 on CPU,
batch size 1 (per-sample deterministic), a real store on disk. Forward passes are counted
by a hook on the model, not taken from the driver's own report.
"""

import json
import random
import re
import subprocess
import sys

import pytest
import torch

import hspack
from hspack.capture import MemorySink
from hspack.capture.hf import capture_samples, extract
from hspack.capture.prompts import Sample
from hspack.capture.points import CapturePoints, DTYPE_NAMES
from hspack.capture.reuse import CaptureCounts, capture_config

from test_capture_hf import LAYERS, NUM_LAYERS, causal_lm_for_tests, chat_tokenizer

SYSTEM = 96  # tokens of the shared system prompt


@pytest.fixture(scope="module")
def lm():
    return causal_lm_for_tests().to(torch.bfloat16)


def prompts(n, seed, system, start=0):
    """Ragged prompts, a third opening with the shared system prompt; ids name the content's
    position in this list only."""
    g = random.Random(seed)
    out = []
    for i in range(n):
        body = [g.randrange(1, 128) for _ in range(g.randrange(8, 48))]
        ids = (system + body) if i % 3 == 0 else body
        mask = [0] * (len(ids) - len(body)) + [1] * len(body)
        out.append(Sample(key=f"p{start + i}", input_ids=ids, loss_mask=mask))
    return out


def schema_and_config(lm):
    points = CapturePoints.select(NUM_LAYERS, LAYERS)
    schema = points.schema(lm.config.hidden_size, torch.bfloat16)
    config = capture_config(
        model="tiny-deepseek", revision=None, config_hash="test", engine="transformers",
        deterministic=True, dtype=DTYPE_NAMES[torch.bfloat16], layers=points.ids,
        fields=[f["name"] for f in schema],
    )
    return schema, config


class Forwards:
    """Counts the decoder's forward passes (one per sample at batch size 1)."""

    def __init__(self, lm):
        self.n = 0
        self.handle = lm.model.register_forward_hook(self.hook)

    def hook(self, *_):
        self.n += 1


def capture(lm, store, name, samples, schema, config):
    counts = CaptureCounts()
    forwards = Forwards(lm)
    try:
        with hspack.Writer(f"{store}/{name}", schema) as w:
            capture_samples(lm, samples, LAYERS, w, batch_size=1, reuse=config, counts=counts)
    finally:
        forwards.handle.remove()
    return counts, forwards.n


def store_bytes(store):
    return sum(p.stat().st_size for p in (store / "packs").iterdir())


def test_a_reordered_superset_runs_the_model_only_for_the_new_prompts(tmp_path, lm):
    store = tmp_path / "store"
    hspack.init_store(str(store))
    schema, config = schema_and_config(lm)
    system = [int(t) for t in torch.randint(1, 128, (SYSTEM,), generator=torch.Generator().manual_seed(7))]
    first = prompts(18, seed=1, system=system)
    # ~10% duplicate requests: two prompts repeat others' tokens under their own ids.
    first += [Sample(key="dup-a", input_ids=first[4].input_ids, loss_mask=first[4].loss_mask),
              Sample(key="dup-b", input_ids=first[9].input_ids, loss_mask=first[9].loss_mask)]
    counts, n = capture(lm, store, "run1", first, schema, config)
    assert (counts.forward, counts.shared, counts.reused, n) == (18, 2, 0, 18)
    after_first = store_bytes(store)

    new = prompts(6, seed=2, system=system, start=100)
    second = [Sample(key=f"q{i}", input_ids=s.input_ids, loss_mask=s.loss_mask) for i, s in enumerate(first + new)]
    random.Random(3).shuffle(second)
    counts, n = capture(lm, store, "run2", second, schema, config)
    assert (counts.reused, counts.forward, n, counts.stale) == (20, 6, 6, 0), counts
    assert counts.total == 26 and "6 run through the model, 20 reused" in counts.summary()

    # Every sample of run2 is bitwise what a capture of it without the store gives.
    reference = MemorySink(schema)
    capture_samples(lm, second, LAYERS, reference, batch_size=1)
    ds = hspack.open(str(store / "run2"))
    assert sorted(ds.keys()) == sorted(s.key for s in second)
    for s in second:
        got = ds.get(s.key)
        for name, want in reference[s.key].items():
            assert torch.equal(got[name], want), (s.key, name)

    # The reused samples cost no new bytes: the store grew by about what the new ones hold.
    fresh = {f"q{i}" for i in range(20, 26)}  # keys given before the shuffle
    new_bytes = sum(t.numel() * t.element_size() for k in fresh for t in reference[k].values())
    all_bytes = sum(t.numel() * t.element_size() for k in reference for t in reference[k].values())
    grown = store_bytes(store) - after_first
    assert grown < 1.15 * new_bytes + (1 << 20) and grown < all_bytes / 2, (grown, new_bytes, all_bytes)

    # A third run of the same prompts runs nothing.
    counts, n = capture(lm, store, "run3", list(reversed(second)), schema, config)
    assert (counts.forward, n, counts.reused) == (0, 0, 26)

    # Another capture config (other layers, or batched: not deterministic) shares nothing.
    other = dict(config, deterministic=False)
    counts, n = capture(lm, store, "run4", first[:3], schema, other)
    assert (counts.forward, counts.reused) == (3, 0)


def test_a_recorded_capture_whose_dataset_changed_is_not_reused(tmp_path, lm):
    store = tmp_path / "store"
    hspack.init_store(str(store))
    schema, config = schema_and_config(lm)
    samples = prompts(3, seed=5, system=[1] * 8)
    counts, _ = capture(lm, store, "a", samples, schema, config)
    assert counts.forward == 3
    # Dataset `a` is removed (what `hspack store rm` does: its file under datasets/ goes) and
    # written again with other samples at the same ordinals; its capture file stays.
    (store / "datasets" / "a.json").unlink()
    others = prompts(3, seed=6, system=[2] * 8)
    capture(lm, store, "a", others, schema, config)
    counts, n = capture(lm, store, "b", samples, schema, config)
    assert (counts.reused, counts.stale, counts.forward, n) == (0, 3, 3, 3), counts
    assert "3 recorded captures were gone or changed" in counts.summary()


def test_capture_keys_need_a_store_dataset(tmp_path, lm):
    schema, config = schema_and_config(lm)
    with hspack.Writer(tmp_path / "plain", schema) as w:
        assert not w.in_store
        with pytest.raises(ValueError, match="STORE/NAME"):
            capture_samples(lm, prompts(1, seed=1, system=[]), LAYERS, w, batch_size=1, reuse=config)
    key = hspack.capture_key(config, [1, 2, 3], [0, 1, 1])
    assert len(key) == 32 and key == hspack.capture_key(config, torch.tensor([1, 2, 3]), [0, 1, 1])
    assert key != hspack.capture_key(config, [1, 2, 3], [1, 1, 1])
    assert key != hspack.capture_key(dict(config, model="other"), [1, 2, 3], [0, 1, 1])
    with pytest.raises(Exception, match="unknown field"):
        hspack.capture_key(dict(config, colour="red"), [1])


def test_extract_into_a_store_reports_what_it_skipped(tmp_path, lm):
    lm.save_pretrained(tmp_path / "model")
    chat_tokenizer().save_pretrained(tmp_path / "model")
    store = tmp_path / "store"
    hspack.init_store(str(store))
    lines = [{"id": f"a{i}", "input_ids": [5 + i, 6, 7, 8], "loss_mask": [0, 0, 1, 1]} for i in range(3)]
    data = tmp_path / "one.jsonl"
    data.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    more = tmp_path / "two.jsonl"
    more.write_text("\n".join(json.dumps(dict(x, id=f"b{i}")) for i, x in enumerate(
        lines[::-1] + [{"id": "n", "input_ids": [9, 9, 9]}])) + "\n")
    base = [sys.executable, "-m", "hspack.capture.hf", "extract", "--model", str(tmp_path / "model"),
            "--layers", ",".join(map(str, LAYERS)), "--batch-size", "1"]
    r = subprocess.run(base + ["--data", str(data), "--out", str(store / "one")], check=True, capture_output=True, text=True)
    assert "3 run through the model, 0 reused" in r.stderr, r.stderr
    r = subprocess.run(base + ["--data", str(more), "--out", str(store / "two")], check=True, capture_output=True, text=True)
    assert "wrote 4 samples" in r.stderr and "1 run through the model, 3 reused from the store" in r.stderr, r.stderr
    one, two = hspack.open(str(store / "one")), hspack.open(str(store / "two"))
    for i in range(3):
        a, b = one.get(f"a{i}"), two.get(f"b{2 - i}")
        assert all(torch.equal(a[k], b[k]) for k in a)
    # Batched capture is not per-sample deterministic: its key differs, nothing is reused.
    r = subprocess.run(base[:-1] + ["2", "--data", str(data), "--out", str(store / "three")], check=True, capture_output=True, text=True)
    assert "3 run through the model, 0 reused" in r.stderr, r.stderr


def test_weights_saved_again_over_the_same_config_are_captured_again(tmp_path, lm):
    """The capture key names the weights, not only the config: a local model folder whose
    weights are saved again (retrained, same config, no revision) is run again, not reused."""
    from transformers import AutoModelForCausalLM, DeepseekV3ForCausalLM

    from test_capture_hf import alone

    folder = tmp_path / "model"
    lm.save_pretrained(folder)
    store = tmp_path / "store"
    hspack.init_store(str(store))
    data = tmp_path / "prompts.jsonl"
    prompts = {f"p{i}": [5 + i, 6, 7, 8, 9] for i in range(3)}
    data.write_text("".join(json.dumps({"id": k, "input_ids": v}) + "\n" for k, v in prompts.items()))

    def run(name):
        counts = CaptureCounts()
        extract(str(folder), str(data), LAYERS, str(store / name), batch_size=1, counts=counts)
        return counts.forward, counts.reused

    assert run("one") == (3, 0)
    assert run("same-weights") == (0, 3)
    torch.manual_seed(1)
    retrained = DeepseekV3ForCausalLM(lm.config).to(torch.bfloat16).eval()
    retrained.save_pretrained(folder)
    assert run("retrained") == (3, 0)
    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    one, new = hspack.open(str(store / "one")), hspack.open(str(store / "retrained"))
    for key, ids in prompts.items():
        got, ref = new.get(key), alone(loaded, ids)
        assert torch.equal(got[f"hidden.{NUM_LAYERS}"], ref[-1][0]), key
        assert not torch.equal(got[f"hidden.{NUM_LAYERS}"], one.get(key)[f"hidden.{NUM_LAYERS}"]), key


def test_a_resume_after_the_weights_changed_is_refused_not_mixed_in(tmp_path, lm):
    """The capture metadata records what names the weights (`reuse.model_revision`), not the
    revision as given (none): a dataset resumed after the folder's weights were saved again
    is refused, naming the revision, instead of holding samples of two models."""
    from transformers import DeepseekV3ForCausalLM

    folder = tmp_path / "model"
    lm.save_pretrained(folder)
    data = tmp_path / "prompts.jsonl"

    def write(n):
        data.write_text("".join(json.dumps({"id": f"p{i}", "input_ids": [5 + i, 6, 7]}) + "\n" for i in range(n)))

    write(2)
    out = tmp_path / "out"
    extract(str(folder), str(data), LAYERS, str(out), batch_size=1)
    assert hspack.open(str(out)).capture["revision"].startswith("weights:")
    write(4)
    assert extract(str(folder), str(data), LAYERS, str(out), batch_size=1) == 2, "same weights: resumed"
    torch.manual_seed(1)
    DeepseekV3ForCausalLM(lm.config).to(torch.bfloat16).eval().save_pretrained(folder)
    write(6)
    with pytest.raises(hspack.HspackError, match="capture `revision`"):
        extract(str(folder), str(data), LAYERS, str(out), batch_size=1)
    assert len(hspack.open(str(out))) == 4


def test_max_len_below_one_is_refused(tmp_path):
    from hspack.capture.prompts import read_samples

    data = tmp_path / "prompts.jsonl"
    data.write_text(json.dumps({"id": "a", "input_ids": [5, 6, 7, 8]}) + "\n")
    for bad in (0, -1):
        with pytest.raises(ValueError, match=f"max_len {bad}: give 1 or more"):
            list(read_samples(str(data), max_len=bad))
    assert list(read_samples(str(data), max_len=2))[0].input_ids == [5, 6]


def test_a_prompts_file_that_is_not_there_is_named_before_the_model_is_resolved(tmp_path, monkeypatch):
    """A typo in ``--data`` is said first, not after a model download, nor hidden behind an
    offline hub's error about the model; so is a ``max_len`` below 1."""
    from hspack.capture import sglang

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data = tmp_path / "prompts.jsonl"
    data.write_text(json.dumps({"id": "a", "input_ids": [5, 6]}) + "\n")
    for capture in (extract, sglang.extract):
        for given, said in ((tmp_path / "missing.jsonl", "does not exist"), (tmp_path, "is not a file")):
            with pytest.raises(FileNotFoundError, match=re.escape(f"--data {given}: {said}; give the JSONL file")):
                capture("no-such-org/no-such-model", str(given), [1], str(tmp_path / "out"))
        with pytest.raises(ValueError, match="max_len 0: give 1 or more"):
            capture("no-such-org/no-such-model", str(data), [1], str(tmp_path / "out"), max_len=0)
    # The model is looked for once the prompts are there (the offline hub's error).
    with pytest.raises(OSError, match="huggingface|no-such-org/no-such-model"):
        extract("no-such-org/no-such-model", str(data), [1], str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_model_revision_names_a_cache_snapshot_by_its_commit_and_a_folder_by_its_weights(tmp_path):
    """A snapshot of the hub's cache keys by its commit (the same on every machine, whatever
    the files' times); another folder by its weight files; one holding none by the revision
    given, never by a hash of nothing."""
    import os

    from hspack.capture.reuse import model_revision

    commit = "0123456789abcdef0123456789abcdef01234567"
    snap = tmp_path / "models--org--m" / "snapshots" / commit
    snap.mkdir(parents=True)
    (snap / "model.safetensors").write_bytes(b"w")
    assert model_revision(str(snap), None) == commit
    link = tmp_path / "linked"
    os.symlink(snap, link)
    assert model_revision(str(link), None) == commit
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text("{}")
    assert model_revision(str(plain), "v1") == "v1"
    (plain / "model.safetensors").write_bytes(b"w")
    first = model_revision(str(plain), "v1")
    assert first.startswith("weights:")
    (plain / "model.safetensors").write_bytes(b"ww")
    assert model_revision(str(plain), "v1") != first


def test_the_captures_of_a_shard_committed_when_full_are_recorded_though_the_run_fails(tmp_path, lm):
    """A shard committed inside ``append`` (it was full) left its samples' capture keys
    unrecorded until the run's own commit: a run that failed after it lost them, and its
    resume, which skips the committed samples, never recorded them."""
    store = tmp_path / "store"
    hspack.init_store(str(store))
    schema, config = schema_and_config(lm)
    samples = prompts(5, seed=9, system=[3] * 8)
    with pytest.raises(RuntimeError, match="the run fails here"):
        with hspack.Writer(f"{store}/a", schema, shard_samples=2) as w:
            sink_append = w.append
            calls = []

            def failing_append(key, **kw):
                if len(calls) == 3:
                    raise RuntimeError("the run fails here")
                calls.append(key)
                return sink_append(key, **kw)

            w.append = failing_append
            capture_samples(lm, samples, LAYERS, w, batch_size=1, reuse=config)
    assert len(hspack.open(f"{store}/a")) == 2
    counts, n = capture(lm, store, "b", samples, schema, config)
    assert (counts.reused, counts.forward, n) == (2, 3, 3), counts


def test_prompt_lines_that_are_not_lists_of_integers_are_refused_naming_the_field(tmp_path):
    """A string of digits was read digit by digit as token ids, a float cut to an integer: a
    capture of other tokens than meant, without a word. A line that is not an object, or a
    turn that is not, raised a TypeError or AttributeError."""
    from hspack.capture.prompts import read_samples

    cases = [
        ({"id": "a", "input_ids": "123"}, "'input_ids' must be a list of integers"),
        ({"id": "a", "input_ids": [4.7, 5]}, r"'input_ids'\[0\] is 4.7, not an integer"),
        ({"id": "a", "input_ids": [4, True]}, r"'input_ids'\[1\] is True"),
        ({"id": "a", "input_ids": [4, 5], "loss_mask": "10"}, "'loss_mask' must be a list"),
        ({"id": "a", "input_ids": [4, 5], "loss_mask": [0.4, 1]}, r"'loss_mask'\[0\] is 0.4"),
        (5, "a line must be a JSON object"),
        ({"id": None, "input_ids": [4]}, "'id' must be a string or an integer"),
        ({"id": "a", "conversations": ["hi"]}, "turn 0 is 'hi', not an object"),
        ({"id": "a", "conversations": "hi"}, "'conversations'/'messages' must be a list of turns"),
    ]
    for rec, said in cases:
        data = tmp_path / "prompts.jsonl"
        data.write_text(json.dumps(rec) + "\n")
        with pytest.raises(ValueError, match=rf"prompts.jsonl:1: {said}"):
            list(read_samples(str(data), tokenizer=object()))
    data.write_text(json.dumps({"id": 7, "input_ids": [4, 5], "loss_mask": [0, 1]}) + "\n")
    (s,) = read_samples(str(data))
    assert (s.key, s.input_ids, s.loss_mask) == ("7", [4, 5], [0, 1])


def test_a_batch_size_below_one_a_rank_out_of_range_and_a_device_not_here_are_refused_first(tmp_path, monkeypatch):
    """``--batch-size -1`` wrote nothing and said it was done; 0 failed inside ``range``; a
    rank out of range read "must be in 0..2 (world_size 2)"; a device torch does not know, or
    CUDA where there is none, failed as a traceback once the model was loaded."""
    from hspack.capture import hf, sglang

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data = tmp_path / "prompts.jsonl"
    data.write_text(json.dumps({"id": "a", "input_ids": [5, 6]}) + "\n")
    out = str(tmp_path / "out")
    for capture in (extract, sglang.extract):
        for bad in (0, -1):
            with pytest.raises(ValueError, match=f"batch_size {bad}: give 1 or more"):
                capture("no-such-org/no-such-model", str(data), [1], out, batch_size=bad)
    with pytest.raises(ValueError, match="batch_size 0: give 1 or more"):
        capture_samples(torch.nn.Linear(2, 2), [], [1], MemorySink(), batch_size=0)
    for rank, world, said in ((2, 2, "rank 2: with world_size 2, give 0 to 1"), (0, 0, "world_size 0: give 1 or more")):
        with pytest.raises(ValueError, match=re.escape(said)):
            extract("no-such-org/no-such-model", str(data), [1], out, rank=rank, world_size=world)
    for device, said in (("bogus", "device 'bogus'"), ("cuda:99", "device 'cuda:99'")):
        with pytest.raises(ValueError, match=said):
            extract("no-such-org/no-such-model", str(data), [1], out, device=device)
    monkeypatch.setenv("RANK", "x")
    p = subprocess.run([sys.executable, "-m", "hspack.capture.hf", "extract", "--model", "m", "--data", str(data),
                        "--layers", "1", "--out", out], capture_output=True, text=True)
    assert p.returncode == 2 and "$RANK is 'x', not an integer" in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()
