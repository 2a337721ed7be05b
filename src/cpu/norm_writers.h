/*
 * norm_writers.h — what the CPU row loop (norm.c) does with a row's final values: the writers.
 *
 * The row loop computes each part of a token's row in fp32 (q and kv normalized, mla_kv_cache's
 * pe part roped) in chunks and hands every chunk to each writer of the op; a writer stores it
 * (rounded once to its format) or derives what it needs from it. A new writer is one
 * constructor here and its put / finish functions in norm_writers.c; an op lists its writers
 * (norm.c).
 */
#ifndef MLAF_NORM_WRITERS_H
#define MLAF_NORM_WRITERS_H

#include "norm_kern.h"

typedef enum mlaf_row_part { MLAF_PART_Q = 0, MLAF_PART_KV = 1, MLAF_PART_PE = 2 } mlaf_row_part;

/* One token's row, as the writers see it. */
typedef struct mlaf_cpu_row {
    int64_t t;
    int ok;             /* position and slot usable (split_qk_norm: always) */
    int64_t slot;       /* mla_kv_cache: the cache slot (< 0: no cache row); -1 otherwise */
    float rstd_q, rstd_kv;
    const void *pe_raw; /* the latent's pe part as stored (split_qk_norm's bit-exact copy) */
    int stream;         /* a large call: non-temporal stores allowed (fence before returning) */
} mlaf_cpu_row;

typedef struct mlaf_cpu_writer mlaf_cpu_writer;
struct mlaf_cpu_writer {
    /* values [i0, i0 + n) of part `part` of row r, fp32 before rounding; for the pe part of
     * split_qk_norm v is NULL and r->pe_raw holds the values. */
    void (*put)(const mlaf_cpu_writer *w, const mlaf_cpu_row *r, mlaf_row_part part, int64_t i0, int64_t n,
                const float *v);
    void (*finish)(const mlaf_cpu_writer *w, const mlaf_cpu_row *r); /* after the row, or NULL */
    const mlaf_norm_kern *k;
    const void *state; /* the writer's own: its job, its outputs */
};

/* The row loop (norm.c) over a validated job, each row to the nw writers (built with the
 * context's kernels, mlaf_cpu_norm_kern); kv NULL: split_qk_norm. Returns the tokens counted as
 * invalid (the caller adds them to the job's error count). */
const mlaf_norm_kern *mlaf_cpu_norm_kern(const mlaf_context *ctx);
int64_t mlaf_cpu_norm_run(const mlaf_context *ctx, const mlaf_norm_job *j, const mlaf_kv_cache_job *kv,
                          const mlaf_cpu_writer *wr, int nw);

/* q (Q > 0), k_nope and k_pe when given, in the latent dtype. */
mlaf_cpu_writer mlaf_cpu_writer_dense(const mlaf_norm_kern *k, const mlaf_norm_job *job);
/* q_norm and k_nope in their GEMM-input formats (job->qq, job->kq; gemm_writers.h): fills *w and
 * returns 1 when the call has either, else returns 0 (the op then lists no such writer). */
int mlaf_cpu_writer_gemm(const mlaf_norm_kern *k, const mlaf_norm_job *job, mlaf_cpu_writer *w);
/* The plain paged cache row [k_nope | rope(k_pe)] of the token's slot, in the cache dtype. */
mlaf_cpu_writer mlaf_cpu_writer_paged(const mlaf_norm_kern *k, const mlaf_kv_cache_job *job);

/* The fp8 formats (docs/kv_formats.md): per-tensor e4m3 with one scale (and the optional amax_out), or the
 * fp8_ds_mla record (e4m3 tiles of 128 with their f32 scales, then the bf16 rope part). Every
 * value is first rounded to the latent dtype (the value the op stores densely). */
mlaf_cpu_writer mlaf_cpu_writer_fp8(const mlaf_norm_kern *k, const mlaf_kv_cache_job *job);
mlaf_cpu_writer mlaf_cpu_writer_ds_mla(const mlaf_norm_kern *k, const mlaf_kv_cache_job *job);

/* fp8_v4 (docs/kv_formats.md): per page, data rows [448 e4m3 | 64 bf16 roped] of 576 B, then scale rows of
 * 8 B (7 UE8M0 bytes and a zero). Needs the kv_rope_tail 64 of a 512-wide kv part. */
mlaf_cpu_writer mlaf_cpu_writer_v4(const mlaf_norm_kern *k, const mlaf_kv_cache_job *job);
/* The cache writer of the job's format: norm_writers.c's table, one constructor per format of
 * src/kv_format.h. mlaf_cpu_cache_writer_count: how many formats have one (a test checks all). */
mlaf_cpu_writer mlaf_cpu_writer_cache(const mlaf_norm_kern *k, const mlaf_kv_cache_job *job);
int mlaf_cpu_cache_writer_count(void);

/* The DSA indexer's LayerNorm of a key row (y rounded to dt) and its quantization (e4m3 bytes of
 * y[128] into q, the scale returned): index_math.h's arithmetic with the rounding, amax and e4m3
 * steps of the kernels k (the same bits). indexer.c; the bench's unfused chain calls them too. */
void mlaf_cpu_index_layernorm(const mlaf_norm_kern *k, const float *x, const float *w, const float *b, float eps,
                              mlaf_dtype dt, float *y);
float mlaf_cpu_index_quantize(const mlaf_norm_kern *k, const float *y, float eps, mlaf_index_scale mode, uint8_t *q);

/* Each row's two rstd values as f32 out[2 t], out[2 t + 1] (q, kv): a diagnostic writer, for tests. */
mlaf_cpu_writer mlaf_cpu_writer_rstd(const mlaf_norm_kern *k, float *out);

#endif
