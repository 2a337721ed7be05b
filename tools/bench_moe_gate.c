/*
 * bench_moe_gate.c — `mlafuse bench --op moe_gate` (and --hash: moe_gate_hash rows): its buffers (the
 * tid2eid table under --hash), the fused call, the unfused chain and the check of ids and weights,
 * near-ties of the selection values accepted.
 */
#include "bench_op.h"

static int setup_moe_gate(bench_op *o, size_t llc, mlaf_rng *rng, char *err, size_t cap) {
    const mlaf_dtype dt = o->dt;
    const size_t es = mlaf_dtype_size(dt);
    const int64_t T = o->T;
    /* Bytes of one input/output set, for the rotation count. */
    bench_rotation(o, llc, (double)T * o->E * es + T * o->K * 8.0);
    void *lg = host_random(rng, dt, (size_t)(T * o->E), -4.0, 4.0);
    NEED(lg);
    if (buf_alloc(o, B_LOGITS, (size_t)(T * o->E) * es, 1, lg, err, cap)) return -1;
    if (o->has_bias) {
        void *bias = host_random(rng, MLAF_F32, (size_t)o->E, -0.05, 0.05);
        NEED(bias);
        if (buf_alloc(o, B_BIAS, sizeof(float) * (size_t)o->E, 0, bias, err, cap)) return -1;
    }
    if (buf_alloc(o, B_WEIGHTS, sizeof(float) * (size_t)(T * o->K), 1, NULL, err, cap)) return -1;
    if (buf_alloc(o, B_IDS, sizeof(int32_t) * (size_t)(T * o->K), 1, NULL, err, cap)) return -1;
    size_t te = sizeof(float) * (size_t)(T * o->E);
    if (buf_alloc(o, S_S, te, 0, NULL, err, cap) || buf_alloc(o, S_C, te, 0, NULL, err, cap) ||
        buf_alloc(o, S_M, te, 0, NULL, err, cap) ||
        buf_alloc(o, S_G, sizeof(float) * (size_t)(T * o->G), 0, NULL, err, cap) ||
        buf_alloc(o, S_W, sizeof(float) * (size_t)(T * o->moe.top_k), 0, NULL, err, cap))
        return -1;
    o->bytes = (double)T * o->E * es + (o->has_bias ? o->E * 4.0 : 0.0) + (double)T * o->K * 8.0;
    if (o->hash) {
        const int64_t k = o->moe.top_k;
        int32_t *tab = (int32_t *)malloc(sizeof(int32_t) * (size_t)(HASH_VOCAB * k));
        int64_t *tok = (int64_t *)malloc(sizeof(int64_t) * (size_t)(T > 0 ? T : 1));
        int32_t *perm = (int32_t *)malloc(sizeof(int32_t) * (size_t)o->E);
        if (!tab || !tok || !perm) {
            free(tab), free(tok), free(perm);
            snprintf(err, cap, "out of host memory");
            return -1;
        }
        for (int64_t e = 0; e < o->E; e++) perm[e] = (int32_t)e;
        for (int64_t v = 0; v < HASH_VOCAB; v++) /* k distinct experts per token id */
            for (int64_t j = 0; j < k; j++) {
                const int64_t r = j + (int64_t)(mlaf_rng_u64(rng) % (uint64_t)(o->E - j));
                const int32_t x = perm[j];
                perm[j] = perm[r], perm[r] = x;
                tab[v * k + j] = perm[j];
            }
        for (int64_t t = 0; t < T; t++) tok[t] = (int64_t)(mlaf_rng_u64(rng) % HASH_VOCAB);
        free(perm);
        /* buf_alloc keeps init (freed with the op) */
        if (buf_alloc(o, B_TID2EID, sizeof(int32_t) * (size_t)(HASH_VOCAB * k), 0, tab, err, cap) ||
            buf_alloc(o, B_TOKIDS, sizeof(int64_t) * (size_t)T, 1, tok, err, cap))
            return -1;
        o->bytes = (double)T * (8.0 + 4.0 * k + (o->moe.score_func == MLAF_SCORE_SOFTMAX ? o->E : k) * es) +
                   (double)T * o->K * 8.0;
    }
    return 0;
}

static int fused_moe_gate(void *arg, int set, char *err, size_t cap) {
    bench_op *o = (bench_op *)arg;
    views v;
    make_views(o, set, &v);
    mlaf_status st = MLAF_OK;
    if (o->hash)
        st = mlaf_moe_gate_hash(o->ctx, &o->moe, &v.logits, &v.tid2eid, &v.tok, &v.weights, &v.ids, NULL,
                                NULL);
    else
        st = mlaf_moe_gate(o->ctx, &o->moe, &v.logits, o->has_bias ? &v.bias : NULL, &v.weights,
                           &v.ids, NULL);
    return api_err(o, st, mlaf_op_name(o->op), err, cap);
}

static int unfused_moe_gate(void *arg, int set, char *err, size_t cap) {
    bench_op *o = (bench_op *)arg;
    views v;
    make_views(o, set, &v);
    const int cpu = o->be == MLAF_BACKEND_CPU;
    void *stream = bench_stream(o);
    (void)stream;
    int r = 0;
    mlaf_moe_gate_job j;
    if (o->hash) {
        if (api_err(o, mlaf_check_moe_gate_hash(o->ctx, &o->moe, &v.logits, &v.tid2eid, &v.tok, &v.weights,
                                                &v.ids, NULL, NULL, &j),
                    "unfused moe_gate_hash", err, cap))
            return -1;
    } else if (api_err(o, mlaf_check_moe_gate(o->ctx, &o->moe, &v.logits, o->has_bias ? &v.bias : NULL,
                                              &v.weights, &v.ids, NULL, &j),
                       "unfused moe_gate", err, cap)) {
        return -1;
    }
    if (j.T == 0) return 0;
    bench_moe_scratch s = {(float *)P(o, S_S, set), (float *)P(o, S_C, set),
                           (float *)P(o, S_G, set), (float *)P(o, S_M, set),
                           (float *)P(o, S_W, set)};
    if (cpu)
        r = o->hash ? blc_moe_gate_hash(&j, &s, o->threads) : blc_moe_gate(&j, &s, o->threads);
#ifdef MLAF_WITH_CUDA
    else
        r = o->hash ? blg_moe_gate_hash(&j, &s, stream) : blg_moe_gate(&j, &s, stream);
#endif
    return baseline_err(r, "moe_gate", err, cap);
}

static int outputs_moe_gate(const bench_op *o, int *ids) {
    int n = 0;
    (void)o;
    ids[n++] = B_IDS;
    ids[n++] = B_WEIGHTS;
    return n;
}

/* Selection value c of expert e for token t, from the logits (host, double). */
static double host_sel(const bench_op *o, const void *logits, const float *bias, int64_t t, int e) {
    const void *row = (const char *)logits + (size_t)(t * o->E) * mlaf_dtype_size(o->dt);
    double s;
    if (o->moe.score_func == MLAF_SCORE_SIGMOID) {
        s = 1.0 / (1.0 + exp(-(double)mlaf_load_f32(row, o->dt, e)));
    } else if (o->moe.score_func == MLAF_SCORE_SQRT_SOFTPLUS) {
        const double x = mlaf_load_f32(row, o->dt, e);
        s = sqrt(fmax(x, 0.0) + log1p(exp(-fabs(x))));
    } else {
        double mx = -INFINITY, sum = 0.0;
        for (int64_t i = 0; i < o->E; i++) mx = fmax(mx, mlaf_load_f32(row, o->dt, i));
        for (int64_t i = 0; i < o->E; i++) sum += exp(mlaf_load_f32(row, o->dt, i) - mx);
        s = exp(mlaf_load_f32(row, o->dt, e) - mx) / sum;
    }
    return s + (bias ? bias[e] : 0.0);
}

/* The check's comparison: ids equal (or a near-tie, or a group near-tie the oracle accepts), then
 * the weights of rows whose ids agree; writes "ok" or what differs into check. */
static void compare_moe_gate(bench_op *o, void *const *a, void *const *b, char *check, size_t ccap) {
    const int32_t *ia = (const int32_t *)a[0], *ib = (const int32_t *)b[0];
    const float *wa = (const float *)a[1], *wb = (const float *)b[1];
    /* the oracle's view of the same rows (host copies of the inputs), for rows whose
     * ids differ beyond a near-tie of c: a near-tie of two groups' scores lets either side
     * keep either group (docs/conventions.md), and then whole runs of ids differ */
    mlaf_moe_gate_job hj;
    memset(&hj, 0, sizeof hj);
    hj.T = o->T;
    hj.E = (int32_t)o->E;
    hj.top_k = o->moe.top_k;
    hj.n_group = o->moe.n_group;
    hj.topk_group = o->moe.topk_group;
    hj.n_shared = o->moe.n_shared_experts;
    hj.K = (int32_t)o->K;
    hj.score_func = o->moe.score_func;
    hj.group_score = o->moe.group_score;
    hj.logits = o->b[B_LOGITS].init;
    hj.logits_dt = o->dt;
    hj.logits_stride = o->E;
    hj.bias = o->has_bias ? (const float *)o->b[B_BIAS].init : NULL;
    int64_t bad_rows = 0, near_rows = 0, group_rows = 0;
    double worst = 0.0;
    for (int64_t t = 0; t < o->T; t++) {
        int id_bad = 0, swapped = 0, bad = 0;
        double row_worst = 0.0;
        char why[200] = "";
        for (int64_t k = 0; k < o->K; k++) {
            int64_t i = t * o->K + k;
            if (ia[i] != ib[i]) {
                /* hash routing: the ids come from the table, no near-tie to accept */
                int ok = !o->hash && ia[i] >= 0 && ib[i] >= 0 && ia[i] < o->E && ib[i] < o->E;
                if (ok) {
                    double ca = host_sel(o, o->b[B_LOGITS].init, (const float *)o->b[B_BIAS].init, t, ia[i]);
                    double cb = host_sel(o, o->b[B_LOGITS].init, (const float *)o->b[B_BIAS].init, t, ib[i]);
                    ok = fabs(ca - cb) <= 1e-6 * fmax(fabs(ca), fabs(cb)) + 1e-9;
                }
                if (!ok) id_bad = 1;
                else swapped = 1;
                continue;
            }
            double d = fabs((double)wa[i] - wb[i]) / fmax(fabs((double)wa[i]), 1e-12);
            if (d > row_worst) row_worst = d;
        }
        /* A near-tie (docs/conventions.md: either expert is right) swaps one expert for another of a
         * different weight, so renormalization moves every other weight of the row: those
         * are compared only in rows where the ids agree. */
        if (id_bad && o->hash) {
            bad = 1;
            snprintf(why, sizeof why, "hash ids differ");
        } else if (id_bad) {
            if (mlaf_ref_moe_gate_check_token(&hj, t, ia + t * o->K, why, sizeof why) == NULL)
                group_rows++;
            else
                bad = 1;
        } else if (swapped) {
            near_rows++;
        } else {
            if (row_worst > worst) worst = row_worst;
            if (row_worst > 1e-4) {
                bad = 1;
                snprintf(why, sizeof why, "weights differ by %.2g relative", row_worst);
            }
        }
        if (bad && bad_rows < 3) { /* what differs, with c = s + bias in double */
            fprintf(stderr, "mlafuse bench: moe_gate T=%lld row %lld: %s (id:weight:c)\n",
                    (long long)o->T, (long long)t, why);
            for (int side = 0; side < 2; side++) {
                const int32_t *ids = side ? ib : ia;
                const float *w = side ? wb : wa;
                fprintf(stderr, "  %-8s", side ? "unfused" : "fused");
                for (int64_t k = 0; k < o->K; k++) {
                    const int32_t e = ids[t * o->K + k];
                    const double c = e >= 0 && e < o->E
                                         ? host_sel(o, o->b[B_LOGITS].init,
                                                    (const float *)o->b[B_BIAS].init, t, e)
                                         : NAN;
                    fprintf(stderr, " %d:%.7g:%.9g", (int)e, (double)w[t * o->K + k], c);
                }
                fprintf(stderr, "\n");
            }
        }
        bad_rows += bad;
    }
    if (bad_rows)
        snprintf(check, ccap, "MISMATCH in %lld of %lld rows (worst weight rel %.2g)",
                 (long long)bad_rows, (long long)o->T, worst);
    else if (near_rows && group_rows)
        snprintf(check, ccap, "ok (%lld near-tie row%s, %lld group near-tie%s)", (long long)near_rows,
                 near_rows == 1 ? "" : "s", (long long)group_rows, group_rows == 1 ? "" : "s");
    else if (near_rows)
        snprintf(check, ccap, "ok (%lld near-tie row%s)", (long long)near_rows, near_rows == 1 ? "" : "s");
    else if (group_rows)
        snprintf(check, ccap, "ok (%lld group near-tie%s)", (long long)group_rows, group_rows == 1 ? "" : "s");
}

/* the op's entry in the registry (bench_cmd.c walks it) */
const bench_op_def bench_moe_gate_def = {
    .op = MLAF_OP_MOE_GATE,
    .skip = NULL,
    .setup = setup_moe_gate,
    .fused = fused_moe_gate,
    .unfused = unfused_moe_gate,
    .outputs = outputs_moe_gate,
    .compare = compare_moe_gate,
};
