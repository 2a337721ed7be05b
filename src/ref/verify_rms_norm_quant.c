/*
 * verify_rms_norm_quant.c — mlaf_verify_rms_norm_quant: a case of rms_norm_quant on the context's
 * backend against the float64 oracle (ref_norm.c) and the GEMM-input encoder (ref_gemm_format.c).
 * How buffers are judged: verify_case.h. Per token:
 *   - the written residual equals round(x + residual) bit for bit;
 *   - the dense y is within 1 unit of the oracle (docs/conventions.md);
 *   - every quantized byte (values, f32 scales, UE8M0 bytes, the packed layout's zero bytes) is the
 *     encoder's applied to the dense row the backend produced: the same call's y, or, for a call
 *     that writes q alone (no_dense), the y of a dense-only call on the same inputs, judged too;
 *   - every value byte decodes within half an e4m3 step of its dense value (unsaturated ones).
 * Everything else (inputs, row padding, the MN-major layouts' padding rows) stays as it was.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../fp8.h"
#include "../gemm_format.h"
#include "verify_case.h"

typedef struct rnq_bufs {
    vbuf x, res, res2, w, y, y2, qd, qs;
    vview vx, vr, vr2, vy, vy2;
    int64_t DS, ld;
    mlaf_dtype sdt;
    int64_t srows, scols;
} rnq_bufs;

typedef struct rnq_arg {
    const rnq_bufs *b;
    const mlaf_verify_case *c;
    int64_t K;
    float eps;
    mlaf_gemm_encoding enc;
    int dense; /* y of the call itself; else vy2 (the dense-only call) */
} rnq_arg;

static void bufs_free(rnq_bufs *b) {
    vbuf *all[8] = {&b->x, &b->res, &b->res2, &b->w, &b->y, &b->y2, &b->qd, &b->qs};
    for (int i = 0; i < 8; i++) vbuf_free(all[i]);
}

/* Rows of ~N(0, sd) values in dt (a sum of four uniforms, as verify_inputs.c's), some rows far larger
 * or smaller and some zero; row t takes draws [t stride, t stride + K), so any thread count gives
 * the same values. */
static void fill_rows(mlaf_rng *rng, void *p, mlaf_dtype dt, int64_t T, int64_t stride, int64_t K, double sd) {
    const size_t es = mlaf_dtype_size(dt);
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int64_t t = 0; t < T; t++) {
        double s = sd;
        if (t % 13 == 5) s *= dt == MLAF_F16 ? 64.0 : 4096.0;
        if (t % 13 == 9) s /= 512.0;
        if (t % 97 == 50) s = 0.0;
        mlaf_rng rt = mlaf_rng_skipped(rng, (uint64_t)(t * stride));
        char *row = (char *)p + (size_t)(t * stride) * es;
        for (int64_t i = 0; i < K; i++) {
            const uint64_t u = mlaf_rng_u64(&rt);
            const double z = ((double)(u & 0xffff) + (double)((u >> 16) & 0xffff) + (double)((u >> 32) & 0xffff) +
                              (double)(u >> 48)) * (1.0 / 65536.0) - 2.0;
            mlaf_store_f32(row, dt, i, (float)(s * z * 1.7320508075688772));
        }
    }
    *rng = mlaf_rng_skipped(rng, (uint64_t)(T > 0 ? T * stride : 0));
}

/* The host job of tokens [t0, t0 + n) over the initial images. */
static mlaf_rms_norm_quant_job host_job(const rnq_arg *a, int64_t t0, int64_t n) {
    const rnq_bufs *b = a->b;
    const size_t es = mlaf_dtype_size(a->c->dtype);
    mlaf_rms_norm_quant_job j;
    memset(&j, 0, sizeof j);
    j.T = n, j.K = (int32_t)a->K, j.eps = a->eps, j.dt = a->c->dtype;
    j.x = b->x.init + (size_t)((b->vx.off + t0 * b->vx.stride) * (int64_t)es);
    j.x_stride = b->vx.stride;
    if (a->c->residual) {
        j.residual = b->res.init + (size_t)((b->vr.off + t0 * b->vr.stride) * (int64_t)es);
        j.r_stride = b->vr.stride;
    }
    j.w = b->w.init, j.w_dt = a->c->weight_dtype;
    return j;
}

/* The bytes of buffer v at (t, i) claimed and compared with the float want (NaN: any NaN). */
static void judge_exact(judge *j, const vview *v, const char *what, int64_t t, int64_t i, double want) {
    const size_t at = vv_byte(v, t, i), es = mlaf_dtype_size(v->dt);
    memset(v->b->claimed + at, 1, es);
    const double got = mlaf_load_f32(v->b->g.body, v->dt, v->off + t * v->stride + i);
    j->values++;
    if (!(got == want || (got != got && want != want)))
        judge_fail(j, "%s[t=%lld,i=%lld]: got %.9g, expected %.9g (round(x + residual), bit for bit)", what,
                   (long long)t, (long long)i, got, want);
}

static void rnq_chunk(const void *arg, void *scratch, int64_t t0, int64_t n, judge *j, int64_t *errors) {
    (void)errors;
    const rnq_arg *a = (const rnq_arg *)arg;
    const rnq_bufs *b = a->b;
    const int64_t K = a->K;
    if (K <= 0) return;
    double *h = (double *)scratch, *yr = h + n * K;
    float *row = (float *)(yr + n * K), *sf = row + K;
    uint8_t *rd = (uint8_t *)(sf + K), *sb = rd + K;
    const mlaf_rms_norm_quant_job hj = host_job(a, t0, n);
    mlaf_ref_rms_norm_quant(&hj, h, yr);
    const vview *dense = a->dense ? &b->vy : &b->vy2;
    const int q = a->enc.format != MLAF_GEMM_NONE;
    for (int64_t u = 0; u < n; u++) {
        const int64_t t = t0 + u;
        for (int64_t i = 0; i < K; i++) {
            if (a->c->residual) judge_exact(j, &b->vr, "residual", t, i, h[u * K + i]);
            if (a->c->residual && !a->dense) judge_exact(j, &b->vr2, "residual (dense-only call)", t, i, h[u * K + i]);
            judge_value(j, dense, a->dense ? "y" : "y (dense-only call)", t, i, yr[u * K + i], 0);
        }
        if (!q) continue;
        for (int64_t i = 0; i < K; i++) row[i] = mlaf_load_f32(dense->b->g.body, dense->dt, dense->off + t * dense->stride + i);
        mlaf_ref_gemm_encode_row(&a->enc, row, K, rd, sf, sb);
        judge_gemm_row(j, &b->qd, &b->qs, b->DS, b->ld, b->sdt, a->enc.format, t, K, row, rd, sf, sb,
                       "the dense value");
    }
}

/* A corrupted output for the harness's own test: y's element (t, 0), or q's byte (t, 0). */
static void corrupt(const mlaf_verify_case *c, const rnq_bufs *b, int dense) {
    if (c->corrupt_from <= 0) return;
    if (dense || c->q_format == MLAF_GEMM_NONE) {
        corrupt_outputs(c, &b->vy);
        return;
    }
    for (int64_t t = c->corrupt_from - 1; t < c->T; t += 500) ((uint8_t *)b->qd.g.body)[t * b->DS] ^= 0x01;
}

mlaf_status mlaf_verify_rms_norm_quant(mlaf_context *ctx, const mlaf_verify_case *c, mlaf_verify_result *r) {
    memset(r, 0, sizeof *r);
    const int64_t K = c->hidden > 0 ? c->hidden : 7168, T = c->T;
    const int q = c->q_format != MLAF_GEMM_NONE;
    if (T < 0 || (c->no_dense && !q) || (c->no_dense && c->in_place)) return MLAF_ERR_INVALID_ARGUMENT;
    const mlaf_backend be = mlaf_context_backend(ctx);
    const mlaf_dtype dt = c->dtype;
    const int64_t es = (int64_t)mlaf_dtype_size(dt), wes = (int64_t)mlaf_dtype_size(c->weight_dtype);
    const int st = c->strided != 0, dense = !c->no_dense;
    const float eps = c->cfg.rms_norm_eps > 0.0f ? c->cfg.rms_norm_eps : 1e-6f;
    rnq_bufs b;
    memset(&b, 0, sizeof b);
    mlaf_rng rng;
    mlaf_rng_seed(&rng, c->seed);
    mlaf_status s = MLAF_OK;
    void *tmp = NULL;

    /* x, residual, weight: seeded inputs */
    const int64_t XS = K + (st ? 9 : 0), RS = K + (st ? 5 : 0), YS = K + (st ? 3 : 0);
    tmp = malloc((size_t)((T > 0 ? T : 1) * (XS > RS ? XS : RS) * es));
    if (!tmp) return MLAF_ERR_OUT_OF_MEMORY;
    fill_rows(&rng, tmp, dt, T, XS, K, 1.0);
    if ((s = vbuf_alloc(&b.x, "x", be, (size_t)(T * XS * es), tmp, st ? (size_t)(3 * es) : 0)) != MLAF_OK) goto done;
    b.vx = (vview){&b.x, dt, 0, XS};
    if (c->residual) {
        fill_rows(&rng, tmp, dt, T, RS, K, 0.75);
        if ((s = vbuf_alloc(&b.res, "residual", be, (size_t)(T * RS * es), tmp, st ? (size_t)es : 0)) != MLAF_OK) goto done;
        b.vr = (vview){&b.res, dt, 0, RS};
        if (!dense) {
            if ((s = vbuf_alloc(&b.res2, "residual (dense-only call)", be, (size_t)(T * RS * es), tmp, 0)) != MLAF_OK) goto done;
            b.vr2 = (vview){&b.res2, dt, 0, RS};
        }
    }
    free(tmp);
    tmp = malloc((size_t)(K * wes));
    if (!tmp) {
        s = MLAF_ERR_OUT_OF_MEMORY;
        goto done;
    }
    mlaf_fill_normal(&rng, tmp, c->weight_dtype, (size_t)K, 1.0, 0.25);
    if ((s = vbuf_alloc(&b.w, "weight", be, (size_t)(K * wes), tmp, st ? (size_t)wes : 0)) != MLAF_OK) goto done;
    free(tmp);
    tmp = NULL;

    /* outputs, poisoned: y (or x itself), the dense-only call's y, q's data and scales */
    if (dense && c->in_place) {
        b.vy = b.vx;
    } else if (dense) {
        if ((s = vbuf_alloc(&b.y, "y", be, (size_t)(T * YS * es), NULL, st ? (size_t)(5 * es) : 0)) != MLAF_OK) goto done;
        b.vy = (vview){&b.y, dt, 0, YS};
    } else {
        if ((s = vbuf_alloc(&b.y2, "y (dense-only call)", be, (size_t)(T * K * es), NULL, 0)) != MLAF_OK) goto done;
        b.vy2 = (vview){&b.y2, dt, 0, K};
    }
    int64_t shape[2] = {0, 0};
    if (q) {
        int64_t min_ld;
        if (mlaf_gemm_scales_shape(c->q_format, T, K, &b.sdt, shape, &min_ld) != MLAF_OK) {
            s = MLAF_ERR_INVALID_ARGUMENT;
            goto done;
        }
        const int mn = mlaf_gemm_formats[c->q_format].mn_major;
        b.ld = min_ld + (st ? (mn ? 4 : 3) : 0);
        b.DS = K + (st ? 23 : 0);
        const int64_t ses = (int64_t)mlaf_dtype_size(b.sdt);
        if ((s = vbuf_alloc(&b.qd, "q.data", be, (size_t)(T * b.DS), NULL, st ? 7 : 0)) != MLAF_OK) goto done;
        if ((s = vbuf_alloc(&b.qs, "q.scales", be, (size_t)(shape[0] * b.ld * ses), NULL, st && !mn ? (size_t)ses : 0)) !=
            MLAF_OK)
            goto done;
    }

    /* the call (and the dense-only call a q-only case is judged from) */
    const mlaf_rms_norm_quant_params p = {eps};
    mlaf_tensor tx = tensor_of(&b.vx, T, K), tw = mlaf_tensor_1d(b.w.g.ptr, c->weight_dtype, K), tr, ty, td, ts;
    if (c->residual) tr = tensor_of(&b.vr, T, K);
    if (dense) ty = tensor_of(&b.vy, T, K);
    if (q) {
        td = mlaf_tensor_2d(b.qd.g.ptr, MLAF_FP8_E4M3, T, K, b.DS);
        ts = mlaf_tensor_2d(b.qs.g.ptr, b.sdt, shape[0], shape[1], b.ld);
    }
    const mlaf_gemm_out qo = {c->q_format, c->q_scale, q ? &td : NULL, q ? &ts : NULL, c->q_eps};
    s = mlaf_rms_norm_quant(ctx, &p, &tx, c->residual ? &tr : NULL, &tw, dense ? &ty : NULL, &qo);
    if (s == MLAF_OK && !dense) {
        mlaf_tensor tr2, ty2 = tensor_of(&b.vy2, T, K);
        if (c->residual) tr2 = tensor_of(&b.vr2, T, K);
        s = mlaf_rms_norm_quant(ctx, &p, &tx, c->residual ? &tr2 : NULL, &tw, &ty2, NULL);
    }
    if (s != MLAF_OK) {
        snprintf(r->detail, sizeof r->detail, "mlaf_rms_norm_quant: %s: %s", mlaf_status_name(s), mlaf_context_last_error(ctx));
        goto done;
    }
    if ((s = mlaf_context_sync(ctx)) != MLAF_OK) goto done;
    vbuf *all[8] = {&b.x, &b.res, &b.res2, &b.w, &b.y, &b.y2, &b.qd, &b.qs};
    if ((s = fetch_all(all, 8)) != MLAF_OK) goto done;
    corrupt(c, &b, dense);

    judge j = {r, 0, 0.0, 0};
    rnq_arg a = {&b, c, K, eps, {c->q_format, c->q_scale, c->q_eps == 0.0f ? MLAF_GEMM_DEFAULT_EPS : c->q_eps}, dense};
    const int64_t chunk = K >= 262144 ? 1 : 262144 / K;
    const size_t scratch = (size_t)chunk * (size_t)K * 2 * sizeof(double) + (size_t)K * (2 * sizeof(float) + 2);
    int64_t errors = 0;
    if ((s = run_chunks(T, chunk, scratch, rnq_chunk, &a, &j, &errors)) != MLAF_OK) goto done;
    int64_t untouched = 0;
    for (int i = 0; i < 8; i++) untouched += judge_untouched(&j, all[i]);
    judge_finish(&j, "rms_norm_quant", c, untouched);
done:
    free(tmp);
    bufs_free(&b);
    return s;
}
