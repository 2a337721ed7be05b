/*
 * ref_gemm_format.c — the reference encoder of the GEMM-input formats (docs/gemm_formats.md) and
 * where each layout keeps a group's scale, written from the definitions, apart from the library's
 * writers (src/gemm_format.h, src/cpu/gemm_writers.c).
 *
 * One row of K values, each already in the activation dtype: per group of g values (128, or 32
 * for mxfp8) the NaN-ignoring amax in double; the scale by the rounding, its exponents taken with
 * frexp (never from the f32 bits, as the library does):
 *   f32        s = max(amax, eps) / 448, the double quotient rounded once to f32 (the f32
 *              division's result: double's 53 bits leave no double-rounding error)
 *   ue8m0      q as above; s = 2^ceil(log2 q)
 *   mx_floor   s = 2^(floor(log2 amax) - 8), at least 2^-127 (amax 0 included)
 *   mx_ceil    q = amax / 448 rounded to f32; s = 2^ceil(log2 q), at least 2^-127 (amax 0, q 0)
 *   an infinite amax: s = +inf; a UE8M0 byte is log2(s) + 127
 * then each byte e4m3(y / s): the quotient in double rounded to f32 (again the f32 division's
 * result), then fp8.h's conversion. One encoder per format, by the enum value of its row.
 */
#include <math.h>
#include <string.h>

#include "../fp8.h"
#include "../half.h"
#include "verify.h"

/* 2^e as an f32 (e in [-127, 127]), or +inf for e = 128 */
static float pow2(int e) { return e >= 128 ? INFINITY : (float)ldexp(1.0, e); }

/* ceil(log2 q) of a positive finite float (subnormals included): frexp gives q = m 2^k, m in [0.5, 1). */
static int ceil_log2(double q) {
    int k;
    const double m = frexp(q, &k);
    return m == 0.5 ? k - 1 : k;
}

/* One group's scale: its value and its UE8M0 byte (0 for f32). */
static float group_scale(const mlaf_gemm_encoding *e, double amax, uint8_t *byte) {
    int ex;
    *byte = 0;
    switch (e->scale) {
    case MLAF_GEMM_SCALE_F32: return (float)(fmax(amax, (double)e->eps) / 448.0);
    case MLAF_GEMM_SCALE_UE8M0:
        ex = isinf(amax) ? 128 : ceil_log2((double)(float)(fmax(amax, (double)e->eps) / 448.0));
        break;
    case MLAF_GEMM_SCALE_MX_FLOOR: {
        int k = 0;
        if (amax > 0.0 && !isinf(amax)) frexp(amax, &k);
        ex = isinf(amax) ? 128 : amax == 0.0 ? -127 : k - 1 - 8;
        break;
    }
    default: { /* mx_ceil */
        const double q = (double)(float)(amax / 448.0);
        ex = isinf(amax) ? 128 : q == 0.0 ? -127 : ceil_log2(q);
        break;
    }
    }
    if (ex < -127) ex = -127;
    *byte = (uint8_t)(ex + 127);
    return pow2(ex);
}

/* groups of g values: amax, scale, bytes */
static void encode_groups(const mlaf_gemm_encoding *e, int32_t g, const float *y, int64_t K, uint8_t *data,
                          float *scale_f32, uint8_t *scale_byte) {
    for (int64_t j = 0; j < K / g; j++) {
        double amax = 0.0;
        for (int32_t i = 0; i < g; i++) {
            const double a = fabs((double)y[j * g + i]);
            if (a > amax) amax = a; /* NaN: false */
        }
        uint8_t b;
        const float s = group_scale(e, amax, &b);
        scale_f32[j] = s;
        scale_byte[j] = b;
        for (int32_t i = 0; i < g; i++)
            data[j * g + i] = mlaf_f32_to_e4m3((float)((double)y[j * g + i] / (double)s));
    }
}

static void enc_none(const mlaf_gemm_encoding *e, const float *y, int64_t K, uint8_t *data, float *sf, uint8_t *sb) {
    (void)e, (void)y, (void)K, (void)data, (void)sf, (void)sb;
}
static void enc_1x128(const mlaf_gemm_encoding *e, const float *y, int64_t K, uint8_t *data, float *sf, uint8_t *sb) {
    encode_groups(e, 128, y, K, data, sf, sb);
}
static void enc_mxfp8(const mlaf_gemm_encoding *e, const float *y, int64_t K, uint8_t *data, float *sf, uint8_t *sb) {
    encode_groups(e, 32, y, K, data, sf, sb);
}

typedef void (*gemm_encoder)(const mlaf_gemm_encoding *e, const float *y, int64_t K, uint8_t *data, float *sf,
                             uint8_t *sb);
static const gemm_encoder encoders[MLAF_GEMM_FORMAT_COUNT_] = {
    [MLAF_GEMM_NONE] = enc_none,
    [MLAF_GEMM_FP8_1X128] = enc_1x128,
    [MLAF_GEMM_FP8_1X128_MN] = enc_1x128,
    [MLAF_GEMM_FP8_1X128_UE8M0] = enc_1x128,
    [MLAF_GEMM_MXFP8] = enc_mxfp8,
    [MLAF_GEMM_FP8_1X128_CM] = enc_1x128,
};

int mlaf_ref_gemm_encoder_count(void) {
    int n = 0;
    for (int f = 0; f < MLAF_GEMM_FORMAT_COUNT_; f++) n += encoders[f] != NULL;
    return n;
}

void mlaf_ref_gemm_encode_row(const mlaf_gemm_encoding *e, const float *y, int64_t K, uint8_t *data,
                              float *scale_f32, uint8_t *scale_byte) {
    encoders[e->format](e, y, K, data, scale_f32, scale_byte);
}

int64_t mlaf_ref_gemm_scale_offset(mlaf_gemm_format f, int64_t t, int64_t j, int64_t ld) {
    switch (f) {
    case MLAF_GEMM_FP8_1X128: return 4 * (t * ld + j);        /* f32 [T, G] */
    case MLAF_GEMM_FP8_1X128_MN: return 4 * (j * ld + t);     /* f32 [G, T] */
    case MLAF_GEMM_FP8_1X128_UE8M0: return 4 * ((j / 4) * ld + t) + j % 4; /* byte j % 4 of i32 (j / 4, t) */
    case MLAF_GEMM_MXFP8: return t * ld + j;                  /* u8 [T, G] */
    case MLAF_GEMM_FP8_1X128_CM: return 4 * (j * ld + t);     /* f32 [G, T], any ld >= T */
    default: return -1;
    }
}

/* gemm_quant's oracle: row t of x as stored (host memory), through the encoder above. */
void mlaf_ref_gemm_quant_row(const mlaf_gemm_quant_job *job, int64_t t, float *row, uint8_t *data, float *scale_f32,
                             uint8_t *scale_byte) {
    const char *x = (const char *)job->x + (size_t)(t * job->x_stride) * mlaf_dtype_size(job->dt);
    for (int64_t i = 0; i < job->K; i++) row[i] = mlaf_load_f32(x, job->dt, i);
    const mlaf_gemm_encoding e = {job->q.format, job->q.scale, job->q.eps};
    mlaf_ref_gemm_encode_row(&e, row, job->K, data, scale_f32, scale_byte);
}
