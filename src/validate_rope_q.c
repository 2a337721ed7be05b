/*
 * validate_rope_q.c — validation of rope_q and rope_q_out (include/mlafuse/mla.h): the shared checks
 * of validate.c (mlaf_vcheck_*), the same rules (metadata only, a message naming the argument,
 * nothing written on a rejection).
 */
#include <math.h>
#include <string.h>

#include "internal.h"
#include "validate_common.h"

mlaf_status mlaf_check_rope_q(mlaf_context *ctx, const mlaf_rope_params *p, const mlaf_tensor *q,
                              const mlaf_tensor *positions, const mlaf_tensor *cos_sin,
                              const mlaf_tensor *error_count, mlaf_rope_q_job *job) {
    return mlaf_check_rope_q_out(ctx, p, q, positions, cos_sin, NULL, error_count, job);
}

mlaf_status mlaf_check_rope_q_out(mlaf_context *ctx, const mlaf_rope_params *p, const mlaf_tensor *q,
                                  const mlaf_tensor *positions, const mlaf_tensor *cos_sin,
                                  const mlaf_tensor *q_out, const mlaf_tensor *error_count,
                                  mlaf_rope_q_job *job) {
    if (!p) return mlaf_fail(ctx, MLAF_ERR_NULL_POINTER, "params is NULL (required)");
    /* Checked whatever head_norm says: a NaN / infinite / negative eps is a caller's mistake
     * even where no head norm reads it. */
    const float heps = p->head_norm_eps == 0.0f ? 1e-6f : p->head_norm_eps;
    if (!(isfinite(heps) && heps > 0.0f))
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                         "head_norm_eps = %g, expected finite and > 0 (0: the default 1e-6), "
                         "whatever head_norm is",
                         (double)p->head_norm_eps);
    if (p->rope_dim <= 0)
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT, "rope_dim = %d, expected > 0 and even",
                         p->rope_dim);
    TRY(mlaf_vcheck_tensor(ctx, q, "q", DT_FLOAT, 3, NULL, NULL));
    if (q->shape[0] >= ((int64_t)1 << 31))
        return mlaf_fail(ctx, MLAF_ERR_LIMIT, "q.shape[0] = %lld tokens, expected < 2^31", (long long)q->shape[0]);
    if (q->shape[2] < p->rope_dim)
        return mlaf_fail(ctx, MLAF_ERR_SHAPE,
                         "q.shape[2] = %lld, expected >= rope_dim = %d (head dim = nope + rope)",
                         (long long)q->shape[2], p->rope_dim);
    if (q->shape[2] > (1 << 20))
        return mlaf_fail(ctx, MLAF_ERR_LIMIT, "q.shape[2] = %lld, expected <= 1048576",
                         (long long)q->shape[2]);
    mlaf_rope_q_job j;
    memset(&j, 0, sizeof j);
    TRY(mlaf_vcheck_rope_inputs(ctx, p->rope_dim, p->style, q->shape[0], positions, cos_sin, &j.rope));
    TRY(mlaf_vcheck_error_count(ctx, error_count));
    TRY(mlaf_vcheck_no_overlap(ctx, q, "q", positions, "positions"));
    TRY(mlaf_vcheck_no_overlap(ctx, q, "q", cos_sin, "cos_sin"));
    TRY(mlaf_vcheck_no_overlap(ctx, q, "q", error_count, "error_count"));
    TRY(mlaf_vcheck_no_overlap(ctx, error_count, "error_count", positions, "positions"));
    TRY(mlaf_vcheck_no_overlap(ctx, error_count, "error_count", cos_sin, "cos_sin"));
    if (q_out) {
        static const char *const oexpr[3] = {"q.shape[0]", NULL, "q.shape[2]"};
        int64_t wo[3] = {q->shape[0], -1, q->shape[2]};
        TRY(mlaf_vcheck_tensor(ctx, q_out, "q_out", DT_(q->dtype), 3, wo, oexpr));
        if (q_out->shape[1] < q->shape[1])
            return mlaf_fail(ctx, MLAF_ERR_SHAPE,
                             "q_out.shape[1] = %lld, expected >= q.shape[1] = %lld (heads past q's are "
                             "written as zeros)",
                             (long long)q_out->shape[1], (long long)q->shape[1]);
        TRY(mlaf_vcheck_no_overlap(ctx, q_out, "q_out", q, "q"));
        TRY(mlaf_vcheck_no_overlap(ctx, q_out, "q_out", positions, "positions"));
        TRY(mlaf_vcheck_no_overlap(ctx, q_out, "q_out", cos_sin, "cos_sin"));
        TRY(mlaf_vcheck_no_overlap(ctx, q_out, "q_out", error_count, "error_count"));
    }
    j.head_norm = p->head_norm != 0;
    j.head_eps = heps;
    j.q_out = q_out ? q_out->data : NULL;
    j.Hpad = q_out ? q_out->shape[1] : q->shape[1];
    j.o0 = q_out ? q_out->stride[0] : 0;
    j.o1 = q_out ? q_out->stride[1] : 0;
    j.T = q->shape[0];
    j.H = q->shape[1];
    j.D = (int32_t)q->shape[2];
    j.q = q->data;
    j.dt = q->dtype;
    j.s0 = q->stride[0];
    j.s1 = q->stride[1];
    j.error_count = error_count ? (int32_t *)error_count->data : NULL;
    *job = j;
    return MLAF_OK;
}
