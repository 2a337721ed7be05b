/*
 * test_moe_gate.c — moe_gate (docs/moe_gate.md) on every backend against the float64 oracle:
 * presets x dtypes x token counts, the shapes other routers reject, exact tie order,
 * non-finite logits, and every rejected argument (status, message, nothing written).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "testlib.h"

static const char *bname;

/* ---- oracle comparison through the shared verify harness ------------------------------ */
static void run_case(mlaf_context *ctx, const char *label, const mlaf_verify_case *c) {
    char name[256];
    snprintf(name, sizeof name, "MOE_GATE(%s,T=%lld,dtype=%s,backend=%s)", label, (long long)c->T,
             mlaf_dtype_name(c->dtype), bname);
    mlaf_verify_result r;
    mlaf_status st = mlaf_verify_moe_gate(ctx, c, &r);
    if (st != MLAF_OK)
        tl_case(0, name, "%s %s", mlaf_status_name(st), r.detail);
    else
        tl_case(r.passed, name, "%s", r.detail);
}

static mlaf_verify_case custom(int32_t E, int32_t k, int32_t G, int32_t kg, mlaf_score_func sf,
                               mlaf_group_score gs, int bias, mlaf_dtype dt, int64_t T,
                               uint64_t seed) {
    mlaf_verify_case c = mlaf_verify_case_default(mlaf_preset_find("deepseek-v3"), dt, T, seed);
    c.weight_dtype = MLAF_F32;
    c.moe_override = 1;
    c.experts = E;
    c.moe.top_k = k;
    c.moe.n_group = G;
    c.moe.topk_group = kg;
    c.moe.score_func = sf;
    c.moe.group_score = gs;
    c.moe.renormalize = 1;
    c.moe.apply_routed_scaling = 1;
    c.moe.routed_scaling_factor = 2.5f;
    c.moe.n_shared_experts = 0;
    c.moe_bias = bias;
    return c;
}

static void test_presets(mlaf_context *ctx) {
    static const int64_t Ts[] = {0, 1, 2, 7, 64, 257, 4096};
    static const mlaf_dtype dts[] = {MLAF_F32, MLAF_BF16, MLAF_F16};
    for (int i = 0; i < mlaf_preset_count(); i++) {
        const mlaf_model_config *cfg = mlaf_preset_at(i);
        for (int d = 0; d < 3; d++)
            for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
                /* quick runs (sanitizers): T = 4096 in one dtype a preset (a different one from
                 * preset to preset), and not for the widest router (Kimi-K3's 896 experts) */
                if (tl_quick() && Ts[ti] > 257 && (cfg->n_routed_experts > 512 || d != i % 3)) continue;
                mlaf_verify_case c =
                    mlaf_verify_case_default(cfg, dts[d], Ts[ti], 1000u + 37u * (unsigned)i + ti);
                c.weight_dtype = MLAF_F32;
                char label[96];
                snprintf(label, sizeof label, "preset=%s", cfg->name);
                run_case(ctx, label, &c);
            }
    }
    if (!tl_quick()) {
        mlaf_verify_case c = mlaf_verify_case_default(mlaf_preset_find("deepseek-v3"), MLAF_BF16,
                                                      65537, 77);
        c.weight_dtype = MLAF_F32;
        run_case(ctx, "preset=deepseek-v3", &c);
        /* DeepSeek-V4's sqrt_softplus router where CUDA takes the team kernel */
        c = mlaf_verify_case_default(mlaf_preset_find("deepseek-v4-flash"), MLAF_F32, 65537, 78);
        c.weight_dtype = MLAF_F32;
        run_case(ctx, "preset=deepseek-v4-flash", &c);
        c = mlaf_verify_case_default(mlaf_preset_find("deepseek-v4-flash"), MLAF_BF16, 16400, 79);
        c.weight_dtype = MLAF_F32;
        run_case(ctx, "preset=deepseek-v4-flash", &c);
    }
}

static void test_shapes(mlaf_context *ctx) {
    static const mlaf_dtype dts[] = {MLAF_F32, MLAF_BF16, MLAF_F16};
    for (int d = 0; d < 3; d++) {
        mlaf_dtype dt = dts[d];
        mlaf_verify_case c;
        /* E = 160, softmax, 8 groups by group max (DeepSeek-V2's shape) with its 2 shared */
        c = custom(160, 6, 8, 3, MLAF_SCORE_SOFTMAX, MLAF_GROUP_MAX, 0, dt, 300, 11);
        c.moe.renormalize = 0;
        c.moe.routed_scaling_factor = 16.0f;
        c.moe.n_shared_experts = 2;
        run_case(ctx, "E=160,softmax,groups=8/3,max,S=2", &c);
        c = custom(384, 8, 1, 1, MLAF_SCORE_SIGMOID, MLAF_GROUP_TOP2_SUM, 1, dt, 300, 12);
        run_case(ctx, "E=384,groups=1", &c);
        c = custom(2048, 8, 64, 8, MLAF_SCORE_SIGMOID, MLAF_GROUP_TOP2_SUM, 1, dt, 200, 13);
        run_case(ctx, "E=2048,groups=64/8,top2", &c);
        c = custom(2048, 64, 1, 1, MLAF_SCORE_SOFTMAX, MLAF_GROUP_TOP2_SUM, 0, dt, 100, 14);
        run_case(ctx, "E=2048,softmax,top_k=64", &c);
        c = custom(64, 8, 1, 1, MLAF_SCORE_SIGMOID, MLAF_GROUP_TOP2_SUM, 1, dt, 300, 15);
        run_case(ctx, "E=64,groups=1,top_k=8", &c);
        c = custom(512, 8, 8, 2, MLAF_SCORE_SIGMOID, MLAF_GROUP_TOP2_SUM, 1, dt, 300, 16);
        run_case(ctx, "E=512,groups=8/2,64 per group", &c);
        c = custom(256, 16, 8, 4, MLAF_SCORE_SIGMOID, MLAF_GROUP_TOP2_SUM, 1, dt, 300, 17);
        run_case(ctx, "E=256,top_k=16", &c);
        c = custom(384, 32, 1, 1, MLAF_SCORE_SIGMOID, MLAF_GROUP_TOP2_SUM, 1, dt, 300, 18);
        run_case(ctx, "E=384,top_k=32", &c);
        c = custom(256, 8, 8, 4, MLAF_SCORE_SIGMOID, MLAF_GROUP_TOP2_SUM, 0, dt, 300, 19);
        run_case(ctx, "E=256,groups=8/4,no bias", &c);
        c = custom(256, 8, 8, 4, MLAF_SCORE_SIGMOID, MLAF_GROUP_TOP2_SUM, 1, dt, 300, 20);
        c.moe.n_shared_experts = 1;
        c.moe.apply_routed_scaling = 0;
        run_case(ctx, "E=256,S=1,unscaled", &c);
        c.moe.n_shared_experts = 2;
        c.moe.renormalize = 0;
        run_case(ctx, "E=256,S=2,no renorm", &c);
        /* odd layouts: groups that are not a multiple of a warp, one expert per group, E = 1 */
        c = custom(100, 7, 5, 3, MLAF_SCORE_SIGMOID, MLAF_GROUP_TOP2_SUM, 1, dt, 257, 21);
        run_case(ctx, "E=100,groups=5/3,top2", &c);
        c = custom(96, 5, 12, 5, MLAF_SCORE_SOFTMAX, MLAF_GROUP_MAX, 1, dt, 257, 22);
        run_case(ctx, "E=96,groups=12/5,max", &c);
        c = custom(64, 3, 64, 3, MLAF_SCORE_SIGMOID, MLAF_GROUP_MAX, 1, dt, 257, 23);
        run_case(ctx, "E=64,groups=64/3,max", &c);
        c = custom(1024, 10, 64, 7, MLAF_SCORE_SOFTMAX, MLAF_GROUP_TOP2_SUM, 1, dt, 257, 24);
        run_case(ctx, "E=1024,groups=64/7,top2", &c);
        c = custom(1000, 33, 40, 9, MLAF_SCORE_SIGMOID, MLAF_GROUP_TOP2_SUM, 1, dt, 257, 25);
        run_case(ctx, "E=1000,groups=40/9,top_k=33", &c);
        c = custom(1536, 20, 2, 1, MLAF_SCORE_SIGMOID, MLAF_GROUP_MAX, 1, dt, 200, 26);
        run_case(ctx, "E=1536,groups=2/1,max", &c);
        /* one group of 513 .. 1024 experts at decode sizes (CUDA: the tiny kernel's 24- and 32-warp
         * blocks): Kimi-K3's 896 / top-16, softmax over 1024, 700 with sqrt-softplus */
        c = custom(896, 16, 1, 1, MLAF_SCORE_SIGMOID, MLAF_GROUP_TOP2_SUM, 1, dt, 64, 30);
        c.moe.n_shared_experts = 2;
        run_case(ctx, "E=896,top_k=16,S=2", &c);
        /* past decode sizes (CUDA: the 896-expert router's mid- and large-T kernels) */
        c = custom(896, 16, 1, 1, MLAF_SCORE_SIGMOID, MLAF_GROUP_TOP2_SUM, 1, dt, tl_quick() ? 300 : 1100, 33);
        run_case(ctx, "E=896,top_k=16", &c);
        c.nonfinite = 1;
        run_case(ctx, "E=896,top_k=16,nonfinite", &c);
        c = custom(896, 8, 1, 1, MLAF_SCORE_SOFTMAX, MLAF_GROUP_TOP2_SUM, 0, dt, 150, 34);
        run_case(ctx, "E=896,softmax", &c);
        c = custom(700, 6, 1, 1, MLAF_SCORE_SQRT_SOFTPLUS, MLAF_GROUP_TOP2_SUM, 1, dt, 200, 35);
        c.want_scores = 1;
        run_case(ctx, "E=700,sqrt_softplus,scores", &c);
        c = custom(1024, 8, 1, 1, MLAF_SCORE_SOFTMAX, MLAF_GROUP_TOP2_SUM, 0, dt, 17, 31);
        run_case(ctx, "E=1024,softmax", &c);
        c = custom(700, 6, 1, 1, MLAF_SCORE_SQRT_SOFTPLUS, MLAF_GROUP_TOP2_SUM, 1, dt, 5, 32);
        run_case(ctx, "E=700,sqrt_softplus", &c);
        c = custom(1, 1, 1, 1, MLAF_SCORE_SOFTMAX, MLAF_GROUP_TOP2_SUM, 0, dt, 33, 27);
        run_case(ctx, "E=1,softmax", &c);
        c = custom(33, 33, 1, 1, MLAF_SCORE_SIGMOID, MLAF_GROUP_TOP2_SUM, 1, dt, 65, 28);
        run_case(ctx, "E=33,top_k=33", &c);
        /* outputs: weights in the logits' dtype, the score matrix, strided everything */
        c = mlaf_verify_case_default(mlaf_preset_find("deepseek-v3"), dt, 513, 29);
        c.weight_dtype = dt;
        run_case(ctx, "preset=deepseek-v3,weights=logits dtype", &c);
        c.weight_dtype = MLAF_F32;
        c.want_scores = 1;
        run_case(ctx, "preset=deepseek-v3,scores", &c);
        c = mlaf_verify_case_default(mlaf_preset_find("deepseek-v2"), dt, 513, 30);
        c.weight_dtype = MLAF_F32;
        c.want_scores = 1;
        c.strided = 1;
        run_case(ctx, "preset=deepseek-v2,scores,strided", &c);
        c = mlaf_verify_case_default(mlaf_preset_find("kimi-k2"), dt, 513, 31);
        c.weight_dtype = dt;
        c.strided = 1;
        run_case(ctx, "preset=kimi-k2,weights=logits dtype,strided", &c);
        c = custom(2048, 16, 16, 4, MLAF_SCORE_SOFTMAX, MLAF_GROUP_MAX, 1, dt, 129, 32);
        c.strided = 1;
        c.want_scores = 1;
        run_case(ctx, "E=2048,groups=16/4,max,scores,strided", &c);
        /* non-finite logits (and one non-finite bias entry) in some rows and whole rows */
        for (int i = 0; i < mlaf_preset_count(); i++) {
            const mlaf_model_config *cfg = mlaf_preset_at(i);
            c = mlaf_verify_case_default(cfg, dt, 700, 40u + (unsigned)i);
            c.weight_dtype = MLAF_F32;
            c.nonfinite = 1;
            c.want_scores = 1;
            char label[96];
            snprintf(label, sizeof label, "preset=%s,nonfinite", cfg->name);
            run_case(ctx, label, &c);
        }
        c = custom(2048, 64, 64, 16, MLAF_SCORE_SOFTMAX, MLAF_GROUP_TOP2_SUM, 1, dt, 100, 50);
        c.nonfinite = 1;
        c.moe.n_shared_experts = 3;
        run_case(ctx, "E=2048,groups=64/16,top_k=64,S=3,nonfinite", &c);
        /* sqrt_softplus (DeepSeek-V4) beyond its preset: large |logits| across its three
         * formulas, groups, other widths, the score output, strided rows, NaN / inf */
        c = custom(256, 6, 1, 1, MLAF_SCORE_SQRT_SOFTPLUS, MLAF_GROUP_TOP2_SUM, 1, dt, 1025, 51);
        c.moe.routed_scaling_factor = 1.5f;
        c.moe_wide = 1;
        run_case(ctx, "E=256,sqrt_softplus,wide", &c);
        c.want_scores = 1;
        run_case(ctx, "E=256,sqrt_softplus,wide,scores", &c);
        c.strided = 1;
        c.nonfinite = 1;
        c.moe.n_shared_experts = 1;
        c.weight_dtype = dt;
        run_case(ctx, "E=256,sqrt_softplus,wide,nonfinite,S=1,weights=logits dtype,strided", &c);
        c = custom(384, 8, 8, 4, MLAF_SCORE_SQRT_SOFTPLUS, MLAF_GROUP_TOP2_SUM, 1, dt, 300, 52);
        c.moe_wide = 1;
        run_case(ctx, "E=384,sqrt_softplus,groups=8/4,wide", &c);
        c = custom(2048, 64, 16, 4, MLAF_SCORE_SQRT_SOFTPLUS, MLAF_GROUP_MAX, 0, dt, 100, 53);
        c.moe_wide = 1;
        c.nonfinite = 1;
        c.want_scores = 1;
        c.moe.renormalize = 0;
        run_case(ctx, "E=2048,sqrt_softplus,groups=16/4,max,top_k=64,no renorm,wide,nonfinite", &c);
        c = custom(64, 4, 1, 1, MLAF_SCORE_SQRT_SOFTPLUS, MLAF_GROUP_TOP2_SUM, 1, dt, 33, 54);
        c.moe_wide = 1;
        run_case(ctx, "E=64,sqrt_softplus,wide", &c);
    }
}

/* ---- direct runs: exact ids against the oracle ---------------------------------------- */

/* Runs moe_gate on ctx for host logits [T, E] (dense) and returns ids / f32 weights (dense
 * [T, K]) in host memory. 0 on success, else fills why. */
static int run_direct(mlaf_context *ctx, const mlaf_moe_gate_params *p, int32_t E, int64_t T,
                      mlaf_dtype dt, const void *logits, const float *bias, int32_t *ids,
                      float *w, char *why, size_t cap) {
    mlaf_backend b = mlaf_context_backend(ctx);
    int32_t K = p->top_k + p->n_shared_experts;
    mlaf_gbuf gl, gb, gw, gi;
    memset(&gb, 0, sizeof gb);
    size_t lb = (size_t)(T * E) * mlaf_dtype_size(dt);
    int rc = 1;
    if (mlaf_gbuf_alloc(&gl, b, lb, logits, 0) != MLAF_OK) return snprintf(why, cap, "alloc"), 1;
    mlaf_gbuf_alloc(&gw, b, (size_t)(T * K) * 4, NULL, 0);
    mlaf_gbuf_alloc(&gi, b, (size_t)(T * K) * 4, NULL, 0);
    if (bias) mlaf_gbuf_alloc(&gb, b, (size_t)E * 4, bias, 0);
    mlaf_tensor tl = mlaf_tensor_2d(gl.ptr, dt, T, E, E);
    mlaf_tensor tb = mlaf_tensor_1d(gb.ptr, MLAF_F32, E);
    mlaf_tensor tw = mlaf_tensor_2d(gw.ptr, MLAF_F32, T, K, K);
    mlaf_tensor ti = mlaf_tensor_2d(gi.ptr, MLAF_I32, T, K, K);
    mlaf_status st = mlaf_moe_gate(ctx, p, &tl, bias ? &tb : NULL, &tw, &ti, NULL);
    if (st == MLAF_OK) st = mlaf_context_sync(ctx);
    if (st != MLAF_OK) {
        snprintf(why, cap, "%s: %s", mlaf_status_name(st), mlaf_context_last_error(ctx));
    } else if (mlaf_gbuf_download(&gw) != MLAF_OK || mlaf_gbuf_download(&gi) != MLAF_OK) {
        snprintf(why, cap, "download failed");
    } else if (!mlaf_gbuf_guards_ok(&gw) || !mlaf_gbuf_guards_ok(&gi)) {
        snprintf(why, cap, "guard zone overwritten");
    } else {
        memcpy(ids, gi.body, (size_t)(T * K) * 4);
        memcpy(w, gw.body, (size_t)(T * K) * 4);
        rc = 0;
    }
    mlaf_gbuf_free(&gl);
    mlaf_gbuf_free(&gw);
    mlaf_gbuf_free(&gi);
    if (bias) mlaf_gbuf_free(&gb);
    return rc;
}

/* Exact comparison with the oracle plus the structural promises (distinct, in range, from
 * kept groups, weight 0 for non-finite logits, no NaN weight). */
static void exact_case(mlaf_context *ctx, const char *label, const mlaf_moe_gate_params *p,
                       int32_t E, int64_t T, mlaf_dtype dt, const void *logits, const float *bias,
                       const int32_t *expect_first_row) {
    char name[256], why[256] = "";
    snprintf(name, sizeof name, "MOE_GATE(%s,T=%lld,dtype=%s,backend=%s)", label, (long long)T,
             mlaf_dtype_name(dt), bname);
    int32_t K = p->top_k + p->n_shared_experts;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(T * K));
    float *w = malloc(sizeof(float) * (size_t)(T * K));
    int32_t *rid = malloc(sizeof(int32_t) * (size_t)(T * K));
    double *rw = malloc(sizeof(double) * (size_t)(T * K));
    double *sel = malloc(sizeof(double) * (size_t)(T * (p->top_k + 1)));
    int ok = !run_direct(ctx, p, E, T, dt, logits, bias, ids, w, why, sizeof why);
    if (ok) {
        mlaf_tensor hl = mlaf_tensor_2d((void *)logits, dt, T, E, E);
        mlaf_tensor hb = mlaf_tensor_1d((void *)bias, MLAF_F32, E);
        mlaf_tensor hw = mlaf_tensor_2d(rw, MLAF_F32, T, K, K);
        mlaf_tensor hi = mlaf_tensor_2d(rid, MLAF_I32, T, K, K);
        mlaf_moe_gate_job job;
        if (mlaf_check_moe_gate(NULL, p, &hl, bias ? &hb : NULL, &hw, &hi, NULL, &job) != MLAF_OK) {
            ok = 0;
            snprintf(why, sizeof why, "oracle job rejected");
        } else {
            mlaf_ref_moe_gate(&job, rw, rid, sel, NULL);
        }
    }
    int32_t P = E / p->n_group;
    for (int64_t t = 0; ok && t < T; t++) {
        const int32_t *g = ids + t * K, *r = rid + t * K;
        const float *gw = w + t * K;
        const char *row = (const char *)logits + (size_t)(t * E) * mlaf_dtype_size(dt);
        for (int32_t j = 0; ok && j < K; j++) {
            if (g[j] != r[j]) {
                ok = 0;
                snprintf(why, sizeof why, "token %lld: ids[%d] = %d, oracle %d", (long long)t, j,
                         g[j], r[j]);
            } else if (isnan(gw[j])) {
                ok = 0;
                snprintf(why, sizeof why, "token %lld: weights[%d] is NaN", (long long)t, j);
            } else if (j < p->top_k && !isfinite(mlaf_load_f32(row, dt, g[j])) && gw[j] != 0.0f) {
                ok = 0;
                snprintf(why, sizeof why, "token %lld: weights[%d] = %g for a non-finite logit",
                         (long long)t, j, gw[j]);
            } else if (fabs(gw[j] - rw[t * K + j]) > 1e-5 * fmax(fabs(rw[t * K + j]), 1e-3)) {
                ok = 0;
                snprintf(why, sizeof why, "token %lld: weights[%d] = %.9g, oracle %.9g",
                         (long long)t, j, gw[j], rw[t * K + j]);
            }
        }
        /* distinct, in range, from a consistent set of at most topk_group groups */
        uint64_t groups = 0;
        for (int32_t j = 0; ok && j < p->top_k; j++) {
            if (g[j] < 0 || g[j] >= E) ok = 0;
            for (int32_t i = 0; ok && i < j; i++)
                if (g[i] == g[j]) ok = 0;
            if (ok) groups |= 1ull << (g[j] / P);
            if (!ok) snprintf(why, sizeof why, "token %lld: ids not distinct / in range", (long long)t);
        }
        if (ok && __builtin_popcountll(groups) > p->topk_group) {
            ok = 0;
            snprintf(why, sizeof why, "token %lld: ids from more than topk_group groups", (long long)t);
        }
        if (ok && t == 0 && expect_first_row)
            for (int32_t j = 0; ok && j < p->top_k; j++)
                if (g[j] != expect_first_row[j]) {
                    ok = 0;
                    snprintf(why, sizeof why, "ids[%d] = %d, expected %d", j, g[j],
                             expect_first_row[j]);
                }
    }
    tl_case(ok, name, "%s", why);
    free(ids), free(w), free(rid), free(rw), free(sel);
}

static mlaf_moe_gate_params gate_params(int32_t k, int32_t G, int32_t kg, mlaf_score_func sf,
                                        mlaf_group_score gs) {
    mlaf_moe_gate_params p = mlaf_moe_gate_params_from_config(NULL);
    p.top_k = k;
    p.n_group = G;
    p.topk_group = kg;
    p.score_func = sf;
    p.group_score = gs;
    p.renormalize = 1;
    p.routed_scaling_factor = 2.5f;
    p.apply_routed_scaling = 1;
    p.n_shared_experts = 1;
    return p;
}

/* Ties and non-finite input at E experts and T tokens; with GLM-4.7-Flash's top-4 of one group
 * as well when `glm` (the CUDA prefill kernel's shapes are DeepSeek-V3's and GLM's at
 * T >= 1024, so the larger T reaches its exact path and list overflow). */
static void ties_at(mlaf_context *ctx, int32_t E, int64_t T, int glm) {
    static const mlaf_dtype dts[] = {MLAF_F32, MLAF_BF16, MLAF_F16};
    mlaf_rng rng;
    mlaf_rng_seed(&rng, 5);
    void *lg = malloc((size_t)(T * E) * 4);
    float *bias = malloc(sizeof(float) * (size_t)E);
    for (int d = 0; d < 3; d++) {
        mlaf_dtype dt = dts[d];
        for (int sf = 0; sf < 2; sf++) {
            mlaf_moe_gate_params p1 = gate_params(8, 1, 1, (mlaf_score_func)sf, MLAF_GROUP_TOP2_SUM);
            mlaf_moe_gate_params p8 = gate_params(8, 8, 4, (mlaf_score_func)sf, MLAF_GROUP_TOP2_SUM);
            mlaf_moe_gate_params pm = gate_params(6, 8, 3, (mlaf_score_func)sf, MLAF_GROUP_MAX);
            mlaf_moe_gate_params p4 = gate_params(4, 1, 1, (mlaf_score_func)sf, MLAF_GROUP_TOP2_SUM);
            const char *sfn = sf ? "softmax" : "sigmoid";
            char label[128];
            /* every logit equal: the lowest indices of the lowest groups */
            for (int64_t i = 0; i < T * E; i++) mlaf_store_f32(lg, dt, i, 0.75f);
            int32_t first[8] = {0, 1, 2, 3, 4, 5, 6, 7};
            snprintf(label, sizeof label, "ties=row equal,%s,groups=1", sfn);
            exact_case(ctx, label, &p1, E, T, dt, lg, NULL, first);
            if (glm) {
                snprintf(label, sizeof label, "ties=row equal,%s,E=%d,top_k=4", sfn, (int)E);
                exact_case(ctx, label, &p4, E, T, dt, lg, NULL, first);
            }
            snprintf(label, sizeof label, "ties=row equal,%s,groups=8/4", sfn);
            exact_case(ctx, label, &p8, E, T, dt, lg, NULL, first);
            for (int32_t e = 0; e < E; e++) bias[e] = 0.125f;
            snprintf(label, sizeof label, "ties=row equal,%s,groups=8/3,max,bias", sfn);
            exact_case(ctx, label, &pm, E, T, dt, lg, bias, first);
            /* few distinct values: many exact ties at every boundary */
            for (int64_t i = 0; i < T * E; i++)
                mlaf_store_f32(lg, dt, i, (float)((int)(mlaf_rng_u64(&rng) % 4) - 2) * 0.5f);
            snprintf(label, sizeof label, "ties=4 values,%s,groups=1", sfn);
            exact_case(ctx, label, &p1, E, T, dt, lg, NULL, NULL);
            if (glm) {
                snprintf(label, sizeof label, "ties=4 values,%s,E=%d,top_k=4,bias", sfn, (int)E);
                exact_case(ctx, label, &p4, E, T, dt, lg, bias, NULL);
            }
            snprintf(label, sizeof label, "ties=4 values,%s,groups=8/4", sfn);
            exact_case(ctx, label, &p8, E, T, dt, lg, NULL, NULL);
            snprintf(label, sizeof label, "ties=4 values,%s,groups=8/3,max", sfn);
            exact_case(ctx, label, &pm, E, T, dt, lg, bias, NULL);
            /* non-finite values mixed in: NaN, +inf, -inf */
            const float bad[3] = {NAN, INFINITY, -INFINITY};
            for (int64_t t = 0; t < T; t++) {
                int n = (int)(t % 9) * 31; /* from none to most of the row */
                if (t % 9 == 8) n = E;      /* the whole row */
                for (int i = 0; i < n; i++) {
                    uint64_t u = mlaf_rng_u64(&rng);
                    mlaf_store_f32(lg, dt, t * E + (int64_t)(u % (uint64_t)E), bad[(u >> 32) % 3]);
                }
            }
            snprintf(label, sizeof label, "nonfinite=mixed,%s,groups=1", sfn);
            exact_case(ctx, label, &p1, E, T, dt, lg, NULL, NULL);
            if (glm) {
                snprintf(label, sizeof label, "nonfinite=mixed,%s,E=%d,top_k=4,bias", sfn, (int)E);
                exact_case(ctx, label, &p4, E, T, dt, lg, bias, NULL);
            }
            snprintf(label, sizeof label, "nonfinite=mixed,%s,groups=8/4", sfn);
            exact_case(ctx, label, &p8, E, T, dt, lg, NULL, NULL);
            snprintf(label, sizeof label, "nonfinite=mixed,%s,groups=8/3,max", sfn);
            exact_case(ctx, label, &pm, E, T, dt, lg, bias, NULL);
            /* whole rows of one non-finite value: lowest experts of the lowest groups, weight 0 */
            for (int b = 0; b < 3; b++) {
                for (int64_t i = 0; i < T * E; i++) mlaf_store_f32(lg, dt, i, bad[b]);
                const char *bn = b == 0 ? "nan" : b == 1 ? "+inf" : "-inf";
                snprintf(label, sizeof label, "nonfinite=all %s,%s,groups=1", bn, sfn);
                exact_case(ctx, label, &p1, E, T, dt, lg, NULL, first);
                snprintf(label, sizeof label, "nonfinite=all %s,%s,groups=8/4", bn, sfn);
                exact_case(ctx, label, &p8, E, T, dt, lg, NULL, first);
            }
            /* one valid expert per token, rest invalid: it comes first, the others follow by
             * index from its group and the lowest other groups */
            for (int64_t t = 0; t < T; t++)
                for (int32_t e = 0; e < E; e++)
                    mlaf_store_f32(lg, dt, t * E + e, e == (int32_t)((t * 37) % E) ? -3.0f : NAN);
            snprintf(label, sizeof label, "nonfinite=one valid,%s,groups=8/4", sfn);
            exact_case(ctx, label, &p8, E, T, dt, lg, NULL, NULL);
            /* a non-finite bias entry ranks its expert last */
            for (int64_t i = 0; i < T * E; i++) mlaf_store_f32(lg, dt, i, 1.0f);
            for (int32_t e = 0; e < E; e++) bias[e] = e < 4 ? NAN : 0.0f;
            int32_t after[8] = {4, 5, 6, 7, 8, 9, 10, 11};
            snprintf(label, sizeof label, "nonfinite=bias,%s,groups=1", sfn);
            exact_case(ctx, label, &p1, E, T, dt, lg, bias, after);
            snprintf(label, sizeof label, "nonfinite=bias,%s,groups=8/4", sfn);
            exact_case(ctx, label, &p8, E, T, dt, lg, bias, after);
            if (glm) {
                snprintf(label, sizeof label, "nonfinite=bias,%s,E=%d,top_k=4", sfn, (int)E);
                exact_case(ctx, label, &p4, E, T, dt, lg, bias, after);
            }
        }
    }
    free(lg);
    free(bias);
}

/* DeepSeek-V4's sqrt_softplus router (top 6 of one group of 256) at T tokens: exact and near
 * ties around the k-th key. CUDA's solo kernel (T >= 1024) ranks by a cheap score and re-keys
 * its candidates exactly: keys spaced 8e-4 apart (inside the cheap score's margin, so the
 * re-keyed order decides), 1e-5 apart (more candidates than its list: the exact path), across
 * the formula's x = 20 seam; and a cluster where the cheap score's error exceeds the spacing. Keys are placed by choosing each logit from its expert's bias:
 * x = log(expm1(y^2)) has sqrt(softplus(x)) = y. */
static void ties_ssp(mlaf_context *ctx, int64_t T) {
    const int32_t E = 256;
    static const mlaf_dtype dts[] = {MLAF_F32, MLAF_BF16, MLAF_F16};
    mlaf_rng rng;
    mlaf_rng_seed(&rng, 9);
    void *lg = malloc((size_t)(T * E) * 4);
    float *bias = malloc(sizeof(float) * (size_t)E);
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)E);
    mlaf_moe_gate_params p = gate_params(6, 1, 1, MLAF_SCORE_SQRT_SOFTPLUS, MLAF_GROUP_TOP2_SUM);
    char label[128];
    for (int d = 0; d < 3; d++) {
        const mlaf_dtype dt = dts[d];
        for (int64_t i = 0; i < T * E; i++) mlaf_store_f32(lg, dt, i, 0.75f);
        int32_t first[6] = {0, 1, 2, 3, 4, 5};
        exact_case(ctx, "ties=row equal,sqrt_softplus,E=256,top_k=6", &p, E, T, dt, lg, NULL, first);
        for (int64_t i = 0; i < T * E; i++)
            mlaf_store_f32(lg, dt, i, (float)((int)(mlaf_rng_u64(&rng) % 4) - 2) * 0.5f);
        exact_case(ctx, "ties=4 values,sqrt_softplus,E=256,top_k=6", &p, E, T, dt, lg, NULL, NULL);
        for (int32_t e = 0; e < E; e++) bias[e] = 0.125f;
        exact_case(ctx, "ties=4 values,sqrt_softplus,E=256,top_k=6,bias", &p, E, T, dt, lg, bias, NULL);
        const float bad[3] = {NAN, INFINITY, -INFINITY};
        for (int64_t t = 0; t < T; t++) {
            int n = (int)(t % 9) * 31;
            if (t % 9 == 8) n = E;
            for (int i = 0; i < n; i++) {
                uint64_t u = mlaf_rng_u64(&rng);
                mlaf_store_f32(lg, dt, t * E + (int64_t)(u % (uint64_t)E), bad[(u >> 32) % 3]);
            }
        }
        exact_case(ctx, "nonfinite=mixed,sqrt_softplus,E=256,top_k=6,bias", &p, E, T, dt, lg, bias, NULL);
    }
    /* near ties, f32 logits (a 2-byte logit cannot place a key this finely) */
    for (int32_t e = 0; e < E; e++) bias[e] = (float)(4.0 * mlaf_rng_uniform(&rng) - 2.0);
    static const double steps[2] = {8e-4, 1e-5};
    for (int si = 0; si < 2; si++) {
        for (int64_t t = 0; t < T; t++) {
            for (int32_t e = 0; e < E; e++) perm[e] = e;
            for (int32_t e = E - 1; e > 0; e--) {
                const int32_t j = (int32_t)(mlaf_rng_u64(&rng) % (uint64_t)(e + 1)), v = perm[e];
                perm[e] = perm[j], perm[j] = v;
            }
            for (int32_t e = 0; e < E; e++) {
                const double y = 3.0 + steps[si] * perm[e] - (double)bias[e]; /* key 3 + step j */
                mlaf_store_f32(lg, MLAF_F32, t * E + e, (float)log(expm1(y * y)));
            }
        }
        snprintf(label, sizeof label, "ties=keys %g apart,sqrt_softplus,E=256,top_k=6,bias", steps[si]);
        exact_case(ctx, label, &p, E, T, MLAF_F32, lg, bias, NULL);
    }
    /* ten experts keyed 2e-5 apart where sqrt_softplus is ~1e-3 (x ~ -14, where the cheap
     * score errs most), the rest far below: the top 6 are decided inside the cheap score's
     * error, so a missing margin or re-keying shows */
    static const int32_t cl[10] = {3, 40, 41, 77, 128, 129, 200, 201, 250, 255};
    for (int32_t e = 0; e < E; e++) bias[e] = 0.0f;
    for (int i = 0; i < 10; i++) bias[cl[i]] = (float)(3.0 - 1e-3 * (1.0 + 0.2 * mlaf_rng_uniform(&rng)));
    for (int64_t t = 0; t < T; t++) {
        for (int32_t e = 0; e < E; e++) mlaf_store_f32(lg, MLAF_F32, t * E + e, (float)(mlaf_rng_uniform(&rng) - 0.5));
        for (int i = 0; i < 10; i++) perm[i] = i;
        for (int i = 9; i > 0; i--) {
            const int32_t j = (int32_t)(mlaf_rng_u64(&rng) % (uint64_t)(i + 1)), v = perm[i];
            perm[i] = perm[j], perm[j] = v;
        }
        for (int i = 0; i < 10; i++) {
            const double y = 3.0 + 2e-5 * perm[i] - (double)bias[cl[i]];
            mlaf_store_f32(lg, MLAF_F32, t * E + cl[i], (float)log(expm1(y * y)));
        }
    }
    exact_case(ctx, "ties=10 keys 2e-5 apart at x ~ -14,sqrt_softplus,E=256,top_k=6,bias", &p, E, T, MLAF_F32, lg,
               bias, NULL);
    free(lg);
    free(bias);
    free(perm);
}

static void test_ties(mlaf_context *ctx) {
    /* the CPU's quick runs (sanitizers) stop at T = 1091 (two threads): larger T only picks other
     * CUDA kernels */
    const int big = !tl_quick() || mlaf_context_backend(ctx) != MLAF_BACKEND_CPU;
    ties_ssp(ctx, big ? 2100 : 700);
    ties_at(ctx, 256, 64, 0);
    ties_at(ctx, 256, 500, 0); /* CUDA: the tiny kernel at mid T */
    ties_at(ctx, 256, 1091, 0);
    ties_at(ctx, 64, 1091, 1);
    if (big) ties_at(ctx, 64, 4100, 1);
}

/* ---- misuse: every rejected argument ---------------------------------------------------- */
typedef struct misuse {
    mlaf_moe_gate_params p;
    mlaf_tensor logits, bias, weights, ids, scores;
    int has_logits, has_bias, has_scores, null_params;
} misuse;

static void misuse_case(mlaf_context *ctx, const char *what, const misuse *m, mlaf_status want,
                        const char *must_name, mlaf_gbuf *outs, int nouts) {
    char name[256];
    snprintf(name, sizeof name, "MOE_GATE(misuse=%s,backend=%s)", what, bname);
    mlaf_status st = mlaf_moe_gate(ctx, m->null_params ? NULL : &m->p,
                                   m->has_logits ? &m->logits : NULL,
                                   m->has_bias ? &m->bias : NULL, &m->weights, &m->ids,
                                   m->has_scores ? &m->scores : NULL);
    const char *msg = mlaf_context_last_error(ctx);
    int ok = st == want && strstr(msg, must_name) != NULL;
    int untouched = 1;
    mlaf_context_sync(ctx);
    for (int i = 0; i < nouts; i++) {
        unsigned char *poison = malloc(outs[i].bytes);
        memset(poison, 0xFF, outs[i].bytes);
        if (mlaf_gbuf_download(&outs[i]) != MLAF_OK || !mlaf_gbuf_equals(&outs[i], poison) ||
            !mlaf_gbuf_guards_ok(&outs[i]))
            untouched = 0;
        free(poison);
    }
    tl_case(ok && untouched, name, "status %s (want %s), message \"%s\" (must name %s)%s",
            mlaf_status_name(st), mlaf_status_name(want), msg, must_name,
            untouched ? "" : ", and an output was written");
}

static void test_misuse(mlaf_context *ctx) {
    mlaf_backend b = mlaf_context_backend(ctx);
    const int32_t E = 256, T = 5, K = 9;
    mlaf_gbuf gl, gb, outs[3];
    float *lh = calloc((size_t)(T * E * 2), sizeof(float));
    mlaf_gbuf_alloc(&gl, b, (size_t)(T * E * 2) * 4, lh, 0);
    mlaf_gbuf_alloc(&gb, b, (size_t)E * 4 * 2, lh, 0);
    mlaf_gbuf_alloc(&outs[0], b, (size_t)(T * K * 2) * 4, NULL, 0);
    mlaf_gbuf_alloc(&outs[1], b, (size_t)(T * K * 2) * 4, NULL, 0);
    mlaf_gbuf_alloc(&outs[2], b, (size_t)(T * E * 2) * 4, NULL, 0);
    misuse base;
    memset(&base, 0, sizeof base);
    base.p = mlaf_moe_gate_params_from_config(mlaf_preset_find("deepseek-v3"));
    base.p.n_shared_experts = 1;
    base.logits = mlaf_tensor_2d(gl.ptr, MLAF_F32, T, E, E);
    base.bias = mlaf_tensor_1d(gb.ptr, MLAF_F32, E);
    base.weights = mlaf_tensor_2d(outs[0].ptr, MLAF_F32, T, K, K);
    base.ids = mlaf_tensor_2d(outs[1].ptr, MLAF_I32, T, K, K);
    base.scores = mlaf_tensor_2d(outs[2].ptr, MLAF_F32, T, E, E);
    base.has_logits = base.has_bias = base.has_scores = 1;
    misuse m;
#define MISUSE(what, want, needle, edit) \
    do {                                  \
        m = base;                         \
        edit;                             \
        misuse_case(ctx, what, &m, want, needle, outs, 3); \
    } while (0)
    MISUSE("params NULL", MLAF_ERR_NULL_POINTER, "params", m.null_params = 1);
    MISUSE("logits NULL", MLAF_ERR_NULL_POINTER, "logits", m.has_logits = 0);
    MISUSE("logits dtype i32", MLAF_ERR_DTYPE, "logits", m.logits.dtype = MLAF_I32);
    MISUSE("logits 3d", MLAF_ERR_SHAPE, "logits", m.logits.ndim = 3);
    MISUSE("logits inner stride", MLAF_ERR_STRIDE, "logits", m.logits.stride[1] = 2);
    MISUSE("E=0", MLAF_ERR_LIMIT, "logits.shape[1]", m.logits.shape[1] = 0);
    MISUSE("E=2049", MLAF_ERR_LIMIT, "logits.shape[1]",
           (m.logits.shape[0] = 1, m.logits.shape[1] = 2049, m.logits.stride[0] = 2049));
    MISUSE("score_func=3", MLAF_ERR_INVALID_ARGUMENT, "score_func", m.p.score_func = (mlaf_score_func)3);
    MISUSE("group_score=7", MLAF_ERR_INVALID_ARGUMENT, "group_score", m.p.group_score = (mlaf_group_score)7);
    MISUSE("n_group=0", MLAF_ERR_LIMIT, "n_group", m.p.n_group = 0);
    MISUSE("n_group=65", MLAF_ERR_LIMIT, "n_group", m.p.n_group = 65);
    MISUSE("n_group=3 (E=256)", MLAF_ERR_LIMIT, "n_group", m.p.n_group = 3);
    MISUSE("topk_group=0", MLAF_ERR_LIMIT, "topk_group", m.p.topk_group = 0);
    MISUSE("topk_group=9", MLAF_ERR_LIMIT, "topk_group", m.p.topk_group = 9);
    MISUSE("top2 with 1 expert per group", MLAF_ERR_LIMIT, "group_score",
           (m.p.n_group = 64, m.p.topk_group = 8, m.logits.shape[1] = 64, m.has_bias = 0,
            m.has_scores = 0));
    MISUSE("top_k=0", MLAF_ERR_LIMIT, "top_k", m.p.top_k = 0);
    MISUSE("top_k=65", MLAF_ERR_LIMIT, "top_k", m.p.top_k = 65);
    MISUSE("top_k>E", MLAF_ERR_LIMIT, "top_k",
           (m.p.top_k = 9, m.p.n_group = 1, m.p.topk_group = 1, m.logits.shape[1] = 8,
            m.has_bias = 0, m.has_scores = 0));
    MISUSE("top_k>kept experts", MLAF_ERR_LIMIT, "top_k",
           (m.p.top_k = 40, m.p.topk_group = 1, m.weights.shape[1] = 41, m.ids.shape[1] = 41));
    MISUSE("n_shared=-1", MLAF_ERR_LIMIT, "n_shared_experts", m.p.n_shared_experts = -1);
    MISUSE("n_shared=65", MLAF_ERR_LIMIT, "n_shared_experts", m.p.n_shared_experts = 65);
    MISUSE("scaling=0", MLAF_ERR_INVALID_ARGUMENT, "routed_scaling_factor", m.p.routed_scaling_factor = 0.0f);
    MISUSE("scaling=nan", MLAF_ERR_INVALID_ARGUMENT, "routed_scaling_factor", m.p.routed_scaling_factor = NAN);
    MISUSE("scaling=inf", MLAF_ERR_INVALID_ARGUMENT, "routed_scaling_factor", m.p.routed_scaling_factor = INFINITY);
    MISUSE("eps=-1", MLAF_ERR_INVALID_ARGUMENT, "eps", m.p.eps = -1.0f);
    MISUSE("eps=nan", MLAF_ERR_INVALID_ARGUMENT, "eps", m.p.eps = NAN);
    MISUSE("bias dtype bf16", MLAF_ERR_DTYPE, "bias", m.bias.dtype = MLAF_BF16);
    MISUSE("bias shape", MLAF_ERR_SHAPE, "bias", m.bias.shape[0] = E - 1);
    MISUSE("weights shape", MLAF_ERR_SHAPE, "weights", m.weights.shape[1] = K - 1);
    MISUSE("weights rows", MLAF_ERR_SHAPE, "weights", m.weights.shape[0] = T + 1);
    MISUSE("weights dtype i32", MLAF_ERR_DTYPE, "weights", m.weights.dtype = MLAF_I32);
    MISUSE("weights dtype bf16 for f32 logits", MLAF_ERR_DTYPE, "weights", m.weights.dtype = MLAF_BF16);
    MISUSE("ids dtype f32", MLAF_ERR_DTYPE, "ids", m.ids.dtype = MLAF_F32);
    MISUSE("ids dtype i64", MLAF_ERR_DTYPE, "ids", m.ids.dtype = MLAF_I64);
    MISUSE("scores shape", MLAF_ERR_SHAPE, "scores", m.scores.shape[1] = E + 1);
    MISUSE("scores dtype bf16", MLAF_ERR_DTYPE, "scores", m.scores.dtype = MLAF_BF16);
    MISUSE("ids overlap weights", MLAF_ERR_OVERLAP, "ids", m.ids.data = outs[0].ptr);
    MISUSE("weights overlap logits", MLAF_ERR_OVERLAP, "weights",
           (m.weights.data = gl.ptr, m.has_scores = 0));
#undef MISUSE
    mlaf_gbuf_free(&gl);
    mlaf_gbuf_free(&gb);
    for (int i = 0; i < 3; i++) mlaf_gbuf_free(&outs[i]);
    free(lh);
}

/* The CPU result does not depend on the thread count. */
static void test_threads(mlaf_context *ctx) {
    if (mlaf_context_backend(ctx) != MLAF_BACKEND_CPU) return;
    const int32_t E = 256;
    const int64_t T = 3001;
    mlaf_moe_gate_params p = mlaf_moe_gate_params_from_config(mlaf_preset_find("deepseek-v3"));
    float *lg = malloc(sizeof(float) * (size_t)(T * E)), *bias = malloc(sizeof(float) * E);
    int32_t *i1 = malloc(sizeof(int32_t) * (size_t)(T * 8)), *i2 = malloc(sizeof(int32_t) * (size_t)(T * 8));
    float *w1 = malloc(sizeof(float) * (size_t)(T * 8)), *w2 = malloc(sizeof(float) * (size_t)(T * 8));
    mlaf_rng r;
    mlaf_rng_seed(&r, 99);
    mlaf_fill_normal(&r, lg, MLAF_F32, (size_t)(T * E), 0.0, 2.0);
    mlaf_fill_normal(&r, bias, MLAF_F32, (size_t)E, 0.0, 0.3);
    char why[256] = "";
    mlaf_context_set_threads(ctx, 1);
    int ok = !run_direct(ctx, &p, E, T, MLAF_F32, lg, bias, i1, w1, why, sizeof why);
    mlaf_context_set_threads(ctx, 3);
    ok = ok && !run_direct(ctx, &p, E, T, MLAF_F32, lg, bias, i2, w2, why, sizeof why);
    mlaf_context_set_threads(ctx, 0);
    ok = ok && memcmp(i1, i2, sizeof(int32_t) * (size_t)(T * 8)) == 0 &&
         memcmp(w1, w2, sizeof(float) * (size_t)(T * 8)) == 0;
    tl_case(ok, "MOE_GATE(threads=1 vs 3,bit-identical,backend=cpu)", "%s", why[0] ? why : "differ");
    free(lg), free(bias), free(i1), free(i2), free(w1), free(w2);
}

/* Every CPU instruction-set path this machine has, on a few demanding cases. */
static void test_isas(mlaf_context *ctx) {
    if (mlaf_context_backend(ctx) != MLAF_BACKEND_CPU) return;
    for (int isa = MLAF_CPU_ISA_SCALAR; isa < MLAF_CPU_ISA_COUNT_; isa++) {
        if (mlaf_context_set_cpu_isa(ctx, (mlaf_cpu_isa)isa) != MLAF_OK) {
            char name[96];
            snprintf(name, sizeof name, "MOE_GATE(isa=%s,backend=cpu)", mlaf_cpu_isa_name((mlaf_cpu_isa)isa));
            tl_skip(name, "not supported by this machine or build");
            continue;
        }
        char label[128];
        const char *in = mlaf_cpu_isa_name((mlaf_cpu_isa)isa);
        mlaf_verify_case c = mlaf_verify_case_default(mlaf_preset_find("deepseek-v3"), MLAF_BF16, 1025, 60);
        c.weight_dtype = MLAF_F32;
        c.nonfinite = 1;
        c.want_scores = 1;
        snprintf(label, sizeof label, "isa=%s,preset=deepseek-v3,nonfinite,scores", in);
        run_case(ctx, label, &c);
        c = mlaf_verify_case_default(mlaf_preset_find("deepseek-v2"), MLAF_F16, 1025, 61);
        c.strided = 1;
        snprintf(label, sizeof label, "isa=%s,preset=deepseek-v2,strided", in);
        run_case(ctx, label, &c);
        c = custom(2048, 64, 64, 16, MLAF_SCORE_SOFTMAX, MLAF_GROUP_TOP2_SUM, 1, MLAF_F32, 200, 62);
        snprintf(label, sizeof label, "isa=%s,E=2048,groups=64/16,top_k=64", in);
        run_case(ctx, label, &c);
        c = mlaf_verify_case_default(mlaf_preset_find("deepseek-v4-flash"), MLAF_BF16, 1025, 63);
        c.weight_dtype = MLAF_F32;
        c.moe_wide = c.nonfinite = c.want_scores = 1;
        snprintf(label, sizeof label, "isa=%s,preset=deepseek-v4-flash,wide,nonfinite,scores", in);
        run_case(ctx, label, &c);
    }
    mlaf_context_set_cpu_isa(ctx, MLAF_CPU_ISA_AUTO);
}

/* ---- the per-token check mlafuse bench uses (mlaf_ref_moe_gate_check_token) ------------ *
 * One token, 4 groups of 2 experts, one group kept, top_k = 2: groups 1 and 2 have scores
 * within a near-tie (docs/conventions.md), so either group's pair is right, in c order; anything else is not.
 * With the tie broken, only the oracle's group is. Host only (the oracle). */
static void test_oracle_check(void) {
    const double s23 = 1.0 / (1.0 + exp(-1.0)) + 1.0 / (1.0 + exp(-0.5));
    const double s4 = 1.0 / (1.0 + exp(-0.9));
    float x[8] = {-3.0f, -4.0f, 1.0f, 0.5f, 0.9f, 0.0f, -5.0f, -5.0f};
    x[5] = (float)-log(1.0 / (s23 - s4) - 1.0); /* sigma(x5) = the rest of group 1's score */
    mlaf_moe_gate_job j;
    memset(&j, 0, sizeof j);
    j.T = 1, j.E = 8, j.top_k = 2, j.n_group = 4, j.topk_group = 1, j.n_shared = 0, j.K = 2;
    j.score_func = MLAF_SCORE_SIGMOID, j.group_score = MLAF_GROUP_TOP2_SUM;
    j.logits = x, j.logits_dt = MLAF_F32, j.logits_stride = 8;
    static const struct {
        int32_t ids[2];
        int ok;
    } tied[] = {{{2, 3}, 1}, {{4, 5}, 1}, {{3, 2}, 0}, {{2, 4}, 0}, {{6, 7}, 0}, {{2, 2}, 0}};
    char why[200], name[128];
    for (size_t i = 0; i < sizeof tied / sizeof tied[0]; i++) {
        const char *bad = mlaf_ref_moe_gate_check_token(&j, 0, tied[i].ids, why, sizeof why);
        snprintf(name, sizeof name, "MOE_GATE(oracle check,group near-tie,ids=%d %d)", (int)tied[i].ids[0],
                 (int)tied[i].ids[1]);
        tl_case((bad == NULL) == tied[i].ok, name, "%s", bad ? bad : "accepted");
    }
    x[5] -= 0.01f; /* group 2 now clearly below group 1 */
    const int32_t g1[2] = {2, 3}, g2[2] = {4, 5};
    tl_case(mlaf_ref_moe_gate_check_token(&j, 0, g1, why, sizeof why) == NULL,
            "MOE_GATE(oracle check,tie broken,the oracle's group)", "%s", why);
    tl_case(mlaf_ref_moe_gate_check_token(&j, 0, g2, why, sizeof why) != NULL,
            "MOE_GATE(oracle check,tie broken,the other group)", "accepted");
}

/* mlaf_fill_normal_rows (the verify's logits, filled by all threads) gives the bytes one
 * mlaf_fill_normal per row would, leaves the padding between rows alone and ends the
 * generator where those calls end it. Host only. */
static void test_fill_rows(void) {
    const mlaf_dtype dts[2] = {MLAF_F32, MLAF_BF16};
    for (int d = 0; d < 2; d++) {
        const int64_t rows = 301, n = 37, stride = 41;
        const size_t es = mlaf_dtype_size(dts[d]), bytes = (size_t)(rows * stride) * es;
        unsigned char *a = (unsigned char *)malloc(bytes), *b = (unsigned char *)malloc(bytes);
        if (!a || !b) {
            free(a), free(b);
            tl_case(0, "MOE_GATE(verify rows,alloc)", "out of memory");
            return;
        }
        memset(a, 0x5A, bytes);
        memset(b, 0x5A, bytes);
        mlaf_rng ra, rb;
        mlaf_rng_seed(&ra, 11);
        mlaf_rng_seed(&rb, 11);
        for (int64_t t = 0; t < rows; t++)
            mlaf_fill_normal(&ra, a + (size_t)(t * stride) * es, dts[d], (size_t)n, 0.0, 2.0);
        mlaf_fill_normal_rows(&rb, b, dts[d], rows, (size_t)n, stride, 0.0, 2.0);
        char name[96];
        snprintf(name, sizeof name, "MOE_GATE(verify rows,%s,threaded fill = per-row fill)",
                 mlaf_dtype_name(dts[d]));
        tl_case(memcmp(a, b, bytes) == 0 && mlaf_rng_u64(&ra) == mlaf_rng_u64(&rb), name,
                "bytes or generator state differ");
        free(a), free(b);
    }
}

int main(int argc, char **argv) {
    /* optional filter: presets, shapes, ties, misuse, threads or isas */
    const char *only = argc > 1 ? argv[1] : NULL;
    if (!only || strstr("ties", only)) test_oracle_check();
    if (!only || strstr("ties", only)) test_fill_rows();
    mlaf_backend bs[MLAF_BACKEND_COUNT_];
    int nb = tl_backends(bs);
    for (int i = 0; i < nb; i++) {
        bname = mlaf_backend_name(bs[i]);
        mlaf_context *ctx = tl_context(bs[i]);
        if (!ctx) continue;
        if (!only || strstr("presets", only)) test_presets(ctx);
        if (!only || strstr("shapes", only)) test_shapes(ctx);
        if (!only || strstr("ties", only)) test_ties(ctx);
        if (!only || strstr("misuse", only)) test_misuse(ctx);
        if (!only || strstr("threads", only)) test_threads(ctx);
        if (!only || strstr("isas", only)) test_isas(ctx);
        mlaf_context_free(ctx);
    }
    return tl_finish();
}
