/*
 * test_fuzz.c — a deterministic random-call driver over every entry point: split_qk_norm,
 * mla_kv_cache, rope_q, moe_gate, rope_q_out, indexer_q, moe_gate_hash, mla_kv_cache_dsa,
 * mla_kv_cache_fmt's fp8_v4 format, and the context, preset, name and RoPE-table helpers.
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
 *   - on MLAF_OK, match the float64 oracle (src/ref): norm outputs within 1 unit (SPEC §7), RoPE
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
 * ropeout, idxq, hash, dsa, v4).
 * CPU always; CUDA when a device is visible.
 */
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

enum { FZ_MAXB = 24, FZ_MAXT = 20, FZ_SHOW_FAILS = 6, FZ_NOPS = 10 };

/* ---- random draws ---------------------------------------------------------------------- */
static uint64_t U(mlaf_rng *r, uint64_t n) { return n ? mlaf_rng_u64(r) % n : 0; }
static int64_t RANGE(mlaf_rng *r, int64_t lo, int64_t hi) { return lo + (int64_t)U(r, (uint64_t)(hi - lo + 1)); }
static int CHANCE(mlaf_rng *r, double p) { return mlaf_rng_uniform(r) < p; }
static mlaf_dtype FLOAT_DT(mlaf_rng *r) { static const mlaf_dtype d[3] = {MLAF_F32, MLAF_F16, MLAF_BF16}; return d[U(r, 3)]; }
static mlaf_dtype INDEX_DT(mlaf_rng *r) { return CHANCE(r, 0.5) ? MLAF_I32 : MLAF_I64; }

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

static void fail(fz *f, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void fail(fz *f, const char *fmt, ...) {
    if (f->failed++) return; /* the first reason is the one reported */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->why, sizeof f->why, fmt, ap);
    va_end(ap);
}

static void note(fz *f, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void note(fz *f, const char *fmt, ...) {
    size_t n = strlen(f->mut);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->mut + n, sizeof f->mut - n, fmt, ap);
    va_end(ap);
}

static void fz_reset(fz *f, uint64_t seed) {
    for (int i = 0; i < f->nb; i++) {
        mlaf_gbuf_free(&f->b[i].g);
        free(f->b[i].init);
        free(f->b[i].claim);
    }
    f->nb = f->nt = f->nseen = 0;
    memset(f->b, 0, sizeof f->b);
    f->mut[0] = f->why[0] = '\0';
    f->mutated = f->must_fail = f->failed = f->resized = 0;
    mlaf_rng_seed(&f->r, seed);
}

/* fill: 0 poison (0xFF: NaN in every float dtype), 1 values N(0, scale) of dt, 2 random bytes. */
static int fz_buffer(fz *f, size_t bytes, int fill, mlaf_dtype dt, double scale) {
    fz_buf *b = &f->b[f->nb];
    b->bytes = bytes ? bytes : 8;
    b->init = (unsigned char *)malloc(b->bytes);
    b->claim = (unsigned char *)calloc(b->bytes, 1);
    if (fill == 1 && mlaf_dtype_size(dt) > 0 && dt <= MLAF_BF16) {
        size_t es = mlaf_dtype_size(dt), n = b->bytes / es;
        mlaf_fill_normal(&f->r, b->init, dt, n, 0.0, scale);
        for (size_t k = n * es; k < b->bytes; k++) b->init[k] = 0xAB;
    } else if (fill == 2) {
        for (size_t k = 0; k < b->bytes; k++) b->init[k] = (unsigned char)(mlaf_rng_u64(&f->r) >> 56);
    } else {
        memset(b->init, 0xFF, b->bytes);
    }
    return f->nb++;
}

/* Elements from the first to one past the last (0 when empty); only for the small dims the
 * generator draws. */
static int64_t span_elems(const mlaf_tensor *t) {
    int64_t last = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 0) return 0;
        last += (t->shape[i] - 1) * t->stride[i];
    }
    return last + 1;
}

static int is_empty(const mlaf_tensor *t) {
    for (int i = 0; i < t->ndim && i < MLAF_MAX_DIMS; i++)
        if (t->shape[i] == 0) return 1;
    return 0;
}

static void fz_register(fz *f, fz_t *x) { f->ts[f->nt++] = x; }

/* A tensor in a buffer of its own: misaligned by 0..2 whole elements, a little slack after it. */
static void fz_tensor(fz *f, fz_t *x, const char *name, mlaf_dtype dt, int ndim, const int64_t *shape,
                      const int64_t *stride, int fill, double scale, unsigned dtypes, unsigned fixed, int required,
                      int output) {
    memset(x, 0, sizeof *x);
    x->name = name;
    x->present = 1;
    x->t.dtype = dt;
    x->t.ndim = ndim;
    for (int i = 0; i < ndim; i++) x->t.shape[i] = shape[i], x->t.stride[i] = stride[i];
    x->dtypes = dtypes;
    x->fixed = fixed;
    x->required = required;
    x->output = output;
    x->checked = 1;
    size_t es = mlaf_dtype_size(dt);
    int64_t lead = RANGE(&f->r, 0, 2), slack = RANGE(&f->r, 0, 3);
    x->buf = fz_buffer(f, (size_t)(lead + span_elems(&x->t) + slack) * es, fill, dt, scale);
    x->boff = lead * (int64_t)es;
    fz_register(f, x);
}

static void fz_2d(fz *f, fz_t *x, const char *name, mlaf_dtype dt, int64_t rows, int64_t cols, int64_t pad, int fill,
                  double scale, unsigned dtypes, unsigned fixed, int required, int output) {
    int64_t sh[2] = {rows, cols}, st[2] = {cols + pad, 1};
    fz_tensor(f, x, name, dt, 2, sh, st, fill, scale, dtypes, fixed, required, output);
}

static void fz_1d(fz *f, fz_t *x, const char *name, mlaf_dtype dt, int64_t n, int fill, double scale, unsigned dtypes,
                  unsigned fixed, int required, int output) {
    int64_t sh[1] = {n}, st[1] = {1};
    fz_tensor(f, x, name, dt, 1, sh, st, fill, scale, dtypes, fixed, required, output);
}

/* An output given as the latent's own columns [col, col + width) (the in-place form). */
static void fz_columns(fz *f, fz_t *x, const char *name, const fz_t *lat, int64_t col, int64_t width, unsigned fixed) {
    memset(x, 0, sizeof *x);
    x->name = name;
    x->present = 1;
    x->t = lat->t;
    x->t.shape[1] = width;
    x->buf = lat->buf;
    x->boff = lat->boff + col * (int64_t)mlaf_dtype_size(lat->t.dtype);
    x->dtypes = DTM(lat->t.dtype);
    x->fixed = fixed;
    x->required = 0;
    x->output = 1;
    x->checked = 1;
    fz_register(f, x);
}

static void *host_ptr(const fz *f, const fz_t *x) { return x->buf >= 0 ? f->b[x->buf].init + x->boff : (void *)x->fake; }

/* Uploads every buffer and makes the device and host views; 0 on an allocation failure. */
static int fz_commit(fz *f) {
    for (int i = 0; i < f->nb; i++)
        if (mlaf_gbuf_alloc(&f->b[i].g, f->be, f->b[i].bytes, f->b[i].init, 0) != MLAF_OK) return 0;
    f->nseen = f->nt;
    for (int k = 0; k < f->nt; k++) {
        const fz_t *x = f->ts[k];
        f->seen[k] = *x;
        f->dev[k] = f->hst[k] = x->t;
        f->dev[k].data = x->buf >= 0 ? (void *)((char *)f->b[x->buf].g.ptr + x->boff) : (void *)x->fake;
        f->hst[k].data = host_ptr(f, x);
    }
    return 1;
}

static int index_of(const fz *f, const fz_t *x) {
    for (int k = 0; k < f->nt; k++)
        if (f->ts[k] == x) return k;
    return -1;
}
static const mlaf_tensor *DEV(fz *f, const fz_t *x) { return x->present ? &f->dev[index_of(f, x)] : NULL; }
static const mlaf_tensor *HOST(fz *f, const fz_t *x) { return x->present ? &f->hst[index_of(f, x)] : NULL; }

static void describe(const fz *f) {
    printf("  mutations:%s\n", f->mut[0] ? f->mut : " none");
    for (int k = 0; k < f->nseen; k++) {
        const fz_t *x = &f->seen[k];
        if (!x->present) {
            printf("  %s: NULL\n", x->name);
            continue;
        }
        printf("  %s: %s ndim %d shape (", x->name, mlaf_dtype_name(x->t.dtype), (int)x->t.ndim);
        for (int i = 0; i < x->t.ndim && i < MLAF_MAX_DIMS; i++) printf("%s%lld", i ? ", " : "", (long long)x->t.shape[i]);
        printf(") stride (");
        for (int i = 0; i < x->t.ndim && i < MLAF_MAX_DIMS; i++) printf("%s%lld", i ? ", " : "", (long long)x->t.stride[i]);
        if (x->buf >= 0)
            printf(") buffer %d + %lld bytes\n", x->buf, (long long)x->boff);
        else
            printf(") data %p\n", (void *)x->fake);
    }
}

/* ---- judging ----------------------------------------------------------------------------- */
static unsigned char *body(const fz *f, int buf) { return (unsigned char *)f->b[buf].g.body; }

static void claim(fz *f, int buf, int64_t byte, size_t n) {
    if (byte < 0 || (size_t)byte + n > f->b[buf].bytes) {
        fail(f, "an expected output byte %lld lies outside buffer %d", (long long)byte, buf);
        return;
    }
    memset(f->b[buf].claim + byte, 1, n);
}

/* Byte offset of element `e` (in elements from the view's start). */
static int64_t at_byte(const fz_t *x, int64_t e) { return x->boff + e * (int64_t)mlaf_dtype_size(x->t.dtype); }

/* A computed value: within 1 unit of the oracle. */
static void check_units(fz *f, const fz_t *x, int64_t e, double ref, const char *what, int64_t t, int64_t i) {
    const int64_t b = at_byte(x, e);
    claim(f, x->buf, b, mlaf_dtype_size(x->t.dtype));
    double got = mlaf_load_f32(body(f, x->buf) + b, x->t.dtype, 0);
    double u = mlaf_err_units(got, ref, x->t.dtype, fabs(ref));
    if (!(u <= 1.0))
        fail(f, "%s[%lld, %lld] = %.9g, expected %.9g (%.3g units of %s)", what, (long long)t, (long long)i, got, ref, u,
             mlaf_dtype_name(x->t.dtype));
}

/* An exactly known value (an fp32 result rounded once to the view's dtype, or a copy). */
static void check_exact(fz *f, const fz_t *x, int64_t e, float want, const char *what, int64_t t, int64_t i) {
    const int64_t b = at_byte(x, e);
    const size_t es = mlaf_dtype_size(x->t.dtype);
    claim(f, x->buf, b, es);
    unsigned char w[8];
    mlaf_store_f32(w, x->t.dtype, 0, want);
    if (memcmp(w, body(f, x->buf) + b, es) != 0)
        fail(f, "%s[%lld, %lld] = %.9g, expected %.9g bit for bit (%s)", what, (long long)t, (long long)i,
             (double)mlaf_load_f32(body(f, x->buf) + b, x->t.dtype, 0), (double)want, mlaf_dtype_name(x->t.dtype));
}

static void check_count(fz *f, const fz_t *ec, int64_t bad) {
    if (!ec->present) return;
    int32_t start, got;
    memcpy(&start, f->b[ec->buf].init + ec->boff, 4);
    memcpy(&got, body(f, ec->buf) + ec->boff, 4);
    int64_t want = (int64_t)start + bad;
    if (want > INT32_MAX) want = INT32_MAX;
    claim(f, ec->buf, ec->boff, 4);
    if (got != want) fail(f, "error_count = %d, expected %lld (%d + %lld bad tokens)", got, (long long)want, start, (long long)bad);
}

/* Every byte no check claimed equals its initial value; every guard byte is intact. */
static void check_untouched(fz *f) {
    for (int i = 0; i < f->nb; i++) {
        const fz_buf *b = &f->b[i];
        if (!mlaf_gbuf_guards_ok(&b->g)) fail(f, "a guard byte of buffer %d changed", i);
        const unsigned char *now = (const unsigned char *)b->g.body;
        for (size_t k = 0; k < b->bytes; k++)
            if (!b->claim[k] && now[k] != b->init[k]) {
                const char *who = "no view";
                for (int j = 0; j < f->nt; j++)
                    if (f->ts[j]->buf == i) who = f->ts[j]->name;
                fail(f, "byte %zu of buffer %d (%s, %s) changed: 0x%02x, was 0x%02x", k, i, who,
                     b->claim[k] ? "claimed" : "no output names it", now[k], b->init[k]);
                break;
            }
    }
}

/* The header's rotation: separate fp32 products and one add / subtract, no fused multiply-add. */
static void rope_f32(const float *x, int32_t R, mlaf_rope_style style, const float *cs, float *y) {
    const int32_t h = R / 2;
    for (int32_t i = 0; i < R; i++) y[i] = x[i];
    for (int32_t i = 0; i < h; i++) {
        const int32_t a = style == MLAF_ROPE_NEOX ? i : 2 * i, b = style == MLAF_ROPE_NEOX ? i + h : 2 * i + 1;
        const volatile float c = cs[i], s = cs[h + i];
        const volatile float p0 = x[a] * c, p1 = x[b] * s, p2 = x[b] * c, p3 = x[a] * s;
        y[a] = p0 - p1;
        y[b] = p2 + p3;
    }
}

/* ---- mutations ------------------------------------------------------------------------- */
static fz_t *pick(fz *f, int (*ok)(const fz_t *)) {
    fz_t *c[FZ_MAXT];
    int n = 0;
    for (int k = 0; k < f->nt; k++)
        if (f->ts[k]->present && f->ts[k]->checked && !f->ts[k]->touched && ok(f->ts[k])) c[n++] = f->ts[k];
    if (!n) return NULL;
    fz_t *x = c[U(&f->r, (uint64_t)n)];
    x->touched = 1;
    return x;
}
static int any_t(const fz_t *x) { (void)x; return 1; }
static int nonempty_t(const fz_t *x) { return x->buf >= 0 && !is_empty(&x->t); }
static int fixed_t(const fz_t *x) { return (x->fixed & ((1u << x->t.ndim) - 1u)) != 0; }
static int inner_t(const fz_t *x) { return x->t.shape[x->t.ndim - 1] > 1; }
static int outer_t(const fz_t *x) { return x->t.ndim >= 2; }
static int rows_t(const fz_t *x) { return x->t.ndim >= 2 && x->t.shape[x->t.ndim - 2] > 1 && x->t.shape[x->t.ndim - 1] > 0; }
static int blocks_t(const fz_t *x) { return x->t.ndim == 3 && x->t.shape[0] > 1 && x->t.shape[1] > 0 && x->t.shape[2] > 0; }
static int required_t(const fz_t *x) { return x->required; }
static int output_t(const fz_t *x) { return x->output && nonempty_t(x); }

/* Is `o` exactly the latent's columns (the in-place form the norm ops accept)? */
static int exact_columns(const fz_t *o, const fz_t *lat, int64_t Q, int64_t C) {
    if (!lat || o->buf != lat->buf || o->t.dtype != lat->t.dtype || o->t.ndim != 2 || o->t.shape[0] != lat->t.shape[0]) return 0;
    if (o->t.shape[0] > 1 && o->t.stride[0] != lat->t.stride[0]) return 0;
    int64_t d = (o->boff - lat->boff) / (int64_t)mlaf_dtype_size(lat->t.dtype);
    if ((o->boff - lat->boff) % (int64_t)mlaf_dtype_size(lat->t.dtype)) return 0;
    return d == 0 || d == Q || d == Q + C;
}

typedef int (*param_mutator)(fz *f, void *params);

/* One mutation the contract forbids (or, for a huge shape, allows only on an empty view).
 * Returns 0 when the drawn kind does not apply to this call. */
static int mutate_once(fz *f, param_mutator pm, void *params, const fz_t *lat, int64_t Q, int64_t C) {
    fz_t *x;
    int kind = (int)U(&f->r, 15);
    switch (kind) {
    case 0: { /* a dtype outside the accepted set */
        if (!(x = pick(f, any_t))) return 0;
        static const int cand[8] = {0, 1, 2, 3, 4, 5, 99, -1};
        int d;
        do d = cand[U(&f->r, 8)];
        while (d >= 0 && d < MLAF_DTYPE_COUNT_ && (x->dtypes & DTM(d)));
        x->t.dtype = (mlaf_dtype)d;
        note(f, " %s.dtype=%d", x->name, d);
        f->must_fail = 1;
        return 1;
    }
    case 1: { /* another rank */
        if (!(x = pick(f, any_t))) return 0;
        static const int cand[5] = {0, -1, 5, 1, 2};
        int nd = cand[U(&f->r, 5)];
        if (nd == x->t.ndim) nd = x->t.ndim + 1;
        if (nd > 0 && nd <= MLAF_MAX_DIMS && nd > x->t.ndim)
            for (int i = x->t.ndim; i < nd; i++) x->t.shape[i] = 1, x->t.stride[i] = 1;
        x->t.ndim = nd;
        note(f, " %s.ndim=%d", x->name, nd);
        f->must_fail = 1;
        return 1;
    }
    case 2: { /* a dim the parameters or another tensor fix */
        if (f->resized || !(x = pick(f, fixed_t))) return 0;
        f->resized = 1;
        int d;
        do d = (int)U(&f->r, (uint64_t)x->t.ndim);
        while (!(x->fixed & (1u << d)));
        int64_t v = x->t.shape[d] + (CHANCE(&f->r, 0.5) ? 1 : -1) * RANGE(&f->r, 1, 3);
        if (v < 0) v = x->t.shape[d] + 1;
        if (x->max0 && d == 0) v = x->max0 + RANGE(&f->r, 1, 3); /* only longer than max0 is wrong */
        x->t.shape[d] = v;
        note(f, " %s.shape[%d]=%lld", x->name, d, (long long)v);
        f->must_fail = 1;
        return 1;
    }
    case 3: { /* a negative extent */
        if (!(x = pick(f, any_t))) return 0;
        int d = (int)U(&f->r, (uint64_t)x->t.ndim);
        x->t.shape[d] = -RANGE(&f->r, 1, 5);
        note(f, " %s.shape[%d]=%lld", x->name, d, (long long)x->t.shape[d]);
        f->must_fail = 1;
        return 1;
    }
    case 4: { /* a row that is not contiguous */
        if (!(x = pick(f, inner_t))) return 0;
        static const int64_t cand[4] = {0, 2, -1, 3};
        x->t.stride[x->t.ndim - 1] = cand[U(&f->r, 4)];
        note(f, " %s.stride[last]=%lld", x->name, (long long)x->t.stride[x->t.ndim - 1]);
        f->must_fail = 1;
        return 1;
    }
    case 5: { /* rows closer than their width, or a negative outer stride */
        if (CHANCE(&f->r, 0.5)) {
            if (!(x = pick(f, rows_t))) return 0;
            int d = x->t.ndim - 2;
            x->t.stride[d] = (int64_t)U(&f->r, (uint64_t)x->t.shape[d + 1]);
            note(f, " %s.stride[%d]=%lld < width", x->name, d, (long long)x->t.stride[d]);
        } else {
            if (!(x = pick(f, outer_t))) return 0;
            int d = (int)U(&f->r, (uint64_t)(x->t.ndim - 1));
            x->t.stride[d] = -RANGE(&f->r, 1, 100);
            note(f, " %s.stride[%d]=%lld", x->name, d, (long long)x->t.stride[d]);
        }
        f->must_fail = 1;
        return 1;
    }
    case 6: { /* 3-D rows that collide */
        if (!(x = pick(f, blocks_t))) return 0;
        if (x->t.shape[1] > 1)
            x->t.stride[0] = x->t.stride[1];
        else
            x->t.stride[0] = x->t.shape[2] - 1;
        if (x->t.stride[0] >= x->t.stride[1] && x->t.shape[1] <= 1 && x->t.stride[0] >= x->t.shape[2]) return 0;
        note(f, " %s.stride[0]=%lld (rows collide)", x->name, (long long)x->t.stride[0]);
        f->must_fail = 1;
        return 1;
    }
    case 7: /* a required tensor absent */
        if (!(x = pick(f, required_t))) return 0;
        x->present = 0;
        note(f, " %s=NULL", x->name);
        f->must_fail = 1;
        return 1;
    case 8: /* no data behind a non-empty view */
        if (!(x = pick(f, nonempty_t))) return 0;
        x->buf = -1;
        x->fake = 0;
        note(f, " %s.data=NULL", x->name);
        f->must_fail = 1;
        return 1;
    case 9: /* an odd address, or one whose view runs past the top of the address space */
        if (!(x = pick(f, nonempty_t))) return 0;
        if (CHANCE(&f->r, 0.7)) {
            if (mlaf_dtype_size(x->t.dtype) == 1) return 0; /* bytes have no alignment to break */
            x->boff += 1;
            note(f, " %s.data+1 byte", x->name);
        } else {
            x->buf = -1;
            x->fake = UINTPTR_MAX - (mlaf_dtype_size(x->t.dtype) - 1);
            note(f, " %s.data=top of the address space", x->name);
        }
        f->must_fail = 1;
        return 1;
    case 10: { /* products of shapes and strides that do not fit */
        if (!(x = pick(f, any_t))) return 0;
        const int64_t es = (int64_t)mlaf_dtype_size(x->t.dtype) ? (int64_t)mlaf_dtype_size(x->t.dtype) : 1;
        int ndims = x->t.ndim >= 2 && CHANCE(&f->r, 0.4) ? 2 : 1;
        for (int n = 0; n < ndims; n++) {
            int d = (int)U(&f->r, (uint64_t)x->t.ndim);
            if (d == x->t.ndim - 1) {
                x->t.shape[d] = ((int64_t)1 << 62) - (int64_t)U(&f->r, 1000); /* >= 2^62 bytes */
            } else {
                int k = (int)RANGE(&f->r, 31, 62);
                int64_t n1 = ((int64_t)1 << k) - 1 + (int64_t)U(&f->r, 2);
                /* a stride that makes (n - 1) * stride * es reach 2^62 bytes */
                int64_t need = (int64_t)(ldexp(1.0, 62) / ((double)(n1 - 1) * (double)es)) + 1;
                if (need < 1) need = 1;
                int64_t s = x->t.stride[d] > need ? x->t.stride[d] : need;
                if (s <= INT64_MAX / 4) s *= RANGE(&f->r, 1, 3);
                x->t.shape[d] = n1;
                x->t.stride[d] = s;
            }
            note(f, " %s.shape[%d]=%lld,stride=%lld", x->name, d, (long long)x->t.shape[d], (long long)x->t.stride[d]);
        }
        if (x->buf >= 0 && CHANCE(&f->r, 0.4)) {
            x->buf = -1;
            x->fake = 0;
            note(f, " %s.data=NULL", x->name);
        }
        /* an empty view addresses nothing: then the call may stand */
        if (!is_empty(&x->t)) f->must_fail = 1;
        return 1;
    }
    case 11: { /* an output aliasing another tensor's element */
        fz_t *o = pick(f, output_t);
        if (!o) return 0;
        fz_t *c[FZ_MAXT];
        int n = 0;
        for (int k = 0; k < f->nt; k++)
            if (f->ts[k] != o && f->ts[k]->present && f->ts[k]->checked && !f->ts[k]->touched && nonempty_t(f->ts[k]))
                c[n++] = f->ts[k];
        if (!n) return 0;
        x = c[U(&f->r, (uint64_t)n)];
        /* an element of x (its byte), the output's first element aligned down onto it */
        int64_t e = 0, idx[MLAF_MAX_DIMS];
        for (int i = 0; i < x->t.ndim; i++) idx[i] = (int64_t)U(&f->r, (uint64_t)x->t.shape[i]), e += idx[i] * x->t.stride[i];
        int64_t byte = x->boff + e * (int64_t)mlaf_dtype_size(x->t.dtype);
        byte -= byte % (int64_t)mlaf_dtype_size(o->t.dtype);
        o->buf = x->buf;
        o->boff = byte;
        note(f, " %s aliases %s (byte %lld)", o->name, x->name, (long long)byte);
        if (!exact_columns(o, lat, Q, C)) f->must_fail = 1;
        return 1;
    }
    case 12: /* more than 2^31 tokens */
        if (!f->nt) return 0;
        x = f->ts[0]; /* the op's first tensor carries the tokens */
        if (!x->present) return 0;
        x->t.shape[0] = ((int64_t)1 << 31) + (int64_t)U(&f->r, 1000);
        note(f, " %s.shape[0]=%lld", x->name, (long long)x->t.shape[0]);
        f->must_fail = 1;
        return 1;
    default: /* a parameter out of range */
        if (f->resized || !pm || !pm(f, params)) return 0;
        f->resized = f->must_fail = 1;
        return 1;
    }
}

static void mutate(fz *f, param_mutator pm, void *params, const fz_t *lat, int64_t Q, int64_t C) {
    int want = CHANCE(&f->r, 0.38) ? 0 : (CHANCE(&f->r, 0.8) ? 1 : 2);
    for (int n = 0, tries = 0; n < want && tries < 30; tries++)
        if (mutate_once(f, pm, params, lat, Q, C)) n++, f->mutated = 1;
}

/* ---- the common frame of one op call --------------------------------------------------- */
static void set_state(fz *f) {
    /* threads and CPU path per call, so that one call replays alone exactly */
    mlaf_context_set_threads(f->ctx, (int)RANGE(&f->r, 0, 4));
    mlaf_context_set_cpu_isa(f->ctx, (mlaf_cpu_isa)RANGE(&f->r, 0, MLAF_CPU_ISA_COUNT_ - 1));
}

/* After the call: its status must be MLAF_OK or a named error; an error leaves everything as
 * it was. Returns 1 when the call succeeded and the outputs are to be judged. */
static int judge_status(fz *f, mlaf_status st) {
    f->status = st;
    mlaf_status sync = mlaf_context_sync(f->ctx);
    for (int i = 0; i < f->nb; i++)
        if (mlaf_gbuf_download(&f->b[i].g) != MLAF_OK) {
            fail(f, "download of buffer %d failed", i);
            return 0;
        }
    if (sync != MLAF_OK) fail(f, "the stream reports %s after the call: %s", mlaf_status_name(sync), mlaf_context_last_error(f->ctx));
    const char *msg = mlaf_context_last_error(f->ctx);
    if ((int)st < 0 || (int)st >= MLAF_STATUS_COUNT_) {
        fail(f, "status %d is not one of mlaf_status", (int)st);
        return 0;
    }
    if (st != MLAF_OK) {
        if (!msg || !msg[0]) fail(f, "%s with an empty message", mlaf_status_name(st));
        check_untouched(f);
        return 0;
    }
    if (f->must_fail) {
        fail(f, "accepted (MLAF_OK) a call the contract forbids:%s", f->mut);
        check_untouched(f);
        return 0;
    }
    if (msg && msg[0]) fail(f, "MLAF_OK with a message left: \"%s\"", msg);
    return 1;
}

/* ---- split_qk_norm and mla_kv_cache ----------------------------------------------------- */
typedef struct norm_case {
    int kv;
    mlaf_split_qk_norm_params sp;
    mlaf_mla_kv_cache_params kp;
} norm_case;

static int norm_params_mutate(fz *f, void *vp) {
    norm_case *n = (norm_case *)vp;
    int32_t *Q = n->kv ? &n->kp.q_lora_rank : &n->sp.q_lora_rank, *C = n->kv ? &n->kp.kv_lora_rank : &n->sp.kv_lora_rank,
            *R = n->kv ? &n->kp.rope_dim : &n->sp.rope_dim;
    float *eq = n->kv ? &n->kp.eps_q : &n->sp.eps_q, *ekv = n->kv ? &n->kp.eps_kv : &n->sp.eps_kv;
    static const float bad_eps[5] = {0.0f, -1e-6f, NAN, INFINITY, -INFINITY};
    switch (U(&f->r, 7)) {
    case 0:
        if (*Q == 0) return 0; /* eps_q is read only with a q part */
        *eq = bad_eps[U(&f->r, 5)];
        note(f, " eps_q=%g", (double)*eq);
        return 1;
    case 1: *ekv = bad_eps[U(&f->r, 5)]; note(f, " eps_kv=%g", (double)*ekv); return 1;
    case 2: *Q = CHANCE(&f->r, 0.5) ? -(int32_t)RANGE(&f->r, 1, 5) : *Q + (int32_t)RANGE(&f->r, 1, 3); note(f, " q_lora_rank=%d", *Q); return 1;
    case 3: *C = CHANCE(&f->r, 0.5) ? -(int32_t)U(&f->r, 3) : *C + (int32_t)RANGE(&f->r, 1, 3); note(f, " kv_lora_rank=%d", *C); return 1;
    case 4: *R = CHANCE(&f->r, 0.5) ? -(int32_t)RANGE(&f->r, 1, 4) : *R + (int32_t)RANGE(&f->r, 1, 3); note(f, " rope_dim=%d", *R); return 1;
    case 5: *Q = (int32_t)RANGE(&f->r, 1 << 20, INT32_MAX / 2); note(f, " q_lora_rank=%d (width > 2^20)", *Q); return 1;
    default:
        if (!n->kv) return 0;
        n->kp.style = (mlaf_rope_style)(CHANCE(&f->r, 0.5) ? -1 : RANGE(&f->r, 2, 9));
        note(f, " style=%d", (int)n->kp.style);
        return 1;
    }
}

static int64_t draw_T(mlaf_rng *r) {
    double u = mlaf_rng_uniform(r);
    return u < 0.06 ? 0 : u < 0.2 ? 1 : RANGE(r, 2, 24);
}

static int fuzz_norm(fz *f, int kv) {
    mlaf_rng *r = &f->r;
    set_state(f);
    norm_case nc;
    memset(&nc, 0, sizeof nc);
    nc.kv = kv;
    const mlaf_dtype dt = FLOAT_DT(r);
    const int64_t T = draw_T(r);
    int32_t Q = CHANCE(r, 0.25) ? 0 : (int32_t)RANGE(r, 1, 72), C = (int32_t)RANGE(r, 1, 72);
    int32_t R = kv ? (CHANCE(r, 0.15) ? 0 : 2 * (int32_t)RANGE(r, 1, 12)) : (int32_t)RANGE(r, 0, 24);
    const int32_t W = Q + C + R;
    const float eps_q = (float)pow(10.0, -RANGE(r, 1, 8)), eps_kv = (float)pow(10.0, -RANGE(r, 1, 8));
    const mlaf_rope_style style = CHANCE(r, 0.5) ? MLAF_ROPE_INTERLEAVED : MLAF_ROPE_NEOX;
    nc.sp = (mlaf_split_qk_norm_params){Q, C, R, eps_q, eps_kv};
    nc.kp = (mlaf_mla_kv_cache_params){Q, C, R, eps_q, eps_kv, style};
    const double scale = CHANCE(r, 0.2) ? (CHANCE(r, 0.5) ? 1e-3 : 60.0) : 1.0;
    const unsigned wdts = DTM(dt) | DTM(MLAF_F32);

    fz_t lat, wq, wkv, q, kn, kp, pos, cs, slot, cache, ec, wq0;
    memset(&wq, 0, sizeof wq), memset(&q, 0, sizeof q), memset(&kn, 0, sizeof kn), memset(&kp, 0, sizeof kp);
    memset(&pos, 0, sizeof pos), memset(&cs, 0, sizeof cs), memset(&slot, 0, sizeof slot), memset(&cache, 0, sizeof cache);
    memset(&ec, 0, sizeof ec);
    fz_2d(f, &lat, "latent", dt, T, W, CHANCE(r, 0.4) ? 0 : RANGE(r, 1, 9), 1, scale, DT_FLOATS, 2u | 1u, 1, 0);
    if (Q > 0) fz_1d(f, &wq, "w_q", CHANCE(r, 0.5) ? dt : MLAF_F32, Q, 1, 0.3, wdts, 1u, 1, 0);
    fz_1d(f, &wkv, "w_kv", CHANCE(r, 0.5) ? dt : MLAF_F32, C, 1, 0.3, wdts, 1u, 1, 0);
    /* outputs: own buffers (poisoned), the latent's own columns, or absent where optional */
    if (Q > 0) {
        if (CHANCE(r, 0.2)) fz_columns(f, &q, "q", &lat, 0, Q, 3u);
        else fz_2d(f, &q, "q", dt, T, Q, RANGE(r, 0, 5), 0, 1, DTM(dt), 3u, 1, 1);
        q.required = 1;
    }
    if (!kv || CHANCE(r, 0.6)) {
        if (CHANCE(r, 0.2)) fz_columns(f, &kn, "k_nope", &lat, Q, C, 3u);
        else fz_2d(f, &kn, "k_nope", dt, T, C, RANGE(r, 0, 5), 0, 1, DTM(dt), 3u, !kv, 1);
        kn.required = !kv;
    }
    if (CHANCE(r, 0.6)) {
        if (CHANCE(r, 0.2)) fz_columns(f, &kp, "k_pe", &lat, (int64_t)Q + C, R, 3u);
        else fz_2d(f, &kp, "k_pe", dt, T, R, RANGE(r, 0, 5), 0, 1, DTM(dt), 3u, 0, 1);
    }
    int64_t max_pos = 0, nb = 0, bs = 0, nslots = 0;
    if (kv) {
        max_pos = RANGE(r, 1, 40);
        if (R > 0 || CHANCE(r, 0.5)) {
            const int64_t Rt = R > 0 ? R : 2;
            fz_1d(f, &pos, "positions", INDEX_DT(r), T, 0, 0, DT_INDEX, 1u, R > 0, 0);
            fz_2d(f, &cs, "cos_sin", MLAF_F32, max_pos, Rt, RANGE(r, 0, 4), 1, 1.0, DTM(MLAF_F32), 2u, R > 0, 0);
            pos.checked = cs.checked = R > 0; /* not read without a rope part */
            if (R > 0 && CHANCE(r, 0.7)) { /* a real table in the view (any table is accepted) */
                float *tab = (float *)malloc(sizeof(float) * (size_t)(max_pos * R));
                mlaf_rope_table_init(tab, max_pos, R, CHANCE(r, 0.5) ? 10000.0 : 500.0);
                for (int64_t p = 0; p < max_pos; p++)
                    memcpy(f->b[cs.buf].init + cs.boff + p * cs.t.stride[0] * 4, tab + p * R, sizeof(float) * (size_t)R);
                free(tab);
            }
        }
        nb = CHANCE(r, 0.05) ? 0 : RANGE(r, 1, 5);
        bs = RANGE(r, 1, 5);
        nslots = nb * bs;
        const int64_t w = (int64_t)C + R;
        if (CHANCE(r, 0.2) && nb > 1) { /* tokens of a block apart: s1 > s0 */
            int64_t s0 = w + RANGE(r, 0, 4), s1 = nb * s0 + RANGE(r, 0, 4);
            int64_t sh[3] = {nb, bs, w}, st[3] = {s0, s1, 1};
            fz_tensor(f, &cache, "kv_cache", FLOAT_DT(r), 3, sh, st, 1, 1.0, DT_FLOATS, 4u, 1, 1);
        } else {
            int64_t s1 = w + (CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 4)), s0 = bs * s1 + (CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 7));
            int64_t sh[3] = {nb, bs, w}, st[3] = {s0, s1, 1};
            fz_tensor(f, &cache, "kv_cache", FLOAT_DT(r), 3, sh, st, 1, 1.0, DT_FLOATS, 4u, 1, 1);
        }
        /* N <= T entries: the rows past them take slot -1 */
        const int64_t N = CHANCE(r, 0.2) && T > 0 ? T - RANGE(r, 0, T < 3 ? T : 3) : T;
        fz_1d(f, &slot, "slot_mapping", INDEX_DT(r), N, 0, 0, DT_INDEX, 1u, 1, 0);
        slot.max0 = T;
        if (CHANCE(r, 0.7)) {
            fz_1d(f, &ec, "error_count", MLAF_I32, 1, 0, 0, DTM(MLAF_I32), 1u, 0, 1);
            int32_t start = (int32_t)U(r, 1000);
            memcpy(f->b[ec.buf].init + ec.boff, &start, 4);
        }
        /* positions: some outside the table; slots: distinct, some negative, some past the cache */
        int64_t *perm = (int64_t *)malloc(sizeof(int64_t) * (size_t)(nslots + 1));
        for (int64_t s = 0; s < nslots; s++) perm[s] = s;
        for (int64_t s = nslots - 1; s > 0; s--) {
            int64_t j = (int64_t)U(r, (uint64_t)(s + 1)), tmp = perm[s];
            perm[s] = perm[j], perm[j] = tmp;
        }
        int64_t next = 0;
        for (int64_t t = 0; t < T; t++) {
            if (pos.present) {
                int64_t p = CHANCE(r, 0.1) ? (CHANCE(r, 0.5) ? -RANGE(r, 1, 3) : max_pos + (int64_t)U(r, 3)) : (int64_t)U(r, (uint64_t)max_pos);
                if (pos.t.dtype == MLAF_I32) { int32_t v = (int32_t)p; memcpy(f->b[pos.buf].init + pos.boff + 4 * t, &v, 4); }
                else memcpy(f->b[pos.buf].init + pos.boff + 8 * t, &p, 8);
            }
            double u = mlaf_rng_uniform(r);
            int64_t s = u < 0.12 ? -RANGE(r, 1, 1000) : u < 0.2 ? nslots + (int64_t)U(r, 4) : (next < nslots ? perm[next++] : -1);
            if (u >= 0.12 && u < 0.2 && slot.t.dtype == MLAF_I64 && CHANCE(r, 0.3)) s = ((int64_t)1 << 40) + (int64_t)U(r, 9);
            if (t >= N) continue;
            if (slot.t.dtype == MLAF_I32) { int32_t v = (int32_t)s; memcpy(f->b[slot.buf].init + slot.boff + 4 * t, &v, 4); }
            else memcpy(f->b[slot.buf].init + slot.boff + 8 * t, &s, 8);
        }
        free(perm);
    }
    memset(&wq0, 0, sizeof wq0);
    if (Q == 0 && CHANCE(r, 0.08)) { /* w_q or q given without a q part: rejected */
        fz_1d(f, &wq0, CHANCE(r, 0.5) ? "w_q" : "q", dt, 4, 1, 1.0, 0, 0, 0, 0);
        note(f, " %s given with q_lora_rank = 0", wq0.name);
        f->must_fail = f->mutated = 1;
    }
    mutate(f, norm_params_mutate, &nc, &lat, Q, C);
    if (!fz_commit(f)) return -1;

    const fz_t *wq_arg = Q > 0 ? &wq : (wq0.present && !strcmp(wq0.name, "w_q") ? &wq0 : NULL);
    const fz_t *q_arg = Q > 0 ? &q : (wq0.present && !strcmp(wq0.name, "q") ? &wq0 : NULL);
    mlaf_status st;
    if (!kv)
        st = mlaf_split_qk_norm(f->ctx, &nc.sp, DEV(f, &lat), wq_arg ? DEV(f, wq_arg) : NULL, DEV(f, &wkv),
                                q_arg ? DEV(f, q_arg) : NULL, DEV(f, &kn), DEV(f, &kp));
    else
        st = mlaf_mla_kv_cache(f->ctx, &nc.kp, DEV(f, &lat), wq_arg ? DEV(f, wq_arg) : NULL, DEV(f, &wkv), DEV(f, &pos),
                               DEV(f, &cs), DEV(f, &slot), DEV(f, &cache), q_arg ? DEV(f, q_arg) : NULL, DEV(f, &kn),
                               DEV(f, &kp), DEV(f, &ec));
    if (!judge_status(f, st)) return st == MLAF_OK;

    /* The oracle over the host images, through a job validated from the same views. */
    mlaf_norm_job nj;
    mlaf_kv_cache_job kj;
    const mlaf_kv_cache_desc hcd = mlaf_kv_desc_plain(HOST(f, &cache));
    mlaf_status hs = !kv ? mlaf_check_split_qk_norm(f->host, &nc.sp, HOST(f, &lat), wq_arg ? HOST(f, wq_arg) : NULL, HOST(f, &wkv),
                                                     q_arg ? HOST(f, q_arg) : NULL, HOST(f, &kn), HOST(f, &kp), &nj)
                         : mlaf_check_mla_kv_cache(f->host, &nc.kp, HOST(f, &lat), wq_arg ? HOST(f, wq_arg) : NULL, HOST(f, &wkv),
                                                   HOST(f, &pos), HOST(f, &cs), HOST(f, &slot), &hcd,
                                                   q_arg ? HOST(f, q_arg) : NULL, HOST(f, &kn), HOST(f, &kp), HOST(f, &ec), &kj);
    if (hs != MLAF_OK) {
        fail(f, "the device call passed but the same views over host memory gave %s: %s", mlaf_status_name(hs),
             mlaf_context_last_error(f->host));
        return 1;
    }
    if (kv) nj = kj.norm;
    const int64_t TT = nj.T;
    double *rq = (double *)malloc(sizeof(double) * (size_t)(TT * nj.Q + 1));
    double *rk = (double *)malloc(sizeof(double) * (size_t)(TT * nj.C + 1));
    double *rows = (double *)malloc(sizeof(double) * (size_t)(TT * ((int64_t)nj.C + nj.R) + 1));
    int8_t *status = (int8_t *)malloc((size_t)TT + 1);
    if (!kv)
        mlaf_ref_split_qk_norm(&nj, rq, rk, NULL);
    else
        mlaf_ref_mla_kv_cache(&kj, rq, rk, NULL, rows, status);
    const size_t les = mlaf_dtype_size(nj.dt);
    int64_t bad = 0;
    float xin[64], xr[64];
    for (int64_t t = 0; t < TT && !f->failed; t++) {
        const unsigned char *row = (const unsigned char *)nj.latent + t * nj.latent_stride * (int64_t)les;
        for (int32_t i = 0; i < nj.Q; i++) check_units(f, &q, t * q.t.stride[0] + i, rq[t * nj.Q + i], "q", t, i);
        if (kn.present)
            for (int32_t i = 0; i < nj.C; i++) check_units(f, &kn, t * kn.t.stride[0] + i, rk[t * nj.C + i], "k_nope", t, i);
        for (int32_t i = 0; i < nj.R; i++) xin[i] = mlaf_load_f32(row, nj.dt, (int64_t)nj.Q + nj.C + i);
        if (!kv) {
            if (kp.present)
                for (int32_t i = 0; i < nj.R; i++) check_exact(f, &kp, t * kp.t.stride[0] + i, xin[i], "k_pe", t, i);
            continue;
        }
        /* mla_kv_cache: a bad token (slot past the cache, position outside the table) writes no
         * cache row and no k_pe row; a negative slot skips the cache only. */
        if (status[t] < 0) {
            bad++;
            continue;
        }
        if (nj.R > 0) {
            int64_t p = mlaf_load_index(kj.rope.positions, kj.rope.pos_dt, t);
            rope_f32(xin, nj.R, kj.rope.style, kj.rope.cos_sin + p * kj.rope.cos_sin_stride, xr);
        }
        if (kp.present)
            for (int32_t i = 0; i < nj.R; i++) check_exact(f, &kp, t * kp.t.stride[0] + i, xr[i], "k_pe", t, i);
        if (status[t] == 1) {
            const int64_t s = mlaf_load_index(kj.slots, kj.slot_dt, t), blk = s / kj.block_size, off = s % kj.block_size;
            const int64_t e0 = blk * kj.cache_s0 + off * kj.cache_s1;
            for (int32_t i = 0; i < nj.C; i++) check_units(f, &cache, e0 + i, rows[t * ((int64_t)nj.C + nj.R) + i], "kv_cache", s, i);
            for (int32_t i = 0; i < nj.R; i++) check_exact(f, &cache, e0 + nj.C + i, xr[i], "kv_cache", s, nj.C + i);
        }
    }
    if (kv) check_count(f, &ec, bad);
    check_untouched(f);
    free(rq), free(rk), free(rows), free(status);
    return 1;
}

/* ---- rope_q ------------------------------------------------------------------------------ */
typedef struct rope_case {
    mlaf_rope_params p;
} rope_case;

static int rope_params_mutate(fz *f, void *vp) {
    rope_case *c = (rope_case *)vp;
    switch (U(&f->r, 3)) {
    case 0: c->p.rope_dim = CHANCE(&f->r, 0.5) ? -2 * (int32_t)U(&f->r, 3) : c->p.rope_dim + 1; break;
    case 1: c->p.rope_dim += 2 * (int32_t)RANGE(&f->r, 1, 3); break;
    default: c->p.style = (mlaf_rope_style)(CHANCE(&f->r, 0.5) ? -1 : RANGE(&f->r, 2, 9)); break;
    }
    note(f, " rope_dim=%d style=%d", c->p.rope_dim, (int)c->p.style);
    return 1;
}

static int fuzz_rope(fz *f) {
    mlaf_rng *r = &f->r;
    set_state(f);
    rope_case rc;
    const int32_t R = 2 * (int32_t)RANGE(r, 1, 16), nope = CHANCE(r, 0.2) ? 0 : (int32_t)RANGE(r, 1, 40), D = nope + R;
    rc.p = (mlaf_rope_params){R, CHANCE(r, 0.5) ? MLAF_ROPE_INTERLEAVED : MLAF_ROPE_NEOX};
    const int64_t T = draw_T(r), H = CHANCE(r, 0.04) ? 0 : RANGE(r, 1, 6), max_pos = RANGE(r, 1, 40);
    const mlaf_dtype dt = FLOAT_DT(r);
    fz_t q, pos, cs, ec;
    memset(&ec, 0, sizeof ec);
    if (CHANCE(r, 0.25) && T > 1) { /* heads outermost: [H, T] storage */
        int64_t s0 = D + RANGE(r, 0, 4), s1 = T * s0 + RANGE(r, 0, 4), sh[3] = {T, H, D}, st[3] = {s0, s1, 1};
        fz_tensor(f, &q, "q", dt, 3, sh, st, 1, CHANCE(r, 0.2) ? 50.0 : 1.0, DT_FLOATS, 1u, 1, 1);
    } else {
        int64_t s1 = D + (CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 4)), s0 = H * s1 + (CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 9));
        int64_t sh[3] = {T, H, D}, st[3] = {s0, s1, 1};
        fz_tensor(f, &q, "q", dt, 3, sh, st, 1, CHANCE(r, 0.2) ? 50.0 : 1.0, DT_FLOATS, 1u, 1, 1);
    }
    fz_1d(f, &pos, "positions", INDEX_DT(r), T, 0, 0, DT_INDEX, 1u, 1, 0);
    fz_2d(f, &cs, "cos_sin", MLAF_F32, max_pos, R, RANGE(r, 0, 4), 1, 1.0, DTM(MLAF_F32), 2u, 1, 0);
    if (CHANCE(r, 0.7)) {
        float *tab = (float *)malloc(sizeof(float) * (size_t)(max_pos * R));
        mlaf_rope_table_init(tab, max_pos, R, 10000.0);
        for (int64_t p = 0; p < max_pos; p++)
            memcpy(f->b[cs.buf].init + cs.boff + p * cs.t.stride[0] * 4, tab + p * R, sizeof(float) * (size_t)R);
        free(tab);
    }
    if (CHANCE(r, 0.7)) {
        fz_1d(f, &ec, "error_count", MLAF_I32, 1, 0, 0, DTM(MLAF_I32), 1u, 0, 1);
        int32_t start = (int32_t)U(r, 1000);
        memcpy(f->b[ec.buf].init + ec.boff, &start, 4);
    }
    for (int64_t t = 0; t < T; t++) {
        int64_t p = CHANCE(r, 0.1) ? (CHANCE(r, 0.5) ? -RANGE(r, 1, 3) : max_pos + (int64_t)U(r, 3)) : (int64_t)U(r, (uint64_t)max_pos);
        if (pos.t.dtype == MLAF_I32) { int32_t v = (int32_t)p; memcpy(f->b[pos.buf].init + pos.boff + 4 * t, &v, 4); }
        else memcpy(f->b[pos.buf].init + pos.boff + 8 * t, &p, 8);
    }
    /* The head dim must hold the rope part: a narrower one is a forbidden mutation here. */
    if (CHANCE(r, 0.03)) {
        q.t.shape[2] = R - 1 - (int64_t)U(r, (uint64_t)R);
        note(f, " q.shape[2]=%lld < rope_dim", (long long)q.t.shape[2]);
        f->must_fail = f->mutated = 1;
    }
    mutate(f, rope_params_mutate, &rc, NULL, 0, 0);
    if (!fz_commit(f)) return -1;
    mlaf_status st = mlaf_rope_q(f->ctx, &rc.p, DEV(f, &q), DEV(f, &pos), DEV(f, &cs), DEV(f, &ec));
    if (!judge_status(f, st)) return st == MLAF_OK;
    mlaf_rope_q_job j;
    mlaf_status hs = mlaf_check_rope_q(f->host, &rc.p, HOST(f, &q), HOST(f, &pos), HOST(f, &cs), HOST(f, &ec), &j);
    if (hs != MLAF_OK) {
        fail(f, "the device call passed but the same views over host memory gave %s: %s", mlaf_status_name(hs),
             mlaf_context_last_error(f->host));
        return 1;
    }
    int64_t bad = 0;
    float xin[64], xr[64];
    const size_t es = mlaf_dtype_size(j.dt);
    for (int64_t t = 0; t < j.T && j.H > 0 && !f->failed; t++) { /* H = 0: a no-op (header) */
        int64_t p = mlaf_load_index(j.rope.positions, j.rope.pos_dt, t);
        if (p < 0 || p >= j.rope.max_pos) {
            bad++; /* left unrotated: unclaimed, so it must be unchanged */
            continue;
        }
        for (int64_t h = 0; h < j.H; h++) {
            const unsigned char *head = (const unsigned char *)j.q + (t * j.s0 + h * j.s1) * (int64_t)es;
            for (int32_t i = 0; i < j.rope.R; i++) xin[i] = mlaf_load_f32(head, j.dt, j.D - j.rope.R + i);
            rope_f32(xin, j.rope.R, j.rope.style, j.rope.cos_sin + p * j.rope.cos_sin_stride, xr);
            for (int32_t i = 0; i < j.rope.R; i++)
                check_exact(f, &q, t * j.s0 + h * j.s1 + j.D - j.rope.R + i, xr[i], "q", t, h * j.D + j.D - j.rope.R + i);
        }
    }
    check_count(f, &ec, bad);
    check_untouched(f);
    return 1;
}

/* ---- moe_gate ------------------------------------------------------------------------------ */
static int gate_params_mutate(fz *f, void *vp) {
    mlaf_moe_gate_params *p = (mlaf_moe_gate_params *)vp;
    mlaf_rng *r = &f->r;
    switch (U(r, 10)) {
    case 0: p->n_group = CHANCE(r, 0.5) ? (int32_t)-U(r, 2) : (int32_t)RANGE(r, 65, 200); note(f, " n_group=%d", p->n_group); return 1;
    case 1: p->topk_group = CHANCE(r, 0.5) ? (int32_t)-U(r, 2) : p->n_group + (int32_t)RANGE(r, 1, 3); note(f, " topk_group=%d", p->topk_group); return 1;
    case 2: p->top_k = CHANCE(r, 0.5) ? (int32_t)-U(r, 2) : (int32_t)RANGE(r, 65, 100); note(f, " top_k=%d", p->top_k); return 1;
    case 3: p->n_shared_experts = CHANCE(r, 0.5) ? -(int32_t)RANGE(r, 1, 3) : (int32_t)RANGE(r, 65, 99); note(f, " n_shared_experts=%d", p->n_shared_experts); return 1;
    case 4: {
        static const float v[5] = {0.0f, -1.0f, NAN, INFINITY, -INFINITY};
        p->routed_scaling_factor = v[U(r, 5)];
        note(f, " routed_scaling_factor=%g", (double)p->routed_scaling_factor);
        return 1;
    }
    case 5: {
        static const float v[4] = {-1e-20f, NAN, INFINITY, -1.0f};
        p->eps = v[U(r, 4)];
        note(f, " eps=%g", (double)p->eps);
        return 1;
    }
    case 6: p->score_func = (mlaf_score_func)(CHANCE(r, 0.5) ? -1 : RANGE(r, 3, 6)); note(f, " score_func=%d", (int)p->score_func); return 1;
    case 7: p->group_score = (mlaf_group_score)(CHANCE(r, 0.5) ? -1 : RANGE(r, 2, 5)); note(f, " group_score=%d", (int)p->group_score); return 1;
    default: return 0;
    }
}

static int fuzz_gate(fz *f) {
    mlaf_rng *r = &f->r;
    set_state(f);
    static const int32_t bigE[6] = {64, 128, 160, 256, 384, 2048};
    const int32_t E = CHANCE(r, 0.7) ? (int32_t)RANGE(r, 1, 72) : bigE[U(r, 6)];
    const int64_t T = E >= 1024 ? RANGE(r, 0, 6) : draw_T(r);
    mlaf_moe_gate_params p;
    memset(&p, 0, sizeof p);
    int32_t div[64], nd = 0;
    for (int32_t g = 1; g <= 64 && g <= E; g++)
        if (E % g == 0) div[nd++] = g;
    p.n_group = CHANCE(r, 0.35) ? 1 : div[U(r, (uint64_t)nd)];
    const int32_t per = E / p.n_group;
    p.group_score = (p.n_group > 1 && per < 2) || CHANCE(r, 0.4) ? MLAF_GROUP_MAX : MLAF_GROUP_TOP2_SUM;
    p.topk_group = (int32_t)RANGE(r, 1, p.n_group);
    int32_t kmax = E < 64 ? E : 64;
    if (kmax > p.topk_group * per) kmax = p.topk_group * per;
    p.top_k = (int32_t)RANGE(r, 1, kmax);
    p.score_func = (mlaf_score_func)U(r, 3); /* sigmoid, softmax, sqrt_softplus */
    p.renormalize = CHANCE(r, 0.6);
    p.apply_routed_scaling = CHANCE(r, 0.5);
    p.routed_scaling_factor = (float)(0.5 + 2.5 * mlaf_rng_uniform(r));
    p.eps = CHANCE(r, 0.6) ? 1e-20f : (CHANCE(r, 0.5) ? 0.0f : 1e-6f);
    p.n_shared_experts = CHANCE(r, 0.6) ? 0 : (int32_t)RANGE(r, 1, 4);
    const int32_t K = p.top_k + p.n_shared_experts;
    const mlaf_dtype dt = FLOAT_DT(r);
    fz_t lg, bias, w, ids, sc;
    memset(&bias, 0, sizeof bias), memset(&sc, 0, sizeof sc);
    fz_2d(f, &lg, "logits", dt, T, E, CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 9), 1, 2.0, DT_FLOATS, 1u, 1, 0);
    if (CHANCE(r, 0.5)) fz_1d(f, &bias, "bias", MLAF_F32, E, 1, 0.5, DTM(MLAF_F32), 1u, 0, 0);
    fz_2d(f, &w, "weights", CHANCE(r, 0.5) ? MLAF_F32 : dt, T, K, RANGE(r, 0, 3), 0, 1, DTM(MLAF_F32) | DTM(dt), 3u, 1, 1);
    fz_2d(f, &ids, "ids", MLAF_I32, T, K, RANGE(r, 0, 3), 0, 1, DTM(MLAF_I32), 3u, 1, 1);
    if (CHANCE(r, 0.4)) fz_2d(f, &sc, "scores", MLAF_F32, T, E, RANGE(r, 0, 3), 0, 1, DTM(MLAF_F32), 3u, 0, 1);
    if (bias.present || sc.present) lg.fixed |= 2u; /* E is then fixed by them */
    /* non-finite logits and bias entries in some rows */
    static const float nf[3] = {NAN, INFINITY, -INFINITY};
    for (int64_t t = 0; t < T; t++)
        if (CHANCE(r, 0.08))
            for (int32_t k = (int32_t)RANGE(r, 1, E < 4 ? E : 4); k > 0; k--) {
                int64_t e = (int64_t)U(r, (uint64_t)E);
                mlaf_store_f32(f->b[lg.buf].init + lg.boff, dt, t * lg.t.stride[0] + e, nf[U(r, 3)]);
            }
    if (bias.present && CHANCE(r, 0.1)) ((float *)(f->b[bias.buf].init + bias.boff))[U(r, (uint64_t)E)] = nf[U(r, 3)];
    mutate(f, gate_params_mutate, &p, NULL, 0, 0);
    if (!fz_commit(f)) return -1;
    mlaf_status st = mlaf_moe_gate(f->ctx, &p, DEV(f, &lg), DEV(f, &bias), DEV(f, &w), DEV(f, &ids), DEV(f, &sc));
    if (!judge_status(f, st)) return st == MLAF_OK;
    mlaf_moe_gate_job j;
    mlaf_status hs = mlaf_check_moe_gate(f->host, &p, HOST(f, &lg), HOST(f, &bias), HOST(f, &w), HOST(f, &ids), HOST(f, &sc), &j);
    if (hs != MLAF_OK) {
        fail(f, "the device call passed but the same views over host memory gave %s: %s", mlaf_status_name(hs),
             mlaf_context_last_error(f->host));
        return 1;
    }
    const int64_t TT = j.T;
    double *rw = (double *)malloc(sizeof(double) * (size_t)(TT * j.K + 1));
    int32_t *rid = (int32_t *)malloc(sizeof(int32_t) * (size_t)(TT * j.K + 1));
    double *sel = (double *)malloc(sizeof(double) * (size_t)(TT * (j.top_k + 1) + 1));
    double *rs = (double *)malloc(sizeof(double) * (size_t)(TT * j.E + 1));
    mlaf_ref_moe_gate(&j, rw, rid, sel, rs);
    char why[300];
    for (int64_t t = 0; t < TT && !f->failed; t++) {
        int32_t got[128];
        const unsigned char *irow = body(f, ids.buf) + at_byte(&ids, t * ids.t.stride[0]);
        memcpy(got, irow, sizeof(int32_t) * (size_t)j.K);
        claim(f, ids.buf, at_byte(&ids, t * ids.t.stride[0]), 4 * (size_t)j.K);
        const char *bad = mlaf_ref_moe_gate_check_token(&j, t, got, why, sizeof why);
        if (bad) {
            fail(f, "token %lld: %s", (long long)t, bad);
            break;
        }
        for (int32_t s = 0; s < j.n_shared; s++)
            if (got[j.top_k + s] != j.E + s) fail(f, "token %lld: ids[%d] = %d, expected shared expert %d", (long long)t, j.top_k + s, got[j.top_k + s], j.E + s);
        /* Weights against the oracle's where the ids are the oracle's (near-ties may swap ids;
         * then only their range is checked). */
        int same = !memcmp(got, rid + t * j.K, sizeof(int32_t) * (size_t)j.K);
        double rowmag = 0;
        for (int32_t k = 0; k < j.K; k++) rowmag += fabs(rw[t * j.K + k]);
        for (int32_t k = 0; k < j.K; k++) {
            const int64_t b = at_byte(&w, t * w.t.stride[0] + k);
            claim(f, w.buf, b, mlaf_dtype_size(w.t.dtype));
            double g = mlaf_load_f32(body(f, w.buf) + b, w.t.dtype, 0), e = rw[t * j.K + k];
            if (!same) {
                if (!(g >= 0 && isfinite(g))) fail(f, "token %lld: weights[%d] = %g (ids differ from the oracle's by a near-tie)", (long long)t, k, g);
                continue;
            }
            double u = mlaf_err_units(g, e, w.t.dtype, e), ua = fabs(g - e) / (1e-5 * fmax(rowmag, 1e-30));
            if (ua < u) u = ua;
            if (!(u <= 1.0)) fail(f, "token %lld: weights[%d] = %.9g, expected %.9g (id %d)", (long long)t, k, g, e, got[k]);
        }
        if (sc.present)
            for (int32_t e = 0; e < j.E; e++) {
                const int64_t b = at_byte(&sc, t * sc.t.stride[0] + e);
                claim(f, sc.buf, b, 4);
                double g = mlaf_load_f32(body(f, sc.buf) + b, MLAF_F32, 0), ref = rs[t * j.E + e];
                double u = mlaf_err_units(g, ref, MLAF_F32, ref), ua = fabs(g - ref) / 1e-5;
                if (!isnan(ua) && ua < u) u = ua;
                if (!(u <= 1.0)) fail(f, "token %lld: scores[%d] = %.9g, expected %.9g", (long long)t, e, g, ref);
            }
    }
    check_untouched(f);
    free(rw), free(rid), free(sel), free(rs);
    return 1;
}

/* ---- the newer entry points: rope_q_out / head_norm, indexer_q, moe_gate_hash, the DSA key
 * branch of mla_kv_cache_dsa, and kv_rope_tail into the fp8_v4 cache ------------------------
 * These judge a success by where it wrote, not by its values (test_indexer, test_v4_attn,
 * test_moe_gate_hash and test_rope_q_out hold the value oracles): every byte outside the views
 * the op may write stays as it was, the guards hold, the rows of a token the header says is not
 * written stay as they were, error_count is its start + the bad tokens where the header defines
 * it, rope_q_out's padding heads are +0.0 and moe_gate_hash's ids are the table's (or 0 .. k-1
 * for a bad row). A valid call (no mutation) must succeed. */
static void set_idx(fz *f, const fz_t *x, int64_t i, int64_t v) {
    unsigned char *p = f->b[x->buf].init + x->boff;
    if (x->t.dtype == MLAF_I32) {
        int32_t w = (int32_t)v;
        memcpy(p + 4 * i * x->t.stride[0], &w, 4);
    } else {
        memcpy(p + 8 * i * x->t.stride[0], &v, 8);
    }
}
static int64_t get_idx(const unsigned char *p, mlaf_dtype dt, int64_t e) {
    if (dt == MLAF_I32) {
        int32_t w;
        memcpy(&w, p + 4 * e, 4);
        return w;
    }
    int64_t w;
    memcpy(&w, p + 8 * e, 8);
    return w;
}

/* Claims every element of x whose first index is in [t0, t1) (the whole view: 0, shape[0]). */
static void claim_rows(fz *f, const fz_t *x, int64_t t0, int64_t t1) {
    if (!x->present || x->buf < 0 || is_empty(&x->t)) return;
    const int64_t es = (int64_t)mlaf_dtype_size(x->t.dtype);
    const int64_t n1 = x->t.ndim > 1 ? x->t.shape[1] : 1, n2 = x->t.ndim > 2 ? x->t.shape[2] : 1;
    const int64_t s1 = x->t.ndim > 1 ? x->t.stride[1] : 0;
    for (int64_t a = t0; a < t1; a++)
        for (int64_t b = 0; b < n1; b++) {
            if (x->t.ndim == 3)
                claim(f, x->buf, x->boff + (a * x->t.stride[0] + b * s1) * es, (size_t)(n2 * es));
            else if (x->t.ndim == 2)
                claim(f, x->buf, x->boff + a * x->t.stride[0] * es, (size_t)(n1 * es)), b = n1;
            else
                claim(f, x->buf, x->boff + a * es, (size_t)es), b = n1;
        }
}
static void claim_all(fz *f, const fz_t *x) { claim_rows(f, x, 0, x->present && x->t.ndim ? x->t.shape[0] : 0); }

/* A valid call must succeed; the status frame of judge_status otherwise. */
static int judge_new(fz *f, mlaf_status st) {
    if (st != MLAF_OK && !f->mutated)
        fail(f, "a valid call was rejected: %s: %s", mlaf_status_name(st), mlaf_context_last_error(f->ctx));
    return judge_status(f, st);
}

static void fill_table(fz *f, const fz_t *cs, int64_t max_pos, int32_t R) {
    float *tab = (float *)malloc(sizeof(float) * (size_t)(max_pos * R));
    mlaf_rope_table_init(tab, max_pos, R, 10000.0);
    for (int64_t p = 0; p < max_pos; p++)
        memcpy(f->b[cs->buf].init + cs->boff + p * cs->t.stride[0] * 4, tab + p * R, sizeof(float) * (size_t)R);
    free(tab);
}

/* positions: ~10% outside [0, max_pos); returns the count of bad ones among the first T. */
static int64_t fill_positions(fz *f, const fz_t *pos, int64_t T, int64_t max_pos) {
    int64_t bad = 0;
    for (int64_t t = 0; t < T; t++) {
        int64_t p = CHANCE(&f->r, 0.1) ? (CHANCE(&f->r, 0.5) ? -RANGE(&f->r, 1, 3) : max_pos + (int64_t)U(&f->r, 3))
                                       : (int64_t)U(&f->r, (uint64_t)max_pos);
        bad += p < 0 || p >= max_pos;
        set_idx(f, pos, t, p);
    }
    return bad;
}
static void fill_slots(fz *f, const fz_t *slot, int64_t N, int64_t nslots) {
    int64_t next = (int64_t)U(&f->r, 3);
    for (int64_t t = 0; t < N; t++) {
        double u = mlaf_rng_uniform(&f->r);
        int64_t s = u < 0.15 ? -RANGE(&f->r, 1, 4) : u < 0.25 ? nslots + (int64_t)U(&f->r, 4) : (next < nslots ? next++ : -1);
        set_idx(f, slot, t, s);
    }
}
static void add_error_count(fz *f, fz_t *ec) {
    fz_1d(f, ec, "error_count", MLAF_I32, 1, 0, 0, DTM(MLAF_I32), 1u, 0, 1);
    int32_t start = (int32_t)U(&f->r, 1000);
    memcpy(f->b[ec->buf].init + ec->boff, &start, 4);
}
static int64_t bad_positions(fz *f, const fz_t *pos, int64_t T, int64_t max_pos, int64_t t, int *is_bad) {
    (void)T;
    int64_t p = get_idx(f->b[pos->buf].init + pos->boff, pos->t.dtype, t * pos->t.stride[0]);
    *is_bad = p < 0 || p >= max_pos;
    return p;
}

/* -- rope_q_out and rope_q's head_norm -- */
typedef struct ropeout_case {
    mlaf_rope_params p;
} ropeout_case;

static int ropeout_params_mutate(fz *f, void *vp) {
    ropeout_case *c = (ropeout_case *)vp;
    switch (U(&f->r, 3)) {
    case 0:
        c->p.rope_dim = CHANCE(&f->r, 0.5) ? -(int32_t)U(&f->r, 3) : c->p.rope_dim + 1;
        note(f, " rope_dim=%d", c->p.rope_dim);
        return 1;
    case 1:
        c->p.style = (mlaf_rope_style)(CHANCE(&f->r, 0.5) ? -1 : RANGE(&f->r, 2, 7));
        note(f, " style=%d", (int)c->p.style);
        return 1;
    default: {
        static const float bad[4] = {-1e-6f, NAN, INFINITY, -INFINITY};
        c->p.head_norm = 1;
        c->p.head_norm_eps = bad[U(&f->r, 4)];
        note(f, " head_norm=1 head_norm_eps=%g", (double)c->p.head_norm_eps);
        return 1;
    }
    }
}

static int fuzz_ropeout(fz *f) {
    mlaf_rng *r = &f->r;
    set_state(f);
    ropeout_case rc;
    const int32_t R = 2 * (int32_t)RANGE(r, 1, 16), nope = CHANCE(r, 0.2) ? 0 : (int32_t)RANGE(r, 1, 40), D = nope + R;
    static const float eps[4] = {0.0f, 1e-6f, 1e-3f, 1e-12f};
    rc.p = (mlaf_rope_params){R, CHANCE(r, 0.5) ? MLAF_ROPE_INTERLEAVED : MLAF_ROPE_NEOX, CHANCE(r, 0.5), eps[U(r, 4)]};
    const int64_t T = draw_T(r), H = CHANCE(r, 0.05) ? 0 : RANGE(r, 1, 6), max_pos = RANGE(r, 1, 40);
    const int64_t Hpad = H + (CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 3));
    const int has_out = CHANCE(r, 0.7);
    const mlaf_dtype dt = FLOAT_DT(r);
    fz_t q, pos, cs, qo, ec;
    memset(&qo, 0, sizeof qo), memset(&ec, 0, sizeof ec);
    int64_t s1 = D + (CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 4)), s0 = H * s1 + (CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 9));
    int64_t sh[3] = {T, H, D}, st[3] = {s0, s1, 1};
    fz_tensor(f, &q, "q", dt, 3, sh, st, 1, CHANCE(r, 0.2) ? 50.0 : 1.0, DT_FLOATS, 0u, 1, !has_out);
    fz_1d(f, &pos, "positions", INDEX_DT(r), T, 0, 0, DT_INDEX, 1u, 1, 0);
    fz_2d(f, &cs, "cos_sin", MLAF_F32, max_pos, R, RANGE(r, 0, 4), 1, 1.0, DTM(MLAF_F32), 2u, 1, 0);
    fill_table(f, &cs, max_pos, R);
    if (has_out) {
        int64_t o1 = D + (CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 4)), o0 = Hpad * o1 + (CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 9));
        int64_t osh[3] = {T, Hpad, D}, ost[3] = {o0, o1, 1};
        fz_tensor(f, &qo, "q_out", dt, 3, osh, ost, 0, 0, DTM(dt), 5u, 0, 1);
    }
    if (CHANCE(r, 0.7)) add_error_count(f, &ec);
    fill_positions(f, &pos, T, max_pos);
    mutate(f, ropeout_params_mutate, &rc, NULL, 0, 0);
    if (!fz_commit(f)) return -1;
    mlaf_status s = mlaf_rope_q_out(f->ctx, &rc.p, DEV(f, &q), DEV(f, &pos), DEV(f, &cs), DEV(f, &qo), DEV(f, &ec));
    if (!judge_new(f, s)) return s == MLAF_OK;
    int64_t bad = 0;
    const fz_t *dst = has_out ? &qo : &q;
    const size_t es = mlaf_dtype_size(dt);
    for (int64_t t = 0; t < T; t++) {
        int isbad;
        bad_positions(f, &pos, T, max_pos, t, &isbad);
        if (isbad) {
            bad++; /* nothing of the token written: its row unclaimed */
            continue;
        }
        claim_rows(f, dst, t, t + 1);
        for (int64_t h = H; h < Hpad && has_out; h++)
            for (int32_t i = 0; i < D; i++) {
                const unsigned char *v = body(f, qo.buf) + at_byte(&qo, t * qo.t.stride[0] + h * qo.t.stride[1] + i);
                for (size_t k = 0; k < es; k++)
                    if (v[k]) {
                        fail(f, "q_out[%lld, %lld, %d]: a padding head value is not +0.0", (long long)t, (long long)h, i);
                        k = es, i = D, h = Hpad;
                    }
            }
    }
    check_count(f, &ec, H == 0 && (!has_out || Hpad == 0) ? 0 : bad); /* H = 0 and no padding heads: a no-op, nothing counted */
    check_untouched(f);
    return 1;
}

/* -- indexer_q -- */
typedef struct idx_case {
    mlaf_indexer_params ip;
    mlaf_rope_params pr;
    int has_pe;
} idx_case;

static int indexer_params_mutate(fz *f, mlaf_indexer_params *ip) {
    switch (U(&f->r, 4)) {
    case 0: ip->style = (mlaf_rope_style)(CHANCE(&f->r, 0.5) ? -1 : RANGE(&f->r, 2, 5)); note(f, " ip.style=%d", (int)ip->style); return 1;
    case 1: ip->scale = (mlaf_index_scale)(CHANCE(&f->r, 0.5) ? -1 : RANGE(&f->r, 2, 5)); note(f, " ip.scale=%d", (int)ip->scale); return 1;
    case 2: {
        static const float bad[5] = {0.0f, -1e-6f, NAN, INFINITY, -INFINITY};
        ip->ln_eps = bad[U(&f->r, 5)];
        note(f, " ip.ln_eps=%g", (double)ip->ln_eps);
        return 1;
    }
    default: {
        static const float bad[5] = {0.0f, 1e-31f, NAN, INFINITY, -1.0f};
        ip->amax_eps = bad[U(&f->r, 5)];
        note(f, " ip.amax_eps=%g", (double)ip->amax_eps);
        return 1;
    }
    }
}

static int idx_params_mutate(fz *f, void *vp) {
    idx_case *c = (idx_case *)vp;
    if (c->has_pe && CHANCE(&f->r, 0.4)) {
        if (CHANCE(&f->r, 0.5)) c->pr.rope_dim = CHANCE(&f->r, 0.5) ? 32 : 66;
        else c->pr.style = (mlaf_rope_style)RANGE(&f->r, 2, 4);
        note(f, " q_pe_rope=(%d, %d)", c->pr.rope_dim, (int)c->pr.style);
        return 1;
    }
    return indexer_params_mutate(f, &c->ip);
}

static mlaf_indexer_params draw_ip(mlaf_rng *r) {
    mlaf_indexer_params ip = {CHANCE(r, 0.5) ? MLAF_ROPE_INTERLEAVED : MLAF_ROPE_NEOX, (int32_t)U(r, 2), 1e-6f,
                              CHANCE(r, 0.5) ? 1e-4f : 1e-30f, CHANCE(r, 0.5) ? MLAF_INDEX_SCALE_UE8M0 : MLAF_INDEX_SCALE_F32};
    return ip;
}

static int fuzz_idxq(fz *f) {
    mlaf_rng *r = &f->r;
    set_state(f);
    idx_case c;
    memset(&c, 0, sizeof c);
    c.ip = draw_ip(r);
    c.pr = (mlaf_rope_params){64, CHANCE(r, 0.5) ? MLAF_ROPE_INTERLEAVED : MLAF_ROPE_NEOX, 0, 0.0f};
    const mlaf_dtype dt = FLOAT_DT(r);
    const int64_t T = draw_T(r) % 9, H = CHANCE(r, 0.05) ? 0 : RANGE(r, 1, 4), max_pos = RANGE(r, 1, 30);
    c.has_pe = CHANCE(r, 0.4);
    fz_t qi, pos, cs, w, qf, wo, pe, ec;
    memset(&pe, 0, sizeof pe), memset(&ec, 0, sizeof ec);
    int64_t s1 = 128 + (CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 4)), s0 = H * s1 + (CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 9));
    int64_t sh[3] = {T, H, 128}, st[3] = {s0, s1, 1};
    fz_tensor(f, &qi, "q_idx", dt, 3, sh, st, 1, 1.0, DT_FLOATS, 4u, 1, 0);
    fz_1d(f, &pos, "positions", INDEX_DT(r), T, 0, 0, DT_INDEX, 1u, 1, 0);
    fz_2d(f, &cs, "cos_sin", MLAF_F32, max_pos, 64, RANGE(r, 0, 4), 1, 1.0, DTM(MLAF_F32), 2u, 1, 0);
    fill_table(f, &cs, max_pos, 64);
    fz_2d(f, &w, "w", CHANCE(r, 0.5) ? dt : MLAF_F32, T, H, RANGE(r, 0, 3), 1, 1.0, DTM(dt) | DTM(MLAF_F32), 3u, 1, 0);
    int64_t f1 = 128 + (CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 8)), f0 = H * f1 + RANGE(r, 0, 8);
    int64_t fsh[3] = {T, H, 128}, fst[3] = {f0, f1, 1};
    fz_tensor(f, &qf, "q_fp8", CHANCE(r, 0.5) ? MLAF_U8 : MLAF_FP8_E4M3, 3, fsh, fst, 0, 0, DTM(MLAF_U8) | DTM(MLAF_FP8_E4M3), 7u, 1, 1);
    fz_2d(f, &wo, "w_out", MLAF_F32, T, H, RANGE(r, 0, 3), 0, 0, DTM(MLAF_F32), 3u, 1, 1);
    if (c.has_pe) {
        const int64_t Hq = RANGE(r, 1, 4), Dq = 64 + (CHANCE(r, 0.3) ? 0 : RANGE(r, 1, 20));
        int64_t p1 = Dq + RANGE(r, 0, 3), p0 = Hq * p1 + RANGE(r, 0, 5), psh[3] = {T, Hq, Dq}, pst[3] = {p0, p1, 1};
        fz_tensor(f, &pe, "q_pe", FLOAT_DT(r), 3, psh, pst, 1, 1.0, DT_FLOATS, 1u, 0, 1);
    }
    if (CHANCE(r, 0.7)) add_error_count(f, &ec);
    fill_positions(f, &pos, T, max_pos);
    mutate(f, idx_params_mutate, &c, NULL, 0, 0);
    if (!fz_commit(f)) return -1;
    mlaf_status s = mlaf_indexer_q(f->ctx, &c.ip, DEV(f, &qi), DEV(f, &pos), DEV(f, &cs), DEV(f, &w), DEV(f, &qf), DEV(f, &wo),
                                   DEV(f, &pe), c.has_pe ? &c.pr : NULL, DEV(f, &ec));
    if (!judge_new(f, s)) return s == MLAF_OK;
    int64_t bad = 0;
    for (int64_t t = 0; t < T; t++) {
        int isbad;
        bad_positions(f, &pos, T, max_pos, t, &isbad);
        if (isbad) {
            bad++; /* q_fp8, w_out, q_pe of the token untouched */
            continue;
        }
        claim_rows(f, &qf, t, t + 1), claim_rows(f, &wo, t, t + 1), claim_rows(f, &pe, t, t + 1);
    }
    check_count(f, &ec, H > 0 || c.has_pe ? bad : 0); /* H = 0 without q_pe: a no-op */
    check_untouched(f);
    return 1;
}

/* -- moe_gate_hash -- */
static int hash_params_mutate(fz *f, void *vp) {
    mlaf_moe_gate_params *p = (mlaf_moe_gate_params *)vp;
    switch (U(&f->r, 4)) {
    case 0: p->n_group = CHANCE(&f->r, 0.5) ? 0 : (int32_t)RANGE(&f->r, 2, 8); note(f, " n_group=%d", p->n_group); return 1;
    case 1: p->topk_group = CHANCE(&f->r, 0.5) ? 0 : (int32_t)RANGE(&f->r, 2, 8); note(f, " topk_group=%d", p->topk_group); return 1;
    default: return gate_params_mutate(f, vp);
    }
}

static int fuzz_hash(fz *f) {
    mlaf_rng *r = &f->r;
    set_state(f);
    const mlaf_dtype dt = FLOAT_DT(r);
    const int64_t T = draw_T(r), E = RANGE(r, 1, 40), V = RANGE(r, 1, 12);
    const int32_t K = (int32_t)RANGE(r, 1, E < 8 ? E : 8), S = CHANCE(r, 0.7) ? 0 : (int32_t)RANGE(r, 1, 2);
    static const mlaf_score_func sf[3] = {MLAF_SCORE_SIGMOID, MLAF_SCORE_SOFTMAX, MLAF_SCORE_SQRT_SOFTPLUS};
    mlaf_moe_gate_params p = {K, 1, 1, sf[U(r, 3)], MLAF_GROUP_TOP2_SUM, (int32_t)U(r, 2), CHANCE(r, 0.5) ? 1.0f : 2.5f,
                              S ? 0 : (int32_t)U(r, 2), 1e-20f, S};
    fz_t lg, tab, tok, wt, ids, sc, ec;
    memset(&sc, 0, sizeof sc), memset(&ec, 0, sizeof ec);
    fz_2d(f, &lg, "logits", dt, T, E, RANGE(r, 0, 5), 1, CHANCE(r, 0.2) ? 30.0 : 2.0, DT_FLOATS, 0u, 1, 0);
    fz_2d(f, &tab, "tid2eid", INDEX_DT(r), V, K, RANGE(r, 0, 3), 0, 0, DT_INDEX, 2u, 1, 0);
    fz_1d(f, &tok, "token_ids", INDEX_DT(r), T, 0, 0, DT_INDEX, 1u, 1, 0);
    fz_2d(f, &wt, "weights", CHANCE(r, 0.5) ? dt : MLAF_F32, T, K + S, RANGE(r, 0, 3), 0, 0, DTM(dt) | DTM(MLAF_F32), 3u, 1, 1);
    fz_2d(f, &ids, "ids", MLAF_I32, T, K + S, RANGE(r, 0, 3), 0, 0, DTM(MLAF_I32), 3u, 1, 1);
    if (CHANCE(r, 0.5)) fz_2d(f, &sc, "scores", MLAF_F32, T, E, RANGE(r, 0, 3), 0, 0, DTM(MLAF_F32), 3u, 0, 1);
    if (CHANCE(r, 0.7)) add_error_count(f, &ec);
    /* the table: distinct experts per row, some rows with an entry out of range or repeated */
    for (int64_t v = 0; v < V; v++) {
        int64_t perm[64];
        for (int64_t e = 0; e < E; e++) perm[e] = e;
        for (int32_t k = 0; k < K; k++) {
            int64_t j = k + (int64_t)U(r, (uint64_t)(E - k)), tmp = perm[k];
            perm[k] = perm[j], perm[j] = tmp;
        }
        if (CHANCE(r, 0.08)) perm[U(r, (uint64_t)K)] = CHANCE(r, 0.5) ? -1 : E + (int64_t)U(r, 3);
        else if (K > 1 && CHANCE(r, 0.05)) perm[K - 1] = perm[0];
        for (int32_t k = 0; k < K; k++) {
            unsigned char *q = f->b[tab.buf].init + tab.boff + (v * tab.t.stride[0] + k) * (int64_t)mlaf_dtype_size(tab.t.dtype);
            if (tab.t.dtype == MLAF_I32) { int32_t w = (int32_t)perm[k]; memcpy(q, &w, 4); }
            else memcpy(q, &perm[k], 8);
        }
    }
    for (int64_t t = 0; t < T; t++) set_idx(f, &tok, t, CHANCE(r, 0.08) ? (CHANCE(r, 0.5) ? -1 : V + (int64_t)U(r, 2)) : (int64_t)U(r, (uint64_t)V));
    mutate(f, hash_params_mutate, &p, NULL, 0, 0);
    if (!fz_commit(f)) return -1;
    mlaf_status s = mlaf_moe_gate_hash(f->ctx, &p, DEV(f, &lg), DEV(f, &tab), DEV(f, &tok), DEV(f, &wt), DEV(f, &ids), DEV(f, &sc), DEV(f, &ec));
    if (!judge_new(f, s)) return s == MLAF_OK;
    int64_t bad = 0;
    claim_all(f, &wt), claim_all(f, &sc);
    for (int64_t t = 0; t < T && !f->failed; t++) {
        const int64_t id = get_idx(f->b[tok.buf].init + tok.boff, tok.t.dtype, t);
        int64_t want[72];
        int isbad = id < 0 || id >= V;
        for (int32_t k = 0; k < K && !isbad; k++) {
            want[k] = get_idx(f->b[tab.buf].init + tab.boff, tab.t.dtype, id * tab.t.stride[0] + k);
            if (want[k] < 0 || want[k] >= E) isbad = 1;
            for (int32_t m = 0; m < k && !isbad; m++)
                if (want[m] == want[k]) isbad = 1;
        }
        bad += isbad;
        for (int32_t k = 0; k < K + S; k++) {
            const int64_t b = at_byte(&ids, t * ids.t.stride[0] + k);
            int32_t got;
            memcpy(&got, body(f, ids.buf) + b, 4);
            claim(f, ids.buf, b, 4);
            const int64_t w = k >= K ? E + (k - K) : isbad ? k : want[k];
            if (got != w) fail(f, "token %lld: ids[%d] = %d, expected %lld%s", (long long)t, k, got, (long long)w, isbad ? " (a bad row)" : "");
            float wv = mlaf_load_f32(body(f, wt.buf) + at_byte(&wt, t * wt.t.stride[0] + k), wt.t.dtype, 0);
            if (!isfinite(wv) || (isbad && wv != 0.0f)) fail(f, "token %lld: weights[%d] = %g", (long long)t, k, (double)wv);
        }
    }
    check_count(f, &ec, bad);
    check_untouched(f);
    return 1;
}

/* -- mla_kv_cache_dsa (the DSA indexer key branch) and kv_rope_tail into fp8_v4 -- */
typedef struct dsa_case {
    mlaf_mla_kv_cache_params kp;
    mlaf_indexer_params ip;
    mlaf_indexer_k ik;
    mlaf_kv_cache_desc cd;
    int v4;
    int64_t span; /* bytes one index cache view spans */
} dsa_case;

static int dsa_params_mutate(fz *f, void *vp) {
    dsa_case *c = (dsa_case *)vp;
    mlaf_rng *r = &f->r;
    static const float bad_eps[5] = {0.0f, -1e-6f, NAN, INFINITY, -INFINITY};
    switch (U(r, c->v4 ? 6 : 7)) {
    case 0: c->kp.eps_kv = bad_eps[U(r, 5)]; note(f, " eps_kv=%g", (double)c->kp.eps_kv); return 1;
    case 1:
        if (c->v4) {
            static const int32_t tails[5] = {-2, 0, 62, 66, 63};
            c->kp.kv_rope_tail = tails[U(r, 5)];
        } else {
            c->kp.kv_rope_tail = 2 * (int32_t)RANGE(r, 1, c->kp.kv_lora_rank / 2 > 1 ? c->kp.kv_lora_rank / 2 : 1);
            if (c->kp.kv_rope_tail > c->kp.kv_lora_rank) c->kp.kv_rope_tail = -2;
        }
        note(f, " kv_rope_tail=%d", c->kp.kv_rope_tail);
        return 1;
    case 2:
        c->kp.rope_dim = c->v4 ? (CHANCE(r, 0.5) ? 64 : -2) : (CHANCE(r, 0.5) ? 32 : 66);
        note(f, " rope_dim=%d", c->kp.rope_dim);
        return 1;
    case 3:
        if (c->v4) {
            c->kp.kv_lora_rank = CHANCE(r, 0.5) ? 448 : 576;
            note(f, " kv_lora_rank=%d", c->kp.kv_lora_rank);
        } else {
            c->kp.style = (mlaf_rope_style)(CHANCE(r, 0.5) ? -1 : RANGE(r, 2, 9));
            note(f, " style=%d", (int)c->kp.style);
        }
        return 1;
    case 4:
        if (c->v4) {
            c->kp.style = CHANCE(r, 0.5) ? MLAF_ROPE_NEOX : (mlaf_rope_style)RANGE(r, 2, 9);
            note(f, " style=%d", (int)c->kp.style);
        } else {
            c->ik.copies = CHANCE(r, 0.5) ? -(int32_t)RANGE(r, 1, 3) : (int32_t)RANGE(r, 9, 40);
            note(f, " copies=%d", c->ik.copies);
        }
        return 1;
    case 5:
        if (c->v4) {
            c->cd.format = CHANCE(r, 0.5) ? MLAF_KV_FP8_DS_MLA : (mlaf_kv_format)(CHANCE(r, 0.5) ? -1 : RANGE(r, 4, 9));
            note(f, " cache.format=%d", (int)c->cd.format);
            return 1;
        }
        if (c->ik.copies < 2 || c->span <= 0) return 0;
        c->ik.copy_stride = c->span - RANGE(r, 1, c->span);
        note(f, " copy_stride=%lld < span %lld", (long long)c->ik.copy_stride, (long long)c->span);
        return 1;
    default: return indexer_params_mutate(f, &c->ip);
    }
}

static int fuzz_dsa(fz *f, int v4) {
    mlaf_rng *r = &f->r;
    set_state(f);
    dsa_case c;
    memset(&c, 0, sizeof c);
    c.v4 = v4;
    const mlaf_dtype dt = v4 ? MLAF_BF16 : FLOAT_DT(r);
    const int64_t T = draw_T(r) % (v4 ? 7 : 13);
    const int32_t Q = CHANCE(r, 0.25) ? 0 : (int32_t)RANGE(r, 1, 24), C = v4 ? 512 : (int32_t)RANGE(r, 1, 40), R = v4 ? 0 : 64;
    c.kp = (mlaf_mla_kv_cache_params){Q, C, R, (float)pow(10.0, -RANGE(r, 1, 8)), (float)pow(10.0, -RANGE(r, 1, 8)),
                                      v4 ? MLAF_ROPE_INTERLEAVED : (CHANCE(r, 0.5) ? MLAF_ROPE_INTERLEAVED : MLAF_ROPE_NEOX), v4 ? 64 : 0};
    c.ip = draw_ip(r);
    const int32_t W = Q + C + R;
    const unsigned wdts = DTM(dt) | DTM(MLAF_F32);
    fz_t lat, wq, wkv, q, kn, kp, pos, cs, slot, cache, ec, ik, iw, ib, icache, iout, topk;
    memset(&wq, 0, sizeof wq), memset(&q, 0, sizeof q), memset(&kn, 0, sizeof kn), memset(&kp, 0, sizeof kp);
    memset(&ec, 0, sizeof ec), memset(&iout, 0, sizeof iout), memset(&topk, 0, sizeof topk), memset(&ik, 0, sizeof ik);
    memset(&iw, 0, sizeof iw), memset(&ib, 0, sizeof ib), memset(&icache, 0, sizeof icache);
    fz_2d(f, &lat, "latent", dt, T, W, CHANCE(r, 0.4) ? 0 : RANGE(r, 1, 9), 1, 1.0, v4 ? DTM(MLAF_BF16) : DT_FLOATS, 3u, 1, 0);
    if (Q > 0) fz_1d(f, &wq, "w_q", CHANCE(r, 0.5) ? dt : MLAF_F32, Q, 1, 0.3, wdts, 1u, 1, 0);
    fz_1d(f, &wkv, "w_kv", CHANCE(r, 0.5) ? dt : MLAF_F32, C, 1, 0.3, wdts, 1u, 1, 0);
    if (Q > 0) {
        if (CHANCE(r, 0.2)) fz_columns(f, &q, "q", &lat, 0, Q, 3u);
        else fz_2d(f, &q, "q", dt, T, Q, RANGE(r, 0, 5), 0, 1, DTM(dt), 3u, 1, 1);
        q.required = 1;
    }
    if (CHANCE(r, 0.6)) {
        if (CHANCE(r, 0.2)) fz_columns(f, &kn, "k_nope", &lat, Q, C, 3u);
        else fz_2d(f, &kn, "k_nope", dt, T, C, RANGE(r, 0, 5), 0, 1, DTM(dt), 3u, 0, 1);
    }
    if (!v4 && CHANCE(r, 0.5)) fz_2d(f, &kp, "k_pe", dt, T, R, RANGE(r, 0, 5), 0, 1, DTM(dt), 3u, 0, 1);
    const int64_t max_pos = RANGE(r, 1, 30);
    fz_1d(f, &pos, "positions", INDEX_DT(r), T, 0, 0, DT_INDEX, 1u, 1, 0);
    fz_2d(f, &cs, "cos_sin", MLAF_F32, max_pos, 64, RANGE(r, 0, 4), 1, 1.0, DTM(MLAF_F32), 2u, 1, 0);
    fill_table(f, &cs, max_pos, 64);
    const int64_t nb = CHANCE(r, 0.05) ? 0 : RANGE(r, 1, v4 ? 3 : 4), bs = RANGE(r, 1, v4 ? 3 : 5), nslots = nb * bs;
    if (v4) { /* planar pages: stride[1] = 584, stride[0] a multiple of 16 >= block_size * 584, data 16-aligned */
        int64_t sh[3] = {nb, bs, 584}, st[3] = {(bs * 584 + 15) / 16 * 16 + 16 * RANGE(r, 0, 2), 584, 1};
        fz_tensor(f, &cache, "kv_cache", CHANCE(r, 0.5) ? MLAF_U8 : MLAF_FP8_E4M3, 3, sh, st, 2, 0, DTM(MLAF_U8) | DTM(MLAF_FP8_E4M3), 4u, 1, 1);
        cache.boff = 0;
        c.cd = (mlaf_kv_cache_desc){MLAF_KV_FP8_V4, NULL, NULL, NULL, NULL, MLAF_FP8_DIV, MLAF_TILE_AMAX};
    } else {
        int64_t s1 = C + R + (CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 4)), s0 = bs * s1 + (CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 7));
        int64_t sh[3] = {nb, bs, C + R}, st[3] = {s0, s1, 1};
        fz_tensor(f, &cache, "kv_cache", FLOAT_DT(r), 3, sh, st, 1, 1.0, DT_FLOATS, 4u, 1, 1);
        c.cd = (mlaf_kv_cache_desc){MLAF_KV_PLAIN, NULL, NULL, NULL, NULL, MLAF_FP8_DIV, MLAF_TILE_AMAX};
    }
    const int64_t N = CHANCE(r, 0.2) && T > 0 ? T - RANGE(r, 0, T < 3 ? T : 3) : T;
    fz_1d(f, &slot, "slot_mapping", INDEX_DT(r), N, 0, 0, DT_INDEX, 1u, 1, 0);
    slot.max0 = T;
    if (CHANCE(r, 0.7)) add_error_count(f, &ec);
    fill_positions(f, &pos, T, max_pos);
    fill_slots(f, &slot, N, nslots);
    if (!v4) { /* the indexer key branch */
        fz_2d(f, &ik, "index_k", dt, T, 128, CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 40), 1, 1.0, DTM(dt), 3u, 1, 0);
        const mlaf_dtype wdt = CHANCE(r, 0.5) ? dt : MLAF_F32;
        fz_1d(f, &iw, "index_weight", wdt, 128, 1, 0.5, wdts, 1u, 1, 0);
        fz_1d(f, &ib, "index_bias", wdt, 128, 1, 0.5, DTM(wdt), 1u, 1, 0);
        const int64_t bytes = 132 * bs + (CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 9));
        const int32_t copies = CHANCE(r, 0.7) ? (int32_t)U(r, 2) : (int32_t)RANGE(r, 2, 3);
        const int64_t bstride = bytes + (CHANCE(r, 0.5) ? 0 : RANGE(r, 1, 5));
        c.span = nb == 0 ? 0 : (nb - 1) * bstride + bytes;
        const int64_t cstride = c.span + RANGE(r, 0, 7);
        int64_t sh[2] = {nb, bytes}, st[2] = {bstride, 1};
        fz_tensor(f, &icache, "index_cache", CHANCE(r, 0.5) ? MLAF_U8 : MLAF_FP8_E4M3, 2, sh, st, 2, 0, DTM(MLAF_U8) | DTM(MLAF_FP8_E4M3), 1u, 1, 1);
        if (copies > 1) { /* room for the copies, past the first view, in the same buffer */
            fz_buf *b = &f->b[icache.buf];
            size_t more = (size_t)(cstride * (copies - 1)) + 8;
            b->init = (unsigned char *)realloc(b->init, b->bytes + more);
            b->claim = (unsigned char *)realloc(b->claim, b->bytes + more);
            for (size_t k = 0; k < more; k++) b->init[b->bytes + k] = (unsigned char)(mlaf_rng_u64(r) >> 56), b->claim[b->bytes + k] = 0;
            b->bytes += more;
        }
        c.ik.copies = copies;
        c.ik.copy_stride = copies > 1 ? cstride : (int64_t)U(r, 5);
        if (CHANCE(r, 0.5)) {
            if (CHANCE(r, 0.3)) { /* in place over index_k */
                iout = ik;
                iout.name = "index_out";
                iout.required = 0;
                fz_register(f, &iout);
            } else {
                fz_2d(f, &iout, "index_out", dt, T, 128, RANGE(r, 0, 5), 0, 0, DTM(dt), 3u, 0, 1);
            }
            iout.output = 0; /* an alias of it onto index_k could be the allowed in-place form */
        }
        if (CHANCE(r, 0.4)) fz_2d(f, &topk, "topk_fill", MLAF_I32, T, RANGE(r, 1, 6), RANGE(r, 0, 3), 0, 0, DTM(MLAF_I32), 1u, 0, 1);
    }
    mutate(f, dsa_params_mutate, &c, &lat, Q, C);
    if (!fz_commit(f)) return -1;
    c.cd.cache = DEV(f, &cache);
    c.ik.index_k = DEV(f, &ik), c.ik.weight = DEV(f, &iw), c.ik.bias = DEV(f, &ib), c.ik.cache = DEV(f, &icache);
    c.ik.out = DEV(f, &iout), c.ik.topk_fill = DEV(f, &topk);
    mlaf_status s = v4 ? mlaf_mla_kv_cache_fmt(f->ctx, &c.kp, DEV(f, &lat), DEV(f, &wq), DEV(f, &wkv), DEV(f, &pos), DEV(f, &cs),
                                               DEV(f, &slot), &c.cd, DEV(f, &q), DEV(f, &kn), DEV(f, &kp), DEV(f, &ec))
                       : mlaf_mla_kv_cache_dsa(f->ctx, &c.kp, DEV(f, &lat), DEV(f, &wq), DEV(f, &wkv), DEV(f, &pos), DEV(f, &cs),
                                               DEV(f, &slot), &c.cd, DEV(f, &q), DEV(f, &kn), DEV(f, &kp), DEV(f, &ec), &c.ip, &c.ik);
    if (!judge_new(f, s)) return s == MLAF_OK;
    /* where it may write: q and k_nope whole, k_pe / index_out rows of tokens with a valid
     * position and slot, the cache rows of the slots named, every index cache copy, topk_fill,
     * error_count */
    claim_all(f, &q), claim_all(f, &kn), claim_all(f, &topk), claim_all(f, &ec);
    const int64_t es_c = (int64_t)mlaf_dtype_size(cache.t.dtype);
    int64_t bad = 0;
    for (int64_t t = 0; t < T; t++) {
        int isbad;
        bad_positions(f, &pos, T, max_pos, t, &isbad);
        const int64_t sl = t < N ? get_idx(f->b[slot.buf].init + slot.boff, slot.t.dtype, t) : -1;
        const int past = sl >= nslots;
        if (isbad || past) bad++; /* counted once */
        if (!isbad && !past) claim_rows(f, &kp, t, t + 1), claim_rows(f, &iout, t, t + 1);
        if (isbad || sl < 0 || past) continue;
        const int64_t blk = sl / bs, off = sl % bs;
        if (v4) {
            claim(f, cache.buf, cache.boff + blk * cache.t.stride[0] + off * 576, 576);
            claim(f, cache.buf, cache.boff + blk * cache.t.stride[0] + bs * 576 + off * 8, 8);
        } else {
            claim(f, cache.buf, cache.boff + (blk * cache.t.stride[0] + off * cache.t.stride[1]) * es_c, (size_t)((C + R) * es_c));
            for (int32_t k = 0; k < (c.ik.copies > 1 ? c.ik.copies : 1); k++) {
                const int64_t base = icache.boff + k * (c.ik.copies > 1 ? c.ik.copy_stride : 0) + blk * icache.t.stride[0];
                claim(f, icache.buf, base + 128 * off, 128);
                claim(f, icache.buf, base + 128 * bs + 4 * off, 4);
            }
        }
    }
    check_count(f, &ec, bad);
    check_untouched(f);
    return 1;
}

/* ---- context, presets, names, RoPE tables --------------------------------------------------- */
static int yarn_ok(const mlaf_rope_scaling *s) {
    if (!s || s->type == MLAF_ROPE_SCALING_NONE) return 1;
    return s->type == MLAF_ROPE_SCALING_YARN && isfinite(s->factor) && s->factor >= 1 && s->original_max_position_embeddings >= 1 &&
           isfinite(s->beta_fast) && s->beta_fast > 0 && isfinite(s->beta_slow) && s->beta_slow > 0 && isfinite(s->mscale) &&
           s->mscale >= 0 && isfinite(s->mscale_all_dim) && s->mscale_all_dim >= 0 && isfinite(s->attention_factor) &&
           s->attention_factor >= 0;
}

static double pick_d(mlaf_rng *r, const double *v, int n) { return v[U(r, (uint64_t)n)]; }

static int fuzz_ctx(fz *f) {
    mlaf_rng *r = &f->r;
    mlaf_context *c = f->ctx;
    switch (U(r, 7)) {
    case 0: { /* threads: 0..MLAF_MAX_THREADS accepted, the rest rejected and the count kept */
        static const int v[12] = {-5, -1, 0, 1, 2, 3, 7, 64, MLAF_MAX_THREADS, MLAF_MAX_THREADS + 1, 100000, INT_MAX};
        int n = CHANCE(r, 0.1) ? INT_MIN : v[U(r, 12)], before = mlaf_context_threads(c);
        mlaf_status st = mlaf_context_set_threads(c, n), want = n < 0 ? MLAF_ERR_INVALID_ARGUMENT : n > MLAF_MAX_THREADS ? MLAF_ERR_LIMIT : MLAF_OK;
        int now = mlaf_context_threads(c);
        note(f, " set_threads(%d)", n);
        if (st != want) fail(f, "set_threads(%d) = %s, expected %s", n, mlaf_status_name(st), mlaf_status_name(want));
        else if (st != MLAF_OK && (now != before || !mlaf_context_last_error(c)[0])) fail(f, "a rejected set_threads(%d) changed the count or left no message", n);
        else if (now < 1 || now > MLAF_MAX_THREADS || (n > 0 && st == MLAF_OK && now != n)) fail(f, "threads = %d after set_threads(%d)", now, n);
        mlaf_context_set_threads(c, 2); /* no team of 1024 threads for the op calls after */
        return 1;
    }
    case 1: {
        int isa = (int)RANGE(r, -2, 6);
        mlaf_cpu_isa before = mlaf_context_cpu_isa(c);
        mlaf_status st = mlaf_context_set_cpu_isa(c, (mlaf_cpu_isa)isa);
        note(f, " set_cpu_isa(%d)", isa);
        if (isa < 0 || isa >= MLAF_CPU_ISA_COUNT_) {
            if (st != MLAF_ERR_INVALID_ARGUMENT || mlaf_context_cpu_isa(c) != before) fail(f, "set_cpu_isa(%d) = %s", isa, mlaf_status_name(st));
        } else if (st == MLAF_OK) {
            if (mlaf_context_cpu_isa(c) == MLAF_CPU_ISA_AUTO || (isa != MLAF_CPU_ISA_AUTO && mlaf_context_cpu_isa(c) != (mlaf_cpu_isa)isa))
                fail(f, "set_cpu_isa(%d) resolved to %d", isa, (int)mlaf_context_cpu_isa(c));
        } else if (st != MLAF_ERR_UNSUPPORTED || mlaf_context_cpu_isa(c) != before || mlaf_cpu_isa_supported((mlaf_cpu_isa)isa)) {
            fail(f, "set_cpu_isa(%d) = %s", isa, mlaf_status_name(st));
        }
        return 1;
    }
    case 2: { /* CUDA setters: rejected on a CPU context; on CUDA, the device range */
        int dev = (int)RANGE(r, -2, 3);
        mlaf_status st = mlaf_context_set_cuda_device(c, dev);
        note(f, " set_cuda_device(%d)", dev);
        if (f->be == MLAF_BACKEND_CPU) {
            if (st == MLAF_OK || mlaf_context_set_cuda_stream(c, NULL) != MLAF_ERR_INVALID_ARGUMENT) fail(f, "CUDA setters accepted on a CPU context");
        } else if (dev < 0 && st == MLAF_OK) {
            fail(f, "set_cuda_device(%d) accepted", dev);
        }
        if (f->be == MLAF_BACKEND_CUDA) mlaf_context_set_cuda_device(c, 0);
        return 1;
    }
    case 3: { /* presets by index and by name */
        int i = (int)RANGE(r, -3, mlaf_preset_count() + 2);
        const mlaf_model_config *m = mlaf_preset_at(i);
        static const char *const names[9] = {"glm-4.7-flash", "GLM-4.7-FLASH", "deepseek-r1", "DeepSeek-V3", "kimi-k2", "", "deepseek", "glm-4.7-flash ", "x"};
        const char *nm = CHANCE(r, 0.1) ? NULL : names[U(r, 9)];
        const mlaf_model_config *byname = mlaf_preset_find(nm);
        note(f, " preset_at(%d) preset_find(%s)", i, nm ? nm : "NULL");
        if ((i >= 0 && i < mlaf_preset_count()) != (m != NULL)) fail(f, "preset_at(%d) = %p", i, (const void *)m);
        if (byname && !byname->name[0]) fail(f, "preset_find(%s) has no name", nm);
        if (m) {
            mlaf_moe_gate_params gp = mlaf_moe_gate_params_from_config(m);
            if (gp.top_k != m->top_k || gp.n_group != m->n_group) fail(f, "moe_gate_params_from_config(%s) differs", m->name);
        }
        mlaf_moe_gate_params d = mlaf_moe_gate_params_from_config(NULL);
        if (d.top_k != 1 || d.n_group != 1 || d.eps != 1e-20f) fail(f, "moe_gate_params_from_config(NULL) is not the default");
        return 1;
    }
    case 4: { /* names of any code: never NULL, never empty */
        int v = (int)RANGE(r, -3, 14);
        const char *s[6] = {mlaf_status_name((mlaf_status)v), mlaf_status_message((mlaf_status)v), mlaf_dtype_name((mlaf_dtype)v),
                            mlaf_backend_name((mlaf_backend)v), mlaf_op_name((mlaf_op)v), mlaf_cpu_isa_name((mlaf_cpu_isa)v)};
        for (int k = 0; k < 6; k++)
            if (!s[k] || !s[k][0]) fail(f, "name %d of code %d is NULL or empty", k, v);
        (void)mlaf_dtype_size((mlaf_dtype)v);
        return 1;
    }
    default: { /* RoPE tables, plain and scaled, valid and not, in a guarded host buffer */
        static const int64_t mp[6] = {-1, 0, 1, 3, 17, 40};
        static const int32_t rd[7] = {-4, 0, 1, 2, 7, 16, 64};
        static const double bases[7] = {10000.0, 500000.0, 1.0, 0.5, NAN, INFINITY, 1.0001};
        const int64_t max_pos = mp[U(r, 6)];
        const int32_t R = rd[U(r, 7)];
        const double base = bases[U(r, 7)];
        mlaf_rope_scaling s, *sp = NULL;
        if (CHANCE(r, 0.7)) {
            static const double fac[6] = {1.0, 4.0, 40.0, 0.5, NAN, 1e6}, beta[5] = {32, 1, 0, -1, 0.25}, ms[5] = {0, 1, 0.707, -0.1, INFINITY};
            s = mlaf_rope_scaling_yarn(pick_d(r, fac, 6), CHANCE(r, 0.1) ? 0 : RANGE(r, 1, 70000));
            if (CHANCE(r, 0.5)) s.beta_fast = pick_d(r, beta, 5);
            if (CHANCE(r, 0.5)) s.beta_slow = pick_d(r, beta, 5);
            if (CHANCE(r, 0.5)) s.mscale = pick_d(r, ms, 5);
            if (CHANCE(r, 0.5)) s.mscale_all_dim = pick_d(r, ms, 5);
            if (CHANCE(r, 0.3)) s.attention_factor = pick_d(r, ms, 5);
            s.truncate = (int32_t)U(r, 3);
            if (CHANCE(r, 0.1)) s.type = (mlaf_rope_scaling_type)RANGE(r, -1, 4);
            sp = &s;
        }
        const size_t n = (size_t)((max_pos > 0 ? max_pos : 1) * (R > 0 ? R : 1));
        int bi = fz_buffer(f, n * sizeof(float), 2, MLAF_F32, 0);
        if (mlaf_gbuf_alloc(&f->b[bi].g, MLAF_BACKEND_CPU, f->b[bi].bytes, f->b[bi].init, 0) != MLAF_OK) return -1;
        float *tab = (float *)f->b[bi].g.ptr;
        const int valid = max_pos >= 1 && R > 0 && R % 2 == 0 && isfinite(base) && base > 1.0 && yarn_ok(sp);
        mlaf_status st = sp && CHANCE(r, 0.5) ? mlaf_rope_table_init_scaled(tab, max_pos, R, base, sp)
                         : sp                 ? mlaf_rope_table_init_scaled(CHANCE(r, 0.1) ? NULL : tab, max_pos, R, base, sp)
                                              : mlaf_rope_table_init(tab, max_pos, R, base);
        note(f, " rope table max_pos=%lld R=%d base=%g scaling=%s", (long long)max_pos, (int)R, base, sp ? "yarn" : "none");
        mlaf_gbuf_download(&f->b[bi].g); /* CPU: mirrors the table */
        if (st == MLAF_ERR_NULL_POINTER) {
            check_untouched(f);
            return 1;
        }
        if (valid != (st == MLAF_OK)) {
            fail(f, "status %s, expected %s", mlaf_status_name(st), valid ? "MLAF_OK" : "an error");
            return 1;
        }
        if (st != MLAF_OK) {
            check_untouched(f);
            return 1;
        }
        memset(f->b[bi].claim, 1, n * sizeof(float));
        const double a = mlaf_rope_scaling_attention_factor(sp);
        for (int64_t p = 0; p < max_pos && !f->failed; p++)
            for (int32_t i = 0; i < R / 2; i++) {
                const float cv = tab[p * R + i], sv = tab[p * R + R / 2 + i];
                if (!sp || sp->type == MLAF_ROPE_SCALING_NONE) {
                    const double ang = (double)p * pow(base, -2.0 * i / R);
                    if (cv != (float)cos(ang) || sv != (float)sin(ang)) fail(f, "plain table [%lld, %d] = (%g, %g)", (long long)p, i, cv, sv);
                } else if (!(fabs(hypot(cv, sv) - a) <= 1e-6 * a + 1e-30)) {
                    fail(f, "yarn table [%lld, %d]: |(cos, sin)| = %.9g, expected the attention factor %.9g", (long long)p, i, hypot(cv, sv), a);
                }
            }
        check_untouched(f);
        return 1;
    }
    }
}

/* ---- the driver --------------------------------------------------------------------------- */
/* A crash names the call to replay (the sanitizer build keeps its own, fuller report). */
static volatile sig_atomic_t CUR_OP = -1;
static volatile int64_t CUR_CALL = -1;
#if !defined(__SANITIZE_ADDRESS__)
static void on_crash(int sig) {
    static const char *const ops[FZ_NOPS] = {"split", "kv", "rope", "gate", "ctx", "ropeout", "idxq", "hash", "dsa", "v4"};
    char line[160];
    int n = 0;
    const char *a = "\nFUZZ: crashed in call MLAF_FUZZ_ONLY=";
    while (*a && n < 100) line[n++] = *a++;
    for (const char *o = CUR_OP >= 0 && CUR_OP < FZ_NOPS ? ops[CUR_OP] : "?"; *o; o++) line[n++] = *o;
    line[n++] = ':';
    char digits[24];
    int d = 0;
    int64_t v = CUR_CALL < 0 ? 0 : CUR_CALL;
    do digits[d++] = (char)('0' + v % 10), v /= 10;
    while (v && d < 20);
    while (d) line[n++] = digits[--d];
    line[n++] = '\n';
    if (write(2, line, (size_t)n) < 0) _exit(128 + sig);
    _exit(128 + sig);
}
#endif

static const char *const OPS[FZ_NOPS] = {"split", "kv", "rope", "gate", "ctx", "ropeout", "idxq", "hash", "dsa", "v4"};
static const char *const OP_NAMES[FZ_NOPS] = {"split_qk_norm", "mla_kv_cache", "rope_q", "moe_gate", "context_and_tables",
                                              "rope_q_out", "indexer_q", "moe_gate_hash", "mla_kv_cache_dsa", "mla_kv_cache_fp8_v4"};

static int run_one(fz *f, int op) {
    switch (op) {
    case 0: return fuzz_norm(f, 0);
    case 1: return fuzz_norm(f, 1);
    case 2: return fuzz_rope(f);
    case 3: return fuzz_gate(f);
    case 4: return fuzz_ctx(f);
    case 5: return fuzz_ropeout(f);
    case 6: return fuzz_idxq(f);
    case 7: return fuzz_hash(f);
    case 8: return fuzz_dsa(f, 0);
    default: return fuzz_dsa(f, 1);
    }
}

static uint64_t call_seed(uint64_t base, int op, int64_t i) {
    return base ^ ((uint64_t)(op + 1) << 56) ^ ((uint64_t)i * 0x9E3779B97F4A7C15ull);
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
#if !defined(__SANITIZE_ADDRESS__)
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_crash;
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
    sigaction(SIGFPE, &sa, NULL);
    sigaction(SIGABRT, &sa, NULL);
#endif
    const char *e = getenv("MLAF_FUZZ_CALLS");
    const int64_t calls = e && atoll(e) > 0 ? atoll(e) : 4000;
    e = getenv("MLAF_FUZZ_SEED");
    const uint64_t seed = e ? strtoull(e, NULL, 0) : 31;
    int only_op = -1;
    int64_t only_i = -1;
    if ((e = getenv("MLAF_FUZZ_ONLY")) != NULL) {
        for (int k = 0; k < FZ_NOPS; k++) {
            size_t n = strlen(OPS[k]);
            if (!strncmp(e, OPS[k], n) && e[n] == ':') only_op = k, only_i = atoll(e + n + 1);
        }
        if (only_op < 0) {
            printf("MLAF_FUZZ_ONLY=%s: expected op:index, op one of split, kv, rope, gate, ctx, ropeout, idxq, hash, dsa, v4\n", e);
            return 2;
        }
    }
    mlaf_backend bes[MLAF_BACKEND_COUNT_];
    int nbe = tl_backends(bes);
    mlaf_context *host = tl_context(MLAF_BACKEND_CPU);
    if (!host) return tl_finish();
    for (int bi = 0; bi < nbe; bi++) {
        fz f;
        memset(&f, 0, sizeof f);
        f.be = bes[bi];
        f.host = host;
        f.ctx = tl_context(f.be);
        if (!f.ctx) continue;
        for (int op = 0; op < FZ_NOPS; op++) {
            if (only_op >= 0 && op != only_op) continue;
            int64_t ok_calls = 0, rejected = 0, failures = 0, by_status[MLAF_STATUS_COUNT_] = {0};
            char first[1200] = "";
            for (int64_t i = only_i >= 0 ? only_i : 0; i < (only_i >= 0 ? only_i + 1 : calls); i++) {
                CUR_OP = op, CUR_CALL = i;
                fz_reset(&f, call_seed(seed, op, i));
                int res = run_one(&f, op);
                if (only_i >= 0) describe(&f);
                if (res < 0) fail(&f, "buffer allocation failed");
                if (f.failed) {
                    char line[1200];
                    snprintf(line, sizeof line, "call %lld:%s: %s (replay: MLAF_FUZZ_SEED=%llu MLAF_FUZZ_ONLY=%s:%lld)", (long long)i,
                             f.mut[0] ? f.mut : " no mutation", f.why, (unsigned long long)seed, OPS[op], (long long)i);
                    if (failures < FZ_SHOW_FAILS) printf("  FUZZ(op=%s,backend=%s) %s\n", OP_NAMES[op], mlaf_backend_name(f.be), line);
                    if (!failures) snprintf(first, sizeof first, "%s", line);
                    failures++;
                } else if (res == 1) {
                    ok_calls++;
                } else {
                    rejected++;
                    if ((int)f.status > 0 && (int)f.status < MLAF_STATUS_COUNT_) by_status[f.status]++;
                }
            }
            fz_reset(&f, 0);
            char name[200];
            snprintf(name, sizeof name, "FUZZ(op=%s,calls=%lld,seed=%llu,backend=%s)", OP_NAMES[op],
                     (long long)(only_i >= 0 ? 1 : calls), (unsigned long long)seed, mlaf_backend_name(f.be));
            if (tl_case(failures == 0, name, "%lld of the calls failed; first: %s", (long long)failures, first)) {
                if (op == 4)
                    printf("  %lld helper calls, each status and result as the header says", (long long)ok_calls);
                else if (op > 4)
                    printf("  %lld succeeded with every write inside the views the header lets it write, %lld rejected with a "
                           "message and nothing written",
                           (long long)ok_calls, (long long)rejected);
                else
                    printf("  %lld succeeded and matched the oracle, %lld rejected with a message and nothing written",
                           (long long)ok_calls, (long long)rejected);
                for (int k = 1; k < MLAF_STATUS_COUNT_; k++)
                    if (by_status[k]) printf("%s %s %lld", k == 1 ? ":" : "", mlaf_status_name((mlaf_status)k) + 9, (long long)by_status[k]);
                printf("\n");
            }
        }
        mlaf_context_free(f.ctx);
    }
    mlaf_context_free(host);
    return tl_finish();
}
