"""mlafuse.rms_norm_quant on numpy arrays (CPU backend): the dense y against a float64 reference,
the residual written back as round(x + residual), and every quantized byte equal to a quantize pass
written here in numpy from the definitions of docs/gemm_formats.md (its own e4m3 encoder: the
nearest of the 127 magnitudes, ties to the even code), applied to the returned y; the scales in the
orientation engines hold them; given outputs; errors as MlafError naming the argument."""
import numpy as np
import pytest

import mlafuse

FORMATS = [("fp8_1x128", "f32"), ("fp8_1x128", "ue8m0"), ("fp8_1x128_mn", "f32"), ("fp8_1x128_mn", "ue8m0"),
           ("fp8_1x128_ue8m0", "ue8m0"), ("mxfp8", "mx_floor"), ("mxfp8", "mx_ceil")]

# e4m3 magnitudes of the codes 0x00 .. 0x7E (0x7F is NaN): subnormals m * 2^-9, then (8 + m) * 2^(e - 10)
_E4M3 = np.array([(c & 7) * 2.0 ** -9 if c >> 3 == 0 else (8 + (c & 7)) * 2.0 ** ((c >> 3) - 10) for c in range(127)])


def e4m3(v):
    """float32 values -> e4m3 codes: round to nearest, ties to the even code, |v| >= 464 -> 448, NaN -> 0x7F."""
    v = np.asarray(v, np.float64)
    a = np.abs(v)
    hi = np.clip(np.searchsorted(_E4M3, a), 1, 126)
    lo = hi - 1
    dlo, dhi = a - _E4M3[lo], _E4M3[hi] - a
    code = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    code = np.where(a >= _E4M3[126], 126, code)
    code = np.where(a >= 464.0, 126, code)
    out = (code | np.where(np.signbit(v), 0x80, 0)).astype(np.uint8)
    return np.where(np.isnan(v), np.uint8(0x7F), out)


def ceil_log2(q):
    m, e = np.frexp(np.float64(q))
    return int(e - 1 if m == 0.5 else e)


def group_scale(scale, amax, eps=np.float32(1e-10)):
    """(scale as float32, UE8M0 byte) of a group's amax (float32)."""
    if scale == "f32":
        return np.float32(max(amax, eps)) / np.float32(448), 0
    if scale == "ue8m0":
        e = ceil_log2(np.float32(max(amax, eps)) / np.float32(448))
    elif scale == "mx_floor":
        e = -127 if amax == 0 else max(int(np.frexp(np.float64(amax))[1]) - 1 - 8, -127)
    else:
        q = np.float32(amax) / np.float32(448)
        e = -127 if q == 0 else max(ceil_log2(q), -127)
    return np.float32(2.0 ** e), e + 127


def quantize_pass(y, fmt, scale):
    """The separate per-token-group quantize pass over the dense y: (bytes [T, K], scales [T, G] as
    float32 values, UE8M0 bytes [T, G])."""
    g = 32 if fmt == "mxfp8" else 128
    T, K = y.shape
    yf = y.astype(np.float32)
    data = np.zeros((T, K), np.uint8)
    sv = np.zeros((T, K // g), np.float32)
    sb = np.zeros((T, K // g), np.uint8)
    for t in range(T):
        for j in range(K // g):
            grp = yf[t, j * g:(j + 1) * g]
            s, b = group_scale(scale, np.float32(np.nanmax(np.abs(grp))) if not np.all(np.isnan(grp)) else 0)
            sv[t, j], sb[t, j] = s, b
            data[t, j * g:(j + 1) * g] = e4m3(grp / s)
    return data, sv, sb


def reference(x, r, w, eps):
    h = x.astype(np.float64) if r is None else (x.astype(np.float32) + r.astype(np.float32)).astype(x.dtype)
    h = h.astype(np.float64)
    rstd = 1.0 / np.sqrt((h * h).mean(axis=1, keepdims=True) + eps)
    return h * rstd * w.astype(np.float64), h


@pytest.mark.parametrize("fmt,scale", FORMATS, ids=[f"{f}-{s}" for f, s in FORMATS])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("T", [0, 5, 33])
@pytest.mark.parametrize("with_residual", [False, True], ids=["no-residual", "residual"])
def test_rms_norm_quant(fmt, scale, dtype, T, with_residual):
    rng = np.random.default_rng(hash((fmt, scale, dtype, T, with_residual)) % 2 ** 32)
    K = 640
    x = rng.standard_normal((T, K + 7)).astype(dtype)[:, 3:3 + K]  # strided rows
    r = rng.standard_normal((T, K)).astype(dtype) * 0.5 if with_residual else None
    r0 = None if r is None else r.copy()
    w = (1.0 + 0.25 * rng.standard_normal(K)).astype(dtype)
    y, q, s = mlafuse.rms_norm_quant(x, w, eps=1e-6, residual=r, q_format=fmt, q_scale=scale)
    yr, h = reference(x, r0, w, 1e-6)
    if with_residual:
        assert np.array_equal(r, h.astype(dtype)), "residual <- round(x + residual)"
    if dtype == "float32":
        assert np.all(np.abs(y - yr) <= 1e-5 * np.abs(yr) + 1e-30)
    else:
        assert np.all(np.abs(y.astype(np.float64) - yr) <= np.spacing(np.abs(yr).astype(np.float16)).astype(np.float64))
    data, sv, sb = quantize_pass(y, fmt, scale)
    assert q.shape == (T, K) and q.dtype == np.uint8
    assert np.array_equal(q, data), "fused bytes = the separate quantize pass over y"
    G = K // (32 if fmt == "mxfp8" else 128)
    if fmt in ("fp8_1x128", "fp8_1x128_mn"):
        assert s.shape == (T, G) and s.dtype == np.float32 and np.array_equal(s, sv)
        if fmt == "fp8_1x128_mn" and T > 0:  # token-contiguous, TMA-aligned: strides (1, ld)
            assert s.strides[0] == 4 and s.strides[1] % 16 == 0 and s.strides[1] >= 4 * ((T + 3) // 4 * 4)
            assert s.T.ctypes.data % 16 == 0
    elif fmt == "fp8_1x128_ue8m0":
        assert s.shape == (T, (G + 3) // 4) and s.dtype == np.int32
        b = np.stack([(s.astype(np.int64) >> (8 * k)) & 0xFF for k in range(4)], axis=2).reshape(T, 4 * s.shape[1])
        assert np.array_equal(b[:, :G], sb) and np.all(b[:, G:] == 0), "group 4i + b in byte b; zero bytes past G"
    else:
        assert s.shape == (T, G) and s.dtype == np.uint8 and np.array_equal(s, sb)
    # decoding: within half an e4m3 step of y wherever not saturated
    g = K // G
    dec = (np.where(q & 0x80, -1.0, 1.0) * _E4M3[np.minimum(q & 0x7F, 126)]) * np.repeat(sv, g, axis=1)
    v = y.astype(np.float64) / np.repeat(sv, g, axis=1)
    step = np.where(np.abs(v) < 2 ** -6, 2.0 ** -9, 2.0 ** (np.floor(np.log2(np.maximum(np.abs(v), 2 ** -6))) - 3))
    ok = (np.abs(v) >= 464) | (np.abs(dec - y) <= step / 2 * np.repeat(sv, g, axis=1) * (1 + 1e-6))
    assert np.all(ok)


def test_given_outputs_and_dense_only():
    rng = np.random.default_rng(7)
    T, K = 9, 256
    x = rng.standard_normal((T, K)).astype(np.float32)
    w = np.ones(K, np.float32)
    y1, q1, s1 = mlafuse.rms_norm_quant(x, w, q_format="fp8_1x128_mn", q_scale="ue8m0")
    ld = 16
    buf = np.full((2, ld), -1.0, np.float32)
    s2 = buf[:, :T].T  # the engines' [T, K/128] view with strides (1, ld)
    q2 = np.empty((T, K), np.uint8)
    y2 = np.empty((T, K), np.float32)
    y2r, q2r, s2r = mlafuse.rms_norm_quant(x, w, y=y2, q_format="fp8_1x128_mn", q_scale="ue8m0", q_data=q2, q_scales=s2)
    assert y2r is y2 and q2r is q2 and s2r is s2
    assert np.array_equal(y1, y2) and np.array_equal(q1, q2) and np.array_equal(s1, s2)
    assert np.all(buf[:, T:] == -1.0), "the padding rows past T stay as they were"
    yd, qd, sd = mlafuse.rms_norm_quant(x, w)
    assert qd is None and sd is None and np.array_equal(yd, y1)
    y3, q3, s3 = mlafuse.rms_norm_quant(x, w, return_y=False, q_format="mxfp8")
    assert y3 is None and q3.shape == (T, K) and s3.shape == (T, K // 32)
    xi = x.copy()
    yi, _, _ = mlafuse.rms_norm_quant(xi, w, y=xi)  # in place
    assert yi is xi and np.array_equal(xi, y1)


def test_errors_name_the_argument():
    x = np.ones((4, 100), np.float32)
    w = np.ones(100, np.float32)
    with pytest.raises(mlafuse.MlafError) as e:
        mlafuse.rms_norm_quant(x, w, q_format="fp8_1x128", q_data=np.empty((4, 100), np.uint8),
                               q_scales=np.empty((4, 1), np.float32))
    assert "q: K = 100 values a row, expected a multiple of 128" in e.value.message
    with pytest.raises(mlafuse.MlafError) as e:
        mlafuse.rms_norm_quant(np.ones((4, 128), np.float32), np.ones(128, np.float32), q_format="fp8_1x128",
                               q_scale="mx_floor")
    assert "q.scale = 2 (mx_floor)" in e.value.message
    with pytest.raises(mlafuse.MlafError) as e:
        mlafuse.rms_norm_quant(x, w, return_y=False)
    assert "y is NULL and q has no format" in e.value.message
    with pytest.raises(ValueError):
        mlafuse.rms_norm_quant(x, w, q_format="nvfp4")
    assert mlafuse.backend_supports("cpu", "rms_norm_quant")


def test_column_major_scales_without_alignment():
    """fp8_1x128_cm: the fp8_1x128 values, held [T, K/128] with strides (1, ld), ld >= T (no TMA
    padding: allocated with ld = T); a given view with a larger ld keeps its padding."""
    rng = np.random.default_rng(3)
    T, K = 5, 384
    x = rng.standard_normal((T, K)).astype(np.float32)
    w = np.ones(K, np.float32)
    _, q1, s1 = mlafuse.rms_norm_quant(x, w, q_format="fp8_1x128")
    _, q2, s2 = mlafuse.rms_norm_quant(x, w, q_format="fp8_1x128_cm")
    assert np.array_equal(q1, q2) and np.array_equal(s1, s2)
    assert s2.shape == (T, 3) and s2.strides == (4, 4 * T)
    buf = np.full((3, 7), -1.0, np.float32)
    _, _, s3 = mlafuse.rms_norm_quant(x, w, q_format="fp8_1x128_cm", q_scales=buf[:, :T].T)
    assert np.array_equal(s3, s1) and np.all(buf[:, T:] == -1.0)
