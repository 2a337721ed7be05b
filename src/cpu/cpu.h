/*
 * cpu.h — the CPU backend's internal face: one function per op (each in its own file),
 * run-time ISA dispatch helpers.
 */
#ifndef MLAF_CPU_H
#define MLAF_CPU_H

#include "../internal.h"

mlaf_status mlaf_cpu_split_qk_norm(mlaf_context *ctx, const mlaf_norm_job *job);
mlaf_status mlaf_cpu_mla_kv_cache(mlaf_context *ctx, const mlaf_kv_cache_job *job);
mlaf_status mlaf_cpu_rope_q(mlaf_context *ctx, const mlaf_rope_q_job *job);
mlaf_status mlaf_cpu_moe_gate(mlaf_context *ctx, const mlaf_moe_gate_job *job);
mlaf_status mlaf_cpu_mla_kv_cache_dsa(mlaf_context *ctx, const mlaf_kv_cache_job *job, const mlaf_index_job *ix);
mlaf_status mlaf_cpu_indexer_q(mlaf_context *ctx, const mlaf_indexer_q_job *job);
mlaf_status mlaf_cpu_rms_norm_quant(mlaf_context *ctx, const mlaf_rms_norm_quant_job *job);
mlaf_status mlaf_cpu_gemm_quant(mlaf_context *ctx, const mlaf_gemm_quant_job *job);

#endif
