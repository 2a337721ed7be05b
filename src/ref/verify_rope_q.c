/*
 * verify_rope_q.c — mlaf_verify_rope_q: a case on the context's backend, the op, and every
 * head's rotated rope part against the float64 oracle (ref_norm.c); the nope columns and the
 * heads of rejected positions must stay as they were. How buffers are judged: verify_case.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "verify_case.h"

#define ROPE_CHUNK 16

typedef struct rope_arg {
    const mlaf_verify_case *c;
    const vbuf *q_b, *pos_b;
    const float *cs_host;
    int64_t cs_stride;
    const int64_t *pos;
    int32_t R;
    int64_t H, D, s0, s1;
} rope_arg;

/* Tokens [t0, t0 + n): every head's rotated rope part; *errors counts rejected positions. */
static void rope_chunk(const void *arg, void *scratch, int64_t t0, int64_t n, judge *j,
                       int64_t *errors) {
    const rope_arg *a = (const rope_arg *)arg;
    const mlaf_verify_case *c = a->c;
    const mlaf_dtype dt = c->dtype;
    const size_t es = mlaf_dtype_size(dt);
    const int32_t R = a->R;
    const int64_t H = a->H, D = a->D, s0 = a->s0, s1 = a->s1;
    double *qref = (double *)scratch, *allow = qref + ROPE_CHUNK * H * D;
    int8_t *status = (int8_t *)(allow + (size_t)R * 2);
    mlaf_rope_q_job hj;
    memset(&hj, 0, sizeof hj);
    hj.rope.R = R;
    hj.rope.style = c->rope_style;
    hj.rope.positions = a->pos_b->init + (size_t)t0 * mlaf_dtype_size(c->index_dtype);
    hj.rope.pos_dt = c->index_dtype;
    hj.rope.cos_sin = a->cs_host;
    hj.rope.cos_sin_stride = a->cs_stride;
    hj.rope.max_pos = VERIFY_MAX_POS;
    hj.T = n;
    hj.H = H;
    hj.D = (int32_t)D;
    hj.q = a->q_b->init + (size_t)(t0 * s0) * es;
    hj.dt = dt;
    hj.s0 = s0;
    hj.s1 = s1;
    mlaf_ref_rope_q(&hj, qref, status);
    for (int64_t u = 0; u < n; u++) {
        int64_t t = t0 + u;
        if (status[u] < 0) {
            ++*errors;
            continue; /* unrotated: every byte must be unchanged */
        }
        for (int64_t h = 0; h < H; h++) {
            const char *head = (const char *)a->q_b->init + (size_t)(t * s0 + h * s1) * es;
            const double *rotated = qref + (u * H + h) * D + (D - R);
            double *xin = allow + R;
            for (int32_t i = 0; i < R; i++) xin[i] = mlaf_load_f32(head, dt, D - R + i);
            rope_allowance(xin, R, c->rope_style, a->cs_host + a->pos[t] * a->cs_stride, allow);
            vview v = {(vbuf *)a->q_b, dt, h * s1 + (D - R), s0};
            for (int32_t i = 0; i < R; i++) judge_value(j, &v, "q(rope part)", t, i, rotated[i], allow[i]);
        }
    }
}

mlaf_status mlaf_verify_rope_q(mlaf_context *ctx, const mlaf_verify_case *c, mlaf_verify_result *r) {
    memset(r, 0, sizeof *r);
    const int32_t R = c->cfg.qk_rope_head_dim;
    const int64_t H = c->cfg.num_heads, D = (int64_t)c->cfg.qk_nope_head_dim + R, T = c->T;
    if (R <= 0 || H < 1 || c->cfg.qk_nope_head_dim < 0 || T < 0) return MLAF_ERR_INVALID_ARGUMENT;
    const mlaf_backend be = mlaf_context_backend(ctx);
    const int st = c->strided != 0;
    const mlaf_dtype dt = c->dtype;
    const size_t es = mlaf_dtype_size(dt);
    mlaf_rng rng;
    mlaf_rng_seed(&rng, c->seed);
    vbuf q_b, pos_b, cs_b, ec_b;
    memset(&q_b, 0, sizeof q_b);
    memset(&pos_b, 0, sizeof pos_b);
    memset(&cs_b, 0, sizeof cs_b);
    memset(&ec_b, 0, sizeof ec_b);
    int64_t *pos = NULL;
    void *img = NULL;
    mlaf_status s;
    const int64_t s1 = D + (st ? 3 : 0), s0 = H * s1 + (st ? 5 : 0);
    const int64_t cs_stride = R + (st ? 3 : 0);
    size_t qbytes = (size_t)(T * s0) * es;
    img = malloc(qbytes ? qbytes : 1);
    pos = (int64_t *)malloc(sizeof(int64_t) * (size_t)(T + 1));
    if (!img || !pos) {
        s = MLAF_ERR_OUT_OF_MEMORY;
        goto done;
    }
    fill_fast_normal_par(&rng, img, dt, T * s0, 0.0, 1.0);
    if ((s = vbuf_alloc(&q_b, "q", be, qbytes, img, st ? 3 * es : 0)) != MLAF_OK) goto done;
    make_positions(&rng, pos, T, VERIFY_MAX_POS);
    if ((s = index_buf(&pos_b, "positions", be, pos, T, c->index_dtype, st)) != MLAF_OK) goto done;
    if ((s = cos_sin_buf(&cs_b, be, R, cs_stride, st)) != MLAF_OK) goto done;
    if ((s = error_count_buf(&ec_b, be)) != MLAF_OK) goto done;

    mlaf_rope_params p = {R, c->rope_style};
    mlaf_tensor tq = mlaf_tensor_3d(q_b.g.ptr, dt, T, H, D, s0, s1);
    mlaf_tensor tpos = mlaf_tensor_1d(pos_b.g.ptr, c->index_dtype, T);
    mlaf_tensor tcs = mlaf_tensor_2d(cs_b.g.ptr, MLAF_F32, VERIFY_MAX_POS, R, cs_stride);
    mlaf_tensor tec = mlaf_tensor_1d(ec_b.g.ptr, MLAF_I32, 1);
    s = mlaf_rope_q(ctx, &p, &tq, &tpos, &tcs, &tec);
    if (s != MLAF_OK) {
        snprintf(r->detail, sizeof r->detail, "mlaf_rope_q: %s: %s", mlaf_status_name(s),
                 mlaf_context_last_error(ctx));
        goto done;
    }
    if ((s = mlaf_context_sync(ctx)) != MLAF_OK) goto done;
    vbuf *all[4] = {&q_b, &pos_b, &cs_b, &ec_b};
    if ((s = fetch_all(all, 4)) != MLAF_OK) goto done;
    {
        const vview v = {&q_b, dt, D - R, s0};
        corrupt_outputs(c, &v);
    }

    judge j = {r, 0, 0.0, 0};
    const rope_arg ra = {c, &q_b, &pos_b, (const float *)cs_b.init, cs_stride, pos, R, H, D, s0, s1};
    int64_t errors = 0;
    const size_t scratch =
        sizeof(double) * ((size_t)(ROPE_CHUNK * H * D) + (size_t)R * 2) + ROPE_CHUNK;
    if ((s = run_chunks(T, ROPE_CHUNK, scratch, rope_chunk, &ra, &j, &errors)) != MLAF_OK) goto done;
    if (!j.failed) judge_error_count(&j, &ec_b, errors);
    int64_t untouched = 0;
    for (int i = 0; i < 4; i++) untouched += judge_untouched(&j, all[i]);
    judge_finish(&j, "rope_q", c, untouched);
done:
    free(img);
    free(pos);
    vbuf_free(&q_b);
    vbuf_free(&pos_b);
    vbuf_free(&cs_b);
    vbuf_free(&ec_b);
    return s;
}
