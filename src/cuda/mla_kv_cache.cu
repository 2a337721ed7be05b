/*
 * mla_kv_cache.cu — CUDA entry of mla_kv_cache (docs/mla.md): the row kernel (row_launch.cuh) with
 * the token decision and RoPE, and two writers: the outputs (q, optional k_nope and roped k_pe,
 * dense, and q / k_nope quantized when asked) and the cache record at slot_mapping[t] in the call's format: plain [k_nope | rope(k_pe)]
 * (row_writers.cuh), per-tensor fp8, fp8_ds_mla or fp8_v4 (row_writers_fp8.cuh). With kv_rope_tail
 * (docs/mla.md, kv_rope_tail) the row kernel rotates the kv part's tail itself (row_core.cuh, mlaf_tail_vec), so
 * every writer receives the finished values.
 */
#include "kv_cache_launch.cuh"

template <typename T> static cudaError_t kv_launch(const mlaf_context *ctx, const mlaf_kv_cache_job *job) {
    return mlaf_kv_cache_writer<T, false>(job, [&](auto tag, const auto &cp, bool cache_vec_ok) {
        typedef mlaf_wr_pair<mlaf_wr_out<T>, typename decltype(tag)::type> Wr;
        bool vec_ok;
        typename Wr::params wp;
        wp.a = mlaf_row_out_params<T>(&job->norm, false, &vec_ok);
        wp.b = cp;
        return mlaf_row_launch<T, true, Wr>(mlaf_kv_args(job), wp, vec_ok && cache_vec_ok, ctx->cuda_sm_count,
                                            ctx->cuda_cc, (cudaStream_t)ctx->cuda_stream);
    });
}

extern "C" mlaf_status mlaf_cuda_mla_kv_cache(mlaf_context *ctx, const mlaf_kv_cache_job *job) {
    if (job->norm.T == 0) return MLAF_OK;
    mlaf_cuda_device_guard guard(ctx);
    const cudaError_t e = job->norm.dt == MLAF_F32   ? kv_launch<float>(ctx, job)
                          : job->norm.dt == MLAF_F16 ? kv_launch<__half>(ctx, job)
                                                     : kv_launch<__nv_bfloat16>(ctx, job);
    if (e != cudaSuccess)
        return mlaf_fail(ctx, MLAF_ERR_DEVICE, "mla_kv_cache: kernel launch failed: %s", cudaGetErrorString(e));
    return MLAF_OK;
}
