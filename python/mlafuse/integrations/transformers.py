"""Run a Hugging Face transformers MLA + MoE model's memory-bound steps through mlafuse.

    from mlafuse.integrations.transformers import patch, unpatch
    model = AutoModelForCausalLM.from_pretrained(...)
    patch(model)          # in place; returns the model
    model.generate(...)
    unpatch(model)        # the original forwards again

Covered (transformers 5.x): DeepSeek-V2 / V2-Lite (``deepseek_v2``), DeepSeek-V3 / R1 and
Kimi-K2 (``deepseek_v3``), GLM-4.7-Flash (``glm4_moe_lite``), and the DSA models GLM-5
(``glm_moe_dsa``) and DeepSeek-V3.2 (``deepseek_v32``), whose lightning indexer stays
transformers' own (fed mlafuse's q-a norm output; its top-k masks the attention as in their
forwards). Also the hybrid models, whose linear-attention (KDA) layers, gated norms and short
convolutions stay transformers' own: Kimi-Linear / Kimi-K3's text model (``kimi_linear``: MLA
whose 64-wide rope slot is cached but never rotated, mla_use_nope) and GLM-5.3-Flash
(``glm5_next``, or its language model alone, ``glm5_next_text``: NoPE MLA, rope width 0, with a
DSA indexer that scores keys pooled over index_kpool tokens; the indexer, its cache, the
hyper-connection residual streams and the vision tower stay transformers'). For these NoPE
models nothing is rotated: no ``rope_q`` call, no table and no position check, and their cache
holds transformers' own layout (a cache may pass between patched and unpatched runs).
``patch`` replaces, by instance attribute, the forward of
- every MLA attention module: the q-a and kv-a projections become one GEMM (their weights
  concatenated: one extra copy of them, e.g. 30 MB per DeepSeek-V3 layer in bf16; rebuilt
  when a weight changes) whose output goes through ONE
  ``mlafuse.split_qk_norm`` (both RMSNorms, each with its module's own eps: Kimi-Linear's are
  built without the config's rms_norm_eps, so 1e-6); ``mlafuse.rope_q``
  rotates q_pe and k_pe in place (interleaved or NeoX as the config says) from one cos/sin
  table per device built from the config's rope_theta and rope scaling (default or YaRN);
  the cache update and attention are the model's own;
- every MoE router: the model's own f32 router logits, then ``mlafuse.moe_gate`` with the
  config's scoring (V3 / GLM / Kimi: sigmoid + e_score_correction_bias, n_group / topk_group
  top-2 sum, norm_topk_prob (Kimi: moe_renormalize) with eps 1e-20, routed_scaling_factor;
  V2: softmax, greedy or group_limited_greedy (group max), routed_scaling_factor);
- the model's rotary embedding, only to check once per forward that every position is inside
  the table (max_position_embeddings rows); the check is skipped while torch.compile traces
  or a CUDA graph captures.

Numerics: one rounding per RMSNorm output (transformers rounds x * rstd to the model dtype and
again after the weight) and f32 RoPE from a double-precision table (transformers: f32 angles,
cos / sin in the model dtype). In f32 the logits agree to about 1e-6; in bf16 the norm and
RoPE outputs differ by up to 1 bf16 ulp, and the logits typically by a few 1e-3 relative.
The keys' rope dims are stored in the cache in mlafuse's layout (pairs in place) rather than
transformers' de-interleaved one; queries use the same layout, so attention is unchanged, but
a cache filled while patched must not be continued unpatched (or the reverse).

DeepSeek-V4 (``deepseek_v4``): routers only, with ``patch(model, attention=False)``: its
sqrt-softplus top-k router through ``moe_gate`` and its hash routers through ``moe_gate_hash``
(logits as transformers computes them, in the weights' dtype; weights returned in that dtype);
its attention is not wrapped, so ``patch(model)`` refuses it and says so. DeepSeek-V4.1-Flash's
text config (q_lora_rank 1280, 384 experts top-6, sqrt-softplus, rms_norm_eps 1e-20, no hash
layers) loads as deepseek_v4 (this transformers has no deepseek_v41) and takes the same path,
provided it says num_hash_layers 0: without it transformers builds its default 3 hash-routed
layers.

Refused with UnsupportedModelError: other model types, rope types other than default /
YaRN, partial rotary factors, quantized (non-nn.Linear) q-a / kv-a projections, a
DeepSeek-V2 topk_method other than greedy / group_limited_greedy or with norm_topk_prob
(transformers' V2 router ignores it), a GLM-5.3 qk_rope_head_dim other than 0, module classes
whose layout differs from the ones this file was written against, and configs asking for what
transformers' modules do not compute (so neither side would give what the checkpoint expects):
Kimi with mla_use_nope = False (its attention never rotates), mla_use_output_gate = True (it
has no output gate) or a moe_router_activation_func other than sigmoid, and DeepSeek-V4 with a
gate_temp other than 1 (its router does not divide by one). Patched models are for inference
(no autograd through the mlafuse ops).
"""
from __future__ import annotations

import inspect
import sys
import types

from .. import ops as _ops

__all__ = ["patch", "unpatch", "is_patched", "UnsupportedModelError", "SUPPORTED_MODEL_TYPES"]

SUPPORTED_MODEL_TYPES = ("deepseek_v2", "deepseek_v3", "glm4_moe_lite", "glm_moe_dsa", "deepseek_v32",
                         "deepseek_v4", "glm5_next", "glm5_next_text", "kimi_linear")
# DeepSeek-V4: routers only (patch(model, attention=False)); its attention is not wrapped.
_ROUTERS_ONLY = {
    "deepseek_v4": "DeepSeek-V4 (deepseek_v4): its attention (the 512-wide shared kv with the "
                   "rope inside it, the per-head q norm, per-layer-type rope tables, compressed "
                   "kv) is not wrapped by this integration; patch(model, attention=False) routes "
                   "its sqrt-softplus and hash routers through mlafuse",
}
_ATTN_CLASSES = {"deepseek_v2": "DeepseekV2Attention", "deepseek_v3": "DeepseekV3Attention",
                 "glm4_moe_lite": "Glm4MoeLiteAttention", "glm_moe_dsa": "GlmMoeDsaAttention",
                 "deepseek_v32": "DeepseekV32Attention", "glm5_next": "Glm5NextTextAttention",
                 "glm5_next_text": "Glm5NextTextAttention", "kimi_linear": "KimiLinearAttention"}
_ROUTER_CLASSES = {"deepseek_v2": "DeepseekV2TopkRouter", "deepseek_v3": "DeepseekV3TopkRouter",
                   "glm4_moe_lite": "Glm4MoeLiteTopkRouter", "glm_moe_dsa": "GlmMoeDsaTopkRouter",
                   "deepseek_v32": "DeepseekV32TopkRouter", "deepseek_v4": "DeepseekV4TopKRouter",
                   "glm5_next": "Glm5NextTextTopkRouter",
                   "glm5_next_text": "Glm5NextTextTopkRouter",
                   "kimi_linear": "KimiLinearTopkRouter"}
_HASH_ROUTER_CLASSES = {"deepseek_v4": "DeepseekV4HashRouter"}
_DSA = ("glm_moe_dsa", "deepseek_v32")  # MLA + the DSA indexer (transformers' own, fed our q norm)
# MLA whose rope slot (if any) is never rotated: no rope_q, no table, no position check.
_NOPE = ("glm5_next", "glm5_next_text", "kimi_linear")
_POOLED_DSA = ("glm5_next", "glm5_next_text")  # NoPE MLA + the k-pool DSA indexer (transformers')
_STATE = "_mlafuse_state"


class UnsupportedModelError(ValueError):
    """patch() was given a model, config or module layout it does not cover."""


def _torch():
    if _ops._torch is None:
        raise ImportError("mlafuse.integrations.transformers needs torch and transformers")
    return _ops._torch


def is_patched(model) -> bool:
    return getattr(model, _STATE, None) is not None


# ---- configuration ----------------------------------------------------------------------------
def _text_config(cfg, model_type):
    """The config the language model's modules were built from: GLM-5.3-Flash (glm5_next) is a
    vision-language model whose MLA / MoE settings live in its text_config."""
    if model_type != "glm5_next":
        return cfg
    text = getattr(cfg, "text_config", None)
    if text is None:
        raise UnsupportedModelError("glm5_next: the config has no text_config")
    return text


def _nope_checks(cfg, model_type):
    """The NoPE MLA models: refuse configs whose checkpoint expects rotated rope columns, which
    the transformers attention (and so this integration) would leave unrotated."""
    R = int(cfg.qk_rope_head_dim or 0)
    if model_type == "kimi_linear":
        if getattr(cfg, "mla_use_nope", True) is False:
            raise UnsupportedModelError(
                "kimi_linear: mla_use_nope = False asks for rotated rope columns, but "
                "transformers' KimiLinearAttention never rotates them; refusing rather than "
                "choosing")
        if getattr(cfg, "mla_use_output_gate", False):
            raise UnsupportedModelError(
                "kimi_linear: mla_use_output_gate = True asks for a gated attention output, but "
                "transformers' KimiLinearAttention has no output gate; refusing rather than "
                "choosing")
    elif R != 0:
        raise UnsupportedModelError(f"{model_type}: qk_rope_head_dim = {R}; the GLM-5.3 "
                                    "attention this integration wraps is NoPE (0)")


def _rope_settings(cfg, model_type):
    """(style, base, scaling dict or None, max_pos) from the config, or UnsupportedModelError."""
    params = dict(getattr(cfg, "rope_parameters", None) or {})
    if not params and getattr(cfg, "rope_scaling", None):
        params = dict(cfg.rope_scaling)
    base = params.get("rope_theta", getattr(cfg, "rope_theta", None))
    if base is None:
        raise UnsupportedModelError(f"{model_type}: the config has no rope_theta")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ("default", "yarn"):
        raise UnsupportedModelError(f"{model_type}: rope type {kind!r} is not supported (mlafuse "
                                    "builds default and YaRN tables)")
    if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise UnsupportedModelError(f"{model_type}: partial_rotary_factor = "
                                    f"{params['partial_rotary_factor']} is not supported")
    R = int(cfg.qk_rope_head_dim)
    if getattr(cfg, "head_dim", R) != R:
        raise UnsupportedModelError(f"{model_type}: head_dim = {cfg.head_dim} but "
                                    f"qk_rope_head_dim = {R}; transformers' rotary embedding "
                                    "would not match the rope columns")
    scaling = None
    if kind == "yarn":
        scaling = {k: v for k, v in params.items()
                   if k not in ("rope_theta", "partial_rotary_factor") and v is not None}
        scaling["rope_type"] = "yarn"
        scaling.pop("type", None)
        if scaling.get("factor") is None:  # as transformers: the ratio of the context lengths
            scaling["factor"] = cfg.max_position_embeddings / \
                scaling["original_max_position_embeddings"]
    if model_type == "deepseek_v2":
        style = "interleaved"  # complex multiplication of (2i, 2i+1) pairs
    elif model_type in _DSA:
        style = "interleaved"  # their MLA attention always ropes interleaved pairs
    else:
        style = "interleaved" if getattr(cfg, "rope_interleave", True) else "neox"
    return style, float(base), scaling, int(cfg.max_position_embeddings)


def _router_params(cfg, model_type):
    """moe_gate keyword arguments (without top_k checks: the library validates them)."""
    if model_type == "deepseek_v2":
        method = getattr(cfg, "topk_method", "greedy")
        if method not in ("greedy", "group_limited_greedy"):
            raise UnsupportedModelError(f"deepseek_v2: topk_method = {method!r} is not supported "
                                        "(greedy, group_limited_greedy)")
        if getattr(cfg, "norm_topk_prob", False):
            raise UnsupportedModelError(
                "deepseek_v2: norm_topk_prob = True, but transformers' DeepseekV2TopkRouter "
                "ignores it (DeepSeek's own code renormalizes); refusing rather than choosing")
        grouped = method == "group_limited_greedy"
        return dict(top_k=int(cfg.num_experts_per_tok),
                    n_group=int(cfg.n_group) if grouped else 1,
                    topk_group=int(cfg.topk_group) if grouped else 1, score_func="softmax",
                    group_score="max", renormalize=False,
                    routed_scaling_factor=float(cfg.routed_scaling_factor),
                    apply_routed_scaling=True, eps=1e-20)
    if model_type == "deepseek_v4":  # transformers' V4 routers: no groups, always renormalized
        score = getattr(cfg, "scoring_func", None) or "sqrtsoftplus"
        if score != "sqrtsoftplus":
            raise UnsupportedModelError(f"deepseek_v4: scoring_func = {score!r} is not supported "
                                        "(sqrtsoftplus)")
        temp = getattr(cfg, "gate_temp", None)
        if temp is not None and float(temp) != 1.0:
            raise UnsupportedModelError(
                f"deepseek_v4: gate_temp = {temp} (V4.1 divides the router logits by it), but "
                "transformers' DeepseekV4TopKRouter does not; refusing rather than choosing")
        return dict(top_k=int(cfg.num_experts_per_tok), score_func="sqrt_softplus",
                    renormalize=True, routed_scaling_factor=float(cfg.routed_scaling_factor),
                    apply_routed_scaling=True, eps=1e-20)
    # (Kimi's checkpoints name it moe_router_activation_func; its transformers router ignores it)
    key = "moe_router_activation_func" if model_type == "kimi_linear" else "scoring_func"
    score = getattr(cfg, key, None) or "sigmoid"
    if score != "sigmoid":
        raise UnsupportedModelError(f"{model_type}: {key} = {score!r}, but the "
                                    "transformers router computes sigmoid scores")
    return dict(top_k=int(cfg.num_experts_per_tok), n_group=int(cfg.n_group or 1),
                topk_group=int(cfg.topk_group or 1), score_func="sigmoid",
                group_score="top2_sum", renormalize=bool(cfg.norm_topk_prob),
                routed_scaling_factor=float(cfg.routed_scaling_factor),
                apply_routed_scaling=True, eps=1e-20)


class _Shared:
    """Per-model state: the rope settings and one cos/sin table per device."""

    def __init__(self, style, base, scaling, max_pos):
        self.style, self.base, self.scaling, self.max_pos = style, base, scaling, max_pos
        self.tables = {}

    def cos_sin(self, device, R):
        t = self.tables.get(device)
        if t is None:
            t = _ops.rope_table(self.max_pos, R, base=self.base, scaling=self.scaling,
                                device=device)
            self.tables[device] = t
        return t


# ---- replacement forwards ---------------------------------------------------------------------
def _fused_a_weight(attn, st):
    """[q_a_proj; kv_a_proj_with_mqa] weights (and biases) as one matrix, rebuilt when either
    weight's storage, device, dtype or version changes."""
    torch = _torch()
    parts = ([attn.q_a_proj] if attn.q_a_proj is not None else []) + [attn.kv_a_proj_with_mqa]
    key = tuple((p.weight.data_ptr(), p.weight._version, p.weight.dtype, p.weight.device,
                 None if p.bias is None else (p.bias.data_ptr(), p.bias._version))
                for p in parts)
    if st.get("w_key") != key:
        with torch.no_grad():
            st["w_a"] = torch.cat([p.weight for p in parts]) if len(parts) > 1 \
                else parts[0].weight
            b = [p.bias for p in parts]
            st["b_a"] = None if b[0] is None else (torch.cat(b) if len(b) > 1 else b[0])
        st["w_key"] = key
    return st["w_a"], st["b_a"]


def _mla_qkv(self, hidden_states, position_ids, past_key_values, kwargs, new_cache):
    """q / k / v of the MLA attention (the cache updated on the way), and the q-a norm output
    [T, Q] (the DSA indexer's input)."""
    torch = _torch()
    F = torch.nn.functional
    st = getattr(self, _STATE)
    shared = st["shared"]
    rotate = shared.style != "none"
    if position_ids is None and rotate:
        raise RuntimeError("mlafuse-patched attention needs position_ids (the transformers "
                           "decoder layer passes them)")
    B, S = hidden_states.shape[:-1]
    T = B * S
    Q = self.q_lora_rank or 0
    C, R = self.kv_lora_rank, self.qk_rope_head_dim
    h = hidden_states.reshape(T, hidden_states.shape[-1])
    w_a, b_a = _fused_a_weight(self, st)
    latent = F.linear(h, w_a, b_a)                                    # [T, Q + C + R]
    q_norm, k_nope, _ = _ops.split_qk_norm(
        latent, self.q_a_layernorm.weight if Q else None, self.kv_a_layernorm.weight,
        eps_q=float(self.q_a_layernorm.variance_epsilon) if Q else 1e-6,
        eps_kv=float(self.kv_a_layernorm.variance_epsilon), q_lora_rank=Q, kv_lora_rank=C,
        rope_dim=R, return_k_pe=False)
    q = self.q_b_proj(q_norm) if Q else self.q_proj(h)
    q = q.view(T, -1, self.qk_head_dim)
    if rotate and R > 0:  # NoPE models keep q's and k's rope columns as projected
        cos_sin = shared.cos_sin(latent.device, R)
        positions = position_ids.expand(B, S).reshape(T).contiguous()
        _ops.rope_q(q, positions, cos_sin, style=shared.style)
        _ops.rope_q(latent[:, Q + C:].unsqueeze(1), positions, cos_sin, style=shared.style)
    kv_nope = k_nope.view(B, 1, S, C)
    k_rot = latent[:, Q + C:].reshape(B, 1, S, R)
    if past_key_values is not None:  # the cache API of the installed transformers
        kv_nope, k_rot = (past_key_values.update(kv_nope, k_rot, self.layer_idx, kwargs=kwargs) if new_cache
                          else past_key_values.update(kv_nope, k_rot, self.layer_idx))
    query_states = q.view(B, S, -1, self.qk_head_dim).transpose(1, 2)
    key_states, value_states = self.expand_kv(kv_nope, k_rot)
    return query_states, key_states, value_states, q_norm


def _attend(self, q, k, v, attention_mask, kwargs):
    st = getattr(self, _STATE)
    attention_interface = st["attention_functions"].get_interface(
        self.config._attn_implementation, st["eager_attention"])
    attn_output, attn_weights = attention_interface(
        self, q, k, v, attention_mask,
        dropout=0.0 if not self.training else self.attention_dropout, scaling=self.scaling,
        **kwargs)
    B, S = q.shape[0], q.shape[2]
    return self.o_proj(attn_output.reshape(B, S, -1).contiguous()), attn_weights


def _mla_attention(self, hidden_states, attention_mask, past_key_values, kwargs, new_cache=False):
    q, k, v, _ = _mla_qkv(self, hidden_states, kwargs.get("position_ids"), past_key_values, kwargs,
                          new_cache)
    return _attend(self, q, k, v, attention_mask, kwargs)


def _forward_dsa(self, hidden_states, position_embeddings=None, attention_mask=None, cache=None,
                 position_ids=None, prev_topk_indices=None, past_key_values=None, **kwargs):
    """GlmMoeDsaAttention / DeepseekV32Attention.forward: the MLA part through mlafuse, then
    transformers' own DSA indexer on the q-a norm output and its top-k as a sparse mask (or, for
    kernels that take them, as indices), as those forwards do. GLM-5's returns the top-k too
    (its "shared" layers reuse the previous full layer's)."""
    torch = _torch()
    cache = cache if cache is not None else past_key_values
    q, k, v, q_norm = _mla_qkv(self, hidden_states, position_ids, cache, kwargs, True)
    B, S = hidden_states.shape[:-1]
    indexer = getattr(self, "indexer", None)
    if indexer is not None:
        # the cache positionally: transformers renamed that argument (past_key_values -> cache)
        topk = indexer(hidden_states, q_norm.view(B, S, -1), position_embeddings,
                       attention_mask[:, 0, :, :], position_ids, cache)
    elif prev_topk_indices is not None:
        topk = prev_topk_indices
    else:
        raise ValueError("shared DSA layers need the top-k indices of a previous full layer")
    sparse = None
    if self.config._attn_implementation in ("eager", "sdpa"):
        masked = topk.new_ones((B, S, k.shape[2]), dtype=torch.bool).scatter(
            -1, topk.long(), False).unsqueeze(1)
        if attention_mask.dtype == torch.bool:
            attention_mask = attention_mask & ~masked
        else:
            attention_mask = attention_mask.masked_fill(masked, torch.finfo(hidden_states.dtype).min)
    else:
        sparse = topk
    out, weights = _attend(self, q, k, v, attention_mask, dict(kwargs, indices=sparse))
    return (out, weights, topk) if getattr(self, _STATE)["returns_topk"] else (out, weights)


def _forward_v3(self, hidden_states, position_embeddings=None, attention_mask=None,
                past_key_values=None, cache=None, **kwargs):
    """DeepseekV3Attention / Glm4MoeLiteAttention.forward's signature (the layer cache is
    ``cache`` in newer transformers, ``past_key_values`` in older ones)."""
    return _mla_attention(self, hidden_states, attention_mask,
                          cache if cache is not None else past_key_values, kwargs, cache is not None)


def _forward_v2(self, hidden_states, attention_mask=None, past_key_values=None,
                position_embeddings=None, cache=None, **kwargs):
    """DeepseekV2Attention.forward's signature."""
    return _mla_attention(self, hidden_states, attention_mask,
                          cache if cache is not None else past_key_values, kwargs, cache is not None)


def _forward_nope(self, hidden_states, attention_mask=None, cache=None, past_key_values=None,
                  **kwargs):
    """KimiLinearAttention.forward's signature: MLA whose 64-wide rope slot is cached and
    attended to but never rotated (Kimi's mla_use_nope)."""
    cache = cache if cache is not None else past_key_values
    return _mla_attention(self, hidden_states, attention_mask, cache, kwargs, True)


def _forward_pooled_dsa(self, hidden_states, attention_mask=None, cache=None,
                        prev_topk_indices=None, past_key_values=None, **kwargs):
    """Glm5NextTextAttention.forward: NoPE MLA through mlafuse, then the model's own k-pool
    indexer (on the q-a norm output and the [B, S] padding mask it is given) or the previous
    full layer's top-k, turned into the attention mask by the module's own method. Returns the
    top-k as the third output when the next layer reuses it."""
    cache = cache if cache is not None else past_key_values
    q, k, v, q_norm = _mla_qkv(self, hidden_states, None, cache, kwargs, True)
    B, S = hidden_states.shape[:-1]
    if self.indexer is not None:
        topk = self.indexer(hidden_states=hidden_states, q_resid=q_norm.view(B, S, -1),
                            attention_mask=attention_mask, cache=cache)
    elif prev_topk_indices is not None:
        topk = prev_topk_indices
    else:
        raise ValueError("shared DSA layers need the top-k indices of a previous full layer")
    mask = self.build_attention_mask_from_topk(topk_indices=topk, query_states=q,
                                               kv_length=k.shape[2])
    out, weights = _attend(self, q, k, v, mask, kwargs)
    return out, weights, topk if self.next_skip_topk else None


def _router_forward(self, hidden_states):
    """The TopkRouter's contract: (router_logits, topk_weights, topk_indices int64). The
    DeepSeek / GLM routers compute f32 logits and return f32 weights; DeepSeek-V4's keep the
    weight's dtype for both (st["f32"] False)."""
    torch = _torch()
    st = getattr(self, _STATE)
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    if st["f32"]:
        logits = torch.nn.functional.linear(hidden_states.type(torch.float32),
                                            self.weight.type(torch.float32))
    else:
        logits = torch.nn.functional.linear(hidden_states, self.weight)
    bias = getattr(self, "e_score_correction_bias", None) if st["biased"] else None
    if bias is not None and bias.dtype != torch.float32:
        bias = bias.float()
    w, ids = _ops.moe_gate(logits, bias, **st["gate"])
    return logits, w.to(logits.dtype), ids.long()


def _hash_router_forward(self, hidden_states, input_ids):
    """DeepseekV4HashRouter's contract: ids = tid2eid[input_ids] through moe_gate_hash (which
    also checks every row: an id or entry out of range, or a repeated entry, gives ids
    0 .. k-1 with weight 0 instead of indexing past the table)."""
    torch = _torch()
    st = getattr(self, _STATE)
    logits = torch.nn.functional.linear(hidden_states.reshape(-1, self.hidden_dim), self.weight)
    w, ids = _ops.moe_gate_hash(logits, self.tid2eid, input_ids.reshape(-1).contiguous(),
                                **st["gate"])
    return logits, w.to(logits.dtype), ids.long()


def _rotary_forward(self, x, position_ids):
    torch = _torch()
    st = getattr(self, _STATE)
    capturing = x.is_cuda and torch.cuda.is_current_stream_capturing()
    if not capturing and not torch.compiler.is_compiling() and position_ids.numel():
        lo, hi = int(position_ids.min()), int(position_ids.max())
        if lo < 0 or hi >= st["shared"].max_pos:
            raise ValueError(f"position_ids span [{lo}, {hi}], outside the mlafuse RoPE table "
                             f"[0, {st['shared'].max_pos}) (max_position_embeddings)")
    return type(self).forward(self, x, position_ids)


# ---- patch / unpatch --------------------------------------------------------------------------
_ATTN_FORWARDS = (_forward_v2, _forward_v3, _forward_dsa, _forward_pooled_dsa, _forward_nope)


def _has_topk_router(cfg):
    """Whether the config builds at least one learned top-k router (the per-layer MLP schedule
    where the config has one: V4's hash-routed layers and dense layers have none)."""
    kinds = getattr(cfg, "mlp_layer_types", None)
    if kinds is not None:
        return any(k in ("sparse", "moe") for k in kinds)
    return bool(getattr(cfg, "n_routed_experts", None))


def _check_pooled_dsa(mod, name):
    """GLM-5.3's attention: the parts _forward_pooled_dsa calls by name."""
    for attr in ("indexer", "build_attention_mask_from_topk", "next_skip_topk"):
        if not hasattr(mod, attr):
            raise UnsupportedModelError(f"{name} has no {attr!r}: this transformers version's "
                                        "DSA attention is not the one mlafuse was written against")
    if mod.indexer is not None:
        params = inspect.signature(mod.indexer.forward).parameters
        missing = [p for p in ("hidden_states", "q_resid", "attention_mask", "cache")
                   if p not in params]
        if missing:
            raise UnsupportedModelError(f"{name}: its indexer takes no {missing}: this "
                                        "transformers version's indexer is not the one mlafuse "
                                        "was written against")


def _model_type(model):
    cfg = getattr(model, "config", None)
    mt = getattr(cfg, "model_type", None)
    if mt is None:
        raise UnsupportedModelError(f"{type(model).__name__} has no config.model_type: not a "
                                    "transformers model")
    return cfg, mt


def patch(model, *, attention: bool = True, router: bool = True):
    """Route ``model``'s q-a / kv-a RMSNorms, RoPE (``attention``) and MoE routers (``router``)
    through mlafuse (see the module docstring). In place; returns the model. Patching a patched
    model is a no-op (unpatch first to change the choice)."""
    torch = _torch()
    if is_patched(model):
        return model
    cfg, mt = _model_type(model)
    if mt in _ROUTERS_ONLY and attention:
        raise UnsupportedModelError(_ROUTERS_ONLY[mt])
    if mt not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(f"model_type {mt!r} is not covered; mlafuse patches "
                                    f"{list(SUPPORTED_MODEL_TYPES)}")
    cfg = _text_config(cfg, mt)
    gate = _router_params(cfg, mt)
    shared = None
    if attention and mt in _NOPE:
        _nope_checks(cfg, mt)
        shared = _Shared("none", None, None, None)
    elif attention:
        style, base, scaling, max_pos = _rope_settings(cfg, mt)
        if scaling is not None:
            _ops._rope_scaling(scaling, base)  # rejects keys or values the library cannot build
        shared = _Shared(style, base, scaling, max_pos)
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    attn_name, router_name = _ATTN_CLASSES.get(mt), _ROUTER_CLASSES[mt]
    hash_name = _HASH_ROUTER_CLASSES.get(mt)
    plan = []
    for mod in model.modules():
        name = type(mod).__name__
        if name == attn_name and attention:
            for attr in ("kv_a_proj_with_mqa", "kv_a_layernorm", "expand_kv", "o_proj",
                         "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_head_dim"):
                if not hasattr(mod, attr):
                    raise UnsupportedModelError(f"{name} has no {attr!r}: this transformers "
                                                "version's MLA attention is not the one mlafuse "
                                                "was written against")
            for proj in (mod.q_a_proj if mod.q_lora_rank else None, mod.kv_a_proj_with_mqa):
                if proj is not None and type(proj) is not torch.nn.Linear:
                    raise UnsupportedModelError(
                        f"{name}: the q-a / kv-a projection is a {type(proj).__name__}, not a "
                        "plain torch.nn.Linear (quantized checkpoints are not supported: their "
                        "weights cannot be concatenated into one GEMM)")
            if mt in _POOLED_DSA:
                _check_pooled_dsa(mod, name)
            eager = getattr(sys.modules[type(mod).__module__], "eager_attention_forward", None)
            if eager is None:
                raise UnsupportedModelError(f"{type(mod).__module__} has no "
                                            "eager_attention_forward")
            fwd = (_forward_v2 if mt == "deepseek_v2" else _forward_dsa if mt in _DSA else
                   _forward_pooled_dsa if mt in _POOLED_DSA else
                   _forward_nope if mt in _NOPE else _forward_v3)
            plan.append((mod, fwd, dict(shared=shared, eager_attention=eager,
                                        attention_functions=ALL_ATTENTION_FUNCTIONS,
                                        returns_topk=mt == "glm_moe_dsa")))
        elif name == router_name and router:
            biased = hasattr(mod, "e_score_correction_bias") and mt != "deepseek_v2"
            plan.append((mod, _router_forward, dict(gate=gate, biased=biased, f32=mt != "deepseek_v4")))
        elif name == hash_name and router:
            plan.append((mod, _hash_router_forward, dict(gate=gate)))
    if attention and not any(f in _ATTN_FORWARDS for _, f, _ in plan):
        raise UnsupportedModelError(f"no {attn_name} module found in {type(model).__name__}")
    if router and not any(f is _router_forward for _, f, _ in plan) and _has_topk_router(cfg):
        raise UnsupportedModelError(f"no {router_name} module found in {type(model).__name__}")
    inner = getattr(model, "model", model)
    rotary = getattr(inner, "rotary_emb", None)
    if rotary is not None and attention and mt not in _NOPE:
        plan.append((rotary, _rotary_forward, dict(shared=shared)))
    with torch.no_grad():
        for mod, fwd, st in plan:
            setattr(mod, _STATE, st)
            mod.forward = types.MethodType(fwd, mod)
    setattr(model, _STATE, [m for m, _, _ in plan])
    return model


def unpatch(model):
    """Restore the original forwards (and drop mlafuse's fused weights and tables). Returns the
    model; a model that is not patched is returned unchanged."""
    mods = getattr(model, _STATE, None)
    if mods is None:
        return model
    for mod in mods:
        if "forward" in vars(mod):
            del mod.forward
        if hasattr(mod, _STATE):
            delattr(mod, _STATE)
    delattr(model, _STATE)
    return model
