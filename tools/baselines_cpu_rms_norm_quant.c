/* baselines_cpu_rms_norm_quant.c — rms_norm_quant's unfused CPU passes (see bench.h): the residual add
 * and the RMSNorm as passes of their own, and the per-token-group quantize pass after a dense norm. */
#include "baselines_cpu.h"
#include "gemm_format.h"

int blc_add_rmsnorm(const mlaf_rms_norm_quant_job *j, int threads) {
    const mlaf_dtype dt = j->dt;
    const int32_t K = j->K;
    const int nt = team(j->T, K, threads);
    (void)nt;
    if (j->residual) { /* 1. residual = round(x + residual) */
#ifdef _OPENMP
#pragma omp parallel for num_threads(nt) schedule(static)
#endif
        for (int64_t t = 0; t < j->T; t++) {
            const void *x = CROW(j->x, dt, t, j->x_stride);
            void *r = ROW(j->residual, dt, t, j->r_stride);
            for (int32_t i = 0; i < K; i++) mlaf_store_f32(r, dt, i, mlaf_load_f32(x, dt, i) + mlaf_load_f32(r, dt, i));
        }
    }
    /* 2. y = RMSNorm(residual or x) * w */
    const void *src = j->residual ? j->residual : j->x;
    const int64_t ss = j->residual ? j->r_stride : j->x_stride;
#ifdef _OPENMP
#pragma omp parallel for num_threads(nt) schedule(static)
#endif
    for (int64_t t = 0; t < j->T; t++) {
        const void *h = CROW(src, dt, t, ss);
        void *y = ROW(j->y, dt, t, j->y_stride);
        float sum = 0.0f;
        for (int32_t i = 0; i < K; i++) {
            const float v = mlaf_load_f32(h, dt, i);
            sum += v * v;
        }
        const float rstd = 1.0f / sqrtf(sum / (float)K + j->eps);
        for (int32_t i = 0; i < K; i++)
            mlaf_store_f32(y, dt, i, mlaf_load_f32(h, dt, i) * rstd * mlaf_load_f32(j->w, j->w_dt, i));
    }
    return 0;
}

int blc_gemm_quant(const mlaf_gemm_out_job *q, const void *y, mlaf_dtype dt, int64_t T, int64_t K, int64_t stride,
                   int threads, const mlaf_norm_kern *k) {
    if (q->format == MLAF_GEMM_NONE || q->group > 128) return -1;
    const int32_t g = q->group;
    const int64_t G = K / g;
    threads = team(T, K, threads);
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int64_t t = 0; t < T; t++) {
        const char *row = CROW(y, dt, t, stride);
        float x[128];
        for (int64_t j = 0; j < G; j++) {
            for (int32_t i = 0; i < g; i++) x[i] = mlaf_load_f32(row, dt, j * g + i);
            uint8_t byte;
            const float s = mlaf_gemm_scale_of(q->scale, k->round_amax(x, g, dt, x, 0.0f), q->eps, &byte);
            k->e4m3(x, g, s, 1, q->data + t * q->data_stride + j * g);
            mlaf_gemm_put_scale(q, t, j, G, s, byte);
        }
    }
    return 0;
}
