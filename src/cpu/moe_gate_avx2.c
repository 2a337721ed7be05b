/*
 * moe_gate_avx2.c — the CPU router compiled for AVX2 (see moe_gate.c): the same per-token
 * code, with wider vectors; called only after run-time CPU detection.
 */
#define GATE_SUFFIX _avx2
#include "moe_gate.c"
