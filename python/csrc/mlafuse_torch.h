// mlafuse_torch.h — what the files of the torch extension share (python/csrc/): the library's
// entry points (taken from the loaded libmlafuse, mlafuse_torch.cpp), errors, the contexts,
// views of tensors, and the op kernels that mlafuse_torch.cpp registers. The kernels live in
// mlafuse_torch_mla.cpp (split_qk_norm, mla_kv_cache, mla_kv_cache_dsa, indexer_q, rope_q),
// mlafuse_torch_moe.cpp (moe_gate, moe_gate_hash) and mlafuse_torch_gemm_quant.cpp (gemm_quant);
// mlafuse_torch_norm.cpp holds rms_norm_quant's kernels and mlafuse_torch_rowq.cpp the row ops'
// quantized forms, each registering its own. See
// mlafuse_torch.cpp for the whole design.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "mlafuse.h"

#define MLAFUSE_TORCH_EXPORT extern "C" __attribute__((visibility("default")))

namespace mlafuse_torch {

// ---- the library's entry points, taken from the already-loaded libmlafuse --------------
struct Api {
    decltype(&mlaf_version_number) version_number;
    decltype(&mlaf_status_name) status_name;
    decltype(&mlaf_status_message) status_message;
    decltype(&mlaf_backend_name) backend_name;
    decltype(&mlaf_context_create) context_create;
    decltype(&mlaf_context_free) context_free;
    decltype(&mlaf_context_set_threads) context_set_threads;
    decltype(&mlaf_context_set_cuda_device) context_set_cuda_device;
    decltype(&mlaf_context_set_cuda_stream) context_set_cuda_stream;
    decltype(&mlaf_context_set_cuda_pdl) context_set_cuda_pdl;
    decltype(&mlaf_context_last_error) context_last_error;
    decltype(&mlaf_split_qk_norm) split_qk_norm;
    decltype(&mlaf_mla_kv_cache_fmt) mla_kv_cache_fmt;
    decltype(&mlaf_mla_kv_cache_dsa) mla_kv_cache_dsa;
    decltype(&mlaf_indexer_q) indexer_q;
    decltype(&mlaf_rope_q) rope_q;
    decltype(&mlaf_rope_q_out) rope_q_out;
    decltype(&mlaf_moe_gate) moe_gate;
    decltype(&mlaf_moe_gate_hash) moe_gate_hash;
    decltype(&mlaf_rms_norm_quant) rms_norm_quant;  // mlafuse_torch_norm.cpp
    // the row ops' quantized forms (mlafuse_torch_rowq.cpp)
    decltype(&mlaf_split_qk_norm_quant) split_qk_norm_quant;
    decltype(&mlaf_mla_kv_cache_quant) mla_kv_cache_quant;
    decltype(&mlaf_mla_kv_cache_dsa_quant) mla_kv_cache_dsa_quant;
    // gemm_quant (mlafuse_torch_gemm_quant.cpp)
    decltype(&mlaf_gemm_quant) gemm_quant;
    decltype(&mlaf_gemm_format_group) gemm_format_group;
    decltype(&mlaf_gemm_scales_shape) gemm_scales_shape;
};

// The entry points once mlafuse_torch_init has taken them; the settings every thread follows
// (mlafuse_torch.cpp).
extern Api api;
extern std::atomic<bool> api_ready;
extern std::atomic<int> cpu_threads;  // 0 = all cores, as the library's default
extern std::atomic<int> cuda_pdl;     // programmatic dependent launch (mlafuse.set_cuda_pdl)

// Throws the "MLAF_ERR_...: message" error the Python side turns into MlafError.
[[noreturn]] void fail(mlaf_status st, const std::string &msg);

inline void need_api() {
    if (!api_ready.load(std::memory_order_acquire))
        TORCH_CHECK(false, "MLAF_ERR_BACKEND_UNAVAILABLE: the mlafuse torch extension was "
                           "loaded but not initialized (import mlafuse, which does both)");
}

// ---- contexts (mlafuse_torch.cpp) ---------------------------------------------------------
// Throws the context's last error for st != MLAF_OK.
void check(mlaf_context *ctx, mlaf_status st);
// The calling thread's context for device d (CPU, or CUDA on torch's current stream there).
mlaf_context *context_for(const c10::Device &d);

// ---- views -------------------------------------------------------------------------------
const char *torch_dtype_name(c10::ScalarType s);

inline mlaf_dtype dtype_of(const at::Tensor &t, const char *name) {
    switch (t.scalar_type()) {
    case c10::ScalarType::Float: return MLAF_F32;
    case c10::ScalarType::Half: return MLAF_F16;
    case c10::ScalarType::BFloat16: return MLAF_BF16;
    case c10::ScalarType::Int: return MLAF_I32;
    case c10::ScalarType::Long: return MLAF_I64;
    case c10::ScalarType::Byte: return MLAF_U8;
    case c10::ScalarType::Float8_e4m3fn: return MLAF_FP8_E4M3;
    default:
        fail(MLAF_ERR_DTYPE, std::string(name) + ".dtype = " + torch_dtype_name(t.scalar_type()) +
                                 ", expected float32, float16, bfloat16, int32, int64, uint8 or "
                                 "float8_e4m3fn");
    }
}

// Fills v from raw parts. A stride that never moves the address (extent 1, or no elements
// at all) is arbitrary in torch (0, or that of a wider parent); the dense one is reported,
// as the ctypes binding does.
inline void fill(mlaf_tensor &v, void *data, mlaf_dtype dt, int ndim, const int64_t *shape,
                 const int64_t *stride) {
    v.data = data;
    v.dtype = dt;
    v.ndim = ndim;
    bool empty = false;
    for (int i = 0; i < ndim; i++) empty |= shape[i] == 0;
    int64_t dense = 1;
    for (int i = MLAF_MAX_DIMS - 1; i >= 0; i--) {
        if (i >= ndim) {
            v.shape[i] = 0;
            v.stride[i] = 0;
            continue;
        }
        const int64_t n = shape[i];
        v.shape[i] = n;
        v.stride[i] = (n <= 1 || empty) ? dense : stride[i];
        dense *= n > 1 ? n : 1;
    }
}

// A view of t, or nullptr for an absent tensor. Checks the device and the dtype.
struct View {
    mlaf_tensor v;
    const mlaf_tensor *p = nullptr;
    View() = default;
    View(const at::Tensor &t, const char *name, const c10::Device &d, bool writable) {
        if (!t.defined()) return;
        if (t.device() != d)
            fail(MLAF_ERR_INVALID_ARGUMENT,
                 std::string(name) + " is on " + t.device().str() + ", expected " + d.str() +
                     " (every tensor of a call lives on one device)");
        const mlaf_dtype dt = dtype_of(t, name);
        const int64_t ndim = t.dim();
        if (ndim > MLAF_MAX_DIMS)
            fail(MLAF_ERR_SHAPE, std::string(name) + ".ndim = " + std::to_string(ndim) +
                                     ", expected <= " + std::to_string(MLAF_MAX_DIMS));
        void *data = writable ? t.mutable_data_ptr() : const_cast<void *>(t.const_data_ptr());
        fill(v, data, dt, (int)ndim, t.sizes().data(), t.strides().data());
        p = &v;
    }
    View(const std::optional<at::Tensor> &t, const char *name, const c10::Device &d,
         bool writable)
        : View(t.has_value() ? *t : at::Tensor(), name, d, writable) {}
};

inline int64_t rows_of(const at::Tensor &t) { return t.dim() >= 1 ? t.size(0) : 0; }
inline int64_t nonneg(int64_t x) { return x > 0 ? x : 0; }

at::Tensor alloc(const at::Tensor &like, int64_t rows, int64_t cols);
at::Tensor alloc(const at::Tensor &like, int64_t rows, int64_t cols, c10::ScalarType dt);

// ---- what the row ops' quantized forms share with the plain ones -------------------------
// An enum argument as the int the library takes (mlafuse_torch_mla.cpp).
int enum_arg(int64_t v, const char *name);

// mla_kv_cache's cache-format arguments (docs/kv_formats.md) come last with the plain call's
// defaults: cache_format an mlaf_kv_format, scale [1] f32 (fp8; the kernel reads it, on CUDA
// from the device), fp8_conv an mlaf_fp8_conv, amax_out [1] f32 (fp8, optional), tile_scale an
// mlaf_tile_scale (fp8_ds_mla), kpe_cache the separate rope array (plain and fp8). The library
// checks them all.
struct KvFormat {
    int64_t format = MLAF_KV_PLAIN;
    std::optional<at::Tensor> scale;
    int64_t conv = MLAF_FP8_DIV;
    std::optional<at::Tensor> amax_out;
    int64_t tile_scale = MLAF_TILE_AMAX;
    std::optional<at::Tensor> kpe;
    int64_t kv_rope_tail = 0;  // docs/mla.md, kv_rope_tail: the rope tail inside the kv part (R = 0 then)
};
KvFormat kv_format(int64_t cache_format, const std::optional<at::Tensor> &scale, int64_t fp8_conv,
                   const std::optional<at::Tensor> &amax_out, int64_t tile_scale,
                   const std::optional<at::Tensor> &kpe_cache, int64_t kv_rope_tail);

// The three ops' calls into the library (mlafuse_torch_mla.cpp): rq nullptr is the plain op,
// else its _quant form with those quantized outputs.
void split_out_impl(const at::Tensor &latent, const std::optional<at::Tensor> &w_q,
                    const at::Tensor &w_kv, const std::optional<at::Tensor> &q,
                    const std::optional<at::Tensor> &k_nope, const std::optional<at::Tensor> &k_pe,
                    int64_t Q, int64_t C, int64_t R, double eps_q, double eps_kv,
                    const mlaf_row_quant *rq = nullptr);
void kv_out_impl(const at::Tensor &latent, const std::optional<at::Tensor> &w_q,
                 const at::Tensor &w_kv, const std::optional<at::Tensor> &positions,
                 const std::optional<at::Tensor> &cos_sin, const at::Tensor &slot_mapping,
                 const at::Tensor &kv_cache, const std::optional<at::Tensor> &error_count,
                 const std::optional<at::Tensor> &q, const std::optional<at::Tensor> &k_nope,
                 const std::optional<at::Tensor> &k_pe, int64_t Q, int64_t C, int64_t R,
                 double eps_q, double eps_kv, int64_t style, const KvFormat &f,
                 const mlaf_row_quant *rq = nullptr);
void dsa_out_impl(
    const at::Tensor &latent, const std::optional<at::Tensor> &w_q, const at::Tensor &w_kv,
    const std::optional<at::Tensor> &positions, const std::optional<at::Tensor> &cos_sin,
    const at::Tensor &slot_mapping, const at::Tensor &kv_cache,
    const std::optional<at::Tensor> &error_count, const at::Tensor &index_k,
    const at::Tensor &index_weight, const at::Tensor &index_bias, const at::Tensor &index_cache,
    const std::optional<at::Tensor> &topk_fill, const std::optional<at::Tensor> &q,
    const std::optional<at::Tensor> &k_nope, const std::optional<at::Tensor> &k_pe,
    const std::optional<at::Tensor> &index_out, int64_t Q, int64_t C, int64_t R, double eps_q,
    double eps_kv, int64_t style, int64_t index_style, bool hadamard, double ln_eps,
    double amax_eps, int64_t index_scale, int64_t index_copies, int64_t index_copy_stride,
    const KvFormat &f, const mlaf_row_quant *rq = nullptr);

// The GEMM-input formats (mlafuse_torch_norm.cpp): whether a format's scales are MN-major
// (travelling as [T, groups] with strides (1, ld), handed to the library transposed), and the
// scales tensor the functional ops allocate for T rows of K values (as rnq_scales_layout in
// mlafuse/_torch_ops.py states it; [T, 0] for a format without scales for this K).
bool gemm_mn_major(int64_t f);
at::Tensor alloc_gemm_scales(const at::Tensor &like, int64_t T, int64_t K, int64_t f);

// ---- the op kernels (mlafuse_torch_mla.cpp, mlafuse_torch_moe.cpp) -----------------------
std::tuple<at::Tensor, at::Tensor, at::Tensor> split_qk_norm(
    const at::Tensor &latent, const std::optional<at::Tensor> &w_q, const at::Tensor &w_kv,
    int64_t Q, int64_t C, int64_t R, double eps_q, double eps_kv, bool return_k_pe);
void split_qk_norm_out(const at::Tensor &latent, const std::optional<at::Tensor> &w_q,
                       const at::Tensor &w_kv, const std::optional<at::Tensor> &q,
                       const at::Tensor &k_nope, const std::optional<at::Tensor> &k_pe,
                       int64_t Q, int64_t C, int64_t R, double eps_q, double eps_kv);
std::tuple<at::Tensor, at::Tensor, at::Tensor> split_qk_norm_lean(
    const at::Tensor &latent, const std::optional<at::Tensor> &w_q, const at::Tensor &w_kv,
    double eps_q, double eps_kv, bool return_k_pe);
void split_qk_norm_lean_out(const at::Tensor &latent, const std::optional<at::Tensor> &w_q,
                            const at::Tensor &w_kv, const std::optional<at::Tensor> &q,
                            const at::Tensor &k_nope, const std::optional<at::Tensor> &k_pe,
                            double eps_q, double eps_kv);
void split_qk_norm_inplace(const at::Tensor &latent, const std::optional<at::Tensor> &w_q,
                           const at::Tensor &w_kv, int64_t Q, int64_t C, int64_t R,
                           double eps_q, double eps_kv);
std::tuple<at::Tensor, at::Tensor, at::Tensor> mla_kv_cache(
    const at::Tensor &latent, const std::optional<at::Tensor> &w_q, const at::Tensor &w_kv,
    const std::optional<at::Tensor> &positions, const std::optional<at::Tensor> &cos_sin,
    const at::Tensor &slot_mapping, const at::Tensor &kv_cache,
    const std::optional<at::Tensor> &error_count, int64_t Q, int64_t C, int64_t R,
    double eps_q, double eps_kv, int64_t style, bool return_k_nope, bool return_k_pe,
    int64_t cache_format, const std::optional<at::Tensor> &scale, int64_t fp8_conv,
    const std::optional<at::Tensor> &amax_out, int64_t tile_scale,
    const std::optional<at::Tensor> &kpe_cache, int64_t kv_rope_tail);
void mla_kv_cache_out(const at::Tensor &latent, const std::optional<at::Tensor> &w_q,
                      const at::Tensor &w_kv, const std::optional<at::Tensor> &positions,
                      const std::optional<at::Tensor> &cos_sin, const at::Tensor &slot_mapping,
                      const at::Tensor &kv_cache, const std::optional<at::Tensor> &error_count,
                      const std::optional<at::Tensor> &q, const std::optional<at::Tensor> &k_nope,
                      const std::optional<at::Tensor> &k_pe, int64_t Q, int64_t C, int64_t R,
                      double eps_q, double eps_kv, int64_t style, int64_t cache_format,
                      const std::optional<at::Tensor> &scale, int64_t fp8_conv,
                      const std::optional<at::Tensor> &amax_out, int64_t tile_scale,
                      const std::optional<at::Tensor> &kpe_cache, int64_t kv_rope_tail);
std::tuple<at::Tensor, at::Tensor, at::Tensor> mla_kv_cache_lean(
    const at::Tensor &latent, const std::optional<at::Tensor> &w_q, const at::Tensor &w_kv,
    const std::optional<at::Tensor> &positions, const std::optional<at::Tensor> &cos_sin,
    const at::Tensor &slot_mapping, const at::Tensor &kv_cache,
    const std::optional<at::Tensor> &error_count, double eps_q, double eps_kv, int64_t style,
    bool return_k_nope, bool return_k_pe, int64_t cache_format,
    const std::optional<at::Tensor> &scale, int64_t fp8_conv,
    const std::optional<at::Tensor> &amax_out, int64_t tile_scale,
    const std::optional<at::Tensor> &kpe_cache, int64_t kv_rope_tail);
void mla_kv_cache_lean_out(
    const at::Tensor &latent, const std::optional<at::Tensor> &w_q, const at::Tensor &w_kv,
    const std::optional<at::Tensor> &positions, const std::optional<at::Tensor> &cos_sin,
    const at::Tensor &slot_mapping, const at::Tensor &kv_cache,
    const std::optional<at::Tensor> &error_count, const std::optional<at::Tensor> &q,
    const std::optional<at::Tensor> &k_nope, const std::optional<at::Tensor> &k_pe, double eps_q,
    double eps_kv, int64_t style, int64_t cache_format, const std::optional<at::Tensor> &scale,
    int64_t fp8_conv, const std::optional<at::Tensor> &amax_out, int64_t tile_scale,
    const std::optional<at::Tensor> &kpe_cache, int64_t kv_rope_tail);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> mla_kv_cache_dsa(
    const at::Tensor &latent, const std::optional<at::Tensor> &w_q, const at::Tensor &w_kv,
    const std::optional<at::Tensor> &positions, const std::optional<at::Tensor> &cos_sin,
    const at::Tensor &slot_mapping, const at::Tensor &kv_cache,
    const std::optional<at::Tensor> &error_count, const at::Tensor &index_k,
    const at::Tensor &index_weight, const at::Tensor &index_bias, const at::Tensor &index_cache,
    const std::optional<at::Tensor> &topk_fill, int64_t Q, int64_t C, int64_t R, double eps_q,
    double eps_kv, int64_t style, int64_t index_style, bool hadamard, double ln_eps,
    double amax_eps, int64_t index_scale, bool return_k_nope, bool return_k_pe,
    bool return_index_out, int64_t index_copies, int64_t index_copy_stride,
    int64_t cache_format, const std::optional<at::Tensor> &scale, int64_t fp8_conv,
    const std::optional<at::Tensor> &amax_out, int64_t tile_scale,
    const std::optional<at::Tensor> &kpe_cache);
void mla_kv_cache_dsa_out(
    const at::Tensor &latent, const std::optional<at::Tensor> &w_q, const at::Tensor &w_kv,
    const std::optional<at::Tensor> &positions, const std::optional<at::Tensor> &cos_sin,
    const at::Tensor &slot_mapping, const at::Tensor &kv_cache,
    const std::optional<at::Tensor> &error_count, const at::Tensor &index_k,
    const at::Tensor &index_weight, const at::Tensor &index_bias, const at::Tensor &index_cache,
    const std::optional<at::Tensor> &topk_fill, const std::optional<at::Tensor> &q,
    const std::optional<at::Tensor> &k_nope, const std::optional<at::Tensor> &k_pe,
    const std::optional<at::Tensor> &index_out, int64_t Q, int64_t C, int64_t R, double eps_q,
    double eps_kv, int64_t style, int64_t index_style, bool hadamard, double ln_eps,
    double amax_eps, int64_t index_scale, int64_t index_copies, int64_t index_copy_stride,
    int64_t cache_format, const std::optional<at::Tensor> &scale, int64_t fp8_conv,
    const std::optional<at::Tensor> &amax_out, int64_t tile_scale,
    const std::optional<at::Tensor> &kpe_cache);
std::tuple<at::Tensor, at::Tensor> indexer_q(
    const at::Tensor &q_idx, const at::Tensor &positions, const at::Tensor &cos_sin,
    const at::Tensor &weights, int64_t index_style, bool hadamard, double ln_eps,
    double amax_eps, int64_t index_scale, const std::optional<at::Tensor> &q_pe,
    int64_t q_pe_style, const std::optional<at::Tensor> &error_count);
void indexer_q_out(const at::Tensor &q_idx, const at::Tensor &positions,
                   const at::Tensor &cos_sin, const at::Tensor &weights, const at::Tensor &q_fp8,
                   const at::Tensor &w_out, int64_t index_style, bool hadamard, double ln_eps,
                   double amax_eps, int64_t index_scale, const std::optional<at::Tensor> &q_pe,
                   int64_t q_pe_style, const std::optional<at::Tensor> &error_count);
void rope_q(const at::Tensor &q, const at::Tensor &positions, const at::Tensor &cos_sin,
            int64_t R, int64_t style, const std::optional<at::Tensor> &error_count, bool head_norm,
            double head_norm_eps, const std::optional<at::Tensor> &q_out);
std::tuple<at::Tensor, at::Tensor, at::Tensor> moe_gate(
    const at::Tensor &logits, const std::optional<at::Tensor> &bias, int64_t top_k,
    int64_t n_group, int64_t topk_group, int64_t score_func, int64_t group_score,
    bool renormalize, double routed_scaling_factor, bool apply_routed_scaling, double eps,
    int64_t n_shared_experts, bool return_scores, std::optional<c10::ScalarType> weights_dtype);
void moe_gate_out(const at::Tensor &logits, const std::optional<at::Tensor> &bias,
                  const at::Tensor &weights, const at::Tensor &ids,
                  const std::optional<at::Tensor> &scores, int64_t top_k, int64_t n_group,
                  int64_t topk_group, int64_t score_func, int64_t group_score, bool renormalize,
                  double routed_scaling_factor, bool apply_routed_scaling, double eps,
                  int64_t n_shared_experts);
std::tuple<at::Tensor, at::Tensor, at::Tensor> moe_gate_hash(
    const at::Tensor &logits, const at::Tensor &tid2eid, const at::Tensor &token_ids,
    const std::optional<at::Tensor> &error_count, int64_t top_k, int64_t n_group,
    int64_t topk_group, int64_t score_func, int64_t group_score, bool renormalize,
    double routed_scaling_factor, bool apply_routed_scaling, double eps,
    int64_t n_shared_experts, bool return_scores, std::optional<c10::ScalarType> weights_dtype);
void moe_gate_hash_out(const at::Tensor &logits, const at::Tensor &tid2eid,
                       const at::Tensor &token_ids, const at::Tensor &weights,
                       const at::Tensor &ids, const std::optional<at::Tensor> &scores,
                       const std::optional<at::Tensor> &error_count, int64_t top_k,
                       int64_t n_group, int64_t topk_group, int64_t score_func,
                       int64_t group_score, bool renormalize, double routed_scaling_factor,
                       bool apply_routed_scaling, double eps, int64_t n_shared_experts);

// gemm_quant (mlafuse_torch_gemm_quant.cpp)
std::tuple<at::Tensor, at::Tensor> gemm_quant(const at::Tensor &x, int64_t q_format, int64_t q_scale,
                                              double q_eps);
void gemm_quant_out(const at::Tensor &x, const at::Tensor &q_data, const at::Tensor &q_scales, int64_t q_format,
                    int64_t q_scale, double q_eps);

}  // namespace mlafuse_torch
