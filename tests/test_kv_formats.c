/*
 * test_kv_formats.c — mla_kv_cache's cache formats (SPEC §9) on every backend: plain with the
 * separate kpe array, fp8 per-tensor (DIV / MUL, amax_out, separate kpe) and fp8_ds_mla (amax /
 * ue8m0 / ue8m0_floor_scaled tile scales).
 *
 *   VERIFY         the oracle harness (mlaf_verify_mla_kv_cache): dense outputs against float64,
 *                  every record byte against the reference encoder applied to the op's own
 *                  dense row, decoding within half an e4m3 ulp, amax_out, canaries; presets x
 *                  dtypes x T x block size x layout, slot_mapping shorter than T
 *   LAYOUT_*       hand-built rows whose bytes are known: the 656-B fp8_ds_mla record (tile
 *                  scales at byte 512, rope bf16 at byte 528) in every tile-scale mode, the
 *                  576-B fp8 record (rope e4m3 at byte 512) in both conventions
 *   DECODE /       a direct call: every written record decoded back (e4m3 x scale, or / for MUL;
 *   SAME_BYTES     x the record's tile scale) within half an e4m3 ulp of the dense row, the
 *                  ds_mla rope part equal to the dense bf16 bits; the cache bytes of the same
 *                  call without the dense outputs identical
 *   REJECT         bad descriptions: the status, a message naming the argument, nothing written
 *   SHORT_MAP      slot_mapping with N < T entries: rows t >= N write no cache row, q is written
 *   DECODE_BOUND   the harness's half-ulp bound accepts the converter's bytes, not their
 *                  neighbours
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fp8.h"
#include "testlib.h"

static int filtered_out(const char *name) {
    const char *f = getenv("MLAF_TEST_FILTER");
    return f && *f && !strstr(name, f);
}

/* ---- 1. through the oracle harness ------------------------------------------------------ */

typedef struct fmt_case {
    const char *label;
    mlaf_kv_format format;
    mlaf_fp8_conv conv;
    mlaf_tile_scale tile;
    int kpe;
} fmt_case;

static const fmt_case FORMATS[] = {
    {"plain,kpe", MLAF_KV_PLAIN, MLAF_FP8_DIV, MLAF_TILE_AMAX, 1},
    {"fp8,div", MLAF_KV_FP8, MLAF_FP8_DIV, MLAF_TILE_AMAX, 0},
    {"fp8,mul", MLAF_KV_FP8, MLAF_FP8_MUL, MLAF_TILE_AMAX, 0},
    {"fp8,div,kpe", MLAF_KV_FP8, MLAF_FP8_DIV, MLAF_TILE_AMAX, 1},
    {"fp8,mul,kpe", MLAF_KV_FP8, MLAF_FP8_MUL, MLAF_TILE_AMAX, 1},
    {"fp8_ds_mla,amax", MLAF_KV_FP8_DS_MLA, MLAF_FP8_DIV, MLAF_TILE_AMAX, 0},
    {"fp8_ds_mla,ue8m0", MLAF_KV_FP8_DS_MLA, MLAF_FP8_DIV, MLAF_TILE_UE8M0, 0},
    {"fp8_ds_mla,ue8m0_floor_scaled", MLAF_KV_FP8_DS_MLA, MLAF_FP8_DIV, MLAF_TILE_UE8M0_FLOOR_SCALED, 0},
};
#define NFORMATS ((int)(sizeof FORMATS / sizeof FORMATS[0]))

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

/* ---- direct calls ------------------------------------------------------------------------ */

/* One mla_kv_cache_fmt call: host images (random unless a test sets them), then backend
 * buffers. Outputs start as 0xFF (q, k_nope, k_pe), canary bytes (the caches), amax_init and 0
 * (error_count); cache2 / kpe2 / amax2 are a second set with the same start, for a second
 * call. */
typedef struct kv_call {
    mlaf_backend be;
    int32_t Q, C, R;
    int64_t T, N, bs, nb, maxpos;
    mlaf_dtype dt, cdt;
    mlaf_kv_format format;
    mlaf_fp8_conv conv;
    mlaf_tile_scale tile;
    int kpe, amax;
    float scale, amax_init;
    int64_t width, s0, s1, ks0, ks1;
    unsigned char *lat, *canary, *kcanary;
    float *wq, *wkv, *cs;
    int64_t *pos, *slot;
    mlaf_gbuf gl, gwq, gwkv, gpos, gslot, gcs, gscale, gq, gk, gp, gec;
    mlaf_gbuf gcache, gkpe, gamax, gcache2, gkpe2, gamax2;
} kv_call;

static size_t cache_bytes(const kv_call *k) { return (size_t)(k->nb * k->s0) * mlaf_dtype_size(k->cdt); }
static size_t kpe_bytes(const kv_call *k) { return (size_t)(k->nb * k->ks0) * mlaf_dtype_size(k->cdt); }

/* Host images: latent rows ~N(0, 1) (every 5th row x 40), weights ~N(1, 0.25), positions in
 * [0, maxpos), slots a permutation of the cache with every 6th token skipped (-1). */
static int kv_make(kv_call *k, mlaf_backend be, int32_t Q, int32_t C, int32_t R, int64_t T, int64_t bs,
                   mlaf_dtype dt, mlaf_kv_format f, uint64_t seed) {
    memset(k, 0, sizeof *k);
    k->be = be, k->Q = Q, k->C = C, k->R = R, k->T = T, k->N = T, k->bs = bs, k->dt = dt, k->format = f;
    k->nb = (T + bs - 1) / bs + 2;
    k->maxpos = 64;
    k->cdt = f == MLAF_KV_PLAIN ? dt : MLAF_FP8_E4M3;
    k->scale = 1.0f, k->amax_init = 0.0f;
    const int64_t rec = f == MLAF_KV_FP8_DS_MLA ? (int64_t)C + C / 32 + 2 * (int64_t)R : (int64_t)C + R;
    k->width = rec;
    k->s1 = f == MLAF_KV_FP8_DS_MLA ? (rec + 15) / 16 * 16 : rec;
    k->s0 = bs * k->s1;
    k->ks1 = R, k->ks0 = bs * R;
    const int64_t W = (int64_t)Q + C + R;
    const size_t es = mlaf_dtype_size(dt);
    k->lat = malloc((size_t)(T * W) * es + 1);
    k->wq = malloc(sizeof(float) * (size_t)(Q + 1));
    k->wkv = malloc(sizeof(float) * (size_t)C);
    k->cs = malloc(sizeof(float) * (size_t)(k->maxpos * (R > 0 ? R : 1)));
    k->pos = malloc(sizeof(int64_t) * (size_t)(T + 1));
    k->slot = malloc(sizeof(int64_t) * (size_t)(T + 1));
    if (!k->lat || !k->wq || !k->wkv || !k->cs || !k->pos || !k->slot) return 0;
    mlaf_rng rng;
    mlaf_rng_seed(&rng, seed);
    for (int64_t t = 0; t < T; t++)
        mlaf_fill_normal(&rng, k->lat + (size_t)(t * W) * es, dt, (size_t)W, 0.0, t % 5 == 2 ? 40.0 : 1.0);
    mlaf_fill_normal(&rng, k->wq, MLAF_F32, (size_t)Q, 1.0, 0.25);
    mlaf_fill_normal(&rng, k->wkv, MLAF_F32, (size_t)C, 1.0, 0.25);
    if (R > 0) mlaf_rope_table_init(k->cs, k->maxpos, R, 10000.0);
    const int64_t cap = k->nb * bs;
    int64_t *perm = malloc(sizeof(int64_t) * (size_t)cap);
    if (!perm) return 0;
    for (int64_t i = 0; i < cap; i++) perm[i] = i;
    for (int64_t i = cap - 1; i > 0; i--) {
        const int64_t j = (int64_t)(mlaf_rng_u64(&rng) % (uint64_t)(i + 1)), x = perm[i];
        perm[i] = perm[j], perm[j] = x;
    }
    for (int64_t t = 0; t < T; t++) {
        k->pos[t] = (int64_t)(mlaf_rng_u64(&rng) % (uint64_t)k->maxpos);
        k->slot[t] = t % 6 == 4 ? -1 : perm[t];
    }
    free(perm);
    return 1;
}

static unsigned char *canary_image(size_t n, uint64_t seed) {
    unsigned char *p = malloc(n ? n : 1);
    if (!p) return NULL;
    mlaf_rng rng;
    mlaf_rng_seed(&rng, seed);
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(mlaf_rng_u64(&rng) >> 56);
    return p;
}

/* Backend buffers from the host images (after a test's changes to them). */
static int kv_alloc(kv_call *k) {
    const int64_t W = (int64_t)k->Q + k->C + k->R;
    const size_t es = mlaf_dtype_size(k->dt), cb = cache_bytes(k), kb = kpe_bytes(k);
    const int32_t ec0 = 0;
    k->canary = canary_image(cb, 77 + (uint64_t)cb);
    k->kcanary = canary_image(kb, 78 + (uint64_t)kb);
    if (!k->canary || !k->kcanary) return 0;
    const mlaf_backend be = k->be;
    int ok = mlaf_gbuf_alloc(&k->gl, be, (size_t)(k->T * W) * es, k->lat, 0) == MLAF_OK &&
             mlaf_gbuf_alloc(&k->gwq, be, sizeof(float) * (size_t)k->Q, k->wq, 0) == MLAF_OK &&
             mlaf_gbuf_alloc(&k->gwkv, be, sizeof(float) * (size_t)k->C, k->wkv, 0) == MLAF_OK &&
             mlaf_gbuf_alloc(&k->gpos, be, sizeof(int64_t) * (size_t)k->T, k->pos, 0) == MLAF_OK &&
             mlaf_gbuf_alloc(&k->gslot, be, sizeof(int64_t) * (size_t)k->T, k->slot, 0) == MLAF_OK &&
             mlaf_gbuf_alloc(&k->gcs, be, sizeof(float) * (size_t)(k->maxpos * k->R), k->cs, 0) == MLAF_OK &&
             mlaf_gbuf_alloc(&k->gscale, be, sizeof(float), &k->scale, 0) == MLAF_OK &&
             mlaf_gbuf_alloc(&k->gq, be, (size_t)(k->T * k->Q) * es, NULL, 0) == MLAF_OK &&
             mlaf_gbuf_alloc(&k->gk, be, (size_t)(k->T * k->C) * es, NULL, 0) == MLAF_OK &&
             mlaf_gbuf_alloc(&k->gp, be, (size_t)(k->T * k->R) * es, NULL, 0) == MLAF_OK &&
             mlaf_gbuf_alloc(&k->gec, be, sizeof ec0, &ec0, 0) == MLAF_OK &&
             mlaf_gbuf_alloc(&k->gcache, be, cb, k->canary, 0) == MLAF_OK &&
             mlaf_gbuf_alloc(&k->gkpe, be, kb, k->kcanary, 0) == MLAF_OK &&
             mlaf_gbuf_alloc(&k->gamax, be, sizeof(float), &k->amax_init, 0) == MLAF_OK &&
             mlaf_gbuf_alloc(&k->gcache2, be, cb, k->canary, 0) == MLAF_OK &&
             mlaf_gbuf_alloc(&k->gkpe2, be, kb, k->kcanary, 0) == MLAF_OK &&
             mlaf_gbuf_alloc(&k->gamax2, be, sizeof(float), &k->amax_init, 0) == MLAF_OK;
    return ok;
}

static void kv_free(kv_call *k) {
    mlaf_gbuf *g[] = {&k->gl,    &k->gwq, &k->gwkv, &k->gpos,   &k->gslot, &k->gcs,    &k->gscale, &k->gq,    &k->gk,
                      &k->gp,    &k->gec, &k->gcache, &k->gkpe, &k->gamax, &k->gcache2, &k->gkpe2, &k->gamax2};
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++)
        if (g[i]->host) mlaf_gbuf_free(g[i]);
    free(k->lat), free(k->wq), free(k->wkv), free(k->cs), free(k->pos), free(k->slot), free(k->canary),
        free(k->kcanary);
    memset(k, 0, sizeof *k);
}

/* The call's arguments as tensors; a test may spoil any of them before kv_invoke. */
typedef struct kv_args {
    mlaf_mla_kv_cache_params p;
    mlaf_tensor lat, wq, wkv, pos, cs, slot, cache, kpe, scale, amax, q, k, pe, ec;
    mlaf_kv_cache_desc d;
    int use_q, use_k, use_pe, use_ec;
} kv_args;

static void kv_args_of(const kv_call *k, int second, kv_args *a) {
    memset(a, 0, sizeof *a);
    mlaf_mla_kv_cache_params p = {k->Q, k->C, k->R, 1e-6f, 1e-6f, MLAF_ROPE_INTERLEAVED};
    a->p = p;
    const int64_t W = (int64_t)k->Q + k->C + k->R;
    a->lat = mlaf_tensor_2d(k->gl.ptr, k->dt, k->T, W, W);
    a->wq = mlaf_tensor_1d(k->gwq.ptr, MLAF_F32, k->Q);
    a->wkv = mlaf_tensor_1d(k->gwkv.ptr, MLAF_F32, k->C);
    a->pos = mlaf_tensor_1d(k->gpos.ptr, MLAF_I64, k->T);
    a->cs = mlaf_tensor_2d(k->gcs.ptr, MLAF_F32, k->maxpos, k->R, k->R);
    a->slot = mlaf_tensor_1d(k->gslot.ptr, MLAF_I64, k->N);
    const int64_t cw = k->kpe ? k->C : k->width;
    a->cache = mlaf_tensor_3d(second ? k->gcache2.ptr : k->gcache.ptr, k->cdt, k->nb, k->bs, cw, k->s0, k->s1);
    a->kpe = mlaf_tensor_3d(second ? k->gkpe2.ptr : k->gkpe.ptr, k->cdt, k->nb, k->bs, k->R, k->ks0, k->ks1);
    a->scale = mlaf_tensor_1d(k->gscale.ptr, MLAF_F32, 1);
    a->amax = mlaf_tensor_1d(second ? k->gamax2.ptr : k->gamax.ptr, MLAF_F32, 1);
    a->q = mlaf_tensor_2d(k->gq.ptr, k->dt, k->T, k->Q, k->Q);
    a->k = mlaf_tensor_2d(k->gk.ptr, k->dt, k->T, k->C, k->C);
    a->pe = mlaf_tensor_2d(k->gp.ptr, k->dt, k->T, k->R, k->R);
    a->ec = mlaf_tensor_1d(k->gec.ptr, MLAF_I32, 1);
    a->d.format = k->format;
    a->d.cache = &a->cache;
    a->d.kpe = k->kpe ? &a->kpe : NULL;
    a->d.scale = k->format == MLAF_KV_FP8 ? &a->scale : NULL;
    a->d.amax_out = k->amax ? &a->amax : NULL;
    a->d.conv = k->conv;
    a->d.tile_scale = k->tile;
    a->use_q = k->Q > 0, a->use_k = a->use_pe = 1, a->use_ec = 1;
}

static mlaf_status kv_invoke(mlaf_context *ctx, const kv_call *k, kv_args *a) {
    mlaf_status s = mlaf_mla_kv_cache_fmt(ctx, &a->p, &a->lat, k->Q > 0 ? &a->wq : NULL, &a->wkv,
                                          k->R > 0 ? &a->pos : NULL, k->R > 0 ? &a->cs : NULL, &a->slot, &a->d,
                                          a->use_q ? &a->q : NULL, a->use_k ? &a->k : NULL,
                                          a->use_pe && k->R > 0 ? &a->pe : NULL, a->use_ec ? &a->ec : NULL);
    if (s == MLAF_OK) s = mlaf_context_sync(ctx);
    return s;
}

static mlaf_status kv_download(kv_call *k) {
    mlaf_gbuf *g[] = {&k->gq, &k->gk, &k->gp, &k->gec, &k->gcache, &k->gkpe, &k->gamax, &k->gcache2, &k->gkpe2, &k->gamax2};
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
        mlaf_status s = mlaf_gbuf_download(g[i]);
        if (s != MLAF_OK) return s;
    }
    return MLAF_OK;
}

/* The byte of record byte i of a slot (the rope part in kpe when kept apart). */
static const unsigned char *rec_byte(const kv_call *k, const mlaf_gbuf *cache, const mlaf_gbuf *kpe, int64_t slot,
                                     int64_t i) {
    const int64_t b = slot / k->bs, o = slot % k->bs;
    if (k->kpe && i >= k->C) return (const unsigned char *)kpe->body + b * k->ks0 + o * k->ks1 + (i - k->C);
    return (const unsigned char *)cache->body + b * k->s0 + o * k->s1 + i;
}

/* Half an e4m3 ulp at |y| (the quantized value), plus the f32 rounding of y itself. */
static double e4m3_bound(double y) {
    const double a = fabs(y);
    int e;
    frexp(a, &e);
    const double ulp = a < 0x1p-6 ? 0x1p-9 : ldexp(1.0, e - 4);
    return ulp / 2 + ldexp(a, -23) + 0x1p-149;
}

/* ---- 2. the record layouts, by hand ------------------------------------------------------ */

/* C = 512, R = 64, Q = 0, bf16, two tokens at position 0 (cos 1, sin 0: the rope part is the
 * latent's, unrotated). The latent's kv part is all 1 (token 0) or all -1 (token 1), so the
 * normalized row is +-w (within a bf16 rounding of 1 - 5e-7): w holds, per tile,
 *   tile 0: 448, 1.5, -2, then 0.25   (amax 448)
 *   tile 1: 224, 1, then 0            (amax 224)
 *   tile 2: 300, then 0.5             (amax 300)
 *   tile 3: 0                         (amax 0: the floors)
 * and the rope part holds r + 1 (token 0) or -(r + 1) (token 1). Token 0 takes slot 3, token 1
 * slot 0 of one block of 4. */
static int layout_inputs(kv_call *k, mlaf_backend be, mlaf_kv_format f) {
    if (!kv_make(k, be, 0, 512, 64, 2, 4, MLAF_BF16, f, 5)) return 0;
    k->nb = 1;
    for (int i = 0; i < 512; i++) {
        float w = 0.0f;
        if (i < 128) w = i == 0 ? 448.0f : i == 1 ? 1.5f : i == 2 ? -2.0f : 0.25f;
        else if (i < 256) w = i == 128 ? 224.0f : i == 129 ? 1.0f : 0.0f;
        else if (i < 384) w = i == 256 ? 300.0f : 0.5f;
        k->wkv[i] = w;
    }
    uint16_t *lat = (uint16_t *)k->lat;
    for (int t = 0; t < 2; t++) {
        for (int i = 0; i < 512; i++) lat[t * 576 + i] = mlaf_f32_to_bf16(t ? -1.0f : 1.0f);
        for (int r = 0; r < 64; r++) lat[t * 576 + 512 + r] = mlaf_f32_to_bf16((t ? -1.0f : 1.0f) * (float)(r + 1));
        k->pos[t] = 0;
    }
    k->slot[0] = 3, k->slot[1] = 0;
    return 1;
}

typedef struct pin {
    int64_t at;
    uint8_t b;
} pin;

static void check_pins(const char *name, const unsigned char *rec, const pin *pins, int n, char *why, size_t cap,
                       int *ok) {
    for (int i = 0; i < n && *ok; i++)
        if (rec[pins[i].at] != pins[i].b) {
            *ok = 0;
            snprintf(why, cap, "%s: byte %lld = 0x%02x, expected 0x%02x", name, (long long)pins[i].at,
                     rec[pins[i].at], pins[i].b);
        }
}

static void layout_ds_mla(mlaf_context *ctx, mlaf_tile_scale mode) {
    const mlaf_backend be = mlaf_context_backend(ctx);
    static const char *mn[3] = {"amax", "ue8m0", "ue8m0_floor_scaled"};
    char name[160], why[256] = "";
    snprintf(name, sizeof name, "LAYOUT_FP8_DS_MLA(C=512,R=64,656 bytes,tile_scale=%s,backend=%s)", mn[mode],
             mlaf_backend_name(be));
    if (filtered_out(name)) return;
    kv_call k;
    int ok = layout_inputs(&k, be, MLAF_KV_FP8_DS_MLA);
    k.tile = mode;
    ok = ok && k.width == 656 && k.s1 == 656 && mlaf_kv_record_bytes(MLAF_KV_FP8_DS_MLA, MLAF_U8, 512, 64) == 656 &&
         kv_alloc(&k);
    if (!ok) snprintf(why, sizeof why, "setup (record %lld bytes)", (long long)k.width);
    kv_args a;
    mlaf_status st = MLAF_OK;
    if (ok) {
        kv_args_of(&k, 0, &a);
        st = kv_invoke(ctx, &k, &a);
        if (st == MLAF_OK) st = kv_download(&k);
        if (st != MLAF_OK) {
            ok = 0;
            snprintf(why, sizeof why, "%s: %s", mlaf_status_name(st), mlaf_context_last_error(ctx));
        }
    }
    /* tile scales, little-endian f32, by mode: tile 2's amax scale is 300 / 448 in f32 */
    static const uint32_t scales[3][4] = {{0x3F800000u, 0x3F000000u, 0x3F2B6DB7u, 0x00800000u},
                                          {0x3F800000u, 0x3F000000u, 0x3F800000u, 0x34800000u},
                                          {0x3F800000u, 0x3F000000u, 0x3F800000u, 0x39000000u}};
    for (int t = 0; t < 2 && ok; t++) {
        const unsigned char *rec = (const unsigned char *)k.gcache.body + (t ? 0 : 3 * 656);
        const uint8_t sg = t ? 0x80 : 0x00;
        pin pins[40];
        int n = 0;
        /* tile 0, scale 1: 448 -> 0x7E, 1.5 -> 0x3C, -2 -> 0xC0, 0.25 -> 0x28 */
        pins[n++] = (pin){0, (uint8_t)(sg | 0x7E)};
        pins[n++] = (pin){1, (uint8_t)(sg | 0x3C)};
        pins[n++] = (pin){2, (uint8_t)(0xC0 ^ sg)};
        pins[n++] = (pin){127, (uint8_t)(sg | 0x28)};
        /* tile 1, scale 0.5: 224 -> 448, 1 -> 2 (0x40), 0 -> 0 */
        pins[n++] = (pin){128, (uint8_t)(sg | 0x7E)};
        pins[n++] = (pin){129, (uint8_t)(sg | 0x40)};
        pins[n++] = (pin){200, sg}; /* +-0: a signed zero */
        /* tile 2: amax scale 300/448 -> 300 maps to 448 (0x7E), 0.5 to 0.75 (0x34); power-of-two
         * scale 1 -> 300 rounds to 288 (0x79), 0.5 is 0x30 */
        pins[n++] = (pin){256, (uint8_t)(sg | (mode == MLAF_TILE_AMAX ? 0x7E : 0x79))};
        pins[n++] = (pin){300, (uint8_t)(sg | (mode == MLAF_TILE_AMAX ? 0x34 : 0x30))};
        /* tile 3: zeros */
        pins[n++] = (pin){384, sg};
        pins[n++] = (pin){511, sg};
        for (int s = 0; s < 4; s++)
            for (int b = 0; b < 4; b++) pins[n++] = (pin){512 + 4 * s + b, (uint8_t)(scales[mode][s] >> (8 * b))};
        /* rope bf16 at 528: 1.0 = 0x3F80 (80 3F), 2.0 = 0x4000 (00 40), 64.0 = 0x4280 at 654 */
        pins[n++] = (pin){528, 0x80};
        pins[n++] = (pin){529, (uint8_t)(0x3F | sg)};
        pins[n++] = (pin){530, 0x00};
        pins[n++] = (pin){531, (uint8_t)(0x40 | sg)};
        pins[n++] = (pin){654, 0x80};
        pins[n++] = (pin){655, (uint8_t)(0x42 | sg)};
        check_pins(t ? "token 1 (slot 0)" : "token 0 (slot 3)", rec, pins, n, why, sizeof why, &ok);
    }
    /* slots 1 and 2 untouched */
    if (ok && memcmp((const unsigned char *)k.gcache.body + 656, k.canary + 656, 2 * 656) != 0) {
        ok = 0;
        snprintf(why, sizeof why, "slots 1, 2 (no token) changed");
    }
    tl_case(ok, name, "%s", why);
    kv_free(&k);
}

static void layout_fp8(mlaf_context *ctx, mlaf_fp8_conv conv) {
    const mlaf_backend be = mlaf_context_backend(ctx);
    char name[160], why[256] = "";
    snprintf(name, sizeof name, "LAYOUT_FP8(C=512,R=64,576 bytes,%s,backend=%s)",
             conv == MLAF_FP8_DIV ? "x/scale scale=2" : "x*scale scale=0.5", mlaf_backend_name(be));
    if (filtered_out(name)) return;
    kv_call k;
    int ok = layout_inputs(&k, be, MLAF_KV_FP8);
    k.conv = conv;
    k.scale = conv == MLAF_FP8_DIV ? 2.0f : 0.5f;
    k.amax = 1;
    ok = ok && k.width == 576 && mlaf_kv_record_bytes(MLAF_KV_FP8, MLAF_FP8_E4M3, 512, 64) == 576 && kv_alloc(&k);
    if (!ok) snprintf(why, sizeof why, "setup");
    kv_args a;
    if (ok) {
        kv_args_of(&k, 0, &a);
        mlaf_status st = kv_invoke(ctx, &k, &a);
        if (st == MLAF_OK) st = kv_download(&k);
        if (st != MLAF_OK) {
            ok = 0;
            snprintf(why, sizeof why, "%s: %s", mlaf_status_name(st), mlaf_context_last_error(ctx));
        }
    }
    for (int t = 0; t < 2 && ok; t++) {
        const unsigned char *rec = (const unsigned char *)k.gcache.body + (t ? 0 : 3 * 576);
        const uint8_t sg = t ? 0x80 : 0x00;
        /* values / 2: 448 -> 224 (0x76), 1.5 -> 0.75 (0x34), -2 -> -1 (0xB8), 0.25 -> 0.125
         * (0x20), 300 -> 150 (0x71: 144 and 160 are the neighbours, 144 = 0x71 nearer), 0 -> +-0
         * (token 1's -0 is 0x80), rope
         * 1 -> 0.5 (0x30) at 512, 2 -> 1 (0x38), 64 -> 32 (0x60) at 575 */
        const pin pins[] = {{0, (uint8_t)(sg | 0x76)},   {1, (uint8_t)(sg | 0x34)},   {2, (uint8_t)(0xB8 ^ sg)},
                            {3, (uint8_t)(sg | 0x20)},   {256, (uint8_t)(sg | 0x71)}, {384, sg},
                            {512, (uint8_t)(sg | 0x30)}, {513, (uint8_t)(sg | 0x38)}, {575, (uint8_t)(sg | 0x60)}};
        check_pins(t ? "token 1 (slot 0)" : "token 0 (slot 3)", rec, pins, (int)(sizeof pins / sizeof pins[0]), why,
                   sizeof why, &ok);
    }
    float amax;
    memcpy(&amax, k.gamax.body, sizeof amax);
    if (ok && amax != 448.0f) {
        ok = 0;
        snprintf(why, sizeof why, "amax_out = %.9g, expected 448", amax);
    }
    tl_case(ok, name, "%s", why);
    kv_free(&k);
}

/* ---- 3. decode back, and the same bytes without the dense outputs -------------------------- */

/* Every written record of the first call decoded against the dense row (k->gk, k->gp). */
static int decode_rows(const kv_call *k, char *why, size_t cap) {
    const int32_t C = k->C, R = k->R;
    for (int64_t t = 0; t < k->N; t++) {
        const int64_t slot = k->slot[t];
        if (slot < 0) continue;
        for (int64_t i = 0; i < (int64_t)C + R; i++) {
            const float x = i < C ? mlaf_load_f32(k->gk.body, k->dt, t * C + i)
                                  : mlaf_load_f32(k->gp.body, k->dt, t * R + (i - C));
            if (k->format == MLAF_KV_FP8_DS_MLA && i >= C) { /* rope: the dense bf16 bits */
                const unsigned char *p = rec_byte(k, &k->gcache, &k->gkpe, slot, C + C / 32 + 2 * (i - C));
                const uint16_t got = (uint16_t)(p[0] | p[1] << 8), want = mlaf_f32_to_bf16(x);
                if (got != want) {
                    snprintf(why, cap, "token %lld rope[%lld]: bf16 0x%04x, dense 0x%04x", (long long)t,
                             (long long)(i - C), got, want);
                    return 0;
                }
                continue;
            }
            float s = k->scale;
            int mul = k->format == MLAF_KV_FP8 && k->conv == MLAF_FP8_MUL;
            if (k->format == MLAF_KV_FP8_DS_MLA) {
                const unsigned char *p = rec_byte(k, &k->gcache, &k->gkpe, slot, C + 4 * (i / 128));
                s = mlaf_bits_f32((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
            }
            const double y = mul ? (double)x * s : (double)x / s; /* the exact quantized value */
            const uint8_t b = *rec_byte(k, &k->gcache, &k->gkpe, slot, i);
            if (fabs(y) >= 464.0) { /* saturated */
                if (b != (x < 0 ? 0xFE : 0x7E)) {
                    snprintf(why, cap, "token %lld value %lld: x = %.9g saturates, byte 0x%02x", (long long)t,
                             (long long)i, x, b);
                    return 0;
                }
                continue;
            }
            const double d = mlaf_e4m3_to_f32(b);
            if (!(fabs(d - y) <= e4m3_bound(y))) {
                snprintf(why, cap,
                         "token %lld value %lld: x = %.9g, scale %.9g: byte 0x%02x decodes to %.9g, beyond half an "
                         "e4m3 ulp of %.9g",
                         (long long)t, (long long)i, x, s, b, mul ? d / s : d * s, x);
                return 0;
            }
        }
    }
    return 1;
}

static void decode_and_same_bytes(mlaf_context *ctx, const fmt_case *f, mlaf_dtype dt, int64_t T, uint64_t seed) {
    const mlaf_backend be = mlaf_context_backend(ctx);
    char name[200], why[320] = "";
    snprintf(name, sizeof name, "DECODE_SAME_BYTES(cache=%s,dtype=%s,T=%lld,backend=%s)", f->label, mlaf_dtype_name(dt),
             (long long)T, mlaf_backend_name(be));
    if (filtered_out(name)) return;
    kv_call k;
    const int32_t Q = f->format == MLAF_KV_FP8 ? 0 : 96;
    int ok = kv_make(&k, be, Q, 512, 64, T, 16, dt, f->format, seed);
    k.conv = f->conv, k.tile = f->tile, k.kpe = f->kpe;
    k.amax = f->format == MLAF_KV_FP8;
    /* scale 0.5 (DIV) or 2 (MUL): the loud rows' rope values (~N(0, 40)) reach e4m3's top, and a
     * few saturate */
    k.scale = f->conv == MLAF_FP8_MUL ? 2.0f : 0.5f;
    ok = ok && kv_alloc(&k);
    kv_args a, b;
    mlaf_status st = MLAF_ERR_OUT_OF_MEMORY;
    if (ok) {
        kv_args_of(&k, 0, &a);
        st = kv_invoke(ctx, &k, &a);
        kv_args_of(&k, 1, &b);
        b.use_k = b.use_pe = 0;
        if (st == MLAF_OK) st = kv_invoke(ctx, &k, &b);
        if (st == MLAF_OK) st = kv_download(&k);
    }
    if (st != MLAF_OK) {
        ok = 0;
        snprintf(why, sizeof why, "%s: %s", mlaf_status_name(st), mlaf_context_last_error(ctx));
    }
    if (ok && f->format != MLAF_KV_PLAIN) ok = decode_rows(&k, why, sizeof why);
    if (ok && (memcmp(k.gcache.body, k.gcache2.body, cache_bytes(&k)) != 0 ||
               memcmp(k.gkpe.body, k.gkpe2.body, kpe_bytes(&k)) != 0 || memcmp(k.gamax.body, k.gamax2.body, 4) != 0)) {
        ok = 0;
        snprintf(why, sizeof why, "the cache bytes (or amax_out) differ without the dense outputs");
    }
    if (ok && !(mlaf_gbuf_guards_ok(&k.gcache) && mlaf_gbuf_guards_ok(&k.gcache2) && mlaf_gbuf_guards_ok(&k.gkpe))) {
        ok = 0;
        snprintf(why, sizeof why, "a guard zone was written");
    }
    tl_case(ok, name, "%s", why);
    kv_free(&k);
}

/* ---- 4. rejections ----------------------------------------------------------------------- */

/* 1 when no output buffer changed (and guards are intact). */
static int nothing_written(kv_call *k) {
    if (kv_download(k) != MLAF_OK) return 0;
    const mlaf_gbuf *poisoned[3] = {&k->gq, &k->gk, &k->gp};
    for (int i = 0; i < 3; i++)
        for (size_t j = 0; j < poisoned[i]->bytes; j++)
            if (((const unsigned char *)poisoned[i]->body)[j] != 0xFF) return 0;
    int32_t ec;
    float amax;
    memcpy(&ec, k->gec.body, 4);
    memcpy(&amax, k->gamax.body, 4);
    const mlaf_gbuf *all[] = {&k->gq, &k->gk, &k->gp, &k->gec, &k->gcache, &k->gkpe, &k->gamax};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (!mlaf_gbuf_guards_ok(all[i])) return 0;
    return ec == 0 && mlaf_f32_bits(amax) == mlaf_f32_bits(k->amax_init) && mlaf_gbuf_equals(&k->gcache, k->canary) &&
           mlaf_gbuf_equals(&k->gkpe, k->kcanary);
}

typedef enum spoil {
    SP_FP8_WIDTH,
    SP_DS_WIDTH,
    SP_NO_SCALE,
    SP_SCALE_DTYPE,
    SP_SCALE_SHAPE,
    SP_DS_LATENT_F16,
    SP_DS_C192,
    SP_DS_KPE,
    SP_BAD_FORMAT,
    SP_BAD_CONV,
    SP_BAD_TILE,
    SP_SCALE_FOR_DS,
    SP_AMAX_FOR_PLAIN,
    SP_FP8_CACHE_BF16,
    SP_DS_STRIDE,
    SP_KPE_DTYPE,
    SP_KPE_BLOCKS,
    SP_NO_DESC,
    SP_COUNT
} spoil;

typedef struct reject_case {
    const char *what;
    mlaf_kv_format format;
    mlaf_status want;
    const char *needle; /* the argument the message must name */
} reject_case;

static const reject_case REJECTS[SP_COUNT] = {
    {"fp8 record width C + R - 1", MLAF_KV_FP8, MLAF_ERR_SHAPE, "kv_cache.shape[2]"},
    {"fp8_ds_mla record width 655", MLAF_KV_FP8_DS_MLA, MLAF_ERR_SHAPE, "kv_cache.shape[2]"},
    {"fp8 without a scale", MLAF_KV_FP8, MLAF_ERR_NULL_POINTER, "cache.scale"},
    {"fp8 scale in f16", MLAF_KV_FP8, MLAF_ERR_DTYPE, "scale.dtype"},
    {"fp8 scale of 2 values", MLAF_KV_FP8, MLAF_ERR_SHAPE, "scale.shape[0]"},
    {"fp8_ds_mla with an f16 latent", MLAF_KV_FP8_DS_MLA, MLAF_ERR_DTYPE, "latent.dtype"},
    {"fp8_ds_mla with C = 192", MLAF_KV_FP8_DS_MLA, MLAF_ERR_INVALID_ARGUMENT, "kv_lora_rank"},
    {"fp8_ds_mla with a kpe array", MLAF_KV_FP8_DS_MLA, MLAF_ERR_INVALID_ARGUMENT, "cache.kpe"},
    {"format 4", MLAF_KV_FP8, MLAF_ERR_INVALID_ARGUMENT, "cache.format"},
    {"conv 2", MLAF_KV_FP8, MLAF_ERR_INVALID_ARGUMENT, "cache.conv"},
    {"tile_scale 3", MLAF_KV_FP8_DS_MLA, MLAF_ERR_INVALID_ARGUMENT, "cache.tile_scale"},
    {"a scale for fp8_ds_mla", MLAF_KV_FP8_DS_MLA, MLAF_ERR_INVALID_ARGUMENT, "cache.scale"},
    {"amax_out for plain", MLAF_KV_PLAIN, MLAF_ERR_INVALID_ARGUMENT, "cache.amax_out"},
    {"fp8 cache in bf16", MLAF_KV_FP8, MLAF_ERR_DTYPE, "kv_cache.dtype"},
    {"fp8_ds_mla row stride 664 (not a multiple of 16)", MLAF_KV_FP8_DS_MLA, MLAF_ERR_STRIDE, "kv_cache"},
    {"kpe in another dtype", MLAF_KV_FP8, MLAF_ERR_DTYPE, "kpe.dtype"},
    {"kpe with other block count", MLAF_KV_FP8, MLAF_ERR_SHAPE, "kpe.shape[0]"},
    {"no cache description", MLAF_KV_FP8, MLAF_ERR_NULL_POINTER, "cache"},
};

static void rejections(mlaf_context *ctx) {
    const mlaf_backend be = mlaf_context_backend(ctx);
    for (int sp = 0; sp < SP_COUNT; sp++) {
        const reject_case *rc = &REJECTS[sp];
        char name[200], why[400] = "";
        snprintf(name, sizeof name, "REJECT(%s,backend=%s)", rc->what, mlaf_backend_name(be));
        if (filtered_out(name)) continue;
        kv_call k;
        const int32_t C = sp == SP_DS_C192 ? 192 : 512;
        const mlaf_dtype dt = sp == SP_DS_LATENT_F16 ? MLAF_F16 : MLAF_BF16;
        int ok = kv_make(&k, be, 32, C, 64, 5, 4, dt, rc->format, 900 + (uint64_t)sp);
        if (sp == SP_DS_KPE || sp == SP_KPE_DTYPE || sp == SP_KPE_BLOCKS) k.kpe = 1;
        if (sp == SP_DS_STRIDE) k.s1 = 664, k.s0 = 4 * 664;
        if (sp == SP_FP8_CACHE_BF16) k.cdt = MLAF_BF16;
        k.amax_init = 0.5f;
        ok = ok && kv_alloc(&k);
        if (!ok) {
            tl_case(0, name, "setup");
            kv_free(&k);
            continue;
        }
        kv_args a;
        kv_args_of(&k, 0, &a);
        const mlaf_tensor scale2 = mlaf_tensor_1d(k.gscale.ptr, MLAF_F16, 1);
        const mlaf_tensor scale3 = mlaf_tensor_1d(k.gscale.ptr, MLAF_F32, 2);
        switch ((spoil)sp) {
        case SP_FP8_WIDTH: a.cache.shape[2] = 575; break;
        case SP_DS_WIDTH: a.cache.shape[2] = 655; break;
        case SP_NO_SCALE: a.d.scale = NULL; break;
        case SP_SCALE_DTYPE: a.d.scale = &scale2; break;
        case SP_SCALE_SHAPE: a.d.scale = &scale3; break;
        case SP_BAD_FORMAT: a.d.format = (mlaf_kv_format)4; break;
        case SP_BAD_CONV: a.d.conv = (mlaf_fp8_conv)2; break;
        case SP_BAD_TILE: a.d.tile_scale = (mlaf_tile_scale)3; break;
        case SP_SCALE_FOR_DS: a.d.scale = &a.scale; break;
        case SP_AMAX_FOR_PLAIN: a.d.amax_out = &a.amax; break;
        case SP_KPE_DTYPE: a.kpe.dtype = MLAF_U8; break;
        case SP_KPE_BLOCKS: a.kpe.shape[0] = k.nb - 1; break;
        default: break;
        }
        if (sp == SP_DS_KPE) a.d.kpe = &a.kpe;
        mlaf_status st = sp == SP_NO_DESC
                             ? mlaf_mla_kv_cache_fmt(ctx, &a.p, &a.lat, &a.wq, &a.wkv, &a.pos, &a.cs, &a.slot, NULL,
                                                     &a.q, &a.k, &a.pe, &a.ec)
                             : kv_invoke(ctx, &k, &a);
        const char *msg = mlaf_context_last_error(ctx);
        if (st != rc->want)
            snprintf(why, sizeof why, "status %s, expected %s (%s)", mlaf_status_name(st), mlaf_status_name(rc->want), msg);
        else if (!strstr(msg, rc->needle))
            snprintf(why, sizeof why, "message \"%s\" does not name %s", msg, rc->needle);
        else if (!nothing_written(&k))
            snprintf(why, sizeof why, "an output changed (message \"%s\")", msg);
        tl_case(why[0] == '\0', name, "%s", why);
        kv_free(&k);
    }
}

/* ---- 5. slot_mapping shorter than T ----------------------------------------------------- */

static void short_map(mlaf_context *ctx, const fmt_case *f) {
    const mlaf_backend be = mlaf_context_backend(ctx);
    char name[200], why[320] = "";
    const int64_t T = 37, N = 4;
    snprintf(name, sizeof name, "SHORT_MAP(cache=%s,T=%lld,N=%lld,backend=%s)", f->label, (long long)T, (long long)N,
             mlaf_backend_name(be));
    if (filtered_out(name)) return;
    kv_call k;
    int ok = kv_make(&k, be, 48, 512, 64, T, 8, MLAF_BF16, f->format, 4242);
    k.conv = f->conv, k.tile = f->tile, k.kpe = f->kpe, k.amax = f->format == MLAF_KV_FP8;
    for (int64_t t = 0; t < T; t++) k.slot[t] = t; /* rows t >= N would name slot t, if read */
    k.N = N;
    ok = ok && kv_alloc(&k);
    kv_args a;
    mlaf_status st = MLAF_ERR_OUT_OF_MEMORY;
    if (ok) {
        kv_args_of(&k, 0, &a);
        st = kv_invoke(ctx, &k, &a);
        if (st == MLAF_OK) st = kv_download(&k);
    }
    if (st != MLAF_OK) {
        ok = 0;
        snprintf(why, sizeof why, "%s: %s", mlaf_status_name(st), mlaf_context_last_error(ctx));
    }
    const size_t es = mlaf_dtype_size(k.cdt);
    for (int64_t t = 0; t < T && ok; t++) {
        int changed = 0, kept = 1;
        const int64_t rb = (k.kpe ? k.C : k.width) * (int64_t)es, kb = k.R * (int64_t)es;
        const size_t at = (size_t)((t / k.bs) * k.s0 + (t % k.bs) * k.s1) * es;
        for (int64_t i = 0; i < rb; i++)
            changed |= ((unsigned char *)k.gcache.body)[at + i] != k.canary[at + i];
        kept = !changed;
        if (k.kpe) {
            const size_t ka = (size_t)((t / k.bs) * k.ks0 + (t % k.bs) * k.ks1) * es;
            for (int64_t i = 0; i < kb; i++)
                if (((unsigned char *)k.gkpe.body)[ka + i] != k.kcanary[ka + i]) changed = 1, kept = 0;
        }
        if (t < N ? !changed : !kept) {
            ok = 0;
            snprintf(why, sizeof why, "token %lld: cache row %s", (long long)t,
                     t < N ? "not written (it has a slot)" : "written (it is past slot_mapping's end)");
        }
        for (int32_t i = 0; i < k.Q && ok; i++)
            if (!isfinite(mlaf_load_f32(k.gq.body, k.dt, t * k.Q + i))) {
                ok = 0;
                snprintf(why, sizeof why, "token %lld: q[%d] not written", (long long)t, (int)i);
            }
        for (int32_t i = 0; i < k.R && ok; i++)
            if (!isfinite(mlaf_load_f32(k.gp.body, k.dt, t * k.R + i))) {
                ok = 0;
                snprintf(why, sizeof why, "token %lld: k_pe[%d] not written", (long long)t, (int)i);
            }
    }
    int32_t ec;
    memcpy(&ec, k.gec.body, 4);
    if (ok && ec != 0) {
        ok = 0;
        snprintf(why, sizeof why, "error_count %d, expected 0 (rows past the end are skipped, not errors)", (int)ec);
    }
    tl_case(ok, name, "%s", why);
    kv_free(&k);
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
    if (tag) return; /* the instruction-set runs: the verified cases only */
    for (int m = 0; m < 3; m++) layout_ds_mla(ctx, (mlaf_tile_scale)m);
    layout_fp8(ctx, MLAF_FP8_DIV);
    layout_fp8(ctx, MLAF_FP8_MUL);
    static const fmt_case plain = {"plain", MLAF_KV_PLAIN, MLAF_FP8_DIV, MLAF_TILE_AMAX, 0};
    decode_and_same_bytes(ctx, &plain, MLAF_F16, 77, 31);
    for (int f = 0; f < NFORMATS; f++) {
        const int ds = FORMATS[f].format == MLAF_KV_FP8_DS_MLA;
        decode_and_same_bytes(ctx, &FORMATS[f], ds || f % 2 ? MLAF_BF16 : MLAF_F16, 203 + f, 40 + (uint64_t)f);
        if (!quick && !ds) decode_and_same_bytes(ctx, &FORMATS[f], MLAF_F32, 64, 60 + (uint64_t)f);
    }
    rejections(ctx);
    short_map(ctx, &plain);
    for (int f = 0; f < NFORMATS; f++) short_map(ctx, &FORMATS[f]);
}

int main(void) {
    decode_bound();
    return tl_run_suite("KV_FORMATS", suite);
}
