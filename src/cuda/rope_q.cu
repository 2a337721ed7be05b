/*
 * rope_q.cu — CUDA entry of rope_q (SPEC §3): RoPE in place on columns [D-R, D) of every head
 * of q viewed as [T, H, D] (strides s0, s1, 1).
 *
 * 1. Block (x = token t, y = a tile of the token's H * R/2 rotation pairs): every thread reads
 *    positions[t]; a position outside [0, max_pos) leaves the token untouched and is counted
 *    once (by thread 0 of the first tile).
 * 2. One thread per pair (h, i): pair (2i, 2i+1) interleaved or (i, i+R/2) NeoX of head h;
 *    it reads both values, rotates them with the shared mlaf_rope_x0 / mlaf_rope_x1 (separate
 *    products and one add/subtract: the same bits as the keys of mla_kv_cache and as the CPU
 *    backend) and writes both back. A pair is owned by one thread, so in place is safe.
 * 3. Interleaved pairs are moved as one 2-element word when every address is aligned to it.
 *
 * Launch shape: 256 threads, grid (T, ceil(H*R/2 / 256)) — the y extent is capped at 65535
 * and the threads stride over the rest. Adjacent threads take adjacent pairs of a head and
 * then the next head, so a warp touches one or two contiguous 128-byte spans. The per-pair
 * index split (head, pair) is 32-bit when H * R/2 < 2^31 (always, for real models) and
 * 64-bit otherwise; token offsets are always 64-bit. The op is memory-bound on the R rope
 * columns only; nope columns are never touched.
 */
#include "norm_common.cuh"

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
    const int64_t t = blockIdx.x;
    const int64_t p = mlaf_ld_index(a.pos, a.pos64, t);
    if (p < 0 || p >= a.max_pos) {
        if (a.err && blockIdx.y == 0 && threadIdx.x == 0) atomicAdd(a.err, 1);
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

template <typename T>
static cudaError_t mlaf_rope_q_launch(const mlaf_rope_q_args &a, cudaStream_t stream) {
    const int64_t n = a.H * (a.R / 2);
    int64_t ny = (n + MLAF_ROPE_Q_THREADS - 1) / MLAF_ROPE_Q_THREADS;
    if (ny > 65535) ny = 65535;
    const dim3 grid((unsigned)a.T, (unsigned)ny);
    if (n < ((int64_t)1 << 31) - 2 * 65535 * MLAF_ROPE_Q_THREADS)
        mlaf_rope_q_kernel<T, uint32_t><<<grid, MLAF_ROPE_Q_THREADS, 0, stream>>>(a);
    else
        mlaf_rope_q_kernel<T, uint64_t><<<grid, MLAF_ROPE_Q_THREADS, 0, stream>>>(a);
    return cudaGetLastError();
}

extern "C" mlaf_status mlaf_cuda_rope_q(mlaf_context *ctx, const mlaf_rope_q_job *job) {
    if (job->T == 0 || job->H == 0) return MLAF_OK;
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
    if (job->dt == MLAF_F32) e = mlaf_rope_q_launch<float>(a, stream);
    else if (job->dt == MLAF_F16) e = mlaf_rope_q_launch<__half>(a, stream);
    else e = mlaf_rope_q_launch<__nv_bfloat16>(a, stream);
    if (e != cudaSuccess)
        return mlaf_fail(ctx, MLAF_ERR_DEVICE, "rope_q: kernel launch failed: %s",
                         cudaGetErrorString(e));
    return MLAF_OK;
}
