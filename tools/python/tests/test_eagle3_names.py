"""The EAGLE-3 names seen from Python are the Rust library's (``hspack::format::eagle3``):
the native module exports them, the package uses them, and a dataset the Rust converter
writes carries them."""

import torch

import hspack
from hspack import _hspack
from hspack.capture import points
from hspack.capture.points import CapturePoints
from hspack.torch import Eagle3View, HspackDataset, PadCollate

from test_convert_torch import hspack as run, save

# The same names `format::eagle3`'s unit test pins on the Rust side.
RUST = {
    "fields": {
        "input_ids": "input_ids",
        "loss_mask": "loss_mask",
        "aux": "aux_hidden_state",
        "hidden_prefix": "hidden.",
    },
    "view": {"input_ids": "input_ids", "loss_mask": "loss_mask", "aux": "aux_hidden_state", "target": "hidden_state"},
    "specforge_item": {
        "input_ids": "input_ids",
        "loss_mask": "loss_mask",
        "aux": "hidden_state",
        "target": "target",
        "attention_mask": "attention_mask",
    },
}
FIELDS, VIEW, ITEM = (_hspack.EAGLE3[k] for k in ("fields", "view", "specforge_item"))


def test_the_native_module_exports_the_rust_names():
    assert _hspack.EAGLE3 == RUST


def test_capture_and_schema_helpers_name_fields_with_them():
    assert (points.TOKEN_FIELD, points.LOSS_MASK_FIELD, points.STACKED_FIELD) == (
        FIELDS["input_ids"],
        FIELDS["loss_mask"],
        FIELDS["aux"],
    )
    cp = CapturePoints.select(num_layers=4, layers=[1, 2], stack=True)
    names = [f["name"] for f in cp.schema(8, torch.bfloat16)]
    assert names == [FIELDS["input_ids"], FIELDS["loss_mask"], FIELDS["aux"], FIELDS["hidden_prefix"] + "4"]
    assert hspack.token_ids()["name"] == FIELDS["input_ids"]
    assert hspack.loss_mask()["name"] == FIELDS["loss_mask"]
    assert hspack.hidden_states([1, 2], 8)["name"] == FIELDS["aux"]
    assert hspack.hidden_state(3, 8)["name"] == FIELDS["hidden_prefix"] + "3"
    assert hspack.hidden_state(7, 8, point="final_norm")["name"] == FIELDS["hidden_prefix"] + "7"


def test_the_views_and_collate_return_them(eagle_path):
    ds = HspackDataset(eagle_path, view=Eagle3View())
    assert set(ds[0]) == set(VIEW.values()) | {"ordinal"}
    sf = HspackDataset(eagle_path, view=Eagle3View(layout="specforge"))
    assert set(sf[0]) == set(ITEM.values())
    batch = PadCollate()([ds[0], ds[1]])
    assert ITEM["attention_mask"] in batch


def test_a_converted_specforge_sample_reads_back_under_its_saved_names(tmp_path):
    t, h = 6, 8
    gen = torch.Generator().manual_seed(0)
    saved = {
        VIEW["input_ids"]: torch.randint(0, 1000, (t,), generator=gen),
        VIEW["loss_mask"]: torch.randint(0, 2, (t,), generator=gen),
        VIEW["aux"]: torch.randn(1, t, 3 * h, generator=gen).to(torch.bfloat16),
        VIEW["target"]: torch.randn(1, t, h, generator=gen).to(torch.bfloat16),
    }
    save(saved, tmp_path / "src/rows_0-1/data_0.ckpt")
    run("convert", tmp_path / "src", tmp_path / "ds", "--layout", "specforge", "--layers", "2,30,58,61", "--num-layers", "61", "-q")
    ds = hspack.open(tmp_path / "ds")
    assert [f["name"] for f in ds.schema] == [FIELDS["input_ids"], FIELDS["loss_mask"], FIELDS["aux"], FIELDS["hidden_prefix"] + "61"]
    got = HspackDataset(tmp_path / "ds", view="eagle3")[0]
    for key in VIEW.values():
        want = saved[key][0] if saved[key].dim() == 3 else saved[key]
        assert torch.equal(got[key].to(want.dtype), want), key
