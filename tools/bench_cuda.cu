/*
 * bench_cuda.cu — CUDA timing for `mlafuse bench` (extern "C"; only built with CUDA).
 *
 * Stream mode, for large T:
 *   1. warm-up: three calls, then synchronize;
 *   2. per sample: cudaMemsetAsync of a buffer of max(256 MB, 4 x L2), then a read of it,
 *      evicts the L2 and leaves no dirty line behind (it is
 *      enqueued before the start event, so it is not timed), then start event, one call,
 *      stop event; all samples are enqueued back to back and read after one synchronize;
 *   3. median and p10 / p90 / min / max of the event times.
 * Graph mode, for small T (and for every T with --graph): the calls of interest are launch
 *   bound, so 100 calls are captured in one CUDA graph and each sample times one replay;
 *   the per-call time is the replay time / 100. Inputs stay hot in L2 between the calls, as
 *   in a decoding step. A capture that fails (an op that synchronizes, allocates or leaves
 *   the stream) is reported, never hidden.
 * Copy reference: cudaMemcpyAsync device to device of 1 GB, bytes read + written / time.
 * Same-bytes copy: a cudaMemcpyAsync moving the op's own byte count (half read, half written),
 *   timed exactly like the op (same flush, same events, or the same graph), so a row shows
 *   what the copy engine path itself reaches at that size, ramp-up and tail included.
 * Kernel copy (stream mode): the same bytes moved by SM copy kernels instead of the copy
 *   engines, timed the same way; the faster of two (sm_90: a persistent ring of bulk copies,
 *   and a warp per 4224-byte chunk brought into shared memory by one bulk copy and stored by
 *   the lanes; the two fastest of the shapes dev/cuda/copy_ceiling --shapes measured; older
 *   GPUs: a grid of 16-byte loads then stores). A row's kernel copy is what a kernel that
 *   only moved the op's bytes, with no arithmetic, reaches at that size.
 * Errors come back as messages; nothing here exits.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cuda/cuda_common.cuh" /* the library's bulk-copy and mbarrier helpers */

static cudaStream_t g_stream = NULL;
static void *g_flush = NULL;
static size_t g_flush_bytes = 0;
static unsigned *g_sink = NULL;

/* Reads the flush buffer after it was written: the memset leaves ~60 MB of dirty lines in L2
 * whose write-back would otherwise land inside the timed call (measured: ~10 us per sample,
 * 5-8% of a 131072-token op). After this read L2 holds only clean, unrelated lines. */
__global__ void bcu_l2_clean_read(const uint4 *p, size_t n, unsigned *sink) {
    unsigned acc = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = p[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) *sink = acc; /* keeps the loads; practically never stores */
}
static char g_name[256] = "cuda";

static int fail(char *err, size_t cap, const char *what, cudaError_t e) {
    snprintf(err, cap, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    (void)cudaGetLastError();
    return -1;
}

#define CK(call)                                             \
    do {                                                     \
        cudaError_t e_ = (call);                             \
        if (e_ != cudaSuccess) return fail(err, cap, #call, e_); \
    } while (0)

extern "C" int bcu_setup(char *err, size_t cap) {
    int dev = 0;
    CK(cudaGetDevice(&dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    size_t mem_free = 0, mem_total = 0;
    CK(cudaMemGetInfo(&mem_free, &mem_total));
    snprintf(g_name, sizeof g_name, "%.160s (sm_%d%d, %d SMs, L2 %d MB, %.0f GB, device %d)", prop.name,
             prop.major, prop.minor, prop.multiProcessorCount, prop.l2CacheSize >> 20,
             (double)mem_total / (1 << 30), dev);
    /* A blocking stream: the synchronous cudaMemcpy of the upload / download helpers then
     * orders itself after the work queued here. */
    CK(cudaStreamCreate(&g_stream));
    g_flush_bytes = (size_t)4 * (size_t)prop.l2CacheSize;
    if (g_flush_bytes < ((size_t)256 << 20)) g_flush_bytes = (size_t)256 << 20;
    CK(cudaMalloc(&g_flush, g_flush_bytes));
    CK(cudaMalloc(&g_sink, sizeof(unsigned)));
    return 0;
}

extern "C" void bcu_teardown(void) {
    if (g_stream) (void)cudaStreamSynchronize(g_stream);
    if (g_flush) (void)cudaFree(g_flush);
    if (g_sink) (void)cudaFree(g_sink);
    g_sink = NULL;
    if (g_stream) (void)cudaStreamDestroy(g_stream);
    g_flush = NULL;
    g_stream = NULL;
    (void)cudaGetLastError();
}

extern "C" void *bcu_stream(void) { return (void *)g_stream; }
extern "C" const char *bcu_device_name(void) { return g_name; }

extern "C" int bcu_sync(char *err, size_t cap) {
    CK(cudaStreamSynchronize(g_stream));
    CK(cudaGetLastError());
    return 0;
}

/* Events for n samples; destroyed by free_events. */
static int make_events(cudaEvent_t **ev, int n, char *err, size_t cap) {
    *ev = (cudaEvent_t *)calloc((size_t)n * 2, sizeof(cudaEvent_t));
    if (!*ev) {
        snprintf(err, cap, "out of host memory");
        return -1;
    }
    for (int i = 0; i < 2 * n; i++) {
        cudaError_t e = cudaEventCreate(&(*ev)[i]);
        if (e != cudaSuccess) {
            for (int k = 0; k < i; k++) (void)cudaEventDestroy((*ev)[k]);
            free(*ev);
            *ev = NULL;
            return fail(err, cap, "cudaEventCreate", e);
        }
    }
    return 0;
}

static void free_events(cudaEvent_t *ev, int n) {
    if (!ev) return;
    for (int i = 0; i < 2 * n; i++) (void)cudaEventDestroy(ev[i]);
    free(ev);
}

/* Reads the n event pairs into us[] (divided by calls). */
static int read_events(cudaEvent_t *ev, int n, int calls, double *us, char *err, size_t cap) {
    CK(cudaStreamSynchronize(g_stream));
    for (int i = 0; i < n; i++) {
        float ms = 0.0f;
        CK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
        us[i] = (double)ms * 1e3 / calls;
    }
    return 0;
}

static int time_stream(bench_call_fn fn, void *arg, int reps, double *us, char *err, size_t cap) {
    for (int w = 0; w < 3; w++)
        if (fn(arg, 0, err, cap)) return -1;
    CK(cudaStreamSynchronize(g_stream));
    CK(cudaGetLastError());
    cudaEvent_t *ev = NULL;
    if (make_events(&ev, reps, err, cap)) return -1;
    int rc = 0;
    for (int i = 0; i < reps && rc == 0; i++) {
        cudaError_t e = cudaMemsetAsync(g_flush, i & 0xff, g_flush_bytes, g_stream);
        if (e == cudaSuccess) {
            bcu_l2_clean_read<<<1024, 256, 0, g_stream>>>((const uint4 *)g_flush, g_flush_bytes / 16, g_sink);
            e = cudaGetLastError();
        }
        if (e == cudaSuccess) e = cudaEventRecord(ev[2 * i], g_stream);
        if (e != cudaSuccess) {
            rc = fail(err, cap, "flush / event record", e);
            break;
        }
        if (fn(arg, 0, err, cap)) {
            rc = -1;
            break;
        }
        e = cudaEventRecord(ev[2 * i + 1], g_stream);
        if (e != cudaSuccess) rc = fail(err, cap, "cudaEventRecord", e);
    }
    if (rc == 0) rc = read_events(ev, reps, 1, us, err, cap);
    else (void)cudaStreamSynchronize(g_stream);
    free_events(ev, reps);
    return rc;
}

static int time_graph(bench_call_fn fn, void *arg, int reps, int calls, double *us, char *err,
                      size_t cap) {
    /* One eager call first: a call that fails validation is reported as such, not as a
     * capture failure. */
    if (fn(arg, 0, err, cap)) return -1;
    CK(cudaStreamSynchronize(g_stream));
    CK(cudaGetLastError());
    CK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal));
    int bad = 0;
    for (int c = 0; c < calls && !bad; c++) bad = fn(arg, 0, err, cap) != 0;
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(g_stream, &graph);
    if (bad || e != cudaSuccess) {
        if (graph) (void)cudaGraphDestroy(graph);
        (void)cudaGetLastError();
        if (!bad)
            return fail(err, cap,
                        "CUDA graph capture (the call synchronized, allocated or used another "
                        "stream while captured)",
                        e);
        size_t len = strlen(err);
        snprintf(err + len, cap - len, " (during CUDA graph capture)");
        return -1;
    }
    cudaGraphExec_t exec = NULL;
    e = cudaGraphInstantiate(&exec, graph, 0);
    (void)cudaGraphDestroy(graph);
    if (e != cudaSuccess) return fail(err, cap, "cudaGraphInstantiate", e);
    int rc = 0;
    cudaEvent_t *ev = NULL;
    for (int w = 0; w < 2 && rc == 0; w++) {
        e = cudaGraphLaunch(exec, g_stream);
        if (e != cudaSuccess) rc = fail(err, cap, "cudaGraphLaunch", e);
    }
    if (rc == 0) {
        e = cudaStreamSynchronize(g_stream);
        if (e != cudaSuccess) rc = fail(err, cap, "graph warm-up", e);
    }
    if (rc == 0) rc = make_events(&ev, reps, err, cap);
    for (int i = 0; i < reps && rc == 0; i++) {
        e = cudaEventRecord(ev[2 * i], g_stream);
        if (e == cudaSuccess) e = cudaGraphLaunch(exec, g_stream);
        if (e == cudaSuccess) e = cudaEventRecord(ev[2 * i + 1], g_stream);
        if (e != cudaSuccess) rc = fail(err, cap, "graph replay", e);
    }
    if (rc == 0) rc = read_events(ev, reps, calls, us, err, cap);
    else (void)cudaStreamSynchronize(g_stream);
    free_events(ev, reps);
    (void)cudaGraphExecDestroy(exec);
    return rc;
}

extern "C" int bcu_time(bench_call_fn fn, void *arg, int reps, int graph_calls, bench_stats *out,
                        char *err, size_t cap) {
    if (!g_stream) {
        snprintf(err, cap, "bcu_time before bcu_setup");
        return -1;
    }
    if (reps < 1) reps = 1;
    double *us = (double *)malloc(sizeof(double) * (size_t)reps);
    if (!us) {
        snprintf(err, cap, "out of host memory");
        return -1;
    }
    int rc = graph_calls > 0 ? time_graph(fn, arg, reps, graph_calls, us, err, cap)
                             : time_stream(fn, arg, reps, us, err, cap);
    if (rc == 0) bench_stats_from(us, reps, graph_calls > 0 ? graph_calls : 1, out);
    free(us);
    return rc;
}

extern "C" int bcu_copy_gbps(size_t bytes, int reps, double *gbps, char *err, size_t cap) {
    *gbps = 0.0;
    if (reps < 1) reps = 1;
    void *a = NULL, *b = NULL;
    cudaError_t e = cudaMalloc(&a, bytes);
    if (e == cudaSuccess) e = cudaMalloc(&b, bytes);
    if (e != cudaSuccess) {
        if (a) (void)cudaFree(a);
        return fail(err, cap, "cudaMalloc of the copy buffers", e);
    }
    double *us = (double *)malloc(sizeof(double) * (size_t)reps);
    cudaEvent_t *ev = NULL;
    int rc = us ? 0 : -1;
    if (!us) snprintf(err, cap, "out of host memory");
    if (rc == 0) {
        e = cudaMemsetAsync(a, 1, bytes, g_stream);
        for (int w = 0; w < 2 && e == cudaSuccess; w++)
            e = cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, g_stream);
        if (e != cudaSuccess) rc = fail(err, cap, "copy warm-up", e);
    }
    if (rc == 0) rc = make_events(&ev, reps, err, cap);
    for (int i = 0; i < reps && rc == 0; i++) {
        e = cudaEventRecord(ev[2 * i], g_stream);
        if (e == cudaSuccess) e = cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, g_stream);
        if (e == cudaSuccess) e = cudaEventRecord(ev[2 * i + 1], g_stream);
        if (e != cudaSuccess) rc = fail(err, cap, "cudaMemcpyAsync", e);
    }
    if (rc == 0) rc = read_events(ev, reps, 1, us, err, cap);
    else (void)cudaStreamSynchronize(g_stream);
    if (rc == 0) {
        bench_stats st;
        bench_stats_from(us, reps, 1, &st);
        if (st.median_us > 0) *gbps = 2.0 * (double)bytes / (st.median_us * 1e3);
    }
    free_events(ev, reps);
    free(us);
    (void)cudaFree(a);
    (void)cudaFree(b);
    return rc;
}

/* ---- same-bytes copy ----------------------------------------------------------------------- */
typedef struct bcu_copy_arg {
    void *dst;
    const void *src;
    size_t n;
} bcu_copy_arg;

static int bcu_copy_call(void *arg, int set, char *err, size_t cap) {
    (void)set;
    const bcu_copy_arg *c = (const bcu_copy_arg *)arg;
    CK(cudaMemcpyAsync(c->dst, c->src, c->n, cudaMemcpyDeviceToDevice, g_stream));
    return 0;
}

/* ---- kernel copy ------------------------------------------------------------------------- */
#define BCU_RING_STAGES 24
#define BCU_RING_CHUNK 2688 /* bytes; a multiple of 16 */
#define BCU_WARP_CHUNK 4224

/* One thread per CTA streams chunks (grid-stride) through a ring of shared-memory stages: bulk
 * load on the stage's mbarrier, bulk store from the stage; a stage is loaded again once the
 * store issued before the latest one has read it. */
__global__ void bcu_kcopy_ring(const unsigned char *src, unsigned char *dst, size_t nbytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) unsigned char bcu_ring[];
    __shared__ __align__(8) uint64_t bar[BCU_RING_STAGES];
    if (threadIdx.x != 0) return;
    const uint32_t r0 = (uint32_t)__cvta_generic_to_shared(bcu_ring), b0 = (uint32_t)__cvta_generic_to_shared(bar);
    for (int i = 0; i < BCU_RING_STAGES; i++) mlaf_bar_init(b0 + 8 * i, 1);
    const size_t nch = (nbytes + BCU_RING_CHUNK - 1) / BCU_RING_CHUNK;
    auto bytes_of = [&](size_t c) { return (uint32_t)(c + 1 < nch ? BCU_RING_CHUNK : nbytes - c * BCU_RING_CHUNK); };
    auto load = [&](size_t k) { /* this CTA's chunk k into stage k % stages */
        const size_t c = blockIdx.x + k * gridDim.x;
        if (c >= nch) return;
        const uint32_t st = (uint32_t)(k % BCU_RING_STAGES);
        mlaf_bulk_load(r0 + st * BCU_RING_CHUNK, src + c * BCU_RING_CHUNK, bytes_of(c), b0 + 8 * st);
    };
    for (size_t k = 0; k < BCU_RING_STAGES; k++) load(k);
    for (size_t k = 0;; k++) {
        const size_t c = blockIdx.x + k * gridDim.x;
        if (c >= nch) break;
        const uint32_t st = (uint32_t)(k % BCU_RING_STAGES);
        mlaf_bar_wait(b0 + 8 * st, (uint32_t)((k / BCU_RING_STAGES) & 1));
        mlaf_bulk_store(dst + c * BCU_RING_CHUNK, r0 + st * BCU_RING_CHUNK, bytes_of(c));
        mlaf_bulk_commit();
        if (k >= 1) {
            mlaf_bulk_wait_read<1>();
            load(k - 1 + BCU_RING_STAGES);
        }
    }
    mlaf_bulk_wait_all();
#endif
}

/* A warp per chunk: lane 0 brings it into the warp's shared-memory slot with one bulk copy,
 * then the lanes store it with 16-byte streaming stores (4 warps per block). */
__global__ void __launch_bounds__(128) bcu_kcopy_warp(const unsigned char *src, unsigned char *dst, size_t nbytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) unsigned char bcu_slots[];
    __shared__ __align__(8) uint64_t bar[4];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const size_t c = (size_t)blockIdx.x * 4 + w, nch = (nbytes + BCU_WARP_CHUNK - 1) / BCU_WARP_CHUNK;
    if (c >= nch) return;
    const uint32_t bytes = (uint32_t)(c + 1 < nch ? BCU_WARP_CHUNK : nbytes - c * BCU_WARP_CHUNK);
    const uint32_t sl = (uint32_t)__cvta_generic_to_shared(bcu_slots + (size_t)w * BCU_WARP_CHUNK);
    const uint32_t b = (uint32_t)__cvta_generic_to_shared(bar + w);
    if (lane == 0) {
        mlaf_bar_init(b, 1);
        mlaf_bulk_load(sl, src + c * BCU_WARP_CHUNK, bytes, b);
    }
    __syncwarp();
    mlaf_bar_wait(b, 0);
    const uint4 *s4 = reinterpret_cast<const uint4 *>(bcu_slots + (size_t)w * BCU_WARP_CHUNK);
    uint4 *d4 = reinterpret_cast<uint4 *>(dst + c * BCU_WARP_CHUNK);
    for (uint32_t i = lane; i < bytes / 16; i += 32) __stcg(d4 + i, s4[i]);
#endif
}

/* Before sm_90: 2 vectors of 16 bytes per thread, both loads before the stores. */
__global__ void bcu_kcopy_flat(const uint4 *__restrict__ s, uint4 *__restrict__ d, size_t n) {
    const size_t base = (size_t)blockIdx.x * blockDim.x * 2 + threadIdx.x;
    uint4 v[2];
    for (int k = 0; k < 2; k++)
        if (base + k * blockDim.x < n) v[k] = __ldcg(s + base + k * blockDim.x);
    for (int k = 0; k < 2; k++)
        if (base + k * blockDim.x < n) __stcg(d + base + k * blockDim.x, v[k]);
}

typedef struct bcu_kcopy_arg {
    void *dst;
    const void *src;
    size_t n;
    int kind; /* 0 ring, 1 warp, 2 flat */
    int sms;
} bcu_kcopy_arg;

static int bcu_kcopy_call(void *arg, int set, char *err, size_t cap) {
    (void)set;
    const bcu_kcopy_arg *c = (const bcu_kcopy_arg *)arg;
    const unsigned char *s = (const unsigned char *)c->src;
    unsigned char *d = (unsigned char *)c->dst;
    if (c->kind == 0) {
        bcu_kcopy_ring<<<2 * c->sms, 32, BCU_RING_STAGES * BCU_RING_CHUNK, g_stream>>>(s, d, c->n);
    } else if (c->kind == 1) {
        const size_t nch = (c->n + BCU_WARP_CHUNK - 1) / BCU_WARP_CHUNK;
        bcu_kcopy_warp<<<(unsigned)((nch + 3) / 4), 128, 4 * BCU_WARP_CHUNK, g_stream>>>(s, d, c->n);
    } else {
        const size_t n16 = c->n / 16;
        bcu_kcopy_flat<<<(unsigned)((n16 + 511) / 512), 256, 0, g_stream>>>((const uint4 *)s, (uint4 *)d, n16);
    }
    CK(cudaGetLastError());
    return 0;
}

/* Source and destination of a copy of bytes / 2 (16-byte multiple, at least 16), the source
 * filled with `fill`, for the same-bytes and kernel copies. */
static int bcu_copy_buffers(double bytes, int fill, void **a, void **b, size_t *n, char *err, size_t cap) {
    *a = *b = NULL;
    *n = (size_t)(bytes / 2.0);
    *n = (*n + 15) / 16 * 16;
    if (*n < 16) *n = 16;
    cudaError_t e = cudaMalloc(a, *n);
    if (e == cudaSuccess) e = cudaMalloc(b, *n);
    if (e == cudaSuccess) e = cudaMemsetAsync(*a, fill, *n, g_stream);
    if (e != cudaSuccess) {
        if (*a) (void)cudaFree(*a);
        if (*b) (void)cudaFree(*b);
        *a = *b = NULL;
        return fail(err, cap, "copy buffers", e);
    }
    return 0;
}

/* Times one copy kernel in stream mode into *out when it is the first or faster than *out. */
static int bcu_time_faster(bench_call_fn fn, void *arg, int reps, int first, bench_stats *out, char *err, size_t cap) {
    bench_stats st;
    if (bcu_time(fn, arg, reps, 0, &st, err, cap)) return -1;
    if (first || st.median_us < out->median_us) *out = st;
    return 0;
}

extern "C" int bcu_kcopy_time(double bytes, int reps, bench_stats *out, char *err, size_t cap) {
    if (!g_stream) {
        snprintf(err, cap, "bcu_kcopy_time before bcu_setup");
        return -1;
    }
    int dev = 0, major = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    void *a, *b;
    size_t n;
    if (bcu_copy_buffers(bytes, 5, &a, &b, &n, err, cap)) return -1;
    cudaError_t e = cudaSuccess;
    if (major >= 9)
        e = cudaFuncSetAttribute(bcu_kcopy_ring, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 BCU_RING_STAGES * BCU_RING_CHUNK);
    int rc = 0;
    if (e != cudaSuccess) {
        rc = fail(err, cap, "kernel copy shared memory", e);
    } else {
        /* the faster of the kinds this GPU has; each checked once against its source */
        const int kinds[2] = {major >= 9 ? 0 : 2, major >= 9 ? 1 : 2};
        const int nk = major >= 9 ? 2 : 1;
        for (int i = 0; i < nk && rc == 0; i++) {
            bcu_kcopy_arg c = {b, a, n, kinds[i], sms};
            e = cudaMemsetAsync(b, 0, n, g_stream);
            if (e != cudaSuccess) {
                rc = fail(err, cap, "kernel copy check", e);
                break;
            }
            if (bcu_kcopy_call(&c, 0, err, cap)) {
                rc = -1;
                break;
            }
            /* check: the first and last 4 KB and one spot in the middle */
            const size_t probe = n < 4096 ? n : 4096;
            const size_t at[3] = {0, (n / 2) / 16 * 16 < n - probe ? (n / 2) / 16 * 16 : n - probe, n - probe};
            for (int k = 0; k < 3 && rc == 0; k++) {
                unsigned char *hb = (unsigned char *)malloc(probe);
                if (!hb) {
                    snprintf(err, cap, "out of host memory");
                    rc = -1;
                    break;
                }
                e = cudaMemcpy(hb, (unsigned char *)b + at[k], probe, cudaMemcpyDeviceToHost);
                int bad = e != cudaSuccess;
                for (size_t j = 0; j < probe && !bad; j++) bad = hb[j] != 5;
                free(hb);
                if (bad) {
                    snprintf(err, cap, "kernel copy %d did not copy its bytes", kinds[i]);
                    rc = -1;
                }
            }
            if (rc == 0) rc = bcu_time_faster(bcu_kcopy_call, &c, reps, i == 0, out, err, cap);
        }
    }
    (void)cudaStreamSynchronize(g_stream);
    (void)cudaFree(a);
    (void)cudaFree(b);
    return rc;
}

/* ---- strided piece copy (rope_q's ceiling) ----------------------------------------------- */
/* n pieces of u 16-byte units, piece i at byte i * pitch + off of both buffers; U units per thread
 * (loads first, then stores). */
template <int U>
__global__ void __launch_bounds__(256) bcu_piece_copy(const uint4 *__restrict__ s, uint4 *__restrict__ d, int64_t n,
                                                      int64_t u, int64_t pitch16, int64_t off16) {
    const int64_t total = n * u, first = ((int64_t)blockIdx.x * 256 + threadIdx.x) * U;
    uint4 v[U];
    int64_t at[U];
#pragma unroll
    for (int k = 0; k < U; k++) {
        const int64_t i = first + k;
        at[k] = i < total ? (i / u) * pitch16 + off16 + i % u : -1;
        if (at[k] >= 0) v[k] = __ldcs(s + at[k]);
    }
#pragma unroll
    for (int k = 0; k < U; k++)
        if (at[k] >= 0) __stcs(d + at[k], v[k]);
}

typedef struct bcu_piece_arg {
    const uint4 *src;
    uint4 *dst;
    int64_t n, u, pitch16, off16;
    int kind; /* units per thread: 1 or 4 */
} bcu_piece_arg;

static int bcu_piece_call(void *arg, int set, char *err, size_t cap) {
    (void)set;
    const bcu_piece_arg *c = (const bcu_piece_arg *)arg;
    const int U = c->kind;
    const int64_t blocks = (c->n * c->u + 256 * U - 1) / (256 * U);
    if (U == 4)
        bcu_piece_copy<4><<<(unsigned)blocks, 256, 0, g_stream>>>(c->src, c->dst, c->n, c->u, c->pitch16, c->off16);
    else
        bcu_piece_copy<1><<<(unsigned)blocks, 256, 0, g_stream>>>(c->src, c->dst, c->n, c->u, c->pitch16, c->off16);
    CK(cudaGetLastError());
    return 0;
}

extern "C" int bcu_piece_copy_time(int64_t n, int64_t piece_bytes, int64_t pitch, int64_t off, int reps,
                                   bench_stats *out, char *err, size_t cap) {
    if (!g_stream) {
        snprintf(err, cap, "bcu_piece_copy_time before bcu_setup");
        return -1;
    }
    if (n <= 0 || piece_bytes <= 0 || piece_bytes % 16 || pitch % 16 || off % 16 || off + piece_bytes > pitch) {
        snprintf(err, cap, "piece copy: pieces of %lld bytes at %lld in rows of %lld: not in 16-byte units",
                 (long long)piece_bytes, (long long)off, (long long)pitch);
        return -1;
    }
    const size_t nbytes = (size_t)(n * pitch);
    void *a = NULL, *b = NULL;
    cudaError_t e = cudaMalloc(&a, nbytes);
    if (e == cudaSuccess) e = cudaMalloc(&b, nbytes);
    if (e == cudaSuccess) e = cudaMemsetAsync(a, 5, nbytes, g_stream);
    if (e != cudaSuccess) {
        if (a) (void)cudaFree(a);
        if (b) (void)cudaFree(b);
        return fail(err, cap, "piece copy buffers", e);
    }
    int rc = 0;
    const int kinds[2] = {1, 4};
    for (int i = 0; i < 2 && rc == 0; i++) {
        bcu_piece_arg c = {(const uint4 *)a, (uint4 *)b, n, piece_bytes / 16, pitch / 16, off / 16, kinds[i]};
        e = cudaMemsetAsync(b, 0, nbytes, g_stream);
        if (e != cudaSuccess) {
            rc = fail(err, cap, "piece copy check", e);
            break;
        }
        if (bcu_piece_call(&c, 0, err, cap)) {
            rc = -1;
            break;
        }
        /* check: the first and the last row, each byte inside a piece 5, outside 0 */
        unsigned char *hb = (unsigned char *)malloc((size_t)pitch);
        if (!hb) {
            snprintf(err, cap, "out of host memory");
            rc = -1;
            break;
        }
        for (int k = 0; k < 2 && rc == 0; k++) {
            const int64_t row = k ? n - 1 : 0;
            e = cudaMemcpy(hb, (unsigned char *)b + row * pitch, (size_t)pitch, cudaMemcpyDeviceToHost);
            int bad = e != cudaSuccess;
            for (int64_t j = 0; j < pitch && !bad; j++) bad = hb[j] != (j >= off && j < off + piece_bytes ? 5 : 0);
            if (bad) {
                snprintf(err, cap, "piece copy (%d units per thread) did not copy its pieces", kinds[i]);
                rc = -1;
            }
        }
        free(hb);
        if (rc == 0) rc = bcu_time_faster(bcu_piece_call, &c, reps, i == 0, out, err, cap);
    }
    (void)cudaStreamSynchronize(g_stream);
    (void)cudaFree(a);
    (void)cudaFree(b);
    return rc;
}

extern "C" int bcu_copy_time(double bytes, int reps, int graph_calls, bench_stats *out, char *err,
                             size_t cap) {
    if (!g_stream) {
        snprintf(err, cap, "bcu_copy_time before bcu_setup");
        return -1;
    }
    void *a, *b;
    size_t n;
    if (bcu_copy_buffers(bytes, 3, &a, &b, &n, err, cap)) return -1;
    bcu_copy_arg c = {b, a, n};
    const int rc = bcu_time(bcu_copy_call, &c, reps, graph_calls, out, err, cap);
    (void)cudaStreamSynchronize(g_stream);
    (void)cudaFree(a);
    (void)cudaFree(b);
    return rc;
}

/* The text of a blg_* baseline's error code (a cudaError_t). */
extern "C" const char *blg_error_string(int code) {
    return cudaGetErrorString(static_cast<cudaError_t>(code));
}
