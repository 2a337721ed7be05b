/*
 * split_qk_norm.cu — CUDA entry of split_qk_norm (docs/mla.md): the row kernel (row_launch.cuh)
 * with the output writer (dense q, k_nope, k_pe and the quantized q / k_nope); the pe part is copied
 * bit for bit.
 */
#include "row_launch.cuh"

template <typename T> static cudaError_t split_launch(const mlaf_context *ctx, const mlaf_norm_job *job) {
    mlaf_row_args a;
    mlaf_row_args_from_norm(&a, job);
    bool vec_ok;
    const typename mlaf_wr_out<T>::params wp = mlaf_row_out_params<T>(job, true, &vec_ok);
    return mlaf_row_launch<T, false, mlaf_wr_out<T>>(a, wp, vec_ok, ctx->cuda_sm_count, ctx->cuda_cc,
                                                    (cudaStream_t)ctx->cuda_stream);
}

extern "C" mlaf_status mlaf_cuda_split_qk_norm(mlaf_context *ctx, const mlaf_norm_job *job) {
    if (job->T == 0) return MLAF_OK;
    mlaf_cuda_device_guard guard(ctx);
    const cudaError_t e = job->dt == MLAF_F32   ? split_launch<float>(ctx, job)
                          : job->dt == MLAF_F16 ? split_launch<__half>(ctx, job)
                                                : split_launch<__nv_bfloat16>(ctx, job);
    if (e != cudaSuccess)
        return mlaf_fail(ctx, MLAF_ERR_DEVICE, "split_qk_norm: kernel launch failed: %s", cudaGetErrorString(e));
    return MLAF_OK;
}
