"""hspack.capture.sglang per-pass logic and hooks, with real torch and no SGLang.

Passes are described the way SGLang's ForwardBatch describes them: a forward
mode, per-request extend lengths and prefix lengths, request ids, positions,
and captured states packed along tokens.
"""

from enum import IntEnum, auto
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from hspack.capture import CapturePoints, MemorySink, RowMismatch, UnsupportedSetup
from hspack.capture import sglang_names as names
from hspack.capture.sglang import PrefillStitcher, SGLangCapture, check_engine_args, engine_args

H = 6
NUM_LAYERS = 5
POINTS = CapturePoints.select(NUM_LAYERS, [0, 2, 4])


class ForwardMode(IntEnum):
    """Same member names as SGLang's ForwardMode."""

    EXTEND = auto()
    DECODE = auto()
    MIXED = auto()
    IDLE = auto()
    TARGET_VERIFY = auto()
    DRAFT_EXTEND_V2 = auto()
    PREBUILT = auto()
    SPLIT_PREFILL = auto()
    DLLM_EXTEND = auto()


def full_rows(rid_index: int, length: int, layer_id: int) -> torch.Tensor:
    """Distinct, recognisable rows for (request, token, layer)."""
    t = torch.arange(length, dtype=torch.float32)[:, None]
    col = torch.arange(H, dtype=torch.float32)[None, :]
    return (rid_index * 1000 + layer_id * 100 + t + col / 10).to(torch.bfloat16)


PROMPTS = {f"r{k}": (list(range(10 * k, 10 * k + n)), [0] * 2 + [1] * (n - 2)) for k, n in enumerate([7, 4, 9])}


def index_of(rid: str) -> int:
    return int(rid[1:])


def make_pass(pieces, mode=ForwardMode.EXTEND):
    """pieces: list of (rid, start, length) -> on_forward kwargs with packed rows."""
    hidden = {
        i: torch.cat([full_rows(index_of(r), s + n, i)[s:] for r, s, n in pieces])
        for i in POINTS.ids
    }
    ids = torch.cat([torch.tensor(PROMPTS[r][0][s : s + n]) for r, s, n in pieces])
    pos = torch.cat([torch.arange(s, s + n) for r, s, n in pieces])
    return dict(
        forward_mode=mode,
        extend_seq_lens=[n for _, _, n in pieces],
        extend_prefix_lens=[s for _, s, _ in pieces],
        rids=[r for r, _, _ in pieces],
        hidden=hidden,
        input_ids=ids,
        positions=pos,
    )


def stitcher(tp_rank=0):
    sink = MemorySink(POINTS.schema(H, torch.bfloat16)) if tp_rank == 0 else None
    return PrefillStitcher(POINTS, PROMPTS, sink, tp_rank=tp_rank), sink


def check_sample(sink, rid):
    got = sink[rid]
    n = len(PROMPTS[rid][0])
    assert got["input_ids"].tolist() == PROMPTS[rid][0]
    assert got["loss_mask"].tolist() == PROMPTS[rid][1]
    for i in POINTS.ids:
        assert torch.equal(got[f"hidden.{i}"], full_rows(index_of(rid), n, i)), (rid, i)


def test_packed_batch_rows_go_to_the_right_request():
    st, sink = stitcher()
    written = st.on_forward(**make_pass([("r1", 0, 4), ("r0", 0, 7), ("r2", 0, 9)]))
    assert written == ["r1", "r0", "r2"] and st.complete
    for rid in PROMPTS:
        check_sample(sink, rid)


def test_chunked_prefill_is_stitched_across_passes():
    st, sink = stitcher()
    assert st.on_forward(**make_pass([("r0", 0, 3), ("r1", 0, 4)])) == ["r1"]
    assert st.on_forward(**make_pass([("r0", 3, 2), ("r2", 0, 5)])) == []
    assert st.on_forward(**make_pass([("r2", 5, 4), ("r0", 5, 2)])) == ["r2", "r0"]
    for rid in PROMPTS:
        check_sample(sink, rid)


def test_decode_verify_and_idle_passes_are_ignored():
    st, sink = stitcher()
    st.on_forward(**make_pass([("r0", 0, 3)]))
    for mode in (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.IDLE, ForwardMode.DRAFT_EXTEND_V2):
        # Shapes that would be wrong for an extend pass: they must not be looked at.
        bogus = make_pass([("r0", 3, 1)], mode=mode)
        assert st.on_forward(**bogus) == []
    assert len(sink) == 0 and st.ignored_passes == 4
    assert st.on_forward(**make_pass([("r0", 3, 4)])) == ["r0"]
    check_sample(sink, "r0")


def test_prefix_cache_hit_is_refused():
    st, _ = stitcher()
    with pytest.raises(UnsupportedSetup, match="--disable-radix-cache"):
        st.on_forward(**make_pass([("r2", 4, 5)]))


def test_refused_and_unknown_modes():
    st, _ = stitcher()
    with pytest.raises(UnsupportedSetup, match="enable-mixed-chunk"):
        st.on_forward(**make_pass([("r0", 0, 7)], mode=ForwardMode.MIXED))
    with pytest.raises(UnsupportedSetup, match="unknown forward mode 'NEW_MODE'"):
        st.on_forward(**make_pass([("r0", 0, 7)], mode="NEW_MODE"))


def test_tp_rank_other_than_zero_writes_nothing():
    st, _ = stitcher(tp_rank=1)
    assert st.on_forward(**make_pass([("r0", 0, 7), ("r1", 0, 4)])) == []
    assert not st.pending and not st.done


def test_rows_that_do_not_line_up_are_refused():
    st, _ = stitcher()
    p = make_pass([("r0", 0, 7), ("r1", 0, 4)])
    p["extend_seq_lens"] = [6, 4]
    with pytest.raises(RowMismatch, match="add up to 10"):
        st.on_forward(**p)
    p = make_pass([("r0", 0, 7), ("r1", 0, 4)])
    p["rids"] = ["r1", "r0"]
    with pytest.raises(RowMismatch, match="exceed its 4 prompt tokens"):
        st.on_forward(**p)
    p = make_pass([("r0", 0, 4), ("r1", 0, 4)])
    p["rids"] = ["r1", "r0"]
    with pytest.raises(RowMismatch, match="token ids differ"):
        st.on_forward(**p)
    p = make_pass([("r0", 0, 7)])
    p["positions"] = p["positions"] + 1
    with pytest.raises(RowMismatch, match="positions"):
        st.on_forward(**p)
    st.on_forward(**make_pass([("r0", 0, 3)]))
    with pytest.raises(RowMismatch, match="starts at 4, 3 rows are held"):
        st.on_forward(**make_pass([("r0", 4, 3)]))


def test_foreign_requests_and_restarts():
    st, sink = stitcher()
    p = make_pass([("r0", 0, 3)])
    p["rids"] = ["health-check"]
    st.on_forward(**p)
    assert st.foreign_rows == 3 and not st.pending
    st.on_forward(**make_pass([("r0", 0, 3)]))
    st.on_forward(**make_pass([("r0", 0, 7)]))  # retracted and prefilled again from zero
    assert st.restarts == 1
    check_sample(sink, "r0")
    with pytest.raises(RowMismatch, match="prefilled again"):
        st.on_forward(**make_pass([("r0", 0, 7)]))


# ------------------------------------------------- hooks on an SGLang-shaped model


class FakeLayer(nn.Module):
    """Mimics DeepseekV2DecoderLayer: the layer input is hidden + residual, handed to the collector."""

    def __init__(self, k):
        super().__init__()
        self.k = k

    def forward(self, positions, hidden_states, forward_batch, zero_allocator, gemm=None, scaling=None,
                prev_topk_indices=None, captured_last_layer_outputs=None, next_full_attention_layer_id=None):
        stream = forward_batch.residual_stream
        stream["residual"] = stream["residual"] + hidden_states if stream["residual"] is not None else hidden_states
        if captured_last_layer_outputs is not None:
            captured_last_layer_outputs.capture(stream["residual"], owned=False)
        return (torch.tanh(stream["residual"] * (1 + self.k / 10)), None)


class FakeModel(nn.Module):
    """Mimics DeepseekV2Model's loop, including its own layers_to_capture path."""

    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(100, H)
        self.layers = nn.ModuleList(FakeLayer(k) for k in range(NUM_LAYERS))
        self.norm = nn.LayerNorm(H)
        self.layers_to_capture = []

    def forward(self, input_ids, positions, forward_batch, input_embeds=None, pp_proxy_tensors=None):
        forward_batch.residual_stream = {"residual": None}
        hidden = self.embed_tokens(input_ids)
        aux = []
        for i, layer in enumerate(self.layers):
            hidden, _ = layer(positions, hidden, forward_batch, None, None, None,
                              captured_last_layer_outputs=_ListCollector(aux) if i in self.layers_to_capture else None)
        out = self.norm(forward_batch.residual_stream["residual"] + hidden)
        return (out, aux) if self.layers_to_capture else out


class _ListCollector:
    def __init__(self, out):
        self.out = out

    def capture(self, hidden, owned=False):
        self.out.append(hidden.clone())


class Wrapper(nn.Module):
    """Mimics KimiK25ForConditionalGeneration -> DeepseekV3ForCausalLM -> DeepseekV2Model."""

    def __init__(self):
        super().__init__()
        self.vision_tower = nn.Linear(2, 2)
        self.language_model = nn.Module()
        self.language_model.model = FakeModel()

    def forward(self, input_ids, positions, forward_batch):
        return self.language_model.model(input_ids, positions, forward_batch)


def fake_batch(mode, pieces):
    return SimpleNamespace(
        forward_mode=mode,
        extend_seq_lens_cpu=[n for _, _, n in pieces],
        extend_prefix_lens_cpu=[s for _, s, _ in pieces],
        rids=[r for r, _, _ in pieces],
        can_run_tbo=False,
    )


def run_pass(model, pieces, mode=ForwardMode.EXTEND):
    ids = torch.cat([torch.tensor(PROMPTS[r][0][s : s + n]) for r, s, n in pieces])
    pos = torch.cat([torch.arange(s, s + n) for r, s, n in pieces])
    with torch.no_grad():
        return model(ids, pos, fake_batch(mode, pieces))


def reference(model, rid):
    """The request run alone through the model's own layers_to_capture path."""
    dec = model.language_model.model
    dec.layers_to_capture = list(POINTS.layer_inputs)
    try:
        out, aux = run_pass(model, [(rid, 0, len(PROMPTS[rid][0]))])
    finally:
        dec.layers_to_capture = []
    return dict(zip(POINTS.layer_inputs, aux)) | {NUM_LAYERS: out}


def test_hooks_capture_layer_inputs_and_final_norm_through_a_wrapper():
    torch.manual_seed(0)
    model = Wrapper().eval()
    sink = MemorySink(POINTS.schema(H, torch.float32))
    st = PrefillStitcher(POINTS, PROMPTS, sink)
    cap = SGLangCapture(model, st).install()
    assert cap.decoder.path == "language_model.model"
    run_pass(model, [("r0", 0, 4), ("r1", 0, 4)])
    run_pass(model, [("r0", 0, 1)], mode=ForwardMode.DECODE)
    run_pass(model, [("r0", 4, 3), ("r2", 0, 9)])
    assert sorted(sink) == ["r0", "r1", "r2"]
    cap.remove()
    assert not model.language_model.model.layers[2]._forward_pre_hooks
    for rid in PROMPTS:
        ref = reference(model, rid)
        for i in POINTS.ids:
            assert torch.equal(sink[rid][f"hidden.{i}"], ref[i]), (rid, i)


def test_hooks_forward_to_an_existing_collector():
    torch.manual_seed(0)
    model = Wrapper().eval()
    dec = model.language_model.model
    points = CapturePoints.select(NUM_LAYERS, [2])
    sink = MemorySink()
    SGLangCapture(model, PrefillStitcher(points, PROMPTS, sink)).install()
    dec.layers_to_capture = [2]
    out, aux = run_pass(model, [("r1", 0, 4)])
    assert len(aux) == 1 and torch.equal(aux[0], sink["r1"]["hidden.2"])


def test_engine_args_are_checked():
    kwargs = engine_args("m", {"plan": "p"}, tp_size=2)
    assert kwargs["disable_radix_cache"] is True and kwargs["cuda_graph_backend_prefill"] == "disabled"
    assert kwargs["forward_hooks"][0]["hook_factory"] == "hspack.capture.sglang:hook_factory"
    for bad, flag in [
        ({"disable_radix_cache": False}, "--disable-radix-cache"),
        ({"enable_two_batch_overlap": True}, "two-batch-overlap"),
        ({"cuda_graph_backend_prefill": "breakable"}, "cuda-graph-backend-prefill disabled"),
        ({"cuda_graph_config": {"prefill": {"backend": "full"}}}, "cuda-graph-backend-prefill disabled"),
        ({"attn_dp_size": 2}, "DP attention"),
        ({"enable_dp_attention": True}, "DP attention"),
    ]:
        with pytest.raises(UnsupportedSetup, match=flag):
            engine_args("m", {}, **bad)
    check_engine_args({"tp_size": 8})


def test_modes_are_partitioned_once():
    groups = [set(names.MODES_CAPTURED), set(names.MODES_IGNORED), set(names.MODES_REFUSED)]
    assert sum(len(g) for g in groups) == len(set().union(*groups))
    assert set().union(*groups) == set(ForwardMode.__members__)


def test_stacked_points_store_the_auxiliary_layers_in_one_field():
    """With `stack=True` the stitched rows of every id but the last go into one
    `aux_hidden_state [T, k, H]` field, checked against the schema by the sink."""
    points = CapturePoints.select(NUM_LAYERS, [0, 2, 4], stack=True)
    sink = MemorySink(points.schema(H, torch.bfloat16))
    st = PrefillStitcher(points, PROMPTS, sink, tp_rank=0)
    st.on_forward(**make_pass([("r0", 0, 3), ("r1", 0, 4)]))
    st.on_forward(**make_pass([("r0", 3, 4), ("r2", 0, 9)]))
    assert st.complete
    *aux, last = points.ids
    for rid in PROMPTS:
        got, n = sink[rid], len(PROMPTS[rid][0])
        assert set(got) == {"input_ids", "loss_mask", "aux_hidden_state", f"hidden.{last}"}
        want = torch.stack([full_rows(index_of(rid), n, i) for i in aux], 1)
        assert torch.equal(got["aux_hidden_state"], want), rid
        assert torch.equal(got[f"hidden.{last}"], full_rows(index_of(rid), n, last)), rid


@pytest.mark.parametrize("mode", [*names.MODES_REFUSED, "NEW_MODE"])
def test_hooks_refuse_passes_of_refused_and_unknown_modes(mode):
    """A prefill pass the adapter does not capture (mixed chunk, split prefill, a mode of a
    newer SGLang) reaches the stitcher's refusal through the installed hooks: nothing is
    dropped silently."""
    torch.manual_seed(0)
    model = Wrapper().eval()
    sink = MemorySink(POINTS.schema(H, torch.float32))
    st = PrefillStitcher(POINTS, PROMPTS, sink)
    SGLangCapture(model, st).install()
    mode = getattr(ForwardMode, mode, mode)
    with pytest.raises(UnsupportedSetup, match="forward mode"):
        run_pass(model, [("r1", 0, 4)], mode=mode)
    assert len(sink) == 0 and not st.pending
    # Ignored modes still pass untouched, and the next extend pass is captured.
    run_pass(model, [("r1", 0, 1)], mode=ForwardMode.DECODE)
    run_pass(model, [("r1", 0, 4)])
    assert sorted(sink) == ["r1"]


class CaptureOutputLayer(nn.Module):
    """SGLang's LlamaDecoderLayer.forward signature: a collector passed as `capture_output`."""

    def forward(self, positions, hidden_states, forward_batch, capture_output=None):
        return hidden_states


class LlamaLikeModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(100, H)
        self.layers = nn.ModuleList(CaptureOutputLayer() for _ in range(NUM_LAYERS))
        self.norm = nn.LayerNorm(H)
        self.layers_to_capture = []

    def forward(self, input_ids, positions, forward_batch):
        h = self.embed_tokens(input_ids)
        for layer in self.layers:
            h = layer(positions, h, forward_batch, capture_output=None)
        return self.norm(h)


def test_install_refuses_layers_that_take_no_collector():
    """A decoder whose layers take no `captured_last_layer_outputs` (SGLang's Llama and Qwen
    take `capture_output=`) is refused at install, naming the class, not with a TypeError
    in the first pass; final-norm-only capture hooks no layer and installs."""
    model = LlamaLikeModel()
    cap = SGLangCapture(model, PrefillStitcher(POINTS, PROMPTS, MemorySink()))
    with pytest.raises(UnsupportedSetup, match=r"CaptureOutputLayer, whose forward takes no "
                                               r"'captured_last_layer_outputs'.*DeepseekV2DecoderLayer"):
        cap.install()
    assert not model.layers[0]._forward_pre_hooks and not model._forward_pre_hooks
    final_only = CapturePoints.select(NUM_LAYERS, [NUM_LAYERS])
    sink = MemorySink()
    SGLangCapture(model, PrefillStitcher(final_only, PROMPTS, sink)).install()
    run_pass(model, [("r1", 0, 4)])
    assert sorted(sink) == ["r1"]


def test_the_capture_key_names_engine_arguments_that_change_the_numbers():
    """A capture run with quantization, an fp8 KV cache or tensor parallelism is never reused
    for one without (the key named only the dtype and deterministic inference)."""
    from hspack.capture.sglang import engine_key

    assert engine_key({}) == "sglang" == engine_key({"revision": "v1", "dtype": "bfloat16", "log_level": "error"})
    quantized = engine_key({"quantization": "fp8", "kv_cache_dtype": "fp8_e4m3"})
    assert quantized != "sglang" and quantized == engine_key({"kv_cache_dtype": "fp8_e4m3", "quantization": "fp8"})
    assert "fp8_e4m3" in quantized
    assert engine_key({}, tp_size=2) not in ("sglang", quantized)
