/*
 * moe_gate_solo.cuh — the router's prefill kernel (moe_gate_solo_kernel): one thread per token.
 *
 * The team kernels spend most of their instructions coordinating lanes (shuffles, ballots,
 * prefix sums). Here a lane owns a whole token, so a warp instruction advances 32 tokens and
 * no step needs another lane. Per token:
 *   0. The lane stages its row into its own shared-memory row (padded by 16 bytes, so the 32
 *      lanes reading one offset hit distinct banks): on sm_90 bulk copies counted in bytes on
 *      an mbarrier, elsewhere 16-byte cp.async by runs of lanes; one copy per row
 *      (kSoloOneSeg), or two segments so that pass 1 starts while the second half lands.
 *   1. Pass 1, per unit of VB experts: s = sigmoid_fast(x), written back over the row as f32
 *      or recomputed later (kSoloRecompute); c = s + b (bias staged per group, padded so that
 *      lanes in different groups hit distinct banks); the unit's best two c. A unit's loads
 *      are issued before the previous unit's stores, which the compiler cannot move loads
 *      across. A non-finite logit (x * 0 + acc turns NaN) sends the token to the exact path.
 *   2. Groups: a group's score from its units' best two; ranks counted.
 *   3. Threshold: tau = the k-th largest best-two value of the kept units (a bitonic selection
 *      network): k real experts are >= tau, so the whole top k is.
 *   4. Pass 2 over kept groups, ascending expert index: c >= tau into a per-lane list.
 *   5. Insertion into a sorted top-KMAX in registers (strict >, so on equal c the lower index
 *      stays ahead); the winners' weights are their s.
 *   6. Renormalize, scale, shared experts, stores, with the team kernel's formulas.
 * Rows with a non-finite logit or bias, and lists that overflow (heavy ties), take
 * solo_exact_warp: the moe_gate policy (docs/moe_gate.md) computed by the whole warp, one such
 * token after another.
 * Scores whose traits are `filtered` (sqrt_softplus) rank by a cheap score in passes 1-2 and
 * re-key the candidates exactly before step 5.
 * Limits (else try_solo returns false): sigmoid, or sqrt_softplus in one group; no scores output,
 * 16-byte aligned rows, the compiled shapes (E, G) with k <= KMAX and k <= 2 x kept units.
 * Launch: 2 warps (64 tokens) per block, a persistent grid of SMs x resident blocks. Shared
 * memory (~1 KB per f32 DeepSeek-V3 token) bounds the resident warps, and the kernel is bound
 * by their latencies: hence the variants that stage less (kSoloRecompute, kSoloHalf).
 */
#pragma once

#include "moe_gate_common.cuh"

namespace {

constexpr int kSoloWarps = 2;

/* Variant flags: kSoloRecompute keeps only the logits in shared memory and recomputes s in
 * pass 2 (half the shared memory for bf16 / f16 rows, 1.5x the sigmoids); kSoloOneSeg stages a
 * row in one copy instead of two segments; kSoloUnroll2 unrolls pass 1 by two units;
 * kSoloPrefetch asks L2 for the lane's row of the warp's next tile once pass 1 is done (sm_90),
 * so that tile's staging copy finds it there; kSoloHalf (with kSoloRecompute, two segments)
 * stages half a row at a time into a half-row slot: the second half lands over the first once
 * pass 1 holds the first in registers, and pass 2 / the winners' weights read first-half logits
 * from global memory (twice the resident tokens per SM for the same shared memory). */
constexpr int kSoloRecompute = 1, kSoloOneSeg = 2, kSoloUnroll2 = 4, kSoloPrefetch = 8,
              kSoloHalf = 16;

/* The score SF (score_traits<SF>::solo): passes 1 and 2 rank by score_traits<SF>::filter. A
 * filtered score (sqrt_softplus, DeepSeek-V4) lowers the candidates' threshold by its margin so
 * that the exact top k is among them; then the candidates' keys and the winners' weights are
 * score_traits<SF>::fast (the other kernels' bits). Otherwise filter is fast itself (sigmoid). */

/* Shared memory of one warp: 32 rows, one per lane, each padded by 16 bytes so that the 32
 * lanes reading the same offset of their rows hit distinct banks; row r holds s (f32) with the
 * logits staged in its upper part (bf16 / f16: s is written over logits already read), or the
 * logits alone (kSoloRecompute); then NS mbarriers and the [slot][lane] candidate list. */
template <typename T, int E, int G, int VB, int F = 0> struct SoloShape {
    static constexpr bool RC = (F & kSoloRecompute) != 0;
    static constexpr int P = E / G;                       /* experts per group */
    static constexpr int U = E / VB;                      /* tracked units */
    static constexpr int UG = P / VB;                     /* units per group */
    static constexpr int EPC = 16 / (int)sizeof(T);       /* logits per 16-byte chunk */
    static constexpr int XC = E / EPC;                    /* logits chunks per row */
    static constexpr int kXBytes = E * (int)sizeof(T);    /* logits per row */
    static constexpr bool HF = (F & kSoloHalf) != 0;      /* half-row slots */
    static constexpr int kRowBytes = (HF ? kXBytes / 2 : RC ? kXBytes : E * 4) + 16;
    static constexpr int kXOff = kRowBytes - 16 - (HF ? kXBytes / 2 : kXBytes); /* logits within a row */
    /* staging segments */
    static constexpr int NS = (F & kSoloOneSeg) == 0 && U % 2 == 0 && XC % 2 == 0 ? 2 : 1;
    static constexpr int kCap = U < 8 ? 8 : U;            /* list entries per token (>= tops) */
    static constexpr int kBarOff = 32 * kRowBytes;
    static constexpr int kListOff = kBarOff + 16;
    static constexpr int kWarpBytes = kListOff + kCap * 8 * 32;
    static constexpr int kBiasStride = P + 4;             /* floats per group */
    static constexpr int kBiasBytes = (G * kBiasStride * 4 + 15) / 16 * 16;
    static constexpr int kSmemBytes = kBiasBytes + kSoloWarps * kWarpBytes;
    static_assert(E % G == 0 && P % VB == 0 && VB % EPC == 0 && P % EPC == 0, "solo shape");
    static_assert(RC || sizeof(T) == 4 || (E * 2) % 16 == 0, "solo: row layout");
    static_assert(((kRowBytes / 16) & 1) == 1, "solo: odd row stride in 16-byte units");
    static_assert(XC % NS == 0 && U % NS == 0 && NS <= 2, "solo: staging segments");
    static_assert(!HF || (RC && NS == 2), "solo: half rows need s recomputed and two segments");
};

/* ---- staging: sm_90 bulk copies (one per row segment) on an mbarrier (cuda_common.cuh);
 * cp.async elsewhere ---------------------------------------------------------------------- */

/* Bitonic stages that sort v[o, o + W) descending (W a power of two). */
template <int N, int W>
__device__ __forceinline__ void solo_sort_run(float (&v)[N], int o) {
#pragma unroll
    for (int k = 2; k <= W; k <<= 1) {
#pragma unroll
        for (int j = k >> 1; j > 0; j >>= 1) {
#pragma unroll
            for (int i = 0; i < W; i++) {
                const int l = i ^ j;
                if (l > i) {
                    const float a = v[o + i], b = v[o + l];
                    const bool desc = (i & k) == 0;
                    v[o + i] = desc ? fmaxf(a, b) : fminf(a, b);
                    v[o + l] = desc ? fminf(a, b) : fmaxf(a, b);
                }
            }
        }
    }
}

/* The k-th largest of v (k <= KS): runs of KS sorted, then pairs of runs folded into their top
 * KS (elementwise max against the partner reversed gives a bitonic run, one merge sorts it). */
template <int N, int KS>
__device__ __forceinline__ float solo_kth(float (&v)[N], int k) {
    static_assert((KS & (KS - 1)) == 0 && N % KS == 0 && ((N / KS) & (N / KS - 1)) == 0, "solo_kth");
#pragma unroll
    for (int c = 0; c < N / KS; c++) solo_sort_run<N, KS>(v, c * KS);
#pragma unroll
    for (int w = N / KS; w > 1; w >>= 1) {
#pragma unroll
        for (int c = 0; c < w / 2; c++) {
#pragma unroll
            for (int i = 0; i < KS; i++) v[c * KS + i] = fmaxf(v[c * KS + i], v[(c + w / 2) * KS + KS - 1 - i]);
#pragma unroll
            for (int j = KS / 2; j > 0; j >>= 1) {
#pragma unroll
                for (int i = 0; i < KS; i++) {
                    const int l = i ^ j;
                    if (l > i) {
                        const float a = v[c * KS + i], b = v[c * KS + l];
                        v[c * KS + i] = fmaxf(a, b);
                        v[c * KS + l] = fminf(a, b);
                    }
                }
            }
        }
    }
    float tau = v[0]; /* v[k - 1], without an indexed (local memory) load */
#pragma unroll
    for (int i = 1; i < KS; i++) tau = fminf(tau, i < k ? v[i] : v[0]);
    return tau;
}

/* Weights of the k winners (rank order): renormalize, scale, shared experts, stores; the team
 * kernel's formulas. */
template <typename T, int KMAX>
__device__ __forceinline__ void solo_store(const GateArgs &a, int64_t t, int E, const int (&tid)[KMAX],
                                           float (&tw)[KMAX]) {
    const int K = a.top_k;
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < KMAX; i++)
        if (i < K) sum += tw[i];
    float routed = sum;
    if (a.renormalize) {
        const float denom = sum + a.eps;
        const float rden = denom > 0.0f ? __frcp_rn(denom) : 1.0f;
        routed = 0.0f;
#pragma unroll
        for (int i = 0; i < KMAX; i++) {
            tw[i] *= rden;
            if (i < K) routed += tw[i];
        }
    }
    int32_t *ids = a.ids + t * a.ids_stride;
#pragma unroll
    for (int i = 0; i < KMAX; i++) {
        if (i < K) {
            ids[i] = tid[i];
            gate_put_weight<T>(a, t, i, a.apply_scaling ? tw[i] * a.scaling : tw[i]);
        }
    }
    const float shared_w = routed / a.scaling;
    for (int j = K; j < a.K; j++) {
        ids[j] = E + (j - K);
        gate_put_weight<T>(a, t, j, shared_w);
    }
}

/* The moe_gate policy (docs/moe_gate.md) for token t, computed by the whole warp from the row in global memory
 * (every lane calls it, convergent; lane `owner` stores): lane l holds the E / 32 contiguous
 * experts [l E / 32, (l + 1) E / 32), so a group is a run of lanes and team_group_kept and
 * team_max_u64 (the team kernel's exact path) apply with one 32-lane team. Invalid experts
 * (non-finite logit or bias) rank after every valid one and weigh 0; groups without a valid
 * expert rank last; k rounds of the warp max of the keys below the previous one; then the
 * common epilogue. One token costs the warp a row load and ~k + log2(G) shuffle rounds; a
 * lane computing the policy alone (k passes over E values) is slow enough that a single list
 * overflow in a call sets the call's time. */
template <typename T, int E, int G, int KMAX, mlaf_score_func SF>
__device__ __noinline__ void solo_exact_warp(const GateArgs a, int64_t t, int owner) {
    constexpr int NPL = E / 32; /* experts per lane */
    constexpr int P = E / G;
    static_assert(E % 32 == 0 && (G == 1 || (P % NPL == 0 && G * (P / NPL) <= 32)), "solo exact: shape");
    const int lane = threadIdx.x & 31, e0 = lane * NPL;
    const T *row = static_cast<const T *>(a.logits) + t * a.logits_stride;
    float c[NPL];
    float lm1 = kNegInf, lm2 = kNegInf;
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        const float x = mlaf_ld(row + e0 + i);
        const float b = a.bias ? a.bias[e0 + i] : 0.0f;
        c[i] = (isfinite(x) && isfinite(b)) ? score_traits<SF>::fast(x) + b : kNegInf;
        lm2 = fmaxf(lm2, fminf(lm1, c[i]));
        lm1 = fmaxf(lm1, c[i]);
    }
    const bool kept = team_group_kept<32>(a, lm1, lm2, G > 1 ? P / NPL : 32, lane, 0, kFull);
    int oid[KMAX];
    float ow[KMAX];
    unsigned long long prev = ~0ull;
#pragma unroll
    for (int r = 0; r < KMAX; r++) {
        oid[r] = 0;
        ow[r] = 0.0f;
        if (r >= a.top_k) continue; /* warp-uniform */
        unsigned long long best = 0ull;
        if (kept) {
#pragma unroll
            for (int i = 0; i < NPL; i++) {
                const unsigned long long kk = team_key(c[i], e0 + i);
                if (kk < prev && kk > best) best = kk;
            }
        }
        best = team_max_u64<32>(best, kFull);
        prev = best;
        const int e = (int)(0xffffffffu - (uint32_t)best);
        oid[r] = e;
        ow[r] = (uint32_t)(best >> 32) == kOrdNegInf ? 0.0f : score_traits<SF>::fast(mlaf_ld(row + e));
    }
    if (lane == owner) solo_store<T, KMAX>(a, t, E, oid, ow);
}

template <typename T, int E, int G, int VB, int KMAX, int F, mlaf_score_func SF>
__global__ void __launch_bounds__(kSoloWarps * 32)
moe_gate_solo_kernel(const GateArgs a) {
    mlaf_pdl_begin();
    using S = SoloShape<T, E, G, VB, F>;
    constexpr int P = S::P, U = S::U, EPC = S::EPC, NS = S::NS;
    constexpr bool RC = S::RC;
    using Sc = score_traits<SF>;
    static_assert(Sc::solo && !Sc::row_wise, "solo: a score its traits allow");
    constexpr bool FLT = Sc::filtered; /* rank by the filter, re-key the candidates */
    static_assert(!FLT || (G == 1 && !S::HF), "solo: filtered scores in one group, whole rows");
    constexpr int NCH = VB / EPC;               /* logits chunks per unit */
    constexpr int SEGB = S::kXBytes / NS;       /* bytes per row segment */
    extern __shared__ __align__(16) unsigned char ssmem[];
    float *bsm = reinterpret_cast<float *>(ssmem);
    const int lane = threadIdx.x & 31;
    const int wib = threadIdx.x >> 5;
    unsigned char *wbase = ssmem + S::kBiasBytes + wib * S::kWarpBytes;
    unsigned char *srow = wbase + lane * S::kRowBytes; /* this lane's row */
    const unsigned char *xrow = srow + S::kXOff;
    uint2 *list = reinterpret_cast<uint2 *>(wbase + S::kListOff) + lane; /* entry j: list[32 j] */
    const uint32_t bar0 = (uint32_t)__cvta_generic_to_shared(wbase + S::kBarOff);

    /* bias, padded per group; a non-finite bias sends every token to the exact path */
    int bias_bad = 0;
    float bmax = 0.0f; /* filtered scores: the largest |bias| (their margin) */
    for (int e = threadIdx.x; e < E; e += kSoloWarps * 32) {
        const float b = a.bias ? a.bias[e] : 0.0f;
        bsm[(e / P) * S::kBiasStride + e % P] = b;
        bias_bad |= !isfinite(b);
        bmax = fmaxf(bmax, fabsf(b));
    }
    __shared__ uint32_t s_bmax[kSoloWarps];
    if constexpr (FLT) {
        const uint32_t m = __reduce_max_sync(kFull, __float_as_uint(bmax)); /* >= 0: bits order */
        if (lane == 0) s_bmax[wib] = m;
    }
    if (lane == 0)
        for (int sg = 0; sg < NS; sg++) mlaf_bar_init(bar0 + 8 * sg, 32);
    const bool all_exact = __syncthreads_or(bias_bad) != 0;
    if constexpr (FLT) {
        bmax = 0.0f;
#pragma unroll
        for (int w = 0; w < kSoloWarps; w++) bmax = fmaxf(bmax, __uint_as_float(s_bmax[w]));
    }

    const unsigned char *logits = static_cast<const unsigned char *>(a.logits);
    const int64_t stride_b = a.logits_stride * (int64_t)sizeof(T);
    const int K = a.top_k;
    const int64_t ntiles = (a.T + 31) / 32;
    const int64_t tstep = (int64_t)gridDim.x * kSoloWarps;
    uint32_t parity = 0;
    for (int64_t tl = (int64_t)blockIdx.x * kSoloWarps + wib; tl < ntiles; tl += tstep, parity ^= 1u) {
        const int64_t t = tl * 32 + lane;
        const bool live = t < a.T;
        /* 0. staging, NS segments so pass 1 starts before the whole row has landed */
        __syncwarp(); /* every lane is done with the previous tile's list */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        mlaf_fence_async();
        {
            const unsigned char *src = logits + (live ? t : 0) * stride_b;
            const uint32_t dst = (uint32_t)__cvta_generic_to_shared(xrow);
#pragma unroll
            for (int sg = 0; sg < (S::HF ? 1 : NS); sg++) /* a lane past T arrives with no bytes */
                mlaf_bulk_load(dst + sg * SEGB, src + sg * SEGB, live ? SEGB : 0u, bar0 + 8 * sg);
        }
#else
        {
            /* 16-byte copies: the SCH chunks of a row segment go to consecutive lanes (whole
             * lines), chunk k of the tile's 32 x SCH to lane k % 32; rows land in their owners'
             * padded rows */
            constexpr int SCH = S::XC / NS;
            const int64_t t0 = tl * 32;
#pragma unroll
            for (int sg = 0; sg < (S::HF ? 1 : NS); sg++) {
#pragma unroll 4
                for (int i = 0; i < SCH; i++) {
                    const int k = lane + 32 * i, r = k / SCH, c = sg * SCH + k % SCH;
                    if (t0 + r < a.T)
                        cp_async(wbase + r * S::kRowBytes + S::kXOff + c * 16,
                                 logits + (t0 + r) * stride_b + c * 16, 16);
                }
                cp_async_commit();
            }
        }
#endif
        /* segment sg of every row of the tile has landed */
        auto seg_ready = [&](int sg) {
            if (S::HF && sg == 1) {
                /* the first half is in registers: the second half goes over it (every lane's
                 * reads of it before the copy, as at a tile's start) */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
                __syncwarp();
                mlaf_fence_async();
                mlaf_bulk_load((uint32_t)__cvta_generic_to_shared(xrow), logits + (live ? t : 0) * stride_b + SEGB,
                               live ? SEGB : 0u, bar0 + 8);
#else
                constexpr int SCH = S::XC / NS;
                const int64_t t0 = tl * 32;
                __syncwarp(); /* runs of lanes copy into other lanes' rows */
#pragma unroll 4
                for (int i = 0; i < SCH; i++) {
                    const int k = lane + 32 * i, r = k / SCH, c = k % SCH;
                    if (t0 + r < a.T)
                        cp_async(wbase + r * S::kRowBytes + S::kXOff + c * 16,
                                 logits + (t0 + r) * stride_b + SEGB + c * 16, 16);
                }
                cp_async_commit();
#endif
            }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            mlaf_bar_wait(bar0 + 8 * sg, parity);
#else
            if (!S::HF && NS - 1 - sg >= 1) cp_async_wait<1>(); /* half rows: one group in flight */
            else cp_async_wait<0>();
            __syncwarp();
#endif
        };

        /* 1. pass 1. A unit's loads are issued before the previous unit's stores (s in place,
         * its best two), which the compiler could not move them across. */
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}; /* four chains */
        uint4 xn[NCH];
        seg_ready(0);
#pragma unroll
        for (int j = 0; j < NCH; j++) xn[j] = *reinterpret_cast<const uint4 *>(xrow + j * 16);
#pragma unroll((F & kSoloUnroll2) ? 2 : 1)
        for (int u = 0; u < U; u++) {
            uint4 xr[NCH];
#pragma unroll
            for (int j = 0; j < NCH; j++) xr[j] = xn[j];
            const int g = (u * VB) / P;
            const float *bu = bsm + g * S::kBiasStride + (u * VB - g * P);
            float4 br[VB / 4];
#pragma unroll
            for (int q = 0; q < VB / 4; q++) br[q] = *reinterpret_cast<const float4 *>(bu + 4 * q);
            if (u + 1 < U) {
                if (NS > 1 && u + 1 == U / NS) seg_ready(1);
#pragma unroll
                for (int j = 0; j < NCH; j++)
                    xn[j] = *reinterpret_cast<const uint4 *>(
                        xrow + (((S::HF ? (u + 1) % (U / 2) : u + 1)) * NCH + j) * 16);
            }
            float a1 = kNegInf, a2 = kNegInf, b1 = kNegInf, b2 = kNegInf;
#pragma unroll
            for (int j = 0; j < NCH; j++) {
                const int c = u * NCH + j;
                const T *el = reinterpret_cast<const T *>(&xr[j]);
                float sv[EPC];
#pragma unroll
                for (int i = 0; i < EPC; i++) {
                    const float x = mlaf_elem<T>::load(el[i]);
                    acc[i & 3] = fmaf(x, 0.0f, acc[i & 3]);
                    sv[i] = Sc::filter(x);
                }
#pragma unroll
                for (int q = 0; q < EPC / 4; q++) {
                    if constexpr (!RC)
                        *reinterpret_cast<float4 *>(srow + (c * EPC + 4 * q) * 4) =
                            make_float4(sv[4 * q], sv[4 * q + 1], sv[4 * q + 2], sv[4 * q + 3]);
                    const float4 b4 = br[(j * EPC) / 4 + q];
                    const float cc[4] = {sv[4 * q] + b4.x, sv[4 * q + 1] + b4.y,
                                         sv[4 * q + 2] + b4.z, sv[4 * q + 3] + b4.w};
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        if ((j * (EPC / 4) + q) & 1) {
                            b2 = fmaxf(b2, fminf(b1, cc[i]));
                            b1 = fmaxf(b1, cc[i]);
                        } else {
                            a2 = fmaxf(a2, fminf(a1, cc[i]));
                            a1 = fmaxf(a1, cc[i]);
                        }
                    }
                }
            }
            const float m1 = fmaxf(a1, b1), m2 = fmaxf(fminf(a1, b1), fmaxf(a2, b2));
            list[32 * u] = make_uint2(__float_as_uint(m1), __float_as_uint(m2));
        }
        if constexpr ((F & kSoloPrefetch) != 0) {
            const int64_t tn = (tl + tstep) * 32 + lane;
            if (tn < a.T) mlaf_prefetch_l2(logits + tn * stride_b, (uint32_t)S::kXBytes);
        }
        const float accs = (acc[0] + acc[1]) + (acc[2] + acc[3]);
        bool exact = all_exact || accs != accs;

        int tid[KMAX];
        float tw[KMAX];
        const unsigned char *grow = logits + (live ? t : 0) * stride_b; /* this token's row */
        (void)grow;
        if (live && !exact) {
            /* 2. groups; 3. threshold */
            float tv[2 * U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const uint2 p = list[32 * u];
                tv[2 * u] = __uint_as_float(p.x);
                tv[2 * u + 1] = __uint_as_float(p.y);
            }
            uint32_t kept = 1u;
            if constexpr (G > 1) {
                float gs[G];
#pragma unroll
                for (int g = 0; g < G; g++) {
                    float g1 = tv[2 * g * S::UG], g2 = tv[2 * g * S::UG + 1];
#pragma unroll
                    for (int q = 1; q < S::UG; q++) {
                        const float o1 = tv[2 * (g * S::UG + q)], o2 = tv[2 * (g * S::UG + q) + 1];
                        g2 = fmaxf(fminf(g1, o1), fmaxf(g2, o2));
                        g1 = fmaxf(g1, o1);
                    }
                    gs[g] = a.group_max ? g1 : g1 + g2;
                }
                kept = 0u;
#pragma unroll
                for (int g = 0; g < G; g++) {
                    int better = 0;
#pragma unroll
                    for (int h = 0; h < G; h++) better += gs[h] > gs[g] || (gs[h] == gs[g] && h < g);
                    if (better < a.topk_group) kept |= 1u << g;
                }
#pragma unroll
                for (int u = 0; u < U; u++)
                    if (!((kept >> (u / S::UG)) & 1u)) tv[2 * u] = tv[2 * u + 1] = kNegInf;
            }
            float tau = solo_kth<2 * U, KMAX>(tv, K);
            if constexpr (FLT) tau -= Sc::margin(tau, bmax);

            /* 4. pass 2: candidates of kept groups, ascending expert index. Entries past the
             * list (heavy ties) are counted, not stored: the token then takes the exact path. */
            int n = 0;
            auto quad = [&](const float (&sq)[4], const float4 b4, int e0) {
                const float cc[4] = {sq[0] + b4.x, sq[1] + b4.y, sq[2] + b4.z, sq[3] + b4.w};
                int o = n;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const bool p = cc[i] >= tau;
                    if (p && o < S::kCap) list[32 * o] = make_uint2(__float_as_uint(cc[i]), (uint32_t)(e0 + i));
                    o += p;
                }
                n = o;
            };
            if constexpr (FLT) {
                /* one group: only the units whose best key reaches tau (each lane its own,
                 * ascending), read from their pass-1 entries before the list is overwritten */
                uint32_t um = 0u;
#pragma unroll
                for (int u = 0; u < U; u++) um |= (__uint_as_float(list[32 * u].x) >= tau ? 1u : 0u) << u;
                constexpr int NBU = VB / 4; /* quads of a unit */
#pragma unroll 1
                for (; um; um &= um - 1u) {
                    const int eb = (__ffs(um) - 1) * VB;
                    float4 br[NBU];
#pragma unroll
                    for (int j = 0; j < NBU; j++) br[j] = *reinterpret_cast<const float4 *>(bsm + eb + 4 * j);
                    if constexpr (RC) {
                        uint4 xr[NCH];
#pragma unroll
                        for (int j = 0; j < NCH; j++)
                            xr[j] = *reinterpret_cast<const uint4 *>(xrow + eb * (int)sizeof(T) + j * 16);
                        const T *el = reinterpret_cast<const T *>(xr);
#pragma unroll
                        for (int j = 0; j < NBU; j++) {
                            float sq[4];
#pragma unroll
                            for (int i = 0; i < 4; i++) sq[i] = Sc::filter(mlaf_elem<T>::load(el[4 * j + i]));
                            quad(sq, br[j], eb + 4 * j);
                        }
                    } else {
                        float4 sr[NBU];
#pragma unroll
                        for (int j = 0; j < NBU; j++) sr[j] = *reinterpret_cast<const float4 *>(srow + (eb + 4 * j) * 4);
#pragma unroll
                        for (int j = 0; j < NBU; j++) {
                            const float sq[4] = {sr[j].x, sr[j].y, sr[j].z, sr[j].w};
                            quad(sq, br[j], eb + 4 * j);
                        }
                    }
                }
            }
            uint32_t km = kept;
            const int passes = FLT ? 0 : G > 1 ? a.topk_group : 1;
            for (int it = 0; it < passes; it++) {
                const int g = __ffs(km) - 1;
                km &= km - 1;
                const float *bg = bsm + g * S::kBiasStride;
                /* eight chunks at a time, all loaded before the first list store */
                constexpr int NQ = P / 4;                 /* quads of the group */
                constexpr int NB = NQ < 8 ? NQ : 8;
#pragma unroll 1
                for (int j0 = 0; j0 < NQ; j0 += NB) {
                    float4 br[NB];
#pragma unroll
                    for (int j = 0; j < NB; j++) br[j] = *reinterpret_cast<const float4 *>(bg + 4 * (j0 + j));
                    if constexpr (RC) {
                        /* the quads' logits: NB quads = NB * 4 / EPC chunks */
                        static_assert((NB * 4) % EPC == 0, "solo: quads per chunk");
                        uint4 xr[NB * 4 / EPC];
                        const int eb = g * P + 4 * j0; /* first expert of these quads */
                        const unsigned char *xq = xrow + eb * (int)sizeof(T);
                        if constexpr (S::HF) /* first-half logits from global memory */
                            xq = eb >= E / 2 ? xrow + (eb - E / 2) * (int)sizeof(T) : grow + eb * (int)sizeof(T);
#pragma unroll
                        for (int j = 0; j < NB * 4 / EPC; j++)
                            xr[j] = *reinterpret_cast<const uint4 *>(xq + j * 16);
                        const T *el = reinterpret_cast<const T *>(xr);
#pragma unroll
                        for (int j = 0; j < NB; j++) {
                            float sq[4];
#pragma unroll
                            for (int i = 0; i < 4; i++) sq[i] = Sc::filter(mlaf_elem<T>::load(el[4 * j + i]));
                            quad(sq, br[j], g * P + 4 * (j0 + j));
                        }
                    } else {
                        float4 sr[NB];
#pragma unroll
                        for (int j = 0; j < NB; j++)
                            sr[j] = *reinterpret_cast<const float4 *>(srow + (g * P + 4 * (j0 + j)) * 4);
#pragma unroll
                        for (int j = 0; j < NB; j++) {
                            const float sq[4] = {sr[j].x, sr[j].y, sr[j].z, sr[j].w};
                            quad(sq, br[j], g * P + 4 * (j0 + j));
                        }
                    }
                }
            }
            exact = n > S::kCap;
            /* the candidates' exact keys (their logits in flight together) */
            auto logit_at = [&](int e) {
                return mlaf_elem<T>::load(*reinterpret_cast<const T *>((RC ? xrow : grow) + e * (int)sizeof(T)));
            };
            if constexpr (FLT) {
                if (!exact) {
                    float xc[S::kCap];
#pragma unroll
                    for (int j = 0; j < S::kCap; j++) xc[j] = j < n ? logit_at((int)list[32 * j].y) : 0.0f;
#pragma unroll
                    for (int j = 0; j < S::kCap; j++) {
                        if (j < n) {
                            const int e = (int)list[32 * j].y;
                            list[32 * j].x = __float_as_uint(Sc::fast(xc[j]) + bsm[e]);
                        }
                    }
                }
            }
            if (!exact) {
                /* 5. sorted insertion; candidates come in ascending index */
                float sv[KMAX];
#pragma unroll
                for (int i = 0; i < KMAX; i++) {
                    sv[i] = kNegInf;
                    tid[i] = 0;
                }
                for (int j = 0; j < n; j++) {
                    const uint2 p = list[32 * j];
                    const float x = __uint_as_float(p.x);
                    const int e = (int)p.y;
#pragma unroll
                    for (int i = KMAX - 1; i > 0; i--) {
                        const bool gt = x > sv[i], gtp = x > sv[i - 1];
                        tid[i] = gtp ? tid[i - 1] : (gt ? e : tid[i]);
                        sv[i] = gtp ? sv[i - 1] : (gt ? x : sv[i]);
                    }
                    if (x > sv[0]) {
                        tid[0] = e;
                        sv[0] = x;
                    }
                }
#pragma unroll
                for (int i = 0; i < KMAX; i++) {
                    const int e = tid[i];
                    if constexpr (FLT)
                        tw[i] = Sc::fast(logit_at(e));
                    else if constexpr (S::HF)
                        tw[i] = Sc::fast(mlaf_elem<T>::load(*reinterpret_cast<const T *>(
                            e >= E / 2 ? xrow + (e - E / 2) * (int)sizeof(T) : grow + e * (int)sizeof(T))));
                    else if constexpr (RC)
                        tw[i] = Sc::fast(mlaf_elem<T>::load(*reinterpret_cast<const T *>(xrow + e * (int)sizeof(T))));
                    else
                        tw[i] = *reinterpret_cast<const float *>(srow + e * 4);
                }
            }
        }
        if (live && !exact) solo_store<T, KMAX>(a, t, E, tid, tw);
        /* the tile's exact tokens, one at a time by the whole warp */
        for (unsigned em = __ballot_sync(kFull, live && exact); em; em &= em - 1) {
            const int l = __ffs(em) - 1;
            solo_exact_warp<T, E, G, KMAX, SF>(a, tl * 32 + l, l);
        }
    }
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ < 900
    cp_async_wait<0>(); /* no copy outlives the block */
#endif
}

template <typename T, int E, int G, int VB, int KMAX, int F, mlaf_score_func SF> int solo_blocks_per_sm() {
    static std::atomic<int> cached{0};
    int v = cached.load(std::memory_order_relaxed);
    if (v == 0) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                &v, moe_gate_solo_kernel<T, E, G, VB, KMAX, F, SF>, kSoloWarps * 32,
                SoloShape<T, E, G, VB, F>::kSmemBytes) != cudaSuccess ||
            v < 1) {
            (void)cudaGetLastError();
            v = 1;
        }
        cached.store(v, std::memory_order_relaxed);
    }
    return v;
}

template <typename T, int E, int G, int VB, int KMAX, int F, mlaf_score_func SF>
void launch_solo(const GateArgs &a, int sm_count, cudaStream_t stream) {
    using S = SoloShape<T, E, G, VB, F>;
    static_assert(S::kSmemBytes <= 227 * 1024, "solo kernel shared memory");
    if (S::kSmemBytes > 48 * 1024)
        (void)cudaFuncSetAttribute(moe_gate_solo_kernel<T, E, G, VB, KMAX, F, SF>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmemBytes);
    const int64_t tiles = (a.T + 31) / 32;
    const int64_t want = (tiles + kSoloWarps - 1) / kSoloWarps;
    const int64_t cap = (int64_t)(sm_count > 0 ? sm_count : 1) * solo_blocks_per_sm<T, E, G, VB, KMAX, F, SF>();
    const int blocks = (int)(want < cap ? want : cap);
    mlaf_launch(moe_gate_solo_kernel<T, E, G, VB, KMAX, F, SF>,
        blocks, kSoloWarps * 32, S::kSmemBytes, stream, a);
}

/* Whether the solo kernel (E, G experts / groups, units of VB, KMAX) can run call a (of the
 * score the shape was compiled for). */
template <typename T>
inline bool solo_fits(const GateArgs &a, int E, int G, int VB, int KMAX) {
    if (a.E != E || a.n_group != G || a.scores || a.top_k > KMAX) return false;
    const int units_kept = G > 1 ? a.topk_group * (E / G / VB) : E / VB;
    if (a.top_k > 2 * units_kept) return false;
    return fast_copy_unit<T>(a) == 16;
}

/* The prefill router for the shapes compiled here, each for one score; false: the caller picks
 * another kernel. */
template <typename T, mlaf_score_func SF>
bool try_solo(const GateArgs &a, int sm_count, cudaStream_t stream) {
    /* Pass 1 unrolled by two units everywhere; DeepSeek-V3 with 2-byte logits recomputes s in
     * pass 2 (twice the resident warps). */
    constexpr int kHalf = sizeof(T) == 2 ? kSoloRecompute : 0;
#define MLAF_SOLO(SF_, E_, G_, VB_, KM_, F_)                                                      \
    if constexpr (SF == (SF_)) {                                                                  \
        if (solo_fits<T>(a, E_, G_, VB_, KM_)) {                                                  \
            launch_solo<T, E_, G_, VB_, KM_, F_, SF>(a, sm_count, stream);                        \
            return true;                                                                          \
        }                                                                                         \
    }
    /* DeepSeek-V3 / R1 with 2-byte logits from 49152 tokens: half-row slots (16 resident warps
     * per SM instead of 10); below that T they lose, and so do f32 rows at every T but 32768. */
    if constexpr (sizeof(T) == 2) {
        if (a.T >= 49152) { MLAF_SOLO(MLAF_SCORE_SIGMOID, 256, 8, 16, 8, kSoloUnroll2 | kSoloRecompute | kSoloHalf) }
    }
    /* DeepSeek-V3 / R1: rows with one copy each */
    MLAF_SOLO(MLAF_SCORE_SIGMOID, 256, 8, 16, 8, kSoloUnroll2 | kHalf | kSoloOneSeg)
    /* GLM-4.7-Flash: one copy per row, not two */
    MLAF_SOLO(MLAF_SCORE_SIGMOID, 64, 1, 8, 4, kSoloUnroll2 | kSoloOneSeg)
    /* DeepSeek-V4: sqrt_softplus, one group of 256 */
    MLAF_SOLO(MLAF_SCORE_SQRT_SOFTPLUS, 256, 1, 16, 8, kSoloUnroll2 | kHalf | kSoloOneSeg)
#undef MLAF_SOLO
    return false;
}

} // namespace
