/*
 * baselines_cuda.cuh — what the unfused CUDA chains of `mlafuse bench` share (baselines_cuda_<op>.cu):
 * element loads and stores, the launch shape, the block sum, RoPE of rows and the dtype dispatch.
 *
 * The unfused CUDA chains `mlafuse bench` compares the fused ops with:
 * separate simple kernels, each its own launch and each writing a full intermediate tensor,
 * as engines run these steps today (extern "C"; only built with CUDA).
 *
 *   split_qk_norm  1. split: one block per row copies q, kv, pe into three dense tensors
 *                  2. RMSNorm q and 3. RMSNorm kv: one block per row, block-reduced sum
 *                  of squares, then x * rstd * w
 *   mla_kv_cache   the library's split_qk_norm, then 4. RoPE on k_pe (one thread per
 *                  pair) and 5. the cache write (plain: one block per token; fp8 formats: a
 *                  separate quantize-and-write kernel, a warp per token, like vLLM's
 *                  concat_and_cache_mla / concat_and_cache_ds_mla)
 *   rope_q         gather the rope columns into [T*H, R], rotate, scatter back (one thread
 *                  per element / pair)
 *   moe_gate       score (sigmoid, sqrt_softplus: per element; softmax: a warp per row), + bias, group
 *                  scores (a thread per group), group mask (a thread per row), masked fill,
 *                  top-k (a warp per row, k rounds of a warp argmax), gather, normalize,
 *                  scale (a thread per row)
 *
 * Launch shapes are the plain ones of such kernels (256 threads; a block or a warp per
 * row), not tuned: they stand for the status quo. Arithmetic is fp32 with one rounding per
 * store; RoPE uses explicitly rounded products so no FMA changes the bits. All indexing is
 * 64-bit. Every function returns 0 or the cudaError_t of its first failed launch.
 */
#ifndef MLAF_BASELINES_CUDA_CUH
#define MLAF_BASELINES_CUDA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bench.h"

namespace {

template <typename T> struct io;
template <> struct io<float> {
    static __device__ __forceinline__ float ld(const float *p) { return *p; }
    static __device__ __forceinline__ void st(float *p, float v) { *p = v; }
};
template <> struct io<__half> {
    static __device__ __forceinline__ float ld(const __half *p) { return __half2float(*p); }
    static __device__ __forceinline__ void st(__half *p, float v) { *p = __float2half_rn(v); }
};
template <> struct io<__nv_bfloat16> {
    static __device__ __forceinline__ float ld(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
    static __device__ __forceinline__ void st(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }
};

__device__ __forceinline__ int64_t ld_index(const void *p, mlaf_dtype dt, int64_t i) {
    return dt == MLAF_I64 ? static_cast<const int64_t *>(p)[i]
                          : static_cast<int64_t>(static_cast<const int32_t *>(p)[i]);
}

__device__ __forceinline__ float ld_any(const void *p, mlaf_dtype dt, int64_t i) {
    switch (dt) {
    case MLAF_F16: return io<__half>::ld(static_cast<const __half *>(p) + i);
    case MLAF_BF16: return io<__nv_bfloat16>::ld(static_cast<const __nv_bfloat16 *>(p) + i);
    default: return static_cast<const float *>(p)[i];
    }
}

__device__ __forceinline__ void st_any(void *p, mlaf_dtype dt, int64_t i, float v) {
    switch (dt) {
    case MLAF_F16: io<__half>::st(static_cast<__half *>(p) + i, v); break;
    case MLAF_BF16: io<__nv_bfloat16>::st(static_cast<__nv_bfloat16 *>(p) + i, v); break;
    default: static_cast<float *>(p)[i] = v; break;
    }
}

constexpr int kThreads = 256;

inline unsigned grid_for(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > (int64_t)1 << 30) b = (int64_t)1 << 30; /* kernels below are grid-stride */
    return (unsigned)b;
}
__device__ inline float block_sum(float v) {
    __shared__ float part[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) part[warp] = v;
    __syncthreads();
    const int nw = (blockDim.x + 31) >> 5;
    v = lane < nw ? part[lane] : 0.0f;
    if (warp == 0)
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __shared__ float total;
    if (threadIdx.x == 0) total = v;
    __syncthreads();
    return total;
}


/* ---- RoPE, cache write, rope_q gather / scatter ---------------------------------------------- */
/* rows x [R] at x + row * stride; row r uses position positions[r / per_pos]. */
template <typename T>
__global__ void rope_kernel(T *x, int64_t rows, int64_t stride, int64_t per_pos, int32_t R,
                            mlaf_rope_style style, const void *pos, mlaf_dtype pos_dt,
                            const float *cs, int64_t cs_stride, int64_t max_pos) {
    const int32_t half = R / 2;
    const int64_t n = rows * half;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = idx / half;
        const int32_t i = (int32_t)(idx % half);
        const int64_t p = ld_index(pos, pos_dt, r / per_pos);
        if (p < 0 || p >= max_pos) continue;
        const float c = cs[p * cs_stride + i], sn = cs[p * cs_stride + half + i];
        const int32_t i0 = style == MLAF_ROPE_NEOX ? i : 2 * i;
        const int32_t i1 = style == MLAF_ROPE_NEOX ? i + half : 2 * i + 1;
        T *row = x + r * stride;
        const float x0 = io<T>::ld(row + i0), x1 = io<T>::ld(row + i1);
        io<T>::st(row + i0, __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn)));
        io<T>::st(row + i1, __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, sn)));
    }
}

template <typename T>
int rope_rows(void *x, int64_t rows, int64_t stride, int64_t per_pos, const mlaf_rope_job *r,
              cudaStream_t s) {
    const int64_t n = rows * (r->R / 2);
    if (n == 0) return 0;
    rope_kernel<T><<<grid_for(n, kThreads), kThreads, 0, s>>>(
        static_cast<T *>(x), rows, stride, per_pos, r->R, r->style, r->positions, r->pos_dt,
        r->cos_sin, r->cos_sin_stride, r->max_pos);
    return (int)cudaGetLastError();
}

} // namespace

/* Dispatch on the activation dtype (validated by the library: f32, f16 or bf16). */
#define BY_DTYPE(dt, fn, ...)                                                      \
    ((dt) == MLAF_F16    ? fn<__half>(__VA_ARGS__)                                 \
     : (dt) == MLAF_BF16 ? fn<__nv_bfloat16>(__VA_ARGS__)                          \
                         : fn<float>(__VA_ARGS__))

#endif
