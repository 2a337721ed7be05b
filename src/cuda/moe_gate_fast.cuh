/*
 * moe_gate_fast.cuh — the router's warp-step kernel (moe_gate_fast_kernel): routers of <= 128
 * experts in one group at T >= 1024 that the solo kernel does not take, where k rounds of a
 * team max are cheaper than the team kernel's threshold and list. A team of L lanes (8, 16 or
 * 32) owns a token; lane l of the team holds the N contiguous experts [l N, l N + N).
 *   1. Each warp streams its tokens' rows into a shared-memory ring with cp.async (16/8/4-byte
 *      units, one commit group per warp step), so the memory parallelism does not cost
 *      registers; the bias is loaded while the first rows fly.
 *   2. s = score_traits<SF>::quick(x) (sigmoid: fast exp and reciprocal, ~1e-7 relative), for
 *      the scores whose traits say warp_step, or softmax (team max on ord32,
 *      butterfly sum, one IEEE reciprocal); c = s + bias; rank value v = ord32(c), 1 for an
 *      invalid expert, 0 for padding and dropped groups.
 *   3. Groups: a group is Lg = P / N adjacent lanes: per-lane top-2, log2(Lg) xor merges, then
 *      every lane ranks its group against the G group scores by G shuffles (no shared memory).
 *   4. Top-k: per-lane best two; each round one team max of v and one ballot: the lowest lane
 *      holding the max holds the lowest expert index (lanes own increasing index ranges). A
 *      lane that wins a third time rescans below the popped key.
 *   5. Output lane j < k owns id j; team sums for renormalization; stores of ids / weights.
 * Limits (fast_fits, fast_copy_unit): E <= N L, top_k <= L, a group is a power-of-two run of
 * whole lanes, rows (start, length, stride) copyable in 4-byte units.
 * Launch: 4 warps per block, a persistent grid of SMs x resident blocks (occupancy query,
 * cached per instantiation), grid-stride over warp steps so the ring stays full; about 2 KB of
 * logits per warp in flight (kAheadBytes).
 */
#pragma once

#include "moe_gate_common.cuh"

namespace {

constexpr int kFastWarps = 4;
/* Logits bytes each warp keeps in flight: with ~50 KB per SM in flight the kernel is bound by
 * instruction issue, not by DRAM latency, so a deeper ring only costs shared memory. */
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

template <typename T, int N, int L, mlaf_score_func SF, int Ahead = kAheadBytes, int MinB = 1>
__global__ void __launch_bounds__(kFastWarps * 32, MinB)
moe_gate_fast_kernel(const GateArgs a, const int copy_unit) {
    static_assert(score_traits<SF>::warp_step, "warp-step kernel: a score its traits allow");
    mlaf_pdl_begin();
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
        if constexpr (!score_traits<SF>::row_wise) {
#pragma unroll
            for (int i = 0; i < N; i++) s[i] = score_traits<SF>::quick(ok[i] ? x[i] : 0.0f);
        } else { /* softmax */
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
template <typename T, int N, int L, mlaf_score_func SF, int Ahead = kAheadBytes, int MinB = 1>
int fast_blocks_per_sm() {
    static std::atomic<int> cached{0};
    int v = cached.load(std::memory_order_relaxed);
    if (v == 0) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, moe_gate_fast_kernel<T, N, L, SF, Ahead, MinB>,
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

template <typename T, int N, int L, mlaf_score_func SF, int Ahead = kAheadBytes, int MinB = 1>
void launch_fast(const GateArgs &a, int copy_unit, int sm_count, cudaStream_t stream) {
    using S = FastShape<T, N, L, Ahead>;
    const int64_t per_block = (int64_t)kFastWarps * S::R;
    const int64_t want = (a.T + per_block - 1) / per_block;
    const int64_t cap = (int64_t)(sm_count > 0 ? sm_count : 1) * fast_blocks_per_sm<T, N, L, SF, Ahead, MinB>();
    const int blocks = (int)(want < cap ? want : cap);
    mlaf_launch(moe_gate_fast_kernel<T, N, L, SF, Ahead, MinB>,
        blocks, kFastWarps * 32, S::kSmemBytes, stream, a, copy_unit);
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

} // namespace
