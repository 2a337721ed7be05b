/*
 * test_fuzz_moe_gate.c — random calls of mlaf_moe_gate (hash routing: test_fuzz_moe_gate_hash).
 * The driver, the harness and what every call must satisfy: fuzz_common.h.
 */
#include "fuzz_common.h"

/* ---- moe_gate ------------------------------------------------------------------------------ */
static int fuzz_gate(fz *f) {
    mlaf_rng *r = &f->r;
    set_state(f);
    static const int32_t bigE[6] = {64, 128, 160, 256, 384, 2048};
    const int32_t E = CHANCE(r, 0.7) ? (int32_t)RANGE(r, 1, 72) : bigE[U(r, 6)];
    const int64_t T = E >= 1024 ? RANGE(r, 0, 6) : draw_T(r);
    mlaf_moe_gate_params p;
    memset(&p, 0, sizeof p);
    int32_t div[64], nd = 0;
    for (int32_t g = 1; g <= 64 && g <= E; g++)
        if (E % g == 0) div[nd++] = g;
    p.n_group = CHANCE(r, 0.35) ? 1 : div[U(r, (uint64_t)nd)];
    const int32_t per = E / p.n_group;
    p.group_score = (p.n_group > 1 && per < 2) || CHANCE(r, 0.4) ? MLAF_GROUP_MAX : MLAF_GROUP_TOP2_SUM;
    p.topk_group = (int32_t)RANGE(r, 1, p.n_group);
    int32_t kmax = E < 64 ? E : 64;
    if (kmax > p.topk_group * per) kmax = p.topk_group * per;
    p.top_k = (int32_t)RANGE(r, 1, kmax);
    p.score_func = (mlaf_score_func)U(r, 3); /* sigmoid, softmax, sqrt_softplus */
    p.renormalize = CHANCE(r, 0.6);
    p.apply_routed_scaling = CHANCE(r, 0.5);
    p.routed_scaling_factor = (float)(0.5 + 2.5 * mlaf_rng_uniform(r));
    p.eps = CHANCE(r, 0.6) ? 1e-20f : (CHANCE(r, 0.5) ? 0.0f : 1e-6f);
    p.n_shared_experts = CHANCE(r, 0.6) ? 0 : (int32_t)RANGE(r, 1, 4);
    const int32_t K = p.top_k + p.n_shared_experts;
    const mlaf_dtype dt = FLOAT_DT(r);
    fz_t lg, bias, w, ids, sc;
    memset(&bias, 0, sizeof bias), memset(&sc, 0, sizeof sc);
    fz_2d(f, &lg, "logits", dt, T, E, CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 9), 1, 2.0, DT_FLOATS, 1u, 1, 0);
    if (CHANCE(r, 0.5)) fz_1d(f, &bias, "bias", MLAF_F32, E, 1, 0.5, DTM(MLAF_F32), 1u, 0, 0);
    fz_2d(f, &w, "weights", CHANCE(r, 0.5) ? MLAF_F32 : dt, T, K, RANGE(r, 0, 3), 0, 1, DTM(MLAF_F32) | DTM(dt), 3u, 1, 1);
    fz_2d(f, &ids, "ids", MLAF_I32, T, K, RANGE(r, 0, 3), 0, 1, DTM(MLAF_I32), 3u, 1, 1);
    if (CHANCE(r, 0.4)) fz_2d(f, &sc, "scores", MLAF_F32, T, E, RANGE(r, 0, 3), 0, 1, DTM(MLAF_F32), 3u, 0, 1);
    if (bias.present || sc.present) lg.fixed |= 2u; /* E is then fixed by them */
    /* non-finite logits and bias entries in some rows */
    static const float nf[3] = {NAN, INFINITY, -INFINITY};
    for (int64_t t = 0; t < T; t++)
        if (CHANCE(r, 0.08))
            for (int32_t k = (int32_t)RANGE(r, 1, E < 4 ? E : 4); k > 0; k--) {
                int64_t e = (int64_t)U(r, (uint64_t)E);
                mlaf_store_f32(f->b[lg.buf].init + lg.boff, dt, t * lg.t.stride[0] + e, nf[U(r, 3)]);
            }
    if (bias.present && CHANCE(r, 0.1)) ((float *)(f->b[bias.buf].init + bias.boff))[U(r, (uint64_t)E)] = nf[U(r, 3)];
    mutate(f, gate_params_mutate, &p, NULL, 0, 0);
    if (!fz_commit(f)) return -1;
    mlaf_status st = mlaf_moe_gate(f->ctx, &p, DEV(f, &lg), DEV(f, &bias), DEV(f, &w), DEV(f, &ids), DEV(f, &sc));
    if (!judge_status(f, st)) return st == MLAF_OK;
    mlaf_moe_gate_job j;
    mlaf_status hs = mlaf_check_moe_gate(f->host, &p, HOST(f, &lg), HOST(f, &bias), HOST(f, &w), HOST(f, &ids), HOST(f, &sc), &j);
    if (hs != MLAF_OK) {
        fail(f, "the device call passed but the same views over host memory gave %s: %s", mlaf_status_name(hs),
             mlaf_context_last_error(f->host));
        return 1;
    }
    const int64_t TT = j.T;
    double *rw = (double *)malloc(sizeof(double) * (size_t)(TT * j.K + 1));
    int32_t *rid = (int32_t *)malloc(sizeof(int32_t) * (size_t)(TT * j.K + 1));
    double *sel = (double *)malloc(sizeof(double) * (size_t)(TT * (j.top_k + 1) + 1));
    double *rs = (double *)malloc(sizeof(double) * (size_t)(TT * j.E + 1));
    mlaf_ref_moe_gate(&j, rw, rid, sel, rs);
    char why[300];
    for (int64_t t = 0; t < TT && !f->failed; t++) {
        int32_t got[128];
        const unsigned char *irow = body(f, ids.buf) + at_byte(&ids, t * ids.t.stride[0]);
        memcpy(got, irow, sizeof(int32_t) * (size_t)j.K);
        claim(f, ids.buf, at_byte(&ids, t * ids.t.stride[0]), 4 * (size_t)j.K);
        const char *bad = mlaf_ref_moe_gate_check_token(&j, t, got, why, sizeof why);
        if (bad) {
            fail(f, "token %lld: %s", (long long)t, bad);
            break;
        }
        for (int32_t s = 0; s < j.n_shared; s++)
            if (got[j.top_k + s] != j.E + s) fail(f, "token %lld: ids[%d] = %d, expected shared expert %d", (long long)t, j.top_k + s, got[j.top_k + s], j.E + s);
        /* Weights against the oracle's where the ids are the oracle's (near-ties may swap ids;
         * then only their range is checked). */
        int same = !memcmp(got, rid + t * j.K, sizeof(int32_t) * (size_t)j.K);
        double rowmag = 0;
        for (int32_t k = 0; k < j.K; k++) rowmag += fabs(rw[t * j.K + k]);
        for (int32_t k = 0; k < j.K; k++) {
            const int64_t b = at_byte(&w, t * w.t.stride[0] + k);
            claim(f, w.buf, b, mlaf_dtype_size(w.t.dtype));
            double g = mlaf_load_f32(body(f, w.buf) + b, w.t.dtype, 0), e = rw[t * j.K + k];
            if (!same) {
                if (!(g >= 0 && isfinite(g))) fail(f, "token %lld: weights[%d] = %g (ids differ from the oracle's by a near-tie)", (long long)t, k, g);
                continue;
            }
            double u = mlaf_err_units(g, e, w.t.dtype, e), ua = fabs(g - e) / (1e-5 * fmax(rowmag, 1e-30));
            if (ua < u) u = ua;
            if (!(u <= 1.0)) fail(f, "token %lld: weights[%d] = %.9g, expected %.9g (id %d)", (long long)t, k, g, e, got[k]);
        }
        if (sc.present)
            for (int32_t e = 0; e < j.E; e++) {
                const int64_t b = at_byte(&sc, t * sc.t.stride[0] + e);
                claim(f, sc.buf, b, 4);
                double g = mlaf_load_f32(body(f, sc.buf) + b, MLAF_F32, 0), ref = rs[t * j.E + e];
                double u = mlaf_err_units(g, ref, MLAF_F32, ref), ua = fabs(g - ref) / 1e-5;
                if (!isnan(ua) && ua < u) u = ua;
                if (!(u <= 1.0)) fail(f, "token %lld: scores[%d] = %.9g, expected %.9g", (long long)t, e, g, ref);
            }
    }
    check_untouched(f);
    free(rw), free(rid), free(sel), free(rs);
    return 1;
}

int main(void) {
    static const fuzz_entry ops[] = {{3, fuzz_gate}};
    return fuzz_main(ops, (int)(sizeof ops / sizeof ops[0]));
}
