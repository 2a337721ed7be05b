/*
 * ref_moe.c — the float64 oracle of moe_gate (docs/moe_gate.md) and the check that compares a
 * backend with it (docs/conventions.md).
 *
 * The oracle follows the header's text step by step, with plain loops and no cleverness:
 *   1. s = sigmoid(x), softmax over the valid logits or sqrt(softplus(x)); an expert is
 *      "valid" when its logit and its bias entry (if any) are finite.
 *   2. c = s + bias.
 *   3. group scores over valid experts only (top-2 sum or max); keep the topk_group best
 *      (valid groups first, then score descending, then lower group index).
 *   4. top_k rounds of "best remaining expert of a kept group" under the total order
 *      (valid first, c descending, lower index first).
 *   5. weights, renormalization, scaling, shared experts.
 *
 * The check accepts a backend's ids when, position by position, the oracle's c of the id it
 * chose equals the oracle's own choice there to within 1e-6 relative to |s| + |bias| (the
 * magnitude of the terms of c, so a cancelling bias does not make the test stricter than
 * fp32 can be). Invalid choices must match the oracle's ids exactly: their order is defined
 * by index alone. Where two groups' scores tie within 2e-6 relative across the topk_group
 * boundary, a backend that kept the other group is judged against the oracle's selection
 * from the groups it kept. Weights are then recomputed from the backend's own ids with the
 * oracle's scores, so an accepted near-tie swap is judged on its weights too.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../half.h"
#include "verify.h"

#define REF_MAX_E 2048
#define REF_MAX_G 64

/* Everything the oracle knows about one token. */
typedef struct ref_token {
    double s[REF_MAX_E];
    double c[REF_MAX_E];
    int valid[REF_MAX_E];
    double gscore[REF_MAX_G];
    int gvalid[REF_MAX_G];
    int kept[REF_MAX_G];
    int32_t ids[64];
    double sel[65];
} ref_token;

/* a ranks strictly before b (valid first, larger value, then lower index). */
static int ranks_before(int va, double a, int ia, int vb, double b, int ib) {
    if (va != vb) return va > vb;
    if (va && a != b) return a > b;
    return ia < ib;
}

/* 4. top_k rounds of the best remaining expert of the groups marked in kept: ids[top_k] and
 * their c in sel, sel[top_k] the best expert not chosen (-inf if none or invalid). */
static void ref_select(const mlaf_moe_gate_job *job, const ref_token *r, const int *kept,
                       int32_t *ids, double *sel) {
    const int32_t E = job->E, P = E / job->n_group;
    int taken[REF_MAX_E];
    memset(taken, 0, sizeof(int) * (size_t)E);
    for (int32_t j = 0; j <= job->top_k; j++) {
        int32_t best = -1;
        for (int32_t e = 0; e < E; e++) {
            if (taken[e] || !kept[e / P]) continue;
            if (best < 0 ||
                ranks_before(r->valid[e], r->c[e], e, r->valid[best], r->c[best], best))
                best = e;
        }
        sel[j] = (best >= 0 && r->valid[best]) ? r->c[best] : -INFINITY;
        if (j < job->top_k) {
            ids[j] = best;
            if (best >= 0) taken[best] = 1;
        }
    }
}

static double ref_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* sqrt(softplus(x)) in float64: softplus(x) = max(x, 0) + log1p(exp(-|x|)), no overflow. */
static double ref_sqrt_softplus(double x) {
    return sqrt(fmax(x, 0.0) + log1p(exp(-fabs(x))));
}

/* The oracle's float64 s of one finite logit for an elementwise score function (score.h); NULL
 * for a row-wise one (softmax, computed over the row below). */
static double (*ref_score(mlaf_score_func f))(double) {
    switch (f) {
    case MLAF_SCORE_SIGMOID: return ref_sigmoid;
    case MLAF_SCORE_SQRT_SOFTPLUS: return ref_sqrt_softplus;
    default: return NULL;
    }
}

void mlaf_ref_moe_scores(const mlaf_moe_gate_job *job, int64_t t, double *s) {
    const int32_t E = job->E;
    const char *row = (const char *)job->logits +
                      (size_t)(t * job->logits_stride) * mlaf_dtype_size(job->logits_dt);
    double xmax = -INFINITY, sum = 0.0;
    for (int32_t e = 0; e < E; e++) {
        double x = mlaf_load_f32(row, job->logits_dt, e);
        if (isfinite(x) && x > xmax) xmax = x;
    }
    double (*const f)(double) = ref_score(job->score_func);
    if (!f) /* softmax, the row-wise score */
        for (int32_t e = 0; e < E; e++) {
            double x = mlaf_load_f32(row, job->logits_dt, e);
            if (isfinite(x)) sum += exp(x - xmax);
        }
    for (int32_t e = 0; e < E; e++) {
        double x = mlaf_load_f32(row, job->logits_dt, e);
        if (!isfinite(x))
            s[e] = NAN;
        else
            s[e] = f ? f(x) : exp(x - xmax) / sum;
    }
}

static void ref_token_run(const mlaf_moe_gate_job *job, int64_t t, ref_token *r) {
    const int32_t E = job->E, G = job->n_group, P = E / G;
    /* 1. scores */
    mlaf_ref_moe_scores(job, t, r->s);
    for (int32_t e = 0; e < E; e++) {
        double b = job->bias ? (double)job->bias[e] : 0.0;
        r->valid[e] = isfinite(r->s[e]) && isfinite(b);
        r->c[e] = r->valid[e] ? r->s[e] + b : -INFINITY;
    }
    /* 3. groups */
    for (int32_t g = 0; g < G; g++) r->kept[g] = 1;
    if (G > 1) {
        for (int32_t g = 0; g < G; g++) {
            double m1 = -INFINITY, m2 = -INFINITY;
            int n = 0;
            for (int32_t e = g * P; e < (g + 1) * P; e++) {
                if (!r->valid[e]) continue;
                n++;
                if (r->c[e] > m1) {
                    m2 = m1;
                    m1 = r->c[e];
                } else if (r->c[e] > m2) {
                    m2 = r->c[e];
                }
            }
            r->gvalid[g] = n > 0;
            if (n == 0)
                r->gscore[g] = -INFINITY;
            else if (job->group_score == MLAF_GROUP_MAX || n == 1)
                r->gscore[g] = m1;
            else
                r->gscore[g] = m1 + m2;
        }
        for (int32_t g = 0; g < G; g++) {
            int better = 0;
            for (int32_t h = 0; h < G; h++)
                if (h != g && ranks_before(r->gvalid[h], r->gscore[h], h, r->gvalid[g],
                                           r->gscore[g], g))
                    better++;
            r->kept[g] = better < job->topk_group;
        }
    }
    /* 4. */
    ref_select(job, r, r->kept, r->ids, r->sel);
}

/* 5. weights of a chosen list, by the oracle's scores (also used on a backend's ids). */
static void ref_weights(const mlaf_moe_gate_job *job, const ref_token *r, const int32_t *ids,
                        double *w) {
    double sum = 0.0;
    for (int32_t j = 0; j < job->top_k; j++) {
        int32_t e = ids[j];
        w[j] = (e >= 0 && e < job->E && r->valid[e]) ? r->s[e] : 0.0;
        sum += w[j];
    }
    double denom = sum + (double)job->eps;
    double routed = sum;
    if (job->renormalize) {
        routed = 0.0;
        for (int32_t j = 0; j < job->top_k; j++) {
            if (denom > 0.0) w[j] /= denom;
            routed += w[j];
        }
    }
    if (job->apply_scaling)
        for (int32_t j = 0; j < job->top_k; j++) w[j] *= (double)job->scaling;
    for (int32_t j = 0; j < job->n_shared; j++) w[job->top_k + j] = routed / (double)job->scaling;
}

void mlaf_ref_moe_gate(const mlaf_moe_gate_job *job, double *weights, int32_t *ids, double *sel,
                       double *scores) {
    ref_token *r = (ref_token *)malloc(sizeof *r);
    if (!r) return;
    for (int64_t t = 0; t < job->T; t++) {
        ref_token_run(job, t, r);
        int32_t *id = ids + t * job->K;
        for (int32_t j = 0; j < job->top_k; j++) id[j] = r->ids[j];
        for (int32_t j = 0; j < job->n_shared; j++) id[job->top_k + j] = job->E + j;
        ref_weights(job, r, id, weights + t * job->K);
        memcpy(sel + t * (job->top_k + 1), r->sel, sizeof(double) * (size_t)(job->top_k + 1));
        if (scores) memcpy(scores + t * job->E, r->s, sizeof(double) * (size_t)job->E);
    }
    free(r);
}

/* ---- the check ------------------------------------------------------------------------- */

/* |s| + |bias| of expert e: the magnitude of the terms of c. */
static double c_scale(const mlaf_moe_gate_job *job, const ref_token *r, int32_t e) {
    double b = job->bias ? fabs((double)job->bias[e]) : 0.0;
    return fabs(r->s[e]) + b;
}

/* Are groups g and h valid and within a near-tie of each other (2e-6 relative)? */
static int groups_tie(const ref_token *r, int32_t g, int32_t h) {
    if (!r->gvalid[g] || !r->gvalid[h]) return 0;
    double tol = 2e-6 * fmax(fmax(fabs(r->gscore[h]), fabs(r->gscore[g])), 1e-30);
    return fabs(r->gscore[h] - r->gscore[g]) <= tol;
}

/* Position by position, is got[j] the oracle's choice ids[j] (selection values sel) or within
 * a near-tie of it, from a group the selection kept? NULL if so, else why not. */
static const char *check_positions(const mlaf_moe_gate_job *job, const ref_token *r,
                                   const int *kept, const int32_t *ids, const double *sel,
                                   const int32_t *got, char *why, size_t cap) {
    const int32_t P = job->E / job->n_group;
    for (int32_t j = 0; j < job->top_k; j++) {
        int32_t e = got[j];
        if (e == ids[j]) continue;
        int ok = r->valid[e] && isfinite(sel[j]) && kept[e / P];
        if (ok) {
            double tol = 1e-6 * fmax(fmax(c_scale(job, r, e), c_scale(job, r, ids[j])), 1e-30);
            ok = fabs(r->c[e] - sel[j]) <= tol;
        }
        if (!ok) {
            snprintf(why, cap, "ids[%d] = %d (c = %.9g), oracle %d (c = %.9g)", j, e,
                     r->valid[e] ? r->c[e] : NAN, ids[j], sel[j]);
            return why;
        }
    }
    return NULL;
}

/* The groups a backend kept when two groups' scores nearly tie across the topk_group boundary
 * (docs/conventions.md accepts either): the oracle's kept set with each group of got[] that the oracle
 * dropped swapped for a kept group it nearly ties and that got[] does not use. 0 if got[]
 * cannot come from such a set. */
static int swapped_groups(const mlaf_moe_gate_job *job, const ref_token *r, const int32_t *got,
                          int *kept) {
    const int32_t G = job->n_group, P = job->E / G;
    int used[REF_MAX_G] = {0};
    for (int32_t j = 0; j < job->top_k; j++) used[got[j] / P] = 1;
    memcpy(kept, r->kept, sizeof(int) * (size_t)G);
    int swapped = 0;
    for (int32_t g = 0; g < G; g++) {
        if (!used[g] || kept[g]) continue;
        int32_t out = -1;
        for (int32_t h = 0; h < G && out < 0; h++)
            if (kept[h] && r->kept[h] && !used[h] && groups_tie(r, g, h)) out = h;
        if (out < 0) return 0;
        kept[out] = 0;
        kept[g] = 1;
        swapped = 1;
    }
    return swapped;
}

/* Returns NULL when the backend's ids for this token are acceptable, else why not. */
static const char *check_ids(const mlaf_moe_gate_job *job, const ref_token *r,
                             const int32_t *got, char *why, size_t cap) {
    const int32_t E = job->E;
    for (int32_t j = 0; j < job->top_k; j++) {
        int32_t e = got[j];
        if (e < 0 || e >= E) {
            snprintf(why, cap, "ids[%d] = %d out of [0, %d)", j, e, E);
            return why;
        }
        for (int32_t i = 0; i < j; i++)
            if (got[i] == e) {
                snprintf(why, cap, "ids[%d] = ids[%d] = %d (duplicate)", j, i, e);
                return why;
            }
    }
    for (int32_t j = 0; j < job->n_shared; j++)
        if (got[job->top_k + j] != E + j) {
            snprintf(why, cap, "shared ids[%d] = %d, expected %d", job->top_k + j,
                     got[job->top_k + j], E + j);
            return why;
        }
    if (memcmp(got, r->ids, sizeof(int32_t) * (size_t)job->top_k) == 0) return NULL;
    /* groups the oracle kept, or dropped within a near-tie of a kept one */
    int near[REF_MAX_G];
    for (int32_t g = 0; g < job->n_group; g++) {
        near[g] = r->kept[g];
        for (int32_t h = 0; h < job->n_group && !near[g]; h++) near[g] = r->kept[h] && groups_tie(r, g, h);
    }
    if (!check_positions(job, r, near, r->ids, r->sel, got, why, cap)) return NULL;
    /* A near-tie of two groups' scores at the topk_group boundary: the backend may keep the
     * other group, and then its experts are judged against the oracle's selection from the
     * groups it kept. */
    int kept[REF_MAX_G];
    int32_t ids[64];
    double sel[65];
    if (job->n_group > 1 && swapped_groups(job, r, got, kept)) {
        char why2[160];
        ref_select(job, r, kept, ids, sel);
        if (!check_positions(job, r, kept, ids, sel, got, why2, sizeof why2)) return NULL;
    }
    return why;
}

const char *mlaf_ref_moe_gate_check_token(const mlaf_moe_gate_job *job, int64_t t,
                                          const int32_t *got, char *why, size_t cap) {
    if (job->E > REF_MAX_E || job->n_group > REF_MAX_G || job->top_k > 64) {
        snprintf(why, cap, "shape beyond the oracle (E = %d, groups = %d, top_k = %d)",
                 (int)job->E, (int)job->n_group, (int)job->top_k);
        return why;
    }
    ref_token *r = (ref_token *)malloc(sizeof *r);
    if (!r) {
        snprintf(why, cap, "out of host memory");
        return why;
    }
    ref_token_run(job, t, r);
    /* check_ids also checks the shared ids: give it the routed ids and the shared ones */
    int32_t ids[64 + 64];
    for (int32_t j = 0; j < job->top_k; j++) ids[j] = got[j];
    for (int32_t j = 0; j < job->n_shared && job->top_k + j < 128; j++) ids[job->top_k + j] = job->E + j;
    const char *bad = check_ids(job, r, ids, why, cap);
    free(r);
    return bad;
}

static size_t elem_bytes(mlaf_dtype dt) { return mlaf_dtype_size(dt); }

/* 1 if every byte of [p, p + n) is 0xFF (the poison). */
static int still_poison(const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != 0xFFu) return 0;
    return 1;
}

/* What the per-token check of mlaf_verify_moe_gate reads: the job (host inputs) and the
 * backend's outputs as downloaded. */
typedef struct moe_check {
    const mlaf_moe_gate_job *job;
    mlaf_dtype wdt;
    size_t wsz;
    int32_t K, E;
    int64_t T, ws, is, ss;
    int strided, have_s;
    const unsigned char *w, *i, *s; /* weights, ids, scores (NULL: none) */
} moe_check;

/* Token t against the oracle (rt: scratch): 1 if its ids, weights, scores and the padding after
 * its rows pass, else 0 and why. *worst rises to the token's worst error in units. */
static int moe_check_token(const moe_check *m, ref_token *rt, int64_t t, double *worst, char *why,
                           size_t cap) {
    const mlaf_moe_gate_job *job = m->job;
    const int32_t K = m->K, E = m->E;
    ref_token_run(job, t, rt);
    const unsigned char *wrow = m->w + (size_t)(t * m->ws) * m->wsz;
    const int32_t *irow = (const int32_t *)(m->i + (size_t)(t * m->is) * 4);
    int32_t got[128];
    memcpy(got, irow, sizeof(int32_t) * (size_t)K);
    char idwhy[200];
    const char *bad = check_ids(job, rt, got, idwhy, sizeof idwhy);
    if (bad) {
        snprintf(why, cap, "token %lld: %s", (long long)t, bad);
        return 0;
    }
    double ew[128], rowmag = 0.0;
    ref_weights(job, rt, got, ew);
    for (int32_t j = 0; j < K; j++) rowmag += fabs(ew[j]);
    for (int32_t j = 0; j < K; j++) {
        double g = mlaf_load_f32(wrow, m->wdt, j);
        double u = mlaf_err_units(g, ew[j], m->wdt, ew[j]);
        /* A floor: weights far below the row's total are judged against it. */
        double ua = fabs(g - ew[j]) / (1e-5 * fmax(rowmag, 1e-30));
        if (ua < u) u = ua;
        if (isnan(g)) u = INFINITY;
        if (u > *worst) *worst = u;
        if (u > 1.0) {
            snprintf(why, cap, "token %lld: weights[%d] = %.9g, expected %.9g (id %d)", (long long)t, j,
                     g, ew[j], got[j]);
            return 0;
        }
    }
    if (m->have_s) {
        const float *srow = (const float *)(m->s + (size_t)(t * m->ss) * 4);
        for (int32_t e = 0; e < E; e++) {
            double u = mlaf_err_units(srow[e], rt->s[e], MLAF_F32, rt->s[e]);
            /* softmax rows: judge tiny probabilities against the row's total (1) */
            double ua = fabs(srow[e] - rt->s[e]) / 1e-5;
            if (!isnan(ua) && ua < u) u = ua;
            if (u > *worst && isfinite(u)) *worst = u;
            if (u > 1.0) {
                snprintf(why, cap, "token %lld: scores[%d] = %.9g, expected %.9g", (long long)t, e,
                         srow[e], rt->s[e]);
                return 0;
            }
        }
    }
    /* Padding between strided output rows must stay untouched. */
    if (m->strided && t + 1 < m->T) {
        if (!still_poison(wrow + (size_t)K * m->wsz, (size_t)(m->ws - K) * m->wsz) ||
            !still_poison(irow + K, (size_t)(m->is - K) * 4) ||
            (m->have_s && !still_poison(m->s + (size_t)(t * m->ss + E) * 4, (size_t)(m->ss - E) * 4))) {
            snprintf(why, cap, "token %lld: the padding after an output row was written", (long long)t);
            return 0;
        }
    }
    return 1;
}

/* mlaf_run_items' item k: tokens [64 k, 64 k + 64) up to the first failing one (scratch: a
 * ref_token). */
#define MOE_ITEM_TOKENS 64
static void moe_token_item(const void *arg, void *scratch, int64_t k, mlaf_item_out *out) {
    const moe_check *m = (const moe_check *)arg;
    const int64_t end = (k + 1) * MOE_ITEM_TOKENS < m->T ? (k + 1) * MOE_ITEM_TOKENS : m->T;
    for (int64_t t = k * MOE_ITEM_TOKENS; t < end && !out->failed; t++)
        out->failed = !moe_check_token(m, (ref_token *)scratch, t, &out->worst, out->why, sizeof out->why);
}

/* The inputs of a moe_gate case: logits rows [T, E] (row stride ls, padding left as it is)
 * and bias [E]. Sigmoid routers see logits of a few units; softmax ones the same. nonfinite:
 * NaN / +-inf in some rows, whole rows, and one bias entry. moe_wide: a few logits per row
 * drawn from large magnitudes (+-1e4, +-100, around +-20 where sqrt_softplus changes its
 * formula, below -174 where exp(x / 2) leaves the fp32 normals). */
void mlaf_ref_moe_fill(const mlaf_verify_case *c, mlaf_rng *rng, void *logits, mlaf_dtype dt,
                       int64_t T, int32_t E, int64_t ls, float *bhost) {
    unsigned char *lhost = (unsigned char *)logits;
    const size_t lsz = mlaf_dtype_size(dt);
    mlaf_fill_normal_rows(rng, lhost, dt, T, (size_t)E, ls, 0.0, 2.0);
    for (int32_t e = 0; e < E; e++) bhost[e] = (float)(0.3 * mlaf_rng_normal(rng));
    if (c->nonfinite) {
        const float bad[3] = {NAN, INFINITY, -INFINITY};
        for (int64_t t = 0; t < T; t++) {
            void *row = lhost + (size_t)(t * ls) * lsz;
            uint64_t u = mlaf_rng_u64(rng);
            if (u % 7 == 0) { /* the whole row invalid */
                for (int32_t e = 0; e < E; e++) mlaf_store_f32(row, dt, e, bad[(u >> 8) % 3]);
            } else if (u % 7 <= 4) { /* a few invalid entries */
                int n = 1 + (int)((u >> 8) % 8);
                for (int i = 0; i < n; i++) {
                    uint64_t v = mlaf_rng_u64(rng);
                    mlaf_store_f32(row, dt, (int64_t)(v % (uint64_t)E), bad[(v >> 32) % 3]);
                }
            } /* else: a clean row */
        }
        if (E > 2) bhost[E / 2] = NAN;
    }
    if (c->moe_wide) {
        static const float wide[] = {1e4f, -1e4f, 100.0f, -100.0f, 30.0f, -30.0f, 20.5f, -20.5f,
                                     19.5f, -19.5f, 20.0f, -20.0f, -180.0f, -300.0f, 88.0f, 60.0f};
        for (int64_t t = 0; t < T; t++) {
            void *row = lhost + (size_t)(t * ls) * lsz;
            int n = 1 + (int)(mlaf_rng_u64(rng) % 6);
            for (int i = 0; i < n; i++) {
                uint64_t v = mlaf_rng_u64(rng);
                mlaf_store_f32(row, dt, (int64_t)(v % (uint64_t)E), wide[(v >> 32) % 16]);
            }
        }
    }
}

mlaf_status mlaf_verify_moe_gate(mlaf_context *ctx, const mlaf_verify_case *c,
                                 mlaf_verify_result *res) {
    if (c->moe_hash) return mlaf_verify_moe_gate_hash(ctx, c, res);
    memset(res, 0, sizeof *res);
    mlaf_backend be = mlaf_context_backend(ctx);
    mlaf_moe_gate_params p =
        c->moe_override ? c->moe : mlaf_moe_gate_params_from_config(&c->cfg);
    int32_t E = c->moe_override ? c->experts : c->cfg.n_routed_experts;
    int want_bias = c->moe_bias < 0 ? (c->cfg.has_score_bias != 0) : (c->moe_bias != 0);
    mlaf_dtype dt = c->dtype;
    /* For moe_gate the case's weight_dtype names the weights output: F32 or the logits' dtype. */
    mlaf_dtype wdt = c->weight_dtype == MLAF_F32 ? MLAF_F32 : dt;
    int64_t T = c->T;
    int32_t K = p.top_k + p.n_shared_experts;
    if (E < 1 || E > REF_MAX_E || K < 1) return MLAF_ERR_INVALID_ARGUMENT;

    /* Layout: strided cases pad every row and shift every pointer off its natural alignment
     * by one element. */
    int64_t ls = c->strided ? E + 7 : E, ws = c->strided ? K + 3 : K, is = ws;
    int64_t ss = c->strided ? E + 5 : E;
    size_t mis = c->strided ? 1 : 0;
    size_t lsz = elem_bytes(dt), wsz = elem_bytes(wdt);
    size_t lbytes = (size_t)(T > 0 ? (T - 1) * ls + E : 0) * lsz;
    size_t wbytes = (size_t)(T > 0 ? (T - 1) * ws + K : 0) * wsz;
    size_t ibytes = (size_t)(T > 0 ? (T - 1) * is + K : 0) * 4;
    size_t sbytes = (size_t)(T > 0 ? (T - 1) * ss + E : 0) * 4;

    mlaf_rng rng;
    mlaf_rng_seed(&rng, c->seed);
    unsigned char *lhost = (unsigned char *)malloc(lbytes ? lbytes : 1);
    float *bhost = (float *)malloc(sizeof(float) * (size_t)E);
    double *rw = (double *)malloc(sizeof(double) * (size_t)(T * K + 1));
    int32_t *rid = (int32_t *)malloc(sizeof(int32_t) * (size_t)(T * K + 1));
    if (!lhost || !bhost || !rw || !rid) {
        free(lhost), free(bhost), free(rw), free(rid);
        return MLAF_ERR_OUT_OF_MEMORY;
    }
    memset(lhost, 0xFF, lbytes ? lbytes : 1);
    /* Sigmoid routers see logits of a few units; softmax ones the same. The padding of
     * strided rows is NaN (0xFF bytes) so a kernel that reads past E gets caught. */
    mlaf_ref_moe_fill(c, &rng, lhost, dt, T, E, ls, bhost);

    mlaf_gbuf gl, gb, gw, gi, gs;
    memset(&gb, 0, sizeof gb);
    memset(&gs, 0, sizeof gs);
    mlaf_status st = mlaf_gbuf_alloc(&gl, be, lbytes, lhost, mis * lsz);
    int have_b = 0, have_s = 0;
    int nbuf = 0;
    if (st == MLAF_OK) nbuf = 1, st = mlaf_gbuf_alloc(&gw, be, wbytes, NULL, mis * wsz);
    if (st == MLAF_OK) nbuf = 2, st = mlaf_gbuf_alloc(&gi, be, ibytes, NULL, mis * 4);
    if (st == MLAF_OK) nbuf = 3;
    if (st == MLAF_OK && want_bias) {
        st = mlaf_gbuf_alloc(&gb, be, sizeof(float) * (size_t)E, bhost, mis * 4);
        if (st == MLAF_OK) have_b = 1;
    }
    if (st == MLAF_OK && c->want_scores) {
        st = mlaf_gbuf_alloc(&gs, be, sbytes, NULL, mis * 4);
        if (st == MLAF_OK) have_s = 1;
    }
    if (st != MLAF_OK) goto done;

    {
        mlaf_tensor tl = mlaf_tensor_2d(gl.ptr, dt, T, E, ls);
        mlaf_tensor tb = mlaf_tensor_1d(gb.ptr, MLAF_F32, E);
        mlaf_tensor tw = mlaf_tensor_2d(gw.ptr, wdt, T, K, ws);
        mlaf_tensor ti = mlaf_tensor_2d(gi.ptr, MLAF_I32, T, K, is);
        mlaf_tensor ts = mlaf_tensor_2d(gs.ptr, MLAF_F32, T, E, ss);
        st = mlaf_moe_gate(ctx, &p, &tl, have_b ? &tb : NULL, &tw, &ti, have_s ? &ts : NULL);
        if (st != MLAF_OK) {
            snprintf(res->detail, sizeof res->detail, "moe_gate: %s: %s", mlaf_status_name(st),
                     mlaf_context_last_error(ctx));
            goto done;
        }
        st = mlaf_context_sync(ctx);
        if (st == MLAF_OK) st = mlaf_gbuf_download(&gl);
        if (st == MLAF_OK) st = mlaf_gbuf_download(&gw);
        if (st == MLAF_OK) st = mlaf_gbuf_download(&gi);
        if (st == MLAF_OK && have_b) st = mlaf_gbuf_download(&gb);
        if (st == MLAF_OK && have_s) st = mlaf_gbuf_download(&gs);
        if (st != MLAF_OK) {
            snprintf(res->detail, sizeof res->detail, "device: %s", mlaf_context_last_error(ctx));
            goto done;
        }

        /* the harness's own test (corrupt_from): weights[t][0] raised by 1 */
        for (int64_t t = c->corrupt_from - 1; c->corrupt_from > 0 && t < T; t += 500) {
            unsigned char *wr = (unsigned char *)gw.body + (size_t)(t * ws) * wsz;
            mlaf_store_f32(wr, wdt, 0, (float)(mlaf_load_f32(wr, wdt, 0) + 1.0));
        }
        /* The oracle reads the host copy of the inputs through a host job. */
        mlaf_moe_gate_job job;
        mlaf_tensor hl = mlaf_tensor_2d(lhost, dt, T, E, ls);
        mlaf_tensor hb = mlaf_tensor_1d(bhost, MLAF_F32, E);
        mlaf_tensor hw = mlaf_tensor_2d(rw, MLAF_F32, T, K, K);
        mlaf_tensor hi = mlaf_tensor_2d(rid, MLAF_I32, T, K, K);
        st = mlaf_check_moe_gate(NULL, &p, &hl, want_bias ? &hb : NULL, &hw, &hi, NULL, &job);
        if (st != MLAF_OK) goto done;

        int ok = 1;
        double worst = 0.0;
        char why[512] = "";
        if (!mlaf_gbuf_guards_ok(&gl) || !mlaf_gbuf_guards_ok(&gw) || !mlaf_gbuf_guards_ok(&gi) ||
            (have_b && !mlaf_gbuf_guards_ok(&gb)) || (have_s && !mlaf_gbuf_guards_ok(&gs))) {
            ok = 0;
            snprintf(why, sizeof why, "a guard zone was overwritten");
        }
        if (ok && (!mlaf_gbuf_equals(&gl, lhost) || (have_b && !mlaf_gbuf_equals(&gb, bhost)))) {
            ok = 0;
            snprintf(why, sizeof why, "an input changed");
        }
        /* tokens on all threads; the first failing token (lowest t) is the one reported */
        if (ok) {
            const moe_check mc = {&job, wdt, wsz, K, E, T, ws, is, ss, c->strided, have_s,
                                  (const unsigned char *)gw.body, (const unsigned char *)gi.body,
                                  have_s ? (const unsigned char *)gs.body : NULL};
            mlaf_item_out tot;
            st = mlaf_run_items((T + MOE_ITEM_TOKENS - 1) / MOE_ITEM_TOKENS, sizeof(ref_token),
                                moe_token_item, &mc, &tot);
            if (st != MLAF_OK) goto done;
            worst = tot.worst;
            if (tot.failed) {
                ok = 0;
                snprintf(why, sizeof why, "%s", tot.why);
            }
        }
        res->passed = ok;
        res->worst_units = worst;
        if (ok)
            snprintf(res->detail, sizeof res->detail, "worst %.3f units over %lld tokens", worst,
                     (long long)T);
        else
            snprintf(res->detail, sizeof res->detail, "%s", why);
        st = MLAF_OK;
    }
done:
    if (nbuf >= 1) mlaf_gbuf_free(&gl);
    if (nbuf >= 2) mlaf_gbuf_free(&gw);
    if (nbuf >= 3) mlaf_gbuf_free(&gi);
    if (have_b) mlaf_gbuf_free(&gb);
    if (have_s) mlaf_gbuf_free(&gs);
    free(lhost), free(bhost), free(rw), free(rid);
    return st;
}
