"""The quantized outputs of the MLA row ops on torch tensors (torch.ops.mlafuse.split_qk_norm_quant,
mla_kv_cache_quant, mla_kv_cache_dsa_quant and their _out forms, whichever binding serves them):
every quantized byte and scale equal to the numpy quantize pass of test_rms_norm_quant.py applied
to the dense output of the plain call (check_quantized of test_torch_rms_norm_quant.py, which also
checks the scales' layout and decoding), for every format, rounding and dtype; the dense outputs,
the caches of every cache format (a KVCache too), the index cache and the error count equal the
plain call's bit for bit; quantized-only calls; given outputs and out=; the fake implementations'
strides; opcheck; torch.compile; rejections naming the argument with nothing written. CPU here;
the CUDA cases skip without a GPU and a CUDA build."""
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the numpy tests still run)")

import mlafuse  # noqa: E402
from test_rms_norm_quant import FORMATS  # noqa: E402
from test_torch_rms_norm_quant import check_quantized  # noqa: E402

HAS_CUDA = torch.cuda.is_available() and mlafuse.backend_available("cuda")
NO_CUDA = "no CUDA device visible to torch, or a CPU-only mlafuse"
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason=NO_CUDA))]
ALL_FORMATS = FORMATS + [("fp8_1x128_cm", "f32"), ("fp8_1x128_cm", "ue8m0")]
FMT_IDS = [f"{f}-{s}" for f, s in ALL_FORMATS]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DT_IDS = ["f32", "f16", "bf16"]
GF, GS = mlafuse.ops.GEMM_FORMATS, mlafuse.ops.GEMM_SCALES


def u8(t):
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def same(a, b):
    return (a is not None and b is not None and a.shape == b.shape
            and torch.equal(u8(a).cpu(), u8(b).cpu()))


def quant_kw(fmt, scale, q=True, k=True):
    kw = {}
    if q:
        kw.update(q_format=fmt, q_scale=scale)
    if k:
        kw.update(k_nope_format=fmt, k_nope_scale=scale)
    return kw


def make(device, dtype, T=9, Q=384, C=256, R=64, seed=0):
    """latent (a strided slice; token 1's q part zero: groups of amax 0), w_q, w_kv."""
    g = torch.Generator().manual_seed(seed)
    wide = torch.randn(T, Q + C + R + 8, generator=g)
    if T > 1 and Q:
        wide[1, 3:3 + Q] = 0.0
    latent = wide.to(device=device, dtype=dtype)[:, 3:3 + Q + C + R]
    w_q = (1 + 0.1 * torch.randn(Q, generator=g)).to(device=device, dtype=dtype) if Q else None
    w_kv = (1 + 0.1 * torch.randn(C, generator=g)).to(device)
    return latent, w_q, w_kv


def kv_inputs(device, dtype, T=11, Q=384, C=256, R=64, bs=4, seed=0, special=True):
    """mla_kv_cache's inputs; with ``special``: token 2 skipped (slot -1), token 5 a slot past the
    cache and token 7 a position past the table (both counted); slot_mapping one shorter."""
    latent, w_q, w_kv = make(device, dtype, T, Q, C, R, seed)
    g = torch.Generator().manual_seed(seed + 1)
    max_pos = 32
    pos = torch.randint(0, max_pos, (T,), generator=g)
    nb = (T + bs - 1) // bs + 1
    slots = torch.randperm(nb * bs, generator=g)[:T - 1]
    if special and T > 7:
        slots[2], slots[5], pos[7] = -1, nb * bs + 3, max_pos + 1
    a = dict(latent=latent, w_q=w_q, w_kv=w_kv, positions=pos.to(device),
             cos_sin=mlafuse.rope_table(max_pos, R if R else 64, device=device),
             slot_mapping=slots.to(device))
    return a, nb, bs


def kv_call(a, cache, **kw):
    err = torch.zeros(1, dtype=torch.int32, device=a["latent"].device)
    r = mlafuse.mla_kv_cache(a["latent"], a["w_q"], a["w_kv"], a["positions"], a["cos_sin"],
                             a["slot_mapping"], cache, error_count=err, **kw)
    return r, err


# ---- every format, rounding and dtype ------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt,scale", ALL_FORMATS, ids=FMT_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_split_qk_norm_quant(device, fmt, scale, dtype):
    latent, w_q, w_kv = make(device, dtype, seed=len(fmt) + len(scale))
    q0, k0, pe0 = mlafuse.split_qk_norm(latent, w_q, w_kv)
    q, k, pe, qd, qs, kd, ks = mlafuse.split_qk_norm(latent, w_q, w_kv, **quant_kw(fmt, scale))
    assert same(q, q0) and same(k, k0) and same(pe, pe0)
    assert qd.dtype == torch.float8_e4m3fn and kd.dtype == torch.float8_e4m3fn
    check_quantized(q0, qd, qs, fmt, scale)
    check_quantized(k0, kd, ks, fmt, scale)
    r = mlafuse.split_qk_norm(latent, w_q, w_kv, return_q=False, return_k_nope=False,
                              return_k_pe=False, **quant_kw(fmt, scale))
    assert r[:3] == (None, None, None)
    assert all(same(x, y) for x, y in zip(r[3:], (qd, qs, kd, ks)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt,scale", ALL_FORMATS, ids=FMT_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_mla_kv_cache_quant(device, fmt, scale, dtype):
    """Every token's rows are quantized, the skipped and counted ones too; the cache and the
    error count are the plain call's."""
    a, nb, bs = kv_inputs(device, dtype, seed=3 * len(fmt) + len(scale))
    c0, c1, c2 = (torch.full((nb, bs, 320), -7.0, dtype=dtype, device=device) for _ in range(3))
    (q0, k0, _), e0 = kv_call(a, c0, return_k_nope=True)
    assert int(e0[0]) == 2
    r, e1 = kv_call(a, c1, **quant_kw(fmt, scale))
    assert same(r[0], q0) and r[1] is None and r[2] is None
    assert same(c1, c0) and torch.equal(e1, e0)
    check_quantized(q0, r[3], r[4], fmt, scale)
    check_quantized(k0, r[5], r[6], fmt, scale)
    r2, _ = kv_call(a, c2, return_q=False, **quant_kw(fmt, scale))
    assert r2[:3] == (None, None, None) and same(c2, c0)
    assert all(same(x, y) for x, y in zip(r2[3:], r[3:]))


def dsa_inputs(device, dtype, T=10, bs=4, seed=0, special=True):
    a, nb, _ = kv_inputs(device, dtype, T=T, Q=256, C=128, R=64, bs=bs, seed=seed,
                         special=special)
    g = torch.Generator().manual_seed(seed + 2)
    kw = (0.3 + torch.randn(T, 128 + 16, generator=g)).to(device=device, dtype=dtype)
    a.update(index_k=kw[:, :128],
             index_weight=(1 + 0.2 * torch.randn(128, generator=g)).to(device),
             index_bias=(0.3 * torch.randn(128, generator=g)).to(device))
    return a, nb, bs


def dsa_state(a, nb, bs):
    d, T = a["latent"].device, a["latent"].shape[0]
    return (torch.full((nb, bs, 192), -7.0, dtype=a["latent"].dtype, device=d),
            torch.full((nb, bs * 132 + 3), 0xA5, dtype=torch.uint8, device=d)[:, :bs * 132],
            torch.zeros(T, 4, dtype=torch.int32, device=d),
            torch.zeros(1, dtype=torch.int32, device=d),
            torch.full((T, 128), -7.0, dtype=a["latent"].dtype, device=d))


def dsa_call(a, st, **kw):
    kv, ic, topk, err, io = st
    return mlafuse.mla_kv_cache_dsa(a["latent"], a["w_q"], a["w_kv"], a["positions"],
                                    a["cos_sin"], a["slot_mapping"], kv, a["index_k"],
                                    a["index_weight"], a["index_bias"], ic, topk_fill=topk,
                                    error_count=err, **kw)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt,scale", ALL_FORMATS, ids=FMT_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_mla_kv_cache_dsa_quant(device, fmt, scale, dtype):
    a, nb, bs = dsa_inputs(device, dtype, seed=len(fmt) + 7 * len(scale))
    s0, s1, s2 = (dsa_state(a, nb, bs) for _ in range(3))
    q0, k0, _, _ = dsa_call(a, s0, return_k_nope=True, index_out=s0[4])
    r = dsa_call(a, s1, index_out=s1[4], **quant_kw(fmt, scale))
    assert len(r) == 8 and same(r[0], q0) and r[1] is None and r[3] is s1[4]
    assert all(same(x, y) for x, y in zip(s1, s0)), "caches, top-k fill, error count, index_out"
    check_quantized(q0, r[4], r[5], fmt, scale)
    check_quantized(k0, r[6], r[7], fmt, scale)
    r2 = dsa_call(a, s2, return_q=False, **quant_kw(fmt, scale))
    assert r2[:4] == (None, None, None, None)
    assert all(same(x, y) for x, y in zip(r2[4:], r[4:]))
    assert all(same(x, y) for x, y in zip(s2[:4], s0[:4]))


# ---- the cache formats ---------------------------------------------------------------------
def cache_case(name, device, dtype, nb, bs, C, R):
    """A fresh, poisoned cache of the named format: a KVCache, or the tensor and its keywords."""
    full = lambda *s, v=0xA5, dt=torch.uint8: torch.full(s, v, dtype=dt, device=device)  # noqa
    if name == "auto":
        return dict(kv_cache=full(nb, bs, C + R, v=-7.0, dt=dtype))
    if name == "fp8-k_scale":
        return dict(kv_cache=mlafuse.KVCache(
            full(nb, bs, C + R).view(torch.float8_e4m3fn), "fp8",
            k_scale=torch.tensor(0.03, device=device), amax_out=torch.zeros(1, device=device)))
    if name == "fp8-quant_scale-kpe":
        return dict(kv_cache=full(nb, bs, C), cache_format="fp8_e4m3",
                    quant_scale=torch.tensor([20.0], device=device), kpe_cache=full(nb, bs, R))
    if name == "fp8_ds_mla":
        return dict(kv_cache=mlafuse.KVCache(full(nb, bs, C + C // 32 + 2 * R), "fp8_ds_mla",
                                             tile_scale="ue8m0"))
    assert name == "fp8_v4"
    return dict(kv_cache=full(nb, bs, 584), cache_format="fp8_v4", kv_rope_tail=64)


def cache_tensors(c):
    kv = c["kv_cache"]
    if isinstance(kv, mlafuse.KVCache):
        return [kv.cache] + [t for t in (kv.amax_out, kv.kpe_cache) if t is not None]
    return [kv] + [c[k] for k in ("amax_out", "kpe_cache") if k in c]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cache", ["auto", "fp8-k_scale", "fp8-quant_scale-kpe", "fp8_ds_mla",
                                   "fp8_v4"])
@pytest.mark.parametrize("fmt,scale", [("fp8_1x128_mn", "f32"), ("fp8_1x128_ue8m0", "ue8m0"),
                                       ("mxfp8", "mx_ceil")])
def test_mla_kv_cache_quant_cache_formats(device, cache, fmt, scale):
    """Every cache format: its bytes (the amax, the separate rope array) the plain call's, the
    quantized outputs the quantize pass of the dense ones; fp8_v4 (kv_rope_tail) takes a
    quantized q only."""
    bf16 = cache in ("fp8_ds_mla", "fp8_v4")
    dtype = torch.bfloat16 if bf16 else torch.float16
    C, R = (512, 0 if cache == "fp8_v4" else 64) if bf16 else (256, 64)
    a, nb, bs = kv_inputs(device, dtype, Q=256, C=C, R=R, seed=5)
    if cache == "fp8_v4":
        a["slot_mapping"][5] = -1
    k_quant = cache != "fp8_v4"
    c0, c1 = (cache_case(cache, device, dtype, nb, bs, C, R) for _ in range(2))
    kv0, kv1 = c0.pop("kv_cache"), c1.pop("kv_cache")
    (q0, k0, _), e0 = kv_call(a, kv0, return_k_nope=True, **c0)
    r, e1 = kv_call(a, kv1, return_q=False, **quant_kw(fmt, scale, k=k_quant), **c1)
    assert r[0] is None and torch.equal(e1, e0)
    check_quantized(q0, r[3], r[4], fmt, scale)
    if k_quant:
        check_quantized(k0, r[5], r[6], fmt, scale)
    else:
        assert r[5] is None and r[6] is None


def test_cache_formats_write_the_plain_bytes():
    """The cache arrays of each format after a quantized call: the plain call's bytes."""
    for cache in ("auto", "fp8-k_scale", "fp8-quant_scale-kpe", "fp8_ds_mla", "fp8_v4"):
        bf16 = cache in ("fp8_ds_mla", "fp8_v4")
        dtype = torch.bfloat16 if bf16 else torch.float16
        C, R = (512, 0 if cache == "fp8_v4" else 64) if bf16 else (256, 64)
        a, nb, bs = kv_inputs("cpu", dtype, Q=256, C=C, R=R, seed=6)
        if cache == "fp8_v4":
            a["slot_mapping"][5] = -1
        c0, c1 = (cache_case(cache, "cpu", dtype, nb, bs, C, R) for _ in range(2))
        t0, t1 = cache_tensors(c0), cache_tensors(c1)
        kv_call(a, c0.pop("kv_cache"), **c0)
        kv_call(a, c1.pop("kv_cache"), q_format="fp8_1x128", **c1,
                **({} if cache == "fp8_v4" else {"k_nope_format": "mxfp8"}))
        assert len(t0) == len(t1) and all(same(x, y) for x, y in zip(t0, t1)), cache


# ---- given outputs, out=, the functional ops and their fakes --------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_given_outputs_and_out(device):
    """Given outputs are written and returned as they are (an MN-major buffer's padding rows
    untouched, uint8 data taken); out= of 7 / 8; None entries allocated as the functional op
    allocates them."""
    latent, w_q, w_kv = make(device, torch.bfloat16, T=6, Q=256, C=512)
    f = dict(q_format="fp8_1x128_mn", k_nope_format="fp8_1x128_ue8m0")
    ref = mlafuse.split_qk_norm(latent, w_q, w_kv, **f)
    buf = torch.full((2, 12), -1.0, device=device)
    kbuf = torch.full((1, 8), -1, dtype=torch.int32, device=device)
    outs = (torch.empty(6, 256, dtype=torch.bfloat16, device=device),
            torch.empty(6, 512, dtype=torch.bfloat16, device=device),
            torch.empty(6, 64, dtype=torch.bfloat16, device=device),
            torch.zeros(6, 256, dtype=torch.uint8, device=device), buf[:, :6].t(),
            torch.zeros(6, 512, dtype=torch.float8_e4m3fn, device=device), kbuf[:, :6].t())
    got = mlafuse.split_qk_norm(latent, w_q, w_kv, out=outs, **f)
    assert all(g is o for g, o in zip(got, outs))
    assert all(same(g, r) for g, r in zip(got, ref))
    assert torch.all(buf[:, 6:] == -1.0) and torch.all(kbuf[:, 6:] == -1), "padding untouched"
    got = mlafuse.split_qk_norm(latent, w_q, w_kv, q_data=outs[3], k_nope_scales=outs[6], **f)
    assert got[3] is outs[3] and got[6] is outs[6] and all(same(g, r) for g, r in zip(got, ref))
    assert got[4].stride() == ref[4].stride()
    a, nb, bs = kv_inputs(device, torch.bfloat16, Q=256, C=256)
    qd = torch.zeros(11, 256, dtype=torch.uint8, device=device)
    r, _ = kv_call(a, torch.zeros(nb, bs, 320, dtype=torch.bfloat16, device=device),
                   q_format="fp8_1x128", out=(None, None, None, qd, None, None, None))
    assert r[3] is qd and r[0] is not None and r[4].shape == (11, 2) and r[5] is None
    a, nb, bs = dsa_inputs(device, torch.bfloat16)
    qd = torch.zeros(10, 256, dtype=torch.uint8, device=device)
    st = dsa_state(a, nb, bs)
    r = dsa_call(a, st, q_format="mxfp8", out=(None, None, None, None, qd, None, None, None))
    assert len(r) == 8 and r[4] is qd and r[5].shape == (10, 8) and r[5].dtype == torch.uint8
    with pytest.raises(ValueError, match="not both"):
        mlafuse.split_qk_norm(latent, w_q, w_kv, q_data=qd, out=(None,) * 7, **f)


OPS = ("split_qk_norm_quant", "mla_kv_cache_quant", "mla_kv_cache_dsa_quant")


def _functional_args(op, a, nb, bs, code, scale, returns):
    T = a["latent"].shape[0]
    q = (code, scale, 0.0, code, scale, 1e-4)
    if op == "split_qk_norm_quant":
        return (a["latent"], a["w_q"], a["w_kv"], 256, 128, 64, 1e-5, 1e-5) + q + returns
    kv = torch.zeros(nb, bs, 192, dtype=a["latent"].dtype)
    base = (a["latent"], a["w_q"], a["w_kv"], a["positions"], a["cos_sin"], a["slot_mapping"],
            kv, None)
    P = (256, 128, 64, 1e-5, 1e-5, 0)
    if op == "mla_kv_cache_quant":
        return base + P + q + returns
    ic = torch.zeros(nb, bs * 132, dtype=torch.uint8)
    idx = (a["index_k"], a["index_weight"], a["index_bias"], ic, torch.zeros(T, 4, dtype=torch.int32))
    return base + idx + P + (1, False, 1e-6, 1e-4, 0) + q + returns + (True,)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("fmt", ["fp8_1x128", "fp8_1x128_mn", "fp8_1x128_ue8m0", "mxfp8",
                                 "fp8_1x128_cm"])
@pytest.mark.parametrize("T", [0, 1, 7])
def test_functional_ops_and_their_fakes_agree(op, fmt, T):
    """The raw functional ops: not-requested outputs are [T, 0]; the fake implementations
    allocate the shapes, dtypes and strides the kernels return (torch.compile relies on it)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    a, nb, bs = dsa_inputs("cpu", torch.float32, T=max(T, 1), special=False)
    if T == 0:
        a = {k: (v[:0] if k in ("latent", "positions", "slot_mapping", "index_k") else v)
             for k, v in a.items()}
    code = GF[fmt]
    scale = GS["ue8m0" if fmt == "fp8_1x128_ue8m0" else "mx_floor" if fmt == "mxfp8" else "f32"]
    fn = getattr(torch.ops.mlafuse, op)
    for returns in ((True, True, True), (False, False, True)):
        args = _functional_args(op, a, nb, bs, code, scale, returns)
        real = fn(*args)
        with FakeTensorMode() as mode:
            fake = fn(*(mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in args))
        assert len(real) == len(fake) == (8 if op.endswith("dsa_quant") else 7)
        for x, y in zip(real, fake):
            assert (x.shape, x.dtype) == (y.shape, y.dtype)
            if x.numel():
                assert x.stride() == y.stride()
        assert real[0].shape == (T, 256 if returns[0] else 0)
        assert real[-4].shape == (T, 256) and real[-4].dtype == torch.float8_e4m3fn
    q = (0, 0, 0.0, code, scale, 0.0)  # k_nope only: q's quantized outputs are [T, 0]
    args = _functional_args(op, a, nb, bs, code, scale, (True, True, True))
    n = {"split_qk_norm_quant": 8, "mla_kv_cache_quant": 14, "mla_kv_cache_dsa_quant": 24}[op]
    real = fn(*(args[:n] + q + args[n + 6:]))
    assert real[-4].shape == (T, 0) and real[-3].shape == (T, 0) and real[-2].shape == (T, 128)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    """torch.library.opcheck of the six ops: mutation annotations, fake implementations, AOT
    dispatch (mutated data as uint8: opcheck cannot compare mutated float8 tensors; no counted
    tokens: their k_pe rows would differ between runs; T a multiple of 4: see
    test_torch_rms_norm_quant's opcheck)."""
    ops = torch.ops.mlafuse
    a, nb, bs = dsa_inputs(device, torch.bfloat16, T=8, special=False)
    T = 8
    new = lambda *s, dt=torch.bfloat16: torch.empty(*s, dtype=dt, device=device)  # noqa: E731
    mn, ue, mx, cm = GF["fp8_1x128_mn"], GF["fp8_1x128_ue8m0"], GF["mxfp8"], GF["fp8_1x128_cm"]
    q_mn = (mn, GS["ue8m0"], 0.0, mx, GS["mx_ceil"], 0.0)
    q_ue = (ue, GS["ue8m0"], 0.0, cm, GS["f32"], 1e-4)
    lat = (a["latent"], a["w_q"], a["w_kv"])
    split_p = (256, 128, 64, 1e-5, 1e-5)

    def kv():
        return torch.zeros(nb, bs, 192, dtype=torch.bfloat16, device=device)

    def base():
        return lat + (a["positions"], a["cos_sin"], a["slot_mapping"], kv(),
                      torch.zeros(1, dtype=torch.int32, device=device))

    def idx():
        return (a["index_k"], a["index_weight"], a["index_bias"],
                torch.zeros(nb, bs * 132, dtype=torch.uint8, device=device),
                torch.zeros(T, 4, dtype=torch.int32, device=device))

    def mn_outs():  # q_data, q_scales (fp8_1x128_mn, [T, 2] of a [2, T] buffer), k_nope's (mxfp8)
        return (new(T, 256, dt=torch.uint8), torch.zeros(2, T, device=device).t(),
                new(T, 128, dt=torch.uint8), new(T, 4, dt=torch.uint8))

    P = (256, 128, 64, 1e-5, 1e-5, 0)
    ip = (1, False, 1e-6, 1e-4, 0)
    cases = [
        (ops.split_qk_norm_quant, lat + split_p + q_mn),
        (ops.split_qk_norm_quant, lat + split_p + q_ue + (False, False, False)),
        (ops.split_qk_norm_quant_out, lat + (new(T, 256), None, new(T, 64)) + mn_outs() + split_p
         + q_mn),
        (ops.mla_kv_cache_quant, base() + P + q_mn + (False, True, True)),
        (ops.mla_kv_cache_quant_out, base() + (None, None, new(T, 64)) + mn_outs() + P + q_mn),
        (ops.mla_kv_cache_dsa_quant, base() + idx() + P + ip + q_ue + (True, True, False, True)),
        (ops.mla_kv_cache_dsa_quant_out, base() + idx() + (new(T, 256), None, None, new(T, 128))
         + mn_outs() + P + ip + q_mn),
    ]
    assert {op._qualified_op_name.split("::")[1] for op, _ in cases} == {
        n for o in OPS for n in (o, o + "_out")}
    for op, args in cases:
        torch.library.opcheck(op, args)


# ---- torch.compile -------------------------------------------------------------------------
def _step(latent, w_q, w_kv, positions, cos_sin, slots, kv_cache, err, k_data, k_scales):
    """A layer's MLA rows with an fp8 q_b_proj input: the quantized q only from mla_kv_cache, and
    split_qk_norm's quantized k_nope into given buffers."""
    _, _, _, q_data, q_scales, _, _ = mlafuse.mla_kv_cache(
        latent, w_q, w_kv, positions, cos_sin, slots, kv_cache, error_count=err, return_q=False,
        q_format="fp8_1x128_mn")
    mlafuse.split_qk_norm(latent, w_q, w_kv, return_k_pe=False, k_nope_format="fp8_1x128",
                          k_nope_data=k_data, k_nope_scales=k_scales)
    return q_data.view(torch.uint8), q_scales * 2


def _step_args(seed):
    a, nb, bs = kv_inputs("cpu", torch.bfloat16, T=6, Q=256, C=256, seed=seed)
    return (a["latent"], a["w_q"], a["w_kv"], a["positions"], a["cos_sin"], a["slot_mapping"],
            torch.zeros(nb, bs, 320, dtype=torch.bfloat16), torch.zeros(1, dtype=torch.int32),
            torch.zeros(6, 256, dtype=torch.uint8), torch.full((6, 2), -1.0))


def test_compile_one_graph_in_place():
    """torch.compile traces the quantized forms (fullgraph, one graph): the cache, the error
    count and the given quantized buffers are written in place (no copy, no functionalized op
    left); the results equal eager's; new data reuses the graph."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(_step, fullgraph=True)
    a, b = _step_args(1), _step_args(1)
    want = _step(*a)
    got, codes = run_and_get_code(compiled, *b)
    code = "\n".join(codes)
    assert "torch.ops.mlafuse.mla_kv_cache_quant.default(" in code
    assert "torch.ops.mlafuse.split_qk_norm_quant_out.default(" in code
    for bad in (".copy_(", "aten.copy", "auto_functionalized"):
        assert bad not in code, f"{bad} in the compiled code:\n{code}"
    assert all(same(x, y) for x, y in zip(want, got))
    assert all(same(x, y) for x, y in zip(a[6:], b[6:])), "cache, error count, k_nope's buffers"
    with torch._dynamo.config.patch(error_on_recompile=True):
        c, d = _step_args(2), _step_args(2)
        assert all(same(x, y) for x, y in zip(_step(*c), compiled(*d)))
        assert all(same(x, y) for x, y in zip(c[6:], d[6:]))
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]


# ---- rejections ----------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_rejections_name_the_argument_and_write_nothing(device):
    latent, w_q, w_kv = make(device, torch.float32, T=4, Q=200, C=240)
    full = lambda *s, v=3.0, dt=torch.float32: torch.full(s, v, dtype=dt, device=device)  # noqa
    q, k, pe = full(4, 200), full(4, 240), full(4, 64)
    qd, kd = full(4, 200, v=5, dt=torch.uint8), full(4, 240, v=5, dt=torch.uint8)

    def rejected(match, **kw):
        with pytest.raises(mlafuse.MlafError) as e:
            mlafuse.split_qk_norm(latent, w_q, w_kv, q=q, k_nope=k, k_pe=pe, **kw)
        assert match in e.value.message, e.value.message
        assert all(bool(torch.all(t == 3.0)) for t in (q, k, pe)), "nothing written"
        assert bool(torch.all(qd == 5)) and bool(torch.all(kd == 5)), "nothing written"

    rejected("quant->q: K = 200 values a row, expected a multiple of 128", q_format="fp8_1x128",
             q_data=qd)
    rejected("quant->k_nope: K = 240 values a row, expected a multiple of 32",
             k_nope_format="mxfp8", k_nope_data=kd)
    rejected("quant->q.format = 9", q_format=9, q_data=qd)
    rejected("quant->k_nope.format = 0 (none) but quant->k_nope.data is given", k_nope_data=kd)
    latent, w_q, w_kv = make(device, torch.float32, T=4, Q=256, C=256)
    with pytest.raises(mlafuse.MlafError) as e:
        mlafuse.split_qk_norm(latent, w_q, w_kv, k_nope_format="mxfp8", k_nope_scale="ue8m0")
    assert "quant->k_nope.scale = 1 (ue8m0), expected 2 (mx_floor) or 3 (mx_ceil)" in e.value.message
    with pytest.raises(mlafuse.MlafError) as e:
        mlafuse.split_qk_norm(latent, w_q, w_kv, q_format="fp8_1x128",
                              q_scales=full(4, 2, dt=torch.float64))
    assert "quant->q.scales.dtype = torch.float64" in e.value.message
    with pytest.raises(mlafuse.MlafError) as e:  # the scales' stride breaks TMA alignment
        mlafuse.split_qk_norm(latent, w_q, w_kv, q_format="fp8_1x128_mn",
                              q_scales=full(2, 5).t()[:4])
    assert "quant->q.scales.stride[0] = 5" in e.value.message
    for kw, name in ((dict(q_format="nvfp4"), "q_format"),
                     (dict(k_nope_format="fp8"), "k_nope_format"),
                     (dict(q_format="mxfp8", q_scale="nearest"), "q_scale")):
        with pytest.raises(ValueError, match=name):
            mlafuse.split_qk_norm(latent, w_q, w_kv, **kw)
    with pytest.raises(TypeError, match="do not mix"):
        mlafuse.split_qk_norm(latent, w_q, w_kv, q_format="fp8_1x128",
                              q_data=qd.cpu().numpy())
    a, nb, bs = kv_inputs(device, torch.float32, Q=256, C=512, R=0)
    cache = full(nb, bs, 512, v=-7.0)
    with pytest.raises(mlafuse.MlafError) as e:
        kv_call(a, cache, kv_rope_tail=64, k_nope_format="fp8_1x128")
    assert "quant->k_nope has format fp8_1x128 with kv_rope_tail = 64" in e.value.message
    assert bool(torch.all(cache == -7.0))
    a, nb, bs = dsa_inputs(device, torch.float32)
    st = dsa_state(a, nb, bs)
    with pytest.raises(mlafuse.MlafError) as e:  # scales inside the index cache
        dsa_call(a, st, q_format="fp8_1x128", q_scales=st[1][0, :80].view(torch.float32).view(10, 2))
    assert "quant->q.scales" in e.value.message and "index" in e.value.message
    assert bool(torch.all(st[1] == 0xA5)) and bool(torch.all(st[0] == -7.0))


@pytest.mark.skipif(not HAS_CUDA, reason=NO_CUDA)
@pytest.mark.parametrize("fmt,scale", [("fp8_1x128_mn", "f32"), ("fp8_1x128_ue8m0", "ue8m0"),
                                       ("mxfp8", "mx_floor")])
def test_cuda_quantizes_its_own_dense_rows(fmt, scale):
    """CUDA: every byte the quantize pass of the same backend's dense rows (the backends' sums of
    squares run in different orders, so each is checked against its own), at a decode-sized and
    a prefill-sized T."""
    for T in (3, 300):
        a, nb, bs = kv_inputs("cuda", torch.bfloat16, T=T, Q=1536, C=512, R=64, bs=64, seed=T)
        c0, c1 = (torch.zeros(nb, bs, 576, dtype=torch.bfloat16, device="cuda") for _ in range(2))
        (q0, k0, _), _ = kv_call(a, c0, return_k_nope=True)
        r, _ = kv_call(a, c1, return_q=False, **quant_kw(fmt, scale))
        assert same(c1, c0)
        check_quantized(q0, r[3], r[4], fmt, scale)
        check_quantized(k0, r[5], r[6], fmt, scale)
