/*
 * test_verify.c — the verify harness checked against outputs known to be wrong.
 *
 * Every op's check runs its tokens on all threads and reports the first failing token. Here
 * each check gets a correct run with values altered afterwards (mlaf_verify_case.corrupt_from:
 * one token, then every 500th after it, so several chunks fail on different threads): the
 * check must fail, name the first altered token, and pass the same case unaltered (for the fp8
 * cache formats the altered value is a byte of the token's cache record). CPU backend
 * only; the harness code is the same for every backend.
 */
#include <stdio.h>
#include <string.h>

#include "testlib.h"

typedef mlaf_status (*verify_fn)(mlaf_context *, const mlaf_verify_case *, mlaf_verify_result *);

static void expect(mlaf_context *ctx, const char *op, verify_fn fn, mlaf_verify_case c,
                   int64_t bad_t, const char *needle_fmt) {
    char name[160], needle[64];
    mlaf_verify_result r;
    snprintf(name, sizeof name, "VERIFY(%s,preset=%s,T=%lld,dtype=%s,unaltered passes)", op,
             c.cfg.name, (long long)c.T, mlaf_dtype_name(c.dtype));
    mlaf_status st = fn(ctx, &c, &r);
    tl_case(st == MLAF_OK && r.passed, name, "%s [%s]", r.detail, mlaf_status_name(st));

    c.corrupt_from = bad_t + 1;
    snprintf(needle, sizeof needle, needle_fmt, (long long)bad_t);
    snprintf(name, sizeof name, "VERIFY(%s,preset=%s,T=%lld,dtype=%s,altered from t=%lld fails there)",
             op, c.cfg.name, (long long)c.T, mlaf_dtype_name(c.dtype), (long long)bad_t);
    st = fn(ctx, &c, &r);
    tl_case(st == MLAF_OK && !r.passed && strstr(r.detail, needle) != NULL, name,
            "passed=%d, detail \"%s\" (wanted \"%s\") [%s]", r.passed, r.detail, needle,
            mlaf_status_name(st));
}

int main(void) {
    mlaf_context *ctx = tl_context(MLAF_BACKEND_CPU);
    if (!ctx) return tl_finish();
    const mlaf_model_config *glm = mlaf_preset_find("glm-4.7-flash");
    const mlaf_model_config *dsv3 = mlaf_preset_find("deepseek-v3");
    const mlaf_model_config *lite = mlaf_preset_find("deepseek-v2-lite");
    if (!glm || !dsv3 || !lite) {
        tl_case(0, "VERIFY(presets)", "a preset is missing");
        mlaf_context_free(ctx);
        return tl_finish();
    }
    /* T = 4099: 17 chunks of the norm checks; the altered tokens sit in chunks 4, 6, 8 ... */
    expect(ctx, "split_qk_norm", mlaf_verify_split_qk_norm,
           mlaf_verify_case_default(glm, MLAF_BF16, 4099, 3), 1234, "[t=%lld,");
    /* no q part: k_nope is the value altered */
    expect(ctx, "split_qk_norm", mlaf_verify_split_qk_norm,
           mlaf_verify_case_default(lite, MLAF_F32, 4099, 4), 777, "[t=%lld,");
    expect(ctx, "mla_kv_cache", mlaf_verify_mla_kv_cache,
           mlaf_verify_case_default(dsv3, MLAF_BF16, 4099, 5), 1234, "[t=%lld,");
    {
        /* the fp8 formats: a record byte altered; t = 1235 writes a cache row (a valid slot and
         * position) */
        mlaf_verify_case c = mlaf_verify_case_default(glm, MLAF_BF16, 4099, 8);
        c.kv_format = MLAF_KV_FP8;
        c.want_amax = 1;
        expect(ctx, "mla_kv_cache,cache=fp8", mlaf_verify_mla_kv_cache, c, 1235, "[t=%lld,");
        c = mlaf_verify_case_default(dsv3, MLAF_BF16, 4099, 9);
        c.kv_format = MLAF_KV_FP8_DS_MLA;
        c.tile_scale = MLAF_TILE_UE8M0;
        c.block_size = 64;
        expect(ctx, "mla_kv_cache,cache=fp8_ds_mla", mlaf_verify_mla_kv_cache, c, 1235, "[t=%lld,");
    }
    {
        mlaf_verify_case c = mlaf_verify_case_default(glm, MLAF_F16, 1500, 6);
        c.strided = 1;
        expect(ctx, "rope_q", mlaf_verify_rope_q, c, 433, "[t=%lld,");
    }
    expect(ctx, "moe_gate", mlaf_verify_moe_gate,
           mlaf_verify_case_default(dsv3, MLAF_F32, 4099, 7), 2049, "token %lld:");
    {
        /* the DeepSeek-V4 router: sqrt_softplus top-k, and hash routing with bad rows */
        const mlaf_model_config *v4 = mlaf_preset_find("deepseek-v4-flash");
        mlaf_verify_case c = mlaf_verify_case_default(v4, MLAF_BF16, 3001, 10);
        c.weight_dtype = MLAF_F32;
        c.moe_wide = 1;
        expect(ctx, "moe_gate,sqrt_softplus", mlaf_verify_moe_gate, c, 1500, "token %lld:");
        c.moe_hash = 2;
        c.strided = 1;
        expect(ctx, "moe_gate_hash", mlaf_verify_moe_gate, c, 1500, "token %lld:");
    }
    {
        /* indexer_q: byte 0 of a head altered by one e4m3 step; with the f32 scale several
         * neighbouring scales fold to the same w_out and the check tries each of them */
        const mlaf_model_config *g5 = mlaf_preset_find("glm-5");
        mlaf_verify_case c = mlaf_verify_case_default(g5, MLAF_BF16, 1200, 11);
        c.strided = 1;
        c.index_style = g5->index_rope_style;
        c.index_scale = MLAF_INDEX_SCALE_UE8M0;
        expect(ctx, "indexer_q,scale=ue8m0", mlaf_verify_indexer_q, c, 601, "[t=%lld,");
        c.dtype = c.weight_dtype = MLAF_F32;
        c.index_scale = MLAF_INDEX_SCALE_F32;
        expect(ctx, "indexer_q,scale=f32", mlaf_verify_indexer_q, c, 601, "[t=%lld,");
    }
    {
        /* rms_norm_quant: y altered (its q bytes then differ too: y's own line comes first), and,
         * for a q-only case, a value byte (judged from the dense-only call's row) */
        mlaf_verify_case c = mlaf_verify_case_default(glm, MLAF_BF16, 2100, 12);
        c.hidden = 2048;
        c.q_format = MLAF_GEMM_FP8_1X128_MN;
        c.q_scale = MLAF_GEMM_SCALE_UE8M0;
        c.residual = 1;
        expect(ctx, "rms_norm_quant", mlaf_verify_rms_norm_quant, c, 1234, "y[t=%lld,");
        c.no_dense = 1;
        c.q_format = MLAF_GEMM_MXFP8;
        c.q_scale = MLAF_GEMM_SCALE_MX_FLOOR;
        expect(ctx, "rms_norm_quant,q_only", mlaf_verify_rms_norm_quant, c, 1234, "q.data[t=%lld,");
    }
    mlaf_context_free(ctx);
    return tl_finish();
}
