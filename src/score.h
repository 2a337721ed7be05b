/*
 * score.h — the router's score functions (mlaf_score_func): one table of the facts every
 * layer shares (name, whether s needs the whole row), so that validation, the tools, the CPU
 * backend and the oracle name and classify a score in one place. The per-score math lives once
 * per backend: score_traits<SF> for the CUDA kernels (src/cuda/moe_gate_common.cuh: the forms,
 * the solo kernel's ranking filter and margin, which kernels have the score, its launch
 * thresholds), gate_score_row in src/cpu/moe_gate.c, ref_score in src/ref/ref_moe.c.
 *
 * A new elementwise score function touches:
 *   include/mlafuse.h                  the enum value (append-only)
 *   src/score.c                        its row of mlaf_score_table
 *   src/cuda/moe_gate_common.cuh       its score_traits specialization and dispatch_score case
 *   src/cpu/moe_gate.c                 its row function and gate_score_row case
 *   src/ref/ref_moe.c                  its float64 form and ref_score case
 *   (optional) src/cuda/moe_gate_solo.cuh  a solo shape compiled for it (MLAF_SOLO)
 *   docs/moe_gate.md, tests            the documentation and the cases that cover it
 * and, where they should know it, the tools' model of a score outside the library:
 * tools/config_json.c (HF "scoring_func"), the benchmark baselines (tools/bench_cmd.c,
 * tools/baselines_*), tools/verify_cmd.c's score-specific cases, python/.
 * Validation, the tools (cli.c), the kernels and moe_gate.cu's dispatch need no change; a row-wise
 * score (like softmax) also needs its row code in each kernel under score_traits<SF>::row_wise.
 * Before this table and the traits, a score touched ~17 files (a GateArgs flag per score,
 * three-way chains in each kernel and launcher, the MLAF_TEAM macro, validate.c, cli.c, ...).
 * Plain C, includable from the CUDA sources.
 */
#ifndef MLAF_SCORE_H
#define MLAF_SCORE_H

#include "mlafuse.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mlaf_score_info {
    const char *name; /* "sigmoid", "softmax", "sqrt_softplus" (mlaf_score_func_name) */
    int row_wise;     /* s needs the whole row (softmax); else s is a function of one logit */
} mlaf_score_info;

/* Indexed by mlaf_score_func; the valid values are 0 .. mlaf_score_count - 1. */
extern const mlaf_score_info mlaf_score_table[];
extern const int mlaf_score_count;

/* The row of a score function, or NULL when f is not one. */
const mlaf_score_info *mlaf_score_of(mlaf_score_func f);

/* Whether s of score f needs the whole row (false for a value that is not a score). */
static inline int mlaf_score_row_wise(mlaf_score_func f) {
    const mlaf_score_info *i = mlaf_score_of(f);
    return i ? i->row_wise : 0;
}

/* "0 (sigmoid), 1 (softmax) or 2 (sqrt_softplus)": the valid values for messages. */
void mlaf_score_list(char *buf, size_t cap);

#ifdef __cplusplus
}
#endif

#endif
