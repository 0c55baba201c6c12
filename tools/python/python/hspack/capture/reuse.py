"""Capture-skip: running the model only for samples no store dataset already holds.

Each sample's capture key (``hspack.capture_key``) hashes the capture config (model,
revision, config hash, engine, its determinism flag, dtype, layer ids, field names) and the
sample's exact token ids and loss mask. Before the forward pass, a driver writing into a
store dataset ``STORE/NAME``:

* copies from the store every sample whose key it recorded before (in any of its
  datasets), after checking the stored bytes against the digest recorded with the key;
* runs the model once for samples of this run that share a key, and appends the result
  under each of their sample keys;
* gives every sample it appends its capture key, so later runs reuse it.

So reordering a prompt file, or adding prompts to it, runs the model only for the new ones,
keyed by content rather than by position; the skipped samples cost no new bytes in the store.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from .prompts import Sample

__all__ = ["CaptureCounts", "Plan", "capture_config", "plan"]


def capture_config(*, model: str, revision: Optional[str], config_hash: Optional[str], engine: str,
                   deterministic: bool, dtype: str, layers: Sequence[int], fields: Sequence[str]) -> dict:
    """The config a capture key hashes (FORMAT.md §11.7)."""
    return {
        "model": model,
        "revision": revision,
        "config_hash": config_hash,
        "engine": engine,
        "deterministic": bool(deterministic),
        "dtype": dtype,
        "layers": [int(i) for i in layers],
        "fields": list(fields),
    }


@dataclass
class CaptureCounts:
    """What a capture run did with its samples."""

    total: int = 0
    resumed: int = 0
    reused: int = 0
    stale: int = 0
    shared: int = 0
    forward: int = 0

    def summary(self) -> str:
        return (
            f"{self.total} samples: {self.forward} run through the model, {self.reused} reused from "
            f"the store, {self.shared} sharing another sample's tokens, {self.resumed} already "
            f"in the dataset" + (f" ({self.stale} recorded captures were gone or changed)" if self.stale else "")
        )


@dataclass
class Plan:
    """What to run: ``run`` (one sample per key), and for each key of ``run`` the other
    samples to append with the same rows (``twins``); ``keys`` holds every capture key."""

    run: List[Sample]
    twins: Dict[str, List[Sample]] = field(default_factory=dict)
    keys: Dict[str, bytes] = field(default_factory=dict)

    def key(self, s: Sample) -> Optional[bytes]:
        return self.keys.get(s.key)


def plan(samples: Sequence[Sample], sink, config: Optional[dict], counts: CaptureCounts,
         loss_mask: bool = True) -> Plan:
    """Drops what ``sink`` holds (resume) and, with a ``config``, copies from the store what
    it has and pairs up samples of equal keys. ``loss_mask``: the dataset stores a loss mask."""
    import hspack

    counts.total = len(samples)
    todo = [s for s in samples if not sink.contains(s.key)]
    counts.resumed = len(samples) - len(todo)
    if config is None:
        return Plan(run=todo)
    if not getattr(sink, "in_store", False):
        raise ValueError("capture-skip needs a writer into a store dataset STORE/NAME (hspack.init_store makes one)")
    keys = {s.key: hspack.capture_key(config, s.input_ids, s.loss_mask if loss_mask else None) for s in todo}
    done, counts.stale = sink.reuse_captured([(s.key, keys[s.key]) for s in todo])
    counts.reused = sum(done)
    out = Plan(run=[], keys=keys)
    first: Dict[bytes, str] = {}
    for s, reused in zip(todo, done):
        if reused:
            continue
        k = keys[s.key]
        if k in first:
            out.twins.setdefault(first[k], []).append(s)
            counts.shared += 1
        else:
            first[k] = s.key
            out.run.append(s)
    return out
