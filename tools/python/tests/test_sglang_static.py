"""Static check of the SGLang adapter against the pinned SGLang wheel.

The wheel is downloaded (``pip download --no-deps``) into a folder under the
system temp dir keyed by version, opened as a zip and parsed with ``ast``;
nothing from it is imported. Every entry of ``sglang_names.SGLANG_NAMES`` must
exist, and the adapter's mode groups must cover ``ForwardMode`` exactly.
Skipped only when the package index cannot be reached, and never in CI (``CI`` set), where
``.ci/run`` fetches the wheel first: there a missing wheel fails.
"""

import ast
import glob
import os
import re
import subprocess
import sys
import tempfile
import zipfile

import pytest

from hspack.capture import sglang_names as names

_OFFLINE = re.compile(
    r"NewConnectionError|Max retries exceeded|Temporary failure in name resolution|"
    r"Network is unreachable|Name or service not known|ConnectTimeout|ReadTimeout|"
    r"Connection refused|ProxyError|timed out",
)


@pytest.fixture(scope="module")
def wheel():
    folder = os.path.join(tempfile.gettempdir(), f"hspack-sglang-wheel-{names.SGLANG_VERSION}")
    os.makedirs(folder, exist_ok=True)
    found = glob.glob(os.path.join(folder, f"sglang-{names.SGLANG_VERSION}-*.whl"))
    if not found:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
             f"sglang=={names.SGLANG_VERSION}", "-d", folder],
            capture_output=True, text=True, timeout=900,
        )
        if proc.returncode != 0:
            text = proc.stdout + proc.stderr
            if _OFFLINE.search(text) and not os.environ.get("CI"):
                pytest.skip(f"package index unreachable: {_OFFLINE.search(text).group(0)}")
            pytest.fail(f"pip download sglang=={names.SGLANG_VERSION} failed:\n{text[-2000:]}")
        found = glob.glob(os.path.join(folder, f"sglang-{names.SGLANG_VERSION}-*.whl"))
    assert found, f"no sglang {names.SGLANG_VERSION} wheel in {folder}"
    with zipfile.ZipFile(found[0]) as z:
        yield z


class Source:
    """ast views of the wheel's files, parsed once."""

    def __init__(self, z):
        self.z = z
        self.trees = {}

    def tree(self, path):
        if path not in self.trees:
            self.trees[path] = ast.parse(self.z.read(path).decode("utf-8"), filename=path)
        return self.trees[path]

    def cls(self, path, name):
        for node in self.tree(path).body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return node
        raise AssertionError(f"{path}: no class {name}")

    def func(self, path, scope):
        cname, fname = scope.split(".")
        for node in self.cls(path, cname).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == fname:
                return node
        raise AssertionError(f"{path}: no method {scope}")


def params(fn):
    a = fn.args
    return [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]


def class_names(node):
    """Fields, members, methods and properties declared in a class body."""
    out = set()
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            out.add(item.target.id)
        elif isinstance(item, ast.Assign):
            out.update(t.id for t in item.targets if isinstance(t, ast.Name))
        elif isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.add(item.name)
    return out


def check(src, req):
    kind = req.kind
    if kind == "class":
        src.cls(req.path, req.name)
    elif kind == "function":
        top = {n.name for n in src.tree(req.path).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        assert req.name in top, f"{req.path}: no function {req.name}"
    elif kind == "method":
        assert req.name in class_names(src.cls(req.path, req.scope)), f"{req.path}: no {req.scope}.{req.name}"
    elif kind == "arg":
        assert req.name in params(src.func(req.path, req.scope)), f"{req.path}: {req.scope} has no parameter {req.name}"
    elif kind == "leading_args":
        want = req.name.split(",")
        got = params(src.func(req.path, req.scope))[1 : 1 + len(want)]
        assert got == want, f"{req.path}: {req.scope} starts with {got}, the adapter expects {want}"
    elif kind == "attr":
        fn = src.func(req.path, req.scope)
        assigned = {
            t.attr
            for n in ast.walk(fn)
            if isinstance(n, (ast.Assign, ast.AnnAssign))
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
            for t in ([t] if not isinstance(t, ast.Tuple) else t.elts)
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
        }
        assert req.name in assigned, f"{req.path}: {req.scope} never sets self.{req.name}"
    elif kind in ("field", "member"):
        assert req.name in class_names(src.cls(req.path, req.scope)), f"{req.path}: {req.scope} has no {req.name}"
    elif kind == "server_arg":
        declared = set()
        for path in src.z.namelist():
            if path.startswith(req.path) and path.endswith(".py"):
                for node in ast.walk(src.tree(path)):
                    if isinstance(node, ast.ClassDef):
                        declared |= {
                            i.target.id for i in node.body
                            if isinstance(i, ast.AnnAssign) and isinstance(i.target, ast.Name)
                        }
        assert req.name in declared, f"server argument {req.name} is not declared under {req.path}"
    else:
        raise AssertionError(f"unknown requirement kind {kind}")


def test_every_name_the_adapter_relies_on_exists(wheel):
    src = Source(wheel)
    failures = []
    for req in names.SGLANG_NAMES:
        try:
            check(src, req)
        except (AssertionError, KeyError) as e:
            failures.append(f"{req}: {e}")
    assert not failures, f"SGLang {names.SGLANG_VERSION} lacks:\n" + "\n".join(failures)


def test_mode_groups_cover_forward_mode_exactly(wheel):
    src = Source(wheel)
    node = src.cls("sglang/srt/model_executor/forward_batch_info.py", "ForwardMode")
    members = {
        t.id for i in node.body if isinstance(i, ast.Assign) for t in i.targets if isinstance(t, ast.Name)
    }
    ours = set(names.MODES_CAPTURED) | set(names.MODES_IGNORED) | set(names.MODES_REFUSED)
    assert ours == members, f"unclassified: {sorted(members - ours)}, stale: {sorted(ours - members)}"


def test_the_checker_fails_on_a_missing_name(wheel):
    src = Source(wheel)
    bogus = names.Requirement("sglang/srt/model_executor/forward_batch_info.py", "field", "ForwardBatch", "no_such_field")
    with pytest.raises(AssertionError):
        check(src, bogus)
