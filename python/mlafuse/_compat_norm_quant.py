"""Engine adapters for the fused RMSNorm + fp8 per-token-group (1x128) quantization that feeds a
block-scaled GEMM, each one ``mlafuse.rms_norm_quant`` call (docs/gemm_formats.md). They are
re-exported by mlafuse.compat (see its docstring for what every adapter there follows).

Numerics common to both. The residual sum is rounded to the activation dtype, stored back and
normalized from that rounded value; y = h * rstd * w is rounded once to the dtype; the fp8 bytes
quantize those rounded y values: scale = max(amax, floor) / 448 (an IEEE f32 division), byte =
e4m3(y / scale), round to nearest even. So the bytes equal those of mlafuse's dense op followed
by a per-token-group quantize pass with the engine's scale rule; they can differ from the
engine's own kernel where its dense value differs by an ulp (each adapter says where).
"""
from __future__ import annotations

from . import ops as _ops

def _torch(fn: str):
    if _ops._torch is None:
        raise ImportError(f"mlafuse.compat.{fn} needs torch (pip install torch); "
                          "it takes torch tensors")
    return _ops._torch


def _tensors(torch, fn: str, **named):
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn}: {name} is a {type(t).__name__}, expected a torch.Tensor")


def _rows(torch, t, H: int, name: str, fn: str):
    """t [..., H] as the 2-D [T, H] the library takes (a 2-D tensor as it is, rows strided)."""
    if t.dim() == 2:
        return t
    if t.dim() < 1 or not t.is_contiguous():
        raise ValueError(f"{fn}: {name} is {tuple(t.shape)} with strides {t.stride()}, expected "
                         f"[..., {H}] contiguous (or 2-D)")
    return t.view(-1, H)


# ---- vLLM ---------------------------------------------------------------------------------------
_VLLM_FLOOR = 2.0 ** -9  # vLLM's min_scaling_factor 1 / (448 * 512), as an amax floor: amax >= 2^-9


def _vllm_checks(torch, fn, input, weight, quant_dtype, group_size, scale_ub, residual,
                 dtype_name="quant_dtype"):
    _tensors(torch, fn, input=input, weight=weight)
    if scale_ub is not None:
        raise NotImplementedError(f"{fn}: scale_ub (an upper bound on each group's amax) is not "
                                  "supported: mlafuse's scales follow the group's amax alone")
    if quant_dtype in (torch.int8, getattr(torch, "float8_e4m3fnuz", None)):
        raise NotImplementedError(f"{fn}: {dtype_name} = {quant_dtype} is not supported: mlafuse "
                                  "writes OCP e4m3 (torch.float8_e4m3fn) only")
    if quant_dtype != torch.float8_e4m3fn:
        raise ValueError(f"{fn}: {dtype_name} = {quant_dtype}, expected torch.float8_e4m3fn")
    gs = int(group_size)
    if gs == 64:
        raise NotImplementedError(f"{fn}: group_size 64 is not supported: mlafuse's fp8 GEMM "
                                  "inputs take 1x128 groups")
    if gs != 128:
        raise ValueError(f"{fn}: group size {gs}, expected 128 (vLLM takes 128 or 64)")
    if input.dim() < 1:
        raise ValueError(f"{fn}: input is a scalar, expected [..., hidden_size]")
    H = input.shape[-1]
    if weight.dim() != 1 or weight.shape[0] != H:
        raise ValueError(f"{fn}: weight is {tuple(weight.shape)}, expected [{H}]")
    if residual is not None:
        _tensors(torch, fn, residual=residual)
        if residual.shape != input.shape or residual.dtype != input.dtype:
            raise ValueError(f"{fn}: residual is {tuple(residual.shape)} {residual.dtype}, "
                             f"expected input's {tuple(input.shape)} {input.dtype}")
    x = _rows(torch, input, H, "input", fn)
    r = None if residual is None else _rows(torch, residual, H, "residual", fn)
    return x, r, H


def rms_norm_per_block_quant(input, weight, epsilon, quant_dtype, group_size, scale_ub=None,
                             residual=None, is_scale_transposed=False,
                             has_tma_aligned_scales=False):
    """vLLM's ``rms_norm_per_block_quant`` (vllm/_custom_ops.py, repository vllm-project/vllm,
    commit 7bcae67b5de3f155e70026695285de25d096b801: the Python wrapper of the custom op
    ``torch.ops._C.rms_norm_per_block_quant``, csrc/torch_bindings.cpp, kernel in
    csrc/quantization/fused_kernels/fused_layernorm_dynamic_per_token_quant.cu). vLLM has no
    separate fused-add op: ``residual`` is that variant.

    input     [..., H] f32 / f16 / bf16 (2-D: rows may be strided; more dims: contiguous)
    weight    [H];  epsilon the RMSNorm eps
    residual  input's shape and dtype, optional.  MUTATED: residual <- round(input + residual),
              which is then normalized
    quant_dtype  torch.float8_e4m3fn;  group_size  [1, 128] (vLLM reads group_size[1] only)

    Returns ``(output, scales)``: output input's shape, float8_e4m3fn; scales f32 [T, H / 128]
    (T = input.numel() / H), scale = max(amax / 448, 1 / (448 * 512)) — mlafuse's f32 rounding
    with the amax floor 2^-9, the same f32 value. Layouts, as vLLM's kernel addresses them:
    row-major [T, G] (fp8_1x128); with ``is_scale_transposed`` the [G, T] buffer seen as [T, G]
    with strides (1, T) (fp8_1x128_cm); with ``has_tma_aligned_scales`` too, strides
    (1, round_up(T, 4)) over a [G, round_up(T, 4)] buffer (fp8_1x128_mn; vLLM's wrapper at that
    commit allocates [G, T] there, which its kernel overruns when T is not a multiple of 4 and
    H > 128).

    Differences from vLLM's kernel: vLLM normalizes the unrounded f32 sum input + residual and
    rounds x * rstd before multiplying by the weight (two roundings); mlafuse rounds the sum,
    then y once (see the module docstring), so a byte can differ where vLLM's y is an ulp away.
    Raises for what mlafuse cannot do: ``scale_ub``, int8 or e4m3fnuz output, group size 64.
    """
    fn = "rms_norm_per_block_quant"
    torch = _torch(fn)
    if not isinstance(group_size, (list, tuple)) or len(group_size) != 2:
        raise ValueError(f"{fn}: group_size = {group_size!r}, expected [1, 128] (two entries)")
    x, r, H = _vllm_checks(torch, fn, input, weight, quant_dtype, group_size[1], scale_ub,
                           residual)
    T, G = x.shape[0], H // 128 if H % 128 == 0 else 0
    output = torch.empty(input.shape, dtype=torch.float8_e4m3fn, device=input.device)
    if not is_scale_transposed:
        fmt, scales = "fp8_1x128", torch.empty((T, G), dtype=torch.float32, device=input.device)
    elif not has_tma_aligned_scales:
        fmt = "fp8_1x128_cm"
        scales = torch.empty((G, T), dtype=torch.float32, device=input.device).t()
    else:
        fmt = "fp8_1x128_mn"
        ld = (T + 3) // 4 * 4
        scales = torch.empty((G, ld), dtype=torch.float32, device=input.device)[:, :T].t()
    _ops.rms_norm_quant(x, weight, eps=float(epsilon), residual=r, return_y=False, q_format=fmt,
                        q_scale="f32", q_eps=_VLLM_FLOOR, q_data=output.view(T, H),
                        q_scales=scales)
    return output, scales


def rms_norm_per_block_quant_op(result, input, weight, scale, epsilon, scale_ub, residual,
                                group_size, is_scale_transposed, has_tma_aligned_scales):
    """vLLM's custom op itself, ``torch.ops._C.rms_norm_per_block_quant(Tensor! result, Tensor
    input, Tensor weight, Tensor! scale, float epsilon, Tensor? scale_ub, Tensor!? residual, int
    group_size, bool is_scale_transposed, bool has_tma_aligned_scales) -> ()`` (csrc/
    torch_bindings.cpp, vllm-project/vllm commit 7bcae67b5de3f155e70026695285de25d096b801), the
    form vLLM's fusion pass and callers with preallocated buffers use. Writes ``result``
    (input's shape, float8_e4m3fn, contiguous) and ``scale`` (f32), and ``residual`` as
    rms_norm_per_block_quant does; returns None. ``group_size`` is the int (128).

    ``scale`` is addressed as vLLM's kernel addresses it, from its first element whatever its
    strides: scale (t, j) at t * G + j, or with ``is_scale_transposed`` at j * rows + t (rows
    T, or round_up(T, 4) with ``has_tma_aligned_scales``); a buffer too small for that raises.
    """
    fn = "rms_norm_per_block_quant_op"
    torch = _torch(fn)
    _tensors(torch, fn, result=result, scale=scale)
    x, r, H = _vllm_checks(torch, fn, input, weight, result.dtype, group_size, scale_ub, residual,
                           dtype_name="result.dtype")
    if result.shape != input.shape or not result.is_contiguous():
        raise ValueError(f"{fn}: result is {tuple(result.shape)}, expected input's shape "
                         f"{tuple(input.shape)}, contiguous")
    if scale.dtype != torch.float32:
        raise ValueError(f"{fn}: scale.dtype = {scale.dtype}, expected torch.float32")
    T, G = x.shape[0], H // 128 if H % 128 == 0 else 0
    if not is_scale_transposed:
        fmt, strides = "fp8_1x128", (G, 1)
    else:  # the library's fp8_1x128_cm takes any ld >= T: the kernel's rows, aligned or not
        fmt, strides = "fp8_1x128_cm", (1, (T + 3) // 4 * 4 if has_tma_aligned_scales else T)
    need = (T - 1) * strides[0] + (G - 1) * strides[1] + 1 if T and G else 0
    have = 1 + sum((n - 1) * st for n, st in zip(scale.shape, scale.stride())) \
        if scale.numel() else 0
    if need > have:
        raise ValueError(f"{fn}: scale spans {have} elements from its first, the kernel's layout "
                         f"of [T = {T}, G = {G}] scales (strides {strides}) needs {need}: the "
                         "buffer cannot hold them")
    view = torch.as_strided(scale, (T, G), strides)
    _ops.rms_norm_quant(x, weight, eps=float(epsilon), residual=r, return_y=False, q_format=fmt,
                        q_scale="f32", q_eps=_VLLM_FLOOR, q_data=result.view(T, H), q_scales=view)
    return None


# ---- FlashInfer --------------------------------------------------------------------------------
_FLASHINFER_FLOOR = 1e-4  # FlashInfer's amax floor: scale = max(amax, 1e-4) / 448


def fused_add_rmsnorm_fp8_block_quant(out, block_scale, normed_out, input, residual, weight,
                                      eps=1e-6, enable_pdl=None):
    """FlashInfer's ``flashinfer.norm.fused_add_rmsnorm_fp8_block_quant`` (pull request #4480,
    ``FusedAddRMSNormFP8BlockQuant``; repository flashinfer-ai/flashinfer, commit
    55dbfa8edc39ca28632bc24959a6e4ab0e59d24d: flashinfer/norm/__init__.py, csrc/norm.cu,
    include/flashinfer/norm.cuh). Returns None; writes, in one mlafuse call:

    residual    [M, H] input's dtype.  MUTATED: residual <- round(input + residual)
    normed_out  [M, H] input's dtype: RMSNorm(residual) * weight (eps), rounded once
    out         [M, H] float8_e4m3fn (or uint8): the e4m3 bytes of normed_out per 1x128 group
    block_scale f32 [H / 128, round_up(M, 4)], stride(1) 1 (FlashInfer's "column-major
                TMA-aligned" buffer, DeepGEMM's MN-major scales: logical scales
                block_scale.t()[:M]): scale = max(amax, 1e-4) / 448; columns M .. are untouched
    input [M, H] (only read), weight [H]; H a multiple of 128. ``enable_pdl`` is accepted and
    has no effect (mlafuse.set_cuda_pdl is the switch).

    Differences from FlashInfer's kernel: it normalizes the unrounded f32 sum and encodes
    normed * (448 / amax) (a reciprocal product) where mlafuse divides by the scale, so a byte
    can differ at an e4m3 rounding boundary; mlafuse's bytes are exactly the re-quantization of
    normed_out with amax / 448 scales. FlashInfer limits H (a multiple of 256, or of 512 above
    8192; at most 16384) and input dtypes (bf16 / f16); mlafuse takes any multiple of 128 and
    f32 too. Raises for an e5m2 ``out`` (FlashInfer's kernel writes e4m3 bytes into it anyway)
    and for row strides of out and normed_out that differ (FlashInfer steps both by out's).
    """
    fn = "fused_add_rmsnorm_fp8_block_quant"
    torch = _torch(fn)
    _tensors(torch, fn, out=out, block_scale=block_scale, normed_out=normed_out, input=input,
             residual=residual, weight=weight)
    if input.dim() != 2:
        raise ValueError(f"{fn}: input is {tuple(input.shape)}, expected [M, H]")
    M, H = input.shape
    for name, t in (("residual", residual), ("normed_out", normed_out)):
        if t.shape != input.shape or t.dtype != input.dtype:
            raise ValueError(f"{fn}: {name} is {tuple(t.shape)} {t.dtype}, expected input's "
                             f"[{M}, {H}] {input.dtype}")
    if H % 128 != 0:
        raise ValueError(f"{fn}: hidden size {H} is not a multiple of 128 (one scale per 1x128 "
                         "block)")
    if out.dtype == torch.float8_e5m2:
        raise NotImplementedError(f"{fn}: out is float8_e5m2; the 1x128 block scales are for "
                                  "e4m3 values (FlashInfer writes e4m3 bytes even there): pass a "
                                  "float8_e4m3fn out")
    if out.shape != input.shape or out.dtype not in (torch.float8_e4m3fn, torch.uint8):
        raise ValueError(f"{fn}: out is {tuple(out.shape)} {out.dtype}, expected [{M}, {H}] "
                         "float8_e4m3fn")
    if M > 1 and out.stride(0) != normed_out.stride(0):
        raise ValueError(f"{fn}: out's row stride {out.stride(0)} and normed_out's "
                         f"{normed_out.stride(0)} differ; FlashInfer writes both with out's")
    m_pad = (M + 3) // 4 * 4
    if block_scale.dtype != torch.float32 or block_scale.dim() != 2 or \
            tuple(block_scale.shape) != (H // 128, m_pad) or \
            (block_scale.stride(1) != 1 and M > 1):
        raise ValueError(f"{fn}: block_scale is {tuple(block_scale.shape)} {block_scale.dtype} "
                         f"strides {block_scale.stride()}, expected float32 [{H // 128}, "
                         f"round_up(M, 4) = {m_pad}] with stride(1) == 1")
    # The bytes of FlashInfer's MN-major TMA layout; the library's fp8_1x128_cm writes them
    # without asking the buffer for TMA's 16-byte alignment (FlashInfer does not either).
    _ops.rms_norm_quant(input, weight, eps=float(eps), residual=residual, y=normed_out,
                        q_format="fp8_1x128_cm", q_scale="f32", q_eps=_FLASHINFER_FLOOR,
                        q_data=out, q_scales=block_scale[:, :M].t())
    return None
