/*
 * moe_gate_common.cuh — what the router's kernels share: the argument block, the order keys,
 * the NaN policy's constants, warp and team reductions, the sigmoid, a team's group selection,
 * the staging copies. Included first by moe_gate.cu (each moe_gate_*.cuh includes it too).
 *
 * One total order in every kernel (docs/moe_gate.md), so ids match the oracle and the CPU exactly, ties
 * included:
 *   1. c = s + bias, plus 0.0f so that -0 becomes +0: one key per value;
 *   2. c descending by ord32(c), the float's order as an unsigned integer, then the lower
 *      expert index (team_key packs both into 64 bits, distinct for distinct experts);
 *   3. an invalid expert (non-finite logit or bias) ranks below every valid one and weighs 0;
 *   4. groups by score (top-2 sum, or the max, of their c) descending, then the lower group
 *      index; a group without a valid expert ranks last.
 * Every reduction ends with the same bits in every lane (xor butterflies; redux.sync on
 * sm_80+), so the lanes of a team agree on each result without a broadcast.
 * sigmoid_fast is the team, solo and tiny kernels' sigmoid, so their keys agree bit for bit.
 * The score function is a template argument of every kernel (mlaf_score_func SF): its device
 * math and per-score launch constants are score_traits<SF> below, and the host picks the
 * instantiation once, in dispatch_score (src/score.h lists what a new score touches).
 */
#pragma once

#include "cuda_common.cuh"

#include <atomic>

namespace {

constexpr unsigned kFull = 0xffffffffu;

struct GateArgs {
    int64_t T;
    int32_t E, top_k, n_group, topk_group, n_shared, K;
    int32_t P;        /* experts per group */
    uint32_t P_magic; /* ceil(2^32 / P): e / P == umulhi(e, P_magic) for e < 2048; 0 when P == 1 */
    /* The score is a template argument; pad0 / pad1 hold the places of the former score
     * flags, so that every kernel's parameter offsets, and with them the register allocation
     * of the kernels whose code did not change, stay as measured. */
    int32_t pad0, group_max, renormalize, apply_scaling;
    float scaling, eps;
    const void *logits;
    int64_t logits_stride;
    const float *bias;
    void *weights;
    int32_t weights_f32;
    int64_t weights_stride;
    int32_t *ids;
    int64_t ids_stride;
    float *scores;
    int64_t scores_stride;
    int32_t pad1;
    /* hash routing (moe_gate_hash.cuh) */
    const void *tid2eid;
    int32_t tid2eid_i64, token_ids_i64;
    int64_t tid2eid_stride, vocab;
    const void *token_ids;
    int32_t *error_count;
};

/* The kernels' arguments from a validated job (the entry in moe_gate.cu; dev/moe_gate programs). */
static inline GateArgs gate_args_of(const mlaf_moe_gate_job &j) {
    GateArgs a{};
    a.T = j.T;
    a.E = j.E;
    a.top_k = j.top_k;
    a.n_group = j.n_group;
    a.topk_group = j.topk_group;
    a.n_shared = j.n_shared;
    a.K = j.K;
    a.P = j.E / j.n_group;
    a.P_magic = a.P == 1 ? 0u : (uint32_t)((0x100000000ull + (uint64_t)a.P - 1) / (uint64_t)a.P);
    a.group_max = j.group_score == MLAF_GROUP_MAX;
    a.renormalize = j.renormalize;
    a.apply_scaling = j.apply_scaling;
    a.scaling = j.scaling;
    a.eps = j.eps;
    a.logits = j.logits;
    a.logits_stride = j.logits_stride;
    a.bias = j.bias;
    a.weights = j.weights;
    a.weights_f32 = j.weights_dt == MLAF_F32;
    a.weights_stride = j.weights_stride;
    a.ids = j.ids;
    a.ids_stride = j.ids_stride;
    a.scores = j.scores;
    a.scores_stride = j.scores_stride;
    a.tid2eid = j.tid2eid;
    a.tid2eid_i64 = j.tid2eid_dt == MLAF_I64;
    a.tid2eid_stride = j.tid2eid_stride;
    a.vocab = j.vocab;
    a.token_ids = j.token_ids;
    a.token_ids_i64 = j.token_ids_dt == MLAF_I64;
    a.error_count = j.error_count;
    return a;
}

/* Weight j of token t, in the weights' dtype (f32 or the logits' T), rounded once. */
template <typename T>
__device__ __forceinline__ void gate_put_weight(const GateArgs &a, int64_t t, int j, float w) {
    if (a.weights_f32)
        static_cast<float *>(a.weights)[t * a.weights_stride + j] = w;
    else
        mlaf_st(static_cast<T *>(a.weights) + t * a.weights_stride + j, w);
}

__device__ __forceinline__ uint32_t ord32(float f) {
    uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float unord32(uint32_t v) {
    return __uint_as_float((v & 0x80000000u) ? (v & 0x7fffffffu) : ~v);
}

__device__ __forceinline__ uint32_t warp_max_u32(uint32_t v) {
#if __CUDA_ARCH__ >= 800
    return __reduce_max_sync(kFull, v);
#else
    for (int o = 16; o; o >>= 1) v = max(v, __shfl_xor_sync(kFull, v, o));
    return v;
#endif
}
__device__ __forceinline__ uint32_t warp_min_u32(uint32_t v) {
#if __CUDA_ARCH__ >= 800
    return __reduce_min_sync(kFull, v);
#else
    for (int o = 16; o; o >>= 1) v = min(v, __shfl_xor_sync(kFull, v, o));
    return v;
#endif
}
/* Butterfly sum: every lane ends with the same bits. */
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
    return v;
}

constexpr float kNegInf = -INFINITY;
constexpr uint32_t kOrdNegInf = 0x007fffffu; /* ord32(-inf) */

/* Max over an aligned team of L lanes (every lane of the warp calls it). */
template <int L> __device__ __forceinline__ uint32_t team_max_u32(uint32_t v) {
    if constexpr (L == 32) {
        return warp_max_u32(v);
    } else {
#pragma unroll
        for (int o = L / 2; o; o >>= 1) v = max(v, __shfl_xor_sync(kFull, v, o));
        return v;
    }
}
/* Butterfly sum over the team: every lane of a team ends with the same bits. */
template <int L> __device__ __forceinline__ float team_sum(float v) {
#pragma unroll
    for (int o = L / 2; o; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
    return v;
}

template <int L> __device__ __forceinline__ float team_max_f(float v, unsigned mask) {
    if constexpr (L == 32) {
        return unord32(__reduce_max_sync(kFull, ord32(v)));
    } else {
#pragma unroll
        for (int o = L / 2; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(mask, v, o));
        return v;
    }
}
template <int L> __device__ __forceinline__ float team_sum_m(float v, unsigned mask) {
#pragma unroll
    for (int o = L / 2; o; o >>= 1) v += __shfl_xor_sync(mask, v, o);
    return v;
}
/* Sort key: c descending, then expert index ascending; distinct for distinct experts. */
__device__ __forceinline__ unsigned long long team_key(float c, int e) {
    return ((unsigned long long)ord32(c) << 32) | (uint32_t)(0xffffffffu - (uint32_t)e);
}
template <int L> __device__ __forceinline__ unsigned long long team_max_u64(unsigned long long v,
                                                                           unsigned mask) {
#pragma unroll
    for (int o = L / 2; o; o >>= 1) {
        unsigned long long w = __shfl_xor_sync(mask, v, o);
        v = w > v ? w : v;
    }
    return v;
}

/* Sigmoid with one ex2 and one reciprocal (flush-to-zero forms: 1 + 2^y >= 1 never needs a
 * denormal); ~1e-7 relative. NaN stays NaN, +inf gives 1, -inf gives 0. */
__device__ __forceinline__ float sigmoid_fast(float x) {
    float e, r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(x * -1.4426950408889634f));
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.0f + e));
    return r;
}

/* sqrt(softplus(x)) for finite x, without overflow (docs/moe_gate.md): x to fp32 above 20, exp(x / 2)
 * below -20 (log1p(exp(x)) = exp(x) to fp32 there, and exp(x) alone would underflow first);
 * accurate libdevice forms, as the CPU's libm ones. */
__device__ __forceinline__ float sqrt_softplus_f(float x) {
    if (x > 20.0f) return sqrtf(x);
    if (x < -20.0f) return expf(0.5f * x);
    return sqrtf(log1pf(expf(x)));
}

/* A cheap stand-in for sqrt_softplus_f that ranks the experts of a token before the exact score
 * is computed for the few candidates (the solo kernel): one ex2, one lg2 and one sqrt by the
 * approximate instructions, no branch (x above 20 takes sqrt(x), below -20 gives 0). For every
 * finite x, |filter(x) - sqrt_softplus_f(x)| <= kSspFilterErr + kSspFilterRel * sqrt_softplus_f(x)
 * (tests/cuda/test_gate_scores checks every finite float): the ex2 / lg2 errors (~2^-22) leave
 * ~3e-7 + 3e-6 s in the softplus s, which the square root turns into at most ~6e-4 where s -> 0
 * (|sqrt(s') - sqrt(s)| <= sqrt(|s' - s|)); exp(x / 2) < 4.6e-5 below -20; sqrt.approx is
 * within ~2^-22 relative. */
constexpr float kSspFilterErr = 1e-3f, kSspFilterRel = 4.8e-7f; /* 2^-21 */
__device__ __forceinline__ float sqrt_softplus_filter(float x) {
    float e, l, r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(fminf(x, 20.0f) * 1.4426950408889634f));
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(l) : "f"(1.0f + e));
    const float sp = x > 20.0f ? x : l * 0.6931471805599453f;
    asm("sqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(sp));
    return x < -20.0f ? 0.0f : r;
}
/* Candidates of a filtered ranking: keys c' = filter(x) + b against the exact c =
 * sqrt_softplus_f(x) + b, tau' a value that k filtered keys reach and bmax >= every |b|. An
 * expert's key error is at most d = kSspFilterErr + kSspFilterRel g + 2^-23 (|c| + |c'|) with
 * g <= |c| + bmax; near tau' that is below d(tau') = kSspFilterErr + kSspFilterRel (|tau'| + bmax
 * + 1) + 2^-22 (|tau'| + 1). The exact k-th key is >= tau' - d(tau'), so every expert of the exact
 * top k has c' >= tau' - 2 d(tau'): the margin returned (with room to spare). */
__device__ __forceinline__ float sqrt_softplus_margin(float tau, float bmax) {
    const float at = fabsf(tau) + 1.0f;
    return 2.0f * (kSspFilterErr + kSspFilterRel * (at + bmax) + 2.4e-7f * at) + 1e-6f;
}

/* ---- score functions ------------------------------------------------------------------
 * One specialization of score_traits per mlaf_score_func; a score without one does not compile.
 *   row_wise       s needs the whole row (softmax: the kernels' own max / sum code); else s is
 *                  one logit's function, by these forms (finite x; the bits every caller of a
 *                  form gets, so the kernels that share one rank alike):
 *     exact(x)     the general and hash kernels' form (moe_gate_warp.cuh, moe_gate_hash.cuh);
 *     fast(x)      the tiny, team and solo kernels' form;
 *     quick(x)     the warp-step kernel's form (moe_gate_fast.cuh), where warp_step is true;
 *     filter(x)    a cheap stand-in the solo kernel ranks by (filtered: then it lowers its
 *                  threshold by margin(tau, bmax) and re-keys the candidates by fast(x); not
 *                  filtered: filter is fast itself);
 *   warp_step      the warp-step kernel has the score;
 *   solo           the solo kernel has the score (moe_gate_solo.cuh lists its compiled shapes);
 * and the launch thresholds measured per score (moe_gate.cu, dev/moe_gate/README.md):
 *   solo_from_t    calls from this many tokens take the solo kernel where it fits;
 *   small_e_from_t one group of <= 64 experts: the solo kernel from this T, the general kernel
 *                  below it (0: no such rule);
 *   team_from_t(b, E) the team kernel from this many tokens with b-byte logits and E experts
 *                  (below: the general kernel, whose chain is the shorter one there). */
template <mlaf_score_func SF> struct score_traits;

template <> struct score_traits<MLAF_SCORE_SIGMOID> {
    static constexpr bool row_wise = false, filtered = false, warp_step = true, solo = true;
    static constexpr int64_t solo_from_t = 1024;
    /* GLM-4.7-Flash (64 experts, one group): below this T the general kernel's warp per token
     * is the shorter chain */
    static constexpr int64_t small_e_from_t = 4096;
    static constexpr int64_t team_from_t(int, int) { return 0; }
    static __device__ __forceinline__ float exact(float x) { return 1.0f / (1.0f + expf(-x)); }
    static __device__ __forceinline__ float fast(float x) { return sigmoid_fast(x); }
    static __device__ __forceinline__ float quick(float x) {
        return __fdividef(1.0f, 1.0f + __expf(-x));
    }
    static __device__ __forceinline__ float filter(float x) { return sigmoid_fast(x); }
    static __device__ __forceinline__ float margin(float, float) { return 0.0f; }
};

template <> struct score_traits<MLAF_SCORE_SOFTMAX> {
    static constexpr bool row_wise = true, filtered = false, warp_step = true, solo = false;
    static constexpr int64_t solo_from_t = 1024, small_e_from_t = 0;
    static constexpr int64_t team_from_t(int, int) { return 0; }
};

template <> struct score_traits<MLAF_SCORE_SQRT_SOFTPLUS> {
    static constexpr bool row_wise = false, filtered = true, warp_step = false, solo = true;
    /* below, the solo kernel's per-token chain is longer than the general kernel's whole call */
    static constexpr int64_t solo_from_t = 8192, small_e_from_t = 0;
    /* the team kernel from 1024 tokens past 256 experts (DeepSeek-V4.1-Flash's 384: the general
     * kernel's lanes hold 12 experts), else from 16384 tokens (2-byte logits) / 65536 (f32); below,
     * the general kernel, whose score chain is the shorter one there */
    static constexpr int64_t team_from_t(int elem_bytes, int E) {
        return E > 256 ? 1024 : elem_bytes == 2 ? 16384 : 65536;
    }
    /* every kernel's form is the general kernel's accurate one (the same bits everywhere) */
    static __device__ __forceinline__ float exact(float x) { return sqrt_softplus_f(x); }
    static __device__ __forceinline__ float fast(float x) { return sqrt_softplus_f(x); }
    static __device__ __forceinline__ float filter(float x) { return sqrt_softplus_filter(x); }
    static __device__ __forceinline__ float margin(float tau, float bmax) {
        return sqrt_softplus_margin(tau, bmax);
    }
};

/* The host's one choice of instantiation: f(score_tag<SF>{}) for the job's score (validated:
 * one of the enum's values; anything else takes sigmoid, as before). */
template <mlaf_score_func SF> struct score_tag {
    static constexpr mlaf_score_func value = SF;
};
template <class F> inline decltype(auto) dispatch_score(mlaf_score_func sf, F &&f) {
    switch (sf) {
    case MLAF_SCORE_SOFTMAX: return f(score_tag<MLAF_SCORE_SOFTMAX>{});
    case MLAF_SCORE_SQRT_SOFTPLUS: return f(score_tag<MLAF_SCORE_SQRT_SOFTPLUS>{});
    case MLAF_SCORE_SIGMOID:
    default: return f(score_tag<MLAF_SCORE_SIGMOID>{});
    }
}

/* Group selection for a team: every lane holds the best two c of its experts; a group is Lg
 * adjacent lanes. Returns whether this lane's group is kept (valid groups first, group score
 * descending, lower group index on ties). */
template <int L>
__device__ __forceinline__ bool team_group_kept(const GateArgs &a, float lm1, float lm2, int Lg,
                                                int tl, int team, unsigned team_mask) {
    const int G = a.n_group;
    if (G <= 1) return true;
    float g1 = lm1, g2 = lm2;
    for (int o = 1; o < Lg; o <<= 1) {
        const float o1 = __shfl_xor_sync(team_mask, g1, o);
        const float o2 = __shfl_xor_sync(team_mask, g2, o);
        const float lo = fminf(g1, o1);
        g1 = fmaxf(g1, o1);
        g2 = fmaxf(lo, fmaxf(g2, o2));
    }
    uint32_t gv = 0u; /* no valid expert in the group */
    if (g1 != kNegInf) gv = ord32(((a.group_max || g2 == kNegInf) ? g1 : g1 + g2) + 0.0f);
    const int my_group = tl / Lg;
    int better = 0;
    for (int h = 0; h < G; h++) {
        const uint32_t o = __shfl_sync(team_mask, gv, team * L + h * Lg);
        better += (o > gv) || (o == gv && h < my_group);
    }
    return my_group < G && better < a.topk_group;
}

/* ---- staging copies ------------------------------------------------------------------- */

/* 16/8/4-byte global -> shared copies that do not hold registers while in flight. */
__device__ __forceinline__ void cp_async(void *dst, const void *src, int bytes) {
#if __CUDA_ARCH__ >= 800
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    if (bytes == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
    else if (bytes == 8)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(d), "l"(src));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(src));
#else
    if (bytes == 16) *static_cast<uint4 *>(dst) = *static_cast<const uint4 *>(src);
    else if (bytes == 8) *static_cast<uint2 *>(dst) = *static_cast<const uint2 *>(src);
    else *static_cast<uint32_t *>(dst) = *static_cast<const uint32_t *>(src);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int Pending> __device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
#endif
}

template <int B> struct RawVec;
template <> struct RawVec<16> { using type = uint4; };
template <> struct RawVec<8> { using type = uint2; };
template <> struct RawVec<4> { using type = uint32_t; };
template <> struct RawVec<2> { using type = uint16_t; };

/* Widest copy unit (16, 8 or 4 bytes) that the row start, row length and stride allow; 0 when
 * none does. */
template <typename T> int fast_copy_unit(const GateArgs &a) {
    const int64_t esz = (int64_t)sizeof(T);
    const int64_t row_bytes = (int64_t)a.E * esz;
    const uintptr_t addr = reinterpret_cast<uintptr_t>(a.logits);
    const int64_t stride_b = a.logits_stride * esz;
    int unit = 0;
    for (int u = 16; u >= 4; u >>= 1)
        if (addr % (uintptr_t)u == 0 && row_bytes % u == 0 && (a.T <= 1 || stride_b % u == 0)) {
            unit = u;
            break;
        }
    return unit;
}

} // namespace
