/*
 * verify_rope_q.c — mlaf_verify_rope_q: a case on the context's backend, the op, and every
 * head's rotated rope part against the float64 oracle (ref_norm.c); the nope columns and the
 * heads of rejected positions must stay as they were. How buffers are judged: verify_case.h.
 *
 * DeepSeek-V4's forms (docs/mla.md, head_norm; the case's head_norm, q_out_heads): with head_norm
 * every value of a head is judged (normalized; the rope part's allowance doubled for the fp32
 * normalization's rounding of its inputs); with q_out_heads the result goes to
 * q_out [T, q_out_heads, D] (mlaf_rope_q_out), whose padding heads must be +0.0 bit for bit,
 * and q must stay as it was.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "verify_case.h"

#define ROPE_CHUNK 16

typedef struct rope_arg {
    const mlaf_verify_case *c;
    const vbuf *q_b, *pos_b, *o_b; /* o_b: q_out, or NULL (in place) */
    const float *cs_host;
    int64_t cs_stride;
    const int64_t *pos;
    int32_t R;
    int64_t H, D, s0, s1;
    int64_t HP, o0, o1;            /* q_out's heads and strides */
} rope_arg;

/* Tokens [t0, t0 + n): every head's rotated rope part; *errors counts rejected positions. */
static void rope_chunk(const void *arg, void *scratch, int64_t t0, int64_t n, judge *j,
                       int64_t *errors) {
    const rope_arg *a = (const rope_arg *)arg;
    const mlaf_verify_case *c = a->c;
    const mlaf_dtype dt = c->dtype;
    const size_t es = mlaf_dtype_size(dt);
    const int32_t R = a->R;
    const int64_t H = a->H, D = a->D, s0 = a->s0, s1 = a->s1, HP = a->o_b ? a->HP : H;
    double *qref = (double *)scratch, *allow = qref + ROPE_CHUNK * HP * D;
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
    hj.head_norm = c->head_norm;
    hj.head_eps = c->cfg.rms_norm_eps;
    hj.q_out = a->o_b ? (void *)1 : NULL; /* the oracle only asks whether */
    hj.Hpad = HP;
    mlaf_ref_rope_q(&hj, qref, status);
    for (int64_t u = 0; u < n; u++) {
        int64_t t = t0 + u;
        if (status[u] < 0) {
            ++*errors;
            continue; /* unrotated: every byte must be unchanged */
        }
        for (int64_t h = 0; h < H; h++) {
            const char *head = (const char *)a->q_b->init + (size_t)(t * s0 + h * s1) * es;
            const double *ref = qref + (u * HP + h) * D;
            const double *rotated = ref + (D - R);
            double *xin = allow + R, rstd = 1.0;
            if (c->head_norm) {
                double ss = 0.0;
                for (int64_t i = 0; i < D; i++) ss += (double)mlaf_load_f32(head, dt, i) * mlaf_load_f32(head, dt, i);
                rstd = 1.0 / sqrt(ss / (double)D + (double)c->cfg.rms_norm_eps);
            }
            for (int32_t i = 0; i < R; i++) xin[i] = mlaf_load_f32(head, dt, D - R + i) * rstd;
            rope_allowance(xin, R, c->rope_style, c->rope_style == MLAF_ROPE_NONE ? NULL : a->cs_host + a->pos[t] * a->cs_stride, allow);
            if (c->head_norm)
                for (int32_t i = 0; i < R; i++) allow[i] *= 2.0;
            vview v = a->o_b ? (vview){(vbuf *)a->o_b, dt, h * a->o1, a->o0} : (vview){(vbuf *)a->q_b, dt, h * s1, s0};
            if (c->head_norm || a->o_b)
                for (int64_t i = 0; i < D - R; i++) judge_value(j, &v, "q(nope part)", t, i, ref[i], 0);
            for (int32_t i = 0; i < R; i++)
                judge_value(j, &v, a->o_b ? "q_out(rope part)" : "q(rope part)", t, D - R + i, rotated[i], allow[i]);
        }
        for (int64_t h = H; h < HP; h++) { /* q_out's padding heads: +0.0, every byte zero */
            const size_t at = (size_t)((t * a->o0 + h * a->o1) * (int64_t)es);
            const unsigned char *p = (const unsigned char *)a->o_b->g.body + at;
            memset(a->o_b->claimed + at, 1, (size_t)D * es);
            j->values += D;
            for (size_t k = 0; k < (size_t)D * es; k++)
                if (p[k] != 0) {
                    judge_fail(j, "q_out(padding head %lld)[t=%lld]: byte %lld = 0x%02x, expected +0.0 (all zero bytes)",
                               (long long)h, (long long)t, (long long)k, p[k]);
                    break;
                }
        }
    }
}

mlaf_status mlaf_verify_rope_q(mlaf_context *ctx, const mlaf_verify_case *c, mlaf_verify_result *r) {
    memset(r, 0, sizeof *r);
    /* a model whose rope lives inside the kv part (V4) gives its q heads the same rope width */
    const int32_t R = c->cfg.qk_rope_head_dim > 0 ? c->cfg.qk_rope_head_dim : c->kv_rope_tail;
    const int64_t H = c->cfg.num_heads, D = (int64_t)c->cfg.qk_nope_head_dim + R, T = c->T;
    const int64_t HP = c->q_out_heads > 0 ? c->q_out_heads : H;
    if (R <= 0 || H < 1 || c->cfg.qk_nope_head_dim < 0 || T < 0 || HP < H) return MLAF_ERR_INVALID_ARGUMENT;
    const int out = c->q_out_heads > 0;
    const mlaf_backend be = mlaf_context_backend(ctx);
    const int st = c->strided != 0;
    const mlaf_dtype dt = c->dtype;
    const size_t es = mlaf_dtype_size(dt);
    mlaf_rng rng;
    mlaf_rng_seed(&rng, c->seed);
    vbuf q_b, pos_b, cs_b, ec_b, o_b;
    memset(&o_b, 0, sizeof o_b);
    memset(&q_b, 0, sizeof q_b);
    memset(&pos_b, 0, sizeof pos_b);
    memset(&cs_b, 0, sizeof cs_b);
    memset(&ec_b, 0, sizeof ec_b);
    int64_t *pos = NULL;
    void *img = NULL;
    mlaf_status s;
    const int64_t s1 = D + (st ? 3 : 0), s0 = H * s1 + (st ? 5 : 0);
    const int64_t cs_stride = R + (st ? 3 : 0);
    const int64_t o1 = D + (st ? 5 : 0), o0 = HP * o1 + (st ? 3 : 0);
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
    if (out && (s = vbuf_alloc(&o_b, "q_out", be, (size_t)(T * o0) * es, NULL, st ? es : 0)) != MLAF_OK) goto done;

    mlaf_rope_params p = {R, c->rope_style, c->head_norm, c->cfg.rms_norm_eps};
    mlaf_tensor tq = mlaf_tensor_3d(q_b.g.ptr, dt, T, H, D, s0, s1);
    mlaf_tensor tpos = mlaf_tensor_1d(pos_b.g.ptr, c->index_dtype, T);
    mlaf_tensor tcs = mlaf_tensor_2d(cs_b.g.ptr, MLAF_F32, VERIFY_MAX_POS, R, cs_stride);
    mlaf_tensor tec = mlaf_tensor_1d(ec_b.g.ptr, MLAF_I32, 1);
    mlaf_tensor to = mlaf_tensor_3d(o_b.g.ptr, dt, T, HP, D, o0, o1);
    s = out ? mlaf_rope_q_out(ctx, &p, &tq, &tpos, &tcs, &to, &tec) : mlaf_rope_q(ctx, &p, &tq, &tpos, &tcs, &tec);
    if (s != MLAF_OK) {
        snprintf(r->detail, sizeof r->detail, "%s: %s: %s", out ? "mlaf_rope_q_out" : "mlaf_rope_q", mlaf_status_name(s),
                 mlaf_context_last_error(ctx));
        goto done;
    }
    if ((s = mlaf_context_sync(ctx)) != MLAF_OK) goto done;
    vbuf *all[5] = {&q_b, &pos_b, &cs_b, &ec_b, &o_b};
    if ((s = fetch_all(all, 5)) != MLAF_OK) goto done;
    {
        const vview v = out ? (vview){&o_b, dt, D - R, o0} : (vview){&q_b, dt, D - R, s0};
        corrupt_outputs(c, &v);
    }

    judge j = {r, 0, 0.0, 0};
    const rope_arg ra = {c, &q_b, &pos_b, out ? &o_b : NULL, (const float *)cs_b.init, cs_stride, pos, R, H, D, s0, s1,
                         HP, o0, o1};
    int64_t errors = 0;
    const size_t scratch =
        sizeof(double) * ((size_t)(ROPE_CHUNK * HP * D) + (size_t)R * 2) + ROPE_CHUNK;
    if ((s = run_chunks(T, ROPE_CHUNK, scratch, rope_chunk, &ra, &j, &errors)) != MLAF_OK) goto done;
    if (!j.failed) judge_error_count(&j, &ec_b, errors);
    int64_t untouched = 0;
    for (int i = 0; i < 5; i++) untouched += judge_untouched(&j, all[i]);
    judge_finish(&j, "rope_q", c, untouched);
done:
    free(img);
    free(pos);
    vbuf_free(&q_b);
    vbuf_free(&pos_b);
    vbuf_free(&cs_b);
    vbuf_free(&ec_b);
    vbuf_free(&o_b);
    return s;
}
