/*
 * row_core.cuh — the per-row arithmetic of split_qk_norm and mla_kv_cache (docs/mla.md), shared
 * by every launch shape (row_kernels.cuh) and every writer (row_writers.cuh).
 *
 * A latent row is [q (Q) | kv (C) | pe (R)]. Per row:
 *   1. Sums of squares of the q and kv parts in fp32, separately (each lane in vector order, then
 *      a warp / block reduction in a fixed order).
 *   2. rstd = 1 / sqrt(sum / n + eps) with IEEE sqrt and division (not rsqrtf).
 *   3. out = (x * rstd) * w in fp32 products; writers round once at the store.
 *   4. pe part: split_qk_norm passes the raw bits on; mla_kv_cache rotates it with the
 *      position's cos/sin row (separate products, one add / subtract, no FMA contraction: the
 *      same bits as rope_q and the CPU backend).
 *   5. mla_kv_cache's token decision: a position outside [0, max_pos) or a slot past the cache
 *      is counted once and writes neither the cache row nor the dense k_pe row; a negative slot
 *      skips the cache row silently.
 * Rows sit in 16-byte vectors of W values (8 bf16 / f16, 4 f32). The vector shapes give each
 * part of the row its own lane-aligned vectors (mlaf_row_layout), so the part of every vector
 * is known at compile time and the kv part starts at lane 0 (a writer's 128-value tile is a
 * half-warp).
 * All offsets are 64-bit; nothing allocates or synchronizes with the host.
 */
#pragma once

#include "row_math.cuh"

/* Everything the row arithmetic and the token decision need, by value (one kernel argument
 * block). The outputs belong to the writers (their own params). */
struct mlaf_row_args {
    int64_t T;
    int32_t Q, C, R;
    float eps_q, eps_kv;
    const void *latent;
    int64_t ls;
    const void *w_q, *w_kv;
    int32_t wq_f32, wkv_f32;
    /* mla_kv_cache only */
    const void *pos;
    int32_t pos64;
    int32_t neox;
    int32_t norot;    /* rope style none: the pe part is stored as read, positions are not read */
    const float *cos_sin;
    int64_t cs_stride, max_pos;
    const void *slots;
    int32_t slot64;
    int64_t n_map;    /* slot_mapping entries: rows t >= n_map take slot -1 */
    int64_t n_slots, block_size;
    uint64_t bs_mul;  /* slot / block_size = (slot * bs_mul) >> bs_shift for slot, block_size */
    int32_t bs_shift; /* below 2^31 (mlaf_div_magic) */
    int32_t *err;
    int32_t slot;     /* bulk shape: bytes of a warp's row slot in shared memory */
    int32_t tail;     /* kv_rope_tail (docs/mla.md): kv values [C - tail, C) rotated; R == 0 then */
    int32_t split;    /* block shape: a row's q part in one block, its kv and pe parts in the next */
    int32_t early;    /* block shapes under PDL setting 2: the latent read after the wait, the rest before */
};

/* Per-part vector slots of a warp-per-row shape: lane l's slot s holds vector (s - first) * 32 + l
 * of its part; q slots [0, NQ), kv slots [NQ, NQ + NC), pe slots after. A part may have fewer
 * vectors than its slots hold (the lanes past its end hold none). */
template <int NQ_, int NC_, int NP_> struct mlaf_row_layout {
    static constexpr int NQ = NQ_, NC = NC_, NP = NP_, NS = NQ_ + NC_ + NP_;
};

/* Resident blocks of 4 warps per SM a warp-per-row kernel of NS slots is compiled for: what the
 * register allocation must allow (the row takes 4 registers a slot). The bulk shape keeps its
 * NQ + NC weight vectors in registers instead, and is compiled for NQ + NC + 1 slots. Seven
 * slots (DeepSeek-V4's bulk row, 72 registers) at 7 blocks: 3% less time than 6 at T >= 32768. */
template <int NS> struct mlaf_row_minb4 {
    static constexpr int value = NS <= 6 ? 8 : NS <= 7 ? 7 : NS <= 9 ? 6 : NS <= 11 ? 5 : NS <= 13 ? 4 : NS <= 16 ? 3 : 2;
};

/* The raw per-token indices of mla_kv_cache, loaded with the row so that their latency
 * overlaps the row's instead of preceding it. */
struct mlaf_token_idx {
    int64_t slot, pos;
};

__device__ __forceinline__ mlaf_token_idx mlaf_token_load(const mlaf_row_args &a, int64_t t) {
    mlaf_token_idx ix;
    ix.slot = t < a.n_map ? mlaf_ld_index(a.slots, a.slot64, t) : -1;
    ix.pos = (a.R > 0 && !a.norot) || a.tail > 0 ? mlaf_ld_index(a.pos, a.pos64, t) : 0;
    return ix;
}

/* Per-token decision of mla_kv_cache (split_qk_norm: every token ok, no cache row). */
struct mlaf_token_info {
    const float *cs; /* cos row of the position; NULL when R == 0, style none or the token is invalid */
    int64_t slot;    /* the cache slot when cache */
    bool ok;         /* position and slot usable: write k_pe and (cache) the cache row */
    bool cache;      /* ok and slot >= 0 */
};

__device__ __forceinline__ mlaf_token_info mlaf_token_none() {
    mlaf_token_info ti;
    ti.cs = nullptr, ti.slot = -1, ti.ok = true, ti.cache = false;
    return ti;
}

/* count: this thread counts an invalid token (one thread per row). */
__device__ __forceinline__ mlaf_token_info mlaf_token_decide(const mlaf_row_args &a, mlaf_token_idx ix,
                                                             bool count) {
    mlaf_token_info ti;
    bool pos_ok = true;
    ti.cs = nullptr;
    if ((a.R > 0 && !a.norot) || a.tail > 0) {
        pos_ok = ix.pos >= 0 && ix.pos < a.max_pos;
        if (pos_ok) ti.cs = a.cos_sin + ix.pos * a.cs_stride;
    }
    ti.slot = ix.slot;
    ti.ok = pos_ok && ix.slot < a.n_slots;
    ti.cache = ti.ok && ix.slot >= 0;
    if (!ti.ok && count && a.err) mlaf_cuda_error_count_add(a.err, 1);
    return ti;
}

/* Element (or byte) offset of the cache row of a valid slot in a cache of block stride s0 and
 * slot stride s1. Slot and block_size below 2^31 (every real cache) divide by one 64-bit
 * multiply and shift with the host's constants (mlaf_div_magic: exact for every such slot);
 * larger ones take the 64-bit division. */
__device__ __forceinline__ int64_t mlaf_token_row(const mlaf_row_args &a, int64_t slot, int64_t s0, int64_t s1) {
    if ((((uint64_t)slot | (uint64_t)a.block_size) >> 31) == 0) {
        const uint32_t s = (uint32_t)slot, b = (uint32_t)a.block_size,
                       blk = (uint32_t)(((uint64_t)s * a.bs_mul) >> a.bs_shift);
        return (int64_t)blk * s0 + (int64_t)(s - blk * b) * s1;
    }
    return (slot / a.block_size) * s0 + (slot % a.block_size) * s1;
}

/* RoPE's cos / sin: lane i loads pair i's (i < 32, R <= 64) as soon as the position is known, so
 * their latency overlaps the reductions; mlaf_rope_vec hands them to the lanes that hold the
 * pairs. Longer rows and NeoX load their own there. */
__device__ __forceinline__ void mlaf_rope_cs_early(const mlaf_row_args &a, const float *cs, int lane, float &c,
                                                   float &s) {
    const int h = a.R / 2;
    c = 0.0f, s = 0.0f;
    if (cs && h <= 32 && lane < h) c = __ldg(cs + lane), s = __ldg(cs + h + lane);
}

/* Rotates f, the W values of pe vector l (raw: its bits), in place. Every lane of the warp calls
 * it with its own vector (interleaved pairs take their cos / sin from the lane that loaded them;
 * NeoX pairs value i with i + R/2, held by lane l +- rv/2, which needs R/2 to be a multiple of
 * W). cs NULL: nothing to rotate (the token is invalid, or style none). */
template <typename T>
__device__ __forceinline__ void mlaf_rope_vec(const mlaf_row_args &a, const float *cs, int l, int rv, uint4 raw,
                                              float *f, float c0, float s0) {
    constexpr int W = mlaf_vec<T>::W;
    const int h = a.R / 2;
    if (a.neox) {
        const int hv = rv >> 1;
        const bool first = l < hv;
        const int src = l < rv ? (first ? l + hv : l - hv) : l;
        uint4 p;
        p.x = __shfl_sync(0xffffffffu, raw.x, src), p.y = __shfl_sync(0xffffffffu, raw.y, src);
        p.z = __shfl_sync(0xffffffffu, raw.z, src), p.w = __shfl_sync(0xffffffffu, raw.w, src);
        if (!cs || l >= rv) return;
        float g[W];
        mlaf_vec<T>::unpack(p, g);
        const int i0 = (first ? l : l - hv) * W;
#pragma unroll
        for (int k = 0; k < W; k++) {
            const float c = __ldg(cs + i0 + k), s = __ldg(cs + h + i0 + k);
            f[k] = first ? mlaf_rope_x0(f[k], g[k], c, s) : mlaf_rope_x1(g[k], f[k], c, s);
        }
    } else {
        float pc[W / 2], ps[W / 2];
#pragma unroll
        for (int k = 0; k < W / 2; k++) {
            const int i = (W / 2) * l + k;
            pc[k] = __shfl_sync(0xffffffffu, c0, i & 31), ps[k] = __shfl_sync(0xffffffffu, s0, i & 31);
            if (h > 32 && cs && l < rv) pc[k] = __ldg(cs + i), ps[k] = __ldg(cs + h + i);
        }
        if (!cs) return;
#pragma unroll
        for (int k = 0; k < W / 2; k++) {
            const float x0 = f[2 * k], x1 = f[2 * k + 1];
            f[2 * k] = mlaf_rope_x0(x0, x1, pc[k], ps[k]);
            f[2 * k + 1] = mlaf_rope_x1(x0, x1, pc[k], ps[k]);
        }
    }
}

/* v rounded to T and back: the dense output's value of an fp32 result (generic hooks, kv_rope_tail). */
template <typename T> __device__ __forceinline__ float mlaf_round_as(float v) {
    if constexpr (sizeof(T) == 4) return v;
    else if constexpr (std::is_same<T, __half>::value) return __half2float(__float2half_rn(v));
    else return __bfloat162float(__float2bfloat16_rn(v));
}

/* kv_rope_tail: the cos / sin of kv vector j's W/2 pairs (j = -1: none here, load them). */
template <typename T> struct mlaf_tail_cs {
    float c[mlaf_vec<T>::W / 2], s[mlaf_vec<T>::W / 2];
    int j;
};

/* Lane l's pair of the tail's last 32, p0 + l with p0 = max(tail / 2 - 32, 0): loaded as soon as
 * the position is known, so their latency overlaps the row's reductions (as mlaf_rope_cs_early
 * does for the pe part), in two registers a lane; mlaf_tail_gather hands them to the lanes whose
 * vectors hold those pairs. */
struct mlaf_tail_lane {
    float c, s;
};

__device__ __forceinline__ mlaf_tail_lane mlaf_tail_early(const mlaf_row_args &a, const float *cs, int lane) {
    mlaf_tail_lane e;
    e.c = 0.0f, e.s = 0.0f;
    const int h = a.tail >> 1, p = max(h - 32, 0) + lane;
    if (a.tail > 0 && cs && p < h) e.c = __ldg(cs + p), e.s = __ldg(cs + h + p);
    return e;
}

/* The cos / sin of the lane's kv vector j from the warp's mlaf_tail_early pairs (every lane of the
 * warp calls it, each with its own j; j = -1 in the result when vector j is not among the last 32
 * pairs' vectors or the token is rejected). */
template <typename T>
__device__ __forceinline__ mlaf_tail_cs<T> mlaf_tail_gather(const mlaf_row_args &a, const float *cs,
                                                            const mlaf_tail_lane &e, int j) {
    constexpr int W = mlaf_vec<T>::W;
    mlaf_tail_cs<T> g;
    g.j = -1;
    if (a.tail == 0) return g; /* the same for every lane */
    const int p0 = max((a.tail >> 1) - 32, 0), pj = (j * W - (a.C - a.tail)) >> 1; /* vector j's first pair */
#pragma unroll
    for (int k = 0; k < W / 2; k++) {
        g.c[k] = __shfl_sync(0xffffffffu, e.c, (pj + k - p0) & 31);
        g.s[k] = __shfl_sync(0xffffffffu, e.s, (pj + k - p0) & 31);
    }
    if (cs && pj >= p0 && j * W < a.C) g.j = j;
    return g;
}

/* kv_rope_tail (docs/mla.md): kv vector j, normalized (f, fp32) and packed (o, rounded to T). When
 * it lies in the tail [C - tail, C) (the launch keeps C - tail a multiple of W, so a vector is
 * wholly in or out and holds whole interleaved pairs), its rounded values are rotated in fp32,
 * pair p of the tail with cs[p], cs[tail / 2 + p] (the shared no-FMA rotation; taken from `pre`
 * when it was loaded early for this vector), and packed again; cs NULL (a rejected token): left
 * as is. Returns whether the vector is in the tail. */
template <typename T>
__device__ __forceinline__ bool mlaf_tail_vec(const mlaf_row_args &a, const float *cs, int j, float *f, uint4 &o,
                                              const mlaf_tail_cs<T> &pre) {
    constexpr int W = mlaf_vec<T>::W;
    const int v0 = j * W - (a.C - a.tail);
    if (a.tail == 0 || v0 < 0) return false;
    if (!cs) return true;
    mlaf_vec<T>::unpack(o, f);
    const int h = a.tail >> 1;
#pragma unroll
    for (int k = 0; k < W / 2; k++) {
        const int p = (v0 >> 1) + k;
        const float c = pre.j == j ? pre.c[k] : __ldg(cs + p), s = pre.j == j ? pre.s[k] : __ldg(cs + h + p);
        const float x0 = f[2 * k], x1 = f[2 * k + 1];
        f[2 * k] = mlaf_rope_x0(x0, x1, c, s);
        f[2 * k + 1] = mlaf_rope_x1(x0, x1, c, s);
    }
    o = mlaf_vec<T>::pack(f);
    return true;
}

/* out = (x * r) * w per value, the weights vector (as stored: T or f32) at element i. */
template <typename T>
__device__ __forceinline__ void mlaf_scale_vec(float *f, float r, const void *w, bool wf32, int64_t i) {
    constexpr int W = mlaf_vec<T>::W;
    float wv[W];
    mlaf_ld_weights_vec<T>(w, wf32, i, wv);
#pragma unroll
    for (int k = 0; k < W; k++) f[k] = __fmul_rn(__fmul_rn(f[k], r), wv[k]);
}
template <typename T> __device__ __forceinline__ void mlaf_scale_vec_w(float *f, float r, uint4 w) {
    constexpr int W = mlaf_vec<T>::W;
    float wv[W];
    mlaf_vec<T>::unpack(w, wv);
#pragma unroll
    for (int k = 0; k < W; k++) f[k] = __fmul_rn(__fmul_rn(f[k], r), wv[k]);
}
