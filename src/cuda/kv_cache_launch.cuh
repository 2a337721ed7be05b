/*
 * kv_cache_launch.cuh — what mla_kv_cache's two CUDA entries share (mla_kv_cache.cu, and
 * mla_kv_cache_dsa.cu with the indexer key writer): the row arguments of a job and the choice
 * of the cache writer for the job's format. Each entry pairs the writer with its own others and
 * launches the row kernel (row_launch.cuh).
 */
#pragma once

#include "row_launch.cuh"
#include "row_writers_fp8.cuh"

/* The row arguments of a validated job. */
static inline mlaf_row_args mlaf_kv_args(const mlaf_kv_cache_job *job) {
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
static inline bool mlaf_kv_cache_vec_ok(const mlaf_kv_cache_job *job, int64_t W, int64_t es) {
    const int64_t ca = W * es < 16 ? W * es : 16;
    bool ok = mlaf_aligned(job->cache, job->cache_s0 * es, ca) && (job->cache_s1 * es) % ca == 0;
    if (job->kpe) ok = ok && mlaf_aligned(job->kpe, job->kpe_s0 * es, ca) && (job->kpe_s1 * es) % ca == 0;
    return ok;
}

template <class Wc> struct mlaf_writer_tag { typedef Wc type; };

/* go(mlaf_writer_tag<Wc>, Wc::params, cache_vec_ok) with the cache writer Wc of the job's format:
 * per-tensor fp8, fp8_ds_mla and (with V4) fp8_v4, bf16 latents only (validation), else the plain
 * paged cache. */
template <typename T, bool V4, class Go>
static cudaError_t mlaf_kv_cache_writer(const mlaf_kv_cache_job *job, Go &&go) {
    constexpr int W = mlaf_vec<T>::W;
    if (job->format == MLAF_KV_FP8) {
        typename mlaf_wr_fp8<T>::params p;
        p.cache = job->cache, p.kpe = job->kpe;
        p.s0 = job->cache_s0, p.s1 = job->cache_s1, p.k0 = job->kpe_s0, p.k1 = job->kpe_s1;
        p.scale = job->scale, p.amax = job->amax_out, p.mul = job->conv == MLAF_FP8_MUL;
        return go(mlaf_writer_tag<mlaf_wr_fp8<T>>(), p, mlaf_kv_cache_vec_ok(job, W, 1));
    }
    if (job->format == MLAF_KV_FP8_DS_MLA || job->format == MLAF_KV_FP8_V4) {
        if constexpr (std::is_same<T, __nv_bfloat16>::value) {
            if (job->format == MLAF_KV_FP8_DS_MLA) {
                mlaf_wr_ds_mla::params p;
                p.cache = job->cache, p.s0 = job->cache_s0, p.s1 = job->cache_s1, p.mode = (int32_t)job->tile_scale;
                return go(mlaf_writer_tag<mlaf_wr_ds_mla>(), p, true); /* 16-byte aligned records */
            }
            if constexpr (V4) {
                mlaf_wr_v4::params p;
                p.cache = job->cache, p.s0 = job->cache_s0;
                return go(mlaf_writer_tag<mlaf_wr_v4>(), p, true); /* 16-byte aligned pages */
            }
        }
        return cudaErrorInvalidValue;
    }
    typename mlaf_wr_paged<T>::params p;
    p.cache = job->cache, p.kpe = job->kpe, p.dt = job->cache_dt;
    p.s0 = job->cache_s0, p.s1 = job->cache_s1, p.k0 = job->kpe_s0, p.k1 = job->kpe_s1;
    return go(mlaf_writer_tag<mlaf_wr_paged<T>>(), p,
              mlaf_kv_cache_vec_ok(job, W, (int64_t)mlaf_dtype_size(job->cache_dt)));
}
