"""The DSA indexer (docs/dsa.md) through the numpy path: mlafuse.mla_kv_cache_dsa and
mlafuse.indexer_q against a plain float64 transcription of docs/dsa.md (LayerNorm, RoPE on dims
[0, 64), the optional Hadamard, each rounded to the dtype; ue8m0 / f32 scales; the block-planar
132-byte index cache), strided GEMM slices, an odd block stride, the in-place dense output,
errors. Needs only numpy and pytest."""
import numpy as np
import pytest

import mlafuse
import reference as ref
from mlafuse import MlafError

DTYPES = ["float32", "float16"]
try:
    import ml_dtypes  # noqa: F401

    DTYPES.append("bfloat16")
except ImportError:
    pass


def np_dtype(name):
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def rnd(x, dt):
    return np.asarray(x, np.float64).astype(np.float32).astype(dt).astype(np.float64)


def hadamard128():
    h = np.array([[1.0]])
    while h.shape[0] < 128:
        h = np.block([[h, h], [h, -h]])
    return h


H128 = hadamard128()


def ref_index_row(x, pos, cos_sin, style, hadamard, dt, w=None, b=None, eps=1e-6):
    """docs/dsa.md in float64, rounded to dt after each step; x [T, 128]."""
    y = np.asarray(x, np.float64)
    if w is not None:
        mu = y.mean(axis=1, keepdims=True)
        var = ((y - mu) ** 2).mean(axis=1, keepdims=True)
        y = rnd((y - mu) / np.sqrt(var + eps) * w + b, dt)
    cs = cos_sin[pos].astype(np.float64)
    c, s = cs[:, :32], cs[:, 32:64]
    if style == "neox":
        a, bb = y[:, 0:32], y[:, 32:64]
        y0, y1 = a * c - bb * s, bb * c + a * s
        y = np.concatenate([rnd(y0, dt), rnd(y1, dt), y[:, 64:]], axis=1)
    else:
        a, bb = y[:, 0:64:2], y[:, 1:64:2]
        y0, y1 = a * c - bb * s, bb * c + a * s
        r = np.empty((y.shape[0], 64))
        r[:, 0::2], r[:, 1::2] = rnd(y0, dt), rnd(y1, dt)
        y = np.concatenate([r, y[:, 64:]], axis=1)
    if hadamard:
        y = rnd(y @ H128.T * float(np.float32(128 ** -0.5)), dt)
    return y


def scale_of(amax, mode, eps=1e-4):
    a = np.maximum(np.asarray(amax, np.float32), np.float32(eps))
    q = a / np.float32(448)
    if mode == "f32":
        return q.astype(np.float32)
    return np.ldexp(np.float32(1), ref.ceil_log2(q)).astype(np.float32)


def tol(refv, dt, k):
    """k units of dt at each row's largest value (the steps' roundings carried through)."""
    eps = {np.dtype(np.float32): 2.0 ** -22, np.dtype(np.float16): 2.0 ** -10}.get(np.dtype(dt), 2.0 ** -7)
    return k * eps * np.abs(refv).max(axis=1, keepdims=True) + 1e-30


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", ["neox", "interleaved"])
@pytest.mark.parametrize("hadamard", [False, True])
@pytest.mark.parametrize("scale", ["ue8m0", "f32"])
@pytest.mark.parametrize("T,bs", [(0, 64), (1, 1), (37, 16), (130, 64)])
def test_mla_kv_cache_dsa(dtype, style, hadamard, scale, T, bs):
    dt = np_dtype(dtype)
    rng = np.random.default_rng(T * 7 + bs + hadamard)
    Q, C, R, HI = 48, 128, 64, 32
    latent = rng.standard_normal((T, Q + C + R)).astype(dt)
    w_q = (1 + 0.1 * rng.standard_normal(Q)).astype(dt)
    w_kv = (1 + 0.1 * rng.standard_normal(C)).astype(dt)
    kw = (0.3 + rng.standard_normal((T, 128 + HI))).astype(dt)  # the [T, 128 + H] GEMM output
    index_k = kw[:, :128]
    iw = (1 + 0.2 * rng.standard_normal(128)).astype(np.float32)
    ib = (0.3 * rng.standard_normal(128)).astype(np.float32)
    max_pos = 64
    cos_sin = mlafuse.rope_table(max_pos, R)
    pos = rng.integers(0, max_pos, T).astype(np.int64)
    nb = (T + bs - 1) // bs + 2
    slots = rng.permutation(nb * bs)[:T].astype(np.int64)
    if T > 3:
        slots[2] = -1  # skipped: dense output only
    kv_cache = np.zeros((nb, bs, C + R), dt)
    stride = bs * 132 + 7  # odd block stride
    flat = rng.integers(0, 256, nb * stride + 5).astype(np.uint8)
    before = flat.copy()
    index_cache = np.lib.stride_tricks.as_strided(flat[3:], shape=(nb, bs * 132), strides=(stride, 1))
    topk = np.zeros((T, 8), np.int32)
    ip = mlafuse.indexer_params(style, hadamard=hadamard, scale=scale)
    q, k_nope, k_pe, out = mlafuse.mla_kv_cache_dsa(
        latent, w_q, w_kv, pos, cos_sin, slots, kv_cache, index_k, iw, ib, index_cache, indexer=ip,
        return_index_out=True, topk_fill=topk, eps_q=1e-6, eps_kv=1e-6, return_k_nope=True,
        return_k_pe=True)
    # the MLA part equals the op without the branch
    kv2 = np.zeros_like(kv_cache)
    q2, kn2, kp2 = mlafuse.mla_kv_cache(latent, w_q, w_kv, pos, cos_sin, slots, kv2, eps_q=1e-6, eps_kv=1e-6,
                                        return_k_nope=True, return_k_pe=True)
    assert np.array_equal(kv_cache.view(np.uint8), kv2.view(np.uint8))
    if T:
        assert np.array_equal(q.view(np.uint8), q2.view(np.uint8))
        assert np.array_equal(k_pe.view(np.uint8), kp2.view(np.uint8))
    assert np.all(topk == -1)
    want = ref_index_row(index_k, pos, cos_sin, style, hadamard, dt, iw.astype(np.float64), ib.astype(np.float64))
    got = out.astype(np.float64)
    assert np.all(np.abs(got - want) <= tol(want, dt, 24 if hadamard else 4)), np.abs(got - want).max()
    # the records: block-planar, the op's own dense row quantized
    named = np.zeros(flat.shape, bool)
    for t in range(T):
        if slots[t] < 0:
            continue
        b, o = divmod(int(slots[t]), bs)
        base = 3 + b * stride
        vals = flat[base + 128 * o: base + 128 * o + 128]
        sc = flat[base + 128 * bs + 4 * o: base + 128 * bs + 4 * o + 4].view("<f4")[0]
        named[base + 128 * o: base + 128 * o + 128] = True
        named[base + 128 * bs + 4 * o: base + 128 * bs + 4 * o + 4] = True
        row = out[t].astype(np.float32)
        s = scale_of(ref.nan_amax(row), scale)
        assert sc == s, (t, sc, s)
        assert np.array_equal(vals, ref.e4m3(row / s)), t
        dec = ref.e4m3_decode(vals) * float(s)
        assert np.all(np.abs(dec - row) <= np.maximum(np.abs(row) * 2.0 ** -4, 2.0 ** -10 * float(s)))
    assert np.array_equal(flat[~named], before[~named])


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_out_in_place(dtype):
    dt = np_dtype(dtype)
    rng = np.random.default_rng(5)
    T, Q, C, R = 9, 0, 128, 64
    latent = rng.standard_normal((T, C + R)).astype(dt)
    w_kv = np.ones(C, dt)
    kw = rng.standard_normal((T, 160)).astype(dt)
    index_k = kw[:, :128]
    x0 = index_k.copy()
    cos_sin = mlafuse.rope_table(16, R)
    pos = np.arange(T, dtype=np.int32)
    slots = np.arange(T, dtype=np.int32)
    kv = np.zeros((T, 1, C + R), dt)
    ic = np.zeros((T, 132), np.uint8)
    iw, ib = np.ones(128, np.float32), np.zeros(128, np.float32)
    mlafuse.mla_kv_cache_dsa(latent, None, w_kv, pos, cos_sin, slots, kv, index_k, iw, ib, ic,
                             indexer=mlafuse.indexer_params("interleaved"), index_out=index_k)
    want = ref_index_row(x0, pos, cos_sin, "interleaved", False, dt, iw.astype(np.float64), ib.astype(np.float64))
    assert np.all(np.abs(index_k.astype(np.float64) - want) <= tol(want, dt, 4))
    assert np.array_equal(kw[:, 128:], kw[:, 128:])  # the weights part is another view: untouched below
    ic2 = np.zeros_like(ic)
    mlafuse.mla_kv_cache_dsa(latent, None, w_kv, pos, cos_sin, slots, kv, x0, iw, ib, ic2,
                             indexer=mlafuse.indexer_params("interleaved"))
    assert np.array_equal(ic, ic2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", ["neox", "interleaved"])
@pytest.mark.parametrize("hadamard", [False, True])
@pytest.mark.parametrize("scale", ["ue8m0", "f32"])
@pytest.mark.parametrize("T,H", [(0, 32), (1, 64), (23, 32)])
def test_indexer_q(dtype, style, hadamard, scale, T, H):
    dt = np_dtype(dtype)
    rng = np.random.default_rng(T + H + 3 * hadamard)
    qbuf = rng.standard_normal((T, H, 136)).astype(dt)
    q_idx = qbuf[:, :, 3:131]
    kw = rng.standard_normal((T, 128 + H)).astype(np.float32)
    weights = kw[:, 128:]
    cos_sin = mlafuse.rope_table(32, 64)
    pos = rng.integers(0, 32, T).astype(np.int64)
    q_pe = rng.standard_normal((T, 4, 192)).astype(dt)
    q_pe0 = q_pe.copy()
    ip = mlafuse.indexer_params(style, hadamard=hadamard, scale=scale)
    q_fp8, w_out = mlafuse.indexer_q(q_idx, pos, cos_sin, weights, indexer=ip, q_pe=q_pe)
    # q_pe: exactly rope_q on a copy
    mlafuse.rope_q(q_pe0, pos, cos_sin, style="interleaved")
    assert np.array_equal(q_pe.view(np.uint8), q_pe0.view(np.uint8))
    wf, hf = np.float32(128 ** -0.5), np.float32(H ** -0.5)
    for t in range(T):
        want = ref_index_row(q_idx[t], np.full(H, pos[t]), cos_sin, style, hadamard, dt)
        s_ref = scale_of(np.abs(want).max(axis=1), scale)
        for h in range(H):
            # the scale w_out was folded with: the reference's, or one next to it
            cands = [s_ref[h] * np.float32(k) for k in (0.5, 1.0, 2.0)] if scale == "ue8m0" else None
            if cands is None:  # f32: amax / 448 of the op's own rounded row, near the reference's
                s_got = np.float32(w_out[t, h] / (weights[t, h] * wf * hf))
                assert abs(s_got / s_ref[h] - 1) < 0.05
                cands = [s_got]
                for _ in range(8):
                    cands += [np.nextafter(cands[-2 if len(cands) > 1 else 0], np.float32(0)),
                              np.nextafter(cands[-1], np.float32(np.inf))]
            ok = [s for s in cands if np.float32(np.float32(np.float32(weights[t, h] * s) * wf) * hf) == w_out[t, h]]
            assert ok or weights[t, h] == 0, (t, h)
            s = ok[0] if ok else s_ref[h]
            dec = ref.e4m3_decode(q_fp8[t, h]) * float(s)
            bound = np.maximum(np.abs(want[h]) * 2.0 ** -4, 2.0 ** -10 * float(s)) + tol(want[h:h + 1], dt, 24)[0]
            assert np.all(np.abs(dec - want[h]) <= bound), (t, h)


def test_errors():
    T = 3
    latent = np.zeros((T, 192), np.float32)
    w_kv = np.ones(128, np.float32)
    cos_sin = mlafuse.rope_table(8, 64)
    pos = np.zeros(T, np.int64)
    slots = np.arange(T, dtype=np.int64)
    kv = np.zeros((T, 1, 192), np.float32)
    ik = np.zeros((T, 128), np.float32)
    ic = np.zeros((T, 131), np.uint8)  # one byte short of 132 * block_size
    with pytest.raises(MlafError) as e:
        mlafuse.mla_kv_cache_dsa(latent, None, w_kv, pos, cos_sin, slots, kv, ik, np.ones(128, np.float32),
                                 np.zeros(128, np.float32), ic)
    assert "index_cache.shape[1]" in str(e.value)
    with pytest.raises(MlafError) as e:
        mlafuse.indexer_q(np.zeros((T, 4, 64), np.float32), pos, cos_sin, np.zeros((T, 4), np.float32))
    assert "q_idx.shape[2]" in str(e.value)
    with pytest.raises(ValueError):
        mlafuse.indexer_params("sideways")
    assert mlafuse.indexer_params(config="glm-5").style == 0  # interleaved
    assert mlafuse.indexer_params(config="deepseek-v3.2").style == 1  # neox
