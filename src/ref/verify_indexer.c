/*
 * verify_indexer.c — the DSA indexer (docs/dsa.md) against the float64 oracle: mla_kv_cache with its
 * key branch (mlaf_verify_mla_kv_cache_dsa) and indexer_q (mlaf_verify_indexer_q). How buffers
 * are judged: verify_case.h.
 *
 * Oracle (mlaf_ref_index_row): LayerNorm, RoPE and Hadamard in float64, rounded to the latent
 * dtype after each step as the op rounds. An implementation may round a value one unit the
 * other way at any step (its fp32 arithmetic sits within 2^-21 of the terms it combines), and a
 * later step carries that difference on (a rotation mixes two values, the Hadamard all 128), so
 * each value's bound is one unit of the dtype per rounding plus the earlier steps' bounds
 * carried through the later steps' linear maps; |got - oracle| / bound is the value's units.
 *
 * mla_kv_cache with the key branch:
 *   - the MLA part: q, k_nope, k_pe, the MLA cache and error_count equal, byte for byte, a call of
 *     mlaf_mla_kv_cache_fmt without the branch on the same inputs (the plain op's own verifier
 *     judges that one);
 *   - the dense index output (always requested; in_place: index_k itself) within its bound;
 *   - every index cache record: the 128 e4m3 bytes and the f32 scale at their block-planar
 *     offsets equal the encoder applied to the op's own dense row, bit for bit, and decode within
 *     half an e4m3 ulp; every other byte of the cache (odd block stride when strided) unchanged;
 *   - topk_fill is -1 everywhere; error_count counts each rejected token once.
 * indexer_q: per (token, head) the scale is one the oracle's amax range allows, w_out equals
 * ((w * s) * f32(128^-0.5)) * f32(H^-0.5) for it bit for bit, and each e4m3 byte lies between the
 * encodings of the oracle value minus and plus its bound; the optional q_pe heads as rope_q's.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../index_math.h"
#include "verify_case.h"

/* One rounding unit of dt at |v| (f32: the fp32 rounding itself). */
static double unit_of(double v, mlaf_dtype dt) {
    if (dt == MLAF_F32) return ldexp(fabs(v), -23) + 1e-38;
    const int mant = dt == MLAF_F16 ? 10 : 7, min_exp = dt == MLAF_F16 ? -14 : -126;
    int e = min_exp;
    if (v != 0.0) {
        frexp(v, &e);
        e -= 1;
        if (e < min_exp) e = min_exp;
    }
    return ldexp(1.0, e - mant);
}

static double rnd(double v, mlaf_dtype dt) { return (double)mlaf_index_round((float)v, dt); }

void mlaf_ref_index_row(const double *x, const double *w, const double *b, double eps, mlaf_dtype dt,
                        mlaf_rope_style style, const float *cs, int hadamard, double *y, double *bound) {
    const int D = MLAF_IDX_D;
    double e[MLAF_IDX_D];
    if (w) {
        double mu = 0.0, var = 0.0, ax = 0.0;
        for (int i = 0; i < D; i++) mu += x[i], ax += fabs(x[i]);
        mu /= D;
        for (int i = 0; i < D; i++) var += (x[i] - mu) * (x[i] - mu);
        var /= D;
        const double rstd = 1.0 / sqrt(var + eps);
        for (int i = 0; i < D; i++) {
            const double t = (x[i] - mu) * rstd * w[i], v = t + b[i];
            /* fp32: the terms' roundings, mu's and rstd's (a few 2^-24 each) */
            const double p = ldexp(fabs(t) + fabs(b[i]) + (ax / D) * rstd * fabs(w[i]), -19);
            y[i] = rnd(v, dt);
            e[i] = p + unit_of(fabs(y[i]) + p, dt);
        }
    } else {
        for (int i = 0; i < D; i++) y[i] = x[i], e[i] = 0.0;
    }
    for (int i = 0; i < 32; i++) {
        const int a = style == MLAF_ROPE_NEOX ? i : 2 * i, bb = style == MLAF_ROPE_NEOX ? i + 32 : 2 * i + 1;
        const double x0 = y[a], x1 = y[bb], c = cs[i], s = cs[32 + i];
        const double v0 = x0 * c - x1 * s, v1 = x1 * c + x0 * s;
        const double p0 = fabs(c) * e[a] + fabs(s) * e[bb] + ldexp(fabs(x0 * c) + fabs(x1 * s), -23);
        const double p1 = fabs(c) * e[bb] + fabs(s) * e[a] + ldexp(fabs(x1 * c) + fabs(x0 * s), -23);
        y[a] = rnd(v0, dt), y[bb] = rnd(v1, dt);
        e[a] = p0 + unit_of(fabs(y[a]) + p0, dt);
        e[bb] = p1 + unit_of(fabs(y[bb]) + p1, dt);
    }
    if (hadamard) {
        const double k = (double)0.0883883476483184405f;
        double z[MLAF_IDX_D], se = 0.0, sa = 0.0;
        for (int i = 0; i < D; i++) z[i] = y[i], se += e[i], sa += fabs(y[i]);
        for (int h = 1; h < D; h <<= 1)
            for (int i = 0; i < D; i++)
                if (!(i & h)) {
                    const double a = z[i], bb = z[i + h];
                    z[i] = a + bb, z[i + h] = a - bb;
                }
        const double p = k * se + ldexp(k * sa, -20);
        for (int i = 0; i < D; i++) {
            y[i] = rnd(z[i] * k, dt);
            e[i] = p + unit_of(fabs(y[i]) + p, dt);
        }
    }
    for (int i = 0; i < D; i++) bound[i] = e[i];
}

/* Judges got against the oracle value y within bound (claims the element's bytes). */
static void judge_bound(judge *j, const vview *v, const char *what, int64_t t, int64_t i, double y, double bound) {
    const size_t at = vv_byte(v, t, i), es = mlaf_dtype_size(v->dt);
    for (size_t k = 0; k < es; k++) v->b->claimed[at + k] = 1;
    const double got = mlaf_load_f32(v->b->g.body, v->dt, v->off + t * v->stride + i);
    double u = fabs(got - y) / bound;
    if (!(got == got) || !isfinite(u)) u = INFINITY;
    j->values++;
    if (u > j->worst) j->worst = u;
    if (!(u <= 1.0))
        judge_fail(j, "%s[t=%lld,i=%lld]: got %.9g, expected %.9g within %.3g (%.3g bounds, %s)", what, (long long)t,
                   (long long)i, got, y, bound, u, mlaf_dtype_name(v->dt));
}

static mlaf_status canary(vbuf *b, const char *name, mlaf_backend be, size_t bytes, size_t misalign, mlaf_rng *rng) {
    unsigned char *img = (unsigned char *)malloc(bytes ? bytes : 1);
    if (!img) return MLAF_ERR_OUT_OF_MEMORY;
    for (size_t k = 0; k < bytes; k++) img[k] = (unsigned char)(mlaf_rng_u64(rng) >> 56);
    mlaf_status s = vbuf_alloc(b, name, be, bytes, img, misalign);
    free(img);
    return s;
}

static mlaf_status normal_buf(vbuf *b, const char *name, mlaf_backend be, mlaf_dtype dt, size_t n, double mean,
                              double sd, size_t misalign, mlaf_rng *rng) {
    const size_t es = mlaf_dtype_size(dt);
    void *img = malloc(n * es + 1);
    if (!img) return MLAF_ERR_OUT_OF_MEMORY;
    fill_fast_normal_par(rng, img, dt, (int64_t)n, mean, sd);
    mlaf_status s = vbuf_alloc(b, name, be, n * es, img, misalign);
    free(img);
    return s;
}

static void claim_all(vbuf *b) {
    if (b->live && b->claimed) memset(b->claimed, 1, b->bytes);
}

/* Every byte of a equals b's (both fetched); claims a's bytes. */
static void judge_equal_bufs(judge *j, vbuf *a, const vbuf *b, const char *what) {
    if (!a->live) return;
    j->values++;
    if (a->bytes != b->bytes || memcmp(a->g.body, b->g.body, a->bytes) != 0) {
        size_t k = 0;
        while (k < a->bytes && ((unsigned char *)a->g.body)[k] == ((unsigned char *)b->g.body)[k]) k++;
        judge_fail(j, "%s: byte %zu differs from the call without the indexer branch", what, k);
    }
    claim_all(a);
}

#define IDX_TOPK 8

mlaf_status mlaf_verify_mla_kv_cache_dsa(mlaf_context *ctx, const mlaf_verify_case *c, mlaf_verify_result *r) {
    mlaf_status s = check_case_common(c, r);
    if (s != MLAF_OK) return s;
    const int32_t Q = c->cfg.q_lora_rank, C = c->cfg.kv_lora_rank, R = c->cfg.qk_rope_head_dim;
    const mlaf_kv_format fmt = c->kv_format;
    if (R != MLAF_INDEX_ROPE_DIM || c->block_size < 1 || (unsigned)fmt >= MLAF_KV_FORMAT_COUNT_ ||
        (fmt == MLAF_KV_FP8_DS_MLA && (c->dtype != MLAF_BF16 || C % 128))) {
        snprintf(r->detail, sizeof r->detail, "indexer case needs rope 64 (and for fp8_ds_mla a bf16 latent, C %% 128 == 0)");
        return MLAF_ERR_INVALID_ARGUMENT;
    }
    const mlaf_backend be = mlaf_context_backend(ctx);
    const int64_t T = c->T, bs = c->block_size, D = MLAF_IDX_D;
    const int st = c->strided != 0;
    const mlaf_dtype dt = c->dtype;
    const size_t es = mlaf_dtype_size(dt);
    mlaf_rng rng;
    mlaf_rng_seed(&rng, c->seed ^ 0x1D5A);
    mlaf_verify_case cm = *c;
    cm.in_place = 0; /* in_place is the index output's here */
    norm_bufs b, b2;
    memset(&b2, 0, sizeof b2);
    vbuf pos_b, slot_b, cs_b, cache_b, cache2_b, scale_b, ec_b, ec2_b, ik_b, iw_b, ib_b, ic_b, io_b, tk_b;
    vbuf *bufs[] = {&pos_b, &slot_b, &cs_b, &cache_b, &cache2_b, &scale_b, &ec_b, &ec2_b,
                    &ik_b,  &iw_b,   &ib_b, &ic_b,    &io_b,     &tk_b};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) memset(bufs[i], 0, sizeof(vbuf));
    int64_t *pos = NULL, *slots = NULL;
    s = norm_bufs_make(&b, be, &cm, &rng, 1, 1);
    if (s != MLAF_OK) goto done;
    {
        mlaf_rng r2 = rng; /* the second call's dense outputs: the same shapes */
        s = norm_bufs_make(&b2, be, &cm, &r2, 1, 1);
        if (s != MLAF_OK) goto done;
        vbuf_free(&b2.latent), vbuf_free(&b2.w_q), vbuf_free(&b2.w_kv);
    }
    const int64_t num_blocks = (T + bs - 1) / bs + 3, cap = num_blocks * bs;
    const mlaf_dtype cdt = fmt == MLAF_KV_PLAIN ? (c->cache_dtype == MLAF_F32 || c->cache_dtype == MLAF_F16 ||
                                                   c->cache_dtype == MLAF_BF16 ? c->cache_dtype : dt)
                                                : MLAF_U8;
    const int64_t width = fmt == MLAF_KV_FP8_DS_MLA ? mlaf_kv_record_bytes(fmt, cdt, C, R) : (int64_t)C + R;
    int64_t s1, s0;
    if (fmt == MLAF_KV_FP8_DS_MLA) s1 = (width + 15) / 16 * 16 + (st ? 16 : 0), s0 = bs * s1 + (st ? 32 : 0);
    else s1 = width + (st ? 3 : 0), s0 = bs * s1 + (st ? 5 : 0);
    pos = (int64_t *)malloc(sizeof(int64_t) * (size_t)(T + 1));
    slots = (int64_t *)malloc(sizeof(int64_t) * (size_t)(T + 1));
    if (!pos || !slots) {
        s = MLAF_ERR_OUT_OF_MEMORY;
        goto done;
    }
    for (int64_t t = 0; t < T; t++) { /* distinct slots, scattered; some skipped, some past the end */
        slots[t] = (t * 7919) % cap;
        if (t % 7 == 2) slots[t] = -1 - t % 3;
        if (t % 11 == 4) slots[t] = cap + t % 4;
    }
    if (cap % 7919 == 0) /* keep the slots distinct */
        for (int64_t t = 0; t < T; t++)
            if (slots[t] >= 0 && slots[t] < cap) slots[t] = t;
    make_positions(&rng, pos, T, VERIFY_MAX_POS);
    const int64_t N = c->map_short > 0 ? (T - c->map_short > 0 ? T - c->map_short : 0) : T;
    const int64_t cs_stride = R + (st ? 3 : 0);
    if ((s = index_buf(&slot_b, "slot_mapping", be, slots, N, c->index_dtype, st)) != MLAF_OK) goto done;
    if ((s = index_buf(&pos_b, "positions", be, pos, T, c->index_dtype, st)) != MLAF_OK) goto done;
    if ((s = cos_sin_buf(&cs_b, be, R, cs_stride, st)) != MLAF_OK) goto done;
    const size_t cache_bytes = (size_t)(num_blocks * s0) * mlaf_dtype_size(cdt);
    {
        mlaf_rng r0 = rng, r1 = rng;
        if ((s = canary(&cache_b, "kv_cache", be, cache_bytes, 0, &r0)) != MLAF_OK) goto done;
        if ((s = canary(&cache2_b, "kv_cache (call without the branch)", be, cache_bytes, 0, &r1)) != MLAF_OK) goto done;
        rng = r0;
    }
    const float scale = c->fp8_scale > 0.0f ? c->fp8_scale : 0.02f;
    if (fmt == MLAF_KV_FP8 && (s = vbuf_alloc(&scale_b, "scale", be, sizeof scale, &scale, 0)) != MLAF_OK) goto done;
    if ((s = error_count_buf(&ec_b, be)) != MLAF_OK) goto done;
    if ((s = error_count_buf(&ec2_b, be)) != MLAF_OK) goto done;

    /* The indexer's inputs and outputs. */
    const int64_t ks = D + 32 + (st ? 1 : 0); /* index_k: the first 128 columns of a [T, 128 + 32] GEMM output */
    const mlaf_dtype wdt = c->weight_dtype;
    const int64_t bstride = bs * (D + 4) + (st ? 7 : 0); /* odd when strided */
    const int64_t os = D + (st ? 3 : 0), tks = IDX_TOPK + (st ? 1 : 0);
    if ((s = normal_buf(&ik_b, "index_k", be, dt, (size_t)(T * ks), 0.3, 1.0, st ? es : 0, &rng)) != MLAF_OK) goto done;
    if ((s = normal_buf(&iw_b, "index_weight", be, wdt, (size_t)D, 1.0, 0.25, 0, &rng)) != MLAF_OK) goto done;
    if ((s = normal_buf(&ib_b, "index_bias", be, wdt, (size_t)D, 0.0, 0.5, 0, &rng)) != MLAF_OK) goto done;
    const int32_t copies = c->index_copies > 1 ? c->index_copies : 1;
    const int64_t cstride = num_blocks * bstride + (st ? 5 : 0); /* bytes between the copies */
    if ((s = canary(&ic_b, "index_cache", be, (size_t)(copies * cstride), st ? 1 : 0, &rng)) != MLAF_OK) goto done;
    if (!c->in_place && (s = vbuf_alloc(&io_b, "index_out", be, (size_t)(T * os) * es, NULL, st ? es : 0)) != MLAF_OK)
        goto done;
    if ((s = canary(&tk_b, "topk_fill", be, (size_t)(T * tks) * 4, 0, &rng)) != MLAF_OK) goto done;

    mlaf_mla_kv_cache_params p = {Q, C, R, c->cfg.rms_norm_eps, c->cfg.rms_norm_eps, c->rope_style};
    mlaf_tensor lt = mlaf_tensor_2d(b.latent.g.ptr, dt, T, (int64_t)Q + C + R, b.LS);
    mlaf_tensor wq = mlaf_tensor_1d(b.w_q.g.ptr, wdt, Q), wkv = mlaf_tensor_1d(b.w_kv.g.ptr, wdt, C);
    mlaf_tensor tpos = mlaf_tensor_1d(pos_b.g.ptr, c->index_dtype, T);
    mlaf_tensor tcs = mlaf_tensor_2d(cs_b.g.ptr, MLAF_F32, VERIFY_MAX_POS, R, cs_stride);
    mlaf_tensor tslot = mlaf_tensor_1d(slot_b.g.ptr, c->index_dtype, N);
    mlaf_tensor tcache = mlaf_tensor_3d(cache_b.g.ptr, cdt, num_blocks, bs, width, s0, s1), tcache2 = tcache;
    tcache2.data = cache2_b.g.ptr;
    mlaf_tensor tscale = mlaf_tensor_1d(scale_b.g.ptr, MLAF_F32, 1);
    mlaf_tensor tq = tensor_of(&b.vq, T, Q), tk = tensor_of(&b.vk, T, C), tp = tensor_of(&b.vp, T, R);
    mlaf_tensor tq2 = tensor_of(&b2.vq, T, Q), tk2 = tensor_of(&b2.vk, T, C), tp2 = tensor_of(&b2.vp, T, R);
    mlaf_tensor tec = mlaf_tensor_1d(ec_b.g.ptr, MLAF_I32, 1), tec2 = mlaf_tensor_1d(ec2_b.g.ptr, MLAF_I32, 1);
    mlaf_kv_cache_desc desc = {fmt, &tcache, NULL, fmt == MLAF_KV_FP8 ? &tscale : NULL, NULL, c->fp8_conv, c->tile_scale};
    mlaf_kv_cache_desc desc2 = desc;
    desc2.cache = &tcache2;
    mlaf_tensor tik = mlaf_tensor_2d(ik_b.g.ptr, dt, T, D, ks);
    mlaf_tensor tiw = mlaf_tensor_1d(iw_b.g.ptr, wdt, D), tib = mlaf_tensor_1d(ib_b.g.ptr, wdt, D);
    mlaf_tensor tic = mlaf_tensor_2d(ic_b.g.ptr, MLAF_U8, num_blocks, bs * (D + 4), bstride);
    mlaf_tensor tio = c->in_place ? tik : mlaf_tensor_2d(io_b.g.ptr, dt, T, D, os);
    mlaf_tensor ttk = mlaf_tensor_2d(tk_b.g.ptr, MLAF_I32, T, IDX_TOPK, tks);
    mlaf_indexer_params ip = {c->index_style, c->index_hadamard, 1e-6f, 1e-4f, c->index_scale};
    mlaf_indexer_k ik = {&tik, &tiw, &tib, &tic, &tio, &ttk, copies, cstride};

    s = mlaf_mla_kv_cache_fmt(ctx, &p, &lt, Q > 0 ? &wq : NULL, &wkv, &tpos, &tcs, &tslot, &desc2, Q > 0 ? &tq2 : NULL,
                              &tk2, &tp2, &tec2);
    if (s != MLAF_OK) {
        snprintf(r->detail, sizeof r->detail, "mlaf_mla_kv_cache_fmt: %s: %s", mlaf_status_name(s),
                 mlaf_context_last_error(ctx));
        goto done;
    }
    s = mlaf_mla_kv_cache_dsa(ctx, &p, &lt, Q > 0 ? &wq : NULL, &wkv, &tpos, &tcs, &tslot, &desc, Q > 0 ? &tq : NULL,
                              &tk, &tp, &tec, &ip, &ik);
    if (s != MLAF_OK) {
        snprintf(r->detail, sizeof r->detail, "mlaf_mla_kv_cache_dsa: %s: %s", mlaf_status_name(s),
                 mlaf_context_last_error(ctx));
        goto done;
    }
    if ((s = mlaf_context_sync(ctx)) != MLAF_OK) goto done;
    vbuf *all[] = {&b.latent, &b.w_q, &b.w_kv, &b.q, &b.k_nope, &b.k_pe, &b2.q, &b2.k_nope, &b2.k_pe,
                   &pos_b, &slot_b, &cs_b, &cache_b, &cache2_b, &scale_b, &ec_b, &ec2_b,
                   &ik_b, &iw_b, &ib_b, &ic_b, &io_b, &tk_b};
    const int nall = (int)(sizeof all / sizeof all[0]);
    if ((s = fetch_all(all, nall)) != MLAF_OK) goto done;
    const vview vout = c->in_place ? (vview){&ik_b, dt, 0, ks} : (vview){&io_b, dt, 0, os};
    corrupt_outputs(c, &vout);

    judge j = {r, 0, 0.0, 0};
    /* The MLA part: the call without the branch, byte for byte. */
    judge_equal_bufs(&j, &b.q, &b2.q, "q");
    judge_equal_bufs(&j, &b.k_nope, &b2.k_nope, "k_nope");
    judge_equal_bufs(&j, &b.k_pe, &b2.k_pe, "k_pe");
    judge_equal_bufs(&j, &cache_b, &cache2_b, "kv_cache");
    judge_equal_bufs(&j, &ec2_b, &ec_b, "error_count of the call without the branch");
    claim_all(&b2.q), claim_all(&b2.k_nope), claim_all(&b2.k_pe), claim_all(&cache2_b);

    double w[MLAF_IDX_D], bias[MLAF_IDX_D], x[MLAF_IDX_D], y[MLAF_IDX_D], bound[MLAF_IDX_D];
    for (int i = 0; i < D; i++) w[i] = mlaf_load_f32(iw_b.init, wdt, i), bias[i] = mlaf_load_f32(ib_b.init, wdt, i);
    const float *cs_host = (const float *)cs_b.init;
    int64_t errors = 0;
    for (int64_t t = 0; t < T && !j.failed; t++) {
        for (int64_t i = 0; i < IDX_TOPK; i++) { /* topk_fill: -1 everywhere */
            int32_t v;
            memcpy(&v, (unsigned char *)tk_b.g.body + (t * tks + i) * 4, 4);
            memset(tk_b.claimed + (t * tks + i) * 4, 1, 4);
            if (v != -1) judge_fail(&j, "topk_fill[t=%lld,i=%lld] = %d, expected -1", (long long)t, (long long)i, v);
        }
        const int64_t slot = t < N ? slots[t] : -1;
        const int valid = pos[t] >= 0 && pos[t] < VERIFY_MAX_POS && slot < cap;
        if (!valid) {
            errors++;
            continue;
        }
        for (int i = 0; i < D; i++) x[i] = mlaf_load_f32(ik_b.init, dt, t * ks + i);
        mlaf_ref_index_row(x, w, bias, 1e-6, dt, c->index_style, cs_host + pos[t] * cs_stride, c->index_hadamard, y,
                           bound);
        float got[MLAF_IDX_D];
        for (int i = 0; i < D; i++) {
            judge_bound(&j, &vout, "index_out", t, i, y[i], bound[i]);
            got[i] = mlaf_load_f32(vout.b->g.body, dt, t * vout.stride + i);
        }
        if (slot < 0) continue;
        /* the record: the encoder applied to the op's own dense row, at the block-planar offsets */
        uint8_t want[MLAF_IDX_D + 4];
        const float sc = mlaf_index_quantize(got, 1e-4f, c->index_scale, want);
        mlaf_index_put_f32(want + D, sc);
        const int64_t blk = slot / bs, off = slot % bs;
        const size_t vat = (size_t)(blk * bstride + off * D), sat = (size_t)(blk * bstride + bs * D + 4 * off);
        const uint8_t *body = (const uint8_t *)ic_b.g.body;
        for (int ci = 0; ci < copies && !j.failed; ci++) /* every destination the same bytes */
            for (int i = 0; i < D + 4; i++) {
                const size_t at = (size_t)(ci * cstride) + (i < D ? vat + (size_t)i : sat + (size_t)(i - D));
                ic_b.claimed[at] = 1;
                j.values++;
                if (body[at] != want[i]) {
                    judge_fail(&j, "index_cache[copy %d][t=%lld, slot %lld, %s byte %d at %zu]: got 0x%02x, expected "
                                   "0x%02x (scale %.9g)",
                               ci, (long long)t, (long long)slot, i < D ? "value" : "scale", i < D ? i : i - D, at,
                               body[at], want[i], (double)sc);
                    break;
                }
                double ratio;
                if (i < D && ci == 0 && mlaf_ref_fp8_decode_check(body[at], got[i], sc, MLAF_FP8_DIV, &ratio) == 0)
                    judge_fail(&j, "index_cache[t=%lld, value %d]: 0x%02x * %.9g is not within half an e4m3 ulp of %.9g",
                               (long long)t, i, body[at], (double)sc, (double)got[i]);
            }
    }
    if (!j.failed) judge_error_count(&j, &ec_b, errors);
    int64_t untouched = 0;
    for (int i = 0; i < nall; i++) untouched += judge_untouched(&j, all[i]);
    judge_finish(&j, "mla_kv_cache+indexer", c, untouched);
done:
    free(pos);
    free(slots);
    norm_bufs_free(&b);
    norm_bufs_free(&b2);
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) vbuf_free(bufs[i]);
    return s;
}

/* ---- indexer_q ------------------------------------------------------------------------- */

/* The next value of dt above a >= 0. */
static float next_in(float a, mlaf_dtype dt) {
    if (dt == MLAF_BF16) return mlaf_bf16_to_f32((uint16_t)(mlaf_f32_to_bf16(a) + 1));
    if (dt == MLAF_F16) return mlaf_f16_to_f32((uint16_t)(mlaf_f32_to_f16(a) + 1));
    return nextafterf(a, INFINITY);
}

/* The e4m3 value of x / s. */
static double e4m3_val(double x, float s) { return (double)mlaf_e4m3_to_f32(mlaf_f32_to_e4m3((float)(x / s))); }

/* The first of a row's n e4m3 bytes that is not the e4m3 of (y +- bound) / s, or -1. */
static int e4m3_row_bad(const uint8_t *fb, const double *y, const double *bound, int n, float s) {
    for (int i = 0; i < n; i++) {
        const double g = (double)mlaf_e4m3_to_f32(fb[i]);
        if (!(g >= e4m3_val(y[i] - bound[i], s) && g <= e4m3_val(y[i] + bound[i], s))) return i;
    }
    return -1;
}

mlaf_status mlaf_verify_indexer_q(mlaf_context *ctx, const mlaf_verify_case *c, mlaf_verify_result *r) {
    memset(r, 0, sizeof *r);
    if (c->T < 0 || (c->dtype != MLAF_F32 && c->dtype != MLAF_F16 && c->dtype != MLAF_BF16)) {
        snprintf(r->detail, sizeof r->detail, "indexer_q case: bad T or dtype");
        return MLAF_ERR_INVALID_ARGUMENT;
    }
    const mlaf_backend be = mlaf_context_backend(ctx);
    const int64_t T = c->T, D = MLAF_IDX_D, H = c->cfg.index_n_heads > 0 ? c->cfg.index_n_heads : 32;
    const int64_t Hq = c->index_q_pe ? (c->cfg.num_heads > 0 ? c->cfg.num_heads : 16) : 0;
    const int64_t Dq = (c->cfg.qk_nope_head_dim > 0 ? c->cfg.qk_nope_head_dim : 128) + MLAF_INDEX_ROPE_DIM;
    const int st = c->strided != 0;
    const mlaf_dtype dt = c->dtype, wdt = c->weight_dtype;
    const size_t es = mlaf_dtype_size(dt);
    mlaf_rng rng;
    mlaf_rng_seed(&rng, c->seed ^ 0x1D5B);
    vbuf q_b, w_b, f_b, wo_b, pe_b, pos_b, cs_b, ec_b;
    vbuf *bufs[] = {&q_b, &w_b, &f_b, &wo_b, &pe_b, &pos_b, &cs_b, &ec_b};
    const int nb = (int)(sizeof bufs / sizeof bufs[0]);
    for (int i = 0; i < nb; i++) memset(bufs[i], 0, sizeof(vbuf));
    int64_t *pos = (int64_t *)malloc(sizeof(int64_t) * (size_t)(T + 1));
    mlaf_status s = MLAF_ERR_OUT_OF_MEMORY;
    if (!pos) goto done;
    const int64_t q1 = D + (st ? 5 : 0), q0 = H * q1 + (st ? 3 : 0);
    const int64_t ws = H + (st ? D + 1 : 0); /* the last H columns of a [T, 128 + H] GEMM output */
    const int64_t f1 = D + (st ? 1 : 0), f0 = H * f1 + (st ? 7 : 0), wos = H + (st ? 2 : 0);
    const int64_t p1 = Dq + (st ? 2 : 0), p0 = Hq * p1 + (st ? 5 : 0), cs_stride = MLAF_INDEX_ROPE_DIM + (st ? 3 : 0);
    make_positions(&rng, pos, T, VERIFY_MAX_POS);
    if ((s = normal_buf(&q_b, "q_idx", be, dt, (size_t)(T * q0), 0.0, 1.0, st ? es : 0, &rng)) != MLAF_OK) goto done;
    if ((s = normal_buf(&w_b, "w", be, wdt, (size_t)(T * ws), 0.0, 1.0, 0, &rng)) != MLAF_OK) goto done;
    if ((s = canary(&f_b, "q_fp8", be, (size_t)(T * f0), st ? 1 : 0, &rng)) != MLAF_OK) goto done;
    if ((s = vbuf_alloc(&wo_b, "w_out", be, (size_t)(T * wos) * 4, NULL, 0)) != MLAF_OK) goto done;
    if (Hq > 0 && (s = normal_buf(&pe_b, "q_pe", be, dt, (size_t)(T * p0), 0.0, 1.0, st ? es : 0, &rng)) != MLAF_OK)
        goto done;
    if ((s = index_buf(&pos_b, "positions", be, pos, T, c->index_dtype, st)) != MLAF_OK) goto done;
    if ((s = cos_sin_buf(&cs_b, be, MLAF_INDEX_ROPE_DIM, cs_stride, st)) != MLAF_OK) goto done;
    if ((s = error_count_buf(&ec_b, be)) != MLAF_OK) goto done;

    mlaf_indexer_params ip = {c->index_style, c->index_hadamard, 1e-6f, 1e-4f, c->index_scale};
    mlaf_tensor tq = mlaf_tensor_3d(q_b.g.ptr, dt, T, H, D, q0, q1);
    mlaf_tensor tw = mlaf_tensor_2d(w_b.g.ptr, wdt, T, H, ws);
    mlaf_tensor tf = mlaf_tensor_3d(f_b.g.ptr, MLAF_FP8_E4M3, T, H, D, f0, f1);
    mlaf_tensor two = mlaf_tensor_2d(wo_b.g.ptr, MLAF_F32, T, H, wos);
    mlaf_tensor tpe = mlaf_tensor_3d(pe_b.g.ptr, dt, T, Hq, Dq, p0, p1);
    mlaf_tensor tpos = mlaf_tensor_1d(pos_b.g.ptr, c->index_dtype, T);
    mlaf_tensor tcs = mlaf_tensor_2d(cs_b.g.ptr, MLAF_F32, VERIFY_MAX_POS, MLAF_INDEX_ROPE_DIM, cs_stride);
    mlaf_tensor tec = mlaf_tensor_1d(ec_b.g.ptr, MLAF_I32, 1);
    mlaf_rope_params pr = {MLAF_INDEX_ROPE_DIM, c->rope_style};
    s = mlaf_indexer_q(ctx, &ip, &tq, &tpos, &tcs, &tw, &tf, &two, Hq > 0 ? &tpe : NULL, &pr, &tec);
    if (s != MLAF_OK) {
        snprintf(r->detail, sizeof r->detail, "mlaf_indexer_q: %s: %s", mlaf_status_name(s), mlaf_context_last_error(ctx));
        goto done;
    }
    if ((s = mlaf_context_sync(ctx)) != MLAF_OK) goto done;
    if ((s = fetch_all(bufs, nb)) != MLAF_OK) goto done;
    if (c->corrupt_from > 0) /* the harness's own test: byte 0 of q_fp8's head 0, one e4m3 step off */
        for (int64_t t = c->corrupt_from - 1; t < T; t += 500) ((uint8_t *)f_b.g.body)[t * f0] ^= 1u;

    judge j = {r, 0, 0.0, 0};
    const float *cs_host = (const float *)cs_b.init;
    const float wf = (float)(1.0 / sqrt((double)D)), hf = (float)(1.0 / sqrt((double)H));
    int64_t errors = 0;
    double x[MLAF_IDX_D], y[MLAF_IDX_D], bound[MLAF_IDX_D];
    for (int64_t t = 0; t < T && !j.failed; t++) {
        if (pos[t] < 0 || pos[t] >= VERIFY_MAX_POS) {
            errors++;
            continue;
        }
        const float *cs = cs_host + pos[t] * cs_stride;
        for (int64_t h = 0; h < H && !j.failed; h++) {
            for (int i = 0; i < D; i++) x[i] = mlaf_load_f32(q_b.init, dt, t * q0 + h * q1 + i);
            mlaf_ref_index_row(x, NULL, NULL, 0.0, dt, c->index_style, cs, c->index_hadamard, y, bound);
            double lo = 0.0, hi = 0.0;
            for (int i = 0; i < D; i++) {
                const double a = fabs(y[i]);
                lo = a - bound[i] > lo ? a - bound[i] : lo;
                hi = a + bound[i] > hi ? a + bound[i] : hi;
            }
            /* the scales the range [lo, hi] of amax allows (monotonic in amax) */
            const float s_lo = mlaf_index_scale_of(nextafterf((float)lo, 0.0f), 1e-4f, c->index_scale);
            const float s_hi = mlaf_index_scale_of(nextafterf((float)hi, INFINITY), 1e-4f, c->index_scale);
            const float wv = mlaf_load_f32(w_b.init, wdt, t * ws + h);
            float got_wo;
            memcpy(&got_wo, (unsigned char *)wo_b.g.body + (t * wos + h) * 4, 4);
            memset(wo_b.claimed + (t * wos + h) * 4, 1, 4);
            /* The scale: one that w_out's bits fold from, inside [s_lo, s_hi] (a power of two for
             * UE8M0, amax / 448 for an amax the dtype holds for F32), and under which all 128
             * bytes are the e4m3 of the oracle's values. Neighbouring F32 scales can fold to the
             * same w_out bits, so every such scale is tried before the row is judged wrong. */
            const uint8_t *fb = (const uint8_t *)f_b.g.body + t * f0 + h * f1;
            memset(f_b.claimed + t * f0 + h * f1, 1, (size_t)D);
            float sc = 0.0f;
            int folds = 0, bad_i = -1, steps = 0;
            const int ue = c->index_scale == MLAF_INDEX_SCALE_UE8M0;
            const float a_hi = nextafterf((float)hi, INFINITY);
            float a = mlaf_index_round(nextafterf((float)lo, 0.0f), dt);
            for (float cand = s_lo; ue ? cand <= s_hi : (a <= a_hi && steps < 100000); steps++) {
                if (!ue) cand = mlaf_index_scale_of(a, 1e-4f, MLAF_INDEX_SCALE_F32);
                if (mlaf_f32_bits(((wv * cand) * wf) * hf) == mlaf_f32_bits(got_wo)) {
                    const int bi = e4m3_row_bad(fb, y, bound, D, cand);
                    if (folds++ == 0 || bi < 0) sc = cand, bad_i = bi;
                    if (bi < 0) break;
                }
                if (ue) cand *= 2.0f;
                else a = next_in(a, dt);
            }
            j.values += 1 + D;
            if (!folds) {
                judge_fail(&j, "w_out[t=%lld,h=%lld] = %.9g: not ((w %.9g * s) * 128^-0.5) * H^-0.5 for a scale s in "
                               "[%.9g, %.9g] (the oracle's amax %.9g .. %.9g)",
                           (long long)t, (long long)h, (double)got_wo, (double)wv, (double)s_lo, (double)s_hi, lo, hi);
                break;
            }
            if (bad_i >= 0) {
                const int i = bad_i;
                judge_fail(&j, "q_fp8[t=%lld,h=%lld,i=%d] = 0x%02x (%.9g), expected e4m3 of (%.9g +- %.3g) / %.9g in "
                               "[%.9g, %.9g] (%d scale(s) fold to w_out; none fits every byte)",
                           (long long)t, (long long)h, i, fb[i], (double)mlaf_e4m3_to_f32(fb[i]), y[i], bound[i],
                           (double)sc, e4m3_val(y[i] - bound[i], sc), e4m3_val(y[i] + bound[i], sc), folds);
                break;
            }
        }
        for (int64_t h = 0; h < Hq && !j.failed; h++) { /* q_pe: rope_q's rotation of the last 64 columns */
            double xr[MLAF_INDEX_ROPE_DIM], allow[MLAF_INDEX_ROPE_DIM];
            const int64_t at = t * p0 + h * p1 + Dq - MLAF_INDEX_ROPE_DIM;
            for (int i = 0; i < MLAF_INDEX_ROPE_DIM; i++) xr[i] = mlaf_load_f32(pe_b.init, dt, at + i);
            rope_allowance(xr, MLAF_INDEX_ROPE_DIM, c->rope_style, cs, allow);
            mlaf_ref_rope_row(xr, MLAF_INDEX_ROPE_DIM, c->rope_style, cs);
            const vview v = {&pe_b, dt, at, 0};
            for (int i = 0; i < MLAF_INDEX_ROPE_DIM; i++) judge_value(&j, &v, "q_pe", 0, i, xr[i], allow[i]);
        }
    }
    if (!j.failed) judge_error_count(&j, &ec_b, errors);
    int64_t untouched = 0;
    for (int i = 0; i < nb; i++) untouched += judge_untouched(&j, bufs[i]);
    judge_finish(&j, "indexer_q", c, untouched);
done:
    free(pos);
    for (int i = 0; i < nb; i++) vbuf_free(bufs[i]);
    return s;
}
