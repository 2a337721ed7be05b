/* PLACEHOLDER (replaced by the CUDA norm kernels) */
#include "cuda_common.cuh"
extern "C" mlaf_status mlaf_cuda_split_qk_norm(mlaf_context *ctx, const mlaf_norm_job *job) { (void)job; return mlaf_fail(ctx, MLAF_ERR_UNSUPPORTED, "todo"); }
extern "C" mlaf_status mlaf_cuda_mla_kv_cache(mlaf_context *ctx, const mlaf_kv_cache_job *job) { (void)job; return mlaf_fail(ctx, MLAF_ERR_UNSUPPORTED, "todo"); }
extern "C" mlaf_status mlaf_cuda_rope_q(mlaf_context *ctx, const mlaf_rope_q_job *job) { (void)job; return mlaf_fail(ctx, MLAF_ERR_UNSUPPORTED, "todo"); }
