/*
 * test_params.c — parameter edges of the library outside the tensors:
 *  - mlaf_rope_table_init_scaled: every YaRN field and the base past its upper bound (mla.h's
 *    MLAF_YARN_MAX_* / MLAF_ROPE_MAX_BASE: factor 1e308 was accepted and built a table) is
 *    MLAF_ERR_INVALID_ARGUMENT with the table untouched; each bound itself is accepted;
 *    mlaf_rope_table_init's base bound the same;
 *  - rope_q / rope_q_out: a NaN, infinite or negative head_norm_eps rejected whatever head_norm
 *    says (it was accepted with head_norm off), 0 (the default) accepted either way, q untouched
 *    on rejection;
 *  - mlaf_context_set_cuda_pdl: disabling succeeds on every backend (it was
 *    MLAF_ERR_INVALID_ARGUMENT on a CPU context), enabling on a CPU context stays an error.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

/* ---- RoPE tables ----------------------------------------------------------------------- */
enum { MAXP = 8, RD = 16 };

static void table_case(const char *what, const mlaf_rope_scaling *s, double base, mlaf_status want) {
    float tab[MAXP * RD], canary[MAXP * RD];
    for (int i = 0; i < MAXP * RD; i++) tab[i] = canary[i] = (float)(i * 0.25 - 7);
    mlaf_status st = s ? mlaf_rope_table_init_scaled(tab, MAXP, RD, base, s)
                       : mlaf_rope_table_init(tab, MAXP, RD, base);
    int untouched = !memcmp(tab, canary, sizeof tab);
    int finite = 1;
    for (int i = 0; i < MAXP * RD; i++) finite = finite && isfinite(tab[i]);
    char name[200];
    snprintf(name, sizeof name, "ROPE_TABLE(%s,%s)", s ? "yarn" : "plain", what);
    if (want == MLAF_OK)
        tl_case(st == MLAF_OK && finite, name, "status %s (expected MLAF_OK); table %s", mlaf_status_name(st),
                finite ? "finite" : "has a non-finite value");
    else
        tl_case(st == want && untouched, name, "status %s (expected %s); table %s", mlaf_status_name(st),
                mlaf_status_name(want), untouched ? "untouched" : "written");
}

static void table_cases(void) {
    const mlaf_rope_scaling y = mlaf_rope_scaling_yarn(40.0, 4096);
    mlaf_rope_scaling s;
    table_case("DeepSeek-V3 yarn", &y, 10000.0, MLAF_OK);
    /* past each bound: rejected */
    s = y, s.factor = 1e308;
    table_case("factor=1e308", &s, 10000.0, MLAF_ERR_INVALID_ARGUMENT);
    s = y, s.factor = 2e6;
    table_case("factor=2e6", &s, 10000.0, MLAF_ERR_INVALID_ARGUMENT);
    s = y, s.original_max_position_embeddings = (int64_t)1 << 31;
    table_case("original=2^31", &s, 10000.0, MLAF_ERR_INVALID_ARGUMENT);
    s = y, s.original_max_position_embeddings = INT64_MAX;
    table_case("original=INT64_MAX", &s, 10000.0, MLAF_ERR_INVALID_ARGUMENT);
    s = y, s.beta_fast = 1e300;
    table_case("beta_fast=1e300", &s, 10000.0, MLAF_ERR_INVALID_ARGUMENT);
    s = y, s.beta_slow = 1001;
    table_case("beta_slow=1001", &s, 10000.0, MLAF_ERR_INVALID_ARGUMENT);
    s = y, s.mscale = 1e200;
    table_case("mscale=1e200", &s, 10000.0, MLAF_ERR_INVALID_ARGUMENT);
    s = y, s.mscale_all_dim = 101;
    table_case("mscale_all_dim=101", &s, 10000.0, MLAF_ERR_INVALID_ARGUMENT);
    s = y, s.attention_factor = 1e9;
    table_case("attention_factor=1e9", &s, 10000.0, MLAF_ERR_INVALID_ARGUMENT);
    table_case("base=1e13", &y, 1e13, MLAF_ERR_INVALID_ARGUMENT);
    table_case("base=1e300", NULL, 1e300, MLAF_ERR_INVALID_ARGUMENT);
    table_case("base=1e13", NULL, 1e13, MLAF_ERR_INVALID_ARGUMENT);
    /* each bound itself: accepted */
    s = y, s.factor = MLAF_YARN_MAX_FACTOR;
    table_case("factor=1e6", &s, 10000.0, MLAF_OK);
    s = y, s.original_max_position_embeddings = MLAF_YARN_MAX_ORIGINAL;
    table_case("original=2^31-1", &s, 10000.0, MLAF_OK);
    s = y, s.beta_fast = s.beta_slow = MLAF_YARN_MAX_BETA;
    table_case("betas=1000", &s, 10000.0, MLAF_OK);
    s = y, s.mscale = s.mscale_all_dim = MLAF_YARN_MAX_MSCALE;
    table_case("mscales=100", &s, 10000.0, MLAF_OK);
    s = y, s.attention_factor = MLAF_YARN_MAX_MSCALE;
    table_case("attention_factor=100", &s, 10000.0, MLAF_OK);
    table_case("base=1e12", &y, MLAF_ROPE_MAX_BASE, MLAF_OK);
    table_case("base=1e12", NULL, MLAF_ROPE_MAX_BASE, MLAF_OK);
    /* the attention factor of an out-of-range scaling is NaN, as documented */
    s = y, s.factor = 1e308;
    tl_case(isnan(mlaf_rope_scaling_attention_factor(&s)), "ROPE_TABLE(yarn,attention factor of factor=1e308 is NaN)",
            "got %g", mlaf_rope_scaling_attention_factor(&s));
}

/* ---- rope_q's head_norm_eps ------------------------------------------------------------- */
enum { T = 3, H = 2, D = 32, R = 16 };

static void eps_cases(mlaf_context *ctx) {
    const char *be = mlaf_backend_name(mlaf_context_backend(ctx));
    mlaf_rng rng;
    mlaf_rng_seed(&rng, 7);
    unsigned char qinit[T * H * D * 2], cs[MAXP * R * 4], pos[T * 8];
    mlaf_fill_normal(&rng, qinit, MLAF_BF16, T * H * D, 0, 1);
    mlaf_rope_table_init((float *)cs, MAXP, R, 10000.0);
    for (int t = 0; t < T; t++) ((int64_t *)pos)[t] = t;
    mlaf_gbuf gq, gq2, gc, gp;
    memset(&gq, 0, sizeof gq), memset(&gq2, 0, sizeof gq2), memset(&gc, 0, sizeof gc), memset(&gp, 0, sizeof gp);
    if (mlaf_gbuf_alloc(&gq, mlaf_context_backend(ctx), sizeof qinit, qinit, 0) != MLAF_OK ||
        mlaf_gbuf_alloc(&gq2, mlaf_context_backend(ctx), sizeof qinit, qinit, 0) != MLAF_OK ||
        mlaf_gbuf_alloc(&gc, mlaf_context_backend(ctx), sizeof cs, cs, 0) != MLAF_OK ||
        mlaf_gbuf_alloc(&gp, mlaf_context_backend(ctx), sizeof pos, pos, 0) != MLAF_OK) {
        tl_case(0, "ROPE_Q(head_norm_eps,setup)", "buffer allocation failed");
        goto done;
    }
    mlaf_tensor q = mlaf_tensor_3d(gq.ptr, MLAF_BF16, T, H, D, H * D, D);
    mlaf_tensor q_out = mlaf_tensor_3d(gq2.ptr, MLAF_BF16, T, H, D, H * D, D);
    mlaf_tensor P = mlaf_tensor_1d(gp.ptr, MLAF_I64, T);
    mlaf_tensor C = mlaf_tensor_2d(gc.ptr, MLAF_F32, MAXP, R, R);
    static const float bad[4] = {NAN, INFINITY, -INFINITY, -1e-6f};
    static const char *const bad_names[4] = {"nan", "inf", "-inf", "-1e-06"};
    for (int hn = 0; hn < 2; hn++)
        for (int out = 0; out < 2; out++)
            for (int k = 0; k < 4; k++) {
                mlaf_rope_params p = {R, MLAF_ROPE_INTERLEAVED, hn, bad[k]};
                mlaf_status st = out ? mlaf_rope_q_out(ctx, &p, &q, &P, &C, &q_out, NULL)
                                     : mlaf_rope_q(ctx, &p, &q, &P, &C, NULL);
                mlaf_context_sync(ctx);
                const char *msg = mlaf_context_last_error(ctx);
                int untouched = mlaf_gbuf_download(&gq) == MLAF_OK && mlaf_gbuf_equals(&gq, qinit) &&
                                mlaf_gbuf_download(&gq2) == MLAF_OK && mlaf_gbuf_equals(&gq2, qinit);
                char name[160];
                snprintf(name, sizeof name, "ROPE_Q(%s,head_norm=%d,head_norm_eps=%s,backend=%s)",
                         out ? "rope_q_out" : "rope_q", hn, bad_names[k], be);
                tl_case(st == MLAF_ERR_INVALID_ARGUMENT && strstr(msg, "head_norm_eps = ") && untouched, name,
                        "status %s (expected MLAF_ERR_INVALID_ARGUMENT); message \"%s\"; q %s",
                        mlaf_status_name(st), msg, untouched ? "untouched" : "written");
                /* the next case starts from the initial q and q_out again */
                memcpy(gq.body, qinit, sizeof qinit), memcpy(gq2.body, qinit, sizeof qinit);
                mlaf_gbuf_upload(&gq), mlaf_gbuf_upload(&gq2);
            }
    for (int hn = 0; hn < 2; hn++) {
        mlaf_rope_params p = {R, MLAF_ROPE_INTERLEAVED, hn, 0.0f}; /* 0: the default 1e-6 */
        mlaf_status st = mlaf_rope_q_out(ctx, &p, &q, &P, &C, &q_out, NULL);
        mlaf_context_sync(ctx);
        char name[160];
        snprintf(name, sizeof name, "ROPE_Q(rope_q_out,head_norm=%d,head_norm_eps=0 (default),backend=%s)", hn, be);
        tl_case(st == MLAF_OK, name, "status %s (expected MLAF_OK); message \"%s\"", mlaf_status_name(st),
                mlaf_context_last_error(ctx));
    }
done:
    mlaf_gbuf_free(&gq);
    mlaf_gbuf_free(&gq2);
    mlaf_gbuf_free(&gc);
    mlaf_gbuf_free(&gp);
}

/* ---- programmatic dependent launch ------------------------------------------------------- */
static void pdl_cases(mlaf_context *ctx) {
    mlaf_backend b = mlaf_context_backend(ctx);
    char name[160];
    mlaf_status st = mlaf_context_set_cuda_pdl(ctx, 0);
    snprintf(name, sizeof name, "CONTEXT(set_cuda_pdl(0),backend=%s)", mlaf_backend_name(b));
    tl_case(st == MLAF_OK && mlaf_context_cuda_pdl(ctx) == 0 && !mlaf_context_last_error(ctx)[0], name,
            "status %s (expected MLAF_OK: disabling is a no-op on any backend); pdl %d; message \"%s\"",
            mlaf_status_name(st), mlaf_context_cuda_pdl(ctx), mlaf_context_last_error(ctx));
    if (b != MLAF_BACKEND_CPU) return; /* enabling on CUDA depends on the device: test_api's */
    st = mlaf_context_set_cuda_pdl(ctx, 1);
    snprintf(name, sizeof name, "CONTEXT(set_cuda_pdl(1),backend=%s)", mlaf_backend_name(b));
    tl_case(st == MLAF_ERR_INVALID_ARGUMENT && mlaf_context_cuda_pdl(ctx) == 0 &&
                strstr(mlaf_context_last_error(ctx), "set_cuda_pdl on a cpu context"),
            name, "status %s (expected MLAF_ERR_INVALID_ARGUMENT); pdl %d; message \"%s\"", mlaf_status_name(st),
            mlaf_context_cuda_pdl(ctx), mlaf_context_last_error(ctx));
    st = mlaf_context_set_cuda_pdl(ctx, 0);
    snprintf(name, sizeof name, "CONTEXT(set_cuda_pdl(0) after a rejected enable,backend=%s)", mlaf_backend_name(b));
    tl_case(st == MLAF_OK && !mlaf_context_last_error(ctx)[0], name, "status %s; message \"%s\"",
            mlaf_status_name(st), mlaf_context_last_error(ctx));
    st = mlaf_context_set_cuda_pdl(NULL, 0);
    tl_case(st == MLAF_ERR_NULL_POINTER, "CONTEXT(set_cuda_pdl(NULL, 0))", "status %s (expected MLAF_ERR_NULL_POINTER)",
            mlaf_status_name(st));
}

int main(void) {
    table_cases();
    mlaf_backend bs[MLAF_BACKEND_COUNT_];
    int nb = tl_backends(bs);
    for (int i = 0; i < nb; i++) {
        mlaf_context *ctx = tl_context(bs[i]);
        if (!ctx) continue;
        eps_cases(ctx);
        pdl_cases(ctx);
        mlaf_context_free(ctx);
    }
    return tl_finish();
}
