/*
 * split_qk_norm_v2 — one warp per row, 16-byte vectors, the row held in registers.
 *
 * 1. Warp w owns row t; lane l loads vectors l, l+32, ... (8 bf16 each) — all of them before
 *    any arithmetic, so the row's whole 2.7-4.2 KB is in flight at once.
 * 2. Sums of squares of q and kv from the registers; two 5-step shuffle reductions, no
 *    shared memory, no barriers.
 * 3. Scale, multiply by the weights (16-byte __ldg, L1-resident) and store 16-byte vectors
 *    with streaming stores (__stcs); k_pe vectors are stored as loaded.
 * Needs Q, C, R multiples of 8 and 16-byte aligned rows (true for every preset).
 * Launch shapes compared: WARPS rows per block (1, 2, 4, 8), one row per warp (grid =
 * T / WARPS), and a persistent grid (grid = k * SMs, warps stride over rows).
 * NV = vectors per lane is a template parameter: 6 for GLM-4.7-Flash (168 vectors), 9 for
 * DeepSeek-V3 (264) — compile-time unrolled, so the row stays in registers.
 */
#include "split_bench.cuh"

static __device__ __forceinline__ void unpack8(const uint4 &v, float *f) {
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; k++) f[2 * k] = __uint_as_float(u[k] << 16), f[2 * k + 1] = __uint_as_float(u[k] & 0xffff0000u);
}
static __device__ __forceinline__ uint32_t pack2(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t *>(&h);
}

template <int NV, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) split_v2(const split_args a) {
    const int lane = threadIdx.x & 31;
    const int qv = a.Q / 8, cv = a.C / 8, nv = (a.Q + a.C + a.R) / 8;
    for (int64_t t = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5); t < a.T; t += (int64_t)gridDim.x * WARPS) {
        const uint4 *src = reinterpret_cast<const uint4 *>(a.latent + t * a.ls);
        uint4 v[NV];
#pragma unroll
        for (int s = 0; s < NV; s++)
            if (lane + 32 * s < nv) v[s] = __ldcs(src + lane + 32 * s);
        float sq = 0, skv = 0;
#pragma unroll
        for (int s = 0; s < NV; s++) {
            const int c = lane + 32 * s;
            if (c < qv + cv) {
                float f[8], acc = 0;
                unpack8(v[s], f);
#pragma unroll
                for (int k = 0; k < 8; k++) acc = fmaf(f[k], f[k], acc);
                if (c < qv) sq += acc; else skv += acc;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            sq += __shfl_xor_sync(0xffffffffu, sq, o);
            skv += __shfl_xor_sync(0xffffffffu, skv, o);
        }
        const float rq = __fdiv_rn(1.0f, __fsqrt_rn(sq / a.Q + a.eps_q));
        const float rkv = __fdiv_rn(1.0f, __fsqrt_rn(skv / a.C + a.eps_kv));
#pragma unroll
        for (int s = 0; s < NV; s++) {
            const int c = lane + 32 * s;
            if (c >= nv) continue;
            if (c >= qv + cv) {
                __stcs(reinterpret_cast<uint4 *>(a.k_pe + t * a.ps) + (c - qv - cv), v[s]);
                continue;
            }
            const bool isq = c < qv;
            const int j = isq ? c : c - qv;
            const float r = isq ? rq : rkv;
            float f[8], w[8];
            unpack8(v[s], f);
            unpack8(__ldg(reinterpret_cast<const uint4 *>(isq ? a.wq : a.wkv) + j), w);
            uint4 o = make_uint4(pack2(f[0] * r * w[0], f[1] * r * w[1]), pack2(f[2] * r * w[2], f[3] * r * w[3]),
                                 pack2(f[4] * r * w[4], f[5] * r * w[5]), pack2(f[6] * r * w[6], f[7] * r * w[7]));
            __stcs(reinterpret_cast<uint4 *>(isq ? a.q + t * a.qs : a.k_nope + t * a.ks) + j, o);
        }
    }
}

template <int WARPS> static void launch_v2(const split_args &a, cudaStream_t st, int64_t grid) {
    const int nv = (a.Q + a.C + a.R) / 8;
    if (nv <= 32 * 6) split_v2<6, WARPS><<<(unsigned)grid, WARPS * 32, 0, st>>>(a);
    else split_v2<9, WARPS><<<(unsigned)grid, WARPS * 32, 0, st>>>(a);
}

template <int WARPS> static split_variant v2_row() {
    return {"v2 warp/row, " + std::to_string(WARPS) + " warps/block",
            [](const split_args &a, cudaStream_t st) { launch_v2<WARPS>(a, st, (a.T + WARPS - 1) / WARPS); }};
}
template <int WARPS> static split_variant v2_persistent(int k) {
    static const int sms = sm_count();
    return {"v2 persistent " + std::to_string(WARPS) + " warps, " + std::to_string(k) + "x SMs",
            [k](const split_args &a, cudaStream_t st) {
                int64_t need = (a.T + WARPS - 1) / WARPS, g = (int64_t)k * sms;
                launch_v2<WARPS>(a, st, need < g ? need : g);
            }};
}

int main(int argc, char **argv) {
    return run_split_bench("split_qk_norm v2: warp per row, 16-byte vectors in registers",
                           {v2_row<1>(), v2_row<2>(), v2_row<4>(), v2_row<8>(), v2_persistent<4>(4),
                            v2_persistent<4>(8), v2_persistent<8>(4)},
                           argc, argv);
}
