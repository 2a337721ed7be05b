/*
 * mla_kv_cache_dsa.cu — CUDA entry of mla_kv_cache with the DSA indexer key branch (docs/dsa.md):
 * the row kernels of mla_kv_cache.cu with a third writer, mlaf_wr_index (index_row.cuh), whose
 * key rows run as side work on blocks of their own interleaved with the MLA rows' blocks: one
 * launch for both. Kept apart from mla_kv_cache.cu so that the plain op's instantiations (and their
 * compile time) are untouched; the launch choice is the same (mlaf_row_launch).
 */
#include "index_row.cuh"
#include "kv_cache_launch.cuh"

template <typename T>
static cudaError_t dsa_launch(const mlaf_context *ctx, const mlaf_kv_cache_job *job, const mlaf_index_job *ix) {
    typename mlaf_wr_index<T>::params xp;
    xp.k = ix->k, xp.w = ix->w, xp.b = ix->b, xp.ks = ix->k_stride;
    xp.w_f32 = ix->w_dt == MLAF_F32, xp.neox = ix->style == MLAF_ROPE_NEOX, xp.hadamard = ix->hadamard;
    xp.mode = (int32_t)ix->scale, xp.ln_eps = ix->ln_eps, xp.amax_eps = ix->amax_eps;
    xp.cache = ix->cache, xp.bstride = ix->block_stride;
    xp.out = ix->out, xp.os = ix->out_stride;
    xp.topk = ix->topk, xp.tks = ix->topk_stride, xp.tkn = ix->topk_n;
    xp.copies = ix->copies, xp.copy_stride = ix->copy_stride;
    return mlaf_kv_cache_writer<T, true>(job, [&](auto tag, const auto &cp, bool cache_vec_ok) {
        typedef mlaf_wr_pair<mlaf_wr_pair<mlaf_wr_out<T>, typename decltype(tag)::type>, mlaf_wr_index<T>> Wr;
        bool vec_ok;
        typename Wr::params wp;
        wp.a.a = mlaf_row_out_params<T>(&job->norm, false, &vec_ok);
        wp.a.b = cp;
        wp.b = xp;
        return mlaf_row_launch<T, true, Wr>(mlaf_kv_args(job), wp, vec_ok && cache_vec_ok, ctx->cuda_sm_count,
                                            ctx->cuda_cc, (cudaStream_t)ctx->cuda_stream);
    });
}

extern "C" mlaf_status mlaf_cuda_mla_kv_cache_dsa(mlaf_context *ctx, const mlaf_kv_cache_job *job,
                                                  const mlaf_index_job *ix) {
    if (job->norm.T == 0) return MLAF_OK;
    mlaf_cuda_device_guard guard(ctx);
    const cudaError_t e = job->norm.dt == MLAF_F32   ? dsa_launch<float>(ctx, job, ix)
                          : job->norm.dt == MLAF_F16 ? dsa_launch<__half>(ctx, job, ix)
                                                     : dsa_launch<__nv_bfloat16>(ctx, job, ix);
    if (e != cudaSuccess)
        return mlaf_fail(ctx, MLAF_ERR_DEVICE, "mla_kv_cache (indexer branch): kernel launch failed: %s",
                         cudaGetErrorString(e));
    return MLAF_OK;
}
