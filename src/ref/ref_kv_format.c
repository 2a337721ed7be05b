/*
 * ref_kv_format.c — the reference encoder of mla_kv_cache's fp8 cache formats (docs/kv_formats.md), and
 * the decoding bound the checks hold the records to.
 *
 * The encoder works from one token's dense row as the op stored it (k_nope_norm and the roped
 * k_pe, each value already rounded to the latent dtype) and writes the format's record bytes,
 * one formula per value, in the order docs/kv_formats.md states them:
 *   fp8         e4m3(x / scale) (DIV) or e4m3(x * scale) (MUL), one f32 division or product
 *   fp8_ds_mla  per 128-value tile: amax (NaN-ignoring max of |x|), its scale s by the tile
 *               mode, e4m3(x / s); then the tile scales as little-endian f32; then the rope
 *               values as bf16 bits
 *   fp8_v4      per 64-value block of the 448 NoPE values: amax, e = ceil_log2(max(amax, 1e-4) / 448),
 *               e4m3(x * 2^-e) (ldexpf: exact), the byte clamp(e + 127, 0, 255); the 64 roped values
 *               as bf16 bits; the record is the data row (576 B) followed by the scale row (8 B)
 * e4m3 is fp8.h's conversion (round to nearest even, satfinite). One encoder per format, in
 * encoders[] by the enum value of the format's row in src/kv_format.h.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "../fp8.h"
#include "../half.h"
#include "verify.h"

/* fmaxf semantics: a NaN operand is ignored. */
static float nan_max(float m, float v) {
    const float a = fabsf(v);
    return a > m ? a : m; /* a NaN compares false and leaves m */
}

float mlaf_ref_tile_scale(mlaf_tile_scale mode, float amax) {
    switch (mode) {
    case MLAF_TILE_UE8M0: return ldexpf(1.0f, mlaf_ue8m0_exponent(amax));
    case MLAF_TILE_UE8M0_FLOOR_SCALED: {
        float v = amax / 448.0f;
        if (!(v > 1e-4f)) v = 1e-4f;
        return ldexpf(1.0f, mlaf_ceil_log2_f32(v));
    }
    default: {
        const float v = amax / 448.0f;
        return v > FLT_MIN ? v : FLT_MIN;
    }
    }
}

uint8_t mlaf_ref_fp8_quantize(float x, float scale, mlaf_fp8_conv conv) {
    const float y = conv == MLAF_FP8_MUL ? x * scale : x / scale;
    return mlaf_f32_to_e4m3(y);
}

static void put_le32(uint8_t *p, uint32_t u) {
    p[0] = (uint8_t)u;
    p[1] = (uint8_t)(u >> 8);
    p[2] = (uint8_t)(u >> 16);
    p[3] = (uint8_t)(u >> 24);
}

/* ---- one encoder per format (the rows of src/kv_format.h, by enum value) ------------------- */

/* plain: the dense values are the record (the harness compares them directly); nothing to encode */
static void enc_plain(const mlaf_kv_encoding *e, const float *nope, const float *pe, uint8_t *rec,
                      float *tile_scales) {
    (void)e, (void)nope, (void)pe, (void)rec, (void)tile_scales;
}

static void enc_fp8(const mlaf_kv_encoding *e, const float *nope, const float *pe, uint8_t *rec, float *tile_scales) {
    (void)tile_scales;
    for (int32_t i = 0; i < e->C; i++) rec[i] = mlaf_ref_fp8_quantize(nope[i], e->scale, e->conv);
    for (int32_t i = 0; i < e->R; i++) rec[e->C + i] = mlaf_ref_fp8_quantize(pe[i], e->scale, e->conv);
}

/* fp8_ds_mla: per 128-value tile e4m3(x / s), the tile scales as little-endian f32, the rope as bf16 */
static void enc_ds_mla(const mlaf_kv_encoding *e, const float *nope, const float *pe, uint8_t *rec,
                       float *tile_scales) {
    const int32_t C = e->C, R = e->R, tiles = C / 128;
    for (int32_t t = 0; t < tiles; t++) {
        float m = 0.0f;
        for (int32_t i = 0; i < 128; i++) m = nan_max(m, nope[128 * t + i]);
        const float s = mlaf_ref_tile_scale(e->tile_scale, m);
        if (tile_scales) tile_scales[t] = s;
        for (int32_t i = 0; i < 128; i++) rec[128 * t + i] = mlaf_f32_to_e4m3(nope[128 * t + i] / s);
        put_le32(rec + C + 4 * t, mlaf_f32_bits(s));
    }
    uint8_t *rope = rec + C + 4 * tiles;
    for (int32_t i = 0; i < R; i++) {
        const uint16_t h = mlaf_f32_to_bf16(pe[i]);
        rope[2 * i] = (uint8_t)h;
        rope[2 * i + 1] = (uint8_t)(h >> 8);
    }
}

/* fp8_v4 (C = 512, the tail 64 inside nope[448, 512)): the data row [448 e4m3 | 64 bf16], then
 * the scale row [7 UE8M0 bytes | 0] */
static void enc_v4(const mlaf_kv_encoding *e, const float *nope, const float *pe, uint8_t *rec, float *tile_scales) {
    (void)e, (void)pe;
    for (int32_t b = 0; b < 7; b++) {
        float m = 0.0f;
        for (int32_t i = 0; i < 64; i++) m = nan_max(m, nope[64 * b + i]);
        const int ex = mlaf_ceil_log2_f32((m > 1e-4f ? m : 1e-4f) / 448.0f);
        if (tile_scales) tile_scales[b] = ldexpf(1.0f, ex);
        for (int32_t i = 0; i < 64; i++) rec[64 * b + i] = mlaf_f32_to_e4m3(ldexpf(nope[64 * b + i], -ex));
        rec[576 + b] = (uint8_t)(ex + 127 < 0 ? 0 : ex + 127 > 255 ? 255 : ex + 127);
    }
    rec[583] = 0;
    for (int32_t i = 0; i < 64; i++) {
        const uint16_t h = mlaf_f32_to_bf16(nope[448 + i]);
        rec[448 + 2 * i] = (uint8_t)h;
        rec[448 + 2 * i + 1] = (uint8_t)(h >> 8);
    }
}

typedef void (*kv_encoder)(const mlaf_kv_encoding *e, const float *nope, const float *pe, uint8_t *rec,
                           float *tile_scales);
static const kv_encoder encoders[MLAF_KV_FORMAT_COUNT_] = {
    [MLAF_KV_PLAIN] = enc_plain,
    [MLAF_KV_FP8] = enc_fp8,
    [MLAF_KV_FP8_DS_MLA] = enc_ds_mla,
    [MLAF_KV_FP8_V4] = enc_v4,
};

int mlaf_ref_kv_encoder_count(void) {
    int n = 0;
    for (int f = 0; f < MLAF_KV_FORMAT_COUNT_; f++) n += encoders[f] != NULL;
    return n;
}

float mlaf_ref_kv_encode(const mlaf_kv_encoding *e, const float *nope, const float *pe,
                         uint8_t *rec, float *tile_scales) {
    float amax = 0.0f;
    for (int32_t i = 0; i < e->C; i++) amax = nan_max(amax, nope[i]);
    for (int32_t i = 0; i < e->R; i++) amax = nan_max(amax, pe[i]);
    encoders[e->format](e, nope, pe, rec, tile_scales);
    return amax;
}

/* The spacing of e4m3 values around |y|: 2^-9 below the smallest normal 2^-6, else 2^(e - 3)
 * for |y| in [2^e, 2^(e+1)). */
static double e4m3_ulp(double a) {
    if (a < 0x1p-6) return 0x1p-9;
    int k;
    frexp(a, &k); /* a = m 2^k, m in [0.5, 1): e = k - 1 */
    return ldexp(1.0, k - 1 - 3);
}

int mlaf_ref_fp8_decode_check(uint8_t b, float x, float scale, mlaf_fp8_conv conv, double *ratio) {
    *ratio = 0.0;
    const float y = conv == MLAF_FP8_MUL ? x * scale : x / scale;
    if (!isfinite(x) || !isfinite(y) || fabsf(y) >= 464.0f || !(scale > 0.0f) || !isfinite(scale))
        return -1; /* saturated or not a number: only the bytes' formula applies */
    const double d = mlaf_e4m3_to_f32(b);
    if (d != d) {
        *ratio = INFINITY;
        return 0;
    }
    /* In the quantized domain: |d - y| <= ulp/2, and y is x / s (x s) rounded once to f32. */
    const double ay = fabs((double)y);
    const double allowed_q = e4m3_ulp(ay) / 2 + ldexp(ay, -23) + 0x1p-149;
    const double dec = conv == MLAF_FP8_MUL ? d / (double)scale : d * (double)scale;
    const double s = conv == MLAF_FP8_MUL ? 1.0 / (double)scale : (double)scale;
    const double err = fabs(dec - (double)x), allowed = allowed_q * s;
    *ratio = err / allowed;
    return err <= allowed * (1.0 + 0x1p-40);
}
