/*
 * moe_gate_team.cuh — the router's team kernel (moe_gate_team_kernel): a team of L lanes per
 * token, lane tl holding the N contiguous experts [tl N, tl N + N); rows staged through a
 * per-warp shared-memory ring by cp.async (XOR-swizzled so that the 8 lanes of a quarter warp
 * read distinct banks), the top k found by a threshold and a rank count. Per token:
 *   1. s and c = s + bias for the lane's N experts, and a cheap test for non-finite input
 *      (x * 0 + acc is NaN iff some x is not finite). Teams that need the exact path (see
 *      team_exact) take it from here on.
 *   2. Groups (team_group_kept); a lane is kept or not as a whole.
 *   3. Threshold: tau = the ceil(k/2)-th largest "second best" over kept lanes. Each of those
 *      lanes holds two experts >= tau, so at least k experts are >= tau, and every expert of
 *      the top k is >= tau.
 *   4. The candidates c >= tau (typically k plus a few) are compacted into a per-team list
 *      (team prefix sum of counts) as 64-bit keys; a candidate's rank is the number of keys
 *      above it; ranks < k are the output slots.
 *   5. Weights from s recomputed for the winners from the staged logits; renormalize, scale,
 *      shared experts; each lane stores its own winners.
 * The exact path and the rare cases live out of line (team_exact) so that the common path
 * stays small in the instruction cache: inline, instruction fetch was the first stall reason.
 * Limits (team_fits, fast_copy_unit): E <= N L, a group is a power-of-two run of whole lanes,
 * rows (start, length, stride) copyable in 4-byte units.
 * Launch: 4 warps per block, a persistent grid of SMs x resident blocks (occupancy query,
 * cached per instantiation). The kernel is bound by its warps' dependent latencies, so MinB
 * (resident blocks the register allocation must allow) buys warps per SM with registers.
 */
#pragma once

#include "moe_gate_common.cuh"

namespace {

constexpr int kTeamWarps = 4;

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

/*
 * The exact path of one team's token, out of line so the common path stays small in the
 * instruction cache: taken for rows or a bias with non-finite values (docs/moe_gate.md policy), when
 * the scores output is requested, when k exceeds the candidate list, or when the threshold
 * leaves too many candidates (heavy ties). Recomputes c from the staged logits with the
 * policy (invalid expert: c = -inf, ranked after every finite c, weight 0; softmax over the
 * finite logits), selects groups, then k rounds of the team max of keys below the last one
 * popped; writes the winners in rank order to list[0, k). Returns the softmax max and
 * 1 / sum the weights need.
 */
template <typename T, int N, int L, class S, mlaf_score_func SF>
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
    if constexpr (score_traits<SF>::row_wise) { /* softmax */
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
        for (int i = 0; i < N; i++) c[i] = score_traits<SF>::fast(x[i]);
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

/* One token per team of L lanes: the steps of the opening comment. */
template <typename T, int N, int L, int Ahead, mlaf_score_func SF, int MinB>
__global__ void __launch_bounds__(kTeamWarps * 32, MinB)
moe_gate_team_kernel(const GateArgs a, const int copy_unit) {
    mlaf_pdl_begin();
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
            if constexpr (score_traits<SF>::row_wise) { /* softmax */
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
                    c[i] = score_traits<SF>::fast(xi) + breg[i];
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
            const float2 sm = team_exact<T, N, L, S, SF>(a, row, team, tl, team_mask, list, t);
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
                        if constexpr (score_traits<SF>::row_wise) /* softmax */
                            w = __fmul_rn(__expf(xv - smax), rinv);
                        else
                            w = score_traits<SF>::fast(xv);
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

template <typename T, int N, int L, int Ahead, mlaf_score_func SF, int MinB> int team_blocks_per_sm() {
    static std::atomic<int> cached{0};
    int v = cached.load(std::memory_order_relaxed);
    if (v == 0) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                &v, moe_gate_team_kernel<T, N, L, Ahead, SF, MinB>, kTeamWarps * 32,
                TeamShape<T, N, L, Ahead>::kSmemBytes) != cudaSuccess ||
            v < 1) {
            (void)cudaGetLastError();
            v = 2;
        }
        cached.store(v, std::memory_order_relaxed);
    }
    return v;
}

template <typename T, int N, int L, mlaf_score_func SF, int Ahead = 4096, int MinB = 1>
void launch_team(const GateArgs &a, int copy_unit, int sm_count, cudaStream_t stream) {
    using S = TeamShape<T, N, L, Ahead>;
    static_assert(S::kSmemBytes <= 227 * 1024, "team kernel shared memory");
    if (S::kSmemBytes > 48 * 1024)
        (void)cudaFuncSetAttribute(moe_gate_team_kernel<T, N, L, Ahead, SF, MinB>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmemBytes);
    const int64_t per_block = (int64_t)kTeamWarps * S::R;
    const int64_t want = (a.T + per_block - 1) / per_block;
    const int64_t cap =
        (int64_t)(sm_count > 0 ? sm_count : 1) * team_blocks_per_sm<T, N, L, Ahead, SF, MinB>();
    const int blocks = (int)(want < cap ? want : cap);
    mlaf_launch(moe_gate_team_kernel<T, N, L, Ahead, SF, MinB>,
        blocks, kTeamWarps * 32, S::kSmemBytes, stream, a, copy_unit);
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

} // namespace
