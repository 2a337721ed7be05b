"""The two torch bindings (the compiled extension and the ctypes custom ops): which one is
loaded, that both define the same schemas and raise the same errors, that torch.compile
traces the mlafuse calls into one graph with no copy of a mutated cache and no recompile,
the overhead benchmark, and the whole suite once more under the binding this process did
not load. Skips (with a reason) without torch."""
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (numpy tests still run)")

import mlafuse  # noqa: E402
from mlafuse import _torch_ops  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
EXT_PATH = _torch_ops.find_extension()
HAS_CUDA = torch.cuda.is_available() and mlafuse.backend_available("cuda")
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not HAS_CUDA, reason="no CUDA device visible to torch (or a CPU-only library)"))]


def _child_env(**extra):
    env = dict(os.environ)
    pkg_root = os.path.dirname(os.path.dirname(mlafuse.__file__))
    env["PYTHONPATH"] = os.pathsep.join([pkg_root] + (
        [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(extra)
    return env


def test_binding_selected():
    want = os.environ.get("MLAFUSE_BINDING", "auto").strip().lower() or "auto"
    assert mlafuse.BINDING in ("ext", "ctypes")
    if want in ("ext", "ctypes"):
        assert mlafuse.BINDING == want
    elif EXT_PATH is not None:
        assert mlafuse.BINDING == "ext", _torch_ops.BINDING_DETAIL
    else:
        assert mlafuse.BINDING == "ctypes"


def test_schemas_are_the_table():
    """Whichever binding serves the ops, their schemas are the one table's (_schemas.SCHEMAS),
    and they have fake implementations (torch.compile traces them)."""
    from mlafuse import _schemas

    assert _torch_ops.SCHEMAS is _schemas.SCHEMAS
    for name, schema in _schemas.SCHEMAS.items():
        op = getattr(torch.ops.mlafuse, name).default
        assert str(op._schema) == str(torch._C.parse_schema("mlafuse::" + schema)), name
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "Meta"), name


@pytest.mark.skipif(EXT_PATH is None, reason="no compiled torch extension here")
def test_extension_kernel_disagreeing_with_the_table(tmp_path):
    """The extension registers kernels only, and the table is defined after it is loaded: a
    kernel whose C++ signature disagrees with its schema makes the import fail, naming the op
    (a copy of the package whose table says int where the kernel takes a double)."""
    import shutil

    pkg = tmp_path / "mlafuse"
    shutil.copytree(os.path.dirname(mlafuse.__file__), pkg,
                    ignore=shutil.ignore_patterns("__pycache__"))
    table = pkg / "_schemas.py"
    text = table.read_text()
    bad = text.replace("int rope_dim, float eps_q, float eps_kv) -> ()\"),",
                       "int rope_dim, float eps_q, int eps_kv) -> ()\"),", 1)
    assert bad != text
    table.write_text(bad)
    env = dict(os.environ, PYTHONPATH=str(tmp_path), MLAFUSE_BINDING="ext",
               MLAFUSE_TORCH_EXT=EXT_PATH)
    p = subprocess.run([sys.executable, "-c", "import mlafuse"], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode != 0
    assert "ImportError: mlafuse: cannot define torch.ops.mlafuse.split_qk_norm_out" in p.stderr


@pytest.mark.parametrize("device", DEVICES)
def test_raw_op_errors(device):
    """torch.ops.mlafuse.* raise a RuntimeError reading "MLAF_ERR_...: <library message>"
    (MlafError itself under ctypes), which mlafuse.* turn into MlafError."""
    with pytest.raises(RuntimeError) as ei:
        torch.ops.mlafuse.split_qk_norm(torch.zeros(4, 1340, device=device),
                                        torch.ones(768, device=device),
                                        torch.ones(512, device=device), 768, 512, 64, 1e-5, 1e-5)
    assert str(ei.value).startswith("MLAF_ERR_SHAPE: latent.shape[1] = 1340"), str(ei.value)
    with pytest.raises(mlafuse.MlafError) as ei:
        mlafuse.moe_gate(torch.zeros(3, 64, device=device), top_k=65)
    assert ei.value.status_name == "MLAF_ERR_LIMIT" and "top_k = 65" in ei.value.message
    with pytest.raises(mlafuse.MlafError) as ei:
        mlafuse.rope_q(torch.zeros(2, 3, 16, device=device, dtype=torch.float64),
                       torch.zeros(2, dtype=torch.int64, device=device),
                       mlafuse.rope_table(8, 8, device=device))
    assert ei.value.status_name == "MLAF_ERR_DTYPE"
    assert "q.dtype = torch.float64" in ei.value.message


def test_set_num_threads_reaches_the_binding():
    """set_num_threads applies to the torch ops' contexts too: a count over the library's
    limit is rejected by the next call, whichever binding serves it."""
    latent = torch.zeros(2, 96)
    try:
        mlafuse.set_num_threads(100000)
        with pytest.raises(mlafuse.MlafError):
            mlafuse.split_qk_norm(latent, torch.ones(32), torch.ones(32))
    finally:
        mlafuse.set_num_threads(0)
    mlafuse.split_qk_norm(latent, torch.ones(32), torch.ones(32))


# ---- torch.compile: one graph, no copies, no recompiles ------------------------------------
def _step(latent, w_q, w_kv, positions, cos_sin, slots, caches, layer, logits, bias, err):
    kv_cache = caches[layer]  # a view of a bigger buffer, as engines keep per-layer caches
    q_lat, _, _ = mlafuse.mla_kv_cache(latent, w_q, w_kv, positions, cos_sin, slots, kv_cache,
                                       error_count=err)
    T = latent.shape[0]
    q = (q_lat.float() @ torch.ones(q_lat.shape[1], 2 * 24, device=latent.device)).to(
        latent.dtype).view(T, 2, 24)
    mlafuse.rope_q(q, positions, cos_sin, error_count=err)
    w, ids = mlafuse.moe_gate(logits, bias, config="glm-4.7-flash")
    k = kv_cache.view(-1, kv_cache.shape[-1])[slots.clamp(min=0)]  # the cache read after
    return q, w, ids, k.float().sum()


def _step_args(device, seed):
    g = torch.Generator().manual_seed(seed)
    T, Q, C, R = 5, 32, 64, 16
    latent = torch.randn(T, Q + C + R, generator=g).to(device, torch.bfloat16)
    return dict(latent=latent, w_q=torch.ones(Q, device=device),
                w_kv=torch.ones(C, device=device, dtype=torch.bfloat16),
                positions=torch.randint(0, 64, (T,), generator=g).to(device),
                cos_sin=mlafuse.rope_table(64, R, device=device),
                slots=torch.randperm(64, generator=g)[:T].to(device),
                caches=torch.zeros(3, 4, 16, C + R, dtype=torch.bfloat16, device=device),
                layer=1, logits=torch.randn(T, 64, generator=g).to(device),
                bias=torch.zeros(64, device=device),
                err=torch.zeros(1, dtype=torch.int32, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_writes_caches_in_place(device):
    """Under torch.compile the mutated cache (a view of the per-layer buffer), the error
    counter and q are written in place: the generated code calls the ops on the inputs
    themselves and copies none of them back; results match eager; new data reuses the graph."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(_step, fullgraph=True)
    a, b = _step_args(device, 1), _step_args(device, 1)
    want = _step(**a)
    got, codes = run_and_get_code(compiled, **b)
    code = "\n".join(codes)
    assert "torch.ops.mlafuse.mla_kv_cache_lean.default(" in code  # ranks from the shapes
    assert "torch.ops.mlafuse.rope_q.default(" in code
    for bad in (".copy_(", "aten.copy", "clone", "auto_functionalized"):
        assert bad not in code, f"{bad} in the compiled code:\n{code}"
    for x, y in zip(want, got):
        assert torch.equal(x, y)
    assert torch.equal(a["caches"], b["caches"]) and torch.equal(a["err"], b["err"])
    with torch._dynamo.config.patch(error_on_recompile=True):
        for seed in (2, 3):
            c, d = _step_args(device, seed), _step_args(device, seed)
            for x, y in zip(_step(**c), compiled(**d)):
                assert torch.equal(x, y)
            assert torch.equal(c["caches"], d["caches"])
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["graph_break"]


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device visible to torch (or a CPU-only "
                    "library)")
def test_compiled_follows_the_current_stream():
    """A compiled function run on a side stream, queued behind a long kernel that fills its
    input there, sees the filled input: the op reads torch's current stream on every call,
    also from compiled code."""
    torch._dynamo.reset()
    compiled = torch.compile(_step, fullgraph=True)
    a, b = _step_args("cuda", 4), _step_args("cuda", 4)
    compiled(**_step_args("cuda", 5))  # compile outside the timed part
    want = _step(**a)
    src = b["latent"].clone()
    b["latent"].zero_()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(50_000_000)
        b["latent"].copy_(src)
        got = compiled(**b)
    s.synchronize()
    for x, y in zip(want, got):
        assert torch.equal(x, y)
    assert torch.equal(a["caches"], b["caches"])


# ---- the overhead benchmark ----------------------------------------------------------------
def test_bench_overhead_runs():
    cmd = [sys.executable, "-m", "mlafuse.bench_overhead", "--device", "cpu", "--iters", "20",
           "--repeats", "1", "--json", "--rows", "plain,moe_gate",
           "--calls-per-graph", "2"]
    p = subprocess.run(cmd, env=_child_env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["binding"] == mlafuse.BINDING
    names = [r["name"] for r in res["rows"]]
    assert names == ["torch: plain launch", "mlafuse.moe_gate"]
    for r in res["rows"]:
        assert r["eager_us"] > 0 and r["compiled_us"] > 0 and r["compiled_k_us"] > 0
        assert r["graphs"] == 1


# ---- the other binding ---------------------------------------------------------------------
@pytest.mark.skipif(EXT_PATH is None, reason="no compiled torch extension here (pip install "
                    "--no-build-isolation ./python builds it where torch is installed)")
@pytest.mark.skipif(bool(os.environ.get("MLAFUSE_TEST_OTHER_BINDING")),
                    reason="already the run under the other binding")
def test_suite_under_the_other_binding():
    """The whole suite again, in a child process that loads the binding this one did not."""
    other = "ctypes" if mlafuse.BINDING == "ext" else "ext"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", HERE]
    p = subprocess.run(cmd, env=_child_env(MLAFUSE_BINDING=other, MLAFUSE_TEST_OTHER_BINDING="1"),
                       capture_output=True, text=True, timeout=1800)
    tail = "\n".join(p.stdout.strip().splitlines()[-25:])
    assert p.returncode == 0, f"MLAFUSE_BINDING={other}:\n{tail}\n{p.stderr[-2000:]}"
    print(f"MLAFUSE_BINDING={other}: {p.stdout.strip().splitlines()[-1]}")
