"""`HspackLoader`: a DataLoader that records how much of the epoch the training loop has
consumed, so `state_dict()` resumes exactly after it."""

from __future__ import annotations

from typing import Any

import torch
import torch.utils.data as tud

from .batching import CollateToPinned, PadCollate, TokenBudgetBatchSampler, Uncollated
from . import transfer as _transfer
from .datasets import HspackIterableDataset, HspackSampler


def accelerator_available() -> bool:
    """True when the DataLoader can pin memory here (it pins for the current accelerator)."""
    acc = getattr(torch, "accelerator", None)
    return acc.is_available() if acc is not None else torch.cuda.is_available()


def _count(batch: Any, fallback: int) -> int:
    """Samples in a collated batch: by its `ordinal` or `lengths` entry, else `fallback` (the
    batch size; a last, partial batch is then counted as full, and the count stops at the
    epoch's end)."""
    if isinstance(batch, dict):
        for key in ("ordinal", "lengths"):  # `lengths`: from PadCollate, for every view
            o = batch.get(key)
            if torch.is_tensor(o) or isinstance(o, list):
                return len(o)
    return fallback


class HspackLoader(tud.DataLoader):
    """A DataLoader over an `HspackIterableDataset`, or an `HspackDataset` with an
    `HspackSampler` (`sampler=`) or a `TokenBudgetBatchSampler` (`batch_sampler=`).

    Each batch the training loop receives advances the state of the dataset or sampler;
    `state_dict()` returns it, and `load_state_dict()` before iterating resumes the epoch with
    exactly the samples not yet received. Where each iteration starts (after `set_epoch`,
    after `load_state_dict`, after a complete or a broken-off epoch) is the rule of
    `hspack.torch.progress`: a resumed epoch is never replayed, a finished one never comes
    back empty, and an iteration that ran to its end completes the epoch (with `drop_last`
    too). Samples are counted one per item when unbatched (`batch_size=None`), else by the
    batch's `ordinal` entry (present in every hspack view except `eagle3-specforge`), else by
    the `lengths` that `PadCollate` adds, else as `batch_size`. `in_order=False` is refused:
    the count names the samples received only when they come in order. Other keyword arguments go to `torch.utils.data.DataLoader`.

    Batches (`batch_size` not None, or a `batch_sampler`) are collated by `PadCollate()`
    unless `collate_fn` says otherwise: samples are ragged, and torch's default collate can
    only stack tensors of one shape.

    With `pin_memory=True` (and an accelerator), a `PadCollate` batch is collated straight
    into pinned memory: workers send the samples uncollated (views of the shards as file
    ranges) and the pin-memory thread pads them into pinned tensors, one copy in all
    (`CollateToPinned`)."""

    def __init__(self, dataset: Any, batch_size: int | None = 1, **kwargs: Any):
        if isinstance(dataset, HspackIterableDataset):
            self._progress = dataset
            self._per_batch = False
        elif isinstance(kwargs.get("batch_sampler"), TokenBudgetBatchSampler):
            self._progress = kwargs["batch_sampler"]
            self._per_batch = True
            batch_size = 1
        elif isinstance(kwargs.get("sampler"), HspackSampler):
            self._progress = kwargs["sampler"]
            self._per_batch = False
        else:
            shuffle = " (for shuffle=True: sampler=HspackSampler(dataset, seed=...), which shuffles by default and resumes)" if kwargs.get("shuffle") else ""
            raise TypeError(f"HspackLoader needs an HspackIterableDataset, or sampler=HspackSampler, or batch_sampler=TokenBudgetBatchSampler{shuffle}")
        if kwargs.get("in_order") is False:
            # Batches would come as workers finish them: the count of those received could
            # not say which samples they were, and a resume would skip some and repeat others.
            raise ValueError("HspackLoader needs in_order=True (the default): state_dict() counts the samples received, which names them only when they come in order")
        self._fallback = batch_size or 1
        batched = batch_size is not None or kwargs.get("batch_sampler") is not None
        # Unbatched (`batch_size=None`), each item is one sample, whatever its structure.
        self._batched = batched
        if batched and kwargs.get("collate_fn") is None:
            # Samples are ragged (one row per token): torch's default collate cannot stack
            # them, and inside workers fails with an unrelated storage error.
            kwargs["collate_fn"] = PadCollate()
        if kwargs.get("pin_memory") and isinstance(kwargs.get("collate_fn"), PadCollate) and accelerator_available():
            kwargs["collate_fn"] = CollateToPinned(kwargs["collate_fn"])
        if "batch_sampler" in kwargs:
            super().__init__(dataset, **kwargs)
        else:
            super().__init__(dataset, batch_size=batch_size, **kwargs)

    def __iter__(self) -> Any:
        if isinstance(self._progress, HspackIterableDataset):
            # Workers start where the training loop stands, and deal out this loader's batches.
            self._progress.begin(self._fallback)
        # (The samplers fix their start at the first item their iterator yields, in this
        # process: `Progress.iterate`.)
        for batch in super().__iter__():
            # A tensor a worker sent that could not be received: raised before it counts as
            # consumed, so the next iteration starts with its sample.
            _transfer.raise_unreadable(batch)
            if isinstance(batch, Uncollated):  # pinning was turned off after all
                batch = batch.collated()
            if self._per_batch or not self._batched:
                self._progress.advance(1)
            else:
                self._progress.advance(_count(batch, self._fallback))
            yield batch
        # Ran to its end: the epoch is complete, whatever `drop_last` left out.
        self._progress.finish()

    def set_epoch(self, epoch: int) -> None:
        self._progress.set_epoch(epoch)

    def state_dict(self) -> dict:
        return self._progress.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self._progress.load_state_dict(state)
