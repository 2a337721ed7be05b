/*
 * test_row_shapes.cu — every launch shape of the CUDA row kernel on the same calls.
 *
 * The library picks one shape per call (row_launch.cuh); this test forces each of them (block,
 * split block, warp, bulk on sm_90, generic) on the same inputs — row layouts of several models, every dtype,
 * both RoPE styles, tokens with bad positions, skipped and out-of-range slots — and checks that
 * every shape gives the generic shape's outputs: q and k_nope within one unit in the last place
 * (their sums run in another order), roped k_pe, the cache and the error count exactly, and
 * cache rows no slot names untouched. The generic shape itself is checked against the float64
 * oracle by the op tests. A third writer, mlaf_wr_rstd, stores each row's two rstd values, which
 * are checked against float64 in every shape. The fp8 writers (per-tensor e4m3 by division and by
 * multiplication with amax_out, fp8_ds_mla with amax and ue8m0 tile scales) run in every shape,
 * generic included: their records must equal the host encoding (fp8.h) of the same shape's dense
 * outputs, bit for bit. DeepSeek-V4's kv rope tail and fp8_v4 page writer likewise (v4_one).
 */
#include "cuda/row_launch.cuh"
#include "cuda/row_writers_fp8.cuh"
#include "fp8.h"
#include "ref/verify.h"

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
    float amax;
};

/* Cache formats the test drives: plain (cache dtype cdt), per-tensor fp8 (x / 0.01; x * 50 with
 * amax_out), fp8_ds_mla (amax and ue8m0 tile scales; bf16 only). */
enum { F_PLAIN, F_FP8_DIV, F_FP8_MUL, F_DS_AMAX, F_DS_UE8M0, F_COUNT };
static const char *const fmt_names[F_COUNT] = {"plain", "fp8-div", "fp8-mul-amax", "fp8_ds_mla-amax", "fp8_ds_mla-ue8m0"};
static int64_t rec_bytes(int fmt, int C, int R, int64_t ces) {
    return fmt == F_PLAIN ? (C + R) * ces : fmt <= F_FP8_MUL ? C + R : C + C / 32 + 2 * R;
}
static const float FP8_DIV_SCALE = 0.01f, FP8_MUL_SCALE = 50.0f;

template <typename T>
static bufs run(int Q, int C, int R, int64_t T_, bool neox, bool rope, mlaf_dtype cdt, mlaf_row_shape shape,
                const std::vector<unsigned char> &lat, const std::vector<unsigned char> &w, const std::vector<int32_t> &pos,
                const std::vector<int32_t> &slots, const std::vector<float> &cs, int64_t nblk, int64_t bs, int cc,
                int sms, bool *took, int fmt = F_PLAIN) {
    typedef mlaf_wr_pair<mlaf_wr_pair<mlaf_wr_dense<T>, mlaf_wr_paged<T>>, mlaf_wr_rstd<T>> Wr;
    typedef mlaf_wr_pair<mlaf_wr_pair<mlaf_wr_dense<T>, mlaf_wr_fp8<T>>, mlaf_wr_rstd<T>> Wf;
    typedef mlaf_wr_pair<mlaf_wr_pair<mlaf_wr_dense<T>, mlaf_wr_ds_mla>, mlaf_wr_rstd<T>> Wm;
    typedef mlaf_wr_pair<mlaf_wr_dense<T>, mlaf_wr_rstd<T>> Ws;
    const int64_t es = sizeof(T), ces = mlaf_dtype_size(cdt), Wd = Q + C + R, ls = Wd + 16;
    const int64_t rec = rec_bytes(fmt, C, R, ces);
    unsigned char *dl, *dw, *dq, *dk, *dp, *dc;
    int32_t *dpos, *dsl, *derr;
    float *dcs, *drs, *dsc;
    CK(cudaMalloc(&drs, (size_t)(T_ * 2 * 4)));
    CK(cudaMalloc(&dsc, 8)); /* the fp8 scale, then amax_out */
    const float sc[2] = {fmt == F_FP8_MUL ? FP8_MUL_SCALE : FP8_DIV_SCALE, 0.0f};
    CK(cudaMemcpy(dsc, sc, 8, cudaMemcpyHostToDevice));
    const size_t cache_bytes = (size_t)(nblk * bs * rec);
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
        a.slots = dsl, a.n_map = T_, a.n_slots = nblk * bs, a.block_size = bs, a.err = derr;
    }
    typename Wr::params wp;
    wp.a.a.q = Q ? dq : nullptr, wp.a.a.qs = Q, wp.a.a.k_nope = dk, wp.a.a.ks = C, wp.a.a.k_pe = R ? dp : nullptr;
    wp.a.a.ps = R, wp.a.a.pe_raw = !rope;
    wp.a.b.cache = rope ? dc : nullptr, wp.a.b.kpe = nullptr, wp.a.b.dt = cdt, wp.a.b.s0 = bs * (C + R), wp.a.b.s1 = C + R;
    wp.b.out = drs;
    typename Ws::params ws;
    ws.a = wp.a.a, ws.b = wp.b;
    cudaError_t e = cudaSuccess;
    if (!rope) {
        e = mlaf_row_launch<T, false, Ws>(a, ws, true, sms, cc, 0, shape);
    } else if (fmt == F_PLAIN) {
        e = mlaf_row_launch<T, true, Wr>(a, wp, true, sms, cc, 0, shape);
    } else if (fmt <= F_FP8_MUL) {
        typename Wf::params fp;
        fp.a.a = wp.a.a, fp.b = wp.b;
        fp.a.b.cache = dc, fp.a.b.kpe = nullptr, fp.a.b.s0 = bs * rec, fp.a.b.s1 = rec, fp.a.b.k0 = fp.a.b.k1 = 0;
        fp.a.b.scale = dsc, fp.a.b.amax = fmt == F_FP8_MUL ? dsc + 1 : nullptr, fp.a.b.mul = fmt == F_FP8_MUL;
        e = mlaf_row_launch<T, true, Wf>(a, fp, true, sms, cc, 0, shape);
    } else if constexpr (std::is_same<T, __nv_bfloat16>::value) {
        typename Wm::params mp;
        mp.a.a = wp.a.a, mp.b = wp.b;
        mp.a.b.cache = dc, mp.a.b.s0 = bs * rec, mp.a.b.s1 = rec, mp.a.b.mode = fmt == F_DS_AMAX ? 0 : 1;
        e = mlaf_row_launch<T, true, Wm>(a, mp, true, sms, cc, 0, shape);
    }
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
    CK(cudaMemcpy(&b.amax, dsc + 1, 4, cudaMemcpyDeviceToHost));
    cudaFree(drs), cudaFree(dsc);
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

/* A call's inputs: latent values amp * [-2, 2), weights 1 + spread * [-2, 2), positions (two out
 * of the table: counted when R > 0), distinct slots in random order (one skipped, one past the
 * cache: counted), a cos/sin table. */
struct inputs {
    std::vector<unsigned char> lat, w;
    std::vector<int32_t> pos, slots;
    std::vector<float> cs;
};
static void put_value(std::vector<unsigned char> &v, int64_t i, float f, mlaf_dtype dt) {
    if (dt == MLAF_F32) memcpy(&v[(size_t)(i * 4)], &f, 4);
    else {
        const uint16_t u = to16(f, dt);
        memcpy(&v[(size_t)(i * 2)], &u, 2);
    }
}
static inputs make_inputs(mlaf_dtype dt, int Q, int C, int R, int64_t T_, int64_t ls, float amp, float spread,
                          int64_t nblk, int64_t bs, int64_t max_pos) {
    const int64_t es = (int64_t)mlaf_dtype_size(dt);
    inputs in;
    in.lat.resize((size_t)(T_ * ls * es)), in.w.resize((size_t)((Q + C) * es));
    for (int64_t i = 0; i < T_ * ls; i++) put_value(in.lat, i, amp * rndf(), dt);
    for (int i = 0; i < Q + C; i++) put_value(in.w, i, 1.0f + spread * rndf(), dt);
    in.pos.resize((size_t)T_), in.slots.resize((size_t)T_);
    std::vector<int> perm((size_t)(nblk * bs));
    for (int i = 0; i < nblk * bs; i++) perm[(size_t)i] = i;
    for (int i = nblk * bs - 1; i > 0; i--) std::swap(perm[(size_t)i], perm[rnd() % (uint32_t)(i + 1)]);
    for (int64_t t = 0; t < T_; t++) in.pos[(size_t)t] = (int32_t)(rnd() % max_pos), in.slots[(size_t)t] = perm[(size_t)t];
    in.pos[3] = (int32_t)max_pos, in.pos[4] = -1, in.slots[5] = -1, in.slots[6] = (int32_t)(nblk * bs + 3);
    in.cs.resize((size_t)(max_pos * (R ? R : 1)));
    for (auto &x : in.cs) x = rndf();
    return in;
}

template <typename T>
static void one(const char *model, int Q, int C, int R, bool neox, bool rope, mlaf_dtype cdt, int cc, int sms) {
    const mlaf_dtype dt = mlaf_dtype_of<T>();
    const int64_t T_ = 37, es = sizeof(T), Wd = Q + C + R, ls = Wd + 16, nblk = 7, bs = 8, max_pos = 50;
    const inputs in = make_inputs(dt, Q, C, R, T_, ls, 1.0f, 0.25f, nblk, bs, max_pos);
    const std::vector<unsigned char> &lat = in.lat, &w = in.w;
    const std::vector<int32_t> &pos = in.pos, &slots = in.slots;
    const std::vector<float> &cs = in.cs;

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
    static const mlaf_row_shape shapes[] = {MLAF_ROW_BLOCK, MLAF_ROW_WARP, MLAF_ROW_BULK, MLAF_ROW_SPLIT};
    static const char *names[] = {"block", "warp", "bulk", "split"};
    for (int k = 0; k < 4; k++) {
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
        /* sums in another order: f32 values within the 1e-5 relative of docs/conventions.md (about
         * 84 ulp), 16-bit ones within one rounding */
        const double tol = dt == MLAF_F32 ? 84 : 1, cache_tol = cdt == MLAF_F32 ? 84 : 1;
        tl_case(uq <= tol && uk <= tol && uc <= cache_tol && pe_same && err_same && (!rope || ref.err == (R > 0 ? 3 : 1)) &&
                    ur <= 1e-5,
                name, "q %.1f ulp, k_nope %.1f ulp, cache %.1f ulp, k_pe %s, error count %d vs %d, rstd %.2g", uq, uk,
                uc, pe_same ? "same" : "differs", b.err, ref.err, ur);
    }
}

/* The record bytes of a token in format fmt from the shape's own dense row (k_nope values k,
 * roped k_pe values p, as stored), by the host's fp8 numerics (fp8.h); *amax raised to its max. */
static void encode(int fmt, int C, int R, mlaf_dtype dt, const unsigned char *k, const unsigned char *p,
                   unsigned char *out, float *amax) {
    const size_t es = mlaf_dtype_size(dt);
    if (fmt <= F_FP8_MUL) {
        for (int i = 0; i < C + R; i++) {
            const float x = (float)(i < C ? from(k + i * es, dt) : from(p + (i - C) * es, dt));
            out[i] = mlaf_f32_to_e4m3(fmt == F_FP8_MUL ? x * FP8_MUL_SCALE : x / FP8_DIV_SCALE);
            if (fabsf(x) > *amax) *amax = fabsf(x);
        }
        return;
    }
    for (int t0 = 0; t0 < C; t0 += 128) {
        float m = 0.0f;
        for (int i = t0; i < t0 + 128; i++) m = fmaxf(m, fabsf((float)from(k + i * es, dt)));
        const float s = mlaf_tile_scale_of(m, fmt == F_DS_AMAX ? 0 : 1);
        for (int i = t0; i < t0 + 128; i++) out[i] = mlaf_f32_to_e4m3((float)from(k + i * es, dt) / s);
        memcpy(out + C + 4 * (t0 / 128), &s, 4);
    }
    memcpy(out + C + C / 32, p, (size_t)R * 2);
}

/* Each fp8 writer in every shape: the cache records equal the host encoding of that shape's own
 * dense outputs, bit for bit; rows no valid slot names keep their bytes; amax_out as the host's. */
template <typename T>
static void fp8_one(const char *model, int Q, int C, int R, bool neox, int cc, int sms) {
    const mlaf_dtype dt = mlaf_dtype_of<T>();
    const int64_t T_ = 37, es = sizeof(T), Wd = Q + C + R, ls = Wd + 16, nblk = 7, bs = 8, max_pos = 50;
    const inputs in = make_inputs(dt, Q, C, R, T_, ls, 2.0f, 0.5f, nblk, bs, max_pos);
    const std::vector<unsigned char> &lat = in.lat, &w = in.w;
    const std::vector<int32_t> &pos = in.pos, &slots = in.slots;
    const std::vector<float> &cs = in.cs;

    static const mlaf_row_shape shapes[] = {MLAF_ROW_GENERIC, MLAF_ROW_BLOCK, MLAF_ROW_WARP, MLAF_ROW_BULK, MLAF_ROW_SPLIT};
    static const char *names[] = {"generic", "block", "warp", "bulk", "split"};
    for (int fmt = F_FP8_DIV; fmt < F_COUNT; fmt++) {
        if (fmt >= F_DS_AMAX && (dt != MLAF_BF16 || C % 128)) continue;
        const int64_t rec = rec_bytes(fmt, C, R, 1);
        for (int k = 0; k < 5; k++) {
            char name[200];
            snprintf(name, sizeof name, "ROW_SHAPE(model=%s,Q=%d,R=%d,dtype=%s,op=mla_kv_cache,rope=%s,cache=%s,shape=%s)",
                     model, Q, R, mlaf_dtype_name(dt), neox ? "neox" : "interleaved", fmt_names[fmt], names[k]);
            if (shapes[k] == MLAF_ROW_BULK && cc < 90) {
                tl_skip(name, "bulk shape needs sm_90");
                continue;
            }
            bool took;
            const bufs b = run<T>(Q, C, R, T_, neox, true, MLAF_BF16, shapes[k], lat, w, pos, slots, cs, nblk, bs, cc,
                                  sms, &took, fmt);
            std::vector<unsigned char> want((size_t)(nblk * bs * rec), 0x5a), enc((size_t)rec);
            float amax = 0.0f;
            for (int64_t t = 0; t < T_; t++) {
                const int32_t sl = slots[(size_t)t];
                const bool ok = sl >= 0 && sl < nblk * bs && (R == 0 || (pos[(size_t)t] >= 0 && pos[(size_t)t] < max_pos));
                if (!ok) continue;
                encode(fmt, C, R, dt, &b.k[(size_t)(t * C * es)], &b.p[(size_t)(t * R * es)], enc.data(), &amax);
                memcpy(&want[(size_t)(sl * rec)], enc.data(), (size_t)rec);
            }
            int64_t bad = 0, first = -1;
            for (size_t i = 0; i < want.size(); i++)
                if (want[i] != b.cache[i] && bad++ == 0) first = (int64_t)i;
            const bool amax_ok = fmt != F_FP8_MUL || b.amax == amax;
            tl_case(bad == 0 && amax_ok && b.err == (R > 0 ? 3 : 1), name,
                    "%lld cache bytes differ from the encoding of the dense row (first at slot %lld byte %lld), "
                    "amax %g vs %g, error count %d",
                    (long long)bad, (long long)(first < 0 ? -1 : first / rec), (long long)(first < 0 ? -1 : first % rec),
                    (double)b.amax, (double)amax, b.err);
        }
    }
}

/* DeepSeek-V4 (docs/mla.md, docs/kv_formats.md): the kv rope tail (64 of C = 512, R = 0) and the
 * fp8_v4 page writer in every shape (bf16): each shape's dense k_nope within 1 ulp of the generic
 * shape's (its tail rotated the same way), and its cache pages equal to the reference encoder (src/ref) applied to
 * that shape's own dense rows at the planar offsets (data row page + 576 o, scale row page +
 * 576 bs + 8 o), every other byte as it was; the error count 3 (two positions, one slot). */
static void v4_one(int cc, int sms) {
    typedef __nv_bfloat16 T;
    typedef mlaf_wr_pair<mlaf_wr_dense<T>, mlaf_wr_v4> Wv;
    const int Q = 1024, C = 512, tail = 64;
    const int64_t T_ = 37, es = 2, ls = Q + C + 16, nblk = 7, bs = 8, max_pos = 50, stride = bs * 584 + 32;
    const inputs in = make_inputs(MLAF_BF16, Q, C, tail, T_, ls, 2.0f, 0.5f, nblk, bs, max_pos); /* cs [50, 64] */
    static const mlaf_row_shape shapes[] = {MLAF_ROW_GENERIC, MLAF_ROW_BLOCK, MLAF_ROW_WARP, MLAF_ROW_BULK, MLAF_ROW_SPLIT};
    static const char *names[] = {"generic", "block", "warp", "bulk", "split"};
    std::vector<unsigned char> k0;
    for (int k = 0; k < 5; k++) {
        char name[160];
        snprintf(name, sizeof name, "ROW_SHAPE(model=deepseek-v4-flash,Q=%d,R=0,kv_rope_tail=%d,dtype=bf16,op=mla_kv_cache,cache=fp8_v4,shape=%s)",
                 Q, tail, names[k]);
        if (shapes[k] == MLAF_ROW_BULK && cc < 90) {
            tl_skip(name, "bulk shape needs sm_90");
            continue;
        }
        unsigned char *dl, *dw, *dq, *dk, *dc;
        int32_t *dpos, *dsl, *derr;
        float *dcs;
        const size_t cache_bytes = (size_t)(nblk * stride);
        CK(cudaMalloc(&dl, in.lat.size()));
        CK(cudaMalloc(&dw, in.w.size()));
        CK(cudaMalloc(&dq, (size_t)(T_ * Q * es)));
        CK(cudaMalloc(&dk, (size_t)(T_ * C * es)));
        CK(cudaMalloc(&dc, cache_bytes));
        CK(cudaMalloc(&dpos, in.pos.size() * 4));
        CK(cudaMalloc(&dsl, in.slots.size() * 4));
        CK(cudaMalloc(&derr, 4));
        CK(cudaMalloc(&dcs, in.cs.size() * 4));
        CK(cudaMemcpy(dl, in.lat.data(), in.lat.size(), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dw, in.w.data(), in.w.size(), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dpos, in.pos.data(), in.pos.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dsl, in.slots.data(), in.slots.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dcs, in.cs.data(), in.cs.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemset(dk, 0x5a, (size_t)(T_ * C * es)));
        CK(cudaMemset(dc, 0x5a, cache_bytes));
        CK(cudaMemset(derr, 0, 4));
        mlaf_row_args a = mlaf_row_args();
        a.T = T_, a.Q = Q, a.C = C, a.R = 0, a.tail = tail, a.eps_q = 1e-6f, a.eps_kv = 1e-6f;
        a.latent = dl, a.ls = ls, a.w_q = dw, a.w_kv = dw + (size_t)Q * es;
        a.pos = dpos, a.neox = 0, a.cos_sin = dcs, a.cs_stride = tail, a.max_pos = max_pos;
        a.slots = dsl, a.n_map = T_, a.n_slots = nblk * bs, a.block_size = bs, a.err = derr;
        Wv::params wp;
        wp.a.q = dq, wp.a.qs = Q, wp.a.k_nope = dk, wp.a.ks = C, wp.a.k_pe = nullptr, wp.a.ps = 0, wp.a.pe_raw = 0;
        wp.b.cache = dc, wp.b.s0 = stride;
        CK((mlaf_row_launch<T, true, Wv>(a, wp, true, sms, cc, 0, shapes[k])));
        CK(cudaDeviceSynchronize());
        std::vector<unsigned char> kn((size_t)(T_ * C * es)), cache(cache_bytes);
        int32_t err = 0;
        CK(cudaMemcpy(kn.data(), dk, kn.size(), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(cache.data(), dc, cache_bytes, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(&err, derr, 4, cudaMemcpyDeviceToHost));
        cudaFree(dl), cudaFree(dw), cudaFree(dq), cudaFree(dk), cudaFree(dc), cudaFree(dpos), cudaFree(dsl),
            cudaFree(derr), cudaFree(dcs);
        std::vector<unsigned char> want(cache_bytes, 0x5a);
        mlaf_kv_encoding enc = {MLAF_KV_FP8_V4, MLAF_FP8_DIV, 1.0f, MLAF_TILE_AMAX, C, 0};
        float row[512];
        uint8_t rec[584];
        for (int64_t t = 0; t < T_; t++) {
            const int32_t sl = in.slots[(size_t)t];
            if (sl < 0 || sl >= nblk * bs || in.pos[(size_t)t] < 0 || in.pos[(size_t)t] >= max_pos) continue;
            for (int i = 0; i < C; i++) row[i] = (float)from(&kn[(size_t)((t * C + i) * es)], MLAF_BF16);
            mlaf_ref_kv_encode(&enc, row, nullptr, rec, nullptr);
            const int64_t page = (sl / bs) * stride, o = sl % bs;
            memcpy(&want[(size_t)(page + o * 576)], rec, 576);
            memcpy(&want[(size_t)(page + bs * 576 + o * 8)], rec + 576, 8);
        }
        int64_t bad = 0, first = -1;
        for (size_t i = 0; i < want.size(); i++)
            if (want[i] != cache[i] && bad++ == 0) first = (int64_t)i;
        if (k == 0) k0 = kn;
        const double wu = worst_ulps(kn, k0, MLAF_BF16);
        tl_case(bad == 0 && err == 3 && wu <= 1.0, name,
                "%lld cache bytes differ from the encoding of the dense rows (first at byte %lld), error count %d, "
                "k_nope %.2f ulp from the generic shape's", (long long)bad, (long long)first, err, wu);
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
        {"q512-c256-r32", 512, 256, 32}, {"glm-5.3-flash", 1536, 512, 0}};
    for (const auto &m : models) {
        for (int rope = 0; rope < 2; rope++) {
            for (int neox = 0; neox < (rope ? 2 : 1); neox++) {
                one<__nv_bfloat16>(m.name, m.Q, m.C, m.R, neox, rope, MLAF_BF16, cc, sms);
                one<__half>(m.name, m.Q, m.C, m.R, neox, rope, MLAF_F16, cc, sms);
                if (m.Q <= 1536) one<float>(m.name, m.Q, m.C, m.R, neox, rope, MLAF_F32, cc, sms);
                if (rope && !neox) one<__nv_bfloat16>(m.name, m.Q, m.C, m.R, neox, rope, MLAF_F32, cc, sms);
                if (rope) {
                    fp8_one<__nv_bfloat16>(m.name, m.Q, m.C, m.R, neox, cc, sms);
                    if (!neox) fp8_one<__half>(m.name, m.Q, m.C, m.R, neox, cc, sms);
                    if (!neox && m.Q <= 1536) fp8_one<float>(m.name, m.Q, m.C, m.R, neox, cc, sms);
                }
            }
        }
    }
    v4_one(cc, sms);
    return tl_finish();
}
