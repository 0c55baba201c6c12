"""Benchmark ``hspack convert`` against ``cp -r`` and a naive Python converter.

Generates a SpecForge-style dump with real torch (``rows_*/data_N.ckpt``: ``input_ids``,
``loss_mask``, ``hidden_state [1,T,H]``, ``aux_hidden_state [1,T,3H]``, bf16, so four layers of
hidden size H per token, ragged T), then times on the same tree, from the page cache:

- ``cp -r SRC COPY``, the same followed by an fsync of every copied file (hspack fsyncs
  each shard before it commits; on tmpfs fsync is free, on a disk it is not), and the same
  followed by ``sync`` (which writes every file at once rather than one after another);
- ``cp`` on as many processes as hspack has threads (``--jobs``, default the core count:
  ``find | xargs -P N cp --parents``), with and without the fsyncs: a copy of many files that
  uses every core, as hspack does;
- ``hspack convert SRC DS --layout specforge --layers ...`` (durable commits, default options);
- the naive converter: a Python loop that ``torch.load``s each file and appends the bytes of
  the same fields (ids, mask, ``aux_hidden_state`` as saved, the last state; with
  ``--hspack-args=--split-layers`` the three aux layers made contiguous each, as hspack then
  writes them) to one output file with ``numpy.tofile``; no index, no checksums, no resume;
  and the same loop on N processes, each writing its own file.

After a warm-up round, the tools run interleaved, one of each a round, each round starting
one tool later (A B C, B C A, ...), for ``--repeat`` rounds (default 5), with a ``sync`` (not
timed) after each tool so that none pays for the write-back another left; prints the load average, min and median wall time, GB/s (source bytes /
median time) and ratios of the medians, as a markdown table. Run from the crate
root after ``cargo build --release``:

    python3 benches/convert/bench_convert.py --gb 2 --dir /dev/shm
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch


def generate(src, total_bytes, hidden, seed):
    g = torch.Generator().manual_seed(seed)
    per_token = 4 * hidden * 2
    written, i = 0, 0
    while written < total_bytes:
        t = int(torch.randint(128, 4096, (1,), generator=g))
        folder = os.path.join(src, f"rows_{(i // 16) * 16}-{(i // 16) * 16 + 16}")
        os.makedirs(folder, exist_ok=True)
        d = {
            "input_ids": torch.randint(0, 150000, (t,), generator=g),
            "loss_mask": (torch.rand(t, generator=g) > 0.3).long(),
            "hidden_state": torch.randn(1, t, hidden, generator=g).to(torch.bfloat16),
            "aux_hidden_state": torch.randn(1, t, 3 * hidden, generator=g).to(torch.bfloat16),
        }
        path = os.path.join(folder, f"data_{i}.ckpt")
        torch.save(d, path)
        written += os.path.getsize(path)
        i += 1
    return i, tree_bytes(src)


def tree_bytes(root):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)


def ckpt_files(src):
    """The dump's `.ckpt` files, sorted."""
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(src) for f in fs if f.endswith(".ckpt"))


def naive(src, out_path, hidden, split):
    files = ckpt_files(src)
    naive_files(files, out_path, hidden, split)


def naive_files(files, out_path, hidden, split):
    with open(out_path, "wb") as out:
        for path in files:
            d = torch.load(path, weights_only=True)
            parts = [d["input_ids"], d["loss_mask"]]
            aux = d["aux_hidden_state"][0]
            if split:
                parts += [aux[:, j * hidden : (j + 1) * hidden].contiguous() for j in range(3)]
            else:
                parts.append(aux)
            parts.append(d["hidden_state"][0])
            for t in parts:
                t.contiguous().view(torch.uint8).numpy().tofile(out)
        out.flush()
        os.fsync(out.fileno())


def naive_parallel(src, out_dir, hidden, split, procs):
    """The naive converter on `procs` processes: the files dealt to them in turn, each process
    writing its own output file."""
    from concurrent.futures import ProcessPoolExecutor

    files = ckpt_files(src)
    os.makedirs(out_dir)
    with ProcessPoolExecutor(procs) as pool:
        list(pool.map(naive_files, [files[i::procs] for i in range(procs)], [os.path.join(out_dir, f"{i}.bin") for i in range(procs)], [hidden] * procs, [split] * procs))


def parallel_cp(src, copy, procs):
    """`cp` on `procs` processes at once (`find | xargs -P`), 16 files a `cp`, the tree kept
    (`--parents`): the copy a user with many files and cores would run."""
    os.makedirs(copy)
    find = subprocess.Popen(["find", ".", "-type", "f", "-print0"], cwd=src, stdout=subprocess.PIPE)
    subprocess.run(["xargs", "-0", "-P", str(procs), "-n", "16", "cp", "--parents", "-t", copy], cwd=src, stdin=find.stdout, check=True)
    find.stdout.close()
    if find.wait():
        raise RuntimeError("find failed")


def fsync_tree(root):
    for d, _, fs in os.walk(root):
        for f in fs:
            fd = os.open(os.path.join(d, f), os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)


REPEAT = 5


def interleaved(tools):
    """Runs every ``(name, run, cleanup)`` of ``tools`` once per round, in turn, ``REPEAT``
    rounds, each round starting one tool later (A B C, B C A, C A B, ...) so that no tool
    always follows the same one (the tool after the naive loop, which frees 2 GB of tmpfs and
    a Python process, runs slow); the wall times of each."""
    times = {name: [] for name, _, _ in tools}
    for r in range(REPEAT):
        for name, run, cleanup in tools[r % len(tools):] + tools[: r % len(tools)]:
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
            cleanup()
            # What the tool left for the disk to write (a copy without fsync) is written now,
            # untimed, so the next tool does not pay for it.
            os.sync()
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=2.0, help="dump size in GB (default 2)")
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--dir", default=None, help="work folder (default /dev/shm when it has room, else /tmp)")
    ap.add_argument("--bin", default=None, help="hspack binary (default target/release/hspack)")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--skip-naive", action="store_true")
    ap.add_argument("--repeat", type=int, default=5, help="interleaved rounds (every tool once a round)")
    ap.add_argument("--hspack-args", default="", help="more hspack convert arguments, e.g. --split-layers")
    a = ap.parse_args()
    global REPEAT
    REPEAT = max(1, a.repeat)
    target = os.environ.get("CARGO_TARGET_DIR", "target")
    binary = a.bin or os.path.join(target, "release", "hspack")
    if not os.path.exists(binary):
        sys.exit(f"{binary} not found: run cargo build --release first or pass --bin")
    base = a.dir
    if base is None:
        shm = shutil.disk_usage("/dev/shm").free if os.path.isdir("/dev/shm") else 0
        base = "/dev/shm" if shm > 3 * a.gb * 1e9 else tempfile.gettempdir()
    work = tempfile.mkdtemp(prefix="hspack-bench-", dir=base)
    try:
        src = os.path.join(work, "src")
        t0 = time.perf_counter()
        files, total = generate(src, int(a.gb * 1e9), a.hidden, 0)
        print(f"generated {files} files, {total / 1e9:.2f} GB in {time.perf_counter() - t0:.1f} s under {work}",
              file=sys.stderr)
        copy = os.path.join(work, "copy")
        rm_copy = lambda: shutil.rmtree(copy)  # noqa: E731
        ds = os.path.join(work, "ds")
        cmd = [binary, "convert", src, ds, "--layout", "specforge", "--layers", "2,30,58,61",
               "--num-layers", "61", "-q"]
        if a.jobs:
            cmd += ["--jobs", str(a.jobs)]
        cmd += a.hspack_args.split()
        ours = "`hspack convert`"
        procs = a.jobs or os.cpu_count()
        tools = [
            ("`cp -r`", lambda: subprocess.run(["cp", "-r", src, copy], check=True), rm_copy),
            ("`cp -r`, then fsync every file (durable, as hspack commits)",
             lambda: (subprocess.run(["cp", "-r", src, copy], check=True), fsync_tree(copy)), rm_copy),
            ("`cp -r`, then `sync` (every dirty page of the system written at once)",
             lambda: (subprocess.run(["cp", "-r", src, copy], check=True), os.sync()), rm_copy),
            (f"`cp`, {procs} at once (`xargs -P {procs} cp --parents`)", lambda: parallel_cp(src, copy, procs), rm_copy),
            (f"`cp`, {procs} at once, then fsync every file", lambda: (parallel_cp(src, copy, procs), fsync_tree(copy)), rm_copy),
            (ours, lambda: subprocess.run(cmd, check=True), lambda: shutil.rmtree(ds)),
        ]
        if not a.skip_naive:
            out = os.path.join(work, "naive.bin")
            outs = os.path.join(work, "naive")
            split = "--split-layers" in a.hspack_args.split()
            tools.append(("naive Python (`torch.load` + `numpy.tofile`)",
                          lambda: naive(src, out, a.hidden, split), lambda: os.remove(out)))
            tools.append((f"naive Python on {procs} processes",
                          lambda: naive_parallel(src, outs, a.hidden, split, procs), lambda: shutil.rmtree(outs)))
        for _, run, cleanup in tools:  # a warm-up round: the page cache, the binaries
            run()
            cleanup()
            os.sync()
        load_before = os.getloadavg()
        times = interleaved(tools)
        load_after = os.getloadavg()
        med = {name: statistics.median(v) for name, v in times.items()}
        print(f"\n{files} SpecForge files, hidden {a.hidden}, 4 layers, bf16, {total / 1e9:.2f} GB, "
              f"in {base}, {os.cpu_count()} cores, {REPEAT} rounds interleaved after a warm-up round; "
              f"load average before {load_before}, after {load_after}\n")
        print("| tool | min s | median s | GB/s (median) | hspack speed / tool speed (medians) |")
        print("|---|---:|---:|---:|---:|")
        for name, v in times.items():
            print(f"| {name} | {min(v):.2f} | {med[name]:.2f} | {total / med[name] / 1e9:.2f} | {med[name] / med[ours]:.2f}x |")
        print(f"\ncommand: `{' '.join(['python3', *sys.argv])}` (work folder {base})")
        print(f"hspack: `{' '.join(os.path.basename(c) if c == binary else c for c in cmd)}`")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
