"""The SGLang adapter against SGLang's own classes from the pinned wheel.

``test_sglang_static.py`` reads the wheel's source; this file imports it. The
wheel (``sglang_names.SGLANG_VERSION``, fetched by ``.ci/run``) is unpacked to
a temp dir and imported in a subprocess, so SGLang's process-wide state (its
runtime context, torch.distributed, registered ops) never reaches other tests.
The subprocess is this file run as a script; it records each check's outcome.

What is SGLang's own: ``ForwardMode``, ``ForwardBatch``, ``ServerArgs`` and its
resolution, ``publish``, the single-rank gloo process groups,
``register_forward_hooks`` (which resolves ``hspack.capture.sglang:hook_factory``),
``DeepseekV2Model.forward`` (its layer loop, residual stream, final norm and its
own ``layers_to_capture`` path through ``AuxHiddenStatePacker``) and ``RMSNorm``.
What is not: ``DeepseekV2Model.__init__`` builds attention and MoE kernels for a
GPU, so the decoder keeps SGLang's class and forward and gets tiny CPU layers
with ``DeepseekV2DecoderLayer.forward``'s signature; and ``sglang.Engine`` is a
double that schedules chunked prefill passes the way the scheduler describes
them to the model (real ``ForwardBatch`` objects).

Importing SGLang needs pure-Python packages beyond the hspack test set (listed
in ``.ci/run``'s pip line): a missing one skips here with its name, and fails
in CI (``CI`` set).
"""

import glob
import json
import os
import subprocess
import sys
import tempfile
import traceback
import zipfile
from types import SimpleNamespace

import pytest

from hspack.capture import sglang_names as names

#: Exit status of the subprocess when an SGLang import lacks a package.
_MISSING = 3


def _wheel():
    folder = os.path.join(tempfile.gettempdir(), f"hspack-sglang-wheel-{names.SGLANG_VERSION}")
    found = glob.glob(os.path.join(folder, f"sglang-{names.SGLANG_VERSION}-*.whl"))
    if found:
        return found[0]
    why = f"no sglang {names.SGLANG_VERSION} wheel in {folder}: .ci/run (or test_sglang_static.py) downloads it"
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Unpack the wheel, run every check in one subprocess, return {check: None or traceback}."""
    root = tmp_path_factory.mktemp("sglang")
    tree = root / "site"
    with zipfile.ZipFile(_wheel()) as z:
        z.extractall(tree, [n for n in z.namelist() if n.startswith("sglang/")])
    out = root / "results.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree)] + [p for p in [env.get("PYTHONPATH")] if p])
    proc = subprocess.run(
        [sys.executable, __file__, str(root / "work"), str(out)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    text = (proc.stdout + proc.stderr)[-6000:]
    if proc.returncode == _MISSING:
        why = f"SGLang {names.SGLANG_VERSION} does not import here: {proc.stdout.strip().splitlines()[-1]}"
        if os.environ.get("CI"):
            pytest.fail(why + "\n" + text)
        pytest.skip(why)
    assert proc.returncode == 0, f"the SGLang subprocess failed:\n{text}"
    return json.loads(out.read_text())


def _check(results, name):
    assert name in results, f"check {name} did not run"
    assert results[name] is None, results[name]


def test_forward_mode_is_partitioned_by_the_adapter(results):
    _check(results, "forward_mode")


def test_forward_batch_has_the_fields_the_adapter_reads(results):
    _check(results, "forward_batch")


def test_forward_signatures_are_the_ones_the_adapter_hooks(results):
    _check(results, "signatures")


def test_engine_args_resolve_to_eager_prefill_and_the_hook_loads(results):
    _check(results, "server_args")


def test_extract_through_engine_hook_equals_sglangs_own_capture(results):
    _check(results, "extract")


def test_extract_stores_the_dtype_sglang_runs_and_the_revision_given(results):
    _check(results, "extract_dtype")


def test_extract_names_the_prompts_the_engine_did_not_complete(results):
    _check(results, "extract_missing")


def test_engine_hook_refuses_prefill_cuda_graphs(results):
    _check(results, "refuse_graphs")


# ------------------------------------------------------------- the subprocess

H = 16
NUM_LAYERS = 4
LAYERS = [0, 2, NUM_LAYERS]
PROMPTS = {"a": [5, 6, 7, 8, 9, 10, 11], "b": [3, 4, 5, 6], "c": [20, 21, 22, 23, 24, 25, 26, 27, 28]}
#: Tokens per prefill pass in the engine double: requests are chunked across passes.
CHUNK = 6


def _model_dir(path):
    """A tiny DeepSeek-V3 config (what ServerArgs resolution and extract read) and a tokenizer."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import DeepseekV3Config, PreTrainedTokenizerFast

    cfg = DeepseekV3Config(
        vocab_size=64, hidden_size=H, intermediate_size=32, moe_intermediate_size=8,
        num_hidden_layers=NUM_LAYERS, num_attention_heads=2, num_key_value_heads=2,
        n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
        first_k_dense_replace=NUM_LAYERS, kv_lora_rank=8, q_lora_rank=8, qk_rope_head_dim=4,
        qk_nope_head_dim=4, v_head_dim=8, max_position_embeddings=64,
        architectures=["DeepseekV3ForCausalLM"],
    )
    cfg.dtype = torch.float32
    cfg.save_pretrained(path)
    tok = Tokenizer(models.WordLevel({"<pad>": 0, "hi": 1}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>").save_pretrained(path)
    return cfg


def _sglang():
    """SGLang's classes, imported from the unpacked wheel."""
    from sglang.srt import runtime_context
    from sglang.srt.distributed import parallel_state
    from sglang.srt.layers.aux_hidden_states import AuxHiddenStateList, AuxHiddenStatePacker
    from sglang.srt.layers.layer_boundary.residual import batch as residual_batch
    from sglang.srt.layers.layer_boundary.residual.add_norm import PLAIN_ADD
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.model_executor import cuda_graph_config
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
    from sglang.srt.model_executor.hook_manager import register_forward_hooks, resolve_callable
    from sglang.srt.models.deepseek_v2 import DeepseekV2DecoderLayer, DeepseekV2Model
    from sglang.srt.models.kimi_k25 import KimiK25ForConditionalGeneration
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.configs.model_config import ModelConfig

    return SimpleNamespace(**locals())


def _decoder_classes(sg):
    import torch
    from torch import nn

    class TinyLayer(nn.Module):
        """A decoder layer on CPU: the layer input is SGLang's residual stream after the
        previous layer's plain add, handed to the collector as the real layer's boundary does."""

        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(H, H)

        def forward(self, positions, hidden_states, forward_batch, zero_allocator,
                    gemm_output_zero_allocator=None, llama_4_scaling=None, prev_topk_indices=None,
                    captured_last_layer_outputs=None, next_full_attention_layer_id=None):
            stream = sg.residual_batch.stream_of(forward_batch)
            value, residual = stream.input(hidden_states)
            x = stream.write(value if residual is None else value + residual)
            if captured_last_layer_outputs is not None:
                captured_last_layer_outputs.capture(x, owned=False)
            return stream.record(torch.tanh(self.proj(x)), sg.PLAIN_ADD), None

    class TinyDecoder(sg.DeepseekV2Model):
        """SGLang's DeepseekV2Model and its forward; __init__ builds CPU parts only."""

        def __init__(self, vocab):
            nn.Module.__init__(self)
            self.config = None
            self.use_dsa = False
            self.first_k_dense_replace = NUM_LAYERS
            self.pp_group = sg.runtime_context.get_parallel().pp_group
            self.embed_tokens = nn.Embedding(vocab, H)
            self.layers = nn.ModuleList(TinyLayer() for _ in range(NUM_LAYERS))
            self.start_layer, self.end_layer = 0, NUM_LAYERS
            self.next_full_attention_layer_id = {i: i + 1 for i in range(NUM_LAYERS - 1)}
            self.norm = sg.RMSNorm(H, eps=1e-6)
            self.gemm_output_zero_allocator_size = 0
            self.layers_to_capture = []
            self.llama_4_scaling_config = None

    class TinyCausalLM(nn.Module):
        def __init__(self, vocab):
            super().__init__()
            self.model = TinyDecoder(vocab)

        def forward(self, input_ids, positions, forward_batch):
            return self.model(input_ids, positions, forward_batch)

    return TinyLayer, TinyCausalLM


def _publish(sg, **kwargs):
    """What a scheduler process does before it builds the model: resolve and publish the args."""
    args = sg.ServerArgs(device="cpu", **kwargs)
    sg.runtime_context.reset_context()
    sg.runtime_context.publish(args, role="test", ranks=sg.runtime_context.SpawnRanks(world_rank=0))
    ps = sg.parallel_state
    if ps._WORLD is not None:
        # Groups built by an earlier engine of this process: stamp them again, as
        # initialize_model_parallel does when it builds them.
        groups = {"world_group": ps._WORLD, "tp_group": ps._TP, "pp_group": ps._PP, "moe_ep_group": ps._MOE_EP,
                  "moe_dp_group": ps._MOE_DP, "moe_tp_group": ps._MOE_TP, "attn_tp_group": ps._ATTN_TP,
                  "attn_cp_group": ps._ATTN_CP, "shared_experts_tp_group": ps._SHARED_EXPERTS_TP, "dcp_group": ps._DCP}
        sg.runtime_context.get_parallel().override_permanently(**{k: g for k, g in groups.items() if g is not None})
    return args


def _process_groups(sg):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sg.parallel_state.init_distributed_environment(
        world_size=1, rank=0, local_rank=0, backend="gloo", distributed_init_method=f"tcp://127.0.0.1:{port}",
    )
    sg.parallel_state.initialize_model_parallel(backend="gloo")


def _batch(sg, mode, pieces):
    """A real ForwardBatch; pieces: (rid, token ids of the pass, prefix length)."""
    import torch

    ids = torch.tensor([t for _, toks, _ in pieces for t in toks], dtype=torch.long)
    pos = torch.cat([torch.arange(p, p + len(toks)) for _, toks, p in pieces])
    seq = [p + len(toks) for _, toks, p in pieces]
    return sg.ForwardBatch(
        forward_mode=mode, batch_size=len(pieces), input_ids=ids,
        req_pool_indices=torch.arange(len(pieces)), seq_lens=torch.tensor(seq),
        out_cache_loc=torch.arange(ids.numel()), seq_lens_sum=sum(seq), positions=pos,
        extend_seq_lens=torch.tensor([len(t) for _, t, _ in pieces]),
        extend_prefix_lens=torch.tensor([p for _, _, p in pieces]),
        extend_seq_lens_cpu=[len(t) for _, t, _ in pieces],
        extend_prefix_lens_cpu=[p for _, _, p in pieces],
        rids=[r for r, _, _ in pieces],
    ), ids, pos


def _engine_double(sg):
    import torch

    _, TinyCausalLM = _decoder_classes(sg)

    class Engine:
        """sglang.Engine for one CPU rank: the adapter's kwargs go through ServerArgs and
        publish, the hooks through register_forward_hooks as the model runner does after
        graph capture; generate runs chunked prefill passes with a decode pass between."""

        instances = []
        #: Layers SGLang's own capture path records in every pass, next to the hooks.
        layers_to_capture = []

        def __init__(self, **kwargs):
            self.args = _publish(sg, **kwargs)
            if sg.parallel_state._WORLD is None:
                _process_groups(sg)
            torch.manual_seed(0)
            # The dtype SGLang's own ModelConfig resolves from the config and the args.
            self.dtype = sg.ModelConfig.from_server_args(self.args).dtype
            self.model = TinyCausalLM(64).to(self.dtype).eval()
            self.model.model.layers_to_capture = list(self.layers_to_capture)
            sg.register_forward_hooks(self.model, sg.runtime_context.get_observability().forward_hooks)
            self.passes = []
            Engine.instances.append(self)

        def generate(self, input_ids, sampling_params, rid):
            assert sampling_params["max_new_tokens"] == 1
            queue = [[r, list(ids), 0] for r, ids in zip(rid, input_ids)]
            while queue:
                budget, pieces = CHUNK, []
                for req in queue:
                    if budget == 0:
                        break
                    r, ids, done = req
                    n = min(budget, len(ids) - done)
                    pieces.append((r, ids[done : done + n], done))
                    req[2] += n
                    budget -= n
                queue = [q for q in queue if q[2] < len(q[1])]
                self._run(sg.ForwardMode.EXTEND, pieces)
                # Rows a capture must not look at: one decode token per request of the pass.
                self._run(sg.ForwardMode.DECODE, [(r, [1], p + len(t)) for r, t, p in pieces])

        def _run(self, mode, pieces):
            fb, ids, pos = _batch(sg, mode, pieces)
            with torch.no_grad():
                out = self.model(ids, pos, fb)
            self.passes.append((mode.name, [(r, p, len(t)) for r, t, p in pieces], out))
            return out

        def shutdown(self):
            pass

    return Engine


def _check_forward_mode(sg):
    members = set(sg.ForwardMode.__members__)
    groups = set(names.MODES_CAPTURED) | set(names.MODES_IGNORED) | set(names.MODES_REFUSED)
    assert groups == members, f"unclassified: {sorted(members - groups)}, stale: {sorted(groups - members)}"
    # SGLang's own test for a non-speculative extend: every such mode carries prefill rows,
    # so the adapter captures or refuses it and never ignores it.
    check = getattr(sg.ForwardMode, names.MODE_CHECK)
    extend = {m.name for m in sg.ForwardMode if check(m)}
    assert extend == set(names.MODES_CAPTURED) | set(names.MODES_REFUSED), sorted(extend)
    from hspack.capture.sglang import mode_name

    assert mode_name(sg.ForwardMode.EXTEND) == "EXTEND"


def _check_forward_batch(sg):
    fb, _, _ = _batch(sg, sg.ForwardMode.EXTEND, [("r", [1, 2, 3], 0)])
    for f in names.BATCH_FIELDS:
        assert hasattr(fb, f), f"ForwardBatch has no {f}"
    assert fb.forward_mode is sg.ForwardMode.EXTEND and fb.rids == ["r"]
    assert fb.extend_seq_lens_cpu == [3] and fb.extend_prefix_lens_cpu == [0]
    assert fb.can_run_tbo is False


def _params(fn):
    import inspect

    return list(inspect.signature(fn).parameters)


def _check_signatures(sg):
    import inspect

    assert sg.DeepseekV2Model.__name__ == names.MODEL_CLASS
    got = _params(sg.DeepseekV2Model.forward)[1 : 1 + len(names.MODEL_FORWARD_ARGS)]
    assert tuple(got) == names.MODEL_FORWARD_ARGS, got
    layer = _params(sg.DeepseekV2DecoderLayer.forward)
    assert names.LAYER_CAPTURE_ARG in layer and "hidden_states" in layer
    TinyLayer, _ = _decoder_classes(sg)
    assert _params(TinyLayer.forward) == layer, "the tiny layer must take the real layer's arguments"
    for collector in (sg.AuxHiddenStateList, sg.AuxHiddenStatePacker):
        p = inspect.signature(getattr(collector, names.COLLECTOR_METHOD)).parameters
        assert p[names.COLLECTOR_OWNED_ARG].kind is inspect.Parameter.KEYWORD_ONLY, collector
    src = inspect.getsource(sg.KimiK25ForConditionalGeneration.__init__)
    assert f"self.{names.WRAPPER_LM} =" in src


def _check_server_args(sg, work):
    """The adapter's engine kwargs pass ServerArgs, resolve to eager prefill, and name a factory SGLang finds."""
    from hspack.capture.sglang import engine_args, hook_factory

    graphs = sg.cuda_graph_config
    _model_dir(os.path.join(work, "model"))
    args = _publish(sg, **engine_args(os.path.join(work, "model"), {"out": "unused"}))
    assert graphs.check_cuda_graph_backend(graphs.Phase.PREFILL, graphs.Backend.DISABLED)
    hooks = sg.runtime_context.get_observability().forward_hooks
    assert hooks == args.forward_hooks and len(hooks) == 1
    assert sg.resolve_callable(hooks[0]["hook_factory"]) is hook_factory


def _check_extract(sg, work):
    import torch

    import hspack
    import sglang
    from hspack.capture import CapturePoints
    from hspack.capture.sglang import _EngineHook, extract

    model = os.path.join(work, "model")
    data = os.path.join(work, "prompts.jsonl")
    with open(data, "w") as f:
        for k, ids in PROMPTS.items():
            f.write(json.dumps({"id": k, "input_ids": ids, "loss_mask": [0] + [1] * (len(ids) - 1)}) + "\n")
    out = os.path.join(work, "ds")
    points = CapturePoints.select(NUM_LAYERS, LAYERS)
    Engine = _engine_double(sg)
    # SGLang's own capture runs in the same passes: the hooks' collector forwards to it.
    Engine.layers_to_capture = list(points.layer_inputs)
    sglang.Engine = Engine
    # float32 as given: "auto" would run this float32 config in float16 (_check_extract_dtype).
    assert extract(model, data, LAYERS, out, batch_size=2, engine_extra={"dtype": "float32"}) == len(PROMPTS)
    (engine,) = Engine.instances
    hooks = [h for h in engine.model._forward_hooks.values() if isinstance(h, _EngineHook)]
    assert len(hooks) == 1 and hooks[0].capture is not None and hooks[0].sink is None, "the hook closed its writer"
    chunked = [p for mode, pieces, _ in engine.passes if mode == "EXTEND" for p in pieces if p[1] > 0]
    assert chunked, "the double ran no chunked prefill"

    # Per request, SGLang's rows of each pass (final norm, then the packed aux layers), in order.
    want = {k: {i: [] for i in points.ids} for k in PROMPTS}
    for mode, pieces, (final, aux) in engine.passes:
        if mode != "EXTEND":
            continue
        start = 0
        for rid, _, n in pieces:
            want[rid][NUM_LAYERS].append(final[start : start + n])
            for j, i in enumerate(points.layer_inputs):
                want[rid][i].append(aux[start : start + n, j * H : (j + 1) * H])
            start += n
    ds = hspack.open(out)
    assert sorted(ds.keys()) == sorted(PROMPTS)
    assert ds.capture["tool"] == "hspack.capture.sglang" and ds.capture["num_layers"] == NUM_LAYERS
    decoder = engine.model.model
    for k, ids in PROMPTS.items():
        got = ds.get(k)
        assert got["input_ids"].tolist() == ids
        assert got["loss_mask"].tolist() == [0] + [1] * (len(ids) - 1)
        # The request alone, under a rid the installed hooks count as foreign: equal up to
        # the float32 GEMM's dependence on how many rows a pass holds.
        final, aux = engine._run(sg.ForwardMode.EXTEND, [(f"ref-{k}", ids, 0)])
        alone = {i: aux[:, j * H : (j + 1) * H] for j, i in enumerate(points.layer_inputs)}
        alone[NUM_LAYERS] = final
        for i in points.ids:
            assert torch.equal(got[CapturePoints.field(i)], torch.cat(want[k][i])), (k, i)
            torch.testing.assert_close(got[CapturePoints.field(i)], alone[i], rtol=1e-5, atol=1e-6)
    assert hooks[0].capture.stitcher.foreign_rows == sum(map(len, PROMPTS.values()))
    assert hspack.verify(out)["ok"]
    decoder.layers_to_capture = []


def _check_extract_dtype(sg, work):
    """The schema holds the dtype SGLang runs the model in, not the config's: "auto" runs a
    float32 config in float16; the rows stored are the engine's own, bitwise; a `revision`
    among the engine args is the one the capture records."""
    import torch

    import hspack
    import sglang
    from hspack.capture import CapturePoints
    from hspack.capture.sglang import engine_dtype, extract

    model = os.path.join(work, "model")
    cfg = _model_dir(model)
    assert engine_dtype(cfg) == torch.float16 and engine_dtype(cfg, "bfloat16") == torch.bfloat16
    assert engine_dtype(cfg, "float") == torch.float32 and cfg.dtype == torch.float32
    Engine = _engine_double(sg)
    sglang.Engine = Engine
    out = os.path.join(work, "ds-auto")
    extract(model, os.path.join(work, "prompts.jsonl"), LAYERS, out, batch_size=3, engine_extra={"revision": "v1"})
    (engine,) = Engine.instances
    assert engine.dtype == torch.float16
    ds = hspack.open(out)
    assert ds.capture["dtype"] == "f16" and ds.capture["revision"] == "v1", ds.capture
    want = {k: [] for k in PROMPTS}
    for mode, pieces, final in engine.passes:
        if mode == "EXTEND":
            start = 0
            for rid, _, n in pieces:
                want[rid].append(final[start : start + n])
                start += n
    for k in PROMPTS:
        got = ds.get(k)[CapturePoints.field(NUM_LAYERS)]
        assert got.dtype == torch.float16 and torch.equal(got, torch.cat(want[k])), k


def _check_extract_reports_what_the_engine_left_out(sg, work):
    """An engine that completes none of the requests (each aborted, or its scheduler gone
    before the writer committed): extract names the prompts missing instead of reporting
    every prompt written."""
    import sglang
    from hspack.capture.sglang import extract

    class CompletesNothing:
        def __init__(self, **kwargs):
            pass

        def generate(self, input_ids, sampling_params, rid):
            pass

        def shutdown(self):
            pass

    engine, sglang.Engine = sglang.Engine, CompletesNothing
    try:
        extract(os.path.join(work, "model"), os.path.join(work, "prompts.jsonl"), LAYERS, os.path.join(work, "none"))
    except RuntimeError as e:
        assert "3 of the 3 prompts sent to the engine are not in the dataset (a, b, c)" in str(e), str(e)
    else:
        raise AssertionError("extract reported success for prompts the engine never completed")
    finally:
        sglang.Engine = engine


def _check_refuse_graphs(sg, work):
    from hspack.capture import UnsupportedSetup
    from hspack.capture.sglang import hook_factory

    graphs = sg.cuda_graph_config
    _publish(sg, model_path=os.path.join(work, "model"), cuda_graph_backend_prefill="breakable")
    assert not graphs.check_cuda_graph_backend(graphs.Phase.PREFILL, graphs.Backend.DISABLED), (
        "resolution turned prefill graphs off on CPU; this check needs another way to enable them"
    )
    try:
        hook_factory({})
    except UnsupportedSetup as e:
        assert "--cuda-graph-backend-prefill disabled" in str(e)
    else:
        raise AssertionError("hook_factory accepted prefill CUDA graphs")


def _main(work, out):
    os.makedirs(work, exist_ok=True)
    try:
        sg = _sglang()
    except ImportError as e:
        print(f"{type(e).__name__}: {e}")
        sys.exit(_MISSING)
    checks = [
        ("forward_mode", lambda: _check_forward_mode(sg)),
        ("forward_batch", lambda: _check_forward_batch(sg)),
        ("signatures", lambda: _check_signatures(sg)),
        ("server_args", lambda: _check_server_args(sg, work)),
        ("extract", lambda: _check_extract(sg, work)),
        ("extract_dtype", lambda: _check_extract_dtype(sg, work)),
        ("extract_missing", lambda: _check_extract_reports_what_the_engine_left_out(sg, work)),
        ("refuse_graphs", lambda: _check_refuse_graphs(sg, work)),
    ]
    results = {}
    for name, fn in checks:
        try:
            fn()
            results[name] = None
        except Exception:
            results[name] = traceback.format_exc()
    with open(out, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2])
