/*
 * norm_writers.c — the CPU writers of split_qk_norm and mla_kv_cache (norm_writers.h).
 */
#include <math.h>
#include <string.h>

#include "../fp8.h"
#include "gemm_writers.h"
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
    if (part == MLAF_PART_Q) out = j->q ? (char *)j->q + r->t * j->q_stride * es : NULL;
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

/* ---- quantized q_norm / k_nope (include/mlafuse/quant.h, mlaf_row_quant) ------------------- */
static void gemm_put(const mlaf_cpu_writer *w, const mlaf_cpu_row *r, mlaf_row_part part, int64_t i0, int64_t n,
                     const float *v) {
    const mlaf_norm_job *j = (const mlaf_norm_job *)w->state;
    const mlaf_gemm_out_job *q = part == MLAF_PART_Q ? &j->qq : part == MLAF_PART_KV ? &j->kq : NULL;
    if (!q || q->format == MLAF_GEMM_NONE) return;
    /* chunks start and end on group edges: the row loop's CHUNK and the part widths are multiples */
    const int64_t K = part == MLAF_PART_Q ? j->Q : j->C;
    mlaf_cpu_gemm_writer_of(q->format)(w->k, q, j->dt, r->t, K / q->group, i0, n, v);
}

int mlaf_cpu_writer_gemm(const mlaf_norm_kern *k, const mlaf_norm_job *job, mlaf_cpu_writer *w) {
    if (job->qq.format == MLAF_GEMM_NONE && job->kq.format == MLAF_GEMM_NONE) return 0;
    w->put = gemm_put, w->finish = NULL, w->k = k, w->state = job;
    return 1;
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

#define PIECE 256 /* values per pass of the fp8 writers' loops (on the stack) */

/* n values as little-endian bf16 at any byte address (the records' rope values) */
static void bf16_bytes(const mlaf_norm_kern *k, const float *v, int64_t n, uint8_t *out) {
    uint16_t h[PIECE];
    for (int64_t p0 = 0; p0 < n; p0 += PIECE) {
        const int64_t m = n - p0 < PIECE ? n - p0 : PIECE;
        k->convert(v + p0, m, h, MLAF_BF16, 0);
        memcpy(out + 2 * p0, h, (size_t)m * 2);
    }
}

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
        amax = w->k->round_amax(v + p0, m, kv->norm.dt, x, amax);
        w->k->e4m3(x, m, s, kv->conv == MLAF_FP8_DIV, out + p0);
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
        bf16_bytes(w->k, v, n, rec + C + C / 32 + 2 * i0);
        return;
    }
    for (int64_t t0 = 0; t0 < n; t0 += 128) {
        float x[128];
        const float s = mlaf_tile_scale_of(w->k->round_amax(v + t0, 128, MLAF_BF16, x, 0.0f), (int)kv->tile_scale);
        w->k->e4m3(x, 128, s, 1, rec + i0 + t0);
        const uint32_t sb = mlaf_f32_bits(s);
        uint8_t *sp = rec + C + 4 * ((i0 + t0) / 128);
        sp[0] = (uint8_t)sb, sp[1] = (uint8_t)(sb >> 8), sp[2] = (uint8_t)(sb >> 16), sp[3] = (uint8_t)(sb >> 24);
    }
}

mlaf_cpu_writer mlaf_cpu_writer_ds_mla(const mlaf_norm_kern *k, const mlaf_kv_cache_job *job) {
    mlaf_cpu_writer w = {ds_mla_put, NULL, k, job};
    return w;
}

/* fp8_v4 (docs/kv_formats.md, fp8_v4; C = 512, kv_rope_tail = 64, R = 0): the kv part arrives as its 448 NoPE
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
            bf16_bytes(w->k, v + q0, n - q0, data + 2 * i - 448);
            break;
        }
        float x[64];
        const int e = mlaf_ue8m0_exponent(w->k->round_amax(v + q0, 64, MLAF_BF16, x, 0.0f));
        w->k->e4m3(x, 64, mlaf_exp2_neg_f32(e), 0, data + i);
        scales[i / 64] = mlaf_ue8m0_byte(e);
        if (i / 64 == 6) scales[7] = 0;
    }
}

mlaf_cpu_writer mlaf_cpu_writer_v4(const mlaf_norm_kern *k, const mlaf_kv_cache_job *job) {
    mlaf_cpu_writer w = {v4_put, NULL, k, job};
    return w;
}

/* The cache writer of each format (src/kv_format.h), by its enum value. */
typedef mlaf_cpu_writer (*cache_writer_fn)(const mlaf_norm_kern *k, const mlaf_kv_cache_job *job);
static const cache_writer_fn cache_writers[MLAF_KV_FORMAT_COUNT_] = {
    [MLAF_KV_PLAIN] = mlaf_cpu_writer_paged,
    [MLAF_KV_FP8] = mlaf_cpu_writer_fp8,
    [MLAF_KV_FP8_DS_MLA] = mlaf_cpu_writer_ds_mla,
    [MLAF_KV_FP8_V4] = mlaf_cpu_writer_v4,
};

mlaf_cpu_writer mlaf_cpu_writer_cache(const mlaf_norm_kern *k, const mlaf_kv_cache_job *job) {
    return cache_writers[job->format](k, job); /* a validated format */
}

int mlaf_cpu_cache_writer_count(void) {
    int n = 0;
    for (int f = 0; f < MLAF_KV_FORMAT_COUNT_; f++) n += cache_writers[f] != NULL;
    return n;
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
