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

The key's ``revision`` names the weights, not only the config (``model_revision``): the
weight files of a local folder (name, size, mtime), the resolved commit of a hub id.

Resuming (any sink) skips the samples the output already holds, after checking that each
holds the tokens (and loss mask) its prompt gives now; one captured from other tokens is
refused (``RowMismatch``), never kept as if it were this prompt's. A sample a writer holds
but cannot read back yet (appended, not committed) cannot be checked, so it is refused too
(``UnsupportedSetup``: commit first).

So reordering a prompt file, or adding prompts to it, runs the model only for the new ones,
keyed by content rather than by position; the skipped samples cost no new bytes in the store.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from .errors import RowMismatch, UnsupportedSetup
from .points import LOSS_MASK_FIELD, TOKEN_FIELD
from .prompts import Sample

__all__ = ["CaptureCounts", "Plan", "capture_config", "model_revision", "plan"]

#: The files of a local model folder whose identity stands for its weights.
WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth", ".index.json")


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


def model_revision(model: str, revision: Optional[str], config=None) -> Optional[str]:
    """The ``revision`` a capture key records: what identifies the weights beyond the config.

    A local folder: a snapshot of the hub's cache, its commit; else a hash of its weight
    files' names, sizes and modification times (``WEIGHT_FILES``), so weights saved again over
    the same config key anew (and a copy that did not keep modification times keys apart,
    captured again rather than reused), or ``revision`` where it holds none. A hub id: the
    commit transformers resolved ``revision`` (default branch when None) to, else ``revision``
    as given."""
    if os.path.isdir(model):
        # A snapshot of the hub's cache names its commit: the same on every machine.
        real = os.path.realpath(model)
        parent, commit = os.path.split(real)
        if os.path.basename(parent) == "snapshots" and re.fullmatch(r"[0-9a-f]{40}", commit):
            return commit
        h = hashlib.sha256()
        found = False
        for name in sorted(os.listdir(model)):
            path = os.path.join(model, name)
            if name.endswith(WEIGHT_FILES) and os.path.isfile(path):
                st = os.stat(path)
                h.update(f"{name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
                found = True
        # No weight file it knows: nothing to tell weights apart by (the revision as given).
        return f"weights:{h.hexdigest()}" if found else revision
    return _hub_commit(model, revision, config) or revision


def _hub_commit(model: str, revision: Optional[str], config) -> Optional[str]:
    """The commit of hub repo ``model`` that ``revision`` resolved to, where transformers says."""
    commit = getattr(config, "_commit_hash", None)  # transformers < 5
    if isinstance(commit, str) and commit:
        return commit
    try:
        from transformers.utils.hub import cached_file, extract_commit_hash

        # The config was just loaded: its file is in the cache, under snapshots/<commit>/.
        return extract_commit_hash(cached_file(model, "config.json", revision=revision), None)
    except (ImportError, OSError, ValueError):
        return None


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
    """Drops what ``sink`` holds (resume; ``RowMismatch`` where it holds other tokens than the
    sample's) and, with a ``config``, copies from the store what it has and pairs up samples
    of equal keys. ``loss_mask``: the dataset stores a loss mask."""
    import hspack

    counts.total = len(samples)
    todo, held = [], []
    for s in samples:
        (held if sink.contains(s.key) else todo).append(s)
    check_held(held, sink)
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


def check_held(held: Sequence[Sample], sink) -> None:
    """Refuses to resume over samples ``sink`` holds under the keys of ``held`` but captured
    from other token ids or another loss mask than theirs (another ``--max-len``, chat
    template, tokenizer or prompt text under the same id): their stored hidden states belong
    to those tokens. Reads the token ids and loss masks only."""
    if not held:
        return
    by_key = {s.key: s for s in held}
    bad: List[Tuple[str, str]] = []
    unread: List[str] = []
    for key, ids, mask in _stored_tokens(sink, list(by_key)):
        if ids is None:
            unread.append(key)
            continue
        s = by_key[key]
        said = _difference("token ids", ids, s.input_ids)
        if said is None and mask is not None:
            said = _difference("loss mask", mask, s.loss_mask)
        if said is not None:
            bad.append((key, said))
    where = getattr(sink, "path", None)
    where = f"dataset {where}" if where else "the sink"
    if unread:
        more = f" (and {len(unread) - 1} more)" if len(unread) > 1 else ""
        raise UnsupportedSetup(
            f"sample `{unread[0]}`{more} was appended to the writer of {where} but not committed, so "
            f"its tokens cannot be read back and checked against its prompt: commit the writer "
            f"(writer.commit()) before capturing into it again, or give the sample another key"
        )
    if not bad:
        return
    key, said = bad[0]
    more = ""
    if len(bad) > 1:
        others = ", ".join(f"`{k}`" for k, _ in bad[1:6])
        more = f" (and {len(bad) - 1} more: {others}{', ...' if len(bad) > 6 else ''})"
    raise RowMismatch(
        f"{where} already holds sample `{key}`{more}, captured from other tokens than its prompt "
        f"gives now: {said} (another --max-len, chat template, tokenizer, or prompt text under the "
        f"same id); its stored hidden states belong to those tokens, so it cannot be resumed: "
        f"capture into a new dataset (another --out), or delete {where} and capture again"
    )


def _difference(what: str, stored: Sequence[int], now: Sequence[int]) -> Optional[str]:
    """Where ``stored`` and ``now`` differ, in words; None when equal."""
    if list(stored) == list(now):
        return None
    if len(stored) != len(now):
        return f"the stored {what} have {len(stored)} entries, the prompt's {len(now)}"
    at = next(i for i, (a, b) in enumerate(zip(stored, now)) if a != b)
    return f"the {what} differ first at position {at} (stored {stored[at]}, now {now[at]})"


def _stored_tokens(sink, keys: Sequence[str]) -> Iterator[Tuple[str, Optional[List[int]], Optional[List[int]]]]:
    """``(key, token ids, loss mask or None)`` for each of ``keys`` that ``sink`` can read back:
    an ``hspack.Writer``'s committed samples, a ``MemorySink``'s samples; token ids None for
    a key the writer holds but cannot show (appended since its last commit). Other sinks hold
    nothing readable."""
    import hspack

    from .sink import MemorySink

    if isinstance(sink, MemorySink):
        for key in keys:
            tensors = sink[key]
            if TOKEN_FIELD not in tensors:
                continue
            mask = tensors.get(LOSS_MASK_FIELD)
            yield key, tensors[TOKEN_FIELD].tolist(), None if mask is None else mask.tolist()
    elif isinstance(sink, hspack.Writer):
        ds = hspack.open(sink.path, format="numpy")
        if TOKEN_FIELD not in ds.fields:
            return
        fields = [TOKEN_FIELD] + ([LOSS_MASK_FIELD] if LOSS_MASK_FIELD in ds.fields else [])
        for key in keys:
            i = ds.ordinal(key)
            if i is None:
                yield key, None, None
                continue
            got = ds.read(i, fields)
            mask = got.get(LOSS_MASK_FIELD)
            yield key, got[TOKEN_FIELD].tolist(), None if mask is None else mask.tolist()
