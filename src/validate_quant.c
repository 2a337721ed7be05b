/*
 * validate_quant.c — the validation of rms_norm_quant, gemm_quant and the row ops' quantized outputs
 * (include/mlafuse/quant.h): the shared checks of validate.c for the dense tensors, mlaf_vcheck_gemm_out
 * (gemm_format.c) for the quantized outputs, then the overlaps. Metadata only, as every check.
 */
#include <math.h>
#include <string.h>

#include "gemm_format.h"
#include "validate_common.h"

/* y is exactly x: the same data and row stride (the in-place form). Shapes and dtypes already agree. */
static int same_view(const mlaf_tensor *y, const mlaf_tensor *x) {
    return y->data == x->data && (y->shape[0] <= 1 || y->stride[0] == x->stride[0]);
}

mlaf_status mlaf_check_rms_norm_quant(mlaf_context *ctx, const mlaf_rms_norm_quant_params *p, const mlaf_tensor *x,
                                      const mlaf_tensor *residual, const mlaf_tensor *weight, const mlaf_tensor *y,
                                      const mlaf_gemm_out *q, mlaf_rms_norm_quant_job *job) {
    if (!p) return mlaf_fail(ctx, MLAF_ERR_NULL_POINTER, "params is NULL (required)");
    if (!(isfinite(p->eps) && p->eps > 0.0f))
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT, "eps = %g, expected finite and > 0", (double)p->eps);
    const int64_t any2[2] = {-1, -1};
    TRY(mlaf_vcheck_tensor(ctx, x, "x", DT_FLOAT, 2, any2, NULL));
    const int64_t T = x->shape[0], K = x->shape[1];
    if (T >= ((int64_t)1 << 31))
        return mlaf_fail(ctx, MLAF_ERR_LIMIT, "x.shape[0] = %lld tokens, expected < 2^31", (long long)T);
    if (K < 1) return mlaf_fail(ctx, MLAF_ERR_SHAPE, "x.shape[1] = %lld, expected >= 1 (the hidden size K)", (long long)K);
    if (K > ((int64_t)1 << 20))
        return mlaf_fail(ctx, MLAF_ERR_LIMIT, "x.shape[1] = %lld, expected <= 1048576 (the hidden size K)", (long long)K);
    const mlaf_dtype dt = x->dtype;
    static const char *const w_expr[1] = {"x.shape[1]"};
    static const char *const row_expr[2] = {"x.shape[0]", "x.shape[1]"};
    const int64_t wk[1] = {K}, wtk[2] = {T, K};
    TRY(mlaf_vcheck_tensor(ctx, weight, "weight", (1u << dt) | (1u << MLAF_F32), 1, wk, w_expr));
    if (residual) TRY(mlaf_vcheck_tensor(ctx, residual, "residual", 1u << dt, 2, wtk, row_expr));
    if (y) TRY(mlaf_vcheck_tensor(ctx, y, "y", 1u << dt, 2, wtk, row_expr));
    mlaf_gemm_out_job qj;
    TRY(mlaf_vcheck_gemm_out(ctx, q, "q", T, K, &qj));
    if (!y && qj.format == MLAF_GEMM_NONE)
        return mlaf_fail(ctx, MLAF_ERR_NULL_POINTER,
                         "y is NULL and q has no format: nothing to write (give y, q or both)");

    /* Overlaps: residual is written in place, y may be x exactly, the quantized tensors are apart
     * from everything. */
    if (residual) {
        TRY(mlaf_vcheck_no_overlap(ctx, residual, "residual", x, "x"));
        TRY(mlaf_vcheck_no_overlap(ctx, residual, "residual", weight, "weight"));
    }
    if (y) {
        if (!same_view(y, x))
            TRY(mlaf_vcheck_no_overlap(ctx, y, "y", x, "x (only the exact in-place form may: y = x, the same view)"));
        TRY(mlaf_vcheck_no_overlap(ctx, y, "y", weight, "weight"));
        TRY(mlaf_vcheck_no_overlap(ctx, y, "y", residual, "residual"));
    }
    if (qj.format != MLAF_GEMM_NONE) {
        const mlaf_tensor *others[4] = {x, weight, residual, y};
        static const char *const names[4] = {"x", "weight", "residual", "y"};
        for (int i = 0; i < 4; i++) {
            TRY(mlaf_vcheck_no_overlap(ctx, q->data, "q.data", others[i], names[i]));
            TRY(mlaf_vcheck_no_overlap(ctx, q->scales, "q.scales", others[i], names[i]));
        }
    }

    memset(job, 0, sizeof *job);
    job->T = T;
    job->K = (int32_t)K;
    job->eps = p->eps;
    job->dt = dt;
    job->x = x->data;
    job->x_stride = x->stride[0];
    if (residual) {
        job->residual = residual->data;
        job->r_stride = residual->stride[0];
    }
    job->w = weight->data;
    job->w_dt = weight->dtype;
    if (y) {
        job->y = y->data;
        job->y_stride = y->stride[0];
    }
    job->q = qj;
    return MLAF_OK;
}

/* ---- the row ops' quantized outputs (mlaf_row_quant) ---------------------------------------- */

mlaf_status mlaf_check_row_quant(mlaf_context *ctx, const mlaf_row_quant *rq, int32_t tail,
                                 const mlaf_tensor *const *others, const char *const *names, int n,
                                 mlaf_norm_job *job) {
    memset(&job->qq, 0, sizeof job->qq);
    memset(&job->kq, 0, sizeof job->kq);
    if (!rq) return MLAF_OK;
    if (rq->q.format != MLAF_GEMM_NONE && job->Q == 0)
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                         "quant->q has format %s but q_lora_rank = 0 (no q part); give format NONE",
                         mlaf_gemm_format_name(rq->q.format));
    if (rq->k_nope.format != MLAF_GEMM_NONE && tail > 0)
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                         "quant->k_nope has format %s with kv_rope_tail = %d: a quantized k_nope is not "
                         "written with a rope tail (give format NONE)",
                         mlaf_gemm_format_name(rq->k_nope.format), tail);
    mlaf_gemm_out_job qq, kq;
    TRY(mlaf_vcheck_gemm_out(ctx, &rq->q, "quant->q", job->T, job->Q, &qq));
    TRY(mlaf_vcheck_gemm_out(ctx, &rq->k_nope, "quant->k_nope", job->T, job->C, &kq));
    const mlaf_gemm_out *outs[2] = {&rq->q, &rq->k_nope};
    static const char *const data_names[2] = {"quant->q.data", "quant->k_nope.data"};
    static const char *const scale_names[2] = {"quant->q.scales", "quant->k_nope.scales"};
    for (int i = 0; i < 2; i++) {
        if (outs[i]->format == MLAF_GEMM_NONE) continue;
        for (int k = 0; k < n; k++) {
            if (!others[k]) continue;
            TRY(mlaf_vcheck_no_overlap(ctx, outs[i]->data, data_names[i], others[k], names[k]));
            TRY(mlaf_vcheck_no_overlap(ctx, outs[i]->scales, scale_names[i], others[k], names[k]));
        }
        if (i == 1 && outs[0]->format != MLAF_GEMM_NONE) {
            TRY(mlaf_vcheck_no_overlap(ctx, outs[1]->data, data_names[1], outs[0]->data, data_names[0]));
            TRY(mlaf_vcheck_no_overlap(ctx, outs[1]->data, data_names[1], outs[0]->scales, scale_names[0]));
            TRY(mlaf_vcheck_no_overlap(ctx, outs[1]->scales, scale_names[1], outs[0]->data, data_names[0]));
            TRY(mlaf_vcheck_no_overlap(ctx, outs[1]->scales, scale_names[1], outs[0]->scales, scale_names[0]));
        }
    }
    job->qq = qq;
    job->kq = kq;
    return MLAF_OK;
}

/* gemm_quant: x, then its one output through the shared gemm_out check, then the overlaps. */
mlaf_status mlaf_check_gemm_quant(mlaf_context *ctx, const mlaf_tensor *x, const mlaf_gemm_out *q,
                                  mlaf_gemm_quant_job *job) {
    const int64_t any2[2] = {-1, -1};
    TRY(mlaf_vcheck_tensor(ctx, x, "x", DT_FLOAT, 2, any2, NULL));
    const int64_t T = x->shape[0], K = x->shape[1];
    if (T >= ((int64_t)1 << 31))
        return mlaf_fail(ctx, MLAF_ERR_LIMIT, "x.shape[0] = %lld tokens, expected < 2^31", (long long)T);
    if (K < 1) return mlaf_fail(ctx, MLAF_ERR_SHAPE, "x.shape[1] = %lld, expected >= 1 (the row width K)", (long long)K);
    if (K > ((int64_t)1 << 20))
        return mlaf_fail(ctx, MLAF_ERR_LIMIT, "x.shape[1] = %lld, expected <= 1048576 (the row width K)", (long long)K);
    if (!q)
        return mlaf_fail(ctx, MLAF_ERR_NULL_POINTER, "q is NULL (required: the quantized output gemm_quant writes)");
    mlaf_gemm_out_job qj;
    TRY(mlaf_vcheck_gemm_out(ctx, q, "q", T, K, &qj));
    if (qj.format == MLAF_GEMM_NONE)
        return mlaf_fail(ctx, MLAF_ERR_NULL_POINTER,
                         "q.format = 0 (none): nothing to write (gemm_quant needs a GEMM-input format)");
    TRY(mlaf_vcheck_no_overlap(ctx, q->data, "q.data", x, "x"));
    TRY(mlaf_vcheck_no_overlap(ctx, q->scales, "q.scales", x, "x"));

    memset(job, 0, sizeof *job);
    job->T = T;
    job->K = (int32_t)K;
    job->dt = x->dtype;
    job->x = x->data;
    job->x_stride = x->stride[0];
    job->q = qj;
    return MLAF_OK;
}
