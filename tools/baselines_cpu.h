/*
 * baselines_cpu.h — what the unfused CPU chains of `mlafuse bench` share (baselines_cpu_<op>.c):
 * row addressing, the thread-team rule and the RoPE rotation of a row.
 *
 * The unfused CPU chains `mlafuse bench` compares the fused ops with: the
 * same steps as engines run them today, each pass a separate OpenMP loop over all tokens
 * that writes a full intermediate tensor for the next pass to read back.
 *
 *   split_qk_norm  1. split: copy q, kv, pe out of the latent into three dense tensors
 *                  2. RMSNorm q   (read q_dense, write q)
 *                  3. RMSNorm kv  (read kv_dense, write k_nope); k_pe is the copied tensor
 *   mla_kv_cache   the library's split_qk_norm, then blc_rope_rows on k_pe, then
 *                  blc_cache_write (plain cache) or blc_cache_write_fp8 (fp8 formats: the
 *                  separate quantize-and-write pass), composed by the driver
 *   rope_q         1. gather the rope columns into [T*H, R]  2. rotate  3. scatter back;
 *                  head_norm (DeepSeek-V4): blc_head_norm first, a pass of its own
 *   moe_gate       1. score  2. + bias  3. group scores  4. group mask  5. top-k
 *                  6. gather weights  7. normalize  8. scale (+ shared-expert slots)
 *
 * Arithmetic matches the fused ops (fp32, one rounding per store, no contraction of the
 * RoPE products), so the driver can check the outputs against each other.
 */
#ifndef MLAF_BASELINES_CPU_H
#define MLAF_BASELINES_CPU_H

#include <float.h>
#include <math.h>
#include <string.h>

#include "bench.h"
#include "cpu/norm_writers.h"
#include "fp8.h"
#include "half.h"

#define ROW(p, dt, t, stride) ((char *)(p) + (size_t)(t) * (size_t)(stride) * mlaf_dtype_size(dt))
/* an absent row (p NULL: no k_pe in a model without one) stays NULL: no offset is applied to NULL */
#define CROW(p, dt, t, stride) \
    ((p) ? (const char *)(p) + (size_t)(t) * (size_t)(stride) * mlaf_dtype_size(dt) : (const char *)0)

/* Like PyTorch's at::parallel_for (grain 32768 elements): a pass only fans out to the
 * threads when it has enough work, so small-T baselines are not timed waking a team. */
static inline int team(int64_t rows, int64_t width, int threads) {
    return rows * width >= 32768 ? threads : 1;
}

/* x0' = x0*c - x1*s, x1' = x1*c + x0*s, as separate products and one add / subtract, like
 * the library (the tool is compiled with -ffp-contract=off, so no FMA is formed). */
static inline void rotate(float *x0, float *x1, float c, float s) {
    float a = *x0 * c, b = *x1 * s, d = *x1 * c, e = *x0 * s;
    *x0 = a - b;
    *x1 = d + e;
}

static inline void rope_row(void *row, mlaf_dtype dt, int32_t R, mlaf_rope_style style,
                     const float *cs) {
    int32_t half = R / 2;
    for (int32_t i = 0; i < half; i++) {
        int32_t i0 = style == MLAF_ROPE_NEOX ? i : 2 * i;
        int32_t i1 = style == MLAF_ROPE_NEOX ? i + half : 2 * i + 1;
        float x0 = mlaf_load_f32(row, dt, i0), x1 = mlaf_load_f32(row, dt, i1);
        rotate(&x0, &x1, cs[i], cs[half + i]);
        mlaf_store_f32(row, dt, i0, x0);
        mlaf_store_f32(row, dt, i1, x1);
    }
}

#endif
