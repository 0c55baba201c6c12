"""Writes the damaged files of this folder from the golden vectors.

Run from the repository root: python3 tests/bad_files/make_bad_files.py
Every file written here must be listed in tests/bad_files.rs with the error it must produce.
"""
import json
import pathlib

root = pathlib.Path(__file__).resolve().parents[2]
golden = root / "format-spec" / "golden" / "v1" / "none"
out = pathlib.Path(__file__).resolve().parent

manifest = json.loads((golden / "manifest.json").read_text())
shard = (golden / "shard-000000.hsp").read_bytes()


def write(name, data):
    (out / name).write_bytes(data if isinstance(data, bytes) else data.encode())


m = dict(manifest, version=99)
write("manifest_future_version.json", json.dumps(m))
write("manifest_truncated.json", (golden / "manifest.json").read_text()[:200])
m = json.loads(json.dumps(manifest))
m["shards"][0]["file"] = "../../etc/passwd"
write("manifest_path_escape.json", json.dumps(m))
m = json.loads(json.dumps(manifest))
# Refused by the naming rule of fields, which is checked before `schema_blake3`.
m["schema"]["fields"][0]["name"] = "../../PWN"
write("manifest_field_name_escape.json", json.dumps(m))
m = json.loads(json.dumps(manifest))
m["samples"] += 1
write("manifest_wrong_total.json", json.dumps(m))

footer = shard[-128:]
write("footer_bad_end_magic.bin", footer[:-1] + b"X")
write("footer_bad_check.bin", footer[:40] + bytes([footer[40] ^ 1]) + footer[41:])
write("footer_too_short.bin", footer[:100])

index_offset = int.from_bytes(footer[32:40], "little")
index_len = int.from_bytes(footer[40:48], "little")
index = shard[index_offset : index_offset + index_len]
write("index_bad_magic.bin", b"HSPKXXXX" + index[8:])
write("index_wrong_length.bin", index[:-1])
write("index_reserved_set.bin", index[:50] + b"\x01" + index[51:])

write("shard_header_future_version.bin", shard[:8] + b"\x02\x00" + shard[10:128])
write("shard_header_bad_check.bin", shard[:16] + bytes([shard[16] ^ 1]) + shard[17:128])
# The first chunk header: its offset is the first chunk entry's offset.
s = int.from_bytes(index[8:16], "little")
e = int.from_bytes(index[16:24], "little")
chunk0 = index_offset and 64 + 64 * s + 32 * e
offset = int.from_bytes(index[chunk0 : chunk0 + 8], "little")
chunk = shard[offset : offset + 128]
write("chunk_header_bad_magic.bin", b"HSPKCHNX" + chunk[8:])
write("chunk_header_bad_check.bin", chunk[:30] + bytes([chunk[30] ^ 4]) + chunk[31:])
print("wrote", len(list(out.glob("*.json"))) + len(list(out.glob("*.bin"))), "files")
