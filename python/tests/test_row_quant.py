"""The quantized outputs of the MLA row ops (docs/gemm_formats.md, the row ops) through the numpy
path: split_qk_norm, mla_kv_cache and mla_kv_cache_dsa writing q_norm and / or k_nope in a
GEMM-input format. Every quantized byte and scale equals the numpy quantize pass of
test_rms_norm_quant.py applied to the dense output of the plain call (the dense op followed by a
per-token-group quantize), for every format, rounding and dtype; the dense outputs, the caches and
the error count equal the plain call's bit for bit; quantized-only calls (no dense q / k_nope)
write the same bytes; given outputs and out=; rejections raise naming the argument and write
nothing. Needs only numpy and pytest (bf16 and the bf16-only cache formats: ml_dtypes)."""
import numpy as np
import pytest

import mlafuse
from test_rms_norm_quant import FORMATS, quantize_pass

try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None

ALL_FORMATS = FORMATS + [("fp8_1x128_cm", "f32"), ("fp8_1x128_cm", "ue8m0")]
FMT_IDS = [f"{f}-{s}" for f, s in ALL_FORMATS]
DTYPES = ["float32", "float16"] + (["bfloat16"] if ml_dtypes is not None else [])
needs_bf16 = pytest.mark.skipif(ml_dtypes is None, reason="numpy bf16 needs ml_dtypes")


def dt(name):
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def same_bytes(a, b):
    return (a is not None and b is not None and a.shape == b.shape
            and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes())


def check_pass(y, data, s, fmt, scale):
    """data / s are the quantize pass of the dense y, bit for bit, s held as engines hold it:
    [T, groups] (the MN-major layouts token-contiguous, strides (1, ld))."""
    T, K = y.shape
    want, sv, sb = quantize_pass(np.asarray(y), fmt, scale)
    assert data.shape == (T, K) and data.dtype == np.uint8
    assert np.array_equal(data, want), "fused bytes = the dense output's quantize pass"
    G = K // (32 if fmt == "mxfp8" else 128)
    if fmt == "fp8_1x128_ue8m0":
        assert s.shape == (T, (G + 3) // 4) and s.dtype == np.int32
        b = np.stack([(s.astype(np.int64) >> (8 * k)) & 0xFF for k in range(4)], axis=2)
        b = b.reshape(T, -1)
        assert np.array_equal(b[:, :G], sb) and np.all(b[:, G:] == 0)
    elif fmt == "mxfp8":
        assert s.shape == (T, G) and s.dtype == np.uint8 and np.array_equal(s, sb)
    else:
        assert s.shape == (T, G) and s.dtype == np.float32 and np.array_equal(s, sv)
    if fmt in ("fp8_1x128_mn", "fp8_1x128_ue8m0", "fp8_1x128_cm") and T > 1:
        ld = s.strides[1] // s.itemsize
        assert s.strides[0] == s.itemsize and ld >= T
        if fmt != "fp8_1x128_cm":
            assert ld % 4 == 0 and s.T.ctypes.data % 16 == 0, "TMA: 16-byte columns"


def make(dtype, T=9, Q=384, C=256, R=64, seed=0):
    """latent [T, Q + C + R] (a slice of a wider GEMM output; token 1's q part all zero: groups of
    amax 0), w_q in the latent's dtype, w_kv in f32."""
    rng = np.random.default_rng(seed)
    wide = rng.standard_normal((T, Q + C + R + 8)).astype(np.float32)
    if T > 1 and Q:
        wide[1, 3:3 + Q] = 0.0
    latent = wide.astype(dt(dtype))[:, 3:3 + Q + C + R]
    w_q = (1 + 0.1 * rng.standard_normal(Q)).astype(dt(dtype)) if Q else None
    w_kv = (1 + 0.1 * rng.standard_normal(C)).astype(np.float32)
    return latent, w_q, w_kv


def quant_kw(fmt, scale, q=True, k=True):
    kw = {}
    if q:
        kw.update(q_format=fmt, q_scale=scale)
    if k:
        kw.update(k_nope_format=fmt, k_nope_scale=scale)
    return kw


# ---- split_qk_norm -------------------------------------------------------------------------
@pytest.mark.parametrize("fmt,scale", ALL_FORMATS, ids=FMT_IDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_split_qk_norm_quant(fmt, scale, dtype):
    latent, w_q, w_kv = make(dtype, seed=len(fmt) + len(scale))
    q0, k0, pe0 = mlafuse.split_qk_norm(latent, w_q, w_kv)
    q, k, pe, qd, qs, kd, ks = mlafuse.split_qk_norm(latent, w_q, w_kv, **quant_kw(fmt, scale))
    assert same_bytes(q, q0) and same_bytes(k, k0) and same_bytes(pe, pe0)
    check_pass(q0, qd, qs, fmt, scale)
    check_pass(k0, kd, ks, fmt, scale)
    # quantized only: no dense q_norm nor k_nope, the same bytes
    r = mlafuse.split_qk_norm(latent, w_q, w_kv, return_q=False, return_k_nope=False,
                              return_k_pe=False, **quant_kw(fmt, scale))
    assert r[:3] == (None, None, None)
    assert all(same_bytes(a, b) for a, b in zip(r[3:], (qd, qs, kd, ks)))
    # one of the two
    r = mlafuse.split_qk_norm(latent, w_q, w_kv, return_q=False, **quant_kw(fmt, scale, k=False))
    assert r[0] is None and same_bytes(r[1], k0) and r[5] is None and r[6] is None
    assert same_bytes(r[3], qd) and same_bytes(r[4], qs)


# ---- mla_kv_cache --------------------------------------------------------------------------
def kv_inputs(dtype, T=11, Q=384, C=256, R=64, bs=4, seed=0):
    """mla_kv_cache's inputs: token 2 skipped (slot -1), token 5 a slot past the cache and token 7
    a position past the table (both counted), slot_mapping one shorter than the latent."""
    latent, w_q, w_kv = make(dtype, T, Q, C, R, seed)
    rng = np.random.default_rng(seed + 1)
    max_pos = 32
    pos = rng.integers(0, max_pos, T).astype(np.int64)
    nb = (T + bs - 1) // bs + 1
    slots = rng.permutation(nb * bs)[:T - 1].astype(np.int64)
    slots[2], slots[5], pos[7] = -1, nb * bs + 3, max_pos + 1
    return dict(latent=latent, w_q=w_q, w_kv=w_kv, positions=pos,
                cos_sin=mlafuse.rope_table(max_pos, R if R else 64), slot_mapping=slots), nb, bs


def kv_call(a, cache, **kw):
    err = np.zeros(1, np.int32)
    r = mlafuse.mla_kv_cache(a["latent"], a["w_q"], a["w_kv"], a["positions"], a["cos_sin"],
                             a["slot_mapping"], cache, error_count=err, **kw)
    return r, err


@pytest.mark.parametrize("fmt,scale", ALL_FORMATS, ids=FMT_IDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_mla_kv_cache_quant(fmt, scale, dtype):
    """Every token's rows are quantized (the skipped and the counted ones too, as the dense q and
    k_nope are); the cache and the error count are the plain call's."""
    a, nb, bs = kv_inputs(dtype, seed=len(fmt) * 3 + len(scale))
    W = 256 + 64
    c0, c1, c2 = (np.full((nb, bs, W), -7.0, dt(dtype)) for _ in range(3))
    (q0, k0, pe0), e0 = kv_call(a, c0, return_k_nope=True, return_k_pe=True)
    assert e0[0] == 2
    r, e1 = kv_call(a, c1, **quant_kw(fmt, scale))
    q, k, pe, qd, qs, kd, ks = r
    assert k is None and pe is None and same_bytes(q, q0)
    assert same_bytes(c1, c0) and e1[0] == e0[0]
    check_pass(q0, qd, qs, fmt, scale)
    check_pass(k0, kd, ks, fmt, scale)
    r, _ = kv_call(a, c2, return_q=False, **quant_kw(fmt, scale))
    assert r[:3] == (None, None, None) and same_bytes(c2, c0)
    assert all(same_bytes(x, y) for x, y in zip(r[3:], (qd, qs, kd, ks)))


def _cache_case(name, dtype, nb, bs, C, R):
    """A fresh cache (and its format keywords) of the named format, poisoned."""
    if name == "auto":
        return dict(kv_cache=np.full((nb, bs, C + R), -7.0, dt(dtype)))
    if name == "fp8-k_scale":
        return dict(kv_cache=np.full((nb, bs, C + R), 0xA5, np.uint8), cache_format="fp8",
                    k_scale=np.array([0.03], np.float32), amax_out=np.zeros(1, np.float32))
    if name == "fp8-quant_scale-kpe":
        return dict(kv_cache=np.full((nb, bs, C), 0xA5, np.uint8), cache_format="fp8_e4m3",
                    quant_scale=np.array([20.0], np.float32),
                    kpe_cache=np.full((nb, bs, R), 0xA5, np.uint8))
    if name == "fp8_ds_mla":
        return dict(kv_cache=np.full((nb, bs, C + C // 32 + 2 * R), 0xA5, np.uint8),
                    cache_format="fp8_ds_mla", tile_scale="ue8m0")
    assert name == "fp8_v4"
    return dict(kv_cache=np.full((nb, bs, 584), 0xA5, np.uint8), cache_format="fp8_v4",
                kv_rope_tail=64)


CACHES = ["auto", "fp8-k_scale", "fp8-quant_scale-kpe",
          pytest.param("fp8_ds_mla", marks=needs_bf16), pytest.param("fp8_v4", marks=needs_bf16)]


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("fmt,scale", [("fp8_1x128_mn", "f32"), ("mxfp8", "mx_ceil")])
def test_mla_kv_cache_quant_cache_formats(cache, fmt, scale):
    """Each cache format: its bytes (and amax_out, the separate kpe array) are the plain call's;
    the quantized outputs the quantize pass of the dense ones. fp8_v4 (kv_rope_tail) takes a
    quantized q only."""
    bf16 = cache in ("fp8_ds_mla", "fp8_v4")
    dtype = "bfloat16" if bf16 else "float16"
    C, R = (512, 0 if cache == "fp8_v4" else 64) if bf16 else (256, 64)
    a, nb, bs = kv_inputs(dtype, Q=256, C=C, R=R, seed=5)
    if cache == "fp8_v4":  # DeepSeek-V4: rope tail inside the kv part, no slot past the cache
        a["slot_mapping"][5] = -1
    k_quant = cache != "fp8_v4"
    c0, c1 = (_cache_case(cache, dtype, nb, bs, C, R) for _ in range(2))
    kv0, kv1 = c0.pop("kv_cache"), c1.pop("kv_cache")
    (q0, k0, _), e0 = kv_call(a, kv0, return_k_nope=True, **c0)
    r, e1 = kv_call(a, kv1, return_q=False, **c1, **quant_kw(fmt, scale, k=k_quant))
    assert r[0] is None and e1[0] == e0[0]
    assert same_bytes(kv1, kv0), "the cache: the plain call's bytes"
    for key in ("amax_out", "kpe_cache"):
        if key in c1:
            assert same_bytes(c1[key], c0[key]), key
    check_pass(q0, r[3], r[4], fmt, scale)
    if k_quant:
        check_pass(k0, r[5], r[6], fmt, scale)
    else:
        assert r[5] is None and r[6] is None


# ---- mla_kv_cache_dsa ----------------------------------------------------------------------
def dsa_inputs(dtype, T=10, bs=4, seed=0):
    a, nb, _ = kv_inputs(dtype, T=T, Q=256, C=128, R=64, bs=bs, seed=seed)
    rng = np.random.default_rng(seed + 2)
    kw = (0.3 + rng.standard_normal((T, 128 + 16))).astype(dt(dtype))
    a.update(index_k=kw[:, :128], index_weight=(1 + 0.2 * rng.standard_normal(128)).astype(np.float32),
             index_bias=(0.3 * rng.standard_normal(128)).astype(np.float32))
    return a, nb, bs


def dsa_call(a, nb, bs, **kw):
    kv = np.full((nb, bs, 128 + 64), -7.0, a["latent"].dtype)
    ic = np.full((nb, bs * 132 + 3), 0xA5, np.uint8)[:, :bs * 132]
    topk = np.zeros((a["latent"].shape[0], 4), np.int32)
    err = np.zeros(1, np.int32)
    r = mlafuse.mla_kv_cache_dsa(a["latent"], a["w_q"], a["w_kv"], a["positions"], a["cos_sin"],
                                 a["slot_mapping"], kv, a["index_k"], a["index_weight"],
                                 a["index_bias"], ic, topk_fill=topk, error_count=err, **kw)
    return r, (kv, ic, topk, err)


@pytest.mark.parametrize("fmt,scale", ALL_FORMATS, ids=FMT_IDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_mla_kv_cache_dsa_quant(fmt, scale, dtype):
    a, nb, bs = dsa_inputs(dtype, seed=len(fmt) + 7 * len(scale))
    T = a["latent"].shape[0]
    io = [np.full((T, 128), -7.0, a["latent"].dtype) for _ in range(2)]  # rows of skipped tokens stay
    (q0, k0, _, io0), s0 = dsa_call(a, nb, bs, return_k_nope=True, index_out=io[0])
    r, s1 = dsa_call(a, nb, bs, index_out=io[1], **quant_kw(fmt, scale))
    assert len(r) == 8 and same_bytes(r[0], q0) and r[1] is None and same_bytes(r[3], io0)
    assert all(same_bytes(x, y) for x, y in zip(s1, s0)), "caches, top-k fill, error count"
    check_pass(q0, r[4], r[5], fmt, scale)
    check_pass(k0, r[6], r[7], fmt, scale)
    r2, s2 = dsa_call(a, nb, bs, return_q=False, **quant_kw(fmt, scale))
    assert r2[:4] == (None, None, None, None)
    assert all(same_bytes(x, y) for x, y in zip(r2[4:], r[4:]))
    assert all(same_bytes(x, y) for x, y in zip(s2, s0))
    # without a format the call is the plain one, with its four outputs
    r3, _ = dsa_call(a, nb, bs)
    assert len(r3) == 4 and same_bytes(r3[0], q0)


# ---- given outputs, out= -------------------------------------------------------------------
def test_given_outputs_and_out():
    """Given outputs are written and returned as they are (an MN-major buffer's padding rows
    untouched; the e4m3 data as uint8 or ml_dtypes float8); out= of 7 is the same; None entries
    are allocated."""
    latent, w_q, w_kv = make("float32", T=6, Q=256, C=512)
    _, _, _, qd0, qs0, kd0, ks0 = mlafuse.split_qk_norm(latent, w_q, w_kv, q_format="fp8_1x128_mn",
                                                        k_nope_format="fp8_1x128_ue8m0")
    buf = np.full((2, 12), -1.0, np.float32)  # ld 12 >= round_up(6, 4); 16-byte rows
    qs = buf[:, :6].T
    assert qs.T.ctypes.data % 16 == 0
    kbuf = np.full((1, 8), -1, np.int32)
    ks = kbuf[:, :6].T
    qd = np.zeros((6, 256), np.uint8)
    kd = np.zeros((6, 512), np.uint8)
    q, k, pe = np.empty((6, 256), np.float32), np.empty((6, 512), np.float32), np.empty((6, 64), np.float32)
    got = mlafuse.split_qk_norm(latent, w_q, w_kv, q_format="fp8_1x128_mn",
                                k_nope_format="fp8_1x128_ue8m0", out=(q, k, pe, qd, qs, kd, ks))
    assert all(g is w for g, w in zip(got, (q, k, pe, qd, qs, kd, ks)))
    assert np.array_equal(qd, qd0) and np.array_equal(qs, qs0) and np.array_equal(kd, kd0)
    assert np.array_equal(ks, ks0)
    assert np.all(buf[:, 6:] == -1.0) and np.all(kbuf[:, 6:] == -1), "padding rows untouched"
    got = mlafuse.split_qk_norm(latent, w_q, w_kv, q_format="fp8_1x128_mn",
                                k_nope_format="fp8_1x128_ue8m0", q_data=qd, k_nope_scales=ks)
    assert got[3] is qd and got[6] is ks and np.array_equal(got[4], qs0)
    got = mlafuse.split_qk_norm(latent, w_q, w_kv, q_format="fp8_1x128_mn",
                                out=(None, None, None, qd, None, None, None))
    assert got[3] is qd and got[5] is None and np.array_equal(got[4], qs0)
    # mla_kv_cache and mla_kv_cache_dsa: out= of 7 / 8
    a, nb, bs = kv_inputs("float32", Q=256, C=256)
    qd2 = np.zeros((11, 256), np.uint8)
    r, _ = kv_call(a, np.zeros((nb, bs, 320), np.float32), q_format="fp8_1x128",
                   out=(None, None, None, qd2, None, None, None))
    assert r[3] is qd2 and r[0] is not None and r[5] is None
    a, nb, bs = dsa_inputs("float32")
    qd3 = np.zeros((10, 256), np.uint8)
    r, _ = dsa_call(a, nb, bs, q_format="mxfp8", out=(None, None, None, None, qd3, None, None, None))
    assert len(r) == 8 and r[4] is qd3 and r[5].shape == (10, 8)
    with pytest.raises(ValueError, match=r"tuple of 4 .*, got 7 entries; with quantized outputs, of 8"):
        dsa_call(a, nb, bs, q_format="mxfp8", out=(None,) * 7)
    with pytest.raises(ValueError, match="not both"):
        mlafuse.split_qk_norm(latent, w_q, w_kv, q_format="mxfp8", q_data=qd,
                              out=(None,) * 7)
    with pytest.raises(ValueError, match=r"tuple of 3 .*, got 5 entries; with quantized outputs, of 7"):
        mlafuse.split_qk_norm(latent, w_q, w_kv, out=(None,) * 5)


@needs_bf16
def test_float8_data_from_ml_dtypes():
    latent, w_q, w_kv = make("bfloat16", T=3, Q=128, C=128)
    qd = np.zeros((3, 128), ml_dtypes.float8_e4m3fn)
    r = mlafuse.split_qk_norm(latent, w_q, w_kv, q_format="fp8_1x128", q_data=qd)
    assert r[3] is qd
    check_pass(r[0], qd.view(np.uint8), r[4], "fp8_1x128", "f32")


# ---- rejections ----------------------------------------------------------------------------
def test_rejections_name_the_argument_and_write_nothing():
    latent, w_q, w_kv = make("float32", T=4, Q=200, C=240, R=64)
    q = np.full((4, 200), 3.0, np.float32)
    k = np.full((4, 240), 3.0, np.float32)
    pe = np.full((4, 64), 3.0, np.float32)
    qd = np.full((4, 200), 5, np.uint8)
    kd = np.full((4, 240), 5, np.uint8)

    def untouched():
        return (np.all(q == 3.0) and np.all(k == 3.0) and np.all(pe == 3.0) and np.all(qd == 5)
                and np.all(kd == 5))

    def rejected(match, **kw):
        with pytest.raises(mlafuse.MlafError) as e:
            mlafuse.split_qk_norm(latent, w_q, w_kv, q=q, k_nope=k, k_pe=pe, **kw)
        assert match in e.value.message, e.value.message
        assert untouched(), "nothing written"

    rejected("quant->q: K = 200 values a row, expected a multiple of 128", q_format="fp8_1x128",
             q_data=qd)
    rejected("quant->k_nope: K = 240 values a row, expected a multiple of 32",
             k_nope_format="mxfp8", k_nope_data=kd)
    rejected("quant->q.format = 9", q_format=9, q_data=qd)
    rejected("quant->q.format = 0 (none) but quant->q.data is given", q_data=qd)
    latent2, w_q2, w_kv2 = make("float32", T=4, Q=256, C=256)
    with pytest.raises(mlafuse.MlafError) as e:
        mlafuse.split_qk_norm(latent2, w_q2, w_kv2, q_format="mxfp8", q_scale="f32")
    assert "quant->q.scale = 0 (f32), expected 2 (mx_floor) or 3 (mx_ceil)" in e.value.message
    with pytest.raises(mlafuse.MlafError) as e:
        mlafuse.split_qk_norm(latent2, w_q2, w_kv2, q_format="fp8_1x128",
                              q_scales=np.zeros((4, 2), np.float64))
    assert "quant->q.scales.dtype" in e.value.message
    with pytest.raises(mlafuse.MlafError) as e:  # the quantized bytes may not alias the latent
        mlafuse.split_qk_norm(latent2, w_q2, w_kv2, q_format="fp8_1x128",
                              q_data=latent2.view(np.uint8)[:, :256])
    assert "quant->q.data" in e.value.message and "latent" in e.value.message
    with pytest.raises(mlafuse.MlafError) as e:
        mlafuse.split_qk_norm(latent2, w_q2, w_kv2, return_q=False)
    assert "q" in e.value.message
    with pytest.raises(mlafuse.MlafError) as e:  # no q part
        mlafuse.split_qk_norm(latent2[:, 256:], None, w_kv2, q_format="fp8_1x128")
    assert "quant->q has format fp8_1x128 but q_lora_rank = 0" in e.value.message
    for kw, name in ((dict(q_format="nvfp4"), "q_format"), (dict(k_nope_format="int8"), "k_nope_format"),
                     (dict(q_format="mxfp8", q_scale="round"), "q_scale"),
                     (dict(k_nope_format="mxfp8", k_nope_scale="up"), "k_nope_scale")):
        with pytest.raises(ValueError, match=name):
            mlafuse.split_qk_norm(latent2, w_q2, w_kv2, **kw)
    with pytest.raises(TypeError, match="unexpected keyword argument 'q_fromat'"):
        mlafuse.split_qk_norm(latent2, w_q2, w_kv2, q_fromat="fp8_1x128")
    with pytest.raises(ValueError, match="inplace"):
        mlafuse.split_qk_norm(latent2.copy(), w_q2, w_kv2, inplace=True, q_format="fp8_1x128")
    # mla_kv_cache: the cache stays as it was
    a, nb, bs = kv_inputs("float32", Q=256, C=200)
    cache = np.full((nb, bs, 264), -7.0, np.float32)
    with pytest.raises(mlafuse.MlafError) as e:
        kv_call(a, cache, k_nope_format="fp8_1x128_cm")
    assert "quant->k_nope: K = 200" in e.value.message and np.all(cache == -7.0)
    # a quantized k_nope with DeepSeek-V4's rope tail
    a, nb, bs = kv_inputs("float32", Q=128, C=512, R=0)
    cache = np.full((nb, bs, 512), -7.0, np.float32)
    with pytest.raises(mlafuse.MlafError) as e:
        kv_call(a, cache, kv_rope_tail=64, k_nope_format="fp8_1x128")
    assert "quant->k_nope has format fp8_1x128 with kv_rope_tail = 64" in e.value.message
    assert np.all(cache == -7.0)
    r, _ = kv_call(a, cache, kv_rope_tail=64, q_format="fp8_1x128", return_q=False)
    assert r[0] is None and r[3].shape == (11, 128)
    # mla_kv_cache_dsa: the index cache stays as it was
    a, nb, bs = dsa_inputs("float32")
    qd = np.full((10, 256), 5, np.uint8)
    with pytest.raises(mlafuse.MlafError) as e:
        dsa_call(a, nb, bs, q_format="mxfp8", q_scale="ue8m0", q_data=qd)
    assert "quant->q.scale = 1 (ue8m0)" in e.value.message and np.all(qd == 5)
