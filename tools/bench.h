/*
 * bench.h — what `mlafuse bench` shares between its C driver, the CPU harness and
 * baselines, and the CUDA harness and baselines (tools/ .cu files, extern "C").
 *
 * An op under test is a bench_op: its buffers on the backend (inputs, outputs, and the
 * scratch tensors the unfused chain writes between its passes), a fused call through the
 * public API and an unfused call through the baselines. Both read the same inputs and
 * write the same outputs, so the driver can check one against the other once per shape.
 */
#ifndef MLAF_BENCH_H
#define MLAF_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"

struct mlaf_norm_kern; /* src/cpu/norm_kern.h */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bench_stats {
    double median_us, p10_us, p90_us, min_us, max_us;
    int samples;
    int calls_per_sample; /* > 1 in graph mode: a sample is one replay of that many calls */
} bench_stats;

/* One call of the op (or of its unfused chain) on input/output set `set`. Returns 0, or
 * non-zero after writing a message into err. On CUDA the call only enqueues work. */
typedef int (*bench_call_fn)(void *arg, int set, char *err, size_t cap);

/* Sorts samples (microseconds) and fills the statistics. */
void bench_stats_from(double *us, int n, int calls_per_sample, bench_stats *out);

/* ---- CPU harness (bench_cpu.c) ------------------------------------------------------------ */
/* Last-level cache size in bytes (sysconf; 32 MB when unknown). */
size_t bench_cpu_llc_bytes(void);
/* Times `reps` calls after warm-up, rotating over `nsets` input/output sets. */
int bench_cpu_time(bench_call_fn fn, void *arg, int nsets, int reps, bench_stats *out, char *err,
                   size_t cap);
/* memcpy bandwidth with `threads` threads on a buffer of `bytes` (read + write bytes / s, in
 * GB/s = 1e9 B/s); 0 when the buffers cannot be allocated. */
double bench_cpu_copy_gbps(int threads, size_t bytes, int reps);
const char *bench_cpu_name(void); /* CPU model from /proc/cpuinfo, or "cpu" */

/* ---- CPU baselines (baselines_cpu_<op>.c): the unfused chains, one OpenMP loop per pass ----- */
/* split (q, kv, pe -> three dense tensors; pe lands in job->k_pe), RMSNorm q (q_dense ->
 * job->q), RMSNorm kv (kv_dense -> job->k_nope). */
int blc_split_qk_norm(const mlaf_norm_job *job, void *q_dense, void *kv_dense, int threads);
/* RoPE in place on dense rows x [T, R] of dtype dt (row stride `stride` elements). */
int blc_rope_rows(void *x, mlaf_dtype dt, int64_t T, int64_t stride, const mlaf_rope_job *rope,
                  int threads);
/* Copies dense k_nope [T, C] and roped k_pe [T, R] rows into the paged cache at the slots. */
int blc_cache_write(const mlaf_kv_cache_job *job, const void *k_nope, const void *k_pe,
                    int threads);
/* The quantize-and-write pass of the unfused fp8 chains (docs/kv_formats.md), as engines run it after
 * the norm and RoPE kernels (vLLM's concat_and_cache_mla / concat_and_cache_ds_mla): reads dense
 * k_nope [T, C] and roped k_pe [T, R] rows (dtype job->norm.dt, rows contiguous) and slot_mapping,
 * and writes each token's record of job->format (MLAF_KV_FP8 or MLAF_KV_FP8_DS_MLA) at its slot:
 * fp8 e4m3(x / scale) or e4m3(x * scale) with job->scale read from backend memory; fp8_ds_mla
 * C e4m3 bytes + C/128 f32 tile scales (job->tile_scale) + R bf16 rope values; fp8_v4 (R = 0, the
 * rope tail inside k_nope) the planar page's data row and scale row. Tokens t >= n_map
 * and slots outside the cache are skipped (not counted). k: the fused op's CPU kernels
 * (mlaf_cpu_norm_kern), whose rounding, amax and e4m3 steps the pass uses too, so the
 * comparison is of the passes, not of the conversion code. */
int blc_cache_write_fp8(const mlaf_kv_cache_job *job, const void *k_nope, const void *k_pe,
                        int threads, const struct mlaf_norm_kern *k);
/* Whether the unfused chains have a quantize-and-write pass for cache format f (CPU: blc_*,
 * CUDA: blg_*); a format without one benches against the same-run copy only. */
int bl_cache_fmt_has_pass(mlaf_kv_format f);
/* rope_q's head_norm as its own pass (docs/mla.md, head_norm): every head of q RMS-normalized without weight
 * (eps job->head_eps), in place, rounded to q's dtype, by the fused op's sumsq and scale kernels
 * (k); blc_rope_q then rotates. */
int blc_head_norm(const mlaf_rope_q_job *job, int threads, const struct mlaf_norm_kern *k);
/* The DSA indexer key chain (docs/dsa.md) as engines' unfused pipelines run it: LayerNorm of index_k
 * into dense [T, 128] rows (latent dtype), RoPE of their first 64 columns, the Hadamard when on,
 * then the quantize-and-write pass into the block-planar index cache (tokens t >= n_map and
 * slots outside the cache skipped). The index cache bytes equal the fused op's. */
int blc_index_k(const mlaf_kv_cache_job *kv, const mlaf_index_job *ix, void *dense, int threads,
                const struct mlaf_norm_kern *k);
/* rms_norm_quant's unfused passes (baselines_cpu_rms_norm_quant.c). Dense only: the residual add as
 * a pass of its own (residual = round(x + residual)), then an RMSNorm pass from it into y. The
 * per-token-group quantize pass engines run after their norm: reads dense y [T, K] (dtype dt,
 * rows `stride` elements apart) and writes job->q's e4m3 bytes and scales, with the fused op's CPU
 * kernels k for the rounding, amax and e4m3 steps (so the comparison is of the passes). */
int blc_add_rmsnorm(const mlaf_rms_norm_quant_job *job, int threads);
int blc_gemm_quant(const mlaf_gemm_out_job *q, const void *y, mlaf_dtype dt, int64_t T, int64_t K, int64_t stride,
                   int threads, const struct mlaf_norm_kern *k);
/* gather the rope columns of q into dense [T*H, R], rotate, scatter back. */
int blc_rope_q(const mlaf_rope_q_job *job, void *gather, int threads);
/* score -> bias -> group scores -> group mask -> top-k -> gather -> normalize -> scale. */
typedef struct bench_moe_scratch {
    float *s;      /* [T, E] scores */
    float *c;      /* [T, E] biased scores */
    float *g;      /* [T, n_group] group scores */
    float *m;      /* [T, E] masked selection values */
    float *w;      /* [T, top_k] gathered weights */
} bench_moe_scratch;
int blc_moe_gate(const mlaf_moe_gate_job *job, const bench_moe_scratch *s, int threads);
/* hash routing (job->tid2eid): score -> ids = tid2eid[token_ids] -> gather -> normalize -> scale. */
int blc_moe_gate_hash(const mlaf_moe_gate_job *job, const bench_moe_scratch *s, int threads);

/* ---- CUDA harness and baselines (bench_cuda.cu, baselines_cuda_<op>.cu) ----------------------- */
#ifdef MLAF_WITH_CUDA
/* Creates the bench stream, the events and the L2 flush buffer (256 MB). */
int bcu_setup(char *err, size_t cap);
void bcu_teardown(void);
void *bcu_stream(void);           /* cudaStream_t */
const char *bcu_device_name(void);
int bcu_sync(char *err, size_t cap);
/* Stream mode (graph_calls == 0): per sample, flush L2 (not timed), then time one call with
 * events. Graph mode: capture graph_calls calls in a CUDA graph and time replays; the
 * reported time is per call. */
int bcu_time(bench_call_fn fn, void *arg, int reps, int graph_calls, bench_stats *out, char *err,
             size_t cap);
/* cudaMemcpyAsync device to device of `bytes` (>= 1 GB): read + write bytes / s in GB/s. */
int bcu_copy_gbps(size_t bytes, int reps, double *gbps, char *err, size_t cap);
/* A device-to-device copy of bytes / 2 (so bytes read + written), timed like an op by bcu_time
 * (stream: same flush and events; graph_calls > 0: the same graph replay). */
int bcu_copy_time(double bytes, int reps, int graph_calls, bench_stats *out, char *err, size_t cap);
/* The same bytes moved by SM copy kernels (no copy engines), timed like an op in stream mode:
 * the faster of the kinds this GPU has (see bench_cuda.cu), each checked once. */
int bcu_kcopy_time(double bytes, int reps, bench_stats *out, char *err, size_t cap);
/* rope_q's ceiling: n pieces of piece_bytes at byte off of rows pitch bytes apart (q's rope
 * columns) copied between two such buffers by SM kernels, the faster of two, stream mode. All
 * three in 16-byte units. */
int bcu_piece_copy_time(int64_t n, int64_t piece_bytes, int64_t pitch, int64_t off, int reps, bench_stats *out,
                        char *err, size_t cap);

int blg_split_qk_norm(const mlaf_norm_job *job, void *q_dense, void *kv_dense, void *stream);
int blg_rope_rows(void *x, mlaf_dtype dt, int64_t T, int64_t stride, const mlaf_rope_job *rope,
                  void *stream);
int blg_cache_write(const mlaf_kv_cache_job *job, const void *k_nope, const void *k_pe,
                    void *stream);
/* blc_cache_write_fp8 on the GPU: a warp per token, 16-byte loads where the rows allow them;
 * fp8_ds_mla tile amax by shuffles within each half-warp (a half-warp per 128-value tile);
 * fp8_v4 block amax by shuffles within groups of 8 lanes (8 lanes x 8 bf16 values per block). */
int blg_cache_write_fp8(const mlaf_kv_cache_job *job, const void *k_nope, const void *k_pe,
                        void *stream);
int blg_rope_q(const mlaf_rope_q_job *job, void *gather, void *stream);
int blg_head_norm(const mlaf_rope_q_job *job, void *stream);
/* blc_index_k on the GPU: a warp per token in each pass (baselines_cuda_mla_kv_cache_dsa.cu). */
int blg_index_k(const mlaf_kv_cache_job *kv, const mlaf_index_job *ix, void *dense, void *stream);
int blg_moe_gate(const mlaf_moe_gate_job *job, const bench_moe_scratch *s, void *stream);
int blg_moe_gate_hash(const mlaf_moe_gate_job *job, const bench_moe_scratch *s, void *stream);
/* rms_norm_quant's passes on the GPU (baselines_cuda_rms_norm_quant.cu): blc_add_rmsnorm's two kernels, and
 * the quantize pass after the dense op (a group on g / 8 lanes, SGLang's shape). */
int blg_add_rmsnorm(const mlaf_rms_norm_quant_job *job, void *stream);
int blg_gemm_quant(const mlaf_gemm_out_job *q, const void *y, mlaf_dtype dt, int64_t T, int64_t K, int64_t stride,
                   void *stream);
/* The blg_* functions return 0 or the cudaError_t of a failed launch; its text: */
const char *blg_error_string(int code);
#endif

#ifdef __cplusplus
}
#endif
#endif
