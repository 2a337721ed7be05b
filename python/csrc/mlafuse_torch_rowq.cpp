// mlafuse_torch_rowq.cpp — the row ops' quantized forms in the torch extension: the kernels of
// split_qk_norm_quant, mla_kv_cache_quant, mla_kv_cache_dsa_quant and their _out forms (see
// mlafuse_torch.h), and their registration, kept in this file. They call the plain ops' code
// (mlafuse_torch_mla.cpp) with an mlaf_row_quant, which takes the library's _quant entries.
//
// q_norm [T, Q] and / or k_nope [T, C] also written in a GEMM-input format (docs/gemm_formats.md,
// the row ops): per output a format, a rounding and the amax floor, the e4m3 data and the scales.
// The scales travel in the orientation engines hold them, [T, groups]; for the MN-major layouts
// (strides (1, ld)) the library is handed their transposes, as rms_norm_quant's.
#include "mlafuse_torch.h"

namespace mlafuse_torch {
namespace {

using Opt = std::optional<at::Tensor>;

Opt lib_scales(const Opt &scales, int64_t f) {
    if (scales.has_value() && gemm_mn_major(f) && scales->dim() == 2) return scales->t();
    return scales;
}

// One call's quantized outputs as the library takes them. The views point into this object:
// it is built in place and never copied.
struct RowQuant {
    Opt q_lib, k_lib;  // the scales in the library's orientation
    View qd, qs, kd, ks;
    mlaf_row_quant rq;
    RowQuant(const c10::Device &d, const Opt &q_data, const Opt &q_scales, const Opt &k_data,
             const Opt &k_scales, int64_t q_format, int64_t q_scale, double q_eps,
             int64_t k_format, int64_t k_scale, double k_eps)
        : q_lib(lib_scales(q_scales, q_format)), k_lib(lib_scales(k_scales, k_format)),
          qd(q_data, "quant->q.data", d, true), qs(q_lib, "quant->q.scales", d, true),
          kd(k_data, "quant->k_nope.data", d, true), ks(k_lib, "quant->k_nope.scales", d, true) {
        std::memset(&rq, 0, sizeof rq);
        set(rq.q, "quant->q.format", "quant->q.scale", q_format, q_scale, q_eps, qd, qs);
        set(rq.k_nope, "quant->k_nope.format", "quant->k_nope.scale", k_format, k_scale, k_eps,
            kd, ks);
    }
    RowQuant(const RowQuant &) = delete;
    RowQuant &operator=(const RowQuant &) = delete;

  private:
    static void set(mlaf_gemm_out &g, const char *fname, const char *sname, int64_t f, int64_t s,
                    double eps, const View &data, const View &scales) {
        g.format = (mlaf_gemm_format)enum_arg(f, fname);
        g.scale = (mlaf_gemm_scale)enum_arg(s, sname);
        g.eps = (float)eps;
        g.data = data.p;
        g.scales = scales.p;
    }
};

// The functional forms' outputs: the dense q, k_nope, k_pe ([T, 0] where not asked for), then
// q_data, q_scales, k_nope_data, k_nope_scales (float8_e4m3fn data and the format's scales, as
// rnq_scales_layout in mlafuse/_torch_ops.py states them; [T, 0] for a format not named).
struct Outs {
    at::Tensor q, k, pe, qd, qs, kd, ks;
};

void alloc_quant(const at::Tensor &like, int64_t T, int64_t K, int64_t f, at::Tensor &data,
                 at::Tensor &scales) {
    if (f == 0) {
        data = alloc(like, T, 0, c10::ScalarType::Float8_e4m3fn);
        scales = alloc(like, T, 0, c10::ScalarType::Float);
        return;
    }
    data = alloc(like, T, nonneg(K), c10::ScalarType::Float8_e4m3fn);
    scales = alloc_gemm_scales(like, T, nonneg(K), f);
}

Outs alloc_outs(const at::Tensor &latent, int64_t Q, int64_t C, int64_t R, int64_t qf, int64_t kf,
                bool return_q, bool return_k_nope, bool return_k_pe) {
    const int64_t T = rows_of(latent);
    Outs o;
    o.q = alloc(latent, T, return_q ? nonneg(Q) : 0);
    o.k = alloc(latent, T, return_k_nope ? nonneg(C) : 0);
    o.pe = alloc(latent, T, return_k_pe ? nonneg(R) : 0);
    alloc_quant(latent, T, Q, qf, o.qd, o.qs);
    alloc_quant(latent, T, C, kf, o.kd, o.ks);
    return o;
}

Opt opt(bool want, const at::Tensor &t) { return want ? Opt(t) : std::nullopt; }

// ---- split_qk_norm -----------------------------------------------------------------------
void split_qk_norm_quant_out(const at::Tensor &latent, const Opt &w_q, const at::Tensor &w_kv,
                             const Opt &q, const Opt &k_nope, const Opt &k_pe, const Opt &q_data,
                             const Opt &q_scales, const Opt &k_nope_data,
                             const Opt &k_nope_scales, int64_t Q, int64_t C, int64_t R,
                             double eps_q, double eps_kv, int64_t q_format, int64_t q_scale,
                             double q_eps, int64_t k_nope_format, int64_t k_nope_scale,
                             double k_nope_eps) {
    const RowQuant rq(latent.device(), q_data, q_scales, k_nope_data, k_nope_scales, q_format,
                      q_scale, q_eps, k_nope_format, k_nope_scale, k_nope_eps);
    split_out_impl(latent, w_q, w_kv, q, k_nope, k_pe, Q, C, R, eps_q, eps_kv, &rq.rq);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
split_qk_norm_quant(const at::Tensor &latent, const Opt &w_q, const at::Tensor &w_kv, int64_t Q,
                    int64_t C, int64_t R, double eps_q, double eps_kv, int64_t q_format,
                    int64_t q_scale, double q_eps, int64_t k_nope_format, int64_t k_nope_scale,
                    double k_nope_eps, bool return_q, bool return_k_nope, bool return_k_pe) {
    const Outs o = alloc_outs(latent, Q, C, R, q_format, k_nope_format, return_q, return_k_nope,
                              return_k_pe);
    split_qk_norm_quant_out(latent, w_q, w_kv, opt(return_q && Q > 0, o.q), opt(return_k_nope, o.k),
                            opt(return_k_pe, o.pe), opt(q_format != 0, o.qd),
                            opt(q_format != 0, o.qs), opt(k_nope_format != 0, o.kd),
                            opt(k_nope_format != 0, o.ks), Q, C, R, eps_q, eps_kv, q_format,
                            q_scale, q_eps, k_nope_format, k_nope_scale, k_nope_eps);
    return {o.q, o.k, o.pe, o.qd, o.qs, o.kd, o.ks};
}

// ---- mla_kv_cache ------------------------------------------------------------------------
void mla_kv_cache_quant_out(
    const at::Tensor &latent, const Opt &w_q, const at::Tensor &w_kv, const Opt &positions,
    const Opt &cos_sin, const at::Tensor &slot_mapping, const at::Tensor &kv_cache,
    const Opt &error_count, const Opt &q, const Opt &k_nope, const Opt &k_pe, const Opt &q_data,
    const Opt &q_scales, const Opt &k_nope_data, const Opt &k_nope_scales, int64_t Q, int64_t C,
    int64_t R, double eps_q, double eps_kv, int64_t style, int64_t q_format, int64_t q_scale,
    double q_eps, int64_t k_nope_format, int64_t k_nope_scale, double k_nope_eps,
    int64_t cache_format, const Opt &scale, int64_t fp8_conv, const Opt &amax_out,
    int64_t tile_scale, const Opt &kpe_cache, int64_t kv_rope_tail) {
    const RowQuant rq(latent.device(), q_data, q_scales, k_nope_data, k_nope_scales, q_format,
                      q_scale, q_eps, k_nope_format, k_nope_scale, k_nope_eps);
    kv_out_impl(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, error_count, q,
                k_nope, k_pe, Q, C, R, eps_q, eps_kv, style,
                kv_format(cache_format, scale, fp8_conv, amax_out, tile_scale, kpe_cache,
                          kv_rope_tail),
                &rq.rq);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
mla_kv_cache_quant(const at::Tensor &latent, const Opt &w_q, const at::Tensor &w_kv,
                   const Opt &positions, const Opt &cos_sin, const at::Tensor &slot_mapping,
                   const at::Tensor &kv_cache, const Opt &error_count, int64_t Q, int64_t C,
                   int64_t R, double eps_q, double eps_kv, int64_t style, int64_t q_format,
                   int64_t q_scale, double q_eps, int64_t k_nope_format, int64_t k_nope_scale,
                   double k_nope_eps, bool return_q, bool return_k_nope, bool return_k_pe,
                   int64_t cache_format, const Opt &scale, int64_t fp8_conv, const Opt &amax_out,
                   int64_t tile_scale, const Opt &kpe_cache, int64_t kv_rope_tail) {
    const Outs o = alloc_outs(latent, Q, C, R, q_format, k_nope_format, return_q, return_k_nope,
                              return_k_pe);
    mla_kv_cache_quant_out(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache,
                           error_count, opt(return_q && Q > 0, o.q), opt(return_k_nope, o.k),
                           opt(return_k_pe, o.pe), opt(q_format != 0, o.qd),
                           opt(q_format != 0, o.qs), opt(k_nope_format != 0, o.kd),
                           opt(k_nope_format != 0, o.ks), Q, C, R, eps_q, eps_kv, style,
                           q_format, q_scale, q_eps, k_nope_format, k_nope_scale, k_nope_eps,
                           cache_format, scale, fp8_conv, amax_out, tile_scale, kpe_cache,
                           kv_rope_tail);
    return {o.q, o.k, o.pe, o.qd, o.qs, o.kd, o.ks};
}

// ---- mla_kv_cache_dsa (docs/dsa.md) ------------------------------------------------------
void mla_kv_cache_dsa_quant_out(
    const at::Tensor &latent, const Opt &w_q, const at::Tensor &w_kv, const Opt &positions,
    const Opt &cos_sin, const at::Tensor &slot_mapping, const at::Tensor &kv_cache,
    const Opt &error_count, const at::Tensor &index_k, const at::Tensor &index_weight,
    const at::Tensor &index_bias, const at::Tensor &index_cache, const Opt &topk_fill,
    const Opt &q, const Opt &k_nope, const Opt &k_pe, const Opt &index_out, const Opt &q_data,
    const Opt &q_scales, const Opt &k_nope_data, const Opt &k_nope_scales, int64_t Q, int64_t C,
    int64_t R, double eps_q, double eps_kv, int64_t style, int64_t index_style, bool hadamard,
    double ln_eps, double amax_eps, int64_t index_scale, int64_t q_format, int64_t q_scale,
    double q_eps, int64_t k_nope_format, int64_t k_nope_scale, double k_nope_eps,
    int64_t index_copies, int64_t index_copy_stride, int64_t cache_format, const Opt &scale,
    int64_t fp8_conv, const Opt &amax_out, int64_t tile_scale, const Opt &kpe_cache) {
    const RowQuant rq(latent.device(), q_data, q_scales, k_nope_data, k_nope_scales, q_format,
                      q_scale, q_eps, k_nope_format, k_nope_scale, k_nope_eps);
    dsa_out_impl(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, error_count,
                 index_k, index_weight, index_bias, index_cache, topk_fill, q, k_nope, k_pe,
                 index_out, Q, C, R, eps_q, eps_kv, style, index_style, hadamard, ln_eps,
                 amax_eps, index_scale, index_copies, index_copy_stride,
                 kv_format(cache_format, scale, fp8_conv, amax_out, tile_scale, kpe_cache, 0),
                 &rq.rq);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
           at::Tensor>
mla_kv_cache_dsa_quant(
    const at::Tensor &latent, const Opt &w_q, const at::Tensor &w_kv, const Opt &positions,
    const Opt &cos_sin, const at::Tensor &slot_mapping, const at::Tensor &kv_cache,
    const Opt &error_count, const at::Tensor &index_k, const at::Tensor &index_weight,
    const at::Tensor &index_bias, const at::Tensor &index_cache, const Opt &topk_fill, int64_t Q,
    int64_t C, int64_t R, double eps_q, double eps_kv, int64_t style, int64_t index_style,
    bool hadamard, double ln_eps, double amax_eps, int64_t index_scale, int64_t q_format,
    int64_t q_scale, double q_eps, int64_t k_nope_format, int64_t k_nope_scale,
    double k_nope_eps, bool return_q, bool return_k_nope, bool return_k_pe,
    bool return_index_out, int64_t index_copies, int64_t index_copy_stride, int64_t cache_format,
    const Opt &scale, int64_t fp8_conv, const Opt &amax_out, int64_t tile_scale,
    const Opt &kpe_cache) {
    const Outs o = alloc_outs(latent, Q, C, R, q_format, k_nope_format, return_q, return_k_nope,
                              return_k_pe);
    const at::Tensor io = alloc(latent, rows_of(latent), return_index_out ? MLAF_INDEX_HEAD_DIM : 0);
    mla_kv_cache_dsa_quant_out(
        latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, error_count, index_k,
        index_weight, index_bias, index_cache, topk_fill, opt(return_q && Q > 0, o.q),
        opt(return_k_nope, o.k), opt(return_k_pe, o.pe), opt(return_index_out, io),
        opt(q_format != 0, o.qd), opt(q_format != 0, o.qs), opt(k_nope_format != 0, o.kd),
        opt(k_nope_format != 0, o.ks), Q, C, R, eps_q, eps_kv, style, index_style, hadamard,
        ln_eps, amax_eps, index_scale, q_format, q_scale, q_eps, k_nope_format, k_nope_scale,
        k_nope_eps, index_copies, index_copy_stride, cache_format, scale, fp8_conv, amax_out,
        tile_scale, kpe_cache);
    return {o.q, o.k, o.pe, io, o.qd, o.qs, o.kd, o.ks};
}

}  // namespace
}  // namespace mlafuse_torch

// The row ops' quantized forms' kernels (their schemas: mlafuse/_schemas.py), for both devices.
#define MLAFUSE_ROWQ_IMPLS(m)                                                            \
    m.impl("split_qk_norm_quant", &mlafuse_torch::split_qk_norm_quant);                  \
    m.impl("split_qk_norm_quant_out", &mlafuse_torch::split_qk_norm_quant_out);          \
    m.impl("mla_kv_cache_quant", &mlafuse_torch::mla_kv_cache_quant);                    \
    m.impl("mla_kv_cache_quant_out", &mlafuse_torch::mla_kv_cache_quant_out);            \
    m.impl("mla_kv_cache_dsa_quant", &mlafuse_torch::mla_kv_cache_dsa_quant);            \
    m.impl("mla_kv_cache_dsa_quant_out", &mlafuse_torch::mla_kv_cache_dsa_quant_out)

TORCH_LIBRARY_IMPL(mlafuse, CPU, m) { MLAFUSE_ROWQ_IMPLS(m); }
TORCH_LIBRARY_IMPL(mlafuse, CUDA, m) { MLAFUSE_ROWQ_IMPLS(m); }
