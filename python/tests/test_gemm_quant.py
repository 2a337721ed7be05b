"""mlafuse.gemm_quant (docs/gemm_formats.md, gemm_quant): every byte against a quantize pass written here
in numpy from the definitions (reference.py's e4m3 encoder), over rows with NaN, +-inf, subnormal and
zero values; equal to rms_norm_quant's quantized output for the same values; given outputs; errors.
With torch: the same bytes on every device and dtype, the scales in the engines' layouts, opcheck of
the custom ops, torch.compile; and mlafuse.compat's SGLang adapters (per_token_group_quant_fp8 and
sglang_per_token_group_quant_fp8) against SGLang's layouts and arithmetic."""
import inspect

import numpy as np
import pytest

import mlafuse
import reference as ref

FORMATS = [("fp8_1x128", "f32"), ("fp8_1x128", "ue8m0"), ("fp8_1x128_mn", "f32"), ("fp8_1x128_mn", "ue8m0"),
           ("fp8_1x128_ue8m0", "ue8m0"), ("mxfp8", "mx_floor"), ("mxfp8", "mx_ceil"), ("fp8_1x128_cm", "f32"),
           ("fp8_1x128_cm", "ue8m0")]
FMT_IDS = [f"{f}-{s}" for f, s in FORMATS]
F32 = np.float32


def _log2_exp(v, ceil):
    """ceil / floor of log2 of positive float64 values (subnormal f32 included), from frexp."""
    m, e = np.frexp(np.asarray(v, np.float64))
    return np.where(m == 0.5, e - 1, e) if ceil else e - 1


def ref_quant(x, fmt, scale, eps=1e-10):
    """(bytes [T, K], scales [T, G] float32, UE8M0 bytes [T, G]) of x's values (float32 here)."""
    g = 32 if fmt == "mxfp8" else 128
    x = np.asarray(x, F32)
    T, K = x.shape
    grp = x.reshape(T, K // g, g)
    amax = ref.nan_amax(grp, axis=2).astype(F32)
    floor = np.maximum(amax, F32(eps))
    with np.errstate(all="ignore"):
        if scale == "f32":
            s, byte = (floor / F32(448)).astype(F32), np.zeros(amax.shape, np.uint8)
        else:
            if scale == "ue8m0":
                e = _log2_exp(floor / F32(448), True)
            elif scale == "mx_floor":
                e = np.where(amax > 0, _log2_exp(np.where(amax > 0, amax, 1), False) - 8, -127)
            else:
                q = amax / F32(448)
                e = np.where(q > 0, _log2_exp(np.where(q > 0, q, 1), True), -127)
            e = np.where(np.isinf(amax), 128, np.maximum(e, -127))
            s = np.where(e == 128, np.inf, np.ldexp(1.0, np.minimum(e, 127))).astype(F32)
            byte = (e + 127).astype(np.uint8)
        data = ref.e4m3(grp / s[:, :, None]).reshape(T, K)
    return data, s, byte


def special_rows(rng, T, K, dtype):
    """Ordinary rows, with a large one, a tiny one (subnormal values), a zero one, NaN and +-inf."""
    x = rng.standard_normal((T, K)).astype(np.float32)
    tiny = 2.0 ** -20 if dtype == "float16" else 2.0 ** -130
    for t in range(T):
        if t % 7 == 1:
            x[t] *= 1000.0
        if t % 7 == 2:
            x[t] *= tiny
        if t % 7 == 3:
            x[t] = 0.0
        if t % 7 == 4:
            x[t, 5::61] = np.nan
        if t % 7 == 5:
            x[t, K // 2] = np.inf if t % 2 else -np.inf
    return x.astype(dtype)


def check_bytes(q, s, x, fmt, scale, eps=1e-10):
    data, sv, sb = ref_quant(np.asarray(x, np.float32), fmt, scale, eps)
    T, K = np.shape(x)
    G = sv.shape[1]
    assert np.array_equal(np.asarray(q).view(np.uint8), data), "e4m3 bytes"
    s = np.asarray(s)
    if fmt == "fp8_1x128_ue8m0":
        assert s.shape == (T, (G + 3) // 4) and s.dtype == np.int32
        b = np.stack([(s.astype(np.int64) >> (8 * k)) & 0xFF for k in range(4)], axis=2).reshape(T, 4 * s.shape[1])
        assert np.array_equal(b[:, :G], sb) and np.all(b[:, G:] == 0), "group 4i + b in byte b; zeros past G"
    elif fmt == "mxfp8":
        assert s.shape == (T, G) and s.dtype == np.uint8 and np.array_equal(s, sb)
    else:
        assert s.shape == (T, G) and s.dtype == np.float32 and np.array_equal(s.view(np.uint32), sv.view(np.uint32))


# ---- numpy ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt,scale", FORMATS, ids=FMT_IDS)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("T", [0, 5, 33])
def test_gemm_quant_bytes(fmt, scale, dtype, T):
    rng = np.random.default_rng(abs(hash((fmt, scale, dtype, T))) % 2 ** 32)
    K = 640
    buf = np.zeros((T, K + 9), dtype)
    buf[:, 3:3 + K] = special_rows(rng, T, K, dtype)
    x = buf[:, 3:3 + K]  # strided rows, one element off alignment
    before = buf.copy()
    q, s = mlafuse.gemm_quant(x, q_format=fmt, q_scale=scale)
    assert q.shape == (T, K) and q.dtype == np.uint8
    check_bytes(q, s, x, fmt, scale)
    assert np.array_equal(buf.view(np.uint8), before.view(np.uint8)), "x is not modified"
    if fmt in ("fp8_1x128_mn", "fp8_1x128_ue8m0") and T > 0:  # the engines' view of an MN-major buffer
        assert s.strides[0] == 4 and s.strides[1] % 16 == 0 and s.strides[1] >= 4 * ((T + 3) // 4 * 4)
        assert s.T.ctypes.data % 16 == 0
    if fmt == "fp8_1x128_cm" and T > 0:
        assert s.strides == (4, 4 * T)


@pytest.mark.parametrize("fmt,scale", FORMATS, ids=FMT_IDS)
def test_same_bytes_as_rms_norm_quant(fmt, scale):
    rng = np.random.default_rng(11)
    T, K = 17, 1152
    x = rng.standard_normal((T, K)).astype(np.float16)
    w = (1.0 + 0.3 * rng.standard_normal(K)).astype(np.float16)
    y, q1, s1 = mlafuse.rms_norm_quant(x, w, q_format=fmt, q_scale=scale)
    q2, s2 = mlafuse.gemm_quant(y, q_format=fmt, q_scale=scale)
    assert np.array_equal(q1, q2) and np.array_equal(s1, s2)


def test_given_outputs_defaults_and_eps():
    rng = np.random.default_rng(3)
    T, K = 9, 256
    x = rng.standard_normal((T, K)).astype(np.float32)
    x[2] = 0.0
    q1, s1 = mlafuse.gemm_quant(x)  # fp8_1x128, f32
    check_bytes(q1, s1, x, "fp8_1x128", "f32")
    buf = np.full((1, 16), -1, np.int32)
    s2 = buf[:, :T].T  # the engines' [T, 1] view, strides (1, 16)
    q2 = np.empty((T, K), np.uint8)
    q2r, s2r = mlafuse.gemm_quant(x, q_format="fp8_1x128_ue8m0", out=(q2, s2))
    assert q2r is q2 and s2r is s2 and np.all(buf[:, T:] == -1), "padding rows past T untouched"
    check_bytes(q2, s2, x, "fp8_1x128_ue8m0", "ue8m0")  # ue8m0 is that format's default rounding
    q3, s3 = mlafuse.gemm_quant(x, q_format="mxfp8")  # mx_floor by default
    check_bytes(q3, s3, x, "mxfp8", "mx_floor")
    q4, s4 = mlafuse.gemm_quant(x, q_format="fp8_1x128_mn", q_eps=1e-4)
    check_bytes(q4, s4, x, "fp8_1x128_mn", "f32", eps=1e-4)
    assert s4[2, 0] == np.float32(1e-4) / np.float32(448), "a zero row takes the eps floor"


def test_errors_name_the_argument():
    x = np.ones((4, 100), np.float32)
    with pytest.raises(mlafuse.MlafError) as e:
        mlafuse.gemm_quant(x)
    assert "q: K = 100 values a row, expected a multiple of 128" in e.value.message
    with pytest.raises(mlafuse.MlafError) as e:
        mlafuse.gemm_quant(np.ones((4, 128), np.float32), q_scale="mx_floor")
    assert "q.scale = 2 (mx_floor)" in e.value.message
    with pytest.raises(mlafuse.MlafError) as e:
        mlafuse.gemm_quant(np.ones((4, 128), np.float32), q_format="none")
    assert e.value.status_name == "MLAF_ERR_NULL_POINTER" and "nothing to write" in e.value.message
    with pytest.raises(mlafuse.MlafError) as e:
        mlafuse.gemm_quant(np.ones((4, 128), np.float32), q_scales=np.empty((4, 2), np.float32))
    assert "q.scales.shape[1] = 2, expected K / 128 = 1" in e.value.message
    with pytest.raises(mlafuse.MlafError) as e:
        mlafuse.gemm_quant(np.ones((4, 128), np.float64))
    assert "x.dtype" in e.value.message
    with pytest.raises(ValueError):
        mlafuse.gemm_quant(x, q_format="nvfp4")
    assert mlafuse.backend_supports("cpu", "gemm_quant")


# ---- torch ------------------------------------------------------------------------------------------
try:
    import torch
except ImportError:
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed (the numpy tests still run)")
HAS_CUDA = torch is not None and torch.cuda.is_available() and mlafuse.backend_available("cuda")
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device, or a "
                                                                "CPU-only mlafuse"))]


def _np(t):
    return t.detach().cpu().numpy()


def _u8(q):
    return _np(q.view(torch.uint8))


@needs_torch
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt,scale", FORMATS, ids=FMT_IDS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_torch_bytes_and_layouts(device, fmt, scale, dtype):
    T, K = 21, 768
    tdt = getattr(torch, dtype)
    x32 = special_rows(np.random.default_rng(5), T, K, "float16" if dtype == "float16" else "float32")
    buf = torch.zeros(T, K + 16, dtype=tdt, device=device)
    buf[:, 8:8 + K] = torch.from_numpy(x32.astype(np.float32)).to(tdt)
    for x in (buf[:, 8:8 + K], buf[:, 1:1 + K]):  # 16-byte aligned rows (CUDA: its vector path), then not
        x.copy_(buf[:, 8:8 + K].clone())
        q, s = mlafuse.gemm_quant(x, q_format=fmt, q_scale=scale)
        assert q.dtype == torch.float8_e4m3fn and q.shape == (T, K) and q.device == x.device
        xs = _np(x.float())  # the values as stored: the bytes depend on nothing else
        check_bytes(_u8(q), _np(s), xs, fmt, scale)
        if fmt in ("fp8_1x128_mn", "fp8_1x128_ue8m0"):
            assert s.stride() == (1, (T + 3) // 4 * 4) and s.data_ptr() % 16 == 0
        elif fmt == "fp8_1x128_cm":
            assert s.stride() == (1, T)
        else:
            assert s.is_contiguous()


@needs_torch
@pytest.mark.parametrize("device", DEVICES)
def test_torch_given_outputs_and_errors(device):
    T, K = 6, 512
    x = torch.randn(T, K, dtype=torch.bfloat16, device=device)
    qd = torch.empty(T, K, dtype=torch.uint8, device=device)
    big = torch.full((1, 12), -1, dtype=torch.int32, device=device)  # ld 12 > round_up(6, 4)
    s = big[:, :T].t()
    q2, s2 = mlafuse.gemm_quant(x, q_format="fp8_1x128_ue8m0", q_data=qd, q_scales=s)
    assert q2 is qd and s2 is s and torch.all(big[:, T:] == -1)
    q3, s3 = mlafuse.gemm_quant(x, q_format="fp8_1x128_ue8m0")
    assert torch.equal(q3.view(torch.uint8), qd) and torch.equal(s3, s)
    _, s4 = mlafuse.gemm_quant(x, q_format="fp8_1x128", q_data=torch.empty_like(qd))  # scales allocated
    assert s4.shape == (T, K // 128) and s4.dtype == torch.float32
    with pytest.raises(mlafuse.MlafError) as e:
        mlafuse.gemm_quant(x[:, :200])
    assert "q: K = 200 values a row, expected a multiple of 128" in e.value.message
    with pytest.raises(mlafuse.MlafError) as e:
        mlafuse.gemm_quant(x, q_format="fp8_1x128_mn", q_scales=torch.empty(T, 4, device=device))
    assert "q.scales" in e.value.message
    with pytest.raises(TypeError):
        mlafuse.gemm_quant(x, q_data=np.empty((T, K), np.uint8))


@needs_torch
@pytest.mark.parametrize("device", DEVICES)
def test_torch_opcheck_and_compile(device):
    ops = torch.ops.mlafuse
    x = torch.randn(5, 256, dtype=torch.bfloat16, device=device)
    codes = mlafuse.ops.GEMM_FORMATS, mlafuse.ops.GEMM_SCALES
    for fmt, scale in FORMATS:
        f, sc = codes[0][fmt], codes[1][scale]
        torch.library.opcheck(ops.gemm_quant, (x, f, sc, 0.0))
        # the _out form with T = 8: scales without padding rows (ld = T), which opcheck's copies of
        # the mutated arguments keep; q_data as uint8: its schema check cannot compare mutated
        # float8 tensors ("mul_cpu_reduced_float" not implemented for Float8_e4m3fn)
        x8 = torch.randn(8, 256, dtype=torch.bfloat16, device=device)
        d, s = mlafuse.gemm_quant(x8, q_format=fmt, q_scale=scale)
        torch.library.opcheck(ops.gemm_quant_out, (x8, d.view(torch.uint8), s, f, sc))
    torch._dynamo.reset()
    step = torch.compile(lambda a: mlafuse.gemm_quant(a * 2, q_format="fp8_1x128_mn"), fullgraph=True)
    got = step(x)
    want = mlafuse.gemm_quant(x * 2, q_format="fp8_1x128_mn")
    assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8)) and torch.equal(got[1], want[1])
    assert got[1].stride() == want[1].stride()


# ---- mlafuse.compat: SGLang --------------------------------------------------------------------------
def _sglang_scale_layout(T, K, column_major, tma, ue8m0):
    """(shape, strides, dtype) of the x_s SGLang's create_per_token_group_quant_fp8_output_scale makes
    for a 2-D x (transcribed from its code at commit 008601fa)."""
    G = K // 128
    if ue8m0:
        mn = (T + 3) // 4 * 4
        return (T, (G + 3) // 4), (1, mn), torch.int32
    if column_major:
        return (T, G), (1, (T + 3) // 4 * 4 if tma else T), torch.float32
    return (T, G), (G, 1), torch.float32


@needs_torch
def test_sglang_signatures():
    from mlafuse import compat

    a = inspect.signature(compat.sglang_per_token_group_quant_fp8).parameters
    assert [(p.name, p.default) for p in a.values()] == [
        ("x", inspect.Parameter.empty), ("group_size", inspect.Parameter.empty), ("eps", 1e-10),
        ("column_major_scales", False), ("scale_tma_aligned", False), ("scale_ue8m0", False),
        ("fuse_silu_and_mul", False), ("masked_m", None)]
    b = inspect.signature(compat.per_token_group_quant_fp8).parameters
    assert [(p.name, p.default) for p in b.values()] == [
        ("x", inspect.Parameter.empty), ("group_size", inspect.Parameter.empty), ("eps", 1e-10),
        ("dtype", torch.float8_e4m3fn), ("column_major_scales", False), ("scale_tma_aligned", False),
        ("scale_ue8m0", False)]
    assert "sglang_per_token_group_quant_fp8" in compat.__all__ and "per_token_group_quant_fp8" in compat.__all__


OPTIONS = [(False, False, False), (False, True, False), (True, False, False), (True, True, False), (True, True, True)]


@needs_torch
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opts", OPTIONS, ids=["row", "row-tma", "cm", "cm-tma", "ue8m0"])
@pytest.mark.parametrize("fn", ["sglang_per_token_group_quant_fp8", "per_token_group_quant_fp8"])
def test_sglang_adapters(device, opts, fn):
    from mlafuse import compat

    cm, tma, ue8m0 = opts
    T, K = 13, 640
    x = torch.randn(T, K, dtype=torch.bfloat16, device=device) * 3
    x[4] = 0
    q, s = getattr(compat, fn)(x, 128, column_major_scales=cm, scale_tma_aligned=tma, scale_ue8m0=ue8m0)
    shape, strides, dt = _sglang_scale_layout(T, K, cm, tma, ue8m0)
    assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape
    assert tuple(s.shape) == shape and s.stride() == strides and s.dtype == dt
    # SGLang's arithmetic: s = max(amax, eps) / 448 (rounded up to a power of two with scale_ue8m0),
    # e4m3(x / s) saturating
    fmt = "fp8_1x128_ue8m0" if ue8m0 else "fp8_1x128"
    check_bytes(_u8(q), _np(s), _np(x.float()), fmt, "ue8m0" if ue8m0 else "f32")
    z, zs = getattr(compat, fn)(x[:0], 128, column_major_scales=cm, scale_tma_aligned=tma, scale_ue8m0=ue8m0)
    assert z.shape == (0, K) and zs.shape[0] == 0


@needs_torch
def test_sglang_batched_and_refusals():
    from mlafuse import compat

    x = torch.randn(2, 3, 256)
    q, s = compat.sglang_per_token_group_quant_fp8(x, 128)
    assert q.shape == (2, 3, 256) and s.shape == (2, 3, 2)
    q2, s2 = mlafuse.gemm_quant(x.reshape(6, 256))
    assert torch.equal(q.view(torch.uint8).reshape(6, 256), q2.view(torch.uint8)) and torch.equal(s.reshape(6, 2), s2)
    x2 = torch.randn(4, 256)
    bad = [
        (compat.sglang_per_token_group_quant_fp8, dict(group_size=64), "group_size = 64"),
        (compat.per_token_group_quant_fp8, dict(group_size=128, dtype=torch.int8), "dtype = torch.int8"),
        (compat.sglang_per_token_group_quant_fp8, dict(group_size=128, fuse_silu_and_mul=True), "fuse_silu_and_mul"),
        (compat.sglang_per_token_group_quant_fp8, dict(group_size=128, masked_m=torch.ones(1)), "masked_m"),
        (compat.sglang_per_token_group_quant_fp8, dict(group_size=128, eps=0.0), "eps = 0.0"),
        (compat.sglang_per_token_group_quant_fp8, dict(group_size=128, column_major_scales=True, scale_ue8m0=True),
         "scale_ue8m0 needs column_major_scales and scale_tma_aligned"),
        (compat.per_token_group_quant_fp8, dict(group_size=128, scale_ue8m0=True), "scale_ue8m0 needs column_major"),
    ]
    for f, kw, text in bad:
        with pytest.raises(ValueError, match=text.replace("(", r"\(")):
            f(x2, **kw)
    with pytest.raises(ValueError, match="column-major scales of a 3-dimensional x"):
        compat.sglang_per_token_group_quant_fp8(x, 128, column_major_scales=True)
    with pytest.raises(ValueError, match="not a multiple of group_size"):
        compat.per_token_group_quant_fp8(torch.randn(4, 200), 128)
    # per_token_group_quant_fp8's ue8m0 with column-major scales not TMA-aligned: SGLang packs them
    # TMA-aligned all the same
    q3, s3 = compat.per_token_group_quant_fp8(x2, 128, column_major_scales=True, scale_ue8m0=True)
    assert s3.dtype == torch.int32 and s3.shape == (4, 1) and s3.stride() == (1, 4)
