/*
 * mlafuse.h — fused memory-bound kernels for MLA-attention + MoE language models
 * (GLM-4.7-Flash, DeepSeek-V2 / V2-Lite / V3 / R1, Kimi-K2).
 *
 * This header is the whole public C11 API and its manual: every function has its
 * contract beside it. Ops:
 *
 *   mlaf_split_qk_norm   latent [T, Q+C+R] -> q = rmsnorm(q part), k_nope = rmsnorm(kv part),
 *                        k_pe = copy of the rope part                              (SPEC §2)
 *   mlaf_mla_kv_cache    the same, plus RoPE on k_pe and the paged KV-cache write  (SPEC §3)
 *   mlaf_rope_q          RoPE in place on the rope columns of q [T, H, D]          (SPEC §3)
 *   mlaf_mla_kv_cache_dsa  mla_kv_cache plus the DSA indexer key branch           (SPEC §10)
 *   mlaf_indexer_q       the DSA indexer query: RoPE, Hadamard, fp8, folded weights (SPEC §10)
 *   mlaf_moe_gate        MoE router: scores, bias, group mask, top-k, renormalize,
 *                        scale, fused shared experts                               (SPEC §4)
 *   mlaf_moe_gate_hash   hash-routed MoE layer: ids from a token -> experts table, weights
 *                        from the scores at those ids                              (SPEC §11)
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

/* CPU threads; 0 = all cores (the default, at most MLAF_MAX_THREADS); < 0 is rejected
 * (MLAF_ERR_INVALID_ARGUMENT) and so is more than MLAF_MAX_THREADS (MLAF_ERR_LIMIT: OpenMP
 * runtimes end the process when a team cannot be created). A rejected call keeps the count. */
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
 * the setting is kept and launches go without the attribute. */
MLAF_API mlaf_status mlaf_context_set_cuda_pdl(mlaf_context *ctx, int enable);
MLAF_API int mlaf_context_cuda_pdl(const mlaf_context *ctx); /* 1 when enabled, else 0 */

/* Message of the last failed call on this context ("" after a success). Never NULL; valid
 * until the next call on the context. */
MLAF_API const char *mlaf_context_last_error(const mlaf_context *ctx);

/* ---------------------------------------------------------------------------------------
 * Model presets (SPEC §1)
 * ------------------------------------------------------------------------------------- */
/* SQRT_SOFTPLUS (DeepSeek-V4): s = sqrt(softplus(x)), softplus computed without overflow. */
typedef enum mlaf_score_func {
    MLAF_SCORE_SIGMOID = 0,
    MLAF_SCORE_SOFTMAX = 1,
    MLAF_SCORE_SQRT_SOFTPLUS = 2
} mlaf_score_func;
/* Group score for group-limited routing: sum of the two largest biased scores in the group
 * (DeepSeek-V3 "noaux_tc"), or the group's maximum (DeepSeek-V2 "group_limited_greedy"). */
typedef enum mlaf_group_score { MLAF_GROUP_TOP2_SUM = 0, MLAF_GROUP_MAX = 1 } mlaf_group_score;
/* RoPE pairs: (2i, 2i+1) interleaved (GPT-J; GLM-4.7-Flash and DeepSeek) or (i, i + R/2) NeoX. */
typedef enum mlaf_rope_style { MLAF_ROPE_INTERLEAVED = 0, MLAF_ROPE_NEOX = 1 } mlaf_rope_style;

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
    /* DSA lightning indexer (SPEC §1, §10: GLM-5, DeepSeek-V3.2); index_n_heads 0: none. Its key
     * and query rotate dims [0, 64) of each 128-wide head in index_rope_style (interleaved for
     * GLM-5, NeoX for DeepSeek-V3.2: a config's indexer_rope_interleave, absent = NeoX). */
    int32_t index_n_heads;
    int32_t index_head_dim;
    int32_t index_topk;
    mlaf_rope_style index_rope_style;
    /* DeepSeek-V4 (SPEC §1, §11). kv_rope_tail: 0 for every MLA model; r > 0: the latent is
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

/* ---------------------------------------------------------------------------------------
 * split_qk_norm (SPEC §2)
 *
 *   latent [T, Q + C + R]        f32 | f16 | bf16, rows strided
 *   w_q    [Q]                   latent's dtype or f32; absent iff Q == 0
 *   w_kv   [C]                   latent's dtype or f32
 *   q      [T, Q]    (output)    latent's dtype; absent iff Q == 0
 *   k_nope [T, C]    (output)    latent's dtype
 *   k_pe   [T, R]    (output)    latent's dtype; optional (absent: not written)
 *
 *   q[t,i]      = L[t,i]     * rstd_q(t)  * w_q[i],  rstd_q  = 1/sqrt(mean_i L[t,i]^2 + eps_q)
 *   k_nope[t,j] = L[t,Q+j]   * rstd_kv(t) * w_kv[j], rstd_kv = 1/sqrt(mean_j L[t,Q+j]^2 + eps_kv)
 *   k_pe[t,r]   = L[t,Q+C+r] (bit-exact)
 *
 * In place (the context-parallel path): q, k_nope and k_pe may be exactly the latent's own q,
 * kv and pe columns (same data offset, same row stride, same T); afterwards the latent row
 * holds [q_norm | k_nope_norm | k_pe]. Any other overlap of an output with an input or with
 * another output is MLAF_ERR_OVERLAP. T = 0 is a valid no-op; T < 2^31.
 * eps_q and eps_kv must be finite and > 0.
 * ------------------------------------------------------------------------------------- */
typedef struct mlaf_split_qk_norm_params {
    int32_t q_lora_rank;  /* Q >= 0 */
    int32_t kv_lora_rank; /* C > 0 */
    int32_t rope_dim;     /* R >= 0 */
    float eps_q;
    float eps_kv;
    /* DeepSeek-V4's rope inside the kv part (SPEC §11): must be 0 here. split_qk_norm has no
     * positions to rotate with, so a nonzero value is rejected (MLAF_ERR_INVALID_ARGUMENT);
     * mla_kv_cache takes it (its dense k_nope output is then the normalized, rope-tailed kv). */
    int32_t kv_rope_tail;
} mlaf_split_qk_norm_params;

MLAF_API mlaf_status mlaf_split_qk_norm(mlaf_context *ctx, const mlaf_split_qk_norm_params *p,
                                        const mlaf_tensor *latent, const mlaf_tensor *w_q,
                                        const mlaf_tensor *w_kv, const mlaf_tensor *q,
                                        const mlaf_tensor *k_nope, const mlaf_tensor *k_pe);

/* ---------------------------------------------------------------------------------------
 * RoPE tables (SPEC §3), shared by mla_kv_cache and rope_q
 *
 *   positions [T]             i32 | i64; each in [0, max_pos), else the token is rejected
 *                             by the kernel as described per op
 *   cos_sin   [max_pos, R]    f32, row p = [cos(p*f_0) .. cos(p*f_{R/2-1}) | sin(...) ]
 *
 *   interleaved: (x[2i], x[2i+1]) -> (x0*c_i - x1*s_i, x1*c_i + x0*s_i)
 *   neox:        (x[i], x[i+R/2]) -> same formula
 * The rotation is computed as separate fp32 products and one add / subtract (no fused
 * multiply-add), identically in mla_kv_cache and rope_q and on every backend, so a key and a
 * query rotated for the same position agree bit for bit.
 * A position outside [0, max_pos) cannot be looked up; such a token is counted in the op's
 * optional error counter and its rope values are not written (see each op).
 * ------------------------------------------------------------------------------------- */
typedef struct mlaf_rope_params {
    int32_t rope_dim;        /* R > 0, even */
    mlaf_rope_style style;
    /* rope_q only. head_norm nonzero (DeepSeek-V4's q, SPEC §11): each head's D values are first
     * RMS-normalized without weight, y = x * rstd with rstd = 1 / sqrt(mean(x^2) + head_norm_eps)
     * in fp32, then the last R values of y are rotated in fp32, and every value is rounded once
     * to q's dtype. head_norm_eps: 0 means the default 1e-6; else finite and > 0. */
    int32_t head_norm;
    float head_norm_eps;
} mlaf_rope_params;

/* Builds a cos_sin table on the host: cos_sin[p, i] = cos(p * base^(-2i/R)),
 * cos_sin[p, R/2 + i] = sin(...), computed in double and rounded once to f32.
 * table must hold max_pos * rope_dim floats. Scaled tables (YaRN): mlaf_rope_table_init_scaled
 * below; the ops accept any table of this layout. */
MLAF_API mlaf_status mlaf_rope_table_init(float *table, int64_t max_pos, int32_t rope_dim,
                                          double base);

/* RoPE scaling for long contexts. YaRN as DeepSeek-V2 / V3 / R1, Kimi-K2 and Hugging Face
 * transformers build it (config.json "rope_scaling": {"type": "yarn", ...}). With R = rope_dim,
 * i < R/2 and all arithmetic in double:
 *
 *   f_extra(i) = base^(-2i/R)                       the unscaled frequency
 *   f_inter(i) = f_extra(i) / factor                interpolated for the longer context
 *   d(beta)    = R * ln(original_max_position_embeddings / (2 pi beta)) / (2 ln base)
 *   low = d(beta_fast), high = d(beta_slow); when truncate: low = floor(low), high = ceil(high);
 *   low = max(low, 0), high = min(high, R - 1); if low == high: high += 0.001
 *   ramp(i)    = clamp((i - low) / (high - low), 0, 1)
 *   f(i)       = f_inter(i) * ramp(i) + f_extra(i) * (1 - ramp(i))
 *   cos_sin[p, i] = cos(p * f(i)) * a,  cos_sin[p, R/2 + i] = sin(p * f(i)) * a
 *
 * with the attention factor a = attention_factor when it is > 0, else
 * m(factor, mscale) / m(factor, mscale_all_dim) when both mscales are > 0, else m(factor, 1),
 * where m(s, k) = 0.1 * k * ln(s) + 1 for s > 1 and 1 for s <= 1 (Hugging Face's rules; 0 stands
 * for a key the config leaves out). DeepSeek-V3: factor 40, original 4096, beta 32 / 1, mscale
 * = mscale_all_dim = 1, so a = 1; its attention then scales the softmax by m(40, 1)^2 itself,
 * outside this table. DeepSeek-V4's compressed layers: factor 16, attention_factor 1.
 * Hugging Face versions that derive factor from max_position_embeddings / original give the
 * same table when the config's factor agrees (it does for these models). */
typedef enum mlaf_rope_scaling_type {
    MLAF_ROPE_SCALING_NONE = 0, /* plain RoPE, exactly mlaf_rope_table_init */
    MLAF_ROPE_SCALING_YARN = 1,
    MLAF_ROPE_SCALING_COUNT_
} mlaf_rope_scaling_type;

typedef struct mlaf_rope_scaling {
    mlaf_rope_scaling_type type;
    double factor;            /* context extension factor, finite and >= 1 */
    int64_t original_max_position_embeddings; /* the context before extension, >= 1 */
    double beta_fast;         /* finite and > 0 (Hugging Face default 32) */
    double beta_slow;         /* finite and > 0 (default 1) */
    double mscale;            /* finite and >= 0; 0 = absent */
    double mscale_all_dim;    /* finite and >= 0; 0 = absent */
    double attention_factor;  /* finite and >= 0; 0 = derived from the mscales (above) */
    int32_t truncate;         /* nonzero (the default): round the correction range outward */
} mlaf_rope_scaling;

/* YaRN with Hugging Face's defaults for the keys a config may leave out: beta_fast 32,
 * beta_slow 1, no mscales, attention factor derived, truncate on. */
MLAF_API mlaf_rope_scaling mlaf_rope_scaling_yarn(double factor,
                                                  int64_t original_max_position_embeddings);

/* The multiplier `a` the scaled table applies to cos and sin: 1 for NULL or NONE, NaN when the
 * scaling's parameters are invalid (see mlaf_rope_table_init_scaled). */
MLAF_API double mlaf_rope_scaling_attention_factor(const mlaf_rope_scaling *scaling);

/* mlaf_rope_table_init with a scaling (NULL or NONE: the plain table, bit for bit). Computed in
 * double and rounded once to f32. MLAF_ERR_NULL_POINTER for a NULL table;
 * MLAF_ERR_INVALID_ARGUMENT, the table untouched, for a bad max_pos / rope_dim / base (as
 * mlaf_rope_table_init), an unknown type, or a parameter outside the ranges above. */
MLAF_API mlaf_status mlaf_rope_table_init_scaled(float *table, int64_t max_pos, int32_t rope_dim,
                                                 double base, const mlaf_rope_scaling *scaling);

/* ---------------------------------------------------------------------------------------
 * mla_kv_cache (SPEC §3): split + both RMSNorms + RoPE on k_pe + paged KV-cache write
 *
 *   latent, w_q, w_kv, q       as split_qk_norm (q is the dense q_norm output)
 *   positions [T]              i32 | i64
 *   cos_sin   [max_pos, R]     f32
 *   slot_mapping [N]           i32 | i64, N <= T (rows t >= N: slot -1); slot = block *
 *                              block_size + offset; < 0 = skip token
 *   kv_cache  [num_blocks, block_size, C + R]   f32 | f16 | bf16, strides (s0, s1, 1) any
 *                              that do not make rows overlap; need not match latent's dtype
 *   k_nope    [T, C]  optional dense output (normalized), latent's dtype
 *   k_pe      [T, R]  optional dense output (roped), latent's dtype
 *   error_count [1]   optional i32: incremented (atomically on CUDA) once for every token
 *                     whose slot is >= num_blocks * block_size or whose position is outside
 *                     [0, max_pos); such a token writes no cache row, no k_pe row, and its
 *                     q / k_nope outputs are still written. The caller zeroes it. The
 *                     count saturates at INT32_MAX (it never wraps negative).
 *
 * For every token t with slot >= 0 in range: cache[slot] = [k_nope_norm | rope(k_pe)], each
 * value rounded once to the cache dtype. Cache rows not named by slot_mapping stay
 * bit-identical. Two tokens naming the same slot: one of them wins (unspecified which).
 * R == 0 is accepted (no rotation); cos_sin and positions may then be absent.
 *
 * kv_rope_tail = r > 0 (DeepSeek-V4, SPEC §11; 0 = none, every other model): the rope part lives
 * inside the kv part. Requires R == 0 (the latent row is [Q | C]), r even, 0 < r <= C, and the
 * interleaved style; positions [T] and cos_sin [max_pos, r] are then required. Per token:
 * k_nope = RMSNorm(kv) * w_kv in fp32 over all C values, rounded to the latent dtype; then the
 * values [C - r, C) of that rounded vector are rotated in fp32 (pairs (C - r + 2i, C - r + 2i + 1)
 * with cos_sin[pos, i], sin at [pos, r/2 + i]; the rotation rule of the RoPE section, so q and k
 * of one position agree) and rounded again. The dense k_nope output holds all C values (the
 * rotated tail included) and the cache record is [k_nope] (plain: C values, each the fp32 value
 * rounded once to the cache dtype; the nope values straight from fp32 as without a tail).
 * A token with a position outside [0, max_pos) or a slot past the cache is counted and writes
 * no cache row and no tail values of k_nope (its nope values are written). k_pe must be absent
 * and the cache has no rope part (no kpe). In place: k_nope may be the latent's own kv columns;
 * the row then ends as [q_norm | rope-tailed kv_norm] (SPEC §12). Formats: plain, fp8, fp8_v4
 * (fp8_ds_mla is rejected with a tail).
 * ------------------------------------------------------------------------------------- */
typedef struct mlaf_mla_kv_cache_params {
    int32_t q_lora_rank;
    int32_t kv_lora_rank;
    int32_t rope_dim;
    float eps_q;
    float eps_kv;
    mlaf_rope_style style;
    int32_t kv_rope_tail; /* r >= 0; 0: no rope inside the kv part (every model but V4) */
} mlaf_mla_kv_cache_params;

MLAF_API mlaf_status mlaf_mla_kv_cache(mlaf_context *ctx, const mlaf_mla_kv_cache_params *p,
                                       const mlaf_tensor *latent, const mlaf_tensor *w_q,
                                       const mlaf_tensor *w_kv, const mlaf_tensor *positions,
                                       const mlaf_tensor *cos_sin,
                                       const mlaf_tensor *slot_mapping,
                                       const mlaf_tensor *kv_cache, const mlaf_tensor *q,
                                       const mlaf_tensor *k_nope, const mlaf_tensor *k_pe,
                                       const mlaf_tensor *error_count);

/* ---------------------------------------------------------------------------------------
 * mla_kv_cache into a cache format (SPEC §9): the same op, its cache in any format an MLA
 * decode kernel reads, quantized in the same pass
 *
 * mlaf_mla_kv_cache_fmt takes mlaf_mla_kv_cache's arguments with the cache described by a
 * mlaf_kv_cache_desc; mlaf_mla_kv_cache(..., kv_cache, ...) is format PLAIN, cache = kv_cache.
 *
 *   PLAIN       cache [num_blocks, block_size, C + R] f32 | f16 | bf16; or, with kpe given,
 *               cache [.., .., C] and kpe [num_blocks, block_size, R] (FlashInfer / TRT-LLM's
 *               separate ckv / kpe arrays; the same dtype and block count, any strides each).
 *   FP8         the same shapes in e4m3 bytes (dtype fp8_e4m3 or u8): k_nope_norm and the roped
 *               k_pe both quantized with ONE scale, scale [1] f32 (on CUDA in device memory,
 *               read by the kernel, so a captured graph follows its changes):
 *                 conv MLAF_FP8_DIV  e4m3(x / scale)   (vLLM's k_scale)
 *                 conv MLAF_FP8_MUL  e4m3(x * scale)   (FlashInfer's / TRT-LLM's quant_scale)
 *               amax_out [1] f32, optional: raised to the max |x| of every row written to the
 *               cache (the caller zeroes it; NaN ignored), for calibration.
 *   FP8_DS_MLA  cache [num_blocks, block_size, C + C/32 + 2 R] bytes (u8 or fp8_e4m3), per token
 *               [C e4m3 | C/128 little-endian f32 tile scales | R bf16 rope(k_pe)] (656 B for
 *               C = 512, R = 64; FlashMLA's sparse decode reads block_size 64). Needs a bf16
 *               latent, C % 128 == 0, both cache strides multiples of 16 bytes. Tile t is values
 *               [128 t, 128 t + 128); its scale s by tile_scale, then e4m3(x / s):
 *                 MLAF_TILE_AMAX                max(amax / 448, FLT_MIN)            (vLLM)
 *                 MLAF_TILE_UE8M0               2^ceil_log2(max(amax, 1e-4) / 448)  (DeepSeek)
 *                 MLAF_TILE_UE8M0_FLOOR_SCALED  2^ceil_log2(max(amax / 448, 1e-4))  (FlashMLA's
 *                                               test quantizer)
 *               (an infinite amax gives ceil_log2 = 128: s = +inf).
 *   FP8_V4      DeepSeek-V4's SM90 FlashMLA record (584 B per token; SPEC §11). Needs a bf16 latent,
 *               C = 512, rope_dim 0 and kv_rope_tail 64 (the only layout FlashMLA reads). cache
 *               [num_blocks, block_size, 584] bytes (u8 or fp8_e4m3) with stride[1] = 584 and
 *               stride[0] = the page stride in bytes, >= block_size * 584 and a multiple of 16,
 *               data 16-byte aligned. A page is planar: the token at offset o has its 576-byte
 *               data row at page + o * 576 (448 e4m3 NoPE values, then the 64 roped values as
 *               bf16) and its 8-byte scale row at page + block_size * 576 + o * 8 (7 UE8M0 bytes,
 *               one per 64 NoPE values, then a zero byte, written with every row). Per 64-value
 *               block: e = ceil_log2(max(amax, 1e-4) / 448), byte = clamp(e + 127, 0, 255),
 *               e4m3(x * 2^-e) (an exact power-of-two product).
 *
 * Every fp8 value x is the value the op stores densely, rounded to the latent dtype first, so
 * the fused bytes equal the unfused pipeline's; amax is over those values (NaN ignored). e4m3:
 * round to nearest even, |x| >= 464 and +-inf give +-448 (0x7E / 0xFE), NaN gives 0x7F.
 * Divisions are IEEE f32 divisions. In the fp8 formats two tokens naming one slot leave that
 * slot's record undefined. Every other rule of mla_kv_cache holds (skipped and counted tokens,
 * untouched rows, strided caches, any block_size).
 * slot_mapping may have N <= T entries (engines pad the latent for graphs): rows t >= N take
 * slot -1 (no cache row; q and the dense outputs are written). This holds for
 * mlaf_mla_kv_cache too.
 * ------------------------------------------------------------------------------------- */
typedef enum mlaf_kv_format {
    MLAF_KV_PLAIN = 0,
    MLAF_KV_FP8 = 1,
    MLAF_KV_FP8_DS_MLA = 2,
    MLAF_KV_FP8_V4 = 3,
    MLAF_KV_FORMAT_COUNT_
} mlaf_kv_format;

typedef enum mlaf_fp8_conv { MLAF_FP8_DIV = 0, MLAF_FP8_MUL = 1 } mlaf_fp8_conv;

typedef enum mlaf_tile_scale {
    MLAF_TILE_AMAX = 0,
    MLAF_TILE_UE8M0 = 1,
    MLAF_TILE_UE8M0_FLOOR_SCALED = 2
} mlaf_tile_scale;

typedef struct mlaf_kv_cache_desc {
    mlaf_kv_format format;
    const mlaf_tensor *cache;    /* required */
    const mlaf_tensor *kpe;      /* PLAIN / FP8: optional separate rope array; else NULL */
    const mlaf_tensor *scale;    /* FP8: [1] f32, required; else NULL */
    const mlaf_tensor *amax_out; /* FP8: [1] f32, optional; else NULL */
    mlaf_fp8_conv conv;          /* FP8 */
    mlaf_tile_scale tile_scale;  /* FP8_DS_MLA */
} mlaf_kv_cache_desc;

/* "plain", "fp8", "fp8_ds_mla", "fp8_v4"; "unknown" otherwise. */
MLAF_API const char *mlaf_kv_format_name(mlaf_kv_format f);
/* Bytes of one token's cache record in a format (PLAIN: (C + R) * the dtype's size), 0 when
 * the format, dtype or dims are not valid for it. FP8_V4: 584 for C = 512, R = 0 (its data row
 * and scale row together; the tail 64 is implied). */
MLAF_API int64_t mlaf_kv_record_bytes(mlaf_kv_format f, mlaf_dtype cache_dtype, int32_t kv_lora_rank,
                                      int32_t rope_dim);

MLAF_API mlaf_status mlaf_mla_kv_cache_fmt(mlaf_context *ctx, const mlaf_mla_kv_cache_params *p,
                                           const mlaf_tensor *latent, const mlaf_tensor *w_q,
                                           const mlaf_tensor *w_kv, const mlaf_tensor *positions,
                                           const mlaf_tensor *cos_sin,
                                           const mlaf_tensor *slot_mapping,
                                           const mlaf_kv_cache_desc *cache, const mlaf_tensor *q,
                                           const mlaf_tensor *k_nope, const mlaf_tensor *k_pe,
                                           const mlaf_tensor *error_count);

/* ---------------------------------------------------------------------------------------
 * DSA lightning indexer (SPEC §10; DeepSeek-V3.2, GLM-5): the key branch of mla_kv_cache and the
 * indexer_q op. Heads are D = 128 wide; RoPE rotates dims [0, 64) (rope first, nope after: the
 * reverse of MLA) with the MLA's cos_sin table, which must then be 64 wide (rope_dim = 64):
 * row p = cos[0..31] | sin[0..31]; NeoX pairs (x[i], x[i+32]), interleaved pairs (x[2i], x[2i+1]),
 * i < 32, both with cos[i], sin[i], rotated as the RoPE section above (no FMA), so keys and
 * queries of one position agree bit for bit.
 *
 * One mlaf_indexer_params value drives both sides (build it once per layer):
 *   style     the indexer's RoPE style (NeoX for DeepSeek-V3.2, interleaved for GLM-5: a
 *             config's indexer_rope_interleave; mlaf_indexer_params_from_config)
 *   hadamard  nonzero: after RoPE, y <- H_128 y * f32(128^-0.5) (Sylvester order, computed as the
 *             radix-2 butterfly (a + b, a - b) over strides 1, 2, 4, .., 64 in fp32, then the
 *             product), rounded again. Off by default (vLLM's and SGLang's fused paths); DeepSeek's
 *             reference applies it to q and k alike: never rotate one side only.
 *   ln_eps    the key LayerNorm's eps, finite and > 0 (1e-6)
 *   amax_eps  the amax floor of every scale, finite and >= 1e-30 (1e-4)
 *   scale     MLAF_INDEX_SCALE_UE8M0: s = 2^ceil_log2(max(amax, amax_eps) / 448) (vLLM, DeepSeek);
 *             MLAF_INDEX_SCALE_F32:   s = max(amax, amax_eps) / 448 (SGLang's key cache)
 * amax is the NaN-ignoring max |y| over the 128 rounded values; fp8 = e4m3(y / s) (IEEE division,
 * the e4m3 rules of the cache-format section).
 * ------------------------------------------------------------------------------------- */
#define MLAF_INDEX_HEAD_DIM 128
#define MLAF_INDEX_ROPE_DIM 64

typedef enum mlaf_index_scale { MLAF_INDEX_SCALE_UE8M0 = 0, MLAF_INDEX_SCALE_F32 = 1 } mlaf_index_scale;

typedef struct mlaf_indexer_params {
    mlaf_rope_style style;
    int32_t hadamard;
    float ln_eps;
    float amax_eps;
    mlaf_index_scale scale;
} mlaf_indexer_params;

/* The parameters of a preset's indexer: its index_rope_style, no Hadamard, ln_eps 1e-6, amax_eps
 * 1e-4, UE8M0 scales. */
MLAF_API mlaf_indexer_params mlaf_indexer_params_from_config(const mlaf_model_config *cfg);

/* The key branch of mla_kv_cache (mlaf_mla_kv_cache_dsa):
 *
 *   index_k   [T, 128]   latent's dtype, rows strided (e.g. the first 128 columns of the
 *                        [T, 128 + H] GEMM output that also holds the head weights)
 *   weight    [128]      LayerNorm weight, f32 or latent's dtype
 *   bias      [128]      LayerNorm bias, weight's dtype
 *   cache     [num_blocks, bytes]  u8 | fp8_e4m3, block-planar: the token at offset o of block b
 *                        has its 128 e4m3 bytes at b * stride[0] + 128 o and its little-endian f32
 *                        scale at b * stride[0] + 128 block_size + 4 o (132 bytes a token);
 *                        num_blocks and block_size are the MLA cache's; bytes >= 132 block_size;
 *                        stride[0] (the block stride, bytes) any value >= bytes, odd ones too
 *   out       [T, 128]   optional: the vector quantized (after the Hadamard when on), latent's
 *                        dtype, for context-parallel gathers; may be index_k itself (in place)
 *   topk_fill [T, K]     optional i32, filled with -1 (a full-indexer layer's top-k buffer)
 *   copies, copy_stride  the multi-destination store (SPEC §12, context-parallel peers): with
 *                        copies = n in [2, 8] the index records are written, byte for byte the
 *                        same, to n caches: cache's view at cache.data + k * copy_stride bytes,
 *                        k < n (e.g. peer-mapped memory); copy_stride >= the bytes one cache
 *                        view spans, so the copies do not overlap. 0 or 1: the one cache. The op
 *                        issues no cross-GPU fence: the caller publishes before peers read.
 *
 * Per token, every step in fp32 and rounded to the latent dtype after it:
 *   1. LayerNorm: mu = sum(x) / 128, var = sum((x - mu)^2) / 128 (sums in a fixed order, no FMA),
 *      y = ((x - mu) * (1 / sqrt(var + ln_eps))) * w + b
 *   2. RoPE on dims [0, 64) in params.style
 *   3. the Hadamard when params.hadamard
 *   4. the scale s and e4m3(y / s) into the index cache at the token's slot
 * Tokens follow the MLA part's rules: the same slot_mapping (rows past its end: slot -1), a
 * negative slot writes no index cache row, a slot past the cache or a position outside
 * [0, max_pos) is counted once (not twice) and writes neither the index cache row nor `out`.
 * Two tokens naming one slot leave its index record undefined. */
typedef struct mlaf_indexer_k {
    const mlaf_tensor *index_k;   /* required */
    const mlaf_tensor *weight;    /* required */
    const mlaf_tensor *bias;      /* required */
    const mlaf_tensor *cache;     /* required */
    const mlaf_tensor *out;       /* optional */
    const mlaf_tensor *topk_fill; /* optional */
    int32_t copies;               /* 0 or 1: one cache; up to 8 */
    int64_t copy_stride;          /* bytes between the copies' bases */
} mlaf_indexer_k;

/* mla_kv_cache (any cache format) and, with ik given, the indexer key branch of every token in the
 * same pass (one launch on CUDA). ik NULL: exactly mlaf_mla_kv_cache_fmt (ip may then be NULL too).
 * With ik: rope_dim must be 64 (the indexer's rotation reads the MLA cos_sin rows). */
MLAF_API mlaf_status mlaf_mla_kv_cache_dsa(mlaf_context *ctx, const mlaf_mla_kv_cache_params *p,
                                           const mlaf_tensor *latent, const mlaf_tensor *w_q,
                                           const mlaf_tensor *w_kv, const mlaf_tensor *positions,
                                           const mlaf_tensor *cos_sin,
                                           const mlaf_tensor *slot_mapping,
                                           const mlaf_kv_cache_desc *cache, const mlaf_tensor *q,
                                           const mlaf_tensor *k_nope, const mlaf_tensor *k_pe,
                                           const mlaf_tensor *error_count,
                                           const mlaf_indexer_params *ip, const mlaf_indexer_k *ik);

/* indexer_q (SPEC §10): the indexer's query side, after the q-b projection.
 *
 *   q_idx     [T, H, 128]  f32 | f16 | bf16, strides (s0, s1, 1)
 *   positions [T], cos_sin [max_pos, 64]   as mla_kv_cache
 *   w         [T, H]       head weights, f32 or q_idx's dtype, rows strided
 *   q_fp8     [T, H, 128]  output, u8 | fp8_e4m3, strides (s0, s1, 1)
 *   w_out     [T, H]       output, f32, rows strided
 *   q_pe      [T, Hq, D]   optional: the MLA query, RoPE in place on its last q_pe_rope->rope_dim
 *                          (= 64) columns in q_pe_rope->style (exactly mlaf_rope_q), same launch
 *   error_count [1]        optional i32: a token whose position is outside [0, max_pos) is counted
 *                          once and nothing of it is written (q_fp8, w_out, q_pe untouched)
 *
 * Per (token, head): RoPE on dims [0, 64), rounded to q_idx's dtype; the Hadamard when on,
 * rounded; s and q_fp8 = e4m3(q / s) as the header of this section says (UE8M0 in every engine);
 * w_out = ((f32(w) * s) * f32(128^-0.5)) * f32(H^-0.5), each product rounded to f32 (vLLM's order).
 * T = 0 (or H = 0 without q_pe) is a no-op. q_fp8 and w_out must not overlap any input or each other.
 * ------------------------------------------------------------------------------------- */
MLAF_API mlaf_status mlaf_indexer_q(mlaf_context *ctx, const mlaf_indexer_params *ip,
                                    const mlaf_tensor *q_idx, const mlaf_tensor *positions,
                                    const mlaf_tensor *cos_sin, const mlaf_tensor *w,
                                    const mlaf_tensor *q_fp8, const mlaf_tensor *w_out,
                                    const mlaf_tensor *q_pe, const mlaf_rope_params *q_pe_rope,
                                    const mlaf_tensor *error_count);

/* ---------------------------------------------------------------------------------------
 * rope_q (SPEC §3): RoPE in place on the last R columns of q viewed as [T, H, D]
 *
 *   q         [T, H, D]  f32 | f16 | bf16, strides (s0, s1, 1); D = nope_dim + R; modified
 *   positions [T]        i32 | i64
 *   cos_sin   [max_pos, R] f32
 *   error_count [1]      optional i32, as in mla_kv_cache: a token whose position is outside
 *                        [0, max_pos) is left unrotated and counted (saturating at
 *                        INT32_MAX).
 * T = 0 or H = 0 is a valid no-op: nothing is rotated, read or counted.
 * ------------------------------------------------------------------------------------- */
MLAF_API mlaf_status mlaf_rope_q(mlaf_context *ctx, const mlaf_rope_params *p,
                                 const mlaf_tensor *q, const mlaf_tensor *positions,
                                 const mlaf_tensor *cos_sin, const mlaf_tensor *error_count);

/* rope_q with an optional output (SPEC §11): q_out NULL is mlaf_rope_q (in place). Otherwise
 * q_out [T, Hpad, D] in q's dtype, strides (s0, s1, 1), Hpad >= H, disjoint from every input:
 * head h < H receives the whole result head (the first D - R values copied, or normalized with
 * head_norm; the last R rotated) and heads H .. Hpad - 1 are written as +0.0 (FlashMLA takes 64
 * or 128 heads only); q is only read. A token whose position is outside [0, max_pos) is counted
 * and none of its values are written (in place: its heads stay as they were; q_out: its row,
 * padding heads included, stays as it was). T = 0 is a no-op; H = 0 with q_out zero-fills the
 * padding heads of every token with a valid position. */
MLAF_API mlaf_status mlaf_rope_q_out(mlaf_context *ctx, const mlaf_rope_params *p,
                                     const mlaf_tensor *q, const mlaf_tensor *positions,
                                     const mlaf_tensor *cos_sin, const mlaf_tensor *q_out,
                                     const mlaf_tensor *error_count);

/* ---------------------------------------------------------------------------------------
 * moe_gate (SPEC §4): router top-k
 *
 *   logits  [T, E]       f32 | f16 | bf16, rows strided
 *   bias    [E]          optional f32 (e_score_correction_bias: used to choose, not to weigh)
 *   weights [T, k + S]   output, f32 or the logits' dtype
 *   ids     [T, k + S]   output, i32
 *   scores  [T, E]       optional output, f32: the scores s (before bias)
 *
 * Per token: s = sigmoid(logits) | softmax(logits) | sqrt(softplus(logits)); c = s + bias; if n_group > 1 keep the
 * topk_group best groups by group score (top-2 sum of c, or max of c); choose top_k experts by
 * c among kept groups, ids ordered by c descending, ties to the lower index; w = s[id];
 * if renormalize: w /= sum(w) + eps; if apply_routed_scaling: w *= routed_scaling_factor.
 * Shared experts (S > 0): slots k..k+S-1 hold ids E..E+S-1 with weight
 * sum(routed w after renormalization, before scaling) / routed_scaling_factor (SGLang's
 * convention: multiplying the MoE output by the factor gives each shared expert weight 1;
 * so fuse shared experts with apply_routed_scaling = 0). scores, when given, receives s.
 *
 * Order and ties: one total order everywhere (valid first, larger value first, lower index
 * first), identical on every backend: equal c picks the lower expert index, equal group
 * scores the lower group index; a row of equal logits picks experts 0..top_k-1 of the
 * lowest kept groups. ids are sorted by c, descending.
 *
 * Non-finite input: an expert whose logit is NaN or +-inf, or whose bias entry is NaN or
 * +-inf, is invalid. Softmax leaves invalid logits out of its max and sum; an invalid
 * logit's s is NaN in `scores`; an invalid expert ranks below every valid one (even if
 * s + bias would be finite) and weighs 0. Group scores count valid experts only (a group
 * with none ranks below every group with one; under top-2 sum a group with one valid expert
 * scores that expert). ids are always top_k distinct experts in [0, E) from kept groups,
 * invalid ones filling by index when too few are valid (all invalid: weights 0). No
 * division by zero: when renormalizing and sum(w) + eps == 0 the weights stay 0; no weight
 * is ever NaN.
 *
 * Other routers (Ascend npu_moe_gating_top_k, SGLang biased_grouped_topk / moe_fused_gate,
 * HF DeepseekV3TopkRouter, DeepSeek-V2 MoEGate): argument-by-argument tables in
 * docs/moe_gate.md. In short: Ascend group_select_mode 0/1 = MLAF_GROUP_MAX/TOP2_SUM and
 * norm_type 0/1 = MLAF_SCORE_SOFTMAX/SIGMOID (both reversed from mlafuse's numbering), and
 * Ascend always renormalizes sigmoid; HF V3: renormalize = norm_topk_prob, eps = 1e-20,
 * apply_routed_scaling = 1; HF V2: scaling applies only when not renormalizing; SGLang
 * renormalizes without eps (eps = 0 matches it).
 *
 * sqrt_softplus (DeepSeek-V4, SPEC §11): s = sqrt(softplus(x)) in fp32 with softplus(x) =
 * log1p(exp(x)), taken as x above 20 and s = exp(x / 2) below -20 (both exact to fp32 there),
 * so no logit overflows; the same NaN policy as sigmoid.
 *
 * Limits: 1 <= E <= 2048; 1 <= n_group <= 64, E % n_group == 0; 1 <= topk_group <= n_group;
 * 1 <= top_k <= min(E, 64) and top_k <= topk_group * E / n_group; the top-2 group score needs
 * E / n_group >= 2 (when n_group > 1); S >= 0 and S <= 64; routed_scaling_factor finite and
 * > 0; eps finite and >= 0.
 * ------------------------------------------------------------------------------------- */
typedef struct mlaf_moe_gate_params {
    int32_t top_k;
    int32_t n_group;    /* 1 = no group limit */
    int32_t topk_group;
    mlaf_score_func score_func;
    mlaf_group_score group_score;
    int32_t renormalize;
    float routed_scaling_factor;
    int32_t apply_routed_scaling;
    float eps;          /* 1e-20 by default */
    int32_t n_shared_experts;
} mlaf_moe_gate_params;

/* Parameters of a preset's router (E comes from the logits' shape). */
MLAF_API mlaf_moe_gate_params mlaf_moe_gate_params_from_config(const mlaf_model_config *cfg);

MLAF_API mlaf_status mlaf_moe_gate(mlaf_context *ctx, const mlaf_moe_gate_params *p,
                                   const mlaf_tensor *logits, const mlaf_tensor *bias,
                                   const mlaf_tensor *weights, const mlaf_tensor *ids,
                                   const mlaf_tensor *scores);

/* ---------------------------------------------------------------------------------------
 * moe_gate_hash (SPEC §11): DeepSeek-V4's hash-routed layers
 *
 *   logits    [T, E]          f32 | f16 | bf16, rows strided
 *   tid2eid   [vocab, top_k]  i32 | i64, rows strided: the experts of each token id
 *   token_ids [T]             i32 | i64
 *   weights   [T, k + S]      output, f32 or the logits' dtype
 *   ids       [T, k + S]      output, i32
 *   scores    [T, E]          optional output, f32: s of every expert
 *   error_count [1]           optional i32: +1 per bad row (saturating at INT32_MAX;
 *                             atomically on CUDA)
 *
 * Per token: ids = tid2eid[token_ids[t]], in the table's order (not sorted); s = the score
 * function of p (sigmoid, softmax over the row, or sqrt_softplus for V4); w = s[ids] (0 for a
 * non-finite logit, as in moe_gate); renormalize / scale / shared experts exactly as
 * moe_gate. There is no selection, so there is no bias argument (V4's hash layers have none)
 * and no group limit.
 * Bad rows: a token id outside [0, vocab), or a table row with an entry outside [0, E) or an
 * entry repeated, is counted in error_count and gets ids 0 .. k-1 with weight 0 (shared slots:
 * ids E .. E+S-1, weight 0), so ids are always k distinct valid experts. Its scores are still
 * written.
 * Parameters: p->top_k must equal tid2eid.shape[1]; p->n_group and p->topk_group must be 1;
 * the other limits and checks are moe_gate's. T = 0 is a valid no-op (nothing read).
 * ------------------------------------------------------------------------------------- */
MLAF_API mlaf_status mlaf_moe_gate_hash(mlaf_context *ctx, const mlaf_moe_gate_params *p,
                                        const mlaf_tensor *logits, const mlaf_tensor *tid2eid,
                                        const mlaf_tensor *token_ids, const mlaf_tensor *weights,
                                        const mlaf_tensor *ids, const mlaf_tensor *scores,
                                        const mlaf_tensor *error_count);

#ifdef __cplusplus
}
#endif
#endif /* MLAFUSE_H */
