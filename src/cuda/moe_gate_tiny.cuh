/*
 * moe_gate_tiny.cuh — the router's decode kernel (moe_gate_tiny_kernel, T <= 64): one block per
 * token, one thread per expert.
 *
 * At decode sizes the cost is one token's dependent chain, not throughput: where the team
 * kernels walk each lane's experts serially and find the threshold in ceil(k/2) dependent
 * rounds, every step here is one warp-wide operation or one block barrier. A unit is one warp:
 * group g (<= 32 experts) in lanes [0, P) of warp g, or experts [32 w, 32 w + 32) in warp w
 * for one group. Per token:
 *   0. Thread (w, l) loads its logit and its bias entry first (L2-resident in a decode loop).
 *   1. s = score_traits<SF>::fast(x), or softmax over the finite logits (block max
 *      of ord32, exp, block sum: two barriers); v = ord32(s + b), kOrdNegInf for an invalid
 *      expert, 0 for padding.
 *   2. The unit's best two keys by two warp reductions; lane 0 writes the unit's group score
 *      and its second best. Barrier 1.
 *   3. Every warp alike (in blocks of 24+ warps warp 0 alone, then a barrier: Kimi-K3's T = 1
 *      3.16 against 4.08 us on an H100): kept groups by a rank count and a ballot; tau = the
 *      ceil(k/2)-th largest second best over kept units (a warp min when exactly ceil(k/2) are kept). Each
 *      of those holds two real experts >= tau, so the whole top k is >= tau.
 *   4. Candidates (kept unit, v >= tau; typically k plus a few) append their 64-bit key and
 *      weight to a block list: one shared atomic per warp, a ballot prefix within it. Barrier 2.
 *   5. A candidate's rank is the number of keys above it: warp 0 alone against 32 fixed slots
 *      when there are <= 32, else one candidate per thread and one more barrier. Rank r < k
 *      stores ids[r] and parks its weight at slot r.
 *   6. Every winner sums the k parked weights in slot order (the same bits whatever order the
 *      atomics gave), then the team kernel's renormalization, scaling and shared experts.
 * Non-finite input and ties only make the list longer, so there is no separate exact path.
 * Launch: T blocks of NW x 32 threads (NW = units rounded up to 2, 4, 8, 12, 16, 24 or 32; padding
 * warps rank last), static shared memory only (NW x 384 bytes + ~0.2 KB).
 * Limits (else try_tiny returns false): 1 <= T <= 64 (or the mid-T rule at kTinyMidWaves, up to
 * 16 units), no scores output, top_k <= 32; <= 16 groups of <= 32 experts, or one group of <= 1024
 * experts (Kimi-K3's 896: 28 units); any row stride. Softmax sums in another order than the team kernel (1/sum may differ by an
 * ulp: near-ties may order apart).
 */
#pragma once

#include "moe_gate_common.cuh"

namespace {

constexpr int64_t kTinyMaxT = 64;
/* Beyond kTinyMaxT, routers of at least 4 units (97+ experts) keep the tiny kernel for up to
 * kTinyMidWaves waves of blocks at full occupancy (2048 threads per SM: register-capped to 32
 * per thread): each token one block's short chain, where the other kernels leave most SMs idle
 * (DeepSeek-V3 on 132 SMs: T <= 1056; dev/moe_gate/README.md). */
constexpr int64_t kTinyMidWaves = 1;
/* Routers of <= 64 experts in one group (GLM-4.7-Flash) take the tiny kernel too; set false to
 * leave them to the general kernel. */
constexpr bool kTinyTakeSmallE = true;

/* Loads NW consecutive 32-bit words of shared memory (16-byte aligned) with vector loads. */
template <int NW>
__device__ __forceinline__ void tiny_load_words(const uint32_t *p, uint32_t (&o)[NW]) {
    if constexpr (NW % 4 == 0) {
#pragma unroll
        for (int i = 0; i < NW / 4; i++) {
            const uint4 q = reinterpret_cast<const uint4 *>(p)[i];
            o[4 * i] = q.x, o[4 * i + 1] = q.y, o[4 * i + 2] = q.z, o[4 * i + 3] = q.w;
        }
    } else if constexpr (NW % 2 == 0) {
#pragma unroll
        for (int i = 0; i < NW / 2; i++) {
            const uint2 q = reinterpret_cast<const uint2 *>(p)[i];
            o[2 * i] = q.x, o[2 * i + 1] = q.y;
        }
    } else {
#pragma unroll
        for (int i = 0; i < NW; i++) o[i] = p[i];
    }
}

/* MINB: resident blocks the registers must allow (1 at decode sizes, full occupancy past them). */
template <typename T, int NW, mlaf_score_func SF, int MINB>
__global__ void __launch_bounds__(NW * 32, MINB) moe_gate_tiny_kernel(const GateArgs a) {
    mlaf_pdl_begin();
    static_assert(NW >= 2 && NW <= 32 && NW % 2 == 0, "tiny: 2..32 warps");
    constexpr int kCap = NW * 32; /* every real expert fits in the list */
    __shared__ __align__(16) uint32_t s_gs[NW];  /* group score key per unit */
    __shared__ __align__(16) uint32_t s_k2[NW];  /* second best key per unit */
    __shared__ __align__(16) uint32_t s_red[NW]; /* softmax: per-warp max key */
    __shared__ __align__(16) uint32_t s_sum[NW]; /* softmax: per-warp sum (f32 bits) */
    __shared__ __align__(16) unsigned long long s_key[kCap];
    __shared__ __align__(16) float s_w[kCap];
    __shared__ __align__(16) float s_sel[32]; /* weight of rank r */
    __shared__ int s_n;
    __shared__ uint32_t s_kt[2]; /* kept units and tau, warp 0's (blocks of 24+ warps) */

    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int64_t t = blockIdx.x;
    const int32_t E = a.E;
    const bool grouped = a.n_group > 1;
    const int pw = grouped ? a.P : 32; /* expert slots per warp */
    const int e = w * pw + lane;
    const bool in = lane < pw && e < E;

    /* 0. loads first */
    float x = 0.0f, b = 0.0f;
    if (in) {
        x = mlaf_elem<T>::load(__ldg(static_cast<const T *>(a.logits) + t * a.logits_stride + e));
        if (a.bias) b = __ldg(a.bias + e);
    }
    if (threadIdx.x == 0) s_n = 0;
    if (w == 0) {
        s_key[lane] = 0ull; /* slots [n, 32) read as "below every key" */
        s_sel[lane] = 0.0f; /* slots [k, 32) add nothing */
    }

    /* 1. scores, rank values */
    const bool xf = in && isfinite(x);
    float s;
    if constexpr (score_traits<SF>::row_wise) { /* softmax */
        const uint32_t mk = warp_max_u32(xf ? ord32(x) : 0u);
        if (lane == 0) s_red[w] = mk;
        __syncthreads();
        uint32_t r[NW];
        tiny_load_words<NW>(s_red, r);
        uint32_t mall = 0u;
#pragma unroll
        for (int h = 0; h < NW; h++) mall = max(mall, r[h]);
        const float m = mall ? unord32(mall) : kNegInf; /* max over the finite logits */
        const float ex = xf ? __expf(x - m) : 0.0f;
        const float ws = warp_sum(ex);
        if (lane == 0) s_sum[w] = __float_as_uint(ws);
        __syncthreads();
        tiny_load_words<NW>(s_sum, r);
        float sum = 0.0f;
#pragma unroll
        for (int h = 0; h < NW; h++) sum += __uint_as_float(r[h]);
        const float rinv = 1.0f / (sum > 0.0f ? sum : 1.0f);
        s = __fmul_rn(ex, rinv);
    } else {
        s = score_traits<SF>::fast(x);
    }
    const bool valid = xf && isfinite(b);
    const uint32_t v = valid ? ord32(s + b) : (in ? kOrdNegInf : 0u);
    const float wgt = valid ? s : 0.0f; /* invalid experts weigh 0 */

    /* 2. the unit's best two keys; group score */
    const uint32_t k1 = warp_max_u32(v);
    const unsigned eq = __ballot_sync(kFull, v == k1);
    const uint32_t k2o = warp_max_u32(v == k1 ? 0u : v);
    const uint32_t k2 = (eq & (eq - 1u)) ? k1 : k2o;
    if (lane == 0) {
        s_k2[w] = k2;
        if (grouped) {
            uint32_t gv = 0u; /* no valid expert in the group */
            if (k1 > kOrdNegInf) {
                const float g1 = unord32(k1);
                gv = ord32(((a.group_max || k2 <= kOrdNegInf) ? g1 : g1 + unord32(k2)) + 0.0f);
            }
            s_gs[w] = gv;
        }
    }
    __syncthreads();

    /* 3. kept units and the threshold: every warp the same, or, in blocks of 24 or more warps,
     * warp 0 alone and the others after one more barrier (a decode call is bound by the
     * instructions its warps issue; dev/moe_gate/README.md) */
    constexpr bool one = NW >= 24;
    uint32_t kept = 0u, tau = 0u;
    if (!one || w == 0) {
        const int u = lane < NW ? lane : NW - 1;
        const bool ul = lane < NW;
        uint32_t k2s[NW];
        tiny_load_words<NW>(s_k2, k2s);
        const uint32_t k2u = s_k2[u];
        if (grouped) {
            uint32_t gs[NW];
            tiny_load_words<NW>(s_gs, gs);
            const uint32_t gu = s_gs[u];
            int better = 0;
#pragma unroll
            for (int h = 0; h < NW; h++) better += (gs[h] > gu) || (gs[h] == gu && h < u);
            kept = __ballot_sync(kFull, ul && better < a.topk_group);
        } else {
            kept = NW == 32 ? kFull : ((1u << NW) - 1u);
        }
        const bool ku = ul && ((kept >> u) & 1u);
        const int jn = (a.top_k + 1) >> 1;
        if (__popc(kept) == jn) {
            tau = warp_min_u32(ku ? k2u : 0xffffffffu);
        } else {
            int rk = 0;
#pragma unroll
            for (int h = 0; h < NW; h++)
                rk += ((kept >> h) & 1u) && (k2s[h] > k2u || (k2s[h] == k2u && h < u));
            const unsigned sel = __ballot_sync(kFull, ku && rk == jn - 1);
            tau = sel ? __shfl_sync(kFull, k2u, __ffs(sel) - 1) : 0u;
        }
        tau = max(tau, 1u); /* real experts only (and all of them when tau says nothing) */
    }
    if constexpr (one) {
        if (threadIdx.x == 0) s_kt[0] = kept, s_kt[1] = tau;
        __syncthreads();
        kept = s_kt[0];
        tau = s_kt[1];
    }

    /* 4. candidates into the block list */
    const bool cand = ((kept >> w) & 1u) && v >= tau;
    const unsigned bal = __ballot_sync(kFull, cand);
    if (bal) {
        int base = 0;
        if (lane == 0) base = atomicAdd(&s_n, __popc(bal));
        base = __shfl_sync(kFull, base, 0);
        if (cand) {
            const int pos = base + __popc(bal & ((1u << lane) - 1u));
            s_key[pos] = ((unsigned long long)v << 32) | (uint32_t)(0xffffffffu - (uint32_t)e);
            s_w[pos] = wgt;
        }
    }
    __syncthreads();
    const int n = s_n;
    const int K = a.top_k;

    /* 5. ranks */
    const bool small = n <= 32;
    if (small && w != 0) return;
    int r = K, id = 0;
    float wi = 0.0f;
    const int i = small ? lane : (int)threadIdx.x;
    if (i < n) {
        const unsigned long long ki = s_key[i];
        wi = s_w[i];
        id = (int)(0xffffffffu - (uint32_t)ki);
        int cnt = 0;
        if (small) {
            const ulonglong2 *q = reinterpret_cast<const ulonglong2 *>(s_key);
            ulonglong2 kk[16];
#pragma unroll
            for (int j = 0; j < 16; j++) kk[j] = q[j];
#pragma unroll
            for (int j = 0; j < 16; j++) cnt += (kk[j].x > ki) + (kk[j].y > ki);
        } else {
            for (int j = 0; j < n; j++) cnt += s_key[j] > ki;
        }
        r = cnt;
        if (r < K) s_sel[r] = wi;
    }
    if (small)
        __syncwarp();
    else
        __syncthreads();

    /* 6. weights (the team kernel's formulas), stores */
    const bool win = r < K;
    if (!win && w != 0) return;
    float sum = 0.0f;
    for (int j = 0; j < K; j += 8) {
        const float4 p0 = *reinterpret_cast<const float4 *>(s_sel + j);
        const float4 p1 = *reinterpret_cast<const float4 *>(s_sel + j + 4);
        sum += ((p0.x + p0.y) + (p0.z + p0.w)) + ((p1.x + p1.y) + (p1.z + p1.w));
    }
    float routed = sum, rden = 1.0f;
    if (a.renormalize) {
        const float denom = sum + a.eps;
        rden = denom > 0.0f ? __frcp_rn(denom) : 1.0f;
        if (a.n_shared > 0) {
            routed = 0.0f;
            for (int j = 0; j < K; j += 8) {
                const float4 p0 = *reinterpret_cast<const float4 *>(s_sel + j);
                const float4 p1 = *reinterpret_cast<const float4 *>(s_sel + j + 4);
                routed += ((p0.x * rden + p0.y * rden) + (p0.z * rden + p0.w * rden)) +
                          ((p1.x * rden + p1.y * rden) + (p1.z * rden + p1.w * rden));
            }
        }
    }
    if (win) {
        a.ids[t * a.ids_stride + r] = id;
        const float wr = wi * rden;
        gate_put_weight<T>(a, t, r, a.apply_scaling ? wr * a.scaling : wr);
    }
    if (w == 0) {
        const float shared_w = routed / a.scaling;
        for (int j = K + lane; j < a.K; j += 32) {
            a.ids[t * a.ids_stride + j] = E + (j - K);
            gate_put_weight<T>(a, t, j, shared_w);
        }
    }
}

template <typename T, int NW, mlaf_score_func SF, int MINB>
void launch_tiny(const GateArgs &a, cudaStream_t stream) {
    mlaf_launch(moe_gate_tiny_kernel<T, NW, SF, MINB>, (unsigned)a.T, NW * 32, 0, stream, a);
}

/* Blocks of NW warps resident per SM at full occupancy (2048 threads). */
constexpr int tiny_full_blocks(int nw) { return 2048 / (nw * 32); }

/* Takes decode-size calls (see the limits above); false launches nothing. */
template <typename T, mlaf_score_func SF>
bool try_tiny(const GateArgs &a, int sm_count, cudaStream_t stream, bool any_t = false) {
    if (a.T < 1 || a.scores != nullptr) return false;
    if (a.top_k < 1 || a.top_k > 32 || a.E < 1) return false;
    int units;
    if (a.n_group > 1) {
        if (a.n_group > 16 || a.P > 32 || a.P < 1 || a.n_group * a.P != a.E) return false;
        units = a.n_group;
    } else {
        if (a.E > 1024) return false;
        if (!kTinyTakeSmallE && a.E <= 64) return false;
        units = (a.E + 31) / 32;
    }
    const int nw = units <= 2    ? 2
                   : units <= 4  ? 4
                   : units <= 8  ? 8
                   : units <= 12 ? 12
                   : units <= 16 ? 16
                   : units <= 24 ? 24
                                 : 32;
    if (a.T <= kTinyMaxT) {
        switch (nw) {
        case 2: launch_tiny<T, 2, SF, 1>(a, stream); break;
        case 4: launch_tiny<T, 4, SF, 1>(a, stream); break;
        case 8: launch_tiny<T, 8, SF, 1>(a, stream); break;
        case 12: launch_tiny<T, 12, SF, 1>(a, stream); break;
        case 16: launch_tiny<T, 16, SF, 1>(a, stream); break;
        case 24: launch_tiny<T, 24, SF, 1>(a, stream); break;
        default: launch_tiny<T, 32, SF, 1>(a, stream); break;
        }
        return true;
    }
    if (nw > 16) return false; /* blocks of 768 / 1024 threads: the decode instances only */
    const int64_t wave = (int64_t)(sm_count > 0 ? sm_count : 1) * tiny_full_blocks(nw);
    if (!any_t && (units < 4 || a.T > kTinyMidWaves * wave)) return false;
    switch (nw) { /* 2 warps (fewer than 4 units) only with any_t: the decode instance */
    case 2: launch_tiny<T, 2, SF, 1>(a, stream); break;
    case 4: launch_tiny<T, 4, SF, tiny_full_blocks(4)>(a, stream); break;
    case 8: launch_tiny<T, 8, SF, tiny_full_blocks(8)>(a, stream); break;
    case 12: launch_tiny<T, 12, SF, tiny_full_blocks(12)>(a, stream); break;
    default: launch_tiny<T, 16, SF, tiny_full_blocks(16)>(a, stream); break;
    }
    return true;
}

} // namespace
