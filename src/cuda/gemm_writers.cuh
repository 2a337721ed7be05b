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
