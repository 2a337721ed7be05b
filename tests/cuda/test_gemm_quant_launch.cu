/*
 * test_gemm_quant_launch.cu — the CUDA gemm_quant kernel's launch shapes and its place in a chain.
 *
 * SHAPES: calls whose grid the op tests do not reach, each run on the CUDA and the CPU backend from
 * the same bytes; every output byte (e4m3 values, scales, packed zero bytes, the poisoned padding rows
 * and row padding both leave alone) must be equal: more than 65535 rows (the grid's x extent), a row
 * of 2^20 values (1024 blocks a row), rows whose last block is partly idle (K = 7168 in bf16: 4
 * blocks of 224 threads), a row of one mxfp8 group (4 of 32 lanes busy), and the element path (rows
 * one element off 16-byte alignment). x holds NaN and infinities in some rows.
 * PDL: rms_norm_quant writes y, then gemm_quant quantizes y, three times in a row: with programmatic
 * dependent launch on (eagerly and captured in a CUDA graph) every byte must equal the run with it
 * off; a gemm_quant that read y before waiting for the norm would differ. sm_90 only.
 * Skips with a line where no GPU is visible.
 */
#include <cuda_runtime.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

extern "C" {
#include "half.h"
#include "testlib.h"
}

namespace {

uint64_t g_rng = 0x6a09e667f3bcc909ull;
uint32_t rnd() {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (uint32_t)g_rng;
}
float rnd_unit() { return ((int32_t)(rnd() >> 8) - (1 << 23)) / (float)(1 << 23); }

/* f32 -> the dtype (round to nearest even, half.h's conversions), written at element i of p. */
void store(void *p, mlaf_dtype dt, size_t i, float f) { mlaf_store_f32(p, dt, (int64_t)i, f); }

struct Shape {
    const char *what;
    mlaf_dtype dt;
    int64_t T, K;
    mlaf_gemm_format fmt;
    mlaf_gemm_scale scale;
    int misalign; /* x rows one element off 16-byte alignment: the element path */
};

/* One call on backend b from x_h (row stride XS elements, `off` elements in); the data rows DS bytes
 * apart and the scales with ld; returns both buffers as the call left them (poisoned first). */
bool run_one(mlaf_backend b, const Shape &s, const std::vector<unsigned char> &x_h, int64_t XS, int64_t off,
             int64_t DS, mlaf_dtype sdt, const int64_t sh[2], int64_t ld, std::vector<unsigned char> &d_out,
             std::vector<unsigned char> &s_out, char *why, size_t cap) {
    mlaf_context *ctx = NULL;
    if (mlaf_context_create(&ctx, b) != MLAF_OK) {
        snprintf(why, cap, "no %s context", mlaf_backend_name(b));
        return false;
    }
    const size_t es = mlaf_dtype_size(s.dt), ses = mlaf_dtype_size(sdt);
    const size_t xb = x_h.size(), db = (size_t)(s.T * DS), sb = (size_t)(sh[0] * ld) * ses;
    void *x = NULL, *d = NULL, *sc = NULL;
    bool ok = mlaf_mem_alloc(b, &x, xb) == MLAF_OK && mlaf_mem_alloc(b, &d, db) == MLAF_OK &&
              mlaf_mem_alloc(b, &sc, sb) == MLAF_OK;
    d_out.assign(db, 0xA5);
    s_out.assign(sb, 0xA5);
    ok = ok && mlaf_mem_upload(b, x, x_h.data(), xb) == MLAF_OK && mlaf_mem_upload(b, d, d_out.data(), db) == MLAF_OK &&
         mlaf_mem_upload(b, sc, s_out.data(), sb) == MLAF_OK;
    mlaf_status st = ok ? MLAF_OK : MLAF_ERR_OUT_OF_MEMORY;
    if (ok) {
        mlaf_tensor tx = mlaf_tensor_2d((char *)x + off * (int64_t)es, s.dt, s.T, s.K, XS);
        mlaf_tensor td = mlaf_tensor_2d(d, MLAF_FP8_E4M3, s.T, s.K, DS), ts = mlaf_tensor_2d(sc, sdt, sh[0], sh[1], ld);
        const mlaf_gemm_out q = {s.fmt, s.scale, &td, &ts, 0.0f};
        st = mlaf_gemm_quant(ctx, &tx, &q);
        if (st == MLAF_OK) st = mlaf_context_sync(ctx);
        if (st == MLAF_OK && (mlaf_mem_download(b, d_out.data(), d, db) != MLAF_OK ||
                              mlaf_mem_download(b, s_out.data(), sc, sb) != MLAF_OK))
            st = MLAF_ERR_DEVICE;
    }
    if (st != MLAF_OK) snprintf(why, cap, "%s: %s: %s", mlaf_backend_name(b), mlaf_status_name(st), mlaf_context_last_error(ctx));
    mlaf_mem_free(b, x), mlaf_mem_free(b, d), mlaf_mem_free(b, sc);
    mlaf_context_free(ctx);
    return st == MLAF_OK;
}

void test_shapes() {
    static const Shape shapes[] = {
        {"rows past the grid's 65535", MLAF_BF16, 70001, 128, MLAF_GEMM_FP8_1X128_MN, MLAF_GEMM_SCALE_F32, 0},
        {"a row of 2^20 values", MLAF_F32, 3, (int64_t)1 << 20, MLAF_GEMM_FP8_1X128, MLAF_GEMM_SCALE_UE8M0, 0},
        {"partly idle last block", MLAF_BF16, 5, 7168, MLAF_GEMM_FP8_1X128_UE8M0, MLAF_GEMM_SCALE_UE8M0, 0},
        {"one mxfp8 group a row", MLAF_F16, 9, 32, MLAF_GEMM_MXFP8, MLAF_GEMM_SCALE_MX_FLOOR, 0},
        {"element path", MLAF_F32, 17, 1504, MLAF_GEMM_MXFP8, MLAF_GEMM_SCALE_MX_CEIL, 1},
        {"element path, many rows", MLAF_BF16, 4097, 2048, MLAF_GEMM_FP8_1X128_CM, MLAF_GEMM_SCALE_UE8M0, 1},
        {"f16 rows of 16384", MLAF_F16, 33, 16384, MLAF_GEMM_FP8_1X128_MN, MLAF_GEMM_SCALE_UE8M0, 0},
    };
    for (const Shape &s : shapes) {
        const size_t es = mlaf_dtype_size(s.dt);
        const int64_t off = s.misalign ? 1 : 0, XS = s.K + 8 + off, DS = s.K + 16;
        std::vector<unsigned char> x_h((size_t)(s.T * XS + 8) * es, 0);
        for (int64_t t = 0; t < s.T; t++)
            for (int64_t i = 0; i < s.K; i++) {
                float v = rnd_unit() * (t % 5 == 1 ? 900.0f : t % 5 == 2 ? 1e-3f : 3.0f);
                if (t % 11 == 3 && i % 37 == 4) v = NAN;
                if (t % 13 == 6 && i == s.K / 3) v = t % 2 ? INFINITY : -INFINITY;
                store(x_h.data(), s.dt, (size_t)(off + t * XS + i), v);
            }
        mlaf_dtype sdt;
        int64_t sh[2], min_ld;
        mlaf_gemm_scales_shape(s.fmt, s.T, s.K, &sdt, sh, &min_ld);
        const int64_t ld = min_ld + 4; /* a padding row (column) each side leaves alone */
        std::vector<unsigned char> dc, sc, dg, sg;
        char why[512] = "", name[256];
        snprintf(name, sizeof name, "GEMM_QUANT_LAUNCH(%s,T=%lld,K=%lld,dtype=%s,q=%s/%s)", s.what, (long long)s.T,
                 (long long)s.K, mlaf_dtype_name(s.dt), mlaf_gemm_format_name(s.fmt), mlaf_gemm_scale_name(s.scale));
        const bool ran = run_one(MLAF_BACKEND_CPU, s, x_h, XS, off, DS, sdt, sh, ld, dc, sc, why, sizeof why) &&
                         run_one(MLAF_BACKEND_CUDA, s, x_h, XS, off, DS, sdt, sh, ld, dg, sg, why, sizeof why);
        if (!ran) {
            tl_case(0, name, "%s", why);
            continue;
        }
        size_t first = 0;
        while (first < dc.size() && dc[first] == dg[first]) first++;
        size_t sfirst = 0;
        while (sfirst < sc.size() && sc[sfirst] == sg[sfirst]) sfirst++;
        tl_case(first == dc.size() && sfirst == sc.size(), name,
                "cuda and cpu bytes: data %s (first difference at byte %zu), scales %s (at byte %zu)",
                first == dc.size() ? "equal" : "DIFFER", first, sfirst == sc.size() ? "equal" : "DIFFER", sfirst);
    }
}

/* ---- PDL: rms_norm_quant -> gemm_quant --------------------------------------------------------------- */
constexpr int64_t kT = 3000, kK = 4096;

struct Chain {
    void *x = nullptr, *w = nullptr, *y = nullptr, *d = nullptr, *s = nullptr;
    int64_t ld = 0;
    std::vector<uint16_t> x_h, w_h;
    size_t sbytes() const { return (size_t)(kK / 128) * ld * 4; }
    bool alloc() {
        x_h.resize((size_t)(kT * kK)), w_h.resize(kK);
        for (auto &v : x_h) store(&v, MLAF_BF16, 0, 2.0f * rnd_unit());
        for (auto &v : w_h) store(&v, MLAF_BF16, 0, 1.0f + 0.25f * rnd_unit());
        ld = (kT + 3) / 4 * 4;
        return cudaMalloc(&x, kT * kK * 2) == cudaSuccess && cudaMalloc(&w, kK * 2) == cudaSuccess &&
               cudaMalloc(&y, kT * kK * 2) == cudaSuccess && cudaMalloc(&d, kT * kK) == cudaSuccess &&
               cudaMalloc(&s, sbytes()) == cudaSuccess;
    }
    bool reset() {
        return cudaMemcpy(x, x_h.data(), kT * kK * 2, cudaMemcpyHostToDevice) == cudaSuccess &&
               cudaMemcpy(w, w_h.data(), kK * 2, cudaMemcpyHostToDevice) == cudaSuccess &&
               cudaMemset(y, 0, kT * kK * 2) == cudaSuccess && cudaMemset(d, 0, kT * kK) == cudaSuccess &&
               cudaMemset(s, 0, sbytes()) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess;
    }
    /* three rounds, each op reading what the one before wrote: y = RMSNorm(x), q of y; x = RMSNorm(y),
     * q of x; y = RMSNorm(x), q of y */
    mlaf_status run(mlaf_context *ctx) const {
        mlaf_tensor tx = mlaf_tensor_2d(x, MLAF_BF16, kT, kK, kK), tw = mlaf_tensor_1d(w, MLAF_BF16, kK);
        mlaf_tensor ty = mlaf_tensor_2d(y, MLAF_BF16, kT, kK, kK), td = mlaf_tensor_2d(d, MLAF_U8, kT, kK, kK);
        mlaf_tensor ts = mlaf_tensor_2d(s, MLAF_F32, kK / 128, kT, ld);
        const mlaf_gemm_out q = {MLAF_GEMM_FP8_1X128_MN, MLAF_GEMM_SCALE_UE8M0, &td, &ts, 0.0f};
        const mlaf_rms_norm_quant_params p = {1e-6f};
        for (int r = 0; r < 3; r++) {
            mlaf_status st = mlaf_rms_norm_quant(ctx, &p, r == 1 ? &ty : &tx, NULL, &tw, r == 1 ? &tx : &ty, NULL);
            if (st == MLAF_OK) st = mlaf_gemm_quant(ctx, r == 1 ? &tx : &ty, &q);
            if (st != MLAF_OK) return st;
        }
        return MLAF_OK;
    }
    std::vector<unsigned char> state() const {
        std::vector<unsigned char> out((size_t)(2 * kT * kK * 2 + kT * kK) + sbytes());
        unsigned char *o = out.data();
        if (cudaMemcpy(o, x, kT * kK * 2, cudaMemcpyDeviceToHost) != cudaSuccess ||
            cudaMemcpy(o + kT * kK * 2, y, kT * kK * 2, cudaMemcpyDeviceToHost) != cudaSuccess ||
            cudaMemcpy(o + 2 * kT * kK * 2, d, kT * kK, cudaMemcpyDeviceToHost) != cudaSuccess ||
            cudaMemcpy(o + 2 * kT * kK * 2 + kT * kK, s, sbytes(), cudaMemcpyDeviceToHost) != cudaSuccess)
            out.clear();
        return out;
    }
    void release() {
        void *p[] = {x, w, y, d, s};
        for (void *a : p) cudaFree(a);
    }
};

void test_pdl() {
    int major = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
    if (major < 9) {
        tl_skip("GEMM_QUANT_PDL", "programmatic dependent launch needs sm_90");
        return;
    }
    Chain c;
    mlaf_context *ctx = tl_context(MLAF_BACKEND_CUDA);
    cudaStream_t stream;
    if (!ctx || !c.alloc() || cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
        tl_case(0, "GEMM_QUANT_PDL(setup)", "context, buffers or stream failed");
        mlaf_context_free(ctx);
        c.release();
        return;
    }
    mlaf_context_set_cuda_stream(ctx, stream);
    std::vector<unsigned char> want;
    for (int mode = 0; mode < 3; mode++) { /* off, on eagerly, on in a graph */
        const char *names[3] = {"off", "on,eager", "on,graph"};
        char name[96];
        snprintf(name, sizeof name, "GEMM_QUANT_PDL(%s,T=%lld,K=%lld)", names[mode], (long long)kT, (long long)kK);
        mlaf_status st = c.reset() ? mlaf_context_set_cuda_pdl(ctx, mode > 0) : MLAF_ERR_DEVICE;
        if (st == MLAF_OK && mode < 2) {
            st = c.run(ctx);
        } else if (st == MLAF_OK) {
            cudaGraph_t g = NULL;
            cudaGraphExec_t ge = NULL;
            if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) st = MLAF_ERR_DEVICE;
            if (st == MLAF_OK) st = c.run(ctx);
            if (cudaStreamEndCapture(stream, &g) != cudaSuccess && st == MLAF_OK) st = MLAF_ERR_DEVICE;
            if (st == MLAF_OK && (cudaGraphInstantiate(&ge, g, 0) != cudaSuccess || cudaGraphLaunch(ge, stream) != cudaSuccess))
                st = MLAF_ERR_DEVICE;
            if (ge) cudaGraphExecDestroy(ge);
            if (g) cudaGraphDestroy(g);
        }
        if (st == MLAF_OK && cudaStreamSynchronize(stream) != cudaSuccess) st = MLAF_ERR_DEVICE;
        std::vector<unsigned char> got = st == MLAF_OK ? c.state() : std::vector<unsigned char>();
        if (mode == 0) want = got;
        const bool same = !got.empty() && got == want;
        tl_case(st == MLAF_OK && same, name, "%s; every byte %s the run without PDL", mlaf_status_name(st),
                same ? "equals" : "DIFFERS from");
    }
    mlaf_context_free(ctx);
    cudaStreamDestroy(stream);
    c.release();
}

} // namespace

int main() {
    if (!tl_cuda()) return tl_finish();
    test_shapes();
    test_pdl();
    return tl_finish();
}
