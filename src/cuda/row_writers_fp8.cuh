/*
 * row_writers_fp8.cuh — the fp8 cache writers of mla_kv_cache (docs/kv_formats.md), the writer concept of
 * row_writers.cuh:
 *
 *   mlaf_wr_fp8      per-tensor e4m3 rows [C + R] (or C here and R in a separate kpe array),
 *                    one scale read from device memory, x / scale or x * scale; optional
 *                    amax_out (each warp's max |x|, one atomicMax on the bits per warp and row).
 *   mlaf_wr_ds_mla   the fp8_ds_mla record [C e4m3 | C/128 f32 tile scales | R bf16 rope]: a
 *                    tile of 128 values is 16 lanes' vectors (bf16), its amax a half-warp max;
 *                    lane 0 of the tile stores the scale.
 *   mlaf_wr_v4       DeepSeek-V4's planar page (docs/kv_formats.md, fp8_v4; C = 512 with the rope tail 64): data
 *                    rows of 576 B [448 e4m3 | 64 bf16], then scale rows of 8 B [7 UE8M0 | 0]. A
 *                    64-value block is 8 lanes' vectors, its amax an 8-lane max; the block's first
 *                    lane stores its scale byte (block 7's, the zero, by the tail's first lane).
 *
 * Every value is the packed (latent-dtype-rounded) value the dense output stores, unpacked to
 * fp32; conversion by cvt.rn.satfinite.e4m3x2 (round to nearest even, saturating, NaN 0x7F:
 * the host's mlaf_f32_to_e4m3). The generic shape's per-value hooks (kv1, pe1) give lane l the
 * values l, l + 32, ...: mlaf_wr_ds_mla keeps a tile's four values per lane and quantizes them
 * on the fourth (C % 128 == 0, so every lane takes the same calls).
 */
#pragma once

#include <cuda_fp8.h>

#include "row_writers.cuh"

/* Two values to two e4m3 bytes (x in the low byte). */
__device__ __forceinline__ uint32_t mlaf_e4m3x2(float x, float y) {
    return (uint32_t)__nv_cvt_float2_to_fp8x2(make_float2(x, y), __NV_SATFINITE, __NV_E4M3);
}

/* W e4m3 bytes of W values (W = 4 or 8) at an address aligned to W. */
template <int W> __device__ __forceinline__ void mlaf_st_e4m3(uint8_t *p, const float *q) {
    uint32_t u[W / 4];
#pragma unroll
    for (int k = 0; k < W / 4; k++)
        u[k] = mlaf_e4m3x2(q[4 * k], q[4 * k + 1]) | (mlaf_e4m3x2(q[4 * k + 2], q[4 * k + 3]) << 16);
    if constexpr (W == 8) *reinterpret_cast<uint2 *>(p) = make_uint2(u[0], u[1]);
    else *reinterpret_cast<uint32_t *>(p) = u[0];
}

__device__ __forceinline__ float mlaf_warp_max(float m, int width) {
    for (int o = width / 2; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    return m;
}

/* ---- per-tensor fp8 ----------------------------------------------------------------------- */
template <typename T> struct mlaf_wr_fp8 : mlaf_wr_base {
    struct params {
        void *cache, *kpe;      /* e4m3 bytes; kpe NULL: the rope part follows the kv part */
        int64_t s0, s1, k0, k1; /* bytes per block, per slot (cache; kpe) */
        const float *scale;
        float *amax;            /* or NULL */
        int32_t mul;            /* 1: x * scale, 0: x / scale */
    };
    uint8_t *kv_, *pe_;
    float s_, m_;
    float *amax_;
    bool mul_;
    __device__ __forceinline__ mlaf_wr_fp8(const params &p, const mlaf_row_args &a, int64_t,
                                           const mlaf_token_info &ti) {
        kv_ = pe_ = nullptr, s_ = 1.0f, m_ = 0.0f, amax_ = p.amax, mul_ = p.mul != 0;
        if (ti.cache) {
            kv_ = static_cast<uint8_t *>(p.cache) + mlaf_token_row(a, ti.slot, p.s0, p.s1);
            pe_ = p.kpe ? static_cast<uint8_t *>(p.kpe) + mlaf_token_row(a, ti.slot, p.k0, p.k1) : kv_ + a.C;
            s_ = __ldg(p.scale);
        }
    }
    __device__ __forceinline__ float quant(float x) { return mul_ ? __fmul_rn(x, s_) : __fdiv_rn(x, s_); }
    __device__ __forceinline__ void put(uint8_t *p, uint4 v) {
        constexpr int W = mlaf_vec<T>::W;
        float g[W];
        mlaf_vec<T>::unpack(v, g);
#pragma unroll
        for (int k = 0; k < W; k++) m_ = fmaxf(m_, fabsf(g[k])), g[k] = quant(g[k]);
        mlaf_st_e4m3<W>(p, g);
    }
    __device__ __forceinline__ void kv(int j, bool ok, const float *, uint4 v) {
        if (ok && kv_) put(kv_ + (int64_t)j * mlaf_vec<T>::W, v);
    }
    __device__ __forceinline__ void pe(int j, bool ok, const float *, uint4 v) {
        if (ok && pe_) put(pe_ + (int64_t)j * mlaf_vec<T>::W, v);
    }
    __device__ __forceinline__ void put1(uint8_t *p, float y) {
        const float x = mlaf_round_as<T>(y);
        m_ = fmaxf(m_, fabsf(x));
        *p = (uint8_t)mlaf_e4m3x2(quant(x), 0.0f);
    }
    __device__ __forceinline__ void kv1(int64_t i, float y) {
        if (kv_) put1(kv_ + i, y);
    }
    __device__ __forceinline__ void pe1(int64_t i, float y, uint32_t) {
        if (pe_) put1(pe_ + i, y);
    }
    /* every lane of every warp of the row calls finish */
    __device__ __forceinline__ void finish(float, float, int) {
        if (!amax_) return;
        const float m = mlaf_warp_max(m_, 32);
        if ((threadIdx.x & 31) == 0 && m > 0.0f) atomicMax(reinterpret_cast<int *>(amax_), __float_as_int(m));
    }
};

/* The UE8M0 exponent ceil_log2(max(amax, 1e-4) / 448) of a NaN-free amax (+inf: 128), without
 * the division: fp8.h's mlaf_ue8m0_exponent, which says why it is exact. */
__device__ __forceinline__ int mlaf_ue8m0_exp_dev(float amax) {
    const uint32_t u = __float_as_uint(fmaxf(amax, 1e-4f));
    return u == 0x7f800000u ? 128 : (int)(u >> 23) - 135 + ((u & 0x7fffffu) > 0x600000u);
}

/* e4m3(v / s) of N values (4 or 8) as N / 4 little-endian words, |v| <= 448 s (the values a scale was
 * taken from). Three forms, one per call (uniform over a group), the same bytes as e4m3(RN(v / s)):
 *   - s a normal power of two with a normal reciprocal: v * (1 / s), the same real rounded once;
 *   - s in [2^-97, 2^126): q0 = RN(v r) with r = RN(1 / s), then RN(q0 + (v - q0 s) r) by two fmas
 *     (Markstein: the correctly rounded quotient while v - q0 s does not underflow; where it does,
 *     |v / s| < 2^-16 and both give e4m3 zero; q0 kept when it is zero, for the sign of -0).
 *     dev/fp8_quotient.c checks the bytes over every bf16 v and every bf16 amax, and random f32;
 *   - otherwise the IEEE division. */
template <int N> __device__ __forceinline__ void mlaf_quant_e4m3(const float *v, float s, uint32_t *out) {
    const uint32_t u = __float_as_uint(s), ef = u >> 23;
    float y[N];
    if ((u & 0x807fffffu) == 0u && ef >= 1u && ef <= 253u) {
        const float r = __uint_as_float((254u - ef) << 23);
#pragma unroll
        for (int k = 0; k < N; k++) y[k] = __fmul_rn(v[k], r);
    } else if (ef >= 30u && ef <= 252u) {
        const float r = __frcp_rn(s);
#pragma unroll
        for (int k = 0; k < N; k++) {
            const float q0 = __fmul_rn(v[k], r);
            y[k] = q0 == 0.0f ? q0 : __fmaf_rn(__fmaf_rn(-q0, s, v[k]), r, q0);
        }
    } else {
#pragma unroll
        for (int k = 0; k < N; k++) y[k] = __fdiv_rn(v[k], s);
    }
#pragma unroll
    for (int w = 0; w < N / 4; w++)
        out[w] = mlaf_e4m3x2(y[4 * w], y[4 * w + 1]) | (mlaf_e4m3x2(y[4 * w + 2], y[4 * w + 3]) << 16);
}

/* ---- fp8_ds_mla (bf16 latent) -------------------------------------------------------------- */
/* The tile scale from a NaN-free amax, mode an mlaf_tile_scale (fp8.h's mlaf_tile_scale_of). */
__device__ __forceinline__ float mlaf_tile_scale_dev(float amax, int mode) {
    if (mode == 0) return fmaxf(__fdiv_rn(amax, 448.0f), 1.17549435e-38f);
    int e;
    if (mode == 1) {
        e = mlaf_ue8m0_exp_dev(amax);
    } else {
        const uint32_t u = __float_as_uint(fmaxf(__fdiv_rn(amax, 448.0f), 1e-4f));
        e = (u & 0x7fffffffu) == 0x7f800000u ? 128 : (int)((u >> 23) & 0xffu) - 127 + ((u & 0x7fffffu) != 0);
    }
    return __uint_as_float((uint32_t)(e + 127) << 23);
}

struct mlaf_wr_ds_mla : mlaf_wr_base {
    struct params {
        void *cache;
        int64_t s0, s1; /* bytes, multiples of 16 */
        int32_t mode;   /* mlaf_tile_scale */
    };
    uint8_t *row_;
    int32_t C_, mode_;
    float hold_[4];
    __device__ __forceinline__ mlaf_wr_ds_mla(const params &p, const mlaf_row_args &a, int64_t,
                                              const mlaf_token_info &ti) {
        row_ = ti.cache ? static_cast<uint8_t *>(p.cache) + mlaf_token_row(a, ti.slot, p.s0, p.s1) : nullptr;
        C_ = a.C, mode_ = p.mode;
    }
    /* kv vector j (8 values); the 16 lanes of its tile call together */
    __device__ __forceinline__ void kv(int j, bool ok, const float *, uint4 v) {
        float g[8];
        mlaf_vec<__nv_bfloat16>::unpack(v, g);
        float m = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) m = fmaxf(m, ok ? fabsf(g[k]) : 0.0f);
        m = mlaf_warp_max(m, 16);
        if (!ok || !row_) return;
        const float s = mlaf_tile_scale_dev(m, mode_);
        uint32_t u[2];
        mlaf_quant_e4m3<8>(g, s, u);
        *reinterpret_cast<uint2 *>(row_ + (int64_t)j * 8) = make_uint2(u[0], u[1]);
        if ((j & 15) == 0) *reinterpret_cast<float *>(row_ + C_ + 4 * (j >> 4)) = s;
    }
    __device__ __forceinline__ void pe(int j, bool ok, const float *, uint4 v) {
        if (!ok || !row_) return;
        uint8_t *p = row_ + C_ + C_ / 32 + 16 * (int64_t)j;
        if ((((uintptr_t)p) & 15) == 0) {
            *reinterpret_cast<uint4 *>(p) = v;
        } else { /* C + C/32 is a multiple of 4 */
            uint32_t *q = reinterpret_cast<uint32_t *>(p);
            q[0] = v.x, q[1] = v.y, q[2] = v.z, q[3] = v.w;
        }
    }
    /* generic shape: value i = 32 n + lane, n = 0 .. C/32 - 1 in order; tile n / 4 */
    __device__ __forceinline__ void kv1(int64_t i, float y) {
        const int n = (int)(i >> 5);
        hold_[n & 3] = mlaf_round_as<__nv_bfloat16>(y);
        if ((n & 3) != 3) return;
        float m = fmaxf(fmaxf(fabsf(hold_[0]), fabsf(hold_[1])), fmaxf(fabsf(hold_[2]), fabsf(hold_[3])));
        m = mlaf_warp_max(m, 32);
        if (!row_) return;
        const float s = mlaf_tile_scale_dev(m, mode_);
#pragma unroll
        for (int k = 0; k < 4; k++) row_[i - 32 * (3 - k)] = (uint8_t)mlaf_e4m3x2(__fdiv_rn(hold_[k], s), 0.0f);
        if ((threadIdx.x & 31) == 0) *reinterpret_cast<float *>(row_ + C_ + 4 * (n >> 2)) = s;
    }
    __device__ __forceinline__ void pe1(int64_t i, float y, uint32_t) {
        if (row_) reinterpret_cast<__nv_bfloat16 *>(row_ + C_ + C_ / 32)[i] = __float2bfloat16_rn(y);
    }
};

/* ---- fp8_v4 (bf16 latent, C = 512, kv_rope_tail 64) ---------------------------------------- */
struct mlaf_wr_v4 : mlaf_wr_base {
    static constexpr bool kTailOnly = true; /* C = 512 with the rope tail 64, R = 0 (validation) */
    struct params {
        void *cache;
        int64_t s0; /* page stride, bytes (a multiple of 16) */
    };
    uint8_t *data_, *scale_;
    float hold_[2];
    __device__ __forceinline__ mlaf_wr_v4(const params &p, const mlaf_row_args &a, int64_t,
                                          const mlaf_token_info &ti) {
        data_ = scale_ = nullptr;
        if (!ti.cache) return;
        uint8_t *page = static_cast<uint8_t *>(p.cache) + mlaf_token_row(a, ti.slot, p.s0, 0);
        const int64_t o = mlaf_token_row(a, ti.slot, 0, 1);
        data_ = page + o * 576;
        scale_ = page + a.block_size * 576 + o * 8;
    }
    /* 2^-e, exact (e in [-22, 128]) */
    static __device__ __forceinline__ float mul_of(int e) {
        return __uint_as_float(e <= 126 ? (uint32_t)(127 - e) << 23 : 1u << (149 - e));
    }
    static __device__ __forceinline__ uint32_t byte_of(int e) { return (uint32_t)min(max(e + 127, 0), 255); }
    /* kv vector j = 32 g + lane (8 values); every lane of the warp calls with the same g */
    __device__ __forceinline__ void kv(int j, bool ok, const float *, uint4 v) {
        float g[8];
        mlaf_vec<__nv_bfloat16>::unpack(v, g);
        const bool nope = ok && j < 56;
        float m = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) m = fmaxf(m, nope ? fabsf(g[k]) : 0.0f);
        m = mlaf_warp_max(m, 8);
        if (!data_ || j >= 64) return;
        const int e = mlaf_ue8m0_exp_dev(m);
        if (nope) {
            const float mul = mul_of(e);
#pragma unroll
            for (int k = 0; k < 8; k++) g[k] = __fmul_rn(g[k], mul);
            mlaf_st_e4m3<8>(data_ + 8 * (int64_t)j, g);
        } else if (ok) {
            *reinterpret_cast<uint4 *>(data_ + 448 + 16 * (j - 56)) = v;
        }
        if ((j & 7) == 0) scale_[j >> 3] = (uint8_t)(nope ? byte_of(e) : 0u); /* block 7: the zero byte */
    }
    /* generic shape: value i = 32 n + lane; n = 0 .. 13 in order for the NoPE values (block n / 2),
     * then the tail values one by one */
    __device__ __forceinline__ void kv1(int64_t i, float y) {
        if (i >= 448) {
            if (data_) reinterpret_cast<__nv_bfloat16 *>(data_ + 448)[i - 448] = __float2bfloat16_rn(y);
            return;
        }
        const int n = (int)(i >> 5);
        hold_[n & 1] = mlaf_round_as<__nv_bfloat16>(y);
        if ((n & 1) == 0) return;
        const float m = mlaf_warp_max(fmaxf(fabsf(hold_[0]), fabsf(hold_[1])), 32);
        if (!data_) return;
        const int e = mlaf_ue8m0_exp_dev(m);
        const float mul = mul_of(e);
        data_[i - 32] = (uint8_t)mlaf_e4m3x2(__fmul_rn(hold_[0], mul), 0.0f);
        data_[i] = (uint8_t)mlaf_e4m3x2(__fmul_rn(hold_[1], mul), 0.0f);
        if ((threadIdx.x & 31) == 0) {
            scale_[n >> 1] = (uint8_t)byte_of(e);
            if ((n >> 1) == 6) scale_[7] = 0;
        }
    }
};

/* ---- their rows of the format table (row_writers.cuh, mlaf_kv_writer_of) ------------------- */
template <> struct mlaf_kv_writer_of<MLAF_KV_FP8> {
    template <typename T> using type = mlaf_wr_fp8<T>;
    template <typename T> static constexpr bool kLatent = true;
    static constexpr bool kDsa = true;
    template <typename T> static bool params(const mlaf_kv_cache_job *job, typename mlaf_wr_fp8<T>::params *p) {
        p->cache = job->cache, p->kpe = job->kpe;
        p->s0 = job->cache_s0, p->s1 = job->cache_s1, p->k0 = job->kpe_s0, p->k1 = job->kpe_s1;
        p->scale = job->scale, p->amax = job->amax_out, p->mul = job->conv == MLAF_FP8_MUL;
        return mlaf_kv_cache_vec_ok(job, mlaf_vec<T>::W, 1);
    }
};

template <> struct mlaf_kv_writer_of<MLAF_KV_FP8_DS_MLA> {
    template <typename T> using type = mlaf_wr_ds_mla;
    template <typename T> static constexpr bool kLatent = std::is_same<T, __nv_bfloat16>::value;
    static constexpr bool kDsa = true;
    template <typename T> static bool params(const mlaf_kv_cache_job *job, mlaf_wr_ds_mla::params *p) {
        p->cache = job->cache, p->s0 = job->cache_s0, p->s1 = job->cache_s1, p->mode = (int32_t)job->tile_scale;
        return true; /* 16-byte aligned records (validation) */
    }
};

template <> struct mlaf_kv_writer_of<MLAF_KV_FP8_V4> {
    template <typename T> using type = mlaf_wr_v4;
    template <typename T> static constexpr bool kLatent = std::is_same<T, __nv_bfloat16>::value;
    static constexpr bool kDsa = false; /* DeepSeek-V4 has no indexer of this kind (validation) */
    template <typename T> static bool params(const mlaf_kv_cache_job *job, mlaf_wr_v4::params *p) {
        p->cache = job->cache, p->s0 = job->cache_s0;
        return true; /* 16-byte aligned pages (validation) */
    }
};
