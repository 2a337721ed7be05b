/*
 * rms_norm_quant.c — CPU rms_norm_quant (include/mlafuse/quant.h, docs/gemm_formats.md): the driver
 * (tokens over the backend's threads) and the row.
 *
 * Per token t:
 *   1. with a residual: h = x + r in fp32, rounded once to the dtype and stored into r, chunk by
 *      chunk (the row's source is then r, whose values are exactly h); else the source is x.
 *   2. ss = sum h^2 by the path's sumsq over the whole source row, before anything of y is written
 *      (so y = x is safe); rstd = 1 / sqrtf(ss / K + eps) — the norms' arithmetic (norm.c).
 *   3. per chunk of CHUNK values (a multiple of every group): y = (h * rstd) * w in fp32 by the
 *      path's scale kernel; the dense writer rounds it once to the dtype, the format's writer
 *      (gemm_writers.c) rounds each group the same way and quantizes it. The same row code serves
 *      the dense-only and the quantized calls, so their y values are the same bits.
 * Weights are converted to fp32 once per call (on the caller's stack, read by every thread) up to
 * WMAX values; wider rows convert theirs per chunk. Large calls store y past the caches
 * (non-temporal stores where the path has them).
 */
#include <math.h>
#include <string.h>

#include "cpu.h"
#include "gemm_writers.h"
#include "norm_writers.h"
#include "parallel.h"

#define CHUNK 1024   /* values per step of the row: a multiple of 128 and 32 */
#define WMAX 16384   /* weights converted once per call up to this K (64 KiB of stack) */
#define PF_ROWS 2    /* rows ahead whose x (and residual) lines the conversion pass requests */
#ifndef MLAF_STREAM_BYTES
#define MLAF_STREAM_BYTES ((int64_t)16 << 20)
#endif

typedef struct rnq_call {
    const mlaf_norm_kern *k;
    const mlaf_rms_norm_quant_job *j;
    const float *wf;          /* the weights in fp32, or NULL: converted per chunk */
    mlaf_cpu_gemm_writer qw;  /* the quantized output's writer, or NULL */
    int stream;
} rnq_call;

/* n values of dtype dt to fp32: the scale kernel with rstd 1 and unit weights ((x * 1) * 1 = x). */
static void to_f32(const mlaf_norm_kern *k, const void *src, mlaf_dtype dt, int64_t n, const float *ones, float *out) {
    k->scale(src, dt, n, 1.0f, ones, out, MLAF_F32, NULL, MLAF_F32, 0, NULL);
}

static void prefetch_row(const char *p, int64_t bytes) {
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b, 0, 3);
}

/* Rows [t0, t1) of the call (a mlaf_cpu_range_fn). */
static int64_t rnq_rows(void *arg, int64_t t0, int64_t t1, int worker) {
    (void)worker;
    const rnq_call *c = (const rnq_call *)arg;
    const mlaf_norm_kern *k = c->k;
    const mlaf_rms_norm_quant_job *j = c->j;
    const mlaf_dtype dt = j->dt;
    const int64_t es = (int64_t)mlaf_dtype_size(dt), K = j->K, G = j->q.group ? K / j->q.group : 0;
    float v[CHUNK], a[CHUNK], wb[CHUNK], ones[CHUNK];
    for (int i = 0; i < CHUNK; i++) ones[i] = 1.0f;
    for (int64_t t = t0; t < t1; t++) {
        const char *x = (const char *)j->x + t * j->x_stride * es;
        const char *src = x;
        const int ahead = t + PF_ROWS < t1;
        if (j->residual) {
            char *r = (char *)j->residual + t * j->r_stride * es;
            if (ahead) prefetch_row(r + PF_ROWS * j->r_stride * es, K * es);
            for (int64_t i0 = 0; i0 < K; i0 += CHUNK) {
                const int64_t m = K - i0 < CHUNK ? K - i0 : CHUNK;
                to_f32(k, x + i0 * es, dt, m, ones, a);
                to_f32(k, r + i0 * es, dt, m, ones, v);
                for (int64_t i = 0; i < m; i++) a[i] = a[i] + v[i];
                k->convert(a, m, r + i0 * es, dt, 0); /* h, rounded once */
            }
            src = r;
        }
        if (ahead) prefetch_row(x + PF_ROWS * j->x_stride * es, K * es);
        const float rstd = 1.0f / sqrtf(k->sumsq(src, dt, K) / (float)K + j->eps);
        char *y = j->y ? (char *)j->y + t * j->y_stride * es : NULL;
        for (int64_t i0 = 0; i0 < K; i0 += CHUNK) {
            const int64_t m = K - i0 < CHUNK ? K - i0 : CHUNK;
            const float *w = c->wf ? c->wf + i0 : wb;
            if (!c->wf) to_f32(k, (const char *)j->w + i0 * (int64_t)mlaf_dtype_size(j->w_dt), j->w_dt, m, ones, wb);
            k->scale(src + i0 * es, dt, m, rstd, w, v, MLAF_F32, NULL, MLAF_F32, 0, NULL);
            if (y) k->convert(v, m, y + i0 * es, dt, c->stream);
            if (c->qw) c->qw(k, &j->q, dt, t, G, i0, m, v);
        }
    }
    if (c->stream) k->fence();
    return 0;
}

mlaf_status mlaf_cpu_rms_norm_quant(mlaf_context *ctx, const mlaf_rms_norm_quant_job *job) {
    const mlaf_norm_kern *k = mlaf_cpu_norm_kern(ctx);
    const int64_t es = (int64_t)mlaf_dtype_size(job->dt), row = (int64_t)job->K * es;
    /* bytes moved: x read; residual read and written; y written; the e4m3 row and its scales */
    const int64_t per_row = row * (1 + (job->residual ? 2 : 0) + (job->y ? 1 : 0)) +
                            (job->q.format != MLAF_GEMM_NONE ? job->K + 4 * (job->K / job->q.group) : 0);
    float wbuf[WMAX];
    rnq_call c = {k, job, NULL, mlaf_cpu_gemm_writer_of(job->q.format), 0};
    if (job->w_dt == MLAF_F32) {
        c.wf = (const float *)job->w;
    } else if (job->K <= WMAX) {
        float ones[CHUNK];
        for (int i = 0; i < CHUNK; i++) ones[i] = 1.0f;
        for (int64_t i0 = 0; i0 < job->K; i0 += CHUNK)
            to_f32(k, (const char *)job->w + i0 * (int64_t)mlaf_dtype_size(job->w_dt), job->w_dt,
                   job->K - i0 < CHUNK ? job->K - i0 : CHUNK, ones, wbuf + i0);
        c.wf = wbuf;
    }
    c.stream = job->T * row >= MLAF_STREAM_BYTES;
    mlaf_cpu_parallel_for(ctx, job->T, job->T * per_row, rnq_rows, &c);
    return MLAF_OK;
}
