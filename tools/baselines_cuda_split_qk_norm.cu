/* baselines_cuda_split_qk_norm.cu — split_qk_norm's unfused CUDA chain (see baselines_cuda.cuh). */
#include "baselines_cuda.cuh"

namespace {

/* ---- split + RMSNorm ------------------------------------------------------------------- */
template <typename T>
__global__ void split_kernel(const T *lat, int64_t ls, int32_t Q, int32_t C, int32_t R, T *qd,
                             T *kvd, T *kpe, int64_t kps) {
    const int64_t t = blockIdx.x;
    const T *row = lat + t * ls;
    for (int32_t i = threadIdx.x; i < Q + C + R; i += blockDim.x) {
        T v = row[i];
        if (i < Q)
            qd[t * Q + i] = v;
        else if (i < Q + C)
            kvd[t * C + (i - Q)] = v;
        else if (kpe)
            kpe[t * kps + (i - Q - C)] = v;
    }
}

template <typename T>
__global__ void rmsnorm_kernel(const T *x, int64_t xs, T *y, int64_t ys, const void *w,
                               mlaf_dtype wdt, int32_t n, float eps) {
    const int64_t t = blockIdx.x;
    const T *xr = x + t * xs;
    T *yr = y + t * ys;
    float ss = 0.0f;
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
        float v = io<T>::ld(xr + i);
        ss += v * v;
    }
    ss = block_sum(ss);
    const float rstd = 1.0f / sqrtf(ss / (float)n + eps);
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x)
        io<T>::st(yr + i, io<T>::ld(xr + i) * rstd * ld_any(w, wdt, i));
}

template <typename T>
int split_norm(const mlaf_norm_job *j, void *q_dense, void *kv_dense, cudaStream_t s) {
    const unsigned rows = (unsigned)j->T; /* T < 2^31: one block per row fits grid.x */
    split_kernel<T><<<rows, kThreads, 0, s>>>(static_cast<const T *>(j->latent), j->latent_stride,
                                              j->Q, j->C, j->R, static_cast<T *>(q_dense),
                                              static_cast<T *>(kv_dense),
                                              j->R > 0 ? static_cast<T *>(j->k_pe) : nullptr,
                                              j->k_pe_stride);
    if (j->Q > 0)
        rmsnorm_kernel<T><<<rows, kThreads, 0, s>>>(static_cast<const T *>(q_dense), j->Q,
                                                    static_cast<T *>(j->q), j->q_stride, j->w_q,
                                                    j->w_q_dt, j->Q, j->eps_q);
    if (j->k_nope)
        rmsnorm_kernel<T><<<rows, kThreads, 0, s>>>(static_cast<const T *>(kv_dense), j->C,
                                                    static_cast<T *>(j->k_nope), j->k_nope_stride,
                                                    j->w_kv, j->w_kv_dt, j->C, j->eps_kv);
    return (int)cudaGetLastError();
}

} // namespace

extern "C" int blg_split_qk_norm(const mlaf_norm_job *job, void *q_dense, void *kv_dense,
                                 void *stream) {
    if (job->T == 0) return 0;
    return BY_DTYPE(job->dt, split_norm, job, q_dense, kv_dense, (cudaStream_t)stream);
}
