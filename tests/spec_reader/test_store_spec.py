"""The golden store (format-spec/golden/store-v1), read by the spec-only store reader and
compared byte for byte with the plain datasets it holds (format-spec/golden/v4); and spec
deviations planted in copies, which the reader must reject (FORMAT.md §11).
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

# dataset name in the store -> the plain folder it was added from
SOURCES = {"segments": "v4/segments", "again": "v4/segments", "stacked": "v4/stacked"}


def b3(data: bytes) -> bytes:
    return blake3.blake3(data).digest()


def folder_files(name: str) -> dict:
    root = GOLDEN / name
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def store() -> Store:
    return Store(STORE)


# ------------------------------------------------------------------ the golden store


def test_golden_store_lists_the_three_datasets(store):
    assert store.dataset_names() == sorted(SOURCES)
    assert len(store.runs) >= 1


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_golden_dataset_rebuilds_byte_identical(store, name):
    """Every file of the named dataset, rebuilt from its blobs (a shard from its skeleton and
    payloads, §11.4), is the file of the plain folder; the file lists are equal."""
    want = folder_files(SOURCES[name])
    got = store.rebuild(name)
    assert list(got) == list(want)
    bad = [f for f in want if got[f] != want[f]]
    assert bad == []
    # The records agree with the plain files: length, and for a plain file its BLAKE3 is the blob.
    for f in store.dataset(name).files:
        assert f.bytes == len(want[f.name])
        assert f.shard == f.name.endswith(".hsp")
        if not f.shard:
            assert f.blob == b3(want[f.name])
        else:  # a skeleton: the shard less its payloads, the whole shard only without any
            skeleton = store.blob(f.blob)
            assert len(skeleton) <= f.bytes
            assert (f.blob == b3(want[f.name])) == (len(skeleton) == f.bytes)
    assert any(len(store.blob(f.blob)) < f.bytes for f in store.dataset(name).files if f.shard)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_golden_dataset_materialized_reads_with_the_dataset_reader(store, name, tmp_path):
    """The rebuilt folder passes every check of the plain-dataset spec reader, as the original."""
    ds = read_dataset(store.materialize(name, tmp_path / name))
    orig = read_dataset(GOLDEN / SOURCES[name])
    assert [(s.key, s.rows) for s in ds.samples()] == [(s.key, s.rows) for s in orig.samples()]


def test_same_dataset_twice_is_stored_once(store):
    """`again` holds the bytes of `segments`: it names the same blobs (§11: each blob once)."""
    a, s = store.dataset("again"), store.dataset("segments")
    assert [(f.name, f.bytes, f.blob, f.shard) for f in a.files] == [
        (f.name, f.bytes, f.blob, f.shard) for f in s.files
    ]
    ids = [e.id for run in store.runs for e in run.entries()]
    assert len(ids) == len(set(ids))


def test_every_pack_blob_hashes_to_its_id_and_index_entries_match_tables(store):
    packs = sorted({p for run in store.runs for p in run.packs})
    assert sorted(p.name for p in (STORE / "packs").iterdir()) == [
        f"{p.hex()}.pack" for p in packs
    ]
    in_packs = set()
    for pid in packs:
        pack = store.pack(pid)
        assert pack.id == pid
        for pe in pack.entries:
            raw = pack.blob(pe)  # raises on a mismatch; checked here once more
            assert b3(raw) == pe.id and len(raw) == pe.raw_len
            in_packs.add((pid, pe))
    indexed = set()
    for run in store.runs:
        for e in run.entries():
            pack = store.pack(e.pack)
            pe = pack.by_offset[e.offset]
            assert (pe.id, pe.codec, pe.stored_len, pe.raw_len) == (
                e.id,
                e.codec,
                e.stored_len,
                e.raw_len,
            )
            indexed.add((e.pack, pe))
    assert indexed == in_packs  # every blob of every pack is indexed, and nothing else
    store.verify()


def test_lookup_finds_every_id_and_only_those(store):
    for run in store.runs:
        for e in run.entries():
            assert run.lookup(e.id) == e
            assert store.lookup(e.id) == e
            other = e.id[:-1] + bytes([e.id[-1] ^ 1])
            assert run.lookup(other) is None or run.lookup(other).id == other
    assert store.lookup(bytes(32)) is None
    assert store.lookup(b"\xff" * 32) is None


def test_golden_run_names_follow_the_rule(store):
    """§11.3: each run is named `index-<32 hex>.run`, the hex the first 16 bytes of the BLAKE3
    of its entries, then its first 2112 + 16p bytes, then its level as a u32."""
    records = json.loads((STORE / "index.json").read_text())["runs"]
    files = sorted(p.name for p in STORE.glob("index-*.run"))
    assert files and files == sorted(r["file"] for r in records)
    for rec in records:
        data = (STORE / rec["file"]).read_bytes()
        # The rule written out in the test (StoreCopy.run_name), apart from the reader's own.
        assert StoreCopy.run_name(data, rec["level"]) == rec["file"]
        assert store_spec.run_file_name(data, rec["level"]) == rec["file"]
    assert [r.file for r in store.runs] == [r["file"] for r in records]


def test_writer_rules_of_the_golden_store(store):
    """§11.2: chunk payloads are stored as they are; zstd only where it saves an eighth."""
    payloads = set()
    for name in store.dataset_names():
        for f in store.dataset(name).files:
            if f.shard:
                skel = store.blob(f.blob)
                foot = skel[-128:]
                index_len = struct.unpack_from("<Q", foot, 40)[0]
                index = skel[len(skel) - 128 - index_len : len(skel) - 128]
                s, e, c = struct.unpack_from("<QQQ", index, 8)
                base = 64 + 64 * s + 32 * e
                for i in range(c):
                    entry = index[base + 96 * i : base + 96 * (i + 1)]
                    if struct.unpack_from("<Q", entry, 16)[0]:
                        payloads.add(entry[56:88])
    assert payloads
    for run in store.runs:
        for e in run.entries():
            if e.id in payloads:
                assert e.codec == 0
            if e.codec == 1:
                assert e.raw_len - e.stored_len >= e.raw_len / 8


# ------------------------------------------------------------------ planted deviations


class StoreCopy:
    """A writable copy of the golden store."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path / "store"
        shutil.copytree(STORE, self.root)
        self.index = json.loads((self.root / "index.json").read_text())

    def largest_pack(self) -> Path:
        packs = sorted((self.root / "packs").iterdir(), key=lambda p: (p.stat().st_size, p.name))
        return packs[-1]

    def run_bytes(self, i: int) -> bytearray:
        return bytearray((self.root / self.index["runs"][i]["file"]).read_bytes())

    def save_run(self, i: int, data: bytearray, rehash: bool = True) -> None:
        """Writes run i; with rehash, as a writer would: its record's length and BLAKE3 updated
        and the file renamed after its new bytes (§11.3), so only the planted fault is left."""
        rec = self.index["runs"][i]
        (self.root / rec["file"]).write_bytes(bytes(data))
        if rehash:
            rec["bytes"] = len(data)
            rec["blake3"] = b3(bytes(data)).hex()
            self.rename_run(i, self.run_name(data, rec["level"]))

    @staticmethod
    def run_name(data: bytes, level: int) -> str:
        """§11.3: BLAKE3 of the entries, the first 2112 + 16p bytes and the level (u32), 16 bytes."""
        base = 2112 + 16 * struct.unpack_from("<I", data, 12)[0]
        h = b3(bytes(data[base:]) + bytes(data[:base]) + struct.pack("<I", level))
        return f"index-{h[:16].hex()}.run"

    def save_index(self) -> None:
        (self.root / "index.json").write_text(json.dumps(self.index, indent=2))

    def rename_run(self, i: int, new: str) -> None:
        """Renames run i's file and its record; its bytes, length and BLAKE3 stay as they are."""
        rec = self.index["runs"][i]
        if new != rec["file"]:
            (self.root / rec["file"]).rename(self.root / new)
        rec["file"] = new
        self.save_index()

    def dataset(self, name: str) -> dict:
        return json.loads((self.root / "datasets" / f"{name}.json").read_text())

    def save_dataset(self, name: str, d: dict) -> None:
        (self.root / "datasets" / f"{name}.json").write_text(json.dumps(d, indent=2))

    @staticmethod
    def entries_base(run: bytearray) -> int:
        return 2112 + 16 * struct.unpack_from("<I", run, 12)[0]


def test_untouched_copy_reads(tmp_path):
    store_spec.read_store(StoreCopy(tmp_path).root)


def test_flipped_byte_in_a_pack_blob_is_named(tmp_path):
    c = StoreCopy(tmp_path)
    path = c.largest_pack()
    data = bytearray(path.read_bytes())
    pack = store_spec.parse_pack(bytes(data), f"packs/{path.name}")
    first = pack.entries[0]
    assert first.stored_len > 0
    data[first.offset + first.stored_len // 2] ^= 0x01
    path.write_bytes(bytes(data))
    # The structure still parses (the table hash does not cover the blobs) ...
    store_spec.parse_pack(bytes(data), f"packs/{path.name}")
    st = Store(c.root)
    # ... but the blob no longer hashes to its id, and the message names the pack.
    with pytest.raises(SpecError, match=rf"{path.name}.*hash mismatch"):
        st.verify()
    with pytest.raises(SpecError, match=rf"{path.name}.*hash mismatch"):
        st.blob(first.id)
    # Every dataset that needs the blob refuses; the others rebuild unchanged.
    refused = []
    for name, src in SOURCES.items():
        try:
            got = Store(c.root).rebuild(name)
        except SpecError as e:
            assert path.name in str(e) and "hash mismatch" in str(e)
            refused.append(name)
        else:
            assert got == folder_files(src)
    assert refused


def test_index_run_with_swapped_entries_is_refused(tmp_path):
    c = StoreCopy(tmp_path)
    i = max(range(len(c.index["runs"])), key=lambda k: c.index["runs"][k]["entries"])
    run = c.run_bytes(i)
    base = c.entries_base(run)
    a, b = run[base : base + 64], run[base + 64 : base + 128]
    assert a[:32] < b[:32]
    run[base : base + 64], run[base + 64 : base + 128] = b, a
    c.save_run(i, run)  # index.json updated: only the order is wrong
    with pytest.raises(SpecError, match="not sorted"):
        Store(c.root)


def test_index_run_edited_without_its_record_is_refused(tmp_path):
    c = StoreCopy(tmp_path)
    run = c.run_bytes(0)
    base = c.entries_base(run)
    run[base + 40] ^= 0x40  # an offset
    c.save_run(0, run, rehash=False)
    with pytest.raises(SpecError, match="BLAKE3 differs from index.json"):
        Store(c.root)


def test_index_run_renamed_is_refused_by_its_name(tmp_path):
    """A run moved to another `index-<32 hex>.run` name, its record renamed with it (length and
    BLAKE3 still right), is refused by the name rule of §11.3 and nothing earlier."""
    c = StoreCopy(tmp_path)
    i = len(c.index["runs"]) - 1
    rec = c.index["runs"][i]
    old = rec["file"]
    data = (c.root / old).read_bytes()
    new = f"index-{b3(data)[:16].hex()}.run"  # named after the whole file: not the rule
    assert new != old and store_spec.RUN_FILE.fullmatch(new)
    c.rename_run(i, new)
    assert (rec["bytes"], rec["blake3"]) == (len(data), b3(data).hex())
    assert (c.root / new).read_bytes() == data and not (c.root / old).exists()
    with pytest.raises(SpecError, match=rf"§11\.3 {new}: run name is not {old}"):
        Store(c.root)
    # Named back, it reads again.
    c.rename_run(i, old)
    Store(c.root)


def test_index_run_listed_under_another_level_is_refused_by_its_name(tmp_path):
    """The level enters the name (§11.3): the same bytes listed at another level are misnamed."""
    c = StoreCopy(tmp_path)
    c.index["runs"][0]["level"] += 1
    c.save_index()
    with pytest.raises(SpecError, match="run name is not index-"):
        Store(c.root)


def test_index_run_length_disagrees_with_its_header(tmp_path):
    c = StoreCopy(tmp_path)
    run = c.run_bytes(0)
    c.save_run(0, run + bytes(64))
    with pytest.raises(SpecError, match=r"2112 \+ 16p \+ 64n"):
        Store(c.root)


def test_index_run_fanout_wrong(tmp_path):
    c = StoreCopy(tmp_path)
    run = c.run_bytes(0)
    p = struct.unpack_from("<I", run, 12)[0]
    fo = 64 + 16 * p
    b = run[c.entries_base(run)]  # first byte of the first id: its bucket is not empty
    count = struct.unpack_from("<Q", run, fo + 8 * b)[0]
    struct.pack_into("<Q", run, fo + 8 * b, count + 1)
    c.save_run(0, run)
    with pytest.raises(SpecError, match="fan-out"):
        Store(c.root)


def test_index_entry_disagrees_with_the_pack_table(tmp_path):
    c = StoreCopy(tmp_path)
    run = c.run_bytes(0)
    base = c.entries_base(run)
    stored = struct.unpack_from("<Q", run, base + 48)[0]
    codec = run[base + 36]
    struct.pack_into("<Q", run, base + 48, stored + 1)
    if codec == 0:
        struct.pack_into("<Q", run, base + 56, stored + 1)
    c.save_run(0, run)
    with pytest.raises(SpecError, match="differs from the table"):
        Store(c.root).verify()


def test_pack_table_byte_flipped(tmp_path):
    c = StoreCopy(tmp_path)
    path = c.largest_pack()
    data = bytearray(path.read_bytes())
    table = struct.unpack_from("<Q", data, len(data) - 64)[0]
    data[table + 3] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(SpecError, match="table BLAKE3 differs"):
        Store(c.root).verify()


def test_pack_gap_not_zero(tmp_path):
    c = StoreCopy(tmp_path)
    for path in sorted((c.root / "packs").iterdir()):
        data = bytearray(path.read_bytes())
        pack = store_spec.parse_pack(bytes(data), f"packs/{path.name}")
        e = pack.entries[0]
        end = e.offset + e.stored_len
        nxt = pack.entries[1].offset if len(pack.entries) > 1 else pack.table_offset
        if end < nxt:
            data[end] = 1
            path.write_bytes(bytes(data))
            break
    else:
        pytest.skip("no pack with padding after its first blob")
    with pytest.raises(SpecError, match="not zero"):
        Store(c.root).verify()


def test_dataset_files_not_sorted(tmp_path):
    c = StoreCopy(tmp_path)
    d = c.dataset("stacked")
    d["files"][0], d["files"][1] = d["files"][1], d["files"][0]
    c.save_dataset("stacked", d)
    with pytest.raises(SpecError, match="not sorted by name"):
        Store(c.root).rebuild("stacked")


def test_dataset_blob_not_in_the_index(tmp_path):
    c = StoreCopy(tmp_path)
    d = c.dataset("stacked")
    d["files"][0]["blob"] = b3(b"not in the store").hex()
    c.save_dataset("stacked", d)
    with pytest.raises(SpecError, match="not in the index"):
        Store(c.root).rebuild("stacked")


def test_dataset_shard_length_differs_from_the_skeleton_footer(tmp_path):
    c = StoreCopy(tmp_path)
    d = c.dataset("stacked")
    shard = next(f for f in d["files"] if f["shard"])
    shard["bytes"] += 1
    c.save_dataset("stacked", d)
    with pytest.raises(SpecError, match="file_len"):
        Store(c.root).rebuild("stacked")


def test_dataset_plain_file_named_as_a_shard(tmp_path):
    """A plain file's blob read as a skeleton: it has no shard footer (§11.4)."""
    c = StoreCopy(tmp_path)
    d = c.dataset("stacked")
    f = next(f for f in d["files"] if f["name"] == "manifest.json")
    f["shard"] = True
    c.save_dataset("stacked", d)
    with pytest.raises(SpecError, match="footer"):
        Store(c.root).rebuild("stacked")


@pytest.mark.parametrize("bad", [".hidden", "a/b", "", "x" * 129])
def test_dataset_name_rule(bad):
    with pytest.raises(SpecError, match="dataset name"):
        Store(STORE).dataset(bad)


def test_store_json_version_2_refused(tmp_path):
    c = StoreCopy(tmp_path)
    s = json.loads((c.root / "store.json").read_text())
    s["version"] = 2
    (c.root / "store.json").write_text(json.dumps(s))
    with pytest.raises(SpecError, match="version"):
        Store(c.root)
