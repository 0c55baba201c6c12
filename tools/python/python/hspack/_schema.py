"""Schema helpers: fields as plain dicts, the same JSON the Rust schema uses."""

from __future__ import annotations

from typing import Any, Sequence

from ._dataset import count_option
from ._errors import kind_of, make_error
from ._hspack import EAGLE3

_NAMES = EAGLE3["fields"]

POINTS = ("layer_input", "layer_output", "final_norm")


def _point(point: str) -> str:
    """`point` as the schema spells it: `final-norm` (as the CLI takes it) is `final_norm`."""
    spelled = str(point).replace("-", "_")
    if spelled not in POINTS:
        raise make_error("BadOption", f"option point: {point!r} must be one of {', '.join(POINTS)}", option="point")
    return spelled


def _role(role: Any) -> dict:
    if isinstance(role, dict):
        return dict(role)
    if role in ("token_ids", "loss_mask", "other"):
        return {"kind": role}
    raise make_error("BadOption", f"option role: {role!r} is not a role; use \"token_ids\", \"loss_mask\", \"other\" or hidden_state(...)", option="role")


def field(name: str, dtype: str, shape: Sequence[int] = (), role: Any = "other") -> dict:
    """A field: rows of `shape`-shaped elements of `dtype` (`"bf16"`, `"i32"`, ...)."""
    return {"name": name, "dtype": dtype, "shape": [count_option("shape", d, 0) for d in shape], "role": _role(role)}


def hidden_state(layer: int, width: int, point: str = "layer_input", dtype: str = "bf16", name: str | None = None) -> dict:
    """A hidden-state field of decoder layer `layer`, `width` wide, taken at `point`
    (`"layer_input"`, `"layer_output"` or `"final_norm"`). Named `hidden.<layer>` unless
    `name` is given. The final norm's output is id `num_layers` (HF's `hidden_states[-1]`):
    `hidden_state(61, H, point="final_norm")` is `hidden.61` of a 61-layer model, as capture and
    `hspack convert` name it. (The default was `hidden.final` before: give
    `name="hidden.final"` to resume such a dataset.)"""
    point = _point(point)
    if name is None:
        name = f"{_NAMES['hidden_prefix']}{layer}"
    return field(name, dtype, [count_option("width", width, 0)], {"kind": "hidden_state", "layer": count_option("layer", layer, 0), "point": point})


def hidden_states(layers: Sequence[int], width: int, point: str = "layer_input", dtype: str = "bf16", name: str = _NAMES["aux"]) -> dict:
    """A field stacking the hidden states of decoder layers `layers` (row shape
    `[len(layers), width]`), taken at `point`. A row read flat is the layers concatenated
    on the last dim: EAGLE-3's `aux_hidden_state [T, k*H]`, which `hspack.torch`'s EAGLE-3 view
    then returns without copying. Append `[T, k, H]` or `[T, k*H]` tensors."""
    point = _point(point)
    layers = [count_option("layers", x, 0) for x in layers]
    if not layers:
        raise make_error("BadOption", "option layers: name at least one layer", option="layers")
    return field(name, dtype, [len(layers), count_option("width", width, 0)], {"kind": "hidden_states", "layers": layers, "point": point})


def token_ids(name: str = _NAMES["input_ids"], dtype: str = "i32") -> dict:
    """The token-id field: one id per row."""
    return field(name, dtype, [], "token_ids")


def loss_mask(name: str = _NAMES["loss_mask"], dtype: str = "u8") -> dict:
    """The loss-mask field: one value per row, non-zero where the loss counts."""
    return field(name, dtype, [], "loss_mask")


def normalize(fields: Sequence[Any]) -> list[dict]:
    """Fields as the dicts the native writer takes (roles given as strings become dicts)."""
    out = []
    for f in fields:
        f = dict(f)
        f["shape"] = [int(d) for d in f.get("shape", ())]
        f["role"] = _role(f.get("role", "other"))
        out.append(f)
    return out


#: The keys of the capture metadata a writer takes (`capture=`), and those it needs.
CAPTURE_KEYS = ("model", "revision", "config_hash", "num_layers", "hidden_size", "dtype", "tp_size", "tool", "tool_version")
CAPTURE_NEEDS = ("model", "num_layers", "hidden_size", "dtype")


def capture_metadata(capture: Any, tool: str, tool_version: str) -> dict:
    """`capture=` of a writer as the manifest records it, `tool` and `tool_version` filled
    where not given; a key misspelled (it was dropped unsaid) or one missing is refused naming
    it (it was said as `option schema: missing field ... at line 1 column N` of JSON the caller
    never wrote)."""
    if not isinstance(capture, dict):
        raise make_error("BadOption", f"option capture: {kind_of(capture)}; give a dict with {', '.join(CAPTURE_NEEDS)}", option="capture")
    unknown = sorted(str(k) for k in capture if k not in CAPTURE_KEYS)
    if unknown:
        raise make_error("BadOption", f"option capture: unknown key(s) {', '.join(unknown)}; the keys are {', '.join(CAPTURE_KEYS)}", option="capture")
    missing = [k for k in CAPTURE_NEEDS if k not in capture]
    if missing:
        raise make_error(
            "BadOption",
            f"option capture: missing {', '.join(missing)}; it needs {', '.join(CAPTURE_NEEDS)} (the model's name, its layer count, "
            'its hidden size and the hidden states\' dtype, e.g. "bf16"), and may give revision, config_hash and tp_size',
            option="capture",
        )
    return {"tool": tool, "tool_version": tool_version, **capture}

