"""The DSA lightning indexer (docs/dsa.md; DeepSeek-V3.2, GLM-5): mla_kv_cache with the indexer key
branch, and indexer_q.

numpy arrays run on the CPU backend through ctypes; torch tensors go through the custom ops
torch.ops.mlafuse.mla_kv_cache_dsa / mla_kv_cache_dsa_out / indexer_q / indexer_q_out (on their
device's backend, CUDA on torch's current stream; traceable by torch.compile, see _torch_ops).

    ip = mlafuse.indexer_params(config="deepseek-v3.2")          # once per layer
    q, k_nope, k_pe, index_out = mlafuse.mla_kv_cache_dsa(
        latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache,
        index_k, index_weight, index_bias, index_cache, indexer=ip)
    q_fp8, w_out = mlafuse.indexer_q(q_idx, positions, cos_sin, weights, indexer=ip)
"""
from __future__ import annotations

from . import _core
from . import _lib as L
from . import ops as _ops
from ._lib import MlafError
from ._ops_mla_kv_cache import _PLAIN, _cache_args
from . import _ops_row_quant as _rq
from .ops import (_STYLES, _check_same_kind, _dim, _enum, _is_torch, _np_in, _np_out, _outs,
                  _ranks, _torch_error, find_preset)

if _ops._torch is not None:
    # The ops, looked up once: the torch paths below call them directly (see _op_pair).
    from ._ops_common import _is_compiling, _op_pair

    _op_dsa, _dsa_eager = _op_pair("mla_kv_cache_dsa")
    _op_dsa_out, _dsa_out_eager = _op_pair("mla_kv_cache_dsa_out")
    _op_dsa_q, _dsa_q_eager = _op_pair("mla_kv_cache_dsa_quant")
    _op_dsa_q_out, _dsa_q_out_eager = _op_pair("mla_kv_cache_dsa_quant_out")
    _op_idx_q, _idx_q_eager = _op_pair("indexer_q")
    _op_idx_q_out, _idx_q_out_eager = _op_pair("indexer_q_out")

_SCALES = {"ue8m0": L.INDEX_SCALE_UE8M0, "f32": L.INDEX_SCALE_F32}


class _IndexerParams(L.IndexerParams):
    """L.IndexerParams that also holds its values as the custom ops' arguments (``op_args``,
    kept current on every field assignment): torch.compile cannot read ctypes fields, but it
    reads (and guards on) this plain tuple."""

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        self.__dict__["op_args"] = (int(self.style), bool(self.hadamard), float(self.ln_eps),
                                    float(self.amax_eps), int(self.scale))


def indexer_params(style=None, *, hadamard: bool = False, ln_eps: float = 1e-6,
                   amax_eps: float = 1e-4, scale="ue8m0", config=None) -> L.IndexerParams:
    """One indexer's settings, shared by its key (mla_kv_cache_dsa) and query (indexer_q) sides.

    style     "neox" (DeepSeek-V3.2) or "interleaved" (GLM-5): the RoPE of dims [0, 64); default
              the preset's (``config``: a preset name or Preset), else "neox"
    hadamard  rotate by H_128 * 128^-0.5 after RoPE, on both sides (DeepSeek's reference); off in
              vLLM's and SGLang's fused paths
    ln_eps    the key LayerNorm's eps
    amax_eps  the floor of every amax before the scale
    scale     "ue8m0" (2^ceil(log2(max(amax, amax_eps) / 448)), vLLM / DeepSeek) or "f32"
              (max(amax, amax_eps) / 448, SGLang's key cache)
    """
    if style is None:
        p = find_preset(config) if isinstance(config, str) else config
        has = p is not None and getattr(p, "index_n_heads", 0) > 0
        style = p.index_rope_style if has else "neox"
    return _IndexerParams(_enum(style, _STYLES, "style"), int(bool(hadamard)), float(ln_eps),
                          float(amax_eps), _enum(scale, _SCALES, "scale"))


def _views(items):
    """numpy views of (name, array, writable)."""
    return [(_np_out(a, n) if w else _np_in(a, n)) for n, a, w in items]


def _ip_args(ip) -> tuple:
    """The custom ops' indexer arguments (index_style, hadamard, ln_eps, amax_eps, index_scale).
    Under torch.compile ip must come from indexer_params() (a bare L.IndexerParams is read
    through its ctypes fields, which only eager calls can)."""
    if isinstance(ip, _IndexerParams):
        return ip.op_args
    if not isinstance(ip, L.IndexerParams):
        raise TypeError(f"indexer is a {type(ip).__name__}, expected mlafuse.indexer_params(...)")
    return int(ip.style), bool(ip.hadamard), float(ip.ln_eps), float(ip.amax_eps), int(ip.scale)


def mla_kv_cache_dsa(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, index_k,
                     index_weight, index_bias, index_cache, *, indexer=None, index_out=None,
                     return_index_out: bool = False, topk_fill=None, index_copies: int = 1,
                     index_copy_stride: int = 0, eps_q: float = 1e-5,
                     eps_kv: float = 1e-5, style="interleaved", q_lora_rank: int | None = None,
                     kv_lora_rank: int | None = None, rope_dim: int | None = None, q=None,
                     k_nope=None, k_pe=None, out=None, return_k_nope: bool = False,
                     return_k_pe: bool = False, error_count=None, cache_format="auto",
                     k_scale=None, quant_scale=None, amax_out=None, tile_scale=None,
                     kpe_cache=None, **quant):
    """mla_kv_cache (every argument as there, kv_cache a tensor or a KVCache) plus the DSA
    indexer key branch of every token, in one pass (one launch on CUDA).

    index_k       [T, 128]   latent's dtype, rows strided (e.g. kw[:, :128] of the [T, 128 + H]
                             GEMM output)
    index_weight, index_bias [128]  LayerNorm weight and bias, f32 or latent's dtype (both alike)
    index_cache   [num_blocks, >= 132 * block_size] uint8 | float8_e4m3fn, MUTATED: block-planar,
                  token at offset o of block b: 128 e4m3 bytes at b * stride + 128 o, its f32
                  scale at b * stride + 128 * block_size + 4 o (block_size and num_blocks are
                  kv_cache's; the block stride may be any value, odd too)
    indexer       indexer_params(...) (default: neox, no Hadamard, ue8m0)
    index_out     [T, 128] optional output: the vector quantized (latent's dtype); may be index_k
                  itself (context-parallel in place); return_index_out allocates one
    topk_fill     [T, K] int32, optional, MUTATED: filled with -1
    index_copies, index_copy_stride  the multi-destination store (docs/mla.md): the same index
                  records also into copies 1 .. n-1 at index_cache's address + k * stride bytes
                  (e.g. context-parallel peers' caches); stride >= the bytes one cache spans

    Returns ``(q, k_nope, k_pe, index_out)`` (None where not requested). Given outputs (by
    name, or ``out=(q, k_nope, k_pe, index_out)`` with None for one not given) are mutated and
    returned; one of the wrong shape or dtype raises MlafError naming it, nothing written.

    Quantized q_norm / k_nope (``return_q=``, ``q_format=``, ..., ``k_nope_format=``, ...): as
    mla_kv_cache's; with a format named the call returns ``(q, k_nope, k_pe, index_out, q_data,
    q_scales, k_nope_data, k_nope_scales)`` and ``out=`` takes those eight. The quantized
    tensors share no byte with the index cache (nor its copies).
    """
    args = qname = kname = None
    return_q = True
    if quant:
        kw = _rq.keywords("mla_kv_cache_dsa", quant, ("return_k_nope",))
        return_q = kw["return_q"]
        args, qname, kname = _rq.resolve(kw["q_format"], kw["q_scale"], kw["q_eps"],
                                         kw["k_nope_format"], kw["k_nope_scale"],
                                         kw["k_nope_eps"])
        quant = tuple(kw[k] for k in _rq.QUANT_OUTS)
    else:
        quant = (None,) * 4
    if out is not None:
        (q, k_nope, k_pe, index_out), quant = _rq.outs(out, ("q", "k_nope", "k_pe", "index_out"),
                                                       (q, k_nope, k_pe, index_out), quant,
                                                       "mla_kv_cache_dsa")
        if args is None and any(t is not None for t in quant):  # out= of 8, no format named
            args, qname, kname = _rq.resolve("none", None, 0.0, "none", None, 0.0)
    Q, C, R = _ranks(latent, w_q, w_kv, q_lora_rank, kv_lora_rank, rope_dim)
    mla_style = _enum(style, _STYLES, "style")
    ip = indexer if indexer is not None else indexer_params()
    torch_path = _is_torch(latent)
    kv_cache, fmt = _cache_args(kv_cache, cache_format, k_scale, quant_scale, amax_out,
                                tile_scale, kpe_cache, "mla_kv_cache_dsa", torch_path)
    _check_same_kind(torch_path, w_q=w_q, w_kv=w_kv, positions=positions, cos_sin=cos_sin,
                     slot_mapping=slot_mapping, kv_cache=kv_cache, index_k=index_k,
                     index_weight=index_weight, index_bias=index_bias, index_cache=index_cache,
                     index_out=index_out, topk_fill=topk_fill, q=q, k_nope=k_nope, k_pe=k_pe,
                     error_count=error_count, **dict(zip(_rq.QUANT_OUTS, quant)))
    T = _dim(latent, 0)
    if torch_path:
        # the op's trailing arguments: the copies, then the format's (the plain call's defaults)
        tail = (int(index_copies), int(index_copy_stride))
        if fmt is not None:
            tail += fmt
        fixed = (latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, error_count,
                 index_k, index_weight, index_bias, index_cache, topk_fill)
        params = (Q, C, R, eps_q, eps_kv, mla_style) + _ip_args(ip)
        eager = not _is_compiling()
        try:
            if args is not None:
                return _dsa_quant_torch(eager, fixed, params, tail, T, Q, C, R, q, k_nope, k_pe,
                                        index_out, quant, args, return_q, return_k_nope,
                                        return_k_pe, return_index_out)
            if q is None and k_nope is None and k_pe is None and index_out is None:
                q, k_nope, k_pe, index_out = (_dsa_eager if eager else _op_dsa)(
                    *fixed, *params, return_k_nope, return_k_pe, return_index_out, *tail)
                return (q if Q > 0 else None, k_nope if return_k_nope else None,
                        k_pe if return_k_pe else None,
                        index_out if return_index_out else None)
            if q is None and Q > 0:
                q = latent.new_empty((T, Q))
            if k_nope is None and return_k_nope:
                k_nope = latent.new_empty((T, C))
            if k_pe is None and return_k_pe:
                k_pe = latent.new_empty((T, max(R, 0)))
            if index_out is None and return_index_out:
                index_out = latent.new_empty((T, 128))
            (_dsa_out_eager if eager else _op_dsa_out)(*fixed, q, k_nope, k_pe, index_out,
                                                       *params, *tail)
            return q, k_nope, k_pe, index_out
        except RuntimeError as e:
            raise _torch_error(e, w_q=w_q, w_kv=w_kv, positions=positions, cos_sin=cos_sin,
                               slot_mapping=slot_mapping, kv_cache=kv_cache, q=q,
                               k_nope=k_nope, k_pe=k_pe, error_count=error_count,
                               index_k=index_k, index_weight=index_weight,
                               index_bias=index_bias, index_cache=index_cache,
                               index_out=index_out, topk_fill=topk_fill,
                               **dict(zip(_rq.QUANT_OUTS, quant))) from None
    np = _core._numpy()
    new = lambda shape: np.empty(shape, latent.dtype)  # noqa: E731
    if q is None and Q > 0 and return_q:
        q = new((T, Q))
    if k_nope is None and return_k_nope:
        k_nope = new((T, C))
    if k_pe is None and return_k_pe:
        k_pe = new((T, max(R, 0)))
    if index_out is None and return_index_out:
        index_out = new((T, 128))
    rq = None
    if args is not None:
        quant, rq = _rq.np_quant(args, qname, kname, T, Q, C, *quant)
    f, scale, conv, amax, tile, kpe = fmt if fmt is not None else _PLAIN
    v = _views([
        ("latent", latent, 0), ("w_q", w_q, 0), ("w_kv", w_kv, 0), ("positions", positions, 0),
        ("cos_sin", cos_sin, 0), ("slot_mapping", slot_mapping, 0), ("kv_cache", kv_cache, 1),
        ("q", q, 1), ("k_nope", k_nope, 1), ("k_pe", k_pe, 1), ("error_count", error_count, 1),
        ("index_k", index_k, 0), ("index_weight", index_weight, 0), ("index_bias", index_bias, 0),
        ("index_cache", index_cache, 1), ("index_out", index_out, 1), ("topk_fill", topk_fill, 1),
        ("scale", scale, 0), ("amax_out", amax, 1), ("kpe_cache", kpe, 1)])
    _core.run_mla_kv_cache_dsa(_core.context(L.BACKEND_CPU), ip, Q, C, R, eps_q, eps_kv, mla_style, *v[:17],
                               index_copies=index_copies, index_copy_stride=index_copy_stride, cache_format=f, scale=v[17], fp8_conv=conv, amax_out=v[18],
                               tile_scale=tile, kpe_cache=v[19], quant=rq)
    if args is None or not _rq.with_quant(args):
        return q, k_nope, k_pe, index_out
    return (q, k_nope, k_pe, index_out, *_rq.returned(args, *quant))


def _dsa_quant_torch(eager, fixed, params, tail, T, Q, C, R, q, k_nope, k_pe, index_out, quant,
                     args, return_q, return_k_nope, return_k_pe, return_index_out):
    """mla_kv_cache_dsa's torch path with quantized outputs (or the dense q left out): the
    mla_kv_cache_dsa_quant(_out) ops."""
    latent = fixed[0]
    if (q is None and k_nope is None and k_pe is None and index_out is None
            and all(t is None for t in quant)):
        res = (_dsa_q_eager if eager else _op_dsa_q)(
            *fixed, *params, *args, return_q, return_k_nope, return_k_pe, return_index_out,
            *tail)
        q, k_nope, k_pe = _rq.wanted(Q, *res[:3], return_q, return_k_nope, return_k_pe)
        index_out = res[3] if return_index_out else None
        quant = res[4:]
    else:
        q, k_nope, k_pe = _rq.torch_dense_outputs(latent, T, Q, C, R, q, k_nope, k_pe, return_q, return_k_nope,
                                                  return_k_pe)
        if index_out is None and return_index_out:
            index_out = latent.new_empty((T, 128))
        quant = _rq.torch_quant_outputs(latent, T, Q, C, args, *quant)
        (_dsa_q_out_eager if eager else _op_dsa_q_out)(*fixed, q, k_nope, k_pe, index_out,
                                                       *quant, *params, *args, *tail)
    if not _rq.with_quant(args):
        return q, k_nope, k_pe, index_out
    return (q, k_nope, k_pe, index_out, *_rq.returned(args, *quant))


def indexer_q(q_idx, positions, cos_sin, weights, *, indexer=None, q_fp8=None, w_out=None,
              out=None, q_pe=None, q_pe_style="interleaved", error_count=None):
    """The indexer's query side (docs/dsa.md): per (token, head) RoPE on dims [0, 64), the optional
    Hadamard, fp8 e4m3 with one scale s, and the folded head weight
    ((w * s) * 128^-0.5) * H^-0.5.

    q_idx     [T, H, 128]  f32 | f16 | bf16, strided
    weights   [T, H]       f32 or q_idx's dtype, rows strided (the last H columns of the
                           [T, 128 + H] GEMM output)
    q_fp8     [T, H, 128]  optional output (uint8 | float8_e4m3fn; allocated as uint8 for numpy,
                           float8_e4m3fn for torch)
    w_out     [T, H]       optional output, float32
    q_pe      [T, Hq, D]   optional, MUTATED: the MLA query, RoPE in place on its last 64
                           columns in q_pe_style (as rope_q), in the same launch
    Returns ``(q_fp8, w_out)``; outputs given (by name or as ``out=(q_fp8, w_out)``) are
    mutated and returned, one of the wrong shape or dtype raises MlafError naming it.
    """
    if out is not None:
        q_fp8, w_out = _outs(out, ("q_fp8", "w_out"), (q_fp8, w_out), "indexer_q")
    ip = indexer if indexer is not None else indexer_params()
    torch_path = _is_torch(q_idx)
    _check_same_kind(torch_path, positions=positions, cos_sin=cos_sin, weights=weights, q_fp8=q_fp8,
                     w_out=w_out, q_pe=q_pe, error_count=error_count)
    pe_style = _enum(q_pe_style, _STYLES, "q_pe_style")
    T, H = _dim(q_idx, 0), _dim(q_idx, 1)
    if torch_path:
        idx = _ip_args(ip)
        eager = not _is_compiling()
        try:
            if q_fp8 is None and w_out is None:
                return (_idx_q_eager if eager else _op_idx_q)(q_idx, positions, cos_sin, weights,
                                                             *idx, q_pe, pe_style, error_count)
            if q_fp8 is None:
                q_fp8 = q_idx.new_empty((T, H, 128), dtype=_ops._torch.float8_e4m3fn)
            if w_out is None:
                w_out = q_idx.new_empty((T, H), dtype=_ops._torch.float32)
            (_idx_q_out_eager if eager else _op_idx_q_out)(q_idx, positions, cos_sin, weights,
                                                           q_fp8, w_out, *idx, q_pe, pe_style,
                                                           error_count)
            return q_fp8, w_out
        except RuntimeError as e:
            raise _torch_error(e, positions=positions, cos_sin=cos_sin, weights=weights,
                               q_fp8=q_fp8, w_out=w_out, q_pe=q_pe,
                               error_count=error_count) from None
    np = _core._numpy()
    if q_fp8 is None:
        q_fp8 = np.empty((T, H, 128), np.uint8)
    if w_out is None:
        w_out = np.empty((T, H), np.float32)
    v = _views([
        ("q_idx", q_idx, 0), ("positions", positions, 0), ("cos_sin", cos_sin, 0), ("weights", weights, 0),
        ("q_fp8", q_fp8, 1), ("w_out", w_out, 1), ("q_pe", q_pe, 1), ("error_count", error_count, 1)])
    _core.run_indexer_q(_core.context(L.BACKEND_CPU), ip, *v[:6], q_pe=v[6],
                        q_pe_style=pe_style, error_count=v[7])
    return q_fp8, w_out


__all__ = ["indexer_params", "mla_kv_cache_dsa", "indexer_q", "MlafError"]
