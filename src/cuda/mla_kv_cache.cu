/*
 * mla_kv_cache.cu — CUDA entry of mla_kv_cache (SPEC §3): the row kernel (row_launch.cuh) with
 * the token decision and RoPE, and two writers: the dense outputs (q, optional k_nope and roped
 * k_pe) and the cache record at slot_mapping[t] in the call's format: plain [k_nope | rope(k_pe)]
 * (row_writers.cuh), per-tensor fp8, fp8_ds_mla or fp8_v4 (row_writers_fp8.cuh). With kv_rope_tail
 * (SPEC §11) the row kernel rotates the kv part's tail itself (row_core.cuh, mlaf_tail_vec), so
 * every writer receives the finished values.
 */
#include "row_launch.cuh"
#include "row_writers_fp8.cuh"

/* The row arguments of a validated job. */
static mlaf_row_args kv_args(const mlaf_kv_cache_job *job) {
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
    a.tail = job->kv_tail;
    return a;
}

/* The cache arrays take a vector of W values of `es` bytes each at every W-th value. */
static bool kv_cache_vec_ok(const mlaf_kv_cache_job *job, int64_t W, int64_t es) {
    const int64_t ca = W * es < 16 ? W * es : 16;
    bool ok = mlaf_aligned(job->cache, job->cache_s0 * es, ca) && (job->cache_s1 * es) % ca == 0;
    if (job->kpe) ok = ok && mlaf_aligned(job->kpe, job->kpe_s0 * es, ca) && (job->kpe_s1 * es) % ca == 0;
    return ok;
}

template <typename T, class Wc>
static cudaError_t kv_go(const mlaf_context *ctx, const mlaf_kv_cache_job *job, const typename Wc::params &cp,
                         bool cache_vec_ok) {
    typedef mlaf_wr_pair<mlaf_wr_dense<T>, Wc> Wr;
    bool vec_ok;
    typename Wr::params wp;
    wp.a = mlaf_row_dense_params<T>(&job->norm, false, &vec_ok);
    wp.b = cp;
    return mlaf_row_launch<T, true, Wr>(kv_args(job), wp, vec_ok && cache_vec_ok, ctx->cuda_sm_count, ctx->cuda_cc,
                                        (cudaStream_t)ctx->cuda_stream);
}

template <typename T> static cudaError_t kv_launch(const mlaf_context *ctx, const mlaf_kv_cache_job *job) {
    constexpr int W = mlaf_vec<T>::W;
    if (job->format == MLAF_KV_FP8) {
        typename mlaf_wr_fp8<T>::params p;
        p.cache = job->cache, p.kpe = job->kpe;
        p.s0 = job->cache_s0, p.s1 = job->cache_s1, p.k0 = job->kpe_s0, p.k1 = job->kpe_s1;
        p.scale = job->scale, p.amax = job->amax_out, p.mul = job->conv == MLAF_FP8_MUL;
        return kv_go<T, mlaf_wr_fp8<T>>(ctx, job, p, kv_cache_vec_ok(job, W, 1));
    }
    if (job->format == MLAF_KV_FP8_DS_MLA) {
        if constexpr (std::is_same<T, __nv_bfloat16>::value) { /* validation: bf16 latent only */
            mlaf_wr_ds_mla::params p;
            p.cache = job->cache, p.s0 = job->cache_s0, p.s1 = job->cache_s1, p.mode = (int32_t)job->tile_scale;
            return kv_go<T, mlaf_wr_ds_mla>(ctx, job, p, true); /* 16-byte aligned records (validation) */
        }
        return cudaErrorInvalidValue;
    }
    if (job->format == MLAF_KV_FP8_V4) {
        if constexpr (std::is_same<T, __nv_bfloat16>::value) { /* validation: bf16, C 512, tail 64 */
            mlaf_wr_v4::params p;
            p.cache = job->cache, p.s0 = job->cache_s0;
            return kv_go<T, mlaf_wr_v4>(ctx, job, p, true); /* 16-byte aligned pages (validation) */
        }
        return cudaErrorInvalidValue;
    }
    typename mlaf_wr_paged<T>::params p;
    p.cache = job->cache, p.kpe = job->kpe, p.dt = job->cache_dt;
    p.s0 = job->cache_s0, p.s1 = job->cache_s1, p.k0 = job->kpe_s0, p.k1 = job->kpe_s1;
    return kv_go<T, mlaf_wr_paged<T>>(ctx, job, p, kv_cache_vec_ok(job, W, (int64_t)mlaf_dtype_size(job->cache_dt)));
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
