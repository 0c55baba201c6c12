"""Where a rank stands in the run, and where each iteration starts: the one home of the
rules for `set_epoch`, `load_state_dict` and a new iteration, shared by `HspackSampler`,
`HspackIterableDataset` (which count samples) and `TokenBudgetBatchSampler` (batches).

- `set_epoch(e)` starts epoch `e` from its beginning, except right after `load_state_dict`
  of a state of epoch `e`: the restored position stands. So the resume pattern
  `loader.load_state_dict(state)`, then `for epoch in range(state["epoch"], E):
  loader.set_epoch(epoch); for batch in loader: ...` trains each sample once.
- The first iteration after `load_state_dict` yields exactly what the saved epoch had left:
  nothing when the state was saved at the epoch's end (the loop then moves to the next epoch).
- Otherwise an iteration continues an epoch broken off midway (`break`, then `for` again:
  exactly the rest), and starts a complete epoch again from its first sample, in the same
  order (as torch's `DistributedSampler` without `set_epoch`): an epoch is never silently
  empty. Call `set_epoch` each epoch for a new order. An iteration that ran to its end
  completed its epoch, whatever `drop_last` left out of its last batch (`finish`).
- `load_state_dict` refuses a state saved with another seed, world size or order option, over
  another count of samples, samples cut into other shards (a shuffled order follows shard
  boundaries) or of other lengths (batches follow them), or by the other kind of sampler (one
  counts samples, the other batches): the epoch's order, hence what the consumed count
  covers, would differ, and samples be skipped or repeated. A key the state lacks (states of
  earlier versions) is taken to match, as before.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

from .._dataset import _as_index, count_option
from .._errors import kind_of, make_error
from . import order as _order

# The ordering options that count something (samples, batches, tokens): 1 or more.
COUNTS = {"block_size", "window_blocks", "bucket_size", "max_tokens"}
#: The ordering options that are True or False: a string such as "false", read from a config
#: file, was taken as True (samples dropped, or shuffled, unsaid).
FLAGS = {"shuffle", "drop_last", "pad", "even_batches"}


class Progress:
    """`(epoch, consumed)` of this rank, and `fixed`: what the epoch's order depends on
    (seed, world size, and the owner's `order` options), recorded in the state and checked
    when loading one. Consumed counts samples or batches, as the owner advances it."""

    def __init__(self, seed: int, rank: int | None, world_size: int | None, unit: str, **order: Any):
        # Resolved here, in the main process: DataLoader workers have no process group.
        self.rank, self.world_size = _order.world(rank, world_size)
        # Checked here, the one place every ordering option passes: a negative seed failed at
        # the first batch in numpy's words, a bucket of 0 in range()'s.
        self.seed = seed = count_option("seed", seed, 0)
        for name in COUNTS & order.keys():
            order[name] = count_option(name, order[name], 1)
        for name in FLAGS & order.keys():
            if not isinstance(order[name], bool):
                raise make_error("BadOption", f"option {name}: {order[name]!r} must be True or False", option=name)
        if order.get("drop_last") and order.get("pad"):
            # `partition` drops first: the samples past the last full round were left out.
            raise make_error(
                "BadOption",
                "option pad: drop_last=True and pad=True ask for opposite things (leave the last samples out, or "
                "repeat some so every rank gets as many): choose one",
                option="pad",
            )
        self.fixed = {"seed": seed, "world_size": self.world_size, "unit": unit, **order}
        self.epoch = 0
        self.consumed = 0
        # The size of the epoch the last iteration began in (samples or batches).
        self.total: int | None = None
        # The position came from `load_state_dict`: no iteration has started from it, nor
        # has consumption advanced since.
        self.restored = False

    def publish(self, start: int | None = None) -> None:
        """Called after every change of the position, with where the next iteration starts
        when that is not the consumed count; `_Epoch` shares it with workers."""

    def set_epoch(self, epoch: int) -> None:
        """Starts epoch `epoch` from its beginning, unless it is the epoch of a state just
        loaded (see the module's rules)."""
        epoch = count_option("epoch", epoch, 0)
        if not (self.restored and epoch == self.epoch):
            self.epoch, self.consumed, self.restored = epoch, 0, False
        self.publish()

    def _start(self, total: int) -> int:
        if self.restored or self.consumed < total:
            return self.consumed
        return 0  # the epoch is complete: it starts again

    def begin(self, total: int) -> int:
        """Where the iteration starting now begins, in an epoch of `total` (samples or
        batches); recorded as the consumed count. Call it once per iteration, when the
        iteration starts yielding (`iterate`): a second call would see an epoch the first
        resumed at its end as complete, and start it again."""
        self.consumed, self.restored, self.total = self._start(total), False, total
        self.publish()
        return self.consumed

    def iterate(self, epoch: Callable[[], Sequence]) -> Iterator:
        """What an iteration over `epoch()` (the epoch's items in order, consumed ones
        included) yields: the items from where it begins. A generator, so the iteration
        begins at its first `next()`, not when the iterator is made: a DataLoader with
        workers makes its sampler's iterator twice per iteration (in
        `_BaseDataLoaderIter.__init__` and in `_reset`) and draws from the second only."""
        items = epoch()
        rest = items[self.begin(len(items)) :]
        yield from rest.tolist() if hasattr(rest, "tolist") else rest  # numpy ints as ints

    def finish(self) -> None:
        """Records that the iteration ran to its end: its epoch is complete, even where the
        DataLoader's `drop_last` dropped the last samples (else every later iteration would
        start at those few, and drop them again: empty epochs)."""
        if self.total is not None:
            self.consumed, self.restored = self.total, False
            # An iteration no loader begins (a plain DataLoader, a `for` over the dataset)
            # starts where the last one left the workers: the complete epoch again, never
            # at its end (an empty epoch).
            self.publish(self._start(self.total))

    def left(self, total: int) -> int:
        """How many of `total` the next iteration yields."""
        return max(0, total - self._start(total))

    def advance(self, count: int) -> None:
        """Records that the training loop consumed `count` more."""
        self.consumed += int(count)
        if self.total is not None:
            # A last batch counted as a full one (no `ordinal` to count by) stops at the end.
            self.consumed = min(self.consumed, self.total)
        self.restored = False

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "consumed": self.consumed, "rank": self.rank, **self.fixed}

    def load_state_dict(self, state: dict) -> None:
        """Resumes: the next iteration yields exactly what the saved epoch had left. Refuses a
        state whose order would differ (see the module's rules); the rank may differ (a
        trainer may load rank 0's state on every rank)."""
        if not isinstance(state, dict) or not {"epoch", "consumed"} <= state.keys():
            what = f"a dict of keys {sorted(map(str, state))[:8]}" if isinstance(state, dict) else kind_of(state)
            raise ValueError(
                f"not an hspack loader state ({what}; one holds `epoch` and `consumed`): give what "
                "state_dict() of this loader, sampler or dataset returned (in a checkpoint, under the key you saved it as)"
            )
        for key, mine in self.fixed.items():
            saved = state.get(key, mine)
            if saved != mine and key == "unit":
                raise ValueError(
                    f"the state counts {saved} (saved by {'a batch sampler' if saved == 'batches' else 'a sample sampler or dataset'}), "
                    f"this one counts {mine}: its consumed count would be read as {mine} and samples skipped or repeated; "
                    "load a state saved by the same kind of sampler"
                )
            if saved != mine and key == "samples":
                raise ValueError(
                    f"the state was saved over {saved} samples, the dataset holds {mine} now (a capture committed more, "
                    "or it was written again): the saved epoch's order covers the samples it had, so resuming it would "
                    f"skip or repeat some. Either finish epoch {state.get('epoch')} over a copy of the dataset as it was, "
                    f"or start the next epoch over every sample: skip load_state_dict and call set_epoch({int(state.get('epoch', 0)) + 1})"
                )
            if saved != mine and key in ("shards", "lengths"):
                what = "cut into other shards" if key == "shards" else "of other lengths (another dataset, or another max_len)"
                raise ValueError(
                    f"the state was saved over {self.fixed['samples']} samples {what} than this dataset's: the epoch's order "
                    f"follows {'shard boundaries' if key == 'shards' else 'sample lengths'}, so resuming it would skip or repeat "
                    f"samples. Either finish epoch {state.get('epoch')} over the dataset the state was saved with, or start the "
                    f"next epoch here: skip load_state_dict and call set_epoch({int(state.get('epoch', 0)) + 1})"
                )
            if saved != mine:
                raise ValueError(
                    f"the state was saved with {key}={saved!r}, this run has {key}={mine!r}: the epoch order "
                    f"would differ and samples be skipped or repeated; resume with the same {key}"
                )
        for key in ("epoch", "consumed"):
            n = _as_index(state[key])
            if n is None or n < 0:
                # A negative count skipped samples from the end of the epoch's order.
                raise ValueError(f"not an hspack loader state: its {key} is {state[key]!r}, where a saved state holds an int of 0 or more")
        self.epoch, self.consumed, self.restored = int(state["epoch"]), int(state["consumed"]), True
        self.publish()
