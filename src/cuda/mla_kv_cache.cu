/*
 * mla_kv_cache.cu — CUDA entry of mla_kv_cache (SPEC §3): the row kernel (row_launch.cuh) with
 * the token decision and RoPE, and two writers: the dense outputs (q, optional k_nope and roped
 * k_pe) and the paged cache row [k_nope | rope(k_pe)] at slot_mapping[t].
 */
#include "row_launch.cuh"

template <typename T> static cudaError_t kv_launch(const mlaf_context *ctx, const mlaf_kv_cache_job *job) {
    typedef mlaf_wr_pair<mlaf_wr_dense<T>, mlaf_wr_paged<T>> Wr;
    mlaf_row_args a;
    mlaf_row_args_from_norm(&a, &job->norm);
    a.pos = job->rope.positions;
    a.pos64 = job->rope.pos_dt == MLAF_I64;
    a.neox = job->rope.style == MLAF_ROPE_NEOX;
    a.cos_sin = job->rope.cos_sin;
    a.cs_stride = job->rope.cos_sin_stride;
    a.max_pos = job->rope.max_pos;
    a.slots = job->slots;
    a.slot64 = job->slot_dt == MLAF_I64;
    a.n_map = job->n_map;
    a.n_slots = job->num_blocks * job->block_size;
    a.block_size = job->block_size;
    a.err = job->error_count;
    bool vec_ok;
    typename Wr::params wp;
    wp.a = mlaf_row_dense_params<T>(&job->norm, false, &vec_ok);
    wp.b.cache = job->cache, wp.b.dt = job->cache_dt, wp.b.s0 = job->cache_s0, wp.b.s1 = job->cache_s1;
    /* the cache rows take the latent's vectors: W values aligned to their size (up to 16 bytes) */
    const int64_t ces = (int64_t)mlaf_dtype_size(job->cache_dt), W = mlaf_vec<T>::W,
                  ca = W * ces < 16 ? W * ces : 16;
    vec_ok = vec_ok && mlaf_aligned(job->cache, job->cache_s0 * ces, ca) && (job->cache_s1 * ces) % ca == 0;
    return mlaf_row_launch<T, true, Wr>(a, wp, vec_ok, ctx->cuda_sm_count, ctx->cuda_cc,
                                        (cudaStream_t)ctx->cuda_stream);
}

extern "C" mlaf_status mlaf_cuda_mla_kv_cache(mlaf_context *ctx, const mlaf_kv_cache_job *job) {
    if (job->format != MLAF_KV_PLAIN || job->kpe)
        return mlaf_fail(ctx, MLAF_ERR_UNSUPPORTED, "mla_kv_cache: cache format %s is not implemented on the cuda backend",
                         job->kpe ? "plain with kpe" : mlaf_kv_format_name(job->format));
    if (job->norm.T == 0) return MLAF_OK;
    mlaf_cuda_device_guard guard(ctx);
    const cudaError_t e = job->norm.dt == MLAF_F32   ? kv_launch<float>(ctx, job)
                          : job->norm.dt == MLAF_F16 ? kv_launch<__half>(ctx, job)
                                                     : kv_launch<__nv_bfloat16>(ctx, job);
    if (e != cudaSuccess)
        return mlaf_fail(ctx, MLAF_ERR_DEVICE, "mla_kv_cache: kernel launch failed: %s", cudaGetErrorString(e));
    return MLAF_OK;
}
