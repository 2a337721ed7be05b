"""The Python API of mla_kv_cache: split_qk_norm, RoPE and the paged-cache write in one pass, every
cache format (the format names and their arguments are here too). Re-exported by mlafuse.ops (see
its docstring for the conventions every op follows)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ._ops_common import (_torch, _core, L, MlafError, _TT, _torch_error, _STYLES, _enum, version,
                          rope_table, _dim, _np_in, _np_out, _ranks, _check_same_kind, _outs)
from . import _ops_row_quant as _rq

if _torch is not None:
    # The ops, looked up once: the torch paths below call them directly (see _op_pair).
    from ._ops_common import _is_compiling, _op_pair

    _op_kv, _kv_eager = _op_pair("mla_kv_cache")
    _op_kv_out, _kv_out_eager = _op_pair("mla_kv_cache_out")
    _op_lean, _lean_eager = _op_pair("mla_kv_cache_lean")
    _op_lean_out, _lean_out_eager = _op_pair("mla_kv_cache_lean_out")
    _op_quant, _quant_eager = _op_pair("mla_kv_cache_quant")
    _op_quant_out, _quant_out_eager = _op_pair("mla_kv_cache_quant_out")


# ---- mla_kv_cache --------------------------------------------------------------------------
# Cache formats by name (docs/kv_formats.md): the library's own names, and vLLM's kv_cache_dtype names
# for two of them: "auto" is the bf16 / f16 / f32 cache ("plain"), "fp8_e4m3" the per-tensor e4m3
# format ("fp8").
_KV_FORMATS = {**L.KV_FORMATS, "auto": L.KV_PLAIN, "fp8_e4m3": L.KV_FP8}
# Formats engines name that this version does not write: rejected with their name.
_KV_FORMATS_NOT_SUPPORTED = {
    "fp8_e5m2": "e5m2 bytes",
    "nvfp4_ds_mla": "the 352-byte nvfp4 record",
}
_TILE_SCALES = {"amax": L.TILE_AMAX, "ue8m0": L.TILE_UE8M0,
                "ue8m0_floor_scaled": L.TILE_UE8M0_FLOOR_SCALED}


class KvFormatArgs(NamedTuple):
    """A cache format resolved into the custom ops' trailing arguments, in schema order (so
    ``op(*args, *fmt)`` passes them): the mlaf_kv_cache_desc of include/mlafuse/mla.h."""

    cache_format: int  # mlaf_kv_format: 0 plain, 1 fp8, 2 fp8_ds_mla, 3 fp8_v4
    scale: Any         # [1] f32 (fp8), read by the kernel; else None
    fp8_conv: int      # 0 stores e4m3(x / scale) (k_scale), 1 e4m3(x * scale) (quant_scale)
    amax_out: Any      # [1] f32 (fp8), optional, raised to the max |x| written
    tile_scale: int    # fp8_ds_mla's tile scales: 0 amax, 1 ue8m0, 2 ue8m0_floor_scaled
    kpe_cache: Any     # the rope part in a separate array (auto and fp8), optional


_PLAIN = KvFormatArgs(L.KV_PLAIN, None, L.FP8_DIV, None, L.TILE_AMAX, None)
_OUTS = ("q", "k_nope", "k_pe")


def _kv_format_code(cache_format) -> int:
    if isinstance(cache_format, str):
        name = cache_format.lower()
        code = _KV_FORMATS.get(name)
        if code is not None:
            return code
        if name in _KV_FORMATS_NOT_SUPPORTED:
            raise MlafError(L.ERR_UNSUPPORTED,
                            f"cache_format = {cache_format!r} ({_KV_FORMATS_NOT_SUPPORTED[name]}) "
                            f"is not supported by this mlafuse; supported: {sorted(_KV_FORMATS)}")
        raise ValueError(f"cache_format = {cache_format!r}, expected one of {sorted(_KV_FORMATS)}")
    return int(cache_format)  # the library's number; it reports a bad one


def _scalar_arg(x, name):
    """A [1] view of a one-value f32 array given as [1] or 0-d (vLLM keeps k_scale 0-d); a
    Python number is refused: the kernel reads the value from memory (on CUDA from the device,
    so a captured graph follows changes to it)."""
    if x is None:
        return None
    if not hasattr(x, "shape"):
        raise TypeError(f"{name} is a {type(x).__name__}, expected a 1-element float32 tensor "
                        "(numpy array for numpy calls) on the cache's device")
    return x.reshape(1) if len(x.shape) == 0 else x


def _kv_format_args(cache_format, k_scale, quant_scale, amax_out, tile_scale, kpe_cache):
    """The op's cache-format arguments (cache_format, scale, fp8_conv, amax_out, tile_scale,
    kpe_cache), or None for the plain call without them."""
    if (cache_format == "auto" and k_scale is None and quant_scale is None
            and amax_out is None and tile_scale is None and kpe_cache is None):
        return None
    fmt = _kv_format_code(cache_format)
    fname = cache_format if isinstance(cache_format, str) else L.mlaf_kv_format_name(fmt).decode()
    if fmt == L.KV_FP8:
        if k_scale is not None and quant_scale is not None:
            raise MlafError(L.ERR_INVALID_ARGUMENT,
                            "k_scale and quant_scale are both given; cache format fp8 takes one: "
                            "k_scale (stores e4m3(x / k_scale), vLLM) or quant_scale (stores "
                            "e4m3(x * quant_scale), FlashInfer / TRT-LLM)")
        if k_scale is None and quant_scale is None:
            raise MlafError(L.ERR_NULL_POINTER,
                            f"cache_format = {fname!r} needs a scale: k_scale= (stores "
                            "e4m3(x / k_scale), vLLM) or quant_scale= (e4m3(x * quant_scale), "
                            "FlashInfer / TRT-LLM), a 1-element float32 tensor")
    else:
        for name, x in (("k_scale", k_scale), ("quant_scale", quant_scale),
                        ("amax_out", amax_out)):
            if x is not None:
                raise MlafError(L.ERR_INVALID_ARGUMENT,
                                f"{name} is given, but cache_format = {fname!r} takes none "
                                "(only fp8 / fp8_e4m3 has a per-tensor scale)")
    if tile_scale is not None and fmt != L.KV_FP8_DS_MLA:
        raise MlafError(L.ERR_INVALID_ARGUMENT,
                        f"tile_scale is given, but cache_format = {fname!r} has no tile scales "
                        "(only fp8_ds_mla)")
    conv = L.FP8_MUL if quant_scale is not None else L.FP8_DIV
    scale = _scalar_arg(quant_scale if quant_scale is not None else k_scale,
                        "quant_scale" if quant_scale is not None else "k_scale")
    tile = _enum(tile_scale, _TILE_SCALES, "tile_scale") if tile_scale is not None else L.TILE_AMAX
    return KvFormatArgs(fmt, scale, conv, _scalar_arg(amax_out, "amax_out"), tile, kpe_cache)


@dataclass(frozen=True, eq=False)
class KVCache:
    """A paged MLA KV cache and its format, as one value: pass it as mla_kv_cache's (or
    mla_kv_cache_dsa's) ``kv_cache`` instead of the tensor and the format keywords.

        cache = mlafuse.KVCache(kv, "fp8_ds_mla", tile_scale="ue8m0")   # once, at setup
        mlafuse.mla_kv_cache(latent, w_q, w_kv, positions, cos_sin, slots, cache)

    Fields (the same values as mla_kv_cache's keywords of these names, ``format`` its
    ``cache_format``; docs/kv_formats.md):
      cache        [num_blocks, block_size, W] tensor (numpy array for numpy calls)
      format       "auto" (the default), "fp8" / "fp8_e4m3", "fp8_ds_mla", "fp8_v4", or the
                   library's number
      k_scale, quant_scale  fp8: exactly one, a 1-element (or 0-d) float32 tensor
      amax_out     fp8, optional [1] float32, raised to the max |x| written
      tile_scale   fp8_ds_mla: "amax" (default), "ue8m0" or "ue8m0_floor_scaled"
      kpe_cache    auto and fp8, optional: the rope part in its own [num_blocks, block_size, R]
    The format is checked when the object is made (a bad combination raises there, as the
    keywords do at the call); ``args`` holds it resolved (KvFormatArgs, None for the plain
    cache), ``block_size`` and ``num_blocks`` are the cache's. Frozen: one per cache and
    layer, reused every step; torch.compile takes it as an input or made inside the compiled
    function (one graph either way).
    """

    cache: Any
    format: Any = "auto"
    k_scale: Any = None
    quant_scale: Any = None
    amax_out: Any = None
    tile_scale: Any = None
    kpe_cache: Any = None
    args: KvFormatArgs | None = field(init=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "args", _kv_format_args(
            self.format, self.k_scale, self.quant_scale, self.amax_out, self.tile_scale,
            self.kpe_cache))

    @property
    def num_blocks(self) -> int:
        return _dim(self.cache, 0)

    @property
    def block_size(self) -> int:
        return _dim(self.cache, 1)


def _cache_args(kv_cache, cache_format, k_scale, quant_scale, amax_out, tile_scale, kpe_cache,
                op: str, torch_path: bool):
    """(the cache array, its KvFormatArgs or None for the plain call) from either call form:
    a KVCache, or the array and the format keywords. The format's arrays must be of the call's
    kind (numpy or torch)."""
    if isinstance(kv_cache, KVCache):
        if (cache_format != "auto" or k_scale is not None or quant_scale is not None
                or amax_out is not None or tile_scale is not None or kpe_cache is not None):
            raise ValueError(f"{op}: kv_cache is a KVCache, which carries the format: do not "
                             "also pass cache_format=, k_scale=, quant_scale=, amax_out=, "
                             "tile_scale= or kpe_cache=")
        c = kv_cache
        kv_cache, fmt = c.cache, c.args
        k_scale, quant_scale = c.k_scale, c.quant_scale
        amax_out, kpe_cache = c.amax_out, c.kpe_cache
    else:
        fmt = _kv_format_args(cache_format, k_scale, quant_scale, amax_out, tile_scale, kpe_cache)
    if fmt is not None:
        _check_same_kind(torch_path, k_scale=k_scale, quant_scale=quant_scale,
                         amax_out=amax_out, kpe_cache=kpe_cache)
    return kv_cache, fmt


def mla_kv_cache(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, *,
                 eps_q: float = 1e-5, eps_kv: float = 1e-5, style="interleaved",
                 q_lora_rank: int | None = None, kv_lora_rank: int | None = None,
                 rope_dim: int | None = None, q=None, k_nope=None, k_pe=None, out=None,
                 return_k_nope: bool = False, return_k_pe: bool = False, error_count=None,
                 cache_format="auto", k_scale=None, quant_scale=None, amax_out=None,
                 tile_scale=None, kpe_cache=None, kv_rope_tail: int = 0, **quant):
    """split_qk_norm + RoPE on k_pe + paged KV-cache write, in one pass (docs/mla.md), the cache in
    any of the formats of docs/kv_formats.md.

    latent, w_q, w_kv  as split_qk_norm
    positions     [T]                 int32 | int64, each in [0, max_pos)
    cos_sin       [max_pos, R]        f32 (see rope_table); positions and cos_sin may be None
                                      when R = 0
    slot_mapping  [N]                 int32 | int64, N <= T (rows t >= N write no cache row);
                                      slot = block * block_size + offset; a negative slot
                                      skips the token (CUDA-graph padding)
    kv_cache      [num_blocks, block_size, W]   MUTATED: record slot_mapping[t] becomes the
                                      token's [k_nope_norm | rope(k_pe)] in the cache format;
                                      every other record stays bit-identical. Or a KVCache
                                      (the cache with its format, instead of the format
                                      keywords below)
    style         "interleaved" (pairs 2i, 2i+1; GLM / DeepSeek) or "neox" (pairs i, i+R/2), or
                  "none": k_pe stored unrotated, positions / cos_sin not read (Kimi-K3)
    error_count   [1] int32, optional. MUTATED: incremented once per token whose slot is past
                  the cache or whose position is outside [0, max_pos) (that token writes no
                  cache row and no k_pe row). The caller zeroes it.

    Cache formats (``cache_format``):
      "auto"        kv_cache f32 | f16 | bf16, W = C + R, each value rounded to the cache dtype
      "fp8", "fp8_e4m3"   kv_cache uint8 | float8_e4m3fn, W = C + R, every value
                    e4m3(x / k_scale) (``k_scale``, vLLM) or e4m3(x * quant_scale)
                    (``quant_scale``, FlashInfer / TRT-LLM): exactly one of the two, a
                    1-element (or 0-d) float32 tensor on the cache's device, read by the kernel
                    (CUDA graphs follow changes to it). ``amax_out`` [1] float32, optional,
                    MUTATED: raised to the max |x| written (NaN ignored; the caller zeroes it)
      "fp8_ds_mla"  kv_cache uint8 | float8_e4m3fn, W = C + C/32 + 2R bytes (656 for C = 512,
                    R = 64): [C e4m3 | C/128 f32 tile scales | R bf16 rope(k_pe)]; bf16
                    latent, C % 128 == 0, cache strides multiples of 16 bytes. ``tile_scale``
                    "amax" (default; max(amax / 448, FLT_MIN), vLLM), "ue8m0"
                    (2^ceil(log2(max(amax, 1e-4) / 448)), DeepSeek) or "ue8m0_floor_scaled"
                    (FlashMLA's test quantizer)
    x is the value stored densely (rounded to the latent dtype first); e4m3 rounds to nearest
    even and saturates to +-448, NaN gives 0x7F. ``kpe_cache`` [num_blocks, block_size, R]
    (auto and fp8), optional: the rope part in a separate array of kv_cache's dtype
    (FlashInfer / TRT-LLM); kv_cache then holds C values. "fp8_e5m2" and "nvfp4_ds_mla" raise
    MlafError (MLAF_ERR_UNSUPPORTED).
      "fp8_v4"      DeepSeek-V4's SM90 FlashMLA page (docs/kv_formats.md, fp8_v4): kv_cache uint8 | float8_e4m3fn
                    [num_blocks, block_size, 584] with stride(1) = 584 and stride(0) the page
                    stride in bytes (>= block_size * 584, a multiple of 16; a contiguous
                    [.., 64, 584] tensor is one). Planar: token o's data row [448 e4m3 | 64 bf16
                    roped] at page + 576 o, its scale row [7 UE8M0 bytes | 0] at page +
                    576 block_size + 8 o. bf16 latent, kv_lora_rank 512, rope_dim 0,
                    kv_rope_tail 64.

    kv_rope_tail  r > 0 (DeepSeek-V4; 0 for every other model): the latent is [Q | C] (R = 0)
                  and the last r values of the normalized kv part, rounded to the latent dtype,
                  are rotated (interleaved) with positions / cos_sin [max_pos, r] and rounded
                  again; k_nope holds all C values and the cache record is k_nope (plain: C
                  values). k_pe must not be asked for. In place: k_nope may be the latent's own
                  kv columns (the row ends as [q_norm | rope-tailed kv_norm]).

    Returns ``(q, k_nope, k_pe)``: q [T, Q] = q_norm (None when Q = 0); k_nope [T, C] normalized
    and k_pe [T, R] roped, only when requested with return_k_nope / return_k_pe or given as
    outputs (else None). Given outputs (``q=``, ``k_nope=``, ``k_pe=``, or ``out=(q, k_nope,
    k_pe)`` with None for one not given) are mutated and returned; one of the wrong shape or
    dtype raises MlafError naming it, and nothing is written.

    Quantized outputs (docs/gemm_formats.md, the row ops): split_qk_norm's keywords
    ``return_q=True``, ``q_format``, ``q_scale``, ``q_eps``, ``q_data``, ``q_scales`` for q_norm
    and ``k_nope_format``, ... for k_nope (not with kv_rope_tail; the dense k_nope is written
    when asked for, as without them). Every token's rows are quantized, skipped and counted
    tokens too; the cache is written as without them. With a format named the call returns
    ``(q, k_nope, k_pe, q_data, q_scales, k_nope_data, k_nope_scales)`` and ``out=`` takes
    those seven.
    """
    if quant or (out is not None and not (isinstance(out, (tuple, list)) and len(out) == 3)):
        return _mla_kv_cache_quant(
            latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, eps_q, eps_kv, style,
            q_lora_rank, kv_lora_rank, rope_dim, q, k_nope, k_pe, out, return_k_nope,
            return_k_pe, error_count, cache_format, k_scale, quant_scale, amax_out, tile_scale,
            kpe_cache, kv_rope_tail, **_rq.keywords("mla_kv_cache", quant, ("return_k_nope",)))
    if out is not None:
        q, k_nope, k_pe = _outs(out, _OUTS, (q, k_nope, k_pe), "mla_kv_cache")
    style = _enum(style, _STYLES, "style")
    tail = int(kv_rope_tail)
    if isinstance(latent, _TT):
        kv_cache, fmt = _cache_args(kv_cache, cache_format, k_scale, quant_scale, amax_out,
                                    tile_scale, kpe_cache, "mla_kv_cache", True)
        if fmt is not None:
            fmt = (*fmt, tail)  # the op's last argument, after the format's
        elif tail != 0:
            fmt = (*_PLAIN, tail)
        eager = not _is_compiling()
        ins = (latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, error_count)
        try:
            if q_lora_rank is None and kv_lora_rank is None and rope_dim is None:
                # The ranks from the shapes, taken by the op itself (the _lean forms: three
                # arguments fewer through the dispatcher), when nothing is left to allocate.
                if q is None and k_nope is None and k_pe is None:
                    op = _lean_eager if eager else _op_lean
                    if fmt is None and not return_k_nope and not return_k_pe:
                        q, k_nope, k_pe = op(*ins, eps_q, eps_kv, style)
                    else:
                        q, k_nope, k_pe = op(*ins, eps_q, eps_kv, style, return_k_nope,
                                             return_k_pe, *(fmt or ()))
                    # (the library rejects a w_q with q_lora_rank 0: with w_q, q has columns)
                    return (q if w_q is not None else None,
                            k_nope if return_k_nope else None, k_pe if return_k_pe else None)
                if ((q is not None or w_q is None) and (k_nope is not None or not return_k_nope)
                        and (k_pe is not None or not return_k_pe)):
                    op = _lean_out_eager if eager else _op_lean_out
                    args = (*ins, q, k_nope, k_pe, eps_q, eps_kv, style)
                    op(*args) if fmt is None else op(*args, *fmt)
                    return q, k_nope, k_pe
            Q, C, R = _ranks(latent, w_q, w_kv, q_lora_rank, kv_lora_rank, rope_dim)
            if q is None and k_nope is None and k_pe is None:
                args = (*ins, Q, C, R, eps_q, eps_kv, style, return_k_nope, return_k_pe)
                op = _kv_eager if eager else _op_kv
                q, k_nope, k_pe = op(*args) if fmt is None else op(*args, *fmt)
                return (q if Q > 0 else None, k_nope if return_k_nope else None,
                        k_pe if return_k_pe else None)
            T = _dim(latent, 0)
            if q is None and Q > 0:
                q = latent.new_empty((T, Q))
            if k_nope is None and return_k_nope:
                k_nope = latent.new_empty((T, C))
            if k_pe is None and return_k_pe:
                k_pe = latent.new_empty((T, max(R, 0)))
            args = (*ins, q, k_nope, k_pe, Q, C, R, eps_q, eps_kv, style)
            op = _kv_out_eager if eager else _op_kv_out
            op(*args) if fmt is None else op(*args, *fmt)
            return q, k_nope, k_pe
        except RuntimeError as e:
            raise _torch_error(e, w_q=w_q, w_kv=w_kv, positions=positions, cos_sin=cos_sin,
                               slot_mapping=slot_mapping, kv_cache=kv_cache, q=q,
                               k_nope=k_nope, k_pe=k_pe, error_count=error_count) from None
    kv_cache, fmt = _cache_args(kv_cache, cache_format, k_scale, quant_scale, amax_out,
                                tile_scale, kpe_cache, "mla_kv_cache", False)
    _check_same_kind(False, w_q=w_q, w_kv=w_kv, positions=positions, cos_sin=cos_sin,
                     slot_mapping=slot_mapping, kv_cache=kv_cache, q=q, k_nope=k_nope,
                     k_pe=k_pe, error_count=error_count)
    Q, C, R = _ranks(latent, w_q, w_kv, q_lora_rank, kv_lora_rank, rope_dim)
    T = _dim(latent, 0)

    np = _core._numpy()
    if q is None and Q > 0:
        q = np.empty((T, Q), latent.dtype)
    if k_nope is None and return_k_nope:
        k_nope = np.empty((T, C), latent.dtype)
    if k_pe is None and return_k_pe:
        k_pe = np.empty((T, max(R, 0)), latent.dtype)
    extra = ()
    if fmt is not None or tail != 0:
        f = fmt if fmt is not None else _PLAIN
        extra = (f.cache_format, _np_in(f.scale, "scale"), f.fp8_conv,
                 _np_out(f.amax_out, "amax_out"), f.tile_scale, _np_out(f.kpe_cache, "kpe_cache"),
                 tail)
    _core.run_mla_kv_cache(
        _core.context(L.BACKEND_CPU), Q, C, R, eps_q, eps_kv, style, _np_in(latent, "latent"),
        _np_in(w_q, "w_q"), _np_in(w_kv, "w_kv"), _np_in(positions, "positions"),
        _np_in(cos_sin, "cos_sin"), _np_in(slot_mapping, "slot_mapping"),
        _np_out(kv_cache, "kv_cache"), _np_out(q, "q"), _np_out(k_nope, "k_nope"),
        _np_out(k_pe, "k_pe"), _np_out(error_count, "error_count"), *extra)
    return q, k_nope, k_pe


def _mla_kv_cache_quant(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, eps_q,
                        eps_kv, style, q_lora_rank, kv_lora_rank, rope_dim, q, k_nope, k_pe, out,
                        return_k_nope, return_k_pe, error_count, cache_format, k_scale,
                        quant_scale, amax_out, tile_scale, kpe_cache, kv_rope_tail, *,
                        return_q, q_format, q_scale, q_eps, q_data, q_scales, k_nope_format,
                        k_nope_scale, k_nope_eps, k_nope_data, k_nope_scales):
    """mla_kv_cache with quantized outputs (or the dense q left out): the _quant ops for torch
    tensors, mlaf_mla_kv_cache_quant through ctypes for numpy arrays."""
    quant = (q_data, q_scales, k_nope_data, k_nope_scales)
    if out is not None:
        (q, k_nope, k_pe), quant = _rq.outs(out, _OUTS, (q, k_nope, k_pe), quant, "mla_kv_cache")
    style = _enum(style, _STYLES, "style")
    tail = int(kv_rope_tail)
    args, qname, kname = _rq.resolve(q_format, q_scale, q_eps, k_nope_format, k_nope_scale,
                                     k_nope_eps)
    torch_path = isinstance(latent, _TT)
    kv_cache, fmt = _cache_args(kv_cache, cache_format, k_scale, quant_scale, amax_out,
                                tile_scale, kpe_cache, "mla_kv_cache", torch_path)
    f = (*(fmt if fmt is not None else _PLAIN), tail)  # the op's last arguments
    Q, C, R = _ranks(latent, w_q, w_kv, q_lora_rank, kv_lora_rank, rope_dim)
    T = _dim(latent, 0)
    ins = (latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, error_count)
    if torch_path:
        eager = not _is_compiling()
        try:
            if q is None and k_nope is None and k_pe is None and all(t is None for t in quant):
                res = (_quant_eager if eager else _op_quant)(
                    *ins, Q, C, R, eps_q, eps_kv, style, *args, return_q, return_k_nope,
                    return_k_pe, *f)
                q, k_nope, k_pe = _rq.wanted(Q, *res[:3], return_q, return_k_nope, return_k_pe)
                quant = res[3:]
            else:
                q, k_nope, k_pe = _rq.torch_dense_outputs(latent, T, Q, C, R, q, k_nope, k_pe, return_q,
                                                          return_k_nope, return_k_pe)
                quant = _rq.torch_quant_outputs(latent, T, Q, C, args, *quant)
                (_quant_out_eager if eager else _op_quant_out)(
                    *ins, q, k_nope, k_pe, *quant, Q, C, R, eps_q, eps_kv, style, *args, *f)
        except RuntimeError as e:
            raise _torch_error(e, w_q=w_q, w_kv=w_kv, positions=positions, cos_sin=cos_sin,
                               slot_mapping=slot_mapping, kv_cache=kv_cache, q=q,
                               k_nope=k_nope, k_pe=k_pe, error_count=error_count,
                               **dict(zip(_rq.QUANT_OUTS, quant))) from None
    else:
        _check_same_kind(False, w_q=w_q, w_kv=w_kv, positions=positions, cos_sin=cos_sin,
                         slot_mapping=slot_mapping, kv_cache=kv_cache, q=q, k_nope=k_nope,
                         k_pe=k_pe, error_count=error_count, **dict(zip(_rq.QUANT_OUTS, quant)))
        np = _core._numpy()
        if q is None and return_q and Q > 0:
            q = np.empty((T, Q), latent.dtype)
        if k_nope is None and return_k_nope:
            k_nope = np.empty((T, C), latent.dtype)
        if k_pe is None and return_k_pe:
            k_pe = np.empty((T, max(R, 0)), latent.dtype)
        quant, rq = _rq.np_quant(args, qname, kname, T, Q, C, *quant)
        _core.run_mla_kv_cache(
            _core.context(L.BACKEND_CPU), Q, C, R, eps_q, eps_kv, style, _np_in(latent, "latent"),
            _np_in(w_q, "w_q"), _np_in(w_kv, "w_kv"), _np_in(positions, "positions"),
            _np_in(cos_sin, "cos_sin"), _np_in(slot_mapping, "slot_mapping"),
            _np_out(kv_cache, "kv_cache"), _np_out(q, "q"), _np_out(k_nope, "k_nope"),
            _np_out(k_pe, "k_pe"), _np_out(error_count, "error_count"), f[0],
            _np_in(f[1], "scale"), f[2], _np_out(f[3], "amax_out"), f[4],
            _np_out(f[5], "kpe_cache"), tail, quant=rq)
    if not _rq.with_quant(args):
        return q, k_nope, k_pe
    return (q, k_nope, k_pe, *_rq.returned(args, *quant))
