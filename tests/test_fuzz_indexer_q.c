/*
 * test_fuzz_indexer_q.c — random calls of mlaf_indexer_q, judged as the newer entry points are (fuzz_common.c).
 * The driver, the harness and what every call must satisfy: fuzz_common.h.
 */
#include "fuzz_common.h"


/* -- indexer_q -- */
typedef struct idx_case {
    mlaf_indexer_params ip;
    mlaf_rope_params pr;
    int has_pe;
} idx_case;

static int idx_params_mutate(fz *f, void *vp) {
    idx_case *c = (idx_case *)vp;
    if (c->has_pe && CHANCE(&f->r, 0.4)) {
        if (CHANCE(&f->r, 0.5)) c->pr.rope_dim = CHANCE(&f->r, 0.5) ? 32 : 66;
        else c->pr.style = (mlaf_rope_style)RANGE(&f->r, 2, 4);
        note(f, " q_pe_rope=(%d, %d)", c->pr.rope_dim, (int)c->pr.style);
        return 1;
    }
    return indexer_params_mutate(f, &c->ip);
}

static int fuzz_idxq(fz *f) {
    mlaf_rng *r = &f->r;
    set_state(f);
    idx_case c;
    memset(&c, 0, sizeof c);
    c.ip = draw_ip(r);
    c.pr = (mlaf_rope_params){64, CHANCE(r, 0.5) ? MLAF_ROPE_INTERLEAVED : MLAF_ROPE_NEOX, 0, 0.0f};
    const mlaf_dtype dt = FLOAT_DT(r);
    const int64_t T = draw_T(r) % 9, H = CHANCE(r, 0.05) ? 0 : RANGE(r, 1, 4), max_pos = RANGE(r, 1, 30);
    c.has_pe = CHANCE(r, 0.4);
    fz_t qi, pos, cs, w, qf, wo, pe, ec;
    memset(&pe, 0, sizeof pe), memset(&ec, 0, sizeof ec);
    int64_t s1 = 128 + (CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 4)), s0 = H * s1 + (CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 9));
    int64_t sh[3] = {T, H, 128}, st[3] = {s0, s1, 1};
    fz_tensor(f, &qi, "q_idx", dt, 3, sh, st, 1, 1.0, DT_FLOATS, 4u, 1, 0);
    fz_1d(f, &pos, "positions", INDEX_DT(r), T, 0, 0, DT_INDEX, 1u, 1, 0);
    fz_2d(f, &cs, "cos_sin", MLAF_F32, max_pos, 64, RANGE(r, 0, 4), 1, 1.0, DTM(MLAF_F32), 2u, 1, 0);
    fill_table(f, &cs, max_pos, 64);
    fz_2d(f, &w, "w", CHANCE(r, 0.5) ? dt : MLAF_F32, T, H, RANGE(r, 0, 3), 1, 1.0, DTM(dt) | DTM(MLAF_F32), 3u, 1, 0);
    int64_t f1 = 128 + (CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 8)), f0 = H * f1 + RANGE(r, 0, 8);
    int64_t fsh[3] = {T, H, 128}, fst[3] = {f0, f1, 1};
    fz_tensor(f, &qf, "q_fp8", CHANCE(r, 0.5) ? MLAF_U8 : MLAF_FP8_E4M3, 3, fsh, fst, 0, 0, DTM(MLAF_U8) | DTM(MLAF_FP8_E4M3), 7u, 1, 1);
    fz_2d(f, &wo, "w_out", MLAF_F32, T, H, RANGE(r, 0, 3), 0, 0, DTM(MLAF_F32), 3u, 1, 1);
    if (c.has_pe) {
        const int64_t Hq = RANGE(r, 1, 4), Dq = 64 + (CHANCE(r, 0.3) ? 0 : RANGE(r, 1, 20));
        int64_t p1 = Dq + RANGE(r, 0, 3), p0 = Hq * p1 + RANGE(r, 0, 5), psh[3] = {T, Hq, Dq}, pst[3] = {p0, p1, 1};
        fz_tensor(f, &pe, "q_pe", FLOAT_DT(r), 3, psh, pst, 1, 1.0, DT_FLOATS, 1u, 0, 1);
    }
    if (CHANCE(r, 0.7)) add_error_count(f, &ec);
    fill_positions(f, &pos, T, max_pos);
    mutate(f, idx_params_mutate, &c, NULL, 0, 0);
    if (!fz_commit(f)) return -1;
    mlaf_status s = mlaf_indexer_q(f->ctx, &c.ip, DEV(f, &qi), DEV(f, &pos), DEV(f, &cs), DEV(f, &w), DEV(f, &qf), DEV(f, &wo),
                                   DEV(f, &pe), c.has_pe ? &c.pr : NULL, DEV(f, &ec));
    if (!judge_new(f, s)) return s == MLAF_OK;
    int64_t bad = 0;
    for (int64_t t = 0; t < T; t++) {
        int isbad;
        bad_positions(f, &pos, T, max_pos, t, &isbad);
        if (isbad) {
            bad++; /* q_fp8, w_out, q_pe of the token untouched */
            continue;
        }
        claim_rows(f, &qf, t, t + 1), claim_rows(f, &wo, t, t + 1), claim_rows(f, &pe, t, t + 1);
    }
    check_count(f, &ec, H > 0 || c.has_pe ? bad : 0); /* H = 0 without q_pe: a no-op */
    check_untouched(f);
    return 1;
}

int main(void) {
    static const fuzz_entry ops[] = {{6, fuzz_idxq}};
    return fuzz_main(ops, (int)(sizeof ops / sizeof ops[0]));
}
