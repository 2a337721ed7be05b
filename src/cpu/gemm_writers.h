/*
 * gemm_writers.h — the CPU writers of the GEMM-input formats (src/gemm_format.h), one per format
 * under its enum value: what an op's row loop hands a row's final values to when the call asks
 * for a quantized output (rms_norm_quant, src/cpu/rms_norm_quant.c).
 */
#ifndef MLAF_GEMM_WRITERS_H
#define MLAF_GEMM_WRITERS_H

#include "../gemm_format.h"
#include "norm_kern.h"

/* Values [i0, i0 + n) of row t of the output q (i0 and n multiples of its group; G groups a row),
 * fp32 before rounding: each group's values rounded to dt (a value already in dt stays as it
 * is), its NaN-ignoring amax, its scale (mlaf_gemm_scale_of), its e4m3 bytes e4m3(x / s) into
 * q->data's row t, and its scale stored where the format keeps it (mlaf_gemm_put_scale). The
 * rounding, amax and e4m3 steps are the kernels k's (the same bits on every path). */
typedef void (*mlaf_cpu_gemm_writer)(const mlaf_norm_kern *k, const mlaf_gemm_out_job *q, mlaf_dtype dt, int64_t t,
                                     int64_t G, int64_t i0, int64_t n, const float *v);

/* The writer of format f, NULL for NONE; mlaf_cpu_gemm_writer_count: how many formats have one (a
 * test checks all). */
mlaf_cpu_gemm_writer mlaf_cpu_gemm_writer_of(mlaf_gemm_format f);
int mlaf_cpu_gemm_writer_count(void);

#endif
