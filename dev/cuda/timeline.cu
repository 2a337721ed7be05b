/*
 * timeline — where a large-T call of the norm kernels spends its time, row by row.
 *
 * Built with MLAF_ROW_TIMELINE, the library's row kernel (src/cuda/norm_common.cuh) records for
 * every row, in lane 0 of its warp: the global timer when the warp starts the row, once its
 * sums are done (the row's loads have landed), after its last store is issued, and the SM. A
 * one-thread stamp kernel before and after the call records the timer on each side of it. The
 * call is timed as mlafuse bench times it (L2 flushed clean before each sample, CUDA events,
 * median) and its timeline read back, for:
 *   split_qk_norm (auto = WAVE below 65536 rows, and STAGE), mla_kv_cache (auto = STAGE from
 *   32768 rows, and WAVE), and `rowcopy`: the same warp-per-row launch moving split_qk_norm's
 *   bytes with no arithmetic (each row's vectors loaded, then stored), so the ramp and tail of
 *   the launch shape itself can be told from those of the row's arithmetic.
 * Printed per case: event time, the kernel's span (first row start to last store), the gaps
 * before and after it, when 1 / 50 / 99 / 100% of the rows were done, the steady rate (rows
 * done between the 25% and 75% marks) and what the call would take at that rate, and the SMs'
 * last-row spread; with `--profile`, bins of 2 us (rows done -> GB/s, rows in flight, mean load
 * and arithmetic time of the rows done).
 *
 * bf16, GLM-4.7-Flash and DeepSeek-V3 rows, T = 32768 and 131072. The instrumentation adds one
 * 32-byte store per row (0.6% / 0.4% of the bytes) and three timer reads.
 */
#define MLAF_ROW_DEV_MODES
#define MLAF_ROW_TIMELINE
#include "row_v1.cuh"
#include "common.cuh"

#include <numeric>

typedef unsigned long long u64;

__global__ void tl_stamp(u64 *p) {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    *p = t;
}

/* split_qk_norm's bytes moved by WAVE's launch shape (4 warps of 128-thread blocks, a warp per
 * row, 8 / 6 resident blocks for rows of 6 / 9 vectors per lane), no arithmetic */
template <int NV>
__global__ void __launch_bounds__(128, NV <= 6 ? 8 : 6) tl_rowcopy(const uint4 *src, uint4 *dst, int nv, int64_t T) {
    const int lane = threadIdx.x & 31;
    const int64_t t = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
    if (t >= T) return;
    u64 ta, tb;
    MLAF_TL_NOW(ta, 0.0f);
    uint4 v[NV];
    float dep = 0.0f;
#pragma unroll
    for (int s = 0; s < NV; s++) {
        const int c = lane + 32 * s;
        if (c < nv) v[s] = __ldcs(src + t * nv + c), dep += __int_as_float(v[s].x & 1);
    }
    MLAF_TL_NOW(tb, dep);
#pragma unroll
    for (int s = 0; s < NV; s++) {
        const int c = lane + 32 * s;
        if (c < nv) __stcs(dst + t * nv + c, v[s]);
    }
    MLAF_TL_PUT(t, ta, tb);
}

struct tl_case {
    const dev_shape &s;
    int64_t T, W, CR, nblocks;
    const int64_t bs = 64, max_pos = 131072;
    __nv_bfloat16 *L, *q, *kn, *kp, *cache, *wq, *wkv;
    int64_t *pos, *slot;
    float *cs;
    u64 *tl, *st;
    size_t split_row, mla_row;
    int sms;
    tl_case(const dev_shape &s_, int64_t T_) : s(s_), T(T_) {
        W = s.Q + s.C + s.R, CR = s.C + s.R;
        nblocks = (T + bs - 1) / bs;
        split_row = (size_t)4 * W;
        mla_row = (size_t)2 * W + 4 * s.R + 16 + 2 * s.Q + 2 * CR;
        sms = sm_count();
        CK(cudaMalloc(&L, (size_t)T * W * 2));
        CK(cudaMalloc(&q, (size_t)T * W * 2)); /* also rowcopy's destination */
        CK(cudaMalloc(&kn, (size_t)T * s.C * 2));
        CK(cudaMalloc(&kp, (size_t)T * s.R * 2));
        CK(cudaMalloc(&cache, (size_t)nblocks * bs * CR * 2));
        CK(cudaMalloc(&wq, (size_t)s.Q * 2));
        CK(cudaMalloc(&wkv, (size_t)s.C * 2));
        CK(cudaMalloc(&pos, T * 8));
        CK(cudaMalloc(&slot, T * 8));
        CK(cudaMalloc(&cs, (size_t)max_pos * s.R * 4));
        CK(cudaMalloc(&tl, (size_t)T * 32));
        CK(cudaMalloc(&st, 16));
        dev_fill_bf16(L, (size_t)T * W);
        dev_fill_bf16(wq, s.Q);
        dev_fill_bf16(wkv, s.C);
        CK(cudaMemset(cs, 0, (size_t)max_pos * s.R * 4));
        std::vector<int64_t> hp(T), hs(T), perm(nblocks);
        for (int64_t i = 0; i < nblocks; i++) perm[i] = (i * 7919) % nblocks;
        if (std::gcd(nblocks, (int64_t)7919) != 1)
            for (int64_t i = 0; i < nblocks; i++) perm[i] = i;
        for (int64_t t = 0; t < T; t++) hp[t] = t % max_pos, hs[t] = perm[t / bs] * bs + t % bs;
        CK(cudaMemcpy(pos, hp.data(), T * 8, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(slot, hs.data(), T * 8, cudaMemcpyHostToDevice));
        CK(cudaMemcpyToSymbol(mlaf_row_tl, &tl, sizeof(tl)));
    }
    ~tl_case() {
        for (void *p : {(void *)L, (void *)q, (void *)kn, (void *)kp, (void *)cache, (void *)wq, (void *)wkv,
                        (void *)pos, (void *)slot, (void *)cs, (void *)tl, (void *)st})
            CK(cudaFree(p));
    }
    mlaf_row_args args(bool kv) const {
        mlaf_row_args a = mlaf_row_args();
        a.T = T, a.Q = s.Q, a.C = s.C, a.R = s.R, a.eps_q = s.eps_q, a.eps_kv = s.eps_kv;
        a.latent = L, a.ls = W, a.w_q = wq, a.w_kv = wkv;
        a.q = q, a.qs = s.Q;
        a.k_nope = kv ? nullptr : kn, a.ks = s.C;
        a.k_pe = kv ? nullptr : kp, a.ps = s.R;
        a.pos = pos, a.pos64 = 1, a.neox = 0, a.cos_sin = cs, a.cs_stride = s.R, a.max_pos = max_pos;
        a.slots = slot, a.slot64 = 1, a.cache_dt = MLAF_BF16, a.cache = cache;
        a.n_slots = nblocks * bs, a.block_size = bs, a.c_s0 = bs * CR, a.c_s1 = CR;
        return a;
    }
    /* what = 0 split, 1 mla_kv_cache, 2 rowcopy; mode -1 = auto */
    void launch(int what, int mode) const {
        mlaf_row_policy p;
        p.mode = mode;
        if (what == 0) CK(mlaf_row_launch<false>(args(false), MLAF_BF16, sms, 0, p));
        else if (what == 1) CK(mlaf_row_launch<true>(args(true), MLAF_BF16, sms, 0, p));
        else {
            const int nv = (int)(W / 8);
            const unsigned grid = (unsigned)((T + 3) / 4);
            if (nv <= 6 * 32) tl_rowcopy<6><<<grid, 128>>>((const uint4 *)L, (uint4 *)q, nv, T);
            else tl_rowcopy<9><<<grid, 128>>>((const uint4 *)L, (uint4 *)q, nv, T);
            CK(cudaGetLastError());
        }
    }
};

static void report(const char *name, const tl_case &k, int what, int mode, const flusher &fl, double copy, bool prof) {
    const double ev = flushed_us(fl, [&] { k.launch(what, mode); }, 21);
    const size_t row = what == 1 ? k.mla_row : k.split_row;
    const int64_t T = k.T;
    /* five stamped samples; keep the one of median span */
    std::vector<std::vector<u64>> runs;
    std::vector<std::pair<double, int>> spans;
    std::vector<u64> sts;
    for (int r = 0; r < 5; r++) {
        fl(r);
        CK(cudaMemset(k.tl, 0, (size_t)T * 32));
        tl_stamp<<<1, 1>>>(k.st);
        k.launch(what, mode);
        tl_stamp<<<1, 1>>>(k.st + 1);
        CK(cudaDeviceSynchronize());
        std::vector<u64> h((size_t)T * 4);
        u64 s2[2];
        CK(cudaMemcpy(h.data(), k.tl, (size_t)T * 32, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(s2, k.st, 16, cudaMemcpyDeviceToHost));
        u64 lo = ~0ull, hi = 0;
        for (int64_t t = 0; t < T; t++) lo = std::min(lo, h[4 * t]), hi = std::max(hi, h[4 * t + 2]);
        spans.push_back({(double)(hi - lo), r});
        runs.push_back(std::move(h));
        sts.push_back(s2[0]), sts.push_back(s2[1]);
    }
    std::sort(spans.begin(), spans.end());
    const int r = spans[2].second;
    const std::vector<u64> &h = runs[r];
    const u64 s0 = sts[2 * r], s1 = sts[2 * r + 1];
    u64 k0 = ~0ull, k1 = 0;
    for (int64_t t = 0; t < T; t++) {
        if (h[4 * t + 2] == 0) {
            printf("  %s: row %lld has no stamp\n", name, (long long)t);
            dev_failures++;
            return;
        }
        k0 = std::min(k0, h[4 * t]), k1 = std::max(k1, h[4 * t + 2]);
    }
    std::vector<double> done(T);
    for (int64_t t = 0; t < T; t++) done[t] = (h[4 * t + 2] - k0) * 1e-3;
    std::sort(done.begin(), done.end());
    auto at = [&](double f) { return done[std::min<int64_t>(T - 1, (int64_t)(f * T))]; };
    const double span = (k1 - k0) * 1e-3;
    const double rate = 0.5 * T * row / ((at(0.75) - at(0.25)) * 1e-6) / 1e9; /* GB/s */
    const double ideal = (double)T * row / (rate * 1e9) * 1e6;
    /* each SM's last store */
    std::vector<double> smlast(256, 0.0);
    for (int64_t t = 0; t < T; t++) {
        const unsigned sm = (unsigned)h[4 * t + 3] & 255u;
        smlast[sm] = std::max(smlast[sm], (h[4 * t + 2] - k0) * 1e-3);
    }
    double smlo = 1e30, smhi = 0;
    for (double x : smlast)
        if (x > 0) smlo = std::min(smlo, x), smhi = std::max(smhi, x);
    /* the last row started, and the mean load / arithmetic time of the last 2% of rows done */
    double last_start = 0, ld_tail = 0, ar_tail = 0, ld_mid = 0, ar_mid = 0;
    int64_t n_tail = 0, n_mid = 0;
    for (int64_t t = 0; t < T; t++) {
        const double a0 = (h[4 * t] - k0) * 1e-3, b0 = (h[4 * t + 1] - k0) * 1e-3, c0 = (h[4 * t + 2] - k0) * 1e-3;
        last_start = std::max(last_start, a0);
        if (c0 >= at(0.98)) ld_tail += b0 - a0, ar_tail += c0 - b0, n_tail++;
        if (c0 >= at(0.25) && c0 < at(0.75)) ld_mid += b0 - a0, ar_mid += c0 - b0, n_mid++;
    }
    printf("  %-18s T=%6lld event %7.2f us (%5.1f%% of copy) | span %7.2f, before %5.2f, after %5.2f | done 1%% %5.2f "
           "50%% %6.2f 99%% %6.2f 100%% %6.2f | steady %5.0f GB/s (%5.1f%%) -> %6.2f us, span - that %5.2f | SMs "
           "end %6.2f .. %6.2f | last start %6.2f | load / math: mid %4.2f / %4.2f, last 2%% %4.2f / %4.2f\n",
           name, (long long)T, ev, 100.0 * T * row / (ev * 1e-6) / 1e9 / copy, span, ((double)k0 - (double)s0) * 1e-3,
           ((double)s1 - (double)k1) * 1e-3, at(0.01), at(0.5), at(0.99), span, rate, 100.0 * rate / copy, ideal,
           span - ideal, smlo, smhi, last_start, ld_mid / n_mid, ar_mid / n_mid, ld_tail / n_tail, ar_tail / n_tail);
    if (!prof) return;
    const double bin = 2.0;
    const int nb = (int)(span / bin) + 1;
    std::vector<double> cnt(nb, 0), ld(nb, 0), ar(nb, 0), infl(nb, 0);
    for (int64_t t = 0; t < T; t++) {
        const double a0 = (h[4 * t] - k0) * 1e-3, b0 = (h[4 * t + 1] - k0) * 1e-3, c0 = (h[4 * t + 2] - k0) * 1e-3;
        const int b = std::min(nb - 1, (int)(c0 / bin));
        cnt[b] += 1, ld[b] += b0 - a0, ar[b] += c0 - b0;
        for (int j = 0; j < nb; j++)
            if (a0 <= j * bin && c0 > j * bin) infl[j] += 1;
    }
    printf("    %6s %8s %8s %8s %8s\n", "us", "GB/s", "in fl.", "load", "math");
    for (int j = 0; j < nb; j++)
        printf("    %6.1f %8.0f %8.0f %8.2f %8.2f\n", j * bin, cnt[j] * row / (bin * 1e-6) / 1e9, infl[j],
               cnt[j] ? ld[j] / cnt[j] : 0.0, cnt[j] ? ar[j] / cnt[j] : 0.0);
}

int main(int argc, char **argv) {
    const bool prof = argc > 1 && !strcmp(argv[1], "--profile");
    const double copy = copy_gbps();
    printf("timeline: same-run copy %.0f GB/s (512 MB, read + written)\n", copy);
    flusher fl;
    for (const dev_shape &s : dev_shapes) {
        printf("%s\n", s.name);
        for (int64_t T : {32768, 131072}) {
            tl_case k(s, T);
            const bool p = prof && T == 32768;
            report("split auto", k, 0, -1, fl, copy, p);
            report("split STAGE", k, 0, MLAF_ROW_STAGE, fl, copy, false);
            report("mla_kv_cache auto", k, 1, -1, fl, copy, p);
            report("mla_kv_cache WAVE", k, 1, MLAF_ROW_WAVE, fl, copy, false);
            report("rowcopy", k, 2, 0, fl, copy, p);
        }
    }
    return dev_failures ? 1 : 0;
}
