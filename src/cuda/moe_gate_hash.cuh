/*
 * moe_gate_hash.cuh — hash routing (mlaf_moe_gate_hash, SPEC §11: DeepSeek-V4's first MoE
 * layers). One warp per token:
 *   1. Lane j (and j + 32 for k > 32) reads token_ids[t] and entry j of its tid2eid row; the row
 *      is bad when the token id is outside [0, vocab), an entry is outside [0, E), or an entry
 *      equals another (each lane compares its entries with all k by shuffles); a warp vote
 *      makes it one verdict. A bad row takes ids 0 .. k-1, weight 0, and lane 0 adds 1 to the
 *      error counter (saturating).
 *   2. Scores: sigmoid and sqrt_softplus need only the k chosen logits (each lane loads its
 *      own); softmax needs the row's max and sum over its finite logits (two strided passes of
 *      the row, the second from L1 / L2). With the scores output every lane writes s of the
 *      experts e = lane + 32 i.
 *   3. Weights, renormalization (skipped when sum + eps is 0), scaling and shared experts as the
 *      general kernel does them (warp sums), coalesced stores.
 * Memory bound: a token reads one index, k table entries and k logits (the whole row for
 * softmax or the scores output). Any stride, alignment, E <= 2048, k <= 64, 64-bit offsets.
 * Launch: 128 threads per block, grid-stride over tokens, at most 16 blocks per SM.
 */
#pragma once

#include "moe_gate_common.cuh"

namespace {

constexpr int kHashWarps = 4;

__device__ __forceinline__ int64_t hash_index(const void *p, bool i64, int64_t i) {
    return i64 ? static_cast<const int64_t *>(p)[i] : (int64_t) static_cast<const int32_t *>(p)[i];
}

/* s of one finite logit for the elementwise scores (sigmoid, sqrt_softplus). */
__device__ __forceinline__ float hash_score(const GateArgs &a, float x) {
    return a.sqrt_softplus ? sqrt_softplus_f(x) : 1.0f / (1.0f + expf(-x));
}

template <typename T>
__global__ void __launch_bounds__(kHashWarps * 32) moe_gate_hash_kernel(const GateArgs a) {
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
        if (a.softmax) {
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
                float s = a.softmax ? expf(x - m) / inv_sum : hash_score(a, x);
                srow[e] = isfinite(x) ? s : __uint_as_float(0x7fc00000u);
            }
        }
        float w0 = 0.0f, w1 = 0.0f;
        if (!bad) {
            if (j0 < k) {
                const float x = mlaf_ld(row + e0);
                w0 = !isfinite(x) ? 0.0f : a.softmax ? expf(x - m) / inv_sum : hash_score(a, x);
            }
            if (j1 < k) {
                const float x = mlaf_ld(row + e1);
                w1 = !isfinite(x) ? 0.0f : a.softmax ? expf(x - m) / inv_sum : hash_score(a, x);
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

template <typename T> void launch_hash(const GateArgs &a, int sm_count, cudaStream_t stream) {
    const int64_t want = (a.T + kHashWarps - 1) / kHashWarps;
    const int64_t cap = (int64_t)(sm_count > 0 ? sm_count : 1) * 16;
    const int blocks = (int)(want < cap ? want : cap);
    moe_gate_hash_kernel<T><<<blocks, kHashWarps * 32, 0, stream>>>(a);
}

} // namespace
