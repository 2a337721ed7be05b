/*
 * index_math.h — the DSA indexer's per-row arithmetic (docs/dsa.md) for host code: the CPU backend
 * and the oracle's encoder. The CUDA kernels (src/cuda/index_row.cuh) compute the same steps in
 * the same order, lane l of a warp holding values [4 l, 4 l + 4), so both backends give the same
 * bits:
 *   sums       each lane sums its four values in order, then the warp's xor butterfly
 *              (offsets 16, 8, 4, 2, 1): mlaf_index_sum128
 *   LayerNorm  mu = sum(x) / 128; d = x - mu; var = sum(d * d) / 128 (products, no FMA);
 *              y = ((d * rstd) * w) + b with rstd = 1 / sqrt(var + eps)
 *   RoPE       dims [0, 64), pairs by style, x0*c - x1*s and x1*c + x0*s (no FMA)
 *   Hadamard   butterflies (a + b, a - b) over strides 1, 2, .., 64, then * f32(128^-0.5)
 *   scale      UE8M0 2^ceil_log2(max(amax, eps) / 448) or F32 max(amax, eps) / 448
 * Each step's values are rounded to the row's dtype before the next one reads them.
 */
#ifndef MLAF_INDEX_MATH_H
#define MLAF_INDEX_MATH_H

#include <math.h>
#include <stdint.h>

#include "fp8.h"
#include "half.h"
#include "internal.h"

#define MLAF_IDX_D 128

/* The warp-order sum of 128 values (see the opening comment). After a butterfly step lanes l and
 * l ^ o hold the same bits (s[l] + s[l ^ o]: addition commutes exactly), so each step needs only
 * the lower half: lane l < o takes s[l] + s[l + o]. */
static inline float mlaf_index_sum128(const float *v) {
    float s[32];
    for (int l = 0; l < 32; l++) s[l] = ((v[4 * l] + v[4 * l + 1]) + v[4 * l + 2]) + v[4 * l + 3];
    for (int o = 16; o > 0; o >>= 1)
        for (int l = 0; l < o; l++) s[l] = s[l] + s[l + o];
    return s[0];
}

/* x rounded to dt (f32: unchanged). */
static inline float mlaf_index_round(float x, mlaf_dtype dt) {
    if (dt == MLAF_BF16) return mlaf_bf16_to_f32(mlaf_f32_to_bf16(x));
    if (dt == MLAF_F16) return mlaf_f16_to_f32(mlaf_f32_to_f16(x));
    return x;
}

/* LayerNorm of x[128] with w, b (fp32) into y, in fp32 (not yet rounded to the row's dtype). */
static inline void mlaf_index_layernorm_f32(const float *x, const float *w, const float *b, float eps, float *y) {
    float d[MLAF_IDX_D], sq[MLAF_IDX_D];
    const float mu = mlaf_index_sum128(x) / 128.0f;
    for (int i = 0; i < MLAF_IDX_D; i++) d[i] = x[i] - mu;
    /* a lane's four squares summed in order from 0: 0 + d0^2 is d0^2, so plain pairs suffice */
    for (int i = 0; i < MLAF_IDX_D; i++) sq[i] = d[i] * d[i];
    const float rstd = 1.0f / sqrtf(mlaf_index_sum128(sq) / 128.0f + eps);
    for (int i = 0; i < MLAF_IDX_D; i++) y[i] = ((d[i] * rstd) * w[i]) + b[i];
}

/* LayerNorm of x[128] with w, b (fp32) into y, rounded to dt. */
static inline void mlaf_index_layernorm(const float *x, const float *w, const float *b, float eps, mlaf_dtype dt,
                                        float *y) {
    mlaf_index_layernorm_f32(x, w, b, eps, y);
    for (int i = 0; i < MLAF_IDX_D; i++) y[i] = mlaf_index_round(y[i], dt);
}

/* RoPE on y[0, 64) with the table row cs (cos[0..31] | sin[0..31]), rounded to dt. */
static inline void mlaf_index_rope(float *y, mlaf_rope_style style, const float *cs, mlaf_dtype dt) {
    for (int i = 0; i < 32; i++) {
        const int a = style == MLAF_ROPE_NEOX ? i : 2 * i, b = style == MLAF_ROPE_NEOX ? i + 32 : 2 * i + 1;
        const float x0 = y[a], x1 = y[b], c = cs[i], s = cs[32 + i];
        const float p0 = x0 * c, p1 = x1 * s, p2 = x1 * c, p3 = x0 * s;
        y[a] = mlaf_index_round(p0 - p1, dt);
        y[b] = mlaf_index_round(p2 + p3, dt);
    }
}

/* H_128 y * f32(128^-0.5) in place, rounded to dt. */
static inline void mlaf_index_hadamard(float *y, mlaf_dtype dt) {
    for (int h = 1; h < MLAF_IDX_D; h <<= 1)
        for (int i = 0; i < MLAF_IDX_D; i++)
            if (!(i & h)) {
                const float a = y[i], b = y[i + h];
                y[i] = a + b;
                y[i + h] = a - b;
            }
    const float k = 0.0883883476483184405f; /* f32(128^-0.5) */
    for (int i = 0; i < MLAF_IDX_D; i++) y[i] = mlaf_index_round(y[i] * k, dt);
}

/* The scale of a row from its NaN-free amax. */
static inline float mlaf_index_scale_of(float amax, float eps, mlaf_index_scale mode) {
    const float a = amax > eps ? amax : eps;
    if (mode == MLAF_INDEX_SCALE_F32) return a / 448.0f;
    return mlaf_bits_f32((uint32_t)(mlaf_ceil_log2_f32(a / 448.0f) + 127) << 23);
}

/* e4m3 bytes of y[128] into q and the row's scale (returned). */
static inline float mlaf_index_quantize(const float *y, float eps, mlaf_index_scale mode, uint8_t *q) {
    float m = 0.0f;
    for (int i = 0; i < MLAF_IDX_D; i++) {
        const float a = fabsf(y[i]);
        m = a > m ? a : m;
    }
    const float s = mlaf_index_scale_of(m, eps, mode);
    for (int i = 0; i < MLAF_IDX_D; i++) q[i] = mlaf_f32_to_e4m3(y[i] / s);
    return s;
}

/* Little-endian f32 at any byte address. */
static inline void mlaf_index_put_f32(uint8_t *p, float v) {
    const uint32_t u = mlaf_f32_bits(v);
    p[0] = (uint8_t)u, p[1] = (uint8_t)(u >> 8), p[2] = (uint8_t)(u >> 16), p[3] = (uint8_t)(u >> 24);
}

#endif /* MLAF_INDEX_MATH_H */
