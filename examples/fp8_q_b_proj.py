#!/usr/bin/env python3
"""An fp8 block-scaled q_b_proj fed by mlafuse's quantized q, against the unfused path.

In block-fp8 checkpoints (DeepSeek-V3 / R1, Kimi-K2, GLM-4.7-Flash-FP8 ...) q_b_proj's weight is
e4m3 with one f32 scale per 128 x 128 block, and its input, q_norm = RMSNorm(latent[:, :Q]) * w_q,
is quantized per token and per group of 128 columns before the GEMM. Two ways to that input from
the latent [T, Q + C + R] of the fused q-a / kv-a projection:

  unfused  the dense q_norm (mlafuse.split_qk_norm, the norm engines run today), then a separate
           per-token-group quantize pass (written here in torch, as engines' quantize kernels
           compute it: scale = max(amax, 1e-10) / 448, e4m3(y / scale));
  fused    a source of Q_SOURCES: the quantized q straight from the norm, in the layout the GEMM
           wants, no dense q_norm written. The default, "split_qk_norm", is the row op that
           splits the latent anyway: mlafuse.split_qk_norm with q_format= and return_q=False
           writes q_norm only as e4m3 bytes and scales, beside its dense k_nope (mla_kv_cache
           takes the same keywords). "rms_norm_quant" runs mlafuse.rms_norm_quant on the q
           columns of the latent (a strided [T, Q] view, no copy): exactly q_norm, quantized in
           the same pass.

The two inputs are compared bit for bit (bytes and scales), the same GEMM runs on both (equal
products), and the product is checked against the dense one: within the sum over k of half an
e4m3 step of each input value times |W[n, k]|, plus the output's rounding, and within 4% in
relative Frobenius norm.

The GEMM is torch._scaled_mm with 1x128 / 128x128 block scales where this torch and device run
it (a probe decides; recent torch on sm90 and later), else dequantize-then-matmul in f32.

A new source of the quantized q (say mla_kv_cache writing it beside the cache) is one function
with the signature of q_from_split_qk_norm, added to Q_SOURCES.

    python examples/fp8_q_b_proj.py [--device cpu|cuda] [--tokens T] [--model glm-4.7-flash]
"""
import argparse
import sys

import torch

import mlafuse

E4M3_MAX = 448.0
GROUP = 128


# ---- the quantized q: sources --------------------------------------------------------------
def per_token_group_quant(y, q_format="fp8_1x128", eps=1e-10):
    """The unfused engines' quantize pass over a dense [T, K] y: (e4m3 [T, K], f32 scales [T, K /
    128] in the layout of q_format: row-major, or token-contiguous for the column-major ones)."""
    T, K = y.shape
    g = y.float().view(T, K // GROUP, GROUP)
    amax = g.abs().amax(dim=2)
    scale = amax.clamp(min=eps) / torch.full_like(amax, E4M3_MAX)  # a true division on every device
    q = (g / scale.unsqueeze(2)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(T, K)
    if q_format == "fp8_1x128_cm":
        scale = scale.t().contiguous().t()
    elif q_format == "fp8_1x128_mn":
        ld = (T + 3) // 4 * 4
        buf = scale.new_empty((K // GROUP, ld))
        buf[:, :T] = scale.t()
        scale = buf[:, :T].t()
    return q, scale


def q_unfused(latent, w_q, w_kv, eps, q_format="fp8_1x128"):
    """Dense q_norm from split_qk_norm, then the separate quantize pass."""
    q_norm, _, _ = mlafuse.split_qk_norm(latent, w_q, w_kv, eps_q=eps, eps_kv=eps,
                                         return_k_pe=False)
    return per_token_group_quant(q_norm, q_format)


def q_from_split_qk_norm(latent, w_q, w_kv, eps, q_format="fp8_1x128"):
    """mlafuse.split_qk_norm's quantized q: the e4m3 q_norm and its scales, no dense q_norm (the
    dense k_nope is written as the attention needs it)."""
    _, _, _, q, s, _, _ = mlafuse.split_qk_norm(latent, w_q, w_kv, eps_q=eps, eps_kv=eps,
                                                return_q=False, return_k_pe=False,
                                                q_format=q_format, q_scale="f32")
    return q, s


def q_from_rms_norm_quant(latent, w_q, w_kv, eps, q_format="fp8_1x128"):
    """mlafuse.rms_norm_quant on latent[:, :Q]: the e4m3 q and its scales, no dense q_norm."""
    Q = w_q.shape[0]
    _, q, s = mlafuse.rms_norm_quant(latent[:, :Q], w_q, eps=eps, return_y=False,
                                     q_format=q_format, q_scale="f32")
    return q, s


# The sources of the quantized q, the default first.
Q_SOURCES = {"split_qk_norm": q_from_split_qk_norm, "rms_norm_quant": q_from_rms_norm_quant}


# ---- the block-scaled GEMM -----------------------------------------------------------------
def quantize_weight(w):
    """[N, K] -> (e4m3 [N, K], f32 scales [N / 128, K / 128]): DeepSeek's weight_scale_inv."""
    N, K = w.shape
    b = w.float().view(N // GROUP, GROUP, K // GROUP, GROUP)
    amax = b.abs().amax(dim=(1, 3)).clamp(min=1e-4)
    scale = amax / torch.full_like(amax, E4M3_MAX)
    q = (b / scale[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.view(N, K), scale


def dequant(q, scale_rows, scale_cols=1):
    """e4m3 values times their block scales (a [T, G] or [N / 128, K / 128] scale grid)."""
    s = scale_rows.repeat_interleave(GROUP, dim=1)
    if scale_cols > 1:
        s = s.repeat_interleave(scale_cols, dim=0)
    return q.float() * s


def mm_dequant(a, a_scale, w, w_scale, out_dtype):
    return (dequant(a, a_scale) @ dequant(w, w_scale, GROUP).t()).to(out_dtype)


def mm_scaled(a, a_scale, w, w_scale, out_dtype):
    return torch._scaled_mm(a, w.t(), scale_a=a_scale, scale_b=w_scale.t(), out_dtype=out_dtype)


def pick_gemm(device):
    """(GEMM, the activation-scale layout it takes): torch._scaled_mm with block scales when a
    probe on this device gives the dequantized product, else the dequantize-then-matmul path."""
    if device.type == "cuda" and hasattr(torch, "_scaled_mm"):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(8, 256, generator=g).to(device, torch.bfloat16)
        w, ws = quantize_weight(torch.randn(256, 256, generator=g).to(device))
        for fmt in ("fp8_1x128_cm", "fp8_1x128_mn", "fp8_1x128"):
            _, a, s = mlafuse.rms_norm_quant(x, torch.ones(256, device=device), return_y=False,
                                             q_format=fmt)
            try:
                got = mm_scaled(a, s, w, ws, torch.float32)
            except (RuntimeError, ValueError, NotImplementedError):
                continue
            if torch.allclose(got, mm_dequant(a, s, w, ws, torch.float32), rtol=1e-3, atol=1e-3):
                return mm_scaled, fmt
    return mm_dequant, "fp8_1x128"


# ---- checks --------------------------------------------------------------------------------
def half_steps(q, scale):
    """Half an e4m3 step at each decoded value, in the value's units (scale included)."""
    v = q.float().abs()
    step = torch.where(v < 2.0 ** -6, torch.full_like(v, 2.0 ** -9),
                       torch.exp2(torch.floor(torch.log2(v.clamp(min=2.0 ** -6))) - 3))
    return step / 2 * scale.repeat_interleave(GROUP, dim=1)


def check_product(out, q_dense, a, a_scale, w, w_scale):
    """The product against the dense one (float64, the dequantized weight: the activation's error
    alone): elementwise |out - dense| <= sum_k halfstep(a[t, k]) |W[n, k]| + the output's
    rounding (a hard bound), and the relative Frobenius error below 4% (random rounding errors of
    a 3-bit mantissa give about 2.5%; a misread scale layout gives far more). Returns (ok, the
    relative error)."""
    wd = dequant(w, w_scale, GROUP).double()
    ref = q_dense.double() @ wd.t()
    bound = half_steps(a, a_scale).double() @ wd.abs().t()
    mag = out.double().abs().clamp(min=2.0 ** -126)
    ulp = torch.exp2(torch.floor(torch.log2(mag)) - (7 if out.dtype == torch.bfloat16 else 23))
    err = out.double() - ref
    rel = float(err.norm() / ref.norm().clamp(min=1e-300))
    hard = bool(torch.all(err.abs() <= bound * (1 + 1e-6) + ulp + 1e-6 * ref.abs()))
    return hard and rel < 0.04, rel


def same_bits(a, b):
    u8 = torch.uint8
    return torch.equal(a.view(u8) if a.dtype == torch.float8_e4m3fn else a,
                       b.view(u8) if b.dtype == torch.float8_e4m3fn else b)


def run(device="cpu", tokens=64, model="glm-4.7-flash", seed=0, quiet=False):
    """Builds one layer's q path with random weights and compares every source of Q_SOURCES with
    the unfused one. Returns {source: (inputs bit-equal, products equal, within the bound)}."""
    p = mlafuse.find_preset(model)
    if p is None:
        raise SystemExit(f"unknown model {model!r}; see mlafuse.presets()")
    if p.q_lora_rank == 0:
        raise SystemExit(f"{p.name} has no q LoRA (q_lora_rank 0): its q is not a q_b_proj of "
                         "a normalized latent")
    dev = torch.device(device)
    Q, C, R = p.q_lora_rank, p.kv_lora_rank, p.qk_rope_head_dim
    N = p.num_heads * (p.qk_nope_head_dim + R)
    g = torch.Generator().manual_seed(seed)
    wide = torch.randn(tokens, Q + C + R + 32, generator=g)  # a slice of a wider GEMM output
    latent = wide[:, 16:16 + Q + C + R].to(dev, torch.bfloat16)
    w_q = (1.0 + 0.1 * torch.randn(Q, generator=g)).to(dev, torch.bfloat16)
    w_kv = (1.0 + 0.1 * torch.randn(C, generator=g)).to(dev, torch.bfloat16)
    w, w_scale = quantize_weight((torch.randn(N, Q, generator=g) / Q ** 0.5).to(dev))
    gemm, fmt = pick_gemm(dev)
    eps = p.rms_norm_eps
    a0, s0 = q_unfused(latent, w_q, w_kv, eps, fmt)
    out0 = gemm(a0, s0, w, w_scale, torch.bfloat16)
    q_dense, _, _ = mlafuse.split_qk_norm(latent, w_q, w_kv, eps_q=eps, eps_kv=eps,
                                          return_k_pe=False)
    if not quiet:
        print(f"{p.name}: T = {tokens}, q_lora_rank {Q} -> q_b_proj N = {N} on {device}; GEMM "
              f"{gemm.__name__} (activation scales {fmt})")
    results = {}
    for name, source in Q_SOURCES.items():
        a, s = source(latent, w_q, w_kv, eps, fmt)
        out = gemm(a, s, w, w_scale, torch.bfloat16)
        inputs_equal = same_bits(a, a0) and torch.equal(s, s0)
        ok, rel = check_product(out, q_dense, a, s, w, w_scale)
        results[name] = (inputs_equal, torch.equal(out, out0), ok)
        if not quiet:
            print(f"  {name:16s} e4m3 q and scales = unfused: {inputs_equal}; product = "
                  f"unfused: {torch.equal(out, out0)}; within the fp8 bound of the dense product: "
                  f"{ok} (relative error {rel:.3g})")
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--model", default="glm-4.7-flash")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    results = run(args.device, args.tokens, args.model, args.seed)
    return 0 if all(all(r) for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
