"""Capturing hidden states from a Hugging Face transformers model.

Hooks sit on the core decoder found by walking the module tree (see
``decoder.find_decoder``), so causal LMs and multimodal wrappers holding a
``language_model`` work alike:

* a forward pre-hook on decoder layer ``i`` records its input: the
  ``hidden_states[i]`` of ``output_hidden_states=True`` (id 0 = embeddings);
* a forward hook on the final norm records its output: ``hidden_states[-1]``,
  stored under id ``num_layers`` with point ``final_norm``.

Batches are padded (left or right); the attention mask removes the padding per
sample and position ids are derived from it, so a padded row sees the same
positions as the sample run alone. Every captured tensor is checked against the
batch shape and every sample against its token count; nothing is dropped or
re-assigned silently.

The decoder runs in eval mode (no dropout) whatever mode the model is in: a model
captured mid-training gives the states inference gives, and each of its modules is
put back in the mode it had once the forward pass returns (``HFCapture.run``).

What is guaranteed, on every device and dtype: each stored row is bitwise the
row ``output_hidden_states`` gives for the same padded batch (the hooks read
what the model computes). Whether that equals the sample run alone depends on
the kernels: they may round differently for another batch shape (f32 on CPU
does, by about 1e-7; bf16 on CPU does by an ulp since torch 2.15; GPU kernels
do, in bf16 too). The model's own outputs differ the same way, so this is no capture error.
For per-sample reproducibility, capture with ``batch_size=1``
(``--batch-size 1``): each sample then runs alone, and its rows are bitwise the
sample run alone on that device.

Command line::

    python -m hspack.capture.hf extract --model PATH --data prompts.jsonl \\
        --layers 2,30,58,60 --out DS [--batch-size N --max-len N --dtype bf16 --device cpu]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Dict, Iterable, List, Optional, Sequence

import torch
from torch import nn

from .decoder import Decoder, find_decoder
from .errors import RowMismatch, command_errors
from .points import CapturePoints, capture_metadata, config_hash, model_shape, parse_layers
from .prompts import Sample, check_batching, check_prompts, read_samples
from .reuse import CaptureCounts, capture_config, model_revision, plan
from .sink import Sink
from .split import real_token_index

__all__ = ["HFCapture", "capture_samples", "extract", "main"]

_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32, "float32": torch.float32,
           "bfloat16": torch.bfloat16, "float16": torch.float16}


def _hidden_arg(args: tuple, kwargs: dict) -> torch.Tensor:
    if args:
        return args[0]
    if "hidden_states" in kwargs:
        return kwargs["hidden_states"]
    raise RowMismatch("a decoder layer was called without hidden_states; cannot record its input")


class HFCapture:
    """Hooks that record the selected hidden states of one forward pass.

    Use as a context manager (hooks are removed on exit)::

        with HFCapture(model, [2, 30]) as cap:
            rows = cap.run(input_ids, attention_mask)   # one {id: [tokens, H]} per sample

    ``run`` switches the decoder to eval mode for its forward pass and restores every
    module's mode afterwards, so a model in training mode is captured without dropout.
    """

    def __init__(self, model: nn.Module, layers: Iterable[int], final_norm: bool = True, stack: bool = False) -> None:
        self.model = model
        config = getattr(model, "config", None)
        expected = model_shape(config)[0] if config is not None else None
        self.decoder: Decoder = find_decoder(model, num_layers=expected)
        self.points = CapturePoints.select(self.decoder.num_layers, layers, final_norm, stack)
        self._handles: list = []
        self._seen: Dict[int, torch.Tensor] = {}

    def __enter__(self) -> "HFCapture":
        for i in self.points.layer_inputs:
            self._handles.append(
                self.decoder.layers[i].register_forward_pre_hook(self._layer_hook(i), with_kwargs=True)
            )
        if self.points.final_norm:
            self._handles.append(self.decoder.norm.register_forward_hook(self._norm_hook))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _record(self, layer_id: int, value: torch.Tensor) -> None:
        if layer_id in self._seen:
            raise RowMismatch(
                f"layer id {layer_id} was reached twice in one forward pass; "
                "the model reuses the module, so its rows cannot be attributed"
            )
        self._seen[layer_id] = value.detach()

    def _layer_hook(self, layer_id: int):
        def hook(module, args, kwargs):
            self._record(layer_id, _hidden_arg(args, kwargs))
            return None

        return hook

    def _norm_hook(self, module, args, output):
        value = output[0] if isinstance(output, (tuple, list)) else output
        self._record(self.points.num_layers, value)

    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> List[Dict[int, torch.Tensor]]:
        """Run the decoder on a padded batch; return each sample's rows on CPU, padding removed."""
        if not self._handles:
            raise RuntimeError("HFCapture.run must be called inside its 'with' block")
        if input_ids.shape != attention_mask.shape or input_ids.dim() != 2:
            raise RowMismatch(
                f"input_ids {tuple(input_ids.shape)} and attention_mask "
                f"{tuple(attention_mask.shape)} must both be [batch, seq]"
            )
        index = real_token_index(attention_mask)
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        self._seen = {}
        try:
            with torch.inference_mode(), _eval_mode(self.decoder.module):
                self.decoder.module(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    position_ids=position_ids,
                    use_cache=False,
                )
            seen, self._seen = self._seen, {}
        finally:
            self._seen = {}
        missing = [i for i in self.points.ids if i not in seen]
        if missing:
            raise RowMismatch(f"the forward pass never reached layer ids {missing}")
        batch, seq = input_ids.shape
        for i, t in seen.items():
            if t.dim() != 3 or t.shape[0] != batch or t.shape[1] != seq:
                raise RowMismatch(
                    f"layer id {i}: captured {tuple(t.shape)}, expected ({batch}, {seq}, hidden); "
                    "the model reshapes or packs tokens, which this capture does not support"
                )
        out = []
        for b, idx in enumerate(index):
            # With a device_map, layers (and so the captured tensors) sit on several devices.
            out.append({i: t[b, idx.to(t.device)].to("cpu", copy=True) for i, t in seen.items()})
        return out


@contextlib.contextmanager
def _eval_mode(module: nn.Module):
    """``module`` in eval mode (dropout off: the states inference gives); each submodule
    gets back its own mode on exit, so a model partly frozen in eval stays as it was."""
    was = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, training in was:
            m.training = training


def _pad(samples: Sequence[Sample], pad_id: int, left: bool, device) -> tuple:
    width = max(len(s.input_ids) for s in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(samples), width), dtype=torch.long)
    for b, s in enumerate(samples):
        n = len(s.input_ids)
        sl = slice(width - n, width) if left else slice(0, n)
        ids[b, sl] = torch.tensor(s.input_ids, dtype=torch.long)
        mask[b, sl] = 1
    return ids.to(device), mask.to(device)


def capture_samples(
    model: nn.Module,
    samples: Sequence[Sample],
    layers: Iterable[int],
    sink: Sink,
    *,
    batch_size: int = 8,
    pad_id: int = 0,
    padding_side: str = "right",
    final_norm: bool = True,
    progress: bool = False,
    stack: bool = False,
    reuse: Optional[dict] = None,
    counts: Optional[CaptureCounts] = None,
) -> int:
    """Capture ``samples`` in padded batches into ``sink``; return how many were written.

    Samples whose key the sink already contains are skipped, so a rerun resumes. With
    ``reuse`` (a ``capture.reuse.capture_config``) and a sink writing into a store dataset,
    samples the store holds under the same capture key are copied from it instead of run, and
    samples of this run with equal tokens are run once (``capture.reuse``). ``counts`` is
    filled in with what was done. ``pad_id`` outside the model's vocabulary (``-1``) pads
    with 0 instead: padded positions are masked, so the rows are the same.
    """
    if padding_side not in ("left", "right"):
        raise ValueError("padding_side must be 'left' or 'right'")
    check_batching(batch_size)
    _check_unique_keys(samples)
    counts = counts if counts is not None else CaptureCounts()
    work = plan(samples, sink, reuse, counts)
    todo = work.run
    device = next(model.parameters()).device
    pad_id = _usable_pad_id(model, pad_id)
    written = counts.reused
    with HFCapture(model, layers, final_norm=final_norm, stack=stack) as cap:
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(samples), initial=len(samples) - len(todo) - counts.shared, unit="sample")
        for start in range(0, len(todo), batch_size):
            chunk = todo[start : start + batch_size]
            ids, mask = _pad(chunk, pad_id, padding_side == "left", device)
            try:
                rows = cap.run(ids, mask)
            except RowMismatch as e:
                keys = ", ".join(f"`{s.key}`" for s in chunk)
                hint = "; try --batch-size 1" if len(chunk) > 1 else ""
                raise RowMismatch(f"the batch of samples {keys}: {e}{hint}") from e
            for s, hidden in zip(chunk, rows):
                tensors = cap.points.sample(
                    torch.tensor(s.input_ids), torch.tensor(s.loss_mask), hidden, key=s.key
                )
                twins = work.twins.get(s.key, [])
                for t in [s] + twins:
                    key = work.key(t)
                    if key is None:
                        sink.append(t.key, **tensors)
                    else:
                        sink.append(t.key, capture_key=key, **tensors)
                written += 1 + len(twins)
                counts.forward += 1
                if bar is not None:
                    bar.update(1 + len(twins))
        if bar is not None:
            bar.close()
    return written


def _usable_pad_id(model: nn.Module, pad_id: int) -> int:
    """The id padding positions get: ``pad_id`` where the embedding has it, else 0. A
    tokenizer or config may name none inside the vocabulary (``pad_token_id=-1``); padded
    positions are masked and their rows never stored, so any valid id gives the same rows."""
    vocab = None
    get = getattr(model, "get_input_embeddings", None)
    if callable(get):
        try:
            vocab = getattr(get(), "num_embeddings", None)
        except (NotImplementedError, AttributeError):
            vocab = None
    if not isinstance(vocab, int):
        from .points import text_config

        config = getattr(model, "config", None)
        vocab = getattr(text_config(config), "vocab_size", None) if config is not None else None
    if pad_id < 0 or (isinstance(vocab, int) and pad_id >= vocab):
        return 0
    return pad_id


def _check_unique_keys(samples: Sequence[Sample]) -> None:
    keys = [s.key for s in samples]
    if len(set(keys)) != len(keys):
        dup = sorted({k for k in keys if keys.count(k) > 1})[:5]
        raise ValueError(f"sample keys must be unique; repeated: {dup}")


def _check_token_ids(samples: Sequence[Sample], config, data: str) -> None:
    """Refuses a prompt holding a token id outside the model's vocabulary (prompts tokenized
    for another model), naming it, before the model is loaded: the embedding would fail on it
    with an index error (a device-side assert on a GPU) that names no prompt."""
    from .points import text_config

    vocab = getattr(text_config(config), "vocab_size", None)
    if not isinstance(vocab, int) or vocab <= 0:
        return
    for s in samples:
        bad = next((i for i, t in enumerate(s.input_ids) if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(
                f"{data}: prompt `{s.key}` has token id {s.input_ids[bad]} at position {bad}, outside the model's "
                f"vocabulary of {vocab} ids (0 to {vocab - 1}): were its input_ids made by another model's tokenizer?"
            )


def _tool_version() -> str:
    import transformers

    return f"transformers {transformers.__version__}"


def extract(
    model: str,
    data: str,
    layers: Sequence[int],
    out: str,
    *,
    batch_size: int = 8,
    max_len: Optional[int] = None,
    dtype: str = "bf16",
    device: str = "cpu",
    padding_side: str = "right",
    revision: Optional[str] = None,
    trust_remote_code: bool = False,
    sink: Optional[Sink] = None,
    stack: bool = False,
    rank: int = 0,
    world_size: int = 1,
    shared: Optional[bool] = None,
    counts: Optional[CaptureCounts] = None,
    quantize: Optional[str] = None,
) -> int:
    """Load ``model``, read ``data`` and write the captured states to ``out`` (or ``sink``).
    ``quantize``: ``"fp8"`` stores the hidden states as FP8 with a scale per token and layer
    (lossy, half the bytes; ``"fp8:NAME,..."`` names the fields), as ``hspack.Writer`` does.
    ``stack``: every id but the last in one stacked field ``aux_hidden_state`` (EAGLE-3).
    ``rank`` of ``world_size``: this process captures the samples ``rank``, ``rank +
    world_size``, ... of ``data``, into ``out`` shared with the other ranks (``shared``, on by
    default when ``world_size > 1``): each commits its own shards, ordinals stay dense.
    ``out`` a store dataset ``STORE/NAME``: samples any dataset of the store holds for the same
    capture (model, its weights (``reuse.model_revision``), config, dtype, layers, fields, tokens and loss mask; with
    ``batch_size=1`` the capture is per-sample deterministic) are copied, not run
    (``capture.reuse``); ``counts`` says how many."""
    check_batching(batch_size, rank, world_size)
    if shared is None:
        shared = world_size > 1
    check_prompts(data, max_len)
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r}: give one of {', '.join(sorted(_DTYPES))}")
    if sink is not None and quantize is not None:
        raise ValueError("quantize applies to the dataset extract writes: with a sink, give the sink's writer the quantize option")
    _check_device(device)
    _check_model(model)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch_dtype = _DTYPES[dtype]
    config = AutoConfig.from_pretrained(model, revision=revision, trust_remote_code=trust_remote_code)
    # The layers and the prompts are checked before the model is loaded.
    num_layers, hidden_size = model_shape(config)
    points = CapturePoints.select(num_layers, layers, stack=stack)
    tokenizer = _Tokenizer(lambda: AutoTokenizer.from_pretrained(model, revision=revision, trust_remote_code=trust_remote_code), model)
    samples = list(read_samples(data, tokenizer, max_len))
    # Every rank reads the whole file: a key repeated across ranks' parts is refused here,
    # not at some rank's commit.
    _check_unique_keys(samples)
    _check_token_ids(samples, config, data)
    samples = samples[rank::world_size]
    pad_id = tokenizer.pad_id(config)
    kwargs = dict(revision=revision, trust_remote_code=trust_remote_code, dtype=torch_dtype)
    try:
        net = AutoModelForCausalLM.from_pretrained(model, **kwargs)
    except ValueError:
        from transformers import AutoModel

        net = AutoModel.from_pretrained(model, **kwargs)
    net.to(device).eval()
    if sink is None:
        import hspack

        schema = points.schema(hidden_size, torch_dtype)
        # What names the weights (a folder's weight files, a hub commit), not the revision as
        # given: a resume after the weights changed is then refused, never mixed in.
        weights = model_revision(model, revision, config)
        meta = capture_metadata(
            model=model,
            revision=weights,
            config_hash=config_hash(config.to_dict()),
            num_layers=num_layers,
            hidden_size=hidden_size,
            dtype=torch_dtype,
            tp_size=1,
            tool="hspack.capture.hf",
            tool_version=_tool_version(),
        )
        options = {} if quantize is None else {"quantize": quantize}
        with hspack.Writer(out, schema, capture=meta, shared=shared, **options) as writer:
            reuse = None
            if writer.in_store:
                reuse = capture_config(
                    model=model, revision=weights, config_hash=meta["config_hash"],
                    engine="transformers", deterministic=batch_size == 1, dtype=meta["dtype"],
                    layers=points.ids, fields=[f["name"] for f in schema],
                )
            try:
                return capture_samples(net, samples, points.ids, writer, batch_size=batch_size,
                                       pad_id=pad_id, padding_side=padding_side, progress=True, stack=stack,
                                       reuse=reuse, counts=counts)
            except KeyboardInterrupt as e:
                # The samples appended are whole: committed, a rerun resumes after them (the
                # writer's exit would drop them with the interrupt).
                try:
                    held = writer.commit()["samples"]
                except KeyboardInterrupt as again:
                    _note(again, f"{out}: interrupted again while committing what was captured; run the same command again: it resumes after what the dataset holds")
                    raise
                _note(e, f"{out} holds the {held} samples captured so far: run the same command again to capture the rest")
                raise
    return capture_samples(net, samples, points.ids, sink, batch_size=batch_size,
                           pad_id=pad_id, padding_side=padding_side, progress=True, stack=stack,
                           counts=counts)


def _note(e: BaseException, text: str) -> None:
    """Adds `text` to `e`'s notes (`BaseException.add_note`, which Python 3.9 and 3.10 lack)."""
    e.__notes__ = [*getattr(e, "__notes__", []), text]


class _Tokenizer:
    """The model's tokenizer, loaded when a prompt first needs it (conversations are
    tokenized; prompts given as token ids need none, so a model saved without one captures
    them)."""

    def __init__(self, load, model: str):
        self._load, self._model, self._loaded = load, model, None

    def _get(self):
        if self._loaded is None:
            try:
                self._loaded = self._load()
            except Exception as e:  # noqa: BLE001 - any failure to load is told as one
                raise ValueError(
                    f"{self._model}: its tokenizer does not load ({type(e).__name__}: {e}); prompts given as "
                    "conversations or messages are tokenized with it: save the tokenizer beside the model, or give "
                    "every prompt as input_ids"
                ) from e
        return self._loaded

    def __getattr__(self, name: str):
        return getattr(self._get(), name)

    def __call__(self, *args, **kwargs):
        return self._get()(*args, **kwargs)

    def pad_id(self, config) -> int:
        """The pad token: the tokenizer's where one loads, else the model config's, else 0 (its
        rows are masked and never stored)."""
        if self._loaded is None:
            try:
                self._get()
            except ValueError:
                pad = getattr(config, "pad_token_id", None)
                return int(pad) if isinstance(pad, int) else 0
        pad = self._loaded.pad_token_id
        return pad if pad is not None else 0


def _check_model(model) -> None:
    """Refuse a model named as a path (absolute, or ``./``, ``../``, ``~``) that is no folder,
    before transformers takes it for a hub id and says the id is malformed."""
    text = os.fspath(model)
    if not (os.path.isabs(text) or text.startswith(("./", "../", "~"))):
        return
    path = os.path.expanduser(text)
    if not os.path.exists(path):
        raise ValueError(f"model {text}: no such folder; give the folder of a saved model (config.json and its weights), or a hub id (org/name)")
    if not os.path.isdir(path):
        raise ValueError(f"model {text}: is a file; give the folder of a saved model (config.json and its weights), or a hub id (org/name)")


def _check_device(device: str) -> None:
    """Refuse a device torch does not know, or a CUDA device where there is none, before the
    prompts are read and the model loaded."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device {device!r}: {e}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: torch finds no CUDA device here; give --device cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device {device!r}: torch finds {torch.cuda.device_count()} CUDA devices here")


def _env_int(name: str, default: int) -> int:
    """The integer in environment variable ``name`` (as torchrun sets ``RANK``), or ``default``."""
    value = os.environ.get(name, "")
    if not value.strip():
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"${name} is {value!r}, not an integer; set it to one, or give the flag") from None


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``python -m hspack.capture.hf``."""
    parser = argparse.ArgumentParser(prog="python -m hspack.capture.hf", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("extract", help="capture hidden states of a prompt file into a dataset")
    ex.add_argument("--model", required=True, help="model path or hub id")
    ex.add_argument("--data", required=True, help="JSONL prompts (input_ids or conversations/messages)")
    ex.add_argument("--layers", required=True, help="comma-separated ids: i = input of layer i, num_layers = final norm")
    ex.add_argument("--out", required=True, help="dataset folder to write (resumed if it exists); STORE/NAME writes into a store and skips what it holds")
    ex.add_argument("--batch-size", type=int, default=8)
    ex.add_argument("--max-len", type=int, default=None, help="truncate samples to this many tokens")
    ex.add_argument("--dtype", default="bf16", choices=sorted(_DTYPES))
    ex.add_argument("--device", default="cpu")
    ex.add_argument("--padding-side", default="right", choices=["left", "right"])
    ex.add_argument("--revision", default=None)
    ex.add_argument("--trust-remote-code", action="store_true")
    ex.add_argument("--stack", action="store_true", help="store every id but the last in one stacked field aux_hidden_state (EAGLE-3; read without a copy)")
    ex.add_argument("--rank", type=int, default=None,
                    help="this process's rank (default $RANK, as torchrun sets it, or 0)")
    ex.add_argument("--world-size", type=int, default=None,
                    help="processes capturing into --out at once, each every world-size-th sample (default $WORLD_SIZE or 1)")
    ex.add_argument("--quantize", default=None, metavar="fp8[:FIELDS]",
                    help="store the hidden states as FP8 with a scale per token and layer (lossy, half the bytes)")
    ex.add_argument("--shared", action="store_true",
                    help="share --out with other writers even with one rank (on whenever --world-size > 1)")
    args = parser.parse_args(argv)
    counts = CaptureCounts()
    try:
        rank = args.rank if args.rank is not None else _env_int("RANK", 0)
        world_size = args.world_size if args.world_size is not None else _env_int("WORLD_SIZE", 1)
        n = extract(
            args.model, args.data, parse_layers(args.layers), args.out,
            batch_size=args.batch_size, max_len=args.max_len, dtype=args.dtype, device=args.device,
            padding_side=args.padding_side, revision=args.revision, trust_remote_code=args.trust_remote_code,
            stack=args.stack, rank=rank, world_size=world_size,
            shared=True if args.shared else None, counts=counts, quantize=args.quantize,
        )
    except command_errors() as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        said = "; ".join(getattr(e, "__notes__", [])) or f"{args.out} holds what was committed before; run the same command again to resume"
        print(f"{parser.prog}: interrupted: {said}", file=sys.stderr)
        return 130
    print(f"wrote {n} samples to {args.out}; {counts.summary()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
