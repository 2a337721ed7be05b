/*
 * norm_writers.c — the CPU writers of split_qk_norm and mla_kv_cache (norm_writers.h).
 */
#include <math.h>
#include <string.h>

#include "../fp8.h"
#include "norm_writers.h"

/* Element offset of the cache record of a valid slot (cache = 0) or of its kpe row (1). */
static int64_t slot_row(const mlaf_kv_cache_job *kv, int64_t slot, int kpe) {
    const int64_t b = slot / kv->block_size, o = slot % kv->block_size;
    return kpe ? b * kv->kpe_s0 + o * kv->kpe_s1 : b * kv->cache_s0 + o * kv->cache_s1;
}

/* ---- dense outputs --------------------------------------------------------------------- */
static void dense_put(const mlaf_cpu_writer *w, const mlaf_cpu_row *r, mlaf_row_part part, int64_t i0, int64_t n,
                      const float *v) {
    const mlaf_norm_job *j = (const mlaf_norm_job *)w->state;
    const int64_t es = (int64_t)mlaf_dtype_size(j->dt);
    char *out;
    if (part == MLAF_PART_Q) out = (char *)j->q + r->t * j->q_stride * es;
    else if (part == MLAF_PART_KV) out = j->k_nope ? (char *)j->k_nope + r->t * j->k_nope_stride * es : NULL;
    else out = j->k_pe ? (char *)j->k_pe + r->t * j->k_pe_stride * es : NULL;
    if (!out || (part == MLAF_PART_PE && !r->ok)) return;
    out += i0 * es;
    if (v) w->k->convert(v, n, out, j->dt, r->stream);
    else if (out != (const char *)r->pe_raw + i0 * es) /* in place: already there */
        w->k->copy((const char *)r->pe_raw + i0 * es, (size_t)(n * es), out, r->stream);
}

mlaf_cpu_writer mlaf_cpu_writer_dense(const mlaf_norm_kern *k, const mlaf_norm_job *job) {
    mlaf_cpu_writer w = {dense_put, NULL, k, job};
    return w;
}

/* ---- plain paged cache ----------------------------------------------------------------- */
static void paged_put(const mlaf_cpu_writer *w, const mlaf_cpu_row *r, mlaf_row_part part, int64_t i0, int64_t n,
                      const float *v) {
    const mlaf_kv_cache_job *kv = (const mlaf_kv_cache_job *)w->state;
    if (part == MLAF_PART_Q || !r->ok || r->slot < 0) return;
    const int64_t ces = (int64_t)mlaf_dtype_size(kv->cache_dt);
    const int sep = part == MLAF_PART_PE && kv->kpe;
    const int64_t e = slot_row(kv, r->slot, sep) + (part == MLAF_PART_PE && !sep ? kv->norm.C : 0) + i0;
    w->k->convert(v, n, (char *)(sep ? kv->kpe : kv->cache) + e * ces, kv->cache_dt, r->stream);
}

mlaf_cpu_writer mlaf_cpu_writer_paged(const mlaf_norm_kern *k, const mlaf_kv_cache_job *job) {
    mlaf_cpu_writer w = {paged_put, NULL, k, job};
    return w;
}

/* ---- fp8 formats ----------------------------------------------------------------------- */

/* v[0, n) rounded to the latent dtype dt (the dense output's values) into x. */
static void rounded(const float *v, int64_t n, mlaf_dtype dt, float *x) {
    if (dt == MLAF_BF16) {
        for (int64_t i = 0; i < n; i++) x[i] = mlaf_bf16_to_f32(mlaf_f32_to_bf16(v[i]));
    } else if (dt == MLAF_F16) {
        for (int64_t i = 0; i < n; i++) x[i] = mlaf_f16_to_f32(mlaf_f32_to_f16(v[i]));
    } else {
        memcpy(x, v, (size_t)n * sizeof(float));
    }
}

/* The NaN-ignoring max of |x[0, n)|, from m. */
static float amax_of(const float *x, int64_t n, float m) {
    for (int64_t i = 0; i < n; i++) {
        const float a = fabsf(x[i]);
        m = a > m ? a : m;
    }
    return m;
}

#define PIECE 256 /* values per pass of the fp8 writers' loops (on the stack) */

/* *m = max(*m, a) for a >= 0, across threads: non-negative floats order as their bits. */
static void atomic_max_nonneg(float *m, float a) {
    uint32_t *p = (uint32_t *)m, want = mlaf_f32_bits(a), cur = __atomic_load_n(p, __ATOMIC_RELAXED);
    while ((int32_t)cur < (int32_t)want &&
           !__atomic_compare_exchange_n(p, &cur, want, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

static void fp8_put(const mlaf_cpu_writer *w, const mlaf_cpu_row *r, mlaf_row_part part, int64_t i0, int64_t n,
                    const float *v) {
    const mlaf_kv_cache_job *kv = (const mlaf_kv_cache_job *)w->state;
    if (part == MLAF_PART_Q || !r->ok || r->slot < 0) return;
    const int sep = part == MLAF_PART_PE && kv->kpe;
    const int64_t e = slot_row(kv, r->slot, sep) + (part == MLAF_PART_PE && !sep ? kv->norm.C : 0) + i0;
    uint8_t *out = (uint8_t *)(sep ? kv->kpe : kv->cache) + e;
    const float s = *kv->scale;
    float x[PIECE], amax = 0.0f;
    for (int64_t p0 = 0; p0 < n; p0 += PIECE) {
        const int64_t m = n - p0 < PIECE ? n - p0 : PIECE;
        rounded(v + p0, m, kv->norm.dt, x);
        amax = amax_of(x, m, amax);
        if (kv->conv == MLAF_FP8_DIV)
            for (int64_t i = 0; i < m; i++) out[p0 + i] = mlaf_f32_to_e4m3(x[i] / s);
        else
            for (int64_t i = 0; i < m; i++) out[p0 + i] = mlaf_f32_to_e4m3(x[i] * s);
    }
    if (kv->amax_out) atomic_max_nonneg(kv->amax_out, amax);
}

mlaf_cpu_writer mlaf_cpu_writer_fp8(const mlaf_norm_kern *k, const mlaf_kv_cache_job *job) {
    mlaf_cpu_writer w = {fp8_put, NULL, k, job};
    return w;
}

/* fp8_ds_mla: the kv part arrives in whole tiles (chunks are multiples of 128 values). */
static void ds_mla_put(const mlaf_cpu_writer *w, const mlaf_cpu_row *r, mlaf_row_part part, int64_t i0, int64_t n,
                       const float *v) {
    const mlaf_kv_cache_job *kv = (const mlaf_kv_cache_job *)w->state;
    if (part == MLAF_PART_Q || !r->ok || r->slot < 0) return;
    const int64_t C = kv->norm.C;
    uint8_t *rec = (uint8_t *)kv->cache + slot_row(kv, r->slot, 0);
    if (part == MLAF_PART_PE) {
        uint8_t *pe = rec + C + C / 32 + 2 * i0;
        for (int64_t i = 0; i < n; i++) {
            const uint16_t b = mlaf_f32_to_bf16(v[i]);
            pe[2 * i] = (uint8_t)b, pe[2 * i + 1] = (uint8_t)(b >> 8);
        }
        return;
    }
    for (int64_t t0 = 0; t0 < n; t0 += 128) {
        float x[128];
        rounded(v + t0, 128, MLAF_BF16, x);
        const float s = mlaf_tile_scale_of(amax_of(x, 128, 0.0f), (int)kv->tile_scale);
        uint8_t *q = rec + i0 + t0;
        for (int i = 0; i < 128; i++) q[i] = mlaf_f32_to_e4m3(x[i] / s);
        const uint32_t sb = mlaf_f32_bits(s);
        uint8_t *sp = rec + C + 4 * ((i0 + t0) / 128);
        sp[0] = (uint8_t)sb, sp[1] = (uint8_t)(sb >> 8), sp[2] = (uint8_t)(sb >> 16), sp[3] = (uint8_t)(sb >> 24);
    }
}

mlaf_cpu_writer mlaf_cpu_writer_ds_mla(const mlaf_norm_kern *k, const mlaf_kv_cache_job *job) {
    mlaf_cpu_writer w = {ds_mla_put, NULL, k, job};
    return w;
}

/* fp8_v4 (SPEC §11; C = 512, kv_rope_tail = 64, R = 0): the kv part arrives as its 448 NoPE
 * values (one chunk, from offset 0) and then, for a token with a usable position, its 64 roped
 * values. Page b of the cache holds block_size data rows of 576 B, then block_size scale rows of
 * 8 B. */
static void v4_put(const mlaf_cpu_writer *w, const mlaf_cpu_row *r, mlaf_row_part part, int64_t i0, int64_t n,
                   const float *v) {
    const mlaf_kv_cache_job *kv = (const mlaf_kv_cache_job *)w->state;
    if (part != MLAF_PART_KV || !r->ok || r->slot < 0) return;
    const int64_t b = r->slot / kv->block_size, o = r->slot % kv->block_size;
    uint8_t *page = (uint8_t *)kv->cache + b * kv->cache_s0;
    uint8_t *data = page + o * 576, *scales = page + kv->block_size * 576 + o * 8;
    for (int64_t q0 = 0; q0 < n; q0 += 64) {
        const int64_t i = i0 + q0;
        if (i >= 448) { /* the roped tail, as bf16 */
            const int64_t m = n - q0;
            for (int64_t k = 0; k < m; k++) {
                const uint16_t h = mlaf_f32_to_bf16(v[q0 + k]);
                data[2 * (i + k) - 448] = (uint8_t)h, data[2 * (i + k) - 447] = (uint8_t)(h >> 8);
            }
            break;
        }
        float x[64];
        rounded(v + q0, 64, MLAF_BF16, x);
        const int e = mlaf_ue8m0_exponent(amax_of(x, 64, 0.0f));
        const float mul = mlaf_exp2_neg_f32(e);
        for (int k = 0; k < 64; k++) data[i + k] = mlaf_f32_to_e4m3(x[k] * mul);
        scales[i / 64] = mlaf_ue8m0_byte(e);
        if (i / 64 == 6) scales[7] = 0;
    }
}

mlaf_cpu_writer mlaf_cpu_writer_v4(const mlaf_norm_kern *k, const mlaf_kv_cache_job *job) {
    mlaf_cpu_writer w = {v4_put, NULL, k, job};
    return w;
}

mlaf_cpu_writer mlaf_cpu_writer_cache(const mlaf_norm_kern *k, const mlaf_kv_cache_job *job) {
    return job->format == MLAF_KV_FP8          ? mlaf_cpu_writer_fp8(k, job)
           : job->format == MLAF_KV_FP8_DS_MLA ? mlaf_cpu_writer_ds_mla(k, job)
           : job->format == MLAF_KV_FP8_V4     ? mlaf_cpu_writer_v4(k, job)
                                               : mlaf_cpu_writer_paged(k, job);
}

/* ---- rstd (diagnostic) ----------------------------------------------------------------- */
static void rstd_put(const mlaf_cpu_writer *w, const mlaf_cpu_row *r, mlaf_row_part part, int64_t i0, int64_t n,
                     const float *v) {
    (void)w, (void)r, (void)part, (void)i0, (void)n, (void)v;
}
static void rstd_finish(const mlaf_cpu_writer *w, const mlaf_cpu_row *r) {
    float *o = (float *)w->state + 2 * r->t;
    o[0] = r->rstd_q, o[1] = r->rstd_kv;
}

mlaf_cpu_writer mlaf_cpu_writer_rstd(const mlaf_norm_kern *k, float *out) {
    mlaf_cpu_writer w = {rstd_put, rstd_finish, k, out};
    return w;
}
