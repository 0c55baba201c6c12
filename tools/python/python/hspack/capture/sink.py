"""Where captured samples go.

A sink is anything with ``append(key, **tensors)`` and ``contains(key)``;
``hspack.Writer`` is one. ``MemorySink`` keeps samples in a dict, for tests and
for looking at a capture before writing it.
"""

from __future__ import annotations

from typing import Dict, Iterator, Protocol, runtime_checkable

import torch

from .._dtypes import torch_dtypes

__all__ = ["Sink", "MemorySink"]


@runtime_checkable
class Sink(Protocol):
    """The two calls the capture layers make on their output."""

    def append(self, key: str, **tensors: torch.Tensor) -> None:
        """Store one sample; every tensor has the sample's tokens as its first dimension."""

    def contains(self, key: str) -> bool:
        """Whether a sample with this key is already stored (used to resume)."""


class MemorySink:
    """A sink that keeps every sample in memory, checked against an optional schema.

    With a ``schema`` (the list of field dicts given to ``hspack.Writer``), each
    append must carry exactly the schema's fields with the declared dtype and
    per-token shape, and all fields must share the token count, as the writer
    requires. Appending a key twice is refused.
    """

    def __init__(self, schema: list | None = None, capture: dict | None = None) -> None:
        self.schema = schema
        self.capture = capture
        self.samples: Dict[str, Dict[str, torch.Tensor]] = {}

    def __enter__(self) -> "MemorySink":
        return self

    def __exit__(self, *exc) -> None:
        return None

    def __len__(self) -> int:
        return len(self.samples)

    def __iter__(self) -> Iterator[str]:
        return iter(self.samples)

    def __getitem__(self, key: str) -> Dict[str, torch.Tensor]:
        return self.samples[key]

    def contains(self, key: str) -> bool:
        """Whether ``key`` was appended."""
        return key in self.samples

    def append(self, key: str, **tensors: torch.Tensor) -> None:
        """Store a copy of ``tensors`` under ``key`` after checking them."""
        if key in self.samples:
            raise ValueError(f"sample {key!r} is already stored; keys must be unique")
        if not tensors:
            raise ValueError(f"sample {key!r} has no fields")
        rows = {name: t.shape[0] if t.dim() else None for name, t in tensors.items()}
        if None in rows.values() or len(set(rows.values())) != 1:
            raise ValueError(f"sample {key!r}: fields must share the token dimension, got {rows}")
        for name, t in tensors.items():
            if t.device.type != "cpu":
                raise ValueError(f"sample {key!r} field {name!r} is on {t.device}; pass CPU tensors")
        if self.schema is not None:
            self._check_schema(key, tensors)
        self.samples[key] = {name: t.detach().clone() for name, t in tensors.items()}

    def _check_schema(self, key: str, tensors: Dict[str, torch.Tensor]) -> None:
        names = [f["name"] for f in self.schema]
        if sorted(names) != sorted(tensors):
            raise ValueError(f"sample {key!r} has fields {sorted(tensors)}, schema has {sorted(names)}")
        for field in self.schema:
            t = tensors[field["name"]]
            want = torch_dtypes()[field["dtype"]]
            if t.dtype != want:
                raise ValueError(f"sample {key!r} field {field['name']!r} is {t.dtype}, schema says {want}")
            if list(t.shape[1:]) != list(field["shape"]):
                raise ValueError(
                    f"sample {key!r} field {field['name']!r} has per-token shape "
                    f"{list(t.shape[1:])}, schema says {field['shape']}"
                )
