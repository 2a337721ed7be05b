/*
 * index_row.cuh — the DSA indexer's row arithmetic on a warp (docs/dsa.md): lane l holds values
 * [4 l, 4 l + 4) of a 128-wide head. The steps and their order are index_math.h's (the CPU
 * backend's), so both backends give the same bits:
 *   1. (key) LayerNorm: each lane sums its four values in order, the warp's xor butterfly
 *      (mlaf_warp_sum); mu = sum / 128; var likewise over (x - mu)^2 (products, no FMA);
 *      y = ((x - mu) * rstd) * w + b; rounded to T.
 *   2. RoPE on dims [0, 64) (lanes 0..15): interleaved pairs are inside a lane; NeoX pairs
 *      (i, i + 32) are lanes l and l ^ 8. Rounded.
 *   3. Hadamard: strides 1 and 2 inside a lane, 4..64 between lanes l and l ^ (stride / 4)
 *      (the lower index keeps a + b, the upper a - b), then * f32(128^-0.5). Rounded.
 *   4. amax by a warp max (fmaxf: NaN ignored), the scale, e4m3(y / s) stored byte by byte
 *      (the index cache's block stride and q_fp8's strides may be odd).
 * Every lane of the warp calls every function (shuffles with the full mask). indexer_q's
 * half-warp layout (8 values a lane) has its own RoPE and Hadamard below, in the same order.
 */
#pragma once

#include "row_writers_fp8.cuh"

#define MLAF_IDX_HADAMARD_K 0.0883883476483184405f /* f32(128^-0.5) */

template <typename T> __device__ __forceinline__ void mlaf_idx_load(const T *row, int lane, float *v) {
#pragma unroll
    for (int k = 0; k < 4; k++) v[k] = mlaf_ld(row + 4 * lane + k);
}

template <typename T>
__device__ __forceinline__ void mlaf_idx_layernorm(float *v, int lane, const void *w, const void *b, bool wf32,
                                                   float eps) {
    const float sum = mlaf_warp_sum(__fadd_rn(__fadd_rn(__fadd_rn(v[0], v[1]), v[2]), v[3]));
    const float mu = __fdiv_rn(sum, 128.0f);
    float d[4], sq;
#pragma unroll
    for (int k = 0; k < 4; k++) d[k] = __fsub_rn(v[k], mu);
    sq = __fmul_rn(d[0], d[0]);
#pragma unroll
    for (int k = 1; k < 4; k++) sq = __fadd_rn(sq, __fmul_rn(d[k], d[k]));
    const float rstd = mlaf_rstd(mlaf_warp_sum(sq), 128, eps);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int64_t i = 4 * lane + k;
        const float y = __fadd_rn(__fmul_rn(__fmul_rn(d[k], rstd), mlaf_ld_weight<T>(w, wf32, i)),
                                  mlaf_ld_weight<T>(b, wf32, i));
        v[k] = mlaf_round_as<T>(y);
    }
}

/* cs: the position's cos_sin row (cos[0..31] | sin[0..31]). */
template <typename T> __device__ __forceinline__ void mlaf_idx_rope(float *v, int lane, bool neox, const float *cs) {
    if (neox) {
        float p[4];
#pragma unroll
        for (int k = 0; k < 4; k++) p[k] = __shfl_xor_sync(0xffffffffu, v[k], 8);
        if (lane < 16) {
            const bool first = lane < 8;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int i = 4 * (lane & 7) + k;
                const float c = __ldg(cs + i), s = __ldg(cs + 32 + i);
                v[k] = mlaf_round_as<T>(first ? mlaf_rope_x0(v[k], p[k], c, s) : mlaf_rope_x1(p[k], v[k], c, s));
            }
        }
    } else if (lane < 16) {
#pragma unroll
        for (int k = 0; k < 4; k += 2) {
            const int i = 2 * lane + k / 2;
            const float c = __ldg(cs + i), s = __ldg(cs + 32 + i), x0 = v[k], x1 = v[k + 1];
            v[k] = mlaf_round_as<T>(mlaf_rope_x0(x0, x1, c, s));
            v[k + 1] = mlaf_round_as<T>(mlaf_rope_x1(x0, x1, c, s));
        }
    }
}

/* The Hadamard's butterflies between lanes (lane ^ 1 .. lane ^ (L / 2), each lane's N values),
 * then the scale and the rounding: the part both lane layouts share. */
template <typename T, int N, int L> __device__ __forceinline__ void mlaf_idx_hadamard_lanes(float *v, int lane) {
#pragma unroll
    for (int m = 1; m < L; m <<= 1) {
        const bool upper = (lane & m) != 0;
#pragma unroll
        for (int k = 0; k < N; k++) {
            const float p = __shfl_xor_sync(0xffffffffu, v[k], m);
            v[k] = upper ? __fsub_rn(p, v[k]) : __fadd_rn(v[k], p);
        }
    }
#pragma unroll
    for (int k = 0; k < N; k++) v[k] = mlaf_round_as<T>(__fmul_rn(v[k], MLAF_IDX_HADAMARD_K));
}

template <typename T> __device__ __forceinline__ void mlaf_idx_hadamard(float *v, int lane) {
    float a, b;
    a = v[0], b = v[1], v[0] = __fadd_rn(a, b), v[1] = __fsub_rn(a, b);
    a = v[2], b = v[3], v[2] = __fadd_rn(a, b), v[3] = __fsub_rn(a, b);
    a = v[0], b = v[2], v[0] = __fadd_rn(a, b), v[2] = __fsub_rn(a, b);
    a = v[1], b = v[3], v[1] = __fadd_rn(a, b), v[3] = __fsub_rn(a, b);
    mlaf_idx_hadamard_lanes<T, 4, 32>(v, lane);
}

/* The scale of a row whose amax is m: mode an mlaf_index_scale (1: f32 amax / 448, else the
 * UE8M0 power of two at or above it). */
__device__ __forceinline__ float mlaf_idx_scale_of(float m, float eps, int mode) {
    const float a = fmaxf(m, eps), q = __fdiv_rn(a, 448.0f);
    if (mode == 1) return q;
    const uint32_t u = __float_as_uint(q);
    const int e = (u & 0x7fffffffu) == 0x7f800000u ? 128 : (int)((u >> 23) & 0xffu) - 127 + ((u & 0x7fffffu) != 0);
    return __uint_as_float((uint32_t)(e + 127) << 23);
}

/* The row's scale (every lane gets it): mode an mlaf_index_scale. */
__device__ __forceinline__ float mlaf_idx_scale(const float *v, float eps, int mode) {
    float m = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; k++) m = fmaxf(m, fabsf(v[k]));
    return mlaf_idx_scale_of(mlaf_warp_max(m, 32), eps, mode);
}

/* The lane's four e4m3 bytes (a word of mlaf_quant_e4m3<4>) at p (any alignment). */
__device__ __forceinline__ void mlaf_idx_store_e4m3(uint8_t *p, uint32_t w) {
    p[0] = (uint8_t)w, p[1] = (uint8_t)(w >> 8), p[2] = (uint8_t)(w >> 16), p[3] = (uint8_t)(w >> 24);
}


/* ---- the half-warp layout (indexer_q): lane hl = lane & 15 of a half holds values
 * [8 hl, 8 hl + 8) of a head; the same steps in the same order as above. ---------------------- */
/* Four f32 at p: one float4 load (vec: p 16-byte aligned) or four. */
__device__ __forceinline__ void mlaf_idx_ld4(const float *p, bool vec, float *o) {
    if (vec) {
        const float4 u = __ldg(reinterpret_cast<const float4 *>(p));
        o[0] = u.x, o[1] = u.y, o[2] = u.z, o[3] = u.w;
    } else {
#pragma unroll
        for (int k = 0; k < 4; k++) o[k] = __ldg(p + k);
    }
}

/* Lane hl's cos (c) and sin (s) for mlaf_idx_rope8 from the position's row cs (cos[0..31] |
 * sin[0..31]); zeros on lanes hl >= 8, which hold no rope dims. vec: float4 loads (cs 16-byte
 * aligned). */
__device__ __forceinline__ void mlaf_idx_cs8(const float *cs, int hl, bool neox, bool vec, float *c, float *s) {
#pragma unroll
    for (int k = 0; k < 8; k++) c[k] = s[k] = 0.0f;
    if (hl >= 8) return;
    const float *p = cs + (neox ? 8 * (hl & 3) : 4 * hl);
    mlaf_idx_ld4(p, vec, c);
    mlaf_idx_ld4(p + 32, vec, s);
    if (neox) {
        mlaf_idx_ld4(p + 4, vec, c + 4);
        mlaf_idx_ld4(p + 36, vec, s + 4);
    }
}

/* RoPE on dims [0, 64) on lane hl of a half (c, s: the cos / sin of its pairs): interleaved
 * pairs 4 hl + k inside the lane (k < 4); NeoX pair (i, i + 32) between lanes hl and hl ^ 4. */
template <typename T>
__device__ __forceinline__ void mlaf_idx_rope8(float *v, int hl, bool neox, const float *c, const float *s) {
    if (neox) {
        float p[8];
#pragma unroll
        for (int k = 0; k < 8; k++) p[k] = __shfl_xor_sync(0xffffffffu, v[k], 4);
        if (hl < 8) {
            const bool first = hl < 4;
#pragma unroll
            for (int k = 0; k < 8; k++)
                v[k] = mlaf_round_as<T>(first ? mlaf_rope_x0(v[k], p[k], c[k], s[k]) : mlaf_rope_x1(p[k], v[k], c[k], s[k]));
        }
    } else if (hl < 8) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float x0 = v[2 * k], x1 = v[2 * k + 1];
            v[2 * k] = mlaf_round_as<T>(mlaf_rope_x0(x0, x1, c[k], s[k]));
            v[2 * k + 1] = mlaf_round_as<T>(mlaf_rope_x1(x0, x1, c[k], s[k]));
        }
    }
}

/* mlaf_idx_hadamard's butterflies in this layout: strides 1, 2, 4 inside the lane, 8 .. 64
 * between lanes hl and hl ^ 1 .. 8. */
template <typename T> __device__ __forceinline__ void mlaf_idx_hadamard8(float *v, int hl) {
#pragma unroll
    for (int m = 1; m < 8; m <<= 1)
#pragma unroll
        for (int i = 0; i < 8; i++)
            if (!(i & m)) {
                const float a = v[i], b = v[i + m];
                v[i] = __fadd_rn(a, b), v[i + m] = __fsub_rn(a, b);
            }
    mlaf_idx_hadamard_lanes<T, 8, 16>(v, hl);
}

/* mlaf_idx_scale in this layout: the half's amax (every lane of the half gets the scale). */
__device__ __forceinline__ float mlaf_idx_scale8(const float *v, float eps, int mode) {
    float m = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; k++) m = fmaxf(m, fabsf(v[k]));
    return mlaf_idx_scale_of(mlaf_warp_max(m, 16), eps, mode);
}

/* Little-endian f32 at any byte address. */
__device__ __forceinline__ void mlaf_idx_store_f32(uint8_t *p, float s) {
    const uint32_t u = __float_as_uint(s);
    p[0] = (uint8_t)u, p[1] = (uint8_t)(u >> 8), p[2] = (uint8_t)(u >> 16), p[3] = (uint8_t)(u >> 24);
}

/* The key branch as a writer of mla_kv_cache's row kernels (row_writers.cuh): side work (kSide),
 * a warp per token's key and threads of their own for its top-k fill, in blocks beside the MLA
 * rows' blocks of the same launch, so the chains of a token run side by side (dev/README.md:
 * against the key row at the MLA row's finish; the fill's 4-byte stores by the key's warp).
 * Token rules are the MLA row's (mlaf_token_decide again, not counted twice): invalid: nothing
 * but the topk fill; slot < 0: the dense output only. */
template <typename T> struct mlaf_wr_index : mlaf_wr_base {
    static constexpr bool kSide = true;
    struct params {
        const void *k, *w, *b;
        int64_t ks;
        int32_t w_f32, neox, hadamard, mode;
        float ln_eps, amax_eps;
        uint8_t *cache;
        int64_t bstride;
        void *out;
        int64_t os;
        int32_t *topk;
        int64_t tks, tkn;
        int32_t copies;      /* >= 1 destination caches, copy_stride bytes apart */
        int64_t copy_stride;
    };
    __device__ __forceinline__ mlaf_wr_index(const params &, const mlaf_row_args &, int64_t,
                                             const mlaf_token_info &) {}
    /* token t's key row, by the whole warp */
    static __device__ __forceinline__ void side(const params &p, const mlaf_row_args &a, int64_t t) {
        if (t >= a.T) return;
        const int lane = threadIdx.x & 31;
        const mlaf_token_info ti = mlaf_token_decide(a, mlaf_token_load(a, t), false);
        if (a.early) mlaf_pdl_begin(); /* PDL setting 2: index_k is read after the wait, the token's indices before */
        if (!ti.ok) return;
        float v[4];
        mlaf_idx_load(static_cast<const T *>(p.k) + t * p.ks, lane, v);
        mlaf_idx_layernorm<T>(v, lane, p.w, p.b, p.w_f32 != 0, p.ln_eps);
        mlaf_idx_rope<T>(v, lane, p.neox != 0, ti.cs);
        if (p.hadamard) mlaf_idx_hadamard<T>(v, lane);
        if (p.out) {
            T *o = static_cast<T *>(p.out) + t * p.os + 4 * lane;
#pragma unroll
            for (int k = 0; k < 4; k++) mlaf_st(o + k, v[k]);
        }
        if (!ti.cache) return;
        const float s = mlaf_idx_scale(v, p.amax_eps, p.mode);
        const int64_t rec = mlaf_token_row(a, ti.slot, p.bstride, MLAF_INDEX_HEAD_DIM);
        /* the scale: after the block's values, 4 bytes per offset */
        const int64_t so = mlaf_token_row(a, ti.slot, p.bstride, 4) + a.block_size * MLAF_INDEX_HEAD_DIM;
        uint32_t w;
        mlaf_quant_e4m3<4>(v, s, &w);
        for (int32_t c = 0; c < p.copies; c++) { /* the same bytes to every destination */
            uint8_t *base = p.cache + (int64_t)c * p.copy_stride;
            mlaf_idx_store_e4m3(base + rec + 4 * lane, w);
            if (lane == 0) mlaf_idx_store_f32(base + so, s);
        }
    }
    /* token t's top-k row set to -1 by thread i of n: 16-byte stores from the row's first 16-byte
     * boundary (the row is 4-byte aligned), 4-byte ones before and after */
    static __device__ __forceinline__ void side_fill(const params &p, const mlaf_row_args &a, int64_t t, int i,
                                                     int n) {
        if (!p.topk || t >= a.T) return;
        int32_t *row = p.topk + t * p.tks;
        const int64_t m = p.tkn, head = min((int64_t)(((16 - ((uintptr_t)row & 15)) & 15) >> 2), m);
        const int64_t nv = (m - head) >> 2;
        int4 *v = reinterpret_cast<int4 *>(row + head);
        for (int64_t k = i; k < head; k += n) row[k] = -1;
        for (int64_t k = i; k < nv; k += n) v[k] = make_int4(-1, -1, -1, -1);
        for (int64_t k = head + 4 * nv + i; k < m; k += n) row[k] = -1;
    }
};
