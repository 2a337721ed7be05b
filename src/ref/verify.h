/*
 * verify.h — the float64 oracle of every op and the checks that compare a backend with it.
 * Shared by the C tests (tests/) and `mlafuse verify` (tools/), so both judge by the same
 * rules (docs/conventions.md). Not part of the shipped library.
 *
 * Oracle functions read the inputs of a validated job (host memory) and write dense,
 * row-major float64 results, unrounded; the checks round them once to the output dtype.
 *
 * Error units: every comparison is expressed in "units" where <= 1 passes:
 *   f16 / bf16 outputs: |got - ref| in units in the last place of the output dtype at ref;
 *   f32 outputs: relative error / 1e-5 (with an absolute floor scaled by the row's size).
 */
#ifndef MLAF_VERIFY_H
#define MLAF_VERIFY_H

#include <stddef.h>
#include <stdint.h>

#include "../internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- random numbers (seeded, reproducible) --------------------------------------------- */
typedef struct mlaf_rng {
    uint64_t s;
} mlaf_rng;
void mlaf_rng_seed(mlaf_rng *r, uint64_t seed);
uint64_t mlaf_rng_u64(mlaf_rng *r);
double mlaf_rng_uniform(mlaf_rng *r);                 /* [0, 1) */
/* The generator is a counter: r moved on by n draws, as n calls of mlaf_rng_u64 would. */
mlaf_rng mlaf_rng_skipped(const mlaf_rng *r, uint64_t n);
double mlaf_rng_normal(mlaf_rng *r);                  /* N(0, 1) */
/* Fills n elements of dtype dt (float types) with N(mean, stddev) values, rounded to dt. */
void mlaf_fill_normal(mlaf_rng *r, void *p, mlaf_dtype dt, size_t n, double mean, double stddev);
/* The same values as mlaf_fill_normal called once per row, rows after one another (each
 * normal takes two draws of the counter-based generator, so row t starts 2 t n draws in),
 * filled by all threads; rows are `stride` elements apart. r ends where the calls would. */
void mlaf_fill_normal_rows(mlaf_rng *r, void *p, mlaf_dtype dt, int64_t rows, size_t n,
                           int64_t stride, double mean, double stddev);

/* ---- guarded buffers on any backend --------------------------------------------------- *
 * `bytes` of usable memory with MLAF_GUARD_BYTES of a known pattern on each side, on the
 * backend's memory (device memory for CUDA). `host` mirrors the whole region (guards
 * included) after gbuf_download; `body` points at the usable part of that mirror. */
#define MLAF_GUARD_BYTES 256
typedef struct mlaf_gbuf {
    mlaf_backend backend;
    unsigned char *dev_base; /* backend memory, guards included */
    void *ptr;               /* backend pointer to the usable part (pass to ops) */
    size_t bytes;
    unsigned char *host;     /* host mirror of the full region */
    void *body;              /* host mirror of the usable part */
} mlaf_gbuf;

/* Allocates; the usable part is filled from `init` (host, `bytes` long) or, when init is NULL,
 * with the poison byte 0xFF (NaN in every float dtype). `misalign` shifts the usable part by
 * that many bytes from a 256-byte boundary (0 for aligned). Returns MLAF_OK or an error. */
mlaf_status mlaf_gbuf_alloc(mlaf_gbuf *g, mlaf_backend b, size_t bytes, const void *init,
                            size_t misalign);
void mlaf_gbuf_free(mlaf_gbuf *g);
mlaf_status mlaf_gbuf_download(mlaf_gbuf *g);         /* device -> host mirror */
mlaf_status mlaf_gbuf_upload(mlaf_gbuf *g);           /* host mirror (whole) -> device */
int mlaf_gbuf_guards_ok(const mlaf_gbuf *g);          /* after download: 1 if intact */
/* 1 if the usable part (after download) equals `expect` byte for byte. */
int mlaf_gbuf_equals(const mlaf_gbuf *g, const void *expect);

/* ---- checks on all threads ------------------------------------------------------------ */
/* One item's verdict (a token or a chunk of tokens): its worst error in units, values judged,
 * errors counted, failures, and the first failure's text. */
typedef struct mlaf_item_out {
    double worst;
    int64_t values, errors;
    int failed;
    char why[512];
} mlaf_item_out;
/* Checks item k (out starts zeroed); scratch: this thread's scratch_bytes. */
typedef void (*mlaf_item_fn)(const void *arg, void *scratch, int64_t k, mlaf_item_out *out);
/* Items [0, n) on all threads. *total is what a loop in item order that stops after the first
 * failing item gives: worst (max), values, errors and failed (sums) over the items up to it,
 * and its why. Items past the first failure found so far are skipped. MLAF_ERR_OUT_OF_MEMORY
 * when the bookkeeping or a thread's scratch could not be had. */
mlaf_status mlaf_run_items(int64_t n, size_t scratch_bytes, mlaf_item_fn fn, const void *arg,
                           mlaf_item_out *total);

/* ---- error units ----------------------------------------------------------------------- */
/* Units of |got - ref| for a value stored in dtype dt (see above); NaN / inf mismatches give
 * +inf. `scale` is the magnitude of the quantity's terms (for f32 absolute floor), usually
 * |ref|. */
double mlaf_err_units(double got, double ref, mlaf_dtype dt, double scale);

/* ---- verification cases ---------------------------------------------------------------- */
typedef struct mlaf_verify_case {
    mlaf_model_config cfg;     /* model dims and router parameters */
    mlaf_dtype dtype;          /* latent / logits / q dtype */
    mlaf_dtype weight_dtype;   /* norm weights: dtype or MLAF_F32 */
    int64_t T;
    int strided;               /* rows with padding between them (and odd pointer offsets) */
    int in_place;              /* split_qk_norm / mla_kv_cache: outputs in the latent's columns */
    int no_k_pe;               /* omit the optional dense k_pe output */
    uint64_t seed;
    /* mla_kv_cache / rope_q */
    mlaf_rope_style rope_style;
    int64_t block_size;        /* >= 1 */
    mlaf_dtype cache_dtype;    /* plain: the cache's dtype; fp8 formats: U8 or FP8_E4M3 (any
                                  other value: FP8_E4M3) */
    mlaf_dtype index_dtype;    /* positions and slot_mapping: I32 or I64 */
    int64_t map_short;         /* mla_kv_cache: slot_mapping has max(T - map_short, 0) entries
                                  (rows past its end take slot -1); 0: T entries */
    /* mla_kv_cache cache format (docs/kv_formats.md); the zeroed default is plain */
    mlaf_kv_format kv_format;
    mlaf_fp8_conv fp8_conv;    /* fp8 */
    float fp8_scale;           /* fp8: > 0 the scale itself; 0: fitted so that the largest |x|
                                  of the rows written maps near 300 (DIV scale amax / 300, MUL
                                  300 / amax); < 0: fitted so that it maps near -fp8_scale (e.g.
                                  -4000: the top values saturate) */
    int want_amax;             /* fp8: pass amax_out (starting at amax_init) and check it */
    float amax_init;
    int kpe_separate;          /* plain / fp8: the rope part in its own kpe array */
    mlaf_tile_scale tile_scale; /* fp8_ds_mla */
    int32_t kv_rope_tail;      /* mla_kv_cache: the rope tail inside the kv part (docs/mla.md; cfg's
                                  qk_rope_head_dim must then be 0); 0: none */
    /* rope_q */
    int head_norm;             /* weightless per-head RMSNorm first (eps: cfg.rms_norm_eps) */
    int64_t q_out_heads;       /* > 0: out of place into q_out [T, q_out_heads, D] (>= heads); 0: in place */
    /* the DSA indexer (docs/dsa.md): mla_kv_cache with its key branch (mlaf_mla_kv_cache_dsa, judged
     * by verify_indexer.c; in_place then means the dense index output is index_k itself), and
     * indexer_q; the preset's index_n_heads is indexer_q's H */
    int indexer;               /* mla_kv_cache: 1 = with the key branch */
    mlaf_rope_style index_style;
    int index_hadamard;
    mlaf_index_scale index_scale;
    int index_q_pe;            /* indexer_q: also rope the MLA q_pe [T, heads, nope + rope] */
    int index_copies;          /* mla_kv_cache with the key branch: > 1 = the multi-destination
                                  store into that many index caches (docs/mla.md) */
    /* moe_gate */
    int moe_override;          /* 1: use `moe` and `experts` below instead of cfg's router */
    mlaf_moe_gate_params moe;
    int32_t experts;
    int moe_bias;              /* -1: from cfg (has_score_bias), 0: absent, 1: present */
    int nonfinite;             /* moe_gate: put NaN / +-inf into some logits */
    int want_scores;           /* moe_gate: request the score matrix */
    /* The harness's own test: 1 + t of a token whose first output value (q, or k_nope without
     * q; rope_q's first rotated value; moe_gate's first weight; with an fp8 cache format, byte 0
     * of its cache record, when it writes one) is altered after the run, and every 500th token
     * after it; 0 (the default) for none. The check must then fail and name that first token. */
    int64_t corrupt_from;
    /* moe_gate and moe_gate_hash (docs/moe_gate.md) */
    int moe_wide;              /* a few logits per row of large magnitude (see mlaf_ref_moe_fill) */
    int moe_hash;              /* 1: mlaf_moe_gate_hash with a random tid2eid table (i32 / i64 as
                                  index_dtype; token ids the other dtype when strided); 2: the
                                  same with bad rows of every kind (token id < 0 or >= vocab,
                                  entries out of [0, E), repeated entries) */
    /* rms_norm_quant (docs/gemm_formats.md; eps: cfg.rms_norm_eps, or 1e-6 when it is 0; in_place: y is
     * x; strided: padded rows, odd offsets, wider scale strides) */
    int64_t hidden;            /* K (0: 7168); gemm_quant's too (its q_* and strided below) */
    mlaf_gemm_format q_format; /* the quantized output (NONE: none) */
    mlaf_gemm_scale q_scale;
    float q_eps;               /* its eps (0: the default) */
    int residual;              /* with the residual add */
    int no_dense;              /* 1: q alone, no y (a dense-only call on the same inputs gives the row
                                  its bytes are judged from) */
} mlaf_verify_case;

/* 0 for a model whose kv carries its rope (DeepSeek-V4: [Q | C] with RoPE on the last
 * kv_rope_tail kv values): the per-preset loops of the attention ops leave such a model to its
 * own cases (test_v4_attn, verify's V4 cases), which pass the tail to the ops. */
static inline int mlaf_preset_plain_latent(const mlaf_model_config *cfg) {
    return cfg->kv_rope_tail == 0;
}

typedef struct mlaf_verify_result {
    int passed;
    double worst_units;        /* worst error in units (<= 1 passes) */
    char detail[512];          /* first failure, or a one-line summary */
} mlaf_verify_result;

/* The deepseek-v4-flash preset (docs/models.md: q_lora 1024, kv_lora 512, R 0, 64 heads of 512
 * with a 64-wide interleaved rope tail, eps 1e-6), with *kv_rope_tail = its kv_rope_tail (64). */
mlaf_model_config mlaf_v4_flash_attn_config(int32_t *kv_rope_tail);

/* A case with the defaults: preset cfg, dtype bf16, weights in dtype, T tokens, seed. */
mlaf_verify_case mlaf_verify_case_default(const mlaf_model_config *cfg, mlaf_dtype dt, int64_t T,
                                          uint64_t seed);

/* Run one op on ctx's backend for the case and compare with the oracle. Returns MLAF_OK when
 * the comparison ran (see r->passed), or the error that stopped it. Each checks poisoned
 * outputs, guard zones around every buffer, and bit-identity of what must not change. */
mlaf_status mlaf_verify_split_qk_norm(mlaf_context *ctx, const mlaf_verify_case *c,
                                      mlaf_verify_result *r);
mlaf_status mlaf_verify_mla_kv_cache(mlaf_context *ctx, const mlaf_verify_case *c,
                                     mlaf_verify_result *r);
mlaf_status mlaf_verify_rope_q(mlaf_context *ctx, const mlaf_verify_case *c,
                               mlaf_verify_result *r);
/* moe_gate; with c->moe_hash, mlaf_moe_gate_hash (mlaf_verify_moe_gate_hash). */
mlaf_status mlaf_verify_moe_gate(mlaf_context *ctx, const mlaf_verify_case *c,
                                 mlaf_verify_result *r);
mlaf_status mlaf_verify_moe_gate_hash(mlaf_context *ctx, const mlaf_verify_case *c,
                                      mlaf_verify_result *r);
/* mla_kv_cache with the indexer key branch (the case's indexer fields; verify_indexer.c) and
 * indexer_q. */
mlaf_status mlaf_verify_mla_kv_cache_dsa(mlaf_context *ctx, const mlaf_verify_case *c,
                                         mlaf_verify_result *r);
mlaf_status mlaf_verify_indexer_q(mlaf_context *ctx, const mlaf_verify_case *c,
                                  mlaf_verify_result *r);
/* The float64 oracle of one indexer row (docs/dsa.md), rounded to dt after every step as the op
 * does: x[128] the input (key: before the LayerNorm, w / b given; query: w NULL, no LayerNorm),
 * cs the position's cos_sin row. y: the final vector; bound: per value, the largest |got - y|
 * an implementation that follows the contract may show (one unit of dt per rounding plus what
 * the earlier steps' allowed differences become through the later ones). */
void mlaf_ref_index_row(const double *x, const double *w, const double *b, double eps, mlaf_dtype dt,
                        mlaf_rope_style style, const float *cs, int hadamard, double *y, double *bound);
/* rms_norm_quant (verify_rms_norm_quant.c): the dense y against the oracle, the residual bit for bit,
 * every quantized byte the encoder's of the backend's own dense row, decoding within half an e4m3
 * step. */
mlaf_status mlaf_verify_rms_norm_quant(mlaf_context *ctx, const mlaf_verify_case *c,
                                       mlaf_verify_result *r);
/* gemm_quant (verify_gemm_quant.c): x of c->hidden values a row (c->dtype; NaN, infinities,
 * subnormal and zero rows among them) quantized into c->q_format / c->q_scale / c->q_eps, every byte
 * the encoder's of the row as stored (values, scales, the packed layout's zero bytes), decoding
 * within half an e4m3 step, everything else untouched; strided: padded x rows and odd offsets,
 * wider scale strides. */
mlaf_status mlaf_verify_gemm_quant(mlaf_context *ctx, const mlaf_verify_case *c, mlaf_verify_result *r);
/* Dispatch by op. */
mlaf_status mlaf_verify_op(mlaf_context *ctx, mlaf_op op, const mlaf_verify_case *c,
                           mlaf_verify_result *r);

/* ---- cache formats (docs/kv_formats.md): the reference encoder (ref_kv_format.c) ------- */
typedef struct mlaf_kv_encoding {
    mlaf_kv_format format;      /* FP8 or FP8_DS_MLA */
    mlaf_fp8_conv conv;         /* FP8 */
    float scale;                /* FP8: the scale's value */
    mlaf_tile_scale tile_scale; /* FP8_DS_MLA */
    int32_t C, R;               /* FP8_V4: C = 512 (nope holds the tail), R = 0 */
} mlaf_kv_encoding;
/* One token's record from its dense row as the op stored it: nope[C] = k_nope_norm, pe[R] = the
 * roped k_pe, each value already in the latent dtype. Writes mlaf_kv_record_bytes(format, U8,
 * C, R) bytes to rec (FP8: C + R e4m3 bytes, the rope part at [C, C + R) also when the cache
 * keeps it in a separate array) and, for FP8_DS_MLA when tile_scales is not NULL, the C / 128
 * tile scales. Returns the row's NaN-ignoring max |x| over nope and pe (what FP8's amax_out
 * takes). */
float mlaf_ref_kv_encode(const mlaf_kv_encoding *e, const float *nope, const float *pe,
                         uint8_t *rec, float *tile_scales);
/* How many formats of src/kv_format.h have an encoder here (a test checks: all of them). */
int mlaf_ref_kv_encoder_count(void);
/* A ds_mla tile's scale from its amax, by mode. */
float mlaf_ref_tile_scale(mlaf_tile_scale mode, float amax);
/* e4m3(x / scale) (DIV) or e4m3(x * scale) (MUL). */
uint8_t mlaf_ref_fp8_quantize(float x, float scale, mlaf_fp8_conv conv);
/* The decoding check of docs/kv_formats.md for one value: e4m3 byte b decoded (b * scale, or
 * b / scale for MUL) is within half an e4m3 ulp of x, widened by the f32 rounding of x / scale
 * (x * scale). 1 within, 0 not, -1 not judged (x or its quantized value not finite, or
 * saturated: |y| >= 464). *ratio: the error over the bound. */
int mlaf_ref_fp8_decode_check(uint8_t b, float x, float scale, mlaf_fp8_conv conv, double *ratio);

/* ---- GEMM-input formats (docs/gemm_formats.md): the reference encoder (ref_gemm_format.c) ---- */
typedef struct mlaf_gemm_encoding {
    mlaf_gemm_format format;
    mlaf_gemm_scale scale;
    float eps; /* resolved: the amax floor of the f32 / ue8m0 roundings (never 0) */
} mlaf_gemm_encoding;
/* One row of K values y, each already in the activation dtype, encoded from the definitions:
 * data[K] the e4m3 bytes; per group j < K / g its scale scale_f32[j] and its UE8M0 byte
 * scale_byte[j] (0 for the f32 rounding). */
void mlaf_ref_gemm_encode_row(const mlaf_gemm_encoding *e, const float *y, int64_t K, uint8_t *data,
                              float *scale_f32, uint8_t *scale_byte);
/* Where row t's group j keeps its scale in a scales buffer of format f with leading stride ld
 * (elements of the scales' dtype): the byte offset of its 4 bytes (f32 layouts) or of its byte;
 * -1 for NONE. */
int64_t mlaf_ref_gemm_scale_offset(mlaf_gemm_format f, int64_t t, int64_t j, int64_t ld);
/* How many formats of src/gemm_format.h have an encoder here (a test checks: all of them). */
int mlaf_ref_gemm_encoder_count(void);
/* gemm_quant's oracle (ref_gemm_format.c): row t of a validated job's x (host memory), its K values
 * as stored into row[K], then encoded as mlaf_ref_gemm_encode_row does with the job's format,
 * rounding and eps. */
void mlaf_ref_gemm_quant_row(const mlaf_gemm_quant_job *job, int64_t t, float *row, uint8_t *data, float *scale_f32,
                             uint8_t *scale_byte);

/* ---- the oracle (float64, plain loops) ------------------------------------------------- */
/* Dense outputs: q [T,Q] (NULL when Q == 0), k_nope [T,C], k_pe [T,R] (may be NULL). */
void mlaf_ref_split_qk_norm(const mlaf_norm_job *job, double *q, double *k_nope, double *k_pe);
/* rope on one row of R values in place, style as given; cos/sin from the table row. */
void mlaf_ref_rope_row(double *x, int32_t R, mlaf_rope_style style, const float *cos_sin_row);
/* q, k_nope as above; k_pe [T,R] roped (NULL allowed); rows [T, C+R] the cache row each
 * token writes; status [T]: 1 written, 0 skipped (negative slot), -1 counted as an error. */
void mlaf_ref_mla_kv_cache(const mlaf_kv_cache_job *job, double *q, double *k_nope, double *k_pe,
                           double *rows, int8_t *status);
/* rms_norm_quant: h [T, K] the normalized source (x, or round(x + residual) to the dtype, exact),
 * y [T, K] the dense output, unrounded. */
void mlaf_ref_rms_norm_quant(const mlaf_rms_norm_quant_job *job, double *h, double *y);
/* q_out [T,H,D]: the whole head after rotation; status [T]: 1 rotated, -1 position invalid. */
void mlaf_ref_rope_q(const mlaf_rope_q_job *job, double *q_out, int8_t *status);
/* weights [T,K], ids [T,K]; sel [T, top_k + 1]: the selection value c of each chosen expert
 * and of the best expert not chosen (-inf if none), for the tie-aware comparison;
 * scores [T,E] (may be NULL). */
void mlaf_ref_moe_gate(const mlaf_moe_gate_job *job, double *weights, int32_t *ids, double *sel,
                       double *scores);
/* The router check (docs/conventions.md) for one token t of a job whose logits and bias are in
 * host memory: NULL when the routed ids got[0, top_k) are acceptable (the oracle's, or within
 * its near-ties of c and of group scores), else why not (written to why). */
/* s of every expert of token t (NaN for a non-finite logit), float64. */
void mlaf_ref_moe_scores(const mlaf_moe_gate_job *job, int64_t t, double *s);
/* A moe_gate case's logits and bias (ref_moe.c; shared with the hash-routing case). */
void mlaf_ref_moe_fill(const mlaf_verify_case *c, mlaf_rng *rng, void *logits, mlaf_dtype dt,
                       int64_t T, int32_t E, int64_t ls, float *bhost);
const char *mlaf_ref_moe_gate_check_token(const mlaf_moe_gate_job *job, int64_t t,
                                          const int32_t *got, char *why, size_t cap);

#ifdef __cplusplus
}
#endif
#endif /* MLAF_VERIFY_H */
