/*
 * moe_gate_solo.cuh — the router's prefill kernel: one thread per token (included by
 * moe_gate.cu inside its anonymous namespace; uses its GateArgs, keys and sigmoid).
 *
 * The team kernels spend most of their instructions coordinating lanes (shuffles, ballots,
 * prefix sums: ~560 warp instructions per DeepSeek-V3 token). Here a lane owns a whole token,
 * so a warp instruction advances 32 tokens and no step needs another lane:
 *   0. A warp stages its tile of 32 rows into shared memory with 16-byte cp.async (8 lanes per
 *      row line, so reads are whole 128-byte lines) in a [chunk][lane] layout whose row is
 *      XOR-swizzled by the chunk index: the copies and every later per-lane read are free of
 *      bank conflicts.
 *   1. Pass 1, per unit of VB experts: s = sigmoid(x) (the team kernel's formula, so keys agree
 *      bit for bit), written back over the row as f32 (bf16 / f16 rows are staged in the upper
 *      half of the f32 tile; a lane's s never lands on logits it has not read yet); c = s + b
 *      (b from a padded block copy: lanes in different groups read distinct banks); the unit's
 *      best two c. A non-finite logit in the row (x * 0 + acc turns NaN) sends the token to the
 *      exact path.
 *   2. Groups (G > 1: a unit is a group): group score from its best two, ranks counted.
 *   3. Threshold: tau = the k-th largest of the best-two values of kept units. Those are k real
 *      experts >= tau, so the top k are all >= tau.
 *   4. Pass 2 over kept groups (ascending expert index): c >= tau goes to a per-lane list
 *      (predicated store, no branch); typically k plus a few candidates.
 *   5. Insertion into a sorted top-KMAX in registers (strict >, so on equal c the earlier, lower
 *      index stays ahead: the library's order); weights are the winners' s, read back.
 *   6. Renormalize, scale, shared experts, stores, with the team kernel's formulas.
 * Rows with a non-finite logit or bias, and lists that overflow (heavy ties), take solo_exact:
 * the SPEC §4 policy computed from the row in global memory, out of line.
 * Shared memory per warp: the f32 tile (128 E bytes) and a 16-entry list; per block the bias.
 * Limits (else the caller keeps the team kernels): sigmoid, no scores output, 16-byte aligned
 * rows, the compiled shapes (E, G) with k <= KMAX and k <= 2 x kept units.
 */

constexpr int kSoloWarps = 2;
constexpr int kSoloCap = 16; /* candidate list entries per token */

template <typename T, int E, int G, int VB> struct SoloShape {
    static constexpr int P = E / G;                       /* experts per group */
    static constexpr int U = E / VB;                      /* tracked units */
    static constexpr int EPC = 16 / (int)sizeof(T);       /* logits per 16-byte chunk */
    static constexpr int XC = E / EPC;                    /* logits chunks per row */
    static constexpr int kTileBytes = E * 4 * 32;         /* s tile, f32 */
    static constexpr int kXOff = kTileBytes - E * (int)sizeof(T) * 32;
    static constexpr int kListBytes = kSoloCap * 8 * 32;
    static constexpr int kWarpBytes = kTileBytes + kListBytes;
    static constexpr int kBiasStride = P + 4;             /* floats per group */
    static constexpr int kBiasBytes = (G * kBiasStride * 4 + 15) / 16 * 16;
    static constexpr int kSmemBytes = kBiasBytes + kSoloWarps * kWarpBytes;
    static_assert(E % G == 0 && P % VB == 0 && VB % EPC == 0 && VB % 4 == 0, "solo shape");
    static constexpr int UG = P / VB;                     /* units per group */
    static_assert(sizeof(T) == 4 || E % 64 == 0, "solo: in-place s needs E % 64 == 0");
    static_assert(U <= kSoloCap, "solo: the unit tops share the list");
};

/* Byte offset of 16-byte chunk c of lane `lane` in a [chunk][lane] tile. */
__device__ __forceinline__ int solo_slot(int c, int lane) { return (c * 32 + (lane ^ (c & 7))) << 4; }

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
    auto put_w = [&](int j, float w) {
        if (a.weights_f32)
            static_cast<float *>(a.weights)[t * a.weights_stride + j] = w;
        else
            mlaf_st(static_cast<T *>(a.weights) + t * a.weights_stride + j, w);
    };
#pragma unroll
    for (int i = 0; i < KMAX; i++) {
        if (i < K) {
            ids[i] = tid[i];
            put_w(i, a.apply_scaling ? tw[i] * a.scaling : tw[i]);
        }
    }
    const float shared_w = routed / a.scaling;
    for (int j = K; j < a.K; j++) {
        ids[j] = E + (j - K);
        put_w(j, shared_w);
    }
}

/* The SPEC §4 policy for one token, from its row in global memory: invalid experts (non-finite
 * logit or bias) rank after every valid one and weigh 0; groups without a valid expert rank
 * last; k rounds of the max key below the previous one; then the common epilogue. */
template <typename T, int E, int G, int KMAX>
__device__ __noinline__ void solo_exact(const GateArgs a, int64_t t) {
    int oid[KMAX];
    float ow[KMAX];
    constexpr int P = E / G;
    const T *row = static_cast<const T *>(a.logits) + t * a.logits_stride;
    float cl[E];
    for (int e = 0; e < E; e++) {
        const float x = mlaf_ld(row + e);
        const float b = a.bias ? a.bias[e] : 0.0f;
        cl[e] = (isfinite(x) && isfinite(b)) ? sigmoid_fast(x) + b : kNegInf;
    }
    uint32_t kept = 0xffffffffu;
    if constexpr (G > 1) {
        uint32_t gv[G];
        for (int g = 0; g < G; g++) {
            float m1 = kNegInf, m2 = kNegInf;
            for (int e = g * P; e < g * P + P; e++) {
                m2 = fmaxf(m2, fminf(m1, cl[e]));
                m1 = fmaxf(m1, cl[e]);
            }
            gv[g] = m1 == kNegInf ? 0u : ord32(((a.group_max || m2 == kNegInf) ? m1 : m1 + m2) + 0.0f);
        }
        kept = 0u;
        for (int g = 0; g < G; g++) {
            int better = 0;
            for (int h = 0; h < G; h++) better += gv[h] > gv[g] || (gv[h] == gv[g] && h < g);
            if (better < a.topk_group) kept |= 1u << g;
        }
    }
    unsigned long long prev = ~0ull;
    for (int r = 0; r < KMAX; r++) {
        oid[r] = 0;
        ow[r] = 0.0f;
        if (r >= a.top_k) continue;
        unsigned long long best = 0ull;
        for (int e = 0; e < E; e++) {
            if (!((kept >> (e / P)) & 1u)) continue;
            const unsigned long long kk = team_key(cl[e], e);
            if (kk < prev && kk > best) best = kk;
        }
        prev = best;
        const int e = (int)(0xffffffffu - (uint32_t)best);
        oid[r] = e;
        ow[r] = (uint32_t)(best >> 32) == kOrdNegInf ? 0.0f : sigmoid_fast(mlaf_ld(row + e));
    }
    solo_store<T, KMAX>(a, t, E, oid, ow);
}

template <typename T, int E, int G, int VB, int KMAX>
__global__ void __launch_bounds__(kSoloWarps * 32)
moe_gate_solo_kernel(const GateArgs a) {
    using S = SoloShape<T, E, G, VB>;
    constexpr int P = S::P, U = S::U, EPC = S::EPC;
    extern __shared__ __align__(16) unsigned char ssmem[];
    float *bsm = reinterpret_cast<float *>(ssmem);
    const int lane = threadIdx.x & 31;
    const int wib = threadIdx.x >> 5;
    unsigned char *tile = ssmem + S::kBiasBytes + wib * S::kWarpBytes;
    unsigned char *xs = tile + S::kXOff;
    unsigned char *lst = tile + S::kTileBytes; /* [slot][lane] 8-byte entries */

    /* bias, padded per group; a non-finite bias sends every token to the exact path */
    int bias_bad = 0;
    for (int e = threadIdx.x; e < E; e += kSoloWarps * 32) {
        const float b = a.bias ? a.bias[e] : 0.0f;
        bsm[(e / P) * S::kBiasStride + e % P] = b;
        bias_bad |= !isfinite(b);
    }
    const bool all_exact = __syncthreads_or(bias_bad) != 0;

    const unsigned char *logits = static_cast<const unsigned char *>(a.logits);
    const int64_t stride_b = a.logits_stride * (int64_t)sizeof(T);
    const int K = a.top_k;
    const int64_t ntiles = (a.T + 31) / 32;
    for (int64_t tl = (int64_t)blockIdx.x * kSoloWarps + wib; tl < ntiles;
         tl += (int64_t)gridDim.x * kSoloWarps) {
        const int64_t t0 = tl * 32;
        __syncwarp(); /* the previous tile is no longer read */
        /* 0. stage: flat chunk f = token * XC + chunk, 32 per instruction */
#pragma unroll 4
        for (int i = 0; i < S::XC; i++) {
            const int f = i * 32 + lane;
            const int r = f / S::XC, c = f % S::XC;
            if (t0 + r < a.T)
                cp_async(xs + solo_slot(c, r), logits + (t0 + r) * stride_b + c * 16, 16);
        }
        cp_async_commit();
        cp_async_wait<0>();
        __syncwarp();
        const int64_t t = t0 + lane;
        const bool live = t < a.T;

        /* 1. pass 1 */
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}; /* four chains */
        uint2 *tops = reinterpret_cast<uint2 *>(lst);
#pragma unroll 1
        for (int u = 0; u < U; u++) {
            const int g = (u * VB) / P;
            const float *bu = bsm + g * S::kBiasStride + (u * VB - g * P);
            float a1 = kNegInf, a2 = kNegInf, b1 = kNegInf, b2 = kNegInf;
#pragma unroll
            for (int j = 0; j < VB / EPC; j++) {
                const int c = u * (VB / EPC) + j;
                const uint4 raw = *reinterpret_cast<const uint4 *>(xs + solo_slot(c, lane));
                const T *el = reinterpret_cast<const T *>(&raw);
                float sv[EPC];
#pragma unroll
                for (int i = 0; i < EPC; i++) {
                    const float x = mlaf_elem<T>::load(el[i]);
                    acc[i & 3] = fmaf(x, 0.0f, acc[i & 3]);
                    sv[i] = sigmoid_fast(x);
                }
#pragma unroll
                for (int q = 0; q < EPC / 4; q++) {
                    const int sc = c * (EPC / 4) + q;
                    *reinterpret_cast<float4 *>(tile + solo_slot(sc, lane)) =
                        make_float4(sv[4 * q], sv[4 * q + 1], sv[4 * q + 2], sv[4 * q + 3]);
                    const float4 b4 = *reinterpret_cast<const float4 *>(bu + j * EPC + 4 * q);
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
            tops[u * 32 + lane] = make_uint2(__float_as_uint(m1), __float_as_uint(m2));
        }
        const float accs = (acc[0] + acc[1]) + (acc[2] + acc[3]);
        bool exact = all_exact || accs != accs;

        int tid[KMAX];
        float tw[KMAX];
        if (live && !exact) {
            /* 2. groups; 3. threshold */
            float tv[2 * U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const uint2 p = tops[u * 32 + lane];
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
            const float tau = solo_kth<2 * U, KMAX>(tv, K);

            /* 4. pass 2: candidates of kept groups, ascending expert index */
            int n = 0;
            uint32_t km = kept;
            const int passes = G > 1 ? a.topk_group : 1;
            for (int it = 0; it < passes; it++) {
                const int g = __ffs(km) - 1;
                km &= km - 1;
                const float *bg = bsm + g * S::kBiasStride;
#pragma unroll 8
                for (int j = 0; j < P / 4; j++) {
                    const int sc = g * (P / 4) + j;
                    const float4 s4 = *reinterpret_cast<const float4 *>(tile + solo_slot(sc, lane));
                    const float4 b4 = *reinterpret_cast<const float4 *>(bg + 4 * j);
                    const float cc[4] = {s4.x + b4.x, s4.y + b4.y, s4.z + b4.z, s4.w + b4.w};
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const bool p = cc[i] >= tau;
                        if (p && n < kSoloCap)
                            reinterpret_cast<uint2 *>(lst)[n * 32 + lane] =
                                make_uint2(__float_as_uint(cc[i]), (uint32_t)(sc * 4 + i));
                        n += p;
                    }
                }
            }
            exact = n > kSoloCap;
            if (!exact) {
                /* 5. sorted insertion; candidates come in ascending index */
                float sv[KMAX];
#pragma unroll
                for (int i = 0; i < KMAX; i++) {
                    sv[i] = kNegInf;
                    tid[i] = 0;
                }
                for (int j = 0; j < n; j++) {
                    const uint2 p = reinterpret_cast<const uint2 *>(lst)[j * 32 + lane];
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
                    tw[i] = *reinterpret_cast<const float *>(tile + solo_slot(e >> 2, lane) + (e & 3) * 4);
                }
            }
        }
        if (live && exact) solo_exact<T, E, G, KMAX>(a, t);
        else if (live) solo_store<T, KMAX>(a, t, E, tid, tw);
    }
}

template <typename T, int E, int G, int VB, int KMAX> int solo_blocks_per_sm() {
    static std::atomic<int> cached{0};
    int v = cached.load(std::memory_order_relaxed);
    if (v == 0) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                &v, moe_gate_solo_kernel<T, E, G, VB, KMAX>, kSoloWarps * 32,
                SoloShape<T, E, G, VB>::kSmemBytes) != cudaSuccess ||
            v < 1) {
            (void)cudaGetLastError();
            v = 1;
        }
        cached.store(v, std::memory_order_relaxed);
    }
    return v;
}

template <typename T, int E, int G, int VB, int KMAX>
void launch_solo(const GateArgs &a, int sm_count, cudaStream_t stream) {
    using S = SoloShape<T, E, G, VB>;
    static_assert(S::kSmemBytes <= 227 * 1024, "solo kernel shared memory");
    if (S::kSmemBytes > 48 * 1024)
        (void)cudaFuncSetAttribute(moe_gate_solo_kernel<T, E, G, VB, KMAX>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmemBytes);
    const int64_t tiles = (a.T + 31) / 32;
    const int64_t want = (tiles + kSoloWarps - 1) / kSoloWarps;
    const int64_t cap = (int64_t)(sm_count > 0 ? sm_count : 1) * solo_blocks_per_sm<T, E, G, VB, KMAX>();
    const int blocks = (int)(want < cap ? want : cap);
    moe_gate_solo_kernel<T, E, G, VB, KMAX><<<blocks, kSoloWarps * 32, S::kSmemBytes, stream>>>(a);
}

/* Whether the solo kernel (E, G experts / groups, units of VB, KMAX) can run call a. */
template <typename T>
inline bool solo_fits(const GateArgs &a, int E, int G, int VB, int KMAX) {
    if (a.E != E || a.n_group != G || a.softmax || a.scores || a.top_k > KMAX) return false;
    const int units_kept = G > 1 ? a.topk_group * (E / G / VB) : E / VB;
    if (a.top_k > 2 * units_kept) return false;
    return fast_copy_unit<T>(a) == 16;
}

/* The prefill router for the shapes compiled here; false: the caller picks another kernel. */
template <typename T>
bool try_solo(const GateArgs &a, int sm_count, cudaStream_t stream) {
#define MLAF_SOLO(E_, G_, VB_, KM_)                                                               \
    if (solo_fits<T>(a, E_, G_, VB_, KM_)) {                                                     \
        launch_solo<T, E_, G_, VB_, KM_>(a, sm_count, stream);                                   \
        return true;                                                                              \
    }
    MLAF_SOLO(256, 8, 16, 8) /* DeepSeek-V3 / R1 */
    MLAF_SOLO(64, 1, 8, 4)   /* GLM-4.7-Flash */
#undef MLAF_SOLO
    return false;
}
