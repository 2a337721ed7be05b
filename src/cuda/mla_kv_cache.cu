/*
 * mla_kv_cache.cu — CUDA entry of mla_kv_cache (SPEC §3): split, both RMSNorms, RoPE on
 * k_pe and the paged KV-cache write in one pass over the latent.
 *
 * 1. Turn the validated job into the row kernel's arguments, including positions, cos_sin,
 *    slot_mapping, cache geometry and the optional error counter.
 * 2. Launch the shared row kernel (norm_common.cuh) with the cache epilogue: per token, a
 *    position outside [0, max_pos) or a slot >= num_blocks * block_size is counted once and
 *    writes neither the cache row nor the dense k_pe row (q and k_nope still written); a
 *    negative slot skips the cache row silently. Cache rows are converted from fp32 straight
 *    to the cache dtype; the cache row address is (slot / block_size) * s0 +
 *    (slot % block_size) * s1 elements, 64-bit offsets (the division itself in 32 bits when
 *    slot and block_size are below 2^31).
 * Limits and launch shape: see norm_common.cuh.
 */
#include "norm_common.cuh"

extern "C" mlaf_status mlaf_cuda_mla_kv_cache(mlaf_context *ctx, const mlaf_kv_cache_job *job) {
    if (job->norm.T == 0) return MLAF_OK;
    mlaf_cuda_device_guard guard(ctx);
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
    a.cache_dt = job->cache_dt;
    a.cache = job->cache;
    a.n_slots = job->num_blocks * job->block_size;
    a.block_size = job->block_size;
    a.c_s0 = job->cache_s0;
    a.c_s1 = job->cache_s1;
    a.err = job->error_count;
    cudaError_t e = mlaf_row_launch<true>(a, job->norm.dt, ctx->cuda_sm_count, (cudaStream_t)ctx->cuda_stream,
                                            mlaf_row_policy_for(ctx));
    if (e != cudaSuccess)
        return mlaf_fail(ctx, MLAF_ERR_DEVICE, "mla_kv_cache: kernel launch failed: %s",
                         cudaGetErrorString(e));
    return MLAF_OK;
}
