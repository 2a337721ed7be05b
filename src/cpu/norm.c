/*
 * norm.c — CPU split_qk_norm, mla_kv_cache and rope_q: the drivers (tokens over threads) and
 * the portable row kernels.
 *
 * Algorithm, per token t (docs/mla.md):
 *   1. ss_q = sum L[t, :Q]^2 and ss_kv = sum L[t, Q:Q+C]^2 in fp32 — both before anything of
 *      the row is written, so the in-place form (outputs = the latent's own columns) is safe.
 *   2. rstd = 1 / sqrtf(ss / n + eps) per part.
 *   3. q = (x * rstd_q) * w_q; k_nope = (x * rstd_kv) * w_kv, stored once in each output
 *      dtype (mla_kv_cache: also straight from fp32 into the cache row, in the cache dtype).
 *   4. split_qk_norm: k_pe = bit-exact copy. mla_kv_cache: RoPE of k_pe with the position's
 *      cos/sin row (separate fp32 products, never fused) into the dense k_pe and the cache row.
 *      A slot >= num_blocks * block_size or a position outside [0, max_pos) is counted and
 *      writes neither; a negative slot skips the cache row only.
 *   rope_q: step 4's rotation in place on the last R columns of every head.
 *
 * Memory: the scale kernels prefetch the row PREFETCH_ROWS ahead, one line per line they
 * consume. Large calls (MLAF_STREAM_BYTES) write the normalized outputs and the k_pe copy with
 * non-temporal stores on the AVX-512 path (no read-for-ownership, and they leave the caches to
 * the inputs).
 *
 * Threads: the CPU backend's parallel-for (parallel.h: the thread count from the call's bytes,
 * chunks of rows claimed by whichever thread is free; small calls run on the calling thread).
 * The weights are converted to fp32 once per call, on the caller's stack, and read by every
 * thread. Error counts are summed per chunk and added to *error_count once.
 *
 * Vector paths: the row kernels come from a table chosen by ctx->isa (resolved at context
 * creation or forced by mlaf_context_set_cpu_isa). The portable kernels below work on blocks
 * of 64 fp32 values with independent accumulators so the compiler can vectorize them without
 * reassociating; f16 conversions stay scalar here (the AVX2 / AVX-512 paths use F16C).
 *
 * Limits: widths up to 2^20 (the validation layer's limit); weights in f16 / bf16 wider than
 * the scratch (WSCRATCH floats for q and kv together) are converted per block of a row instead.
 */
#include <math.h>
#include <string.h>

#include "../fp8.h"
#include "../half.h"
#include "cpu.h"
#include "norm_kern.h"
#include "norm_writers.h"

#include "parallel.h"

#define BLK 64
#define WSCRATCH 8192 /* floats per call: all presets' Q + C fit (at most 2048) */
/* Calls whose latent exceeds this many bytes stream their outputs past the caches
 * (non-temporal stores: no read-for-ownership of output lines that would only evict the
 * inputs). Overridable at build time to test the streaming path on small cases. */
#ifndef MLAF_STREAM_BYTES
#define MLAF_STREAM_BYTES ((int64_t)16 << 20)
#endif

/* ---- portable row kernels -------------------------------------------------------------- */

static void load_block(const void *x, mlaf_dtype dt, int64_t i0, int m, float *f) {
    if (dt == MLAF_F32) {
        memcpy(f, (const float *)x + i0, (size_t)m * sizeof(float));
    } else if (dt == MLAF_BF16) {
        const uint16_t *p = (const uint16_t *)x + i0;
        for (int j = 0; j < m; j++) f[j] = mlaf_bits_f32((uint32_t)p[j] << 16);
    } else {
        const uint16_t *p = (const uint16_t *)x + i0;
        for (int j = 0; j < m; j++) f[j] = mlaf_f16_to_f32(p[j]);
    }
}

static void store_block(void *out, mlaf_dtype dt, int64_t i0, int m, const float *f) {
    if (dt == MLAF_F32) {
        memcpy((float *)out + i0, f, (size_t)m * sizeof(float));
    } else if (dt == MLAF_BF16) {
        /* Branch-free form of mlaf_f32_to_bf16 (same bits) so the loop vectorizes. */
        uint16_t *p = (uint16_t *)out + i0;
        for (int j = 0; j < m; j++) {
            uint32_t u = mlaf_f32_bits(f[j]);
            uint32_t rne = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
            uint32_t nan = (u >> 16) | 0x40u;
            p[j] = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rne);
        }
    } else {
        uint16_t *p = (uint16_t *)out + i0;
        for (int j = 0; j < m; j++) p[j] = mlaf_f32_to_f16(f[j]);
    }
}

static float sumsq_scalar(const void *x, mlaf_dtype dt, int64_t n) {
    float acc[16] = {0};
    float f[BLK];
    for (int64_t i0 = 0; i0 < n; i0 += BLK) {
        int m = n - i0 < BLK ? (int)(n - i0) : BLK;
        load_block(x, dt, i0, m, f);
        if (m < BLK) memset(f + m, 0, (size_t)(BLK - m) * sizeof(float));
        for (int j = 0; j < BLK; j += 16)
            for (int k = 0; k < 16; k++) acc[k] += f[j + k] * f[j + k];
    }
    for (int k = 0; k < 8; k++) acc[k] += acc[k + 8];
    for (int k = 0; k < 4; k++) acc[k] += acc[k + 4];
    return (acc[0] + acc[2]) + (acc[1] + acc[3]);
}

/* Prefetch of the bytes [b0, b1) of a later row, one request per 64-byte line. */
static void prefetch_bytes(const void *pf, int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; b += 64) __builtin_prefetch((const char *)pf + b, 0, 3);
}

static void scale_scalar(const void *x, mlaf_dtype dt, int64_t n, float rstd, const float *w,
                         void *out, mlaf_dtype odt, void *out2, mlaf_dtype o2dt, int stream,
                         const void *pf) {
    (void)stream;
    const int64_t es = (int64_t)mlaf_dtype_size(dt);
    float f[BLK];
    for (int64_t i0 = 0; i0 < n; i0 += BLK) {
        int m = n - i0 < BLK ? (int)(n - i0) : BLK;
        if (pf) prefetch_bytes(pf, i0 * es, (i0 + m) * es);
        load_block(x, dt, i0, m, f);
        for (int j = 0; j < m; j++) f[j] = (f[j] * rstd) * w[i0 + j];
        if (out) store_block(out, odt, i0, m, f);
        if (out2) store_block(out2, o2dt, i0, m, f);
    }
}

void mlaf_norm_rope_pairs(const void *x, mlaf_dtype dt, int32_t R, mlaf_rope_style style,
                          const float *cs, int32_t first_pair, void *out, mlaf_dtype odt,
                          void *out2, mlaf_dtype o2dt) {
    int32_t h = R / 2;
    for (int32_t i = first_pair; i < h; i++) {
        int64_t a = style == MLAF_ROPE_NEOX ? i : 2 * (int64_t)i;
        int64_t b = style == MLAF_ROPE_NEOX ? (int64_t)i + h : 2 * (int64_t)i + 1;
        float x0 = mlaf_load_f32(x, dt, a), x1 = mlaf_load_f32(x, dt, b);
        float c = cs[i], s = cs[h + i];
        float p0 = x0 * c, p1 = x1 * s, p2 = x1 * c, p3 = x0 * s;
        float y0 = p0 - p1, y1 = p2 + p3;
        if (out) {
            mlaf_store_f32(out, odt, a, y0);
            mlaf_store_f32(out, odt, b, y1);
        }
        if (out2) {
            mlaf_store_f32(out2, o2dt, a, y0);
            mlaf_store_f32(out2, o2dt, b, y1);
        }
    }
}

static void rope_scalar(const void *x, mlaf_dtype dt, int32_t R, mlaf_rope_style style,
                        const float *cs, void *out, mlaf_dtype odt, void *out2, mlaf_dtype o2dt) {
    mlaf_norm_rope_pairs(x, dt, R, style, cs, 0, out, odt, out2, o2dt);
}

static void fence_scalar(void) {}

static void copy_scalar(const void *x, size_t bytes, void *out, int stream) {
    (void)stream;
    memcpy(out, x, bytes);
}

static void convert_scalar(const float *v, int64_t n, void *out, mlaf_dtype odt, int stream) {
    (void)stream;
    for (int64_t i0 = 0; i0 < n; i0 += BLK) store_block(out, odt, i0, n - i0 < BLK ? (int)(n - i0) : BLK, v + i0);
}

static float round_amax_scalar(const float *v, int64_t n, mlaf_dtype dt, float *x, float m) {
    for (int64_t i = 0; i < n; i++) {
        x[i] = dt == MLAF_BF16  ? mlaf_bf16_to_f32(mlaf_f32_to_bf16(v[i]))
               : dt == MLAF_F16 ? mlaf_f16_to_f32(mlaf_f32_to_f16(v[i]))
                                : v[i];
        const float a = fabsf(x[i]);
        m = a > m ? a : m; /* NaN: the comparison is false */
    }
    return m;
}

static void e4m3_scalar(const float *x, int64_t n, float s, int div, uint8_t *out) {
    if (div && mlaf_pow2_recip(s, &s)) div = 0;
    if (div)
        for (int64_t i = 0; i < n; i++) out[i] = mlaf_f32_to_e4m3(x[i] / s);
    else
        for (int64_t i = 0; i < n; i++) out[i] = mlaf_f32_to_e4m3(x[i] * s);
}

const mlaf_norm_kern mlaf_norm_kern_scalar = {sumsq_scalar, scale_scalar, rope_scalar, fence_scalar,
                                              copy_scalar, convert_scalar, round_amax_scalar, e4m3_scalar};

/* ---- dispatch and helpers -------------------------------------------------------------- */

static const mlaf_norm_kern *kern_for(const mlaf_context *ctx) {
#if defined(MLAF_HAVE_X86_PATHS)
    if (ctx->isa == MLAF_CPU_ISA_AVX512)
        return mlaf_norm_avx512_bf16_supported() ? &mlaf_norm_kern_avx512_bf16 : &mlaf_norm_kern_avx512;
    if (ctx->isa == MLAF_CPU_ISA_AVX2) return &mlaf_norm_kern_avx2;
#else
    (void)ctx;
#endif
    return &mlaf_norm_kern_scalar;
}

/* One norm part's weights as fp32: the caller's pointer when already f32, the per-call
 * scratch when it fits, else NULL (converted per block of the row by norm_part). */
typedef struct wview {
    const void *raw;
    mlaf_dtype dt;
    const float *f32;
} wview;

static wview weights_prepare(const void *w, mlaf_dtype wdt, int64_t n, float *scratch,
                             int64_t *used) {
    wview v = {w, wdt, NULL};
    if (!w) return v;
    if (wdt == MLAF_F32) {
        v.f32 = (const float *)w;
    } else if (*used + n <= WSCRATCH) {
        float *dst = scratch + *used;
        for (int64_t i = 0; i < n; i += BLK) load_block(w, wdt, i, n - i < BLK ? (int)(n - i) : BLK, dst + i);
        *used += n;
        v.f32 = dst;
    }
    return v;
}

/* Values per chunk the row loop hands to the writers (on the stack: fp32 values and weights). */
#define CHUNK 1024
/* pe parts up to this many values are roped by the path's kernel in one piece. */
#define PE_MAX 2048

/* kv_rope_tail (docs/mla.md): the values v[a, b) of a chunk whose row offset is i0 that fall in the
 * tail [n - tail, n): rounded to the latent dtype, then rotated in fp32 as interleaved pairs with
 * the position's cos / sin row cs (pair i of the tail: cs[i], cs[tail / 2 + i]), separate
 * products as the path kernels' rotation. The tail starts at an even offset and chunks at even
 * ones, so no pair straddles a chunk. */
static void tail_rope(float *v, int64_t i0, int64_t a, int64_t b, int64_t n, int32_t tail, mlaf_dtype dt,
                      const float *cs) {
    for (int64_t i = a; i < b; i++)
        v[i] = dt == MLAF_BF16  ? mlaf_bf16_to_f32(mlaf_f32_to_bf16(v[i]))
               : dt == MLAF_F16 ? mlaf_f16_to_f32(mlaf_f32_to_f16(v[i]))
                                : v[i];
    for (int64_t i = a; i < b; i += 2) {
        const int64_t pr = (i0 + i - (n - tail)) / 2;
        const float x0 = v[i], x1 = v[i + 1], c = cs[pr], s = cs[tail / 2 + pr];
        const float p0 = x0 * c, p1 = x1 * s, p2 = x1 * c, p3 = x0 * s;
        v[i] = p0 - p1, v[i + 1] = p2 + p3;
    }
}

/* One norm part: (x * rstd) * w in fp32, chunk by chunk, to every writer. pf: the same part of
 * the row PREFETCH_ROWS ahead, or NULL. tail > 0 (the kv part of mla_kv_cache with kv_rope_tail):
 * the last `tail` values are rotated with cs (tail_rope) before the writers see them, and are
 * not handed on at all when cs is NULL (the token is rejected). */
static void norm_part(const mlaf_norm_kern *k, const void *x, mlaf_dtype dt, int64_t n, float rstd,
                      const wview *w, mlaf_row_part part, const mlaf_cpu_row *row, const mlaf_cpu_writer *wr,
                      int nw, const char *pf, int32_t tail, const float *cs) {
    float v[CHUNK], wb[CHUNK];
    const size_t xs = mlaf_dtype_size(dt);
    for (int64_t i0 = 0; i0 < n; i0 += CHUNK) {
        const int m = n - i0 < CHUNK ? (int)(n - i0) : CHUNK;
        const float *wf = w->f32 ? w->f32 + i0 : wb;
        if (!w->f32)
            for (int j = 0; j < m; j += BLK) load_block(w->raw, w->dt, i0 + j, m - j < BLK ? m - j : BLK, wb + j);
        k->scale((const char *)x + i0 * xs, dt, m, rstd, wf, v, MLAF_F32, NULL, MLAF_F32, 0,
                 pf ? pf + i0 * xs : NULL);
        if (tail > 0 && i0 + m > n - tail) {
            const int64_t a = i0 >= n - tail ? 0 : n - tail - i0; /* first tail value of the chunk */
            if (a > 0)
                for (int i = 0; i < nw; i++) wr[i].put(&wr[i], row, part, i0, a, v);
            if (!cs) continue;
            tail_rope(v, i0, a, m, n, tail, dt, cs);
            for (int i = 0; i < nw; i++) wr[i].put(&wr[i], row, part, i0 + a, m - a, v + a);
            continue;
        }
        for (int i = 0; i < nw; i++) wr[i].put(&wr[i], row, part, i0, m, v);
    }
}

/* The roped pe part to every writer: in one piece by the path's kernel, or, past PE_MAX values,
 * CHUNK / 2 pairs at a time with the portable rotation (the same bits). */
static void rope_part(const mlaf_norm_kern *k, const void *x, mlaf_dtype dt, int32_t R, mlaf_rope_style style,
                      const float *cs, const mlaf_cpu_row *row, const mlaf_cpu_writer *wr, int nw) {
    float v[PE_MAX];
    if (style == MLAF_ROPE_NONE) { /* the values as read (exact in fp32), PE_MAX at a time */
        for (int32_t i0 = 0; i0 < R; i0 += PE_MAX) {
            const int32_t n = R - i0 < PE_MAX ? R - i0 : PE_MAX;
            load_block(x, dt, i0, n, v);
            for (int i = 0; i < nw; i++) wr[i].put(&wr[i], row, MLAF_PART_PE, i0, n, v);
        }
        return;
    }
    if (R <= PE_MAX) {
        k->rope(x, dt, R, style, cs, v, MLAF_F32, NULL, MLAF_F32);
        for (int i = 0; i < nw; i++) wr[i].put(&wr[i], row, MLAF_PART_PE, 0, R, v);
        return;
    }
    const int32_t h = R / 2, P = CHUNK / 2;
    for (int32_t p0 = 0; p0 < h; p0 += P) {
        const int32_t np = h - p0 < P ? h - p0 : P;
        float *y0 = v, *y1 = v + P; /* NeoX: the pairs' first and second values; interleaved: y0 holds both */
        for (int32_t i = 0; i < np; i++) {
            const int64_t a = style == MLAF_ROPE_NEOX ? p0 + i : 2 * ((int64_t)p0 + i);
            const int64_t b = style == MLAF_ROPE_NEOX ? (int64_t)p0 + i + h : a + 1;
            const float x0 = mlaf_load_f32(x, dt, a), x1 = mlaf_load_f32(x, dt, b);
            const float c = cs[p0 + i], s = cs[h + p0 + i];
            const float q0 = x0 * c, q1 = x1 * s, q2 = x1 * c, q3 = x0 * s;
            if (style == MLAF_ROPE_NEOX) y0[i] = q0 - q1, y1[i] = q2 + q3;
            else y0[2 * i] = q0 - q1, y0[2 * i + 1] = q2 + q3;
        }
        for (int i = 0; i < nw; i++) {
            if (style == MLAF_ROPE_NEOX) {
                wr[i].put(&wr[i], row, MLAF_PART_PE, p0, np, y0);
                wr[i].put(&wr[i], row, MLAF_PART_PE, (int64_t)h + p0, np, y1);
            } else {
                wr[i].put(&wr[i], row, MLAF_PART_PE, 2 * (int64_t)p0, 2 * (int64_t)np, y0);
            }
        }
    }
}

/* Rows are long compute bursts; without help the next row's loads only start when its sumsq
 * begins, and memory then idles while a row is computed. So the scale kernels request the row
 * PREFETCH_ROWS ahead one line per line they consume: the requests stay few at a time (each
 * needs one of the core's few line-fill buffers) and memory stays busy during the compute.
 * Asking for a whole row at once at the start of the previous one did little: the requests
 * queue behind the fill buffers. See BENCHMARKS.md for the figures. */
#define PREFETCH_ROWS 4

static float rstd_of(float ss, int64_t n, float eps) { return 1.0f / sqrtf(ss / (float)n + eps); }

/* ---- split_qk_norm and mla_kv_cache ---------------------------------------------------- */

/* One call of either op (kv == NULL: split_qk_norm): its rows go to the nw writers; the
 * weights prepared once (wq, wkv: weights_prepare). */
typedef struct norm_call {
    const mlaf_norm_kern *k;
    const mlaf_norm_job *j;
    const mlaf_kv_cache_job *kv;
    const mlaf_cpu_writer *wr;
    int nw, stream;
    wview wq, wkv;
} norm_call;

/* Rows [t0, t1) of the call (a mlaf_cpu_range_fn). Returns the tokens counted. */
static int64_t norm_rows(void *arg, int64_t t0, int64_t t1, int worker) {
    (void)worker;
    const norm_call *c = (const norm_call *)arg;
    const mlaf_norm_kern *k = c->k;
    const mlaf_norm_job *j = c->j;
    const mlaf_kv_cache_job *kv = c->kv;
    const mlaf_cpu_writer *wr = c->wr;
    const int nw = c->nw, stream = c->stream;
    const wview wq = c->wq, wkv = c->wkv;
    const size_t es = mlaf_dtype_size(j->dt);
    const int64_t cap = kv ? kv->num_blocks * kv->block_size : 0;
    const int32_t Q = j->Q, C = j->C, R = j->R, tail = kv ? kv->kv_tail : 0;
    const int64_t row_bytes = ((int64_t)Q + C + R) * (int64_t)es;
    int64_t errors = 0;
    for (int64_t t = t0; t < t1; t++) {
        const char *x = (const char *)j->latent + t * j->latent_stride * (int64_t)es;
        /* within the chunk: the rows after it are likely another thread's */
        const char *pf = t + PREFETCH_ROWS < t1 ? x + PREFETCH_ROWS * j->latent_stride * (int64_t)es : NULL;
        if (pf) prefetch_bytes(pf, ((int64_t)Q + C) * (int64_t)es, row_bytes); /* the k_pe part */
        const char *xkv = x + (int64_t)Q * es, *xpe = x + ((int64_t)Q + C) * es;
        /* both sums before anything of the row is written: the in-place form is safe */
        const float ss_q = Q > 0 ? k->sumsq(x, j->dt, Q) : 0.0f;
        const float ss_kv = k->sumsq(xkv, j->dt, C);
        mlaf_cpu_row row = {t, 1, -1, Q > 0 ? rstd_of(ss_q, Q, j->eps_q) : 0.0f, rstd_of(ss_kv, C, j->eps_kv),
                            xpe, stream};
        const float *cs = NULL;
        if (kv) {
            row.slot = t < kv->n_map ? mlaf_load_index(kv->slots, kv->slot_dt, t) : -1;
            if ((R > 0 && kv->rope.style != MLAF_ROPE_NONE) || tail > 0) {
                const int64_t pos = mlaf_load_index(kv->rope.positions, kv->rope.pos_dt, t);
                if (pos < 0 || pos >= kv->rope.max_pos) row.ok = 0;
                else cs = kv->rope.cos_sin + pos * kv->rope.cos_sin_stride;
            }
            if (row.slot >= cap) row.ok = 0;
            errors += !row.ok;
        }
        if (Q > 0) norm_part(k, x, j->dt, Q, row.rstd_q, &wq, MLAF_PART_Q, &row, wr, nw, pf, 0, NULL);
        norm_part(k, xkv, j->dt, C, row.rstd_kv, &wkv, MLAF_PART_KV, &row, wr, nw, pf ? pf + (int64_t)Q * es : NULL,
                  tail, row.ok ? cs : NULL);
        if (R > 0 && !kv)
            for (int i = 0; i < nw; i++) wr[i].put(&wr[i], &row, MLAF_PART_PE, 0, R, NULL);
        else if (R > 0 && row.ok)
            rope_part(k, xpe, j->dt, R, kv->rope.style, cs, &row, wr, nw);
        for (int i = 0; i < nw; i++)
            if (wr[i].finish) wr[i].finish(&wr[i], &row);
    }
    if (stream) k->fence();
    return errors;
}

const mlaf_norm_kern *mlaf_cpu_norm_kern(const mlaf_context *ctx) { return kern_for(ctx); }

int64_t mlaf_cpu_norm_run(const mlaf_context *ctx, const mlaf_norm_job *j, const mlaf_kv_cache_job *kv,
                          const mlaf_cpu_writer *wr, int nw) {
    const mlaf_norm_kern *k = kern_for(ctx);
    const int64_t W = (int64_t)j->Q + j->C + j->R, bytes = j->T * W * (int64_t)mlaf_dtype_size(j->dt);
    float scratch[WSCRATCH];
    int64_t used = 0;
    norm_call c = {k, j, kv, wr, nw, bytes >= MLAF_STREAM_BYTES, {0}, {0}};
    c.wq = weights_prepare(j->w_q, j->w_q_dt, j->Q, scratch, &used);
    c.wkv = weights_prepare(j->w_kv, j->w_kv_dt, j->C, scratch, &used);
    /* bytes moved: the latent read and about as much written */
    return mlaf_cpu_parallel_for(ctx, j->T, 2 * bytes, norm_rows, &c);
}

mlaf_status mlaf_cpu_split_qk_norm(mlaf_context *ctx, const mlaf_norm_job *job) {
    const mlaf_norm_kern *k = kern_for(ctx);
    mlaf_cpu_writer wr[2] = {mlaf_cpu_writer_dense(k, job)};
    const int nw = 1 + mlaf_cpu_writer_gemm(k, job, &wr[1]);
    mlaf_cpu_norm_run(ctx, job, NULL, wr, nw);
    return MLAF_OK;
}

mlaf_status mlaf_cpu_mla_kv_cache(mlaf_context *ctx, const mlaf_kv_cache_job *job) {
    const mlaf_norm_kern *k = kern_for(ctx);
    mlaf_cpu_writer wr[3] = {mlaf_cpu_writer_dense(k, &job->norm), mlaf_cpu_writer_cache(k, job)};
    const int nw = 2 + mlaf_cpu_writer_gemm(k, &job->norm, &wr[2]);
    int64_t errors = mlaf_cpu_norm_run(ctx, &job->norm, job, wr, nw);
    mlaf_error_count_add(job->error_count, errors);
    return MLAF_OK;
}

/* ---- rope_q ---------------------------------------------------------------------------- */

#define ONES 512 /* values per scale call of the head_norm form's nope part */

#ifndef ROPE_Q_PREFETCH_HEADS
#define ROPE_Q_PREFETCH_HEADS 40
#endif

/* One rope_q call: its kernels and job (the argument of the range functions below). */
typedef struct rope_q_call {
    const mlaf_norm_kern *k;
    const mlaf_rope_q_job *j;
} rope_q_call;

/* Heads [i0, i1) of the flattened [T, H] index (a mlaf_cpu_range_fn). A bad position is counted
 * once per token (at its head 0). */
static int64_t rope_q_heads(void *arg, int64_t i0, int64_t i1, int worker) {
    (void)worker;
    const mlaf_norm_kern *k = ((const rope_q_call *)arg)->k;
    const mlaf_rope_q_job *j = ((const rope_q_call *)arg)->j;
    const size_t es = mlaf_dtype_size(j->dt);
    const mlaf_rope_job *r = &j->rope;
    const int64_t rope_bytes = (int64_t)r->R * (int64_t)es;
    int64_t errors = 0;
    for (int64_t i = i0; i < i1; i++) {
        /* The R columns of consecutive heads are a strided pattern the hardware prefetchers
         * do not run ahead of: ask for the head ROPE_Q_PREFETCH_HEADS ahead, every line of it
         * (GLM-4.7-Flash, T = 65536, 2-core development VM: 73-76 ms without, 31-33 ms at
         * 16 heads ahead, 21-39 ms at 40). */
        if (i + ROPE_Q_PREFETCH_HEADS < i1) {
            const int64_t ia = i + ROPE_Q_PREFETCH_HEADS, ta = ia / j->H, ha = ia % j->H;
            const char *xa = (const char *)j->q + (ta * j->s0 + ha * j->s1 + (j->D - r->R)) * (int64_t)es;
            for (int64_t b = 0; b < rope_bytes; b += 64) __builtin_prefetch(xa + b, 1, 3);
        }
        int64_t t = i / j->H, h = i % j->H;
        int64_t pos = mlaf_load_index(r->positions, r->pos_dt, t);
        if (pos < 0 || pos >= r->max_pos) {
            errors += h == 0;
            continue;
        }
        char *x = (char *)j->q + (t * j->s0 + h * j->s1 + (j->D - r->R)) * (int64_t)es;
        k->rope(x, j->dt, r->R, r->style, r->cos_sin + pos * r->cos_sin_stride, x, j->dt, NULL,
                j->dt);
    }
    return errors;
}

/* The head_norm / q_out form (docs/mla.md, head_norm), items [i0, i1) of the flattened [T, Hpad] index: head
 * h < H read from q, optionally RMS-normalized without weight (rstd in fp32), its last R values
 * rotated in fp32 from the unrounded normalized values, all rounded once into q_out (or in place);
 * heads h >= H of q_out zeroed. A token with a bad position writes nothing and is counted once
 * (at its item h = 0). */
static int64_t rope_q_heads_full(void *arg, int64_t i0, int64_t i1, int worker) {
    (void)worker;
    const mlaf_norm_kern *k = ((const rope_q_call *)arg)->k;
    const mlaf_rope_q_job *j = ((const rope_q_call *)arg)->j;
    const size_t es = mlaf_dtype_size(j->dt);
    const mlaf_rope_job *r = &j->rope;
    const int32_t D = j->D, R = r->R, h2 = R / 2;
    const int none = r->style == MLAF_ROPE_NONE; /* the rope part as the nope part: no rotation */
    float ones[ONES]; /* the scale kernel's weights for the nope part */
    for (int q = 0; q < ONES; q++) ones[q] = 1.0f;
    int64_t errors = 0;
    for (int64_t i = i0; i < i1; i++) {
        const int64_t t = i / j->Hpad, h = i % j->Hpad;
        const int64_t pos = none ? 0 : mlaf_load_index(r->positions, r->pos_dt, t);
        if (!none && (pos < 0 || pos >= r->max_pos)) {
            errors += h == 0;
            continue;
        }
        char *out = j->q_out ? (char *)j->q_out + (t * j->o0 + h * j->o1) * (int64_t)es
                             : (char *)j->q + (t * j->s0 + h * j->s1) * (int64_t)es;
        if (h >= j->H) {
            memset(out, 0, (size_t)D * es); /* +0.0 in every float dtype */
            continue;
        }
        const char *x = (const char *)j->q + (t * j->s0 + h * j->s1) * (int64_t)es;
        const float rstd = j->head_norm ? rstd_of(k->sumsq(x, j->dt, D), D, j->head_eps) : 1.0f;
        const float *cs = none ? NULL : r->cos_sin + pos * r->cos_sin_stride;
        /* the rope part first: out may be x, and the nope part never touches these values. Its
         * normalized values in fp32, rotated from those unrounded inputs by the path's kernel (or,
         * past PE_MAX values, the portable rotation: the same bits), rounded once at the store. */
        char *po = out + (D - R) * (int64_t)es;
        if (none) {
            /* nothing here: the nope part's path below takes all D values */
        } else if (R <= PE_MAX) {
            float f[PE_MAX];
            load_block(x, j->dt, D - R, R, f);
            if (j->head_norm)
                for (int32_t q = 0; q < R; q++) f[q] = f[q] * rstd;
            k->rope(f, MLAF_F32, R, r->style, cs, po, j->dt, NULL, j->dt);
        } else {
            for (int32_t p = 0; p < h2; p++) {
                const int64_t a = D - R + (r->style == MLAF_ROPE_NEOX ? p : 2 * (int64_t)p);
                const int64_t b = r->style == MLAF_ROPE_NEOX ? a + h2 : a + 1;
                float x0 = mlaf_load_f32(x, j->dt, a), x1 = mlaf_load_f32(x, j->dt, b);
                if (j->head_norm) x0 = x0 * rstd, x1 = x1 * rstd;
                const float c = cs[p], s = cs[h2 + p];
                const float p0 = x0 * c, p1 = x1 * s, p2 = x1 * c, p3 = x0 * s;
                mlaf_store_f32(out, j->dt, a, p0 - p1);
                mlaf_store_f32(out, j->dt, b, p2 + p3);
            }
        }
        /* the nope part (style none: every value): (x * rstd) * 1 is x * rstd exactly, so the
         * scale kernel computes it */
        const int64_t plain = none ? D : D - R;
        if (j->head_norm) {
            for (int64_t b0 = 0; b0 < plain; b0 += ONES) {
                const int64_t m = plain - b0 < ONES ? plain - b0 : ONES;
                k->scale(x + b0 * (int64_t)es, j->dt, m, rstd, ones, out + b0 * (int64_t)es, j->dt, NULL, j->dt, 0,
                         NULL);
            }
        } else if (out != x) {
            k->copy(x, (size_t)plain * es, out, 0);
        }
    }
    return errors;
}

mlaf_status mlaf_cpu_rope_q(mlaf_context *ctx, const mlaf_rope_q_job *job) {
    rope_q_call c = {kern_for(ctx), job};
    const int64_t es = (int64_t)mlaf_dtype_size(job->dt);
    int64_t errors;
    if (job->rope.style == MLAF_ROPE_NONE && !job->head_norm && !job->q_out) return MLAF_OK; /* nothing changes */
    if (job->head_norm || job->q_out) {
        const int64_t n = job->T * job->Hpad; /* each head's D values read and written */
        errors = mlaf_cpu_parallel_for(ctx, n, 2 * n * job->D * es, rope_q_heads_full, &c);
    } else {
        const int64_t n = job->T * job->H; /* each head's R values read and written */
        errors = mlaf_cpu_parallel_for(ctx, n, 2 * n * job->rope.R * es, rope_q_heads, &c);
    }
    mlaf_error_count_add(job->error_count, errors);
    return MLAF_OK;
}
