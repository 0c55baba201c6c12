"""A reader of hspack stores written from format-spec/FORMAT.md §11 alone.

It shares no code with the Rust crate or the `hspack` Python package: the golden store is
checked against the spec and not against the implementation that wrote it. Like
`hspack_spec_reader` (whose helpers it reuses: they are themselves written from the spec) it
raises `SpecError` at the first rule that fails; section numbers in the messages refer to
FORMAT.md.

What it reads:

* `store.json` and `index.json` (§11, §11.3), every index run listed there (its length and
  BLAKE3 against the record, its file name against the rule of §11.3, header, pack table,
  fan-out, entries sorted by id), and a lookup
  by id (fan-out bucket plus binary search, runs from the newest);
* packs (§11.2): header, footer, table, layout of the blobs, and a blob decoded (codec 0 or 1)
  and hashed against its id;
* named datasets (§11.5), each listed file rebuilt byte for byte: a plain file is its blob, a
  shard is rebuilt from its skeleton and the payloads its chunk table names (§11.4);
* capture files (§11.7): header (magic, version, zero bytes), the dataset name and its zero
  padding, the entry count against the file length, the trailing BLAKE3, the file name
  against the rule, entries sorted strictly by key; and the capture key and sample digest
  computed as §11.7 describes them.

Needs the `blake3` and `zstandard` packages (as `hspack_spec_reader` does).
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

import blake3

from hspack_spec_reader import (
    CHUNK_ENTRY_LEN,
    EXTENT_ENTRY_LEN,
    FOOTER_LEN,
    HEADER_LEN,
    HEX32,
    HEX64,
    INDEX_HEADER_LEN,
    KEY_ENTRY_LEN,
    SAMPLE_ENTRY_LEN,
    SHARD_VERSION,
    SpecError,
    b3,
    check_word,
    decode_payload,
    fail,
    is_uint,
    need,
    plain_name,
    u16,
    u32,
    u64,
    zero,
)

STORE_VERSION = 1
PACK_VERSION = 1
RUN_VERSION = 1
DATASET_VERSION = 1

PACK_HEADER_LEN = 64
PACK_ENTRY_LEN = 64
PACK_FOOTER_LEN = 64
PACK_ALIGN = 64
STORE_CODECS = {0: "stored", 1: "zstd"}

RUN_HEADER_LEN = 64
RUN_PACK_ID_LEN = 16
FANOUT_LEN = 8 * 256
RUN_ENTRY_LEN = 64

RUN_FILE = re.compile(r"index-([0-9a-f]{32})\.run")
DATASET_NAME = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9._\-]{0,127}")

STORE_KEYS = {"format", "version", "id"}
INDEX_KEYS = {"format", "version", "runs"}
RUN_RECORD_KEYS = {"file", "bytes", "blake3", "entries", "level"}
DATASET_KEYS = {"format", "version", "name", "files"}
DATASET_FILE_KEYS = {"name", "bytes", "blob", "shard"}


def load_json_bytes(data: bytes, sec: str, what: str) -> object:
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SpecError(f"{sec} {what}: not JSON: {e}") from e


def read_json(path: Path, sec: str, what: str) -> object:
    need(path.is_file(), f"{sec} {what}: missing")
    return load_json_bytes(path.read_bytes(), sec, what)


def exact_keys(obj: object, keys: set, sec: str, what: str) -> None:
    need(isinstance(obj, dict), f"{sec} {what}: not an object")
    need(set(obj) == keys, f"{sec} {what}: keys {sorted(obj)} are not {sorted(keys)}")


# ---------------------------------------------------------------- packs (§11.2)


@dataclass(frozen=True)
class PackEntry:
    id: bytes  # 32 bytes
    offset: int
    stored_len: int
    raw_len: int
    codec: int


@dataclass
class Pack:
    id: bytes  # 16 bytes
    file: str  # packs/<id hex>.pack, for messages
    data: bytes
    table_offset: int
    entries: list  # PackEntry, in file order
    by_offset: dict = field(default_factory=dict)

    def blob(self, e: PackEntry) -> bytes:
        """The blob's bytes, decoded, checked against its id."""
        what = f"{self.file}: blob {e.id.hex()} at {e.offset}"
        stored = self.data[e.offset : e.offset + e.stored_len]
        raw = decode_payload(e.codec, stored, e.raw_len, 1, f"§11.2 {what}")
        got = b3(raw)
        need(got == e.id, f"§11.2 {what}: hash mismatch, its bytes hash to {got.hex()}")
        return raw

    def verify(self) -> None:
        """Every blob of the pack decodes and hashes to its id."""
        for e in self.entries:
            self.blob(e)


def parse_pack(data: bytes, file: str, want_id: bytes = None) -> Pack:
    n_bytes = len(data)
    where = file
    need(
        n_bytes >= PACK_HEADER_LEN + PACK_FOOTER_LEN,
        f"§11.2 {where}: shorter than a header and a footer",
    )
    h = data[:PACK_HEADER_LEN]
    need(h[0:8] == b"HSPKPACK", f"§11.2 {where}: wrong pack magic")
    need(u16(h, 8) == PACK_VERSION, f"§11.2 {where}: pack version {u16(h, 8)} is not 1")
    zero(h, 10, 16, f"§11.2 {where} header")
    pack_id = h[16:32]
    zero(h, 32, 64, f"§11.2 {where} header")

    f = data[n_bytes - PACK_FOOTER_LEN :]
    need(f[56:64] == b"HSPKPEND", f"§11.2 {where}: wrong pack footer magic")
    zero(f, 48, 56, f"§11.2 {where} footer")
    T, n = u64(f, 0), u64(f, 8)
    need(T % PACK_ALIGN == 0, f"§11.2 {where}: table_offset {T} is not a multiple of 64")
    need(T >= PACK_HEADER_LEN, f"§11.2 {where}: table_offset {T} inside the header")
    # Bounded by the bytes present before anything is read (§8).
    need(
        n <= (n_bytes - PACK_FOOTER_LEN) // PACK_ENTRY_LEN
        and T + PACK_ENTRY_LEN * n == n_bytes - PACK_FOOTER_LEN,
        f"§11.2 {where}: table_offset {T} + 64 x {n} entries is not the file length - 64",
    )
    table = data[T : T + PACK_ENTRY_LEN * n]
    table_hash = b3(table)
    need(f[16:48] == table_hash, f"§11.2 {where}: table BLAKE3 differs from the footer")
    need(pack_id == table_hash[:16], f"§11.2 {where}: pack id is not the table's BLAKE3[:16]")
    need(
        file.endswith(f"{pack_id.hex()}.pack"),
        f"§11.2 {where}: file is not named after its pack id {pack_id.hex()}",
    )
    if want_id is not None:
        need(pack_id == want_id, f"§11.2 {where}: pack id is not {want_id.hex()}")

    entries = []
    pos = PACK_HEADER_LEN  # end of the last blob laid out
    for i in range(n):
        e = table[PACK_ENTRY_LEN * i :][:PACK_ENTRY_LEN]
        pe = PackEntry(e[0:32], u64(e, 32), u64(e, 40), u64(e, 48), e[56])
        what = f"§11.2 {where} table entry {i}"
        zero(e, 57, 64, what)
        need(pe.codec in STORE_CODECS, f"{what}: unknown codec {pe.codec}")
        if pe.codec == 0:
            need(pe.stored_len == pe.raw_len, f"{what}: codec 0 with stored_len != raw_len")
        need(pe.offset % PACK_ALIGN == 0, f"{what}: offset {pe.offset} not a multiple of 64")
        need(pe.offset >= pos, f"{what}: blob overlaps the header or the blob before it")
        need(pe.offset + pe.stored_len <= T, f"{what}: blob runs into the table")
        # The bytes between blobs are zero.
        zero(data, pos, pe.offset, f"§11.2 {where} gap before blob {i}")
        pos = pe.offset + pe.stored_len
        entries.append(pe)
    zero(data, pos, T, f"§11.2 {where} gap before the table")
    pack = Pack(pack_id, file, data, T, entries)
    pack.by_offset = {e.offset: e for e in entries}
    return pack


def read_pack(root: Path, pack_id: bytes) -> Pack:
    name = f"packs/{pack_id.hex()}.pack"
    path = Path(root) / name
    need(path.is_file(), f"§11.2 {name}: missing")
    return parse_pack(path.read_bytes(), name, pack_id)


# ---------------------------------------------------------------- index runs (§11.3)


@dataclass(frozen=True)
class IndexEntry:
    id: bytes
    pack: bytes  # the pack id (16 bytes), resolved through the run's pack table
    codec: int
    offset: int
    stored_len: int
    raw_len: int

    def same_as(self, pe: PackEntry) -> bool:
        return (self.id, self.codec, self.offset, self.stored_len, self.raw_len) == (
            pe.id,
            pe.codec,
            pe.offset,
            pe.stored_len,
            pe.raw_len,
        )


@dataclass
class Run:
    file: str
    level: int
    packs: list  # pack ids, 16 bytes each
    fanout: list  # 256 counts
    data: bytes
    n: int

    def _entries_base(self) -> int:
        return RUN_HEADER_LEN + RUN_PACK_ID_LEN * len(self.packs) + FANOUT_LEN

    def id_at(self, i: int) -> bytes:
        off = self._entries_base() + RUN_ENTRY_LEN * i
        return self.data[off : off + 32]

    def entry(self, i: int) -> IndexEntry:
        off = self._entries_base() + RUN_ENTRY_LEN * i
        e = self.data[off : off + RUN_ENTRY_LEN]
        return IndexEntry(
            e[0:32], self.packs[u32(e, 32)], e[36], u64(e, 40), u64(e, 48), u64(e, 56)
        )

    def entries(self) -> list:
        return [self.entry(i) for i in range(self.n)]

    def lookup(self, blob_id: bytes):
        """The entry of blob_id: its fan-out bucket, binary-searched; None if absent."""
        b = blob_id[0]
        lo = self.fanout[b - 1] if b > 0 else 0
        hi = self.fanout[b]
        while lo < hi:
            mid = (lo + hi) // 2
            got = self.id_at(mid)
            if got == blob_id:
                return self.entry(mid)
            if got < blob_id:
                lo = mid + 1
            else:
                hi = mid
        return None


def parse_run(data: bytes, file: str) -> Run:
    where = file
    size = len(data)
    need(size >= RUN_HEADER_LEN, f"§11.3 {where}: shorter than its header")
    need(data[0:8] == b"HSPKSIDX", f"§11.3 {where}: wrong run magic")
    need(u16(data, 8) == RUN_VERSION, f"§11.3 {where}: run version {u16(data, 8)} is not 1")
    zero(data, 10, 12, f"§11.3 {where} header")
    p, n = u32(data, 12), u64(data, 16)
    zero(data, 24, 64, f"§11.3 {where} header")
    want = RUN_HEADER_LEN + RUN_PACK_ID_LEN * p + FANOUT_LEN + RUN_ENTRY_LEN * n
    need(size == want, f"§11.3 {where}: {size} bytes, not 2112 + 16p + 64n = {want}")
    packs = [data[64 + 16 * i : 80 + 16 * i] for i in range(p)]
    fo_base = RUN_HEADER_LEN + RUN_PACK_ID_LEN * p
    fanout = [u64(data, fo_base + 8 * b) for b in range(256)]
    run = Run(file, -1, packs, fanout, data, n)

    base = fo_base + FANOUT_LEN
    counts = [0] * 256
    prev = None
    for i in range(n):
        e = data[base + RUN_ENTRY_LEN * i :][:RUN_ENTRY_LEN]
        what = f"§11.3 {where} entry {i}"
        bid = e[0:32]
        need(prev is None or prev < bid, f"{what}: entries not sorted strictly by id")
        prev = bid
        need(u32(e, 32) < p, f"{what}: pack {u32(e, 32)} not in the pack table of {p}")
        need(e[36] in STORE_CODECS, f"{what}: unknown codec {e[36]}")
        zero(e, 37, 40, what)
        if e[36] == 0:
            need(u64(e, 48) == u64(e, 56), f"{what}: codec 0 with stored_len != raw_len")
        counts[bid[0]] += 1
    total = 0
    for b in range(256):
        total += counts[b]
        need(
            fanout[b] == total,
            f"§11.3 {where}: fan-out {b} is {fanout[b]}, {total} ids start with a byte <= {b}",
        )
    return run


def run_file_name(data: bytes, level: int) -> str:
    """The name §11.3 gives a run: `index-<32 hex>.run`, the hex being the first 16 bytes of
    the BLAKE3 of its entries, then its first 2112 + 16p bytes (header, pack table, fan-out),
    then its level as a u32 (little-endian). `data` is a run that parse_run accepts."""
    p = u32(data, 12)
    base = RUN_HEADER_LEN + RUN_PACK_ID_LEN * p + FANOUT_LEN
    need(0 <= level < 1 << 32, f"§11.3 run level {level} does not fit a u32")
    h = b3(data[base:] + data[:base] + level.to_bytes(4, "little"))
    return f"index-{h[:16].hex()}.run"


def parse_run_record(r: object, i: int) -> dict:
    what = f"index.json run {i}"
    exact_keys(r, RUN_RECORD_KEYS, "§11.3", what)
    m = RUN_FILE.fullmatch(r["file"]) if isinstance(r["file"], str) else None
    need(m is not None, f"§11.3 {what}: file {r['file']!r} is not index-<32 hex>.run")
    for k in ("bytes", "entries", "level"):
        need(is_uint(r[k]), f"§11.3 {what}: {k} is not an unsigned integer")
    need(
        isinstance(r["blake3"], str) and HEX64.fullmatch(r["blake3"]) is not None,
        f"§11.3 {what}: blake3 is not 64 hex",
    )
    return r


def read_run(root: Path, rec: dict) -> Run:
    name = rec["file"]
    path = Path(root) / name
    need(path.is_file(), f"§11.3 {name}: missing")
    need(
        path.stat().st_size == rec["bytes"],
        f"§11.3 {name}: {path.stat().st_size} bytes, index.json says {rec['bytes']}",
    )
    data = path.read_bytes()
    h = b3(data)
    need(h.hex() == rec["blake3"], f"§11.3 {name}: BLAKE3 differs from index.json")
    run = parse_run(data, name)
    need(
        run.n == rec["entries"],
        f"§11.3 {name}: {run.n} entries, index.json says {rec['entries']}",
    )
    run.level = rec["level"]
    # §11.3 lets a reader skip the name; this one checks it, so a run renamed (or listed under
    # another level) is caught even with its length and BLAKE3 right.
    want_name = run_file_name(data, rec["level"])
    need(
        name == want_name,
        f"§11.3 {name}: run name is not {want_name} (BLAKE3 of its entries, its first "
        f"2112 + 16p bytes and its level {rec['level']} as a u32)",
    )
    return run


# ---------------------------------------------------------------- the store (§11)


@dataclass
class StoreFile:
    name: str
    bytes: int
    blob: bytes  # 32 bytes
    shard: bool


@dataclass
class StoreDataset:
    name: str
    files: list  # StoreFile, sorted by name


class Store:
    def __init__(self, root) -> None:
        self.root = Path(root)
        s = read_json(self.root / "store.json", "§11", "store.json")
        exact_keys(s, STORE_KEYS, "§11", "store.json")
        need(s["format"] == "hspack-store", "§11 store.json: format is not hspack-store")
        need(
            is_uint(s["version"]) and s["version"] == STORE_VERSION,
            f"§11 store.json: version {s['version']!r} is not 1",
        )
        need(
            isinstance(s["id"], str) and HEX32.fullmatch(s["id"]) is not None,
            "§11 store.json: id is not 32 hex",
        )
        self.id = s["id"]

        ix = read_json(self.root / "index.json", "§11.3", "index.json")
        exact_keys(ix, INDEX_KEYS, "§11.3", "index.json")
        need(ix["format"] == "hspack-store-index", "§11.3 index.json: wrong format")
        need(
            is_uint(ix["version"]) and ix["version"] == RUN_VERSION,
            f"§11.3 index.json: version {ix['version']!r} is not 1",
        )
        need(isinstance(ix["runs"], list), "§11.3 index.json: runs is not a list")
        records = [parse_run_record(r, i) for i, r in enumerate(ix["runs"])]
        files = [r["file"] for r in records]
        need(len(set(files)) == len(files), "§11.3 index.json: a run is listed twice")
        self.runs = [read_run(self.root, r) for r in records]  # oldest first
        self._packs = {}

    # -- blobs

    def lookup(self, blob_id: bytes):
        """The index entry of blob_id, searching the runs from the newest; None if absent."""
        for run in reversed(self.runs):
            e = run.lookup(blob_id)
            if e is not None:
                return e
        return None

    def pack(self, pack_id: bytes) -> Pack:
        if pack_id not in self._packs:
            self._packs[pack_id] = read_pack(self.root, pack_id)
        return self._packs[pack_id]

    def pack_entry(self, e: IndexEntry) -> tuple:
        """(pack, its table entry) of an index entry, which must agree with it."""
        pack = self.pack(e.pack)
        pe = pack.by_offset.get(e.offset)
        need(
            pe is not None and e.same_as(pe),
            f"§11.3 blob {e.id.hex()}: index entry differs from the table of {pack.file}",
        )
        return pack, pe

    def blob(self, blob_id: bytes) -> bytes:
        e = self.lookup(blob_id)
        need(e is not None, f"§11.5 blob {blob_id.hex()}: not in the index")
        pack, pe = self.pack_entry(e)
        return pack.blob(pe)

    def verify(self) -> None:
        """Every index entry agrees with its pack's table; every blob of those packs hashes to
        its id."""
        for run in self.runs:
            for e in run.entries():
                self.pack_entry(e)
        for pid in sorted({p for run in self.runs for p in run.packs}):
            self.pack(pid).verify()

    # -- datasets (§11.5)

    def dataset_names(self) -> list:
        d = self.root / "datasets"
        return sorted(p.name[: -len(".json")] for p in d.glob("*.json")) if d.is_dir() else []

    def dataset(self, name: str) -> StoreDataset:
        need(
            DATASET_NAME.fullmatch(name) is not None and not name.startswith("."),
            f"§11.5 dataset name {name!r} breaks the rule",
        )
        where = f"datasets/{name}.json"
        d = read_json(self.root / where, "§11.5", where)
        exact_keys(d, DATASET_KEYS, "§11.5", where)
        need(d["format"] == "hspack-store-dataset", f"§11.5 {where}: wrong format")
        need(
            is_uint(d["version"]) and d["version"] == DATASET_VERSION,
            f"§11.5 {where}: version {d['version']!r} is not 1",
        )
        need(d["name"] == name, f"§11.5 {where}: name {d['name']!r} is not the file's")
        need(isinstance(d["files"], list), f"§11.5 {where}: files is not a list")
        files = []
        for i, f in enumerate(d["files"]):
            what = f"{where} file {i}"
            exact_keys(f, DATASET_FILE_KEYS, "§11.5", what)
            need(plain_name(f["name"]), f"§11.5 {what}: name {f['name']!r} is not a file name")
            need(is_uint(f["bytes"]), f"§11.5 {what}: bytes is not an unsigned integer")
            need(
                isinstance(f["blob"], str) and HEX64.fullmatch(f["blob"]) is not None,
                f"§11.5 {what}: blob is not 64 hex",
            )
            need(isinstance(f["shard"], bool), f"§11.5 {what}: shard is not a boolean")
            files.append(StoreFile(f["name"], f["bytes"], bytes.fromhex(f["blob"]), f["shard"]))
        names = [f.name for f in files]
        need(
            all(a < b for a, b in zip(names, names[1:])),
            f"§11.5 {where}: files not sorted by name, each once",
        )
        return StoreDataset(name, files)

    def file_bytes(self, f: StoreFile) -> bytes:
        if f.shard:
            return rebuild_shard(self, f)
        e = self.lookup(f.blob)
        need(e is not None, f"§11.5 {f.name}: blob {f.blob.hex()} not in the index")
        need(e.raw_len == f.bytes, f"§11.5 {f.name}: blob is {e.raw_len} bytes, not {f.bytes}")
        return self.blob(f.blob)

    def rebuild(self, name: str) -> dict:
        """{file name: bytes} of every file of the named dataset."""
        return {f.name: self.file_bytes(f) for f in self.dataset(name).files}

    def materialize(self, name: str, dest) -> Path:
        """Writes the named dataset as a plain folder (to read it with hspack_spec_reader)."""
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        for fname, data in self.rebuild(name).items():
            (dest / fname).write_bytes(data)
        return dest


# ---------------------------------------------------------------- shards in a store (§11.4)


def rebuild_shard(store: Store, f: StoreFile) -> bytes:
    where = f"{f.name} (shard of a store)"
    skel = store.blob(f.blob)
    n = len(skel)
    need(n >= FOOTER_LEN, f"§11.4 {where}: skeleton shorter than a footer")

    # §2.3 Footer: the skeleton's last 128 bytes.
    ft = skel[n - FOOTER_LEN :]
    need(
        ft[0:8] == b"HSPKFOOT" and ft[120:128] == b"HSPKFOOT",
        f"§2.3 {where}: wrong footer magic",
    )
    need(u16(ft, 8) == SHARD_VERSION, f"§9 {where}: footer version {u16(ft, 8)} is not 1")
    check_word(ft, 112, f"§2.3 {where} footer")
    zero(ft, 10, 12, f"§2.3 {where} footer")
    index_offset, index_len, file_len = u64(ft, 32), u64(ft, 40), u64(ft, 104)
    need(file_len == f.bytes, f"§11.4 {where}: footer file_len {file_len}, dataset says {f.bytes}")
    need(index_offset >= HEADER_LEN, f"§2.3 {where}: index_offset < 128")
    need(
        index_offset + index_len == file_len - FOOTER_LEN,
        f"§2.3 {where}: index does not end at the footer",
    )
    need(index_len <= n - FOOTER_LEN, f"§11.4 {where}: index_len larger than the skeleton")
    index = skel[n - FOOTER_LEN - index_len : n - FOOTER_LEN]
    need(b3(index) == ft[48:80], f"§11.4 {where}: index hash differs from the footer")

    # §3.1 IndexHeader, §3 length formula
    need(index_len >= INDEX_HEADER_LEN, f"§3 {where}: index shorter than its header")
    need(index[0:8] == b"HSPKINDX", f"§3.1 {where}: wrong index magic")
    S, E, C, K, first_ordinal = (u64(index, o) for o in (8, 16, 24, 32, 40))
    zero(index, 48, 64, f"§3.1 {where} index header")
    want = INDEX_HEADER_LEN + (SAMPLE_ENTRY_LEN + KEY_ENTRY_LEN) * S
    want += EXTENT_ENTRY_LEN * E + CHUNK_ENTRY_LEN * C + K
    need(index_len == want, f"§3 {where}: index_len {index_len} disagrees with its header")
    need(u64(ft, 80) == S, f"§2.3 {where}: footer sample_count differs from the index")
    need(u64(ft, 88) == C, f"§2.3 {where}: footer chunk_count differs from the index")
    need(u64(ft, 96) == first_ordinal, f"§2.3 {where}: footer first_ordinal differs")

    # §3.4 ChunkEntry: the payload ranges, by offset, each payload once.
    chunk_base = INDEX_HEADER_LEN + SAMPLE_ENTRY_LEN * S + EXTENT_ENTRY_LEN * E
    ranges = {}
    for c in range(C):
        e = index[chunk_base + CHUNK_ENTRY_LEN * c :][:CHUNK_ENTRY_LEN]
        offset, stored_len, h = u64(e, 0), u64(e, 16), e[56:88]
        if stored_len == 0:  # empty payloads are not stored
            continue
        prev = ranges.setdefault(offset, (stored_len, h))
        need(
            prev == (stored_len, h),
            f"§11.4 {where}: chunk {c} names another payload at offset {offset}",
        )
    payloads = sorted((off, sl, h) for off, (sl, h) in ranges.items())

    end = HEADER_LEN  # end of the shard header, then of the last payload
    for off, sl, _ in payloads:
        need(
            off >= end,
            f"§11.4 {where}: payload at {off + HEADER_LEN} overlaps the shard header, "
            f"or the payload before it, or has no chunk header before it",
        )
        end = off + HEADER_LEN + sl
        need(
            end <= index_offset,
            f"§11.4 {where}: payload at {off + HEADER_LEN} runs into the index",
        )
    total = sum(sl for _, sl, _ in payloads)
    need(
        n + total == file_len,
        f"§11.4 {where}: skeleton {n} + payloads {total} bytes is not file_len {file_len}",
    )

    out = bytearray()
    cut = 0  # position in the skeleton
    for off, sl, h in payloads:
        start = off + HEADER_LEN
        gap = start - len(out)
        out += skel[cut : cut + gap]
        cut += gap
        blob = store.blob(h)
        need(
            len(blob) == sl,
            f"§11.4 {where}: payload blob {h.hex()} is {len(blob)} bytes, not {sl}",
        )
        out += blob
    out += skel[cut:]
    need(len(out) == file_len, f"§11.4 {where}: rebuilt {len(out)} bytes, not {file_len}")
    return bytes(out)


# ---------------------------------------------------------------- capture keys (§11.7)

CAPTURE_VERSION = 1
CAPTURE_HEADER_LEN = 160
CAPTURE_NAME_LEN = 128
CAPTURE_ENTRY_LEN = 72
CAPTURE_TRAILER_LEN = 32
CAPTURE_FILE = re.compile(r"([0-9a-f]{32})\.capt")
CAPTURE_KEY_CONTEXT = "hspack 2026 capture key v1"
SAMPLE_DIGEST_CONTEXT = "hspack 2026 sample digest v1"


def derive_key(context: str, material: bytes) -> bytes:
    """BLAKE3 in derive-key mode (§11.7), 32 bytes."""
    return blake3.blake3(material, derive_key_context=context).digest()


def _u32_str(s: str) -> bytes:
    b = s.encode("utf-8")
    need(len(b) < 1 << 32, "§11.7 a capture key string longer than a u32")
    return struct.pack("<I", len(b)) + b


def capture_key(
    model: str,
    revision: str,
    config_hash: str,
    engine: str,
    deterministic: bool,
    dtype: str,
    layers,
    fields,
    tokens,
    loss_mask=None,
) -> bytes:
    """§11.7 capture key: BLAKE3.derive_key("hspack 2026 capture key v1", m), m being eight
    strings (u32 LE UTF-8 length, then the bytes): model, revision (empty when unknown),
    config_hash (empty when unknown), engine, `1` or `0`, dtype, the layer ids in decimal
    joined by `,`, the field names in schema order joined by `,`; then the token count (u64 LE)
    and each token id (i64 LE); then the loss mask's length (u64 LE, 0 without one) and each
    entry (i64 LE)."""
    strings = [
        model,
        revision or "",
        config_hash or "",
        engine,
        "1" if deterministic else "0",
        dtype,
        ",".join(str(int(x)) for x in layers),
        ",".join(fields),
    ]
    m = b"".join(_u32_str(x) for x in strings)
    tokens = [int(t) for t in tokens]
    m += struct.pack("<Q", len(tokens)) + b"".join(struct.pack("<q", t) for t in tokens)
    mask = [] if loss_mask is None else [int(x) for x in loss_mask]
    m += struct.pack("<Q", len(mask)) + b"".join(struct.pack("<q", x) for x in mask)
    return derive_key(CAPTURE_KEY_CONTEXT, m)


def sample_digest(fields) -> bytes:
    """§11.7 sample digest: BLAKE3.derive_key("hspack 2026 sample digest v1", d), d being for
    each field in schema order its name's byte length (u32 LE), the name, the length of the
    sample's decoded bytes of the field (u64 LE) and those bytes. `fields`: (name, bytes)
    pairs in schema order."""
    d = b""
    for name, data in fields:
        data = bytes(data)
        d += _u32_str(name) + struct.pack("<Q", len(data)) + data
    return derive_key(SAMPLE_DIGEST_CONTEXT, d)


@dataclass(frozen=True)
class CaptureEntry:
    key: bytes  # 32 bytes
    digest: bytes  # 32 bytes
    ordinal: int


@dataclass
class CaptureFile:
    file: str
    dataset: str
    entries: list  # CaptureEntry, sorted by key

    def by_ordinal(self) -> dict:
        return {e.ordinal: e for e in self.entries}


def capture_file_name(data: bytes) -> str:
    """§11.7: `<hex>.capt`, the hex the first 16 bytes of the BLAKE3 of the file's bytes
    before its last 32."""
    return f"{b3(data[: len(data) - CAPTURE_TRAILER_LEN])[:16].hex()}.capt"


def parse_capture(data: bytes, file: str) -> CaptureFile:
    """A capture file (§11.7). `file` is its name (or a path ending in it): the name is checked
    against the rule."""
    where = f"captures/{Path(file).name}"
    size = len(data)
    need(
        size >= CAPTURE_HEADER_LEN + CAPTURE_TRAILER_LEN,
        f"§11.7 {where}: shorter than a header and a BLAKE3",
    )
    need(data[0:8] == b"HSPKCAPT", f"§11.7 {where}: wrong capture magic")
    need(
        u16(data, 8) == CAPTURE_VERSION,
        f"§11.7 {where}: capture version {u16(data, 8)} is not 1",
    )
    zero(data, 10, 12, f"§11.7 {where} header")
    L, n = u32(data, 12), u64(data, 16)
    zero(data, 24, 32, f"§11.7 {where} header")
    # Bounded by the bytes present before anything is read (§8).
    need(
        n <= (size - CAPTURE_HEADER_LEN - CAPTURE_TRAILER_LEN) // CAPTURE_ENTRY_LEN
        and size == CAPTURE_HEADER_LEN + CAPTURE_ENTRY_LEN * n + CAPTURE_TRAILER_LEN,
        f"§11.7 {where}: {size} bytes, not 160 + 72n + 32 for n = {n}",
    )
    body = data[: size - CAPTURE_TRAILER_LEN]
    h = b3(body)
    need(data[size - CAPTURE_TRAILER_LEN :] == h, f"§11.7 {where}: trailing BLAKE3 differs")
    want = f"{h[:16].hex()}.capt"
    need(
        CAPTURE_FILE.fullmatch(Path(file).name) is not None and Path(file).name == want,
        f"§11.7 {where}: capture file is not named {want}",
    )
    need(1 <= L <= CAPTURE_NAME_LEN, f"§11.7 {where}: dataset name length {L} not 1..128")
    raw_name = data[32 : 32 + L]
    zero(data, 32 + L, 32 + CAPTURE_NAME_LEN, f"§11.7 {where} name padding")
    try:
        name = raw_name.decode("utf-8")
    except UnicodeDecodeError:
        fail(f"§11.7 {where}: dataset name is not UTF-8")
    need(
        DATASET_NAME.fullmatch(name) is not None and not name.startswith("."),
        f"§11.7 {where}: dataset name {name!r} breaks the rule of §11.5",
    )
    entries = []
    prev = None
    for i in range(n):
        off = CAPTURE_HEADER_LEN + CAPTURE_ENTRY_LEN * i
        e = data[off : off + CAPTURE_ENTRY_LEN]
        key = e[0:32]
        need(
            prev is None or prev < key,
            f"§11.7 {where} entry {i}: entries not sorted strictly by key",
        )
        prev = key
        entries.append(CaptureEntry(key, e[32:64], u64(e, 64)))
    return CaptureFile(Path(file).name, name, entries)


def read_capture(path) -> CaptureFile:
    path = Path(path)
    need(path.is_file(), f"§11.7 captures/{path.name}: missing")
    return parse_capture(path.read_bytes(), path.name)


def read_captures(root) -> list:
    """Every `captures/*.capt` of a store, parsed, by file name; other files there refused."""
    d = Path(root) / "captures"
    if not d.is_dir():
        return []
    out = []
    for p in sorted(d.iterdir()):
        need(
            CAPTURE_FILE.fullmatch(p.name) is not None,
            f"§11.7 captures/{p.name}: not <32 hex>.capt",
        )
        out.append(read_capture(p))
    return out


def open_store(root) -> Store:
    return Store(root)


def read_store(root) -> dict:
    """Opens and verifies a whole store; {dataset name: {file name: bytes}}."""
    store = Store(root)
    store.verify()
    return {name: store.rebuild(name) for name in store.dataset_names()}


__all__ = [
    "CaptureEntry",
    "CaptureFile",
    "IndexEntry",
    "Pack",
    "PackEntry",
    "Run",
    "SpecError",
    "Store",
    "StoreDataset",
    "StoreFile",
    "capture_file_name",
    "capture_key",
    "open_store",
    "parse_capture",
    "parse_pack",
    "parse_run",
    "read_capture",
    "read_captures",
    "read_pack",
    "read_store",
    "rebuild_shard",
    "sample_digest",
]
