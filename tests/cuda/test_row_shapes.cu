/*
 * test_row_shapes.cu — every launch shape of the CUDA row kernel on the same calls.
 *
 * The library picks one shape per call (row_launch.cuh); this test forces each of them (block,
 * warp, bulk on sm_90, generic) on the same inputs — row layouts of several models, every dtype,
 * both RoPE styles, tokens with bad positions, skipped and out-of-range slots — and checks that
 * every shape gives the generic shape's outputs: q and k_nope within one unit in the last place
 * (their sums run in another order), roped k_pe, the cache and the error count exactly, and
 * cache rows no slot names untouched. The generic shape itself is checked against the float64
 * oracle by the op tests. A third writer, mlaf_wr_rstd, stores each row's two rstd values, which
 * are checked against float64 in every shape.
 */
#include "cuda/row_launch.cuh"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

extern "C" {
#include "testlib.h"
}

#define CK(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);     \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd() {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (uint32_t)g_rng;
}
static float rndf() { return ((int32_t)(rnd() >> 8) - (1 << 23)) / (float)(1 << 22); }

static uint16_t to16(float f, mlaf_dtype dt) {
    if (dt == MLAF_BF16) {
        __nv_bfloat16 h = __float2bfloat16_rn(f);
        return *reinterpret_cast<uint16_t *>(&h);
    }
    __half h = __float2half_rn(f);
    return *reinterpret_cast<uint16_t *>(&h);
}
static double from(const unsigned char *p, mlaf_dtype dt) {
    if (dt == MLAF_F32) return *reinterpret_cast<const float *>(p);
    uint16_t u = *reinterpret_cast<const uint16_t *>(p);
    if (dt == MLAF_BF16) {
        uint32_t w = (uint32_t)u << 16;
        float f;
        memcpy(&f, &w, 4);
        return f;
    }
    return __half2float(*reinterpret_cast<const __half *>(&u));
}
/* |a - b| in units of the last place of dt at b's magnitude. */
static double ulps(double a, double b, mlaf_dtype dt) {
    if (a == b) return 0;
    const int mant = dt == MLAF_F32 ? 23 : dt == MLAF_F16 ? 10 : 7;
    const double m = fabs(b) > 1e-30 ? fabs(b) : 1e-30;
    return fabs(a - b) / ldexp(1.0, ilogb(m) - mant);
}

struct bufs {
    std::vector<unsigned char> q, k, p, cache;
    std::vector<float> rstd;
    int32_t err;
};

template <typename T>
static bufs run(int Q, int C, int R, int64_t T_, bool neox, bool rope, mlaf_dtype cdt, mlaf_row_shape shape,
                const std::vector<unsigned char> &lat, const std::vector<unsigned char> &w, const std::vector<int32_t> &pos,
                const std::vector<int32_t> &slots, const std::vector<float> &cs, int64_t nblk, int64_t bs, int cc,
                int sms, bool *took) {
    typedef mlaf_wr_pair<mlaf_wr_pair<mlaf_wr_dense<T>, mlaf_wr_paged<T>>, mlaf_wr_rstd<T>> Wr;
    typedef mlaf_wr_pair<mlaf_wr_dense<T>, mlaf_wr_rstd<T>> Ws;
    const int64_t es = sizeof(T), ces = mlaf_dtype_size(cdt), Wd = Q + C + R, ls = Wd + 16;
    unsigned char *dl, *dw, *dq, *dk, *dp, *dc;
    int32_t *dpos, *dsl, *derr;
    float *dcs, *drs;
    CK(cudaMalloc(&drs, (size_t)(T_ * 2 * 4)));
    const size_t cache_bytes = (size_t)(nblk * bs * (C + R) * ces);
    CK(cudaMalloc(&dl, lat.size()));
    CK(cudaMalloc(&dw, w.size()));
    CK(cudaMalloc(&dq, (size_t)(T_ * (Q ? Q : 1) * es)));
    CK(cudaMalloc(&dk, (size_t)(T_ * C * es)));
    CK(cudaMalloc(&dp, (size_t)(T_ * (R ? R : 1) * es)));
    CK(cudaMalloc(&dc, cache_bytes));
    CK(cudaMalloc(&dpos, pos.size() * 4));
    CK(cudaMalloc(&dsl, slots.size() * 4));
    CK(cudaMalloc(&derr, 4));
    CK(cudaMalloc(&dcs, cs.size() * 4));
    CK(cudaMemcpy(dl, lat.data(), lat.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dw, w.data(), w.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dpos, pos.data(), pos.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dsl, slots.data(), slots.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dcs, cs.data(), cs.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(dq, 0x5a, (size_t)(T_ * (Q ? Q : 1) * es)));
    CK(cudaMemset(dk, 0x5a, (size_t)(T_ * C * es)));
    CK(cudaMemset(dp, 0x5a, (size_t)(T_ * (R ? R : 1) * es)));
    CK(cudaMemset(dc, 0x5a, cache_bytes));
    CK(cudaMemset(derr, 0, 4));

    mlaf_row_args a = mlaf_row_args();
    a.T = T_, a.Q = Q, a.C = C, a.R = R, a.eps_q = 1e-6f, a.eps_kv = 1e-5f;
    a.latent = dl, a.ls = ls;
    a.w_q = dw, a.w_kv = dw + (size_t)Q * es;
    if (rope) {
        a.pos = dpos, a.neox = neox, a.cos_sin = dcs, a.cs_stride = R, a.max_pos = (int64_t)cs.size() / (R ? R : 1);
        a.slots = dsl, a.n_map = T, a.n_slots = nblk * bs, a.block_size = bs, a.err = derr;
    }
    typename Wr::params wp;
    wp.a.a.q = Q ? dq : nullptr, wp.a.a.qs = Q, wp.a.a.k_nope = dk, wp.a.a.ks = C, wp.a.a.k_pe = R ? dp : nullptr;
    wp.a.a.ps = R, wp.a.a.pe_raw = !rope;
    wp.a.b.cache = rope ? dc : nullptr, wp.a.b.dt = cdt, wp.a.b.s0 = bs * (C + R), wp.a.b.s1 = C + R;
    wp.b.out = drs;
    typename Ws::params ws;
    ws.a = wp.a.a, ws.b = wp.b;
    cudaError_t e;
    if (rope) e = mlaf_row_launch<T, true, Wr>(a, wp, true, sms, cc, 0, shape);
    else e = mlaf_row_launch<T, false, Ws>(a, ws, true, sms, cc, 0, shape);
    CK(e);
    CK(cudaDeviceSynchronize());
    *took = true;
    bufs b;
    b.q.resize((size_t)(T_ * Q * es)), b.k.resize((size_t)(T_ * C * es)), b.p.resize((size_t)(T_ * R * es));
    b.cache.resize(cache_bytes);
    if (Q) CK(cudaMemcpy(b.q.data(), dq, b.q.size(), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(b.k.data(), dk, b.k.size(), cudaMemcpyDeviceToHost));
    if (R) CK(cudaMemcpy(b.p.data(), dp, b.p.size(), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(b.cache.data(), dc, cache_bytes, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&b.err, derr, 4, cudaMemcpyDeviceToHost));
    b.rstd.resize((size_t)(T_ * 2));
    CK(cudaMemcpy(b.rstd.data(), drs, b.rstd.size() * 4, cudaMemcpyDeviceToHost));
    cudaFree(drs);
    cudaFree(dl), cudaFree(dw), cudaFree(dq), cudaFree(dk), cudaFree(dp), cudaFree(dc), cudaFree(dpos), cudaFree(dsl),
        cudaFree(derr), cudaFree(dcs);
    return b;
}

static double worst_ulps(const std::vector<unsigned char> &a, const std::vector<unsigned char> &b, mlaf_dtype dt) {
    const size_t es = mlaf_dtype_size(dt);
    double w = 0;
    for (size_t i = 0; i + es <= a.size(); i += es) {
        const double u = ulps(from(&a[i], dt), from(&b[i], dt), dt);
        if (!(u <= w)) w = u;
    }
    return w;
}

template <typename T>
static void one(const char *model, int Q, int C, int R, bool neox, bool rope, mlaf_dtype cdt, int cc, int sms) {
    const mlaf_dtype dt = mlaf_dtype_of<T>();
    const int64_t T_ = 37, es = sizeof(T), Wd = Q + C + R, ls = Wd + 16, nblk = 7, bs = 8, max_pos = 50;
    std::vector<unsigned char> lat((size_t)(T_ * ls * es)), w((size_t)((Q + C) * es));
    for (int64_t i = 0; i < T_ * ls; i++) {
        const float f = rndf();
        if (dt == MLAF_F32) memcpy(&lat[(size_t)(i * 4)], &f, 4);
        else {
            const uint16_t u = to16(f, dt);
            memcpy(&lat[(size_t)(i * 2)], &u, 2);
        }
    }
    for (int i = 0; i < Q + C; i++) {
        const float f = 1.0f + 0.25f * rndf();
        if (dt == MLAF_F32) memcpy(&w[(size_t)i * 4], &f, 4);
        else {
            const uint16_t u = to16(f, dt);
            memcpy(&w[(size_t)i * 2], &u, 2);
        }
    }
    std::vector<int32_t> pos((size_t)T_), slots((size_t)T_);
    std::vector<int> perm((size_t)(nblk * bs));
    for (int i = 0; i < nblk * bs; i++) perm[(size_t)i] = i;
    for (int i = nblk * bs - 1; i > 0; i--) std::swap(perm[(size_t)i], perm[rnd() % (uint32_t)(i + 1)]);
    for (int64_t t = 0; t < T_; t++) {
        pos[(size_t)t] = (int32_t)(rnd() % max_pos);
        slots[(size_t)t] = perm[(size_t)t];
    }
    pos[3] = (int32_t)max_pos, pos[4] = -1;                    /* bad positions: counted (R > 0) */
    slots[5] = -1, slots[6] = (int32_t)(nblk * bs + 3);        /* a skip, and past the cache: counted */
    std::vector<float> cs((size_t)(max_pos * (R ? R : 1)));
    for (auto &x : cs) x = rndf();

    /* the rstd values in float64, from the stored inputs */
    std::vector<double> rs((size_t)(T_ * 2));
    for (int64_t t = 0; t < T_; t++) {
        double sq = 0, skv = 0;
        for (int i = 0; i < Q + C; i++) {
            const double x = from(&lat[(size_t)((t * ls + i) * es)], dt);
            if (i < Q) sq += x * x;
            else skv += x * x;
        }
        rs[(size_t)(2 * t)] = Q ? 1.0 / sqrt(sq / Q + 1e-6f) : 0.0;
        rs[(size_t)(2 * t + 1)] = 1.0 / sqrt(skv / C + 1e-5f);
    }
    bool took;
    const bufs ref = run<T>(Q, C, R, T_, neox, rope, cdt, MLAF_ROW_GENERIC, lat, w, pos, slots, cs, nblk, bs, cc, sms, &took);
    static const mlaf_row_shape shapes[] = {MLAF_ROW_BLOCK, MLAF_ROW_WARP, MLAF_ROW_BULK};
    static const char *names[] = {"block", "warp", "bulk"};
    for (int k = 0; k < 3; k++) {
        char name[200];
        snprintf(name, sizeof name, "ROW_SHAPE(model=%s,Q=%d,R=%d,dtype=%s,op=%s,rope=%s,cache=%s,shape=%s)", model, Q, R,
                 mlaf_dtype_name(dt), rope ? "mla_kv_cache" : "split_qk_norm", neox ? "neox" : "interleaved",
                 mlaf_dtype_name(cdt), names[k]);
        if (shapes[k] == MLAF_ROW_BULK && cc < 90) {
            tl_skip(name, "bulk shape needs sm_90");
            continue;
        }
        const bufs b = run<T>(Q, C, R, T_, neox, rope, cdt, shapes[k], lat, w, pos, slots, cs, nblk, bs, cc, sms, &took);
        const double uq = worst_ulps(b.q, ref.q, dt), uk = worst_ulps(b.k, ref.k, dt);
        const double uc = worst_ulps(b.cache, ref.cache, cdt);
        const bool pe_same = b.p == ref.p, err_same = b.err == ref.err;
        double ur = 0; /* relative error of the rstd values */
        for (size_t i = 0; i < rs.size(); i++) {
            const double u = rs[i] ? fabs(b.rstd[i] - rs[i]) / rs[i] : fabs(b.rstd[i]);
            if (!(u <= ur)) ur = u;
        }
        /* sums in another order: f32 values within SPEC §7's 1e-5 relative (about 84 ulp), 16-bit
         * ones within one rounding */
        const double tol = dt == MLAF_F32 ? 84 : 1, cache_tol = cdt == MLAF_F32 ? 84 : 1;
        tl_case(uq <= tol && uk <= tol && uc <= cache_tol && pe_same && err_same && (!rope || ref.err == (R > 0 ? 3 : 1)) &&
                    ur <= 1e-5,
                name, "q %.1f ulp, k_nope %.1f ulp, cache %.1f ulp, k_pe %s, error count %d vs %d, rstd %.2g", uq, uk,
                uc, pe_same ? "same" : "differs", b.err, ref.err, ur);
    }
}

int main(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("SKIP: cuda backend: no CUDA device visible\n");
        tl_skip("ROW_SHAPE", "no CUDA device");
        return tl_finish();
    }
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    const int cc = p.major * 10 + p.minor, sms = p.multiProcessorCount;
    static const struct { const char *name; int Q, C, R; } models[] = {
        {"glm-4.7-flash", 768, 512, 64}, {"deepseek-v3", 1536, 512, 64}, {"glm-5", 2048, 512, 64},
        {"deepseek-v2-lite", 0, 512, 64}, {"q1024-r0", 1024, 512, 0},  {"q3072", 3072, 512, 64},
        {"q512-c256-r32", 512, 256, 32}};
    for (const auto &m : models) {
        for (int rope = 0; rope < 2; rope++) {
            for (int neox = 0; neox < (rope ? 2 : 1); neox++) {
                one<__nv_bfloat16>(m.name, m.Q, m.C, m.R, neox, rope, MLAF_BF16, cc, sms);
                one<__half>(m.name, m.Q, m.C, m.R, neox, rope, MLAF_F16, cc, sms);
                if (m.Q <= 1536) one<float>(m.name, m.Q, m.C, m.R, neox, rope, MLAF_F32, cc, sms);
                if (rope && !neox) one<__nv_bfloat16>(m.name, m.Q, m.C, m.R, neox, rope, MLAF_F32, cc, sms);
            }
        }
    }
    return tl_finish();
}
