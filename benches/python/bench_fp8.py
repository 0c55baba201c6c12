"""FP8 storage (`quantize="fp8"`) against bf16, on one synthetic EAGLE-3 capture: bytes on
disk, write time, read throughput of what a trainer gets (bf16), and the error per layer.

The capture: samples of 128-2048 tokens (ragged), three auxiliary layers stacked in one
`[T, 3, H]` bf16 field and the target layer in its own `[T, H]` field, token ids and a loss
mask. Activations are like a transformer's: per-channel log-normal scales, 0.5 % outlier
channels 20-80x larger, magnitudes growing with depth. The same samples are written twice,
exactly and with `quantize="fp8"` (one E4M3FN byte a value, one f32 scale per token and layer).

Reads: the EAGLE-3 view of every sample (`hspack.torch.Eagle3View`, `aux_hidden_state [T,
3H]` and `hidden_state [T, H]`), each tensor then copied once as a collate function does into
a batch. That delivers bf16 either way: zero-copy from the mapping for bf16, decoded for fp8.
Warm (page cache holding the files): a later pass of a dataset object kept across passes, as
a trainer keeps it across epochs (its chunks checked on its first pass, with the default
`check="once"`), and a first pass of a new dataset object (every chunk hashed as it is read).
Cold: every file evicted with `posix_fadvise(DONTNEED)` first (checked with `fincore` where
present), read by a new dataset object. Modes interleaved (A, B, C, ..., each round starting
one mode later) for `--rounds` rounds; min and median printed with the load average; GB/s are
of bf16 delivered (aux + target), the same bytes for both.

Writes: `hspack.Writer` of the same samples, bf16 and fp8 alternating for `--write-rounds`
rounds (no fsync: the encode path, not the disk).

Error: `hspack.compare` of the two datasets: per layer, the relative L2 error and the cosine
similarity of each token's vector (mean and min).

    python3 benches/python/bench_fp8.py --gb 1.0 --rounds 5 --root /tmp
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

import hspack
from bench_loader import evict  # the loader benchmark's eviction: sync, DONTNEED, fincore
from hspack.torch import Eagle3View, HspackDataset

AUX = [2, 30, 58]
TARGET = 60


def channel_scales(gen, hidden, depth):
    s = torch.exp(torch.randn(hidden, generator=gen) * 0.5) * 0.6 * (1 + depth)
    outliers = torch.rand(hidden, generator=gen) < 0.005
    return torch.where(outliers, s * (20 + 60 * torch.rand(hidden, generator=gen)), s)


def make_samples(args):
    gen = torch.Generator().manual_seed(0)
    scales = [channel_scales(gen, args.hidden, d) for d in range(len(AUX) + 1)]
    per_token = args.hidden * 2 * (len(AUX) + 1)
    samples, total = [], 0
    while total < args.gb * 1e9:
        t = int(torch.randint(128, 2049, (1,), generator=gen))
        states = [(torch.randn(t, args.hidden, generator=gen) * s).bfloat16() for s in scales]
        samples.append(
            (
                f"s{len(samples)}",
                {
                    "input_ids": torch.randint(0, 150000, (t,), generator=gen, dtype=torch.int32),
                    "loss_mask": (torch.arange(t) > t // 3).to(torch.uint8),
                    "aux_hidden_state": torch.stack(states[:-1], 1),
                    f"hidden.{TARGET}": states[-1],
                },
            )
        )
        total += t * per_token
    return samples, total


def schema(hidden):
    return [hspack.token_ids(), hspack.loss_mask(), hspack.hidden_states(AUX, hidden), hspack.hidden_state(TARGET, hidden)]


def write(path, samples, hidden, quantize):
    shutil.rmtree(path, ignore_errors=True)
    options = {"quantize": "fp8"} if quantize else {}
    t = time.perf_counter()
    with hspack.Writer(path, schema(hidden), create=True, durable=False, **options) as w:
        for key, s in samples:
            w.append(key, **s)
    return time.perf_counter() - t


def files(path):
    return [os.path.join(path, f) for f in os.listdir(path)]


def read_pass(ds):
    """Seconds to read every sample's EAGLE-3 view of `ds` and copy it once, and the bytes
    delivered."""
    delivered = 0
    t = time.perf_counter()
    for i in range(len(ds)):
        item = ds[i]
        for k in ("aux_hidden_state", "hidden_state"):
            batch = item[k].clone()  # what a collate function does
            delivered += batch.numel() * batch.element_size()
    seconds = time.perf_counter() - t
    del item, batch
    return seconds, delivered


def unmap(ds):
    """Drops `ds`'s shard mappings (it maps them again on its next read; its memo of checked
    chunks stays), so that an eviction can drop every page: mapped pages stay resident."""
    ds._ds = None
    gc.collect()


def summary(v):
    return min(v), statistics.median(v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=1.0, help="bf16 hidden-state bytes to capture")
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--write-rounds", type=int, default=5)
    ap.add_argument("--root", default=tempfile.gettempdir())
    ap.add_argument("--no-cold", action="store_true")
    args = ap.parse_args()
    load_before = os.getloadavg()
    root = tempfile.mkdtemp(dir=args.root, prefix="bench-fp8-")
    exact, fp8 = os.path.join(root, "bf16"), os.path.join(root, "fp8")
    samples, total = make_samples(args)
    tokens = sum(s["input_ids"].shape[0] for _, s in samples)
    print(f"{len(samples)} samples, {tokens} tokens, {total / 1e9:.2f} GB of bf16 hidden states (hidden {args.hidden}, layers {AUX} + {TARGET})")

    writes = {"bf16": [], "fp8": []}
    for r in range(args.write_rounds):
        for name, path, q in (("bf16", exact, False), ("fp8", fp8, True))[:: 1 if r % 2 == 0 else -1]:
            writes[name].append(write(path, samples, args.hidden, q))
    del samples
    size = {n: sum(os.path.getsize(f) for f in files(p)) for n, p in (("bf16", exact), ("fp8", fp8))}

    modes = ["bf16 warm", "fp8 warm", "bf16 warm, first pass", "fp8 warm, first pass"] + ([] if args.no_cold else ["bf16 cold", "fp8 cold"])
    secs = {m: [] for m in modes}
    resident = []
    delivered = None
    # One dataset object of each kept across passes, as a trainer keeps it across epochs: its
    # chunks were checked on its first pass (`check="once"`), here before the rounds.
    kept = {n: HspackDataset(p, view=Eagle3View()) for n, p in (("bf16", exact), ("fp8", fp8))}
    for ds in kept.values():
        read_pass(ds)
    for r in range(args.rounds):
        order = modes[r % len(modes):] + modes[: r % len(modes)]
        for m in order:
            name = m.split()[0]
            path = exact if name == "bf16" else fp8
            if m.endswith("cold"):
                # A new dataset object, as after a restart: the files evicted, every chunk
                # read from the disk and hashed.
                for ds in kept.values():
                    unmap(ds)
                resident.append(evict(files(path)))
                ds = HspackDataset(path, view=Eagle3View())
            elif m.endswith("first pass"):
                read_pass(kept[name])  # the files in the page cache
                ds = HspackDataset(path, view=Eagle3View())  # a new memo: every chunk hashed
            else:
                ds = kept[name]
            t, n = read_pass(ds)
            if ds is not kept[name]:
                unmap(ds)
            del ds
            assert delivered in (None, n)
            delivered = n
            secs[m].append(t)

    cmp = hspack.compare(exact, fp8)
    print("command: python3", " ".join(sys.argv))
    print("load average before", load_before, "after", os.getloadavg(), "cpus", os.cpu_count(), "torch", torch.__version__, "hspack", hspack.__version__)
    print()
    print("| dataset | bytes on disk | ratio | write s (min / median) | write GB/s of bf16 (median) |")
    print("|---|---:|---:|---:|---:|")
    for n in ("bf16", "fp8"):
        lo, med = summary(writes[n])
        print(f"| {n} | {size[n] / 1e9:.3f} GB | {size[n] / size['bf16']:.3f} | {lo:.2f} / {med:.2f} | {total / med / 1e9:.2f} |")
    print()
    print(f"| read (EAGLE-3 view + one copy), {args.rounds} rounds | GB/s of bf16 min | median | fp8 / bf16 (medians) |")
    print("|---|---:|---:|---:|")
    for m in modes:
        lo, med = summary(secs[m])
        base = statistics.median(secs[m.replace("fp8", "bf16", 1)])
        ratio = f"{base / med:.2f}" if m.startswith("fp8") else ""
        print(f"| {m} | {delivered / max(secs[m]) / 1e9:.2f} | {delivered / med / 1e9:.2f} | {ratio} |")
    if resident:
        print(f"(cold: at most {max(resident)} bytes of a dataset's files resident after eviction, by fincore)")
    print()
    print(f"| field | layer | rel L2 error | max abs error | cosine mean | cosine min |  ({cmp['samples']} samples, {cmp['rows']} tokens)")
    print("|---|---:|---:|---:|---:|---:|")
    for f in cmp["fields"]:
        if f["stored"] != "exact":
            print(f"| {f['field']} | {f['layer']} | {f['rel_l2']:.4f} | {f['max_abs']:.3g} | {f['cosine_mean']:.6f} | {f['cosine_min']:.6f} |")
    exact_fields = [f["field"] for f in cmp["fields"] if f["stored"] == "exact"]
    assert all(f["differing"] == 0 for f in cmp["fields"] if f["stored"] == "exact"), exact_fields
    print(f"fields stored exactly, equal bit for bit: {', '.join(exact_fields)}")
    shutil.rmtree(root)


if __name__ == "__main__":
    main()
