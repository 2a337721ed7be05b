"""PyTorch custom ops: torch.ops.mlafuse.*, defined from the one schema table (_schemas.SCHEMAS)
and served by one of two implementations.

Why custom ops rather than plain Python calls: the dispatcher gives the calls a schema with
mutation annotations (``Tensor(a!) kv_cache``) and a fake (meta) implementation, so
torch.compile can trace them (fullgraph), functionalize the mutations and re-inplace them,
and CUDA graphs can capture them.

The schemas are written once, in _schemas.py; this module defines the library from that table
(torch.library, namespace "mlafuse") and registers the fake implementations below, whichever
binding serves the ops. Bindings (``BINDING``; the environment variable
MLAFUSE_BINDING=auto|ext|ctypes chooses):
  "ext"     the compiled torch extension (csrc/mlafuse_torch*.cpp, built by setup.py when
            torch is present): its TORCH_LIBRARY_IMPL blocks register C++ kernels for CPU and
            CUDA that call libmlafuse directly; it defines no schema. It is loaded first, then
            the table is defined here (a kernel whose C++ signature disagrees with its schema
            is then reported by the definition, as an ImportError). The default when it loads.
  "ctypes"  the Python implementations below, which build ctypes views and call the library
            through _core. Used when the extension is absent (no compiler or no torch at build
            time), fails to load, or MLAFUSE_BINDING=ctypes.
Both take this thread's context for the tensors' device, point it at torch's current stream on
that device and call the library; neither synchronizes or reads device memory, so both are
capture-safe. With one schema table, code and compiled graphs do not depend on which one is
loaded.

The ops, what they return and mutate: _schemas.py. Errors: the ctypes binding raises
MlafError; the compiled one raises RuntimeError with the text "MLAF_ERR_SHAPE: <the library's
message>", which the mlafuse.* functions turn into MlafError. No autograd: inference ops.
"""
from __future__ import annotations

import ctypes
import glob
import json
import os
import warnings

import torch

from . import _core
from . import _lib as L
from ._lib import MlafError
from ._schemas import SCHEMAS

_DT = {torch.float32: L.F32, torch.float16: L.F16, torch.bfloat16: L.BF16,
       torch.int32: L.I32, torch.int64: L.I64, torch.uint8: L.U8,
       torch.float8_e4m3fn: L.FP8_E4M3}


def _view(t, name, device):
    if t is None:
        return None
    if t.device != device:
        raise MlafError(L.ERR_INVALID_ARGUMENT,
                        f"{name} is on {t.device}, expected {device} (every tensor of a call "
                        "lives on one device)")
    code = _DT.get(t.dtype)
    if code is None:
        raise MlafError(L.ERR_DTYPE, f"{name}.dtype = {t.dtype}, expected float32, float16, "
                                     "bfloat16, int32, int64, uint8 or float8_e4m3fn")
    return _core._view(name, t.data_ptr(), code, t.shape, t.stride())


def _context(device):
    if device.type == "cpu":
        return _core.context(L.BACKEND_CPU)
    if device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        ctx = _core.context(L.BACKEND_CUDA, idx)
        # The stream is read on every call: under graph capture it is the capture stream.
        stream = torch.cuda.current_stream(idx).cuda_stream
        ctx.check(L.mlaf_context_set_cuda_stream(ctx.ptr, stream or None))
        return ctx
    raise MlafError(L.ERR_BACKEND_UNAVAILABLE,
                    f"tensors on {device} are not supported; mlafuse runs on cpu and cuda")


def _T(latent):
    return latent.shape[0] if latent.dim() >= 1 else 0


_STATUS_BY_NAME = {L.mlaf_status_name(s).decode(): s for s in range(L.ERR_OUT_OF_MEMORY + 1)}


def error_from_text(text: str) -> MlafError | None:
    """The MlafError that a compiled-binding message such as "MLAF_ERR_SHAPE: latent.shape[1]
    = 1340, expected ..." stands for (the extension raises its errors as RuntimeError with that
    text), or None when the text is not one of mlafuse's."""
    name, sep, message = text.partition(": ")
    status = _STATUS_BY_NAME.get(name) if sep else None
    if status is None:
        return None
    return MlafError(status, message, name)


# The implementations by op name: (the ctypes binding's kernel, the fake implementation). The
# dispatcher leaves out trailing arguments equal to their schema defaults, so every
# implementation repeats the schema's defaults.
_IMPLS = {}


def _register(name: str, impl, fake):
    assert name in SCHEMAS, name
    _IMPLS[name] = (impl, fake)


# ---- split_qk_norm -------------------------------------------------------------------------
def _split_out(latent, w_q, w_kv, q, k_nope, k_pe, Q, C, R, eps_q, eps_kv):
    d = latent.device
    _core.run_split_qk_norm(_context(d), Q, C, R, eps_q, eps_kv, _view(latent, "latent", d),
                            _view(w_q, "w_q", d), _view(w_kv, "w_kv", d), _view(q, "q", d),
                            _view(k_nope, "k_nope", d), _view(k_pe, "k_pe", d))


def _split_alloc(latent, Q, C, R, return_k_pe):
    T = _T(latent)
    return (latent.new_empty((T, max(Q, 0))), latent.new_empty((T, max(C, 0))),
            latent.new_empty((T, max(R, 0) if return_k_pe else 0)))


def _split_impl(latent, w_q, w_kv, Q, C, R, eps_q, eps_kv, return_k_pe=True):
    q, k_nope, k_pe = _split_alloc(latent, Q, C, R, return_k_pe)
    _split_out(latent, w_q, w_kv, q if Q > 0 else None, k_nope, k_pe if return_k_pe else None,
               Q, C, R, eps_q, eps_kv)
    return q, k_nope, k_pe


def _split_fake(latent, w_q, w_kv, Q, C, R, eps_q, eps_kv, return_k_pe=True):
    return _split_alloc(latent, Q, C, R, return_k_pe)


_register("split_qk_norm", _split_impl, _split_fake)


def _nothing(*args, **kwargs):
    return None


_register("split_qk_norm_out", _split_out, _nothing)


def _ranks_of(latent, w_q, w_kv):
    """The _lean forms' ranks: from the shapes, as mlafuse.split_qk_norm takes them when none
    is given (len(w_q) or 0, len(w_kv), the rest of the latent row; a missing dim counts 0)."""
    Q = w_q.shape[0] if w_q is not None and w_q.dim() >= 1 else 0
    C = w_kv.shape[0] if w_kv.dim() >= 1 else 0
    return Q, C, (latent.shape[1] if latent.dim() >= 2 else 0) - Q - C


def _split_lean(latent, w_q, w_kv, eps_q, eps_kv, return_k_pe=True):
    return _split_impl(latent, w_q, w_kv, *_ranks_of(latent, w_q, w_kv), eps_q, eps_kv,
                       return_k_pe)


def _split_lean_fake(latent, w_q, w_kv, eps_q, eps_kv, return_k_pe=True):
    return _split_alloc(latent, *_ranks_of(latent, w_q, w_kv), return_k_pe)


def _split_lean_out(latent, w_q, w_kv, q, k_nope, k_pe, eps_q, eps_kv):
    _split_out(latent, w_q, w_kv, q, k_nope, k_pe, *_ranks_of(latent, w_q, w_kv), eps_q, eps_kv)


_register("split_qk_norm_lean", _split_lean, _split_lean_fake)
_register("split_qk_norm_lean_out", _split_lean_out, _nothing)


def _split_inplace(latent, w_q, w_kv, Q, C, R, eps_q, eps_kv):
    # The in-place form the library accepts: outputs are exactly the latent's own columns.
    q = latent[:, :Q] if Q > 0 and latent.dim() == 2 else None
    k_nope = latent[:, Q:Q + C] if latent.dim() == 2 else None
    k_pe = latent[:, Q + C:Q + C + R] if latent.dim() == 2 else None
    _split_out(latent, w_q, w_kv, q, k_nope, k_pe, Q, C, R, eps_q, eps_kv)


_register("split_qk_norm_inplace", _split_inplace, _nothing)


# ---- mla_kv_cache --------------------------------------------------------------------------
# The cache-format arguments (docs/kv_formats.md) come last, with the plain call's defaults.
def _kv_out(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, error_count, q,
            k_nope, k_pe, Q, C, R, eps_q, eps_kv, style, cache_format=0, scale=None, fp8_conv=0,
            amax_out=None, tile_scale=0, kpe_cache=None, kv_rope_tail=0):
    d = latent.device
    _core.run_mla_kv_cache(
        _context(d), Q, C, R, eps_q, eps_kv, style, _view(latent, "latent", d),
        _view(w_q, "w_q", d), _view(w_kv, "w_kv", d), _view(positions, "positions", d),
        _view(cos_sin, "cos_sin", d), _view(slot_mapping, "slot_mapping", d),
        _view(kv_cache, "kv_cache", d), _view(q, "q", d), _view(k_nope, "k_nope", d),
        _view(k_pe, "k_pe", d), _view(error_count, "error_count", d), cache_format,
        _view(scale, "scale", d), fp8_conv, _view(amax_out, "amax_out", d), tile_scale,
        _view(kpe_cache, "kpe_cache", d), kv_rope_tail)


def _kv_alloc(latent, Q, C, R, return_k_nope, return_k_pe):
    T = _T(latent)
    return (latent.new_empty((T, max(Q, 0))),
            latent.new_empty((T, max(C, 0) if return_k_nope else 0)),
            latent.new_empty((T, max(R, 0) if return_k_pe else 0)))


def _kv_impl(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, error_count, Q, C,
             R, eps_q, eps_kv, style, return_k_nope=False, return_k_pe=False, cache_format=0,
             scale=None, fp8_conv=0, amax_out=None, tile_scale=0, kpe_cache=None, kv_rope_tail=0):
    q, k_nope, k_pe = _kv_alloc(latent, Q, C, R, return_k_nope, return_k_pe)
    _kv_out(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, error_count,
            q if Q > 0 else None, k_nope if return_k_nope else None,
            k_pe if return_k_pe else None, Q, C, R, eps_q, eps_kv, style, cache_format, scale,
            fp8_conv, amax_out, tile_scale, kpe_cache, kv_rope_tail)
    return q, k_nope, k_pe


def _kv_fake(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, error_count, Q, C,
             R, eps_q, eps_kv, style, return_k_nope=False, return_k_pe=False, cache_format=0,
             scale=None, fp8_conv=0, amax_out=None, tile_scale=0, kpe_cache=None, kv_rope_tail=0):
    return _kv_alloc(latent, Q, C, R, return_k_nope, return_k_pe)


_register("mla_kv_cache", _kv_impl, _kv_fake)
_register("mla_kv_cache_out", _kv_out, _nothing)


def _kv_lean(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, error_count, eps_q,
             eps_kv, style, *rest, **kw):  # rest, kw: mla_kv_cache's after style
    return _kv_impl(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, error_count,
                    *_ranks_of(latent, w_q, w_kv), eps_q, eps_kv, style, *rest, **kw)


def _kv_lean_fake(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, error_count,
                  eps_q, eps_kv, style, return_k_nope=False, return_k_pe=False, *rest, **kw):
    return _kv_alloc(latent, *_ranks_of(latent, w_q, w_kv), return_k_nope, return_k_pe)


def _kv_lean_out(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, error_count, q,
                 k_nope, k_pe, eps_q, eps_kv, style, *rest, **kw):
    _kv_out(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, error_count, q,
            k_nope, k_pe, *_ranks_of(latent, w_q, w_kv), eps_q, eps_kv, style, *rest, **kw)


_register("mla_kv_cache_lean", _kv_lean, _kv_lean_fake)
_register("mla_kv_cache_lean_out", _kv_lean_out, _nothing)


# ---- the DSA indexer (docs/dsa.md) ---------------------------------------------------------
# The indexer's settings (mlafuse.indexer_params) as plain arguments: index_style (the indexer's
# RoPE, 0 interleaved / 1 neox), hadamard, ln_eps, amax_eps, index_scale (0 ue8m0 / 1 f32).
def _indexer_params(index_style, hadamard, ln_eps, amax_eps, index_scale):
    return L.IndexerParams(_core._enum_arg(index_style, "index_style"), int(bool(hadamard)),
                           float(ln_eps), float(amax_eps),
                           _core._enum_arg(index_scale, "index_scale"))


def _kv_dsa_out(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, error_count,
                index_k, index_weight, index_bias, index_cache, topk_fill, q, k_nope, k_pe,
                index_out, Q, C, R, eps_q, eps_kv, style, index_style, hadamard, ln_eps,
                amax_eps, index_scale, index_copies=1, index_copy_stride=0, cache_format=0,
                scale=None, fp8_conv=0, amax_out=None, tile_scale=0, kpe_cache=None):
    d = latent.device
    _core.run_mla_kv_cache_dsa(
        _context(d), _indexer_params(index_style, hadamard, ln_eps, amax_eps, index_scale),
        Q, C, R, eps_q, eps_kv, style, _view(latent, "latent", d), _view(w_q, "w_q", d),
        _view(w_kv, "w_kv", d), _view(positions, "positions", d), _view(cos_sin, "cos_sin", d),
        _view(slot_mapping, "slot_mapping", d), _view(kv_cache, "kv_cache", d),
        _view(q, "q", d), _view(k_nope, "k_nope", d), _view(k_pe, "k_pe", d),
        _view(error_count, "error_count", d), _view(index_k, "index_k", d),
        _view(index_weight, "index_weight", d), _view(index_bias, "index_bias", d),
        _view(index_cache, "index_cache", d), _view(index_out, "index_out", d),
        _view(topk_fill, "topk_fill", d), index_copies=_core._enum_arg(index_copies, "index_copies"),
        index_copy_stride=index_copy_stride, cache_format=cache_format,
        scale=_view(scale, "scale", d), fp8_conv=fp8_conv, amax_out=_view(amax_out, "amax_out", d),
        tile_scale=tile_scale, kpe_cache=_view(kpe_cache, "kpe_cache", d))


def _kv_dsa_alloc(latent, Q, C, R, return_k_nope, return_k_pe, return_index_out):
    T = _T(latent)
    return (*_kv_alloc(latent, Q, C, R, return_k_nope, return_k_pe),
            latent.new_empty((T, 128 if return_index_out else 0)))


def _kv_dsa_impl(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, error_count,
                 index_k, index_weight, index_bias, index_cache, topk_fill, Q, C, R, eps_q,
                 eps_kv, style, index_style, hadamard, ln_eps, amax_eps, index_scale,
                 return_k_nope=False, return_k_pe=False, return_index_out=False,
                 index_copies=1, index_copy_stride=0, cache_format=0, scale=None, fp8_conv=0,
                 amax_out=None, tile_scale=0, kpe_cache=None):
    q, k_nope, k_pe, index_out = _kv_dsa_alloc(latent, Q, C, R, return_k_nope, return_k_pe,
                                               return_index_out)
    _kv_dsa_out(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, error_count,
                index_k, index_weight, index_bias, index_cache, topk_fill,
                q if Q > 0 else None, k_nope if return_k_nope else None,
                k_pe if return_k_pe else None, index_out if return_index_out else None, Q, C, R,
                eps_q, eps_kv, style, index_style, hadamard, ln_eps, amax_eps, index_scale,
                index_copies, index_copy_stride, cache_format, scale, fp8_conv, amax_out,
                tile_scale, kpe_cache)
    return q, k_nope, k_pe, index_out


def _kv_dsa_fake(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, error_count,
                 index_k, index_weight, index_bias, index_cache, topk_fill, Q, C, R, eps_q,
                 eps_kv, style, index_style, hadamard, ln_eps, amax_eps, index_scale,
                 return_k_nope=False, return_k_pe=False, return_index_out=False,
                 index_copies=1, index_copy_stride=0, cache_format=0, scale=None, fp8_conv=0,
                 amax_out=None, tile_scale=0, kpe_cache=None):
    return _kv_dsa_alloc(latent, Q, C, R, return_k_nope, return_k_pe, return_index_out)


_register("mla_kv_cache_dsa", _kv_dsa_impl, _kv_dsa_fake)
_register("mla_kv_cache_dsa_out", _kv_dsa_out, _nothing)


# indexer_q: q_pe (the MLA query, optional) is roped in place on its last 64 columns in
# q_pe_style; q_fp8 [T, H, 128] float8_e4m3fn (the _out form takes uint8 too), w_out [T, H] f32.
def _idx_q_out(q_idx, positions, cos_sin, weights, q_fp8, w_out, index_style, hadamard, ln_eps,
               amax_eps, index_scale, q_pe=None, q_pe_style=0, error_count=None):
    d = q_idx.device
    _core.run_indexer_q(_context(d), _indexer_params(index_style, hadamard, ln_eps, amax_eps,
                                                     index_scale),
                        _view(q_idx, "q_idx", d), _view(positions, "positions", d),
                        _view(cos_sin, "cos_sin", d), _view(weights, "weights", d),
                        _view(q_fp8, "q_fp8", d), _view(w_out, "w_out", d),
                        q_pe=_view(q_pe, "q_pe", d),
                        q_pe_style=_core._enum_arg(q_pe_style, "q_pe_style"),
                        error_count=_view(error_count, "error_count", d))


def _idx_q_alloc(q_idx):
    T = q_idx.shape[0] if q_idx.dim() >= 1 else 0
    H = q_idx.shape[1] if q_idx.dim() >= 2 else 0
    return (q_idx.new_empty((T, H, 128), dtype=torch.float8_e4m3fn),
            q_idx.new_empty((T, H), dtype=torch.float32))


def _idx_q_impl(q_idx, positions, cos_sin, weights, index_style, hadamard, ln_eps, amax_eps,
                index_scale, q_pe=None, q_pe_style=0, error_count=None):
    q_fp8, w_out = _idx_q_alloc(q_idx)
    _idx_q_out(q_idx, positions, cos_sin, weights, q_fp8, w_out, index_style, hadamard, ln_eps,
               amax_eps, index_scale, q_pe, q_pe_style, error_count)
    return q_fp8, w_out


def _idx_q_fake(q_idx, positions, cos_sin, weights, index_style, hadamard, ln_eps, amax_eps,
                index_scale, q_pe=None, q_pe_style=0, error_count=None):
    return _idx_q_alloc(q_idx)


_register("indexer_q", _idx_q_impl, _idx_q_fake)
_register("indexer_q_out", _idx_q_out, _nothing)


# ---- rope_q --------------------------------------------------------------------------------
# head_norm (docs/mla.md): DeepSeek-V4's weightless per-head RMSNorm first (head_norm_eps 0: 1e-6);
# q_out [T, Hpad, D]: the result out of place, heads past q's written as zeros (q only read).
def _rope_q(q, positions, cos_sin, R, style, error_count=None, head_norm=False,
            head_norm_eps=0.0, q_out=None):
    d = q.device
    _core.run_rope_q(_context(d), R, style, _view(q, "q", d), _view(positions, "positions", d),
                     _view(cos_sin, "cos_sin", d), _view(error_count, "error_count", d),
                     head_norm, head_norm_eps, _view(q_out, "q_out", d))


_register("rope_q", _rope_q, _nothing)


# ---- moe_gate ------------------------------------------------------------------------------
def _gate_out(logits, bias, weights, ids, scores, top_k, n_group, topk_group, score_func,
              group_score, renormalize, routed_scaling_factor, apply_routed_scaling, eps,
              n_shared_experts):
    d = logits.device
    p = _core.moe_params(top_k, n_group, topk_group, score_func, group_score, renormalize,
                         routed_scaling_factor, apply_routed_scaling, eps, n_shared_experts)
    _core.run_moe_gate(_context(d), p, _view(logits, "logits", d), _view(bias, "bias", d),
                       _view(weights, "weights", d), _view(ids, "ids", d),
                       _view(scores, "scores", d))


def _gate_alloc(logits, top_k, n_shared_experts, return_scores, weights_dtype):
    T = _T(logits)
    E = logits.shape[1] if logits.dim() >= 2 else 0
    K = max(top_k + n_shared_experts, 0)
    return (logits.new_empty((T, K), dtype=weights_dtype or torch.float32),
            logits.new_empty((T, K), dtype=torch.int32),
            logits.new_empty((T, E if return_scores else 0), dtype=torch.float32))


def _gate_impl(logits, bias, top_k, n_group, topk_group, score_func, group_score, renormalize,
               routed_scaling_factor, apply_routed_scaling, eps, n_shared_experts,
               return_scores=False, weights_dtype=None):
    w, i, s = _gate_alloc(logits, top_k, n_shared_experts, return_scores, weights_dtype)
    _gate_out(logits, bias, w, i, s if return_scores else None, top_k, n_group, topk_group,
              score_func, group_score, renormalize, routed_scaling_factor, apply_routed_scaling,
              eps, n_shared_experts)
    return w, i, s


def _gate_fake(logits, bias, top_k, n_group, topk_group, score_func, group_score, renormalize,
               routed_scaling_factor, apply_routed_scaling, eps, n_shared_experts,
               return_scores=False, weights_dtype=None):
    return _gate_alloc(logits, top_k, n_shared_experts, return_scores, weights_dtype)


_register("moe_gate", _gate_impl, _gate_fake)
_register("moe_gate_out", _gate_out, _nothing)


# ---- moe_gate_hash -------------------------------------------------------------------------
def _gate_hash_out(logits, tid2eid, token_ids, weights, ids, scores, error_count, top_k, n_group,
                   topk_group, score_func, group_score, renormalize, routed_scaling_factor,
                   apply_routed_scaling, eps, n_shared_experts):
    d = logits.device
    p = _core.moe_params(top_k, n_group, topk_group, score_func, group_score, renormalize,
                         routed_scaling_factor, apply_routed_scaling, eps, n_shared_experts)
    _core.run_moe_gate_hash(_context(d), p, _view(logits, "logits", d),
                            _view(tid2eid, "tid2eid", d), _view(token_ids, "token_ids", d),
                            _view(weights, "weights", d), _view(ids, "ids", d),
                            _view(scores, "scores", d), _view(error_count, "error_count", d))


def _gate_hash_impl(logits, tid2eid, token_ids, error_count, top_k, n_group, topk_group,
                    score_func, group_score, renormalize, routed_scaling_factor,
                    apply_routed_scaling, eps, n_shared_experts, return_scores=False,
                    weights_dtype=None):
    w, i, s = _gate_alloc(logits, top_k, n_shared_experts, return_scores, weights_dtype)
    _gate_hash_out(logits, tid2eid, token_ids, w, i, s if return_scores else None, error_count,
                   top_k, n_group, topk_group, score_func, group_score, renormalize,
                   routed_scaling_factor, apply_routed_scaling, eps, n_shared_experts)
    return w, i, s


def _gate_hash_fake(logits, tid2eid, token_ids, error_count, top_k, n_group, topk_group,
                    score_func, group_score, renormalize, routed_scaling_factor,
                    apply_routed_scaling, eps, n_shared_experts, return_scores=False,
                    weights_dtype=None):
    return _gate_alloc(logits, top_k, n_shared_experts, return_scores, weights_dtype)


_register("moe_gate_hash", _gate_hash_impl, _gate_hash_fake)
_register("moe_gate_hash_out", _gate_hash_out, _nothing)


# ---- rms_norm_quant (docs/gemm_formats.md) -------------------------------------------------
# q_format / q_scale are the library's mlaf_gemm_format / mlaf_gemm_scale values. The scales
# travel in the orientation engines hold them, [T, groups]; for the MN-major layouts (strides
# (1, ld)) the kernels hand the library their transposes, [groups, T] with stride (ld, 1).
_GF = L.GEMM_FORMATS
_RNQ_MN = (_GF["fp8_1x128_mn"], _GF["fp8_1x128_ue8m0"], _GF["fp8_1x128_cm"])


def rnq_scales_layout(q_format, T, K):
    """The scales tensor rms_norm_quant allocates for T rows of K values in format q_format:
    (dtype, shape, strides or None for a contiguous tensor), or None when the format has no
    scales for that K (then the library names the problem). The compiled binding's kernel
    (csrc/mlafuse_torch_norm.cpp) allocates the same, so eager and traced calls agree."""
    f = int(q_format)
    g = 32 if f == _GF["mxfp8"] else 128
    if f <= 0 or f not in _GF.values() or K % g != 0:
        return None
    G = K // g
    if f == _GF["fp8_1x128"]:
        return torch.float32, (T, G), None
    if f == _GF["mxfp8"]:
        return torch.uint8, (T, G), None
    if f == _GF["fp8_1x128_cm"]:
        return torch.float32, (T, G), (1, T)             # ld = T: no padding
    ld = (T + 3) // 4 * 4                                 # TMA: 16-byte columns
    if f == _GF["fp8_1x128_ue8m0"]:
        return torch.int32, (T, (G + 3) // 4), (1, ld)   # four UE8M0 bytes an element
    return torch.float32, (T, G), (1, ld)


def rnq_alloc_scales(x, T, K, q_format):
    lay = rnq_scales_layout(q_format, T, K)
    if lay is None:
        return x.new_empty((T, 0), dtype=torch.float32)
    dt, shape, strides = lay
    if strides is None:
        return x.new_empty(shape, dtype=dt)
    return torch.empty_strided(shape, strides, dtype=dt, device=x.device)


def _rnq_alloc(x, return_y, q_format):
    T = _T(x)
    K = x.shape[1] if x.dim() >= 2 else 0
    q = int(q_format) != 0
    return (x.new_empty((T, K if return_y else 0)),
            x.new_empty((T, K if q else 0), dtype=torch.float8_e4m3fn),
            rnq_alloc_scales(x, T, K, q_format) if q else x.new_empty((T, 0), dtype=torch.float32))


def _rnq_run(x, weight, eps, residual, y, q_data, q_scales, q_format, q_scale, q_eps):
    d = x.device
    f = _core._enum_arg(q_format, "q.format")
    lib_scales = q_scales
    if q_scales is not None and f in _RNQ_MN and q_scales.dim() == 2:
        lib_scales = q_scales.t()
    _core.run_rms_norm_quant(_context(d), eps, _view(x, "x", d), _view(residual, "residual", d),
                             _view(weight, "weight", d), _view(y, "y", d), f, q_scale,
                             _view(q_data, "q.data", d), _view(lib_scales, "q.scales", d), q_eps)


def _rnq_impl(x, weight, eps, residual=None, return_y=True, q_format=0, q_scale=0, q_eps=0.0):
    y, q, s = _rnq_alloc(x, return_y, q_format)
    quant = int(q_format) != 0
    _rnq_run(x, weight, eps, residual, y if return_y else None, q if quant else None,
             s if quant else None, q_format, q_scale, q_eps)
    return y, q, s


def _rnq_fake(x, weight, eps, residual=None, return_y=True, q_format=0, q_scale=0, q_eps=0.0):
    return _rnq_alloc(x, return_y, q_format)


def _rnq_out(x, weight, eps, residual, y, q_data, q_scales, q_format=0, q_scale=0, q_eps=0.0):
    _rnq_run(x, weight, eps, residual, y, q_data, q_scales, q_format, q_scale, q_eps)


def _rnq_inplace(x, weight, eps, residual, q_data, q_scales, q_format=0, q_scale=0, q_eps=0.0):
    _rnq_run(x, weight, eps, residual, x, q_data, q_scales, q_format, q_scale, q_eps)


_register("rms_norm_quant", _rnq_impl, _rnq_fake)
_register("rms_norm_quant_out", _rnq_out, _nothing)
_register("rms_norm_quant_inplace", _rnq_inplace, _nothing)

# The row ops' quantized forms (split_qk_norm_quant, mla_kv_cache_quant, mla_kv_cache_dsa_quant
# and their _out forms) register themselves from their own module.
from . import _torch_ops_rowq  # noqa: E402,F401


# ---- gemm_quant (docs/gemm_formats.md) ---------------------------------------------------------
# q_scales in the orientation engines hold them, allocated and transposed for the library as
# rms_norm_quant's are (rnq_scales_layout, _RNQ_MN above): the same layouts, the same strides.
def gemm_quant_alloc(x, q_format):
    """The outputs gemm_quant allocates for x: q_data [T, K] float8_e4m3fn and the format's scales
    (the fake implementation uses it too)."""
    T = _T(x)
    K = x.shape[1] if x.dim() >= 2 else 0
    return x.new_empty((T, K), dtype=torch.float8_e4m3fn), rnq_alloc_scales(x, T, K, q_format)


def _gq_lib_scales(q_scales, q_format):
    """The library's view of engine-layout scales: the transpose for the MN-major formats."""
    return q_scales.t() if int(q_format) in _RNQ_MN and q_scales.dim() == 2 else q_scales


def _gq_out(x, q_data, q_scales, q_format, q_scale, q_eps=0.0):
    d = x.device
    lib = _gq_lib_scales(q_scales, q_format) if q_scales is not None else None
    _core.run_gemm_quant(_context(d), _view(x, "x", d), q_format, q_scale, _view(q_data, "q.data", d),
                         _view(lib, "q.scales", d), q_eps)


def _gq_impl(x, q_format, q_scale, q_eps=0.0):
    q_data, q_scales = gemm_quant_alloc(x, q_format)
    _gq_out(x, q_data, q_scales, q_format, q_scale, q_eps)
    return q_data, q_scales


def _gq_fake(x, q_format, q_scale, q_eps=0.0):
    return gemm_quant_alloc(x, q_format)


_register("gemm_quant", _gq_impl, _gq_fake)
_register("gemm_quant_out", _gq_out, _nothing)


# ---- choosing and registering a binding ----------------------------------------------------
_PKG_DIR = os.path.dirname(os.path.abspath(__file__))


def find_extension() -> str | None:
    """Path of the compiled torch extension: $MLAFUSE_TORCH_EXT, else the one built into
    mlafuse/lib/ (torch_ops*.so); None when there is none."""
    env = os.environ.get("MLAFUSE_TORCH_EXT")
    if env:
        return env
    found = sorted(glob.glob(os.path.join(_PKG_DIR, "lib", "torch_ops*.so")))
    return found[0] if found else None


_ext_kernels_registered = False  # set once the extension's static registrations have run


def _load_extension(path: str):
    """Loads the extension (its static registrations implement the ops for CPU and CUDA) and
    binds it to the library the ctypes binding loaded. Raises ImportError saying why not."""
    global _ext_kernels_registered
    info_path = os.path.join(os.path.dirname(path), "torch_ops.json")
    if os.path.exists(info_path) and not os.environ.get("MLAFUSE_TORCH_EXT"):
        with open(info_path) as f:
            built_for = json.load(f).get("torch")
        if built_for != torch.__version__:
            raise ImportError(f"{path} was built against torch {built_for}, this is torch "
                              f"{torch.__version__}: reinstall mlafuse (pip install "
                              "--no-build-isolation ./python) to rebuild it")
    try:
        torch.ops.load_library(path)
        _ext_kernels_registered = True
        handle = ctypes.CDLL(path)
    except OSError as e:
        raise ImportError(f"cannot load the torch extension {path}: {e}") from None
    init = handle.mlafuse_torch_init
    init.restype = ctypes.c_int
    init.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    err = ctypes.create_string_buffer(1024)
    if init(L.library_path.encode(), err, len(err)) != 0:
        raise ImportError(f"torch extension {path}: {err.value.decode(errors='replace')}")
    set_threads = handle.mlafuse_torch_set_cpu_threads
    set_threads.restype = None
    set_threads.argtypes = [ctypes.c_int]
    set_threads(_core._cpu_threads)
    _core.ext_set_threads = set_threads
    set_pdl = handle.mlafuse_torch_set_cuda_pdl
    set_pdl.restype = None
    set_pdl.argtypes = [ctypes.c_int]
    set_pdl(_core._cuda_pdl)
    _core.ext_set_cuda_pdl = set_pdl
    return handle


def _select():
    want = os.environ.get("MLAFUSE_BINDING", "auto").strip().lower() or "auto"
    if want not in ("auto", "ext", "ctypes"):
        raise ImportError(f"MLAFUSE_BINDING = {want!r}, expected auto, ext or ctypes")
    if want == "ctypes":
        return "ctypes", "MLAFUSE_BINDING=ctypes"
    path = find_extension()
    if path is None:
        if want == "ext":
            raise ImportError("MLAFUSE_BINDING=ext, but there is no compiled torch extension "
                              f"(mlafuse/lib/torch_ops*.so in {_PKG_DIR}, or "
                              "$MLAFUSE_TORCH_EXT): install with `pip install "
                              "--no-build-isolation ./python` where torch is installed")
        return "ctypes", "no compiled torch extension was built"
    try:
        _load_extension(path)
    except ImportError as e:
        if want == "ext" or _ext_kernels_registered:
            raise  # asked for, or its kernels are registered: the ctypes ones cannot be now
        warnings.warn(f"mlafuse: {e}; using the ctypes binding", RuntimeWarning, stacklevel=3)
        return "ctypes", str(e)
    return "ext", path


def _define(binding: str):
    """The library from the one table, the fake implementations, and the ctypes kernels when
    they serve the ops (the extension's are registered by loading it)."""
    lib = torch.library.Library("mlafuse", "DEF")
    for name, schema in SCHEMAS.items():
        impl, fake = _IMPLS[name]
        try:
            lib.define(schema)
        except RuntimeError as e:  # e.g. an extension kernel whose signature disagrees
            raise ImportError(f"mlafuse: cannot define torch.ops.mlafuse.{name} ({binding} "
                              f"binding): {e}") from None
        if binding == "ctypes":
            lib.impl(name, impl, "CPU")
            lib.impl(name, impl, "CUDA")
        torch.library.register_fake("mlafuse::" + name, fake, lib=lib)
    return lib


assert set(_IMPLS) == set(SCHEMAS), "every op of the table has its implementations here"
BINDING, BINDING_DETAIL = _select()
_lib = _define(BINDING)  # kept alive: the ops live as long as this Library object
