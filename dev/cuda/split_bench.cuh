/*
 * split_bench.cuh — the harness the split_qk_norm_vN programs share: for each model shape,
 *   1. validate every variant at T = 999 against the float64 reference (max error in bf16
 *      ulps over q and k_nope; k_pe must be bit-exact), and
 *   2. time it: T in {4096, 32768, 131072} with events (median, inputs rotated past L2),
 *      reported as us, GB/s (bytes read + written) and % of the same-run D2D copy; and
 *      T in {1, 8, 64} as us per call under CUDA-graph replay.
 * bf16 only (the dtype the targets are set for). `--quick` drops T = 131072.
 */
#pragma once

#include <functional>
#include <string>

#include "common.cuh"

struct split_args {
    const __nv_bfloat16 *latent;
    int64_t ls;
    const __nv_bfloat16 *wq, *wkv;
    __nv_bfloat16 *q, *k_nope, *k_pe;
    int64_t qs, ks, ps;
    int64_t T;
    int Q, C, R;
    float eps_q, eps_kv;
};

struct split_variant {
    std::string name; /* variant and launch shape */
    std::function<void(const split_args &, cudaStream_t)> launch;
};

static inline void validate_split(const std::vector<split_variant> &vs, const dev_shape &s,
                           const std::vector<uint16_t> &wq, const std::vector<uint16_t> &wkv,
                           const __nv_bfloat16 *d_wq, const __nv_bfloat16 *d_wkv) {
    const int64_t T = 999, W = s.Q + s.C + s.R, LS = W + 8; /* padded rows */
    dev_rng rng(7);
    std::vector<uint16_t> L((size_t)T * LS);
    for (int64_t t = 0; t < T; t++) /* rows of very different scales */
        for (int64_t i = 0; i < LS; i++)
            L[t * LS + i] = f2bf((float)(rng.normal() * pow(2.0, (double)(t % 17) - 8)));
    __nv_bfloat16 *dL, *dq, *dk, *dp;
    CK(cudaMalloc(&dL, L.size() * 2));
    CK(cudaMalloc(&dq, (size_t)T * s.Q * 2 + 2));
    CK(cudaMalloc(&dk, (size_t)T * s.C * 2));
    CK(cudaMalloc(&dp, (size_t)T * s.R * 2 + 2));
    CK(cudaMemcpy(dL, L.data(), L.size() * 2, cudaMemcpyHostToDevice));
    std::vector<double> ref((size_t)T * W);
    for (int64_t t = 0; t < T; t++) ref_split_row(&L[t * LS], s, wq.data(), wkv.data(), &ref[t * W]);
    std::vector<uint16_t> q((size_t)T * s.Q), k((size_t)T * s.C), p((size_t)T * s.R);
    for (const auto &v : vs) {
        CK(cudaMemset(dq, 0xff, (size_t)T * s.Q * 2));
        CK(cudaMemset(dk, 0xff, (size_t)T * s.C * 2));
        CK(cudaMemset(dp, 0xff, (size_t)T * s.R * 2));
        split_args a = {dL, LS, d_wq, d_wkv, dq, dk, dp, s.Q, s.C, s.R, T, s.Q, s.C, s.R, s.eps_q, s.eps_kv};
        v.launch(a, 0);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(q.data(), dq, q.size() * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(k.data(), dk, k.size() * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(p.data(), dp, p.size() * 2, cudaMemcpyDeviceToHost));
        double worst = 0;
        int64_t pe_bad = 0;
        for (int64_t t = 0; t < T; t++) {
            for (int i = 0; i < s.Q; i++) worst = std::max(worst, bf16_ulps(q[t * s.Q + i], ref[t * W + i]));
            for (int j = 0; j < s.C; j++)
                worst = std::max(worst, bf16_ulps(k[t * s.C + j], ref[t * W + s.Q + j]));
            for (int r = 0; r < s.R; r++) pe_bad += p[t * s.R + r] != L[t * LS + s.Q + s.C + r];
        }
        printf("  validate %-40s T=%lld: worst %.3f ulp (<= 1 passes), k_pe mismatches %lld  %s\n",
               v.name.c_str(), (long long)T, worst, (long long)pe_bad,
               worst <= 1.0 && pe_bad == 0 ? "OK" : "FAIL");
        dev_failures += !(worst <= 1.0 && pe_bad == 0);
    }
    CK(cudaFree(dL));
    CK(cudaFree(dq));
    CK(cudaFree(dk));
    CK(cudaFree(dp));
}

static inline int run_split_bench(const char *title, const std::vector<split_variant> &vs, int argc, char **argv) {
    bool quick = argc > 1 && !strcmp(argv[1], "--quick");
    printf("== %s\n", title);
    print_device();
    const double copy = copy_gbps();
    printf("device-to-device copy (same run): %.0f GB/s\n", copy);
    for (const dev_shape &s : dev_shapes) {
        const int W = s.Q + s.C + s.R;
        printf("\n-- %s: Q=%d C=%d R=%d, %d bytes read + %d written per row (bf16)\n", s.name, s.Q,
               s.C, s.R, 2 * W, 2 * W);
        dev_rng rng(1);
        std::vector<uint16_t> wq(s.Q), wkv(s.C);
        fill_bf16(wq, rng, 1.0, 0.2);
        fill_bf16(wkv, rng, 1.0, 0.2);
        __nv_bfloat16 *d_wq, *d_wkv;
        CK(cudaMalloc(&d_wq, s.Q * 2));
        CK(cudaMalloc(&d_wkv, s.C * 2));
        CK(cudaMemcpy(d_wq, wq.data(), s.Q * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d_wkv, wkv.data(), s.C * 2, cudaMemcpyHostToDevice));
        validate_split(vs, s, wq, wkv, d_wq, d_wkv);

        printf("  %-40s %8s %10s %9s %8s\n", "variant / launch shape", "T", "time us", "GB/s", "% copy");
        std::vector<int64_t> Ts = {4096, 32768};
        if (!quick) Ts.push_back(131072);
        for (int64_t T : Ts) {
            const size_t row_bytes = (size_t)W * 2, bytes = 2 * row_bytes * T;
            const int nrot = rotations(bytes);
            __nv_bfloat16 *L, *q, *k, *p;
            CK(cudaMalloc(&L, row_bytes * T * nrot));
            CK(cudaMalloc(&q, (size_t)s.Q * 2 * T * nrot));
            CK(cudaMalloc(&k, (size_t)s.C * 2 * T * nrot));
            CK(cudaMalloc(&p, (size_t)s.R * 2 * T * nrot));
            dev_fill_bf16(L, (size_t)W * T * nrot, 42);
            CK(cudaDeviceSynchronize());
            for (const auto &v : vs) {
                double us = time_us([&](int i) {
                    const int64_t r = i % nrot;
                    split_args a = {L + r * T * W, W, d_wq, d_wkv, q + r * T * s.Q, k + r * T * s.C,
                                    p + r * T * s.R, s.Q, s.C, s.R, T, s.Q, s.C, s.R, s.eps_q, s.eps_kv};
                    v.launch(a, 0);
                });
                const double gbs = bytes / (us * 1e-6) / 1e9;
                printf("  %-40s %8lld %10.2f %9.0f %7.1f%%\n", v.name.c_str(), (long long)T, us, gbs,
                       100.0 * gbs / copy);
            }
            CK(cudaFree(L));
            CK(cudaFree(q));
            CK(cudaFree(k));
            CK(cudaFree(p));
        }
        for (int64_t T : {1, 8, 64}) {
            const int nrot = 4;
            __nv_bfloat16 *L, *q, *k, *p;
            CK(cudaMalloc(&L, (size_t)W * 2 * T * nrot));
            CK(cudaMalloc(&q, (size_t)s.Q * 2 * T * nrot));
            CK(cudaMalloc(&k, (size_t)s.C * 2 * T * nrot));
            CK(cudaMalloc(&p, (size_t)s.R * 2 * T * nrot));
            dev_fill_bf16(L, (size_t)W * T * nrot, 43);
            CK(cudaDeviceSynchronize());
            for (const auto &v : vs) {
                double us = graph_us([&](cudaStream_t st, int i) {
                    const int64_t r = i % nrot;
                    split_args a = {L + r * T * W, W, d_wq, d_wkv, q + r * T * s.Q, k + r * T * s.C,
                                    p + r * T * s.R, s.Q, s.C, s.R, T, s.Q, s.C, s.R, s.eps_q, s.eps_kv};
                    v.launch(a, st);
                });
                printf("  %-40s %8lld %10.2f   (us per call, CUDA-graph replay; target <= 2.5)\n",
                       v.name.c_str(), (long long)T, us);
            }
            CK(cudaFree(L));
            CK(cudaFree(q));
            CK(cudaFree(k));
            CK(cudaFree(p));
        }
        CK(cudaFree(d_wq));
        CK(cudaFree(d_wkv));
    }
    return dev_failures ? 1 : 0;
}
