/*
 * gemm_format.h — the GEMM-input formats (include/mlafuse/quant.h, docs/gemm_formats.md), one
 * descriptor row each, and the arithmetic every writer of them shares.
 *
 * Everything the library and its tools need to know about a format that is not its arithmetic
 * lives in its row of mlaf_gemm_formats[] (gemm_format.c): the name, the group width, the scale
 * roundings it takes, its scales tensor (dtype, orientation, groups per element) and the rules of
 * that tensor with their messages. Validation (mlaf_vcheck_gemm_out), the public name and shape
 * helpers, the tools' lists and the Python names read the rows.
 *
 * Beside this table, each format has, under the same enum value:
 *   - its CPU writer            src/cpu/gemm_writers.c    (mlaf_cpu_gemm_writer_of)
 *   - its CUDA writer           src/cuda/gemm_writers.cuh (mlaf_gemm_writer_of<F>, one specialization)
 *   - its oracle encoder        src/ref/ref_gemm_format.c (mlaf_ref_gemm_encoders[])
 * and its tests (tests/test_gemm_formats.c pins its byte offsets and fails when a row lacks a
 * piece). Adding a format is: the enum value (include/mlafuse/quant.h), a row here, those three,
 * and its tests. A table whose size is not MLAF_GEMM_FORMAT_COUNT_ does not compile.
 */
#ifndef MLAF_GEMM_FORMAT_H
#define MLAF_GEMM_FORMAT_H

#include "fp8.h"
#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mlaf_gemm_format_info {
    const char *name;        /* as mlaf_gemm_format_name returns it and the tools / Python spell it */
    const char *summary;     /* one line for lists and help texts */
    int32_t group;           /* g: values per scale (0: the NONE row) */
    unsigned scale_modes;    /* the roundings it takes, a mask of 1 << mlaf_gemm_scale */
    mlaf_dtype scale_dt;     /* dtype of its scales tensor */
    int32_t pack;            /* groups per scales element: 1, or 4 (UE8M0 bytes in an i32) */
    int32_t mn_major;        /* 1: scales [groups / pack, T], token-contiguous; 0: [T, groups / pack] */
    int32_t tma;             /* MN-major only, 1: TMA-aligned (leading stride a multiple of 4
                                elements >= round_up(T, 4), data 16-byte aligned); 0: ld >= T */
    const char *readers;     /* who reads it (docs/gemm_formats.md names the sources) */
} mlaf_gemm_format_info;

extern const mlaf_gemm_format_info mlaf_gemm_formats[MLAF_GEMM_FORMAT_COUNT_];

/* The row of f (NONE included), or NULL for a value outside the enum. */
static inline const mlaf_gemm_format_info *mlaf_gemm_format_row(mlaf_gemm_format f) {
    return (unsigned)f < MLAF_GEMM_FORMAT_COUNT_ ? &mlaf_gemm_formats[f] : (const mlaf_gemm_format_info *)0;
}

/* The one validation of a quantized output `name` (e.g. "q") of T rows of K values: its
 * format and rounding, eps, data [T, K] and the format's scales tensor (dtype, shape, leading
 * stride, alignment), each failure recorded with a message naming the argument; q NULL or format
 * NONE with no tensors: job->format = NONE. Overlaps of data and scales with each other are
 * checked here; with the op's other tensors by the caller (mlaf_vcheck_no_overlap). */
mlaf_status mlaf_vcheck_gemm_out(mlaf_context *ctx, const mlaf_gemm_out *q, const char *name, int64_t T, int64_t K,
                                 mlaf_gemm_out_job *job);

/* "fp8_1x128, fp8_1x128_mn, fp8_1x128_ue8m0 or mxfp8": every format but NONE, for messages. */
const char *mlaf_gemm_format_list(char *buf, size_t cap);
/* "f32 or ue8m0": the roundings of a mask, for messages. */
const char *mlaf_gemm_scale_list(unsigned mask, char *buf, size_t cap);

/* ---- the arithmetic every writer shares (the CUDA writers have device twins) -------------- */

/* 2^e exactly as an f32, e in [-149, 128] (128: +inf). */
static inline float mlaf_pow2_f32(int e) {
    return e >= -126 ? mlaf_bits_f32((uint32_t)(e + 127) << 23) : mlaf_bits_f32(1u << (e + 149));
}

/* The exponent e of a power-of-two scale s = 2^e from a group's amax (NaN-free, >= 0 or +inf):
 * UE8M0 ceil_log2(max(amax, eps) / 448) (the quotient is normal: eps >= 1e-30); MX_FLOOR
 * floor_log2(amax) - 8, MX_CEIL ceil_log2(amax / 448), both at least -127 (amax 0, subnormal
 * values and quotients included). +inf gives 128 in every mode. */
static inline int mlaf_gemm_pow2_exp(mlaf_gemm_scale m, float amax, float eps) {
    if (m == MLAF_GEMM_SCALE_UE8M0) return mlaf_ceil_log2_f32((amax > eps ? amax : eps) / 448.0f);
    uint32_t u = mlaf_f32_bits(amax);
    if (u == 0x7f800000u) return 128;
    if (m == MLAF_GEMM_SCALE_MX_FLOOR) {
        const int e = (int)(u >> 23) - 127 - 8; /* u < 2^23 (0, subnormal): below -127 */
        return e > -127 ? e : -127;
    }
    u = mlaf_f32_bits(amax / 448.0f);
    if (u >= 0x00800000u) return mlaf_ceil_log2_f32(mlaf_bits_f32(u));
    return u > 0x00400000u ? -126 : -127; /* a subnormal or zero quotient: above 2^-127 or not */
}

/* A group's scale s from its amax under rounding m, and in *byte its UE8M0 byte (e + 127 for
 * s = 2^e; 0 for F32, which has none). */
static inline float mlaf_gemm_scale_of(mlaf_gemm_scale m, float amax, float eps, uint8_t *byte) {
    if (m == MLAF_GEMM_SCALE_F32) {
        *byte = 0;
        return (amax > eps ? amax : eps) / 448.0f;
    }
    const int e = mlaf_gemm_pow2_exp(m, amax, eps);
    *byte = (uint8_t)(e + 127);
    return mlaf_pow2_f32(e);
}

/* Stores group j's scale of row t (G groups a row) where the format's row says (gemm_format.c):
 * scales element (j / pack, t) when MN-major, else (t, j / pack), at the scale_ld stride; f32
 * scales get the value, byte scales the UE8M0 byte (byte j mod pack of an element of `pack`
 * bytes, the last group of a row also writing the zero bytes after it). Host memory. */
static inline void mlaf_gemm_put_scale(const mlaf_gemm_out_job *q, int64_t t, int64_t j, int64_t G, float s,
                                       uint8_t byte) {
    const mlaf_gemm_format_info *r = &mlaf_gemm_formats[q->format];
    const int64_t c = j / r->pack, e = r->mn_major ? c * q->scale_ld + t : t * q->scale_ld + c;
    if (r->scale_dt == MLAF_F32) {
        ((float *)q->scales)[e] = s;
        return;
    }
    uint8_t *p = (uint8_t *)q->scales + e * r->pack;
    p[j % r->pack] = byte;
    if (j == G - 1)
        for (int64_t b = j % r->pack + 1; b < r->pack; b++) p[b] = 0;
}

#ifdef __cplusplus
}
#endif

#endif
