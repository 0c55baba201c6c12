"""Writers that race, share a process, or are forked: one writer at a time, no committed
sample lost, and no process left hanging after fork."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time

import pytest
import torch

import hspack

H = 8
TRIALS = 200
WRITERS = 4


def schema() -> list:
    return [hspack.token_ids(), hspack.hidden_state(2, H)]


def sample(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "input_ids": torch.randint(0, 1000, (3,), generator=g, dtype=torch.int32),
        "hidden.2": torch.randn(3, H, generator=g).to(torch.bfloat16),
    }


def one_sample_dataset(path) -> None:
    with hspack.Writer(path, schema()) as w:
        w.append("first", **sample(0))


def keys(path) -> list:
    ds = hspack.open(path)
    return sorted(ds.keys())


def _racer(root: str, me: int, barrier, results) -> None:
    won, refused = [], 0
    for t in range(TRIALS):
        barrier.wait()
        try:
            w = hspack.Writer(os.path.join(root, f"trial-{t}"), schema())
        except hspack.HspackError as e:
            assert e.kind == "Locked", e
            refused += 1
            continue
        w.append(f"w{me}", **sample(me + 1))
        w.finish()
        won.append(t)
    results.put((me, won, refused))


def test_four_spawned_writers_racing_200_times_never_lose_a_sample(tmp_path):
    for t in range(TRIALS):
        one_sample_dataset(tmp_path / f"trial-{t}")
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(WRITERS), ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(str(tmp_path), me, barrier, results)) for me in range(WRITERS)]
    for p in procs:
        p.start()
    got = [results.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    finished = {t: ["first"] for t in range(TRIALS)}
    refusals = 0
    for me, won, refused in got:
        refusals += refused
        for t in won:
            finished[t].append(f"w{me}")
    for t in range(TRIALS):
        # Of writers racing for a free lock, one at least gets it: a lock that refused them
        # all would lose no sample, and still be broken.
        assert len(finished[t]) >= 2, f"trial {t}: every writer was refused"
        assert keys(tmp_path / f"trial-{t}") == sorted(finished[t]), f"trial {t}"
        assert hspack.verify(tmp_path / f"trial-{t}")["ok"]
    print(f"{TRIALS} trials x {WRITERS} writers: {sum(len(v) - 1 for v in finished.values())} finished, {refusals} refused, 0 lost")


def _rank(root: str, rank: int, count: int, barrier) -> None:
    barrier.wait()
    with hspack.Writer(root, schema(), shared=True, shard_samples=2, durable=False) as w:
        for i in range(count):
            assert w.append(f"r{rank}-{i}", **sample(1000 * rank + i)) is None


def test_ranks_of_a_job_share_one_dataset(tmp_path):
    """Four spawned processes append to one dataset with `shared=True`: every sample once,
    bit for bit, found by key; verify clean; a sole writer is refused while one shares it."""
    count = 15
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(WRITERS + 1)
    procs = [ctx.Process(target=_rank, args=(str(tmp_path / "ds"), r, count, barrier)) for r in range(WRITERS)]
    for p in procs:
        p.start()
    barrier.wait()
    for p in procs:
        p.join(timeout=600)
        assert p.exitcode == 0
    ds = hspack.open(tmp_path / "ds")
    assert len(ds) == WRITERS * count
    assert sorted(ds.keys()) == sorted(f"r{r}-{i}" for r in range(WRITERS) for i in range(count))
    for r in range(WRITERS):
        for i in range(count):
            got, want = ds.get(f"r{r}-{i}"), sample(1000 * r + i)
            for name, t in want.items():
                assert torch.equal(got[name].view(torch.uint8), t.view(torch.uint8)), (r, i, name)
    assert hspack.verify(tmp_path / "ds")["ok"]
    shared = hspack.Writer(tmp_path / "ds", schema(), shared=True)
    with pytest.raises(hspack.HspackError) as e:
        hspack.Writer(tmp_path / "ds", schema())
    assert e.value.kind == "Locked"
    shared.finish()


def test_a_second_writer_in_one_process_is_refused(tmp_path):
    path = tmp_path / "ds"
    one_sample_dataset(path)
    first = hspack.Writer(path, schema())
    first.append("a", **sample(1))
    with pytest.raises(hspack.HspackError) as e:
        hspack.Writer(path, schema())
    assert e.value.kind == "Locked"
    assert "this process" in str(e.value)
    first.finish()
    with hspack.Writer(path, schema()) as second:
        second.append("b", **sample(2))
    assert keys(path) == ["a", "b", "first"]
    assert hspack.verify(path)["ok"]


def _in_child(work) -> int:
    """Runs `work` in a forked child; returns its exit code, failing if it hangs."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            work()
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail("the forked child hung")


def _write_read_verify(path) -> None:
    with hspack.Writer(path, schema()) as w:
        for i in range(6):
            w.append(f"k{i}", **sample(i))
    ds = hspack.open(path)
    assert torch.equal(ds[5]["hidden.2"], sample(5)["hidden.2"])
    assert hspack.verify(path)["ok"]


@pytest.mark.parametrize("before", ["write", "read", "verify"])
def test_a_forked_child_writes_reads_and_verifies_after_the_parent_did(tmp_path, before):
    path = tmp_path / "parent"
    with hspack.Writer(path, schema()) as w:
        for i in range(4):
            w.append(f"k{i}", **sample(i))
    if before == "read":
        ds = hspack.open(path)
        _ = [ds[i]["hidden.2"].sum() for i in range(len(ds))]
    elif before == "verify":
        assert hspack.verify(path)["ok"]
    assert _in_child(lambda: _write_read_verify(tmp_path / "child")) == 0
    assert keys(tmp_path / "child") == [f"k{i}" for i in range(6)]
    # And the parent still works after its child.
    _write_read_verify(tmp_path / "again")


def test_a_forked_child_cannot_use_or_break_its_parents_writer(tmp_path):
    path = tmp_path / "ds"
    w = hspack.Writer(path, schema())
    w.append("before", **sample(1))

    def child():
        with pytest.raises(hspack.HspackError) as e:
            w.append("child", **sample(2))
        assert e.value.kind == "ForkedWriter"
        with pytest.raises(hspack.HspackError) as e:
            hspack.Writer(path, schema())
        assert e.value.kind == "Locked"
        del e
        # Dropping the child's copy must neither release the lock nor delete the open shard.
        w._native = None

    assert _in_child(child) == 0
    # The lock is the parent's still: another process is refused (a process's own second
    # writer is refused by the process itself, which would not tell).
    import subprocess
    import sys

    probe = "import sys, hspack\ntry:\n    hspack.Writer(sys.argv[1], [hspack.token_ids(), hspack.hidden_state(2, 8)])\nexcept hspack.HspackError as e:\n    print(e.kind)\n"
    out = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "Locked", out.stdout + out.stderr
    w.append("after", **sample(3))
    w.finish()
    assert keys(path) == ["after", "before"]
    assert hspack.verify(path)["ok"]


def test_a_child_forked_while_a_thread_writes_is_refused_at_once(tmp_path):
    """A child forked while a thread of the parent is inside a writer call (holding its lock,
    which the child inherits held for good) gets the forked-writer error from every call at
    once, and its abort (what `with` does on an error) does nothing: none waits forever."""
    w = hspack.Writer(tmp_path / "ds", [hspack.token_ids(), hspack.hidden_state(2, 4096)], durable=False)
    big = {"input_ids": torch.zeros(1024, dtype=torch.int32), "hidden.2": torch.ones(1024, 4096, dtype=torch.bfloat16)}
    stop = threading.Event()

    def writing():
        i = 0
        while not stop.is_set():
            w.append(f"s{i}", **big)
            i += 1

    def child():
        for call in (lambda: w.contains("nope"), lambda: w.append("child", **big), lambda: len(w), w.commit, w.finish):
            with pytest.raises(hspack.HspackError) as e:
                call()
            assert e.value.kind == "ForkedWriter", e.value
        w.abort()

    t = threading.Thread(target=writing)
    t.start()
    try:
        for _ in range(5):
            time.sleep(0.03)
            assert _in_child(child) == 0
    finally:
        stop.set()
        t.join()
    w.finish()
    assert hspack.verify(tmp_path / "ds")["ok"]


def _store_capture(store, name, samples) -> None:
    """Appends `samples` (key, token ids, hidden state) with capture keys to dataset `name` of
    `store`: the sample digests hash each 1 MiB field on several threads."""
    fields = [hspack.token_ids(), hspack.hidden_state(2, 4096)]
    config = {"model": "m", "engine": "test", "deterministic": True, "dtype": "bf16", "layers": [2], "fields": [f["name"] for f in fields]}
    with hspack.Writer(store / name, fields, create=True, durable=False) as w:
        for key, ids, hidden in samples:
            w.append(key, capture_key=hspack.capture_key(config, ids), input_ids=ids, **{"hidden.2": hidden})


def test_a_forked_child_records_captures_after_the_parent_did(tmp_path):
    """Capture digests hash on hspack's own per-process pool: a child forked after the parent
    hashed has no threads of the parent's pools, and must not wait for them. (The samples are
    made before the fork: torch's own OpenMP threads do not survive one either.)"""
    samples = []
    for i in range(2):
        hidden = torch.randn(128, 4096, generator=torch.Generator().manual_seed(i)).to(torch.bfloat16)
        samples.append((f"k{i}", torch.arange(128, dtype=torch.int32) + i, hidden))
    hspack.init_store(str(tmp_path / "store"))
    _store_capture(tmp_path / "store", "parent", samples)
    assert _in_child(lambda: _store_capture(tmp_path / "store", "child", samples)) == 0
    child = hspack.open(tmp_path / "store" / "child")
    assert len(child) == 2 and torch.equal(child[1]["hidden.2"].view(torch.int16), samples[1][2].view(torch.int16))


_TRAINER = r"""
import os, sys, time
sys.path.insert(0, sys.argv[2])
import hspack
from test_writer_safety import sample, schema

w = hspack.Writer(sys.argv[1], schema())
w.append("uncommitted", **sample(1))
child = os.fork()
if child == 0:  # a worker forked without exec: it shares the lock file's open descriptor
    sys.stdin.read()  # until the test closes the pipe
    os._exit(0)
print(child, flush=True)
time.sleep(600)
"""


def test_a_lock_a_killed_writers_child_still_holds_names_it_and_goes_with_it(tmp_path):
    """A writer killed while a child it forked lives: the child still holds the lock (the
    kernel releases it with the last process holding the file), so the next writer is refused,
    and told that the writer named in the lock has exited, that a forked child holds it, and
    how to find it. Once the child ends, the next writer takes the dataset, and the killed
    writer's uncommitted sample is not in it."""
    import subprocess
    import sys

    path = tmp_path / "ds"
    one_sample_dataset(path)
    here = os.path.dirname(os.path.abspath(__file__))
    trainer = subprocess.Popen([sys.executable, "-c", _TRAINER, str(path), here], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        int(trainer.stdout.readline())
        trainer.kill()
        trainer.wait()
        with pytest.raises(hspack.HspackError) as e:
            hspack.Writer(path, schema())
        said = str(e.value)
        assert e.value.kind == "Locked", said
        assert f"pid {trainer.pid} on " in said and "which has exited" in said, said
        assert "fuser -v" in said and ".hspack-writer.lock" in said, said
    finally:
        trainer.stdin.close()  # the child reads end of file and exits
    deadline = time.monotonic() + 60
    while True:
        try:
            w = hspack.Writer(path, schema())
            break
        except hspack.HspackError as err:
            assert err.kind == "Locked" and time.monotonic() < deadline, err
            time.sleep(0.05)
    w.append("next", **sample(2))
    w.finish()
    assert keys(path) == ["first", "next"]
    assert hspack.verify(path)["ok"]


def test_a_commit_lock_held_past_the_wait_stops_the_commit_and_names_where_to_look(tmp_path, monkeypatch):
    """Writers sharing a dataset wait for its commit lock; one held past the wait (a writer
    stuck in its commit, or a worker forked from a killed one, which keeps the lock file open)
    stops the commit with an error saying what holds it and how to find it: no wait for good.
    The lock the abandoned wait gets later is let go, so the next writer commits."""
    import fcntl
    import subprocess

    path = tmp_path / "ds"
    w = hspack.Writer(path, schema(), shared=True)
    w.append("waited", **sample(1))
    lock = path / ".hspack-commit.lock"
    # -o: flock holds the lock itself, not the `sleep` it runs (which would inherit it).
    holder = subprocess.Popen(["flock", "-o", str(lock), "sleep", "600"], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        with open(lock, "a") as probe:
            while True:  # until the holder has it
                try:
                    fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(probe, fcntl.LOCK_UN)
                except BlockingIOError:
                    break
                assert time.monotonic() < deadline
                time.sleep(0.02)
        monkeypatch.setenv("HSPACK_COMMIT_WAIT_SECS", "1")
        start = time.monotonic()
        with pytest.raises(hspack.HspackError) as e:
            w.finish()
        said = str(e.value)
        assert time.monotonic() - start < 30, said
        assert f"fuser -v {lock}" in said and "a writer committing" in said, said
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    with hspack.Writer(path, schema(), shared=True) as next_writer:
        next_writer.append("next", **sample(2))
    assert keys(path) == ["next"]
    assert hspack.verify(path)["ok"]


def test_a_field_named_like_the_capture_key_keyword_is_refused(tmp_path):
    """`append(capture_key=...)` would take such a field's tensor for a capture key."""
    with pytest.raises(hspack.HspackError, match="field named `capture_key`") as e:
        hspack.Writer(tmp_path / "ds", [hspack.token_ids(), hspack.field("capture_key", "f32", [4])])
    assert e.value.field == "capture_key"
    assert not (tmp_path / "ds").exists()


DAEMON_APPENDS = """
import sys, threading, time
import numpy as np
import hspack
w = hspack.Writer(sys.argv[1], [hspack.token_ids(), hspack.field("h", "f32", [256])], durable=False)
ids, h = np.zeros(4096, np.int32), np.zeros((4096, 256), np.float32)
w.append("first", input_ids=ids, h=h)
w.commit()
def appends():
    i = 0
    while True:
        w.append(f"t{i}", input_ids=ids, h=h)
        i += 1
threading.Thread(target=appends, daemon=True).start()
time.sleep(0.5)
"""


def test_a_daemon_thread_inside_append_when_the_interpreter_exits_does_not_abort_it(tmp_path):
    """Python ends a thread that takes the GIL back while it finalizes with `pthread_exit`:
    its forced unwind through pyo3 aborted the process ("FATAL: exception not rethrown",
    status 134) in a daemon thread appending as the main thread returned. The process exits
    as it means to, and what was committed stays."""
    import shutil
    import subprocess
    import sys

    path = str(tmp_path / "ds")
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", DAEMON_APPENDS, path], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
        assert "FATAL" not in done.stderr, done.stderr[-2000:]
        ds = hspack.open(path)
        assert "first" in ds.keys() and hspack.verify(path)["ok"]
        shutil.rmtree(path)

