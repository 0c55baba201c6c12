"""Small datasets written with the public writer for the tests."""

from __future__ import annotations

import pytest
import torch

import hspack

H = 16
LAYERS = [1, 3, 5]


def eagle_schema() -> list:
    return [
        hspack.token_ids(),
        hspack.loss_mask(),
        *[hspack.hidden_state(layer, H) for layer in LAYERS],
        hspack.hidden_state(7, H, point="final_norm"),
    ]


def eagle_sample(i: int) -> dict:
    g = torch.Generator().manual_seed(i)
    t = 3 + (i * 7) % 29
    out = {
        "input_ids": torch.randint(0, 1000, (t,), generator=g, dtype=torch.int32),
        "loss_mask": (torch.rand(t, generator=g) > 0.3).to(torch.uint8),
    }
    for layer in LAYERS:
        out[f"hidden.{layer}"] = torch.randn(t, H, generator=g).to(torch.bfloat16)
    out["hidden.7"] = torch.randn(t, H, generator=g).to(torch.bfloat16)
    return out


def write_eagle(path, n: int, first: int = 0, **options) -> None:
    """Samples `first..n` (a dataset there is resumed)."""
    options.setdefault("durable", False)
    capture = {"model": "test/model", "num_layers": 8, "hidden_size": H, "dtype": "bf16"}
    with hspack.Writer(path, eagle_schema(), capture, **options) as w:
        for i in range(first, n):
            w.append(f"s{i:04d}", **eagle_sample(i))


@pytest.fixture(scope="session")
def eagle_path(tmp_path_factory):
    """37 samples in 3 shards (13 samples a shard)."""
    path = tmp_path_factory.mktemp("eagle") / "ds"
    write_eagle(path, 37, shard_samples=13)
    return str(path)
