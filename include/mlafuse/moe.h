/*
 * mlafuse/moe.h — the MoE routers: moe_gate (scored top-k) and moe_gate_hash
 * (DeepSeek-V4's hash-routed layers).
 * Part of the public C API: include <mlafuse.h>, which includes this file (the types, status
 * codes and conventions are there).
 */
#ifndef MLAFUSE_MOE_H
#define MLAFUSE_MOE_H
#ifndef MLAFUSE_H
#error "include <mlafuse.h>, not mlafuse/moe.h"
#endif

/* ---------------------------------------------------------------------------------------
 * moe_gate: router top-k (docs/moe_gate.md)
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
 * sqrt_softplus (DeepSeek-V4): s = sqrt(softplus(x)) in fp32 with softplus(x) =
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
 * moe_gate_hash: DeepSeek-V4's hash-routed layers
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

#endif /* MLAFUSE_MOE_H */
