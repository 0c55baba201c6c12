"""CUDA capture benchmark: hspack.capture.CudaWriter against PyTorch's own pinned copies.

1. Device-to-host throughput on the same tensors (bf16, 4 layers x [T, 7168] per sample):
   - torch: `pinned.copy_(src, non_blocking=True)` into a ring of preallocated pinned buffers
     as large as the CudaWriter's, then one synchronize;
   - CudaWriter with discard=True (the copy path alone: ordering, ring, threads);
   - CudaWriter into a dataset in /dev/shm (copy + encode + hash + write to memory);
   - CudaWriter into a dataset on disk.
2. A synthetic forward loop (61 layers of bf16 matmuls, 4 layers captured per step) with
   capture off and on: the slowdown.

Every path runs once a round, in turn, for --rounds rounds (5 by default); prints min and
median of each, and the load average, and writes them as JSON (--out). Needs a CUDA GPU.

    python benches/cuda_capture.py --rounds 5 --out results.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

import torch

import hspack
from hspack.capture import CudaWriter

HIDDEN = 7168
LAYERS = (2, 20, 40, 60)


def schema():
    return [hspack.hidden_state(layer, HIDDEN) for layer in LAYERS]


def names():
    return [f["name"] for f in schema()]


def make_samples(n_distinct, rows):
    gen = torch.Generator(device="cuda").manual_seed(0)
    return [[torch.randn(rows, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16) for _ in LAYERS] for _ in range(n_distinct)]


def torch_pinned(samples, n, slots):
    per = sum(t.numel() * t.element_size() for t in samples[0])
    ring = [[torch.empty_like(t, device="cpu").pin_memory() for t in samples[0]] for _ in range(slots)]
    stream = torch.cuda.current_stream()
    events = [None] * slots
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(n):
        k = i % slots
        if events[k] is not None:
            events[k].synchronize()  # reuse a pinned buffer only after its copy finished
        for dst, src in zip(ring[k], samples[i % len(samples)]):
            dst.copy_(src, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record(stream)
        events[k] = ev
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    return per * n / dt / 1e9, dt


def cuda_writer(samples, n, path, slots, slot_bytes, discard):
    fields = names()
    w = CudaWriter(path, schema(), slots=slots, slot_bytes=slot_bytes, discard=discard, durable=False)
    per = sum(t.numel() * t.element_size() for t in samples[0])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    in_append = 0.0
    for i in range(n):
        a = time.perf_counter()
        w.append(f"s{i}", **dict(zip(fields, samples[i % len(samples)])))
        in_append += time.perf_counter() - a
    t_queued = time.perf_counter() - t0
    w.flush()  # every sample copied and handed to the sink
    dt = time.perf_counter() - t0
    f0 = time.perf_counter()
    stats = w.finish()  # commit, samples table, and freeing the pinned ring
    assert stats["samples_written"] == n and stats["unwritten"] == 0, stats
    stats["python_append_seconds"] = in_append
    stats["queued_seconds"] = t_queued
    stats["flushed_seconds"] = dt
    stats["finish_seconds"] = time.perf_counter() - f0
    return per * n / dt / 1e9, dt, stats


def append_overhead(n=200):
    """Seconds per append of a 1-row sample: the fixed cost of one call."""
    fields = names()
    one = [torch.zeros(1, HIDDEN, dtype=torch.bfloat16, device="cuda") for _ in fields]
    w = CudaWriter(None, schema(), slots=8, slot_bytes=1 << 20, discard=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(n):
        w.append(f"o{i}", **dict(zip(fields, one)))
    dt = time.perf_counter() - t0
    st = w.finish()
    return {"python_us_per_append": dt / n * 1e6, "native_us_per_append": st["append_seconds"] / n * 1e6}


def forward_loop(steps, rows, writer, weights, x0):
    """61 'layers' of two bf16 matmuls and a residual; hidden states of LAYERS captured."""
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
        if writer is not None:
            writer.append(f"step{step}", **captured)
        del captured
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps


def summary(runs: dict, best) -> dict:
    """`{name: {"min": .., "median": .., "best": .., "rounds": [...]}}` of the rounds each ran;
    `best` picks the best round (max for a rate, min for a time)."""
    import statistics

    return {k: {"min": min(v), "median": statistics.median(v), "best": best(v), "rounds": v} for k, v in runs.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--samples", type=int, default=48)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--slot-bytes", type=int, default=128 << 20)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5, help="rounds; within each the peers run in turn (A, B, A, B...)")
    ap.add_argument("--disk", default=None, help="folder on disk (default: a temp folder under /tmp)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    dev = torch.cuda.get_device_name()
    res = {"device": dev, "torch": torch.__version__, "rows": args.rows, "hidden": HIDDEN, "layers": list(LAYERS),
           "sample_bytes": args.rows * HIDDEN * 2 * len(LAYERS), "samples": args.samples, "slots": args.slots, "slot_bytes": args.slot_bytes,
           "rounds": args.rounds, "loadavg_before": os.getloadavg()}
    samples = make_samples(4, args.rows)
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and shutil.disk_usage("/dev/shm").free > 3 * args.samples * res["sample_bytes"] else None
    disk = args.disk or tempfile.gettempdir()

    # Warm up both paths once.
    torch_pinned(samples, 4, args.slots)
    cuda_writer(samples, 4, None, args.slots, args.slot_bytes, True)

    def stored(target):
        p = tempfile.mkdtemp(dir=target)
        try:
            return cuda_writer(samples, args.samples, os.path.join(p, "ds"), args.slots, args.slot_bytes, False)
        finally:
            shutil.rmtree(p)

    d2h = {}
    res["append_overhead"] = append_overhead()
    # Interleaved: every path once a round, in turn.
    for _ in range(args.rounds):
        d2h.setdefault("torch_pinned_non_blocking", []).append(torch_pinned(samples, args.samples, args.slots)[0])
        gbs, _, st = cuda_writer(samples, args.samples, None, args.slots, args.slot_bytes, True)
        d2h.setdefault("cudawriter_discard", []).append(gbs)
        res.setdefault("discard_stats", []).append(st)
        if shm:
            gbs, _, st = stored(shm)
            d2h.setdefault("cudawriter_dev_shm", []).append(gbs)
            res.setdefault("dev_shm_stats", []).append(st)
        gbs, _, st = stored(disk)
        d2h.setdefault("cudawriter_disk", []).append(gbs)
        res.setdefault("disk_stats", []).append(st)
    res["disk_folder"] = disk
    res["d2h_gb_per_s"] = summary(d2h, max)
    base = res["d2h_gb_per_s"]["torch_pinned_non_blocking"]["median"]
    res["d2h_median_ratio_vs_torch"] = {k: v["median"] / base for k, v in res["d2h_gb_per_s"].items()}

    # Forward loop.
    gen = torch.Generator(device="cuda").manual_seed(1)
    weights = [(torch.randn(HIDDEN, HIDDEN, device="cuda", generator=gen, dtype=torch.bfloat16) * HIDDEN**-0.5,
                torch.randn(HIDDEN, HIDDEN, device="cuda", generator=gen, dtype=torch.bfloat16) * HIDDEN**-0.5) for _ in range(61)]
    x0 = torch.randn(args.rows, HIDDEN, device="cuda", generator=gen, dtype=torch.bfloat16)
    forward_loop(2, args.rows, None, weights, x0)
    modes = {}
    for _ in range(args.rounds):
        modes.setdefault("off", []).append(forward_loop(args.steps, args.rows, None, weights, x0) * 1e3)
        w = CudaWriter(None, schema(), slots=args.slots, slot_bytes=args.slot_bytes, discard=True)
        modes.setdefault("on_discard", []).append(forward_loop(args.steps, args.rows, w, weights, x0) * 1e3)
        w.finish()
        target = shm or disk
        p = tempfile.mkdtemp(dir=target)
        w = CudaWriter(os.path.join(p, "ds"), schema(), slots=args.slots, slot_bytes=args.slot_bytes, durable=False)
        key = "on_dev_shm" if shm else "on_disk"
        modes.setdefault(key, []).append(forward_loop(args.steps, args.rows, w, weights, x0) * 1e3)
        st = w.finish()
        res.setdefault("forward_store_stats", []).append(st)
        shutil.rmtree(p)
    res["forward_ms_per_step"] = summary(modes, min)
    off = res["forward_ms_per_step"]["off"]
    res["forward_slowdown_pct"] = {k: {s: (v[s] / off[s] - 1) * 100 for s in ("min", "median")} for k, v in res["forward_ms_per_step"].items() if k != "off"}
    res["forward_captured_gb_per_s"] = res["sample_bytes"] / (off["median"] / 1e3) / 1e9
    res["loadavg_after"] = os.getloadavg()

    print(f"{dev}, {args.rounds} interleaved rounds, load average {res['loadavg_before'][0]:.2f} before, {res['loadavg_after'][0]:.2f} after")
    print(f"{'device-to-host path':<30} {'min GB/s':>9} {'median':>9} {'median vs torch':>16}")
    for k, v in res["d2h_gb_per_s"].items():
        print(f"{k:<30} {v['min']:>9.2f} {v['median']:>9.2f} {res['d2h_median_ratio_vs_torch'][k]:>15.3f}x")
    print(f"{'forward loop':<30} {'min ms':>9} {'median':>9} {'slowdown min/median':>20}")
    for k, v in res["forward_ms_per_step"].items():
        slow = res["forward_slowdown_pct"].get(k)
        said = "" if slow is None else f"{slow['min']:+.2f}% / {slow['median']:+.2f}%"
        print(f"{k:<30} {v['min']:>9.2f} {v['median']:>9.2f} {said:>20}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
