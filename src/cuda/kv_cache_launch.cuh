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
    a.norot = job->rope.style == MLAF_ROPE_NONE;
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

template <class Wc> struct mlaf_writer_tag { typedef Wc type; };

/* go(mlaf_writer_tag<Wc>, Wc::params, cache_vec_ok) with the cache writer Wc of the job's format:
 * the formats' rows (mlaf_kv_writer_of<F>, row_writers*.cuh), walked from F = 0; rows not made
 * for the latent type T (or, with Dsa, not for mla_kv_cache_dsa) are not instantiated, and a job
 * reaching one (which validation prevents) gets cudaErrorInvalidValue. */
template <typename T, bool Dsa, int F = 0, class Go>
static cudaError_t mlaf_kv_cache_writer(const mlaf_kv_cache_job *job, Go &&go) {
    if constexpr (F == MLAF_KV_FORMAT_COUNT_) {
        return cudaErrorInvalidValue;
    } else {
        typedef mlaf_kv_writer_of<F> Row;
        if constexpr (Row::template kLatent<T> && (Row::kDsa || !Dsa)) {
            if (job->format == F) {
                typedef typename Row::template type<T> Wc;
                typename Wc::params p;
                const bool vec_ok = Row::template params<T>(job, &p);
                return go(mlaf_writer_tag<Wc>(), p, vec_ok);
            }
        }
        return mlaf_kv_cache_writer<T, Dsa, F + 1>(job, static_cast<Go &&>(go));
    }
}
