"""The Python API of gemm_quant: an activation quantized alone into a GEMM-input format (the
quantize an engine runs before o_proj; docs/gemm_formats.md, gemm_quant). Re-exported by
mlafuse.ops (see its docstring for the conventions every op follows). numpy arrays on the CPU
backend, torch tensors through torch.ops.mlafuse.gemm_quant / gemm_quant_out."""
from __future__ import annotations

from ._ops_common import (_torch, _T, _core, L, MlafError, _TT, _torch_error, _dim, _np_in, _np_out,
                          _check_same_kind, _outs)
from ._ops_rms_norm_quant import GEMM_FORMATS, GEMM_SCALES, _DEFAULT_SCALE, _MN_MAJOR, _code, gemm_scales_shape

if _torch is not None:
    from ._ops_common import _is_compiling, _op_pair

    _op_gq, _gq_eager = _op_pair("gemm_quant")
    _op_gq_out, _gq_out_eager = _op_pair("gemm_quant_out")

_OUTS = ("q_data", "q_scales")


def _format_args(q_format, q_scale):
    """(format code, its name, rounding code) from names or ints; the rounding defaults to the
    format's first (f32 for the f32 layouts, ue8m0 for fp8_1x128_ue8m0, mx_floor for mxfp8)."""
    fmt = _code(q_format, GEMM_FORMATS, "q_format")
    if fmt == 0:
        raise MlafError(L.ERR_NULL_POINTER, "q_format = 'none': gemm_quant has nothing to write (name a "
                                            "GEMM-input format)")
    name = next((k for k, v in GEMM_FORMATS.items() if v == fmt), "")
    if not name:
        raise MlafError(L.ERR_INVALID_ARGUMENT, f"q_format = {fmt}, expected one of "
                                                f"{sorted(k for k in GEMM_FORMATS if k != 'none')}")
    if q_scale is None:
        q_scale = _DEFAULT_SCALE.get(name, "f32")
    return fmt, name, _code(q_scale, GEMM_SCALES, "q_scale")


def _np_scales(T: int, K: int, fmt: int, fname: str):
    """The scales a format wants, allocated as engines hold them, and the library's view of them:
    [T, cols] row-major; the MN-major layouts a [cols, ld] buffer with 16-byte aligned rows, whose
    transpose engines hold (as rms_norm_quant allocates them). A K the format's group does not
    divide gets an empty array: the library then names the problem."""
    np = _core._numpy()
    if K % int(L.mlaf_gemm_format_group(fmt)) != 0:
        s = np.empty((T, 0), np.float32)
        return s, s
    sdt, (rows, cols), ld = gemm_scales_shape(fmt, T, K)
    if fname not in _MN_MAJOR:
        s = np.empty((rows, cols), sdt)
        return s, s
    raw = np.zeros(rows * ld + 16, sdt)
    off = (-raw.ctypes.data % 16) // raw.itemsize
    lib = raw[off:off + rows * ld].reshape(rows, ld)[:, :cols]
    return lib.T, lib


def gemm_quant(x, *, q_format="fp8_1x128", q_scale=None, q_eps: float = 0.0, q_data=None, q_scales=None,
               out=None):
    """x quantized per token and per group into a GEMM-input format (docs/gemm_formats.md), alone.

    x         [T, K]  float32 | float16 | bfloat16 (ml_dtypes for numpy); rows may be strided. Not
                      modified. K a multiple of the format's group (128; 32 for mxfp8).
    q_format  "fp8_1x128" (default), "fp8_1x128_mn", "fp8_1x128_ue8m0", "mxfp8" or "fp8_1x128_cm"
    q_scale   its rounding: "f32", "ue8m0", "mx_floor", "mx_ceil" (default: f32 for the f32 layouts,
              ue8m0 for fp8_1x128_ue8m0, mx_floor for mxfp8)
    q_eps     the amax floor of the f32 / ue8m0 roundings (0: 1e-10)

    Outputs (given ones are written, as ``q_data=`` / ``q_scales=`` or ``out=(q_data, q_scales)``;
    missing ones allocated):
      q_data    [T, K] e4m3 bytes: uint8 or float8_e4m3fn (allocated: numpy uint8, torch
                float8_e4m3fn)
      q_scales  as engines hold them: fp8_1x128 float32 [T, K/128]; mxfp8 uint8 [T, K/32]; the
                MN-major layouts [T, cols] with strides (1, ld) — fp8_1x128_mn float32 (ld a multiple
                of 4 >= round_up(T, 4)), fp8_1x128_ue8m0 int32 [T, ceil(K/512)] (the same ld), and
                fp8_1x128_cm float32 (any ld >= T): the transpose of a [cols, ld] buffer

    The bytes are those rms_norm_quant writes for a dense output equal to x. Returns
    ``(q_data, q_scales)``; a rejected call raises MlafError and writes nothing.
    """
    if out is not None:
        q_data, q_scales = _outs(out, _OUTS, (q_data, q_scales), "gemm_quant")
    fmt, fname, sc = _format_args(q_format, q_scale)
    if isinstance(x, _TT):
        eager = not _is_compiling()
        try:
            if q_data is None and q_scales is None:
                return (_gq_eager if eager else _op_gq)(x, fmt, sc, float(q_eps))
            if q_data is None or q_scales is None:
                d, s = _T.gemm_quant_alloc(x, fmt)
                q_data = d if q_data is None else q_data
                q_scales = s if q_scales is None else q_scales
            (_gq_out_eager if eager else _op_gq_out)(x, q_data, q_scales, fmt, sc, float(q_eps))
            return q_data, q_scales
        except RuntimeError as e:
            raise _torch_error(e, q_data=q_data, q_scales=q_scales) from None
    _check_same_kind(False, q_data=q_data, q_scales=q_scales)
    np = _core._numpy()
    T, K = _dim(x, 0), _dim(x, 1)
    if q_data is None:
        q_data = np.empty((T, K), np.uint8)
    if q_scales is None:
        q_scales, lib_scales = _np_scales(T, K, fmt, fname)
    else:
        lib_scales = q_scales.T if fname in _MN_MAJOR and getattr(q_scales, "ndim", 0) == 2 else q_scales
    _core.run_gemm_quant(_core.context(L.BACKEND_CPU), _np_in(x, "x"), fmt, sc, _np_out(q_data, "q.data"),
                         _np_out(lib_scales, "q.scales"), q_eps)
    return q_data, q_scales
