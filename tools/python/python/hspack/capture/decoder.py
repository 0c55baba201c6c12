"""Find the core decoder (the module holding the decoder-layer list and the final norm).

Models nest it differently: ``model.model.layers`` (causal LMs),
``model.language_model.model.layers`` and ``model.model.language_model.layers``
(multimodal wrappers). Instead of naming classes, the module tree is walked for
modules that own an ``nn.ModuleList`` called ``layers`` and a module called
``norm``. Vision towers sometimes look alike, so when several match, the ones
under a ``language_model`` are preferred; remaining ambiguity is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional

from torch import nn

from .errors import UnsupportedSetup

__all__ = ["Decoder", "find_decoder"]


@dataclass
class Decoder:
    """The located decoder: its dotted path from the root, the layer list and the final norm."""

    path: str
    module: nn.Module
    layers: nn.ModuleList
    norm: nn.Module

    @property
    def num_layers(self) -> int:
        return len(self.layers)


def _is_decoder(module: nn.Module) -> bool:
    layers = getattr(module, "layers", None)
    norm = getattr(module, "norm", None)
    return isinstance(layers, nn.ModuleList) and len(layers) > 0 and isinstance(norm, nn.Module)


def find_decoder(
    root: nn.Module,
    num_layers: Optional[int] = None,
    accept: Callable[[nn.Module], bool] = _is_decoder,
) -> Decoder:
    """Locate the decoder under ``root``.

    ``num_layers``, when given, must equal the length of the layer list found.
    ``accept`` decides whether a module is a decoder (default: owns ``layers`` and ``norm``).
    """
    found: List[tuple] = [(name, m) for name, m in root.named_modules() if accept(m)]
    if num_layers is not None:
        found = [(n, m) for n, m in found if len(m.layers) == num_layers] or found
    if len(found) > 1:
        text = [(n, m) for n, m in found if "language_model" in n.split(".")]
        found = text or found
    if len(found) > 1:
        # A decoder nested in another decoder candidate is not the core one.
        names = [n for n, _ in found]
        found = [(n, m) for n, m in found if not any(o != n and n.startswith(o + ".") for o in names)]
    if not found:
        raise UnsupportedSetup(
            f"no decoder found under {type(root).__name__}: expected a module with an "
            "nn.ModuleList 'layers' and a final 'norm'"
        )
    if len(found) > 1:
        raise UnsupportedSetup(
            "several decoder candidates found: "
            + ", ".join(repr(n or "<root>") for n, _ in found)
            + "; capture from the language-model module directly"
        )
    name, module = found[0]
    if num_layers is not None and len(module.layers) != num_layers:
        raise UnsupportedSetup(
            f"decoder {name!r} has {len(module.layers)} layers, the config says {num_layers}"
        )
    return Decoder(path=name, module=module, layers=module.layers, norm=module.norm)
