/*
 * indexer.c — CPU DSA indexer (docs/dsa.md): the key branch of mla_kv_cache as a writer of the row
 * loop (norm.c: it runs at each row's finish, on the thread that computed the row) and the
 * indexer_q op. The arithmetic is index_math.h's, in the CUDA kernels' order (same bits).
 *
 * Key, per token t: topk_fill's row to -1; when the token is valid (position and slot usable):
 * LayerNorm, RoPE, Hadamard (each rounded), the dense `out` row, and with a slot >= 0 the 128
 * e4m3 bytes and the f32 scale block-planar into the index cache (byte stores: any block stride),
 * and the same bytes into each further copy of the multi-destination store.
 */
#include <string.h>

#include "../index_math.h"
#include "cpu.h"
#include "norm_writers.h"

#include "parallel.h"

/* n values of a row widened to fp32 (a loop per dtype: the compiler vectorizes each) */
static void widen(const void *x, mlaf_dtype dt, int n, float *f) {
    if (dt == MLAF_F32) {
        memcpy(f, x, (size_t)n * sizeof(float));
    } else if (dt == MLAF_BF16) {
        const uint16_t *h = (const uint16_t *)x;
        for (int i = 0; i < n; i++) f[i] = mlaf_bits_f32((uint32_t)h[i] << 16);
    } else {
        const uint16_t *h = (const uint16_t *)x;
        for (int i = 0; i < n; i++) f[i] = mlaf_f16_to_f32(h[i]);
    }
}

static void load128(const void *x, mlaf_dtype dt, float *f) { widen(x, dt, MLAF_IDX_D, f); }

/* A row x (dtype xdt, values of dt) with its values [0, 64) roped (index_math.h's
 * mlaf_index_rope: the path's rope kernel computes the same products and rounding to dt) into y,
 * fp32; y may be x (xdt f32): its values [64, 128) then stay where they are. */
static void rope_row(const mlaf_norm_kern *k, const void *x, mlaf_dtype xdt, mlaf_dtype dt, mlaf_rope_style style,
                     const float *cs, float *y) {
    float r[MLAF_INDEX_ROPE_DIM];
    uint16_t h[MLAF_INDEX_ROPE_DIM];
    if (dt == MLAF_F32) {
        k->rope(x, xdt, MLAF_INDEX_ROPE_DIM, style, cs, r, MLAF_F32, NULL, MLAF_F32);
        memcpy(y, r, sizeof r);
    } else {
        k->rope(x, xdt, MLAF_INDEX_ROPE_DIM, style, cs, h, dt, NULL, dt);
        widen(h, dt, MLAF_INDEX_ROPE_DIM, y);
    }
    if ((const void *)y != x)
        widen((const char *)x + MLAF_INDEX_ROPE_DIM * mlaf_dtype_size(xdt), xdt, MLAF_IDX_D - MLAF_INDEX_ROPE_DIM,
              y + MLAF_INDEX_ROPE_DIM);
}

/* index_math.h's mlaf_index_layernorm with the rounding by the path's kernel (same bits) */
void mlaf_cpu_index_layernorm(const mlaf_norm_kern *k, const float *x, const float *w, const float *b, float eps,
                              mlaf_dtype dt, float *y) {
    mlaf_index_layernorm_f32(x, w, b, eps, y);
    if (dt != MLAF_F32) k->round_amax(y, MLAF_IDX_D, dt, y, 0.0f);
}

/* index_math.h's mlaf_index_quantize by the path's kernels: e4m3 bytes of y[128] into q, the scale
 * returned. */
float mlaf_cpu_index_quantize(const mlaf_norm_kern *k, const float *y, float eps, mlaf_index_scale mode, uint8_t *q) {
    float c[MLAF_IDX_D];
    const float s = mlaf_index_scale_of(k->round_amax(y, MLAF_IDX_D, MLAF_F32, c, 0.0f), eps, mode);
    k->e4m3(y, MLAF_IDX_D, s, 1, q);
    return s;
}

/* ---- the key branch (a writer of mla_kv_cache's row loop) -------------------------------- */
typedef struct index_state {
    const mlaf_kv_cache_job *kv;
    const mlaf_index_job *ix;
    float w[MLAF_IDX_D], b[MLAF_IDX_D];
} index_state;

static void index_put(const mlaf_cpu_writer *w, const mlaf_cpu_row *r, mlaf_row_part part, int64_t i0, int64_t n,
                      const float *v) {
    (void)w, (void)r, (void)part, (void)i0, (void)n, (void)v;
}

static void index_finish(const mlaf_cpu_writer *w, const mlaf_cpu_row *r) {
    const index_state *st = (const index_state *)w->state;
    const mlaf_kv_cache_job *kv = st->kv;
    const mlaf_index_job *ix = st->ix;
    const int64_t t = r->t;
    if (ix->topk) {
        int32_t *row = ix->topk + t * ix->topk_stride;
        for (int64_t i = 0; i < ix->topk_n; i++) row[i] = -1;
    }
    if (!r->ok) return;
    const mlaf_dtype dt = kv->norm.dt;
    const size_t es = mlaf_dtype_size(dt);
    const mlaf_norm_kern *k = w->k;
    float x[MLAF_IDX_D], y[MLAF_IDX_D];
    load128((const char *)ix->k + t * ix->k_stride * (int64_t)es, dt, x);
    mlaf_cpu_index_layernorm(k, x, st->w, st->b, ix->ln_eps, dt, y);
    const int64_t pos = mlaf_load_index(kv->rope.positions, kv->rope.pos_dt, t); /* valid: r->ok */
    rope_row(k, y, MLAF_F32, dt, ix->style, kv->rope.cos_sin + pos * kv->rope.cos_sin_stride, y); /* y: values of dt */
    if (ix->hadamard) mlaf_index_hadamard(y, dt);
    if (ix->out) k->convert(y, MLAF_IDX_D, (char *)ix->out + t * ix->out_stride * (int64_t)es, dt, 0);
    if (r->slot < 0) return;
    const int64_t blk = r->slot / kv->block_size, off = r->slot % kv->block_size;
    uint8_t rec[MLAF_IDX_D];
    const float s = mlaf_cpu_index_quantize(k, y, ix->amax_eps, ix->scale, rec);
    for (int32_t c = 0; c < ix->copies; c++) { /* the same bytes to every destination */
        uint8_t *base = ix->cache + c * ix->copy_stride + blk * ix->block_stride;
        memcpy(base + off * MLAF_IDX_D, rec, MLAF_IDX_D);
        mlaf_index_put_f32(base + kv->block_size * MLAF_IDX_D + 4 * off, s);
    }
}

mlaf_status mlaf_cpu_mla_kv_cache_dsa(mlaf_context *ctx, const mlaf_kv_cache_job *job, const mlaf_index_job *ix) {
    const mlaf_norm_kern *k = mlaf_cpu_norm_kern(ctx);
    index_state st;
    st.kv = job, st.ix = ix;
    for (int i = 0; i < MLAF_IDX_D; i++) {
        st.w[i] = mlaf_load_f32(ix->w, ix->w_dt, i);
        st.b[i] = mlaf_load_f32(ix->b, ix->w_dt, i);
    }
    mlaf_cpu_writer wr[4];
    wr[0] = mlaf_cpu_writer_dense(k, &job->norm);
    wr[1] = mlaf_cpu_writer_cache(k, job);
    wr[2].put = index_put, wr[2].finish = index_finish, wr[2].k = k, wr[2].state = &st;
    const int nw = 3 + mlaf_cpu_writer_gemm(k, &job->norm, &wr[3]);
    const int64_t errors = mlaf_cpu_norm_run(ctx, &job->norm, job, wr, nw);
    mlaf_error_count_add(job->error_count, errors);
    return MLAF_OK;
}

/* ---- indexer_q --------------------------------------------------------------------------- */

/* Item i of the flattened [T, H + pe_H]: an indexer head (h < H) or an MLA q_pe head. A bad
 * position is counted once per token (at its item 0). */
typedef struct indexer_q_call {
    const mlaf_norm_kern *k;
    const mlaf_indexer_q_job *j;
} indexer_q_call;

static int64_t indexer_q_items(void *arg, int64_t i0, int64_t i1, int worker) {
    (void)worker;
    const mlaf_norm_kern *k = ((const indexer_q_call *)arg)->k;
    const mlaf_indexer_q_job *j = ((const indexer_q_call *)arg)->j;
    const int64_t HH = j->H + j->pe_H;
    const mlaf_rope_job *r = &j->rope;
    const size_t es = mlaf_dtype_size(j->dt), wes = mlaf_dtype_size(j->w_dt);
    int64_t errors = 0;
    const float *cs = NULL;
    int64_t tc = -1; /* the token whose position cs is */
    for (int64_t i = i0; i < i1; i++) {
        const int64_t t = i / HH, h = i % HH;
        if (t != tc) { /* the token's position, once per token */
            const int64_t pos = mlaf_load_index(r->positions, r->pos_dt, t);
            tc = t;
            cs = pos >= 0 && pos < r->max_pos ? r->cos_sin + pos * r->cos_sin_stride : NULL;
        }
        if (!cs) {
            errors += h == 0;
            continue;
        }
        if (h >= j->H) { /* the MLA q_pe: rope_q's rotation on the head's last 64 columns */
            const size_t pes = mlaf_dtype_size(j->pe_dt);
            char *x = (char *)j->q_pe + (t * j->pe_s0 + (h - j->H) * j->pe_s1 + (j->pe_D - MLAF_INDEX_ROPE_DIM)) *
                                           (int64_t)pes;
            k->rope(x, j->pe_dt, MLAF_INDEX_ROPE_DIM, j->pe_style, cs, x, j->pe_dt, NULL, j->pe_dt);
            continue;
        }
        float y[MLAF_IDX_D];
        rope_row(k, (const char *)j->q + (t * j->q_s0 + h * j->q_s1) * (int64_t)es, j->dt, j->dt, r->style, cs, y);
        if (j->hadamard) mlaf_index_hadamard(y, j->dt);
        const float s = mlaf_cpu_index_quantize(k, y, j->amax_eps, j->scale, j->q_fp8 + t * j->f_s0 + h * j->f_s1);
        const float wv = mlaf_load_f32((const char *)j->w + t * j->w_stride * (int64_t)wes, j->w_dt, h);
        const float a = wv * s, b = a * j->w_fold;
        j->w_out[t * j->wo_stride + h] = b * j->h_fold;
    }
    return errors;
}

mlaf_status mlaf_cpu_indexer_q(mlaf_context *ctx, const mlaf_indexer_q_job *job) {
    indexer_q_call c = {mlaf_cpu_norm_kern(ctx), job};
    const int64_t n = job->T * (job->H + job->pe_H);
    /* bytes moved: each item's 128 values read and about as much written */
    const int64_t errors =
        mlaf_cpu_parallel_for(ctx, n, 2 * n * MLAF_IDX_D * (int64_t)mlaf_dtype_size(job->dt), indexer_q_items, &c);
    mlaf_error_count_add(job->error_count, errors);
    return MLAF_OK;
}
