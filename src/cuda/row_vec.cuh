/*
 * row_vec.cuh — the row kernels' vectors and conversions: 16-byte vectors of the latent dtype
 * unpacked to fp32 and packed back (round to nearest even, once), weight vectors stored as the
 * latent dtype or f32, and stores of fp32 values into a buffer of run-time dtype (the cache).
 */
#pragma once

#include "cuda_common.cuh"

#include <type_traits>

/* p and every step of stride_bytes aligned to a bytes (the host's check before vector access). */
static inline bool mlaf_aligned(const void *p, int64_t stride_bytes, int64_t a) {
    return ((uintptr_t)p % (uintptr_t)a) == 0 && (stride_bytes % a) == 0;
}

/* The mlaf_dtype of a kernel element type. */
template <typename T> constexpr mlaf_dtype mlaf_dtype_of() {
    return sizeof(T) == 4 ? MLAF_F32 : std::is_same<T, __half>::value ? MLAF_F16 : MLAF_BF16;
}

/* A 16-byte vector of W values of T. */
template <typename T> struct mlaf_vec;
template <> struct mlaf_vec<float> {
    static constexpr int W = 4;
    static __device__ __forceinline__ void unpack(const uint4 &v, float *f) {
        f[0] = __uint_as_float(v.x);
        f[1] = __uint_as_float(v.y);
        f[2] = __uint_as_float(v.z);
        f[3] = __uint_as_float(v.w);
    }
    static __device__ __forceinline__ uint4 pack(const float *f) {
        return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]),
                          __float_as_uint(f[3]));
    }
};
template <> struct mlaf_vec<__nv_bfloat16> {
    static constexpr int W = 8;
    static __device__ __forceinline__ float lo(uint32_t u) { return __uint_as_float(u << 16); }
    static __device__ __forceinline__ float hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }
    static __device__ __forceinline__ void unpack(const uint4 &v, float *f) {
        f[0] = lo(v.x), f[1] = hi(v.x), f[2] = lo(v.y), f[3] = hi(v.y);
        f[4] = lo(v.z), f[5] = hi(v.z), f[6] = lo(v.w), f[7] = hi(v.w);
    }
    static __device__ __forceinline__ uint32_t pack2(float a, float b) {
        __nv_bfloat162 h = __floats2bfloat162_rn(a, b); /* .x = a (low half) */
        return *reinterpret_cast<uint32_t *>(&h);
    }
    static __device__ __forceinline__ uint4 pack(const float *f) {
        return make_uint4(pack2(f[0], f[1]), pack2(f[2], f[3]), pack2(f[4], f[5]), pack2(f[6], f[7]));
    }
};
template <> struct mlaf_vec<__half> {
    static constexpr int W = 8;
    static __device__ __forceinline__ void unpack2(uint32_t u, float *f) {
        __half2 h = *reinterpret_cast<__half2 *>(&u);
        float2 p = __half22float2(h);
        f[0] = p.x;
        f[1] = p.y;
    }
    static __device__ __forceinline__ void unpack(const uint4 &v, float *f) {
        unpack2(v.x, f), unpack2(v.y, f + 2), unpack2(v.z, f + 4), unpack2(v.w, f + 6);
    }
    static __device__ __forceinline__ uint32_t pack2(float a, float b) {
        __half2 h = __floats2half2_rn(a, b);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    static __device__ __forceinline__ uint4 pack(const float *f) {
        return make_uint4(pack2(f[0], f[1]), pack2(f[2], f[3]), pack2(f[4], f[5]), pack2(f[6], f[7]));
    }
};

/* W consecutive weights starting at element i (a multiple of W), stored as T or f32; the
 * base is 16-byte aligned on the vector paths. Weights are read-only for the whole kernel. */
template <typename T>
__device__ __forceinline__ void mlaf_ld_weights_vec(const void *w, bool f32, int64_t i, float *f) {
    constexpr int W = mlaf_vec<T>::W;
    if (f32) {
        const float4 *p = reinterpret_cast<const float4 *>(static_cast<const float *>(w) + i);
#pragma unroll
        for (int k = 0; k < W / 4; k++) {
            float4 x = __ldg(p + k);
            f[4 * k] = x.x, f[4 * k + 1] = x.y, f[4 * k + 2] = x.z, f[4 * k + 3] = x.w;
        }
    } else {
        uint4 x = __ldg(reinterpret_cast<const uint4 *>(static_cast<const T *>(w) + i));
        mlaf_vec<T>::unpack(x, f);
    }
}

/* One value into a buffer of run-time dtype dt, rounded once. */
__device__ __forceinline__ void mlaf_st_dt(void *base, mlaf_dtype dt, int64_t i, float v) {
    if (dt == MLAF_F32)
        static_cast<float *>(base)[i] = v;
    else if (dt == MLAF_BF16)
        static_cast<__nv_bfloat16 *>(base)[i] = __float2bfloat16_rn(v);
    else
        static_cast<__half *>(base)[i] = __float2half_rn(v);
}

/* W values (W = 4 or 8) into a buffer of run-time dtype dt at element i; the address is aligned
 * to min(16, W * element size) bytes on the vector paths. */
template <int W>
__device__ __forceinline__ void mlaf_st_dt_vec(void *base, mlaf_dtype dt, int64_t i, const float *f) {
    if (dt == MLAF_F32) {
        float4 *p = reinterpret_cast<float4 *>(static_cast<float *>(base) + i);
#pragma unroll
        for (int k = 0; k < W / 4; k++)
            p[k] = make_float4(f[4 * k], f[4 * k + 1], f[4 * k + 2], f[4 * k + 3]);
    } else {
        uint32_t u[W / 2];
#pragma unroll
        for (int k = 0; k < W / 2; k++)
            u[k] = dt == MLAF_BF16 ? mlaf_vec<__nv_bfloat16>::pack2(f[2 * k], f[2 * k + 1])
                                   : mlaf_vec<__half>::pack2(f[2 * k], f[2 * k + 1]);
        uint16_t *p = static_cast<uint16_t *>(base) + i;
        if constexpr (W == 8)
            *reinterpret_cast<uint4 *>(p) = make_uint4(u[0], u[1], u[2], u[3]);
        else
            *reinterpret_cast<uint2 *>(p) = make_uint2(u[0], u[1]);
    }
}

/* Two adjacent values as one store (element index even, so the pair is aligned to its size). */
template <typename T> __device__ __forceinline__ void mlaf_st2(T *p, float y0, float y1) {
    if constexpr (sizeof(T) == 4)
        *reinterpret_cast<float2 *>(p) = make_float2(y0, y1);
    else
        *reinterpret_cast<uint32_t *>(p) = mlaf_vec<T>::pack2(y0, y1);
}

/* Same-size integer of T: copies that must be bit-exact (k_pe in split_qk_norm). */
template <typename T> struct mlaf_bits;
template <> struct mlaf_bits<float> { typedef uint32_t type; };
template <> struct mlaf_bits<__half> { typedef uint16_t type; };
template <> struct mlaf_bits<__nv_bfloat16> { typedef uint16_t type; };
