/*
 * moe_gate.c — CPU router top-k (docs/moe_gate.md).
 *
 * Per token, all in fp32:
 *   1. Load the logits row into a float scratch row (bf16 / f16 widened branch-free so the
 *      loop vectorizes) and note which logits are finite.
 *   2. s = sigmoid(x) or softmax over the finite logits, with an exp of our own (range
 *      reduction + degree-7 polynomial, <= 2 ulp) that the compiler vectorizes; libm's expf
 *      does not, and the exp is most of the arithmetic. sqrt_softplus (DeepSeek-V4): the
 *      same exp, a branch-free log1p on [0, 1] and sqrt; logits below -20 are redone with
 *      libm (s = exp(x / 2), down to subnormal results).
 *   3. c = s + bias; every expert gets a 32-bit rank value: the order-preserving integer map
 *      of c when its logit and bias are finite, else 1 (below every finite c, above "not
 *      eligible" = 0). With the index as tie-break this is one total order, the same one the
 *      oracle and the CUDA kernel use, so ties resolve identically everywhere.
 *   4. Groups (n_group > 1): score = top-2 sum / max of the valid c in each group; the
 *      topk_group best (valid first, score descending, lower index) stay.
 *   5. Top-k over the kept groups by insertion into a sorted list of k 64-bit keys
 *      (rank value << 32 | ~index); after the first few experts almost every candidate is
 *      rejected by one compare, so this is O(E) per token.
 *   6. Weights, renormalization (skipped when sum + eps is 0), scaling, shared experts.
 *
 * Hash routing (mlaf_moe_gate_hash, job->tid2eid set): the same scores, then ids from the
 * table and weights gathered at them (hash_token, portable build only: no top-k to speed up).
 *
 * Threads: the CPU backend's parallel-for over tokens (parallel.h: the thread count from the
 * logits' bytes, chunks of tokens claimed by whichever thread is free; small calls run on the
 * calling thread). Scratch rows live on each thread's stack (E <= 2048: 24 KiB).
 */
#include <math.h>
#include <string.h>

#include "../half.h"
#include "cpu.h"
#include "../score.h"

/* moe_gate_avx2.c / moe_gate_avx512.c include this file with GATE_SUFFIX set: the same
 * per-token code compiled for a wider instruction set (8 / 16 lanes instead of SSE2's 4, and
 * the unsigned max SSE2 lacks); only the file without a suffix holds the dispatcher. */
#ifndef GATE_SUFFIX
#define GATE_SUFFIX _portable
#define GATE_MAIN 1
#endif
#define GATE_CAT_(a, b) a##b
#define GATE_CAT(a, b) GATE_CAT_(a, b)
#define GATE_ROWS GATE_CAT(mlaf_cpu_moe_gate_rows, GATE_SUFFIX)

#ifdef GATE_MAIN
#include "parallel.h"
#endif

/* The selects below (finite / clamp) are plain data flow, but GCC will not if-convert a float
 * compare while FP exceptions may be observed; nothing here reads the FP flags, so let the
 * per-expert loops vectorize (CMakeLists.txt adds -fno-math-errno for sqrtf). -ffp-contract=off from the build still applies. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

#define GATE_MAX_E 2048
#define GATE_MAX_G 64

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Order-preserving map of a float onto uint32 (for non-NaN input). */
static inline uint32_t ord32(float f) {
    uint32_t u = f32_bits(f);
    uint32_t neg = (uint32_t)((int32_t)u >> 31); /* all ones for negative values */
    return u ^ (neg | 0x80000000u);              /* branch-free, so the loops vectorize */
}

/* e^x for finite x, <= 2 ulp over the range that matters; saturates instead of returning
 * inf / subnormals (sigmoid and softmax only need the value to be tiny or huge there). */
static inline float unord32(uint32_t v) {
    return bits_f32((v & 0x80000000u) ? (v & 0x7fffffffu) : ~v);
}

static inline float gate_exp(float x) {
    x = x < -87.3f ? -87.3f : x;
    x = x > 88.3f ? 88.3f : x;
    /* k = round(x / ln2) by the 1.5 * 2^23 trick: exact for |k| < 2^22, no libm call. */
    float k = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - k * 0.693145751953125f; /* ln2 high part has 16 bits: k * it is exact */
    r = r - k * 1.428606765330187e-06f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t ki = (int32_t)k;
    return p * bits_f32((uint32_t)(ki + 127) << 23);
}

static inline int is_finite_bits(uint32_t u) { return (u & 0x7f800000u) != 0x7f800000u; }

/* Widens one logits row to f32. */
static void load_row(const void *row, mlaf_dtype dt, int32_t E, float *x) {
    if (dt == MLAF_F32) {
        memcpy(x, row, sizeof(float) * (size_t)E);
    } else if (dt == MLAF_BF16) {
        const uint16_t *h = (const uint16_t *)row;
        for (int32_t e = 0; e < E; e++) x[e] = bits_f32((uint32_t)h[e] << 16);
    } else {
        /* f16: shift the exponent and mantissa into place and rescale by 2^112, which also
         * turns f16 subnormals into the right f32 value; inf / NaN keep an all-ones exponent. */
        const uint16_t *h = (const uint16_t *)row;
        for (int32_t e = 0; e < E; e++) {
            uint32_t em = (uint32_t)(h[e] & 0x7fffu) << 13;
            uint32_t sign = (uint32_t)(h[e] & 0x8000u) << 16;
            uint32_t fin = f32_bits(bits_f32(em) * 0x1p112f);
            uint32_t u = em >= (0x7c00u << 13) ? (em | 0x7f800000u) : fin;
            x[e] = bits_f32(u | sign);
        }
    }
}

/* log1p(u) for u in [0, 1]: log(v), v = 1 + u, as 2 atanh(z) with z = (v - 1) / (v + 1) <= 1/3
 * (nine odd terms: truncation below 2e-9 relative), times u / (v - 1), which gives back what the
 * rounding of 1 + u lost (Goldberg's log1p); v - 1 is exact. Branch-free, so it vectorizes. */
static inline float gate_log1p01(float u) {
    const float v = 1.0f + u, d = v - 1.0f;
    const float z = d / (v + 1.0f), z2 = z * z;
    float p = 1.0f / 17.0f;
    p = p * z2 + 1.0f / 15.0f;
    p = p * z2 + 1.0f / 13.0f;
    p = p * z2 + 1.0f / 11.0f;
    p = p * z2 + 1.0f / 9.0f;
    p = p * z2 + 1.0f / 7.0f;
    p = p * z2 + 1.0f / 5.0f;
    p = p * z2 + 1.0f / 3.0f;
    p = p * z2 + 1.0f;
    const float l = 2.0f * z * p;
    return d == 0.0f ? u : l * (u / d);
}

/* sqrt(softplus(x)) of a row of finite values (non-finite entries: anything), in fp32 without
 * overflow: softplus(x) = max(x, 0) + log1p(exp(-|x|)) with exp(-|x|) in (0, 1] (x + a term
 * below 2.1e-9 above 20). Below -20 log1p(exp(x)) = exp(x) to fp32, so s = exp(x / 2): a second,
 * scalar pass with libm's expf for those (rare) experts, which also gives the subnormal values
 * below -174 that gate_exp's clamp would not. */
static void sqrt_softplus_row(const float *restrict x, float *restrict s, int32_t E) {
    for (int32_t e = 0; e < E; e++) {
        const float xe = is_finite_bits(f32_bits(x[e])) ? x[e] : 0.0f;
        const float a = bits_f32(f32_bits(xe) & 0x7fffffffu);
        const float sp = (xe > 0.0f ? xe : 0.0f) + gate_log1p01(gate_exp(-a));
        s[e] = sqrtf(sp);
    }
    for (int32_t e = 0; e < E; e++)
        if (x[e] < -20.0f) s[e] = expf(0.5f * x[e]);
}

/* sigmoid of a row (non-finite entries: anything). */
static void sigmoid_row(const float *restrict x, float *restrict s, int32_t E) {
    for (int32_t e = 0; e < E; e++) {
        float xe = is_finite_bits(f32_bits(x[e])) ? x[e] : 0.0f;
        s[e] = 1.0f / (1.0f + gate_exp(-xe));
    }
}

/* softmax over the finite values of a row (the others: s = 0 here, marked invalid by the callers). */
static void softmax_row(const float *restrict x, float *restrict s, int32_t E) {
    float m = -INFINITY;
    for (int32_t e = 0; e < E; e++) {
        float xe = is_finite_bits(f32_bits(x[e])) ? x[e] : -INFINITY;
        m = xe > m ? xe : m;
    }
    /* Eight partial sums: a fixed order the compiler may vectorize, and a shorter
     * rounding chain than one running sum over 2048 terms. */
    float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int32_t e = 0;
    for (; e + 8 <= E; e += 8)
        for (int l = 0; l < 8; l++) {
            float xe = x[e + l];
            float d = is_finite_bits(f32_bits(xe)) ? xe - m : -87.3f;
            float ex = is_finite_bits(f32_bits(xe)) ? gate_exp(d) : 0.0f;
            s[e + l] = ex;
            part[l] += ex;
        }
    for (; e < E; e++) {
        float xe = x[e];
        float ex = is_finite_bits(f32_bits(xe)) ? gate_exp(xe - m) : 0.0f;
        s[e] = ex;
        part[e & 7] += ex;
    }
    float sum = ((part[0] + part[1]) + (part[2] + part[3])) +
                ((part[4] + part[5]) + (part[6] + part[7]));
    /* No valid logit at all: sum is 0 and every s becomes NaN below anyway. */
    float inv_ok = sum > 0.0f ? sum : 1.0f;
    for (e = 0; e < E; e++) s[e] = s[e] / inv_ok;
}

/* s of a widened row of E logits by score f (non-finite logits: any finite value, the callers
 * mark them invalid): the CPU's one choice of per-score code (src/score.h). An elementwise
 * score's row function also serves one logit (E = 1: hash routing's chosen experts). */
static void gate_score_row(mlaf_score_func f, const float *restrict x, float *restrict s, int32_t E) {
    switch (f) {
    case MLAF_SCORE_SOFTMAX: softmax_row(x, s, E); break;
    case MLAF_SCORE_SQRT_SOFTPLUS: sqrt_softplus_row(x, s, E); break;
    case MLAF_SCORE_SIGMOID:
    default: sigmoid_row(x, s, E); break;
    }
}

static void gate_scores(const mlaf_moe_gate_job *job, const float *restrict x, float *restrict s) {
    gate_score_row(job->score_func, x, s, job->E);
}

typedef struct gate_scratch {
    float x[GATE_MAX_E];
    float s[GATE_MAX_E];
    uint32_t v[GATE_MAX_E]; /* rank value: ord32(c) if valid, else 1 */
} gate_scratch;

/* 6. From the k routed ids and their unnormalized weights w (0 for invalid experts):
 * renormalization (skipped when sum + eps is 0), scaling, shared experts, and the stores of
 * ids, weights and the scores row s. id and w have room for 128 entries. */
static void gate_finish(const mlaf_moe_gate_job *job, int64_t t, int32_t *id, float *w,
                        const float *s) {
    const int32_t k = job->top_k, E = job->E;
    float sum = 0.0f;
    for (int32_t j = 0; j < k; j++) sum += w[j];
    float routed = sum;
    if (job->renormalize) {
        float denom = sum + job->eps;
        routed = 0.0f;
        for (int32_t j = 0; j < k; j++) {
            if (denom > 0.0f) w[j] = w[j] / denom;
            routed += w[j];
        }
    }
    if (job->apply_scaling)
        for (int32_t j = 0; j < k; j++) w[j] *= job->scaling;
    for (int32_t j = 0; j < job->n_shared; j++) {
        id[k + j] = E + j;
        w[k + j] = routed / job->scaling;
    }

    int32_t *ids = job->ids + t * job->ids_stride;
    memcpy(ids, id, sizeof(int32_t) * (size_t)job->K);
    void *wrow = (char *)job->weights + (size_t)(t * job->weights_stride) * mlaf_dtype_size(job->weights_dt);
    if (job->weights_dt == MLAF_F32)
        memcpy(wrow, w, sizeof(float) * (size_t)job->K);
    else
        for (int32_t j = 0; j < job->K; j++) mlaf_store_f32(wrow, job->weights_dt, j, w[j]);
    if (job->scores) memcpy(job->scores + t * job->scores_stride, s, sizeof(float) * (size_t)E);
}

static void gate_token(const mlaf_moe_gate_job *job, int64_t t, gate_scratch *sc) {
    const int32_t E = job->E, G = job->n_group, P = E / G, k = job->top_k;
    const size_t lsz = mlaf_dtype_size(job->logits_dt);
    const void *row = (const char *)job->logits + (size_t)(t * job->logits_stride) * lsz;
    float *restrict x = sc->x, *restrict s = sc->s;
    uint32_t *restrict v = sc->v;

    /* 1-2. scores */
    load_row(row, job->logits_dt, E, x);
    gate_scores(job, x, s);

    /* 3. selection values */
    /* Two loops rather than "bias ? bias[e] : 0", which the compiler may not speculate. */
    const float *bias = job->bias;
    if (bias) {
        for (int32_t e = 0; e < E; e++) {
            int ok = is_finite_bits(f32_bits(x[e])) & is_finite_bits(f32_bits(bias[e]));
            float ce = (s[e] + bias[e]) + 0.0f; /* + 0 turns -0 into +0: one key per value */
            v[e] = ok ? ord32(ce) : 1u;
        }
    } else {
        for (int32_t e = 0; e < E; e++) {
            int ok = is_finite_bits(f32_bits(x[e]));
            v[e] = ok ? ord32(s[e] + 0.0f) : 1u;
        }
    }
    for (int32_t e = 0; e < E; e++) s[e] = is_finite_bits(f32_bits(x[e])) ? s[e] : NAN;

    /* 4. groups */
    uint64_t kept = ~0ull;
    if (G > 1) {
        uint64_t gkey[GATE_MAX_G];
        for (int32_t g = 0; g < G; g++) {
            /* On the rank values (monotonic in c, 1 for invalid): integer max and count
             * reductions vectorize where a branchy float top-2 scan does not. */
            const uint32_t *vg = v + (size_t)g * P;
            uint32_t m1 = 0, m2 = 0, n1 = 0;
            for (int32_t i = 0; i < P; i++) m1 = vg[i] > m1 ? vg[i] : m1;
            for (int32_t i = 0; i < P; i++) n1 += vg[i] == m1;
            for (int32_t i = 0; i < P; i++) m2 = (vg[i] < m1 && vg[i] > m2) ? vg[i] : m2;
            if (n1 >= 2) m2 = m1;
            uint32_t gv;
            if (m1 <= 1u)
                gv = 0; /* no valid expert */
            else if (job->group_score == MLAF_GROUP_MAX || m2 <= 1u)
                gv = m1;
            else
                gv = ord32((unord32(m1) + unord32(m2)) + 0.0f);
            gkey[g] = ((uint64_t)gv << 32) | (uint32_t)(0xFFFFFFFFu - (uint32_t)g);
        }
        kept = 0;
        for (int32_t g = 0; g < G; g++) {
            int better = 0;
            for (int32_t h = 0; h < G; h++) better += gkey[h] > gkey[g];
            if (better < job->topk_group) kept |= 1ull << g;
        }
    }

    /* 5. top-k by insertion; 0 is below every eligible key (rank values are >= 1) */
    uint64_t best[64];
    for (int32_t j = 0; j < k; j++) best[j] = 0;
    /* Experts are visited in index order, so one whose rank value does not exceed the
     * current k-th's loses to it; blocks of 8 with no larger value are skipped whole. */
    uint32_t thr = 0;
    for (int32_t g = 0; g < G; g++) {
        if (!((kept >> g) & 1)) continue;
        for (int32_t e0 = g * P; e0 < (g + 1) * P; e0 += 8) {
            int32_t n = (g + 1) * P - e0 < 8 ? (g + 1) * P - e0 : 8;
            uint32_t bm = 0;
            if (n == 8) /* a fixed trip count the compiler turns into one vector max */
                for (int32_t i = 0; i < 8; i++) bm = v[e0 + i] > bm ? v[e0 + i] : bm;
            else
                for (int32_t i = 0; i < n; i++) bm = v[e0 + i] > bm ? v[e0 + i] : bm;
            if (bm <= thr) continue;
            for (int32_t e = e0; e < e0 + n; e++) {
                uint64_t key = ((uint64_t)v[e] << 32) | (uint32_t)(0xFFFFFFFFu - (uint32_t)e);
                if (key <= best[k - 1]) continue;
                int32_t j = k - 1;
                while (j > 0 && best[j - 1] < key) {
                    best[j] = best[j - 1];
                    j--;
                }
                best[j] = key;
            }
            thr = (uint32_t)(best[k - 1] >> 32);
        }
    }

    /* 6. weights */
    float w[128];
    int32_t id[128];
    for (int32_t j = 0; j < k; j++) {
        int32_t e = (int32_t)(0xFFFFFFFFu - (uint32_t)best[j]);
        id[j] = e;
        w[j] = (best[j] >> 32) > 1 ? s[e] : 0.0f;
    }
    gate_finish(job, t, id, w, s);
}

void GATE_ROWS(const mlaf_moe_gate_job *job, int64_t t0, int64_t t1);
void GATE_ROWS(const mlaf_moe_gate_job *job, int64_t t0, int64_t t1) {
    gate_scratch sc;
    for (int64_t t = t0; t < t1; t++) gate_token(job, t, &sc);
}

#ifdef GATE_MAIN
/* Token t's table row, or NULL for a token id outside the table. */
static const char *hash_row(const mlaf_moe_gate_job *job, int64_t t) {
    const int64_t tok = job->token_ids_dt == MLAF_I32 ? (int64_t)((const int32_t *)job->token_ids)[t]
                                                      : ((const int64_t *)job->token_ids)[t];
    if (tok < 0 || tok >= job->vocab) return NULL;
    return (const char *)job->tid2eid + (size_t)(tok * job->tid2eid_stride) * mlaf_dtype_size(job->tid2eid_dt);
}

/* Expert j of a table row. */
static int64_t hash_id(const mlaf_moe_gate_job *job, const char *row, int32_t j) {
    return job->tid2eid_dt == MLAF_I32 ? (int64_t)((const int32_t *)row)[j] : ((const int64_t *)row)[j];
}

/* Hash routing, token t: ids from the table row of token_ids[t]; returns 1 for a bad row
 * (token id outside [0, vocab), an entry outside [0, E) or repeated), which gets ids
 * 0 .. k-1 with weight 0. */
static int hash_token(const mlaf_moe_gate_job *job, int64_t t, gate_scratch *sc) {
    const int32_t E = job->E, k = job->top_k;
    const size_t lsz = mlaf_dtype_size(job->logits_dt);
    const void *row = (const char *)job->logits + (size_t)(t * job->logits_stride) * lsz;
    float *x = sc->x, *s = sc->s;
    /* Softmax and the scores output need the whole row; sigmoid and sqrt_softplus only the k
     * chosen logits (one_score). */
    const int full = mlaf_score_row_wise(job->score_func) || job->scores;
    if (full) {
        load_row(row, job->logits_dt, E, x);
        gate_scores(job, x, s);
        for (int32_t e = 0; e < E; e++) s[e] = is_finite_bits(f32_bits(x[e])) ? s[e] : NAN;
    }

    const char *tr = hash_row(job, t);
    int bad = !tr;
    int32_t id[128];
    float w[128];
    /* seen: one bit per expert, to find repeats in O(k) */
    uint64_t seen[GATE_MAX_E / 64];
    memset(seen, 0, sizeof seen);
    for (int32_t j = 0; j < k && !bad; j++) {
        const int64_t e = hash_id(job, tr, j);
        if (e < 0 || e >= E || ((seen[e >> 6] >> (e & 63)) & 1u)) {
            bad = 1;
            break;
        }
        seen[e >> 6] |= 1ull << (e & 63);
        id[j] = (int32_t)e;
        float se;
        if (full) {
            se = s[e];
        } else {
            const float xe = mlaf_load_f32(row, job->logits_dt, e);
            gate_score_row(job->score_func, &xe, &se, 1);
            se = is_finite_bits(f32_bits(xe)) ? se : NAN;
        }
        w[j] = isnan(se) ? 0.0f : se;
    }
    if (bad)
        for (int32_t j = 0; j < k; j++) id[j] = j, w[j] = 0.0f;
    gate_finish(job, t, id, w, s);
    return bad;
}

/* A token's chain is three dependent reads (its id, its table row, the chosen logits), each
 * likely a miss: tokens HASH_AHEAD_ROW ahead get their table row prefetched, tokens
 * HASH_AHEAD_LOGITS ahead (whose row has arrived by then) the lines of their chosen logits. */
#define HASH_AHEAD_ROW 16
#define HASH_AHEAD_LOGITS 8

static int64_t hash_rows(const mlaf_moe_gate_job *job, int64_t t0, int64_t t1) {
    gate_scratch sc;
    int64_t bad = 0;
    const int full = mlaf_score_row_wise(job->score_func) || job->scores;
    const size_t lsz = mlaf_dtype_size(job->logits_dt);
    for (int64_t t = t0; t < t1; t++) {
        if (t + HASH_AHEAD_ROW < t1) {
            const char *r = hash_row(job, t + HASH_AHEAD_ROW);
            if (r) __builtin_prefetch(r, 0, 3);
        }
        const int64_t ta = t + HASH_AHEAD_LOGITS;
        const char *r = !full && ta < t1 ? hash_row(job, ta) : NULL;
        if (r) {
            const char *row = (const char *)job->logits + (size_t)(ta * job->logits_stride) * lsz;
            for (int32_t j = 0; j < job->top_k; j++) {
                const int64_t e = hash_id(job, r, j);
                if (e >= 0 && e < job->E) __builtin_prefetch(row + (size_t)e * lsz, 0, 3);
            }
        }
        bad += hash_token(job, t, &sc);
    }
    return bad;
}

static int64_t hash_chunk(void *arg, int64_t t0, int64_t t1, int worker) {
    (void)worker;
    return hash_rows((const mlaf_moe_gate_job *)arg, t0, t1);
}

/* Hash routing over all tokens; bad rows counted once per call into job->error_count. */
static mlaf_status cpu_moe_gate_hash(mlaf_context *ctx, const mlaf_moe_gate_job *job) {
    /* the bytes per token: the row for softmax / the scores output, else the k chosen logits
     * (a line each) */
    const int full = mlaf_score_row_wise(job->score_func) || job->scores;
    const int64_t per = full ? (int64_t)job->E * (int64_t)mlaf_dtype_size(job->logits_dt) : 64 * (int64_t)job->top_k;
    const int64_t bad = mlaf_cpu_parallel_for(ctx, job->T, job->T * per, hash_chunk, (void *)job);
    mlaf_error_count_add(job->error_count, bad);
    return MLAF_OK;
}

typedef void (*gate_rows_fn)(const mlaf_moe_gate_job *job, int64_t t0, int64_t t1);
#ifdef MLAF_HAVE_X86_PATHS
void mlaf_cpu_moe_gate_rows_avx2(const mlaf_moe_gate_job *job, int64_t t0, int64_t t1);
void mlaf_cpu_moe_gate_rows_avx512(const mlaf_moe_gate_job *job, int64_t t0, int64_t t1);
#endif

typedef struct gate_call {
    gate_rows_fn rows;
    const mlaf_moe_gate_job *job;
} gate_call;

static int64_t gate_chunk(void *arg, int64_t t0, int64_t t1, int worker) {
    (void)worker;
    const gate_call *c = (const gate_call *)arg;
    c->rows(c->job, t0, t1);
    return 0;
}

mlaf_status mlaf_cpu_moe_gate(mlaf_context *ctx, const mlaf_moe_gate_job *job) {
    if (job->tid2eid) return cpu_moe_gate_hash(ctx, job);
    gate_call c = {mlaf_cpu_moe_gate_rows_portable, job};
#ifdef MLAF_HAVE_X86_PATHS
    if (ctx->isa == MLAF_CPU_ISA_AVX512) c.rows = mlaf_cpu_moe_gate_rows_avx512;
    if (ctx->isa == MLAF_CPU_ISA_AVX2) c.rows = mlaf_cpu_moe_gate_rows_avx2;
#endif
    /* the bytes per token: its logits row (the outputs are k ids and weights) */
    const int64_t per = (int64_t)job->E * (int64_t)mlaf_dtype_size(job->logits_dt);
    mlaf_cpu_parallel_for(ctx, job->T, job->T * per, gate_chunk, &c);
    return MLAF_OK;
}
#endif
