"""numpy arrays on the CPU backend: every op against the float64 references of reference.py,
within the tolerances of docs/conventions.md; strided views (no copies), given and allocated
outputs, the in-place form, and errors raised as MlafError with the library's message. Needs
only numpy and pytest."""
import zlib

import numpy as np
import pytest

import mlafuse
import reference as ref

POISON = -3584.0  # exact in f32, f16 and bf16

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


def wide_rows(rng, T, W, dtype, pad=(5, 11)):
    """A [T, W] view into a wider buffer (rows strided, start offset), like a GEMM slice."""
    lo, hi = pad
    buf = rng.standard_normal((T, lo + W + hi)).astype(np_dtype(dtype))
    return buf, buf[:, lo:lo + W]


def poisoned(shape, dtype, pad=3):
    """A buffer with guard zones around the view that is handed out."""
    T, W = shape
    buf = np.full((T + 2, W + 2 * pad), POISON, np_dtype(dtype))
    return buf, buf[1:T + 1, pad:pad + W]


def check_guards(buf, view_rows, pad):
    g = ref.f64(buf)
    mask = np.ones(g.shape, bool)
    mask[1:view_rows + 1, pad:g.shape[1] - pad] = False
    assert np.all(g[mask] == POISON), "guard zone written"


# ---- split_qk_norm -------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T", [0, 1, 7, 99])
@pytest.mark.parametrize("QCR", [(768, 512, 64), (0, 512, 64), (24, 40, 8)],
                         ids=["glm", "no-q-lora", "small"])
@pytest.mark.parametrize("wf32", [False, True], ids=["w-native", "w-f32"])
def test_split_qk_norm(dtype, T, QCR, wf32):
    Q, C, R = QCR
    rng = np.random.default_rng(1000 + T + Q)
    _, latent = wide_rows(rng, T, Q + C + R, dtype)
    wdt = "float32" if wf32 else dtype
    w_q = (1 + 0.1 * rng.standard_normal(Q)).astype(np_dtype(wdt)) if Q else None
    w_kv = (1 + 0.1 * rng.standard_normal(C)).astype(np_dtype(wdt))
    q, k_nope, k_pe = mlafuse.split_qk_norm(latent, w_q, w_kv, eps_q=1e-5, eps_kv=1e-6)
    rq, rk, rp = ref.split_qk_norm(latent, w_q, w_kv, Q, C, R, 1e-5, 1e-6)
    if Q:
        assert q.dtype == latent.dtype and q.shape == (T, Q)
        ref.assert_close_ulp(q, rq, dtype, "q")
    else:
        assert q is None
    ref.assert_close_ulp(k_nope, rk, dtype, "k_nope")
    assert k_pe.dtype == latent.dtype
    assert np.array_equal(k_pe.view(np.uint8), np.ascontiguousarray(latent[:, Q + C:]).view(np.uint8))


@pytest.mark.parametrize("dtype", DTYPES)
def test_split_qk_norm_given_strided_outputs(dtype):
    Q, C, R, T, pad = 48, 32, 16, 13, 3
    rng = np.random.default_rng(5)
    _, latent = wide_rows(rng, T, Q + C + R, dtype)
    w_q = np.ones(Q, np.float32)
    w_kv = rng.standard_normal(C).astype(np.float32)
    bq, q = poisoned((T, Q), dtype, pad)
    bk, k = poisoned((T, C), dtype, pad)
    bp, p = poisoned((T, R), dtype, pad)
    rq, rk, rp = ref.split_qk_norm(latent, w_q, w_kv, Q, C, R, 1e-6, 1e-6)
    out = mlafuse.split_qk_norm(latent, w_q, w_kv, eps_q=1e-6, eps_kv=1e-6, q=q, k_nope=k, k_pe=p)
    assert out[0] is q and out[1] is k and out[2] is p  # written in place, no copies
    ref.assert_close_ulp(q, rq, dtype, "q")
    ref.assert_close_ulp(k, rk, dtype, "k_nope")
    assert np.array_equal(ref.f64(p), rp)
    for b in (bq, bk, bp):
        check_guards(b, T, pad)


def test_split_qk_norm_without_k_pe():
    rng = np.random.default_rng(6)
    latent = rng.standard_normal((5, 16 + 8 + 4)).astype(np.float32)
    q, k, p = mlafuse.split_qk_norm(latent, np.ones(16, np.float32), np.ones(8, np.float32),
                                    return_k_pe=False)
    assert p is None and q.shape == (5, 16) and k.shape == (5, 8)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Q", [0, 32])
def test_split_qk_norm_inplace(dtype, Q):
    C, R, T = 64, 16, 9
    rng = np.random.default_rng(7)
    buf, latent = wide_rows(rng, T, Q + C + R, dtype)
    before = latent.copy()
    w_q = rng.standard_normal(Q).astype(np.float32) if Q else None
    w_kv = rng.standard_normal(C).astype(np.float32)
    rq, rk, rp = ref.split_qk_norm(before, w_q, w_kv, Q, C, R, 1e-5, 1e-5)
    q, k, p = mlafuse.split_qk_norm(latent, w_q, w_kv, inplace=True)
    assert np.shares_memory(k, buf)
    if Q:
        ref.assert_close_ulp(latent[:, :Q], rq, dtype, "q in place")
    ref.assert_close_ulp(latent[:, Q:Q + C], rk, dtype, "k_nope in place")
    assert np.array_equal(ref.f64(latent[:, Q + C:]), rp)


# ---- RoPE table ----------------------------------------------------------------------------
def test_rope_table():
    t = mlafuse.rope_table(17, 8, 10000.0)
    assert t.dtype == np.float32 and t.shape == (17, 8)
    p = np.arange(17)[:, None]
    f = 10000.0 ** (-np.arange(4) * 2 / 8)
    np.testing.assert_allclose(t[:, :4], np.cos(p * f), rtol=0, atol=1e-7)
    np.testing.assert_allclose(t[:, 4:], np.sin(p * f), rtol=0, atol=1e-7)
    with pytest.raises(mlafuse.MlafError):
        mlafuse.rope_table(4, 7)


def hf_yarn_table(max_pos, dim, base, rs):
    """Hugging Face's YaRN initialisation (correction range, linear ramp, interpolation /
    extrapolation blend, get_mscale attention factor), transcribed in float64 numpy."""
    import math

    factor, orig = rs["factor"], rs["original_max_position_embeddings"]
    mscale, mscale_all_dim = rs.get("mscale"), rs.get("mscale_all_dim")

    def get_mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    att = rs.get("attention_factor")
    if att is None:
        att = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) \
            if mscale and mscale_all_dim else get_mscale(factor)

    def corr_dim(rot):
        return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = corr_dim(rs.get("beta_fast") or 32), corr_dim(rs.get("beta_slow") or 1)
    if rs.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    extra, inter = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    extra_factor = 1 - np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    inv_freq = inter * (1 - extra_factor) + extra * extra_factor
    ang = np.arange(max_pos, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.concatenate([np.cos(ang) * att, np.sin(ang) * att], axis=1)


DEEPSEEK_V3_YARN = {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                    "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"}


@pytest.mark.parametrize("rs,base,dim", [
    (DEEPSEEK_V3_YARN, 10000.0, 64),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, 1e6, 128),
    ({"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "mscale": 0.707,
      "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1}, 10000.0, 64),
    ({"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
      "attention_factor": 1.0, "truncate": False}, 160000.0, 64),
])
def test_rope_table_yarn(rs, base, dim):
    max_pos = 20000
    t = mlafuse.rope_table(max_pos, dim, base, scaling=rs)
    want = hf_yarn_table(max_pos, dim, base, rs)
    err = np.abs(t.astype(np.float64) - want) / np.maximum(np.abs(want) * 2.0**-24, 2.0**-30)
    assert err.max() <= 2.0, f"worst {err.max():.3g} units at {np.unravel_index(err.argmax(), err.shape)}"


def test_rope_table_scaling_none_and_errors():
    plain = mlafuse.rope_table(32, 64)
    assert np.array_equal(mlafuse.rope_table(32, 64, scaling=None), plain)
    assert np.array_equal(mlafuse.rope_table(32, 64, scaling={"rope_type": "default"}), plain)
    with pytest.raises(mlafuse.MlafError, match="type 'linear' is not supported"):
        mlafuse.rope_table(32, 64, scaling={"type": "linear", "factor": 2.0})
    with pytest.raises(mlafuse.MlafError, match=r"unknown key\(s\) \['low_freq_factor'\]"):
        mlafuse.rope_table(32, 64, scaling=dict(DEEPSEEK_V3_YARN, low_freq_factor=1.0))
    with pytest.raises(mlafuse.MlafError, match="'original_max_position_embeddings' is required"):
        mlafuse.rope_table(32, 64, scaling={"type": "yarn", "factor": 40})
    with pytest.raises(mlafuse.MlafError, match="yarn expects factor >= 1"):
        mlafuse.rope_table(32, 64, scaling=dict(DEEPSEEK_V3_YARN, factor=0.5))
    with pytest.raises(TypeError):
        mlafuse.rope_table(32, 64, scaling="yarn")
    # transformers' newer rope_parameters carry rope_theta: it must agree with base
    params = dict(DEEPSEEK_V3_YARN, rope_theta=10000.0)
    assert np.array_equal(mlafuse.rope_table(64, 64, 10000.0, scaling=params),
                          mlafuse.rope_table(64, 64, 10000.0, scaling=DEEPSEEK_V3_YARN))
    with pytest.raises(mlafuse.MlafError, match="pass base=rope_theta"):
        mlafuse.rope_table(64, 64, 50000.0, scaling=params)


# ---- mla_kv_cache --------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cache_dtype", DTYPES)
@pytest.mark.parametrize("style", ["interleaved", "neox"])
@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_mla_kv_cache(dtype, cache_dtype, style, block_size, index_dtype):
    Q, C, R, T, max_pos = 64, 96, 32, 23, 512
    rng = np.random.default_rng(zlib.crc32(f"{dtype}{cache_dtype}{style}{block_size}".encode()))
    _, latent = wide_rows(rng, T, Q + C + R, dtype)
    w_q = rng.standard_normal(Q).astype(np.float32)
    w_kv = rng.standard_normal(C).astype(np_dtype(dtype))
    cos_sin = mlafuse.rope_table(max_pos, R)
    positions = rng.integers(0, max_pos, T).astype(index_dtype)
    num_blocks = 8
    n_slots = num_blocks * block_size
    slots = rng.permutation(n_slots)[:T].astype(index_dtype) if n_slots >= T else None
    if slots is None:  # block_size 1: fewer slots than tokens; make a bigger cache
        num_blocks = 2 * T
        slots = rng.permutation(num_blocks)[:T].astype(index_dtype)
    slots[3] = -1  # padding token: skipped
    cache = np.full((num_blocks, block_size, C + R), POISON, np_dtype(cache_dtype))
    err = np.zeros(1, np.int32)
    q, k_nope, k_pe = mlafuse.mla_kv_cache(
        latent, w_q, w_kv, positions, cos_sin, slots, cache, style=style, eps_q=1e-6,
        eps_kv=1e-5, return_k_nope=True, return_k_pe=True, error_count=err)
    rq, rk, rp = ref.split_qk_norm(latent, w_q, w_kv, Q, C, R, 1e-6, 1e-5)
    rp = ref.rope(rp, positions, cos_sin, style)
    ref.assert_close_ulp(q, rq, dtype, "q")
    ref.assert_close_ulp(k_nope, rk, dtype, "k_nope")
    mag = ref.rope_magnitude(rp, style)
    ref.assert_close_ulp(k_pe, rp, dtype, "k_pe (roped)", mag)
    assert err[0] == 0
    flat = cache.reshape(num_blocks * block_size, C + R)
    live = slots >= 0
    rows = slots[live].astype(np.int64)
    ref.assert_close_ulp(flat[rows, :C], rk[live], cache_dtype, "cache k_nope")
    ref.assert_close_ulp(flat[rows, C:], rp[live], cache_dtype, "cache k_pe", mag[live])
    untouched = np.setdiff1d(np.arange(flat.shape[0]), rows)
    assert np.all(ref.f64(flat[untouched]) == POISON), "a row not named by slot_mapping changed"


def test_mla_kv_cache_bad_slots_are_counted():
    Q, C, R, T = 0, 32, 16, 6
    rng = np.random.default_rng(11)
    latent = rng.standard_normal((T, C + R)).astype(np.float32)
    w_kv = np.ones(C, np.float32)
    cos_sin = mlafuse.rope_table(64, R)
    positions = np.array([0, 1, 2, 3, 99, 5], np.int64)  # 99 >= max_pos
    slots = np.array([0, 1, 1000, -1, 4, 5], np.int32)   # 1000 past the cache
    cache = np.full((8, 1, C + R), POISON, np.float32)
    err = np.zeros(1, np.int32)
    q, _, _ = mlafuse.mla_kv_cache(latent, None, w_kv, positions, cos_sin, slots, cache,
                                   error_count=err)
    assert q is None
    assert err[0] == 2
    assert np.all(cache[[2, 3, 4, 6, 7]] == POISON)
    assert np.all(cache[[0, 1, 5]] != POISON)


def test_mla_kv_cache_strided_cache():
    """A cache whose rows are padded (stride > C + R) is written in place, padding kept."""
    C, R, T = 32, 16, 4
    rng = np.random.default_rng(12)
    latent = rng.standard_normal((T, C + R)).astype(np.float32)
    big = np.full((4, 2, C + R + 8), POISON, np.float32)
    cache = big[:, :, :C + R]
    slots = np.array([0, 3, 5, 6], np.int64)
    mlafuse.mla_kv_cache(latent, None, np.ones(C, np.float32), np.arange(T), mlafuse.rope_table(8, R),
                         slots, cache)
    assert np.all(big[:, :, C + R:] == POISON)
    assert np.all(cache.reshape(8, C + R)[[1, 2, 4, 7]] == POISON)


@pytest.mark.parametrize("dtype", DTYPES)
def test_mla_kv_cache_style_none(dtype):
    """Kimi-K3's unrotated slot: k_pe and the cache's rope part are the latent's own values, no
    position is read (None here), and the kimi-k3 preset names the style."""
    Q, C, R, T = 16, 32, 8, 5
    rng = np.random.default_rng(15)
    latent = rng.standard_normal((T, Q + C + R)).astype(np_dtype(dtype))
    cache = np.full((T, 1, C + R), POISON, np_dtype(dtype))
    err = np.zeros(1, np.int32)
    _, _, k_pe = mlafuse.mla_kv_cache(latent, np.ones(Q, np.float32), np.ones(C, np.float32), None, None,
                                      np.arange(T), cache, style="none", q_lora_rank=Q, kv_lora_rank=C,
                                      rope_dim=R, return_k_pe=True, error_count=err)
    assert err[0] == 0
    assert np.array_equal(k_pe.view(np.uint8), np.ascontiguousarray(latent[:, Q + C:]).view(np.uint8))
    assert np.array_equal(np.ascontiguousarray(cache[:, 0, C:]).view(np.uint8), k_pe.view(np.uint8))
    assert mlafuse.find_preset("kimi-k3").rope_style == "none"
    q = rng.standard_normal((T, 2, 24)).astype(np_dtype(dtype))
    before = q.copy()
    mlafuse.rope_q(q, np.full(T, 10**6), mlafuse.rope_table(4, 8), style="none", error_count=err)
    assert err[0] == 0 and np.array_equal(q.view(np.uint8), before.view(np.uint8))


# ---- rope_q --------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", ["interleaved", "neox"])
def test_rope_q(dtype, style):
    T, H, nope, R, max_pos = 11, 5, 24, 16, 100
    rng = np.random.default_rng(13)
    buf = rng.standard_normal((T, H + 1, nope + R)).astype(np_dtype(dtype))
    q = buf[:, 1:, :]  # strided heads
    before = q.copy()
    head0 = buf[:, 0].copy()
    positions = rng.integers(0, max_pos, T).astype(np.int32)
    cos_sin = mlafuse.rope_table(max_pos, R)
    out = mlafuse.rope_q(q, positions, cos_sin, style=style)
    assert out is q
    assert np.array_equal(q[..., :nope], before[..., :nope])
    assert np.array_equal(buf[:, 0], head0)  # outside the view
    ref.assert_close_ulp(q[..., nope:], ref.rope(before[..., nope:], positions, cos_sin, style),
                         dtype, "rope_q", ref.rope_magnitude(before[..., nope:], style))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", ["interleaved", "neox"])
def test_rope_q_matches_cache_bit_for_bit(dtype, style):
    """A query and a key with the same values and position rotate to the same bits."""
    C, R, T = 32, 16, 8
    rng = np.random.default_rng(14)
    latent = rng.standard_normal((T, C + R)).astype(np_dtype(dtype))
    positions = rng.integers(0, 50, T).astype(np.int64)
    cos_sin = mlafuse.rope_table(50, R, 50000.0)
    cache = np.zeros((T, 1, C + R), np_dtype(dtype))
    mlafuse.mla_kv_cache(latent, None, np.ones(C, np.float32), positions, cos_sin,
                         np.arange(T), cache, style=style)
    q = np.ascontiguousarray(latent[:, None, C:])  # [T, 1, R]: nope part empty
    mlafuse.rope_q(q, positions, cos_sin, style=style)
    assert np.array_equal(q[:, 0].view(np.uint8), np.ascontiguousarray(cache[:, 0, C:]).view(np.uint8))


def test_rope_q_bad_position_counted():
    q = np.ones((3, 2, 8), np.float32)
    err = np.zeros(1, np.int32)
    mlafuse.rope_q(q, np.array([0, 5, -1], np.int64), mlafuse.rope_table(4, 8), error_count=err)
    assert err[0] == 2
    assert np.all(q[1:] == 1.0)


# ---- moe_gate ------------------------------------------------------------------------------
GATES = {
    "glm-4.7-flash": dict(E=64),
    "deepseek-v3": dict(E=256),
    "deepseek-v2": dict(E=160),
    "deepseek-v2-lite": dict(E=64),
    "kimi-k2": dict(E=384),
}


@pytest.mark.parametrize("preset", list(GATES))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T", [1, 7, 64])
def test_moe_gate_presets(preset, dtype, T):
    E = GATES[preset]["E"]
    p = mlafuse.find_preset(preset)
    rng = np.random.default_rng(T * 31 + E)
    _, logits = wide_rows(rng, T, E, dtype)
    bias = (0.01 * rng.standard_normal(E)).astype(np.float32) if p.has_score_bias else None
    weights, ids, scores = mlafuse.moe_gate(logits, bias, config=preset, return_scores=True)
    kw = p.moe_gate_kwargs()
    s, c, rids, _ = ref.moe_gate(logits, bias, kw["top_k"], kw["n_group"], kw["topk_group"],
                                 kw["score_func"], kw["group_score"], kw["renormalize"],
                                 kw["routed_scaling_factor"], kw["apply_routed_scaling"])
    assert ids.dtype == np.int32 and ids.shape == (T, p.top_k)
    assert weights.dtype == np.float32
    ref.assert_gate_ids(ids, c, rids, p.top_k, E)
    rw = ref.gate_weights(s, ids, kw["renormalize"], kw["routed_scaling_factor"],
                          kw["apply_routed_scaling"])
    np.testing.assert_allclose(weights, rw, rtol=1e-5, atol=1e-12)
    np.testing.assert_allclose(scores, s, rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize("n_shared", [1, 2])
def test_moe_gate_shared_experts_and_given_outputs(n_shared):
    T, E, k = 9, 160, 6
    rng = np.random.default_rng(21)
    logits = rng.standard_normal((T, E)).astype(np.float32)
    bw, w = poisoned((T, k + n_shared), "float32")
    bi = np.full((T + 2, k + n_shared + 6), -5, np.int32)
    i = bi[1:T + 1, 3:3 + k + n_shared]
    out = mlafuse.moe_gate(logits, None, top_k=k, n_group=8, topk_group=3, score_func="softmax",
                           group_score="max", renormalize=True, routed_scaling_factor=16.0,
                           n_shared_experts=n_shared, weights=w, ids=i)
    assert out[0] is w and out[1] is i
    s, c, rids, _ = ref.moe_gate(logits, None, k, 8, 3, "softmax", "max", True, 16.0, True)
    ref.assert_gate_ids(i, c, rids, k, E)
    assert np.all(i[:, k:] == np.arange(E, E + n_shared))
    rw = ref.gate_weights(s, i[:, :k], True, 16.0, True, n_shared=n_shared)
    np.testing.assert_allclose(w, rw, rtol=1e-5)
    check_guards(bw, T, 3)
    bi_mask = np.ones(bi.shape, bool)
    bi_mask[1:T + 1, 3:3 + k + n_shared] = False
    assert np.all(bi[bi_mask] == -5)


def test_moe_gate_nonfinite_logits_give_valid_ids():
    T, E, k = 4, 64, 8
    logits = np.random.default_rng(22).standard_normal((T, E)).astype(np.float32)
    logits[0, :] = np.nan
    logits[1, ::2] = np.inf
    logits[2, 5] = -np.inf
    w, ids = mlafuse.moe_gate(logits, top_k=k)
    for t in range(T):
        assert len(set(ids[t].tolist())) == k and ids[t].min() >= 0 and ids[t].max() < E
    assert np.all(np.isfinite(w))


def test_moe_gate_weights_in_logits_dtype():
    logits = np.random.default_rng(23).standard_normal((3, 64)).astype(np.float16)
    w, ids = mlafuse.moe_gate(logits, top_k=4, weights_dtype=np.float16)
    assert w.dtype == np.float16


# ---- threads -------------------------------------------------------------------------------
def test_threads_setting():
    try:
        mlafuse.set_num_threads(1)
        assert mlafuse.get_num_threads() == 1
        latent = np.random.default_rng(30).standard_normal((33, 40)).astype(np.float32)
        a = mlafuse.split_qk_norm(latent, np.ones(16, np.float32), np.ones(16, np.float32))
        mlafuse.set_num_threads(0)
        assert mlafuse.get_num_threads() >= 1
        b = mlafuse.split_qk_norm(latent, np.ones(16, np.float32), np.ones(16, np.float32))
        for x, y in zip(a, b):
            assert np.array_equal(x, y)
    finally:
        mlafuse.set_num_threads(0)
    with pytest.raises(mlafuse.MlafError):
        mlafuse.set_num_threads(-1)


def test_contexts_are_per_thread():
    import threading

    latent = np.random.default_rng(31).standard_normal((16, 48)).astype(np.float32)
    w = np.ones(16, np.float32)
    want = mlafuse.split_qk_norm(latent, w, w)[1]
    results, errors = [], []

    def work():
        try:
            for _ in range(20):
                results.append(mlafuse.split_qk_norm(latent, w, w)[1])
            try:  # a failure on one thread leaves the others' messages alone
                mlafuse.split_qk_norm(latent[:, :40], w, w, rope_dim=16)
            except mlafuse.MlafError as e:
                errors.append(e.message)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 80 and all(np.array_equal(r, want) for r in results)
    assert len(errors) == 4 and all("latent.shape[1]" in m for m in errors)


# ---- errors --------------------------------------------------------------------------------
def test_error_carries_library_message_and_writes_nothing():
    latent = np.ones((4, 1340), np.float32)
    k = np.full((4, 512), POISON, np.float32)
    with pytest.raises(mlafuse.MlafError) as ei:
        mlafuse.split_qk_norm(latent, np.ones(768, np.float32), np.ones(512, np.float32),
                              rope_dim=64, k_nope=k)
    e = ei.value
    assert e.status_name == "MLAF_ERR_SHAPE" and e.status == 3
    assert "latent.shape[1] = 1340" in e.message and "1344" in e.message
    assert "MLAF_ERR_SHAPE" in str(e)
    assert np.all(k == POISON)


def test_error_non_contiguous_rows():
    latent = np.ones((4, 2 * 96), np.float32)[:, ::2]
    with pytest.raises(mlafuse.MlafError) as ei:
        mlafuse.split_qk_norm(latent, np.ones(32, np.float32), np.ones(32, np.float32))
    assert ei.value.status_name == "MLAF_ERR_STRIDE" and "latent.stride[1]" in ei.value.message


def test_error_stride_not_whole_elements():
    raw = np.zeros(4096, np.uint8)
    latent = np.ndarray((4, 96), np.float32, buffer=raw, strides=(402, 4))
    with pytest.raises(mlafuse.MlafError) as ei:
        mlafuse.split_qk_norm(latent, np.ones(32, np.float32), np.ones(32, np.float32))
    assert ei.value.status_name == "MLAF_ERR_STRIDE"
    assert "latent" in ei.value.message and "element size 4" in ei.value.message


def test_error_dtype():
    with pytest.raises(mlafuse.MlafError) as ei:
        mlafuse.split_qk_norm(np.ones((2, 96)), np.ones(32), np.ones(32))  # float64
    assert ei.value.status_name == "MLAF_ERR_DTYPE" and "float64" in ei.value.message
    with pytest.raises(mlafuse.MlafError) as ei:
        mlafuse.split_qk_norm(np.ones((2, 96), np.float16), np.ones(32, np.float16),
                              np.ones(32, np.float16), k_nope=np.ones((2, 32), np.float32))
    assert ei.value.status_name == "MLAF_ERR_DTYPE" and "k_nope.dtype" in ei.value.message


def test_error_overlap():
    latent = np.random.default_rng(40).standard_normal((4, 96)).astype(np.float32)
    with pytest.raises(mlafuse.MlafError) as ei:  # k_nope onto the q columns: not the in-place form
        mlafuse.split_qk_norm(latent, np.ones(32, np.float32), np.ones(32, np.float32),
                              k_nope=latent[:, :32])
    assert ei.value.status_name == "MLAF_ERR_OVERLAP"


def test_error_moe_gate_limits():
    logits = np.zeros((2, 160), np.float32)
    with pytest.raises(mlafuse.MlafError) as ei:
        mlafuse.moe_gate(logits, top_k=6, n_group=7, topk_group=3)
    assert ei.value.status_name == "MLAF_ERR_LIMIT" and "n_group = 7" in ei.value.message
    with pytest.raises(ValueError):
        mlafuse.moe_gate(logits)  # no top_k and no config
    with pytest.raises(ValueError):
        mlafuse.moe_gate(logits, config="no-such-model")
    with pytest.raises(ValueError):
        mlafuse.moe_gate(logits, top_k=2, score_func="relu")


def test_error_read_only_output_and_wrong_types():
    latent = np.ones((2, 96), np.float32)
    k = np.zeros((2, 32), np.float32)
    k.flags.writeable = False
    with pytest.raises(ValueError):
        mlafuse.split_qk_norm(latent, np.ones(32, np.float32), np.ones(32, np.float32), k_nope=k)
    with pytest.raises(TypeError):
        mlafuse.split_qk_norm(latent, [1.0] * 32, np.ones(32, np.float32))


def test_t_zero_is_a_no_op():
    latent = np.ones((0, 96), np.float32)
    q, k, p = mlafuse.split_qk_norm(latent, np.ones(32, np.float32), np.ones(32, np.float32))
    assert q.shape == (0, 32) and k.shape == (0, 32) and p.shape == (0, 32)
    w, i = mlafuse.moe_gate(np.ones((0, 64), np.float32), top_k=4)
    assert w.shape == (0, 4) and i.shape == (0, 4)


def test_mla_kv_cache_without_rope():
    """R = 0: no rotation; positions and cos_sin may be absent."""
    C, T = 32, 5
    rng = np.random.default_rng(50)
    latent = rng.standard_normal((T, 16 + C)).astype(np.float32)
    w_q, w_kv = np.ones(16, np.float32), rng.standard_normal(C).astype(np.float32)
    cache = np.full((T, 1, C), POISON, np.float32)
    q, k, p = mlafuse.mla_kv_cache(latent, w_q, w_kv, None, None, np.arange(T)[::-1].copy(),
                                   cache, return_k_nope=True)
    rq, rk, _ = ref.split_qk_norm(latent, w_q, w_kv, 16, C, 0, 1e-5, 1e-5)
    ref.assert_close_ulp(q, rq, "float32", "q")
    ref.assert_close_ulp(cache[::-1, 0], rk, "float32", "cache")
    assert p is None
