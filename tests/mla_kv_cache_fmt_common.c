/*
 * mla_kv_cache_fmt_common.c — one direct mla_kv_cache_fmt call for the cache-format tests (see
 * mla_kv_cache_fmt_common.h).
 */
#include "mla_kv_cache_fmt_common.h"

size_t cache_bytes(const kv_call *k) { return (size_t)(k->nb * k->s0) * mlaf_dtype_size(k->cdt); }
size_t kpe_bytes(const kv_call *k) { return (size_t)(k->nb * k->ks0) * mlaf_dtype_size(k->cdt); }

/* Host images: latent rows ~N(0, 1) (every 5th row x 40), weights ~N(1, 0.25), positions in
 * [0, maxpos), slots a permutation of the cache with every 6th token skipped (-1). */
int kv_make(kv_call *k, mlaf_backend be, int32_t Q, int32_t C, int32_t R, int64_t T, int64_t bs,
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

unsigned char *canary_image(size_t n, uint64_t seed) {
    unsigned char *p = malloc(n ? n : 1);
    if (!p) return NULL;
    mlaf_rng rng;
    mlaf_rng_seed(&rng, seed);
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(mlaf_rng_u64(&rng) >> 56);
    return p;
}

/* Backend buffers from the host images (after a test's changes to them). */
int kv_alloc(kv_call *k) {
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

void kv_free(kv_call *k) {
    mlaf_gbuf *g[] = {&k->gl,    &k->gwq, &k->gwkv, &k->gpos,   &k->gslot, &k->gcs,    &k->gscale, &k->gq,    &k->gk,
                      &k->gp,    &k->gec, &k->gcache, &k->gkpe, &k->gamax, &k->gcache2, &k->gkpe2, &k->gamax2};
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++)
        if (g[i]->host) mlaf_gbuf_free(g[i]);
    free(k->lat), free(k->wq), free(k->wkv), free(k->cs), free(k->pos), free(k->slot), free(k->canary),
        free(k->kcanary);
    memset(k, 0, sizeof *k);
}

void kv_args_of(const kv_call *k, int second, kv_args *a) {
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

mlaf_status kv_invoke(mlaf_context *ctx, const kv_call *k, kv_args *a) {
    mlaf_status s = mlaf_mla_kv_cache_fmt(ctx, &a->p, &a->lat, k->Q > 0 ? &a->wq : NULL, &a->wkv,
                                          k->R > 0 ? &a->pos : NULL, k->R > 0 ? &a->cs : NULL, &a->slot, &a->d,
                                          a->use_q ? &a->q : NULL, a->use_k ? &a->k : NULL,
                                          a->use_pe && k->R > 0 ? &a->pe : NULL, a->use_ec ? &a->ec : NULL);
    if (s == MLAF_OK) s = mlaf_context_sync(ctx);
    return s;
}

mlaf_status kv_download(kv_call *k) {
    mlaf_gbuf *g[] = {&k->gq, &k->gk, &k->gp, &k->gec, &k->gcache, &k->gkpe, &k->gamax, &k->gcache2, &k->gkpe2, &k->gamax2};
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
        mlaf_status s = mlaf_gbuf_download(g[i]);
        if (s != MLAF_OK) return s;
    }
    return MLAF_OK;
}

/* The byte of record byte i of a slot (the rope part in kpe when kept apart). */
const unsigned char *rec_byte(const kv_call *k, const mlaf_gbuf *cache, const mlaf_gbuf *kpe, int64_t slot,
                                     int64_t i) {
    const int64_t b = slot / k->bs, o = slot % k->bs;
    if (k->kpe && i >= k->C) return (const unsigned char *)kpe->body + b * k->ks0 + o * k->ks1 + (i - k->C);
    return (const unsigned char *)cache->body + b * k->s0 + o * k->s1 + i;
}

/* Half an e4m3 ulp at |y| (the quantized value), plus the f32 rounding of y itself. */
double e4m3_bound(double y) {
    const double a = fabs(y);
    int e;
    frexp(a, &e);
    const double ulp = a < 0x1p-6 ? 0x1p-9 : ldexp(1.0, e - 4);
    return ulp / 2 + ldexp(a, -23) + 0x1p-149;
}

