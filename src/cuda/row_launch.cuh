/*
 * row_launch.cuh — host side of the row kernel: which launch shape and slot layout a call
 * takes, then the launch. Writers are a template argument; the choice below never depends on
 * them.
 *
 *   1. The vector paths need Q, C, R multiples of the vector width W, 16-byte aligned rows,
 *      weights and dense outputs (the writers' own checks, e.g. the cache's, are the caller's:
 *      mlaf_row_vec_ok), and a pe part of at most 32 vectors (NeoX: R/2 a multiple of W);
 *      anything else runs the generic shape.
 *   2. Up to MLAF_ROW_BLOCK_ROWS_PER_SM rows per SM a call is latency-bound: the block shape;
 *      up to MLAF_ROW_SPLIT_ROWS_PER_SM, rows with a q part split over two blocks.
 *   3. Larger calls: a warp per row. On sm_90 with weights stored in the latent dtype the bulk
 *      shape, else the warp shape (registers). Rows whose parts do not fit an instantiated
 *      layout take the block shape (or, past 1024 threads, the generic one).
 * Resident blocks per SM are what each kernel's launch bounds guarantee (compile-time), not an
 * occupancy query: a query inside the first call could load a module under graph capture.
 */
#pragma once

#include "gemm_writers.cuh"
#include "row_kernels.cuh"

/* Up to this many rows per SM, one block per row (the call is one row's dependency chain). */
#define MLAF_ROW_BLOCK_ROWS_PER_SM 4
/* Up to this many rows per SM, rows with a q part take two blocks each (the split block shape),
 * their q part on one SM, kv and pe on another: the row's chain is the longer of the two parts
 * instead of both (H200, DeepSeek-V3.2 mla_kv_cache T = 1 graph 2.24 -> 1.92 us; at 4 rows per
 * SM, T = 512, 7.0 -> 7.3-7.6). */
#define MLAF_ROW_SPLIT_ROWS_PER_SM 2

/* Forced shapes, for tests and dev/ comparisons (the library passes AUTO). */
enum mlaf_row_shape { MLAF_ROW_AUTO = 0, MLAF_ROW_BLOCK, MLAF_ROW_WARP, MLAF_ROW_BULK, MLAF_ROW_GENERIC, MLAF_ROW_SPLIT };

/* Step 1, the conditions on the latent and weights (the writers check their own outputs). */
template <typename T> static bool mlaf_row_vec_ok(const mlaf_row_args &a, bool rope) {
    constexpr int W = mlaf_vec<T>::W;
    const int64_t es = sizeof(T);
    if (a.Q % W || a.C % W || a.R % W || a.C == 0 || (a.C - a.tail) % W) return false;
    if (!mlaf_aligned(a.latent, a.ls * es, 16)) return false;
    if (a.Q > 0 && !mlaf_aligned(a.w_q, 0, 16)) return false;
    if (!mlaf_aligned(a.w_kv, 0, 16)) return false;
    if (a.R / W > 32) return false;
    if (rope && a.neox && (a.R / 2) % W) return false;
    return true;
}

/* q slots per lane of the instantiated layouts (W = 8: Q up to 3072; W = 4: Q up to 1536), the
 * kv slots (C up to 512) and at most one pe slot. */
template <int W> static int mlaf_row_pick_nq(int qv) {
    static const int o8[] = {0, 2, 3, 4, 6, 8, 12}, o4[] = {0, 4, 6, 8, 12};
    const int *o = W == 8 ? o8 : o4;
    const int n = W == 8 ? 7 : 5;
    for (int i = 0; i < n; i++)
        if (qv <= 32 * o[i]) return o[i];
    return -1;
}
template <int W> struct mlaf_row_nc {
    static constexpr int value = W == 8 ? 2 : 4;
};

template <typename T, class L, bool ROPE, class Wr>
static cudaError_t mlaf_row_go_warp(const mlaf_row_args &a0, const typename Wr::params &wp, bool bulk,
                                    cudaStream_t stream) {
    mlaf_row_args a = a0;
    const int64_t blocks = mlaf_row_grid<Wr>((a.T + MLAF_ROW_WARPS - 1) / MLAF_ROW_WARPS);
    size_t smem = 0;
    if (bulk) {
        a.slot = (int32_t)((((int64_t)a.Q + a.C + a.R) * (int64_t)sizeof(T) + 127) / 128 * 128);
        smem = (size_t)MLAF_ROW_WARPS * a.slot; /* at most 35 KB for the instantiated layouts */
        mlaf_launch(mlaf_row_warp_kernel<T, L, true, ROPE, Wr>,
            (unsigned)blocks, MLAF_ROW_WARPS * 32, smem, stream, a, wp);
    } else {
        mlaf_launch(mlaf_row_warp_kernel<T, L, false, ROPE, Wr>,
            (unsigned)blocks, MLAF_ROW_WARPS * 32, 0, stream, a, wp);
    }
    return cudaGetLastError();
}

template <typename T, int NP, bool ROPE, class Wr>
static cudaError_t mlaf_row_go_nq(const mlaf_row_args &a, const typename Wr::params &wp, int nq, bool bulk,
                                  cudaStream_t stream) {
    constexpr int W = mlaf_vec<T>::W, NC = mlaf_row_nc<W>::value;
#define MLAF_ROW_NQ(n)                                                                                   \
    case n: return mlaf_row_go_warp<T, mlaf_row_layout<n, NC, NP>, ROPE, Wr>(a, wp, bulk, stream)
    if constexpr (W == 8) {
        switch (nq) {
            MLAF_ROW_NQ(0); MLAF_ROW_NQ(2); MLAF_ROW_NQ(3); MLAF_ROW_NQ(4); MLAF_ROW_NQ(6); MLAF_ROW_NQ(8);
            MLAF_ROW_NQ(12);
        }
    } else {
        switch (nq) { MLAF_ROW_NQ(0); MLAF_ROW_NQ(4); MLAF_ROW_NQ(6); MLAF_ROW_NQ(8); MLAF_ROW_NQ(12); }
    }
#undef MLAF_ROW_NQ
    return cudaErrorInvalidValue;
}

/* The constants of the token decision's division by block_size (mlaf_div_magic, internal.h). */
static inline void mlaf_row_set_div(mlaf_row_args *a) {
    a->bs_mul = 0, a->bs_shift = 0;
    (void)mlaf_div_magic(a->block_size, &a->bs_mul, &a->bs_shift);
}

/* Launches a call of T-typed rows: ROPE is mla_kv_cache; vec_ok says whether the writers can
 * take the vector shapes (their outputs aligned); cc: the device's compute capability. */
template <typename T, bool ROPE, class Wr>
static cudaError_t mlaf_row_launch(const mlaf_row_args &a0, const typename Wr::params &wp, bool vec_ok, int sms,
                                   int cc, cudaStream_t stream, mlaf_row_shape force = MLAF_ROW_AUTO) {
    constexpr int W = mlaf_vec<T>::W;
    mlaf_row_args a = a0;
    if (ROPE) mlaf_row_set_div(&a);
    const int qv = a.Q / W, cv = a.C / W, rv = a.R / W;
    const int64_t nsm = sms > 0 ? sms : 132;
    const bool vec = vec_ok && mlaf_row_vec_ok<T>(a, ROPE) && force != MLAF_ROW_GENERIC;
    const int nq = vec ? mlaf_row_pick_nq<W>(qv) : -1;
    const bool warp_ok = nq >= 0 && cv <= 32 * mlaf_row_nc<W>::value;
    const bool block_ok = vec && mlaf_row_block_threads(qv, cv, rv) <= 1024;
    const bool bulk_ok = warp_ok && cc >= 90 && !a.wq_f32 && !a.wkv_f32;
    mlaf_row_shape s = force;
    if (s == MLAF_ROW_SPLIT) s = block_ok && a.Q > 0 ? MLAF_ROW_SPLIT : MLAF_ROW_AUTO;
    if (s == MLAF_ROW_AUTO || (s == MLAF_ROW_BULK && !bulk_ok) || (s == MLAF_ROW_WARP && !warp_ok) ||
        (s == MLAF_ROW_BLOCK && !block_ok)) {
        s = !vec                                                          ? MLAF_ROW_GENERIC
            : block_ok && (a.T <= MLAF_ROW_BLOCK_ROWS_PER_SM * nsm || !warp_ok) ? MLAF_ROW_BLOCK
            : bulk_ok                                                     ? MLAF_ROW_BULK
            : warp_ok                                                     ? MLAF_ROW_WARP
                                                                          : MLAF_ROW_GENERIC;
    }
    if (s == MLAF_ROW_BLOCK && a.Q > 0 && a.T <= MLAF_ROW_SPLIT_ROWS_PER_SM * nsm && force == MLAF_ROW_AUTO)
        s = MLAF_ROW_SPLIT;
    if (s == MLAF_ROW_BLOCK || s == MLAF_ROW_SPLIT) {
        a.split = s == MLAF_ROW_SPLIT;
        a.early = mlaf_cuda_pdl_early_now;
        const unsigned threads = (unsigned)(a.split ? mlaf_row_split_threads(qv, cv, rv)
                                                    : mlaf_row_block_threads(qv, cv, rv));
        const unsigned blocks = (unsigned)mlaf_row_grid<Wr>(a.split ? 2 * a.T : a.T);
        if constexpr (Wr::kTailOnly) {
            if (!ROPE || a.tail == 0 || rv > 0) return cudaErrorInvalidValue;
            mlaf_launch(mlaf_row_block_kernel<T, true, true, Wr>, blocks, threads, 0, stream, a, wp);
        } else if (ROPE && a.tail > 0) {
            mlaf_launch(mlaf_row_block_kernel<T, ROPE, true, Wr>, blocks, threads, 0, stream, a, wp);
        } else {
            mlaf_launch(mlaf_row_block_kernel<T, ROPE, false, Wr>, blocks, threads, 0, stream, a, wp);
        }
        return cudaGetLastError();
    }
    if (s == MLAF_ROW_GENERIC) {
        const int64_t blocks = mlaf_row_grid<Wr>((a.T + MLAF_ROW_WARPS - 1) / MLAF_ROW_WARPS);
        mlaf_launch(mlaf_row_generic_kernel<T, ROPE, Wr>,
            (unsigned)blocks, MLAF_ROW_WARPS * 32, 0, stream, a, wp);
        return cudaGetLastError();
    }
    const bool bulk = s == MLAF_ROW_BULK;
    if constexpr (Wr::kTailOnly) {
        if (rv > 0) return cudaErrorInvalidValue;
        return mlaf_row_go_nq<T, 0, ROPE, Wr>(a, wp, nq, bulk, stream);
    } else {
        return rv > 0 ? mlaf_row_go_nq<T, 1, ROPE, Wr>(a, wp, nq, bulk, stream)
                      : mlaf_row_go_nq<T, 0, ROPE, Wr>(a, wp, nq, bulk, stream);
    }
}

/* Fills the norm part of the row arguments from a validated job. */
static inline void mlaf_row_args_from_norm(mlaf_row_args *a, const mlaf_norm_job *j) {
    *a = mlaf_row_args();
    a->T = j->T;
    a->Q = j->Q, a->C = j->C, a->R = j->R;
    a->eps_q = j->eps_q, a->eps_kv = j->eps_kv;
    a->latent = j->latent, a->ls = j->latent_stride;
    a->w_q = j->w_q, a->w_kv = j->w_kv;
    a->wq_f32 = j->w_q_dt == MLAF_F32, a->wkv_f32 = j->w_kv_dt == MLAF_F32;
}

/* The dense writer's params from a validated job, and whether its outputs take 16-byte vectors. */
template <typename T>
static inline typename mlaf_wr_dense<T>::params mlaf_row_dense_params(const mlaf_norm_job *j, bool pe_raw,
                                                                        bool *vec_ok) {
    typename mlaf_wr_dense<T>::params p;
    p.q = j->q, p.qs = j->q_stride;
    p.k_nope = j->k_nope, p.ks = j->k_nope_stride;
    p.k_pe = j->k_pe, p.ps = j->k_pe_stride;
    p.pe_raw = pe_raw;
    const int64_t es = sizeof(T);
    *vec_ok = (j->Q == 0 || mlaf_aligned(j->q, j->q_stride * es, 16)) &&
              (!j->k_nope || mlaf_aligned(j->k_nope, j->k_nope_stride * es, 16)) &&
              (!j->k_pe || mlaf_aligned(j->k_pe, j->k_pe_stride * es, 16));
    return p;
}

/* The dense outputs and the quantized ones: the row ops' output writer. */
template <typename T> using mlaf_wr_out = mlaf_wr_pair<mlaf_wr_dense<T>, mlaf_wr_gemm<T>>;

/* Its params from a validated job, and whether its outputs take 16-byte vectors (the e4m3 rows
 * are stored by the vector's width where aligned, byte by byte elsewhere). */
template <typename T>
static inline typename mlaf_wr_out<T>::params mlaf_row_out_params(const mlaf_norm_job *j, bool pe_raw, bool *vec_ok) {
    typename mlaf_wr_out<T>::params p;
    p.a = mlaf_row_dense_params<T>(j, pe_raw, vec_ok);
    p.b.q = j->qq, p.b.k = j->kq;
    return p;
}
