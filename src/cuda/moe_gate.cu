/*
 * moe_gate.cu — CUDA router top-k (docs/moe_gate.md): which kernel takes a call, and the extern "C"
 * entry. Five kernels share one total order (moe_gate_common.cuh), so ids match the oracle and
 * the CPU exactly, ties included. A call takes the first of these that fits it:
 *   1. T <= 64, or up to one wave of full-occupancy blocks for routers of 97+ experts
 *      (DeepSeek-V3 on 132 SMs: 1056 tokens): the tiny kernel, one block per token, one thread
 *      per expert (moe_gate_tiny.cuh);
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
 * sqrt_softplus routers (DeepSeek-V4) take steps 1, 2, 3, 6 (from 16384 tokens with 2-byte
 * logits, 65536 with f32) and 7: every kernel ranks by that score in the general kernel's
 * accurate form (the same bits; the solo kernel computes it for its candidates only); the
 * warp-step kernel has sigmoid alone.
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

/* Calls from this many tokens take the solo kernel where it fits; routers of <= 64 experts in one
 * group (GLM-4.7-Flash) from kSoloSmallEFromT, below which the general kernel's warp per token
 * is the shorter chain (dev/moe_gate/README.md). */
constexpr int64_t kSoloFromT = 1024, kSoloSmallEFromT = 4096;
/* sqrt_softplus calls take the solo kernel from this many tokens (below, its per-token chain
 * is longer than the general kernel's whole call). */
constexpr int64_t kSoloSspFromT = 8192;

/* sqrt_softplus calls from this many tokens take the team kernel (2- / 4-byte logits); below,
 * the general kernel, whose score chain is the shorter one there. */
constexpr int64_t kSqrtSoftplusTeamFromT2 = 16384, kSqrtSoftplusTeamFromT4 = 65536;

template <typename T>
bool try_team(const GateArgs &a, int sm_count, cudaStream_t stream) {
    const bool ssp = a.sqrt_softplus != 0; /* not in the warp-step kernel */
    /* sigmoid, one group of <= 64 (GLM-4.7-Flash; measured there) */
    const bool small_e = !ssp && !a.softmax && a.n_group == 1 && a.E <= 64;
    const int64_t solo_from = ssp ? kSoloSspFromT : small_e ? kSoloSmallEFromT : kSoloFromT;
    if (try_tiny<T>(a, sm_count, stream)) return true;
    if (a.T >= solo_from && try_solo<T>(a, sm_count, stream)) return true;
    if (a.E <= 64 && a.T <= 64) return false; /* shorter chain in the general kernel */
    if (small_e && a.T < kSoloSmallEFromT) return false;
    if (ssp && a.T < (sizeof(T) == 2 ? kSqrtSoftplusTeamFromT2 : kSqrtSoftplusTeamFromT4))
        return false;
    const int unit = fast_copy_unit<T>(a);
    if (unit == 0) return false;
    if (!ssp && a.T >= kTeamWideBelowT && a.n_group == 1 && a.E <= 128) {
        if (fast_fits(a, 8, 8)) {
            launch_fast<T, 8, 8>(a, unit, sm_count, stream);
            return true;
        }
        if (fast_fits(a, 8, 16)) {
            launch_fast<T, 8, 16>(a, unit, sm_count, stream);
            return true;
        }
    }
#define MLAF_TEAM(N, L, MINB)                                                                     \
    if (team_fits(a, N, L)) {                                                                     \
        if (a.softmax)                                                                            \
            launch_team<T, N, L, kScoreSoftmax, 4096, MINB>(a, unit, sm_count, stream);           \
        else if (ssp)                                                                             \
            launch_team<T, N, L, kScoreSqrtSoftplus, 4096, MINB>(a, unit, sm_count, stream);      \
        else                                                                                      \
            launch_team<T, N, L, kScoreSigmoid, 4096, MINB>(a, unit, sm_count, stream);           \
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
    if (job->tid2eid) {
        switch (job->logits_dt) {
        case MLAF_F32: launch_hash<float>(a, sm, stream); break;
        case MLAF_F16: launch_hash<__half>(a, sm, stream); break;
        case MLAF_BF16: launch_hash<__nv_bfloat16>(a, sm, stream); break;
        default: return mlaf_fail(ctx, MLAF_ERR_DTYPE, "logits.dtype = %s, expected f32, f16 or bf16",
                                  mlaf_dtype_name(job->logits_dt));
        }
        return mlaf_cuda_check_launch(ctx, "moe_gate_hash");
    }
    switch (job->logits_dt) {
    case MLAF_F32:
        if (!try_team<float>(a, sm, stream)) launch_dt<float>(a, sm, stream);
        break;
    case MLAF_F16:
        if (!try_team<__half>(a, sm, stream)) launch_dt<__half>(a, sm, stream);
        break;
    case MLAF_BF16:
        if (!try_team<__nv_bfloat16>(a, sm, stream)) launch_dt<__nv_bfloat16>(a, sm, stream);
        break;
    default: return mlaf_fail(ctx, MLAF_ERR_DTYPE, "logits.dtype = %s, expected f32, f16 or bf16",
                              mlaf_dtype_name(job->logits_dt));
    }
    return mlaf_cuda_check_launch(ctx, "moe_gate");
}
#endif
