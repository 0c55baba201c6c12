"""``hspack convert`` against real torch: every converted tensor is bitwise what ``torch.load``
returns.

Each test writes small dumps with ``torch.save`` in one of the layouts, runs the built binary
(``$HSPACK_BIN``, else ``target/debug/hspack`` under ``$CARGO_TARGET_DIR`` or the crate root,
built with cargo when missing), reads every sample back with ``hspack export --to
safetensors`` and ``safetensors.torch.load_file``, and compares bytes, dtype and shape.
"""

import gzip
import io
import os
import subprocess

import pytest
import torch
from safetensors.torch import load_file

CRATE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _binary():
    env = os.environ.get("HSPACK_BIN")
    if env:
        return env
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(CRATE, "target"))
    path = os.path.join(target, "debug", "hspack")
    if not os.path.exists(path):
        subprocess.run(["cargo", "build", "--bin", "hspack"], cwd=CRATE, check=True)
    return path


BIN = _binary()


def hspack(*args, ok=True):
    p = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True)
    if ok:
        assert p.returncode == 0, p.stderr
    return p


def read_sample(ds, key, tmp_path):
    out = tmp_path / "export.safetensors"
    hspack("export", ds, key, "--to", "safetensors", "-o", out, "--force")  # one file, read each time
    return load_file(str(out))


def same(got, want):
    """Bitwise equality with dtype and shape."""
    want = want.detach().contiguous()
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert tuple(got.shape) == tuple(want.shape), (got.shape, want.shape)
    assert torch.equal(got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8))


def keys(ds):
    out = hspack("ls", ds).stdout.splitlines()[1:]
    return [line.split()[-1] for line in out]


def g(seed):
    return torch.Generator().manual_seed(seed)


def save(obj, path, gz=False):
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        buf = io.BytesIO()
        torch.save(obj, buf)
        path.write_bytes(gzip.compress(buf.getvalue()))
    else:
        torch.save(obj, path)


def load(path):
    if str(path).endswith(".gz"):
        return torch.load(io.BytesIO(gzip.decompress(path.read_bytes())), weights_only=True)
    return torch.load(path, weights_only=True)


H = 16


def test_specforge(tmp_path):
    src = tmp_path / "src"
    files = {}
    for i, t in enumerate([5, 9, 1, 12]):
        gen = g(i)
        d = {
            "input_ids": torch.randint(0, 50000, (t,), generator=gen),
            "loss_mask": torch.randint(0, 2, (t,), generator=gen),
            "hidden_state": torch.randn(1, t, H, generator=gen).to(torch.bfloat16),
            "aux_hidden_state": torch.randn(1, t, 3 * H, generator=gen).to(torch.bfloat16),
        }
        name = f"rows_0-4/data_{i}.ckpt" + (".gz" if i == 2 else "")
        save(d, src / name, gz=i == 2)
        files[f"rows_0-4/data_{i}"] = src / name
    ds = tmp_path / "ds"
    hspack("convert", src, ds, "--layout", "specforge", "--layers", "2,30,58,61", "--num-layers", "61", "-q")
    split = tmp_path / "split"
    hspack("convert", src, split, "--layout", "specforge", "--layers", "2,30,58,61", "--num-layers", "61",
           "--split-layers", "-q")
    assert sorted(keys(ds)) == sorted(files)
    for key, path in files.items():
        want = load(path)
        got = read_sample(ds, key, tmp_path)
        same(got["input_ids"], want["input_ids"])
        same(got["loss_mask"], want["loss_mask"])
        aux = want["aux_hidden_state"][0]
        # One stacked field [T, 3, H]: read flat, it is EAGLE-3's [T, 3H] as saved.
        same(got["aux_hidden_state"], aux.reshape(-1, 3, H))
        same(got["aux_hidden_state"].reshape(-1, 3 * H), aux)
        same(got["hidden.61"], want["hidden_state"][0])
        got = read_sample(split, key, tmp_path)
        for j, layer in enumerate([2, 30, 58]):
            same(got[f"hidden.{layer}"], aux[:, j * H : (j + 1) * H])
        same(got["hidden.61"], want["hidden_state"][0])
    info = hspack("info", ds).stdout
    assert "hidden state, layer 61 after the final norm" in info
    assert "hidden states, layers 2, 30, 58 input" in info
    info = hspack("info", split).stdout
    assert "hidden state, layer 2 input" in info
    # The EAGLE-3 view over either output returns SpecForge's own tensors; over the stacked
    # output, aux_hidden_state is a view of the mapped shard, not a copy.
    from hspack.torch import HspackDataset

    for out, zero_copy in ((ds, True), (split, False)):
        view = HspackDataset(out, view="eagle3")
        for i in range(len(view)):
            want = load(files[view.hspack.sample(i).key])
            got = view[i]
            same(got["aux_hidden_state"], want["aux_hidden_state"][0])
            same(got["hidden_state"], want["hidden_state"][0])
            base, size = view.hspack.native.mapping_range(0)
            inside = base <= got["aux_hidden_state"].data_ptr() < base + size
            assert inside == (zero_copy and len(got["input_ids"]) > 0)


def test_specforge_refuses_without_layers(tmp_path):
    save({"input_ids": torch.ones(2, dtype=torch.long), "loss_mask": torch.ones(2, dtype=torch.long),
          "hidden_state": torch.zeros(1, 2, H), "aux_hidden_state": torch.zeros(1, 2, 3 * H)},
         tmp_path / "src" / "rows_0-1" / "data_0.ckpt")
    p = hspack("convert", tmp_path / "src", tmp_path / "ds", "--layout", "specforge", ok=False)
    assert p.returncode == 2 and "--layers" in p.stderr


def test_specforge_trim_padding(tmp_path):
    t, real = 10, 6
    ids = torch.arange(1, t + 1)
    ids[real:] = 0
    mask = torch.zeros(t, dtype=torch.long)
    mask[2:real] = 1
    d = {"input_ids": ids, "loss_mask": mask,
         "hidden_state": torch.randn(1, t, H, generator=g(5)).half(),
         "aux_hidden_state": torch.randn(1, t, 3 * H, generator=g(6)).half()}
    save(d, tmp_path / "src" / "rows_0-1" / "data_0.ckpt")
    for how, ds in [("ids", "a"), ("mask", "b")]:
        hspack("convert", tmp_path / "src", tmp_path / ds, "--layout", "specforge",
               "--layers", "1,2,3,4", "--num-layers", "4", "--trim-padding", how, "-q")
        got = read_sample(tmp_path / ds, "rows_0-1/data_0", tmp_path)
        same(got["input_ids"], ids[:real])
        same(got["hidden.4"], d["hidden_state"][0, :real])
        same(got["aux_hidden_state"][:, 1], d["aux_hidden_state"][0, :real, H : 2 * H])


def test_trim_padding_that_leaves_no_token_is_refused_and_deletes_nothing(tmp_path):
    """A sample whose loss mask is all zero (or whose ids are all the pad id) was stored with 0
    tokens, and --delete-source deleted its file, with the report saying nothing."""
    t = 8
    d = {"input_ids": torch.arange(1, t + 1), "loss_mask": torch.zeros(t, dtype=torch.long),
         "hidden_state": torch.randn(1, t, H, generator=g(7)).half(),
         "aux_hidden_state": torch.randn(1, t, 3 * H, generator=g(8)).half()}
    src = tmp_path / "src"
    save(d, src / "rows_0-1" / "data_0.ckpt")
    save({**d, "input_ids": torch.zeros(t, dtype=torch.long)}, src / "rows_0-1" / "data_1.ckpt")
    for how, file, why in [("mask", "data_0", "its loss mask is all zero"), ("ids", "data_1", "every token id is 0")]:
        p = hspack("convert", src, tmp_path / f"ds_{how}", "--layout", "specforge", "--layers", "1,2,3,4",
                   "--num-layers", "4", "--trim-padding", how, "--delete-source", "--delete-lossy-source", ok=False)
        assert p.returncode == 2, p.stderr
        assert f"{file}.ckpt" in p.stderr and f"sample `rows_0-1/{file}` no token ({why})" in p.stderr, p.stderr
        assert sorted(f.name for f in (src / "rows_0-1").iterdir()) == ["data_0.ckpt", "data_1.ckpt"]


def test_eagle(tmp_path):
    src = tmp_path / "src"
    files = {}
    for i in range(3):
        gen = g(10 + i)
        t = 3 + 4 * i
        d = {"input_ids": torch.randint(0, 1000, (t,), generator=gen),
             "hidden_state": torch.randn(t, H, generator=gen).to(torch.bfloat16),
             "loss_mask": torch.randint(0, 2, (t,), generator=gen)}
        save(d, src / "0" / f"data_{i}.ckpt")
        files[f"0/data_{i}"] = d
    ds = tmp_path / "ds"
    hspack("convert", src, ds, "--layout", "eagle", "--layers", "32", "--num-layers", "32", "-q")
    for key, d in files.items():
        got = read_sample(ds, key, tmp_path)
        same(got["hidden.32"], d["hidden_state"])
        same(got["input_ids"], d["input_ids"])
        same(got["loss_mask"], d["loss_mask"])


def test_modelopt(tmp_path):
    src = tmp_path / "src"
    convs = {}
    for i, t in enumerate([7, 4]):
        gen = g(20 + i)
        d = {"input_ids": torch.randint(0, 1000, (t,), generator=gen),
             "hidden_states": torch.randn(t, H, generator=gen).to(torch.bfloat16),
             "aux_hidden_states": torch.randn(t, 3 * H, generator=gen).to(torch.bfloat16),
             "conversation_id": f"conv-{i}"}
        save(d, src / f"conv-{i}.pt")
        convs[f"conv-{i}"] = d
    ds = tmp_path / "ds"
    hspack("convert", src, ds, "--layout", "modelopt", "--layers", "2,16,29,32", "--num-layers", "32", "-q")
    split = tmp_path / "split"
    hspack("convert", src, split, "--layout", "modelopt", "--layers", "2,16,29,32", "--num-layers", "32", "--split-layers", "-q")
    for key, d in convs.items():
        got = read_sample(ds, key, tmp_path)
        same(got["input_ids"], d["input_ids"])
        same(got["aux_hidden_state"].reshape(-1, 3 * H), d["aux_hidden_states"])
        same(got["hidden.32"], d["hidden_states"])
        got = read_sample(split, key, tmp_path)
        for j, layer in enumerate([2, 16, 29]):
            same(got[f"hidden.{layer}"], d["aux_hidden_states"][:, j * H : (j + 1) * H])
        same(got["hidden.32"], d["hidden_states"])


def test_speculators(tmp_path):
    src = tmp_path / "src"
    d = {"token_ids": torch.randint(0, 1000, (6,), generator=g(30)),
         "hidden_states": torch.randn(6, 3, H, generator=g(31)).to(torch.float16)}
    save(d, src / "0.pt")
    ds = tmp_path / "ds"
    p = hspack("convert", src, ds, "--layout", "speculators", "--layers", "3,10,20", ok=False)
    assert p.returncode == 2 and "--point" in p.stderr
    hspack("convert", src, ds, "--layout", "speculators", "--layers", "3,10,20",
           "--point", "layer-output", "-q")
    got = read_sample(ds, "0", tmp_path)
    same(got["input_ids"], d["token_ids"])
    same(got["hidden_states"], d["hidden_states"])
    # The last layer as the final-norm output: the first two stacked as aux, the last alone.
    eagle3 = tmp_path / "eagle3"
    hspack("convert", src, eagle3, "--layout", "speculators", "--layers", "3,10,20", "--num-layers", "20",
           "--point", "layer-input,layer-input,final-norm", "-q")
    got = read_sample(eagle3, "0", tmp_path)
    same(got["aux_hidden_state"], d["hidden_states"][:, :2])
    same(got["hidden.20"], d["hidden_states"][:, 2])
    split = tmp_path / "split"
    hspack("convert", src, split, "--layout", "speculators", "--layers", "3,10,20",
           "--point", "layer-output", "--split-layers", "-q")
    got = read_sample(split, "0", tmp_path)
    for j, layer in enumerate([3, 10, 20]):
        same(got[f"hidden.{layer}"], d["hidden_states"][:, j])


def test_generic_list_of_layers_and_views(tmp_path):
    src = tmp_path / "src"
    base = torch.randn(H, 5, generator=g(40))
    d = {"ids": torch.arange(5, dtype=torch.int32),
         "layers": [torch.randn(5, H, generator=g(41)), base.t(), torch.randn(1, 5, H).double()[:, :, :]]}
    save(d, src / "req_a.pt")
    ds = tmp_path / "ds"
    hspack("convert", src, ds, "--layout", "generic", "--field", "input_ids=ids",
           "--field", "hidden.3=layers.0", "--field", "hidden.7=layers.1",
           "--field", "extra=layers.2:role=other", "-q")
    got = read_sample(ds, "req_a", tmp_path)
    same(got["input_ids"], d["ids"])
    same(got["hidden.3"], d["layers"][0])
    same(got["hidden.7"], base.t())
    same(got["extra"], d["layers"][2][0])


def test_generic_stacked_fields(tmp_path):
    src = tmp_path / "src"
    t = 5
    d = {"ids": torch.arange(t), "cat": torch.randn(t, 3 * H, generator=g(42)).half(),
         "axis": torch.randn(1, t, 2, H, generator=g(43)),
         "aux": [torch.randn(t, H, generator=g(44 + i)).bfloat16() for i in range(3)]}
    save(d, src / "a.pt")
    ds = tmp_path / "ds"
    hspack("convert", src, ds, "--layout", "generic", "--field", "input_ids=ids",
           "--field", "cat=cat:layers=2,30,58", "--field", "axis=axis:layers=4,5:point=layer-output",
           "--field", "aux_hidden_state=aux.0+aux.1+aux.2:layers=2,30,58", "-q")
    got = read_sample(ds, "a", tmp_path)
    same(got["cat"], d["cat"].reshape(t, 3, H))
    same(got["axis"], d["axis"][0])
    same(got["aux_hidden_state"], torch.stack(d["aux"], dim=1))
    info = hspack("info", ds).stdout
    assert "hidden states, layers 4, 5 output" in info
    p = hspack("convert", src, tmp_path / "bad", "--layout", "generic", "--field", "x=aux.0+aux.1:layers=1,2,3",
               ok=False)
    assert p.returncode == 2 and "2 source tensors for 3 layers" in p.stderr, p.stderr


def test_generic_group_by_layer_files(tmp_path):
    src = tmp_path / "src"
    want = {}
    for r in range(3):
        t = 2 + r
        ids = torch.randint(0, 100, (t,), generator=g(50 + r))
        save(ids, src / f"req{r}" / "ids.pt")
        want[f"req{r}"] = {"input_ids": ids}
        for layer in (4, 9):
            h = torch.randn(t, H, generator=g(60 + r * 10 + layer)).to(torch.bfloat16)
            save(h, src / f"req{r}" / f"layer_{layer}.pt")
            want[f"req{r}"][f"hidden.{layer}"] = h
    ds = tmp_path / "ds"
    hspack("convert", src, ds, "--layout", "generic", "--group-by", "{key}/{part}.pt",
           "--field", "input_ids=ids", "--field", "hidden.4=layer_4", "--field", "hidden.9=layer_9", "-q")
    assert sorted(keys(ds)) == sorted(want)
    for key, fields in want.items():
        got = read_sample(ds, key, tmp_path)
        for name, t in fields.items():
            same(got[name], t)
    # A layer file of the wrong width or token count: the error names that file, not the
    # group's first.
    for bad in (torch.randn(4, H + 1).bfloat16(), torch.randn(7, H).bfloat16()):
        save(bad, src / "req1" / "layer_9.pt")
        p = hspack("convert", src, tmp_path / "bad", "--layout", "generic", "--group-by", "{key}/{part}.pt",
                   "--field", "input_ids=ids", "--field", "hidden.4=layer_4", "--field", "hidden.9=layer_9", ok=False)
        assert p.returncode == 2, p.stderr
        assert "req1/layer_9.pt" in p.stderr and "req1/ids.pt" not in p.stderr, p.stderr


@pytest.mark.parametrize("how", ["lengths", "cu_seqlens"])
def test_generic_batch_split(tmp_path, how):
    lengths = torch.tensor([3, 1, 5])
    n = int(lengths.sum())
    ids = torch.randint(0, 100, (n,), generator=g(70))
    hidden = torch.randn(n, 2 * H, generator=g(71)).to(torch.bfloat16)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int32), lengths.cumsum(0).to(torch.int32)])
    d = {"input_ids": ids, "hidden": hidden, "lengths": lengths, "cu_seqlens": offsets}
    save(d, tmp_path / "src" / "batch_000.pt")
    ds = tmp_path / "ds"
    hspack("convert", tmp_path / "src", ds, "--layout", "generic", "--split-by", f"{how}:{how}",
           "--field", "input_ids=input_ids", "--field", "hidden.5=hidden:part=0/2",
           "--field", "hidden.6=hidden:part=1/2", "-q")
    assert keys(ds) == ["batch_000/0", "batch_000/1", "batch_000/2"]
    start = 0
    for i, length in enumerate(lengths.tolist()):
        got = read_sample(ds, f"batch_000/{i}", tmp_path)
        same(got["input_ids"], ids[start : start + length])
        same(got["hidden.5"], hidden[start : start + length, :H])
        same(got["hidden.6"], hidden[start : start + length, H:])
        start += length


def test_bad_files_stop_or_are_listed(tmp_path):
    src = tmp_path / "src"
    good = {"input_ids": torch.arange(3), "loss_mask": torch.ones(3, dtype=torch.long),
            "hidden_state": torch.randn(3, H).bfloat16()}
    save(good, src / "0" / "data_0.ckpt")
    save(dict(good, hidden_state=torch.randn(3, H + 1).bfloat16()), src / "0" / "data_1.ckpt")
    (src / "0" / "data_2.ckpt").write_bytes(b"not a torch file at all")
    buf = io.BytesIO()
    torch.save(good, buf)
    (src / "0" / "data_3.ckpt").write_bytes(buf.getvalue()[:200])
    ds = tmp_path / "ds"
    p = hspack("convert", src, ds, "--layout", "eagle", "--layers", "9", "--num-layers", "9", ok=False)
    assert p.returncode == 2 and "data_1.ckpt" in p.stderr, p.stderr
    report = tmp_path / "bad.jsonl"
    # Skipped files make the run exit 3 (done, with files left out).
    p = hspack("convert", src, ds, "--layout", "eagle", "--layers", "9", "--num-layers", "9", "--skip-bad",
               "--report", report, "-q", ok=False)
    assert p.returncode == 3, p.stderr
    import json

    bad = [json.loads(line) for line in report.read_text().splitlines()]
    assert sorted(os.path.basename(b["file"]) for b in bad) == ["data_1.ckpt", "data_2.ckpt", "data_3.ckpt"]
    assert keys(ds) == ["0/data_0"]
    same(read_sample(ds, "0/data_0", tmp_path)["hidden.9"], good["hidden_state"])


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_unsupported_dtypes_only_fail_when_used(tmp_path, legacy):
    """In the legacy format too: there the file holds the bytes of the storages of tensors
    hspack does not store, and they were taken for missing ("the file is incomplete")."""
    src = tmp_path / "src"
    d = {"input_ids": torch.arange(4), "hidden_state": torch.randn(4, H, generator=g(80)).bfloat16(),
         "loss_mask": torch.ones(4, dtype=torch.long),
         "phase": torch.randn(4, 2, generator=g(81)).to(torch.complex64),
         "counts": torch.arange(4, dtype=torch.int32).to(torch.uint16),
         "big": torch.arange(3).to(torch.uint64)}
    (src / "0").mkdir(parents=True)
    torch.save(d, src / "0" / "data_0.ckpt", _use_new_zipfile_serialization=not legacy)
    ds = tmp_path / "ds"
    hspack("convert", src, ds, "--layout", "eagle", "--layers", "9", "--num-layers", "9", "-q")
    same(read_sample(ds, "0/data_0", tmp_path)["hidden.9"], d["hidden_state"])
    for field, dtype in [("phase", "complex64"), ("counts", "uint16")]:
        p = hspack("convert", src, tmp_path / f"ds_{field}", "--layout", "generic", "--field", "input_ids=input_ids",
                   "--field", f"x={field}:role=other", ok=False)
        assert p.returncode == 2, p.stderr
        assert "data_0.ckpt" in p.stderr and f'"{field}"' in p.stderr and dtype in p.stderr.lower(), p.stderr
        assert "re-save" in p.stderr, p.stderr


def test_two_tensors_of_one_name_and_a_missing_storage_are_named(tmp_path):
    """A key holding a dot beside nested dicts gives two tensors one name: refused, naming it
    (the first was read, the other unreachable); a storage the archive lacks is named as
    such, not as a missing tensor."""
    import zipfile

    src = tmp_path / "src"
    save({"input_ids": torch.arange(4), "a.b": torch.zeros(4, H).bfloat16(), "a": {"b": torch.ones(4, H).bfloat16()}},
         src / "x.pt")
    p = hspack("convert", src, tmp_path / "ds", "--layout", "generic", "--field", "input_ids=input_ids",
               "--field", "hidden.3=a.b", ok=False)
    assert p.returncode == 2, p.stderr
    assert "x.pt" in p.stderr and "2 tensors have the name `a.b`" in p.stderr, p.stderr
    # An archive without the entry of one storage.
    buf = io.BytesIO()
    torch.save({"input_ids": torch.arange(4), "hidden": torch.ones(4, H).bfloat16()}, buf)
    whole = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    storages = sorted(n for n in whole.namelist() if "/data/" in n and not n.endswith(".pkl"))
    cut = tmp_path / "cut"
    cut.mkdir()
    with zipfile.ZipFile(cut / "y.pt", "w", zipfile.ZIP_STORED) as z:
        for info in whole.infolist():
            if info.filename != storages[-1]:
                z.writestr(info, whole.read(info))
    p = hspack("convert", cut, tmp_path / "ds2", "--layout", "generic", "--field", "input_ids=input_ids",
               "--field", "hidden.3=hidden", ok=False)
    assert p.returncode == 2, p.stderr
    assert "y.pt" in p.stderr and "missing storage" in p.stderr and "missing tensor" not in p.stderr, p.stderr


def modelopt_dump(path, t, conversation_id, seed):
    gen = g(seed)
    d = {"input_ids": torch.randint(0, 1000, (t,), generator=gen),
         "hidden_states": torch.randn(t, H, generator=gen).to(torch.bfloat16),
         "aux_hidden_states": torch.randn(t, 3 * H, generator=gen).to(torch.bfloat16),
         "conversation_id": conversation_id}
    save(d, path)
    return d


def test_key_from_stored_id(tmp_path):
    src = tmp_path / "src"
    want = {"conv-a": modelopt_dump(src / "0.pt", 5, "conv-a", 90),
            "17": modelopt_dump(src / "1.pt", 3, 17, 91),
            "42": modelopt_dump(src / "2.pt", 4, torch.tensor([42]), 92)}
    ds = tmp_path / "ds"
    args = ("convert", src, ds, "--layout", "modelopt", "--layers", "2,16,29,32", "--num-layers", "32", "--key-from", "conversation_id", "-q")
    hspack(*args)
    assert sorted(keys(ds)) == sorted(want)
    for key, d in want.items():
        got = read_sample(ds, key, tmp_path)
        same(got["input_ids"], d["input_ids"])
        same(got["hidden.32"], d["hidden_states"])
    # Resume: converted files are not reopened or appended again; a new file goes on.
    want["conv-b"] = modelopt_dump(src / "3.pt", 2, "conv-b", 93)
    p = subprocess.run([BIN, *map(str, args[:-1])], capture_output=True, text=True)
    assert p.returncode == 0 and "3 already in the dataset" in p.stderr, p.stderr
    assert sorted(keys(ds)) == sorted(want)
    # A second file with a stored id already taken: an error naming both files.
    modelopt_dump(src / "4.pt", 2, "conv-a", 94)
    p = hspack(*args, ok=False)
    assert p.returncode == 2 and "0.pt" in p.stderr and "4.pt" in p.stderr and "conv-a" in p.stderr, p.stderr
    assert sorted(keys(ds)) == sorted(want)
    # Within one run too, and a value that is not a key is refused with the file named.
    p = hspack("convert", src, tmp_path / "ds2", "--layout", "modelopt", "--layers", "2,16,29,32", "--num-layers", "32",
               "--key-from", "conversation_id", ok=False)
    assert p.returncode == 2 and "0.pt" in p.stderr and "4.pt" in p.stderr, p.stderr
    (src / "4.pt").unlink()
    p = hspack("convert", src, tmp_path / "ds3", "--layout", "modelopt", "--layers", "2,16,29,32", "--num-layers", "32",
               "--key-from", "input_ids", ok=False)
    assert p.returncode == 2 and ".pt" in p.stderr and "one integer" in p.stderr, p.stderr


def test_delete_source_keeps_files_holding_values_a_dataset_does_not(tmp_path):
    """A dataset keeps tensors: ``--delete-source`` refuses, before anything is written or
    deleted, files holding a str or a number no ``--key-from`` reads (ModelOpt's
    ``conversation_id``, a prompt, a score), naming the file and the value; one read as the
    key goes with its file."""
    src = tmp_path / "src"
    for i, t in enumerate([5, 3]):
        modelopt_dump(src / f"{i}.pt", t, f"conv-{i}", 70 + i)
    args = ["convert", src, tmp_path / "ds", "--layout", "modelopt", "--layers", "2,16,29,32",
            "--num-layers", "32", "--delete-source", "-q"]
    p = hspack(*args, ok=False)
    assert p.returncode == 2, p.stderr
    assert "`conversation_id` (a str)" in p.stderr and "0.pt" in p.stderr and "--key-from conversation_id" in p.stderr, p.stderr
    assert sorted(f.name for f in src.iterdir()) == ["0.pt", "1.pt"]
    assert not (tmp_path / "ds").exists()
    # Read as the key, the id is held; a prompt and a score beside it are not.
    d = torch.load(src / "1.pt", weights_only=True)
    save({**d, "prompt": "Why is the sky blue?", "score": 0.5}, src / "1.pt")
    p = hspack(*args, "--key-from", "conversation_id", ok=False)
    assert p.returncode == 2 and "`prompt` (a str)" in p.stderr and "1.pt" in p.stderr, p.stderr
    assert sorted(f.name for f in src.iterdir()) == ["0.pt", "1.pt"]
    save(d, src / "1.pt")
    hspack(*args, "--key-from", "conversation_id")
    assert list(src.iterdir()) == []
    assert sorted(keys(tmp_path / "ds")) == ["conv-0", "conv-1"]
    got = read_sample(tmp_path / "ds", "conv-1", tmp_path)
    same(got["hidden.32"], d["hidden_states"])


def test_split_by_a_file_beside_each_batch(tmp_path):
    batches = {}
    for b, lengths in enumerate([[3, 1, 5], [2, 2]]):
        n = sum(lengths)
        d = {"input_ids": torch.randint(0, 100, (n,), generator=g(100 + b)),
             "hidden": torch.randn(n, 3 * H, generator=g(110 + b)).bfloat16()}
        save(d, tmp_path / "lens" / f"batch_{b}.pt")
        save(d, tmp_path / "cu" / f"batch_{b}.pt")
        save(torch.tensor(lengths, dtype=torch.int32), tmp_path / "lens" / f"batch_{b}.lens.pt")
        cu = torch.cat([torch.zeros(1, dtype=torch.long), torch.tensor(lengths).cumsum(0)])
        save({"cu": cu}, tmp_path / "cu" / f"batch_{b}.cu.pt")
        batches[b] = (d, lengths)
    fields = ("--field", "input_ids=input_ids", "--field", "aux_hidden_state=hidden:layers=2,30,58")
    for how, pattern, src in [("lengths", "{stem}.lens.pt", "lens"), ("cu_seqlens:cu", "{stem}.cu.pt", "cu")]:
        ds = tmp_path / f"ds_{src}"
        hspack("convert", tmp_path / src, ds, "--layout", "generic", "--split-by", how, "--split-by-file", pattern,
               *fields, "-q")
        assert keys(ds) == ["batch_0/0", "batch_0/1", "batch_0/2", "batch_1/0", "batch_1/1"]
        for b, (d, lengths) in batches.items():
            start = 0
            for i, n in enumerate(lengths):
                got = read_sample(ds, f"batch_{b}/{i}", tmp_path)
                same(got["input_ids"], d["input_ids"][start : start + n])
                same(got["aux_hidden_state"], d["hidden"][start : start + n].reshape(n, 3, H))
                start += n
    src = tmp_path / "lens"
    (src / "batch_1.lens.pt").unlink()
    p = hspack("convert", src, tmp_path / "missing", "--layout", "generic", "--split-by", "lengths",
               "--split-by-file", "{stem}.lens.pt", *fields, ok=False)
    assert p.returncode == 2 and "batch_1.pt" in p.stderr and "batch_1.lens.pt" in p.stderr, p.stderr
    save(torch.tensor([4, 4]), src / "batch_1.lens.pt")
    p = hspack("convert", src, tmp_path / "wrong", "--layout", "generic", "--split-by", "lengths",
               "--split-by-file", "{stem}.lens.pt", *fields, ok=False)
    assert p.returncode == 2 and "batch_1.pt" in p.stderr and "batch_1.lens.pt" in p.stderr, p.stderr
    assert "does not split the 4 tokens: its 2 lengths add up to 8" in p.stderr, p.stderr


def test_a_list_where_a_tensor_is_needed_is_said_to_be_a_list(tmp_path):
    """Token ids (or --split-by's lengths) saved as a Python list: the error listed the file's
    tensors, leaving the name out, as if the file lacked it."""
    src = tmp_path / "src"
    t = 8
    save({"input_ids": list(range(t)), "loss_mask": torch.ones(t, dtype=torch.long),
          "hidden_state": torch.randn(1, t, H, generator=g(90)).bfloat16(),
          "aux_hidden_state": torch.randn(1, t, 3 * H, generator=g(91)).bfloat16()}, src / "r" / "data_0.ckpt")
    p = hspack("convert", src, tmp_path / "a", "--layout", "specforge", "--layers", "1,2,3,4", "--num-layers", "4",
               ok=False)
    assert p.returncode == 2, p.stderr
    assert "`input_ids` is a list of 8 ints in this file, not a tensor" in p.stderr, p.stderr
    split = tmp_path / "split"
    save({"input_ids": torch.arange(6), "hidden": torch.randn(6, H, generator=g(92)), "seq_lens": [2, 4]},
         split / "p.pt")
    p = hspack("convert", split, tmp_path / "b", "--layout", "generic", "--split-by", "lengths:seq_lens",
               "--field", "input_ids=input_ids", "--field", "hidden.1=hidden", "--num-layers", "4", ok=False)
    assert p.returncode == 2, p.stderr
    assert "`seq_lens` is a list of 2 ints there, not a tensor" in p.stderr, p.stderr
