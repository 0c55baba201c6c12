"""Benchmark ``hspack cp`` against ``rclone`` on a local S3-compatible server (moto).

On the same dataset (``hspack demo``: hidden 7168, layers [2, 30, 58, 60], bf16) and the same
server, interleaved round by round (A, B, C, ... then again; the two tools of a pair take turns
going first), ``--rounds`` times (default 5):

- upload:   ``hspack cp DS s3://…/hs-R``          vs ``rclone copy DS moto:…/rc-R``
- download: ``hspack cp s3://…/hs-R DIR``          vs ``rclone copy moto:…/rc-R DIR``
- check:    ``hspack verify s3://…/hs-R`` (every chunk's BLAKE3)
            vs ``rclone check --download DS moto:…/rc-R`` (every byte compared)
- random sample reads: ``hspack.open(url)[i]`` for random i, S3 vs the local folder, with the
  GET requests per sample counted from the server's log;
- a PyTorch DataLoader over ``HspackDataset(url)`` vs the folder, 0 and 2 workers, and over
  the URL through a local block cache (``cache_dir``): its first epoch and its second;
- writing: ``hspack.Writer(s3://…)`` (shards spooled and uploaded as they roll) vs
  ``hspack.Writer(folder)`` then ``hspack cp folder s3://…``, vs ``hspack.Writer(folder)`` alone.

hspack ``--jobs 4`` and rclone ``--transfers 4`` (its default); rclone also gets
``--s3-chunk-size 32M`` (hspack's part size) and ``--s3-upload-concurrency 8`` (hspack's parts in
flight). Prints the load average, then min and median seconds and GB/s of each, and the ratios
of the medians. The server is a single Python process: both tools share its limit, so the
ratios say more than the absolute rates. Run from the crate root after
``cargo build --release`` and ``pip install ./tools/python 'moto[server]'``:

    python3 benches/object_storage/bench_object_storage.py --samples 12
"""

import argparse
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, env):
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - start


def tree_bytes(root):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reads", type=int, default=40)
    ap.add_argument("--bin", default="target/release/hspack")
    ap.add_argument("--dir", default=tempfile.gettempdir())
    a = ap.parse_args()
    if not shutil.which("rclone"):
        sys.exit("needs rclone (apt-get install rclone)")
    port = free_port()
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log)
    endpoint = f"http://127.0.0.1:{port}"
    env = dict(os.environ, AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_REGION="us-east-1",
               RCLONE_CONFIG_MOTO_TYPE="s3", RCLONE_CONFIG_MOTO_PROVIDER="Other", RCLONE_CONFIG_MOTO_ENDPOINT=endpoint,
               RCLONE_CONFIG_MOTO_ACCESS_KEY_ID="test", RCLONE_CONFIG_MOTO_SECRET_ACCESS_KEY="test", RCLONE_CONFIG_MOTO_REGION="us-east-1")
    # A CA bundle is for https; rclone's SDK refuses one on a plain-http endpoint.
    env.pop("AWS_CA_BUNDLE", None)
    os.environ.update({k: env[k] for k in env if k.startswith("AWS_")})
    work = tempfile.mkdtemp(dir=a.dir)
    try:
        deadline = time.time() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline:
                    sys.exit("moto.server did not start")
                time.sleep(0.1)
        import boto3

        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench")
        ds = os.path.join(work, "ds")
        subprocess.run([a.bin, "demo", "--out", ds, "--samples", str(a.samples)], check=True, stdout=subprocess.DEVNULL)
        size = tree_bytes(ds)
        rc = ["rclone", "--transfers", "4", "--s3-chunk-size", "32M", "--s3-upload-concurrency", "8"]
        times = {k: [] for k in ["hspack cp up", "rclone copy up", "hspack cp down", "rclone copy down", "hspack verify url", "rclone check --download"]}
        for r in range(a.rounds):
            down_h, down_r = os.path.join(work, f"dh{r}"), os.path.join(work, f"dr{r}")
            steps = [
                (("hspack cp up", [a.bin, "cp", "--jobs", "4", ds, f"s3://bench/hs-{r}"]), ("rclone copy up", rc + ["copy", ds, f"moto:bench/rc-{r}"])),
                (("hspack cp down", [a.bin, "cp", "--jobs", "4", f"s3://bench/hs-{r}", down_h]), ("rclone copy down", rc + ["copy", f"moto:bench/rc-{r}", down_r])),
                (("hspack verify url", [a.bin, "verify", f"s3://bench/hs-{r}"]), ("rclone check --download", rc + ["check", "--download", ds, f"moto:bench/rc-{r}"])),
            ]
            for pair in steps:
                # hspack and rclone take turns going first, round by round.
                for name, cmd in pair[:: 1 if r % 2 == 0 else -1]:
                    times[name].append(run(cmd, env))
            shutil.rmtree(down_h)
            shutil.rmtree(down_r)

        import hspack

        rng = random.Random(0)
        picks = [rng.randrange(a.samples) for _ in range(a.reads)]
        reads = {"local": [], "s3": []}
        gets = []
        for r in range(a.rounds):
            for where, path in (("local", ds), ("s3", "s3://bench/hs-0"))[:: 1 if r % 2 == 0 else -1]:
                before = open(log.name).read().count('"GET /bench/')
                start = time.perf_counter()
                d = hspack.open(path)
                for i in picks:
                    d[i]
                reads[where].append((time.perf_counter() - start) / a.reads)
                if where == "s3":
                    gets.append((open(log.name).read().count('"GET /bench/') - before) / a.reads)
        # A DataLoader over the URL against one over the folder: every sample, every field,
        # 0 workers and 2 (fork), interleaved.
        import torch
        from hspack.torch import HspackDataset

        loaders = {}
        for r in range(a.rounds):
            for workers in (0, 2):
                for where, path in (("local", ds), ("s3", "s3://bench/hs-0"))[:: 1 if r % 2 == 0 else -1]:
                    d = HspackDataset(path)
                    start = time.perf_counter()
                    n = sum(1 for _ in torch.utils.data.DataLoader(d, batch_size=None, num_workers=workers))
                    assert n == a.samples
                    loaders.setdefault((where, workers), []).append(time.perf_counter() - start)
            # Through the local block cache: a first epoch fills it, a second reads only it.
            cache = os.path.join(work, f"cache-{r}")
            for epoch in ("first", "second"):
                d = HspackDataset("s3://bench/hs-0", cache_dir=cache)
                start = time.perf_counter()
                n = sum(1 for _ in torch.utils.data.DataLoader(d, batch_size=None, num_workers=0))
                assert n == a.samples
                loaders.setdefault((f"s3 + cache_dir, {epoch} epoch", 0), []).append(time.perf_counter() - start)
            shutil.rmtree(cache)
        # Writing the same samples straight into S3, against a folder then `hspack cp`.
        src = hspack.open(ds)
        samples = [(src.keys()[i], src[i]) for i in range(a.samples)]
        fields = src.manifest["schema"]["fields"]
        writes = {"Writer into s3://": [], "Writer into a folder + hspack cp": [], "Writer into a folder": []}

        def write(out):
            with hspack.Writer(out, fields, durable=False, shard_samples=4) as w:
                for key, tensors in samples:
                    w.append(key, **tensors)

        for r in range(a.rounds):
            start = time.perf_counter()
            write(f"s3://bench/w-{r}")
            writes["Writer into s3://"].append(time.perf_counter() - start)
            folder = os.path.join(work, f"w-{r}")
            start = time.perf_counter()
            write(folder)
            middle = time.perf_counter()
            subprocess.run([a.bin, "cp", "--jobs", "4", folder, f"s3://bench/wc-{r}"], check=True, env=env, stdout=subprocess.DEVNULL)
            writes["Writer into a folder + hspack cp"].append(time.perf_counter() - start)
            writes["Writer into a folder"].append(middle - start)
            shutil.rmtree(folder)
        assert len(hspack.open("s3://bench/w-0")) == a.samples
    finally:
        server.terminate()
        shutil.rmtree(work, ignore_errors=True)

    print(f"load average before the report: {os.getloadavg()}")
    print(f"command: python3 {' '.join(sys.argv)}")
    print(f"dataset: hspack demo --samples {a.samples}: {size / 1e9:.3f} GB; {a.rounds} rounds, interleaved (the peers of a pair take turns going first); moto {endpoint}")
    print()
    print("| operation | min s | median s | GB/s (median) |")
    print("|---|---:|---:|---:|")
    for k, v in times.items():
        print(f"| {k} | {min(v):.2f} | {statistics.median(v):.2f} | {size / 1e9 / statistics.median(v):.3f} |")
    print()
    for h, p in (("hspack cp up", "rclone copy up"), ("hspack cp down", "rclone copy down"), ("hspack verify url", "rclone check --download")):
        print(f"{h} vs {p}: {statistics.median(times[p]) / statistics.median(times[h]):.2f}x (median time of {p} / {h})")
    print()
    print("| random sample read (fresh open, every field) | min ms/sample | median ms/sample |")
    print("|---|---:|---:|")
    for k, v in reads.items():
        print(f"| {k} | {1e3 * min(v):.2f} | {1e3 * statistics.median(v):.2f} |")
    print(f"S3 GET requests per sample (median of rounds, manifest and shard opens included): {statistics.median(gets):.2f}")
    print()
    print("| DataLoader, one epoch (every sample, every field) | min s | median s | GB/s (median) |")
    print("|---|---:|---:|---:|")
    for (where, workers), v in loaders.items():
        print(f"| {where}, {workers} workers | {min(v):.2f} | {statistics.median(v):.2f} | {size / 1e9 / statistics.median(v):.3f} |")
    print()
    print("| writing the samples (4 a shard, no fsync) | min s | median s | GB/s (median) |")
    print("|---|---:|---:|---:|")
    for k, v in writes.items():
        print(f"| {k} | {min(v):.2f} | {statistics.median(v):.2f} | {size / 1e9 / statistics.median(v):.3f} |")


if __name__ == "__main__":
    main()
