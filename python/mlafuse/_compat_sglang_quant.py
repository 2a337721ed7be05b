"""SGLang's per-token-group fp8 quantize as mlafuse.compat serves it (compat.py re-exports the two
functions below): an activation quantized with one scale per 1 x group_size values, the scales in
the layout SGLang's options ask for, through mlafuse.gemm_quant (docs/gemm_formats.md, gemm_quant).

The signatures are SGLang's: repository sgl-project/sglang, file
python/sglang/srt/layers/quantization/fp8_kernel.py, commit 008601fa0ff2e0d398ae143f92172a8f719316f1
(``sglang_per_token_group_quant_fp8``; ``per_token_group_quant_fp8``, there an alias of
``_per_token_group_quant_8bit_raw``; the scales' layouts from
``create_per_token_group_quant_fp8_output_scale``). What each option selects:

  column_major_scales  scale_tma_aligned  scale_ue8m0   mlafuse format     x_s
  False                (ignored)          False         fp8_1x128          f32 [.., T, G] row-major
  True                 False              False         fp8_1x128_cm       f32 [T, G], strides (1, T)
  True                 True               False         fp8_1x128_mn       f32 [T, G], strides (1, round_up(T, 4))
  True                 True               True          fp8_1x128_ue8m0    i32 [T, ceil(G / 4)], strides (1, round_up(T, 4)),
                                                                           four UE8M0 bytes an element

G = K / group_size. Scales are max(amax, eps) / 448 (an f32 division), rounded up to a power of two
with scale_ue8m0; values e4m3(x / scale), saturating at +-448, NaN to 0x7F. Where SGLang's own kernel
takes a reciprocal product instead of the division (its CUDA kernel's scale, its row-major Triton
kernel's values), a scale can differ by an ulp and a byte by one e4m3 step: mlafuse's bytes are those
of the formula above, the same as mlafuse.rms_norm_quant writes (docs/gemm_formats.md, Sources).

What mlafuse does not do is refused with a ValueError naming the option, before anything runs:
group_size other than 128, an output dtype other than torch.float8_e4m3fn (int8, the fnuz e4m3 of
ROCm), fuse_silu_and_mul, masked_m, an eps below 1e-30 (mlafuse floors amax at eps >= 1e-30), and
the combinations SGLang itself asserts against (scale_ue8m0 without column-major, TMA-aligned scales
for sglang_per_token_group_quant_fp8; column-major scales of x with more than two dimensions).
"""
from __future__ import annotations

import math

from . import ops as _ops

_FP8 = _ops._torch.float8_e4m3fn if _ops._torch is not None else None  # SGLang's fp8_dtype (CUDA)


def _torch(fn: str):
    if _ops._torch is None:
        raise ImportError(f"mlafuse.compat.{fn} needs torch (pip install torch); it takes torch tensors")
    return _ops._torch


def _quant(fn, x, group_size, eps, dtype, column_major_scales, scale_tma_aligned, scale_ue8m0, ue8m0_needs_tma):
    torch = _torch(fn)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{fn}: x is a {type(x).__name__}, expected a torch.Tensor")
    if x.dim() < 2:
        raise ValueError(f"{fn}: x has {x.dim()} dimension(s), expected at least 2 (tokens, hidden)")
    if int(group_size) != 128:
        raise ValueError(f"{fn}: group_size = {group_size}: mlafuse's per-token-group formats with f32 "
                         "or packed UE8M0 scales group 128 values (mxfp8's groups of 32 take one UE8M0 "
                         "byte a group: mlafuse.gemm_quant(x, q_format='mxfp8'))")
    if dtype != torch.float8_e4m3fn:
        raise ValueError(f"{fn}: dtype = {dtype}: mlafuse writes e4m3 (torch.float8_e4m3fn) only")
    if not (math.isfinite(float(eps)) and float(eps) >= 1e-30):
        raise ValueError(f"{fn}: eps = {eps}: mlafuse's amax floor is finite and >= 1e-30")
    K = x.shape[-1]
    if K % 128 != 0:
        raise ValueError(f"{fn}: x.shape[-1] = {K} is not a multiple of group_size = 128")
    if scale_ue8m0 and not (column_major_scales and (scale_tma_aligned or not ue8m0_needs_tma)):
        need = "column_major_scales and scale_tma_aligned" if ue8m0_needs_tma else "column_major_scales"
        raise ValueError(f"{fn}: scale_ue8m0 needs {need} (the packed DeepGEMM layout; SGLang asserts "
                         "the same)")
    if column_major_scales and x.dim() != 2:
        raise ValueError(f"{fn}: column-major scales of a {x.dim()}-dimensional x: SGLang lays them out "
                         "for 2-dimensional x only")
    if scale_ue8m0:
        fmt, rounding = "fp8_1x128_ue8m0", "ue8m0"
    elif column_major_scales:
        fmt, rounding = ("fp8_1x128_mn" if scale_tma_aligned else "fp8_1x128_cm"), "f32"
    else:
        fmt, rounding = "fp8_1x128", "f32"
    x2 = x if x.dim() == 2 else x.reshape(-1, K)
    q, s = _ops.gemm_quant(x2, q_format=fmt, q_scale=rounding, q_eps=float(eps))
    if x.dim() != 2:
        q, s = q.view(x.shape), s.view(*x.shape[:-1], K // 128)
    return q, s


def sglang_per_token_group_quant_fp8(x, group_size, eps=1e-10, column_major_scales=False,
                                     scale_tma_aligned=False, scale_ue8m0=False, fuse_silu_and_mul=False,
                                     masked_m=None):
    """SGLang's ``sglang_per_token_group_quant_fp8`` (sgl-project/sglang,
    python/sglang/srt/layers/quantization/fp8_kernel.py, commit 008601fa): x [..., K] (f32 / f16 /
    bf16) quantized per token and group of 128 values. Returns ``(x_q, x_s)``: x_q float8_e4m3fn of
    x's shape, x_s as the module docstring's table says for the options. ``fuse_silu_and_mul`` and
    ``masked_m`` (the fused SiLU-and-mul path of the MoE experts) are refused with a ValueError, as are
    the other options mlafuse cannot honour (see the module docstring); scale_ue8m0 needs
    column_major_scales and scale_tma_aligned, as SGLang's scale allocation asserts.
    """
    fn = "sglang_per_token_group_quant_fp8"
    if fuse_silu_and_mul or masked_m is not None:
        raise ValueError(f"{fn}: fuse_silu_and_mul / masked_m are not supported: mlafuse quantizes x as "
                         "given (run the SiLU-and-mul first)")
    return _quant(fn, x, group_size, eps, _FP8, column_major_scales, scale_tma_aligned, scale_ue8m0, True)


def per_token_group_quant_fp8(x, group_size, eps=1e-10, dtype=_FP8, column_major_scales=False,
                              scale_tma_aligned=False, scale_ue8m0=False):
    """SGLang's ``per_token_group_quant_fp8`` (the same file and commit as
    sglang_per_token_group_quant_fp8: an alias of ``_per_token_group_quant_8bit_raw``, its Triton
    path). Returns ``(x_q, x_s)`` as sglang_per_token_group_quant_fp8 does. ``dtype`` must be
    torch.float8_e4m3fn; scale_ue8m0 needs column_major_scales (SGLang's Triton path asserts it, then
    packs the power-of-two scales into DeepGEMM's TMA-aligned int32 layout whatever
    scale_tma_aligned says: that packed layout is what this returns).
    """
    return _quant("per_token_group_quant_fp8", x, group_size, eps, dtype, column_major_scales, scale_tma_aligned,
                  scale_ue8m0, False)
