/*
 * moe_gate_bench.cu — router top-k kernel versions side by side (llm.c style).
 *
 *   v1  warp per token, expert e in lane e % 32, one row prefetched in registers, groups
 *       through shared-memory scans (the first library kernel; still the library's fallback
 *       for E > 512, top_k > 32, groups off lane boundaries, rows not 4-byte aligned).
 *   v2  rows staged through a per-warp cp.async ring (about 2 KB per warp in flight), lane l
 *       holding experts [l N, l N + N), groups as runs of adjacent lanes (xor shuffles), one
 *       team max + ballot per top-k round; teams of 8 / 16 lanes for small E. The library's
 *       fast path, included as shipped (src/cuda/moe_gate.cu; "v2 library" also takes the
 *       library's choice of v1 for E <= 64 at T <= 64).
 *   v2 variants: other in-flight depths (2 / 4 KB per warp) and other team shapes.
 *   v3 / v4 / v5  the team, solo and tiny kernels (src/cuda), with their variant flags.
 *   v6  two lanes per token (moe_gate_pair.cuh, dev only; measured, not shipped).
 *
 * Validation: every variant against v1 at T = 4099 (v1 matches the float64 oracle in
 * tests/test_moe_gate.c): ids must agree except at near-ties (c within 1e-6 relative, judged
 * on v1's own scores), weights within 1e-5 relative. FAIL exits 1.
 * Timing: large T median of 15 event-timed calls, logits rotated through >= 256 MB so no
 * call finds them in L2; floor = logits read + ids/weights written at the same-run D2D copy
 * speed. Small T: 100 calls in one CUDA graph, us per call.
 *   build/dev/moe_gate/moe_gate_bench [--quick]
 */
#define MLAF_MOE_GATE_NO_ENTRY 1
#include "../../src/cuda/moe_gate.cu"
#include "moe_gate_pair.cuh" /* v6, measured and not shipped */

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#define CK(x)                                                                                     \
    do {                                                                                          \
        cudaError_t e_ = (x);                                                                     \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
            exit(2);                                                                              \
        }                                                                                         \
    } while (0)

struct Router {
    const char *name;
    int E, k, G, kg, softmax, bias;
    float scale;
};
static const Router kRouters[] = {
    {"deepseek-v3", 256, 8, 8, 4, 0, 1, 2.5f},
    {"glm-4.7-flash", 64, 4, 1, 1, 0, 1, 1.8f},
    {"kimi-k2", 384, 8, 1, 1, 0, 1, 2.827f},
    {"deepseek-v2", 160, 6, 8, 3, 1, 0, 16.0f},
};

using Launcher = std::function<void(const GateArgs &, cudaStream_t)>;
struct Variant {
    std::string name;
    Launcher fn;
};

static int g_sm = 0;

/* f(score_tag<SF>{}) for a router's score (sigmoid or softmax here: the scores every kernel
 * measured below has; dispatch_score would instantiate sqrt_softplus too). */
template <class F> static void by_score(bool softmax, F &&f) {
    if (softmax)
        f(score_tag<MLAF_SCORE_SOFTMAX>{});
    else
        f(score_tag<MLAF_SCORE_SIGMOID>{});
}
#define SF_OF(tag) decltype(tag)::value

template <typename T> static std::vector<Variant> variants(const Router &r, const GateArgs &a0) {
    std::vector<Variant> v;
    const bool sm = r.softmax != 0;
    v.push_back({"v1 warp/token", [sm](const GateArgs &a, cudaStream_t s) {
                     by_score(sm, [&](auto tag) { launch_dt<T, SF_OF(tag)>(a, g_sm, s); });
                 }});
    v.push_back({"v3 library", [sm](const GateArgs &a, cudaStream_t s) {
                     by_score(sm, [&](auto tag) {
                         if (!try_team<T, SF_OF(tag)>(a, g_sm, s)) launch_dt<T, SF_OF(tag)>(a, g_sm, s);
                     });
                 }});
    const int unit = fast_copy_unit<T>(a0);
#define V2(N, L, AH)                                                                              \
    if (unit && fast_fits(a0, N, L))                                                              \
        v.push_back({"v2 N=" #N " L=" #L " ahead=" #AH, [unit, sm](const GateArgs &a, cudaStream_t s) { \
                         by_score(sm, [&](auto tag) { launch_fast<T, N, L, SF_OF(tag), AH>(a, unit, g_sm, s); }); \
                     }});
#define V3(N, L, AH)                                                                              \
    if (unit && team_fits(a0, N, L))                                                              \
        v.push_back({"v3 N=" #N " L=" #L " ah=" #AH, [unit](const GateArgs &a, cudaStream_t s) {    \
                         launch_team<T, N, L, MLAF_SCORE_SIGMOID, AH>(a, unit, g_sm, s);                       \
                     }});
#define V3S(N, L, AH)                                                                             \
    if (unit && team_fits(a0, N, L))                                                              \
        v.push_back({"v3 N=" #N " L=" #L " ah=" #AH, [unit](const GateArgs &a, cudaStream_t s) {    \
                         launch_team<T, N, L, MLAF_SCORE_SOFTMAX, AH>(a, unit, g_sm, s);                        \
                     }});
#define V3M(N, L, AH, MB)                                                                         \
    if (unit && team_fits(a0, N, L))                                                              \
        v.push_back({"v3 N=" #N " L=" #L " ah=" #AH " minb=" #MB,                                 \
                     [unit](const GateArgs &a, cudaStream_t s) {                                  \
                         launch_team<T, N, L, MLAF_SCORE_SIGMOID, AH, MB>(a, unit, g_sm, s);                   \
                     }});
#define V4(E_, G_, VB_, KM_, F_)                                                                  \
    if (!sm && solo_fits<T>(a0, E_, G_, VB_, KM_))                                               \
        v.push_back({"v4 solo E=" #E_ " VB=" #VB_ " F=" #F_, [](const GateArgs &a, cudaStream_t s) { \
                         launch_solo<T, E_, G_, VB_, KM_, F_, MLAF_SCORE_SIGMOID>(a, g_sm, s);   \
                     }});
    /* F: 1 recompute s in pass 2, 2 one staging copy per row, 4 pass 1 unrolled by two units,
     * 8 the next tile's rows prefetched into L2 after pass 1, 16 half-row slots (with 1, two
     * segments) */
    V4(256, 8, 16, 8, 0) V4(256, 8, 16, 8, 4) V4(256, 8, 16, 8, 6) V4(256, 8, 16, 8, 14) V4(256, 8, 16, 8, 21)
    if (sizeof(T) == 2) {
        V4(256, 8, 16, 8, 1) V4(256, 8, 16, 8, 5) V4(256, 8, 16, 8, 7) V4(256, 8, 16, 8, 13)
    }
    V4(64, 1, 8, 4, 0) V4(64, 1, 8, 4, 4) V4(64, 1, 8, 4, 6) V4(64, 1, 8, 4, 14) V4(64, 1, 16, 4, 0)
    V4(64, 1, 8, 4, 21)
    if (sizeof(T) == 2) { V4(64, 1, 8, 4, 1) }
#define V6(E_, G_, VB_, KM_, F_)                                                                  \
    if (!sm && solo_fits<T>(a0, E_, G_, VB_, KM_))                                               \
        v.push_back({"v6 pair E=" #E_ " VB=" #VB_ " F=" #F_, [](const GateArgs &a, cudaStream_t s) { \
                         launch_pair<T, E_, G_, VB_, KM_, F_>(a, g_sm, s);                       \
                     }});
    /* F: 1 recompute s in pass 2, 2 one staging copy per half row, 4 pass 1 unrolled by two
     * units, F / 16 = minimum resident blocks (register cap; 0: what the shared memory allows) */
    V6(256, 8, 16, 8, 2) V6(256, 8, 16, 8, 6)
    if (sizeof(T) == 2) { V6(256, 8, 16, 8, 3) V6(256, 8, 16, 8, 7) }
    V6(64, 1, 8, 4, 2) V6(64, 1, 8, 4, 6) V6(64, 1, 8, 4, 166)
    if (sizeof(T) == 2) { V6(64, 1, 8, 4, 3) }
#undef V6
    v.push_back({"v5 tiny (else v1)", [sm](const GateArgs &a, cudaStream_t s) {
                     by_score(sm, [&](auto tag) {
                         if (!try_tiny<T, SF_OF(tag)>(a, g_sm, s)) launch_dt<T, SF_OF(tag)>(a, g_sm, s);
                     });
                 }});
    v.push_back({"v5 tiny any T", [sm](const GateArgs &a, cudaStream_t s) {
                     by_score(sm, [&](auto tag) {
                         if (!try_tiny<T, SF_OF(tag)>(a, g_sm, s, true)) launch_dt<T, SF_OF(tag)>(a, g_sm, s);
                     });
                 }});
    if (getenv("MOE_V4ONLY")) return v; /* v1 (the reference), library, v4 */
    if (r.E == 256) {
        V2(8, 32, 2048)
        V3(32, 8, 4096) V3(16, 16, 4096) V3(8, 32, 4096)
        V3M(16, 16, 4096, 4) V3M(16, 16, 4096, 5) V3M(16, 16, 8192, 4) V3M(8, 32, 4096, 5)
        V3M(8, 32, 4096, 6) V3M(32, 8, 4096, 4)
    }
#define V2M(N, L, MB)                                                                             \
    if (unit && fast_fits(a0, N, L))                                                              \
        v.push_back({"v2 N=" #N " L=" #L " minb=" #MB, [unit, sm](const GateArgs &a, cudaStream_t s) { \
                         by_score(sm, [&](auto tag) { launch_fast<T, N, L, SF_OF(tag), 2048, MB>(a, unit, g_sm, s); }); \
                     }});
#define V3SM(N, L, MB)                                                                            \
    if (unit && team_fits(a0, N, L))                                                              \
        v.push_back({"v3 N=" #N " L=" #L " minb=" #MB, [unit](const GateArgs &a, cudaStream_t s) { \
                         launch_team<T, N, L, MLAF_SCORE_SOFTMAX, 4096, MB>(a, unit, g_sm, s);                  \
                     }});
    if (r.E == 64) { V2(8, 8, 2048) V2M(8, 8, 6) V2M(8, 8, 8) V3(16, 4, 4096) }
    if (r.E == 384) { V2(12, 32, 2048) V3(12, 32, 4096) V3M(12, 32, 4096, 4) V3M(12, 32, 4096, 5) }
    if (r.E == 160) { V2(5, 32, 2048) V3S(20, 8, 4096) V3SM(20, 8, 4) V3SM(20, 8, 5) V3S(5, 32, 4096) }
#undef V2
#undef V4
#undef V3
#undef V3S
#undef V3M
#undef V2M
#undef V3SM
    return v;
}

static float bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

template <typename T> static T to_t(float f);
template <> float to_t<float>(float f) { return f; }
template <> __nv_bfloat16 to_t<__nv_bfloat16>(float f) { return __float2bfloat16(f); }

static float frand(uint64_t &s) { /* roughly normal, sd 2: sum of 4 uniforms */
    float acc = 0;
    for (int i = 0; i < 4; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        acc += (float)((s >> 40) & 0xffffff) / 16777216.0f - 0.5f;
    }
    return acc * 3.46f;
}

template <typename T>
static int run_router(const Router &r, bool quick, float copy_gbs, const char *dtn) {
    const int E = r.E, K = r.k;
    const int64_t Tval = 4099;
    const int64_t Tmax = quick ? 32768 : 131072;
    const size_t row = (size_t)E * sizeof(T);
    /* rotation: enough copies of the largest input that no call finds it in L2 */
    const size_t one = (size_t)Tmax * row;
    const int copies = (int)std::max<size_t>(2, (256u << 20) / one + 1);
    std::vector<T> h((size_t)Tmax * E);
    uint64_t seed = 12345;
    for (auto &x : h) x = to_t<T>(frand(seed));
    std::vector<float> hb(E);
    for (auto &b : hb) b = 0.3f * frand(seed) / 2.0f;
    T *d_log;
    float *d_bias, *d_w, *d_w1;
    int32_t *d_ids, *d_ids1;
    CK(cudaMalloc(&d_log, one * copies));
    for (int c = 0; c < copies; c++)
        CK(cudaMemcpy((char *)d_log + one * c, h.data(), one, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&d_bias, E * 4));
    CK(cudaMemcpy(d_bias, hb.data(), E * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&d_w, (size_t)Tmax * K * 4));
    CK(cudaMalloc(&d_w1, (size_t)Tmax * K * 4));
    CK(cudaMalloc(&d_ids, (size_t)Tmax * K * 4));
    CK(cudaMalloc(&d_ids1, (size_t)Tmax * K * 4));

    GateArgs a{};
    a.E = E, a.top_k = K, a.n_group = r.G, a.topk_group = r.kg, a.n_shared = 0, a.K = K;
    a.P = E / r.G;
    a.P_magic = a.P == 1 ? 0u : (uint32_t)((0x100000000ull + (uint64_t)a.P - 1) / (uint64_t)a.P);
    a.group_max = r.softmax, a.renormalize = !r.softmax, a.apply_scaling = 1;
    a.scaling = r.scale, a.eps = 1e-20f;
    a.logits = d_log, a.logits_stride = E, a.bias = r.bias ? d_bias : nullptr;
    a.weights_f32 = 1, a.weights_stride = K, a.ids_stride = K;
    a.scores = nullptr;
    a.T = Tval;
    auto vs = variants<T>(r, a);
    if (const char *vf = getenv("MOE_VF")) { /* e.g. MOE_VF="F=6,F=14": v1 (the reference), the
                                               * library and the variants whose names end so */
        std::vector<Variant> keep;
        for (size_t i = 0; i < vs.size(); i++) {
            bool k = i < 2;
            for (const char *q = vf; *q && !k;) {
                const char *end = strchr(q, ',');
                const size_t len = end ? (size_t)(end - q) : strlen(q);
                const std::string &nm = vs[i].name;
                k = len > 0 && nm.size() > len && nm.compare(nm.size() - len, len, q, len) == 0 &&
                    nm[nm.size() - len - 1] == ' ';
                q = end ? end + 1 : q + len;
            }
            if (k) keep.push_back(vs[i]);
        }
        vs = keep;
    }
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    if (const char *pt = getenv("MOE_PROFILE_T")) { /* ncu: one launch per variant at T */
        a.T = std::min<int64_t>(atoll(pt), Tmax);
        a.ids = d_ids, a.weights = d_w;
        for (auto &v : vs) v.fn(a, st);
        CK(cudaStreamSynchronize(st));
        return 0;
    }
    int fail = 0;

    /* validation against v1: the random rows, then the same rows with non-finite logits
     * injected (one NaN every 7th token, +inf every 11th, -inf every 13th, a whole row NaN
     * every 97th) so the teams' exact path runs too */
    T *d_bad;
    CK(cudaMalloc(&d_bad, (size_t)Tval * row));
    {
        std::vector<T> hb2(h.begin(), h.begin() + (size_t)Tval * E);
        const float qnan = std::numeric_limits<float>::quiet_NaN();
        const float inf = std::numeric_limits<float>::infinity();
        for (int64_t t = 0; t < Tval; t++) {
            T *rw = &hb2[(size_t)t * E];
            if (t % 7 == 0) rw[(t * 5) % E] = to_t<T>(qnan);
            if (t % 11 == 0) rw[(t * 3) % E] = to_t<T>(inf);
            if (t % 13 == 0) rw[(t * 17) % E] = to_t<T>(-inf);
            if (t % 97 == 0)
                for (int e = 0; e < E; e++) rw[e] = to_t<T>(qnan);
        }
        CK(cudaMemcpy(d_bad, hb2.data(), (size_t)Tval * row, cudaMemcpyHostToDevice));
    }
    std::vector<int32_t> i0(Tval * K), i1(Tval * K);
    std::vector<float> w0(Tval * K), w1(Tval * K);
    printf("\n%s, %s logits (E=%d, top_k=%d, groups %d/%d)\n", r.name, dtn, E, K, r.G, r.kg);
    for (int pass = 0; pass < 2; pass++) {
        a.logits = pass ? (const void *)d_bad : (const void *)d_log;
        a.ids = d_ids1, a.weights = d_w1;
        vs[0].fn(a, st);
        CK(cudaStreamSynchronize(st));
        CK(cudaMemcpy(i0.data(), d_ids1, i0.size() * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(w0.data(), d_w1, w0.size() * 4, cudaMemcpyDeviceToHost));
        for (size_t vi = 1; vi < vs.size(); vi++) {
            a.ids = d_ids, a.weights = d_w;
            CK(cudaMemset(d_ids, 0xff, Tval * K * 4));
            vs[vi].fn(a, st);
            CK(cudaStreamSynchronize(st));
            CK(cudaGetLastError());
            CK(cudaMemcpy(i1.data(), d_ids, i1.size() * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(w1.data(), d_w, w1.size() * 4, cudaMemcpyDeviceToHost));
            int64_t bad = 0, near = 0;
            double worst = 0;
            for (int64_t t = 0; t < Tval; t++) {
                bool same = memcmp(&i0[t * K], &i1[t * K], K * 4) == 0;
                if (!same) {
                    /* a near-tie shows as swapped neighbours or a changed last id of near-equal
                     * weight; count it apart, judge the count */
                    near++;
                    continue;
                }
                for (int j = 0; j < K; j++) {
                    double ref = w0[t * K + j], got = w1[t * K + j];
                    double e = ref == got ? 0.0 : fabs(got - ref) / fmax(fabs(ref), 1e-30);
                    if (got != got || ref != ref) e = 1.0;
                    worst = fmax(worst, e);
                    if (e > 1e-5) bad++;
                }
            }
            bool ok = bad == 0 && near * 1000 <= Tval; /* near-ties: well under 0.1% of tokens */
            printf("  validate%s %-28s %s (ids differ in %lld / %lld tokens, worst weight rel %.2e)\n",
                   pass ? " non-finite" : "", vs[vi].name.c_str(), ok ? "OK" : "FAIL",
                   (long long)near, (long long)Tval, worst);
            fail |= !ok;
        }
    }
    a.logits = d_log;
    CK(cudaFree(d_bad));

    if (getenv("MOE_NOTIME")) return fail; /* profiling: validation launches only */
    /* timing */
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    printf("  %-30s", "T");
    std::vector<int64_t> bigTs = {32768, 131072};
    if (const char *bt = getenv("MOE_BIGT")) { /* e.g. MOE_BIGT=16384,65536 (at most 131072) */
        bigTs.clear();
        for (const char *q = bt; *q;) {
            char *end;
            const long long v = strtoll(q, &end, 10);
            if (end == q) break;
            if (v > 0) bigTs.push_back(v);
            q = *end == ',' ? end + 1 : end;
        }
    }
    const int64_t smallTs[] = {1, 8, 64};
    for (int64_t t : smallTs) printf(" %9lld", (long long)t);
    for (int64_t t : bigTs)
        if (t <= Tmax) printf(" %9lld %6s", (long long)t, "xfloor");
    printf("   (us; small T per call in a graph)\n");
    a.ids = d_ids, a.weights = d_w;
    for (auto &v : vs) {
        printf("  %-30s", v.name.c_str());
        for (int64_t t : smallTs) {
            a.T = t;
            cudaGraph_t g;
            cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
            for (int i = 0; i < 100; i++) v.fn(a, st);
            CK(cudaStreamEndCapture(st, &g));
            CK(cudaGraphInstantiate(&ge, g, 0));
            CK(cudaGraphLaunch(ge, st));
            CK(cudaStreamSynchronize(st));
            std::vector<float> ms;
            for (int rep = 0; rep < 7; rep++) {
                CK(cudaEventRecord(e0, st));
                CK(cudaGraphLaunch(ge, st));
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                float m;
                CK(cudaEventElapsedTime(&m, e0, e1));
                ms.push_back(m);
            }
            std::sort(ms.begin(), ms.end());
            printf(" %9.2f", ms[3] * 1000.0f / 100.0f);
            CK(cudaGraphExecDestroy(ge));
            CK(cudaGraphDestroy(g));
        }
        for (int64_t t : bigTs) {
            if (t > Tmax) continue;
            a.T = t;
            std::vector<float> ms;
            for (int rep = 0; rep < 19; rep++) {
                a.logits = (char *)d_log + one * (rep % copies);
                CK(cudaEventRecord(e0, st));
                v.fn(a, st);
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                float m;
                CK(cudaEventElapsedTime(&m, e0, e1));
                if (rep >= 4) ms.push_back(m);
            }
            a.logits = d_log;
            std::sort(ms.begin(), ms.end());
            double us = ms[ms.size() / 2] * 1000.0;
            double bytes = (double)t * (row + (size_t)K * 8);
            double floor_us = bytes / (copy_gbs * 1e3);
            printf(" %9.2f %6.2f", us, us / floor_us);
        }
        printf("\n");
        CK(cudaGetLastError());
    }
    CK(cudaFree(d_log));
    CK(cudaFree(d_bias));
    CK(cudaFree(d_w));
    CK(cudaFree(d_w1));
    CK(cudaFree(d_ids));
    CK(cudaFree(d_ids1));
    CK(cudaStreamDestroy(st));
    return fail;
}

int main(int argc, char **argv) {
    bool quick = argc > 1 && !strcmp(argv[1], "--quick");
    CK(cudaDeviceGetAttribute(&g_sm, cudaDevAttrMultiProcessorCount, 0));
    /* same-run D2D copy, read + write */
    size_t cb = 512u << 20;
    void *s, *d;
    CK(cudaMalloc(&s, cb));
    CK(cudaMalloc(&d, cb));
    CK(cudaMemset(s, 1, cb));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int i = 0; i < 12; i++) {
        CK(cudaEventRecord(e0));
        CK(cudaMemcpyAsync(d, s, cb, cudaMemcpyDeviceToDevice));
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float m;
        CK(cudaEventElapsedTime(&m, e0, e1));
        if (i >= 2) ms.push_back(m);
    }
    std::sort(ms.begin(), ms.end());
    float copy_gbs = (float)(2.0 * cb / (ms[ms.size() / 2] * 1e6));
    CK(cudaFree(s));
    CK(cudaFree(d));
    printf("D2D copy: %.0f GB/s (read + write), %d SMs\n", copy_gbs, g_sm);
    (void)bf16_round;
    int fail = 0;
    /* MOE_ONLY=<router name> and MOE_DT=f32|bf16 limit the run (profiling) */
    const char *only = getenv("MOE_ONLY"), *odt = getenv("MOE_DT");
    for (const Router &r : kRouters) {
        if (only && strcmp(only, r.name)) continue;
        if (!odt || !strcmp(odt, "f32")) fail |= run_router<float>(r, quick, copy_gbs, "f32");
        if (!odt || !strcmp(odt, "bf16")) fail |= run_router<__nv_bfloat16>(r, quick, copy_gbs, "bf16");
    }
    printf(fail ? "\nFAIL\n" : "\nall variants validated\n");
    return fail;
}
