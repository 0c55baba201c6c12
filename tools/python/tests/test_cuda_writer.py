"""hspack.capture.CudaWriter on a real GPU: bytes equal the source tensors, ordering after the
producer's stream, keepalive of freed tensors, split and oversize samples, backpressure.

Every test but the first needs a CUDA GPU and skips with the reason where there is none.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

import hspack  # noqa: E402
from hspack.capture import CudaWriter  # noqa: E402

HIDDEN = 7168
LAYERS = (2, 20, 40, 60)
HAS_GPU = torch.cuda.is_available()
NO_GPU = "no CUDA GPU here: the CudaWriter GPU tests run on a GPU machine (see benches/README-cuda.md)"
if not HAS_GPU:
    print(f"SKIP test_cuda_writer GPU tests: {NO_GPU}")
gpu = pytest.mark.skipif(not HAS_GPU, reason=NO_GPU)


def schema():
    return [hspack.hidden_state(layer, HIDDEN, dtype="bf16") for layer in LAYERS]


def names():
    return [f["name"] for f in schema()]


def test_without_gpu_the_error_is_clear(tmp_path):
    if HAS_GPU:
        pytest.skip("a GPU is present: the no-GPU error is checked on machines without one")
    with pytest.raises(hspack.HspackError) as e:
        CudaWriter(tmp_path / "ds", schema())
    assert e.value.kind in ("NoDriver", "Driver", "NoDevice", "NoCuda"), e.value.kind
    assert "CUDA" in str(e.value)


@pytest.mark.parametrize("option", [{"writers": 0}, {"writers": True}, {"slots": 0}, {"slots": 2.5}, {"slot_bytes": 0}, {"slot_bytes": True}])
def test_a_ring_option_that_counts_nothing_is_refused_naming_it(tmp_path, option):
    """Checked before any GPU is asked for (so here, with or without one): `slots=True` was a
    ring of one slot, `slot_bytes=0` reached the native writer."""
    with pytest.raises(hspack.HspackError) as e:
        CudaWriter(tmp_path / "ds", schema(), **option)
    (name,) = option
    assert e.value.kind == "BadOption" and e.value.option == name, e.value
    assert not (tmp_path / "ds").exists()


def slow_produce(bufs, rows, gen):
    """Fills bufs[:rows] on the current stream after a GPU-side delay, so a copy that did not
    wait for the producer would read the old contents."""
    if hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(2_000_000)
    for b in bufs:
        b[:rows].copy_(torch.randn(rows, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16))


def read_back(path):
    ds = hspack.open(path)
    return {ds.sample(i).key: ds[i] for i in range(len(ds))}


def equal_bits(a, b):
    return torch.equal(a.contiguous().view(torch.int16).cpu(), b.contiguous().view(torch.int16).cpu())


@gpu
def test_in_place_buffers_ordering_and_bytes(tmp_path):
    """Static producer buffers, overwritten on the same stream right after each append."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = [1, 7, 1024, 2999, 333, 2048, 5, 1500]
    tmax = max(rows)
    bufs = [torch.zeros(tmax, HIDDEN, dtype=torch.bfloat16, device="cuda") for _ in LAYERS]
    expect = {}
    fields = names()
    w = CudaWriter(tmp_path / "ds", schema(), slots=4, slot_bytes=64 << 20, durable=False)
    for i, t in enumerate(rows):
        slow_produce(bufs, t, gen)
        key = f"s{i}"
        # Device-side reference on the producer stream: what the tensors hold at capture time.
        expect[key] = [b[:t].clone() for b in bufs]
        w.append(key, overwrite=True, **{n: b[:t] for n, b in zip(fields, bufs)})
        # The producer goes on writing the same memory, no host sync in between.
        for b in bufs:
            b.fill_(float("nan"))
    stats = w.finish()
    assert stats["samples_written"] == len(rows)
    assert stats["unwritten"] == 0
    assert stats["bytes_copied"] == sum(rows) * HIDDEN * 2 * len(LAYERS)
    got = read_back(tmp_path / "ds")
    assert sorted(got) == sorted(expect)
    for key, tensors in expect.items():
        for n, ref in zip(fields, tensors):
            assert equal_bits(got[key][n], ref), (key, n)


@gpu
@pytest.mark.parametrize("how", ["non-contiguous", "fp8"])
def test_work_on_the_tensors_runs_on_the_producer_stream_given(tmp_path, how):
    """Tensors produced on a side stream, after a GPU-side delay, appended from the default
    stream with `stream=` naming the producer: the contiguous copy (or the FP8 form) the writer
    makes must wait for them. It ran on torch's current stream, read the tensors before they
    were written, and stored the old bytes."""
    gen = torch.Generator(device="cuda").manual_seed(7)
    rows = 1500
    fields = [hspack.hidden_state(LAYERS[0], HIDDEN, dtype="bf16")]
    options = {"quantize": "fp8"} if how == "fp8" else {}
    want = torch.randn(rows, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16)
    expect = {}
    w = CudaWriter(tmp_path / "ds", fields, durable=False, **options)
    side = torch.cuda.Stream()
    for i in range(3):
        value = want * (i + 1)
        # Non-contiguous: [rows, HIDDEN] seen through a transposed buffer; fp8: contiguous.
        backing = torch.zeros((HIDDEN, rows) if how == "non-contiguous" else (rows, HIDDEN), dtype=torch.bfloat16, device="cuda")
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)
            backing.copy_(value.t() if how == "non-contiguous" else value)
        given = backing.t() if how == "non-contiguous" else backing
        expect[f"s{i}"] = value
        w.append(f"s{i}", stream=side.cuda_stream, **{fields[0]["name"]: given})
    w.finish()
    if how == "fp8":
        with hspack.Writer(tmp_path / "host", fields, durable=False, quantize="fp8") as host:
            for key, t in expect.items():
                host.append(key, **{fields[0]["name"]: t.cpu()})
        expect = {k: v[fields[0]["name"]] for k, v in read_back(tmp_path / "host").items()}
    got = read_back(tmp_path / "ds")
    for key, ref in expect.items():
        assert equal_bits(got[key][fields[0]["name"]], ref), key


class OnStream:
    """A bf16 GPU array seen through `__cuda_array_interface__` (as `<u2`), naming the stream
    its producer wrote it on, as CuPy and Numba arrays do."""

    def __init__(self, t, stream):
        self.t, self.stream = t, stream

    @property
    def __cuda_array_interface__(self):
        cai = dict(self.t.view(torch.int16).__cuda_array_interface__)
        return {**cai, "typestr": "<u2", "stream": self.stream.cuda_stream}


@gpu
@pytest.mark.parametrize("with_torch_field", [False, True])
def test_fields_from_several_streams_are_each_copied_after_their_producer(tmp_path, with_torch_field):
    """Each field written on its own side stream after a GPU-side delay, handed over through
    `__cuda_array_interface__` naming that stream (and, in one case, a torch tensor written
    on torch's current stream beside them): every copy must wait for its own producer. The
    copies waited only for the last stream named, and read the other fields before they were
    written."""
    gen = torch.Generator(device="cuda").manual_seed(11)
    rows = 1024
    fields = schema()[:3]
    w = CudaWriter(tmp_path / "ds", fields, durable=False)
    expect = {}
    for i in range(3):
        values = [torch.randn(rows, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16) for _ in fields]
        backing = [torch.zeros(rows, HIDDEN, dtype=torch.bfloat16, device="cuda") for _ in fields]
        torch.cuda.synchronize()
        given = {}
        for k, (f, v, b) in enumerate(zip(fields, values, backing)):
            if with_torch_field and k == 0:
                torch.cuda._sleep(200_000_000)  # on torch's current stream
                b.copy_(v)
                given[f["name"]] = b
                continue
            side = torch.cuda.Stream()
            with torch.cuda.stream(side):
                torch.cuda._sleep(200_000_000 * (len(fields) - k))  # the first named finishes last
                b.copy_(v)
            given[f["name"]] = OnStream(b, side)
        expect[f"s{i}"] = values
        w.append(f"s{i}", **given)
    w.finish()
    got = read_back(tmp_path / "ds")
    for key, values in expect.items():
        for f, ref in zip(fields, values):
            assert equal_bits(got[key][f["name"]], ref), (key, f["name"])


@gpu
def test_a_failed_commit_leaves_its_samples_out_of_contains(tmp_path):
    """A commit that fails (the manifest's temp name is taken by a folder): its samples are
    not in the dataset, and `contains` no longer says they are; the writer stopped (what is
    given next fails, naming them), and one opened again captures them again."""
    fields = [hspack.hidden_state(LAYERS[0], HIDDEN, dtype="bf16")]
    name = fields[0]["name"]
    h = torch.ones(3, HIDDEN, dtype=torch.bfloat16, device="cuda")
    w = CudaWriter(tmp_path / "ds", fields, durable=False)
    w.append("a", **{name: h})
    w.commit()
    blocker = tmp_path / "ds" / "manifest.json.tmp"
    blocker.mkdir()
    w.append("b", **{name: h * 2})
    with pytest.raises(hspack.HspackError):
        w.commit()
    assert w.contains("a") and not w.contains("b")
    blocker.rmdir()
    w.append("b", **{name: h * 2})
    with pytest.raises(hspack.HspackError, match="`b` to `b`"):
        w.finish()
    w = CudaWriter(tmp_path / "ds", fields, durable=False)
    assert w.contains("a") and not w.contains("b")
    w.append("b", **{name: h * 2})
    w.finish()
    got = read_back(tmp_path / "ds")
    assert sorted(got) == ["a", "b"] and equal_bits(got["b"][name], h * 2)


@gpu
def test_a_forked_process_is_refused_and_the_parents_writer_goes_on(tmp_path):
    """A process forked from the one holding the writer (a DataLoader worker, `os.fork()`)
    has none of its threads: every call there is refused at once with a message saying what
    to do, where a flush would have waited for good, and the child's exit leaves the parent's
    writer whole."""
    fields = [hspack.hidden_state(LAYERS[0], HIDDEN, dtype="bf16")]
    name = fields[0]["name"]
    h = torch.ones(5, HIDDEN, dtype=torch.bfloat16, device="cuda")
    w = CudaWriter(tmp_path / "ds", fields, durable=False)
    w.append("a", **{name: h})
    r, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no CUDA here, only the writer's refusals
        os.close(r)
        said = []
        for call in (w.flush, w.commit, lambda: w.contains("a"), w.abort):
            try:
                call()
                said.append("returned")
            except hspack.HspackError as e:
                said.append(str(e))
        os.write(wfd, "\n".join(said).encode())
        os.close(wfd)
        del w
        os._exit(0)
    os.close(wfd)
    said = b""
    while chunk := os.read(r, 65536):
        said += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    lines = said.decode().split("\n")
    assert len(lines) == 4, lines
    for line in lines:
        assert "forked" in line and "open a new CudaWriter" in line, line
    w.append("b", **{name: h * 2})
    w.finish()
    got = read_back(tmp_path / "ds")
    assert sorted(got) == ["a", "b"] and equal_bits(got["b"][name], h * 2)


@gpu
def test_fresh_tensors_are_kept_alive_until_copied(tmp_path):
    """The producer drops its tensors right after append and allocates new ones of the same
    size: without the writer's reference, the allocator would hand the same memory out."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    fields = names()
    expect = {}
    w = CudaWriter(tmp_path / "ds", schema(), slots=2, slot_bytes=32 << 20, durable=False)
    for i, t in enumerate([100, 1000, 2047, 64, 1777, 900]):
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(2_000_000)
        hs = [torch.randn(t, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16) for _ in fields]
        expect[f"f{i}"] = [h.clone() for h in hs]
        w.append(f"f{i}", **dict(zip(fields, hs)))
        del hs
        junk = [torch.full((t, HIDDEN), -1.0, dtype=torch.bfloat16, device="cuda") for _ in fields]
        del junk
    stats = w.finish()
    assert stats["samples_written"] == 6 and stats["unwritten"] == 0
    got = read_back(tmp_path / "ds")
    for key, tensors in expect.items():
        for n, ref in zip(fields, tensors):
            assert equal_bits(got[key][n], ref), (key, n)


@gpu
def test_split_oversize_and_backpressure(tmp_path):
    """A tiny ring: samples split across slots, samples larger than the whole ring, and an
    append that must block until a slot frees."""
    gen = torch.Generator(device="cuda").manual_seed(2)
    fields = names()
    # 1 MiB slots, 10 of them: a 100-row field (1.4 MiB) splits over 2 slots (8 for the
    # sample), a 300-row sample (16.4 MiB) is larger than the ring and takes the one-off
    # buffer.
    w = CudaWriter(tmp_path / "ds", schema(), slots=10, slot_bytes=1 << 20, durable=False)
    expect = {}
    for i, t in enumerate([16, 100, 300, 100, 16, 300, 1, 100]):
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(20_000_000)  # keep the copies behind, so appends must wait
        hs = [torch.randn(t, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16) for _ in fields]
        expect[f"b{i}"] = [h.clone() for h in hs]
        w.append(f"b{i}", **dict(zip(fields, hs)))
    mid = w.stats()
    assert mid["slots"] == 10 and mid["slot_bytes"] == 1 << 20
    stats = w.finish()
    assert stats["waits"] > 0, stats
    assert stats["oversize"] == 2, stats
    assert stats["samples_written"] == 8 and stats["unwritten"] == 0
    got = read_back(tmp_path / "ds")
    for key, tensors in expect.items():
        for n, ref in zip(fields, tensors):
            assert equal_bits(got[key][n], ref), (key, n)


@gpu
def test_slots_are_sized_from_the_fields(tmp_path):
    """Without `slot_bytes`, slots grow to the largest field so far (a power of two, at
    least 1 MiB): ragged samples, short ones first, are each copied in place, never through
    the one-off buffer, and read back bit-exact."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    fields = names()
    w = CudaWriter(tmp_path / "ds", schema(), slots=8, durable=False)
    assert w.stats()["slot_bytes"] == 0  # nothing captured yet, nothing pinned
    expect, sizes = {}, []
    for i, t in enumerate([3, 100, 40, 600, 2, 1200, 7]):
        hs = [torch.randn(t, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16) for _ in fields]
        expect[f"r{i}"] = [h.clone() for h in hs]
        w.append(f"r{i}", **dict(zip(fields, hs)))
        sizes.append(w.stats()["slot_bytes"])
    field = lambda rows: rows * HIDDEN * 2  # noqa: E731
    # 3 and 100 rows fit 1 MiB and 2 MiB (1.4 MB); 600 rows (8.6 MB) need 16 MiB; 1200 (17.2 MB) 32 MiB.
    assert sizes == [1 << 20, 2 << 20, 2 << 20, 16 << 20, 16 << 20, 32 << 20, 32 << 20], sizes
    assert all(s >= field(t) for s, t in zip(sizes, [3, 100, 40, 600, 2, 1200, 7]))
    stats = w.finish()
    assert stats["oversize"] == 0 and stats["samples_written"] == 7 and stats["unwritten"] == 0, stats
    got = read_back(tmp_path / "ds")
    for key, tensors in expect.items():
        for n, ref in zip(fields, tensors):
            assert equal_bits(got[key][n], ref), (key, n)


@gpu
def test_errors_are_reported_before_anything_is_copied(tmp_path):
    fields = names()
    w = CudaWriter(tmp_path / "ds", schema(), slots=2, slot_bytes=1 << 20, durable=False)
    ok = {n: torch.zeros(4, HIDDEN, dtype=torch.bfloat16, device="cuda") for n in fields}
    w.append("a", **ok)
    with pytest.raises(hspack.HspackError) as e:
        w.append("a", **ok)
    assert e.value.kind == "DuplicateKey"
    cpu = dict(ok)
    cpu[fields[0]] = torch.zeros(4, HIDDEN, dtype=torch.bfloat16)
    with pytest.raises(hspack.HspackError) as e:
        w.append("b", **cpu)
    assert "GPU" in str(e.value) or "CUDA" in str(e.value)
    wrong = dict(ok)
    wrong[fields[1]] = torch.zeros(5, HIDDEN, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(hspack.HspackError) as e:
        w.append("c", **wrong)
    assert e.value.kind == "BadSample"
    f32 = dict(ok)
    f32[fields[2]] = torch.zeros(4, HIDDEN, dtype=torch.float32, device="cuda")
    with pytest.raises(hspack.HspackError) as e:
        w.append("d", **f32)
    assert e.value.kind == "BadSample"
    stats = w.finish()
    assert stats["samples_written"] == 1
    assert len(hspack.open(tmp_path / "ds")) == 1


@gpu
def test_other_protocols_cupy_and_jax(tmp_path):
    """__cuda_array_interface__ (CuPy) and DLPack (JAX) inputs, where those libraries exist."""
    fields = names()
    w = CudaWriter(tmp_path / "ds", schema(), slots=2, slot_bytes=8 << 20, durable=False)
    expect = {}
    try:
        import cupy

        arrs = [cupy.asarray(torch.randn(3, HIDDEN, device="cuda").to(torch.bfloat16).view(torch.int16)).view(cupy.uint16) for _ in fields]
        cupy.cuda.get_current_stream().synchronize()
        expect["cupy"] = [torch.as_tensor(a, device="cuda").view(torch.bfloat16).clone() for a in arrs]
        w.append("cupy", **dict(zip(fields, arrs)))
    except ImportError:
        pass
    try:
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        import jax
        import jax.numpy as jnp

        if jax.devices()[0].platform != "gpu":
            raise ImportError("JAX has no GPU here")
        arrs = [jnp.ones((2, HIDDEN), dtype=jnp.bfloat16) * (k + 1) for k in range(len(fields))]
        expect["jax"] = [torch.full((2, HIDDEN), float(k + 1), dtype=torch.bfloat16) for k in range(len(fields))]
        w.append("jax", **dict(zip(fields, arrs)))
    except ImportError:
        pass
    w.finish()
    if not expect:
        pytest.skip("neither CuPy nor JAX is installed")
    got = read_back(tmp_path / "ds")
    for key, tensors in expect.items():
        for n, ref in zip(fields, tensors):
            assert equal_bits(got[key][n], ref), (key, n)


@gpu
def test_stacked_eagle3_layout_from_the_gpu(tmp_path):
    """The EAGLE-3 layout straight from the GPU: the auxiliary layers stacked on the device
    (`[T, k, H]`, one field), the target in its own; read back bitwise, and the EAGLE-3 view
    hands out the stacked field without a copy."""
    from hspack.torch import HspackDataset

    aux_layers, target = LAYERS[:-1], LAYERS[-1]
    # The EAGLE-3 view needs the token ids (it refuses a dataset without them).
    fields = [hspack.token_ids(), hspack.hidden_states(list(aux_layers), HIDDEN), hspack.hidden_state(target, HIDDEN)]
    gen = torch.Generator(device="cuda").manual_seed(3)
    expect = {}
    w = CudaWriter(tmp_path / "ds", fields, durable=False)
    for i, t in enumerate([5, 300, 2048]):
        layers = [torch.randn(t, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16) for _ in LAYERS]
        aux = torch.stack(layers[:-1], 1)
        expect[f"s{i}"] = (aux.cpu(), layers[-1].cpu())
        ids = torch.arange(t, dtype=torch.int32, device="cuda")
        w.append(f"s{i}", **{"input_ids": ids, "aux_hidden_state": aux, f"hidden.{target}": layers[-1]})
        del aux, layers  # the writer keeps them alive until copied
    w.finish()
    got = read_back(tmp_path / "ds")
    view = HspackDataset(tmp_path / "ds", view="eagle3")
    base, size = view.hspack.native.mapping_range(0)
    for key, (aux, last) in expect.items():
        assert equal_bits(got[key]["aux_hidden_state"], aux), key
        assert equal_bits(got[key][f"hidden.{target}"], last), key
        item = view[view.hspack.ordinal(key)]
        assert equal_bits(item["aux_hidden_state"], aux.reshape(aux.shape[0], -1)), key
        assert base <= item["aux_hidden_state"].data_ptr() < base + size, key


@gpu
def test_several_writers_share_one_dataset(tmp_path):
    """`writers=4`: samples dealt to four writers sharing the dataset, static producer buffers
    overwritten after each append; every sample lands once, bit for bit, found by key;
    a key given twice is refused; verify is clean."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    rows = [3, 1024, 77, 2048, 1, 999, 512, 1500, 8, 640, 2000, 31]
    bufs = [torch.zeros(max(rows), HIDDEN, dtype=torch.bfloat16, device="cuda") for _ in LAYERS]
    fields = names()
    expect = {}
    w = CudaWriter(tmp_path / "ds", schema(), slots=3, slot_bytes=32 << 20, durable=False, writers=4, shard_samples=2)
    for i, t in enumerate(rows):
        slow_produce(bufs, t, gen)
        expect[f"s{i}"] = [b[:t].clone() for b in bufs]
        w.append(f"s{i}", overwrite=True, **{n: b[:t] for n, b in zip(fields, bufs)})
        for b in bufs:
            b.fill_(float("nan"))
    with pytest.raises(hspack.HspackError) as e:
        w.append("s0", **{n: b[:1] for n, b in zip(fields, bufs)})
    assert e.value.kind == "DuplicateKey"
    stats = w.finish()
    assert stats["samples_written"] == len(rows) and stats["unwritten"] == 0
    assert stats["slots"] == 12
    got = read_back(tmp_path / "ds")
    assert sorted(got) == sorted(expect)
    for key, tensors in expect.items():
        for n, ref in zip(fields, tensors):
            assert equal_bits(got[key][n], ref), (key, n)
    assert hspack.verify(tmp_path / "ds")["ok"]
    assert len(hspack.open(tmp_path / "ds").shards) >= 4


@gpu
def test_captures_into_a_store_dataset_dedup_and_read_back(tmp_path):
    """`CudaWriter` into `STORE/NAME`: the bytes read back equal the GPU tensors, and the same
    captures written again under another name store (almost) nothing new."""
    store = tmp_path / "store"
    hspack.init_store(store)
    gen = torch.Generator(device="cuda").manual_seed(5)
    fields = names()
    samples = {f"s{i}": [torch.randn(t, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16) for _ in fields]
               for i, t in enumerate([64, 1000, 17, 513])}

    def packs():
        return sum(p.stat().st_size for p in (store / "packs").iterdir())

    for name in ("first", "again"):
        w = CudaWriter(store / name, schema(), durable=False)
        for key, hs in samples.items():
            w.append(key, **dict(zip(fields, hs)))
        stats = w.finish()
        assert stats["samples_written"] == 4 and stats["unwritten"] == 0
        if name == "first":
            before = packs()
    assert packs() - before < 0.02 * before, (before, packs())
    for name in ("first", "again"):
        got = read_back(store / name)
        for key, hs in samples.items():
            for n, ref in zip(fields, hs):
                assert equal_bits(got[key][n], ref), (name, key, n)


@gpu
def test_fp8_quantized_on_the_gpu_equals_the_host_writer(tmp_path):
    """`quantize="fp8"`: the GPU quantizes before the copy (half the bytes copied), and the
    dataset holds exactly what `hspack.Writer` quantizing on the host writes from the same
    tensors: the same codes, the same scales, the same dequantized values. A NaN is refused,
    naming the sample and the field."""
    aux_layers, target = LAYERS[:-1], LAYERS[-1]
    fields = [hspack.token_ids(), hspack.hidden_states(list(aux_layers), HIDDEN), hspack.hidden_state(target, HIDDEN)]
    gen = torch.Generator(device="cuda").manual_seed(5)
    channel = torch.exp(torch.randn(HIDDEN, device="cuda", generator=gen) * 0.5)
    channel[:64] *= 50  # outlier channels
    samples = {}
    for i, t in enumerate([1, 7, 300, 2048]):
        h = [(torch.randn(t, HIDDEN, device="cuda", generator=gen) * channel).to(torch.bfloat16) for _ in LAYERS]
        samples[f"s{i}"] = {"input_ids": torch.arange(t, dtype=torch.int32, device="cuda"), "aux_hidden_state": torch.stack(h[:-1], 1), f"hidden.{target}": h[-1]}
    gpu_w = CudaWriter(tmp_path / "gpu", fields, durable=False, quantize="fp8")
    for key, s in samples.items():
        gpu_w.append(key, **s)
    stats = gpu_w.finish()
    with hspack.Writer(tmp_path / "host", fields, durable=False, quantize="fp8") as w:
        for key, s in samples.items():
            w.append(key, **{k: v.cpu() for k, v in s.items()})
    raw = sum(t.numel() * t.element_size() for s in samples.values() for t in s.values())
    assert stats["bytes_copied"] < 0.55 * raw, (stats["bytes_copied"], raw)
    a, b = hspack.open(tmp_path / "gpu"), hspack.open(tmp_path / "host")
    assert a.manifest["version"] == 5 and a.schema == b.schema
    for key in samples:
        i, j = a.ordinal(key), b.ordinal(key)
        for name in ("aux_hidden_state", f"hidden.{target}"):
            qa, qb = a.quantized(i, name), b.quantized(j, name)
            assert torch.equal(qa["codes"].view(torch.uint8), qb["codes"].view(torch.uint8)), (key, name)
            assert torch.equal(qa["scales"], qb["scales"]), (key, name)
            assert equal_bits(a[i][name], b[j][name]), (key, name)
        assert torch.equal(a[i]["input_ids"], b[j]["input_ids"])
    bad = dict(samples["s2"])
    aux = bad["aux_hidden_state"].clone()
    aux[5, 1, 9] = float("nan")
    bad["aux_hidden_state"] = aux
    w = CudaWriter(tmp_path / "bad", fields, durable=False, quantize="fp8")
    w.append("bad", **bad)
    with pytest.raises(hspack.HspackError, match=r"bad.*aux_hidden_state|aux_hidden_state.*bad"):
        w.finish()


class Uint16DLPack:
    """bf16 bits held as uint16 behind DLPack only, as CuPy (which has no bf16) gives them."""

    def __init__(self, t):
        self.t = t.view(torch.uint16)

    def __dlpack__(self, stream=None):
        return self.t.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


@gpu
@pytest.mark.parametrize("wrap", ["cuda_array_interface", "uint16_dlpack"])
def test_fp8_takes_the_arrays_the_unquantized_path_takes(tmp_path, wrap):
    """With `quantize="fp8"`, bf16 given through `__cuda_array_interface__` alone (typestr
    `<u2`, written on the stream it names) or as uint16 through DLPack is quantized as the same
    torch tensor is: the quantized path read them with `torch.from_dlpack` only, refusing the
    first and the uint16 dtype."""
    fields = [hspack.hidden_state(LAYERS[0], HIDDEN, dtype="bf16")]
    name = fields[0]["name"]
    gen = torch.Generator(device="cuda").manual_seed(9)
    value = torch.randn(300, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16)
    if wrap == "cuda_array_interface":
        # Written on a side stream after a GPU-side delay: the quantization must wait for it.
        backing = torch.zeros_like(value)
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)
            backing.copy_(value)
        given = OnStream(backing, side)
    else:
        given = Uint16DLPack(value)
    w = CudaWriter(tmp_path / "gpu", fields, durable=False, quantize="fp8")
    w.append("s", **{name: given})
    w.finish()
    with hspack.Writer(tmp_path / "host", fields, durable=False, quantize="fp8") as host:
        host.append("s", **{name: value.cpu()})
    qa, qb = hspack.open(tmp_path / "gpu").quantized(0, name), hspack.open(tmp_path / "host").quantized(0, name)
    assert torch.equal(qa["codes"].view(torch.uint8), qb["codes"].view(torch.uint8))
    assert torch.equal(qa["scales"], qb["scales"])
