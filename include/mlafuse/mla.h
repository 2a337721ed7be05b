/*
 * mlafuse/mla.h — the MLA row ops: split_qk_norm, the RoPE tables, mla_kv_cache
 * (plain and fp8 cache formats, DeepSeek-V4's fp8_v4) and rope_q.
 * Part of the public C API: include <mlafuse.h>, which includes this file (the types, status
 * codes and conventions are there).
 */
#ifndef MLAFUSE_MLA_H
#define MLAFUSE_MLA_H
#ifndef MLAFUSE_H
#error "include <mlafuse.h>, not mlafuse/mla.h"
#endif

/* ---------------------------------------------------------------------------------------
 * split_qk_norm
 *
 *   latent [T, Q + C + R]        f32 | f16 | bf16, rows strided
 *   w_q    [Q]                   latent's dtype or f32; absent iff Q == 0
 *   w_kv   [C]                   latent's dtype or f32
 *   q      [T, Q]    (output)    latent's dtype; absent iff Q == 0
 *   k_nope [T, C]    (output)    latent's dtype
 *   k_pe   [T, R]    (output)    latent's dtype; optional (absent: not written)
 *
 *   q[t,i]      = L[t,i]     * rstd_q(t)  * w_q[i],  rstd_q  = 1/sqrt(mean_i L[t,i]^2 + eps_q)
 *   k_nope[t,j] = L[t,Q+j]   * rstd_kv(t) * w_kv[j], rstd_kv = 1/sqrt(mean_j L[t,Q+j]^2 + eps_kv)
 *   k_pe[t,r]   = L[t,Q+C+r] (bit-exact)
 *
 * In place (the context-parallel path): q, k_nope and k_pe may be exactly the latent's own q,
 * kv and pe columns (same data offset, same row stride, same T); afterwards the latent row
 * holds [q_norm | k_nope_norm | k_pe]. Any other overlap of an output with an input or with
 * another output is MLAF_ERR_OVERLAP. T = 0 is a valid no-op; T < 2^31.
 * eps_q and eps_kv must be finite and > 0.
 * ------------------------------------------------------------------------------------- */
typedef struct mlaf_split_qk_norm_params {
    int32_t q_lora_rank;  /* Q >= 0 */
    int32_t kv_lora_rank; /* C > 0 */
    int32_t rope_dim;     /* R >= 0 */
    float eps_q;
    float eps_kv;
    /* DeepSeek-V4's rope inside the kv part (kv_rope_tail below): must be 0 here. split_qk_norm has no
     * positions to rotate with, so a nonzero value is rejected (MLAF_ERR_INVALID_ARGUMENT);
     * mla_kv_cache takes it (its dense k_nope output is then the normalized, rope-tailed kv). */
    int32_t kv_rope_tail;
} mlaf_split_qk_norm_params;

MLAF_API mlaf_status mlaf_split_qk_norm(mlaf_context *ctx, const mlaf_split_qk_norm_params *p,
                                        const mlaf_tensor *latent, const mlaf_tensor *w_q,
                                        const mlaf_tensor *w_kv, const mlaf_tensor *q,
                                        const mlaf_tensor *k_nope, const mlaf_tensor *k_pe);

/* ---------------------------------------------------------------------------------------
 * RoPE tables, shared by mla_kv_cache and rope_q
 *
 *   positions [T]             i32 | i64; each in [0, max_pos), else the token is rejected
 *                             by the kernel as described per op
 *   cos_sin   [max_pos, R]    f32, row p = [cos(p*f_0) .. cos(p*f_{R/2-1}) | sin(...) ]
 *
 *   interleaved: (x[2i], x[2i+1]) -> (x0*c_i - x1*s_i, x1*c_i + x0*s_i)
 *   neox:        (x[i], x[i+R/2]) -> same formula
 * The rotation is computed as separate fp32 products and one add / subtract (no fused
 * multiply-add), identically in mla_kv_cache and rope_q and on every backend, so a key and a
 * query rotated for the same position agree bit for bit.
 * A position outside [0, max_pos) cannot be looked up; such a token is counted in the op's
 * optional error counter and its rope values are not written (see each op).
 *   none (MLAF_ROPE_NONE): nothing rotates. The R values are written as the other styles write
 *   rotated ones, each input value rounded once to the output's format (in mla_kv_cache's
 *   plain cache of the latent dtype: the bits as read). positions and cos_sin are not read: they
 *   may be NULL, and when given are checked as for the other styles. No token is rejected for
 *   its position. rope_q in place without head_norm then leaves q untouched (it launches
 *   nothing). mla_kv_cache_dsa, indexer_q and kv_rope_tail reject it.
 * ------------------------------------------------------------------------------------- */
typedef struct mlaf_rope_params {
    int32_t rope_dim;        /* R > 0, even */
    mlaf_rope_style style;
    /* rope_q only. head_norm nonzero (DeepSeek-V4's q): each head's D values are first
     * RMS-normalized without weight, y = x * rstd with rstd = 1 / sqrt(mean(x^2) + head_norm_eps)
     * in fp32, then the last R values of y are rotated in fp32, and every value is rounded once
     * to q's dtype. head_norm_eps: 0 means the default 1e-6; else finite and > 0, checked
     * whatever head_norm is (a NaN, infinite or negative eps is MLAF_ERR_INVALID_ARGUMENT even
     * with head_norm off). */
    int32_t head_norm;
    float head_norm_eps;
} mlaf_rope_params;

/* Builds a cos_sin table on the host: cos_sin[p, i] = cos(p * base^(-2i/R)),
 * cos_sin[p, R/2 + i] = sin(...), computed in double and rounded once to f32.
 * table must hold max_pos * rope_dim floats; max_pos >= 1, rope_dim > 0 and even,
 * 1 < base <= MLAF_ROPE_MAX_BASE (1e12), else MLAF_ERR_INVALID_ARGUMENT and the table untouched.
 * Scaled tables (YaRN): mlaf_rope_table_init_scaled below; the ops accept any table of this
 * layout. */
MLAF_API mlaf_status mlaf_rope_table_init(float *table, int64_t max_pos, int32_t rope_dim,
                                          double base);

/* RoPE scaling for long contexts. YaRN as DeepSeek-V2 / V3 / R1, Kimi-K2 and Hugging Face
 * transformers build it (config.json "rope_scaling": {"type": "yarn", ...}). With R = rope_dim,
 * i < R/2 and all arithmetic in double:
 *
 *   f_extra(i) = base^(-2i/R)                       the unscaled frequency
 *   f_inter(i) = f_extra(i) / factor                interpolated for the longer context
 *   d(beta)    = R * ln(original_max_position_embeddings / (2 pi beta)) / (2 ln base)
 *   low = d(beta_fast), high = d(beta_slow); when truncate: low = floor(low), high = ceil(high);
 *   low = max(low, 0), high = min(high, R - 1); if low == high: high += 0.001
 *   ramp(i)    = clamp((i - low) / (high - low), 0, 1)
 *   f(i)       = f_inter(i) * ramp(i) + f_extra(i) * (1 - ramp(i))
 *   cos_sin[p, i] = cos(p * f(i)) * a,  cos_sin[p, R/2 + i] = sin(p * f(i)) * a
 *
 * with the attention factor a = attention_factor when it is > 0, else
 * m(factor, mscale) / m(factor, mscale_all_dim) when both mscales are > 0, else m(factor, 1),
 * where m(s, k) = 0.1 * k * ln(s) + 1 for s > 1 and 1 for s <= 1 (Hugging Face's rules; 0 stands
 * for a key the config leaves out). DeepSeek-V3: factor 40, original 4096, beta 32 / 1, mscale
 * = mscale_all_dim = 1, so a = 1; its attention then scales the softmax by m(40, 1)^2 itself,
 * outside this table. DeepSeek-V4's compressed layers: factor 16, attention_factor 1.
 * Hugging Face versions that derive factor from max_position_embeddings / original give the
 * same table when the config's factor agrees (it does for these models). */
typedef enum mlaf_rope_scaling_type {
    MLAF_ROPE_SCALING_NONE = 0, /* plain RoPE, exactly mlaf_rope_table_init */
    MLAF_ROPE_SCALING_YARN = 1,
    MLAF_ROPE_SCALING_COUNT_
} mlaf_rope_scaling_type;

/* Upper bounds of the scaling's numbers (and of the base, rope_theta, of both table builders):
 * far above any released model's, low enough that factor x original and every product above
 * stay finite and exact enough. `mlafuse presets --config` applies the same bounds. */
#define MLAF_ROPE_MAX_BASE 1e12            /* base (rope_theta): 1 < base <= 1e12 */
#define MLAF_YARN_MAX_FACTOR 1e6           /* 1 <= factor <= 1e6 */
#define MLAF_YARN_MAX_ORIGINAL 2147483647  /* 1 <= original_max_position_embeddings <= 2^31 - 1 */
#define MLAF_YARN_MAX_BETA 1000.0          /* 0 < beta_fast, beta_slow <= 1000 */
#define MLAF_YARN_MAX_MSCALE 100.0         /* 0 <= mscale, mscale_all_dim, attention_factor <= 100 */

typedef struct mlaf_rope_scaling {
    mlaf_rope_scaling_type type;
    double factor;            /* context extension factor, 1 <= factor <= 1e6 */
    int64_t original_max_position_embeddings; /* the context before extension, 1 .. 2^31 - 1 */
    double beta_fast;         /* 0 < beta_fast <= 1000 (Hugging Face default 32) */
    double beta_slow;         /* 0 < beta_slow <= 1000 (default 1) */
    double mscale;            /* 0 <= mscale <= 100; 0 = absent */
    double mscale_all_dim;    /* 0 <= mscale_all_dim <= 100; 0 = absent */
    double attention_factor;  /* 0 <= attention_factor <= 100; 0 = derived from the mscales (above) */
    int32_t truncate;         /* nonzero (the default): round the correction range outward */
} mlaf_rope_scaling;

/* YaRN with Hugging Face's defaults for the keys a config may leave out: beta_fast 32,
 * beta_slow 1, no mscales, attention factor derived, truncate on. */
MLAF_API mlaf_rope_scaling mlaf_rope_scaling_yarn(double factor,
                                                  int64_t original_max_position_embeddings);

/* The multiplier `a` the scaled table applies to cos and sin: 1 for NULL or NONE, NaN when the
 * scaling's parameters are invalid (see mlaf_rope_table_init_scaled). */
MLAF_API double mlaf_rope_scaling_attention_factor(const mlaf_rope_scaling *scaling);

/* mlaf_rope_table_init with a scaling (NULL or NONE: the plain table, bit for bit). Computed in
 * double and rounded once to f32. MLAF_ERR_NULL_POINTER for a NULL table;
 * MLAF_ERR_INVALID_ARGUMENT, the table untouched, for a bad max_pos / rope_dim / base (as
 * mlaf_rope_table_init), an unknown type, or a field outside its range above (NaN and the
 * infinities are outside every range). This call has no context to carry a message: the
 * ranges are those of the struct's comments and the MLAF_ROPE_MAX_* / MLAF_YARN_MAX_* bounds. */
MLAF_API mlaf_status mlaf_rope_table_init_scaled(float *table, int64_t max_pos, int32_t rope_dim,
                                                 double base, const mlaf_rope_scaling *scaling);

/* ---------------------------------------------------------------------------------------
 * mla_kv_cache: split + both RMSNorms + RoPE on k_pe + paged KV-cache write
 *
 *   latent, w_q, w_kv, q       as split_qk_norm (q is the dense q_norm output)
 *   positions [T]              i32 | i64
 *   cos_sin   [max_pos, R]     f32
 *   slot_mapping [N]           i32 | i64, N <= T (rows t >= N: slot -1); slot = block *
 *                              block_size + offset; < 0 = skip token
 *   kv_cache  [num_blocks, block_size, C + R]   f32 | f16 | bf16, strides (s0, s1, 1) any
 *                              that do not make rows overlap; need not match latent's dtype
 *   k_nope    [T, C]  optional dense output (normalized), latent's dtype
 *   k_pe      [T, R]  optional dense output (roped), latent's dtype
 *   error_count [1]   optional i32: incremented (atomically on CUDA) once for every token
 *                     whose slot is >= num_blocks * block_size or whose position is outside
 *                     [0, max_pos); such a token writes no cache row, no k_pe row, and its
 *                     q / k_nope outputs are still written. The caller zeroes it. The
 *                     count saturates at INT32_MAX (it never wraps negative).
 *
 * For every token t with slot >= 0 in range: cache[slot] = [k_nope_norm | rope(k_pe)], each
 * value rounded once to the cache dtype. Cache rows not named by slot_mapping stay
 * bit-identical. Two tokens naming the same slot: one of them wins (unspecified which).
 * R == 0 is accepted (no rotation); cos_sin and positions may then be absent.
 *
 * kv_rope_tail = r > 0 (DeepSeek-V4; 0 = none, every other model): the rope part lives
 * inside the kv part. Requires R == 0 (the latent row is [Q | C]), r even, 0 < r <= C, and the
 * interleaved style; positions [T] and cos_sin [max_pos, r] are then required. Per token:
 * k_nope = RMSNorm(kv) * w_kv in fp32 over all C values, rounded to the latent dtype; then the
 * values [C - r, C) of that rounded vector are rotated in fp32 (pairs (C - r + 2i, C - r + 2i + 1)
 * with cos_sin[pos, i], sin at [pos, r/2 + i]; the rotation rule of the RoPE section, so q and k
 * of one position agree) and rounded again. The dense k_nope output holds all C values (the
 * rotated tail included) and the cache record is [k_nope] (plain: C values, each the fp32 value
 * rounded once to the cache dtype; the nope values straight from fp32 as without a tail).
 * A token with a position outside [0, max_pos) or a slot past the cache is counted and writes
 * no cache row and no tail values of k_nope (its nope values are written). k_pe must be absent
 * and the cache has no rope part (no kpe). In place: k_nope may be the latent's own kv columns;
 * the row then ends as [q_norm | rope-tailed kv_norm]. Formats: plain, fp8, fp8_v4
 * (fp8_ds_mla is rejected with a tail).
 * ------------------------------------------------------------------------------------- */
typedef struct mlaf_mla_kv_cache_params {
    int32_t q_lora_rank;
    int32_t kv_lora_rank;
    int32_t rope_dim;
    float eps_q;
    float eps_kv;
    mlaf_rope_style style;
    int32_t kv_rope_tail; /* r >= 0; 0: no rope inside the kv part (every model but V4) */
} mlaf_mla_kv_cache_params;

MLAF_API mlaf_status mlaf_mla_kv_cache(mlaf_context *ctx, const mlaf_mla_kv_cache_params *p,
                                       const mlaf_tensor *latent, const mlaf_tensor *w_q,
                                       const mlaf_tensor *w_kv, const mlaf_tensor *positions,
                                       const mlaf_tensor *cos_sin,
                                       const mlaf_tensor *slot_mapping,
                                       const mlaf_tensor *kv_cache, const mlaf_tensor *q,
                                       const mlaf_tensor *k_nope, const mlaf_tensor *k_pe,
                                       const mlaf_tensor *error_count);

/* ---------------------------------------------------------------------------------------
 * mla_kv_cache into a cache format (docs/kv_formats.md): the same op, its cache in any format an MLA
 * decode kernel reads, quantized in the same pass
 *
 * mlaf_mla_kv_cache_fmt takes mlaf_mla_kv_cache's arguments with the cache described by a
 * mlaf_kv_cache_desc; mlaf_mla_kv_cache(..., kv_cache, ...) is format PLAIN, cache = kv_cache.
 *
 *   PLAIN       cache [num_blocks, block_size, C + R] f32 | f16 | bf16; or, with kpe given,
 *               cache [.., .., C] and kpe [num_blocks, block_size, R] (FlashInfer / TRT-LLM's
 *               separate ckv / kpe arrays; the same dtype and block count, any strides each).
 *   FP8         the same shapes in e4m3 bytes (dtype fp8_e4m3 or u8): k_nope_norm and the roped
 *               k_pe both quantized with ONE scale, scale [1] f32 (on CUDA in device memory,
 *               read by the kernel, so a captured graph follows its changes):
 *                 conv MLAF_FP8_DIV  e4m3(x / scale)   (vLLM's k_scale)
 *                 conv MLAF_FP8_MUL  e4m3(x * scale)   (FlashInfer's / TRT-LLM's quant_scale)
 *               amax_out [1] f32, optional: raised to the max |x| of every row written to the
 *               cache (the caller zeroes it; NaN ignored), for calibration.
 *   FP8_DS_MLA  cache [num_blocks, block_size, C + C/32 + 2 R] bytes (u8 or fp8_e4m3), per token
 *               [C e4m3 | C/128 little-endian f32 tile scales | R bf16 rope(k_pe)] (656 B for
 *               C = 512, R = 64; FlashMLA's sparse decode reads block_size 64). Needs a bf16
 *               latent, C % 128 == 0, 16-byte aligned data and both cache strides multiples of
 *               16 bytes. Tile t is values [128 t, 128 t + 128); its scale s by tile_scale, then
 *               e4m3(x / s):
 *                 MLAF_TILE_AMAX                max(amax / 448, FLT_MIN)            (vLLM)
 *                 MLAF_TILE_UE8M0               2^ceil_log2(max(amax, 1e-4) / 448)  (DeepSeek)
 *                 MLAF_TILE_UE8M0_FLOOR_SCALED  2^ceil_log2(max(amax / 448, 1e-4))  (FlashMLA's
 *                                               test quantizer)
 *               (an infinite amax gives ceil_log2 = 128: s = +inf).
 *   FP8_V4      DeepSeek-V4's SM90 FlashMLA record (584 B per token). Needs a bf16 latent,
 *               C = 512, rope_dim 0 and kv_rope_tail 64 (the only layout FlashMLA reads). cache
 *               [num_blocks, block_size, 584] bytes (u8 or fp8_e4m3) with stride[1] = 584 and
 *               stride[0] = the page stride in bytes, >= block_size * 584 and a multiple of 16,
 *               data 16-byte aligned. A page is planar: the token at offset o has its 576-byte
 *               data row at page + o * 576 (448 e4m3 NoPE values, then the 64 roped values as
 *               bf16) and its 8-byte scale row at page + block_size * 576 + o * 8 (7 UE8M0 bytes,
 *               one per 64 NoPE values, then a zero byte, written with every row). Per 64-value
 *               block: e = ceil_log2(max(amax, 1e-4) / 448), byte = clamp(e + 127, 0, 255),
 *               e4m3(x * 2^-e) (an exact power-of-two product).
 *
 * Every fp8 value x is the value the op stores densely, rounded to the latent dtype first, so
 * the fused bytes equal the unfused pipeline's; amax is over those values (NaN ignored). e4m3:
 * round to nearest even, |x| >= 464 and +-inf give +-448 (0x7E / 0xFE), NaN gives 0x7F.
 * Divisions are IEEE f32 divisions. In the fp8 formats two tokens naming one slot leave that
 * slot's record undefined. Every other rule of mla_kv_cache holds (skipped and counted tokens,
 * untouched rows, strided caches, any block_size).
 * slot_mapping may have N <= T entries (engines pad the latent for graphs): rows t >= N take
 * slot -1 (no cache row; q and the dense outputs are written). This holds for
 * mlaf_mla_kv_cache too.
 * ------------------------------------------------------------------------------------- */
typedef enum mlaf_kv_format {
    MLAF_KV_PLAIN = 0,
    MLAF_KV_FP8 = 1,
    MLAF_KV_FP8_DS_MLA = 2,
    MLAF_KV_FP8_V4 = 3,
    MLAF_KV_FORMAT_COUNT_
} mlaf_kv_format;

typedef enum mlaf_fp8_conv { MLAF_FP8_DIV = 0, MLAF_FP8_MUL = 1 } mlaf_fp8_conv;

typedef enum mlaf_tile_scale {
    MLAF_TILE_AMAX = 0,
    MLAF_TILE_UE8M0 = 1,
    MLAF_TILE_UE8M0_FLOOR_SCALED = 2
} mlaf_tile_scale;

typedef struct mlaf_kv_cache_desc {
    mlaf_kv_format format;
    const mlaf_tensor *cache;    /* required */
    const mlaf_tensor *kpe;      /* PLAIN / FP8: optional separate rope array; else NULL */
    const mlaf_tensor *scale;    /* FP8: [1] f32, required; else NULL */
    const mlaf_tensor *amax_out; /* FP8: [1] f32, optional; else NULL */
    mlaf_fp8_conv conv;          /* FP8 */
    mlaf_tile_scale tile_scale;  /* FP8_DS_MLA */
} mlaf_kv_cache_desc;

/* "plain", "fp8", "fp8_ds_mla", "fp8_v4"; "unknown" otherwise. */
MLAF_API const char *mlaf_kv_format_name(mlaf_kv_format f);
/* Bytes of one token's cache record in a format (PLAIN: (C + R) * the dtype's size), 0 when
 * the format, dtype or dims are not valid for it. FP8_V4: 584 for C = 512, R = 0 (its data row
 * and scale row together; the tail 64 is implied). */
MLAF_API int64_t mlaf_kv_record_bytes(mlaf_kv_format f, mlaf_dtype cache_dtype, int32_t kv_lora_rank,
                                      int32_t rope_dim);

MLAF_API mlaf_status mlaf_mla_kv_cache_fmt(mlaf_context *ctx, const mlaf_mla_kv_cache_params *p,
                                           const mlaf_tensor *latent, const mlaf_tensor *w_q,
                                           const mlaf_tensor *w_kv, const mlaf_tensor *positions,
                                           const mlaf_tensor *cos_sin,
                                           const mlaf_tensor *slot_mapping,
                                           const mlaf_kv_cache_desc *cache, const mlaf_tensor *q,
                                           const mlaf_tensor *k_nope, const mlaf_tensor *k_pe,
                                           const mlaf_tensor *error_count);

/* ---------------------------------------------------------------------------------------
 * rope_q: RoPE in place on the last R columns of q viewed as [T, H, D]
 *
 *   q         [T, H, D]  f32 | f16 | bf16, strides (s0, s1, 1); D = nope_dim + R; modified
 *   positions [T]        i32 | i64
 *   cos_sin   [max_pos, R] f32
 *   error_count [1]      optional i32, as in mla_kv_cache: a token whose position is outside
 *                        [0, max_pos) is left unrotated and counted (saturating at
 *                        INT32_MAX).
 * T = 0 or H = 0 is a valid no-op: nothing is rotated, read or counted.
 * ------------------------------------------------------------------------------------- */
MLAF_API mlaf_status mlaf_rope_q(mlaf_context *ctx, const mlaf_rope_params *p,
                                 const mlaf_tensor *q, const mlaf_tensor *positions,
                                 const mlaf_tensor *cos_sin, const mlaf_tensor *error_count);

/* rope_q with an optional output (DeepSeek-V4): q_out NULL is mlaf_rope_q (in place). Otherwise
 * q_out [T, Hpad, D] in q's dtype, strides (s0, s1, 1), Hpad >= H, disjoint from every input:
 * head h < H receives the whole result head (the first D - R values copied, or normalized with
 * head_norm; the last R rotated) and heads H .. Hpad - 1 are written as +0.0 (FlashMLA takes 64
 * or 128 heads only); q is only read. A token whose position is outside [0, max_pos) is counted
 * and none of its values are written (in place: its heads stay as they were; q_out: its row,
 * padding heads included, stays as it was). T = 0 is a no-op; H = 0 with q_out zero-fills the
 * padding heads of every token with a valid position. */
MLAF_API mlaf_status mlaf_rope_q_out(mlaf_context *ctx, const mlaf_rope_params *p,
                                     const mlaf_tensor *q, const mlaf_tensor *positions,
                                     const mlaf_tensor *cos_sin, const mlaf_tensor *q_out,
                                     const mlaf_tensor *error_count);

#endif /* MLAFUSE_MLA_H */
