"""Capturing hidden states from SGLang prefill passes.

Convention: SGLang's ``layers_to_capture`` entry ``i`` stores the INPUT to
decoder layer ``i``, i.e. ``hidden_states + residual`` at the top of layer
``i``'s iteration, which equals Hugging Face ``hidden_states[i]`` (id 0 =
embedding output). The final state is the output of the model's final norm
(Hugging Face ``hidden_states[-1]``), stored under id ``num_layers`` with point
``final_norm``. Every id and its point are recorded in the schema roles.

Three parts:

* ``PrefillStitcher``: the per-forward-pass logic, free of SGLang. It takes a
  pass's forward mode, ``extend_seq_lens``, ``extend_prefix_lens``, request ids
  and the captured states packed along tokens; it captures plain ``EXTEND``
  passes only, splits the packed rows per request, stitches chunked-prefill
  pieces in order, writes complete requests from TP rank 0, and refuses what it
  cannot capture faithfully (prefix-cache hits, unknown modes, rows that do not
  line up).
* ``SGLangCapture``: installs hooks on the core ``DeepseekV2Model``-style
  decoder (found through wrappers such as ``KimiK25ForConditionalGeneration``'s
  ``language_model``). For each selected layer a forward pre-hook passes a
  collector as the layer's ``captured_last_layer_outputs`` argument, the same
  path SGLang's ``layers_to_capture`` uses, so the recorded value is SGLang's own
  ``hidden_states + residual``; a forward hook on the decoder reads the
  final-norm output and hands the pass to the stitcher.
* ``extract``: an offline driver running ``sglang.Engine`` over a prompt file
  with the radix cache and prefill CUDA graphs off and ``max_new_tokens=1``;
  the engine loads the hooks in its scheduler processes through its
  ``forward_hooks`` server argument (``hook_factory``).

Refused setups raise ``UnsupportedSetup`` naming the flag to change: the radix
(prefix) cache, two-batch overlap, prefill CUDA graphs (piecewise/breakable or
full: replays never run Python hooks), DP attention, mixed chunks, pipeline
parallelism and speculative decoding.

Command line::

    python -m hspack.capture.sglang extract --model PATH --data prompts.jsonl \\
        --layers 2,30,58,60 --out DS [--tp-size N --max-len N --batch-size N]
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from . import sglang_names as names
from .decoder import Decoder, find_decoder
from .errors import CaptureError, RowMismatch, UnsupportedSetup, command_errors
from .points import CapturePoints, capture_metadata, config_hash, model_shape, parse_layers
from .prompts import check_batching, check_prompts, read_samples
from .reuse import CaptureCounts, capture_config, model_revision, plan
from .sink import Sink
from .split import split_packed

__all__ = [
    "PrefillStitcher",
    "SGLangCapture",
    "check_engine_args",
    "engine_args",
    "engine_dtype",
    "extract",
    "hook_factory",
    "main",
]


def mode_name(mode) -> str:
    """The member name of a ``ForwardMode`` (or a plain string)."""
    return mode if isinstance(mode, str) else getattr(mode, "name", str(mode))


def ignored_mode(mode) -> bool:
    """Whether passes of ``mode`` carry no prefill rows (decode, idle, ...) and are let
    through unlooked-at. Every other mode is captured or refused by
    ``PrefillStitcher.on_forward``, an unknown one too."""
    return mode_name(mode) in names.MODES_IGNORED


@dataclass
class _Pending:
    pieces: Dict[int, List[torch.Tensor]] = field(default_factory=dict)
    length: int = 0


class PrefillStitcher:
    """Turns a stream of forward passes into complete samples in a sink.

    ``requests`` maps each request id (the sample key) to its ``(input_ids,
    loss_mask)``; a request is complete when that many rows were captured.
    Rows of request ids not in ``requests`` are not ours (for example a health
    check) and are counted in ``foreign_rows``. On TP ranks other than 0 nothing
    is kept or written.

    Chunked prefill shows up as passes whose ``extend_prefix_lens`` entry is
    non-zero: when it equals the rows already held for that request, the piece
    continues it; when nothing is held, the prefix came from the cache and the
    pass is refused. A zero prefix for a request with held pieces means SGLang
    retracted and restarted it: the held pieces are dropped and it starts over.
    """

    def __init__(
        self,
        points: CapturePoints,
        requests: Mapping[str, Tuple[Sequence[int], Sequence[int]]],
        sink: Optional[Sink],
        tp_rank: int = 0,
    ) -> None:
        self.points = points
        self.requests = {
            str(k): (torch.as_tensor(ids, dtype=torch.long), torch.as_tensor(mask, dtype=torch.long))
            for k, (ids, mask) in requests.items()
        }
        self.sink = sink
        self.tp_rank = int(tp_rank)
        if self.tp_rank == 0 and sink is None:
            raise ValueError("TP rank 0 writes the samples and needs a sink")
        self.pending: Dict[str, _Pending] = {}
        self.done: set = set()
        self.foreign_rows = 0
        self.ignored_passes = 0
        self.restarts = 0

    @property
    def complete(self) -> bool:
        """Whether every planned request was written."""
        return len(self.done) == len(self.requests)

    def on_forward(
        self,
        forward_mode,
        extend_seq_lens: Sequence[int],
        extend_prefix_lens: Sequence[int],
        rids: Sequence[str],
        hidden: Mapping[int, torch.Tensor],
        *,
        input_ids: Optional[torch.Tensor] = None,
        positions: Optional[torch.Tensor] = None,
    ) -> List[str]:
        """Take one forward pass; return the keys written by it."""
        name = mode_name(forward_mode)
        if ignored_mode(forward_mode):
            self.ignored_passes += 1
            return []
        if name in names.MODES_REFUSED:
            raise UnsupportedSetup(f"forward mode {name}: {names.MODES_REFUSED[name]}")
        if name not in names.MODES_CAPTURED:
            raise UnsupportedSetup(
                f"unknown forward mode {name!r}; this adapter was checked against SGLang "
                f"{names.SGLANG_VERSION}; classify the mode in hspack.capture.sglang_names"
            )
        if self.tp_rank != 0:
            return []
        return self._extend(extend_seq_lens, extend_prefix_lens, rids, hidden, input_ids, positions)

    def _extend(self, seq_lens, prefix_lens, rids, hidden, input_ids, positions) -> List[str]:
        seq_lens = [int(n) for n in seq_lens]
        prefix_lens = [int(n) for n in prefix_lens]
        rids = [str(r) for r in rids]
        if not (len(seq_lens) == len(prefix_lens) == len(rids)):
            raise RowMismatch(
                f"{len(rids)} request ids, {len(seq_lens)} extend lengths and "
                f"{len(prefix_lens)} prefix lengths in one pass"
            )
        if len(set(rids)) != len(rids):
            raise RowMismatch(f"a request id occurs twice in one pass: {rids}")
        missing = [i for i in self.points.ids if i not in hidden]
        if missing:
            raise RowMismatch(f"the pass carries no rows for layer ids {missing}")
        total = sum(seq_lens)
        # One device-to-host copy per layer, then views per request.
        packed = {i: hidden[i].detach().to("cpu") for i in self.points.ids}
        pieces = {i: split_packed(t, seq_lens) for i, t in packed.items()}
        for i, t in packed.items():
            if t.dim() != 2:
                raise RowMismatch(f"layer id {i}: expected [tokens, hidden], got {tuple(t.shape)}")
        ids_pieces = None
        if input_ids is not None:
            ids_pieces = split_packed(input_ids.detach().to("cpu").long().flatten(), seq_lens)
        if positions is not None and positions.dim() == 1:
            want = torch.cat(
                [torch.arange(p, p + n, dtype=torch.long) for p, n in zip(prefix_lens, seq_lens)]
            ) if total else torch.zeros(0, dtype=torch.long)
            if not torch.equal(positions.detach().to("cpu").long(), want):
                raise RowMismatch("positions do not match extend_prefix_lens/extend_seq_lens")
        written = []
        for j, (rid, n, prefix) in enumerate(zip(rids, seq_lens, prefix_lens)):
            if rid not in self.requests:
                self.foreign_rows += n
                continue
            if rid in self.done:
                raise RowMismatch(f"request {rid!r} was prefilled again after its sample was written")
            ids, mask = self.requests[rid]
            state = self.pending.get(rid)
            held = state.length if state else 0
            if prefix == 0 and held:
                self.restarts += 1
                state, held = None, 0
            if prefix and not held:
                raise UnsupportedSetup(
                    f"request {rid!r} starts at prefix {prefix} that this capture never saw: "
                    "a prefix-cache hit; launch with --disable-radix-cache (and no hierarchical cache)"
                )
            if prefix != held:
                raise RowMismatch(f"request {rid!r}: piece starts at {prefix}, {held} rows are held")
            if prefix + n > ids.numel():
                raise RowMismatch(
                    f"request {rid!r}: rows up to {prefix + n} exceed its {ids.numel()} prompt tokens"
                )
            if ids_pieces is not None and not torch.equal(ids_pieces[j], ids[prefix : prefix + n]):
                raise RowMismatch(f"request {rid!r}: the pass's token ids differ from the prompt's")
            state = state or _Pending()
            for i in self.points.ids:
                state.pieces.setdefault(i, []).append(pieces[i][j])
            state.length = prefix + n
            self.pending[rid] = state
            if state.length == ids.numel():
                hidden_rows = {i: torch.cat(p, 0) for i, p in state.pieces.items()}
                self.sink.append(rid, **self.points.sample(ids, mask, hidden_rows, key=rid))
                del self.pending[rid]
                self.done.add(rid)
                written.append(rid)
        return written


class _Collector:
    """Stands in for SGLang's aux-hidden collector; keeps a copy and forwards to the original."""

    def __init__(self, store: Dict[int, torch.Tensor], layer_id: int, inner) -> None:
        self.store, self.layer_id, self.inner = store, layer_id, inner

    def capture(self, hidden: torch.Tensor, *, owned: bool = False) -> None:
        if self.layer_id in self.store:
            raise RowMismatch(f"layer {self.layer_id} captured twice in one pass")
        self.store[self.layer_id] = hidden if owned and self.inner is None else hidden.clone()
        if self.inner is not None:
            self.inner.capture(hidden, **{names.COLLECTOR_OWNED_ARG: owned})

    def append(self, hidden: torch.Tensor) -> None:
        self.capture(hidden, owned=False)


def _is_sglang_decoder(module: nn.Module) -> bool:
    return (
        isinstance(getattr(module, names.MODEL_LAYERS, None), nn.ModuleList)
        and isinstance(getattr(module, names.MODEL_NORM, None), nn.Module)
        and hasattr(module, names.MODEL_CAPTURE_LIST)
    )


def _check_layer(layer: nn.Module, layer_id: int) -> None:
    """Refuses a decoder layer whose forward takes no ``names.LAYER_CAPTURE_ARG`` (nor
    ``**kwargs``): the hooks hand it the collector through that keyword. SGLang's Llama and
    Qwen decoder layers, for one, take ``capture_output=`` instead."""
    try:
        params = inspect.signature(layer.forward).parameters.values()
    except (TypeError, ValueError):
        return  # no signature to read (a compiled forward): the call itself will tell
    if any(p.name == names.LAYER_CAPTURE_ARG or p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    raise UnsupportedSetup(
        f"decoder layer {layer_id} is a {type(layer).__name__}, whose forward takes no "
        f"{names.LAYER_CAPTURE_ARG!r} argument: the SGLang capture supports the decoders of "
        f"SGLang {names.SGLANG_VERSION}'s {names.MODEL_CLASS} family (layers like {names.LAYER_CLASS}: "
        f"DeepSeek-V2/V3, Kimi-K2.5); capture this model with hspack.capture.hf instead"
    )


def _arg(args: tuple, kwargs: dict, name: str):
    if name in kwargs:
        return kwargs[name]
    idx = names.MODEL_FORWARD_ARGS.index(name)
    if idx < len(args):
        return args[idx]
    raise UnsupportedSetup(f"{names.MODEL_CLASS}.forward was called without {name!r}")


class SGLangCapture:
    """Hooks on an SGLang model that feed each forward pass to a ``PrefillStitcher``."""

    def __init__(self, root: nn.Module, stitcher: PrefillStitcher) -> None:
        self.stitcher = stitcher
        self.decoder: Decoder = find_decoder(root, accept=_is_sglang_decoder)
        if self.decoder.num_layers != stitcher.points.num_layers:
            raise UnsupportedSetup(
                f"decoder {self.decoder.path!r} has {self.decoder.num_layers} layers, "
                f"the capture was planned for {stitcher.points.num_layers}"
            )
        self._rows: Dict[int, torch.Tensor] = {}
        self._batch = None
        self._handles: list = []

    @classmethod
    def on_decoder(cls, decoder: nn.Module, stitcher: PrefillStitcher) -> "SGLangCapture":
        """Install on an already located decoder module."""
        return cls(decoder, stitcher).install()

    def install(self) -> "SGLangCapture":
        """Hook the decoder and the selected layers; ``UnsupportedSetup`` for a layer that
        takes no collector (``names.LAYER_CAPTURE_ARG``), which the hooks could not drive."""
        if self._handles:
            return self
        if self.stitcher.tp_rank != 0:
            return self  # other ranks compute the same rows; rank 0 writes them
        for i in self.stitcher.points.layer_inputs:
            _check_layer(self.decoder.layers[i], i)
        m = self.decoder.module
        self._handles.append(m.register_forward_pre_hook(self.begin, with_kwargs=True))
        self._handles.append(m.register_forward_hook(self.end, with_kwargs=True))
        for i in self.stitcher.points.layer_inputs:
            self._handles.append(
                self.decoder.layers[i].register_forward_pre_hook(self._layer_hook(i), with_kwargs=True)
            )
        return self

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def begin(self, module, args, kwargs):
        """Pre-hook on the decoder: decide whether this pass is looked at. Every pass but
        those of an ignored mode is, so that ``end`` hands it to the stitcher, which
        captures it or refuses its mode."""
        batch = _arg(args, kwargs, "forward_batch")
        self._rows = {}
        self._batch = None
        if ignored_mode(getattr(batch, "forward_mode")):
            return None
        if getattr(batch, "can_run_tbo", False):
            raise UnsupportedSetup("two-batch overlap splits prefill passes; drop --enable-two-batch-overlap")
        self._batch = batch
        return None

    def _layer_hook(self, layer_id: int):
        def hook(module, args, kwargs):
            if self._batch is None:
                return None
            # The loop passes six arguments positionally and the collector by keyword.
            if len(args) > 7:
                raise UnsupportedSetup(
                    f"{names.LAYER_CLASS} received {names.LAYER_CAPTURE_ARG} positionally; "
                    "this SGLang version is not supported"
                )
            inner = kwargs.get(names.LAYER_CAPTURE_ARG)
            kwargs = dict(kwargs)
            kwargs[names.LAYER_CAPTURE_ARG] = _Collector(self._rows, layer_id, inner)
            return args, kwargs

        return hook

    def end(self, module, args, kwargs, output):
        """Hook on the decoder's output: take the final-norm rows and hand the pass on."""
        batch, self._batch = self._batch, None
        if batch is None:
            return None
        final = output[0] if isinstance(output, (tuple, list)) else output
        if not isinstance(final, torch.Tensor):
            raise UnsupportedSetup("the decoder returned no tensor; pipeline parallelism is not supported")
        rows, self._rows = self._rows, {}
        if self.stitcher.points.final_norm:
            rows[self.stitcher.points.num_layers] = final
        positions = _arg(args, kwargs, "positions")
        input_ids = _arg(args, kwargs, "input_ids")
        self.stitcher.on_forward(
            batch.forward_mode,
            batch.extend_seq_lens_cpu,
            batch.extend_prefix_lens_cpu,
            batch.rids,
            rows,
            input_ids=input_ids,
            positions=positions if isinstance(positions, torch.Tensor) else None,
        )
        return None


# ---------------------------------------------------------------- engine side

_REQUIRED_ARGS = {
    "disable_radix_cache": (True, "--disable-radix-cache: a prefix-cache hit skips the prefix's rows"),
    "enable_two_batch_overlap": (False, "drop --enable-two-batch-overlap: it splits prefill passes"),
    "cuda_graph_backend_prefill": (
        "disabled",
        "--cuda-graph-backend-prefill disabled: prefill CUDA graphs (piecewise/breakable or full) "
        "replay without running Python hooks",
    ),
    "enable_mixed_chunk": (False, "drop --enable-mixed-chunk: mixed passes are not captured"),
    "enable_dp_attention": (False, "drop --enable-dp-attention: DP attention scatters rows across ranks"),
    "attn_dp_size": (1, "drop --attn-dp-size: DP attention scatters rows across ranks"),
    "pp_size": (1, "use --pp-size 1: the final norm runs on the last stage only"),
    "dp_size": (1, "use --dp-size 1: each data-parallel replica's writer would see only its part of the prompts"),
    "speculative_algorithm": (None, "drop --speculative-algorithm: draft passes share the hooks"),
}


def check_engine_args(kwargs: Mapping) -> None:
    """Refuse engine arguments under which the capture would be wrong."""
    for key, (want, why) in _REQUIRED_ARGS.items():
        if key in kwargs and kwargs[key] != want:
            raise UnsupportedSetup(f"{key}={kwargs[key]!r} cannot be captured: {why}")
    cfg = kwargs.get("cuda_graph_config")
    if cfg:
        prefill = (json.loads(cfg) if isinstance(cfg, str) else cfg).get("prefill", {})
        if prefill.get("backend", "disabled") != "disabled":
            raise UnsupportedSetup(f"cuda_graph_config prefill={prefill}: {_REQUIRED_ARGS['cuda_graph_backend_prefill'][1]}")


def engine_args(model: str, hook_config: dict, tp_size: int = 1, **extra) -> dict:
    """Keyword arguments for ``sglang.Engine`` that make prefill capturable and load the hooks."""
    kwargs = {
        "model_path": model,
        "tp_size": tp_size,
        "disable_radix_cache": True,
        "enable_two_batch_overlap": False,
        "cuda_graph_backend_prefill": "disabled",
        "enable_mixed_chunk": False,
        "skip_tokenizer_init": True,
        "forward_hooks": [
            {
                "name": "hspack-capture",
                "target_modules": [""],
                "hook_factory": "hspack.capture.sglang:hook_factory",
                "config": hook_config,
            }
        ],
    }
    kwargs.update(extra)
    check_engine_args(kwargs)
    return kwargs


class _EngineHook:
    """Built in each scheduler process by ``hook_factory``; installs itself on the first decoder call."""

    def __init__(self, config: dict) -> None:
        from sglang.srt.distributed.parallel_state import get_tensor_model_parallel_rank
        from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, check_cuda_graph_backend

        if not check_cuda_graph_backend(Phase.PREFILL, Backend.DISABLED):
            raise UnsupportedSetup(_REQUIRED_ARGS["cuda_graph_backend_prefill"][1])
        self.config = config
        self.rank = int(get_tensor_model_parallel_rank())
        self.capture: Optional[SGLangCapture] = None
        self.sink = None
        self._writer = None
        self._global = None
        if self.rank == 0:
            self._global = nn.modules.module.register_module_forward_pre_hook(self._find)

    def _open_sink(self):
        import atexit

        import hspack

        c = self.config
        writer = hspack.Writer(c["out"], c["schema"], capture=c["capture"]).__enter__()
        self._writer = writer
        keys = {k: bytes.fromhex(v) for k, v in c.get("capture_keys", {}).items()}
        self.sink = _KeyedSink(writer, keys) if keys else writer
        atexit.register(self._close)
        return self.sink

    def _close(self) -> None:
        if self.sink is not None:
            self.sink = None
            self._writer.__exit__(None, None, None)

    def _find(self, module, args):
        if not _is_sglang_decoder(module):
            return None
        self._global.remove()
        c = self.config
        plan = torch.load(c["plan"], weights_only=True)
        points = CapturePoints.select(c["num_layers"], c["layers"], stack=c.get("stack", False))
        stitcher = _ClosingStitcher(points, plan, self._open_sink(), on_complete=self._close)
        self.capture = SGLangCapture.on_decoder(module, stitcher)
        # This call's own pre-hooks were already collected; run ours by hand.
        self.capture.begin(module, args, {})
        return None

    def __call__(self, module, args, output):
        return None


class _KeyedSink:
    """A writer that gives each sample its capture key (``capture.reuse``)."""

    def __init__(self, writer, keys: Dict[str, bytes]) -> None:
        self.writer = writer
        self.keys = keys

    def contains(self, key: str) -> bool:
        return self.writer.contains(key)

    def append(self, key: str, **tensors) -> None:
        self.writer.append(key, capture_key=self.keys.get(key), **tensors)


class _ClosingStitcher(PrefillStitcher):
    def __init__(self, points, requests, sink, on_complete) -> None:
        super().__init__(points, requests, sink, tp_rank=0)
        self._on_complete = on_complete

    def on_forward(self, *a, **k):
        written = super().on_forward(*a, **k)
        if written and self.complete:
            self._on_complete()
        return written


def engine_dtype(config, dtype="auto") -> torch.dtype:
    """The dtype SGLang runs ``config``'s model in, so its hidden states, for the engine
    argument ``dtype`` (``"auto"``: the config's, but float32 configs run in float16, Gemma's
    in bfloat16): SGLang's own rule (``names.DTYPE_RULE``) on its text config."""
    import copy

    from sglang.srt.configs import model_config
    from sglang.srt.utils.hf_transformers import common

    # SGLang's text-config lookup may set attributes on the config; the caller's stays as read.
    text = getattr(common, names.TEXT_CONFIG_RULE)(copy.deepcopy(config))
    return getattr(model_config, names.DTYPE_RULE)(text, dtype)


def hook_factory(config: dict):
    """The ``hook_factory`` named in the engine's ``forward_hooks`` server argument."""
    return _EngineHook(config)



#: Engine arguments that do not change the numbers a prefill gives: left out of the capture key.
_KEY_NEUTRAL_ARGS = {"revision", "dtype", names.DETERMINISTIC_ARG, "log_level", "port", "host", "mem_fraction_static", "random_seed"}


def engine_key(extra: dict, tp_size: int = 1) -> str:
    """The capture key's `engine`: "sglang", with the engine arguments that may change the
    numbers (quantization, the KV cache's dtype, tensor parallelism above 1, overrides...) in
    a canonical form: a capture run with other ones is never reused for this one. (The dtype
    and deterministic inference are keyed fields of their own.)"""
    keyed = {k: v for k, v in extra.items() if k not in _KEY_NEUTRAL_ARGS}
    if tp_size != 1:
        keyed["tp_size"] = tp_size
    return "sglang" if not keyed else "sglang " + json.dumps(keyed, sort_keys=True, default=str)

def extract(
    model: str,
    data: str,
    layers: Sequence[int],
    out: str,
    *,
    tp_size: int = 1,
    batch_size: int = 64,
    max_len: Optional[int] = None,
    trust_remote_code: bool = False,
    engine_extra: Optional[dict] = None,
    stack: bool = False,
    counts: Optional[CaptureCounts] = None,
    quantize: Optional[str] = None,
) -> int:
    """Run ``sglang.Engine`` over ``data`` and write the captured states to ``out``; return samples written.
    ``quantize``: ``"fp8"`` stores the hidden states as FP8 with a scale per token and layer
    (lossy, half the bytes; ``"fp8:NAME,..."`` names the fields), as ``hspack.Writer`` does.
    ``stack``: every id but the last in one stacked field ``aux_hidden_state`` (EAGLE-3).
    ``out`` a store dataset ``STORE/NAME``: samples the store holds for the same capture are
    copied, not run (``capture.reuse``; deterministic when ``engine_extra`` sets
    ``enable_deterministic_inference``, ``sglang_names.DETERMINISTIC_ARG``); ``counts`` says
    how many. The hidden states are stored in the dtype SGLang runs the model in
    (``engine_dtype`` of ``engine_extra``'s ``dtype``, ``"auto"`` by default); its
    ``revision`` is the one whose config and tokenizer are read, and is recorded."""
    import tempfile

    check_batching(batch_size)
    check_prompts(data, max_len)
    import hspack
    import sglang
    from tqdm import tqdm
    from transformers import AutoConfig, AutoTokenizer

    extra = engine_extra or {}
    revision = extra.get("revision")
    config = AutoConfig.from_pretrained(model, revision=revision, trust_remote_code=trust_remote_code)
    tokenizer = AutoTokenizer.from_pretrained(model, revision=revision, trust_remote_code=trust_remote_code)
    num_layers, hidden_size = model_shape(config)
    points = CapturePoints.select(num_layers, layers, stack=stack)
    dtype = engine_dtype(config, extra.get("dtype", "auto"))
    schema = points.schema(hidden_size, dtype)
    if quantize is not None:
        from .._writer import quantized_fields

        schema = quantized_fields(schema, quantize)
    # What names the weights, not the revision as given: a resume after the weights changed is
    # then refused, never mixed in.
    weights = model_revision(model, revision, config)
    meta = capture_metadata(
        model=model, revision=weights, config_hash=config_hash(config.to_dict()), num_layers=num_layers,
        hidden_size=hidden_size, dtype=dtype, tp_size=tp_size, tool="hspack.capture.sglang",
        tool_version=f"sglang {sglang.__version__}",
    )
    samples = list(read_samples(data, tokenizer, max_len))
    keys = [s.key for s in samples]
    if len(set(keys)) != len(keys):
        twice = sorted({k for k in keys if keys.count(k) > 1})
        raise ValueError(f"{data}: sample keys must be unique; given more than once: {', '.join(twice[:5])}")
    counts = counts if counts is not None else CaptureCounts()
    with hspack.Writer(out, schema, capture=meta) as writer:
        reuse = None
        if writer.in_store:
            reuse = capture_config(
                model=model, revision=weights, config_hash=meta["config_hash"], engine=engine_key(extra, tp_size),
                deterministic=bool(extra.get(names.DETERMINISTIC_ARG, False)),
                dtype=meta["dtype"], layers=points.ids, fields=[f["name"] for f in schema],
            )
        work = plan(samples, writer, reuse, counts)
    todo = work.run
    if todo:
        with tempfile.TemporaryDirectory(prefix="hspack-capture-") as tmp:
            plan_file = os.path.join(tmp, "plan.pt")
            torch.save({s.key: (s.input_ids, s.loss_mask) for s in todo}, plan_file)
            hook_config = {"out": out, "schema": schema, "capture": meta, "plan": plan_file,
                           "num_layers": num_layers, "layers": list(points.ids), "stack": stack,
                           "capture_keys": {s.key: work.keys[s.key].hex() for s in todo if s.key in work.keys}}
            engine = sglang.Engine(**engine_args(model, hook_config, tp_size, **extra))
            try:
                bar = tqdm(total=len(samples), initial=len(samples) - len(todo), unit="sample")
                for start in range(0, len(todo), batch_size):
                    chunk = todo[start : start + batch_size]
                    engine.generate(
                        input_ids=[s.input_ids for s in chunk],
                        sampling_params={"max_new_tokens": 1, "temperature": 0.0},
                        rid=[s.key for s in chunk],
                    )
                    bar.update(len(chunk))
                bar.close()
            finally:
                engine.shutdown()
        # The scheduler's writer commits once every planned request is written: a request
        # the engine aborted or cut short, or a scheduler that died, leaves some out.
        held = hspack.open(out)
        missing = [s.key for s in todo if s.key not in held]
        if missing:
            raise CaptureError(
                f"{out}: {len(missing)} of the {len(todo)} prompts sent to the engine are not in the dataset "
                f"({', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}): the engine did not complete them "
                "(a request it aborted or truncated, over its context or KV pool, or a scheduler that stopped); "
                "see its log, then run again to capture what is missing"
            )
        counts.forward = len(todo)
    if work.twins:
        # Samples sharing a run sample's tokens: the engine recorded that one's capture key,
        # so a second pass copies it under theirs.
        twins = [t for ts in work.twins.values() for t in ts]
        with hspack.Writer(out, schema, capture=meta) as writer:
            done, _ = writer.reuse_captured([(t.key, work.keys[t.key]) for t in twins])
        if not all(done):
            missing = [t.key for t, d in zip(twins, done) if not d][:5]
            raise CaptureError(f"samples {missing} share tokens with captured samples the store does not hold; run again")
    return counts.forward + counts.reused + counts.shared


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``python -m hspack.capture.sglang``."""
    parser = argparse.ArgumentParser(prog="python -m hspack.capture.sglang", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("extract", help="capture prefill hidden states of a prompt file with sglang.Engine")
    ex.add_argument("--model", required=True)
    ex.add_argument("--data", required=True, help="JSONL prompts (input_ids or conversations/messages)")
    ex.add_argument("--layers", required=True, help="comma-separated ids: i = input of layer i, num_layers = final norm")
    ex.add_argument("--out", required=True, help="dataset folder to write (resumed if it exists)")
    ex.add_argument("--tp-size", type=int, default=1)
    ex.add_argument("--batch-size", type=int, default=64, help="prompts per generate call")
    ex.add_argument("--max-len", type=int, default=None)
    ex.add_argument("--trust-remote-code", action="store_true")
    ex.add_argument("--engine-args", default=None, help="JSON object of extra sglang.Engine arguments")
    ex.add_argument("--stack", action="store_true", help="store every id but the last in one stacked field aux_hidden_state (EAGLE-3; read without a copy)")
    ex.add_argument("--quantize", default=None, metavar="fp8[:FIELDS]",
                    help="store the hidden states as FP8 with a scale per token and layer (lossy, half the bytes)")
    args = parser.parse_args(argv)
    counts = CaptureCounts()
    try:
        extra = json.loads(args.engine_args) if args.engine_args else {}
        if args.trust_remote_code:
            extra.setdefault("trust_remote_code", True)
        n = extract(args.model, args.data, parse_layers(args.layers), args.out, tp_size=args.tp_size,
                    batch_size=args.batch_size, max_len=args.max_len,
                    trust_remote_code=args.trust_remote_code, engine_extra=extra, stack=args.stack,
                    counts=counts, quantize=args.quantize)
    except command_errors() as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {n} samples to {args.out}; {counts.summary()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
