/*
 * verify_util.c — seeded random numbers, guarded buffers on any backend, error units.
 */
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "../half.h"
#include "verify.h"

#define GUARD_BYTE 0xA5u

/* ---- rng: splitmix64 ------------------------------------------------------------------- */
void mlaf_rng_seed(mlaf_rng *r, uint64_t seed) { r->s = seed ^ 0x9E3779B97F4A7C15ull; }

uint64_t mlaf_rng_u64(mlaf_rng *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

mlaf_rng mlaf_rng_skipped(const mlaf_rng *r, uint64_t n) {
    mlaf_rng o = {r->s + n * 0x9E3779B97F4A7C15ull};
    return o;
}

double mlaf_rng_uniform(mlaf_rng *r) { return (double)(mlaf_rng_u64(r) >> 11) * 0x1.0p-53; }

double mlaf_rng_normal(mlaf_rng *r) {
    double u1 = mlaf_rng_uniform(r), u2 = mlaf_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void mlaf_fill_normal(mlaf_rng *r, void *p, mlaf_dtype dt, size_t n, double mean, double stddev) {
    for (size_t i = 0; i < n; i++)
        mlaf_store_f32(p, dt, (int64_t)i, (float)(mean + stddev * mlaf_rng_normal(r)));
}

void mlaf_fill_normal_rows(mlaf_rng *r, void *p, mlaf_dtype dt, int64_t rows, size_t n,
                           int64_t stride, double mean, double stddev) {
    const size_t es = mlaf_dtype_size(dt);
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int64_t t = 0; t < rows; t++) {
        mlaf_rng rt = mlaf_rng_skipped(r, (uint64_t)t * (uint64_t)(2 * n));
        mlaf_fill_normal(&rt, (unsigned char *)p + (size_t)(t * stride) * es, dt, n, mean, stddev);
    }
    *r = mlaf_rng_skipped(r, (uint64_t)(rows > 0 ? rows : 0) * (uint64_t)(2 * n));
}

/* ---- checks on all threads ------------------------------------------------------------ */
mlaf_status mlaf_run_items(int64_t n, size_t scratch_bytes, mlaf_item_fn fn, const void *arg,
                           mlaf_item_out *total) {
    memset(total, 0, sizeof *total);
    if (n <= 0) return MLAF_OK;
    double *worst = (double *)calloc((size_t)n, sizeof(double));
    int64_t *values = (int64_t *)calloc((size_t)n, sizeof(int64_t));
    int64_t *errors = (int64_t *)calloc((size_t)n, sizeof(int64_t));
    int *failed = (int *)calloc((size_t)n, sizeof(int));
    int oom = !worst || !values || !errors || !failed;
    int64_t first_bad = n;
    if (!oom) {
#ifdef _OPENMP
#pragma omp parallel
#endif
        {
            void *scratch = malloc(scratch_bytes ? scratch_bytes : 1);
            mlaf_item_out out;
            if (!scratch) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
                oom = 1;
            }
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
            for (int64_t k = 0; k < n; k++) {
                int64_t fb;
#ifdef _OPENMP
#pragma omp atomic read
#endif
                fb = first_bad;
                if (!scratch || k > fb) continue;
                memset(&out, 0, sizeof out);
                fn(arg, scratch, k, &out);
                worst[k] = out.worst;
                values[k] = out.values;
                errors[k] = out.errors;
                failed[k] = out.failed;
                if (out.failed) {
#ifdef _OPENMP
#pragma omp critical(mlaf_run_items_first_bad)
#endif
                    {
                        if (k < first_bad) {
                            first_bad = k;
                            memcpy(total->why, out.why, sizeof out.why);
                        }
                    }
                }
            }
            free(scratch);
        }
    }
    if (!oom) {
        const int64_t last = first_bad < n ? first_bad : n - 1;
        for (int64_t k = 0; k <= last; k++) {
            if (worst[k] > total->worst) total->worst = worst[k];
            total->values += values[k];
            total->errors += errors[k];
            total->failed += failed[k];
        }
    }
    free(worst);
    free(values);
    free(errors);
    free(failed);
    return oom ? MLAF_ERR_OUT_OF_MEMORY : MLAF_OK;
}

/* ---- guarded buffers ------------------------------------------------------------------- */
mlaf_status mlaf_gbuf_alloc(mlaf_gbuf *g, mlaf_backend b, size_t bytes, const void *init,
                            size_t misalign) {
    memset(g, 0, sizeof *g);
    g->backend = b;
    g->bytes = bytes;
    size_t lead = MLAF_GUARD_BYTES + misalign;
    size_t total = lead + bytes + MLAF_GUARD_BYTES;
    g->host = (unsigned char *)malloc(total);
    if (!g->host) return MLAF_ERR_OUT_OF_MEMORY;
    memset(g->host, GUARD_BYTE, total);
    g->body = g->host + lead;
    if (init)
        memcpy(g->body, init, bytes);
    else
        memset(g->body, 0xFF, bytes);
    void *dev = NULL;
    mlaf_status st = mlaf_mem_alloc(b, &dev, total);
    if (st != MLAF_OK) {
        free(g->host);
        g->host = NULL;
        return st;
    }
    g->dev_base = (unsigned char *)dev;
    g->ptr = g->dev_base + lead;
    return mlaf_mem_upload(b, g->dev_base, g->host, total);
}

static size_t gbuf_total(const mlaf_gbuf *g) {
    return (size_t)((unsigned char *)g->body - g->host) + g->bytes + MLAF_GUARD_BYTES;
}

void mlaf_gbuf_free(mlaf_gbuf *g) {
    if (!g) return;
    mlaf_mem_free(g->backend, g->dev_base);
    free(g->host);
    memset(g, 0, sizeof *g);
}

mlaf_status mlaf_gbuf_download(mlaf_gbuf *g) {
    return mlaf_mem_download(g->backend, g->host, g->dev_base, gbuf_total(g));
}

mlaf_status mlaf_gbuf_upload(mlaf_gbuf *g) {
    return mlaf_mem_upload(g->backend, g->dev_base, g->host, gbuf_total(g));
}

int mlaf_gbuf_guards_ok(const mlaf_gbuf *g) {
    size_t lead = (size_t)((unsigned char *)g->body - g->host);
    for (size_t i = 0; i < lead; i++)
        if (g->host[i] != GUARD_BYTE) return 0;
    const unsigned char *tail = (const unsigned char *)g->body + g->bytes;
    for (size_t i = 0; i < MLAF_GUARD_BYTES; i++)
        if (tail[i] != GUARD_BYTE) return 0;
    return 1;
}

int mlaf_gbuf_equals(const mlaf_gbuf *g, const void *expect) {
    return memcmp(g->body, expect, g->bytes) == 0;
}

/* ---- error units ----------------------------------------------------------------------- */
double mlaf_err_units(double got, double ref, mlaf_dtype dt, double scale) {
    if (isnan(ref) || isnan(got)) return (isnan(ref) && isnan(got)) ? 0.0 : INFINITY;
    if (isinf(ref) || isinf(got)) return got == ref ? 0.0 : INFINITY;
    double diff = fabs(got - ref);
    if (dt == MLAF_F16 || dt == MLAF_BF16) {
        int mant = dt == MLAF_F16 ? 10 : 7;
        int min_exp = dt == MLAF_F16 ? -14 : -126;
        double a = fabs(ref);
        int e = a > 0 ? (int)floor(log2(a)) : min_exp;
        if (e < min_exp) e = min_exp;
        double ulp = ldexp(1.0, e - mant);
        /* Rounding `ref` to the dtype moves it by at most half an ulp; a correct fp32
         * computation rounded once lands within one ulp of the exact value. */
        return diff / ulp;
    }
    double s = fabs(scale) > fabs(ref) ? fabs(scale) : fabs(ref);
    if (s < 1e-30) s = 1e-30;
    return diff / (1e-5 * s);
}

/* ---- cases ----------------------------------------------------------------------------- */
mlaf_model_config mlaf_v4_flash_attn_config(int32_t *kv_rope_tail) {
    const mlaf_model_config m = *mlaf_preset_find("deepseek-v4-flash");
    if (kv_rope_tail) *kv_rope_tail = m.kv_rope_tail;
    return m;
}

mlaf_verify_case mlaf_verify_case_default(const mlaf_model_config *cfg, mlaf_dtype dt, int64_t T,
                                          uint64_t seed) {
    mlaf_verify_case c;
    memset(&c, 0, sizeof c);
    if (cfg) c.cfg = *cfg;
    c.dtype = dt;
    c.weight_dtype = dt;
    c.T = T;
    c.seed = seed;
    c.rope_style = cfg ? cfg->rope_style : MLAF_ROPE_INTERLEAVED;
    c.block_size = 16;
    c.cache_dtype = dt;
    c.index_dtype = MLAF_I64;
    c.moe_bias = -1;
    if (cfg) c.moe = mlaf_moe_gate_params_from_config(cfg);
    c.experts = cfg ? cfg->n_routed_experts : 1;
    c.index_style = cfg && cfg->index_n_heads > 0 ? cfg->index_rope_style : MLAF_ROPE_NEOX;
    return c;
}

mlaf_status mlaf_verify_op(mlaf_context *ctx, mlaf_op op, const mlaf_verify_case *c,
                           mlaf_verify_result *r) {
    switch (op) {
    case MLAF_OP_SPLIT_QK_NORM: return mlaf_verify_split_qk_norm(ctx, c, r);
    case MLAF_OP_MLA_KV_CACHE: return mlaf_verify_mla_kv_cache(ctx, c, r);
    case MLAF_OP_ROPE_Q: return mlaf_verify_rope_q(ctx, c, r);
    case MLAF_OP_MOE_GATE: return mlaf_verify_moe_gate(ctx, c, r);
    case MLAF_OP_INDEXER_Q: return mlaf_verify_indexer_q(ctx, c, r);
    case MLAF_OP_RMS_NORM_QUANT: return mlaf_verify_rms_norm_quant(ctx, c, r);
    case MLAF_OP_GEMM_QUANT: return mlaf_verify_gemm_quant(ctx, c, r);
    default: return MLAF_ERR_INVALID_ARGUMENT;
    }
}
