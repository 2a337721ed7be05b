"""The DSA indexer ops (docs/dsa.md) on torch tensors: mlafuse.mla_kv_cache_dsa and
mlafuse.indexer_q through torch.ops.mlafuse.mla_kv_cache_dsa(_out) / indexer_q(_out), byte for
byte against the numpy (ctypes) path on the same data; errors; torch.library.opcheck of the four
ops; torch.compile(fullgraph=True) of a function calling both, with the caches written in place.
Skips (with a reason) without torch."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (numpy tests still run)")

import mlafuse  # noqa: E402
from mlafuse import _torch_ops  # noqa: E402

HAS_CUDA = torch.cuda.is_available() and mlafuse.backend_available("cuda")
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not HAS_CUDA, reason="no CUDA device visible to torch (or a CPU-only library)"))]
INDEXER_OPS = {"mla_kv_cache_dsa", "mla_kv_cache_dsa_out", "indexer_q", "indexer_q_out"}

try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None
DTYPES = [torch.float32, torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    ml_dtypes is None, reason="ml_dtypes is not installed (numpy bfloat16)"))]


def to_np(t):
    """A numpy copy of a CPU or CUDA tensor, dtype kept (bfloat16 through ml_dtypes, fp8 as
    uint8)."""
    t = t.detach().cpu().clone()  # never the tensor's own memory (.numpy() would share it)
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8).numpy()
    return t.numpy()


def raw(x):
    """The bytes of a tensor or an array, as a uint8 numpy array (for exact comparisons)."""
    a = to_np(x) if isinstance(x, torch.Tensor) else x
    return np.ascontiguousarray(a).view(np.uint8)


def same(name, x, y, rel):
    """x equals y bit for bit, or (rel) within 1e-5 relative with the same non-finite values."""
    if rel:
        np.testing.assert_allclose(x.astype(np.float64), y.astype(np.float64), rtol=1e-5, atol=0,
                                   err_msg=name)
    else:
        assert np.array_equal(raw(x), raw(y)), name


def dsa_inputs(device, dtype, T=21, bs=16, seed=0):
    """Inputs of mla_kv_cache_dsa as torch tensors on device: strided index_k (a GEMM output's
    slice), an index cache with an odd block stride, a skipped and an out-of-range token."""
    g = torch.Generator().manual_seed(seed)
    Q, C, R, HI = 48, 128, 64, 32
    latent = torch.randn(T, Q + C + R + 8, generator=g).to(dtype)[:, 3:3 + Q + C + R]
    kw = (0.3 + torch.randn(T, 128 + HI, generator=g)).to(dtype)
    max_pos = 64
    pos = torch.randint(0, max_pos, (T,), generator=g)
    pos[4] = max_pos + 3  # counted in error_count, writes no rows
    nb = (T + bs - 1) // bs + 2
    slots = torch.randperm(nb * bs, generator=g)[:T]
    slots[2] = -1
    stride = bs * 132 + 7
    flat = torch.randint(0, 256, (nb * stride + 5,), generator=g, dtype=torch.uint8)
    a = dict(latent=latent, w_q=(1 + 0.1 * torch.randn(Q, generator=g)).to(dtype),
             w_kv=(1 + 0.1 * torch.randn(C, generator=g)).to(dtype),
             positions=pos, cos_sin=mlafuse.rope_table(max_pos, R, device="cpu"), slot_mapping=slots,
             kv_cache=torch.zeros(nb, bs, C + R, dtype=dtype), kw=kw,
             index_weight=1 + 0.2 * torch.randn(128, generator=g),
             index_bias=0.3 * torch.randn(128, generator=g), flat=flat,
             topk_fill=torch.zeros(T, 8, dtype=torch.int32),
             error_count=torch.zeros(1, dtype=torch.int32))
    a = {k: v.to(device) for k, v in a.items()}
    a["index_cache"] = a["flat"][3:].as_strided((nb, bs * 132), (stride, 1))
    a["index_k"] = a["kw"][:, :128]
    return a


def np_views(a):
    """The same inputs as numpy arrays (copies with the same layout)."""
    n = {k: to_np(v) for k, v in a.items() if k not in ("index_cache", "index_k", "latent")}
    nb, w = a["index_cache"].shape
    n["index_cache"] = np.lib.stride_tricks.as_strided(n["flat"][3:], shape=(nb, w),
                                                       strides=(a["index_cache"].stride(0), 1))
    n["index_k"] = n["kw"][:, :128]
    n["latent"] = to_np(a["latent"])
    return n


def dsa_call(a, **kw):
    return mlafuse.mla_kv_cache_dsa(
        a["latent"], a["w_q"], a["w_kv"], a["positions"], a["cos_sin"], a["slot_mapping"],
        a["kv_cache"], a["index_k"], a["index_weight"], a["index_bias"], a["index_cache"],
        topk_fill=a["topk_fill"], error_count=a["error_count"], **kw)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("style,hadamard,scale", [("neox", False, "ue8m0"),
                                                  ("interleaved", True, "f32")])
@pytest.mark.parametrize("form", ["functional", "out"])
def test_mla_kv_cache_dsa_equals_numpy(device, dtype, style, hadamard, scale, form):
    a = dsa_inputs(device, dtype, seed=2 * hadamard + (form == "out"))
    n = np_views(a)
    ip = mlafuse.indexer_params(style, hadamard=hadamard, scale=scale)
    kw = dict(indexer=ip, return_k_nope=True, return_k_pe=True, style="neox", eps_q=1e-6)
    want = dsa_call(n, return_index_out=True, **kw)
    if form == "functional":
        got = dsa_call(a, return_index_out=True, **kw)
    else:  # given outputs go through mla_kv_cache_dsa_out and come back as they are
        T = a["latent"].shape[0]
        outs = dict(q=torch.full((T, 48), 7.0, dtype=dtype, device=device),
                    index_out=torch.full((T, 128), 7.0, dtype=dtype, device=device))
        got = dsa_call(a, **outs, **kw)
        assert got[0] is outs["q"] and got[3] is outs["index_out"]
    assert all(x is not None for x in got)
    # docs/conventions.md: f32 norm outputs agree within 1e-5 relative (the backends sum in different
    # orders); 16-bit ones, k_pe, the indexer key and every cache byte of it bit for bit
    normed = ("q", "k_nope", "kv_cache") if dtype == torch.float32 else ()
    for name, x, y in zip(("q", "k_nope", "k_pe", "index_out"), got, want):
        ok = [i for i in range(x.shape[0]) if i != 4]  # token 4 (bad position) writes nothing
        same(name, to_np(x[ok]), np.ascontiguousarray(y[ok]), name in normed)
    for name in ("kv_cache", "flat", "topk_fill", "error_count"):
        same(name, to_np(a[name]), np.ascontiguousarray(n[name]), name in normed)
    assert int(a["error_count"][0]) == 1
    assert bool((a["topk_fill"] == -1).all())


@pytest.mark.parametrize("device", DEVICES)
def test_mla_kv_cache_dsa_fp8_cache_and_in_place(device):
    """The cache-format arguments and index_out = index_k (in place) reach the op."""
    a = dsa_inputs(device, torch.bfloat16 if ml_dtypes else torch.float16, seed=3)
    a["kv_cache"] = torch.zeros(a["kv_cache"].shape, dtype=torch.uint8, device=device)
    n = np_views(a)
    k_scale, amax = torch.tensor([0.05], device=device), torch.zeros(1, device=device)
    nk, na = to_np(k_scale), np.zeros(1, np.float32)
    ip = mlafuse.indexer_params("interleaved")
    dsa_call(n, indexer=ip, index_out=n["index_k"], cache_format="fp8", k_scale=nk, amax_out=na)
    got = dsa_call(a, indexer=ip, index_out=a["index_k"], cache_format="fp8", k_scale=k_scale,
                   amax_out=amax)
    assert got[3] is a["index_k"]
    for name in ("kv_cache", "flat", "kw"):
        assert np.array_equal(raw(a[name]), np.ascontiguousarray(n[name]).view(np.uint8)), name
    assert float(amax[0]) == float(na[0]) > 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("hadamard,scale", [(False, "ue8m0"), (True, "f32")])
@pytest.mark.parametrize("form", ["functional", "out"])
def test_indexer_q_equals_numpy(device, dtype, hadamard, scale, form):
    g = torch.Generator().manual_seed(11 + hadamard)
    T, H = 13, 32
    q_idx = torch.randn(T, H, 136, generator=g).to(dtype)[:, :, 3:131].to(device)
    kw = torch.randn(T, 128 + H, generator=g).to(device)
    weights = kw[:, 128:]
    cos_sin = mlafuse.rope_table(32, 64, device=device)
    pos = torch.randint(0, 32, (T,), generator=g).to(device)
    pos[1] = 40  # out of range: counted, nothing written
    q_pe = torch.randn(T, 4, 192, generator=g).to(dtype).to(device)
    err = torch.zeros(1, dtype=torch.int32, device=device)
    nq_pe, nerr = to_np(q_pe), np.zeros(1, np.int32)
    ip = mlafuse.indexer_params("neox", hadamard=hadamard, scale=scale)
    wf, ww = mlafuse.indexer_q(to_np(q_idx), to_np(pos), to_np(cos_sin), to_np(weights),
                               indexer=ip, q_pe=nq_pe, q_pe_style="neox", error_count=nerr)
    if form == "functional":
        f, w = mlafuse.indexer_q(q_idx, pos, cos_sin, weights, indexer=ip, q_pe=q_pe,
                                 q_pe_style="neox", error_count=err)
        assert f.dtype == torch.float8_e4m3fn and w.dtype == torch.float32
    else:  # a uint8 q_fp8 given: the _out op
        q_fp8 = torch.zeros(T, H, 128, dtype=torch.uint8, device=device)
        f, w = mlafuse.indexer_q(q_idx, pos, cos_sin, weights, indexer=ip, q_fp8=q_fp8,
                                 q_pe=q_pe, q_pe_style="neox", error_count=err)
        assert f is q_fp8
    ok = [i for i in range(T) if i != 1]
    assert np.array_equal(raw(f[ok]), wf[ok].view(np.uint8))
    assert np.array_equal(raw(w[ok]), ww[ok].view(np.uint8))
    assert np.array_equal(raw(q_pe), np.ascontiguousarray(nq_pe).view(np.uint8))
    assert int(err[0]) == int(nerr[0]) == 1


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device):
    T = 3
    z = lambda *s, dt=torch.float32: torch.zeros(*s, dtype=dt, device=device)  # noqa: E731
    cos_sin = mlafuse.rope_table(8, 64, device=device)
    pos = z(T, dt=torch.int64)
    args = (z(T, 192), None, torch.ones(128, device=device), pos, cos_sin,
            torch.arange(T, device=device), z(T, 1, 192), z(T, 128), torch.ones(128, device=device),
            z(128))
    with pytest.raises(mlafuse.MlafError) as e:  # one byte short of 132 * block_size
        mlafuse.mla_kv_cache_dsa(*args, z(T, 131, dt=torch.uint8))
    assert e.value.status_name == "MLAF_ERR_SHAPE" and "index_cache.shape[1]" in e.value.message
    with pytest.raises(mlafuse.MlafError) as e:
        mlafuse.indexer_q(z(T, 4, 64), pos, cos_sin, z(T, 4))
    assert e.value.status_name == "MLAF_ERR_SHAPE" and "q_idx.shape[2]" in e.value.message
    with pytest.raises(mlafuse.MlafError) as e:
        mlafuse.indexer_q(z(T, 4, 128, dt=torch.float64), pos, cos_sin, z(T, 4))
    assert "q_idx.dtype = torch.float64" in e.value.message
    with pytest.raises(TypeError):
        mlafuse.mla_kv_cache_dsa(*args, np.zeros((T, 132), np.uint8))
    with pytest.raises(TypeError):
        mlafuse.indexer_q(z(T, 4, 128), pos, cos_sin, np.zeros((T, 4), np.float32))
    with pytest.raises(RuntimeError) as e:  # the raw op: "MLAF_ERR_...: message"
        torch.ops.mlafuse.indexer_q(z(T, 4, 64), pos, cos_sin, z(T, 4), 1, False, 1e-6, 1e-4, 0)
    assert str(e.value).startswith("MLAF_ERR_SHAPE: q_idx.shape[2]"), str(e.value)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    """torch.library.opcheck of the indexer ops: mutation annotations, fake implementations,
    AOT dispatch."""
    ops = torch.ops.mlafuse
    a = dsa_inputs(device, torch.float16, T=9, seed=5)
    a["positions"][4] = 1  # opcheck compares runs: every token writes
    T = a["latent"].shape[0]
    kv_in = (a["latent"], a["w_q"], a["w_kv"], a["positions"], a["cos_sin"], a["slot_mapping"],
             a["kv_cache"], a["error_count"], a["index_k"], a["index_weight"], a["index_bias"],
             a["index_cache"], a["topk_fill"])
    kv_p = (48, 128, 64, 1e-5, 1e-5, 0)
    idx_p = (1, True, 1e-6, 1e-4, 0)
    new = lambda *s, dt=torch.float16: torch.empty(*s, dtype=dt, device=device)  # noqa: E731
    g = torch.Generator().manual_seed(6)
    q_idx = torch.randn(T, 8, 128, generator=g).to(device, torch.bfloat16)
    weights = torch.randn(T, 8, generator=g).to(device)
    q_pe = torch.randn(T, 2, 96, generator=g).to(device, torch.bfloat16)
    # (indexer_q_out's q_fp8 as uint8: opcheck's schema check cannot compare mutated float8
    # tensors, "mul_cpu_reduced_float" not implemented for Float8_e4m3fn)
    cases = [
        (ops.mla_kv_cache_dsa, kv_in + kv_p + idx_p + (True, True, True)),
        (ops.mla_kv_cache_dsa_out, kv_in + (new(T, 48), None, new(T, 64), new(T, 128)) + kv_p
         + idx_p),
        (ops.indexer_q, (q_idx, a["positions"], a["cos_sin"], weights) + idx_p
         + (q_pe, 1, a["error_count"])),
        (ops.indexer_q_out, (q_idx, a["positions"], a["cos_sin"], weights,
                             new(T, 8, 128, dt=torch.uint8), new(T, 8, dt=torch.float32))
         + idx_p),
    ]
    assert {op._qualified_op_name.split("::")[1] for op, _ in cases} == INDEXER_OPS
    assert INDEXER_OPS <= set(_torch_ops.SCHEMAS)
    for op, args in cases:
        torch.library.opcheck(op, args)


# ---- torch.compile -------------------------------------------------------------------------
def _dsa_step(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, index_k,
              index_weight, index_bias, index_cache, topk_fill, error_count, q_idx, weights,
              ip):
    q_lat, _, _, _ = mlafuse.mla_kv_cache_dsa(
        latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, index_k, index_weight,
        index_bias, index_cache, indexer=ip, topk_fill=topk_fill, error_count=error_count)
    T = latent.shape[0]
    q_pe = (q_lat.float() @ torch.ones(q_lat.shape[1], 2 * 96, device=latent.device) * 0.01).to(
        latent.dtype).view(T, 2, 96)
    q_fp8, w_out = mlafuse.indexer_q(q_idx, positions, cos_sin, weights, indexer=ip, q_pe=q_pe,
                                     error_count=error_count)
    return q_pe, q_fp8.view(torch.uint8), w_out


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    """One graph; the kv cache, the index cache (a strided view of a bigger buffer), topk_fill
    and error_count are written in place (no copy back, no functionalized op left); results
    equal eager."""
    from torch._inductor.utils import run_and_get_code

    def inputs(seed):
        a = dsa_inputs(device, torch.bfloat16, T=9, seed=seed)
        g = torch.Generator().manual_seed(seed)
        a["q_idx"] = torch.randn(9, 8, 128, generator=g).to(device, torch.bfloat16)
        a["weights"] = torch.randn(9, 8, generator=g).to(device)
        return a

    keys = ("latent", "w_q", "w_kv", "positions", "cos_sin", "slot_mapping", "kv_cache",
            "index_k", "index_weight", "index_bias", "index_cache", "topk_fill", "error_count",
            "q_idx", "weights")
    ip = mlafuse.indexer_params("neox", hadamard=True)
    a, b = inputs(1), inputs(1)
    want = _dsa_step(*(a[k] for k in keys), ip)
    torch._dynamo.reset()
    compiled = torch.compile(_dsa_step, fullgraph=True)
    got, codes = run_and_get_code(compiled, *(b[k] for k in keys), ip)
    code = "\n".join(codes)
    assert "torch.ops.mlafuse.mla_kv_cache_dsa.default(" in code
    assert "torch.ops.mlafuse.indexer_q.default(" in code
    for bad in (".copy_(", "aten.copy", "clone", "auto_functionalized"):
        assert bad not in code, f"{bad} in the compiled code:\n{code}"
    ok = [i for i in range(9) if i != 4]  # token 4 (bad position): its q_fp8, w_out unwritten
    for x, y in zip(want, got):
        assert torch.equal(x[ok], y[ok])
    for k in ("kv_cache", "flat", "topk_fill", "error_count"):
        assert torch.equal(a[k], b[k]), k
    assert int(b["error_count"][0]) == 2  # token 4's position, once per op


def test_indexer_params_as_op_arguments():
    """indexer_params' values reach the ops (and torch.compile) through op_args, which follows
    field assignments; a bare ctypes mlaf_indexer_params works eagerly; others are refused."""
    from mlafuse import _lib as L

    ip = mlafuse.indexer_params("neox", hadamard=True, scale="f32", ln_eps=1e-5)
    assert ip.op_args == (1, True, float(np.float32(1e-5)), float(np.float32(1e-4)), 1)
    ip.style, ip.hadamard = 0, 0
    assert ip.op_args[:2] == (0, False)
    g = torch.Generator().manual_seed(4)
    q_idx = torch.randn(3, 4, 128, generator=g)
    pos, cos_sin = torch.arange(3), mlafuse.rope_table(8, 64, device="cpu")
    w = torch.randn(3, 4, generator=g)
    bare = L.IndexerParams(0, 0, 1e-5, 1e-4, 1)  # the same settings, no op_args
    got = mlafuse.indexer_q(q_idx, pos, cos_sin, w, indexer=ip)
    want = mlafuse.indexer_q(q_idx, pos, cos_sin, w, indexer=bare)
    for x, y in zip(got, want):
        assert torch.equal(x.view(torch.uint8) if x.dtype == torch.float8_e4m3fn else x,
                           y.view(torch.uint8) if y.dtype == torch.float8_e4m3fn else y)
    other = mlafuse.indexer_q(q_idx, pos, cos_sin, w, indexer=mlafuse.indexer_params("neox"))
    assert not torch.equal(other[1], want[1]), "the settings reach the op"
    with pytest.raises(TypeError):
        mlafuse.indexer_q(q_idx, pos, cos_sin, w, indexer=(0, False, 1e-5, 1e-4, 1))
