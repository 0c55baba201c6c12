"""Loader throughput: hspack's EAGLE-3 view against per-sample files, same data, same run.

Peers: (b) SpecForge-style `.ckpt` files read with `torch.load`, (c) the same files with
`torch.load(mmap=True)`, (d) per-sample safetensors read with `safetensors.torch.load_file`.
Every loader returns the same tensors (`input_ids`, `loss_mask`, `aux_hidden_state [T, 3H]`,
`hidden_state [T, H]`) through the same DataLoader settings, and the training loop copies
every hidden-state byte it receives into one reused buffer, as `.cuda()` does through its
staging buffer (a loop that never touches the bytes would time nothing for a loader that
hands out mappings). The table gives GB/s of hidden-state bytes and hspack / peer ratios,
with a warm and a cold page cache, and the share of each run spent in the loop's copy: near
100%, the loader hands out samples faster than one trainer process can copy them, and the
copy is the bound (for a loader whose tensors map the file, the copy also takes the page
faults that read the file in).

hspack is measured as `hspack convert` writes SpecForge data (the auxiliary layers stacked
in one field, so the view hands them out without a copy) and with one field per layer (as
captures write them; the view then concatenates with one copy). With hspack's default
`check="once"`, the workers of one dataset object share a memo of checked chunks, so a chunk
is hashed the first time any of them reads it: the plain rows are later epochs (the warm-up
pass was the first), and the "first epoch" row is a new dataset object that hashes every
chunk it reads. The last row is a reference for the cold rows: the hspack shards read with
plain `pread`s after dropping the cache, on as many threads as there are workers, once in
each cold round (deeper queues, as the workers' `MADV_POPULATE_READ` makes, can beat it on
some disks). A warm "ceiling" row times the loop's copies alone, from tensors of the same
shapes already in memory, once each warm round: no loader can deliver faster than the loop
copies, so it bounds every row and shows how close each loader comes. hspack's view also runs
with 0 workers and the loop's copies on one thread (`torch.set_num_threads(1)`): the rate of a
trainer reading on one core, which the view with workers should match at least.

Every loader runs with 0 workers (the loop reads in the trainer process) and with
``--workers`` persistent workers (forked once, as a multi-epoch trainer sets them up), so each
peer is also measured in its best configuration. Runs are
interleaved: each round runs every (loader, workers) once, starting one configuration later
than the round before (so no configuration always follows the same one), and there are
``--rounds`` rounds (default 5) warm (after one warm-up pass each) and as many cold (the files
of the loader evicted with ``posix_fadvise(DONTNEED)`` before each run, checked with
``fincore``). The table gives min and median GB/s of hidden states; ratios compare medians:
hspack's view with workers against each peer's best configuration. The load average is
printed before and after.

    python benches/python/bench_loader.py --out bench.md                  # ~1 GB a format
    python benches/python/bench_loader.py --gb 20 --workers 8 --out bench.md  # bigger runs
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
import torch
from safetensors.torch import load_file, save_file

import hspack
from hspack.torch import HspackDataset


def make_samples(args):
    rng = np.random.default_rng(0)
    per_token = 2 * args.hidden * len(args.layers)
    budget = int(args.gb * 1e9)
    total, lengths = 0, []
    while total < budget:
        t = int(rng.integers(args.min_tokens, args.max_tokens + 1))
        lengths.append(t)
        total += t * per_token
    return lengths


def sample(i, t, hidden, layers):
    g = torch.Generator().manual_seed(i)
    base = torch.randn(t, hidden, generator=g).to(torch.bfloat16)
    hs = [base.roll(k, dims=1) for k in range(len(layers))]  # distinct, cheap to make
    ids = torch.randint(0, 150_000, (t,), generator=g, dtype=torch.int64)
    return ids, torch.ones(t, dtype=torch.int64), hs


def write_all(root, lengths, args):
    base = [hspack.token_ids(dtype="i64"), hspack.loss_mask(dtype="i64")]
    per_layer = base + [hspack.hidden_state(layer, args.hidden) for layer in args.layers]
    target = hspack.hidden_state(args.layers[-1], args.hidden)
    stacked = base + [hspack.hidden_states(args.layers[:-1], args.hidden), target]
    os.makedirs(f"{root}/ckpt"), os.makedirs(f"{root}/st")
    with hspack.Writer(f"{root}/hspack", stacked, durable=False) as w, hspack.Writer(f"{root}/hspack-layers", per_layer, durable=False) as wl:
        for i, t in enumerate(lengths):
            ids, mask, hs = sample(i, t, args.hidden, args.layers)
            aux = torch.cat(hs[:-1], -1)
            w.append(f"{i:06d}", input_ids=ids, loss_mask=mask, aux_hidden_state=aux, **{target["name"]: hs[-1]})
            wl.append(f"{i:06d}", input_ids=ids, loss_mask=mask, **{f"hidden.{l}": h for l, h in zip(args.layers, hs)})
            d = {"input_ids": ids, "loss_mask": mask, "hidden_state": hs[-1][None], "aux_hidden_state": aux[None]}
            torch.save(d, f"{root}/ckpt/{i:06d}.ckpt")
            save_file(d, f"{root}/st/{i:06d}.safetensors")


class Files(torch.utils.data.Dataset):
    def __init__(self, files, how):
        self.files, self.how = files, how

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        f = self.files[i]
        if self.how == "safetensors":
            d = load_file(f)
        else:
            d = torch.load(f, weights_only=True, mmap=self.how == "mmap")
        return {"input_ids": d["input_ids"], "loss_mask": d["loss_mask"], "aux_hidden_state": d["aux_hidden_state"][0], "hidden_state": d["hidden_state"][0]}


class InMemory(torch.utils.data.Dataset):
    """The ceiling of this loop: samples of the same shapes as views of one tensor already in
    memory and mapped, so a run times only the loop's own copies."""

    def __init__(self, lengths, hidden, aux_layers):
        self.lengths, self.hidden, self.aux_layers = lengths, hidden, aux_layers
        self.data = torch.ones(max(lengths) * hidden * (aux_layers + 1), dtype=torch.bfloat16)

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        t, h = self.lengths[i], self.hidden
        aux = self.data[: t * h * self.aux_layers].view(t, h * self.aux_layers)
        return {"aux_hidden_state": aux, "hidden_state": self.data[t * h * self.aux_layers : t * h * (self.aux_layers + 1)].view(t, h)}


def make_loader(ds, workers):
    """A DataLoader as a multi-epoch trainer sets it up: with workers, persistent ones (the
    worker processes are forked once, not at every epoch)."""
    if not workers:
        return torch.utils.data.DataLoader(ds, batch_size=None, shuffle=False)
    return torch.utils.data.DataLoader(ds, batch_size=None, shuffle=False, num_workers=workers, prefetch_factor=4, persistent_workers=True)


def run(loader, staging):
    """One epoch: (samples, hidden-state bytes, seconds, seconds spent in the loop's copies)."""
    n, nbytes, copying, t0 = 0, 0, 0.0, time.perf_counter()
    for s in loader:
        n += 1
        c0 = time.perf_counter()
        for k in ("aux_hidden_state", "hidden_state"):
            t = s[k]
            staging[: t.numel()].view(t.shape).copy_(t)  # what .cuda() does via its staging buffer
            nbytes += t.nbytes
        copying += time.perf_counter() - c0
    return n, nbytes, time.perf_counter() - t0, copying


def staging_buffer(elems):
    """A reused bf16 buffer kept out of forked workers (`MADV_DONTFORK`, as CUDA does for its
    pinned buffers): a buffer forked copy-on-write would fault on every page at each epoch's
    first copies, because each epoch forks new workers."""
    m = mmap.mmap(-1, elems * 2)
    m.madvise(mmap.MADV_DONTFORK)
    t = torch.frombuffer(m, dtype=torch.bfloat16)
    t.fill_(0)
    return t, m


def read_files(files, threads):
    """A disk reference: every byte of the files read with plain `pread`s of 8 MiB, in 64 MiB
    pieces taken `threads` at a time."""
    from concurrent.futures import ThreadPoolExecutor

    piece = 64 << 20
    pieces = [(p, off) for p in files for off in range(0, os.path.getsize(p), piece)]

    def one(job):
        path, off = job
        fd, n = os.open(path, os.O_RDONLY), 0
        try:
            while n < piece and (chunk := os.pread(fd, min(8 << 20, piece - n), off + n)):
                n += len(chunk)
        finally:
            os.close(fd)
        return n

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        nbytes = sum(pool.map(one, pieces))
    return nbytes, time.perf_counter() - t0


def evict(files):
    """Drops `files` from the page cache (`posix_fadvise(DONTNEED)`, file by file) and returns
    the bytes still resident by `fincore` (0 when it is missing)."""
    os.sync()
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    if not shutil.which("fincore"):
        return 0
    import subprocess

    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", *files], capture_output=True, text=True).stdout
    return sum(int(x) for x in out.split())


def release_mappings(loaders):
    """Drops the shard mappings this process holds through the hspack dataset objects (they
    reopen on next use; their memos of checked chunks stay), and those it keeps for tensors
    received from workers."""
    import gc

    from hspack.torch import transfer

    for make, _ in loaders.values():
        ds = make()
        if hasattr(ds, "_ds"):
            ds._ds = None
    gc.collect()
    transfer.release()


def data_arguments(ap):
    """The options both training-read benchmarks take: the data made, workers and rounds."""
    ap.add_argument("--gb", type=float, default=1.0, help="hidden-state GB of each format")
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--layers", type=lambda s: [int(x) for x in s.split(",")], default=[2, 30, 58, 60])
    ap.add_argument("--min-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)


def report(lines, out):
    """Prints the table, with the command that made it, and writes them to `out`."""
    command = " ".join(["python3", *sys.argv])
    text = "\n".join([f"`{command}`", "", *lines]) + "\n"
    print(text)
    with open(out, "w") as f:
        f.write(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    data_arguments(ap)
    ap.add_argument("--no-cold", action="store_true", help="warm runs only")
    ap.add_argument("--hspack-bin", default=None, help="an hspack binary: warm rounds also time `hspack verify` of the hspack dataset")
    ap.add_argument("--dir", default=None, help="scratch folder (default: a temp folder)")
    ap.add_argument("--out", required=True, help="markdown file for the table")
    args = ap.parse_args()
    load_before = os.getloadavg()
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
    root = tempfile.mkdtemp(prefix="hspack-bench-", dir=args.dir)
    try:
        lengths = make_samples(args)
        t0 = time.perf_counter()
        write_all(root, lengths, args)
        print(f"wrote {len(lengths)} samples, {sum(lengths)} tokens, in {time.perf_counter() - t0:.0f}s")
        ck = sorted(f"{root}/ckpt/{f}" for f in os.listdir(f"{root}/ckpt"))
        st = sorted(f"{root}/st/{f}" for f in os.listdir(f"{root}/st"))
        hs_files = [f"{root}/hspack/{f}" for f in os.listdir(f"{root}/hspack")]
        hl_files = [f"{root}/hspack-layers/{f}" for f in os.listdir(f"{root}/hspack-layers")]

        def same(ds):
            return lambda: ds

        def fresh(path):  # a new dataset object each run: a new checked-chunk memo
            return lambda: HspackDataset(path, view="eagle3")

        ours = "hspack eagle3 view"
        one_thread = "hspack eagle3 view, the loop's copies on one thread"
        ours_ds = HspackDataset(f"{root}/hspack", view="eagle3")
        loaders = {
            ours: (same(ours_ds), hs_files),
            one_thread: (same(ours_ds), hs_files),
            "hspack eagle3 view, first epoch (hashes every chunk)": (fresh(f"{root}/hspack"), hs_files),
            "hspack eagle3 view, one field per layer": (same(HspackDataset(f"{root}/hspack-layers", view="eagle3")), hl_files),
            "torch.load .ckpt": (same(Files(ck, "load")), ck),
            "torch.load(mmap=True)": (same(Files(ck, "mmap")), ck),
            "safetensors load_file": (same(Files(st, "safetensors")), st),
        }
        configs = [(name, w) for name in loaders for w in ((0,) if name == one_thread else (0, args.workers))]
        results = {}  # (cache, name, workers) -> [GB/s, ...]
        in_copy = {}  # (cache, name, workers) -> [share of the run spent in the loop's copies, ...]
        resident = []
        verify_gbs = []
        ceiling = []  # GB/s of the loop's copies alone, once a warm round
        in_memory = make_loader(InMemory(lengths, args.hidden, len(args.layers) - 1), 0)
        reference = []  # GB/s of the cold rounds' `pread` reference
        staging, _keep = staging_buffer(max(lengths) * args.hidden * (len(args.layers) - 1))
        kept = {}  # one loader per configuration, kept across epochs (persistent workers)

        def loader_for(name, w):
            if name.startswith("hspack eagle3 view, first epoch"):
                return make_loader(loaders[name][0](), w)  # a new dataset object, new workers
            if (name, w) not in kept:
                kept[(name, w)] = make_loader(loaders[name][0](), w)
            return kept[(name, w)]

        for cache in ("warm",) if args.no_cold else ("warm", "cold"):
            if cache == "warm":
                for name, w in configs:  # fill the page cache (and the memos), start the workers
                    run(loader_for(name, w), staging)
            for r in range(args.rounds):
                for name, w in configs[r % len(configs) :] + configs[: r % len(configs)]:  # each round starts elsewhere
                    files = loaders[name][1]
                    if cache == "cold":
                        # A later epoch over data the page cache lost: the dataset object
                        # (and its memo of checked chunks) stays, but no process may keep the
                        # files mapped, or they cannot be evicted: every loader's workers
                        # stop (persistent ones of another configuration map the same
                        # files), and this process drops its mappings.
                        kept.clear()
                        release_mappings(loaders)
                        resident.append(evict(files))
                    threads = torch.get_num_threads()
                    if name == one_thread:  # the trainer's own reading on one core
                        torch.set_num_threads(1)
                    try:
                        n, nbytes, secs, copying = run(loader_for(name, w), staging)
                    finally:
                        torch.set_num_threads(threads)
                    assert n == len(lengths)
                    results.setdefault((cache, name, w), []).append(nbytes / secs / 1e9)
                    in_copy.setdefault((cache, name, w), []).append(copying / secs)
                if cache == "warm":
                    _, nbytes, secs, _ = run(in_memory, staging)
                    ceiling.append(nbytes / secs / 1e9)
                if cache == "warm" and args.hspack_bin:
                    # Verify hashes every byte of the same shards: the bound a loader that
                    # checks its chunks can be held to. GB/s of the shard bytes.
                    import subprocess

                    start = time.perf_counter()
                    subprocess.run([args.hspack_bin, "verify", f"{root}/hspack"], check=True, stdout=subprocess.DEVNULL)
                    shard_bytes = sum(os.path.getsize(f) for f in hs_files if f.endswith(".hsp"))
                    verify_gbs.append(shard_bytes / (time.perf_counter() - start) / 1e9)
                if cache == "cold":
                    # The disk reference, in the same round: the shards read with plain
                    # `pread`s after the same eviction.
                    kept.clear()
                    release_mappings(loaders)
                    resident.append(evict(hs_files))
                    nbytes, secs = read_files(hs_files, args.workers)
                    reference.append(nbytes / secs / 1e9)
                print(f"{cache} round {r + 1}/{args.rounds} done")
        load_after = os.getloadavg()
        med = {k: statistics.median(v) for k, v in results.items()}
        lines = [
            f"hidden {args.hidden}, layers {args.layers}, {len(lengths)} samples of {args.min_tokens}-{args.max_tokens} tokens, "
            f"{sum(lengths) * 2 * args.hidden * len(args.layers) / 1e9:.2f} GB of hidden states a format; DataLoader batch_size=None, "
            f"persistent workers with prefetch_factor=4; the loop copies each hidden state into a reused buffer; {args.rounds} rounds, interleaved (rotating start); "
            f"{os.cpu_count()} CPUs; load average before {load_before}, after {load_after}"
            + ("" if args.no_cold else f"; cold: evicted with posix_fadvise(DONTNEED), fincore found at most {max(resident)} bytes of the loader's files resident before a run")
            + ".",
            "",
            "| cache | loader | workers | min GB/s | median GB/s | time in the loop's copy (median) | hspack view with workers / this |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for (cache, name, w), v in results.items():
            ratio = med[(cache, ours, args.workers)] / med[(cache, name, w)]
            copy_share = statistics.median(in_copy[(cache, name, w)])
            lines.append(f"| {cache} | {name} | {w} | {min(v):.2f} | {med[(cache, name, w)]:.2f} | {copy_share:.0%} | {ratio:.2f}x |")
        top = statistics.median(ceiling)  # every run has warm rounds
        ratio = med[("warm", ours, args.workers)] / top
        lines.append(f"| warm | ceiling: the loop's copies alone, from tensors already in memory, once a round | 0 | {min(ceiling):.2f} | {top:.2f} | 100% | {ratio:.2f}x |")
        if reference:
            ratio = med[("cold", ours, args.workers)] / statistics.median(reference)
            lines.append(f"| cold | reference: the hspack shards read with `pread`, {args.workers} threads, once a round | | {min(reference):.2f} | {statistics.median(reference):.2f} | | {ratio:.2f}x |")
        if verify_gbs:
            lines.append(f"| warm | `hspack verify` of the hspack dataset (GB/s of its shards) | | {min(verify_gbs):.2f} | {statistics.median(verify_gbs):.2f} | | |")
            ratio = med[("warm", ours, args.workers)] / statistics.median(verify_gbs)
            lines.append("")
            lines.append(f"- warm: hspack view with {args.workers} workers reads at {ratio:.2f}x the speed of `hspack verify` over the same shards (medians)")
        lines.append("")
        shares = ", ".join(f"{name} {max(v for (c, n, _), v in med.items() if c == 'warm' and n == name) / top:.0%}" for name in loaders)
        lines.append(f"- warm: each loader's best median as a share of the ceiling (the loop's copies alone, {top:.2f} GB/s): {shares}")
        for cache in ("warm",) if args.no_cold else ("warm", "cold"):
            lines.append(
                f"- {cache}: hspack view, {args.workers} workers, vs its 0-worker loop with the copies on one thread: "
                f"{med[(cache, ours, args.workers)] / med[(cache, one_thread, 0)]:.2f}x"
            )
            for name in loaders:
                if name.startswith("hspack"):
                    continue
                best = max((0, args.workers), key=lambda w: med[(cache, name, w)])
                lines.append(
                    f"- {cache}: hspack view, {args.workers} workers, vs {name} in its best configuration ({best} workers): "
                    f"{med[(cache, ours, args.workers)] / med[(cache, name, best)]:.2f}x; hspack's own best: "
                    f"{max(med[(cache, ours, w)] for w in (0, args.workers)) / med[(cache, name, best)]:.2f}x"
                )
        report(lines, args.out)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
