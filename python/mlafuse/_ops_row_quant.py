"""What the MLA row ops' quantized outputs share (docs/gemm_formats.md, the row ops): split_qk_norm,
mla_kv_cache and mla_kv_cache_dsa write q_norm [T, Q] and / or k_nope [T, C] in a GEMM-input
format beside or instead of their dense copies. The keywords are rms_norm_quant's, once for each
output: ``q_format``, ``q_scale``, ``q_eps``, ``q_data``, ``q_scales`` and ``k_nope_format``,
``k_nope_scale``, ``k_nope_eps``, ``k_nope_data``, ``k_nope_scales``; with a format named the op
returns the four quantized outputs after its own (``q_data, q_scales, k_nope_data,
k_nope_scales``, None for one not written), and ``out=`` takes them in that order too.

Here: the keywords resolved into the custom ops' arguments, the numpy outputs and the library's
mlaf_row_quant, the torch outputs an _out op is handed, and ``out=`` of either length."""
from __future__ import annotations

from ._ops_common import _core, MlafError, _np_out
from ._ops_rms_norm_quant import _codes, _np_quant_outputs

QUANT_OUTS = ("q_data", "q_scales", "k_nope_data", "k_nope_scales")
# The keywords and their defaults. The ops take them as **quant: a call without them pays for
# one empty dict, not for a dozen keyword defaults (about 0.3 us a call from Python).
KEYWORDS = {"return_q": True, "return_k_nope": True, "q_format": "none", "q_scale": None,
            "q_eps": 0.0, "q_data": None, "q_scales": None, "k_nope_format": "none",
            "k_nope_scale": None, "k_nope_eps": 0.0, "k_nope_data": None, "k_nope_scales": None}


def keywords(op: str, quant: dict, skip=()) -> dict:
    """A call's quantization keywords with the defaults filled in; a name not among them (or
    in ``skip``: the op has it as an argument of its own) raises TypeError, as Python does."""
    for name in quant:
        if name not in KEYWORDS or name in skip:
            raise TypeError(f"{op}() got an unexpected keyword argument {name!r}")
    kw = {k: v for k, v in KEYWORDS.items() if k not in skip}
    kw.update(quant)
    return kw


def resolve(q_format, q_scale, q_eps, k_nope_format, k_nope_scale, k_nope_eps):
    """The custom ops' six quantization arguments (q_format, q_scale, q_eps, k_nope_format,
    k_nope_scale, k_nope_eps: mlaf_gemm_format / mlaf_gemm_scale codes and the amax floors), and
    the two formats' names. A name the library does not know raises ValueError naming the
    keyword; numbers pass through (the library names a bad one)."""
    qf, qn, qs = _codes(q_format, q_scale, "q")
    kf, kn, ks = _codes(k_nope_format, k_nope_scale, "k_nope")
    return (qf, qs, float(q_eps), kf, ks, float(k_nope_eps)), qn, kn


def outs(out, names: tuple, given: tuple, quant_given: tuple, op: str):
    """``out=`` of a row op: its own outputs (``names``), optionally followed by the four quantized
    ones. Returns (own outputs, quantized outputs). The outputs by name are the same thing: not
    both."""
    if any(g is not None for g in given + quant_given):
        raise ValueError(f"{op}: give the outputs as out= or by name "
                         f"({', '.join(names + QUANT_OUTS)}), not both")
    n = len(names)
    if not isinstance(out, (tuple, list)) or len(out) not in (n, n + 4):
        got = f"{len(out)} entries" if isinstance(out, (tuple, list)) else type(out).__name__
        raise ValueError(f"{op}: out= takes a tuple of {n} ({', '.join(names)}), got {got}; with "
                         f"quantized outputs, of {n + 4} ({', '.join(QUANT_OUTS)} after those)")
    out = tuple(out)
    return out[:n], (out[n:] if len(out) > n else (None,) * 4)


def np_quant(args, qname, kname, T, Q, C, q_data, q_scales, k_nope_data, k_nope_scales):
    """The numpy path: (q_data, q_scales, k_nope_data, k_nope_scales) as the call returns them
    (the missing ones of a named format allocated; scales in the engines' orientation) and the
    mlaf_row_quant the library takes."""
    qf, qs, qe, kf, ks, ke = args
    lib_q = lib_k = None
    if qf != 0:
        q_data, q_scales, lib_q = _np_alloc(qf, qname, T, Q, q_data, q_scales)
    if kf != 0:
        k_nope_data, k_nope_scales, lib_k = _np_alloc(kf, kname, T, C, k_nope_data, k_nope_scales)
    rq = _core.row_quant(qf, qs, qe, _np_out(q_data, "quant->q.data"),
                         _np_out(lib_q if qf != 0 else q_scales, "quant->q.scales"),
                         kf, ks, ke, _np_out(k_nope_data, "quant->k_nope.data"),
                         _np_out(lib_k if kf != 0 else k_nope_scales, "quant->k_nope.scales"))
    return (q_data, q_scales, k_nope_data, k_nope_scales), rq


def _np_alloc(fmt, fname, T, K, data, scales):
    try:
        return _np_quant_outputs(fmt, fname, T, K, data, scales)
    except MlafError:
        # no scales tensor for this format and K (K not a multiple of the group): an empty one,
        # so that the library names the problem (nothing is written)
        np = _core._numpy()
        empty = np.empty((T, 0), np.float32)
        return (data if data is not None else np.empty((T, max(K, 0)), np.uint8)), empty, empty


def torch_dense_outputs(latent, T, Q, C, R, q, k_nope, k_pe, return_q, return_k_nope, return_k_pe):
    """The dense outputs a torch call writes: the given ones kept, the wanted missing ones allocated."""
    if q is None and return_q and Q > 0:
        q = latent.new_empty((T, Q))
    if k_nope is None and return_k_nope:
        k_nope = latent.new_empty((T, C))
    if k_pe is None and return_k_pe:
        k_pe = latent.new_empty((T, max(R, 0)))
    return q, k_nope, k_pe


def wanted(Q, q, k_nope, k_pe, return_q, return_k_nope, return_k_pe):
    """An allocating op's dense results, those the caller did not ask for dropped."""
    return (q if return_q and Q > 0 else None, k_nope if return_k_nope else None,
            k_pe if return_k_pe else None)


def torch_quant_outputs(like, T, Q, C, args, q_data, q_scales, k_nope_data, k_nope_scales):
    """The torch outputs an _out op is handed: the missing ones of a named format allocated as
    the functional op allocates them (float8_e4m3fn data; the scales of rnq_scales_layout)."""
    qf, kf = args[0], args[3]
    if qf != 0:
        q_data, q_scales = _torch_alloc(like, T, Q, qf, q_data, q_scales)
    if kf != 0:
        k_nope_data, k_nope_scales = _torch_alloc(like, T, C, kf, k_nope_data, k_nope_scales)
    return q_data, q_scales, k_nope_data, k_nope_scales


def _torch_alloc(like, T, K, fmt, data, scales):
    from ._ops_common import _T, _torch

    if data is None:
        data = like.new_empty((T, max(K, 0)), dtype=_torch.float8_e4m3fn)
    if scales is None:
        scales = _T.rnq_alloc_scales(like, T, max(K, 0), fmt)
    return data, scales


def returned(args, q_data, q_scales, k_nope_data, k_nope_scales):
    """The four quantized outputs as a call returns them: None for a format not named."""
    q = args[0] != 0
    k = args[3] != 0
    return (q_data if q else None, q_scales if q else None, k_nope_data if k else None,
            k_nope_scales if k else None)


def with_quant(args) -> bool:
    """Whether the call returns the quantized outputs (a format named for either)."""
    return args[0] != 0 or args[3] != 0

