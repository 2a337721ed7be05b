/*
 * mla_kv_cache_dsa.cu — CUDA entry of mla_kv_cache with the DSA indexer key branch (SPEC §10):
 * the row kernels of mla_kv_cache.cu with a third writer, mlaf_wr_index (index_row.cuh), which
 * computes the token's indexer key row at the end of its MLA row, on the row's warp: one launch
 * for both. Kept apart from mla_kv_cache.cu so that the plain op's instantiations (and their
 * compile time) are untouched; the launch choice is the same (mlaf_row_launch).
 */
#include "index_row.cuh"
#include "row_launch.cuh"

/* The row arguments of a validated job (as mla_kv_cache.cu's). */
static mlaf_row_args dsa_args(const mlaf_kv_cache_job *job) {
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
    return a;
}

static bool dsa_cache_vec_ok(const mlaf_kv_cache_job *job, int64_t W, int64_t es) {
    const int64_t ca = W * es < 16 ? W * es : 16;
    bool ok = mlaf_aligned(job->cache, job->cache_s0 * es, ca) && (job->cache_s1 * es) % ca == 0;
    if (job->kpe) ok = ok && mlaf_aligned(job->kpe, job->kpe_s0 * es, ca) && (job->kpe_s1 * es) % ca == 0;
    return ok;
}

template <typename T, class Wc>
static cudaError_t dsa_go(const mlaf_context *ctx, const mlaf_kv_cache_job *job, const typename Wc::params &cp,
                          const typename mlaf_wr_index<T>::params &xp, bool cache_vec_ok) {
    typedef mlaf_wr_pair<mlaf_wr_pair<mlaf_wr_dense<T>, Wc>, mlaf_wr_index<T>> Wr;
    bool vec_ok;
    typename Wr::params wp;
    wp.a.a = mlaf_row_dense_params<T>(&job->norm, false, &vec_ok);
    wp.a.b = cp;
    wp.b = xp;
    return mlaf_row_launch<T, true, Wr>(dsa_args(job), wp, vec_ok && cache_vec_ok, ctx->cuda_sm_count, ctx->cuda_cc,
                                        (cudaStream_t)ctx->cuda_stream);
}

template <typename T>
static cudaError_t dsa_launch(const mlaf_context *ctx, const mlaf_kv_cache_job *job, const mlaf_index_job *ix) {
    constexpr int W = mlaf_vec<T>::W;
    typename mlaf_wr_index<T>::params xp;
    xp.k = ix->k, xp.w = ix->w, xp.b = ix->b, xp.ks = ix->k_stride;
    xp.w_f32 = ix->w_dt == MLAF_F32, xp.neox = ix->style == MLAF_ROPE_NEOX, xp.hadamard = ix->hadamard;
    xp.mode = (int32_t)ix->scale, xp.ln_eps = ix->ln_eps, xp.amax_eps = ix->amax_eps;
    xp.cache = ix->cache, xp.bstride = ix->block_stride;
    xp.out = ix->out, xp.os = ix->out_stride;
    xp.topk = ix->topk, xp.tks = ix->topk_stride, xp.tkn = ix->topk_n;
    xp.copies = ix->copies, xp.copy_stride = ix->copy_stride;
    if (job->format == MLAF_KV_FP8) {
        typename mlaf_wr_fp8<T>::params p;
        p.cache = job->cache, p.kpe = job->kpe;
        p.s0 = job->cache_s0, p.s1 = job->cache_s1, p.k0 = job->kpe_s0, p.k1 = job->kpe_s1;
        p.scale = job->scale, p.amax = job->amax_out, p.mul = job->conv == MLAF_FP8_MUL;
        return dsa_go<T, mlaf_wr_fp8<T>>(ctx, job, p, xp, dsa_cache_vec_ok(job, W, 1));
    }
    if (job->format == MLAF_KV_FP8_DS_MLA) {
        if constexpr (std::is_same<T, __nv_bfloat16>::value) { /* validation: bf16 latent only */
            mlaf_wr_ds_mla::params p;
            p.cache = job->cache, p.s0 = job->cache_s0, p.s1 = job->cache_s1, p.mode = (int32_t)job->tile_scale;
            return dsa_go<T, mlaf_wr_ds_mla>(ctx, job, p, xp, true);
        }
        return cudaErrorInvalidValue;
    }
    typename mlaf_wr_paged<T>::params p;
    p.cache = job->cache, p.kpe = job->kpe, p.dt = job->cache_dt;
    p.s0 = job->cache_s0, p.s1 = job->cache_s1, p.k0 = job->kpe_s0, p.k1 = job->kpe_s1;
    return dsa_go<T, mlaf_wr_paged<T>>(ctx, job, p, xp, dsa_cache_vec_ok(job, W, (int64_t)mlaf_dtype_size(job->cache_dt)));
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
