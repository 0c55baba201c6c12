"""The capture file of the golden store (format-spec/golden/store-v1/captures), read by the
spec-only store reader and checked against the samples of the golden `stacked` dataset as that
reader reads them (FORMAT.md §11.7); and faults planted in copies, which it must refuse.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import blake3
import pytest

import store_spec_reader as store_spec
from hspack_spec_reader import SpecError, read_dataset
from store_spec_reader import Store

GOLDEN = Path(__file__).resolve().parents[2] / "format-spec" / "golden"
STORE = GOLDEN / "store-v1"
CAPTURES = STORE / "captures"

# The golden generator's capture config (format-spec/golden.rs, `capture_config`); the field
# names are the `stacked` schema's, read from its manifest.
MODEL = "golden/model"
REVISION = ""  # none
CONFIG_HASH = "0123abcd"
ENGINE = "transformers"
DETERMINISTIC = True
DTYPE = "bf16"
LAYERS = [2, 30, 58, 61]


def b3(data: bytes) -> bytes:
    return blake3.blake3(data).digest()


def capture_paths(root: Path = STORE) -> list:
    return sorted((root / "captures").iterdir())


@pytest.fixture(scope="module")
def store() -> Store:
    return Store(STORE)


@pytest.fixture(scope="module")
def stacked(store, tmp_path_factory):
    """The `stacked` dataset of the golden store, rebuilt from its blobs and read by the
    plain-dataset spec reader (every sample, field by field, decoded bytes)."""
    root = store.materialize("stacked", tmp_path_factory.mktemp("stacked"))
    return read_dataset(root)


@pytest.fixture(scope="module")
def stacked_fields(store) -> list:
    """The `stacked` schema's field names in order, from its manifest in the store."""
    m = json.loads(store.rebuild("stacked")["manifest.json"])
    return [f["name"] for f in m["schema"]["fields"]]


def sample_bytes(ds, s) -> list:
    """(name, decoded bytes) of every field of a sample, in schema order."""
    out = []
    for fs in ds.fields:
        data = s.fields[fs.name].tobytes()
        assert len(data) == s.rows * fs.row_bytes
        out.append((fs.name, data))
    return out


def key_of(fields: list, s) -> bytes:
    tokens = [int(t) for t in s.fields["input_ids"].astype("<i8").reshape(-1)]
    return store_spec.capture_key(
        MODEL, REVISION, CONFIG_HASH, ENGINE, DETERMINISTIC, DTYPE, LAYERS, fields, tokens, None
    )


# ------------------------------------------------------------------ the golden capture file


def test_golden_store_has_one_capture_file_naming_stacked(store, stacked, stacked_fields):
    paths = capture_paths()
    assert len(paths) == 1
    assert store_spec.CAPTURE_FILE.fullmatch(paths[0].name)
    cap = store_spec.read_capture(paths[0])
    assert cap.dataset == "stacked"
    assert cap.dataset in store.dataset_names()
    assert [c.file for c in store_spec.read_captures(STORE)] == [paths[0].name]
    # One entry per distinct capture key of the dataset's samples.
    keys = {key_of(stacked_fields, s) for s in stacked.samples()}
    assert len(cap.entries) == len(keys)
    assert {e.key for e in cap.entries} == keys


def test_golden_capture_file_layout_by_hand():
    """§11.7's table read with struct, apart from the reader: lengths, name and trailer."""
    data = capture_paths()[0].read_bytes()
    magic, version, z0, L, n, z1 = struct.unpack_from("<8sHHIQQ", data, 0)
    assert (magic, version, z0, z1) == (b"HSPKCAPT", 1, 0, 0)
    assert data[32 : 32 + L] == b"stacked" and data[32 + L : 160] == bytes(128 - L)
    assert len(data) == 160 + 72 * n + 32
    assert data[-32:] == b3(data[:-32])
    assert capture_paths()[0].name == f"{b3(data[:-32])[:16].hex()}.capt"
    assert store_spec.capture_file_name(data) == capture_paths()[0].name
    keys = [data[160 + 72 * i : 192 + 72 * i] for i in range(n)]
    assert keys == sorted(keys) and len(set(keys)) == n


def test_golden_capture_entries_match_the_stacked_samples(stacked, stacked_fields):
    """For every sample: the digest of its fields (schema order, decoded bytes) is the digest
    of the entry with its ordinal, and its capture key (the golden config, its `input_ids` as
    i64, no loss mask) is that entry's key."""
    cap = store_spec.read_capture(capture_paths()[0])
    by_ordinal = cap.by_ordinal()
    assert len(by_ordinal) == len(cap.entries)  # each ordinal once
    samples = stacked.samples()
    assert samples
    assert [fs.name for fs in stacked.fields] == stacked_fields
    assert "input_ids" in stacked_fields
    for s in samples:
        assert s.ordinal in by_ordinal, f"no entry for ordinal {s.ordinal} ({s.key})"
        e = by_ordinal[s.ordinal]
        assert store_spec.sample_digest(sample_bytes(stacked, s)) == e.digest, s.key
        assert key_of(stacked_fields, s) == e.key, s.key
    # Every entry names a sample of the dataset.
    assert set(by_ordinal) <= {s.ordinal for s in samples}


def test_capture_key_and_sample_digest_written_out():
    """The two derivations of §11.7 spelled out once more in the test, on small inputs."""

    def s(x: str) -> bytes:
        b = x.encode()
        return struct.pack("<I", len(b)) + b

    m = b"".join(s(x) for x in ["m", "", "h", "sglang", "0", "f16", "1,2", "a,b"])
    m += struct.pack("<Q", 2) + struct.pack("<qq", 7, -1)
    m += struct.pack("<Q", 2) + struct.pack("<qq", 0, 1)
    want = blake3.blake3(m, derive_key_context="hspack 2026 capture key v1").digest()
    got = store_spec.capture_key("m", None, "h", "sglang", False, "f16", [1, 2], ["a", "b"],
                                 [7, -1], [0, 1])
    assert got == want
    # No loss mask is a zero length; it differs from a mask of zeros.
    no_mask = store_spec.capture_key("m", "", "h", "sglang", False, "f16", [1, 2], ["a", "b"],
                                     [7, -1])
    m0 = m[: -(8 + 16)] + struct.pack("<Q", 0)
    assert no_mask == blake3.blake3(m0, derive_key_context="hspack 2026 capture key v1").digest()
    assert no_mask != got

    d = s("a") + struct.pack("<Q", 3) + b"xyz" + s("bb") + struct.pack("<Q", 0)
    want = blake3.blake3(d, derive_key_context="hspack 2026 sample digest v1").digest()
    assert store_spec.sample_digest([("a", b"xyz"), ("bb", b"")]) == want
    assert store_spec.sample_digest([("bb", b""), ("a", b"xyz")]) != want  # order counts


# ------------------------------------------------------------------ planted faults


def golden_capture() -> tuple:
    path = capture_paths()[0]
    return path.name, bytearray(path.read_bytes())


def rehashed(data: bytearray) -> tuple:
    """The bytes with their trailer recomputed and the name they then get (§11.7), so only the
    planted fault is left."""
    body = bytes(data[:-32])
    h = b3(body)
    return f"{h[:16].hex()}.capt", body + h


def flip_positions(data: bytes) -> dict:
    n = struct.unpack_from("<Q", data, 16)[0]
    assert n >= 2
    return {
        "magic": 0,
        "magic-end": 7,
        "version": 8,
        "reserved-10": 10,
        "name-length": 12,
        "count": 16,
        "reserved-24": 24,
        "name": 32,
        "name-padding": 32 + 127,
        "entry-key": 160,
        "entry-digest": 160 + 40,
        "entry-ordinal": 160 + 64,
        "last-entry": 160 + 72 * n - 1,
        "trailer": len(data) - 32,
        "trailer-end": len(data) - 1,
    }


@pytest.mark.parametrize("where", sorted(flip_positions(golden_capture()[1])))
@pytest.mark.parametrize("bit", [0x01, 0x80])
def test_flipped_byte_in_the_capture_file_is_refused(where, bit):
    name, data = golden_capture()
    store_spec.parse_capture(bytes(data), name)  # the untouched file parses
    data[flip_positions(data)[where]] ^= bit
    with pytest.raises(SpecError, match=r"§11\.7"):
        store_spec.parse_capture(bytes(data), name)


@pytest.mark.parametrize("cut", [1, 31, 32, 72, 100, 200])
def test_truncated_capture_file_is_refused(cut):
    name, data = golden_capture()
    assert cut < len(data)
    with pytest.raises(SpecError, match=r"§11\.7"):
        store_spec.parse_capture(bytes(data[:-cut]), name)
    # Even renamed after its truncated bytes, the length disagrees with the count.
    if len(data) - cut >= 192:
        with pytest.raises(SpecError, match=r"160 \+ 72n \+ 32"):
            store_spec.parse_capture(bytes(data[:-cut]), store_spec.capture_file_name(data[:-cut]))


def test_empty_and_short_capture_files_are_refused():
    for data in (b"", b"HSPKCAPT", bytes(191)):
        with pytest.raises(SpecError, match=r"§11\.7"):
            store_spec.parse_capture(data, "00000000000000000000000000000000.capt")


def test_capture_file_renamed_is_refused():
    name, data = golden_capture()
    other = f"{b3(bytes(data))[:16].hex()}.capt"  # the BLAKE3 of the whole file: not the rule
    assert other != name
    with pytest.raises(SpecError, match=rf"not named {name}"):
        store_spec.parse_capture(bytes(data), other)


def rehashed_fault(offset: int, value: bytes) -> tuple:
    name, data = golden_capture()
    data[offset : offset + len(value)] = value
    return rehashed(data)


@pytest.mark.parametrize(
    "offset,value,match",
    [
        (0, b"HSPKCAPX", "wrong capture magic"),
        (8, struct.pack("<H", 2), "version 2 is not 1"),
        (10, b"\x01", "not zero"),
        (24, b"\x00\x00\x00\x00\x00\x00\x00\x01", "not zero"),
        (12, struct.pack("<I", 8), "breaks the rule"),  # a padding byte read as the name
        (12, struct.pack("<I", 0), "name length 0"),
        (12, struct.pack("<I", 129), "name length 129"),
        (32 + 100, b"\x01", "not zero"),
        (32, b".", "breaks the rule"),
        (16, struct.pack("<Q", 8), r"160 \+ 72n \+ 32"),
        (16, struct.pack("<Q", 10), r"160 \+ 72n \+ 32"),
        (16, struct.pack("<Q", 1 << 63), r"160 \+ 72n \+ 32"),
    ],
)
def test_capture_fault_with_its_trailer_and_name_rewritten_is_refused(offset, value, match):
    """Faults a writer's hash would not catch: the trailer and name recomputed after them."""
    name, data = rehashed_fault(offset, value)
    with pytest.raises(SpecError, match=match):
        store_spec.parse_capture(data, name)


def test_capture_entries_out_of_order_or_twice_are_refused():
    _, data = golden_capture()
    a, b = bytes(data[160:232]), bytes(data[232:304])
    assert a[:32] < b[:32]
    swapped = bytearray(data)
    swapped[160:232], swapped[232:304] = b, a
    name, fixed = rehashed(swapped)
    with pytest.raises(SpecError, match="entry 1: entries not sorted strictly by key"):
        store_spec.parse_capture(fixed, name)
    twice = bytearray(data)
    twice[232:304] = a
    name, fixed = rehashed(twice)
    with pytest.raises(SpecError, match="entry 1: entries not sorted strictly by key"):
        store_spec.parse_capture(fixed, name)


def test_rehashed_untouched_capture_file_still_parses():
    """The helper rehashed() changes nothing by itself: the planted faults are the only ones."""
    name, data = golden_capture()
    assert rehashed(data) == (name, bytes(data))


def test_capture_file_in_a_store_copy(tmp_path):
    """In a copy of the store, a capture file under a name not `<32 hex>.capt` is refused by
    read_captures, and one whose trailer is broken is refused by name."""
    root = tmp_path / "store"
    shutil.copytree(STORE, root)
    assert [c.dataset for c in store_spec.read_captures(root)] == ["stacked"]
    path = capture_paths(root)[0]
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(SpecError, match=rf"captures/{path.name}: trailing BLAKE3 differs"):
        store_spec.read_captures(root)
    path.rename(root / "captures" / "stacked.capt")
    with pytest.raises(SpecError, match="not <32 hex>.capt"):
        store_spec.read_captures(root)
