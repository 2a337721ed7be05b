/*
 * core.c — version, status table, dtypes, contexts, presets, scaled RoPE tables and the error
 * helper.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "kv_format.h"

/* ---- version --------------------------------------------------------------------------- */
unsigned mlaf_version_number(void) { return MLAF_VERSION_NUMBER; }
const char *mlaf_version_string(void) { return MLAF_VERSION_STRING; }

/* ---- status ---------------------------------------------------------------------------- */
const char *mlaf_status_name(mlaf_status s) {
    switch (s) {
#define MLAF_STATUS_NAME_(name, value, msg) \
    case name: return #name;
        MLAF_STATUS_TABLE(MLAF_STATUS_NAME_)
#undef MLAF_STATUS_NAME_
    default: return "MLAF_UNKNOWN_STATUS";
    }
}

const char *mlaf_status_message(mlaf_status s) {
    switch (s) {
#define MLAF_STATUS_MSG_(name, value, msg) \
    case name: return msg;
        MLAF_STATUS_TABLE(MLAF_STATUS_MSG_)
#undef MLAF_STATUS_MSG_
    default: return "unknown status";
    }
}

mlaf_status mlaf_fail(mlaf_context *ctx, mlaf_status status, const char *fmt, ...) {
    if (ctx) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ctx->err, sizeof ctx->err, fmt, ap);
        va_end(ap);
    }
    return status;
}

/* ---- dtypes and names ------------------------------------------------------------------ */
size_t mlaf_dtype_size(mlaf_dtype t) {
    switch (t) {
    case MLAF_F32: return 4;
    case MLAF_F16: return 2;
    case MLAF_BF16: return 2;
    case MLAF_I32: return 4;
    case MLAF_I64: return 8;
    case MLAF_U8: return 1;
    case MLAF_FP8_E4M3: return 1;
    default: return 0;
    }
}

const char *mlaf_dtype_name(mlaf_dtype t) {
    static const char *const names[] = {"f32", "f16", "bf16", "i32", "i64", "u8", "fp8_e4m3"};
    return (unsigned)t < MLAF_DTYPE_COUNT_ ? names[t] : "unknown";
}

const char *mlaf_kv_format_name(mlaf_kv_format f) {
    const mlaf_kv_format_info *k = mlaf_kv_format_row(f);
    return k ? k->name : "unknown";
}

const char *mlaf_backend_name(mlaf_backend b) {
    static const char *const names[] = {"cpu", "cuda"};
    return (unsigned)b < MLAF_BACKEND_COUNT_ ? names[b] : "unknown";
}

const char *mlaf_op_name(mlaf_op op) {
    static const char *const names[] = {"split_qk_norm", "mla_kv_cache", "rope_q", "moe_gate", "indexer_q",
                                        "rms_norm_quant", "gemm_quant"};
    return (unsigned)op < MLAF_OP_COUNT_ ? names[op] : "unknown";
}

const char *mlaf_cpu_isa_name(mlaf_cpu_isa isa) {
    static const char *const names[] = {"auto", "scalar", "avx2", "avx512"};
    return (unsigned)isa < MLAF_CPU_ISA_COUNT_ ? names[isa] : "unknown";
}

/* ---- backends -------------------------------------------------------------------------- */
static const mlaf_backend_iface *backend_iface(mlaf_backend b) {
    if (b == MLAF_BACKEND_CPU) return &mlaf_cpu_backend;
#ifdef MLAF_WITH_CUDA
    if (b == MLAF_BACKEND_CUDA) return &mlaf_cuda_backend;
#endif
    return NULL;
}

int mlaf_backend_available(mlaf_backend b) {
    if (b == MLAF_BACKEND_CPU) return 1;
#ifdef MLAF_WITH_CUDA
    if (b == MLAF_BACKEND_CUDA) return mlaf_cuda_device_count() > 0;
#endif
    return 0;
}

int mlaf_backend_supports(mlaf_backend b, mlaf_op op) {
    const mlaf_backend_iface *f = backend_iface(b);
    if (!f) return 0;
    switch (op) {
    case MLAF_OP_SPLIT_QK_NORM: return f->split_qk_norm != NULL;
    case MLAF_OP_MLA_KV_CACHE: return f->mla_kv_cache != NULL;
    case MLAF_OP_ROPE_Q: return f->rope_q != NULL;
    case MLAF_OP_MOE_GATE: return f->moe_gate != NULL;
    case MLAF_OP_INDEXER_Q: return f->indexer_q != NULL;
    case MLAF_OP_RMS_NORM_QUANT: return f->rms_norm_quant != NULL;
    case MLAF_OP_GEMM_QUANT: return f->gemm_quant != NULL;
    default: return 0;
    }
}

/* ---- context --------------------------------------------------------------------------- */
static int all_cores(void) {
    int n = mlaf_cpu_core_count();
    return n < MLAF_MAX_THREADS ? n : MLAF_MAX_THREADS;
}

mlaf_status mlaf_context_create(mlaf_context **out, mlaf_backend backend) {
    if (!out) return MLAF_ERR_NULL_POINTER;
    *out = NULL;
    if ((unsigned)backend >= MLAF_BACKEND_COUNT_) return MLAF_ERR_INVALID_ARGUMENT;
    if (!mlaf_backend_available(backend)) return MLAF_ERR_BACKEND_UNAVAILABLE;
    mlaf_context *ctx = (mlaf_context *)calloc(1, sizeof *ctx);
    if (!ctx) return MLAF_ERR_OUT_OF_MEMORY;
    ctx->backend = backend;
    ctx->threads_requested = 0;
    ctx->threads = all_cores();
    ctx->isa = MLAF_CPU_ISA_SCALAR;
    for (int i = MLAF_CPU_ISA_COUNT_ - 1; i > MLAF_CPU_ISA_SCALAR; i--)
        if (mlaf_cpu_isa_supported((mlaf_cpu_isa)i)) {
            ctx->isa = (mlaf_cpu_isa)i;
            break;
        }
#ifdef MLAF_WITH_CUDA
    if (backend == MLAF_BACKEND_CUDA) {
        mlaf_status st = mlaf_cuda_bind_device(ctx, 0);
        if (st != MLAF_OK) {
            free(ctx);
            return st;
        }
    }
#endif
    *out = ctx;
    return MLAF_OK;
}

void mlaf_context_free(mlaf_context *ctx) {
    if (!ctx) return;
    mlaf_cpu_pool_free(ctx); /* joins the CPU workers, if any were started */
    free(ctx);
}

mlaf_backend mlaf_context_backend(const mlaf_context *ctx) {
    return ctx ? ctx->backend : MLAF_BACKEND_CPU;
}

mlaf_status mlaf_context_set_threads(mlaf_context *ctx, int threads) {
    if (!ctx) return MLAF_ERR_NULL_POINTER;
    if (threads < 0)
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                         "threads = %d, expected >= 0 (0 = all cores)", threads);
    if (threads > MLAF_MAX_THREADS)
        return mlaf_fail(ctx, MLAF_ERR_LIMIT, "threads = %d, expected <= %d (MLAF_MAX_THREADS)",
                         threads, MLAF_MAX_THREADS);
    ctx->threads_requested = threads;
    ctx->threads = threads == 0 ? all_cores() : threads;
    ctx->err[0] = '\0';
    return MLAF_OK;
}

int mlaf_context_threads(const mlaf_context *ctx) { return ctx ? ctx->threads : 0; }

mlaf_status mlaf_context_set_cpu_isa(mlaf_context *ctx, mlaf_cpu_isa isa) {
    if (!ctx) return MLAF_ERR_NULL_POINTER;
    if ((unsigned)isa >= MLAF_CPU_ISA_COUNT_)
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT, "cpu isa = %d, expected 0..%d",
                         (int)isa, MLAF_CPU_ISA_COUNT_ - 1);
    if (isa == MLAF_CPU_ISA_AUTO) {
        mlaf_cpu_isa best = MLAF_CPU_ISA_SCALAR;
        for (int i = MLAF_CPU_ISA_COUNT_ - 1; i > MLAF_CPU_ISA_SCALAR; i--)
            if (mlaf_cpu_isa_supported((mlaf_cpu_isa)i)) {
                best = (mlaf_cpu_isa)i;
                break;
            }
        ctx->isa = best;
    } else {
        if (!mlaf_cpu_isa_supported(isa))
            return mlaf_fail(ctx, MLAF_ERR_UNSUPPORTED, "cpu isa %s is not supported by this %s",
                             mlaf_cpu_isa_name(isa), "machine or build");
        ctx->isa = isa;
    }
    ctx->err[0] = '\0';
    return MLAF_OK;
}

mlaf_cpu_isa mlaf_context_cpu_isa(const mlaf_context *ctx) {
    return ctx ? ctx->isa : MLAF_CPU_ISA_SCALAR;
}

mlaf_status mlaf_context_set_cuda_device(mlaf_context *ctx, int device) {
    if (!ctx) return MLAF_ERR_NULL_POINTER;
    if (ctx->backend != MLAF_BACKEND_CUDA)
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                         "set_cuda_device on a %s context", mlaf_backend_name(ctx->backend));
#ifdef MLAF_WITH_CUDA
    int n = mlaf_cuda_device_count();
    if (device < 0 || device >= n)
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT, "cuda device = %d, expected 0..%d",
                         device, n - 1);
    mlaf_status st = mlaf_cuda_bind_device(ctx, device);
    if (st == MLAF_OK) ctx->err[0] = '\0';
    return st;
#else
    (void)device;
    return mlaf_fail(ctx, MLAF_ERR_BACKEND_UNAVAILABLE, "built without CUDA");
#endif
}

mlaf_status mlaf_context_set_cuda_stream(mlaf_context *ctx, void *stream) {
    if (!ctx) return MLAF_ERR_NULL_POINTER;
    if (ctx->backend != MLAF_BACKEND_CUDA)
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                         "set_cuda_stream on a %s context", mlaf_backend_name(ctx->backend));
    ctx->cuda_stream = stream;
    ctx->err[0] = '\0';
    return MLAF_OK;
}

mlaf_status mlaf_context_set_cuda_pdl(mlaf_context *ctx, int enable) {
    if (!ctx) return MLAF_ERR_NULL_POINTER;
    if (!enable && ctx->backend != MLAF_BACKEND_CUDA) { /* off is what every other backend is */
        ctx->err[0] = '\0';
        return MLAF_OK;
    }
    if (ctx->backend != MLAF_BACKEND_CUDA)
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                         "set_cuda_pdl on a %s context", mlaf_backend_name(ctx->backend));
    if (enable && ctx->cuda_cc < 90)
        return mlaf_fail(ctx, MLAF_ERR_UNSUPPORTED,
                         "programmatic dependent launch needs sm_90 or newer; cuda device %d is "
                         "sm_%d", ctx->cuda_device, ctx->cuda_cc);
    if (enable < 0 || enable > 2)
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                         "set_cuda_pdl: enable = %d, expected 0 (off), 1 (on) or 2 (on, early reads)", enable);
    ctx->cuda_pdl = enable;
    ctx->err[0] = '\0';
    return MLAF_OK;
}

int mlaf_context_cuda_pdl(const mlaf_context *ctx) {
    return ctx && ctx->backend == MLAF_BACKEND_CUDA ? ctx->cuda_pdl : 0;
}

const char *mlaf_context_last_error(const mlaf_context *ctx) {
    return ctx ? ctx->err : "context is NULL";
}

const char *mlaf_rope_style_name(mlaf_rope_style s) {
    return s == MLAF_ROPE_INTERLEAVED ? "interleaved" : s == MLAF_ROPE_NEOX ? "neox" : s == MLAF_ROPE_NONE ? "none" : "unknown";
}

/* ---- presets (docs/models.md) ----------------------------------------------------------------- */
static const mlaf_model_config presets[] = {
    /* name, Q, C, R, nope, v, heads, E, top_k, n_group, topk_group, score, group score, bias,
     * norm_topk_prob, scaling, apply scaling, eps, shared, rope style, indexer (heads, head dim,
     * top-k, rope style), kv_rope_tail, n_hash_layers */
    {"glm-4.7-flash", 768, 512, 64, 192, 256, 20, 64, 4, 1, 1, MLAF_SCORE_SIGMOID,
     MLAF_GROUP_TOP2_SUM, 1, 1, 1.8f, 1, 1e-5f, 1, MLAF_ROPE_INTERLEAVED, 0, 0, 0, MLAF_ROPE_INTERLEAVED, 0, 0},
    {"deepseek-v3", 1536, 512, 64, 128, 128, 128, 256, 8, 8, 4, MLAF_SCORE_SIGMOID,
     MLAF_GROUP_TOP2_SUM, 1, 1, 2.5f, 1, 1e-6f, 1, MLAF_ROPE_INTERLEAVED, 0, 0, 0, MLAF_ROPE_INTERLEAVED, 0, 0},
    {"deepseek-v2", 1536, 512, 64, 128, 128, 128, 160, 6, 8, 3, MLAF_SCORE_SOFTMAX,
     MLAF_GROUP_MAX, 0, 0, 16.0f, 1, 1e-6f, 2, MLAF_ROPE_INTERLEAVED, 0, 0, 0, MLAF_ROPE_INTERLEAVED, 0, 0},
    {"deepseek-v2-lite", 0, 512, 64, 128, 128, 16, 64, 6, 1, 1, MLAF_SCORE_SOFTMAX,
     MLAF_GROUP_MAX, 0, 0, 1.0f, 1, 1e-6f, 2, MLAF_ROPE_INTERLEAVED, 0, 0, 0, MLAF_ROPE_INTERLEAVED, 0, 0},
    {"kimi-k2", 1536, 512, 64, 128, 128, 64, 384, 8, 1, 1, MLAF_SCORE_SIGMOID,
     MLAF_GROUP_TOP2_SUM, 1, 1, 2.827f, 1, 1e-6f, 1, MLAF_ROPE_INTERLEAVED, 0, 0, 0, MLAF_ROPE_INTERLEAVED, 0, 0},
    /* DSA models: then index heads, head dim, top-k, indexer RoPE style. GLM-5's eps is its
     * config's (vLLM and SGLang use it; transformers builds both norms with 1e-6). */
    {"glm-5", 2048, 512, 64, 192, 256, 64, 256, 8, 1, 1, MLAF_SCORE_SIGMOID,
     MLAF_GROUP_TOP2_SUM, 1, 1, 2.5f, 1, 1e-5f, 1, MLAF_ROPE_INTERLEAVED, 32, 128, 2048,
     MLAF_ROPE_INTERLEAVED, 0, 0},
    {"deepseek-v3.2", 1536, 512, 64, 128, 128, 128, 256, 8, 8, 4, MLAF_SCORE_SIGMOID,
     MLAF_GROUP_TOP2_SUM, 1, 1, 2.5f, 1, 1e-6f, 1, MLAF_ROPE_INTERLEAVED, 64, 128, 2048, MLAF_ROPE_NEOX, 0, 0},
    /* DeepSeek-V4-Flash (docs/models.md): the latent is [1024 | 512] with no separate rope part
     * (R = 0); RoPE rotates the last 64 of the 512 normalized kv values (kv_rope_tail), and the
     * q heads' last 64 of 512. Router: sqrt(softplus) + bias, top-6 of 256, no groups,
     * renormalized, x 1.5; its first 3 MoE layers are hash-routed. Its indexer (pooled keys) is
     * not the DSA indexer (docs/dsa.md), so the index fields stay 0. */
    {"deepseek-v4-flash", 1024, 512, 0, 448, 512, 64, 256, 6, 1, 1, MLAF_SCORE_SQRT_SOFTPLUS,
     MLAF_GROUP_TOP2_SUM, 1, 1, 1.5f, 1, 1e-6f, 1, MLAF_ROPE_INTERLEAVED, 0, 0, 0, MLAF_ROPE_INTERLEAVED,
     64, 3},
    /* GLM-5.3-Flash (glm5_next): NoPE MLA, R = 0 (no RoPE anywhere in its text model; its config's
     * mla_use_nope, hence style none). Its
     * indexer pools the keys of 4 tokens (index_kpool) and rotates nothing: not the DSA
     * indexer, so the index fields stay 0 (docs/models.md). */
    {"glm-5.3-flash", 1536, 512, 0, 256, 256, 64, 288, 8, 1, 1, MLAF_SCORE_SIGMOID,
     MLAF_GROUP_TOP2_SUM, 1, 1, 2.5f, 1, 1e-5f, 1, MLAF_ROPE_NONE, 0, 0, 0, MLAF_ROPE_INTERLEAVED,
     0, 0},
    /* Kimi-K3: a 64-wide rope slot that the model never rotates (mla_use_nope: style none); the eps is its
     * config's, which vLLM and SGLang use (the released PyTorch code builds the two latent norms
     * with 1e-6). 896 experts, top-16, two shared. */
    {"kimi-k3", 1536, 512, 64, 128, 128, 96, 896, 16, 1, 1, MLAF_SCORE_SIGMOID,
     MLAF_GROUP_TOP2_SUM, 1, 1, 1.0f, 1, 1e-5f, 2, MLAF_ROPE_NONE, 0, 0, 0, MLAF_ROPE_INTERLEAVED,
     0, 0},
    /* DeepSeek-V4.1-Flash: V4's attention layout with q_lora 1280 and eps 1e-20; 384 experts,
     * no hash-routed layers. Its indexer (compressed keys) is not the DSA indexer either. */
    {"deepseek-v4.1-flash", 1280, 512, 0, 448, 512, 64, 384, 6, 1, 1, MLAF_SCORE_SQRT_SOFTPLUS,
     MLAF_GROUP_TOP2_SUM, 1, 1, 1.5f, 1, 1e-20f, 1, MLAF_ROPE_INTERLEAVED, 0, 0, 0, MLAF_ROPE_INTERLEAVED,
     64, 0},
};

int mlaf_preset_count(void) { return (int)(sizeof presets / sizeof presets[0]); }

const mlaf_model_config *mlaf_preset_at(int i) {
    return (i >= 0 && i < mlaf_preset_count()) ? &presets[i] : NULL;
}

static int name_eq(const char *a, const char *b) {
    for (; *a && *b; a++, b++)
        if (tolower((unsigned char)*a) != tolower((unsigned char)*b)) return 0;
    return *a == *b;
}

const mlaf_model_config *mlaf_preset_find(const char *name) {
    if (!name) return NULL;
    if (name_eq(name, "deepseek-r1")) name = "deepseek-v3";
    for (int i = 0; i < mlaf_preset_count(); i++)
        if (name_eq(name, presets[i].name)) return &presets[i];
    return NULL;
}

mlaf_indexer_params mlaf_indexer_params_from_config(const mlaf_model_config *cfg) {
    mlaf_indexer_params p;
    memset(&p, 0, sizeof p);
    p.style = cfg && cfg->index_n_heads > 0 ? cfg->index_rope_style : MLAF_ROPE_NEOX;
    p.hadamard = 0;
    p.ln_eps = 1e-6f;
    p.amax_eps = 1e-4f;
    p.scale = MLAF_INDEX_SCALE_UE8M0;
    return p;
}

mlaf_moe_gate_params mlaf_moe_gate_params_from_config(const mlaf_model_config *cfg) {
    mlaf_moe_gate_params p;
    memset(&p, 0, sizeof p);
    p.eps = 1e-20f;
    p.routed_scaling_factor = 1.0f;
    p.n_group = p.topk_group = p.top_k = 1;
    if (!cfg) return p;
    p.top_k = cfg->top_k;
    p.n_group = cfg->n_group;
    p.topk_group = cfg->topk_group;
    p.score_func = cfg->score_func;
    p.group_score = cfg->group_score;
    p.renormalize = cfg->norm_topk_prob;
    p.routed_scaling_factor = cfg->routed_scaling_factor;
    p.apply_routed_scaling = cfg->apply_routed_scaling;
    p.n_shared_experts = 0; /* fusing shared experts is the caller's choice */
    return p;
}

/* ---- scaled RoPE tables ---------------------------------------------------------------- */
mlaf_rope_scaling mlaf_rope_scaling_yarn(double factor, int64_t original_max_position_embeddings) {
    mlaf_rope_scaling s;
    memset(&s, 0, sizeof s);
    s.type = MLAF_ROPE_SCALING_YARN;
    s.factor = factor;
    s.original_max_position_embeddings = original_max_position_embeddings;
    s.beta_fast = 32.0;
    s.beta_slow = 1.0;
    s.truncate = 1;
    return s;
}

/* The ranges of mla.h's mlaf_rope_scaling comment; each comparison is false for NaN. */
static int yarn_valid(const mlaf_rope_scaling *s) {
    return s->factor >= 1.0 && s->factor <= MLAF_YARN_MAX_FACTOR &&
           s->original_max_position_embeddings >= 1 &&
           s->original_max_position_embeddings <= MLAF_YARN_MAX_ORIGINAL && s->beta_fast > 0.0 &&
           s->beta_fast <= MLAF_YARN_MAX_BETA && s->beta_slow > 0.0 &&
           s->beta_slow <= MLAF_YARN_MAX_BETA && s->mscale >= 0.0 &&
           s->mscale <= MLAF_YARN_MAX_MSCALE && s->mscale_all_dim >= 0.0 &&
           s->mscale_all_dim <= MLAF_YARN_MAX_MSCALE && s->attention_factor >= 0.0 &&
           s->attention_factor <= MLAF_YARN_MAX_MSCALE;
}

static double yarn_mscale(double factor, double k) {
    return factor <= 1.0 ? 1.0 : 0.1 * k * log(factor) + 1.0;
}

double mlaf_rope_scaling_attention_factor(const mlaf_rope_scaling *s) {
    if (!s || s->type == MLAF_ROPE_SCALING_NONE) return 1.0;
    if (s->type != MLAF_ROPE_SCALING_YARN || !yarn_valid(s)) return NAN;
    if (s->attention_factor > 0.0) return s->attention_factor;
    if (s->mscale > 0.0 && s->mscale_all_dim > 0.0)
        return yarn_mscale(s->factor, s->mscale) / yarn_mscale(s->factor, s->mscale_all_dim);
    return yarn_mscale(s->factor, 1.0);
}

mlaf_status mlaf_rope_table_init_scaled(float *table, int64_t max_pos, int32_t rope_dim,
                                        double base, const mlaf_rope_scaling *s) {
    if (!s || s->type == MLAF_ROPE_SCALING_NONE)
        return mlaf_rope_table_init(table, max_pos, rope_dim, base);
    if (!table) return MLAF_ERR_NULL_POINTER;
    if (max_pos < 1 || rope_dim <= 0 || rope_dim % 2 != 0 || !(base > 1.0 && base <= MLAF_ROPE_MAX_BASE))
        return MLAF_ERR_INVALID_ARGUMENT;
    if (s->type != MLAF_ROPE_SCALING_YARN || !yarn_valid(s)) return MLAF_ERR_INVALID_ARGUMENT;

    /* The band of frequency indices between beta_fast and beta_slow rotations over the original
     * context: below it frequencies stay (extrapolate), above it they are divided by the
     * factor (interpolate), in between a linear blend. */
    const double R = rope_dim, L = (double)s->original_max_position_embeddings;
    const double two_pi = 6.283185307179586476925286766559;
    double low = R * log(L / (two_pi * s->beta_fast)) / (2.0 * log(base));
    double high = R * log(L / (two_pi * s->beta_slow)) / (2.0 * log(base));
    if (s->truncate) {
        low = floor(low);
        high = ceil(high);
    }
    if (low < 0.0) low = 0.0;
    if (high > R - 1.0) high = R - 1.0;
    if (low == high) high += 0.001; /* a zero-width band would divide by zero */
    const double a = mlaf_rope_scaling_attention_factor(s);

    const int32_t half = rope_dim / 2;
    for (int64_t p = 0; p < max_pos; p++) {
        float *row = table + p * rope_dim;
        for (int32_t i = 0; i < half; i++) {
            double ramp = (i - low) / (high - low);
            ramp = ramp < 0.0 ? 0.0 : ramp > 1.0 ? 1.0 : ramp;
            const double extra = pow(base, -2.0 * i / rope_dim), inter = extra / s->factor;
            const double f = inter * ramp + extra * (1.0 - ramp);
            const double ang = (double)p * f;
            row[i] = (float)(cos(ang) * a);
            row[half + i] = (float)(sin(ang) * a);
        }
    }
    return MLAF_OK;
}
