"""Fields stored as FP8 with a scale per row and layer (`quantize=`): what the writer stores
and what readers hand out, checked against torch's own float8_e4m3fn conversion (an
implementation hspack shares no code with) — every bf16 value, realistic activations with
outlier channels, the EAGLE-3 view, and the refusals."""

import json

import numpy as np
import pytest
import torch

import hspack
from hspack.torch import Eagle3View, HspackDataset

H = 64
LAYERS = [1, 3, 5]


def torch_fp8(x: torch.Tensor, group: int):
    """FORMAT.md §4.1 in torch: scale = amax / 448 per group (1 for zeros), codes = the value
    over the scale clamped to ±448 and cast to float8_e4m3fn, decoded = codes × scale in f32
    rounded to x's dtype."""
    flat = x.float().reshape(-1, group)
    scale = flat.abs().amax(dim=1, keepdim=True) / 448.0
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    codes = (flat / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    back = (codes.float() * scale).to(x.dtype).reshape(x.shape)
    return codes, scale.reshape(-1), back


def activations(gen: torch.Generator, rows: int, width: int) -> torch.Tensor:
    """Activation-like bf16: per-channel log-normal scales, a few channels 50x larger."""
    channel = torch.exp(torch.randn(width, generator=gen) * 0.5)
    channel[torch.randperm(width, generator=gen)[: max(1, width // 64)]] *= 50
    return (torch.randn(rows, width, generator=gen) * channel).bfloat16()


def schema():
    return [hspack.token_ids(), hspack.loss_mask(), hspack.hidden_states(LAYERS, H), hspack.hidden_state(7, H, point="final_norm")]


def write(path, samples, **options):
    with hspack.Writer(path, schema(), create=True, durable=False, **options) as w:
        for key, s in samples:
            w.append(key, **s)


def make_samples(n=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        t = [1, 9, 33, 128, 0, 70][i % 6]
        out.append(
            (
                f"s{i}",
                {
                    "input_ids": torch.arange(t, dtype=torch.int32),
                    "loss_mask": (torch.arange(t) > 3).to(torch.uint8),
                    "aux_hidden_state": activations(gen, t, len(LAYERS) * H).reshape(t, len(LAYERS), H),
                    "hidden.7": activations(gen, t, H),
                },
            )
        )
    return out


def test_every_value_and_code_is_what_torch_computes(tmp_path):
    data = make_samples()
    write(tmp_path / "q", data, quantize="fp8")
    ds = hspack.open(tmp_path / "q")
    quantized = {f["name"]: f.get("quantized") for f in ds.schema}
    assert quantized["aux_hidden_state"] == {"scheme": "fp8-e4m3fn", "group": H}
    assert quantized["hidden.7"] == {"scheme": "fp8-e4m3fn", "group": H}
    assert quantized["input_ids"] is None and quantized["loss_mask"] is None
    assert ds.manifest["version"] == 5
    for i, (key, s) in enumerate(data):
        got = ds[i]
        assert torch.equal(got["input_ids"], s["input_ids"])
        assert torch.equal(got["loss_mask"], s["loss_mask"])
        for name in ("aux_hidden_state", "hidden.7"):
            codes, scales, back = torch_fp8(s[name], H)
            assert got[name].dtype == torch.bfloat16
            assert torch.equal(got[name].view(torch.int16), back.view(torch.int16)), (key, name)
            stored = ds.quantized(i, name)
            assert stored["group"] == H
            assert torch.equal(stored["codes"].reshape(-1).view(torch.uint8), codes.reshape(-1).view(torch.uint8))
            assert torch.equal(stored["scales"].reshape(-1), scales)
            assert stored["codes"].shape == (s[name].shape[0], *s[name].shape[1:])
            assert stored["scales"].shape[0] == s[name].shape[0]
        # A row range of the stored form is the same rows of the whole.
        if s["input_ids"].shape[0] > 10:
            part = ds.quantized(i, "aux_hidden_state", rows=(3, 10))
            whole = ds.quantized(i, "aux_hidden_state")
            assert torch.equal(part["scales"], whole["scales"][3:10])
            rows = ds.read(i, ["aux_hidden_state"], rows=(3, 10))["aux_hidden_state"]
            assert torch.equal(rows.view(torch.int16), got["aux_hidden_state"][3:10].view(torch.int16))


def test_every_finite_bf16_value_quantizes_as_torch_does(tmp_path):
    """All 65,536 bf16 bit patterns but infinities and NaNs, 256 to a row with a scale per 64:
    groups of tiny, huge and mixed magnitudes."""
    bits = torch.arange(65536, dtype=torch.int32).to(torch.int16)
    values = bits.view(torch.bfloat16)
    finite = values[torch.isfinite(values.float())]
    rows = finite.shape[0] // 256
    x = finite[: rows * 256].reshape(rows, 256)
    # Shuffle so that groups mix magnitudes as well as holding runs of neighbours.
    gen = torch.Generator().manual_seed(1)
    x = torch.cat([x, x.reshape(-1)[torch.randperm(rows * 256, generator=gen)].reshape(rows, 256)])
    fields = [hspack.field("x", "bf16", [4, 64], {"kind": "hidden_states", "layers": [0, 1, 2, 3], "point": "layer_input"})]
    with hspack.Writer(tmp_path / "all", fields, create=True, durable=False, quantize="fp8") as w:
        w.append("all", x=x.reshape(-1, 4, 64))
    ds = hspack.open(tmp_path / "all")
    codes, scales, back = torch_fp8(x, 64)
    got = ds[0]["x"].reshape(x.shape)
    assert torch.equal(got.view(torch.int16), back.view(torch.int16))
    stored = ds.quantized(0, "x")
    assert torch.equal(stored["codes"].reshape(-1).view(torch.uint8), codes.reshape(-1).view(torch.uint8))
    assert torch.equal(stored["scales"].reshape(-1), scales)
    # `rows` is checked as `read` checks it (5 raised "'int' object is not iterable").
    for bad in (5, (0, 1, 2), (-1, 2)):
        with pytest.raises(hspack.HspackError, match=r"option rows of sample 0: .* must be \(start, stop\)"):
            ds.quantized(0, "x", rows=bad)


def test_the_eagle3_view_reads_dequantized_bf16_unchanged(tmp_path):
    data = make_samples()
    write(tmp_path / "exact", data)
    write(tmp_path / "q", data, quantize="fp8")
    exact = HspackDataset(str(tmp_path / "exact"), view=Eagle3View())
    quant = HspackDataset(str(tmp_path / "q"), view=Eagle3View())
    assert len(exact) == len(quant)
    for i in range(len(exact)):
        a, b = exact[i], quant[i]
        assert set(a) == set(b)
        for k in a:
            if isinstance(a[k], torch.Tensor) and a[k].is_floating_point():
                assert a[k].shape == b[k].shape and b[k].dtype == a[k].dtype
                if a[k].numel():
                    cos = torch.nn.functional.cosine_similarity(a[k].float().reshape(a[k].shape[0], -1), b[k].float().reshape(b[k].shape[0], -1), dim=1)
                    assert cos.min() > 0.99, (i, k, cos.min())
            else:
                assert torch.equal(torch.as_tensor(a[k]), torch.as_tensor(b[k])), (i, k)


def test_named_fields_only_and_the_bytes_halve(tmp_path):
    data = make_samples()
    write(tmp_path / "exact", data)
    write(tmp_path / "q", data, quantize=["aux_hidden_state"])
    ds = hspack.open(tmp_path / "q")
    assert [f["name"] for f in ds.schema if f.get("quantized")] == ["aux_hidden_state"]
    for i, (_, s) in enumerate(data):
        assert torch.equal(ds[i]["hidden.7"].view(torch.int16), s["hidden.7"].view(torch.int16))
    with pytest.raises(hspack.HspackError, match="stored exactly"):
        ds.quantized(1, "hidden.7")
    write(tmp_path / "all", data, quantize="fp8")
    size = lambda p: sum(s["bytes"] for s in hspack.open(p).shards)
    ratio = size(tmp_path / "all") / size(tmp_path / "exact")
    assert 0.45 < ratio < 0.6, ratio


def test_refusals_name_the_sample_field_and_fix(tmp_path):
    data = make_samples(2)
    bad = dict(data[1][1])
    aux = bad["aux_hidden_state"].clone()
    aux[4, 2, 7] = float("nan")
    bad["aux_hidden_state"] = aux
    with hspack.Writer(tmp_path / "q", schema(), create=True, durable=False, quantize="fp8") as w:
        with pytest.raises(hspack.HspackError, match=r"sample `bad`.*aux_hidden_state.*row 4.*unquantized"):
            w.append("bad", **bad)
        w.append("good", **data[1][1])
    assert len(hspack.open(tmp_path / "q")) == 1
    with pytest.raises(hspack.HspackError, match="no field `nope`"):
        hspack.Writer(tmp_path / "x", schema(), create=True, quantize="fp8:nope")
    with pytest.raises(hspack.HspackError, match="only f16, bf16 and f32"):
        hspack.Writer(tmp_path / "y", schema(), create=True, quantize="fp8:input_ids")
    with pytest.raises(hspack.HspackError, match="fp8 is quantize"):
        hspack.Writer(tmp_path / "z", schema(), create=True, codec="fp8")
    # Resuming a quantized dataset needs the same option: the schemas differ otherwise.
    with pytest.raises(hspack.HspackError, match="schema"):
        hspack.Writer(tmp_path / "q", schema())


def test_compare_measures_the_error_per_layer(tmp_path):
    data = make_samples()
    write(tmp_path / "exact", data)
    write(tmp_path / "q", data, quantize="fp8")
    c = hspack.compare(tmp_path / "exact", tmp_path / "q")
    assert c["samples"] == len(data) and c["rows"] == sum(s["input_ids"].shape[0] for _, s in data)
    by = {(f["field"], f["layer"]): f for f in c["fields"]}
    assert set(by) == {("input_ids", None), ("loss_mask", None), ("aux_hidden_state", 1), ("aux_hidden_state", 3), ("aux_hidden_state", 5), ("hidden.7", 7)}
    assert by[("input_ids", None)]["differing"] == 0 and by[("input_ids", None)]["stored"] == "exact"
    for layer in LAYERS:
        f = by[("aux_hidden_state", layer)]
        # The same figures computed here from the tensors, layer by layer.
        a = torch.cat([s["aux_hidden_state"][:, LAYERS.index(layer)].double() for _, s in data])
        ds = hspack.open(tmp_path / "q")
        b = torch.cat([ds[i]["aux_hidden_state"][:, LAYERS.index(layer)].double() for i in range(len(ds))])
        assert f["stored"] == "fp8-e4m3fn" and f["values"] == a.numel()
        assert f["rel_l2"] == pytest.approx(((a - b).norm() / a.norm()).item(), rel=1e-9)
        assert f["max_abs"] == pytest.approx((a - b).abs().max().item())
        cos = torch.nn.functional.cosine_similarity(a, b, dim=1)
        assert f["cosine_min"] == pytest.approx(cos.min().item(), rel=1e-9)
        assert f["cosine_mean"] == pytest.approx(cos.mean().item(), rel=1e-9)
        assert 0.005 < f["rel_l2"] < 0.06 and f["cosine_min"] > 0.99
    assert hspack.compare(tmp_path / "q", tmp_path / "q")["fields"][2]["differing"] == 0


def test_capture_skip_never_turns_approximate_values_into_exact_ones(tmp_path):
    """A store reuses a recorded capture only where the reusing dataset stores each field as
    the recorded one does (or the recorded one holds it exactly): an exact run never takes
    a quantized sample; a quantized run takes a quantized one bit for bit, or an exact one
    and quantizes it."""
    store = tmp_path / "store"
    hspack.init_store(str(store))
    data = make_samples(4)
    config = {"model": "m", "engine": "test", "deterministic": True, "dtype": "bf16", "layers": LAYERS + [7], "fields": [f["name"] for f in schema()]}
    keys = [(k, hspack.capture_key(config, s["input_ids"])) for k, s in data]

    def run(name, **options):
        with hspack.Writer(store / name, schema(), create=True, durable=False, **options) as w:
            done, stale = w.reuse_captured(keys)
            for (k, s), d, (_, ck) in zip(data, done, keys):
                if not d:
                    w.append(k, capture_key=ck, **s)
        return done, stale

    assert run("q1", quantize="fp8") == ([False] * 4, 0)
    # The quantized capture is reused by a quantized run: the digest recorded is of what
    # reads back, so nothing counts as changed, and the bytes are the same.
    assert run("q2", quantize="fp8") == ([True] * 4, 0)
    q1, q2 = hspack.open(store / "q1"), hspack.open(store / "q2")
    for i in range(len(q1)):
        for name in ("aux_hidden_state", "hidden.7"):
            assert torch.equal(q1.quantized(i, name)["codes"].view(torch.uint8), q2.quantized(i, name)["codes"].view(torch.uint8))
            assert torch.equal(q1.quantized(i, name)["scales"], q2.quantized(i, name)["scales"])
    # An exact run runs everything again: no approximate value becomes an exact one.
    assert run("exact") == ([False] * 4, 0)
    exact = hspack.open(store / "exact")
    for i, (_, s) in enumerate(data):
        assert torch.equal(exact[i]["aux_hidden_state"].view(torch.int16), s["aux_hidden_state"].view(torch.int16))


def test_copies_stores_and_verify_keep_the_stored_codes(tmp_path):
    """A quantized dataset copied (`hspack.copy`), written into a store (`STORE/NAME`), and
    verified: the codes and scales are moved as stored, never decoded and quantized again."""
    data = make_samples()
    write(tmp_path / "q", data, quantize="fp8")
    assert hspack.verify(tmp_path / "q")["ok"]
    hspack.copy(tmp_path / "q", tmp_path / "copy")
    hspack.init_store(str(tmp_path / "store"))
    write(tmp_path / "store" / "q", data, quantize="fp8")
    a = hspack.open(tmp_path / "q")
    for other in (tmp_path / "copy", tmp_path / "store" / "q"):
        b = hspack.open(other)
        assert hspack.verify(other)["ok"] and b.schema == a.schema
        for i in range(len(a)):
            for name in ("aux_hidden_state", "hidden.7"):
                qa, qb = a.quantized(i, name), b.quantized(i, name)
                assert torch.equal(qa["codes"].view(torch.uint8), qb["codes"].view(torch.uint8))
                assert torch.equal(qa["scales"], qb["scales"])
    assert all(f["differing"] == 0 for f in hspack.compare(tmp_path / "q", tmp_path / "store" / "q")["fields"])


def test_an_infinite_relative_error_is_inf_not_none(tmp_path):
    """Against a reference of zeros the relative error is infinite: it came back as None (the
    JSON `null` serde writes for it), read as "not computed"."""
    schema = [hspack.token_ids(), hspack.hidden_state(2, 4, dtype="f32")]
    for name, value in (("zeros", 0.0), ("ones", 1.0)):
        with hspack.Writer(tmp_path / name, schema, durable=False) as w:
            w.append("a", input_ids=torch.arange(3, dtype=torch.int32), **{"hidden.2": torch.full((3, 4), value)})
    fields = {f["field"]: f for f in hspack.compare(tmp_path / "zeros", tmp_path / "ones")["fields"]}
    assert fields["hidden.2"]["rel_l2"] == float("inf") and fields["hidden.2"]["max_abs"] == 1.0
    assert fields["input_ids"]["rel_l2"] == 0.0
