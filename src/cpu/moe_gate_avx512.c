/*
 * moe_gate_avx512.c — the CPU router compiled for AVX512 (see moe_gate.c): the same per-token
 * code, with wider vectors; called only after run-time CPU detection.
 */
#define GATE_SUFFIX _avx512
#include "moe_gate.c"
