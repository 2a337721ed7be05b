/*
 * test_mla_kv_cache_formats.c — mla_kv_cache's cache formats through the oracle harness (VERIFY: presets x
 * dtypes x T x block size x layout, on every backend and instruction set), and the harness's
 * decoding bound itself (DECODE_BOUND).
 * The formats and the direct call: mla_kv_cache_fmt_common.h.
 */
#include "mla_kv_cache_fmt_common.h"

static void verify_one(mlaf_context *ctx, const mlaf_verify_case *c, const char *label, const char *tag) {
    char name[384];
    snprintf(name, sizeof name,
             "VERIFY(preset=%s,T=%lld,dtype=%s,backend=%s,cache=%s,%s,bs=%lld,%s%s%s%s%s%s%s%s)", c->cfg.name,
             (long long)c->T, mlaf_dtype_name(c->dtype), mlaf_backend_name(mlaf_context_backend(ctx)), label,
             mlaf_dtype_name(c->cache_dtype),
             (long long)c->block_size, c->strided ? "strided" : "contiguous",
             c->kv_format == MLAF_KV_FP8 ? (c->fp8_scale == 0.0f ? ",scale=fit300" : c->fp8_scale < 0 ? ",scale=fit4000" : ",scale=1") : "",
             c->want_amax ? ",amax_out" : "", c->in_place ? ",in-place" : "",
             c->no_k_pe == 2 ? ",cache-only" : c->no_k_pe == 1 ? ",no-k_pe" : "", c->map_short ? ",short-map" : "",
             tag ? "," : "", tag ? tag : "");
    if (filtered_out(name)) return;
    mlaf_verify_result r;
    mlaf_status st = mlaf_verify_mla_kv_cache(ctx, c, &r);
    tl_case(st == MLAF_OK && r.passed, name, "%s [%s, worst %.3g units]", r.detail, mlaf_status_name(st),
            r.worst_units);
}

static void verify_cases(mlaf_context *ctx, int quick, const char *tag) {
    static const char *presets[3] = {"glm-4.7-flash", "deepseek-v2-lite", "deepseek-v3.2"};
    static const mlaf_dtype dts[3] = {MLAF_BF16, MLAF_F16, MLAF_F32};
    static const int64_t blocks[3] = {1, 16, 64};
    static const float scales[3] = {0.0f, 1.0f, -4000.0f};
    const int64_t Ts[4] = {0, 7, 300, 1031}; /* plus v % 3, but for 1031 */
    const int nT = tag ? 2 : quick ? 3 : 4;
    int v = 0;
    for (int f = 0; f < NFORMATS; f++) {
        const fmt_case *k = &FORMATS[f];
        const int ds = k->format == MLAF_KV_FP8_DS_MLA;
        for (int d = 0; d < (ds ? 1 : 3); d++)
            for (int ti = 0; ti < nT; ti++) {
                if (tag && (ti + f) % 2) continue;
                v++;
                const mlaf_model_config *cfg = mlaf_preset_find(presets[(f + d + ti) % 3]);
                const int64_t T = Ts[ti] + (ti == 3 ? 0 : (int64_t)(v % 3));
                mlaf_verify_case c = mlaf_verify_case_default(cfg, dts[d], T, 0xf0a7000ull + 131u * (uint64_t)v);
                c.kv_format = k->format;
                c.fp8_conv = k->conv;
                c.tile_scale = k->tile;
                c.kpe_separate = k->kpe;
                c.block_size = blocks[v % 3];
                c.strided = v % 2;
                c.rope_style = (v / 2) % 2 ? MLAF_ROPE_NEOX : MLAF_ROPE_INTERLEAVED;
                c.index_dtype = (v / 3) % 2 ? MLAF_I32 : MLAF_I64;
                if (k->format == MLAF_KV_PLAIN) {
                    c.cache_dtype = dts[(d + v) % 3];
                } else {
                    c.cache_dtype = v % 2 ? MLAF_U8 : MLAF_FP8_E4M3;
                    c.fp8_scale = scales[v % 3];
                    c.want_amax = k->format == MLAF_KV_FP8 && v % 4 != 1;
                    c.amax_init = v % 8 == 0 ? 1e9f : 0.25f; /* 1e9: larger than any row, kept */
                    c.in_place = v % 5 == 2;
                    c.no_k_pe = v % 5 == 3 ? 2 : v % 5 == 4 ? 1 : 0;
                }
                c.map_short = v % 4 == 3 ? T / 3 + 1 : 0;
                verify_one(ctx, &c, k->label, tag);
            }
    }
}

/* ---- 6. the harness's decoding bound itself ---------------------------------------------- */

/* mlaf_ref_fp8_decode_check: the converter's byte is always within the bound (or saturated),
 * and a neighbouring byte one e4m3 step away never is, unless y sits near a midpoint. */
static void decode_bound(void) {
    static const float scales[4] = {1.0f, 0.37f, 2.5f, 1.0f / 64};
    int64_t checked = 0, bad = 0;
    char why[200] = "";
    mlaf_rng rng;
    mlaf_rng_seed(&rng, 99);
    for (int si = 0; si < 4; si++)
        for (int conv = 0; conv < 2; conv++)
            for (int n = 0; n < 20000; n++) {
                const float s = scales[si];
                const float x = (float)(ldexp(mlaf_rng_uniform(&rng) * 2 - 1, (int)(mlaf_rng_u64(&rng) % 24) - 12));
                const uint8_t b = mlaf_ref_fp8_quantize(x, s, (mlaf_fp8_conv)conv);
                double ratio;
                const int ok = mlaf_ref_fp8_decode_check(b, x, s, (mlaf_fp8_conv)conv, &ratio);
                if (ok < 0) continue;
                checked++;
                const double y = conv ? (double)x * s : (double)x / s, d = mlaf_e4m3_to_f32(b);
                const int near_mid = fabs(fabs(d - y) - e4m3_bound(y)) < 0.02 * e4m3_bound(y) + 0x1p-12;
                const uint8_t mag = b & 0x7f;
                int nb_ok = 0;
                if (mag > 0 && mag < 0x7e && !near_mid) {
                    double r2;
                    nb_ok = mlaf_ref_fp8_decode_check((uint8_t)(b + 1), x, s, (mlaf_fp8_conv)conv, &r2) == 1 ||
                            mlaf_ref_fp8_decode_check((uint8_t)(b - 1), x, s, (mlaf_fp8_conv)conv, &r2) == 1;
                }
                if (ok != 1 || nb_ok) {
                    if (!bad++)
                        snprintf(why, sizeof why, "x = %.9g, scale %g (%s): byte 0x%02x judged %d, a neighbour %s", x,
                                 s, conv ? "mul" : "div", b, ok, nb_ok ? "accepted" : "rejected");
                }
            }
    tl_case(bad == 0 && checked > 100000, "DECODE_BOUND(half an e4m3 ulp, both conventions)",
            "%lld of %lld wrong: %s", (long long)bad, (long long)checked, why);
}

/* ---- the suite ------------------------------------------------------------------------- */

static void suite(mlaf_context *ctx, int quick, const char *tag) {
    verify_cases(ctx, quick, tag);
}

int main(void) {
    decode_bound();
    return tl_run_suite("KV_FORMATS", suite);
}
