"""Writing and reading from Python: every dtype bitwise, zero-copy views, projections."""

from __future__ import annotations

import gc
import json
import os
import re

import numpy as np
import pytest
import torch

import hspack
from conftest import eagle_sample, eagle_schema, write_eagle

DTYPES = {
    "bool": torch.bool,
    "u8": torch.uint8,
    "i8": torch.int8,
    "i16": torch.int16,
    "i32": torch.int32,
    "i64": torch.int64,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "f32": torch.float32,
    "f64": torch.float64,
    "f8e4m3fn": torch.float8_e4m3fn,
    "f8e5m2": torch.float8_e5m2,
}


def random_bits(dtype: torch.dtype, shape: tuple, seed: int) -> torch.Tensor:
    """A tensor of `dtype` with arbitrary bit patterns (NaNs included for floats)."""
    g = torch.Generator().manual_seed(seed)
    size = torch.empty(0, dtype=dtype).element_size()
    raw = torch.randint(0, 256, (int(np.prod(shape)) * size,), generator=g, dtype=torch.uint8)
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


def bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("codec", ["none", "zstd-bytegroup"])
def test_every_dtype_round_trips_bitwise(tmp_path, codec):
    schema = [hspack.field(name, name, [3, 2]) for name in DTYPES]
    written = []
    with hspack.Writer(tmp_path / "ds", schema, codec=codec, durable=False) as w:
        for i in range(4):
            sample = {name: random_bits(dt, (2 + i, 3, 2), 10 * i + k) for k, (name, dt) in enumerate(DTYPES.items())}
            w.append(f"k{i}", **sample)
            written.append(sample)
    ds = hspack.open(tmp_path / "ds")
    nds = hspack.open(tmp_path / "ds", format="numpy")
    for i, sample in enumerate(written):
        got = ds[i]
        arrays = nds[i]
        for name, want in sample.items():
            assert got[name].dtype == DTYPES[name]
            assert got[name].shape == want.shape
            assert bits(got[name]) == bits(want), name
            assert arrays[name].tobytes() == bits(want), name


def test_numpy_input_round_trips(tmp_path):
    schema = [hspack.field("x", "f32", [4]), hspack.field("b", "bf16", [2])]
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.arange(6, dtype=np.uint16).reshape(3, 2)  # bf16 as raw bits
    with hspack.Writer(tmp_path / "ds", schema, durable=False) as w:
        w.append("a", x=x, b=b)
    got = hspack.open(tmp_path / "ds", format="numpy")[0]
    assert np.array_equal(got["x"], x)
    assert np.array_equal(got["b"].view(np.uint16), b)


def test_numpy_bf16_and_fp8_have_ml_dtypes_types(tmp_path):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    schema = [hspack.field("b", "bf16", [2]), hspack.field("e4", "f8e4m3fn", [2]), hspack.field("e5", "f8e5m2", [2])]
    t = torch.tensor([[1.5, -2.0], [0.25, 448.0]])
    with hspack.Writer(tmp_path / "ds", schema, durable=False) as w:
        w.append("torch", b=t.bfloat16(), e4=t.to(torch.float8_e4m3fn), e5=t.to(torch.float8_e5m2))
        w.append("numpy", b=t.numpy().astype(ml_dtypes.bfloat16), e4=t.numpy().astype(ml_dtypes.float8_e4m3fn), e5=t.numpy().astype(ml_dtypes.float8_e5m2))
    nds = hspack.open(tmp_path / "ds", format="numpy")
    for i in range(2):
        got = nds[i]
        assert got["b"].dtype == ml_dtypes.bfloat16 and got["e4"].dtype == ml_dtypes.float8_e4m3fn and got["e5"].dtype == ml_dtypes.float8_e5m2
        for name in ("b", "e4", "e5"):
            assert np.array_equal(got[name].astype(np.float32), t.numpy()), name
    # The same bits as torch reads.
    tds = hspack.open(tmp_path / "ds")
    assert bits(tds[1]["b"]) == nds[1]["b"].tobytes()


def test_zero_copy_view_lies_in_the_mapping(eagle_path):
    ds = hspack.open(eagle_path)
    t = ds[0]["hidden.3"]
    start, length = ds._mapping_range(0)
    ptr = t.data_ptr()
    assert start <= ptr and ptr + t.numel() * t.element_size() <= start + length
    # A copy does not.
    c = ds.read(0, copy=True)["hidden.3"]
    assert not start <= c.data_ptr() < start + length
    assert torch.equal(c, t)


def test_view_outlives_the_dataset(eagle_path):
    ds = hspack.open(eagle_path)
    t = ds[5]["hidden.5"]
    n = ds.read(5, copy=True)["hidden.5"]
    del ds
    gc.collect()
    assert torch.equal(t, n)
    assert torch.equal(t, eagle_sample(5)["hidden.5"])


def test_indexing_keys_projection_and_metadata(eagle_path):
    ds = hspack.open(eagle_path)
    assert len(ds) == 37
    assert torch.equal(ds[-1]["input_ids"], eagle_sample(36)["input_ids"])
    with pytest.raises(IndexError):
        ds[37]
    with pytest.raises(IndexError):
        ds[-38]
    assert ds.keys()[:2] == ["s0000", "s0001"]
    assert "s0010" in ds and "nope" not in ds
    got = ds.get("s0010", fields=["hidden.1"], rows=(2, 5))
    assert list(got) == ["hidden.1"]
    assert torch.equal(got["hidden.1"], eagle_sample(10)["hidden.1"][2:5])
    s = ds.sample(10)
    assert (s.key, s.ordinal, s.rows) == ("s0010", 10, eagle_sample(10)["input_ids"].shape[0])
    assert s.loss_rows == int(eagle_sample(10)["loss_mask"].sum())
    assert ds.schema[2] == {"name": "hidden.1", "dtype": "bf16", "shape": [16], "role": {"kind": "hidden_state", "layer": 1, "point": "layer_input"}}
    assert ds.capture["model"] == "test/model" and ds.capture["hidden_size"] == 16
    assert ds.manifest["samples"] == 37
    assert [c for _, c in ds.shard_ranges] == [13, 13, 11]
    assert ds.lengths.tolist() == [eagle_sample(i)["input_ids"].shape[0] for i in range(37)]


def test_errors_carry_context(eagle_path):
    ds = hspack.open(eagle_path)
    with pytest.raises(hspack.HspackError) as e:
        ds.get("missing")
    assert (e.value.kind, e.value.key) == ("NoSuchKey", "missing")
    with pytest.raises(hspack.HspackError) as e:
        ds.read(3, fields=["nope"])
    assert (e.value.kind, e.value.field) == ("NoSuchField", "nope")
    with pytest.raises(hspack.HspackError) as e:
        ds.read(3, rows=(0, 10_000))
    assert (e.value.kind, e.value.key, e.value.rows) == ("RowsOutOfRange", "s0003", (0, 10_000))
    with pytest.raises(hspack.HspackError) as e:
        hspack.open(eagle_path + "-missing")
    assert e.value.kind == "NotADataset"


def test_small_stumbles_get_clear_answers(tmp_path, eagle_path):
    """A list given for a field names the sample and the field; `final-norm` (as the CLI
    spells it) is `final_norm`; a torch dataset indexed by key finds the sample, or says
    which key is missing."""
    from conftest import eagle_schema

    from hspack.torch import HspackDataset

    w = hspack.Writer(tmp_path / "ds", eagle_schema(), durable=False)
    with pytest.raises(hspack.HspackError, match=r"sample `a`, field `input_ids`: a list, not a tensor"):
        w.append("a", **dict(eagle_sample(0), input_ids=[1, 2, 3]))
    w.abort()
    assert hspack.hidden_state(61, 8, point="final-norm") == hspack.hidden_state(61, 8, point="final_norm")
    with pytest.raises(hspack.HspackError, match="must be one of"):
        hspack.hidden_state(61, 8, point="final")
    ds = HspackDataset(eagle_path, ["input_ids"])
    assert torch.equal(ds["s0010"]["input_ids"], ds[10]["input_ids"])
    with pytest.raises(KeyError, match="no sample has key 'nope'"):
        ds["nope"]
    # One field named as a string is that field, not its letters.
    plain = hspack.open(eagle_path)
    assert list(plain.read(3, fields="hidden.1")) == ["hidden.1"]
    assert torch.equal(plain.read_concat(3, "hidden.1"), plain.read(3)["hidden.1"])


def test_writer_rejects_wrong_dtype_and_shape(tmp_path):
    schema = [hspack.field("x", "bf16", [4])]
    with hspack.Writer(tmp_path / "ds", schema, durable=False) as w:
        with pytest.raises(hspack.HspackError) as e:
            w.append("a", x=torch.zeros(2, 4, dtype=torch.float16))
        assert (e.value.kind, e.value.key, e.value.field) == ("BadSample", "a", "x")
        assert str(e.value).endswith("the schema says bf16; convert it: .to(torch.bfloat16)"), e.value
        # Integers of bf16's width may be its bit patterns: .to() alone would give other values.
        with pytest.raises(hspack.HspackError) as e:
            w.append("a", x=torch.zeros(2, 4, dtype=torch.uint16))
        assert ".to(torch.bfloat16); if they are bf16 bit patterns, view them: .view(torch.bfloat16)" in str(e.value), e.value

        class ArrayLike:  # has a dtype and a shape, and is not a torch tensor
            dtype, shape = np.dtype(np.float32), (2, 4)

        with pytest.raises(hspack.HspackError, match="dtype float32, the schema says bf16"):
            w.append("a", x=ArrayLike())
        with pytest.raises(hspack.HspackError, match=r"sample key 5: an int, not a str; keys are strings"):
            w.append(5, x=torch.zeros(2, 4, dtype=torch.bfloat16))
        # A key that is no UTF-8 (a file name decoded with surrogateescape), and sparse and
        # nested tensors: named, with what to do (they failed inside torch or the codec).
        with pytest.raises(hspack.HspackError, match=r"not UTF-8 text") as e:
            w.append("a\udcff", x=torch.zeros(2, 4, dtype=torch.bfloat16))
        assert e.value.kind == "BadSample", e.value
        with pytest.raises(hspack.HspackError, match=r"sample `s`, field `x`: a sparse_coo tensor; give a dense one \(.to_dense\(\)"):
            w.append("s", x=torch.zeros(2, 4, dtype=torch.bfloat16).to_sparse())
        with pytest.raises(hspack.HspackError, match=r"sample `n`, field `x`: a nested tensor"):
            w.append("n", x=torch.nested.nested_tensor([torch.zeros(2, 4, dtype=torch.bfloat16)]))
        with pytest.raises(hspack.HspackError):
            w.append("a", x=torch.zeros(2, 5, dtype=torch.bfloat16))
        w.append("a", x=torch.zeros(2, 8, dtype=torch.bfloat16)[:, ::2])  # strided input
        with pytest.raises(hspack.HspackError) as e:
            w.append("a", x=torch.zeros(2, 4, dtype=torch.bfloat16))
        assert e.value.kind == "DuplicateKey"
    assert len(hspack.open(tmp_path / "ds")) == 1


@pytest.mark.parametrize(
    "value, integer",
    [(np.int32(3), True), (np.int64(7), True), (np.float32(1.5), False), (np.array(3, dtype=np.int32), True), (torch.tensor(3, dtype=torch.int32), True)],
)
def test_a_single_value_given_for_a_field_names_the_sample_and_field(tmp_path, value, integer):
    """A numpy scalar (NumPy 2 gives it a `.device` of "cpu", a string) or any 0-d value is
    not rows: refused naming the sample and field (and the dtype, where that is wrong), never
    an AttributeError; the writer goes on."""
    schema = [hspack.token_ids(dtype="i32"), hspack.field("x", "i32", [])]
    ids = np.arange(2, dtype=np.int32)
    with hspack.Writer(tmp_path / "ds", schema, durable=False) as w:
        # Token ids of any integer width are converted first; `x` takes i32 only.
        for field, single in (("input_ids", integer), ("x", integer and value.dtype in (np.int32, torch.int32))):
            fields = {"input_ids": ids, "x": ids, field: value}
            with pytest.raises(hspack.HspackError) as e:
                w.append("a", **fields)
            assert (e.value.kind, e.value.key, e.value.field) == ("BadSample", "a", field)
            said = str(e.value)
            assert f"sample `a`, field `{field}`: " + ("a single value (shape ())" if single else "dtype ") in said, said
        w.append("a", input_ids=ids, x=ids)
    assert len(hspack.open(tmp_path / "ds")) == 1


@pytest.mark.parametrize("name", ["../x", "/tmp/x", "a/b", ".hidden", ""])
def test_writer_refuses_a_field_name_that_is_not_a_plain_file_name(tmp_path, name):
    schema = [hspack.token_ids(), hspack.field(name, "f32", [4])]
    with pytest.raises(hspack.HspackError) as e:
        hspack.Writer(tmp_path / "ds", schema, durable=False)
    assert e.value.kind == "BadOption"
    message = str(e.value)
    assert f"field name {json.dumps(name)}" in message, message
    assert "field names must be 1..=128 bytes of ASCII letters, digits" in message, message
    assert "the schema given is not valid" in message and "manifest" not in message, message


def test_an_unknown_writer_option_lists_the_ones_there_are(tmp_path):
    with pytest.raises(hspack.HspackError) as e:
        hspack.Writer(tmp_path / "ds", [hspack.token_ids()], chunk_byte=4096)
    message = str(e.value)
    assert "unknown option `chunk_byte`" in message and "chunk_bytes" in message, message
    assert "quantize" in message and "prequantized" not in message, message


@pytest.mark.parametrize("options, option", [
    ({"prequantized": True}, "options"),  # CudaWriter's own: bytes would be read as codes and scales
    ({"codec": None}, "codec"),
    ({"codec": 3}, "codec"),
    ({"zstd_level": 2**40}, "zstd_level"),
    ({"zstd_level": 19}, "zstd_level"),  # codec none: written uncompressed, the level passed over
    ({"align_log2": 40}, "align_log2"),
    ({"chunk_bytes": -1}, "chunk_bytes"),
    ({"chunk_bytes": True}, "chunk_bytes"),  # a bool is an int to Python: chunks of 1 byte
    ({"shard_samples": False}, "shard_samples"),
    ({"align_log2": True}, "align_log2"),
    ({"durable": "yes"}, "durable"),
    ({"quantize": 123}, "quantize"),
    ({"quantize": ["hidden.2", 7]}, "quantize"),
])
def test_a_writer_option_of_the_wrong_kind_is_named(tmp_path, options, option):
    schema = [hspack.token_ids(), hspack.hidden_state(2, 8)]
    with pytest.raises(hspack.HspackError) as e:
        hspack.Writer(tmp_path / "ds", schema, create=True, **options)
    assert e.value.kind == "BadOption", e.value
    assert str(e.value).startswith(f"option {option}: "), e.value
    assert not (tmp_path / "ds").exists()


def test_a_zstd_level_is_taken_with_a_zstd_codec(tmp_path):
    schema = [hspack.token_ids(), hspack.hidden_state(2, 8)]
    with hspack.Writer(tmp_path / "ds", schema, codec="zstd", zstd_level=19, durable=False) as w:
        w.append("a", input_ids=torch.arange(4, dtype=torch.int32), **{"hidden.2": torch.zeros(4, 8, dtype=torch.bfloat16)})
    assert len(hspack.open(tmp_path / "ds")) == 1
    with pytest.raises(hspack.HspackError, match="option zstd_level: 19 compresses nothing with codec"):
        hspack.Writer(tmp_path / "other", schema, zstd_level=19)
    with pytest.raises(hspack.HspackError, match="option align_log2: 40: must be in 6..=20"):
        hspack.Writer(tmp_path / "other", schema, align_log2=40)


def test_a_quantized_field_of_zero_bytes_is_said_of_the_schema(tmp_path):
    schema = [hspack.token_ids(), hspack.field("z", "bf16", [0], "other")]
    with pytest.raises(hspack.HspackError) as e:
        hspack.Writer(tmp_path / "ds", schema, create=True, quantize="fp8:z")
    message = str(e.value)
    assert "the schema given is not valid" in message and "damaged" not in message, message


def test_a_mistake_in_the_schema_given_is_said_of_the_schema(tmp_path):
    """A field named twice or of zero bytes a row is the caller's schema, not a damaged
    manifest."""
    for schema, said in [
        ([hspack.token_ids(), hspack.token_ids()], "field name `input_ids` appears twice"),
        ([hspack.token_ids(), hspack.hidden_state(2, 0)], "row bytes is 0"),
    ]:
        with pytest.raises(hspack.HspackError) as e:
            hspack.Writer(tmp_path / "ds", schema, durable=False)
        message = str(e.value)
        assert e.value.kind == "BadOption" and said in message, message
        assert "the schema given is not valid" in message and "damaged" not in message, message
    assert not (tmp_path / "ds").exists()


def test_writer_resumes(tmp_path):
    from conftest import eagle_schema

    path = tmp_path / "ds"
    w = hspack.Writer(path, eagle_schema(), durable=False)
    for i in range(3):
        w.append(f"s{i}", **eagle_sample(i))
    w.commit()
    w.append("s3", **eagle_sample(3))
    w._native.abort()  # a crash after the commit: s3 is lost
    assert len(hspack.open(path)) == 3
    with hspack.Writer(path, eagle_schema(), durable=False) as w:
        assert w.contains("s2") and not w.contains("s3")
        for i in range(6):
            if not w.contains(f"s{i}"):
                w.append(f"s{i}", **eagle_sample(i))
    ds = hspack.open(path)
    assert ds.keys() == [f"s{i}" for i in range(6)]
    assert torch.equal(ds[4]["hidden.3"], eagle_sample(4)["hidden.3"])
    with pytest.raises(hspack.HspackError) as e:
        hspack.Writer(path, [hspack.token_ids()], durable=False)
    assert e.value.kind == "SchemaMismatch"


def test_a_writer_dropped_with_samples_since_its_last_commit_warns(tmp_path):
    """Samples appended since the last commit are not in the dataset when the writer is
    dropped unfinished: a warning names them. A finished or aborted writer says nothing."""
    import warnings

    from conftest import eagle_schema

    path = tmp_path / "ds"
    w = hspack.Writer(path, eagle_schema(), durable=False)
    w.append("s0", **eagle_sample(0))
    w.commit()
    for i in (1, 2):
        w.append(f"s{i}", **eagle_sample(i))
    with pytest.warns(UserWarning, match=r"dropped with 2 samples appended since its last commit \(`s1` to `s2`\)"):
        del w
        gc.collect()
    assert hspack.open(path).keys() == ["s0"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        w = hspack.Writer(path, eagle_schema(), durable=False)
        w.append("s1", **eagle_sample(1))
        w.abort()
        del w
        w = hspack.Writer(path, eagle_schema(), durable=False)
        w.append("s1", **eagle_sample(1))
        w.finish()
        del w
        gc.collect()
    assert hspack.open(path).keys() == ["s0", "s1"]


WRITES_INTO_A_READ_TENSOR = """
import sys, hspack
t = hspack.open(sys.argv[1])[0][sys.argv[2]]
t.mul_(2) if sys.argv[3] == "torch" else t.numpy().__setitem__(0, 1)
"""


WRITES_ON_MANY_THREADS = """
import sys, torch, hspack
torch.set_num_threads(8)
t = hspack.open(sys.argv[1])[0]["hidden.3"]
t.mul_(2)
"""


def test_a_write_on_many_threads_at_once_is_explained_once(tmp_path):
    """A large tensor written in place on several threads faults on each: the message comes
    whole, once, before the process dies."""
    import signal
    import subprocess
    import sys

    with hspack.Writer(tmp_path / "big", [hspack.hidden_state(3, 4096)], durable=False) as w:
        w.append("a", **{"hidden.3": torch.ones(2048, 4096, dtype=torch.bfloat16)})
    run = subprocess.run([sys.executable, "-c", WRITES_ON_MANY_THREADS, str(tmp_path / "big")], capture_output=True, text=True, timeout=120)
    assert run.returncode == -signal.SIGSEGV, (run.returncode, run.stderr)
    assert run.stderr.count("hspack: this process wrote into memory") == 1, run.stderr
    assert "The process stops here." in run.stderr, run.stderr


def test_keys_and_lengths_keep_no_shard_mapped(tmp_path):
    """`keys()` and `lengths` (no data read) mapped every shard and kept it: past
    vm.max_map_count shards they failed, and the process died at its next allocation."""
    with hspack.Writer(tmp_path / "many", [hspack.token_ids()], durable=False, shard_samples=1, align_log2=6) as w:
        for i in range(600):
            w.append(f"s{i}", input_ids=torch.arange(i % 5 + 1, dtype=torch.int32))

    def regions():
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)

    ds = hspack.open(tmp_path / "many")
    before = regions()
    assert ds.keys() == [f"s{i}" for i in range(600)]
    assert list(ds.lengths) == [i % 5 + 1 for i in range(600)]
    assert regions() < before + 50, (before, regions())


def test_a_pass_over_the_samples_keeps_at_most_mapped_shards(tmp_path):
    """Reading every sample kept every shard mapped: a pass over more shards than
    vm.max_map_count failed, and the process died at its next allocation. At most
    `mapped_shards` stay (the oldest let go first); a tensor still held keeps its shard, and
    reads the same."""
    with hspack.Writer(tmp_path / "many", [hspack.token_ids()], durable=False, shard_samples=1, align_log2=6) as w:
        for i in range(600):
            w.append(f"s{i}", input_ids=torch.tensor([i], dtype=torch.int32))

    def regions():
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)

    ds = hspack.open(tmp_path / "many", mapped_shards=20)
    first = ds[0]["input_ids"]
    before = regions()
    most = 0
    for i in range(600):
        assert ds[i]["input_ids"].tolist() == [i]
        assert ds.sample(599 - i)["input_ids"].tolist() == [599 - i]
        most = max(most, regions())
    assert most < before + 80, (before, most)
    assert first.tolist() == [0]
    # Carried to the processes the dataset is pickled to.
    import pickle

    assert pickle.loads(pickle.dumps(ds)).mapped_shards == 20
    for bad in (0, -1, True, 1.5, "8"):
        with pytest.raises(hspack.HspackError, match="option mapped_shards"):
            hspack.open(tmp_path / "many", mapped_shards=bad)


WRITES_INTO_THE_LAST_OF_MANY_SHARDS = """
import sys, hspack
ds = hspack.open(sys.argv[1])
held = [ds[i]["input_ids"] for i in range(len(ds))]
held[-1].mul_(2)
"""


def test_a_write_past_4096_shards_mapped_is_explained_too(tmp_path):
    """The mappings a write is checked against were 4096: past as many shards mapped, a
    write into one died unexplained."""
    import signal
    import subprocess
    import sys

    with hspack.Writer(tmp_path / "many", [hspack.token_ids()], durable=False, shard_samples=1, align_log2=6) as w:
        for i in range(4200):
            w.append(f"s{i}", input_ids=torch.tensor([i], dtype=torch.int32))
    run = subprocess.run([sys.executable, "-c", WRITES_INTO_THE_LAST_OF_MANY_SHARDS, str(tmp_path / "many")], capture_output=True, text=True, timeout=300)
    assert run.returncode == -signal.SIGSEGV, (run.returncode, run.stderr)
    assert "hspack: this process wrote into memory that maps a dataset's file read-only" in run.stderr, run.stderr
    assert "shard-004199" in run.stderr, run.stderr


@pytest.mark.parametrize("how", ["torch", "numpy of torch"])
def test_a_write_into_a_mapped_tensor_is_explained_before_the_process_dies(eagle_path, how):
    """Torch has no read-only tensors: a write into one over a mapped shard kills the process
    (SIGSEGV). Standard error says why, naming the file and what to do, and the process
    still dies of the signal (Python's faulthandler, a core dump, as before)."""
    import signal
    import subprocess
    import sys

    field = "hidden.3" if how == "torch" else "input_ids"  # numpy has no bf16
    run = subprocess.run([sys.executable, "-c", WRITES_INTO_A_READ_TENSOR, eagle_path, field, how.split()[0]], capture_output=True, text=True, timeout=120)
    assert run.returncode == -signal.SIGSEGV, (run.returncode, run.stderr)
    said = run.stderr
    assert "hspack: this process wrote into memory that maps a dataset's file read-only" in said, said
    assert eagle_path in said and ".hsp" in said, said
    assert "t.clone()" in said and "copy=True" in said, said
    # A fault of another cause is not explained as one.
    other = subprocess.run([sys.executable, "-c", "import ctypes, hspack; ctypes.string_at(8)"], capture_output=True, text=True, timeout=120)
    assert other.returncode == -signal.SIGSEGV, (other.returncode, other.stderr)
    assert "hspack:" not in other.stderr, other.stderr


READS_A_SHARD_CUT_SHORT = """
import os, sys, hspack
ds = hspack.open(sys.argv[1])
t = ds[len(ds) - 1]["hidden.3"]  # mapped, near the end of its shard
shard = os.path.join(sys.argv[1], ds.shards[-1]["file"])
with open(shard, "r+b") as f:  # what cp or rsync --inplace over the dataset does
    f.truncate(4096)
print(float(t.float().sum()))
"""


def test_a_read_of_a_shard_cut_short_in_place_is_explained_before_the_process_dies(tmp_path, eagle_path):
    """Another program cutting a shard short in place while it is mapped (a copy over the
    dataset in use) kills a reader with SIGBUS, which said nothing: standard error names the
    file and what happened, and the process still dies of the signal."""
    import shutil
    import signal
    import subprocess
    import sys

    path = str(tmp_path / "ds")
    shutil.copytree(eagle_path, path)
    run = subprocess.run([sys.executable, "-c", READS_A_SHARD_CUT_SHORT, path], capture_output=True, text=True, timeout=120)
    assert run.returncode == -signal.SIGBUS, (run.returncode, run.stderr)
    said = run.stderr
    assert "hspack: this process read memory that maps a dataset's file (" in said and path in said, said
    assert "past the file's end" in said and "hspack cp" in said, said


READS_IN_WORKERS_A_SHARD_CUT_SHORT = """
import os, sys, torch
from hspack.torch import HspackDataset
ds = HspackDataset(sys.argv[1], view="eagle3")
last = len(ds) - 1
ds[last]  # the trainer maps the last shard before its workers fork
shard = os.path.join(sys.argv[1], ds.hspack.shards[-1]["file"])
with open(shard, "r+b") as f:  # what cp or rsync --inplace over the dataset does
    f.truncate(4096)
loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, sampler=[last] * 4)
try:
    for b in loader:
        print(float(b["hidden_state"].float().sum()))
except RuntimeError as e:
    print("stopped:", e)
"""


def test_a_worker_reading_a_shard_cut_short_names_the_file_not_shared_memory(tmp_path, eagle_path):
    """A DataLoader worker installs its own SIGBUS handler, which blamed shared memory and
    named no file for a shard cut short after the trainer mapped it: hspack's explanation is
    put back in front of it in each worker, and standard error names the file."""
    import shutil
    import subprocess
    import sys

    path = str(tmp_path / "ds")
    shutil.copytree(eagle_path, path)
    run = subprocess.run([sys.executable, "-c", READS_IN_WORKERS_A_SHARD_CUT_SHORT, path], capture_output=True, text=True, timeout=120)
    said = run.stderr + run.stdout
    assert "stopped:" in run.stdout or run.returncode != 0, said
    assert "hspack: this process read memory that maps a dataset's file (" in said and path in said, said
    assert "past the file's end" in said, said


def test_context_manager_does_not_commit_on_error(tmp_path):
    from conftest import eagle_schema

    with pytest.raises(RuntimeError):
        with hspack.Writer(tmp_path / "ds", eagle_schema(), durable=False) as w:
            w.append("s0", **eagle_sample(0))
            raise RuntimeError("boom")
    assert len(hspack.open(tmp_path / "ds")) == 0


def test_verify_reports_intact(eagle_path):
    r = hspack.verify(eagle_path)
    assert r["ok"] and r["samples"] == 37 and r["shards"] == 3 and r["problems"] == []
    assert hspack.verify(eagle_path, quick=True)["bytes_hashed"] == 0


def test_the_samples_table_is_current_after_every_commit(tmp_path):
    w = hspack.Writer(tmp_path / "ds", [hspack.token_ids()], durable=False)
    for c in range(3):
        w.append(f"k{c}", input_ids=torch.full((c + 1,), c, dtype=torch.int32))
        w.commit()
        ds = hspack.open(tmp_path / "ds")
        files = ds.table_files()
        # One part per commit, in ordinal order, each listed by the manifest's segments.
        assert len(files) == c + 1 and all(os.path.exists(f) for f in files)
        assert [s["samples"] for s in ds.shards] == [1] * (c + 1)
        assert ds.manifest["version"] == 4 and "shards" not in ds.manifest
    w.finish()
    pyarrow = pytest.importorskip("pyarrow.parquet")
    rows = [r for f in hspack.open(tmp_path / "ds").table_files() for r in pyarrow.read_table(f).to_pylist()]
    assert [(r["key"], r["ordinal"], r["tokens"]) for r in rows] == [("k0", 0, 1), ("k1", 1, 2), ("k2", 2, 3)]


@pytest.mark.parametrize("codec", ["none", "zstd-bytegroup"])
def test_read_concat_joins_rows_and_reuses_memory_without_leaking_old_bytes(tmp_path, codec):
    """`read_concat` is the fields side by side, row by row; a later result reuses the memory of
    an earlier one the process dropped, and shows none of its bytes."""
    hidden = 512
    fields = [hspack.hidden_state(layer, hidden) for layer in (1, 2, 3)]
    lengths = [700, 400, 650]  # each result over 1 MiB: the sizes that are reused
    with hspack.Writer(tmp_path / "ds", fields, codec=codec, chunk_bytes=256 << 10, durable=False) as w:
        for i, t in enumerate(lengths):
            w.append(f"s{i}", **{f["name"]: random_bits(torch.bfloat16, (t, hidden), 10 * i + j) for j, f in enumerate(fields)})
    ds = hspack.Dataset(tmp_path / "ds")
    names = [f["name"] for f in fields][::-1]  # any order
    first = ds.read_concat(0, names)
    address = first.data_ptr()
    del first
    gc.collect()
    for i, t in enumerate(lengths):
        parts = ds.read(i, names)
        want = torch.cat([parts[n] for n in names], dim=-1)
        got = ds.read_concat(i, names)
        assert got.shape == (t, 3 * hidden) and torch.equal(got.view(torch.int16), want.view(torch.int16)), i
        if i == 1:
            assert got.data_ptr() == address, "the dropped buffer of sample 0 was reused"
        rows = ds.read_concat(i, names, rows=(5, 9))
        assert torch.equal(rows.view(torch.int16), want[5:9].view(torch.int16))
        del got
    with pytest.raises(hspack.HspackError, match="fields"):
        ds.read_concat(0, [])


@pytest.mark.parametrize("capture, said", [
    ({"modl": "m", "model": "m", "num_layers": 4, "hidden_size": 8, "dtype": "bf16"}, "unknown key(s) modl; the keys are model, revision"),
    ({"model": "m", "num_layers": 4, "hidden_size": 8}, "missing dtype; it needs model, num_layers, hidden_size, dtype"),
    (["m"], "a list; give a dict with model"),
])
def test_capture_metadata_misspelled_or_missing_a_key_is_named(tmp_path, capture, said):
    """A misspelled key of `capture=` was dropped unsaid; a missing one was said as `option
    schema: missing field ... at line 1 column 331`, of JSON the caller never wrote."""
    with pytest.raises(hspack.HspackError) as e:
        hspack.Writer(tmp_path / "ds", [hspack.token_ids(), hspack.hidden_state(2, 8)], capture)
    assert e.value.kind == "BadOption" and e.value.option == "capture", e.value
    assert str(e.value).startswith("option capture: ") and said in str(e.value), e.value
    assert not (tmp_path / "ds").exists()


def test_a_resume_without_the_datasets_capture_metadata_says_so(tmp_path):
    """Reopened with no capture metadata, a dataset that has some was refused as `capture
    `config_hash`: null here, null given` with "write to a new folder": it says what is
    missing and where to take it from, which then resumes."""
    path = tmp_path / "ds"
    write_eagle(path, 3)
    with pytest.raises(hspack.HspackError, match=r"capture metadata here, none given: .*capture=hspack.open\(PATH\).capture"):
        hspack.Writer(path, eagle_schema())
    other = {**hspack.open(path).capture, "model": "other/model"}
    with pytest.raises(hspack.HspackError, match='capture `model`: "test/model" here, "other/model" given'):
        hspack.Writer(path, eagle_schema(), other)
    with hspack.Writer(path, eagle_schema(), hspack.open(path).capture, durable=False) as w:
        w.append("s9999", **eagle_sample(9999))
    assert len(hspack.open(path)) == 4


def test_one_or_no_token_tensors_of_any_stride_are_written(tmp_path):
    """A tensor of one or no elements counts as contiguous whatever its stride (a column of a
    one-row batch, an expanded scalar): viewing its bytes failed with torch's RuntimeError,
    naming neither sample nor field."""
    path = tmp_path / "ds"
    schema = [hspack.token_ids(), hspack.loss_mask(), hspack.field("logprob", "f32")]
    batch = torch.arange(6, dtype=torch.int32).view(3, 2)
    with hspack.Writer(path, schema, durable=False) as w:
        for n, key in ((1, "one"), (0, "none")):
            w.append(key, input_ids=batch[:n, 1], loss_mask=torch.tensor(1, dtype=torch.uint8).expand(n), logprob=torch.tensor(-1.5).expand(n))
    ds = hspack.open(path)
    assert ds.get("one")["input_ids"].tolist() == [1] and ds.get("one")["logprob"].tolist() == [-1.5]
    assert ds.get("one")["loss_mask"].tolist() == [1] and len(ds.get("none")["input_ids"]) == 0


def test_a_numpy_array_of_another_dtype_is_told_how_to_convert(tmp_path):
    schema = [hspack.token_ids(), hspack.field("logprob", "f32"), hspack.hidden_state(1, 4)]
    ids = np.arange(3, dtype=np.int32)
    good = {"logprob": np.zeros(3, np.float32), "hidden.1": torch.zeros(3, 4, dtype=torch.bfloat16)}
    with hspack.Writer(tmp_path / "ds", schema, durable=False) as w:
        for name, bad, said in (
            ("logprob", np.zeros(3, ">f4"), "(the same type, big-endian); convert it: .astype('float32')"),
            ("logprob", np.zeros(3, np.float64), "convert it: .astype('float32')"),
            ("hidden.1", np.zeros((3, 4), np.float32), "numpy has no bf16"),
        ):
            with pytest.raises(hspack.HspackError, match=re.escape(said)) as e:
                w.append("s", input_ids=ids, **{**good, name: bad})
            assert e.value.field == name and e.value.key == "s"
        w.append("s", input_ids=ids, **good)


def test_schema_helpers_refuse_sizes_that_are_no_sizes_naming_them():
    """A negative width was refused when the writer opened, as `option schema: invalid value:
    integer -4096, expected u64 at line 1 column 148` (of JSON the user never wrote)."""
    for make, option in (
        (lambda: hspack.hidden_state(2, -4096), "width"),
        (lambda: hspack.hidden_state(-1, 8), "layer"),
        (lambda: hspack.hidden_states([2, -3], 8), "layers"),
        (lambda: hspack.hidden_states([2, 3], -8), "width"),
        (lambda: hspack.field("x", "f32", [4, -1]), "shape"),
        (lambda: hspack.field("x", "f32", [2.5]), "shape"),
    ):
        with pytest.raises(hspack.HspackError, match=f"option {option}: .* must be an int of") as e:
            make()
        assert e.value.option == option

