/*
 * split_qk_norm.cu — CUDA entry of split_qk_norm (SPEC §2).
 *
 * 1. Turn the validated job into the row kernel's arguments.
 * 2. Launch the shared row kernel (norm_common.cuh) without the cache epilogue: q and kv
 *    parts normalized, the pe part copied bit for bit.
 * Limits and launch shape: see norm_common.cuh (one warp per row, 4 rows per block,
 * 16-byte vector fast path for aligned shapes, element-wise generic path otherwise).
 */
#include "norm_common.cuh"

extern "C" mlaf_status mlaf_cuda_split_qk_norm(mlaf_context *ctx, const mlaf_norm_job *job) {
    if (job->T == 0) return MLAF_OK;
    mlaf_cuda_device_guard guard(ctx);
    mlaf_row_args a;
    mlaf_row_args_from_norm(&a, job);
    cudaError_t e = mlaf_row_launch<false>(a, job->dt, ctx->cuda_sm_count, (cudaStream_t)ctx->cuda_stream,
                                            mlaf_row_policy_for(ctx));
    if (e != cudaSuccess)
        return mlaf_fail(ctx, MLAF_ERR_DEVICE, "split_qk_norm: kernel launch failed: %s",
                         cudaGetErrorString(e));
    return MLAF_OK;
}
