"""Writes the hostile and broken inputs read by tests/convert_bad_files.rs.

Run from the crate root: python3 tests/bad_files/convert/make_bad_files.py
Only the standard library is needed; nothing here is ever unpickled.
"""

import collections
import gzip
import io
import os
import pickle
import struct
import tarfile
import zipfile

OUT = os.path.dirname(os.path.abspath(__file__))
MARKER = "/tmp/hspack-convert-test-pwned"


class Global:
    """Pickles as a GLOBAL opcode naming module.name, without importing it."""

    def __init__(self, module, name):
        self.module, self.name = module, name

    def __call__(self, *args):
        raise RuntimeError("never called")


class Call:
    """Pickles as REDUCE of a Global with args."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return (self.fn, self.args)


class Storage:
    def __init__(self, cls, key, numel):
        self.cls, self.key, self.numel = cls, key, numel


class Writer(pickle._Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            return ("storage", obj.cls, obj.key, "cpu", obj.numel)
        return None

    def save_global(self, obj, name=None):
        if isinstance(obj, Global):
            self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode())
            return
        return super().save_global(obj, name)

    def save(self, obj, save_persistent_id=True):
        if isinstance(obj, Global):
            return self.save_global(obj)
        return super().save(obj, save_persistent_id)


def dumps(obj):
    f = io.BytesIO()
    Writer(f, protocol=2).dump(obj)
    return f.getvalue()


def tensor(storage, offset, size, stride):
    return Call(
        Global("torch._utils", "_rebuild_tensor_v2"),
        storage,
        offset,
        size,
        stride,
        False,
        Call(Global("collections", "OrderedDict")),
    )


def torch_zip(path, pkl, storages=None, names=None, compress=zipfile.ZIP_STORED):
    names = names or {}
    with zipfile.ZipFile(os.path.join(OUT, path), "w", compression=compress) as z:
        def put(name, data):
            info = zipfile.ZipInfo(names.get(name, name), date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = compress
            z.writestr(info, data)

        put("archive/data.pkl", pkl)
        put("archive/byteorder", b"little")
        for key, data in (storages or {}).items():
            put(f"archive/data/{key}", data)
        put("archive/version", b"3\n")


def main():
    for f in os.listdir(OUT):
        if not f.endswith(".py"):
            os.remove(os.path.join(OUT, f))
    f32 = Global("torch", "FloatStorage")
    four = struct.pack("<4f", 1, 2, 3, 4)

    # Code execution attempts: the commands would create MARKER.
    torch_zip("os_system.pt", dumps(Call(Global("os", "system"), f"touch {MARKER}")))
    torch_zip("builtins_eval.pt", dumps({"x": Call(Global("builtins", "eval"), f"open('{MARKER}','w')")}))
    torch_zip("subprocess_popen.pt", dumps([Call(Global("subprocess", "Popen"), ["touch", MARKER])]))

    # A valid little file to corrupt below.
    good = dumps({"t": tensor(Storage(f32, "0", 4), 0, (2, 2), (2, 1))})
    torch_zip("valid_small.pt", good, {"0": four})

    # Tensor views that do not fit their storage, or overflow.
    torch_zip("storage_too_short.pt", dumps({"t": tensor(Storage(f32, "0", 4), 1, (2, 2), (2, 1))}), {"0": four})
    torch_zip("storage_entry_short.pt", good, {"0": four[:12]})
    torch_zip("shape_overflow.pt", dumps({"t": tensor(Storage(f32, "0", 4), 0, (2**62, 4), (4, 1))}), {"0": four})
    torch_zip("stride_overflow.pt", dumps({"t": tensor(Storage(f32, "0", 4), 0, (2, 2), (2**62, 1))}), {"0": four})
    torch_zip("negative_stride.pt", dumps({"t": tensor(Storage(f32, "0", 4), 3, (2,), (-1,))}), {"0": four})
    torch_zip("missing_storage.pt", good, {})

    # Zip structure tricks.
    torch_zip("path_dotdot.pt", good, {"0": four}, names={"archive/data/0": "archive/../../etc/0"})
    torch_zip("path_absolute.pt", good, {"0": four}, names={"archive/data/0": "/archive/data/0"})
    torch_zip("path_backslash.pt", good, {"0": four}, names={"archive/data/0": "archive\\data\\0"})
    torch_zip("deflated.pt", good, {"0": four}, compress=zipfile.ZIP_DEFLATED)
    torch_zip("no_data_pkl.pt", good, {"0": four}, names={"archive/data.pkl": "archive/model.pkl"})

    raw = open(os.path.join(OUT, "valid_small.pt"), "rb").read()
    eocd = raw.rindex(b"PK\x05\x06")
    cd = struct.unpack_from("<I", raw, eocd + 16)[0]
    # Central directory claims a 4 GiB entry (a zip bomb's declared size).
    bomb = bytearray(raw)
    struct.pack_into("<II", bomb, cd + 20, 0xFFFFFFF0, 0xFFFFFFF0)
    open(os.path.join(OUT, "declared_size_huge.pt"), "wb").write(bomb)
    # Central directory claims 65535 entries in a few hundred bytes.
    many = bytearray(raw)
    struct.pack_into("<HH", many, eocd + 8, 0xFFFE, 0xFFFE)
    open(os.path.join(OUT, "entry_count_huge.pt"), "wb").write(many)
    # The first entry claims 40 more bytes, running into the next entry's local header.
    ovl = bytearray(raw)
    size = struct.unpack_from("<I", raw, cd + 24)[0]
    struct.pack_into("<II", ovl, cd + 20, size + 40, size + 40)
    open(os.path.join(OUT, "overlapping_entries.pt"), "wb").write(ovl)

    # A storage byte changed after the archive was written: its CRC-32 no longer matches.
    crc = bytearray(raw)
    at = raw.index(four) + 5
    crc[at] ^= 0x40
    open(os.path.join(OUT, "crc_mismatch.pt"), "wb").write(crc)

    # The file cut short inside its storage entry: no end-of-central-directory record.
    cut = raw.index(four) + 6
    open(os.path.join(OUT, "truncated_zip.pt"), "wb").write(raw[:cut])

    # A gzip whose content is not a dump (1 MiB of zeros, a miniature of a gzip bomb).
    zeros = gzip.compress(bytes(1 << 20), compresslevel=9, mtime=0)
    open(os.path.join(OUT, "gzip_of_zeros.pt.gz"), "wb").write(zeros)

    # The pre-0.4 tar container.
    with tarfile.open(os.path.join(OUT, "legacy_tar.pt"), "w", format=tarfile.PAX_FORMAT) as t:
        for name in ["sys_info", "pickle", "storages", "tensors"]:
            data = pickle.dumps({}, protocol=2)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            t.addfile(info, io.BytesIO(data))

    # Legacy stream whose storage data is cut short.
    legacy = b"".join(
        [
            pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2),
            pickle.dumps(1001, protocol=2),
            pickle.dumps({"protocol_version": 1001, "little_endian": True}, protocol=2),
            good,
            pickle.dumps(["0"], protocol=2),
            struct.pack("<q", 4),
            four[:10],
        ]
    )
    open(os.path.join(OUT, "legacy_storage_short.pt"), "wb").write(legacy)

    # safetensors
    def st(name, header, data):
        h = header.encode()
        open(os.path.join(OUT, name), "wb").write(struct.pack("<Q", len(h)) + h + data)

    st("st_overlap.safetensors", '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', bytes(12))
    # One name twice: a JSON map keeps the last entry, and the first tensor would be lost.
    st("st_name_twice.safetensors", '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}', bytes(range(16)))
    st("st_past_end.safetensors", '{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}', bytes(8))
    st("st_bad_dtype.safetensors", '{"a":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}}', bytes(8))
    st("st_size_mismatch.safetensors", '{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', bytes(8))
    open(os.path.join(OUT, "st_header_huge.safetensors"), "wb").write(struct.pack("<Q", 2**40) + b"{}")

    # npy
    open(os.path.join(OUT, "npy_bad_version.npy"), "wb").write(b"\x93NUMPY\x09\x00\x10\x00{'descr': '<f4'}")
    hdr = b"{'descr': '<f4', 'fortran_order': False, 'shape': (1000, 1000), }"
    open(os.path.join(OUT, "npy_data_short.npy"), "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr + bytes(16))
    hdr = b"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }"
    open(os.path.join(OUT, "npy_structured.npy"), "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr + bytes(4))


if __name__ == "__main__":
    main()
