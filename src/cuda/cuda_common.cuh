/*
 * cuda_common.cuh — what the CUDA kernels share: the op entry points, the device guard,
 * launch-error check, and dtype load/store helpers (fp32 in registers, one rounding at the
 * store). C++ only inside .cu files; the library's face stays extern "C".
 */
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "../internal.h"
mlaf_status mlaf_cuda_split_qk_norm(mlaf_context *ctx, const mlaf_norm_job *job);
mlaf_status mlaf_cuda_mla_kv_cache(mlaf_context *ctx, const mlaf_kv_cache_job *job);
mlaf_status mlaf_cuda_rope_q(mlaf_context *ctx, const mlaf_rope_q_job *job);
mlaf_status mlaf_cuda_moe_gate(mlaf_context *ctx, const mlaf_moe_gate_job *job);
}

/* Returns MLAF_ERR_DEVICE with a message if the last launch failed. */
mlaf_status mlaf_cuda_check_launch(mlaf_context *ctx, const char *op);

/* Makes ctx's device current for the scope of a call and restores the caller's after:
 * the op runs on the context's device without changing the calling thread's state. */
struct mlaf_cuda_device_guard {
    int prev = -1;
    bool switched = false;
    explicit mlaf_cuda_device_guard(const mlaf_context *ctx) {
        if (cudaGetDevice(&prev) == cudaSuccess && prev != ctx->cuda_device) {
            switched = cudaSetDevice(ctx->cuda_device) == cudaSuccess;
        }
    }
    ~mlaf_cuda_device_guard() {
        if (switched) (void)cudaSetDevice(prev);
    }
};

/* ---- element access by dtype ---------------------------------------------------------- */
template <typename T> struct mlaf_elem;
template <> struct mlaf_elem<float> {
    static __device__ __forceinline__ float load(float v) { return v; }
    static __device__ __forceinline__ float store(float v) { return v; }
};
template <> struct mlaf_elem<__half> {
    static __device__ __forceinline__ float load(__half v) { return __half2float(v); }
    static __device__ __forceinline__ __half store(float v) { return __float2half_rn(v); }
};
template <> struct mlaf_elem<__nv_bfloat16> {
    static __device__ __forceinline__ float load(__nv_bfloat16 v) { return __bfloat162float(v); }
    static __device__ __forceinline__ __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};

template <typename T> __device__ __forceinline__ float mlaf_ld(const T *p) {
    return mlaf_elem<T>::load(*p);
}
template <typename T> __device__ __forceinline__ void mlaf_st(T *p, float v) {
    *p = mlaf_elem<T>::store(v);
}

/* Loads element i of a weight vector stored in f32 or in the activation dtype T. */
template <typename T>
__device__ __forceinline__ float mlaf_ld_weight(const void *w, bool w_is_f32, int64_t i) {
    return w_is_f32 ? static_cast<const float *>(w)[i] : mlaf_ld(static_cast<const T *>(w) + i);
}
