/*
 * verify_gemm_quant.c — mlaf_verify_gemm_quant: a case of gemm_quant on the context's backend against
 * the GEMM-input encoder (ref_gemm_format.c, mlaf_ref_gemm_quant_row). How buffers are judged:
 * verify_case.h. Per token:
 *   - every quantized byte (values, f32 scales, UE8M0 bytes, the packed layout's zero bytes) is the
 *     encoder's applied to x's row as stored, bit for bit;
 *   - every value byte decodes within half an e4m3 step of its x value (finite, unsaturated ones).
 * Everything else (x, row padding, the MN-major layouts' padding rows) stays as it was. x's rows
 * span the cases a quantizer meets: ~N(0, 1) values, rows far larger or smaller, rows of subnormal
 * values (whose amax falls below the eps floor), zero rows, NaN and +-inf mixed into some rows.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../fp8.h"
#include "../gemm_format.h"
#include "verify_case.h"

typedef struct gq_bufs {
    vbuf x, qd, qs;
    int64_t XS, DS, ld;
    mlaf_dtype sdt;
} gq_bufs;

typedef struct gq_arg {
    const gq_bufs *b;
    const mlaf_verify_case *c;
    int64_t K;
    mlaf_gemm_quant_job hj; /* over x's initial image */
} gq_arg;

/* Row t's values: a sum of four uniforms (~N(0, 1)) times the row's scale, with the special rows
 * described above; row t takes draws [t stride, t stride + K), so any thread count gives the same. */
static void fill_x(mlaf_rng *rng, void *p, mlaf_dtype dt, int64_t T, int64_t stride, int64_t K) {
    const size_t es = mlaf_dtype_size(dt);
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int64_t t = 0; t < T; t++) {
        double s = 1.0;
        if (t % 13 == 5) s = dt == MLAF_F16 ? 64.0 : 4096.0;
        if (t % 13 == 9) s = 1.0 / 512.0;
        if (t % 13 == 11) s = dt == MLAF_F16 ? 0x1p-20 : 0x1p-120; /* subnormal values (f32: bf16 too) */
        if (t % 97 == 50) s = 0.0;
        mlaf_rng rt = mlaf_rng_skipped(rng, (uint64_t)(t * stride));
        char *row = (char *)p + (size_t)(t * stride) * es;
        for (int64_t i = 0; i < K; i++) {
            const uint64_t u = mlaf_rng_u64(&rt);
            const double z = ((double)(u & 0xffff) + (double)((u >> 16) & 0xffff) + (double)((u >> 32) & 0xffff) +
                              (double)(u >> 48)) * (1.0 / 65536.0) - 2.0;
            float v = (float)(s * z * 1.7320508075688772);
            if (t % 11 == 4 && i % 61 == 7) v = NAN;
            if (t % 19 == 6 && i == K / 2) v = t % 38 == 6 ? -INFINITY : INFINITY;
            mlaf_store_f32(row, dt, i, v);
        }
    }
    *rng = mlaf_rng_skipped(rng, (uint64_t)(T > 0 ? T * stride : 0));
}

static void gq_chunk(const void *arg, void *scratch, int64_t t0, int64_t n, judge *j, int64_t *errors) {
    (void)errors;
    const gq_arg *a = (const gq_arg *)arg;
    const gq_bufs *b = a->b;
    const int64_t K = a->K;
    float *row = (float *)scratch, *sf = row + K;
    uint8_t *rd = (uint8_t *)(sf + K), *sb = rd + K;
    for (int64_t t = t0; t < t0 + n; t++) {
        mlaf_ref_gemm_quant_row(&a->hj, t, row, rd, sf, sb);
        judge_gemm_row(j, &b->qd, &b->qs, b->DS, b->ld, b->sdt, a->c->q_format, t, K, row, rd, sf, sb, "x =");
    }
}

mlaf_status mlaf_verify_gemm_quant(mlaf_context *ctx, const mlaf_verify_case *c, mlaf_verify_result *r) {
    memset(r, 0, sizeof *r);
    const int64_t K = c->hidden > 0 ? c->hidden : 7168, T = c->T;
    const int32_t g = mlaf_gemm_format_group(c->q_format);
    if (T < 0 || g == 0 || K % g != 0) return MLAF_ERR_INVALID_ARGUMENT;
    const mlaf_backend be = mlaf_context_backend(ctx);
    const mlaf_dtype dt = c->dtype;
    const int64_t es = (int64_t)mlaf_dtype_size(dt);
    const int st = c->strided != 0;
    gq_bufs b;
    memset(&b, 0, sizeof b);
    mlaf_rng rng;
    mlaf_rng_seed(&rng, c->seed);
    mlaf_status s = MLAF_OK;

    /* x: seeded; q's data and scales: poisoned */
    b.XS = K + (st ? 9 : 0);
    void *tmp = malloc((size_t)((T > 0 ? T : 1) * b.XS * es));
    if (!tmp) return MLAF_ERR_OUT_OF_MEMORY;
    fill_x(&rng, tmp, dt, T, b.XS, K);
    s = vbuf_alloc(&b.x, "x", be, (size_t)(T * b.XS * es), tmp, st ? (size_t)(3 * es) : 0);
    free(tmp);
    if (s != MLAF_OK) goto done;
    int64_t shape[2], min_ld;
    if (mlaf_gemm_scales_shape(c->q_format, T, K, &b.sdt, shape, &min_ld) != MLAF_OK) {
        s = MLAF_ERR_INVALID_ARGUMENT;
        goto done;
    }
    const int mn = mlaf_gemm_formats[c->q_format].mn_major;
    const int64_t ses = (int64_t)mlaf_dtype_size(b.sdt);
    b.ld = min_ld + (st ? (mn ? 4 : 3) : 0);
    b.DS = K + (st ? 23 : 0);
    if ((s = vbuf_alloc(&b.qd, "q.data", be, (size_t)(T * b.DS), NULL, st ? 7 : 0)) != MLAF_OK) goto done;
    if ((s = vbuf_alloc(&b.qs, "q.scales", be, (size_t)(shape[0] * b.ld * ses), NULL, st && !mn ? (size_t)ses : 0)) !=
        MLAF_OK)
        goto done;

    /* the call */
    const vview vx = {&b.x, dt, 0, b.XS};
    mlaf_tensor tx = tensor_of(&vx, T, K), td = mlaf_tensor_2d(b.qd.g.ptr, MLAF_FP8_E4M3, T, K, b.DS),
                ts = mlaf_tensor_2d(b.qs.g.ptr, b.sdt, shape[0], shape[1], b.ld);
    const mlaf_gemm_out qo = {c->q_format, c->q_scale, &td, &ts, c->q_eps};
    s = mlaf_gemm_quant(ctx, &tx, &qo);
    if (s != MLAF_OK) {
        snprintf(r->detail, sizeof r->detail, "mlaf_gemm_quant: %s: %s", mlaf_status_name(s), mlaf_context_last_error(ctx));
        goto done;
    }
    if ((s = mlaf_context_sync(ctx)) != MLAF_OK) goto done;
    vbuf *all[3] = {&b.x, &b.qd, &b.qs};
    if ((s = fetch_all(all, 3)) != MLAF_OK) goto done;
    if (c->corrupt_from > 0) /* the harness's own test: byte (t, 0) of q.data altered */
        for (int64_t t = c->corrupt_from - 1; t < T; t += 500) ((uint8_t *)b.qd.g.body)[t * b.DS] ^= 0x01;

    judge j = {r, 0, 0.0, 0};
    gq_arg a;
    memset(&a, 0, sizeof a);
    a.b = &b, a.c = c, a.K = K;
    a.hj.T = T, a.hj.K = (int32_t)K, a.hj.dt = dt, a.hj.x = b.x.init, a.hj.x_stride = b.XS;
    a.hj.q.format = c->q_format, a.hj.q.scale = c->q_scale;
    a.hj.q.eps = c->q_eps == 0.0f ? MLAF_GEMM_DEFAULT_EPS : c->q_eps, a.hj.q.group = g;
    const int64_t chunk = K >= 262144 ? 1 : 262144 / K;
    const size_t scratch = (size_t)K * (2 * sizeof(float) + 2);
    int64_t errors = 0;
    if ((s = run_chunks(T, chunk, scratch, gq_chunk, &a, &j, &errors)) != MLAF_OK) goto done;
    int64_t untouched = 0;
    for (int i = 0; i < 3; i++) untouched += judge_untouched(&j, all[i]);
    judge_finish(&j, "gemm_quant", c, untouched);
done:
    vbuf_free(&b.x), vbuf_free(&b.qd), vbuf_free(&b.qs);
    return s;
}
