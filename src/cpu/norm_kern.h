/*
 * norm_kern.h — the row kernels behind the CPU norm ops (split_qk_norm, mla_kv_cache,
 * rope_q), one table per instruction-set path. norm.c drives them over tokens and threads;
 * norm.c (portable), norm_avx2.c and norm_avx512.c implement them.
 *
 * Contract shared by every path:
 * - Rows are contiguous runs of n elements at any address aligned to the element size.
 * - sumsq accumulates in fp32 (summation order is the path's own; FMA allowed).
 * - scale stores y[i] = (x[i] * rstd) * w[i] (fp32 products, one rounding at each store)
 *   to `out` (dtype odt) and, when out2 is not NULL, to `out2` (dtype o2dt); out may be NULL.
 *   Element i is read before element i of out / out2 is written, so out == x is allowed.
 * - scale with `stream` set may use non-temporal stores (large calls, whose outputs would
 *   only evict the inputs from the caches); the caller then calls fence() before it returns.
 * - scale prefetches `pf` (when not NULL: the same n elements of a row a few rows ahead), one
 *   cache line for each line of x it consumes, so the next rows' loads are spread over the
 *   compute of this one instead of arriving in one burst.
 * - copy moves `bytes` bytes unchanged (k_pe); with `stream` set it may use non-temporal
 *   stores, under the same fence rule.
 * - convert stores n fp32 values in dtype odt, each rounded once (the writers' store); with
 *   `stream` set it may use non-temporal stores, under the same fence rule.
 * - rope rotates the R values of x (pairs (2i, 2i+1) or (i, i + R/2)) with c = cs[i],
 *   s = cs[R/2 + i]: y0 = x0*c - x1*s, y1 = x1*c + x0*s, as separate fp32 products and one
 *   add / subtract (never fused), so every path gives the same bits. Both values of a pair
 *   are read before either is written (in place allowed). Either output may be NULL.
 * - Conversions to f16 / bf16 round to nearest even, bit-identical to src/half.h.
 * - round_amax stores v[0, n) rounded to dtype dt (f32: unchanged) as fp32 into x (x == v
 *   allowed), and returns the larger of m (>= 0) and their NaN-ignoring max |x| (the fp8
 *   writers' first step).
 * - e4m3 stores n bytes, e4m3(x[i] / s) when div, else e4m3(x[i] * s): one IEEE division or
 *   product, then fp8.h's conversion (round to nearest even, satfinite), the same bits on every
 *   path.
 */
#ifndef MLAF_NORM_KERN_H
#define MLAF_NORM_KERN_H

#include "../internal.h"

typedef struct mlaf_norm_kern {
    float (*sumsq)(const void *x, mlaf_dtype dt, int64_t n);
    void (*scale)(const void *x, mlaf_dtype dt, int64_t n, float rstd, const float *w, void *out,
                  mlaf_dtype odt, void *out2, mlaf_dtype o2dt, int stream, const void *pf);
    void (*rope)(const void *x, mlaf_dtype dt, int32_t R, mlaf_rope_style style, const float *cs,
                 void *out, mlaf_dtype odt, void *out2, mlaf_dtype o2dt);
    void (*fence)(void); /* orders non-temporal stores before the op returns */
    void (*copy)(const void *x, size_t bytes, void *out, int stream);
    void (*convert)(const float *v, int64_t n, void *out, mlaf_dtype odt, int stream);
    float (*round_amax)(const float *v, int64_t n, mlaf_dtype dt, float *x, float m);
    void (*e4m3)(const float *x, int64_t n, float s, int div, uint8_t *out);
} mlaf_norm_kern;

extern const mlaf_norm_kern mlaf_norm_kern_scalar;
#if defined(MLAF_HAVE_X86_PATHS)
extern const mlaf_norm_kern mlaf_norm_kern_avx2;
extern const mlaf_norm_kern mlaf_norm_kern_avx512;
/* The AVX-512 table with bf16 stores narrowed by VCVTNE2PS2BF16; only for CPUs with
 * AVX512_BF16 (mlaf_norm_avx512_bf16_supported). */
extern const mlaf_norm_kern mlaf_norm_kern_avx512_bf16;
int mlaf_norm_avx512_bf16_supported(void);
#endif

/* The portable rope, used by the vector paths for the pairs that do not fill a vector (so the
 * tails are bit-identical by construction). */
void mlaf_norm_rope_pairs(const void *x, mlaf_dtype dt, int32_t R, mlaf_rope_style style,
                          const float *cs, int32_t first_pair, void *out, mlaf_dtype odt,
                          void *out2, mlaf_dtype o2dt);

#endif
