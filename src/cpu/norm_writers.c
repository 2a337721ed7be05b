/*
 * norm_writers.c — the CPU writers of split_qk_norm and mla_kv_cache (norm_writers.h).
 */
#include "norm_writers.h"

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
    const int64_t e = (r->slot / kv->block_size) * kv->cache_s0 + (r->slot % kv->block_size) * kv->cache_s1 +
                      (part == MLAF_PART_PE ? kv->norm.C : 0) + i0;
    w->k->convert(v, n, (char *)kv->cache + e * ces, kv->cache_dt, r->stream);
}

mlaf_cpu_writer mlaf_cpu_writer_paged(const mlaf_norm_kern *k, const mlaf_kv_cache_job *job) {
    mlaf_cpu_writer w = {paged_put, NULL, k, job};
    return w;
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
