/*
 * verify_inputs.c — the inputs of the norm and RoPE verification cases (verify_case.h):
 * latent rows, norm weights and the dense outputs' buffers; positions, slot-style index
 * buffers, the cos/sin table and the error counter. Seeded, and the same values on any number
 * of threads.
 */
#include <stdlib.h>
#include <string.h>

#include "verify_case.h"

mlaf_status check_case_common(const mlaf_verify_case *c, mlaf_verify_result *r) {
    memset(r, 0, sizeof *r);
    if (c->cfg.kv_lora_rank <= 0 || c->cfg.q_lora_rank < 0 || c->cfg.qk_rope_head_dim < 0 ||
        c->T < 0)
        return MLAF_ERR_INVALID_ARGUMENT;
    return MLAF_OK;
}

/* ---- the norm ops' inputs ------------------------------------------------------------- */

/* Approximately N(mean, sd) values rounded to dt: a sum of four uniforms (Irwin-Hall), which
 * is all the shape these tests need and far cheaper than Box-Muller for 10^8 values. */
static void fill_fast_normal(mlaf_rng *rng, void *p, mlaf_dtype dt, int64_t n, double mean,
                             double sd) {
    for (int64_t i = 0; i < n; i++) {
        uint64_t u = mlaf_rng_u64(rng);
        double s = (double)(u & 0xffff) + (double)((u >> 16) & 0xffff) +
                   (double)((u >> 32) & 0xffff) + (double)(u >> 48);
        double z = (s * (1.0 / 65536.0) - 2.0) * 1.7320508075688772;
        mlaf_store_f32(p, dt, i, (float)(mean + sd * z));
    }
}

/* Latent rows: ~N(0,1), with some rows far larger or smaller (eps then matters) and some zero. */
static void fill_latent(mlaf_rng *rng, void *p, mlaf_dtype dt, int64_t T, int64_t stride) {
    const size_t es = mlaf_dtype_size(dt);
    /* row t takes draws [t stride, (t + 1) stride): rows on all threads, the same values */
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int64_t t = 0; t < T; t++) {
        double s = 1.0;
        if (t % 13 == 5) s = dt == MLAF_F16 ? 64.0 : 4096.0;
        if (t % 13 == 9) s = 1.0 / 512.0;
        if (t % 97 == 50) s = 0.0;
        mlaf_rng rt = mlaf_rng_skipped(rng, (uint64_t)(t * stride));
        fill_fast_normal(&rt, (char *)p + (size_t)(t * stride) * es, dt, stride, 0.0, s);
    }
    *rng = mlaf_rng_skipped(rng, (uint64_t)(T > 0 ? T * stride : 0));
}

/* fill_fast_normal over n elements in blocks on all threads (block k takes draws from k B). */
void fill_fast_normal_par(mlaf_rng *rng, void *p, mlaf_dtype dt, int64_t n, double mean,
                          double sd) {
    const int64_t B = 1 << 16, nb = (n + B - 1) / B;
    const size_t es = mlaf_dtype_size(dt);
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int64_t k = 0; k < nb; k++) {
        mlaf_rng rt = mlaf_rng_skipped(rng, (uint64_t)(k * B));
        fill_fast_normal(&rt, (char *)p + (size_t)(k * B) * es, dt, n - k * B < B ? n - k * B : B, mean, sd);
    }
    *rng = mlaf_rng_skipped(rng, (uint64_t)(n > 0 ? n : 0));
}

void norm_bufs_free(norm_bufs *n) {
    vbuf_free(&n->latent);
    vbuf_free(&n->w_q);
    vbuf_free(&n->w_kv);
    vbuf_free(&n->q);
    vbuf_free(&n->k_nope);
    vbuf_free(&n->k_pe);
}

/* Inputs and the dense outputs (want_* says which exist). */
mlaf_status norm_bufs_make(norm_bufs *n, mlaf_backend be, const mlaf_verify_case *c,
                           mlaf_rng *rng, int want_k_nope, int want_k_pe) {
    memset(n, 0, sizeof *n);
    const int64_t Q = c->cfg.q_lora_rank, C = c->cfg.kv_lora_rank, R = c->cfg.qk_rope_head_dim;
    const int64_t W = Q + C + R, T = c->T;
    const mlaf_dtype dt = c->dtype;
    const size_t es = mlaf_dtype_size(dt), wes = mlaf_dtype_size(c->weight_dtype);
    const int st = c->strided != 0;
    mlaf_status s;
    n->LS = W + (st ? 7 : 0);
    size_t lbytes = (size_t)(T * n->LS) * es;
    void *tmp = malloc(lbytes ? lbytes : 1);
    if (!tmp) return MLAF_ERR_OUT_OF_MEMORY;
    fill_latent(rng, tmp, dt, T, n->LS);
    s = vbuf_alloc(&n->latent, "latent", be, lbytes, tmp, st ? 3 * es : 0);
    free(tmp);
    if (s != MLAF_OK) return s;

    int64_t wn[2] = {Q, C};
    vbuf *wb[2] = {&n->w_q, &n->w_kv};
    const char *wname[2] = {"w_q", "w_kv"};
    for (int k = 0; k < 2; k++) {
        if (wn[k] == 0) continue;
        void *w = malloc((size_t)wn[k] * wes);
        if (!w) return MLAF_ERR_OUT_OF_MEMORY;
        mlaf_fill_normal(rng, w, c->weight_dtype, (size_t)wn[k], 1.0, 0.25);
        s = vbuf_alloc(wb[k], wname[k], be, (size_t)wn[k] * wes, w, st ? wes : 0);
        free(w);
        if (s != MLAF_OK) return s;
    }

    if (c->in_place) {
        vview q = {&n->latent, dt, 0, n->LS}, k = {&n->latent, dt, Q, n->LS},
              p = {&n->latent, dt, Q + C, n->LS};
        n->vq = q;
        n->vk = k;
        n->vp = p;
    } else {
        int64_t widths[3] = {Q, C, R}, pads[3] = {5, 3, 1};
        vbuf *bufs[3] = {&n->q, &n->k_nope, &n->k_pe};
        vview *views[3] = {&n->vq, &n->vk, &n->vp};
        const char *names[3] = {"q", "k_nope", "k_pe"};
        int want[3] = {Q > 0, want_k_nope, want_k_pe && R > 0};
        for (int k = 0; k < 3; k++) {
            int64_t stride = widths[k] + (st ? pads[k] : 0);
            views[k]->dt = dt;
            views[k]->stride = stride;
            views[k]->b = bufs[k];
            if (!want[k]) continue;
            s = vbuf_alloc(bufs[k], names[k], be, (size_t)(T * stride) * es, NULL,
                           st ? (size_t)(2 * k + 1) * es : 0);
            if (s != MLAF_OK) return s;
        }
    }
    return MLAF_OK;
}

mlaf_tensor tensor_of(const vview *v, int64_t T, int64_t width) {
    return mlaf_tensor_2d(vv_dev(v), v->dt, T, width, v->stride);
}

/* Host copy of the job for the oracle, on the initial images, for tokens [t0, t0 + n). */
mlaf_norm_job host_norm_job(const norm_bufs *b, const mlaf_verify_case *c, int64_t t0,
                            int64_t n) {
    mlaf_norm_job j;
    memset(&j, 0, sizeof j);
    j.T = n;
    j.Q = c->cfg.q_lora_rank;
    j.C = c->cfg.kv_lora_rank;
    j.R = c->cfg.qk_rope_head_dim;
    j.eps_q = c->cfg.rms_norm_eps;
    j.eps_kv = c->cfg.rms_norm_eps;
    j.dt = c->dtype;
    j.latent = b->latent.init + (size_t)(t0 * b->LS) * mlaf_dtype_size(c->dtype);
    j.latent_stride = b->LS;
    j.w_q = j.Q > 0 ? b->w_q.init : NULL;
    j.w_q_dt = c->weight_dtype;
    j.w_kv = b->w_kv.init;
    j.w_kv_dt = c->weight_dtype;
    return j;
}

/* ---- RoPE inputs shared by mla_kv_cache and rope_q ------------------------------------ */

/* Positions: mostly random, with max_pos - 1, repeats and rejected ones mixed in. */
void make_positions(mlaf_rng *rng, int64_t *pos, int64_t T, int64_t max_pos) {
    for (int64_t t = 0; t < T; t++) {
        pos[t] = (int64_t)(mlaf_rng_u64(rng) % (uint64_t)max_pos);
        if (t % 7 == 3) pos[t] = max_pos - 1;
        if (t % 5 == 1) pos[t] = pos[t - 1];
        if (t % 13 == 6) pos[t] = (t / 13) % 2 ? max_pos + t % 3 : -1 - t % 5;
    }
}

mlaf_status index_buf(vbuf *b, const char *name, mlaf_backend be, const int64_t *v,
                      int64_t T, mlaf_dtype dt, int misalign) {
    size_t es = mlaf_dtype_size(dt);
    void *tmp = malloc((size_t)T * es + 1);
    if (!tmp) return MLAF_ERR_OUT_OF_MEMORY;
    for (int64_t t = 0; t < T; t++) {
        if (dt == MLAF_I64)
            ((int64_t *)tmp)[t] = v[t];
        else
            ((int32_t *)tmp)[t] = (int32_t)v[t];
    }
    mlaf_status s = vbuf_alloc(b, name, be, (size_t)T * es, tmp, misalign ? es : 0);
    free(tmp);
    return s;
}

/* cos_sin [max_pos, R] with row stride cs_stride (f32). */
mlaf_status cos_sin_buf(vbuf *b, mlaf_backend be, int32_t R, int64_t cs_stride, int strided) {
    float *table = (float *)malloc(sizeof(float) * VERIFY_MAX_POS * (size_t)R);
    float *img = (float *)calloc((size_t)(VERIFY_MAX_POS * cs_stride), sizeof(float));
    mlaf_status s = MLAF_ERR_OUT_OF_MEMORY;
    if (table && img) {
        s = mlaf_rope_table_init(table, VERIFY_MAX_POS, R, 10000.0);
        if (s == MLAF_OK) {
            for (int64_t p = 0; p < VERIFY_MAX_POS; p++)
                memcpy(img + p * cs_stride, table + p * R, sizeof(float) * (size_t)R);
            s = vbuf_alloc(b, "cos_sin", be, sizeof(float) * (size_t)(VERIFY_MAX_POS * cs_stride),
                           img, strided ? 4 : 0);
        }
    }
    free(table);
    free(img);
    return s;
}

mlaf_status error_count_buf(vbuf *b, mlaf_backend be) {
    int32_t start = 3; /* the op adds to whatever the caller left there */
    return vbuf_alloc(b, "error_count", be, sizeof start, &start, 0);
}
