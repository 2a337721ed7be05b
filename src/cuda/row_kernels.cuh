/*
 * row_kernels.cuh — the launch shapes of the row kernel: how rows are brought in and spread
 * over threads. Each runs row_core.cuh's arithmetic and hands the values to a writer Wr
 * (row_writers.cuh); ROPE: mla_kv_cache (token decision, RoPE of the pe part).
 *
 *   block  one block per row, one 16-byte vector per thread: q vectors on the first threads,
 *          kv vectors from the next warp, the pe part on a last warp of its own, which ropes
 *          it while the norm warps join their sums on a named barrier. A small-T call is the
 *          dependency chain of one row; spread over a block it is about one memory latency
 *          plus one barrier.
 *   warp   one row per warp, 4 warps per block, every vector of the row in registers
 *          (mlaf_row_layout: compile-time slots per part), loads issued before any
 *          arithmetic; the register cap keeps enough rows in flight per SM to cover memory
 *          latency at large T.
 *   bulk   (sm_90) the warp shape, but lane 0 brings the row into the warp's shared-memory
 *          slot with one bulk copy on an mbarrier, and while it lands the lanes load the row's
 *          weight vectors into the registers the row no longer takes: the output loop meets
 *          no load.
 *   generic any alignment and width: one warp per row, value by value, two passes over the
 *          row (the second from L1 / L2).
 * In place (outputs = the latent's own columns) is safe in every shape: a row is read whole
 * (registers, shared memory, or by the lane that later writes the same element) before it is
 * written, and rows are disjoint.
 */
#pragma once

#include "row_writers.cuh"

#define MLAF_ROW_WARPS 4 /* warps per block of the warp / bulk / generic shapes */

/* Writers with side work (Wr::kSide: the DSA indexer key and its top-k fill) run in twice the
 * blocks: odd block 2b + 1 does side work beside even block 2b's rows, so neither waits for the
 * other. Which work (BLOCK: the block shapes, a.split read; else the warp shapes):
 *   block   side block r: token r's key (warp 0) and its fill (the other warps, or warp 0 after
 *           the key when the block has one warp)
 *   split   the side block beside token t's q block: its key (warp 0); beside its kv block: its
 *           fill (every thread)
 *   warp    each warp one token of [b x warps, (b + 1) x warps): its key, then its fill
 * so at decode sizes a token's four parts (q, kv + pe, key, fill) run on four SMs at once.
 * Returns the row block of this block, or -1 after the side work. */
template <class Wr, bool BLOCK>
__device__ __forceinline__ int64_t mlaf_row_block_id(const mlaf_row_args &a, const typename Wr::params &wp) {
    if constexpr (Wr::kSide) {
        const int64_t b = blockIdx.x;
        if (!(b & 1)) return b >> 1;
        const int64_t r = b >> 1;
        const int warp = (int)(threadIdx.x >> 5), nw = (int)(blockDim.x >> 5);
        if (BLOCK && a.split) {
            if (r & 1) Wr::side_fill(wp, a, r >> 1, (int)threadIdx.x, (int)blockDim.x);
            else if (warp == 0) Wr::side(wp, a, r >> 1);
        } else if (BLOCK) {
            if (warp == 0) Wr::side(wp, a, r);
            if (nw == 1) Wr::side_fill(wp, a, r, (int)threadIdx.x, 32);
            else if (warp > 0) Wr::side_fill(wp, a, r, (int)threadIdx.x - 32, (int)blockDim.x - 32);
        } else {
            const int64_t t = r * nw + warp;
            Wr::side(wp, a, t);
            Wr::side_fill(wp, a, t, (int)(threadIdx.x & 31), 32);
        }
        return -1;
    }
    return blockIdx.x;
}
/* Blocks of a launch of n row blocks. */
template <class Wr> static inline int64_t mlaf_row_grid(int64_t n) { return Wr::kSide ? 2 * n : n; }

/* ---- block shape ------------------------------------------------------------------------ */
__device__ __forceinline__ void mlaf_bar_sync(int id, int n) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}

/* Threads of the block shape for a row of qv / cv / rv vectors (at most 1024). */
static inline int mlaf_row_block_threads(int qv, int cv, int rv) {
    return (qv + 31) / 32 * 32 + (cv + 31) / 32 * 32 + (rv > 0 ? 32 : 0);
}

/* Threads of a block of the split block shape: the larger of the q part and the kv + pe parts. */
static inline int mlaf_row_split_threads(int qv, int cv, int rv) {
    const int q = (qv + 31) / 32 * 32, kp = (cv + 31) / 32 * 32 + (rv > 0 ? 32 : 0);
    return q > kp ? q : kp;
}

/* TAIL: the call has a kv_rope_tail (rows without a rope part; the launch picks the instance, so
 * other rows carry none of its registers). a.split: row t takes blocks 2t (its q part) and 2t + 1
 * (kv and pe), which then run on two SMs; a thread keeps the role of its index in the row's
 * one-block layout (tid). */
template <typename T, bool ROPE, bool TAIL, class Wr>
__global__ void __launch_bounds__(1024) mlaf_row_block_kernel(const mlaf_row_args a, const typename Wr::params wp) {
    if (!a.early) mlaf_pdl_begin(); /* a.early (PDL setting 2): each thread waits just before its first
                                     * read of the latent, its weights, token indices and cos / sin
                                     * already loaded */
    constexpr int W = mlaf_vec<T>::W;
    __shared__ float red[32];
    const int64_t b = mlaf_row_block_id<Wr, true>(a, wp);
    if (b < 0) return;
    const int qv = a.Q / W, cv = a.C / W, rv = a.R / W;
    const int qpad = (qv + 31) & ~31, nt = qpad + ((cv + 31) & ~31);
    const int64_t t = a.split ? b >> 1 : b;
    const int part = a.split ? 1 + (int)(b & 1) : 0; /* 0: the whole row, 1: q, 2: kv and pe */
    const int tid = (int)threadIdx.x + (part == 2 ? qpad : 0);
    if (tid >= (part == 1 ? qpad : nt + (rv > 0 ? 32 : 0))) return;
    const int lane = tid & 31, warp = tid >> 5;
    const int lo = part == 2 ? qpad : 0, hi = part == 1 ? qpad : nt; /* this block's norm threads */
    const uint4 *src = reinterpret_cast<const uint4 *>(static_cast<const T *>(a.latent) + t * a.ls);
    const uint4 zero = make_uint4(0, 0, 0, 0);

    if (tid >= nt) { /* the pe warp: lane l holds pe vector l */
        mlaf_token_idx ix = {-1, 0};
        if (ROPE) ix = mlaf_token_load(a, t);
        const bool ok = lane < rv;
        uint4 x = zero;
        if (!a.early) x = ok ? __ldcg(src + qv + cv + lane) : zero;
        const mlaf_token_info ti = ROPE ? mlaf_token_decide(a, ix, false) : mlaf_token_none();
        float f[W], c0 = 0.0f, s0 = 0.0f;
        if (ROPE) mlaf_rope_cs_early(a, ti.cs, lane, c0, s0);
        if (a.early) {
            mlaf_pdl_begin();
            x = ok ? __ldcg(src + qv + cv + lane) : zero;
        }
        mlaf_vec<T>::unpack(x, f);
        Wr w(wp, a, t, ti);
        if (ROPE) {
            mlaf_rope_vec<T>(a, ti.cs, lane, rv, x, f, c0, s0);
            w.pe(lane, ok && ti.ok, f, a.norot ? x : mlaf_vec<T>::pack(f));
        } else {
            w.pe(lane, ok, f, x);
        }
        w.finish(__int_as_float(0x7fc00000), __int_as_float(0x7fc00000), 0);
        return;
    }

    const bool isq = tid < qpad;
    const int j = isq ? tid : tid - qpad;
    const bool ok = j < (isq ? qv : cv);
    mlaf_token_idx ix = {-1, 0};
    if (ROPE && part != 1) ix = mlaf_token_load(a, t);
    uint4 x = zero;
    if (!a.early) x = ok ? __ldcg(src + (isq ? j : qv + j)) : zero;
    float wv[W];
    if (ok) mlaf_ld_weights_vec<T>(isq ? a.w_q : a.w_kv, isq ? a.wq_f32 : a.wkv_f32, (int64_t)j * W, wv);
    /* the q block holds no cache or k_pe value: it takes no token decision */
    const mlaf_token_info ti = ROPE && part != 1 ? mlaf_token_decide(a, ix, false) : mlaf_token_none();
    mlaf_tail_lane tl = {0.0f, 0.0f};
    if (TAIL && !isq) tl = mlaf_tail_early(a, ti.cs, lane);
    if (a.early) {
        mlaf_pdl_begin();
        x = ok ? __ldcg(src + (isq ? j : qv + j)) : zero;
    }
    /* counted once, by the row's lead thread, after the wait (the counter is an output) */
    if (ROPE && part != 1 && tid == lo && !ti.ok && a.err) mlaf_cuda_error_count_add(a.err, 1);

    float f[W];
    mlaf_vec<T>::unpack(x, f);
    const float acc = mlaf_warp_sum(mlaf_sumsq<W>(f));
    if (lane == 0) red[warp] = acc;
    mlaf_bar_sync(1, hi - lo);
    float sq = 0.0f, skv = 0.0f;
    for (int k = lo / 32; k < min(hi, qpad) / 32; k++) sq += red[k];
    for (int k = max(lo, qpad) / 32; k < hi / 32; k++) skv += red[k];
    const float rq = a.Q > 0 && part != 2 ? mlaf_rstd(sq, a.Q, a.eps_q) : 0.0f;
    const float rkv = part != 1 ? mlaf_rstd(skv, a.C, a.eps_kv) : 0.0f;

    Wr w(wp, a, t, ti);
    const float r = isq ? rq : rkv;
#pragma unroll
    for (int k = 0; k < W; k++) f[k] = __fmul_rn(__fmul_rn(f[k], r), ok ? wv[k] : 0.0f);
    uint4 o = mlaf_vec<T>::pack(f);
    if (isq) {
        w.q(j, ok, f, o);
    } else { /* the tail rotated first (o is passed by value); the gather by whole kv warps */
        mlaf_tail_cs<T> tcs;
        tcs.j = -1;
        if (TAIL) tcs = mlaf_tail_gather<T>(a, ti.cs, tl, j);
        const bool kok = TAIL && ok && mlaf_tail_vec<T>(a, ti.cs, j, f, o, tcs) ? ti.ok : ok;
        w.kv(j, kok, f, o);
    }
    w.finish(rq, rkv, tid != lo ? 0 : part == 0 ? MLAF_LEAD_Q | MLAF_LEAD_KV : part == 1 ? MLAF_LEAD_Q : MLAF_LEAD_KV);
}

/* ---- warp and bulk shapes --------------------------------------------------------------- */
template <typename T, class L, bool BULK, bool ROPE, class Wr>
__device__ __forceinline__ void mlaf_row_warp_body(const mlaf_row_args &a, const typename Wr::params &wp,
                                                   int64_t bid) {
    constexpr int W = mlaf_vec<T>::W, NQ = L::NQ, NC = L::NC, NP = L::NP, NS = L::NS;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t t = bid * MLAF_ROW_WARPS + warp;
    if (t >= a.T) return;
    const int qv = a.Q / W, cv = a.C / W, rv = a.R / W;
    const uint4 *src = reinterpret_cast<const uint4 *>(static_cast<const T *>(a.latent) + t * a.ls);
    const uint4 zero = make_uint4(0, 0, 0, 0);
    /* slot s of the lane: its part's vector j, at vector rowv of the row */
    auto jof = [&](int s) { return (s < NQ ? s : s < NQ + NC ? s - NQ : s - NQ - NC) * 32 + lane; };
    auto rowv = [&](int s) { return s < NQ ? jof(s) : s < NQ + NC ? qv + jof(s) : qv + cv + jof(s); };
    auto okof = [&](int s) { return jof(s) < (s < NQ ? qv : s < NQ + NC ? cv : rv); };

    /* 1. bring the row in: registers, or the warp's shared-memory slot (bulk) */
    extern __shared__ __align__(128) unsigned char mlaf_row_smem[];
    __shared__ __align__(8) uint64_t bars[BULK ? MLAF_ROW_WARPS : 1];
    const uint4 *srow = reinterpret_cast<const uint4 *>(mlaf_row_smem + (BULK ? (size_t)warp * a.slot : 0));
    const uint32_t bar = (uint32_t)__cvta_generic_to_shared(&bars[BULK ? warp : 0]);
    uint4 v[BULK ? 1 : NS];
    uint4 wv[BULK ? NQ + NC : 1];
    if constexpr (BULK) {
        if (lane == 0) {
            const uint32_t bytes = (uint32_t)(qv + cv + rv) * 16u;
            mlaf_bar_init(bar, 1);
            mlaf_bar_expect(bar, bytes);
            mlaf_bulk_copy((uint32_t)__cvta_generic_to_shared(srow), src, bytes, bar);
        }
        __syncwarp(); /* the barrier is initialized before any lane waits on it */
    }
    mlaf_token_idx ix = {-1, 0};
    if (ROPE) ix = mlaf_token_load(a, t);
    if constexpr (!BULK) {
#pragma unroll
        for (int s = 0; s < NS; s++) v[s] = okof(s) ? __ldcg(src + rowv(s)) : zero;
    } else {
#pragma unroll
        for (int s = 0; s < NQ + NC; s++)
            wv[s] = okof(s) ? __ldg(s < NQ ? static_cast<const uint4 *>(a.w_q) + jof(s)
                                           : static_cast<const uint4 *>(a.w_kv) + jof(s))
                            : zero;
    }
    const mlaf_token_info ti = ROPE ? mlaf_token_decide(a, ix, lane == 0) : mlaf_token_none();
    float c0 = 0.0f, s0 = 0.0f;
    if (ROPE && NP > 0) mlaf_rope_cs_early(a, ti.cs, lane, c0, s0);
    /* kv_rope_tail (layouts without a pe part): the tail's last 32 pairs, a pair a lane, handed
     * to the lanes of the last kv slot (where those pairs lie) when it is written */
    mlaf_tail_lane tl = {0.0f, 0.0f};
    if (ROPE && NP == 0 && NC > 0) tl = mlaf_tail_early(a, ti.cs, lane);
    if constexpr (BULK) mlaf_bar_wait(bar, 0);
    auto vec = [&](int s) -> uint4 {
        if constexpr (BULK) return okof(s) ? srow[rowv(s)] : zero;
        else return v[s];
    };

    /* 2. sums and rstd (lanes past a part's end hold zeros) */
    float sq = 0.0f, skv = 0.0f;
#pragma unroll
    for (int s = 0; s < NQ + NC; s++) {
        float f[W];
        mlaf_vec<T>::unpack(vec(s), f);
        if (s < NQ) sq += mlaf_sumsq<W>(f);
        else skv += mlaf_sumsq<W>(f);
    }
    sq = mlaf_warp_sum(sq);
    skv = mlaf_warp_sum(skv);
    const float rq = a.Q > 0 ? mlaf_rstd(sq, a.Q, a.eps_q) : 0.0f;
    const float rkv = mlaf_rstd(skv, a.C, a.eps_kv);

    /* 3. every vector to the writer as soon as it is ready */
    Wr w(wp, a, t, ti);
#pragma unroll
    for (int s = 0; s < NS; s++) {
        const int j = jof(s);
        const bool ok = okof(s);
        const uint4 x = vec(s);
        float f[W];
        mlaf_vec<T>::unpack(x, f);
        if (s < NQ + NC) {
            const bool isq = s < NQ;
            if (ok) {
                if constexpr (BULK) mlaf_scale_vec_w<T>(f, isq ? rq : rkv, wv[s < NQ + NC ? s : 0]);
                else mlaf_scale_vec<T>(f, isq ? rq : rkv, isq ? a.w_q : a.w_kv, isq ? a.wq_f32 : a.wkv_f32,
                                       (int64_t)j * W);
            }
            uint4 o = mlaf_vec<T>::pack(f);
            if (isq) {
                w.q(j, ok, f, o);
            } else { /* the tail rotated first (o is passed by value); only rows without a rope
                      * part have one (validation), so layouts with NP > 0 compile without it */
                mlaf_tail_cs<T> tcs;
                tcs.j = -1;
                if (ROPE && NP == 0 && s == NQ + NC - 1) tcs = mlaf_tail_gather<T>(a, ti.cs, tl, j); /* whole warp */
                const bool kok = ROPE && NP == 0 && ok && mlaf_tail_vec<T>(a, ti.cs, j, f, o, tcs) ? ti.ok : ok;
                w.kv(j, kok, f, o);
            }
        } else if constexpr (ROPE) {
            mlaf_rope_vec<T>(a, ti.cs, j, rv, x, f, c0, s0);
            w.pe(j, ok && ti.ok, f, a.norot ? x : mlaf_vec<T>::pack(f));
        } else {
            w.pe(j, ok, f, x);
        }
    }
    w.finish(rq, rkv, lane == 0 ? MLAF_LEAD_Q | MLAF_LEAD_KV : 0);
}

template <typename T, class L, bool BULK, bool ROPE, class Wr>
__global__ void __launch_bounds__(MLAF_ROW_WARPS * 32, mlaf_row_minb4<BULK ? L::NQ + L::NC + 1 : L::NS>::value)
mlaf_row_warp_kernel(const mlaf_row_args a, const typename Wr::params wp) {
    mlaf_pdl_begin();
    const int64_t bid = mlaf_row_block_id<Wr, false>(a, wp);
    if (bid < 0) return;
    if constexpr (BULK) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
        __trap(); /* the host launches the bulk shape on sm_90 and later only */
#else
        mlaf_row_warp_body<T, L, true, ROPE, Wr>(a, wp, bid);
#endif
    } else {
        mlaf_row_warp_body<T, L, false, ROPE, Wr>(a, wp, bid);
    }
}

/* ---- generic shape ---------------------------------------------------------------------- */
template <typename T, bool ROPE, class Wr>
__global__ void __launch_bounds__(MLAF_ROW_WARPS * 32) mlaf_row_generic_kernel(const mlaf_row_args a,
                                                                               const typename Wr::params wp) {
    mlaf_pdl_begin();
    typedef typename mlaf_bits<T>::type B;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t bid = mlaf_row_block_id<Wr, false>(a, wp);
    if (bid < 0) return;
    const int64_t t = bid * MLAF_ROW_WARPS + warp;
    if (t >= a.T) return;
    const int32_t Q = a.Q, C = a.C, R = a.R;
    const mlaf_token_info ti = ROPE ? mlaf_token_decide(a, mlaf_token_load(a, t), lane == 0) : mlaf_token_none();
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

    /* each value is re-read and written by the lane that owns it: in-place safe */
    Wr w(wp, a, t, ti);
    for (int32_t i = lane; i < Q; i += 32)
        w.q1(i, __fmul_rn(__fmul_rn(mlaf_ld(L + i), rq), mlaf_ld_weight<T>(a.w_q, a.wq_f32, i)));
    const int32_t C0 = C - a.tail; /* kv_rope_tail: values [C0, C) rotated below */
    for (int32_t j = lane; j < C0; j += 32)
        w.kv1(j, __fmul_rn(__fmul_rn(mlaf_ld(L + Q + j), rkv), mlaf_ld_weight<T>(a.w_kv, a.wkv_f32, j)));
    if (ROPE && a.tail > 0 && ti.ok) { /* pair p by one lane: rounded to T, rotated, handed on in fp32 */
        for (int32_t p = lane; p < a.tail / 2; p += 32) {
            const int32_t i0 = C0 + 2 * p, i1 = i0 + 1, h = a.tail / 2;
            const float x0 = mlaf_round_as<T>(__fmul_rn(__fmul_rn(mlaf_ld(L + Q + i0), rkv),
                                                        mlaf_ld_weight<T>(a.w_kv, a.wkv_f32, i0)));
            const float x1 = mlaf_round_as<T>(__fmul_rn(__fmul_rn(mlaf_ld(L + Q + i1), rkv),
                                                        mlaf_ld_weight<T>(a.w_kv, a.wkv_f32, i1)));
            const float c = __ldg(ti.cs + p), s = __ldg(ti.cs + h + p);
            w.kv1(i0, mlaf_rope_x0(x0, x1, c, s));
            w.kv1(i1, mlaf_rope_x1(x0, x1, c, s));
        }
    }
    const T *P = L + Q + C;
    if (!ROPE || a.norot) {
        if (!ROPE || ti.ok)
            for (int32_t r = lane; r < R; r += 32) w.pe1(r, mlaf_ld(P + r), reinterpret_cast<const B *>(P)[r]);
    } else if (ti.ok) {
        const int32_t h = R / 2;
        for (int32_t i = lane; i < h; i += 32) {
            const int32_t i0 = a.neox ? i : 2 * i, i1 = a.neox ? i + h : 2 * i + 1;
            const float x0 = mlaf_ld(P + i0), x1 = mlaf_ld(P + i1), c = __ldg(ti.cs + i), s = __ldg(ti.cs + h + i);
            w.pe1(i0, mlaf_rope_x0(x0, x1, c, s), 0);
            w.pe1(i1, mlaf_rope_x1(x0, x1, c, s), 0);
        }
    }
    w.finish(rq, rkv, lane == 0 ? MLAF_LEAD_Q | MLAF_LEAD_KV : 0);
}
