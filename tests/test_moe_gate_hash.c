/*
 * test_moe_gate_hash.c — mlaf_moe_gate_hash (docs/moe_gate.md, DeepSeek-V4's hash-routed layers) on
 * every backend against the float64 oracle: the V4 preset and other score functions x dtypes x
 * token counts x layouts, every kind of bad row (counted, ids 0..k-1, weight 0), and every
 * rejected argument (status, message naming it, nothing written).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

static const char *bname;

static void run_case(mlaf_context *ctx, const char *label, const mlaf_verify_case *c) {
    char name[256];
    snprintf(name, sizeof name, "MOE_GATE_HASH(%s,T=%lld,dtype=%s,backend=%s)", label, (long long)c->T,
             mlaf_dtype_name(c->dtype), bname);
    mlaf_verify_result r;
    mlaf_status st = mlaf_verify_moe_gate(ctx, c, &r);
    if (st != MLAF_OK)
        tl_case(0, name, "%s %s", mlaf_status_name(st), r.detail);
    else
        tl_case(r.passed, name, "%s", r.detail);
}

static void test_cases(mlaf_context *ctx) {
    /* 70000 tokens on CUDA only: from 65536 a thread-per-token kernel takes the call there (the
     * CPU backend has no path that depends on T) */
    static const int64_t Ts[] = {0, 1, 7, 64, 257, 4096, 70000};
    const int cuda = mlaf_context_backend(ctx) == MLAF_BACKEND_CUDA;
    static const mlaf_dtype dts[] = {MLAF_F32, MLAF_BF16, MLAF_F16};
    const mlaf_model_config *v4 = mlaf_preset_find("deepseek-v4-flash");
    for (int d = 0; d < 3; d++)
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++)
            for (int v = 0; v < 4; v++) { /* v = 0, 3: contiguous f32 outputs (CUDA's staged stores) */
                if (Ts[ti] > 4096 && (!cuda || v == 1)) continue; /* scores: the warp kernel's, at 4096 */
                mlaf_verify_case c = mlaf_verify_case_default(v4, dts[d], Ts[ti], 7000u + 31u * ti + 7u * (unsigned)d + v);
                c.weight_dtype = MLAF_F32;
                c.moe_hash = v >= 2 ? 2 : 1;
                c.strided = v == 1;
                c.want_scores = v == 1;
                c.moe_wide = v == 1 || v == 2;
                c.index_dtype = (ti + (size_t)v) % 2 ? MLAF_I32 : MLAF_I64;
                char label[128];
                snprintf(label, sizeof label, "preset=deepseek-v4-flash,score=sqrt_softplus,%s,table=%s",
                         v == 0   ? "contiguous"
                         : v == 1 ? "strided,scores,wide"
                         : v == 2 ? "bad rows,wide"
                                  : "bad rows,contiguous",
                         mlaf_dtype_name(c.index_dtype));
                run_case(ctx, label, &c);
            }
    /* other score functions, shared experts, weights in the logits' dtype, NaN / inf, top_k = E */
    static const struct {
        const char *label;
        mlaf_score_func sf;
        int32_t E, k, S, renorm, wlogits, nonfinite;
    } other[] = {
        {"E=64,sigmoid,top_k=4,S=1", MLAF_SCORE_SIGMOID, 64, 4, 1, 1, 0, 0},
        {"E=160,softmax,top_k=6,S=2,no renorm", MLAF_SCORE_SOFTMAX, 160, 6, 2, 0, 0, 1},
        {"E=384,sigmoid,top_k=8,weights=logits dtype,nonfinite", MLAF_SCORE_SIGMOID, 384, 8, 0, 1, 1, 1},
        {"E=256,sqrt_softplus,nonfinite,S=1,weights=logits dtype", MLAF_SCORE_SQRT_SOFTPLUS, 256, 6, 1, 1, 1, 1},
        {"E=2048,sqrt_softplus,top_k=64", MLAF_SCORE_SQRT_SOFTPLUS, 2048, 64, 0, 1, 0, 0},
        {"E=5,softmax,top_k=5", MLAF_SCORE_SOFTMAX, 5, 5, 0, 1, 0, 0},
        {"E=1,sigmoid,top_k=1", MLAF_SCORE_SIGMOID, 1, 1, 0, 1, 0, 0},
    };
    for (int d = 0; d < 3; d++)
        for (size_t i = 0; i < sizeof other / sizeof other[0]; i++)
            for (int bad = 0; bad <= 2; bad++) {
                /* bad = 0: 70000 tokens of the shared-expert row (CUDA: the thread kernel's per-thread stores) */
                if (bad == 0 && !(cuda && other[i].sf == MLAF_SCORE_SQRT_SOFTPLUS && other[i].S > 0)) continue;
                const int64_t nT = bad == 0 ? 70000 : 300;
                mlaf_verify_case c = mlaf_verify_case_default(v4, dts[d], nT, 7500u + 13u * i + (unsigned)d * 3u + bad);
                c.moe_override = 1;
                c.experts = other[i].E;
                c.moe = mlaf_moe_gate_params_from_config(v4);
                c.moe.score_func = other[i].sf;
                c.moe.top_k = other[i].k;
                c.moe.n_shared_experts = other[i].S;
                c.moe.renormalize = other[i].renorm;
                c.moe.routed_scaling_factor = 2.5f;
                c.weight_dtype = other[i].wlogits ? dts[d] : MLAF_F32;
                c.nonfinite = other[i].nonfinite;
                c.moe_hash = bad > 1 ? 2 : 1;
                c.strided = bad == 2;
                c.want_scores = bad == 2;
                c.index_dtype = i % 2 ? MLAF_I32 : MLAF_I64;
                char label[160];
                snprintf(label, sizeof label, "%s%s", other[i].label, bad == 2 ? ",bad rows,strided,scores" : "");
                run_case(ctx, label, &c);
            }
}

/* Every kind of bad row at once, with a known table (E = 8, k = 3, vocab = 6):
 * row 0 good, row 1 an entry = E, row 2 an entry -1, row 3 a repeat, row 4 an i64 entry beyond
 * 32 bits, row 5 good; token ids 0, 1, 2, 3, 4, -1, 6 (= vocab), 5, 1 << 40. */
static void test_bad_rows(mlaf_context *ctx) {
    mlaf_backend b = mlaf_context_backend(ctx);
    enum { E = 8, k = 3, V = 6, T = 9 };
    const int64_t tab[V][k] = {{5, 1, 7}, {2, E, 0}, {-1, 3, 4}, {6, 2, 6}, {1, ((int64_t)1 << 32) + 2, 3}, {0, 4, 2}};
    const int64_t tok[T] = {0, 1, 2, 3, 4, -1, V, 5, (int64_t)1 << 40};
    const int good[T] = {1, 0, 0, 0, 0, 0, 0, 1, 0};
    float logits[T * E];
    for (int i = 0; i < T * E; i++) logits[i] = (float)((i * 37) % 11) * 0.5f - 2.0f;
    const mlaf_model_config *v4 = mlaf_preset_find("deepseek-v4-flash");
    mlaf_moe_gate_params p = mlaf_moe_gate_params_from_config(v4);
    p.top_k = k;
    mlaf_gbuf gl, gt, gk, gw, gi, ge;
    const int32_t ec0 = 3;
    mlaf_gbuf_alloc(&gl, b, sizeof logits, logits, 0);
    mlaf_gbuf_alloc(&gt, b, sizeof tab, tab, 0);
    mlaf_gbuf_alloc(&gk, b, sizeof tok, tok, 0);
    mlaf_gbuf_alloc(&gw, b, T * k * 4, NULL, 0);
    mlaf_gbuf_alloc(&gi, b, T * k * 4, NULL, 0);
    mlaf_gbuf_alloc(&ge, b, 4, &ec0, 0);
    mlaf_tensor tl = mlaf_tensor_2d(gl.ptr, MLAF_F32, T, E, E);
    mlaf_tensor tt = mlaf_tensor_2d(gt.ptr, MLAF_I64, V, k, k);
    mlaf_tensor tk = mlaf_tensor_1d(gk.ptr, MLAF_I64, T);
    mlaf_tensor tw = mlaf_tensor_2d(gw.ptr, MLAF_F32, T, k, k);
    mlaf_tensor ti = mlaf_tensor_2d(gi.ptr, MLAF_I32, T, k, k);
    mlaf_tensor te = mlaf_tensor_1d(ge.ptr, MLAF_I32, 1);
    mlaf_status st = mlaf_moe_gate_hash(ctx, &p, &tl, &tt, &tk, &tw, &ti, NULL, &te);
    if (st == MLAF_OK) st = mlaf_context_sync(ctx);
    char why[256] = "";
    int ok = st == MLAF_OK && mlaf_gbuf_download(&gw) == MLAF_OK && mlaf_gbuf_download(&gi) == MLAF_OK &&
             mlaf_gbuf_download(&ge) == MLAF_OK;
    if (!ok) snprintf(why, sizeof why, "%s: %s", mlaf_status_name(st), mlaf_context_last_error(ctx));
    const int32_t *ids = (const int32_t *)gi.body;
    const float *w = (const float *)gw.body;
    for (int t = 0; t < T && ok; t++) {
        double s[k], sum = 0.0;
        for (int j = 0; j < k; j++) {
            const int32_t want = good[t] ? (int32_t)tab[tok[t]][j] : j;
            if (ids[t * k + j] != want) {
                ok = 0;
                snprintf(why, sizeof why, "token %d: ids[%d] = %d, expected %d", t, j, ids[t * k + j], want);
            }
            const double x = logits[t * E + want];
            s[j] = good[t] ? sqrt(fmax(x, 0.0) + log1p(exp(-fabs(x)))) : 0.0;
            sum += s[j];
        }
        for (int j = 0; j < k && ok; j++) {
            const double want = good[t] ? 1.5 * s[j] / (sum + 1e-20) : 0.0;
            if (!(fabs(w[t * k + j] - want) <= 1e-5 * fabs(want)) && !(want == 0.0 && w[t * k + j] == 0.0f)) {
                ok = 0;
                snprintf(why, sizeof why, "token %d: weights[%d] = %.9g, expected %.9g", t, j, w[t * k + j], want);
            }
        }
    }
    int32_t ec = 0;
    if (ok) memcpy(&ec, ge.body, 4);
    if (ok && ec != ec0 + 7) {
        ok = 0;
        snprintf(why, sizeof why, "error_count = %d, expected %d + 7 bad rows", ec, ec0);
    }
    char name[128];
    snprintf(name, sizeof name, "MOE_GATE_HASH(bad rows: entry E, -1, repeat, > 2^32, token -1, vocab, 2^40,backend=%s)", bname);
    tl_case(ok, name, "%s", why);
    /* without the counter: the same rows, nothing else to write */
    mlaf_gbuf_upload(&gw);
    st = mlaf_moe_gate_hash(ctx, &p, &tl, &tt, &tk, &tw, &ti, NULL, NULL);
    if (st == MLAF_OK) st = mlaf_context_sync(ctx);
    snprintf(name, sizeof name, "MOE_GATE_HASH(bad rows,no error_count,backend=%s)", bname);
    tl_case(st == MLAF_OK && mlaf_gbuf_download(&gi) == MLAF_OK && ids[5 * k + 2] == 2 && ids[0] == 5, name, "%s: %s",
            mlaf_status_name(st), mlaf_context_last_error(ctx));
    mlaf_gbuf_free(&gl), mlaf_gbuf_free(&gt), mlaf_gbuf_free(&gk);
    mlaf_gbuf_free(&gw), mlaf_gbuf_free(&gi), mlaf_gbuf_free(&ge);
}

/* ---- rejected arguments ---------------------------------------------------------------- */
typedef struct misuse {
    mlaf_moe_gate_params p;
    mlaf_tensor logits, tab, tok, weights, ids, scores, ec;
    int has_tab, has_tok, has_scores, has_ec;
} misuse;

static void misuse_case(mlaf_context *ctx, const char *what, const misuse *m, mlaf_status want,
                        const char *must_name, mlaf_gbuf *outs, int nouts) {
    char name[256];
    snprintf(name, sizeof name, "MOE_GATE_HASH(misuse=%s,backend=%s)", what, bname);
    mlaf_status st = mlaf_moe_gate_hash(ctx, &m->p, &m->logits, m->has_tab ? &m->tab : NULL,
                                        m->has_tok ? &m->tok : NULL, &m->weights, &m->ids,
                                        m->has_scores ? &m->scores : NULL, m->has_ec ? &m->ec : NULL);
    const char *msg = mlaf_context_last_error(ctx);
    int ok = st == want && strstr(msg, must_name) != NULL;
    int untouched = 1;
    mlaf_context_sync(ctx);
    for (int i = 0; i < nouts; i++) {
        unsigned char *poison = malloc(outs[i].bytes);
        memset(poison, 0xFF, outs[i].bytes);
        if (mlaf_gbuf_download(&outs[i]) != MLAF_OK || !mlaf_gbuf_equals(&outs[i], poison) ||
            !mlaf_gbuf_guards_ok(&outs[i]))
            untouched = 0;
        free(poison);
    }
    tl_case(ok && untouched, name, "status %s (want %s), message \"%s\" (must name %s)%s",
            mlaf_status_name(st), mlaf_status_name(want), msg, must_name,
            untouched ? "" : ", and an output was written");
}

static void test_misuse(mlaf_context *ctx) {
    mlaf_backend b = mlaf_context_backend(ctx);
    const int32_t E = 256, T = 5, k = 6, V = 10;
    mlaf_gbuf gl, gt, gk, outs[4];
    float *lh = calloc((size_t)(T * E * 2), sizeof(float));
    int32_t th[V * k * 2], kh[T * 2];
    for (int i = 0; i < V * k * 2; i++) th[i] = i % k;
    for (int i = 0; i < T * 2; i++) kh[i] = i % V;
    mlaf_gbuf_alloc(&gl, b, (size_t)(T * E * 2) * 4, lh, 0);
    mlaf_gbuf_alloc(&gt, b, sizeof th, th, 0);
    mlaf_gbuf_alloc(&gk, b, sizeof kh, kh, 0);
    mlaf_gbuf_alloc(&outs[0], b, (size_t)(T * k * 2) * 4, NULL, 0);
    mlaf_gbuf_alloc(&outs[1], b, (size_t)(T * k * 2) * 4, NULL, 0);
    mlaf_gbuf_alloc(&outs[2], b, (size_t)(T * E * 2) * 4, NULL, 0);
    mlaf_gbuf_alloc(&outs[3], b, 8, NULL, 0);
    misuse base;
    memset(&base, 0, sizeof base);
    base.p = mlaf_moe_gate_params_from_config(mlaf_preset_find("deepseek-v4-flash"));
    base.logits = mlaf_tensor_2d(gl.ptr, MLAF_F32, T, E, E);
    base.tab = mlaf_tensor_2d(gt.ptr, MLAF_I32, V, k, k);
    base.tok = mlaf_tensor_1d(gk.ptr, MLAF_I32, T);
    base.weights = mlaf_tensor_2d(outs[0].ptr, MLAF_F32, T, k, k);
    base.ids = mlaf_tensor_2d(outs[1].ptr, MLAF_I32, T, k, k);
    base.scores = mlaf_tensor_2d(outs[2].ptr, MLAF_F32, T, E, E);
    base.ec = mlaf_tensor_1d(outs[3].ptr, MLAF_I32, 1);
    base.has_tab = base.has_tok = base.has_scores = base.has_ec = 1;
    misuse m;
#define MISUSE(what, want, needle, edit) \
    do {                                  \
        m = base;                         \
        edit;                             \
        misuse_case(ctx, what, &m, want, needle, outs, 4); \
    } while (0)
    MISUSE("tid2eid NULL", MLAF_ERR_NULL_POINTER, "tid2eid", m.has_tab = 0);
    MISUSE("token_ids NULL", MLAF_ERR_NULL_POINTER, "token_ids", m.has_tok = 0);
    MISUSE("tid2eid dtype f32", MLAF_ERR_DTYPE, "tid2eid", m.tab.dtype = MLAF_F32);
    MISUSE("tid2eid 1d", MLAF_ERR_SHAPE, "tid2eid", m.tab.ndim = 1);
    MISUSE("tid2eid.shape[1] != top_k", MLAF_ERR_SHAPE, "tid2eid.shape[1]", (m.tab.shape[1] = 5, m.tab.stride[0] = 5));
    MISUSE("tid2eid vocab 0", MLAF_ERR_SHAPE, "tid2eid.shape[0]", m.tab.shape[0] = 0);
    MISUSE("tid2eid row stride < top_k", MLAF_ERR_STRIDE, "tid2eid", m.tab.stride[0] = 3);
    MISUSE("token_ids dtype f16", MLAF_ERR_DTYPE, "token_ids", m.tok.dtype = MLAF_F16);
    MISUSE("token_ids.shape[0] != T", MLAF_ERR_SHAPE, "token_ids.shape[0]", m.tok.shape[0] = T + 1);
    MISUSE("token_ids 2d", MLAF_ERR_SHAPE, "token_ids", m.tok.ndim = 2);
    MISUSE("error_count dtype i64", MLAF_ERR_DTYPE, "error_count", m.ec.dtype = MLAF_I64);
    MISUSE("error_count shape 2", MLAF_ERR_SHAPE, "error_count", m.ec.shape[0] = 2);
    MISUSE("n_group=2", MLAF_ERR_LIMIT, "n_group", m.p.n_group = 2);
    MISUSE("topk_group=2", MLAF_ERR_LIMIT, "topk_group", m.p.topk_group = 2);
    MISUSE("score_func=3", MLAF_ERR_INVALID_ARGUMENT, "score_func", m.p.score_func = (mlaf_score_func)3);
    MISUSE("top_k=0", MLAF_ERR_LIMIT, "top_k", m.p.top_k = 0);
    MISUSE("eps=-1", MLAF_ERR_INVALID_ARGUMENT, "eps", m.p.eps = -1.0f);
    MISUSE("weights.shape[1]", MLAF_ERR_SHAPE, "weights", m.weights.shape[1] = k + 1);
    MISUSE("ids dtype i64", MLAF_ERR_DTYPE, "ids", m.ids.dtype = MLAF_I64);
    MISUSE("scores overlaps tid2eid", MLAF_ERR_OVERLAP, "tid2eid",
           (m.scores = mlaf_tensor_2d(gt.ptr, MLAF_F32, 1, E, E), m.logits.shape[0] = 1, m.tok.shape[0] = 1,
            m.weights.shape[0] = 1, m.ids.shape[0] = 1));
    MISUSE("ids overlaps token_ids", MLAF_ERR_OVERLAP, "token_ids",
           (m.ids = mlaf_tensor_2d(gk.ptr, MLAF_I32, T, 1, 1), m.p.top_k = 1, m.tab.shape[1] = 1,
            m.weights.shape[1] = 1));
    MISUSE("error_count overlaps ids", MLAF_ERR_OVERLAP, "error_count",
           m.ec = mlaf_tensor_1d(outs[1].ptr, MLAF_I32, 1));
    MISUSE("error_count overlaps token_ids", MLAF_ERR_OVERLAP, "error_count",
           m.ec = mlaf_tensor_1d(gk.ptr, MLAF_I32, 1));
#undef MISUSE
    /* T = 0: nothing read (NULL data is fine) and nothing written */
    m = base;
    m.logits.shape[0] = m.tok.shape[0] = m.weights.shape[0] = m.ids.shape[0] = m.scores.shape[0] = 0;
    m.tok.data = NULL;
    mlaf_status st = mlaf_moe_gate_hash(ctx, &m.p, &m.logits, &m.tab, &m.tok, &m.weights, &m.ids, &m.scores, &m.ec);
    mlaf_context_sync(ctx);
    int untouched = 1;
    for (int i = 0; i < 4; i++) {
        unsigned char *poison = malloc(outs[i].bytes);
        memset(poison, 0xFF, outs[i].bytes);
        if (mlaf_gbuf_download(&outs[i]) != MLAF_OK || !mlaf_gbuf_equals(&outs[i], poison)) untouched = 0;
        free(poison);
    }
    char name[96];
    snprintf(name, sizeof name, "MOE_GATE_HASH(T=0,no-op,backend=%s)", bname);
    tl_case(st == MLAF_OK && untouched, name, "status %s, %s", mlaf_status_name(st),
            untouched ? "untouched" : "an output was written");
    mlaf_gbuf_free(&gl), mlaf_gbuf_free(&gt), mlaf_gbuf_free(&gk);
    for (int i = 0; i < 4; i++) mlaf_gbuf_free(&outs[i]);
    free(lh);
}

int main(int argc, char **argv) {
    /* optional filter: cases, bad, misuse */
    const char *only = argc > 1 ? argv[1] : NULL;
    mlaf_backend bs[MLAF_BACKEND_COUNT_];
    int nb = tl_backends(bs);
    for (int i = 0; i < nb; i++) {
        bname = mlaf_backend_name(bs[i]);
        mlaf_context *ctx = tl_context(bs[i]);
        if (!ctx) continue;
        if (!only || strstr("cases", only)) test_cases(ctx);
        if (!only || strstr("bad", only)) test_bad_rows(ctx);
        if (!only || strstr("misuse", only)) test_misuse(ctx);
        mlaf_context_free(ctx);
    }
    return tl_finish();
}
