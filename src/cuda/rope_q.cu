/*
 * rope_q.cu — CUDA entry of rope_q (docs/mla.md): RoPE in place on columns [D-R, D) of every head
 * of q viewed as [T, H, D] (strides s0, s1, 1). The head_norm and q_out forms (docs/mla.md, head_norm) run
 * rope_q_norm.cuh's kernel instead.
 *
 * Vector path (16-byte aligned heads, R a multiple of the vector width W; NeoX: R/2 a
 * multiple of W) — the one real models take:
 *   1. A "unit" is one 16-byte vector of a head's rope part (interleaved: W/2 whole pairs
 *      (2i, 2i+1) sit inside it) or, NeoX, vector j of the first half together with vector j
 *      of the second half (pairs (i, i + R/2) for W consecutive i). A token has H * U units.
 *   2. One shot, K units per thread (K = 2 for interleaved calls of >= 2^22 units, else 1),
 *      the k-th units of a block's threads neighbours (the access of a copy of the pieces):
 *      a thread loads its units' q vectors and positions, then the cos/sin of each unit
 *      (float4 when the table is aligned), rotates with the shared mlaf_rope_x0 /
 *      mlaf_rope_x1 (separate products, one add/subtract: the same bits as the keys of
 *      mla_kv_cache and as the CPU backend) and stores the vectors back. A unit is owned by
 *      one thread, so in place is safe.
 *   3. A position outside [0, max_pos) leaves the token untouched and is counted once (by the
 *      thread of the token's unit 0).
 * Pair path (calls under 16384 NeoX-sized units, where one dependent chain is the whole call,
 * and every layout the vector path refuses): one thread per pair, block (token, tile of 256
 * pairs); the y extent is capped at 65535 and threads stride over the rest; interleaved pairs
 * move as one 2-element word when aligned.
 *
 * Blocks over whole tokens with several batches of 4 units per thread (the kernel before) sat
 * at 69-79% of the piece copy at T >= 16384 and lost whole waves at mid T; the one-shot grid
 * keeps every SM fed to the last block (dev/cuda/rope_q_v2). Unit indices are 32-bit when the
 * call's units fit, offsets 64-bit.
 */
#include "row_math.cuh"
#include "rope_q_norm.cuh"

struct mlaf_rope_q_args {
    void *q;
    int64_t T, H, s0, s1;
    int32_t D, R;
    int32_t neox, pairvec;
    const void *pos;
    int32_t pos64;
    const float *cos_sin;
    int64_t cs_stride, max_pos;
    int32_t *err;
};

#define MLAF_ROPE_Q_THREADS 256

template <typename T> struct mlaf_pair_word;
template <> struct mlaf_pair_word<float> { typedef float2 type; };
template <> struct mlaf_pair_word<__half> { typedef uint32_t type; };
template <> struct mlaf_pair_word<__nv_bfloat16> { typedef uint32_t type; };

template <typename T, typename IDX>
__global__ void __launch_bounds__(MLAF_ROPE_Q_THREADS) mlaf_rope_q_kernel(const mlaf_rope_q_args a) {
    mlaf_pdl_begin();
    const int64_t t = blockIdx.x;
    const int64_t p = mlaf_ld_index(a.pos, a.pos64, t);
    if (p < 0 || p >= a.max_pos) {
        if (a.err && blockIdx.y == 0 && threadIdx.x == 0) mlaf_cuda_error_count_add(a.err, 1);
        return;
    }
    const float *cs = a.cos_sin + p * a.cs_stride;
    const IDX half = (IDX)(a.R / 2);
    const IDX n = (IDX)a.H * half;
    T *row = static_cast<T *>(a.q) + t * a.s0 + (a.D - a.R);
    for (IDX j = (IDX)blockIdx.y * MLAF_ROPE_Q_THREADS + threadIdx.x; j < n;
         j += (IDX)gridDim.y * MLAF_ROPE_Q_THREADS) {
        const IDX h = j / half, i = j - h * half;
        T *x = row + (int64_t)h * a.s1;
        const float co = __ldg(cs + i), si = __ldg(cs + half + i);
        if (a.neox) {
            const float x0 = mlaf_ld(x + i), x1 = mlaf_ld(x + i + half);
            mlaf_st(x + i, mlaf_rope_x0(x0, x1, co, si));
            mlaf_st(x + i + half, mlaf_rope_x1(x0, x1, co, si));
        } else if (a.pairvec) {
            typedef typename mlaf_pair_word<T>::type PW;
            PW *w = reinterpret_cast<PW *>(x + 2 * (int64_t)i);
            PW v = *w;
            T *e = reinterpret_cast<T *>(&v);
            const float x0 = mlaf_elem<T>::load(e[0]), x1 = mlaf_elem<T>::load(e[1]);
            e[0] = mlaf_elem<T>::store(mlaf_rope_x0(x0, x1, co, si));
            e[1] = mlaf_elem<T>::store(mlaf_rope_x1(x0, x1, co, si));
            *w = v;
        } else {
            const float x0 = mlaf_ld(x + 2 * i), x1 = mlaf_ld(x + 2 * i + 1);
            mlaf_st(x + 2 * i, mlaf_rope_x0(x0, x1, co, si));
            mlaf_st(x + 2 * i + 1, mlaf_rope_x1(x0, x1, co, si));
        }
    }
}

/* ---- vector path ------------------------------------------------------------------- */
/* Calls of at least this many NeoX-sized units (R/2 values) take the vector path. */
#define MLAF_ROPE_Q_VEC_UNITS 16384

/* n consecutive floats of the cos_sin table; float4 loads when the table is aligned. */
template <int N>
__device__ __forceinline__ void mlaf_ld_cs(const float *p, bool vec, float *f) {
    if (N % 4 == 0 && vec) {
#pragma unroll
        for (int k = 0; k < N / 4; k++) {
            const float4 x = __ldg(reinterpret_cast<const float4 *>(p) + k);
            f[4 * k] = x.x, f[4 * k + 1] = x.y, f[4 * k + 2] = x.z, f[4 * k + 3] = x.w;
        }
    } else {
#pragma unroll
        for (int k = 0; k < N; k++) f[k] = __ldg(p + k);
    }
}

/* One unit rotated by its cos (co) / sin (si) and stored in place: NEOX, x0 the W first values of
 * W pairs (i, i + R/2) at p and x1 their partners at p + half; else x0 W / 2 whole pairs. */
template <typename T, bool NEOX>
__device__ __forceinline__ void mlaf_rope_q_rotate_store(T *p, int32_t half, uint4 x0, uint4 x1, const float *co,
                                                         const float *si) {
    constexpr int W = mlaf_vec<T>::W;
    float f0[W];
    mlaf_vec<T>::unpack(x0, f0);
    if constexpr (NEOX) {
        float f1[W];
        mlaf_vec<T>::unpack(x1, f1);
#pragma unroll
        for (int e = 0; e < W; e++) {
            const float y0 = mlaf_rope_x0(f0[e], f1[e], co[e], si[e]);
            f1[e] = mlaf_rope_x1(f0[e], f1[e], co[e], si[e]);
            f0[e] = y0;
        }
        *reinterpret_cast<uint4 *>(p) = mlaf_vec<T>::pack(f0);
        *reinterpret_cast<uint4 *>(p + half) = mlaf_vec<T>::pack(f1);
    } else {
#pragma unroll
        for (int e = 0; e < W / 2; e++) {
            const float y0 = mlaf_rope_x0(f0[2 * e], f0[2 * e + 1], co[e], si[e]);
            f0[2 * e + 1] = mlaf_rope_x1(f0[2 * e], f0[2 * e + 1], co[e], si[e]);
            f0[2 * e] = y0;
        }
        *reinterpret_cast<uint4 *>(p) = mlaf_vec<T>::pack(f0);
    }
}

/* K units per thread, one shot: thread i of block b takes units (b * 256 * K) + k * 256 + i, so
 * the threads of a block read neighbouring vectors for each k; every unit loads its token's
 * position and its own cos/sin. IDX: uint32_t when T * units per token < 2^31. */
template <typename T, bool NEOX, int K, typename IDX>
__global__ void __launch_bounds__(MLAF_ROPE_Q_THREADS)
mlaf_rope_q_vec_kernel(const mlaf_rope_q_args a, int32_t units_per_token, int32_t cs_vec) {
    mlaf_pdl_begin();
    constexpr int W = mlaf_vec<T>::W;
    const int32_t half = a.R / 2;
    const int32_t U = NEOX ? half / W : a.R / W; /* units per head */
    const IDX upt = (IDX)units_per_token, n = (IDX)a.T * upt;
    const IDX g0 = (IDX)blockIdx.x * (MLAF_ROPE_Q_THREADS * K) + (IDX)threadIdx.x;
    T *base = static_cast<T *>(a.q) + (a.D - a.R);
    uint4 x0[K], x1[K];
    int64_t pos[K];
    T *ptr[K];
    int32_t unit[K];
    bool first[K];
#pragma unroll
    for (int k = 0; k < K; k++) {
        const IDX g = g0 + (IDX)(k * MLAF_ROPE_Q_THREADS);
        ptr[k] = nullptr;
        if (g < n) {
            const IDX t = g / upt;
            const int32_t rem = (int32_t)(g - t * upt), h = rem / U;
            unit[k] = rem - h * U, first[k] = rem == 0;
            pos[k] = mlaf_ld_index(a.pos, a.pos64, (int64_t)t);
            ptr[k] = base + (int64_t)t * a.s0 + (int64_t)h * a.s1 + unit[k] * W;
            x0[k] = *reinterpret_cast<const uint4 *>(ptr[k]);
            if (NEOX) x1[k] = *reinterpret_cast<const uint4 *>(ptr[k] + half);
        }
    }
#pragma unroll
    for (int k = 0; k < K; k++) {
        if (!ptr[k]) continue;
        if (pos[k] < 0 || pos[k] >= a.max_pos) {
            if (first[k] && a.err) mlaf_cuda_error_count_add(a.err, 1);
            continue;
        }
        /* NEOX: pairs (i, i + R/2), i = unit * W .. + W; else W / 2 whole pairs (2i, 2i+1) */
        const float *cs = a.cos_sin + pos[k] * a.cs_stride;
        constexpr int NC = NEOX ? W : W / 2;
        float co[NC], si[NC];
        mlaf_ld_cs<NC>(cs + unit[k] * NC, cs_vec, co);
        mlaf_ld_cs<NC>(cs + half + unit[k] * NC, cs_vec, si);
        mlaf_rope_q_rotate_store<T, NEOX>(ptr[k], half, x0[k], NEOX ? x1[k] : x0[k], co, si);
    }
}

/* The vector path applies: 16-byte aligned rope vectors in every head of every token. */
template <typename T>
static bool mlaf_rope_q_vec_ok(const mlaf_rope_q_args &a) {
    constexpr int W = mlaf_vec<T>::W;
    const int64_t es = sizeof(T);
    if (a.neox ? (a.R / 2) % W : a.R % W) return false;
    if ((uintptr_t)a.q % 16 || (a.s0 * es) % 16 || (a.s1 * es) % 16 || ((int64_t)(a.D - a.R) * es) % 16)
        return false;
    const int64_t upt = a.H * (a.neox ? a.R / (2 * W) : a.R / W);
    /* 32-bit unit indices within a token; a grid of at most 2^31 - 1 blocks of one unit a thread */
    return upt > 0 && upt <= ((int64_t)1 << 24) && a.T * upt / MLAF_ROPE_Q_THREADS < 0x7fffffff;
}

/* Interleaved calls of at least this many units take two units per thread (more loads in flight
 * per thread; NeoX units are two vectors already). */
#define MLAF_ROPE_Q_K2_UNITS ((int64_t)1 << 22)

template <typename T, int K, typename IDX>
static void mlaf_rope_q_vec_go(const mlaf_rope_q_args &a, int32_t upt, int32_t cs_vec, cudaStream_t stream) {
    const int64_t blocks = (a.T * upt + MLAF_ROPE_Q_THREADS * K - 1) / (MLAF_ROPE_Q_THREADS * K);
    if (a.neox)
        mlaf_launch(mlaf_rope_q_vec_kernel<T, true, K, IDX>, (unsigned)blocks, MLAF_ROPE_Q_THREADS, 0, stream, a,
                    upt, cs_vec);
    else
        mlaf_launch(mlaf_rope_q_vec_kernel<T, false, K, IDX>, (unsigned)blocks, MLAF_ROPE_Q_THREADS, 0, stream, a,
                    upt, cs_vec);
}

template <typename T>
static cudaError_t mlaf_rope_q_vec_launch(const mlaf_rope_q_args &a, cudaStream_t stream) {
    constexpr int W = mlaf_vec<T>::W;
    const int32_t upt = (int32_t)(a.H * (a.neox ? a.R / (2 * W) : a.R / W));
    const int64_t units = a.T * upt;
    const int32_t cs_vec = (uintptr_t)a.cos_sin % 16 == 0 && a.cs_stride % 4 == 0 && (a.R / 2) % 4 == 0;
    const bool k2 = !a.neox && units >= MLAF_ROPE_Q_K2_UNITS;
    const bool narrow = units + 2 * MLAF_ROPE_Q_THREADS < ((int64_t)1 << 31);
    if (k2) {
        if (narrow) mlaf_rope_q_vec_go<T, 2, uint32_t>(a, upt, cs_vec, stream);
        else mlaf_rope_q_vec_go<T, 2, uint64_t>(a, upt, cs_vec, stream);
    } else {
        if (narrow) mlaf_rope_q_vec_go<T, 1, uint32_t>(a, upt, cs_vec, stream);
        else mlaf_rope_q_vec_go<T, 1, uint64_t>(a, upt, cs_vec, stream);
    }
    return cudaGetLastError();
}

/* ---- generic path / dispatch --------------------------------------------------------- */
template <typename T>
static cudaError_t mlaf_rope_q_pair_launch(const mlaf_rope_q_args &a, cudaStream_t stream) {
    const int64_t n = a.H * (a.R / 2);
    int64_t ny = (n + MLAF_ROPE_Q_THREADS - 1) / MLAF_ROPE_Q_THREADS;
    if (ny > 65535) ny = 65535;
    const dim3 grid((unsigned)a.T, (unsigned)ny);
    if (n < ((int64_t)1 << 31) - 2 * 65535 * MLAF_ROPE_Q_THREADS)
        mlaf_launch(mlaf_rope_q_kernel<T, uint32_t>, grid, MLAF_ROPE_Q_THREADS, 0, stream, a);
    else
        mlaf_launch(mlaf_rope_q_kernel<T, uint64_t>, grid, MLAF_ROPE_Q_THREADS, 0, stream, a);
    return cudaGetLastError();
}

template <typename T>
static cudaError_t mlaf_rope_q_launch(const mlaf_rope_q_args &a, int sms, cudaStream_t stream) {
    /* A call of a few thousand units is one dependent chain: the pair kernel's (position,
     * then cos/sin and q together) is the shorter one there (measured on the H200,
     * dev/README.md). */
    (void)sms;
    const int64_t units = a.T * a.H * (a.R / (2 * mlaf_vec<T>::W));
    if (units >= MLAF_ROPE_Q_VEC_UNITS && mlaf_rope_q_vec_ok<T>(a)) return mlaf_rope_q_vec_launch<T>(a, stream);
    return mlaf_rope_q_pair_launch<T>(a, stream);
}

extern "C" mlaf_status mlaf_cuda_rope_q(mlaf_context *ctx, const mlaf_rope_q_job *job) {
    if (job->head_norm || job->q_out) { /* docs/mla.md, head_norm: rope_q_norm.cuh */
        if (job->T == 0 || job->Hpad == 0) return MLAF_OK;
        mlaf_cuda_device_guard guard(ctx);
        const cudaError_t e = mlaf_rope_qn_run(job, ctx->cuda_sm_count, (cudaStream_t)ctx->cuda_stream);
        if (e != cudaSuccess)
            return mlaf_fail(ctx, MLAF_ERR_DEVICE, "rope_q: kernel launch failed: %s", cudaGetErrorString(e));
        return MLAF_OK;
    }
    if (job->T == 0 || job->H == 0 || job->rope.style == MLAF_ROPE_NONE) return MLAF_OK; /* none: nothing changes */
    mlaf_cuda_device_guard guard(ctx);
    mlaf_rope_q_args a;
    a.q = job->q;
    a.T = job->T, a.H = job->H, a.s0 = job->s0, a.s1 = job->s1;
    a.D = job->D, a.R = job->rope.R;
    a.neox = job->rope.style == MLAF_ROPE_NEOX;
    const int64_t es = (int64_t)mlaf_dtype_size(job->dt), pw = 2 * es;
    a.pairvec = (uintptr_t)job->q % (uintptr_t)pw == 0 && (job->s0 * es) % pw == 0 &&
                (job->s1 * es) % pw == 0 && ((int64_t)(job->D - job->rope.R) * es) % pw == 0;
    a.pos = job->rope.positions;
    a.pos64 = job->rope.pos_dt == MLAF_I64;
    a.cos_sin = job->rope.cos_sin;
    a.cs_stride = job->rope.cos_sin_stride;
    a.max_pos = job->rope.max_pos;
    a.err = job->error_count;
    const cudaStream_t stream = (cudaStream_t)ctx->cuda_stream;
    cudaError_t e;
    const int sms = ctx->cuda_sm_count;
    if (job->dt == MLAF_F32) e = mlaf_rope_q_launch<float>(a, sms, stream);
    else if (job->dt == MLAF_F16) e = mlaf_rope_q_launch<__half>(a, sms, stream);
    else e = mlaf_rope_q_launch<__nv_bfloat16>(a, sms, stream);
    if (e != cudaSuccess)
        return mlaf_fail(ctx, MLAF_ERR_DEVICE, "rope_q: kernel launch failed: %s",
                         cudaGetErrorString(e));
    return MLAF_OK;
}
