/*
 * test_gate_scores.cu — the router's cheap sqrt_softplus score against the exact one, for every
 * finite float.
 *
 * The solo kernel ranks DeepSeek-V4 tokens by sqrt_softplus_filter and computes the exact
 * sqrt_softplus_f for the candidates only; its candidate margin (sqrt_softplus_margin) holds
 * only if |filter(x) - exact(x)| <= kSspFilterErr for every finite x. This test evaluates both
 * on all 2^32 bit patterns (every 4099th in the quick mode) and checks that the difference is
 * within kSspFilterErr + kSspFilterRel * exact, that the cheap score is finite and >= 0, and
 * prints the largest excess over the relative part seen.
 */
#include "cuda/moe_gate_common.cuh"

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "testlib.h"
}

namespace {

__global__ void filter_sweep(uint32_t step, unsigned int *max_err, unsigned int *bad) {
    const uint64_t n = (1ull << 32) / step;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
        const float x = __uint_as_float((uint32_t)(i * step));
        if (!isfinite(x)) continue;
        /* the forms the kernels use (score_traits): the solo kernel's filter, the exact score */
        using Ssp = score_traits<MLAF_SCORE_SQRT_SOFTPLUS>;
        const float f = Ssp::filter(x), g = Ssp::fast(x);
        if (!isfinite(f) || f < 0.0f) {
            atomicAdd(bad, 1u);
            continue;
        }
        const float d = fmaxf(fabsf(f - g) - kSspFilterRel * g, 0.0f);
        atomicMax(max_err, __float_as_uint(d)); /* non-negative floats order as bits */
    }
}

} // namespace

int main(void) {
    if (!tl_cuda()) return tl_finish();
    const uint32_t step = tl_quick() ? 4099u : 1u;
    unsigned int *d = nullptr, h[2] = {0u, 0u};
    bool ok = cudaMalloc(&d, 2 * sizeof(unsigned int)) == cudaSuccess &&
              cudaMemset(d, 0, 2 * sizeof(unsigned int)) == cudaSuccess;
    if (ok) {
        filter_sweep<<<1024, 256>>>(step, d, d + 1);
        ok = cudaDeviceSynchronize() == cudaSuccess &&
             cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost) == cudaSuccess;
    }
    if (d) cudaFree(d);
    char name[96];
    snprintf(name, sizeof name, "GATE_SCORES(sqrt_softplus filter,every %u-th finite float)", step);
    if (!ok) {
        tl_case(0, name, "CUDA error: %s", cudaGetErrorString(cudaGetLastError()));
    } else {
        float err;
        memcpy(&err, &h[0], sizeof err);
        tl_case(h[1] == 0u && err <= kSspFilterErr, name, "max |filter - exact| - rel * exact = %.3g (bound %.3g), %u non-finite or negative",
                (double)err, (double)kSspFilterErr, h[1]);
        printf("sqrt_softplus filter: max |filter - exact| - %.2g exact = %.3g over every %u-th finite float\n",
               (double)kSspFilterRel, (double)err, step);
    }
    return tl_finish();
}
