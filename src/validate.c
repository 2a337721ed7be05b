/*
 * validate.c — the one validation layer every backend goes through.
 *
 * Each mlaf_check_* looks only at metadata (never at tensor contents, which may live on a
 * device) and either fills a job or records a message naming the argument and what was
 * expected. Order of checks per tensor: present, dtype, rank, shape, strides, data pointer,
 * alignment; then overlaps between outputs and everything else.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "kv_format.h"
#include "score.h"
#include "validate_common.h"

static const char *dtype_list(unsigned mask, char *buf, size_t cap) {
    const char *names[8];
    int n = 0;
    for (int d = 0; d < MLAF_DTYPE_COUNT_; d++)
        if (mask & (1u << d)) names[n++] = mlaf_dtype_name((mlaf_dtype)d);
    buf[0] = '\0';
    for (int i = 0; i < n; i++) {
        size_t len = strlen(buf);
        snprintf(buf + len, cap - len, "%s%s", i == 0 ? "" : (i == n - 1 ? " or " : ", "),
                 names[i]);
    }
    return buf;
}

/* No element at all: some extent is 0. (Never formed as a product, which may not fit.) */
static int is_empty(const mlaf_tensor *t) {
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] == 0) return 1;
    return 0;
}

/* a * b for a, b >= 0; 0 when the product does not fit below `cap`. */
static int mul_below(int64_t a, int64_t b, int64_t cap, int64_t *out) {
    if (a != 0 && b > cap / a) return 0;
    if (a * b >= cap) return 0;
    *out = a * b;
    return 1;
}

/* Checks everything about one tensor that does not depend on other tensors.
 * shape[i] < 0 in `want` means "any extent" for that dim. */
static mlaf_status check_tensor(mlaf_context *ctx, const mlaf_tensor *t, const char *name,
                                unsigned dtypes, int ndim, const int64_t *want,
                                const char *const *want_expr) {
    char buf[64];
    if (!t) return mlaf_fail(ctx, MLAF_ERR_NULL_POINTER, "%s is NULL (required)", name);
    if ((unsigned)t->dtype >= MLAF_DTYPE_COUNT_ || !(dtypes & DT_(t->dtype)))
        return mlaf_fail(ctx, MLAF_ERR_DTYPE, "%s.dtype = %s, expected %s", name,
                         mlaf_dtype_name(t->dtype), dtype_list(dtypes, buf, sizeof buf));
    if (t->ndim != ndim)
        return mlaf_fail(ctx, MLAF_ERR_SHAPE, "%s.ndim = %d, expected %d", name, (int)t->ndim,
                         ndim);
    for (int i = 0; i < ndim; i++) {
        if (t->shape[i] < 0)
            return mlaf_fail(ctx, MLAF_ERR_SHAPE, "%s.shape[%d] = %lld, expected >= 0", name, i,
                             (long long)t->shape[i]);
        if (want && want[i] >= 0 && t->shape[i] != want[i]) {
            if (want_expr && want_expr[i])
                return mlaf_fail(ctx, MLAF_ERR_SHAPE, "%s.shape[%d] = %lld, expected %s = %lld",
                                 name, i, (long long)t->shape[i], want_expr[i],
                                 (long long)want[i]);
            return mlaf_fail(ctx, MLAF_ERR_SHAPE, "%s.shape[%d] = %lld, expected %lld", name, i,
                             (long long)t->shape[i], (long long)want[i]);
        }
    }
    /* Innermost dim contiguous; outer strides non-negative and large enough that the dims
     * inside them do not overlap (checked per dim against the extent of the next inner one). */
    if (t->shape[ndim - 1] > 1 && t->stride[ndim - 1] != 1)
        return mlaf_fail(ctx, MLAF_ERR_STRIDE,
                         "%s.stride[%d] = %lld, expected 1 (elements inside a row are contiguous)",
                         name, ndim - 1, (long long)t->stride[ndim - 1]);
    for (int i = ndim - 2; i >= 0; i--) {
        if (t->stride[i] < 0)
            return mlaf_fail(ctx, MLAF_ERR_STRIDE, "%s.stride[%d] = %lld, expected >= 0", name, i,
                             (long long)t->stride[i]);
    }
    if (ndim >= 2 && t->shape[ndim - 2] > 1 && t->stride[ndim - 2] < t->shape[ndim - 1])
        return mlaf_fail(ctx, MLAF_ERR_STRIDE, "%s.stride[%d] = %lld, expected >= %s width %lld",
                         name, ndim - 2, (long long)t->stride[ndim - 2], "the row",
                         (long long)t->shape[ndim - 1]);
    /* Every outer step below 2^62 bytes: the kernels form (index * stride) * element size in
     * int64, and dims of extent 1 keep their stride in the job too. */
    const int64_t es = (int64_t)mlaf_dtype_size(t->dtype);
    const int64_t cap = MLAF_MAX_VIEW_BYTES / es; /* in elements */
    for (int i = 0; i < ndim - 1; i++) {
        if (t->stride[i] >= cap)
            return mlaf_fail(ctx, MLAF_ERR_LIMIT,
                             "%s.stride[%d] = %lld elements of %lld bytes, expected a step of "
                             "< 2^62 bytes",
                             name, i, (long long)t->stride[i], (long long)es);
    }
    if (ndim == 3 && t->shape[0] > 1 && t->shape[1] > 0) {
        /* The two outer dims, in either order of strides, must not make rows collide. Each
         * product is checked: one that does not fit asks for a stride no view can have. */
        int64_t s0 = t->stride[0], s1 = t->stride[1], n0 = t->shape[0], n1 = t->shape[1];
        int64_t w = t->shape[2], need;
        int ok;
        if (n1 <= 1)
            ok = s0 >= w;
        else if (s0 >= s1)
            ok = mul_below(n1 - 1, s1, cap, &need) && s0 - w >= need;
        else
            ok = mul_below(n0 - 1, s0, cap, &need) && s1 - w >= need && s0 >= w;
        if (!ok)
            return mlaf_fail(ctx, MLAF_ERR_STRIDE,
                             "%s.stride = (%lld, %lld, 1) makes rows of shape (%lld, %lld, %lld) "
                             "overlap",
                             name, (long long)s0, (long long)s1, (long long)n0, (long long)n1,
                             (long long)w);
    }
    if (!is_empty(t)) {
        /* The bytes from the first element to one past the last, below 2^62: then the spans,
         * offsets and pointer sums used here and in the kernels are exact. */
        int64_t last = 0, term;
        int fits = 1;
        for (int i = 0; i < ndim && fits; i++) {
            if (t->shape[i] <= 1) continue; /* its stride is never stepped */
            fits = mul_below(t->shape[i] - 1, t->stride[i], cap, &term) && last < cap - term;
            if (fits) last += term;
        }
        if (!fits || last + 1 >= cap) {
            char dims[128];
            int n = 0;
            for (int i = 0; i < ndim; i++)
                n += snprintf(dims + n, sizeof dims - (size_t)n, "%s%lld", i ? ", " : "",
                              (long long)t->shape[i]);
            return mlaf_fail(ctx, MLAF_ERR_LIMIT,
                             "%s of shape (%s) spans 2^62 bytes or more, expected less (the "
                             "most one view may address)",
                             name, dims);
        }
        if (!t->data) return mlaf_fail(ctx, MLAF_ERR_NULL_POINTER, "%s.data is NULL", name);
        if ((uintptr_t)t->data % (uintptr_t)es != 0)
            return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                             "%s.data = %p is not aligned to its element size (%lld bytes)", name,
                             t->data, (long long)es);
        if ((uintptr_t)t->data > UINTPTR_MAX - (uintptr_t)((last + 1) * es))
            return mlaf_fail(ctx, MLAF_ERR_LIMIT,
                             "%s.data = %p: its %lld bytes run past the end of the address space",
                             name, t->data, (long long)((last + 1) * es));
    }
    return MLAF_OK;
}

/* ---- overlap --------------------------------------------------------------------------- */

typedef struct span {
    uintptr_t lo, hi; /* [lo, hi) bytes touched, hi == lo when empty */
} span;

static span span_of(const mlaf_tensor *t) {
    span s = {0, 0};
    if (!t || !t->data || is_empty(t)) return s;
    size_t es = mlaf_dtype_size(t->dtype);
    int64_t last = 0;
    for (int i = 0; i < t->ndim; i++) last += (t->shape[i] - 1) * t->stride[i];
    s.lo = (uintptr_t)t->data;
    s.hi = s.lo + (uintptr_t)((last + 1) * (int64_t)es);
    return s;
}

static uint64_t gcd_u64(uint64_t a, uint64_t b) {
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* The byte step of every stepped outer dim (extent > 1) of t folded into *g by gcd; 0 when
 * t's innermost dim is not one contiguous row (then no row pitch applies). */
static int fold_outer_pitch(const mlaf_tensor *t, uint64_t *g) {
    const int64_t es = (int64_t)mlaf_dtype_size(t->dtype);
    if (t->shape[t->ndim - 1] > 1 && t->stride[t->ndim - 1] != 1) return 0;
    for (int i = 0; i < t->ndim - 1; i++)
        if (t->shape[i] > 1) *g = gcd_u64(*g, (uint64_t)(t->stride[i] * es)); /* < 2^62: checked */
    return 1;
}

/* 1 if the two views may share a byte, decided on the bytes their elements reach.
 *
 * First the spans [first byte, one past the last byte]: apart, the views are disjoint. Else
 * the rows: each view is rows of w contiguous bytes (its innermost dim) whose starts differ
 * from its data pointer by multiples of its outer dims' byte steps. Let P be the gcd of every
 * stepped outer byte step of both views. Modulo P, every byte of a lies in [a, a + wa) and
 * every byte of b in [b, b + wb) (a, b the data pointers): when those two ranges of residues
 * are apart (wa + wb <= P and b - a mod P in [wa, P - wb]), no byte of a can equal a byte of
 * b, whatever the shapes and strides. This is exact for column slices of one buffer (the same
 * outer strides, the column ranges apart: a cache and its kpe, q / kv / pe of one latent) and
 * for rows interleaved by a common pitch; it is conservative (reports an overlap) for views
 * that are disjoint only by which whole rows they take under different pitches, e.g. rows
 * {0, 1, 4, 5} and {2, 3, 6, 7} of one buffer as [2, 2, w] views. */
static int views_overlap(const mlaf_tensor *a, const mlaf_tensor *b) {
    span sa = span_of(a), sb = span_of(b);
    if (sa.lo == sa.hi || sb.lo == sb.hi) return 0;
    if (sa.hi <= sb.lo || sb.hi <= sa.lo) return 0;
    uint64_t P = 0;
    if (!fold_outer_pitch(a, &P) || !fold_outer_pitch(b, &P) || P == 0) return 1;
    /* Row widths in bytes (checked views: below 2^62, exact). */
    const uint64_t wa = (uint64_t)a->shape[a->ndim - 1] * mlaf_dtype_size(a->dtype);
    const uint64_t wb = (uint64_t)b->shape[b->ndim - 1] * mlaf_dtype_size(b->dtype);
    if (wa > P || wb > P - wa) return 1;
    /* b's start after a's, modulo P, in [0, P) (no unsigned wrap: 2^64 is no multiple of P) */
    const uint64_t d = sb.lo >= sa.lo ? (uint64_t)(sb.lo - sa.lo) % P
                                      : (P - (uint64_t)(sa.lo - sb.lo) % P) % P;
    return !(d >= wa && d <= P - wb);
}

static mlaf_status no_overlap(mlaf_context *ctx, const mlaf_tensor *out, const char *out_name,
                              const mlaf_tensor *other, const char *other_name) {
    if (out && other && views_overlap(out, other))
        return mlaf_fail(ctx, MLAF_ERR_OVERLAP, "%s overlaps %s", out_name, other_name);
    return MLAF_OK;
}

/* The exact in-place form: `out` is the latent's own columns [col, col + width). */
static int is_latent_columns(const mlaf_tensor *out, const mlaf_tensor *latent, int64_t col) {
    if (!out || !latent || out->dtype != latent->dtype) return 0;
    if (out->shape[0] != latent->shape[0]) return 0;
    if (out->shape[0] > 1 && out->stride[0] != latent->stride[0]) return 0;
    return (char *)out->data == (char *)latent->data + col * (int64_t)mlaf_dtype_size(latent->dtype);
}

static mlaf_status check_eps(mlaf_context *ctx, const char *name, float eps) {
    if (!(isfinite(eps) && eps > 0.0f))
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT, "%s = %g, expected finite and > 0",
                         name, (double)eps);
    return MLAF_OK;
}

static mlaf_status check_tokens(mlaf_context *ctx, const mlaf_tensor *t, const char *name) {
    if (t->shape[0] >= ((int64_t)1 << 31))
        return mlaf_fail(ctx, MLAF_ERR_LIMIT, "%s.shape[0] = %lld tokens, expected < 2^31", name,
                         (long long)t->shape[0]);
    return MLAF_OK;
}

/* ---- split_qk_norm and the norm part of mla_kv_cache ------------------------------------ */

static mlaf_status check_norm_part(mlaf_context *ctx, int32_t Q, int32_t C, int32_t R, float eps_q,
                                   float eps_kv, const mlaf_tensor *latent,
                                   const mlaf_tensor *w_q, const mlaf_tensor *w_kv,
                                   const mlaf_tensor *q, int q_required, const mlaf_tensor *k_nope,
                                   int k_nope_required, const mlaf_tensor *k_pe,
                                   mlaf_norm_job *job) {
    if (Q < 0)
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                         "q_lora_rank = %d, expected >= 0 (0 = no q LoRA)", Q);
    if (C <= 0)
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT, "kv_lora_rank = %d, expected > 0", C);
    if (R < 0)
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT, "rope_dim = %d, expected >= 0", R);
    if ((int64_t)Q + C + R > ((int64_t)1 << 20))
        return mlaf_fail(ctx, MLAF_ERR_LIMIT,
                         "q_lora_rank + kv_lora_rank + rope_dim = %lld, expected <= 1048576",
                         (long long)Q + C + R);
    if (Q > 0) TRY(check_eps(ctx, "eps_q", eps_q));
    TRY(check_eps(ctx, "eps_kv", eps_kv));

    static const char *const latent_expr[2] = {NULL, "q_lora_rank + kv_lora_rank + rope_dim"};
    int64_t want[3] = {-1, (int64_t)Q + C + R, -1};
    TRY(check_tensor(ctx, latent, "latent", DT_FLOAT, 2, want, latent_expr));
    TRY(check_tokens(ctx, latent, "latent"));
    int64_t T = latent->shape[0];
    mlaf_dtype dt = latent->dtype;
    unsigned wdt = DT_(dt) | DT_(MLAF_F32);

    static const char *const wq_expr[1] = {"q_lora_rank"};
    static const char *const wkv_expr[1] = {"kv_lora_rank"};
    if (Q > 0) {
        want[0] = Q;
        TRY(check_tensor(ctx, w_q, "w_q", wdt, 1, want, wq_expr));
    } else if (w_q) {
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                         "w_q is given but q_lora_rank = 0 (no q part); pass NULL");
    }
    want[0] = C;
    TRY(check_tensor(ctx, w_kv, "w_kv", wdt, 1, want, wkv_expr));

    static const char *const q_expr[2] = {"latent.shape[0]", "q_lora_rank"};
    static const char *const kn_expr[2] = {"latent.shape[0]", "kv_lora_rank"};
    static const char *const kp_expr[2] = {"latent.shape[0]", "rope_dim"};
    unsigned odt = DT_(dt);
    if (Q > 0 && (q || q_required)) {
        int64_t wq[2] = {T, Q};
        TRY(check_tensor(ctx, q, "q", odt, 2, wq, q_expr));
    } else if (Q == 0 && q) {
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                         "q is given but q_lora_rank = 0 (no q part); pass NULL");
    }
    if (k_nope || k_nope_required) {
        int64_t wk[2] = {T, C};
        TRY(check_tensor(ctx, k_nope, "k_nope", odt, 2, wk, kn_expr));
    }
    if (k_pe) {
        int64_t wp[2] = {T, R};
        TRY(check_tensor(ctx, k_pe, "k_pe", odt, 2, wp, kp_expr));
    }

    /* Overlaps: each output is either exactly its own latent columns or disjoint from
     * every input and every other output. */
    const mlaf_tensor *outs[3] = {Q > 0 ? q : NULL, k_nope, k_pe};
    const char *out_names[3] = {"q", "k_nope", "k_pe"};
    int64_t cols[3] = {0, Q, (int64_t)Q + C};
    for (int i = 0; i < 3; i++) {
        if (!outs[i]) continue;
        if (!is_latent_columns(outs[i], latent, cols[i]))
            TRY(no_overlap(ctx, outs[i], out_names[i], latent,
                           "latent (only the exact in-place form may: the output's own "
                           "latent columns with the latent's row stride)"));
        TRY(no_overlap(ctx, outs[i], out_names[i], w_q, "w_q"));
        TRY(no_overlap(ctx, outs[i], out_names[i], w_kv, "w_kv"));
        for (int j = i + 1; j < 3; j++)
            if (outs[j]) TRY(no_overlap(ctx, outs[i], out_names[i], outs[j], out_names[j]));
    }

    memset(job, 0, sizeof *job);
    job->T = T;
    job->Q = Q;
    job->C = C;
    job->R = R;
    job->eps_q = eps_q;
    job->eps_kv = eps_kv;
    job->dt = dt;
    job->latent = latent->data;
    job->latent_stride = latent->stride[0];
    job->w_q = Q > 0 ? w_q->data : NULL;
    job->w_q_dt = Q > 0 ? w_q->dtype : dt;
    job->w_kv = w_kv->data;
    job->w_kv_dt = w_kv->dtype;
    if (Q > 0 && q) {
        job->q = q->data;
        job->q_stride = q->stride[0];
    }
    if (k_nope) {
        job->k_nope = k_nope->data;
        job->k_nope_stride = k_nope->stride[0];
    }
    if (k_pe) {
        job->k_pe = k_pe->data;
        job->k_pe_stride = k_pe->stride[0];
    }
    return MLAF_OK;
}

mlaf_status mlaf_check_split_qk_norm_q(mlaf_context *ctx, const mlaf_split_qk_norm_params *p,
                                       const mlaf_tensor *latent, const mlaf_tensor *w_q,
                                       const mlaf_tensor *w_kv, const mlaf_tensor *q,
                                       const mlaf_tensor *k_nope, const mlaf_tensor *k_pe,
                                       const mlaf_row_quant *rq, mlaf_norm_job *job) {
    if (!p) return mlaf_fail(ctx, MLAF_ERR_NULL_POINTER, "params is NULL (required)");
    if (p->kv_rope_tail != 0)
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                         "kv_rope_tail = %d, expected 0 for split_qk_norm (it has no positions to rotate "
                         "with; mla_kv_cache takes kv_rope_tail)",
                         p->kv_rope_tail);
    TRY(check_norm_part(ctx, p->q_lora_rank, p->kv_lora_rank, p->rope_dim, p->eps_q, p->eps_kv, latent, w_q,
                        w_kv, q, !rq || !rq->q.format, k_nope, !rq || !rq->k_nope.format, k_pe, job));
    const mlaf_tensor *all[6] = {latent, w_q, w_kv, q, k_nope, k_pe};
    static const char *const names[6] = {"latent", "w_q", "w_kv", "q", "k_nope", "k_pe"};
    return mlaf_check_row_quant(ctx, rq, 0, all, names, 6, job);
}

mlaf_status mlaf_check_split_qk_norm(mlaf_context *ctx, const mlaf_split_qk_norm_params *p,
                                     const mlaf_tensor *latent, const mlaf_tensor *w_q,
                                     const mlaf_tensor *w_kv, const mlaf_tensor *q,
                                     const mlaf_tensor *k_nope, const mlaf_tensor *k_pe,
                                     mlaf_norm_job *job) {
    return mlaf_check_split_qk_norm_q(ctx, p, latent, w_q, w_kv, q, k_nope, k_pe, NULL, job);
}

/* ---- RoPE inputs ----------------------------------------------------------------------- */

static mlaf_status check_rope_style(mlaf_context *ctx, mlaf_rope_style style) {
    if (style != MLAF_ROPE_INTERLEAVED && style != MLAF_ROPE_NEOX && style != MLAF_ROPE_NONE)
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                         "rope style = %d, expected 0 (interleaved), 1 (neox) or 2 (none)", (int)style);
    return MLAF_OK;
}

static mlaf_status check_rope_inputs(mlaf_context *ctx, int32_t R, mlaf_rope_style style,
                                     int64_t T, const mlaf_tensor *positions,
                                     const mlaf_tensor *cos_sin, mlaf_rope_job *rope) {
    TRY(check_rope_style(ctx, style));
    if (R % 2 != 0)
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT, "rope_dim = %d, expected even", R);
    static const char *const pos_expr[1] = {"tokens"};
    static const char *const cs_expr[2] = {NULL, "rope_dim"};
    int64_t wp[1] = {T};
    const int none = style == MLAF_ROPE_NONE; /* not read: optional, checked when given */
    if (!none || positions) TRY(check_tensor(ctx, positions, "positions", DT_INDEX, 1, wp, pos_expr));
    int64_t wc[2] = {-1, R};
    if (!none || cos_sin) {
        TRY(check_tensor(ctx, cos_sin, "cos_sin", DT_(MLAF_F32), 2, wc, cs_expr));
        if (cos_sin->shape[0] < 1)
            return mlaf_fail(ctx, MLAF_ERR_SHAPE, "cos_sin.shape[0] = %lld, expected >= 1 (max_pos)",
                             (long long)cos_sin->shape[0]);
    }
    rope->R = R;
    rope->style = style;
    if (none) {
        rope->positions = NULL, rope->pos_dt = MLAF_I32;
        rope->cos_sin = NULL, rope->cos_sin_stride = 0, rope->max_pos = 0;
        return MLAF_OK;
    }
    rope->positions = positions->data;
    rope->pos_dt = positions->dtype;
    rope->cos_sin = (const float *)cos_sin->data;
    rope->cos_sin_stride = cos_sin->stride[0];
    rope->max_pos = cos_sin->shape[0];
    return MLAF_OK;
}

static mlaf_status check_error_count(mlaf_context *ctx, const mlaf_tensor *ec) {
    if (!ec) return MLAF_OK;
    int64_t w[1] = {1};
    return check_tensor(ctx, ec, "error_count", DT_(MLAF_I32), 1, w, NULL);
}

/* ---- mla_kv_cache ---------------------------------------------------------------------- */

/* One [num_blocks, block_size, width] cache view of dtypes `dts` (width < 0: any). */
static mlaf_status check_cache_view(mlaf_context *ctx, const mlaf_tensor *t, const char *name, unsigned dts,
                                    int64_t width, const char *width_expr) {
    const char *const expr[3] = {NULL, NULL, width_expr};
    int64_t w[3] = {-1, -1, width};
    TRY(check_tensor(ctx, t, name, dts, 3, w, expr));
    if (t->shape[1] < 1)
        return mlaf_fail(ctx, MLAF_ERR_SHAPE, "%s.shape[1] = %lld, expected >= 1 (block_size)", name,
                         (long long)t->shape[1]);
    return MLAF_OK;
}

static mlaf_status check_scalar_f32(mlaf_context *ctx, const mlaf_tensor *t, const char *name) {
    int64_t w[1] = {1};
    return check_tensor(ctx, t, name, DT_(MLAF_F32), 1, w, NULL);
}

int64_t mlaf_kv_record_bytes(mlaf_kv_format f, mlaf_dtype dt, int32_t C, int32_t R) {
    const mlaf_kv_format_info *k = mlaf_kv_format_row(f);
    if (!k || C <= 0 || R < 0 || R % 2 != 0 || (int64_t)C + R > ((int64_t)1 << 20)) return 0;
    return (unsigned)dt < MLAF_DTYPE_COUNT_ && (k->cache_dtypes & DT_(dt)) ? k->record_bytes(dt, C, R) : 0;
}

/* The cache description of mla_kv_cache (docs/kv_formats.md), into the job: the rules every format
 * shares, by its row's flags, then the row's own (kv_format.c). */
static mlaf_status check_cache_desc(mlaf_context *ctx, const mlaf_kv_cache_desc *d, int32_t C, int32_t R,
                                    int32_t tail, mlaf_dtype latent_dt, mlaf_kv_cache_job *j) {
    if (!d) return mlaf_fail(ctx, MLAF_ERR_NULL_POINTER, "cache (the cache description) is NULL (required)");
    char list[160];
    const mlaf_kv_format f = d->format;
    const mlaf_kv_format_info *k = mlaf_kv_format_row(f);
    if (!k)
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT, "cache.format = %d, expected %s", (int)f,
                         mlaf_kv_format_list(0, list, sizeof list, 1));
    const char *fn = k->name;
    const int scaled = (k->flags & MLAF_KVF_SCALE) != 0;
    if (!scaled && d->scale)
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT, "cache.scale is given, but format %s takes none", fn);
    if (!scaled && d->amax_out)
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT, "cache.amax_out is given, but format %s takes none", fn);
    if (!(k->flags & MLAF_KVF_KPE) && d->kpe)
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                         "cache.kpe is given, but %s keeps the rope part inside its record", fn);
    if (tail > 0 && !(k->flags & MLAF_KVF_TAIL))
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                         "kv_rope_tail = %d with cache format %s, expected 0 (a rope tail inside the kv part "
                         "goes to format %s)",
                         tail, fn, mlaf_kv_format_list(MLAF_KVF_TAIL, list, sizeof list, 0));
    if (d->kpe && R == 0)
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT, "cache.kpe is given, but rope_dim = 0");
    if ((k->flags & MLAF_KVF_BF16_LATENT) && latent_dt != MLAF_BF16)
        return mlaf_fail(ctx, MLAF_ERR_DTYPE, "latent.dtype = %s, expected bf16 for cache format %s",
                         mlaf_dtype_name(latent_dt), fn);
    if (k->check_dims) TRY(k->check_dims(ctx, C, R, tail));
    TRY(k->check_cache(ctx, d->cache, d->kpe, C, R));
    if (d->kpe) {
        TRY(check_cache_view(ctx, d->kpe, "kpe", k->cache_dtypes, R, "rope_dim"));
        if (d->kpe->dtype != d->cache->dtype)
            return mlaf_fail(ctx, MLAF_ERR_DTYPE, "kpe.dtype = %s, expected kv_cache's dtype %s",
                             mlaf_dtype_name(d->kpe->dtype), mlaf_dtype_name(d->cache->dtype));
        for (int i = 0; i < 2; i++)
            if (d->kpe->shape[i] != d->cache->shape[i])
                return mlaf_fail(ctx, MLAF_ERR_SHAPE, "kpe.shape[%d] = %lld, expected kv_cache.shape[%d] = %lld", i,
                                 (long long)d->kpe->shape[i], i, (long long)d->cache->shape[i]);
    }
    if (scaled) {
        if (!d->scale)
            return mlaf_fail(ctx, MLAF_ERR_NULL_POINTER, "cache.scale is NULL (required by format %s: [1] f32)", fn);
        TRY(check_scalar_f32(ctx, d->scale, "scale"));
        if (d->conv != MLAF_FP8_DIV && d->conv != MLAF_FP8_MUL)
            return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                             "cache.conv = %d, expected 0 (divide by scale) or 1 (multiply by scale)", (int)d->conv);
        if (d->amax_out) TRY(check_scalar_f32(ctx, d->amax_out, "amax_out"));
    }
    if ((k->flags & MLAF_KVF_TILE_SCALE) && (unsigned)d->tile_scale > MLAF_TILE_UE8M0_FLOOR_SCALED)
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                         "cache.tile_scale = %d, expected 0 (amax), 1 (ue8m0) or 2 (ue8m0_floor_scaled)",
                         (int)d->tile_scale);
    const mlaf_tensor *c = d->cache;
    j->format = f;
    j->cache = c->data;
    j->cache_dt = c->dtype;
    j->num_blocks = c->shape[0];
    j->block_size = c->shape[1];
    j->cache_s0 = c->stride[0];
    j->cache_s1 = c->stride[1];
    j->kpe = d->kpe ? d->kpe->data : NULL;
    j->kpe_s0 = d->kpe ? d->kpe->stride[0] : 0;
    j->kpe_s1 = d->kpe ? d->kpe->stride[1] : 0;
    j->scale = scaled ? (const float *)d->scale->data : NULL;
    j->conv = scaled ? d->conv : MLAF_FP8_DIV;
    j->amax_out = scaled && d->amax_out ? (float *)d->amax_out->data : NULL;
    j->tile_scale = k->flags & MLAF_KVF_TILE_SCALE ? d->tile_scale : MLAF_TILE_AMAX;
    return MLAF_OK;
}

mlaf_status mlaf_check_mla_kv_cache_q(mlaf_context *ctx, const mlaf_mla_kv_cache_params *p,
                                      const mlaf_tensor *latent, const mlaf_tensor *w_q,
                                      const mlaf_tensor *w_kv, const mlaf_tensor *positions,
                                      const mlaf_tensor *cos_sin, const mlaf_tensor *slot_mapping,
                                      const mlaf_kv_cache_desc *cache, const mlaf_tensor *q,
                                      const mlaf_tensor *k_nope, const mlaf_tensor *k_pe,
                                      const mlaf_tensor *error_count, const mlaf_row_quant *rq,
                                      mlaf_kv_cache_job *job) {
    if (!p) return mlaf_fail(ctx, MLAF_ERR_NULL_POINTER, "params is NULL (required)");
    mlaf_kv_cache_job j;
    memset(&j, 0, sizeof j);
    const int32_t tail = p->kv_rope_tail;
    if (tail != 0) {
        if (tail < 0 || tail % 2 != 0 || tail > p->kv_lora_rank)
            return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                             "kv_rope_tail = %d, expected 0 or even with 0 < kv_rope_tail <= kv_lora_rank = %d",
                             tail, p->kv_lora_rank);
        if (p->rope_dim != 0)
            return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                             "rope_dim = %d with kv_rope_tail = %d, expected 0 (the rope part is inside the "
                             "kv part: the latent row is [q | kv])",
                             p->rope_dim, tail);
        if (p->style != MLAF_ROPE_INTERLEAVED)
            return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                             "rope style = %d with kv_rope_tail = %d, expected 0 (interleaved, DeepSeek-V4's)",
                             (int)p->style, tail);
        if (k_pe)
            return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                             "k_pe is given, but kv_rope_tail = %d keeps the rope values in k_nope; pass NULL",
                             tail);
    }
    TRY(check_norm_part(ctx, p->q_lora_rank, p->kv_lora_rank, p->rope_dim, p->eps_q, p->eps_kv,
                        latent, w_q, w_kv, q, !rq || !rq->q.format, k_nope, 0, k_pe, &j.norm));
    int64_t T = j.norm.T;
    int32_t C = p->kv_lora_rank, R = p->rope_dim;
    if (R > 0 || tail > 0) {
        TRY(check_rope_inputs(ctx, R > 0 ? R : tail, p->style, T, positions, cos_sin, &j.rope));
    } else {
        TRY(check_rope_style(ctx, p->style));
        j.rope.style = p->style;
    }
    TRY(check_tensor(ctx, slot_mapping, "slot_mapping", DT_INDEX, 1, NULL, NULL));
    if (slot_mapping->shape[0] > T)
        return mlaf_fail(ctx, MLAF_ERR_SHAPE,
                         "slot_mapping.shape[0] = %lld, expected <= latent.shape[0] = %lld (rows past "
                         "slot_mapping's end take slot -1)",
                         (long long)slot_mapping->shape[0], (long long)T);
    TRY(check_cache_desc(ctx, cache, C, R, tail, latent->dtype, &j));
    TRY(check_error_count(ctx, error_count));

    /* Outputs: q, k_nope, k_pe (checked against the latent above), the cache arrays,
     * amax_out, error_count; inputs: the latent, weights, positions, cos_sin, slot_mapping,
     * the fp8 scale. */
    const mlaf_tensor *ins[7] = {latent, w_q, w_kv, positions, cos_sin, slot_mapping, cache->scale};
    const char *in_names[7] = {"latent", "w_q", "w_kv", "positions", "cos_sin", "slot_mapping", "scale"};
    const mlaf_tensor *outs[7] = {q, k_nope, k_pe, cache->cache, cache->kpe, cache->amax_out, error_count};
    const char *out_names[7] = {"q", "k_nope", "k_pe", "kv_cache", "kpe", "amax_out", "error_count"};
    for (int i = 0; i < 7; i++) {
        if (!outs[i]) continue;
        for (int k = (i < 3 ? 3 : 0); k < 7; k++) /* q/k_nope/k_pe vs latent/weights done */
            if (R > 0 || tail > 0 || (k != 3 && k != 4))
                TRY(no_overlap(ctx, outs[i], out_names[i], ins[k], in_names[k]));
        for (int k = (i < 3 ? 3 : i + 1); k < 7; k++)
            if (outs[k]) TRY(no_overlap(ctx, outs[i], out_names[i], outs[k], out_names[k]));
    }

    j.slots = slot_mapping->data;
    j.slot_dt = slot_mapping->dtype;
    j.n_map = slot_mapping->shape[0];
    j.error_count = error_count ? (int32_t *)error_count->data : NULL;
    j.kv_tail = tail;
    {
        const mlaf_tensor *all[14] = {latent, w_q, w_kv, positions, cos_sin, slot_mapping, cache->scale,
                                      q, k_nope, k_pe, cache->cache, cache->kpe, cache->amax_out, error_count};
        static const char *const names[14] = {"latent", "w_q", "w_kv", "positions", "cos_sin", "slot_mapping",
                                              "scale", "q", "k_nope", "k_pe", "kv_cache", "kpe", "amax_out",
                                              "error_count"};
        TRY(mlaf_check_row_quant(ctx, rq, tail, all, names, 14, &j.norm));
    }
    *job = j;
    return MLAF_OK;
}

mlaf_status mlaf_check_mla_kv_cache(mlaf_context *ctx, const mlaf_mla_kv_cache_params *p,
                                    const mlaf_tensor *latent, const mlaf_tensor *w_q,
                                    const mlaf_tensor *w_kv, const mlaf_tensor *positions,
                                    const mlaf_tensor *cos_sin, const mlaf_tensor *slot_mapping,
                                    const mlaf_kv_cache_desc *cache, const mlaf_tensor *q,
                                    const mlaf_tensor *k_nope, const mlaf_tensor *k_pe,
                                    const mlaf_tensor *error_count, mlaf_kv_cache_job *job) {
    return mlaf_check_mla_kv_cache_q(ctx, p, latent, w_q, w_kv, positions, cos_sin, slot_mapping, cache, q, k_nope,
                                     k_pe, error_count, NULL, job);
}

/* ---- moe_gate -------------------------------------------------------------------------- */

mlaf_status mlaf_check_moe_gate(mlaf_context *ctx, const mlaf_moe_gate_params *p,
                                const mlaf_tensor *logits, const mlaf_tensor *bias,
                                const mlaf_tensor *weights, const mlaf_tensor *ids,
                                const mlaf_tensor *scores, mlaf_moe_gate_job *job) {
    if (!p) return mlaf_fail(ctx, MLAF_ERR_NULL_POINTER, "params is NULL (required)");
    TRY(check_tensor(ctx, logits, "logits", DT_FLOAT, 2, NULL, NULL));
    TRY(check_tokens(ctx, logits, "logits"));
    int64_t T = logits->shape[0], E64 = logits->shape[1];
    if (E64 < 1 || E64 > 2048)
        return mlaf_fail(ctx, MLAF_ERR_LIMIT,
                         "logits.shape[1] = %lld experts, expected 1 <= E <= 2048", (long long)E64);
    int32_t E = (int32_t)E64;
    if (!mlaf_score_of(p->score_func)) {
        char valid[128];
        mlaf_score_list(valid, sizeof valid);
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT, "score_func = %d, expected %s",
                         (int)p->score_func, valid);
    }
    if (p->group_score != MLAF_GROUP_TOP2_SUM && p->group_score != MLAF_GROUP_MAX)
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                         "group_score = %d, expected 0 (top-2 sum) or 1 (max)", (int)p->group_score);
    if (p->n_group < 1 || p->n_group > 64)
        return mlaf_fail(ctx, MLAF_ERR_LIMIT, "n_group = %d, expected 1 <= n_group <= 64",
                         p->n_group);
    if (E % p->n_group != 0)
        return mlaf_fail(ctx, MLAF_ERR_LIMIT,
                         "n_group = %d does not divide the number of experts E = %d", p->n_group, E);
    if (p->topk_group < 1 || p->topk_group > p->n_group)
        return mlaf_fail(ctx, MLAF_ERR_LIMIT, "topk_group = %d, expected 1 <= topk_group <= n_group = %d",
                         p->topk_group, p->n_group);
    int32_t per_group = E / p->n_group;
    if (p->n_group > 1 && p->group_score == MLAF_GROUP_TOP2_SUM && per_group < 2)
        return mlaf_fail(ctx, MLAF_ERR_LIMIT,
                         "n_group = %d leaves %d expert per group; group_score top-2 sum needs >= 2",
                         p->n_group, per_group);
    int32_t kmax = E < 64 ? E : 64;
    if (p->top_k < 1 || p->top_k > kmax)
        return mlaf_fail(ctx, MLAF_ERR_LIMIT, "top_k = %d, expected 1 <= top_k <= min(E, 64) = %d",
                         p->top_k, kmax);
    if (p->top_k > p->topk_group * per_group)
        return mlaf_fail(ctx, MLAF_ERR_LIMIT,
                         "top_k = %d, expected <= topk_group * E / n_group = %d experts in kept groups",
                         p->top_k, p->topk_group * per_group);
    if (p->n_shared_experts < 0 || p->n_shared_experts > 64)
        return mlaf_fail(ctx, MLAF_ERR_LIMIT, "n_shared_experts = %d, expected 0 <= S <= 64",
                         p->n_shared_experts);
    if (!(isfinite(p->routed_scaling_factor) && p->routed_scaling_factor > 0.0f))
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                         "routed_scaling_factor = %g, expected finite and > 0",
                         (double)p->routed_scaling_factor);
    if (!(isfinite(p->eps) && p->eps >= 0.0f))
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT, "eps = %g, expected finite and >= 0",
                         (double)p->eps);
    int32_t K = p->top_k + p->n_shared_experts;

    if (bias) {
        static const char *const be[1] = {"logits.shape[1]"};
        int64_t wb[1] = {E};
        TRY(check_tensor(ctx, bias, "bias", DT_(MLAF_F32), 1, wb, be));
    }
    static const char *const oexpr[2] = {"logits.shape[0]", "top_k + n_shared_experts"};
    int64_t wo[2] = {T, K};
    TRY(check_tensor(ctx, weights, "weights", DT_(MLAF_F32) | DT_(logits->dtype), 2, wo, oexpr));
    TRY(check_tensor(ctx, ids, "ids", DT_(MLAF_I32), 2, wo, oexpr));
    if (scores) {
        static const char *const sexpr[2] = {"logits.shape[0]", "logits.shape[1]"};
        int64_t wsc[2] = {T, E};
        TRY(check_tensor(ctx, scores, "scores", DT_(MLAF_F32), 2, wsc, sexpr));
    }
    const mlaf_tensor *outs[3] = {weights, ids, scores};
    const char *onames[3] = {"weights", "ids", "scores"};
    for (int i = 0; i < 3; i++) {
        if (!outs[i]) continue;
        TRY(no_overlap(ctx, outs[i], onames[i], logits, "logits"));
        TRY(no_overlap(ctx, outs[i], onames[i], bias, "bias"));
        for (int k = i + 1; k < 3; k++)
            if (outs[k]) TRY(no_overlap(ctx, outs[i], onames[i], outs[k], onames[k]));
    }

    memset(job, 0, sizeof *job);
    job->T = T;
    job->E = E;
    job->top_k = p->top_k;
    job->n_group = p->n_group;
    job->topk_group = p->topk_group;
    job->n_shared = p->n_shared_experts;
    job->K = K;
    job->score_func = p->score_func;
    job->group_score = p->group_score;
    job->renormalize = p->renormalize != 0;
    job->apply_scaling = p->apply_routed_scaling != 0;
    job->scaling = p->routed_scaling_factor;
    job->eps = p->eps;
    job->logits = logits->data;
    job->logits_dt = logits->dtype;
    job->logits_stride = logits->stride[0];
    job->bias = bias ? (const float *)bias->data : NULL;
    job->weights = weights->data;
    job->weights_dt = weights->dtype;
    job->weights_stride = weights->stride[0];
    job->ids = (int32_t *)ids->data;
    job->ids_stride = ids->stride[0];
    job->scores = scores ? (float *)scores->data : NULL;
    job->scores_stride = scores ? scores->stride[0] : 0;
    return MLAF_OK;
}

/* ---- exported for validate_dsa.c, validate_hash.c and validate_rope_q.c --------------- */
mlaf_status mlaf_vcheck_tensor(mlaf_context *ctx, const mlaf_tensor *t, const char *name, unsigned dtypes, int ndim,
                               const int64_t *want, const char *const *want_expr) {
    return check_tensor(ctx, t, name, dtypes, ndim, want, want_expr);
}
mlaf_status mlaf_vcheck_no_overlap(mlaf_context *ctx, const mlaf_tensor *out, const char *out_name,
                                   const mlaf_tensor *other, const char *other_name) {
    return no_overlap(ctx, out, out_name, other, other_name);
}
mlaf_status mlaf_vcheck_rope_inputs(mlaf_context *ctx, int32_t R, mlaf_rope_style style, int64_t T,
                                    const mlaf_tensor *positions, const mlaf_tensor *cos_sin, mlaf_rope_job *rope) {
    return check_rope_inputs(ctx, R, style, T, positions, cos_sin, rope);
}
mlaf_status mlaf_vcheck_error_count(mlaf_context *ctx, const mlaf_tensor *ec) { return check_error_count(ctx, ec); }
mlaf_status mlaf_vcheck_cache_view(mlaf_context *ctx, const mlaf_tensor *t, const char *name, unsigned dtypes,
                                   int64_t width, const char *width_expr) {
    return check_cache_view(ctx, t, name, dtypes, width, width_expr);
}
