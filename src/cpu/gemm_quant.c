/*
 * gemm_quant.c — CPU gemm_quant (include/mlafuse/quant.h, docs/gemm_formats.md): each row of x
 * handed to the format's writer (gemm_writers.c) in chunks of CHUNK values, tokens over the
 * backend's threads (parallel.h's rule, from the bytes the call moves).
 *
 * The writer takes fp32 values and rounds each to the activation dtype before its amax; x's
 * values are already in that dtype, so the rounding returns them unchanged and the bytes are
 * those rms_norm_quant writes for a dense row equal to x. f32 rows go to the writer as they are;
 * f16 / bf16 rows are widened first by the path's scale kernel with rstd 1 and unit weights
 * ((x * 1) * 1 = x, exactly).
 */
#include "cpu.h"
#include "gemm_writers.h"
#include "norm_writers.h"
#include "parallel.h"

#define CHUNK 1024 /* values per writer call: a multiple of 128 and 32 */

typedef struct gq_call {
    const mlaf_norm_kern *k;
    const mlaf_gemm_quant_job *j;
    mlaf_cpu_gemm_writer qw;
} gq_call;

/* Rows [t0, t1) of the call (a mlaf_cpu_range_fn). */
static int64_t gq_rows(void *arg, int64_t t0, int64_t t1, int worker) {
    (void)worker;
    const gq_call *c = (const gq_call *)arg;
    const mlaf_norm_kern *k = c->k;
    const mlaf_gemm_quant_job *j = c->j;
    const mlaf_dtype dt = j->dt;
    const int64_t es = (int64_t)mlaf_dtype_size(dt), K = j->K, G = K / j->q.group;
    float v[CHUNK], ones[CHUNK];
    if (dt != MLAF_F32)
        for (int i = 0; i < CHUNK; i++) ones[i] = 1.0f;
    for (int64_t t = t0; t < t1; t++) {
        const char *row = (const char *)j->x + t * j->x_stride * es;
        for (int64_t i0 = 0; i0 < K; i0 += CHUNK) {
            const int64_t m = K - i0 < CHUNK ? K - i0 : CHUNK;
            if (dt == MLAF_F32) {
                c->qw(k, &j->q, dt, t, G, i0, m, (const float *)(const void *)row + i0);
            } else {
                k->scale(row + i0 * es, dt, m, 1.0f, ones, v, MLAF_F32, NULL, MLAF_F32, 0, NULL);
                c->qw(k, &j->q, dt, t, G, i0, m, v);
            }
        }
    }
    return 0;
}

mlaf_status mlaf_cpu_gemm_quant(mlaf_context *ctx, const mlaf_gemm_quant_job *job) {
    const int64_t es = (int64_t)mlaf_dtype_size(job->dt);
    /* bytes moved a row: x read, the e4m3 row and its scales written */
    const int64_t per_row = (int64_t)job->K * (es + 1) + 4 * (job->K / job->q.group);
    gq_call c = {mlaf_cpu_norm_kern(ctx), job, mlaf_cpu_gemm_writer_of(job->q.format)};
    if (!c.qw) return mlaf_fail(ctx, MLAF_ERR_UNSUPPORTED, "gemm_quant: format %d has no CPU writer", (int)job->q.format);
    mlaf_cpu_parallel_for(ctx, job->T, job->T * per_row, gq_rows, &c);
    return MLAF_OK;
}
