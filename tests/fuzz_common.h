/*
 * fuzz_common.h — the random-call driver's harness, shared by the tests/test_fuzz_<op>.c tests:
 * random draws, guarded buffers and views, the mutations, the judges, the shared fills and checks
 * of the newer entry points (fuzz_common.c), and the driver (fuzz_main.c). Each test_fuzz_<op>.c
 * holds its op's generator and calls fuzz_main with its ops (split_qk_norm and mla_kv_cache share
 * fuzz_norm.c).
 *
 * The deterministic random-call driver over every entry point: split_qk_norm,
 * mla_kv_cache, rope_q, moe_gate, rope_q_out, indexer_q, moe_gate_hash, mla_kv_cache_dsa,
 * mla_kv_cache_fmt's fp8_v4 format, rms_norm_quant, gemm_quant, and the context, preset, name and RoPE-table
 * helpers.
 *
 * Each call is drawn from its own seed (MLAF_FUZZ_SEED, the op and the call's index), so any
 * call can be replayed alone. A call starts as a valid configuration (dtypes, dims, padded and
 * transposed strides, bases misaligned by whole elements, in-place forms, optional outputs
 * absent, T = 0, bad positions and slots, non-finite logits); most calls then get one or two
 * mutations that the header's contract makes invalid: a dtype, rank, dim or stride, a NULL
 * tensor or data pointer, an odd address, an output aliasing another tensor, a parameter out of
 * range, shapes and strides whose products do not fit in 64 bits, T >= 2^31. Every call must
 *   - return MLAF_OK or a known error with a non-empty message, and never abort (the sanitizer
 *     build runs this test);
 *   - on an error, leave every buffer and every guard byte bit-identical; a forbidden mutation
 *     must be an error (a huge shape is allowed through only when its view is empty);
 *   - on MLAF_OK, match the float64 oracle (src/ref): norm outputs within 1 unit (docs/conventions.md), RoPE
 *     values bit for bit the header's fp32 formula (separate products, one add), copies bit
 *     exact, moe_gate ids as mlaf_ref_moe_gate_check_token accepts them with weights and
 *     scores within 1e-5; error_count = its start + the bad tokens; every byte no output names
 *     unchanged; guards intact.
 * Buffers are guarded (mlaf_gbuf) on the backend. The oracle reads host copies of the initial
 * images through a job that the same validation layer makes from the same views (over a CPU
 * context), so it sees exactly what the op saw.
 *
 * The newer entry points (rope_q_out with head_norm, indexer_q, moe_gate_hash, mla_kv_cache_dsa's
 * indexer key branch, kv_rope_tail into the fp8_v4 cache) get the same mutations and the same
 * rejection checks; on success they are judged by what they wrote where (see fuzz_ropeout), and
 * a call with no mutation must succeed.
 *
 * MLAF_FUZZ_CALLS: calls per op (default 4000). MLAF_FUZZ_SEED: the base seed.
 * MLAF_FUZZ_ONLY=op:index replays one call and describes it (op: split, kv, rope, gate, ctx,
 * ropeout, idxq, hash, dsa, v4, rnq, gq).
 * MLAF_FUZZ_ONLY=op:index names an op of the test it is given to.
 * CPU always; CUDA when a device is visible.
 */
#ifndef MLAF_FUZZ_COMMON_H
#define MLAF_FUZZ_COMMON_H

#define _POSIX_C_SOURCE 200809L /* sigaction, write */
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "half.h"
#include "testlib.h"

enum { FZ_MAXB = 24, FZ_MAXT = 20, FZ_SHOW_FAILS = 6, FZ_NOPS = 12 };

/* ---- random draws ---------------------------------------------------------------------- */
static inline uint64_t U(mlaf_rng *r, uint64_t n) { return n ? mlaf_rng_u64(r) % n : 0; }
static inline int64_t RANGE(mlaf_rng *r, int64_t lo, int64_t hi) { return lo + (int64_t)U(r, (uint64_t)(hi - lo + 1)); }
static inline int CHANCE(mlaf_rng *r, double p) { return mlaf_rng_uniform(r) < p; }
static inline mlaf_dtype FLOAT_DT(mlaf_rng *r) { static const mlaf_dtype d[3] = {MLAF_F32, MLAF_F16, MLAF_BF16}; return d[U(r, 3)]; }
static inline mlaf_dtype INDEX_DT(mlaf_rng *r) { return CHANCE(r, 0.5) ? MLAF_I32 : MLAF_I64; }

#define DTM(d) (1u << (d))
#define DT_FLOATS (DTM(MLAF_F32) | DTM(MLAF_F16) | DTM(MLAF_BF16))
#define DT_INDEX (DTM(MLAF_I32) | DTM(MLAF_I64))

/* ---- buffers and views ----------------------------------------------------------------- */
typedef struct fz_buf {
    mlaf_gbuf g;
    unsigned char *init;  /* the initial image (host); the oracle reads views of it */
    unsigned char *claim; /* after the call: 1 per byte an output check owns */
    size_t bytes;
} fz_buf;

typedef struct fz_t {
    const char *name;
    int present;         /* 0: passed as NULL */
    int buf;             /* its buffer; -1: data is `fake` (NULL or an address no buffer has) */
    int64_t boff;        /* byte offset of its data in the buffer */
    uintptr_t fake;
    mlaf_tensor t;       /* dtype, rank, shape and strides; data set per side */
    unsigned dtypes;     /* the dtypes the op accepts here (a mutation picks another) */
    unsigned fixed;      /* bit i: shape[i] is fixed by the parameters or another tensor */
    int64_t max0;        /* > 0: shape[0] may be anything up to this (slot_mapping: N <= T) */
    int required, output, checked; /* checked: the op validates it (kv's rope inputs at R = 0 are not) */
    int touched;                   /* a mutation changed it: no second one, and no alias onto it */
} fz_t;

typedef struct fz {
    mlaf_backend be;
    mlaf_context *ctx, *host;
    mlaf_rng r;
    fz_buf b[FZ_MAXB];
    int nb;
    fz_t *ts[FZ_MAXT];
    int nt;
    mlaf_tensor dev[FZ_MAXT], hst[FZ_MAXT];
    fz_t seen[FZ_MAXT]; /* the views as the op got them (the op's own fz_t live on its stack) */
    int nseen;
    char mut[256];  /* the mutations applied */
    int mutated, must_fail;
    int resized; /* a fixed dim or a parameter changed: a second such change could restore the match */
    mlaf_status status; /* the op's */
    int failed;
    char why[768];
    int verbose;
} fz;


/* ---- fuzz_common.c ---------------------------------------------------------------------- */
void fail(fz *f, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void note(fz *f, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
typedef int (*param_mutator)(fz *f, void *params);
void fz_reset(fz *f, uint64_t seed);
int fz_buffer(fz *f, size_t bytes, int fill, mlaf_dtype dt, double scale);
int64_t span_elems(const mlaf_tensor *t);
int is_empty(const mlaf_tensor *t);
void fz_register(fz *f, fz_t *x);
void fz_tensor(fz *f, fz_t *x, const char *name, mlaf_dtype dt, int ndim, const int64_t *shape,
               const int64_t *stride, int fill, double scale, unsigned dtypes, unsigned fixed, int required,
               int output);
void fz_2d(fz *f, fz_t *x, const char *name, mlaf_dtype dt, int64_t rows, int64_t cols, int64_t pad, int fill,
                  double scale, unsigned dtypes, unsigned fixed, int required, int output);
void fz_1d(fz *f, fz_t *x, const char *name, mlaf_dtype dt, int64_t n, int fill, double scale, unsigned dtypes,
                  unsigned fixed, int required, int output);
void fz_columns(fz *f, fz_t *x, const char *name, const fz_t *lat, int64_t col, int64_t width, unsigned fixed);
void *host_ptr(const fz *f, const fz_t *x);
int fz_commit(fz *f);
int index_of(const fz *f, const fz_t *x);
const mlaf_tensor *DEV(fz *f, const fz_t *x);
const mlaf_tensor *HOST(fz *f, const fz_t *x);
void describe(const fz *f);
unsigned char *body(const fz *f, int buf);
void claim(fz *f, int buf, int64_t byte, size_t n);
int64_t at_byte(const fz_t *x, int64_t e);
void check_units(fz *f, const fz_t *x, int64_t e, double ref, const char *what, int64_t t, int64_t i);
void check_exact(fz *f, const fz_t *x, int64_t e, float want, const char *what, int64_t t, int64_t i);
void check_count(fz *f, const fz_t *ec, int64_t bad);
void check_untouched(fz *f);
void rope_f32(const float *x, int32_t R, mlaf_rope_style style, const float *cs, float *y);
fz_t *pick(fz *f, int (*ok)(const fz_t *));
int any_t(const fz_t *x);
int nonempty_t(const fz_t *x);
int fixed_t(const fz_t *x);
int inner_t(const fz_t *x);
int outer_t(const fz_t *x);
int rows_t(const fz_t *x);
int blocks_t(const fz_t *x);
int required_t(const fz_t *x);
int output_t(const fz_t *x);
int exact_columns(const fz_t *o, const fz_t *lat, int64_t Q, int64_t C);
int mutate_once(fz *f, param_mutator pm, void *params, const fz_t *lat, int64_t Q, int64_t C);
void mutate(fz *f, param_mutator pm, void *params, const fz_t *lat, int64_t Q, int64_t C);
void set_state(fz *f);
int judge_status(fz *f, mlaf_status st);
int64_t draw_T(mlaf_rng *r);
void set_idx(fz *f, const fz_t *x, int64_t i, int64_t v);
int64_t get_idx(const unsigned char *p, mlaf_dtype dt, int64_t e);
void claim_rows(fz *f, const fz_t *x, int64_t t0, int64_t t1);
void claim_all(fz *f, const fz_t *x);
int judge_new(fz *f, mlaf_status st);
void fill_table(fz *f, const fz_t *cs, int64_t max_pos, int32_t R);
int64_t fill_positions(fz *f, const fz_t *pos, int64_t T, int64_t max_pos);
void fill_slots(fz *f, const fz_t *slot, int64_t N, int64_t nslots);
void add_error_count(fz *f, fz_t *ec);
int64_t bad_positions(fz *f, const fz_t *pos, int64_t T, int64_t max_pos, int64_t t, int *is_bad);
int indexer_params_mutate(fz *f, mlaf_indexer_params *ip);
mlaf_indexer_params draw_ip(mlaf_rng *r);
int gate_params_mutate(fz *f, void *vp);

/* ---- fuzz_norm.c: split_qk_norm (kv = 0) and mla_kv_cache (kv = 1) ------------------------- */
int fuzz_norm(fz *f, int kv);

/* ---- fuzz_main.c: the driver ---------------------------------------------------------------- */
/* One op of a test: its index in the driver's op table (the call seeds, the MLAF_FUZZ_ONLY names)
 * and its generator; a generator returns 1 (the call succeeded), 0 (rejected) or < 0 (no buffers). */
typedef struct fuzz_entry {
    int op;
    int (*run)(fz *f);
} fuzz_entry;
int fuzz_main(const fuzz_entry *ops, int nops);

#endif
