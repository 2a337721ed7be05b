// mlafuse_torch_norm.cpp — rms_norm_quant in the torch extension: the kernels of its functional,
// _out and _inplace ops (see mlafuse_torch.h), and their registration, kept in this file.
//
// The quantized output's scales travel in the orientation engines hold them, [T, groups]; for
// the MN-major layouts (fp8_1x128_mn, fp8_1x128_ue8m0, fp8_1x128_cm: strides (1, ld)) the
// library is handed their transposes, [groups, T] with stride (ld, 1) (docs/gemm_formats.md).
#include <ATen/ops/empty_strided.h>

#include "mlafuse_torch.h"

namespace mlafuse_torch {

bool gemm_mn_major(int64_t f) {
    return f == MLAF_GEMM_FP8_1X128_MN || f == MLAF_GEMM_FP8_1X128_UE8M0 ||
           f == MLAF_GEMM_FP8_1X128_CM;
}

// The scales tensor the functional ops allocate, as rnq_scales_layout in mlafuse/_torch_ops.py
// (the fake implementation) states it, so that eager and traced calls see the same strides. A
// format without scales for this K gets [T, 0]: the library then names the problem.
at::Tensor alloc_gemm_scales(const at::Tensor &x, int64_t T, int64_t K, int64_t f) {
    const int64_t g = f == MLAF_GEMM_MXFP8 ? 32 : 128;
    if (f <= MLAF_GEMM_NONE || f >= MLAF_GEMM_FORMAT_COUNT_ || K % g != 0)
        return alloc(x, T, 0, c10::ScalarType::Float);
    const int64_t G = K / g, ld = (T + 3) / 4 * 4;
    const auto opts = x.options();
    switch (f) {
    case MLAF_GEMM_FP8_1X128: return alloc(x, T, G, c10::ScalarType::Float);
    case MLAF_GEMM_MXFP8: return alloc(x, T, G, c10::ScalarType::Byte);
    case MLAF_GEMM_FP8_1X128_CM:
        return at::empty_strided({T, G}, {1, T}, opts.dtype(c10::ScalarType::Float));
    case MLAF_GEMM_FP8_1X128_UE8M0:
        return at::empty_strided({T, (G + 3) / 4}, {1, ld}, opts.dtype(c10::ScalarType::Int));
    default: return at::empty_strided({T, G}, {1, ld}, opts.dtype(c10::ScalarType::Float));
    }
}

namespace {

void run(const at::Tensor &x, const at::Tensor &weight, double eps,
         const std::optional<at::Tensor> &residual, const std::optional<at::Tensor> &y,
         bool y_is_x, const std::optional<at::Tensor> &q_data,
         const std::optional<at::Tensor> &q_scales, int64_t q_format, int64_t q_scale,
         double q_eps) {
    need_api();
    const c10::Device d = x.device();
    mlaf_context *ctx = context_for(d);
    const int32_t f = enum_arg(q_format, "q.format");
    std::optional<at::Tensor> lib_scales = q_scales;
    if (q_scales.has_value() && gemm_mn_major(f) && q_scales->dim() == 2) lib_scales = q_scales->t();
    View vx(x, "x", d, y_is_x), vr(residual, "residual", d, true), vw(weight, "weight", d, false),
        vy(y, "y", d, true), vq(q_data, "q.data", d, true), vs(lib_scales, "q.scales", d, true);
    mlaf_gemm_out q;
    std::memset(&q, 0, sizeof q);
    q.format = (mlaf_gemm_format)f;
    q.scale = (mlaf_gemm_scale)enum_arg(q_scale, "q.scale");
    q.data = vq.p;
    q.scales = vs.p;
    q.eps = (float)q_eps;
    const mlaf_rms_norm_quant_params p = {(float)eps};
    check(ctx, api.rms_norm_quant(ctx, &p, vx.p, vr.p, vw.p, y_is_x ? vx.p : vy.p, &q));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> rms_norm_quant(
    const at::Tensor &x, const at::Tensor &weight, double eps,
    const std::optional<at::Tensor> &residual, bool return_y, int64_t q_format, int64_t q_scale,
    double q_eps) {
    const int64_t T = rows_of(x), K = x.dim() >= 2 ? x.size(1) : 0;
    const bool quant = q_format != 0;
    at::Tensor y = alloc(x, T, return_y ? K : 0),
               q = alloc(x, T, quant ? K : 0, c10::ScalarType::Float8_e4m3fn),
               s = quant ? alloc_gemm_scales(x, T, K, q_format) : alloc(x, T, 0, c10::ScalarType::Float);
    using Opt = std::optional<at::Tensor>;
    run(x, weight, eps, residual, return_y ? Opt(y) : std::nullopt, false,
        quant ? Opt(q) : std::nullopt, quant ? Opt(s) : std::nullopt, q_format, q_scale, q_eps);
    return {y, q, s};
}

void rms_norm_quant_out(const at::Tensor &x, const at::Tensor &weight, double eps,
                        const std::optional<at::Tensor> &residual,
                        const std::optional<at::Tensor> &y, const std::optional<at::Tensor> &q_data,
                        const std::optional<at::Tensor> &q_scales, int64_t q_format,
                        int64_t q_scale, double q_eps) {
    run(x, weight, eps, residual, y, false, q_data, q_scales, q_format, q_scale, q_eps);
}

// y is x itself (the library's in-place form: the same view read and written).
void rms_norm_quant_inplace(const at::Tensor &x, const at::Tensor &weight, double eps,
                            const std::optional<at::Tensor> &residual,
                            const std::optional<at::Tensor> &q_data,
                            const std::optional<at::Tensor> &q_scales, int64_t q_format,
                            int64_t q_scale, double q_eps) {
    run(x, weight, eps, residual, std::nullopt, true, q_data, q_scales, q_format, q_scale, q_eps);
}

}  // namespace
}  // namespace mlafuse_torch

// The rms_norm_quant ops' kernels (their schemas: mlafuse/_schemas.py), for both devices.
#define MLAFUSE_NORM_IMPLS(m)                                                    \
    m.impl("rms_norm_quant", &mlafuse_torch::rms_norm_quant);                    \
    m.impl("rms_norm_quant_out", &mlafuse_torch::rms_norm_quant_out);            \
    m.impl("rms_norm_quant_inplace", &mlafuse_torch::rms_norm_quant_inplace)

TORCH_LIBRARY_IMPL(mlafuse, CPU, m) { MLAFUSE_NORM_IMPLS(m); }
TORCH_LIBRARY_IMPL(mlafuse, CUDA, m) { MLAFUSE_NORM_IMPLS(m); }
