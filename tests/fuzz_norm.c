/*
 * fuzz_norm.c — the generator of split_qk_norm and mla_kv_cache calls (fuzz_norm(f, kv)), shared
 * by test_fuzz_split_qk_norm and test_fuzz_mla_kv_cache. A fifth of the calls go through the
 * _quant entry points with q_norm and / or k_nope quantized (a format of src/gemm_format.h, its
 * width a multiple of the group, the dense copy present or not); on success the quantized bytes
 * are those of the encoder applied to the call's own dense row when it has one.
 */
#include "fuzz_common.h"

#include "gemm_format.h"

/* One quantized output of the call: its format, rounding and tensors. */
typedef struct quant_out {
    mlaf_gemm_format fmt;
    mlaf_gemm_scale sc;
    float eps;
    fz_t d, s;
} quant_out;

static void quant_draw(mlaf_rng *r, quant_out *o, double p) {
    memset(o, 0, sizeof *o);
    if (!CHANCE(r, p)) return;
    o->fmt = (mlaf_gemm_format)RANGE(r, 1, MLAF_GEMM_FORMAT_COUNT_ - 1);
    int sc;
    do sc = (int)U(r, MLAF_GEMM_SCALE_COUNT_);
    while (!((mlaf_gemm_formats[o->fmt].scale_modes >> sc) & 1u));
    o->sc = (mlaf_gemm_scale)sc;
    o->eps = CHANCE(r, 0.3) ? 1e-4f : 0.0f;
}

/* Its data [T, K] and scales tensors (K a multiple of the group). */
static void quant_tensors(fz *f, quant_out *o, const char *dname, const char *sname, int64_t T, int64_t K) {
    if (!o->fmt) return;
    const mlaf_gemm_format_info *row = &mlaf_gemm_formats[o->fmt];
    mlaf_dtype sdt;
    int64_t sh[2], ld;
    mlaf_gemm_scales_shape(o->fmt, T, K, &sdt, sh, &ld);
    fz_2d(f, &o->d, dname, CHANCE(&f->r, 0.5) ? MLAF_U8 : MLAF_FP8_E4M3, T, K, RANGE(&f->r, 0, 9), 0, 0,
          DTM(MLAF_U8) | DTM(MLAF_FP8_E4M3), 3u, 1, 1);
    const int64_t pad = row->mn_major ? 4 * RANGE(&f->r, 0, 2) : RANGE(&f->r, 0, 3), sst[2] = {ld + pad, 1};
    fz_tensor(f, &o->s, sname, sdt, 2, sh, sst, 0, 0, DTM(sdt), 3u, 1, 1);
    if (row->mn_major) o->s.boff = 0; /* TMA-aligned: 16-byte aligned data (the buffers are) */
}

static mlaf_gemm_out quant_arg(fz *f, const quant_out *o, int host) {
    mlaf_gemm_out g = {o->fmt, o->sc, NULL, NULL, o->eps};
    if (o->fmt) g.data = host ? HOST(f, &o->d) : DEV(f, &o->d), g.scales = host ? HOST(f, &o->s) : DEV(f, &o->s);
    return g;
}

/* After a successful call: the quantized rows claimed, and equal to the encoder's bytes of the dense
 * rows `dense` (its own output, when the call had one) of width K. */
static void quant_check(fz *f, const quant_out *o, const mlaf_gemm_out_job *q, const fz_t *dense, mlaf_dtype dt,
                        int64_t T, int64_t K, const char *what) {
    if (!o->fmt || q->format == MLAF_GEMM_NONE) return;
    const mlaf_gemm_format_info *row = &mlaf_gemm_formats[q->format];
    const int64_t G = K / q->group, Gp = row->pack == 4 ? (G + 3) / 4 * 4 : G;
    const int64_t ses = (int64_t)mlaf_dtype_size(row->scale_dt);
    float *rowv = malloc(sizeof(float) * (size_t)(K + 1)), *sf = malloc(sizeof(float) * (size_t)(K + 1));
    uint8_t *rd = malloc((size_t)K + 1), *sb = malloc((size_t)K + 1);
    for (int64_t t = 0; t < T && !f->failed; t++) {
        const unsigned char *qd = body(f, o->d.buf) + o->d.boff + t * o->d.t.stride[0];
        claim(f, o->d.buf, o->d.boff + t * o->d.t.stride[0], (size_t)K);
        for (int64_t k = 0; k < Gp; k++)
            claim(f, o->s.buf, o->s.boff + mlaf_ref_gemm_scale_offset(q->format, t, k, q->scale_ld),
                  (size_t)(ses == 4 && row->pack == 1 ? 4 : 1));
        if (!dense || !dense->present) continue;
        for (int64_t i = 0; i < K; i++) rowv[i] = mlaf_load_f32(body(f, dense->buf) + dense->boff, dt, t * dense->t.stride[0] + i);
        const mlaf_gemm_encoding e = {q->format, q->scale, q->eps};
        mlaf_ref_gemm_encode_row(&e, rowv, K, rd, sf, sb);
        for (int64_t i = 0; i < K && !f->failed; i++)
            if (qd[i] != rd[i])
                fail(f, "%s.data[%lld, %lld] = 0x%02x, expected 0x%02x (the encoder on the dense row)", what, (long long)t,
                     (long long)i, qd[i], rd[i]);
        for (int64_t k = 0; k < G && !f->failed; k++) {
            const unsigned char *sp = body(f, o->s.buf) + o->s.boff + mlaf_ref_gemm_scale_offset(q->format, t, k, q->scale_ld);
            uint8_t want[4];
            if (row->scale_dt == MLAF_F32) memcpy(want, &sf[k], 4);
            else want[0] = sb[k];
            if (memcmp(sp, want, row->scale_dt == MLAF_F32 ? 4 : 1))
                fail(f, "%s.scales of row %lld group %lld: 0x%02x.., expected 0x%02x..", what, (long long)t, (long long)k,
                     sp[0], want[0]);
        }
    }
    free(rowv), free(sf), free(rd), free(sb);
}

/* ---- split_qk_norm and mla_kv_cache ----------------------------------------------------- */
typedef struct norm_case {
    int kv;
    mlaf_split_qk_norm_params sp;
    mlaf_mla_kv_cache_params kp;
} norm_case;

static int norm_params_mutate(fz *f, void *vp) {
    norm_case *n = (norm_case *)vp;
    int32_t *Q = n->kv ? &n->kp.q_lora_rank : &n->sp.q_lora_rank, *C = n->kv ? &n->kp.kv_lora_rank : &n->sp.kv_lora_rank,
            *R = n->kv ? &n->kp.rope_dim : &n->sp.rope_dim;
    float *eq = n->kv ? &n->kp.eps_q : &n->sp.eps_q, *ekv = n->kv ? &n->kp.eps_kv : &n->sp.eps_kv;
    static const float bad_eps[5] = {0.0f, -1e-6f, NAN, INFINITY, -INFINITY};
    switch (U(&f->r, 7)) {
    case 0:
        if (*Q == 0) return 0; /* eps_q is read only with a q part */
        *eq = bad_eps[U(&f->r, 5)];
        note(f, " eps_q=%g", (double)*eq);
        return 1;
    case 1: *ekv = bad_eps[U(&f->r, 5)]; note(f, " eps_kv=%g", (double)*ekv); return 1;
    case 2: *Q = CHANCE(&f->r, 0.5) ? -(int32_t)RANGE(&f->r, 1, 5) : *Q + (int32_t)RANGE(&f->r, 1, 3); note(f, " q_lora_rank=%d", *Q); return 1;
    case 3: *C = CHANCE(&f->r, 0.5) ? -(int32_t)U(&f->r, 3) : *C + (int32_t)RANGE(&f->r, 1, 3); note(f, " kv_lora_rank=%d", *C); return 1;
    case 4: *R = CHANCE(&f->r, 0.5) ? -(int32_t)RANGE(&f->r, 1, 4) : *R + (int32_t)RANGE(&f->r, 1, 3); note(f, " rope_dim=%d", *R); return 1;
    case 5: *Q = (int32_t)RANGE(&f->r, 1 << 20, INT32_MAX / 2); note(f, " q_lora_rank=%d (width > 2^20)", *Q); return 1;
    default:
        if (!n->kv) return 0;
        n->kp.style = (mlaf_rope_style)(CHANCE(&f->r, 0.5) ? -1 : RANGE(&f->r, 3, 9));
        note(f, " style=%d", (int)n->kp.style);
        return 1;
    }
}

int fuzz_norm(fz *f, int kv) {
    mlaf_rng *r = &f->r;
    set_state(f);
    norm_case nc;
    memset(&nc, 0, sizeof nc);
    nc.kv = kv;
    const mlaf_dtype dt = FLOAT_DT(r);
    const int64_t T = draw_T(r);
    int32_t Q = CHANCE(r, 0.25) ? 0 : (int32_t)RANGE(r, 1, 72), C = (int32_t)RANGE(r, 1, 72);
    const int quant = CHANCE(r, 0.2); /* through the _quant entry point */
    quant_out qq, kq;
    quant_draw(r, &qq, quant ? 0.7 : 0.0);
    quant_draw(r, &kq, quant ? 0.5 : 0.0);
    if (qq.fmt) Q = mlaf_gemm_formats[qq.fmt].group * (int32_t)RANGE(r, 1, 3);
    if (kq.fmt) C = mlaf_gemm_formats[kq.fmt].group * (int32_t)RANGE(r, 1, 3);
    int32_t R = kv ? (CHANCE(r, 0.15) ? 0 : 2 * (int32_t)RANGE(r, 1, 12)) : (int32_t)RANGE(r, 0, 24);
    const int32_t W = Q + C + R;
    const float eps_q = (float)pow(10.0, -RANGE(r, 1, 8)), eps_kv = (float)pow(10.0, -RANGE(r, 1, 8));
    const mlaf_rope_style style = CHANCE(r, 0.5) ? MLAF_ROPE_INTERLEAVED : MLAF_ROPE_NEOX;
    nc.sp = (mlaf_split_qk_norm_params){Q, C, R, eps_q, eps_kv};
    nc.kp = (mlaf_mla_kv_cache_params){Q, C, R, eps_q, eps_kv, style};
    const double scale = CHANCE(r, 0.2) ? (CHANCE(r, 0.5) ? 1e-3 : 60.0) : 1.0;
    const unsigned wdts = DTM(dt) | DTM(MLAF_F32);

    fz_t lat, wq, wkv, q, kn, kp, pos, cs, slot, cache, ec, wq0;
    memset(&wq, 0, sizeof wq), memset(&q, 0, sizeof q), memset(&kn, 0, sizeof kn), memset(&kp, 0, sizeof kp);
    memset(&pos, 0, sizeof pos), memset(&cs, 0, sizeof cs), memset(&slot, 0, sizeof slot), memset(&cache, 0, sizeof cache);
    memset(&ec, 0, sizeof ec);
    fz_2d(f, &lat, "latent", dt, T, W, CHANCE(r, 0.4) ? 0 : RANGE(r, 1, 9), 1, scale, DT_FLOATS, 2u | 1u, 1, 0);
    if (Q > 0) fz_1d(f, &wq, "w_q", CHANCE(r, 0.5) ? dt : MLAF_F32, Q, 1, 0.3, wdts, 1u, 1, 0);
    fz_1d(f, &wkv, "w_kv", CHANCE(r, 0.5) ? dt : MLAF_F32, C, 1, 0.3, wdts, 1u, 1, 0);
    /* outputs: own buffers (poisoned), the latent's own columns, or absent where optional */
    if (Q > 0 && (!qq.fmt || CHANCE(r, 0.5))) { /* a quantized q_norm may come alone */
        if (CHANCE(r, 0.2)) fz_columns(f, &q, "q", &lat, 0, Q, 3u);
        else fz_2d(f, &q, "q", dt, T, Q, RANGE(r, 0, 5), 0, 1, DTM(dt), 3u, !qq.fmt, 1);
        q.required = !qq.fmt;
    }
    if ((!kv && !kq.fmt) || CHANCE(r, 0.6)) {
        if (CHANCE(r, 0.2)) fz_columns(f, &kn, "k_nope", &lat, Q, C, 3u);
        else fz_2d(f, &kn, "k_nope", dt, T, C, RANGE(r, 0, 5), 0, 1, DTM(dt), 3u, !kv && !kq.fmt, 1);
        kn.required = !kv && !kq.fmt;
    }
    quant_tensors(f, &qq, "quant->q.data", "quant->q.scales", T, Q);
    quant_tensors(f, &kq, "quant->k_nope.data", "quant->k_nope.scales", T, C);
    if (CHANCE(r, 0.6)) {
        if (CHANCE(r, 0.2)) fz_columns(f, &kp, "k_pe", &lat, (int64_t)Q + C, R, 3u);
        else fz_2d(f, &kp, "k_pe", dt, T, R, RANGE(r, 0, 5), 0, 1, DTM(dt), 3u, 0, 1);
    }
    int64_t max_pos = 0, nb = 0, bs = 0, nslots = 0;
    if (kv) {
        max_pos = RANGE(r, 1, 40);
        if (R > 0 || CHANCE(r, 0.5)) {
            const int64_t Rt = R > 0 ? R : 2;
            fz_1d(f, &pos, "positions", INDEX_DT(r), T, 0, 0, DT_INDEX, 1u, R > 0, 0);
            fz_2d(f, &cs, "cos_sin", MLAF_F32, max_pos, Rt, RANGE(r, 0, 4), 1, 1.0, DTM(MLAF_F32), 2u, R > 0, 0);
            pos.checked = cs.checked = R > 0; /* not read without a rope part */
            if (R > 0 && CHANCE(r, 0.7)) { /* a real table in the view (any table is accepted) */
                float *tab = (float *)malloc(sizeof(float) * (size_t)(max_pos * R));
                mlaf_rope_table_init(tab, max_pos, R, CHANCE(r, 0.5) ? 10000.0 : 500.0);
                for (int64_t p = 0; p < max_pos; p++)
                    memcpy(f->b[cs.buf].init + cs.boff + p * cs.t.stride[0] * 4, tab + p * R, sizeof(float) * (size_t)R);
                free(tab);
            }
        }
        nb = CHANCE(r, 0.05) ? 0 : RANGE(r, 1, 5);
        bs = RANGE(r, 1, 5);
        nslots = nb * bs;
        const int64_t w = (int64_t)C + R;
        if (CHANCE(r, 0.2) && nb > 1) { /* tokens of a block apart: s1 > s0 */
            int64_t s0 = w + RANGE(r, 0, 4), s1 = nb * s0 + RANGE(r, 0, 4);
            int64_t sh[3] = {nb, bs, w}, st[3] = {s0, s1, 1};
            fz_tensor(f, &cache, "kv_cache", FLOAT_DT(r), 3, sh, st, 1, 1.0, DT_FLOATS, 4u, 1, 1);
        } else {
            int64_t s1 = w + (CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 4)), s0 = bs * s1 + (CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 7));
            int64_t sh[3] = {nb, bs, w}, st[3] = {s0, s1, 1};
            fz_tensor(f, &cache, "kv_cache", FLOAT_DT(r), 3, sh, st, 1, 1.0, DT_FLOATS, 4u, 1, 1);
        }
        /* N <= T entries: the rows past them take slot -1 */
        const int64_t N = CHANCE(r, 0.2) && T > 0 ? T - RANGE(r, 0, T < 3 ? T : 3) : T;
        fz_1d(f, &slot, "slot_mapping", INDEX_DT(r), N, 0, 0, DT_INDEX, 1u, 1, 0);
        slot.max0 = T;
        if (CHANCE(r, 0.7)) {
            fz_1d(f, &ec, "error_count", MLAF_I32, 1, 0, 0, DTM(MLAF_I32), 1u, 0, 1);
            int32_t start = (int32_t)U(r, 1000);
            memcpy(f->b[ec.buf].init + ec.boff, &start, 4);
        }
        /* positions: some outside the table; slots: distinct, some negative, some past the cache */
        int64_t *perm = (int64_t *)malloc(sizeof(int64_t) * (size_t)(nslots + 1));
        for (int64_t s = 0; s < nslots; s++) perm[s] = s;
        for (int64_t s = nslots - 1; s > 0; s--) {
            int64_t j = (int64_t)U(r, (uint64_t)(s + 1)), tmp = perm[s];
            perm[s] = perm[j], perm[j] = tmp;
        }
        int64_t next = 0;
        for (int64_t t = 0; t < T; t++) {
            if (pos.present) {
                int64_t p = CHANCE(r, 0.1) ? (CHANCE(r, 0.5) ? -RANGE(r, 1, 3) : max_pos + (int64_t)U(r, 3)) : (int64_t)U(r, (uint64_t)max_pos);
                if (pos.t.dtype == MLAF_I32) { int32_t v = (int32_t)p; memcpy(f->b[pos.buf].init + pos.boff + 4 * t, &v, 4); }
                else memcpy(f->b[pos.buf].init + pos.boff + 8 * t, &p, 8);
            }
            double u = mlaf_rng_uniform(r);
            int64_t s = u < 0.12 ? -RANGE(r, 1, 1000) : u < 0.2 ? nslots + (int64_t)U(r, 4) : (next < nslots ? perm[next++] : -1);
            if (u >= 0.12 && u < 0.2 && slot.t.dtype == MLAF_I64 && CHANCE(r, 0.3)) s = ((int64_t)1 << 40) + (int64_t)U(r, 9);
            if (t >= N) continue;
            if (slot.t.dtype == MLAF_I32) { int32_t v = (int32_t)s; memcpy(f->b[slot.buf].init + slot.boff + 4 * t, &v, 4); }
            else memcpy(f->b[slot.buf].init + slot.boff + 8 * t, &s, 8);
        }
        free(perm);
    }
    memset(&wq0, 0, sizeof wq0);
    if (Q == 0 && CHANCE(r, 0.08)) { /* w_q or q given without a q part: rejected */
        fz_1d(f, &wq0, CHANCE(r, 0.5) ? "w_q" : "q", dt, 4, 1, 1.0, 0, 0, 0, 0);
        note(f, " %s given with q_lora_rank = 0", wq0.name);
        f->must_fail = f->mutated = 1;
    }
    mutate(f, norm_params_mutate, &nc, &lat, Q, C);
    if (!fz_commit(f)) return -1;

    const fz_t *wq_arg = Q > 0 ? &wq : (wq0.present && !strcmp(wq0.name, "w_q") ? &wq0 : NULL);
    const fz_t *q_arg = Q > 0 ? &q : (wq0.present && !strcmp(wq0.name, "q") ? &wq0 : NULL);
    mlaf_status st;
    const mlaf_row_quant dq = {quant_arg(f, &qq, 0), quant_arg(f, &kq, 0)}, hrq = {quant_arg(f, &qq, 1), quant_arg(f, &kq, 1)};
    const mlaf_kv_cache_desc dcd = mlaf_kv_desc_plain(DEV(f, &cache));
    if (!kv && quant)
        st = mlaf_split_qk_norm_quant(f->ctx, &nc.sp, DEV(f, &lat), wq_arg ? DEV(f, wq_arg) : NULL, DEV(f, &wkv),
                                      q_arg ? DEV(f, q_arg) : NULL, DEV(f, &kn), DEV(f, &kp), &dq);
    else if (!kv)
        st = mlaf_split_qk_norm(f->ctx, &nc.sp, DEV(f, &lat), wq_arg ? DEV(f, wq_arg) : NULL, DEV(f, &wkv),
                                q_arg ? DEV(f, q_arg) : NULL, DEV(f, &kn), DEV(f, &kp));
    else if (quant)
        st = mlaf_mla_kv_cache_quant(f->ctx, &nc.kp, DEV(f, &lat), wq_arg ? DEV(f, wq_arg) : NULL, DEV(f, &wkv),
                                     DEV(f, &pos), DEV(f, &cs), DEV(f, &slot), &dcd, q_arg ? DEV(f, q_arg) : NULL,
                                     DEV(f, &kn), DEV(f, &kp), DEV(f, &ec), &dq);
    else
        st = mlaf_mla_kv_cache(f->ctx, &nc.kp, DEV(f, &lat), wq_arg ? DEV(f, wq_arg) : NULL, DEV(f, &wkv), DEV(f, &pos),
                               DEV(f, &cs), DEV(f, &slot), DEV(f, &cache), q_arg ? DEV(f, q_arg) : NULL, DEV(f, &kn),
                               DEV(f, &kp), DEV(f, &ec));
    if (!judge_status(f, st)) return st == MLAF_OK;

    /* The oracle over the host images, through a job validated from the same views. */
    mlaf_norm_job nj;
    mlaf_kv_cache_job kj;
    const mlaf_kv_cache_desc hcd = mlaf_kv_desc_plain(HOST(f, &cache));
    mlaf_status hs = !kv ? mlaf_check_split_qk_norm_q(f->host, &nc.sp, HOST(f, &lat), wq_arg ? HOST(f, wq_arg) : NULL,
                                                       HOST(f, &wkv), q_arg ? HOST(f, q_arg) : NULL, HOST(f, &kn),
                                                       HOST(f, &kp), quant ? &hrq : NULL, &nj)
                         : mlaf_check_mla_kv_cache_q(f->host, &nc.kp, HOST(f, &lat), wq_arg ? HOST(f, wq_arg) : NULL,
                                                     HOST(f, &wkv), HOST(f, &pos), HOST(f, &cs), HOST(f, &slot), &hcd,
                                                     q_arg ? HOST(f, q_arg) : NULL, HOST(f, &kn), HOST(f, &kp),
                                                     HOST(f, &ec), quant ? &hrq : NULL, &kj);
    if (hs != MLAF_OK) {
        fail(f, "the device call passed but the same views over host memory gave %s: %s", mlaf_status_name(hs),
             mlaf_context_last_error(f->host));
        return 1;
    }
    if (kv) nj = kj.norm;
    const int64_t TT = nj.T;
    double *rq = (double *)malloc(sizeof(double) * (size_t)(TT * nj.Q + 1));
    double *rk = (double *)malloc(sizeof(double) * (size_t)(TT * nj.C + 1));
    double *rows = (double *)malloc(sizeof(double) * (size_t)(TT * ((int64_t)nj.C + nj.R) + 1));
    int8_t *status = (int8_t *)malloc((size_t)TT + 1);
    if (!kv)
        mlaf_ref_split_qk_norm(&nj, rq, rk, NULL);
    else
        mlaf_ref_mla_kv_cache(&kj, rq, rk, NULL, rows, status);
    const size_t les = mlaf_dtype_size(nj.dt);
    int64_t bad = 0;
    float xin[64], xr[64];
    for (int64_t t = 0; t < TT && !f->failed; t++) {
        const unsigned char *row = (const unsigned char *)nj.latent + t * nj.latent_stride * (int64_t)les;
        if (q.present)
            for (int32_t i = 0; i < nj.Q; i++) check_units(f, &q, t * q.t.stride[0] + i, rq[t * nj.Q + i], "q", t, i);
        if (kn.present)
            for (int32_t i = 0; i < nj.C; i++) check_units(f, &kn, t * kn.t.stride[0] + i, rk[t * nj.C + i], "k_nope", t, i);
        for (int32_t i = 0; i < nj.R; i++) xin[i] = mlaf_load_f32(row, nj.dt, (int64_t)nj.Q + nj.C + i);
        if (!kv) {
            if (kp.present)
                for (int32_t i = 0; i < nj.R; i++) check_exact(f, &kp, t * kp.t.stride[0] + i, xin[i], "k_pe", t, i);
            continue;
        }
        /* mla_kv_cache: a bad token (slot past the cache, position outside the table) writes no
         * cache row and no k_pe row; a negative slot skips the cache only. */
        if (status[t] < 0) {
            bad++;
            continue;
        }
        if (nj.R > 0) {
            int64_t p = mlaf_load_index(kj.rope.positions, kj.rope.pos_dt, t);
            rope_f32(xin, nj.R, kj.rope.style, kj.rope.cos_sin + p * kj.rope.cos_sin_stride, xr);
        }
        if (kp.present)
            for (int32_t i = 0; i < nj.R; i++) check_exact(f, &kp, t * kp.t.stride[0] + i, xr[i], "k_pe", t, i);
        if (status[t] == 1) {
            const int64_t s = mlaf_load_index(kj.slots, kj.slot_dt, t), blk = s / kj.block_size, off = s % kj.block_size;
            const int64_t e0 = blk * kj.cache_s0 + off * kj.cache_s1;
            for (int32_t i = 0; i < nj.C; i++) check_units(f, &cache, e0 + i, rows[t * ((int64_t)nj.C + nj.R) + i], "kv_cache", s, i);
            for (int32_t i = 0; i < nj.R; i++) check_exact(f, &cache, e0 + nj.C + i, xr[i], "kv_cache", s, nj.C + i);
        }
    }
    if (kv) check_count(f, &ec, bad);
    quant_check(f, &qq, &nj.qq, &q, nj.dt, TT, nj.Q, "quant->q");
    quant_check(f, &kq, &nj.kq, &kn, nj.dt, TT, nj.C, "quant->k_nope");
    check_untouched(f);
    free(rq), free(rk), free(rows), free(status);
    return 1;
}
