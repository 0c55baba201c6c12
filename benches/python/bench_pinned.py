"""Padded batches delivered to the GPU: hspack's pinned collation against the usual path and
per-sample files, same data, same batches, same run.

Every loader yields the same padded batches (`PadCollate`, `batch_size` samples in file
order, `pin_memory=True`), and the training loop copies each batch's hidden states to the
GPU (`copy_(..., non_blocking=True)` into reused device buffers, one synchronize per batch),
as a trainer does before its forward pass. GB/s counts the hidden-state bytes of the samples
(not the padding).

Loaders, each with 0 workers and with ``--workers`` persistent workers:
- hspack, `HspackLoader(pin_memory=True)`: workers send the samples as file ranges and the
  pin-memory thread collates them straight into pinned memory (one copy);
- hspack collated in the workers, then pinned: the path without `CollateToPinned` (the
  worker copies into shared memory, the pin-memory thread copies that into pinned memory);
- `safetensors.torch.load_file` per sample, and `torch.load(mmap=True)`, each collated both
  ways: `PadCollate` then pinned, and hspack's `CollateToPinned(PadCollate())` (the samples
  sent uncollated, padded straight into pinned memory by the pin-memory thread), so each peer
  also runs with the collate path hspack's loader uses.

Runs are interleaved: each round runs every (loader, workers) once, the starting loader
rotating from round to round, after one warm-up pass each; ``--rounds`` rounds (default 5),
min and median printed, load average before and after. Warm page cache only (put ``--dir``
on tmpfs, or on a disk whose files fit in memory).

    python benches/python/bench_pinned.py --gb 4 --workers 16 --dir /dev/shm --out pinned.md
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import torch
import torch.utils.data as tud

from bench_loader import Files, data_arguments, make_samples, report, write_all
from hspack.torch import HspackDataset, HspackLoader, HspackSampler, PadCollate
from hspack.torch.batching import CollateToPinned

HIDDEN = ("aux_hidden_state", "hidden_state")


class CollateInWorkers:
    """`PadCollate` called through a wrapper, so `HspackLoader` leaves it in the workers."""

    def __init__(self):
        self.collate = PadCollate()

    def __call__(self, samples):
        return self.collate(samples)


def loaders(root, args):
    hs = HspackDataset(f"{root}/hspack", view="eagle3")
    st = Files(sorted(f"{root}/st/{f}" for f in os.listdir(f"{root}/st")), "safetensors")
    mm = Files(sorted(f"{root}/ckpt/{f}" for f in os.listdir(f"{root}/ckpt")), "mmap")

    def opts(w):
        more = {"num_workers": w, "persistent_workers": True, "prefetch_factor": 4} if w else {}
        return {"batch_size": args.batch, "pin_memory": True, **more}

    return {
        "hspack, collated into pinned memory": lambda w: HspackLoader(hs, sampler=HspackSampler(hs, shuffle=False), **opts(w)),
        "hspack, collated in the workers, then pinned": lambda w: HspackLoader(hs, sampler=HspackSampler(hs, shuffle=False), collate_fn=CollateInWorkers(), **opts(w)),
        "safetensors load_file, collated, then pinned": lambda w: tud.DataLoader(st, shuffle=False, collate_fn=PadCollate(), **opts(w)),
        "safetensors load_file, collated into pinned memory": lambda w: tud.DataLoader(st, shuffle=False, collate_fn=CollateToPinned(PadCollate()), **opts(w)),
        "torch.load(mmap=True), collated, then pinned": lambda w: tud.DataLoader(mm, shuffle=False, collate_fn=PadCollate(), **opts(w)),
        "torch.load(mmap=True), collated into pinned memory": lambda w: tud.DataLoader(mm, shuffle=False, collate_fn=CollateToPinned(PadCollate()), **opts(w)),
    }


def run(loader, gpu):
    if hasattr(loader, "set_epoch"):
        loader.set_epoch(0)  # an hspack sampler resumes where the last pass stopped: start over
    nbytes, t0 = 0, time.perf_counter()
    for batch in loader:
        for k in HIDDEN:
            t = batch[k]
            assert t.is_pinned(), f"{k} is not in pinned memory"
            gpu[k][: t.numel()].view(t.shape).copy_(t, non_blocking=True)
            rows = int(batch["lengths"].sum())
            nbytes += rows * t[0, 0].numel() * t.element_size()
        torch.cuda.synchronize()
    assert nbytes > 0, "the loader yielded nothing"
    return nbytes / (time.perf_counter() - t0) / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    data_arguments(ap)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--dir", default=None, help="scratch folder (default: a temp folder)")
    ap.add_argument("--out", required=True, help="markdown file for the table")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_pinned needs a CUDA GPU: pinned memory and the copies to the GPU are what it times")
    load_before = os.getloadavg()
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
    root = tempfile.mkdtemp(prefix="hspack-bench-", dir=args.dir)
    try:
        lengths = make_samples(args)
        write_all(root, lengths, args)
        longest = args.batch * max(lengths) * args.hidden
        gpu = {"aux_hidden_state": torch.empty(longest * (len(args.layers) - 1), dtype=torch.bfloat16, device="cuda"), "hidden_state": torch.empty(longest, dtype=torch.bfloat16, device="cuda")}
        makers = loaders(root, args)
        configs = [(name, w) for name in makers for w in (0, args.workers)]
        kept = {c: makers[c[0]](c[1]) for c in configs}
        for c in configs:
            run(kept[c], gpu)  # warm-up: page cache, checked-chunk memo, workers started
        results = {c: [] for c in configs}
        for r in range(args.rounds):
            for c in configs[r % len(configs) :] + configs[: r % len(configs)]:
                results[c].append(run(kept[c], gpu))
            print(f"round {r + 1}/{args.rounds} done", flush=True)
        load_after = os.getloadavg()
        med = {c: statistics.median(v) for c, v in results.items()}
        ours = ("hspack, collated into pinned memory", args.workers)
        lines = [
            f"hidden {args.hidden}, layers {args.layers}, {len(lengths)} samples of {args.min_tokens}-{args.max_tokens} tokens, "
            f"{sum(lengths) * 2 * args.hidden * len(args.layers) / 1e9:.2f} GB of hidden states a format; batches of {args.batch} padded "
            f"with PadCollate, pin_memory=True, each copied to the GPU (non_blocking, synchronized per batch); persistent workers, "
            f"prefetch_factor=4; {args.rounds} rounds, interleaved (rotating start); {os.cpu_count()} CPUs, {torch.cuda.get_device_name()}; "
            f"torch {torch.__version__}; load average before {load_before}, after {load_after}.",
            "",
            f"| loader | workers | min GB/s | median GB/s | hspack pinned, {args.workers} workers / this |",
            "|---|---:|---:|---:|---:|",
        ]
        for c in configs:
            lines.append(f"| {c[0]} | {c[1]} | {min(results[c]):.2f} | {med[c]:.2f} | {med[ours] / med[c]:.2f}x |")
        lines.append("")
        families = {}  # a loader without the collate path: its configurations
        for name, w in configs:
            families.setdefault(name.split(", ")[0], []).append((name, w))
        for family, cs in families.items():
            if family == "hspack":
                cs = [c for c in cs if c != ours]
            best = max(cs, key=lambda c: med[c])
            lines.append(f"- hspack pinned, {args.workers} workers, vs {family} in its best configuration ({best[0]}, {best[1]} workers): {med[ours] / med[best]:.2f}x")
        report(lines, args.out)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
