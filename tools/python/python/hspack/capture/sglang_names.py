"""Every SGLang name the SGLang adapter relies on, in one list.

The adapter reads its attribute, argument and mode names from here, and
``tests/test_sglang_static.py`` checks each entry against the source of the
pinned SGLang wheel (``SGLANG_VERSION``) with ``ast``, so the two cannot drift.
"""

from __future__ import annotations

from typing import NamedTuple, Tuple

__all__ = ["SGLANG_VERSION", "Requirement", "SGLANG_NAMES"]

SGLANG_VERSION = "0.5.23"

_MODEL = "sglang/srt/models/deepseek_v2.py"
_KIMI = "sglang/srt/models/kimi_k25.py"
_BATCH = "sglang/srt/model_executor/forward_batch_info.py"
_AUX = "sglang/srt/layers/aux_hidden_states.py"
_GRAPH = "sglang/srt/model_executor/cuda_graph_config.py"
_HOOKS = "sglang/srt/model_executor/hook_manager.py"
_PARALLEL = "sglang/srt/distributed/parallel_state.py"
_ENGINE = "sglang/srt/entrypoints/engine.py"
_MODEL_CONFIG = "sglang/srt/configs/model_config.py"
_HF_COMMON = "sglang/srt/utils/hf_transformers/common.py"
#: Server arguments are declared as annotated fields of classes in this folder.
SERVER_ARG_DIR = "sglang/srt/arg_groups/fields/"

# Decoder model (DeepseekV2Model): its forward's leading arguments, in order, and attributes.
MODEL_CLASS = "DeepseekV2Model"
MODEL_FORWARD_ARGS = ("input_ids", "positions", "forward_batch")
MODEL_LAYERS = "layers"
MODEL_NORM = "norm"
MODEL_CAPTURE_LIST = "layers_to_capture"
# Decoder layer: the keyword the loop passes a collector through for `layers_to_capture`.
LAYER_CLASS = "DeepseekV2DecoderLayer"
LAYER_CAPTURE_ARG = "captured_last_layer_outputs"
# Collector protocol the layer calls: capture(hidden, owned=...).
COLLECTOR_METHOD = "capture"
COLLECTOR_OWNED_ARG = "owned"
# Multimodal wrapper holding the causal LM.
WRAPPER_CLASS = "KimiK25ForConditionalGeneration"
WRAPPER_LM = "language_model"
# ForwardBatch fields read per pass.
BATCH_FIELDS = (
    "forward_mode",
    "extend_seq_lens_cpu",
    "extend_prefix_lens_cpu",
    "rids",
    "can_run_tbo",
)
# ForwardMode members, split by what a capture does with them. Together they must be all members.
MODES_CAPTURED = ("EXTEND",)
MODES_IGNORED = ("DECODE", "IDLE", "TARGET_VERIFY", "DRAFT_EXTEND_V2", "PREBUILT")
MODES_REFUSED = {
    "MIXED": "chunked prefill mixed with decode; drop --enable-mixed-chunk",
    "SPLIT_PREFILL": "split prefill for PD multiplexing; drop --enable-pdmux",
    "DLLM_EXTEND": "diffusion-LM extend; capture supports autoregressive prefill only",
}
MODE_CHECK = "is_extend_without_speculative"
# The server argument that makes prefill rows independent of the batch: a capture made with it
# is keyed as deterministic (capture.reuse).
DETERMINISTIC_ARG = "enable_deterministic_inference"
# How SGLang picks the dtype a model runs in from its config and the `dtype` server argument
# (ModelConfig: DTYPE_RULE(TEXT_CONFIG_RULE(hf_config), dtype)): the schema's dtype.
DTYPE_RULE = "_get_and_verify_dtype"
TEXT_CONFIG_RULE = "get_hf_text_config"
# Server arguments the driver sets, refuses or reads.
SERVER_ARGS = (
    DETERMINISTIC_ARG,
    "dtype",
    "revision",
    "disable_radix_cache",
    "enable_two_batch_overlap",
    "cuda_graph_backend_prefill",
    "cuda_graph_config",
    "attn_dp_size",
    "enable_dp_attention",
    "enable_mixed_chunk",
    "pp_size",
    "tp_size",
    "speculative_algorithm",
    "skip_tokenizer_init",
    "forward_hooks",
)


class Requirement(NamedTuple):
    """One name in one SGLang source file.

    ``kind`` is ``class``, ``function`` (module-level), ``method`` (of class
    ``scope``), ``leading_args`` (``name`` = comma-joined first parameters of
    ``scope`` = ``Class.method``, after ``self``), ``arg`` (a parameter of
    ``scope``), ``attr`` (``self.<name> = ...`` inside ``scope`` = ``Class.method``),
    ``field`` (annotated field, method or property of class ``scope``),
    ``member`` (assignment in the body of class ``scope``) or ``server_arg``
    (annotated field of any class under ``SERVER_ARG_DIR``).
    """

    path: str
    kind: str
    scope: str
    name: str


def _build() -> Tuple[Requirement, ...]:
    r = [
        Requirement(_MODEL, "class", "", MODEL_CLASS),
        Requirement(_MODEL, "leading_args", f"{MODEL_CLASS}.forward", ",".join(MODEL_FORWARD_ARGS)),
        Requirement(_MODEL, "attr", f"{MODEL_CLASS}.__init__", MODEL_LAYERS),
        Requirement(_MODEL, "attr", f"{MODEL_CLASS}.__init__", MODEL_NORM),
        Requirement(_MODEL, "attr", f"{MODEL_CLASS}.__init__", MODEL_CAPTURE_LIST),
        Requirement(_MODEL, "arg", f"{LAYER_CLASS}.forward", LAYER_CAPTURE_ARG),
        Requirement(_MODEL, "arg", f"{LAYER_CLASS}.forward", "hidden_states"),
        Requirement(_AUX, "method", "AuxHiddenStateList", COLLECTOR_METHOD),
        Requirement(_AUX, "arg", f"AuxHiddenStateList.{COLLECTOR_METHOD}", COLLECTOR_OWNED_ARG),
        Requirement(_AUX, "arg", f"AuxHiddenStatePacker.{COLLECTOR_METHOD}", COLLECTOR_OWNED_ARG),
        Requirement(_KIMI, "attr", f"{WRAPPER_CLASS}.__init__", WRAPPER_LM),
        Requirement(_BATCH, "method", "ForwardMode", MODE_CHECK),
        Requirement(_GRAPH, "member", "Backend", "DISABLED"),
        Requirement(_GRAPH, "member", "Phase", "PREFILL"),
        Requirement(_GRAPH, "function", "", "check_cuda_graph_backend"),
        Requirement(_HOOKS, "function", "", "register_forward_hooks"),
        Requirement(_PARALLEL, "function", "", "get_tensor_model_parallel_rank"),
        Requirement(_ENGINE, "arg", "Engine.generate", "rid"),
        Requirement(_ENGINE, "arg", "Engine.generate", "input_ids"),
        Requirement(_ENGINE, "method", "Engine", "shutdown"),
        Requirement(_MODEL_CONFIG, "function", "", DTYPE_RULE),
        Requirement(_HF_COMMON, "function", "", TEXT_CONFIG_RULE),
    ]
    r += [Requirement(_BATCH, "field", "ForwardBatch", f) for f in BATCH_FIELDS]
    modes = MODES_CAPTURED + MODES_IGNORED + tuple(MODES_REFUSED)
    r += [Requirement(_BATCH, "member", "ForwardMode", m) for m in modes]
    r += [Requirement(SERVER_ARG_DIR, "server_arg", "", a) for a in SERVER_ARGS]
    return tuple(r)


#: The full list; the static test checks every entry and that the modes cover ``ForwardMode``.
SGLANG_NAMES: Tuple[Requirement, ...] = _build()
