/*
 * verify_norm.c — mlaf_verify_split_qk_norm / _mla_kv_cache / _rope_q: build a case on the
 * context's backend, run the op, compare with the float64 oracle (ref_norm.c).
 *
 * Every buffer is an mlaf_gbuf (guard zones, backend memory). Outputs start poisoned (0xFF,
 * NaN in every float dtype), inputs random (seeded). After the run each buffer is downloaded
 * and every byte is accounted for: a byte some check "claims" (an output value compared with
 * the oracle) is judged by that check; every other byte — inputs, row padding, cache rows no
 * valid slot names, the nope columns of rope_q, the rope part of rejected tokens — must equal
 * its initial value bit for bit. Guards must be intact.
 *
 * Tolerance (SPEC §7): output values within 1 unit (mlaf_err_units) of the oracle; copies bit
 * exact. RoPE outputs: the contract fixes the rotation as separate fp32 products and one
 * add / subtract, whose rounding (at most 2^-23 of |x0*c| + |x1*s|) can dwarf an ulp of a
 * result that cancels to near zero; that allowance is granted before counting units.
 *
 * Case knobs used here: cfg (Q, C, R, heads, nope dim, eps), dtype, weight_dtype, T, strided
 * (padded rows, odd element offsets, misaligned bases), in_place (dense outputs are the
 * latent's own columns), no_k_pe (1: omit the dense k_pe output; 2, mla_kv_cache only: omit
 * both dense k_nope and k_pe — the cache-only call), seed, rope_style, block_size,
 * cache_dtype, index_dtype.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../half.h"
#include "verify.h"

#define CHUNK_TOKENS 256

/* ---- buffers with an initial image and a claim mask ------------------------------------ */
typedef struct vbuf {
    const char *name;
    mlaf_gbuf g;
    unsigned char *init;    /* the usable part as uploaded */
    unsigned char *claimed; /* after fetch: 1 per byte some check owns */
    size_t bytes;
    int live;
} vbuf;

static mlaf_status vbuf_alloc(vbuf *b, const char *name, mlaf_backend be, size_t bytes,
                              const void *init, size_t misalign) {
    memset(b, 0, sizeof *b);
    b->name = name;
    b->bytes = bytes;
    b->init = (unsigned char *)malloc(bytes ? bytes : 1);
    if (!b->init) return MLAF_ERR_OUT_OF_MEMORY;
    if (init)
        memcpy(b->init, init, bytes);
    else
        memset(b->init, 0xFF, bytes);
    mlaf_status st = mlaf_gbuf_alloc(&b->g, be, bytes, b->init, misalign);
    if (st != MLAF_OK) {
        free(b->init);
        b->init = NULL;
        return st;
    }
    b->live = 1;
    return MLAF_OK;
}

static void vbuf_free(vbuf *b) {
    if (b->live) mlaf_gbuf_free(&b->g);
    free(b->init);
    free(b->claimed);
    memset(b, 0, sizeof *b);
}

static mlaf_status vbuf_fetch(vbuf *b) {
    if (!b->live) return MLAF_OK;
    b->claimed = (unsigned char *)calloc(b->bytes ? b->bytes : 1, 1);
    if (!b->claimed) return MLAF_ERR_OUT_OF_MEMORY;
    return mlaf_gbuf_download(&b->g);
}

/* A 2-D strided view into a vbuf: element (t, i) at body + (off + t * stride + i) * es. */
typedef struct vview {
    vbuf *b;
    mlaf_dtype dt;
    int64_t off, stride;
} vview;

static size_t vv_byte(const vview *v, int64_t t, int64_t i) {
    return (size_t)((v->off + t * v->stride + i) * (int64_t)mlaf_dtype_size(v->dt));
}
static void *vv_dev(const vview *v) {
    return (char *)v->b->g.ptr + v->off * (int64_t)mlaf_dtype_size(v->dt);
}

/* ---- the judge ------------------------------------------------------------------------- */
typedef struct judge {
    mlaf_verify_result *r;
    int failed;
    double worst;
    int64_t values;
} judge;

static void judge_fail(judge *j, const char *fmt, ...) {
    if (j->failed++) return; /* keep the first failure */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->r->detail, sizeof j->r->detail, fmt, ap);
    va_end(ap);
}

/* mlaf_err_units with frexp instead of log2 (same value; many millions of calls per case). */
static double units(double got, double ref, mlaf_dtype dt, double scale) {
    if (dt == MLAF_F32 || isnan(ref) || isnan(got) || isinf(ref) || isinf(got))
        return mlaf_err_units(got, ref, dt, scale);
    int mant = dt == MLAF_F16 ? 10 : 7, min_exp = dt == MLAF_F16 ? -14 : -126;
    int e = min_exp;
    if (ref != 0.0) {
        frexp(ref, &e);
        e -= 1;
        if (e < min_exp) e = min_exp;
    }
    return fabs(got - ref) / ldexp(1.0, e - mant);
}

/* Compares out(t, i) with ref; `allow` is an absolute slack granted before counting units
 * (0 except for RoPE results). Claims the element. */
static void judge_value(judge *j, const vview *v, const char *what, int64_t t, int64_t i,
                        double ref, double allow) {
    size_t at = vv_byte(v, t, i), es = mlaf_dtype_size(v->dt);
    for (size_t k = 0; k < es; k++) v->b->claimed[at + k] = 1;
    double got = mlaf_load_f32(v->b->g.body, v->dt, v->off + t * v->stride + i);
    double ref_near = ref;
    if (allow > 0 && isfinite(got) && isfinite(ref))
        ref_near = got > ref ? (got - ref > allow ? ref + allow : got)
                             : (ref - got > allow ? ref - allow : got);
    double u = units(got, ref_near, v->dt, fabs(ref));
    j->values++;
    if (u > j->worst || u != u) j->worst = u != u ? INFINITY : u;
    if (!(u <= 1.0))
        judge_fail(j, "%s[t=%lld,i=%lld]: got %.9g, expected %.9g (%.3g units, %s)", what,
                   (long long)t, (long long)i, got, ref, u, mlaf_dtype_name(v->dt));
}

/* Every unclaimed byte equals its initial value; guards intact. */
static int64_t judge_untouched(judge *j, const vbuf *b) {
    if (!b->live) return 0;
    if (!mlaf_gbuf_guards_ok(&b->g)) judge_fail(j, "%s: guard zone around the buffer was written", b->name);
    const unsigned char *got = (const unsigned char *)b->g.body;
    const int64_t nb = (int64_t)b->bytes;
    int64_t kept = 0, first = nb; /* the lowest changed byte, on all threads */
#ifdef _OPENMP
#pragma omp parallel for schedule(static) reduction(+ : kept) reduction(min : first)
#endif
    for (int64_t k = 0; k < nb; k++) {
        if (b->claimed[k]) continue;
        kept++;
        if (got[k] != b->init[k] && k < first) first = k;
    }
    if (first < nb)
        judge_fail(j, "%s: byte %lld changed (0x%02x -> 0x%02x) where nothing may be written "
                   "(input, padding, unnamed cache row or rejected token)",
                   b->name, (long long)first, b->init[first], got[first]);
    return kept;
}

static void judge_finish(judge *j, const char *op, const mlaf_verify_case *c, int64_t extra) {
    mlaf_verify_result *r = j->r;
    r->worst_units = j->worst;
    r->passed = j->failed == 0 && j->worst <= 1.0;
    if (r->passed)
        snprintf(r->detail, sizeof r->detail,
                 "%s T=%lld: %lld values within %.3f units, %lld bytes untouched as required",
                 op, (long long)c->T, (long long)j->values, j->worst, (long long)extra);
}

/* The case's corrupt_from (the harness's own test): element (t, 0) of v raised by 1 for
 * t = corrupt_from - 1, then every 500th token. */
static void corrupt_outputs(const mlaf_verify_case *c, const vview *v) {
    if (c->corrupt_from <= 0 || !v->b || !v->b->live) return;
    for (int64_t t = c->corrupt_from - 1; t < c->T; t += 500) {
        const int64_t at = v->off + t * v->stride;
        mlaf_store_f32(v->b->g.body, v->dt, at, (float)(mlaf_load_f32(v->b->g.body, v->dt, at) + 1.0));
    }
}

/* Absolute fp32 rounding allowance for each rotated value (see the header comment). */
static void rope_allowance(const double *x, int32_t R, mlaf_rope_style style, const float *cs,
                           double *allow) {
    int32_t h = R / 2;
    for (int32_t i = 0; i < h; i++) {
        int32_t a = style == MLAF_ROPE_NEOX ? i : 2 * i;
        int32_t b = style == MLAF_ROPE_NEOX ? i + h : 2 * i + 1;
        double c = fabs((double)cs[i]), s = fabs((double)cs[h + i]);
        allow[a] = ldexp(fabs(x[a]) * c + fabs(x[b]) * s, -23);
        allow[b] = ldexp(fabs(x[b]) * c + fabs(x[a]) * s, -23);
    }
}

/* ---- shared case construction ---------------------------------------------------------- */

/* Approximately N(mean, sd) values rounded to dt: a sum of four uniforms (Irwin-Hall), which
 * is all the shape these tests need and far cheaper than Box-Muller for 10^8 values. */
static void fill_fast_normal(mlaf_rng *rng, void *p, mlaf_dtype dt, int64_t n, double mean,
                             double sd) {
    for (int64_t i = 0; i < n; i++) {
        uint64_t u = mlaf_rng_u64(rng);
        double s = (double)(u & 0xffff) + (double)((u >> 16) & 0xffff) +
                   (double)((u >> 32) & 0xffff) + (double)(u >> 48);
        double z = (s * (1.0 / 65536.0) - 2.0) * 1.7320508075688772;
        mlaf_store_f32(p, dt, i, (float)(mean + sd * z));
    }
}

/* Latent rows: ~N(0,1), with some rows far larger or smaller (eps then matters) and some zero. */
static void fill_latent(mlaf_rng *rng, void *p, mlaf_dtype dt, int64_t T, int64_t stride) {
    const size_t es = mlaf_dtype_size(dt);
    /* row t takes draws [t stride, (t + 1) stride): rows on all threads, the same values */
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int64_t t = 0; t < T; t++) {
        double s = 1.0;
        if (t % 13 == 5) s = dt == MLAF_F16 ? 64.0 : 4096.0;
        if (t % 13 == 9) s = 1.0 / 512.0;
        if (t % 97 == 50) s = 0.0;
        mlaf_rng rt = mlaf_rng_skipped(rng, (uint64_t)(t * stride));
        fill_fast_normal(&rt, (char *)p + (size_t)(t * stride) * es, dt, stride, 0.0, s);
    }
    *rng = mlaf_rng_skipped(rng, (uint64_t)(T > 0 ? T * stride : 0));
}

/* fill_fast_normal over n elements in blocks on all threads (block k takes draws from k B). */
static void fill_fast_normal_par(mlaf_rng *rng, void *p, mlaf_dtype dt, int64_t n, double mean,
                                 double sd) {
    const int64_t B = 1 << 16, nb = (n + B - 1) / B;
    const size_t es = mlaf_dtype_size(dt);
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int64_t k = 0; k < nb; k++) {
        mlaf_rng rt = mlaf_rng_skipped(rng, (uint64_t)(k * B));
        fill_fast_normal(&rt, (char *)p + (size_t)(k * B) * es, dt, n - k * B < B ? n - k * B : B, mean, sd);
    }
    *rng = mlaf_rng_skipped(rng, (uint64_t)(n > 0 ? n : 0));
}

typedef struct norm_bufs {
    vbuf latent, w_q, w_kv, q, k_nope, k_pe;
    vview vq, vk, vp;
    int64_t LS;
} norm_bufs;

static void norm_bufs_free(norm_bufs *n) {
    vbuf_free(&n->latent);
    vbuf_free(&n->w_q);
    vbuf_free(&n->w_kv);
    vbuf_free(&n->q);
    vbuf_free(&n->k_nope);
    vbuf_free(&n->k_pe);
}

/* Inputs and the dense outputs (want_* says which exist). */
static mlaf_status norm_bufs_make(norm_bufs *n, mlaf_backend be, const mlaf_verify_case *c,
                                  mlaf_rng *rng, int want_k_nope, int want_k_pe) {
    memset(n, 0, sizeof *n);
    const int64_t Q = c->cfg.q_lora_rank, C = c->cfg.kv_lora_rank, R = c->cfg.qk_rope_head_dim;
    const int64_t W = Q + C + R, T = c->T;
    const mlaf_dtype dt = c->dtype;
    const size_t es = mlaf_dtype_size(dt), wes = mlaf_dtype_size(c->weight_dtype);
    const int st = c->strided != 0;
    mlaf_status s;
    n->LS = W + (st ? 7 : 0);
    size_t lbytes = (size_t)(T * n->LS) * es;
    void *tmp = malloc(lbytes ? lbytes : 1);
    if (!tmp) return MLAF_ERR_OUT_OF_MEMORY;
    fill_latent(rng, tmp, dt, T, n->LS);
    s = vbuf_alloc(&n->latent, "latent", be, lbytes, tmp, st ? 3 * es : 0);
    free(tmp);
    if (s != MLAF_OK) return s;

    int64_t wn[2] = {Q, C};
    vbuf *wb[2] = {&n->w_q, &n->w_kv};
    const char *wname[2] = {"w_q", "w_kv"};
    for (int k = 0; k < 2; k++) {
        if (wn[k] == 0) continue;
        void *w = malloc((size_t)wn[k] * wes);
        if (!w) return MLAF_ERR_OUT_OF_MEMORY;
        mlaf_fill_normal(rng, w, c->weight_dtype, (size_t)wn[k], 1.0, 0.25);
        s = vbuf_alloc(wb[k], wname[k], be, (size_t)wn[k] * wes, w, st ? wes : 0);
        free(w);
        if (s != MLAF_OK) return s;
    }

    if (c->in_place) {
        vview q = {&n->latent, dt, 0, n->LS}, k = {&n->latent, dt, Q, n->LS},
              p = {&n->latent, dt, Q + C, n->LS};
        n->vq = q;
        n->vk = k;
        n->vp = p;
    } else {
        int64_t widths[3] = {Q, C, R}, pads[3] = {5, 3, 1};
        vbuf *bufs[3] = {&n->q, &n->k_nope, &n->k_pe};
        vview *views[3] = {&n->vq, &n->vk, &n->vp};
        const char *names[3] = {"q", "k_nope", "k_pe"};
        int want[3] = {Q > 0, want_k_nope, want_k_pe && R > 0};
        for (int k = 0; k < 3; k++) {
            int64_t stride = widths[k] + (st ? pads[k] : 0);
            views[k]->dt = dt;
            views[k]->stride = stride;
            views[k]->b = bufs[k];
            if (!want[k]) continue;
            s = vbuf_alloc(bufs[k], names[k], be, (size_t)(T * stride) * es, NULL,
                           st ? (size_t)(2 * k + 1) * es : 0);
            if (s != MLAF_OK) return s;
        }
    }
    return MLAF_OK;
}

static mlaf_tensor tensor_of(const vview *v, int64_t T, int64_t width) {
    return mlaf_tensor_2d(vv_dev(v), v->dt, T, width, v->stride);
}

/* Host copy of the job for the oracle, on the initial images, for tokens [t0, t0 + n). */
static mlaf_norm_job host_norm_job(const norm_bufs *b, const mlaf_verify_case *c, int64_t t0,
                                   int64_t n) {
    mlaf_norm_job j;
    memset(&j, 0, sizeof j);
    j.T = n;
    j.Q = c->cfg.q_lora_rank;
    j.C = c->cfg.kv_lora_rank;
    j.R = c->cfg.qk_rope_head_dim;
    j.eps_q = c->cfg.rms_norm_eps;
    j.eps_kv = c->cfg.rms_norm_eps;
    j.dt = c->dtype;
    j.latent = b->latent.init + (size_t)(t0 * b->LS) * mlaf_dtype_size(c->dtype);
    j.latent_stride = b->LS;
    j.w_q = j.Q > 0 ? b->w_q.init : NULL;
    j.w_q_dt = c->weight_dtype;
    j.w_kv = b->w_kv.init;
    j.w_kv_dt = c->weight_dtype;
    return j;
}

static mlaf_status fetch_all(vbuf **bufs, int n) {
    for (int i = 0; i < n; i++) {
        mlaf_status s = vbuf_fetch(bufs[i]);
        if (s != MLAF_OK) return s;
    }
    return MLAF_OK;
}

/* ---- the chunk loops, on all threads ---------------------------------------------------- *
 * A check walks [0, T) in chunks: the oracle for the chunk, then every output value judged.
 * The chunks are mlaf_run_items' items, each with its own judge; the merge gives what the loop
 * in token order gives. Claims are per token (distinct bytes), so threads never claim the same
 * byte. */
typedef void (*chunk_body)(const void *arg, void *scratch, int64_t t0, int64_t n, judge *j,
                           int64_t *errors);

typedef struct chunk_job {
    int64_t T, chunk;
    chunk_body body;
    const void *arg;
} chunk_job;

static void chunk_item(const void *arg, void *scratch, int64_t k, mlaf_item_out *out) {
    const chunk_job *cj = (const chunk_job *)arg;
    mlaf_verify_result tr;
    judge jc = {&tr, 0, 0.0, 0};
    const int64_t t0 = k * cj->chunk, n = cj->T - t0 < cj->chunk ? cj->T - t0 : cj->chunk;
    cj->body(cj->arg, scratch, t0, n, &jc, &out->errors);
    out->worst = jc.worst;
    out->values = jc.values;
    out->failed = jc.failed;
    if (jc.failed) memcpy(out->why, tr.detail, sizeof out->why);
}

static mlaf_status run_chunks(int64_t T, int64_t chunk, size_t scratch_bytes, chunk_body body,
                              const void *arg, judge *j, int64_t *errors) {
    const chunk_job cj = {T, chunk, body, arg};
    mlaf_item_out tot;
    mlaf_status s = mlaf_run_items((T + chunk - 1) / chunk, scratch_bytes, chunk_item, &cj, &tot);
    if (s != MLAF_OK) return s;
    if (tot.worst > j->worst) j->worst = tot.worst;
    j->values += tot.values;
    j->failed += tot.failed;
    *errors += tot.errors;
    if (tot.failed) memcpy(j->r->detail, tot.why, sizeof j->r->detail);
    return MLAF_OK;
}

static mlaf_status check_case_common(const mlaf_verify_case *c, mlaf_verify_result *r) {
    memset(r, 0, sizeof *r);
    if (c->cfg.kv_lora_rank <= 0 || c->cfg.q_lora_rank < 0 || c->cfg.qk_rope_head_dim < 0 ||
        c->T < 0)
        return MLAF_ERR_INVALID_ARGUMENT;
    return MLAF_OK;
}

/* ---- split_qk_norm --------------------------------------------------------------------- */

typedef struct split_arg {
    const norm_bufs *b;
    const mlaf_verify_case *c;
    int32_t Q, C, R;
    int give_pe;
} split_arg;

/* Tokens [t0, t0 + n): the oracle's q and k_nope, the k_pe copy bit for bit. */
static void split_chunk(const void *arg, void *scratch, int64_t t0, int64_t n, judge *j,
                        int64_t *errors) {
    const split_arg *a = (const split_arg *)arg;
    const norm_bufs *b = a->b;
    const int32_t Q = a->Q, C = a->C, R = a->R;
    const size_t es = mlaf_dtype_size(a->c->dtype);
    double *rq = (double *)scratch, *rk = rq + CHUNK_TOKENS * (Q > 0 ? Q : 1);
    (void)errors;
    mlaf_norm_job hj = host_norm_job(b, a->c, t0, n);
    mlaf_ref_split_qk_norm(&hj, Q > 0 ? rq : NULL, rk, NULL);
    for (int64_t u = 0; u < n; u++) {
        int64_t t = t0 + u;
        for (int32_t i = 0; i < Q; i++) judge_value(j, &b->vq, "q", t, i, rq[u * Q + i], 0);
        for (int32_t i = 0; i < C; i++) judge_value(j, &b->vk, "k_nope", t, i, rk[u * C + i], 0);
        if (a->give_pe && R > 0) {
            /* bit-exact copy of the latent's rope columns */
            const unsigned char *src = b->latent.init + (size_t)((t * b->LS + Q + C) * (int64_t)es);
            size_t at = vv_byte(&b->vp, t, 0);
            if (memcmp((const unsigned char *)b->vp.b->g.body + at, src, (size_t)R * es) != 0)
                judge_fail(j, "k_pe[t=%lld]: not a bit-exact copy of the latent's rope part",
                           (long long)t);
            if (!a->c->in_place) memset(b->vp.b->claimed + at, 1, (size_t)R * es);
        }
    }
}

mlaf_status mlaf_verify_split_qk_norm(mlaf_context *ctx, const mlaf_verify_case *c,
                                      mlaf_verify_result *r) {
    mlaf_status s = check_case_common(c, r);
    if (s != MLAF_OK) return s;
    const int32_t Q = c->cfg.q_lora_rank, C = c->cfg.kv_lora_rank, R = c->cfg.qk_rope_head_dim;
    const int64_t T = c->T;
    mlaf_rng rng;
    mlaf_rng_seed(&rng, c->seed);
    norm_bufs b;
    s = norm_bufs_make(&b, mlaf_context_backend(ctx), c, &rng, 1, !c->no_k_pe);
    if (s != MLAF_OK) goto done;

    mlaf_split_qk_norm_params p = {Q, C, R, c->cfg.rms_norm_eps, c->cfg.rms_norm_eps};
    mlaf_tensor lt = mlaf_tensor_2d(b.latent.g.ptr, c->dtype, T, (int64_t)Q + C + R, b.LS);
    mlaf_tensor wq = mlaf_tensor_1d(b.w_q.g.ptr, c->weight_dtype, Q);
    mlaf_tensor wkv = mlaf_tensor_1d(b.w_kv.g.ptr, c->weight_dtype, C);
    mlaf_tensor tq = tensor_of(&b.vq, T, Q), tk = tensor_of(&b.vk, T, C), tp = tensor_of(&b.vp, T, R);
    int give_pe = !c->no_k_pe;
    s = mlaf_split_qk_norm(ctx, &p, &lt, Q > 0 ? &wq : NULL, &wkv, Q > 0 ? &tq : NULL, &tk,
                           give_pe ? &tp : NULL);
    if (s != MLAF_OK) {
        snprintf(r->detail, sizeof r->detail, "mlaf_split_qk_norm: %s: %s", mlaf_status_name(s),
                 mlaf_context_last_error(ctx));
        goto done;
    }
    if ((s = mlaf_context_sync(ctx)) != MLAF_OK) goto done;
    vbuf *all[6] = {&b.latent, &b.w_q, &b.w_kv, &b.q, &b.k_nope, &b.k_pe};
    if ((s = fetch_all(all, 6)) != MLAF_OK) goto done;
    corrupt_outputs(c, Q > 0 ? &b.vq : &b.vk);

    judge j = {r, 0, 0.0, 0};
    const split_arg sa = {&b, c, Q, C, R, !c->no_k_pe};
    int64_t errors = 0;
    const size_t scratch = sizeof(double) * CHUNK_TOKENS * ((size_t)(Q > 0 ? Q : 1) + (size_t)C);
    if ((s = run_chunks(T, CHUNK_TOKENS, scratch, split_chunk, &sa, &j, &errors)) != MLAF_OK) goto done;
    int64_t untouched = 0;
    for (int i = 0; i < 6; i++) untouched += judge_untouched(&j, all[i]);
    judge_finish(&j, "split_qk_norm", c, untouched);
done:
    norm_bufs_free(&b);
    return s;
}

/* ---- RoPE inputs shared by mla_kv_cache and rope_q ------------------------------------ */

#define VERIFY_MAX_POS 2048

/* Positions: mostly random, with max_pos - 1, repeats and rejected ones mixed in. */
static void make_positions(mlaf_rng *rng, int64_t *pos, int64_t T, int64_t max_pos) {
    for (int64_t t = 0; t < T; t++) {
        pos[t] = (int64_t)(mlaf_rng_u64(rng) % (uint64_t)max_pos);
        if (t % 7 == 3) pos[t] = max_pos - 1;
        if (t % 5 == 1) pos[t] = pos[t - 1];
        if (t % 13 == 6) pos[t] = (t / 13) % 2 ? max_pos + t % 3 : -1 - t % 5;
    }
}

static mlaf_status index_buf(vbuf *b, const char *name, mlaf_backend be, const int64_t *v,
                             int64_t T, mlaf_dtype dt, int misalign) {
    size_t es = mlaf_dtype_size(dt);
    void *tmp = malloc((size_t)T * es + 1);
    if (!tmp) return MLAF_ERR_OUT_OF_MEMORY;
    for (int64_t t = 0; t < T; t++) {
        if (dt == MLAF_I64)
            ((int64_t *)tmp)[t] = v[t];
        else
            ((int32_t *)tmp)[t] = (int32_t)v[t];
    }
    mlaf_status s = vbuf_alloc(b, name, be, (size_t)T * es, tmp, misalign ? es : 0);
    free(tmp);
    return s;
}

/* cos_sin [max_pos, R] with row stride cs_stride (f32). */
static mlaf_status cos_sin_buf(vbuf *b, mlaf_backend be, int32_t R, int64_t cs_stride, int strided) {
    float *table = (float *)malloc(sizeof(float) * VERIFY_MAX_POS * (size_t)R);
    float *img = (float *)calloc((size_t)(VERIFY_MAX_POS * cs_stride), sizeof(float));
    mlaf_status s = MLAF_ERR_OUT_OF_MEMORY;
    if (table && img) {
        s = mlaf_rope_table_init(table, VERIFY_MAX_POS, R, 10000.0);
        if (s == MLAF_OK) {
            for (int64_t p = 0; p < VERIFY_MAX_POS; p++)
                memcpy(img + p * cs_stride, table + p * R, sizeof(float) * (size_t)R);
            s = vbuf_alloc(b, "cos_sin", be, sizeof(float) * (size_t)(VERIFY_MAX_POS * cs_stride),
                           img, strided ? 4 : 0);
        }
    }
    free(table);
    free(img);
    return s;
}

static mlaf_status error_count_buf(vbuf *b, mlaf_backend be) {
    int32_t start = 3; /* the op adds to whatever the caller left there */
    return vbuf_alloc(b, "error_count", be, sizeof start, &start, 0);
}

static void judge_error_count(judge *j, vbuf *b, int64_t expected_errors) {
    int32_t got;
    memcpy(&got, b->g.body, sizeof got);
    memset(b->claimed, 1, sizeof got);
    if ((int64_t)got != 3 + expected_errors)
        judge_fail(j, "error_count: got %d (started at 3), expected 3 + %lld rejected tokens",
                   (int)got, (long long)expected_errors);
}

/* ---- mla_kv_cache ---------------------------------------------------------------------- */

typedef struct mla_arg {
    const norm_bufs *b;
    const mlaf_verify_case *c;
    int32_t Q, C, R;
    int want_k_nope, want_k_pe;
    const vbuf *pos_b, *slot_b, *cache_b;
    const float *cs_host;
    int64_t cs_stride;
    const int64_t *pos, *slots;
    int64_t num_blocks, bs, s0, s1;
} mla_arg;

/* Tokens [t0, t0 + n): q, k_nope, the roped k_pe and the cache row each valid token names;
 * *errors counts the tokens the oracle rejects. */
static void mla_chunk(const void *arg, void *scratch, int64_t t0, int64_t n, judge *j,
                      int64_t *errors) {
    const mla_arg *a = (const mla_arg *)arg;
    const norm_bufs *b = a->b;
    const mlaf_verify_case *c = a->c;
    const int32_t Q = a->Q, C = a->C, R = a->R;
    const int64_t CR = (int64_t)C + R, bs = a->bs;
    const size_t es = mlaf_dtype_size(c->dtype);
    double *rq = (double *)scratch, *rk = rq + CHUNK_TOKENS * (Q > 0 ? Q : 1);
    double *rp = rk + CHUNK_TOKENS * C, *rows = rp + CHUNK_TOKENS * (R > 0 ? R : 1);
    double *allow = rows + CHUNK_TOKENS * CR;
    int8_t *status = (int8_t *)(allow + (R > 0 ? R : 1) * 2);
    vview vcache = {(vbuf *)a->cache_b, c->cache_dtype, 0, 0};
    mlaf_kv_cache_job hj;
    memset(&hj, 0, sizeof hj);
    hj.norm = host_norm_job(b, c, t0, n);
    hj.rope.R = R;
    hj.rope.style = c->rope_style;
    hj.rope.positions = a->pos_b->init ? a->pos_b->init + (size_t)t0 * mlaf_dtype_size(c->index_dtype) : NULL;
    hj.rope.pos_dt = c->index_dtype;
    hj.rope.cos_sin = a->cs_host;
    hj.rope.cos_sin_stride = a->cs_stride;
    hj.rope.max_pos = VERIFY_MAX_POS;
    hj.slots = a->slot_b->init + (size_t)t0 * mlaf_dtype_size(c->index_dtype);
    hj.slot_dt = c->index_dtype;
    hj.cache_dt = c->cache_dtype;
    hj.num_blocks = a->num_blocks;
    hj.block_size = bs;
    hj.cache_s0 = a->s0;
    hj.cache_s1 = a->s1;
    mlaf_ref_mla_kv_cache(&hj, Q > 0 ? rq : NULL, rk, rp, rows, status);
    for (int64_t u = 0; u < n; u++) {
        int64_t t = t0 + u;
        *errors += status[u] < 0;
        for (int32_t i = 0; i < Q; i++) judge_value(j, &b->vq, "q", t, i, rq[u * Q + i], 0);
        if (a->want_k_nope)
            for (int32_t i = 0; i < C; i++) judge_value(j, &b->vk, "k_nope", t, i, rk[u * C + i], 0);
        if (status[u] < 0) continue; /* nothing of the rope part or cache row may be written */
        if (R > 0) {
            /* rounding allowance from the un-rotated values */
            double *x = allow + R;
            const char *lrow = (const char *)b->latent.init + (size_t)(t * b->LS) * es;
            for (int32_t i = 0; i < R; i++) x[i] = mlaf_load_f32(lrow, c->dtype, (int64_t)Q + C + i);
            rope_allowance(x, R, c->rope_style, a->cs_host + a->pos[t] * a->cs_stride, allow);
            if (a->want_k_pe)
                for (int32_t i = 0; i < R; i++) judge_value(j, &b->vp, "k_pe", t, i, rp[u * R + i], allow[i]);
        }
        if (status[u] == 1) {
            int64_t slot = a->slots[t];
            vcache.off = (slot / bs) * a->s0 + (slot % bs) * a->s1;
            for (int64_t i = 0; i < C; i++)
                judge_value(j, &vcache, "kv_cache(k_nope part)", t, i, rows[u * CR + i], 0);
            for (int64_t i = 0; i < R; i++)
                judge_value(j, &vcache, "kv_cache(rope part)", t, C + i, rows[u * CR + C + i], allow[i]);
        }
    }
}

mlaf_status mlaf_verify_mla_kv_cache(mlaf_context *ctx, const mlaf_verify_case *c,
                                     mlaf_verify_result *r) {
    mlaf_status s = check_case_common(c, r);
    if (s != MLAF_OK) return s;
    if (c->block_size < 1) return MLAF_ERR_INVALID_ARGUMENT;
    const int32_t Q = c->cfg.q_lora_rank, C = c->cfg.kv_lora_rank, R = c->cfg.qk_rope_head_dim;
    const int64_t T = c->T, bs = c->block_size, CR = (int64_t)C + R;
    const mlaf_backend be = mlaf_context_backend(ctx);
    const int st = c->strided != 0;
    mlaf_rng rng;
    mlaf_rng_seed(&rng, c->seed);
    norm_bufs b;
    vbuf pos_b, slot_b, cs_b, cache_b, ec_b;
    memset(&pos_b, 0, sizeof pos_b);
    memset(&slot_b, 0, sizeof slot_b);
    memset(&cs_b, 0, sizeof cs_b);
    memset(&cache_b, 0, sizeof cache_b);
    memset(&ec_b, 0, sizeof ec_b);
    int64_t *pos = NULL, *slots = NULL, *perm = NULL;
    unsigned char *canary = NULL;
    const int want_k_nope = c->no_k_pe != 2, want_k_pe = !c->no_k_pe;
    s = norm_bufs_make(&b, be, c, &rng, want_k_nope, want_k_pe);
    if (s != MLAF_OK) goto done;

    /* Cache: room for every token and a few spare blocks; distinct slots in random order,
     * some negative (skip), some past the end (rejected). */
    const int64_t num_blocks = (T + bs - 1) / bs + 3, cap = num_blocks * bs;
    const int64_t s1 = CR + (st ? 3 : 0), s0 = bs * s1 + (st ? 5 : 0);
    pos = (int64_t *)malloc(sizeof(int64_t) * (size_t)(T + 1));
    slots = (int64_t *)malloc(sizeof(int64_t) * (size_t)(T + 1));
    perm = (int64_t *)malloc(sizeof(int64_t) * (size_t)cap);
    if (!pos || !slots || !perm) {
        s = MLAF_ERR_OUT_OF_MEMORY;
        goto done;
    }
    for (int64_t i = 0; i < cap; i++) perm[i] = i;
    for (int64_t i = cap - 1; i > 0; i--) {
        int64_t k = (int64_t)(mlaf_rng_u64(&rng) % (uint64_t)(i + 1)), tmp = perm[i];
        perm[i] = perm[k];
        perm[k] = tmp;
    }
    for (int64_t t = 0; t < T; t++) {
        slots[t] = perm[t];
        if (t % 7 == 2) slots[t] = -1 - t % 3;
        if (t % 11 == 4) slots[t] = cap + t % 4;
    }
    make_positions(&rng, pos, T, VERIFY_MAX_POS);
    if ((s = index_buf(&slot_b, "slot_mapping", be, slots, T, c->index_dtype, st)) != MLAF_OK) goto done;
    const int64_t cs_stride = R + (st ? 3 : 0);
    if (R > 0) {
        if ((s = index_buf(&pos_b, "positions", be, pos, T, c->index_dtype, st)) != MLAF_OK) goto done;
        if ((s = cos_sin_buf(&cs_b, be, R, cs_stride, st)) != MLAF_OK) goto done;
    }
    const size_t ces = mlaf_dtype_size(c->cache_dtype);
    size_t cache_bytes = (size_t)(num_blocks * s0) * ces;
    canary = (unsigned char *)malloc(cache_bytes ? cache_bytes : 1);
    if (!canary) {
        s = MLAF_ERR_OUT_OF_MEMORY;
        goto done;
    }
    {
        /* byte k is draw k: on all threads, the same bytes */
        const mlaf_rng r0 = rng;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
        for (int64_t k = 0; k < (int64_t)cache_bytes; k++) {
            mlaf_rng rk = mlaf_rng_skipped(&r0, (uint64_t)k);
            canary[k] = (unsigned char)(mlaf_rng_u64(&rk) >> 56);
        }
        rng = mlaf_rng_skipped(&r0, (uint64_t)cache_bytes);
    }
    if ((s = vbuf_alloc(&cache_b, "kv_cache", be, cache_bytes, canary, st ? ces : 0)) != MLAF_OK) goto done;
    if ((s = error_count_buf(&ec_b, be)) != MLAF_OK) goto done;

    mlaf_mla_kv_cache_params p = {Q, C, R, c->cfg.rms_norm_eps, c->cfg.rms_norm_eps, c->rope_style};
    mlaf_tensor lt = mlaf_tensor_2d(b.latent.g.ptr, c->dtype, T, (int64_t)Q + C + R, b.LS);
    mlaf_tensor wq = mlaf_tensor_1d(b.w_q.g.ptr, c->weight_dtype, Q);
    mlaf_tensor wkv = mlaf_tensor_1d(b.w_kv.g.ptr, c->weight_dtype, C);
    mlaf_tensor tpos = mlaf_tensor_1d(pos_b.g.ptr, c->index_dtype, T);
    mlaf_tensor tcs = mlaf_tensor_2d(cs_b.g.ptr, MLAF_F32, VERIFY_MAX_POS, R, cs_stride);
    mlaf_tensor tslot = mlaf_tensor_1d(slot_b.g.ptr, c->index_dtype, T);
    mlaf_tensor tcache = mlaf_tensor_3d(cache_b.g.ptr, c->cache_dtype, num_blocks, bs, CR, s0, s1);
    mlaf_tensor tq = tensor_of(&b.vq, T, Q), tk = tensor_of(&b.vk, T, C), tp = tensor_of(&b.vp, T, R);
    mlaf_tensor tec = mlaf_tensor_1d(ec_b.g.ptr, MLAF_I32, 1);
    s = mlaf_mla_kv_cache(ctx, &p, &lt, Q > 0 ? &wq : NULL, &wkv, R > 0 ? &tpos : NULL,
                          R > 0 ? &tcs : NULL, &tslot, &tcache, Q > 0 ? &tq : NULL,
                          want_k_nope ? &tk : NULL, want_k_pe ? &tp : NULL, &tec);
    if (s != MLAF_OK) {
        snprintf(r->detail, sizeof r->detail, "mlaf_mla_kv_cache: %s: %s", mlaf_status_name(s),
                 mlaf_context_last_error(ctx));
        goto done;
    }
    if ((s = mlaf_context_sync(ctx)) != MLAF_OK) goto done;
    vbuf *all[11] = {&b.latent, &b.w_q, &b.w_kv, &b.q, &b.k_nope, &b.k_pe,
                     &pos_b, &slot_b, &cs_b, &cache_b, &ec_b};
    if ((s = fetch_all(all, 11)) != MLAF_OK) goto done;
    if (Q > 0 || want_k_nope) corrupt_outputs(c, Q > 0 ? &b.vq : &b.vk);

    judge j = {r, 0, 0.0, 0};
    const mla_arg ma = {&b, c, Q, C, R, want_k_nope, want_k_pe, &pos_b, &slot_b, &cache_b,
                        (const float *)cs_b.init, cs_stride, pos, slots, num_blocks, bs, s0, s1};
    int64_t errors = 0;
    const size_t scratch = sizeof(double) * (CHUNK_TOKENS * ((size_t)(Q > 0 ? Q : 1) + (size_t)C +
                                                             (size_t)(R > 0 ? R : 1) + (size_t)CR) +
                                             (size_t)(R > 0 ? R : 1) * 2) +
                           CHUNK_TOKENS;
    if ((s = run_chunks(T, CHUNK_TOKENS, scratch, mla_chunk, &ma, &j, &errors)) != MLAF_OK) goto done;
    if (!j.failed) judge_error_count(&j, &ec_b, errors);
    int64_t untouched = 0;
    for (int i = 0; i < 11; i++) untouched += judge_untouched(&j, all[i]);
    judge_finish(&j, "mla_kv_cache", c, untouched);
done:
    free(pos);
    free(slots);
    free(perm);
    free(canary);
    norm_bufs_free(&b);
    vbuf_free(&pos_b);
    vbuf_free(&slot_b);
    vbuf_free(&cs_b);
    vbuf_free(&cache_b);
    vbuf_free(&ec_b);
    return s;
}

/* ---- rope_q ---------------------------------------------------------------------------- */

#define ROPE_CHUNK 16

typedef struct rope_arg {
    const mlaf_verify_case *c;
    const vbuf *q_b, *pos_b;
    const float *cs_host;
    int64_t cs_stride;
    const int64_t *pos;
    int32_t R;
    int64_t H, D, s0, s1;
} rope_arg;

/* Tokens [t0, t0 + n): every head's rotated rope part; *errors counts rejected positions. */
static void rope_chunk(const void *arg, void *scratch, int64_t t0, int64_t n, judge *j,
                       int64_t *errors) {
    const rope_arg *a = (const rope_arg *)arg;
    const mlaf_verify_case *c = a->c;
    const mlaf_dtype dt = c->dtype;
    const size_t es = mlaf_dtype_size(dt);
    const int32_t R = a->R;
    const int64_t H = a->H, D = a->D, s0 = a->s0, s1 = a->s1;
    double *qref = (double *)scratch, *allow = qref + ROPE_CHUNK * H * D;
    int8_t *status = (int8_t *)(allow + (size_t)R * 2);
    mlaf_rope_q_job hj;
    memset(&hj, 0, sizeof hj);
    hj.rope.R = R;
    hj.rope.style = c->rope_style;
    hj.rope.positions = a->pos_b->init + (size_t)t0 * mlaf_dtype_size(c->index_dtype);
    hj.rope.pos_dt = c->index_dtype;
    hj.rope.cos_sin = a->cs_host;
    hj.rope.cos_sin_stride = a->cs_stride;
    hj.rope.max_pos = VERIFY_MAX_POS;
    hj.T = n;
    hj.H = H;
    hj.D = (int32_t)D;
    hj.q = a->q_b->init + (size_t)(t0 * s0) * es;
    hj.dt = dt;
    hj.s0 = s0;
    hj.s1 = s1;
    mlaf_ref_rope_q(&hj, qref, status);
    for (int64_t u = 0; u < n; u++) {
        int64_t t = t0 + u;
        if (status[u] < 0) {
            ++*errors;
            continue; /* unrotated: every byte must be unchanged */
        }
        for (int64_t h = 0; h < H; h++) {
            const char *head = (const char *)a->q_b->init + (size_t)(t * s0 + h * s1) * es;
            const double *rotated = qref + (u * H + h) * D + (D - R);
            double *xin = allow + R;
            for (int32_t i = 0; i < R; i++) xin[i] = mlaf_load_f32(head, dt, D - R + i);
            rope_allowance(xin, R, c->rope_style, a->cs_host + a->pos[t] * a->cs_stride, allow);
            vview v = {(vbuf *)a->q_b, dt, h * s1 + (D - R), s0};
            for (int32_t i = 0; i < R; i++) judge_value(j, &v, "q(rope part)", t, i, rotated[i], allow[i]);
        }
    }
}

mlaf_status mlaf_verify_rope_q(mlaf_context *ctx, const mlaf_verify_case *c, mlaf_verify_result *r) {
    memset(r, 0, sizeof *r);
    const int32_t R = c->cfg.qk_rope_head_dim;
    const int64_t H = c->cfg.num_heads, D = (int64_t)c->cfg.qk_nope_head_dim + R, T = c->T;
    if (R <= 0 || H < 1 || c->cfg.qk_nope_head_dim < 0 || T < 0) return MLAF_ERR_INVALID_ARGUMENT;
    const mlaf_backend be = mlaf_context_backend(ctx);
    const int st = c->strided != 0;
    const mlaf_dtype dt = c->dtype;
    const size_t es = mlaf_dtype_size(dt);
    mlaf_rng rng;
    mlaf_rng_seed(&rng, c->seed);
    vbuf q_b, pos_b, cs_b, ec_b;
    memset(&q_b, 0, sizeof q_b);
    memset(&pos_b, 0, sizeof pos_b);
    memset(&cs_b, 0, sizeof cs_b);
    memset(&ec_b, 0, sizeof ec_b);
    int64_t *pos = NULL;
    void *img = NULL;
    mlaf_status s;
    const int64_t s1 = D + (st ? 3 : 0), s0 = H * s1 + (st ? 5 : 0);
    const int64_t cs_stride = R + (st ? 3 : 0);
    size_t qbytes = (size_t)(T * s0) * es;
    img = malloc(qbytes ? qbytes : 1);
    pos = (int64_t *)malloc(sizeof(int64_t) * (size_t)(T + 1));
    if (!img || !pos) {
        s = MLAF_ERR_OUT_OF_MEMORY;
        goto done;
    }
    fill_fast_normal_par(&rng, img, dt, T * s0, 0.0, 1.0);
    if ((s = vbuf_alloc(&q_b, "q", be, qbytes, img, st ? 3 * es : 0)) != MLAF_OK) goto done;
    make_positions(&rng, pos, T, VERIFY_MAX_POS);
    if ((s = index_buf(&pos_b, "positions", be, pos, T, c->index_dtype, st)) != MLAF_OK) goto done;
    if ((s = cos_sin_buf(&cs_b, be, R, cs_stride, st)) != MLAF_OK) goto done;
    if ((s = error_count_buf(&ec_b, be)) != MLAF_OK) goto done;

    mlaf_rope_params p = {R, c->rope_style};
    mlaf_tensor tq = mlaf_tensor_3d(q_b.g.ptr, dt, T, H, D, s0, s1);
    mlaf_tensor tpos = mlaf_tensor_1d(pos_b.g.ptr, c->index_dtype, T);
    mlaf_tensor tcs = mlaf_tensor_2d(cs_b.g.ptr, MLAF_F32, VERIFY_MAX_POS, R, cs_stride);
    mlaf_tensor tec = mlaf_tensor_1d(ec_b.g.ptr, MLAF_I32, 1);
    s = mlaf_rope_q(ctx, &p, &tq, &tpos, &tcs, &tec);
    if (s != MLAF_OK) {
        snprintf(r->detail, sizeof r->detail, "mlaf_rope_q: %s: %s", mlaf_status_name(s),
                 mlaf_context_last_error(ctx));
        goto done;
    }
    if ((s = mlaf_context_sync(ctx)) != MLAF_OK) goto done;
    vbuf *all[4] = {&q_b, &pos_b, &cs_b, &ec_b};
    if ((s = fetch_all(all, 4)) != MLAF_OK) goto done;
    {
        const vview v = {&q_b, dt, D - R, s0};
        corrupt_outputs(c, &v);
    }

    judge j = {r, 0, 0.0, 0};
    const rope_arg ra = {c, &q_b, &pos_b, (const float *)cs_b.init, cs_stride, pos, R, H, D, s0, s1};
    int64_t errors = 0;
    const size_t scratch =
        sizeof(double) * ((size_t)(ROPE_CHUNK * H * D) + (size_t)R * 2) + ROPE_CHUNK;
    if ((s = run_chunks(T, ROPE_CHUNK, scratch, rope_chunk, &ra, &j, &errors)) != MLAF_OK) goto done;
    if (!j.failed) judge_error_count(&j, &ec_b, errors);
    int64_t untouched = 0;
    for (int i = 0; i < 4; i++) untouched += judge_untouched(&j, all[i]);
    judge_finish(&j, "rope_q", c, untouched);
done:
    free(img);
    free(pos);
    vbuf_free(&q_b);
    vbuf_free(&pos_b);
    vbuf_free(&cs_b);
    vbuf_free(&ec_b);
    return s;
}
