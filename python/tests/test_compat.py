"""mlafuse.compat: each engine adapter against a plain torch transcription (written here, in
float64) of that engine's reference path: ids identical up to ties, weights 1e-5 relative,
norms 1 ulp, cache bytes exact. CPU here; CUDA too where a GPU and a CUDA build are present."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (mlafuse.compat takes torch "
                                            "tensors; the numpy tests still run)")

import mlafuse  # noqa: E402
import mlafuse.compat as compat  # noqa: E402
import reference as ref  # noqa: E402

HAS_CUDA = torch.cuda.is_available() and mlafuse.backend_available("cuda")
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not HAS_CUDA, reason="no CUDA device visible to torch, or a CPU-only mlafuse"))]
DNAME = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def gen(seed):
    return torch.Generator().manual_seed(seed)


def strided(g, T, W, dtype, device, pad=(3, 5)):
    buf = torch.randn(T, pad[0] + W + pad[1], generator=g).to(device=device, dtype=dtype)
    return buf[:, pad[0]:pad[0] + W]


class Norm(torch.nn.Module):  # an RMSNorm module as the engines hold them: only .weight is read
    def __init__(self, w):
        super().__init__()
        self.weight = torch.nn.Parameter(w, requires_grad=False)


# ---- reference routers (torch, float64), transcribed from each engine's torch path ----------
def ref_route(logits, bias, topk, n_group, topk_group, score, group_score):
    """Scores, biased choosing scores and the chosen ids (sorted by choosing score), as the
    engines' torch paths select them: score -> + bias -> group score -> keep groups -> top-k."""
    x = logits.detach().double().cpu()
    if score == "sqrt_softplus":
        s = torch.sqrt(torch.nn.functional.softplus(x))
    else:
        s = torch.sigmoid(x) if score == "sigmoid" else torch.softmax(x, dim=-1)
    c = s + (bias.detach().double().cpu() if bias is not None else 0.0)
    T, E = c.shape
    grouped = c.view(T, n_group, E // n_group)
    gs = grouped.topk(2, dim=-1)[0].sum(-1) if group_score == "top2_sum" else grouped.amax(-1)
    keep = torch.zeros_like(gs).scatter_(1, gs.topk(topk_group, dim=-1)[1], 1.0)
    mask = keep.unsqueeze(-1).expand(T, n_group, E // n_group).reshape(T, E).bool()
    ids = c.masked_fill(~mask, float("-inf")).topk(topk, dim=-1, sorted=True)[1]
    return s, c, ids


def check_routing(w, ids, ref_w, ref_ids, c, what):
    """ids equal up to ties of the choosing score (1e-6 relative); each expert's weight within
    1e-5 relative of the reference weight of the same expert."""
    ids64 = ids[:, :ref_ids.shape[1]].long().cpu()
    T, E = c.shape
    ref.assert_gate_ids(ids64.numpy(), c.numpy(), ref_ids.numpy(), ref_ids.shape[1], E)
    got = ref.f64(w[:, :ref_ids.shape[1]])
    same = (ids64 == ref_ids).numpy()
    want = ref_w.numpy()
    err = np.abs(got - want)[same]
    tol = (1e-5 * np.abs(want) + 1e-30)[same]
    assert np.all(err <= tol), f"{what}: weights off by up to {np.max(err / tol):.2f} x 1e-5 rel"


# ---- fused_split_qk_norm ---------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("Q", [96, 0])
def test_fused_split_qk_norm(device, dtype, Q):
    g = gen(1)
    T, C, R, eps = 37, 64, 16, 1e-6
    latent = strided(g, T, Q + C + R, dtype, device)
    q_norm = Norm((1 + 0.1 * torch.randn(Q, generator=g)).to(device, dtype)) if Q else None
    kv_norm = Norm((1 + 0.1 * torch.randn(C, generator=g)).to(device, dtype))
    q, k_nope, k_pe = compat.fused_split_qk_norm(latent, q_norm, kv_norm, Q or None, C, R, eps)
    assert k_nope.shape == (T, 1, C) and k_pe.shape == (T, 1, R)
    # The seed's reference path: split, then RMSNorm(x) = x * rsqrt(mean(x^2) + eps) * w per part.
    x = latent.double().cpu()
    rms = lambda v, w: v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * w.double().cpu()
    if Q:
        ref.assert_close_ulp(q, rms(x[:, :Q], q_norm.weight), DNAME[dtype], "q")
    else:
        assert q is None
    ref.assert_close_ulp(k_nope[:, 0], rms(x[:, Q:Q + C], kv_norm.weight), DNAME[dtype], "k_nope")
    assert torch.equal(k_pe[:, 0].cpu(), latent[:, Q + C:].cpu())


def test_fused_split_qk_norm_errors():
    latent = torch.randn(4, 96 + 64 + 16)
    kv = Norm(torch.ones(64))
    with pytest.raises(ValueError, match="q_a_layernorm is None"):
        compat.fused_split_qk_norm(latent, None, kv, 96, 64, 16)
    with pytest.raises(mlafuse.MlafError, match="latent.shape"):
        compat.fused_split_qk_norm(latent, Norm(torch.ones(96)), kv, 96, 64, 20)


# ---- npu_moe_gating_top_k --------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["sigmoid_groups", "softmax_groups", "softmax_plain"])
def test_npu_moe_gating_top_k(device, case):
    g = gen(2)
    T, E = 41, 256
    x = torch.randn(T, E, generator=g).to(device)
    bias = (0.1 * torch.randn(E, generator=g)).to(device)
    kw = dict(sigmoid_groups=dict(k=8, k_group=4, group_count=8, group_select_mode=1,
                                  norm_type=1, routed_scaling_factor=2.5),
              softmax_groups=dict(k=6, k_group=3, group_count=8, group_select_mode=0,
                                  norm_type=0, routed_scaling_factor=1.0),
              softmax_plain=dict(k=6, norm_type=0, renorm=0, routed_scaling_factor=16.0))[case]
    use_bias = case == "sigmoid_groups"
    k = kw.pop("k")
    y, idx, norm_out = compat.npu_moe_gating_top_k(x, k, bias=bias if use_bias else None,
                                                   out_flag=True, **kw)
    # Ascend's formula: normOut = softmax | sigmoid; + bias to choose; group max | top-2 sum;
    # y = normOut[ids] / (sum + eps) * routed_scaling_factor.
    sig = kw["norm_type"] == 1
    s, c, ids = ref_route(x, bias if use_bias else None, k, kw.get("group_count", 1),
                          kw.get("k_group", 1), "sigmoid" if sig else "softmax",
                          "top2_sum" if kw.get("group_select_mode", 0) == 1 else "max")
    w = s.gather(1, ids)
    w = w / (w.sum(-1, keepdim=True) + 1e-20) * kw["routed_scaling_factor"]
    assert idx.dtype == torch.int32 and y.dtype == x.dtype
    check_routing(y, idx, w, ids, c, case)
    np.testing.assert_allclose(ref.f64(norm_out), s.numpy(), rtol=1e-5, atol=1e-7)
    _, _, empty = compat.npu_moe_gating_top_k(x, k, bias=bias if use_bias else None, **kw)
    assert empty.shape == (T, 0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("groups", [1, 8])
def test_npu_moe_gating_top_k_softplus(device, groups):
    # norm_type 2 (DeepSeek-V4): normOut = sqrt(softplus(x)), + bias to choose, no groups in V4
    # (8 groups exercise the group path with this score too).
    g = gen(21)
    T, E, k = 37, 256, 6
    x = (3 * torch.randn(T, E, generator=g)).to(device)
    bias = (0.1 * torch.randn(E, generator=g)).to(device)
    kg = 4 if groups > 1 else 1
    y, idx, norm_out = compat.npu_moe_gating_top_k(
        x, k, bias=bias, k_group=kg, group_count=groups, group_select_mode=1, norm_type=2,
        out_flag=True, routed_scaling_factor=1.5)
    s, c, ids = ref_route(x, bias, k, groups, kg, "sqrt_softplus", "top2_sum")
    w = s.gather(1, ids)
    w = w / (w.sum(-1, keepdim=True) + 1e-20) * 1.5
    check_routing(y, idx, w, ids, c, f"softplus groups={groups}")
    np.testing.assert_allclose(ref.f64(norm_out), s.numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm_type,id_dtype", [(2, torch.int64), (1, torch.int32),
                                                (0, torch.int64)])
def test_npu_moe_gating_top_k_hash(device, norm_type, id_dtype):
    # Hash routing: ids = tid2eid[input_ids] in table order; y = normOut[ids] / (sum + eps) * f.
    g = gen(22)
    T, E, k, vocab = 29, 64, 6, 50
    x = torch.randn(T, E, generator=g).to(device)
    tid2eid = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(vocab)])
    tid2eid = tid2eid.to(device=device, dtype=torch.int32)
    input_ids = torch.randint(0, vocab, (T,), generator=g).to(device=device, dtype=id_dtype)
    y, idx, norm_out = compat.npu_moe_gating_top_k(
        x, k, input_ids=input_ids, tid2eid=tid2eid, norm_type=norm_type, out_flag=True,
        routed_scaling_factor=2.5)
    xd = x.double().cpu()
    s = (torch.softmax(xd, -1), torch.sigmoid(xd),
         torch.sqrt(torch.nn.functional.softplus(xd)))[norm_type]
    want_ids = tid2eid.long().cpu()[input_ids.long().cpu()]
    w = s.gather(1, want_ids)
    w = w / (w.sum(-1, keepdim=True) + 1e-20) * 2.5
    assert idx.dtype == torch.int32 and torch.equal(idx.long().cpu(), want_ids)
    np.testing.assert_allclose(ref.f64(y), w.numpy(), rtol=1e-5, atol=0)
    np.testing.assert_allclose(ref.f64(norm_out), s.numpy(), rtol=1e-5, atol=1e-7)
    # bf16 logits: weights come back in x's dtype
    yb, idb, empty = compat.npu_moe_gating_top_k(x.bfloat16(), k, input_ids=input_ids,
                                                 tid2eid=tid2eid, norm_type=norm_type)
    assert yb.dtype == torch.bfloat16 and empty.shape == (T, 0)
    assert torch.equal(idb.long().cpu(), want_ids)
    # a token id past the table: ids 0 .. k-1, weight 0 (mlafuse's rule)
    bad = input_ids.clone()
    bad[3] = vocab
    yb2, idb2, _ = compat.npu_moe_gating_top_k(x, k, input_ids=bad, tid2eid=tid2eid,
                                               norm_type=norm_type)
    assert idb2[3].tolist() == list(range(k)) and float(yb2[3].abs().sum()) == 0.0


def test_npu_moe_gating_top_k_bf16_output_and_errors():
    x = torch.randn(5, 64).bfloat16()
    y, idx, _ = compat.npu_moe_gating_top_k(x, 4, bias=torch.zeros(64).bfloat16(), norm_type=1)
    assert y.dtype == torch.bfloat16 and idx.shape == (5, 4)
    with pytest.raises(ValueError, match="tid2eid is None"):
        compat.npu_moe_gating_top_k(x, 4, input_ids=torch.zeros(5, dtype=torch.int64))
    with pytest.raises(ValueError, match="input_ids is None"):
        compat.npu_moe_gating_top_k(x, 4, tid2eid=torch.zeros(10, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="tid2eid is"):
        compat.npu_moe_gating_top_k(x, 4, input_ids=torch.zeros(5, dtype=torch.int64),
                                    tid2eid=torch.zeros(10, 3, dtype=torch.int32))
    with pytest.raises(ValueError, match="input_ids is"):
        compat.npu_moe_gating_top_k(x, 4, input_ids=torch.zeros(4, dtype=torch.int64),
                                    tid2eid=torch.zeros(10, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="group_count = 8"):
        compat.npu_moe_gating_top_k(x, 4, input_ids=torch.zeros(5, dtype=torch.int64),
                                    tid2eid=torch.zeros(10, 4, dtype=torch.int32),
                                    group_count=8, k_group=2)
    with pytest.raises(ValueError, match="norm_type"):
        compat.npu_moe_gating_top_k(x, 4, norm_type=5)
    with pytest.raises(ValueError, match="renorm = 1"):
        compat.npu_moe_gating_top_k(x, 4, renorm=1)


# ---- SGLang biased_grouped_topk ---------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("E,groups,topk_group,topk,shared,renorm,on_output", [
    (256, 8, 4, 8, 0, True, False),     # DeepSeek-V3
    (256, 8, 4, 9, 1, True, True),      # V3 with the shared expert fused, factor on output
    (256, 8, 4, 9, 1, True, False),
    (384, None, None, 8, 0, True, True),  # Kimi-K2
    (64, 1, 1, 4, 0, False, False),     # no renormalization: no factor applied
])
def test_biased_grouped_topk(device, E, groups, topk_group, topk, shared, renorm, on_output):
    g = gen(3)
    T, factor = 29, 2.5
    hidden = torch.randn(T, 8).to(device)
    logits = torch.randn(T, E, generator=g).to(device)
    bias = (0.05 * torch.randn(E, generator=g)).to(device)
    w, ids = compat.biased_grouped_topk(hidden, logits, bias, topk, renorm, groups, topk_group,
                                        num_fused_shared_experts=shared,
                                        routed_scaling_factor=factor,
                                        apply_routed_scaling_factor_on_output=on_output)
    assert w.shape == (T, topk) and ids.dtype == torch.int32
    # SGLang's biased_grouped_topk_impl: sigmoid, + bias, top-2-sum groups, top-(k - S);
    # shared weight = sum(routed) / factor before renormalizing; renormalize by the routed
    # sum; then (only when renormalizing) * factor if applied on output.
    k = topk - shared
    s, c, rids = ref_route(logits, bias, k, groups or 1, topk_group or 1, "sigmoid", "top2_sum")
    rw = s.gather(1, rids)
    shared_w = rw.sum(-1, keepdim=True) / factor
    if renorm:
        total = rw.sum(-1, keepdim=True)
        rw, shared_w = rw / total, shared_w / total
        if on_output:
            rw, shared_w = rw * factor, shared_w * factor
    check_routing(w, ids, rw, rids, c, "routed")
    if shared:
        assert torch.all(ids[:, k:].cpu() == E)
        np.testing.assert_allclose(ref.f64(w[:, k:]), shared_w.numpy(), rtol=1e-5)


def test_biased_grouped_topk_errors():
    x = torch.randn(3, 64)
    with pytest.raises(ValueError, match="routed_scaling_factor"):
        compat.biased_grouped_topk(x, x, torch.zeros(64), 5, True, 1, 1,
                                   num_fused_shared_experts=1)
    with pytest.raises(ValueError, match="tokens mismatch"):
        compat.biased_grouped_topk(x[:2], x, torch.zeros(64), 4, True)


# ---- vLLM grouped_topk -----------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("E,groups,topk_group,topk,scoring,use_bias,renorm,factor", [
    (160, 8, 3, 6, "softmax", False, False, 16.0),   # DeepSeek-V2
    (256, 8, 4, 8, "sigmoid", True, True, 2.5),      # DeepSeek-V3
    (64, 0, 0, 6, "softmax", False, True, 1.0),      # no groups
])
def test_grouped_topk(device, E, groups, topk_group, topk, scoring, use_bias, renorm, factor):
    g = gen(4)
    T = 23
    logits = torch.randn(T, E, generator=g).to(device)
    bias = (0.05 * torch.randn(E, generator=g)).to(device) if use_bias else None
    w, ids = compat.grouped_topk(logits, logits, topk, renorm, groups, topk_group, scoring,
                                 factor, bias)
    # vLLM's grouped_topk: score; with a bias, biased scores choose and groups score top-2
    # sums, else group max; weights the unbiased scores, / sum if renormalize, * factor.
    s, c, rids = ref_route(logits, bias, topk, groups or 1, topk_group or 1, scoring,
                           "top2_sum" if use_bias else "max")
    rw = s.gather(1, rids)
    if renorm:
        rw = rw / rw.sum(-1, keepdim=True)
    check_routing(w, ids, rw * factor, rids, c, scoring)


# ---- FlashInfer fused_topk_deepseek -----------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_topk_deepseek(device, dtype):
    g = gen(5)
    T, E, topk = 31, 256, 8
    scores = torch.randn(T, E, generator=g).to(device, dtype)
    bias = (0.05 * torch.randn(E, generator=g)).to(device, dtype)
    vals = torch.full((T, topk), -1.0, dtype=dtype, device=device)
    idx = torch.full((T, topk), -1, dtype=torch.int32, device=device)
    replay = torch.full((T + 3, topk), -7, dtype=torch.int16, device=device)
    assert compat.fused_topk_deepseek(scores, bias, 8, 4, topk, 2.5, vals, idx,
                                      routing_replay_out=replay) is None
    s, c, rids = ref_route(scores, bias, topk, 8, 4, "sigmoid", "top2_sum")
    rw = s.gather(1, rids)
    rw = rw / rw.sum(-1, keepdim=True) * 2.5
    if dtype == torch.float32:
        check_routing(vals, idx, rw, rids, c, "f32")
    else:  # bf16 weights: the ids as above, the weights to 1 bf16 ulp
        ref.assert_gate_ids(idx.long().cpu().numpy(), c.numpy(), rids.numpy(), topk, E)
        same = idx.long().cpu() == rids
        ref.assert_close_ulp(vals.cpu()[same], rw[same], "bfloat16", "bf16 weights")
    assert torch.equal(replay[:T].cpu(), idx.cpu().to(torch.int16))
    assert torch.all(replay[T:] == -7)


# ---- vLLM concat_and_cache_mla ---------------------------------------------------------------
def _cache_inputs(device, dtype, T=19, N=15, C=512, R=64, nb=6, bs=8, seed=6):
    g = gen(seed)
    kv_c = strided(g, T, C, dtype, device)
    k_pe = strided(g, T, R, dtype, device)
    slots = torch.randperm(nb * bs, generator=g)[:N]
    slots[3] = -1
    slots[5] = nb * bs + 4  # past the cache: skipped
    return kv_c, k_pe, slots.to(device), nb, bs


def _ref_rows(kv_cache, slots, nb, bs, N, records):
    """The reference cache: the poison everywhere, record t at slot_mapping[t] for valid slots
    of tokens t < N (vLLM: cache[slot // bs, slot % bs] = [kv_c | k_pe])."""
    out = kv_cache.clone().cpu()
    for t in range(N):
        s = int(slots[t])
        if 0 <= s < nb * bs:
            out[s // bs, s % bs] = records[t]
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_concat_and_cache_mla_auto(device):
    kv_c, k_pe, slots, nb, bs = _cache_inputs(device, torch.bfloat16)
    cache = torch.full((nb, bs, 576), -3584.0, dtype=torch.bfloat16, device=device)
    want = _ref_rows(cache, slots, nb, bs, 15, torch.cat([kv_c, k_pe], 1).cpu())
    assert compat.concat_and_cache_mla(kv_c, k_pe.unsqueeze(1), cache, slots, "auto",
                                       torch.ones(1)) is None
    assert torch.equal(cache.cpu(), want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cache_dtype", [torch.uint8, torch.float8_e4m3fn])
def test_concat_and_cache_mla_fp8(device, cache_dtype):
    kv_c, k_pe, slots, nb, bs = _cache_inputs(device, torch.bfloat16)
    kv_c[0, :4] = torch.tensor([float("nan"), float("inf"), -1e4, 2.0 ** -12])
    scale = torch.tensor([0.03], device=device)
    cache = torch.full((nb, bs, 576), 0xA5, dtype=torch.uint8, device=device)
    rows = ref.fp8_record(ref.f64(torch.cat([kv_c, k_pe], 1)).astype(np.float32), 0.03, "div")
    want = _ref_rows(cache, slots, nb, bs, 15, torch.from_numpy(rows))
    compat.concat_and_cache_mla(kv_c, k_pe, cache.view(cache_dtype), slots, "fp8_e4m3", scale)
    assert torch.equal(cache.cpu(), want)


@pytest.mark.parametrize("device", DEVICES)
def test_concat_and_cache_mla_ds_mla(device):
    kv_c, k_pe, slots, nb, bs = _cache_inputs(device, torch.bfloat16)
    cache = torch.full((nb, bs, 656), 0xA5, dtype=torch.uint8, device=device)
    rows = ref.ds_mla_record(ref.f64(kv_c).astype(np.float32),
                             k_pe.cpu().view(torch.int16).numpy().view(np.uint16), "amax")
    want = _ref_rows(cache, slots, nb, bs, 15, torch.from_numpy(rows))
    compat.concat_and_cache_mla(kv_c, k_pe, cache, slots, "fp8_ds_mla", torch.ones(1))
    assert torch.equal(cache.cpu(), want)


@pytest.mark.parametrize("fmt,width", [("fp8", 576), ("fp8_ds_mla", 656)])
def test_concat_and_cache_mla_matches_fused_writer(fmt, width):
    """The bytes equal what mlafuse.mla_kv_cache writes for the same dense rows (its own
    dense k_nope / roped k_pe fed to the adapter)."""
    g = gen(7)
    T, Q, C, R, nb, bs = 13, 32, 512, 64, 4, 8
    latent = strided(g, T, Q + C + R, torch.bfloat16, "cpu")
    w_q, w_kv = torch.ones(Q, dtype=torch.bfloat16), torch.ones(C, dtype=torch.bfloat16)
    pos = torch.arange(T)
    cos_sin = mlafuse.rope_table(64, R, device="cpu")
    slots = torch.randperm(nb * bs, generator=g)[:T]
    fused = torch.zeros(nb, bs, width, dtype=torch.uint8)
    extra = dict(k_scale=torch.tensor([0.05])) if fmt == "fp8" else {}
    _, kn, kp = mlafuse.mla_kv_cache(latent, w_q, w_kv, pos, cos_sin, slots, fused,
                                     return_k_nope=True, return_k_pe=True, cache_format=fmt,
                                     **extra)
    mine = torch.zeros_like(fused)
    compat.concat_and_cache_mla(kn, kp, mine, slots, fmt, torch.tensor([0.05]))
    assert torch.equal(mine, fused)


def test_concat_and_cache_mla_errors():
    kv_c, k_pe, slots, nb, bs = _cache_inputs("cpu", torch.bfloat16)
    cache = torch.zeros(nb, bs, 576, dtype=torch.uint8)
    for name in ("fp8_e5m2", "nvfp4_ds_mla"):
        with pytest.raises(mlafuse.MlafError, match=name):
            compat.concat_and_cache_mla(kv_c, k_pe, cache, slots, name, torch.ones(1))
    with pytest.raises(ValueError, match="slot_mapping.size"):
        compat.concat_and_cache_mla(kv_c[:4], k_pe[:4], cache, slots, "fp8", torch.ones(1))
    with pytest.raises(ValueError, match="shape\\[2\\] = 576, expected 656"):
        compat.concat_and_cache_mla(kv_c, k_pe, cache, slots, "fp8_ds_mla", torch.ones(1))
    with pytest.raises(ValueError, match="kv_cache_dtype|expected one of"):
        compat.concat_and_cache_mla(kv_c, k_pe, cache, slots, "int4", torch.ones(1))


# ---- vLLM indexer_k_quant_and_cache (docs/dsa.md) -------------------------------------------------
def ref_index_cache(cache, k, slots, qb, ue8m0):
    """vLLM's indexer_k_quant_and_cache as plain numpy: per quant block s = max(amax, 1e-4) /
    448 (ue8m0: 2^ceil(log2 s)), e4m3(x / s); block-planar: values at b * stride + o * D,
    scales at b * stride + bs * D + 4 * (o * D / qb + j)."""
    out = cache.clone().cpu().view(torch.uint8).numpy().copy()
    nb, bs, W = out.shape
    flat = out.reshape(nb, bs * W)
    x = ref.f64(k).astype(np.float32)
    T, D = x.shape
    nq = D // qb
    for t in range(T):
        s_ = int(slots[t])
        if s_ < 0 or s_ >= nb * bs:
            continue
        b, o = divmod(s_, bs)
        blk = x[t].reshape(nq, qb)
        s = np.maximum(ref.nan_amax(blk), np.float32(1e-4)) / np.float32(448)
        if ue8m0:
            s = np.ldexp(np.float32(1), ref.ceil_log2(s)).astype(np.float32)
        flat[b, o * D:(o + 1) * D] = ref.e4m3(blk / s[:, None]).reshape(D)
        flat[b, bs * D + o * 4 * nq:bs * D + (o + 1) * 4 * nq] = \
            np.asarray(s, "<f4").view(np.uint8)
    return torch.from_numpy(out)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("qb,fmt", [(128, "ue8m0"), (128, "fp8_e4m3"), (64, "ue8m0")])
def test_indexer_k_quant_and_cache(device, dtype, qb, fmt):
    g = gen(31)
    T, D, nb, bs = 23, 128, 5, 8
    k = strided(g, T, D, dtype, device) * 3
    k[0, :3] = torch.tensor([float("nan"), 1e5, -2.0 ** -14])
    k[1] = 0.0
    slots = torch.randperm(nb * bs, generator=g)[:T + 2]
    slots[2] = -1
    slots[4] = nb * bs + 1                       # past the cache: skipped
    W = D + 4 * (D // qb)
    store = torch.full((nb + 1, bs, W), 0xA5, dtype=torch.uint8)
    cache = store[:nb].to(device)                # (a block-strided view works alike)
    want = ref_index_cache(cache, k, slots, qb, fmt == "ue8m0")
    assert compat.indexer_k_quant_and_cache(k, cache, slots.to(device), qb, fmt) is None
    assert torch.equal(cache.cpu(), want)


def test_indexer_k_quant_and_cache_planar_offsets_and_strided_blocks():
    # block stride larger than the block (other layers' pages in between): bytes only inside
    k = torch.randn(3, 128, dtype=torch.bfloat16)
    buf = torch.full((4, 2 * 8 * 132), 0x5A, dtype=torch.uint8)
    cache = torch.as_strided(buf, (4, 8, 132), (2 * 8 * 132, 132, 1))
    slots = torch.tensor([9, 0, 31])
    compat.indexer_k_quant_and_cache(k, cache, slots, 128, "ue8m0")
    assert torch.all(buf[:, 8 * 132:] == 0x5A)
    want = ref_index_cache(cache, k, slots, 128, True)
    assert torch.equal(cache.contiguous(), want)
    # token 9: block 1, offset 1 -> values at 128, scale at 8 * 128 + 4 (planar, not [bs, 132])
    s = buf[1, 8 * 128 + 4:8 * 128 + 8].view(torch.float32).item()
    assert s > 0 and s == 2.0 ** round(np.log2(s))


def test_indexer_k_quant_and_cache_matches_fused_writer():
    """The bytes equal mlafuse.mla_kv_cache_dsa's index cache for its own dense key."""
    g = gen(32)
    T, Q, C, R, nb, bs = 17, 32, 512, 64, 4, 8
    latent = strided(g, T, Q + C + R, torch.bfloat16, "cpu")
    index_k = strided(g, T, 128, torch.bfloat16, "cpu")
    iw = 1 + 0.1 * torch.randn(128, generator=g)
    ib = 0.1 * torch.randn(128, generator=g)
    pos = torch.randint(0, 64, (T,), generator=g)
    cos_sin = mlafuse.rope_table(64, R, device="cpu")
    slots = torch.randperm(nb * bs, generator=g)[:T]
    kv = torch.zeros(nb, bs, C + R, dtype=torch.bfloat16)
    fused = torch.zeros(nb, bs * 132, dtype=torch.uint8)
    _, _, _, dense = mlafuse.mla_kv_cache_dsa(
        latent, torch.ones(Q), torch.ones(C), pos, cos_sin, slots, kv, index_k, iw, ib, fused,
        return_index_out=True)
    mine = torch.zeros(nb, bs, 132, dtype=torch.uint8)
    compat.indexer_k_quant_and_cache(dense, mine, slots, 128, "ue8m0")
    assert torch.equal(mine.view(nb, -1), fused)


def test_indexer_k_quant_and_cache_errors():
    k = torch.randn(4, 128)
    cache = torch.zeros(2, 8, 132, dtype=torch.uint8)
    s = torch.arange(4)
    with pytest.raises(ValueError, match="quant_block_size = 96"):
        compat.indexer_k_quant_and_cache(k, cache, s, 96, "ue8m0")
    with pytest.raises(ValueError, match="kv_cache.shape\\[2\\] = 132, expected 136"):
        compat.indexer_k_quant_and_cache(k, cache, s, 64, "ue8m0")
    with pytest.raises(ValueError, match="slot_mapping.size\\(0\\) = 3"):
        compat.indexer_k_quant_and_cache(k, cache, s[:3], 128, "ue8m0")
    with pytest.raises(ValueError, match="kv_cache.dtype"):
        compat.indexer_k_quant_and_cache(k, cache.float(), s, 128, "ue8m0")
    with pytest.raises(TypeError, match="kv_cache_dtype"):
        compat.indexer_k_quant_and_cache(k, cache, s, 128, None)


# ---- vLLM fused_norm_rope_deepseek_v32 -------------------------------------------------------
def _layernorm_f64(x, w, b, eps):
    x = ref.f64(x)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * ref.f64(w) + ref.f64(b)


def _to_bf16(a):
    return torch.from_numpy(np.asarray(a, np.float64)).to(torch.bfloat16)


def _dsa_inputs(device, adjacent, seed=41):
    g = gen(seed)
    T, Q, C, R, nb, bs = 21, 96, 512, 64, 5, 8
    if adjacent:
        qkv = strided(g, T, Q + C + R, torch.bfloat16, device)
        q_c, kv_c, k_pe = qkv[:, :Q], qkv[:, Q:Q + C], qkv[:, Q + C:]
    else:
        q_c, kv_c = strided(g, T, Q, torch.bfloat16, device), strided(g, T, C, torch.bfloat16,
                                                                       device)
        k_pe = strided(g, T, R, torch.bfloat16, device)
    index_k = strided(g, T, 128, torch.bfloat16, device, pad=(0, 32))  # kw[:, :128]
    d = dict(
        positions=torch.randint(0, 100, (T,), generator=g).to(device), q_c=q_c,
        q_rms_norm_w=(1 + 0.1 * torch.randn(Q, generator=g)).bfloat16().to(device),
        q_rms_eps=1e-6, kv_c=kv_c,
        kv_rms_norm_w=(1 + 0.1 * torch.randn(C, generator=g)).bfloat16().to(device),
        kv_rms_eps=1e-6, k_pe=k_pe,
        k_rope_cos_sin_cache=mlafuse.rope_table(128, R, device=device), index_k=index_k,
        index_k_layer_norm_w=(1 + 0.1 * torch.randn(128, generator=g)).to(device),
        index_k_layer_norm_bias=(0.1 * torch.randn(128, generator=g)).to(device),
        index_k_layer_norm_eps=1e-6)
    d["index_k_rope_cos_sin_cache"] = d["k_rope_cos_sin_cache"]
    slots = torch.randperm(nb * bs, generator=g)[:T]
    slots[4] = -1
    return d, slots.to(device), nb, bs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["auto", "fp8_ds_mla"])
@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("adjacent", [True, False])
def test_fused_norm_rope_deepseek_v32(device, fmt, interleave, adjacent):
    d, slots, nb, bs = _dsa_inputs(device, adjacent)
    T = slots.shape[0]
    if fmt == "auto":
        mla = torch.full((nb, bs, 576), -3584.0, dtype=torch.bfloat16, device=device)
    else:
        mla = torch.full((nb, bs, 656), 0xA5, dtype=torch.uint8, device=device)
    icache = torch.full((nb, bs, 132), 0x5A, dtype=torch.uint8, device=device)
    topk_buf = torch.randint(0, 9, (T + 3, 16), dtype=torch.int32).to(device)
    topk, topk_tail = topk_buf[:T], topk_buf[T:].clone()
    mla0, ic0 = mla.clone(), icache.clone()
    q_out = compat.fused_norm_rope_deepseek_v32(
        **d, topk_indices_buffer=topk_buf, slot_mapping=slots, indexer_k_cache=icache,
        mla_kv_cache=mla, mla_kv_cache_dtype=fmt, index_rope_interleave=interleave)
    pos = d["positions"].cpu().numpy()
    cs = d["k_rope_cos_sin_cache"].cpu()
    # vLLM's unfused path, transcribed: q RMSNorm; kv RMSNorm -> bf16; GPT-J RoPE of k_pe;
    # index LayerNorm -> bf16 -> RoPE on [0, 64) -> bf16 -> ue8m0 fp8.
    ref.assert_close_ulp(q_out, ref.rmsnorm(d["q_c"], d["q_rms_norm_w"], 1e-6), "bfloat16", "q")
    # The implementation's dense rows (docs/kv_formats.md, check 2: cache bytes from its own dense row).
    _, kn, kp, dense = mlafuse.mla_kv_cache_dsa(
        torch.cat([d["q_c"], d["kv_c"], d["k_pe"]], 1), d["q_rms_norm_w"], d["kv_rms_norm_w"],
        d["positions"], d["k_rope_cos_sin_cache"], slots, mla0.clone(), d["index_k"],
        d["index_k_layer_norm_w"], d["index_k_layer_norm_bias"], ic0.clone().view(nb, -1),
        indexer=mlafuse.indexer_params("interleaved" if interleave else "neox"),
        return_index_out=True, return_k_nope=True, return_k_pe=True, eps_q=1e-6, eps_kv=1e-6,
        cache_format=fmt)
    ref.assert_close_ulp(kn, ref.rmsnorm(d["kv_c"], d["kv_rms_norm_w"], 1e-6), "bfloat16", "kv")
    kp_ref = ref.rope(d["k_pe"], pos, cs, "interleaved")
    ref.assert_close_ulp(kp, kp_ref, "bfloat16", "k_pe",
                         mag=ref.rope_magnitude(d["k_pe"], "interleaved"))
    ln = _to_bf16(_layernorm_f64(d["index_k"], d["index_k_layer_norm_w"],
                                 d["index_k_layer_norm_bias"], 1e-6))
    style = "interleaved" if interleave else "neox"
    ix_ref = ref.f64(ln).copy()
    ix_ref[:, :64] = ref.rope(ln[:, :64], pos, cs, style)
    ref.assert_close_ulp(dense, ix_ref, "bfloat16", "index key",
                         mag=np.concatenate([ref.rope_magnitude(ln[:, :64], style),
                                             np.zeros((T, 64))], 1))
    # cache bytes
    if fmt == "auto":
        records = torch.cat([kn, kp], 1).cpu()
    else:
        records = torch.from_numpy(ref.ds_mla_record(
            ref.f64(kn).astype(np.float32), kp.cpu().view(torch.int16).numpy().view(np.uint16),
            "amax"))
    assert torch.equal(mla.cpu(), _ref_rows(mla0, slots.cpu(), nb, bs, T, records))
    assert torch.equal(icache.cpu(), ref_index_cache(ic0, dense, slots.cpu(), 128, True))
    assert torch.all(topk == -1) and torch.equal(topk_buf[T:], topk_tail)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_norm_rope_deepseek_v32_shared_layer_fp8_and_profiling(device):
    d, slots, nb, bs = _dsa_inputs(device, True, seed=42)
    T = slots.shape[0]
    mla = torch.full((nb, bs, 576), 0xA5, dtype=torch.uint8, device=device)
    icache = torch.full((nb, bs, 132), 0x5A, dtype=torch.uint8, device=device)
    topk = torch.randint(0, 9, (T, 16), dtype=torch.int32).to(device)
    topk0, mla0 = topk.clone(), mla.clone()
    q_out = torch.empty_like(d["q_c"])
    got = compat.fused_norm_rope_deepseek_v32(
        **d, topk_indices_buffer=topk, slot_mapping=slots, indexer_k_cache=icache,
        mla_kv_cache=mla, mla_kv_cache_dtype="fp8", mla_k_scale=torch.tensor([0.02]).to(device),
        has_indexer=False, q_c_out=q_out)
    assert got is q_out
    ref.assert_close_ulp(q_out, ref.rmsnorm(d["q_c"], d["q_rms_norm_w"], 1e-6), "bfloat16", "q")
    assert torch.equal(topk, topk0) and torch.all(icache == 0x5A)  # shared layer: untouched
    _, kn, kp = mlafuse.mla_kv_cache(
        torch.cat([d["q_c"], d["kv_c"], d["k_pe"]], 1), d["q_rms_norm_w"], d["kv_rms_norm_w"],
        d["positions"], d["k_rope_cos_sin_cache"], slots, mla0.clone(), eps_q=1e-6,
        eps_kv=1e-6, return_k_nope=True, return_k_pe=True, cache_format="fp8",
        k_scale=torch.tensor([0.02]).to(device))
    rows = ref.fp8_record(ref.f64(torch.cat([kn, kp], 1)).astype(np.float32), 0.02, "div")
    assert torch.equal(mla.cpu(), _ref_rows(mla0, slots.cpu(), nb, bs, T, torch.from_numpy(rows)))
    # profiling: no slot_mapping, no caches: q norm and the -1 fill only
    q2 = compat.fused_norm_rope_deepseek_v32(**d, topk_indices_buffer=topk)
    assert torch.equal(q2, q_out) and torch.all(topk == -1)


def test_fused_norm_rope_deepseek_v32_errors():
    d, slots, nb, bs = _dsa_inputs("cpu", True, seed=43)
    T = slots.shape[0]
    mla = torch.zeros(nb, bs, 576, dtype=torch.bfloat16)
    ic = torch.zeros(nb, bs, 132, dtype=torch.uint8)
    topk = torch.zeros(T, 8, dtype=torch.int32)
    kw = dict(topk_indices_buffer=topk, slot_mapping=slots, indexer_k_cache=ic, mla_kv_cache=mla)
    with pytest.raises(NotImplementedError, match="pcp_peer_mla_kv_cache"):
        compat.fused_norm_rope_deepseek_v32(**d, **kw, pcp_peer_mla_kv_cache=mla[None])
    d2 = dict(d, index_k_rope_cos_sin_cache=mlafuse.rope_table(128, 64, 5e4,
                                                                      device="cpu"))
    with pytest.raises(ValueError, match="index_k_rope_cos_sin_cache differs"):
        compat.fused_norm_rope_deepseek_v32(**d2, **kw)
    with pytest.raises(ValueError, match="mla_kv_cache_dtype = 'fp8_e5m2'"):
        compat.fused_norm_rope_deepseek_v32(**d, **kw, mla_kv_cache_dtype="fp8_e5m2")
    with pytest.raises(ValueError, match="indexer_k_cache is"):
        compat.fused_norm_rope_deepseek_v32(**d, **dict(kw, indexer_k_cache=ic[:, :4]))
    with pytest.raises(ValueError, match="mla_kv_cache is None"):
        compat.fused_norm_rope_deepseek_v32(**d, **dict(kw, mla_kv_cache=None))


# ---- vLLM fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert ----------------------------------
def ref_v4_pages(pages, kv_roped, slots, bs):
    """The fp8_v4 pages (docs/kv_formats.md, fp8_v4) as plain numpy from the roped bf16 kv rows: per 64-block
    e = ceil_log2(max(amax, 1e-4) / 448), e4m3(x * 2^-e), byte e + 127; data row
    [448 e4m3 | 64 bf16] at o * 576, scale row [7 bytes | 0] at bs * 576 + o * 8."""
    out = pages.clone().cpu().numpy().copy()
    x = ref.f64(kv_roped).astype(np.float32)
    bits = kv_roped.cpu().view(torch.int16).numpy().view(np.uint16)
    nb = out.shape[0]
    for t in range(len(slots)):
        s_ = int(slots[t])
        if s_ < 0 or s_ >= nb * bs:
            continue
        b, o = divmod(s_, bs)
        blk = x[t, :448].reshape(7, 64)
        e = ref.ceil_log2(np.maximum(ref.nan_amax(blk), np.float32(1e-4)) / np.float32(448))
        q = ref.e4m3(blk * np.ldexp(np.float32(1), -e)[:, None].astype(np.float32))
        out[b, o * 576:o * 576 + 448] = q.reshape(448)
        out[b, o * 576 + 448:o * 576 + 576] = np.asarray(bits[t, 448:], "<u2").view(np.uint8)
        out[b, bs * 576 + o * 8:bs * 576 + o * 8 + 8] = np.append(np.clip(e + 127, 0, 255), 0)
    return torch.from_numpy(out)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("apply_q_norm", [True, False])
def test_fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert(device, apply_q_norm):
    g = gen(51)
    T, H, Hp, N, nb, bs, eps = 13, 6, 8, 11, 3, 4, 1e-6
    qbuf = torch.randn(T, H + 1, 512, generator=g).bfloat16().to(device)
    q = qbuf[:, 1:]                               # strided heads
    q0 = q.clone()
    kv = torch.randn(T, 512, generator=g).bfloat16().to(device)
    kv[2, :64] = 0.0                              # a zero block: the 1e-4 floor
    kv[3, 64:128] *= 1e4
    pos = torch.randint(0, 200, (T,), generator=g).to(device)
    cos_sin = mlafuse.rope_table(256, 64, device=device)
    slots = torch.randperm(nb * bs, generator=g)[:N]
    slots[1] = -1
    stride = bs * 584 + 32
    pages = torch.full((nb, stride), 0xA5, dtype=torch.uint8, device=device)
    pages0 = pages.clone()
    q_out = compat.fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert(
        q, kv, pages, slots.to(device), pos, cos_sin, Hp, eps, bs, apply_q_norm)
    assert q_out.shape == (T, Hp, 512) and q_out.dtype == torch.bfloat16
    assert torch.equal(q, q0)                     # q is read only
    assert torch.all(q_out[:, H:].cpu().view(torch.int16) == 0)   # pad heads +0.0
    # vLLM's reference: per-head x * rsqrt(mean(x^2) + eps), GPT-J RoPE on [448, 512)
    x = ref.f64(q)
    if apply_q_norm:
        x = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    p = pos.cpu().numpy()
    cs = cos_sin.cpu()
    want = x.copy()
    want[..., 448:] = np.stack([ref.rope(x[:, h, 448:], p, cs, "interleaved") for h in range(H)], 1)
    mag = np.concatenate([np.zeros((T, H, 448)),
                          np.stack([ref.rope_magnitude(x[:, h, 448:], "interleaved")
                                    for h in range(H)], 1)], -1)
    ref.assert_close_ulp(q_out[:, :H], want, "bfloat16", "q", mag=mag)
    # kv: the roped row within 1 ulp; the pages exact from the implementation's rounded row
    kv_ref = ref.f64(kv).copy()
    kv_ref[:, 448:] = ref.rope(kv[:, 448:], p, cs, "interleaved")
    bits = pages.cpu()
    got_rows = []
    for t in range(N):
        s_ = int(slots[t])
        if s_ >= 0:
            b, o = divmod(s_, bs)
            got_rows.append((t, bits[b, o * 576 + 448:o * 576 + 576].view(torch.bfloat16)))
    for t, r in got_rows:
        ref.assert_close_ulp(r, kv_ref[t, 448:], "bfloat16", "kv rope",
                             mag=ref.rope_magnitude(kv[t:t + 1, 448:], "interleaved")[0])
    roped = kv.clone().cpu()
    for t, r in got_rows:
        roped[t, 448:] = r
    want_pages = ref_v4_pages(pages0[:, :bs * 584], roped[:N], slots, bs)
    assert torch.equal(pages[:, :bs * 584].cpu(), want_pages)
    assert torch.all(pages[:, bs * 584:] == 0xA5)


def test_fused_deepseek_v4_insert_matches_fused_writer():
    """Fed the normalized kv, the pages equal mlafuse.mla_kv_cache(kv_rope_tail=64, fp8_v4)'s,
    which normalizes, ropes and quantizes in one pass."""
    g = gen(52)
    T, Q, nb, bs = 10, 64, 3, 4
    latent = strided(g, T, Q + 512, torch.bfloat16, "cpu")
    w_q = (1 + 0.1 * torch.randn(Q, generator=g)).bfloat16()
    w_kv = (1 + 0.1 * torch.randn(512, generator=g)).bfloat16()
    pos = torch.randint(0, 64, (T,), generator=g)
    cos_sin = mlafuse.rope_table(64, 64, device="cpu")
    slots = torch.randperm(nb * bs, generator=g)[:T]
    fused = torch.zeros(nb, bs, 584, dtype=torch.uint8)
    mlafuse.mla_kv_cache(latent, w_q, w_kv, pos, cos_sin, slots, fused, eps_q=1e-6, eps_kv=1e-6,
                         kv_rope_tail=64, cache_format="fp8_v4")
    _, kv_norm, _ = mlafuse.split_qk_norm(latent, w_q, w_kv, eps_q=1e-6, eps_kv=1e-6,
                                          q_lora_rank=Q, kv_lora_rank=512, rope_dim=0)
    mine = torch.zeros(nb, bs * 584, dtype=torch.uint8)
    q = torch.randn(T, 4, 512, generator=g).bfloat16()
    compat.fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert(q, kv_norm, mine, slots, pos,
                                                             cos_sin, 4, 1e-6, bs)
    assert torch.equal(mine, fused.view(nb, -1))


def test_fused_deepseek_v4_insert_errors():
    q = torch.zeros(3, 4, 512, dtype=torch.bfloat16)
    kv = torch.zeros(3, 512, dtype=torch.bfloat16)
    cache = torch.zeros(2, 4 * 584, dtype=torch.uint8)
    pos, cs = torch.arange(3), mlafuse.rope_table(8, 64, device="cpu")
    f = compat.fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert
    with pytest.raises(ValueError, match="q_head_padded = 2"):
        f(q, kv, cache, pos, pos, cs, 2, 1e-6, 4)
    with pytest.raises(ValueError, match="kv is"):
        f(q, kv[:, :448], cache, pos, pos, cs, 4, 1e-6, 4)
    with pytest.raises(ValueError, match="bfloat16"):
        f(q.half(), kv.half(), cache, pos, pos, cs, 4, 1e-6, 4)
    with pytest.raises(ValueError, match="cache_block_size \\* 584"):
        f(q, kv, cache, pos, pos, cs, 4, 1e-6, 8)
    with pytest.raises(ValueError, match="slot_mapping is"):
        f(q, kv, cache, torch.arange(5), pos, cs, 4, 1e-6, 4)
    with pytest.raises(ValueError, match="cos_sin_cache.shape\\[1\\] = 32"):
        f(q, kv, cache, pos, pos, cs[:, :32], 4, 1e-6, 4)
