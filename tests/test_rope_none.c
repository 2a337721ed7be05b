/*
 * test_rope_none.c — the rope style none (Kimi-K3's unrotated rope slot; docs/mla.md, "The rope
 * style none") on every backend. With positions and cos_sin absent:
 *   - mla_kv_cache in each cache format that takes a rope part (plain of the latent dtype and of
 *     another, fp8, fp8_ds_mla) writes the same bytes (cache and dense k_pe) as the interleaved
 *     style with an identity table (cos 1, sin 0: the values as read), for row shapes that reach
 *     every CUDA launch shape (T = 1, 37, 1100; an odd-width row for the generic kernel);
 *   - a plain cache of the latent dtype and the dense k_pe hold the latent's own bits;
 *   - positions that are given but out of range are not read: nothing counted, every row written;
 *   - rope_q leaves q untouched in place, and its q_out / head_norm forms equal the identity table's;
 *   - mla_kv_cache_dsa and kv_rope_tail reject the style with nothing written.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "internal.h"
#include "testlib.h"

typedef struct dims {
    int32_t Q, C, R;
} dims;

/* The buffers of one mla_kv_cache call on backend be (device copies of the host inputs). */
typedef struct kv_bufs {
    mlaf_gbuf lat, w, pos, slot, cs, cache, kpe, ec, scale, q;
} kv_bufs;

static void kv_free(kv_bufs *b) {
    mlaf_gbuf *all[10] = {&b->lat, &b->w, &b->pos, &b->slot, &b->cs, &b->cache, &b->kpe, &b->ec, &b->scale, &b->q};
    for (int i = 0; i < 10; i++)
        if (all[i]->dev_base) mlaf_gbuf_free(all[i]);
}

/* One call: style none with positions (bad ones when given) or absent, or interleaved with the
 * identity table. Returns the status; the cache, k_pe and error count are downloaded. */
static mlaf_status kv_call(mlaf_context *ctx, const dims *d, mlaf_dtype dt, mlaf_kv_format f, mlaf_dtype cdt, int64_t T,
                           mlaf_rope_style style, int with_pos, const void *lat, const int64_t *pos, const int64_t *slot,
                           const float *cs, size_t cache_bytes, const unsigned char *canary, kv_bufs *b) {
    const mlaf_backend be = mlaf_context_backend(ctx);
    const size_t es = mlaf_dtype_size(dt);
    const int32_t W = d->Q + d->C + d->R;
    float w[2048];
    for (int32_t i = 0; i < d->Q + d->C; i++) w[i] = 1.0f + 0.001f * (float)(i % 97);
    const int32_t zero = 0;
    const float scale = 0.5f;
    memset(b, 0, sizeof *b);
    if (mlaf_gbuf_alloc(&b->lat, be, (size_t)(T * W) * es, lat, 0) != MLAF_OK ||
        mlaf_gbuf_alloc(&b->w, be, sizeof(float) * (size_t)(d->Q + d->C), w, 0) != MLAF_OK ||
        mlaf_gbuf_alloc(&b->pos, be, sizeof(int64_t) * (size_t)T, pos, 0) != MLAF_OK ||
        mlaf_gbuf_alloc(&b->slot, be, sizeof(int64_t) * (size_t)T, slot, 0) != MLAF_OK ||
        mlaf_gbuf_alloc(&b->cs, be, sizeof(float) * (size_t)d->R, cs, 0) != MLAF_OK ||
        mlaf_gbuf_alloc(&b->cache, be, cache_bytes, canary, 0) != MLAF_OK ||
        mlaf_gbuf_alloc(&b->kpe, be, (size_t)(T * d->R) * es, NULL, 0) != MLAF_OK ||
        mlaf_gbuf_alloc(&b->ec, be, sizeof zero, &zero, 0) != MLAF_OK ||
        mlaf_gbuf_alloc(&b->scale, be, sizeof scale, &scale, 0) != MLAF_OK ||
        mlaf_gbuf_alloc(&b->q, be, (size_t)(T * d->Q) * es + es, NULL, 0) != MLAF_OK)
        return MLAF_ERR_OUT_OF_MEMORY;
    const mlaf_tensor tl = mlaf_tensor_2d(b->lat.ptr, dt, T, W, W);
    const mlaf_tensor twq = mlaf_tensor_1d(b->w.ptr, MLAF_F32, d->Q);
    const mlaf_tensor twk = mlaf_tensor_1d((float *)b->w.ptr + d->Q, MLAF_F32, d->C);
    const mlaf_tensor tp = mlaf_tensor_1d(b->pos.ptr, MLAF_I64, T), ts = mlaf_tensor_1d(b->slot.ptr, MLAF_I64, T);
    const mlaf_tensor tcs = mlaf_tensor_2d(b->cs.ptr, MLAF_F32, 1, d->R, d->R);
    const int64_t rec = f == MLAF_KV_PLAIN ? d->C + d->R : mlaf_kv_record_bytes(f, cdt, d->C, d->R);
    const mlaf_tensor tc = mlaf_tensor_3d(b->cache.ptr, cdt, T, 1, rec, rec, rec);
    const mlaf_tensor tkp = mlaf_tensor_2d(b->kpe.ptr, dt, T, d->R, d->R);
    const mlaf_tensor tq = mlaf_tensor_2d(b->q.ptr, dt, T, d->Q, d->Q);
    const mlaf_tensor tec = mlaf_tensor_1d(b->ec.ptr, MLAF_I32, 1), tsc = mlaf_tensor_1d(b->scale.ptr, MLAF_F32, 1);
    const mlaf_kv_cache_desc cd = {f, &tc, NULL, f == MLAF_KV_FP8 ? &tsc : NULL, NULL, MLAF_FP8_DIV, MLAF_TILE_AMAX};
    const mlaf_mla_kv_cache_params p = {d->Q, d->C, d->R, 1e-5f, 1e-5f, style, 0};
    const int none = style == MLAF_ROPE_NONE;
    mlaf_status st = mlaf_mla_kv_cache_fmt(ctx, &p, &tl, d->Q ? &twq : NULL, &twk, none && !with_pos ? NULL : &tp,
                                           none && !with_pos ? NULL : &tcs, &ts, &cd, d->Q ? &tq : NULL, NULL, &tkp, &tec);
    if (st == MLAF_OK) st = mlaf_context_sync(ctx);
    if (st == MLAF_OK) st = mlaf_gbuf_download(&b->cache);
    if (st == MLAF_OK) st = mlaf_gbuf_download(&b->kpe);
    if (st == MLAF_OK) st = mlaf_gbuf_download(&b->ec);
    return st;
}

static void kv_case(mlaf_context *ctx, const dims *d, mlaf_dtype dt, mlaf_kv_format f, mlaf_dtype cdt, int64_t T,
                    int with_pos) {
    const size_t es = mlaf_dtype_size(dt);
    const int32_t W = d->Q + d->C + d->R;
    char name[224];
    snprintf(name, sizeof name, "ROPE_NONE_KV(Q=%d,C=%d,R=%d,T=%lld,dtype=%s,cache=%s/%s,%s,backend=%s)", d->Q, d->C,
             d->R, (long long)T, mlaf_dtype_name(dt), mlaf_kv_format_name(f), mlaf_dtype_name(cdt),
             with_pos ? "bad-positions" : "no-positions", mlaf_backend_name(mlaf_context_backend(ctx)));
    const int64_t rec = f == MLAF_KV_PLAIN ? (d->C + d->R) * (int64_t)mlaf_dtype_size(cdt)
                                           : mlaf_kv_record_bytes(f, cdt, d->C, d->R);
    const size_t cache_bytes = (size_t)(T * rec);
    unsigned char *lat = malloc((size_t)(T * W) * es), *canary = malloc(cache_bytes), *keep = malloc(cache_bytes);
    unsigned char *kpe = malloc((size_t)(T * d->R) * es);
    int64_t *pos = malloc(sizeof(int64_t) * (size_t)T), *slot = malloc(sizeof(int64_t) * (size_t)T);
    float cs[128];
    mlaf_rng rng;
    mlaf_rng_seed(&rng, 0x7e5e0000u + (uint64_t)T * 31u + (uint64_t)dt * 7u + (uint64_t)f);
    mlaf_fill_normal(&rng, lat, dt, (size_t)(T * W), 0.0, 2.0);
    for (int64_t i = 0; i < T * W; i++) /* no zeros: -0 - 0 and +0 would differ from the identity rotation */
        if (mlaf_load_f32(lat, dt, i) == 0.0f) mlaf_store_f32(lat, dt, i, 0.25f);
    for (int32_t i = 0; i < d->R; i++) cs[i] = i < d->R / 2 ? 1.0f : 0.0f;
    for (int64_t t = 0; t < T; t++) {
        slot[t] = t % 5 == 3 ? -1 : t;
        pos[t] = t % 3 == 1 ? -1 - t : t % 3 == 2 ? 1000000 + t : 0; /* out of range of the 1-row table */
    }
    memset(canary, 0xAB, cache_bytes);
    kv_bufs a, b;
    char why[256] = "";
    int ok = 1;
    mlaf_status sa = kv_call(ctx, d, dt, f, cdt, T, MLAF_ROPE_NONE, with_pos, lat, pos, slot, cs, cache_bytes, canary, &a);
    for (int64_t t = 0; t < T; t++) pos[t] = 0;
    mlaf_status sb = kv_call(ctx, d, dt, f, cdt, T, MLAF_ROPE_INTERLEAVED, 1, lat, pos, slot, cs, cache_bytes, canary, &b);
    if (sa != MLAF_OK || sb != MLAF_OK) {
        ok = 0;
        snprintf(why, sizeof why, "none %s, identity %s: %s", mlaf_status_name(sa), mlaf_status_name(sb),
                 mlaf_context_last_error(ctx));
    } else if (memcmp(a.cache.body, b.cache.body, cache_bytes) != 0) {
        ok = 0, snprintf(why, sizeof why, "cache bytes differ from the identity table's");
    } else if (memcmp(a.kpe.body, b.kpe.body, (size_t)(T * d->R) * es) != 0) {
        ok = 0, snprintf(why, sizeof why, "k_pe bytes differ from the identity table's");
    } else if (*(const int32_t *)a.ec.body != 0) {
        ok = 0, snprintf(why, sizeof why, "error_count %d, expected 0 (no position is read)", *(const int32_t *)a.ec.body);
    } else {
        memcpy(keep, a.cache.body, cache_bytes);
        memcpy(kpe, a.kpe.body, (size_t)(T * d->R) * es);
        for (int64_t t = 0; t < T && ok; t++) { /* the latent's own bits in k_pe and a same-dtype plain cache */
            const unsigned char *src = lat + (size_t)(t * W + d->Q + d->C) * es;
            if (memcmp(kpe + (size_t)(t * d->R) * es, src, (size_t)d->R * es) != 0)
                ok = 0, snprintf(why, sizeof why, "token %lld: k_pe is not the latent's rope bits", (long long)t);
            if (ok && f == MLAF_KV_PLAIN && cdt == dt && slot[t] >= 0 &&
                memcmp(keep + (size_t)(slot[t] * rec) + (size_t)d->C * es, src, (size_t)d->R * es) != 0)
                ok = 0, snprintf(why, sizeof why, "token %lld: the cache's rope part is not the latent's bits", (long long)t);
            if (ok && slot[t] < 0 && keep[(size_t)(t * rec)] != 0xAB)
                ok = 0, snprintf(why, sizeof why, "token %lld (slot -1): its cache row was written", (long long)t);
        }
    }
    tl_case(ok, name, "%s", why);
    kv_free(&a);
    kv_free(&b);
    free(lat), free(canary), free(keep), free(kpe), free(pos), free(slot);
}

/* rope_q: in place (q untouched), q_out and head_norm against the identity table's. */
static void rope_q_case(mlaf_context *ctx, mlaf_dtype dt, int64_t T, int form) {
    const mlaf_backend be = mlaf_context_backend(ctx);
    const int32_t H = 3, NOPE = 24, R = 64, D = NOPE + R;
    const size_t es = mlaf_dtype_size(dt), n = (size_t)(T * H * D);
    static const char *const forms[3] = {"in-place", "q_out", "head_norm"};
    char name[160];
    snprintf(name, sizeof name, "ROPE_NONE_Q(T=%lld,dtype=%s,%s,backend=%s)", (long long)T, mlaf_dtype_name(dt),
             forms[form], mlaf_backend_name(be));
    unsigned char *q = malloc(n * es);
    int64_t *pos = calloc((size_t)T, sizeof(int64_t));
    float cs[64];
    for (int32_t i = 0; i < R; i++) cs[i] = i < R / 2 ? 1.0f : 0.0f;
    mlaf_rng rng;
    mlaf_rng_seed(&rng, 0x7e5e1000u + (uint64_t)T + (uint64_t)form * 977u + (uint64_t)dt);
    mlaf_fill_normal(&rng, q, dt, n, 0.0, 1.5);
    for (size_t i = 0; i < n; i++)
        if (mlaf_load_f32(q, dt, (int64_t)i) == 0.0f) mlaf_store_f32(q, dt, (int64_t)i, 0.25f);
    mlaf_gbuf g[2][4]; /* per style: q, q_out, positions, cos_sin */
    memset(g, 0, sizeof g);
    mlaf_status st = MLAF_OK;
    for (int s = 0; s < 2 && st == MLAF_OK; s++) {
        if (mlaf_gbuf_alloc(&g[s][0], be, n * es, q, 0) != MLAF_OK || mlaf_gbuf_alloc(&g[s][1], be, n * es, NULL, 0) != MLAF_OK ||
            mlaf_gbuf_alloc(&g[s][2], be, sizeof(int64_t) * (size_t)T, pos, 0) != MLAF_OK ||
            mlaf_gbuf_alloc(&g[s][3], be, sizeof cs, cs, 0) != MLAF_OK) {
            st = MLAF_ERR_OUT_OF_MEMORY;
            break;
        }
        const mlaf_tensor tq = mlaf_tensor_3d(g[s][0].ptr, dt, T, H, D, H * D, D);
        const mlaf_tensor to = mlaf_tensor_3d(g[s][1].ptr, dt, T, H, D, H * D, D);
        const mlaf_tensor tp = mlaf_tensor_1d(g[s][2].ptr, MLAF_I64, T);
        const mlaf_tensor tcs = mlaf_tensor_2d(g[s][3].ptr, MLAF_F32, 1, R, R);
        const mlaf_rope_params rp = {R, s ? MLAF_ROPE_INTERLEAVED : MLAF_ROPE_NONE, form == 2, 1e-6f};
        st = form == 1 ? mlaf_rope_q_out(ctx, &rp, &tq, s ? &tp : NULL, s ? &tcs : NULL, &to, NULL)
                       : mlaf_rope_q(ctx, &rp, &tq, s ? &tp : NULL, s ? &tcs : NULL, NULL);
        if (st == MLAF_OK) st = mlaf_context_sync(ctx);
        if (st == MLAF_OK) st = mlaf_gbuf_download(&g[s][0]);
        if (st == MLAF_OK) st = mlaf_gbuf_download(&g[s][1]);
    }
    const int o = form == 1;
    if (st != MLAF_OK)
        tl_case(0, name, "%s: %s", mlaf_status_name(st), mlaf_context_last_error(ctx));
    else if (form == 0)
        tl_case(memcmp(g[0][0].body, q, n * es) == 0, name, "q changed in place under style none");
    else
        tl_case(memcmp(g[0][o].body, g[1][o].body, n * es) == 0 && memcmp(g[0][0].body, g[1][0].body, n * es) == 0,
                name, "bytes differ from the identity table's");
    for (int s = 0; s < 2; s++)
        for (int k = 0; k < 4; k++)
            if (g[s][k].dev_base) mlaf_gbuf_free(&g[s][k]);
    free(q), free(pos);
}

static void suite(mlaf_context *ctx, int quick, const char *extra) {
    const dims kimi = {1536, 512, 64}, odd = {67, 131, 10}, noq = {0, 512, 64};
    const mlaf_dtype dts[3] = {MLAF_BF16, MLAF_F16, MLAF_F32};
    const int64_t Ts[3] = {1, 37, 1100};
    for (int di = 0; di < 3; di++)
        for (int ti = 0; ti < (quick || extra ? 2 : 3); ti++) {
            const mlaf_dtype dt = dts[di], other = dts[(di + 1) % 3];
            kv_case(ctx, &kimi, dt, MLAF_KV_PLAIN, dt, Ts[ti], ti == 1);
            kv_case(ctx, &kimi, dt, MLAF_KV_PLAIN, other, Ts[ti], 0);
            kv_case(ctx, &odd, dt, MLAF_KV_PLAIN, dt, Ts[ti], ti == 2);
            kv_case(ctx, ti == 1 ? &noq : &kimi, dt, MLAF_KV_FP8, MLAF_U8, Ts[ti], 0);
            if (dt == MLAF_BF16) kv_case(ctx, &kimi, dt, MLAF_KV_FP8_DS_MLA, MLAF_U8, Ts[ti], ti == 0);
            for (int form = 0; form < 3; form++) rope_q_case(ctx, dt, Ts[ti], form);
        }
}

/* The style where nothing may take it: the indexer key branch and kv_rope_tail (CPU; nothing written). */
static void rejections(void) {
    mlaf_context *ctx = tl_context(MLAF_BACKEND_CPU);
    if (!ctx) return;
    const int64_t T = 4;
    uint16_t lat[4 * 640], cache[4 * 576], w[512], ik[4 * 128], iw[128], ib[128];
    int64_t pos[4] = {0, 1, 2, 3}, slot[4] = {0, 1, 2, 3};
    float cs[4 * 64];
    unsigned char icache[4 * 132];
    memset(lat, 0x3c, sizeof lat), memset(w, 0x3c, sizeof w), memset(ik, 0x3c, sizeof ik);
    memset(iw, 0x3c, sizeof iw), memset(ib, 0, sizeof ib), memset(cs, 0, sizeof cs);
    memset(cache, 0xAB, sizeof cache), memset(icache, 0xAB, sizeof icache);
    mlaf_tensor tl = mlaf_tensor_2d(lat, MLAF_BF16, T, 576, 640), tw = mlaf_tensor_1d(w, MLAF_BF16, 512);
    mlaf_tensor tp = mlaf_tensor_1d(pos, MLAF_I64, T), ts = mlaf_tensor_1d(slot, MLAF_I64, T);
    mlaf_tensor tcs = mlaf_tensor_2d(cs, MLAF_F32, 4, 64, 64), tc = mlaf_tensor_3d(cache, MLAF_BF16, T, 1, 576, 576, 576);
    mlaf_tensor tik = mlaf_tensor_2d(ik, MLAF_BF16, T, 128, 128), tiw = mlaf_tensor_1d(iw, MLAF_BF16, 128);
    mlaf_tensor tib = mlaf_tensor_1d(ib, MLAF_BF16, 128), tic = mlaf_tensor_2d(icache, MLAF_U8, T, 132, 132);
    const mlaf_kv_cache_desc cd = {MLAF_KV_PLAIN, &tc, NULL, NULL, NULL, MLAF_FP8_DIV, MLAF_TILE_AMAX};
    const mlaf_mla_kv_cache_params p = {0, 512, 64, 1e-6f, 1e-6f, MLAF_ROPE_NONE, 0};
    const mlaf_indexer_params ip = mlaf_indexer_params_from_config(NULL);
    mlaf_indexer_k ix = {&tik, &tiw, &tib, &tic, NULL, NULL, 1, 0};
    mlaf_status st = mlaf_mla_kv_cache_dsa(ctx, &p, &tl, NULL, &tw, &tp, &tcs, &ts, &cd, NULL, NULL, NULL, NULL, &ip, &ix);
    int untouched = 1;
    for (size_t i = 0; i < sizeof icache; i++) untouched &= icache[i] == 0xAB;
    for (size_t i = 0; i < sizeof cache / 2; i++) untouched &= cache[i] == 0xABAB;
    tl_case(st == MLAF_ERR_INVALID_ARGUMENT && untouched && strstr(mlaf_context_last_error(ctx), "none"),
            "ROPE_NONE_REJECTED(mla_kv_cache_dsa)", "%s: %s (caches untouched %d)", mlaf_status_name(st),
            mlaf_context_last_error(ctx), untouched);
    mlaf_tensor tl4 = mlaf_tensor_2d(lat, MLAF_BF16, T, 512, 640), tc4 = mlaf_tensor_3d(cache, MLAF_BF16, T, 1, 512, 512, 512);
    const mlaf_mla_kv_cache_params p4 = {0, 512, 0, 1e-6f, 1e-6f, MLAF_ROPE_NONE, 64};
    st = mlaf_mla_kv_cache(ctx, &p4, &tl4, NULL, &tw, &tp, &tcs, &ts, &tc4, NULL, NULL, NULL, NULL);
    untouched = 1;
    for (size_t i = 0; i < sizeof cache / 2; i++) untouched &= cache[i] == 0xABAB;
    tl_case(st == MLAF_ERR_INVALID_ARGUMENT && untouched, "ROPE_NONE_REJECTED(kv_rope_tail)", "%s: %s",
            mlaf_status_name(st), mlaf_context_last_error(ctx));
    mlaf_context_free(ctx);
}

int main(void) {
    rejections();
    return tl_run_suite("ROPE_NONE", suite);
}
