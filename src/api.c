/*
 * api.c — the public entry points: validate (validate.c), then hand the job to the
 * context's backend. Every op goes through the same three steps, so both backends accept
 * and reject exactly the same calls with the same status and message.
 */
#include <math.h>
#include <string.h>

#include "internal.h"

static const mlaf_backend_iface *iface_of(const mlaf_context *ctx) {
    if (ctx->backend == MLAF_BACKEND_CPU) return &mlaf_cpu_backend;
#ifdef MLAF_WITH_CUDA
    if (ctx->backend == MLAF_BACKEND_CUDA) return &mlaf_cuda_backend;
#endif
    return NULL;
}

/* After validation: the op either has no work, is missing on this backend, or runs. */
#define DISPATCH(ctx, fn, op, T, job)                                                         \
    do {                                                                                      \
        const mlaf_backend_iface *f_ = iface_of(ctx);                                         \
        if (!f_ || !f_->fn)                                                                   \
            return mlaf_fail(ctx, MLAF_ERR_UNSUPPORTED, "%s is not implemented on the %s backend", \
                             mlaf_op_name(op), mlaf_backend_name((ctx)->backend));            \
        (ctx)->err[0] = '\0';                                                                 \
        if ((T) == 0) return MLAF_OK;                                                         \
        return f_->fn(ctx, job);                                                              \
    } while (0)

mlaf_status mlaf_split_qk_norm_quant(mlaf_context *ctx, const mlaf_split_qk_norm_params *p,
                                     const mlaf_tensor *latent, const mlaf_tensor *w_q,
                                     const mlaf_tensor *w_kv, const mlaf_tensor *q,
                                     const mlaf_tensor *k_nope, const mlaf_tensor *k_pe,
                                     const mlaf_row_quant *quant) {
    if (!ctx) return MLAF_ERR_NULL_POINTER;
    mlaf_norm_job job;
    mlaf_status st = mlaf_check_split_qk_norm_q(ctx, p, latent, w_q, w_kv, q, k_nope, k_pe, quant, &job);
    if (st != MLAF_OK) return st;
    DISPATCH(ctx, split_qk_norm, MLAF_OP_SPLIT_QK_NORM, job.T, &job);
}

mlaf_status mlaf_split_qk_norm(mlaf_context *ctx, const mlaf_split_qk_norm_params *p,
                               const mlaf_tensor *latent, const mlaf_tensor *w_q,
                               const mlaf_tensor *w_kv, const mlaf_tensor *q,
                               const mlaf_tensor *k_nope, const mlaf_tensor *k_pe) {
    return mlaf_split_qk_norm_quant(ctx, p, latent, w_q, w_kv, q, k_nope, k_pe, NULL);
}

mlaf_status mlaf_mla_kv_cache_quant(mlaf_context *ctx, const mlaf_mla_kv_cache_params *p,
                                    const mlaf_tensor *latent, const mlaf_tensor *w_q,
                                    const mlaf_tensor *w_kv, const mlaf_tensor *positions,
                                    const mlaf_tensor *cos_sin, const mlaf_tensor *slot_mapping,
                                    const mlaf_kv_cache_desc *cache, const mlaf_tensor *q,
                                    const mlaf_tensor *k_nope, const mlaf_tensor *k_pe,
                                    const mlaf_tensor *error_count, const mlaf_row_quant *quant) {
    if (!ctx) return MLAF_ERR_NULL_POINTER;
    mlaf_kv_cache_job job;
    mlaf_status st = mlaf_check_mla_kv_cache_q(ctx, p, latent, w_q, w_kv, positions, cos_sin,
                                               slot_mapping, cache, q, k_nope, k_pe,
                                               error_count, quant, &job);
    if (st != MLAF_OK) return st;
    DISPATCH(ctx, mla_kv_cache, MLAF_OP_MLA_KV_CACHE, job.norm.T, &job);
}

mlaf_status mlaf_mla_kv_cache_fmt(mlaf_context *ctx, const mlaf_mla_kv_cache_params *p,
                                  const mlaf_tensor *latent, const mlaf_tensor *w_q,
                                  const mlaf_tensor *w_kv, const mlaf_tensor *positions,
                                  const mlaf_tensor *cos_sin, const mlaf_tensor *slot_mapping,
                                  const mlaf_kv_cache_desc *cache, const mlaf_tensor *q,
                                  const mlaf_tensor *k_nope, const mlaf_tensor *k_pe,
                                  const mlaf_tensor *error_count) {
    return mlaf_mla_kv_cache_quant(ctx, p, latent, w_q, w_kv, positions, cos_sin, slot_mapping, cache, q, k_nope,
                                   k_pe, error_count, NULL);
}

mlaf_status mlaf_mla_kv_cache(mlaf_context *ctx, const mlaf_mla_kv_cache_params *p,
                              const mlaf_tensor *latent, const mlaf_tensor *w_q,
                              const mlaf_tensor *w_kv, const mlaf_tensor *positions,
                              const mlaf_tensor *cos_sin, const mlaf_tensor *slot_mapping,
                              const mlaf_tensor *kv_cache, const mlaf_tensor *q,
                              const mlaf_tensor *k_nope, const mlaf_tensor *k_pe,
                              const mlaf_tensor *error_count) {
    mlaf_kv_cache_desc d;
    memset(&d, 0, sizeof d);
    d.format = MLAF_KV_PLAIN;
    d.cache = kv_cache;
    return mlaf_mla_kv_cache_fmt(ctx, p, latent, w_q, w_kv, positions, cos_sin, slot_mapping, &d, q,
                                 k_nope, k_pe, error_count);
}

mlaf_status mlaf_mla_kv_cache_dsa_quant(mlaf_context *ctx, const mlaf_mla_kv_cache_params *p,
                                        const mlaf_tensor *latent, const mlaf_tensor *w_q,
                                        const mlaf_tensor *w_kv, const mlaf_tensor *positions,
                                        const mlaf_tensor *cos_sin, const mlaf_tensor *slot_mapping,
                                        const mlaf_kv_cache_desc *cache, const mlaf_tensor *q,
                                        const mlaf_tensor *k_nope, const mlaf_tensor *k_pe,
                                        const mlaf_tensor *error_count, const mlaf_indexer_params *ip,
                                        const mlaf_indexer_k *ik, const mlaf_row_quant *quant) {
    if (!ik)
        return mlaf_mla_kv_cache_quant(ctx, p, latent, w_q, w_kv, positions, cos_sin, slot_mapping, cache, q,
                                       k_nope, k_pe, error_count, quant);
    if (!ctx) return MLAF_ERR_NULL_POINTER;
    mlaf_kv_cache_job job;
    mlaf_index_job ix;
    mlaf_status st = mlaf_check_mla_kv_cache_q(ctx, p, latent, w_q, w_kv, positions, cos_sin,
                                               slot_mapping, cache, q, k_nope, k_pe,
                                               error_count, quant, &job);
    if (st != MLAF_OK) return st;
    st = mlaf_check_indexer_k(ctx, ip, ik, p, latent, w_q, w_kv, positions, cos_sin, slot_mapping, cache, q, k_nope, k_pe,
                              error_count, &job, &ix);
    if (st != MLAF_OK) return st;
    st = mlaf_check_index_apart(ctx, ik, &job.norm, quant);
    if (st != MLAF_OK) return st;
    const mlaf_backend_iface *f = iface_of(ctx);
    if (!f || !f->mla_kv_cache_dsa)
        return mlaf_fail(ctx, MLAF_ERR_UNSUPPORTED, "mla_kv_cache with the indexer branch is not implemented on the %s backend",
                         mlaf_backend_name(ctx->backend));
    ctx->err[0] = '\0';
    if (job.norm.T == 0) return MLAF_OK;
    return f->mla_kv_cache_dsa(ctx, &job, &ix);
}

mlaf_status mlaf_mla_kv_cache_dsa(mlaf_context *ctx, const mlaf_mla_kv_cache_params *p,
                                  const mlaf_tensor *latent, const mlaf_tensor *w_q,
                                  const mlaf_tensor *w_kv, const mlaf_tensor *positions,
                                  const mlaf_tensor *cos_sin, const mlaf_tensor *slot_mapping,
                                  const mlaf_kv_cache_desc *cache, const mlaf_tensor *q,
                                  const mlaf_tensor *k_nope, const mlaf_tensor *k_pe,
                                  const mlaf_tensor *error_count, const mlaf_indexer_params *ip,
                                  const mlaf_indexer_k *ik) {
    return mlaf_mla_kv_cache_dsa_quant(ctx, p, latent, w_q, w_kv, positions, cos_sin, slot_mapping, cache, q, k_nope,
                                       k_pe, error_count, ip, ik, NULL);
}

mlaf_status mlaf_indexer_q(mlaf_context *ctx, const mlaf_indexer_params *ip, const mlaf_tensor *q_idx,
                           const mlaf_tensor *positions, const mlaf_tensor *cos_sin, const mlaf_tensor *w,
                           const mlaf_tensor *q_fp8, const mlaf_tensor *w_out, const mlaf_tensor *q_pe,
                           const mlaf_rope_params *q_pe_rope, const mlaf_tensor *error_count) {
    if (!ctx) return MLAF_ERR_NULL_POINTER;
    mlaf_indexer_q_job job;
    mlaf_status st = mlaf_check_indexer_q(ctx, ip, q_idx, positions, cos_sin, w, q_fp8, w_out, q_pe, q_pe_rope,
                                          error_count, &job);
    if (st != MLAF_OK) return st;
    DISPATCH(ctx, indexer_q, MLAF_OP_INDEXER_Q, job.T * (job.H + job.pe_H), &job);
}

mlaf_status mlaf_rope_q(mlaf_context *ctx, const mlaf_rope_params *p, const mlaf_tensor *q,
                        const mlaf_tensor *positions, const mlaf_tensor *cos_sin,
                        const mlaf_tensor *error_count) {
    if (!ctx) return MLAF_ERR_NULL_POINTER;
    mlaf_rope_q_job job;
    mlaf_status st = mlaf_check_rope_q(ctx, p, q, positions, cos_sin, error_count, &job);
    if (st != MLAF_OK) return st;
    DISPATCH(ctx, rope_q, MLAF_OP_ROPE_Q, job.T * job.H, &job);
}

mlaf_status mlaf_rope_q_out(mlaf_context *ctx, const mlaf_rope_params *p, const mlaf_tensor *q,
                            const mlaf_tensor *positions, const mlaf_tensor *cos_sin,
                            const mlaf_tensor *q_out, const mlaf_tensor *error_count) {
    if (!ctx) return MLAF_ERR_NULL_POINTER;
    mlaf_rope_q_job job;
    mlaf_status st = mlaf_check_rope_q_out(ctx, p, q, positions, cos_sin, q_out, error_count, &job);
    if (st != MLAF_OK) return st;
    DISPATCH(ctx, rope_q, MLAF_OP_ROPE_Q, job.T * job.Hpad, &job);
}

mlaf_status mlaf_moe_gate(mlaf_context *ctx, const mlaf_moe_gate_params *p,
                          const mlaf_tensor *logits, const mlaf_tensor *bias,
                          const mlaf_tensor *weights, const mlaf_tensor *ids,
                          const mlaf_tensor *scores) {
    if (!ctx) return MLAF_ERR_NULL_POINTER;
    mlaf_moe_gate_job job;
    mlaf_status st = mlaf_check_moe_gate(ctx, p, logits, bias, weights, ids, scores, &job);
    if (st != MLAF_OK) return st;
    DISPATCH(ctx, moe_gate, MLAF_OP_MOE_GATE, job.T, &job);
}

mlaf_status mlaf_moe_gate_hash(mlaf_context *ctx, const mlaf_moe_gate_params *p,
                               const mlaf_tensor *logits, const mlaf_tensor *tid2eid,
                               const mlaf_tensor *token_ids, const mlaf_tensor *weights,
                               const mlaf_tensor *ids, const mlaf_tensor *scores,
                               const mlaf_tensor *error_count) {
    if (!ctx) return MLAF_ERR_NULL_POINTER;
    mlaf_moe_gate_job job;
    mlaf_status st = mlaf_check_moe_gate_hash(ctx, p, logits, tid2eid, token_ids, weights, ids,
                                              scores, error_count, &job);
    if (st != MLAF_OK) return st;
    DISPATCH(ctx, moe_gate, MLAF_OP_MOE_GATE, job.T, &job);
}

mlaf_status mlaf_rms_norm_quant(mlaf_context *ctx, const mlaf_rms_norm_quant_params *p, const mlaf_tensor *x,
                                const mlaf_tensor *residual, const mlaf_tensor *weight, const mlaf_tensor *y,
                                const mlaf_gemm_out *q) {
    if (!ctx) return MLAF_ERR_NULL_POINTER;
    mlaf_rms_norm_quant_job job;
    mlaf_status st = mlaf_check_rms_norm_quant(ctx, p, x, residual, weight, y, q, &job);
    if (st != MLAF_OK) return st;
    DISPATCH(ctx, rms_norm_quant, MLAF_OP_RMS_NORM_QUANT, job.T, &job);
}

mlaf_status mlaf_gemm_quant(mlaf_context *ctx, const mlaf_tensor *x, const mlaf_gemm_out *q) {
    if (!ctx) return MLAF_ERR_NULL_POINTER;
    mlaf_gemm_quant_job job;
    mlaf_status st = mlaf_check_gemm_quant(ctx, x, q, &job);
    if (st != MLAF_OK) return st;
    DISPATCH(ctx, gemm_quant, MLAF_OP_GEMM_QUANT, job.T, &job);
}

mlaf_status mlaf_rope_table_init(float *table, int64_t max_pos, int32_t rope_dim, double base) {
    if (!table) return MLAF_ERR_NULL_POINTER;
    if (max_pos < 1 || rope_dim <= 0 || rope_dim % 2 != 0 || !(base > 1.0 && base <= MLAF_ROPE_MAX_BASE))
        return MLAF_ERR_INVALID_ARGUMENT;
    int32_t half = rope_dim / 2;
    for (int64_t p = 0; p < max_pos; p++) {
        float *row = table + p * rope_dim;
        for (int32_t i = 0; i < half; i++) {
            double inv_freq = pow(base, -2.0 * i / rope_dim);
            double a = (double)p * inv_freq;
            row[i] = (float)cos(a);
            row[half + i] = (float)sin(a);
        }
    }
    return MLAF_OK;
}
