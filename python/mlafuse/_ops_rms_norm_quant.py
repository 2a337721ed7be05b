"""The Python API of rms_norm_quant: a layer's residual add and RMSNorm, writing the dense output
and / or the fp8 input of the next block-scaled GEMM (docs/gemm_formats.md). Re-exported by
mlafuse.ops (see its docstring for the conventions every op follows). numpy arrays on the CPU
backend; torch tensors through the torch.ops.mlafuse.rms_norm_quant ops."""
from __future__ import annotations

import ctypes

from ._ops_common import (_torch, _core, L, MlafError, _TT, _T, _torch_error, _dim, _np_in, _np_out,
                          _check_same_kind, _outs)

if _torch is not None:
    # The ops, looked up once: the torch path below calls them directly (see _op_pair).
    from ._ops_common import _is_compiling, _op_pair

    _op_rnq, _rnq_eager = _op_pair("rms_norm_quant")
    _op_rnq_out, _rnq_out_eager = _op_pair("rms_norm_quant_out")
    _op_rnq_inplace, _rnq_inplace_eager = _op_pair("rms_norm_quant_inplace")

GEMM_FORMATS = dict(L.GEMM_FORMATS)  # "none", "fp8_1x128", "fp8_1x128_mn", "fp8_1x128_ue8m0", "mxfp8", "fp8_1x128_cm"
GEMM_SCALES = dict(L.GEMM_SCALES)    # "f32", "ue8m0", "mx_floor", "mx_ceil"
# the rounding a format takes when none is named: f32 for the f32 layouts, else the first it takes
_DEFAULT_SCALE = {"fp8_1x128": "f32", "fp8_1x128_mn": "f32", "fp8_1x128_ue8m0": "ue8m0", "mxfp8": "mx_floor",
                  "fp8_1x128_cm": "f32"}
_MN_MAJOR = ("fp8_1x128_mn", "fp8_1x128_ue8m0", "fp8_1x128_cm")
_OUTS = ("y", "q_data", "q_scales")


def _code(value, table, what):
    if isinstance(value, str):
        if value not in table:
            raise ValueError(f"{what} = {value!r}, expected one of {sorted(table)}")
        return table[value]
    return int(value)


def gemm_scales_shape(q_format, T: int, K: int):
    """The scales a format wants for T rows of K values, as the library states them:
    (numpy dtype, (rows, cols), least leading stride) of the tensor the library takes (the MN-major
    layouts: [groups, T] with a stride of at least round_up(T, 4))."""
    f = _code(q_format, GEMM_FORMATS, "q_format")
    dt, ld = ctypes.c_int(), ctypes.c_int64()
    shape = (ctypes.c_int64 * 2)()
    st = L.mlaf_gemm_scales_shape(f, int(T), int(K), ctypes.byref(dt), shape, ctypes.byref(ld))
    if st != L.OK:
        raise MlafError(st, f"no scales for format {q_format!r}, T = {T}, K = {K} (K a multiple of the "
                            f"format's group {L.mlaf_gemm_format_group(f)})")
    return _core.numpy_dtype(dt.value), (shape[0], shape[1]), ld.value


def _codes(q_format, q_scale, prefix="q"):
    """(format code, format name, rounding code) of a call, the rounding defaulted per format;
    a bad name raises ValueError naming ``<prefix>_format`` / ``<prefix>_scale``."""
    fmt = _code(q_format, GEMM_FORMATS, prefix + "_format")
    fname = next((k for k, v in GEMM_FORMATS.items() if v == fmt), str(fmt))
    if q_scale is None:
        q_scale = _DEFAULT_SCALE.get(fname, "f32")
    return fmt, fname, _code(q_scale, GEMM_SCALES, prefix + "_scale")


def _np_quant_outputs(fmt, fname, T, K, q_data, q_scales):
    """numpy outputs of one quantized output: (q_data, q_scales as engines hold them, the scales
    as the library takes them), the missing ones allocated (an MN-major buffer: 16-byte aligned
    rows of the least ld the library takes, held [T, groups] with strides (1, ld))."""
    np = _core._numpy()
    if q_data is None:
        q_data = np.empty((T, K), np.uint8)
    if q_scales is not None:
        return q_data, q_scales, (q_scales.T if fname in _MN_MAJOR else q_scales)
    sdt, (rows, cols), ld = gemm_scales_shape(fmt, T, K)
    if fname not in _MN_MAJOR:
        q_scales = np.empty((rows, cols), sdt)
        return q_data, q_scales, q_scales
    # [rows, ld] with 16-byte aligned rows: the first `ld` of a larger buffer, aligned
    raw = np.zeros(rows * ld + 16, sdt)
    off = (-raw.ctypes.data % 16) // raw.itemsize
    lib_scales = raw[off:off + rows * ld].reshape(rows, ld)[:, :cols]
    return q_data, lib_scales.T, lib_scales


def rms_norm_quant(x, weight, *, eps: float = 1e-6, residual=None, y=None, return_y: bool = True,
                   q_format="none", q_scale=None, q_eps: float = 0.0, q_data=None, q_scales=None,
                   out=None):
    """y = RMSNorm(x [+ residual]) * weight, dense and / or quantized for the next fp8 GEMM.

    x         [T, K]  float32 | float16 | bfloat16 (numpy: ml_dtypes), rows may be strided
    weight    [K]     x's dtype or float32
    residual  [T, K]  x's dtype, optional.  MUTATED: residual <- round(x + residual) (the fp32 sum
                      rounded once to the dtype), which is what gets normalized
    eps       RMSNorm eps (finite, > 0)

    Outputs (a given one is written, a missing one allocated; all three at once as
    ``out=(y, q_data, q_scales)``, None for one to allocate):
      y         [T, K] x's dtype (``return_y=False`` and no ``y``: none); may be x itself (in place)
      q_format  "none" (default), "fp8_1x128", "fp8_1x128_mn", "fp8_1x128_ue8m0", "mxfp8" or
                "fp8_1x128_cm"
      q_scale   its rounding: "f32", "ue8m0", "mx_floor", "mx_ceil" (default: f32 for the f32 layouts,
                ue8m0 for fp8_1x128_ue8m0, mx_floor for mxfp8)
      q_eps     the amax floor of the f32 / ue8m0 roundings (0: 1e-10)
      q_data    [T, K] the e4m3 bytes: torch float8_e4m3fn (allocated) or uint8; numpy uint8 or
                ml_dtypes float8_e4m3fn
      q_scales  fp8_1x128 float32 [T, K/128]; mxfp8 uint8 [T, K/32]; the MN-major layouts as engines
                hold them: fp8_1x128_mn float32 [T, K/128] and fp8_1x128_ue8m0 int32 [T, ceil(K/512)]
                with strides (1, ld) elements, ld a multiple of 4 >= round_up(T, 4) (the transpose of
                a [cols, ld] buffer, 16-byte aligned), fp8_1x128_cm float32 [T, K/128] with strides
                (1, ld), any ld >= T (allocated: ld = T, or round_up(T, 4) where TMA needs it)

    At least one output. Returns ``(y, q_data, q_scales)`` (None for an output not written).
    torch tensors run on their device's backend through torch.ops.mlafuse.rms_norm_quant (the
    functional form), rms_norm_quant_out (outputs given) or rms_norm_quant_inplace (y is x).
    """
    if out is not None:
        y, q_data, q_scales = _outs(out, _OUTS, (y, q_data, q_scales), "rms_norm_quant")
    fmt, fname, sc = _codes(q_format, q_scale)
    if isinstance(x, _TT):
        return _rms_norm_quant_torch(x, weight, float(eps), residual, y, bool(return_y), fmt, sc,
                                     float(q_eps), q_data, q_scales)
    _check_same_kind(False, weight=weight, residual=residual, y=y, q_data=q_data, q_scales=q_scales)
    np = _core._numpy()
    T, K = _dim(x, 0), _dim(x, 1)
    if y is None and return_y:
        y = np.empty((T, K), x.dtype)
    lib_scales = None
    if fmt != 0:
        q_data, q_scales, lib_scales = _np_quant_outputs(fmt, fname, T, K, q_data, q_scales)
    _core.run_rms_norm_quant(_core.context(L.BACKEND_CPU), eps, _np_in(x, "x"), _np_out(residual, "residual"),
                             _np_in(weight, "weight"), _np_out(y, "y"), fmt, sc, _np_out(q_data, "q.data"),
                             _np_out(lib_scales, "q.scales"), q_eps)
    return y, (q_data if fmt != 0 else None), (q_scales if fmt != 0 else None)


def _rms_norm_quant_torch(x, weight, eps, residual, y, return_y, fmt, sc, q_eps, q_data, q_scales):
    """The torch path: the functional op when nothing is given, the _inplace op when y is x, else
    the _out op with the missing outputs allocated as the functional op allocates them."""
    eager = not _is_compiling()
    quant = fmt != 0
    try:
        if y is None and q_data is None and q_scales is None:
            yy, qq, ss = (_rnq_eager if eager else _op_rnq)(x, weight, eps, residual, return_y, fmt,
                                                             sc, q_eps)
            return (yy if return_y else None, qq if quant else None, ss if quant else None)
        T, K = _dim(x, 0), _dim(x, 1)
        if quant and q_data is None:
            q_data = x.new_empty((T, K), dtype=_torch.float8_e4m3fn)
        if quant and q_scales is None:
            q_scales = _T.rnq_alloc_scales(x, T, K, fmt)
        if y is x:
            (_rnq_inplace_eager if eager else _op_rnq_inplace)(x, weight, eps, residual, q_data,
                                                               q_scales, fmt, sc, q_eps)
            return x, q_data, q_scales
        if y is None and return_y:
            y = x.new_empty((T, K))
        (_rnq_out_eager if eager else _op_rnq_out)(x, weight, eps, residual, y, q_data, q_scales,
                                                   fmt, sc, q_eps)
        return y, q_data, q_scales
    except RuntimeError as e:
        raise _torch_error(e, weight=weight, residual=residual, y=y, q_data=q_data,
                           q_scales=q_scales) from None
