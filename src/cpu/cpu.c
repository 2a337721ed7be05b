/*
 * cpu.c — CPU backend table, core count and run-time instruction-set detection.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#endif
#include <unistd.h>

#include "cpu.h"

#ifdef __linux__
#include <sched.h>
#endif
#if defined(MLAF_HAVE_X86_PATHS)
#include <cpuid.h>

/* F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know "f16c".
 * The AVX2 / AVX-512 tests beside it already require the OS to save the AVX state. */
static int has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
#endif

const mlaf_backend_iface mlaf_cpu_backend = {
    mlaf_cpu_split_qk_norm,
    mlaf_cpu_mla_kv_cache,
    mlaf_cpu_rope_q,
    mlaf_cpu_moe_gate,
    mlaf_cpu_mla_kv_cache_dsa,
    mlaf_cpu_indexer_q,
    mlaf_cpu_rms_norm_quant,
    mlaf_cpu_gemm_quant,
};

/* The cores this process may run on (its affinity mask, as OpenMP's omp_get_num_procs counted
 * them), else the cores online. */
int mlaf_cpu_core_count(void) {
    long n = 0;
#ifdef __linux__
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
#endif
    if (n <= 0) n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int mlaf_cpu_isa_supported(mlaf_cpu_isa isa) {
    switch (isa) {
    case MLAF_CPU_ISA_AUTO:
    case MLAF_CPU_ISA_SCALAR: return 1;
#if defined(MLAF_HAVE_X86_PATHS)
    case MLAF_CPU_ISA_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
    case MLAF_CPU_ISA_AVX512:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
#endif
    default: return 0;
    }
}
