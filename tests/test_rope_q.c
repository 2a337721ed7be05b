/*
 * test_rope_q.c — rope_q against the float64 oracle on every backend: presets (their heads,
 * nope and rope dims) x dtypes x T x layout (strided q, H > 1, D > R), both styles, i32 / i64
 * positions, rejected positions counted and left unrotated, odd rope widths, D == R,
 * T > 65536, every CPU instruction-set path. The nope columns and the row padding must stay
 * bit-identical (checked by mlaf_verify_rope_q).
 */
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

static const mlaf_dtype DTYPES[3] = {MLAF_F32, MLAF_F16, MLAF_BF16};

static int filtered_out(const char *name) {
    const char *f = getenv("MLAF_TEST_FILTER");
    return f && *f && !strstr(name, f);
}

static void run(mlaf_context *ctx, const mlaf_verify_case *c, const char *extra) {
    char name[256];
    snprintf(name, sizeof name, "ROPE_Q(preset=%s,T=%lld,H=%d,D=%d,dtype=%s,backend=%s,rope=%s,index=%s%s%s%s)",
             c->cfg.name, (long long)c->T, (int)c->cfg.num_heads,
             (int)(c->cfg.qk_nope_head_dim + c->cfg.qk_rope_head_dim), mlaf_dtype_name(c->dtype),
             mlaf_backend_name(mlaf_context_backend(ctx)),
             c->rope_style == MLAF_ROPE_NEOX ? "neox" : "interleaved", mlaf_dtype_name(c->index_dtype),
             c->strided ? ",strided" : "", extra ? "," : "", extra ? extra : "");
    if (filtered_out(name)) return;
    mlaf_verify_result r;
    if (!mlaf_preset_plain_latent(&c->cfg)) {
        tl_skip(name, "DeepSeek-V4's latent (kv_rope_tail > 0): its cases are test_v4_attn's");
        return;
    }
    mlaf_status st = mlaf_verify_rope_q(ctx, c, &r);
    tl_case(st == MLAF_OK && r.passed, name, "%s [%s, worst %.3g units]", r.detail,
            mlaf_status_name(st), r.worst_units);
}

static mlaf_verify_case make(const mlaf_model_config *cfg, int di, int64_t T, int v, uint64_t seed) {
    mlaf_verify_case c = mlaf_verify_case_default(cfg, DTYPES[di], T, seed);
    c.strided = v & 1;
    c.rope_style = (v >> 1) & 1 ? MLAF_ROPE_NEOX : MLAF_ROPE_INTERLEAVED;
    c.index_dtype = (v >> 2) & 1 ? MLAF_I32 : MLAF_I64;
    return c;
}

static void suite(mlaf_context *ctx, int quick, const char *extra) {
    const int64_t Ts[7] = {0, 1, 2, 7, 64, 257, 4096};
    const int nT = quick || extra ? 6 : 7;
    int v = 0;
    for (int pi = 0; pi < mlaf_preset_count(); pi++) {
        const mlaf_model_config *cfg = mlaf_preset_at(pi);
        if (cfg->qk_rope_head_dim == 0 && cfg->kv_rope_tail == 0) { /* NoPE (GLM-5.3-Flash): no q rope */
            char name[160];
            snprintf(name, sizeof name, "ROPE_Q(preset=%s,backend=%s%s%s)", cfg->name,
                     mlaf_backend_name(mlaf_context_backend(ctx)), extra ? "," : "", extra ? extra : "");
            if (!filtered_out(name)) tl_skip(name, "NoPE: rope width 0, the model calls no rope_q (rope_dim 0 is rejected: test_api)");
            continue;
        }
        for (int di = 0; di < 3; di++)
            for (int ti = extra ? 3 : 0; ti < nT; ti++)
                for (int st = 0; st < 2; st++) {
                    /* T = 4096 only where the heads are few (bounded run time) */
                    if (Ts[ti] == 4096 && (cfg->num_heads > 20 || st != di % 2)) continue;
                    if (extra && st != (ti + di) % 2) continue;
                    /* quick runs (sanitizers): many-head presets up to T = 64 */
                    if ((quick || extra) && Ts[ti] > 64 && cfg->num_heads > 20) continue;
                    v++;
                    mlaf_verify_case c = make(cfg, di, Ts[ti], (v & ~1) | st, 0x9e0000u + (uint64_t)(pi * 100 + di * 10 + ti) * 2 + (uint64_t)st);
                    run(ctx, &c, extra);
                }
    }
    /* odd rope widths, D == R, a single head, T > 65536 */
    static const int32_t dims[5][3] = {{3, 2, 5}, {5, 34, 0}, {7, 6, 17}, {1, 64, 0}, {2, 64, 192}};
    for (int k = 0; k < 5; k++)
        for (int di = 0; di < 3; di++)
            for (int s = 0; s < 2; s++) {
                mlaf_model_config cfg = *mlaf_preset_at(0);
                snprintf(cfg.name, sizeof cfg.name, "custom-h%d-r%d-nope%d", dims[k][0], dims[k][1], dims[k][2]);
                cfg.num_heads = dims[k][0], cfg.qk_rope_head_dim = dims[k][1], cfg.qk_nope_head_dim = dims[k][2];
                int64_t T = k == 3 ? (quick || extra ? 0 : 65537) : 99;
                if (k == 3 && (T == 0 || s != di % 2)) continue;
                mlaf_verify_case c = make(&cfg, di, T, s + 2 * ((k + di) % 2) + 4 * (di == 1), 0xab00u + (uint64_t)(k * 10 + di) * 2 + (uint64_t)s);
                c.strided = s;
                run(ctx, &c, extra);
            }
}

int main(void) { return tl_run_suite("ROPE_Q", suite); }
