"""A forward loop of 8192 tokens a step capturing 4 x 7168 bf16 hidden states (470 MB a step)
into /dev/shm: step time with capture off, with plain torch pinned copies, with CudaWriter
`discard=True`, and with CudaWriter into one dataset by 1 writer and by N writers sharing it
(`CudaWriter(..., writers=N)`: N dataset writers with `shared=True`, samples dealt to them in
turn, each storing into its own shard files on its own thread, with its own ring of `--slots`).

The loop: 61 layers of `h = h + relu(h @ W1) @ W2` (bf16, [T, 7168] x [7168, 7168]); the states
entering layers 2, 20, 40, 60 are captured every step. A run times `--short` steps or
`--steps` steps up to `flush()` returning (every capture copied and handed to the dataset
writers), one after the other into one sink, after untimed warm-up steps that size and pin
every slot; the final commit and freeing the rings are not in it. A run ends with a drain: the
last samples are stored after the last forward step, a fixed cost of a run (one sample's
store, ~0.2 s) that a 24-step run spreads as several percent a step. So the step time is
measured as the slope between the two run lengths, (T(steps) - T(short)) / (steps - short):
what each further step costs in a long capture, the drain and the first steps' costs taken
out, and every sample's store still counted (a writer slower than the loop leaves a backlog
that the longer run's flush waits for). The whole run's time per step and the drain (from
the GPU's last step to `flush()` returning) are reported too. Modes are interleaved (A, B,
C, ... A, B, C, ...) for `--rounds` rounds; min and median are printed, with the load
average. `--fp8-writers 1,2` adds the same modes with `quantize="fp8"` (the hidden states
quantized on the GPU before the copy: half the bytes copied and stored), and
`cudawriter_discard_fp8` (the quantize and copy cost alone). Ring: `--slots` per writer, each sized from the fields (the default; 128 MiB for a
117 MB field) unless `--slot-bytes` is given. Needs a CUDA GPU.

    python benches/cuda_shared_writers.py --out results.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

import torch

import hspack
from cuda_capture import HIDDEN, LAYERS, names, schema  # the same capture as the other CUDA benchmark
from hspack.capture import CudaWriter


class TorchPinned:
    """The same captures by plain torch: non-blocking copies into a ring of pinned buffers,
    each reused once its copy's event completed."""

    def __init__(self, rows, slots):
        self.ring = [[torch.empty(rows, HIDDEN, dtype=torch.bfloat16).pin_memory() for _ in LAYERS] for _ in range(slots)]
        self.events = [None] * slots
        self.n = 0

    def append(self, key, **captured):
        k = self.n % len(self.ring)
        if self.events[k] is not None:
            self.events[k].synchronize()
        for dst, src in zip(self.ring[k], captured.values()):
            dst.copy_(src, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record()
        self.events[k] = ev
        self.n += 1

    def flush(self):
        torch.cuda.synchronize()

    def finish(self):
        return {}


def forward_loop(steps, sink, weights, x0, tag):
    """Runs `steps` forward steps capturing into `sink`; returns the seconds up to `flush()`
    returning and the drain (from the GPU's last step to `flush()` returning)."""
    fields = names()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for step in range(steps):
        h = x0
        captured = {}
        for layer, (w1, w2) in enumerate(weights):
            if layer in LAYERS:
                captured[fields[LAYERS.index(layer)]] = h
            h = h + torch.relu(h @ w1) @ w2
        if sink is not None:
            sink.append(f"{tag}-{step}", **captured)
        del captured
    torch.cuda.synchronize()  # the forward steps and the copies done
    t_gpu = time.perf_counter()
    if sink is not None:
        sink.flush()  # every capture copied and handed to the dataset writer(s)
    t1 = time.perf_counter()
    return t1 - t0, t1 - t_gpu


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--short", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--slot-bytes", type=int, default=None)
    ap.add_argument("--writers", default="1,2,4,8")
    ap.add_argument("--fp8-writers", default="")
    ap.add_argument("--root", default="/dev/shm")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    sample_bytes = args.rows * HIDDEN * 2 * len(LAYERS)
    gen = torch.Generator(device="cuda").manual_seed(1)
    weights = [(torch.randn(HIDDEN, HIDDEN, device="cuda", generator=gen, dtype=torch.bfloat16) * HIDDEN**-0.5,
                torch.randn(HIDDEN, HIDDEN, device="cuda", generator=gen, dtype=torch.bfloat16) * HIDDEN**-0.5) for _ in range(61)]
    x0 = torch.randn(args.rows, HIDDEN, device="cuda", generator=gen, dtype=torch.bfloat16)
    forward_loop(2, None, weights, x0, "warm")

    writer_counts = [int(n) for n in args.writers.split(",")]
    fp8_counts = [int(n) for n in args.fp8_writers.split(",") if n]
    modes = ["off", "torch_pinned", "cudawriter_discard"] + [f"cudawriter_shm_{n}_writers" for n in writer_counts]
    if fp8_counts:
        modes += ["cudawriter_discard_fp8"] + [f"cudawriter_shm_{n}_writers_fp8" for n in fp8_counts]
    slope = {m: [] for m in modes}  # ms a further step costs
    whole = {m: [] for m in modes}  # ms per step of the long run, drain included
    stats = {}

    def run(mode, tag):
        """One sink: warm-up steps (untimed: every slot of every ring sized and pinned), then
        a timed run of `--short` steps and one of `--steps`. Returns both times and stats."""
        root, writers = None, 1
        fp8 = {"quantize": "fp8"} if mode.endswith("_fp8") else {}
        if mode == "off":
            sink = None
        elif mode == "torch_pinned":
            sink = TorchPinned(args.rows, args.slots)
        elif mode.startswith("cudawriter_discard"):
            sink = CudaWriter(None, schema(), slots=args.slots, slot_bytes=args.slot_bytes, discard=True, **fp8)
        else:
            writers = int(mode.split("_")[2])
            root = tempfile.mkdtemp(dir=args.root)
            sink = CudaWriter(os.path.join(root, "ds"), schema(), slots=args.slots, slot_bytes=args.slot_bytes, durable=False, writers=writers, **fp8)
        warm = -(-args.slots // len(LAYERS)) * writers  # samples that take every slot once
        forward_loop(warm, sink, weights, x0, f"{tag}w")
        short, _ = forward_loop(args.short, sink, weights, x0, f"{tag}s")
        long, drain = forward_loop(args.steps, sink, weights, x0, f"{tag}l")
        t = time.perf_counter()
        st = sink.finish() if sink is not None else {}
        st["drain_seconds"] = drain
        st["finish_seconds"] = time.perf_counter() - t
        if root is not None:
            ds = hspack.open(os.path.join(root, "ds"))
            assert len(ds) == warm + args.short + args.steps, (mode, len(ds))
            st["dataset_bytes"] = sum(s["bytes"] for s in ds.shards)
            del ds
            shutil.rmtree(root)
        del sink
        torch.cuda.empty_cache()
        return short, long, st

    for r in range(args.rounds):
        order = modes[r % len(modes):] + modes[: r % len(modes)]  # the first mode rotates
        for mode in order:
            short, long, st = run(mode, f"r{r}")
            slope[mode].append((long - short) / (args.steps - args.short) * 1e3)
            whole[mode].append(long / args.steps * 1e3)
            stats.setdefault(mode, []).append(st)
    off = statistics.median(slope["off"])
    off_whole = statistics.median(whole["off"])
    summary = lambda v: {"min": min(v), "median": statistics.median(v), "all": v}  # noqa: E731
    res = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "hspack": hspack.__version__,
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "rows": args.rows,
        "sample_bytes": sample_bytes,
        "short_steps": args.short,
        "steps": args.steps,
        "rounds": args.rounds,
        "slots": args.slots,
        "slot_bytes": args.slot_bytes,
        "capture_gb_per_s_needed": sample_bytes / (off / 1e3) / 1e9,
        "ms_per_further_step": {m: summary(v) for m, v in slope.items()},
        "ms_per_step_whole_run": {m: summary(v) for m, v in whole.items()},
        "slowdown_pct_per_further_step": {m: (statistics.median(v) / off - 1) * 100 for m, v in slope.items() if m != "off"},
        "slowdown_pct_whole_run": {m: (statistics.median(v) / off_whole - 1) * 100 for m, v in whole.items() if m != "off"},
        "stats": stats,
    }
    print("load average", res["load_average"], "cpus", res["cpus"])
    print(f"| mode | ms a further step: min | median | slowdown | whole {args.steps}-step run, ms/step median | slowdown | drain s (median) | appends that waited (warm-up too) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for m in modes:
        v, w = slope[m], whole[m]
        slow = "" if m == "off" else f"{res['slowdown_pct_per_further_step'][m]:+.1f} %"
        slow_w = "" if m == "off" else f"{res['slowdown_pct_whole_run'][m]:+.1f} %"
        drain = statistics.median(s["drain_seconds"] for s in stats[m])
        waits = sum(s.get("waits", 0) for s in stats[m])
        print(f"| {m} | {min(v):.1f} | {statistics.median(v):.1f} | {slow} | {statistics.median(w):.1f} | {slow_w} | {drain:.3f} | {waits} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
