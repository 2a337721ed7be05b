/*
 * fp8.h — the fp8 numerics every fp8 cache writer shares (docs/kv_formats.md), for host code: e4m3
 * conversion, its decoding, and the power-of-two (UE8M0) scale exponent. Bit-level, so results
 * do not depend on compiler flags or the host's FP environment; the CUDA writers use
 * __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3), which this conversion reproduces.
 */
#ifndef MLAF_FP8_H
#define MLAF_FP8_H

#include <stdint.h>

#include "half.h"

/* f32 -> e4m3 (bias 7, 3 mantissa bits, no infinities, 0x7F / 0xFF NaN): round to nearest even;
 * |x| >= 464 and +-inf give +-448 (0x7E / 0xFE); NaN of either sign gives 0x7F; |x| <= 2^-10
 * gives a signed zero. */
static inline uint8_t mlaf_f32_to_e4m3(float x) {
    /* Branch-free (selects only: data-dependent branches cost more than the arithmetic in the
     * CPU writers' loops). The significand m (hidden bit set)
     * in units of 2^(e - 23) keeps 3 fraction bits from e = -6 up (normal codes) and fewer below
     * (subnormal codes, units of 2^-9), rounded to nearest even; a normal q of 16 carries into
     * the exponent by the addition itself. */
    const uint32_t u = mlaf_f32_bits(x), a = u & 0x7fffffffu, sign = (u >> 24) & 0x80u;
    const int32_t e = (int32_t)(a >> 23) - 127;
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    int32_t sh = e >= -6 ? 20 : 14 - e; /* 20 + (-6 - e) */
    sh = sh < 31 ? sh : 31;
    const uint32_t q0 = m >> sh, rem = m & ((1u << sh) - 1u), half = 1u << (sh - 1);
    const uint32_t q = q0 + (uint32_t)((rem > half) | ((rem == half) & (q0 & 1u)));
    uint32_t code = e >= -6 ? (uint32_t)((e + 7) << 3) + q - 8u : q;
    code = a >= 0x43e80000u ? 0x7eu : code; /* 464 = 1.8125 * 2^8 and above, +-inf */
    return (uint8_t)(a > 0x7f800000u ? 0x7fu : (sign | code));
}

/* Whether x / s may be computed as x * (1 / s) with the same bits for every x: s a positive
 * normal power of two whose reciprocal is normal (both are then the real x / s rounded once).
 * Sets *r = 1 / s. */
static inline int mlaf_pow2_recip(float s, float *r) {
    const uint32_t u = mlaf_f32_bits(s), ef = u >> 23;
    if ((u & 0x807fffffu) != 0u || ef < 1u || ef > 253u) return 0;
    *r = mlaf_bits_f32((254u - ef) << 23);
    return 1;
}

/* e4m3 -> f32, exact (0x7F / 0xFF: NaN). */
static inline float mlaf_e4m3_to_f32(uint8_t b) {
    const uint32_t sign = (uint32_t)(b & 0x80u) << 24, ef = (b >> 3) & 0xfu, mt = b & 7u;
    if (ef == 0xf && mt == 7) return mlaf_bits_f32(sign | 0x7fc00000u);
    if (ef == 0) { /* subnormal: mt * 2^-9 */
        if (mt == 0) return mlaf_bits_f32(sign);
        int k = 0;
        uint32_t m = mt;
        while (!(m & 8u)) m <<= 1, k++; /* normalize: m * 2^-9 = (m << k) * 2^(-9 - k) */
        return mlaf_bits_f32(sign | ((uint32_t)(127 - 6 - k) << 23) | ((m & 7u) << 20));
    }
    return mlaf_bits_f32(sign | ((ef - 7u + 127u) << 23) | (mt << 20));
}

/* ceil(log2(v)) of a positive normal f32 from its bits (docs/kv_formats.md): exponent - 127, plus 1 when the
 * mantissa is not zero; +inf gives 128. */
static inline int mlaf_ceil_log2_f32(float v) {
    const uint32_t u = mlaf_f32_bits(v);
    if ((u & 0x7fffffffu) == 0x7f800000u) return 128;
    return (int)((u >> 23) & 0xffu) - 127 + ((u & 0x7fffffu) != 0);
}

/* The UE8M0 exponent of an amax (DeepSeek's act_quant): ceil_log2(max(amax, 1e-4) / 448), the
 * division correctly rounded; the scale is 2^that. Computed without the division: for a = m 2^E
 * (m in [1, 2), a >= 1e-4), a / 448 = (m / 1.75) 2^(E - 8), and the rounded quotient is a power
 * of two only when m = 1.75 exactly (a float within half an ulp of 2^k / 7 is none), so the
 * exponent is E - 8 for m <= 1.75 and E - 7 above (the CUDA writers' mlaf_ue8m0_exp_dev is the
 * same; tests/test_fp8.c checks it against the division). +inf gives 128. */
static inline int mlaf_ue8m0_exponent(float amax) {
    const float floor = 1e-4f, a = amax > floor ? amax : floor; /* NaN amax: the floor */
    const uint32_t u = mlaf_f32_bits(a);
    if (u == 0x7f800000u) return 128;
    return (int)(u >> 23) - 127 - 8 + ((u & 0x7fffffu) > 0x600000u);
}

/* 2^-e exactly as an f32, for e in [-126, 149] (fp8_v4's multiplier: a UE8M0 exponent is at
 * least -22 and at most 128, where 2^-128 is subnormal). */
static inline float mlaf_exp2_neg_f32(int e) {
    return mlaf_bits_f32(e <= 126 ? (uint32_t)(127 - e) << 23 : 1u << (149 - e));
}

/* fp8_v4's scale byte of a UE8M0 exponent (docs/kv_formats.md, fp8_v4): clamp(e + 127, 0, 255). */
static inline uint8_t mlaf_ue8m0_byte(int e) {
    const int b = e + 127;
    return (uint8_t)(b < 0 ? 0 : b > 255 ? 255 : b);
}

/* The scale of an fp8_ds_mla tile from its amax (docs/kv_formats.md), mode an mlaf_tile_scale:
 * AMAX max(amax / 448, FLT_MIN); UE8M0 2^ceil_log2(max(amax, 1e-4) / 448); UE8M0_FLOOR_SCALED
 * 2^ceil_log2(max(amax / 448, 1e-4)). amax is NaN-free (a NaN-ignoring max). */
static inline float mlaf_tile_scale_of(float amax, int mode) {
    if (mode == 0) {
        const float s = amax / 448.0f, lo = 1.17549435e-38f;
        return s > lo ? s : lo;
    }
    int e;
    if (mode == 1) {
        e = mlaf_ue8m0_exponent(amax);
    } else {
        const float s = amax / 448.0f, lo = 1e-4f;
        e = mlaf_ceil_log2_f32(s > lo ? s : lo);
    }
    return mlaf_bits_f32((uint32_t)(e + 127) << 23); /* e in [-22, 128]: 2^128 is +inf */
}

#endif /* MLAF_FP8_H */
