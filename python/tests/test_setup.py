"""python/setup.py's MLAFUSE_CUDA and MLAFUSE_TORCH_EXT switches, read without running setup():
every spelling maps to CMake's MLAF_CUDA (or to the torch extension's auto / on / off), and an
unknown value is an error rather than a guess."""
import ast
import os
import pathlib

import pytest

SETUP = pathlib.Path(__file__).resolve().parents[1] / "setup.py"
pytestmark = pytest.mark.skipif(not SETUP.exists(),
                                reason="not a source checkout (no python/setup.py beside tests/)")


def setup_fn(name):
    tree = ast.parse(SETUP.read_text())
    fn = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    assert fn, f"setup.py has no {name}()"
    ns = {"os": os}
    exec(compile(ast.Module(fn, []), str(SETUP), "exec"), ns)
    return ns[name]


def cuda_mode_fn():
    return setup_fn("cuda_mode")


@pytest.mark.parametrize("value,want", [(None, "AUTO"), ("auto", "AUTO"), ("0", "OFF"),
                                        ("off", "OFF"), ("1", "ON"), ("ON", "ON")])
def test_mlafuse_cuda(monkeypatch, value, want):
    if value is None:
        monkeypatch.delenv("MLAFUSE_CUDA", raising=False)
    else:
        monkeypatch.setenv("MLAFUSE_CUDA", value)
    assert cuda_mode_fn()() == want


def test_mlafuse_cuda_unknown(monkeypatch):
    monkeypatch.setenv("MLAFUSE_CUDA", "maybe")
    with pytest.raises(RuntimeError, match="MLAFUSE_CUDA='maybe'"):
        cuda_mode_fn()()


@pytest.mark.parametrize("value,want", [(None, "auto"), ("auto", "auto"), ("0", "off"),
                                        ("OFF", "off"), ("1", "on"), ("yes", "on")])
def test_mlafuse_torch_ext(monkeypatch, value, want):
    if value is None:
        monkeypatch.delenv("MLAFUSE_TORCH_EXT", raising=False)
    else:
        monkeypatch.setenv("MLAFUSE_TORCH_EXT", value)
    assert setup_fn("torch_ext_mode")() == want


def test_mlafuse_torch_ext_unknown(monkeypatch):
    monkeypatch.setenv("MLAFUSE_TORCH_EXT", "maybe")
    with pytest.raises(RuntimeError, match="MLAFUSE_TORCH_EXT='maybe'"):
        setup_fn("torch_ext_mode")()


def test_prebuilt_library(monkeypatch, tmp_path):
    """MLAFUSE_PREBUILT_LIBRARY: that file is bundled as it is (no CMake run); a missing one is an
    error, never a silent rebuild."""
    fn = setup_fn("build_library")
    lib = tmp_path / "libmlafuse.so"
    lib.write_bytes(b"\x7fELF")
    monkeypatch.setenv("MLAFUSE_PREBUILT_LIBRARY", str(lib))
    assert fn() == os.path.realpath(lib)
    monkeypatch.setenv("MLAFUSE_PREBUILT_LIBRARY", str(tmp_path / "missing.so"))
    with pytest.raises(RuntimeError, match="no such file"):
        fn()


def _schema_table():
    """mlafuse/_schemas.py's SCHEMAS, read without importing mlafuse (no library, no torch)."""
    import importlib.util

    path = SETUP.parent / "mlafuse" / "_schemas.py"
    spec = importlib.util.spec_from_file_location("_mlafuse_schemas", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.SCHEMAS


def test_one_schema_table():
    """The op schemas are written once, in mlafuse/_schemas.py: the compiled binding's sources
    define no op and hold no schema text, and they register a kernel (CPU and CUDA) for exactly
    the ops of the table."""
    import re

    schemas = _schema_table()
    assert all(s.startswith(name + "(") for name, s in schemas.items())
    text = "\n".join(p.read_text() for p in sorted((SETUP.parent / "csrc").iterdir())
                     if p.suffix in (".cpp", ".h"))
    for bad in ("TORCH_LIBRARY(", "TORCH_LIBRARY_FRAGMENT(", ".def(", "Tensor(a!)", ") -> ("):
        assert bad not in text, f"python/csrc has {bad!r}: schemas belong in _schemas.py"
    assert "TORCH_LIBRARY_IMPL(mlafuse, CPU" in text and "TORCH_LIBRARY_IMPL(mlafuse, CUDA" in text
    impls = re.findall(r'm\.impl\("(\w+)"', text)
    assert sorted(impls) == sorted(schemas), "csrc's kernels and the table name other ops"
