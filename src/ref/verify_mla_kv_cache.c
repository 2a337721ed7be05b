/*
 * verify_mla_kv_cache.c — mlaf_verify_mla_kv_cache: a case on the context's backend (a paged
 * cache of canary bytes, distinct slots in random order, some skipped and some rejected), the
 * op, and q, k_nope, the roped k_pe and every cache row a valid slot names against the float64
 * oracle (ref_norm.c). How buffers are judged: verify_case.h.
 *
 * Cache formats (docs/kv_formats.md; the case's kv_format):
 *   plain       each cache value within 1 unit of the oracle rounded once to the cache dtype,
 *               the rope part in the cache row or in the separate kpe array
 *   fp8,        the dense outputs are always requested, and then
 *   fp8_ds_mla  (a) q / k_nope / k_pe against the oracle as for plain;
 *               (b) every byte of every written record equals the reference encoder
 *                   (ref_kv_format.c) applied to the implementation's OWN dense k_nope / k_pe
 *                   row, bit for bit (e4m3 bytes, tile scales, rope bf16);
 *               (d) every unsaturated e4m3 byte decodes (b * scale, b / scale for MUL, b * the
 *                   record's tile scale) to within half an e4m3 ulp of its dense value;
 *               amax_out (fp8, when asked) equals max(its initial value, the encoder's max |x|
 *               over the rows written), bit for bit;
 *               with no_k_pe set, a second call with those dense outputs omitted (made first,
 *               its q into a scratch buffer) must leave its own cache, kpe and amax_out equal,
 *               byte for byte, to the full call's.
 *   fp8_v4      as fp8_ds_mla: (a), (b) against the encoder's 584 bytes at their planar places
 *               (data row at page + o * 576, scale row at page + block_size * 576 + o * 8), (d)
 *               with the record's own UE8M0 byte.
 * Rows no slot names, row and block padding, and the scale stay as they were (canaries).
 *
 * kv_rope_tail (docs/mla.md, kv_rope_tail, the case's kv_rope_tail; R = 0): k_nope's last `tail` values are the
 * oracle's rotation of its normalized kv rounded to the latent dtype. The allowance of those values
 * is rope_allowance's plus, where the implementation's fp32 norm may round an input to the other
 * neighbour (the oracle's value within 2^-16 of a rounding boundary), that neighbour's step times
 * its coefficient (f32: 2^-20 of the terms); a rejected token's tail must stay as it was.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../fp8.h"
#include "verify_case.h"

typedef struct mla_arg {
    const norm_bufs *b;
    const mlaf_verify_case *c;
    int32_t Q, C, R;
    int32_t tail, RP;      /* kv_rope_tail; the rope width of positions / cos_sin (R or tail) */
    int want_k_nope, want_k_pe;
    const vbuf *pos_b, *slot_b, *cache_b;
    const float *cs_host;
    int64_t cs_stride;
    const int64_t *pos, *slots;
    int64_t num_blocks, bs, s0, s1;
    int64_t n_map;         /* slot_mapping entries */
    mlaf_kv_format fmt;
    mlaf_dtype cache_dt;   /* the cache's dtype as allocated */
    const vbuf *kpe_b;     /* the separate rope array, or NULL */
    int64_t ks0, ks1;
    mlaf_kv_encoding enc;  /* fp8 formats */
    int64_t rec;           /* fp8 formats: record bytes */
    float *row_amax;       /* [T]: per token, the encoder's max |x| (written rows), else -1 */
} mla_arg;

/* The host job of the oracle for tokens [t0, t0 + n). */
static mlaf_kv_cache_job chunk_job(const mla_arg *a, int64_t t0, int64_t n) {
    const mlaf_verify_case *c = a->c;
    mlaf_kv_cache_job hj;
    memset(&hj, 0, sizeof hj);
    hj.norm = host_norm_job(a->b, c, t0, n);
    hj.rope.R = a->RP;
    hj.rope.style = c->rope_style;
    hj.kv_tail = a->tail;
    hj.rope.positions = a->pos_b->init ? a->pos_b->init + (size_t)t0 * mlaf_dtype_size(c->index_dtype) : NULL;
    hj.rope.pos_dt = c->index_dtype;
    hj.rope.cos_sin = a->cs_host;
    hj.rope.cos_sin_stride = a->cs_stride;
    hj.rope.max_pos = VERIFY_MAX_POS;
    const int64_t left = a->n_map - t0;
    hj.n_map = left <= 0 ? 0 : (left < n ? left : n);
    hj.slots = hj.n_map > 0 ? a->slot_b->init + (size_t)t0 * mlaf_dtype_size(c->index_dtype) : NULL;
    hj.slot_dt = c->index_dtype;
    hj.format = a->fmt;
    hj.cache_dt = a->cache_dt;
    hj.num_blocks = a->num_blocks;
    hj.block_size = a->bs;
    hj.cache_s0 = a->s0;
    hj.cache_s1 = a->s1;
    return hj;
}

/* Scratch of one chunk: the oracle's outputs and, for the fp8 formats, one token's dense row
 * and record. */
typedef struct mla_scratch {
    double *rq, *rk, *rp, *rows, *allow, *raw;
    float *nope, *pe, *tiles;
    uint8_t *rec;
} mla_scratch;

static size_t scratch_bytes(int32_t Q, int32_t C, int32_t R, int64_t rec) {
    const size_t q1 = (size_t)(Q > 0 ? Q : 1), r1 = (size_t)(R > 0 ? R : 1);
    return sizeof(double) * (CHUNK_TOKENS * (q1 + (size_t)C + r1 + (size_t)C + (size_t)R + (size_t)C) + r1 * 2 +
                             (size_t)C * 2) +
           sizeof(float) * ((size_t)C + r1 + (size_t)C / 64 + 1) + (size_t)rec + CHUNK_TOKENS + 16;
}

static mla_scratch scratch_of(void *scratch, int32_t Q, int32_t C, int32_t R) {
    mla_scratch s;
    const int32_t q1 = Q > 0 ? Q : 1, r1 = R > 0 ? R : 1;
    s.rq = (double *)scratch;
    s.rk = s.rq + CHUNK_TOKENS * q1;
    s.rp = s.rk + CHUNK_TOKENS * C;
    s.rows = s.rp + CHUNK_TOKENS * r1;
    s.allow = s.rows + CHUNK_TOKENS * ((int64_t)C + R);
    s.raw = s.allow + r1 * 2 + (int64_t)C * 2; /* the allowance may cover a kv tail of up to C */
    s.nope = (float *)(s.raw + (int64_t)CHUNK_TOKENS * C);
    s.pe = s.nope + C;
    s.tiles = s.pe + r1;
    s.rec = (uint8_t *)(s.tiles + C / 64 + 1); /* then the chunk's status bytes */
    return s;
}

/* The byte offset of record byte i (fp8 formats) of a slot, and its buffer. */
static const vbuf *record_byte(const mla_arg *a, int64_t slot, int64_t i, size_t *at) {
    const int64_t blk = slot / a->bs, off = slot % a->bs;
    if (a->fmt == MLAF_KV_FP8_V4) { /* planar page: data rows, then scale rows */
        *at = (size_t)(blk * a->s0 + (i < 576 ? off * 576 + i : a->bs * 576 + off * 8 + (i - 576)));
        return a->cache_b;
    }
    if (a->kpe_b && i >= a->C) {
        *at = (size_t)(blk * a->ks0 + off * a->ks1 + (i - a->C));
        return a->kpe_b;
    }
    *at = (size_t)(blk * a->s0 + off * a->s1 + i);
    return a->cache_b;
}

static const char *ds_part(const mla_arg *a, int64_t i) {
    if (a->fmt == MLAF_KV_FP8) return i < a->C ? "k_nope e4m3" : "rope e4m3";
    if (a->fmt == MLAF_KV_FP8_V4)
        return i < 448 ? "nope e4m3" : i < 576 ? "rope bf16" : i < 583 ? "scale ue8m0" : "scale row zero byte";
    if (i < a->C) return "k_nope e4m3";
    return i < a->C + a->C / 32 ? "tile scale f32 LE" : "rope bf16";
}

/* Record checks (b) and (d) of one written token t at slot `slot`, its dense row in
 * s->nope / s->pe. */
static void check_record(const mla_arg *a, const mla_scratch *s, int64_t t, int64_t slot, judge *j) {
    const int32_t C = a->C, R = a->R;
    a->row_amax[t] = mlaf_ref_kv_encode(&a->enc, s->nope, s->pe, s->rec, s->tiles);
    int bad = 0;
    for (int64_t i = 0; i < a->rec; i++) {
        size_t at;
        const vbuf *vb = record_byte(a, slot, i, &at);
        vb->claimed[at] = 1;
        const uint8_t got = ((const uint8_t *)vb->g.body)[at];
        j->values++;
        if (got != s->rec[i] && !bad++) {
            const int64_t k = a->fmt == MLAF_KV_FP8_DS_MLA && i >= C ? i - C : i;
            char what[96] = "";
            if (a->fmt == MLAF_KV_FP8_V4)
                snprintf(what, sizeof what, " (dense x = %.9g, block scale %.9g)",
                         i < 576 ? s->nope[i < 448 ? i : 448 + (i - 448) / 2] : 0.0,
                         s->tiles[i < 448 ? i / 64 : i >= 576 && i < 583 ? i - 576 : 0]);
            else if (i < C)
                snprintf(what, sizeof what, " (dense x = %.9g, %s %.9g)", s->nope[i],
                         a->fmt == MLAF_KV_FP8 ? "scale" : "tile scale",
                         a->fmt == MLAF_KV_FP8 ? a->enc.scale : s->tiles[i / 128]);
            else if (a->fmt == MLAF_KV_FP8)
                snprintf(what, sizeof what, " (dense x = %.9g, scale %.9g)", s->pe[i - C], a->enc.scale);
            else if (i < C + C / 32)
                snprintf(what, sizeof what, " (tile %lld's scale %.9g)", (long long)((i - C) / 4), s->tiles[(i - C) / 4]);
            else
                snprintf(what, sizeof what, " (dense k_pe = %.9g)", s->pe[(i - C - C / 32) / 2]);
            judge_fail(j, "%s(%s byte %lld)[t=%lld,i=%lld]: slot %lld: got 0x%02x, expected 0x%02x%s",
                       a->kpe_b && i >= C ? "kpe" : "kv_cache", ds_part(a, i), (long long)i, (long long)t,
                       (long long)k, (long long)slot, got, s->rec[i], what);
        }
    }
    /* (d): decode what the implementation wrote, with its own tile scales */
    const int64_t ne = a->fmt == MLAF_KV_FP8 ? (int64_t)C + R : a->fmt == MLAF_KV_FP8_V4 ? 448 : C;
    for (int64_t i = 0; i < ne; i++) {
        size_t at;
        const vbuf *vb = record_byte(a, slot, i, &at);
        const uint8_t got = ((const uint8_t *)vb->g.body)[at];
        const float x = i < C ? s->nope[i] : s->pe[i - C];
        float scale = a->enc.scale;
        mlaf_fp8_conv conv = a->enc.conv;
        if (a->fmt == MLAF_KV_FP8_DS_MLA) {
            size_t sat;
            const vbuf *sb = record_byte(a, slot, C + 4 * (i / 128), &sat);
            const uint8_t *p = (const uint8_t *)sb->g.body + sat;
            scale = mlaf_bits_f32((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
            conv = MLAF_FP8_DIV;
        } else if (a->fmt == MLAF_KV_FP8_V4) {
            size_t sat;
            const vbuf *sb = record_byte(a, slot, 576 + i / 64, &sat);
            scale = ldexpf(1.0f, (int)((const uint8_t *)sb->g.body)[sat] - 127);
            conv = MLAF_FP8_DIV;
        }
        double ratio;
        if (mlaf_ref_fp8_decode_check(got, x, scale, conv, &ratio) == 0) {
            const double d = mlaf_e4m3_to_f32(got);
            judge_fail(j,
                       "%s(decoded)[t=%lld,i=%lld]: 0x%02x decodes to %.9g, dense value %.9g: %.3g x half "
                       "an e4m3 ulp (scale %.9g, %s)",
                       a->kpe_b && i >= C ? "kpe" : "kv_cache", (long long)t, (long long)i, got,
                       conv == MLAF_FP8_MUL ? d / scale : d * scale, x, ratio, scale,
                       conv == MLAF_FP8_MUL ? "multiplied" : "divided");
            break;
        }
    }
}

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
    mla_scratch sc = scratch_of(scratch, Q, C, R);
    int8_t *status = (int8_t *)(sc.rec + a->rec);
    const int plain = a->fmt == MLAF_KV_PLAIN;
    vview vcache = {(vbuf *)a->cache_b, a->cache_dt, 0, 0};
    vview vkpe = {(vbuf *)a->kpe_b, a->cache_dt, 0, 0};
    mlaf_kv_cache_job hj = chunk_job(a, t0, n);
    const int32_t tail = a->tail, C0 = C - tail; /* k_nope values [C0, C) are the roped tail */
    if (tail > 0) mlaf_ref_split_qk_norm(&hj.norm, NULL, sc.raw, NULL); /* the unrounded kv */
    mlaf_ref_mla_kv_cache(&hj, Q > 0 ? sc.rq : NULL, sc.rk, sc.rp, sc.rows, status);
    for (int64_t u = 0; u < n; u++) {
        int64_t t = t0 + u;
        *errors += status[u] < 0;
        if (!plain) a->row_amax[t] = -1.0f;
        for (int32_t i = 0; i < Q; i++) judge_value(j, &b->vq, "q", t, i, sc.rq[u * Q + i], 0);
        double *tallow = sc.allow + 2 * (a->RP > 0 ? a->RP : 1);
        if (tail > 0 && status[u] >= 0)
            tail_allowance(sc.raw + u * C + C0, tail, c->dtype, a->cs_host + a->pos[t] * a->cs_stride, tallow);
        if (a->want_k_nope) {
            for (int32_t i = 0; i < C0; i++) judge_value(j, &b->vk, "k_nope", t, i, sc.rk[u * C + i], 0);
            if (status[u] >= 0) /* a rejected token's tail stays as it was */
                for (int32_t i = C0; i < C; i++)
                    judge_value(j, &b->vk, "k_nope(rope tail)", t, i, sc.rk[u * C + i], tallow[i - C0]);
        }
        if (status[u] < 0) continue; /* nothing of the rope part or cache row may be written */
        double *allow = sc.allow;
        if (R > 0) {
            /* rounding allowance from the un-rotated values */
            double *x = allow + R;
            const char *lrow = (const char *)b->latent.init + (size_t)(t * b->LS) * es;
            for (int32_t i = 0; i < R; i++) x[i] = mlaf_load_f32(lrow, c->dtype, (int64_t)Q + C + i);
            rope_allowance(x, R, c->rope_style, c->rope_style == MLAF_ROPE_NONE ? NULL : a->cs_host + a->pos[t] * a->cs_stride, allow);
            if (a->want_k_pe)
                for (int32_t i = 0; i < R; i++) judge_value(j, &b->vp, "k_pe", t, i, sc.rp[u * R + i], allow[i]);
        }
        if (status[u] != 1) continue;
        const int64_t slot = a->slots[t];
        if (!plain) {
            /* the implementation's own dense row, as stored */
            for (int32_t i = 0; i < C; i++)
                sc.nope[i] = mlaf_load_f32(b->vk.b->g.body, c->dtype, b->vk.off + t * b->vk.stride + i);
            for (int32_t i = 0; i < R; i++)
                sc.pe[i] = mlaf_load_f32(b->vp.b->g.body, c->dtype, b->vp.off + t * b->vp.stride + i);
            check_record(a, &sc, t, slot, j);
            continue;
        }
        vcache.off = (slot / bs) * a->s0 + (slot % bs) * a->s1;
        for (int64_t i = 0; i < C; i++)
            judge_value(j, &vcache, i < C0 ? "kv_cache(k_nope part)" : "kv_cache(rope tail)", t, i, sc.rows[u * CR + i],
                        i < C0 ? 0 : tallow[i - C0]);
        if (a->kpe_b) {
            vkpe.off = (slot / bs) * a->ks0 + (slot % bs) * a->ks1;
            for (int64_t i = 0; i < R; i++)
                judge_value(j, &vkpe, "kpe", t, i, sc.rows[u * CR + C + i], allow[i]);
        } else {
            for (int64_t i = 0; i < R; i++)
                judge_value(j, &vcache, "kv_cache(rope part)", t, C + i, sc.rows[u * CR + C + i], allow[i]);
        }
    }
}

/* Before the call, for a fitted fp8 scale: the oracle's max |x| (rounded to the latent dtype)
 * of every token that writes a cache row, per token into row_amax. */
static void fit_chunk(const void *arg, void *scratch, int64_t t0, int64_t n, judge *j, int64_t *errors) {
    (void)j;
    (void)errors;
    const mla_arg *a = (const mla_arg *)arg;
    const int32_t Q = a->Q, C = a->C, R = a->R;
    mla_scratch sc = scratch_of(scratch, Q, C, R);
    int8_t *status = (int8_t *)(sc.rec + a->rec);
    mlaf_kv_cache_job hj = chunk_job(a, t0, n);
    mlaf_ref_mla_kv_cache(&hj, Q > 0 ? sc.rq : NULL, sc.rk, sc.rp, sc.rows, status);
    for (int64_t u = 0; u < n; u++) {
        double m = -1.0;
        if (status[u] == 1) {
            m = 0.0;
            for (int32_t i = 0; i < C + R; i++) {
                const double v = fabs(mlaf_round_to(sc.rows[u * ((int64_t)C + R) + i], a->c->dtype));
                if (v > m) m = v;
            }
        }
        a->row_amax[t0 + u] = (float)m;
    }
}

static int is_byte_dtype(mlaf_dtype d) { return d == MLAF_U8 || d == MLAF_FP8_E4M3; }

/* A cache array of canary bytes (the same bytes on any number of threads); rng moves on. */
static mlaf_status canary_buf(vbuf *b, const char *name, mlaf_backend be, size_t bytes, size_t misalign,
                              mlaf_rng *rng) {
    unsigned char *canary = (unsigned char *)malloc(bytes ? bytes : 1);
    if (!canary) return MLAF_ERR_OUT_OF_MEMORY;
    /* byte k is draw k */
    const mlaf_rng r0 = *rng;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int64_t k = 0; k < (int64_t)bytes; k++) {
        mlaf_rng rk = mlaf_rng_skipped(&r0, (uint64_t)k);
        canary[k] = (unsigned char)(mlaf_rng_u64(&rk) >> 56);
    }
    *rng = mlaf_rng_skipped(&r0, (uint64_t)bytes);
    mlaf_status s = vbuf_alloc(b, name, be, bytes, canary, misalign);
    free(canary);
    return s;
}

/* The second cache set must equal the first byte for byte (guards intact). */
static void judge_same_bytes(judge *j, const vbuf *first, const vbuf *second, const char *what) {
    if (!first->live || !second->live) return;
    if (!mlaf_gbuf_guards_ok(&second->g)) {
        judge_fail(j, "%s: guard zone around the buffer was written", second->name);
        return;
    }
    const unsigned char *x = (const unsigned char *)first->g.body, *y = (const unsigned char *)second->g.body;
    for (size_t k = 0; k < first->bytes; k++)
        if (x[k] != y[k]) {
            judge_fail(j, "%s: byte %lld differs without the dense outputs (0x%02x, with them 0x%02x)", what,
                       (long long)k, y[k], x[k]);
            return;
        }
}

mlaf_status mlaf_verify_mla_kv_cache(mlaf_context *ctx, const mlaf_verify_case *c,
                                     mlaf_verify_result *r) {
    if (c->indexer) return mlaf_verify_mla_kv_cache_dsa(ctx, c, r);
    mlaf_status s = check_case_common(c, r);
    if (s != MLAF_OK) return s;
    if (c->block_size < 1 || (unsigned)c->kv_format >= MLAF_KV_FORMAT_COUNT_) return MLAF_ERR_INVALID_ARGUMENT;
    const int32_t Q = c->cfg.q_lora_rank, C = c->cfg.kv_lora_rank, R = c->cfg.qk_rope_head_dim;
    const int32_t tail = c->kv_rope_tail, RP = R > 0 ? R : tail;
    const int64_t T = c->T, bs = c->block_size, CR = (int64_t)C + R;
    const mlaf_kv_format fmt = c->kv_format;
    const int plain = fmt == MLAF_KV_PLAIN, ds = fmt == MLAF_KV_FP8_DS_MLA, v4 = fmt == MLAF_KV_FP8_V4;
    const int kpe_sep = c->kpe_separate && !ds && R > 0;
    const int want_amax = fmt == MLAF_KV_FP8 && c->want_amax;
    const int64_t N = c->map_short > 0 ? (T > c->map_short ? T - c->map_short : 0) : T;
    const mlaf_backend be = mlaf_context_backend(ctx);
    const int st = c->strided != 0;
    mlaf_rng rng;
    mlaf_rng_seed(&rng, c->seed);
    norm_bufs b;
    vbuf pos_b, slot_b, cs_b, cache_b, kpe_b, ec_b, scale_b, amax_b, cache2_b, kpe2_b, amax2_b, q2_b, k2_b;
    vbuf *bufs[] = {&pos_b, &slot_b, &cs_b, &cache_b, &kpe_b, &ec_b, &scale_b, &amax_b,
                    &cache2_b, &kpe2_b, &amax2_b, &q2_b, &k2_b};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) memset(bufs[i], 0, sizeof *bufs[i]);
    int64_t *pos = NULL, *slots = NULL, *perm = NULL;
    float *row_amax = NULL;
    /* The fp8 formats are judged on the implementation's own dense rows: always ask for them;
     * no_k_pe then asks for a second call without them (see the opening comment). */
    const int want_k_nope = plain ? c->no_k_pe != 2 : 1, want_k_pe = tail > 0 ? 0 : plain ? !c->no_k_pe : 1;
    const int second_call = !plain && c->no_k_pe != 0;
    s = norm_bufs_make(&b, be, c, &rng, want_k_nope, want_k_pe);
    if (s != MLAF_OK) goto done;

    /* Cache: room for every token and a few spare blocks; distinct slots in random order,
     * some negative (skip), some past the end (rejected). */
    const int64_t num_blocks = (T + bs - 1) / bs + 3, cap = num_blocks * bs;
    const mlaf_dtype cdt = plain ? c->cache_dtype : (is_byte_dtype(c->cache_dtype) ? c->cache_dtype : MLAF_FP8_E4M3);
    const int64_t rec = plain ? 0 : mlaf_kv_record_bytes(fmt, cdt, C, R);
    const int64_t width = ds || v4 ? rec : (kpe_sep ? C : CR);
    int64_t s1, s0;
    if (v4) { /* a planar page: stride[1] is the record, stride[0] the page (bytes, a multiple of 16) */
        s1 = 584;
        s0 = (bs * 584 + 15) / 16 * 16 + (st ? 48 : 0);
    } else if (ds) { /* strides in bytes, multiples of 16 */
        s1 = (rec + 15) / 16 * 16 + (st ? 16 : 0);
        s0 = bs * s1 + (st ? 32 : 0);
    } else {
        s1 = width + (st ? 3 : 0);
        s0 = bs * s1 + (st ? 5 : 0);
    }
    const int64_t ks1 = R + (st ? 5 : 0), ks0 = bs * ks1 + (st ? 7 : 0);
    pos = (int64_t *)malloc(sizeof(int64_t) * (size_t)(T + 1));
    slots = (int64_t *)malloc(sizeof(int64_t) * (size_t)(T + 1));
    perm = (int64_t *)malloc(sizeof(int64_t) * (size_t)cap);
    row_amax = (float *)malloc(sizeof(float) * (size_t)(T + 1));
    if (!pos || !slots || !perm || !row_amax) {
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
    if ((s = index_buf(&slot_b, "slot_mapping", be, slots, N, c->index_dtype, st)) != MLAF_OK) goto done;
    const int64_t cs_stride = RP + (st ? 3 : 0);
    if (RP > 0) {
        if ((s = index_buf(&pos_b, "positions", be, pos, T, c->index_dtype, st)) != MLAF_OK) goto done;
        if ((s = cos_sin_buf(&cs_b, be, RP, cs_stride, st)) != MLAF_OK) goto done;
    }

    mla_arg ma = {&b, c, Q, C, R, tail, RP, want_k_nope, want_k_pe, &pos_b, &slot_b, &cache_b,
                  (const float *)cs_b.init, cs_stride, pos, slots, num_blocks, bs, s0, s1,
                  N, fmt, cdt, kpe_sep ? &kpe_b : NULL, ks0, ks1,
                  {fmt, c->fp8_conv, 1.0f, c->tile_scale, C, R}, rec, row_amax};
    const size_t scratch = scratch_bytes(Q, C, R, rec);
    judge j = {r, 0, 0.0, 0};
    int64_t errors = 0;

    /* The fp8 scale: given, or fitted to the rows written. */
    if (fmt == MLAF_KV_FP8) {
        float scale = c->fp8_scale;
        if (!(scale > 0.0f)) {
            const double target = c->fp8_scale < 0.0f ? -(double)c->fp8_scale : 300.0;
            if ((s = run_chunks(T, CHUNK_TOKENS, scratch, fit_chunk, &ma, &j, &errors)) != MLAF_OK) goto done;
            double m = 0.0;
            for (int64_t t = 0; t < T; t++)
                if (row_amax[t] > m) m = row_amax[t];
            scale = 1.0f;
            if (m > 0.0 && isfinite(m)) scale = (float)(c->fp8_conv == MLAF_FP8_MUL ? target / m : m / target);
            errors = 0;
        }
        ma.enc.scale = scale;
        if ((s = vbuf_alloc(&scale_b, "scale", be, sizeof scale, &scale, 0)) != MLAF_OK) goto done;
        if (want_amax) {
            const float a0 = c->amax_init;
            if ((s = vbuf_alloc(&amax_b, "amax_out", be, sizeof a0, &a0, 0)) != MLAF_OK) goto done;
            if (second_call && (s = vbuf_alloc(&amax2_b, "amax_out (second call)", be, sizeof a0, &a0, 0)) != MLAF_OK)
                goto done;
        }
    }

    const size_t ces = mlaf_dtype_size(cdt);
    const size_t cache_bytes = (size_t)(num_blocks * s0) * ces, kpe_bytes = (size_t)(num_blocks * ks0) * ces;
    const size_t cmis = ds || v4 ? (st ? 16 : 0) : (st ? ces : 0), kmis = st ? 3 * ces : 0;
    {
        const mlaf_rng r0 = rng;
        if ((s = canary_buf(&cache_b, "kv_cache", be, cache_bytes, cmis, &rng)) != MLAF_OK) goto done;
        if (kpe_sep && (s = canary_buf(&kpe_b, "kpe", be, kpe_bytes, kmis, &rng)) != MLAF_OK) goto done;
        if (second_call) { /* the same canaries */
            mlaf_rng r2 = r0;
            if ((s = canary_buf(&cache2_b, "kv_cache (second call)", be, cache_bytes, cmis, &r2)) != MLAF_OK)
                goto done;
            if (kpe_sep && (s = canary_buf(&kpe2_b, "kpe (second call)", be, kpe_bytes, kmis, &r2)) != MLAF_OK)
                goto done;
        }
    }
    if ((s = error_count_buf(&ec_b, be)) != MLAF_OK) goto done;

    mlaf_mla_kv_cache_params p = {Q, C, R, c->cfg.rms_norm_eps, c->cfg.rms_norm_eps, c->rope_style, tail};
    mlaf_tensor lt = mlaf_tensor_2d(b.latent.g.ptr, c->dtype, T, (int64_t)Q + C + R, b.LS);
    mlaf_tensor wq = mlaf_tensor_1d(b.w_q.g.ptr, c->weight_dtype, Q);
    mlaf_tensor wkv = mlaf_tensor_1d(b.w_kv.g.ptr, c->weight_dtype, C);
    mlaf_tensor tpos = mlaf_tensor_1d(pos_b.g.ptr, c->index_dtype, T);
    mlaf_tensor tcs = mlaf_tensor_2d(cs_b.g.ptr, MLAF_F32, VERIFY_MAX_POS, RP, cs_stride);
    mlaf_tensor tslot = mlaf_tensor_1d(slot_b.g.ptr, c->index_dtype, N);
    mlaf_tensor tcache = mlaf_tensor_3d(cache_b.g.ptr, cdt, num_blocks, bs, width, s0, s1);
    mlaf_tensor tkpe = mlaf_tensor_3d(kpe_b.g.ptr, cdt, num_blocks, bs, R, ks0, ks1);
    mlaf_tensor tscale = mlaf_tensor_1d(scale_b.g.ptr, MLAF_F32, 1);
    mlaf_tensor tamax = mlaf_tensor_1d(amax_b.g.ptr, MLAF_F32, 1);
    mlaf_tensor tq = tensor_of(&b.vq, T, Q), tk = tensor_of(&b.vk, T, C), tp = tensor_of(&b.vp, T, R);
    mlaf_tensor tec = mlaf_tensor_1d(ec_b.g.ptr, MLAF_I32, 1);
    mlaf_kv_cache_desc desc = {fmt, &tcache, kpe_sep ? &tkpe : NULL, fmt == MLAF_KV_FP8 ? &tscale : NULL,
                               want_amax ? &tamax : NULL, c->fp8_conv, c->tile_scale};
    const char *entry = plain && !kpe_sep ? "mlaf_mla_kv_cache" : "mlaf_mla_kv_cache_fmt";

    if (second_call) {
        /* First the call without the omitted dense outputs; its q (and k_nope, when kept) go to
         * scratch buffers, so that the latent stays as uploaded also for an in-place case. */
        const size_t es = mlaf_dtype_size(c->dtype);
        if (Q > 0 && (s = vbuf_alloc(&q2_b, "q (second call)", be, (size_t)(T * Q) * es, NULL, 0)) != MLAF_OK)
            goto done;
        if (c->no_k_pe == 1 && (s = vbuf_alloc(&k2_b, "k_nope (second call)", be, (size_t)(T * C) * es, NULL, 0)) != MLAF_OK)
            goto done;
        mlaf_tensor tq2 = mlaf_tensor_2d(q2_b.g.ptr, c->dtype, T, Q, Q), tk2 = mlaf_tensor_2d(k2_b.g.ptr, c->dtype, T, C, C);
        mlaf_tensor tc2 = tcache, tkpe2 = tkpe, tamax2 = tamax;
        tc2.data = cache2_b.g.ptr;
        tkpe2.data = kpe2_b.g.ptr;
        tamax2.data = amax2_b.g.ptr;
        mlaf_kv_cache_desc d2 = desc;
        d2.cache = &tc2;
        d2.kpe = kpe_sep ? &tkpe2 : NULL;
        d2.amax_out = want_amax ? &tamax2 : NULL;
        s = mlaf_mla_kv_cache_fmt(ctx, &p, &lt, Q > 0 ? &wq : NULL, &wkv, RP > 0 ? &tpos : NULL, RP > 0 ? &tcs : NULL,
                                  &tslot, &d2, Q > 0 ? &tq2 : NULL, c->no_k_pe == 1 ? &tk2 : NULL, NULL, NULL);
        if (s != MLAF_OK) {
            snprintf(r->detail, sizeof r->detail, "mlaf_mla_kv_cache_fmt (without the dense outputs): %s: %s",
                     mlaf_status_name(s), mlaf_context_last_error(ctx));
            goto done;
        }
    }
    if (plain && !kpe_sep)
        s = mlaf_mla_kv_cache(ctx, &p, &lt, Q > 0 ? &wq : NULL, &wkv, RP > 0 ? &tpos : NULL,
                              RP > 0 ? &tcs : NULL, &tslot, &tcache, Q > 0 ? &tq : NULL,
                              want_k_nope ? &tk : NULL, want_k_pe ? &tp : NULL, &tec);
    else
        s = mlaf_mla_kv_cache_fmt(ctx, &p, &lt, Q > 0 ? &wq : NULL, &wkv, RP > 0 ? &tpos : NULL,
                                  RP > 0 ? &tcs : NULL, &tslot, &desc, Q > 0 ? &tq : NULL,
                                  want_k_nope ? &tk : NULL, want_k_pe ? &tp : NULL, &tec);
    if (s != MLAF_OK) {
        snprintf(r->detail, sizeof r->detail, "%s: %s: %s", entry, mlaf_status_name(s), mlaf_context_last_error(ctx));
        goto done;
    }
    if ((s = mlaf_context_sync(ctx)) != MLAF_OK) goto done;
    vbuf *all[14] = {&b.latent, &b.w_q, &b.w_kv, &b.q, &b.k_nope, &b.k_pe, &pos_b,
                     &slot_b, &cs_b, &cache_b, &kpe_b, &ec_b, &scale_b, &amax_b};
    vbuf *second[3] = {&cache2_b, &kpe2_b, &amax2_b};
    if ((s = fetch_all(all, 14)) != MLAF_OK) goto done;
    if ((s = fetch_all(second, 3)) != MLAF_OK) goto done;
    if (plain) {
        if (Q > 0 || want_k_nope) corrupt_outputs(c, Q > 0 ? &b.vq : &b.vk);
    } else if (c->corrupt_from > 0) {
        /* the harness's own test, fp8 formats: byte 0 of the record of every written token
         * from corrupt_from - 1 on, every 500th, one e4m3 step off */
        for (int64_t t = c->corrupt_from - 1; t < N; t += 500) {
            const int pos_ok = RP == 0 || c->rope_style == MLAF_ROPE_NONE || (pos[t] >= 0 && pos[t] < VERIFY_MAX_POS);
            if (slots[t] < 0 || slots[t] >= cap || !pos_ok) continue;
            ((unsigned char *)cache_b.g.body)[(slots[t] / bs) * s0 + (slots[t] % bs) * (v4 ? 576 : s1)] ^= 1u;
        }
    }

    if ((s = run_chunks(T, CHUNK_TOKENS, scratch, mla_chunk, &ma, &j, &errors)) != MLAF_OK) goto done;
    if (!j.failed) judge_error_count(&j, &ec_b, errors);
    if (!j.failed && want_amax) {
        float want = c->amax_init;
        for (int64_t t = 0; t < T; t++)
            if (row_amax[t] > want) want = row_amax[t];
        float got;
        memcpy(&got, amax_b.g.body, sizeof got);
        memset(amax_b.claimed, 1, sizeof got);
        j.values++;
        if (mlaf_f32_bits(got) != mlaf_f32_bits(want))
            judge_fail(&j, "amax_out: got %.9g (0x%08x), expected %.9g (0x%08x): max(initial %.9g, max |x| of the rows written)",
                       got, mlaf_f32_bits(got), want, mlaf_f32_bits(want), c->amax_init);
    }
    if (second_call) {
        judge_same_bytes(&j, &cache_b, &cache2_b, "kv_cache (call without the dense outputs)");
        judge_same_bytes(&j, &kpe_b, &kpe2_b, "kpe (call without the dense outputs)");
        judge_same_bytes(&j, &amax_b, &amax2_b, "amax_out (call without the dense outputs)");
    }
    int64_t untouched = 0;
    for (int i = 0; i < 14; i++) untouched += judge_untouched(&j, all[i]);
    judge_finish(&j, "mla_kv_cache", c, untouched);
done:
    free(pos);
    free(slots);
    free(perm);
    free(row_amax);
    norm_bufs_free(&b);
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) vbuf_free(bufs[i]);
    return s;
}
