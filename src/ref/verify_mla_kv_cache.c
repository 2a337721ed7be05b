/*
 * verify_mla_kv_cache.c — mlaf_verify_mla_kv_cache: a case on the context's backend (a paged
 * cache of canary bytes, distinct slots in random order, some skipped and some rejected), the
 * op, and q, k_nope, the roped k_pe and every cache row a valid slot names against the float64
 * oracle (ref_norm.c). How buffers are judged: verify_case.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "verify_case.h"

typedef struct mla_arg {
    const norm_bufs *b;
    const mlaf_verify_case *c;
    int32_t Q, C, R;
    int want_k_nope, want_k_pe;
    const vbuf *pos_b, *slot_b, *cache_b;
    const float *cs_host;
    int64_t cs_stride;
    const int64_t *pos, *slots;
    int64_t num_blocks, bs, s0, s1;
} mla_arg;

/* Tokens [t0, t0 + n): q, k_nope, the roped k_pe and the cache row each valid token names;
 * *errors counts the tokens the oracle rejects. */
static void mla_chunk(const void *arg, void *scratch, int64_t t0, int64_t n, judge *j,
                      int64_t *errors) {
    const mla_arg *a = (const mla_arg *)arg;
    const norm_bufs *b = a->b;
    const mlaf_verify_case *c = a->c;
    const int32_t Q = a->Q, C = a->C, R = a->R;
    const int64_t CR = (int64_t)C + R, bs = a->bs;
    const size_t es = mlaf_dtype_size(c->dtype);
    double *rq = (double *)scratch, *rk = rq + CHUNK_TOKENS * (Q > 0 ? Q : 1);
    double *rp = rk + CHUNK_TOKENS * C, *rows = rp + CHUNK_TOKENS * (R > 0 ? R : 1);
    double *allow = rows + CHUNK_TOKENS * CR;
    int8_t *status = (int8_t *)(allow + (R > 0 ? R : 1) * 2);
    vview vcache = {(vbuf *)a->cache_b, c->cache_dtype, 0, 0};
    mlaf_kv_cache_job hj;
    memset(&hj, 0, sizeof hj);
    hj.norm = host_norm_job(b, c, t0, n);
    hj.rope.R = R;
    hj.rope.style = c->rope_style;
    hj.rope.positions = a->pos_b->init ? a->pos_b->init + (size_t)t0 * mlaf_dtype_size(c->index_dtype) : NULL;
    hj.rope.pos_dt = c->index_dtype;
    hj.rope.cos_sin = a->cs_host;
    hj.rope.cos_sin_stride = a->cs_stride;
    hj.rope.max_pos = VERIFY_MAX_POS;
    hj.slots = a->slot_b->init + (size_t)t0 * mlaf_dtype_size(c->index_dtype);
    hj.slot_dt = c->index_dtype;
    hj.n_map = n;
    hj.cache_dt = c->cache_dtype;
    hj.num_blocks = a->num_blocks;
    hj.block_size = bs;
    hj.cache_s0 = a->s0;
    hj.cache_s1 = a->s1;
    mlaf_ref_mla_kv_cache(&hj, Q > 0 ? rq : NULL, rk, rp, rows, status);
    for (int64_t u = 0; u < n; u++) {
        int64_t t = t0 + u;
        *errors += status[u] < 0;
        for (int32_t i = 0; i < Q; i++) judge_value(j, &b->vq, "q", t, i, rq[u * Q + i], 0);
        if (a->want_k_nope)
            for (int32_t i = 0; i < C; i++) judge_value(j, &b->vk, "k_nope", t, i, rk[u * C + i], 0);
        if (status[u] < 0) continue; /* nothing of the rope part or cache row may be written */
        if (R > 0) {
            /* rounding allowance from the un-rotated values */
            double *x = allow + R;
            const char *lrow = (const char *)b->latent.init + (size_t)(t * b->LS) * es;
            for (int32_t i = 0; i < R; i++) x[i] = mlaf_load_f32(lrow, c->dtype, (int64_t)Q + C + i);
            rope_allowance(x, R, c->rope_style, a->cs_host + a->pos[t] * a->cs_stride, allow);
            if (a->want_k_pe)
                for (int32_t i = 0; i < R; i++) judge_value(j, &b->vp, "k_pe", t, i, rp[u * R + i], allow[i]);
        }
        if (status[u] == 1) {
            int64_t slot = a->slots[t];
            vcache.off = (slot / bs) * a->s0 + (slot % bs) * a->s1;
            for (int64_t i = 0; i < C; i++)
                judge_value(j, &vcache, "kv_cache(k_nope part)", t, i, rows[u * CR + i], 0);
            for (int64_t i = 0; i < R; i++)
                judge_value(j, &vcache, "kv_cache(rope part)", t, C + i, rows[u * CR + C + i], allow[i]);
        }
    }
}

mlaf_status mlaf_verify_mla_kv_cache(mlaf_context *ctx, const mlaf_verify_case *c,
                                     mlaf_verify_result *r) {
    mlaf_status s = check_case_common(c, r);
    if (s != MLAF_OK) return s;
    if (c->block_size < 1) return MLAF_ERR_INVALID_ARGUMENT;
    const int32_t Q = c->cfg.q_lora_rank, C = c->cfg.kv_lora_rank, R = c->cfg.qk_rope_head_dim;
    const int64_t T = c->T, bs = c->block_size, CR = (int64_t)C + R;
    const mlaf_backend be = mlaf_context_backend(ctx);
    const int st = c->strided != 0;
    mlaf_rng rng;
    mlaf_rng_seed(&rng, c->seed);
    norm_bufs b;
    vbuf pos_b, slot_b, cs_b, cache_b, ec_b;
    memset(&pos_b, 0, sizeof pos_b);
    memset(&slot_b, 0, sizeof slot_b);
    memset(&cs_b, 0, sizeof cs_b);
    memset(&cache_b, 0, sizeof cache_b);
    memset(&ec_b, 0, sizeof ec_b);
    int64_t *pos = NULL, *slots = NULL, *perm = NULL;
    unsigned char *canary = NULL;
    const int want_k_nope = c->no_k_pe != 2, want_k_pe = !c->no_k_pe;
    s = norm_bufs_make(&b, be, c, &rng, want_k_nope, want_k_pe);
    if (s != MLAF_OK) goto done;

    /* Cache: room for every token and a few spare blocks; distinct slots in random order,
     * some negative (skip), some past the end (rejected). */
    const int64_t num_blocks = (T + bs - 1) / bs + 3, cap = num_blocks * bs;
    const int64_t s1 = CR + (st ? 3 : 0), s0 = bs * s1 + (st ? 5 : 0);
    pos = (int64_t *)malloc(sizeof(int64_t) * (size_t)(T + 1));
    slots = (int64_t *)malloc(sizeof(int64_t) * (size_t)(T + 1));
    perm = (int64_t *)malloc(sizeof(int64_t) * (size_t)cap);
    if (!pos || !slots || !perm) {
        s = MLAF_ERR_OUT_OF_MEMORY;
        goto done;
    }
    for (int64_t i = 0; i < cap; i++) perm[i] = i;
    for (int64_t i = cap - 1; i > 0; i--) {
        int64_t k = (int64_t)(mlaf_rng_u64(&rng) % (uint64_t)(i + 1)), tmp = perm[i];
        perm[i] = perm[k];
        perm[k] = tmp;
    }
    for (int64_t t = 0; t < T; t++) {
        slots[t] = perm[t];
        if (t % 7 == 2) slots[t] = -1 - t % 3;
        if (t % 11 == 4) slots[t] = cap + t % 4;
    }
    make_positions(&rng, pos, T, VERIFY_MAX_POS);
    if ((s = index_buf(&slot_b, "slot_mapping", be, slots, T, c->index_dtype, st)) != MLAF_OK) goto done;
    const int64_t cs_stride = R + (st ? 3 : 0);
    if (R > 0) {
        if ((s = index_buf(&pos_b, "positions", be, pos, T, c->index_dtype, st)) != MLAF_OK) goto done;
        if ((s = cos_sin_buf(&cs_b, be, R, cs_stride, st)) != MLAF_OK) goto done;
    }
    const size_t ces = mlaf_dtype_size(c->cache_dtype);
    size_t cache_bytes = (size_t)(num_blocks * s0) * ces;
    canary = (unsigned char *)malloc(cache_bytes ? cache_bytes : 1);
    if (!canary) {
        s = MLAF_ERR_OUT_OF_MEMORY;
        goto done;
    }
    {
        /* byte k is draw k: on all threads, the same bytes */
        const mlaf_rng r0 = rng;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
        for (int64_t k = 0; k < (int64_t)cache_bytes; k++) {
            mlaf_rng rk = mlaf_rng_skipped(&r0, (uint64_t)k);
            canary[k] = (unsigned char)(mlaf_rng_u64(&rk) >> 56);
        }
        rng = mlaf_rng_skipped(&r0, (uint64_t)cache_bytes);
    }
    if ((s = vbuf_alloc(&cache_b, "kv_cache", be, cache_bytes, canary, st ? ces : 0)) != MLAF_OK) goto done;
    if ((s = error_count_buf(&ec_b, be)) != MLAF_OK) goto done;

    mlaf_mla_kv_cache_params p = {Q, C, R, c->cfg.rms_norm_eps, c->cfg.rms_norm_eps, c->rope_style};
    mlaf_tensor lt = mlaf_tensor_2d(b.latent.g.ptr, c->dtype, T, (int64_t)Q + C + R, b.LS);
    mlaf_tensor wq = mlaf_tensor_1d(b.w_q.g.ptr, c->weight_dtype, Q);
    mlaf_tensor wkv = mlaf_tensor_1d(b.w_kv.g.ptr, c->weight_dtype, C);
    mlaf_tensor tpos = mlaf_tensor_1d(pos_b.g.ptr, c->index_dtype, T);
    mlaf_tensor tcs = mlaf_tensor_2d(cs_b.g.ptr, MLAF_F32, VERIFY_MAX_POS, R, cs_stride);
    mlaf_tensor tslot = mlaf_tensor_1d(slot_b.g.ptr, c->index_dtype, T);
    mlaf_tensor tcache = mlaf_tensor_3d(cache_b.g.ptr, c->cache_dtype, num_blocks, bs, CR, s0, s1);
    mlaf_tensor tq = tensor_of(&b.vq, T, Q), tk = tensor_of(&b.vk, T, C), tp = tensor_of(&b.vp, T, R);
    mlaf_tensor tec = mlaf_tensor_1d(ec_b.g.ptr, MLAF_I32, 1);
    s = mlaf_mla_kv_cache(ctx, &p, &lt, Q > 0 ? &wq : NULL, &wkv, R > 0 ? &tpos : NULL,
                          R > 0 ? &tcs : NULL, &tslot, &tcache, Q > 0 ? &tq : NULL,
                          want_k_nope ? &tk : NULL, want_k_pe ? &tp : NULL, &tec);
    if (s != MLAF_OK) {
        snprintf(r->detail, sizeof r->detail, "mlaf_mla_kv_cache: %s: %s", mlaf_status_name(s),
                 mlaf_context_last_error(ctx));
        goto done;
    }
    if ((s = mlaf_context_sync(ctx)) != MLAF_OK) goto done;
    vbuf *all[11] = {&b.latent, &b.w_q, &b.w_kv, &b.q, &b.k_nope, &b.k_pe,
                     &pos_b, &slot_b, &cs_b, &cache_b, &ec_b};
    if ((s = fetch_all(all, 11)) != MLAF_OK) goto done;
    if (Q > 0 || want_k_nope) corrupt_outputs(c, Q > 0 ? &b.vq : &b.vk);

    judge j = {r, 0, 0.0, 0};
    const mla_arg ma = {&b, c, Q, C, R, want_k_nope, want_k_pe, &pos_b, &slot_b, &cache_b,
                        (const float *)cs_b.init, cs_stride, pos, slots, num_blocks, bs, s0, s1};
    int64_t errors = 0;
    const size_t scratch = sizeof(double) * (CHUNK_TOKENS * ((size_t)(Q > 0 ? Q : 1) + (size_t)C +
                                                             (size_t)(R > 0 ? R : 1) + (size_t)CR) +
                                             (size_t)(R > 0 ? R : 1) * 2) +
                           CHUNK_TOKENS;
    if ((s = run_chunks(T, CHUNK_TOKENS, scratch, mla_chunk, &ma, &j, &errors)) != MLAF_OK) goto done;
    if (!j.failed) judge_error_count(&j, &ec_b, errors);
    int64_t untouched = 0;
    for (int i = 0; i < 11; i++) untouched += judge_untouched(&j, all[i]);
    judge_finish(&j, "mla_kv_cache", c, untouched);
done:
    free(pos);
    free(slots);
    free(perm);
    free(canary);
    norm_bufs_free(&b);
    vbuf_free(&pos_b);
    vbuf_free(&slot_b);
    vbuf_free(&cs_b);
    vbuf_free(&cache_b);
    vbuf_free(&ec_b);
    return s;
}
