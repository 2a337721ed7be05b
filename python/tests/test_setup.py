"""python/setup.py's MLAFUSE_CUDA switch, read without running setup(): every spelling maps to
CMake's MLAF_CUDA, and an unknown value is an error rather than a guess."""
import ast
import os
import pathlib

import pytest

SETUP = pathlib.Path(__file__).resolve().parents[1] / "setup.py"


def cuda_mode_fn():
    tree = ast.parse(SETUP.read_text())
    fn = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "cuda_mode"]
    assert fn, "setup.py has no cuda_mode()"
    ns = {"os": os}
    exec(compile(ast.Module(fn, []), str(SETUP), "exec"), ns)
    return ns["cuda_mode"]


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
