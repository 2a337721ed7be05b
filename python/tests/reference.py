"""float64 references for the tests, written from SPEC.md independently of the library (plain
numpy, a few lines per op), and the SPEC §7 comparison helpers."""
import numpy as np

MANTISSA = {"float32": 23, "float16": 10, "bfloat16": 7}
MIN_SPACING = {"float32": 2.0 ** -149, "float16": 2.0 ** -24, "bfloat16": 2.0 ** -133}


def f64(a):
    """Any array (numpy, ml_dtypes bf16, torch on any device) as a float64 numpy array."""
    if hasattr(a, "detach"):
        a = a.detach().cpu()
        if str(a.dtype) == "torch.bfloat16":
            a = a.float()
        a = a.numpy()
    return np.asarray(a).astype(np.float64)


def rmsnorm(x, w, eps):
    x, w = f64(x), f64(w)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def split_qk_norm(latent, w_q, w_kv, Q, C, R, eps_q, eps_kv):
    L = f64(latent)
    q = rmsnorm(L[:, :Q], w_q, eps_q) if Q > 0 else None
    return q, rmsnorm(L[:, Q:Q + C], w_kv, eps_kv), L[:, Q + C:Q + C + R]


def rope(x, pos, cos_sin, style):
    """x [..., T, R] rows rotated by the table row of each token's position."""
    x = f64(x).copy()
    R = x.shape[-1]
    h = R // 2
    cs = f64(cos_sin)[np.asarray(pos)]
    c, s = cs[:, :h], cs[:, h:]
    if x.ndim == 3:  # [T, H, R]
        c, s = c[:, None, :], s[:, None, :]
    if style == "neox":
        a, b = x[..., :h].copy(), x[..., h:].copy()
        x[..., :h], x[..., h:] = a * c - b * s, b * c + a * s
    else:
        a, b = x[..., 0::2].copy(), x[..., 1::2].copy()
        x[..., 0::2], x[..., 1::2] = a * c - b * s, b * c + a * s
    return x


def moe_gate(logits, bias, top_k, n_group=1, topk_group=1, score_func="sigmoid",
             group_score="top2_sum", renormalize=True, scale=1.0, apply_scale=True, eps=1e-20,
             n_shared=0):
    """Returns (s [T,E], c [T,E], ids [T,top_k], weights [T,top_k+S]) in float64."""
    x = f64(logits)
    T, E = x.shape
    if score_func == "sigmoid":
        s = 1.0 / (1.0 + np.exp(-x))
    else:
        e = np.exp(x - x.max(axis=1, keepdims=True))
        s = e / e.sum(axis=1, keepdims=True)
    c = s + (f64(bias) if bias is not None else 0.0)
    ids = np.zeros((T, top_k), np.int64)
    for t in range(T):
        ct = c[t].copy()
        if n_group > 1:
            g = ct.reshape(n_group, E // n_group)
            gs = np.sort(g, axis=1)[:, -2:].sum(axis=1) if group_score == "top2_sum" else g.max(1)
            keep = np.argsort(-gs, kind="stable")[:topk_group]
            mask = np.full(n_group, True)
            mask[keep] = False
            g[mask] = -np.inf
            ct = g.reshape(E)
        ids[t] = np.argsort(-ct, kind="stable")[:top_k]
    return s, c, ids, gate_weights(s, ids, renormalize, scale, apply_scale, eps, n_shared)


def gate_weights(s, ids, renormalize=True, scale=1.0, apply_scale=True, eps=1e-20, n_shared=0):
    """Weights of the given ids (the library's ids, so ties chosen either way still check)."""
    w = np.take_along_axis(s, np.asarray(ids, np.int64), axis=1)
    if renormalize:
        w = w / (w.sum(axis=1, keepdims=True) + eps)
    routed_sum = w.sum(axis=1, keepdims=True)
    if apply_scale:
        w = w * scale
    if n_shared:
        w = np.concatenate([w, np.repeat(routed_sum / scale, n_shared, axis=1)], axis=1)
    return w


def dtype_name(a):
    return str(a.dtype).replace("torch.", "")


def rope_magnitude(x, style):
    """Per element, the norm of the pair it is rotated with (what the rotation preserves):
    a rotated value near 0 is a difference of products of this size."""
    x = f64(x)
    h = x.shape[-1] // 2
    if style == "neox":
        m = np.sqrt(x[..., :h] ** 2 + x[..., h:] ** 2)
        return np.concatenate([m, m], axis=-1)
    m = np.sqrt(x[..., 0::2] ** 2 + x[..., 1::2] ** 2)
    return np.repeat(m, 2, axis=-1)


def assert_close_ulp(got, ref, dtype, what="", mag=None):
    """SPEC §7: f16 / bf16 within 1 ulp of the oracle rounded once; f32 relative <= 1e-5.
    mag (RoPE outputs): also allow the fp32 rounding of the products, a few f32 ulps of the
    pair's magnitude."""
    got, ref = f64(got), f64(ref)
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    assert np.all(np.isfinite(got)), f"{what}: non-finite output"
    err = np.abs(got - ref)
    if dtype == "float32":
        tol = 1e-5 * np.abs(ref) + MIN_SPACING[dtype]
    else:
        # The ulp at the oracle's magnitude, plus half an ulp for the oracle's own rounding.
        mag = np.maximum(np.abs(ref), MIN_SPACING[dtype])
        ulp = np.maximum(2.0 ** (np.floor(np.log2(mag)) - MANTISSA[dtype]), MIN_SPACING[dtype])
        tol = 1.5 * ulp
    if mag is not None:
        tol = tol + 4 * 2.0 ** -24 * f64(mag)
    worst = np.max(err / tol) if err.size else 0.0
    assert np.all(err <= tol), f"{what}: worst error {worst:.2f} x tolerance ({dtype})"


def assert_gate_ids(ids, c, ref_ids, top_k, E, rel=1e-6):
    """ids equal the oracle's except where the oracle's candidates tie within 1e-6 (relative):
    compared through the biased scores c of the chosen experts, position by position."""
    ids = np.asarray(ids, np.int64)
    T = ids.shape[0]
    routed = ids[:, :top_k]
    assert routed.min() >= 0 and routed.max() < E, "routed id out of range"
    for t in range(T):
        assert len(set(routed[t].tolist())) == top_k, f"token {t}: duplicate ids {routed[t]}"
    got_c = np.take_along_axis(c, routed, axis=1)
    ref_c = np.take_along_axis(c, ref_ids, axis=1)
    same = routed == ref_ids
    close = np.abs(got_c - ref_c) <= rel * np.maximum(np.abs(ref_c), 1e-30)
    bad = ~(same | close)
    assert not bad.any(), f"ids differ at {np.argwhere(bad)[:5].tolist()}"
