// mlafuse_torch_gemm_quant.cpp — gemm_quant in the torch extension (see mlafuse_torch.h; registered in
// mlafuse_torch.cpp): an activation quantized alone into a GEMM-input format. q_scales come and go
// as engines hold them (the MN-major formats [T, cols] with strides (1, ld)); the library gets the
// transpose, its [cols, T] view. What a format's scales are is read from the library's shape helper,
// as the ctypes binding does (mlafuse/_core.py, gemm_layout).
#include <ATen/ops/empty_strided.h>

#include "mlafuse_torch.h"

namespace mlafuse_torch {

namespace {

struct GemmLayout {
    mlaf_dtype dt;
    int32_t group, pack;
    bool mn, tma;
};

GemmLayout gemm_layout(int64_t fmt) {
    const int32_t group = fmt >= 0 && fmt < (1 << 30) ? api.gemm_format_group((mlaf_gemm_format)fmt) : 0;
    if (group <= 0)
        fail(MLAF_ERR_INVALID_ARGUMENT, "q_format = " + std::to_string(fmt) +
                                            ": not a GEMM-input format (none has nothing to write)");
    GemmLayout l;
    int64_t shape[2], ld;
    auto probe = [&](int64_t T, int64_t G) {
        api.gemm_scales_shape((mlaf_gemm_format)fmt, T, G * group, &l.dt, shape, &ld);
    };
    probe(0, 1);
    l.mn = shape[1] == 0;  // [cols, T] with T = 0
    probe(1, 1);
    l.tma = l.mn && ld == 4;  // one row: round_up(1, 4)
    probe(1, 4);
    l.pack = shape[l.mn ? 0 : 1] == 1 ? 4 : 1;  // four groups: one element, or four
    l.group = group;
    return l;
}

c10::ScalarType scalar_of(mlaf_dtype dt) {
    return dt == MLAF_F32 ? c10::ScalarType::Float : dt == MLAF_I32 ? c10::ScalarType::Int : c10::ScalarType::Byte;
}

}  // namespace

void gemm_quant_out(const at::Tensor &x, const at::Tensor &q_data, const at::Tensor &q_scales, int64_t q_format,
                    int64_t q_scale, double q_eps) {
    need_api();
    const c10::Device d = x.device();
    mlaf_context *ctx = context_for(d);
    const bool mn = q_format > 0 && gemm_layout(q_format).mn && q_scales.dim() == 2;
    const at::Tensor lib = mn ? q_scales.transpose(0, 1) : q_scales;
    View vx(x, "x", d, false), vd(q_data, "q.data", d, true), vs(lib, "q.scales", d, true);
    mlaf_gemm_out q;
    q.format = (mlaf_gemm_format)q_format;
    q.scale = (mlaf_gemm_scale)q_scale;
    q.data = vd.p;
    q.scales = vs.p;
    q.eps = (float)q_eps;
    check(ctx, api.gemm_quant(ctx, vx.p, &q));
}

std::tuple<at::Tensor, at::Tensor> gemm_quant(const at::Tensor &x, int64_t q_format, int64_t q_scale,
                                              double q_eps) {
    need_api();
    const GemmLayout l = gemm_layout(q_format);
    const int64_t T = rows_of(x), K = x.dim() >= 2 ? x.size(1) : 0;
    const int64_t cols = (K / l.group + l.pack - 1) / l.pack;
    at::Tensor data = alloc(x, T, K, c10::ScalarType::Float8_e4m3fn), scales;
    if (!l.mn) {
        scales = alloc(x, T, cols, scalar_of(l.dt));
    } else {
        const int64_t ld = l.tma ? (T + 3) / 4 * 4 : T;
        scales = at::empty_strided({T, cols}, {1, ld}, x.options().dtype(scalar_of(l.dt)));
    }
    gemm_quant_out(x, data, scales, q_format, q_scale, q_eps);
    return {data, scales};
}

}  // namespace mlafuse_torch
