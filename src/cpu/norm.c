/* PLACEHOLDER (replaced by the CPU norm implementation) */
#include "cpu.h"
mlaf_status mlaf_cpu_split_qk_norm(mlaf_context *ctx, const mlaf_norm_job *job) { (void)job; return mlaf_fail(ctx, MLAF_ERR_UNSUPPORTED, "todo"); }
mlaf_status mlaf_cpu_mla_kv_cache(mlaf_context *ctx, const mlaf_kv_cache_job *job) { (void)job; return mlaf_fail(ctx, MLAF_ERR_UNSUPPORTED, "todo"); }
mlaf_status mlaf_cpu_rope_q(mlaf_context *ctx, const mlaf_rope_q_job *job) { (void)job; return mlaf_fail(ctx, MLAF_ERR_UNSUPPORTED, "todo"); }
