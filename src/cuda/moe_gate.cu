/* PLACEHOLDER (replaced by the CUDA moe_gate kernels) */
#include "cuda_common.cuh"
extern "C" mlaf_status mlaf_cuda_moe_gate(mlaf_context *ctx, const mlaf_moe_gate_job *job) { (void)job; return mlaf_fail(ctx, MLAF_ERR_UNSUPPORTED, "todo"); }
