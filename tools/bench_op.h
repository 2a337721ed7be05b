/*
 * bench_op.h — what the parts of `mlafuse bench` share (tools/bench_*.c): an op under test (its
 * buffers on the backend, their views), the helpers that set it up and check it, the op registry
 * (one bench_op_def per op, in bench_<op>.c, walked by bench_cmd.c's main loop) and the rows the
 * report prints (bench_report.c).
 */
#ifndef MLAF_BENCH_OP_H
#define MLAF_BENCH_OP_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cli.h"
#include "gemm_format.h"
#include "kv_format.h"
#include "cpu/norm_writers.h"
#include "half.h"
#include "ref/verify.h"

/* --hash: token ids of the tid2eid table (a DeepSeek-size vocabulary) */
#define HASH_VOCAB 129280

/* ---- buffers ----------------------------------------------------------------------------- */
enum {
    B_LATENT, B_WQ, B_WKV, B_Q, B_KNOPE, B_KPE, B_POS, B_COSSIN, B_SLOTS, B_CACHE, B_QH,
    B_LOGITS, B_BIAS, B_WEIGHTS, B_IDS, B_SCALE, B_TID2EID, B_TOKIDS,
    S_QD, S_KVD, S_KN, S_KP, S_GATHER, S_S, S_C, S_G, S_M, S_W,
    B_IK, B_IW, B_IB, B_ICACHE, S_IKD, /* --indexer: the DSA indexer key branch of mla_kv_cache */
    B_IQ, B_IQW, B_IQF, B_IQWO,        /* indexer_q: q_idx, head weights, q_fp8, w_out */
    B_RX, B_RRES, B_RW, B_RY, B_QD, B_QS, /* rms_norm_quant: x, residual, weight, y, q's data, scales;
                                             gemm_quant: x, q's data, scales */
    B_COUNT
};

typedef struct bbuf {
    size_t bytes, stride; /* per set; stride rounded up to 256 bytes */
    int per_set;          /* replicated nsets times (inputs / outputs) or single (scratch) */
    int mutable_input;    /* modified in place by the op (rope_q's q) */
    unsigned char *dev;
    void *init;           /* host contents of one set, kept to reset mutable inputs */
} bbuf;

typedef struct bench_op {
    mlaf_op op;
    const struct bench_op_def *def; /* the op's entry in the registry */
    mlaf_backend be;
    mlaf_context *ctx;
    mlaf_model_config cfg;
    mlaf_dtype dt;
    int64_t T;
    int threads, nsets;
    int64_t Q, C, R, H, D, max_pos, block_size, num_blocks, E, K, G;
    int32_t tail;               /* kv_rope_tail (DeepSeek-V4): mla_kv_cache's tail, rope_q head_norm */
    int64_t RP;                 /* the rope width of positions / cos_sin / q heads: R, or the tail */
    mlaf_moe_gate_params moe;
    int has_bias;
    int hash; /* moe_gate: mlaf_moe_gate_hash (--hash) */
    int cache_order; /* cache_order_names */
    mlaf_kv_format kv_fmt;      /* mla_kv_cache's cache format (--cache) */
    mlaf_tile_scale tile_scale; /* fp8_ds_mla */
    float kv_scale;             /* fp8 */
    mlaf_dtype cache_dt;        /* the latent dtype (plain), fp8_e4m3 (fp8) or u8 (fp8_ds_mla) */
    int64_t rec_bytes;          /* bytes of one token's cache record */
    int indexer;                /* --indexer: mla_kv_cache with the DSA indexer key branch */
    mlaf_indexer_params ip;
    int64_t hidden;             /* rms_norm_quant, gemm_quant: K (--hidden); split_qk_norm / mla_kv_cache: Q
                                   under --q-format */
    mlaf_gemm_format q_fmt;     /* rms_norm_quant, gemm_quant, split_qk_norm, mla_kv_cache: the quantized
                                   output (--q-format; NONE: dense only) */
    mlaf_gemm_scale q_scale;    /* its rounding (--q-scale) */
    int64_t q_ld;               /* its scales' leading stride */
    bbuf b[B_COUNT];
    double bytes;
} bench_op;

/* --cache-order: how the paged cache's blocks are handed to the tokens (mla_kv_cache) */
enum { CO_SHUFFLED, CO_ORDERED, CO_PAGE_LOCAL, CO_PAGE_GROUPS, CO_COUNT };
extern const char *const cache_order_names[CO_COUNT];

/* --cache and --tile-scale: the formats the bench runs and their names */
extern const char *const tile_scale_names[3];

/* ---- the calls ----------------------------------------------------------------------------- */
typedef struct views {
    mlaf_tensor latent, w_q, w_kv, q, k_nope, k_pe, pos, cos_sin, slots, cache, qh, logits, bias,
        weights, ids, kn_s, kp_s, scale, tid2eid, tok, ik, iw, ib, icache, ikd_s, iq, iqw, iqf, iqwo, rx, rres, rw, ry,
        qd, qs;
    mlaf_gemm_out rq;      /* rms_norm_quant's quantized output (format NONE: none) */
    mlaf_kv_cache_desc cd; /* the cache in its format (mla_kv_cache) */
    mlaf_indexer_k ix;     /* --indexer */
} views;

/* ---- the op registry ------------------------------------------------------------------------ */
typedef struct bench_op_def {
    mlaf_op op;
    /* why a model has nothing of this op to time, or NULL */
    const char *(*skip)(const mlaf_model_config *m, int32_t tail);
    /* skip: 1 = a model without the op gets one note line ("# OP skipped: preset NAME <why>"), and
     * --op OP naming it for that one model is an error; 0 = a skipped row per T, the why in its
     * error column */
    int skip_note;
    /* the op's part of setup(): its rotation count (bench_rotation), then its buffers and bytes */
    int (*setup)(bench_op *o, size_t llc, mlaf_rng *rng, char *err, size_t cap);
    bench_call_fn fused;   /* one call through the public API */
    bench_call_fn unfused; /* one call of the unfused chain; NULL: no baseline (same-run copy only) */
    /* after setup: whether `unfused` covers this case (NULL: always) */
    int (*has_unfused)(const struct bench_op *o);
    int (*outputs)(const bench_op *o, int *ids); /* the buffers the check compares */
    /* compares the fused outputs a with the unfused b itself (moe_gate); NULL: value by value */
    void (*compare)(bench_op *o, void *const *a, void *const *b, char *check, size_t ccap);
} bench_op_def;

extern const bench_op_def bench_split_qk_norm_def, bench_mla_kv_cache_def, bench_rope_q_def,
    bench_moe_gate_def, bench_indexer_q_def, bench_rms_norm_quant_def, bench_gemm_quant_def;

/* ---- bench_core.c ----------------------------------------------------------------------------- */
void *P(bench_op *o, int id, int set);
int buf_alloc(bench_op *o, int id, size_t bytes, int per_set, void *init, char *err, size_t cap);
void op_free(bench_op *o);
void *host_random(mlaf_rng *r, mlaf_dtype dt, size_t n, double lo, double hi);

#define NEED(ptr)                                                   \
    do {                                                            \
        if (!(ptr)) {                                               \
            snprintf(err, cap, "out of host memory at T = %lld", (long long)o->T); \
            return -1;                                              \
        }                                                           \
    } while (0)

/* The setup every op shares: dimensions, the random stream, the cache record; then def->setup. */
int setup(bench_op *o, size_t llc, char *err, size_t cap);
/* The number of input/output sets rotated on the CPU, from the bytes of one set. */
void bench_rotation(bench_op *o, size_t llc, double set_bytes);
/* The latent, w_q (with q) and w_kv inputs of split_qk_norm and mla_kv_cache. */
int bench_setup_latent(bench_op *o, mlaf_rng *rng, char *err, size_t cap);
/* positions and the cos_sin table of the ops that rotate (when o->RP > 0). */
int bench_setup_rope(bench_op *o, char *err, size_t cap);
/* --q-format on split_qk_norm / mla_kv_cache: q's e4m3 data and scales buffers for K = Q values a row
 * (o->hidden set to K for the views); *bytes: what they add to the op's minimum. */
int bench_setup_row_quant(bench_op *o, int64_t K, double *bytes, char *err, size_t cap);
/* The unfused chain's second step: the quantize pass over the dense q of set `set` into v->rq. */
int bench_row_quant_pass(bench_op *o, const views *v, int set, char *err, size_t cap);
void make_views(bench_op *o, int set, views *v);
int api_err(bench_op *o, mlaf_status st, const char *what, char *err, size_t cap);
int baseline_err(int r, const char *what, char *err, size_t cap);
void *bench_stream(const bench_op *o); /* the CUDA bench stream, NULL on the CPU */
/* Runs both once and compares; writes "ok" or what differs into check. */
int check_baseline(bench_op *o, char *check, size_t ccap, char *err, size_t cap);

/* ---- rows and output ----------------------------------------------------------------------- */
typedef struct row {
    mlaf_op op;
    char model[64];
    int64_t T;
    const char *mode; /* "stream", "graph", "wall" */
    const char *cache; /* mla_kv_cache rows under --cache: the format's name; else NULL */
    int hash;          /* moe_gate rows under --hash */
    int have_fused, have_unfused, have_scopy, have_kcopy;
    bench_stats fused, unfused, scopy; /* scopy: CUDA, a copy of the op's bytes timed alike */
    bench_stats kcopy;                 /* kcopy: CUDA stream rows, SM copy kernels of those bytes */
    double bytes, gbps, pct, speedup, pct_scopy, pct_kcopy;
    char check[128];
    char error[512];
} row;

/* --cache as given (show == 0: absent, and the output is what it was before the option). */
typedef struct cache_opt {
    int show;
    mlaf_kv_format fmt;
    mlaf_tile_scale tile_scale;
    double kv_scale;
} cache_opt;

/* ---- bench_report.c --------------------------------------------------------------------------- */
void print_json(const char *backend, const char *device, int threads, const char *model, mlaf_dtype dt,
                int cache_order, const cache_opt *co, double copy_gbps, double copy_bytes, const row *rows,
                int nrows);
void print_header(int show_cache);
void print_row(const row *r, int show_cache);
/* The closing line: rows, skipped rows, baseline checks ok, rows without a baseline, and rows that
 * failed (a check that is not ok, or an error); "# bench: N rows, M checks ok, F failed (...)". */
void print_summary(FILE *f, const row *rows, int nrows);

#endif
