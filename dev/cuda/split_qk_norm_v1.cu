/*
 * split_qk_norm_v1 — the naive kernel: one block per row, scalar loads, shared-memory
 * reductions.
 *
 * 1. Block t owns latent row t; threads stride over the q and kv parts, summing squares.
 * 2. Block-wide reduction of both sums through shared memory (warp shuffles, then one value
 *    per warp in shared memory, two __syncthreads).
 * 3. Second pass re-reads the row (from L1/L2), writes q, k_nope (scaled, rounded once) and
 *    copies k_pe.
 * Why it is slow: 2-byte loads (many instructions per byte), two barriers per row and a
 * second pass; short rows leave most of a large block idle. This is the baseline the later
 * versions are measured against. Build: part of the CMake dev/ targets; run: ./split_qk_norm_v1
 */
#include "split_bench.cuh"

template <int BLOCK>
__global__ void split_v1(const split_args a) {
    __shared__ float red[2][BLOCK / 32];
    const int64_t t = blockIdx.x;
    const __nv_bfloat16 *L = a.latent + t * a.ls;
    float sq = 0, skv = 0;
    for (int i = threadIdx.x; i < a.Q; i += BLOCK) { float x = __bfloat162float(L[i]); sq += x * x; }
    for (int j = threadIdx.x; j < a.C; j += BLOCK) { float x = __bfloat162float(L[a.Q + j]); skv += x * x; }
    for (int o = 16; o > 0; o >>= 1) {
        sq += __shfl_xor_sync(0xffffffffu, sq, o);
        skv += __shfl_xor_sync(0xffffffffu, skv, o);
    }
    if ((threadIdx.x & 31) == 0) red[0][threadIdx.x >> 5] = sq, red[1][threadIdx.x >> 5] = skv;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s0 = 0, s1 = 0;
        for (int w = 0; w < BLOCK / 32; w++) s0 += red[0][w], s1 += red[1][w];
        red[0][0] = s0, red[1][0] = s1;
    }
    __syncthreads();
    const float rq = 1.0f / sqrtf(red[0][0] / a.Q + a.eps_q);
    const float rkv = 1.0f / sqrtf(red[1][0] / a.C + a.eps_kv);
    for (int i = threadIdx.x; i < a.Q; i += BLOCK)
        a.q[t * a.qs + i] = __float2bfloat16_rn(__bfloat162float(L[i]) * rq * __bfloat162float(a.wq[i]));
    for (int j = threadIdx.x; j < a.C; j += BLOCK)
        a.k_nope[t * a.ks + j] = __float2bfloat16_rn(__bfloat162float(L[a.Q + j]) * rkv * __bfloat162float(a.wkv[j]));
    for (int r = threadIdx.x; r < a.R; r += BLOCK) a.k_pe[t * a.ps + r] = L[a.Q + a.C + r];
}

template <int BLOCK> static split_variant v1() {
    return {"v1 block/row, scalar, block=" + std::to_string(BLOCK),
            [](const split_args &a, cudaStream_t st) { split_v1<BLOCK><<<(unsigned)a.T, BLOCK, 0, st>>>(a); }};
}

int main(int argc, char **argv) {
    return run_split_bench("split_qk_norm v1: naive block per row", {v1<128>(), v1<256>(), v1<512>()}, argc, argv);
}
