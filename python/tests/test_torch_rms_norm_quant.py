"""mlafuse.rms_norm_quant on torch tensors (torch.ops.mlafuse.rms_norm_quant / _out / _inplace,
whichever binding serves them): the dense y against the float64 reference, the residual written
back as round(x + residual), every quantized byte and scale equal to the numpy quantize pass of
test_rms_norm_quant.py applied to the returned y (the dense op followed by a per-token-group
quantize), decoding within half an e4m3 step, the scales in the layouts engines hold; given
outputs, out=, the in-place form; the fake implementation's strides; torch.compile; errors.
CPU here; the CUDA cases skip without a GPU and a CUDA build."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the numpy tests still run)")

import mlafuse  # noqa: E402
from test_rms_norm_quant import FORMATS, _E4M3, e4m3, quantize_pass  # noqa: E402

HAS_CUDA = torch.cuda.is_available() and mlafuse.backend_available("cuda")
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not HAS_CUDA, reason="no CUDA device visible to torch, or a CPU-only mlafuse"))]
ALL_FORMATS = FORMATS + [("fp8_1x128_cm", "f32"), ("fp8_1x128_cm", "ue8m0")]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def ulp(v, dtype):
    """One unit in the last place of |v| (float64 values) in dtype (normal range)."""
    a = np.maximum(np.abs(v), 2.0 ** -14)
    mant = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}[dtype]
    return 2.0 ** (np.floor(np.log2(a)) - mant)


def group_of(fmt):
    return 32 if fmt == "mxfp8" else 128


def engine_scales(s, fmt, T, G):
    """The scales as (float32 values [T, G], UE8M0 bytes [T, G]) from the tensor a call returned."""
    s = s.cpu()
    if fmt == "fp8_1x128_ue8m0":
        b = torch.stack([(s.long() >> (8 * k)) & 0xFF for k in range(4)], dim=2).reshape(T, -1)
        assert torch.all(b[:, G:] == 0), "zero bytes past the last group"
        b = b[:, :G].numpy().astype(np.uint8)
        return np.ldexp(1.0, b.astype(np.int64) - 127).astype(np.float32), b
    if fmt == "mxfp8":
        b = s.numpy()
        return np.ldexp(1.0, b.astype(np.int64) - 127).astype(np.float32), b
    return s.numpy(), None


def check_layout(s, fmt, T, G):
    if fmt in ("fp8_1x128", "mxfp8"):
        assert s.is_contiguous()
    elif T > 1:
        ld = s.stride(1)
        assert s.stride(0) == 1 and ld >= T, "token-contiguous [T, groups] view, strides (1, ld)"
        if fmt != "fp8_1x128_cm":
            assert ld % 4 == 0 and s.data_ptr() % 16 == 0, "TMA: 16-byte columns"
    cols = (G + 3) // 4 if fmt == "fp8_1x128_ue8m0" else G
    want = {"fp8_1x128_ue8m0": torch.int32, "mxfp8": torch.uint8}.get(fmt, torch.float32)
    assert tuple(s.shape) == (T, cols) and s.dtype == want


def check_quantized(y, q, s, fmt, scale, q_eps=1e-10):
    """q / s are the quantize pass of y, bit for bit; decoding is within half an e4m3 step."""
    T, K = y.shape
    G = K // group_of(fmt)
    yf = y.float().cpu().numpy()
    data, sv, sb = quantize_pass(yf, fmt, scale) if q_eps == 1e-10 else _pass_eps(yf, fmt, q_eps)
    check_layout(s, fmt, T, G)
    qb = q.cpu().view(torch.uint8).numpy()
    assert np.array_equal(qb, data), "fused bytes = the separate quantize pass over y"
    vals, ue = engine_scales(s, fmt, T, G)
    assert np.array_equal(vals, sv), "scales"
    if ue is not None:
        assert np.array_equal(ue, sb), "UE8M0 bytes"
    g = K // max(G, 1)
    rep = np.repeat(sv, g, axis=1)
    dec = np.where(qb & 0x80, -1.0, 1.0) * _E4M3[np.minimum(qb & 0x7F, 126)] * rep
    v = yf.astype(np.float64) / rep
    step = np.where(np.abs(v) < 2 ** -6, 2.0 ** -9,
                    2.0 ** (np.floor(np.log2(np.maximum(np.abs(v), 2 ** -6))) - 3))
    assert np.all((np.abs(v) >= 464) | (np.abs(dec - yf) <= step / 2 * rep * (1 + 1e-6)))


def _pass_eps(yf, fmt, eps):
    """quantize_pass with another amax floor (f32 rounding of the 1x128 formats only)."""
    T, K = yf.shape
    a = np.abs(yf.reshape(T, K // 128, 128)).max(axis=2).astype(np.float32)
    sv = np.maximum(a, np.float32(eps)) / np.float32(448)
    data = e4m3((yf.reshape(T, K // 128, 128) / sv[:, :, None]).reshape(T, K))
    return data, sv, np.zeros_like(sv, np.uint8)


def make(seed, T, K, dtype, device, residual):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, K + 9, generator=g)[:, 4:4 + K].to(device=device, dtype=dtype)  # strided
    r = (torch.randn(T, K, generator=g) * 0.5).to(device=device, dtype=dtype) if residual else None
    w = (1.0 + 0.25 * torch.randn(K, generator=g)).to(device=device, dtype=dtype)
    return x, r, w


def check_dense(y, x, r0, w, eps, dtype):
    """y against the float64 reference (1 ulp of the dtype; f32 1e-5 relative); returns the
    normalized h = x, or round(x + r) (the f32 sum rounded once to the dtype)."""
    xc = x.cpu()
    h = xc if r0 is None else (xc.float() + r0.cpu().float()).to(dtype)
    hh = h.double()
    rstd = 1.0 / torch.sqrt((hh * hh).mean(dim=1, keepdim=True) + eps)
    yr = (hh * rstd * w.cpu().double()).numpy()
    got = y.cpu().double().numpy()
    tol = 1e-5 * np.abs(yr) + 1e-30 if dtype == torch.float32 else ulp(yr, dtype)
    assert np.all(np.abs(got - yr) <= tol)
    return h


def u8(t):
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def same(a, b):
    return torch.equal(u8(a).cpu(), u8(b).cpu())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt,scale", ALL_FORMATS, ids=[f"{f}-{s}" for f, s in ALL_FORMATS])
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_rms_norm_quant_torch(device, fmt, scale, dtype, residual):
    T, K = 33, 640
    x, r, w = make(hash((fmt, scale, str(dtype), residual)) % 2 ** 31, T, K, dtype, device,
                   residual)
    r0 = None if r is None else r.clone()
    x0 = x.clone()
    y, q, s = mlafuse.rms_norm_quant(x, w, eps=1e-6, residual=r, q_format=fmt, q_scale=scale)
    assert torch.equal(x, x0), "x is only read"
    assert y.dtype == dtype and q.dtype == torch.float8_e4m3fn and q.shape == (T, K)
    h = check_dense(y, x, r0, w, 1e-6, dtype)
    if residual:
        assert torch.equal(r.cpu(), h), "residual <- round(x + r)"
    check_quantized(y, q, s, fmt, scale)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["fp8_1x128_mn", "fp8_1x128_ue8m0", "fp8_1x128_cm", "mxfp8"])
def test_given_outputs_out_and_inplace(device, fmt):
    """Given outputs are written and returned as they are (padding rows of an MN-major buffer
    untouched); out= is the same; q alone; y = x in place; every form gives the same bytes."""
    T, K = 6, 512
    x, r, w = make(5, T, K, torch.bfloat16, device, True)
    r1, r2, r3 = r.clone(), r.clone(), r.clone()
    y1, q1, s1 = mlafuse.rms_norm_quant(x, w, residual=r1, q_format=fmt)
    G = K // group_of(fmt)
    if fmt == "mxfp8":
        buf, s2 = None, torch.full((T, G), 7, dtype=torch.uint8, device=device)
    else:
        rows = (G + 3) // 4 if fmt == "fp8_1x128_ue8m0" else G
        dt = torch.int32 if fmt == "fp8_1x128_ue8m0" else torch.float32
        buf = torch.full((rows, 12), -1, dtype=dt, device=device)  # ld 12 >= round_up(6, 4)
        s2 = buf[:, :T].t()
    q2 = torch.empty(T, K, dtype=torch.uint8, device=device)
    y2 = torch.empty(T, K, dtype=torch.bfloat16, device=device)
    got = mlafuse.rms_norm_quant(x, w, residual=r2, q_format=fmt, out=(y2, q2, s2))
    assert got[0] is y2 and got[1] is q2 and got[2] is s2
    assert same(y1, y2) and same(q1, q2) and same(r1, r2) and same(s1, s2)
    if buf is not None:
        assert torch.all(buf[:, T:] == -1), "the padding rows past T stay as they were"
    y3, q3, s3 = mlafuse.rms_norm_quant(x, w, residual=r3, q_format=fmt, return_y=False)
    assert y3 is None and same(q3, q1) and same(s3, s1) and same(r3, r1)
    xi = x.clone()
    r4 = r.clone()
    yi, qi, si = mlafuse.rms_norm_quant(xi, w, residual=r4, y=xi, q_format=fmt)
    assert yi is xi and same(xi, y1) and same(qi, q1) and same(si, s1)
    yd, qd, sd = mlafuse.rms_norm_quant(x, w, residual=r.clone())
    assert qd is None and sd is None and same(yd, y1)
    yo, qo, so = mlafuse.rms_norm_quant(x, w, residual=r.clone(), q_format=fmt,
                                        out=(None, q2, None))
    assert qo is q2 and same(yo, y1) and same(so, s1)


@pytest.mark.parametrize("fmt", ["fp8_1x128", "fp8_1x128_mn", "fp8_1x128_ue8m0", "mxfp8",
                                 "fp8_1x128_cm"])
@pytest.mark.parametrize("T", [0, 1, 7])
def test_functional_op_and_its_fake_agree(fmt, T):
    """The raw functional op: not-requested outputs are [T, 0]; the fake (meta) implementation
    allocates tensors of the shapes, dtypes and strides the kernel returns (torch.compile
    relies on it)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    code = mlafuse.ops.GEMM_FORMATS[fmt]
    scale = mlafuse.ops.GEMM_SCALES["ue8m0" if fmt == "fp8_1x128_ue8m0" else
                                "mx_floor" if fmt == "mxfp8" else "f32"]
    K = 1024
    x, w = torch.randn(T, K), torch.ones(K)
    op = torch.ops.mlafuse.rms_norm_quant
    real = op(x, w, 1e-6, None, True, code, scale, 0.0)
    with FakeTensorMode() as mode:
        fake = op(mode.from_tensor(x), mode.from_tensor(w), 1e-6, None, True, code, scale, 0.0)
    for a, b in zip(real, fake):
        assert (a.shape, a.dtype) == (b.shape, b.dtype)
        if a.numel():
            assert a.stride() == b.stride()
    y, q, s = op(x, w, 1e-6, None, False, code, scale, 0.0)
    assert y.shape == (T, 0) and q.shape == (T, K) and s.shape == real[2].shape
    y, q, s = op(x, w, 1e-6)
    assert y.shape == (T, K) and q.shape == (T, 0) and s.shape == (T, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    """torch.library.opcheck of the three ops: mutation annotations, fake implementations, AOT
    dispatch (q_data as uint8 where mutated: opcheck cannot compare mutated float8 tensors). T is
    a multiple of 4: AOT dispatch without re-inplacing hands the _out op dense copies of the
    mutated tensors, so a padded MN-major view arrives with ld = T (torch.compile re-inplaces:
    test_compile_out_keeps_the_given_buffer)."""
    ops = torch.ops.mlafuse
    T, K = 8, 512
    x, r, w = make(9, T, K, torch.bfloat16, device, True)
    mn, ue = mlafuse.ops.GEMM_FORMATS["fp8_1x128_mn"], mlafuse.ops.GEMM_FORMATS["fp8_1x128_ue8m0"]
    cm = mlafuse.ops.GEMM_FORMATS["fp8_1x128_cm"]

    def u8_data():
        return torch.empty(T, K, dtype=torch.uint8, device=device)

    def mn_scales(rows, dt=torch.float32):
        return torch.zeros(rows, T, dtype=dt, device=device).t()

    cases = [
        (ops.rms_norm_quant, (x, w, 1e-6, r.clone(), True, mn, 0, 0.0)),
        (ops.rms_norm_quant, (x, w, 1e-6, None, False, ue, 1, 1e-4)),
        (ops.rms_norm_quant, (x, w, 1e-6)),
        (ops.rms_norm_quant_out, (x, w, 1e-6, r.clone(), torch.empty_like(x), u8_data(),
                                  mn_scales(K // 128), mn, 1, 0.0)),
        (ops.rms_norm_quant_out, (x, w, 1e-6, None, None, u8_data(),
                                  mn_scales(1, torch.int32), ue, 1, 0.0)),
        (ops.rms_norm_quant_inplace, (x.clone(), w, 1e-6, r.clone(), u8_data(),
                                      torch.zeros(K // 128, T, device=device).t(), cm, 0, 0.0)),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args)


def _layer(x, r, w):
    y, q, s = mlafuse.rms_norm_quant(x, w, residual=r, q_format="fp8_1x128_mn")
    return y.float().sum(), q.view(torch.uint8), s * 2


def test_compile_one_graph():
    """torch.compile traces the op (fullgraph): the residual is written in place, results match
    eager, new data reuses the graph."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(_layer, fullgraph=True)
    x, r, w = make(11, 9, 256, torch.bfloat16, "cpu", True)
    ra, rb = r.clone(), r.clone()
    want = _layer(x, ra, w)
    got, codes = run_and_get_code(compiled, x, rb, w)
    code = "\n".join(codes)
    assert "torch.ops.mlafuse.rms_norm_quant.default(" in code
    for bad in ("aten.copy", "auto_functionalized"):
        assert bad not in code, f"{bad} in the compiled code:\n{code}"
    for a, b in zip(want, got):
        assert same(a, b)
    assert same(ra, rb)
    with torch._dynamo.config.patch(error_on_recompile=True):
        x2, r2, _ = make(12, 9, 256, torch.bfloat16, "cpu", True)
        for a, b in zip(_layer(x2, r2.clone(), w), compiled(x2, r2.clone(), w)):
            assert same(a, b)
    assert not counters["graph_break"]


def _out_step(x, w, r, q, s):
    y, _, _ = mlafuse.rms_norm_quant(x, w, residual=r, q_format="fp8_1x128_mn", out=(None, q, s))
    return y.float().sum()


def test_compile_out_keeps_the_given_buffer():
    """Compiled, the _out op writes the given padded MN-major scales view itself (ld 8 for
    T = 6), not a copy: the padding columns stay, the values equal eager's."""
    torch._dynamo.reset()
    T, K = 6, 512
    x, r, w = make(13, T, K, torch.bfloat16, "cpu", True)
    bufs = [torch.full((K // 128, 8), -1.0) for _ in range(2)]
    qs = [torch.empty(T, K, dtype=torch.uint8) for _ in range(2)]
    ra, rb = r.clone(), r.clone()
    want = _out_step(x, w, ra, qs[0], bufs[0][:, :T].t())
    got = torch.compile(_out_step, fullgraph=True)(x, w, rb, qs[1], bufs[1][:, :T].t())
    assert same(want, got) and same(ra, rb) and same(qs[0], qs[1])
    assert same(bufs[0], bufs[1]) and torch.all(bufs[1][:, T:] == -1.0)


def test_q_eps_reaches_the_scales():
    x = torch.zeros(2, 256)
    x[0, :128] = 1e-6  # amax below the floor: the scale is eps / 448
    y, q, s = mlafuse.rms_norm_quant(x, torch.ones(256), q_format="fp8_1x128", q_eps=1e-4,
                                     return_y=True)
    check_quantized(y, q, s, "fp8_1x128", "f32", q_eps=1e-4)
    assert s[1, 0] == np.float32(1e-4) / np.float32(448)


def test_errors_name_the_argument_and_write_nothing():
    x, w = torch.ones(4, 100), torch.ones(100)
    with pytest.raises(mlafuse.MlafError) as e:
        mlafuse.rms_norm_quant(x, w, q_format="fp8_1x128")
    assert "q: K = 100 values a row, expected a multiple of 128" in e.value.message
    x, w = torch.ones(4, 256), torch.ones(256)
    with pytest.raises(mlafuse.MlafError) as e:
        mlafuse.rms_norm_quant(x, w, q_format="fp8_1x128", q_scale="mx_floor")
    assert "q.scale = 2 (mx_floor)" in e.value.message
    with pytest.raises(mlafuse.MlafError) as e:
        mlafuse.rms_norm_quant(x, w, return_y=False)
    assert "y is NULL and q has no format" in e.value.message
    y = torch.full((4, 256), 3.0)
    q = torch.full((4, 256), 5, dtype=torch.uint8)
    bad = torch.zeros(4, 2, dtype=torch.float64)
    with pytest.raises(mlafuse.MlafError) as e:
        mlafuse.rms_norm_quant(x, w, q_format="fp8_1x128", out=(y, q, bad))
    assert "q.scales.dtype = torch.float64" in e.value.message
    short = torch.zeros(4, 1)
    r = torch.full((4, 256), 2.0)
    with pytest.raises(mlafuse.MlafError) as e:
        mlafuse.rms_norm_quant(x, w, residual=r, q_format="fp8_1x128", out=(y, q, short))
    assert "q.scales" in e.value.message
    assert torch.all(y == 3.0) and torch.all(q == 5) and torch.all(r == 2.0), "nothing written"
    with pytest.raises(ValueError, match="not both"):
        mlafuse.rms_norm_quant(x, w, y=y, out=(y, None, None))
    with pytest.raises(ValueError, match="q_format"):
        mlafuse.rms_norm_quant(x, w, q_format="nvfp4")
    with pytest.raises(TypeError, match="do not mix"):
        mlafuse.rms_norm_quant(x, w.numpy(), q_format="fp8_1x128", out=(y, q, None))


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device visible to torch, or a CPU-only mlafuse")
@pytest.mark.parametrize("fmt", ["fp8_1x128_mn", "fp8_1x128_ue8m0", "mxfp8"])
def test_cuda_agrees_with_cpu(fmt):
    """CUDA against CPU: the residual bit for bit, y within an ulp, and each backend's bytes the
    quantize pass of its own y (the two backends' sums of squares run in different orders)."""
    x, r, w = make(21, 40, 2048, torch.bfloat16, "cpu", True)
    rc, rg = r.clone(), r.cuda()
    yc, _, _ = mlafuse.rms_norm_quant(x, w, residual=rc, q_format=fmt)
    yg, qg, sg = mlafuse.rms_norm_quant(x.cuda(), w.cuda(), residual=rg, q_format=fmt)
    assert same(rg, rc)
    assert torch.all((yg.cpu().double() - yc.double()).abs()
                     <= torch.from_numpy(ulp(yc.double().numpy(), torch.bfloat16)))
    check_quantized(yg, qg, sg, fmt, "ue8m0" if fmt == "fp8_1x128_ue8m0" else
                    "mx_floor" if fmt == "mxfp8" else "f32")
