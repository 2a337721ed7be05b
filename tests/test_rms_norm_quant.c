/*
 * test_rms_norm_quant.c — rms_norm_quant (docs/gemm_formats.md) on every backend and, on the CPU, every
 * forced instruction-set path:
 *   RMS_NORM_QUANT  the oracle sweep (mlaf_verify_rms_norm_quant): every format x rounding x dtype,
 *                   T from 0, hidden 2048 / 7168 / 16384 and widths the groups divide, dense-only
 *                   widths any K >= 1; with and without the residual, strided rows, in place (y = x),
 *                   q alone, f32 weights, a non-default eps;
 *   FUSED_EQ_UNFUSED  the fused call's bytes equal those of a dense-only call followed by a separate
 *                   quantize pass (gl_quantize_pass: frexp-based scales), and those of a q-only call;
 *   PATHS           rows aligned to 16 bytes and rows an element off give the same bits (CUDA: its
 *                   vector and element paths);
 *   ANY_T           a row's bytes do not depend on the call's T, K = 2048 / 7168 / 16384, bf16 and f32
 *                   (CUDA: the one- and two-vector-a-thread shapes);
 *   LAYOUT_OP       the layouts' hand-written offsets (gemm_layout.c) through the op itself;
 *   REJECT          bad calls rejected with their status and a message naming the argument, every
 *                   buffer and guard byte untouched.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../src/fp8.h"
#include "../src/half.h"
#include "gemm_layout.h"
#include "testlib.h"

static const mlaf_dtype DTYPES[3] = {MLAF_F32, MLAF_F16, MLAF_BF16};
static const struct {
    mlaf_gemm_format f;
    mlaf_gemm_scale s;
} QF[8] = {{MLAF_GEMM_NONE, MLAF_GEMM_SCALE_F32},          {MLAF_GEMM_FP8_1X128, MLAF_GEMM_SCALE_F32},
           {MLAF_GEMM_FP8_1X128, MLAF_GEMM_SCALE_UE8M0},     {MLAF_GEMM_FP8_1X128_MN, MLAF_GEMM_SCALE_F32},
           {MLAF_GEMM_FP8_1X128_MN, MLAF_GEMM_SCALE_UE8M0},  {MLAF_GEMM_FP8_1X128_UE8M0, MLAF_GEMM_SCALE_UE8M0},
           {MLAF_GEMM_MXFP8, MLAF_GEMM_SCALE_MX_FLOOR},      {MLAF_GEMM_MXFP8, MLAF_GEMM_SCALE_MX_CEIL}};

static void run(mlaf_context *ctx, const mlaf_verify_case *c, const char *tag) {
    char name[320];
    snprintf(name, sizeof name, "RMS_NORM_QUANT(K=%lld,T=%lld,dtype=%s,q=%s%s%s,backend=%s%s%s%s%s%s%s%s)",
             (long long)c->hidden, (long long)c->T, mlaf_dtype_name(c->dtype), mlaf_gemm_format_name(c->q_format),
             c->q_format ? "/" : "", c->q_format ? mlaf_gemm_scale_name(c->q_scale) : "",
             mlaf_backend_name(mlaf_context_backend(ctx)), c->residual ? ",residual" : "", c->strided ? ",strided" : "",
             c->in_place ? ",in_place" : "", c->no_dense ? ",q_only" : "", c->weight_dtype != c->dtype ? ",w=f32" : "",
             tag ? "," : "", tag ? tag : "");
    mlaf_verify_result r;
    const mlaf_status st = mlaf_verify_rms_norm_quant(ctx, c, &r);
    tl_case(st == MLAF_OK && r.passed, name, "%s [%s, worst %.3g units]", r.detail, mlaf_status_name(st), r.worst_units);
}

static mlaf_verify_case make_case(int64_t K, int64_t T, mlaf_dtype dt, int qi, int variant, uint64_t seed) {
    mlaf_verify_case c = mlaf_verify_case_default(NULL, dt, T, seed);
    c.cfg.rms_norm_eps = 1e-6f;
    c.hidden = K;
    c.q_format = QF[qi].f;
    c.q_scale = QF[qi].s;
    switch (variant) {
    case 1: c.strided = 1, c.residual = 1; break;
    case 2: c.in_place = 1, c.residual = 1; break;
    case 3:
        c.residual = 1, c.strided = 1;
        if (c.q_format) c.no_dense = 1;
        else c.weight_dtype = MLAF_F32;
        break;
    case 4:
        c.residual = 1;
        c.weight_dtype = MLAF_F32;
        break;
    default: break;
    }
    return c;
}

static void sweep(mlaf_context *ctx, int quick, const char *tag) {
    const int64_t Ts[5] = {0, 1, 7, 257, 4099};
    const int nT = tag ? 3 : quick ? 4 : 5;
    for (int qi = 0; qi < 8; qi++)
        for (int di = 0; di < 3; di++)
            for (int ti = tag ? 1 : 0; ti < nT; ti++) {
                if (Ts[ti] == 4099 && (qi + di) % 3 != 0) continue; /* the large T: a third of the cases */
                const int64_t K = (qi + ti + di) % 2 ? 7168 : 2048;
                mlaf_verify_case c = make_case(K, Ts[ti], DTYPES[di], qi, (qi + di + ti) % 5,
                                               1000u * (unsigned)qi + 100u * (unsigned)di + (unsigned)ti);
                run(ctx, &c, tag);
            }
    if (tag) return;
    /* widths: the largest family hidden size; widths the groups divide (K = 640: 5 groups, the packed
     * layout's second i32 half padding; 1152: 9 groups; 1504 = 47 x 32 for mxfp8); dense-only any K */
    static const struct {
        int64_t K;
        int qi, variant;
    } W[] = {{16384, 2, 1}, {16384, 6, 3}, {640, 5, 1}, {1152, 5, 3}, {1152, 3, 2}, {1504, 7, 1},
             {1504, 6, 4},  {1, 0, 1},     {3, 0, 2},   {77, 0, 3},   {1000, 0, 4}, {4097, 0, 1}};
    for (size_t w = 0; w < sizeof W / sizeof W[0]; w++)
        for (int di = 0; di < 3; di++) {
            if (quick && di != 2) continue;
            mlaf_verify_case c = make_case(W[w].K, W[w].K >= 16384 ? 33 : 65, DTYPES[di], W[w].qi, W[w].variant,
                                           77000u + 10u * (unsigned)w + (unsigned)di);
            run(ctx, &c, NULL);
        }
    /* a non-default eps for the amax floor */
    mlaf_verify_case c = make_case(2048, 97, MLAF_BF16, 2, 1, 99001u);
    c.q_eps = 1e-4f;
    run(ctx, &c, "q_eps=1e-4");
}

/* ---- FUSED_EQ_UNFUSED -------------------------------------------------------------------- */

static void fused_eq_unfused(mlaf_context *ctx) {
    const mlaf_backend be = mlaf_context_backend(ctx);
    enum { T = 37, K = 1152 };
    for (int qi = 1; qi < 8; qi++)
        for (int di = 0; di < 3; di++) {
            const mlaf_dtype dt = DTYPES[di];
            const size_t es = mlaf_dtype_size(dt);
            mlaf_rng rng;
            mlaf_rng_seed(&rng, 555u + 10u * (unsigned)qi + (unsigned)di);
            void *x = malloc(T * K * es), *res = malloc(T * K * es), *w = malloc(K * es);
            mlaf_fill_normal(&rng, x, dt, (size_t)T * K, 0.0, 1.0);
            mlaf_fill_normal(&rng, res, dt, (size_t)T * K, 0.0, 0.5);
            mlaf_fill_normal(&rng, w, dt, K, 1.0, 0.3);
            mlaf_dtype sdt;
            int64_t sh[2], ld;
            mlaf_gemm_scales_shape(QF[qi].f, T, K, &sdt, sh, &ld);
            const size_t sbytes = (size_t)(sh[0] * ld) * mlaf_dtype_size(sdt);
            /* three calls, each on fresh copies of the inputs: dense only (A), y and q (B), q only (C) */
            mlaf_gbuf gx, gw, gr[3], gy[2], gd[2], gs[2];
            int ok = mlaf_gbuf_alloc(&gx, be, T * K * es, x, 0) == MLAF_OK && mlaf_gbuf_alloc(&gw, be, K * es, w, 0) == MLAF_OK;
            for (int k = 0; k < 3; k++) ok = ok && mlaf_gbuf_alloc(&gr[k], be, T * K * es, res, 0) == MLAF_OK;
            for (int k = 0; k < 2; k++)
                ok = ok && mlaf_gbuf_alloc(&gy[k], be, T * K * es, NULL, 0) == MLAF_OK &&
                     mlaf_gbuf_alloc(&gd[k], be, T * K, NULL, 0) == MLAF_OK && mlaf_gbuf_alloc(&gs[k], be, sbytes, NULL, 0) == MLAF_OK;
            char name[160];
            snprintf(name, sizeof name, "FUSED_EQ_UNFUSED(q=%s/%s,dtype=%s,backend=%s)", mlaf_gemm_format_name(QF[qi].f),
                     mlaf_gemm_scale_name(QF[qi].s), mlaf_dtype_name(dt), mlaf_backend_name(be));
            mlaf_status st = ok ? MLAF_OK : MLAF_ERR_OUT_OF_MEMORY;
            const mlaf_rms_norm_quant_params p = {1e-6f};
            mlaf_tensor tx = mlaf_tensor_2d(gx.ptr, dt, T, K, K), tw = mlaf_tensor_1d(gw.ptr, dt, K);
            mlaf_tensor tr[3], ty[2], td[2], ts[2];
            mlaf_gemm_out qo[2];
            for (int k = 0; k < 3 && ok; k++) tr[k] = mlaf_tensor_2d(gr[k].ptr, dt, T, K, K);
            for (int k = 0; k < 2 && ok; k++) {
                ty[k] = mlaf_tensor_2d(gy[k].ptr, dt, T, K, K);
                td[k] = mlaf_tensor_2d(gd[k].ptr, MLAF_U8, T, K, K);
                ts[k] = mlaf_tensor_2d(gs[k].ptr, sdt, sh[0], sh[1], ld);
                qo[k] = (mlaf_gemm_out){QF[qi].f, QF[qi].s, &td[k], &ts[k], 0.0f};
            }
            if (st == MLAF_OK) st = mlaf_rms_norm_quant(ctx, &p, &tx, &tr[0], &tw, &ty[0], NULL);
            if (st == MLAF_OK) st = mlaf_rms_norm_quant(ctx, &p, &tx, &tr[1], &tw, &ty[1], &qo[0]);
            if (st == MLAF_OK) st = mlaf_rms_norm_quant(ctx, &p, &tx, &tr[2], &tw, NULL, &qo[1]);
            if (st == MLAF_OK) st = mlaf_context_sync(ctx);
            mlaf_gbuf *dl[9] = {&gr[0], &gr[1], &gr[2], &gy[0], &gy[1], &gd[0], &gd[1], &gs[0], &gs[1]};
            for (int k = 0; k < 9 && st == MLAF_OK; k++) st = mlaf_gbuf_download(dl[k]);
            if (st != MLAF_OK) {
                tl_case(0, name, "%s: %s", mlaf_status_name(st), mlaf_context_last_error(ctx));
            } else {
                uint8_t *pd = malloc((size_t)T * K), *ps = malloc(sbytes);
                memset(ps, 0xFF, sbytes); /* the gbufs' poison: padding left alone compares equal */
                gl_quantize_pass(QF[qi].f, QF[qi].s, MLAF_GEMM_DEFAULT_EPS, gy[0].body, dt, T, K, K, pd, ps, ld);
                const int same_y = !memcmp(gy[0].body, gy[1].body, T * K * es);
                const int same_r = !memcmp(gr[0].body, gr[1].body, T * K * es) && !memcmp(gr[0].body, gr[2].body, T * K * es);
                const int pass_b = !memcmp(pd, gd[0].body, (size_t)T * K) && !memcmp(ps, gs[0].body, sbytes);
                const int pass_c = !memcmp(gd[0].body, gd[1].body, (size_t)T * K) && !memcmp(gs[0].body, gs[1].body, sbytes);
                int guards = 1;
                for (int k = 0; k < 9; k++) guards = guards && mlaf_gbuf_guards_ok(dl[k]);
                tl_case(same_y && same_r && pass_b && pass_c && guards, name,
                        "dense y of the fused call %s the dense-only call's; residuals %s; fused bytes %s the separate "
                        "quantize pass's; q-only bytes %s the fused call's; guards %s",
                        same_y ? "equal" : "DIFFER from", same_r ? "equal" : "DIFFER", pass_b ? "equal" : "DIFFER from",
                        pass_c ? "equal" : "DIFFER from", guards ? "intact" : "WRITTEN");
                free(pd), free(ps);
            }
            mlaf_gbuf_free(&gx), mlaf_gbuf_free(&gw);
            for (int k = 0; k < 3; k++) mlaf_gbuf_free(&gr[k]);
            for (int k = 0; k < 2; k++) mlaf_gbuf_free(&gy[k]), mlaf_gbuf_free(&gd[k]), mlaf_gbuf_free(&gs[k]);
            free(x), free(res), free(w);
        }
}

/* Syncs after the calls (st their status) and downloads both calls' residual, y, e4m3 bytes and scales. */
static mlaf_status sync_download(mlaf_context *ctx, mlaf_status st, mlaf_gbuf *gr, mlaf_gbuf *gy, mlaf_gbuf *gd,
                                 mlaf_gbuf *gs) {
    if (st == MLAF_OK) st = mlaf_context_sync(ctx);
    for (int k = 0; k < 2 && st == MLAF_OK; k++)
        if (mlaf_gbuf_download(&gr[k]) != MLAF_OK || mlaf_gbuf_download(&gy[k]) != MLAF_OK ||
            mlaf_gbuf_download(&gd[k]) != MLAF_OK || mlaf_gbuf_download(&gs[k]) != MLAF_OK)
            st = MLAF_ERR_DEVICE;
    return st;
}

/* ---- PATHS: aligned rows and rows off by an element give the same bits ---------------------
 * (The CUDA backend takes its vector path for the first call and its element path for the second;
 * the CPU has one path.) */
static void paths(mlaf_context *ctx) {
    const mlaf_backend be = mlaf_context_backend(ctx);
    enum { T = 19, K = 2048 };
    const size_t es = 2;
    for (int qi = 0; qi < 8; qi++) {
        mlaf_rng rng;
        mlaf_rng_seed(&rng, 8080u + (unsigned)qi);
        void *x = malloc(T * K * es), *r = malloc(T * K * es), *w = malloc(K * sizeof(float));
        mlaf_fill_normal(&rng, x, MLAF_BF16, (size_t)T * K, 0.0, 1.0);
        mlaf_fill_normal(&rng, r, MLAF_BF16, (size_t)T * K, 0.0, 1.0);
        mlaf_fill_normal(&rng, w, MLAF_F32, K, 1.0, 0.3);
        mlaf_dtype sdt = MLAF_F32;
        int64_t sh[2] = {0, 0}, ld = 0;
        if (QF[qi].f) mlaf_gemm_scales_shape(QF[qi].f, T, K, &sdt, sh, &ld);
        const size_t sbytes = QF[qi].f ? (size_t)(sh[0] * ld) * mlaf_dtype_size(sdt) : 1;
        mlaf_gbuf gx[2], gr[2], gw, gy[2], gd[2], gs[2];
        int ok = mlaf_gbuf_alloc(&gw, be, K * sizeof(float), w, 0) == MLAF_OK;
        for (int k = 0; k < 2; k++) /* k = 1: every row view one element (or byte) off 16-byte alignment */
            ok = ok && mlaf_gbuf_alloc(&gx[k], be, T * K * es, x, k ? es : 0) == MLAF_OK &&
                 mlaf_gbuf_alloc(&gr[k], be, T * K * es, r, k ? es : 0) == MLAF_OK &&
                 mlaf_gbuf_alloc(&gy[k], be, T * K * es, NULL, k ? es : 0) == MLAF_OK &&
                 mlaf_gbuf_alloc(&gd[k], be, T * K, NULL, k) == MLAF_OK && mlaf_gbuf_alloc(&gs[k], be, sbytes, NULL, 0) == MLAF_OK;
        char name[160];
        snprintf(name, sizeof name, "PATHS(q=%s%s%s,aligned=misaligned,backend=%s)", mlaf_gemm_format_name(QF[qi].f),
                 QF[qi].f ? "/" : "", QF[qi].f ? mlaf_gemm_scale_name(QF[qi].s) : "", mlaf_backend_name(be));
        mlaf_status st = ok ? MLAF_OK : MLAF_ERR_OUT_OF_MEMORY;
        const mlaf_rms_norm_quant_params p = {1e-6f};
        for (int k = 0; k < 2 && st == MLAF_OK; k++) {
            mlaf_tensor tx = mlaf_tensor_2d(gx[k].ptr, MLAF_BF16, T, K, K), tr = mlaf_tensor_2d(gr[k].ptr, MLAF_BF16, T, K, K);
            mlaf_tensor tw = mlaf_tensor_1d(gw.ptr, MLAF_F32, K), ty = mlaf_tensor_2d(gy[k].ptr, MLAF_BF16, T, K, K);
            mlaf_tensor td = mlaf_tensor_2d(gd[k].ptr, MLAF_U8, T, K, K), ts = mlaf_tensor_2d(gs[k].ptr, sdt, sh[0], sh[1], ld);
            const mlaf_gemm_out q = {QF[qi].f, QF[qi].s, QF[qi].f ? &td : NULL, QF[qi].f ? &ts : NULL, 0.0f};
            st = mlaf_rms_norm_quant(ctx, &p, &tx, &tr, &tw, &ty, &q);
        }
        st = sync_download(ctx, st, gr, gy, gd, gs);
        if (st != MLAF_OK) {
            tl_case(0, name, "%s: %s", mlaf_status_name(st), mlaf_context_last_error(ctx));
        } else {
            const int same = !memcmp(gr[0].body, gr[1].body, T * K * es) && !memcmp(gy[0].body, gy[1].body, T * K * es) &&
                             !memcmp(gd[0].body, gd[1].body, (size_t)T * K) && !memcmp(gs[0].body, gs[1].body, sbytes);
            tl_case(same, name, "residual, y, e4m3 bytes and scales %s", same ? "identical" : "DIFFER");
        }
        for (int k = 0; k < 2; k++)
            mlaf_gbuf_free(&gx[k]), mlaf_gbuf_free(&gr[k]), mlaf_gbuf_free(&gy[k]), mlaf_gbuf_free(&gd[k]), mlaf_gbuf_free(&gs[k]);
        mlaf_gbuf_free(&gw);
        free(x), free(r), free(w);
    }
}

/* ---- ANY_T: the first rows of a large call equal a small call of those rows ------------------
 * (CUDA: one vector a thread up to K = 8192 in bf16, two past it, 16384 f32 the long-row loop.)
 * Row-major scales, so a row's scales are one row of the tensor. */
static void any_t(mlaf_context *ctx) {
    const mlaf_backend be = mlaf_context_backend(ctx);
    enum { TB = 300, TS = 9 };
    static const int64_t KS[3] = {2048, 7168, 16384};
    static const mlaf_dtype DT[2] = {MLAF_BF16, MLAF_F32};
    for (int ki = 0; ki < 3; ki++)
        for (int di = 0; di < 2; di++)
            for (int fi = 0; fi < 2; fi++) {
                const int64_t K = KS[ki];
                const mlaf_dtype dt = DT[di];
                const size_t es = mlaf_dtype_size(dt);
                const mlaf_gemm_format f = fi ? MLAF_GEMM_MXFP8 : MLAF_GEMM_FP8_1X128;
                const mlaf_gemm_scale sc = fi ? MLAF_GEMM_SCALE_MX_FLOOR : MLAF_GEMM_SCALE_F32;
                mlaf_rng rng;
                mlaf_rng_seed(&rng, 4242u + (unsigned)(ki * 4 + di * 2 + fi));
                void *x = malloc(TB * K * es), *r = malloc(TB * K * es), *w = malloc(K * es);
                mlaf_fill_normal(&rng, x, dt, (size_t)(TB * K), 0.0, 1.0);
                mlaf_fill_normal(&rng, r, dt, (size_t)(TB * K), 0.0, 1.0);
                mlaf_fill_normal(&rng, w, dt, (size_t)K, 1.0, 0.3);
                mlaf_dtype sdt = MLAF_F32;
                int64_t sh[2][2], ld[2];
                const int64_t Ts[2] = {TB, TS};
                mlaf_gbuf gx[2], gr[2], gw, gy[2], gd[2], gs[2];
                int ok = mlaf_gbuf_alloc(&gw, be, K * es, w, 0) == MLAF_OK;
                for (int k = 0; k < 2; k++)
                    ok = ok && mlaf_gemm_scales_shape(f, Ts[k], K, &sdt, sh[k], &ld[k]) == MLAF_OK &&
                         mlaf_gbuf_alloc(&gx[k], be, Ts[k] * K * es, x, 0) == MLAF_OK &&
                         mlaf_gbuf_alloc(&gr[k], be, Ts[k] * K * es, r, 0) == MLAF_OK &&
                         mlaf_gbuf_alloc(&gy[k], be, Ts[k] * K * es, NULL, 0) == MLAF_OK &&
                         mlaf_gbuf_alloc(&gd[k], be, Ts[k] * K, NULL, 0) == MLAF_OK &&
                         mlaf_gbuf_alloc(&gs[k], be, (size_t)(sh[k][0] * ld[k]) * mlaf_dtype_size(sdt), NULL, 0) == MLAF_OK;
                char name[160];
                snprintf(name, sizeof name, "ANY_T(K=%lld,dtype=%s,q=%s,rows %d of T=%d and T=%d,backend=%s)", (long long)K,
                         mlaf_dtype_name(dt), mlaf_gemm_format_name(f), TS, TB, TS, mlaf_backend_name(be));
                mlaf_status st = ok ? MLAF_OK : MLAF_ERR_OUT_OF_MEMORY;
                const mlaf_rms_norm_quant_params p = {1e-6f};
                for (int k = 0; k < 2 && st == MLAF_OK; k++) {
                    const int64_t T = Ts[k];
                    mlaf_tensor tx = mlaf_tensor_2d(gx[k].ptr, dt, T, K, K), tr = mlaf_tensor_2d(gr[k].ptr, dt, T, K, K);
                    mlaf_tensor tw = mlaf_tensor_1d(gw.ptr, dt, K), ty = mlaf_tensor_2d(gy[k].ptr, dt, T, K, K);
                    mlaf_tensor td = mlaf_tensor_2d(gd[k].ptr, MLAF_U8, T, K, K);
                    mlaf_tensor ts = mlaf_tensor_2d(gs[k].ptr, sdt, sh[k][0], sh[k][1], ld[k]);
                    const mlaf_gemm_out q = {f, sc, &td, &ts, 0.0f};
                    st = mlaf_rms_norm_quant(ctx, &p, &tx, &tr, &tw, &ty, &q);
                }
                st = sync_download(ctx, st, gr, gy, gd, gs);
                if (st != MLAF_OK) {
                    tl_case(0, name, "%s: %s", mlaf_status_name(st), mlaf_context_last_error(ctx));
                } else {
                    const size_t ssz = mlaf_dtype_size(sdt);
                    int same = !memcmp(gr[0].body, gr[1].body, TS * K * es) && !memcmp(gy[0].body, gy[1].body, TS * K * es) &&
                               !memcmp(gd[0].body, gd[1].body, (size_t)(TS * K));
                    for (int t = 0; t < TS && same; t++) /* row-major scales: row t at t * ld */
                        same = !memcmp((const char *)gs[0].body + (size_t)(t * ld[0]) * ssz,
                                       (const char *)gs[1].body + (size_t)(t * ld[1]) * ssz, (size_t)sh[1][1] * ssz);
                    tl_case(same, name, "residual, y, e4m3 bytes and scales of the rows %s", same ? "identical" : "DIFFER");
                }
                for (int k = 0; k < 2; k++)
                    mlaf_gbuf_free(&gx[k]), mlaf_gbuf_free(&gr[k]), mlaf_gbuf_free(&gy[k]), mlaf_gbuf_free(&gd[k]),
                        mlaf_gbuf_free(&gs[k]);
                mlaf_gbuf_free(&gw);
                free(x), free(r), free(w);
            }
}

/* ---- LAYOUT_OP: the hand-written layouts through the op ----------------------------------- */
static void layout_op(mlaf_context *ctx) {
    const mlaf_backend be = mlaf_context_backend(ctx);
    uint16_t x[GL_T * GL_K];
    for (int i = 0; i < GL_T * GL_K; i++) x[i] = mlaf_f32_to_bf16(i < GL_K ? 1.0f : i < 2 * GL_K ? 0.0f : -4.0f);
    for (int li = 0; li < GL_LAYOUTS; li++) {
        const gl_layout *L = &gl_layouts[li];
        float w[GL_K];
        gl_row(L, GL_OP, 0, w);
        for (int si = 0; si < MLAF_GEMM_SCALE_COUNT_; si++)
            for (int dense = 0; dense < 2; dense++) {
                const mlaf_gemm_format f = L->format;
                const int takes = (f == MLAF_GEMM_MXFP8) == (si >= 2) && !(f == MLAF_GEMM_FP8_1X128_UE8M0 && si == 0);
                if (!takes) continue;
                gl_buffers hb;
                gl_fill(&hb, L);
                mlaf_gbuf gx, gw, gy, gd, gs;
                int ok = mlaf_gbuf_alloc(&gx, be, sizeof x, x, 0) == MLAF_OK && mlaf_gbuf_alloc(&gw, be, sizeof w, w, 0) == MLAF_OK &&
                         mlaf_gbuf_alloc(&gy, be, sizeof x, NULL, 0) == MLAF_OK &&
                         mlaf_gbuf_alloc(&gd, be, sizeof hb.data, hb.data, 0) == MLAF_OK &&
                         mlaf_gbuf_alloc(&gs, be, sizeof hb.scales, hb.scales, 0) == MLAF_OK;
                char name[160], why[256] = "allocation failed";
                snprintf(name, sizeof name, "LAYOUT_OP(format=%s,scale=%s,%s,backend=%s)", mlaf_gemm_format_name(f),
                         mlaf_gemm_scale_name((mlaf_gemm_scale)si), dense ? "with_y" : "q_only", mlaf_backend_name(be));
                mlaf_status st = ok ? MLAF_OK : MLAF_ERR_OUT_OF_MEMORY;
                if (ok) {
                    const mlaf_rms_norm_quant_params p = {1e-6f};
                    mlaf_tensor tx = mlaf_tensor_2d(gx.ptr, MLAF_BF16, GL_T, GL_K, GL_K), tw = mlaf_tensor_1d(gw.ptr, MLAF_F32, GL_K);
                    mlaf_tensor ty = mlaf_tensor_2d(gy.ptr, MLAF_BF16, GL_T, GL_K, GL_K), td, ts;
                    const mlaf_gemm_out q = gl_out_at(L, (mlaf_gemm_scale)si, gd.ptr, gs.ptr, &td, &ts);
                    st = mlaf_rms_norm_quant(ctx, &p, &tx, NULL, &tw, dense ? &ty : NULL, &q);
                    if (st == MLAF_OK) st = mlaf_context_sync(ctx);
                    if (st == MLAF_OK) st = mlaf_gbuf_download(&gd);
                    if (st == MLAF_OK) st = mlaf_gbuf_download(&gs);
                    if (st != MLAF_OK) snprintf(why, sizeof why, "%s: %s", mlaf_status_name(st), mlaf_context_last_error(ctx));
                }
                int good = 0;
                if (st == MLAF_OK) {
                    memcpy(hb.data, gd.body, sizeof hb.data);
                    memcpy(hb.scales, gs.body, sizeof hb.scales);
                    good = gl_judge(L, (mlaf_gemm_scale)si, &hb, GL_OP, why, sizeof why) && mlaf_gbuf_guards_ok(&gd) &&
                           mlaf_gbuf_guards_ok(&gs);
                }
                tl_case(good, name, "%s", why);
                mlaf_gbuf_free(&gx), mlaf_gbuf_free(&gw), mlaf_gbuf_free(&gy), mlaf_gbuf_free(&gd), mlaf_gbuf_free(&gs);
            }
    }
}

/* ---- REJECT: bad calls, nothing written --------------------------------------------------- */
enum { RT = 5, RK = 1024, NRB = 6 };

typedef struct reject_call {
    mlaf_rms_norm_quant_params p;
    mlaf_tensor x, r, w, y, d, s;
    mlaf_gemm_out q;
    int use_r, use_y, use_q;
} reject_call;

/* Case k's one mutation of a valid call (fp8_1x128_mn, f32 scales, residual, y); its expected status
 * and the part of the message that names the argument. */
static const char *mutate_call(int k, reject_call *c, mlaf_status *want, const char **what) {
    *want = MLAF_ERR_INVALID_ARGUMENT;
    switch (k) {
    case 0: c->x.shape[1] = c->r.shape[1] = c->y.shape[1] = c->d.shape[1] = 1000, c->w.shape[0] = 1000;
        *want = MLAF_ERR_SHAPE, *what = "q: K = 1000 values a row, expected a multiple of 128"; return "K not a multiple of the group";
    case 1: c->s.shape[0] = 7; *want = MLAF_ERR_SHAPE, *what = "q.scales.shape[0] = 7, expected K / 128 = 8"; return "scales shape";
    case 2: c->s.stride[0] = 6; *want = MLAF_ERR_STRIDE, *what = "q.scales.stride[0] = 6"; return "scales leading stride";
    case 3: c->s.data = (char *)c->s.data + 4; *want = MLAF_ERR_STRIDE, *what = "q.scales.data"; return "scales alignment";
    case 4: c->q.format = MLAF_GEMM_FP8_1X128_UE8M0, c->s.dtype = MLAF_I32, c->s.shape[0] = 2;
        *what = "q.scale = 0 (f32), expected 1 (ue8m0) for format fp8_1x128_ue8m0"; return "rounding the format lacks";
    case 5: c->q.format = (mlaf_gemm_format)7; *what = "q.format = 7"; return "unknown format";
    case 6: c->p.eps = 0.0f; *what = "eps = 0"; return "eps";
    case 7: c->r = c->x; *want = MLAF_ERR_OVERLAP, *what = "residual overlaps x"; return "residual is x";
    case 8: c->y.data = (char *)c->x.data + 2; c->y.shape[0] = RT - 1; c->x.shape[0] = c->r.shape[0] = RT - 1;
        c->d.shape[0] = RT - 1, c->s.shape[1] = RT - 1;
        *want = MLAF_ERR_OVERLAP, *what = "y overlaps x"; return "y overlaps x off by one element";
    case 9: c->d.data = c->y.data, c->d.stride[0] = 2 * RK; *want = MLAF_ERR_OVERLAP, *what = "q.data overlaps";
        return "q.data overlaps y";
    case 10: c->use_y = 0, c->use_q = 0; *want = MLAF_ERR_NULL_POINTER, *what = "y is NULL and q has no format"; return "no output";
    case 11: c->w.dtype = MLAF_F16; *want = MLAF_ERR_DTYPE, *what = "weight.dtype = f16"; return "weight dtype";
    case 12: c->y.dtype = MLAF_F32; *want = MLAF_ERR_DTYPE, *what = "y.dtype = f32"; return "y dtype";
    case 13: c->x.shape[0] = c->r.shape[0] = c->y.shape[0] = c->d.shape[0] = c->s.shape[1] = (int64_t)1 << 31;
        c->s.stride[0] = (int64_t)1 << 31;
        *want = MLAF_ERR_LIMIT, *what = "x.shape[0] = 2147483648 tokens, expected < 2^31"; return "T = 2^31";
    case 14: c->q.format = MLAF_GEMM_MXFP8, c->q.scale = MLAF_GEMM_SCALE_MX_FLOOR;
        *want = MLAF_ERR_DTYPE, *what = "q.scales.dtype = f32, expected u8"; return "mxfp8 scales dtype";
    case 15: c->q.eps = -1.0f; *what = "q.eps = -1"; return "q.eps";
    case 16: c->r.shape[1] = 512; *want = MLAF_ERR_SHAPE, *what = "residual.shape[1] = 512"; return "residual shape";
    case 17: c->x.ndim = 3; *want = MLAF_ERR_SHAPE, *what = "x.ndim = 3"; return "x rank";
    default: return NULL;
    }
}

static void reject_cases(mlaf_context *ctx) {
    const mlaf_backend be = mlaf_context_backend(ctx);
    const size_t sizes[NRB] = {RT * RK * 2, RT * RK * 2, RK * 2, RT * RK * 2, RT * RK, 8 * 8 * 4};
    mlaf_rng rng;
    mlaf_rng_seed(&rng, 4242);
    unsigned char *init[NRB];
    mlaf_gbuf g[NRB];
    for (int k = 0; k < NRB; k++) {
        init[k] = malloc(sizes[k]);
        for (size_t i = 0; i < sizes[k]; i++) init[k][i] = (unsigned char)(k < 3 ? (i % 2 ? 0x3f : mlaf_rng_u64(&rng)) : 0xFF);
        if (mlaf_gbuf_alloc(&g[k], be, sizes[k], init[k], 0) != MLAF_OK) {
            tl_case(0, "REJECT(buffers)", "allocation failed");
            return;
        }
    }
    for (int k = 0;; k++) {
        reject_call c;
        c.p.eps = 1e-6f;
        c.x = mlaf_tensor_2d(g[0].ptr, MLAF_BF16, RT, RK, RK), c.r = mlaf_tensor_2d(g[1].ptr, MLAF_BF16, RT, RK, RK);
        c.w = mlaf_tensor_1d(g[2].ptr, MLAF_BF16, RK), c.y = mlaf_tensor_2d(g[3].ptr, MLAF_BF16, RT, RK, RK);
        c.d = mlaf_tensor_2d(g[4].ptr, MLAF_U8, RT, RK, RK), c.s = mlaf_tensor_2d(g[5].ptr, MLAF_F32, RK / 128, RT, 8);
        c.q = (mlaf_gemm_out){MLAF_GEMM_FP8_1X128_MN, MLAF_GEMM_SCALE_F32, &c.d, &c.s, 0.0f};
        c.use_r = c.use_y = c.use_q = 1;
        mlaf_status want;
        const char *what = "";
        const char *label = mutate_call(k, &c, &want, &what);
        if (!label) break;
        const mlaf_status st = mlaf_rms_norm_quant(ctx, &c.p, &c.x, c.use_r ? &c.r : NULL, &c.w, c.use_y ? &c.y : NULL,
                                                   c.use_q ? &c.q : NULL);
        const char *msg = mlaf_context_last_error(ctx);
        const int named = strstr(msg, what) != NULL;
        int kept = mlaf_context_sync(ctx) == MLAF_OK;
        for (int b = 0; b < NRB && kept; b++)
            kept = mlaf_gbuf_download(&g[b]) == MLAF_OK && mlaf_gbuf_equals(&g[b], init[b]) && mlaf_gbuf_guards_ok(&g[b]);
        char name[160];
        snprintf(name, sizeof name, "REJECT(%s,backend=%s)", label, mlaf_backend_name(be));
        tl_case(st == want && named && kept, name, "%s (want %s); message \"%s\" %s \"%s\"; buffers %s", mlaf_status_name(st),
                mlaf_status_name(want), msg, named ? "names" : "does NOT name", what, kept ? "untouched" : "WRITTEN");
    }
    for (int k = 0; k < NRB; k++) mlaf_gbuf_free(&g[k]), free(init[k]);
}

static void suite(mlaf_context *ctx, int quick, const char *tag) {
    sweep(ctx, quick, tag);
    if (tag) return;
    fused_eq_unfused(ctx);
    paths(ctx);
    any_t(ctx);
    layout_op(ctx);
    reject_cases(ctx);
}

int main(void) { return tl_run_suite("RMS_NORM_QUANT", suite); }
