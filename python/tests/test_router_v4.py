"""DeepSeek-V4's router (docs/moe_gate.md) through the numpy binding: the sqrt_softplus score in
moe_gate and hash routing (moe_gate_hash), against the float64 numpy reference."""
import numpy as np
import pytest

import mlafuse
import reference as ref
from test_numpy import DTYPES, check_guards, np_dtype, poisoned

V4 = "deepseek-v4-flash"


def v4_logits(rng, T, E, dtype, pad=(3, 7)):
    """Strided rows with a few large |logits| per row (sqrt_softplus's three ranges)."""
    lo, hi = pad
    x = rng.standard_normal((T, lo + E + hi)) * 2.0
    big = np.array([1e4, -1e4, 100.0, -100.0, 30.0, -30.0, 20.5, -20.5, 19.5, -19.5, -180.0, -300.0])
    for t in range(T):
        for _ in range(3):
            x[t, lo + rng.integers(E)] = big[rng.integers(len(big))]
    buf = x.astype(np_dtype(dtype))
    return buf[:, lo:lo + E]


def table(rng, vocab, k, E, dtype, stride_pad=0):
    """[vocab, k] rows of distinct experts, as a view of a [vocab, k + stride_pad] buffer."""
    buf = np.full((vocab, k + stride_pad), -7, dtype)
    for v in range(vocab):
        buf[v, :k] = rng.permutation(E)[:k]
    return buf[:, :k]


def test_preset_v4():
    p = mlafuse.find_preset(V4)
    assert (p.q_lora_rank, p.kv_lora_rank, p.qk_rope_head_dim, p.kv_rope_tail) == (1024, 512, 0, 64)
    assert (p.n_routed_experts, p.top_k, p.n_group, p.score_func) == (256, 6, 1, "sqrt_softplus")
    assert p.routed_scaling_factor == 1.5 and p.norm_topk_prob and p.has_score_bias
    assert p.n_hash_layers == 3 and p.n_shared_experts == 1
    assert all(q.kv_rope_tail == 0 and q.n_hash_layers == 0 for q in mlafuse.presets()
               if not q.name.startswith("deepseek-v4"))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T", [0, 1, 7, 300])
def test_moe_gate_sqrt_softplus(dtype, T):
    E = 256
    rng = np.random.default_rng(500 + T)
    logits = v4_logits(rng, T, E, dtype)
    bias = (0.05 * rng.standard_normal(E)).astype(np.float32)
    w, ids, s = mlafuse.moe_gate(logits, bias, config=V4, return_scores=True)
    rs, c, rids, _ = ref.moe_gate(logits, bias, 6, score_func="sqrt_softplus", scale=1.5)
    assert ids.shape == (T, 6) and w.dtype == np.float32
    if T:
        ref.assert_gate_ids(ids, c, rids, 6, E)
    np.testing.assert_allclose(w, ref.gate_weights(rs, ids, True, 1.5), rtol=1e-5, atol=1e-12)
    np.testing.assert_allclose(s, rs, rtol=1e-5, atol=1e-12)


def test_sqrt_softplus_values():
    """The score at values around each formula's edge, huge ones, and NaN (NaN score, weight 0)."""
    xs = np.array([-1e4, -300, -180, -100, -20.5, -20, -19.5, -1, 0, 1, 19.5, 20, 20.5, 100, 1e4,
                   3e38, np.nan, np.inf], np.float32)
    logits = np.tile(xs, (2, 1))
    w, ids, s = mlafuse.moe_gate(logits, top_k=4, score_func="sqrt_softplus", return_scores=True)
    with np.errstate(invalid="ignore"):
        want = ref.gate_scores(xs[None, :16], "sqrt_softplus")[0]
    np.testing.assert_allclose(s[0, :16], want, rtol=1e-6, atol=1e-37)
    assert np.isnan(s[0, 16]) and np.isnan(s[0, 17])
    assert ids[0].tolist() == [15, 14, 13, 12] and np.all(np.isfinite(w))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tab_dt,tok_dt", [(np.int32, np.int64), (np.int64, np.int32)])
@pytest.mark.parametrize("score", ["sqrt_softplus", "sigmoid", "softmax"])
def test_moe_gate_hash(dtype, tab_dt, tok_dt, score):
    T, E, k, vocab = 77, 256, 6, 50
    rng = np.random.default_rng(77)
    logits = v4_logits(rng, T, E, dtype)
    tab = table(rng, vocab, k, E, tab_dt, stride_pad=3)
    tok = rng.integers(0, vocab, T).astype(tok_dt)
    bw, w = poisoned((T, k + 1), "float32")
    err = np.array([2], np.int32)
    out = mlafuse.moe_gate_hash(logits, tab, tok, config=V4, score_func=score, n_shared_experts=1,
                                weights=w, error_count=err, return_scores=True)
    assert out[0] is w
    ids, s = out[1], out[2]
    rs, rids, rw, bad = ref.moe_gate_hash(logits, tab, tok, k, score, True, 1.5, n_shared=1)
    assert bad == 0 and err[0] == 2
    assert np.array_equal(ids, rids), "hash ids are the table's, in its order"
    np.testing.assert_allclose(w, rw, rtol=1e-5, atol=1e-12)
    np.testing.assert_allclose(s, rs, rtol=1e-5, atol=1e-12)
    check_guards(bw, T, 3)


def test_moe_gate_hash_bad_rows():
    """Every kind of bad row: counted, ids 0..k-1, weight 0; good rows untouched by them."""
    E, k = 64, 4
    rng = np.random.default_rng(5)
    tab = np.stack([rng.permutation(E)[:k] for _ in range(8)]).astype(np.int64)
    tab[1, 2] = E             # out of range
    tab[2, 0] = -1            # negative
    tab[3, 3] = tab[3, 1]     # repeated
    tab[4, 1] = 1 << 33       # beyond 32 bits
    tok = np.array([0, 1, 2, 3, 4, -1, 8, 5, 1 << 40, 7], np.int64)
    logits = rng.standard_normal((len(tok), E)).astype(np.float32)
    err = np.zeros(1, np.int32)
    w, ids = mlafuse.moe_gate_hash(logits, tab, tok, top_k=k, score_func="sqrt_softplus",
                                   error_count=err)
    rs, rids, rw, bad = ref.moe_gate_hash(logits, tab, tok, k, "sqrt_softplus")
    assert bad == 7 and err[0] == 7
    assert np.array_equal(ids, rids)
    assert np.all(w[[1, 2, 3, 4, 5, 6, 8]] == 0) and np.all(ids[5] == np.arange(k))
    np.testing.assert_allclose(w, rw, rtol=1e-5)
    # the same call without a counter; then the counter saturates instead of wrapping
    w2, ids2 = mlafuse.moe_gate_hash(logits, tab, tok, top_k=k, score_func="sqrt_softplus")
    assert np.array_equal(ids2, ids) and np.array_equal(w2, w)
    err[0] = 2**31 - 3
    mlafuse.moe_gate_hash(logits, tab, tok, top_k=k, error_count=err)
    assert err[0] == 2**31 - 1


def test_moe_gate_hash_errors():
    logits = np.zeros((3, 64), np.float32)
    tab = np.zeros((5, 4), np.int32) + np.arange(4, dtype=np.int32)
    tok = np.zeros(3, np.int32)
    with pytest.raises(mlafuse.MlafError) as ei:
        mlafuse.moe_gate_hash(logits, tab.astype(np.float32), tok)
    assert ei.value.status_name == "MLAF_ERR_DTYPE" and "tid2eid" in ei.value.message
    with pytest.raises(mlafuse.MlafError) as ei:
        mlafuse.moe_gate_hash(logits, tab, tok, top_k=3)
    assert ei.value.status_name == "MLAF_ERR_SHAPE" and "tid2eid.shape[1]" in ei.value.message
    with pytest.raises(mlafuse.MlafError) as ei:
        mlafuse.moe_gate_hash(logits, tab, np.zeros(4, np.int32))
    assert ei.value.status_name == "MLAF_ERR_SHAPE" and "token_ids.shape[0]" in ei.value.message
    with pytest.raises(mlafuse.MlafError) as ei:
        mlafuse.moe_gate_hash(logits, tab, tok, error_count=np.zeros(1, np.int64))
    assert ei.value.status_name == "MLAF_ERR_DTYPE" and "error_count" in ei.value.message
    w = np.full((3, 4), 7.0, np.float32)
    with pytest.raises(mlafuse.MlafError):
        mlafuse.moe_gate_hash(logits, tab, tok, score_func=5, weights=w)
    assert np.all(w == 7.0), "a rejected call writes nothing"
