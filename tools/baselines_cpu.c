/*
 * baselines_cpu.c — the unfused CPU chains `mlafuse bench` compares the fused ops with: the
 * same steps as engines run them today, each pass a separate OpenMP loop over all tokens
 * that writes a full intermediate tensor for the next pass to read back.
 *
 *   split_qk_norm  1. split: copy q, kv, pe out of the latent into three dense tensors
 *                  2. RMSNorm q   (read q_dense, write q)
 *                  3. RMSNorm kv  (read kv_dense, write k_nope); k_pe is the copied tensor
 *   mla_kv_cache   the library's split_qk_norm, then blc_rope_rows on k_pe, then
 *                  blc_cache_write (plain cache) or blc_cache_write_fp8 (fp8 formats: the
 *                  separate quantize-and-write pass), composed by the driver
 *   rope_q         1. gather the rope columns into [T*H, R]  2. rotate  3. scatter back;
 *                  head_norm (DeepSeek-V4): blc_head_norm first, a pass of its own
 *   moe_gate       1. score  2. + bias  3. group scores  4. group mask  5. top-k
 *                  6. gather weights  7. normalize  8. scale (+ shared-expert slots)
 *
 * Arithmetic matches the fused ops (fp32, one rounding per store, no contraction of the
 * RoPE products), so the driver can check the outputs against each other.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "bench.h"
#include "cpu/norm_writers.h"
#include "fp8.h"
#include "half.h"

#define ROW(p, dt, t, stride) ((char *)(p) + (size_t)(t) * (size_t)(stride) * mlaf_dtype_size(dt))
#define CROW(p, dt, t, stride) \
    ((const char *)(p) + (size_t)(t) * (size_t)(stride) * mlaf_dtype_size(dt))

/* Like PyTorch's at::parallel_for (grain 32768 elements): a pass only fans out to the
 * threads when it has enough work, so small-T baselines are not timed waking a team. */
static int team(int64_t rows, int64_t width, int threads) {
    return rows * width >= 32768 ? threads : 1;
}

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

/* x0' = x0*c - x1*s, x1' = x1*c + x0*s, as separate products and one add / subtract, like
 * the library (the tool is compiled with -ffp-contract=off, so no FMA is formed). */
static inline void rotate(float *x0, float *x1, float c, float s) {
    float a = *x0 * c, b = *x1 * s, d = *x1 * c, e = *x0 * s;
    *x0 = a - b;
    *x1 = d + e;
}

static void rope_row(void *row, mlaf_dtype dt, int32_t R, mlaf_rope_style style,
                     const float *cs) {
    int32_t half = R / 2;
    for (int32_t i = 0; i < half; i++) {
        int32_t i0 = style == MLAF_ROPE_NEOX ? i : 2 * i;
        int32_t i1 = style == MLAF_ROPE_NEOX ? i + half : 2 * i + 1;
        float x0 = mlaf_load_f32(row, dt, i0), x1 = mlaf_load_f32(row, dt, i1);
        rotate(&x0, &x1, cs[i], cs[half + i]);
        mlaf_store_f32(row, dt, i0, x0);
        mlaf_store_f32(row, dt, i1, x1);
    }
}

int blc_rope_rows(void *x, mlaf_dtype dt, int64_t T, int64_t stride, const mlaf_rope_job *rope,
                  int threads) {
    if (rope->R <= 0) return 0;
    threads = team(T, rope->R, threads);
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int64_t t = 0; t < T; t++) {
        int64_t pos = mlaf_load_index(rope->positions, rope->pos_dt, t);
        if (pos < 0 || pos >= rope->max_pos) continue;
        rope_row(ROW(x, dt, t, stride), dt, rope->R, rope->style,
                 rope->cos_sin + pos * rope->cos_sin_stride);
    }
    return 0;
}

int blc_cache_write(const mlaf_kv_cache_job *j, const void *k_nope, const void *k_pe,
                    int threads) {
    const mlaf_dtype dt = j->norm.dt, cdt = j->cache_dt;
    const int32_t C = j->norm.C, R = j->norm.R;
    const int64_t nslots = j->num_blocks * j->block_size;
    const size_t ces = mlaf_dtype_size(cdt);
    threads = team(j->norm.T, C + R, threads);
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int64_t t = 0; t < j->norm.T; t++) {
        int64_t slot = t < j->n_map ? mlaf_load_index(j->slots, j->slot_dt, t) : -1;
        if (slot < 0 || slot >= nslots) continue;
        char *dst = (char *)j->cache +
                    (size_t)((slot / j->block_size) * j->cache_s0 + (slot % j->block_size) * j->cache_s1) * ces;
        const void *kn = CROW(k_nope, dt, t, C), *kp = CROW(k_pe, dt, t, R);
        if (cdt == dt) {
            memcpy(dst, kn, (size_t)C * ces);
            if (R > 0) memcpy(dst + (size_t)C * ces, kp, (size_t)R * ces);
        } else {
            for (int32_t i = 0; i < C; i++) mlaf_store_f32(dst, cdt, i, mlaf_load_f32(kn, dt, i));
            for (int32_t i = 0; i < R; i++) mlaf_store_f32(dst, cdt, C + i, mlaf_load_f32(kp, dt, i));
        }
    }
    return 0;
}

/* The scale of an fp8_ds_mla tile from its (NaN-free) amax, per mode (docs/kv_formats.md): amax
 * max(amax / 448, FLT_MIN); ue8m0 2^ceil_log2(max(amax, 1e-4) / 448); ue8m0_floor_scaled
 * 2^ceil_log2(max(amax / 448, 1e-4)). The power of two is built from its exponent bits
 * (ceil_log2 of +inf is 128, whose 2^128 is +inf). */
static float tile_scale(float amax, mlaf_tile_scale mode) {
    if (mode == MLAF_TILE_AMAX) return fmaxf(amax / 448.0f, FLT_MIN);
    const float v = mode == MLAF_TILE_UE8M0 ? fmaxf(amax, 1e-4f) / 448.0f : fmaxf(amax / 448.0f, 1e-4f);
    return mlaf_bits_f32((uint32_t)(mlaf_ceil_log2_f32(v) + 127) << 23);
}

/* n values of a dense row widened to fp32 */
static void widen(const void *src, mlaf_dtype dt, int32_t n, float *x) {
    for (int32_t i = 0; i < n; i++) x[i] = mlaf_load_f32(src, dt, i);
}

int blc_cache_write_fp8(const mlaf_kv_cache_job *j, const void *k_nope, const void *k_pe, int threads,
                        const mlaf_norm_kern *k) {
    const mlaf_dtype dt = j->norm.dt;
    const size_t es = mlaf_dtype_size(dt);
    const int32_t C = j->norm.C, R = j->norm.R;
    const int64_t nslots = j->num_blocks * j->block_size;
    const int ds = j->format == MLAF_KV_FP8_DS_MLA, v4 = j->format == MLAF_KV_FP8_V4;
    if (j->format != MLAF_KV_FP8 && !ds && !v4) return -1;
    if (C > 4096 || R > 4096) return -1; /* the rows' fp32 buffers */
    /* the CPU backend's memory is host memory: the scale is read here, once per call */
    const float scale = ds || v4 ? 1.0f : *j->scale;
    const int div = j->conv != MLAF_FP8_MUL;
    threads = team(j->norm.T, C + R, threads);
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int64_t t = 0; t < j->norm.T; t++) {
        const int64_t slot = t < j->n_map ? mlaf_load_index(j->slots, j->slot_dt, t) : -1;
        if (slot < 0 || slot >= nslots) continue;
        const int64_t blk = slot / j->block_size, off = slot % j->block_size;
        /* cache dtypes u8 / fp8_e4m3: strides in elements are strides in bytes */
        uint8_t *dst = (uint8_t *)j->cache + blk * j->cache_s0 + off * j->cache_s1;
        const char *kn = CROW(k_nope, dt, t, C), *kp = CROW(k_pe, dt, t, R);
        float x[4096]; /* the row as stored, in fp32 (round_amax rounds it in place: no change
                        * to a stored row's values, only its amax is used) */
        if (v4) { /* fp8_v4 (docs/kv_formats.md; bf16 rows of 512, the last 64 roped): a planar page */
            uint8_t *page = (uint8_t *)j->cache + blk * j->cache_s0;
            uint8_t *data = page + off * 576, *sc = page + j->block_size * 576 + off * 8;
            widen(kn, dt, 448, x);
            for (int32_t b = 0; b < 7; b++) {
                const int e = mlaf_ue8m0_exponent(k->round_amax(x + 64 * b, 64, dt, x + 64 * b, 0.0f));
                k->e4m3(x + 64 * b, 64, mlaf_exp2_neg_f32(e), 0, data + 64 * b);
                sc[b] = mlaf_ue8m0_byte(e);
            }
            sc[7] = 0;
            memcpy(data + 448, kn + 448 * es, 64 * es);
            continue;
        }
        if (!ds) {
            widen(kn, dt, C, x);
            k->e4m3(x, C, scale, div, dst);
            if (R > 0) {
                widen(kp, dt, R, x);
                k->e4m3(x, R, scale, div, j->kpe ? (uint8_t *)j->kpe + blk * j->kpe_s0 + off * j->kpe_s1 : dst + C);
            }
            continue;
        }
        /* fp8_ds_mla (bf16 rows): [C e4m3 | C/128 f32 scales | R bf16 rope values] */
        widen(kn, dt, C, x);
        for (int32_t tile = 0; tile < C / 128; tile++) {
            float *xt = x + 128 * tile;
            const float s = tile_scale(k->round_amax(xt, 128, dt, xt, 0.0f), j->tile_scale); /* NaN ignored */
            k->e4m3(xt, 128, s, 1, dst + 128 * tile);
            const uint32_t sb = mlaf_f32_bits(s);
            for (int q = 0; q < 4; q++) dst[C + 4 * tile + q] = (uint8_t)(sb >> (8 * q)); /* little-endian */
        }
        if (R > 0) memcpy(dst + C + C / 32, kp, (size_t)R * es);
    }
    return 0;
}

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
        memcpy(dst, CROW(gather, dt, r, R), (size_t)R * es);
    }
    return 0;
}

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

/* ---- the DSA indexer key chain (docs/dsa.md), as separate passes ------------------------------ */
/* 1. LayerNorm of index_k into dense rows [T, 128] (rounded to the latent dtype); 2. RoPE of their
 * first 64 columns (blc_rope_rows with the indexer's style); 3. the Hadamard, when on; 4. the
 * quantize-and-write pass: each row's scale and e4m3 bytes into the block-planar index cache at
 * its slot (tokens t >= n_map and slots outside the cache skipped). index_math.h's arithmetic,
 * its LayerNorm and quantization by the fused op's own functions (k: its kernels), so the cache
 * bytes equal the fused op's and the passes are compared, not the conversion code. */
#include "index_math.h"

int blc_index_k(const mlaf_kv_cache_job *kv, const mlaf_index_job *ix, void *dense, int threads,
                const mlaf_norm_kern *k) {
    const mlaf_dtype dt = kv->norm.dt;
    const int64_t T = kv->norm.T, cap = kv->num_blocks * kv->block_size;
    const int th = team(T, MLAF_IDX_D, threads);
    float w[MLAF_IDX_D], b[MLAF_IDX_D];
    for (int i = 0; i < MLAF_IDX_D; i++) w[i] = mlaf_load_f32(ix->w, ix->w_dt, i), b[i] = mlaf_load_f32(ix->b, ix->w_dt, i);
#ifdef _OPENMP
#pragma omp parallel for num_threads(th) schedule(static)
#endif
    for (int64_t t = 0; t < T; t++) {
        float x[MLAF_IDX_D], y[MLAF_IDX_D];
        for (int i = 0; i < MLAF_IDX_D; i++) x[i] = mlaf_load_f32(CROW(ix->k, dt, t, ix->k_stride), dt, i);
        mlaf_cpu_index_layernorm(k, x, w, b, ix->ln_eps, dt, y);
        for (int i = 0; i < MLAF_IDX_D; i++) mlaf_store_f32(ROW(dense, dt, t, MLAF_IDX_D), dt, i, y[i]);
    }
    mlaf_rope_job r = kv->rope;
    r.style = ix->style;
    int rc = blc_rope_rows(dense, dt, T, MLAF_IDX_D, &r, threads);
    if (rc) return rc;
    if (ix->hadamard) {
#ifdef _OPENMP
#pragma omp parallel for num_threads(th) schedule(static)
#endif
        for (int64_t t = 0; t < T; t++) {
            float y[MLAF_IDX_D];
            for (int i = 0; i < MLAF_IDX_D; i++) y[i] = mlaf_load_f32(CROW(dense, dt, t, MLAF_IDX_D), dt, i);
            mlaf_index_hadamard(y, dt);
            for (int i = 0; i < MLAF_IDX_D; i++) mlaf_store_f32(ROW(dense, dt, t, MLAF_IDX_D), dt, i, y[i]);
        }
    }
#ifdef _OPENMP
#pragma omp parallel for num_threads(th) schedule(static)
#endif
    for (int64_t t = 0; t < kv->n_map; t++) {
        const int64_t slot = mlaf_load_index(kv->slots, kv->slot_dt, t);
        if (slot < 0 || slot >= cap) continue;
        float y[MLAF_IDX_D];
        for (int i = 0; i < MLAF_IDX_D; i++) y[i] = mlaf_load_f32(CROW(dense, dt, t, MLAF_IDX_D), dt, i);
        uint8_t *base = ix->cache + (slot / kv->block_size) * ix->block_stride;
        const int64_t off = slot % kv->block_size;
        const float s = mlaf_cpu_index_quantize(k, y, ix->amax_eps, ix->scale, base + off * MLAF_IDX_D);
        mlaf_index_put_f32(base + kv->block_size * MLAF_IDX_D + 4 * off, s);
    }
    return 0;
}
