"""Two builds of ``hspack convert`` against each other and ``cp -r`` + ``sync``, alternating.

Writes the SpecForge dump of ``bench_convert.py`` (``--gb`` GB, hidden 7168) into ``--dir``,
then runs, round after round, each round starting one tool later (``bench_convert.interleaved``): ``A convert``,
``B convert``, ``cp -r`` followed by ``sync``. Every run is followed by the removal of its
output and a ``sync``, untimed, so none pays for another's write-back. Prints the load average, each
tool's times, min and median. For a change to the write path, the build before as ``--a`` and
the build after as ``--b``:

    cp target/release/hspack /tmp/hspack-before   # before the change
    cargo build --release                           # after it
    python3 benches/convert/ab_builds.py --a /tmp/hspack-before --b target/release/hspack --dir /work/benchtmp
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_convert  # noqa: E402
from bench_convert import generate  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="the first hspack binary (the build before)")
    ap.add_argument("--b", required=True, help="the second hspack binary (the build after)")
    ap.add_argument("--dir", required=True, help="work folder, on the disk to measure")
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=8)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="hspack-ab-", dir=a.dir)
    try:
        src, out = os.path.join(work, "src"), os.path.join(work, "out")
        files, total = generate(src, int(a.gb * 1e9), 7168, 0)

        def convert(binary):
            return lambda: subprocess.run([binary, "convert", src, out, "--layout", "specforge", "--layers",
                                           "2,30,58,61", "--num-layers", "61", "-q"], check=True)

        tools = [(f"A `{a.a}`", convert(a.a)), (f"B `{a.b}`", convert(a.b)),
                 ("`cp -r`, then `sync`", lambda: (subprocess.run(["cp", "-r", src, out], check=True), os.sync()))]
        tools = [(name, run, lambda: shutil.rmtree(out)) for name, run in tools]
        load_before = os.getloadavg()
        for _, run, cleanup in tools:  # a warm-up round: the page cache, the binaries
            run()
            cleanup()
            os.sync()
        bench_convert.REPEAT = max(1, a.rounds)
        times = bench_convert.interleaved(tools)
        print(f"\n{files} SpecForge files, {total / 1e9:.2f} GB, in {a.dir}, {os.cpu_count()} cores, "
              f"{a.rounds} rounds after a warm-up round; load average before {load_before}, after {os.getloadavg()}\n")
        print("| tool | min s | median s | every round, s |")
        print("|---|---:|---:|---|")
        for name, v in times.items():
            print(f"| {name} | {min(v):.2f} | {statistics.median(v):.2f} | {' '.join(f'{x:.2f}' for x in v)} |")
        print(f"\ncommand: `{' '.join(['python3', *sys.argv])}`")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
