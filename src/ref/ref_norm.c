/*
 * ref_norm.c — the float64 oracle of split_qk_norm, mla_kv_cache and rope_q (docs/mla.md), and of
 * rms_norm_quant's dense part (docs/gemm_formats.md).
 *
 * Plain loops, one step at a time, no fusion: read the inputs of a validated job (host
 * memory), compute in double, write dense unrounded results. The checks (verify_*.c, verify_case.h)
 * round them once to the output dtype.
 */
#include <math.h>
#include <string.h>

#include "../half.h"
#include "verify.h"

/* RMSNorm of n values of a row: out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i]. */
static void ref_rmsnorm(const void *x, mlaf_dtype dt, int64_t n, double eps, const void *w,
                        mlaf_dtype wdt, double *out) {
    double sumsq = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double v = mlaf_load_f32(x, dt, i);
        sumsq += v * v;
    }
    double rstd = 1.0 / sqrt(sumsq / (double)n + eps);
    for (int64_t i = 0; i < n; i++)
        out[i] = (double)mlaf_load_f32(x, dt, i) * rstd * (double)mlaf_load_f32(w, wdt, i);
}

void mlaf_ref_split_qk_norm(const mlaf_norm_job *job, double *q, double *k_nope, double *k_pe) {
    const int32_t Q = job->Q, C = job->C, R = job->R;
    const size_t es = mlaf_dtype_size(job->dt);
    for (int64_t t = 0; t < job->T; t++) {
        const char *row = (const char *)job->latent + t * job->latent_stride * (int64_t)es;
        if (Q > 0 && q)
            ref_rmsnorm(row, job->dt, Q, job->eps_q, job->w_q, job->w_q_dt, q + t * Q);
        ref_rmsnorm(row + (int64_t)Q * es, job->dt, C, job->eps_kv, job->w_kv, job->w_kv_dt,
                    k_nope + t * C);
        if (k_pe)
            for (int32_t r = 0; r < R; r++)
                k_pe[t * R + r] = mlaf_load_f32(row, job->dt, (int64_t)Q + C + r);
    }
}

void mlaf_ref_rope_row(double *x, int32_t R, mlaf_rope_style style, const float *cos_sin_row) {
    if (style == MLAF_ROPE_NONE) return; /* the values stay as read */
    int32_t half = R / 2;
    for (int32_t i = 0; i < half; i++) {
        int32_t a = style == MLAF_ROPE_NEOX ? i : 2 * i;
        int32_t b = style == MLAF_ROPE_NEOX ? i + half : 2 * i + 1;
        double c = cos_sin_row[i], s = cos_sin_row[half + i];
        double x0 = x[a], x1 = x[b];
        x[a] = x0 * c - x1 * s;
        x[b] = x1 * c + x0 * s;
    }
}

/* Style none reads no position: every token's is usable. */
static int position_ok(const mlaf_rope_job *r, int64_t t, int64_t *pos) {
    *pos = r->style == MLAF_ROPE_NONE ? 0 : mlaf_load_index(r->positions, r->pos_dt, t);
    return r->style == MLAF_ROPE_NONE || (*pos >= 0 && *pos < r->max_pos);
}

/* The cos / sin row of a usable position (NULL for style none: nothing reads it). */
static const float *cs_row(const mlaf_rope_job *r, int64_t pos) {
    return r->style == MLAF_ROPE_NONE ? NULL : r->cos_sin + pos * r->cos_sin_stride;
}

void mlaf_ref_mla_kv_cache(const mlaf_kv_cache_job *job, double *q, double *k_nope, double *k_pe,
                           double *rows, int8_t *status) {
    const mlaf_norm_job *n = &job->norm;
    const int32_t C = n->C, R = n->R, tail = job->kv_tail;
    const size_t es = mlaf_dtype_size(n->dt);
    const int64_t slots_in_cache = job->num_blocks * job->block_size;
    for (int64_t t = 0; t < n->T; t++) {
        const char *row = (const char *)n->latent + t * n->latent_stride * (int64_t)es;
        /* 1. the two norms, exactly as split_qk_norm */
        mlaf_norm_job one = *n;
        one.T = 1;
        one.latent = row;
        mlaf_ref_split_qk_norm(&one, q ? q + t * n->Q : NULL, k_nope + t * C, NULL);
        /* 2. which tokens write: slot < 0 skips, a slot past the cache or an unusable position
         * is an error (counted, nothing of the rope part written) */
        int64_t slot = t < job->n_map ? mlaf_load_index(job->slots, job->slot_dt, t) : -1;
        int64_t pos = 0;
        int bad = slot >= slots_in_cache || ((R > 0 || tail > 0) && !position_ok(&job->rope, t, &pos));
        status[t] = bad ? -1 : (slot < 0 ? 0 : 1);
        /* 2b. kv_rope_tail (docs/mla.md): the normalized kv rounded to the latent dtype, then its last
         * `tail` values rotated (interleaved); nothing of the tail is defined for a bad token. */
        if (tail > 0) {
            double *kt = k_nope + t * C + (C - tail);
            for (int32_t i = 0; i < tail; i++) kt[i] = bad ? NAN : mlaf_round_to(kt[i], n->dt);
            if (!bad)
                mlaf_ref_rope_row(kt, tail, MLAF_ROPE_INTERLEAVED,
                                  job->rope.cos_sin + pos * job->rope.cos_sin_stride);
        }
        /* 3. RoPE of k_pe, computed where it is kept: the cache row's tail or the dense k_pe */
        double *pe = rows ? rows + t * ((int64_t)C + R) + C : (k_pe ? k_pe + t * R : NULL);
        if (pe) {
            for (int32_t r = 0; r < R; r++) pe[r] = mlaf_load_f32(row, n->dt, (int64_t)n->Q + C + r);
            if (!bad && R > 0)
                mlaf_ref_rope_row(pe, R, job->rope.style, cs_row(&job->rope, pos));
        }
        /* Nothing of the rope part is defined for a bad token. */
        if (k_pe)
            for (int32_t r = 0; r < R; r++) k_pe[t * R + r] = bad ? NAN : pe[r];
        /* 4. the cache row [k_nope | rope(k_pe)] */
        if (rows) memcpy(rows + t * ((int64_t)C + R), k_nope + t * C, (size_t)C * sizeof(double));
    }
}

void mlaf_ref_rope_q(const mlaf_rope_q_job *job, double *q_out, int8_t *status) {
    const size_t es = mlaf_dtype_size(job->dt);
    const int32_t D = job->D, R = job->rope.R;
    const int64_t HP = job->q_out ? job->Hpad : job->H;
    for (int64_t t = 0; t < job->T; t++) {
        int64_t pos;
        int ok = position_ok(&job->rope, t, &pos);
        status[t] = ok ? 1 : -1;
        for (int64_t h = job->H; h < HP; h++) /* q_out's padding heads: +0.0 */
            for (int32_t d = 0; d < D; d++) q_out[(t * HP + h) * D + d] = 0.0;
        for (int64_t h = 0; h < job->H; h++) {
            const char *head = (const char *)job->q + (t * job->s0 + h * job->s1) * (int64_t)es;
            double *dst = q_out + (t * HP + h) * D;
            for (int32_t d = 0; d < D; d++) dst[d] = mlaf_load_f32(head, job->dt, d);
            if (job->head_norm) { /* docs/mla.md, head_norm: weightless RMSNorm of the whole head first */
                double ss = 0.0;
                for (int32_t d = 0; d < D; d++) ss += dst[d] * dst[d];
                const double rstd = 1.0 / sqrt(ss / (double)D + (double)job->head_eps);
                for (int32_t d = 0; d < D; d++) dst[d] *= rstd;
            }
            if (ok)
                mlaf_ref_rope_row(dst + (D - R), R, job->rope.style, cs_row(&job->rope, pos));
        }
    }
}

void mlaf_ref_rms_norm_quant(const mlaf_rms_norm_quant_job *job, double *h, double *y) {
    const int64_t K = job->K, es = (int64_t)mlaf_dtype_size(job->dt);
    for (int64_t t = 0; t < job->T; t++) {
        const char *x = (const char *)job->x + t * job->x_stride * es;
        const char *r = job->residual ? (const char *)job->residual + t * job->r_stride * es : NULL;
        double *ht = h + t * K;
        /* the sum rounded once to the dtype (the f32 sum of two values of the dtype, rounded again,
         * is the same value: no double rounding reaches a tie of the dtype) */
        for (int64_t i = 0; i < K; i++)
            ht[i] = r ? mlaf_round_to((double)mlaf_load_f32(x, job->dt, i) + (double)mlaf_load_f32(r, job->dt, i), job->dt)
                      : (double)mlaf_load_f32(x, job->dt, i);
        double ss = 0.0;
        for (int64_t i = 0; i < K; i++) ss += ht[i] * ht[i];
        const double rstd = 1.0 / sqrt(ss / (double)K + (double)job->eps);
        for (int64_t i = 0; i < K; i++) y[t * K + i] = ht[i] * rstd * (double)mlaf_load_f32(job->w, job->w_dt, i);
    }
}
