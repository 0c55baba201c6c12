"""A forward loop of 8192 tokens a step capturing 4 x 7168 bf16 hidden states (470 MB a step)
into /dev/shm: step time with capture off, with plain torch pinned copies, with CudaWriter
`discard=True`, and with CudaWriter into one dataset by 1 writer and by N writers sharing it
(`CudaWriter(..., writers=N)`: N dataset writers with `shared=True`, samples dealt to them in
turn, each storing into its own shard files on its own thread, with its own ring of `--slots`).

The loop: 61 layers of `h = h + relu(h @ W1) @ W2` (bf16, [T, 7168] x [7168, 7168]); the states
entering layers 2, 20, 40, 60 are captured every step. A step time runs to `flush()` after
the last step (every capture copied and handed to the dataset writers); the final commit and
freeing the rings are not in it. Modes are interleaved (A, B, C, ... A,
B, C, ...) for `--rounds` rounds of `--steps` steps; min and median ms per step are printed,
with the load average. Ring slots are sized to a field (`--slot-bytes`, default 128 MiB >=
8192 x 7168 x 2 bytes), `--slots` per writer. Needs a CUDA GPU.

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
    if sink is not None:
        sink.flush()  # every capture copied and handed to the dataset writer(s)
    torch.cuda.synchronize()
    per_step = (time.perf_counter() - t0) / steps
    # Not timed: the last commit, the samples table, freeing the pinned rings.
    t = time.perf_counter()
    stats = sink.finish() if sink is not None else {}
    stats["finish_seconds"] = time.perf_counter() - t
    return per_step, stats


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--slot-bytes", type=int, default=128 << 20)
    ap.add_argument("--writers", default="1,2,4,8")
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
    modes = ["off", "torch_pinned", "cudawriter_discard"] + [f"cudawriter_shm_{n}_writers" for n in writer_counts]
    times = {m: [] for m in modes}
    stats = {}
    for r in range(args.rounds):
        order = modes[r % len(modes):] + modes[: r % len(modes)]  # the first mode rotates
        for mode in order:
            root = None
            if mode == "off":
                sink = None
            elif mode == "torch_pinned":
                sink = TorchPinned(args.rows, args.slots)
            elif mode == "cudawriter_discard":
                sink = CudaWriter(None, schema(), slots=args.slots, slot_bytes=args.slot_bytes, discard=True)
            else:
                n = int(mode.split("_")[2])
                root = tempfile.mkdtemp(dir=args.root)
                sink = CudaWriter(os.path.join(root, "ds"), schema(), slots=args.slots, slot_bytes=args.slot_bytes, durable=False, writers=n)
            dt, st = forward_loop(args.steps, sink, weights, x0, f"r{r}")
            times[mode].append(dt * 1e3)
            stats.setdefault(mode, []).append(st)
            if root is not None:
                ds = hspack.open(os.path.join(root, "ds"))
                assert len(ds) == args.steps, (mode, len(ds))
                del ds
                shutil.rmtree(root)
            del sink
            torch.cuda.empty_cache()
    off = statistics.median(times["off"])
    res = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "hspack": hspack.__version__,
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "rows": args.rows,
        "sample_bytes": sample_bytes,
        "steps": args.steps,
        "rounds": args.rounds,
        "slots": args.slots,
        "slot_bytes": args.slot_bytes,
        "capture_gb_per_s_needed": sample_bytes / (off / 1e3) / 1e9,
        "ms_per_step": {m: {"min": min(v), "median": statistics.median(v), "all": v} for m, v in times.items()},
        "slowdown_pct_of_medians": {m: (statistics.median(v) / off - 1) * 100 for m, v in times.items() if m != "off"},
        "stats": stats,
    }
    print("load average", res["load_average"], "cpus", res["cpus"])
    print(f"| mode | min ms/step | median ms/step | slowdown (medians) |\n|---|---:|---:|---:|")
    for m, v in times.items():
        slow = "" if m == "off" else f"{res['slowdown_pct_of_medians'][m]:+.1f} %"
        print(f"| {m} | {min(v):.1f} | {statistics.median(v):.1f} | {slow} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
