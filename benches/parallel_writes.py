"""Write bandwidth into tmpfs (/dev/shm): K threads each writing its own file against K threads
writing disjoint ranges of one file, 4 GiB in 8 MiB `pwrite`s. Shows how far a writer that
keeps one shard file open at a time can go: the kernel serializes writes into one file.

    python3 benches/parallel_writes.py
"""
import os, time, threading
buf = os.urandom(8 << 20)
TOTAL = 4 << 30
def run(k, one_file):
    paths = ["/dev/shm/par-one"] if one_file else [f"/dev/shm/par-{i}" for i in range(k)]
    fds = [os.open(p, os.O_CREAT | os.O_WRONLY | os.O_TRUNC) for p in paths]
    per = TOTAL // k
    def w(i):
        fd = fds[0 if one_file else i]
        base = i * per if one_file else 0
        off = 0
        while off < per:
            os.pwrite(fd, buf, base + off); off += len(buf)
    ts = [threading.Thread(target=w, args=(i,)) for i in range(k)]
    t0 = time.perf_counter()
    [t.start() for t in ts]; [t.join() for t in ts]
    dt = time.perf_counter() - t0
    [os.close(fd) for fd in fds]; [os.remove(p) for p in paths]
    return TOTAL / dt / 1e9
for one in (False, True):
    for k in (1, 2, 4, 8, 16):
        print(("one file" if one else "own files"), k, "threads", f"{run(k, one):.2f} GB/s", flush=True)
