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

# name -> (schema, codec, dataset id, manifest version, samples per shard)
DATASETS = {
    "v1/none": (gen.v1_schema(), 0, b"hspack-golden-v1", 1, 5),
    "v1/zstd": (gen.v1_schema(), 1, b"hspack-golden-v1", 1, 5),
    "v1/zstd-bytegroup": (gen.v1_schema(), 2, b"hspack-golden-v1", 1, 5),
    "v2/stacked": (gen.v2_schema(), 0, b"hspack-golden-v2", 2, 5),
    "v3/leased": (gen.v1_schema(), 0, b"hspack-golden-v3", 3, 5),
    "v4/segments": (gen.v1_schema(), 0, b"hspack-golden-v4", 4, 1),
}

# Golden datasets committed by the Rust side that may not be there yet in a working tree;
# every other one missing is a failure.
NEWEST = {"v4/segments"}

EXPECTED = {
    "v1": gen.samples(gen.v1_schema()),
    "v2": gen.samples(gen.v2_schema()),
    "v3": gen.samples(gen.v1_schema()),
    "v4": gen.samples(gen.v1_schema()),
}


def golden(name: str):
    """A pytest param of a golden dataset, skipped only if it is one of NEWEST and missing."""
    missing = name in NEWEST and not (GOLDEN / name).is_dir()
    reason = f"format-spec/golden/{name} is not committed yet (the Rust golden writer makes it)"
    return pytest.param(name, id=name, marks=pytest.mark.skipif(missing, reason=reason))


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


@pytest.mark.parametrize("name", [golden(n) for n in DATASETS])
def test_golden_reads_and_every_value_matches(name):
    schema, codec, dataset_id, version, per_shard = DATASETS[name]
    ds = read_dataset(GOLDEN / name)
    m = ds.manifest
    assert m["version"] == version
    assert bytes.fromhex(m["dataset_id"]) == dataset_id
    assert [(f.name, spec.DTYPES[f.dtype][0], f.shape, f.role) for f in ds.fields] == schema

    expected = EXPECTED[name.split("/")[0]]
    assert mismatches(ds, expected) == []

    # Shards of per_shard samples, ordinals 0.., every chunk in the dataset's codec.
    sizes = [len(sh.samples) for sh in ds.shards]
    assert sizes == gen.shard_sizes(per_shard)
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


# ------------------------------------------------------------------ manifest version 4 (§6.3)


@pytest.mark.parametrize("name", [golden("v4/segments")])
def test_golden_v4_segments(name):
    """9 commits of one shard each: 8 level-0 segments merged into one of level 1 (its key runs
    merged, its 8 parts listed in order), then one level-0 segment for the ninth (§6.3)."""
    ds = read_dataset(GOLDEN / name)
    assert "shards" not in ds.manifest and "samples_table" not in ds.manifest
    layout = [
        (g.level, g.first_seq, len(g.shards), g.first_ordinal, g.samples, len(g.tables))
        for g in ds.segments
    ]
    assert layout == [(1, 0, 8, 0, 8, 8), (0, 8, 1, 8, 1, 1)]
    assert [g.keys.count for g in ds.segments] == [8, 1]
    assert [t.count for g in ds.segments for t in g.tables] == [1] * 9


def key_run(ordinals) -> bytes:
    """§6.4, built from the generator's keys: (hash, ordinal) of each sample, sorted."""
    keys = EXPECTED["v1"]
    entries = sorted(
        (int.from_bytes(b3(keys[o][0].encode())[:8], "little"), o) for o in ordinals
    )
    return b"".join(struct.pack("<QQ", h, o) for h, o in entries)


def table_part(first: int, n: int, parquet: bool) -> bytes:
    """§7 rows first..first+n, cut from v1/none's samples.parquet; where pyarrow is missing (or
    `parquet` is false) any bytes: the reader then checks only their length and BLAKE3."""
    if not parquet or spec.pq is None:
        return f"a samples table part: rows {first} to {first + n - 1}".encode()
    table = spec.pq.read_table(GOLDEN / "v1/none/samples.parquet").slice(first, n)
    sink = spec.pa.BufferOutputStream()
    spec.pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def ref(file: str, data: bytes, count: str, n: int) -> dict:
    return {"file": file, "bytes": len(data), "blake3": b3(data).hex(), count: n}


class V4:
    """A manifest version 4 dataset built by hand, as FORMAT.md §6.3 and §6.4 say, around the
    shard files of v1/none: one segment per group of shards, each shard one commit (so one
    samples table part per shard), with helpers that keep every listed length and hash valid."""

    def __init__(self, tmp_path: Path, groups=((0,), (1,)), levels=None, parquet=True):
        self.root = tmp_path / "v4"
        self.root.mkdir()
        src = GOLDEN / "v1/none"
        v1 = json.loads((src / "manifest.json").read_text())
        for s in v1["shards"]:
            shutil.copy(src / s["file"], self.root / s["file"])
        self.segments = []
        for group, level in zip(groups, levels or [0] * len(groups)):
            shards = [v1["shards"][i] for i in group]
            first = shards[0]["first_ordinal"]
            n = sum(s["samples"] for s in shards)
            tag = f"{group[0]:06d}-{group[-1]:06d}"
            keys = key_run(range(first, first + n))
            self.write(f"keys-{tag}.bin", keys)
            tables = []
            for s in shards:
                part = table_part(s["first_ordinal"], s["samples"], parquet)
                name = f"samples-{s['seq']:06d}-{s['seq']:06d}.parquet"
                self.write(name, part)
                tables.append(ref(name, part, "samples", s["samples"]))
            seg = {
                "format": "hspack-segment",
                "version": 1,
                "dataset_id": v1["dataset_id"],
                "level": level,
                "shards": shards,
                "keys": ref(f"keys-{tag}.bin", keys, "entries", n),
                "tables": tables,
            }
            self.segments.append(seg)
        self.manifest = {
            "format": "hspack",
            "version": 4,
            "dataset_id": v1["dataset_id"],
            "schema": v1["schema"],
            "schema_blake3": v1["schema_blake3"],
            "segments": [self.entry(i) for i in range(len(self.segments))],
            "samples": v1["samples"],
            "writer": v1["writer"],
        }
        for i in range(len(self.segments)):
            self.save_segment(i)

    def write(self, name: str, data: bytes) -> None:
        (self.root / name).write_bytes(data)

    def segment_file(self, i: int) -> str:
        shards = self.segments[i]["shards"]
        return f"segment-{shards[0]['seq']:06d}-{shards[-1]['seq']:06d}.json"

    def entry(self, i: int) -> dict:
        seg = self.segments[i]
        return {
            "file": self.segment_file(i),
            "bytes": 0,
            "blake3": "",
            "level": seg["level"],
            "first_seq": seg["shards"][0]["seq"],
            "shards": len(seg["shards"]),
            "first_ordinal": seg["shards"][0]["first_ordinal"],
            "samples": sum(s["samples"] for s in seg["shards"]),
        }

    def save_segment(self, i: int) -> None:
        """Writes segment i and sets its manifest entry's bytes and BLAKE3 to match."""
        data = json.dumps(self.segments[i], indent=2).encode()
        entry = self.manifest["segments"][i]
        self.write(entry["file"], data)
        entry["bytes"], entry["blake3"] = len(data), b3(data).hex()
        self.save_manifest()

    def save_manifest(self) -> None:
        (self.root / "manifest.json").write_text(json.dumps(self.manifest, indent=2))

    def keys(self, i: int) -> bytearray:
        return bytearray((self.root / self.segments[i]["keys"]["file"]).read_bytes())

    def save_keys(self, i: int, data: bytes, entries: int = None) -> None:
        """Writes segment i's key run; its bytes and BLAKE3 (and entries, if given) follow."""
        keys = self.segments[i]["keys"]
        self.write(keys["file"], bytes(data))
        keys["bytes"], keys["blake3"] = len(data), b3(bytes(data)).hex()
        if entries is not None:
            keys["entries"] = entries
        self.save_segment(i)


def test_v4_built_by_hand_reads_and_every_value_matches(tmp_path):
    ds = read_dataset(V4(tmp_path).root)
    assert ds.manifest["version"] == 4
    assert mismatches(ds, EXPECTED["v1"]) == []
    assert [len(sh.samples) for sh in ds.shards] == gen.shard_sizes()
    assert [(g.level, g.first_seq, g.first_ordinal, g.samples) for g in ds.segments] == [
        (0, 0, 0, 5),
        (0, 1, 5, 4),
    ]


def test_v4_one_segment_of_level_1_with_two_parts(tmp_path):
    """Two commits merged: both shards' entries, one merged key run, both parts in order."""
    ds = read_dataset(V4(tmp_path, groups=((0, 1),), levels=[1]).root)
    assert mismatches(ds, EXPECTED["v1"]) == []
    assert [(g.level, len(g.shards), len(g.tables)) for g in ds.segments] == [(1, 2, 2)]


def test_v4_parts_without_a_parquet_reader(tmp_path, monkeypatch):
    """Without pyarrow only the parts' rows go unchecked: any bytes with the right length and
    BLAKE3 pass, and the rest of the dataset is checked as ever."""
    d = V4(tmp_path, parquet=False)
    monkeypatch.setattr(spec, "pq", None)
    assert mismatches(read_dataset(d.root), EXPECTED["v1"]) == []


def test_v4_with_a_lease_and_a_segment_per_shard_read_as_v1(tmp_path):
    """§9: version 4 holds a lease too."""
    d = V4(tmp_path)
    d.manifest["writer"]["lease"] = "6c6561736564676f6c64656e2d763321"
    d.save_manifest()
    read_dataset(d.root)


def test_v4_segment_blake3_differs(tmp_path):
    """Same length, same JSON, other bytes: only the BLAKE3 tells."""
    d = V4(tmp_path)
    path = d.root / d.manifest["segments"][1]["file"]
    text = path.read_text()
    path.write_text(text.replace("\n  ", "\n\t ", 1))
    with pytest.raises(SpecError, match=r"§6.3 segment-000001-000001.json: BLAKE3 differs"):
        read_dataset(d.root)


def test_v4_segment_length_differs(tmp_path):
    d = V4(tmp_path)
    path = d.root / d.manifest["segments"][0]["file"]
    path.write_bytes(path.read_bytes() + b"\n")
    with pytest.raises(SpecError, match=r"§6.3 segment .* bytes, the listing says"):
        read_dataset(d.root)


def test_v4_first_seq_gap(tmp_path):
    d = V4(tmp_path)
    d.manifest["segments"][1]["first_seq"] = 2
    d.save_manifest()
    with pytest.raises(SpecError, match=r"§6.3 segment 1: first_seq 2 is not the running sum"):
        read_dataset(d.root)


def test_v4_first_ordinal_wrong_in_the_manifest(tmp_path):
    d = V4(tmp_path)
    d.manifest["segments"][1]["first_ordinal"] = 4
    d.save_manifest()
    with pytest.raises(SpecError, match=r"segment 1: first_ordinal 4 is not the running sum"):
        read_dataset(d.root)


def test_v4_first_ordinal_wrong_in_the_segment_rehashed(tmp_path):
    d = V4(tmp_path)
    d.segments[1]["shards"][0]["first_ordinal"] = 4
    d.save_segment(1)
    with pytest.raises(SpecError, match="first shard's first_ordinal differs from the manifest"):
        read_dataset(d.root)


@pytest.mark.parametrize(
    "key, value",
    [
        ("shards", json.loads((GOLDEN / "v1/none/manifest.json").read_text())["shards"]),
        ("samples_table", None),
    ],
)
def test_v4_manifest_with_a_version_1_field(tmp_path, key, value):
    d = V4(tmp_path)
    d.manifest[key] = value
    d.save_manifest()
    with pytest.raises(SpecError, match=f"§6.3: a version 4 manifest has a {key} field"):
        read_dataset(d.root)


def test_v4_segments_field_in_a_version_1_manifest(tmp_path):
    d = Copy(tmp_path, "v1/none")
    d.manifest["segments"] = []
    d.save_manifest()
    with pytest.raises(SpecError, match="segments field needs manifest version 4"):
        read_dataset(d.root)


def test_manifest_version_6_asks_for_an_upgrade(tmp_path):
    d = V4(tmp_path)
    d.manifest["version"] = 6
    d.save_manifest()
    with pytest.raises(SpecError, match="newer than this reader knows .*upgrade"):
        read_dataset(d.root)


def test_manifest_version_5_without_a_quantized_field(tmp_path):
    d = V4(tmp_path)
    d.manifest["version"] = 5
    d.save_manifest()
    with pytest.raises(SpecError, match="quantized field needs manifest version 5"):
        read_dataset(d.root)


def test_v4_key_run_unsorted_rehashed(tmp_path):
    d = V4(tmp_path)
    run = d.keys(0)
    run[0:32] = run[16:32] + run[0:16]
    d.save_keys(0, run)
    with pytest.raises(SpecError, match=r"§6.4 .* entries 0, 1 not sorted by \(hash, ordinal\)"):
        read_dataset(d.root)


def test_v4_key_run_wrong_ordinal_rehashed(tmp_path):
    """Ordinal 5 (a sample of the other segment) in place of one of this segment's: the run
    stays sorted (its hashes differ), only the comparison with the shards' keys tells."""
    d = V4(tmp_path)
    run = d.keys(0)
    hashes = [struct.unpack_from("<Q", run, 16 * j)[0] for j in range(5)]
    assert len(set(hashes)) == 5
    struct.pack_into("<Q", run, 16 * 2 + 8, 5)
    d.save_keys(0, run)
    with pytest.raises(SpecError, match=r"§6.4 .* entry 2 is not \(hash, ordinal\)"):
        read_dataset(d.root)


def test_v4_key_run_wrong_hash_rehashed(tmp_path):
    d = V4(tmp_path)
    run = d.keys(1)
    assert struct.unpack_from("<Q", run, 16 * 3)[0] != (1 << 64) - 1
    struct.pack_into("<Q", run, 16 * 3, (1 << 64) - 1)  # the last hash: still sorted after it
    d.save_keys(1, run)
    with pytest.raises(SpecError, match=r"§6.4 .* entry 3 is not \(hash, ordinal\)"):
        read_dataset(d.root)


@pytest.mark.parametrize(
    "extra, declared, entries, match",
    [
        (8, 8, None, r"key run bytes 88 is not 16 x entries \(5\)"),
        (16, 16, 6, r"key run entries 6 is not the segment's sample count 5"),
        (-16, -16, 4, r"key run entries 4 is not the segment's sample count 5"),
        (8, 0, None, r"keys-000000-000000.bin' is 88 bytes, the listing says 80"),
    ],
    ids=["bytes-not-16x", "one-entry-more", "one-entry-less", "file-longer-than-listed"],
)
def test_v4_key_run_length(tmp_path, extra, declared, entries, match):
    """The run's length against `entries` and the segment's samples; `extra` bytes are added
    to (or cut from) the file, `declared` to its `bytes`, every hash made right."""
    d = V4(tmp_path)
    run = d.keys(0)
    run = run + bytes(extra) if extra > 0 else run[:extra]
    d.save_keys(0, run, entries)
    d.segments[0]["keys"]["bytes"] = 80 + declared
    d.save_segment(0)
    with pytest.raises(SpecError, match=match):
        read_dataset(d.root)


def test_v4_key_run_blake3_differs(tmp_path):
    d = V4(tmp_path)
    run = d.keys(1)
    run[0] ^= 1
    d.write(d.segments[1]["keys"]["file"], bytes(run))
    with pytest.raises(SpecError, match=r"§6.4 .* BLAKE3 differs from its segment's"):
        read_dataset(d.root)


def test_v4_parts_samples_do_not_add_up_rehashed(tmp_path):
    d = V4(tmp_path, groups=((0, 1),), levels=[1])
    d.segments[0]["tables"][0]["samples"] -= 1
    d.save_segment(0)
    with pytest.raises(SpecError, match=r"its parts' samples do not add up to its samples \(9\)"):
        read_dataset(d.root)


def test_v4_part_blake3_differs(tmp_path):
    d = V4(tmp_path)
    path = d.root / d.segments[1]["tables"][0]["file"]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(SpecError, match=r"§6.3 .* table part .* BLAKE3 differs"):
        read_dataset(d.root)


def test_v4_part_rows_of_other_samples_rehashed(tmp_path):
    """With pyarrow the rows are read: a part holding rows 1..5 for samples 0..4 is caught."""
    pytest.importorskip("pyarrow")
    d = V4(tmp_path)
    part = table_part(1, 5, True)
    d.write(d.segments[0]["tables"][0]["file"], part)
    d.segments[0]["tables"][0].update(ref(d.segments[0]["tables"][0]["file"], part, "samples", 5))
    d.save_segment(0)
    with pytest.raises(SpecError, match=r"§7 .* row 0 is \(key, ordinal\) \('golden-1', 1\)"):
        read_dataset(d.root)


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda d: d.segments[0].update(dataset_id="00" * 16), "dataset_id differs"),
        (lambda d: d.segments[0].update(level=2), "level differs from the manifest's entry"),
        (lambda d: d.segments[0].update(format="hspack"), 'format is not "hspack-segment"'),
        (lambda d: d.segments[0].update(version=2), "segment version 2 is newer .*upgrade"),
        (lambda d: d.segments[0].update(extra=1), r"segment-000000-000001.json: keys"),
        (lambda d: d.segments[0]["keys"].update(file="a/b"), "'a/b' is not a plain name"),
        (lambda d: d.segments[0]["tables"][0].update(file=".."), "'..' is not a plain name"),
        (lambda d: d.segments[0]["shards"][1].update(seq=2), r"not numbered 0.. \(position 1"),
        (lambda d: d.segments[0]["shards"][1].update(file="x/s.hsp"), "is not a plain name"),
        (lambda d: d.segments[0].update(shards=[]), "shards is not a non-empty list"),
    ],
    ids=[
        "dataset-id",
        "level",
        "format",
        "version",
        "extra-field",
        "keys-name",
        "part-name",
        "shard-seq",
        "shard-name",
        "no-shards",
    ],
)
def test_v4_segment_content_rehashed(tmp_path, edit, match):
    """Segment edits with the manifest's bytes and BLAKE3 made right."""
    d = V4(tmp_path, groups=((0, 1),), levels=[1])
    edit(d)
    d.save_segment(0)
    with pytest.raises(SpecError, match=match):
        read_dataset(d.root)


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda e: e.update(shards=2), "1 shards, the manifest's entry says 2"),
        (lambda e: e.update(samples=6), "5 samples, the manifest's entry says 6"),
        (lambda e: e.update(level=33), "level 33 not in 0..=32"),
        (lambda e: e.update(file="../segment.json"), "is not a plain name"),
        (lambda e: e.update(blake3="AB" * 32), "blake3 is not 64 hex digits"),
    ],
    ids=["shards", "samples", "level", "file", "blake3-hex"],
)
def test_v4_manifest_entry_differs(tmp_path, edit, match):
    d = V4(tmp_path)
    edit(d.manifest["segments"][0])
    d.save_manifest()
    with pytest.raises(SpecError, match=match):
        read_dataset(d.root)


def test_v4_manifest_samples_not_the_sum(tmp_path):
    d = V4(tmp_path)
    d.manifest["samples"] = 10
    d.save_manifest()
    with pytest.raises(SpecError, match="samples is not the sum of the segments' samples"):
        read_dataset(d.root)


# ------------------------------------------------------------------ fp8 fields (§4.1, version 5)

def to_dtype(values: list, dtype: str) -> np.ndarray:
    """Generated values as the writer was given them: f32 rounded (to nearest even) to dtype."""
    f32 = np.array(values, dtype=np.float32)
    if dtype == "f32":
        return f32
    if dtype == "f16":
        return f32.astype(np.float16).astype(np.float32)
    bits = f32.view(np.uint32).astype(np.uint64)
    return (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def e4m3_nearest(v: np.ndarray) -> np.ndarray:
    """§4.1 step 3 by exhaustive search: the code of the value nearest to v, ties to the even
    mantissa (no conversion routine trusted)."""
    codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], dtype=np.uint8)
    values = spec.E4M3[codes].astype(np.float64)
    out = np.empty(len(v), dtype=np.uint8)
    for i, x in enumerate(v.astype(np.float64)):
        d = np.abs(values - x)
        best = codes[d == d.min()]
        if len(best) > 1:
            best = best[(best & 1) == 0]
        # ±0 tie: the sign of x decides (a negative that rounds to zero is 0x80).
        if len(best) > 1:
            best = best[(best & 0x80) == (0x80 if np.signbit(x) else 0)]
        out[i] = best[0]
    return out


def quantize_by_spec(x: np.ndarray, group: int) -> tuple:
    """§4.1 encoding of f32 values x in groups: (scales, codes)."""
    groups = x.reshape(-1, group)
    scales = (np.abs(groups).max(axis=1) / np.float32(448)).astype(np.float32)
    scales[scales == 0] = np.float32(1)
    q = np.clip(groups / scales[:, None], np.float32(-448), np.float32(448)).astype(np.float32)
    return scales, e4m3_nearest(q.reshape(-1))


def test_golden_v5_quantized_every_scale_code_and_value_matches_the_spec():
    ds = read_dataset(GOLDEN / "v5/quantized")
    assert ds.manifest["version"] == 5
    expected = gen.v5_values()
    got = ds.samples()
    assert [(s.key, s.rows) for s in got] == [(k, r) for k, r, _ in expected]
    schema = {name: (dtype, group) for name, dtype, _, _, group in gen.v5_schema()}
    checked_codes = 0
    for s, (key, rows, fields) in zip(got, expected):
        for name, values in fields.items():
            dtype, group = schema[name]
            if dtype == "i32":
                assert s.fields[name].tolist() == [int(v) for v in values], (key, name)
                continue
            x = to_dtype(values, dtype)
            decoded = s.fields[name]
            if not group:
                assert spec.round_f32_to(x, dtype) == decoded.tobytes(), (key, name)
                continue
            scales, codes = quantize_by_spec(x, group) if len(x) else (np.zeros(0, "<f4"), np.zeros(0, np.uint8))
            got_scales, got_codes = s.stored[name]
            assert got_scales.tobytes() == scales.astype("<f4").tobytes(), (key, name, "scales")
            assert got_codes.tobytes() == codes.tobytes(), (key, name, "codes")
            values_back = (spec.E4M3[codes].reshape(-1, group) * scales[:, None]).astype(np.float32)
            assert decoded.tobytes() == spec.round_f32_to(values_back.reshape(-1), dtype), (key, name)
            checked_codes += len(codes)
    assert checked_codes > 500
    # The groups span FP8's subnormals and whole rows of zeros (scale 1).
    every = np.concatenate([s.stored[n][1] for s in got for n in s.stored])
    assert np.any((every & 0x78) == 0) and np.any((every & 0x7F) > 0x70)
    scales = np.concatenate([s.stored[n][0] for s in got for n in s.stored])
    assert np.any(scales == 1.0)


@pytest.mark.parametrize(
    "stored, match",
    [
        (struct.pack("<f", 1.0) + bytes([0x38, 0x7F]), "NaN code"),
        (struct.pack("<f", 0.0) + bytes([0x38, 0x38]), "not finite and positive"),
        (struct.pack("<f", float("inf")) + bytes([0x38, 0x38]), "not finite and positive"),
        (struct.pack("<f", 1.0) + bytes([0x38]), "fp8 payload of 5 bytes"),
    ],
)
def test_fp8_payload_deviations_are_refused(stored, match):
    fs = spec.FieldSpec("h", spec.DTYPE_CODE["bf16"], [2], {"kind": "other"}, 4, 2)
    with pytest.raises(SpecError, match=match):
        spec.decode_payload(3, stored, 4, 2, "chunk", fs)


def test_fp8_decodes_as_the_spec_says():
    fs = spec.FieldSpec("h", spec.DTYPE_CODE["f32"], [2], {"kind": "other"}, 8, 2)
    # 0x7E is 448, 0x01 is 2^-9, 0xB8 is -1; scale 0.5.
    raw = spec.decode_payload(3, struct.pack("<f", 0.5) + bytes([0x7E, 0xB8]), 8, 4, "c", fs)
    assert struct.unpack("<2f", raw) == (224.0, -0.5)
    assert spec.e4m3_value(0x01) == 2.0**-9 and spec.e4m3_value(0x08) == 2.0**-6


def test_manifest_version_4_with_a_quantized_field(tmp_path):
    root = tmp_path / "q"
    shutil.copytree(GOLDEN / "v5/quantized", root)
    m = json.loads((root / "manifest.json").read_text())
    m["version"] = 4
    (root / "manifest.json").write_text(json.dumps(m, indent=2))
    with pytest.raises(SpecError, match="quantized field needs manifest version 5"):
        read_dataset(root)


def test_quantized_marker_removed_from_the_schema(tmp_path):
    """Without `quantized` the fp8 chunks stand in an exact field: refused (the schema hash is
    redone in the manifest; the shard headers still carry the old one, so either check fires)."""
    root = tmp_path / "q"
    shutil.copytree(GOLDEN / "v5/quantized", root)
    m = json.loads((root / "manifest.json").read_text())
    for f in m["schema"]["fields"]:
        f.pop("quantized", None)
    m["schema_blake3"] = b3(spec.canonical_schema_json(m["schema"])).hex()
    (root / "manifest.json").write_text(json.dumps(m, indent=2))
    with pytest.raises(SpecError, match="version 5|codec fp8|schema_hash"):
        read_dataset(root)
