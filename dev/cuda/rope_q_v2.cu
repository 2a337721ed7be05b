/*
 * rope_q_v2 — rope_q launch shapes for mid and large T against the library's (src/cuda/rope_q.cu,
 * included as shipped), and the ceiling the bench reports: a copy of q's rope pieces at q's own
 * strides (tools/bench_cuda.cu's kernel, here in place).
 *
 *   lib      the library's dispatch (pair kernel below 16384 NeoX-sized units, else the vector
 *            kernel: flatK's shape, K = 2 for interleaved calls of >= 2^22 units).
 *   flatK    the library's vector kernel at K = 1, 2, 4: one shot, unit k of every thread of a
 *            block neighbours (as the piece copy), each unit's position and cos/sin its own loads
 *            (measured first as this program's own copy with 64-bit unit indices).
 *   warpJ    lanes of a warp share a token; lane l always holds unit l % U of a head (U divides
 *            32), so its cos/sin are loaded once per token; J q vectors per lane per step, the
 *            q loads issued before the position is known.
 *   pcopy    the bench's piece copy (loads then streaming stores), in place.
 * Measured against the kernel the library had before (blocks over whole tokens, batches of 4
 * units per thread): dev/README.md's rope_q rows.
 * Validation: every variant bit-exact against the host rotation (both styles, positions past the
 * table counted once per token, nope columns untouched). Timing as mlafuse bench: L2 flushed,
 * one call between events (stream), or per call in a CUDA graph for T <= 64.
 */
#include "cuda/rope_q.cu"
#include "common.cuh"
#include "rope_q_check.cuh"

#include <functional>
#include <string>

/* ---- warp: a warp per (token, step of 32 J units) ------------------------------------------ */
template <bool NEOX, int J>
__global__ void __launch_bounds__(256) rq_warp(const mlaf_rope_q_args a, int32_t upt, int32_t steps,
                                               int32_t cs_vec) {
    mlaf_pdl_begin();
    typedef __nv_bfloat16 T;
    constexpr int W = 8;
    const int lane = threadIdx.x & 31;
    const int64_t gw = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    const int64_t t = gw / steps;
    if (t >= a.T) return;
    const int32_t step = (int32_t)(gw - t * steps);
    const int32_t half = a.R / 2, U = NEOX ? half / W : a.R / W;
    const int32_t u = lane % U;
    T *row = static_cast<T *>(a.q) + t * a.s0 + (a.D - a.R) + u * W;
    uint4 x0[J], x1[J];
    const int32_t r0 = step * 32 * J + lane;
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int32_t rem = r0 + 32 * j;
        if (rem < upt) {
            T *p = row + (int64_t)(rem / U) * a.s1;
            x0[j] = *reinterpret_cast<const uint4 *>(p);
            if (NEOX) x1[j] = *reinterpret_cast<const uint4 *>(p + half);
        }
    }
    const int64_t pos = mlaf_ld_index(a.pos, a.pos64, t);
    if (pos < 0 || pos >= a.max_pos) {
        if (step == 0 && lane == 0 && a.err) mlaf_cuda_error_count_add(a.err, 1);
        return;
    }
    const float *cs = a.cos_sin + pos * a.cs_stride;
    constexpr int NC = NEOX ? W : W / 2;
    float co[NC], si[NC];
    mlaf_ld_cs<NC>(cs + u * NC, cs_vec, co);
    mlaf_ld_cs<NC>(cs + half + u * NC, cs_vec, si);
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int32_t rem = r0 + 32 * j;
        if (rem >= upt) continue;
        T *p = row + (int64_t)(rem / U) * a.s1;
        mlaf_rope_q_rotate_store<T, NEOX>(p, half, x0[j], NEOX ? x1[j] : x0[j], co, si);
    }
}

/* ---- the bench's piece copy, in place ------------------------------------------------------- */
template <int K>
__global__ void __launch_bounds__(256) rq_pcopy(uint4 *q, int64_t n, int64_t u, int64_t pitch16, int64_t off16) {
    const int64_t total = n * u, first = ((int64_t)blockIdx.x * 256 + threadIdx.x) * K;
    uint4 v[K];
    int64_t at[K];
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int64_t i = first + k;
        at[k] = i < total ? (i / u) * pitch16 + off16 + i % u : -1;
        if (at[k] >= 0) v[k] = __ldcs(q + at[k]);
    }
#pragma unroll
    for (int k = 0; k < K; k++)
        if (at[k] >= 0) __stcs(q + at[k], v[k]);
}

typedef std::function<void(const mlaf_rope_q_args &, cudaStream_t)> rq_fn;
struct rq_variant {
    std::string name;
    rq_fn fn;
};

static int32_t rq_upt(const mlaf_rope_q_args &a) { return (int32_t)(a.H * (a.neox ? a.R / 16 : a.R / 8)); }
static int32_t rq_csvec(const mlaf_rope_q_args &a) {
    return (uintptr_t)a.cos_sin % 16 == 0 && a.cs_stride % 4 == 0 && (a.R / 2) % 4 == 0;
}

/* flatK is the library's vector kernel at K units per thread (the library takes K = 1 and 2). */
template <int K> static rq_variant rq_flat_v() {
    return {"flat" + std::to_string(K), [](const mlaf_rope_q_args &a, cudaStream_t st) {
                const int32_t upt = rq_upt(a);
                const int64_t blocks = (a.T * upt + 256 * K - 1) / (256 * K);
                if (a.neox)
                    mlaf_rope_q_vec_kernel<__nv_bfloat16, true, K, uint32_t><<<(unsigned)blocks, 256, 0, st>>>(a, upt, rq_csvec(a));
                else
                    mlaf_rope_q_vec_kernel<__nv_bfloat16, false, K, uint32_t><<<(unsigned)blocks, 256, 0, st>>>(a, upt, rq_csvec(a));
            }};
}
template <int J> static rq_variant rq_warp_v() {
    return {"warp" + std::to_string(J), [](const mlaf_rope_q_args &a, cudaStream_t st) {
                const int32_t upt = rq_upt(a), steps = (upt + 32 * J - 1) / (32 * J);
                const int64_t blocks = (a.T * steps + 7) / 8;
                if (a.neox) rq_warp<true, J><<<(unsigned)blocks, 256, 0, st>>>(a, upt, steps, rq_csvec(a));
                else rq_warp<false, J><<<(unsigned)blocks, 256, 0, st>>>(a, upt, steps, rq_csvec(a));
            }};
}

static std::vector<rq_variant> variants() {
    std::vector<rq_variant> v;
    v.push_back({"lib", [](const mlaf_rope_q_args &a, cudaStream_t st) {
                     CK(mlaf_rope_q_launch<__nv_bfloat16>(a, sm_count(), st));
                 }});
    v.push_back(rq_flat_v<1>());
    v.push_back(rq_flat_v<2>());
    v.push_back(rq_flat_v<4>());
    v.push_back(rq_warp_v<1>());
    v.push_back(rq_warp_v<2>());
    v.push_back(rq_warp_v<4>());
    v.push_back(rq_warp_v<8>());
    return v;
}

static bool validate(const dev_shape &s, int neox, const rq_variant &var, int64_t T) {
    const rq_check_result r = rq_check(s, neox, T, 8, [&](const mlaf_rope_q_args &a) { var.fn(a, 0); });
    if (!r.pass)
        printf("  validate %s %s %s T=%lld: mismatches %lld, error_count %d (want %d) FAIL\n", s.name,
               var.name.c_str(), neox ? "neox" : "interleaved", (long long)T, (long long)r.mismatches, r.err,
               r.want_err);
    return r.pass;
}

int main(int argc, char **argv) {
    const bool quick = argc > 1 && !strcmp(argv[1], "--quick");
    printf("== rope_q v2: launch shapes (bf16; us, L2 flushed; T <= 64 per call in a graph)\n");
    print_device();
    const double copy = copy_gbps();
    printf("device-to-device copy (same run): %.0f GB/s\n", copy);
    const std::vector<rq_variant> vs = variants();
    flusher fl;
    int checked = 0;
    for (const dev_shape &s : dev_shapes)
        for (int neox = 0; neox < 2; neox++)
            for (const auto &v : vs)
                for (int64_t T : {1, 5, 333}) checked += validate(s, neox, v, T);
    printf("validation: %d of %zu cases bit-exact\n", checked, (size_t)2 * 2 * 3 * vs.size());
    std::vector<int64_t> Ts = {1, 64, 256, 1024, 4096, 16384, 32768};
    if (!quick) Ts.push_back(131072);
    for (const dev_shape &s : dev_shapes)
        for (int neox = 0; neox < 2; neox++) {
            const int64_t H = s.H, D = s.nope + s.R, R = s.R;
            printf("\n-- %s %s: q [T, %lld, %lld], rope on the last %lld\n%-8s", s.name, neox ? "neox" : "interleaved",
                   (long long)H, (long long)D, (long long)R, "T");
            for (int64_t T : Ts) printf(" %8lld", (long long)T);
            printf("\n");
            const int64_t Tmax = Ts.back();
            const int64_t max_pos = Tmax > 65536 ? 65536 : Tmax;
            std::vector<float> cs;
            make_cos_sin(cs, (int)max_pos, (int)R);
            float *dcs;
            int64_t *dpos;
            __nv_bfloat16 *q;
            CK(cudaMalloc(&dcs, cs.size() * 4));
            CK(cudaMemcpy(dcs, cs.data(), cs.size() * 4, cudaMemcpyHostToDevice));
            std::vector<int64_t> pos(Tmax);
            for (int64_t t = 0; t < Tmax; t++) pos[t] = t % max_pos;
            CK(cudaMalloc(&dpos, Tmax * 8));
            CK(cudaMemcpy(dpos, pos.data(), Tmax * 8, cudaMemcpyHostToDevice));
            CK(cudaMalloc(&q, (size_t)Tmax * H * D * 2));
            dev_fill_bf16(q, (size_t)Tmax * H * D);
            auto row = [&](const char *name, std::function<void(int64_t, cudaStream_t)> go) {
                printf("%-8s", name);
                for (int64_t T : Ts) {
                    const double us = T <= 64 ? graph_us([&](cudaStream_t st, int) { go(T, st); })
                                              : flushed_us(fl, [&] { go(T, 0); });
                    printf(" %8.2f", us);
                }
                printf("\n");
            };
            for (const auto &v : vs)
                row(v.name.c_str(), [&](int64_t T, cudaStream_t st) {
                    v.fn(rq_args(q, T, H, D, (int)D, (int)R, neox, dpos, dcs, max_pos, nullptr), st);
                });
            const int64_t pb = (neox ? 2 : 1) * 0 + R * 2; /* bytes of a head's rope piece */
            row("pcopy4", [&](int64_t T, cudaStream_t st) {
                const int64_t n = T * H, u = pb / 16, blocks = (n * u + 1023) / 1024;
                rq_pcopy<4><<<(unsigned)blocks, 256, 0, st>>>((uint4 *)q, n, u, D * 2 / 16, (D - R) * 2 / 16);
            });
            row("pcopy1", [&](int64_t T, cudaStream_t st) {
                const int64_t n = T * H, u = pb / 16, blocks = (n * u + 255) / 256;
                rq_pcopy<1><<<(unsigned)blocks, 256, 0, st>>>((uint4 *)q, n, u, D * 2 / 16, (D - R) * 2 / 16);
            });
            CK(cudaGetLastError());
            CK(cudaFree(dcs)); CK(cudaFree(dpos)); CK(cudaFree(q));
        }
    printf("\n%s\n", dev_failures ? "FAILED" : "all variants bit-exact");
    return dev_failures ? 1 : 0;
}
