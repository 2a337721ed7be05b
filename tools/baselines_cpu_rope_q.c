/* baselines_cpu_rope_q.c — rope_q's unfused CPU chain: head_norm, then gather / rotate / scatter (see
 * baselines_cpu.h). */
#include "baselines_cpu.h"

int blc_head_norm(const mlaf_rope_q_job *j, int threads, const mlaf_norm_kern *k) {
    const mlaf_dtype dt = j->dt;
    const int64_t rows = j->T * j->H;
    const int32_t D = j->D;
    const size_t es = mlaf_dtype_size(dt);
    threads = team(rows, D, threads);
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
#endif
    {
        float ones[512];
        for (int i = 0; i < 512; i++) ones[i] = 1.0f;
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (int64_t r = 0; r < rows; r++) {
            char *x = (char *)j->q + (size_t)((r / j->H) * j->s0 + (r % j->H) * j->s1) * es;
            const float rstd = 1.0f / sqrtf(k->sumsq(x, dt, D) / (float)D + j->head_eps);
            for (int32_t b0 = 0; b0 < D; b0 += 512) /* x * rstd: (x * rstd) * 1 */
                k->scale(x + b0 * es, dt, D - b0 < 512 ? D - b0 : 512, rstd, ones, x + b0 * es, dt, NULL, dt, 0, NULL);
        }
    }
    return 0;
}

int blc_rope_q(const mlaf_rope_q_job *j, void *gather, int threads) {
    const mlaf_dtype dt = j->dt;
    const size_t es = mlaf_dtype_size(dt);
    const int32_t R = j->rope.R, D = j->D;
    const int64_t rows = j->T * j->H;
    threads = team(rows, R, threads);
    /* 1. gather */
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int64_t r = 0; r < rows; r++) {
        int64_t t = r / j->H, h = r % j->H;
        const char *src = (const char *)j->q + (size_t)(t * j->s0 + h * j->s1 + (D - R)) * es;
        memcpy(ROW(gather, dt, r, R), src, (size_t)R * es);
    }
    /* 2. rotate */
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int64_t r = 0; r < rows; r++) {
        int64_t pos = mlaf_load_index(j->rope.positions, j->rope.pos_dt, r / j->H);
        if (pos < 0 || pos >= j->rope.max_pos) continue;
        rope_row(ROW(gather, dt, r, R), dt, R, j->rope.style,
                 j->rope.cos_sin + pos * j->rope.cos_sin_stride);
    }
    /* 3. scatter */
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int64_t r = 0; r < rows; r++) {
        int64_t t = r / j->H, h = r % j->H;
        char *dst = (char *)j->q + (size_t)(t * j->s0 + h * j->s1 + (D - R)) * es;
        memcpy(dst, ROW(gather, dt, r, R), (size_t)R * es);
    }
    return 0;
}
