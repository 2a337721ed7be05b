/*
 * ref_moe_hash.c — the float64 oracle of mlaf_moe_gate_hash (docs/moe_gate.md) and its verify case.
 *
 * The oracle, per token, as the header states it:
 *   1. tok = token_ids[t]; the row is bad when tok is outside [0, vocab), or when an entry of
 *      tid2eid[tok] is outside [0, E) or repeats an earlier one;
 *   2. a good row: ids = tid2eid[tok] in table order, w = s[ids] (s from mlaf_ref_moe_scores;
 *      0 for a non-finite logit); a bad row: ids 0 .. k-1, w = 0;
 *   3. renormalize (w / (sum + eps), skipped when that is 0), scale, shared experts as moe_gate.
 * The check: ids identical (docs/conventions.md), weights within 1e-5 relative (or of the row's total),
 * scores as moe_gate's check, error_count = its start value + the bad rows, and every byte
 * not an output value (row padding, inputs, guards) unchanged.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../half.h"
#include "verify.h"

#define HASH_VOCAB 509
#define HASH_EC_START 5

static int64_t load_index(const void *p, mlaf_dtype dt, int64_t i) {
    return dt == MLAF_I32 ? (int64_t)((const int32_t *)p)[i] : ((const int64_t *)p)[i];
}
static void store_index(void *p, mlaf_dtype dt, int64_t i, int64_t v) {
    if (dt == MLAF_I32)
        ((int32_t *)p)[i] = (int32_t)v;
    else
        ((int64_t *)p)[i] = v;
}

/* Token t: expected ids [K] and weights [K]; returns 1 for a bad row. s: E doubles of scratch. */
static int ref_hash_token(const mlaf_moe_gate_job *job, int64_t t, double *s, int32_t *ids,
                          double *w) {
    const int32_t E = job->E, k = job->top_k;
    mlaf_ref_moe_scores(job, t, s);
    const int64_t tok = load_index(job->token_ids, job->token_ids_dt, t);
    int bad = tok < 0 || tok >= job->vocab;
    for (int32_t j = 0; j < k && !bad; j++) {
        const int64_t e = load_index(job->tid2eid, job->tid2eid_dt, tok * job->tid2eid_stride + j);
        if (e < 0 || e >= E) bad = 1;
        for (int32_t i = 0; i < j && !bad; i++)
            if (ids[i] == e) bad = 1;
        if (!bad) {
            ids[j] = (int32_t)e;
            w[j] = isfinite(s[e]) ? s[e] : 0.0;
        }
    }
    if (bad)
        for (int32_t j = 0; j < k; j++) ids[j] = j, w[j] = 0.0;
    double sum = 0.0;
    for (int32_t j = 0; j < k; j++) sum += w[j];
    double routed = sum;
    if (job->renormalize) {
        const double denom = sum + (double)job->eps;
        routed = 0.0;
        for (int32_t j = 0; j < k; j++) {
            if (denom > 0.0) w[j] /= denom;
            routed += w[j];
        }
    }
    if (job->apply_scaling)
        for (int32_t j = 0; j < k; j++) w[j] *= (double)job->scaling;
    for (int32_t j = 0; j < job->n_shared; j++) {
        ids[k + j] = E + j;
        w[k + j] = routed / (double)job->scaling;
    }
    return bad;
}

static int all_poison(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != 0xFFu) return 0;
    return 1;
}

/* A random table [vocab, k] (row stride ts) of distinct experts; with bad = 1, some rows get an
 * entry out of range (below 0, E, or beyond 32 bits for i64) or a repeated entry. */
static void fill_table(mlaf_rng *rng, void *tab, mlaf_dtype dt, int64_t vocab, int64_t ts, int32_t k,
                       int32_t E, int bad) {
    int32_t *perm = (int32_t *)malloc(sizeof(int32_t) * (size_t)E);
    if (!perm) return;
    for (int64_t v = 0; v < vocab; v++) {
        for (int32_t e = 0; e < E; e++) perm[e] = e;
        for (int32_t j = 0; j < k; j++) { /* partial Fisher-Yates: k distinct experts */
            int32_t r = j + (int32_t)(mlaf_rng_u64(rng) % (uint64_t)(E - j));
            int32_t x = perm[j];
            perm[j] = perm[r];
            perm[r] = x;
            store_index(tab, dt, v * ts + j, perm[j]);
        }
        if (!bad || v % 5 != 1) continue;
        const uint64_t u = mlaf_rng_u64(rng);
        const int32_t j = (int32_t)(u % (uint64_t)k);
        switch ((u >> 16) % 4) {
        case 0: store_index(tab, dt, v * ts + j, -1); break;
        case 1: store_index(tab, dt, v * ts + j, E); break;
        case 2: store_index(tab, dt, v * ts + j, dt == MLAF_I64 ? ((int64_t)1 << 33) + 1 : INT32_MIN); break;
        default:
            if (k >= 2) /* a repeat of another entry of the row */
                store_index(tab, dt, v * ts + j, perm[(j + 1 + (int32_t)((u >> 24) % (uint64_t)(k - 1))) % k]);
            else
                store_index(tab, dt, v * ts + j, E + 7);
        }
    }
    free(perm);
}

mlaf_status mlaf_verify_moe_gate_hash(mlaf_context *ctx, const mlaf_verify_case *c,
                                      mlaf_verify_result *res) {
    memset(res, 0, sizeof *res);
    const mlaf_backend be = mlaf_context_backend(ctx);
    mlaf_moe_gate_params p = c->moe_override ? c->moe : mlaf_moe_gate_params_from_config(&c->cfg);
    p.n_group = p.topk_group = 1; /* hash routing has no group limit */
    const int32_t E = c->moe_override ? c->experts : c->cfg.n_routed_experts;
    const mlaf_dtype dt = c->dtype, wdt = c->weight_dtype == MLAF_F32 ? MLAF_F32 : dt;
    const mlaf_dtype tab_dt = c->index_dtype == MLAF_I32 ? MLAF_I32 : MLAF_I64;
    const mlaf_dtype tok_dt = c->strided ? (tab_dt == MLAF_I32 ? MLAF_I64 : MLAF_I32) : tab_dt;
    const int64_t T = c->T, vocab = HASH_VOCAB;
    const int32_t k = p.top_k, K = k + p.n_shared_experts;
    if (E < 1 || E > 2048 || k < 1 || k > E || K > 128) return MLAF_ERR_INVALID_ARGUMENT;

    const int64_t ls = c->strided ? E + 7 : E, ws = c->strided ? K + 3 : K, is = ws;
    const int64_t ss = c->strided ? E + 5 : E, ts = c->strided ? k + 2 : k;
    const size_t mis = c->strided ? 1 : 0;
    const size_t lsz = mlaf_dtype_size(dt), wsz = mlaf_dtype_size(wdt);
    const size_t tsz = mlaf_dtype_size(tab_dt), ksz = mlaf_dtype_size(tok_dt);
    const size_t lbytes = (size_t)(T > 0 ? (T - 1) * ls + E : 0) * lsz;
    const size_t wbytes = (size_t)(T > 0 ? (T - 1) * ws + K : 0) * wsz;
    const size_t ibytes = (size_t)(T > 0 ? (T - 1) * is + K : 0) * 4;
    const size_t sbytes = (size_t)(T > 0 ? (T - 1) * ss + E : 0) * 4;
    const size_t tbytes = (size_t)((vocab - 1) * ts + k) * tsz, kbytes = (size_t)T * ksz;

    mlaf_rng rng;
    mlaf_rng_seed(&rng, c->seed);
    unsigned char *lhost = (unsigned char *)malloc(lbytes ? lbytes : 1);
    unsigned char *thost = (unsigned char *)malloc(tbytes);
    unsigned char *khost = (unsigned char *)malloc(kbytes ? kbytes : 1);
    float *bhost = (float *)malloc(sizeof(float) * (size_t)E);
    double *s = (double *)malloc(sizeof(double) * (size_t)E);
    if (!lhost || !thost || !khost || !bhost || !s) {
        free(lhost), free(thost), free(khost), free(bhost), free(s);
        return MLAF_ERR_OUT_OF_MEMORY;
    }
    memset(lhost, 0xFF, lbytes ? lbytes : 1);
    memset(thost, 0xFF, tbytes); /* padding of strided table rows: -1, never read */
    mlaf_ref_moe_fill(c, &rng, lhost, dt, T, E, ls, bhost);
    fill_table(&rng, thost, tab_dt, vocab, ts, k, E, c->moe_hash >= 2);
    for (int64_t t = 0; t < T; t++) {
        const uint64_t u = mlaf_rng_u64(&rng);
        int64_t tok = (int64_t)(u % (uint64_t)vocab);
        if (c->moe_hash >= 2 && t % 11 == 3) { /* token ids outside [0, vocab) */
            static const int64_t far[4] = {-1, HASH_VOCAB, HASH_VOCAB + 1000, INT32_MIN};
            tok = far[(u >> 32) % 4];
            if (tok_dt == MLAF_I64 && (u >> 40) % 2) tok = ((int64_t)1 << 40) + 3;
        }
        store_index(khost, tok_dt, t, tok);
    }
    const int32_t ec0 = HASH_EC_START;

    mlaf_gbuf gl, gt, gk, gw, gi, gs, ge;
    memset(&gs, 0, sizeof gs);
    int nbuf = 0, have_s = 0;
    mlaf_status st = mlaf_gbuf_alloc(&gl, be, lbytes, lhost, mis * lsz);
    if (st == MLAF_OK) nbuf = 1, st = mlaf_gbuf_alloc(&gt, be, tbytes, thost, mis * tsz);
    if (st == MLAF_OK) nbuf = 2, st = mlaf_gbuf_alloc(&gk, be, kbytes, khost, mis * ksz);
    if (st == MLAF_OK) nbuf = 3, st = mlaf_gbuf_alloc(&gw, be, wbytes, NULL, mis * wsz);
    if (st == MLAF_OK) nbuf = 4, st = mlaf_gbuf_alloc(&gi, be, ibytes, NULL, mis * 4);
    if (st == MLAF_OK) nbuf = 5, st = mlaf_gbuf_alloc(&ge, be, 4, &ec0, 0);
    if (st == MLAF_OK) nbuf = 6;
    if (st == MLAF_OK && c->want_scores) {
        st = mlaf_gbuf_alloc(&gs, be, sbytes, NULL, mis * 4);
        if (st == MLAF_OK) have_s = 1;
    }
    if (st != MLAF_OK) goto done;

    {
        mlaf_tensor tl = mlaf_tensor_2d(gl.ptr, dt, T, E, ls);
        mlaf_tensor tt = mlaf_tensor_2d(gt.ptr, tab_dt, vocab, k, ts);
        mlaf_tensor tk = mlaf_tensor_1d(gk.ptr, tok_dt, T);
        mlaf_tensor tw = mlaf_tensor_2d(gw.ptr, wdt, T, K, ws);
        mlaf_tensor ti = mlaf_tensor_2d(gi.ptr, MLAF_I32, T, K, is);
        mlaf_tensor tsc = mlaf_tensor_2d(gs.ptr, MLAF_F32, T, E, ss);
        mlaf_tensor te = mlaf_tensor_1d(ge.ptr, MLAF_I32, 1);
        st = mlaf_moe_gate_hash(ctx, &p, &tl, &tt, &tk, &tw, &ti, have_s ? &tsc : NULL, &te);
        if (st != MLAF_OK) {
            snprintf(res->detail, sizeof res->detail, "moe_gate_hash: %s: %s", mlaf_status_name(st),
                     mlaf_context_last_error(ctx));
            goto done;
        }
        st = mlaf_context_sync(ctx);
        mlaf_gbuf *all[7] = {&gl, &gt, &gk, &gw, &gi, &ge, &gs};
        for (int b = 0; b < 6 + have_s && st == MLAF_OK; b++) st = mlaf_gbuf_download(all[b]);
        if (st != MLAF_OK) {
            snprintf(res->detail, sizeof res->detail, "device: %s", mlaf_context_last_error(ctx));
            goto done;
        }
        for (int64_t t = c->corrupt_from - 1; c->corrupt_from > 0 && t < T; t += 500) {
            unsigned char *wr = (unsigned char *)gw.body + (size_t)(t * ws) * wsz;
            mlaf_store_f32(wr, wdt, 0, (float)(mlaf_load_f32(wr, wdt, 0) + 1.0));
        }

        /* The oracle's job over the host copies. */
        mlaf_moe_gate_job job;
        memset(&job, 0, sizeof job);
        job.T = T, job.E = E, job.top_k = k, job.n_group = 1, job.topk_group = 1;
        job.n_shared = p.n_shared_experts, job.K = K, job.score_func = p.score_func;
        job.renormalize = p.renormalize != 0, job.apply_scaling = p.apply_routed_scaling != 0;
        job.scaling = p.routed_scaling_factor, job.eps = p.eps;
        job.logits = lhost, job.logits_dt = dt, job.logits_stride = ls;
        job.tid2eid = thost, job.tid2eid_dt = tab_dt, job.tid2eid_stride = ts, job.vocab = vocab;
        job.token_ids = khost, job.token_ids_dt = tok_dt;

        int ok = 1;
        double worst = 0.0;
        int64_t nbad = 0;
        char why[512] = "";
        for (int b = 0; b < 6 + have_s && ok; b++)
            if (!mlaf_gbuf_guards_ok(all[b])) ok = 0, snprintf(why, sizeof why, "a guard zone was overwritten");
        if (ok && (!mlaf_gbuf_equals(&gl, lhost) || !mlaf_gbuf_equals(&gt, thost) || !mlaf_gbuf_equals(&gk, khost)))
            ok = 0, snprintf(why, sizeof why, "an input changed");
        for (int64_t t = 0; t < T && ok; t++) {
            int32_t eid[128];
            double ew[128], rowmag = 0.0;
            nbad += ref_hash_token(&job, t, s, eid, ew);
            const unsigned char *wrow = (const unsigned char *)gw.body + (size_t)(t * ws) * wsz;
            const int32_t *irow = (const int32_t *)((const unsigned char *)gi.body + (size_t)(t * is) * 4);
            for (int32_t j = 0; j < K; j++) rowmag += fabs(ew[j]);
            for (int32_t j = 0; j < K && ok; j++) {
                if (irow[j] != eid[j]) {
                    ok = 0;
                    snprintf(why, sizeof why, "token %lld: ids[%d] = %d, expected %d", (long long)t, j, irow[j],
                             eid[j]);
                    break;
                }
                const double g = mlaf_load_f32(wrow, wdt, j);
                double u = mlaf_err_units(g, ew[j], wdt, ew[j]);
                const double ua = fabs(g - ew[j]) / (1e-5 * fmax(rowmag, 1e-30));
                if (ua < u) u = ua;
                if (isnan(g)) u = INFINITY;
                if (u > worst) worst = u;
                if (u > 1.0) {
                    ok = 0;
                    snprintf(why, sizeof why, "token %lld: weights[%d] = %.9g, expected %.9g (id %d)", (long long)t,
                             j, g, ew[j], eid[j]);
                }
            }
            if (ok && have_s) {
                const float *srow = (const float *)((const unsigned char *)gs.body + (size_t)(t * ss) * 4);
                for (int32_t e = 0; e < E && ok; e++) {
                    double u = mlaf_err_units(srow[e], s[e], MLAF_F32, s[e]);
                    const double ua = fabs(srow[e] - s[e]) / 1e-5;
                    if (!isnan(ua) && ua < u) u = ua;
                    if (u > worst && isfinite(u)) worst = u;
                    if (u > 1.0) {
                        ok = 0;
                        snprintf(why, sizeof why, "token %lld: scores[%d] = %.9g, expected %.9g", (long long)t, e,
                                 srow[e], s[e]);
                    }
                }
            }
            if (ok && c->strided && t + 1 < T &&
                (!all_poison(wrow + (size_t)K * wsz, (size_t)(ws - K) * wsz) ||
                 !all_poison((const unsigned char *)(irow + K), (size_t)(is - K) * 4) ||
                 (have_s && !all_poison((const unsigned char *)gs.body + (size_t)(t * ss + E) * 4,
                                        (size_t)(ss - E) * 4)))) {
                ok = 0;
                snprintf(why, sizeof why, "token %lld: the padding after an output row was written", (long long)t);
            }
        }
        int32_t ec;
        memcpy(&ec, ge.body, 4);
        if (ok && ec != ec0 + nbad) {
            ok = 0;
            snprintf(why, sizeof why, "error_count = %d, expected %d + %lld bad rows", ec, ec0, (long long)nbad);
        }
        if (ok && c->moe_hash >= 2 && T >= 16 && nbad == 0) {
            ok = 0;
            snprintf(why, sizeof why, "the case drew no bad row (the harness is broken)");
        }
        res->passed = ok;
        res->worst_units = worst;
        if (ok)
            snprintf(res->detail, sizeof res->detail, "worst %.3f units over %lld tokens, %lld bad rows", worst,
                     (long long)T, (long long)nbad);
        else
            snprintf(res->detail, sizeof res->detail, "%s", why);
        st = MLAF_OK;
    }
done:
    if (nbuf >= 1) mlaf_gbuf_free(&gl);
    if (nbuf >= 2) mlaf_gbuf_free(&gt);
    if (nbuf >= 3) mlaf_gbuf_free(&gk);
    if (nbuf >= 4) mlaf_gbuf_free(&gw);
    if (nbuf >= 5) mlaf_gbuf_free(&gi);
    if (nbuf >= 6) mlaf_gbuf_free(&ge);
    if (have_s) mlaf_gbuf_free(&gs);
    free(lhost), free(thost), free(khost), free(bhost), free(s);
    return st;
}
