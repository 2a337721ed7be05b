/*
 * test_fuzz_moe_gate_hash.c — random calls of mlaf_moe_gate_hash, judged as the newer entry points are
 * (fuzz_common.c).
 * The driver, the harness and what every call must satisfy: fuzz_common.h.
 */
#include "fuzz_common.h"


/* -- moe_gate_hash -- */
static int hash_params_mutate(fz *f, void *vp) {
    mlaf_moe_gate_params *p = (mlaf_moe_gate_params *)vp;
    switch (U(&f->r, 4)) {
    case 0: p->n_group = CHANCE(&f->r, 0.5) ? 0 : (int32_t)RANGE(&f->r, 2, 8); note(f, " n_group=%d", p->n_group); return 1;
    case 1: p->topk_group = CHANCE(&f->r, 0.5) ? 0 : (int32_t)RANGE(&f->r, 2, 8); note(f, " topk_group=%d", p->topk_group); return 1;
    default: return gate_params_mutate(f, vp);
    }
}

static int fuzz_hash(fz *f) {
    mlaf_rng *r = &f->r;
    set_state(f);
    const mlaf_dtype dt = FLOAT_DT(r);
    const int64_t T = draw_T(r), E = RANGE(r, 1, 40), V = RANGE(r, 1, 12);
    const int32_t K = (int32_t)RANGE(r, 1, E < 8 ? E : 8), S = CHANCE(r, 0.7) ? 0 : (int32_t)RANGE(r, 1, 2);
    static const mlaf_score_func sf[3] = {MLAF_SCORE_SIGMOID, MLAF_SCORE_SOFTMAX, MLAF_SCORE_SQRT_SOFTPLUS};
    mlaf_moe_gate_params p = {K, 1, 1, sf[U(r, 3)], MLAF_GROUP_TOP2_SUM, (int32_t)U(r, 2), CHANCE(r, 0.5) ? 1.0f : 2.5f,
                              S ? 0 : (int32_t)U(r, 2), 1e-20f, S};
    fz_t lg, tab, tok, wt, ids, sc, ec;
    memset(&sc, 0, sizeof sc), memset(&ec, 0, sizeof ec);
    fz_2d(f, &lg, "logits", dt, T, E, RANGE(r, 0, 5), 1, CHANCE(r, 0.2) ? 30.0 : 2.0, DT_FLOATS, 0u, 1, 0);
    fz_2d(f, &tab, "tid2eid", INDEX_DT(r), V, K, RANGE(r, 0, 3), 0, 0, DT_INDEX, 2u, 1, 0);
    fz_1d(f, &tok, "token_ids", INDEX_DT(r), T, 0, 0, DT_INDEX, 1u, 1, 0);
    fz_2d(f, &wt, "weights", CHANCE(r, 0.5) ? dt : MLAF_F32, T, K + S, RANGE(r, 0, 3), 0, 0, DTM(dt) | DTM(MLAF_F32), 3u, 1, 1);
    fz_2d(f, &ids, "ids", MLAF_I32, T, K + S, RANGE(r, 0, 3), 0, 0, DTM(MLAF_I32), 3u, 1, 1);
    if (CHANCE(r, 0.5)) fz_2d(f, &sc, "scores", MLAF_F32, T, E, RANGE(r, 0, 3), 0, 0, DTM(MLAF_F32), 3u, 0, 1);
    if (CHANCE(r, 0.7)) add_error_count(f, &ec);
    /* the table: distinct experts per row, some rows with an entry out of range or repeated */
    for (int64_t v = 0; v < V; v++) {
        int64_t perm[64];
        for (int64_t e = 0; e < E; e++) perm[e] = e;
        for (int32_t k = 0; k < K; k++) {
            int64_t j = k + (int64_t)U(r, (uint64_t)(E - k)), tmp = perm[k];
            perm[k] = perm[j], perm[j] = tmp;
        }
        if (CHANCE(r, 0.08)) perm[U(r, (uint64_t)K)] = CHANCE(r, 0.5) ? -1 : E + (int64_t)U(r, 3);
        else if (K > 1 && CHANCE(r, 0.05)) perm[K - 1] = perm[0];
        for (int32_t k = 0; k < K; k++) {
            unsigned char *q = f->b[tab.buf].init + tab.boff + (v * tab.t.stride[0] + k) * (int64_t)mlaf_dtype_size(tab.t.dtype);
            if (tab.t.dtype == MLAF_I32) { int32_t w = (int32_t)perm[k]; memcpy(q, &w, 4); }
            else memcpy(q, &perm[k], 8);
        }
    }
    for (int64_t t = 0; t < T; t++) set_idx(f, &tok, t, CHANCE(r, 0.08) ? (CHANCE(r, 0.5) ? -1 : V + (int64_t)U(r, 2)) : (int64_t)U(r, (uint64_t)V));
    mutate(f, hash_params_mutate, &p, NULL, 0, 0);
    if (!fz_commit(f)) return -1;
    mlaf_status s = mlaf_moe_gate_hash(f->ctx, &p, DEV(f, &lg), DEV(f, &tab), DEV(f, &tok), DEV(f, &wt), DEV(f, &ids), DEV(f, &sc), DEV(f, &ec));
    if (!judge_new(f, s)) return s == MLAF_OK;
    int64_t bad = 0;
    claim_all(f, &wt), claim_all(f, &sc);
    for (int64_t t = 0; t < T && !f->failed; t++) {
        const int64_t id = get_idx(f->b[tok.buf].init + tok.boff, tok.t.dtype, t);
        int64_t want[72];
        int isbad = id < 0 || id >= V;
        for (int32_t k = 0; k < K && !isbad; k++) {
            want[k] = get_idx(f->b[tab.buf].init + tab.boff, tab.t.dtype, id * tab.t.stride[0] + k);
            if (want[k] < 0 || want[k] >= E) isbad = 1;
            for (int32_t m = 0; m < k && !isbad; m++)
                if (want[m] == want[k]) isbad = 1;
        }
        bad += isbad;
        for (int32_t k = 0; k < K + S; k++) {
            const int64_t b = at_byte(&ids, t * ids.t.stride[0] + k);
            int32_t got;
            memcpy(&got, body(f, ids.buf) + b, 4);
            claim(f, ids.buf, b, 4);
            const int64_t w = k >= K ? E + (k - K) : isbad ? k : want[k];
            if (got != w) fail(f, "token %lld: ids[%d] = %d, expected %lld%s", (long long)t, k, got, (long long)w, isbad ? " (a bad row)" : "");
            float wv = mlaf_load_f32(body(f, wt.buf) + at_byte(&wt, t * wt.t.stride[0] + k), wt.t.dtype, 0);
            if (!isfinite(wv) || (isbad && wv != 0.0f)) fail(f, "token %lld: weights[%d] = %g", (long long)t, k, (double)wv);
        }
    }
    check_count(f, &ec, bad);
    check_untouched(f);
    return 1;
}

int main(void) {
    static const fuzz_entry ops[] = {{7, fuzz_hash}};
    return fuzz_main(ops, (int)(sizeof ops / sizeof ops[0]));
}
