"""Engine-facing adapters (docs/python.md): the functions inference engines already call, with their
exact signatures, defaults and return conventions, computed by mlafuse.

Each function names the engine and the commit (or release) whose signature it follows. They
take torch tensors (CPU or CUDA; they run through the same ``mlafuse.*`` calls, so the compiled
torch binding serves them when it is built). The module imports without torch; a call then
raises ImportError.
"""
from __future__ import annotations

from . import _lib as L
from . import ops as _ops

__all__ = ["fused_split_qk_norm", "npu_moe_gating_top_k", "biased_grouped_topk", "grouped_topk",
           "fused_topk_deepseek", "concat_and_cache_mla", "indexer_k_quant_and_cache",
           "fused_norm_rope_deepseek_v32", "fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert"]


def _torch(fn: str):
    if _ops._torch is None:
        raise ImportError(f"mlafuse.compat.{fn} needs torch (pip install torch); "
                          "it takes torch tensors")
    return _ops._torch


def _need_tensor(torch, x, name: str, fn: str):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{fn}: {name} is a {type(x).__name__}, expected a torch.Tensor")


def _f32_bias(bias):
    """mlafuse takes the correction bias as f32; engines keep it in the logits' dtype."""
    return bias if bias is None or bias.dtype == _ops._torch.float32 else bias.float()


# ---- the seed's fused split + two RMSNorms ---------------------------------------------------
def fused_split_qk_norm(fused_qkv_a_proj_out, q_a_layernorm, kv_a_layernorm, q_lora_rank,
                        kv_lora_rank, qk_rope_dim, eps=1e-6):
    """Split the fused q-a / kv-a projection output and RMS-normalize both parts: the seed
    kernel's Python entry (SGLang's DeepSeek-V2 attention prepares its latent the same way:
    ``fused_qkv_a_proj_with_mqa`` output -> ``q_a_layernorm``, ``kv_a_layernorm``; docs/python.md).

    fused_qkv_a_proj_out  [T, q_lora_rank + kv_lora_rank + qk_rope_dim], rows may be strided
                          (a slice of a wider GEMM output); f32 / f16 / bf16
    q_a_layernorm, kv_a_layernorm   norm modules (anything with ``.weight``); q_a_layernorm is
                          None, and q_lora_rank None or 0, for models without q LoRA
    eps                   used for both norms (the norms' own eps attributes are not read)

    Returns ``(q [T, Q], k_nope [T, 1, C], k_pe [T, 1, R])``: q and k_nope are new tensors in
    the input's dtype (q is None without q LoRA); k_pe is a view of the input's rope columns
    (bit-exact, no copy).
    """
    fn = "fused_split_qk_norm"
    torch = _torch(fn)
    _need_tensor(torch, fused_qkv_a_proj_out, "fused_qkv_a_proj_out", fn)
    Q = 0 if q_lora_rank is None else int(q_lora_rank)
    C, R = int(kv_lora_rank), int(qk_rope_dim)
    if Q > 0 and q_a_layernorm is None:
        raise ValueError(f"{fn}: q_lora_rank = {Q} but q_a_layernorm is None")
    if Q == 0 and q_a_layernorm is not None:
        raise ValueError(f"{fn}: q_a_layernorm is given but q_lora_rank = {q_lora_rank!r} "
                         "(no q LoRA): pass q_a_layernorm=None")
    for name, mod in (("q_a_layernorm", q_a_layernorm), ("kv_a_layernorm", kv_a_layernorm)):
        if mod is not None and not isinstance(getattr(mod, "weight", None), torch.Tensor):
            raise TypeError(f"{fn}: {name} has no tensor .weight (expected an RMSNorm module)")
    x = fused_qkv_a_proj_out
    q, k_nope, _ = _ops.split_qk_norm(
        x, q_a_layernorm.weight if Q else None, kv_a_layernorm.weight, eps_q=eps, eps_kv=eps,
        q_lora_rank=Q, kv_lora_rank=C, rope_dim=R, return_k_pe=False)
    T = x.shape[0]
    return q, k_nope.view(T, 1, C), x[:, Q + C:Q + C + R].unsqueeze(1)


# ---- routers ----------------------------------------------------------------------------------
def npu_moe_gating_top_k(x, k, *, bias=None, input_ids=None, tid2eid=None, k_group=1,
                         group_count=1, group_select_mode=0, renorm=0, norm_type=0,
                         out_flag=False, routed_scaling_factor=1.0, eps=1e-20):
    """Ascend's ``npu_moe_gating_top_k``: the schema with hash routing of the custom op
    documented as ``custom.npu_moe_gating_top_k(Tensor x, int k, *, Tensor? bias=None, Tensor?
    input_ids=None, Tensor? tid2eid=None, int k_group=1, int group_count=1, float
    routed_scaling_factor=1., float eps=1e-20, int group_select_mode=0, int renorm=0, int
    norm_type=0, bool out_flag=False)`` (vLLM-Ascend's custom ops for DeepSeek-V4; keyword
    arguments, so their order does not matter). Without input_ids / tid2eid it is torch_npu
    7.0.0's ``torch_npu.npu_moe_gating_top_k`` (whose norm_type defaults to 1).

    normOut = softmax(x) (norm_type 0), sigmoid(x) (1) or sqrt(softplus(x)) (2, DeepSeek-V4's
    score; mlafuse's "sqrt_softplus": the op's documentation names it Softplus, the model it
    serves routes on the square root); ``bias`` (x's dtype) is added to choose; groups score
    by their max (group_select_mode 0) or top-2 sum (1) and the ``k_group`` best of
    ``group_count`` stay; ``y = normOut[ids] / (sum + eps) * routed_scaling_factor`` (the
    documented formula, for every norm_type). ``renorm`` must be 0 (norm before top-k, the
    only value documented for this op).

    Hash routing (DeepSeek-V4's first layers): ``input_ids`` [T] int32 / int64 and ``tid2eid``
    [vocab, k] int32 / int64, both or neither (the op's rule). ``ids = tid2eid[input_ids]`` in
    table order (nothing is chosen, so ``bias`` has no effect and groups must be 1); weights
    as above. A row whose token id is outside [0, vocab), or whose table row has an entry
    outside [0, E) or a repeated one, gets ids 0 .. k-1 with weight 0 (mlafuse's rule; the
    Ascend op documents no behaviour for it).

    Returns ``(y [T, k] in x's dtype, expert_idx [T, k] int32, norm_out)``: norm_out is the
    [T, E] float32 normOut when ``out_flag``, else an empty [T, 0] tensor. Chosen ids are
    sorted by biased score (ties: lower index).
    """
    fn = "npu_moe_gating_top_k"
    torch = _torch(fn)
    _need_tensor(torch, x, "x", fn)
    if norm_type not in (0, 1, 2):
        raise ValueError(f"{fn}: norm_type = {norm_type!r}, expected 0 (softmax), 1 (sigmoid) "
                         "or 2 (softplus: sqrt(softplus), DeepSeek-V4)")
    if group_select_mode not in (0, 1):
        raise ValueError(f"{fn}: group_select_mode = {group_select_mode!r}, expected 0 (group "
                         "max) or 1 (top-2 sum)")
    if renorm != 0:
        raise ValueError(f"{fn}: renorm = {renorm!r}, expected 0 (the only value the op "
                         "documents: norm, then top-k)")
    score = ("softmax", "sigmoid", "sqrt_softplus")[norm_type]
    wdtype = None if x.dtype == torch.float32 else x.dtype
    if (input_ids is None) != (tid2eid is None):
        missing = "tid2eid" if tid2eid is None else "input_ids"
        raise ValueError(f"{fn}: hash routing needs both input_ids and tid2eid; {missing} is "
                         "None (the op allows both or neither)")
    if input_ids is not None:
        _need_tensor(torch, input_ids, "input_ids", fn)
        _need_tensor(torch, tid2eid, "tid2eid", fn)
        if tid2eid.dim() != 2 or tid2eid.shape[1] != int(k):
            raise ValueError(f"{fn}: tid2eid is {tuple(tid2eid.shape)}, expected [vocab, k = {k}]")
        if input_ids.dim() != 1 or input_ids.shape[0] != x.shape[0]:
            raise ValueError(f"{fn}: input_ids is {tuple(input_ids.shape)}, expected [T = "
                             f"{x.shape[0]}] (one token id per row of x)")
        if int(group_count) != 1 or int(k_group) != 1:
            raise ValueError(f"{fn}: group_count = {group_count}, k_group = {k_group} with hash "
                             "routing; expected 1 and 1 (hash routing chooses no groups)")
        out = _ops.moe_gate_hash(
            x, tid2eid, input_ids, top_k=int(k), score_func=score, renormalize=True,
            routed_scaling_factor=float(routed_scaling_factor), apply_routed_scaling=True,
            eps=float(eps), return_scores=bool(out_flag), weights_dtype=wdtype)
    else:
        out = _ops.moe_gate(
            x, _f32_bias(bias), top_k=int(k), n_group=int(group_count),
            topk_group=int(k_group), score_func=score,
            group_score="top2_sum" if group_select_mode == 1 else "max",
            renormalize=True, routed_scaling_factor=float(routed_scaling_factor),
            apply_routed_scaling=True, eps=float(eps), return_scores=bool(out_flag),
            weights_dtype=wdtype)
    if out_flag:
        return out
    return out[0], out[1], x.new_empty((x.shape[0], 0), dtype=torch.float32)


def biased_grouped_topk(hidden_states, gating_output, correction_bias, topk, renormalize,
                        num_expert_group=None, topk_group=None, num_fused_shared_experts=0,
                        routed_scaling_factor=None,
                        apply_routed_scaling_factor_on_output=False):
    """SGLang's ``biased_grouped_topk`` (python/sglang/srt/layers/moe/topk.py, commit
    000328a8; ``biased_grouped_topk_gpu`` and its torch reference ``biased_grouped_topk_impl``).

    Sigmoid scores, ``correction_bias`` added to choose, group score = top-2 sum, the
    ``topk_group`` best of ``num_expert_group`` groups kept (None: one group). ``topk`` counts
    the fused shared experts: ``topk - num_fused_shared_experts`` routed experts are chosen and
    the shared ones fill the last slots with ids E, E+1, ... (SGLang writes E for one shared
    expert) and weight ``sum(routed scores) / routed_scaling_factor``. With ``renormalize`` the
    weights are divided by the routed sum (no eps), and then, when
    ``apply_routed_scaling_factor_on_output``, multiplied by the factor (shared ones included,
    which then weigh 1), as SGLang does; without ``renormalize`` no factor is applied.

    Returns ``(topk_weights [T, topk] float32, topk_ids [T, topk] int32)``, routed ids sorted by
    biased score (SGLang leaves their order unspecified).
    """
    fn = "biased_grouped_topk"
    torch = _torch(fn)
    _need_tensor(torch, gating_output, "gating_output", fn)
    if hidden_states is not None and hidden_states.shape[0] != gating_output.shape[0]:
        raise ValueError(f"{fn}: hidden_states.shape[0] = {hidden_states.shape[0]} but "
                         f"gating_output.shape[0] = {gating_output.shape[0]} (tokens mismatch)")
    S = int(num_fused_shared_experts)
    if S < 0 or S >= int(topk):
        raise ValueError(f"{fn}: num_fused_shared_experts = {S}, expected 0 <= it < topk = {topk}")
    if S > 0 and routed_scaling_factor is None:
        raise ValueError(f"{fn}: num_fused_shared_experts = {S} needs routed_scaling_factor "
                         "(the shared weight is sum / routed_scaling_factor)")
    factor = 1.0 if routed_scaling_factor is None else float(routed_scaling_factor)
    apply = bool(renormalize) and bool(apply_routed_scaling_factor_on_output) and \
        routed_scaling_factor is not None
    w, ids = _ops.moe_gate(
        gating_output, _f32_bias(correction_bias), top_k=int(topk) - S,
        n_group=int(num_expert_group or 1), topk_group=int(topk_group or 1),
        score_func="sigmoid", group_score="top2_sum", renormalize=bool(renormalize),
        routed_scaling_factor=factor, apply_routed_scaling=apply, eps=0.0, n_shared_experts=S)
    if S > 0 and apply:
        w[:, int(topk) - S:] *= factor  # mlafuse keeps sum / factor there; SGLang scales it too
    return w, ids


def grouped_topk(hidden_states, gating_output, topk, renormalize, num_expert_group=0,
                 topk_group=0, scoring_func="softmax", routed_scaling_factor=1.0,
                 e_score_correction_bias=None):
    """vLLM's ``grouped_topk`` (vllm/model_executor/layers/fused_moe/router/
    grouped_topk_router.py, commit 55681666), the DeepSeek-V2 / V3 router.

    ``scoring_func`` "softmax" or "sigmoid" (fp32 here; vLLM's torch path scores in the logits'
    dtype); with ``e_score_correction_bias`` the biased scores choose and the group score is
    the top-2 sum, without it the group max; the ``topk_group`` best of ``num_expert_group``
    groups are kept (0: no groups, where vLLM's router falls back to plain top-k); weights are
    the unbiased scores, divided by their sum (no eps) when ``renormalize``, then multiplied by
    ``routed_scaling_factor``.

    Returns ``(topk_weights [T, topk] float32, topk_ids [T, topk] int32)``, sorted by the
    choosing score (vLLM: unspecified order).
    """
    fn = "grouped_topk"
    torch = _torch(fn)
    _need_tensor(torch, gating_output, "gating_output", fn)
    if hidden_states is not None and hidden_states.shape[0] != gating_output.shape[0]:
        raise ValueError(f"{fn}: hidden_states.shape[0] = {hidden_states.shape[0]} but "
                         f"gating_output.shape[0] = {gating_output.shape[0]} (tokens mismatch)")
    if scoring_func not in ("softmax", "sigmoid"):
        raise ValueError(f"{fn}: scoring_func = {scoring_func!r}, expected 'softmax' or "
                         "'sigmoid' (sqrtsoftplus needs moe_gate's sqrt_softplus score, not in "
                         "this mlafuse)")
    groups = int(num_expert_group) if num_expert_group else 1
    return _ops.moe_gate(
        gating_output, _f32_bias(e_score_correction_bias), top_k=int(topk), n_group=groups,
        topk_group=int(topk_group) if groups > 1 else 1, score_func=scoring_func,
        group_score="top2_sum" if e_score_correction_bias is not None else "max",
        renormalize=bool(renormalize), routed_scaling_factor=float(routed_scaling_factor),
        apply_routed_scaling=True, eps=0.0)


def fused_topk_deepseek(scores, bias, n_group, topk_group, topk, routed_scaling_factor,
                        topk_values, topk_indices, launch_with_pdl=True,
                        routing_replay_out=None):
    """FlashInfer's ``flashinfer.fused_moe.fused_topk_deepseek`` (flashinfer/fused_moe/
    fused_routing_dsv3.py, commit 7146f71f), DeepSeek-V3's noaux_tc router.

    ``sigmoid(scores) + bias`` chooses (top-2-sum group score, ``topk_group`` of ``n_group``
    groups), weights ``sigmoid / sum * routed_scaling_factor`` (the sum with FlashInfer's
    1e-20). Writes ``topk_values`` [T, topk] (scores' dtype) and ``topk_indices`` [T, topk]
    int32 in place, and ``routing_replay_out[:T]`` (int16) when given; returns None.
    ``launch_with_pdl`` is accepted and has no effect. mlafuse does not have FlashInfer's
    limits (E a power of two, topk <= 8, <= 32 experts per group).
    """
    fn = "fused_topk_deepseek"
    torch = _torch(fn)
    for name, t in (("scores", scores), ("bias", bias), ("topk_values", topk_values),
                    ("topk_indices", topk_indices)):
        _need_tensor(torch, t, name, fn)
    if topk_values.dtype != scores.dtype:
        raise ValueError(f"{fn}: topk_values.dtype = {topk_values.dtype}, expected the scores' "
                         f"dtype {scores.dtype}")
    _ops.moe_gate(scores, _f32_bias(bias), top_k=int(topk), n_group=int(n_group),
                  topk_group=int(topk_group), score_func="sigmoid", group_score="top2_sum",
                  renormalize=True, routed_scaling_factor=float(routed_scaling_factor),
                  apply_routed_scaling=True, eps=1e-20, weights=topk_values, ids=topk_indices)
    if routing_replay_out is not None:
        if routing_replay_out.dtype != torch.int16 or routing_replay_out.dim() != 2 or \
                routing_replay_out.shape[0] < scores.shape[0] or \
                routing_replay_out.shape[1] != int(topk):
            raise ValueError(f"{fn}: routing_replay_out is {tuple(routing_replay_out.shape)} "
                             f"{routing_replay_out.dtype}, expected int16 [>= {scores.shape[0]}, "
                             f"{topk}]")
        routing_replay_out[:scores.shape[0]].copy_(topk_indices)
    return None


# ---- KV-cache write ---------------------------------------------------------------------------
_E4M3_MAX = 448.0


def _div448(torch, v):
    """v / 448 correctly rounded on every device: torch's CUDA division by a Python number
    multiplies by its reciprocal, which is not 1 / 448 exactly, so scales would differ from
    the amax / 448 of docs/kv_formats.md by an ulp (and bytes at e4m3 ties with them)."""
    return v / torch.full_like(v, _E4M3_MAX)


def _e4m3_bytes(torch, x):
    """f32 -> e4m3 bytes as CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3): round
    to nearest even, saturate to +-448 (inf included), NaN of either sign -> 0x7F, the sign kept
    on zero (docs/kv_formats.md). Integer arithmetic on the f32 bits, so the bytes are the same on every
    device and CPU (torch's own float8 casts are not held to one rounding across backends)."""
    x = x.float().contiguous()
    sign = (x.view(torch.int32) >> 24) & 0x80
    a = torch.nan_to_num(x.abs(), nan=0.0).clamp(max=_E4M3_MAX)
    u = a.view(torch.int32)
    normal = ((u + 0x7FFFF + ((u >> 20) & 1)) >> 20) - (120 << 3)  # mantissa to 3 bits, RNE
    sub = torch.round(a * 512.0).to(torch.int32)  # below 2^-6: m * 2^-9, ties to even
    code = torch.where(a < 2.0 ** -6, sub, normal) | sign
    return torch.where(torch.isnan(x), torch.full_like(code, 0x7F), code).to(torch.uint8)


def concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
    """vLLM's ``concat_and_cache_mla`` (vllm/_custom_ops.py, the wrapper of
    ``torch.ops._C_cache_ops.concat_and_cache_mla``; the same signature in every stored
    version, e.g. commit 0002bde5): write ``[kv_c | k_pe]`` of every token
    t < N = slot_mapping.size(0) (N <= T) into the paged cache
    ``kv_cache [num_blocks, block_size, W]`` at slot_mapping[t] (block = slot // block_size,
    offset = slot % block_size); a negative slot skips the token (a slot past the cache is
    skipped too). Returns None.

    kv_c [T, C] (already normalized), k_pe [T, R] or [T, 1, R] (already roped), rows strided.
    kv_cache_dtype (docs/kv_formats.md, same bytes as mlafuse's mla_kv_cache writes for the same dense
    values):
      "auto"               kv_cache in any float dtype, W = C + R, values cast to it
      "fp8", "fp8_e4m3"    kv_cache uint8 / float8_e4m3fn, W = C + R, e4m3(x / scale), scale a
                           1-element f32 tensor
      "fp8_ds_mla"         kv_cache uint8 / float8_e4m3fn, W = C + 4*C/128 + 2*R (656 for the
                           V3.2 shapes 512 + 64): C e4m3 bytes with one f32 scale per 128 values
                           (max(amax / 448, FLT_MIN)), then R bf16 rope values; bf16 kv_c and
                           k_pe, C % 128 == 0; ``scale`` is not read
    "fp8_e5m2" and "nvfp4_ds_mla" raise MlafError (MLAF_ERR_UNSUPPORTED).

    mlafuse has no write-only kernel (its fused op, ``mlafuse.mla_kv_cache``, normalizes and
    ropes on the way): this adapter writes with torch indexing, on the tensors' device.
    """
    fn = "concat_and_cache_mla"
    torch = _torch(fn)
    for name, t in (("kv_c", kv_c), ("k_pe", k_pe), ("kv_cache", kv_cache),
                    ("slot_mapping", slot_mapping)):
        _need_tensor(torch, t, name, fn)
    if not isinstance(kv_cache_dtype, str):
        raise TypeError(f"{fn}: kv_cache_dtype is a {type(kv_cache_dtype).__name__}, expected "
                        "'auto', 'fp8', 'fp8_e4m3' or 'fp8_ds_mla'")
    fmt = _ops._kv_format_code(kv_cache_dtype)  # unknown and unsupported names raise here
    if k_pe.dim() == 3:
        if k_pe.shape[1] != 1:
            raise ValueError(f"{fn}: k_pe is {tuple(k_pe.shape)}, expected [T, R] or [T, 1, R]")
        k_pe = k_pe[:, 0]
    if kv_c.dim() != 2 or k_pe.dim() != 2 or kv_c.shape[0] != k_pe.shape[0]:
        raise ValueError(f"{fn}: kv_c is {tuple(kv_c.shape)} and k_pe {tuple(k_pe.shape)}, "
                         "expected [T, C] and [T, R] with the same T")
    if slot_mapping.dim() != 1 or slot_mapping.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{fn}: slot_mapping is {tuple(slot_mapping.shape)} "
                         f"{slot_mapping.dtype}, expected [N] int32 or int64")
    T, C = kv_c.shape
    R = k_pe.shape[1]
    N = slot_mapping.shape[0]
    if N > T:
        raise ValueError(f"{fn}: slot_mapping.size(0) = {N} > T = {T} (kv_c.size(0))")
    if kv_cache.dim() != 3:
        raise ValueError(f"{fn}: kv_cache is {tuple(kv_cache.shape)}, expected "
                         "[num_blocks, block_size, W]")
    nb, bs, W = kv_cache.shape
    fp8_dtypes = (torch.uint8, torch.float8_e4m3fn)
    if fmt == L.KV_PLAIN:
        want = C + R
        if not kv_cache.dtype.is_floating_point:
            raise ValueError(f"{fn}: kv_cache.dtype = {kv_cache.dtype}; 'auto' writes floats")
    elif fmt == L.KV_FP8:
        want = C + R
        if kv_cache.dtype not in fp8_dtypes:
            raise ValueError(f"{fn}: kv_cache.dtype = {kv_cache.dtype}, expected uint8 or "
                             f"float8_e4m3fn for {kv_cache_dtype!r}")
        _need_tensor(torch, scale, "scale", fn)
        if scale.numel() != 1 or scale.dtype != torch.float32:
            raise ValueError(f"{fn}: scale is {tuple(scale.shape)} {scale.dtype}, expected one "
                             "float32 value")
    else:  # fp8_ds_mla
        want = C + 4 * (C // 128) + 2 * R
        if kv_cache.dtype not in fp8_dtypes:
            raise ValueError(f"{fn}: kv_cache.dtype = {kv_cache.dtype}, expected uint8 or "
                             "float8_e4m3fn for 'fp8_ds_mla'")
        if C % 128 or kv_c.dtype != torch.bfloat16 or k_pe.dtype != torch.bfloat16:
            raise ValueError(f"{fn}: 'fp8_ds_mla' needs bf16 kv_c and k_pe and C % 128 == 0 "
                             f"(got {kv_c.dtype}, {k_pe.dtype}, C = {C})")
    if W != want:
        raise ValueError(f"{fn}: kv_cache.shape[2] = {W}, expected {want} for "
                         f"{kv_cache_dtype!r} with C = {C}, R = {R}")
    slots = slot_mapping.long()
    keep = (slots >= 0) & (slots < nb * bs)
    rows = torch.nonzero(keep).flatten()
    slots = slots[rows]
    blk, off = slots // bs, slots % bs
    kv, pe = kv_c[:N][rows], k_pe[:N][rows]
    if fmt == L.KV_PLAIN:
        kv_cache[blk, off] = torch.cat([kv, pe], dim=1).to(kv_cache.dtype)
        return None
    dst = kv_cache.view(torch.uint8) if kv_cache.dtype != torch.uint8 else kv_cache
    if fmt == L.KV_FP8:
        x = torch.cat([kv, pe], dim=1).float() / scale.reshape(1).to(kv.device)
        dst[blk, off] = _e4m3_bytes(torch, x)
        return None
    x = kv.float().view(-1, C // 128, 128)
    amax = torch.nan_to_num(x.abs(), nan=0.0).amax(dim=2, keepdim=True)
    tile = torch.clamp(_div448(torch, amax), min=torch.finfo(torch.float32).tiny)
    q = _e4m3_bytes(torch, x / tile).view(-1, C)
    record = torch.cat([q, tile.view(-1, C // 128).contiguous().view(torch.uint8),
                        pe.contiguous().view(torch.uint8)], dim=1)
    dst[blk, off] = record
    return None


# ---- DSA indexer key cache (docs/dsa.md) ---------------------------------------------------------
_INDEX_D = 128


def _ceil_log2_f32(torch, v):
    """ceil(log2 v) of positive f32 values from their bits (docs/kv_formats.md; +inf gives 128)."""
    bits = v.contiguous().view(torch.int32)
    return ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(torch.int32)


def _byte_blocks(torch, cache, fn, name):
    """A [num_blocks, block_size * W] uint8 view of a [num_blocks, block_size, W] byte cache
    whose blocks are each contiguous (any block stride)."""
    if cache.dtype not in (torch.uint8, torch.float8_e4m3fn):
        raise ValueError(f"{fn}: {name}.dtype = {cache.dtype}, expected uint8 or float8_e4m3fn")
    if cache.dim() != 3:
        raise ValueError(f"{fn}: {name} is {tuple(cache.shape)}, expected "
                         "[num_blocks, block_size, bytes per token]")
    nb, bs, W = cache.shape
    if cache.stride(2) != 1 or cache.stride(1) != W:
        raise ValueError(f"{fn}: {name} strides {tuple(cache.stride())}: each block must be "
                         f"contiguous (stride(1) = {W}, stride(2) = 1)")
    u8 = cache if cache.dtype == torch.uint8 else cache.view(torch.uint8)
    return torch.as_strided(u8, (nb, bs * W), (u8.stride(0), 1))


def indexer_k_quant_and_cache(k, kv_cache, slot_mapping, quant_block_size, kv_cache_dtype):
    """vLLM's ``indexer_k_quant_and_cache`` (vllm/_custom_ops.py, commit 0002bde5, the wrapper
    of ``torch.ops._C_cache_ops.indexer_k_quant_and_cache``; the kernel in
    csrc/cache_kernels.cu): quantize the DSA indexer key of every token t < T = k.size(0) and
    write it into the block-planar index cache at slot_mapping[t] (negative: skipped; past the
    cache: skipped too, where vLLM's kernel would write out of bounds). Returns None.

    k             [T, D] f32 / f16 / bf16, rows strided: the final key (LayerNorm and RoPE
                  already applied), quantized as it is
    kv_cache      [num_blocks, block_size, D + 4 * D / quant_block_size] uint8 or
                  float8_e4m3fn (132 B per token for D = 128), MUTATED; each block contiguous,
                  the block stride any. Planar: block b holds the block_size * D e4m3 bytes
                  (token o at b * stride + o * D), then the f32 scales (token o's j-th at
                  b * stride + block_size * D + 4 * (o * D / quant_block_size + j))
    slot_mapping  [N] int32 / int64, N >= T
    quant_block_size  D % quant_block_size == 0; one scale per quant_block_size values
    kv_cache_dtype    vLLM's ``scale_fmt``: "ue8m0" gives s = 2^ceil(log2(max(amax, 1e-4) /
                  448)) (the exponent exact from the f32 bits, docs/kv_formats.md; vLLM's
                  exp2f(ceilf(log2f(.))) agrees except where log2f rounds to an integer),
                  any other string s = max(amax, 1e-4) / 448; then e4m3(x / s)

    The same bytes as mlafuse.mla_kv_cache_dsa's index cache for the same dense key. mlafuse
    has no quantize-only kernel (its DSA op normalizes and ropes on the way): this adapter
    writes with torch indexing, on the tensors' device.
    """
    fn = "indexer_k_quant_and_cache"
    torch = _torch(fn)
    for name, t in (("k", k), ("kv_cache", kv_cache), ("slot_mapping", slot_mapping)):
        _need_tensor(torch, t, name, fn)
    if not isinstance(kv_cache_dtype, str):
        raise TypeError(f"{fn}: kv_cache_dtype is a {type(kv_cache_dtype).__name__}, expected "
                        "a str (vLLM's scale_fmt: 'ue8m0' for power-of-two scales)")
    if k.dim() != 2 or not k.dtype.is_floating_point or k.dtype.itemsize == 1:
        raise ValueError(f"{fn}: k is {tuple(k.shape)} {k.dtype}, expected [T, D] float32, "
                         "float16 or bfloat16")
    T, D = k.shape
    qb = int(quant_block_size)
    if qb <= 0 or D % qb:
        raise ValueError(f"{fn}: quant_block_size = {quant_block_size}, expected a positive "
                         f"divisor of head_dim D = {D}")
    nq = D // qb
    blocks = _byte_blocks(torch, kv_cache, fn, "kv_cache")
    nb, bs, W = kv_cache.shape
    if W != D + 4 * nq:
        raise ValueError(f"{fn}: kv_cache.shape[2] = {W}, expected {D + 4 * nq} (D = {D} fp8 "
                         f"bytes + {nq} f32 scales)")
    if slot_mapping.dim() != 1 or slot_mapping.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{fn}: slot_mapping is {tuple(slot_mapping.shape)} "
                         f"{slot_mapping.dtype}, expected [N] int32 or int64")
    if slot_mapping.shape[0] < T:
        raise ValueError(f"{fn}: slot_mapping.size(0) = {slot_mapping.shape[0]} < T = {T} "
                         "(k.size(0)); the kernel reads one slot per key row")
    slots = slot_mapping[:T].long()
    rows = torch.nonzero((slots >= 0) & (slots < nb * bs)).flatten()
    slots = slots[rows]
    b, o = slots // bs, slots % bs
    x = k[rows].float().view(-1, nq, qb)
    amax = torch.nan_to_num(x.abs(), nan=0.0).amax(dim=2)
    s = _div448(torch, torch.clamp(amax, min=1e-4))
    if kv_cache_dtype == "ue8m0":
        e = _ceil_log2_f32(torch, s)
        s = torch.where(e >= 128, torch.full_like(s, float("inf")),
                        torch.ldexp(torch.ones_like(s), e.clamp(max=127)))
    q = _e4m3_bytes(torch, x / s.unsqueeze(2)).view(-1, D)
    ar = torch.arange(D, device=k.device)
    blocks[b.unsqueeze(1), (o * D).unsqueeze(1) + ar] = q
    sb = s.contiguous().view(torch.uint8).view(-1, 4 * nq)
    ar4 = torch.arange(4 * nq, device=k.device)
    blocks[b.unsqueeze(1), (bs * D + o * 4 * nq).unsqueeze(1) + ar4] = sb
    return None


def _f32_table(torch, t, name, fn):
    _need_tensor(torch, t, name, fn)
    if t.dim() != 2:
        raise ValueError(f"{fn}: {name} is {tuple(t.shape)}, expected [max_pos, rot_dim]")
    return t if t.dtype == torch.float32 else t.float()


def _latent_of(torch, q_c, kv_c, k_pe):
    """One [T, Q + C + R] row view when q_c | kv_c | k_pe are adjacent column slices of one
    buffer (vLLM splits them from the fused q-a / kv-a GEMM output), else a concatenated copy."""
    es = q_c.element_size()
    Q, C = q_c.shape[1], kv_c.shape[1]
    same = (q_c.dtype == kv_c.dtype == k_pe.dtype and q_c.device == kv_c.device == k_pe.device
            and q_c.stride(1) == kv_c.stride(1) == k_pe.stride(1) == 1
            and q_c.stride(0) == kv_c.stride(0) == k_pe.stride(0)
            and kv_c.data_ptr() == q_c.data_ptr() + Q * es
            and k_pe.data_ptr() == kv_c.data_ptr() + C * es)
    if same:
        return torch.as_strided(q_c, (q_c.shape[0], Q + C + k_pe.shape[1]), (q_c.stride(0), 1))
    return torch.cat([q_c, kv_c, k_pe], dim=1)


def fused_norm_rope_deepseek_v32(positions, q_c, q_rms_norm_w, q_rms_eps, kv_c, kv_rms_norm_w,
                                 kv_rms_eps, k_pe, k_rope_cos_sin_cache, index_k,
                                 index_k_layer_norm_w, index_k_layer_norm_bias,
                                 index_k_layer_norm_eps, index_k_rope_cos_sin_cache,
                                 topk_indices_buffer, slot_mapping=None, indexer_k_cache=None,
                                 mla_kv_cache=None, pcp_peer_indexer_k_cache=None,
                                 pcp_peer_mla_kv_cache=None, pcp_rank=0, pcp_size=1,
                                 mla_kv_cache_dtype="auto", mla_k_scale=None, has_indexer=True,
                                 index_rope_interleave=False, q_c_out=None):
    """vLLM's fused DSA pre-attention (vllm/models/deepseek_v32/nvidia/kernels.py, commit
    020505c2: ``fused_norm_rope``, the Python entry of the registered op
    ``torch.ops.vllm.fused_norm_rope_deepseek_v32``; same parameters, names, defaults and
    return) on one ``mlafuse.mla_kv_cache_dsa`` call (one launch on CUDA).

    q_c [T, Q], kv_c [T, C], k_pe [T, R] (rows strided; when they are adjacent column slices
    of one GEMM output, as vLLM splits them, no copy is made, else they are concatenated):
    q_c_out = RMSNorm(q_c) * q_rms_norm_w (q_rms_eps), for every token (q_c_out given: written
    and returned, else allocated); kv_c RMSNorm (kv_rms_eps) and GPT-J (interleaved) RoPE of
    k_pe with k_rope_cos_sin_cache [max_pos, R] (cos | sin), written to ``mla_kv_cache``
    [num_blocks, block_size, W] at slot_mapping[t] in ``mla_kv_cache_dtype`` "auto", "fp8" /
    "fp8_e4m3" (``mla_k_scale``, default 1.0) or "fp8_ds_mla" (656 B, amax tile scales).
    With ``has_indexer``: index_k [T, 128] LayerNorm (w, b, index_k_layer_norm_eps), RoPE on
    dims [0, 64) (NeoX, or GPT-J when ``index_rope_interleave``), UE8M0 fp8 into
    ``indexer_k_cache`` [num_blocks, block_size, 132] (block-planar, docs/dsa.md; the MLA
    cache's block_size), and rows t < T of ``topk_indices_buffer`` [>= T, K] filled with -1; without it (a
    layer sharing the previous indexer) neither is touched. A negative slot skips the token's
    cache writes; ``slot_mapping`` None (vLLM's profiling run) writes no cache.

    Numerics are mlafuse's (docs/kv_formats.md, docs/dsa.md): every value is rounded to the latent dtype before it
    is roped or quantized, as vLLM's unfused path (rms_norm, rotary_embedding,
    concat_and_cache_mla, indexer_k_quant_and_cache) computes it; vLLM's Triton kernel keeps
    them in f32 (and multiplies by 1 / 448 for the ds_mla tile scale), so its cache bytes can
    differ at e4m3 rounding boundaries. cos / sin tables other than f32 are converted.

    Not supported (they raise): ``pcp_peer_indexer_k_cache`` / ``pcp_peer_mla_kv_cache``
    (prefill context-parallel peer stores; mlafuse's multi-destination store is not exposed
    for the MLA cache here), an index RoPE table different from k_rope_cos_sin_cache (mlafuse
    ropes both keys from one table), and ``mla_kv_cache`` None with a slot_mapping.
    """
    fn = "fused_norm_rope_deepseek_v32"
    torch = _torch(fn)
    for name, t in (("positions", positions), ("q_c", q_c), ("q_rms_norm_w", q_rms_norm_w),
                    ("kv_c", kv_c), ("kv_rms_norm_w", kv_rms_norm_w), ("k_pe", k_pe),
                    ("topk_indices_buffer", topk_indices_buffer)):
        _need_tensor(torch, t, name, fn)
    for name, t in (("pcp_peer_indexer_k_cache", pcp_peer_indexer_k_cache),
                    ("pcp_peer_mla_kv_cache", pcp_peer_mla_kv_cache)):
        if t is not None:
            raise NotImplementedError(f"{fn}: {name} (context-parallel peer caches) is not "
                                      "supported by this adapter")
    if positions.dim() != 1:
        raise ValueError(f"{fn}: positions is {tuple(positions.shape)}, expected [T]")
    T = positions.shape[0]
    for name, t in (("q_c", q_c), ("kv_c", kv_c), ("k_pe", k_pe)):
        if t.dim() != 2 or t.shape[0] != T:
            raise ValueError(f"{fn}: {name} is {tuple(t.shape)}, expected [T = {T}, width]")
    cos_sin = _f32_table(torch, k_rope_cos_sin_cache, "k_rope_cos_sin_cache", fn)
    if cos_sin.shape[1] != k_pe.shape[1]:
        raise ValueError(f"{fn}: k_rope_cos_sin_cache.shape[1] = {cos_sin.shape[1]}, expected "
                         f"k_pe's rope dim {k_pe.shape[1]}")
    latent = _latent_of(torch, q_c, kv_c, k_pe)
    Q, C, R = q_c.shape[1], kv_c.shape[1], k_pe.shape[1]
    if q_c_out is None:
        q_c_out = torch.empty_like(q_c)
    if slot_mapping is None:
        slots = torch.full((T,), -1, dtype=torch.int64, device=q_c.device)
    else:
        _need_tensor(torch, slot_mapping, "slot_mapping", fn)
        slots = slot_mapping
    if mla_kv_cache is None:
        if slot_mapping is not None:
            raise ValueError(f"{fn}: mla_kv_cache is None but slot_mapping is given (mlafuse "
                             "writes the MLA cache in the same pass; pass the cache)")
        _ops.split_qk_norm(latent, q_rms_norm_w, kv_rms_norm_w, eps_q=float(q_rms_eps),
                           eps_kv=float(kv_rms_eps), q_lora_rank=Q, kv_lora_rank=C, rope_dim=R,
                           q=q_c_out)
        if has_indexer:
            topk_indices_buffer[:T].fill_(-1)
        return q_c_out
    fmt = {"auto": "auto", "fp8": "fp8", "fp8_e4m3": "fp8_e4m3",
           "fp8_ds_mla": "fp8_ds_mla"}.get(mla_kv_cache_dtype)
    if fmt is None:
        raise ValueError(f"{fn}: mla_kv_cache_dtype = {mla_kv_cache_dtype!r}, expected 'auto', "
                         "'fp8', 'fp8_e4m3' or 'fp8_ds_mla'")
    extra = {}
    if fmt in ("fp8", "fp8_e4m3"):
        extra["k_scale"] = mla_k_scale if mla_k_scale is not None else \
            torch.ones(1, dtype=torch.float32, device=q_c.device)
    elif fmt == "fp8_ds_mla":
        extra["tile_scale"] = "amax"
    common = dict(eps_q=float(q_rms_eps), eps_kv=float(kv_rms_eps), style="interleaved",
                  q_lora_rank=Q, kv_lora_rank=C, rope_dim=R, q=q_c_out, cache_format=fmt,
                  **extra)
    if not has_indexer or indexer_k_cache is None:
        _ops.mla_kv_cache(latent, q_rms_norm_w, kv_rms_norm_w, positions, cos_sin, slots,
                          mla_kv_cache, **common)
        if has_indexer:
            topk_indices_buffer[:T].fill_(-1)
        return q_c_out
    for name, t in (("index_k", index_k), ("index_k_layer_norm_w", index_k_layer_norm_w),
                    ("index_k_layer_norm_bias", index_k_layer_norm_bias),
                    ("index_k_rope_cos_sin_cache", index_k_rope_cos_sin_cache)):
        _need_tensor(torch, t, name, fn)
    it = index_k_rope_cos_sin_cache
    if it is not k_rope_cos_sin_cache and not (
            it.shape == k_rope_cos_sin_cache.shape
            and torch.equal(it.float(), k_rope_cos_sin_cache.float())):
        raise ValueError(f"{fn}: index_k_rope_cos_sin_cache differs from k_rope_cos_sin_cache; "
                         "mlafuse ropes the MLA and the indexer keys from one table")
    ic = indexer_k_cache
    if ic.dim() != 3 or ic.shape[0] != mla_kv_cache.shape[0] or \
            ic.shape[1] != mla_kv_cache.shape[1] or ic.shape[2] != 132:
        raise ValueError(f"{fn}: indexer_k_cache is {tuple(ic.shape)}, expected "
                         f"[{mla_kv_cache.shape[0]}, {mla_kv_cache.shape[1]}, 132] (the MLA "
                         "cache's blocks, 128 fp8 bytes + one f32 scale per token)")
    index_2d = _byte_blocks(torch, ic, fn, "indexer_k_cache")
    ip = _ops_indexer_params("interleaved" if index_rope_interleave else "neox",
                             float(index_k_layer_norm_eps))
    _mla_kv_cache_dsa(latent, q_rms_norm_w, kv_rms_norm_w, positions, cos_sin, slots,
                      mla_kv_cache, index_k, index_k_layer_norm_w, index_k_layer_norm_bias,
                      index_2d, indexer=ip, topk_fill=topk_indices_buffer[:T], **common)
    return q_c_out


def _ops_indexer_params(style, ln_eps):
    from .indexer import indexer_params

    return indexer_params(style, hadamard=False, ln_eps=ln_eps, amax_eps=1e-4, scale="ue8m0")


def _mla_kv_cache_dsa(*args, **kwargs):
    from .indexer import mla_kv_cache_dsa

    return mla_kv_cache_dsa(*args, **kwargs)


# ---- DeepSeek-V4 (docs/mla.md) -------------------------------------------------------------------
def fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert(q_in, kv, k_cache, slot_mapping,
                                                      position_ids, cos_sin_cache, q_head_padded,
                                                      eps, cache_block_size, apply_q_norm=True):
    """vLLM's DeepSeek-V4 pre-attention op ``torch.ops._C.fused_deepseek_v4_qnorm_rope_kv_
    rope_quant_insert`` (csrc/libtorch_stable/fused_deepseek_v4_qnorm_rope_kv_insert_kernel.cu,
    commit 00ce99f0: ``(q_in, kv, k_cache, slot_mapping, position_ids, cos_sin_cache,
    q_head_padded, eps, cache_block_size, apply_q_norm) -> q_out``, the C++ wrapper's names;
    vLLM's call sites pass them by position). The registered schema's default for
    ``apply_q_norm`` is not in the stored sources; call sites pass nine arguments, so True is
    taken here.

    q_in          [T, H, 512] bf16 (strided heads allowed), read only
    kv            [T, 512] same dtype, read only: the kv latent AFTER its RMSNorm (vLLM runs
                  fused_q_kv_rmsnorm first)
    k_cache       [num_blocks, block_bytes] uint8 (or a [num_blocks, block_size, 584] view of
                  the same), MUTATED: fp8_v4 pages (docs/kv_formats.md, fp8_v4) of ``block_size`` tokens, page
                  stride k_cache.stride(0) bytes
    slot_mapping  [N] int32 / int64, N <= T: rows t >= N insert nothing; negative: skipped
    position_ids  [T] int32 / int64;  cos_sin_cache [max_pos, 64] (cos | sin; converted to f32)
    q_head_padded Hpad >= H;  cache_block_size  tokens per page

    Returns q_out [T, Hpad, 512] in q's dtype: per head RMSNorm without weight (when
    ``apply_q_norm``; eps) and GPT-J RoPE on dims [448, 512), rounded once; heads H .. Hpad-1
    are +0.0 (mlafuse.rope_q with head_norm and q_out). The kv row is roped the same way
    (mlafuse.rope_q on a copy, so q and k of one position rotate alike), rounded to kv's dtype,
    and its 584-B record (448 e4m3 values with 7 UE8M0 block exponents, 64 bf16 rope values)
    is written with torch indexing: mlafuse's fused V4 writer, mla_kv_cache(kv_rope_tail=64,
    cache_format="fp8_v4"), takes the latent before the RMSNorm and normalizes it itself, so it
    is not this op's contract (call it directly to fuse the norm too).
    """
    fn = "fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert"
    torch = _torch(fn)
    q, positions, padded_heads, block_size = q_in, position_ids, q_head_padded, cache_block_size
    for name, t in (("q_in", q), ("kv", kv), ("k_cache", k_cache), ("slot_mapping", slot_mapping),
                    ("position_ids", positions)):
        _need_tensor(torch, t, name, fn)
    if q.dim() != 3 or q.shape[2] != 512:
        raise ValueError(f"{fn}: q_in is {tuple(q.shape)}, expected [T, H, 512]")
    T, H = q.shape[0], q.shape[1]
    if kv.dim() != 2 or kv.shape != (T, 512) or kv.dtype != q.dtype:
        raise ValueError(f"{fn}: kv is {tuple(kv.shape)} {kv.dtype}, expected [T = {T}, 512] "
                         f"{q.dtype} (q_in's dtype)")
    if kv.dtype != torch.bfloat16:
        raise ValueError(f"{fn}: kv.dtype = {kv.dtype}; the fp8_v4 record stores bf16 rope "
                         "values, so q_in and kv must be bfloat16")
    Hp = int(padded_heads)
    if Hp < H:
        raise ValueError(f"{fn}: q_head_padded = {Hp} < q_in.size(1) = {H}")
    if positions.dim() != 1 or positions.shape[0] != T:
        raise ValueError(f"{fn}: position_ids is {tuple(positions.shape)}, expected [T = {T}]")
    cos_sin = _f32_table(torch, cos_sin_cache, "cos_sin_cache", fn)
    if cos_sin.shape[1] != 64:
        raise ValueError(f"{fn}: cos_sin_cache.shape[1] = {cos_sin.shape[1]}, expected 64")
    if slot_mapping.dim() != 1 or slot_mapping.dtype not in (torch.int32, torch.int64) or \
            slot_mapping.shape[0] > T:
        raise ValueError(f"{fn}: slot_mapping is {tuple(slot_mapping.shape)} "
                         f"{slot_mapping.dtype}, expected [N <= {T}] int32 or int64")
    bs = int(block_size)
    if bs <= 0:
        raise ValueError(f"{fn}: cache_block_size = {block_size}, expected > 0")
    if k_cache.dtype not in (torch.uint8, torch.float8_e4m3fn):
        raise ValueError(f"{fn}: k_cache.dtype = {k_cache.dtype}, expected uint8")
    u8 = k_cache if k_cache.dtype == torch.uint8 else k_cache.view(torch.uint8)
    nb = u8.shape[0]
    inner = u8[0].numel() if nb else 0
    if inner < bs * 584 or (u8.dim() > 1 and not u8[0].is_contiguous()):
        raise ValueError(f"{fn}: k_cache is {tuple(k_cache.shape)}: each block needs "
                         f"cache_block_size * 584 = {bs * 584} contiguous bytes")
    pages = torch.as_strided(u8, (nb, bs * 584), (u8.stride(0), 1))

    q_out = q.new_empty((T, Hp, 512))
    _ops.rope_q(q, positions, cos_sin, style="interleaved", rope_dim=64,
                head_norm=bool(apply_q_norm), head_norm_eps=float(eps), q_out=q_out)

    N = slot_mapping.shape[0]
    slots = slot_mapping.long()
    rows = torch.nonzero((slots >= 0) & (slots < nb * bs)).flatten()
    if rows.numel() == 0:
        return q_out
    slots = slots[rows]
    x = kv[:N][rows].unsqueeze(1).clone()                  # [n, 1, 512], roped in place
    _ops.rope_q(x, positions[:N][rows], cos_sin, style="interleaved", rope_dim=64)
    x = x[:, 0]
    nope = x[:, :448].float().view(-1, 7, 64)
    amax = torch.nan_to_num(nope.abs(), nan=0.0).amax(dim=2)
    e = _ceil_log2_f32(torch, _div448(torch, torch.clamp(amax, min=1e-4)))      # [n, 7]
    inv = torch.ldexp(torch.ones_like(amax), (-e).clamp(-126, 127))
    data = torch.cat([_e4m3_bytes(torch, nope * inv.unsqueeze(2)).view(-1, 448),
                      x[:, 448:].contiguous().view(torch.uint8)], dim=1)    # [n, 576]
    scale = torch.cat([(e + 127).clamp(0, 255).to(torch.uint8),
                       torch.zeros_like(e[:, :1], dtype=torch.uint8)], dim=1)  # [n, 8]
    b, o = slots // bs, slots % bs
    ar = torch.arange(576, device=kv.device)
    pages[b.unsqueeze(1), (o * 576).unsqueeze(1) + ar] = data
    ar8 = torch.arange(8, device=kv.device)
    pages[b.unsqueeze(1), (bs * 576 + o * 8).unsqueeze(1) + ar8] = scale
    return q_out


# ---- fused RMSNorm + fp8 1x128 block quant (docs/gemm_formats.md): _compat_norm_quant ----
from ._compat_norm_quant import (fused_add_rmsnorm_fp8_block_quant,  # noqa: E402
                                 rms_norm_per_block_quant, rms_norm_per_block_quant_op)

__all__ += ["rms_norm_per_block_quant", "rms_norm_per_block_quant_op",
            "fused_add_rmsnorm_fp8_block_quant"]

# ---- SGLang's per-token-group fp8 quantize (_compat_sglang_quant.py) ---------------------------------
from ._compat_sglang_quant import per_token_group_quant_fp8, sglang_per_token_group_quant_fp8  # noqa: E402

__all__ += ["sglang_per_token_group_quant_fp8", "per_token_group_quant_fp8"]
