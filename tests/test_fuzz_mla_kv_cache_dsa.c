/*
 * test_fuzz_mla_kv_cache_dsa.c — random calls of mlaf_mla_kv_cache_dsa (the DSA indexer key branch) and of
 * mla_kv_cache_fmt with kv_rope_tail into the fp8_v4 cache (one generator, fuzz_dsa(f, v4)), judged as
 * the newer entry points are (fuzz_common.c).
 * The driver, the harness and what every call must satisfy: fuzz_common.h.
 */
#include "fuzz_common.h"


/* -- mla_kv_cache_dsa (the DSA indexer key branch) and kv_rope_tail into fp8_v4 -- */
typedef struct dsa_case {
    mlaf_mla_kv_cache_params kp;
    mlaf_indexer_params ip;
    mlaf_indexer_k ik;
    mlaf_kv_cache_desc cd;
    int v4;
    int64_t span; /* bytes one index cache view spans */
} dsa_case;

static int dsa_params_mutate(fz *f, void *vp) {
    dsa_case *c = (dsa_case *)vp;
    mlaf_rng *r = &f->r;
    static const float bad_eps[5] = {0.0f, -1e-6f, NAN, INFINITY, -INFINITY};
    switch (U(r, c->v4 ? 6 : 7)) {
    case 0: c->kp.eps_kv = bad_eps[U(r, 5)]; note(f, " eps_kv=%g", (double)c->kp.eps_kv); return 1;
    case 1:
        if (c->v4) {
            static const int32_t tails[5] = {-2, 0, 62, 66, 63};
            c->kp.kv_rope_tail = tails[U(r, 5)];
        } else {
            c->kp.kv_rope_tail = 2 * (int32_t)RANGE(r, 1, c->kp.kv_lora_rank / 2 > 1 ? c->kp.kv_lora_rank / 2 : 1);
            if (c->kp.kv_rope_tail > c->kp.kv_lora_rank) c->kp.kv_rope_tail = -2;
        }
        note(f, " kv_rope_tail=%d", c->kp.kv_rope_tail);
        return 1;
    case 2:
        c->kp.rope_dim = c->v4 ? (CHANCE(r, 0.5) ? 64 : -2) : (CHANCE(r, 0.5) ? 32 : 66);
        note(f, " rope_dim=%d", c->kp.rope_dim);
        return 1;
    case 3:
        if (c->v4) {
            c->kp.kv_lora_rank = CHANCE(r, 0.5) ? 448 : 576;
            note(f, " kv_lora_rank=%d", c->kp.kv_lora_rank);
        } else {
            c->kp.style = (mlaf_rope_style)(CHANCE(r, 0.5) ? -1 : RANGE(r, 2, 9));
            note(f, " style=%d", (int)c->kp.style);
        }
        return 1;
    case 4:
        if (c->v4) {
            c->kp.style = CHANCE(r, 0.5) ? MLAF_ROPE_NEOX : (mlaf_rope_style)RANGE(r, 2, 9);
            note(f, " style=%d", (int)c->kp.style);
        } else {
            c->ik.copies = CHANCE(r, 0.5) ? -(int32_t)RANGE(r, 1, 3) : (int32_t)RANGE(r, 9, 40);
            note(f, " copies=%d", c->ik.copies);
        }
        return 1;
    case 5:
        if (c->v4) {
            c->cd.format = CHANCE(r, 0.5) ? MLAF_KV_FP8_DS_MLA : (mlaf_kv_format)(CHANCE(r, 0.5) ? -1 : RANGE(r, 4, 9));
            note(f, " cache.format=%d", (int)c->cd.format);
            return 1;
        }
        if (c->ik.copies < 2 || c->span <= 0) return 0;
        c->ik.copy_stride = c->span - RANGE(r, 1, c->span);
        note(f, " copy_stride=%lld < span %lld", (long long)c->ik.copy_stride, (long long)c->span);
        return 1;
    default: return indexer_params_mutate(f, &c->ip);
    }
}

static int fuzz_dsa(fz *f, int v4) {
    mlaf_rng *r = &f->r;
    set_state(f);
    dsa_case c;
    memset(&c, 0, sizeof c);
    c.v4 = v4;
    const mlaf_dtype dt = v4 ? MLAF_BF16 : FLOAT_DT(r);
    const int64_t T = draw_T(r) % (v4 ? 7 : 13);
    const int32_t Q = CHANCE(r, 0.25) ? 0 : (int32_t)RANGE(r, 1, 24), C = v4 ? 512 : (int32_t)RANGE(r, 1, 40), R = v4 ? 0 : 64;
    c.kp = (mlaf_mla_kv_cache_params){Q, C, R, (float)pow(10.0, -RANGE(r, 1, 8)), (float)pow(10.0, -RANGE(r, 1, 8)),
                                      v4 ? MLAF_ROPE_INTERLEAVED : (CHANCE(r, 0.5) ? MLAF_ROPE_INTERLEAVED : MLAF_ROPE_NEOX), v4 ? 64 : 0};
    c.ip = draw_ip(r);
    const int32_t W = Q + C + R;
    const unsigned wdts = DTM(dt) | DTM(MLAF_F32);
    fz_t lat, wq, wkv, q, kn, kp, pos, cs, slot, cache, ec, ik, iw, ib, icache, iout, topk;
    memset(&wq, 0, sizeof wq), memset(&q, 0, sizeof q), memset(&kn, 0, sizeof kn), memset(&kp, 0, sizeof kp);
    memset(&ec, 0, sizeof ec), memset(&iout, 0, sizeof iout), memset(&topk, 0, sizeof topk), memset(&ik, 0, sizeof ik);
    memset(&iw, 0, sizeof iw), memset(&ib, 0, sizeof ib), memset(&icache, 0, sizeof icache);
    fz_2d(f, &lat, "latent", dt, T, W, CHANCE(r, 0.4) ? 0 : RANGE(r, 1, 9), 1, 1.0, v4 ? DTM(MLAF_BF16) : DT_FLOATS, 3u, 1, 0);
    if (Q > 0) fz_1d(f, &wq, "w_q", CHANCE(r, 0.5) ? dt : MLAF_F32, Q, 1, 0.3, wdts, 1u, 1, 0);
    fz_1d(f, &wkv, "w_kv", CHANCE(r, 0.5) ? dt : MLAF_F32, C, 1, 0.3, wdts, 1u, 1, 0);
    if (Q > 0) {
        if (CHANCE(r, 0.2)) fz_columns(f, &q, "q", &lat, 0, Q, 3u);
        else fz_2d(f, &q, "q", dt, T, Q, RANGE(r, 0, 5), 0, 1, DTM(dt), 3u, 1, 1);
        q.required = 1;
    }
    if (CHANCE(r, 0.6)) {
        if (CHANCE(r, 0.2)) fz_columns(f, &kn, "k_nope", &lat, Q, C, 3u);
        else fz_2d(f, &kn, "k_nope", dt, T, C, RANGE(r, 0, 5), 0, 1, DTM(dt), 3u, 0, 1);
    }
    if (!v4 && CHANCE(r, 0.5)) fz_2d(f, &kp, "k_pe", dt, T, R, RANGE(r, 0, 5), 0, 1, DTM(dt), 3u, 0, 1);
    const int64_t max_pos = RANGE(r, 1, 30);
    fz_1d(f, &pos, "positions", INDEX_DT(r), T, 0, 0, DT_INDEX, 1u, 1, 0);
    fz_2d(f, &cs, "cos_sin", MLAF_F32, max_pos, 64, RANGE(r, 0, 4), 1, 1.0, DTM(MLAF_F32), 2u, 1, 0);
    fill_table(f, &cs, max_pos, 64);
    const int64_t nb = CHANCE(r, 0.05) ? 0 : RANGE(r, 1, v4 ? 3 : 4), bs = RANGE(r, 1, v4 ? 3 : 5), nslots = nb * bs;
    if (v4) { /* planar pages: stride[1] = 584, stride[0] a multiple of 16 >= block_size * 584, data 16-aligned */
        int64_t sh[3] = {nb, bs, 584}, st[3] = {(bs * 584 + 15) / 16 * 16 + 16 * RANGE(r, 0, 2), 584, 1};
        fz_tensor(f, &cache, "kv_cache", CHANCE(r, 0.5) ? MLAF_U8 : MLAF_FP8_E4M3, 3, sh, st, 2, 0, DTM(MLAF_U8) | DTM(MLAF_FP8_E4M3), 4u, 1, 1);
        cache.boff = 0;
        c.cd = (mlaf_kv_cache_desc){MLAF_KV_FP8_V4, NULL, NULL, NULL, NULL, MLAF_FP8_DIV, MLAF_TILE_AMAX};
    } else {
        int64_t s1 = C + R + (CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 4)), s0 = bs * s1 + (CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 7));
        int64_t sh[3] = {nb, bs, C + R}, st[3] = {s0, s1, 1};
        fz_tensor(f, &cache, "kv_cache", FLOAT_DT(r), 3, sh, st, 1, 1.0, DT_FLOATS, 4u, 1, 1);
        c.cd = (mlaf_kv_cache_desc){MLAF_KV_PLAIN, NULL, NULL, NULL, NULL, MLAF_FP8_DIV, MLAF_TILE_AMAX};
    }
    const int64_t N = CHANCE(r, 0.2) && T > 0 ? T - RANGE(r, 0, T < 3 ? T : 3) : T;
    fz_1d(f, &slot, "slot_mapping", INDEX_DT(r), N, 0, 0, DT_INDEX, 1u, 1, 0);
    slot.max0 = T;
    if (CHANCE(r, 0.7)) add_error_count(f, &ec);
    fill_positions(f, &pos, T, max_pos);
    fill_slots(f, &slot, N, nslots);
    if (!v4) { /* the indexer key branch */
        fz_2d(f, &ik, "index_k", dt, T, 128, CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 40), 1, 1.0, DTM(dt), 3u, 1, 0);
        const mlaf_dtype wdt = CHANCE(r, 0.5) ? dt : MLAF_F32;
        fz_1d(f, &iw, "index_weight", wdt, 128, 1, 0.5, wdts, 1u, 1, 0);
        fz_1d(f, &ib, "index_bias", wdt, 128, 1, 0.5, DTM(wdt), 1u, 1, 0);
        const int64_t bytes = 132 * bs + (CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 9));
        const int32_t copies = CHANCE(r, 0.7) ? (int32_t)U(r, 2) : (int32_t)RANGE(r, 2, 3);
        const int64_t bstride = bytes + (CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 5));
        c.span = nb == 0 ? 0 : (nb - 1) * bstride + bytes;
        const int64_t cstride = c.span + RANGE(r, 0, 7);
        int64_t sh[2] = {nb, bytes}, st[2] = {bstride, 1};
        fz_tensor(f, &icache, "index_cache", CHANCE(r, 0.5) ? MLAF_U8 : MLAF_FP8_E4M3, 2, sh, st, 2, 0, DTM(MLAF_U8) | DTM(MLAF_FP8_E4M3), 1u, 1, 1);
        if (copies > 1) { /* room for the copies, past the first view, in the same buffer */
            fz_buf *b = &f->b[icache.buf];
            size_t more = (size_t)(cstride * (copies - 1)) + 8;
            b->init = (unsigned char *)realloc(b->init, b->bytes + more);
            b->claim = (unsigned char *)realloc(b->claim, b->bytes + more);
            for (size_t k = 0; k < more; k++) b->init[b->bytes + k] = (unsigned char)(mlaf_rng_u64(r) >> 56), b->claim[b->bytes + k] = 0;
            b->bytes += more;
        }
        c.ik.copies = copies;
        c.ik.copy_stride = copies > 1 ? cstride : (int64_t)U(r, 5);
        if (CHANCE(r, 0.5)) {
            if (CHANCE(r, 0.3)) { /* in place over index_k */
                iout = ik;
                iout.name = "index_out";
                iout.required = 0;
                fz_register(f, &iout);
            } else {
                fz_2d(f, &iout, "index_out", dt, T, 128, RANGE(r, 0, 5), 0, 0, DTM(dt), 3u, 0, 1);
            }
            iout.output = 0; /* an alias of it onto index_k could be the allowed in-place form */
        }
        if (CHANCE(r, 0.4)) fz_2d(f, &topk, "topk_fill", MLAF_I32, T, RANGE(r, 1, 6), RANGE(r, 0, 3), 0, 0, DTM(MLAF_I32), 1u, 0, 1);
    }
    mutate(f, dsa_params_mutate, &c, &lat, Q, C);
    if (!fz_commit(f)) return -1;
    c.cd.cache = DEV(f, &cache);
    c.ik.index_k = DEV(f, &ik), c.ik.weight = DEV(f, &iw), c.ik.bias = DEV(f, &ib), c.ik.cache = DEV(f, &icache);
    c.ik.out = DEV(f, &iout), c.ik.topk_fill = DEV(f, &topk);
    mlaf_status s = v4 ? mlaf_mla_kv_cache_fmt(f->ctx, &c.kp, DEV(f, &lat), DEV(f, &wq), DEV(f, &wkv), DEV(f, &pos), DEV(f, &cs),
                                               DEV(f, &slot), &c.cd, DEV(f, &q), DEV(f, &kn), DEV(f, &kp), DEV(f, &ec))
                       : mlaf_mla_kv_cache_dsa(f->ctx, &c.kp, DEV(f, &lat), DEV(f, &wq), DEV(f, &wkv), DEV(f, &pos), DEV(f, &cs),
                                               DEV(f, &slot), &c.cd, DEV(f, &q), DEV(f, &kn), DEV(f, &kp), DEV(f, &ec), &c.ip, &c.ik);
    if (!judge_new(f, s)) return s == MLAF_OK;
    /* where it may write: q and k_nope whole, k_pe / index_out rows of tokens with a valid
     * position and slot, the cache rows of the slots named, every index cache copy, topk_fill,
     * error_count */
    claim_all(f, &q), claim_all(f, &kn), claim_all(f, &topk), claim_all(f, &ec);
    const int64_t es_c = (int64_t)mlaf_dtype_size(cache.t.dtype);
    int64_t bad = 0;
    for (int64_t t = 0; t < T; t++) {
        int isbad;
        bad_positions(f, &pos, T, max_pos, t, &isbad);
        const int64_t sl = t < N ? get_idx(f->b[slot.buf].init + slot.boff, slot.t.dtype, t) : -1;
        const int past = sl >= nslots;
        if (isbad || past) bad++; /* counted once */
        if (!isbad && !past) claim_rows(f, &kp, t, t + 1), claim_rows(f, &iout, t, t + 1);
        if (isbad || sl < 0 || past) continue;
        const int64_t blk = sl / bs, off = sl % bs;
        if (v4) {
            claim(f, cache.buf, cache.boff + blk * cache.t.stride[0] + off * 576, 576);
            claim(f, cache.buf, cache.boff + blk * cache.t.stride[0] + bs * 576 + off * 8, 8);
        } else {
            claim(f, cache.buf, cache.boff + (blk * cache.t.stride[0] + off * cache.t.stride[1]) * es_c, (size_t)((C + R) * es_c));
            for (int32_t k = 0; k < (c.ik.copies > 1 ? c.ik.copies : 1); k++) {
                const int64_t base = icache.boff + k * (c.ik.copies > 1 ? c.ik.copy_stride : 0) + blk * icache.t.stride[0];
                claim(f, icache.buf, base + 128 * off, 128);
                claim(f, icache.buf, base + 128 * bs + 4 * off, 4);
            }
        }
    }
    check_count(f, &ec, bad);
    check_untouched(f);
    return 1;
}

static int run_dsa(fz *f) { return fuzz_dsa(f, 0); }
static int run_v4(fz *f) { return fuzz_dsa(f, 1); }

int main(void) {
    static const fuzz_entry ops[] = {{8, run_dsa}, {9, run_v4}};
    return fuzz_main(ops, (int)(sizeof ops / sizeof ops[0]));
}
