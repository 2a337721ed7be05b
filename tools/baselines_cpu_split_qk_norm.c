/* baselines_cpu_split_qk_norm.c — split_qk_norm's unfused CPU chain (see baselines_cpu.h). */
#include "baselines_cpu.h"

static void rmsnorm_pass(const void *x, int64_t xs, void *y, int64_t ys, mlaf_dtype dt,
                         const void *w, mlaf_dtype wdt, int64_t T, int32_t n, float eps,
                         int threads) {
    threads = team(T, n, threads);
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int64_t t = 0; t < T; t++) {
        const void *xr = CROW(x, dt, t, xs);
        void *yr = ROW(y, dt, t, ys);
        float ss = 0.0f;
        for (int32_t i = 0; i < n; i++) {
            float v = mlaf_load_f32(xr, dt, i);
            ss += v * v;
        }
        float rstd = 1.0f / sqrtf(ss / (float)n + eps);
        for (int32_t i = 0; i < n; i++)
            mlaf_store_f32(yr, dt, i, mlaf_load_f32(xr, dt, i) * rstd * mlaf_load_f32(w, wdt, i));
    }
}

int blc_split_qk_norm(const mlaf_norm_job *j, void *q_dense, void *kv_dense, int threads) {
    const mlaf_dtype dt = j->dt;
    const size_t es = mlaf_dtype_size(dt);
    const int32_t Q = j->Q, C = j->C, R = j->R;
    const int nt = team(j->T, Q + C + R, threads);
    (void)nt;
    /* 1. split */
#ifdef _OPENMP
#pragma omp parallel for num_threads(nt) schedule(static)
#endif
    for (int64_t t = 0; t < j->T; t++) {
        const char *l = CROW(j->latent, dt, t, j->latent_stride);
        if (Q > 0) memcpy(ROW(q_dense, dt, t, Q), l, (size_t)Q * es);
        memcpy(ROW(kv_dense, dt, t, C), l + (size_t)Q * es, (size_t)C * es);
        if (R > 0 && j->k_pe)
            memcpy(ROW(j->k_pe, dt, t, j->k_pe_stride), l + (size_t)(Q + C) * es, (size_t)R * es);
    }
    /* 2., 3. the two norms */
    if (Q > 0)
        rmsnorm_pass(q_dense, Q, j->q, j->q_stride, dt, j->w_q, j->w_q_dt, j->T, Q, j->eps_q,
                     threads);
    if (j->k_nope)
        rmsnorm_pass(kv_dense, C, j->k_nope, j->k_nope_stride, dt, j->w_kv, j->w_kv_dt, j->T, C,
                     j->eps_kv, threads);
    return 0;
}
