"""A reader of hspack datasets written from format-spec/FORMAT.md alone.

It shares no code with the Rust crate or the `hspack` Python package, so the golden vectors
are checked against the spec and not against the implementation that wrote them. It checks
every rule of the spec that a reader can check and raises `SpecError` at the first one that
fails. Section numbers in the messages refer to FORMAT.md.

Needs the `blake3` and `zstandard` packages and numpy. Where `pyarrow` is importable it also
checks the rows of the samples table parts of manifest version 4 against the shards (§7);
without it those parts are checked by length and BLAKE3 only.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

import blake3
import numpy as np
import zstandard

try:  # optional: only the rows of samples table parts need it (§7)
    import pyarrow as pa
    import pyarrow.parquet as pq
except ImportError:
    pa = pq = None

MIB = 1 << 20
U64_MAX = (1 << 64) - 1

HEADER_LEN = 128
FOOTER_LEN = 128
INDEX_HEADER_LEN = 64
SAMPLE_ENTRY_LEN = 64
EXTENT_ENTRY_LEN = 32
CHUNK_ENTRY_LEN = 96
KEY_ENTRY_LEN = 16

SHARD_VERSION = 1
MANIFEST_VERSIONS = (1, 2, 3, 4, 5)
SEGMENT_VERSION = 1
MAX_LEVEL = 32
KEY_RUN_ENTRY_LEN = 16
HEX_LEASE = re.compile(r"[0-9a-fA-F]{1,64}")

CODECS = {0: "none", 1: "zstd", 2: "zstd-bytegroup", 3: "fp8"}

# §5: code -> (name, bytes per element, numpy dtype or None where numpy has none).
DTYPES = {
    1: ("bool", 1, "|b1"),
    2: ("u8", 1, "|u1"),
    3: ("i8", 1, "|i1"),
    4: ("i16", 2, "<i2"),
    5: ("i32", 4, "<i4"),
    6: ("i64", 8, "<i8"),
    7: ("f16", 2, "<f2"),
    8: ("bf16", 2, None),
    9: ("f32", 4, "<f4"),
    10: ("f64", 8, "<f8"),
    11: ("f8e4m3fn", 1, None),
    12: ("f8e5m2", 1, None),
}
DTYPE_CODE = {name: code for code, (name, _, _) in DTYPES.items()}

POINTS = ("layer_input", "layer_output", "final_norm")
FIELD_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")
HEX32 = re.compile(r"[0-9a-f]{32}")
HEX64 = re.compile(r"[0-9a-f]{64}")

SHARD_ENTRY_KEYS = {
    "file",
    "seq",
    "bytes",
    "index_blake3",
    "first_ordinal",
    "samples",
    "chunks",
    "raw_bytes",
}
SEGMENT_ENTRY_KEYS = {
    "file",
    "bytes",
    "blake3",
    "level",
    "first_seq",
    "shards",
    "first_ordinal",
    "samples",
}
SEGMENT_KEYS = {"format", "version", "dataset_id", "level", "shards", "keys", "tables"}


class SpecError(ValueError):
    """A dataset breaks a rule of FORMAT.md."""


def fail(msg: str) -> None:
    raise SpecError(msg)


def need(cond: bool, msg: str) -> None:
    if not cond:
        raise SpecError(msg)


def b3(data: bytes) -> bytes:
    return blake3.blake3(data).digest()


def u64(buf: bytes, off: int) -> int:
    return struct.unpack_from("<Q", buf, off)[0]


def u32(buf: bytes, off: int) -> int:
    return struct.unpack_from("<I", buf, off)[0]


def u16(buf: bytes, off: int) -> int:
    return struct.unpack_from("<H", buf, off)[0]


def zero(buf: bytes, start: int, end: int, what: str) -> None:
    need(buf[start:end] == bytes(end - start), f"{what}: reserved bytes {start}..{end} not zero")


def check_word(buf: bytes, covered: int, what: str) -> None:
    """The check word: first 8 bytes of BLAKE3(bytes 0..covered), stored as LE u64 at `covered`."""
    want = int.from_bytes(b3(buf[:covered])[:8], "little")
    need(u64(buf, covered) == want, f"{what}: check word does not match")


# ---------------------------------------------------------------- manifest (§6)


@dataclass
class FieldSpec:
    name: str
    dtype: int
    shape: list
    role: dict
    row_bytes: int
    group: int = 0  # §4.1: elements sharing a scale, for a quantized field; 0 for an exact one


@dataclass
class ShardSpec:
    file: str
    seq: int
    bytes: int
    index_blake3: bytes
    first_ordinal: int
    samples: int
    chunks: int
    raw_bytes: int


def canonical_schema_json(schema: dict) -> bytes:
    """§6.2: compact JSON, keys in the order §6.1 lists them."""

    def role(r: dict) -> dict:
        out = {"kind": r["kind"]}
        if r["kind"] == "hidden_state":
            out["layer"] = r["layer"]
            out["point"] = r["point"]
        elif r["kind"] == "hidden_states":
            out["layers"] = r["layers"]
            out["point"] = r["point"]
        return out

    capture = schema.get("capture")
    if capture is not None:
        keys = (
            "model",
            "revision",
            "config_hash",
            "num_layers",
            "hidden_size",
            "dtype",
            "tp_size",
            "tool",
            "tool_version",
        )
        capture = {k: capture.get(k) for k in keys}
    def one(f: dict) -> dict:
        out = {"name": f["name"], "dtype": f["dtype"], "shape": f["shape"], "role": role(f["role"])}
        if "quantized" in f:  # §6.1: written only for a quantized field
            out["quantized"] = {"scheme": f["quantized"]["scheme"], "group": f["quantized"]["group"]}
        return out

    canon = {
        "fields": [one(f) for f in schema["fields"]],
        "capture": capture,
    }
    return json.dumps(canon, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def is_uint(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= U64_MAX


def parse_role(role: object, shape: list, where: str) -> dict:
    need(isinstance(role, dict), f"§6.1 {where}: role is not an object")
    kind = role.get("kind")
    if kind in ("token_ids", "loss_mask", "other"):
        need(set(role) == {"kind"}, f"§6.1 {where}: role {kind} has extra keys")
    elif kind == "hidden_state":
        need(set(role) == {"kind", "layer", "point"}, f"§6.1 {where}: hidden_state keys")
        need(is_uint(role["layer"]), f"§6.1 {where}: layer is not an unsigned integer")
        need(role["point"] in POINTS, f"§6.1 {where}: unknown point {role['point']!r}")
    elif kind == "hidden_states":
        need(set(role) == {"kind", "layers", "point"}, f"§6.1 {where}: hidden_states keys")
        layers = role["layers"]
        need(
            isinstance(layers, list) and layers and all(is_uint(x) for x in layers),
            f"§6.1 {where}: layers is not a list of unsigned integers",
        )
        need(role["point"] in POINTS, f"§6.1 {where}: unknown point {role['point']!r}")
        need(
            len(shape) == 2 and shape[0] == len(layers),
            f"§6.1 {where}: a hidden_states row must have shape [k, H] with k = len(layers)",
        )
    else:
        fail(f"§6.1 {where}: unknown role kind {kind!r}")
    return role


def parse_schema(schema: object) -> list:
    need(isinstance(schema, dict), "§6.1: schema is not an object")
    need(set(schema) == {"fields", "capture"}, "§6.1: schema keys are not fields, capture")
    fields = schema["fields"]
    need(isinstance(fields, list) and 1 <= len(fields) <= 4096, "§6.1: 1..=4096 fields")
    out = []
    names = set()
    for i, f in enumerate(fields):
        need(isinstance(f, dict), f"§6.1 field {i}: not an object")
        need(
            set(f) in ({"name", "dtype", "shape", "role"}, {"name", "dtype", "shape", "role", "quantized"}),
            f"§6.1 field {i}: keys",
        )
        name = f["name"]
        need(
            isinstance(name, str) and FIELD_NAME.fullmatch(name) is not None,
            f"§6.1 field {i}: name {name!r} breaks the name rule",
        )
        need(name not in names, f"§6.1: field name {name!r} is not unique")
        names.add(name)
        need(f["dtype"] in DTYPE_CODE, f"§6.1 field {name}: unknown dtype {f['dtype']!r}")
        code = DTYPE_CODE[f["dtype"]]
        shape = f["shape"]
        need(
            isinstance(shape, list) and all(is_uint(d) for d in shape),
            f"§6.1 field {name}: shape is not a list of unsigned integers",
        )
        row = DTYPES[code][1]
        for d in shape:
            row *= d
        need(1 <= row <= 256 * MIB, f"§6.1 field {name}: row of {row} bytes, not 1..=256 MiB")
        role = parse_role(f["role"], shape, f"field {name}")
        group = 0
        if "quantized" in f:
            q = f["quantized"]
            need(isinstance(q, dict) and set(q) == {"scheme", "group"}, f"§6.1 field {name}: quantized keys")
            need(q["scheme"] == "fp8-e4m3fn", f"§6.1 field {name}: unknown scheme {q['scheme']!r}")
            need(f["dtype"] in ("f16", "bf16", "f32"), f"§6.1 field {name}: only f16, bf16 and f32 fields are quantized")
            need(role["kind"] not in ("token_ids", "loss_mask"), f"§6.1 field {name}: {role['kind']} must stay exact")
            elems = row // DTYPES[code][1]
            group = q["group"]
            need(is_uint(group) and group >= 1 and elems % group == 0, f"§6.1 field {name}: group does not divide the row")
        out.append(FieldSpec(name, code, list(shape), role, row, group))
    capture = schema["capture"]
    need(capture is None or isinstance(capture, dict), "§6.1: capture is not an object or null")
    return out


def plain_name(name: object) -> bool:
    """A file name with no folder part."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not any(c in name for c in "/\\\0")
    )


def parse_manifest(root: Path) -> tuple:
    """(manifest, fields, shard specs, dataset id, schema hash, segment specs) of a dataset.

    Versions 1 to 3 list the shards; version 4 lists segments (§6.3), which are read here
    (their key runs and table parts are checked by `read_dataset`, against the samples).
    """
    m = load_json(root / "manifest.json", "§6", "manifest.json")
    need(isinstance(m, dict), "§6: manifest is not an object")
    need(m.get("format") == "hspack", '§6: format is not "hspack"')
    version = m.get("version")
    need(is_uint(version), f"§9: manifest version {version!r} is not an unsigned integer")
    need(
        version <= max(MANIFEST_VERSIONS),
        f"§9: manifest version {version} is newer than this reader knows (1 to 5): upgrade",
    )
    need(version in MANIFEST_VERSIONS, f"§9: manifest version {version!r} is not 1 to 5")
    dataset_id = m.get("dataset_id")
    need(
        isinstance(dataset_id, str) and HEX32.fullmatch(dataset_id) is not None,
        "§6: dataset_id is not 32 hex digits",
    )
    fields = parse_schema(m.get("schema"))
    stacks = any(f.role["kind"] == "hidden_states" for f in fields)
    writer = m.get("writer")
    need(isinstance(writer, dict), "§6: writer is not an object")
    lease = writer.get("lease")
    need(
        lease is None or (isinstance(lease, str) and HEX_LEASE.fullmatch(lease) is not None),
        "§6: writer.lease is not 1 to 64 hex digits",
    )
    quantized = any(f.group for f in fields)
    need(
        quantized == (version == 5),
        "§6.1: a schema with a quantized field needs manifest version 5, and version 5 has one",
    )
    if version >= 4:
        pass  # §9: versions 4 and 5 hold a stacked schema and a lease alike
    elif lease is not None:
        need(version == 3, "§6: a manifest with writer.lease needs manifest version 3")
    else:
        need(
            version == (2 if stacks else 1),
            "§6.1: a schema with a hidden_states field needs manifest version 2, one without needs 1",
        )
    schema_hash = b3(canonical_schema_json(m["schema"]))
    need(m.get("schema_blake3") == schema_hash.hex(), "§6: schema_blake3 does not match")
    if version >= 4:
        need("shards" not in m, "§6.3: a version 4 manifest has a shards field")
        need("samples_table" not in m, "§6.3: a version 4 manifest has a samples_table field")
        segments, shards = parse_segments(root, m, dataset_id)
    else:
        need("segments" not in m, "§9: a segments field needs manifest version 4")
        segments = []
        shards = parse_shard_list(m.get("shards"))
    check_shard_totals(shards)
    total = sum(s.samples for s in shards)
    need(m.get("samples") == total, "§6: samples is not the sum of the shards' samples")
    if version < 4:
        parse_samples_table(root, m.get("samples_table"), total)
    return m, fields, shards, bytes.fromhex(dataset_id), schema_hash, segments


def load_json(path: Path, sec: str, what: str, data: bytes = None) -> object:
    """A UTF-8 JSON file of at most 256 MiB (§6, §6.3); `data` when already read."""
    if data is None:
        need(path.stat().st_size <= 256 * MIB, f"{sec}: {what} is larger than 256 MiB")
        data = path.read_bytes()
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SpecError(f"{sec}: {what} is not UTF-8 JSON: {e}") from e


def parse_shard_entry(s: object, seq: int, ordinal: int, where: str) -> ShardSpec:
    """One §6 shard entry, which must be shard `seq` and start at `ordinal`."""
    need(isinstance(s, dict) and set(s) == SHARD_ENTRY_KEYS, f"§6 {where}: keys")
    need(s["seq"] == seq, f"§6: shard list is not numbered 0.. (position {seq}, seq {s['seq']})")
    name = s["file"]
    need(plain_name(name), f"§6 {where}: file {name!r} is not a plain name")
    for k in ("seq", "bytes", "first_ordinal", "samples", "chunks", "raw_bytes"):
        need(is_uint(s[k]), f"§6 {where}: {k} is not an unsigned integer")
    need(is_hex64(s["index_blake3"]), f"§6 {where}: index_blake3 is not 64 hex digits")
    need(s["first_ordinal"] == ordinal, f"§6 {where}: first_ordinal is not the running sum")
    return ShardSpec(
        name,
        seq,
        s["bytes"],
        bytes.fromhex(s["index_blake3"]),
        s["first_ordinal"],
        s["samples"],
        s["chunks"],
        s["raw_bytes"],
    )


def parse_shard_list(shards_json: object) -> list:
    """Versions 1 to 3: the manifest's `shards` (§6)."""
    need(isinstance(shards_json, list), "§6: shards is not a list")
    shards = []
    ordinal = 0
    for i, s in enumerate(shards_json):
        shards.append(parse_shard_entry(s, i, ordinal, f"shard {i}"))
        ordinal += shards[-1].samples
        need(ordinal <= U64_MAX, "§6: shard samples, bytes or raw_bytes add up to 2^64 or more")
    return shards


def check_shard_totals(shards: list) -> None:
    sums = (sum(getattr(s, k) for s in shards) for k in ("samples", "bytes", "raw_bytes"))
    need(
        all(x <= U64_MAX for x in sums),
        "§6: shard samples, bytes or raw_bytes add up to 2^64 or more",
    )


def parse_samples_table(root: Path, table: object, samples: int) -> None:
    """Versions 1 to 3: `samples_table` (§6), null or one file covering every sample."""
    if table is None:
        return
    need(
        isinstance(table, dict) and set(table) == {"file", "bytes", "blake3", "samples"},
        "§6: samples_table keys",
    )
    need(plain_name(table["file"]), "§6: samples_table file is not a plain name")
    data = (root / table["file"]).read_bytes()
    need(len(data) == table["bytes"], "§6: samples table size differs from the manifest")
    need(b3(data).hex() == table["blake3"], "§6: samples table BLAKE3 differs from the manifest")
    need(table["samples"] == samples, "§6: samples_table samples differs from samples")


def is_hex64(v: object) -> bool:
    return isinstance(v, str) and HEX64.fullmatch(v) is not None


def read_listed(root: Path, name: str, size: int, sec: str, what: str) -> bytes:
    """A file the manifest or a segment lists with its length: the length is checked before
    anything is read (§8)."""
    path = root / name
    need(path.is_file(), f"{sec} {what}: file {name!r} is missing")
    got = path.stat().st_size
    need(got == size, f"{sec} {what}: file {name!r} is {got} bytes, the listing says {size}")
    return path.read_bytes()


# ---------------------------------------------------------------- segments (§6.3, §6.4)


@dataclass
class FileRef:
    """A key run (`count` = entries) or a samples table part (`count` = samples)."""

    file: str
    bytes: int
    blake3: bytes
    count: int


@dataclass
class SegmentSpec:
    file: str
    level: int
    first_seq: int
    first_ordinal: int
    samples: int
    shards: list
    keys: FileRef
    tables: list


def parse_segments(root: Path, m: dict, dataset_id: str) -> tuple:
    """Version 4: (segment specs, the shard list they make) (§6.3)."""
    entries = m.get("segments")
    need(isinstance(entries, list), "§6.3: segments is not a list")
    segments = []
    shards = []
    seq = 0
    ordinal = 0
    for i, e in enumerate(entries):
        where = f"segment {i}"
        need(isinstance(e, dict) and set(e) == SEGMENT_ENTRY_KEYS, f"§6.3 {where}: keys")
        need(plain_name(e["file"]), f"§6.3 {where}: file {e['file']!r} is not a plain name")
        for k in ("bytes", "level", "first_seq", "shards", "first_ordinal", "samples"):
            need(is_uint(e[k]), f"§6.3 {where}: {k} is not an unsigned integer")
        need(is_hex64(e["blake3"]), f"§6.3 {where}: blake3 is not 64 hex digits")
        need(e["level"] <= MAX_LEVEL, f"§6.3 {where}: level {e['level']} not in 0..=32")
        need(
            e["first_seq"] == seq,
            f"§6.3 {where}: first_seq {e['first_seq']} is not the running sum of shards ({seq})",
        )
        need(
            e["first_ordinal"] == ordinal,
            f"§6.3 {where}: first_ordinal {e['first_ordinal']} is not the running sum of "
            f"samples ({ordinal})",
        )
        seg = read_segment(root, e, dataset_id)
        segments.append(seg)
        shards += seg.shards
        seq += e["shards"]
        ordinal += e["samples"]
        need(ordinal <= U64_MAX, "§6: shard samples, bytes or raw_bytes add up to 2^64 or more")
    need(m.get("samples") == ordinal, "§6.3: samples is not the sum of the segments' samples")
    return segments, shards


def read_segment(root: Path, e: dict, dataset_id: str) -> SegmentSpec:
    """A segment file, checked against its manifest entry `e` (§6.3)."""
    name = e["file"]
    need(e["bytes"] <= 256 * MIB, f"§6.3 {name}: a segment file is larger than 256 MiB")
    data = read_listed(root, name, e["bytes"], "§6.3", f"segment {name}")
    need(b3(data).hex() == e["blake3"], f"§6.3 {name}: BLAKE3 differs from the manifest's entry")
    s = load_json(root / name, "§6.3", name, data)
    need(isinstance(s, dict), f"§6.3 {name}: not an object")
    need(s.get("format") == "hspack-segment", f'§6.3 {name}: format is not "hspack-segment"')
    version = s.get("version")
    need(
        not (is_uint(version) and version > SEGMENT_VERSION),
        f"§9 {name}: segment version {version} is newer than this reader knows (1): upgrade",
    )
    need(version == SEGMENT_VERSION, f"§9 {name}: segment version {version!r} is not 1")
    need(set(s) == SEGMENT_KEYS, f"§6.3 {name}: keys")
    need(s["dataset_id"] == dataset_id, f"§6.3 {name}: dataset_id differs from the manifest's")
    need(s["level"] == e["level"], f"§6.3 {name}: level differs from the manifest's entry")

    entries = s["shards"]
    need(isinstance(entries, list) and entries, f"§6.3 {name}: shards is not a non-empty list")
    need(
        isinstance(entries[0], dict) and entries[0].get("seq") == e["first_seq"],
        f"§6.3 {name}: first shard's seq differs from the manifest's first_seq",
    )
    need(
        entries[0].get("first_ordinal") == e["first_ordinal"],
        f"§6.3 {name}: first shard's first_ordinal differs from the manifest's entry",
    )
    need(
        len(entries) == e["shards"],
        f"§6.3 {name}: {len(entries)} shards, the manifest's entry says {e['shards']}",
    )
    shards = []
    ordinal = e["first_ordinal"]
    for i, sh in enumerate(entries):
        seq = e["first_seq"] + i
        shards.append(parse_shard_entry(sh, seq, ordinal, f"{name} shard {seq}"))
        ordinal += shards[-1].samples
    samples = ordinal - e["first_ordinal"]
    need(
        samples == e["samples"],
        f"§6.3 {name}: {samples} samples, the manifest's entry says {e['samples']}",
    )

    keys = parse_file_ref(s["keys"], "entries", f"{name} keys")
    need(
        keys.count == samples,
        f"§6.3 {name}: key run entries {keys.count} is not the segment's sample count {samples}",
    )
    need(
        keys.bytes == KEY_RUN_ENTRY_LEN * keys.count,
        f"§6.3 {name}: key run bytes {keys.bytes} is not 16 x entries ({keys.count})",
    )
    need(isinstance(s["tables"], list), f"§6.3 {name}: tables is not a list")
    tables = [parse_file_ref(t, "samples", f"{name} table {j}") for j, t in enumerate(s["tables"])]
    need(
        sum(t.count for t in tables) == samples,
        f"§6.3 {name}: its parts' samples do not add up to its samples ({samples})",
    )
    return SegmentSpec(
        name, e["level"], e["first_seq"], e["first_ordinal"], samples, shards, keys, tables
    )


def parse_file_ref(obj: object, count: str, where: str) -> FileRef:
    """`file`, `bytes`, `blake3` and `count` of a key run or a table part (§6.3)."""
    need(
        isinstance(obj, dict) and set(obj) == {"file", "bytes", "blake3", count},
        f"§6.3 {where}: keys",
    )
    need(plain_name(obj["file"]), f"§6.3 {where}: file {obj['file']!r} is not a plain name")
    need(is_uint(obj["bytes"]), f"§6.3 {where}: bytes is not an unsigned integer")
    need(is_uint(obj[count]), f"§6.3 {where}: {count} is not an unsigned integer")
    need(is_hex64(obj["blake3"]), f"§6.3 {where}: blake3 is not 64 hex digits")
    return FileRef(obj["file"], obj["bytes"], bytes.fromhex(obj["blake3"]), obj[count])


def read_file_ref(root: Path, ref: FileRef, sec: str, what: str) -> bytes:
    data = read_listed(root, ref.file, ref.bytes, sec, what)
    need(b3(data) == ref.blake3, f"{sec} {what}: BLAKE3 differs from its segment's")
    return data


def key_hash(key: str) -> int:
    """§3.5, §6.4: the first 8 bytes of BLAKE3 of the key, as a LE u64."""
    return int.from_bytes(b3(key.encode("utf-8"))[:8], "little")


def check_key_run(root: Path, seg: SegmentSpec, samples: list) -> None:
    """§6.4: the run's bytes, its order, and one entry (hash, ordinal) per sample of `samples`
    (the segment's, read from its shards)."""
    what = f"{seg.file} key run {seg.keys.file}"
    data = read_file_ref(root, seg.keys, "§6.4", what)
    need(
        len(data) == KEY_RUN_ENTRY_LEN * seg.keys.count,
        f"§6.4 {what}: {len(data)} bytes, not 16 x entries ({seg.keys.count})",
    )
    run = list(struct.iter_unpack("<QQ", data))
    for j in range(1, len(run)):
        need(
            run[j - 1] <= run[j],
            f"§6.4 {what}: entries {j - 1}, {j} not sorted by (hash, ordinal)",
        )
    want = sorted((key_hash(s.key), s.ordinal) for s in samples)
    bad = next((j for j, (g, w) in enumerate(zip(run, want)) if g != w), None)
    need(
        bad is None and len(run) == len(want),
        f"§6.4 {what}: entry {min(len(run), len(want)) if bad is None else bad} is not "
        f"(hash, ordinal) of the segment's samples",
    )


# §7: the columns of a samples table, in order, and the arrow types they may have.
TABLE_COLUMNS = (
    ("key", ("string", "large_string")),
    ("ordinal", ("uint64",)),
    ("shard", ("string", "large_string")),
    ("shard_seq", ("uint32",)),
    ("tokens", ("uint64",)),
    ("loss_tokens", ("uint64",)),
    ("bytes", ("uint64",)),
)


def check_table_part(root: Path, seg: SegmentSpec, j: int, rows: list) -> None:
    """§6.3, §7: part `j` of a segment: its bytes, and (where pyarrow is importable) its rows
    against `rows`, the §7 row of each sample it covers, in ordinal order."""
    part = seg.tables[j]
    what = f"{seg.file} table part {part.file}"
    data = read_file_ref(root, part, "§6.3", what)
    if pq is None:
        return  # the rows can be read only with a parquet reader
    try:
        table = pq.read_table(pa.BufferReader(data))
    except Exception as e:  # pyarrow raises several kinds
        raise SpecError(f"§7 {what}: not a parquet file: {e}") from e
    got = [(f.name, str(f.type)) for f in table.schema]
    need(
        len(got) == len(TABLE_COLUMNS)
        and all(g[0] == n and g[1] in t for g, (n, t) in zip(got, TABLE_COLUMNS)),
        f"§7 {what}: columns {got} are not §7's",
    )
    need(
        table.num_rows == part.count,
        f"§6.3 {what}: {table.num_rows} rows, its samples says {part.count}",
    )
    for r, (got, want) in enumerate(zip(table.to_pylist(), rows)):
        got = tuple(got[n] for n, _ in TABLE_COLUMNS)
        need(
            got[:2] == want[:2],
            f"§7 {what}: row {r} is (key, ordinal) {got[:2]}, the shards say {want[:2]}",
        )
        need(got == want, f"§7 {what}: row {r} is {got}, the shards say {want}")


def check_segment_files(root: Path, seg: SegmentSpec, shards: list, fields: list) -> None:
    """A segment's key run and table parts against its shards, read (§6.4, §7)."""
    specs = {s.seq: s for s in seg.shards}
    mask = any(f.role["kind"] == "loss_mask" for f in fields)
    samples = []
    rows = []
    for sh in shards[seg.first_seq : seg.first_seq + len(seg.shards)]:
        for s in sh.samples:
            samples.append(s)
            loss = s.loss_rows if mask else None
            rows.append((s.key, s.ordinal, specs[sh.seq].file, sh.seq, s.rows, loss, s.raw_bytes))
    check_key_run(root, seg, samples)
    start = 0
    for j, part in enumerate(seg.tables):
        check_table_part(root, seg, j, rows[start : start + part.count])
        start += part.count


# ---------------------------------------------------------------- codecs (§4)


def ungroup(data: bytes, n: int) -> bytes:
    """Inverse of §4's byte grouping for elements of n bytes."""
    if n == 1:
        return data
    m = len(data) // n
    body = np.frombuffer(data, dtype=np.uint8, count=m * n).reshape(n, m).T.reshape(-1)
    return body.tobytes() + data[m * n :]


def e4m3_value(code: int) -> float:
    """§4.1: the value of an E4M3FN code (NaN codes are refused by the caller)."""
    e, m = (code >> 3) & 0xF, code & 7
    v = m * 2.0**-9 if e == 0 else (8 + m) * 2.0 ** (e - 10)
    return -v if code & 0x80 else v


E4M3 = np.array([e4m3_value(c) for c in range(256)], dtype=np.float32)


def round_f32_to(values: np.ndarray, dtype: str) -> bytes:
    """§4.1: f32 values rounded to nearest, ties to even, to the field's dtype, as bytes."""
    if dtype == "f32":
        return values.astype("<f4").tobytes()
    if dtype == "f16":
        return values.astype("<f2").tobytes()
    bits = values.astype("<f4").view("<u4").astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype("<u2").tobytes()


def fp8_parts(stored: bytes, raw_elems: int, group: int, what: str) -> tuple:
    """§4.1: (scales as f32, codes as u8) of an fp8 payload, checked."""
    groups = raw_elems // group
    need(
        len(stored) == 4 * groups + raw_elems,
        f"§4.1 {what}: fp8 payload of {len(stored)} bytes, not 4·{groups} + {raw_elems}",
    )
    scales = np.frombuffer(stored, dtype="<f4", count=groups)
    codes = np.frombuffer(stored, dtype=np.uint8, offset=4 * groups)
    need(bool(np.all(np.isfinite(scales) & (scales > 0))), f"§4.1 {what}: a scale is not finite and positive")
    need(not bool(np.any((codes & 0x7F) == 0x7F)), f"§4.1 {what}: a NaN code")
    return scales, codes


def dequantize(stored: bytes, raw_len: int, dtype: str, group: int, what: str) -> bytes:
    """§4.1: an fp8 payload decoded to raw bytes of `dtype`."""
    elem = {"f16": 2, "bf16": 2, "f32": 4}[dtype]
    n = raw_len // elem
    scales, codes = fp8_parts(stored, n, group, what)
    values = E4M3[codes].reshape(-1, group) * scales.reshape(-1, 1)
    return round_f32_to(values.astype(np.float32).reshape(-1), dtype)


def decode_payload(codec: int, stored: bytes, raw_len: int, elem: int, what: str, fs=None) -> bytes:
    if codec == 0:
        return stored
    if codec == 3:
        return dequantize(stored, raw_len, DTYPES[fs.dtype][0], fs.group, what)
    try:
        params = zstandard.get_frame_parameters(stored)
    except zstandard.ZstdError as e:
        raise SpecError(f"§4 {what}: not a zstd frame: {e}") from e
    declared = params.content_size
    unknown = zstandard.CONTENTSIZE_UNKNOWN
    need(
        declared in (unknown, raw_len), f"§4 {what}: frame declares {declared} bytes, not {raw_len}"
    )
    try:
        out = zstandard.ZstdDecompressor().decompress(
            stored, max_output_size=raw_len, allow_extra_data=False
        )
    except zstandard.ZstdError as e:
        raise SpecError(f"§4 {what}: frame does not decode: {e}") from e
    need(
        len(out) == raw_len, f"§4 {what}: frame decodes to {len(out)} bytes, not raw_len {raw_len}"
    )
    return ungroup(out, elem) if codec == 2 else out


# ---------------------------------------------------------------- shard (§2, §3)


@dataclass
class Chunk:
    offset: int
    raw_len: int
    stored_len: int
    row_count: int
    sample: int
    row_start: int
    field: int
    codec: int
    dtype: int
    hash: bytes
    fp8: tuple = None  # §4.1: (scales, codes) of an fp8 chunk


@dataclass
class Sample:
    ordinal: int
    key: str
    rows: int
    loss_rows: int
    raw_bytes: int
    fields: dict = field(default_factory=dict)
    # §4.1: for each quantized field, (scales f32, codes u8) of its rows as stored.
    stored: dict = field(default_factory=dict)


@dataclass
class Shard:
    seq: int
    align_log2: int
    samples: list
    chunks: list


def read_shard(
    root: Path, spec: ShardSpec, fields: list, dataset_id: bytes, schema_hash: bytes
) -> Shard:
    data = (root / spec.file).read_bytes()
    n = len(data)
    where = spec.file
    need(n == spec.bytes, f"§6 {where}: file is {n} bytes, manifest says {spec.bytes}")
    need(n >= HEADER_LEN + FOOTER_LEN, f"§2 {where}: shorter than a header and a footer")

    # §2.1 ShardHeader
    h = data[:HEADER_LEN]
    need(h[0:8] == b"HSPKSHRD", f"§2.1 {where}: wrong header magic")
    need(u16(h, 8) == SHARD_VERSION, f"§9 {where}: header version {u16(h, 8)} is not 1")
    check_word(h, 120, f"§2.1 {where} header")
    align_log2 = h[10]
    need(6 <= align_log2 <= 20, f"§2.1 {where}: align_log2 {align_log2} not in 6..=20")
    zero(h, 11, 12, f"§2.1 {where} header")
    need(u32(h, 12) == spec.seq, f"§2.1 {where}: header shard_seq is not the manifest position")
    need(h[16:32] == dataset_id, f"§2.1 {where}: header dataset_id differs from the manifest")
    need(h[32:64] == schema_hash, f"§2.1 {where}: header schema_hash differs from the schema")
    zero(h, 64, 120, f"§2.1 {where} header")

    # §2.3 Footer
    f = data[n - FOOTER_LEN :]
    need(f[0:8] == b"HSPKFOOT" and f[120:128] == b"HSPKFOOT", f"§2.3 {where}: wrong footer magic")
    need(u16(f, 8) == SHARD_VERSION, f"§9 {where}: footer version {u16(f, 8)} is not 1")
    check_word(f, 112, f"§2.3 {where} footer")
    zero(f, 10, 12, f"§2.3 {where} footer")
    need(u32(f, 12) == spec.seq, f"§2.3 {where}: footer shard_seq is not the manifest position")
    need(f[16:32] == dataset_id, f"§2.3 {where}: footer dataset_id differs from the manifest")
    index_offset, index_len = u64(f, 32), u64(f, 40)
    need(index_offset >= HEADER_LEN, f"§2.3 {where}: index_offset < 128")
    need(
        index_offset + index_len == n - FOOTER_LEN,
        f"§2.3 {where}: index does not end at the footer",
    )
    need(u64(f, 104) == n, f"§2.3 {where}: footer file_len is not the file's length")
    index = data[index_offset : index_offset + index_len]
    index_hash = b3(index)
    need(f[48:80] == index_hash, f"§2.3 {where}: index hash differs from the footer")
    need(spec.index_blake3 == index_hash, f"§6 {where}: index hash differs from the manifest")

    # §3.1 IndexHeader
    need(index_len >= INDEX_HEADER_LEN, f"§3 {where}: index shorter than its header")
    need(index[0:8] == b"HSPKINDX", f"§3.1 {where}: wrong index magic")
    S, E, C, K, first_ordinal = (u64(index, o) for o in (8, 16, 24, 32, 40))
    zero(index, 48, 64, f"§3.1 {where} index header")
    want_len = INDEX_HEADER_LEN + SAMPLE_ENTRY_LEN * S + EXTENT_ENTRY_LEN * E + CHUNK_ENTRY_LEN * C
    want_len += KEY_ENTRY_LEN * S + K
    need(
        index_len == want_len,
        f"§3 {where}: index_len {index_len} disagrees with its header ({want_len})",
    )
    need(u64(f, 80) == S, f"§2.3 {where}: footer sample_count differs from the index")
    need(u64(f, 88) == C, f"§2.3 {where}: footer chunk_count differs from the index")
    need(u64(f, 96) == first_ordinal, f"§2.3 {where}: footer first_ordinal differs from the index")
    need(S == spec.samples, f"§6 {where}: sample count differs from the manifest")
    need(C == spec.chunks, f"§6 {where}: chunk count differs from the manifest")
    need(
        first_ordinal == spec.first_ordinal, f"§6 {where}: first_ordinal differs from the manifest"
    )

    sample_base = INDEX_HEADER_LEN
    extent_base = sample_base + SAMPLE_ENTRY_LEN * S
    chunk_base = extent_base + EXTENT_ENTRY_LEN * E
    key_base = chunk_base + CHUNK_ENTRY_LEN * C
    keys_base = key_base + KEY_ENTRY_LEN * S
    key_bytes = index[keys_base:]

    # §3.4 ChunkEntry, §2.2 ChunkHeader, §2 layout and padding
    chunks = []
    decoded = []
    pos = HEADER_LEN  # end of the last structure laid out
    align = 1 << align_log2
    for c in range(C):
        e = index[chunk_base + CHUNK_ENTRY_LEN * c :][:CHUNK_ENTRY_LEN]
        ch = Chunk(
            u64(e, 0),
            u64(e, 8),
            u64(e, 16),
            u64(e, 24),
            u64(e, 32),
            u64(e, 40),
            u16(e, 48),
            e[50],
            e[51],
            e[56:88],
        )
        cw = f"{where} chunk {c}"
        zero(e, 52, 56, f"§3.4 {cw} entry")
        zero(e, 88, 96, f"§3.4 {cw} entry")
        need(ch.field < len(fields), f"§3.4 {cw}: field {ch.field} >= field count")
        need(ch.codec in CODECS, f"§3.4 {cw}: unknown codec {ch.codec}")
        fs = fields[ch.field]
        need(
            (ch.codec == 3) == bool(fs.group),
            f"§4.1 {cw}: codec fp8 in a field the schema does not quantize, or another codec in one it does",
        )
        need(ch.dtype == fs.dtype, f"§3.4 {cw}: dtype differs from the field's")
        need(ch.row_count >= 1, f"§3.4 {cw}: row_count 0")
        need(
            ch.raw_len == ch.row_count * fs.row_bytes,
            f"§3.4 {cw}: raw_len is not row_count x row bytes",
        )
        need(ch.raw_len <= 256 * MIB, f"§3.4 {cw}: raw_len over 256 MiB")
        if ch.codec == 0:
            need(ch.stored_len == ch.raw_len, f"§3.4 {cw}: codec none with stored_len != raw_len")
        need(ch.offset >= pos, f"§3.4 {cw}: chunks not sorted by offset, or overlapping")
        end = ch.offset + HEADER_LEN + ch.stored_len
        need(end <= index_offset, f"§3.4 {cw}: chunk runs past index_offset")
        need(
            data[pos : ch.offset] == bytes(ch.offset - pos),
            f"§2 {cw}: padding before it is not zero",
        )
        if ch.codec == 0:
            need((ch.offset + HEADER_LEN) % align == 0, f"§2 {cw}: codec none payload not aligned")
        else:
            need(ch.offset == pos, f"§2 {cw}: a {CODECS[ch.codec]} chunk is padded")

        hd = data[ch.offset : ch.offset + HEADER_LEN]
        need(hd[0:8] == b"HSPKCHNK", f"§2.2 {cw}: wrong chunk magic")
        check_word(hd, 120, f"§2.2 {cw} header")
        zero(hd, 20, 24, f"§2.2 {cw} header")
        zero(hd, 96, 120, f"§2.2 {cw} header")
        need(u32(hd, 8) == c, f"§2.2 {cw}: chunk_id is not its position")
        need(u32(hd, 12) == spec.seq, f"§2.2 {cw}: shard_seq is not the shard's")
        same = (
            hd[16] == ch.codec
            and hd[17] == ch.dtype
            and u16(hd, 18) == ch.field
            and u64(hd, 24) == ch.sample
            and u64(hd, 32) == ch.row_start
            and u64(hd, 40) == ch.row_count
            and u64(hd, 48) == ch.raw_len
            and u64(hd, 56) == ch.stored_len
            and hd[64:96] == ch.hash
        )
        need(same, f"§2.2 {cw}: header disagrees with its chunk entry")
        stored = data[ch.offset + HEADER_LEN : end]
        need(b3(stored) == ch.hash, f"§3.4 {cw}: payload BLAKE3 differs from its entry")
        raw = decode_payload(ch.codec, stored, ch.raw_len, DTYPES[ch.dtype][1], cw, fs)
        if ch.codec == 3:
            ch.fp8 = fp8_parts(stored, ch.raw_len // DTYPES[ch.dtype][1], fs.group, cw)
        chunks.append(ch)
        decoded.append(raw)
        pos = end
    need(pos == index_offset, f"§2 {where}: the index does not follow the last payload directly")

    # §3.2 SampleEntry, §3.3 ExtentEntry
    loss_field = next((i for i, fs in enumerate(fields) if fs.role["kind"] == "loss_mask"), None)
    samples = []
    extent_next = 0
    for s in range(S):
        e = index[sample_base + SAMPLE_ENTRY_LEN * s :][:SAMPLE_ENTRY_LEN]
        sw = f"{where} sample {s}"
        ordinal, rows, key_offset = u64(e, 0), u64(e, 8), u64(e, 16)
        key_len, extent_count = u32(e, 24), u32(e, 28)
        extent_start, loss_rows, raw_bytes = u64(e, 32), u64(e, 40), u64(e, 48)
        zero(e, 56, 64, f"§3.2 {sw} entry")
        need(ordinal == first_ordinal + s, f"§3.2 {sw}: ordinal is not first_ordinal + position")
        need(key_offset + key_len <= K, f"§3.2 {sw}: key past the key bytes")
        try:
            key = key_bytes[key_offset : key_offset + key_len].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SpecError(f"§3.2 {sw}: key is not UTF-8") from exc
        need(extent_start == extent_next, f"§3.2 {sw}: extent_start is not the running sum")
        extent_next += extent_count
        need(extent_next <= E, f"§3.2 {sw}: extents past the extent table")
        if rows == 0:
            need(extent_count == 0, f"§3.3 {sw}: a sample with 0 rows has extents")
        out = {i: bytearray() for i in range(len(fields))}
        stored_rows = {i: ([], []) for i, fs in enumerate(fields) if fs.group}
        prev = None
        total = 0
        for x in range(extent_start, extent_start + extent_count):
            x_e = index[extent_base + EXTENT_ENTRY_LEN * x :][:EXTENT_ENTRY_LEN]
            xw = f"{sw} extent {x}"
            row_start, row_count, chunk_row = u64(x_e, 0), u64(x_e, 8), u64(x_e, 16)
            chunk, fld = u32(x_e, 24), u16(x_e, 28)
            zero(x_e, 30, 32, f"§3.3 {xw}")
            need(row_count >= 1, f"§3.3 {xw}: row_count 0")
            need(fld < len(fields), f"§3.3 {xw}: field {fld} >= field count")
            need(chunk < C, f"§3.3 {xw}: chunk {chunk} >= chunk count")
            need(
                prev is None or (fld, row_start) > prev,
                f"§3.3 {xw}: extents not sorted by (field, row_start)",
            )
            prev = (fld, row_start)
            # Each field's rows 0..rows are covered once: sorted extents must be contiguous.
            need(
                row_start == len(out[fld]) // fields[fld].row_bytes,
                f"§3.3 {xw}: a gap or an overlap",
            )
            need(row_start + row_count <= rows, f"§3.3 {xw}: past the sample's rows")
            ch = chunks[chunk]
            need(ch.field == fld, f"§3.3 {xw}: refers to a chunk of another field")
            need(chunk_row + row_count <= ch.row_count, f"§3.3 {xw}: past the chunk's rows")
            if ch.sample == ordinal:
                need(
                    ch.row_start + chunk_row == row_start,
                    f"§3.3 {xw}: chunk rows are other rows of this sample",
                )
            rb = fields[fld].row_bytes
            out[fld] += decoded[chunk][chunk_row * rb : (chunk_row + row_count) * rb]
            if ch.codec == 3:
                fs = fields[fld]
                per_row = fs.row_bytes // DTYPES[fs.dtype][1]
                scales, codes = ch.fp8
                g = per_row // fs.group
                stored_rows[fld][0].append(scales[chunk_row * g : (chunk_row + row_count) * g])
                stored_rows[fld][1].append(codes[chunk_row * per_row : (chunk_row + row_count) * per_row])
            total += row_count * rb
        for i, fs in enumerate(fields):
            need(len(out[i]) == rows * fs.row_bytes, f"§3.3 {sw}: field {fs.name} not covered")
        need(raw_bytes == total, f"§3.2 {sw}: raw_bytes is not the sum of its extents")
        if loss_field is None:
            need(loss_rows == U64_MAX, f"§3.2 {sw}: loss_rows is not u64::MAX without a loss mask")
        else:
            rb = fields[loss_field].row_bytes
            m = np.frombuffer(bytes(out[loss_field]), dtype=np.uint8).reshape(rows, rb)
            nonzero = int(np.count_nonzero(m.any(axis=1)))
            need(
                loss_rows == nonzero,
                f"§3.2 {sw}: loss_rows {loss_rows} but {nonzero} rows have a non-zero mask",
            )
        sample = Sample(ordinal, key, rows, loss_rows, raw_bytes)
        sample.stored = {
            fields[i].name: (
                np.concatenate(sc) if sc else np.zeros(0, "<f4"),
                np.concatenate(co) if co else np.zeros(0, np.uint8),
            )
            for i, (sc, co) in stored_rows.items()
        }
        sample.fields = {
            fields[i].name: decode_field(fields[i], bytes(b), rows) for i, b in out.items()
        }
        samples.append(sample)

    # §3.5 KeyEntry
    seen = []
    for k in range(S):
        e = index[key_base + KEY_ENTRY_LEN * k :][:KEY_ENTRY_LEN]
        h64, sample = u64(e, 0), u32(e, 8)
        zero(e, 12, 16, f"§3.5 {where} key entry {k}")
        need(sample < S, f"§3.5 {where} key entry {k}: sample {sample} >= sample count")
        want = int.from_bytes(b3(samples[sample].key.encode("utf-8"))[:8], "little")
        need(h64 == want, f"§3.5 {where} key entry {k}: hash is not BLAKE3 of the key")
        seen.append((h64, sample))
    need(seen == sorted(seen), f"§3.5 {where}: key entries not sorted by (hash, sample)")
    need(
        sorted(s for _, s in seen) == list(range(S)), f"§3.5 {where}: not one key entry per sample"
    )
    need(
        sum(s.raw_bytes for s in samples) == spec.raw_bytes,
        f"§6 {where}: raw_bytes differs from the sum of its samples' raw_bytes",
    )
    return Shard(spec.seq, align_log2, samples, chunks)


def decode_field(fs: FieldSpec, raw: bytes, rows: int) -> np.ndarray:
    """Rows of one field as an array of shape [rows, *shape] (§5: little-endian, C order).

    bf16 comes back as its uint16 bit patterns and the fp8 types as uint8 bit patterns.
    """
    name, elem, np_dtype = DTYPES[fs.dtype]
    if np_dtype is None:
        np_dtype = "<u2" if elem == 2 else "|u1"
    return np.frombuffer(raw, dtype=np.dtype(np_dtype)).reshape([rows, *fs.shape])


@dataclass
class Dataset:
    manifest: dict
    fields: list
    shards: list
    segments: list = field(default_factory=list)  # manifest version 4 (§6.3)

    def samples(self) -> list:
        return [s for sh in self.shards for s in sh.samples]


def read_dataset(root) -> Dataset:
    """Reads and checks a whole dataset: every structure, hash and payload."""
    root = Path(root)
    m, fields, shard_specs, dataset_id, schema_hash, segments = parse_manifest(root)
    shards = [read_shard(root, s, fields, dataset_id, schema_hash) for s in shard_specs]
    keys = [s.key for sh in shards for s in sh.samples]
    need(len(set(keys)) == len(keys), "§3.2: a key is not unique in the dataset")
    for sh, spec in zip(shards, shard_specs):
        total = sum(s.raw_bytes for s in sh.samples)
        need(total == spec.raw_bytes, f"§6 {spec.file}: raw_bytes differs from the manifest")
    for seg in segments:
        check_segment_files(root, seg, shards, fields)
    return Dataset(m, fields, shards, segments)
