/*
 * gemm_writers.c — the CPU writers of the GEMM-input formats (gemm_writers.h): the group loop all
 * formats share, and per format the group width and where its scales go.
 */
#include "gemm_writers.h"

/* Groups of g values: rounded to dt with their amax, the scale, the bytes, the scale stored. */
static void put_groups(const mlaf_norm_kern *k, const mlaf_gemm_out_job *q, mlaf_dtype dt, int64_t t, int64_t G,
                       int64_t i0, int64_t n, const float *v, int32_t g) {
    float x[128];
    uint8_t *out = q->data + t * q->data_stride;
    for (int64_t a = 0; a < n; a += g) {
        const float amax = k->round_amax(v + a, g, dt, x, 0.0f);
        uint8_t byte;
        const float s = mlaf_gemm_scale_of(q->scale, amax, q->eps, &byte);
        k->e4m3(x, g, s, 1, out + i0 + a);
        mlaf_gemm_put_scale(q, t, (i0 + a) / g, G, s, byte);
    }
}

/* fp8_1x128 (f32, row-major), fp8_1x128_mn (f32, MN-major) and fp8_1x128_ue8m0 (packed bytes) share
 * the 128-wide groups; mlaf_gemm_put_scale places each by q->format. */
static void put_1x128(const mlaf_norm_kern *k, const mlaf_gemm_out_job *q, mlaf_dtype dt, int64_t t, int64_t G,
                      int64_t i0, int64_t n, const float *v) {
    put_groups(k, q, dt, t, G, i0, n, v, 128);
}

static void put_mxfp8(const mlaf_norm_kern *k, const mlaf_gemm_out_job *q, mlaf_dtype dt, int64_t t, int64_t G,
                      int64_t i0, int64_t n, const float *v) {
    put_groups(k, q, dt, t, G, i0, n, v, 32);
}

/* The writer of each format (src/gemm_format.h), by its enum value. */
static const mlaf_cpu_gemm_writer writers[MLAF_GEMM_FORMAT_COUNT_] = {
    [MLAF_GEMM_NONE] = NULL,
    [MLAF_GEMM_FP8_1X128] = put_1x128,
    [MLAF_GEMM_FP8_1X128_MN] = put_1x128,
    [MLAF_GEMM_FP8_1X128_UE8M0] = put_1x128,
    [MLAF_GEMM_MXFP8] = put_mxfp8,
    [MLAF_GEMM_FP8_1X128_CM] = put_1x128,
};

mlaf_cpu_gemm_writer mlaf_cpu_gemm_writer_of(mlaf_gemm_format f) {
    return (unsigned)f < MLAF_GEMM_FORMAT_COUNT_ ? writers[f] : (mlaf_cpu_gemm_writer)0;
}

int mlaf_cpu_gemm_writer_count(void) {
    int n = 0;
    for (int f = 0; f < MLAF_GEMM_FORMAT_COUNT_; f++) n += writers[f] != NULL;
    return n;
}
