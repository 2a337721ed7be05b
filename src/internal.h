/*
 * internal.h — what every backend, the oracle, the tools and the tests share: the context,
 * the validated "jobs" each op hands to a backend, the backend table and the error helper.
 *
 * A job is the plain description of one validated call: raw pointers, 64-bit element
 * strides, dims and dtypes. The validation layer (validate.c) is the only producer of jobs,
 * so a backend can trust every field. Plain C, includable from the CUDA (.cu) sources.
 */
#ifndef MLAF_INTERNAL_H
#define MLAF_INTERNAL_H

#include "mlafuse.h"

#include <stdarg.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MLAF_ERR_CAP 512

struct mlaf_context {
    mlaf_backend backend;
    int threads_requested; /* 0 = all cores */
    int threads;           /* resolved, >= 1 */
    mlaf_cpu_isa isa;      /* resolved CPU path (never AUTO) */
    int cuda_device;
    void *cuda_stream;     /* cudaStream_t */
    int cuda_sm_count;     /* multiprocessors of cuda_device, read when the device is set */
    int cuda_cc;           /* its compute capability, major * 10 + minor (90 = sm_90) */
    int cuda_pdl;          /* programmatic dependent launch requested (mlaf_context_set_cuda_pdl): 0, 1 or 2 */
    void *cpu_pool;        /* the CPU backend's worker pool, created on first use (src/cpu/parallel.c) */
    char err[MLAF_ERR_CAP];
};

/* Records a message on the context (if any) and returns status; printf-style. */
mlaf_status mlaf_fail(mlaf_context *ctx, mlaf_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* ---- jobs ------------------------------------------------------------------------------ */

/* One quantized GEMM-input output (include/mlafuse/quant.h, src/gemm_format.h), validated. */
typedef struct mlaf_gemm_out_job {
    mlaf_gemm_format format; /* MLAF_GEMM_NONE: no quantized output (the fields below unused) */
    mlaf_gemm_scale scale;
    float eps;               /* resolved: never 0 */
    int32_t group;           /* g: 128 or 32 */
    uint8_t *data;           /* [T, K] e4m3 bytes */
    int64_t data_stride;     /* bytes */
    void *scales;            /* the format's scales tensor */
    int64_t scale_ld;        /* its leading stride, in elements of its dtype */
} mlaf_gemm_out_job;

/* split + two RMSNorms + k_pe copy; also the first half of mla_kv_cache. */
typedef struct mlaf_norm_job {
    int64_t T;
    int32_t Q, C, R;
    float eps_q, eps_kv;
    mlaf_dtype dt;           /* latent and the dense outputs */
    const void *latent;      /* [T, Q+C+R] */
    int64_t latent_stride;
    const void *w_q;         /* [Q] or NULL when Q == 0 */
    mlaf_dtype w_q_dt;       /* dt or MLAF_F32 */
    const void *w_kv;        /* [C] */
    mlaf_dtype w_kv_dt;
    void *q;                 /* [T, Q] or NULL (Q == 0, or q_norm only quantized) */
    int64_t q_stride;
    void *k_nope;            /* [T, C] or NULL (mla_kv_cache's optional one, or k_nope only quantized) */
    int64_t k_nope_stride;
    void *k_pe;              /* [T, R] or NULL */
    int64_t k_pe_stride;
    mlaf_gemm_out_job qq;    /* q_norm quantized (format NONE: none; include/mlafuse/quant.h) */
    mlaf_gemm_out_job kq;    /* k_nope quantized (NONE: none) */
} mlaf_norm_job;

typedef struct mlaf_rope_job {
    int32_t R;               /* even; 0 only inside mla_kv_cache (then nothing rotates) */
    mlaf_rope_style style;
    const void *positions;   /* [T] */
    mlaf_dtype pos_dt;       /* I32 or I64 */
    const float *cos_sin;    /* [max_pos, R] */
    int64_t cos_sin_stride;
    int64_t max_pos;
} mlaf_rope_job;

typedef struct mlaf_kv_cache_job {
    mlaf_norm_job norm;      /* k_nope / k_pe are the optional dense outputs (k_pe roped) */
    mlaf_rope_job rope;
    const void *slots;       /* [n_map] */
    mlaf_dtype slot_dt;      /* I32 or I64 */
    int64_t n_map;           /* slot_mapping entries, <= T: rows t >= n_map take slot -1 */
    mlaf_kv_format format;
    void *cache;             /* [num_blocks, block_size, record]: record C + R values (plain /
                                fp8; C with kpe), or the fp8_ds_mla bytes */
    mlaf_dtype cache_dt;     /* plain: F32 / F16 / BF16; fp8 formats: U8 or FP8_E4M3 */
    int64_t num_blocks, block_size;
    int64_t cache_s0, cache_s1;
    void *kpe;               /* plain / fp8: the rope part's own [num_blocks, block_size, R], or NULL */
    int64_t kpe_s0, kpe_s1;
    const float *scale;      /* fp8: [1] */
    mlaf_fp8_conv conv;      /* fp8 */
    float *amax_out;         /* fp8: [1] or NULL */
    mlaf_tile_scale tile_scale; /* fp8_ds_mla */
    int32_t *error_count;    /* or NULL */
    int32_t kv_tail;         /* kv_rope_tail r: values [C - r, C) of the kv part rotated (norm.R == 0,
                                rope.R == r); 0: none */
} mlaf_kv_cache_job;

/* The DSA indexer key branch of mla_kv_cache (docs/dsa.md); rides with a mlaf_kv_cache_job whose
 * rope (R = 64), slots and block_size it shares. */
typedef struct mlaf_index_job {
    mlaf_rope_style style;
    int32_t hadamard;
    float ln_eps, amax_eps;
    mlaf_index_scale scale;
    const void *k;           /* [T, 128] in the latent dtype (job.norm.dt) */
    int64_t k_stride;
    const void *w, *b;       /* [128] each */
    mlaf_dtype w_dt;         /* F32 or the latent dtype */
    uint8_t *cache;          /* [num_blocks, >= 132 block_size] bytes, block-planar */
    int64_t block_stride;    /* bytes */
    void *out;               /* [T, 128] latent dtype, or NULL; may be k itself */
    int64_t out_stride;
    int32_t *topk;           /* [T, topk_n] i32, or NULL */
    int64_t topk_stride, topk_n;
    int32_t copies;          /* >= 1 caches at cache + k * copy_stride bytes */
    int64_t copy_stride;
} mlaf_index_job;

/* indexer_q (docs/dsa.md). */
typedef struct mlaf_indexer_q_job {
    mlaf_rope_job rope;      /* R = 64, style = the indexer's */
    mlaf_index_scale scale;
    int32_t hadamard;
    float amax_eps;
    int64_t T, H;
    mlaf_dtype dt;           /* q_idx */
    const void *q;
    int64_t q_s0, q_s1;
    const void *w;           /* [T, H] */
    mlaf_dtype w_dt;         /* F32 or dt */
    int64_t w_stride;
    uint8_t *q_fp8;
    int64_t f_s0, f_s1;
    float *w_out;
    int64_t wo_stride;
    float w_fold;            /* f32(128^-0.5) */
    float h_fold;            /* f32(H^-0.5) */
    /* the MLA q_pe rotated in place in the same launch (NULL: none) */
    void *q_pe;
    mlaf_dtype pe_dt;
    int64_t pe_H, pe_s0, pe_s1;
    int32_t pe_D;
    mlaf_rope_style pe_style;
    int32_t *error_count;
} mlaf_indexer_q_job;

typedef struct mlaf_rope_q_job {
    mlaf_rope_job rope;
    int64_t T, H;
    int32_t D;               /* head dim; the rope part is columns [D-R, D) */
    void *q;
    mlaf_dtype dt;
    int64_t s0, s1;
    int32_t *error_count;
    int32_t head_norm;       /* weightless RMSNorm of each head first (eps below) */
    float head_eps;
    void *q_out;             /* [T, Hpad, D] or NULL (in place) */
    int64_t Hpad, o0, o1;
} mlaf_rope_q_job;

typedef struct mlaf_moe_gate_job {
    int64_t T;
    int32_t E;
    int32_t top_k, n_group, topk_group, n_shared;
    int32_t K;               /* top_k + n_shared: the output width */
    mlaf_score_func score_func;
    mlaf_group_score group_score;
    int32_t renormalize, apply_scaling;
    float scaling, eps;
    const void *logits;
    mlaf_dtype logits_dt;
    int64_t logits_stride;
    const float *bias;       /* [E] or NULL */
    void *weights;
    mlaf_dtype weights_dt;   /* F32 or logits_dt */
    int64_t weights_stride;
    int32_t *ids;
    int64_t ids_stride;
    float *scores;           /* [T, E] or NULL */
    int64_t scores_stride;
    /* mlaf_moe_gate_hash only (tid2eid NULL for mlaf_moe_gate; bias is NULL then) */
    const void *tid2eid;     /* [vocab, top_k] */
    mlaf_dtype tid2eid_dt;   /* I32 or I64 */
    int64_t tid2eid_stride;
    int64_t vocab;           /* >= 1 */
    const void *token_ids;   /* [T] */
    mlaf_dtype token_ids_dt; /* I32 or I64 */
    int32_t *error_count;    /* or NULL */
} mlaf_moe_gate_job;

/* rms_norm_quant (include/mlafuse/quant.h): y = RMSNorm(x [+ residual]) * w, dense and / or
 * quantized. */
typedef struct mlaf_rms_norm_quant_job {
    int64_t T;
    int32_t K;
    float eps;
    mlaf_dtype dt;           /* x, residual, y */
    const void *x;           /* [T, K] */
    int64_t x_stride;
    void *residual;          /* [T, K] in / out (the rounded sum), or NULL */
    int64_t r_stride;
    const void *w;           /* [K] */
    mlaf_dtype w_dt;         /* dt or MLAF_F32 */
    void *y;                 /* [T, K] or NULL; may be x itself (the in-place form) */
    int64_t y_stride;
    mlaf_gemm_out_job q;     /* format NONE: none */
} mlaf_rms_norm_quant_job;

/* gemm_quant (include/mlafuse/quant.h): x quantized into q's format, values as stored. */
typedef struct mlaf_gemm_quant_job {
    int64_t T;
    int32_t K;
    mlaf_dtype dt;           /* x */
    const void *x;           /* [T, K] */
    int64_t x_stride;        /* elements */
    mlaf_gemm_out_job q;     /* never NONE */
} mlaf_gemm_quant_job;

/* ---- validation (validate.c): the one layer every backend goes through -------------------
 * Each returns MLAF_OK and fills *job, or records a message on ctx and returns the error. */
mlaf_status mlaf_check_split_qk_norm(mlaf_context *ctx, const mlaf_split_qk_norm_params *p,
                                     const mlaf_tensor *latent, const mlaf_tensor *w_q,
                                     const mlaf_tensor *w_kv, const mlaf_tensor *q,
                                     const mlaf_tensor *k_nope, const mlaf_tensor *k_pe,
                                     mlaf_norm_job *job);
mlaf_status mlaf_check_mla_kv_cache(mlaf_context *ctx, const mlaf_mla_kv_cache_params *p,
                                    const mlaf_tensor *latent, const mlaf_tensor *w_q,
                                    const mlaf_tensor *w_kv, const mlaf_tensor *positions,
                                    const mlaf_tensor *cos_sin, const mlaf_tensor *slot_mapping,
                                    const mlaf_kv_cache_desc *cache, const mlaf_tensor *q,
                                    const mlaf_tensor *k_nope, const mlaf_tensor *k_pe,
                                    const mlaf_tensor *error_count, mlaf_kv_cache_job *job);
/* The same with the row ops' quantized outputs (rq NULL: none); then mlaf_check_row_quant fills
 * job->qq / kq after checking them against every other tensor of the call (`others`, NULLs skipped;
 * validate_quant.c). */
mlaf_status mlaf_check_split_qk_norm_q(mlaf_context *ctx, const mlaf_split_qk_norm_params *p,
                                       const mlaf_tensor *latent, const mlaf_tensor *w_q,
                                       const mlaf_tensor *w_kv, const mlaf_tensor *q,
                                       const mlaf_tensor *k_nope, const mlaf_tensor *k_pe,
                                       const mlaf_row_quant *rq, mlaf_norm_job *job);
mlaf_status mlaf_check_mla_kv_cache_q(mlaf_context *ctx, const mlaf_mla_kv_cache_params *p,
                                      const mlaf_tensor *latent, const mlaf_tensor *w_q,
                                      const mlaf_tensor *w_kv, const mlaf_tensor *positions,
                                      const mlaf_tensor *cos_sin, const mlaf_tensor *slot_mapping,
                                      const mlaf_kv_cache_desc *cache, const mlaf_tensor *q,
                                      const mlaf_tensor *k_nope, const mlaf_tensor *k_pe,
                                      const mlaf_tensor *error_count, const mlaf_row_quant *rq,
                                      mlaf_kv_cache_job *job);
mlaf_status mlaf_check_row_quant(mlaf_context *ctx, const mlaf_row_quant *rq, int32_t tail,
                                 const mlaf_tensor *const *others, const char *const *names, int n,
                                 mlaf_norm_job *job);
/* The plain cache description of mlaf_mla_kv_cache's kv_cache. */
static inline mlaf_kv_cache_desc mlaf_kv_desc_plain(const mlaf_tensor *kv_cache) {
    mlaf_kv_cache_desc d = {MLAF_KV_PLAIN, kv_cache, NULL, NULL, NULL, MLAF_FP8_DIV, MLAF_TILE_AMAX};
    return d;
}
/* The indexer key branch (validate_dsa.c), after mlaf_check_mla_kv_cache filled kv. */
mlaf_status mlaf_check_indexer_k(mlaf_context *ctx, const mlaf_indexer_params *ip, const mlaf_indexer_k *ik,
                                 const mlaf_mla_kv_cache_params *p, const mlaf_tensor *latent,
                                 const mlaf_tensor *w_q, const mlaf_tensor *w_kv,
                                 const mlaf_tensor *positions, const mlaf_tensor *cos_sin,
                                 const mlaf_tensor *slot_mapping, const mlaf_kv_cache_desc *cache,
                                 const mlaf_tensor *q, const mlaf_tensor *k_nope, const mlaf_tensor *k_pe,
                                 const mlaf_tensor *error_count, const mlaf_kv_cache_job *kv, mlaf_index_job *job);
/* The row ops' quantized outputs apart from the indexer's tensors and index caches (validate_dsa.c). */
mlaf_status mlaf_check_index_apart(mlaf_context *ctx, const mlaf_indexer_k *ik, const mlaf_norm_job *job,
                                   const mlaf_row_quant *rq);
mlaf_status mlaf_check_indexer_q(mlaf_context *ctx, const mlaf_indexer_params *ip, const mlaf_tensor *q_idx,
                                 const mlaf_tensor *positions, const mlaf_tensor *cos_sin, const mlaf_tensor *w,
                                 const mlaf_tensor *q_fp8, const mlaf_tensor *w_out, const mlaf_tensor *q_pe,
                                 const mlaf_rope_params *q_pe_rope, const mlaf_tensor *error_count,
                                 mlaf_indexer_q_job *job);
/* Shared checks of validate.c, for validate_dsa.c and validate_hash.c. shape[i] < 0 in want:
 * any extent. */
mlaf_status mlaf_vcheck_error_count(mlaf_context *ctx, const mlaf_tensor *ec);
mlaf_status mlaf_vcheck_tensor(mlaf_context *ctx, const mlaf_tensor *t, const char *name, unsigned dtypes, int ndim,
                               const int64_t *want, const char *const *want_expr);
mlaf_status mlaf_vcheck_no_overlap(mlaf_context *ctx, const mlaf_tensor *out, const char *out_name,
                                   const mlaf_tensor *other, const char *other_name);
/* One [num_blocks, block_size, width] cache view of dtypes `dtypes` (width < 0: any). */
mlaf_status mlaf_vcheck_cache_view(mlaf_context *ctx, const mlaf_tensor *t, const char *name, unsigned dtypes,
                                   int64_t width, const char *width_expr);
mlaf_status mlaf_vcheck_rope_inputs(mlaf_context *ctx, int32_t R, mlaf_rope_style style, int64_t T,
                                    const mlaf_tensor *positions, const mlaf_tensor *cos_sin, mlaf_rope_job *rope);

mlaf_status mlaf_check_rope_q(mlaf_context *ctx, const mlaf_rope_params *p, const mlaf_tensor *q,
                              const mlaf_tensor *positions, const mlaf_tensor *cos_sin,
                              const mlaf_tensor *error_count, mlaf_rope_q_job *job);
/* rope_q with its optional q_out (NULL: in place): docs/mla.md, head_norm. */
mlaf_status mlaf_check_rope_q_out(mlaf_context *ctx, const mlaf_rope_params *p, const mlaf_tensor *q,
                                  const mlaf_tensor *positions, const mlaf_tensor *cos_sin,
                                  const mlaf_tensor *q_out, const mlaf_tensor *error_count,
                                  mlaf_rope_q_job *job);
mlaf_status mlaf_check_moe_gate(mlaf_context *ctx, const mlaf_moe_gate_params *p,
                                const mlaf_tensor *logits, const mlaf_tensor *bias,
                                const mlaf_tensor *weights, const mlaf_tensor *ids,
                                const mlaf_tensor *scores, mlaf_moe_gate_job *job);
mlaf_status mlaf_check_moe_gate_hash(mlaf_context *ctx, const mlaf_moe_gate_params *p,
                                     const mlaf_tensor *logits, const mlaf_tensor *tid2eid,
                                     const mlaf_tensor *token_ids, const mlaf_tensor *weights,
                                     const mlaf_tensor *ids, const mlaf_tensor *scores,
                                     const mlaf_tensor *error_count, mlaf_moe_gate_job *job);
/* rms_norm_quant (validate_quant.c). */
mlaf_status mlaf_check_rms_norm_quant(mlaf_context *ctx, const mlaf_rms_norm_quant_params *p, const mlaf_tensor *x,
                                      const mlaf_tensor *residual, const mlaf_tensor *weight, const mlaf_tensor *y,
                                      const mlaf_gemm_out *q, mlaf_rms_norm_quant_job *job);
/* gemm_quant (validate_quant.c). */
mlaf_status mlaf_check_gemm_quant(mlaf_context *ctx, const mlaf_tensor *x, const mlaf_gemm_out *q,
                                  mlaf_gemm_quant_job *job);

/* ---- backends -------------------------------------------------------------------------- */
typedef struct mlaf_backend_iface {
    mlaf_status (*split_qk_norm)(mlaf_context *ctx, const mlaf_norm_job *job);
    mlaf_status (*mla_kv_cache)(mlaf_context *ctx, const mlaf_kv_cache_job *job);
    mlaf_status (*rope_q)(mlaf_context *ctx, const mlaf_rope_q_job *job);
    /* both mlaf_moe_gate and mlaf_moe_gate_hash (job->tid2eid set) */
    mlaf_status (*moe_gate)(mlaf_context *ctx, const mlaf_moe_gate_job *job);
    /* mla_kv_cache with the DSA indexer key branch in the same pass */
    mlaf_status (*mla_kv_cache_dsa)(mlaf_context *ctx, const mlaf_kv_cache_job *job, const mlaf_index_job *ix);
    mlaf_status (*indexer_q)(mlaf_context *ctx, const mlaf_indexer_q_job *job);
    mlaf_status (*rms_norm_quant)(mlaf_context *ctx, const mlaf_rms_norm_quant_job *job);
    mlaf_status (*gemm_quant)(mlaf_context *ctx, const mlaf_gemm_quant_job *job);
} mlaf_backend_iface;

/* CPU backend (src/cpu/). Entries are NULL for ops not implemented yet. */
extern const mlaf_backend_iface mlaf_cpu_backend;
int mlaf_cpu_isa_supported(mlaf_cpu_isa isa); /* what this machine can run */
int mlaf_cpu_core_count(void);
/* Stops and joins the context's CPU workers, if any (src/cpu/parallel.c; mlaf_context_free). */
void mlaf_cpu_pool_free(mlaf_context *ctx);

/* Adds n invalid tokens to a caller's optional error counter (NULL: none), saturating at
 * INT32_MAX: a counter that reaches it stays there rather than wrapping (the header's
 * promise). The host-side form; CUDA kernels use mlaf_cuda_error_count_add. */
static inline void mlaf_error_count_add(int32_t *ec, int64_t n) {
    if (!ec || n <= 0) return;
    const int64_t v = (int64_t)*ec + (n < INT32_MAX ? n : INT32_MAX);
    *ec = v > INT32_MAX ? INT32_MAX : (int32_t)v;
}

/* Division by a fixed d, 1 <= d < 2^31, as one multiply and shift (the CUDA kernels' cache-slot
 * addressing, slot / block_size): with s = ceil(log2 d) and m = ceil(2^(31+s) / d),
 * floor(n / d) = (n * m) >> (31 + s) for every 0 <= n < 2^31. Proof: m d - 2^(31+s) = e < d <= 2^s,
 * so n m / 2^(31+s) = n / d + n e / (d 2^(31+s)) with n e / 2^(31+s) < 1, which cannot carry
 * past n mod d <= d - 1; and n m < 2^31 * 2^32 fits 64 bits. Returns 0 for d out of range. */
static inline int mlaf_div_magic(int64_t d, uint64_t *mul, int32_t *shift) {
    if (d < 1 || d >= ((int64_t)1 << 31)) return 0;
    int s = 0;
    while (((uint64_t)1 << s) < (uint64_t)d) s++;
    *mul = (((uint64_t)1 << (31 + s)) + (uint64_t)d - 1) / (uint64_t)d;
    *shift = 31 + s;
    return 1;
}

/* CUDA backend (src/cuda/, built only when MLAF_WITH_CUDA). */
#ifdef MLAF_WITH_CUDA
extern const mlaf_backend_iface mlaf_cuda_backend;
int mlaf_cuda_device_count(void);               /* 0 when no device or no driver */
/* Reads the device's attributes (sm count) into ctx; MLAF_ERR_DEVICE on failure. */
mlaf_status mlaf_cuda_bind_device(mlaf_context *ctx, int device);
#endif

/* ---- memory helpers for tools and tests (not public API) --------------------------------
 * Backend memory: device memory for CUDA, malloc for CPU. Copies are synchronous. */
mlaf_status mlaf_mem_alloc(mlaf_backend b, void **p, size_t bytes);
void mlaf_mem_free(mlaf_backend b, void *p);
mlaf_status mlaf_mem_upload(mlaf_backend b, void *dst, const void *src_host, size_t bytes);
mlaf_status mlaf_mem_download(mlaf_backend b, void *dst_host, const void *src, size_t bytes);
/* Waits for the context's stream (CUDA) and reports an asynchronous error; CPU: MLAF_OK. */
mlaf_status mlaf_context_sync(mlaf_context *ctx);

#ifdef MLAF_WITH_CUDA
mlaf_status mlaf_cuda_mem_alloc(void **p, size_t bytes);
void mlaf_cuda_mem_free(void *p);
mlaf_status mlaf_cuda_mem_copy(void *dst, const void *src, size_t bytes, int to_device);
mlaf_status mlaf_cuda_sync(mlaf_context *ctx);
#endif

#ifdef __cplusplus
}
#endif
#endif /* MLAF_INTERNAL_H */
