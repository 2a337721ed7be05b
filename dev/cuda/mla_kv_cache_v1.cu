/*
 * mla_kv_cache_v1 — the fused library kernel (split + both RMSNorms + RoPE on k_pe + paged
 * cache write, src/cuda/norm_common.cuh with the cache epilogue) against the same steps as
 * separate kernels, the way engines run them today:
 *   unfused 1. split_qk_norm (the library's own kernel) -> q, k_nope, k_pe
 *           2. RoPE in place on k_pe (one thread per pair)
 *           3. cache write: [k_nope | k_pe] -> kv_cache[slot] (one thread per 8 elements)
 *   fused   one pass: latent -> q and the cache row (no dense k_nope / k_pe, as an engine
 *           calls it).
 * Validation (T = 999, both RoPE styles, with negative slots, slots past the cache and
 * positions past the table): q / k_nope within 1 bf16 ulp of float64, roped k_pe and the
 * cache's pe part bit-exact with the host's fp32 rotation, unnamed cache rows untouched, the
 * error counter exact. Timing: T in {1, 8, 64} (CUDA-graph replay, us per call), {512, 4096}
 * (the target there: fused >= 1.5x faster) and {32768, 131072} (GB/s vs the same-run D2D copy;
 * bytes = latent row + cos/sin row + position + slot read, q + cache row written).
 * Launch modes: WAVE, PIPE, LAT, BLK (256-thread block per row, pe rotated by the first warp
 * after the block barrier) and BLKR (norm warps + a rope warp, what the library runs for
 * small T), each forced, and auto (what ships).
 * `--quick`: no T = 131072. `--sweep`: validation, then the small / medium T sweep that sets
 * the launch shapes: T in {1, 8, 64, ..., 1024, 1536, 2048, 3072, 4096, ..., 16384}, graph
 * replay, unfused chain, WAVE, BLK, BLKR and auto side by side, with each block kernel's
 * registers and resident blocks per SM. `--large`: T = 8192 ... 131072 in two rounds, WAVE,
 * STAGE (rows brought into shared memory by bulk copies), RUN with 2 rows per warp (indices
 * one row ahead), PIPE, auto, and split_qk_norm alone, auto and STAGE (% of the same-run copy).
 * `--flushed`: T = 16384 ... 131072 timed like mlafuse bench (clean-L2 flush per sample), WAVE,
 * STAGE and STAGE on a persistent grid for both ops, a memcpy of the same bytes and an empty
 * kernel. `--tile`: TILE (each warp streams rows through a ring of shared-memory slots, bulk
 * loads and bulk or lane stores; dev only, it lost) validated, checked bit-identical to WAVE,
 * timed like `--flushed`. `--mid`: validation of WAVE / WAVEW / PIPE / STAGE / auto (both RoPE
 * styles), bit-identity with WAVE's pe stage path, then mid T under graph replay with and
 * without the KF kernels (-s: the pe stage path), WAVEW, PIPE, auto and split_qk_norm alone,
 * and STAGE with and without KF at T = 32768 / 131072 timed like mlafuse bench. `--profile T`:
 * one unfused chain and one WAVE call per shape, no timing, for ncu. DEV_SLOT_IDENTITY=1: slots
 * in order instead of scattered blocks.
 */
#define MLAF_ROW_DEV_MODES /* PIPE, LAT, RUN and STAGE at any width too */
#include "row_v1.cuh"
#include "common.cuh"

#include <numeric>
#include <string>

struct kv_bufs {
    __nv_bfloat16 *L, *q, *kn, *kp, *cache;
    int64_t *pos, *slot;
    float *cs;
    int32_t *err;
};

static mlaf_row_args kv_args(const dev_shape &s, const kv_bufs &b, const __nv_bfloat16 *wq,
                             const __nv_bfloat16 *wkv, int64_t T, int64_t max_pos, int64_t nblocks,
                             int64_t bs, int neox, bool dense) {
    mlaf_row_args a = mlaf_row_args();
    a.T = T, a.Q = s.Q, a.C = s.C, a.R = s.R, a.eps_q = s.eps_q, a.eps_kv = s.eps_kv;
    a.latent = b.L, a.ls = s.Q + s.C + s.R, a.w_q = wq, a.w_kv = wkv;
    a.q = b.q, a.qs = s.Q;
    a.k_nope = dense ? b.kn : nullptr, a.ks = s.C;
    a.k_pe = dense ? b.kp : nullptr, a.ps = s.R;
    a.pos = b.pos, a.pos64 = 1, a.neox = neox, a.cos_sin = b.cs, a.cs_stride = s.R, a.max_pos = max_pos;
    a.slots = b.slot, a.slot64 = 1, a.cache_dt = MLAF_BF16, a.cache = b.cache;
    a.n_slots = nblocks * bs, a.block_size = bs, a.c_s0 = bs * (s.C + s.R), a.c_s1 = s.C + s.R;
    a.err = b.err;
    return a;
}

/* ---- the unfused chain's kernels 2 and 3 --------------------------------------------- */
__global__ void rope_sep(__nv_bfloat16 *kp, int64_t T, int R, const int64_t *pos, const float *cs, int64_t max_pos) {
    const int64_t g = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, h = R / 2;
    if (g >= T * h) return;
    const int64_t t = g / h, i = g % h, p = pos[t];
    if (p < 0 || p >= max_pos) return;
    __nv_bfloat16 *x = kp + t * R;
    const float c = cs[p * R + i], s = cs[p * R + h + i];
    const float x0 = __bfloat162float(x[2 * i]), x1 = __bfloat162float(x[2 * i + 1]);
    x[2 * i] = __float2bfloat16_rn(mlaf_rope_x0(x0, x1, c, s));
    x[2 * i + 1] = __float2bfloat16_rn(mlaf_rope_x1(x0, x1, c, s));
}
__global__ void cache_write_sep(const __nv_bfloat16 *kn, const __nv_bfloat16 *kp, int64_t T, int C, int R,
                                const int64_t *slot, __nv_bfloat16 *cache, int64_t n_slots) {
    const int per = (C + R) / 8;
    const int64_t g = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (g >= T * per) return;
    const int64_t t = g / per, v = g % per, sl = slot[t];
    if (sl < 0 || sl >= n_slots) return;
    const uint4 x = v < C / 8 ? reinterpret_cast<const uint4 *>(kn + t * C)[v]
                              : reinterpret_cast<const uint4 *>(kp + t * R)[v - C / 8];
    reinterpret_cast<uint4 *>(cache + sl * (C + R))[v] = x;
}

/* ---- validation ------------------------------------------------------------------------ */
/* TILE's ring and store path for the calls that follow (--tile) */
static int g_ring = 0;
static bool g_tile_lanes = false, g_kv_fast = true;

static const char *mode_name(int mode) {
    return mode == MLAF_ROW_WAVE1 ? "WAVE1" : mode == MLAF_ROW_WAVE ? "WAVE" : mode == MLAF_ROW_PIPE ? "PIPE" : mode == MLAF_ROW_LAT ? "LAT"
           : mode == MLAF_ROW_BLK ? "BLK" : mode == MLAF_ROW_BLKR ? "BLKR" : mode == MLAF_ROW_RUN ? "RUN" : mode == MLAF_ROW_STAGE ? "STAGE" : mode == MLAF_ROW_TILE ? (g_tile_lanes ? "TILE-L" : "TILE") : mode == MLAF_ROW_WAVEW ? "WAVEW" : "auto";
}
static mlaf_row_policy policy(int mode, int64_t max_blocks = 0, int blkr_g = 0, int run = 0, bool persist = false) {
    mlaf_row_policy p;
    p.mode = mode, p.max_blocks = max_blocks, p.blkr_g = blkr_g, p.run = run, p.persist = persist;
    p.ring = g_ring, p.tile_lanes = g_tile_lanes, p.kv_fast = g_kv_fast;
    return p;
}

/* ---- one timed case: buffers for T rows, rotated past L2 ----------------------------- */
struct kv_case {
    const dev_shape &s;
    int64_t T, W, CR, nblocks, nrot;
    const int64_t bs = 64, max_pos = 131072;
    const __nv_bfloat16 *dwq, *dwkv;
    kv_bufs b;
    size_t fused_bytes;
    int sms;

    kv_case(const dev_shape &s_, int64_t T_, float *dcs, const __nv_bfloat16 *wq, const __nv_bfloat16 *wkv)
        : s(s_), T(T_), dwq(wq), dwkv(wkv) {
        W = s.Q + s.C + s.R, CR = s.C + s.R;
        fused_bytes = (size_t)T * (2 * W + 4 * s.R + 16 + 2 * s.Q + 2 * CR);
        nrot = T <= 64 ? 4 : rotations(fused_bytes);
        nblocks = (T + bs - 1) / bs;
        sms = sm_count();
        CK(cudaMalloc(&b.L, (size_t)T * W * 2 * nrot));
        CK(cudaMalloc(&b.q, (size_t)T * s.Q * 2 * nrot));
        CK(cudaMalloc(&b.kn, (size_t)T * s.C * 2 * nrot));
        CK(cudaMalloc(&b.kp, (size_t)T * s.R * 2 * nrot));
        CK(cudaMalloc(&b.cache, (size_t)nblocks * bs * CR * 2 * nrot));
        CK(cudaMalloc(&b.pos, T * 8));
        CK(cudaMalloc(&b.slot, T * 8));
        b.cs = dcs;
        b.err = nullptr;
        dev_fill_bf16(b.L, (size_t)T * W * nrot);
        std::vector<int64_t> pos(T), slot(T), perm(nblocks);
        for (int64_t i = 0; i < nblocks; i++) perm[i] = (i * 7919) % nblocks; /* scattered blocks */
        if (std::gcd(nblocks, (int64_t)7919) != 1 || getenv("DEV_SLOT_IDENTITY"))
            for (int64_t i = 0; i < nblocks; i++) perm[i] = i;
        for (int64_t t = 0; t < T; t++) pos[t] = t % max_pos, slot[t] = perm[t / bs] * bs + t % bs;
        CK(cudaMemcpy(b.pos, pos.data(), T * 8, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(b.slot, slot.data(), T * 8, cudaMemcpyHostToDevice));
    }
    ~kv_case() {
        CK(cudaFree(b.L)); CK(cudaFree(b.q)); CK(cudaFree(b.kn)); CK(cudaFree(b.kp)); CK(cudaFree(b.cache));
        CK(cudaFree(b.pos)); CK(cudaFree(b.slot));
    }
    kv_bufs rot(int i) const {
        const int64_t r = i % nrot;
        kv_bufs x = b;
        x.L += r * T * W, x.q += r * T * s.Q, x.kn += r * T * s.C, x.kp += r * T * s.R;
        x.cache += r * nblocks * bs * CR;
        return x;
    }
    /* fused: q and the cache row only, as an engine calls it; mode -1 = auto */
    void fused(cudaStream_t st, int i, int mode, int g = 0, int run = 0, bool persist = false) const {
        CK(mlaf_row_launch<true>(kv_args(s, rot(i), dwq, dwkv, T, max_pos, nblocks, bs, 0, false), MLAF_BF16, sms, st,
                                 policy(mode, 0, g, run, persist)));
    }
    /* split_qk_norm alone (the chain's first kernel: q, k_nope, k_pe) */
    void split(cudaStream_t st, int i, int mode = -1, bool persist = false) const {
        CK(mlaf_row_launch<false>(kv_args(s, rot(i), dwq, dwkv, T, max_pos, nblocks, bs, 0, true), MLAF_BF16, sms, st,
                                  policy(mode, 0, 0, 0, persist)));
    }
    /* split_qk_norm's outputs of rotation set 0 under mode equal those of WAVE, bit for bit */
    bool split_same(int mode) const {
        const size_t nq = (size_t)T * s.Q, nk = (size_t)T * s.C, np = (size_t)T * s.R;
        std::vector<uint16_t> ref((nq + nk + np)), got(nq + nk + np);
        for (int pass = 0; pass < 2; pass++) {
            CK(cudaMemset(b.q, 0, nq * 2));
            CK(cudaMemset(b.kn, 0, nk * 2));
            CK(cudaMemset(b.kp, 0, np * 2));
            const bool kf = g_kv_fast;
            if (pass == 0) g_kv_fast = false; /* the reference: WAVE with run-time layout tests */
            split(0, 0, pass == 0 ? MLAF_ROW_WAVE : mode);
            g_kv_fast = kf;
            CK(cudaDeviceSynchronize());
            std::vector<uint16_t> &o = pass == 0 ? ref : got;
            CK(cudaMemcpy(o.data(), b.q, nq * 2, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(o.data() + nq, b.kn, nk * 2, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(o.data() + nq + nk, b.kp, np * 2, cudaMemcpyDeviceToHost));
        }
        const bool same = ref == got;
        printf("  split_qk_norm %s (ring %d, kf %d) vs WAVE, T=%lld: %s\n", mode_name(mode), g_ring, (int)g_kv_fast, (long long)T,
               same ? "bit-identical OK" : "FAIL");
        dev_failures += !same;
        return same;
    }
    /* the fused op's outputs of rotation set 0 (q, dense k_nope / k_pe, the whole cache) under
     * mode equal those of WAVE, bit for bit, both RoPE styles */
    bool fused_same(int mode) const {
        const size_t nq = (size_t)T * s.Q, nk = (size_t)T * s.C, np = (size_t)T * s.R,
                     nc = (size_t)nblocks * bs * CR;
        bool same = true;
        for (int neox : {0, 1}) {
            std::vector<uint16_t> ref(nq + nk + np + nc), got(nq + nk + np + nc);
            for (int pass = 0; pass < 2; pass++) {
                CK(cudaMemset(b.q, 0, nq * 2));
                CK(cudaMemset(b.kn, 0, nk * 2));
                CK(cudaMemset(b.kp, 0, np * 2));
                CK(cudaMemset(b.cache, 0x5a, nc * 2));
                mlaf_row_policy pol = policy(pass == 0 ? MLAF_ROW_WAVE : mode);
                if (pass == 0) pol.kv_fast = false; /* the reference: WAVE with the pe stage */
                CK(mlaf_row_launch<true>(kv_args(s, b, dwq, dwkv, T, max_pos, nblocks, bs, neox, true), MLAF_BF16, sms,
                                         0, pol));
                CK(cudaDeviceSynchronize());
                std::vector<uint16_t> &o = pass == 0 ? ref : got;
                CK(cudaMemcpy(o.data(), b.q, nq * 2, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(o.data() + nq, b.kn, nk * 2, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(o.data() + nq + nk, b.kp, np * 2, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(o.data() + nq + nk + np, b.cache, nc * 2, cudaMemcpyDeviceToHost));
            }
            same = same && ref == got;
        }
        printf("  mla_kv_cache %s (ring %d, kv_fast %d) vs WAVE with the pe stage, T=%lld, both styles: %s\n",
               mode_name(mode), g_ring, (int)g_kv_fast, (long long)T, same ? "bit-identical OK" : "FAIL");
        dev_failures += !same;
        return same;
    }
    void unfused(cudaStream_t st, int i) const {
        const kv_bufs x = rot(i);
        mlaf_row_args a = kv_args(s, x, dwq, dwkv, T, max_pos, nblocks, bs, 0, true);
        CK(mlaf_row_launch<false>(a, MLAF_BF16, sms, st));
        const int64_t np = T * (s.R / 2), nc = T * (CR / 8);
        rope_sep<<<(unsigned)((np + 255) / 256), 256, 0, st>>>(x.kp, T, s.R, x.pos, x.cs, max_pos);
        cache_write_sep<<<(unsigned)((nc + 255) / 256), 256, 0, st>>>(x.kn, x.kp, T, s.C, s.R, x.slot, x.cache,
                                                                      nblocks * bs);
    }
    double graph_fused(int mode, int g = 0) const {
        return graph_us([&](cudaStream_t st, int i) { fused(st, i, mode, g); });
    }
    double graph_unfused() const {
        return graph_us([&](cudaStream_t st, int i) { unfused(st, i); });
    }
};

static bool validate(const dev_shape &s, int neox, const std::vector<uint16_t> &wq, const std::vector<uint16_t> &wkv,
                     const __nv_bfloat16 *dwq, const __nv_bfloat16 *dwkv, int mode, int g = 0,
                     int64_t cap = 7) {
    const int64_t T = 999, W = s.Q + s.C + s.R, bs = 16, nblocks = 80, max_pos = 1000, CR = s.C + s.R;
    dev_rng rng(11 + neox);
    std::vector<uint16_t> L((size_t)T * W);
    for (auto &x : L) x = f2bf((float)rng.normal());
    std::vector<int64_t> pos(T), slot(T);
    int32_t want_err = 0;
    for (int64_t t = 0; t < T; t++) {
        pos[t] = (int64_t)(rng.uniform() * max_pos);
        slot[t] = (t * 37) % (nblocks * bs); /* distinct: 37 is prime to 1280 */
        if (t % 50 == 7) slot[t] = -1;
        if (t % 97 == 3) slot[t] = nblocks * bs + t;
        if (t % 89 == 5) pos[t] = max_pos + t;
        want_err += slot[t] >= nblocks * bs || pos[t] >= max_pos;
    }
    std::vector<float> cs;
    make_cos_sin(cs, (int)max_pos, s.R);
    kv_bufs b;
    const size_t cache_n = (size_t)nblocks * bs * CR;
    CK(cudaMalloc(&b.L, L.size() * 2));
    CK(cudaMalloc(&b.q, (size_t)T * s.Q * 2));
    CK(cudaMalloc(&b.kn, (size_t)T * s.C * 2));
    CK(cudaMalloc(&b.kp, (size_t)T * s.R * 2));
    CK(cudaMalloc(&b.cache, cache_n * 2));
    CK(cudaMalloc(&b.pos, T * 8));
    CK(cudaMalloc(&b.slot, T * 8));
    CK(cudaMalloc(&b.cs, cs.size() * 4));
    CK(cudaMalloc(&b.err, 4));
    CK(cudaMemcpy(b.L, L.data(), L.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b.pos, pos.data(), T * 8, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b.slot, slot.data(), T * 8, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b.cs, cs.data(), cs.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(b.q, 0xff, (size_t)T * s.Q * 2));
    CK(cudaMemset(b.kn, 0xff, (size_t)T * s.C * 2));
    CK(cudaMemset(b.kp, 0xff, (size_t)T * s.R * 2));
    CK(cudaMemset(b.cache, 0xee, cache_n * 2));
    CK(cudaMemset(b.err, 0, 4));
    CK(mlaf_row_launch<true>(kv_args(s, b, dwq, dwkv, T, max_pos, nblocks, bs, neox, true), MLAF_BF16, sm_count(), 0,
                             policy(mode, mode == MLAF_ROW_LAT ? 0 : cap, g))); /* 7 blocks: ~36 rows per warp */
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> q((size_t)T * s.Q), kn((size_t)T * s.C), kp((size_t)T * s.R), cache(cache_n);
    int32_t err = 0;
    CK(cudaMemcpy(q.data(), b.q, q.size() * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(kn.data(), b.kn, kn.size() * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(kp.data(), b.kp, kp.size() * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(cache.data(), b.cache, cache_n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&err, b.err, 4, cudaMemcpyDeviceToHost));

    double worst = 0;
    int64_t pe_bad = 0, cache_bad = 0, untouched_bad = 0;
    std::vector<char> named(nblocks * bs, 0);
    std::vector<double> ref(W);
    const int h = s.R / 2;
    for (int64_t t = 0; t < T; t++) {
        ref_split_row(&L[t * W], s, wq.data(), wkv.data(), ref.data());
        for (int i = 0; i < s.Q; i++) worst = std::max(worst, bf16_ulps(q[t * s.Q + i], ref[i]));
        for (int j = 0; j < s.C; j++) worst = std::max(worst, bf16_ulps(kn[t * s.C + j], ref[s.Q + j]));
        const bool ok = slot[t] < nblocks * bs && pos[t] < max_pos;
        std::vector<uint16_t> pe(s.R, 0xffff); /* expected dense k_pe: untouched (poison) if !ok */
        if (ok)
            for (int i = 0; i < h; i++) {
                const int i0 = neox ? i : 2 * i, i1 = neox ? i + h : 2 * i + 1;
                float y0, y1;
                ref_rope_pair(bf2f(L[t * W + s.Q + s.C + i0]), bf2f(L[t * W + s.Q + s.C + i1]),
                              cs[pos[t] * s.R + i], cs[pos[t] * s.R + h + i], &y0, &y1);
                pe[i0] = f2bf(y0), pe[i1] = f2bf(y1);
            }
        for (int r = 0; r < s.R; r++) pe_bad += kp[t * s.R + r] != pe[r];
        if (ok && slot[t] >= 0) {
            named[slot[t]] = 1;
            const uint16_t *row = &cache[(size_t)slot[t] * CR];
            for (int j = 0; j < s.C; j++) worst = std::max(worst, bf16_ulps(row[j], ref[s.Q + j]));
            for (int r = 0; r < s.R; r++) cache_bad += row[s.C + r] != pe[r];
        }
    }
    for (int64_t sl = 0; sl < nblocks * bs; sl++)
        if (!named[sl])
            for (int64_t e = 0; e < CR; e++) untouched_bad += cache[sl * CR + e] != 0xeeee;
    const bool pass = worst <= 1.0 && pe_bad == 0 && cache_bad == 0 && untouched_bad == 0 && err == want_err;
    printf("  validate fused %-4s%s%s %-11s T=%lld: worst %.3f ulp, k_pe mismatches %lld, cache pe mismatches %lld, "
           "unnamed rows changed %lld, error_count %d (want %d)  %s\n",
           mode_name(mode), g == 64 ? "/64" : g == 128 ? "/128" : "", cap ? "" : " (full grid)", neox ? "neox" : "interleaved", (long long)T, worst, (long long)pe_bad, (long long)cache_bad,
           (long long)untouched_bad, err, want_err, pass ? "OK" : "FAIL");
    CK(cudaFree(b.L)); CK(cudaFree(b.q)); CK(cudaFree(b.kn)); CK(cudaFree(b.kp)); CK(cudaFree(b.cache));
    CK(cudaFree(b.pos)); CK(cudaFree(b.slot)); CK(cudaFree(b.cs)); CK(cudaFree(b.err));
    dev_failures += !pass;
    return pass;
}

/* Registers and resident blocks per SM of a block kernel at its block size (the one-wave
 * bound of BLK / BLKR is resident x SMs rows). */
template <class K> static void print_occupancy(const char *name, K kernel, int threads, size_t smem) {
    cudaFuncAttributes fa;
    int n = 0;
    CK(cudaFuncGetAttributes(&fa, kernel));
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem));
    printf("  %-4s %3d threads, %3d registers, %lld B local: %d blocks per SM -> one wave up to T = %d\n", name,
           threads, fa.numRegs, (long long)fa.localSizeBytes, n, n * sm_count());
}

/* Large T, the streaming shapes side by side in two interleaved rounds (us, % of copy): fused
 * WAVE, STAGE, RUN with 2 rows per warp, PIPE, auto; split_qk_norm auto and STAGE (checked
 * bit-identical to WAVE first). (RUN 4 / 8 / 16 lost to RUN 2 on the H200: 207.9 / 214.0 /
 * 219.8 vs 201.2 us, GLM T = 131072.) */
static void large(const dev_shape &s, float *dcs, const __nv_bfloat16 *dwq, const __nv_bfloat16 *dwkv, double copy) {
    printf("  %7s %5s %8s %14s %14s %14s %14s %14s %14s %14s\n", "T", "round", "unfused", "WAVE", "STAGE", "RUN2",
           "PIPE", "auto", "split auto", "split STAGE");
    for (int64_t T : {8192, 32768, 49152, 65536, 98304, 131072}) {
        kv_case k(s, T, dcs, dwq, dwkv);
        k.split_same(MLAF_ROW_STAGE);
        for (int round = 0; round < 2; round++) {
            const double uf = time_us([&](int i) { k.unfused(0, i); });
            double t[5];
            t[0] = time_us([&](int i) { k.fused(0, i, MLAF_ROW_WAVE); });
            t[1] = time_us([&](int i) { k.fused(0, i, MLAF_ROW_STAGE); });
            t[2] = time_us([&](int i) { k.fused(0, i, MLAF_ROW_RUN, 0, 2); });
            t[3] = time_us([&](int i) { k.fused(0, i, MLAF_ROW_PIPE); });
            t[4] = time_us([&](int i) { k.fused(0, i, -1); });
            printf("  %7lld %5d %8.2f", (long long)T, round, uf);
            for (double x : t) printf(" %7.2f (%4.1f%%)", x, 100.0 * k.fused_bytes / (x * 1e-6) / 1e9 / copy);
            const double sp = time_us([&](int i) { k.split(0, i); });
            const double ss = time_us([&](int i) { k.split(0, i, MLAF_ROW_STAGE); });
            const double sb = (double)T * 4 * (s.Q + s.C + s.R);
            printf(" %7.2f (%4.1f%%) %7.2f (%4.1f%%)\n", sp, 100.0 * sb / (sp * 1e-6) / 1e9 / copy, ss,
                   100.0 * sb / (ss * 1e-6) / 1e9 / copy);
        }
    }
}

__global__ void dev_empty_kernel() {}

/* One table of large-T rows timed as mlafuse bench times it (L2 flushed clean before each of 30
 * samples, median): per T, a cudaMemcpyAsync of the fused op's bytes, then the seven columns
 * cols(k, fl, t) fills into t[1..7] (the first four the fused op, the last three split_qk_norm;
 * us, % of the 1 GiB copy). */
template <class F>
static void flushed_table(const dev_shape &s, float *dcs, const __nv_bfloat16 *dwq, const __nv_bfloat16 *dwkv,
                          double copy, const char *const names[8], F cols) {
    flusher fl;
    printf("  %7s", "T");
    for (int i = 0; i < 8; i++) printf(" %15s", names[i]);
    printf("\n");
    for (int64_t T : {16384, 32768, 65536, 131072}) {
        kv_case k(s, T, dcs, dwq, dwkv);
        const double sb = (double)T * 4 * (s.Q + s.C + s.R);
        void *src, *dst;
        CK(cudaMalloc(&src, k.fused_bytes / 2 + 16));
        CK(cudaMalloc(&dst, k.fused_bytes / 2 + 16));
        double t[8];
        t[0] = flushed_us(fl, [&] { CK(cudaMemcpyAsync(dst, src, k.fused_bytes / 2, cudaMemcpyDeviceToDevice)); });
        cols(k, fl, t);
        CK(cudaFree(src));
        CK(cudaFree(dst));
        printf("  %7lld", (long long)T);
        for (int i = 0; i < 8; i++) {
            const double by = i < 5 ? (double)k.fused_bytes : sb;
            printf(" %7.2f (%4.1f%%)", t[i], 100.0 * by / (t[i] * 1e-6) / 1e9 / copy);
        }
        printf("\n");
    }
}

/* WAVE, STAGE and STAGE on a persistent grid (12 resident blocks x SMs, each warp striding over
 * rows) for both ops, with an empty kernel timed the same way. */
static void flushed(const dev_shape &s, float *dcs, const __nv_bfloat16 *dwq, const __nv_bfloat16 *dwkv, double copy) {
    {
        flusher fl;
        printf("  empty kernel %.2f us\n", flushed_us(fl, [&] { dev_empty_kernel<<<1, 32>>>(); }));
    }
    const char *const names[8] = {"memcpy", "WAVE", "STAGE", "STAGE-P", "auto", "split WAVE", "split STAGE",
                                  "split STAGE-P"};
    flushed_table(s, dcs, dwq, dwkv, copy, names, [&](const kv_case &k, const flusher &fl, double *t) {
        t[1] = flushed_us(fl, [&] { k.fused(0, 0, MLAF_ROW_WAVE); });
        t[2] = flushed_us(fl, [&] { k.fused(0, 0, MLAF_ROW_STAGE); });
        t[3] = flushed_us(fl, [&] { k.fused(0, 0, MLAF_ROW_STAGE, 0, 0, true); });
        t[4] = flushed_us(fl, [&] { k.fused(0, 0, -1); });
        t[5] = flushed_us(fl, [&] { k.split(0, 0, MLAF_ROW_WAVE); });
        t[6] = flushed_us(fl, [&] { k.split(0, 0, MLAF_ROW_STAGE); });
        t[7] = flushed_us(fl, [&] { k.split(0, 0, MLAF_ROW_STAGE, true); });
    });
}

/* Sustained time per call: after one flush, K = 20 calls back to back on the case's rotated
 * buffer sets (no set is in L2 when its call starts), timed between two events; median of 9
 * trains / K. A call can leave at most one L2 of dirty output unwritten when its window ends;
 * in a train only the last call can, so a store or load policy that merely leaves more of its
 * writes in L2 gains 1/K as much here as in a single flushed call. */
template <class F> static double train_us(const flusher &fl, F launch, int K = 20) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> ms(9);
    for (int i = 0; i < K; i++) launch(i);
    for (int r = 0; r < 9; r++) {
        fl(r);
        CK(cudaEventRecord(a));
        for (int i = 0; i < K; i++) launch(i);
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&ms[r], a, b));
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    std::sort(ms.begin(), ms.end());
    return 1000.0 * ms[4] / K;
}

/* WAVE against STAGE (and auto) for both ops, single-call flushed (as mlafuse bench) and
 * sustained (train_us), us per call, with a memcpy of the same bytes timed both ways. */
static void train_study(const dev_shape &s, float *dcs, const __nv_bfloat16 *dwq, const __nv_bfloat16 *dwkv) {
    flusher fl;
    const char *names[3] = {"WAVE", "STAGE", "auto"};
    const int modes[3] = {MLAF_ROW_WAVE, MLAF_ROW_STAGE, -1};
    for (int64_t T : {16384, 32768, 65536, 131072}) {
        kv_case k(s, T, dcs, dwq, dwkv);
        void *src, *dst;
        const size_t half = k.fused_bytes / 2;
        CK(cudaMalloc(&src, 2 * half + 16));
        CK(cudaMalloc(&dst, 2 * half + 16));
        const double m1 = flushed_us(fl, [&] { CK(cudaMemcpyAsync(dst, src, half, cudaMemcpyDeviceToDevice)); });
        const double mt = train_us(fl, [&](int i) {
            CK(cudaMemcpyAsync((char *)dst + (i & 1) * half, (char *)src + (i & 1) * half, half, cudaMemcpyDeviceToDevice));
        });
        CK(cudaFree(src));
        CK(cudaFree(dst));
        printf("  T=%lld (buffer sets %lld) memcpy of the mla bytes: single %.2f, train %.2f us\n", (long long)T,
               (long long)k.nrot, m1, mt);
        printf("  %8s %14s %14s %14s %14s\n", "", "mla single", "mla train", "split single", "split train");
        for (int round = 0; round < 2; round++)
            for (int c = 0; c < 3; c++) {
                double r[4];
                r[0] = flushed_us(fl, [&] { k.fused(0, 0, modes[c]); });
                r[1] = train_us(fl, [&](int i) { k.fused(0, i, modes[c]); });
                r[2] = flushed_us(fl, [&] { k.split(0, 0, modes[c]); });
                r[3] = train_us(fl, [&](int i) { k.split(0, i, modes[c]); });
                printf("  %8s %14.2f %14.2f %14.2f %14.2f\n", names[c], r[0], r[1], r[2], r[3]);
            }
    }
}

/* RUN (each warp a run of rows, the next token's position and slot loaded one row ahead, so its
 * cos/sin fetch leaves with the row's loads) with 2 / 3 / 4 rows per warp against WAVE for
 * mla_kv_cache, single-call flushed and sustained, us; RUN 4 checked bit-identical to WAVE
 * first. */
static void run_study(const dev_shape &s, float *dcs, const __nv_bfloat16 *dwq, const __nv_bfloat16 *dwkv) {
    {
        kv_case k(s, 32768 + 1234, dcs, dwq, dwkv);
        k.fused_same(MLAF_ROW_RUN);
    }
    flusher fl;
    for (int64_t T : {32768, 131072}) {
        kv_case k(s, T, dcs, dwq, dwkv);
        printf("  T=%lld %8s %12s %12s\n", (long long)T, "", "mla single", "mla train");
        for (int round = 0; round < 2; round++)
            for (int run : {0, 2, 3, 4}) {
                const int mode = run ? MLAF_ROW_RUN : MLAF_ROW_WAVE;
                const double a1 = flushed_us(fl, [&] { k.fused(0, 0, mode, 0, run); });
                const double a2 = train_us(fl, [&](int j) { k.fused(0, j, mode, 0, run); });
                printf("  %8s %6s %d %12.2f %12.2f\n", "", run ? "RUN" : "WAVE", run, a1, a2);
            }
    }
}

/* TILE (rows streamed through a ring of shared-memory slots, bulk loads and bulk stores) at
 * large T, timed as mlafuse bench times it, against auto (STAGE / WAVE); validated and checked
 * bit-identical to WAVE first. */
static void tile_flushed(const dev_shape &s, float *dcs, const __nv_bfloat16 *dwq, const __nv_bfloat16 *dwkv,
                         double copy) {
    for (int lanes : {0, 1}) {
        g_ring = 3, g_tile_lanes = lanes;
        kv_case k(s, 32768 + 1234, dcs, dwq, dwkv);
        k.fused_same(MLAF_ROW_TILE);
        k.split_same(MLAF_ROW_TILE);
    }
    g_ring = 0, g_tile_lanes = false;
    const char *const names[8] = {"memcpy", "auto", "TILE r3", "TILE-L r2", "TILE-L r3", "split auto",
                                  "split TILE r3", "split TILE-L r3"};
    flushed_table(s, dcs, dwq, dwkv, copy, names, [&](const kv_case &k, const flusher &fl, double *t) {
        t[1] = flushed_us(fl, [&] { k.fused(0, 0, -1); });
        g_ring = 3;
        t[2] = flushed_us(fl, [&] { k.fused(0, 0, MLAF_ROW_TILE); });
        g_tile_lanes = true, g_ring = 2;
        t[3] = flushed_us(fl, [&] { k.fused(0, 0, MLAF_ROW_TILE); });
        g_ring = 3;
        t[4] = flushed_us(fl, [&] { k.fused(0, 0, MLAF_ROW_TILE); });
        g_tile_lanes = false, g_ring = 0;
        t[5] = flushed_us(fl, [&] { k.split(0, 0, -1); });
        g_ring = 3;
        t[6] = flushed_us(fl, [&] { k.split(0, 0, MLAF_ROW_TILE); });
        g_tile_lanes = true;
        t[7] = flushed_us(fl, [&] { k.split(0, 0, MLAF_ROW_TILE); });
        g_tile_lanes = false, g_ring = 0;
    });
}

/* Mid T under graph replay: WAVE, WAVEW (blocks of 8 warps that stage the weights in shared
 * memory while their rows are in flight), PIPE and auto (us per call; speed-ups over the
 * unfused chain). */
static void mid(const dev_shape &s, float *dcs, const __nv_bfloat16 *dwq, const __nv_bfloat16 *dwkv) {
    {
        kv_case k(s, 2048 + 77, dcs, dwq, dwkv);
        for (int mode : {(int)MLAF_ROW_WAVE, (int)MLAF_ROW_WAVEW, (int)MLAF_ROW_PIPE, (int)MLAF_ROW_STAGE})
            k.fused_same(mode);
        k.split_same(MLAF_ROW_WAVE);
        k.split_same(-1);
    }
    printf("  %6s %8s %7s %7s %7s %7s %7s %7s %7s %7s %7s %8s %8s\n", "T", "unfused", "split-s", "split", "WAVE-s",
           "WAVE", "WAVEW-s", "WAVEW", "PIPE", "auto-s", "auto", "auto-s/uf", "auto/uf");
    for (int64_t T : {512, 1024, 1536, 2048, 3072, 4096, 6144}) {
        kv_case k(s, T, dcs, dwq, dwkv);
        for (int round = 0; round < 2; round++) {
            g_kv_fast = false;
            const double uf = k.graph_unfused(), ws = k.graph_fused(MLAF_ROW_WAVE), wws = k.graph_fused(MLAF_ROW_WAVEW),
                         aus = k.graph_fused(-1), sps = graph_us([&](cudaStream_t st, int i) { k.split(st, i); });
            g_kv_fast = true;
            const double wa = k.graph_fused(MLAF_ROW_WAVE), ww = k.graph_fused(MLAF_ROW_WAVEW),
                         pi = k.graph_fused(MLAF_ROW_PIPE), au = k.graph_fused(-1),
                         sp = graph_us([&](cudaStream_t st, int i) { k.split(st, i); });
            printf("  %6lld %8.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2fx %7.2fx\n", (long long)T, uf,
                   sps, sp, ws, wa, wws, ww, pi, aus, au, uf / aus, uf / au);
        }
    }
    /* large T, timed like mlafuse bench: STAGE with the pe stage (-s) and with the register pe */
    flusher fl;
    for (int64_t T : {32768, 131072}) {
        kv_case k(s, T, dcs, dwq, dwkv);
        for (int round = 0; round < 2; round++) {
            g_kv_fast = false;
            const double st0 = flushed_us(fl, [&] { k.fused(0, 0, MLAF_ROW_STAGE); });
            const double sp0 = flushed_us(fl, [&] { k.split(0, 0, -1); });
            g_kv_fast = true;
            const double st1 = flushed_us(fl, [&] { k.fused(0, 0, MLAF_ROW_STAGE); });
            const double sp1 = flushed_us(fl, [&] { k.split(0, 0, -1); });
            printf("  T=%lld flushed: STAGE-s %.2f us, STAGE %.2f us; split auto-s %.2f us, split auto %.2f us\n",
                   (long long)T, st0, st1, sp0, sp1);
        }
    }
}

/* The small / medium T sweep (graph replay, us per call) that sets the BLKR / WAVE threshold. */
static void sweep(const dev_shape &s, float *dcs, const __nv_bfloat16 *dwq, const __nv_bfloat16 *dwkv) {
    const int W = 8, nn = (s.Q + s.C) / W, nvec = (s.Q + s.C + s.R) / W, sms = sm_count();
    if (nvec <= 256) print_occupancy("BLK", mlaf_row_block_kernel<__nv_bfloat16, 1, true>, 256, 4 * s.R * 4);
    else print_occupancy("BLK", mlaf_row_block_kernel<__nv_bfloat16, 2, true>, 256, 4 * s.R * 4);
    print_occupancy("BLKR", mlaf_row_blockr_kernel<__nv_bfloat16, 1>, mlaf_rowr_threads(nn), s.R * 4);
    if (nn > 128 && nn <= 256) {
        print_occupancy("B128", mlaf_row_blockr_kernel<__nv_bfloat16, 2, 128>, mlaf_rowr_threads(nn, 128), s.R * 4);
        print_occupancy("B64", mlaf_row_blockr_kernel<__nv_bfloat16, 4, 64>, mlaf_rowr_threads(nn, 64), s.R * 4);
    }
    printf("  %6s %8s %7s %7s %7s %7s %7s %7s %7s %8s %6s   %s\n", "T", "unfused", "WAVE", "PIPE", "BLKR", "B128",
           "B64", "auto", "best", "speedup", "", "(graph replay, us per call; speedup = unfused / best)");
    for (int64_t T : {1, 8, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 16384}) {
        kv_case k(s, T, dcs, dwq, dwkv);
        const double uf = k.graph_unfused(), wa = k.graph_fused(MLAF_ROW_WAVE), pi = k.graph_fused(MLAF_ROW_PIPE),
                     br = k.graph_fused(MLAF_ROW_BLKR), b128 = k.graph_fused(MLAF_ROW_BLKR, 128),
                     b64 = k.graph_fused(MLAF_ROW_BLKR, 64), au = k.graph_fused(-1);
        const double t[5] = {wa, pi, br, b128, b64};
        const char *nm[5] = {"WAVE", "PIPE", "BLKR", "B128", "B64"};
        int bi = 0;
        for (int i = 1; i < 5; i++)
            if (t[i] < t[bi]) bi = i;
        printf("  %6lld %8.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7s %7.2fx %5.2fx\n", (long long)T, uf, wa, pi, br,
               b128, b64, au, nm[bi], uf / t[bi], uf / au);
    }
}

int main(int argc, char **argv) {
    bool do_train = false, do_run = false;
    bool quick = false, do_sweep = false, do_large = false, do_flushed = false, do_tile = false, do_mid = false;
    int64_t prof_T = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--sweep")) do_sweep = true;
        else if (!strcmp(argv[i], "--large")) do_large = true;
        else if (!strcmp(argv[i], "--flushed")) do_flushed = true;
        else if (!strcmp(argv[i], "--tile")) do_tile = true;
        else if (!strcmp(argv[i], "--mid")) do_mid = true;
        else if (!strcmp(argv[i], "--train")) do_train = do_flushed = true;
        else if (!strcmp(argv[i], "--run")) do_run = do_flushed = true;
        else if (!strcmp(argv[i], "--profile") && i + 1 < argc) prof_T = atoll(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--quick] [--sweep] [--large] [--flushed] [--tile] [--mid] [--train] [--run] [--profile T]\n", argv[0]);
            return 2;
        }
    }
    printf("== mla_kv_cache v1: fused library kernel vs split + rope + cache-write kernels%s\n",
           do_sweep ? " (sweep)" : "");
    print_device();
    const bool no_copy = do_sweep || do_mid;
    const double copy = no_copy ? 0.0 : copy_gbps();
    if (!no_copy) printf("device-to-device copy (same run): %.0f GB/s\n", copy);
    for (const dev_shape &s : dev_shapes) {
        const int64_t max_pos = 131072;
        printf("\n-- %s: Q=%d C=%d R=%d, paged cache block_size 64, bf16\n", s.name, s.Q, s.C, s.R);
        dev_rng rng(3);
        std::vector<uint16_t> wq(s.Q), wkv(s.C);
        fill_bf16(wq, rng, 1.0, 0.2);
        fill_bf16(wkv, rng, 1.0, 0.2);
        __nv_bfloat16 *dwq, *dwkv;
        CK(cudaMalloc(&dwq, s.Q * 2));
        CK(cudaMalloc(&dwkv, s.C * 2));
        CK(cudaMemcpy(dwq, wq.data(), s.Q * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dwkv, wkv.data(), s.C * 2, cudaMemcpyHostToDevice));
        if (do_mid) {
            for (int mode : {(int)MLAF_ROW_WAVE, (int)MLAF_ROW_WAVEW, (int)MLAF_ROW_PIPE, (int)MLAF_ROW_STAGE, -1})
                for (int neox : {0, 1}) {
                    validate(s, neox, wq, wkv, dwq, dwkv, mode);
                    validate(s, neox, wq, wkv, dwq, dwkv, mode, 0, 0);
                }
        }
        if (do_tile) {
            g_tile_lanes = true;
            g_ring = 3;
            for (int neox : {0, 1}) validate(s, neox, wq, wkv, dwq, dwkv, MLAF_ROW_TILE);
            g_tile_lanes = false;
            for (int ring : {3, 4}) {
                g_ring = ring;
                for (int neox : {0, 1}) {
                    validate(s, neox, wq, wkv, dwq, dwkv, MLAF_ROW_TILE);       /* 7 blocks: long rings */
                    validate(s, neox, wq, wkv, dwq, dwkv, MLAF_ROW_TILE, 0, 0); /* full grid */
                }
            }
            g_ring = 0;
        }
        for (int mode = -1; mode <= MLAF_ROW_STAGE && prof_T == 0 && !do_flushed && !do_tile && !do_mid; mode++) {
            validate(s, 0, wq, wkv, dwq, dwkv, mode);
            validate(s, 1, wq, wkv, dwq, dwkv, mode);
        }
        for (int neox : {0, 1}) {
            if (prof_T > 0 || do_flushed || do_tile || do_mid) break;
            validate(s, neox, wq, wkv, dwq, dwkv, MLAF_ROW_RUN, 0, 0); /* runs of 4, full grid */
            validate(s, neox, wq, wkv, dwq, dwkv, MLAF_ROW_STAGE, 0, 0); /* one row per warp */
            for (int g : {64, 128}) validate(s, neox, wq, wkv, dwq, dwkv, MLAF_ROW_BLKR, g); /* mid-T shapes */
        }

        std::vector<float> cs;
        make_cos_sin(cs, (int)max_pos, s.R);
        float *dcs;
        CK(cudaMalloc(&dcs, cs.size() * 4));
        CK(cudaMemcpy(dcs, cs.data(), cs.size() * 4, cudaMemcpyHostToDevice));
        if (prof_T > 0) {
            /* one unfused chain and one fused WAVE call per shape, for a profiler; no timing */
            kv_case k(s, prof_T, dcs, dwq, dwkv);
            k.unfused(0, 0);
            k.fused(0, 1, MLAF_ROW_WAVE);
            CK(cudaDeviceSynchronize());
            CK(cudaFree(dcs)); CK(cudaFree(dwq)); CK(cudaFree(dwkv));
            continue;
        }
        if (do_tile || do_mid || do_flushed || do_large || do_sweep) { /* one study per run */
            if (do_tile) tile_flushed(s, dcs, dwq, dwkv, copy);
            else if (do_mid) mid(s, dcs, dwq, dwkv);
            else if (do_run) run_study(s, dcs, dwq, dwkv);
            else if (do_train) train_study(s, dcs, dwq, dwkv);
            else if (do_flushed) flushed(s, dcs, dwq, dwkv, copy);
            else if (do_large) large(s, dcs, dwq, dwkv, copy);
            else sweep(s, dcs, dwq, dwkv);
            CK(cudaFree(dcs)); CK(cudaFree(dwq)); CK(cudaFree(dwkv));
            continue;
        }
        printf("  %8s %12s %12s %8s %10s %8s   %s\n", "T", "unfused us", "fused us", "speedup", "fused GB/s", "% copy",
               "fused WAVE / PIPE / LAT / BLK / BLKR us");
        std::vector<int64_t> Ts = {1, 8, 64, 512, 4096, 32768};
        if (!quick) Ts.push_back(131072);
        for (int64_t T : Ts) {
            kv_case k(s, T, dcs, dwq, dwkv);
            double uf, fu, fm[MLAF_ROW_BLKR + 1];
            if (T <= 4096) {
                uf = k.graph_unfused();
                for (int mode = MLAF_ROW_WAVE; mode <= MLAF_ROW_BLKR; mode++) fm[mode] = k.graph_fused(mode);
                fu = k.graph_fused(-1);
            } else {
                uf = time_us([&](int i) { k.unfused(0, i); });
                for (int mode = MLAF_ROW_WAVE; mode <= MLAF_ROW_BLKR; mode++)
                    fm[mode] = time_us([&](int i) { k.fused(0, i, mode); });
                fu = time_us([&](int i) { k.fused(0, i, -1); });
            }
            const double gbs = k.fused_bytes / (fu * 1e-6) / 1e9;
            printf("  %8lld %12.2f %12.2f %7.2fx %10.0f %7.1f%%   %.2f / %.2f / %.2f / %.2f / %.2f%s\n", (long long)T, uf,
                   fu, uf / fu, gbs, 100.0 * gbs / copy, fm[0], fm[1], fm[2], fm[3], fm[4],
                   T <= 4096 ? "   (graph replay, us per call)" : "");
        }
        CK(cudaFree(dcs)); CK(cudaFree(dwq)); CK(cudaFree(dwkv));
    }
    return dev_failures ? 1 : 0;
}
