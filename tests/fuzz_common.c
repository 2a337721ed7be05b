/*
 * fuzz_common.c — the fuzz tests' harness (see fuzz_common.h): buffers and views, the mutations
 * and judges, and the fills and checks the newer entry points share.
 */
#include "fuzz_common.h"

void fail(fz *f, const char *fmt, ...) {
    if (f->failed++) return; /* the first reason is the one reported */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->why, sizeof f->why, fmt, ap);
    va_end(ap);
}

void note(fz *f, const char *fmt, ...) {
    size_t n = strlen(f->mut);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->mut + n, sizeof f->mut - n, fmt, ap);
    va_end(ap);
}

void fz_reset(fz *f, uint64_t seed) {
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
int fz_buffer(fz *f, size_t bytes, int fill, mlaf_dtype dt, double scale) {
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
int64_t span_elems(const mlaf_tensor *t) {
    int64_t last = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 0) return 0;
        last += (t->shape[i] - 1) * t->stride[i];
    }
    return last + 1;
}

int is_empty(const mlaf_tensor *t) {
    for (int i = 0; i < t->ndim && i < MLAF_MAX_DIMS; i++)
        if (t->shape[i] == 0) return 1;
    return 0;
}

void fz_register(fz *f, fz_t *x) { f->ts[f->nt++] = x; }

/* A tensor in a buffer of its own: misaligned by 0..2 whole elements, a little slack after it. */
void fz_tensor(fz *f, fz_t *x, const char *name, mlaf_dtype dt, int ndim, const int64_t *shape,
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

void fz_2d(fz *f, fz_t *x, const char *name, mlaf_dtype dt, int64_t rows, int64_t cols, int64_t pad, int fill,
                  double scale, unsigned dtypes, unsigned fixed, int required, int output) {
    int64_t sh[2] = {rows, cols}, st[2] = {cols + pad, 1};
    fz_tensor(f, x, name, dt, 2, sh, st, fill, scale, dtypes, fixed, required, output);
}

void fz_1d(fz *f, fz_t *x, const char *name, mlaf_dtype dt, int64_t n, int fill, double scale, unsigned dtypes,
                  unsigned fixed, int required, int output) {
    int64_t sh[1] = {n}, st[1] = {1};
    fz_tensor(f, x, name, dt, 1, sh, st, fill, scale, dtypes, fixed, required, output);
}

/* An output given as the latent's own columns [col, col + width) (the in-place form). */
void fz_columns(fz *f, fz_t *x, const char *name, const fz_t *lat, int64_t col, int64_t width, unsigned fixed) {
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

void *host_ptr(const fz *f, const fz_t *x) { return x->buf >= 0 ? f->b[x->buf].init + x->boff : (void *)x->fake; }

/* Uploads every buffer and makes the device and host views; 0 on an allocation failure. */
int fz_commit(fz *f) {
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

int index_of(const fz *f, const fz_t *x) {
    for (int k = 0; k < f->nt; k++)
        if (f->ts[k] == x) return k;
    return -1;
}
const mlaf_tensor *DEV(fz *f, const fz_t *x) { return x->present ? &f->dev[index_of(f, x)] : NULL; }
const mlaf_tensor *HOST(fz *f, const fz_t *x) { return x->present ? &f->hst[index_of(f, x)] : NULL; }

void describe(const fz *f) {
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
unsigned char *body(const fz *f, int buf) { return (unsigned char *)f->b[buf].g.body; }

void claim(fz *f, int buf, int64_t byte, size_t n) {
    if (byte < 0 || (size_t)byte + n > f->b[buf].bytes) {
        fail(f, "an expected output byte %lld lies outside buffer %d", (long long)byte, buf);
        return;
    }
    memset(f->b[buf].claim + byte, 1, n);
}

/* Byte offset of element `e` (in elements from the view's start). */
int64_t at_byte(const fz_t *x, int64_t e) { return x->boff + e * (int64_t)mlaf_dtype_size(x->t.dtype); }

/* A computed value: within 1 unit of the oracle. */
void check_units(fz *f, const fz_t *x, int64_t e, double ref, const char *what, int64_t t, int64_t i) {
    const int64_t b = at_byte(x, e);
    claim(f, x->buf, b, mlaf_dtype_size(x->t.dtype));
    double got = mlaf_load_f32(body(f, x->buf) + b, x->t.dtype, 0);
    double u = mlaf_err_units(got, ref, x->t.dtype, fabs(ref));
    if (!(u <= 1.0))
        fail(f, "%s[%lld, %lld] = %.9g, expected %.9g (%.3g units of %s)", what, (long long)t, (long long)i, got, ref, u,
             mlaf_dtype_name(x->t.dtype));
}

/* An exactly known value (an fp32 result rounded once to the view's dtype, or a copy). */
void check_exact(fz *f, const fz_t *x, int64_t e, float want, const char *what, int64_t t, int64_t i) {
    const int64_t b = at_byte(x, e);
    const size_t es = mlaf_dtype_size(x->t.dtype);
    claim(f, x->buf, b, es);
    unsigned char w[8];
    mlaf_store_f32(w, x->t.dtype, 0, want);
    if (memcmp(w, body(f, x->buf) + b, es) != 0)
        fail(f, "%s[%lld, %lld] = %.9g, expected %.9g bit for bit (%s)", what, (long long)t, (long long)i,
             (double)mlaf_load_f32(body(f, x->buf) + b, x->t.dtype, 0), (double)want, mlaf_dtype_name(x->t.dtype));
}

void check_count(fz *f, const fz_t *ec, int64_t bad) {
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
void check_untouched(fz *f) {
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
void rope_f32(const float *x, int32_t R, mlaf_rope_style style, const float *cs, float *y) {
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
fz_t *pick(fz *f, int (*ok)(const fz_t *)) {
    fz_t *c[FZ_MAXT];
    int n = 0;
    for (int k = 0; k < f->nt; k++)
        if (f->ts[k]->present && f->ts[k]->checked && !f->ts[k]->touched && ok(f->ts[k])) c[n++] = f->ts[k];
    if (!n) return NULL;
    fz_t *x = c[U(&f->r, (uint64_t)n)];
    x->touched = 1;
    return x;
}
int any_t(const fz_t *x) { (void)x; return 1; }
int nonempty_t(const fz_t *x) { return x->buf >= 0 && !is_empty(&x->t); }
int fixed_t(const fz_t *x) { return (x->fixed & ((1u << x->t.ndim) - 1u)) != 0; }
int inner_t(const fz_t *x) { return x->t.shape[x->t.ndim - 1] > 1; }
int outer_t(const fz_t *x) { return x->t.ndim >= 2; }
int rows_t(const fz_t *x) { return x->t.ndim >= 2 && x->t.shape[x->t.ndim - 2] > 1 && x->t.shape[x->t.ndim - 1] > 0; }
int blocks_t(const fz_t *x) { return x->t.ndim == 3 && x->t.shape[0] > 1 && x->t.shape[1] > 0 && x->t.shape[2] > 0; }
int required_t(const fz_t *x) { return x->required; }
int output_t(const fz_t *x) { return x->output && nonempty_t(x); }

/* Is `o` exactly the latent's columns (the in-place form the norm ops accept)? */
int exact_columns(const fz_t *o, const fz_t *lat, int64_t Q, int64_t C) {
    if (!lat || o->buf != lat->buf || o->t.dtype != lat->t.dtype || o->t.ndim != 2 || o->t.shape[0] != lat->t.shape[0]) return 0;
    if (o->t.shape[0] > 1 && o->t.stride[0] != lat->t.stride[0]) return 0;
    int64_t d = (o->boff - lat->boff) / (int64_t)mlaf_dtype_size(lat->t.dtype);
    if ((o->boff - lat->boff) % (int64_t)mlaf_dtype_size(lat->t.dtype)) return 0;
    return d == 0 || d == Q || d == Q + C;
}


/* One mutation the contract forbids (or, for a huge shape, allows only on an empty view).
 * Returns 0 when the drawn kind does not apply to this call. */
int mutate_once(fz *f, param_mutator pm, void *params, const fz_t *lat, int64_t Q, int64_t C) {
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

void mutate(fz *f, param_mutator pm, void *params, const fz_t *lat, int64_t Q, int64_t C) {
    int want = CHANCE(&f->r, 0.38) ? 0 : (CHANCE(&f->r, 0.8) ? 1 : 2);
    for (int n = 0, tries = 0; n < want && tries < 30; tries++)
        if (mutate_once(f, pm, params, lat, Q, C)) n++, f->mutated = 1;
}

/* ---- the common frame of one op call --------------------------------------------------- */
void set_state(fz *f) {
    /* threads and CPU path per call, so that one call replays alone exactly */
    mlaf_context_set_threads(f->ctx, (int)RANGE(&f->r, 0, 4));
    mlaf_context_set_cpu_isa(f->ctx, (mlaf_cpu_isa)RANGE(&f->r, 0, MLAF_CPU_ISA_COUNT_ - 1));
}

/* After the call: its status must be MLAF_OK or a named error; an error leaves everything as
 * it was. Returns 1 when the call succeeded and the outputs are to be judged. */
int judge_status(fz *f, mlaf_status st) {
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


int64_t draw_T(mlaf_rng *r) {
    double u = mlaf_rng_uniform(r);
    return u < 0.06 ? 0 : u < 0.2 ? 1 : RANGE(r, 2, 24);
}
/* ---- the newer entry points: rope_q_out / head_norm, indexer_q, moe_gate_hash, the DSA key
 * branch of mla_kv_cache_dsa, and kv_rope_tail into the fp8_v4 cache ------------------------
 * These judge a success by where it wrote, not by its values (test_indexer, test_v4_attn,
 * test_moe_gate_hash and test_rope_q_out hold the value oracles): every byte outside the views
 * the op may write stays as it was, the guards hold, the rows of a token the header says is not
 * written stay as they were, error_count is its start + the bad tokens where the header defines
 * it, rope_q_out's padding heads are +0.0 and moe_gate_hash's ids are the table's (or 0 .. k-1
 * for a bad row). A valid call (no mutation) must succeed. */
void set_idx(fz *f, const fz_t *x, int64_t i, int64_t v) {
    unsigned char *p = f->b[x->buf].init + x->boff;
    if (x->t.dtype == MLAF_I32) {
        int32_t w = (int32_t)v;
        memcpy(p + 4 * i * x->t.stride[0], &w, 4);
    } else {
        memcpy(p + 8 * i * x->t.stride[0], &v, 8);
    }
}
int64_t get_idx(const unsigned char *p, mlaf_dtype dt, int64_t e) {
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
void claim_rows(fz *f, const fz_t *x, int64_t t0, int64_t t1) {
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
void claim_all(fz *f, const fz_t *x) { claim_rows(f, x, 0, x->present && x->t.ndim ? x->t.shape[0] : 0); }

/* A valid call must succeed; the status frame of judge_status otherwise. */
int judge_new(fz *f, mlaf_status st) {
    if (st != MLAF_OK && !f->mutated)
        fail(f, "a valid call was rejected: %s: %s", mlaf_status_name(st), mlaf_context_last_error(f->ctx));
    return judge_status(f, st);
}

void fill_table(fz *f, const fz_t *cs, int64_t max_pos, int32_t R) {
    float *tab = (float *)malloc(sizeof(float) * (size_t)(max_pos * R));
    mlaf_rope_table_init(tab, max_pos, R, 10000.0);
    for (int64_t p = 0; p < max_pos; p++)
        memcpy(f->b[cs->buf].init + cs->boff + p * cs->t.stride[0] * 4, tab + p * R, sizeof(float) * (size_t)R);
    free(tab);
}

/* positions: ~10% outside [0, max_pos); returns the count of bad ones among the first T. */
int64_t fill_positions(fz *f, const fz_t *pos, int64_t T, int64_t max_pos) {
    int64_t bad = 0;
    for (int64_t t = 0; t < T; t++) {
        int64_t p = CHANCE(&f->r, 0.1) ? (CHANCE(&f->r, 0.5) ? -RANGE(&f->r, 1, 3) : max_pos + (int64_t)U(&f->r, 3))
                                       : (int64_t)U(&f->r, (uint64_t)max_pos);
        bad += p < 0 || p >= max_pos;
        set_idx(f, pos, t, p);
    }
    return bad;
}
void fill_slots(fz *f, const fz_t *slot, int64_t N, int64_t nslots) {
    int64_t next = (int64_t)U(&f->r, 3);
    for (int64_t t = 0; t < N; t++) {
        double u = mlaf_rng_uniform(&f->r);
        int64_t s = u < 0.15 ? -RANGE(&f->r, 1, 4) : u < 0.25 ? nslots + (int64_t)U(&f->r, 4) : (next < nslots ? next++ : -1);
        set_idx(f, slot, t, s);
    }
}
void add_error_count(fz *f, fz_t *ec) {
    fz_1d(f, ec, "error_count", MLAF_I32, 1, 0, 0, DTM(MLAF_I32), 1u, 0, 1);
    int32_t start = (int32_t)U(&f->r, 1000);
    memcpy(f->b[ec->buf].init + ec->boff, &start, 4);
}
int64_t bad_positions(fz *f, const fz_t *pos, int64_t T, int64_t max_pos, int64_t t, int *is_bad) {
    (void)T;
    int64_t p = get_idx(f->b[pos->buf].init + pos->boff, pos->t.dtype, t * pos->t.stride[0]);
    *is_bad = p < 0 || p >= max_pos;
    return p;
}

/* -- indexer_q and mla_kv_cache_dsa: the indexer parameters -- */
int indexer_params_mutate(fz *f, mlaf_indexer_params *ip) {
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
mlaf_indexer_params draw_ip(mlaf_rng *r) {
    mlaf_indexer_params ip = {CHANCE(r, 0.5) ? MLAF_ROPE_INTERLEAVED : MLAF_ROPE_NEOX, (int32_t)U(r, 2), 1e-6f,
                              CHANCE(r, 0.5) ? 1e-4f : 1e-30f, CHANCE(r, 0.5) ? MLAF_INDEX_SCALE_UE8M0 : MLAF_INDEX_SCALE_F32};
    return ip;
}

/* -- moe_gate and moe_gate_hash: the router parameters -- */
int gate_params_mutate(fz *f, void *vp) {
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
