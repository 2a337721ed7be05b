/*
 * common.cuh — the chores every dev/cuda program shares: checked CUDA calls, bf16 on the host,
 * seeded random fill, the float64 reference of one split_qk_norm row, error in bf16 ulps,
 * timing (CUDA events, median; CUDA-graph replay for small T), the same-run device-to-device
 * copy bandwidth, and buffer rotation so that every timed call reads data that is not in L2.
 *
 * These are experiments, not the library: errors exit() here.
 */
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#define CK(x)                                                                              \
    do {                                                                                   \
        cudaError_t e_ = (x);                                                              \
        if (e_ != cudaSuccess) {                                                           \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

/* Validation failures so far; every program exits 1 if any. */
static int dev_failures = 0;

/* Model row shapes (docs/models.md). */
struct dev_shape {
    const char *name;
    int Q, C, R;
    float eps_q, eps_kv;
    int H, nope; /* q heads and qk_nope_head_dim, for rope_q */
};
static const dev_shape dev_shapes[] = {
    {"glm-4.7-flash", 768, 512, 64, 1e-5f, 1e-5f, 20, 192},
    {"deepseek-v3", 1536, 512, 64, 1e-6f, 1e-6f, 128, 128},
};

/* ---- bf16 on the host (round to nearest even) ------------------------------------------ */
static inline float bf2f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* ---- random ------------------------------------------------------------------------------ */
struct dev_rng {
    uint64_t s;
    explicit dev_rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
    uint64_t next() {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        return s;
    }
    double uniform() { return (double)(next() >> 11) * (1.0 / 9007199254740992.0); }
    double normal() {
        double u = uniform(), v = uniform();
        if (u < 1e-300) u = 1e-300;
        return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
    }
};
static inline void fill_bf16(std::vector<uint16_t> &v, dev_rng &r, double mean, double sd) {
    for (auto &x : v) x = f2bf((float)(mean + sd * r.normal()));
}

/* ---- reference --------------------------------------------------------------------------- */
/* One latent row -> [q | k_nope | k_pe] in float64, unrounded (k_pe: the input values). */
static inline void ref_split_row(const uint16_t *L, const dev_shape &s, const uint16_t *wq,
                          const uint16_t *wkv, double *out) {
    double sq = 0, skv = 0;
    for (int i = 0; i < s.Q; i++) sq += (double)bf2f(L[i]) * bf2f(L[i]);
    for (int j = 0; j < s.C; j++) skv += (double)bf2f(L[s.Q + j]) * bf2f(L[s.Q + j]);
    double rq = s.Q ? 1.0 / sqrt(sq / s.Q + s.eps_q) : 0, rkv = 1.0 / sqrt(skv / s.C + s.eps_kv);
    for (int i = 0; i < s.Q; i++) out[i] = bf2f(L[i]) * rq * bf2f(wq[i]);
    for (int j = 0; j < s.C; j++) out[s.Q + j] = bf2f(L[s.Q + j]) * rkv * bf2f(wkv[j]);
    for (int r = 0; r < s.R; r++) out[s.Q + s.C + r] = bf2f(L[s.Q + s.C + r]);
}

/* |got - ref| in units in the last place of bf16 at ref. */
static inline double bf16_ulps(uint16_t got, double ref) {
    double g = bf2f(got);
    if (isnan(g) || isnan(ref)) return isnan(g) && isnan(ref) ? 0 : INFINITY;
    double a = fabs(ref);
    int e;
    frexp(a > 1e-30 ? a : 1e-30, &e); /* a in [2^(e-1), 2^e) */
    double ulp = ldexp(1.0, e - 1 - 7);
    return fabs(g - ref) / ulp;
}

/* The rotation exactly as the library does it (separate fp32 products, one add/subtract). */
static inline void ref_rope_pair(float x0, float x1, float c, float s, float *y0, float *y1) {
    float a = x0 * c, b = x1 * s, d = x1 * c, e = x0 * s;
    *y0 = a - b;
    *y1 = d + e;
}
static inline void make_cos_sin(std::vector<float> &cs, int max_pos, int R) {
    cs.resize((size_t)max_pos * R);
    for (int p = 0; p < max_pos; p++)
        for (int i = 0; i < R / 2; i++) {
            double th = p * pow(10000.0, -2.0 * i / R);
            cs[(size_t)p * R + i] = (float)cos(th);
            cs[(size_t)p * R + R / 2 + i] = (float)sin(th);
        }
}

__global__ void dev_fill_bf16_kernel(__nv_bfloat16 *p, size_t n, uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
        h ^= h >> 31, h *= 0xBF58476D1CE4E5B9ull, h ^= h >> 29;
        p[i] = __float2bfloat16_rn(((float)(h & 0xffff) - 32768.0f) / 16384.0f);
    }
}

/* Fills n bf16 values on the device with a hash of the index (uniform in [-2, 2)). */
static inline void dev_fill_bf16(__nv_bfloat16 *p, size_t n, uint64_t seed = 42) {
    dev_fill_bf16_kernel<<<1024, 256>>>(p, n, seed);
    CK(cudaDeviceSynchronize());
}

/* ---- timing ------------------------------------------------------------------------------ */
/* Median time in microseconds of launch(i), i = 0.., timed one call at a time with events. */
struct no_prep {
    void operator()(int) const {}
};
/* prep(i), if given, runs before sample i's start event (untimed), e.g. an L2 flush. */
template <class F, class P = no_prep> static double time_us(F launch, int iters = 25, int warm = 4, P prep = P()) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < warm; i++) launch(i);
    CK(cudaDeviceSynchronize());
    std::vector<float> ms(iters);
    for (int i = 0; i < iters; i++) {
        prep(i);
        CK(cudaEventRecord(a));
        launch(warm + i);
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&ms[i], a, b));
    }
    CK(cudaGetLastError());
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    std::sort(ms.begin(), ms.end());
    return 1000.0 * ms[iters / 2];
}

/* The bench's L2 flush, leaving L2 clean: a memset of 256 MB, then a read pass over it (the
 * memset alone leaves ~one L2 of dirty lines to be written back during the timed call). */
__global__ void dev_clean_read(const uint4 *p, size_t n, unsigned *sink) {
    unsigned acc = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = p[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) *sink = acc;
}

struct flusher {
    void *buf = nullptr;
    unsigned *sink = nullptr;
    size_t bytes = (size_t)256 << 20;
    flusher() {
        CK(cudaMalloc(&buf, bytes));
        CK(cudaMalloc(&sink, 4));
    }
    ~flusher() {
        CK(cudaFree(buf));
        CK(cudaFree(sink));
    }
    void operator()(int i) const {
        CK(cudaMemsetAsync(buf, i & 0xff, bytes));
        dev_clean_read<<<1024, 256>>>((const uint4 *)buf, bytes / 16, sink);
    }
};

/* Median time (us) of launch() with L2 flushed (clean) before each sample, as mlafuse bench. */
template <class F> static double flushed_us(const flusher &fl, F launch, int iters = 30) {
    return time_us([&](int) { launch(); }, iters, 3, [&](int i) { fl(i); });
}

/* Per-call time in microseconds under CUDA-graph replay: n calls captured into one graph,
 * replayed several times; the median replay divided by n. launch(stream, i) must enqueue on
 * the given stream. */
template <class F> static double graph_us(F launch, int n = 100, int reps = 15) {
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < n; i++) launch(st, i);
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaStreamSynchronize(st));
    std::vector<float> ms(reps);
    for (int r = 0; r < reps; r++) {
        CK(cudaEventRecord(a, st));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&ms[r], a, b));
    }
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    CK(cudaStreamDestroy(st));
    std::sort(ms.begin(), ms.end());
    return 1000.0 * ms[reps / 2] / n;
}

/* Device-to-device copy bandwidth (bytes read + written per second, GB/s) on a 512 MB copy,
 * measured in this run: the yardstick every table reports against. */
static inline double copy_gbps() {
    const size_t n = (size_t)512 << 20;
    void *src, *dst;
    CK(cudaMalloc(&src, n));
    CK(cudaMalloc(&dst, n));
    CK(cudaMemset(src, 1, n));
    double us = time_us([&](int) { CK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice)); }, 15, 3);
    CK(cudaFree(src));
    CK(cudaFree(dst));
    return 2.0 * n / (us * 1e-6) / 1e9;
}

/* How many copies of a working set of `bytes` to rotate through so that the data of one call
 * has left the 50-60 MB L2 before it is used again. */
static inline int rotations(size_t bytes) {
    const size_t target = (size_t)200 << 20;
    size_t n = (target + bytes - 1) / bytes;
    return (int)(n < 1 ? 1 : n > 64 ? 64 : n);
}

static inline int sm_count() {
    int dev, n;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
}

static inline void print_device() {
    int dev;
    cudaDeviceProp p;
    CK(cudaGetDevice(&dev));
    CK(cudaGetDeviceProperties(&p, dev));
    printf("device: %s, %d SMs, L2 %d MB\n", p.name, p.multiProcessorCount, p.l2CacheSize >> 20);
}
