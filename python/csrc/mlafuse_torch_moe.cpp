// mlafuse_torch_moe.cpp — the router ops of the torch extension: moe_gate and moe_gate_hash (see mlafuse_torch.h;
// registered in mlafuse_torch.cpp).
#include "mlafuse_torch.h"

namespace mlafuse_torch {

// ---- moe_gate ----------------------------------------------------------------------------
void gate_out_impl(const at::Tensor &logits, const std::optional<at::Tensor> &bias,
                   const at::Tensor &weights, const at::Tensor &ids,
                   const std::optional<at::Tensor> &scores, int64_t top_k, int64_t n_group,
                   int64_t topk_group, int64_t score_func, int64_t group_score, bool renormalize,
                   double routed_scaling_factor, bool apply_routed_scaling, double eps,
                   int64_t n_shared_experts) {
    need_api();
    const c10::Device d = logits.device();
    mlaf_context *ctx = context_for(d);
    View vl(logits, "logits", d, false), vb(bias, "bias", d, false),
        vw(weights, "weights", d, true), vi(ids, "ids", d, true), vs(scores, "scores", d, true);
    mlaf_moe_gate_params p;
    p.top_k = (int32_t)top_k;
    p.n_group = (int32_t)n_group;
    p.topk_group = (int32_t)topk_group;
    p.score_func = (mlaf_score_func)score_func;
    p.group_score = (mlaf_group_score)group_score;
    p.renormalize = renormalize ? 1 : 0;
    p.routed_scaling_factor = (float)routed_scaling_factor;
    p.apply_routed_scaling = apply_routed_scaling ? 1 : 0;
    p.eps = (float)eps;
    p.n_shared_experts = (int32_t)n_shared_experts;
    check(ctx, api.moe_gate(ctx, &p, vl.p, vb.p, vw.p, vi.p, vs.p));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> moe_gate(
    const at::Tensor &logits, const std::optional<at::Tensor> &bias, int64_t top_k,
    int64_t n_group, int64_t topk_group, int64_t score_func, int64_t group_score,
    bool renormalize, double routed_scaling_factor, bool apply_routed_scaling, double eps,
    int64_t n_shared_experts, bool return_scores, std::optional<c10::ScalarType> weights_dtype) {
    const int64_t T = rows_of(logits), E = logits.dim() >= 2 ? logits.size(1) : 0;
    const int64_t K = nonneg(top_k + n_shared_experts);
    at::Tensor w = alloc(logits, T, K, weights_dtype.value_or(c10::ScalarType::Float)),
               i = alloc(logits, T, K, c10::ScalarType::Int),
               s = alloc(logits, T, return_scores ? E : 0, c10::ScalarType::Float);
    gate_out_impl(logits, bias, w, i, return_scores ? std::optional<at::Tensor>(s) : std::nullopt,
                  top_k, n_group, topk_group, score_func, group_score, renormalize,
                  routed_scaling_factor, apply_routed_scaling, eps, n_shared_experts);
    return {w, i, s};
}

void moe_gate_out(const at::Tensor &logits, const std::optional<at::Tensor> &bias,
                  const at::Tensor &weights, const at::Tensor &ids,
                  const std::optional<at::Tensor> &scores, int64_t top_k, int64_t n_group,
                  int64_t topk_group, int64_t score_func, int64_t group_score, bool renormalize,
                  double routed_scaling_factor, bool apply_routed_scaling, double eps,
                  int64_t n_shared_experts) {
    gate_out_impl(logits, bias, weights, ids, scores, top_k, n_group, topk_group, score_func,
                  group_score, renormalize, routed_scaling_factor, apply_routed_scaling, eps,
                  n_shared_experts);
}

// ---- moe_gate_hash -----------------------------------------------------------------------
mlaf_moe_gate_params gate_params(int64_t top_k, int64_t n_group, int64_t topk_group,
                                 int64_t score_func, int64_t group_score, bool renormalize,
                                 double routed_scaling_factor, bool apply_routed_scaling,
                                 double eps, int64_t n_shared_experts) {
    mlaf_moe_gate_params p;
    p.top_k = (int32_t)top_k;
    p.n_group = (int32_t)n_group;
    p.topk_group = (int32_t)topk_group;
    p.score_func = (mlaf_score_func)score_func;
    p.group_score = (mlaf_group_score)group_score;
    p.renormalize = renormalize ? 1 : 0;
    p.routed_scaling_factor = (float)routed_scaling_factor;
    p.apply_routed_scaling = apply_routed_scaling ? 1 : 0;
    p.eps = (float)eps;
    p.n_shared_experts = (int32_t)n_shared_experts;
    return p;
}

void moe_gate_hash_out(const at::Tensor &logits, const at::Tensor &tid2eid,
                       const at::Tensor &token_ids, const at::Tensor &weights,
                       const at::Tensor &ids, const std::optional<at::Tensor> &scores,
                       const std::optional<at::Tensor> &error_count, int64_t top_k,
                       int64_t n_group, int64_t topk_group, int64_t score_func,
                       int64_t group_score, bool renormalize, double routed_scaling_factor,
                       bool apply_routed_scaling, double eps, int64_t n_shared_experts) {
    need_api();
    const c10::Device d = logits.device();
    mlaf_context *ctx = context_for(d);
    View vl(logits, "logits", d, false), vt(tid2eid, "tid2eid", d, false),
        vk(token_ids, "token_ids", d, false), vw(weights, "weights", d, true),
        vi(ids, "ids", d, true), vs(scores, "scores", d, true),
        verr(error_count, "error_count", d, true);
    const mlaf_moe_gate_params p =
        gate_params(top_k, n_group, topk_group, score_func, group_score, renormalize,
                    routed_scaling_factor, apply_routed_scaling, eps, n_shared_experts);
    check(ctx, api.moe_gate_hash(ctx, &p, vl.p, vt.p, vk.p, vw.p, vi.p, vs.p, verr.p));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> moe_gate_hash(
    const at::Tensor &logits, const at::Tensor &tid2eid, const at::Tensor &token_ids,
    const std::optional<at::Tensor> &error_count, int64_t top_k, int64_t n_group,
    int64_t topk_group, int64_t score_func, int64_t group_score, bool renormalize,
    double routed_scaling_factor, bool apply_routed_scaling, double eps,
    int64_t n_shared_experts, bool return_scores, std::optional<c10::ScalarType> weights_dtype) {
    const int64_t T = rows_of(logits), E = logits.dim() >= 2 ? logits.size(1) : 0;
    const int64_t K = nonneg(top_k + n_shared_experts);
    at::Tensor w = alloc(logits, T, K, weights_dtype.value_or(c10::ScalarType::Float)),
               i = alloc(logits, T, K, c10::ScalarType::Int),
               s = alloc(logits, T, return_scores ? E : 0, c10::ScalarType::Float);
    moe_gate_hash_out(logits, tid2eid, token_ids, w, i,
                      return_scores ? std::optional<at::Tensor>(s) : std::nullopt, error_count,
                      top_k, n_group, topk_group, score_func, group_score, renormalize,
                      routed_scaling_factor, apply_routed_scaling, eps, n_shared_experts);
    return {w, i, s};
}

}  // namespace mlafuse_torch
