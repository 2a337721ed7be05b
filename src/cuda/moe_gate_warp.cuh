/*
 * moe_gate_warp.cuh — the router's general kernel (moe_gate_warp_kernel): every call that no
 * other kernel takes. One warp per token; lane l holds experts e = 32 i + l, i < NMAX:
 *   1. Load the logits row (one coalesced element load per slot; for E <= 512 the next
 *      token's row is loaded before this one is processed, so two rows per warp are in flight).
 *   2. s = score_traits<SF>::exact(x), or softmax over the finite logits (warp max by redux on
 *      ord32 of the float, warp sum by an xor butterfly, so every lane sees the same bits).
 *      c = s + bias.
 *   3. Every slot gets its rank value v = ord32(c); 1 for an invalid expert, 0 for padding.
 *   4. Groups (n_group > 1): c goes to shared memory (skewed by one word per 32 so the group
 *      scans below hit distinct banks); each group is scanned by a power-of-two team of lanes
 *      (32 / n_group lanes, at least 1), the team merges its partial top-2 by xor shuffles;
 *      lanes then rank the group scores and a ballot gives the kept-group mask.
 *   5. Top-k: each lane keeps its best two slots; k rounds of: warp max of v (redux), warp min
 *      of the index among lanes holding that v (redux), the winning lane pops. A lane that
 *      wins a third time rescans its slots below the popped key (rare: a lane holds three of
 *      the top k only when the top k cluster in one lane's residue class).
 *   6. Lane j owns output j: weight s (0 for invalid), warp sums for renormalization,
 *      scaling, shared experts; coalesced stores of ids / weights (and scores in step 3).
 * Limits: E <= 2048 (NMAX = 64 slots per lane; E > 1024 keeps 2 x 64 floats per lane and may
 * spill to local memory, a rare shape that is still correct), top_k <= 64, S <= 64. Any row
 * stride, any element offset (loads are element-wise, so only the dtype's own alignment is
 * assumed), 64-bit token offsets.
 * Launch: 128 threads (4 warps) per block, grid-stride over tokens with at most 16 blocks per
 * SM: one warp per token keeps the whole row in registers with no block-level
 * synchronization, and several tokens per warp amortize the per-lane bias and group
 * constants. Shared memory (grouped routers only): per warp E + E/32 floats + 64 group words.
 */
#pragma once

#include "moe_gate_common.cuh"

namespace {

constexpr int kWarps = 4;

template <typename T, int NMAX>
__device__ __forceinline__ void load_row(const T *__restrict__ row, int32_t E, int lane,
                                         float (&x)[NMAX]) {
#pragma unroll
    for (int i = 0; i < NMAX; i++) {
        int e = i * 32 + lane;
        x[i] = e < E ? mlaf_ld(row + e) : 0.0f;
    }
}

template <typename T, int NMAX, mlaf_score_func SF>
__global__ void __launch_bounds__(kWarps * 32)
moe_gate_warp_kernel(const GateArgs a) {
    mlaf_pdl_begin();
    extern __shared__ float smem[];
    constexpr bool kPrefetch = NMAX <= 16;
    constexpr bool kBiasRegs = NMAX <= 16;
    const int lane = threadIdx.x & 31;
    const int wib = threadIdx.x >> 5;
    const int64_t warp0 = (int64_t)blockIdx.x * kWarps + wib;
    const int64_t nwarps = (int64_t)gridDim.x * kWarps;
    const int32_t E = a.E;
    const T *__restrict__ logits = static_cast<const T *>(a.logits);
    const float *__restrict__ bias = a.bias;
    /* grouped routers: this warp's c row (skewed) and its 64 group-score words */
    float *cbuf = smem + wib * (E + (E >> 5) + 1 + 64);
    uint32_t *gbuf = reinterpret_cast<uint32_t *>(cbuf + E + (E >> 5) + 1);

    /* Token-independent: bias in registers (small E). */
    float breg[kBiasRegs ? NMAX : 1];
    if constexpr (kBiasRegs) {
#pragma unroll
        for (int i = 0; i < NMAX; i++) {
            int e = i * 32 + lane;
            breg[i] = (bias && e < E) ? bias[e] : 0.0f;
        }
    }

    float xn[kPrefetch ? NMAX : 1];
    if constexpr (kPrefetch) {
        if (warp0 < a.T) load_row<T, NMAX>(logits + warp0 * a.logits_stride, E, lane, xn);
    }

    for (int64_t t = warp0; t < a.T; t += nwarps) {
        /* 1. logits */
        float x[NMAX];
        if constexpr (kPrefetch) {
#pragma unroll
            for (int i = 0; i < NMAX; i++) x[i] = xn[i];
            if (t + nwarps < a.T)
                load_row<T, NMAX>(logits + (t + nwarps) * a.logits_stride, E, lane, xn);
        } else {
            load_row<T, NMAX>(logits + t * a.logits_stride, E, lane, x);
        }

        /* 2. scores */
        float s[NMAX];
        bool ok[NMAX];
#pragma unroll
        for (int i = 0; i < NMAX; i++) ok[i] = (i * 32 + lane < E) && isfinite(x[i]);
        if constexpr (!score_traits<SF>::row_wise) {
#pragma unroll
            for (int i = 0; i < NMAX; i++) s[i] = score_traits<SF>::exact(ok[i] ? x[i] : 0.0f);
        } else { /* softmax */
            float m = -INFINITY;
#pragma unroll
            for (int i = 0; i < NMAX; i++) m = ok[i] ? fmaxf(m, x[i]) : m;
            m = unord32(warp_max_u32(ord32(m)));
            float part = 0.0f;
#pragma unroll
            for (int i = 0; i < NMAX; i++) {
                s[i] = ok[i] ? expf(x[i] - m) : 0.0f;
                part += s[i];
            }
            float sum = warp_sum(part);
            float d = sum > 0.0f ? sum : 1.0f;
#pragma unroll
            for (int i = 0; i < NMAX; i++) s[i] = s[i] / d;
        }

        /* 3. rank values; scores output */
        uint32_t v[NMAX];
#pragma unroll
        for (int i = 0; i < NMAX; i++) {
            int e = i * 32 + lane;
            bool in = e < E;
            float b = 0.0f;
            if constexpr (kBiasRegs)
                b = breg[i];
            else if (bias && in)
                b = bias[e];
            s[i] = ok[i] ? s[i] : __uint_as_float(0x7fc00000u);
            bool valid = ok[i] && isfinite(b);
            float c = (s[i] + b) + 0.0f; /* + 0: -0 becomes +0, one key per value */
            v[i] = valid ? ord32(c) : (in ? 1u : 0u);
            if (a.scores && in) a.scores[t * a.scores_stride + e] = s[i];
        }

        /* 4. groups */
        if (a.n_group > 1) {
            const int32_t G = a.n_group, P = a.P;
#pragma unroll
            for (int i = 0; i < NMAX; i++) {
                int e = i * 32 + lane;
                if (e < E) cbuf[e + (e >> 5)] = v[i] > 1u ? unord32(v[i]) : -INFINITY;
            }
            __syncwarp();
            /* team size: the largest power of two <= 32 / G, so teams align with xor steps */
            const int L = G <= 32 ? (1 << (31 - __clz(32 / G))) : 1;
            const int per_pass = 32 / L;
            const int Q = (P + L - 1) / L;
            for (int g0 = 0; g0 < G; g0 += per_pass) {
                int g = g0 + lane / L, j = lane % L;
                float m1 = -INFINITY, m2 = -INFINITY;
                if (g < G) {
                    int beg = g * P + j * Q, end = min(beg + Q, (g + 1) * P);
                    for (int e = beg; e < end; e++) {
                        float ce = cbuf[e + (e >> 5)];
                        if (ce > m1) {
                            m2 = m1;
                            m1 = ce;
                        } else if (ce > m2) {
                            m2 = ce;
                        }
                    }
                }
                for (int o = 1; o < L; o <<= 1) {
                    float o1 = __shfl_xor_sync(kFull, m1, o), o2 = __shfl_xor_sync(kFull, m2, o);
                    float lo = fminf(m1, o1);
                    m1 = fmaxf(m1, o1);
                    m2 = fmaxf(lo, fmaxf(m2, o2));
                }
                if (g < G && j == 0) {
                    uint32_t gv = 0u; /* no valid expert in the group */
                    if (m1 != -INFINITY)
                        gv = ord32(((a.group_max || m2 == -INFINITY) ? m1 : m1 + m2) + 0.0f);
                    gbuf[g] = gv;
                }
            }
            __syncwarp();
            uint64_t kept = 0;
#pragma unroll
            for (int half = 0; half < 2; half++) {
                int g = lane + 32 * half;
                bool keep = false;
                if (g < G) {
                    uint32_t mine = gbuf[g];
                    int better = 0;
                    for (int h = 0; h < G; h++) {
                        uint32_t o = gbuf[h];
                        better += (o > mine) || (o == mine && h < g);
                    }
                    keep = better < a.topk_group;
                }
                kept |= (uint64_t)__ballot_sync(kFull, keep) << (32 * half);
            }
            __syncwarp(); /* the next token reuses cbuf / gbuf */
#pragma unroll
            for (int i = 0; i < NMAX; i++) {
                uint32_t e = (uint32_t)(i * 32 + lane);
                uint32_t g = a.P_magic ? __umulhi(e, a.P_magic) : e;
                if (!((kept >> (g & 63u)) & 1ull)) v[i] = 0u;
            }
        }

        /* 5. top-k: per-lane best two, k warp-wide rounds */
        uint32_t b1v = 0, b2v = 0;
        int b1i = 0, b2i = 0;
        float b1s = 0.0f, b2s = 0.0f;
#pragma unroll
        for (int i = 0; i < NMAX; i++) {
            if (v[i] > b1v) {
                b2v = b1v, b2i = b1i, b2s = b1s;
                b1v = v[i], b1i = i, b1s = s[i];
            } else if (v[i] > b2v) {
                b2v = v[i], b2i = i, b2s = s[i];
            }
        }
        bool have2 = true;
        uint32_t my_id0 = 0, my_id1 = 0;
        float my_w0 = 0.0f, my_w1 = 0.0f;
        for (int r = 0; r < a.top_k; r++) {
            uint32_t m = warp_max_u32(b1v);
            uint32_t cand = b1v == m ? (uint32_t)(b1i * 32 + lane) : 0xffffffffu;
            uint32_t win = warp_min_u32(cand);
            float ws = __shfl_sync(kFull, b1s, (int)(win & 31u));
            float w = m > 1u ? ws : 0.0f; /* invalid experts weigh 0 */
            if (lane == (r & 31)) {
                if (r < 32)
                    my_id0 = win, my_w0 = w;
                else
                    my_id1 = win, my_w1 = w;
            }
            if (lane == (int)(win & 31u)) {
                if (have2) {
                    b1v = b2v, b1i = b2i, b1s = b2s;
                    have2 = false;
                } else {
                    /* rescan below the popped key (m, win) */
                    b1v = 0, b2v = 0;
#pragma unroll
                    for (int i = 0; i < NMAX; i++) {
                        uint32_t vi = v[i];
                        bool below = vi < m || (vi == m && (uint32_t)(i * 32 + lane) > win);
                        if (!below) continue;
                        if (vi > b1v) {
                            b2v = b1v, b2i = b1i, b2s = b1s;
                            b1v = vi, b1i = i, b1s = s[i];
                        } else if (vi > b2v) {
                            b2v = vi, b2i = i, b2s = s[i];
                        }
                    }
                    have2 = true;
                }
            }
        }

        /* 6. weights */
        const int k = a.top_k;
        float sum = warp_sum((lane < k ? my_w0 : 0.0f) + (lane + 32 < k ? my_w1 : 0.0f));
        float routed = sum;
        if (a.renormalize) {
            float denom = sum + a.eps;
            if (denom > 0.0f) {
                my_w0 = my_w0 / denom;
                my_w1 = my_w1 / denom;
            }
            if (a.n_shared > 0)
                routed = warp_sum((lane < k ? my_w0 : 0.0f) + (lane + 32 < k ? my_w1 : 0.0f));
        }
        if (a.apply_scaling) {
            my_w0 *= a.scaling;
            my_w1 *= a.scaling;
        }
        const float shared_w = routed / a.scaling;
        int32_t *ids = a.ids + t * a.ids_stride;
        for (int j = lane; j < a.K; j += 32) {
            int32_t id;
            float w;
            if (j < k) {
                id = (int32_t)(j < 32 ? my_id0 : my_id1);
                w = j < 32 ? my_w0 : my_w1;
            } else {
                id = E + (j - k);
                w = shared_w;
            }
            ids[j] = id;
            gate_put_weight<T>(a, t, j, w);
        }
    }
}

template <typename T, mlaf_score_func SF, int NMAX>
void launch(const GateArgs &a, int sm_count, cudaStream_t stream) {
    int64_t want = (a.T + kWarps - 1) / kWarps;
    int64_t cap = (int64_t)(sm_count > 0 ? sm_count : 1) * 16;
    int blocks = (int)(want < cap ? want : cap);
    size_t smem = a.n_group > 1 ? (size_t)kWarps * (a.E + (a.E >> 5) + 1 + 64) * sizeof(float) : 0;
    mlaf_launch(moe_gate_warp_kernel<T, NMAX, SF>, blocks, kWarps * 32, smem, stream, a);
}

template <typename T, mlaf_score_func SF>
void launch_dt(const GateArgs &a, int sm_count, cudaStream_t stream) {
    int slots = (a.E + 31) / 32;
    if (slots <= 1) launch<T, SF, 1>(a, sm_count, stream);
    else if (slots <= 2) launch<T, SF, 2>(a, sm_count, stream);
    else if (slots <= 4) launch<T, SF, 4>(a, sm_count, stream);
    else if (slots <= 8) launch<T, SF, 8>(a, sm_count, stream);
    else if (slots <= 16) launch<T, SF, 16>(a, sm_count, stream);
    else if (slots <= 32) launch<T, SF, 32>(a, sm_count, stream);
    else launch<T, SF, 64>(a, sm_count, stream);
}

} // namespace
