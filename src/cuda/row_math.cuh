/*
 * row_math.cuh — the arithmetic the row kernels and rope_q share, in the one order every shape
 * and both backends use: sums of squares, the warp reduction, rstd (IEEE sqrt and division), the
 * RoPE rotation without FMA contraction, and the index loads.
 */
#pragma once

#include "row_vec.cuh"

/* Sum of squares of one vector's W values, in the one order every shape uses. */
template <int W> __device__ __forceinline__ float mlaf_sumsq(const float *f) {
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < W; k++) acc = fmaf(f[k], f[k], acc);
    return acc;
}

__device__ __forceinline__ float mlaf_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* 1 / sqrt(mean + eps) with correctly rounded sqrt and division. */
__device__ __forceinline__ float mlaf_rstd(float sumsq, int32_t n, float eps) {
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sumsq, (float)n), eps)));
}

/* The rotation shared by keys and queries: no contraction into FMA, so every caller gets the
 * same bits. x0 of a pair: x0*c - x1*s; x1: x1*c + x0*s. */
__device__ __forceinline__ float mlaf_rope_x0(float x0, float x1, float c, float s) {
    return __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
}
__device__ __forceinline__ float mlaf_rope_x1(float x0, float x1, float c, float s) {
    return __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
}

__device__ __forceinline__ int64_t mlaf_ld_index(const void *p, int32_t is64, int64_t t) {
    return is64 ? static_cast<const int64_t *>(p)[t] : (int64_t) static_cast<const int32_t *>(p)[t];
}
