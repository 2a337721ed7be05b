/*
 * indexer_q_v1 — the DSA indexer query op (docs/dsa.md: RoPE on dims [0, 64) of each 128-wide head,
 * the optional Hadamard, the per-head scale, 128 e4m3 bytes and the folded head weight) in new
 * kernel shapes against the library's (src/cuda/indexer_q.cu, called through mlaf_indexer_q as
 * it ships). Every variant keeps index_row.cuh's arithmetic step for step, so its q_fp8 bytes and
 * w_out bits must equal the library's; the program checks that before it times anything.
 *
 *   v0  the library as it ships (v5's shape since it was adopted). The kernel v1 .. v5 were
 *       written against (git history of src/cuda/indexer_q.cu): a warp per (token, head) item,
 *       4 warps a block; per item a 64-bit division for (t, h), the position and the cos / sin
 *       row loaded again, 4 two-byte loads and 4 one-byte stores per lane, lane 0 loads w and
 *       stores w_out (~256 B read per warp at a time).
 *   v1  warp: a warp per item of hg heads of one token (hg = all heads of the token from
 *       T = 32768: a warp per token), lane l holds values [4 l, 4 l + 4) as in the library
 *       (mlaf_idx_hadamard, mlaf_idx_scale called as they are); the position and the lane's
 *       cos / sin loaded once per item into registers, no 64-bit division, one 8-byte load and
 *       one 4-byte store per lane and head, 2 heads loaded before either is used; w read and
 *       w_out written once per 32 heads as one coalesced access.
 *   v2  warp pf rcp: v1 with the next 2 heads' loads issued before the current 2 are processed
 *       (4 heads, 1 KB in flight per warp), and e4m3(y / s) as e4m3(y * 2^-e) when s = 2^e
 *       (UE8M0): the reals y / 2^e and y * 2^-e are equal, so both correctly rounded results
 *       are the same float (subnormals and s = inf included; other s keep the division).
 *   v3  half: half a warp per head, lane holds 8 values (one 16-byte load, one 8-byte store of
 *       e4m3 bytes), a warp does 2 heads per step and loads 2 steps (4 heads, 1 KB) before
 *       computing; the Hadamard's in-lane strides 1, 2, 4 and cross-lane 8 .. 64 (the same
 *       butterflies in the same order), the amax a half-warp max (a max: order-free).
 *   v4  half pf: v3 with the next 4 heads loaded while the current 4 are processed (8 heads,
 *       2 KB in flight per warp).
 *   v5  half pf rcp: v4 with the power-of-two reciprocal of v2.
 * Why (estimates, not measurements): the library issues ~250 warp instructions per head (the
 * 64-bit division and modulo, the position and cos / sin reloads, 4 two-byte loads, 4 __fdiv_rn
 * and 4 byte stores a lane): GLM-5 T = 32768 (1.05 M heads) is ~250 us of issue on 132 SMs x 4
 * schedulers at 1.98 GHz against a 99 us memcpy; and its q loads wait behind the branch on the
 * position, so a warp has at most 256 B in flight (64 warps per SM at 32 registers: <= 16 KB an
 * SM, about half on average). Reads at 85% of copy need ~21 KB in flight per SM per us of latency.
 * Per head and per SM (ptxas registers -> resident warps): v1 ~105 instructions, 18 KB (56
 * registers, 36 warps x 2 heads x 256 B); v2 ~70, 36 KB; v3 ~90, 28 KB (72: 28 warps x 4 heads);
 * v4 ~90, 48 KB (80: 24 warps x 8 heads); v5 ~55, 48 KB. The Hadamard adds ~70 per head to every
 * shape (5 / 4 shuffle stages of the 128 values).
 * Heads per warp item (hg, a multiple of 4): the largest of {H, 32, 16, 8, 4} that gives at
 * least 2 waves of resident warps (at least T * ceil(H / hg) >= 2 * SMs * warps per SM), else
 * 4; `--hg N` forces N. Vector loads / stores only where the pointers and strides allow them
 * (else element loads and byte stores: the same values).
 *
 * Validation (before any timing; FAIL and exit status 1 on any difference): T = 999, H in
 * {32, 64, 5} x interleaved / NeoX x Hadamard off / on x 4 layouts (contiguous bf16 w, i64
 * positions, UE8M0; the same with F32 scales and f32 w; 4-byte-aligned strides (132) with f32 w;
 * odd strides (131 / 129) and odd base addresses with bf16 w, i32 positions, F32 scales),
 * positions past the table and one negative, rows of scales 2^-20 .. 2^20, a zero row, +inf and
 * NaN values. v0 against the CPU backend (mlaf_indexer_q on host memory: the same bits by the
 * library's contract) and its error count; every new variant at hg in {4, 8, 32, 64} against v0:
 * every byte of the q_fp8 and w_out buffers (untouched ones included) and the error count.
 * Then at each timed size every variant's output is compared with v0's on the device first.
 *
 * Timing as mlafuse bench's stream rows: inputs as the bench builds them (q_idx [T, H, 128] bf16
 * uniform in [-2, 2), w [T, H] bf16 in [-1, 1), i64 positions t % max_pos, max_pos = min(T,
 * 65536), the 64-wide table of mlaf_rope_table_init base 1e4, the preset's indexer params:
 * glm-5 H = 32 interleaved, deepseek-v3.2 H = 64 NeoX, UE8M0), Hadamard off (the presets) and on;
 * a 256 MB memset + read flush before each sample, CUDA events, median of 21 after 3 warm-ups;
 * bytes as the bench counts them (q_idx, w, positions, a 256-byte cos / sin row per token read;
 * q_fp8 and w_out written), and a cudaMemcpyAsync of half those bytes timed the same way.
 * `--quick`: T = 32768 only (else 1024, 4096, 32768, 131072). `--hg N`: heads per warp item.
 */
#include "cuda/index_row.cuh"
#include "common.cuh"

#include <type_traits>

#define IQ_FULL 0xffffffffu
#define IQ_WARPS 4

/* Launch shape of the new variants (host-chosen, uniform over the grid). */
struct iq_cfg {
    int32_t hg;      /* heads per warp item: a multiple of 4 */
    int32_t ngroups; /* ceil(H / hg) items per token */
    int32_t items;   /* T * ngroups (< 2^31) */
    int32_t qvec;    /* q by vector loads (warp shape 8 B, half shape 16 B a lane) */
    int32_t fw;      /* e4m3 stores: 8, 4 or 1 byte(s) at a time */
    int32_t csvec;   /* cos / sin by float4 loads */
};

/* ---- element helpers --------------------------------------------------------------------- */
template <typename T> __device__ __forceinline__ float iq_lo(uint32_t x) {
    if constexpr (std::is_same<T, __nv_bfloat16>::value) return __uint_as_float(x << 16);
    else return __half2float(__ushort_as_half((unsigned short)(x & 0xffffu)));
}
template <typename T> __device__ __forceinline__ float iq_hi(uint32_t x) {
    if constexpr (std::is_same<T, __nv_bfloat16>::value) return __uint_as_float(x & 0xffff0000u);
    else return __half2float(__ushort_as_half((unsigned short)(x >> 16)));
}
/* W words (2 values each) of 2-byte elements at p; vec: one 4 W-byte load (p aligned to it). */
template <int W, typename T> __device__ __forceinline__ void iq_ldq(const T *p, bool vec, uint32_t *x) {
    if (vec) {
        if constexpr (W == 4) {
            const uint4 u = *reinterpret_cast<const uint4 *>(p);
            x[0] = u.x, x[1] = u.y, x[2] = u.z, x[3] = u.w;
        } else {
            const uint2 u = *reinterpret_cast<const uint2 *>(p);
            x[0] = u.x, x[1] = u.y;
        }
    } else {
        const unsigned short *e = reinterpret_cast<const unsigned short *>(p);
#pragma unroll
        for (int k = 0; k < W; k++) x[k] = (uint32_t)e[2 * k] | ((uint32_t)e[2 * k + 1] << 16);
    }
}
template <int W, typename T> __device__ __forceinline__ void iq_unpack(const uint32_t *x, float *v) {
#pragma unroll
    for (int k = 0; k < W; k++) v[2 * k] = iq_lo<T>(x[k]), v[2 * k + 1] = iq_hi<T>(x[k]);
}
/* ---- the arithmetic (index_row.cuh's; the half-warp layout's RoPE, Hadamard and scale are there) */
/* Warp shape: lane l holds [4 l, 4 l + 4); c, s: cos / sin of its pairs (mlaf_idx_rope's). */
template <typename T>
__device__ __forceinline__ void iq_rope4(float *v, int lane, bool neox, const float *c, const float *s) {
    if (neox) {
        float p[4];
#pragma unroll
        for (int k = 0; k < 4; k++) p[k] = __shfl_xor_sync(IQ_FULL, v[k], 8);
        if (lane < 16) {
            const bool first = lane < 8;
#pragma unroll
            for (int k = 0; k < 4; k++)
                v[k] = mlaf_round_as<T>(first ? mlaf_rope_x0(v[k], p[k], c[k], s[k]) : mlaf_rope_x1(p[k], v[k], c[k], s[k]));
        }
    } else if (lane < 16) {
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const float x0 = v[2 * k], x1 = v[2 * k + 1];
            v[2 * k] = mlaf_round_as<T>(mlaf_rope_x0(x0, x1, c[k], s[k]));
            v[2 * k + 1] = mlaf_round_as<T>(mlaf_rope_x1(x0, x1, c[k], s[k]));
        }
    }
}

/* N values -> N / 4 little-endian words of e4m3(v / s): RCP the library's mlaf_quant_e4m3 (a
 * multiply by 1 / s for a power-of-two s), else a division per value (v1 - v4). */
template <int N, bool RCP> __device__ __forceinline__ void iq_quant(const float *v, float s, uint32_t *out) {
    if constexpr (RCP) {
        mlaf_quant_e4m3<N>(v, s, out);
    } else {
        float y[N];
#pragma unroll
        for (int k = 0; k < N; k++) y[k] = __fdiv_rn(v[k], s);
#pragma unroll
        for (int w = 0; w < N / 4; w++)
            out[w] = mlaf_e4m3x2(y[4 * w], y[4 * w + 1]) | (mlaf_e4m3x2(y[4 * w + 2], y[4 * w + 3]) << 16);
    }
}
/* NW words at p: fw 8 (NW = 2, p 8-aligned), 4 (p 4-aligned) or bytes. */
template <int NW> __device__ __forceinline__ void iq_st(uint8_t *p, const uint32_t *w, int fw) {
    if (NW == 2 && fw == 8) {
        *reinterpret_cast<uint2 *>(p) = make_uint2(w[0], w[NW - 1]);
    } else if (fw >= 4) {
#pragma unroll
        for (int i = 0; i < NW; i++) *reinterpret_cast<uint32_t *>(p + 4 * i) = w[i];
    } else {
#pragma unroll
        for (int i = 0; i < NW; i++)
#pragma unroll
            for (int b = 0; b < 4; b++) p[4 * i + b] = (uint8_t)(w[i] >> (8 * b));
    }
}

__device__ __forceinline__ float iq_fold(const mlaf_indexer_q_job &j, float w, float s) {
    return __fmul_rn(__fmul_rn(__fmul_rn(w, s), j.w_fold), j.h_fold);
}

/* ---- v1 / v2: a warp per (token, hg heads), a warp per head at a time ----------------------- */
template <typename T, bool PF, bool RCP>
__global__ void __launch_bounds__(IQ_WARPS * 32) iq_warp_kernel(const mlaf_indexer_q_job j, const iq_cfg c) {
    const int lane = threadIdx.x & 31;
    const int item = (int)blockIdx.x * IQ_WARPS + (int)(threadIdx.x >> 5);
    if (item >= c.items) return;
    const int t32 = item / c.ngroups, g = item - t32 * c.ngroups;
    const int64_t t = t32;
    const int h0 = g * c.hg, h1 = min((int)j.H, h0 + c.hg);
    const T *qt = static_cast<const T *>(j.q) + t * j.q_s0 + 4 * lane;
    const bool qvec = c.qvec != 0;
    auto load = [&](int h, uint32_t *x) { /* the lane's 4 values of head h; zeros past the item */
        if (h < h1) iq_ldq<2>(qt + (int64_t)h * j.q_s1, qvec, x);
        else x[0] = x[1] = 0u;
    };
    uint32_t cur[2][2], nxt[2][2];
    load(h0, cur[0]);
    load(h0 + 1, cur[1]);
    const int64_t pos = mlaf_ld_index(j.rope.positions, j.rope.pos_dt == MLAF_I64, t);
    if (pos < 0 || pos >= j.rope.max_pos) {
        if (g == 0 && lane == 0 && j.error_count) mlaf_cuda_error_count_add(j.error_count, 1);
        return;
    }
    const bool neox = j.rope.style == MLAF_ROPE_NEOX;
    float cc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, ss[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (lane < 16) {
        const float *cs = j.rope.cos_sin + pos * j.rope.cos_sin_stride;
        if (neox) {
            mlaf_idx_ld4(cs + 4 * (lane & 7), c.csvec != 0, cc);
            mlaf_idx_ld4(cs + 32 + 4 * (lane & 7), c.csvec != 0, ss);
        } else {
#pragma unroll
            for (int k = 0; k < 2; k++) cc[k] = __ldg(cs + 2 * lane + k), ss[k] = __ldg(cs + 32 + 2 * lane + k);
        }
    }
    const bool wf32 = j.w_dt == MLAF_F32;
    const char *wrow = static_cast<const char *>(j.w) + t * j.w_stride * (int64_t)(wf32 ? 4 : sizeof(T));
    uint8_t *ft = j.q_fp8 + t * j.f_s0 + 4 * lane;
    float *wo = j.w_out + t * j.wo_stride;
    float wv = 0.0f, my_s = 0.0f;
    for (int hb = h0; hb < h1; hb += 2) {
        const int c0 = h0 + ((hb - h0) & ~31); /* this 32-head chunk: w in, w_out out, coalesced */
        if (hb == c0) wv = c0 + lane < h1 ? mlaf_ld_weight<T>(wrow, wf32, c0 + lane) : 0.0f;
        if (PF) {
            load(hb + 2, nxt[0]);
            load(hb + 3, nxt[1]);
        }
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int h = hb + u;
            if (h < h1) { /* warp-uniform */
                float v[4];
                iq_unpack<2, T>(cur[u], v);
                iq_rope4<T>(v, lane, neox, cc, ss);
                if (j.hadamard) mlaf_idx_hadamard<T>(v, lane);
                const float s = mlaf_idx_scale(v, j.amax_eps, (int)j.scale);
                uint32_t q;
                iq_quant<4, RCP>(v, s, &q);
                iq_st<1>(ft + (int64_t)h * j.f_s1, &q, c.fw);
                if (lane == h - c0) my_s = s;
            }
        }
        if (hb + 2 >= h1 || ((hb + 2 - h0) & 31) == 0)
            if (c0 + lane < h1) wo[c0 + lane] = iq_fold(j, wv, my_s);
        if (PF) {
#pragma unroll
            for (int u = 0; u < 2; u++) cur[u][0] = nxt[u][0], cur[u][1] = nxt[u][1];
        } else {
            load(hb + 2, cur[0]);
            load(hb + 3, cur[1]);
        }
    }
}

/* ---- v3 / v4 / v5: a half-warp per head, 2 heads a step, 2 steps an iteration ------------- */
template <typename T, bool PF, bool RCP>
__global__ void __launch_bounds__(IQ_WARPS * 32) iq_half_kernel(const mlaf_indexer_q_job j, const iq_cfg c) {
    const int lane = threadIdx.x & 31, half = lane >> 4, hl = lane & 15;
    const int item = (int)blockIdx.x * IQ_WARPS + (int)(threadIdx.x >> 5);
    if (item >= c.items) return;
    const int t32 = item / c.ngroups, g = item - t32 * c.ngroups;
    const int64_t t = t32;
    const int h0 = g * c.hg, h1 = min((int)j.H, h0 + c.hg);
    const T *qt = static_cast<const T *>(j.q) + t * j.q_s0 + 8 * hl;
    const bool qvec = c.qvec != 0;
    auto load = [&](int h, uint32_t *x) { /* the lane's 8 values of head h; zeros past the item */
        if (h < h1) iq_ldq<4>(qt + (int64_t)h * j.q_s1, qvec, x);
        else x[0] = x[1] = x[2] = x[3] = 0u;
    };
    uint32_t cur[2][4], nxt[2][4];
    load(h0 + half, cur[0]);
    load(h0 + 2 + half, cur[1]);
    const int64_t pos = mlaf_ld_index(j.rope.positions, j.rope.pos_dt == MLAF_I64, t);
    if (pos < 0 || pos >= j.rope.max_pos) {
        if (g == 0 && lane == 0 && j.error_count) mlaf_cuda_error_count_add(j.error_count, 1);
        return;
    }
    const bool neox = j.rope.style == MLAF_ROPE_NEOX;
    float cc[8], ss[8];
    mlaf_idx_cs8(j.rope.cos_sin + pos * j.rope.cos_sin_stride, hl, neox, c.csvec != 0, cc, ss);
    const bool wf32 = j.w_dt == MLAF_F32;
    const char *wrow = static_cast<const char *>(j.w) + t * j.w_stride * (int64_t)(wf32 ? 4 : sizeof(T));
    uint8_t *ft = j.q_fp8 + t * j.f_s0 + 8 * hl;
    float *wo = j.w_out + t * j.wo_stride;
    float wv = 0.0f, my_s = 0.0f;
    for (int hb = h0; hb < h1; hb += 4) {
        const int c0 = h0 + ((hb - h0) & ~31);
        if (hb == c0) wv = c0 + lane < h1 ? mlaf_ld_weight<T>(wrow, wf32, c0 + lane) : 0.0f;
        if (PF) {
            load(hb + 4 + half, nxt[0]);
            load(hb + 6 + half, nxt[1]);
        }
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int hs = hb + 2 * u; /* heads hs (half 0) and hs + 1 (half 1) */
            if (hs < h1) {             /* warp-uniform */
                const int h = hs + half;
                float v[8];
                iq_unpack<4, T>(cur[u], v);
                mlaf_idx_rope8<T>(v, hl, neox, cc, ss);
                if (j.hadamard) mlaf_idx_hadamard8<T>(v, hl);
                const float s = mlaf_idx_scale8(v, j.amax_eps, (int)j.scale);
                if (h < h1) {
                    uint32_t q[2];
                    iq_quant<8, RCP>(v, s, q);
                    iq_st<2>(ft + (int64_t)h * j.f_s1, q, c.fw);
                }
                const float s_lo = __shfl_sync(IQ_FULL, s, 0), s_hi = __shfl_sync(IQ_FULL, s, 16);
                if (lane == hs - c0) my_s = s_lo;
                if (lane == hs + 1 - c0) my_s = s_hi;
            }
        }
        if (hb + 4 >= h1 || ((hb + 4 - h0) & 31) == 0)
            if (c0 + lane < h1) wo[c0 + lane] = iq_fold(j, wv, my_s);
        if (PF) {
#pragma unroll
            for (int u = 0; u < 2; u++)
#pragma unroll
                for (int k = 0; k < 4; k++) cur[u][k] = nxt[u][k];
        } else {
            load(hb + 4 + half, cur[0]);
            load(hb + 6 + half, cur[1]);
        }
    }
}


/* ---- v6 / v7: flat, a warp per NP pairs of heads of one token, no loop ------------------- */
/* Half h of the warp takes heads 2 NP g + 2 u + h (u < NP); every load is issued before any
 * arithmetic; 8 warps a block, one item per warp, as many warps resident as registers allow. */
#define IQ_FLAT_WARPS 8
template <typename T, int NP>
__global__ void __launch_bounds__(IQ_FLAT_WARPS * 32) iq_flat_kernel(const mlaf_indexer_q_job j, const iq_cfg c) {
    const int lane = threadIdx.x & 31, half = lane >> 4, hl = lane & 15;
    const int item = (int)blockIdx.x * IQ_FLAT_WARPS + (int)(threadIdx.x >> 5);
    if (item >= c.items) return;
    const int t32 = item / c.ngroups, g = item - t32 * c.ngroups;
    const int64_t t = t32;
    const T *qt = static_cast<const T *>(j.q) + t * j.q_s0 + 8 * hl;
    uint32_t x[NP][4];
#pragma unroll
    for (int u = 0; u < NP; u++) {
        const int h = 2 * NP * g + 2 * u + half;
        if (h < j.H) iq_ldq<4>(qt + (int64_t)h * j.q_s1, c.qvec != 0, x[u]);
        else x[u][0] = x[u][1] = x[u][2] = x[u][3] = 0u;
    }
    const bool wf32 = j.w_dt == MLAF_F32;
    const char *wrow = static_cast<const char *>(j.w) + t * j.w_stride * (int64_t)(wf32 ? 4 : sizeof(T));
    float wv[NP];
#pragma unroll
    for (int u = 0; u < NP; u++) {
        const int h = 2 * NP * g + 2 * u + half;
        wv[u] = hl == 0 && h < j.H ? mlaf_ld_weight<T>(wrow, wf32, h) : 0.0f;
    }
    const int64_t pos = mlaf_ld_index(j.rope.positions, j.rope.pos_dt == MLAF_I64, t);
    if (pos < 0 || pos >= j.rope.max_pos) {
        if (g == 0 && lane == 0 && j.error_count) mlaf_cuda_error_count_add(j.error_count, 1);
        return;
    }
    const bool neox = j.rope.style == MLAF_ROPE_NEOX;
    float cc[8], ss[8];
    mlaf_idx_cs8(j.rope.cos_sin + pos * j.rope.cos_sin_stride, hl, neox, c.csvec != 0, cc, ss);
    uint8_t *ft = j.q_fp8 + t * j.f_s0 + 8 * hl;
    float *wo = j.w_out + t * j.wo_stride;
#pragma unroll
    for (int u = 0; u < NP; u++) {
        const int h = 2 * NP * g + 2 * u + half;
        float v[8];
        iq_unpack<4, T>(x[u], v);
        mlaf_idx_rope8<T>(v, hl, neox, cc, ss);
        if (j.hadamard) mlaf_idx_hadamard8<T>(v, hl);
        const float s = mlaf_idx_scale8(v, j.amax_eps, (int)j.scale);
        if (h < j.H) {
            uint32_t q[2];
            iq_quant<8, true>(v, s, q);
            iq_st<2>(ft + (int64_t)h * j.f_s1, q, c.fw);
            if (hl == 0) wo[h] = iq_fold(j, wv[u], s);
        }
    }
}

/* ---- host side: the variants ----------------------------------------------------------- */
struct iq_variant {
    const char *name;
    bool half;
    const void *fn; /* the bf16 instance, for the occupancy query */
    void (*launch)(const mlaf_indexer_q_job &, const iq_cfg &);
    int blocks_per_sm, regs;
    int np; /* flat variants: pairs of heads per warp (hg = 2 np); 0: hg chosen per call */
};

template <bool HALF, bool PF, bool RCP> static void iq_launch(const mlaf_indexer_q_job &j, const iq_cfg &c) {
    const unsigned blocks = (unsigned)((c.items + IQ_WARPS - 1) / IQ_WARPS);
    if constexpr (HALF) {
        if (j.dt == MLAF_F16) iq_half_kernel<__half, PF, RCP><<<blocks, IQ_WARPS * 32>>>(j, c);
        else iq_half_kernel<__nv_bfloat16, PF, RCP><<<blocks, IQ_WARPS * 32>>>(j, c);
    } else {
        if (j.dt == MLAF_F16) iq_warp_kernel<__half, PF, RCP><<<blocks, IQ_WARPS * 32>>>(j, c);
        else iq_warp_kernel<__nv_bfloat16, PF, RCP><<<blocks, IQ_WARPS * 32>>>(j, c);
    }
    CK(cudaGetLastError());
}

template <int NP> static void iq_launch_flat(const mlaf_indexer_q_job &j, const iq_cfg &c) {
    const unsigned blocks = (unsigned)((c.items + IQ_FLAT_WARPS - 1) / IQ_FLAT_WARPS);
    if (j.dt == MLAF_F16) iq_flat_kernel<__half, NP><<<blocks, IQ_FLAT_WARPS * 32>>>(j, c);
    else iq_flat_kernel<__nv_bfloat16, NP><<<blocks, IQ_FLAT_WARPS * 32>>>(j, c);
    CK(cudaGetLastError());
}

static iq_variant variants[] = {
    {"v1 warp", false, (const void *)iq_warp_kernel<__nv_bfloat16, false, false>, iq_launch<false, false, false>, 0, 0},
    {"v2 warp pf rcp", false, (const void *)iq_warp_kernel<__nv_bfloat16, true, true>, iq_launch<false, true, true>, 0, 0},
    {"v3 half", true, (const void *)iq_half_kernel<__nv_bfloat16, false, false>, iq_launch<true, false, false>, 0, 0},
    {"v4 half pf", true, (const void *)iq_half_kernel<__nv_bfloat16, true, false>, iq_launch<true, true, false>, 0, 0},
    {"v5 half pf rcp", true, (const void *)iq_half_kernel<__nv_bfloat16, true, true>, iq_launch<true, true, true>, 0, 0},
    {"v6 flat 2 heads", true, (const void *)iq_flat_kernel<__nv_bfloat16, 1>, iq_launch_flat<1>, 0, 0, 1},
    {"v7 flat 4 heads", true, (const void *)iq_flat_kernel<__nv_bfloat16, 2>, iq_launch_flat<2>, 0, 0, 2},
};
static const int n_variants = (int)(sizeof variants / sizeof variants[0]);

static int g_force_hg = 0; /* --hg */
static int g_sms = 0;

static int round4(int64_t h) { return (int)((h + 3) / 4 * 4); }

/* The largest of {H, 32, 16, 8, 4} (rounded up to a multiple of 4, at most H's) giving at least
 * 2 waves of resident warps; else 4. */
static int auto_hg(const iq_variant &v, int64_t T, int64_t H) {
    if (v.np) return 2 * v.np;
    if (g_force_hg > 0) return g_force_hg;
    const int64_t resident = (int64_t)g_sms * v.blocks_per_sm * IQ_WARPS;
    const int hmax = round4(H);
    const int cand[5] = {hmax, 32, 16, 8, 4};
    for (int i = 0; i < 5; i++) {
        if (cand[i] > hmax || (i > 0 && cand[i] == hmax)) continue;
        if (T * ((H + cand[i] - 1) / cand[i]) >= 2 * resident) return cand[i];
    }
    return 4;
}

static iq_cfg make_cfg(const mlaf_indexer_q_job &j, bool half, int hg) {
    iq_cfg c;
    c.hg = hg;
    c.ngroups = (int32_t)((j.H + hg - 1) / hg);
    const int64_t items = j.T * c.ngroups;
    if (hg < 2 || hg % 2 != 0 || items >= ((int64_t)1 << 31)) {
        fprintf(stderr, "indexer_q_v1: hg = %d (a multiple of 4) with T * groups = %lld (< 2^31) expected\n", hg,
                (long long)items);
        exit(1);
    }
    c.items = (int32_t)items;
    const uintptr_t q = (uintptr_t)j.q, f = (uintptr_t)j.q_fp8;
    c.qvec = half ? q % 16 == 0 && j.q_s0 % 8 == 0 && j.q_s1 % 8 == 0 : q % 8 == 0 && j.q_s0 % 4 == 0 && j.q_s1 % 4 == 0;
    const bool f4 = f % 4 == 0 && j.f_s0 % 4 == 0 && j.f_s1 % 4 == 0;
    c.fw = half && f % 8 == 0 && j.f_s0 % 8 == 0 && j.f_s1 % 8 == 0 ? 8 : f4 ? 4 : 1;
    c.csvec = (uintptr_t)j.rope.cos_sin % 16 == 0 && j.rope.cos_sin_stride % 4 == 0;
    return c;
}

/* ---- views of one problem ---------------------------------------------------------------- */
struct iq_problem {
    int64_t T, H, max_pos;
    int64_t q_s0, q_s1, w_s, f_s0, f_s1, wo_s;
    mlaf_dtype w_dt, pos_dt;
    void *q, *w, *pos;
    float *cs;
    uint8_t *qf;
    float *wo;
    int32_t *err; /* NULL: no error_count */
};

static void views(const iq_problem &p, mlaf_tensor *q, mlaf_tensor *pos, mlaf_tensor *cs, mlaf_tensor *w,
                  mlaf_tensor *qf, mlaf_tensor *wo, mlaf_tensor *ec) {
    *q = mlaf_tensor_3d(p.q, MLAF_BF16, p.T, p.H, MLAF_INDEX_HEAD_DIM, p.q_s0, p.q_s1);
    *pos = mlaf_tensor_1d(p.pos, p.pos_dt, p.T);
    *cs = mlaf_tensor_2d(p.cs, MLAF_F32, p.max_pos, MLAF_INDEX_ROPE_DIM, MLAF_INDEX_ROPE_DIM);
    *w = mlaf_tensor_2d(p.w, p.w_dt, p.T, p.H, p.w_s);
    *qf = mlaf_tensor_3d(p.qf, MLAF_FP8_E4M3, p.T, p.H, MLAF_INDEX_HEAD_DIM, p.f_s0, p.f_s1);
    *wo = mlaf_tensor_2d(p.wo, MLAF_F32, p.T, p.H, p.wo_s);
    *ec = mlaf_tensor_1d(p.err, MLAF_I32, 1);
}

static void api_check(mlaf_context *ctx, mlaf_status st, const char *what) {
    if (st == MLAF_OK) return;
    fprintf(stderr, "indexer_q_v1: %s: %s: %s\n", what, mlaf_status_name(st), mlaf_context_last_error(ctx));
    exit(1);
}

/* v0: the library as it ships. */
static void run_library(mlaf_context *ctx, const mlaf_indexer_params &ip, const iq_problem &p) {
    mlaf_tensor q, pos, cs, w, qf, wo, ec;
    views(p, &q, &pos, &cs, &w, &qf, &wo, &ec);
    api_check(ctx, mlaf_indexer_q(ctx, &ip, &q, &pos, &cs, &w, &qf, &wo, NULL, NULL, p.err ? &ec : NULL),
              "mlaf_indexer_q");
}

/* The library's job for the same call (its checks, its folds), for the new variants. */
static mlaf_indexer_q_job make_job(mlaf_context *ctx, const mlaf_indexer_params &ip, const iq_problem &p) {
    mlaf_tensor q, pos, cs, w, qf, wo, ec;
    views(p, &q, &pos, &cs, &w, &qf, &wo, &ec);
    mlaf_indexer_q_job j;
    api_check(ctx,
              mlaf_check_indexer_q(ctx, &ip, &q, &pos, &cs, &w, &qf, &wo, NULL, NULL, p.err ? &ec : NULL, &j),
              "mlaf_check_indexer_q");
    return j;
}

/* ---- validation ------------------------------------------------------------------------ */
struct iq_layout {
    const char *name;
    int64_t q_s1, q_pad, f_s1, f_pad, w_pad, wo_pad; /* strides: head, then extra per token */
    int q_off, f_off;                                 /* elements / bytes past an aligned base */
    bool wf32, pos32;
    mlaf_index_scale scale;
};

static const iq_layout layouts[] = {
    {"contiguous, bf16 w, i64, ue8m0", 128, 0, 128, 0, 0, 0, 0, 0, false, false, MLAF_INDEX_SCALE_UE8M0},
    {"contiguous, f32 w, i64, f32 scale", 128, 0, 128, 0, 0, 0, 0, 0, true, false, MLAF_INDEX_SCALE_F32},
    {"strides 132 (4-aligned), f32 w, ue8m0", 132, 4, 132, 4, 4, 4, 0, 0, true, false, MLAF_INDEX_SCALE_UE8M0},
    {"odd strides and bases, bf16 w, i32, f32 scale", 131, 3, 129, 1, 3, 1, 1, 1, false, true, MLAF_INDEX_SCALE_F32},
};

static int64_t count_diff(const std::vector<uint8_t> &a, const std::vector<uint8_t> &b) {
    int64_t n = 0;
    for (size_t i = 0; i < a.size(); i++) n += a[i] != b[i];
    return n;
}

static void validate(mlaf_context *ctx, mlaf_context *cpu, int64_t H, int neox, int had, const iq_layout &L) {
    const int64_t T = 999, max_pos = 512, D = MLAF_INDEX_HEAD_DIM;
    const int64_t q_s0 = H * L.q_s1 + L.q_pad, f_s0 = H * L.f_s1 + L.f_pad, w_s = H + L.w_pad, wo_s = H + L.wo_pad;
    const size_t nq = (size_t)(T * q_s0) + L.q_off, nf = (size_t)(T * f_s0) + L.f_off;
    const size_t nw = (size_t)(T * w_s), nwo = (size_t)(T * wo_s);
    dev_rng rng(1000 + H * 4 + neox * 2 + had + 97 * (L.q_off + L.q_pad));

    /* inputs on the host */
    std::vector<uint16_t> q(nq, 0);
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++) {
            const double sc = ldexp(1.0, (int)(rng.uniform() * 41) - 20);
            uint16_t *row = &q[L.q_off + t * q_s0 + h * L.q_s1];
            for (int64_t d = 0; d < D; d++) row[d] = f2bf((float)(sc * rng.normal()));
            if (t == 3) memset(row, 0, D * 2);              /* amax below eps */
            if (t == 4 && h == 0) row[5] = 0x7f80;          /* +inf */
            if (t == 5 && h == H - 1) row[70] = 0x7fc0;     /* NaN */
            if (t == 6) for (int64_t d = 0; d < D; d++) row[d] = (uint16_t)(d & 0x7f); /* subnormals */
        }
    std::vector<uint8_t> w(nw * (L.wf32 ? 4 : 2));
    for (size_t i = 0; i < nw; i++) {
        const float x = (float)rng.normal();
        if (L.wf32) memcpy(&w[4 * i], &x, 4);
        else {
            const uint16_t b = f2bf(x);
            memcpy(&w[2 * i], &b, 2);
        }
    }
    std::vector<int64_t> pos64(T);
    std::vector<int32_t> pos32(T);
    int32_t want_err = 0;
    for (int64_t t = 0; t < T; t++) {
        pos64[t] = t % 37 == 11 ? max_pos + t : t == 500 ? -3 : (int64_t)(rng.uniform() * max_pos);
        pos32[t] = (int32_t)pos64[t];
        want_err += pos64[t] < 0 || pos64[t] >= max_pos;
    }
    std::vector<float> cs((size_t)(max_pos * MLAF_INDEX_ROPE_DIM));
    if (mlaf_rope_table_init(cs.data(), max_pos, MLAF_INDEX_ROPE_DIM, 10000.0) != MLAF_OK) {
        fprintf(stderr, "indexer_q_v1: rope table init failed\n");
        exit(1);
    }

    /* device copies */
    uint16_t *dq;
    void *dw, *dpos;
    float *dcs, *dwo;
    uint8_t *dqf;
    int32_t *derr;
    CK(cudaMalloc(&dq, nq * 2));
    CK(cudaMalloc(&dw, w.size()));
    CK(cudaMalloc(&dpos, T * 8));
    CK(cudaMalloc(&dcs, cs.size() * 4));
    CK(cudaMalloc(&dqf, nf));
    CK(cudaMalloc(&dwo, nwo * 4));
    CK(cudaMalloc(&derr, 4));
    CK(cudaMemcpy(dq, q.data(), nq * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dw, w.data(), w.size(), cudaMemcpyHostToDevice));
    if (L.pos32) CK(cudaMemcpy(dpos, pos32.data(), T * 4, cudaMemcpyHostToDevice));
    else CK(cudaMemcpy(dpos, pos64.data(), T * 8, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dcs, cs.data(), cs.size() * 4, cudaMemcpyHostToDevice));

    iq_problem p;
    p.T = T, p.H = H, p.max_pos = max_pos;
    p.q_s0 = q_s0, p.q_s1 = L.q_s1, p.w_s = w_s, p.f_s0 = f_s0, p.f_s1 = L.f_s1, p.wo_s = wo_s;
    p.w_dt = L.wf32 ? MLAF_F32 : MLAF_BF16, p.pos_dt = L.pos32 ? MLAF_I32 : MLAF_I64;
    p.q = dq + L.q_off, p.w = dw, p.pos = dpos, p.cs = dcs, p.qf = dqf + L.f_off, p.wo = dwo, p.err = derr;
    mlaf_indexer_params ip;
    memset(&ip, 0, sizeof ip);
    ip.style = neox ? MLAF_ROPE_NEOX : MLAF_ROPE_INTERLEAVED;
    ip.hadamard = had;
    ip.ln_eps = 1e-6f;
    ip.amax_eps = 1e-4f;
    ip.scale = L.scale;

    auto reset = [&] {
        CK(cudaMemset(dqf, 0xa5, nf));
        CK(cudaMemset(dwo, 0xa5, nwo * 4));
        CK(cudaMemset(derr, 0, 4));
    };
    auto fetch = [&](std::vector<uint8_t> &f, std::vector<uint8_t> &o, int32_t &e) {
        CK(cudaDeviceSynchronize());
        f.resize(nf), o.resize(nwo * 4);
        CK(cudaMemcpy(f.data(), dqf, nf, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(o.data(), dwo, nwo * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(&e, derr, 4, cudaMemcpyDeviceToHost));
    };

    /* v0 */
    std::vector<uint8_t> f0, o0;
    int32_t e0 = 0;
    reset();
    run_library(ctx, ip, p);
    fetch(f0, o0, e0);
    /* its w_out: written exactly for the valid tokens */
    int64_t wrong_cover = 0;
    for (int64_t t = 0; t < T; t++) {
        const bool ok = pos64[t] >= 0 && pos64[t] < max_pos;
        for (int64_t h = 0; h < H; h++) {
            uint32_t u;
            memcpy(&u, &o0[4 * (t * wo_s + h)], 4);
            wrong_cover += (u == 0xa5a5a5a5u) == ok;
        }
    }
    /* the CPU backend on the same inputs */
    std::vector<uint8_t> fc(nf, 0xa5), oc(nwo * 4, 0xa5);
    int32_t ec = 0;
    {
        iq_problem h = p;
        h.q = q.data() + L.q_off, h.w = w.data(), h.pos = L.pos32 ? (void *)pos32.data() : (void *)pos64.data();
        h.cs = cs.data(), h.qf = fc.data() + L.f_off, h.wo = (float *)oc.data(), h.err = &ec;
        run_library(cpu, ip, h);
    }
    const int64_t cpu_bad = count_diff(f0, fc) + count_diff(o0, oc);
    const bool pass0 = cpu_bad == 0 && e0 == want_err && ec == want_err && wrong_cover == 0;
    printf("  validate H=%-2lld %-11s hadamard %d  %-46s v0: vs CPU backend %lld bytes differ, w_out coverage %lld "
           "wrong, errors %d / cpu %d (want %d)  %s\n",
           (long long)H, neox ? "neox" : "interleaved", had, L.name, (long long)cpu_bad, (long long)wrong_cover, e0, ec,
           want_err, pass0 ? "OK" : "FAIL");
    dev_failures += !pass0;

    /* every new variant at several item sizes against v0 */
    const mlaf_indexer_q_job j = make_job(ctx, ip, p);
    for (int vi = 0; vi < n_variants; vi++) {
        iq_variant &v = variants[vi];
        int64_t bad = 0, err_bad = 0;
        for (int hg : {4, 8, 32, 64}) {
            if (v.np && hg != 4) continue; /* one shape */
            const iq_cfg c = make_cfg(j, v.half, v.np ? 2 * v.np : hg);
            reset();
            v.launch(j, c);
            std::vector<uint8_t> f, o;
            int32_t e = 0;
            fetch(f, o, e);
            bad += count_diff(f, f0) + count_diff(o, o0);
            err_bad += e != e0;
        }
        const bool pass = bad == 0 && err_bad == 0;
        if (!pass) v.regs = -1; /* not timed */
        printf("    %-16s hg 4 / 8 / 32 / 64: %lld bytes differ from v0, error count differs %lld times  %s\n", v.name,
               (long long)bad, (long long)err_bad, pass ? "OK" : "FAIL");
        dev_failures += !pass;
    }
    CK(cudaFree(dq)); CK(cudaFree(dw)); CK(cudaFree(dpos)); CK(cudaFree(dcs));
    CK(cudaFree(dqf)); CK(cudaFree(dwo)); CK(cudaFree(derr));
}

/* ---- timing ------------------------------------------------------------------------------ */
__global__ void iq_fill_bf16(__nv_bfloat16 *p, size_t n, uint64_t seed, float lo, float hi) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
        h ^= h >> 31, h *= 0xBF58476D1CE4E5B9ull, h ^= h >> 29;
        p[i] = __float2bfloat16_rn(lo + (hi - lo) * (float)(h & 0xffffff) * (1.0f / 16777216.0f));
    }
}

/* Words of a and b (n bytes each, 16-byte aligned) that differ, added to *bad. */
__global__ void iq_cmp(const uint8_t *a, const uint8_t *b, size_t n, unsigned long long *bad) {
    unsigned long long k = 0;
    const size_t n16 = n / 16;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n16; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 x = reinterpret_cast<const uint4 *>(a)[i], y = reinterpret_cast<const uint4 *>(b)[i];
        k += (x.x != y.x) + (x.y != y.y) + (x.z != y.z) + (x.w != y.w);
    }
    if (blockIdx.x == 0 && threadIdx.x == 0)
        for (size_t i = n16 * 16; i < n; i++) k += a[i] != b[i];
    if (k) atomicAdd(bad, k);
}

static unsigned long long device_diff(const void *a, const void *b, size_t n, unsigned long long *dbad) {
    CK(cudaMemset(dbad, 0, sizeof *dbad));
    iq_cmp<<<1024, 256>>>((const uint8_t *)a, (const uint8_t *)b, n, dbad);
    CK(cudaGetLastError());
    unsigned long long h = 0;
    CK(cudaMemcpy(&h, dbad, sizeof h, cudaMemcpyDeviceToHost));
    return h;
}

static void time_preset(mlaf_context *ctx, const char *preset, const std::vector<int64_t> &Ts, const flusher &fl) {
    const mlaf_model_config *cfg = mlaf_preset_find(preset);
    if (!cfg || cfg->index_n_heads <= 0) {
        fprintf(stderr, "indexer_q_v1: preset %s with an indexer not found\n", preset);
        exit(1);
    }
    const int64_t H = cfg->index_n_heads, D = MLAF_INDEX_HEAD_DIM;
    mlaf_indexer_params ip = mlaf_indexer_params_from_config(cfg);
    printf("\n-- %s: q_idx [T, %lld, 128] bf16, w [T, %lld] bf16, %s RoPE, %s scales (the bench's inputs)\n", preset,
           (long long)H, (long long)H, ip.style == MLAF_ROPE_NEOX ? "NeoX" : "interleaved",
           ip.scale == MLAF_INDEX_SCALE_UE8M0 ? "UE8M0" : "f32");
    printf("  %-16s %-8s %3s %7s %10s %9s %8s\n", "variant", "hadamard", "hg", "T", "time us", "GB/s", "% memcpy");
    unsigned long long *dbad;
    CK(cudaMalloc(&dbad, sizeof *dbad));
    for (int64_t T : Ts) {
        const int64_t max_pos = T > 65536 ? 65536 : T;
        const size_t n = (size_t)(T * H * D);
        __nv_bfloat16 *q, *w;
        int64_t *pos;
        float *cs, *wo, *wo_ref;
        uint8_t *qf, *qf_ref;
        CK(cudaMalloc(&q, n * 2));
        CK(cudaMalloc(&w, (size_t)(T * H) * 2));
        CK(cudaMalloc(&pos, T * 8));
        CK(cudaMalloc(&cs, (size_t)(max_pos * MLAF_INDEX_ROPE_DIM) * 4));
        CK(cudaMalloc(&qf, n));
        CK(cudaMalloc(&qf_ref, n));
        CK(cudaMalloc(&wo, (size_t)(T * H) * 4));
        CK(cudaMalloc(&wo_ref, (size_t)(T * H) * 4));
        iq_fill_bf16<<<1024, 256>>>(q, n, 0x6d6c6166ull + (uint64_t)T, -2.0f, 2.0f);
        iq_fill_bf16<<<1024, 256>>>(w, (size_t)(T * H), 0x77ull + (uint64_t)T, -1.0f, 1.0f);
        CK(cudaGetLastError());
        {
            std::vector<int64_t> hp(T);
            for (int64_t t = 0; t < T; t++) hp[t] = t % max_pos;
            CK(cudaMemcpy(pos, hp.data(), T * 8, cudaMemcpyHostToDevice));
            std::vector<float> hc((size_t)(max_pos * MLAF_INDEX_ROPE_DIM));
            if (mlaf_rope_table_init(hc.data(), max_pos, MLAF_INDEX_ROPE_DIM, 10000.0) != MLAF_OK) exit(1);
            CK(cudaMemcpy(cs, hc.data(), hc.size() * 4, cudaMemcpyHostToDevice));
        }
        CK(cudaDeviceSynchronize());
        iq_problem p;
        p.T = T, p.H = H, p.max_pos = max_pos;
        p.q_s0 = H * D, p.q_s1 = D, p.w_s = H, p.f_s0 = H * D, p.f_s1 = D, p.wo_s = H;
        p.w_dt = MLAF_BF16, p.pos_dt = MLAF_I64;
        p.q = q, p.w = w, p.pos = pos, p.cs = cs, p.qf = qf, p.wo = wo, p.err = nullptr;
        iq_problem pref = p;
        pref.qf = qf_ref, pref.wo = wo_ref;

        /* the bench's bytes: q_idx, w, positions, a cos / sin row per token in; q_fp8, w_out out */
        const double bytes = (double)n * 2 + (double)T * H * 2 + T * 8.0 + T * 256.0 + (double)n + (double)T * H * 4.0;
        size_t half_bytes = ((size_t)(bytes / 2.0) + 15) / 16 * 16;
        void *ca, *cb;
        CK(cudaMalloc(&ca, half_bytes));
        CK(cudaMalloc(&cb, half_bytes));
        CK(cudaMemset(ca, 3, half_bytes));
        const double copy_us = flushed_us(fl, [&] { CK(cudaMemcpyAsync(cb, ca, half_bytes, cudaMemcpyDeviceToDevice)); }, 21);
        CK(cudaFree(ca));
        CK(cudaFree(cb));
        auto row = [&](const char *name, int had, int hg, double us) {
            char hgs[16];
            if (hg > 0) snprintf(hgs, sizeof hgs, "%d", hg);
            else snprintf(hgs, sizeof hgs, "-");
            printf("  %-16s %-8s %3s %7lld %10.2f %9.0f %7.1f%%\n", name, had < 0 ? "" : had ? "on" : "off", hgs,
                   (long long)T, us, bytes / (us * 1e3), 100.0 * copy_us / us);
        };
        row("memcpy", -1, 0, copy_us);
        for (int had = 0; had < 2; had++) {
            ip.hadamard = had;
            run_library(ctx, ip, pref); /* the reference outputs */
            CK(cudaDeviceSynchronize());
            auto same = [&](const char *name) {
                CK(cudaDeviceSynchronize());
                const unsigned long long b = device_diff(qf, qf_ref, n, dbad) + device_diff(wo, wo_ref, (size_t)(T * H) * 4, dbad);
                if (b) {
                    printf("  %-16s %-8s T=%lld: %llu words differ from v0  FAIL (not timed)\n", name, had ? "on" : "off",
                           (long long)T, b);
                    dev_failures++;
                }
                return b == 0;
            };
            CK(cudaMemset(qf, 0xa5, n));
            CK(cudaMemset(wo, 0xa5, (size_t)(T * H) * 4));
            run_library(ctx, ip, p);
            if (same("v0 library")) row("v0 library", had, 0, flushed_us(fl, [&] { run_library(ctx, ip, p); }, 21));
            const mlaf_indexer_q_job j = make_job(ctx, ip, p);
            for (int vi = 0; vi < n_variants; vi++) {
                const iq_variant &v = variants[vi];
                if (v.regs < 0) continue; /* failed validation */
                const int hg = auto_hg(v, T, H);
                const iq_cfg c = make_cfg(j, v.half, hg);
                CK(cudaMemset(qf, 0xa5, n));
                CK(cudaMemset(wo, 0xa5, (size_t)(T * H) * 4));
                v.launch(j, c);
                if (!same(v.name)) continue;
                row(v.name, had, hg, flushed_us(fl, [&] { v.launch(j, c); }, 21));
            }
        }
        CK(cudaFree(q)); CK(cudaFree(w)); CK(cudaFree(pos)); CK(cudaFree(cs));
        CK(cudaFree(qf)); CK(cudaFree(qf_ref)); CK(cudaFree(wo)); CK(cudaFree(wo_ref));
    }
    CK(cudaFree(dbad));
}

int main(int argc, char **argv) {
    bool quick = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--hg") && i + 1 < argc) g_force_hg = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--quick] [--hg N (a multiple of 4)]\n", argv[0]);
            return 2;
        }
    }
    if (g_force_hg && (g_force_hg < 4 || g_force_hg % 4)) {
        fprintf(stderr, "--hg: a multiple of 4 expected\n");
        return 2;
    }
    printf("== indexer_q v1: the library kernel (v0) against a warp per token's heads (v1, v2) and a half-warp per "
           "head (v3 .. v5)\n");
    print_device();
    g_sms = sm_count();
    for (int vi = 0; vi < n_variants; vi++) {
        iq_variant &v = variants[vi];
        cudaFuncAttributes fa;
        CK(cudaFuncGetAttributes(&fa, v.fn));
        const int wpb = v.np ? IQ_FLAT_WARPS : IQ_WARPS;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v.blocks_per_sm, v.fn, wpb * 32, 0));
        v.regs = fa.numRegs;
        printf("  %-16s %3d registers, %zu B local, %2d blocks of %d warps per SM\n", v.name, fa.numRegs,
               (size_t)fa.localSizeBytes, v.blocks_per_sm, wpb);
    }
    mlaf_context *ctx = nullptr, *cpu = nullptr;
    if (mlaf_context_create(&ctx, MLAF_BACKEND_CUDA) != MLAF_OK || mlaf_context_create(&cpu, MLAF_BACKEND_CPU) != MLAF_OK) {
        fprintf(stderr, "indexer_q_v1: no CUDA or CPU context\n");
        return 1;
    }
    const double copy = copy_gbps();
    printf("device-to-device copy (same run, 512 MB): %.0f GB/s\n", copy);

    printf("\n-- validation: every variant bit-identical to v0 (q_fp8 bytes, w_out bits, error count)\n");
    for (int64_t H : {32, 64, 5})
        for (int neox = 0; neox < 2; neox++)
            for (int had = 0; had < 2; had++)
                for (const iq_layout &L : layouts) validate(ctx, cpu, H, neox, had, L);

    std::vector<int64_t> Ts = {32768};
    if (!quick) Ts = {1024, 4096, 32768, 131072};
    {
        flusher fl;
        time_preset(ctx, "glm-5", Ts, fl);
        time_preset(ctx, "deepseek-v3.2", Ts, fl);
    }
    mlaf_context_free(ctx);
    mlaf_context_free(cpu);
    if (dev_failures) printf("\n%d validation failure(s)\n", dev_failures);
    return dev_failures ? 1 : 0;
}
