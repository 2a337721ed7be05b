/*
 * mlafuse/quant.h — GEMM-input formats: what the next fp8 GEMM reads (docs/gemm_formats.md).
 * Part of the public C API: include <mlafuse.h>, which includes this file (the types, status
 * codes and conventions are there).
 */
#ifndef MLAFUSE_QUANT_H
#define MLAFUSE_QUANT_H
#ifndef MLAFUSE_H
#error "include <mlafuse.h>, not mlafuse/quant.h"
#endif

/* ---------------------------------------------------------------------------------------
 * GEMM-input formats (docs/gemm_formats.md)
 *
 * An op that writes a tensor y [T, K] which a block-scaled fp8 GEMM consumes may write it
 * quantized, per token and per group of g consecutive columns, in the same pass. Every value
 * quantized is the value the op would store densely (its fp32 result rounded once to the
 * activation dtype), so the fused bytes equal those of the dense op followed by a per-token-group
 * quantize pass. For each group: amax = the NaN-ignoring max |y| over its g values; a scale s
 * from amax by the call's scale rounding (below); each value byte e4m3(y / s) (an IEEE f32
 * division, then the e4m3 conversion of docs/kv_formats.md: round to nearest even, |v| >= 464 and
 * +-inf give +-448, NaN gives 0x7F).
 *
 *   format (mlaf_gemm_format)     g    scales tensor                                 read by
 *   FP8_1X128        fp8_1x128    128  f32 [T, K/128], stride (ld, 1), ld >= K/128    DeepGEMM / CUTLASS
 *                                      (row-major: element (t, j) at t ld + j)        (K-major scales)
 *   FP8_1X128_MN     fp8_1x128_mn 128  f32 [K/128, T], stride (ld, 1): element (t, j)  DeepGEMM sm90,
 *                                      at j ld + t; ld a multiple of 4 and            flashinfer
 *                                      >= round_up(T, 4) (when it has more than one
 *                                      row); data 16-byte aligned (TMA) when T > 0
 *   FP8_1X128_UE8M0  fp8_1x128_ue8m0 128 i32 [ceil(K/512), T], stride (ld, 1), ld as   DeepGEMM sm100
 *                                      above: the UE8M0 bytes of groups 4i .. 4i + 3
 *                                      of token t are the bytes 0 .. 3 of element
 *                                      (t, i) (little-endian); bytes past the last
 *                                      group are written as 0
 *   MXFP8            mxfp8        32   u8 [T, K/32], stride (ld, 1): one UE8M0 byte a     OCP MX v1.0
 *                                      group
 *   FP8_1X128_CM     fp8_1x128_cm 128  f32 [K/128, T], stride (ld, 1), ld >= T: as     SGLang column-
 *                                      FP8_1X128_MN without the TMA alignment         major scales
 *
 * The MN-major layouts are the transposes of the [T, K/128] views engines hold (torch's
 * (1, ld) strides): pass them as [groups, T] with stride (ld, 1). Rows t in [T, ld) of them are
 * never written. A UE8M0 byte is the biased exponent of a power-of-two scale: byte = e + 127
 * for s = 2^e (2^-127 = byte 0; +inf = byte 255).
 *
 * Scale roundings (mlaf_gemm_scale; each format takes the ones listed):
 *   F32        fp8_1x128, fp8_1x128_mn   s = max(amax, eps) / 448
 *   UE8M0      the three 1x128 formats   s = 2^ceil_log2(max(amax, eps) / 448): the f32 quotient
 *              (the only one of          rounded up to a power of two (DeepGEMM's recipe; the f32
 *              fp8_1x128_ue8m0)          layouts then hold powers of two)
 *   MX_FLOOR   mxfp8                     s = 2^(floor_log2(amax) - 8), OCP MX's rule (values may
 *                                        saturate: amax / s is below 512, above 448 at times)
 *   MX_CEIL    mxfp8                     s = 2^ceil_log2(amax / 448) (never saturates)
 * In the mxfp8 roundings a group with amax 0 (or below the smallest scale) takes the smallest
 * scale 2^-127, and exponents are clamped to [-127, 127]; eps is not used. ceil_log2 / floor_log2
 * of a positive f32 come from its bits (subnormal quotients included); an infinite amax gives
 * s = +inf (byte 255) in every rounding: its values encode as 0 (finite) or 0x7F.
 *
 * mlaf_gemm_out describes one quantized output of an op; format NONE (0, a zeroed struct) means
 * absent (data and scales must then be NULL):
 *   data     [T, K]  fp8_e4m3 | u8, stride (s0, 1), any s0 >= K: the e4m3 bytes
 *   scales   as the table above
 *   eps      the amax floor of the F32 / UE8M0 roundings: 0 = 1e-10 (SGLang's default; DeepGEMM's
 *            reference quantizer uses 1e-4), else finite and >= 1e-30
 * K must be a multiple of g. Rejected (nothing written, a message naming the argument): an
 * unknown format or rounding, a rounding the format does not take, K not a multiple of g, a
 * scales tensor of the wrong dtype, shape, leading dimension or alignment, an eps out of range,
 * data or scales overlapping each other or any other tensor of the call.
 * ------------------------------------------------------------------------------------- */
typedef enum mlaf_gemm_format {
    MLAF_GEMM_NONE = 0,
    MLAF_GEMM_FP8_1X128 = 1,
    MLAF_GEMM_FP8_1X128_MN = 2,
    MLAF_GEMM_FP8_1X128_UE8M0 = 3,
    MLAF_GEMM_MXFP8 = 4,
    MLAF_GEMM_FP8_1X128_CM = 5,
    MLAF_GEMM_FORMAT_COUNT_
} mlaf_gemm_format;

typedef enum mlaf_gemm_scale {
    MLAF_GEMM_SCALE_F32 = 0,
    MLAF_GEMM_SCALE_UE8M0 = 1,
    MLAF_GEMM_SCALE_MX_FLOOR = 2,
    MLAF_GEMM_SCALE_MX_CEIL = 3,
    MLAF_GEMM_SCALE_COUNT_
} mlaf_gemm_scale;

typedef struct mlaf_gemm_out {
    mlaf_gemm_format format;   /* NONE: no quantized output */
    mlaf_gemm_scale scale;     /* the scale rounding */
    const mlaf_tensor *data;   /* [T, K] e4m3 bytes */
    const mlaf_tensor *scales; /* the format's scales tensor */
    float eps;                 /* F32 / UE8M0 amax floor; 0 = 1e-10 */
} mlaf_gemm_out;

#define MLAF_GEMM_DEFAULT_EPS 1e-10f

/* "none", "fp8_1x128", "fp8_1x128_mn", "fp8_1x128_ue8m0", "mxfp8"; "unknown" otherwise. */
MLAF_API const char *mlaf_gemm_format_name(mlaf_gemm_format f);
/* "f32", "ue8m0", "mx_floor", "mx_ceil"; "unknown" otherwise. */
MLAF_API const char *mlaf_gemm_scale_name(mlaf_gemm_scale s);
/* The group width g of a format (128 or 32); 0 for NONE or an unknown value. */
MLAF_API int32_t mlaf_gemm_format_group(mlaf_gemm_format f);
/* The scales tensor a format wants for T tokens of K values: its dtype, its shape (rows, cols)
 * and the least leading stride (elements) it accepts (the MN-major layouts: round_up(T, 4)).
 * MLAF_ERR_INVALID_ARGUMENT for NONE, an unknown format, K not a multiple of g or T, K < 0;
 * MLAF_ERR_NULL_POINTER for a NULL output pointer. */
MLAF_API mlaf_status mlaf_gemm_scales_shape(mlaf_gemm_format f, int64_t T, int64_t K, mlaf_dtype *dtype,
                                            int64_t shape[2], int64_t *min_ld);

/* ---------------------------------------------------------------------------------------
 * rms_norm_quant: the residual add, RMSNorm and the quantized GEMM input in one pass
 * (docs/gemm_formats.md, rms_norm_quant): a layer's input_layernorm / post_attention_layernorm.
 *
 *   x         [T, K]  f32 | f16 | bf16, stride (s0, 1)
 *   residual  [T, K]  x's dtype, optional, read and written: h = round(x + residual) (the fp32 sum
 *                     rounded once to the dtype) is stored back into it and normalized
 *   weight    [K]     x's dtype or f32
 *   y         [T, K]  x's dtype, optional: the dense output; may be x itself (the same view)
 *   q                 optional quantized output (mlaf_gemm_out; NULL or format NONE: none)
 * At least one of y and q. Per token, in fp32: h = x (or the rounded sum), rstd = 1 / sqrt(sum(h^2)
 * / K + eps), y = (h * rstd) * w rounded once to the dtype, as the other norms; q quantizes those
 * rounded y values (the fused bytes equal those of the dense call followed by a per-token-group
 * quantize pass). eps finite and > 0. K >= 1 (a multiple of the format's group with q), at most
 * 2^20; T < 2^31. residual shares no byte with x, weight, y or q; y is x exactly or shares no byte
 * with it; q's tensors share no byte with any other. T = 0 is a no-op.
 * ------------------------------------------------------------------------------------- */
typedef struct mlaf_rms_norm_quant_params {
    float eps;
} mlaf_rms_norm_quant_params;

MLAF_API mlaf_status mlaf_rms_norm_quant(mlaf_context *ctx, const mlaf_rms_norm_quant_params *p, const mlaf_tensor *x,
                                         const mlaf_tensor *residual, const mlaf_tensor *weight, const mlaf_tensor *y,
                                         const mlaf_gemm_out *q);

/* ---------------------------------------------------------------------------------------
 * Quantized outputs of the MLA row ops (docs/gemm_formats.md, row ops): q_norm and k_nope written
 * in a GEMM-input format in the same pass, beside or instead of their dense copies: q_norm is
 * q_b_proj's input (and the DSA indexer's wq_b), k_nope prefill's kv_b_proj input.
 *
 *   quant->q       q_norm [T, Q] quantized (format NONE: none); needs Q > 0, Q a multiple of the
 *                  group; the dense q may then be NULL
 *   quant->k_nope  k_nope [T, C] quantized (NONE: none); C a multiple of the group; the dense
 *                  k_nope may then be NULL in split_qk_norm too. Not with kv_rope_tail (DeepSeek-V4
 *                  has no kv_b_proj): rejected.
 * Each takes its mlaf_gemm_out rules (above). The values quantized are the values the op stores
 * densely (rounded once to the latent dtype), so the bytes equal those of the dense call followed
 * by a per-token-group quantize pass; every token's rows are written (mla_kv_cache's skipped and
 * counted tokens included, as the dense q and k_nope are). The quantized tensors share no byte with
 * any other tensor of the call. quant NULL (or both NONE): the op without the _quant suffix.
 * ------------------------------------------------------------------------------------- */
typedef struct mlaf_row_quant {
    mlaf_gemm_out q;      /* q_norm, [T, Q] */
    mlaf_gemm_out k_nope; /* k_nope, [T, C] */
} mlaf_row_quant;

MLAF_API mlaf_status mlaf_split_qk_norm_quant(mlaf_context *ctx, const mlaf_split_qk_norm_params *p,
                                              const mlaf_tensor *latent, const mlaf_tensor *w_q,
                                              const mlaf_tensor *w_kv, const mlaf_tensor *q,
                                              const mlaf_tensor *k_nope, const mlaf_tensor *k_pe,
                                              const mlaf_row_quant *quant);
MLAF_API mlaf_status mlaf_mla_kv_cache_quant(mlaf_context *ctx, const mlaf_mla_kv_cache_params *p,
                                             const mlaf_tensor *latent, const mlaf_tensor *w_q,
                                             const mlaf_tensor *w_kv, const mlaf_tensor *positions,
                                             const mlaf_tensor *cos_sin, const mlaf_tensor *slot_mapping,
                                             const mlaf_kv_cache_desc *cache, const mlaf_tensor *q,
                                             const mlaf_tensor *k_nope, const mlaf_tensor *k_pe,
                                             const mlaf_tensor *error_count, const mlaf_row_quant *quant);
MLAF_API mlaf_status mlaf_mla_kv_cache_dsa_quant(mlaf_context *ctx, const mlaf_mla_kv_cache_params *p,
                                                 const mlaf_tensor *latent, const mlaf_tensor *w_q,
                                                 const mlaf_tensor *w_kv, const mlaf_tensor *positions,
                                                 const mlaf_tensor *cos_sin, const mlaf_tensor *slot_mapping,
                                                 const mlaf_kv_cache_desc *cache, const mlaf_tensor *q,
                                                 const mlaf_tensor *k_nope, const mlaf_tensor *k_pe,
                                                 const mlaf_tensor *error_count, const mlaf_indexer_params *ip,
                                                 const mlaf_indexer_k *ik, const mlaf_row_quant *quant);

/* ---------------------------------------------------------------------------------------
 * gemm_quant: an activation quantized into a GEMM-input format, alone (docs/gemm_formats.md,
 * gemm_quant): the per-token-group quantize an engine runs before o_proj, or before any fp8
 * GEMM whose input another kernel wrote (SGLang's per_token_group_quant_fp8).
 *
 *   x   [T, K]  f32 | f16 | bf16, stride (s0, 1): the values as stored (no rounding step: they are
 *               already in their dtype)
 *   q           the quantized output (mlaf_gemm_out above), required: a format other than NONE
 * Each row's bytes are those the table above gives for x's values: the same bytes rms_norm_quant
 * writes for a dense output y equal to x (so rms_norm_quant with y, then gemm_quant of that y,
 * reproduces its quantized output). K >= 1, a multiple of the format's group, at most 2^20;
 * T < 2^31; q's tensors share no byte with x or with each other. T = 0 is a no-op. Rejected
 * calls write nothing and name the argument (q NULL, or format NONE without tensors:
 * MLAF_ERR_NULL_POINTER, nothing to write; the rest as for any mlaf_gemm_out).
 * ------------------------------------------------------------------------------------- */
MLAF_API mlaf_status mlaf_gemm_quant(mlaf_context *ctx, const mlaf_tensor *x, const mlaf_gemm_out *q);

#endif /* MLAFUSE_QUANT_H */
