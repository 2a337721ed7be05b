/*
 * test_row_quant.c — the row ops' quantized outputs (include/mlafuse/quant.h, mlaf_row_quant):
 * q_norm and k_nope of split_qk_norm, mla_kv_cache (plain and fp8_ds_mla caches) and
 * mla_kv_cache_dsa written in a GEMM-input format, on every backend:
 *   ROW_QUANT   per op x format x rounding x dtype x T: three calls on the same inputs — dense only
 *               (A), dense and quantized (B), quantized only (C, the dense q / k_nope NULL) — and
 *               B's dense outputs and caches equal A's, B's quantized bytes equal A's dense values
 *               through the separate quantize pass (gl_quantize_pass), C's equal B's; every
 *               buffer's guard bytes intact. T runs through the CUDA launch shapes (1: split block,
 *               37: block, 1100: warp / bulk), and a latent an element off 16 bytes takes the
 *               generic kernel;
 *   REJECT      bad quantized outputs rejected with their status and a message naming the argument,
 *               nothing written.
 */
#include <stdlib.h>
#include <string.h>

#include "gemm_layout.h"
#include "testlib.h"

static const mlaf_dtype DTYPES[3] = {MLAF_F32, MLAF_F16, MLAF_BF16};
static const struct {
    mlaf_gemm_format f;
    mlaf_gemm_scale s;
} QF[7] = {{MLAF_GEMM_FP8_1X128, MLAF_GEMM_SCALE_F32},      {MLAF_GEMM_FP8_1X128, MLAF_GEMM_SCALE_UE8M0},
           {MLAF_GEMM_FP8_1X128_MN, MLAF_GEMM_SCALE_F32},   {MLAF_GEMM_FP8_1X128_UE8M0, MLAF_GEMM_SCALE_UE8M0},
           {MLAF_GEMM_MXFP8, MLAF_GEMM_SCALE_MX_FLOOR},     {MLAF_GEMM_MXFP8, MLAF_GEMM_SCALE_MX_CEIL},
           {MLAF_GEMM_FP8_1X128_CM, MLAF_GEMM_SCALE_UE8M0}};

enum { OP_SPLIT, OP_KV, OP_DS_MLA, OP_DSA, OP_COUNT };
static const char *const OP_NAMES[OP_COUNT] = {"split_qk_norm", "mla_kv_cache", "mla_kv_cache/fp8_ds_mla",
                                               "mla_kv_cache_dsa"};
enum { NB = 40, BS = 32, MAXPOS = 4096, IDX_D = 128 };

/* One case's inputs (host) and its three runs' device buffers. */
typedef struct rq_case {
    int op, qi, ki; /* the op, q's and k_nope's rows of QF */
    mlaf_dtype dt;
    int64_t T, Q, C, R, off; /* off: the latent's first element (1: rows off 16 bytes) */
} rq_case;

/* The buffers of one run: inputs, dense outputs, cache(s), quantized outputs. */
enum { B_LAT, B_WQ, B_WKV, B_POS, B_CS, B_SL, B_Q, B_KN, B_PE, B_CACHE, B_IK, B_IW, B_IB, B_IC,
       B_QD, B_QS, B_KD, B_KS, B_COUNT };

typedef struct rq_run {
    mlaf_gbuf g[B_COUNT];
    int have[B_COUNT];
} rq_run;

static size_t scales_bytes(mlaf_gemm_format f, int64_t T, int64_t K, mlaf_dtype *dt, int64_t sh[2], int64_t *ld) {
    if (mlaf_gemm_scales_shape(f, T, K, dt, sh, ld) != MLAF_OK) return 0;
    return (size_t)((sh[0] > 0 ? sh[0] : 1) * *ld) * mlaf_dtype_size(*dt);
}

static size_t record_bytes(const rq_case *c) {
    return c->op == OP_DS_MLA ? (size_t)(c->C + c->C / 32 + 2 * c->R) : (size_t)(c->C + c->R) * mlaf_dtype_size(c->dt);
}

/* Allocates run r's buffers from the case's host inputs in[]; quant: 0 none, 1 dense and quantized,
 * 2 quantized only. Returns 1 on success. */
static int run_alloc(rq_run *r, mlaf_backend be, const rq_case *c, void *const *in, const size_t *insz, int quant) {
    memset(r, 0, sizeof *r);
    const size_t es = mlaf_dtype_size(c->dt);
    size_t sz[B_COUNT] = {0};
    for (int i = B_LAT; i <= B_SL; i++) sz[i] = insz[i];
    sz[B_Q] = quant == 2 ? 0 : (size_t)(c->T * c->Q) * es;
    sz[B_KN] = quant == 2 ? 0 : (size_t)(c->T * c->C) * es;
    sz[B_PE] = c->op == OP_SPLIT ? (size_t)(c->T * c->R) * es : 0;
    sz[B_CACHE] = c->op == OP_SPLIT ? 0 : (size_t)NB * BS * record_bytes(c);
    if (c->op == OP_DSA) {
        sz[B_IK] = insz[B_IK], sz[B_IW] = insz[B_IW], sz[B_IB] = insz[B_IB];
        sz[B_IC] = (size_t)NB * BS * (IDX_D + 4);
    }
    if (quant) {
        mlaf_dtype sdt;
        int64_t sh[2], ld;
        sz[B_QD] = (size_t)(c->T * c->Q), sz[B_QS] = scales_bytes(QF[c->qi].f, c->T, c->Q, &sdt, sh, &ld);
        sz[B_KD] = (size_t)(c->T * c->C), sz[B_KS] = scales_bytes(QF[c->ki].f, c->T, c->C, &sdt, sh, &ld);
    }
    for (int i = 0; i < B_COUNT; i++) {
        if (!sz[i]) continue;
        const void *init = i <= B_SL || (i >= B_IK && i <= B_IB) ? in[i] : NULL;
        if (mlaf_gbuf_alloc(&r->g[i], be, sz[i], init, 0) != MLAF_OK) return 0;
        r->have[i] = 1;
    }
    return 1;
}

static void run_free(rq_run *r) {
    for (int i = 0; i < B_COUNT; i++)
        if (r->have[i]) mlaf_gbuf_free(&r->g[i]);
}

static mlaf_gemm_out gemm_out_of(rq_run *r, int bd, int bs, mlaf_gemm_format f, mlaf_gemm_scale s, int64_t T, int64_t K,
                                 mlaf_tensor *td, mlaf_tensor *ts) {
    mlaf_gemm_out o;
    memset(&o, 0, sizeof o);
    if (!r->have[bd]) return o;
    mlaf_dtype sdt;
    int64_t sh[2], ld;
    scales_bytes(f, T, K, &sdt, sh, &ld);
    *td = mlaf_tensor_2d(r->g[bd].ptr, MLAF_U8, T, K, K);
    *ts = mlaf_tensor_2d(r->g[bs].ptr, sdt, sh[0], sh[1], ld);
    o.format = f, o.scale = s, o.data = td, o.scales = ts;
    return o;
}

/* One call of the case's op on run r (quant as in run_alloc). */
static mlaf_status run_call(mlaf_context *ctx, const rq_case *c, rq_run *r, int quant) {
    const mlaf_dtype dt = c->dt;
    const int64_t T = c->T, Q = c->Q, C = c->C, R = c->R, W = Q + C + R;
    mlaf_tensor tl = mlaf_tensor_2d((char *)r->g[B_LAT].ptr + c->off * (int64_t)mlaf_dtype_size(dt), dt, T, W, W + c->off);
    mlaf_tensor twq = mlaf_tensor_1d(r->g[B_WQ].ptr, dt, Q), twkv = mlaf_tensor_1d(r->g[B_WKV].ptr, dt, C);
    mlaf_tensor tq = mlaf_tensor_2d(r->g[B_Q].ptr, dt, T, Q, Q), tk = mlaf_tensor_2d(r->g[B_KN].ptr, dt, T, C, C);
    mlaf_tensor tpe = mlaf_tensor_2d(r->g[B_PE].ptr, dt, T, R, R);
    mlaf_tensor tqd, tqs, tkd, tks;
    mlaf_row_quant rq;
    rq.q = gemm_out_of(r, B_QD, B_QS, QF[c->qi].f, QF[c->qi].s, T, Q, &tqd, &tqs);
    rq.k_nope = gemm_out_of(r, B_KD, B_KS, QF[c->ki].f, QF[c->ki].s, T, C, &tkd, &tks);
    const mlaf_tensor *q = r->have[B_Q] ? &tq : NULL, *kn = r->have[B_KN] ? &tk : NULL;
    if (c->op == OP_SPLIT) {
        const mlaf_split_qk_norm_params p = {(int32_t)Q, (int32_t)C, (int32_t)R, 1e-6f, 1e-5f, 0};
        return quant ? mlaf_split_qk_norm_quant(ctx, &p, &tl, &twq, &twkv, q, kn, &tpe, &rq)
                     : mlaf_split_qk_norm(ctx, &p, &tl, &twq, &twkv, q, kn, &tpe);
    }
    const mlaf_mla_kv_cache_params p = {(int32_t)Q, (int32_t)C, (int32_t)R, 1e-6f, 1e-5f, MLAF_ROPE_INTERLEAVED, 0};
    mlaf_tensor tpos = mlaf_tensor_1d(r->g[B_POS].ptr, MLAF_I64, T), tcs = mlaf_tensor_2d(r->g[B_CS].ptr, MLAF_F32, MAXPOS, R, R);
    mlaf_tensor tsl = mlaf_tensor_1d(r->g[B_SL].ptr, MLAF_I64, T), tc;
    mlaf_kv_cache_desc d = {MLAF_KV_PLAIN, &tc, NULL, NULL, NULL, MLAF_FP8_DIV, MLAF_TILE_AMAX};
    if (c->op == OP_DS_MLA) {
        const int64_t rb = (int64_t)record_bytes(c);
        tc = mlaf_tensor_3d(r->g[B_CACHE].ptr, MLAF_U8, NB, BS, rb, BS * rb, rb);
        d.format = MLAF_KV_FP8_DS_MLA, d.tile_scale = MLAF_TILE_UE8M0;
    } else {
        tc = mlaf_tensor_3d(r->g[B_CACHE].ptr, dt, NB, BS, C + R, BS * (C + R), C + R);
    }
    if (c->op != OP_DSA)
        return quant ? mlaf_mla_kv_cache_quant(ctx, &p, &tl, &twq, &twkv, &tpos, &tcs, &tsl, &d, q, kn, NULL, NULL, &rq)
                     : mlaf_mla_kv_cache_fmt(ctx, &p, &tl, &twq, &twkv, &tpos, &tcs, &tsl, &d, q, kn, NULL, NULL);
    mlaf_tensor tik = mlaf_tensor_2d(r->g[B_IK].ptr, dt, T, IDX_D, IDX_D), tiw = mlaf_tensor_1d(r->g[B_IW].ptr, MLAF_F32, IDX_D),
                tib = mlaf_tensor_1d(r->g[B_IB].ptr, MLAF_F32, IDX_D),
                tic = mlaf_tensor_2d(r->g[B_IC].ptr, MLAF_U8, NB, BS * (IDX_D + 4), BS * (IDX_D + 4));
    const mlaf_indexer_params ip = {MLAF_ROPE_INTERLEAVED, 0, 1e-6f, 1e-4f, MLAF_INDEX_SCALE_UE8M0};
    const mlaf_indexer_k ik = {&tik, &tiw, &tib, &tic, NULL, NULL, 0, 0};
    return quant ? mlaf_mla_kv_cache_dsa_quant(ctx, &p, &tl, &twq, &twkv, &tpos, &tcs, &tsl, &d, q, kn, NULL, NULL, &ip,
                                               &ik, &rq)
                 : mlaf_mla_kv_cache_dsa(ctx, &p, &tl, &twq, &twkv, &tpos, &tcs, &tsl, &d, q, kn, NULL, NULL, &ip, &ik);
}

static int same(const rq_run *a, const rq_run *b, int i) {
    return a->have[i] && b->have[i] && a->g[i].bytes == b->g[i].bytes && !memcmp(a->g[i].body, b->g[i].body, a->g[i].bytes);
}

/* B's quantized part (bd, bs) against the quantize pass over A's dense output `dense`. */
static int pass_equal(const rq_case *c, const rq_run *A, const rq_run *B, int dense, int bd, int bs, int fi, int64_t K) {
    mlaf_dtype sdt;
    int64_t sh[2], ld;
    const size_t sb = scales_bytes(QF[fi].f, c->T, K, &sdt, sh, &ld);
    uint8_t *pd = malloc((size_t)(c->T * K) + 1), *ps = malloc(sb);
    memcpy(ps, B->g[bs].body, sb); /* padding the op leaves alone compares equal */
    gl_quantize_pass(QF[fi].f, QF[fi].s, MLAF_GEMM_DEFAULT_EPS, A->g[dense].body, c->dt, c->T, K, K, pd, ps, ld);
    const int ok = !memcmp(pd, B->g[bd].body, (size_t)(c->T * K)) && !memcmp(ps, B->g[bs].body, sb);
    free(pd), free(ps);
    return ok;
}

static void run_case(mlaf_context *ctx, const rq_case *c) {
    const mlaf_backend be = mlaf_context_backend(ctx);
    const mlaf_dtype dt = c->dt;
    const size_t es = mlaf_dtype_size(dt);
    const int64_t T = c->T, W = c->Q + c->C + c->R;
    char name[256];
    snprintf(name, sizeof name, "ROW_QUANT(op=%s,T=%lld,Q=%lld,dtype=%s,q=%s/%s,k_nope=%s/%s%s,backend=%s)", OP_NAMES[c->op],
             (long long)T, (long long)c->Q, mlaf_dtype_name(dt), mlaf_gemm_format_name(QF[c->qi].f),
             mlaf_gemm_scale_name(QF[c->qi].s), mlaf_gemm_format_name(QF[c->ki].f), mlaf_gemm_scale_name(QF[c->ki].s),
             c->off ? ",rows_off_16B" : "", mlaf_backend_name(be));
    /* host inputs */
    mlaf_rng rng;
    mlaf_rng_seed(&rng, 9001u + 131u * (unsigned)c->op + 17u * (unsigned)c->qi + (unsigned)T);
    void *in[B_COUNT] = {0};
    size_t insz[B_COUNT] = {0};
    insz[B_LAT] = (size_t)(T * (W + c->off) + c->off) * es, insz[B_WQ] = (size_t)c->Q * es, insz[B_WKV] = (size_t)c->C * es;
    insz[B_POS] = (size_t)T * 8, insz[B_CS] = (size_t)MAXPOS * c->R * 4, insz[B_SL] = (size_t)T * 8;
    insz[B_IK] = (size_t)T * IDX_D * es, insz[B_IW] = insz[B_IB] = IDX_D * 4;
    for (int i = 0; i < B_COUNT; i++)
        if (insz[i]) in[i] = malloc(insz[i]);
    mlaf_fill_normal(&rng, in[B_LAT], dt, insz[B_LAT] / es, 0.0, 1.5);
    mlaf_fill_normal(&rng, in[B_WQ], dt, (size_t)c->Q, 1.0, 0.3);
    mlaf_fill_normal(&rng, in[B_WKV], dt, (size_t)c->C, 1.0, 0.3);
    mlaf_fill_normal(&rng, in[B_IK], dt, (size_t)T * IDX_D, 0.0, 1.0);
    mlaf_fill_normal(&rng, in[B_IW], MLAF_F32, IDX_D, 1.0, 0.2);
    mlaf_fill_normal(&rng, in[B_IB], MLAF_F32, IDX_D, 0.0, 0.2);
    mlaf_rope_table_init(in[B_CS], MAXPOS, (int32_t)c->R, 10000.0);
    for (int64_t t = 0; t < T; t++) {
        ((int64_t *)in[B_POS])[t] = (t * 37) % MAXPOS;
        ((int64_t *)in[B_SL])[t] = t % 5 == 3 ? -1 : (t * 7) % (NB * BS); /* some tokens skip the cache */
    }
    rq_run run[3];
    int ok = 1;
    mlaf_status st = MLAF_OK;
    for (int k = 0; k < 3; k++) ok = ok && run_alloc(&run[k], be, c, in, insz, k);
    for (int k = 0; k < 3 && ok && st == MLAF_OK; k++) st = run_call(ctx, c, &run[k], k);
    if (ok && st == MLAF_OK) st = mlaf_context_sync(ctx);
    for (int k = 0; k < 3 && ok && st == MLAF_OK; k++)
        for (int i = 0; i < B_COUNT && st == MLAF_OK; i++)
            if (run[k].have[i]) st = mlaf_gbuf_download(&run[k].g[i]);
    if (!ok || st != MLAF_OK) {
        tl_case(0, name, "%s: %s", ok ? mlaf_status_name(st) : "alloc failed", mlaf_context_last_error(ctx));
    } else {
        const rq_run *A = &run[0], *B = &run[1], *Cq = &run[2];
        int dense = same(A, B, B_Q) && same(A, B, B_KN) && (c->op != OP_SPLIT || same(A, B, B_PE));
        int caches = c->op == OP_SPLIT || (same(A, B, B_CACHE) && same(A, Cq, B_CACHE));
        if (c->op == OP_DSA) caches = caches && same(A, B, B_IC) && same(A, Cq, B_IC);
        const int pq = pass_equal(c, A, B, B_Q, B_QD, B_QS, c->qi, c->Q);
        const int pk = pass_equal(c, A, B, B_KN, B_KD, B_KS, c->ki, c->C);
        const int only = same(B, Cq, B_QD) && same(B, Cq, B_QS) && same(B, Cq, B_KD) && same(B, Cq, B_KS);
        int guards = 1;
        for (int k = 0; k < 3; k++)
            for (int i = 0; i < B_COUNT; i++)
                if (run[k].have[i]) guards = guards && mlaf_gbuf_guards_ok(&run[k].g[i]);
        tl_case(dense && caches && pq && pk && only && guards, name,
                "dense outputs %s; caches %s; quantized q %s the quantize pass; quantized k_nope %s; quantized-only "
                "call %s; guards %s",
                dense ? "equal" : "DIFFER", caches ? "equal" : "DIFFER", pq ? "equals" : "DIFFERS from",
                pk ? "equals the pass" : "DIFFERS from the pass", only ? "equal" : "DIFFERS", guards ? "intact" : "WRITTEN");
    }
    for (int k = 0; k < 3; k++) run_free(&run[k]);
    for (int i = 0; i < B_COUNT; i++) free(in[i]);
}

static void sweep(mlaf_context *ctx, int quick) {
    const int cuda = mlaf_context_backend(ctx) == MLAF_BACKEND_CUDA;
    const int64_t Ts[3] = {1, 37, 1100};
    for (int op = 0; op < OP_COUNT; op++)
        for (int di = 0; di < 3; di++) {
            const mlaf_dtype dt = DTYPES[di];
            if (op == OP_DS_MLA && dt != MLAF_BF16) continue; /* fp8_ds_mla takes bf16 latents */
            for (int qi = 0; qi < 7; qi++) {
                if (quick && (qi + di + op) % 3) continue;
                for (int ti = 0; ti < 3; ti++) {
                    if (!cuda && ti == 2 && (qi + op) % 4) continue; /* the CPU has one path: sample its large T */
                    rq_case c = {op, qi, (qi + 3) % 7, dt, Ts[ti], op == OP_SPLIT && qi % 2 ? 1536 : 256, 512, 64, 0};
                    run_case(ctx, &c);
                }
                if (qi % 3 == 0 && op != OP_DS_MLA) { /* rows an element off 16 bytes (CUDA: the generic kernel) */
                    rq_case c = {op, qi, (qi + 5) % 7, dt, 37, 256, 512, 64, 1};
                    run_case(ctx, &c);
                }
            }
        }
}

/* ---- REJECT ---------------------------------------------------------------------------- */

static void reject_cases(mlaf_context *ctx) {
    const mlaf_backend be = mlaf_context_backend(ctx);
    enum { T = 4, Q = 256, C = 512, R = 64, W = Q + C + R };
    mlaf_gbuf gl, gwq, gwkv, gq, gk, gpe, gd, gs, gd2, gs2;
    mlaf_rng rng;
    mlaf_rng_seed(&rng, 77);
    uint16_t lat[T * W], wq[Q], wkv[C];
    mlaf_fill_normal(&rng, lat, MLAF_BF16, T * W, 0.0, 1.0);
    mlaf_fill_normal(&rng, wq, MLAF_BF16, Q, 1.0, 0.1);
    mlaf_fill_normal(&rng, wkv, MLAF_BF16, C, 1.0, 0.1);
    int ok = mlaf_gbuf_alloc(&gl, be, sizeof lat, lat, 0) == MLAF_OK && mlaf_gbuf_alloc(&gwq, be, sizeof wq, wq, 0) == MLAF_OK &&
             mlaf_gbuf_alloc(&gwkv, be, sizeof wkv, wkv, 0) == MLAF_OK && mlaf_gbuf_alloc(&gq, be, T * Q * 2, NULL, 0) == MLAF_OK &&
             mlaf_gbuf_alloc(&gk, be, T * C * 2, NULL, 0) == MLAF_OK && mlaf_gbuf_alloc(&gpe, be, T * R * 2, NULL, 0) == MLAF_OK &&
             mlaf_gbuf_alloc(&gd, be, T * C, NULL, 0) == MLAF_OK && mlaf_gbuf_alloc(&gs, be, 4 * 64, NULL, 0) == MLAF_OK &&
             mlaf_gbuf_alloc(&gd2, be, T * C, NULL, 0) == MLAF_OK && mlaf_gbuf_alloc(&gs2, be, 4 * 64, NULL, 0) == MLAF_OK;
    if (!ok) {
        tl_case(0, "ROW_QUANT_REJECT(setup)", "alloc failed");
        return;
    }
    static const struct {
        const char *what, *needle;
        mlaf_status want;
    } K[] = {
        {"q group does not divide q_lora_rank 96", "quant->q", MLAF_ERR_SHAPE},
        {"q scales of the wrong shape", "quant->q.scales", MLAF_ERR_SHAPE},
        {"MN-major scales misaligned", "quant->q.scales", MLAF_ERR_STRIDE},
        {"quantized q with q_lora_rank 0", "quant->q", MLAF_ERR_INVALID_ARGUMENT},
        {"k_nope data overlaps the latent", "quant->k_nope.data", MLAF_ERR_OVERLAP},
        {"k_nope scales overlap q data", "quant->k_nope", MLAF_ERR_OVERLAP},
        {"NONE with a data tensor", "quant->q", MLAF_ERR_INVALID_ARGUMENT},
        {"unknown format", "quant->q", MLAF_ERR_INVALID_ARGUMENT},
        {"no dense q and no quantized q", "q", MLAF_ERR_NULL_POINTER},
    };
    for (int k = 0; k < (int)(sizeof K / sizeof K[0]); k++) {
        int32_t q_rank = Q;
        mlaf_tensor tl = mlaf_tensor_2d(gl.ptr, MLAF_BF16, T, W, W), twq = mlaf_tensor_1d(gwq.ptr, MLAF_BF16, Q),
                    twkv = mlaf_tensor_1d(gwkv.ptr, MLAF_BF16, C), tq = mlaf_tensor_2d(gq.ptr, MLAF_BF16, T, Q, Q),
                    tk = mlaf_tensor_2d(gk.ptr, MLAF_BF16, T, C, C), tpe = mlaf_tensor_2d(gpe.ptr, MLAF_BF16, T, R, R);
        mlaf_tensor qd = mlaf_tensor_2d(gd.ptr, MLAF_U8, T, Q, Q), qs = mlaf_tensor_2d(gs.ptr, MLAF_F32, T, Q / 128, Q / 128);
        mlaf_tensor kd = mlaf_tensor_2d(gd2.ptr, MLAF_U8, T, C, C), ks = mlaf_tensor_2d(gs2.ptr, MLAF_F32, T, C / 128, C / 128);
        mlaf_row_quant rq = {{MLAF_GEMM_FP8_1X128, MLAF_GEMM_SCALE_F32, &qd, &qs, 0.0f},
                             {MLAF_GEMM_FP8_1X128, MLAF_GEMM_SCALE_F32, &kd, &ks, 0.0f}};
        const mlaf_tensor *q = &tq, *wqp = &twq;
        mlaf_tensor lat96 = mlaf_tensor_2d(gl.ptr, MLAF_BF16, T, 96 + C + R, W), wq96 = mlaf_tensor_1d(gwq.ptr, MLAF_BF16, 96),
                    q96 = mlaf_tensor_2d(gq.ptr, MLAF_BF16, T, 96, 96), qd96 = mlaf_tensor_2d(gd.ptr, MLAF_U8, T, 96, 96);
        mlaf_tensor tl0 = mlaf_tensor_2d((char *)gl.ptr + Q * 2, MLAF_BF16, T, C + R, W);
        switch (k) {
        case 0: q_rank = 96, tl = lat96, wqp = &wq96, q = &q96, rq.q.data = &qd96; break;
        case 1: qs.shape[1] = 3; break;
        case 2: rq.q.format = MLAF_GEMM_FP8_1X128_MN, qs = mlaf_tensor_2d((char *)gs.ptr + 4, MLAF_F32, Q / 128, T, T); break;
        case 3: q_rank = 0, tl = tl0, wqp = NULL, q = NULL; break;
        case 4: kd = mlaf_tensor_2d(gl.ptr, MLAF_U8, T, C, W * 2); break;
        case 5: ks = mlaf_tensor_2d(gd.ptr, MLAF_F32, T, C / 128, C / 128); break;
        case 6: rq.q.format = MLAF_GEMM_NONE; break;
        case 7: rq.q.format = (mlaf_gemm_format)77; break;
        case 8: rq.q.format = MLAF_GEMM_NONE, rq.q.data = NULL, rq.q.scales = NULL, q = NULL; break;
        }
        const mlaf_split_qk_norm_params p = {q_rank, C, R, 1e-6f, 1e-6f, 0};
        mlaf_gbuf *outs[7] = {&gq, &gk, &gpe, &gd, &gs, &gd2, &gs2};
        for (int i = 0; i < 7; i++) memset(outs[i]->body, 0x5A, outs[i]->bytes), mlaf_gbuf_upload(outs[i]);
        const mlaf_status st = mlaf_split_qk_norm_quant(ctx, &p, &tl, wqp, &twkv, q, &tk, &tpe, &rq);
        const char *msg = mlaf_context_last_error(ctx);
        int untouched = mlaf_context_sync(ctx) == MLAF_OK;
        for (int i = 0; i < 7; i++) {
            untouched = untouched && mlaf_gbuf_download(outs[i]) == MLAF_OK && mlaf_gbuf_guards_ok(outs[i]);
            for (size_t b = 0; untouched && b < outs[i]->bytes; b++) untouched = ((uint8_t *)outs[i]->body)[b] == 0x5A;
        }
        char name[160];
        snprintf(name, sizeof name, "ROW_QUANT_REJECT(%s,backend=%s)", K[k].what, mlaf_backend_name(be));
        tl_case(st == K[k].want && strstr(msg, K[k].needle) && untouched, name, "status %s (want %s), message \"%s\", outputs %s",
                mlaf_status_name(st), mlaf_status_name(K[k].want), msg, untouched ? "untouched" : "WRITTEN");
    }
    /* a quantized k_nope with DeepSeek-V4's rope tail */
    {
        const mlaf_mla_kv_cache_params p = {Q, C, 0, 1e-6f, 1e-6f, MLAF_ROPE_INTERLEAVED, 64};
        mlaf_tensor tl = mlaf_tensor_2d(gl.ptr, MLAF_BF16, T, Q + C, W), twq = mlaf_tensor_1d(gwq.ptr, MLAF_BF16, Q),
                    twkv = mlaf_tensor_1d(gwkv.ptr, MLAF_BF16, C), tq = mlaf_tensor_2d(gq.ptr, MLAF_BF16, T, Q, Q);
        float cs[16 * 64];
        mlaf_rope_table_init(cs, 16, 64, 10000.0);
        int64_t pos[T] = {0, 1, 2, 3}, sl[T] = {0, 1, 2, 3};
        mlaf_gbuf gp, gc, gsl, gcache;
        int ok2 = mlaf_gbuf_alloc(&gp, be, sizeof pos, pos, 0) == MLAF_OK && mlaf_gbuf_alloc(&gc, be, sizeof cs, cs, 0) == MLAF_OK &&
                  mlaf_gbuf_alloc(&gsl, be, sizeof sl, sl, 0) == MLAF_OK &&
                  mlaf_gbuf_alloc(&gcache, be, 8 * C * 2, NULL, 0) == MLAF_OK;
        mlaf_tensor tpos = mlaf_tensor_1d(gp.ptr, MLAF_I64, T), tcs = mlaf_tensor_2d(gc.ptr, MLAF_F32, 16, 64, 64),
                    tsl = mlaf_tensor_1d(gsl.ptr, MLAF_I64, T), tc = mlaf_tensor_3d(gcache.ptr, MLAF_BF16, 1, 8, C, 8 * C, C);
        mlaf_tensor kd = mlaf_tensor_2d(gd2.ptr, MLAF_U8, T, C, C), ks = mlaf_tensor_2d(gs2.ptr, MLAF_F32, T, C / 128, C / 128);
        mlaf_row_quant rq = {{MLAF_GEMM_NONE, MLAF_GEMM_SCALE_F32, NULL, NULL, 0.0f},
                             {MLAF_GEMM_FP8_1X128, MLAF_GEMM_SCALE_F32, &kd, &ks, 0.0f}};
        mlaf_kv_cache_desc d = {MLAF_KV_PLAIN, &tc, NULL, NULL, NULL, MLAF_FP8_DIV, MLAF_TILE_AMAX};
        const mlaf_status st = ok2 ? mlaf_mla_kv_cache_quant(ctx, &p, &tl, &twq, &twkv, &tpos, &tcs, &tsl, &d, &tq, NULL,
                                                             NULL, NULL, &rq)
                                   : MLAF_ERR_OUT_OF_MEMORY;
        const char *msg = mlaf_context_last_error(ctx);
        char name[160];
        snprintf(name, sizeof name, "ROW_QUANT_REJECT(quantized k_nope with kv_rope_tail,backend=%s)", mlaf_backend_name(be));
        tl_case(st == MLAF_ERR_INVALID_ARGUMENT && strstr(msg, "quant->k_nope"), name, "status %s, message \"%s\"",
                mlaf_status_name(st), msg);
        mlaf_gbuf_free(&gp), mlaf_gbuf_free(&gc), mlaf_gbuf_free(&gsl), mlaf_gbuf_free(&gcache);
    }
    mlaf_gbuf *all[10] = {&gl, &gwq, &gwkv, &gq, &gk, &gpe, &gd, &gs, &gd2, &gs2};
    for (int i = 0; i < 10; i++) mlaf_gbuf_free(all[i]);
}

static void suite(mlaf_context *ctx, int quick, const char *tag) {
    if (tag) { /* the forced instruction-set paths: one sampled sweep */
        rq_case c = {OP_KV, 1, 4, MLAF_BF16, 37, 256, 512, 64, 0};
        run_case(ctx, &c);
        return;
    }
    sweep(ctx, quick);
    reject_cases(ctx);
}

int main(void) { return tl_run_suite("ROW_QUANT", suite); }
