/* PLACEHOLDER (replaced by the norm oracle and its verify functions) */
#include "verify.h"
mlaf_status mlaf_verify_split_qk_norm(mlaf_context *ctx, const mlaf_verify_case *c, mlaf_verify_result *r) { (void)ctx; (void)c; (void)r; return MLAF_ERR_UNSUPPORTED; }
mlaf_status mlaf_verify_mla_kv_cache(mlaf_context *ctx, const mlaf_verify_case *c, mlaf_verify_result *r) { (void)ctx; (void)c; (void)r; return MLAF_ERR_UNSUPPORTED; }
mlaf_status mlaf_verify_rope_q(mlaf_context *ctx, const mlaf_verify_case *c, mlaf_verify_result *r) { (void)ctx; (void)c; (void)r; return MLAF_ERR_UNSUPPORTED; }
