/*
 * moe_gate_hash.cuh — hash routing (mlaf_moe_gate_hash, docs/moe_gate.md: DeepSeek-V4's first MoE
 * layers). Three kernels, the same operations in the same order (bit-identical results):
 *
 * Top_k <= 8 with sigmoid or sqrt_softplus scores and no scores output (DeepSeek-V4): a token
 * is three dependent loads (its id, then k table entries, then k of its logits).
 *   Thread per token, from kHashThreadFromT tokens:
 *   1. Load the token id, then its k entries back to back; the row is bad when the id is
 *      outside [0, vocab), an entry outside [0, E) or repeated (k(k-1)/2 register compares).
 *      A bad row takes ids 0 .. k-1, weight 0; lane 0 adds the warp's count of bad rows to the
 *      error counter (saturating).
 *   2. Load the k chosen logits back to back; s = score(x), 0 for a non-finite x.
 *   3. Sum, renormalize (skipped when sum + eps is 0), scale, shared experts: the warp
 *      kernel's sum tree written out in registers (hash_sum8).
 *   4. Contiguous [T, k] f32 outputs: the warp's 32 rows go through shared memory and out as
 *      16-byte stores (k-word rows stored per thread touch a sector per word per store).
 *   ~1200 tokens in flight per SM, so a large call is one wave of chains.
 *   Eight lanes per token below it (more of the GPU busy when tokens are few): lane j < k
 *   loads entry j and its logit, duplicates by 8-wide shuffles, sums by team_sum<8>.
 * Softmax, the scores output or k > 8: a warp per token.
 *   1. Lane j (and j + 32) reads entry j; duplicates by k rounds of shuffles, one warp vote.
 *   2. Sigmoid / sqrt_softplus need only the k chosen logits; softmax the row's max and sum
 *      over its finite logits (two strided passes). With the scores output every lane writes
 *      s of the experts e = lane + 32 i.
 *   3. Weights as above by warp sums; coalesced stores.
 * Any stride, alignment and 64-bit offsets in all three. The measurements behind the
 * threshold: dev/README.md (moe_gate/hash_v1).
 */
#pragma once

#include "moe_gate_common.cuh"

#include <atomic>

namespace {

constexpr int kHashWarps = 4;

__device__ __forceinline__ int64_t hash_index(const void *p, bool i64, int64_t i) {
    return i64 ? static_cast<const int64_t *>(p)[i] : (int64_t) static_cast<const int32_t *>(p)[i];
}

/* s of one finite logit: score_traits<SF>::exact, or for softmax exp(x - m) / sum (m and sum
 * of the row's finite logits; the caller's m = 0, sum = 1 for the elementwise scores). */
template <mlaf_score_func SF>
__device__ __forceinline__ float hash_score(float x, float m, float sum) {
    if constexpr (score_traits<SF>::row_wise)
        return expf(x - m) / sum;
    else
        return score_traits<SF>::exact(x);
}

template <typename T, mlaf_score_func SF>
__global__ void __launch_bounds__(kHashWarps * 32) moe_gate_hash_kernel(const GateArgs a) {
    mlaf_pdl_begin();
    const int lane = threadIdx.x & 31;
    const int64_t warp0 = (int64_t)blockIdx.x * kHashWarps + (threadIdx.x >> 5);
    const int64_t nwarps = (int64_t)gridDim.x * kHashWarps;
    const int32_t E = a.E, k = a.top_k;
    const T *__restrict__ logits = static_cast<const T *>(a.logits);

    for (int64_t t = warp0; t < a.T; t += nwarps) {
        const T *row = logits + t * a.logits_stride;
        /* 1. the table row */
        const int64_t tok = hash_index(a.token_ids, a.token_ids_i64, t);
        bool bad = tok < 0 || tok >= a.vocab;
        const int j0 = lane, j1 = lane + 32;
        int64_t e0 = -1, e1 = -1;
        if (!bad) {
            const int64_t base = tok * a.tid2eid_stride;
            if (j0 < k) e0 = hash_index(a.tid2eid, a.tid2eid_i64, base + j0);
            if (j1 < k) e1 = hash_index(a.tid2eid, a.tid2eid_i64, base + j1);
        }
        bool mine_bad = (j0 < k && (e0 < 0 || e0 >= E)) || (j1 < k && (e1 < 0 || e1 >= E));
        for (int m = 0; m < k; m++) {
            const long long v = m < 32 ? (long long)e0 : (long long)e1; /* m is warp-uniform */
            const long long o = __shfl_sync(kFull, v, m & 31);
            mine_bad = mine_bad || (j0 < k && j0 != m && o == e0) || (j1 < k && j1 != m && o == e1);
        }
        bad = bad || __any_sync(kFull, mine_bad);
        if (bad && lane == 0 && a.error_count) mlaf_cuda_error_count_add(a.error_count, 1);

        /* 2. scores */
        float m = 0.0f, inv_sum = 1.0f;
        if constexpr (score_traits<SF>::row_wise) { /* softmax */
            float mx = -INFINITY;
            for (int e = lane; e < E; e += 32) {
                const float x = mlaf_ld(row + e);
                if (isfinite(x)) mx = fmaxf(mx, x);
            }
            mx = unord32(warp_max_u32(ord32(mx)));
            float part = 0.0f;
            for (int e = lane; e < E; e += 32) {
                const float x = mlaf_ld(row + e);
                part += isfinite(x) ? expf(x - mx) : 0.0f;
            }
            const float sum = warp_sum(part);
            m = mx;
            inv_sum = sum > 0.0f ? sum : 1.0f; /* no finite logit: every s is NaN anyway */
        }
        if (a.scores) {
            float *srow = a.scores + t * a.scores_stride;
            for (int e = lane; e < E; e += 32) {
                const float x = mlaf_ld(row + e);
                float s = hash_score<SF>(x, m, inv_sum);
                srow[e] = isfinite(x) ? s : __uint_as_float(0x7fc00000u);
            }
        }
        float w0 = 0.0f, w1 = 0.0f;
        if (!bad) {
            if (j0 < k) {
                const float x = mlaf_ld(row + e0);
                w0 = !isfinite(x) ? 0.0f : hash_score<SF>(x, m, inv_sum);
            }
            if (j1 < k) {
                const float x = mlaf_ld(row + e1);
                w1 = !isfinite(x) ? 0.0f : hash_score<SF>(x, m, inv_sum);
            }
        }

        /* 3. weights */
        const float sum = warp_sum(w0 + w1);
        float routed = sum;
        if (a.renormalize) {
            const float denom = sum + a.eps;
            if (denom > 0.0f) {
                w0 = w0 / denom;
                w1 = w1 / denom;
            }
            if (a.n_shared > 0) routed = warp_sum(w0 + w1);
        }
        if (a.apply_scaling) {
            w0 *= a.scaling;
            w1 *= a.scaling;
        }
        const float shared_w = routed / a.scaling;
        int32_t *ids = a.ids + t * a.ids_stride;
        for (int j = lane; j < a.K; j += 32) {
            int32_t id;
            float w;
            if (j < k) {
                id = bad ? j : (int32_t)(j < 32 ? e0 : e1);
                w = j < 32 ? w0 : w1;
            } else {
                id = E + (j - k);
                w = shared_w;
            }
            ids[j] = id;
            gate_put_weight<T>(a, t, j, w);
        }
    }
}

/* ---- thread per token ------------------------------------------------------------------ */
constexpr int kHashKMax = 8;       /* the thread and eight-lane kernels: top_k <= 8 */
constexpr int kHashThreads = 128;

/* The warp kernel's warp_sum(w0 + w1) for k <= 8, in registers: w[j] = +0 for j >= k. There
 * the xor-16 and xor-8 steps add +0, then lanes j and j^4, j^2, j^1 pair up, so every lane
 * gets ((w0+w4)+(w2+w6)) + ((w1+w5)+(w3+w7)); "+ 0.0f" is its w0 + w1 with w1 = +0. */
__device__ __forceinline__ float hash_sum8(const float (&w)[kHashKMax]) {
    float v[kHashKMax];
#pragma unroll
    for (int j = 0; j < kHashKMax; j++) v[j] = w[j] + 0.0f;
    return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

template <typename T, mlaf_score_func SF>
__global__ void __launch_bounds__(kHashThreads) moe_gate_hash_thread_kernel(const GateArgs a, const int stage_out) {
    static_assert(!score_traits<SF>::row_wise, "hash thread kernel: elementwise scores");
    mlaf_pdl_begin();
    constexpr int KM = kHashKMax;
    __shared__ __align__(16) uint32_t stage[(kHashThreads / 32) * 2 * 32 * KM]; /* per warp: ids, weights */
    const int lane = threadIdx.x & 31;
    const int32_t E = a.E, k = a.top_k;
    const T *__restrict__ logits = static_cast<const T *>(a.logits);
    const int64_t step = (int64_t)gridDim.x * kHashThreads;
    /* warp-uniform loop: base is the warp's first token */
    for (int64_t base = (int64_t)blockIdx.x * kHashThreads + (threadIdx.x & ~31); base < a.T; base += step) {
        const int64_t t = base + lane;
        const bool live = t < a.T;
        /* 1. the token id, then its k table entries, all loads before any test */
        int64_t tok = 0;
        if (live) tok = hash_index(a.token_ids, a.token_ids_i64, t);
        bool bad = live && (tok < 0 || tok >= a.vocab);
        const bool go = live && !bad;
        const int64_t trow = (go ? tok : 0) * a.tid2eid_stride;
        int32_t e[KM];
        bool range_bad = false;
        if (a.tid2eid_i64) {
            const int64_t *row = static_cast<const int64_t *>(a.tid2eid) + trow;
            int64_t v[KM];
#pragma unroll
            for (int j = 0; j < KM; j++) v[j] = (go && j < k) ? row[j] : 0;
#pragma unroll
            for (int j = 0; j < KM; j++) {
                range_bad = range_bad || (go && j < k && (v[j] < 0 || v[j] >= E));
                e[j] = (int32_t)v[j]; /* exact in range; a row with an entry out of range is bad */
            }
        } else {
            const int32_t *row = static_cast<const int32_t *>(a.tid2eid) + trow;
#pragma unroll
            for (int j = 0; j < KM; j++) e[j] = (go && j < k) ? row[j] : 0;
#pragma unroll
            for (int j = 0; j < KM; j++) range_bad = range_bad || (go && j < k && (e[j] < 0 || e[j] >= E));
        }
        bool dup = false;
#pragma unroll
        for (int i = 1; i < KM; i++)
#pragma unroll
            for (int m = 0; m < i; m++) dup = dup || (i < k && e[i] == e[m]);
        bad = bad || (go && (range_bad || dup));
        const unsigned bad_lanes = __ballot_sync(kFull, bad);
        if (lane == 0 && bad_lanes && a.error_count) mlaf_cuda_error_count_add(a.error_count, __popc(bad_lanes));

        /* 2. the k logits, then the scores */
        const bool ok = live && !bad;
        const T *row = logits + (ok ? t : 0) * a.logits_stride;
        float x[KM], w[KM];
#pragma unroll
        for (int j = 0; j < KM; j++) x[j] = (ok && j < k) ? mlaf_ld(row + e[j]) : 0.0f;
#pragma unroll
        for (int j = 0; j < KM; j++) w[j] = (ok && j < k) ? (!isfinite(x[j]) ? 0.0f : hash_score<SF>(x[j], 0.0f, 1.0f)) : 0.0f;

        /* 3. weights */
        const float sum = hash_sum8(w);
        float routed = sum;
        if (a.renormalize) {
            const float denom = sum + a.eps;
            if (denom > 0.0f) {
#pragma unroll
                for (int j = 0; j < KM; j++) w[j] = w[j] / denom;
            }
            if (a.n_shared > 0) routed = hash_sum8(w);
        }
        if (a.apply_scaling) {
#pragma unroll
            for (int j = 0; j < KM; j++) w[j] *= a.scaling;
        }
        const float shared_w = routed / a.scaling;

        /* 4. stores */
        if (stage_out && base + 32 <= a.T) {
            uint32_t *sid = stage + (threadIdx.x >> 5) * (2 * 32 * KM);
            uint32_t *sw = sid + 32 * k; /* 128 k bytes in: 16-byte aligned */
#pragma unroll
            for (int j = 0; j < KM; j++)
                if (j < k) {
                    sid[lane * k + j] = (uint32_t)(bad ? j : e[j]);
                    sw[lane * k + j] = __float_as_uint(w[j]);
                }
            __syncwarp();
            /* the warp's rows: 32 k words of each output at base * k words, 16-byte aligned */
            uint4 *gid = reinterpret_cast<uint4 *>(a.ids + base * a.K);
            uint4 *gw = reinterpret_cast<uint4 *>(static_cast<float *>(a.weights) + base * a.K);
            const uint4 *s_id = reinterpret_cast<const uint4 *>(sid);
            const uint4 *s_w = reinterpret_cast<const uint4 *>(sw);
            for (int v = lane; v < 8 * k; v += 32) {
                gid[v] = s_id[v];
                gw[v] = s_w[v];
            }
            __syncwarp(); /* the next round rewrites the stage */
        } else if (live) {
            int32_t *ids = a.ids + t * a.ids_stride;
#pragma unroll
            for (int j = 0; j < KM; j++)
                if (j < k) {
                    ids[j] = bad ? j : e[j];
                    gate_put_weight<T>(a, t, j, w[j]);
                }
            for (int j = k; j < a.K; j++) {
                ids[j] = E + (j - k);
                gate_put_weight<T>(a, t, j, shared_w);
            }
        }
    }
}

/* ---- eight lanes per token ----------------------------------------------------------------- */
template <typename T, mlaf_score_func SF>
__global__ void __launch_bounds__(kHashWarps * 32) moe_gate_hash_octet_kernel(const GateArgs a) {
    static_assert(!score_traits<SF>::row_wise, "hash octet kernel: elementwise scores");
    mlaf_pdl_begin();
    const int lane = threadIdx.x & 31, g = lane >> 3, tl = lane & 7;
    const unsigned team = 0xffu << (8 * g);
    const int32_t E = a.E, k = a.top_k;
    const T *__restrict__ logits = static_cast<const T *>(a.logits);
    const int64_t step = (int64_t)gridDim.x * kHashWarps * 4;
    /* warp-uniform loop over the warp's 4 tokens base .. base + 3 */
    for (int64_t base = ((int64_t)blockIdx.x * kHashWarps + (threadIdx.x >> 5)) * 4; base < a.T; base += step) {
        const int64_t t = base + g;
        const bool live = t < a.T;
        int64_t tok = 0;
        if (live) tok = hash_index(a.token_ids, a.token_ids_i64, t);
        const bool tok_bad = live && (tok < 0 || tok >= a.vocab);
        const bool mine = live && !tok_bad && tl < k;
        int64_t v = 0;
        if (mine) v = hash_index(a.tid2eid, a.tid2eid_i64, tok * a.tid2eid_stride + tl);
        const int32_t e = (int32_t)v; /* exact in range; out of range makes the row bad anyway */
        bool mine_bad = mine && (v < 0 || v >= E);
#pragma unroll
        for (int m = 0; m < kHashKMax; m++) {
            const int32_t o = __shfl_sync(kFull, e, m, 8);
            mine_bad = mine_bad || (mine && m < k && m != tl && o == e);
        }
        const bool bad = (__ballot_sync(kFull, mine_bad || tok_bad) & team) != 0u;
        const unsigned bad_teams = __ballot_sync(kFull, bad && tl == 0);
        if (lane == 0 && bad_teams && a.error_count) mlaf_cuda_error_count_add(a.error_count, __popc(bad_teams));

        float w = 0.0f;
        if (mine && !bad) {
            const float x = mlaf_ld(logits + t * a.logits_stride + e);
            w = !isfinite(x) ? 0.0f : hash_score<SF>(x, 0.0f, 1.0f);
        }
        /* the warp kernel's sum: its xor-16 and xor-8 steps add +0 for k <= 8 */
        const float sum = team_sum<8>(w + 0.0f);
        float routed = sum;
        if (a.renormalize) {
            const float denom = sum + a.eps;
            if (denom > 0.0f) w = w / denom;
            if (a.n_shared > 0) routed = team_sum<8>(w + 0.0f);
        }
        if (a.apply_scaling) w *= a.scaling;
        const float shared_w = routed / a.scaling;
        if (live) {
            int32_t *ids = a.ids + t * a.ids_stride;
            for (int j = tl; j < a.K; j += 8) { /* j < k only at j = tl (k <= 8) */
                const bool routed_slot = j < k;
                ids[j] = routed_slot ? (bad ? j : e) : E + (j - k);
                gate_put_weight<T>(a, t, j, routed_slot ? w : shared_w);
            }
        }
    }
}

template <typename T, mlaf_score_func SF> static int hash_thread_resident(int sms) {
    static std::atomic<int> cached{0};
    int v = cached.load(std::memory_order_relaxed);
    if (v == 0) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, moe_gate_hash_thread_kernel<T, SF>, kHashThreads, 0) !=
                cudaSuccess ||
            v < 1) {
            (void)cudaGetLastError();
            v = 8;
        }
        cached.store(v, std::memory_order_relaxed);
    }
    return v * (sms > 0 ? sms : 132);
}

template <typename T, mlaf_score_func SF> void launch_hash_warp(const GateArgs &a, int sm_count, cudaStream_t stream) {
    const int64_t want = (a.T + kHashWarps - 1) / kHashWarps;
    const int64_t cap = (int64_t)(sm_count > 0 ? sm_count : 1) * 16;
    mlaf_launch(moe_gate_hash_kernel<T, SF>,
        (int)(want < cap ? want : cap), kHashWarps * 32, 0, stream, a);
}

/* top_k <= 8, an elementwise score, no scores output (the eight-lane and thread kernels) */
template <mlaf_score_func SF> inline bool hash_fast_ok(const GateArgs &a) {
    return !score_traits<SF>::row_wise && a.top_k <= kHashKMax && !a.scores;
}

template <typename T, mlaf_score_func SF> void launch_hash_octet(const GateArgs &a, int sm_count, cudaStream_t stream) {
    const int64_t want = (a.T + kHashWarps * 4 - 1) / (kHashWarps * 4);
    const int64_t cap = (int64_t)(sm_count > 0 ? sm_count : 1) * 16;
    mlaf_launch(moe_gate_hash_octet_kernel<T, SF>,
        (int)(want < cap ? want : cap), kHashWarps * 32, 0, stream, a);
}

template <typename T, mlaf_score_func SF> void launch_hash_thread(const GateArgs &a, int sm_count, cudaStream_t stream) {
    const uintptr_t ids = reinterpret_cast<uintptr_t>(a.ids), w = reinterpret_cast<uintptr_t>(a.weights);
    const int stage_out = a.weights_f32 && a.K == a.top_k && a.ids_stride == a.K && a.weights_stride == a.K &&
                          ids % 16 == 0 && w % 16 == 0;
    const int64_t want = (a.T + kHashThreads - 1) / kHashThreads;
    const int64_t cap = hash_thread_resident<T, SF>(sm_count);
    mlaf_launch(moe_gate_hash_thread_kernel<T, SF>,
        (int)(want < cap ? want : cap), kHashThreads, 0, stream, a, stage_out);
}

/* From this many tokens the thread kernel, below it the eight-lane one (the figures: dev/README.md,
 * "hash routing"). */
constexpr int64_t kHashThreadFromT = 65536;

template <typename T, mlaf_score_func SF> void launch_hash(const GateArgs &a, int sm_count, cudaStream_t stream) {
    if constexpr (score_traits<SF>::row_wise) {
        launch_hash_warp<T, SF>(a, sm_count, stream);
    } else {
        if (!hash_fast_ok<SF>(a))
            launch_hash_warp<T, SF>(a, sm_count, stream);
        else if (a.T < kHashThreadFromT)
            launch_hash_octet<T, SF>(a, sm_count, stream);
        else
            launch_hash_thread<T, SF>(a, sm_count, stream);
    }
}

} // namespace
