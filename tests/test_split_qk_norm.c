/*
 * test_split_qk_norm.c — split_qk_norm against the float64 oracle on every backend: every
 * preset x dtype x T x layout, weights in f32, the named NO_Q_LORA and
 * IN_PLACE_CONTEXT_PARALLEL cases, k_pe omitted, odd widths (vector tails, weights too wide
 * for the per-thread scratch), separate eps, T > 65536 (also in place and without k_pe: the
 * CUDA backend's staged path on sm_90), every CPU instruction-set path.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../src/half.h"
#include "testlib.h"

static const mlaf_dtype DTYPES[3] = {MLAF_F32, MLAF_F16, MLAF_BF16};

/* MLAF_TEST_FILTER=substring runs only the cases whose name contains it. */
static int filtered_out(const char *name) {
    const char *f = getenv("MLAF_TEST_FILTER");
    return f && *f && !strstr(name, f);
}

static void run(mlaf_context *ctx, const char *tag, const mlaf_verify_case *c, const char *extra) {
    mlaf_verify_result r;
    char name[256];
    snprintf(name, sizeof name, "%s(preset=%s,T=%lld,dtype=%s,backend=%s%s%s%s%s%s%s)", tag,
             c->cfg.name, (long long)c->T, mlaf_dtype_name(c->dtype),
             mlaf_backend_name(mlaf_context_backend(ctx)),
             c->weight_dtype != c->dtype ? ",w=f32" : "", c->strided ? ",strided" : "",
             c->in_place ? ",in_place" : "", c->no_k_pe ? ",no_k_pe" : "", extra ? "," : "",
             extra ? extra : "");
    if (filtered_out(name)) return;
    if (!mlaf_preset_plain_latent(&c->cfg)) {
        tl_skip(name, "DeepSeek-V4's latent (kv_rope_tail > 0): its cases are test_v4_attn's");
        return;
    }
    mlaf_status st = mlaf_verify_split_qk_norm(ctx, c, &r);
    tl_case(st == MLAF_OK && r.passed, name, "%s [%s, worst %.3g units]", r.detail,
            mlaf_status_name(st), r.worst_units);
}

static uint64_t seed_of(int a, int b, int64_t c, int d) {
    return 0x5eed0000ull + (uint64_t)a * 1000003u + (uint64_t)b * 10007u + (uint64_t)c * 31u + (uint64_t)d;
}

/* eps_q and eps_kv separately: rows small enough that eps decides much of the scale. The
 * result must match the oracle with (eps_q, eps_kv) and must not match it with either eps
 * used for both norms. */
static void separate_eps(mlaf_context *ctx) {
    const mlaf_backend be = mlaf_context_backend(ctx);
    const int32_t Q = 64, C = 48, R = 8, W = Q + C + R;
    const int64_t T = 9;
    const float eps_q = 1e-6f, eps_kv = 1e-3f;
    uint16_t lat[9 * 120];
    float w[64 + 48];
    mlaf_rng rng;
    mlaf_rng_seed(&rng, 77);
    mlaf_fill_normal(&rng, lat, MLAF_BF16, (size_t)(T * W), 0.0, 0.02);
    mlaf_fill_normal(&rng, w, MLAF_F32, (size_t)(Q + C), 1.0, 0.2);
    mlaf_gbuf gl, gwq, gwk, gq, gk;
    int ok = mlaf_gbuf_alloc(&gl, be, sizeof lat, lat, 0) == MLAF_OK &&
             mlaf_gbuf_alloc(&gwq, be, Q * 4, w, 0) == MLAF_OK &&
             mlaf_gbuf_alloc(&gwk, be, C * 4, w + Q, 0) == MLAF_OK &&
             mlaf_gbuf_alloc(&gq, be, (size_t)(T * Q) * 2, NULL, 0) == MLAF_OK &&
             mlaf_gbuf_alloc(&gk, be, (size_t)(T * C) * 2, NULL, 0) == MLAF_OK;
    char name[128];
    snprintf(name, sizeof name, "SPLIT_QK_NORM(separate_eps,eps_q=1e-6,eps_kv=1e-3,backend=%s)",
             mlaf_backend_name(be));
    if (!ok) {
        tl_case(0, name, "allocation failed");
        return;
    }
    mlaf_split_qk_norm_params p = {Q, C, R, eps_q, eps_kv};
    mlaf_tensor tl = mlaf_tensor_2d(gl.ptr, MLAF_BF16, T, W, W);
    mlaf_tensor twq = mlaf_tensor_1d(gwq.ptr, MLAF_F32, Q), twk = mlaf_tensor_1d(gwk.ptr, MLAF_F32, C);
    mlaf_tensor tq = mlaf_tensor_2d(gq.ptr, MLAF_BF16, T, Q, Q), tk = mlaf_tensor_2d(gk.ptr, MLAF_BF16, T, C, C);
    mlaf_status st = mlaf_split_qk_norm(ctx, &p, &tl, &twq, &twk, &tq, &tk, NULL);
    if (st == MLAF_OK) st = mlaf_context_sync(ctx);
    if (st == MLAF_OK) st = mlaf_gbuf_download(&gq);
    if (st == MLAF_OK) st = mlaf_gbuf_download(&gk);
    /* worst units against the oracle for three eps choices */
    double worst[3][2] = {{0}};
    const float eq[3] = {eps_q, eps_q, eps_kv}, ek[3] = {eps_kv, eps_q, eps_kv};
    for (int v = 0; v < 3 && st == MLAF_OK; v++) {
        mlaf_norm_job j;
        memset(&j, 0, sizeof j);
        j.T = T, j.Q = Q, j.C = C, j.R = R, j.eps_q = eq[v], j.eps_kv = ek[v], j.dt = MLAF_BF16;
        j.latent = lat, j.latent_stride = W, j.w_q = w, j.w_q_dt = MLAF_F32, j.w_kv = w + Q;
        j.w_kv_dt = MLAF_F32;
        double rq[9 * 64], rk[9 * 48];
        mlaf_ref_split_qk_norm(&j, rq, rk, NULL);
        for (int64_t i = 0; i < T * Q; i++) {
            double u = mlaf_err_units(mlaf_load_f32(gq.body, MLAF_BF16, i), rq[i], MLAF_BF16, rq[i]);
            if (u > worst[v][0]) worst[v][0] = u;
        }
        for (int64_t i = 0; i < T * C; i++) {
            double u = mlaf_err_units(mlaf_load_f32(gk.body, MLAF_BF16, i), rk[i], MLAF_BF16, rk[i]);
            if (u > worst[v][1]) worst[v][1] = u;
        }
    }
    tl_case(st == MLAF_OK && worst[0][0] <= 1 && worst[0][1] <= 1 && worst[1][1] > 1 &&
                worst[2][0] > 1 && mlaf_gbuf_guards_ok(&gq) && mlaf_gbuf_guards_ok(&gk),
            name,
            "%s; worst units: (eps_q, eps_kv) %.3g/%.3g, eps_q for both: k_nope %.3g (must be > 1), "
            "eps_kv for both: q %.3g (must be > 1)",
            mlaf_status_name(st), worst[0][0], worst[0][1], worst[1][1], worst[2][0]);
    mlaf_gbuf_free(&gl);
    mlaf_gbuf_free(&gwq);
    mlaf_gbuf_free(&gwk);
    mlaf_gbuf_free(&gq);
    mlaf_gbuf_free(&gk);
}

static void suite(mlaf_context *ctx, int quick) {
    const int64_t Ts[8] = {0, 1, 2, 7, 64, 257, 4096, 65537};
    const int nT = quick ? 6 : 8;
    /* 1. the sweep: presets x dtypes x T x layout */
    for (int pi = 0; pi < mlaf_preset_count(); pi++)
        for (int di = 0; di < 3; di++)
            for (int ti = 0; ti < nT; ti++)
                for (int st = 0; st < 2; st++) {
                    /* Bounding the run time: T = 4096 in one layout per (preset, dtype),
                     * T > 65536 once per dtype (the 64-bit / no-65536-cliff cases). */
                    if (Ts[ti] == 4096 && st != (pi + di) % 2) continue;
                    if (Ts[ti] > 65536 && (pi != (di == 0 ? 4 : di == 1 ? 1 : 0) || st != di % 2))
                        continue;
                    mlaf_verify_case c = mlaf_verify_case_default(mlaf_preset_at(pi), DTYPES[di],
                                                                  Ts[ti], seed_of(pi, di, Ts[ti], st));
                    c.strided = st;
                    run(ctx, "SPLIT_QK_NORM", &c, NULL);
                }
    /* 2. weights in f32 with f16 / bf16 activations */
    for (int pi = 0; pi < mlaf_preset_count(); pi++)
        for (int di = 1; di < 3; di++)
            for (int st = 0; st < 2; st++) {
                mlaf_verify_case c = mlaf_verify_case_default(mlaf_preset_at(pi), DTYPES[di], 257,
                                                              seed_of(pi, di, 9, st));
                c.weight_dtype = MLAF_F32;
                c.strided = st;
                run(ctx, "SPLIT_QK_NORM", &c, NULL);
            }
    /* 3. no q LoRA (deepseek-v2-lite: the latent is the kv-a projection alone) */
    const mlaf_model_config *lite = mlaf_preset_find("deepseek-v2-lite");
    for (int di = 0; di < 3; di++)
        for (int ti = 1; ti < nT - 1; ti++) {
            mlaf_verify_case c = mlaf_verify_case_default(lite, DTYPES[di], Ts[ti], seed_of(3, di, ti, 5));
            c.strided = ti % 2;
            c.in_place = ti == 3;
            run(ctx, "NO_Q_LORA", &c, NULL);
        }
    /* 4. in place: the latent becomes [q_norm | k_nope_norm | k_pe] */
    for (int pi = 0; pi < mlaf_preset_count(); pi++)
        for (int di = 0; di < 3; di++)
            for (int st = 0; st < 2; st++) {
                mlaf_verify_case c = mlaf_verify_case_default(mlaf_preset_at(pi), DTYPES[di],
                                                              st ? 257 : 64, seed_of(pi, di, 11, st));
                c.strided = st;
                c.in_place = 1;
                c.no_k_pe = pi == 1 && st; /* also: k_pe left as a view of the latent */
                run(ctx, "IN_PLACE_CONTEXT_PARALLEL", &c, NULL);
            }
    /* 5. k_pe omitted */
    for (int di = 0; di < 3; di++) {
        mlaf_verify_case c = mlaf_verify_case_default(mlaf_preset_at(0), DTYPES[di], 64, seed_of(0, di, 13, 0));
        c.no_k_pe = 1;
        c.strided = di == 1;
        run(ctx, "SPLIT_QK_NORM", &c, NULL);
    }
    /* 6. odd widths: vector tails everywhere; then weights too wide for the per-thread scratch */
    static const int32_t odd[4][3] = {{1, 1, 0}, {67, 131, 10}, {0, 17, 2}, {6000, 3000, 66}};
    for (int k = 0; k < 4; k++)
        for (int di = 0; di < 3; di++) {
            mlaf_model_config cfg = *mlaf_preset_at(0);
            snprintf(cfg.name, sizeof cfg.name, "custom-%d-%d-%d", odd[k][0], odd[k][1], odd[k][2]);
            cfg.q_lora_rank = odd[k][0];
            cfg.kv_lora_rank = odd[k][1];
            cfg.qk_rope_head_dim = odd[k][2];
            mlaf_verify_case c = mlaf_verify_case_default(&cfg, DTYPES[di], k == 3 ? 33 : 257,
                                                          seed_of(k, di, 17, 0));
            c.strided = 1;
            c.in_place = k == 1 && di == 2;
            run(ctx, "SPLIT_QK_NORM", &c, NULL);
        }
    /* 7. large T (on sm_90 the CUDA backend stages rows by bulk copies from 65536 rows): in
     * place; strided rows with k_pe omitted */
    if (!quick) {
        mlaf_verify_case c = mlaf_verify_case_default(mlaf_preset_at(0), MLAF_BF16, 65537, seed_of(0, 2, 19, 0));
        c.in_place = 1;
        run(ctx, "IN_PLACE_CONTEXT_PARALLEL", &c, NULL);
        c = mlaf_verify_case_default(mlaf_preset_at(1), MLAF_BF16, 65537, seed_of(1, 2, 19, 1));
        c.strided = 1;
        c.no_k_pe = 1;
        run(ctx, "SPLIT_QK_NORM", &c, NULL);
    }
    separate_eps(ctx);
}

int main(void) {
    mlaf_backend bes[MLAF_BACKEND_COUNT_];
    int nb = tl_backends(bes);
    int quick = tl_quick();
    for (int bi = 0; bi < nb; bi++) {
        mlaf_context *ctx = tl_context(bes[bi]);
        if (!ctx) continue;
        suite(ctx, quick);
        if (bes[bi] == MLAF_BACKEND_CPU) {
            /* every instruction-set path, forced */
            static const mlaf_cpu_isa isas[3] = {MLAF_CPU_ISA_SCALAR, MLAF_CPU_ISA_AVX2, MLAF_CPU_ISA_AVX512};
            for (int k = 0; k < 3; k++) {
                char tag[64];
                snprintf(tag, sizeof tag, "isa=%s", mlaf_cpu_isa_name(isas[k]));
                if (mlaf_context_set_cpu_isa(ctx, isas[k]) != MLAF_OK) {
                    char name[96];
                    snprintf(name, sizeof name, "SPLIT_QK_NORM(%s,backend=cpu)", tag);
                    tl_skip(name, "this machine or build lacks the instruction set");
                    continue;
                }
                for (int pi = 0; pi < mlaf_preset_count(); pi++)
                    for (int di = 0; di < 3; di++)
                        for (int st = 0; st < 2; st++) {
                            mlaf_verify_case c = mlaf_verify_case_default(
                                mlaf_preset_at(pi), DTYPES[di], st ? 257 : 7, seed_of(pi, di, 19 + k, st));
                            c.strided = st;
                            c.in_place = pi == 2;
                            c.weight_dtype = pi == 4 ? MLAF_F32 : DTYPES[di];
                            run(ctx, "SPLIT_QK_NORM", &c, tag);
                        }
                for (int di = 0; di < 3; di++) {
                    mlaf_model_config cfg = *mlaf_preset_at(0);
                    snprintf(cfg.name, sizeof cfg.name, "custom-67-131-10");
                    cfg.q_lora_rank = 67, cfg.kv_lora_rank = 131, cfg.qk_rope_head_dim = 10;
                    mlaf_verify_case c = mlaf_verify_case_default(&cfg, DTYPES[di], 99, seed_of(9, di, 23 + k, 1));
                    c.strided = 1;
                    run(ctx, "SPLIT_QK_NORM", &c, tag);
                }
            }
            mlaf_context_set_cpu_isa(ctx, MLAF_CPU_ISA_AUTO);
        }
        mlaf_context_free(ctx);
    }
    return tl_finish();
}
