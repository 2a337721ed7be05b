/*
 * test_fuzz_gemm_quant.c — random calls of mlaf_gemm_quant (docs/gemm_formats.md). The driver, the harness
 * and what every call must satisfy: fuzz_common.h. A call draws a dtype, T, a format of
 * src/gemm_format.h with one of its roundings, K a multiple of its group, padded x rows, padded data
 * rows and scale strides, bases misaligned by whole elements, an eps; then the shared mutations and
 * this op's own (format, rounding, q.eps, a format of none with or without tensors, no q at all). A
 * success is judged against the encoder (mlaf_ref_gemm_quant_row) on x's rows as the op saw them: every
 * value byte, scale and packed zero byte bit for bit, every other byte untouched.
 */
#include "fuzz_common.h"

#include "gemm_format.h"

typedef struct gq_case {
    mlaf_gemm_out q;
    int give_q;     /* pass &q (else NULL) */
    int no_tensors; /* q without data and scales */
} gq_case;

static int gq_params_mutate(fz *f, void *vp) {
    gq_case *c = (gq_case *)vp;
    const mlaf_gemm_format_info *row = mlaf_gemm_format_row(c->q.format);
    if (!c->give_q || !row || !row->group) return 0;
    switch (U(&f->r, 6)) {
    case 0:
        c->q.format = (mlaf_gemm_format)(CHANCE(&f->r, 0.5) ? -1 : RANGE(&f->r, MLAF_GEMM_FORMAT_COUNT_, 9));
        note(f, " q.format=%d", (int)c->q.format);
        return 1;
    case 1: {
        int s = (int)RANGE(&f->r, 0, MLAF_GEMM_SCALE_COUNT_ + 1);
        while (s < MLAF_GEMM_SCALE_COUNT_ && ((row->scale_modes >> s) & 1u)) s++;
        c->q.scale = (mlaf_gemm_scale)s;
        note(f, " q.scale=%d", s);
        return 1;
    }
    case 2: {
        static const float bad[4] = {-1.0f, NAN, INFINITY, 1e-31f};
        c->q.eps = bad[U(&f->r, 4)];
        note(f, " q.eps=%g", (double)c->q.eps);
        return 1;
    }
    case 3:
        c->q.format = MLAF_GEMM_NONE; /* its tensors stay */
        note(f, " q.format=none with tensors");
        return 1;
    case 4:
        c->q.format = MLAF_GEMM_NONE, c->no_tensors = 1;
        note(f, " q.format=none");
        return 1;
    default:
        c->give_q = 0;
        note(f, " no q");
        return 1;
    }
}

static int fuzz_gq(fz *f) {
    mlaf_rng *r = &f->r;
    set_state(f);
    gq_case c;
    memset(&c, 0, sizeof c);
    const mlaf_dtype dt = FLOAT_DT(r);
    const int64_t T = draw_T(r);
    const mlaf_gemm_format fmt = (mlaf_gemm_format)RANGE(r, 1, MLAF_GEMM_FORMAT_COUNT_ - 1);
    const mlaf_gemm_format_info *row = &mlaf_gemm_formats[fmt];
    int sc;
    do sc = (int)U(r, MLAF_GEMM_SCALE_COUNT_);
    while (!((row->scale_modes >> sc) & 1u));
    const int64_t K = row->group * RANGE(r, 1, 6);
    const double scale = CHANCE(r, 0.2) ? (CHANCE(r, 0.5) ? 1e-3 : 60.0) : 1.0;
    fz_t x, d, s;
    fz_2d(f, &x, "x", dt, T, K, CHANCE(r, 0.4) ? 0 : RANGE(r, 1, 9), 1, scale, DT_FLOATS, 3u, 1, 0);
    c.give_q = 1;
    c.q = (mlaf_gemm_out){fmt, (mlaf_gemm_scale)sc, NULL, NULL, CHANCE(r, 0.3) ? 1e-4f : 0.0f};
    int64_t sh[2] = {0, 0}, ld = 0;
    mlaf_dtype sdt;
    mlaf_gemm_scales_shape(fmt, T, K, &sdt, sh, &ld);
    fz_2d(f, &d, "q.data", CHANCE(r, 0.5) ? MLAF_U8 : MLAF_FP8_E4M3, T, K, RANGE(r, 0, 9), 0, 0,
          DTM(MLAF_U8) | DTM(MLAF_FP8_E4M3), 3u, 1, 1);
    const int64_t pad = row->mn_major ? 4 * RANGE(r, 0, 2) : RANGE(r, 0, 3);
    const int64_t sst[2] = {ld + pad, 1};
    fz_tensor(f, &s, "q.scales", sdt, 2, sh, sst, 0, 0, DTM(sdt), 3u, 1, 1);
    if (row->mn_major) s.boff = 0; /* TMA-aligned: 16-byte aligned data (the buffers are) */
    mutate(f, gq_params_mutate, &c, &x, 0, 0);
    if (!fz_commit(f)) return -1;
    if (!c.no_tensors) c.q.data = DEV(f, &d), c.q.scales = DEV(f, &s);
    mlaf_status st = mlaf_gemm_quant(f->ctx, DEV(f, &x), c.give_q ? &c.q : NULL);
    if (!judge_new(f, st)) return st == MLAF_OK;

    /* the oracle over the host images, through a job validated from the same views */
    mlaf_gemm_quant_job hj;
    mlaf_gemm_out hq = c.q;
    hq.data = HOST(f, &d), hq.scales = HOST(f, &s);
    const mlaf_status hs = mlaf_check_gemm_quant(f->host, HOST(f, &x), &hq, &hj);
    if (hs != MLAF_OK) {
        fail(f, "the device call passed but the same views over host memory gave %s: %s", mlaf_status_name(hs),
             mlaf_context_last_error(f->host));
        return 1;
    }
    const int64_t TT = hj.T, KK = hj.K, g = hj.q.group, G = KK / g;
    const mlaf_gemm_format_info *hr = &mlaf_gemm_formats[hj.q.format];
    const int f32 = hr->scale_dt == MLAF_F32;
    const int64_t Gp = hr->pack == 4 ? (G + 3) / 4 * 4 : G;
    float *rowv = malloc(sizeof(float) * (size_t)KK), *sf = malloc(sizeof(float) * (size_t)G);
    uint8_t *rd = malloc((size_t)KK), *sb = malloc((size_t)G);
    for (int64_t t = 0; t < TT && !f->failed; t++) {
        mlaf_ref_gemm_quant_row(&hj, t, rowv, rd, sf, sb);
        const unsigned char *qd = body(f, d.buf) + d.boff + t * d.t.stride[0];
        claim(f, d.buf, d.boff + t * d.t.stride[0], (size_t)KK);
        for (int64_t i = 0; i < KK && !f->failed; i++)
            if (qd[i] != rd[i])
                fail(f, "q.data[%lld, %lld] = 0x%02x, expected 0x%02x (x = %.9g)", (long long)t, (long long)i, qd[i], rd[i],
                     (double)rowv[i]);
        for (int64_t k = 0; k < Gp && !f->failed; k++) {
            const int64_t o = mlaf_ref_gemm_scale_offset(hj.q.format, t, k, hj.q.scale_ld);
            claim(f, s.buf, s.boff + o, f32 ? 4 : 1);
            const unsigned char *sp = body(f, s.buf) + s.boff + o;
            uint8_t want[4] = {0, 0, 0, 0};
            if (f32) memcpy(want, &sf[k], 4);
            else if (k < G) want[0] = sb[k];
            if (memcmp(sp, want, f32 ? 4 : 1))
                fail(f, "q.scales of row %lld group %lld: 0x%02x.., expected 0x%02x..%s", (long long)t, (long long)k, sp[0],
                     want[0], k < G ? "" : " (a zero byte past the last group)");
        }
    }
    check_untouched(f);
    free(rowv), free(sf), free(rd), free(sb);
    return 1;
}

int main(void) {
    static const fuzz_entry ops[] = {{11, fuzz_gq}};
    return fuzz_main(ops, (int)(sizeof ops / sizeof ops[0]));
}
