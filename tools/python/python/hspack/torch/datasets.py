"""Torch datasets over an hspack dataset: map-style with a resumable sampler, and iterable
for streaming. Both pickle as path and options and reopen the mapping lazily in each
DataLoader worker (fork or spawn). The rank and world size come from `torch.distributed`
when the sampler or iterable dataset is built (build it after `init_process_group`), or are
given explicitly, both of them. With the ranks of torch.distributed, building a sampler or an
iterable dataset is a collective: the ranks agree on the samples to order, those every rank
opened (`order.agreed`). Resume and the start of each epoch: `hspack.torch.progress`."""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch.utils.data as tud

from .. import _hspack
from .._dataset import Dataset, count_option, grown_from, shards_of
from .._errors import make_error
from . import order as _order
from . import progress as _progress
from . import transfer as _transfer
from .views import Eagle3View, FieldsView


#: The views named by a string, and what each builds.
VIEWS: dict[str, Callable[[int | None], Callable]] = {
    "eagle3": lambda max_len: Eagle3View(max_len=max_len),
    "eagle3-specforge": lambda max_len: Eagle3View(max_len=max_len, layout="specforge"),
}


def make_view(view: Any, fields: Sequence[str] | None, max_len: int | None) -> Callable:
    """The view object for `view`: None (fields), a name from `VIEWS`, or a callable
    `view(hspack_dataset, ordinal)`. Anything else is refused here, naming the known views."""
    if view is None:
        return FieldsView(fields, max_len)
    if fields is not None:
        # A view picks its own fields: the ones given would be ignored without a word.
        raise make_error("BadOption", f"option fields: {list(fields)!r} with view={view!r}; a view picks its own fields: give fields with view=None, or name the view's fields in the view (Eagle3View(aux_fields=..., target_field=...))", option="fields")
    if isinstance(view, str) and view in VIEWS:
        return VIEWS[view](max_len)
    if callable(view) and not isinstance(view, str):
        if max_len is not None:
            # A view object cuts its own samples: the max_len given would be ignored.
            raise make_error("BadOption", f"option max_len: {max_len} with a view object ({type(view).__name__}); give max_len to the view (Eagle3View(max_len=...)), or use a view name (view=\"eagle3\", max_len=...)", option="max_len")
        return view
    known = ", ".join(f'"{name}"' for name in VIEWS)
    raise make_error("BadOption", f"option view: {view!r} is not a view; use None (the fields), {known}, or a callable view(dataset, ordinal)", option="view")



_FAULTS_EXPLAINED_IN: int | None = None


def _explain_faults_here() -> None:
    """A DataLoader worker installs its own handlers for SIGBUS and SIGSEGV, which blame
    shared memory for a shard cut short since it was mapped: hspack's, which names the file,
    is put back in front of them, once in each worker process."""
    global _FAULTS_EXPLAINED_IN
    if _FAULTS_EXPLAINED_IN != os.getpid():
        _hspack.explain_faults_again()
        _FAULTS_EXPLAINED_IN = os.getpid()

class _Epoch(_progress.Progress):
    """The position (`progress.Progress`, counting samples) of the sampler and the iterable
    dataset, with this rank's order for the epoch."""

    def __init__(self, shuffle: bool, seed: int, block_size: int, window_blocks: int, drop_last: bool, pad: bool, rank: int | None, world_size: int | None, shard_ranges: Sequence[tuple[int, int]]):
        self.shuffle, self.block_size, self.window_blocks = shuffle, block_size, window_blocks
        self.drop_last, self.pad = drop_last, pad
        import torch

        # (epoch, consumed) as of the start of the current iteration, and the batch size the
        # loader iterating batches by (an iterable dataset's workers deal whole batches), in
        # shared memory, so DataLoader workers (persistent ones too) start where the main
        # process says.
        self._shared = torch.zeros(3, dtype=torch.int64).share_memory_()
        # A shuffled order follows shard boundaries: the same count of samples cut into other
        # shards (a copy re-converted or quantized) orders them otherwise.
        shards = {"shards": _order.digest(shard_ranges)} if shuffle else {}
        samples = _order.samples(shard_ranges)
        super().__init__(seed, rank, world_size, "samples", shuffle=shuffle, block_size=block_size, window_blocks=window_blocks, drop_last=drop_last, pad=pad, samples=samples, **shards)
        if self.world_size > 1 and samples % self.world_size and not (drop_last or pad):
            import warnings

            warnings.warn(
                f"{samples} samples over {self.world_size} ranks: some ranks get one sample more than others, so under "
                "DDP they run a step more and wait for the others at its gradient sync (a hang, or a timeout); pass "
                "drop_last=True (every rank the same count, the last samples of the epoch left out) or pad=True (the "
                "short ranks repeat a sample)",
                stacklevel=3,
            )

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if not self._shared.is_shared():
            # A copy (`copy.deepcopy`, or pickle outside torch's multiprocessing): torch copied
            # the position into private memory, which workers forked from this process would
            # read as it was when forked. The copy gets shared memory of its own. (A spawned
            # worker receives the original's shared memory itself, and keeps it.)
            self._shared = self._shared.clone().share_memory_()

    def publish(self, start: int | None = None) -> None:
        """Makes the current epoch and `start` (the consumed count unless given) the start of
        the next iteration, for every worker: called by set_epoch, load_state_dict, at the
        start of each iteration and at the end of one that completed its epoch."""
        start = self.consumed if start is None else start
        self._shared[0], self._shared[1] = self.epoch, start

    def published(self) -> tuple[int, int]:
        return int(self._shared[0]), int(self._shared[1])

    def publish_batch_size(self, batch_size: int) -> None:
        self._shared[2] = int(batch_size)

    def published_batch_size(self) -> int:
        return int(self._shared[2])

    def rank_order(self, shard_ranges: Sequence[tuple[int, int]], epoch: int | None = None) -> np.ndarray:
        """This rank's samples for the epoch (the current one when None), in order (all of
        them, consumed included)."""
        epoch = self.epoch if epoch is None else epoch
        full = _order.epoch_order(shard_ranges, self.seed, epoch, self.shuffle, self.block_size, self.window_blocks)
        return _order.partition(full, self.world_size, self.rank, self.drop_last, self.pad)


def _transfer_option(transfer: str) -> str:
    if transfer not in ("map", "copy"):
        from .._errors import make_error

        raise make_error("BadOption", "option transfer: must be \"map\" or \"copy\"", option="transfer")
    return transfer


def _remove_memo(folder: str, owner: int) -> None:
    if os.getpid() == owner:  # not from forked workers
        shutil.rmtree(folder, ignore_errors=True)


#: Checked-chunk memo folders are named `hspack-checked-{pid namespace}-{pid}-...`.
_MEMO_PREFIX = "hspack-checked-"


def _pid_namespace() -> str:
    """This boot of this machine and its pid namespace: pids are those of one namespace of one
    host (a temp folder may be shared with other hosts, and namespace inodes repeat across
    them); "0" where `/proc` cannot say, which no cleanup touches."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip().replace("-", "")[:12]
        return f"{boot}.{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return "0"


def _remove_dead_memos(base: str | None) -> None:
    """Removes the memo folders of processes of this pid namespace that are gone: a folder is
    removed when its dataset object is collected, which a process killed (`SIGKILL`, or the
    `SIGTERM` torchrun sends the ranks when one fails) never does, and `/dev/shm` is memory."""
    namespace = _pid_namespace()
    if namespace == "0":
        return
    folder, mine = base or tempfile.gettempdir(), f"{_MEMO_PREFIX}{namespace}-"
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        pid = name[len(mine) :].split("-")[0] if name.startswith(mine) else ""
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
        except OSError:  # alive, another user's
            pass


#: Live hspack torch dataset objects of this process, by folder: the files its workers send
#: stay mapped while one of them lives.
_LIVE: dict[str, int] = {}


def _release_received(folder: str, owner: int) -> None:
    if os.getpid() != owner:  # not from forked workers
        return
    _LIVE[folder] -= 1
    if not _LIVE[folder]:
        del _LIVE[folder]
        _transfer.release(folder)


def _check_grown_from(ds: Dataset, opened: list[tuple[int, int, str]]) -> None:
    """Refuses a dataset, reopened in a worker, whose first shards are not the ones the
    process that made the dataset object opened (it was rewritten, not appended to): the
    ordinals ordered there would name other samples here."""
    if not grown_from(shards_of(ds), opened):
        raise make_error(
            "Io",
            f"{ds.path}: the dataset changed since this DataLoader's dataset object was made (its shards are no longer "
            f"the {len(opened)} it was made with: it was rewritten, not appended to); make the dataset object again",
            path=ds.path,
        )


class _Reopening:
    """Opens `self.path` on first use in each process and pickles without the mapping, so
    DataLoader workers (fork or spawn) reopen it. Inside a worker it also installs
    `hspack.torch.transfer`, so zero-copy tensors reach the main process as file ranges,
    not copies (unless `self.transfer` is `"copy"`).

    With `check="once"`, the object makes a checked-chunk memo folder (in `/dev/shm` when
    there is one) that its workers share: each chunk is hashed once for the whole run, not
    once per worker and epoch. The folder is removed when the object is collected.

    `cache_dir` and `cache_bytes` are `hspack.open`'s: for a dataset in object storage, a
    block cache the workers share (and later runs too: the folder is kept)."""

    def _release_received_when_collected(self) -> None:
        # The files this process maps for tensors its workers send stay mapped while a
        # dataset object of their folder lives (`hspack.torch.transfer`).
        _LIVE[self.path] = _LIVE.get(self.path, 0) + 1
        weakref.finalize(self, _release_received, self.path, os.getpid())

    def _make_memo(self) -> None:
        self.checked_memo: str | None = None
        self._memo_owner = os.getpid()
        if self.check == "once":
            base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
            _remove_dead_memos(base)
            prefix = f"{_MEMO_PREFIX}{_pid_namespace()}-{os.getpid()}-"
            self.checked_memo = tempfile.mkdtemp(prefix=prefix, dir=base)
            self._memo_cleanup = weakref.finalize(self, _remove_memo, self.checked_memo, os.getpid())

    @property
    def hspack(self) -> Dataset:
        """The underlying `hspack.Dataset`, opened on first use in each process; reopened
        (a spawned worker), it must hold the shards first opened, else it is refused."""
        if self._ds is None:
            ds = Dataset(self.path, check=self.check, checked_memo=self.checked_memo, cache_dir=self.cache_dir, cache_bytes=self.cache_bytes)
            opened = getattr(self, "_opened", None)
            if opened is None:
                self._opened = shards_of(ds)
            else:
                _check_grown_from(ds, opened)
            # With transfer="copy" its tensors go as torch sends them (writable copies), even
            # where another dataset of the worker sends its own as file ranges.
            ds.native.set_sends_ranges(self.transfer == "map")
            self._ds = ds
        if tud.get_worker_info() is not None:
            _explain_faults_here()
        if self.transfer == "map" and tud.get_worker_info() is not None:  # a worker, forked or spawned
            if not _transfer.installed():
                _transfer.install()
            # The trainer maps what this worker reads: the worker loads each sample into the
            # page cache itself, so cold disk reads run in the workers, in parallel.
            if self._ds.readahead != "load":
                self._ds.readahead = "load"
        return self._ds

    def _open(self) -> Dataset:
        """Opens the dataset now and checks that the view can serve it (a view's `check`,
        as `Eagle3View.check`): a bad path or a missing field fails here, at construction,
        not in a DataLoader worker."""
        check = getattr(self.view, "check", None)
        if check is not None:
            check(self.hspack)
        return self.hspack

    def __getstate__(self) -> dict:
        state = {**self.__dict__, "_ds": None}
        state.pop("_memo_cleanup", None)  # the creating process removes the folder
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if state.get("_memo_owner") == os.getpid():
            # A copy made in the process that made the memo (`copy.deepcopy`): the original
            # removes its folder when collected, so the copy gets its own.
            self._make_memo()
            self._release_received_when_collected()


class HspackDataset(_Reopening, tud.Dataset):
    """Map-style dataset: `ds[i]` is the view of sample `i` (`{field: tensor, "ordinal": i}`
    by default; `view="eagle3"` / `"eagle3-specforge"` for the EAGLE-3 view; or any callable
    `view(hspack_dataset, ordinal)`). Pair it with `HspackSampler` (shuffled, partitioned,
    resumable) or `TokenBudgetBatchSampler`.

    `transfer="map"` (default) sends zero-copy tensors from DataLoader workers as file
    ranges that the main process views through its own read-only mapping of the file
    (`hspack.torch.transfer`); `"copy"` leaves them to torch's shared-memory copy (writable)."""

    def __init__(self, path: str | os.PathLike, fields: Sequence[str] | None = None, *, view: Any = None, max_len: int | None = None, check: str = "once", transfer: str = "map", cache_dir: str | os.PathLike | None = None, cache_bytes: int | None = None):
        self.path, self.check = os.fspath(path), check
        self.cache_dir, self.cache_bytes = cache_dir, cache_bytes
        self.transfer = _transfer_option(transfer)
        self.view = make_view(view, fields, max_len)
        self._ds: Dataset | None = None
        self._make_memo()
        self._release_received_when_collected()
        self._open()

    def __len__(self) -> int:
        return len(self.hspack)

    def __getitem__(self, i: int) -> Any:
        if isinstance(i, str):
            ordinal = self.hspack.ordinal(i)
            if ordinal is None:
                raise KeyError(f"{self.path}: no sample has key {i!r}")
            i = ordinal
        # A negative index counts from the end, as for the hspack dataset; a float or a bool
        # is refused there (int(2.7) read sample 2).
        return self.view(self.hspack, self.hspack._index(i))


class HspackSampler(tud.Sampler):
    """Yields this rank's ordinals for the epoch: shuffled by `(seed, epoch)` in shard-local
    blocks (see `hspack.torch.order`), partitioned across `torch.distributed` ranks.

    Partition policy: by default every sample exactly once per epoch, ranks differing by at
    most one sample (with DDP, uneven ranks run different step counts: use `drop_last` or
    `pad`, see `order.partition`). Call `set_epoch(e)` before each epoch. Resume mid-epoch
    with `state_dict()` / `load_state_dict()`: the consumed count is advanced by
    `HspackLoader` (or by you, with `advance(n)`), and iteration resumes after it. Where an
    iteration starts (after `set_epoch`, after `load_state_dict`, after a complete or a
    broken-off epoch): see `hspack.torch.progress`. `rank` and `world_size` go together
    (`order.world`)."""

    def __init__(self, dataset: Any, *, shuffle: bool = True, seed: int = 0, block_size: int = 64, window_blocks: int = 16, drop_last: bool = False, pad: bool = False, rank: int | None = None, world_size: int | None = None):
        ds = dataset.hspack if hasattr(dataset, "hspack") else dataset
        self.shard_ranges = _order.agreed(ds, rank, world_size)
        self.state = _Epoch(shuffle, seed, block_size, window_blocks, drop_last, pad, rank, world_size, self.shard_ranges)

    def __iter__(self) -> Iterator[int]:
        return self.state.iterate(lambda: self.state.rank_order(self.shard_ranges))

    def __len__(self) -> int:
        return self.state.left(len(self.state.rank_order(self.shard_ranges)))

    def set_epoch(self, epoch: int) -> None:
        self.state.set_epoch(epoch)

    def advance(self, samples: int) -> None:
        self.state.advance(samples)

    def finish(self) -> None:
        self.state.finish()

    def state_dict(self) -> dict:
        return self.state.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.state.load_state_dict(state)


class HspackIterableDataset(_Reopening, tud.IterableDataset):
    """Streaming dataset: yields this rank's samples for the epoch (same order, partition
    and views as `HspackDataset` + `HspackSampler`), split across DataLoader workers so that
    the loader yields them in the rank's order (batch k comes from worker k % workers).

    Set `batch_size` to the DataLoader's (`HspackLoader` gives its own at each iteration, so
    several loaders over one dataset object each split by theirs). Call `set_epoch(e)` before
    each epoch; `state_dict()` / `load_state_dict()` resume mid-epoch with exactly the samples
    not yet consumed. Where an iteration of `HspackLoader` starts (after `set_epoch`, after
    `load_state_dict`, after a complete or a broken-off epoch): see `hspack.torch.progress`.
    The epoch state lives in shared memory, so persistent workers
    (`persistent_workers=True`) follow `set_epoch` and `load_state_dict` too. `transfer` is
    as for `HspackDataset`; `rank` and `world_size` go together (`order.world`)."""

    def __init__(self, path: str | os.PathLike, fields: Sequence[str] | None = None, *, view: Any = None, max_len: int | None = None, check: str = "once", transfer: str = "map", shuffle: bool = True, seed: int = 0, batch_size: int = 1, block_size: int = 64, window_blocks: int = 16, drop_last: bool = False, pad: bool = False, rank: int | None = None, world_size: int | None = None, cache_dir: str | os.PathLike | None = None, cache_bytes: int | None = None):
        self.path, self.check = os.fspath(path), check
        self.cache_dir, self.cache_bytes = cache_dir, cache_bytes
        self.transfer = _transfer_option(transfer)
        self.view = make_view(view, fields, max_len)
        self._ds: Dataset | None = None
        self._make_memo()
        self._release_received_when_collected()
        ds = self._open()
        # The dataset as this process opened it (as every rank did: `order.agreed`): every
        # worker orders these samples, even one that reopens it (spawned) after a writer
        # committed more.
        self.shard_ranges = _order.agreed(ds, rank, world_size)
        self.state = _Epoch(shuffle, seed, block_size, window_blocks, drop_last, pad, rank, world_size, self.shard_ranges)
        self.batch_size = batch_size

    @property
    def batch_size(self) -> int:
        """The DataLoader's batch size: workers deal the order out a whole batch each, in
        turn, so the loader yields it in order."""
        return self.state.published_batch_size()

    @batch_size.setter
    def batch_size(self, batch_size: int) -> None:
        self.state.publish_batch_size(count_option("batch_size", batch_size, 1))

    def _total(self) -> int:
        return len(self.state.rank_order(self.shard_ranges))

    def __len__(self) -> int:
        return self.state.left(self._total())

    def begin(self, batch_size: int | None = None) -> None:
        """Fixes where the iteration starting now begins (`progress.Progress.begin`) and
        publishes it, with the iterating loader's `batch_size`, to the workers, which read
        them when they start: `HspackLoader` calls it in the main process at each iteration."""
        if batch_size is not None:
            self.batch_size = batch_size
        self.state.begin(self._total())

    def __iter__(self) -> Iterator[Any]:
        ds = self.hspack
        epoch, start = self.state.published()
        seq = self.state.rank_order(self.shard_ranges, epoch)[start:]
        info = tud.get_worker_info()
        if info is not None:
            seq = _order.interleave_batches(seq, info.num_workers, info.id, self.batch_size)
        for i in seq.tolist():
            yield self.view(ds, i)

    def set_epoch(self, epoch: int) -> None:
        self.state.set_epoch(epoch)

    def advance(self, samples: int) -> None:
        self.state.advance(samples)

    def finish(self) -> None:
        self.state.finish()

    def state_dict(self) -> dict:
        return self.state.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.state.load_state_dict(state)
