"""The Python API of split_qk_norm: the latent row split into q, k_nope and k_pe with the two
RMSNorms. Re-exported by mlafuse.ops (see its docstring for the conventions every op follows)."""
from __future__ import annotations

from ._ops_common import (_torch, _core, L, _TT, _torch_error, _dim, _np_in, _np_out, _ranks,
                          _check_same_kind, _outs)
from . import _ops_row_quant as _rq

if _torch is not None:
    # The ops, looked up once: the torch paths below call them directly (see _op_pair).
    from ._ops_common import _is_compiling, _op_pair

    _op_split, _split_eager = _op_pair("split_qk_norm")
    _op_split_out, _split_out_eager = _op_pair("split_qk_norm_out")
    _op_split_inplace, _split_inplace_eager = _op_pair("split_qk_norm_inplace")
    _op_lean, _lean_eager = _op_pair("split_qk_norm_lean")
    _op_lean_out, _lean_out_eager = _op_pair("split_qk_norm_lean_out")
    _op_quant, _quant_eager = _op_pair("split_qk_norm_quant")
    _op_quant_out, _quant_out_eager = _op_pair("split_qk_norm_quant_out")

_OUTS = ("q", "k_nope", "k_pe")


# ---- split_qk_norm -------------------------------------------------------------------------
def split_qk_norm(latent, w_q, w_kv, *, eps_q: float = 1e-5, eps_kv: float = 1e-5,
                  q_lora_rank: int | None = None, kv_lora_rank: int | None = None,
                  rope_dim: int | None = None, q=None, k_nope=None, k_pe=None, out=None,
                  return_k_pe: bool = True, inplace: bool = False, **quant):
    """Split the fused q-a / kv-a projection output and RMS-normalize both parts (docs/mla.md, split_qk_norm).

    latent  [T, Q + C + R]  f32 | f16 | bf16; rows may be strided (a slice of a wider GEMM
                            output), elements inside a row contiguous. Not modified (unless
                            ``inplace``).
    w_q     [Q]             latent's dtype or f32; None when the model has no q LoRA (Q = 0)
    w_kv    [C]             latent's dtype or f32

    Q, C and R default to len(w_q), len(w_kv) and the rest of the latent row; pass
    q_lora_rank / kv_lora_rank / rope_dim to have them checked instead.

    Returns ``(q, k_nope, k_pe)``:
      q       [T, Q]  rmsnorm(latent[:, :Q]) * w_q, eps_q   (None when Q = 0)
      k_nope  [T, C]  rmsnorm(latent[:, Q:Q+C]) * w_kv, eps_kv
      k_pe    [T, R]  latent[:, Q+C:] copied bit-exactly (None when return_k_pe is False and
                      no k_pe is given)
    each in the latent's dtype. Outputs given as ``q=``, ``k_nope=``, ``k_pe=`` (or as
    ``out=(q, k_nope, k_pe)``, None for one not given) are written (mutated) and returned;
    missing ones are allocated. A given output of the wrong shape or dtype raises MlafError
    naming it, and nothing is written.

    ``inplace=True`` is the context-parallel form: the latent itself is mutated so each row
    becomes [q_norm | k_nope_norm | k_pe]; the returned outputs are views of it.

    Quantized outputs (docs/gemm_formats.md, the row ops; keywords, the defaults first):
      return_q=True, return_k_nope=True   False: no dense q_norm / k_nope (then None), only
                      beside its quantized copy
      q_format="none", q_scale=None, q_eps=0.0, q_data=None, q_scales=None
                      q_norm [T, Q] (q_b_proj's input) in a GEMM-input format, as
                      rms_norm_quant's keywords of these names
      k_nope_format="none", k_nope_scale=None, k_nope_eps=0.0, k_nope_data=None,
      k_nope_scales=None   the same for k_nope [T, C]
    Q, C multiples of the format's group. The bytes are those of the dense output followed by a
    per-token-group quantize pass. With a format named the call returns ``(q, k_nope, k_pe,
    q_data, q_scales, k_nope_data, k_nope_scales)`` (None for one not written) and ``out=``
    takes those seven. Not with ``inplace``.
    """
    if quant or (out is not None and not (isinstance(out, (tuple, list)) and len(out) == 3)):
        return _split_qk_norm_quant(
            latent, w_q, w_kv, eps_q, eps_kv, q_lora_rank, kv_lora_rank, rope_dim, q, k_nope,
            k_pe, out, return_k_pe, inplace, **_rq.keywords("split_qk_norm", quant))
    if out is not None:
        if type(out) is tuple and len(out) == 3 and q is None and k_nope is None and k_pe is None:
            q, k_nope, k_pe = out  # the per-step call of an engine: no more checks here
        else:
            q, k_nope, k_pe = _outs(out, _OUTS, (q, k_nope, k_pe), "split_qk_norm")
    outs_given = q is not None or k_nope is not None or k_pe is not None
    if inplace and outs_given:
        raise ValueError("split_qk_norm: inplace=True writes into the latent; do not also "
                         "pass q=, k_nope=, k_pe= or out=")
    if isinstance(latent, _TT):
        eager = not _is_compiling()
        try:
            if q_lora_rank is None and kv_lora_rank is None and rope_dim is None and not inplace:
                # The ranks from the shapes, taken by the op itself (the _lean forms: three
                # arguments fewer through the dispatcher), when nothing is left to allocate.
                if not outs_given:
                    op = _lean_eager if eager else _op_lean
                    q, k_nope, k_pe = (op(latent, w_q, w_kv, eps_q, eps_kv) if return_k_pe else
                                       op(latent, w_q, w_kv, eps_q, eps_kv, False))
                    # (the library rejects a w_q with q_lora_rank 0: with w_q, q has columns)
                    return (q if w_q is not None else None, k_nope,
                            k_pe if return_k_pe else None)
                if (k_nope is not None and (q is not None or w_q is None)
                        and (k_pe is not None or not return_k_pe)):
                    (_lean_out_eager if eager else _op_lean_out)(latent, w_q, w_kv, q, k_nope,
                                                                 k_pe, eps_q, eps_kv)
                    return q, k_nope, k_pe
            Q, C, R = _ranks(latent, w_q, w_kv, q_lora_rank, kv_lora_rank, rope_dim)
            if inplace:
                (_split_inplace_eager if eager else _op_split_inplace)(latent, w_q, w_kv, Q, C,
                                                                      R, eps_q, eps_kv)
                return (latent[:, :Q] if Q > 0 else None, latent[:, Q:Q + C],
                        latent[:, Q + C:Q + C + R])
            if not outs_given:
                q, k_nope, k_pe = (_split_eager if eager else _op_split)(
                    latent, w_q, w_kv, Q, C, R, eps_q, eps_kv, return_k_pe)
                return (q if Q > 0 else None, k_nope, k_pe if return_k_pe else None)
            T = _dim(latent, 0)
            if q is None and Q > 0:
                q = latent.new_empty((T, Q))
            if k_nope is None:
                k_nope = latent.new_empty((T, C))
            if k_pe is None and return_k_pe:
                k_pe = latent.new_empty((T, max(R, 0)))
            (_split_out_eager if eager else _op_split_out)(latent, w_q, w_kv, q, k_nope, k_pe,
                                                           Q, C, R, eps_q, eps_kv)
            return q, k_nope, k_pe
        except RuntimeError as e:
            raise _torch_error(e, w_q=w_q, w_kv=w_kv, q=q, k_nope=k_nope, k_pe=k_pe) from None
    _check_same_kind(False, w_q=w_q, w_kv=w_kv, q=q, k_nope=k_nope, k_pe=k_pe)
    Q, C, R = _ranks(latent, w_q, w_kv, q_lora_rank, kv_lora_rank, rope_dim)

    np = _core._numpy()
    if inplace:
        lat = _core.view_numpy(latent, "latent", writable=True)
        q = latent[:, :Q] if Q > 0 else None
        k_nope, k_pe = latent[:, Q:Q + C], latent[:, Q + C:Q + C + R]
    else:
        lat = _np_in(latent, "latent")
        T = _dim(latent, 0)
        if q is None and Q > 0:
            q = np.empty((T, Q), latent.dtype)
        if k_nope is None:
            k_nope = np.empty((T, C), latent.dtype)
        if k_pe is None and return_k_pe:
            k_pe = np.empty((T, max(R, 0)), latent.dtype)
    _core.run_split_qk_norm(_core.context(L.BACKEND_CPU), Q, C, R, eps_q, eps_kv, lat,
                            _np_in(w_q, "w_q"), _np_in(w_kv, "w_kv"), _np_out(q, "q"),
                            _np_out(k_nope, "k_nope"), _np_out(k_pe, "k_pe"))
    return q, k_nope, k_pe


def _split_qk_norm_quant(latent, w_q, w_kv, eps_q, eps_kv, q_lora_rank, kv_lora_rank, rope_dim,
                         q, k_nope, k_pe, out, return_k_pe, inplace, *, return_q, return_k_nope,
                         q_format, q_scale, q_eps, q_data, q_scales, k_nope_format, k_nope_scale,
                         k_nope_eps, k_nope_data, k_nope_scales):
    """split_qk_norm with quantized outputs (or a dense one left out): the _quant ops for torch
    tensors, mlaf_split_qk_norm_quant through ctypes for numpy arrays."""
    quant = (q_data, q_scales, k_nope_data, k_nope_scales)
    if out is not None:
        (q, k_nope, k_pe), quant = _rq.outs(out, _OUTS, (q, k_nope, k_pe), quant, "split_qk_norm")
    if inplace:
        raise ValueError("split_qk_norm: inplace=True writes into the latent; it takes no "
                         "quantized outputs (q_format=, k_nope_format=, ...) nor return_q / "
                         "return_k_nope")
    args, qname, kname = _rq.resolve(q_format, q_scale, q_eps, k_nope_format, k_nope_scale,
                                     k_nope_eps)
    Q, C, R = _ranks(latent, w_q, w_kv, q_lora_rank, kv_lora_rank, rope_dim)
    T = _dim(latent, 0)
    if isinstance(latent, _TT):
        eager = not _is_compiling()
        try:
            if q is None and k_nope is None and k_pe is None and all(t is None for t in quant):
                res = (_quant_eager if eager else _op_quant)(
                    latent, w_q, w_kv, Q, C, R, eps_q, eps_kv, *args, return_q, return_k_nope,
                    return_k_pe)
                q, k_nope, k_pe = _rq.wanted(Q, *res[:3], return_q, return_k_nope, return_k_pe)
                quant = res[3:]
            else:
                q, k_nope, k_pe = _rq.torch_dense_outputs(latent, T, Q, C, R, q, k_nope, k_pe, return_q,
                                                          return_k_nope, return_k_pe)
                quant = _rq.torch_quant_outputs(latent, T, Q, C, args, *quant)
                (_quant_out_eager if eager else _op_quant_out)(
                    latent, w_q, w_kv, q, k_nope, k_pe, *quant, Q, C, R, eps_q, eps_kv, *args)
        except RuntimeError as e:
            raise _torch_error(e, w_q=w_q, w_kv=w_kv, q=q, k_nope=k_nope, k_pe=k_pe,
                               **dict(zip(_rq.QUANT_OUTS, quant))) from None
    else:
        _check_same_kind(False, w_q=w_q, w_kv=w_kv, q=q, k_nope=k_nope, k_pe=k_pe,
                         **dict(zip(_rq.QUANT_OUTS, quant)))
        np = _core._numpy()
        if q is None and return_q and Q > 0:
            q = np.empty((T, Q), latent.dtype)
        if k_nope is None and return_k_nope:
            k_nope = np.empty((T, C), latent.dtype)
        if k_pe is None and return_k_pe:
            k_pe = np.empty((T, max(R, 0)), latent.dtype)
        quant, rq = _rq.np_quant(args, qname, kname, T, Q, C, *quant)
        _core.run_split_qk_norm(_core.context(L.BACKEND_CPU), Q, C, R, eps_q, eps_kv,
                                _np_in(latent, "latent"), _np_in(w_q, "w_q"), _np_in(w_kv, "w_kv"),
                                _np_out(q, "q"), _np_out(k_nope, "k_nope"), _np_out(k_pe, "k_pe"),
                                quant=rq)
    if not _rq.with_quant(args):
        return q, k_nope, k_pe
    return (q, k_nope, k_pe, *_rq.returned(args, *quant))
