"""The Python API of rms_norm_quant: a layer's residual add and RMSNorm, writing the dense output
and / or the fp8 input of the next block-scaled GEMM (docs/gemm_formats.md). Re-exported by
mlafuse.ops (see its docstring for the conventions every op follows). numpy arrays on the CPU
backend."""
from __future__ import annotations

import ctypes

from ._ops_common import _core, L, MlafError, _dim, _is_torch, _np_in, _np_out, _check_same_kind

GEMM_FORMATS = dict(L.GEMM_FORMATS)  # "none", "fp8_1x128", "fp8_1x128_mn", "fp8_1x128_ue8m0", "mxfp8"
GEMM_SCALES = dict(L.GEMM_SCALES)    # "f32", "ue8m0", "mx_floor", "mx_ceil"
# the rounding a format takes when none is named: f32 for the f32 layouts, else the first it takes
_DEFAULT_SCALE = {"fp8_1x128": "f32", "fp8_1x128_mn": "f32", "fp8_1x128_ue8m0": "ue8m0", "mxfp8": "mx_floor"}
_MN_MAJOR = ("fp8_1x128_mn", "fp8_1x128_ue8m0")


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


def rms_norm_quant(x, weight, *, eps: float = 1e-6, residual=None, y=None, return_y: bool = True,
                   q_format="none", q_scale=None, q_eps: float = 0.0, q_data=None, q_scales=None):
    """y = RMSNorm(x [+ residual]) * weight, dense and / or quantized for the next fp8 GEMM.

    x         [T, K]  float32 | float16 | bfloat16 (ml_dtypes), rows may be strided
    weight    [K]     x's dtype or float32
    residual  [T, K]  x's dtype, optional.  MUTATED: residual <- round(x + residual) (the fp32 sum
                      rounded once to the dtype), which is what gets normalized
    eps       RMSNorm eps (finite, > 0)

    Outputs (a given one is written, a missing one allocated):
      y         [T, K] x's dtype (``return_y=False`` and no ``y``: none); may be x itself (in place)
      q_format  "none" (default), "fp8_1x128", "fp8_1x128_mn", "fp8_1x128_ue8m0" or "mxfp8"
      q_scale   its rounding: "f32", "ue8m0", "mx_floor", "mx_ceil" (default: f32 for the f32 layouts,
                ue8m0 for fp8_1x128_ue8m0, mx_floor for mxfp8)
      q_eps     the amax floor of the f32 / ue8m0 roundings (0: 1e-10)
      q_data    [T, K] uint8 or float8_e4m3fn (ml_dtypes): the e4m3 bytes
      q_scales  fp8_1x128 float32 [T, K/128]; mxfp8 uint8 [T, K/32]; the MN-major layouts as engines
                hold them: fp8_1x128_mn float32 [T, K/128] and fp8_1x128_ue8m0 int32 [T, ceil(K/512)]
                with strides (1, ld) elements, ld a multiple of 4 >= round_up(T, 4) (the transpose of
                a [cols, ld] buffer: what this function allocates, 16-byte aligned)

    At least one output. Returns ``(y, q_data, q_scales)`` (None for an output not written).
    """
    if _is_torch(x):
        raise TypeError("rms_norm_quant takes numpy arrays (CPU backend); its torch op is not part of "
                        "this binding yet")
    _check_same_kind(False, weight=weight, residual=residual, y=y, q_data=q_data, q_scales=q_scales)
    np = _core._numpy()
    fmt = _code(q_format, GEMM_FORMATS, "q_format")
    fname = next((k for k, v in GEMM_FORMATS.items() if v == fmt), str(fmt))
    if q_scale is None:
        q_scale = _DEFAULT_SCALE.get(fname, "f32")
    sc = _code(q_scale, GEMM_SCALES, "q_scale")
    T, K = _dim(x, 0), _dim(x, 1)
    if y is None and return_y:
        y = np.empty((T, K), x.dtype)
    lib_scales = None
    if fmt != 0:
        if q_data is None:
            q_data = np.empty((T, K), np.uint8)
        if q_scales is None:
            sdt, (rows, cols), ld = gemm_scales_shape(fmt, T, K)
            if fname in _MN_MAJOR:
                # [rows, ld] with 16-byte aligned rows: the first `ld` of a larger buffer, aligned
                n = rows * ld + 16
                raw = np.zeros(n, sdt)
                off = (-raw.ctypes.data % 16) // raw.itemsize
                buf = raw[off:off + rows * ld].reshape(rows, ld)
                lib_scales = buf[:, :cols]
                q_scales = lib_scales.T
            else:
                q_scales = np.empty((rows, cols), sdt)
                lib_scales = q_scales
        else:
            lib_scales = q_scales.T if fname in _MN_MAJOR else q_scales
    _core.run_rms_norm_quant(_core.context(L.BACKEND_CPU), eps, _np_in(x, "x"), _np_out(residual, "residual"),
                             _np_in(weight, "weight"), _np_out(y, "y"), fmt, sc, _np_out(q_data, "q.data"),
                             _np_out(lib_scales, "q.scales"), q_eps)
    return y, (q_data if fmt != 0 else None), (q_scales if fmt != 0 else None)
