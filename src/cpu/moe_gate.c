/* PLACEHOLDER (replaced by the CPU moe_gate implementation) */
#include "cpu.h"
mlaf_status mlaf_cpu_moe_gate(mlaf_context *ctx, const mlaf_moe_gate_job *job) { (void)job; return mlaf_fail(ctx, MLAF_ERR_UNSUPPORTED, "todo"); }
