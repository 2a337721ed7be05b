/*
 * gemm_writers.cuh — the CUDA side of the GEMM-input format table (src/gemm_format.h,
 * docs/gemm_formats.md): the scale arithmetic every format shares (the device twin of
 * mlaf_gemm_scale_of), and one mlaf_gemm_writer_of<F> per format, its group width and where it
 * keeps a group's scale.
 *
 * A kernel hands a writer the values of a group already rounded to the activation dtype; the
 * group's amax is a max over the lanes holding it (its W-wide vectors sit in consecutive lanes),
 * the values become e4m3 by mlaf_quant_e4m3 (x * 2^-e where that is exact, else the IEEE division;
 * cvt.rn.satfinite: the host's mlaf_f32_to_e4m3), and the group's first lane stores the scale.
 */
#pragma once

#include "../gemm_format.h"
#include "row_writers_fp8.cuh"

/* 2^e as an f32, e in [-149, 128] (128: +inf). */
__device__ __forceinline__ float mlaf_pow2_dev(int e) {
    return __uint_as_float(e >= -126 ? (uint32_t)(e + 127) << 23 : 1u << (e + 149));
}

/* ceil(log2 v) of a positive normal f32 or +inf (128) from its bits. */
__device__ __forceinline__ int mlaf_ceil_log2_dev(float v) {
    const uint32_t u = __float_as_uint(v);
    return u == 0x7f800000u ? 128 : (int)(u >> 23) - 127 + ((u & 0x7fffffu) != 0);
}

/* A group's scale from its NaN-free amax under rounding m (mlaf_gemm_scale), and its UE8M0 byte
 * (0 for F32): gemm_format.h's mlaf_gemm_scale_of, the same bits. */
__device__ __forceinline__ float mlaf_gemm_scale_dev(int m, float amax, float eps, uint32_t *byte) {
    if (m == MLAF_GEMM_SCALE_F32) {
        *byte = 0;
        return __fdiv_rn(fmaxf(amax, eps), 448.0f);
    }
    int e;
    const uint32_t a = __float_as_uint(amax);
    if (m == MLAF_GEMM_SCALE_UE8M0) {
        e = mlaf_ceil_log2_dev(__fdiv_rn(fmaxf(amax, eps), 448.0f)); /* a normal quotient: eps >= 1e-30 */
    } else if (a == 0x7f800000u) {
        e = 128;
    } else if (m == MLAF_GEMM_SCALE_MX_FLOOR) {
        e = max((int)(a >> 23) - 135, -127); /* 0 and subnormal amax: below -127 */
    } else {
        const uint32_t q = __float_as_uint(__fdiv_rn(amax, 448.0f));
        e = q >= 0x00800000u ? mlaf_ceil_log2_dev(__uint_as_float(q)) : q > 0x00400000u ? -126 : -127;
    }
    *byte = (uint32_t)(e + 127);
    return mlaf_pow2_dev(e);
}

/* Where a group's scale goes, from the fields of its format's row (gemm_format.c): group width G,
 * PACK groups per scales element, MN-major or token-major, f32 values or UE8M0 bytes; host and
 * device agree by the FORMAT_TABLE test (mlaf_gemm_writer_of's fields against the row). */
template <int G, int PACK, bool MN, bool F32> struct mlaf_gemm_layout {
    static constexpr int kGroup = G, kPack = PACK;
    static constexpr bool kMn = MN, kF32 = F32;
    /* group j of row t (`groups` a row); the packed layouts write the zero bytes past a row's last
     * group with that group */
    static __device__ __forceinline__ void put_scale(const mlaf_gemm_out_job &q, int64_t t, int64_t j,
                                                     int64_t groups, float s, uint32_t byte) {
        const int64_t c = j / PACK, e = MN ? c * q.scale_ld + t : t * q.scale_ld + c;
        if constexpr (F32) {
            static_cast<float *>(q.scales)[e] = s;
        } else {
            uint8_t *p = static_cast<uint8_t *>(q.scales) + e * PACK;
            p[j % PACK] = (uint8_t)byte;
            if (PACK > 1 && j == groups - 1)
                for (int64_t b = j % PACK + 1; b < PACK; b++) p[b] = 0;
        }
    }
};

/* The writer of format F: one specialization per row of the table, its layout's fields (the
 * row's group, pack, mn_major and scale dtype); MLAF_GEMM_NONE has none. */
template <int F> struct mlaf_gemm_writer_of;
template <> struct mlaf_gemm_writer_of<MLAF_GEMM_FP8_1X128> : mlaf_gemm_layout<128, 1, false, true> {};
template <> struct mlaf_gemm_writer_of<MLAF_GEMM_FP8_1X128_MN> : mlaf_gemm_layout<128, 1, true, true> {};
template <> struct mlaf_gemm_writer_of<MLAF_GEMM_FP8_1X128_UE8M0> : mlaf_gemm_layout<128, 4, true, false> {};
template <> struct mlaf_gemm_writer_of<MLAF_GEMM_MXFP8> : mlaf_gemm_layout<32, 1, false, false> {};
template <> struct mlaf_gemm_writer_of<MLAF_GEMM_FP8_1X128_CM> : mlaf_gemm_layout<128, 1, true, true> {};

/* Whether writer F's fields are its table row's (the dispatch's check, so that a specialization
 * out of step with its row fails the call instead of writing elsewhere). */
template <int F> static inline bool mlaf_gemm_writer_matches_row() {
    typedef mlaf_gemm_writer_of<F> Wr;
    const mlaf_gemm_format_info &r = mlaf_gemm_formats[F];
    return Wr::kGroup == r.group && Wr::kPack == r.pack && Wr::kMn == (r.mn_major != 0) &&
           Wr::kF32 == (r.scale_dt == MLAF_F32);
}

/* A group's scale stored where format q.format keeps it: the writers' put_scale, chosen at run time
 * (the row ops' quantized outputs take any format without an instance per format). */
template <int F = 1>
__device__ __forceinline__ void mlaf_gemm_put_scale_any(const mlaf_gemm_out_job &q, int64_t t, int64_t j,
                                                        int64_t groups, float s, uint32_t byte) {
    if constexpr (F < MLAF_GEMM_FORMAT_COUNT_) {
        if (q.format == F) mlaf_gemm_writer_of<F>::put_scale(q, t, j, groups, s, byte);
        else mlaf_gemm_put_scale_any<F + 1>(q, t, j, groups, s, byte);
    }
}

/* The row ops' quantized q_norm and k_nope (include/mlafuse/quant.h, mlaf_row_quant) as a writer of
 * the row kernels (row_writers.cuh): every vector hook quantizes the rounded values it is handed
 * when the part has a format (a uniform branch on the kernel parameters; calls without one pay
 * that test alone). A group's g / W vectors sit in consecutive lanes from a multiple of g / W (the
 * layouts start each part at a lane-0 slot or warp), so its amax is a shuffle max over them. The
 * generic kernel hands values one at a time, lane l value i = l + 32 k: each lane keeps its g / 32
 * values of the group in flight and the whole warp reduces once the group is complete (the parts
 * are multiples of g, so every lane makes the same calls). */
template <int F, int W, bool VEC>
__device__ __forceinline__ void mlaf_gemm_put_vec(const mlaf_gemm_out_job &q, int64_t t, int64_t v, int64_t K, bool ok,
                                                  const float *f);

template <typename T> struct mlaf_wr_gemm : mlaf_wr_base {
    struct params {
        mlaf_gemm_out_job q, k; /* format NONE: the part is not quantized */
    };
    const params &p_;
    int64_t t_;
    int32_t Q_, C_;
    float buf_[4];
    __device__ __forceinline__ mlaf_wr_gemm(const params &p, const mlaf_row_args &a, int64_t t,
                                            const mlaf_token_info &)
        : p_(p), t_(t), Q_(a.Q), C_(a.C) {
        buf_[0] = buf_[1] = buf_[2] = buf_[3] = 0.0f;
    }

    /* vector j (W values rounded to T, packed) of a part of K values. Not inlined: the row kernels
     * call the hooks at every slot of every layout, and one body per dtype keeps their code (and
     * compile time) near what it was without quantized outputs; the job comes by value, so no
     * kernel parameter is addressed (that would copy the parameter block to local memory). */
    static __device__ __noinline__ void put_vec(const mlaf_gemm_out_job q, int64_t t, int32_t K, int j, bool ok,
                                                uint4 v) {
        constexpr int W = mlaf_vec<T>::W;
        float f[W];
        mlaf_vec<T>::unpack(v, f);
        /* the row's e4m3 bytes aligned to W (the same for every lane of the warp: one row) */
        const bool vec = ((uintptr_t)(q.data + t * q.data_stride) & (W - 1)) == 0;
        put_any<W>(q, t, K, j, ok, f, vec);
    }
    /* mlaf_gemm_put_vec of the job's format (walked from F = 1), vector or byte stores */
    template <int W, int F = 1>
    static __device__ __forceinline__ void put_any(const mlaf_gemm_out_job &q, int64_t t, int32_t K, int j, bool ok,
                                                   const float *f, bool vec) {
        if constexpr (F < MLAF_GEMM_FORMAT_COUNT_) {
            if (q.format != F) put_any<W, F + 1>(q, t, K, j, ok, f, vec);
            else if (vec) mlaf_gemm_put_vec<F, W, true>(q, t, j, K, ok, f);
            else mlaf_gemm_put_vec<F, W, false>(q, t, j, K, ok, f);
        }
    }
    __device__ __forceinline__ void q(int j, bool ok, const float *, uint4 v) {
        if (p_.q.format != MLAF_GEMM_NONE) put_vec(p_.q, t_, Q_, j, ok, v);
    }
    __device__ __forceinline__ void kv(int j, bool ok, const float *, uint4 v) {
        if (p_.k.format != MLAF_GEMM_NONE) put_vec(p_.k, t_, C_, j, ok, v);
    }

    /* value i (fp32, not yet rounded) of a part, generic kernel: i = lane + 32 k, every lane */
    __device__ __forceinline__ void put1(const mlaf_gemm_out_job &q, int32_t K, int64_t i, float y) {
        buf_[0] = buf_[1], buf_[1] = buf_[2], buf_[2] = buf_[3], buf_[3] = mlaf_round_as<T>(y);
        const int lane = (int)(threadIdx.x & 31), n = q.group / 32; /* values a lane holds of a group */
        const int64_t g0 = (i - lane) / q.group * q.group;          /* the group's first value */
        if (i - lane + 32 != g0 + q.group) return;                  /* the group goes on */
        float m = 0.0f;
        for (int k = 4 - n; k < 4; k++) m = fmaxf(m, fabsf(buf_[k]));
        m = mlaf_warp_max(m, 32);
        uint32_t byte;
        const float s = mlaf_gemm_scale_dev((int)q.scale, m, q.eps, &byte);
        uint8_t *d = q.data + t_ * q.data_stride + g0 + lane;
        uint32_t u;
        mlaf_quant_e4m3<4>(buf_, s, &u); /* byte k: buf_[k]; the group's values are the last n */
        for (int k = 4 - n; k < 4; k++) d[32 * (k - (4 - n))] = (uint8_t)(u >> (8 * k));
        if (lane == 0) mlaf_gemm_put_scale_any(q, t_, g0 / q.group, K / q.group, s, byte);
    }
    __device__ __forceinline__ void q1(int64_t i, float y) {
        if (p_.q.format != MLAF_GEMM_NONE) put1(p_.q, Q_, i, y);
    }
    __device__ __forceinline__ void kv1(int64_t i, float y) {
        if (p_.k.format != MLAF_GEMM_NONE) put1(p_.k, C_, i, y);
    }
};

/* Vector v of row t of the output q: its W values f, already in the activation dtype (a format's
 * group is g / W consecutive vectors, held by consecutive lanes of one warp). The group's amax is
 * a shuffle max over those lanes, so every lane of the warp calls this the same number of times;
 * a lane with ok false (a vector past the row) takes part in the shuffle only. Then the scale,
 * the W e4m3 bytes at byte v W of q.data's row t (one W-byte store on the vector path: the row
 * aligned to W bytes) and, from the group's first lane, the scale where format F keeps it.
 * rms_norm_quant, gemm_quant and the row ops (mlaf_wr_gemm) all write through here: the same bytes
 * for the same values. */
template <int F, int W, bool VEC>
__device__ __forceinline__ void mlaf_gemm_put_vec(const mlaf_gemm_out_job &q, int64_t t, int64_t v, int64_t K, bool ok,
                                                  const float *f) {
    using WR = mlaf_gemm_writer_of<F>;
    constexpr int LANES = WR::kGroup / W; /* the group's vectors: consecutive lanes of one warp */
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < W; i++) m = fmaxf(m, ok ? fabsf(f[i]) : 0.0f); /* NaN ignored */
    m = mlaf_warp_max(m, LANES);
    if (!ok) return;
    uint32_t byte;
    const float s = mlaf_gemm_scale_dev((int)q.scale, m, q.eps, &byte);
    uint32_t u[W / 4];
    mlaf_quant_e4m3<W>(f, s, u);
    uint8_t *d = q.data + t * q.data_stride + v * W;
    if constexpr (VEC && W == 8) {
        *reinterpret_cast<uint2 *>(d) = make_uint2(u[0], u[1]);
    } else if constexpr (VEC) {
        *reinterpret_cast<uint32_t *>(d) = u[0];
    } else {
#pragma unroll
        for (int i = 0; i < W; i++) d[i] = (uint8_t)(u[i / 4] >> (8 * (i % 4)));
    }
    if (v % LANES == 0) WR::put_scale(q, t, v / LANES, K / WR::kGroup, s, byte);
}
