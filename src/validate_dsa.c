/*
 * validate_dsa.c — validation of the DSA indexer (docs/dsa.md): mla_kv_cache's key branch and the
 * indexer_q op. Same rules as validate.c: metadata only, a message naming the argument, nothing
 * written on a rejection.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "validate_common.h"

static mlaf_status check_params(mlaf_context *ctx, const mlaf_indexer_params *ip) {
    if (!ip) return mlaf_fail(ctx, MLAF_ERR_NULL_POINTER, "indexer params is NULL (required)");
    if (ip->style != MLAF_ROPE_INTERLEAVED && ip->style != MLAF_ROPE_NEOX)
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                         "indexer params.style = %d, expected 0 (interleaved) or 1 (neox)", (int)ip->style);
    if (ip->scale != MLAF_INDEX_SCALE_UE8M0 && ip->scale != MLAF_INDEX_SCALE_F32)
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                         "indexer params.scale = %d, expected 0 (ue8m0) or 1 (f32)", (int)ip->scale);
    if (!(isfinite(ip->ln_eps) && ip->ln_eps > 0.0f))
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT, "indexer params.ln_eps = %g, expected finite and > 0",
                         (double)ip->ln_eps);
    if (!(isfinite(ip->amax_eps) && ip->amax_eps >= 1e-30f))
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                         "indexer params.amax_eps = %g, expected finite and >= 1e-30", (double)ip->amax_eps);
    return MLAF_OK;
}

static mlaf_status check_rope64(mlaf_context *ctx, int32_t R, const char *what) {
    if (R != MLAF_INDEX_ROPE_DIM)
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                         "%s = %d, expected 64 with the indexer (its RoPE reads 64-wide cos_sin rows)", what, R);
    return MLAF_OK;
}

mlaf_status mlaf_check_indexer_k(mlaf_context *ctx, const mlaf_indexer_params *ip, const mlaf_indexer_k *ik,
                                 const mlaf_mla_kv_cache_params *p, const mlaf_tensor *latent,
                                 const mlaf_tensor *w_q, const mlaf_tensor *w_kv,
                                 const mlaf_tensor *positions, const mlaf_tensor *cos_sin,
                                 const mlaf_tensor *slot_mapping, const mlaf_kv_cache_desc *cache,
                                 const mlaf_tensor *q, const mlaf_tensor *k_nope, const mlaf_tensor *k_pe,
                                 const mlaf_tensor *error_count, const mlaf_kv_cache_job *kv, mlaf_index_job *job) {
    TRY(check_params(ctx, ip));
    if (p->kv_rope_tail > 0) /* DeepSeek-V4: pooled 4-token indexer keys, another design (docs/models.md) */
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                         "kv_rope_tail = %d: the indexer key branch is DSA's (GLM-5, DeepSeek-V3.2), not "
                         "DeepSeek-V4's pooled indexer", p->kv_rope_tail);
    TRY(check_rope64(ctx, p->rope_dim, "rope_dim"));
    if (p->style == MLAF_ROPE_NONE)
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                         "rope style = 2 (none) with the indexer key branch: its keys rotate with the tokens' "
                         "positions (every DSA model rotates k_pe too)");
    const int64_t T = kv->norm.T, D = MLAF_INDEX_HEAD_DIM;
    const mlaf_dtype dt = kv->norm.dt;
    static const char *const row_expr[2] = {"tokens", "index_head_dim 128"};
    static const char *const vec_expr[1] = {"index_head_dim 128"};
    const int64_t wrow[2] = {T, D}, wvec[1] = {D};
    TRY(mlaf_vcheck_tensor(ctx, ik->index_k, "index_k", DT_(dt), 2, wrow, row_expr));
    TRY(mlaf_vcheck_tensor(ctx, ik->weight, "index_weight", DT_(dt) | DT_(MLAF_F32), 1, wvec, vec_expr));
    TRY(mlaf_vcheck_tensor(ctx, ik->bias, "index_bias", DT_(ik->weight->dtype), 1, wvec, vec_expr));
    TRY(mlaf_vcheck_tensor(ctx, ik->cache, "index_cache", DT_BYTES, 2, NULL, NULL));
    const mlaf_tensor *c = ik->cache;
    if (c->shape[0] != kv->num_blocks)
        return mlaf_fail(ctx, MLAF_ERR_SHAPE, "index_cache.shape[0] = %lld, expected kv_cache's num_blocks %lld",
                         (long long)c->shape[0], (long long)kv->num_blocks);
    if (kv->block_size > INT64_MAX / (D + 4) || c->shape[1] < kv->block_size * (D + 4))
        return mlaf_fail(ctx, MLAF_ERR_SHAPE,
                         "index_cache.shape[1] = %lld bytes, expected >= 132 * block_size = %lld (block-planar "
                         "128 e4m3 bytes and a 4-byte scale per token)",
                         (long long)c->shape[1], (long long)(kv->block_size * (D + 4)));
    const int32_t copies = ik->copies > 1 ? ik->copies : 1;
    if (ik->copies < 0 || ik->copies > 8)
        return mlaf_fail(ctx, MLAF_ERR_LIMIT, "index copies = %d, expected 0 .. 8 (destination caches)",
                         (int)ik->copies);
    if (copies > 1) {
        /* the view's span: (num_blocks - 1) * stride + bytes, below 2^62 (checked above) */
        const int64_t span = c->shape[0] == 0 ? 0 : (c->shape[0] - 1) * c->stride[0] + c->shape[1];
        if (ik->copy_stride < span || ik->copy_stride > (MLAF_MAX_VIEW_BYTES - span) / (copies - 1) ||
            (uintptr_t)c->data > UINTPTR_MAX - (uintptr_t)(ik->copy_stride * (copies - 1) + span))
            return mlaf_fail(ctx, MLAF_ERR_STRIDE,
                             "index copy_stride = %lld bytes, expected >= the %lld bytes one index_cache spans "
                             "(copies must not overlap) and all %d copies inside the address space",
                             (long long)ik->copy_stride, (long long)span, (int)copies);
    }
    if (ik->out) TRY(mlaf_vcheck_tensor(ctx, ik->out, "index_out", DT_(dt), 2, wrow, row_expr));
    if (ik->topk_fill) {
        static const char *const tk_expr[2] = {"tokens", NULL};
        const int64_t wt[2] = {T, -1};
        TRY(mlaf_vcheck_tensor(ctx, ik->topk_fill, "topk_fill", DT_(MLAF_I32), 2, wt, tk_expr));
    }
    /* out may be index_k itself (the in-place form); any other overlap is an error. */
    const int out_in_place = ik->out && ik->out->data == ik->index_k->data &&
                             (T <= 1 || ik->out->stride[0] == ik->index_k->stride[0]);
    const mlaf_tensor *ins[10] = {latent, positions, cos_sin, slot_mapping, cache->scale, ik->index_k, ik->weight,
                                  ik->bias, w_q, w_kv};
    const char *in_names[10] = {"latent", "positions", "cos_sin", "slot_mapping", "scale", "index_k", "index_weight",
                                "index_bias", "w_q", "w_kv"};
    const mlaf_tensor *mla_outs[7] = {q, k_nope, k_pe, cache->cache, cache->kpe, cache->amax_out, error_count};
    const char *mla_names[7] = {"q", "k_nope", "k_pe", "kv_cache", "kpe", "amax_out", "error_count"};
    const mlaf_tensor *outs[3] = {ik->cache, ik->out, ik->topk_fill};
    const char *out_names[3] = {"index_cache", "index_out", "topk_fill"};
    /* every copy of the index cache is an output like the first (the copies apart by copy_stride) */
    mlaf_tensor cp = *ik->cache;
    for (int32_t k = 1; k < copies; k++) {
        cp.data = (char *)ik->cache->data + (int64_t)k * ik->copy_stride;
        for (int i = 0; i < 10; i++) TRY(mlaf_vcheck_no_overlap(ctx, &cp, "an index_cache copy", ins[i], in_names[i]));
        for (int i = 0; i < 7; i++) TRY(mlaf_vcheck_no_overlap(ctx, &cp, "an index_cache copy", mla_outs[i], mla_names[i]));
        TRY(mlaf_vcheck_no_overlap(ctx, &cp, "an index_cache copy", ik->out, "index_out"));
        TRY(mlaf_vcheck_no_overlap(ctx, &cp, "an index_cache copy", ik->topk_fill, "topk_fill"));
    }
    for (int i = 0; i < 3; i++) {
        if (!outs[i]) continue;
        for (int k = 0; k < 10; k++) {
            if (i == 1 && k == 5 && out_in_place) continue;
            TRY(mlaf_vcheck_no_overlap(ctx, outs[i], out_names[i], ins[k], in_names[k]));
        }
        for (int k = 0; k < 7; k++) TRY(mlaf_vcheck_no_overlap(ctx, outs[i], out_names[i], mla_outs[k], mla_names[k]));
        for (int k = i + 1; k < 3; k++) TRY(mlaf_vcheck_no_overlap(ctx, outs[i], out_names[i], outs[k], out_names[k]));
    }
    /* The MLA outputs must not write the indexer's inputs either. */
    for (int i = 0; i < 7; i++)
        for (int k = 5; k < 8; k++) TRY(mlaf_vcheck_no_overlap(ctx, mla_outs[i], mla_names[i], ins[k], in_names[k]));

    mlaf_index_job j;
    memset(&j, 0, sizeof j);
    j.style = ip->style;
    j.hadamard = ip->hadamard != 0;
    j.ln_eps = ip->ln_eps;
    j.amax_eps = ip->amax_eps;
    j.scale = ip->scale;
    j.k = ik->index_k->data;
    j.k_stride = ik->index_k->stride[0];
    j.w = ik->weight->data;
    j.b = ik->bias->data;
    j.w_dt = ik->weight->dtype;
    j.cache = (uint8_t *)c->data;
    j.block_stride = c->stride[0];
    j.out = ik->out ? ik->out->data : NULL;
    j.out_stride = ik->out ? ik->out->stride[0] : 0;
    j.topk = ik->topk_fill ? (int32_t *)ik->topk_fill->data : NULL;
    j.topk_stride = ik->topk_fill ? ik->topk_fill->stride[0] : 0;
    j.topk_n = ik->topk_fill ? ik->topk_fill->shape[1] : 0;
    j.copies = copies;
    j.copy_stride = copies > 1 ? ik->copy_stride : 0;
    *job = j;
    return MLAF_OK;
}

/* The row ops' quantized outputs (already checked against the MLA tensors) against the indexer's
 * tensors and every index cache copy. */
mlaf_status mlaf_check_index_apart(mlaf_context *ctx, const mlaf_indexer_k *ik, const mlaf_norm_job *job,
                                   const mlaf_row_quant *rq) {
    if (!rq || !ik) return MLAF_OK;
    const mlaf_gemm_out *outs[2] = {job->qq.format ? &rq->q : NULL, job->kq.format ? &rq->k_nope : NULL};
    static const char *const data_names[2] = {"quant->q.data", "quant->k_nope.data"};
    static const char *const scale_names[2] = {"quant->q.scales", "quant->k_nope.scales"};
    const mlaf_tensor *ix[5] = {ik->index_k, ik->weight, ik->bias, ik->out, ik->topk_fill};
    static const char *const ix_names[5] = {"index_k", "index_weight", "index_bias", "index_out", "topk_fill"};
    const int32_t copies = ik->copies > 1 ? ik->copies : 1;
    for (int i = 0; i < 2; i++) {
        if (!outs[i]) continue;
        for (int k = 0; k < 5; k++) {
            TRY(mlaf_vcheck_no_overlap(ctx, outs[i]->data, data_names[i], ix[k], ix_names[k]));
            TRY(mlaf_vcheck_no_overlap(ctx, outs[i]->scales, scale_names[i], ix[k], ix_names[k]));
        }
        mlaf_tensor cp = *ik->cache;
        for (int32_t k = 0; k < copies; k++) {
            cp.data = (char *)ik->cache->data + (int64_t)k * ik->copy_stride;
            TRY(mlaf_vcheck_no_overlap(ctx, outs[i]->data, data_names[i], &cp, k ? "an index_cache copy" : "index_cache"));
            TRY(mlaf_vcheck_no_overlap(ctx, outs[i]->scales, scale_names[i], &cp,
                                       k ? "an index_cache copy" : "index_cache"));
        }
    }
    return MLAF_OK;
}

mlaf_status mlaf_check_indexer_q(mlaf_context *ctx, const mlaf_indexer_params *ip, const mlaf_tensor *q_idx,
                                 const mlaf_tensor *positions, const mlaf_tensor *cos_sin, const mlaf_tensor *w,
                                 const mlaf_tensor *q_fp8, const mlaf_tensor *w_out, const mlaf_tensor *q_pe,
                                 const mlaf_rope_params *q_pe_rope, const mlaf_tensor *error_count,
                                 mlaf_indexer_q_job *job) {
    TRY(check_params(ctx, ip));
    static const char *const q_expr[3] = {NULL, NULL, "index_head_dim 128"};
    const int64_t wq[3] = {-1, -1, MLAF_INDEX_HEAD_DIM};
    TRY(mlaf_vcheck_tensor(ctx, q_idx, "q_idx", DT_FLOAT, 3, wq, q_expr));
    const int64_t T = q_idx->shape[0], H = q_idx->shape[1];
    if (T >= ((int64_t)1 << 31))
        return mlaf_fail(ctx, MLAF_ERR_LIMIT, "q_idx.shape[0] = %lld tokens, expected < 2^31", (long long)T);
    if (H >= ((int64_t)1 << 20))
        return mlaf_fail(ctx, MLAF_ERR_LIMIT, "q_idx.shape[1] = %lld heads, expected < 2^20", (long long)H);
    mlaf_indexer_q_job j;
    memset(&j, 0, sizeof j);
    TRY(mlaf_vcheck_rope_inputs(ctx, MLAF_INDEX_ROPE_DIM, ip->style, T, positions, cos_sin, &j.rope));
    static const char *const th_expr[2] = {"q_idx.shape[0]", "q_idx.shape[1]"};
    static const char *const thd_expr[3] = {"q_idx.shape[0]", "q_idx.shape[1]", "index_head_dim 128"};
    const int64_t wth[2] = {T, H}, wthd[3] = {T, H, MLAF_INDEX_HEAD_DIM};
    TRY(mlaf_vcheck_tensor(ctx, w, "w", DT_(q_idx->dtype) | DT_(MLAF_F32), 2, wth, th_expr));
    TRY(mlaf_vcheck_tensor(ctx, q_fp8, "q_fp8", DT_BYTES, 3, wthd, thd_expr));
    TRY(mlaf_vcheck_tensor(ctx, w_out, "w_out", DT_(MLAF_F32), 2, wth, th_expr));
    if (error_count) {
        const int64_t one[1] = {1};
        TRY(mlaf_vcheck_tensor(ctx, error_count, "error_count", DT_(MLAF_I32), 1, one, NULL));
    }
    if (q_pe) {
        if (!q_pe_rope)
            return mlaf_fail(ctx, MLAF_ERR_NULL_POINTER, "q_pe_rope is NULL (required with q_pe)");
        TRY(check_rope64(ctx, q_pe_rope->rope_dim, "q_pe_rope.rope_dim"));
        if (q_pe_rope->style != MLAF_ROPE_INTERLEAVED && q_pe_rope->style != MLAF_ROPE_NEOX)
            return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                             "q_pe_rope.style = %d, expected 0 (interleaved) or 1 (neox)", (int)q_pe_rope->style);
        static const char *const pe_expr[3] = {"q_idx.shape[0]", NULL, NULL};
        const int64_t wpe[3] = {T, -1, -1};
        TRY(mlaf_vcheck_tensor(ctx, q_pe, "q_pe", DT_FLOAT, 3, wpe, pe_expr));
        if (q_pe->shape[2] < MLAF_INDEX_ROPE_DIM || q_pe->shape[2] > (1 << 20))
            return mlaf_fail(ctx, MLAF_ERR_SHAPE, "q_pe.shape[2] = %lld, expected in [rope_dim 64, 2^20] (nope + rope)",
                             (long long)q_pe->shape[2]);
        if (q_pe->shape[1] >= ((int64_t)1 << 20))
            return mlaf_fail(ctx, MLAF_ERR_LIMIT, "q_pe.shape[1] = %lld heads, expected < 2^20",
                             (long long)q_pe->shape[1]);
    }
    const mlaf_tensor *ins[4] = {q_idx, positions, cos_sin, w};
    const char *in_names[4] = {"q_idx", "positions", "cos_sin", "w"};
    const mlaf_tensor *outs[4] = {q_fp8, w_out, q_pe, error_count};
    const char *out_names[4] = {"q_fp8", "w_out", "q_pe", "error_count"};
    for (int i = 0; i < 4; i++) {
        if (!outs[i]) continue;
        for (int k = 0; k < 4; k++) TRY(mlaf_vcheck_no_overlap(ctx, outs[i], out_names[i], ins[k], in_names[k]));
        for (int k = i + 1; k < 4; k++)
            if (outs[k]) TRY(mlaf_vcheck_no_overlap(ctx, outs[i], out_names[i], outs[k], out_names[k]));
    }
    j.scale = ip->scale;
    j.hadamard = ip->hadamard != 0;
    j.amax_eps = ip->amax_eps;
    j.T = T, j.H = H;
    j.dt = q_idx->dtype;
    j.q = q_idx->data;
    j.q_s0 = q_idx->stride[0], j.q_s1 = q_idx->stride[1];
    j.w = w->data;
    j.w_dt = w->dtype;
    j.w_stride = w->stride[0];
    j.q_fp8 = (uint8_t *)q_fp8->data;
    j.f_s0 = q_fp8->stride[0], j.f_s1 = q_fp8->stride[1];
    j.w_out = (float *)w_out->data;
    j.wo_stride = w_out->stride[0];
    j.w_fold = (float)(1.0 / sqrt((double)MLAF_INDEX_HEAD_DIM));
    j.h_fold = H > 0 ? (float)(1.0 / sqrt((double)H)) : 0.0f;
    if (q_pe) {
        j.q_pe = q_pe->data;
        j.pe_dt = q_pe->dtype;
        j.pe_H = q_pe->shape[1];
        j.pe_s0 = q_pe->stride[0], j.pe_s1 = q_pe->stride[1];
        j.pe_D = (int32_t)q_pe->shape[2];
        j.pe_style = q_pe_rope->style;
    }
    j.error_count = error_count ? (int32_t *)error_count->data : NULL;
    *job = j;
    return MLAF_OK;
}
