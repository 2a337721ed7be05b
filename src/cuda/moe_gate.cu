/*
 * moe_gate.cu — CUDA router top-k (SPEC §4). Five kernels, one total order (c descending,
 * then the lower expert index; an invalid expert, non-finite logit or bias, ranks below every
 * valid one and weighs 0), so ids match the oracle and the CPU exactly, ties included:
 *   - the tiny kernel (moe_gate_tiny.cuh) for decode sizes, T <= 64: one block per token, one
 *     thread per expert, every step one warp operation or one barrier;
 *   - the solo kernel (moe_gate_solo.cuh) for prefill, T >= 1024, at the compiled shapes
 *     (DeepSeek-V3 / R1, GLM-4.7-Flash; sigmoid): one thread per token, rows staged whole;
 *   - the team kernel (moe_gate_team_kernel, below): a team of L lanes per token with rows
 *     staged through shared memory, the top k found by a threshold and a rank count. It takes
 *     the other calls whose rows can be copied in 4-byte units, E <= 512 and groups that are a
 *     power-of-two run of whole lanes, except the two cases that follow;
 *   - the warp-step kernel (moe_gate_fast_kernel) for routers of <= 128 experts in one group
 *     at T >= 1024 that the solo kernel does not take, where its k rounds of a team max are
 *     cheaper than the team kernel's threshold;
 *   - the general kernel (moe_gate_warp_kernel) for everything else (E up to 2048, any
 *     stride or alignment).
 *
 * Warp-step kernel (moe_gate_fast_kernel). A team of L lanes (8, 16 or 32) owns a token;
 * lane l of the team holds the N contiguous experts [l N, l N + N).
 *   1. Each warp streams its tokens' rows into a shared-memory ring with cp.async (16/8/4-byte
 *      units, one commit group per warp step, about 2 KB per warp in flight), so the memory
 *      parallelism does not cost registers; the bias is loaded while the first rows fly.
 *   2. s = sigmoid (fast exp and reciprocal: ~1e-7 relative) or softmax (team max on the
 *      ordered integer map, butterfly sum, one IEEE reciprocal); c = s + bias; rank value
 *      v = ord32(c), 1 for an invalid expert, 0 for padding and dropped groups.
 *   3. Groups: a group is Lg = P / N adjacent lanes: per-lane top-2, log2(Lg) xor merges, then
 *      every lane ranks its group against the G group scores by G shuffles (no shared memory).
 *   4. Top-k: per-lane best two; each round one team max of v and one ballot: the lowest lane
 *      holding the max holds the lowest expert index (lanes own increasing index ranges). A
 *      lane that wins a third time rescans below the popped key.
 *   5. Output lane j < k owns id j; team sums for renormalization; stores of ids / weights.
 * Launch: 4 warps per block, a persistent grid of SMs x resident blocks (occupancy query,
 * cached per instantiation), grid-stride over warp steps so the ring stays full.
 *
 * General kernel (moe_gate_warp_kernel), one warp per token; lane l holds experts
 * e = 32 * i + l, i < NMAX:
 *   1. Load the logits row (one coalesced element load per slot; the next token's row is
 *      loaded before this one is processed, for E <= 512, so two rows per warp are in flight).
 *   2. s = sigmoid(x), or softmax over the finite logits (warp max by redux on the
 *      order-preserving integer map of the float, warp sum by an xor butterfly, so every lane
 *      sees the same bits). c = s + bias.
 *   3. Every slot gets its rank value v.
 *   4. Groups (n_group > 1): c goes to shared memory (skewed by one word per 32 so the group
 *      scans below hit distinct banks); each group is scanned by a power-of-two team of lanes
 *      (32 / n_group lanes, at least 1), the team merges its partial top-2 by xor shuffles;
 *      lanes then rank the group scores (valid groups first, score descending, lower group
 *      index) and a ballot gives the kept-group mask.
 *   5. Top-k: each lane keeps its best two slots; k rounds of: warp max of v (redux),
 *      warp min of the index among lanes holding that v (redux), the winning lane pops. A
 *      lane that wins a third time rescans its slots below the popped key (rare: a lane holds
 *      three of the top k only when the top k cluster in one lane's residue class).
 *   6. Lane j owns output j: weight s (0 for invalid), warp sums for renormalization,
 *      scaling, shared experts; coalesced stores of ids / weights (and scores in step 2).
 * Limits: E <= 2048 (NMAX = 64 slots per lane; E > 1024 keeps 2 x 64 floats per lane and
 * may spill to local memory, a rare shape that is still correct), top_k <= 64, S <= 64.
 * Any row stride, any element offset (loads are element-wise, so only the dtype's own
 * alignment is assumed), 64-bit token offsets.
 * Launch shape: 128 threads (4 warps) per block, grid-stride over tokens with at most
 * 16 blocks per SM: one warp per token keeps the whole row in registers with no block-level
 * synchronization, and several tokens per warp amortize the per-lane bias and group
 * constants. Shared memory (grouped routers only): per warp E + E/32 floats + 64 group words.
 *
 * Performance: see the team kernel's comment and dev/moe_gate/README.md.
 * Never allocates or synchronizes; graph-capturable.
 */
#include "cuda_common.cuh"

#include <atomic>

namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kWarps = 4;

struct GateArgs {
    int64_t T;
    int32_t E, top_k, n_group, topk_group, n_shared, K;
    int32_t P;        /* experts per group */
    uint32_t P_magic; /* ceil(2^32 / P): e / P == umulhi(e, P_magic) for e < 2048; 0 when P == 1 */
    int32_t softmax, group_max, renormalize, apply_scaling;
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
};

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

template <typename T, int NMAX>
__device__ __forceinline__ void load_row(const T *__restrict__ row, int32_t E, int lane,
                                         float (&x)[NMAX]) {
#pragma unroll
    for (int i = 0; i < NMAX; i++) {
        int e = i * 32 + lane;
        x[i] = e < E ? mlaf_ld(row + e) : 0.0f;
    }
}

template <typename T, int NMAX>
__global__ void __launch_bounds__(kWarps * 32)
moe_gate_warp_kernel(const GateArgs a) {
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
        if (!a.softmax) {
#pragma unroll
            for (int i = 0; i < NMAX; i++) s[i] = 1.0f / (1.0f + expf(-(ok[i] ? x[i] : 0.0f)));
        } else {
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

template <typename T, int NMAX>
void launch(const GateArgs &a, int sm_count, cudaStream_t stream) {
    int64_t want = (a.T + kWarps - 1) / kWarps;
    int64_t cap = (int64_t)(sm_count > 0 ? sm_count : 1) * 16;
    int blocks = (int)(want < cap ? want : cap);
    size_t smem = a.n_group > 1 ? (size_t)kWarps * (a.E + (a.E >> 5) + 1 + 64) * sizeof(float) : 0;
    moe_gate_warp_kernel<T, NMAX><<<blocks, kWarps * 32, smem, stream>>>(a);
}

template <typename T>
void launch_dt(const GateArgs &a, int sm_count, cudaStream_t stream) {
    int slots = (a.E + 31) / 32;
    if (slots <= 1) launch<T, 1>(a, sm_count, stream);
    else if (slots <= 2) launch<T, 2>(a, sm_count, stream);
    else if (slots <= 4) launch<T, 4>(a, sm_count, stream);
    else if (slots <= 8) launch<T, 8>(a, sm_count, stream);
    else if (slots <= 16) launch<T, 16>(a, sm_count, stream);
    else if (slots <= 32) launch<T, 32>(a, sm_count, stream);
    else launch<T, 64>(a, sm_count, stream);
}

/* ==== fast path: staged rows, lane-contiguous experts ================================== */

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

constexpr int kFastWarps = 4;
/* Logits bytes each warp keeps in flight. 2 KB beat 4 and 8 KB on the H200 at every T (the
 * kernel is issue-bound, not DRAM-latency-bound, once ~50 KB per SM are in flight). */
constexpr int kAheadBytes = 2048;

/* N experts per lane, L lanes per token (32 / L tokens per warp at once). */
template <typename T, int N, int L, int Ahead = kAheadBytes> struct FastShape {
    static constexpr int R = 32 / L;                        /* tokens per warp step */
    static constexpr int kRowCap = N * L * (int)sizeof(T);  /* smem row, padded to N*L */
    static constexpr int kStage = kRowCap * R;              /* one warp step, = 32 N sizeof(T) */
    static constexpr int D0 = 1 + Ahead / kStage;
    static constexpr int D = D0 < 2 ? 2 : (D0 > 8 ? 8 : D0); /* ring stages per warp */
    static constexpr int kSmemBytes = kFastWarps * D * kStage;
    /* widest shared-memory load that a lane's N elements split into */
    static constexpr int kLaneBytes = N * (int)sizeof(T);
    static constexpr int kVec = kLaneBytes % 16 == 0 ? 16 : kLaneBytes % 8 == 0 ? 8
                              : kLaneBytes % 4 == 0 ? 4 : 2;
};

template <int B> struct RawVec;
template <> struct RawVec<16> { using type = uint4; };
template <> struct RawVec<8> { using type = uint2; };
template <> struct RawVec<4> { using type = uint32_t; };
template <> struct RawVec<2> { using type = uint16_t; };

template <typename T, int N, int L, int Ahead = kAheadBytes, int MinB = 1>
__global__ void __launch_bounds__(kFastWarps * 32, MinB)
moe_gate_fast_kernel(const GateArgs a, const int copy_unit) {
    using S = FastShape<T, N, L, Ahead>;
    extern __shared__ __align__(16) unsigned char fsmem[];
    const int lane = threadIdx.x & 31;
    const int team = lane / L, tl = lane % L;
    const int64_t gw = (int64_t)blockIdx.x * kFastWarps + (threadIdx.x >> 5);
    const int64_t nw = (int64_t)gridDim.x * kFastWarps;
    unsigned char *ring = fsmem + (threadIdx.x >> 5) * (S::D * S::kStage);
    const int32_t E = a.E;
    const int e0 = tl * N; /* this lane's first expert */
    const unsigned char *logits = static_cast<const unsigned char *>(a.logits);
    const int64_t stride_b = a.logits_stride * (int64_t)sizeof(T);
    const int row_bytes = E * (int)sizeof(T);
    const int nchunks = row_bytes / copy_unit;

    /* Issues the copy of warp step `step` into ring slot `slot` (one commit group per step,
     * empty past the end so the group count stays uniform). */
    auto issue = [&](int64_t step, int slot) {
        int64_t t = (gw + step * nw) * S::R + team;
        if (t < a.T) {
            const unsigned char *src = logits + t * stride_b;
            unsigned char *dst = ring + slot * S::kStage + team * S::kRowCap;
            for (int c = tl; c < nchunks; c += L)
                cp_async(dst + c * copy_unit, src + c * copy_unit, copy_unit);
        }
        cp_async_commit();
    };
#pragma unroll
    for (int p = 0; p < S::D - 1; p++) issue(p, p);

    /* Token-independent: bias, issued while the first rows are in flight. */
    float breg[N];
#pragma unroll
    for (int i = 0; i < N; i++) breg[i] = (a.bias && e0 + i < E) ? a.bias[e0 + i] : 0.0f;
    const uint32_t team_mask = L == 32 ? kFull : (((1u << L) - 1u) << (team * L));
    const int G = a.n_group;
    const int Lg = G > 1 ? (E / G) / N : 1; /* lanes per group (power of two, checked on host) */
    const int my_group = tl / Lg;

    int slot = 0;
    for (int64_t step = 0; (gw + step * nw) * S::R < a.T; step++) {
        const int64_t t = (gw + step * nw) * S::R + team;
        const bool live = t < a.T;
        __syncwarp(); /* every lane is done reading the slot that is refilled now */
        issue(step + S::D - 1, slot == 0 ? S::D - 1 : slot - 1);
        cp_async_wait<S::D - 1>();
        __syncwarp(); /* the copies of all lanes are visible */

        /* 1. this lane's N contiguous logits */
        float x[N];
        {
            using V = typename RawVec<S::kVec>::type;
            constexpr int nv = S::kLaneBytes / S::kVec;
            V raw[nv];
            const V *src = reinterpret_cast<const V *>(ring + slot * S::kStage + team * S::kRowCap +
                                                       e0 * (int)sizeof(T));
#pragma unroll
            for (int j = 0; j < nv; j++) raw[j] = src[j];
            const T *el = reinterpret_cast<const T *>(raw);
#pragma unroll
            for (int i = 0; i < N; i++) x[i] = mlaf_elem<T>::load(el[i]);
        }
        slot = slot == S::D - 1 ? 0 : slot + 1;

        /* 2. scores */
        float s[N];
        bool ok[N];
#pragma unroll
        for (int i = 0; i < N; i++) ok[i] = (e0 + i < E) && isfinite(x[i]);
        if (!a.softmax) {
#pragma unroll
            for (int i = 0; i < N; i++)
                s[i] = __fdividef(1.0f, 1.0f + __expf(-(ok[i] ? x[i] : 0.0f)));
        } else {
            float m = -INFINITY;
#pragma unroll
            for (int i = 0; i < N; i++) m = ok[i] ? fmaxf(m, x[i]) : m;
            m = unord32(team_max_u32<L>(ord32(m)));
            float part = 0.0f;
#pragma unroll
            for (int i = 0; i < N; i++) {
                s[i] = ok[i] ? __expf(x[i] - m) : 0.0f;
                part += s[i];
            }
            float sum = team_sum<L>(part);
            float r = 1.0f / (sum > 0.0f ? sum : 1.0f);
#pragma unroll
            for (int i = 0; i < N; i++) s[i] *= r;
        }

        /* 3. rank values, c for the group scores, scores output */
        uint32_t v[N];
        float c[N];
#pragma unroll
        for (int i = 0; i < N; i++) {
            const bool in = e0 + i < E;
            s[i] = ok[i] ? s[i] : __uint_as_float(0x7fc00000u);
            const bool valid = ok[i] && isfinite(breg[i]);
            c[i] = (s[i] + breg[i]) + 0.0f; /* + 0: -0 becomes +0, one key per value */
            v[i] = valid ? ord32(c[i]) : (in ? 1u : 0u);
            c[i] = valid ? c[i] : -INFINITY;
        }
        if (a.scores && live) {
            float *srow = a.scores + t * a.scores_stride;
#pragma unroll
            for (int i = 0; i < N; i++)
                if (e0 + i < E) srow[e0 + i] = s[i];
        }

        /* 4. groups: a group is Lg adjacent lanes; top-2 by xor shuffles, rank by shuffles */
        if (G > 1) {
            float m1 = -INFINITY, m2 = -INFINITY;
#pragma unroll
            for (int i = 0; i < N; i++) {
                if (c[i] > m1) {
                    m2 = m1;
                    m1 = c[i];
                } else if (c[i] > m2) {
                    m2 = c[i];
                }
            }
            for (int o = 1; o < Lg; o <<= 1) {
                float o1 = __shfl_xor_sync(kFull, m1, o), o2 = __shfl_xor_sync(kFull, m2, o);
                float lo = fminf(m1, o1);
                m1 = fmaxf(m1, o1);
                m2 = fmaxf(lo, fmaxf(m2, o2));
            }
            uint32_t gv = 0u; /* no valid expert in the group */
            if (m1 != -INFINITY)
                gv = ord32(((a.group_max || m2 == -INFINITY) ? m1 : m1 + m2) + 0.0f);
            int better = 0;
            for (int h = 0; h < G; h++) {
                uint32_t o = __shfl_sync(kFull, gv, team * L + h * Lg);
                better += (o > gv) || (o == gv && h < my_group);
            }
            if (better >= a.topk_group) {
#pragma unroll
                for (int i = 0; i < N; i++) v[i] = 0u;
            }
        }

        /* 5. top-k: per-lane best two; per round a team max, and the lowest lane holding it
         * is the lowest expert index (lanes hold increasing, disjoint index ranges). */
        uint32_t b1v = 0, b2v = 0;
        int b1i = 0, b2i = 0;
        float b1s = 0.0f, b2s = 0.0f;
#pragma unroll
        for (int i = 0; i < N; i++) {
            if (v[i] > b1v) {
                b2v = b1v, b2i = b1i, b2s = b1s;
                b1v = v[i], b1i = i, b1s = s[i];
            } else if (v[i] > b2v) {
                b2v = v[i], b2i = i, b2s = s[i];
            }
        }
        bool have2 = true;
        int my_id = 0;
        float my_w = 0.0f;
        const int k = a.top_k;
        for (int r = 0; r < k; r++) {
            const uint32_t m = team_max_u32<L>(b1v);
            const uint32_t bal = __ballot_sync(kFull, b1v == m) & team_mask;
            const int wl = __ffs(bal) - 1;
            const int wi = __shfl_sync(kFull, b1i, wl);
            const float ws = __shfl_sync(kFull, b1s, wl);
            if (tl == r) {
                my_id = (wl - team * L) * N + wi;
                my_w = m > 1u ? ws : 0.0f; /* invalid experts weigh 0 */
            }
            if (lane == wl) {
                if (have2) {
                    b1v = b2v, b1i = b2i, b1s = b2s;
                    have2 = false;
                } else {
                    /* rescan below the popped key (m, wi) */
                    b1v = 0, b2v = 0;
#pragma unroll
                    for (int i = 0; i < N; i++) {
                        const uint32_t vi = v[i];
                        if (!(vi < m || (vi == m && i > wi))) continue;
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
        const float sum = team_sum<L>(tl < k ? my_w : 0.0f);
        float routed = sum;
        if (a.renormalize) {
            const float denom = sum + a.eps;
            if (denom > 0.0f) my_w = my_w / denom;
            if (a.n_shared > 0) routed = team_sum<L>(tl < k ? my_w : 0.0f);
        }
        if (a.apply_scaling) my_w *= a.scaling;
        if (live) {
            const float shared_w = routed / a.scaling;
            int32_t *ids = a.ids + t * a.ids_stride;
            for (int j = tl; j < a.K; j += L) {
                const bool routed_slot = j < k;
                const int32_t id = routed_slot ? my_id : E + (j - k);
                const float w = routed_slot ? my_w : shared_w;
                ids[j] = id;
                gate_put_weight<T>(a, t, j, w);
            }
        }
    }
    cp_async_wait<0>(); /* no copy outlives the block */
}

/* Resident blocks per SM of one fast instantiation (read once; a pure function of the kernel
 * and the device architecture, so a benign per-process cache). */
template <typename T, int N, int L, int Ahead = kAheadBytes, int MinB = 1> int fast_blocks_per_sm() {
    static std::atomic<int> cached{0};
    int v = cached.load(std::memory_order_relaxed);
    if (v == 0) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, moe_gate_fast_kernel<T, N, L, Ahead, MinB>,
                                                          kFastWarps * 32,
                                                          FastShape<T, N, L, Ahead>::kSmemBytes) !=
                cudaSuccess ||
            v < 1) {
            (void)cudaGetLastError();
            v = 4;
        }
        cached.store(v, std::memory_order_relaxed);
    }
    return v;
}

template <typename T, int N, int L, int Ahead = kAheadBytes, int MinB = 1>
void launch_fast(const GateArgs &a, int copy_unit, int sm_count, cudaStream_t stream) {
    using S = FastShape<T, N, L, Ahead>;
    const int64_t per_block = (int64_t)kFastWarps * S::R;
    const int64_t want = (a.T + per_block - 1) / per_block;
    const int64_t cap = (int64_t)(sm_count > 0 ? sm_count : 1) * fast_blocks_per_sm<T, N, L, Ahead, MinB>();
    const int blocks = (int)(want < cap ? want : cap);
    moe_gate_fast_kernel<T, N, L, Ahead, MinB><<<blocks, kFastWarps * 32, S::kSmemBytes, stream>>>(a, copy_unit);
}

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

/* Whether the shape (N experts per lane, L lanes per token) can run call a. */
inline bool fast_fits(const GateArgs &a, int N, int L) {
    const int P = a.E / a.n_group;
    if (a.E > N * L || a.top_k > L) return false;
    if (a.n_group > 1) {
        if (P % N) return false;
        const int lg = P / N;
        if (lg > L || (lg & (lg - 1))) return false;
    }
    return true;
}

/* ==== team kernel: staged rows, threshold + rank selection ============================== */

constexpr int kTeamWarps = 4;
constexpr float kNegInf = -INFINITY;
constexpr uint32_t kOrdNegInf = 0x007fffffu; /* ord32(-inf) */

/* Team of L lanes per token, lane tl holding the N contiguous experts [tl N, tl N + N). */
template <typename T, int N, int L, int Ahead> struct TeamShape {
    static constexpr int R = 32 / L;                         /* tokens per warp step */
    static constexpr int kLaneBytes = N * (int)sizeof(T);
    static constexpr int kRowCap = (N * L * (int)sizeof(T) + 15) / 16 * 16;
    static constexpr int kStage = kRowCap * R;
    static constexpr int D0 = 1 + Ahead / kStage;
    static constexpr int D = D0 < 2 ? 2 : (D0 > 8 ? 8 : D0); /* ring stages per warp */
    static constexpr int kCap = 8 * L < 64 ? 8 * L : 64;     /* candidate list per team */
    static constexpr int J = kCap / L;                       /* list entries per lane */
    static constexpr int kRingBytes = D * kStage;
    static constexpr int kWarpBytes = kRingBytes + R * kCap * 8;
    static constexpr int kSmemBytes = kTeamWarps * kWarpBytes;
    /* 16-byte chunks per lane, and the XOR swizzle that spreads the 8 lanes of a quarter warp
     * over distinct banks when each reads chunk j of its own range: 2 = xor (lane & 7), a
     * permutation within each lane's range or pair of ranges when M is 4 or a multiple of 8;
     * 1 = xor bit 2 of the lane, for M = 2; 0 = none (M = 1 is conflict-free as it is). */
    static constexpr int M = kLaneBytes % 16 == 0 ? kLaneBytes / 16 : 0;
    static constexpr int kSwz = (M == 4 || (M > 0 && M % 8 == 0)) ? 2 : (M == 2 ? 1 : 0);
    static constexpr int kVec = kLaneBytes % 16 == 0 ? 16 : kLaneBytes % 8 == 0 ? 8
                              : kLaneBytes % 4 == 0 ? 4 : 2;
};

/* Byte offset, within a warp step's stage, of byte o of team `team`'s row. */
template <class S, int L> __device__ __forceinline__ int team_phys(int team, int o) {
    if constexpr (S::kSwz == 0) {
        return team * S::kRowCap + o;
    } else {
        const int c = o >> 4;
        const int owner = team * L + c / S::M;
        const int x = S::kSwz == 2 ? (owner & 7) : ((owner >> 2) & 1);
        return team * S::kRowCap + ((c ^ x) << 4) + (o & 15);
    }
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

/*
 * The exact path of one team's token, out of line so the common path stays small in the
 * instruction cache: taken for rows or a bias with non-finite values (SPEC §4 policy), when
 * the scores output is requested, when k exceeds the candidate list, or when the threshold
 * leaves too many candidates (heavy ties). Recomputes c from the staged logits with the
 * policy (invalid expert: c = -inf, ranked after every finite c, weight 0; softmax over the
 * finite logits), selects groups, then k rounds of the team max of keys below the last one
 * popped; writes the winners in rank order to list[0, k). Returns the softmax max and
 * 1 / sum the weights need.
 */
template <typename T, int N, int L, class S, bool kSoftmax>
__device__ __noinline__ float2 team_exact(const GateArgs &a, const unsigned char *row, int team,
                                          int tl, unsigned team_mask, unsigned long long *list,
                                          int64_t t) {
    const int E = a.E, e0 = tl * N;
    const int nv = min(max(E - e0, 0), N);
    float x[N], c[N];
#pragma unroll
    for (int i = 0; i < N; i++)
        x[i] = i < nv ? mlaf_elem<T>::load(*reinterpret_cast<const T *>(
                            row + team_phys<S, L>(team, (e0 + i) * (int)sizeof(T))))
                      : 0.0f;
    float smax = 0.0f, rinv = 1.0f;
    if constexpr (kSoftmax) {
        float m = kNegInf;
#pragma unroll
        for (int i = 0; i < N; i++)
            if (i < nv && isfinite(x[i])) m = fmaxf(m, x[i]);
        smax = team_max_f<L>(m, team_mask);
        float part = 0.0f;
#pragma unroll
        for (int i = 0; i < N; i++) {
            c[i] = (i < nv && isfinite(x[i])) ? __expf(x[i] - smax) : 0.0f;
            part += c[i];
        }
        const float sum = team_sum_m<L>(part, team_mask);
        rinv = 1.0f / (sum > 0.0f ? sum : 1.0f);
#pragma unroll
        for (int i = 0; i < N; i++) c[i] = __fmul_rn(c[i], rinv);
    } else {
#pragma unroll
        for (int i = 0; i < N; i++) c[i] = sigmoid_fast(x[i]);
    }
    if (a.scores) {
        float *srow = a.scores + t * a.scores_stride;
#pragma unroll
        for (int i = 0; i < N; i++)
            if (i < nv) srow[e0 + i] = isfinite(x[i]) ? c[i] : __uint_as_float(0x7fc00000u);
    }
    float lm1 = kNegInf, lm2 = kNegInf;
#pragma unroll
    for (int i = 0; i < N; i++) {
        const float b = (i < nv && a.bias) ? a.bias[e0 + i] : 0.0f;
        const bool ok = i < nv && isfinite(x[i]) && isfinite(b);
        c[i] = ok ? c[i] + b : kNegInf;
        lm2 = fmaxf(lm2, fminf(lm1, c[i]));
        lm1 = fmaxf(lm1, c[i]);
    }
    const int Lg = a.n_group > 1 ? (E / a.n_group) / N : L;
    const bool kept = team_group_kept<L>(a, lm1, lm2, Lg, tl, team, team_mask);
    unsigned long long prev = ~0ull;
    for (int r = 0; r < a.top_k; r++) {
        unsigned long long best = 0ull;
        if (kept) {
#pragma unroll
            for (int i = 0; i < N; i++) {
                const unsigned long long kk = team_key(c[i], e0 + i);
                if (i < nv && kk < prev && kk > best) best = kk;
            }
        }
        best = team_max_u64<L>(best, team_mask);
        if (tl == 0) list[r] = best;
        prev = best;
    }
    return make_float2(smax, rinv);
}

/*
 * One token per team of L lanes; per token:
 *   1. s and c = s + bias for the lane's N experts, and a cheap test for non-finite input
 *      (x * 0 + acc is NaN iff some x is not finite). Teams that need the exact path (see
 *      team_exact) take it from here on.
 *   2. groups (team_group_kept); a lane is kept or not as a whole.
 *   3. threshold: tau = the ceil(k/2)-th largest "second best" over kept lanes. Each of those
 *      lanes holds two experts >= tau, so at least k experts are >= tau, and every expert of
 *      the top k is >= tau.
 *   4. the candidates c >= tau (typically k plus a few) are compacted into a per-team list
 *      (team prefix sum of counts) as 64-bit keys; a candidate's rank is the number of keys
 *      above it; ranks < k are the output slots.
 *   5. weights from s recomputed for the winners from the staged logits; renormalize, scale,
 *      shared experts; each lane stores its own winners.
 * The exact path and the rare cases live out of line (team_exact) so the common path stays
 * small in the instruction cache: with them inline, ncu put "no instruction" first among the
 * stall reasons (5.3 of 12.4 cycles per issued instruction, DeepSeek-V3, N = 32, L = 8).
 * Performance (H200, dev/moe_gate/moe_gate_bench, T = 131072, f32 logits; warp-step kernel in
 * brackets): DeepSeek-V3 126 us with N = 16, L = 16 and 5 resident blocks (206 us), Kimi-K2
 * 155 us with N = 12, L = 32 and 4 (202), DeepSeek-V2 111 us with N = 20, L = 8 and 4 (150);
 * T = 1 in a graph: DeepSeek-V3
 * 3.75 us with N = 8, L = 32 (4.30). Still ~4x the bandwidth floor: the kernel issues ~560
 * warp instructions per DeepSeek-V3 token (ncu, T = 4099) and is latency-bound at 12-20
 * resident warps per SM (96-226 registers per thread): capping N = 16, L = 16 at 96
 * registers took it from 161 to 127 us. A kernel at the floor needs ~150 per token.
 */
template <typename T, int N, int L, int Ahead, bool kSoftmax, int MinB>
__global__ void __launch_bounds__(kTeamWarps * 32, MinB)
moe_gate_team_kernel(const GateArgs a, const int copy_unit) {
    using S = TeamShape<T, N, L, Ahead>;
    extern __shared__ __align__(16) unsigned char tsmem[];
    const int lane = threadIdx.x & 31;
    const int team = lane / L, tl = lane % L;
    const int wib = threadIdx.x >> 5;
    const int64_t gw = (int64_t)blockIdx.x * kTeamWarps + wib;
    const int64_t nw = (int64_t)gridDim.x * kTeamWarps;
    unsigned char *ring = tsmem + wib * S::kWarpBytes;
    unsigned long long *list =
        reinterpret_cast<unsigned long long *>(ring + S::kRingBytes) + team * S::kCap;
    const int32_t E = a.E;
    const int e0 = tl * N;
    const int nv = min(max(E - e0, 0), N); /* real experts of this lane */
    const unsigned char *logits = static_cast<const unsigned char *>(a.logits);
    const int64_t stride_b = a.logits_stride * (int64_t)sizeof(T);
    const int nchunks = E * (int)sizeof(T) / copy_unit;
    const unsigned team_mask = L == 32 ? kFull : (((1u << L) - 1u) << (team * L));
    const int K = a.top_k;

    /* padding bytes of the ring are never copied: zero them once so they read as finite */
    for (int o = lane * 16; o < S::kRingBytes; o += 32 * 16)
        *reinterpret_cast<uint4 *>(ring + o) = make_uint4(0, 0, 0, 0);
    __syncwarp();

    auto issue = [&](int64_t step, int slot) {
        const int64_t t = (gw + step * nw) * S::R + team;
        if (t < a.T) {
            const unsigned char *src = logits + t * stride_b;
            unsigned char *dst = ring + slot * S::kStage;
            for (int c = tl; c < nchunks; c += L)
                cp_async(dst + team_phys<S, L>(team, c * copy_unit), src + c * copy_unit, copy_unit);
        }
        cp_async_commit();
    };
#pragma unroll
    for (int p = 0; p < S::D - 1; p++) issue(p, p);

    /* token-independent: bias (padding: -inf, so c = -inf), and whether any is non-finite */
    float breg[N];
    if (a.bias && nv == N) {
#pragma unroll
        for (int i = 0; i < N; i++) breg[i] = a.bias[e0 + i];
    } else {
#pragma unroll
        for (int i = 0; i < N; i++) breg[i] = i < nv ? (a.bias ? a.bias[e0 + i] : 0.0f) : kNegInf;
    }
    bool bias_bad = false;
#pragma unroll
    for (int i = 0; i < N; i++) bias_bad |= i < nv && !isfinite(breg[i]);
    /* calls that always take the exact path */
    const bool all_exact = __any_sync(kFull, bias_bad) || a.scores != nullptr || K > S::kCap;
    const int Lg = a.n_group > 1 ? (E / a.n_group) / N : L; /* lanes per group */

    int slot = 0;
    for (int64_t step = 0; (gw + step * nw) * S::R < a.T; step++) {
        const int64_t t = (gw + step * nw) * S::R + team;
        __syncwarp(); /* every lane is done with the slot that is refilled now */
        issue(step + S::D - 1, slot == 0 ? S::D - 1 : slot - 1);
        cp_async_wait<S::D - 1>();
        __syncwarp();
        const unsigned char *row = ring + slot * S::kStage;
        slot = slot == S::D - 1 ? 0 : slot + 1;
        if (t >= a.T) continue;

        /* 1. logits, scores, keys */
        float c[N];
        float acc = 0.0f;
        float smax = 0.0f, rinv = 1.0f; /* softmax: max and 1 / sum */
        {
            using V = typename RawVec<S::kVec>::type;
            constexpr int nvec = S::kLaneBytes / S::kVec;
            V raw[nvec];
#pragma unroll
            for (int j = 0; j < nvec; j++)
                raw[j] = *reinterpret_cast<const V *>(
                    row + team_phys<S, L>(team, e0 * (int)sizeof(T) + j * S::kVec));
            const T *el = reinterpret_cast<const T *>(raw);
            if constexpr (kSoftmax) {
                float m = kNegInf;
#pragma unroll
                for (int i = 0; i < N; i++) {
                    const float xi = mlaf_elem<T>::load(el[i]);
                    acc = fmaf(xi, 0.0f, acc);
                    if (i < nv) m = fmaxf(m, xi);
                }
                smax = team_max_f<L>(m, team_mask);
                float part = 0.0f;
#pragma unroll
                for (int i = 0; i < N; i++) {
                    c[i] = __expf(mlaf_elem<T>::load(el[i]) - smax);
                    if (i < nv) part += c[i];
                }
                rinv = 1.0f / team_sum_m<L>(part, team_mask);
#pragma unroll
                for (int i = 0; i < N; i++) c[i] = i < nv ? __fmul_rn(c[i], rinv) + breg[i] : kNegInf;
            } else {
                float acc1 = 0.0f; /* two chains: half the dependent latency */
#pragma unroll
                for (int i = 0; i < N; i++) {
                    const float xi = mlaf_elem<T>::load(el[i]);
                    if (i & 1)
                        acc1 = fmaf(xi, 0.0f, acc1);
                    else
                        acc = fmaf(xi, 0.0f, acc);
                    c[i] = sigmoid_fast(xi) + breg[i];
                }
                acc += acc1;
            }
        }
        bool exact = all_exact || __any_sync(team_mask, acc != acc);
        int n = 0;
        if (!exact) {
            float lm1 = kNegInf, lm2 = kNegInf;
#pragma unroll
            for (int i = 0; i < N; i++) {
                lm2 = fmaxf(lm2, fminf(lm1, c[i]));
                lm1 = fmaxf(lm1, c[i]);
            }
            /* 2. groups */
            const bool kept = team_group_kept<L>(a, lm1, lm2, Lg, tl, team, team_mask);
            /* 3. threshold */
            float u = kept ? lm2 : kNegInf, tau;
            const int jn = (K + 1) / 2;
            for (int r = 0;; r++) {
                const float mx = team_max_f<L>(u, team_mask);
                if (r == jn - 1 || mx == kNegInf) {
                    tau = mx;
                    break;
                }
                const unsigned bal = __ballot_sync(team_mask, u == mx);
                if (lane == __ffs(bal) - 1) u = kNegInf;
            }
            /* 4. candidates >= tau into the team's list */
            int cnt = 0;
            if (kept) {
#pragma unroll
                for (int i = 0; i < N; i++) cnt += c[i] >= tau;
            }
            int inc = cnt;
#pragma unroll
            for (int o = 1; o < L; o <<= 1) {
                const int y = __shfl_up_sync(team_mask, inc, o, L);
                if (tl >= o) inc += y;
            }
            n = __shfl_sync(team_mask, inc, team * L + L - 1);
            exact = tau == kNegInf || n > S::kCap;
            if (!exact && kept) {
                int pos = inc - cnt;
#pragma unroll
                for (int i = 0; i < N; i++) {
                    const bool p = c[i] >= tau;
                    if (p) list[pos] = team_key(c[i], e0 + i);
                    pos += p;
                }
            }
        }
        if (exact) {
            const float2 sm = team_exact<T, N, L, S, kSoftmax>(a, row, team, tl, team_mask, list, t);
            smax = sm.x;
            rinv = sm.y;
            n = K;
        }
        __syncwarp(team_mask);

        /* 5. winners: rank < k (the exact path left them in rank order) */
        int wr[S::J], wid[S::J];
        float ww[S::J];
        float part = 0.0f;
#pragma unroll
        for (int jj = 0; jj < S::J; jj++) {
            wr[jj] = K;
            wid[jj] = 0;
            ww[jj] = 0.0f;
            if (jj * L < n) {
                const int j = tl + jj * L;
                if (j < n) {
                    const unsigned long long kj = list[j];
                    int r = j;
                    if (!exact) {
                        r = 0;
                        for (int q = 0; q < n; q++) r += list[q] > kj;
                    }
                    if (r < K) {
                        const int e = (int)(0xffffffffu - (uint32_t)kj);
                        const float xv = mlaf_elem<T>::load(*reinterpret_cast<const T *>(
                            row + team_phys<S, L>(team, e * (int)sizeof(T))));
                        float w;
                        if constexpr (kSoftmax)
                            w = __fmul_rn(__expf(xv - smax), rinv);
                        else
                            w = sigmoid_fast(xv);
                        if ((uint32_t)(kj >> 32) == kOrdNegInf) w = 0.0f; /* invalid: weight 0 */
                        wr[jj] = r;
                        wid[jj] = e;
                        ww[jj] = w;
                        part += w;
                    }
                }
            }
        }
        const float sum = team_sum_m<L>(part, team_mask);
        float routed = sum;
        if (a.renormalize) {
            const float denom = sum + a.eps;
            const float rden = denom > 0.0f ? __frcp_rn(denom) : 1.0f;
            part = 0.0f;
#pragma unroll
            for (int jj = 0; jj < S::J; jj++) {
                ww[jj] *= rden;
                part += ww[jj];
            }
            if (a.n_shared > 0) routed = team_sum_m<L>(part, team_mask);
        }
        int32_t *ids = a.ids + t * a.ids_stride;
#pragma unroll
        for (int jj = 0; jj < S::J; jj++) {
            if (wr[jj] < K) {
                ids[wr[jj]] = wid[jj];
                gate_put_weight<T>(a, t, wr[jj], a.apply_scaling ? ww[jj] * a.scaling : ww[jj]);
            }
        }
        const float shared_w = routed / a.scaling;
        for (int j = K + tl; j < a.K; j += L) {
            ids[j] = E + (j - K);
            gate_put_weight<T>(a, t, j, shared_w);
        }
    }
    cp_async_wait<0>(); /* no copy outlives the block */
}

template <typename T, int N, int L, int Ahead, bool kSoftmax, int MinB> int team_blocks_per_sm() {
    static std::atomic<int> cached{0};
    int v = cached.load(std::memory_order_relaxed);
    if (v == 0) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                &v, moe_gate_team_kernel<T, N, L, Ahead, kSoftmax, MinB>, kTeamWarps * 32,
                TeamShape<T, N, L, Ahead>::kSmemBytes) != cudaSuccess ||
            v < 1) {
            (void)cudaGetLastError();
            v = 2;
        }
        cached.store(v, std::memory_order_relaxed);
    }
    return v;
}

template <typename T, int N, int L, bool kSoftmax, int Ahead = 4096, int MinB = 1>
void launch_team(const GateArgs &a, int copy_unit, int sm_count, cudaStream_t stream) {
    using S = TeamShape<T, N, L, Ahead>;
    static_assert(S::kSmemBytes <= 227 * 1024, "team kernel shared memory");
    if (S::kSmemBytes > 48 * 1024)
        (void)cudaFuncSetAttribute(moe_gate_team_kernel<T, N, L, Ahead, kSoftmax, MinB>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmemBytes);
    const int64_t per_block = (int64_t)kTeamWarps * S::R;
    const int64_t want = (a.T + per_block - 1) / per_block;
    const int64_t cap =
        (int64_t)(sm_count > 0 ? sm_count : 1) * team_blocks_per_sm<T, N, L, Ahead, kSoftmax, MinB>();
    const int blocks = (int)(want < cap ? want : cap);
    moe_gate_team_kernel<T, N, L, Ahead, kSoftmax, MinB>
        <<<blocks, kTeamWarps * 32, S::kSmemBytes, stream>>>(a, copy_unit);
}

/* Whether the team shape (N experts per lane, L lanes) can run call a: the row fits, and a
 * group is a power-of-two run of whole lanes. */
inline bool team_fits(const GateArgs &a, int N, int L) {
    if (a.E > N * L) return false;
    if (a.n_group > 1) {
        const int P = a.E / a.n_group;
        if (P % N) return false;
        const int lg = P / N;
        if (lg > L || (lg & (lg - 1))) return false;
    }
    return true;
}

/* Calls below this many tokens take the 32-lane team shapes (the shortest chain per token);
 * larger ones the 8- and 16-lane shapes where they fit, and the warp-step kernel above for
 * routers of at most 128 experts in one group (H200, dev/moe_gate: GLM-4.7-Flash at
 * T = 131072, 48 us against 52 us for the best team shape). */
constexpr int64_t kTeamWideBelowT = 1024;

#include "moe_gate_solo.cuh"
#include "moe_gate_tiny.cuh"

/* Calls from this many tokens take the solo kernel where it fits. */
constexpr int64_t kSoloFromT = 1024;

template <typename T>
bool try_team(const GateArgs &a, int sm_count, cudaStream_t stream) {
    if (a.T >= kSoloFromT && try_solo<T>(a, sm_count, stream)) return true;
    if (a.T <= kTinyMaxT && try_tiny<T>(a, sm_count, stream)) return true;
    if (a.E <= 64 && a.T <= 64) return false; /* shorter chain in the general kernel */
    const int unit = fast_copy_unit<T>(a);
    if (unit == 0) return false;
    if (a.T >= kTeamWideBelowT && a.n_group == 1 && a.E <= 128) {
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
            launch_team<T, N, L, true, 4096, MINB>(a, unit, sm_count, stream);                    \
        else                                                                                      \
            launch_team<T, N, L, false, 4096, MINB>(a, unit, sm_count, stream);                   \
        return true;                                                                              \
    }
    /* MINB: resident blocks the register allocation must allow. The kernel is latency-bound,
     * so warps per SM pay (H200, T = 131072, f32): DeepSeek-V3 N=16 L=16 161 -> 127 us at 5;
     * DeepSeek-V2 N=20 L=8 139 -> 115 us at 4; Kimi-K2 N=12 L=32 183 -> 156 us at 4. */
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
    GateArgs a;
    a.T = job->T;
    a.E = job->E;
    a.top_k = job->top_k;
    a.n_group = job->n_group;
    a.topk_group = job->topk_group;
    a.n_shared = job->n_shared;
    a.K = job->K;
    a.P = job->E / job->n_group;
    a.P_magic = a.P == 1 ? 0u : (uint32_t)((0x100000000ull + (uint64_t)a.P - 1) / (uint64_t)a.P);
    a.softmax = job->score_func == MLAF_SCORE_SOFTMAX;
    a.group_max = job->group_score == MLAF_GROUP_MAX;
    a.renormalize = job->renormalize;
    a.apply_scaling = job->apply_scaling;
    a.scaling = job->scaling;
    a.eps = job->eps;
    a.logits = job->logits;
    a.logits_stride = job->logits_stride;
    a.bias = job->bias;
    a.weights = job->weights;
    a.weights_f32 = job->weights_dt == MLAF_F32;
    a.weights_stride = job->weights_stride;
    a.ids = job->ids;
    a.ids_stride = job->ids_stride;
    a.scores = job->scores;
    a.scores_stride = job->scores_stride;
    cudaStream_t stream = (cudaStream_t)ctx->cuda_stream;
    const int sm = ctx->cuda_sm_count;
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
