/*
 * moe_gate.cu — CUDA router top-k (docs/moe_gate.md): which kernel takes a call, and the extern "C"
 * entry. Five kernels share one total order (moe_gate_common.cuh), so ids match the oracle and
 * the CPU exactly, ties included. A call takes the first of these that fits it:
 *   1. T <= 64, or up to one wave of full-occupancy blocks for routers of 97+ experts
 *      (DeepSeek-V3 on 132 SMs: 1056 tokens): the tiny kernel, one block per token, one thread
 *      per expert (moe_gate_tiny.cuh); past that, one group of 513 .. 896 experts (Kimi-K3):
 *      the team kernel with 28 experts a lane over 32 lanes (moe_gate_team.cuh);
 *   2. T >= 1024 (GLM-4.7-Flash: 4096; DeepSeek-V4: 8192) at a compiled shape (DeepSeek-V3 /
 *      R1, GLM-4.7-Flash, DeepSeek-V4's sqrt_softplus; no scores output, 16-byte rows): the
 *      solo kernel, one thread per token (moe_gate_solo.cuh);
 *   3. T <= 64 and E <= 64 that the tiny kernel did not take, and one group of <= 64 experts
 *      below T = 4096 (sigmoid): the general kernel, whose chain is the shorter one there;
 *   4. rows that cannot be copied in 4-byte units: the general kernel;
 *   5. T >= 1024, one group, E <= 128: the warp-step kernel (moe_gate_fast.cuh), whose k
 *      rounds of a team max cost less there than the team kernel's threshold and list;
 *   6. the team kernel (moe_gate_team.cuh) where a team shape fits (E <= 512, groups that are
 *      a power-of-two run of whole lanes): from T = 1024 the 8- and 16-lane shapes first,
 *      then the 32-lane shapes, which alone serve smaller T (the shortest chain per token);
 *   7. everything else: the general kernel (moe_gate_warp.cuh), E up to 2048, any stride or
 *      alignment.
 * sqrt_softplus routers (DeepSeek-V4) take steps 1, 2, 3, 6 (from 1024 tokens past 256 experts,
 * else from 16384 tokens with 2-byte logits, 65536 with f32) and 7: every kernel ranks by that
 * score in the general kernel's accurate form (the same bits; the solo kernel computes it for its
 * candidates only); the warp-step kernel has sigmoid and softmax alone.
 * The score is a template argument of every kernel, chosen once per call (dispatch_score in the
 * entry); its per-score thresholds and which kernels have it are score_traits<SF>
 * (moe_gate_common.cuh).
 * Hash routing (mlaf_moe_gate_hash, job->tid2eid set) has its own kernels (moe_gate_hash.cuh:
 * 8 lanes or a thread per token for top_k <= 8, a warp per token for softmax, scores or
 * top_k > 8).
 * The figures behind these thresholds are in dev/moe_gate/README.md.
 * Never allocates or synchronizes; graph-capturable.
 */
#include "moe_gate_common.cuh"
#include "moe_gate_fast.cuh"
#include "moe_gate_hash.cuh"
#include "moe_gate_solo.cuh"
#include "moe_gate_team.cuh"
#include "moe_gate_tiny.cuh"
#include "moe_gate_warp.cuh"

namespace {

/* Calls below this many tokens take the 32-lane team shapes (the shortest chain per token);
 * larger ones the 8- and 16-lane shapes where they fit, and the warp-step kernel for routers
 * of at most 128 experts in one group. */
constexpr int64_t kTeamWideBelowT = 1024;

template <typename T> struct dtype_tag {
    using type = T;
};

/* The solo kernel's and the team kernel's per-score thresholds (calls from solo_from_t tokens
 * take the solo kernel where it fits; small_e_from_t for routers of <= 64 experts in one group;
 * team_from_t) are score_traits<SF>'s (moe_gate_common.cuh; figures: dev/moe_gate/README.md). */

template <typename T, mlaf_score_func SF>
bool try_team(const GateArgs &a, int sm_count, cudaStream_t stream) {
    using Sc = score_traits<SF>;
    /* one group of <= 64 where the score has that rule (sigmoid: GLM-4.7-Flash, measured there) */
    const bool small_e = Sc::small_e_from_t > 0 && a.n_group == 1 && a.E <= 64;
    const int64_t solo_from = small_e ? Sc::small_e_from_t : Sc::solo_from_t;
    if (try_tiny<T, SF>(a, sm_count, stream)) return true;
    /* one group of 513 .. 896 experts past decode sizes (Kimi-K3): 28 experts a lane, 32 lanes,
     * three resident blocks (2-4x the general kernel's speed; dev/moe_gate/README.md) */
    if (a.n_group == 1 && a.E > 512 && a.E <= 28 * 32) {
        const int unit = fast_copy_unit<T>(a);
        if (unit) {
            launch_team<T, 28, 32, SF, 4096, 3>(a, unit, sm_count, stream);
            return true;
        }
    }
    if constexpr (Sc::solo) {
        if (a.T >= solo_from && try_solo<T, SF>(a, sm_count, stream)) return true;
    }
    if (a.E <= 64 && a.T <= 64) return false; /* shorter chain in the general kernel */
    if (small_e && a.T < Sc::small_e_from_t) return false;
    if (a.T < Sc::team_from_t((int)sizeof(T), a.E)) return false;
    const int unit = fast_copy_unit<T>(a);
    if (unit == 0) return false;
    if constexpr (Sc::warp_step) {
        if (a.T >= kTeamWideBelowT && a.n_group == 1 && a.E <= 128) {
            if (fast_fits(a, 8, 8)) {
                launch_fast<T, 8, 8, SF>(a, unit, sm_count, stream);
                return true;
            }
            if (fast_fits(a, 8, 16)) {
                launch_fast<T, 8, 16, SF>(a, unit, sm_count, stream);
                return true;
            }
        }
    }
#define MLAF_TEAM(N, L, MINB)                                                                     \
    if (team_fits(a, N, L)) {                                                                     \
        launch_team<T, N, L, SF, 4096, MINB>(a, unit, sm_count, stream);                          \
        return true;                                                                              \
    }
    /* MINB: resident blocks the register allocation must allow; the kernel is latency-bound,
     * so more warps per SM pay for the registers they cost. */
    if (a.T >= kTeamWideBelowT) {
        MLAF_TEAM(20, 8, 4) MLAF_TEAM(16, 16, 5)
    }
    MLAF_TEAM(5, 32, 1) MLAF_TEAM(8, 32, 1) MLAF_TEAM(12, 32, 4) MLAF_TEAM(16, 32, 1)
#undef MLAF_TEAM
    return false;
}

} // namespace

#ifndef MLAF_MOE_GATE_NO_ENTRY /* dev/moe_gate includes this file for its kernels */
extern "C" mlaf_status mlaf_cuda_moe_gate(mlaf_context *ctx, const mlaf_moe_gate_job *job) {
    mlaf_cuda_device_guard guard(ctx);
    const GateArgs a = gate_args_of(*job);
    cudaStream_t stream = (cudaStream_t)ctx->cuda_stream;
    const int sm = ctx->cuda_sm_count;
    const bool hash = job->tid2eid != nullptr;
    if (job->logits_dt != MLAF_F32 && job->logits_dt != MLAF_F16 && job->logits_dt != MLAF_BF16)
        return mlaf_fail(ctx, MLAF_ERR_DTYPE, "logits.dtype = %s, expected f32, f16 or bf16",
                         mlaf_dtype_name(job->logits_dt));
    /* the one choice of the score's instantiation */
    dispatch_score(job->score_func, [&](auto tag) {
        constexpr mlaf_score_func SF = decltype(tag)::value;
        auto go = [&](auto dt) {
            using T = typename decltype(dt)::type;
            if (hash)
                launch_hash<T, SF>(a, sm, stream);
            else if (!try_team<T, SF>(a, sm, stream))
                launch_dt<T, SF>(a, sm, stream);
        };
        switch (job->logits_dt) {
        case MLAF_F32: go(dtype_tag<float>{}); break;
        case MLAF_F16: go(dtype_tag<__half>{}); break;
        default: go(dtype_tag<__nv_bfloat16>{}); break;
        }
    });
    return mlaf_cuda_check_launch(ctx, hash ? "moe_gate_hash" : "moe_gate");
}
#endif
