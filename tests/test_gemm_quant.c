/*
 * test_gemm_quant.c — gemm_quant (docs/gemm_formats.md) on every backend and, on the CPU, every forced
 * instruction-set path:
 *   GEMM_QUANT      the oracle sweep (mlaf_verify_gemm_quant): every format x rounding x dtype, T from 0
 *                   (4099 on two cases), K 2048 / 7168 and widths the groups divide (one group, 5 and 9 groups, 47 mxfp8
 *                   groups, 16384), contiguous and strided rows, a non-default eps; x holds NaN, +-inf,
 *                   subnormal and zero rows among ordinary ones;
 *   EQ_RMS_NORM_QUANT  rms_norm_quant's quantized output and gemm_quant of that call's dense y (strided
 *                   rows) are the same bytes;
 *   PATHS           rows aligned to 16 bytes and rows an element off give the same bits (CUDA: its vector
 *                   and element paths);
 *   LAYOUT_OP       the layouts' hand-written offsets (gemm_layout.c) through the op, x in f32 and bf16;
 *   REJECT          bad calls rejected with their status and a message naming the argument, every buffer
 *                   and guard byte untouched.
 */
#include <stdlib.h>
#include <string.h>

#include "gemm_format.h"
#include "gemm_layout.h"
#include "half.h"
#include "testlib.h"

static const mlaf_dtype DTYPES[3] = {MLAF_F32, MLAF_F16, MLAF_BF16};
enum { NQF = 9 };
static const struct {
    mlaf_gemm_format f;
    mlaf_gemm_scale s;
} QF[NQF] = {{MLAF_GEMM_FP8_1X128, MLAF_GEMM_SCALE_F32},       {MLAF_GEMM_FP8_1X128, MLAF_GEMM_SCALE_UE8M0},
             {MLAF_GEMM_FP8_1X128_MN, MLAF_GEMM_SCALE_F32},    {MLAF_GEMM_FP8_1X128_MN, MLAF_GEMM_SCALE_UE8M0},
             {MLAF_GEMM_FP8_1X128_UE8M0, MLAF_GEMM_SCALE_UE8M0}, {MLAF_GEMM_MXFP8, MLAF_GEMM_SCALE_MX_FLOOR},
             {MLAF_GEMM_MXFP8, MLAF_GEMM_SCALE_MX_CEIL},       {MLAF_GEMM_FP8_1X128_CM, MLAF_GEMM_SCALE_F32},
             {MLAF_GEMM_FP8_1X128_CM, MLAF_GEMM_SCALE_UE8M0}};

static void run(mlaf_context *ctx, const mlaf_verify_case *c, const char *tag) {
    char name[256];
    snprintf(name, sizeof name, "GEMM_QUANT(K=%lld,T=%lld,dtype=%s,q=%s/%s%s%s,backend=%s%s%s)", (long long)c->hidden,
             (long long)c->T, mlaf_dtype_name(c->dtype), mlaf_gemm_format_name(c->q_format), mlaf_gemm_scale_name(c->q_scale),
             c->strided ? ",strided" : "", c->q_eps != 0.0f ? ",q_eps=1e-4" : "",
             mlaf_backend_name(mlaf_context_backend(ctx)), tag ? "," : "", tag ? tag : "");
    mlaf_verify_result r;
    const mlaf_status st = mlaf_verify_gemm_quant(ctx, c, &r);
    tl_case(st == MLAF_OK && r.passed, name, "%s [%s]", r.detail, mlaf_status_name(st));
}

static mlaf_verify_case make_case(int64_t K, int64_t T, mlaf_dtype dt, int qi, int strided, uint64_t seed) {
    mlaf_verify_case c = mlaf_verify_case_default(NULL, dt, T, seed);
    c.hidden = K;
    c.q_format = QF[qi].f;
    c.q_scale = QF[qi].s;
    c.strided = strided;
    return c;
}

static void sweep(mlaf_context *ctx, int quick, const char *tag) {
    const int64_t Ts[4] = {0, 1, 7, 257};
    for (int qi = 0; qi < NQF; qi++)
        for (int di = 0; di < 3; di++)
            for (int ti = tag ? 2 : 0; ti < (tag ? 3 : 4); ti++) { /* a forced CPU path: T = 7 */
                if (quick && !tag && ti == 3 && (qi + di) % 2) continue;
                const int64_t K = (qi + ti + di) % 2 ? 2048 : 7168;
                mlaf_verify_case c = make_case(K, Ts[ti], DTYPES[di], qi, (qi + di + ti) % 2,
                                               3000u * (unsigned)qi + 100u * (unsigned)di + (unsigned)ti);
                run(ctx, &c, tag);
            }
    if (tag) return;
    /* many rows: the CPU backend's threads share the call */
    for (int k = 0; k < (quick ? 1 : 2); k++) {
        mlaf_verify_case c = make_case(1024, 4099, k ? MLAF_F32 : MLAF_BF16, k ? 5 : 3, k, 3999u + (unsigned)k);
        run(ctx, &c, NULL);
    }
    static const struct {
        int64_t K;
        int qi;
    } W[] = {{128, 0}, {128, 8}, {32, 5}, {640, 4}, {1152, 4}, {1152, 2}, {1504, 6}, {1504, 5}, {16384, 3}, {640, 7}};
    for (size_t w = 0; w < sizeof W / sizeof W[0]; w++)
        for (int di = 0; di < 3; di++) {
            if (quick && di != 2) continue;
            mlaf_verify_case c = make_case(W[w].K, W[w].K >= 16384 ? 33 : 65, DTYPES[di], W[w].qi, (int)(w + di) % 2,
                                           91000u + 10u * (unsigned)w + (unsigned)di);
            run(ctx, &c, NULL);
        }
    for (int qi = 0; qi < 2; qi++) { /* a non-default amax floor: it decides the tiny and zero rows' scales */
        mlaf_verify_case c = make_case(2048, 97, MLAF_BF16, qi, 1, 99001u + (unsigned)qi);
        c.q_eps = 1e-4f;
        run(ctx, &c, NULL);
    }
}

/* ---- EQ_RMS_NORM_QUANT -------------------------------------------------------------------------- */
static void eq_rms_norm_quant(mlaf_context *ctx) {
    const mlaf_backend be = mlaf_context_backend(ctx);
    enum { T = 37, K = 1152, YS = K + 5 };
    for (int qi = 0; qi < NQF; qi++)
        for (int di = 0; di < 3; di++) {
            const mlaf_dtype dt = DTYPES[di];
            const size_t es = mlaf_dtype_size(dt);
            mlaf_rng rng;
            mlaf_rng_seed(&rng, 700u + 10u * (unsigned)qi + (unsigned)di);
            void *x = malloc(T * K * es), *res = malloc(T * K * es), *w = malloc(K * es);
            mlaf_fill_normal(&rng, x, dt, (size_t)T * K, 0.0, 1.0);
            mlaf_fill_normal(&rng, res, dt, (size_t)T * K, 0.0, 0.5);
            mlaf_fill_normal(&rng, w, dt, K, 1.0, 0.3);
            mlaf_dtype sdt;
            int64_t sh[2], ld;
            mlaf_gemm_scales_shape(QF[qi].f, T, K, &sdt, sh, &ld);
            const size_t sbytes = (size_t)(sh[0] * ld) * mlaf_dtype_size(sdt);
            mlaf_gbuf gx, gr, gw, gy, gd[2], gs[2];
            int ok = mlaf_gbuf_alloc(&gx, be, T * K * es, x, 0) == MLAF_OK && mlaf_gbuf_alloc(&gr, be, T * K * es, res, 0) == MLAF_OK &&
                     mlaf_gbuf_alloc(&gw, be, K * es, w, 0) == MLAF_OK && mlaf_gbuf_alloc(&gy, be, T * YS * es, NULL, 0) == MLAF_OK;
            for (int k = 0; k < 2; k++)
                ok = ok && mlaf_gbuf_alloc(&gd[k], be, T * K, NULL, 0) == MLAF_OK && mlaf_gbuf_alloc(&gs[k], be, sbytes, NULL, 0) == MLAF_OK;
            char name[160];
            snprintf(name, sizeof name, "EQ_RMS_NORM_QUANT(q=%s/%s,dtype=%s,backend=%s)", mlaf_gemm_format_name(QF[qi].f),
                     mlaf_gemm_scale_name(QF[qi].s), mlaf_dtype_name(dt), mlaf_backend_name(be));
            mlaf_status st = ok ? MLAF_OK : MLAF_ERR_OUT_OF_MEMORY;
            if (st == MLAF_OK) {
                const mlaf_rms_norm_quant_params p = {1e-6f};
                mlaf_tensor tx = mlaf_tensor_2d(gx.ptr, dt, T, K, K), tr = mlaf_tensor_2d(gr.ptr, dt, T, K, K);
                mlaf_tensor tw = mlaf_tensor_1d(gw.ptr, dt, K), ty = mlaf_tensor_2d(gy.ptr, dt, T, K, YS), td[2], ts[2];
                mlaf_gemm_out q[2];
                for (int k = 0; k < 2; k++) {
                    td[k] = mlaf_tensor_2d(gd[k].ptr, MLAF_U8, T, K, K);
                    ts[k] = mlaf_tensor_2d(gs[k].ptr, sdt, sh[0], sh[1], ld);
                    q[k] = (mlaf_gemm_out){QF[qi].f, QF[qi].s, &td[k], &ts[k], 0.0f};
                }
                st = mlaf_rms_norm_quant(ctx, &p, &tx, &tr, &tw, &ty, &q[0]);
                if (st == MLAF_OK) st = mlaf_gemm_quant(ctx, &ty, &q[1]);
                if (st == MLAF_OK) st = mlaf_context_sync(ctx);
                for (int k = 0; k < 2 && st == MLAF_OK; k++)
                    if (mlaf_gbuf_download(&gd[k]) != MLAF_OK || mlaf_gbuf_download(&gs[k]) != MLAF_OK) st = MLAF_ERR_DEVICE;
            }
            if (st != MLAF_OK) {
                tl_case(0, name, "%s: %s", mlaf_status_name(st), mlaf_context_last_error(ctx));
            } else {
                const int same_d = !memcmp(gd[0].body, gd[1].body, (size_t)T * K), same_s = !memcmp(gs[0].body, gs[1].body, sbytes);
                const int guards = mlaf_gbuf_guards_ok(&gd[1]) && mlaf_gbuf_guards_ok(&gs[1]);
                tl_case(same_d && same_s && guards, name,
                        "e4m3 bytes %s, scales %s (rms_norm_quant's q against gemm_quant of its y); guards %s",
                        same_d ? "equal" : "DIFFER", same_s ? "equal" : "DIFFER", guards ? "intact" : "WRITTEN");
            }
            mlaf_gbuf_free(&gx), mlaf_gbuf_free(&gr), mlaf_gbuf_free(&gw), mlaf_gbuf_free(&gy);
            for (int k = 0; k < 2; k++) mlaf_gbuf_free(&gd[k]), mlaf_gbuf_free(&gs[k]);
            free(x), free(res), free(w);
        }
}

/* ---- PATHS: aligned rows and rows off by an element give the same bits ------------------------- */
static void paths(mlaf_context *ctx) {
    const mlaf_backend be = mlaf_context_backend(ctx);
    enum { T = 19, K = 2048 };
    for (int qi = 0; qi < NQF; qi++)
        for (int di = 0; di < 3; di += 2) { /* f32 and bf16: 4 and 8 values a vector */
            const mlaf_dtype dt = DTYPES[di];
            const size_t es = mlaf_dtype_size(dt);
            mlaf_rng rng;
            mlaf_rng_seed(&rng, 8180u + 10u * (unsigned)qi + (unsigned)di);
            void *x = malloc(T * K * es);
            mlaf_fill_normal(&rng, x, dt, (size_t)T * K, 0.0, 1.0);
            mlaf_dtype sdt;
            int64_t sh[2], ld;
            mlaf_gemm_scales_shape(QF[qi].f, T, K, &sdt, sh, &ld);
            const size_t sbytes = (size_t)(sh[0] * ld) * mlaf_dtype_size(sdt);
            mlaf_gbuf gx[2], gd[2], gs[2];
            int ok = 1;
            for (int k = 0; k < 2; k++) /* k = 1: x one element, the e4m3 rows one byte off alignment */
                ok = ok && mlaf_gbuf_alloc(&gx[k], be, T * K * es, x, k ? es : 0) == MLAF_OK &&
                     mlaf_gbuf_alloc(&gd[k], be, T * K, NULL, k) == MLAF_OK && mlaf_gbuf_alloc(&gs[k], be, sbytes, NULL, 0) == MLAF_OK;
            char name[160];
            snprintf(name, sizeof name, "PATHS(q=%s/%s,dtype=%s,aligned=misaligned,backend=%s)", mlaf_gemm_format_name(QF[qi].f),
                     mlaf_gemm_scale_name(QF[qi].s), mlaf_dtype_name(dt), mlaf_backend_name(be));
            mlaf_status st = ok ? MLAF_OK : MLAF_ERR_OUT_OF_MEMORY;
            for (int k = 0; k < 2 && st == MLAF_OK; k++) {
                mlaf_tensor tx = mlaf_tensor_2d(gx[k].ptr, dt, T, K, K), td = mlaf_tensor_2d(gd[k].ptr, MLAF_U8, T, K, K);
                mlaf_tensor ts = mlaf_tensor_2d(gs[k].ptr, sdt, sh[0], sh[1], ld);
                const mlaf_gemm_out q = {QF[qi].f, QF[qi].s, &td, &ts, 0.0f};
                st = mlaf_gemm_quant(ctx, &tx, &q);
            }
            if (st == MLAF_OK) st = mlaf_context_sync(ctx);
            for (int k = 0; k < 2 && st == MLAF_OK; k++)
                if (mlaf_gbuf_download(&gd[k]) != MLAF_OK || mlaf_gbuf_download(&gs[k]) != MLAF_OK) st = MLAF_ERR_DEVICE;
            if (st != MLAF_OK) {
                tl_case(0, name, "%s: %s", mlaf_status_name(st), mlaf_context_last_error(ctx));
            } else {
                const int same = !memcmp(gd[0].body, gd[1].body, (size_t)T * K) && !memcmp(gs[0].body, gs[1].body, sbytes);
                tl_case(same, name, "e4m3 bytes and scales %s", same ? "identical" : "DIFFER");
            }
            for (int k = 0; k < 2; k++) mlaf_gbuf_free(&gx[k]), mlaf_gbuf_free(&gd[k]), mlaf_gbuf_free(&gs[k]);
            free(x);
        }
}

/* ---- LAYOUT_OP: the hand-written layouts through the op ------------------------------------------ */
static void layout_op(mlaf_context *ctx) {
    const mlaf_backend be = mlaf_context_backend(ctx);
    for (int li = 0; li < GL_LAYOUTS; li++) {
        const gl_layout *L = &gl_layouts[li];
        float xf[GL_T * GL_K];
        uint16_t xb[GL_T * GL_K];
        for (int t = 0; t < GL_T; t++) gl_row(L, GL_WRITER, t, xf + t * GL_K);
        for (int i = 0; i < GL_T * GL_K; i++) xb[i] = mlaf_f32_to_bf16(xf[i]); /* every value a bf16 */
        for (int si = 0; si < MLAF_GEMM_SCALE_COUNT_; si++)
            for (int bf = 0; bf < 2; bf++) {
                const mlaf_gemm_format f = L->format;
                if (!((mlaf_gemm_formats[f].scale_modes >> si) & 1u)) continue;
                gl_buffers hb;
                gl_fill(&hb, L);
                mlaf_gbuf gx, gd, gs;
                int ok = mlaf_gbuf_alloc(&gx, be, bf ? sizeof xb : sizeof xf, bf ? (const void *)xb : (const void *)xf, 0) == MLAF_OK &&
                         mlaf_gbuf_alloc(&gd, be, sizeof hb.data, hb.data, 0) == MLAF_OK &&
                         mlaf_gbuf_alloc(&gs, be, sizeof hb.scales, hb.scales, 0) == MLAF_OK;
                char name[160], why[256] = "allocation failed";
                snprintf(name, sizeof name, "LAYOUT_OP(format=%s,scale=%s,dtype=%s,backend=%s)", mlaf_gemm_format_name(f),
                         mlaf_gemm_scale_name((mlaf_gemm_scale)si), bf ? "bf16" : "f32", mlaf_backend_name(be));
                int good = 0;
                if (ok) {
                    mlaf_tensor tx = mlaf_tensor_2d(gx.ptr, bf ? MLAF_BF16 : MLAF_F32, GL_T, GL_K, GL_K), td, ts;
                    const mlaf_gemm_out q = gl_out_at(L, (mlaf_gemm_scale)si, gd.ptr, gs.ptr, &td, &ts);
                    mlaf_status st = mlaf_gemm_quant(ctx, &tx, &q);
                    if (st == MLAF_OK) st = mlaf_context_sync(ctx);
                    if (st == MLAF_OK) st = mlaf_gbuf_download(&gd);
                    if (st == MLAF_OK) st = mlaf_gbuf_download(&gs);
                    if (st != MLAF_OK) {
                        snprintf(why, sizeof why, "%s: %s", mlaf_status_name(st), mlaf_context_last_error(ctx));
                    } else {
                        memcpy(hb.data, gd.body, sizeof hb.data);
                        memcpy(hb.scales, gs.body, sizeof hb.scales);
                        good = gl_judge(L, (mlaf_gemm_scale)si, &hb, GL_WRITER, why, sizeof why) && mlaf_gbuf_guards_ok(&gd) &&
                               mlaf_gbuf_guards_ok(&gs);
                    }
                }
                tl_case(good, name, "%s", why);
                mlaf_gbuf_free(&gx), mlaf_gbuf_free(&gd), mlaf_gbuf_free(&gs);
            }
    }
}

/* ---- REJECT: bad calls, nothing written ------------------------------------------------------------ */
enum { RT = 5, RK = 1024, NRB = 3 };

typedef struct reject_call {
    mlaf_tensor x, d, s;
    mlaf_gemm_out q;
    int use_x, use_q;
} reject_call;

/* Case k's one mutation of a valid call (bf16 x, fp8_1x128_mn with f32 scales); its expected status and
 * the part of the message that names the argument. */
static const char *mutate_call(int k, reject_call *c, mlaf_status *want, const char **what) {
    *want = MLAF_ERR_INVALID_ARGUMENT;
    switch (k) {
    case 0: c->x.shape[1] = c->d.shape[1] = 1000;
        *want = MLAF_ERR_SHAPE, *what = "q: K = 1000 values a row, expected a multiple of 128"; return "K not a multiple of the group";
    case 1: c->s.shape[0] = 7; *want = MLAF_ERR_SHAPE, *what = "q.scales.shape[0] = 7, expected K / 128 = 8"; return "scales shape";
    case 2: c->s.stride[0] = 6; *want = MLAF_ERR_STRIDE, *what = "q.scales.stride[0] = 6"; return "scales leading stride";
    case 3: c->s.data = (char *)c->s.data + 4; *want = MLAF_ERR_STRIDE, *what = "q.scales.data"; return "scales alignment";
    case 4: c->q.format = MLAF_GEMM_FP8_1X128_UE8M0, c->s.dtype = MLAF_I32, c->s.shape[0] = 2;
        *what = "q.scale = 0 (f32), expected 1 (ue8m0) for format fp8_1x128_ue8m0"; return "rounding the format lacks";
    case 5: c->q.format = (mlaf_gemm_format)7; *what = "q.format = 7"; return "unknown format";
    case 6: c->use_q = 0; *want = MLAF_ERR_NULL_POINTER, *what = "q is NULL"; return "no q";
    case 7: c->q.format = MLAF_GEMM_NONE, c->q.data = c->q.scales = NULL;
        *want = MLAF_ERR_NULL_POINTER, *what = "q.format = 0 (none): nothing to write"; return "format none";
    case 8: c->q.format = MLAF_GEMM_NONE; *what = "q.format = 0 (none) but q.data is given"; return "format none with tensors";
    case 9: c->d.data = c->x.data, c->d.stride[0] = 2 * RK; *want = MLAF_ERR_OVERLAP, *what = "q.data overlaps x";
        return "q.data overlaps x";
    case 10: c->s.data = (char *)c->x.data + 16 * 64; *want = MLAF_ERR_OVERLAP, *what = "q.scales overlaps x";
        return "q.scales overlaps x";
    case 11: c->s.data = c->d.data; *want = MLAF_ERR_OVERLAP, *what = "q.scales overlaps q.data"; return "scales overlap data";
    case 12: c->x.dtype = MLAF_I32; *want = MLAF_ERR_DTYPE, *what = "x.dtype = i32"; return "x dtype";
    case 13: c->x.ndim = 3; *want = MLAF_ERR_SHAPE, *what = "x.ndim = 3"; return "x rank";
    case 14: c->x.shape[0] = c->d.shape[0] = c->s.shape[1] = (int64_t)1 << 31, c->s.stride[0] = (int64_t)1 << 31;
        *want = MLAF_ERR_LIMIT, *what = "x.shape[0] = 2147483648 tokens, expected < 2^31"; return "T = 2^31";
    case 15: c->x.shape[1] = c->d.shape[1] = ((int64_t)1 << 20) + 128, c->x.stride[0] = c->d.stride[0] = c->x.shape[1];
        *want = MLAF_ERR_LIMIT, *what = "x.shape[1] = 1048704, expected <= 1048576"; return "K over 2^20";
    case 16: c->q.eps = -1.0f; *what = "q.eps = -1"; return "q.eps";
    case 17: c->d.dtype = MLAF_F16; *want = MLAF_ERR_DTYPE, *what = "q.data.dtype = f16"; return "data dtype";
    case 18: c->d.shape[0] = RT - 1; *want = MLAF_ERR_SHAPE, *what = "q.data.shape[0] = 4"; return "data rows";
    case 19: c->q.format = MLAF_GEMM_MXFP8, c->q.scale = MLAF_GEMM_SCALE_MX_FLOOR;
        *want = MLAF_ERR_DTYPE, *what = "q.scales.dtype = f32, expected u8"; return "mxfp8 scales dtype";
    case 20: c->use_x = 0; *want = MLAF_ERR_NULL_POINTER, *what = "x is NULL"; return "no x";
    case 21: c->q.scale = MLAF_GEMM_SCALE_MX_CEIL; *what = "q.scale = 3 (mx_ceil), expected 0 (f32) or 1 (ue8m0)";
        return "mx rounding for a 1x128 format";
    default: return NULL;
    }
}

static void reject_cases(mlaf_context *ctx) {
    const mlaf_backend be = mlaf_context_backend(ctx);
    const size_t sizes[NRB] = {RT * RK * 2, RT * RK, 8 * 8 * 4};
    mlaf_rng rng;
    mlaf_rng_seed(&rng, 4343);
    unsigned char *init[NRB];
    mlaf_gbuf g[NRB];
    for (int k = 0; k < NRB; k++) {
        init[k] = malloc(sizes[k]);
        for (size_t i = 0; i < sizes[k]; i++) init[k][i] = (unsigned char)(k == 0 ? (i % 2 ? 0x3f : mlaf_rng_u64(&rng)) : 0xFF);
        if (mlaf_gbuf_alloc(&g[k], be, sizes[k], init[k], 0) != MLAF_OK) {
            tl_case(0, "REJECT(buffers)", "allocation failed");
            return;
        }
    }
    for (int k = 0;; k++) {
        reject_call c;
        c.x = mlaf_tensor_2d(g[0].ptr, MLAF_BF16, RT, RK, RK), c.d = mlaf_tensor_2d(g[1].ptr, MLAF_U8, RT, RK, RK);
        c.s = mlaf_tensor_2d(g[2].ptr, MLAF_F32, RK / 128, RT, 8);
        c.q = (mlaf_gemm_out){MLAF_GEMM_FP8_1X128_MN, MLAF_GEMM_SCALE_F32, &c.d, &c.s, 0.0f};
        c.use_x = c.use_q = 1;
        mlaf_status want;
        const char *what = "";
        const char *label = mutate_call(k, &c, &want, &what);
        if (!label) break;
        const mlaf_status st = mlaf_gemm_quant(ctx, c.use_x ? &c.x : NULL, c.use_q ? &c.q : NULL);
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
    const mlaf_tensor x = mlaf_tensor_2d(g[0].ptr, MLAF_BF16, RT, RK, RK);
    char name[96];
    snprintf(name, sizeof name, "REJECT(no context,backend=%s)", mlaf_backend_name(be));
    tl_case(mlaf_gemm_quant(NULL, &x, NULL) == MLAF_ERR_NULL_POINTER, name, "a NULL context gives MLAF_ERR_NULL_POINTER");
    for (int k = 0; k < NRB; k++) mlaf_gbuf_free(&g[k]), free(init[k]);
}

static void suite(mlaf_context *ctx, int quick, const char *tag) {
    sweep(ctx, quick, tag);
    if (tag) return;
    eq_rms_norm_quant(ctx);
    paths(ctx);
    layout_op(ctx);
    reject_cases(ctx);
}

int main(void) { return tl_run_suite("GEMM_QUANT", suite); }
