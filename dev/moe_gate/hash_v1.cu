/*
 * hash_v1.cu — DeepSeek-V4 hash routing (mlaf_moe_gate_hash, docs/moe_gate.md) kernel versions.
 *
 * Per token t: ids = tid2eid[token_ids[t]] (k of E), w_j = s(logit[ids_j]) (0 for a non-finite
 * logit), renormalized (sum + eps) and scaled; a bad row (token id outside [0, vocab), an entry
 * outside [0, E) or repeated) gets ids 0..k-1, weight 0, and the error counter +1. A token
 * reads 8 + 6·4 + 6·4 bytes (V4-Flash, f32, int64 ids, int32 table) through a chain of three
 * dependent loads: the token id, then its table row, then k logits of its row.
 *
 * The three kernels of moe_gate_hash.cuh, each launched directly, and the library's choice:
 *   v0                 a warp per token (the library's for softmax, scores, k > 8): at most 64
 *                      tokens in flight per SM, each a chain of three dependent loads.
 *   8 lanes per token  4 tokens per warp, 3-step team sums, 8-wide shuffles for duplicates.
 *   thread per token   its k entries, then its k logits, loaded back to back; ~1200 tokens in
 *                      flight per SM; contiguous f32 outputs staged per warp in shared memory
 *                      and stored as 16-byte vectors.
 *   library (API)      mlaf_moe_gate_hash on a CUDA context (8 lanes below 65536 tokens).
 * The fast two take top_k <= 8 with sigmoid or sqrt_softplus scores and no scores output; here
 * anything else runs v0. Variants that lost (git history, figures in dev/README.md): the thread
 * kernel with 8-byte table loads or 8-byte stores instead of the staging, 8 lanes per token
 * with __match_any_sync for duplicates.
 *
 * Bit identity with v0: the same score function and operations in the same order; the thread
 * kernel's hash_sum8 writes out v0's warp_sum tree, the 8-lane kernel's team_sum<8> is that
 * tree by xor 4, 2, 1 (see moe_gate_hash.cuh). The error counter gets one saturating add of a
 * warp's bad-row count instead of one per row (the same final value).
 *
 * Validation (before any timing; FAIL and exit 1 on a mismatch): every variant against v0 bit
 * for bit (ids, weight bytes, error counter, padding columns untouched) at T = 1, 33, 4099 on
 * a 1000-token table with bad rows (token ids -1, vocab, -2^40, 2^32 + 3; entries E, -1,
 * 2^32 + e; duplicates inside and beyond k) and non-finite / |x| >= 20 logits, padded
 * strides; five parameter sets (V4; + 2 shared experts with weights in the logits' dtype and
 * padded outputs; sigmoid k = 3 without renormalization or scaling, eps 0; k = 8 with one
 * shared expert, eps 0; k = 10, the fallback); f32 / bf16 logits x int32 / int64 token ids x
 * int32 / int64 table. v0 itself is checked against a float64 host reference there (ids and
 * error count exact, weights within 1e-5 relative, 8e-3 for bf16 weights). Then at every
 * timed T on the timing inputs, every variant against v0 bit for bit again.
 * Timing, as `mlafuse bench --op moe_gate --preset deepseek-v4-flash --hash`: logits uniform in
 * [-4, 4), a 129280 x 6 table of distinct experts, uniform token ids, f32 weights (no bad
 * rows); f32 / bf16 logits x {int64 ids + int32 table (the bench's), int32 + int32, int64 +
 * int64}; T = 1, 64 as 100 calls in a CUDA graph (us per call), T = 4096, 32768, 131072 as
 * the median of 21 event-timed calls, each after a 256 MB memset + read of the flush buffer;
 * "x memcpy" = time over a cudaMemcpyAsync of half the op's bytes (read + write = the op's
 * bytes: token id, k entries, k logits, K ids and weights per token) timed the same way.
 *   build/dev/moe_gate/hash_v1 [--quick] [--ts LIST]  (--quick: T = 131072 only; --ts: these
 *                                                     T, the bench's index dtypes only)
 */
#include "cuda/moe_gate_hash.cuh" /* GateArgs, the three kernels and their launches */

#include "common.cuh"

#include <cmath>
#include <functional>
#include <string>

namespace {

int g_sm = 0;

} // namespace

/* ---- host side ----------------------------------------------------------------------------- */

static mlaf_context *g_ctx = nullptr;

#define API(x)                                                                                     \
    do {                                                                                           \
        const mlaf_status st_ = (x);                                                               \
        if (st_ != MLAF_OK) {                                                                      \
            fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #x, mlaf_status_name(st_),   \
                    mlaf_context_last_error(g_ctx));                                               \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* One input set on the device. */
struct Inputs {
    int64_t T;
    int E;
    void *logits;
    mlaf_dtype ldt;
    int64_t lstride;
    void *tab;
    mlaf_dtype tdt;
    int64_t vocab, tcols, tstride;
    void *tok;
    mlaf_dtype kdt;
};

/* One output set on the device (capacity kOutCap elements each). */
struct Outs {
    int32_t *ids;
    void *w;
    int32_t *ec;
};
static const size_t kOutCap = (size_t)131072 * 8;

struct Params {
    const char *name;
    int k, S;
    mlaf_score_func sf;
    int renorm, apply;
    float scale, eps;
    bool w_in_ldt; /* weights in the logits' dtype (else f32) */
    int pad;       /* output row stride K + pad */
};

/* One call: the API's tensors, and the same call as GateArgs for the variants. */
struct Call {
    mlaf_moe_gate_params p;
    mlaf_tensor logits, tab, tok, weights, ids, ec;
    GateArgs a;
    int64_t T;
    int K;
    int64_t ostride;
    size_t wsz;
    Outs o;
};

static Call make_call(const Inputs &in, int64_t T, const Params &ps, const Outs &o) {
    Call c;
    memset(&c, 0, sizeof c);
    c.p = mlaf_moe_gate_params_from_config(mlaf_preset_find("deepseek-v4-flash"));
    c.p.top_k = ps.k;
    c.p.n_group = c.p.topk_group = 1;
    c.p.score_func = ps.sf;
    c.p.renormalize = ps.renorm;
    c.p.apply_routed_scaling = ps.apply;
    c.p.routed_scaling_factor = ps.scale;
    c.p.eps = ps.eps;
    c.p.n_shared_experts = ps.S;
    c.T = T;
    c.K = ps.k + ps.S;
    c.ostride = c.K + ps.pad;
    const mlaf_dtype wdt = ps.w_in_ldt ? in.ldt : MLAF_F32;
    c.wsz = mlaf_dtype_size(wdt);
    c.o = o;
    c.logits = mlaf_tensor_2d(in.logits, in.ldt, T, in.E, in.lstride);
    c.tab = mlaf_tensor_2d(in.tab, in.tdt, in.vocab, ps.k, in.tstride);
    c.tok = mlaf_tensor_1d(in.tok, in.kdt, T);
    c.weights = mlaf_tensor_2d(o.w, wdt, T, c.K, c.ostride);
    c.ids = mlaf_tensor_2d(o.ids, MLAF_I32, T, c.K, c.ostride);
    c.ec = mlaf_tensor_1d(o.ec, MLAF_I32, 1);
    if ((size_t)(T * c.ostride) > kOutCap) {
        fprintf(stderr, "output capacity exceeded\n");
        exit(1);
    }
    mlaf_moe_gate_job job;
    API(mlaf_check_moe_gate_hash(g_ctx, &c.p, &c.logits, &c.tab, &c.tok, &c.weights, &c.ids, NULL, &c.ec, &job));
    c.a = gate_args_of(job);
    return c;
}

struct Variant {
    std::string name;
    std::function<void(const Call &, cudaStream_t)> fn;
};

/* The eight-lane or thread kernel K where it applies (hash_fast_ok), else the warp kernel. */
template <typename T, bool kThread> static void launch_fast_or_warp(const Call &c, cudaStream_t s) {
    dispatch_score(c.p.score_func, [&](auto tag) {
        constexpr mlaf_score_func SF = decltype(tag)::value;
        if constexpr (!score_traits<SF>::row_wise) {
            if (hash_fast_ok<SF>(c.a)) {
                if (kThread)
                    launch_hash_thread<T, SF>(c.a, g_sm, s);
                else
                    launch_hash_octet<T, SF>(c.a, g_sm, s);
                return;
            }
        }
        launch_hash_warp<T, SF>(c.a, g_sm, s);
    });
}

template <typename T> static std::vector<Variant> variants() {
    std::vector<Variant> v;
    v.push_back({"v0 warp per token", [](const Call &c, cudaStream_t s) {
                     if (c.a.T > 0)
                         dispatch_score(c.p.score_func, [&](auto tag) {
                             launch_hash_warp<T, decltype(tag)::value>(c.a, g_sm, s);
                         });
                 }});
    v.push_back({"library (API)", [](const Call &c, cudaStream_t s) {
                     API(mlaf_context_set_cuda_stream(g_ctx, (void *)s));
                     API(mlaf_moe_gate_hash(g_ctx, &c.p, &c.logits, &c.tab, &c.tok, &c.weights, &c.ids, NULL, &c.ec));
                 }});
    /* the two fast kernels at every T (the fallback's where they do not apply) */
    v.push_back({"8 lanes per token", [](const Call &c, cudaStream_t s) {
                     if (c.a.T > 0) launch_fast_or_warp<T, false>(c, s);
                 }});
    v.push_back({"thread per token", [](const Call &c, cudaStream_t s) {
                     if (c.a.T > 0) launch_fast_or_warp<T, true>(c, s);
                 }});
    return v;
}

/* Registers, local memory and resident blocks of the kernels (sqrt_softplus: DeepSeek-V4). */
template <typename T> static void print_kernels(const char *dtn) {
    auto one = [&](const char *name, const void *fn, int threads) {
        cudaFuncAttributes at;
        CK(cudaFuncGetAttributes(&at, fn));
        int res = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&res, fn, threads, 0));
        printf("  %-5s %-24s %3d registers, %3zu B local, %5zu B shared, %2d blocks of %d per SM\n", dtn, name,
               at.numRegs, at.localSizeBytes, at.sharedSizeBytes, res, threads);
    };
    one("warp per token", (const void *)moe_gate_hash_kernel<T, MLAF_SCORE_SQRT_SOFTPLUS>, kHashWarps * 32);
    one("8 lanes per token", (const void *)moe_gate_hash_octet_kernel<T, MLAF_SCORE_SQRT_SOFTPLUS>, kHashWarps * 32);
    one("thread per token", (const void *)moe_gate_hash_thread_kernel<T, MLAF_SCORE_SQRT_SOFTPLUS>, kHashThreads);
}

/* ---- comparison ------------------------------------------------------------------------------ */
static const unsigned char kFill0 = 0xff, kFill1 = 0xa5; /* v0's / the variant's output fill */
static const int32_t kEcStart = 5;

static void prefill(const Call &c, unsigned char fill) {
    CK(cudaMemset(c.o.ids, fill, (size_t)(c.T * c.ostride) * 4));
    CK(cudaMemset(c.o.w, fill, (size_t)(c.T * c.ostride) * c.wsz));
    CK(cudaMemcpy(c.o.ec, &kEcStart, 4, cudaMemcpyHostToDevice));
}

struct Got {
    std::vector<int32_t> ids;
    std::vector<unsigned char> w;
    int32_t ec;
};
static Got fetch(const Call &c) {
    Got g;
    g.ids.resize((size_t)(c.T * c.ostride));
    g.w.resize((size_t)(c.T * c.ostride) * c.wsz);
    CK(cudaMemcpy(g.ids.data(), c.o.ids, g.ids.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(g.w.data(), c.o.w, g.w.size(), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&g.ec, c.o.ec, 4, cudaMemcpyDeviceToHost));
    return g;
}

/* Runs v0 on c0 and v on c1 (same call, other outputs), compares bit for bit: "" when equal. */
static std::string compare(const Variant &v0, const Variant &v, const Call &c0, const Call &c1, Got *ref) {
    prefill(c0, kFill0);
    prefill(c1, kFill1);
    v0.fn(c0, 0);
    v.fn(c1, 0);
    CK(cudaDeviceSynchronize());
    CK(cudaGetLastError());
    const Got a = fetch(c0), b = fetch(c1);
    char why[256] = "";
    for (int64_t t = 0; t < c0.T && !why[0]; t++)
        for (int64_t j = 0; j < c0.ostride && !why[0]; j++) {
            const size_t i = (size_t)(t * c0.ostride + j);
            const unsigned char *wa = &a.w[i * c0.wsz], *wb = &b.w[i * c0.wsz];
            if (j < c0.K) {
                if (a.ids[i] != b.ids[i])
                    snprintf(why, sizeof why, "token %lld slot %lld: id %d, v0 %d", (long long)t, (long long)j,
                             b.ids[i], a.ids[i]);
                else if (memcmp(wa, wb, c0.wsz)) {
                    uint32_t ua = 0, ub = 0;
                    memcpy(&ua, wa, c0.wsz), memcpy(&ub, wb, c0.wsz);
                    snprintf(why, sizeof why, "token %lld slot %lld: weight bits %08x, v0 %08x", (long long)t,
                             (long long)j, ub, ua);
                }
            } else { /* padding columns: untouched */
                int32_t fi;
                memset(&fi, kFill1, 4);
                bool clean = b.ids[i] == fi;
                for (size_t q = 0; q < c0.wsz; q++) clean = clean && wb[q] == kFill1;
                if (!clean) snprintf(why, sizeof why, "token %lld padding column %lld written", (long long)t, (long long)j);
            }
        }
    if (!why[0] && a.ec != b.ec) snprintf(why, sizeof why, "error count %d, v0 %d", b.ec, a.ec);
    if (ref) *ref = a;
    return why;
}

/* ---- validation inputs --------------------------------------------------------------------- */
static const int kE = 256;
static const int64_t kValT = 4099, kValVocab = 1000, kValCols = 10, kValTStride = 12, kValLStride = kE + 8;

struct HostVal {
    std::vector<int64_t> tab64, tok64; /* values as written into the int64 arrays */
    std::vector<int32_t> tab32, tok32;
    std::vector<float> lg;             /* [kValT][kValLStride], f32 */
};

static HostVal make_val_host() {
    HostVal h;
    dev_rng r(11);
    h.tab64.assign((size_t)(kValVocab * kValTStride), -7); /* padding: never read */
    std::vector<int64_t> perm(kE);
    for (int64_t v = 0; v < kValVocab; v++) {
        for (int e = 0; e < kE; e++) perm[e] = e;
        for (int64_t j = 0; j < kValCols; j++) {
            const int64_t s = j + (int64_t)(r.next() % (uint64_t)(kE - j));
            std::swap(perm[j], perm[s]);
            h.tab64[(size_t)(v * kValTStride + j)] = perm[j];
        }
    }
    auto at = [&](int64_t v, int64_t j) -> int64_t & { return h.tab64[(size_t)(v * kValTStride + j)]; };
    at(5, 2) = kE;                         /* out of range (k >= 3) */
    at(6, 0) = -1;                         /* out of range */
    at(7, 4) = at(7, 1);                   /* duplicate (k >= 5) */
    at(8, 5) = at(8, 0);                   /* duplicate (k >= 6) */
    at(9, 9) = at(9, 8);                   /* duplicate only for k = 10 */
    at(10, 3) = (1ll << 32) + at(10, 0);   /* int64: out of range; int32: a duplicate of entry 0 */
    at(11, 1) = (1ll << 32) + 7;           /* int64: out of range; int32: 7 */
    for (int j = 0; j < kValCols; j++) at(12, j) = j == 0 ? kE - 1 : j - 1; /* the range's ends */
    at(13, 7) = at(13, 6);                 /* duplicate for k >= 8 */
    h.tab32.resize(h.tab64.size());
    for (size_t i = 0; i < h.tab64.size(); i++) h.tab32[i] = (int32_t)h.tab64[i];

    h.tok64.resize(kValT);
    for (int64_t t = 0; t < kValT; t++) {
        int64_t v = (int64_t)(r.next() % (uint64_t)kValVocab);
        if (t % 17 == 0) v = 5 + (t / 17) % 10; /* the rows above, often (token 0: row 5) */
        if (t % 97 == 5) v = kValVocab;
        if (t % 101 == 7) v = -1;
        if (t % 103 == 9) v = -(1ll << 40); /* int32: 0 */
        if (t % 107 == 11) v = (1ll << 32) + 3; /* int32: 3 */
        h.tok64[t] = v;
    }
    h.tok32.resize(kValT);
    for (int64_t t = 0; t < kValT; t++) h.tok32[t] = (int32_t)h.tok64[t];

    const float qnan = nanf(""), inf = INFINITY;
    h.lg.resize((size_t)(kValT * kValLStride));
    for (int64_t t = 0; t < kValT; t++) {
        float *row = &h.lg[(size_t)(t * kValLStride)];
        for (int e = 0; e < kE; e++) row[e] = (float)(r.uniform() * 8.0 - 4.0);
        for (int64_t e = kE; e < kValLStride; e++) row[e] = qnan; /* padding: never read */
        const int64_t v = h.tok64[t];
        if (v < 0 || v >= kValVocab) continue;
        auto put = [&](int j, float x) {
            const int64_t e = at(v, j % kValCols);
            if (e >= 0 && e < kE) row[e] = x;
        };
        if (t % 9 == 1) put((int)(t % 6), qnan);
        if (t % 10 == 2) put((int)((t + 1) % 6), inf);
        if (t % 11 == 3) put((int)((t + 2) % 6), -inf);
        if (t % 12 == 4) put((int)(t % 8), 30.0f);   /* sqrt(x) branch */
        if (t % 13 == 6) put((int)(t % 8), -30.0f);  /* exp(x / 2) branch */
        if (t % 14 == 7) put((int)(t % 3), 20.0f);   /* the boundaries: log1p(exp(x)) */
        if (t % 15 == 8) put((int)(t % 3), -20.0f);
        if (t % 16 == 9) put((int)(t % 5), 20.5f);
        if (t % 19 == 10) { /* every routed logit of the row non-finite: sum 0 */
            for (int j = 0; j < kValCols; j++) put(j, j % 2 ? inf : qnan);
        }
    }
    return h;
}

/* float64 reference of one call on the validation inputs: ids and the error count exact,
 * weights within tol relative (absolute below 1e-30). Returns "" when v0 agrees. */
static std::string check_ref(const HostVal &h, const Call &c, bool i64_tok, bool i64_tab, bool bf16, const Got &g) {
    const int k = c.p.top_k, K = c.K;
    int32_t bad_rows = 0;
    double worst = 0;
    const double tol = c.wsz == 4 ? 1e-5 : 8e-3;
    for (int64_t t = 0; t < c.T; t++) {
        const int64_t v = i64_tok ? h.tok64[t] : (int64_t)h.tok32[t];
        bool bad = v < 0 || v >= kValVocab;
        std::vector<int64_t> e(k, -1);
        for (int j = 0; j < k && !bad; j++) {
            const size_t i = (size_t)(v * kValTStride + j);
            e[j] = i64_tab ? h.tab64[i] : (int64_t)h.tab32[i];
            bad = e[j] < 0 || e[j] >= kE;
            for (int m = 0; m < j && !bad; m++) bad = e[m] == e[j];
        }
        bad_rows += bad;
        std::vector<double> w(k, 0.0);
        double sum = 0;
        for (int j = 0; j < k && !bad; j++) {
            float xf = h.lg[(size_t)(t * kValLStride + e[j])];
            if (bf16) xf = bf2f(f2bf(xf));
            const double x = xf;
            if (!std::isfinite(x)) continue;
            w[j] = c.p.score_func == MLAF_SCORE_SIGMOID ? 1.0 / (1.0 + exp(-x))
                   : x > 20.0                          ? sqrt(x)
                   : x < -20.0                         ? exp(0.5 * x)
                                                       : sqrt(log1p(exp(x)));
            sum += w[j];
        }
        double routed = sum;
        if (c.p.renormalize) {
            const double denom = sum + (double)c.p.eps;
            if (denom > 0)
                for (auto &x : w) x /= denom;
            routed = 0;
            for (double x : w) routed += x;
        }
        if (c.p.apply_routed_scaling)
            for (auto &x : w) x *= c.p.routed_scaling_factor;
        const double shared_w = routed / c.p.routed_scaling_factor;
        for (int j = 0; j < K; j++) {
            const size_t i = (size_t)(t * c.ostride + j);
            const int32_t want = j < k ? (bad ? j : (int32_t)e[j]) : kE + (j - k);
            char why[200];
            if (g.ids[i] != want) {
                snprintf(why, sizeof why, "token %lld slot %d: v0 id %d, reference %d", (long long)t, j, g.ids[i], want);
                return why;
            }
            float got;
            if (c.wsz == 4) memcpy(&got, &g.w[i * 4], 4);
            else {
                uint16_t u;
                memcpy(&u, &g.w[i * 2], 2);
                got = bf2f(u);
            }
            const double ref = j < k ? w[j] : shared_w;
            const double err = fabs(ref) < 1e-30 ? fabs(got - ref) : fabs(got - ref) / fabs(ref);
            if (!(err <= tol)) {
                snprintf(why, sizeof why, "token %lld slot %d: v0 weight %.9g, reference %.9g", (long long)t, j,
                         (double)got, ref);
                return why;
            }
            worst = std::max(worst, err);
        }
    }
    if (g.ec != kEcStart + bad_rows) {
        char why[120];
        snprintf(why, sizeof why, "v0 error count %d, reference %d", g.ec - kEcStart, bad_rows);
        return why;
    }
    return "";
}

static const Params kValParams[] = {
    {"V4 (k 6)", 6, 0, MLAF_SCORE_SQRT_SOFTPLUS, 1, 1, 1.5f, 1e-20f, false, 0},
    {"V4 + 2 shared, weights in the logits' dtype, padded", 6, 2, MLAF_SCORE_SQRT_SOFTPLUS, 1, 1, 1.5f, 1e-20f, true,
     3},
    {"sigmoid k 3, no renormalization or scaling, eps 0", 3, 0, MLAF_SCORE_SIGMOID, 0, 0, 1.0f, 0.0f, false, 0},
    {"k 8 + 1 shared, eps 0, no scaling", 8, 1, MLAF_SCORE_SQRT_SOFTPLUS, 1, 0, 2.5f, 0.0f, false, 1},
    {"k 10 (the fallback)", 10, 1, MLAF_SCORE_SQRT_SOFTPLUS, 1, 1, 1.5f, 1e-20f, false, 0},
};

static const char *idx_name(mlaf_dtype d) { return d == MLAF_I64 ? "i64" : "i32"; }

template <typename T>
static void validate_dtype(const HostVal &h, const char *dtn, mlaf_dtype ldt, const Outs &o0, const Outs &o1) {
    const bool bf16 = sizeof(T) == 2;
    /* device copies of the validation inputs */
    void *lg, *tab32, *tab64, *tok32, *tok64;
    const size_t nl = h.lg.size();
    CK(cudaMalloc(&lg, nl * sizeof(T)));
    if (bf16) {
        std::vector<uint16_t> b(nl);
        for (size_t i = 0; i < nl; i++) b[i] = f2bf(h.lg[i]);
        CK(cudaMemcpy(lg, b.data(), nl * 2, cudaMemcpyHostToDevice));
    } else {
        CK(cudaMemcpy(lg, h.lg.data(), nl * 4, cudaMemcpyHostToDevice));
    }
    CK(cudaMalloc(&tab32, h.tab32.size() * 4));
    CK(cudaMalloc(&tab64, h.tab64.size() * 8));
    CK(cudaMalloc(&tok32, h.tok32.size() * 4));
    CK(cudaMalloc(&tok64, h.tok64.size() * 8));
    CK(cudaMemcpy(tab32, h.tab32.data(), h.tab32.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(tab64, h.tab64.data(), h.tab64.size() * 8, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(tok32, h.tok32.data(), h.tok32.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(tok64, h.tok64.data(), h.tok64.size() * 8, cudaMemcpyHostToDevice));
    const auto vs = variants<T>();
    const int64_t Ts[] = {1, 33, kValT};
    for (int ti = 0; ti < 2; ti++)
        for (int ki = 0; ki < 2; ki++) {
            const mlaf_dtype kdt = ki ? MLAF_I64 : MLAF_I32, tdt = ti ? MLAF_I64 : MLAF_I32;
            Inputs in{kValT, kE, lg, ldt, kValLStride, ti ? tab64 : tab32, tdt, kValVocab, kValCols, kValTStride,
                      ki ? tok64 : tok32, kdt};
            int checks = 0, fails = 0;
            for (const Params &ps : kValParams)
                for (int64_t nT : Ts) {
                    const Call c0 = make_call(in, nT, ps, o0), c1 = make_call(in, nT, ps, o1);
                    for (size_t vi = 1; vi < vs.size(); vi++) {
                        Got ref;
                        const std::string why = compare(vs[0], vs[vi], c0, c1, vi == 1 ? &ref : nullptr);
                        checks++;
                        if (!why.empty()) {
                            fails++;
                            printf("  validate %s, %s ids / %s table, %s, T = %lld: %-24s FAIL (%s)\n", dtn,
                                   idx_name(kdt), idx_name(tdt), ps.name, (long long)nT, vs[vi].name.c_str(),
                                   why.c_str());
                        }
                        if (vi == 1) {
                            const std::string rwhy = check_ref(h, c0, ki != 0, ti != 0, bf16, ref);
                            checks++;
                            if (!rwhy.empty()) {
                                fails++;
                                printf("  validate %s, %s ids / %s table, %s, T = %lld: v0 against float64 FAIL (%s)\n",
                                       dtn, idx_name(kdt), idx_name(tdt), ps.name, (long long)nT, rwhy.c_str());
                            }
                        }
                    }
                }
            printf("  validate %-4s logits, %s token ids / %s table: %d checks, %s\n", dtn, idx_name(kdt), idx_name(tdt),
                   checks, fails ? "FAIL" : "OK (every variant bit-identical to v0, v0 = float64 reference)");
            fflush(stdout);
            dev_failures += fails;
        }
    CK(cudaFree(lg));
    CK(cudaFree(tab32));
    CK(cudaFree(tab64));
    CK(cudaFree(tok32));
    CK(cudaFree(tok64));
}

/* ---- timing inputs (as mlafuse bench --hash) ------------------------------------------------ */
static const int64_t kVocab = 129280; /* tools/bench_cmd.c HASH_VOCAB */
static const int64_t kMaxT = 131072;
static const int kK = 6;

/* uniform in [-4, 4), as the bench's logits; the bf16 values are the f32 ones rounded */
template <typename T> __global__ void fill_logits(T *p, size_t n, uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
        h ^= h >> 31, h *= 0xBF58476D1CE4E5B9ull, h ^= h >> 29;
        mlaf_st(p + i, (float)(h >> 40) * (8.0f / 16777216.0f) - 4.0f);
    }
}

template <typename T>
static void bench_dtype(const char *dtn, mlaf_dtype ldt, bool quick, const std::vector<int64_t> &ts, const Outs &o0, const Outs &o1, void *tab32,
                        void *tab64, void *tok32, void *tok64, void *cpy_a, void *cpy_b, const flusher &fl) {
    T *lg;
    const size_t nl = (size_t)kMaxT * kE;
    CK(cudaMalloc(&lg, nl * sizeof(T)));
    fill_logits<T><<<1024, 256>>>(lg, nl, 0x6d6c6166ull);
    CK(cudaDeviceSynchronize());
    const auto vs = variants<T>();
    std::vector<int64_t> Ts = {1, 64, 4096, 32768, kMaxT};
    if (quick) Ts = {kMaxT};
    if (!ts.empty()) Ts = ts;
    const Params ps = kValParams[0];
    const mlaf_dtype idx[3][2] = {{MLAF_I64, MLAF_I32}, {MLAF_I32, MLAF_I32}, {MLAF_I64, MLAF_I64}};
    for (const auto &ix : idx) {
        const mlaf_dtype kdt = ix[0], tdt = ix[1];
        if (!ts.empty() && !(kdt == MLAF_I64 && tdt == MLAF_I32)) continue; /* --ts: the bench's ids only */
        Inputs in{kMaxT, kE, lg, ldt, kE, tdt == MLAF_I64 ? tab64 : tab32, tdt, kVocab, kK, kK,
                  kdt == MLAF_I64 ? tok64 : tok32, kdt};
        printf("\n%s logits, %s token ids, %s table (deepseek-v4-flash: E %d, k %d, sqrt_softplus, x1.5; f32 "
               "weights)%s\n",
               dtn, idx_name(kdt), idx_name(tdt), kE, kK, kdt == MLAF_I64 && tdt == MLAF_I32 ? ", as mlafuse bench" : "");
        for (int64_t nT : Ts) {
            const Call c0 = make_call(in, nT, ps, o0), c1 = make_call(in, nT, ps, o1);
            for (size_t vi = 1; vi < vs.size(); vi++) { /* bit for bit at this T first */
                const std::string why = compare(vs[0], vs[vi], c0, c1, nullptr);
                if (!why.empty()) {
                    printf("  validate T = %lld %-24s FAIL (%s)\n", (long long)nT, vs[vi].name.c_str(), why.c_str());
                    dev_failures++;
                }
            }
            const double bytes = (double)nT * ((double)mlaf_dtype_size(kdt) + kK * (double)mlaf_dtype_size(tdt) +
                                              kK * (double)sizeof(T)) +
                                 (double)nT * kK * 8.0;
            size_t n = (size_t)(bytes / 2.0);
            n = std::max<size_t>(16, (n + 15) / 16 * 16);
            const bool graph = nT <= 64;
            auto timed = [&](const std::function<void(cudaStream_t)> &fn) {
                if (graph) return graph_us([&](cudaStream_t s, int) { fn(s); });
                return flushed_us(fl, [&]() { fn(0); }, 21);
            };
            const double cpy = timed([&](cudaStream_t s) { CK(cudaMemcpyAsync(cpy_b, cpy_a, n, cudaMemcpyDeviceToDevice, s)); });
            printf("  T = %-7lld memcpy of the same bytes (%.0f B read + written) %8.2f us%s\n", (long long)nT, bytes,
                   cpy, graph ? "   (per call, 100 calls in a CUDA graph)" : "   (L2 flushed, median of 21)");
            for (const Variant &v : vs) {
                const double us = timed([&](cudaStream_t s) { v.fn(c0, s); });
                printf("    %-26s T = %-7lld %9.2f us %7.2fx memcpy\n", v.name.c_str(), (long long)nT, us, us / cpy);
            }
            API(mlaf_context_set_cuda_stream(g_ctx, NULL));
        }
    }
    CK(cudaFree(lg));
}

int main(int argc, char **argv) {
    bool quick = false;
    std::vector<int64_t> ts;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--ts") && i + 1 < argc) {
            for (char *p = argv[++i]; *p;) {
                const long long v = strtoll(p, &p, 10);
                if (v < 1 || v > kMaxT) {
                    fprintf(stderr, "--ts: token counts in 1 .. %lld\n", (long long)kMaxT);
                    return 2;
                }
                ts.push_back(v);
                if (*p == ',') p++;
            }
        } else {
            fprintf(stderr, "usage: %s [--quick] [--ts T1,T2,...]\n", argv[0]);
            return 2;
        }
    }
    print_device();
    g_sm = sm_count();
    API(mlaf_context_create(&g_ctx, MLAF_BACKEND_CUDA));
    print_kernels<float>("f32");
    print_kernels<__nv_bfloat16>("bf16");

    Outs o[2];
    for (auto &x : o) {
        CK(cudaMalloc(&x.ids, kOutCap * 4));
        CK(cudaMalloc(&x.w, kOutCap * 4));
        CK(cudaMalloc(&x.ec, 4));
    }

    printf("\nvalidation: T = 1, 33, %lld; %d parameter sets; bad rows, non-finite and |x| >= 20 logits\n",
           (long long)kValT, (int)(sizeof kValParams / sizeof kValParams[0]));
    fflush(stdout);
    const HostVal h = make_val_host();
    validate_dtype<float>(h, "f32", MLAF_F32, o[0], o[1]);
    validate_dtype<__nv_bfloat16>(h, "bf16", MLAF_BF16, o[0], o[1]);
    if (dev_failures) {
        printf("\nFAIL (%d)\n", dev_failures);
        return 1;
    }

    /* the bench's table: k distinct experts per token id; uniform token ids */
    dev_rng r(0x6d6c6166ull);
    std::vector<int64_t> tab64((size_t)(kVocab * kK)), tok64(kMaxT);
    std::vector<int32_t> tab32(tab64.size()), tok32(kMaxT);
    std::vector<int32_t> perm(kE);
    for (int e = 0; e < kE; e++) perm[e] = e;
    for (int64_t v = 0; v < kVocab; v++)
        for (int j = 0; j < kK; j++) {
            const int s = j + (int)(r.next() % (uint64_t)(kE - j));
            std::swap(perm[j], perm[s]);
            tab64[(size_t)(v * kK + j)] = perm[j];
            tab32[(size_t)(v * kK + j)] = perm[j];
        }
    for (int64_t t = 0; t < kMaxT; t++) {
        tok64[t] = (int64_t)(r.next() % (uint64_t)kVocab);
        tok32[t] = (int32_t)tok64[t];
    }
    void *d_tab32, *d_tab64, *d_tok32, *d_tok64, *cpy_a, *cpy_b;
    CK(cudaMalloc(&d_tab32, tab32.size() * 4));
    CK(cudaMalloc(&d_tab64, tab64.size() * 8));
    CK(cudaMalloc(&d_tok32, tok32.size() * 4));
    CK(cudaMalloc(&d_tok64, tok64.size() * 8));
    CK(cudaMemcpy(d_tab32, tab32.data(), tab32.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_tab64, tab64.data(), tab64.size() * 8, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_tok32, tok32.data(), tok32.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_tok64, tok64.data(), tok64.size() * 8, cudaMemcpyHostToDevice));
    const size_t cpy_cap = (size_t)kMaxT * 128; /* > half the op's bytes at kMaxT */
    CK(cudaMalloc(&cpy_a, cpy_cap));
    CK(cudaMalloc(&cpy_b, cpy_cap));
    CK(cudaMemset(cpy_a, 1, cpy_cap));
    flusher fl;
    bench_dtype<float>("f32", MLAF_F32, quick, ts, o[0], o[1], d_tab32, d_tab64, d_tok32, d_tok64, cpy_a, cpy_b, fl);
    bench_dtype<__nv_bfloat16>("bf16", MLAF_BF16, quick, ts, o[0], o[1], d_tab32, d_tab64, d_tok32, d_tok64, cpy_a, cpy_b,
                               fl);
    CK(cudaFree(d_tab32));
    CK(cudaFree(d_tab64));
    CK(cudaFree(d_tok32));
    CK(cudaFree(d_tok64));
    CK(cudaFree(cpy_a));
    CK(cudaFree(cpy_b));
    for (auto &x : o) {
        CK(cudaFree(x.ids));
        CK(cudaFree(x.w));
        CK(cudaFree(x.ec));
    }
    mlaf_context_free(g_ctx);
    printf(dev_failures ? "\nFAIL (%d)\n" : "\nall variants validated (%d failures)\n", dev_failures);
    return dev_failures ? 1 : 0;
}
