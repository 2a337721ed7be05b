/*
 * test_threads.c — thread counts and contexts: several pthreads at once, each with its own
 * context (on the CPU with 1, 2, 3 and 8 threads, instruction-set paths left to AUTO), run
 * split_qk_norm, mla_kv_cache, rope_q (plain and head_norm), moe_gate, indexer_q and rms_norm_quant
 * (with the residual, y and fp8_1x128_mn scales) concurrently
 * and repeatedly on the same inputs; every result must be bit-identical to a run on one thread
 * of one context. The calls are large enough (over 2 MB moved) for the CPU backend to use all
 * 8 threads (src/cpu/parallel.h). Then: mlaf_context_free joins the context's workers (the
 * process's thread count is back where it was).
 */
#include <dirent.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

enum { T = 2400, Q = 768, C = 512, R = 64, W = Q + C + R, H = 4, D = 256, MAXP = 512,
       NB = 640, BS = 4, PTHREADS = 4, ITERS = 3, E = 256, K = 8, HI = 4, NOPS = 7, HK = Q + C, T4 = (T + 3) / 4 * 4 };

static unsigned char *LAT, *WQ, *WKV, *Q3, *QI;
static int64_t POS[T], SLOT[T];
static float *CS, *LOGITS, *BIAS, *WI;

static void make_inputs(void) {
    mlaf_rng rng;
    mlaf_rng_seed(&rng, 2024);
    LAT = malloc((size_t)T * W * 2);
    WQ = malloc(Q * 2);
    WKV = malloc(C * 2);
    Q3 = malloc((size_t)T * H * D * 2);
    CS = malloc(sizeof(float) * MAXP * R);
    mlaf_fill_normal(&rng, LAT, MLAF_BF16, (size_t)T * W, 0, 1);
    mlaf_fill_normal(&rng, WQ, MLAF_BF16, Q, 1, 0.2);
    mlaf_fill_normal(&rng, WKV, MLAF_BF16, C, 1, 0.2);
    mlaf_fill_normal(&rng, Q3, MLAF_BF16, (size_t)T * H * D, 0, 1);
    mlaf_rope_table_init(CS, MAXP, R, 10000.0);
    LOGITS = malloc(sizeof(float) * T * E);
    BIAS = malloc(sizeof(float) * E);
    QI = malloc((size_t)T * HI * 128 * 2);
    WI = malloc(sizeof(float) * T * HI);
    mlaf_fill_normal(&rng, LOGITS, MLAF_F32, (size_t)T * E, 0, 2);
    mlaf_fill_normal(&rng, BIAS, MLAF_F32, E, 0, 0.1);
    mlaf_fill_normal(&rng, QI, MLAF_BF16, (size_t)T * HI * 128, 0, 1);
    mlaf_fill_normal(&rng, WI, MLAF_F32, (size_t)T * HI, 0, 1);
    for (int t = 0; t < T; t++) {
        POS[t] = t % 17 == 3 ? MAXP + 1 : (int64_t)(mlaf_rng_u64(&rng) % MAXP);
        SLOT[t] = t % 9 == 4 ? -1 : t % 31 == 7 ? NB * BS + 3 : (int64_t)((t * 7) % (NB * BS));
    }
}

/* moe_gate (op 4: DeepSeek-V3's grouped router) and indexer_q (op 5) on fresh buffers; returns the
 * concatenated output bytes (malloc'ed) or NULL. */
static unsigned char *run_op2(mlaf_context *ctx, int op, size_t *bytes, char *why, size_t why_cap) {
    mlaf_backend be = mlaf_context_backend(ctx);
    enum { N = 8 };
    mlaf_gbuf g[N];
    memset(g, 0, sizeof g);
    int32_t zero = 0;
    size_t sizes[N] = {sizeof(float) * T * E, sizeof(float) * E, sizeof(float) * T * K, sizeof(int32_t) * T * K,
                       (size_t)T * HI * 128 * 2, sizeof(float) * T * HI, (size_t)T * HI * 128, sizeof(float) * T * HI};
    const void *init[N] = {LOGITS, BIAS, NULL, NULL, QI, WI, NULL, NULL};
    int outs[N] = {0, 0, 1, 1, 0, 0, 1, 1};
    mlaf_gbuf pos, cs, ec;
    memset(&pos, 0, sizeof pos), memset(&cs, 0, sizeof cs), memset(&ec, 0, sizeof ec);
    mlaf_status st = MLAF_OK;
    for (int i = 0; i < N && st == MLAF_OK; i++) st = mlaf_gbuf_alloc(&g[i], be, sizes[i], init[i], 0);
    if (st == MLAF_OK) st = mlaf_gbuf_alloc(&pos, be, sizeof POS, POS, 0);
    if (st == MLAF_OK) st = mlaf_gbuf_alloc(&cs, be, sizeof(float) * MAXP * R, CS, 0);
    if (st == MLAF_OK) st = mlaf_gbuf_alloc(&ec, be, 4, &zero, 0);
    if (st == MLAF_OK && op == 4) {
        mlaf_moe_gate_params p = {K, 8, 4, MLAF_SCORE_SIGMOID, MLAF_GROUP_TOP2_SUM, 1, 2.5f, 1, 1e-20f, 0};
        mlaf_tensor lg = mlaf_tensor_2d(g[0].ptr, MLAF_F32, T, E, E), b = mlaf_tensor_1d(g[1].ptr, MLAF_F32, E),
                    w = mlaf_tensor_2d(g[2].ptr, MLAF_F32, T, K, K), id = mlaf_tensor_2d(g[3].ptr, MLAF_I32, T, K, K);
        st = mlaf_moe_gate(ctx, &p, &lg, &b, &w, &id, NULL);
    } else if (st == MLAF_OK) {
        mlaf_indexer_params ip = {MLAF_ROPE_NEOX, 1, 1e-6f, 1e-4f, MLAF_INDEX_SCALE_UE8M0};
        mlaf_tensor q = mlaf_tensor_3d(g[4].ptr, MLAF_BF16, T, HI, 128, HI * 128, 128),
                    w = mlaf_tensor_2d(g[5].ptr, MLAF_F32, T, HI, HI),
                    qf = mlaf_tensor_3d(g[6].ptr, MLAF_U8, T, HI, 128, HI * 128, 128),
                    wo = mlaf_tensor_2d(g[7].ptr, MLAF_F32, T, HI, HI), tp = mlaf_tensor_1d(pos.ptr, MLAF_I64, T),
                    tc = mlaf_tensor_2d(cs.ptr, MLAF_F32, MAXP, R, R), te = mlaf_tensor_1d(ec.ptr, MLAF_I32, 1);
        st = mlaf_indexer_q(ctx, &ip, &q, &tp, &tc, &w, &qf, &wo, NULL, NULL, &te);
    }
    if (st == MLAF_OK) st = mlaf_context_sync(ctx);
    size_t total = 4;
    for (int i = 0; i < N; i++) total += outs[i] ? sizes[i] : 0;
    unsigned char *res = NULL;
    if (st == MLAF_OK && (res = malloc(total))) {
        size_t at = 0;
        for (int i = 0; i < N && st == MLAF_OK; i++) {
            if (!outs[i]) continue;
            st = mlaf_gbuf_download(&g[i]);
            memcpy(res + at, g[i].body, sizes[i]);
            at += sizes[i];
        }
        if (st == MLAF_OK) st = mlaf_gbuf_download(&ec);
        if (st == MLAF_OK) memcpy(res + at, ec.body, 4);
        *bytes = total;
    }
    if (st != MLAF_OK) {
        snprintf(why, why_cap, "%s: %s", mlaf_status_name(st), mlaf_context_last_error(ctx));
        free(res);
        res = NULL;
    }
    for (int i = 0; i < N; i++) mlaf_gbuf_free(&g[i]);
    mlaf_gbuf_free(&pos), mlaf_gbuf_free(&cs), mlaf_gbuf_free(&ec);
    return res;
}

/* rms_norm_quant (op 6): x = the latent's first Q + C columns, the residual from the same values,
 * y and fp8_1x128_mn (ue8m0) outputs; returns residual, y, data and scales (malloc'ed) or NULL. */
static unsigned char *run_op3(mlaf_context *ctx, size_t *bytes, char *why, size_t why_cap) {
    mlaf_backend be = mlaf_context_backend(ctx);
    enum { N = 6 };
    mlaf_gbuf g[N];
    memset(g, 0, sizeof g);
    const size_t sizes[N] = {(size_t)T * W * 2, (size_t)T * W * 2, HK * 2, (size_t)T * HK * 2, (size_t)T * HK,
                             sizeof(float) * (HK / 128) * T4};
    const void *init[N] = {LAT, LAT, WKV, NULL, NULL, NULL};
    mlaf_status st = MLAF_OK;
    unsigned char *w = malloc(HK * 2);
    for (int i = 0; i < HK * 2 && w; i++) w[i] = i < Q * 2 ? WQ[i] : WKV[i - Q * 2];
    init[2] = w;
    for (int i = 0; i < N && st == MLAF_OK; i++) st = mlaf_gbuf_alloc(&g[i], be, sizes[i], init[i], 0);
    if (st == MLAF_OK) {
        const mlaf_rms_norm_quant_params p = {1e-6f};
        mlaf_tensor x = mlaf_tensor_2d(g[0].ptr, MLAF_BF16, T, HK, W), r = mlaf_tensor_2d(g[1].ptr, MLAF_BF16, T, HK, W),
                    tw = mlaf_tensor_1d(g[2].ptr, MLAF_BF16, HK), y = mlaf_tensor_2d(g[3].ptr, MLAF_BF16, T, HK, HK),
                    d = mlaf_tensor_2d(g[4].ptr, MLAF_U8, T, HK, HK), s = mlaf_tensor_2d(g[5].ptr, MLAF_F32, HK / 128, T, T4);
        const mlaf_gemm_out q = {MLAF_GEMM_FP8_1X128_MN, MLAF_GEMM_SCALE_UE8M0, &d, &s, 0.0f};
        st = mlaf_rms_norm_quant(ctx, &p, &x, &r, &tw, &y, &q);
    }
    if (st == MLAF_OK) st = mlaf_context_sync(ctx);
    size_t total = 0;
    for (int i = 1; i < N; i++) total += i == 2 ? 0 : sizes[i];
    unsigned char *res = st == MLAF_OK ? malloc(total) : NULL;
    for (int i = 1, at = 0; i < N && res && st == MLAF_OK; i++) {
        if (i == 2) continue;
        st = mlaf_gbuf_download(&g[i]);
        memcpy(res + at, g[i].body, sizes[i]);
        at += (int)sizes[i];
    }
    if (st != MLAF_OK || !res) {
        snprintf(why, why_cap, "%s: %s", mlaf_status_name(st), mlaf_context_last_error(ctx));
        free(res);
        res = NULL;
    } else {
        *bytes = total;
    }
    for (int i = 0; i < N; i++) mlaf_gbuf_free(&g[i]);
    free(w);
    return res;
}

/* Runs one op on fresh buffers; returns the concatenated output bytes (malloc'ed) or NULL. */
static unsigned char *run_op(mlaf_context *ctx, int op, size_t *bytes, char *why, size_t why_cap) {
    if (op == 6) return run_op3(ctx, bytes, why, why_cap);
    if (op >= 4) return run_op2(ctx, op, bytes, why, why_cap);
    mlaf_backend be = mlaf_context_backend(ctx);
    enum { N = 11 };
    mlaf_gbuf g[N];
    memset(g, 0, sizeof g);
    int32_t zero = 0;
    size_t sizes[N] = {(size_t)T * W * 2, Q * 2, C * 2, (size_t)T * Q * 2, (size_t)T * C * 2, (size_t)T * R * 2,
                       sizeof POS, sizeof(float) * MAXP * R, sizeof SLOT, (size_t)NB * BS * (C + R) * 2, 4};
    const void *init[N] = {LAT, WQ, WKV, NULL, NULL, NULL, POS, CS, SLOT, NULL, &zero};
    int outs[N] = {0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1};
    unsigned char *res = NULL;
    mlaf_gbuf q3;
    memset(&q3, 0, sizeof q3);
    mlaf_status st = MLAF_OK;
    for (int i = 0; i < N && st == MLAF_OK; i++) st = mlaf_gbuf_alloc(&g[i], be, sizes[i], init[i], 0);
    if (st == MLAF_OK) st = mlaf_gbuf_alloc(&q3, be, (size_t)T * H * D * 2, Q3, 0);
    mlaf_tensor lat = mlaf_tensor_2d(g[0].ptr, MLAF_BF16, T, W, W), wq = mlaf_tensor_1d(g[1].ptr, MLAF_BF16, Q),
                wkv = mlaf_tensor_1d(g[2].ptr, MLAF_BF16, C), q = mlaf_tensor_2d(g[3].ptr, MLAF_BF16, T, Q, Q),
                kn = mlaf_tensor_2d(g[4].ptr, MLAF_BF16, T, C, C), kp = mlaf_tensor_2d(g[5].ptr, MLAF_BF16, T, R, R),
                pos = mlaf_tensor_1d(g[6].ptr, MLAF_I64, T), cs = mlaf_tensor_2d(g[7].ptr, MLAF_F32, MAXP, R, R),
                slot = mlaf_tensor_1d(g[8].ptr, MLAF_I64, T),
                cache = mlaf_tensor_3d(g[9].ptr, MLAF_BF16, NB, BS, C + R, BS * (C + R), C + R),
                ec = mlaf_tensor_1d(g[10].ptr, MLAF_I32, 1), tq3 = mlaf_tensor_3d(q3.ptr, MLAF_BF16, T, H, D, H * D, D);
    if (st == MLAF_OK) {
        if (op == 0) {
            mlaf_split_qk_norm_params p = {Q, C, R, 1e-5f, 1e-6f};
            st = mlaf_split_qk_norm(ctx, &p, &lat, &wq, &wkv, &q, &kn, &kp);
        } else if (op == 1) {
            mlaf_mla_kv_cache_params p = {Q, C, R, 1e-5f, 1e-6f, MLAF_ROPE_INTERLEAVED};
            st = mlaf_mla_kv_cache(ctx, &p, &lat, &wq, &wkv, &pos, &cs, &slot, &cache, &q, &kn, &kp, &ec);
        } else if (op == 2) {
            mlaf_rope_params p = {R, MLAF_ROPE_NEOX};
            st = mlaf_rope_q(ctx, &p, &tq3, &pos, &cs, &ec);
        } else {
            mlaf_rope_params p = {R, MLAF_ROPE_NEOX, 1, 1e-6f};
            st = mlaf_rope_q(ctx, &p, &tq3, &pos, &cs, &ec);
        }
    }
    if (st == MLAF_OK) st = mlaf_context_sync(ctx);
    size_t total = 0;
    for (int i = 0; i < N; i++) total += outs[i] ? sizes[i] : 0;
    total += q3.bytes;
    if (st == MLAF_OK && (res = malloc(total))) {
        size_t at = 0;
        for (int i = 0; i < N && st == MLAF_OK; i++) {
            if (!outs[i]) continue;
            st = mlaf_gbuf_download(&g[i]);
            if (st == MLAF_OK && !mlaf_gbuf_guards_ok(&g[i])) snprintf(why, why_cap, "guard zone written");
            memcpy(res + at, g[i].body, sizes[i]);
            at += sizes[i];
        }
        if (st == MLAF_OK) st = mlaf_gbuf_download(&q3);
        if (st == MLAF_OK) memcpy(res + at, q3.body, q3.bytes);
        *bytes = total;
    }
    if (st != MLAF_OK) {
        snprintf(why, why_cap, "%s: %s", mlaf_status_name(st), mlaf_context_last_error(ctx));
        free(res);
        res = NULL;
    }
    for (int i = 0; i < N; i++) mlaf_gbuf_free(&g[i]);
    mlaf_gbuf_free(&q3);
    return res;
}

typedef struct work {
    mlaf_backend be;
    int op, threads;
    const unsigned char *ref;
    size_t ref_bytes;
    int ok;
    char why[256];
} work;

static void *worker(void *arg) {
    work *w = (work *)arg;
    mlaf_context *ctx = NULL;
    w->ok = 0;
    if (mlaf_context_create(&ctx, w->be) != MLAF_OK) {
        snprintf(w->why, sizeof w->why, "context_create failed");
        return NULL;
    }
    if (w->be == MLAF_BACKEND_CPU) mlaf_context_set_threads(ctx, w->threads);
    w->ok = 1;
    for (int it = 0; it < ITERS && w->ok; it++) {
        size_t n = 0;
        unsigned char *got = run_op(ctx, w->op, &n, w->why, sizeof w->why);
        if (!got || n != w->ref_bytes || memcmp(got, w->ref, n) != 0) {
            w->ok = 0;
            if (got) snprintf(w->why, sizeof w->why, "iteration %d: output differs from the single-threaded run", it);
        }
        free(got);
    }
    mlaf_context_free(ctx);
    return NULL;
}

/* Threads of this process (Linux: /proc/self/task), or -1. */
static int process_threads(void) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* A CPU context with 8 threads starts its workers on a large call; mlaf_context_free joins them. */
static void thread_count_case(void) {
    const int before = process_threads();
    if (before < 0) return; /* no /proc: nothing to count */
    mlaf_context *ctx = NULL;
    int ok = mlaf_context_create(&ctx, MLAF_BACKEND_CPU) == MLAF_OK && mlaf_context_set_threads(ctx, 8) == MLAF_OK;
    char why[256] = "";
    size_t n = 0;
    unsigned char *got = ok ? run_op(ctx, 0, &n, why, sizeof why) : NULL;
    const int during = process_threads();
    free(got);
    mlaf_context_free(ctx);
    const int after = process_threads();
    tl_case(ok && got && during > before && after == before, "THREADS(context_free joins the workers)",
            "threads: %d before, %d with the context, %d after mlaf_context_free%s%s", before, during, after,
            got ? "" : "; the call failed: ", why);
}

int main(void) {
    static const char *const ops[NOPS] = {"split_qk_norm", "mla_kv_cache", "rope_q", "rope_q(head_norm)",
                                          "moe_gate", "indexer_q", "rms_norm_quant"};
    static const int counts[PTHREADS] = {1, 2, 3, 8};
    mlaf_backend bes[MLAF_BACKEND_COUNT_];
    int nb = tl_backends(bes);
    make_inputs();
    for (int bi = 0; bi < nb; bi++) {
        for (int op = 0; op < NOPS; op++) {
            char name[160], why[256] = "";
            snprintf(name, sizeof name, "THREADS(op=%s,pthreads=%d,threads=1/2/3/8,iterations=%d,backend=%s)", ops[op],
                     PTHREADS, ITERS, mlaf_backend_name(bes[bi]));
            mlaf_context *ctx = tl_context(bes[bi]);
            if (!ctx) continue;
            mlaf_context_set_threads(ctx, 1);
            size_t ref_bytes = 0;
            unsigned char *ref = run_op(ctx, op, &ref_bytes, why, sizeof why);
            mlaf_context_free(ctx);
            if (!ref) {
                tl_case(0, name, "reference run failed: %s", why);
                continue;
            }
            work w[PTHREADS];
            pthread_t th[PTHREADS];
            int started[PTHREADS];
            for (int k = 0; k < PTHREADS; k++) {
                w[k] = (work){bes[bi], op, counts[k], ref, ref_bytes, 0, ""};
                started[k] = pthread_create(&th[k], NULL, worker, &w[k]) == 0;
            }
            int ok = 1;
            for (int k = 0; k < PTHREADS; k++) {
                if (started[k]) pthread_join(th[k], NULL);
                if (!started[k] || !w[k].ok) {
                    if (ok) snprintf(why, sizeof why, "pthread %d: %.200s", k, started[k] ? w[k].why : "not started");
                    ok = 0;
                }
            }
            tl_case(ok, name, "%s", why);
            free(ref);
        }
    }
    thread_count_case();
    free(LAT);
    free(LOGITS);
    free(BIAS);
    free(QI);
    free(WI);
    free(WQ);
    free(WKV);
    free(Q3);
    free(CS);
    return tl_finish();
}
