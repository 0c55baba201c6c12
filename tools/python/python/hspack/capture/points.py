"""Which hidden states are captured, and how they are named in a dataset.

Layer ids follow the Hugging Face ``output_hidden_states=True`` convention:

* id ``i`` with ``0 <= i < num_layers`` is the INPUT to decoder layer ``i``
  (``hidden_states[i]``; id 0 is the embedding output). In SGLang's decoder loop
  this is ``hidden_states + residual`` at the top of layer ``i``, which is what
  its ``layers_to_capture`` entry ``i`` stores.
* id ``num_layers`` is the output of the final norm (``hidden_states[-1]``,
  which Hugging Face returns after the norm).

Each captured id becomes a field ``hidden.<id>`` whose role records the id and
its point (``layer_input`` or ``final_norm``), next to ``input_ids``
(``token_ids``) and ``loss_mask``. With ``stack=True`` every id but the last goes
into one stacked field ``aux_hidden_state`` (row shape ``[k, H]``, EAGLE-3's
auxiliary layers, which ``hspack.torch``'s EAGLE-3 view then returns without a
copy) and the last id (the target) keeps its own field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, List, Sequence, Tuple

import torch

from .._hspack import EAGLE3

__all__ = [
    "CapturePoints",
    "DTYPE_NAMES",
    "TOKEN_FIELD",
    "LOSS_MASK_FIELD",
    "STACKED_FIELD",
    "parse_layers",
    "capture_metadata",
    "config_hash",
    "model_shape",
]

# The field names, as the Rust side defines them (`hspack::format::eagle3`).
TOKEN_FIELD = EAGLE3["fields"]["input_ids"]
LOSS_MASK_FIELD = EAGLE3["fields"]["loss_mask"]
STACKED_FIELD = EAGLE3["fields"]["aux"]
HIDDEN_PREFIX = EAGLE3["fields"]["hidden_prefix"]

DTYPE_NAMES = {
    torch.bfloat16: "bf16",
    torch.float16: "f16",
    torch.float32: "f32",
    torch.float64: "f64",
}


def parse_layers(text: str) -> List[int]:
    """Parse ``"2,30,58,60"`` into a list of ints."""
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--layers must be comma-separated integers, got {text!r}") from None
    if not ids:
        raise ValueError("--layers is empty; name at least one layer id")
    return ids


@dataclass(frozen=True)
class CapturePoints:
    """The layer inputs to capture, and whether the final-norm output is captured too."""

    num_layers: int
    layer_inputs: Tuple[int, ...]
    final_norm: bool = True
    stack: bool = False

    @classmethod
    def select(cls, num_layers: int, layers: Iterable[int], final_norm: bool = True, stack: bool = False) -> "CapturePoints":
        """Validate ids in the ``hidden_states[i]`` convention; id ``num_layers`` means the final norm."""
        ids = sorted(set(int(i) for i in layers))
        bad = [i for i in ids if i < 0 or i > num_layers]
        if bad:
            raise ValueError(
                f"layer ids {bad} are outside 0..{num_layers} for a model with {num_layers} "
                f"decoder layers (id i = input of layer i, id {num_layers} = final norm output)"
            )
        final = final_norm or num_layers in ids
        inputs = tuple(i for i in ids if i < num_layers)
        if not inputs and not final:
            raise ValueError("nothing to capture: no layer ids and the final norm is off")
        if stack and len(inputs) + final < 2:
            raise ValueError("stacking needs at least two captured ids: the stacked auxiliary layers and a target")
        return cls(num_layers=num_layers, layer_inputs=inputs, final_norm=final, stack=stack)

    @property
    def ids(self) -> Tuple[int, ...]:
        """Every captured id, the final norm last."""
        return self.layer_inputs + ((self.num_layers,) if self.final_norm else ())

    @property
    def stacked_ids(self) -> Tuple[int, ...]:
        """The ids stored in the stacked field (every id but the last), or none."""
        return self.ids[:-1] if self.stack else ()

    @property
    def fields(self) -> Tuple[str, ...]:
        """The hidden-state fields, in schema order."""
        single = self.ids[-1:] if self.stack else self.ids
        return ((STACKED_FIELD,) if self.stack else ()) + tuple(self.field(i) for i in single)

    @staticmethod
    def field(layer_id: int) -> str:
        """The dataset field holding id ``layer_id``."""
        return f"{HIDDEN_PREFIX}{layer_id}"

    def point(self, layer_id: int) -> str:
        """``layer_input`` or ``final_norm``."""
        return "final_norm" if layer_id == self.num_layers else "layer_input"

    def schema(self, hidden_size: int, dtype: torch.dtype) -> List[dict]:
        """The schema list for ``hspack.Writer``: token ids, loss mask, then one field per id
        (with ``stack``: the stacked field of every id but the last, then the last id's)."""
        if dtype not in DTYPE_NAMES:
            raise ValueError(f"hidden states in {dtype} cannot be stored; use bf16, f16 or f32")
        fields = [
            {"name": TOKEN_FIELD, "dtype": "i32", "shape": [], "role": {"kind": "token_ids"}},
            {"name": LOSS_MASK_FIELD, "dtype": "u8", "shape": [], "role": {"kind": "loss_mask"}},
        ]
        if self.stack:
            fields.append(
                {
                    "name": STACKED_FIELD,
                    "dtype": DTYPE_NAMES[dtype],
                    "shape": [len(self.stacked_ids), int(hidden_size)],
                    "role": {"kind": "hidden_states", "layers": list(self.stacked_ids), "point": "layer_input"},
                }
            )
        for i in self.ids[len(self.stacked_ids):]:
            fields.append(
                {
                    "name": self.field(i),
                    "dtype": DTYPE_NAMES[dtype],
                    "shape": [int(hidden_size)],
                    "role": {"kind": "hidden_state", "layer": i, "point": self.point(i)},
                }
            )
        return fields

    def sample(
        self,
        input_ids: torch.Tensor,
        loss_mask: torch.Tensor,
        hidden: dict,
        key: str | None = None,
    ) -> dict:
        """The tensors of one sample (sample `key`, which errors name), keyed by field name,
        after checking row counts."""
        from .errors import RowMismatch

        said = "" if key is None else f"sample `{key}`: "
        n = int(input_ids.shape[0])
        if input_ids.dim() != 1 or loss_mask.shape != input_ids.shape:
            raise RowMismatch(
                f"{said}input_ids {tuple(input_ids.shape)} and loss_mask {tuple(loss_mask.shape)} "
                "must be equal-length 1-D tensors"
            )
        out = {
            TOKEN_FIELD: input_ids.to(torch.int32),
            LOSS_MASK_FIELD: loss_mask.to(torch.uint8),
        }
        missing = [i for i in self.ids if i not in hidden]
        if missing:
            raise RowMismatch(f"{said}no captured rows for layer ids {missing}")
        for i in self.ids:
            t = hidden[i]
            if t.dim() != 2 or t.shape[0] != n:
                raise RowMismatch(
                    f"{said}layer id {i}: captured shape {tuple(t.shape)}, expected ({n}, hidden) "
                    f"for a sample of {n} tokens"
                )
            if i not in self.stacked_ids:
                out[self.field(i)] = t
        if self.stack:
            out[STACKED_FIELD] = torch.stack([hidden[i] for i in self.stacked_ids], dim=1)
        return out


def capture_metadata(
    *,
    model: str,
    revision: str | None,
    config_hash: str,
    num_layers: int,
    hidden_size: int,
    dtype: torch.dtype,
    tp_size: int,
    tool: str,
    tool_version: str,
) -> dict:
    """The ``capture`` dict for ``hspack.Writer``."""
    return {
        "model": model,
        "revision": revision or "",
        "config_hash": config_hash,
        "num_layers": int(num_layers),
        "hidden_size": int(hidden_size),
        "dtype": DTYPE_NAMES[dtype],
        "tp_size": int(tp_size),
        "tool": tool,
        "tool_version": tool_version,
    }


def config_hash(config_dict: dict) -> str:
    """A stable sha256 of a model config dict (sorted JSON)."""
    import hashlib
    import json

    text = json.dumps(config_dict, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def text_config(config):
    """The language-model part of a config (multimodal configs nest it)."""
    for name in ("text_config", "language_config", "llm_config"):
        sub = getattr(config, name, None)
        if sub is not None and getattr(sub, "num_hidden_layers", None) is not None:
            return sub
    return config


def model_shape(config) -> Tuple[int, int]:
    """``(num_layers, hidden_size)`` of the language model."""
    cfg = text_config(config)
    return int(cfg.num_hidden_layers), int(cfg.hidden_size)


def as_sequence(x) -> Sequence[int]:
    """A plain list of ints from a list or a 1-D tensor."""
    if isinstance(x, torch.Tensor):
        return [int(v) for v in x.tolist()]
    return [int(v) for v in x]
