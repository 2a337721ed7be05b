/* baselines_cuda_rope_q.cu — rope_q's unfused CUDA chain: head_norm, then gather / rotate / scatter (see
 * baselines_cuda.cuh). */
#include "baselines_cuda.cuh"

namespace {

template <typename T>
__global__ void gather_kernel(const T *q, int64_t H, int32_t D, int32_t R, int64_t s0, int64_t s1,
                              T *g, int64_t n, bool scatter) {
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = idx / R;
        const int32_t j = (int32_t)(idx % R);
        const int64_t off = (r / H) * s0 + (r % H) * s1 + (D - R) + j;
        if (scatter)
            const_cast<T *>(q)[off] = g[idx];
        else
            g[idx] = q[off];
    }
}

/* rope_q's head_norm pass (docs/mla.md, head_norm): one block per head, weightless RMSNorm in place. */
template <typename T>
__global__ void head_norm_kernel(T *q, int64_t H, int64_t s0, int64_t s1, int32_t D, float eps) {
    const int64_t r = blockIdx.x;
    T *x = q + (r / H) * s0 + (r % H) * s1;
    float ss = 0.0f;
    for (int32_t i = threadIdx.x; i < D; i += blockDim.x) {
        const float v = io<T>::ld(x + i);
        ss += v * v;
    }
    ss = block_sum(ss);
    const float rstd = 1.0f / sqrtf(ss / (float)D + eps);
    for (int32_t i = threadIdx.x; i < D; i += blockDim.x) io<T>::st(x + i, io<T>::ld(x + i) * rstd);
}

template <typename T> int head_norm(const mlaf_rope_q_job *j, cudaStream_t s) {
    const int64_t rows = j->T * j->H;
    if (rows == 0) return 0;
    head_norm_kernel<T><<<(unsigned)rows, kThreads, 0, s>>>(static_cast<T *>(j->q), j->H, j->s0, j->s1, j->D,
                                                            j->head_eps);
    return (int)cudaGetLastError();
}

template <typename T> int rope_q(const mlaf_rope_q_job *j, void *gather, cudaStream_t s) {
    const int64_t rows = j->T * j->H, n = rows * j->rope.R;
    if (n == 0) return 0;
    T *q = static_cast<T *>(j->q), *g = static_cast<T *>(gather);
    gather_kernel<T><<<grid_for(n, kThreads), kThreads, 0, s>>>(q, j->H, j->D, j->rope.R, j->s0,
                                                                j->s1, g, n, false);
    int e = rope_rows<T>(g, rows, j->rope.R, j->H, &j->rope, s);
    if (e) return e;
    gather_kernel<T><<<grid_for(n, kThreads), kThreads, 0, s>>>(q, j->H, j->D, j->rope.R, j->s0,
                                                                j->s1, g, n, true);
    return (int)cudaGetLastError();
}

} // namespace

extern "C" int blg_head_norm(const mlaf_rope_q_job *job, void *stream) {
    return BY_DTYPE(job->dt, head_norm, job, (cudaStream_t)stream);
}

extern "C" int blg_rope_q(const mlaf_rope_q_job *job, void *gather, void *stream) {
    return BY_DTYPE(job->dt, rope_q, job, gather, (cudaStream_t)stream);
}
