/*
 * mlafuse.h — fused memory-bound kernels for MLA-attention + MoE language models
 * (GLM-4.7-Flash, DeepSeek-V2 / V2-Lite / V3 / R1, Kimi-K2).
 *
 * This header and the four it includes (mlafuse/mla.h, mlafuse/dsa.h, mlafuse/moe.h,
 * mlafuse/quant.h) are the whole public C11 API and its manual: every function has its
 * contract beside it. Ops:
 *
 *   mlaf_split_qk_norm   latent [T, Q+C+R] -> q = rmsnorm(q part), k_nope = rmsnorm(kv part),
 *                        k_pe = copy of the rope part                         docs/mla.md
 *   mlaf_mla_kv_cache    the same, plus RoPE on k_pe and the paged KV-cache   docs/mla.md,
 *                        write, plain or fp8                                  docs/kv_formats.md
 *   mlaf_rope_q          RoPE in place on the rope columns of q [T, H, D]     docs/mla.md
 *   mlaf_mla_kv_cache_dsa  mla_kv_cache plus the DSA indexer key branch       docs/dsa.md
 *   mlaf_indexer_q       the DSA indexer query: RoPE, Hadamard, fp8, folded   docs/dsa.md
 *                        weights
 *   mlaf_moe_gate        MoE router: scores, bias, group mask, top-k,         docs/moe_gate.md
 *                        renormalize, scale, fused shared experts
 *   mlaf_moe_gate_hash   hash-routed MoE layer: ids from a token -> experts   docs/moe_gate.md
 *                        table, weights from the scores at those ids
 *   mlaf_rms_norm_quant  y = RMSNorm(x [+ residual]) * w, dense and / or in  docs/gemm_formats.md
 *                        an fp8 GEMM-input format (1x128 blocks, UE8M0,
 *                        MXFP8), the residual add written back in place
 *
 * The docs pages hold the same contract at more length, with the tolerances and the
 * performance method (docs/conventions.md).
 *
 * Conventions shared by every op
 * ------------------------------
 * - Every entry point returns an mlaf_status. The library never aborts, exits or prints.
 *   A rejected call writes nothing; mlaf_context_last_error() then holds a message that
 *   names the argument and the expected value, e.g.
 *   "latent.shape[1] = 1340, expected q_lora_rank + kv_lora_rank + rope_dim = 1344".
 * - Tensors are non-owning strided views (mlaf_tensor). Strides are in elements. The last
 *   dimension must be contiguous (stride 1); every other stride may be anything >= the
 *   extent it must step over (rows may be slices of a wider GEMM output). Offsets are 64-bit.
 * - Size limits (MLAF_ERR_LIMIT, naming the tensor): a non-empty view spans less than
 *   MLAF_MAX_VIEW_BYTES (2^62) bytes from its first element to one past its last, and every
 *   stride but the innermost steps less than 2^62 bytes (also that of a dim of extent 1). Every
 *   product of shapes and strides is checked before it is formed, so a view no memory could
 *   hold is rejected by its numbers alone, whatever its data pointer.
 * - Overlaps (MLAF_ERR_OVERLAP, naming both tensors): an output may share no byte with an
 *   input or another output, except the in-place forms an op documents. Two views are judged
 *   by the bytes their elements reach, not by their spans: views whose [first, last] byte
 *   ranges are apart are disjoint; else, with P the gcd of the byte steps of every outer dim
 *   of extent > 1 of both views, each view's rows (its innermost, contiguous dim) sit at one
 *   residue modulo P, and views whose row byte ranges are apart modulo P are disjoint. So
 *   column slices of one buffer are accepted, whatever the ndim, when their outer strides
 *   are equal (or multiples of a common pitch) and their columns apart: e.g. a cache as
 *   columns [0, C) and its kpe as columns [C, C + R) of one [num_blocks, block_size, C + R]
 *   buffer. Views that are disjoint only by which whole rows each takes, under pitches with a
 *   smaller gcd (rows {0, 1, 4, 5} and {2, 3, 6, 7} of one buffer as [2, 2, w] views; the
 *   even pages' columns [0, C) and the odd pages' columns [0, R)), are conservatively
 *   reported as overlapping; use separate buffers or column slices for those.
 * - A tensor argument passed as NULL is "absent"; only arguments documented as optional may
 *   be absent.
 * - Ops never allocate. On the CUDA backend they enqueue on the context's stream and return:
 *   no allocation, no synchronization, no host read of device memory, so they can be
 *   captured in a CUDA graph. All tensors of a CUDA call must live on the context's device.
 * - Both backends accept exactly the same arguments and reject exactly the same bad ones with
 *   the same status and message (one validation layer serves both).
 * - Arithmetic is fp32 with one rounding at each store. f16 / bf16 conversions round to
 *   nearest even. Sums of squares are accumulated in fp32 and never overflow in f16.
 * - Contexts are not thread-safe; use one context per thread. Distinct contexts are
 *   independent. mlaf_context_free(NULL) is a no-op.
 */
#ifndef MLAFUSE_H
#define MLAFUSE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(MLAF_BUILD_SHARED)
#define MLAF_API __declspec(dllexport)
#elif defined(__GNUC__)
#define MLAF_API __attribute__((visibility("default")))
#else
#define MLAF_API
#endif

/* ---------------------------------------------------------------------------------------
 * Version
 * ------------------------------------------------------------------------------------- */
#define MLAF_VERSION_MAJOR 0
#define MLAF_VERSION_MINOR 1
#define MLAF_VERSION_PATCH 0
#define MLAF_VERSION_NUMBER (MLAF_VERSION_MAJOR * 10000 + MLAF_VERSION_MINOR * 100 + MLAF_VERSION_PATCH)
#define MLAF_STR_(x) #x
#define MLAF_STR(x) MLAF_STR_(x)
#define MLAF_VERSION_STRING \
    MLAF_STR(MLAF_VERSION_MAJOR) "." MLAF_STR(MLAF_VERSION_MINOR) "." MLAF_STR(MLAF_VERSION_PATCH)

/* The version the library was built as; compare with MLAF_VERSION_NUMBER to detect a
 * header / library mismatch. */
MLAF_API unsigned mlaf_version_number(void);
MLAF_API const char *mlaf_version_string(void);

/* ---------------------------------------------------------------------------------------
 * Status codes (append-only; generated from one table)
 * ------------------------------------------------------------------------------------- */
#define MLAF_STATUS_TABLE(X)                                                                 \
    X(MLAF_OK, 0, "success")                                                                \
    X(MLAF_ERR_INVALID_ARGUMENT, 1, "invalid argument")                                     \
    X(MLAF_ERR_NULL_POINTER, 2, "required pointer is NULL")                                 \
    X(MLAF_ERR_SHAPE, 3, "tensor shape does not match the parameters")                      \
    X(MLAF_ERR_STRIDE, 4, "unsupported or inconsistent stride")                             \
    X(MLAF_ERR_DTYPE, 5, "unsupported dtype")                                               \
    X(MLAF_ERR_OVERLAP, 6, "buffers overlap outside the allowed in-place form")             \
    X(MLAF_ERR_LIMIT, 7, "parameter outside the supported range")                           \
    X(MLAF_ERR_BACKEND_UNAVAILABLE, 8, "backend not available on this machine or build")    \
    X(MLAF_ERR_UNSUPPORTED, 9, "operation not supported by this backend")                   \
    X(MLAF_ERR_DEVICE, 10, "device runtime error")                                          \
    X(MLAF_ERR_OUT_OF_MEMORY, 11, "out of host memory (context creation only)")

typedef enum mlaf_status {
#define MLAF_STATUS_ENUM_(name, value, msg) name = value,
    MLAF_STATUS_TABLE(MLAF_STATUS_ENUM_)
#undef MLAF_STATUS_ENUM_
    MLAF_STATUS_COUNT_
} mlaf_status;

/* "MLAF_ERR_SHAPE" and "tensor shape does not match the parameters"; unknown codes give
 * "MLAF_UNKNOWN_STATUS" / "unknown status". Never NULL. */
MLAF_API const char *mlaf_status_name(mlaf_status s);
MLAF_API const char *mlaf_status_message(mlaf_status s);

/* ---------------------------------------------------------------------------------------
 * Dtypes and tensor views
 * ------------------------------------------------------------------------------------- */
typedef enum mlaf_dtype {
    MLAF_F32 = 0,
    MLAF_F16 = 1,
    MLAF_BF16 = 2,
    MLAF_I32 = 3,
    MLAF_I64 = 4,
    MLAF_U8 = 5,       /* bytes: fp8 cache records (mla_kv_cache's cache formats) */
    MLAF_FP8_E4M3 = 6, /* e4m3 bytes (torch.float8_e4m3fn); caches only */
    MLAF_DTYPE_COUNT_
} mlaf_dtype;

MLAF_API size_t mlaf_dtype_size(mlaf_dtype t);      /* 0 for an unknown dtype */
MLAF_API const char *mlaf_dtype_name(mlaf_dtype t); /* "f32", "f16", "bf16", "i32", "i64", "u8", "fp8_e4m3" */

#define MLAF_MAX_DIMS 4
/* The most bytes one view may span, and the most one stride may step (see Conventions). */
#define MLAF_MAX_VIEW_BYTES ((int64_t)1 << 62)

/* A non-owning strided view. shape[i] and stride[i] for i < ndim; strides in elements;
 * stride[ndim-1] must be 1. The data pointer may be host or device memory depending on the
 * context's backend. Need not be aligned beyond the dtype's own alignment. */
typedef struct mlaf_tensor {
    void *data;
    mlaf_dtype dtype;
    int32_t ndim;
    int64_t shape[MLAF_MAX_DIMS];
    int64_t stride[MLAF_MAX_DIMS];
} mlaf_tensor;

static inline mlaf_tensor mlaf_tensor_1d(void *data, mlaf_dtype dt, int64_t n) {
    mlaf_tensor t = {data, dt, 1, {n, 0, 0, 0}, {1, 0, 0, 0}};
    return t;
}
/* rows x cols, row_stride elements between the starts of consecutive rows. */
static inline mlaf_tensor mlaf_tensor_2d(void *data, mlaf_dtype dt, int64_t rows, int64_t cols,
                                         int64_t row_stride) {
    mlaf_tensor t = {data, dt, 2, {rows, cols, 0, 0}, {row_stride, 1, 0, 0}};
    return t;
}
static inline mlaf_tensor mlaf_tensor_3d(void *data, mlaf_dtype dt, int64_t d0, int64_t d1,
                                         int64_t d2, int64_t s0, int64_t s1) {
    mlaf_tensor t = {data, dt, 3, {d0, d1, d2, 0}, {s0, s1, 1, 0}};
    return t;
}

/* ---------------------------------------------------------------------------------------
 * Context
 * ------------------------------------------------------------------------------------- */
typedef enum mlaf_backend {
    MLAF_BACKEND_CPU = 0,
    MLAF_BACKEND_CUDA = 1,
    MLAF_BACKEND_COUNT_
} mlaf_backend;

typedef enum mlaf_op {
    MLAF_OP_SPLIT_QK_NORM = 0,
    MLAF_OP_MLA_KV_CACHE = 1,
    MLAF_OP_ROPE_Q = 2,
    MLAF_OP_MOE_GATE = 3,
    MLAF_OP_INDEXER_Q = 4, /* mla_kv_cache's indexer branch is part of MLAF_OP_MLA_KV_CACHE */
    MLAF_OP_RMS_NORM_QUANT = 5,
    MLAF_OP_GEMM_QUANT = 6,
    MLAF_OP_COUNT_
} mlaf_op;

/* CPU instruction-set paths. AUTO picks the best the machine has (detected at run time);
 * the others force one path (tests and benchmarks use this). */
typedef enum mlaf_cpu_isa {
    MLAF_CPU_ISA_AUTO = 0,
    MLAF_CPU_ISA_SCALAR = 1, /* portable C, always present */
    MLAF_CPU_ISA_AVX2 = 2,   /* x86-64 AVX2 + FMA + F16C */
    MLAF_CPU_ISA_AVX512 = 3, /* x86-64 AVX-512 F/BW/VL */
    MLAF_CPU_ISA_COUNT_
} mlaf_cpu_isa;

typedef struct mlaf_context mlaf_context;

MLAF_API const char *mlaf_backend_name(mlaf_backend b); /* "cpu", "cuda" */
MLAF_API const char *mlaf_op_name(mlaf_op op); /* "split_qk_norm", "mla_kv_cache", ... */
/* 1 when the backend was built in and can run here (CUDA: a device is visible), else 0. */
MLAF_API int mlaf_backend_available(mlaf_backend b);
/* 1 when the backend implements the op, else 0. */
MLAF_API int mlaf_backend_supports(mlaf_backend b, mlaf_op op);

/* Creates a context for a backend. CPU: threads default to all cores, the best CPU path is
 * chosen by run-time detection. CUDA: device 0 (change it with mlaf_context_set_cuda_device)
 * and the legacy default stream (mlaf_context_set_cuda_stream).
 * Returns MLAF_ERR_BACKEND_UNAVAILABLE (and *out = NULL) when the backend cannot run here. */
MLAF_API mlaf_status mlaf_context_create(mlaf_context **out, mlaf_backend backend);
MLAF_API void mlaf_context_free(mlaf_context *ctx); /* NULL is a no-op */
MLAF_API mlaf_backend mlaf_context_backend(const mlaf_context *ctx);

/* CPU threads: the most a call may use; 0 = all cores the process may run on (the default, at
 * most MLAF_MAX_THREADS); < 0 is rejected (MLAF_ERR_INVALID_ARGUMENT) and so is more than
 * MLAF_MAX_THREADS (MLAF_ERR_LIMIT). A rejected call keeps the count.
 * How many a call uses: one per 256 KiB the call moves (inputs read + outputs written), at most
 * this count: a call under 512 KiB (e.g. split_qk_norm of 64 GLM-4.7-Flash tokens in bf16, 344 KB)
 * runs on the calling thread alone. Larger calls are cut into chunks of about 256 KiB that the
 * calling thread and the context's workers (threads started on the first such call, joined by
 * mlaf_context_free) claim one at a time; the calling thread never waits for a worker that has
 * not started, so a busy machine (more runnable threads than cores) slows a call to about its
 * one-thread time, not to a scheduler period. Results are bit-identical for every count. */
#define MLAF_MAX_THREADS 1024
MLAF_API mlaf_status mlaf_context_set_threads(mlaf_context *ctx, int threads);
MLAF_API int mlaf_context_threads(const mlaf_context *ctx); /* resolved count (>= 1) */
/* Force a CPU path; MLAF_ERR_UNSUPPORTED if this machine lacks it. */
MLAF_API mlaf_status mlaf_context_set_cpu_isa(mlaf_context *ctx, mlaf_cpu_isa isa);
MLAF_API mlaf_cpu_isa mlaf_context_cpu_isa(const mlaf_context *ctx); /* resolved path */
MLAF_API const char *mlaf_cpu_isa_name(mlaf_cpu_isa isa);
/* CUDA device ordinal and stream (a cudaStream_t passed as void*; NULL = legacy default). */
MLAF_API mlaf_status mlaf_context_set_cuda_device(mlaf_context *ctx, int device);
MLAF_API mlaf_status mlaf_context_set_cuda_stream(mlaf_context *ctx, void *stream);
/* Programmatic dependent launch (sm_90 and newer), off by default. On, every kernel of the
 * context's ops launches with the programmatic-stream-serialization attribute and, as its
 * first steps, waits for the kernels before it in the stream to complete and flush
 * (griddepcontrol.wait), then lets the kernel after it launch (launch_dependents). The ops'
 * results are unchanged; a launch overlaps the tail of the kernel before it, and in a CUDA
 * graph captured from the stream consecutive launches become programmatic edges. What a
 * caller may no longer assume: a kernel of its own launched after an op with that attribute
 * may start before the op has finished, so it must wait the same way before reading the op's
 * outputs (kernels launched without the attribute see plain stream order). Enabling on a
 * device below sm_90 is MLAF_ERR_UNSUPPORTED; on a device changed later to one below sm_90
 * the setting is kept and launches go without the attribute. Enabling on a context of another
 * backend is MLAF_ERR_INVALID_ARGUMENT; disabling (enable = 0) succeeds on every backend (a
 * no-op where PDL does not exist), so code that turns it off need not ask the backend first.
 * enable = 2 (early reads): as 1, and the MLA row ops (split_qk_norm, mla_kv_cache and its
 * formats, mla_kv_cache_dsa) at decode sizes (the one-block-per-row shapes) read their weights,
 * positions, slot_mapping and cos_sin rows, and write mla_kv_cache_dsa's top-k fill, BEFORE
 * waiting on the kernel before them: only the latent (and the indexer's index_k) is read after the
 * wait. So those tensors must not be written, nor the top-k buffer read, by the kernel launched
 * just before the op (in an engine: the q_a / kv_a GEMM, which never touches them). The saving is
 * the position -> cos_sin chain overlapping the previous kernel. Other values: INVALID_ARGUMENT. */
MLAF_API mlaf_status mlaf_context_set_cuda_pdl(mlaf_context *ctx, int enable);
MLAF_API int mlaf_context_cuda_pdl(const mlaf_context *ctx); /* the setting (0, 1 or 2) */

/* Message of the last failed call on this context ("" after a success). Never NULL; valid
 * until the next call on the context. */
MLAF_API const char *mlaf_context_last_error(const mlaf_context *ctx);

/* ---------------------------------------------------------------------------------------
 * Model presets (docs/models.md)
 * ------------------------------------------------------------------------------------- */
/* Router score s of a logit x (values append-only). SIGMOID: 1 / (1 + exp(-x)); SOFTMAX: over the
 * row's finite logits; SQRT_SOFTPLUS (DeepSeek-V4): s = sqrt(softplus(x)), softplus computed
 * without overflow. */
typedef enum mlaf_score_func {
    MLAF_SCORE_SIGMOID = 0,
    MLAF_SCORE_SOFTMAX = 1,
    MLAF_SCORE_SQRT_SOFTPLUS = 2
} mlaf_score_func;
/* "sigmoid", "softmax", "sqrt_softplus"; "unknown" for a value that is not a score function. */
MLAF_API const char *mlaf_score_func_name(mlaf_score_func f);
/* Group score for group-limited routing: sum of the two largest biased scores in the group
 * (DeepSeek-V3 "noaux_tc"), or the group's maximum (DeepSeek-V2 "group_limited_greedy"). */
typedef enum mlaf_group_score { MLAF_GROUP_TOP2_SUM = 0, MLAF_GROUP_MAX = 1 } mlaf_group_score;
/* RoPE pairs: (2i, 2i+1) interleaved (GPT-J; GLM-4.7-Flash and DeepSeek) or (i, i + R/2) NeoX.
 * NONE: the rope slot is kept but never rotated (Kimi-K3's mla_use_nope): its R values are
 * stored exactly as the other styles store rotated ones, positions and cos_sin are not read
 * (docs/mla.md, "The rope style none"). The DSA indexer and DeepSeek-V4's kv_rope_tail rotate
 * and reject it. */
typedef enum mlaf_rope_style { MLAF_ROPE_INTERLEAVED = 0, MLAF_ROPE_NEOX = 1, MLAF_ROPE_NONE = 2 } mlaf_rope_style;
/* "interleaved", "neox", "none"; "unknown" for a value that is not a style. */
MLAF_API const char *mlaf_rope_style_name(mlaf_rope_style s);

typedef struct mlaf_model_config {
    char name[64];
    int32_t q_lora_rank;      /* Q; 0 = no q LoRA (the latent row is the kv-a projection alone) */
    int32_t kv_lora_rank;     /* C > 0 */
    int32_t qk_rope_head_dim; /* R >= 0, even */
    int32_t qk_nope_head_dim;
    int32_t v_head_dim;
    int32_t num_heads;
    int32_t n_routed_experts; /* E */
    int32_t top_k;
    int32_t n_group;
    int32_t topk_group;
    mlaf_score_func score_func;
    mlaf_group_score group_score;
    int32_t has_score_bias;   /* e_score_correction_bias present */
    int32_t norm_topk_prob;   /* renormalize the top-k weights */
    float routed_scaling_factor;
    int32_t apply_routed_scaling; /* multiply the weights by the factor inside the router */
    float rms_norm_eps;
    int32_t n_shared_experts;
    mlaf_rope_style rope_style;
    /* DSA lightning indexer (GLM-5, DeepSeek-V3.2; docs/dsa.md); index_n_heads 0: none. Its key
     * and query rotate dims [0, 64) of each 128-wide head in index_rope_style (interleaved for
     * GLM-5, NeoX for DeepSeek-V3.2: a config's indexer_rope_interleave, absent = NeoX). */
    int32_t index_n_heads;
    int32_t index_head_dim;
    int32_t index_topk;
    mlaf_rope_style index_rope_style;
    /* DeepSeek-V4 (docs/models.md). kv_rope_tail: 0 for every MLA model; r > 0: the latent is
     * [Q | C] (qk_rope_head_dim = 0) and RoPE rotates the normalized kv values [C - r, C)
     * (V4: 64 of 512). n_hash_layers: the first n MoE layers route by mlaf_moe_gate_hash
     * (V4: 3), the others by mlaf_moe_gate. */
    int32_t kv_rope_tail;
    int32_t n_hash_layers;
} mlaf_model_config;

MLAF_API int mlaf_preset_count(void);
/* Preset i (0 <= i < count), NULL otherwise. Preset 0 is the default, glm-4.7-flash. */
MLAF_API const mlaf_model_config *mlaf_preset_at(int i);
/* By name, case-insensitive; "deepseek-r1" is an alias of "deepseek-v3". NULL if unknown. */
MLAF_API const mlaf_model_config *mlaf_preset_find(const char *name);

/* The ops, by family (each file holds its ops' contracts). */
#include "mlafuse/mla.h" /* split_qk_norm, RoPE tables, mla_kv_cache and its formats, rope_q */
#include "mlafuse/dsa.h" /* the DSA indexer: mla_kv_cache_dsa, indexer_q */
#include "mlafuse/moe.h" /* moe_gate, moe_gate_hash */
#include "mlafuse/quant.h" /* GEMM-input formats, rms_norm_quant */

#ifdef __cplusplus
}
#endif
#endif /* MLAFUSE_H */
