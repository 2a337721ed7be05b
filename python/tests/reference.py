"""float64 references for the tests, written from the contract in docs/ independently of the library (plain
numpy, a few lines per op), and the comparison helpers of docs/conventions.md."""
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
    s = gate_scores(x, score_func)
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


def gate_scores(x, score_func):
    """s [T, E] in float64: sigmoid, softmax over the row, or sqrt(softplus) (DeepSeek-V4;
    softplus(x) = max(x, 0) + log1p(exp(-|x|)), no overflow)."""
    x = f64(x)
    if score_func == "sigmoid":
        with np.errstate(over="ignore"):  # exp(-x) = inf below -709: s = 0, as it should
            return 1.0 / (1.0 + np.exp(-x))
    if score_func == "sqrt_softplus":
        return np.sqrt(np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x))))
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def moe_gate_hash(logits, tid2eid, token_ids, top_k, score_func="sqrt_softplus",
                  renormalize=True, scale=1.0, apply_scale=True, eps=1e-20, n_shared=0):
    """Hash routing (docs/moe_gate.md). Returns (s [T,E], ids [T,top_k+S], weights [T,top_k+S], bad
    rows): ids = tid2eid[token_ids] in table order; a token id outside [0, vocab) or a row with
    an entry outside [0, E) or repeated gets ids 0..k-1 and weight 0."""
    x = f64(logits)
    T, E = x.shape
    s = gate_scores(x, score_func)
    tab = np.asarray(tid2eid, np.int64)
    tok = np.asarray(token_ids, np.int64)
    ids = np.zeros((T, top_k), np.int64)
    good = np.zeros(T, bool)
    for t in range(T):
        if 0 <= tok[t] < tab.shape[0]:
            row = tab[tok[t], :top_k]
            if row.min() >= 0 and row.max() < E and len(set(row.tolist())) == top_k:
                ids[t], good[t] = row, True
        if not good[t]:
            ids[t] = np.arange(top_k)
    w = np.take_along_axis(s, ids, axis=1) * good[:, None]
    w = np.where(np.isfinite(w), w, 0.0)
    if renormalize:
        d = w.sum(axis=1, keepdims=True) + eps
        w = np.where(d > 0, w / np.where(d > 0, d, 1.0), w)
    routed_sum = w.sum(axis=1, keepdims=True)
    if apply_scale:
        w = w * scale
    if n_shared:
        w = np.concatenate([w, np.repeat(routed_sum / scale, n_shared, axis=1)], axis=1)
        ids = np.concatenate([ids, np.tile(np.arange(E, E + n_shared), (T, 1))], axis=1)
    return s, ids, w, int((~good).sum())


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
    """docs/conventions.md, correctness: f16 / bf16 within 1 ulp of the oracle rounded once; f32 relative <= 1e-5.
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


# ---- fp8 cache formats (docs/kv_formats.md), from the formats' definitions ---------------------------
def _e4m3_table():
    """The non-negative finite e4m3 values by code 0x00..0x7E: bias 7, 3 mantissa bits,
    subnormals m * 2^-9 (0x7F is NaN)."""
    v = []
    for code in range(0x7F):
        e, m = code >> 3, code & 7
        v.append(m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return np.array(v)


E4M3_VALUES = _e4m3_table()
FLT_MIN = np.float32(2.0 ** -126)


def e4m3(y):
    """f32 values -> e4m3 bytes as docs/kv_formats.md converts: the nearest value, ties to the even code,
    magnitudes past 448 (and infinities) to +-448, NaN of either sign to 0x7F, the sign kept
    on zero."""
    y = np.asarray(y, np.float32)
    a = np.abs(y.astype(np.float64))
    nan = np.isnan(a)
    a = np.where(nan, 0.0, np.minimum(a, 448.0))
    hi = np.minimum(np.searchsorted(E4M3_VALUES, a, side="left"), 0x7E)  # first value >= a
    lo = np.maximum(hi - 1, 0)
    d_lo, d_hi = a - E4M3_VALUES[lo], E4M3_VALUES[hi] - a
    code = np.where((d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0)), hi, lo)
    out = code.astype(np.uint8) | (np.signbit(y).astype(np.uint8) << 7)
    return np.where(nan, np.uint8(0x7F), out).astype(np.uint8)


def e4m3_decode(b):
    """e4m3 bytes -> float64 (0x7F / 0xFF: NaN)."""
    b = np.asarray(b, np.uint8)
    mag = np.append(E4M3_VALUES, np.nan)[b & 0x7F]
    return np.where(b & 0x80, -mag, mag)


def ceil_log2(v):
    """ceil(log2 v) of positive normal f32 values from their bits (docs/kv_formats.md); +inf gives 128."""
    v = np.asarray(v, np.float32)
    bits = v.view(np.uint32)
    e = ((bits >> 23) & 0xFF).astype(np.int64) - 127 + ((bits & 0x7FFFFF) != 0)
    return np.where(np.isinf(v), 128, e)


def nan_amax(x, axis=-1):
    """max |x| ignoring NaN; 0 where every value is NaN (or there are none)."""
    a = np.abs(np.asarray(x, np.float32))
    return np.where(np.isnan(a), np.float32(0), a).max(axis=axis, initial=np.float32(0))


def tile_scale(amax, mode):
    """fp8_ds_mla's f32 scale of a tile from its amax (docs/kv_formats.md), all arithmetic in f32."""
    amax = np.asarray(amax, np.float32)
    if mode == "amax":
        return np.maximum(amax / np.float32(448), FLT_MIN)
    if mode == "ue8m0":
        e = ceil_log2(np.maximum(amax, np.float32(1e-4)) / np.float32(448))
    elif mode == "ue8m0_floor_scaled":
        e = ceil_log2(np.maximum(amax / np.float32(448), np.float32(1e-4)))
    else:
        raise ValueError(mode)
    return np.where(e >= 128, np.float32(np.inf),
                    np.ldexp(1.0, np.minimum(e, 127))).astype(np.float32)


def fp8_record(row, scale, conv):
    """The fp8 (per-tensor) bytes of dense rows [n, W] (f32 values): e4m3(x / scale) for
    conv "div" (vLLM's k_scale), e4m3(x * scale) for "mul" (quant_scale)."""
    row, s = np.asarray(row, np.float32), np.float32(scale)
    with np.errstate(all="ignore"):
        return e4m3(row / s if conv == "div" else row * s)


def ds_mla_record(k_nope, k_pe_bf16_bits, mode):
    """fp8_ds_mla records [n, C + C/32 + 2R] bytes of dense rows: k_nope [n, C] f32 values of
    the bf16 row, k_pe_bf16_bits [n, R] the roped k_pe's bf16 bit patterns (uint16).
    Bytes [0, C) e4m3(x / s_tile), [C, C + 4 C/128) the tile scales as little-endian f32, then
    the R bf16 values."""
    x = np.asarray(k_nope, np.float32)
    n, C = x.shape
    tiles = x.reshape(n, C // 128, 128)
    with np.errstate(all="ignore"):
        s = tile_scale(nan_amax(tiles), mode)                   # [n, C/128]
        q = e4m3(tiles / s[:, :, None]).reshape(n, C)
    scales = np.ascontiguousarray(s.astype("<f4")).view(np.uint8).reshape(n, -1)
    pe = np.ascontiguousarray(np.asarray(k_pe_bf16_bits).astype("<u2")).view(np.uint8)
    return np.concatenate([q, scales, pe.reshape(n, -1)], axis=1)
