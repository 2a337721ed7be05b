/*
 * moe_gate_pair.cuh — v6, a prefill router kernel with two lanes per token (dev/ only: included
 * by moe_gate_bench.cu after src/cuda/moe_gate.cu; uses the solo kernel's flags, solo_sort_run
 * and solo_exact_warp). Measured on the H200 and not shipped: see dev/moe_gate/README.md.
 *
 * The solo kernel gives a lane a whole token. Its rows are staged in shared memory (1 KB per
 * f32 DeepSeek-V3 token), so an SM holds six of its 32-token warps, and each lane's chain of
 * ~6000 instructions runs at about 0.4 instructions per cycle per scheduler (ncu: 3.4 cycles
 * per issued instruction). Here lanes 2i and 2i + 1 share token i of a 16-token tile, each
 * with half of its experts: the same bytes per SM hold twice the warps, and each lane's chain
 * is half as long. What the halves must agree on goes through shuffles with the partner lane:
 *   0. Each lane stages its half row (one bulk copy per segment on sm_90, as in solo).
 *   1. Pass 1 over the lane's units (solo's code): s in place, each unit's best two c.
 *   2. Groups (G > 1, G even, whole groups per half): the lane's G/2 group scores are swapped
 *      with the partner's; both lanes rank all G the same way.
 *   3. Threshold: each lane sorts its kept units' best-two values and keeps the top KMAX;
 *      the partner's top KMAX folded in (max(a_i, b_{KMAX-1-i}) is the top KMAX of the union)
 *      and sorted gives the same tau in both lanes.
 *   4. Pass 2 over the lane's kept groups: c >= tau into the lane's list.
 *   5. Each lane's sorted top KMAX; a winner's rank is its place in its own list plus the
 *      partner's entries ahead of it (on equal c the lower expert index, i.e. half 0, first).
 *      Each lane stores its own winners at their ranks; sums for renormalization are the two
 *      halves' sums added (the same in both lanes).
 * Pass 2 is balanced: with groups (G > 1) the kept groups, in ascending order, are dealt to the
 * pair, the first half of them to the even lane, whichever half row they live in (the partner's
 * row is read from shared memory after a __syncwarp), so the even lane's candidates all have
 * the lower indices. Without groups each lane scans its own half.
 * A non-finite logit or bias in either half, or a list overflow in either lane, sends the token
 * to solo_exact_warp (the whole warp, the pair's even lane stores).
 */

constexpr int kPairWarps = 2;
/* Variant flags (with solo's kSoloRecompute, kSoloOneSeg, kSoloUnroll2), and F / kPairMinb =
 * the resident blocks per SM the register allocation must allow (0: as many as the shared
 * memory allows, at most 8). */
constexpr int kPairMinb = 16;

template <typename T, int E, int G, int VB, int F = 0> struct PairShape {
    static constexpr bool RC = (F & kSoloRecompute) != 0;
    static constexpr int EH = E / 2;                       /* experts per lane */
    static constexpr int P = E / G;                        /* experts per group */
    static constexpr int PH = P < EH ? P : EH;             /* experts of a group in one half */
    static constexpr int GH = EH / PH;                     /* (half-)groups per lane */
    static constexpr int UH = EH / VB;                     /* units per lane */
    static constexpr int UG = PH / VB;                     /* units per (half-)group */
    static constexpr int EPC = 16 / (int)sizeof(T);        /* logits per 16-byte chunk */
    static constexpr int XC = EH / EPC;                    /* chunks per half row */
    static constexpr int kXBytes = EH * (int)sizeof(T);    /* logits per half row */
    static constexpr int kRowBytes = (RC ? kXBytes : EH * 4) + 16;
    static constexpr int kXOff = kRowBytes - 16 - kXBytes;
    static constexpr int NS = (F & kSoloOneSeg) == 0 && UH % 2 == 0 && XC % 2 == 0 ? 2 : 1;
    static constexpr int kCap = E / VB < 8 ? 8 : E / VB;   /* list entries per lane */
    static constexpr int NQ = PH / 4;                      /* quads per (half-)group */
    static constexpr int NB = NQ < 8 ? NQ : 8;             /* quads per pass-2 batch */
    static constexpr int kBarOff = 32 * kRowBytes;
    static constexpr int kListOff = kBarOff + 16;
    static constexpr int kWarpBytes = kListOff + kCap * 8 * 32;
    static constexpr int kBiasStride = PH + 4;             /* floats per (half-)group */
    static constexpr int kBiasBytes = (2 * GH * kBiasStride * 4 + 15) / 16 * 16;
    static constexpr int kSmemBytes = kBiasBytes + kPairWarps * kWarpBytes;
    static constexpr int kBySmem = 233472 / (kSmemBytes + 1024); /* 228 KB per SM, 1 KB per block */
    static constexpr int kMinb = F / kPairMinb > 0 ? F / kPairMinb : kBySmem < 8 ? kBySmem : 8;
    static_assert(E % 2 == 0 && E % G == 0 && (G == 1 || (G % 2 == 0 && EH % P == 0)), "pair: groups per half");
    static_assert(EH % VB == 0 && PH % VB == 0 && VB % EPC == 0 && PH % 4 == 0, "pair shape");
    static_assert(RC || sizeof(T) == 4 || (EH * 2) % 16 == 0, "pair: row layout");
    static_assert(((kRowBytes / 16) & 1) == 1, "pair: odd row stride in 16-byte units");
    static_assert(XC % NS == 0 && UH % NS == 0, "pair: staging segments");
    static_assert(kCap >= UH, "pair: the units' best two share the list");
};

/* v[0, KS) = the KS largest of v, sorted descending (solo_kth without the pick). */
template <int N, int KS>
__device__ __forceinline__ void pair_top(float (&v)[N]) {
    static_assert((KS & (KS - 1)) == 0 && N % KS == 0 && ((N / KS) & (N / KS - 1)) == 0, "pair_top");
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
}

template <typename T, int E, int G, int VB, int KMAX, int F>
__global__ void __launch_bounds__(kPairWarps * 32, (PairShape<T, E, G, VB, F>::kMinb))
moe_gate_pair_kernel(const GateArgs a) {
    using S = PairShape<T, E, G, VB, F>;
    constexpr int PH = S::PH, GH = S::GH, UH = S::UH, EH = S::EH, EPC = S::EPC, NS = S::NS;
    constexpr bool RC = S::RC;
    constexpr int NCH = VB / EPC;          /* logits chunks per unit */
    constexpr int SEGB = S::kXBytes / NS;  /* bytes per half-row segment */
    extern __shared__ __align__(16) unsigned char psmem[];
    float *bsm = reinterpret_cast<float *>(psmem); /* bias of (half-)group q at q * kBiasStride */
    const int lane = threadIdx.x & 31, h = lane & 1;
    const int wib = threadIdx.x >> 5;
    unsigned char *wbase = psmem + S::kBiasBytes + wib * S::kWarpBytes;
    unsigned char *srow = wbase + lane * S::kRowBytes; /* this lane's half row */
    const unsigned char *xrow = srow + S::kXOff;
    uint2 *const list = reinterpret_cast<uint2 *>(wbase + S::kListOff) + lane; /* entry j: list[32 j] */
    unsigned char *const prow = wbase + (lane & ~1) * S::kRowBytes; /* the pair's even half row */
    const uint32_t bar0 = (uint32_t)__cvta_generic_to_shared(wbase + S::kBarOff);
    const float *const bhalf = bsm + h * GH * S::kBiasStride; /* the lane's (half-)groups */

    int bias_bad = 0;
    for (int e = threadIdx.x; e < E; e += kPairWarps * 32) {
        const float b = a.bias ? a.bias[e] : 0.0f;
        bsm[(e / PH) * S::kBiasStride + e % PH] = b;
        bias_bad |= !isfinite(b);
    }
    if (lane == 0)
        for (int sg = 0; sg < NS; sg++) mlaf_bar_init(bar0 + 8 * sg, 32);
    const bool all_exact = __syncthreads_or(bias_bad) != 0;

    const unsigned char *logits = static_cast<const unsigned char *>(a.logits);
    const int64_t stride_b = a.logits_stride * (int64_t)sizeof(T);
    const int K = a.top_k;
    const int64_t ntiles = (a.T + 15) / 16;
    const int64_t tstep = (int64_t)gridDim.x * kPairWarps;
    uint32_t parity = 0;
    for (int64_t tl = (int64_t)blockIdx.x * kPairWarps + wib; tl < ntiles; tl += tstep, parity ^= 1u) {
        const int64_t t = tl * 16 + (lane >> 1);
        const bool live = t < a.T;
        __syncwarp(); /* every lane is done with the previous tile's row and list */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        mlaf_fence_async();
        {
            const unsigned char *src = logits + (live ? t : 0) * stride_b + h * S::kXBytes;
            const uint32_t dst = (uint32_t)__cvta_generic_to_shared(xrow);
#pragma unroll
            for (int sg = 0; sg < NS; sg++)
                mlaf_bulk_load(dst + sg * SEGB, src + sg * SEGB, live ? SEGB : 0u, bar0 + 8 * sg);
        }
#else
        {
            /* 16-byte copies, consecutive lanes on a half row's chunks; half row r belongs to
             * lane r */
            constexpr int SCH = S::XC / NS;
            const int64_t t0 = tl * 16;
#pragma unroll
            for (int sg = 0; sg < NS; sg++) {
#pragma unroll 4
                for (int i = 0; i < SCH; i++) {
                    const int k = lane + 32 * i, r = k / SCH, c = sg * SCH + k % SCH;
                    if (t0 + r / 2 < a.T)
                        cp_async(wbase + r * S::kRowBytes + S::kXOff + c * 16,
                                 logits + (t0 + r / 2) * stride_b + (r & 1) * S::kXBytes + c * 16, 16);
                }
                cp_async_commit();
            }
        }
#endif
        auto seg_ready = [&](int sg) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            mlaf_bar_wait(bar0 + 8 * sg, parity);
#else
            if (NS - 1 - sg >= 1) cp_async_wait<1>();
            else cp_async_wait<0>();
            __syncwarp();
#endif
        };

        /* 1. pass 1 over the lane's UH units (solo's loop); each unit's best two to the list */
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        uint4 xn[NCH];
        seg_ready(0);
#pragma unroll
        for (int j = 0; j < NCH; j++) xn[j] = *reinterpret_cast<const uint4 *>(xrow + j * 16);
#pragma unroll((F & kSoloUnroll2) ? 2 : 1)
        for (int u = 0; u < UH; u++) {
            uint4 xr[NCH];
#pragma unroll
            for (int j = 0; j < NCH; j++) xr[j] = xn[j];
            const float *bu = bhalf + ((u * VB) / PH) * S::kBiasStride + (u * VB) % PH;
            float4 br[VB / 4];
#pragma unroll
            for (int q = 0; q < VB / 4; q++) br[q] = *reinterpret_cast<const float4 *>(bu + 4 * q);
            if (u + 1 < UH) {
                if (NS > 1 && u + 1 == UH / NS) seg_ready(1);
#pragma unroll
                for (int j = 0; j < NCH; j++)
                    xn[j] = *reinterpret_cast<const uint4 *>(xrow + ((u + 1) * NCH + j) * 16);
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
                    sv[i] = sigmoid_fast(x);
                }
#pragma unroll
                for (int q = 0; q < EPC / 4; q++) {
                    if constexpr (!RC)
                        *reinterpret_cast<float4 *>(srow + (c * EPC + 4 * q) * 4) =
                            make_float4(sv[4 * q], sv[4 * q + 1], sv[4 * q + 2], sv[4 * q + 3]);
                    const float4 b4 = br[(j * EPC) / 4 + q];
                    const float cc[4] = {sv[4 * q] + b4.x, sv[4 * q + 1] + b4.y, sv[4 * q + 2] + b4.z,
                                         sv[4 * q + 3] + b4.w};
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
        float tv[2 * UH];
#pragma unroll
        for (int u = 0; u < UH; u++) {
            const uint2 p = list[32 * u];
            tv[2 * u] = __uint_as_float(p.x);
            tv[2 * u + 1] = __uint_as_float(p.y);
        }
        const float accs = (acc[0] + acc[1]) + (acc[2] + acc[3]);
        bool exact = all_exact || accs != accs;
        exact = __shfl_xor_sync(kFull, (int)exact, 1) != 0 || exact;

        /* 2. groups: the lane's GH scores, the partner's, all G ranked alike in both lanes */
        uint32_t kept_own = (1u << GH) - 1u; /* the lane's (half-)groups that are kept */
        uint32_t kept = 1u;
        if constexpr (G > 1) {
            float go[GH];
#pragma unroll
            for (int q = 0; q < GH; q++) {
                float g1 = tv[2 * q * S::UG], g2 = tv[2 * q * S::UG + 1];
#pragma unroll
                for (int r = 1; r < S::UG; r++) {
                    const float o1 = tv[2 * (q * S::UG + r)], o2 = tv[2 * (q * S::UG + r) + 1];
                    g2 = fmaxf(fminf(g1, o1), fmaxf(g2, o2));
                    g1 = fmaxf(g1, o1);
                }
                go[q] = a.group_max ? g1 : g1 + g2;
            }
            float gs[G];
#pragma unroll
            for (int q = 0; q < GH; q++) {
                const float gp = __shfl_xor_sync(kFull, go[q], 1);
                gs[q] = h ? gp : go[q];
                gs[GH + q] = h ? go[q] : gp;
            }
            kept = 0u;
#pragma unroll
            for (int g = 0; g < G; g++) {
                int better = 0;
#pragma unroll
                for (int q = 0; q < G; q++) better += gs[q] > gs[g] || (gs[q] == gs[g] && q < g);
                if (better < a.topk_group) kept |= 1u << g;
            }
            kept_own = (kept >> (h * GH)) & ((1u << GH) - 1u);
#pragma unroll
            for (int u = 0; u < UH; u++)
                if (!((kept_own >> (u / S::UG)) & 1u)) tv[2 * u] = tv[2 * u + 1] = kNegInf;
        }

        /* 3. threshold: both lanes fold the same two sorted top-KMAX lists */
        pair_top<2 * UH, KMAX>(tv);
        float tau;
        {
            float f[KMAX]; /* bitonic: own top KMAX against the partner's reversed */
#pragma unroll
            for (int i = 0; i < KMAX; i++) f[i] = fmaxf(tv[i], __shfl_xor_sync(kFull, tv[KMAX - 1 - i], 1));
#pragma unroll
            for (int j = KMAX / 2; j > 0; j >>= 1) {
#pragma unroll
                for (int i = 0; i < KMAX; i++) {
                    const int l = i ^ j;
                    if (l > i) {
                        const float x = f[i], y = f[l];
                        f[i] = fmaxf(x, y);
                        f[l] = fminf(x, y);
                    }
                }
            }
            tau = f[0]; /* f[K - 1] without an indexed load */
#pragma unroll
            for (int i = 1; i < KMAX; i++) tau = fminf(tau, i < K ? f[i] : f[0]);
        }

        /* 4. pass 2, ascending expert index: G > 1, the lane's share of the kept groups (the
         * even lane the first half), read from whichever half row holds them; else the lane's
         * own half */
        __syncwarp(); /* the partner's s (pass 1) is visible */
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
        uint32_t km = kept;
        int passes = 1;
        if constexpr (G > 1) {
            const int first = (a.topk_group + 1) / 2; /* kept groups of the even lane */
            if (h) {
#pragma unroll 1
                for (int i = 0; i < first; i++) km &= km - 1;
                passes = a.topk_group - first;
            } else {
                passes = first;
            }
        }
#pragma unroll 1
        for (int it = 0; it < passes; it++) {
            const int g = G > 1 ? __ffs(km) - 1 : h; /* G == 1: the lane's half */
            km &= km - 1;
            const float *bg = bsm + g * S::kBiasStride;
            const int e_base = g * PH; /* global index of the (half-)group's first expert */
            const unsigned char *grow = prow + (g / GH) * S::kRowBytes; /* its half row */
            const int off = (g % GH) * PH;                              /* its place there */
#pragma unroll 1
            for (int j0 = 0; j0 < S::NQ; j0 += S::NB) {
                constexpr int NB = S::NB;
                float4 br[NB];
#pragma unroll
                for (int j = 0; j < NB; j++) br[j] = *reinterpret_cast<const float4 *>(bg + 4 * (j0 + j));
                if constexpr (RC) {
                    static_assert((NB * 4) % EPC == 0, "pair: quads per chunk");
                    uint4 xr[NB * 4 / EPC];
#pragma unroll
                    for (int j = 0; j < NB * 4 / EPC; j++)
                        xr[j] = *reinterpret_cast<const uint4 *>(grow + S::kXOff + (off + 4 * j0) * (int)sizeof(T) +
                                                                 j * 16);
                    const T *el = reinterpret_cast<const T *>(xr);
#pragma unroll
                    for (int j = 0; j < NB; j++) {
                        float sq[4];
#pragma unroll
                        for (int i = 0; i < 4; i++) sq[i] = sigmoid_fast(mlaf_elem<T>::load(el[4 * j + i]));
                        quad(sq, br[j], e_base + 4 * (j0 + j));
                    }
                } else {
                    float4 sr[NB];
#pragma unroll
                    for (int j = 0; j < NB; j++)
                        sr[j] = *reinterpret_cast<const float4 *>(grow + (off + 4 * (j0 + j)) * 4);
#pragma unroll
                    for (int j = 0; j < NB; j++) {
                        const float sq[4] = {sr[j].x, sr[j].y, sr[j].z, sr[j].w};
                        quad(sq, br[j], e_base + 4 * (j0 + j));
                    }
                }
            }
        }
        exact = exact || n > S::kCap;
        exact = __shfl_xor_sync(kFull, (int)exact, 1) != 0 || exact;

        /* 5. the lane's sorted top KMAX; strict > keeps the lower index ahead */
        float sv[KMAX], tw[KMAX];
        int tid[KMAX];
#pragma unroll
        for (int i = 0; i < KMAX; i++) {
            sv[i] = kNegInf;
            tw[i] = 0.0f;
            tid[i] = 0;
        }
        if (!exact) {
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
                const unsigned char *er = prow + (e / EH) * S::kRowBytes; /* e's half row */
                const int el = e % EH;
                if (sv[i] != kNegInf) {
                    if constexpr (RC)
                        tw[i] = sigmoid_fast(mlaf_elem<T>::load(*reinterpret_cast<const T *>(er + S::kXOff + el * (int)sizeof(T))));
                    else
                        tw[i] = *reinterpret_cast<const float *>(er + el * 4);
                }
            }
        }

        /* ranks: own place + the partner's entries ahead (half 0 wins ties: lower indices) */
        int rank[KMAX];
#pragma unroll
        for (int i = 0; i < KMAX; i++) rank[i] = i;
#pragma unroll
        for (int j = 0; j < KMAX; j++) {
            const float pj = __shfl_xor_sync(kFull, sv[j], 1);
#pragma unroll
            for (int i = 0; i < KMAX; i++) rank[i] += h ? (pj >= sv[i]) : (pj > sv[i]);
        }
        float own = 0.0f;
#pragma unroll
        for (int i = 0; i < KMAX; i++)
            if (rank[i] < K) own += tw[i];
        const float oth = __shfl_xor_sync(kFull, own, 1);
        const float sum = h ? oth + own : own + oth;
        float routed = sum;
        if (a.renormalize) {
            const float denom = sum + a.eps;
            const float rden = denom > 0.0f ? __frcp_rn(denom) : 1.0f;
            float r = 0.0f;
#pragma unroll
            for (int i = 0; i < KMAX; i++) {
                tw[i] *= rden;
                if (rank[i] < K) r += tw[i];
            }
            const float ro = __shfl_xor_sync(kFull, r, 1);
            routed = h ? ro + r : r + ro;
        }
        if (live && !exact) {
            int32_t *ids = a.ids + t * a.ids_stride;
#pragma unroll
            for (int i = 0; i < KMAX; i++) {
                if (rank[i] < K) {
                    ids[rank[i]] = tid[i];
                    gate_put_weight<T>(a, t, rank[i], a.apply_scaling ? tw[i] * a.scaling : tw[i]);
                }
            }
            if (h == 0) {
                const float shared_w = routed / a.scaling;
                for (int j = K; j < a.K; j++) {
                    ids[j] = E + (j - K);
                    gate_put_weight<T>(a, t, j, shared_w);
                }
            }
        }
        for (unsigned em = __ballot_sync(kFull, live && exact && h == 0); em; em &= em - 1) {
            const int l = __ffs(em) - 1;
            solo_exact_warp<T, E, G, KMAX, MLAF_SCORE_SIGMOID>(a, tl * 16 + (l >> 1), l);
        }
    }
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ < 900
    cp_async_wait<0>();
#endif
}

template <typename T, int E, int G, int VB, int KMAX, int F> int pair_blocks_per_sm() {
    static std::atomic<int> cached{0};
    int v = cached.load(std::memory_order_relaxed);
    if (v == 0) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, moe_gate_pair_kernel<T, E, G, VB, KMAX, F>,
                                                          kPairWarps * 32, PairShape<T, E, G, VB, F>::kSmemBytes) !=
                cudaSuccess ||
            v < 1) {
            (void)cudaGetLastError();
            v = 1;
        }
        cached.store(v, std::memory_order_relaxed);
    }
    return v;
}

template <typename T, int E, int G, int VB, int KMAX, int F = 0>
void launch_pair(const GateArgs &a, int sm_count, cudaStream_t stream) {
    using S = PairShape<T, E, G, VB, F>;
    static_assert(S::kSmemBytes <= 227 * 1024, "pair kernel shared memory");
    if (S::kSmemBytes > 48 * 1024)
        (void)cudaFuncSetAttribute(moe_gate_pair_kernel<T, E, G, VB, KMAX, F>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmemBytes);
    const int64_t tiles = (a.T + 15) / 16;
    const int64_t want = (tiles + kPairWarps - 1) / kPairWarps;
    const int64_t cap = (int64_t)(sm_count > 0 ? sm_count : 1) * pair_blocks_per_sm<T, E, G, VB, KMAX, F>();
    const int blocks = (int)(want < cap ? want : cap);
    moe_gate_pair_kernel<T, E, G, VB, KMAX, F><<<blocks, kPairWarps * 32, S::kSmemBytes, stream>>>(a);
}
