/*
 * validate_hash.c — validation of mlaf_moe_gate_hash (docs/moe_gate.md: DeepSeek-V4's hash-routed layers).
 * Same rules as validate.c: metadata only, a message naming the argument, nothing written on a
 * rejection. The router's own arguments are moe_gate's (mlaf_check_moe_gate).
 */
#include "internal.h"
#include "validate_common.h"

mlaf_status mlaf_check_moe_gate_hash(mlaf_context *ctx, const mlaf_moe_gate_params *p,
                                     const mlaf_tensor *logits, const mlaf_tensor *tid2eid,
                                     const mlaf_tensor *token_ids, const mlaf_tensor *weights,
                                     const mlaf_tensor *ids, const mlaf_tensor *scores,
                                     const mlaf_tensor *error_count, mlaf_moe_gate_job *job) {
    if (!p) return mlaf_fail(ctx, MLAF_ERR_NULL_POINTER, "params is NULL (required)");
    /* No selection, so no group limit: the group fields must say "none". */
    if (p->n_group != 1)
        return mlaf_fail(ctx, MLAF_ERR_LIMIT, "n_group = %d, expected 1 (hash routing has no group limit)",
                         p->n_group);
    if (p->topk_group != 1)
        return mlaf_fail(ctx, MLAF_ERR_LIMIT,
                         "topk_group = %d, expected 1 (hash routing has no group limit)", p->topk_group);
    mlaf_moe_gate_job j;
    TRY(mlaf_check_moe_gate(ctx, p, logits, NULL, weights, ids, scores, &j));
    static const char *const texpr[2] = {NULL, "top_k"};
    int64_t wt[2] = {-1, p->top_k};
    TRY(mlaf_vcheck_tensor(ctx, tid2eid, "tid2eid", DT_INDEX, 2, wt, texpr));
    if (tid2eid->shape[0] < 1)
        return mlaf_fail(ctx, MLAF_ERR_SHAPE, "tid2eid.shape[0] = 0, expected a vocabulary of >= 1 token ids");
    static const char *const kexpr[1] = {"logits.shape[0]"};
    int64_t wk[1] = {j.T};
    TRY(mlaf_vcheck_tensor(ctx, token_ids, "token_ids", DT_INDEX, 1, wk, kexpr));
    TRY(mlaf_vcheck_error_count(ctx, error_count));
    const mlaf_tensor *ins[3] = {logits, tid2eid, token_ids};
    const char *in_names[3] = {"logits", "tid2eid", "token_ids"};
    const mlaf_tensor *outs[4] = {weights, ids, scores, error_count};
    const char *out_names[4] = {"weights", "ids", "scores", "error_count"};
    for (int o = 0; o < 4; o++) {
        if (!outs[o]) continue;
        for (int i = 1; i < 3; i++) TRY(mlaf_vcheck_no_overlap(ctx, outs[o], out_names[o], ins[i], in_names[i]));
        if (o == 3) /* the other outputs were checked against each other by moe_gate's check */
            for (int k = 0; k < 3; k++)
                if (outs[k]) TRY(mlaf_vcheck_no_overlap(ctx, error_count, "error_count", outs[k], out_names[k]));
    }
    TRY(mlaf_vcheck_no_overlap(ctx, error_count, "error_count", logits, "logits"));
    j.tid2eid = tid2eid->data;
    j.tid2eid_dt = tid2eid->dtype;
    j.tid2eid_stride = tid2eid->stride[0];
    j.vocab = tid2eid->shape[0];
    j.token_ids = token_ids->data;
    j.token_ids_dt = token_ids->dtype;
    j.error_count = error_count ? (int32_t *)error_count->data : NULL;
    *job = j;
    return MLAF_OK;
}
