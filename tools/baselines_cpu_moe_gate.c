/* baselines_cpu_moe_gate.c — moe_gate's unfused CPU chains, top-k and hash routing (see baselines_cpu.h). */
#include "baselines_cpu.h"

/* a ranks above b: larger value, NaN lowest, ties to the lower index. */
static inline int better(float a, int ia, float b, int ib) {
    if (isnan(b)) return !isnan(a) || ia < ib;
    if (isnan(a)) return 0;
    return a > b || (a == b && ia < ib);
}

/* moe_gate step 1: the scores s [T, E] of every expert. */
static void moe_score_pass(const mlaf_moe_gate_job *j, const bench_moe_scratch *sc, int threads) {
    const int64_t T = j->T;
    const int32_t E = j->E;
    /* 1. score */
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int64_t t = 0; t < T; t++) {
        const void *x = CROW(j->logits, j->logits_dt, t, j->logits_stride);
        float *s = sc->s + t * E;
        if (j->score_func == MLAF_SCORE_SIGMOID) {
            for (int32_t e = 0; e < E; e++) s[e] = 1.0f / (1.0f + expf(-mlaf_load_f32(x, j->logits_dt, e)));
        } else if (j->score_func == MLAF_SCORE_SQRT_SOFTPLUS) { /* torch: F.softplus(x).sqrt() */
            for (int32_t e = 0; e < E; e++) {
                const float v = mlaf_load_f32(x, j->logits_dt, e);
                s[e] = sqrtf(fmaxf(v, 0.0f) + log1pf(expf(-fabsf(v))));
            }
        } else {
            float mx = -INFINITY, sum = 0.0f;
            for (int32_t e = 0; e < E; e++) mx = fmaxf(mx, mlaf_load_f32(x, j->logits_dt, e));
            for (int32_t e = 0; e < E; e++) sum += (s[e] = expf(mlaf_load_f32(x, j->logits_dt, e) - mx));
            for (int32_t e = 0; e < E; e++) s[e] /= sum;
        }
    }
}

/* moe_gate steps 6-8 from the ids: gather, normalize, scale, shared-expert slots. */
static void moe_weights_pass(const mlaf_moe_gate_job *j, const bench_moe_scratch *sc, int threads) {
    const int64_t T = j->T;
    const int32_t E = j->E, k = j->top_k;
    /* 6. gather */
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int64_t t = 0; t < T; t++)
        for (int32_t r = 0; r < k; r++) {
            float v = sc->s[t * E + j->ids[t * j->ids_stride + r]];
            sc->w[t * k + r] = isfinite(v) ? v : 0.0f;
        }
    /* 7. normalize */
    if (j->renormalize) {
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
        for (int64_t t = 0; t < T; t++) {
            float sum = 0.0f;
            for (int32_t r = 0; r < k; r++) sum += sc->w[t * k + r];
            for (int32_t r = 0; r < k; r++) sc->w[t * k + r] /= sum + j->eps;
        }
    }
    /* 8. scale, and the shared-expert slots */
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int64_t t = 0; t < T; t++) {
        void *wout = ROW(j->weights, j->weights_dt, t, j->weights_stride);
        float sum = 0.0f;
        for (int32_t r = 0; r < k; r++) {
            float v = sc->w[t * k + r];
            sum += v;
            mlaf_store_f32(wout, j->weights_dt, r, j->apply_scaling ? v * j->scaling : v);
        }
        for (int32_t r = 0; r < j->n_shared; r++) {
            j->ids[t * j->ids_stride + k + r] = E + r;
            mlaf_store_f32(wout, j->weights_dt, k + r, sum / j->scaling);
        }
    }
}

int blc_moe_gate(const mlaf_moe_gate_job *j, const bench_moe_scratch *sc, int threads) {
    const int64_t T = j->T;
    const int32_t E = j->E, G = j->n_group, per = E / G, k = j->top_k;
    threads = team(T, E, threads);
    moe_score_pass(j, sc, threads);
    /* 2. bias */
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int64_t t = 0; t < T; t++)
        for (int32_t e = 0; e < E; e++) sc->c[t * E + e] = sc->s[t * E + e] + (j->bias ? j->bias[e] : 0.0f);
    /* 3. group scores */
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int64_t t = 0; t < T; t++)
        for (int32_t g = 0; g < G; g++) {
            const float *c = sc->c + t * E + g * per;
            float b1 = -INFINITY, b2 = -INFINITY;
            for (int32_t e = 0; e < per; e++) {
                float v = isnan(c[e]) ? -INFINITY : c[e];
                if (v > b1) {
                    b2 = b1;
                    b1 = v;
                } else if (v > b2) {
                    b2 = v;
                }
            }
            sc->g[t * G + g] = j->group_score == MLAF_GROUP_MAX ? b1 : b1 + b2;
        }
    /* 4. group mask */
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int64_t t = 0; t < T; t++) {
        unsigned char keep[64] = {0};
        for (int32_t r = 0; r < j->topk_group; r++) {
            int best = -1;
            for (int32_t g = 0; g < G; g++)
                if (!keep[g] && (best < 0 || better(sc->g[t * G + g], g, sc->g[t * G + best], best))) best = g;
            keep[best] = 1;
        }
        /* NaN marks a dropped group; a non-finite score of a kept expert ranks lowest. */
        for (int32_t e = 0; e < E; e++) {
            float c = sc->c[t * E + e];
            sc->m[t * E + e] = keep[e / per] ? (isnan(c) ? -INFINITY : c) : NAN;
        }
    }
    /* 5. top-k */
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int64_t t = 0; t < T; t++) {
        unsigned char taken[2048];
        memset(taken, 0, (size_t)E);
        const float *m = sc->m + t * E;
        int32_t *ids = j->ids + t * j->ids_stride;
        for (int32_t r = 0; r < k; r++) {
            int best = -1;
            for (int32_t e = 0; e < E; e++) {
                if (!taken[e] && !isnan(m[e]) && (best < 0 || better(m[e], e, m[best], best)))
                    best = e;
            }
            if (best < 0) best = 0;
            taken[best] = 1;
            ids[r] = best;
        }
    }
    moe_weights_pass(j, sc, threads);
    return 0;
}

int blc_moe_gate_hash(const mlaf_moe_gate_job *j, const bench_moe_scratch *sc, int threads) {
    const int64_t T = j->T;
    const int32_t E = j->E, k = j->top_k;
    const int wide = team(T, E, threads);
    moe_score_pass(j, sc, wide);
    /* ids = tid2eid[token_ids] (torch indexing; a bad row takes 0 .. k-1, as the fused op) */
    threads = team(T, k, threads);
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int64_t t = 0; t < T; t++) {
        const int64_t tok = j->token_ids_dt == MLAF_I32 ? ((const int32_t *)j->token_ids)[t]
                                                        : ((const int64_t *)j->token_ids)[t];
        int32_t *ids = j->ids + t * j->ids_stride;
        for (int32_t r = 0; r < k; r++) {
            int64_t e = r;
            if (tok >= 0 && tok < j->vocab) {
                const int64_t at = tok * j->tid2eid_stride + r;
                e = j->tid2eid_dt == MLAF_I32 ? ((const int32_t *)j->tid2eid)[at] : ((const int64_t *)j->tid2eid)[at];
                if (e < 0 || e >= E) e = r;
            }
            ids[r] = (int32_t)e;
        }
    }
    moe_weights_pass(j, sc, wide);
    return 0;
}
