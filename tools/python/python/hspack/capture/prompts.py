"""Reading prompt files into token ids and loss masks.

Each line of a JSONL file is one sample with a string-able ``id`` (its key in
the dataset) and either

* ``input_ids`` (and optionally ``loss_mask``, default all ones), already tokenized, or
* ``conversations`` or ``messages``: a list of ``{"role", "content"}`` turns,
  rendered with the tokenizer's chat template. The loss mask covers the
  assistant turns only: each assistant turn spans from the end of the prefix
  rendered with ``add_generation_prompt=True`` to the end of the prefix that
  includes the turn (so the turn's end-of-turn marker is included). Every
  rendered prefix must be a prefix of the full rendering; templates that
  rewrite earlier turns are refused rather than masked wrongly.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Iterator, List, Optional, Tuple

__all__ = ["Sample", "read_samples", "tokenize_chat"]


@dataclass
class Sample:
    """One prompt: its dataset key, token ids and per-token loss mask (0/1)."""

    key: str
    input_ids: List[int]
    loss_mask: List[int]


def check_prompts(path: str, max_len: Optional[int] = None) -> None:
    """Refuse a prompts file that is not a readable file and a ``max_len`` below 1: a capture
    calls this before it resolves the model (a download, or a network error that hides the
    typo in ``--data``)."""
    if max_len is not None and max_len < 1:
        # -1 cut every sample's last token without a word; 0 failed inside the model.
        raise ValueError(f"max_len {max_len}: give 1 or more tokens (or leave it out to keep every token)")
    if not os.path.isfile(path):
        what = "is not a file" if os.path.exists(path) else "does not exist"
        raise FileNotFoundError(f"--data {path}: {what}; give the JSONL file of prompts (a record a line)")
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise OSError(f"--data {path}: cannot be read ({e.strerror})") from None


def check_batching(batch_size: int, rank: int = 0, world_size: int = 1) -> None:
    """Refuse a batch size below 1 (``range`` with a negative step ran no batch: a capture that
    wrote nothing and said it was done) and a rank outside ``0..world_size - 1``."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size {batch_size!r}: give 1 or more prompts a batch")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size {world_size!r}: give 1 or more processes")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank!r}: with world_size {world_size}, give 0 to {world_size - 1}")


def read_samples(path: str, tokenizer=None, max_len: Optional[int] = None) -> Iterator[Sample]:
    """Yield the samples of a JSONL file; ``max_len`` (1 or more) truncates longer ones."""
    check_prompts(path, max_len)
    with open(path, "r", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not JSON ({e})") from None
            sample = parse_record(rec, tokenizer, where)
            if max_len is not None and len(sample.input_ids) > max_len:
                sample.input_ids = sample.input_ids[:max_len]
                sample.loss_mask = sample.loss_mask[:max_len]
            yield sample


def _integers(value, name: str, where: str) -> List[int]:
    """``value``, a JSON list of integers; anything else (a string, whose characters ``int``
    would take as digits, a float, which it would cut) is refused naming the field."""
    if not isinstance(value, list):
        raise ValueError(f"{where}: '{name}' must be a list of integers, not {type(value).__name__} {value!r:.40}")
    for i, t in enumerate(value):
        if not isinstance(t, int) or isinstance(t, bool):
            raise ValueError(f"{where}: '{name}'[{i}] is {t!r:.40}, not an integer")
    return list(value)


def parse_record(rec: dict, tokenizer, where: str = "record") -> Sample:
    """Turn one decoded JSON line into a ``Sample``."""
    if not isinstance(rec, dict):
        raise ValueError(f"{where}: a line must be a JSON object with an 'id', not {type(rec).__name__} {rec!r:.40}")
    if "id" not in rec:
        raise ValueError(f"{where}: every line needs an 'id' (its key in the dataset, used to resume)")
    if not isinstance(rec["id"], (str, int)) or isinstance(rec["id"], bool):
        raise ValueError(f"{where}: 'id' must be a string or an integer, not {rec['id']!r:.40}")
    key = str(rec["id"])
    if "input_ids" in rec:
        ids = _integers(rec["input_ids"], "input_ids", where)
        mask = _integers(rec["loss_mask"], "loss_mask", where) if "loss_mask" in rec else [1] * len(ids)
        if len(mask) != len(ids):
            raise ValueError(f"{where}: loss_mask has {len(mask)} entries, input_ids {len(ids)}")
    else:
        turns = rec.get("conversations", rec.get("messages"))
        if turns is None:
            raise ValueError(f"{where}: needs 'input_ids' or 'conversations'/'messages'")
        if tokenizer is None:
            raise ValueError(f"{where}: chat lines need a tokenizer")
        ids, mask = tokenize_chat(tokenizer, turns, where)
    if not ids:
        raise ValueError(f"{where}: sample {key!r} has no tokens")
    if any(m not in (0, 1) for m in mask):
        raise ValueError(f"{where}: loss_mask entries must be 0 or 1")
    return Sample(key=key, input_ids=ids, loss_mask=mask)


def _messages(turns: list, where: str) -> List[dict]:
    if not isinstance(turns, list):
        raise ValueError(f"{where}: 'conversations'/'messages' must be a list of turns, not {type(turns).__name__}")
    out = []
    for k, t in enumerate(turns):
        if not isinstance(t, dict):
            raise ValueError(f"{where}: turn {k} is {t!r:.40}, not an object with 'role' and 'content'")
        # ShareGPT-style {"from", "value"} is accepted too.
        role = t.get("role", t.get("from"))
        content = t.get("content", t.get("value"))
        role = {"human": "user", "gpt": "assistant"}.get(role, role)
        if role is None or content is None:
            raise ValueError(f"{where}: each turn needs 'role' and 'content'")
        out.append({"role": role, "content": content})
    return out


def _render(tokenizer, messages, generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt
    )


def assistant_spans(tokenizer, messages: List[dict], where: str) -> Tuple[str, List[Tuple[int, int]]]:
    """The full rendering and the character spans of its assistant turns."""
    full = _render(tokenizer, messages, False)
    spans = []
    for k, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        start_text = _render(tokenizer, messages[:k], True) if k else ""
        end_text = _render(tokenizer, messages[: k + 1], False)
        for text in (start_text, end_text):
            if not full.startswith(text):
                raise ValueError(
                    f"{where}: the chat template renders turn {k} differently once later "
                    "turns follow, so the assistant mask cannot be found by prefixes; "
                    "pre-tokenize this data with an explicit loss_mask"
                )
        if len(end_text) > len(start_text):
            spans.append((len(start_text), len(end_text)))
    return full, spans


def tokenize_chat(tokenizer, turns: list, where: str = "record") -> Tuple[List[int], List[int]]:
    """Token ids of the rendered conversation and its assistant-only loss mask."""
    messages = _messages(turns, where)
    full, spans = assistant_spans(tokenizer, messages, where)
    if getattr(tokenizer, "is_fast", False):
        enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        mask = []
        for a, b in enc["offset_mapping"]:
            mid = a if b == a else b - 1
            mask.append(int(any(s <= mid < e for s, e in spans)))
        return ids, mask
    # Slow tokenizers: tokenize the prefixes and require them to be token prefixes.
    ids = tokenizer(full, add_special_tokens=False)["input_ids"]
    mask = [0] * len(ids)
    for s, e in spans:
        a = tokenizer(full[:s], add_special_tokens=False)["input_ids"]
        b = tokenizer(full[:e], add_special_tokens=False)["input_ids"]
        if ids[: len(a)] != a or ids[: len(b)] != b:
            raise ValueError(f"{where}: token boundaries of an assistant turn are not stable")
        for i in range(len(a), len(b)):
            mask[i] = 1
    return ids, mask
