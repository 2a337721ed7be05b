/*
 * verify_judge.c — the judge of the op verifiers (verify_case.h): buffers that remember what
 * was uploaded and which bytes a check claimed, the verdict on values, untouched bytes, guards
 * and the error count, and the chunk loop that runs a check on all threads.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../gemm_format.h"
#include "verify_case.h"

/* ---- buffers with an initial image and a claim mask ------------------------------------ */
mlaf_status vbuf_alloc(vbuf *b, const char *name, mlaf_backend be, size_t bytes,
                       const void *init, size_t misalign) {
    memset(b, 0, sizeof *b);
    b->name = name;
    b->bytes = bytes;
    b->init = (unsigned char *)malloc(bytes ? bytes : 1);
    if (!b->init) return MLAF_ERR_OUT_OF_MEMORY;
    if (init)
        memcpy(b->init, init, bytes);
    else
        memset(b->init, 0xFF, bytes);
    mlaf_status st = mlaf_gbuf_alloc(&b->g, be, bytes, b->init, misalign);
    if (st != MLAF_OK) {
        free(b->init);
        b->init = NULL;
        return st;
    }
    b->live = 1;
    return MLAF_OK;
}

void vbuf_free(vbuf *b) {
    if (b->live) mlaf_gbuf_free(&b->g);
    free(b->init);
    free(b->claimed);
    memset(b, 0, sizeof *b);
}

mlaf_status vbuf_fetch(vbuf *b) {
    if (!b->live) return MLAF_OK;
    b->claimed = (unsigned char *)calloc(b->bytes ? b->bytes : 1, 1);
    if (!b->claimed) return MLAF_ERR_OUT_OF_MEMORY;
    return mlaf_gbuf_download(&b->g);
}

mlaf_status fetch_all(vbuf **bufs, int n) {
    for (int i = 0; i < n; i++) {
        mlaf_status s = vbuf_fetch(bufs[i]);
        if (s != MLAF_OK) return s;
    }
    return MLAF_OK;
}

/* ---- the judge ------------------------------------------------------------------------- */

void judge_fail(judge *j, const char *fmt, ...) {
    if (j->failed++) return; /* keep the first failure */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->r->detail, sizeof j->r->detail, fmt, ap);
    va_end(ap);
}

/* Every unclaimed byte equals its initial value; guards intact. */
int64_t judge_untouched(judge *j, const vbuf *b) {
    if (!b->live) return 0;
    if (!mlaf_gbuf_guards_ok(&b->g)) judge_fail(j, "%s: guard zone around the buffer was written", b->name);
    const unsigned char *got = (const unsigned char *)b->g.body;
    const int64_t nb = (int64_t)b->bytes;
    int64_t kept = 0, first = nb; /* the lowest changed byte, on all threads */
#ifdef _OPENMP
#pragma omp parallel for schedule(static) reduction(+ : kept) reduction(min : first)
#endif
    for (int64_t k = 0; k < nb; k++) {
        if (b->claimed[k]) continue;
        kept++;
        if (got[k] != b->init[k] && k < first) first = k;
    }
    if (first < nb)
        judge_fail(j, "%s: byte %lld changed (0x%02x -> 0x%02x) where nothing may be written "
                   "(input, padding, unnamed cache row or rejected token)",
                   b->name, (long long)first, b->init[first], got[first]);
    return kept;
}

void judge_finish(judge *j, const char *op, const mlaf_verify_case *c, int64_t extra) {
    mlaf_verify_result *r = j->r;
    r->worst_units = j->worst;
    r->passed = j->failed == 0 && j->worst <= 1.0;
    if (r->passed)
        snprintf(r->detail, sizeof r->detail,
                 "%s T=%lld: %lld values within %.3f units, %lld bytes untouched as required",
                 op, (long long)c->T, (long long)j->values, j->worst, (long long)extra);
}

void judge_error_count(judge *j, vbuf *b, int64_t expected_errors) {
    int32_t got;
    memcpy(&got, b->g.body, sizeof got);
    memset(b->claimed, 1, sizeof got);
    if ((int64_t)got != 3 + expected_errors)
        judge_fail(j, "error_count: got %d (started at 3), expected 3 + %lld rejected tokens",
                   (int)got, (long long)expected_errors);
}

/* The case's corrupt_from (the harness's own test): element (t, 0) of v raised by 1 for
 * t = corrupt_from - 1, then every 500th token. */
void corrupt_outputs(const mlaf_verify_case *c, const vview *v) {
    if (c->corrupt_from <= 0 || !v->b || !v->b->live) return;
    for (int64_t t = c->corrupt_from - 1; t < c->T; t += 500) {
        const int64_t at = v->off + t * v->stride;
        mlaf_store_f32(v->b->g.body, v->dt, at, (float)(mlaf_load_f32(v->b->g.body, v->dt, at) + 1.0));
    }
}

/* Absolute fp32 rounding allowance for each rotated value (see verify_case.h). */
void rope_allowance(const double *x, int32_t R, mlaf_rope_style style, const float *cs,
                    double *allow) {
    int32_t h = R / 2;
    if (style == MLAF_ROPE_NONE) { /* nothing computed: the values as read (cs not read) */
        for (int32_t i = 0; i < R; i++) allow[i] = 0.0;
        return;
    }
    for (int32_t i = 0; i < h; i++) {
        int32_t a = style == MLAF_ROPE_NEOX ? i : 2 * i;
        int32_t b = style == MLAF_ROPE_NEOX ? i + h : 2 * i + 1;
        double c = fabs((double)cs[i]), s = fabs((double)cs[h + i]);
        allow[a] = ldexp(fabs(x[a]) * c + fabs(x[b]) * s, -23);
        allow[b] = ldexp(fabs(x[b]) * c + fabs(x[a]) * s, -23);
    }
}

/* The step between the two values of dt an implementation's fp32 result near x may round to:
 * 0 unless x is within 2^-16 (relative) of a rounding boundary of dt. */
static double neighbour_step(double x, mlaf_dtype dt) {
    if (dt == MLAF_F32) return 0.0;
    return fabs(mlaf_round_to(x * (1.0 + 0x1p-16), dt) - mlaf_round_to(x * (1.0 - 0x1p-16), dt));
}

void tail_allowance(const double *raw, int32_t r, mlaf_dtype dt, const float *cs, double *allow) {
    for (int32_t i = 0; i < r / 2; i++) {
        const double x0 = mlaf_round_to(raw[2 * i], dt), x1 = mlaf_round_to(raw[2 * i + 1], dt);
        const double c = fabs((double)cs[i]), s = fabs((double)cs[r / 2 + i]);
        const double d0 = neighbour_step(raw[2 * i], dt), d1 = neighbour_step(raw[2 * i + 1], dt);
        const int e = dt == MLAF_F32 ? -20 : -23;
        allow[2 * i] = ldexp(fabs(x0) * c + fabs(x1) * s, e) + d0 * c + d1 * s;
        allow[2 * i + 1] = ldexp(fabs(x1) * c + fabs(x0) * s, e) + d1 * c + d0 * s;
    }
}

/* ---- the chunk loops, on all threads (see verify_case.h) ------------------------------- */

typedef struct chunk_job {
    int64_t T, chunk;
    chunk_body body;
    const void *arg;
} chunk_job;

static void chunk_item(const void *arg, void *scratch, int64_t k, mlaf_item_out *out) {
    const chunk_job *cj = (const chunk_job *)arg;
    mlaf_verify_result tr;
    judge jc = {&tr, 0, 0.0, 0};
    const int64_t t0 = k * cj->chunk, n = cj->T - t0 < cj->chunk ? cj->T - t0 : cj->chunk;
    cj->body(cj->arg, scratch, t0, n, &jc, &out->errors);
    out->worst = jc.worst;
    out->values = jc.values;
    out->failed = jc.failed;
    if (jc.failed) memcpy(out->why, tr.detail, sizeof out->why);
}

mlaf_status run_chunks(int64_t T, int64_t chunk, size_t scratch_bytes, chunk_body body,
                       const void *arg, judge *j, int64_t *errors) {
    const chunk_job cj = {T, chunk, body, arg};
    mlaf_item_out tot;
    mlaf_status s = mlaf_run_items((T + chunk - 1) / chunk, scratch_bytes, chunk_item, &cj, &tot);
    if (s != MLAF_OK) return s;
    if (tot.worst > j->worst) j->worst = tot.worst;
    j->values += tot.values;
    j->failed += tot.failed;
    *errors += tot.errors;
    if (tot.failed) memcpy(j->r->detail, tot.why, sizeof j->r->detail);
    return MLAF_OK;
}

void judge_gemm_row(judge *j, const vbuf *qd, const vbuf *qs, int64_t DS, int64_t ld, mlaf_dtype sdt,
                    mlaf_gemm_format f, int64_t t, int64_t K, const float *row, const uint8_t *rd, const float *sf,
                    const uint8_t *sb, const char *what) {
    const int32_t g = mlaf_gemm_format_group(f);
    const int64_t G = K / g;
    const uint8_t *d = (const uint8_t *)qd->g.body + t * DS;
    memset(qd->claimed + t * DS, 1, (size_t)K);
    for (int64_t i = 0; i < K; i++) {
        if (d[i] != rd[i]) {
            judge_fail(j, "q.data[t=%lld,i=%lld] = 0x%02x, expected 0x%02x (the encoder's byte of %s %.9g, scale %.9g)",
                       (long long)t, (long long)i, d[i], rd[i], what, (double)row[i], (double)sf[i / g]);
            break;
        }
        double ratio;
        if (mlaf_ref_fp8_decode_check(d[i], row[i], sf[i / g], MLAF_FP8_DIV, &ratio) == 0) {
            judge_fail(j, "q.data[t=%lld,i=%lld] = 0x%02x decodes %.3g half-steps from %.9g", (long long)t, (long long)i,
                       d[i], 2 * ratio, (double)row[i]);
            break;
        }
    }
    j->values += K;
    const uint8_t *sbody = (const uint8_t *)qs->g.body;
    const int f32 = sdt == MLAF_F32;
    const int64_t Gp = sdt == MLAF_I32 ? (G + 3) / 4 * 4 : G; /* the packed layout's zero bytes too */
    for (int64_t k = 0; k < Gp; k++) {
        const int64_t o = mlaf_ref_gemm_scale_offset(f, t, k, ld);
        uint8_t want[4];
        if (f32) memcpy(want, &sf[k], 4);
        else want[0] = k < G ? sb[k] : 0;
        memset(qs->claimed + o, 1, f32 ? 4 : 1);
        if (memcmp(sbody + o, want, f32 ? 4 : 1)) {
            judge_fail(j, "q.scales: group %lld of t=%lld at byte %lld: 0x%02x.., expected 0x%02x.. (%s)", (long long)k,
                       (long long)t, (long long)o, sbody[o], want[0], k < G ? "its scale" : "a zero byte past the last group");
            break;
        }
    }
}
