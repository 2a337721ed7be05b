"""Contexts, tensor views and the raw calls: the part shared by the numpy path and the torch
custom ops.

Contexts: the C library's contexts are not thread-safe, so each thread keeps its own, one per
(backend, device), in a threading.local; a thread's contexts are freed when the thread ends.
Views: a numpy array or torch tensor becomes an mlaf_tensor without any copy; numpy strides
are bytes and are converted to elements (a stride that is not a whole number of elements is
rejected, as is anything the library itself rejects).
"""
from __future__ import annotations

import ctypes
import struct
import threading

from . import _lib as L
from ._lib import MlafError

# ---- contexts ----------------------------------------------------------------------------
_cpu_threads = 0  # 0 = all cores, the library's default
_cuda_pdl = 0  # programmatic dependent launch on CUDA contexts (set_cuda_pdl)
# Set by _torch_ops when the compiled torch binding is loaded: it keeps contexts of its own
# (in C++) and hears of set_num_threads and set_cuda_pdl through these.
ext_set_threads = None
ext_set_cuda_pdl = None


class _Context:
    __slots__ = ("ptr", "backend", "device", "threads", "pdl")

    def __init__(self, backend: int, device: int):
        self.ptr = None
        p = ctypes.c_void_p()
        st = L.mlaf_context_create(ctypes.byref(p), backend)
        if st != L.OK:
            raise MlafError(st, f"cannot create a {L.mlaf_backend_name(backend).decode()} "
                                f"context: {L.status_message(st)}")
        self.ptr = p
        self.backend = backend
        self.device = device
        self.threads = 0
        self.pdl = 0
        if backend == L.BACKEND_CUDA:
            self.check(L.mlaf_context_set_cuda_device(self.ptr, device))

    def check(self, st: int) -> None:
        if st != L.OK:
            msg = L.mlaf_context_last_error(self.ptr).decode() or L.status_message(st)
            raise MlafError(st, msg)

    def __del__(self):
        # At interpreter exit the module globals may already be gone; the OS reclaims then.
        try:
            if self.ptr:
                L.mlaf_context_free(self.ptr)
                self.ptr = None
        except Exception:
            pass


class _PerThread(threading.local):
    def __init__(self):
        self.contexts = {}


_tls = _PerThread()


def context(backend: int, device: int = 0) -> _Context:
    """This thread's context for (backend, device), created on first use."""
    key = (backend, device)
    ctx = _tls.contexts.get(key)
    if ctx is None:
        ctx = _Context(backend, device)
        _tls.contexts[key] = ctx
    if backend == L.BACKEND_CPU and ctx.threads != _cpu_threads:
        ctx.check(L.mlaf_context_set_threads(ctx.ptr, _cpu_threads))
        ctx.threads = _cpu_threads
    elif backend == L.BACKEND_CUDA and ctx.pdl != _cuda_pdl:
        ctx.check(L.mlaf_context_set_cuda_pdl(ctx.ptr, _cuda_pdl))
        ctx.pdl = _cuda_pdl
    return ctx


def set_num_threads(n: int) -> None:
    """CPU threads used by every later CPU call (all threads' contexts); 0 = all cores."""
    global _cpu_threads
    n = int(n)
    if n < 0:
        raise MlafError(L.ERR_INVALID_ARGUMENT, f"threads = {n}, expected >= 0 (0 = all cores)")
    _cpu_threads = n
    if ext_set_threads is not None:
        ext_set_threads(n)


def set_cuda_pdl(enable) -> None:
    """Programmatic dependent launch for every later CUDA call (all threads; off by default).

    On (sm_90 and newer): each op's kernels launch as programmatic dependents and wait for the
    kernels before them before reading, so results are unchanged, and inside a CUDA graph
    consecutive launches overlap (mlaf_context_set_cuda_pdl). A kernel of your own launched
    with that attribute after an op must then wait the same way before reading its outputs.
    On a device below sm_90 the next CUDA call raises MlafError (MLAF_ERR_UNSUPPORTED).
    enable = 2: on, and the MLA row ops at decode sizes read their weights, positions, slot
    mapping and cos / sin rows (and write the top-k fill) before waiting on the kernel before them;
    the kernel launched just before such an op must not write those tensors (mlaf_context_set_cuda_pdl)."""
    global _cuda_pdl
    _cuda_pdl = 2 if enable == 2 and enable is not True else 1 if enable else 0
    if ext_set_cuda_pdl is not None:
        ext_set_cuda_pdl(_cuda_pdl)


def get_num_threads() -> int:
    """Threads the CPU backend will use on this thread's next call (resolved, >= 1)."""
    return L.mlaf_context_threads(context(L.BACKEND_CPU).ptr)


# ---- views ---------------------------------------------------------------------------------
# An mlaf_tensor is packed in one step (data, dtype, ndim, shape[4], stride[4]; native
# alignment, as the C struct), and all but its data pointer is kept per (dtype, shape,
# strides): the per-call path builds several views per op, and field-by-field ctypes
# assignment costs several times more.
_TENSOR = struct.Struct("Pii4q4q")
_DATA = struct.Struct("P")
_TAIL = struct.Struct("ii4q4q")
assert _TENSOR.size == ctypes.sizeof(L.Tensor) == _DATA.size + _TAIL.size, "mlaf_tensor layout"
_PAD = tuple((0,) * (L.MAX_DIMS - n) for n in range(L.MAX_DIMS + 1))
_from_bytes = L.Tensor.from_buffer_copy
_TAILS = {}  # (dtype, shape, strides) -> the packed view past its data pointer


def _tail(name, dtype, shape, strides) -> bytes:
    n = len(shape)
    if n > L.MAX_DIMS:
        raise MlafError(L.ERR_SHAPE, f"{name}.ndim = {n}, expected <= {L.MAX_DIMS}")
    # A stride that never moves the address (extent 1, or no elements at all) is arbitrary in
    # numpy and torch (0, or that of a wider parent); report the dense one.
    out = [int(s) for s in strides]
    empty = 0 in shape
    dense = 1
    for i in range(n - 1, -1, -1):
        e = int(shape[i])
        if e <= 1 or empty:
            out[i] = dense
        dense *= e if e > 1 else 1
    return _TAIL.pack(dtype, n, *shape, *_PAD[n], *out, *_PAD[n])


def _view(name, data, dtype, shape, strides):
    key = (dtype, shape, strides)
    tail = _TAILS.get(key)
    if tail is None:
        tail = _tail(name, dtype, shape, strides)
        if len(_TAILS) < 4096:
            _TAILS[key] = tail
    return _from_bytes(_DATA.pack(data or 0) + tail)


_np = None
_NP_DT = {}


def _numpy():
    global _np
    if _np is None:
        import numpy

        _np = numpy
        _NP_DT.update({numpy.dtype(numpy.float32): L.F32, numpy.dtype(numpy.float16): L.F16,
                       numpy.dtype(numpy.int32): L.I32, numpy.dtype(numpy.int64): L.I64,
                       numpy.dtype(numpy.uint8): L.U8})
        try:  # numpy has no bfloat16 or fp8; ml_dtypes supplies them when installed
            import ml_dtypes

            _NP_DT[numpy.dtype(ml_dtypes.bfloat16)] = L.BF16
            _NP_DT[numpy.dtype(ml_dtypes.float8_e4m3fn)] = L.FP8_E4M3
        except (ImportError, AttributeError):
            pass
    return _np


def numpy_dtype(code: int):
    np = _numpy()
    for k, v in _NP_DT.items():
        if v == code:
            return k
    raise MlafError(L.ERR_DTYPE, f"dtype {L.mlaf_dtype_name(code).decode()} has no numpy "
                                 "equivalent here (bf16 needs the ml_dtypes package)")


def view_numpy(a, name: str, writable: bool = False):
    np = _numpy()
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(a).__name__}")
    code = _NP_DT.get(a.dtype)
    if code is None:
        raise MlafError(L.ERR_DTYPE, f"{name}.dtype = {a.dtype}, expected float32, float16, "
                                     "bfloat16 (ml_dtypes), int32 or int64 in native byte "
                                     "order, or uint8 / float8_e4m3fn (ml_dtypes; fp8 caches)")
    if writable and not a.flags.writeable:
        raise ValueError(f"{name} is read-only; it is an output of this call")
    item = a.itemsize
    strides = []
    for i, s in enumerate(a.strides):
        if s % item:
            raise MlafError(L.ERR_STRIDE,
                            f"{name}.strides = {a.strides} bytes: stride[{i}] = {s} is not a "
                            f"multiple of the element size {item} (mlafuse strides are in "
                            "elements)")
        strides.append(s // item)
    return _view(name, a.__array_interface__["data"][0], code, a.shape, tuple(strides))


def byref(v):
    return ctypes.byref(v) if v is not None else None


# ---- raw calls: views in, MlafError out ----------------------------------------------------
_PARAMS = {}  # (struct type, values) -> the struct: read-only to the library, so shared


def params(cls, *values):
    """cls(*values), built once per distinct set of values (a few hundred kept)."""
    key = (cls, values)
    p = _PARAMS.get(key)
    if p is None:
        p = cls(*values)
        if len(_PARAMS) < 512:
            _PARAMS[key] = p
    return p


def run_split_qk_norm(ctx, Q, C, R, eps_q, eps_kv, latent, w_q, w_kv, q, k_nope, k_pe,
                      quant=None):
    """mlaf_split_qk_norm, or mlaf_split_qk_norm_quant with quant (an L.RowQuant, row_quant)."""
    p = params(L.SplitQkNormParams, int(Q), int(C), int(R), float(eps_q), float(eps_kv))
    if quant is None:
        ctx.check(L.mlaf_split_qk_norm(ctx.ptr, ctypes.byref(p), byref(latent), byref(w_q),
                                       byref(w_kv), byref(q), byref(k_nope), byref(k_pe)))
    else:
        ctx.check(L.mlaf_split_qk_norm_quant(ctx.ptr, ctypes.byref(p), byref(latent), byref(w_q),
                                             byref(w_kv), byref(q), byref(k_nope), byref(k_pe),
                                             ctypes.byref(quant)))


def _gemm_out(g, name, fmt, scale, eps, data, scales):
    g.format = _enum_arg(fmt, name + ".format")
    g.scale = _enum_arg(scale, name + ".scale")
    g.eps = float(eps)
    for field, v in (("data", data), ("scales", scales)):
        if v is not None:
            setattr(g, field, ctypes.pointer(v))  # the struct keeps the view alive


def row_quant(q_format, q_scale, q_eps, q_data, q_scales, k_format, k_scale, k_eps, k_data,
              k_scales):
    """mlaf_row_quant (docs/gemm_formats.md, the row ops) from its two outputs' parts: format and
    rounding codes, amax floor, and the views of the e4m3 data and the scales (the library's
    orientation: [groups, T] for the MN-major layouts)."""
    rq = L.RowQuant()
    _gemm_out(rq.q, "quant->q", q_format, q_scale, q_eps, q_data, q_scales)
    _gemm_out(rq.k_nope, "quant->k_nope", k_format, k_scale, k_eps, k_data, k_scales)
    return rq


def _enum_arg(v, name: str) -> int:
    """An enum argument as the int the library takes; a value outside int32 is refused here
    (ctypes would wrap it into a valid one), others reach the library, which names a bad one."""
    v = int(v)
    if not -2 ** 31 <= v < 2 ** 31:
        raise MlafError(L.ERR_INVALID_ARGUMENT, f"{name} = {v}, expected a small non-negative number")
    return v


def run_mla_kv_cache(ctx, Q, C, R, eps_q, eps_kv, style, latent, w_q, w_kv, positions,
                     cos_sin, slot_mapping, kv_cache, q, k_nope, k_pe, error_count,
                     cache_format=L.KV_PLAIN, scale=None, fp8_conv=L.FP8_DIV, amax_out=None,
                     tile_scale=L.TILE_AMAX, kpe_cache=None, kv_rope_tail=0, quant=None):
    """mlaf_mla_kv_cache_fmt with the cache described by its parts (format PLAIN, no kpe:
    exactly mlaf_mla_kv_cache); mlaf_mla_kv_cache_quant with quant (an L.RowQuant)."""
    p = params(L.MlaKvCacheParams, int(Q), int(C), int(R), float(eps_q), float(eps_kv),
               int(style), _enum_arg(kv_rope_tail, "kv_rope_tail"))
    d = L.KvCacheDesc()
    d.format = _enum_arg(cache_format, "cache_format")
    d.conv = _enum_arg(fp8_conv, "fp8_conv")
    d.tile_scale = _enum_arg(tile_scale, "tile_scale")
    # ctypes.pointer keeps each view alive as long as the description
    for field, v in (("cache", kv_cache), ("kpe", kpe_cache), ("scale", scale),
                     ("amax_out", amax_out)):
        if v is not None:
            setattr(d, field, ctypes.pointer(v))
    args = (ctx.ptr, ctypes.byref(p), byref(latent), byref(w_q), byref(w_kv), byref(positions),
            byref(cos_sin), byref(slot_mapping), ctypes.byref(d), byref(q), byref(k_nope),
            byref(k_pe), byref(error_count))
    if quant is None:
        ctx.check(L.mlaf_mla_kv_cache_fmt(*args))
    else:
        ctx.check(L.mlaf_mla_kv_cache_quant(*args, ctypes.byref(quant)))


def run_rope_q(ctx, R, style, q, positions, cos_sin, error_count, head_norm=False,
               head_norm_eps=0.0, q_out=None):
    """mlaf_rope_q, or mlaf_rope_q_out when q_out is given (docs/mla.md, head_norm)."""
    p = params(L.RopeParams, int(R), int(style), 1 if head_norm else 0, float(head_norm_eps))
    if q_out is None:
        ctx.check(L.mlaf_rope_q(ctx.ptr, ctypes.byref(p), byref(q), byref(positions),
                                byref(cos_sin), byref(error_count)))
    else:
        ctx.check(L.mlaf_rope_q_out(ctx.ptr, ctypes.byref(p), byref(q), byref(positions),
                                    byref(cos_sin), byref(q_out), byref(error_count)))
def run_mla_kv_cache_dsa(ctx, ip, Q, C, R, eps_q, eps_kv, style, latent, w_q, w_kv, positions, cos_sin,
                         slot_mapping, kv_cache, q, k_nope, k_pe, error_count, index_k, index_weight,
                         index_bias, index_cache, index_out=None, topk_fill=None,
                         index_copies=1, index_copy_stride=0, cache_format=L.KV_PLAIN, scale=None, fp8_conv=L.FP8_DIV, amax_out=None,
                         tile_scale=L.TILE_AMAX, kpe_cache=None, quant=None):
    """mlaf_mla_kv_cache_dsa: run_mla_kv_cache's arguments plus the indexer key branch (ip an
    L.IndexerParams); mlaf_mla_kv_cache_dsa_quant with quant (an L.RowQuant)."""
    p = L.MlaKvCacheParams(int(Q), int(C), int(R), float(eps_q), float(eps_kv), int(style))
    d = L.KvCacheDesc()
    d.format = _enum_arg(cache_format, "cache_format")
    d.conv = _enum_arg(fp8_conv, "fp8_conv")
    d.tile_scale = _enum_arg(tile_scale, "tile_scale")
    for field, v in (("cache", kv_cache), ("kpe", kpe_cache), ("scale", scale),
                     ("amax_out", amax_out)):
        if v is not None:
            setattr(d, field, ctypes.pointer(v))
    ik = L.IndexerK()
    for field, v in (("index_k", index_k), ("weight", index_weight), ("bias", index_bias),
                     ("cache", index_cache), ("out", index_out), ("topk_fill", topk_fill)):
        if v is not None:
            setattr(ik, field, ctypes.pointer(v))
    ik.copies = int(index_copies)
    ik.copy_stride = int(index_copy_stride)
    args = (ctx.ptr, ctypes.byref(p), byref(latent), byref(w_q), byref(w_kv), byref(positions),
            byref(cos_sin), byref(slot_mapping), ctypes.byref(d), byref(q), byref(k_nope),
            byref(k_pe), byref(error_count), ctypes.byref(ip), ctypes.byref(ik))
    if quant is None:
        ctx.check(L.mlaf_mla_kv_cache_dsa(*args))
    else:
        ctx.check(L.mlaf_mla_kv_cache_dsa_quant(*args, ctypes.byref(quant)))


def run_indexer_q(ctx, ip, q_idx, positions, cos_sin, w, q_fp8, w_out, q_pe=None, q_pe_style=0,
                  error_count=None):
    pr = L.RopeParams(64, int(q_pe_style))
    ctx.check(L.mlaf_indexer_q(ctx.ptr, ctypes.byref(ip), byref(q_idx), byref(positions),
                               byref(cos_sin), byref(w), byref(q_fp8), byref(w_out), byref(q_pe),
                               ctypes.byref(pr), byref(error_count)))


def run_rms_norm_quant(ctx, eps, x, residual, weight, y, q_format=0, q_scale=0, q_data=None, q_scales=None,
                       q_eps=0.0):
    """mlaf_rms_norm_quant; q_format 0: no quantized output (docs/gemm_formats.md)."""
    p = L.RmsNormQuantParams(float(eps))
    q = L.GemmOut()
    q.format = _enum_arg(q_format, "q.format")
    q.scale = _enum_arg(q_scale, "q.scale")
    q.eps = float(q_eps)
    for field, v in (("data", q_data), ("scales", q_scales)):
        if v is not None:
            setattr(q, field, ctypes.pointer(v))
    ctx.check(L.mlaf_rms_norm_quant(ctx.ptr, ctypes.byref(p), byref(x), byref(residual), byref(weight), byref(y),
                                    ctypes.byref(q)))


def run_moe_gate(ctx, params, logits, bias, weights, ids, scores):
    ctx.check(L.mlaf_moe_gate(ctx.ptr, ctypes.byref(params), byref(logits), byref(bias),
                              byref(weights), byref(ids), byref(scores)))


def run_moe_gate_hash(ctx, params, logits, tid2eid, token_ids, weights, ids, scores, error_count):
    ctx.check(L.mlaf_moe_gate_hash(ctx.ptr, ctypes.byref(params), byref(logits), byref(tid2eid),
                                   byref(token_ids), byref(weights), byref(ids), byref(scores),
                                   byref(error_count)))


def moe_params(top_k, n_group, topk_group, score_func, group_score, renormalize,
               routed_scaling_factor, apply_routed_scaling, eps, n_shared_experts):
    return params(L.MoeGateParams, int(top_k), int(n_group), int(topk_group), int(score_func),
                  int(group_score), int(bool(renormalize)), float(routed_scaling_factor),
                  int(bool(apply_routed_scaling)), float(eps), int(n_shared_experts))


# ---- gemm_quant (docs/gemm_formats.md) -------------------------------------------------------
def run_gemm_quant(ctx, x, q_format, q_scale, q_data, q_scales, q_eps=0.0):
    """mlaf_gemm_quant: x quantized into q_format; q_scales is the library's view of the scales
    (the MN-major layouts: [groups, T] with stride (ld, 1))."""
    q = L.GemmOut()
    q.format = _enum_arg(q_format, "q.format")
    q.scale = _enum_arg(q_scale, "q.scale")
    q.eps = float(q_eps)
    for field, v in (("data", q_data), ("scales", q_scales)):
        if v is not None:
            setattr(q, field, ctypes.pointer(v))
    ctx.check(L.mlaf_gemm_quant(ctx.ptr, byref(x), ctypes.byref(q)))

