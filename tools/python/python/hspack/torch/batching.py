"""Batching: a token-budget batch sampler (lengths from the index, no data reads), a
padding collate, and collation straight into pinned memory for `pin_memory=True`."""

from __future__ import annotations

import copy
from typing import Any, Iterator, Sequence

import numpy as np
import torch
import torch.utils.data as tud

from .._dataset import Fields, count_option
from .._errors import make_error
from .._hspack import EAGLE3, gather_into
from . import order as _order
from .progress import Progress
from .transfer import raise_unreadable
from .views import max_len_option, pinned_empty, shared_empty

# Token ids and the attention mask, named as the Rust side names them (`hspack::format::eagle3`).
_INPUT_IDS = EAGLE3["fields"]["input_ids"]
_ATTENTION_MASK = EAGLE3["specforge_item"]["attention_mask"]
_LOSS_MASK = EAGLE3["specforge_item"]["loss_mask"]


def pack(ordinals: np.ndarray, lengths: np.ndarray, max_tokens: int) -> list[list[int]]:
    """Greedy batches of `ordinals` (taken in the given order) whose padded size
    `len(batch) * max(length)` stays within `max_tokens`; a longer sample is a batch alone."""
    batches: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for o in ordinals.tolist():
        n = int(lengths[o])
        if cur and max(longest, n) * (len(cur) + 1) > max_tokens:
            batches.append(cur)
            cur, longest = [], 0
        cur.append(o)
        longest = max(longest, n)
    if cur:
        batches.append(cur)
    return batches


class TokenBudgetBatchSampler(tud.Sampler):
    """Batches of at most `max_tokens` padded tokens, bucketed by length.

    Each epoch takes this rank's share of the shuffled order (as `HspackSampler`), sorts
    each window of `bucket_size` samples by length, packs them greedily, and shuffles the
    batches by `(seed, epoch, rank)`. Lengths come from the shard indexes, clipped to
    `max_len`. Every sample of the rank lies in exactly one batch. With `even_batches`, every
    rank yields the same number of batches (the smallest over ranks; the extra batches of
    other ranks are skipped this epoch: shuffled, other samples in other epochs; with
    `shuffle=False`, the same ones every epoch), which DDP needs to stay in step.

    Resume: `state_dict()` holds the batches consumed (advanced by `HspackLoader`, or by you
    with `advance(1)` per batch), with the world size and every option the batches depend on;
    `load_state_dict` refuses a state of other ones. Where an iteration starts (after
    `set_epoch`, after `load_state_dict`, after a complete or a broken-off epoch): see
    `hspack.torch.progress`. `rank` and `world_size` go together (`order.world`)."""

    def __init__(self, dataset: Any, max_tokens: int, *, max_len: int | None = None, shuffle: bool = True, seed: int = 0, bucket_size: int = 1024, block_size: int = 64, window_blocks: int = 16, even_batches: bool = False, rank: int | None = None, world_size: int | None = None):
        ds = dataset.hspack if hasattr(dataset, "hspack") else dataset
        self.shard_ranges = _order.agreed(ds, rank, world_size)
        lengths = ds.lengths[: _order.samples(self.shard_ranges)]
        max_len = max_len_option(max_len)
        self.lengths = lengths if max_len is None else np.minimum(lengths, max_len)
        self.max_tokens = max_tokens
        self.shuffle, self.seed, self.bucket_size = shuffle, seed, bucket_size
        self.block_size, self.window_blocks = block_size, window_blocks
        self.even_batches = even_batches
        # Consumed counts batches; the batches depend on every option below.
        # The batches follow the (clipped) lengths, and a shuffled order shard boundaries.
        shape = {"lengths": _order.digest(self.lengths)}
        if shuffle:
            shape["shards"] = _order.digest(self.shard_ranges)
        self.state = Progress(seed, rank, world_size, "batches", samples=len(lengths), max_tokens=max_tokens, max_len=max_len, shuffle=shuffle, bucket_size=bucket_size, block_size=block_size, window_blocks=window_blocks, even_batches=even_batches, **shape)
        self.rank, self.world_size = self.state.rank, self.state.world_size
        if self.world_size > 1 and not even_batches:
            import warnings

            warnings.warn(
                f"batches of at most {max_tokens} tokens over {self.world_size} ranks: each rank packs its own samples, "
                "so ranks yield different numbers of batches, and under DDP the ranks with more wait for the others at "
                "a gradient sync (a hang, or a timeout); pass even_batches=True",
                stacklevel=2,
            )

    def _rank_batches(self, full: np.ndarray, rank: int, world: int) -> list[list[int]]:
        part = _order.partition(full, world, rank)
        batches: list[list[int]] = []
        for i in range(0, len(part), self.bucket_size):
            window = part[i : i + self.bucket_size]
            window = window[np.argsort(self.lengths[window], kind="stable")]
            batches.extend(pack(window, self.lengths, self.max_tokens))
        if self.shuffle:
            perm = _order.rng(self.seed, self.state.epoch, 1 + rank).permutation(len(batches))
            batches = [batches[j] for j in perm]
        return batches

    def batches(self) -> list[list[int]]:
        """This rank's batches for the epoch, consumed ones included."""
        rank, world = self.rank, self.world_size
        full = _order.epoch_order(self.shard_ranges, self.seed, self.state.epoch, self.shuffle, self.block_size, self.window_blocks)
        mine = self._rank_batches(full, rank, world)
        if self.even_batches and world > 1:
            fewest = min(len(self._rank_batches(full, r, world)) for r in range(world))
            mine = mine[:fewest]
        return mine

    def __iter__(self) -> Iterator[list[int]]:
        return self.state.iterate(self.batches)

    def __len__(self) -> int:
        return self.state.left(len(self.batches()))

    def set_epoch(self, epoch: int) -> None:
        self.state.set_epoch(epoch)

    def advance(self, batches: int) -> None:
        self.state.advance(batches)

    def finish(self) -> None:
        self.state.finish()

    def state_dict(self) -> dict:
        return self.state.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.state.load_state_dict(state)


class PadCollate:
    """Collates `[T, ...]` samples into `[B, T_max, ...]` batches, padding at the end.

    Per-token tensors (first dim equals the sample's length, taken from `length_key`) are
    cut to `max_len` and padded: `pad_id` for `input_ids`, 0 elsewhere (so `loss_mask`
    is 0 on padding). Adds `attention_mask` (`[B, T_max]` int64, 1 on real tokens) and
    `lengths`. Ints (`ordinal`) become a tensor; other values are listed. In DataLoader
    workers the batch tensors are allocated in shared memory; with `pin=True`, in pinned
    memory (what `HspackLoader(pin_memory=True)` asks for, see `CollateToPinned`).

    Samples that are batches of one (`[1, T, ...]`, as the `eagle3-specforge` view returns,
    like SpecForge's dataset items) are collated on their token dim, into `[B, T_max, ...]`
    as SpecForge's collator does; one cut to `max_len` has its loss mask zeroed at its last
    kept token, as SpecForge's dataset zeroes the last token of what it keeps (the view
    zeroed the last of the whole sample)."""

    def __init__(self, max_len: int | None = None, pad_id: int = 0, length_key: str = _INPUT_IDS, pad_to_multiple_of: int | None = None):
        # Checked where the collate is made (in the trainer process): 0 cut every sample to no
        # tokens, and a negative one failed in a worker in torch's words.
        self.max_len, self.pad_id, self.length_key = max_len_option(max_len), pad_id, length_key
        multiple = pad_to_multiple_of
        self.multiple = None if multiple is None else count_option("pad_to_multiple_of", multiple, 1)

    def __call__(self, samples: Sequence[dict], pin: bool = False) -> dict:
        # A tensor that could not be received (`transfer.Unreadable`): collated, it would be
        # listed as a value, or fail on an unrelated TypeError.
        raise_unreadable(samples)
        empty = pinned_empty if pin else shared_empty
        items = [_unbatched(s, self.length_key) for s in samples]
        # SpecForge items (batches of one): cut, then the last token kept is not trained on.
        zero_last = [u is not s for u, s in zip(items, samples)]
        samples = items
        first = samples[0]
        key = self.length_key if self.length_key in first else next((k for k, v in first.items() if torch.is_tensor(v)), None)
        if key is None:
            # (A StopIteration out of a collate ends the DataLoader's epoch without a word.)
            raise ValueError(f"PadCollate: the samples hold no tensor to take their lengths from (length_key={self.length_key!r}; the first sample has {sorted(first)}, ordinals {[s.get('ordinal') for s in samples]}); read fields with tensors, or collate with a collate_fn of your own")
        full = [int(s[key].shape[0]) for s in samples]
        lengths = full if self.max_len is None else [min(n, self.max_len) for n in full]
        t_max = max(lengths) if lengths else 0
        if self.multiple:
            t_max = -(-t_max // self.multiple) * self.multiple
        out: dict = {}
        for name, v in first.items():
            if torch.is_tensor(v) and v.dim() >= 1 and v.shape[0] == first[key].shape[0]:
                batch = empty((len(samples), t_max, *v.shape[1:]), v.dtype)
                fill = self.pad_id if name == _INPUT_IDS else 0
                rows = [s[name][:n] for s, n in zip(samples, lengths)]
                if pin and fill == 0:
                    _pad_on_the_pool(batch, rows)
                else:
                    for b, (r, n) in enumerate(zip(rows, lengths)):
                        batch[b, :n] = r
                        if n < t_max:
                            batch[b, n:] = fill
                if name == _LOSS_MASK:
                    for b, (n, whole, zero) in enumerate(zip(lengths, full, zero_last)):
                        if zero and 0 < n < whole:
                            batch[b, n - 1] = 0
                out[name] = batch
            elif isinstance(v, int):
                out[name] = _ints([s[name] for s in samples], pin)
            else:
                out[name] = [s[name] for s in samples]
        mask = empty((len(samples), t_max), torch.int64)
        for b, n in enumerate(lengths):
            mask[b, :n] = 1
            mask[b, n:] = 0
        out[_ATTENTION_MASK] = mask
        out["lengths"] = _ints(lengths, pin)
        return out


def _bytes(t: torch.Tensor) -> np.ndarray:
    return t.reshape(-1).view(torch.uint8).numpy()


def _pad_on_the_pool(batch: torch.Tensor, rows: list[torch.Tensor]) -> None:
    """`batch[b, :n] = rows[b]` and zeros after, on hspack's thread pool: the pin-memory
    thread that pads a batch is one thread (torch sets it so), and a batch of hidden states
    is hundreds of MB."""
    t_max = batch.shape[1]
    row_bytes = batch[0, 0].numel() * batch.element_size() if t_max else 0
    parts, zeros = [], []
    for b, r in enumerate(rows):
        at, n = b * t_max * row_bytes, r.shape[0]
        if n:
            if r.is_contiguous() and r.dtype == batch.dtype and r.shape[1:] == batch.shape[2:]:
                parts.append((at, _bytes(r)))
            else:
                batch[b, :n] = r  # torch converts, or names the mismatch
        if n < t_max:
            zeros.append((at + n * row_bytes, (t_max - n) * row_bytes))
    gather_into(_bytes(batch), parts, zeros)


def _ints(values: list[int], pin: bool) -> torch.Tensor:
    t = torch.tensor(values, dtype=torch.int64)
    return t.pin_memory() if pin else t


class Uncollated:
    """The samples of one batch as a DataLoader worker sends them when the loader pins
    memory: views of the shards travel as file ranges (`hspack.torch.transfer`), and the
    main process's pin-memory thread collates them straight into pinned memory
    (`pin_memory()`, which the DataLoader calls). One copy from the shards to pinned memory,
    where collating in the worker and pinning after makes two (the second in the main
    process)."""

    def __init__(self, samples: list, collate: PadCollate):
        self.samples, self.collate = samples, collate
        self._batch: dict | None = None

    def pin_memory(self, device: Any = None) -> dict:
        return self.collate(self.samples, pin=True)

    def collated(self) -> dict:
        """The batch in ordinary memory, for a loader that did not pin after all."""
        if self._batch is None:
            self._batch = self.collate(self.samples)
        return self._batch

    # Reached by a batch a DataLoader did not pin (`pin_memory=False`): read as the batch it
    # is, collated on first use. (Not a `Mapping`: torch would pin it field by field, a
    # second copy, instead of calling `pin_memory`.)
    def __getitem__(self, name: str) -> Any:
        return self.collated()[name]

    def __iter__(self) -> Any:
        return iter(self.collated())

    def __len__(self) -> int:
        return len(self.collated())

    def __contains__(self, name: object) -> bool:
        return name in self.collated()

    def keys(self) -> Any:
        return self.collated().keys()

    def items(self) -> Any:
        return self.collated().items()

    def values(self) -> Any:
        return self.collated().values()

    def get(self, name: str, default: Any = None) -> Any:
        return self.collated().get(name, default)


def _can_pin() -> bool:
    """Whether a DataLoader with `pin_memory=True` pins here: as torch decides, on an
    accelerator other than MPS (without one, it warns and does not pin)."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None:
        return torch.cuda.is_available()
    if not accelerator.is_available():
        return False
    current = accelerator.current_accelerator()
    return current is None or current.type != "mps"


class CollateToPinned:
    """Wraps a `PadCollate` for a loader that pins memory: in a DataLoader worker it returns
    the samples `Uncollated`, for the main process to collate into pinned memory; without
    workers it collates into pinned memory at once (the DataLoader's pinning then finds
    nothing to copy). Where nothing can be pinned (no accelerator: the DataLoader does not
    pin), it collates as the `PadCollate` does; a batch a loader does not pin after all reads
    as the collated batch (`Uncollated`)."""

    def __init__(self, collate: PadCollate):
        self.collate = collate
        # Decided here, in the main process, once: workers ask no accelerator.
        self.pin = _can_pin()

    def __call__(self, samples: Sequence[dict]) -> Any:
        if not self.pin:
            return self.collate(samples)
        if tud.get_worker_info() is not None:
            return Uncollated(list(samples), self.collate)
        return self.collate(samples, pin=True)


def _unbatched(sample: dict, length_key: str) -> dict:
    """`sample` with the leading batch dim of one dropped from its per-token tensors when its
    token ids (`length_key`, one per token) are `[1, T]`; else `sample` itself."""
    ids = sample.get(length_key)
    if not torch.is_tensor(ids) or ids.dim() != 2 or ids.shape[0] != 1:
        return sample
    t = ids.shape[1]
    return {k: v[0] if torch.is_tensor(v) and v.dim() >= 2 and v.shape[0] == 1 and v.shape[1] == t else v for k, v in sample.items()}


def pad_collate(samples: Sequence[dict]) -> dict:
    """`PadCollate()` with default settings."""
    return PadCollate()(samples)


def _default_collate(batch: Sequence[Fields], *, collate_fn_map: Any = None) -> Any:
    """torch's default collate of hspack samples, as it collates any dict, except that samples
    whose tensors differ in shape (ragged token counts) get an error saying how to batch them,
    not torch's bare "stack expects each tensor to be equal size"."""
    from torch.utils.data._utils.collate import collate

    first = batch[0]
    for name, value in first.items():
        if not torch.is_tensor(value):
            continue
        shapes = [tuple(d[name].shape) if torch.is_tensor(d.get(name)) else None for d in batch]
        if len(set(shapes)) > 1:
            which = f"samples {[d['ordinal'] for d in batch]}" if all("ordinal" in d for d in batch) else "the samples"
            raise make_error(
                "BadOption",
                f"option collate_fn: {which} of one batch differ in shape in field {name!r} ({', '.join(map(str, shapes))}), and "
                "the DataLoader's default collate stacks equal shapes only. Pad them: collate_fn=hspack.torch.PadCollate() "
                "(adds attention_mask and lengths), or batch_sampler=hspack.torch.TokenBudgetBatchSampler(dataset, max_tokens=...) "
                "with PadCollate() to batch samples of similar lengths; "
                "or batch_size=None for one sample a step",
                option="collate_fn",
            )
    out = copy.copy(first)
    out.update({name: collate([d[name] for d in batch], collate_fn_map=collate_fn_map) for name in first})
    return out


def _register_default_collate() -> None:
    """Has `torch.utils.data.default_collate` collate hspack samples (`Fields`) through
    `_default_collate`: the extension point torch documents for `default_collate`, used for
    hspack's own type only (plain dicts are collated as before)."""
    try:
        from torch.utils.data._utils.collate import default_collate_fn_map
    except ImportError:  # a torch without it collates them as dicts
        return
    default_collate_fn_map.setdefault(Fields, _default_collate)


_register_default_collate()
