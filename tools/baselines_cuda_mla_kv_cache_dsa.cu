/*
 * baselines_cuda_mla_kv_cache_dsa.cu — the unfused DSA indexer key chain on the GPU (blg_index_k): a
 * LayerNorm kernel into dense [T, 128] rows, blg_rope_rows on their first 64 columns, a Hadamard
 * kernel when on, and a quantize-and-write kernel into the block-planar index cache; each a warp
 * per token with the library's row arithmetic (src/cuda/index_row.cuh), so the cache bytes equal
 * the fused op's. Four kernels, as engines' unfused pipelines launch them.
 */
#include "bench.h"
#include "cuda/index_row.cuh"

namespace {

constexpr int IW = 4; /* warps per block */

template <typename T>
__global__ void __launch_bounds__(IW * 32) ln_rows(const T *k, int64_t ks, const void *w, const void *b, int wf32,
                                                   float eps, T *dense, int64_t n) {
    const int lane = threadIdx.x & 31;
    const int64_t t = (int64_t)blockIdx.x * IW + (threadIdx.x >> 5);
    if (t >= n) return;
    float v[4];
    mlaf_idx_load(k + t * ks, lane, v);
    mlaf_idx_layernorm<T>(v, lane, w, b, wf32 != 0, eps);
#pragma unroll
    for (int i = 0; i < 4; i++) mlaf_st(dense + t * MLAF_INDEX_HEAD_DIM + 4 * lane + i, v[i]);
}

template <typename T> __global__ void __launch_bounds__(IW * 32) hadamard_rows(T *dense, int64_t n) {
    const int lane = threadIdx.x & 31;
    const int64_t t = (int64_t)blockIdx.x * IW + (threadIdx.x >> 5);
    if (t >= n) return;
    float v[4];
    mlaf_idx_load(dense + t * MLAF_INDEX_HEAD_DIM, lane, v);
    mlaf_idx_hadamard<T>(v, lane);
#pragma unroll
    for (int i = 0; i < 4; i++) mlaf_st(dense + t * MLAF_INDEX_HEAD_DIM + 4 * lane + i, v[i]);
}

template <typename T>
__global__ void __launch_bounds__(IW * 32) quant_write(const T *dense, const void *slots, int slot64, int64_t n_map,
                                                       int64_t cap, int64_t bs, uint8_t *cache, int64_t bstride,
                                                       float eps, int mode) {
    const int lane = threadIdx.x & 31;
    const int64_t t = (int64_t)blockIdx.x * IW + (threadIdx.x >> 5);
    if (t >= n_map) return;
    const int64_t slot = mlaf_ld_index(slots, slot64, t);
    if (slot < 0 || slot >= cap) return;
    float v[4];
    mlaf_idx_load(dense + t * MLAF_INDEX_HEAD_DIM, lane, v);
    const float s = mlaf_idx_scale(v, eps, mode);
    uint8_t *base = cache + (slot / bs) * bstride;
    const int64_t off = slot % bs;
    uint32_t q;
    mlaf_quant_e4m3<4>(v, s, &q);
    mlaf_idx_store_e4m3(base + off * MLAF_INDEX_HEAD_DIM + 4 * lane, q);
    if (lane == 0) mlaf_idx_store_f32(base + bs * MLAF_INDEX_HEAD_DIM + 4 * off, s);
}

template <typename T>
int index_chain(const mlaf_kv_cache_job *kv, const mlaf_index_job *ix, void *dense, cudaStream_t st) {
    const int64_t T_ = kv->norm.T;
    const unsigned blocks = (unsigned)((T_ + IW - 1) / IW);
    T *d = static_cast<T *>(dense);
    ln_rows<T><<<blocks, IW * 32, 0, st>>>(static_cast<const T *>(ix->k), ix->k_stride, ix->w, ix->b,
                                           ix->w_dt == MLAF_F32, ix->ln_eps, d, T_);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return (int)e;
    mlaf_rope_job r = kv->rope;
    r.style = ix->style;
    int rc = blg_rope_rows(dense, kv->norm.dt, T_, MLAF_INDEX_HEAD_DIM, &r, st);
    if (rc) return rc;
    if (ix->hadamard) {
        hadamard_rows<T><<<blocks, IW * 32, 0, st>>>(d, T_);
        if ((e = cudaGetLastError()) != cudaSuccess) return (int)e;
    }
    if (kv->n_map == 0) return 0;
    const unsigned qb = (unsigned)((kv->n_map + IW - 1) / IW);
    quant_write<T><<<qb, IW * 32, 0, st>>>(d, kv->slots, kv->slot_dt == MLAF_I64, kv->n_map,
                                           kv->num_blocks * kv->block_size, kv->block_size, ix->cache,
                                           ix->block_stride, ix->amax_eps, (int)ix->scale);
    return (int)cudaGetLastError();
}

} // namespace

extern "C" int blg_index_k(const mlaf_kv_cache_job *kv, const mlaf_index_job *ix, void *dense, void *stream) {
    if (kv->norm.T == 0) return 0;
    const cudaStream_t st = (cudaStream_t)stream;
    return kv->norm.dt == MLAF_F16    ? index_chain<__half>(kv, ix, dense, st)
           : kv->norm.dt == MLAF_BF16 ? index_chain<__nv_bfloat16>(kv, ix, dense, st)
                                      : index_chain<float>(kv, ix, dense, st);
}
