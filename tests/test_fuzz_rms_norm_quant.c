/*
 * test_fuzz_rms_norm_quant.c — random calls of mlaf_rms_norm_quant (docs/gemm_formats.md). The driver,
 * the harness and what every call must satisfy: fuzz_common.h. A call draws a dtype, T, a format
 * of src/gemm_format.h (or none) with one of its roundings, K a multiple of its group (any K without
 * one), the residual, y (its own buffer or x itself), padded rows and scale strides, bases misaligned
 * by whole elements; then the shared mutations and this op's own (eps, format, rounding, q.eps, a
 * format of none with tensors, no output at all). A success is judged against the float64 oracle:
 * the residual bit for bit, y within 1 unit, the quantized bytes those of the encoder applied to the
 * call's own y — or, for a call without y, each group's scale within the scales of the oracle's amax
 * widened by an ulp of the dtype and each value within half an e4m3 step (plus that ulp) of the
 * oracle's value — and every other byte untouched.
 */
#include "fuzz_common.h"

#include "fp8.h"
#include "gemm_format.h"

typedef struct rnq_case {
    mlaf_rms_norm_quant_params p;
    mlaf_gemm_out q;
    int give_q; /* pass &q (else NULL) */
    int no_y;   /* the param mutation "no output": y is dropped */
} rnq_case;

static int rnq_params_mutate(fz *f, void *vp) {
    rnq_case *c = (rnq_case *)vp;
    static const float bad_eps[5] = {0.0f, -1e-6f, NAN, INFINITY, -INFINITY};
    const mlaf_gemm_format_info *row = mlaf_gemm_format_row(c->q.format);
    switch (U(&f->r, 6)) {
    case 0: c->p.eps = bad_eps[U(&f->r, 5)]; note(f, " eps=%g", (double)c->p.eps); return 1;
    case 1:
        c->q.format = (mlaf_gemm_format)(CHANCE(&f->r, 0.5) ? -1 : RANGE(&f->r, MLAF_GEMM_FORMAT_COUNT_, 9));
        c->give_q = 1;
        note(f, " q.format=%d", (int)c->q.format);
        return 1;
    case 2: {
        if (!c->give_q || !row || !row->group) return 0;
        int s = (int)RANGE(&f->r, 0, MLAF_GEMM_SCALE_COUNT_ + 1);
        while (s < MLAF_GEMM_SCALE_COUNT_ && ((row->scale_modes >> s) & 1u)) s++;
        c->q.scale = (mlaf_gemm_scale)s;
        note(f, " q.scale=%d", s);
        return 1;
    }
    case 3: {
        if (!c->give_q || !row || !row->group) return 0;
        static const float bad[4] = {-1.0f, NAN, INFINITY, 1e-31f};
        c->q.eps = bad[U(&f->r, 4)];
        note(f, " q.eps=%g", (double)c->q.eps);
        return 1;
    }
    case 4:
        if (!c->give_q || !row || !row->group) return 0;
        c->q.format = MLAF_GEMM_NONE; /* its tensors stay */
        note(f, " q.format=none with tensors");
        return 1;
    default:
        if (c->give_q && row && row->group) return 0;
        c->no_y = 1;
        note(f, " no y and no q");
        return 1;
    }
}

/* What y's tolerance (1 unit, docs/conventions.md) allows at |v|, doubled: 2 ulp of f16 / bf16 (subnormal
 * steps included), 2e-5 relative for f32. */
static double slack(double v, mlaf_dtype dt) {
    const double a = fabs(v);
    if (dt == MLAF_F32) return 2e-5 * a + 0x1p-140;
    const int mant = dt == MLAF_F16 ? 10 : 7, min_exp = dt == MLAF_F16 ? -14 : -126;
    int e = min_exp;
    if (a > 0) {
        frexp(a, &e);
        e = e - 1 < min_exp ? min_exp : e - 1;
    }
    return 2 * ldexp(1.0, e - mant);
}

/* The scale an oracle amax gives (the encoder on a group holding it alone). */
static float ref_scale(mlaf_gemm_format fmt, mlaf_gemm_scale s, float eps, double amax) {
    float g[128] = {0};
    uint8_t d[128], sb[1];
    float sf[1];
    g[0] = (float)amax;
    const mlaf_gemm_encoding e = {fmt, s, eps};
    mlaf_ref_gemm_encode_row(&e, g, mlaf_gemm_format_group(fmt), d, sf, sb);
    return sf[0];
}

static int fuzz_rnq(fz *f) {
    mlaf_rng *r = &f->r;
    set_state(f);
    rnq_case c;
    memset(&c, 0, sizeof c);
    const mlaf_dtype dt = FLOAT_DT(r);
    const int64_t T = draw_T(r);
    const mlaf_gemm_format fmt = CHANCE(r, 0.3) ? MLAF_GEMM_NONE : (mlaf_gemm_format)RANGE(r, 1, MLAF_GEMM_FORMAT_COUNT_ - 1);
    const mlaf_gemm_format_info *row = &mlaf_gemm_formats[fmt];
    int sc;
    do sc = (int)U(r, MLAF_GEMM_SCALE_COUNT_);
    while (fmt && !((row->scale_modes >> sc) & 1u));
    const int64_t K = fmt ? row->group * RANGE(r, 1, 5) : RANGE(r, 1, 300);
    c.p.eps = (float)pow(10.0, -RANGE(r, 1, 8));
    const double scale = CHANCE(r, 0.2) ? (CHANCE(r, 0.5) ? 1e-3 : 60.0) : 1.0;
    fz_t x, w, res, y, d, s;
    memset(&res, 0, sizeof res), memset(&y, 0, sizeof y), memset(&d, 0, sizeof d), memset(&s, 0, sizeof s);
    fz_2d(f, &x, "x", dt, T, K, CHANCE(r, 0.4) ? 0 : RANGE(r, 1, 9), 1, scale, DT_FLOATS, 3u, 1, 0);
    fz_1d(f, &w, "weight", CHANCE(r, 0.5) ? dt : MLAF_F32, K, 1, 0.5, DTM(dt) | DTM(MLAF_F32), 1u, 1, 0);
    if (CHANCE(r, 0.5)) fz_2d(f, &res, "residual", dt, T, K, RANGE(r, 0, 5), 1, scale, DTM(dt), 3u, 0, 1);
    if (!fmt || CHANCE(r, 0.7)) {
        if (CHANCE(r, 0.25)) fz_columns(f, &y, "y", &x, 0, K, 3u); /* in place: y = x */
        else fz_2d(f, &y, "y", dt, T, K, RANGE(r, 0, 5), 0, 1, DTM(dt), 3u, !fmt, 1);
    }
    c.give_q = fmt || CHANCE(r, 0.5);
    c.q = (mlaf_gemm_out){fmt, (mlaf_gemm_scale)sc, NULL, NULL, CHANCE(r, 0.3) ? 1e-4f : 0.0f};
    int64_t sh[2] = {0, 0}, ld = 0;
    if (fmt) {
        mlaf_dtype sdt;
        mlaf_gemm_scales_shape(fmt, T, K, &sdt, sh, &ld);
        fz_2d(f, &d, "q.data", CHANCE(r, 0.5) ? MLAF_U8 : MLAF_FP8_E4M3, T, K, RANGE(r, 0, 9), 0, 0,
              DTM(MLAF_U8) | DTM(MLAF_FP8_E4M3), 3u, 1, 1);
        const int64_t pad = row->mn_major ? 4 * RANGE(r, 0, 2) : RANGE(r, 0, 3);
        const int64_t sst[2] = {ld + pad, 1};
        fz_tensor(f, &s, "q.scales", sdt, 2, sh, sst, 0, 0, DTM(sdt), 3u, 1, 1);
        if (row->mn_major) s.boff = 0; /* TMA-aligned: 16-byte aligned data (the buffers are) */
    }
    mutate(f, rnq_params_mutate, &c, &x, 0, 0);
    if (!fz_commit(f)) return -1;
    if (fmt) c.q.data = DEV(f, &d), c.q.scales = DEV(f, &s);
    const int with_y = y.present && !c.no_y;
    mlaf_status st = mlaf_rms_norm_quant(f->ctx, &c.p, DEV(f, &x), DEV(f, &res), DEV(f, &w), with_y ? DEV(f, &y) : NULL,
                                         c.give_q ? &c.q : NULL);
    if (!judge_new(f, st)) return st == MLAF_OK;

    /* the oracle over the host images, through a job validated from the same views */
    mlaf_rms_norm_quant_job hj;
    mlaf_gemm_out hq = c.q;
    if (fmt) hq.data = HOST(f, &d), hq.scales = HOST(f, &s);
    mlaf_status hs = mlaf_check_rms_norm_quant(f->host, &c.p, HOST(f, &x), HOST(f, &res), HOST(f, &w),
                                               with_y ? HOST(f, &y) : NULL, c.give_q ? &hq : NULL, &hj);
    if (hs != MLAF_OK) {
        fail(f, "the device call passed but the same views over host memory gave %s: %s", mlaf_status_name(hs),
             mlaf_context_last_error(f->host));
        return 1;
    }
    const int64_t TT = hj.T, KK = hj.K;
    double *h = malloc(sizeof(double) * (size_t)(TT * KK + 1)), *yr = malloc(sizeof(double) * (size_t)(TT * KK + 1));
    float *rowv = malloc(sizeof(float) * (size_t)(KK + 1)), *sf = malloc(sizeof(float) * (size_t)(KK + 1));
    uint8_t *rd = malloc((size_t)KK + 1), *sb = malloc((size_t)KK + 1);
    mlaf_ref_rms_norm_quant(&hj, h, yr);
    const mlaf_gemm_out_job *q = &hj.q;
    const int32_t g = q->group ? q->group : 1;
    const int64_t G = KK / g, ses = q->format ? (int64_t)mlaf_dtype_size(row->scale_dt) : 1;
    for (int64_t t = 0; t < TT && !f->failed; t++) {
        for (int64_t i = 0; i < KK; i++) {
            if (res.present) check_exact(f, &res, t * res.t.stride[0] + i, (float)h[t * KK + i], "residual", t, i);
            if (with_y) check_units(f, &y, t * y.t.stride[0] + i, yr[t * KK + i], "y", t, i);
        }
        if (q->format == MLAF_GEMM_NONE) continue;
        const unsigned char *qd = body(f, d.buf) + d.boff + t * d.t.stride[0];
        claim(f, d.buf, d.boff + t * d.t.stride[0], (size_t)KK);
        const unsigned char *sbase = body(f, s.buf) + s.boff;
        const int64_t Gp = row->pack == 4 ? (G + 3) / 4 * 4 : G;
        for (int64_t k = 0; k < Gp; k++)
            claim(f, s.buf, s.boff + mlaf_ref_gemm_scale_offset(q->format, t, k, q->scale_ld), (size_t)(ses == 4 && row->pack == 1 ? 4 : 1));
        if (with_y) { /* the encoder on the call's own dense row, bit for bit */
            for (int64_t i = 0; i < KK; i++) rowv[i] = mlaf_load_f32(body(f, y.buf) + y.boff, dt, t * y.t.stride[0] + i);
            const mlaf_gemm_encoding e = {q->format, q->scale, q->eps};
            mlaf_ref_gemm_encode_row(&e, rowv, KK, rd, sf, sb);
            for (int64_t i = 0; i < KK && !f->failed; i++)
                if (qd[i] != rd[i]) fail(f, "q.data[%lld, %lld] = 0x%02x, expected 0x%02x", (long long)t, (long long)i, qd[i], rd[i]);
        }
        for (int64_t k = 0; k < Gp && !f->failed; k++) {
            const unsigned char *sp = sbase + mlaf_ref_gemm_scale_offset(q->format, t, k, q->scale_ld);
            if (k >= G) {
                if (*sp) fail(f, "q.scales: byte of group %lld (past the last) of row %lld is 0x%02x, expected 0", (long long)k, (long long)t, *sp);
                continue;
            }
            float sg;
            if (row->scale_dt == MLAF_F32) memcpy(&sg, sp, 4);
            else sg = *sp == 255 ? INFINITY : (float)ldexp(1.0, *sp - 127);
            if (with_y) {
                uint8_t want[4];
                if (row->scale_dt == MLAF_F32) memcpy(want, &sf[k], 4);
                else want[0] = sb[k];
                if (memcmp(sp, want, row->scale_dt == MLAF_F32 ? 4 : 1))
                    fail(f, "q.scales of row %lld group %lld: 0x%02x.., expected 0x%02x..", (long long)t, (long long)k, sp[0], want[0]);
                continue;
            }
            /* no y: the scale within those of the oracle's amax +- an ulp of the dtype, each value
             * within half an e4m3 step (and that ulp) of the oracle */
            double amax = 0.0;
            for (int32_t i = 0; i < g; i++) amax = fmax(amax, fabs(mlaf_round_to(yr[t * KK + k * g + i], dt)));
            const double da = slack(amax, dt);
            const float lo = ref_scale(q->format, q->scale, q->eps, amax > da ? amax - da : 0.0),
                        hi = ref_scale(q->format, q->scale, q->eps, amax + da);
            if (!(sg >= lo && sg <= hi))
                fail(f, "q.scales of row %lld group %lld = %.9g, outside [%.9g, %.9g] (the oracle's amax %.9g)", (long long)t,
                     (long long)k, (double)sg, (double)lo, (double)hi, amax);
            for (int32_t i = 0; i < g && !f->failed; i++) {
                const double v = yr[t * KK + k * g + i], dec = (double)mlaf_e4m3_to_f32(qd[k * g + i]) * sg;
                const double a = fabs(v / sg);
                if (!isfinite(v) || !isfinite(sg) || a >= 460.0) continue; /* saturating values: the scale check holds */
                const double step = a < 0x1p-6 ? 0x1p-9 : ldexp(1.0, (int)floor(log2(a)) - 3);
                if (fabs(dec - v) > (step / 2) * sg * (1 + 1e-6) + slack(v, dt) + 0x1p-149)
                    fail(f, "q.data[%lld, %lld] = 0x%02x decodes to %.9g, the oracle's value %.9g (scale %.9g)", (long long)t,
                         (long long)(k * g + i), qd[k * g + i], dec, v, (double)sg);
            }
        }
    }
    check_untouched(f);
    free(h), free(yr), free(rowv), free(sf), free(rd), free(sb);
    return 1;
}

int main(void) {
    static const fuzz_entry ops[] = {{10, fuzz_rnq}};
    return fuzz_main(ops, (int)(sizeof ops / sizeof ops[0]));
}
