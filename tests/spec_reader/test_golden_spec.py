"""The golden vectors, read by the spec-only reader and compared value by value with the data
they were generated from; and spec deviations planted in copies, which the reader must reject.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import blake3
import numpy as np
import pytest
import zstandard

import golden_gen as gen
import hspack_spec_reader as spec
from hspack_spec_reader import SpecError, read_dataset

GOLDEN = Path(__file__).resolve().parents[2] / "format-spec" / "golden"

DATASETS = {
    "v1/none": (gen.v1_schema(), 0, b"hspack-golden-v1", 1),
    "v1/zstd": (gen.v1_schema(), 1, b"hspack-golden-v1", 1),
    "v1/zstd-bytegroup": (gen.v1_schema(), 2, b"hspack-golden-v1", 1),
    "v2/stacked": (gen.v2_schema(), 0, b"hspack-golden-v2", 2),
    "v3/leased": (gen.v1_schema(), 0, b"hspack-golden-v3", 3),
}

EXPECTED = {
    "v1": gen.samples(gen.v1_schema()),
    "v2": gen.samples(gen.v2_schema()),
    "v3": gen.samples(gen.v1_schema()),
}


def mismatches(ds: spec.Dataset, expected: list) -> list:
    """(key, field) of every decoded field whose bytes differ from the generated ones."""
    got = ds.samples()
    assert [(s.key, s.rows) for s in got] == [(k, r) for k, r, _ in expected]
    bad = []
    for s, (key, _, fields) in zip(got, expected):
        assert list(s.fields) == list(fields)
        for name, want in fields.items():
            if s.fields[name].tobytes() != want:
                bad.append((key, name))
    return bad


def test_splitmix64_reference_values():
    """The port gives the published SplitMix64 outputs for seed 1234567."""
    rng = gen.SplitMix64(1234567)
    assert [rng.next_u64() for _ in range(3)] == [
        6457827717110365317,
        3203168211198807973,
        9817491932198370423,
    ]


@pytest.mark.parametrize("name", list(DATASETS))
def test_golden_reads_and_every_value_matches(name):
    schema, codec, dataset_id, version = DATASETS[name]
    ds = read_dataset(GOLDEN / name)
    m = ds.manifest
    assert m["version"] == version
    assert bytes.fromhex(m["dataset_id"]) == dataset_id
    assert [(f.name, spec.DTYPES[f.dtype][0], f.shape, f.role) for f in ds.fields] == schema

    expected = EXPECTED[name.split("/")[0]]
    assert mismatches(ds, expected) == []

    # Shards of 5 samples, ordinals 0.., every chunk in the dataset's codec.
    sizes = [len(sh.samples) for sh in ds.shards]
    assert sizes == [gen.SHARD_SAMPLES, len(gen.LENGTHS) - gen.SHARD_SAMPLES]
    assert [s.ordinal for s in ds.samples()] == list(range(len(gen.LENGTHS)))
    assert all(c.codec == codec for sh in ds.shards for c in sh.chunks)

    row_total = sum(gen.row_bytes(d, shape) for _, d, shape, _ in schema)
    for s, (_, rows, fields) in zip(ds.samples(), expected):
        assert s.raw_bytes == rows * row_total
        mask = next((f for f in schema if f[3]["kind"] == "loss_mask"), None)
        if mask is None:
            assert s.loss_rows == (1 << 64) - 1
        else:
            per_row = np.frombuffer(fields[mask[0]], dtype=np.uint8)
            per_row = per_row.reshape(rows, gen.row_bytes(mask[1], mask[2]))
            assert s.loss_rows == int(per_row.any(axis=1).sum())


def test_typed_values_of_one_sample():
    """Decoded arrays carry the field's dtype and shape, little-endian."""
    s = read_dataset(GOLDEN / "v1/none").samples()[2]
    raw = EXPECTED["v1"][2][2]
    assert s.fields["i64"].shape == (3, 3)
    assert s.fields["i64"].reshape(-1).tolist() == list(struct.unpack("<9q", raw["i64"]))
    assert s.fields["i16"].reshape(-1).tolist() == list(struct.unpack("<9h", raw["i16"]))
    assert s.fields["f32"].dtype == np.dtype("<f4")
    assert s.fields["f32"].view("<u4").reshape(-1).tolist() == list(
        struct.unpack("<9I", raw["f32"])
    )
    assert s.fields["bf16"].reshape(-1).tolist() == list(struct.unpack("<9H", raw["bf16"]))


def test_byte_group_inverse():
    """§4: bytes 0 of every element, then bytes 1; a trailing partial element stays last."""
    assert spec.ungroup(b"\x02\x04\x01\x03", 2) == b"\x02\x01\x04\x03"
    assert spec.ungroup(b"\x02\x04\x01\x03\x09", 2) == b"\x02\x01\x04\x03\x09"
    assert spec.ungroup(b"abcdefgh", 4) == b"acegbdfh"


@pytest.mark.parametrize(
    "stored, match",
    [
        (zstandard.ZstdCompressor().compress(bytes(7)), "declares 7 bytes, not 6"),
        (zstandard.ZstdCompressor().compress(bytes(5)), "declares 5 bytes, not 6"),
        (zstandard.ZstdCompressor(write_content_size=False).compress(bytes(7)), "does not decode"),
        (zstandard.ZstdCompressor(write_content_size=False).compress(bytes(5)), "decodes to 5"),
        (zstandard.ZstdCompressor().compress(bytes(6)) + b"\0", "does not decode"),
        (b"not a frame", "not a zstd frame"),
    ],
    ids=["size-7", "size-5", "long", "short", "trailing-byte", "garbage"],
)
def test_zstd_frame_must_decode_to_raw_len(stored, match):
    """§4: one frame that decodes to exactly raw_len (6 here), nothing after it."""
    with pytest.raises(SpecError, match=match):
        spec.decode_payload(1, stored, 6, 1, "chunk")


# ------------------------------------------------------------------ planted deviations


def b3(data: bytes) -> bytes:
    return blake3.blake3(data).digest()


def seal(buf: bytearray, start: int, covered: int) -> None:
    """Writes the check word of buf[start:start+covered] after it."""
    buf[start + covered : start + covered + 8] = b3(bytes(buf[start : start + covered]))[:8]


class Copy:
    """A writable copy of a golden dataset with helpers that keep every hash valid."""

    def __init__(self, tmp_path: Path, name: str) -> None:
        self.root = tmp_path / name.replace("/", "-")
        shutil.copytree(GOLDEN / name, self.root)
        self.manifest = json.loads((self.root / "manifest.json").read_text())

    def shard(self, seq: int) -> bytearray:
        return bytearray((self.root / self.manifest["shards"][seq]["file"]).read_bytes())

    def save(self, seq: int, data: bytearray) -> None:
        (self.root / self.manifest["shards"][seq]["file"]).write_bytes(bytes(data))

    def save_manifest(self) -> None:
        (self.root / "manifest.json").write_text(json.dumps(self.manifest, indent=2))

    @staticmethod
    def index(data: bytearray) -> tuple:
        """(index_offset, S, E, C) of a shard."""
        foot = len(data) - 128
        off = struct.unpack_from("<Q", data, foot + 32)[0]
        s, e, c = struct.unpack_from("<QQQ", data, off + 8)
        return off, s, e, c

    def reseal_index(self, seq: int, data: bytearray) -> None:
        """After an index edit: the footer's index hash and check, and the manifest's hash."""
        foot = len(data) - 128
        off, length = struct.unpack_from("<QQ", data, foot + 32)
        h = b3(bytes(data[off : off + length]))
        data[foot + 48 : foot + 80] = h
        seal(data, foot, 112)
        self.manifest["shards"][seq]["index_blake3"] = h.hex()
        self.save(seq, data)
        self.save_manifest()

    def chunk_entry(self, data: bytearray, c: int) -> int:
        off, s, e, _ = self.index(data)
        return off + 64 + 64 * s + 32 * e + 96 * c


def test_untouched_copy_reads(tmp_path):
    """The helpers' baseline: a copy reads as the original does."""
    read_dataset(Copy(tmp_path, "v1/none").root)


def test_header_reserved_byte_resealed(tmp_path):
    d = Copy(tmp_path, "v1/none")
    data = d.shard(0)
    data[11] = 1
    seal(data, 0, 120)
    d.save(0, data)
    with pytest.raises(SpecError, match=r"§2.1 .* header: reserved bytes 11..12"):
        read_dataset(d.root)


def test_header_wrong_alignment_resealed(tmp_path):
    """align_log2 6 -> 7: some codec-none payloads no longer sit at a multiple of 128."""
    d = Copy(tmp_path, "v1/none")
    data = d.shard(1)
    data[10] = 7
    seal(data, 0, 120)
    d.save(1, data)
    with pytest.raises(SpecError, match="codec none payload not aligned"):
        read_dataset(d.root)


def test_header_alignment_out_of_range_resealed(tmp_path):
    d = Copy(tmp_path, "v1/zstd")
    data = d.shard(0)
    data[10] = 5
    seal(data, 0, 120)
    d.save(0, data)
    with pytest.raises(SpecError, match=r"align_log2 5 not in 6..=20"):
        read_dataset(d.root)


def test_nonzero_padding(tmp_path):
    """Padding is covered by no hash; the reader must still see it is not zero."""
    d = Copy(tmp_path, "v1/none")
    data = d.shard(0)
    first = struct.unpack_from("<Q", data, d.chunk_entry(data, 1))[0]
    assert data[first - 1] == 0
    data[first - 1] = 0xA5
    d.save(0, data)
    with pytest.raises(SpecError, match="padding before it is not zero"):
        read_dataset(d.root)


def test_padding_before_a_zstd_chunk(tmp_path):
    """Moves the last zstd chunk 64 bytes on, with every offset and hash made right."""
    d = Copy(tmp_path, "v1/zstd")
    data = d.shard(0)
    off, s, e, c = d.index(data)
    entry = d.chunk_entry(data, c - 1)
    start = struct.unpack_from("<Q", data, entry)[0]
    gap = 64
    data[start:start] = bytes(gap)
    off += gap
    entry += gap
    struct.pack_into("<Q", data, entry, start + gap)
    foot = len(data) - 128
    struct.pack_into("<Q", data, foot + 32, off)
    struct.pack_into("<Q", data, foot + 104, len(data))
    d.manifest["shards"][0]["bytes"] = len(data)
    d.reseal_index(0, data)
    with pytest.raises(SpecError, match="a zstd chunk is padded"):
        read_dataset(d.root)


def test_chunk_header_reserved_resealed(tmp_path):
    d = Copy(tmp_path, "v1/zstd-bytegroup")
    data = d.shard(1)
    at = struct.unpack_from("<Q", data, d.chunk_entry(data, 3))[0]
    data[at + 100] = 1
    seal(data, at, 120)
    d.save(1, data)
    with pytest.raises(SpecError, match=r"chunk 3 header: reserved bytes 96..120"):
        read_dataset(d.root)


def test_chunk_header_disagrees_with_entry_resealed(tmp_path):
    d = Copy(tmp_path, "v1/none")
    data = d.shard(1)
    at = struct.unpack_from("<Q", data, d.chunk_entry(data, 5))[0]
    struct.pack_into("<Q", data, at + 32, 1)  # row_start
    seal(data, at, 120)
    d.save(1, data)
    with pytest.raises(SpecError, match="header disagrees with its chunk entry"):
        read_dataset(d.root)


def test_sample_entry_reserved_rehashed(tmp_path):
    d = Copy(tmp_path, "v1/zstd")
    data = d.shard(0)
    off = d.index(data)[0]
    data[off + 64 + 64 * 2 + 60] = 1  # sample 2, reserved
    d.reseal_index(0, data)
    with pytest.raises(SpecError, match=r"sample 2 entry: reserved bytes 56..64"):
        read_dataset(d.root)


def test_extents_out_of_order_rehashed(tmp_path):
    """Two extents of one sample swapped: every row is still covered once."""
    d = Copy(tmp_path, "v1/none")
    data = d.shard(1)
    off, s, _, _ = d.index(data)
    x = off + 64 + 64 * s
    data[x : x + 64] = data[x + 32 : x + 64] + data[x : x + 32]
    d.reseal_index(1, data)
    with pytest.raises(SpecError, match=r"not sorted by \(field, row_start\)"):
        read_dataset(d.root)


def test_footer_version_resealed(tmp_path):
    d = Copy(tmp_path, "v2/stacked")
    data = d.shard(0)
    foot = len(data) - 128
    struct.pack_into("<H", data, foot + 8, 2)
    seal(data, foot, 112)
    d.save(0, data)
    with pytest.raises(SpecError, match="footer version 2 is not 1"):
        read_dataset(d.root)


def test_manifest_version_2_without_stacked_field(tmp_path):
    d = Copy(tmp_path, "v1/none")
    d.manifest["version"] = 2
    d.save_manifest()
    with pytest.raises(SpecError, match="needs manifest version 2, one without needs 1"):
        read_dataset(d.root)


def test_manifest_lease_without_version_3(tmp_path):
    d = Copy(tmp_path, "v3/leased")
    d.manifest["version"] = 1
    d.save_manifest()
    with pytest.raises(SpecError, match="writer.lease needs manifest version 3"):
        read_dataset(d.root)


def test_manifest_lease_not_hex(tmp_path):
    d = Copy(tmp_path, "v3/leased")
    d.manifest["writer"]["lease"] = "not-hex"
    d.save_manifest()
    with pytest.raises(SpecError, match="writer.lease is not 1 to 64 hex digits"):
        read_dataset(d.root)


def test_schema_change_rehashed_in_manifest(tmp_path):
    """A renamed field with a matching schema_blake3 still disagrees with the shard headers."""
    d = Copy(tmp_path, "v1/none")
    d.manifest["schema"]["fields"][0]["name"] = "flag"
    canon = spec.canonical_schema_json(d.manifest["schema"])
    d.manifest["schema_blake3"] = b3(canon).hex()
    d.save_manifest()
    with pytest.raises(SpecError, match="header schema_hash differs from the schema"):
        read_dataset(d.root)


def test_payload_flip_without_rehash(tmp_path):
    d = Copy(tmp_path, "v1/none")
    data = d.shard(1)
    at = struct.unpack_from("<Q", data, d.chunk_entry(data, 4))[0]
    data[at + 128] ^= 1
    d.save(1, data)
    with pytest.raises(SpecError, match="payload BLAKE3 differs from its entry"):
        read_dataset(d.root)


def test_value_change_rehashed_is_caught_by_the_value_check(tmp_path):
    """A changed payload with every hash redone reads cleanly; only the values tell."""
    d = Copy(tmp_path, "v1/none")
    data = d.shard(1)
    entry = d.chunk_entry(data, 0)
    at, raw_len, stored_len = struct.unpack_from("<QQQ", data, entry)
    payload = at + 128
    data[payload] ^= 0x80
    h = b3(bytes(data[payload : payload + stored_len]))
    data[at + 64 : at + 96] = h
    seal(data, at, 120)
    data[entry + 56 : entry + 88] = h
    d.reseal_index(1, data)

    ds = read_dataset(d.root)
    field = spec.DTYPES[ds.shards[1].chunks[0].dtype][0]
    sample = ds.shards[1].chunks[0].sample
    assert mismatches(ds, EXPECTED["v1"]) == [(f"golden-{sample}", field)]


@pytest.mark.parametrize("bad", ["../x", "a/b", ".hidden", "hidden 2", "-x", "x" * 129])
def test_field_name_outside_the_rule_rehashed(tmp_path, bad):
    """§6.1: a manifest holding such a name is rejected even with a matching schema_blake3."""
    d = Copy(tmp_path, "v2/stacked")
    d.manifest["schema"]["fields"][2]["name"] = bad
    d.manifest["schema_blake3"] = b3(spec.canonical_schema_json(d.manifest["schema"])).hex()
    d.save_manifest()
    with pytest.raises(SpecError, match="breaks the name rule"):
        read_dataset(d.root)
