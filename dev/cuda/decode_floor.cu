/*
 * decode_floor.cu — what a decode-size call (T = 1) costs before any arithmetic: the per-call
 * time of 100 launches in one CUDA graph for kernels that do almost nothing, so the row
 * kernels' T = 1 figures can be read against the floor of the machine:
 *   empty       a kernel that returns (1 x 32, 2 x 192, 4 x 128 threads; 64 B and 512 B of
 *               parameters)
 *   load1       one load of a hot (L2) word, one store
 *   load2       a dependent pair (an index, then a table row at that index: the position ->
 *               cos / sin chain of mla_kv_cache), one store
 *   load3       three dependent loads (what a chain with one more hop costs)
 *   row         one 192-thread block: 16-byte loads of a 1536-value bf16 row, a block sum on a
 *               named barrier, one scaled store per thread (a q part of split_qk_norm)
 *   fill        a [1, 2048] int32 row set to -1 by one warp (4-byte and 16-byte stores) and by
 *               one block of 192 threads (16-byte stores): the DSA top-k fill
 * each without and with programmatic dependent launch (the kernel waits on griddepcontrol.wait
 * first, as the library's kernels do). Nothing here is checked but the stores' values.
 *   decode_floor [--reps N]
 */
#include "common.cuh"

struct p64 {
    const int *idx;
    const float *tab;
    float *out;
    int64_t pad[5];
};
struct p512 {
    const int *idx;
    const float *tab;
    float *out;
    int64_t pad[61];
};

__device__ __forceinline__ void pdl_wait() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

template <class P> __global__ void k_empty(const P p) {
    pdl_wait();
    if (threadIdx.x == 1000) p.out[0] = 0.0f;
}
template <class P> __global__ void k_load1(const P p) {
    pdl_wait();
    if (threadIdx.x == 0) p.out[blockIdx.x] = __ldcg(p.tab + 3);
}
template <class P> __global__ void k_load2(const P p) {
    pdl_wait();
    if (threadIdx.x < 32) p.out[threadIdx.x] = __ldg(p.tab + __ldcg(p.idx) * 64 + threadIdx.x);
}
template <class P> __global__ void k_load3(const P p) {
    pdl_wait();
    if (threadIdx.x < 32) {
        const int i = __ldcg(p.idx);
        const int j = __ldcg(p.idx + 1 + i);
        p.out[threadIdx.x] = __ldg(p.tab + j * 64 + threadIdx.x);
    }
}
__global__ void k_row(const uint4 *x, const uint4 *w, uint4 *y) {
    pdl_wait();
    __shared__ float red[8];
    const int t = threadIdx.x;
    const uint4 v = __ldcg(x + t), wv = __ldg(w + t);
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&v);
    float s = 0.0f;
    for (int k = 0; k < 4; k++) {
        const float2 f = __bfloat1622float2(h[k]);
        s += f.x * f.x + f.y * f.y;
    }
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((t & 31) == 0) red[t >> 5] = s;
    __syncthreads();
    float tot = 0.0f;
    for (int k = 0; k < (int)(blockDim.x >> 5); k++) tot += red[k];
    const float r = rsqrtf(tot / 1536.0f + 1e-6f);
    uint4 o;
    __nv_bfloat162 *oh = reinterpret_cast<__nv_bfloat162 *>(&o);
    const __nv_bfloat162 *wh = reinterpret_cast<const __nv_bfloat162 *>(&wv);
    for (int k = 0; k < 4; k++) {
        const float2 f = __bfloat1622float2(h[k]), g = __bfloat1622float2(wh[k]);
        oh[k] = __floats2bfloat162_rn(f.x * r * g.x, f.y * r * g.y);
    }
    y[t] = o;
}
/* the row's pieces one at a time: stores only; loads and stores with no reduction; one warp for
 * the whole row (6 vectors a lane, shuffles only, no barrier) */
__global__ void k_store(uint4 *y) {
    pdl_wait();
    y[threadIdx.x] = make_uint4(0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u);
}
__global__ void k_copyrow(const uint4 *x, const uint4 *w, uint4 *y) {
    pdl_wait();
    const uint4 v = __ldcg(x + threadIdx.x), wv = __ldg(w + threadIdx.x);
    y[threadIdx.x] = make_uint4(v.x ^ wv.x, v.y ^ wv.y, v.z ^ wv.z, v.w ^ wv.w);
}
__global__ void k_rowwarp(const uint4 *x, const uint4 *w, uint4 *y) {
    pdl_wait();
    const int l = threadIdx.x;
    uint4 v[6], wv[6];
    for (int k = 0; k < 6; k++) v[k] = __ldcg(x + 32 * k + l), wv[k] = __ldg(w + 32 * k + l);
    float s = 0.0f;
    for (int k = 0; k < 6; k++) {
        const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&v[k]);
        for (int i = 0; i < 4; i++) {
            const float2 f = __bfloat1622float2(h[i]);
            s += f.x * f.x + f.y * f.y;
        }
    }
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    const float r = rsqrtf(s / 1536.0f + 1e-6f);
    for (int k = 0; k < 6; k++) {
        uint4 o;
        __nv_bfloat162 *oh = reinterpret_cast<__nv_bfloat162 *>(&o);
        const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&v[k]);
        const __nv_bfloat162 *wh = reinterpret_cast<const __nv_bfloat162 *>(&wv[k]);
        for (int i = 0; i < 4; i++) {
            const float2 f = __bfloat1622float2(h[i]), g = __bfloat1622float2(wh[i]);
            oh[i] = __floats2bfloat162_rn(f.x * r * g.x, f.y * r * g.y);
        }
        y[32 * k + l] = o;
    }
}
__global__ void k_fill4(int *out, int n) {
    pdl_wait();
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = -1;
}
__global__ void k_fill16(int4 *out, int n4) {
    pdl_wait();
    for (int i = threadIdx.x; i < n4; i += blockDim.x) out[blockIdx.x * n4 + i] = make_int4(-1, -1, -1, -1);
}

template <class K, class... A>
static void launch(bool pdl, cudaStream_t st, K kernel, unsigned grid, unsigned block, A... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid), cfg.blockDim = dim3(block), cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at, cfg.numAttrs = pdl ? 1 : 0;
    CK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

int main(int argc, char **argv) {
    int reps = 15;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    int *idx;
    float *tab, *out;
    uint16_t *x, *w, *y;
    int *fill;
    CK(cudaMalloc(&idx, 4096 * sizeof(int)));
    CK(cudaMalloc(&tab, 65536 * 64 * sizeof(float)));
    CK(cudaMalloc(&out, 4096 * sizeof(float)));
    CK(cudaMalloc(&x, 1536 * 2));
    CK(cudaMalloc(&w, 1536 * 2));
    CK(cudaMalloc(&y, 1536 * 2));
    CK(cudaMalloc(&fill, 16 * 2048 * sizeof(int)));
    std::vector<int> hi(4096, 7);
    hi[0] = 1000;
    CK(cudaMemcpy(idx, hi.data(), hi.size() * sizeof(int), cudaMemcpyHostToDevice));
    CK(cudaMemset(tab, 0, 65536 * 64 * sizeof(float)));
    CK(cudaMemset(x, 0x3f, 1536 * 2));
    CK(cudaMemset(w, 0x3f, 1536 * 2));
    const p64 a64 = {idx, tab, out, {0}};
    const p512 a512 = {idx, tab, out, {0}};
    printf("# decode_floor: us per call, 100 calls in one CUDA graph, median of %d replays\n", reps);
    printf("%-34s %8s %8s\n", "kernel", "no PDL", "PDL");
    auto row = [&](const char *name, auto fn) {
        const double a = graph_us([&](cudaStream_t st, int) { fn(false, st); }, 100, reps);
        const double b = graph_us([&](cudaStream_t st, int) { fn(true, st); }, 100, reps);
        printf("%-34s %8.3f %8.3f\n", name, a, b);
    };
    row("empty 1x32, 64 B params", [&](bool p, cudaStream_t s) { launch(p, s, k_empty<p64>, 1, 32, a64); });
    row("empty 2x192, 64 B params", [&](bool p, cudaStream_t s) { launch(p, s, k_empty<p64>, 2, 192, a64); });
    row("empty 4x128, 64 B params", [&](bool p, cudaStream_t s) { launch(p, s, k_empty<p64>, 4, 128, a64); });
    row("empty 4x192, 512 B params", [&](bool p, cudaStream_t s) { launch(p, s, k_empty<p512>, 4, 192, a512); });
    row("load1 1x32", [&](bool p, cudaStream_t s) { launch(p, s, k_load1<p64>, 1, 32, a64); });
    row("load2 1x32 (index -> row)", [&](bool p, cudaStream_t s) { launch(p, s, k_load2<p64>, 1, 32, a64); });
    row("load2 4x192, 512 B params", [&](bool p, cudaStream_t s) { launch(p, s, k_load2<p512>, 4, 192, a512); });
    row("load3 1x32", [&](bool p, cudaStream_t s) { launch(p, s, k_load3<p64>, 1, 32, a64); });
    row("row 1x192 (1536 bf16, block sum)", [&](bool p, cudaStream_t s) {
        launch(p, s, k_row, 1, 192, (const uint4 *)x, (const uint4 *)w, (uint4 *)y);
    });
    row("store 1x192 (16 B each)", [&](bool p, cudaStream_t s) { launch(p, s, k_store, 1, 192, (uint4 *)y); });
    row("copyrow 1x192 (x, w -> y)", [&](bool p, cudaStream_t s) {
        launch(p, s, k_copyrow, 1, 192, (const uint4 *)x, (const uint4 *)w, (uint4 *)y);
    });
    row("rowwarp 1x32 (6 vectors a lane)", [&](bool p, cudaStream_t s) {
        launch(p, s, k_rowwarp, 1, 32, (const uint4 *)x, (const uint4 *)w, (uint4 *)y);
    });
    row("fill 2048 x int32, 1 warp, 4 B", [&](bool p, cudaStream_t s) { launch(p, s, k_fill4, 1, 32, fill, 2048); });
    row("fill 2048 x int32, 1 warp, 16 B", [&](bool p, cudaStream_t s) { launch(p, s, k_fill16, 1, 32, (int4 *)fill, 512); });
    row("fill 2048 x int32, 192 thr, 16 B", [&](bool p, cudaStream_t s) { launch(p, s, k_fill16, 1, 192, (int4 *)fill, 512); });
    row("fill 16 x 2048 int32, 16 blk x 192", [&](bool p, cudaStream_t s) { launch(p, s, k_fill16, 16, 192, (int4 *)fill, 512); });
    CK(cudaDeviceSynchronize());
    return 0;
}
