/*
 * norm_common.cuh — the one row kernel behind split_qk_norm and mla_kv_cache (docs/mla.md).
 *
 * Algorithm, per latent row t = [q part (Q) | kv part (C) | pe part (R)]:
 *   1. One warp owns the row. (mla_kv_cache: it also reads positions[t] and slot_mapping[t]
 *      and decides whether the token is valid; an invalid one is counted once, by lane 0.)
 *   2. Every lane issues all of its loads of the row before any arithmetic, so the whole row
 *      is in flight at once and then sits in registers (fast path) — this is also what makes
 *      the in-place form safe: each element is read and later written by the same lane, and
 *      no lane writes an element another lane reads from global memory.
 *   3. Sums of squares of the q and kv parts, in fp32, separately; warp-shuffle reductions.
 *   4. rstd = 1 / sqrt(sum / n + eps) with IEEE sqrt and division (not rsqrtf).
 *   5. out = (x * rstd) * w in fp32, rounded once at the store (round to nearest even).
 *   6. pe part: split_qk_norm copies the raw bits; mla_kv_cache rotates them with the
 *      position's cos/sin (separate products, one add/subtract, no FMA contraction, the same
 *      expression as rope_q and the CPU backend) and writes [k_nope | rope(k_pe)] into the
 *      paged cache, converted from fp32 straight to the cache dtype.
 *
 * Two paths, chosen per call on the host:
 *   fast:    16-byte vectors (8 bf16/f16, 4 f32). Needs Q, C, R multiples of the vector width
 *            W (so no vector straddles a part boundary), 16-byte aligned pointers and row
 *            strides for latent, dense outputs and weights, a cache aligned to its vector
 *            store width, and a row of at most 32 * 24 vectors. The per-lane vector count NV
 *            is a template parameter so the row lives in registers with unrolled loops.
 *            NeoX rope stages the R raw pe values of each warp in shared memory (pairs (i,
 *            i + R/2) sit in different vectors owned by different lanes); needs R <= 512.
 *   generic: any alignment and widths; element-wise, still coalesced (lane-strided), two
 *            passes over the row (the second pass re-reads from L1/L2).
 *
 * Launch modes (measured on the H200, dev/README.md; split_qk_norm_v4, mla_kv_cache_v1):
 *   BLK  (T <= 4 rows per SM) one 256-thread block per row, 1-4 vectors per thread, weights
 *        and token indices loaded with the row, one barrier joins the warp sums: a small-T
 *        call is the dependency chain of one row, and in a warp-per-row kernel most of it was
 *        the warp's own unrolled instructions (GLM T = 1: 1.6 us vs 2.7 us per graph call).
 *        split_qk_norm's small-T mode.
 *   BLKR mla_kv_cache's small- and mid-T mode: norm warps (as BLK's for 256 norm threads)
 *        plus a rope warp that owns the pe part, so the position -> cos/sin -> rotation chain
 *        runs beside the norm chain instead of after the block barrier and the rstd. Three
 *        shapes, each while the call fits one wave of it: 256 norm threads up to 2 rows per SM
 *        (4 for rows of <= 128 or > 512 vectors), then 128 (2 or 4 vectors per thread) and 64
 *        (4 per thread): fewer threads per row, more rows per SM (DeepSeek-V3 bf16: 4, 6, 8).
 *   WAVE (larger T) 4 warps (128 threads) per block, one row per warp, grid ceil(T / 4);
 *        WAVE1 (from 32768 rows, rows of 6 or 9 vectors per lane) the same kernel in blocks of
 *        one warp, 4x the resident blocks (mlaf_row_wpb); for mla_kv_cache rows of 6 vectors
 *        per lane (GLM-4.7-Flash) lane 0 also prefetches into L2 the cos/sin row of the token
 *        one wave ahead (H200, T = 32768: 47.38-47.63 vs 47.65-48.24 us, same calls; rows of 9
 *        vectors lost 0.9 us at 131072 with it). One
 *        warp per row keeps the reductions to shuffles with no block barrier; a GLM-4.7-Flash
 *        bf16 row is 168 vectors = 5.25 per lane and a DeepSeek-V3 row 264 = 8.25 per lane,
 *        so rows of these models need NV = 6 and NV = 9, and the register cap keeps ~25-30
 *        rows (~80-100 KB) of loads in flight per SM: 97-98% of copy at T = 131072.
 *   KF   (the presets' bf16 / f16 rows: q, kv and pe at fixed slots of each lane) the row
 *        layout is a template parameter, so the per-slot part tests compile away (not in
 *        STAGE, whose 40 registers then spilled); for mla_kv_cache with interleaved RoPE and the
 *        cache in the latent dtype, each pe lane also rotates its W / 2 adjacent pairs in
 *        registers (cos / sin shuffled from the lanes that fetched them) and stores 16 bytes
 *        instead of a shared-memory stage, two warp barriers and pair stores. H200, graph
 *        replay, buffers rotated past L2: mla_kv_cache DeepSeek-V3 WAVE T = 1536 6.05 vs 7.15
 *        us, split_qk_norm 5.80 vs 6.55; flushed T = 32768 split_qk_norm 71.0-71.2 vs 72.8-73.1,
 *        mla_kv_cache STAGE 76.5-77.1 vs 77.3-78.2 (dev/README.md). mla_kv_cache takes PIPE's
 *        kernel for KF rows past the BLKR shapes up to one PIPE wave (its register budget gives
 *        a shorter schedule: DeepSeek-V3 T = 2048 6.66 vs WAVE 6.92 us).
 *   WAVEW (mla_kv_cache rows without KF, up to 3 WAVE blocks per SM, 4 for rows of 9 vectors per
 *        lane, weights in the latent dtype) WAVE, but each block stages the weights in shared
 *        memory once, while its warps' rows are in flight: in a call of less than a wave every
 *        warp otherwise meets the weights' L2 latency after its reductions (DeepSeek-V3 T =
 *        1536, pe-stage kernels: 6.51 vs 7.14 us).
 *   STAGE1 (sm_90, from 32768 rows: KF rows with weights in the latent dtype; else WAVE1)
 *        WAVE1's grid and registers, but lane 0 brings the row into the warp's shared-memory
 *        slot with one bulk copy on an mbarrier, and while it lands the lanes load the token's
 *        indices and the row's weight vectors (as stored) into the registers the row no longer
 *        takes, so the output loop meets no load (GLM rows 64 registers, DeepSeek-V3 rows 80,
 *        no spill). Same arithmetic, same bits. H200, mlafuse bench, T = 32768, same calls:
 *        mla_kv_cache GLM 47.04-47.49 vs 47.49-48.02 us (92.1-93.0% vs 91.1-92.1% of copy),
 *        DeepSeek-V3 71.3-71.5 vs 72.3-72.9; split_qk_norm GLM 44.0-44.2 vs 44.7, DeepSeek-V3
 *        67.7-68.5 vs 68.6-68.8 (dev/README.md).
 *   STAGE (dev/ only; sm_90) WAVE's shape, but lane 0 brings the row into
 *        the warp's shared-memory slot with one bulk copy on an mbarrier and the lanes read
 *        their vectors from the slot (40 registers, 12 resident blocks). It beat WAVE at large
 *        T while WAVE's loads were ld.global.cs; with the loads below WAVE is ahead at every T
 *        (H200, `mla_kv_cache_v1 --train`, us, single call / 20 calls back to back, T =
 *        32768: split GLM 43.7-44.0 vs 45.3-45.6, DeepSeek-V3 68.5-68.8 vs 71.6-71.9; mla
 *        GLM 47.8-48.5 vs 49.4-50.0, DeepSeek-V3 73.2-73.3 vs 76.4-76.5; T = 131072 split
 *        170.0-170.4 vs 171.3-171.7 and 267.3-267.6 vs 269.9-270.2, mla 182.4-182.8 vs
 *        182.9-183.1 and 280.1 vs 285.5).
 * Cache policy of the row's loads and the outputs' stores (every mode): ld.global.cg and
 *   st.global.cg, the default L2 policy. With evict-first (ld.global.cs / st.global.cs, the
 *   earlier policy) the same WAVE kernel was slower: H200, T = 32768 single call,
 *   split GLM 46.6 vs 44.8 us, DeepSeek-V3 72.4 vs 69.3, mla DeepSeek-V3 77.8 vs 74.5; 20
 *   calls back to back (where a call cannot leave more of its writes in L2 than the last one
 *   of the train) 47.7 vs 47.1, 73.2 vs 71.9, 79.4 vs 76.6; T = 131072 mla DeepSeek-V3 299.0
 *   vs 279.3. Plain C++ loads and stores measured the same but made ptxas spill the KF
 *   kernels; the .cg intrinsics keep their registers. .cg is coherent at L2, so the in-place
 *   form stays safe.
 *   PIPE (persistent grid, next row prefetched): mla_kv_cache between 1 and 1.3 waves of
 *        WAVE blocks (DeepSeek-V3 T = 4096: 12.7 vs 14.1 us); it lost to WAVE elsewhere. LAT
 *        (weights in registers, no cap) lost to WAVE / BLK and, like PIPE for split_qk_norm and
 *        BLK with the cache epilogue (BLKR replaces it), exists only in the dev/ programs
 *        (MLAF_ROW_DEV_MODES). So does RUN (each warp a run of rows, the next token's
 *        position and slot loaded one row ahead, so the cos/sin fetch leaves with the row's
 *        loads): it tested whether mla_kv_cache's dependent position -> cos/sin load limits
 *        large T, and it does not (RUN 2 ties WAVE, longer runs lose; H200, dev/README.md).
 *        And TILE (each warp streams its rows through a ring of shared-memory slots, bulk loads
 *        and bulk stores, persistent grid): bit-identical, 67-87% of copy where STAGE got
 *        86-98%.
 * All offsets are 64-bit. No allocation, no host sync: graph capturable.
 */
#pragma once

#include "cuda/row_math.cuh" /* the vectors, conversions and row arithmetic are the library's */

/* Everything the row kernel needs, by value (one kernel argument block). */
struct mlaf_row_args {
    int64_t T;
    int32_t Q, C, R;
    float eps_q, eps_kv;
    const void *latent;
    int64_t ls;
    const void *w_q, *w_kv;
    int32_t wq_f32, wkv_f32;
    void *q;
    int64_t qs;
    void *k_nope; /* may be NULL in mla_kv_cache */
    int64_t ks;
    void *k_pe;   /* may be NULL */
    int64_t ps;
    /* mla_kv_cache only */
    const void *pos;
    int32_t pos64;
    int32_t neox;
    const float *cos_sin;
    int64_t cs_stride, max_pos;
    const void *slots;
    int32_t slot64;
    mlaf_dtype cache_dt;
    void *cache;
    int64_t n_slots, block_size, c_s0, c_s1;
    uint64_t bs_mul; /* slot / block_size = (slot * bs_mul) >> bs_shift for slot, block_size */
    int32_t bs_shift; /* below 2^31 (set by mlaf_row_launch) */
    int32_t *err;
    int32_t run;  /* RUN mode: rows per warp */
    int32_t slot; /* STAGE / TILE modes: bytes of a warp's row slot in shared memory */
    int32_t ring; /* TILE mode: row slots per warp */
    int32_t tile_lanes; /* TILE mode: the lanes store the outputs (else bulk stores) */
    int64_t cs_ahead;   /* > 0 (WAVE1 / STAGE1, mla_kv_cache, rows of 6 vectors per lane): cos/sin look-ahead */
};

#ifndef MLAF_ROW_WARPS /* dev/ builds may try other block sizes (-DMLAF_ROW_WARPS=1 / 2) */
#define MLAF_ROW_WARPS 4
#endif
#define MLAF_ROW_NV_MAX 24
#define MLAF_ROW_PE_STAGE_MAX 1024

/* The raw per-token indices of mla_kv_cache, loaded early (with the row) so that their
 * latency overlaps the row's instead of preceding it. */
struct mlaf_token_idx {
    int64_t slot, pos;
};

__device__ __forceinline__ mlaf_token_idx mlaf_token_load(const mlaf_row_args &a, int64_t t) {
    mlaf_token_idx ix;
    ix.slot = mlaf_ld_index(a.slots, a.slot64, t);
    ix.pos = a.R > 0 ? mlaf_ld_index(a.pos, a.pos64, t) : 0;
    return ix;
}

/* Per-token decisions of mla_kv_cache: rope row (or NULL: the token is invalid) and slot. */
struct mlaf_token_info {
    const float *cs; /* cos row of the position; NULL when R == 0 */
    int64_t slot;
    bool ok;         /* position and slot usable: write k_pe and (slot >= 0) the cache row */
};

__device__ __forceinline__ mlaf_token_info mlaf_token_decide(const mlaf_row_args &a, mlaf_token_idx ix,
                                                             int lane) {
    mlaf_token_info ti;
    ti.slot = ix.slot;
    bool pos_ok = true;
    ti.cs = nullptr;
    if (a.R > 0) {
        pos_ok = ix.pos >= 0 && ix.pos < a.max_pos;
        if (pos_ok) ti.cs = a.cos_sin + ix.pos * a.cs_stride;
    }
    ti.ok = pos_ok && ti.slot < a.n_slots;
    if (!ti.ok && lane == 0 && a.err) atomicAdd(a.err, 1);
    return ti;
}

__device__ __forceinline__ mlaf_token_info mlaf_token(const mlaf_row_args &a, int64_t t, int lane) {
    return mlaf_token_decide(a, mlaf_token_load(a, t), lane);
}

/* Element offset of the cache row of slot (0 <= slot < n_slots). A slot and block_size below
 * 2^31 (every real cache) divide by one 64-bit multiply and shift with the host's constants
 * (mlaf_div_magic: exact for every such slot); larger ones take the 64-bit software
 * division. Both give the same quotient and remainder. */
__device__ __forceinline__ int64_t mlaf_cache_row(const mlaf_row_args &a, int64_t slot) {
    if ((((uint64_t)slot | (uint64_t)a.block_size) >> 31) == 0) {
        const uint32_t s = (uint32_t)slot, b = (uint32_t)a.block_size,
                       blk = (uint32_t)(((uint64_t)s * a.bs_mul) >> a.bs_shift);
        return (int64_t)blk * a.c_s0 + (int64_t)(s - blk * b) * a.c_s1;
    }
    return (slot / a.block_size) * a.c_s0 + (slot % a.block_size) * a.c_s1;
}

/* Rotates one pair with its cos co / sin si and stores it to the dense k_pe row po (may be
 * NULL) and to the cache row at element cidx of cache (may be NULL). Used by both paths so
 * the rotation exists once. */
template <typename T>
__device__ __forceinline__ void mlaf_rope_store(float x0, float x1, float co, float si, int32_t i0,
                                                int32_t i1, T *po, void *cache, mlaf_dtype cdt,
                                                int64_t cidx) {
    const float y0 = mlaf_rope_x0(x0, x1, co, si), y1 = mlaf_rope_x1(x0, x1, co, si);
    if (po) mlaf_st(po + i0, y0), mlaf_st(po + i1, y1);
    if (cache) mlaf_st_dt(cache, cdt, cidx + i0, y0), mlaf_st_dt(cache, cdt, cidx + i1, y1);
}

__device__ __forceinline__ void mlaf_st2_dt(void *base, mlaf_dtype dt, int64_t i, float y0, float y1) {
    if (dt == MLAF_F32) mlaf_st2(static_cast<float *>(base) + i, y0, y1);
    else if (dt == MLAF_BF16) mlaf_st2(static_cast<__nv_bfloat16 *>(base) + i, y0, y1);
    else mlaf_st2(static_cast<__half *>(base) + i, y0, y1);
}

/* The R staged pe values of one row, pairs split over the lanes; the lane's first pair
 * (i = lane) uses co0 / si0, fetched as soon as the position was known. Interleaved pairs are
 * adjacent, so each lane stores its two results as one 4- or 8-byte value: a warp's store
 * covers whole sectors instead of every other element (fast path only: the generic kernel's
 * rows may be unaligned and keep mlaf_rope_store). */
template <typename T, int STRIDE = 32>
__device__ __forceinline__ void mlaf_rope_pairs(const float *stage, const float *cs, float co0, float si0,
                                                int32_t R, int32_t neox, int lane, T *po, void *cache,
                                                mlaf_dtype cdt, int64_t cidx) {
    const int32_t h = R / 2;
#pragma unroll 1 /* one pair per lane for R <= 2 STRIDE; unrolling only held registers */
    for (int32_t i = lane; i < h; i += STRIDE) {
        const bool first = i == lane;
        const float co = first ? co0 : __ldg(cs + i), si = first ? si0 : __ldg(cs + h + i);
        if (neox) {
            mlaf_rope_store<T>(stage[i], stage[i + h], co, si, i, i + h, po, cache, cdt, cidx);
        } else {
            const float2 x = *reinterpret_cast<const float2 *>(stage + 2 * i);
            const float y0 = mlaf_rope_x0(x.x, x.y, co, si), y1 = mlaf_rope_x1(x.x, x.y, co, si);
            if (po) mlaf_st2(po + 2 * i, y0, y1);
            if (cache) mlaf_st2_dt(cache, cdt, cidx + 2 * i, y0, y1);
        }
    }
}

/* ---- fast path ------------------------------------------------------------------------- */
/* Three launch modes of one kernel body:
 *   WAVE  one row per warp, grid ceil(T / 4); the register cap leaves room for many resident
 *         blocks (enough rows in flight to cover HBM latency).
 *   PIPE  persistent grid (resident blocks x SMs); each warp strides over rows and issues the
 *         loads of its next row before reducing and storing the current one, so its load and
 *         store phases overlap and no block is launched per 4 rows. Costs a second row of
 *         registers, hence fewer resident blocks.
 *   LAT   small T: latency, not bandwidth. The weights are loaded into registers together
 *         with the row (and the token's indices), before any arithmetic, so a row costs one
 *         memory latency (plus the dependent cos/sin fetch in mla_kv_cache) instead of one
 *         per weight vector; no register cap. */
enum mlaf_row_mode {
    MLAF_ROW_WAVE = 0, MLAF_ROW_PIPE = 1, MLAF_ROW_LAT = 2, MLAF_ROW_BLK = 3, MLAF_ROW_BLKR = 4,
    MLAF_ROW_RUN = 5, MLAF_ROW_STAGE = 6, MLAF_ROW_TILE = 7, MLAF_ROW_WAVEW = 8,
    MLAF_ROW_WAVE1 = 9 /* WAVE in blocks of one warp (large T) */,
    MLAF_ROW_STAGE1 = 10 /* WAVE1's grid, the row by one bulk copy, the weights loaded meanwhile */
};

/* STAGE: 12 resident blocks (40 registers for the rows of 6 / 9 vectors per lane, both ops). */
#define MLAF_ROW_STAGE_MINB 12

/* Warps per block of each fast mode: 4, but WAVE1, WAVE's kernel in blocks of one warp, which
 * the ops take from MLAF_ROW_WAVE1_FROM_T rows. H200, dev/cuda/mla_kv_cache_v1 built with 1, 2
 * and 4 warps per block, T = 32768 / 131072, us: mla_kv_cache GLM 47.1-47.3 vs 48.2, DeepSeek-V3
 * 72.5-72.9 vs 73.0-73.1, split_qk_norm DeepSeek-V3 68.3 vs 68.5-68.9, at 131072 0.2-3.1 us
 * faster, split_qk_norm GLM 32768 within 0.3 us. Below a few waves one-warp blocks lose (mlafuse
 * bench, T = 4096: split_qk_norm GLM 11.2 vs 9.5-9.7 us, mla_kv_cache GLM 11.6 vs 10.6). */
template <int MODE> struct mlaf_row_wpb {
    static constexpr int value = MODE == MLAF_ROW_WAVE1 || MODE == MLAF_ROW_STAGE1 ? 1 : MLAF_ROW_WARPS;
};
#define MLAF_ROW_WAVE1_FROM_T 32768
#ifndef MLAF_ROW_CS_AHEAD_WAVES /* dev/ builds may try other look-ahead distances */
#define MLAF_ROW_CS_AHEAD_WAVES 1
#endif

/* Resident blocks of 4 warps per SM each mode's kernel is compiled for (__launch_bounds__): what
 * the register allocation must allow (the row's own registers are 4 * NV per lane, twice that in
 * PIPE). */
template <int NV, int MODE> struct mlaf_row_minb_w4 {
    static constexpr int value = MODE == MLAF_ROW_LAT    ? 1
                                 : MODE == MLAF_ROW_STAGE ? MLAF_ROW_STAGE_MINB
                                 : MODE == MLAF_ROW_TILE ? 1
                                 : MODE == MLAF_ROW_WAVEW ? (NV <= 6 ? 8 : NV <= 9 ? 6 : 2)
                                 : MODE == MLAF_ROW_PIPE ? (NV <= 4 ? 6 : NV <= 6 ? 5 : NV <= 9 ? 4 : 2)
                                 : (NV <= 6 ? 8 : NV <= 9 ? 6 : NV <= 16 ? 3 : 2);
};

/* The same for the mode's own block size (blocks of fewer warps: proportionally more, at most
 * the 32 an SM holds). */
template <int NV, int MODE> struct mlaf_row_minb {
    static constexpr int n = mlaf_row_minb_w4<NV, MODE>::value * 4 / mlaf_row_wpb<MODE>::value;
    static constexpr int value = n > 32 ? 32 : n;
};

template <typename T, int NV>
__device__ __forceinline__ void mlaf_row_load(const mlaf_row_args &a, int64_t t, int lane, int nv, uint4 *v) {
    const uint4 *src = reinterpret_cast<const uint4 *>(static_cast<const T *>(a.latent) + t * a.ls);
    /* uninitialized slots (c >= nv) are never read: every use checks c < nv */
#pragma unroll
    for (int s = 0; s < NV; s++) {
        const int c = lane + 32 * s;
        if (c < nv) v[s] = __ldcg(src + c);
    }
}

/* STAGE: lane 0 of the warp sets up the warp's mbarrier (one arrival per phase). */
__device__ __forceinline__ void mlaf_stage_init(uint64_t *bar, int lane) {
    if (lane == 0) mlaf_bar_init((uint32_t)__cvta_generic_to_shared(bar), 1);
    __syncwarp();
}

/* STAGE / STAGE1: lane 0 starts the bulk copy of the warp's row (bytes, a multiple of 16, 16-byte
 * aligned) into its slot, counted on the warp's mbarrier (sm_90); mlaf_stage_wait returns once
 * every byte has landed (phase `parity`). Elsewhere (dev/ only: the library takes these modes on
 * sm_90 alone) the wait copies the row with the lanes' 16-byte loads instead. */
__device__ __forceinline__ void mlaf_stage_issue(uint64_t *bar, const uint4 *slot, const void *src, int bytes,
                                                 int lane) {
    __syncwarp(); /* every lane is done with the slot's previous row */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (lane == 0) {
        const uint32_t b = (uint32_t)__cvta_generic_to_shared(bar);
        mlaf_fence_async(); /* those reads before the copy */
        mlaf_bar_expect(b, (uint32_t)bytes);
        mlaf_bulk_copy((uint32_t)__cvta_generic_to_shared(slot), src, (uint32_t)bytes, b);
    }
#else
    (void)bar, (void)slot, (void)src, (void)bytes, (void)lane;
#endif
}
__device__ __forceinline__ void mlaf_stage_wait(uint64_t *bar, const uint4 *slot, const void *src, int bytes,
                                                int lane, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    (void)slot, (void)src, (void)bytes, (void)lane;
    mlaf_bar_wait((uint32_t)__cvta_generic_to_shared(bar), parity);
#else
    (void)bar, (void)parity;
    for (int c = lane; c < bytes / 16; c += 32)
        const_cast<uint4 *>(slot)[c] = __ldcg(static_cast<const uint4 *>(src) + c);
    __syncwarp();
#endif
}
/* STAGE: both at once. */
__device__ __forceinline__ void mlaf_stage_row(uint64_t *bar, const uint4 *slot, const void *src, int bytes, int lane,
                                               uint32_t parity) {
    mlaf_stage_issue(bar, slot, src, bytes, lane);
    mlaf_stage_wait(bar, slot, src, bytes, lane, parity);
}

/* The cos/sin look-ahead (GLM-4.7-Flash-shaped mla_kv_cache rows in WAVE1 / STAGE1): lane 0
 * loads the position of the token a.cs_ahead rows (one wave) ahead and prefetches its cos/sin
 * row into L2, so when that token's warp starts, its position -> cos/sin chain meets L2
 * instead of memory. */
__device__ __forceinline__ void mlaf_cs_lookahead(const mlaf_row_args &a, int64_t t, int lane) {
    if (lane == 0 && a.cs_ahead > 0 && t + a.cs_ahead < a.T) {
        const int64_t pf = mlaf_ld_index(a.pos, a.pos64, t + a.cs_ahead);
        if (pf >= 0 && pf < a.max_pos) {
            const float *c = a.cos_sin + pf * a.cs_stride;
            mlaf_prefetch_line_l2(c);
            mlaf_prefetch_line_l2(c + a.R - 1);
        }
    }
}

#ifdef MLAF_ROW_TIMELINE
/* dev/ only (dev/cuda/timeline.cu): per row, lane 0 records the global timer when its warp
 * starts the row, once the row's sums are done (its loads have landed), after its last store
 * is issued, and the SM: mlaf_row_tl[4 t .. 4 t + 3]. */
__device__ unsigned long long *mlaf_row_tl;
#define MLAF_TL_NOW(v, dep) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v) : "f"(dep) : "memory")
#define MLAF_TL_PUT(t, a0, a1)                                                                    \
    do {                                                                                          \
        unsigned long long e_;                                                                    \
        unsigned sm_;                                                                             \
        MLAF_TL_NOW(e_, 0.0f);                                                                    \
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm_));                                          \
        if ((threadIdx.x & 31) == 0) {                                                            \
            unsigned long long *r_ = mlaf_row_tl + 4 * (t);                                      \
            r_[0] = (a0), r_[1] = (a1), r_[2] = e_, r_[3] = sm_;                                  \
        }                                                                                         \
    } while (0)
#endif

/* QS >= 0 (mla_kv_cache, where mlaf_row_kvfast_ok: "KF"): the row's layout is known at compile
 * time (slots 0 .. QS - 1 of every lane are q, QS .. NV - 2 kv, NV - 1 the pe part on lanes
 * 0 .. rv - 1), so the per-slot part tests compile away; the pe part is rotated in registers and
 * the cache row stored as the latent dtype's vectors. Its own instantiation: carrying both pe
 * paths made ptxas spill the bf16 / f16 kernels (up to 64 bytes). */
template <typename T, int NV, bool KV, int MODE, int QS = -1>
__global__ void __launch_bounds__(mlaf_row_wpb<MODE>::value * 32, mlaf_row_minb<NV, MODE>::value)
mlaf_row_fast_kernel(const mlaf_row_args a) {
    constexpr int W = mlaf_vec<T>::W;
    constexpr int WB = mlaf_row_wpb<MODE>::value; /* warps per block */
    constexpr bool PIPE = MODE == MLAF_ROW_PIPE, LAT = MODE == MLAF_ROW_LAT, RUN = MODE == MLAF_ROW_RUN;
    /* STAGE1 (KF layouts, weights in the latent dtype): WAVE1's one row per one-warp block, the
     * row brought into the warp's shared-memory slot by one bulk copy (STAGE's slot, without its
     * run-time layout), and the row's weight vectors loaded into registers while it lands, so
     * the output loop meets no load */
    constexpr bool S1 = MODE == MLAF_ROW_STAGE1;
    static_assert(!S1 || QS >= 0, "STAGE1 is a KF kernel");
    constexpr bool STG = MODE == MLAF_ROW_STAGE || S1;
    /* WAVEW: WAVE, but the block stages the weights (as stored) in shared memory while the warps
     * first rows are in flight, so no warp meets the weights' L2 latency after its reductions */
    constexpr bool WSM = MODE == MLAF_ROW_WAVEW;
    constexpr bool KF = QS >= 0;
    /* dynamic shared memory: STAGE's row slots [WB][a.slot bytes], then the pe
     * stage [WB][R] floats (mla_kv_cache only) */
    extern __shared__ __align__(128) float mlaf_row_smem[];
    float *const mlaf_pe_stage = mlaf_row_smem + (STG ? WB * a.slot / 4 : 0);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int qv = a.Q / W, cv = a.C / W, rv = a.R / W, nv = qv + cv + rv;
    const int64_t nwarps = (int64_t)gridDim.x * WB;

    float wr[LAT ? NV : 1][W];
    if constexpr (LAT) {
#pragma unroll
        for (int s = 0; s < NV; s++) {
            const int c = lane + 32 * s;
            if (c < qv) mlaf_ld_weights_vec<T>(a.w_q, a.wq_f32, (int64_t)c * W, wr[s]);
            else if (c < qv + cv) mlaf_ld_weights_vec<T>(a.w_kv, a.wkv_f32, (int64_t)(c - qv) * W, wr[s]);
        }
    }
    /* rows of this warp: t0, t0 + step, ... below t_end (RUN: a run of a.run rows per warp,
     * interleaved over the block's warps; else a grid stride) */
    int64_t t0 = (int64_t)blockIdx.x * WB + warp, step = nwarps, t_end = a.T;
    if constexpr (RUN) {
        const int64_t b0 = (int64_t)blockIdx.x * WB * a.run;
        t0 = b0 + warp, step = WB;
        t_end = b0 + (int64_t)WB * a.run < a.T ? b0 + (int64_t)WB * a.run : a.T;
    }
    mlaf_token_idx ix = {-1, 0};
    uint4 v[STG ? 1 : NV];
    uint4 wpre[S1 ? NV - 1 : 1]; /* STAGE1: slot s's weight vector (q for s < QS, else kv) */
    /* STAGE: this warp's row slot and its mbarrier (one bulk copy per row) */
    const uint4 *const srow = reinterpret_cast<const uint4 *>(reinterpret_cast<const unsigned char *>(mlaf_row_smem) +
                                                              (STG ? (size_t)warp * a.slot : 0));
    __shared__ __align__(8) uint64_t mlaf_row_bar[STG ? WB : 1];
    if constexpr (STG) mlaf_stage_init(&mlaf_row_bar[warp], lane);
    uint32_t parity = 0;
    if constexpr (PIPE) {
        if (t0 < a.T) {
            if (KV) ix = mlaf_token_load(a, t0);
            mlaf_row_load<T, NV>(a, t0, lane, nv, v);
        }
    }
    if constexpr (RUN && KV) {
        if (t0 < t_end) ix = mlaf_token_load(a, t0);
    }
    /* WAVEW: the weights' vectors as stored (the latent dtype; the host checks), q then kv */
    uint4 *const wsm = reinterpret_cast<uint4 *>(mlaf_pe_stage + (KV ? WB * a.R : 0));
    if constexpr (WSM) {
        if (t0 < a.T) {
            if (KV) ix = mlaf_token_load(a, t0);
            mlaf_row_load<T, NV>(a, t0, lane, nv, v);
        }
        for (int i = threadIdx.x; i < qv + cv; i += WB * 32)
            wsm[i] = __ldg(i < qv ? static_cast<const uint4 *>(a.w_q) + i : static_cast<const uint4 *>(a.w_kv) + (i - qv));
        __syncthreads();
    }

    for (int64_t t = t0; t < t_end; t += step) {
#ifdef MLAF_ROW_TIMELINE
        unsigned long long tl_a, tl_b;
        MLAF_TL_NOW(tl_a, 0.0f);
#endif
        uint4 vn[PIPE ? NV : 1];
        mlaf_token_idx ixn = {-1, 0};
        if constexpr (PIPE) {
            if (t + nwarps < a.T) {
                if (KV) ixn = mlaf_token_load(a, t + nwarps);
                mlaf_row_load<T, NV>(a, t + nwarps, lane, nv, vn);
            }
        } else if constexpr (RUN) {
            /* the token's indices came one row ahead, so its cos/sin fetch below goes out with
             * the row's loads: one memory latency per row instead of two */
            mlaf_row_load<T, NV>(a, t, lane, nv, v);
            if (KV && t + step < t_end) ixn = mlaf_token_load(a, t + step);
        } else if constexpr (S1) {
            mlaf_stage_issue(&mlaf_row_bar[warp], srow, static_cast<const T *>(a.latent) + t * a.ls, nv * 16, lane);
            if (KV) ix = mlaf_token_load(a, t);
#pragma unroll
            for (int s = 0; s < NV - 1; s++) {
                const int c = lane + 32 * s;
                wpre[s] = __ldg(s < QS ? static_cast<const uint4 *>(a.w_q) + c
                                       : static_cast<const uint4 *>(a.w_kv) + (c - qv));
            }
            if constexpr (KV && NV == 6) mlaf_cs_lookahead(a, t, lane);
        } else if constexpr (STG) {
            if (KV) ix = mlaf_token_load(a, t);
            mlaf_stage_row(&mlaf_row_bar[warp], srow, static_cast<const T *>(a.latent) + t * a.ls, nv * 16, lane,
                           parity);
            parity ^= 1u;
        } else if (!WSM || t != t0) {
            if (KV) ix = mlaf_token_load(a, t);
            mlaf_row_load<T, NV>(a, t, lane, nv, v);
            if constexpr (KV && MODE == MLAF_ROW_WAVE1 && NV == 6) mlaf_cs_lookahead(a, t, lane);
        }
        /* vector slot s (column c) of the row: registers, or the row slot (STAGE) */
        auto vec = [&](int s, int c) -> uint4 {
            if constexpr (STG) return srow[c];
            else return v[s];
        };

        mlaf_token_info ti = {nullptr, -1, true};
        float co0 = 0.0f, si0 = 0.0f;
        if (KV) {
            ti = mlaf_token_decide(a, ix, lane);
            /* the lane's first rotation pair, fetched now so it overlaps the reductions */
            if (ti.ok && lane < a.R / 2) co0 = __ldg(ti.cs + lane), si0 = __ldg(ti.cs + a.R / 2 + lane);
        }

        /* slot s (column c) of the lane: q, q or kv (the normed part), in the row */
        /* (STAGE keeps the run-time tests: with the compile-time ones its 40 registers spilled) */
        constexpr bool KL = KF && (!STG || S1);
        if constexpr (S1) {
            mlaf_stage_wait(&mlaf_row_bar[warp], srow, static_cast<const T *>(a.latent) + t * a.ls, nv * 16, lane,
                             parity);
            parity ^= 1u;
        }
        auto is_q = [&](int s, int c) { return KL ? s < QS : c < qv; };
        auto is_n = [&](int s, int c) { return KL ? s < NV - 1 : c < qv + cv; };
        auto in_row = [&](int s, int c) { return KL ? (s < NV - 1 || lane < rv) : c < nv; };
        float sq = 0.0f, skv = 0.0f;
#pragma unroll
        for (int s = 0; s < NV; s++) {
            const int c = lane + 32 * s;
            if (is_n(s, c)) {
                float f[W];
                mlaf_vec<T>::unpack(vec(s, c), f);
                const float acc = mlaf_sumsq<W>(f);
                if (is_q(s, c)) sq += acc;
                else skv += acc;
            }
        }
        sq = mlaf_warp_sum(sq);
        skv = mlaf_warp_sum(skv);
#ifdef MLAF_ROW_TIMELINE
        MLAF_TL_NOW(tl_b, sq + skv);
#endif
        const float rq = a.Q > 0 ? mlaf_rstd(sq, a.Q, a.eps_q) : 0.0f;
        const float rkv = mlaf_rstd(skv, a.C, a.eps_kv);

        const bool write_cache = KV && ti.ok && ti.slot >= 0;
        const int64_t crow = write_cache ? mlaf_cache_row(a, ti.slot) : 0;

#pragma unroll
        for (int s = 0; s < NV; s++) {
            const int c = lane + 32 * s;
            /* KF: the pe vectors are slot NV - 1 of lanes 0 .. rv - 1, each W / 2 adjacent
             * pairs; pair i's cos / sin come from lane i's co0 / si0 (every lane shuffles, here
             * where the row's other registers are free) */
            float pco[KV ? W / 2 : 1], psi[KV ? W / 2 : 1];
            if (KV && KF && s == NV - 1) {
#pragma unroll
                for (int k = 0; k < W / 2; k++) {
                    const int i = ((W / 2) * lane + k) & 31;
                    pco[k] = __shfl_sync(0xffffffffu, co0, i), psi[k] = __shfl_sync(0xffffffffu, si0, i);
                }
            }
            if (!in_row(s, c)) continue;
            float f[W], w[W];
            const uint4 vs = vec(s, c);
            mlaf_vec<T>::unpack(vs, f);
            if (is_q(s, c)) {
                if constexpr (LAT) {
#pragma unroll
                    for (int k = 0; k < W; k++) w[k] = wr[s][k];
                } else if constexpr (WSM) {
                    mlaf_vec<T>::unpack(wsm[c], w);
                } else if constexpr (S1) {
                    mlaf_vec<T>::unpack(wpre[s < NV - 1 ? s : 0], w);
                } else {
                    mlaf_ld_weights_vec<T>(a.w_q, a.wq_f32, (int64_t)c * W, w);
                }
#pragma unroll
                for (int k = 0; k < W; k++) f[k] = __fmul_rn(__fmul_rn(f[k], rq), w[k]);
                __stcg(reinterpret_cast<uint4 *>(static_cast<T *>(a.q) + t * a.qs) + c, mlaf_vec<T>::pack(f));
            } else if (is_n(s, c)) {
                const int j = c - qv;
                if constexpr (LAT) {
#pragma unroll
                    for (int k = 0; k < W; k++) w[k] = wr[s][k];
                } else if constexpr (WSM) {
                    mlaf_vec<T>::unpack(wsm[c], w);
                } else if constexpr (S1) {
                    mlaf_vec<T>::unpack(wpre[s < NV - 1 ? s : 0], w);
                } else {
                    mlaf_ld_weights_vec<T>(a.w_kv, a.wkv_f32, (int64_t)j * W, w);
                }
#pragma unroll
                for (int k = 0; k < W; k++) f[k] = __fmul_rn(__fmul_rn(f[k], rkv), w[k]);
                if (a.k_nope)
                    __stcg(reinterpret_cast<uint4 *>(static_cast<T *>(a.k_nope) + t * a.ks) + j, mlaf_vec<T>::pack(f));
                if (write_cache) {
                    if constexpr (KF) /* the cache is in the latent dtype */
                        *reinterpret_cast<uint4 *>(static_cast<T *>(a.cache) + crow + (int64_t)j * W) =
                            mlaf_vec<T>::pack(f);
                    else
                        mlaf_st_dt_vec<W>(a.cache, a.cache_dt, crow + (int64_t)j * W, f);
                }
            } else if (!KV) {
                if (a.k_pe)
                    __stcg(reinterpret_cast<uint4 *>(static_cast<T *>(a.k_pe) + t * a.ps) + (c - qv - cv), vs);
            } else if (KF && ti.ok) {
                if (s == NV - 1) { /* always, under KF: the pe part is this slot */
#pragma unroll
                    for (int k = 0; k < W / 2; k++) {
                        const float x0 = f[2 * k], x1 = f[2 * k + 1];
                        f[2 * k] = mlaf_rope_x0(x0, x1, pco[k], psi[k]);
                        f[2 * k + 1] = mlaf_rope_x1(x0, x1, pco[k], psi[k]);
                    }
                    const uint4 o = mlaf_vec<T>::pack(f);
                    if (a.k_pe) reinterpret_cast<uint4 *>(static_cast<T *>(a.k_pe) + t * a.ps)[c - qv - cv] = o;
                    if (write_cache)
                        reinterpret_cast<uint4 *>(static_cast<T *>(a.cache) + crow + a.C)[c - qv - cv] = o;
                }
            } else if (ti.ok) {
                /* Raw pe values go to the warp's stage; the rotation runs per pair below. */
                float *stage = mlaf_pe_stage + warp * a.R + (c - qv - cv) * W;
#pragma unroll
                for (int k = 0; k < W; k++) stage[k] = f[k];
            }
        }
        if (KV && !KF && ti.ok && a.R > 0) {
            __syncwarp();
            const float *stage = mlaf_pe_stage + warp * a.R;
            T *po = a.k_pe ? static_cast<T *>(a.k_pe) + t * a.ps : nullptr;
            mlaf_rope_pairs<T>(stage, ti.cs, co0, si0, a.R, a.neox, lane, po,
                               write_cache ? a.cache : nullptr, a.cache_dt, crow + a.C);
            __syncwarp(); /* the stage is reused by the warp's next row */
        }
#ifdef MLAF_ROW_TIMELINE
        MLAF_TL_PUT(t, tl_a, tl_b);
#endif

        if constexpr (PIPE) {
            ix = ixn;
#pragma unroll
            for (int s = 0; s < NV; s++) v[s] = vn[s];
        }
        if constexpr (RUN) ix = ixn;
    }
}

#ifdef MLAF_ROW_DEV_MODES
/* ---- TILE (sm_90, large T) -------------------------------------------------------------- */
/* Each warp streams its rows (grid stride, persistent grid) through a ring of a.ring row slots
 * in shared memory. Lane 0 keeps the warp's next ring - 1 rows in flight as bulk copies (one
 * mbarrier per slot); the lanes compute a row from its slot with WAVE's arithmetic and write
 * the results back into the slot (q and the kv part normalized, mla_kv_cache's pe part roped
 * in place); then lane 0 sends each output out of the slot with one bulk store (q row; k_nope or
 * the cache row [kv | pe], which are adjacent in the slot; k_pe), so no lane waits on a store
 * and loads keep streaming while a row is computed. Same arithmetic and bits as WAVE. Needs
 * outputs that bulk stores can take: the cache in the latent dtype (every offset the fast path
 * admits is then a multiple of 16 bytes). A row is read whole before its stores, and rows are
 * disjoint, so in place stays safe. */
#define MLAF_ROW_TILE_RING 4

template <typename T, int NV, bool KV>
__global__ void __launch_bounds__(MLAF_ROW_WARPS * 32) mlaf_row_tile_kernel(const mlaf_row_args a) {
    constexpr int W = mlaf_vec<T>::W, ES = (int)sizeof(T);
    extern __shared__ __align__(128) unsigned char mlaf_tile_smem[];
    __shared__ __align__(8) uint64_t bars[MLAF_ROW_WARPS * 8];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int qv = a.Q / W, cv = a.C / W, rv = a.R / W, nv = qv + cv + rv;
    const int S = a.ring;
    const int64_t nwarps = (int64_t)gridDim.x * MLAF_ROW_WARPS;
    const int64_t t0 = (int64_t)blockIdx.x * MLAF_ROW_WARPS + warp;
    unsigned char *const ring = mlaf_tile_smem + (size_t)warp * S * a.slot;
    const uint32_t ring_s = (uint32_t)__cvta_generic_to_shared(ring);
    const uint32_t bar0 = (uint32_t)__cvta_generic_to_shared(&bars[warp * 8]);
    const uint32_t rowbytes = (uint32_t)nv * 16;
    const T *const lat = static_cast<const T *>(a.latent);
    if (lane == 0) {
        for (int j = 0; j < S; j++) mlaf_bar_init(bar0 + 8 * j, 1);
        for (int j = 0; j < S - 1; j++) {
            const int64_t t = t0 + j * nwarps;
            if (t >= a.T) break;
            mlaf_bulk_load(ring_s + (uint32_t)(j * a.slot), lat + t * a.ls, rowbytes, bar0 + 8 * j);
        }
    }
    __syncwarp();

    int j = 0;
    uint32_t parity = 0;
    for (int64_t t = t0; t < a.T; t += nwarps) {
        uint4 *const row = reinterpret_cast<uint4 *>(ring + (size_t)j * a.slot);
        mlaf_token_info ti = {nullptr, -1, true};
        float co0 = 0.0f, si0 = 0.0f;
        if (KV) {
            ti = mlaf_token(a, t, lane);
            if (ti.ok && lane < a.R / 2) co0 = __ldg(ti.cs + lane), si0 = __ldg(ti.cs + a.R / 2 + lane);
        }
        mlaf_bar_wait(bar0 + 8 * j, parity);

        float sq = 0.0f, skv = 0.0f;
#pragma unroll
        for (int s = 0; s < NV; s++) {
            const int c = lane + 32 * s;
            if (c < qv + cv) {
                float f[W];
                mlaf_vec<T>::unpack(row[c], f);
                const float acc = mlaf_sumsq<W>(f);
                if (c < qv) sq += acc;
                else skv += acc;
            }
        }
        sq = mlaf_warp_sum(sq);
        skv = mlaf_warp_sum(skv);
        const float rq = a.Q > 0 ? mlaf_rstd(sq, a.Q, a.eps_q) : 0.0f;
        const float rkv = mlaf_rstd(skv, a.C, a.eps_kv);
#pragma unroll
        for (int s = 0; s < NV; s++) {
            const int c = lane + 32 * s;
            if (c >= qv + cv) continue;
            float f[W], w[W];
            mlaf_vec<T>::unpack(row[c], f);
            const float r = c < qv ? rq : rkv;
            if (c < qv) mlaf_ld_weights_vec<T>(a.w_q, a.wq_f32, (int64_t)c * W, w);
            else mlaf_ld_weights_vec<T>(a.w_kv, a.wkv_f32, (int64_t)(c - qv) * W, w);
#pragma unroll
            for (int k = 0; k < W; k++) f[k] = __fmul_rn(__fmul_rn(f[k], r), w[k]);
            row[c] = mlaf_vec<T>::pack(f);
        }
        if (KV && ti.ok && a.R > 0) {
            /* the pairs of the pe part, rotated in place; each lane owns its pairs */
            T *pe = reinterpret_cast<T *>(row) + a.Q + a.C;
            const int32_t h = a.R / 2;
#pragma unroll 1
            for (int32_t i = lane; i < h; i += 32) {
                const float co = i == lane ? co0 : __ldg(ti.cs + i), si = i == lane ? si0 : __ldg(ti.cs + h + i);
                const int32_t i0 = a.neox ? i : 2 * i, i1 = a.neox ? i + h : 2 * i + 1;
                const float x0 = mlaf_ld(pe + i0), x1 = mlaf_ld(pe + i1);
                const float y0 = mlaf_rope_x0(x0, x1, co, si), y1 = mlaf_rope_x1(x0, x1, co, si);
                if (a.neox) mlaf_st(pe + i0, y0), mlaf_st(pe + i1, y1);
                else mlaf_st2(pe + i0, y0, y1);
            }
        }
        mlaf_fence_async(); /* this lane's slot writes, then the bulk stores that read them */
        __syncwarp();
        if (a.tile_lanes) {
            /* the lanes store the outputs from the slot themselves (16-byte stores), then lane 0
             * refills the slot of the previous row */
            const uint4 *src = row;
            auto seg = [&](void *dst, int off, int n) {
                for (int c = lane; c < n; c += 32) reinterpret_cast<uint4 *>(dst)[c] = src[off + c];
            };
            if (qv) seg(static_cast<T *>(a.q) + t * a.qs, 0, qv);
            if (a.k_nope) seg(static_cast<T *>(a.k_nope) + t * a.ks, qv, cv);
            if (KV) {
                if (ti.ok && a.k_pe && rv) seg(static_cast<T *>(a.k_pe) + t * a.ps, qv + cv, rv);
                if (ti.ok && ti.slot >= 0) seg(static_cast<T *>(a.cache) + mlaf_cache_row(a, ti.slot), qv, cv + rv);
            } else if (a.k_pe && rv) {
                seg(static_cast<T *>(a.k_pe) + t * a.ps, qv + cv, rv);
            }
            mlaf_fence_async();
            __syncwarp();
            if (lane == 0) {
                const int64_t tn = t + (int64_t)(S - 1) * nwarps;
                if (tn < a.T) {
                    const int jn = j == 0 ? S - 1 : j - 1;
                    mlaf_bulk_load(ring_s + (uint32_t)(jn * a.slot), lat + tn * a.ls, rowbytes, bar0 + 8 * jn);
                }
            }
        } else if (lane == 0) {
            const uint32_t rs = ring_s + (uint32_t)(j * a.slot);
            const uint32_t qb = (uint32_t)a.Q * ES, cb = (uint32_t)a.C * ES, pb = (uint32_t)a.R * ES;
            if (qb) mlaf_bulk_store(static_cast<T *>(a.q) + t * a.qs, rs, qb);
            if (a.k_nope) mlaf_bulk_store(static_cast<T *>(a.k_nope) + t * a.ks, rs + qb, cb);
            if (KV) {
                if (ti.ok && a.k_pe && pb) mlaf_bulk_store(static_cast<T *>(a.k_pe) + t * a.ps, rs + qb + cb, pb);
                if (ti.ok && ti.slot >= 0)
                    mlaf_bulk_store(static_cast<T *>(a.cache) + mlaf_cache_row(a, ti.slot), rs + qb, cb + pb);
            } else if (a.k_pe && pb) {
                mlaf_bulk_store(static_cast<T *>(a.k_pe) + t * a.ps, rs + qb + cb, pb);
            }
            mlaf_bulk_commit();
            /* the slot of the previous row (its group) has been read out: refill it */
            mlaf_bulk_wait_read<1>();
            const int64_t tn = t + (int64_t)(S - 1) * nwarps;
            if (tn < a.T) {
                const int jn = j == 0 ? S - 1 : j - 1;
                mlaf_bulk_load(ring_s + (uint32_t)(jn * a.slot), lat + tn * a.ls, rowbytes, bar0 + 8 * jn);
            }
        }
        if (++j == S) j = 0, parity ^= 1u;
    }
    if (lane == 0) mlaf_bulk_wait_all();
}
#endif /* MLAF_ROW_DEV_MODES: TILE */

/* ---- block-per-row kernel (BLK mode, small T) ------------------------------------------- */
/* For a handful of rows the time is the dependency chain of one row, and in a warp-per-row
 * kernel most of it is one warp's own instructions (NV unrolled slots of unpack, square,
 * scale, pack). Here 256 threads share the row (1-4 vectors each), the weights and the
 * token's indices are loaded with it, the raw pe values are staged before the one block
 * barrier that also joins the per-warp sums, and the row is done in about one memory
 * latency plus one barrier. */
#define MLAF_ROWB_THREADS 256

template <typename T, int NVB, bool KV>
__global__ void __launch_bounds__(MLAF_ROWB_THREADS) mlaf_row_block_kernel(const mlaf_row_args a) {
    constexpr int W = mlaf_vec<T>::W, G = MLAF_ROWB_THREADS, NW = G / 32;
    __shared__ float red[2][NW];
    extern __shared__ float mlaf_pe_stage[]; /* [R], mla_kv_cache only */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int qv = a.Q / W, cv = a.C / W, rv = a.R / W, nv = qv + cv + rv;

    for (int64_t t = blockIdx.x; t < a.T; t += gridDim.x) {
        mlaf_token_idx ix = {-1, 0};
        if (KV) ix = mlaf_token_load(a, t);
        const uint4 *src = reinterpret_cast<const uint4 *>(static_cast<const T *>(a.latent) + t * a.ls);
        uint4 v[NVB];
        float w[NVB][W];
#pragma unroll
        for (int s = 0; s < NVB; s++) {
            const int c = tid + G * s;
            if (c < nv) v[s] = __ldcg(src + c);
            if (c < qv) mlaf_ld_weights_vec<T>(a.w_q, a.wq_f32, (int64_t)c * W, w[s]);
            else if (c < qv + cv) mlaf_ld_weights_vec<T>(a.w_kv, a.wkv_f32, (int64_t)(c - qv) * W, w[s]);
        }
        mlaf_token_info ti = {nullptr, -1, true};
        float co0 = 0.0f, si0 = 0.0f;
        if (KV) {
            ti = mlaf_token_decide(a, ix, tid); /* tid 0 counts an invalid token */
            if (ti.ok && tid < a.R / 2) co0 = __ldg(ti.cs + tid), si0 = __ldg(ti.cs + a.R / 2 + tid);
        }
        /* the cache row address needs only the slot: computed while the row is in flight */
        const bool write_cache = KV && ti.ok && ti.slot >= 0;
        const int64_t crow = write_cache ? mlaf_cache_row(a, ti.slot) : 0;

        float sq = 0.0f, skv = 0.0f;
#pragma unroll
        for (int s = 0; s < NVB; s++) {
            const int c = tid + G * s;
            if (c >= nv) continue;
            float f[W];
            mlaf_vec<T>::unpack(v[s], f);
            if (c < qv + cv) {
                const float acc = mlaf_sumsq<W>(f);
                if (c < qv) sq += acc;
                else skv += acc;
            } else if (KV && ti.ok) {
                float *stage = mlaf_pe_stage + (c - qv - cv) * W;
#pragma unroll
                for (int k = 0; k < W; k++) stage[k] = f[k];
            }
        }
        sq = mlaf_warp_sum(sq);
        skv = mlaf_warp_sum(skv);
        if (lane == 0) red[0][warp] = sq, red[1][warp] = skv;
        __syncthreads(); /* joins the warp sums and publishes the pe stage */
        sq = 0.0f, skv = 0.0f;
#pragma unroll
        for (int k = 0; k < NW; k++) sq += red[0][k], skv += red[1][k]; /* same order in every thread */
        const float rq = a.Q > 0 ? mlaf_rstd(sq, a.Q, a.eps_q) : 0.0f;
        const float rkv = mlaf_rstd(skv, a.C, a.eps_kv);

#pragma unroll
        for (int s = 0; s < NVB; s++) {
            const int c = tid + G * s;
            if (c >= nv) continue;
            float f[W];
            mlaf_vec<T>::unpack(v[s], f);
            if (c < qv) {
#pragma unroll
                for (int k = 0; k < W; k++) f[k] = __fmul_rn(__fmul_rn(f[k], rq), w[s][k]);
                __stcg(reinterpret_cast<uint4 *>(static_cast<T *>(a.q) + t * a.qs) + c, mlaf_vec<T>::pack(f));
            } else if (c < qv + cv) {
                const int j = c - qv;
#pragma unroll
                for (int k = 0; k < W; k++) f[k] = __fmul_rn(__fmul_rn(f[k], rkv), w[s][k]);
                if (a.k_nope)
                    __stcg(reinterpret_cast<uint4 *>(static_cast<T *>(a.k_nope) + t * a.ks) + j, mlaf_vec<T>::pack(f));
                if (write_cache) mlaf_st_dt_vec<W>(a.cache, a.cache_dt, crow + (int64_t)j * W, f);
            } else if (!KV && a.k_pe) {
                __stcg(reinterpret_cast<uint4 *>(static_cast<T *>(a.k_pe) + t * a.ps) + (c - qv - cv), v[s]);
            }
        }
        if (KV && ti.ok && a.R > 0) {
            T *po = a.k_pe ? static_cast<T *>(a.k_pe) + t * a.ps : nullptr;
            mlaf_rope_pairs<T, G>(mlaf_pe_stage, ti.cs, co0, si0, a.R, a.neox, tid, po,
                                  write_cache ? a.cache : nullptr, a.cache_dt, crow + a.C);
        }
        __syncthreads(); /* red and the stage are reused by the block's next row */
    }
}

/* ---- block per row with a rope warp (BLKR mode, small T, mla_kv_cache) ------------------ */
/* BLK with the pe part taken off the norm warps. The norm warps (whole warps over the
 * (Q + C) / W q and kv vectors, at most 8; a larger row gives each thread 2 or 4 vectors) hold
 * exactly the vectors they hold in BLK, so the sums, their order and every output bit are
 * BLK's. One more warp, the rope warp, holds the R / W pe vectors and does the rotation. The
 * two parts share nothing, so neither waits for the other: the norm warps join their sums on
 * a named barrier without the rope warp, and the rope warp's chain (position -> cos/sin ->
 * rotation -> store) runs beside theirs (row -> sums -> barrier -> rstd -> store) instead of
 * after it. Both compute the cache row address as soon as the slot is there. A DeepSeek-V3
 * bf16 row (256 norm vectors + 8 pe) is 9 warps of one vector per thread instead of 8 warps
 * with a second vector in the first; GLM-4.7-Flash (160 + 8) is 6 warps instead of 8. */
#define MLAF_ROWR_BAR 1 /* the norm warps' named barrier (0 is __syncthreads) */

/* Blocks per SM the register allocation must allow, for at most G norm threads holding NVB
 * vectors each (plus the rope warp). G = 256 is the small-T shape (a row over as many threads
 * as possible); G = 64 / 128 put more rows on an SM for mid T (fewer threads per row, so fewer
 * per-thread registers per row). */
template <int NVB, int G = MLAF_ROWB_THREADS> struct mlaf_rowr_minb {
    static constexpr int value = G == 64    ? (NVB <= 4 ? 8 : 2)
                                 : G == 128 ? (NVB <= 2 ? 6 : 3)
                                            : (NVB == 1 ? 4 : NVB == 2 ? 2 : 1);
};

/* Block size for nn norm vectors: whole norm warps (at most G / 32) and the rope warp. */
static inline int mlaf_rowr_threads(int nn, int G = MLAF_ROWB_THREADS) {
    return (nn >= G ? G : (nn + 31) / 32 * 32) + 32;
}

__device__ __forceinline__ void mlaf_bar_sync(int id, int n) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}

template <typename T, int NVB, int G = MLAF_ROWB_THREADS>
__global__ void __launch_bounds__(G + 32, mlaf_rowr_minb<NVB, G>::value)
mlaf_row_blockr_kernel(const mlaf_row_args a) {
    constexpr int W = mlaf_vec<T>::W, NW = G / 32;
    __shared__ float red[2][NW];
    extern __shared__ float mlaf_pe_stage[]; /* [R], the rope warp's */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nt = blockDim.x - 32, nw = nt >> 5; /* norm threads and warps; the rope warp is last */
    const int qv = a.Q / W, cv = a.C / W, rv = a.R / W, nn = qv + cv;

    if (tid >= nt) {
        /* rope warp: lane l holds pe vector l (and l + 32, ... for R > 32 W) */
        const int32_t h = a.R / 2;
        for (int64_t t = blockIdx.x; t < a.T; t += gridDim.x) {
            const mlaf_token_idx ix = mlaf_token_load(a, t);
            const uint4 *src = reinterpret_cast<const uint4 *>(static_cast<const T *>(a.latent) + t * a.ls) + nn;
            uint4 v;
            if (lane < rv) v = __ldcg(src + lane);
            const mlaf_token_info ti = mlaf_token_decide(a, ix, 1); /* the norm warps count */
            if (!ti.ok || h == 0) continue;
            /* cos/sin first: they wait for the position, nothing else waits for them */
            const float co0 = lane < h ? __ldg(ti.cs + lane) : 0.0f, si0 = lane < h ? __ldg(ti.cs + h + lane) : 0.0f;
            const bool write_cache = ti.slot >= 0;
            const int64_t crow = write_cache ? mlaf_cache_row(a, ti.slot) : 0;
            if (lane < rv) {
                float f[W];
                mlaf_vec<T>::unpack(v, f);
#pragma unroll
                for (int k = 0; k < W; k++) mlaf_pe_stage[lane * W + k] = f[k];
            }
            for (int c = lane + 32; c < rv; c += 32) {
                float f[W];
                mlaf_vec<T>::unpack(__ldcg(src + c), f);
#pragma unroll
                for (int k = 0; k < W; k++) mlaf_pe_stage[c * W + k] = f[k];
            }
            __syncwarp();
            T *po = a.k_pe ? static_cast<T *>(a.k_pe) + t * a.ps : nullptr;
            mlaf_rope_pairs<T>(mlaf_pe_stage, ti.cs, co0, si0, a.R, a.neox, lane, po,
                               write_cache ? a.cache : nullptr, a.cache_dt, crow + a.C);
            __syncwarp(); /* the stage is reused by the block's next row */
        }
        return;
    }

    for (int64_t t = blockIdx.x; t < a.T; t += gridDim.x) {
        const mlaf_token_idx ix = mlaf_token_load(a, t);
        const uint4 *src = reinterpret_cast<const uint4 *>(static_cast<const T *>(a.latent) + t * a.ls);
        uint4 v[NVB];
        float w[NVB][W];
#pragma unroll
        for (int s = 0; s < NVB; s++) {
            const int c = tid + G * s;
            if (c < nn) {
                v[s] = __ldcg(src + c);
                const bool isq = c < qv; /* one weight load path per vector */
                mlaf_ld_weights_vec<T>(isq ? a.w_q : a.w_kv, isq ? a.wq_f32 : a.wkv_f32,
                                       (int64_t)(isq ? c : c - qv) * W, w[s]);
            }
        }
        const mlaf_token_info ti = mlaf_token_decide(a, ix, tid); /* tid 0 counts an invalid token */
        const bool write_cache = ti.ok && ti.slot >= 0;
        const int64_t crow = write_cache ? mlaf_cache_row(a, ti.slot) : 0;

        float sq = 0.0f, skv = 0.0f;
#pragma unroll
        for (int s = 0; s < NVB; s++) {
            const int c = tid + G * s;
            if (c >= nn) continue;
            float f[W];
            mlaf_vec<T>::unpack(v[s], f);
            const float acc = mlaf_sumsq<W>(f);
            if (c < qv) sq += acc;
            else skv += acc;
        }
        sq = mlaf_warp_sum(sq);
        skv = mlaf_warp_sum(skv);
        if (lane == 0) red[0][warp] = sq, red[1][warp] = skv;
        mlaf_bar_sync(MLAF_ROWR_BAR, nt);
        /* BLK's sums in BLK's order: the warps BLK has beyond nw add +0 */
        float rq, rkv;
        if constexpr (NVB == 1) {
            /* one vector per thread: only its own part's rstd */
            const bool isq = tid < qv;
            float sum = 0.0f;
#pragma unroll
            for (int k = 0; k < NW; k++)
                if (k < nw) sum += red[isq ? 0 : 1][k];
            rq = rkv = mlaf_rstd(sum, isq ? a.Q : a.C, isq ? a.eps_q : a.eps_kv);
        } else {
            sq = 0.0f, skv = 0.0f;
#pragma unroll
            for (int k = 0; k < NW; k++)
                if (k < nw) sq += red[0][k], skv += red[1][k];
            rq = a.Q > 0 ? mlaf_rstd(sq, a.Q, a.eps_q) : 0.0f;
            rkv = mlaf_rstd(skv, a.C, a.eps_kv);
        }

#pragma unroll
        for (int s = 0; s < NVB; s++) {
            const int c = tid + G * s;
            if (c >= nn) continue;
            float f[W];
            mlaf_vec<T>::unpack(v[s], f);
            if (c < qv) {
#pragma unroll
                for (int k = 0; k < W; k++) f[k] = __fmul_rn(__fmul_rn(f[k], rq), w[s][k]);
                __stcg(reinterpret_cast<uint4 *>(static_cast<T *>(a.q) + t * a.qs) + c, mlaf_vec<T>::pack(f));
            } else {
                const int j = c - qv;
#pragma unroll
                for (int k = 0; k < W; k++) f[k] = __fmul_rn(__fmul_rn(f[k], rkv), w[s][k]);
                if (a.k_nope)
                    __stcg(reinterpret_cast<uint4 *>(static_cast<T *>(a.k_nope) + t * a.ks) + j, mlaf_vec<T>::pack(f));
                if (write_cache) mlaf_st_dt_vec<W>(a.cache, a.cache_dt, crow + (int64_t)j * W, f);
            }
        }
        if (t + gridDim.x < a.T) mlaf_bar_sync(MLAF_ROWR_BAR, nt); /* red is reused by the next row */
    }
}

/* ---- generic path ---------------------------------------------------------------------- */
template <typename T, bool KV>
__global__ void __launch_bounds__(MLAF_ROW_WARPS * 32)
mlaf_row_generic_kernel(const mlaf_row_args a) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t nwarps = (int64_t)gridDim.x * MLAF_ROW_WARPS;
    const int32_t Q = a.Q, C = a.C, R = a.R;

    for (int64_t t = (int64_t)blockIdx.x * MLAF_ROW_WARPS + warp; t < a.T; t += nwarps) {
        mlaf_token_info ti = {nullptr, -1, true};
        if (KV) ti = mlaf_token(a, t, lane);
        const T *L = static_cast<const T *>(a.latent) + t * a.ls;

        float sq = 0.0f, skv = 0.0f;
        for (int32_t i = lane; i < Q; i += 32) {
            const float x = mlaf_ld(L + i);
            sq = fmaf(x, x, sq);
        }
        for (int32_t j = lane; j < C; j += 32) {
            const float x = mlaf_ld(L + Q + j);
            skv = fmaf(x, x, skv);
        }
        sq = mlaf_warp_sum(sq);
        skv = mlaf_warp_sum(skv);
        const float rq = Q > 0 ? mlaf_rstd(sq, Q, a.eps_q) : 0.0f;
        const float rkv = mlaf_rstd(skv, C, a.eps_kv);

        const bool write_cache = KV && ti.ok && ti.slot >= 0;
        const int64_t crow = write_cache ? mlaf_cache_row(a, ti.slot) : 0;

        /* Each element is re-read and written by the lane that owns it: in-place safe. */
        if (Q > 0) {
            T *qo = static_cast<T *>(a.q) + t * a.qs;
            for (int32_t i = lane; i < Q; i += 32)
                mlaf_st(qo + i, __fmul_rn(__fmul_rn(mlaf_ld(L + i), rq), mlaf_ld_weight<T>(a.w_q, a.wq_f32, i)));
        }
        T *ko = a.k_nope ? static_cast<T *>(a.k_nope) + t * a.ks : nullptr;
        for (int32_t j = lane; j < C; j += 32) {
            const float y =
                __fmul_rn(__fmul_rn(mlaf_ld(L + Q + j), rkv), mlaf_ld_weight<T>(a.w_kv, a.wkv_f32, j));
            if (ko) mlaf_st(ko + j, y);
            if (write_cache) mlaf_st_dt(a.cache, a.cache_dt, crow + j, y);
        }

        const T *P = L + Q + C;
        T *po = a.k_pe ? static_cast<T *>(a.k_pe) + t * a.ps : nullptr;
        if (!KV) {
            typedef typename mlaf_bits<T>::type B;
            if (po)
                for (int32_t r = lane; r < R; r += 32)
                    reinterpret_cast<B *>(po)[r] = reinterpret_cast<const B *>(P)[r];
            continue;
        }
        if (!ti.ok) continue;
        const int32_t h = R / 2;
        for (int32_t i = lane; i < h; i += 32) {
            const int32_t i0 = a.neox ? i : 2 * i, i1 = a.neox ? i + h : 2 * i + 1;
            mlaf_rope_store<T>(mlaf_ld(P + i0), mlaf_ld(P + i1), __ldg(ti.cs + i), __ldg(ti.cs + h + i),
                               i0, i1, po, write_cache ? a.cache : nullptr, a.cache_dt, crow + C);
        }
    }
}

/* ---- host side: path choice and launch ------------------------------------------------- */
static inline bool mlaf_aligned(const void *p, int64_t stride_bytes, int64_t a) {
    return ((uintptr_t)p % (uintptr_t)a) == 0 && (stride_bytes % a) == 0;
}

/* Smallest instantiated per-lane vector count that holds nv vectors, or 0 (generic). */
static inline int mlaf_row_pick_nv(int nv) {
    static const int opts[] = {2, 4, 6, 9, 12, 16, MLAF_ROW_NV_MAX};
    for (int o : opts)
        if (nv <= 32 * o) return o;
    return 0;
}

template <typename T, bool KV>
static bool mlaf_row_fast_ok(const mlaf_row_args &a) {
    constexpr int W = mlaf_vec<T>::W;
    const int64_t es = sizeof(T);
    if (a.Q % W || a.C % W || a.R % W) return false;
    if (!mlaf_aligned(a.latent, a.ls * es, 16)) return false;
    if (a.Q > 0 && (!mlaf_aligned(a.q, a.qs * es, 16) || !mlaf_aligned(a.w_q, 0, 16))) return false;
    if (!mlaf_aligned(a.w_kv, 0, 16)) return false;
    if (a.k_nope && !mlaf_aligned(a.k_nope, a.ks * es, 16)) return false;
    if (a.k_pe && !mlaf_aligned(a.k_pe, a.ps * es, 16)) return false;
    if (KV) {
        const int64_t cs = (int64_t)mlaf_dtype_size(a.cache_dt), ca = W * cs < 16 ? W * cs : 16;
        if (!mlaf_aligned(a.cache, a.c_s0 * cs, ca) || (a.c_s1 * cs) % ca) return false;
        if (a.R > MLAF_ROW_PE_STAGE_MAX) return false;
    }
    return mlaf_row_pick_nv((a.Q + a.C + a.R) / W) != 0;
}

/* How a call is launched. The library passes the default (auto); dev/ programs force modes
 * and grids to compare them. */
struct mlaf_row_policy {
    int mode = -1;      /* mlaf_row_mode, or -1: BLK (mla_kv_cache: BLKR) for T up to
                           mlaf_row_blk_rows_per_sm() rows per SM, else WAVE */
    int grid_mult = 1;  /* PIPE / forced persistent WAVE: grid = grid_mult x resident blocks x SMs */
    bool persist = false; /* WAVE with the PIPE grid instead of ceil(T / 4) (comparison only) */
    int64_t max_blocks = 0; /* > 0: cap on the grid, so validation sees several rows per warp */
    int blkr_g = 0;         /* BLKR's norm threads: 64, 128 or 256 (0: the library's choice) */
    int run = 0;            /* RUN's rows per warp (0: MLAF_ROW_RUN_ROWS) */
    int ring = 0;           /* TILE's row slots per warp (0: MLAF_ROW_TILE_RING) */
    bool tile_lanes = false; /* TILE: lanes store the outputs instead of bulk stores */
    bool kv_fast = true;     /* the KF kernels where they apply (false: dev/ A/B) */
    bool cs_ahead = true;    /* WAVE1 / STAGE1 mla_kv_cache, 6 vectors per lane: cos/sin look-ahead (false: A/B) */
    bool stage1 = true;      /* STAGE1 where it applies, else WAVE1 (sm_90 and later; false: A/B) */
};

/* The library's policy for a call on ctx's device: auto (the same shapes on every device the
 * backend builds for). */
static inline mlaf_row_policy mlaf_row_policy_for(const mlaf_context *ctx) {
    mlaf_row_policy p;
    p.stage1 = ctx->cuda_cc >= 90; /* bulk copies */
    return p;
}

/* Rows per warp of RUN mode. */
#define MLAF_ROW_RUN_ROWS 4

/* Up to this many rows per SM a call is latency-bound: one block per row (BLK) beats the
 * throughput shapes (measured on the H200, dev/README.md). */
#define MLAF_ROW_BLK_ROWS_PER_SM 4

/* Resident blocks per SM the dispatch counts on: the minimum each kernel's launch bounds
 * guarantee (the register allocation must allow it), a compile-time constant. The H200 runs
 * exactly these (WAVE 8 / 6 for NV = 6 / 9, PIPE 5 / 4, BLKR 4 / 6 / 8 for 256 / 128 / 64 norm
 * threads of a DeepSeek-V3 row); asking the occupancy API instead would put a runtime query,
 * and possibly a module load, inside the first call, which may be under graph capture. */
/* The KF kernels' q slots per lane for NV slots: the layouts of the presets' bf16 / f16 rows,
 * DeepSeek-V3 / Kimi-K2 (192 q + 64 kv + 8 pe vectors: NV = 9, QS = 6) and GLM-4.7-Flash
 * (96 + 64 + 8: NV = 6, QS = 3); -1: none. */
template <int NV> struct mlaf_row_kf_qs {
    static constexpr int value = NV == 9 ? 6 : NV == 6 ? 3 : -1;
};

/* The KF kernel applies to an mla_kv_cache call with interleaved RoPE, at most 32 pairs (each
 * lane's co0 / si0 covers one), the cache in the latent dtype, and the row laid out as the
 * kernel assumes: q exactly QS slots of every lane, the pe part exactly slot NV - 1 of lanes
 * 0 .. rv - 1. */
template <typename T, int NV> static bool mlaf_row_layout_ok(const mlaf_row_args &a) {
    constexpr int W = mlaf_vec<T>::W, QS = mlaf_row_kf_qs<NV>::value;
    return QS >= 0 && a.Q / W == 32 * QS && (a.Q + a.C) / W == 32 * (NV - 1) && a.R / W <= 32;
}
template <typename T, int NV, bool KV> static bool mlaf_row_kvfast_ok(const mlaf_row_args &a) {
    return KV && !a.neox && a.R > 0 && a.R <= 64 && a.cache_dt == mlaf_dtype_of<T>() &&
           mlaf_row_layout_ok<T, NV>(a);
}

template <typename T, int NV, bool KV, int MODE, int QS = -1>
static cudaError_t mlaf_row_go(const mlaf_row_args &a, int sms, const mlaf_row_policy &pol, size_t smem,
                               cudaStream_t stream) {
    mlaf_row_args ar = a;
    ar.run = MODE == MLAF_ROW_RUN ? (pol.run > 0 ? pol.run : MLAF_ROW_RUN_ROWS) : 1;
    if (MODE == MLAF_ROW_RUN && pol.max_blocks > 0) {
        /* a capped grid still covers every row: longer runs */
        const int64_t cover = (a.T + (int64_t)MLAF_ROW_WARPS * pol.max_blocks - 1) /
                              ((int64_t)MLAF_ROW_WARPS * pol.max_blocks);
        if (cover > ar.run) ar.run = (int32_t)cover;
    }
    constexpr int WB = mlaf_row_wpb<MODE>::value;
    const int64_t per_block = (int64_t)WB * ar.run;
    if (WB != MLAF_ROW_WARPS && MODE != MLAF_ROW_STAGE1)
        smem = smem / MLAF_ROW_WARPS * WB; /* per-warp stages (WAVE's pe stage) */
    const int64_t need = (a.T + per_block - 1) / per_block;
    int64_t blocks = need;
    if (MODE == MLAF_ROW_PIPE || pol.persist) {
        const int resident = mlaf_row_minb<NV, MODE>::value;
        const int64_t g = (int64_t)(pol.grid_mult > 0 ? pol.grid_mult : 1) * resident * (sms > 0 ? sms : 132);
        if (g < blocks) blocks = g;
    }
    if (pol.max_blocks > 0 && blocks > pol.max_blocks) blocks = pol.max_blocks;
    if (blocks > 0x7fffffff) blocks = 0x7fffffff;
    /* the look-ahead distance: MLAF_ROW_CS_AHEAD_WAVES waves of resident warps */
    ar.cs_ahead = (MODE == MLAF_ROW_WAVE1 || MODE == MLAF_ROW_STAGE1) && KV && NV == 6 && a.R > 0 && pol.cs_ahead
                      ? (int64_t)MLAF_ROW_CS_AHEAD_WAVES * mlaf_row_minb<NV, MODE>::value * WB * (sms > 0 ? sms : 132)
                      : 0;
    mlaf_row_fast_kernel<T, NV, KV, MODE, QS><<<(unsigned)blocks, WB * 32, smem, stream>>>(ar);
    return cudaGetLastError();
}

/* mlaf_row_go with the KF kernel where it applies (the bf16 / f16 rows of every preset), else
 * the general one. */
template <typename T, int NV, bool KV, int MODE>
static cudaError_t mlaf_row_go_kf(const mlaf_row_args &a, int sms, const mlaf_row_policy &pol, size_t smem,
                                  cudaStream_t stream) {
    if constexpr (KV && mlaf_row_kf_qs<NV>::value >= 0 && !std::is_same<T, float>::value) {
        if (pol.kv_fast && mlaf_row_kvfast_ok<T, NV, KV>(a))
            return mlaf_row_go<T, NV, KV, MODE, mlaf_row_kf_qs<NV>::value>(a, sms, pol, smem, stream);
    }
    /* split_qk_norm's WAVE: the layout alone (there is no pe rotation) */
    if constexpr (!KV && (MODE == MLAF_ROW_WAVE || MODE == MLAF_ROW_WAVE1) && mlaf_row_kf_qs<NV>::value >= 0 && !std::is_same<T, float>::value) {
        if (pol.kv_fast && mlaf_row_layout_ok<T, NV>(a))
            return mlaf_row_go<T, NV, KV, MODE, mlaf_row_kf_qs<NV>::value>(a, sms, pol, smem, stream);
    }
    return mlaf_row_go<T, NV, KV, MODE>(a, sms, pol, smem, stream);
}

/* STAGE1's launch where it applies (sm_90 per the policy; a KF layout, bf16 / f16 rows, weights
 * in the latent dtype): the warp's row slot (the row's bytes, rounded to 128) as dynamic shared
 * memory; else WAVE1. */
template <typename T, int NV, bool KV>
static cudaError_t mlaf_row_go_wave1(const mlaf_row_args &a, int sms, const mlaf_row_policy &pol, size_t smem,
                                     int nvec, cudaStream_t stream) {
    if constexpr (mlaf_row_kf_qs<NV>::value >= 0 && !std::is_same<T, float>::value) {
        const bool kf = KV ? mlaf_row_kvfast_ok<T, NV, KV>(a) : mlaf_row_layout_ok<T, NV>(a);
        if (pol.stage1 && pol.kv_fast && kf && !a.wq_f32 && !a.wkv_f32) {
            mlaf_row_args ar = a;
            ar.slot = (nvec * 16 + 127) / 128 * 128;
            return mlaf_row_go<T, NV, KV, MLAF_ROW_STAGE1, mlaf_row_kf_qs<NV>::value>(ar, sms, pol, (size_t)ar.slot,
                                                                                     stream);
        }
    }
    return mlaf_row_go_kf<T, NV, KV, MLAF_ROW_WAVE1>(a, sms, pol, smem, stream);
}

#ifdef MLAF_ROW_DEV_MODES
/* STAGE's launch: each warp's row slot, rounded to 128 bytes, in dynamic shared memory. */
template <typename T, int NV, bool KV>
static cudaError_t mlaf_row_go_stage(const mlaf_row_args &a, int sms, const mlaf_row_policy &pol, size_t smem,
                                     int nvec, cudaStream_t stream) {
    mlaf_row_args ar = a;
    ar.slot = (nvec * 16 + 127) / 128 * 128;
    const size_t sm = smem + (size_t)MLAF_ROW_WARPS * ar.slot;
    if (sm > 48 * 1024)
        (void)cudaFuncSetAttribute(mlaf_row_fast_kernel<T, NV, KV, MLAF_ROW_STAGE>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
    return mlaf_row_go_kf<T, NV, KV, MLAF_ROW_STAGE>(ar, sms, pol, sm, stream);
}
#endif

#ifdef MLAF_ROW_DEV_MODES
/* TILE takes rows of at most this many bytes (slots of 4 warps x ring must fit an SM). */
#define MLAF_ROW_TILE_MAX_ROW 8192
/* Shared memory per SM the TILE grid counts on (sm_90: 228 KB; a smaller one only means that
 * part of the grid waits for a second wave). */
#define MLAF_ROW_TILE_SM_SMEM (228 * 1024)

/* TILE applies to a fast-path call whose outputs bulk stores can take: the cache (if any) in
 * the latent dtype, rows of at most MLAF_ROW_TILE_MAX_ROW bytes. */
template <typename T, bool KV> static bool mlaf_row_tile_ok(const mlaf_row_args &a) {
    if (KV && a.cache_dt != mlaf_dtype_of<T>()) return false;
    return (int64_t)(a.Q + a.C + a.R) * (int64_t)sizeof(T) <= MLAF_ROW_TILE_MAX_ROW;
}

template <typename T, int NV, bool KV>
static cudaError_t mlaf_row_go_tile(const mlaf_row_args &a, int sms, const mlaf_row_policy &pol, int nvec,
                                    cudaStream_t stream) {
    mlaf_row_args ar = a;
    ar.slot = (nvec * 16 + 127) / 128 * 128;
    int ring = pol.ring > 0 ? pol.ring : MLAF_ROW_TILE_RING;
    if (ring > 8) ring = 8;
    while (ring > 2 && (size_t)MLAF_ROW_WARPS * ring * ar.slot > 200 * 1024) ring--;
    ar.ring = ring;
    ar.tile_lanes = pol.tile_lanes ? 1 : 0;
    const size_t sm = (size_t)MLAF_ROW_WARPS * ring * ar.slot;
    if (sm > 48 * 1024)
        (void)cudaFuncSetAttribute(mlaf_row_tile_kernel<T, NV, KV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)sm);
    int64_t resident = (int64_t)MLAF_ROW_TILE_SM_SMEM / (int64_t)(sm + 2048);
    if (resident < 1) resident = 1;
    if (resident > 16) resident = 16;
    int64_t blocks = (a.T + MLAF_ROW_WARPS - 1) / MLAF_ROW_WARPS;
    const int64_t g = resident * (sms > 0 ? sms : 132) * (pol.grid_mult > 0 ? pol.grid_mult : 1);
    if (g < blocks) blocks = g;
    if (pol.max_blocks > 0 && blocks > pol.max_blocks) blocks = pol.max_blocks;
    mlaf_row_tile_kernel<T, NV, KV><<<(unsigned)blocks, MLAF_ROW_WARPS * 32, sm, stream>>>(ar);
    return cudaGetLastError();
}
#endif

template <typename T, int NVB, bool KV>
static cudaError_t mlaf_row_go_blk(const mlaf_row_args &a, const mlaf_row_policy &pol, size_t smem,
                                   cudaStream_t stream) {
    int64_t blocks = a.T;
    if (pol.max_blocks > 0 && blocks > pol.max_blocks) blocks = pol.max_blocks;
    if (blocks > 0x7fffffff) blocks = 0x7fffffff;
    mlaf_row_block_kernel<T, NVB, KV><<<(unsigned)blocks, MLAF_ROWB_THREADS, smem, stream>>>(a);
    return cudaGetLastError();
}

template <typename T, int NVB, int G = MLAF_ROWB_THREADS>
static cudaError_t mlaf_row_go_blkr(const mlaf_row_args &a, int nn, const mlaf_row_policy &pol,
                                    cudaStream_t stream) {
    int64_t blocks = a.T;
    if (pol.max_blocks > 0 && blocks > pol.max_blocks) blocks = pol.max_blocks;
    if (blocks > 0x7fffffff) blocks = 0x7fffffff;
    mlaf_row_blockr_kernel<T, NVB, G>
        <<<(unsigned)blocks, mlaf_rowr_threads(nn, G), (size_t)a.R * sizeof(float), stream>>>(a);
    return cudaGetLastError();
}

/* BLKR with at most g norm threads (g = 64 / 128 for mid T where the row fits them with 4 / 2-4
 * vectors per thread, else the 256-thread shape). */
template <typename T>
static cudaError_t mlaf_row_go_blkr_g(const mlaf_row_args &a, int nn, int g, const mlaf_row_policy &pol,
                                      cudaStream_t stream) {
    if (g == 64 && nn > 128 && nn <= 256) return mlaf_row_go_blkr<T, 4, 64>(a, nn, pol, stream);
    if (g <= 128 && nn > 128 && nn <= 256) return mlaf_row_go_blkr<T, 2, 128>(a, nn, pol, stream);
    if (g <= 128 && nn > 256 && nn <= 512) return mlaf_row_go_blkr<T, 4, 128>(a, nn, pol, stream);
    if (nn <= MLAF_ROWB_THREADS) return mlaf_row_go_blkr<T, 1>(a, nn, pol, stream);
    if (nn <= 2 * MLAF_ROWB_THREADS) return mlaf_row_go_blkr<T, 2>(a, nn, pol, stream);
    return mlaf_row_go_blkr<T, 4>(a, nn, pol, stream);
}

/* mla_kv_cache's small / mid-T shape for nn norm vectors and T rows on nsm SMs: BLKR with 256,
 * 128 or 64 norm threads, or 0 (WAVE / PIPE). Fewer norm threads per row leave more rows on an
 * SM, at a longer chain per row; each shape is taken while the call fits one wave of it
 * (H200, dev/cuda/mla_kv_cache_v1 --sweep, graph replay: DeepSeek-V3 T = 768 4.27 us with
 * 128 threads vs 5.97 with 256; T = 1024 5.40 us with 64 vs 6.59 WAVE). */
static inline int mlaf_row_kv_blkr_g(int nn, int64_t T, int64_t nsm) {
    const bool mid = nn > 128 && nn <= 512;
    const int occ256 = nn <= MLAF_ROWB_THREADS       ? mlaf_rowr_minb<1, 256>::value
                       : nn <= 2 * MLAF_ROWB_THREADS ? mlaf_rowr_minb<2, 256>::value
                                                     : mlaf_rowr_minb<4, 256>::value;
    const int cap = mid ? 2 : MLAF_ROW_BLK_ROWS_PER_SM;
    if (T <= (int64_t)(occ256 < cap ? occ256 : cap) * nsm) return 256;
    if (!mid) return 0;
    const int occ128 = nn <= 256 ? mlaf_rowr_minb<2, 128>::value : mlaf_rowr_minb<4, 128>::value;
    if (T <= (int64_t)occ128 * nsm) return 128;
    if (nn <= 256 && T <= (int64_t)mlaf_rowr_minb<4, 64>::value * nsm) return 64;
    return 0;
}

#ifdef MLAF_ROW_DEV_MODES
#define MLAF_ROW_DEV 1
#else
#define MLAF_ROW_DEV 0
#endif

/* The library ships WAVE (large T), for small T BLK (split_qk_norm) or BLKR (mla_kv_cache,
 * also mid T), and PIPE for mla_kv_cache just past one WAVE wave. LAT, PIPE for
 * split_qk_norm and BLK with the cache epilogue lost on the H200 (see dev/README.md) and are
 * compiled only into the dev/ programs that compare them (MLAF_ROW_DEV_MODES), so the library
 * carries no dead kernels. */
template <typename T, int NV, bool KV>
static cudaError_t mlaf_row_go_nv(const mlaf_row_args &a, int sms, const mlaf_row_policy &pol, size_t smem,
                                  cudaStream_t stream) {
    constexpr int W = mlaf_vec<T>::W;
    int mode = pol.mode;
    const int nvec = (a.Q + a.C + a.R) / W;
    const int64_t nsm = sms > 0 ? sms : 132;
    if constexpr (KV) {
        const int nn = (a.Q + a.C) / W;
        if (nn <= 4 * MLAF_ROWB_THREADS) {
            int g = pol.blkr_g;
            if (mode < 0) {
                g = mlaf_row_kv_blkr_g(nn, a.T, nsm);
                if (g > 0) mode = MLAF_ROW_BLKR;
            }
            if (!MLAF_ROW_DEV && mode == MLAF_ROW_BLK) mode = MLAF_ROW_BLKR;
            if (mode == MLAF_ROW_BLKR) return mlaf_row_go_blkr_g<T>(a, nn, g > 0 ? g : 256, pol, stream);
        }
        if constexpr (mlaf_row_kf_qs<NV>::value >= 0 && !std::is_same<T, float>::value) {
            /* KF rows past the BLKR shapes, up to one wave of PIPE blocks (each warp one row):
             * PIPE's kernel, whose register budget (4 / 5 blocks per SM) leaves ptxas a shorter
             * schedule than WAVE's (H200, graph replay, buffers rotated past L2: DeepSeek-V3
             * T = 2048 6.66 vs WAVE 6.94 / WAVEW 7.28 us; GLM-4.7-Flash 1536 4.62 vs 4.90 /
             * 4.80) */
            const int64_t pipe_wave = (int64_t)mlaf_row_minb<NV, MLAF_ROW_PIPE>::value * MLAF_ROW_WARPS * nsm;
            if (mode < 0 && a.T <= pipe_wave && pol.kv_fast && mlaf_row_kvfast_ok<T, NV, KV>(a))
                mode = MLAF_ROW_PIPE;
        }
        if constexpr (NV == 4 || NV == 6 || NV == 9) {
            /* just past one wave of WAVE blocks (up to 1.3 waves), the persistent grid with the
             * next row prefetched (PIPE) saves most of a nearly empty second wave (H200,
             * DeepSeek-V3, T = 4096 = 1.29 waves: 12.7 vs 14.1 us); at 1.45 waves (GLM-4.7-Flash
             * T = 6144: 13.6 vs 12.7 us) and beyond, plain WAVE is faster */
            const int64_t wave_rows =
                (int64_t)mlaf_row_minb<NV, MLAF_ROW_WAVE>::value * mlaf_row_wpb<MLAF_ROW_WAVE>::value * nsm;
            if (mode < 0 && a.T > wave_rows && 10 * a.T <= 13 * wave_rows) mode = MLAF_ROW_PIPE;
            if (mode == MLAF_ROW_PIPE) return mlaf_row_go_kf<T, NV, KV, MLAF_ROW_PIPE>(a, sms, pol, smem, stream);
        }
    }
#ifdef MLAF_ROW_DEV_MODES
    if (mode == MLAF_ROW_TILE && mlaf_row_tile_ok<T, KV>(a)) return mlaf_row_go_tile<T, NV, KV>(a, sms, pol, nvec, stream);
#endif
    if constexpr (KV && (NV == 6 || NV == 9 || MLAF_ROW_DEV)) {
        /* rows without the KF kernels, up to 3 WAVE blocks per SM (4 for rows of 9 vectors
         * per lane): WAVEW, the weights staged per block once instead of each warp meeting
         * their L2 latency after its reductions (H200, graph replay, DeepSeek-V3 pe-stage
         * kernels: T = 1536 6.46-6.51 vs WAVE 7.05-7.13 us; 2048 7.47-7.51 vs 7.49-7.53) */
        const bool wok = !a.wq_f32 && !a.wkv_f32;
        if (mode < 0 && wok && a.T <= (int64_t)(NV == 9 ? 4 : 3) * MLAF_ROW_WARPS * nsm) mode = MLAF_ROW_WAVEW;
        if (mode == MLAF_ROW_WAVEW && wok)
            return mlaf_row_go_kf<T, NV, KV, MLAF_ROW_WAVEW>(
                a, sms, pol, (size_t)MLAF_ROW_WARPS * a.R * sizeof(float) + (size_t)(a.Q + a.C) * sizeof(T),
                stream);
        if (mode == MLAF_ROW_WAVEW) mode = MLAF_ROW_WAVE;
    }
    if (mode < 0) mode = a.T <= MLAF_ROW_BLK_ROWS_PER_SM * nsm ? MLAF_ROW_BLK : MLAF_ROW_WAVE;
    if constexpr (!KV || MLAF_ROW_DEV) {
        if (mode == MLAF_ROW_BLK) {
            if (nvec <= MLAF_ROWB_THREADS) return mlaf_row_go_blk<T, 1, KV>(a, pol, smem, stream);
            if (nvec <= 2 * MLAF_ROWB_THREADS) return mlaf_row_go_blk<T, 2, KV>(a, pol, smem, stream);
            if (nvec <= 4 * MLAF_ROWB_THREADS) return mlaf_row_go_blk<T, 4, KV>(a, pol, smem, stream);
        }
    }
#ifdef MLAF_ROW_DEV_MODES
    if constexpr (NV == 4 || NV == 6 || NV == 9) {
        if (mode == MLAF_ROW_LAT) return mlaf_row_go<T, NV, KV, MLAF_ROW_LAT>(a, sms, pol, smem, stream);
        if (mode == MLAF_ROW_PIPE) return mlaf_row_go<T, NV, KV, MLAF_ROW_PIPE>(a, sms, pol, smem, stream);
        if (mode == MLAF_ROW_RUN) return mlaf_row_go<T, NV, KV, MLAF_ROW_RUN>(a, sms, pol, smem, stream);
    }
    if (mode == MLAF_ROW_STAGE) return mlaf_row_go_stage<T, NV, KV>(a, sms, pol, smem, nvec, stream); /* any width */
#endif
    if constexpr (NV == 6 || NV == 9) {
        /* auto resolved to WAVE above; from MLAF_ROW_WAVE1_FROM_T rows its one-warp blocks, as
         * STAGE1 where that applies (forced modes: WAVE1 / STAGE1 as asked) */
        if ((pol.mode < 0 && mode == MLAF_ROW_WAVE && a.T >= MLAF_ROW_WAVE1_FROM_T) || mode == MLAF_ROW_STAGE1)
            return mlaf_row_go_wave1<T, NV, KV>(a, sms, pol, smem, nvec, stream);
        if (mode == MLAF_ROW_WAVE1) return mlaf_row_go_kf<T, NV, KV, MLAF_ROW_WAVE1>(a, sms, pol, smem, stream);
    }
    return mlaf_row_go_kf<T, NV, KV, MLAF_ROW_WAVE>(a, sms, pol, smem, stream);
}

/* The constants of mlaf_cache_row's division by block_size (mlaf_div_magic, internal.h: exact
 * for every slot below 2^31; tested in test_mla_kv_cache). */
static inline void mlaf_row_set_div(mlaf_row_args *a) {
    a->bs_mul = 0, a->bs_shift = 0;
    (void)mlaf_div_magic(a->block_size, &a->bs_mul, &a->bs_shift);
}

template <typename T, bool KV>
static cudaError_t mlaf_row_launch_t(const mlaf_row_args &a0, int sms, cudaStream_t stream,
                                     const mlaf_row_policy &pol) {
    mlaf_row_args a = a0;
    if (KV) mlaf_row_set_div(&a);
    if (!mlaf_row_fast_ok<T, KV>(a)) {
        const int64_t blocks64 = (a.T + MLAF_ROW_WARPS - 1) / MLAF_ROW_WARPS;
        const unsigned blocks = (unsigned)(blocks64 < 0x7fffffff ? blocks64 : 0x7fffffff);
        mlaf_row_generic_kernel<T, KV><<<blocks, MLAF_ROW_WARPS * 32, 0, stream>>>(a);
        return cudaGetLastError();
    }
    const size_t smem = KV ? (size_t)MLAF_ROW_WARPS * a.R * sizeof(float) : 0;
    switch (mlaf_row_pick_nv((a.Q + a.C + a.R) / mlaf_vec<T>::W)) {
    case 2: return mlaf_row_go_nv<T, 2, KV>(a, sms, pol, smem, stream);
    case 4: return mlaf_row_go_nv<T, 4, KV>(a, sms, pol, smem, stream);
    case 6: return mlaf_row_go_nv<T, 6, KV>(a, sms, pol, smem, stream);
    case 9: return mlaf_row_go_nv<T, 9, KV>(a, sms, pol, smem, stream);
    case 12: return mlaf_row_go_nv<T, 12, KV>(a, sms, pol, smem, stream);
    case 16: return mlaf_row_go_nv<T, 16, KV>(a, sms, pol, smem, stream);
    default: return mlaf_row_go_nv<T, MLAF_ROW_NV_MAX, KV>(a, sms, pol, smem, stream);
    }
}

/* Launches the row kernel for the latent dtype dt on a device with sms multiprocessors.
 * KV: the mla_kv_cache epilogue. */
template <bool KV>
static cudaError_t mlaf_row_launch(const mlaf_row_args &a, mlaf_dtype dt, int sms, cudaStream_t stream,
                                   const mlaf_row_policy &pol = mlaf_row_policy()) {
    if (dt == MLAF_F32) return mlaf_row_launch_t<float, KV>(a, sms, stream, pol);
    if (dt == MLAF_F16) return mlaf_row_launch_t<__half, KV>(a, sms, stream, pol);
    return mlaf_row_launch_t<__nv_bfloat16, KV>(a, sms, stream, pol);
}

/* Fills the norm part of the kernel arguments from a validated job. */
static inline void mlaf_row_args_from_norm(mlaf_row_args *a, const mlaf_norm_job *j) {
    *a = mlaf_row_args();
    a->T = j->T;
    a->Q = j->Q, a->C = j->C, a->R = j->R;
    a->eps_q = j->eps_q, a->eps_kv = j->eps_kv;
    a->latent = j->latent, a->ls = j->latent_stride;
    a->w_q = j->w_q, a->w_kv = j->w_kv;
    a->wq_f32 = j->w_q_dt == MLAF_F32, a->wkv_f32 = j->w_kv_dt == MLAF_F32;
    a->q = j->q, a->qs = j->q_stride;
    a->k_nope = j->k_nope, a->ks = j->k_nope_stride;
    a->k_pe = j->k_pe, a->ps = j->k_pe_stride;
}
