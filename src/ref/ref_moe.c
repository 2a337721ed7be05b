/* PLACEHOLDER (replaced by the moe_gate oracle and its verify function) */
#include "verify.h"
mlaf_status mlaf_verify_moe_gate(mlaf_context *ctx, const mlaf_verify_case *c, mlaf_verify_result *r) { (void)ctx; (void)c; (void)r; return MLAF_ERR_UNSUPPORTED; }
