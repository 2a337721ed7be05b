/*
 * test_indexer.c — the DSA indexer (docs/dsa.md) on every backend: mla_kv_cache with its key branch
 * (every cache format, both RoPE styles, Hadamard on / off, ue8m0 / f32 scales, dtypes, T, block
 * sizes, strided views with an odd index-cache block stride, the in-place dense output, a short
 * slot_mapping) and indexer_q (with and without the MLA q_pe) against the float64 oracle
 * (verify_indexer.c); the block-planar byte offsets pinned by hand with an odd block stride and
 * decoded back; the harness's own failure; rejections with a message naming the argument and
 * nothing written.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../src/fp8.h"
#include "testlib.h"

static const mlaf_dtype DTYPES[3] = {MLAF_BF16, MLAF_F16, MLAF_F32};

static int filtered_out(const char *name) {
    const char *f = getenv("MLAF_TEST_FILTER");
    return f && *f && !strstr(name, f);
}

static const char *style_name(mlaf_rope_style s) { return s == MLAF_ROPE_NEOX ? "neox" : "interleaved"; }

static void run_k(mlaf_context *ctx, const mlaf_verify_case *c, const char *extra) {
    char name[320];
    snprintf(name, sizeof name,
             "MLA_KV_CACHE_DSA(preset=%s,T=%lld,dtype=%s,w=%s,backend=%s,cache=%s,bs=%lld,index_rope=%s,hadamard=%d,"
             "scale=%s,copies=%d%s%s%s%s%s)",
             c->cfg.name, (long long)c->T, mlaf_dtype_name(c->dtype), mlaf_dtype_name(c->weight_dtype),
             mlaf_backend_name(mlaf_context_backend(ctx)), mlaf_kv_format_name(c->kv_format),
             (long long)c->block_size, style_name(c->index_style), c->index_hadamard,
             c->index_scale == MLAF_INDEX_SCALE_F32 ? "f32" : "ue8m0", c->index_copies > 1 ? c->index_copies : 1,
             c->strided ? ",strided" : "", c->in_place ? ",in_place(context-parallel)" : "", c->map_short ? ",short_map" : "", extra ? "," : "", extra ? extra : "");
    if (filtered_out(name)) return;
    mlaf_verify_result r;
    mlaf_status st = mlaf_verify_mla_kv_cache_dsa(ctx, c, &r);
    tl_case(st == MLAF_OK && r.passed, name, "%s [%s, worst %.3g]", r.detail, mlaf_status_name(st), r.worst_units);
}

static void run_q(mlaf_context *ctx, const mlaf_verify_case *c, const char *extra) {
    char name[320];
    snprintf(name, sizeof name,
             "INDEXER_Q(preset=%s,T=%lld,H=%d,dtype=%s,w=%s,backend=%s,index_rope=%s,hadamard=%d,scale=%s%s%s%s%s)",
             c->cfg.name, (long long)c->T, (int)c->cfg.index_n_heads, mlaf_dtype_name(c->dtype),
             mlaf_dtype_name(c->weight_dtype), mlaf_backend_name(mlaf_context_backend(ctx)),
             style_name(c->index_style), c->index_hadamard, c->index_scale == MLAF_INDEX_SCALE_F32 ? "f32" : "ue8m0",
             c->strided ? ",strided" : "", c->index_q_pe ? ",q_pe" : "", extra ? "," : "", extra ? extra : "");
    if (filtered_out(name)) return;
    mlaf_verify_result r;
    mlaf_status st = mlaf_verify_indexer_q(ctx, c, &r);
    tl_case(st == MLAF_OK && r.passed, name, "%s [%s, worst %.3g]", r.detail, mlaf_status_name(st), r.worst_units);
}

static void suite(mlaf_context *ctx, int quick, const char *extra) {
    const char *presets[3] = {"glm-5", "deepseek-v3.2", "glm-4.7-flash"};
    const int64_t Ts[6] = {0, 1, 7, 64, 257, 4099};
    const int64_t bss[3] = {1, 16, 64};
    const int nT = quick || extra ? 5 : 6;
    int v = 0;
    for (int pi = 0; pi < 3; pi++) {
        const mlaf_model_config *cfg = mlaf_preset_find(presets[pi]);
        for (int di = 0; di < 3; di++)
            for (int ti = extra ? 2 : 0; ti < nT; ti++)
                for (int f = 0; f < 3; f++) {
                    if (f == 2 && di != 0) continue; /* fp8_ds_mla: bf16 latents only */
                    if (extra && (ti + f + di) % 2) continue;
                    v++;
                    mlaf_verify_case c = mlaf_verify_case_default(cfg, DTYPES[di], Ts[ti], 0xd5a000u + (uint64_t)v);
                    c.indexer = 1;
                    c.kv_format = (mlaf_kv_format)f;
                    c.cache_dtype = f == 0 ? DTYPES[(di + v) % 3] : MLAF_U8;
                    c.block_size = bss[v % 3];
                    c.strided = (v >> 1) & 1;
                    c.in_place = v % 5 == 3;
                    c.map_short = v % 7 == 4 ? 3 : 0;
                    c.weight_dtype = v % 4 == 1 ? MLAF_F32 : DTYPES[di];
                    c.index_hadamard = (v >> 2) & 1;
                    c.index_scale = v % 3 == 2 ? MLAF_INDEX_SCALE_F32 : MLAF_INDEX_SCALE_UE8M0;
                    if (pi == 2) c.index_style = (mlaf_rope_style)(v & 1);
                    c.index_dtype = v % 2 ? MLAF_I32 : MLAF_I64;
                    c.tile_scale = (mlaf_tile_scale)(v % 3);
                    c.index_copies = v % 6 == 5 ? 2 + v % 7 : 0; /* the multi-destination store */
                    run_k(ctx, &c, extra);
                }
    }
    for (int pi = 0; pi < 2; pi++) {
        const mlaf_model_config *cfg = mlaf_preset_find(presets[pi]);
        for (int di = 0; di < 3; di++)
            for (int ti = extra ? 2 : 0; ti < nT - 1; ti++)
                for (int k = 0; k < 2; k++) {
                    if (extra && (ti + k) % 2) continue;
                    v++;
                    mlaf_verify_case c = mlaf_verify_case_default(cfg, DTYPES[di], Ts[ti], 0xd5b000u + (uint64_t)v);
                    c.strided = k;
                    c.weight_dtype = v % 3 == 1 ? MLAF_F32 : DTYPES[di];
                    c.index_hadamard = (v >> 1) & 1;
                    c.index_scale = v % 4 == 3 ? MLAF_INDEX_SCALE_F32 : MLAF_INDEX_SCALE_UE8M0;
                    c.index_q_pe = (v % 3) == 0;
                    c.index_dtype = v % 2 ? MLAF_I32 : MLAF_I64;
                    run_q(ctx, &c, extra);
                }
    }
}

/* ---- the block-planar bytes, by hand ------------------------------------------------------ */
static void planar_bytes(mlaf_backend be) {
    char name[160];
    snprintf(name, sizeof name, "MLA_KV_CACHE_DSA(planar offsets, block_size 2, odd block stride 271,backend=%s)",
             mlaf_backend_name(be));
    if (filtered_out(name)) return;
    mlaf_context *ctx = tl_context(be);
    if (!ctx) return;
    enum { T = 3, Q = 0, C = 128, R = 64, BS = 2, NB = 3, STRIDE = 271, D = 128 };
    uint16_t lat[T * (C + R)], wkv[C], kbuf[T * D], out[T * D], wi[D], bi[D], kn[T * C];
    float cs[4 * R];
    int64_t pos[T] = {1, 3, 2}, slots[T] = {3, 0, 5};
    uint8_t icache[NB * STRIDE], kvc[NB * BS * (C + R) * 2];
    mlaf_rng rng;
    mlaf_rng_seed(&rng, 77);
    mlaf_fill_normal(&rng, lat, MLAF_BF16, T * (C + R), 0.0, 1.0);
    mlaf_fill_normal(&rng, wkv, MLAF_BF16, C, 1.0, 0.1);
    mlaf_fill_normal(&rng, kbuf, MLAF_BF16, T * D, 0.2, 1.5);
    mlaf_fill_normal(&rng, wi, MLAF_BF16, D, 1.0, 0.2);
    mlaf_fill_normal(&rng, bi, MLAF_BF16, D, 0.0, 0.3);
    mlaf_rope_table_init(cs, 4, R, 10000.0);
    for (int i = 0; i < NB * STRIDE; i++) icache[i] = (uint8_t)(0xA5 ^ i);
    memset(kvc, 0, sizeof kvc);
    mlaf_gbuf g[11];
    void *host[11] = {lat, wkv, kbuf, wi, bi, cs, pos, slots, icache, kvc, kn};
    size_t sz[11] = {sizeof lat, sizeof wkv, sizeof kbuf, sizeof wi, sizeof bi, sizeof cs, sizeof pos, sizeof slots,
                     sizeof icache, sizeof kvc, sizeof kn};
    int ok = 1;
    for (int i = 0; i < 11; i++) ok = ok && mlaf_gbuf_alloc(&g[i], be, sz[i], host[i], 0) == MLAF_OK;
    mlaf_gbuf go;
    ok = ok && mlaf_gbuf_alloc(&go, be, sizeof out, NULL, 0) == MLAF_OK;
    if (!ok) {
        tl_case(0, name, "allocation failed");
        mlaf_context_free(ctx);
        return;
    }
    mlaf_mla_kv_cache_params p = {Q, C, R, 1e-6f, 1e-6f, MLAF_ROPE_INTERLEAVED};
    mlaf_tensor tl = mlaf_tensor_2d(g[0].ptr, MLAF_BF16, T, C + R, C + R), tw = mlaf_tensor_1d(g[1].ptr, MLAF_BF16, C);
    mlaf_tensor tk = mlaf_tensor_2d(g[2].ptr, MLAF_BF16, T, D, D), twi = mlaf_tensor_1d(g[3].ptr, MLAF_BF16, D);
    mlaf_tensor tbi = mlaf_tensor_1d(g[4].ptr, MLAF_BF16, D), tcs = mlaf_tensor_2d(g[5].ptr, MLAF_F32, 4, R, R);
    mlaf_tensor tpos = mlaf_tensor_1d(g[6].ptr, MLAF_I64, T), tsl = mlaf_tensor_1d(g[7].ptr, MLAF_I64, T);
    mlaf_tensor tic = mlaf_tensor_2d(g[8].ptr, MLAF_U8, NB, BS * (D + 4), STRIDE);
    mlaf_tensor tkv = mlaf_tensor_3d(g[9].ptr, MLAF_BF16, NB, BS, C + R, BS * (C + R), C + R);
    mlaf_tensor tkn = mlaf_tensor_2d(g[10].ptr, MLAF_BF16, T, C, C), tout = mlaf_tensor_2d(go.ptr, MLAF_BF16, T, D, D);
    mlaf_kv_cache_desc d = {MLAF_KV_PLAIN, &tkv, NULL, NULL, NULL, MLAF_FP8_DIV, MLAF_TILE_AMAX};
    mlaf_indexer_params ip = {MLAF_ROPE_NEOX, 0, 1e-6f, 1e-4f, MLAF_INDEX_SCALE_UE8M0};
    mlaf_indexer_k ik = {&tk, &twi, &tbi, &tic, &tout, NULL, 0, 0};
    mlaf_status st = mlaf_mla_kv_cache_dsa(ctx, &p, &tl, NULL, &tw, &tpos, &tcs, &tsl, &d, NULL, &tkn, NULL, NULL, &ip, &ik);
    ok = st == MLAF_OK && mlaf_context_sync(ctx) == MLAF_OK && mlaf_gbuf_download(&g[8]) == MLAF_OK &&
         mlaf_gbuf_download(&go) == MLAF_OK;
    const uint8_t *ic = (const uint8_t *)g[8].body;
    const uint16_t *o = (const uint16_t *)go.body;
    int bad = 0, touched = 0;
    char why[200] = "";
    for (int t = 0; ok && t < T; t++) {
        if (slots[t] >= NB * BS) continue;
        const int b = (int)(slots[t] / BS), off = (int)(slots[t] % BS);
        const uint8_t *vals = ic + b * STRIDE + off * D, *sp = ic + b * STRIDE + BS * D + 4 * off;
        const uint32_t sb = (uint32_t)sp[0] | (uint32_t)sp[1] << 8 | (uint32_t)sp[2] << 16 | (uint32_t)sp[3] << 24;
        const float s = mlaf_bits_f32(sb);
        float amax = 0.0f;
        for (int i = 0; i < D; i++) amax = fmaxf(amax, fabsf(mlaf_bf16_to_f32(o[t * D + i])));
        if (s != mlaf_bits_f32((uint32_t)(mlaf_ue8m0_exponent(amax) + 127) << 23)) {
            bad++;
            snprintf(why, sizeof why, "token %d: scale %g at byte %d, expected 2^ceil_log2(%g / 448)", t, (double)s,
                     (int)(sp - ic), (double)amax);
        }
        for (int i = 0; i < D; i++) {
            const float x = mlaf_bf16_to_f32(o[t * D + i]), dec = mlaf_e4m3_to_f32(vals[i]) * s;
            const float ax = fabsf(x) / s; /* half an e4m3 ulp at x / s, times s */
            const float half = ldexpf(1.0f, (ax < 0.015625f ? -9 : (int)floorf(log2f(ax)) - 3) - 1) * s;
            if (!(fabsf(dec - x) <= half * 1.0001f)) {
                bad++;
                snprintf(why, sizeof why, "token %d value %d: byte 0x%02x * %g = %g, dense %g", t, i, vals[i], (double)s,
                         (double)dec, (double)x);
            }
        }
    }
    /* bytes of no record (block 1 and the tails past 264 bytes of each block) unchanged */
    for (int k = 0; ok && k < NB * STRIDE; k++) {
        const int b = k / STRIDE, in = k % STRIDE;
        int named = 0;
        for (int t = 0; t < T; t++) {
            if (slots[t] / BS != b) continue;
            const int off = (int)(slots[t] % BS);
            named |= (in >= off * D && in < off * D + D) || (in >= BS * D + 4 * off && in < BS * D + 4 * off + 4);
        }
        if (!named && ic[k] != (uint8_t)(0xA5 ^ k)) touched++;
    }
    tl_case(ok && !bad && !touched && mlaf_gbuf_guards_ok(&g[8]), name, "%s; %d bad values, %d bytes changed outside the records [%s]",
            why, bad, touched, mlaf_context_last_error(ctx));

    /* rejections: nothing written, the message names the argument */
    struct {
        const char *what, *needle;
        mlaf_status want;
    } cases[9] = {{"rope_dim 32", "rope_dim", MLAF_ERR_INVALID_ARGUMENT},
                  {"index cache too narrow", "index_cache.shape[1]", MLAF_ERR_SHAPE},
                  {"index cache blocks", "index_cache.shape[0]", MLAF_ERR_SHAPE},
                  {"ln_eps 0", "ln_eps", MLAF_ERR_INVALID_ARGUMENT},
                  {"index_out over index_cache", "overlaps", MLAF_ERR_OVERLAP},
                  {"index_k f32", "index_k.dtype", MLAF_ERR_DTYPE},
                  {"9 copies", "index copies", MLAF_ERR_LIMIT},
                  {"overlapping copies", "copy_stride", MLAF_ERR_STRIDE},
                  /* NoPE (R = 0, no positions or table): the MLA part alone is valid, the key branch
                   * has no 64-wide rows to rotate with (docs/dsa.md) */
                  {"rope_dim 0 (NoPE)", "rope_dim = 0, expected 64", MLAF_ERR_INVALID_ARGUMENT}};
    for (int k = 0; k < 9; k++) {
        char nm[200];
        snprintf(nm, sizeof nm, "MLA_KV_CACHE_DSA(rejects %s,backend=%s)", cases[k].what, mlaf_backend_name(be));
        memcpy(g[8].body, icache, sizeof icache);
        mlaf_gbuf_upload(&g[8]);
        mlaf_mla_kv_cache_params p2 = p;
        mlaf_indexer_params ip2 = ip;
        mlaf_tensor tic2 = tic, tout2 = tout, tk2 = tk, tcs2 = tcs, tl2 = tl;
        mlaf_indexer_k ik2 = ik;
        if (k == 0) p2.rope_dim = 32, tcs2.shape[1] = 32, tl2.shape[1] = C + 32;
        if (k == 8) p2.rope_dim = 0, tl2.shape[1] = C;
        if (k == 1) tic2.shape[1] = BS * (D + 4) - 1;
        if (k == 2) tic2.shape[0] = NB - 1;
        if (k == 3) ip2.ln_eps = 0.0f;
        if (k == 4) tout2 = mlaf_tensor_2d(g[8].ptr, MLAF_BF16, 1, D, D);
        if (k == 5) tk2.dtype = MLAF_F32;
        if (k == 6) ik2.copies = 9, ik2.copy_stride = NB * STRIDE;
        if (k == 7) ik2.copies = 2, ik2.copy_stride = NB * STRIDE - 10;
        ik2.cache = &tic2, ik2.out = &tout2, ik2.index_k = &tk2;
        if (k == 4) { /* one token: index_out [1, 128] bf16 aliases the index cache */
            mlaf_tensor tl1 = tl, tk1 = tk2, tn1 = tkn, tp1 = tpos, ts1 = tsl;
            tl1.shape[0] = tk1.shape[0] = tn1.shape[0] = tp1.shape[0] = ts1.shape[0] = 1;
            ik2.index_k = &tk1;
            st = mlaf_mla_kv_cache_dsa(ctx, &p2, &tl1, NULL, &tw, &tp1, &tcs2, &ts1, &d, NULL, &tn1, NULL, NULL, &ip2, &ik2);
        } else {
            mlaf_kv_cache_desc d2 = d;
            mlaf_tensor tkv2 = tkv;
            if (k == 0) tkv2.shape[2] = C + 32, d2.cache = &tkv2;
            if (k == 8) tkv2.shape[2] = C, d2.cache = &tkv2;
            st = mlaf_mla_kv_cache_dsa(ctx, &p2, &tl2, NULL, &tw, k == 8 ? NULL : &tpos, k == 8 ? NULL : &tcs2, &tsl,
                                       &d2, NULL, &tkn, NULL, NULL, &ip2, &ik2);
        }
        const char *msg = mlaf_context_last_error(ctx);
        mlaf_gbuf_download(&g[8]);
        int same = 1;
        for (int i = 0; i < NB * STRIDE; i++) same &= ((const uint8_t *)g[8].body)[i] == icache[i];
        tl_case(st == cases[k].want && strstr(msg, cases[k].needle) && same, nm, "%s: \"%s\"%s", mlaf_status_name(st), msg,
                same ? "" : " (index cache written)");
    }
    for (int i = 0; i < 11; i++) mlaf_gbuf_free(&g[i]);
    mlaf_gbuf_free(&go);
    mlaf_context_free(ctx);
}

/* indexer_q's rejections: the status, a message naming the argument, nothing written. */
static void indexer_q_rejects(mlaf_backend be) {
    mlaf_context *ctx = tl_context(be);
    if (!ctx) return;
    enum { T = 4, H = 8, D = 128 };
    mlaf_gbuf q, w, f, wo, pos, cs, pe;
    float tab[16 * 64];
    int64_t p[T] = {0, 1, 2, 3};
    mlaf_rope_table_init(tab, 16, 64, 10000.0);
    int ok = mlaf_gbuf_alloc(&q, be, T * H * D * 4, NULL, 0) == MLAF_OK && mlaf_gbuf_alloc(&w, be, T * H * 4, NULL, 0) == MLAF_OK &&
             mlaf_gbuf_alloc(&f, be, T * H * D, NULL, 0) == MLAF_OK && mlaf_gbuf_alloc(&wo, be, T * H * 4, NULL, 0) == MLAF_OK &&
             mlaf_gbuf_alloc(&pos, be, sizeof p, p, 0) == MLAF_OK && mlaf_gbuf_alloc(&cs, be, sizeof tab, tab, 0) == MLAF_OK &&
             mlaf_gbuf_alloc(&pe, be, T * 2 * 192 * 4, NULL, 0) == MLAF_OK;
    if (!ok) {
        tl_case(0, "INDEXER_Q(rejects: allocation)", "failed");
        mlaf_context_free(ctx);
        return;
    }
    struct {
        const char *what, *needle;
        mlaf_status want;
    } cases[7] = {{"head dim 64", "q_idx.shape[2]", MLAF_ERR_SHAPE},
                  {"w of 7 heads", "w.shape[1]", MLAF_ERR_SHAPE},
                  {"q_fp8 f32", "q_fp8.dtype", MLAF_ERR_DTYPE},
                  {"w_out over q_fp8", "overlaps", MLAF_ERR_OVERLAP},
                  {"cos_sin 32 wide", "cos_sin.shape[1]", MLAF_ERR_SHAPE},
                  {"q_pe without its rope params", "q_pe_rope", MLAF_ERR_NULL_POINTER},
                  {"amax_eps 0", "amax_eps", MLAF_ERR_INVALID_ARGUMENT}};
    for (int k = 0; k < 7; k++) {
        char nm[160];
        snprintf(nm, sizeof nm, "INDEXER_Q(rejects %s,backend=%s)", cases[k].what, mlaf_backend_name(be));
        mlaf_indexer_params ip = {MLAF_ROPE_NEOX, 0, 1e-6f, 1e-4f, MLAF_INDEX_SCALE_UE8M0};
        mlaf_tensor tq = mlaf_tensor_3d(q.ptr, MLAF_F32, T, H, D, H * D, D), tw = mlaf_tensor_2d(w.ptr, MLAF_F32, T, H, H);
        mlaf_tensor tf = mlaf_tensor_3d(f.ptr, MLAF_U8, T, H, D, H * D, D), two = mlaf_tensor_2d(wo.ptr, MLAF_F32, T, H, H);
        mlaf_tensor tp = mlaf_tensor_1d(pos.ptr, MLAF_I64, T), tc = mlaf_tensor_2d(cs.ptr, MLAF_F32, 16, 64, 64);
        mlaf_tensor tpe = mlaf_tensor_3d(pe.ptr, MLAF_F32, T, 2, 192, 384, 192);
        mlaf_rope_params pr = {64, MLAF_ROPE_INTERLEAVED};
        const mlaf_tensor *qpe = NULL;
        const mlaf_rope_params *ppr = &pr;
        if (k == 0) tq.shape[2] = 64;
        if (k == 1) tw.shape[1] = H - 1;
        if (k == 2) tf.dtype = MLAF_F32;
        if (k == 3) two = mlaf_tensor_2d(f.ptr, MLAF_F32, T, H, H);
        if (k == 4) tc.shape[1] = 32;
        if (k == 5) qpe = &tpe, ppr = NULL;
        if (k == 6) ip.amax_eps = 0.0f;
        mlaf_status st = mlaf_indexer_q(ctx, &ip, &tq, &tp, &tc, &tw, &tf, &two, qpe, ppr, NULL);
        const char *msg = mlaf_context_last_error(ctx);
        int same = mlaf_gbuf_download(&f) == MLAF_OK && mlaf_gbuf_download(&wo) == MLAF_OK && mlaf_gbuf_download(&pe) == MLAF_OK;
        for (int i = 0; same && i < T * H * D; i++) same = ((const uint8_t *)f.body)[i] == 0xFF;
        for (int i = 0; same && i < T * H * 4; i++) same = ((const uint8_t *)wo.body)[i] == 0xFF;
        for (int i = 0; same && i < T * 2 * 192 * 4; i++) same = ((const uint8_t *)pe.body)[i] == 0xFF;
        tl_case(st == cases[k].want && strstr(msg, cases[k].needle) && same, nm, "%s: \"%s\"%s", mlaf_status_name(st),
                msg, same ? "" : " (an output was written)");
    }
    mlaf_gbuf *all[7] = {&q, &w, &f, &wo, &pos, &cs, &pe};
    for (int i = 0; i < 7; i++) mlaf_gbuf_free(all[i]);
    mlaf_context_free(ctx);
}

/* CUDA against the CPU, bit for bit (index_math.h and index_row.cuh compute the same steps in the
 * same order): the dense index output, every index cache byte and the topk fill of
 * mla_kv_cache_dsa, then indexer_q's q_fp8, w_out and q_pe, per dtype, style and Hadamard. Runs
 * where a GPU is visible. */
typedef struct xrun {
    mlaf_gbuf g[16];
    int n;
} xrun;

static void *xb(xrun *x, mlaf_backend be, size_t bytes, const void *init) {
    mlaf_gbuf *g = &x->g[x->n];
    if (mlaf_gbuf_alloc(g, be, bytes, init, 0) != MLAF_OK) return NULL;
    x->n++;
    return g->ptr;
}

static void xfree(xrun *x) {
    for (int i = 0; i < x->n; i++) mlaf_gbuf_free(&x->g[i]);
    x->n = 0;
}

/* One call of each op on backend be; the outputs' host images into outs[] (malloc'd). */
static int cross_run(mlaf_backend be, mlaf_dtype dt, mlaf_rope_style style, int hadamard, const void *const *in,
                     const size_t *insz, void **outs, size_t *outsz) {
    enum { T = 300, Q = 64, C = 512, R = 64, D = 128, NB = 6, BS = 64, H = 16, HQ = 3, DQ = 192 };
    mlaf_context *ctx = NULL;
    if (mlaf_context_create(&ctx, be) != MLAF_OK) return 0;
    xrun x = {{{0}}, 0};
    const size_t es = mlaf_dtype_size(dt);
    void *lat = xb(&x, be, insz[0], in[0]), *wq = xb(&x, be, insz[1], in[1]), *wkv = xb(&x, be, insz[2], in[2]);
    void *ik = xb(&x, be, insz[3], in[3]), *iw = xb(&x, be, insz[4], in[4]), *ib = xb(&x, be, insz[5], in[5]);
    void *pos = xb(&x, be, insz[6], in[6]), *cs = xb(&x, be, insz[7], in[7]), *sl = xb(&x, be, insz[8], in[8]);
    void *qi = xb(&x, be, insz[9], in[9]), *w = xb(&x, be, insz[10], in[10]), *qpe = xb(&x, be, insz[11], in[11]);
    void *kv = xb(&x, be, (size_t)NB * BS * (C + R) * es, NULL), *q = xb(&x, be, (size_t)T * Q * es, NULL);
    void *ic = xb(&x, be, (size_t)NB * BS * (D + 4) + 3, NULL), *io = xb(&x, be, (size_t)T * D * es, NULL);
    int ok = x.n == 16;
    mlaf_gbuf qf, wo;
    const int have_qf = mlaf_gbuf_alloc(&qf, be, (size_t)T * H * D, NULL, 0) == MLAF_OK;
    const int have_wo = mlaf_gbuf_alloc(&wo, be, (size_t)T * H * 4, NULL, 0) == MLAF_OK;
    ok = ok && have_qf && have_wo;
    /* index_cache, index_out, index_k, q_fp8, w_out, q_pe */
    mlaf_gbuf *outg[6] = {&x.g[14], &x.g[15], &x.g[3], &qf, &wo, &x.g[11]};
    if (ok) {
        mlaf_mla_kv_cache_params p = {Q, C, R, 1e-6f, 1e-6f, MLAF_ROPE_INTERLEAVED};
        mlaf_tensor tl = mlaf_tensor_2d(lat, dt, T, Q + C + R, Q + C + R), twq = mlaf_tensor_1d(wq, dt, Q),
                    twkv = mlaf_tensor_1d(wkv, dt, C), tpos = mlaf_tensor_1d(pos, MLAF_I64, T),
                    tcs = mlaf_tensor_2d(cs, MLAF_F32, 512, R, R), tsl = mlaf_tensor_1d(sl, MLAF_I64, T),
                    tkv = mlaf_tensor_3d(kv, dt, NB, BS, C + R, BS * (C + R), C + R), tq = mlaf_tensor_2d(q, dt, T, Q, Q),
                    tik = mlaf_tensor_2d(ik, dt, T, D, D + 24), tiw = mlaf_tensor_1d(iw, MLAF_F32, D),
                    tib = mlaf_tensor_1d(ib, MLAF_F32, D),
                    tic = mlaf_tensor_2d((char *)ic + 3, MLAF_U8, NB, BS * (D + 4), BS * (D + 4)),
                    tio = mlaf_tensor_2d(io, dt, T, D, D);
        mlaf_kv_cache_desc d = {MLAF_KV_PLAIN, &tkv, NULL, NULL, NULL, MLAF_FP8_DIV, MLAF_TILE_AMAX};
        mlaf_indexer_params ip = {style, hadamard, 1e-6f, 1e-4f, MLAF_INDEX_SCALE_UE8M0};
        mlaf_indexer_k ikd = {&tik, &tiw, &tib, &tic, &tio, NULL, 0, 0};
        ok = mlaf_mla_kv_cache_dsa(ctx, &p, &tl, &twq, &twkv, &tpos, &tcs, &tsl, &d, &tq, NULL, NULL, NULL, &ip,
                                   &ikd) == MLAF_OK;
        mlaf_tensor tqi = mlaf_tensor_3d(qi, dt, T, H, D, H * D, D), tw = mlaf_tensor_2d(w, MLAF_F32, T, H, H),
                    tqf = mlaf_tensor_3d(qf.ptr, MLAF_U8, T, H, D, H * D, D), two = mlaf_tensor_2d(wo.ptr, MLAF_F32, T, H, H),
                    tpe = mlaf_tensor_3d(qpe, dt, T, HQ, DQ, HQ * DQ, DQ);
        mlaf_rope_params pr = {64, MLAF_ROPE_INTERLEAVED};
        ok = ok && mlaf_indexer_q(ctx, &ip, &tqi, &tpos, &tcs, &tw, &tqf, &two, &tpe, &pr, NULL) == MLAF_OK;
        ok = ok && mlaf_context_sync(ctx) == MLAF_OK;
        for (int i = 0; ok && i < 6; i++) {
            ok = mlaf_gbuf_download(outg[i]) == MLAF_OK;
            outsz[i] = outg[i]->bytes;
            outs[i] = malloc(outsz[i] + 1);
            if (outs[i]) memcpy(outs[i], outg[i]->body, outsz[i]);
            ok = ok && outs[i];
        }
    }
    if (have_qf) mlaf_gbuf_free(&qf);
    if (have_wo) mlaf_gbuf_free(&wo);
    xfree(&x);
    mlaf_context_free(ctx);
    return ok;
}

static void cross_backend(void) {
    if (!mlaf_backend_available(MLAF_BACKEND_CUDA)) return;
    static const char *names[6] = {"index_cache", "index_out", "index_k (unchanged)", "q_fp8", "w_out", "q_pe"};
    for (int di = 0; di < 3; di++)
        for (int v = 0; v < 4; v++) {
            const mlaf_dtype dt = DTYPES[di];
            const mlaf_rope_style style = (mlaf_rope_style)(v & 1);
            const int had = v >> 1;
            char name[160];
            snprintf(name, sizeof name, "INDEXER(cuda == cpu bit for bit,dtype=%s,index_rope=%s,hadamard=%d)",
                     mlaf_dtype_name(dt), style_name(style), had);
            if (filtered_out(name)) continue;
            enum { T = 300, Q = 64, C = 512, R = 64, D = 128, NB = 6, BS = 64, H = 16, HQ = 3, DQ = 192 };
            const size_t es = mlaf_dtype_size(dt);
            size_t insz[12] = {(size_t)T * (Q + C + R) * es, Q * es, C * es, (size_t)T * (D + 24) * es, D * 4, D * 4,
                               T * 8, 512 * R * 4, T * 8, (size_t)T * H * D * es, (size_t)T * H * 4,
                               (size_t)T * HQ * DQ * es};
            void *in[12];
            mlaf_rng rng;
            mlaf_rng_seed(&rng, 0xc0ffee + (uint64_t)(di * 4 + v));
            int ok = 1;
            for (int i = 0; i < 12; i++) ok &= (in[i] = malloc(insz[i])) != NULL;
            if (ok) {
                mlaf_fill_normal(&rng, in[0], dt, (size_t)T * (Q + C + R), 0.0, 1.0);
                mlaf_fill_normal(&rng, in[1], dt, Q, 1.0, 0.2);
                mlaf_fill_normal(&rng, in[2], dt, C, 1.0, 0.2);
                mlaf_fill_normal(&rng, in[3], dt, (size_t)T * (D + 24), 0.3, 1.5);
                mlaf_fill_normal(&rng, in[4], MLAF_F32, D, 1.0, 0.3);
                mlaf_fill_normal(&rng, in[5], MLAF_F32, D, 0.0, 0.3);
                int64_t *pp = (int64_t *)in[6], *ss = (int64_t *)in[8];
                for (int t = 0; t < T; t++) pp[t] = (t * 37) % 512, ss[t] = t % 11 == 3 ? -1 : (t * 7) % (NB * BS);
                mlaf_rope_table_init((float *)in[7], 512, R, 10000.0);
                mlaf_fill_normal(&rng, in[9], dt, (size_t)T * H * D, 0.0, 1.0);
                mlaf_fill_normal(&rng, in[10], MLAF_F32, (size_t)T * H, 0.0, 1.0);
                mlaf_fill_normal(&rng, in[11], dt, (size_t)T * HQ * DQ, 0.0, 1.0);
            }
            void *oc[6] = {0}, *og[6] = {0};
            size_t zc[6] = {0}, zg[6] = {0};
            ok = ok && cross_run(MLAF_BACKEND_CPU, dt, style, had, (const void *const *)in, insz, oc, zc);
            ok = ok && cross_run(MLAF_BACKEND_CUDA, dt, style, had, (const void *const *)in, insz, og, zg);
            char why[200] = "";
            for (int i = 0; ok && i < 6; i++)
                if (zc[i] != zg[i] || memcmp(oc[i], og[i], zc[i])) {
                    size_t k = 0;
                    while (k < zc[i] && ((uint8_t *)oc[i])[k] == ((uint8_t *)og[i])[k]) k++;
                    snprintf(why, sizeof why, "%s differs at byte %zu", names[i], k);
                    ok = 0;
                }
            tl_case(ok, name, "%s", why[0] ? why : "a call failed");
            for (int i = 0; i < 12; i++) free(in[i]);
            for (int i = 0; i < 6; i++) free(oc[i]), free(og[i]);
        }
}

/* The harness must fail, naming the altered token. */
static void harness_fails(mlaf_backend be) {
    mlaf_context *ctx = tl_context(be);
    if (!ctx) return;
    for (int k = 0; k < 2; k++) {
        char name[160];
        snprintf(name, sizeof name, "%s(harness catches an altered output,backend=%s)", k ? "INDEXER_Q" : "MLA_KV_CACHE_DSA",
                 mlaf_backend_name(be));
        if (filtered_out(name)) continue;
        mlaf_verify_case c = mlaf_verify_case_default(mlaf_preset_find("deepseek-v3.2"), MLAF_BF16, 40, 99);
        c.indexer = 1;
        c.corrupt_from = 2; /* token 1: valid position (make_positions) and slot */
        mlaf_verify_result r;
        mlaf_status st = k ? mlaf_verify_indexer_q(ctx, &c, &r) : mlaf_verify_mla_kv_cache_dsa(ctx, &c, &r);
        tl_case(st == MLAF_OK && !r.passed && strstr(r.detail, "t=1"), name, "%s", r.detail);
    }
    mlaf_context_free(ctx);
}

int main(void) {
    mlaf_backend bes[MLAF_BACKEND_COUNT_];
    const int nb = tl_backends(bes);
    cross_backend();
    for (int i = 0; i < nb; i++) {
        planar_bytes(bes[i]);
        indexer_q_rejects(bes[i]);
        harness_fails(bes[i]);
    }
    return tl_run_suite("MLA_KV_CACHE_DSA", suite);
}
