/*
 * row_writers.cuh — what the row kernels do with a row's final values: the writers.
 *
 * A writer is a small device policy, a template argument of every launch shape. Each shape
 * computes a row's values (row_core.cuh) and hands every vector of them to the writer, in
 * registers, the moment it is ready (a row's stores leave while its later vectors are computed):
 *
 *   struct params { ... };          filled on the host, passed by value to the kernel
 *   W(const params &, const mlaf_row_args &, int64_t t, const mlaf_token_info &);   per row
 *   void q (int j, bool ok, const float *f, uint4 packed);   q vector j: values [j W, j W + W)
 *   void kv(int j, bool ok, const float *f, uint4 packed);   kv vector j (normalized)
 *   void pe(int j, bool ok, const float *f, uint4 packed);   pe vector j (mla_kv_cache: roped;
 *                                                            split_qk_norm: packed = raw bits)
 *   void finish(float rq, float rkv, int lead);               after the row's last vector
 *   void q1 / kv1 (int64_t i, float y); void pe1(int64_t i, float y, uint32_t raw);   the same per
 *                                        value i, for the generic (unaligned, any width) kernel
 *
 * f holds fp32 values (before rounding), packed the same rounded once to the latent dtype. Every
 * thread of a warp calls every hook of its vectors (ok = false where it holds none, or, for pe,
 * where the token is invalid), so a writer may exchange values between lanes with shuffles: in
 * the warp shapes the kv part starts at lane 0 of a slot, and in the block shape at a warp. The
 * kv tile of 128 values is 16 consecutive lanes (bf16 / f16). finish: lead has MLAF_LEAD_Q in one
 * thread of the threads that hold the row's q part and MLAF_LEAD_KV in one of those that hold its
 * kv part (the same thread unless the split block shape gives the parts blocks of their own);
 * rq / rkv are meaningful where the thread holds that part (NaN in the block shape's rope warp).
 *   static constexpr bool kSide; static void side(const params &, const mlaf_row_args &, int64_t t)
 *                                        per-token work apart from the row (see mlaf_wr_base);
 *   static void side_fill(const params &, const mlaf_row_args &, int64_t t, int i, int n)
 *                                        the part of it that reads nothing, by n threads (this is i)
 *   static constexpr bool kTailOnly      the writer's rows always have a kv_rope_tail and no pe part
 *                                        (validation), so the launch instantiates no other shapes
 * A new writer is one struct here and one entry in the op's launch (mla_kv_cache.cu).
 */
#pragma once

#include "row_core.cuh"

#define MLAF_LEAD_Q 1  /* finish's lead bits */
#define MLAF_LEAD_KV 2

/* No-op hooks, for writers that take only some of them. kSide: the writer has work of its own
 * per token that needs none of the row's values (side(p, a, t), every lane of a warp, and
 * side_fill(p, a, t, i, n), stores of constants by any n threads); the launch then gives it
 * blocks of its own beside the rows' (row_kernels.cuh). */
struct mlaf_wr_base {
    static constexpr bool kSide = false, kTailOnly = false;
    __device__ __forceinline__ void q(int, bool, const float *, uint4) {}
    __device__ __forceinline__ void kv(int, bool, const float *, uint4) {}
    __device__ __forceinline__ void pe(int, bool, const float *, uint4) {}
    __device__ __forceinline__ void q1(int64_t, float) {}
    __device__ __forceinline__ void kv1(int64_t, float) {}
    __device__ __forceinline__ void pe1(int64_t, float, uint32_t) {}
    __device__ __forceinline__ void finish(float, float, int) {}
};

/* The dense outputs: q, k_nope and k_pe (each may be NULL), row-strided. */
template <typename T> struct mlaf_wr_dense : mlaf_wr_base {
    struct params {
        void *q, *k_nope, *k_pe;
        int64_t qs, ks, ps;
        int32_t pe_raw; /* split_qk_norm: k_pe is a bit-exact copy (pe1's raw) */
    };
    uint4 *q_, *k_, *p_;
    bool raw_;
    __device__ __forceinline__ mlaf_wr_dense(const params &p, const mlaf_row_args &, int64_t t,
                                             const mlaf_token_info &) {
        raw_ = p.pe_raw != 0;
        q_ = p.q ? reinterpret_cast<uint4 *>(static_cast<T *>(p.q) + t * p.qs) : nullptr;
        k_ = p.k_nope ? reinterpret_cast<uint4 *>(static_cast<T *>(p.k_nope) + t * p.ks) : nullptr;
        p_ = p.k_pe ? reinterpret_cast<uint4 *>(static_cast<T *>(p.k_pe) + t * p.ps) : nullptr;
    }
    __device__ __forceinline__ void q(int j, bool ok, const float *, uint4 v) {
        if (ok && q_) __stcg(q_ + j, v);
    }
    __device__ __forceinline__ void kv(int j, bool ok, const float *, uint4 v) {
        if (ok && k_) __stcg(k_ + j, v);
    }
    __device__ __forceinline__ void pe(int j, bool ok, const float *, uint4 v) {
        if (ok && p_) __stcg(p_ + j, v);
    }
    __device__ __forceinline__ void q1(int64_t i, float y) {
        if (q_) mlaf_st(reinterpret_cast<T *>(q_) + i, y);
    }
    __device__ __forceinline__ void kv1(int64_t i, float y) {
        if (k_) mlaf_st(reinterpret_cast<T *>(k_) + i, y);
    }
    __device__ __forceinline__ void pe1(int64_t i, float y, uint32_t raw) {
        typedef typename mlaf_bits<T>::type B;
        if (p_) {
            if (raw_) reinterpret_cast<B *>(p_)[i] = (B)raw;
            else mlaf_st(reinterpret_cast<T *>(p_) + i, y);
        }
    }
};

/* The plain paged cache [num_blocks, block_size, C + R] in bf16 / f16 / f32: the row
 * [k_nope | rope(k_pe)] at the token's slot (or the rope part in a separate kpe array), from
 * fp32 straight to the cache dtype (the latent dtype's packed vector when they match). Plain
 * stores: streaming ones were slower. */
template <typename T> struct mlaf_wr_paged : mlaf_wr_base {
    struct params {
        void *cache, *kpe; /* kpe NULL: the rope part follows the kv part */
        mlaf_dtype dt;
        int64_t s0, s1, k0, k1; /* elements per block, per slot (cache; kpe) */
    };
    void *kv_, *pe_;
    mlaf_dtype dt_;
    __device__ __forceinline__ mlaf_wr_paged(const params &p, const mlaf_row_args &a, int64_t,
                                             const mlaf_token_info &ti) {
        dt_ = p.dt, kv_ = pe_ = nullptr;
        if (!ti.cache) return;
        const int64_t es = p.dt == MLAF_F32 ? 4 : 2;
        kv_ = static_cast<char *>(p.cache) + mlaf_token_row(a, ti.slot, p.s0, p.s1) * es;
        pe_ = p.kpe ? static_cast<char *>(p.kpe) + mlaf_token_row(a, ti.slot, p.k0, p.k1) * es
                    : static_cast<char *>(kv_) + (int64_t)a.C * es;
    }
    __device__ __forceinline__ void put(void *row, int64_t i, const float *f, uint4 v) {
        constexpr int W = mlaf_vec<T>::W;
        if (dt_ == mlaf_dtype_of<T>())
            *reinterpret_cast<uint4 *>(static_cast<T *>(row) + i) = v;
        else
            mlaf_st_dt_vec<W>(row, dt_, i, f);
    }
    __device__ __forceinline__ void kv(int j, bool ok, const float *f, uint4 v) {
        if (ok && kv_) put(kv_, (int64_t)j * mlaf_vec<T>::W, f, v);
    }
    __device__ __forceinline__ void pe(int j, bool ok, const float *f, uint4 v) {
        if (ok && pe_) put(pe_, (int64_t)j * mlaf_vec<T>::W, f, v);
    }
    __device__ __forceinline__ void kv1(int64_t i, float y) {
        if (kv_) mlaf_st_dt(kv_, dt_, i, y);
    }
    __device__ __forceinline__ void pe1(int64_t i, float y, uint32_t) {
        if (pe_) mlaf_st_dt(pe_, dt_, i, y);
    }
};

/* ---- the cache formats' CUDA rows --------------------------------------------------------
 * mlaf_kv_writer_of<F>: the CUDA writer of format F of src/kv_format.h, one specialization per
 * format beside its writer (the dispatch, kv_cache_launch.cuh, walks them; a format without one
 * does not compile):
 *   template <typename T> using type = W;      the writer for a latent of type T
 *   template <typename T> static constexpr bool kLatent;   false: not instantiated for T
 *                                              (validation rejects that latent dtype)
 *   static constexpr bool kDsa;                instantiated by mla_kv_cache_dsa too
 *   template <typename T> static bool params(const mlaf_kv_cache_job *, typename type<T>::params *)
 *                                              fills them; returns whether its arrays take whole
 *                                              vectors (else the kernel's element-wise shape)
 */
template <int F> struct mlaf_kv_writer_of;

/* The cache arrays take a vector of W values of `es` bytes each at every W-th value. */
static inline bool mlaf_kv_cache_vec_ok(const mlaf_kv_cache_job *job, int64_t W, int64_t es) {
    const int64_t ca = W * es < 16 ? W * es : 16;
    bool ok = mlaf_aligned(job->cache, job->cache_s0 * es, ca) && (job->cache_s1 * es) % ca == 0;
    if (job->kpe) ok = ok && mlaf_aligned(job->kpe, job->kpe_s0 * es, ca) && (job->kpe_s1 * es) % ca == 0;
    return ok;
}

template <> struct mlaf_kv_writer_of<MLAF_KV_PLAIN> {
    template <typename T> using type = mlaf_wr_paged<T>;
    template <typename T> static constexpr bool kLatent = true;
    static constexpr bool kDsa = true;
    template <typename T> static bool params(const mlaf_kv_cache_job *job, typename mlaf_wr_paged<T>::params *p) {
        p->cache = job->cache, p->kpe = job->kpe, p->dt = job->cache_dt;
        p->s0 = job->cache_s0, p->s1 = job->cache_s1, p->k0 = job->kpe_s0, p->k1 = job->kpe_s1;
        return mlaf_kv_cache_vec_ok(job, mlaf_vec<T>::W, (int64_t)mlaf_dtype_size(job->cache_dt));
    }
};

/* Each row's two rstd values as f32 [T, 2] (q, kv): a diagnostic writer, for tests. */
template <typename T> struct mlaf_wr_rstd : mlaf_wr_base {
    struct params {
        float *out;
    };
    float *p_;
    __device__ __forceinline__ mlaf_wr_rstd(const params &p, const mlaf_row_args &, int64_t t,
                                            const mlaf_token_info &)
        : p_(p.out + 2 * t) {}
    __device__ __forceinline__ void finish(float rq, float rkv, int lead) {
        if (lead & MLAF_LEAD_Q) p_[0] = rq;
        if (lead & MLAF_LEAD_KV) p_[1] = rkv;
    }
};

/* Two writers, each receiving every vector. */
template <class A, class B> struct mlaf_wr_pair {
    struct params {
        typename A::params a;
        typename B::params b;
    };
    static constexpr bool kSide = A::kSide || B::kSide, kTailOnly = A::kTailOnly || B::kTailOnly;
    static __device__ __forceinline__ void side(const params &p, const mlaf_row_args &a, int64_t t) {
        if constexpr (A::kSide) A::side(p.a, a, t);
        if constexpr (B::kSide) B::side(p.b, a, t);
    }
    static __device__ __forceinline__ void side_fill(const params &p, const mlaf_row_args &a, int64_t t, int i,
                                                     int n) {
        if constexpr (A::kSide) A::side_fill(p.a, a, t, i, n);
        if constexpr (B::kSide) B::side_fill(p.b, a, t, i, n);
    }
    A x_;
    B y_;
    __device__ __forceinline__ mlaf_wr_pair(const params &p, const mlaf_row_args &a, int64_t t,
                                            const mlaf_token_info &ti)
        : x_(p.a, a, t, ti), y_(p.b, a, t, ti) {}
    __device__ __forceinline__ void q(int j, bool ok, const float *f, uint4 v) { x_.q(j, ok, f, v), y_.q(j, ok, f, v); }
    __device__ __forceinline__ void kv(int j, bool ok, const float *f, uint4 v) {
        x_.kv(j, ok, f, v), y_.kv(j, ok, f, v);
    }
    __device__ __forceinline__ void pe(int j, bool ok, const float *f, uint4 v) {
        x_.pe(j, ok, f, v), y_.pe(j, ok, f, v);
    }
    __device__ __forceinline__ void finish(float rq, float rkv, int lead) {
        x_.finish(rq, rkv, lead), y_.finish(rq, rkv, lead);
    }
    __device__ __forceinline__ void q1(int64_t i, float y) { x_.q1(i, y), y_.q1(i, y); }
    __device__ __forceinline__ void kv1(int64_t i, float y) { x_.kv1(i, y), y_.kv1(i, y); }
    __device__ __forceinline__ void pe1(int64_t i, float y, uint32_t r) { x_.pe1(i, y, r), y_.pe1(i, y, r); }
};
