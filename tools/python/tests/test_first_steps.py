"""What a newcomer meets first: the README's example, the install without torch, token ids as
tokenizers return them, views by name, and batches of ragged samples."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import hspack
from conftest import eagle_sample
from hspack.torch import (
    Eagle3View,
    FieldsView,
    HspackDataset,
    HspackIterableDataset,
    HspackLoader,
    HspackSampler,
    PadCollate,
)

README = pathlib.Path(__file__).resolve().parents[3] / "README.md"


def readme_python_example() -> str:
    """The first Python block of the README's "Python and PyTorch" section."""
    text = README.read_text()
    section = text[text.index("## Python and PyTorch") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "no Python example in the README's Python section"
    return match.group(1)


def test_the_readme_example_runs_as_written(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(readme_python_example())
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    ds = hspack.open(tmp_path / "ds")
    assert len(ds) == 8 and ds.get("req-0")["input_ids"].dtype == torch.int32
    # Run again, as its comment says it resumes (a second run failed on the first key).
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(hspack.open(tmp_path / "ds")) == 8


def test_the_readme_example_runs_in_a_fresh_venv_after_the_documented_install(tmp_path):
    """The README's install command, as written, in a new virtual environment (seeing this
    machine's packages, so torch is not downloaded again), then its example."""
    documented = 'pip install "./tools/python[torch]"'
    assert documented in README.read_text(), "the README gives another install command"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    command = documented.replace("pip", f"{venv}/bin/python -m pip", 1)
    command = command.replace("./tools/python", str(README.parent / "tools/python"))
    done = subprocess.run(command + " -q --disable-pip-version-check", shell=True, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stdout + done.stderr
    script = tmp_path / "example.py"
    script.write_text(readme_python_example())
    where = subprocess.run([f"{venv}/bin/python", "-c", "import hspack; print(hspack.__file__)"],
                           capture_output=True, text=True, timeout=120)
    assert where.stdout.startswith(str(venv)), where.stdout + where.stderr
    done = subprocess.run([f"{venv}/bin/python", str(script)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(hspack.open(tmp_path / "ds")) == 8


def test_the_readme_installs_the_torch_extra():
    text = README.read_text()
    assert 'pip install "./tools/python[torch]"' in text
    pyproject = (README.parent / "tools/python/pyproject.toml").read_text()
    assert re.search(r'^torch = \["torch', pyproject, re.M), "pyproject.toml has no `torch` extra"


def test_without_torch_open_says_what_to_install(eagle_path):
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["torch"] = None  # as if torch were not installed
        import hspack
        try:
            hspack.open({eagle_path!r})
        except hspack.HspackError as e:
            print(e.kind, "|", e)
        else:
            print("opened")
        ds = hspack.open({eagle_path!r}, format="numpy")
        print("numpy", ds[0]["input_ids"].dtype)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    first, second = done.stdout.splitlines()
    assert first.startswith("BadOption |"), first
    assert 'pip install "./tools/python[torch]"' in first and 'format="numpy"' in first
    assert second == "numpy int32"


def test_a_field_a_sample_has_not_is_named_with_those_it_has(eagle_path):
    """`ds[0]["hidden_state"]` (SpecForge's name) was a bare KeyError: 'hidden_state'."""
    sample = hspack.open(eagle_path)[0]
    with pytest.raises(KeyError, match=r"no field 'hidden_state' in this sample; it has: input_ids, loss_mask, hidden\.1.*view=\"eagle3-specforge\""):
        sample["hidden_state"]
    with pytest.raises(KeyError, match=r"no field 'nope' in this sample; it has: input_ids") as err:
        sample["nope"]
    assert "view" not in str(err.value)
    assert sample.get("nope") is None and isinstance(sample, dict)
    assert torch.equal(sample["hidden.1"], eagle_sample(0)["hidden.1"])


def test_token_ids_of_any_integer_width_are_converted(tmp_path):
    with hspack.Writer(tmp_path / "ds", [hspack.token_ids(), hspack.loss_mask()], durable=False) as w:
        w.append("torch-int64", input_ids=torch.tensor([151_644, 872, 2**31 - 1]), loss_mask=torch.ones(3, dtype=torch.uint8))
        w.append("numpy-int64", input_ids=np.array([-(2**31), 5], dtype=np.int64), loss_mask=np.ones(2, dtype=np.uint8))
        w.append("torch-int16", input_ids=torch.tensor([7, 8], dtype=torch.int16), loss_mask=torch.ones(2, dtype=torch.uint8))
        w.append("torch-uint8", input_ids=torch.tensor([9], dtype=torch.uint8), loss_mask=torch.ones(1, dtype=torch.uint8))
    ds = hspack.open(tmp_path / "ds")
    assert ds.get("torch-int64")["input_ids"].tolist() == [151_644, 872, 2**31 - 1]
    assert ds.get("numpy-int64")["input_ids"].tolist() == [-(2**31), 5]
    assert ds.get("torch-int16")["input_ids"].tolist() == [7, 8]
    assert ds.get("torch-uint8")["input_ids"].tolist() == [9]
    assert ds.get("torch-int64")["input_ids"].dtype == torch.int32


def test_token_ids_that_do_not_fit_are_refused_naming_value_and_position(tmp_path):
    with hspack.Writer(tmp_path / "ds", [hspack.token_ids(), hspack.field("x", "i32")], durable=False) as w:
        with pytest.raises(hspack.HspackError) as e:
            w.append("a", input_ids=torch.tensor([1, 2, 2**31, 3]))
        assert (e.value.kind, e.value.key, e.value.field) == ("BadSample", "a", "input_ids")
        assert "token id 2147483648 at position 2" in str(e.value) and "i32" in str(e.value)
        with pytest.raises(hspack.HspackError, match="token id -2147483649 at position 0"):
            w.append("b", input_ids=np.array([-(2**31) - 1], dtype=np.int64))
        # Floats are not token ids, and only the token-ids role converts.
        with pytest.raises(hspack.HspackError, match="dtype torch.float32, the schema says i32"):
            w.append("c", input_ids=torch.tensor([1.0]))
        with pytest.raises(hspack.HspackError, match="dtype torch.int64, the schema says i32"):
            w.append("d", input_ids=torch.tensor([1], dtype=torch.int32), x=torch.tensor([1]))
    assert len(hspack.open(tmp_path / "ds")) == 0


@pytest.mark.parametrize("cls", [HspackDataset, HspackIterableDataset])
def test_an_unknown_view_is_refused_naming_the_known_ones(eagle_path, cls):
    with pytest.raises(hspack.HspackError) as e:
        cls(eagle_path, view="eagle3_specforge")
    assert e.value.kind == "BadOption" and e.value.option == "view"
    assert "'eagle3_specforge' is not a view" in str(e.value)
    assert '"eagle3"' in str(e.value) and '"eagle3-specforge"' in str(e.value)
    with pytest.raises(hspack.HspackError):
        cls(eagle_path, view=3)
    # Known names and view objects are accepted.
    for view in ("eagle3", "eagle3-specforge", Eagle3View(), FieldsView(["input_ids"]), lambda ds, i: i):
        cls(eagle_path, view=view)


# Every view the package offers, with the per-token keys its samples hold.
VIEWS = {
    "fields": (None, ["input_ids", "loss_mask", "hidden.1", "hidden.7"]),
    "eagle3": ("eagle3", ["input_ids", "loss_mask", "aux_hidden_state", "hidden_state"]),
    "eagle3-specforge": ("eagle3-specforge", ["input_ids", "loss_mask", "attention_mask", "hidden_state", "target"]),
}


@pytest.mark.parametrize("name", VIEWS)
def test_pad_collate_batches_every_view(eagle_path, name):
    view, keys = VIEWS[name]
    ds = HspackDataset(eagle_path, view=view)
    loader = HspackLoader(ds, sampler=HspackSampler(ds, shuffle=False), batch_size=4, collate_fn=PadCollate())
    batch = next(iter(loader))
    lengths = [int(n) for n in ds.hspack.lengths[:4]]
    assert batch["lengths"].tolist() == lengths and len(set(lengths)) > 1
    t_max = max(lengths)
    for key in keys:
        assert tuple(batch[key].shape[:2]) == (4, t_max), (key, batch[key].shape)
    assert batch["attention_mask"].sum(1).tolist() == lengths
    for b, n in enumerate(lengths):
        want = eagle_sample(b)
        assert torch.equal(batch["input_ids"][b, :n], want["input_ids"])
        assert (batch["input_ids"][b, n:] == 0).all() and (batch["loss_mask"][b, n:] == 0).all()
        if name == "fields":
            assert torch.equal(batch["hidden.7"][b, :n], want["hidden.7"])
        else:
            target = batch["hidden_state" if name == "eagle3" else "target"][b, :n]
            assert torch.equal(target, want["hidden.7"])
            aux = batch["aux_hidden_state" if name == "eagle3" else "hidden_state"][b, :n]
            assert torch.equal(aux, torch.cat([want["hidden.1"], want["hidden.3"], want["hidden.5"]], dim=1))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("name", VIEWS)
def test_loaders_pad_ragged_batches_by_default(eagle_path, workers, name):
    view, keys = VIEWS[name]
    ds = HspackDataset(eagle_path, view=view)
    loader = HspackLoader(ds, sampler=HspackSampler(ds, seed=1), batch_size=3, num_workers=workers)
    batches = list(loader)
    assert sum(len(b["lengths"]) for b in batches) == 37
    for b in batches:
        assert tuple(b[keys[0]].shape) == (len(b["lengths"]), int(b["lengths"].max()))
    it = HspackIterableDataset(eagle_path, view=view, seed=1)
    loader = HspackLoader(it, batch_size=3, num_workers=workers)
    assert sum(len(b["lengths"]) for b in loader) == 37
    # The last batch holds one sample: the count behind resume follows the batches' sizes.
    assert loader.state_dict()["consumed"] == 37


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("name", VIEWS)
def test_a_plain_dataloader_over_ragged_samples_says_how_to_batch_them(eagle_path, workers, name):
    """`DataLoader(ds, batch_size=4)` without a collate: torch's default collate cannot stack
    samples of other lengths, and the error says what to pass instead (also from a worker)."""
    view, _ = VIEWS[name]
    ds = HspackDataset(eagle_path, view=view)
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=workers)
    with pytest.raises(hspack.HspackError, match=r"differ in shape in field .*PadCollate\(\)") as e:
        next(iter(loader))
    assert "TokenBudgetBatchSampler(dataset, max_tokens=...)" in str(e.value) and "batch_size=None" in str(e.value)
    # What it says runs (it said HspackLoader(dataset, batch_size=...), which refuses a map
    # dataset without a sampler).
    from hspack.torch import HspackLoader, PadCollate, TokenBudgetBatchSampler

    told = HspackLoader(ds, batch_sampler=TokenBudgetBatchSampler(ds, max_tokens=4096), collate_fn=PadCollate(), num_workers=workers)
    assert "attention_mask" in next(iter(told))


def test_a_plain_dataloader_still_stacks_samples_of_one_length(tmp_path):
    """Samples of one length are collated by torch's default collate as before: the same
    keys, the tensors stacked, the result still names its fields on a miss."""
    path = tmp_path / "same"
    schema = [hspack.token_ids(), hspack.loss_mask(), hspack.hidden_state(1, 4), hspack.hidden_state(2, 4, point="final_norm")]
    with hspack.Writer(path, schema, durable=False) as w:
        for i in range(4):
            w.append(f"k{i}", input_ids=torch.arange(3, dtype=torch.int32) + i, loss_mask=torch.ones(3, dtype=torch.uint8), **{"hidden.1": torch.full((3, 4), i, dtype=torch.bfloat16), "hidden.2": torch.zeros(3, 4, dtype=torch.bfloat16)})
    for view in (None, "eagle3"):
        batch = next(iter(torch.utils.data.DataLoader(HspackDataset(path, view=view), batch_size=4)))
        assert batch["ordinal"].tolist() == [0, 1, 2, 3]
        ids = batch["input_ids"]
        assert ids.shape == (4, 3) and torch.equal(ids[2], torch.arange(3, dtype=torch.int32) + 2)
    with pytest.raises(KeyError, match="it has"):
        batch["hidden_states"]


def test_natural_mistakes_say_what_to_write(eagle_path, tmp_path):
    """What a trainer types first: `shuffle=True` to HspackLoader, `ds[key]`, a float32 or bool
    tensor for a bf16 or u8 field. Each error says what to write instead."""
    from hspack.torch import HspackDataset, HspackLoader

    with pytest.raises(TypeError, match=r"sampler=HspackSampler\(dataset, seed=...\)"):
        HspackLoader(HspackDataset(eagle_path), shuffle=True)
    ds = hspack.open(eagle_path)
    with pytest.raises(TypeError, match=r"ds\.get\(key\)"):
        ds["no-such-key"]
    w = hspack.Writer(tmp_path / "ds", [hspack.token_ids(), hspack.loss_mask(), hspack.hidden_state(1, 8)])
    ids = torch.arange(3, dtype=torch.int32)
    with pytest.raises(hspack.HspackError, match=r"convert it: \.to\(torch\.bfloat16\)"):
        w.append("a", input_ids=ids, loss_mask=torch.ones(3, dtype=torch.uint8), **{"hidden.1": torch.randn(3, 8)})
    with pytest.raises(hspack.HspackError, match=r"convert it: \.to\(torch\.uint8\)"):
        w.append("a", input_ids=ids, loss_mask=ids > 0, **{"hidden.1": torch.randn(3, 8).bfloat16()})
    w.abort()
