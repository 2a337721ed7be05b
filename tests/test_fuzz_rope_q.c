/*
 * test_fuzz_rope_q.c — random calls of mlaf_rope_q, and of mlaf_rope_q_out (with head_norm), judged as the
 * newer entry points are (fuzz_common.c).
 * The driver, the harness and what every call must satisfy: fuzz_common.h.
 */
#include "fuzz_common.h"

/* ---- rope_q ------------------------------------------------------------------------------ */
typedef struct rope_case {
    mlaf_rope_params p;
} rope_case;

static int rope_params_mutate(fz *f, void *vp) {
    rope_case *c = (rope_case *)vp;
    switch (U(&f->r, 3)) {
    case 0: c->p.rope_dim = CHANCE(&f->r, 0.5) ? -2 * (int32_t)U(&f->r, 3) : c->p.rope_dim + 1; break;
    case 1: c->p.rope_dim += 2 * (int32_t)RANGE(&f->r, 1, 3); break;
    default: c->p.style = (mlaf_rope_style)(CHANCE(&f->r, 0.5) ? -1 : RANGE(&f->r, 3, 9)); break;
    }
    note(f, " rope_dim=%d style=%d", c->p.rope_dim, (int)c->p.style);
    return 1;
}

static int fuzz_rope(fz *f) {
    mlaf_rng *r = &f->r;
    set_state(f);
    rope_case rc;
    const int32_t R = 2 * (int32_t)RANGE(r, 1, 16), nope = CHANCE(r, 0.2) ? 0 : (int32_t)RANGE(r, 1, 40), D = nope + R;
    rc.p = (mlaf_rope_params){R, CHANCE(r, 0.5) ? MLAF_ROPE_INTERLEAVED : MLAF_ROPE_NEOX};
    const int64_t T = draw_T(r), H = CHANCE(r, 0.04) ? 0 : RANGE(r, 1, 6), max_pos = RANGE(r, 1, 40);
    const mlaf_dtype dt = FLOAT_DT(r);
    fz_t q, pos, cs, ec;
    memset(&ec, 0, sizeof ec);
    if (CHANCE(r, 0.25) && T > 1) { /* heads outermost: [H, T] storage */
        int64_t s0 = D + RANGE(r, 0, 4), s1 = T * s0 + RANGE(r, 0, 4), sh[3] = {T, H, D}, st[3] = {s0, s1, 1};
        fz_tensor(f, &q, "q", dt, 3, sh, st, 1, CHANCE(r, 0.2) ? 50.0 : 1.0, DT_FLOATS, 1u, 1, 1);
    } else {
        int64_t s1 = D + (CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 4)), s0 = H * s1 + (CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 9));
        int64_t sh[3] = {T, H, D}, st[3] = {s0, s1, 1};
        fz_tensor(f, &q, "q", dt, 3, sh, st, 1, CHANCE(r, 0.2) ? 50.0 : 1.0, DT_FLOATS, 1u, 1, 1);
    }
    fz_1d(f, &pos, "positions", INDEX_DT(r), T, 0, 0, DT_INDEX, 1u, 1, 0);
    fz_2d(f, &cs, "cos_sin", MLAF_F32, max_pos, R, RANGE(r, 0, 4), 1, 1.0, DTM(MLAF_F32), 2u, 1, 0);
    if (CHANCE(r, 0.7)) {
        float *tab = (float *)malloc(sizeof(float) * (size_t)(max_pos * R));
        mlaf_rope_table_init(tab, max_pos, R, 10000.0);
        for (int64_t p = 0; p < max_pos; p++)
            memcpy(f->b[cs.buf].init + cs.boff + p * cs.t.stride[0] * 4, tab + p * R, sizeof(float) * (size_t)R);
        free(tab);
    }
    if (CHANCE(r, 0.7)) {
        fz_1d(f, &ec, "error_count", MLAF_I32, 1, 0, 0, DTM(MLAF_I32), 1u, 0, 1);
        int32_t start = (int32_t)U(r, 1000);
        memcpy(f->b[ec.buf].init + ec.boff, &start, 4);
    }
    for (int64_t t = 0; t < T; t++) {
        int64_t p = CHANCE(r, 0.1) ? (CHANCE(r, 0.5) ? -RANGE(r, 1, 3) : max_pos + (int64_t)U(r, 3)) : (int64_t)U(r, (uint64_t)max_pos);
        if (pos.t.dtype == MLAF_I32) { int32_t v = (int32_t)p; memcpy(f->b[pos.buf].init + pos.boff + 4 * t, &v, 4); }
        else memcpy(f->b[pos.buf].init + pos.boff + 8 * t, &p, 8);
    }
    /* The head dim must hold the rope part: a narrower one is a forbidden mutation here. */
    if (CHANCE(r, 0.03)) {
        q.t.shape[2] = R - 1 - (int64_t)U(r, (uint64_t)R);
        note(f, " q.shape[2]=%lld < rope_dim", (long long)q.t.shape[2]);
        f->must_fail = f->mutated = 1;
    }
    mutate(f, rope_params_mutate, &rc, NULL, 0, 0);
    if (!fz_commit(f)) return -1;
    mlaf_status st = mlaf_rope_q(f->ctx, &rc.p, DEV(f, &q), DEV(f, &pos), DEV(f, &cs), DEV(f, &ec));
    if (!judge_status(f, st)) return st == MLAF_OK;
    mlaf_rope_q_job j;
    mlaf_status hs = mlaf_check_rope_q(f->host, &rc.p, HOST(f, &q), HOST(f, &pos), HOST(f, &cs), HOST(f, &ec), &j);
    if (hs != MLAF_OK) {
        fail(f, "the device call passed but the same views over host memory gave %s: %s", mlaf_status_name(hs),
             mlaf_context_last_error(f->host));
        return 1;
    }
    int64_t bad = 0;
    float xin[64], xr[64];
    const size_t es = mlaf_dtype_size(j.dt);
    for (int64_t t = 0; t < j.T && j.H > 0 && !f->failed; t++) { /* H = 0: a no-op (header) */
        int64_t p = mlaf_load_index(j.rope.positions, j.rope.pos_dt, t);
        if (p < 0 || p >= j.rope.max_pos) {
            bad++; /* left unrotated: unclaimed, so it must be unchanged */
            continue;
        }
        for (int64_t h = 0; h < j.H; h++) {
            const unsigned char *head = (const unsigned char *)j.q + (t * j.s0 + h * j.s1) * (int64_t)es;
            for (int32_t i = 0; i < j.rope.R; i++) xin[i] = mlaf_load_f32(head, j.dt, j.D - j.rope.R + i);
            rope_f32(xin, j.rope.R, j.rope.style, j.rope.cos_sin + p * j.rope.cos_sin_stride, xr);
            for (int32_t i = 0; i < j.rope.R; i++)
                check_exact(f, &q, t * j.s0 + h * j.s1 + j.D - j.rope.R + i, xr[i], "q", t, h * j.D + j.D - j.rope.R + i);
        }
    }
    check_count(f, &ec, bad);
    check_untouched(f);
    return 1;
}


/* -- rope_q_out and rope_q's head_norm -- */
typedef struct ropeout_case {
    mlaf_rope_params p;
} ropeout_case;

static int ropeout_params_mutate(fz *f, void *vp) {
    ropeout_case *c = (ropeout_case *)vp;
    switch (U(&f->r, 3)) {
    case 0:
        c->p.rope_dim = CHANCE(&f->r, 0.5) ? -(int32_t)U(&f->r, 3) : c->p.rope_dim + 1;
        note(f, " rope_dim=%d", c->p.rope_dim);
        return 1;
    case 1:
        c->p.style = (mlaf_rope_style)(CHANCE(&f->r, 0.5) ? -1 : RANGE(&f->r, 3, 7));
        note(f, " style=%d", (int)c->p.style);
        return 1;
    default: {
        static const float bad[4] = {-1e-6f, NAN, INFINITY, -INFINITY};
        c->p.head_norm = 1;
        c->p.head_norm_eps = bad[U(&f->r, 4)];
        note(f, " head_norm=1 head_norm_eps=%g", (double)c->p.head_norm_eps);
        return 1;
    }
    }
}

static int fuzz_ropeout(fz *f) {
    mlaf_rng *r = &f->r;
    set_state(f);
    ropeout_case rc;
    const int32_t R = 2 * (int32_t)RANGE(r, 1, 16), nope = CHANCE(r, 0.2) ? 0 : (int32_t)RANGE(r, 1, 40), D = nope + R;
    static const float eps[4] = {0.0f, 1e-6f, 1e-3f, 1e-12f};
    rc.p = (mlaf_rope_params){R, CHANCE(r, 0.5) ? MLAF_ROPE_INTERLEAVED : MLAF_ROPE_NEOX, CHANCE(r, 0.5), eps[U(r, 4)]};
    const int64_t T = draw_T(r), H = CHANCE(r, 0.05) ? 0 : RANGE(r, 1, 6), max_pos = RANGE(r, 1, 40);
    const int64_t Hpad = H + (CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 3));
    const int has_out = CHANCE(r, 0.7);
    const mlaf_dtype dt = FLOAT_DT(r);
    fz_t q, pos, cs, qo, ec;
    memset(&qo, 0, sizeof qo), memset(&ec, 0, sizeof ec);
    int64_t s1 = D + (CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 4)), s0 = H * s1 + (CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 9));
    int64_t sh[3] = {T, H, D}, st[3] = {s0, s1, 1};
    fz_tensor(f, &q, "q", dt, 3, sh, st, 1, CHANCE(r, 0.2) ? 50.0 : 1.0, DT_FLOATS, 0u, 1, !has_out);
    fz_1d(f, &pos, "positions", INDEX_DT(r), T, 0, 0, DT_INDEX, 1u, 1, 0);
    fz_2d(f, &cs, "cos_sin", MLAF_F32, max_pos, R, RANGE(r, 0, 4), 1, 1.0, DTM(MLAF_F32), 2u, 1, 0);
    fill_table(f, &cs, max_pos, R);
    if (has_out) {
        int64_t o1 = D + (CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 4)), o0 = Hpad * o1 + (CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 9));
        int64_t osh[3] = {T, Hpad, D}, ost[3] = {o0, o1, 1};
        fz_tensor(f, &qo, "q_out", dt, 3, osh, ost, 0, 0, DTM(dt), 5u, 0, 1);
    }
    if (CHANCE(r, 0.7)) add_error_count(f, &ec);
    fill_positions(f, &pos, T, max_pos);
    mutate(f, ropeout_params_mutate, &rc, NULL, 0, 0);
    if (!fz_commit(f)) return -1;
    mlaf_status s = mlaf_rope_q_out(f->ctx, &rc.p, DEV(f, &q), DEV(f, &pos), DEV(f, &cs), DEV(f, &qo), DEV(f, &ec));
    if (!judge_new(f, s)) return s == MLAF_OK;
    int64_t bad = 0;
    const fz_t *dst = has_out ? &qo : &q;
    const size_t es = mlaf_dtype_size(dt);
    for (int64_t t = 0; t < T; t++) {
        int isbad;
        bad_positions(f, &pos, T, max_pos, t, &isbad);
        if (isbad) {
            bad++; /* nothing of the token written: its row unclaimed */
            continue;
        }
        claim_rows(f, dst, t, t + 1);
        for (int64_t h = H; h < Hpad && has_out; h++)
            for (int32_t i = 0; i < D; i++) {
                const unsigned char *v = body(f, qo.buf) + at_byte(&qo, t * qo.t.stride[0] + h * qo.t.stride[1] + i);
                for (size_t k = 0; k < es; k++)
                    if (v[k]) {
                        fail(f, "q_out[%lld, %lld, %d]: a padding head value is not +0.0", (long long)t, (long long)h, i);
                        k = es, i = D, h = Hpad;
                    }
            }
    }
    check_count(f, &ec, H == 0 && (!has_out || Hpad == 0) ? 0 : bad); /* H = 0 and no padding heads: a no-op, nothing counted */
    check_untouched(f);
    return 1;
}

int main(void) {
    static const fuzz_entry ops[] = {{2, fuzz_rope}, {5, fuzz_ropeout}};
    return fuzz_main(ops, (int)(sizeof ops / sizeof ops[0]));
}
