"""The row ops' quantized forms in the ctypes binding: the kernels and fake implementations of
torch.ops.mlafuse.split_qk_norm_quant, mla_kv_cache_quant, mla_kv_cache_dsa_quant and their _out
forms (schemas: _schemas.py; the compiled binding's kernels: csrc/mlafuse_torch_rowq.cpp).
_torch_ops imports this module to add them to its table, before it defines the library.

q_norm [T, Q] and / or k_nope [T, C] are also written in a GEMM-input format
(docs/gemm_formats.md, the row ops): per output a format and rounding code and the amax floor,
the e4m3 data and the scales, which travel in the orientation engines hold ([T, groups]; the
MN-major layouts with strides (1, ld), handed to the library transposed, as rms_norm_quant's)."""
from __future__ import annotations

import torch

from . import _core
from ._torch_ops import (_RNQ_MN, _T, _context, _indexer_params, _nothing, _register, _view,
                         rnq_alloc_scales)


def _lib_scales(scales, fmt):
    """The scales as the library takes them: the MN-major layouts' [groups, T] transpose."""
    if scales is not None and int(fmt) in _RNQ_MN and scales.dim() == 2:
        return scales.t()
    return scales


def _row_quant(d, q_data, q_scales, k_nope_data, k_nope_scales, q_format, q_scale, q_eps,
               k_nope_format, k_nope_scale, k_nope_eps):
    return _core.row_quant(
        q_format, q_scale, q_eps, _view(q_data, "quant->q.data", d),
        _view(_lib_scales(q_scales, q_format), "quant->q.scales", d), k_nope_format,
        k_nope_scale, k_nope_eps, _view(k_nope_data, "quant->k_nope.data", d),
        _view(_lib_scales(k_nope_scales, k_nope_format), "quant->k_nope.scales", d))


def _one(like, T, K, fmt):
    """(data, scales) of one quantized output as the functional ops allocate them: [T, K]
    float8_e4m3fn and the format's scales, or [T, 0] for a format not named."""
    if int(fmt) == 0:
        return (like.new_empty((T, 0), dtype=torch.float8_e4m3fn),
                like.new_empty((T, 0), dtype=torch.float32))
    K = max(K, 0)
    return like.new_empty((T, K), dtype=torch.float8_e4m3fn), rnq_alloc_scales(like, T, K, fmt)


def _dense(like, T, Q, C, R, return_q, return_k_nope, return_k_pe):
    return (like.new_empty((T, max(Q, 0) if return_q else 0)),
            like.new_empty((T, max(C, 0) if return_k_nope else 0)),
            like.new_empty((T, max(R, 0) if return_k_pe else 0)))


def _alloc(latent, Q, C, R, qf, kf, return_q, return_k_nope, return_k_pe):
    T = _T(latent)
    return (*_dense(latent, T, Q, C, R, return_q, return_k_nope, return_k_pe),
            *_one(latent, T, Q, qf), *_one(latent, T, C, kf))


def _given(outs, Q, qf, kf, return_q, return_k_nope, return_k_pe):
    """The functional forms' allocations as the _out forms take them: None where not written."""
    q, k, pe, qd, qs, kd, ks = outs
    qq, kq = int(qf) != 0, int(kf) != 0
    return (q if return_q and Q > 0 else None, k if return_k_nope else None,
            pe if return_k_pe else None, qd if qq else None, qs if qq else None,
            kd if kq else None, ks if kq else None)


# ---- split_qk_norm -------------------------------------------------------------------------
def _split_q_out(latent, w_q, w_kv, q, k_nope, k_pe, q_data, q_scales, k_nope_data,
                 k_nope_scales, Q, C, R, eps_q, eps_kv, *rq):
    d = latent.device
    _core.run_split_qk_norm(_context(d), Q, C, R, eps_q, eps_kv, _view(latent, "latent", d),
                            _view(w_q, "w_q", d), _view(w_kv, "w_kv", d), _view(q, "q", d),
                            _view(k_nope, "k_nope", d), _view(k_pe, "k_pe", d),
                            quant=_row_quant(d, q_data, q_scales, k_nope_data, k_nope_scales, *rq))


def _split_q_fake(latent, w_q, w_kv, Q, C, R, eps_q, eps_kv, qf, qs, qe, kf, ks, ke,
                  return_q=True, return_k_nope=True, return_k_pe=True):
    return _alloc(latent, Q, C, R, qf, kf, return_q, return_k_nope, return_k_pe)


def _split_q_impl(latent, w_q, w_kv, Q, C, R, eps_q, eps_kv, qf, qs, qe, kf, ks, ke,
                  return_q=True, return_k_nope=True, return_k_pe=True):
    outs = _alloc(latent, Q, C, R, qf, kf, return_q, return_k_nope, return_k_pe)
    _split_q_out(latent, w_q, w_kv, *_given(outs, Q, qf, kf, return_q, return_k_nope,
                                            return_k_pe), Q, C, R, eps_q, eps_kv, qf, qs, qe,
                 kf, ks, ke)
    return outs


_register("split_qk_norm_quant", _split_q_impl, _split_q_fake)
_register("split_qk_norm_quant_out", _split_q_out, _nothing)


# ---- mla_kv_cache --------------------------------------------------------------------------
def _kv_q_out(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, error_count, q,
              k_nope, k_pe, q_data, q_scales, k_nope_data, k_nope_scales, Q, C, R, eps_q, eps_kv,
              style, qf, qs, qe, kf, ks, ke, cache_format=0, scale=None, fp8_conv=0,
              amax_out=None, tile_scale=0, kpe_cache=None, kv_rope_tail=0):
    d = latent.device
    _core.run_mla_kv_cache(
        _context(d), Q, C, R, eps_q, eps_kv, style, _view(latent, "latent", d),
        _view(w_q, "w_q", d), _view(w_kv, "w_kv", d), _view(positions, "positions", d),
        _view(cos_sin, "cos_sin", d), _view(slot_mapping, "slot_mapping", d),
        _view(kv_cache, "kv_cache", d), _view(q, "q", d), _view(k_nope, "k_nope", d),
        _view(k_pe, "k_pe", d), _view(error_count, "error_count", d), cache_format,
        _view(scale, "scale", d), fp8_conv, _view(amax_out, "amax_out", d), tile_scale,
        _view(kpe_cache, "kpe_cache", d), kv_rope_tail,
        quant=_row_quant(d, q_data, q_scales, k_nope_data, k_nope_scales, qf, qs, qe, kf, ks, ke))


def _kv_q_fake(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, error_count, Q, C,
               R, eps_q, eps_kv, style, qf, qs, qe, kf, ks, ke, return_q=True,
               return_k_nope=False, return_k_pe=False, *fmt, **kw):
    return _alloc(latent, Q, C, R, qf, kf, return_q, return_k_nope, return_k_pe)


def _kv_q_impl(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, error_count, Q, C,
               R, eps_q, eps_kv, style, qf, qs, qe, kf, ks, ke, return_q=True,
               return_k_nope=False, return_k_pe=False, *fmt, **kw):  # fmt, kw: the cache format
    outs = _alloc(latent, Q, C, R, qf, kf, return_q, return_k_nope, return_k_pe)
    _kv_q_out(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, error_count,
              *_given(outs, Q, qf, kf, return_q, return_k_nope, return_k_pe), Q, C, R, eps_q,
              eps_kv, style, qf, qs, qe, kf, ks, ke, *fmt, **kw)
    return outs


_register("mla_kv_cache_quant", _kv_q_impl, _kv_q_fake)
_register("mla_kv_cache_quant_out", _kv_q_out, _nothing)


# ---- mla_kv_cache_dsa (docs/dsa.md) --------------------------------------------------------
def _dsa_q_out(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, error_count,
               index_k, index_weight, index_bias, index_cache, topk_fill, q, k_nope, k_pe,
               index_out, q_data, q_scales, k_nope_data, k_nope_scales, Q, C, R, eps_q, eps_kv,
               style, index_style, hadamard, ln_eps, amax_eps, index_scale, qf, qs, qe, kf, ks,
               ke, index_copies=1, index_copy_stride=0, cache_format=0, scale=None, fp8_conv=0,
               amax_out=None, tile_scale=0, kpe_cache=None):
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
        _view(topk_fill, "topk_fill", d),
        index_copies=_core._enum_arg(index_copies, "index_copies"),
        index_copy_stride=index_copy_stride, cache_format=cache_format,
        scale=_view(scale, "scale", d), fp8_conv=fp8_conv, amax_out=_view(amax_out, "amax_out", d),
        tile_scale=tile_scale, kpe_cache=_view(kpe_cache, "kpe_cache", d),
        quant=_row_quant(d, q_data, q_scales, k_nope_data, k_nope_scales, qf, qs, qe, kf, ks, ke))


def _dsa_q_alloc(latent, Q, C, R, qf, kf, return_q, return_k_nope, return_k_pe,
                 return_index_out):
    T = _T(latent)
    q, k, pe, qd, qs, kd, ks = _alloc(latent, Q, C, R, qf, kf, return_q, return_k_nope,
                                      return_k_pe)
    return q, k, pe, latent.new_empty((T, 128 if return_index_out else 0)), qd, qs, kd, ks


def _dsa_q_fake(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, error_count,
                index_k, index_weight, index_bias, index_cache, topk_fill, Q, C, R, eps_q,
                eps_kv, style, index_style, hadamard, ln_eps, amax_eps, index_scale, qf, qs, qe,
                kf, ks, ke, return_q=True, return_k_nope=False, return_k_pe=False,
                return_index_out=False, *rest, **kw):
    return _dsa_q_alloc(latent, Q, C, R, qf, kf, return_q, return_k_nope, return_k_pe,
                        return_index_out)


def _dsa_q_impl(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, error_count,
                index_k, index_weight, index_bias, index_cache, topk_fill, Q, C, R, eps_q,
                eps_kv, style, index_style, hadamard, ln_eps, amax_eps, index_scale, qf, qs, qe,
                kf, ks, ke, return_q=True, return_k_nope=False, return_k_pe=False,
                return_index_out=False, *rest, **kw):  # rest, kw: the copies, the cache format
    outs = _dsa_q_alloc(latent, Q, C, R, qf, kf, return_q, return_k_nope, return_k_pe,
                        return_index_out)
    q, k, pe, io, qd, qsc, kd, ksc = outs
    q, k, pe, qd, qsc, kd, ksc = _given((q, k, pe, qd, qsc, kd, ksc), Q, qf, kf, return_q,
                                        return_k_nope, return_k_pe)
    _dsa_q_out(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, error_count,
               index_k, index_weight, index_bias, index_cache, topk_fill, q, k, pe,
               io if return_index_out else None, qd, qsc, kd, ksc, Q, C, R, eps_q, eps_kv, style,
               index_style, hadamard, ln_eps, amax_eps, index_scale, qf, qs, qe, kf, ks, ke,
               *rest, **kw)
    return outs


_register("mla_kv_cache_dsa_quant", _dsa_q_impl, _dsa_q_fake)
_register("mla_kv_cache_dsa_quant_out", _dsa_q_out, _nothing)
