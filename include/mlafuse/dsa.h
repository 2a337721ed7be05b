/*
 * mlafuse/dsa.h — the DSA lightning indexer (GLM-5, DeepSeek-V3.2): the indexer key
 * branch of mla_kv_cache (mlaf_mla_kv_cache_dsa) and the indexer query (mlaf_indexer_q).
 * Part of the public C API: include <mlafuse.h>, which includes this file (the types, status
 * codes and conventions are there).
 */
#ifndef MLAFUSE_DSA_H
#define MLAFUSE_DSA_H
#ifndef MLAFUSE_H
#error "include <mlafuse.h>, not mlafuse/dsa.h"
#endif

/* ---------------------------------------------------------------------------------------
 * DSA lightning indexer (DeepSeek-V3.2, GLM-5; docs/dsa.md): the key branch of mla_kv_cache and the
 * indexer_q op. Heads are D = 128 wide; RoPE rotates dims [0, 64) (rope first, nope after: the
 * reverse of MLA) with the MLA's cos_sin table, which must then be 64 wide (rope_dim = 64):
 * row p = cos[0..31] | sin[0..31]; NeoX pairs (x[i], x[i+32]), interleaved pairs (x[2i], x[2i+1]),
 * i < 32, both with cos[i], sin[i], rotated as the RoPE section above (no FMA), so keys and
 * queries of one position agree bit for bit.
 *
 * One mlaf_indexer_params value drives both sides (build it once per layer):
 *   style     the indexer's RoPE style (NeoX for DeepSeek-V3.2, interleaved for GLM-5: a
 *             config's indexer_rope_interleave; mlaf_indexer_params_from_config)
 *   hadamard  nonzero: after RoPE, y <- H_128 y * f32(128^-0.5) (Sylvester order, computed as the
 *             radix-2 butterfly (a + b, a - b) over strides 1, 2, 4, .., 64 in fp32, then the
 *             product), rounded again. Off by default (vLLM's and SGLang's fused paths); DeepSeek's
 *             reference applies it to q and k alike: never rotate one side only.
 *   ln_eps    the key LayerNorm's eps, finite and > 0 (1e-6)
 *   amax_eps  the amax floor of every scale, finite and >= 1e-30 (1e-4)
 *   scale     MLAF_INDEX_SCALE_UE8M0: s = 2^ceil_log2(max(amax, amax_eps) / 448) (vLLM, DeepSeek);
 *             MLAF_INDEX_SCALE_F32:   s = max(amax, amax_eps) / 448 (SGLang's key cache)
 * amax is the NaN-ignoring max |y| over the 128 rounded values; fp8 = e4m3(y / s) (IEEE division,
 * the e4m3 rules of the cache-format section).
 * ------------------------------------------------------------------------------------- */
#define MLAF_INDEX_HEAD_DIM 128
#define MLAF_INDEX_ROPE_DIM 64

typedef enum mlaf_index_scale { MLAF_INDEX_SCALE_UE8M0 = 0, MLAF_INDEX_SCALE_F32 = 1 } mlaf_index_scale;

typedef struct mlaf_indexer_params {
    mlaf_rope_style style;
    int32_t hadamard;
    float ln_eps;
    float amax_eps;
    mlaf_index_scale scale;
} mlaf_indexer_params;

/* The parameters of a preset's indexer: its index_rope_style, no Hadamard, ln_eps 1e-6, amax_eps
 * 1e-4, UE8M0 scales. */
MLAF_API mlaf_indexer_params mlaf_indexer_params_from_config(const mlaf_model_config *cfg);

/* The key branch of mla_kv_cache (mlaf_mla_kv_cache_dsa):
 *
 *   index_k   [T, 128]   latent's dtype, rows strided (e.g. the first 128 columns of the
 *                        [T, 128 + H] GEMM output that also holds the head weights)
 *   weight    [128]      LayerNorm weight, f32 or latent's dtype
 *   bias      [128]      LayerNorm bias, weight's dtype
 *   cache     [num_blocks, bytes]  u8 | fp8_e4m3, block-planar: the token at offset o of block b
 *                        has its 128 e4m3 bytes at b * stride[0] + 128 o and its little-endian f32
 *                        scale at b * stride[0] + 128 block_size + 4 o (132 bytes a token);
 *                        num_blocks and block_size are the MLA cache's; bytes >= 132 block_size;
 *                        stride[0] (the block stride, bytes) any value >= bytes, odd ones too
 *   out       [T, 128]   optional: the vector quantized (after the Hadamard when on), latent's
 *                        dtype, for context-parallel gathers; may be index_k itself (in place)
 *   topk_fill [T, K]     optional i32, filled with -1 (a full-indexer layer's top-k buffer)
 *   copies, copy_stride  the multi-destination store (context-parallel peers): with
 *                        copies = n in [2, 8] the index records are written, byte for byte the
 *                        same, to n caches: cache's view at cache.data + k * copy_stride bytes,
 *                        k < n (e.g. peer-mapped memory); copy_stride >= the bytes one cache
 *                        view spans, so the copies do not overlap. 0 or 1: the one cache. The op
 *                        issues no cross-GPU fence: the caller publishes before peers read.
 *
 * Per token, every step in fp32 and rounded to the latent dtype after it:
 *   1. LayerNorm: mu = sum(x) / 128, var = sum((x - mu)^2) / 128 (sums in a fixed order, no FMA),
 *      y = ((x - mu) * (1 / sqrt(var + ln_eps))) * w + b
 *   2. RoPE on dims [0, 64) in params.style
 *   3. the Hadamard when params.hadamard
 *   4. the scale s and e4m3(y / s) into the index cache at the token's slot
 * Tokens follow the MLA part's rules: the same slot_mapping (rows past its end: slot -1), a
 * negative slot writes no index cache row, a slot past the cache or a position outside
 * [0, max_pos) is counted once (not twice) and writes neither the index cache row nor `out`.
 * Two tokens naming one slot leave its index record undefined. */
typedef struct mlaf_indexer_k {
    const mlaf_tensor *index_k;   /* required */
    const mlaf_tensor *weight;    /* required */
    const mlaf_tensor *bias;      /* required */
    const mlaf_tensor *cache;     /* required */
    const mlaf_tensor *out;       /* optional */
    const mlaf_tensor *topk_fill; /* optional */
    int32_t copies;               /* 0 or 1: one cache; up to 8 */
    int64_t copy_stride;          /* bytes between the copies' bases */
} mlaf_indexer_k;

/* mla_kv_cache (any cache format) and, with ik given, the indexer key branch of every token in the
 * same pass (one launch on CUDA). ik NULL: exactly mlaf_mla_kv_cache_fmt (ip may then be NULL too).
 * With ik: rope_dim must be 64 (the indexer's rotation reads the MLA cos_sin rows). */
MLAF_API mlaf_status mlaf_mla_kv_cache_dsa(mlaf_context *ctx, const mlaf_mla_kv_cache_params *p,
                                           const mlaf_tensor *latent, const mlaf_tensor *w_q,
                                           const mlaf_tensor *w_kv, const mlaf_tensor *positions,
                                           const mlaf_tensor *cos_sin,
                                           const mlaf_tensor *slot_mapping,
                                           const mlaf_kv_cache_desc *cache, const mlaf_tensor *q,
                                           const mlaf_tensor *k_nope, const mlaf_tensor *k_pe,
                                           const mlaf_tensor *error_count,
                                           const mlaf_indexer_params *ip, const mlaf_indexer_k *ik);

/* indexer_q: the indexer's query side, after the q-b projection.
 *
 *   q_idx     [T, H, 128]  f32 | f16 | bf16, strides (s0, s1, 1)
 *   positions [T], cos_sin [max_pos, 64]   as mla_kv_cache
 *   w         [T, H]       head weights, f32 or q_idx's dtype, rows strided
 *   q_fp8     [T, H, 128]  output, u8 | fp8_e4m3, strides (s0, s1, 1)
 *   w_out     [T, H]       output, f32, rows strided
 *   q_pe      [T, Hq, D]   optional: the MLA query, RoPE in place on its last q_pe_rope->rope_dim
 *                          (= 64) columns in q_pe_rope->style (exactly mlaf_rope_q), same launch
 *   error_count [1]        optional i32: a token whose position is outside [0, max_pos) is counted
 *                          once and nothing of it is written (q_fp8, w_out, q_pe untouched)
 *
 * Per (token, head): RoPE on dims [0, 64), rounded to q_idx's dtype; the Hadamard when on,
 * rounded; s and q_fp8 = e4m3(q / s) as the header of this section says (UE8M0 in every engine);
 * w_out = ((f32(w) * s) * f32(128^-0.5)) * f32(H^-0.5), each product rounded to f32 (vLLM's order).
 * T = 0 (or H = 0 without q_pe) is a no-op. q_fp8 and w_out must not overlap any input or each other.
 * ------------------------------------------------------------------------------------- */
MLAF_API mlaf_status mlaf_indexer_q(mlaf_context *ctx, const mlaf_indexer_params *ip,
                                    const mlaf_tensor *q_idx, const mlaf_tensor *positions,
                                    const mlaf_tensor *cos_sin, const mlaf_tensor *w,
                                    const mlaf_tensor *q_fp8, const mlaf_tensor *w_out,
                                    const mlaf_tensor *q_pe, const mlaf_rope_params *q_pe_rope,
                                    const mlaf_tensor *error_count);

#endif /* MLAFUSE_DSA_H */
