/*
 * baselines_cuda.cu — the unfused CUDA chains `mlafuse bench` compares the fused ops with:
 * separate simple kernels, each its own launch and each writing a full intermediate tensor,
 * as engines run these steps today (extern "C"; only built with CUDA).
 *
 *   split_qk_norm  1. split: one block per row copies q, kv, pe into three dense tensors
 *                  2. RMSNorm q and 3. RMSNorm kv: one block per row, block-reduced sum
 *                  of squares, then x * rstd * w
 *   mla_kv_cache   the library's split_qk_norm, then 4. RoPE on k_pe (one thread per
 *                  pair) and 5. the cache write (plain: one block per token; fp8 formats: a
 *                  separate quantize-and-write kernel, a warp per token, like vLLM's
 *                  concat_and_cache_mla / concat_and_cache_ds_mla)
 *   rope_q         gather the rope columns into [T*H, R], rotate, scatter back (one thread
 *                  per element / pair)
 *   moe_gate       score (sigmoid, sqrt_softplus: per element; softmax: a warp per row), + bias, group
 *                  scores (a thread per group), group mask (a thread per row), masked fill,
 *                  top-k (a warp per row, k rounds of a warp argmax), gather, normalize,
 *                  scale (a thread per row)
 *
 * Launch shapes are the plain ones of such kernels (256 threads; a block or a warp per
 * row), not tuned: they stand for the status quo. Arithmetic is fp32 with one rounding per
 * store; RoPE uses explicitly rounded products so no FMA changes the bits. All indexing is
 * 64-bit. Every function returns 0 or the cudaError_t of its first failed launch.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bench.h"

namespace {

template <typename T> struct io;
template <> struct io<float> {
    static __device__ __forceinline__ float ld(const float *p) { return *p; }
    static __device__ __forceinline__ void st(float *p, float v) { *p = v; }
};
template <> struct io<__half> {
    static __device__ __forceinline__ float ld(const __half *p) { return __half2float(*p); }
    static __device__ __forceinline__ void st(__half *p, float v) { *p = __float2half_rn(v); }
};
template <> struct io<__nv_bfloat16> {
    static __device__ __forceinline__ float ld(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
    static __device__ __forceinline__ void st(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }
};

__device__ __forceinline__ int64_t ld_index(const void *p, mlaf_dtype dt, int64_t i) {
    return dt == MLAF_I64 ? static_cast<const int64_t *>(p)[i]
                          : static_cast<int64_t>(static_cast<const int32_t *>(p)[i]);
}

__device__ __forceinline__ float ld_any(const void *p, mlaf_dtype dt, int64_t i) {
    switch (dt) {
    case MLAF_F16: return io<__half>::ld(static_cast<const __half *>(p) + i);
    case MLAF_BF16: return io<__nv_bfloat16>::ld(static_cast<const __nv_bfloat16 *>(p) + i);
    default: return static_cast<const float *>(p)[i];
    }
}

__device__ __forceinline__ void st_any(void *p, mlaf_dtype dt, int64_t i, float v) {
    switch (dt) {
    case MLAF_F16: io<__half>::st(static_cast<__half *>(p) + i, v); break;
    case MLAF_BF16: io<__nv_bfloat16>::st(static_cast<__nv_bfloat16 *>(p) + i, v); break;
    default: static_cast<float *>(p)[i] = v; break;
    }
}

constexpr int kThreads = 256;

unsigned grid_for(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > (int64_t)1 << 30) b = (int64_t)1 << 30; /* kernels below are grid-stride */
    return (unsigned)b;
}

/* ---- split + RMSNorm ------------------------------------------------------------------- */
template <typename T>
__global__ void split_kernel(const T *lat, int64_t ls, int32_t Q, int32_t C, int32_t R, T *qd,
                             T *kvd, T *kpe, int64_t kps) {
    const int64_t t = blockIdx.x;
    const T *row = lat + t * ls;
    for (int32_t i = threadIdx.x; i < Q + C + R; i += blockDim.x) {
        T v = row[i];
        if (i < Q)
            qd[t * Q + i] = v;
        else if (i < Q + C)
            kvd[t * C + (i - Q)] = v;
        else if (kpe)
            kpe[t * kps + (i - Q - C)] = v;
    }
}

__device__ float block_sum(float v) {
    __shared__ float part[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) part[warp] = v;
    __syncthreads();
    const int nw = (blockDim.x + 31) >> 5;
    v = lane < nw ? part[lane] : 0.0f;
    if (warp == 0)
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __shared__ float total;
    if (threadIdx.x == 0) total = v;
    __syncthreads();
    return total;
}

template <typename T>
__global__ void rmsnorm_kernel(const T *x, int64_t xs, T *y, int64_t ys, const void *w,
                               mlaf_dtype wdt, int32_t n, float eps) {
    const int64_t t = blockIdx.x;
    const T *xr = x + t * xs;
    T *yr = y + t * ys;
    float ss = 0.0f;
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
        float v = io<T>::ld(xr + i);
        ss += v * v;
    }
    ss = block_sum(ss);
    const float rstd = 1.0f / sqrtf(ss / (float)n + eps);
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x)
        io<T>::st(yr + i, io<T>::ld(xr + i) * rstd * ld_any(w, wdt, i));
}

template <typename T>
int split_norm(const mlaf_norm_job *j, void *q_dense, void *kv_dense, cudaStream_t s) {
    const unsigned rows = (unsigned)j->T; /* T < 2^31: one block per row fits grid.x */
    split_kernel<T><<<rows, kThreads, 0, s>>>(static_cast<const T *>(j->latent), j->latent_stride,
                                              j->Q, j->C, j->R, static_cast<T *>(q_dense),
                                              static_cast<T *>(kv_dense),
                                              j->R > 0 ? static_cast<T *>(j->k_pe) : nullptr,
                                              j->k_pe_stride);
    if (j->Q > 0)
        rmsnorm_kernel<T><<<rows, kThreads, 0, s>>>(static_cast<const T *>(q_dense), j->Q,
                                                    static_cast<T *>(j->q), j->q_stride, j->w_q,
                                                    j->w_q_dt, j->Q, j->eps_q);
    if (j->k_nope)
        rmsnorm_kernel<T><<<rows, kThreads, 0, s>>>(static_cast<const T *>(kv_dense), j->C,
                                                    static_cast<T *>(j->k_nope), j->k_nope_stride,
                                                    j->w_kv, j->w_kv_dt, j->C, j->eps_kv);
    return (int)cudaGetLastError();
}

/* ---- RoPE, cache write, rope_q gather / scatter ---------------------------------------------- */
/* rows x [R] at x + row * stride; row r uses position positions[r / per_pos]. */
template <typename T>
__global__ void rope_kernel(T *x, int64_t rows, int64_t stride, int64_t per_pos, int32_t R,
                            mlaf_rope_style style, const void *pos, mlaf_dtype pos_dt,
                            const float *cs, int64_t cs_stride, int64_t max_pos) {
    const int32_t half = R / 2;
    const int64_t n = rows * half;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = idx / half;
        const int32_t i = (int32_t)(idx % half);
        const int64_t p = ld_index(pos, pos_dt, r / per_pos);
        if (p < 0 || p >= max_pos) continue;
        const float c = cs[p * cs_stride + i], sn = cs[p * cs_stride + half + i];
        const int32_t i0 = style == MLAF_ROPE_NEOX ? i : 2 * i;
        const int32_t i1 = style == MLAF_ROPE_NEOX ? i + half : 2 * i + 1;
        T *row = x + r * stride;
        const float x0 = io<T>::ld(row + i0), x1 = io<T>::ld(row + i1);
        io<T>::st(row + i0, __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn)));
        io<T>::st(row + i1, __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, sn)));
    }
}

template <typename T>
int rope_rows(void *x, int64_t rows, int64_t stride, int64_t per_pos, const mlaf_rope_job *r,
              cudaStream_t s) {
    const int64_t n = rows * (r->R / 2);
    if (n == 0) return 0;
    rope_kernel<T><<<grid_for(n, kThreads), kThreads, 0, s>>>(
        static_cast<T *>(x), rows, stride, per_pos, r->R, r->style, r->positions, r->pos_dt,
        r->cos_sin, r->cos_sin_stride, r->max_pos);
    return (int)cudaGetLastError();
}

template <typename T, typename TC>
__global__ void cache_write_kernel(const T *kn, const T *kp, int32_t C, int32_t R,
                                   const void *slots, mlaf_dtype slot_dt, int64_t n_map, TC *cache, int64_t bs,
                                   int64_t nslots, int64_t s0, int64_t s1) {
    const int64_t t = blockIdx.x;
    const int64_t slot = t < n_map ? ld_index(slots, slot_dt, t) : -1;
    if (slot < 0 || slot >= nslots) return;
    TC *dst = cache + (slot / bs) * s0 + (slot % bs) * s1;
    for (int32_t i = threadIdx.x; i < C + R; i += blockDim.x) {
        const float v = i < C ? io<T>::ld(kn + t * C + i) : io<T>::ld(kp + t * R + (i - C));
        io<TC>::st(dst + i, v);
    }
}

template <typename T, typename TC>
int cache_write(const mlaf_kv_cache_job *j, const void *kn, const void *kp, cudaStream_t s) {
    cache_write_kernel<T, TC><<<(unsigned)j->norm.T, kThreads, 0, s>>>(
        static_cast<const T *>(kn), static_cast<const T *>(kp), j->norm.C, j->norm.R, j->slots,
        j->slot_dt, j->n_map, static_cast<TC *>(j->cache), j->block_size, j->num_blocks * j->block_size,
        j->cache_s0, j->cache_s1);
    return (int)cudaGetLastError();
}

/* ---- fp8 quantize-and-write (the unfused fp8 chains' last pass) ------------------------------ */
constexpr int kWarpsPerBlock = kThreads / 32;

/* CUDA's own conversion (SPEC §9's reference): nearest even, satfinite, NaN -> 0x7F. */
__device__ __forceinline__ uint32_t e4m3(float x) {
    return (uint32_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

/* The fp8_ds_mla tile scale of a NaN-free amax (SPEC §9): amax max(amax / 448, FLT_MIN); ue8m0
 * 2^ceil_log2(max(amax, 1e-4) / 448); ue8m0_floor_scaled 2^ceil_log2(max(amax / 448, 1e-4));
 * ceil_log2 from the bits, 128 for +inf (2^128 = +inf). */
__device__ __forceinline__ float tile_scale(float amax, mlaf_tile_scale mode) {
    if (mode == MLAF_TILE_AMAX) return fmaxf(__fdiv_rn(amax, 448.0f), FLT_MIN);
    const float v = mode == MLAF_TILE_UE8M0 ? __fdiv_rn(fmaxf(amax, 1e-4f), 448.0f)
                                            : fmaxf(__fdiv_rn(amax, 448.0f), 1e-4f);
    const uint32_t u = __float_as_uint(v);
    const int e = (u & 0x7fffffffu) == 0x7f800000u ? 128
                                                   : (int)((u >> 23) & 0xffu) - 127 + ((u & 0x7fffffu) != 0u);
    return __uint_as_float((uint32_t)(e + 127) << 23);
}

/* The cache record of a token, or NULL when its slot is skipped (t >= n_map, negative, or outside
 * the cache): uniform across the warp that owns the token. */
__device__ __forceinline__ int64_t token_slot(const void *slots, mlaf_dtype slot_dt, int64_t n_map,
                                              int64_t t, int64_t nslots) {
    const int64_t slot = t < n_map ? ld_index(slots, slot_dt, t) : -1;
    return slot >= 0 && slot < nslots ? slot : -1;
}

/* n values of a dense row to per-tensor fp8 bytes, by one warp. vec: src 16-byte aligned, dst
 * aligned to N = 16 / sizeof(T) bytes, n a multiple of N; then each lane converts N values of one
 * 16-byte load and stores their N bytes at once. */
template <typename T>
__device__ __forceinline__ void fp8_row(const T *__restrict__ src, int32_t n, uint8_t *__restrict__ dst,
                                        float scale, bool mul, bool vec, int lane) {
    constexpr int N = 16 / (int)sizeof(T);
    if (vec) {
        for (int32_t i = lane * N; i < n; i += 32 * N) {
            const uint4 raw = __ldg(reinterpret_cast<const uint4 *>(src + i));
            T e[N];
            memcpy(e, &raw, sizeof raw);
            uint32_t w[N / 4];
#pragma unroll
            for (int k = 0; k < N / 4; k++) {
                w[k] = 0;
#pragma unroll
                for (int m = 0; m < 4; m++) {
                    const float x = io<T>::ld(&e[4 * k + m]);
                    w[k] |= e4m3(mul ? __fmul_rn(x, scale) : __fdiv_rn(x, scale)) << (8 * m);
                }
            }
            if (N == 8)
                *reinterpret_cast<uint2 *>(dst + i) = make_uint2(w[0], w[N / 4 - 1]);
            else
                *reinterpret_cast<uint32_t *>(dst + i) = w[0];
        }
    } else {
        for (int32_t i = lane; i < n; i += 32) {
            const float x = io<T>::ld(src + i);
            dst[i] = (uint8_t)e4m3(mul ? __fmul_rn(x, scale) : __fdiv_rn(x, scale));
        }
    }
}

/* Per-tensor fp8: a warp per token; the record [C + R] bytes at the slot, or C bytes there and R in
 * the separate kpe array. The scale is read from device memory (graph replays follow it). */
template <typename T>
__global__ void __launch_bounds__(kThreads) fp8_write_kernel(
    const T *__restrict__ kn, const T *__restrict__ kp, int32_t C, int32_t R, const void *slots,
    mlaf_dtype slot_dt, int64_t n_map, int64_t T_, uint8_t *cache, int64_t bs, int64_t nslots,
    int64_t s0, int64_t s1, uint8_t *kpe, int64_t ks0, int64_t ks1, const float *scale_p, bool mul,
    bool vec) {
    const int64_t t = (int64_t)blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (t >= T_) return;
    const int64_t slot = token_slot(slots, slot_dt, n_map, t, nslots);
    if (slot < 0) return;
    const float scale = __ldg(scale_p);
    const int64_t blk = slot / bs, off = slot % bs;
    uint8_t *dst = cache + blk * s0 + off * s1;
    fp8_row<T>(kn + t * C, C, dst, scale, mul, vec, lane);
    if (R > 0) fp8_row<T>(kp + t * R, R, kpe ? kpe + blk * ks0 + off * ks1 : dst + C, scale, mul, vec, lane);
}

/* fp8_ds_mla: a warp per token, a half-warp per 128-value tile (16 lanes x 8 bf16 values), so one
 * pass of the warp covers two tiles; the tile amax is a max over the half-warp by shuffles, lane 0
 * of the half stores the tile's f32 scale. Then the R bf16 rope values are copied behind the
 * scales. vec: the k_nope rows are 16-byte aligned (the record always is, by validation). */
__global__ void __launch_bounds__(kThreads) ds_mla_write_kernel(
    const __nv_bfloat16 *__restrict__ kn, const __nv_bfloat16 *__restrict__ kp, int32_t C, int32_t R,
    const void *slots, mlaf_dtype slot_dt, int64_t n_map, int64_t T_, uint8_t *cache, int64_t bs,
    int64_t nslots, int64_t s0, int64_t s1, mlaf_tile_scale mode, bool vec, bool vec_pe) {
    const int64_t t = (int64_t)blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31, half = lane >> 4, hl = lane & 15;
    if (t >= T_) return;
    const int64_t slot = token_slot(slots, slot_dt, n_map, t, nslots);
    if (slot < 0) return;
    uint8_t *dst = cache + (slot / bs) * s0 + (slot % bs) * s1;
    const __nv_bfloat16 *src = kn + t * C;
    const int32_t tiles = C / 128;
    for (int32_t t0 = 0; t0 < tiles; t0 += 2) {
        const int32_t tile = t0 + half;
        const bool active = tile < tiles; /* an odd tile count idles the upper half on its last pass */
        const int32_t i0 = tile * 128 + hl * 8;
        float x[8];
        if (active && vec) {
            const uint4 raw = __ldg(reinterpret_cast<const uint4 *>(src + i0));
            __nv_bfloat16 e[8];
            memcpy(e, &raw, sizeof raw);
#pragma unroll
            for (int k = 0; k < 8; k++) x[k] = __bfloat162float(e[k]);
        } else {
#pragma unroll
            for (int k = 0; k < 8; k++) x[k] = active ? __bfloat162float(src[i0 + k]) : 0.0f;
        }
        float amax = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) amax = fmaxf(amax, fabsf(x[k])); /* fmaxf ignores NaN */
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        const float s = tile_scale(amax, mode);
        if (active) {
            uint32_t w[2] = {0, 0};
#pragma unroll
            for (int k = 0; k < 8; k++) w[k >> 2] |= e4m3(__fdiv_rn(x[k], s)) << (8 * (k & 3));
            *reinterpret_cast<uint2 *>(dst + i0) = make_uint2(w[0], w[1]);
            if (hl == 0) *reinterpret_cast<float *>(dst + C + 4 * tile) = s;
        }
    }
    if (R > 0) {
        uint8_t *pe = dst + C + C / 32; /* 16-byte aligned: C % 128 == 0, the record aligned */
        const int32_t nb = 2 * R;
        if (vec_pe) {
            const uint4 *ps = reinterpret_cast<const uint4 *>(kp + t * R);
            for (int32_t i = lane; i < nb / 16; i += 32) reinterpret_cast<uint4 *>(pe)[i] = __ldg(ps + i);
        } else {
            const unsigned short *ps = reinterpret_cast<const unsigned short *>(kp + t * R);
            for (int32_t i = lane; i < R; i += 32) reinterpret_cast<unsigned short *>(pe)[i] = ps[i];
        }
    }
}

/* fp8_v4 (SPEC §11): a warp per token over its dense bf16 row of 512 (the last 64 roped): lane l
 * takes NoPE vectors l and l + 32 (8 values each, 56 in all), a 64-value block is 8 lanes and its
 * amax an 8-lane shuffle max; e4m3(x * 2^-e) as 8-byte stores, the scale bytes by each block's
 * first lane, the 64 rope values copied as 8 16-byte stores. vec: the rows are 16-byte aligned. */
__global__ void __launch_bounds__(kThreads) v4_write_kernel(
    const __nv_bfloat16 *__restrict__ kn, const void *slots, mlaf_dtype slot_dt, int64_t n_map, int64_t T_,
    uint8_t *cache, int64_t bs, int64_t nslots, int64_t s0, bool vec) {
    const int64_t t = (int64_t)blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (t >= T_) return;
    const int64_t slot = token_slot(slots, slot_dt, n_map, t, nslots);
    if (slot < 0) return;
    uint8_t *page = cache + (slot / bs) * s0;
    uint8_t *data = page + (slot % bs) * 576, *sc = page + bs * 576 + (slot % bs) * 8;
    const __nv_bfloat16 *src = kn + t * 512;
    for (int k = 0; k < 2; k++) {
        const int v = lane + 32 * k;
        const bool active = v < 56;
        float x[8];
        if (active && vec) {
            const uint4 raw = __ldg(reinterpret_cast<const uint4 *>(src + 8 * v));
            __nv_bfloat16 e[8];
            memcpy(e, &raw, sizeof raw);
#pragma unroll
            for (int m = 0; m < 8; m++) x[m] = __bfloat162float(e[m]);
        } else {
#pragma unroll
            for (int m = 0; m < 8; m++) x[m] = active ? __bfloat162float(src[8 * v + m]) : 0.0f;
        }
        float amax = 0.0f;
#pragma unroll
        for (int m = 0; m < 8; m++) amax = fmaxf(amax, fabsf(x[m]));
#pragma unroll
        for (int o = 4; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        const uint32_t u = __float_as_uint(__fdiv_rn(fmaxf(amax, 1e-4f), 448.0f));
        const int e = (u & 0x7fffffffu) == 0x7f800000u ? 128 : (int)((u >> 23) & 0xffu) - 127 + ((u & 0x7fffffu) != 0);
        const float mul = __uint_as_float(e <= 126 ? (uint32_t)(127 - e) << 23 : 1u << (149 - e));
        if (!active) continue;
        uint32_t w[2] = {0, 0};
#pragma unroll
        for (int m = 0; m < 8; m++) w[m >> 2] |= e4m3(__fmul_rn(x[m], mul)) << (8 * (m & 3));
        *reinterpret_cast<uint2 *>(data + 8 * v) = make_uint2(w[0], w[1]);
        if ((v & 7) == 0) sc[v >> 3] = (uint8_t)min(max(e + 127, 0), 255);
    }
    if (lane == 0) sc[7] = 0;
    if (lane < 8) {
        if (vec) {
            reinterpret_cast<uint4 *>(data + 448)[lane] = __ldg(reinterpret_cast<const uint4 *>(src + 448) + lane);
        } else {
            const unsigned short *ps = reinterpret_cast<const unsigned short *>(src + 448);
            for (int i = lane; i < 64; i += 8) reinterpret_cast<unsigned short *>(data + 448)[i] = ps[i];
        }
    }
}

inline bool aligned(const void *p, size_t a) { return (uintptr_t)p % a == 0; }

template <typename T>
int fp8_write(const mlaf_kv_cache_job *j, const void *kn, const void *kp, cudaStream_t s) {
    const int32_t C = j->norm.C, R = j->norm.R;
    const size_t N = 16 / sizeof(T); /* values per 16-byte load = fp8 bytes per store */
    bool vec = aligned(kn, 16) && (C * sizeof(T)) % 16 == 0 && aligned(j->cache, N) && j->cache_s0 % N == 0 &&
               j->cache_s1 % N == 0;
    if (R > 0) {
        vec = vec && aligned(kp, 16) && (R * sizeof(T)) % 16 == 0;
        if (j->kpe) vec = vec && aligned(j->kpe, N) && j->kpe_s0 % N == 0 && j->kpe_s1 % N == 0;
    }
    fp8_write_kernel<T><<<grid_for(j->norm.T, kWarpsPerBlock), kThreads, 0, s>>>(
        static_cast<const T *>(kn), static_cast<const T *>(kp), C, R, j->slots, j->slot_dt, j->n_map,
        j->norm.T, static_cast<uint8_t *>(j->cache), j->block_size, j->num_blocks * j->block_size,
        j->cache_s0, j->cache_s1, static_cast<uint8_t *>(j->kpe), j->kpe_s0, j->kpe_s1, j->scale,
        j->conv == MLAF_FP8_MUL, vec);
    return (int)cudaGetLastError();
}

int v4_write(const mlaf_kv_cache_job *j, const void *kn, cudaStream_t s) {
    v4_write_kernel<<<grid_for(j->norm.T, kWarpsPerBlock), kThreads, 0, s>>>(
        static_cast<const __nv_bfloat16 *>(kn), j->slots, j->slot_dt, j->n_map, j->norm.T,
        static_cast<uint8_t *>(j->cache), j->block_size, j->num_blocks * j->block_size, j->cache_s0, aligned(kn, 16));
    return (int)cudaGetLastError();
}

int ds_mla_write(const mlaf_kv_cache_job *j, const void *kn, const void *kp, cudaStream_t s) {
    const int32_t R = j->norm.R;
    const bool vec = aligned(kn, 16);
    const bool vec_pe = R > 0 && aligned(kp, 16) && (2 * R) % 16 == 0;
    ds_mla_write_kernel<<<grid_for(j->norm.T, kWarpsPerBlock), kThreads, 0, s>>>(
        static_cast<const __nv_bfloat16 *>(kn), static_cast<const __nv_bfloat16 *>(kp), j->norm.C, R,
        j->slots, j->slot_dt, j->n_map, j->norm.T, static_cast<uint8_t *>(j->cache), j->block_size,
        j->num_blocks * j->block_size, j->cache_s0, j->cache_s1, j->tile_scale, vec, vec_pe);
    return (int)cudaGetLastError();
}

template <typename T>
__global__ void gather_kernel(const T *q, int64_t H, int32_t D, int32_t R, int64_t s0, int64_t s1,
                              T *g, int64_t n, bool scatter) {
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = idx / R;
        const int32_t j = (int32_t)(idx % R);
        const int64_t off = (r / H) * s0 + (r % H) * s1 + (D - R) + j;
        if (scatter)
            const_cast<T *>(q)[off] = g[idx];
        else
            g[idx] = q[off];
    }
}

/* rope_q's head_norm pass (SPEC §11): one block per head, weightless RMSNorm in place. */
template <typename T>
__global__ void head_norm_kernel(T *q, int64_t H, int64_t s0, int64_t s1, int32_t D, float eps) {
    const int64_t r = blockIdx.x;
    T *x = q + (r / H) * s0 + (r % H) * s1;
    float ss = 0.0f;
    for (int32_t i = threadIdx.x; i < D; i += blockDim.x) {
        const float v = io<T>::ld(x + i);
        ss += v * v;
    }
    ss = block_sum(ss);
    const float rstd = 1.0f / sqrtf(ss / (float)D + eps);
    for (int32_t i = threadIdx.x; i < D; i += blockDim.x) io<T>::st(x + i, io<T>::ld(x + i) * rstd);
}

template <typename T> int head_norm(const mlaf_rope_q_job *j, cudaStream_t s) {
    const int64_t rows = j->T * j->H;
    if (rows == 0) return 0;
    head_norm_kernel<T><<<(unsigned)rows, kThreads, 0, s>>>(static_cast<T *>(j->q), j->H, j->s0, j->s1, j->D,
                                                            j->head_eps);
    return (int)cudaGetLastError();
}

template <typename T> int rope_q(const mlaf_rope_q_job *j, void *gather, cudaStream_t s) {
    const int64_t rows = j->T * j->H, n = rows * j->rope.R;
    if (n == 0) return 0;
    T *q = static_cast<T *>(j->q), *g = static_cast<T *>(gather);
    gather_kernel<T><<<grid_for(n, kThreads), kThreads, 0, s>>>(q, j->H, j->D, j->rope.R, j->s0,
                                                                j->s1, g, n, false);
    int e = rope_rows<T>(g, rows, j->rope.R, j->H, &j->rope, s);
    if (e) return e;
    gather_kernel<T><<<grid_for(n, kThreads), kThreads, 0, s>>>(q, j->H, j->D, j->rope.R, j->s0,
                                                                j->s1, g, n, true);
    return (int)cudaGetLastError();
}

/* ---- moe_gate ------------------------------------------------------------------------------- */
template <typename T>
__global__ void sigmoid_kernel(const T *x, int64_t xs, int32_t E, float *s, int64_t n) {
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = idx / E;
        const int32_t e = (int32_t)(idx % E);
        s[idx] = 1.0f / (1.0f + expf(-io<T>::ld(x + t * xs + e)));
    }
}

template <typename T>
__global__ void sqrt_softplus_kernel(const T *x, int64_t xs, int32_t E, float *s, int64_t n) {
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = idx / E;
        const int32_t e = (int32_t)(idx % E);
        const float v = io<T>::ld(x + t * xs + e); /* torch: F.softplus(x).sqrt() */
        s[idx] = sqrtf(fmaxf(v, 0.0f) + log1pf(expf(-fabsf(v))));
    }
}

/* ids = tid2eid[token_ids] (torch indexing); a bad row takes 0 .. k-1, as the fused op. */
__global__ void hash_ids_kernel(const void *tab, bool tab_i64, int64_t tab_stride, int64_t vocab,
                                const void *tok, bool tok_i64, int32_t E, int32_t k, int32_t *ids,
                                int64_t ids_stride, int64_t n) {
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = idx / k;
        const int32_t r = (int32_t)(idx % k);
        const int64_t id = tok_i64 ? static_cast<const int64_t *>(tok)[t] : static_cast<const int32_t *>(tok)[t];
        int64_t e = r;
        if (id >= 0 && id < vocab) {
            const int64_t at = id * tab_stride + r;
            e = tab_i64 ? static_cast<const int64_t *>(tab)[at] : static_cast<const int32_t *>(tab)[at];
            if (e < 0 || e >= E) e = r;
        }
        ids[t * ids_stride + r] = (int32_t)e;
    }
}

template <typename T>
__global__ void softmax_kernel(const T *x, int64_t xs, int32_t E, float *s, int64_t rows) {
    const int64_t t = (int64_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x / 32);
    const int lane = threadIdx.x & 31;
    if (t >= rows) return;
    const T *xr = x + t * xs;
    float mx = -INFINITY;
    for (int32_t e = lane; e < E; e += 32) mx = fmaxf(mx, io<T>::ld(xr + e));
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.0f;
    for (int32_t e = lane; e < E; e += 32) sum += expf(io<T>::ld(xr + e) - mx);
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    for (int32_t e = lane; e < E; e += 32) s[t * E + e] = expf(io<T>::ld(xr + e) - mx) / sum;
}

__global__ void bias_kernel(const float *s, const float *bias, int32_t E, float *c, int64_t n) {
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (int64_t)gridDim.x * blockDim.x)
        c[idx] = s[idx] + (bias ? bias[idx % E] : 0.0f);
}

__global__ void group_score_kernel(const float *c, int32_t E, int32_t G, bool use_max, float *g,
                                   int64_t n) {
    const int32_t per = E / G;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = idx / G;
        const int32_t gi = (int32_t)(idx % G);
        const float *cg = c + t * E + (int64_t)gi * per;
        float b1 = -INFINITY, b2 = -INFINITY;
        for (int32_t e = 0; e < per; e++) {
            float v = isnan(cg[e]) ? -INFINITY : cg[e];
            if (v > b1) {
                b2 = b1;
                b1 = v;
            } else if (v > b2) {
                b2 = v;
            }
        }
        g[idx] = use_max ? b1 : b1 + b2;
    }
}

/* Turns the row's group scores into a 1 / 0 keep mask (topk_group best, ties to the lower
 * group), in place. */
__global__ void group_mask_kernel(float *g, int32_t G, int32_t topk_group, int64_t rows) {
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < rows;
         t += (int64_t)gridDim.x * blockDim.x) {
        float *gr = g + t * G;
        uint64_t keep = 0;
        for (int32_t r = 0; r < topk_group; r++) {
            int32_t best = -1;
            for (int32_t gi = 0; gi < G; gi++) {
                if (keep >> gi & 1) continue;
                if (best < 0 || gr[gi] > gr[best]) best = gi;
            }
            if (best >= 0) keep |= (uint64_t)1 << best;
        }
        for (int32_t gi = 0; gi < G; gi++) gr[gi] = (keep >> gi & 1) ? 1.0f : 0.0f;
    }
}

/* m = c in kept groups (non-finite ranks lowest: NaN -> -inf), NaN (never chosen) elsewhere. */
__global__ void masked_fill_kernel(const float *c, const float *g, int32_t E, int32_t G, float *m,
                                   int64_t n) {
    const int32_t per = E / G;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = idx / E;
        const int32_t e = (int32_t)(idx % E);
        const float v = c[idx];
        m[idx] = g[t * G + e / per] != 0.0f ? (isnan(v) ? -INFINITY : v) : NAN;
    }
}

/* A warp per row: k rounds of argmax over the not-yet-taken, kept experts. Lane l owns
 * experts l, l + 32, ... (at most 64 of them for E <= 2048), remembered in a bit mask. */
__global__ void topk_kernel(const float *m, int32_t E, int32_t k, int32_t *ids, int64_t ids_stride,
                            int64_t rows) {
    const int64_t t = (int64_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x / 32);
    const int lane = threadIdx.x & 31;
    if (t >= rows) return;
    const float *mr = m + t * E;
    uint64_t taken = 0;
    for (int32_t r = 0; r < k; r++) {
        float bv = 0.0f;
        int32_t bi = -1;
        for (int32_t e = lane, slot = 0; e < E; e += 32, slot++) {
            const float v = mr[e];
            if ((taken >> slot & 1) || isnan(v)) continue;
            if (bi < 0 || v > bv) { /* ascending e: ties keep the lower index */
                bv = v;
                bi = e;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) {
                bv = ov;
                bi = oi;
            }
        }
        if (bi < 0) bi = 0; /* unreachable for valid parameters: kept groups hold >= k experts */
        if ((bi & 31) == lane) taken |= (uint64_t)1 << (bi >> 5);
        if (lane == 0) ids[t * ids_stride + r] = bi;
    }
}

__global__ void gather_weights_kernel(const float *s, int32_t E, const int32_t *ids,
                                      int64_t ids_stride, int32_t k, float *w, int64_t n) {
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = idx / k;
        const int32_t r = (int32_t)(idx % k);
        const float v = s[t * E + ids[t * ids_stride + r]];
        w[idx] = isfinite(v) ? v : 0.0f;
    }
}

__global__ void normalize_kernel(float *w, int32_t k, float eps, int64_t rows) {
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < rows;
         t += (int64_t)gridDim.x * blockDim.x) {
        float sum = 0.0f;
        for (int32_t r = 0; r < k; r++) sum += w[t * k + r];
        for (int32_t r = 0; r < k; r++) w[t * k + r] /= sum + eps;
    }
}

__global__ void scale_kernel(const float *w, int32_t k, int32_t n_shared, int32_t E, bool apply,
                             float scaling, void *out, mlaf_dtype out_dt, int64_t out_stride,
                             int32_t *ids, int64_t ids_stride, int64_t rows) {
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < rows;
         t += (int64_t)gridDim.x * blockDim.x) {
        float sum = 0.0f;
        for (int32_t r = 0; r < k; r++) {
            const float v = w[t * k + r];
            sum += v;
            st_any(out, out_dt, t * out_stride + r, apply ? v * scaling : v);
        }
        for (int32_t r = 0; r < n_shared; r++) {
            ids[t * ids_stride + k + r] = E + r;
            st_any(out, out_dt, t * out_stride + k + r, sum / scaling);
        }
    }
}

/* moe_gate's first step: s [T, E] */
template <typename T> void score_pass(const mlaf_moe_gate_job *j, const bench_moe_scratch *sc, cudaStream_t s) {
    const int64_t rows = j->T, TE = rows * j->E;
    const unsigned row_blocks = grid_for(rows, kThreads / 32);
    const T *x = static_cast<const T *>(j->logits);
    if (j->score_func == MLAF_SCORE_SIGMOID)
        sigmoid_kernel<T><<<grid_for(TE, kThreads), kThreads, 0, s>>>(x, j->logits_stride, j->E, sc->s, TE);
    else if (j->score_func == MLAF_SCORE_SQRT_SOFTPLUS)
        sqrt_softplus_kernel<T><<<grid_for(TE, kThreads), kThreads, 0, s>>>(x, j->logits_stride, j->E, sc->s, TE);
    else
        softmax_kernel<T><<<row_blocks, kThreads, 0, s>>>(x, j->logits_stride, j->E, sc->s, rows);
}

int weights_pass(const mlaf_moe_gate_job *j, const bench_moe_scratch *sc, cudaStream_t s);

template <typename T> int moe_gate(const mlaf_moe_gate_job *j, const bench_moe_scratch *sc, cudaStream_t s) {
    const int64_t rows = j->T, TE = rows * j->E;
    const int warps_per_block = kThreads / 32;
    const unsigned row_blocks = grid_for(rows, warps_per_block);
    score_pass<T>(j, sc, s);
    bias_kernel<<<grid_for(TE, kThreads), kThreads, 0, s>>>(sc->s, j->bias, j->E, sc->c, TE);
    group_score_kernel<<<grid_for(rows * j->n_group, kThreads), kThreads, 0, s>>>(
        sc->c, j->E, j->n_group, j->group_score == MLAF_GROUP_MAX, sc->g, rows * j->n_group);
    group_mask_kernel<<<grid_for(rows, kThreads), kThreads, 0, s>>>(sc->g, j->n_group, j->topk_group, rows);
    masked_fill_kernel<<<grid_for(TE, kThreads), kThreads, 0, s>>>(sc->c, sc->g, j->E, j->n_group, sc->m, TE);
    topk_kernel<<<row_blocks, kThreads, 0, s>>>(sc->m, j->E, j->top_k, j->ids, j->ids_stride, rows);
    return weights_pass(j, sc, s);
}

/* hash routing: score -> ids from the table -> gather -> normalize -> scale */
template <typename T> int moe_gate_hash(const mlaf_moe_gate_job *j, const bench_moe_scratch *sc, cudaStream_t s) {
    const int64_t rows = j->T;
    score_pass<T>(j, sc, s);
    hash_ids_kernel<<<grid_for(rows * j->top_k, kThreads), kThreads, 0, s>>>(
        j->tid2eid, j->tid2eid_dt == MLAF_I64, j->tid2eid_stride, j->vocab, j->token_ids,
        j->token_ids_dt == MLAF_I64, j->E, j->top_k, j->ids, j->ids_stride, rows * j->top_k);
    return weights_pass(j, sc, s);
}

/* moe_gate's steps after the ids: gather, normalize, scale (and the shared slots). */
int weights_pass(const mlaf_moe_gate_job *j, const bench_moe_scratch *sc, cudaStream_t s) {
    const int64_t rows = j->T;
    gather_weights_kernel<<<grid_for(rows * j->top_k, kThreads), kThreads, 0, s>>>(
        sc->s, j->E, j->ids, j->ids_stride, j->top_k, sc->w, rows * j->top_k);
    if (j->renormalize)
        normalize_kernel<<<grid_for(rows, kThreads), kThreads, 0, s>>>(sc->w, j->top_k, j->eps, rows);
    scale_kernel<<<grid_for(rows, kThreads), kThreads, 0, s>>>(
        sc->w, j->top_k, j->n_shared, j->E, j->apply_scaling != 0, j->scaling, j->weights,
        j->weights_dt, j->weights_stride, j->ids, j->ids_stride, rows);
    return (int)cudaGetLastError();
}

template <typename T> int cache_write_by_cache(const mlaf_kv_cache_job *j, const void *kn, const void *kp, cudaStream_t s) {
    switch (j->cache_dt) {
    case MLAF_F16: return cache_write<T, __half>(j, kn, kp, s);
    case MLAF_BF16: return cache_write<T, __nv_bfloat16>(j, kn, kp, s);
    default: return cache_write<T, float>(j, kn, kp, s);
    }
}

} // namespace

/* Dispatch on the activation dtype (validated by the library: f32, f16 or bf16). */
#define BY_DTYPE(dt, fn, ...)                                                      \
    ((dt) == MLAF_F16    ? fn<__half>(__VA_ARGS__)                                 \
     : (dt) == MLAF_BF16 ? fn<__nv_bfloat16>(__VA_ARGS__)                          \
                         : fn<float>(__VA_ARGS__))

extern "C" int blg_split_qk_norm(const mlaf_norm_job *job, void *q_dense, void *kv_dense,
                                 void *stream) {
    if (job->T == 0) return 0;
    return BY_DTYPE(job->dt, split_norm, job, q_dense, kv_dense, (cudaStream_t)stream);
}

extern "C" int blg_rope_rows(void *x, mlaf_dtype dt, int64_t T, int64_t stride,
                             const mlaf_rope_job *rope, void *stream) {
    if (T == 0 || rope->R <= 0) return 0;
    return BY_DTYPE(dt, rope_rows, x, T, stride, (int64_t)1, rope, (cudaStream_t)stream);
}

extern "C" int blg_cache_write(const mlaf_kv_cache_job *job, const void *k_nope, const void *k_pe,
                               void *stream) {
    if (job->norm.T == 0) return 0;
    return BY_DTYPE(job->norm.dt, cache_write_by_cache, job, k_nope, k_pe, (cudaStream_t)stream);
}

extern "C" int blg_cache_write_fp8(const mlaf_kv_cache_job *job, const void *k_nope,
                                   const void *k_pe, void *stream) {
    if (job->norm.T == 0) return 0;
    if (job->format == MLAF_KV_FP8_DS_MLA) /* bf16 rows only (validated) */
        return ds_mla_write(job, k_nope, k_pe, (cudaStream_t)stream);
    if (job->format == MLAF_KV_FP8_V4) /* bf16 rows of 512 only (validated) */
        return v4_write(job, k_nope, (cudaStream_t)stream);
    if (job->format != MLAF_KV_FP8) return (int)cudaErrorInvalidValue;
    return BY_DTYPE(job->norm.dt, fp8_write, job, k_nope, k_pe, (cudaStream_t)stream);
}

extern "C" int blg_head_norm(const mlaf_rope_q_job *job, void *stream) {
    return BY_DTYPE(job->dt, head_norm, job, (cudaStream_t)stream);
}

extern "C" int blg_rope_q(const mlaf_rope_q_job *job, void *gather, void *stream) {
    return BY_DTYPE(job->dt, rope_q, job, gather, (cudaStream_t)stream);
}

extern "C" int blg_moe_gate(const mlaf_moe_gate_job *job, const bench_moe_scratch *s, void *stream) {
    if (job->T == 0) return 0;
    return BY_DTYPE(job->logits_dt, moe_gate, job, s, (cudaStream_t)stream);
}

extern "C" int blg_moe_gate_hash(const mlaf_moe_gate_job *job, const bench_moe_scratch *s, void *stream) {
    if (job->T == 0) return 0;
    return BY_DTYPE(job->logits_dt, moe_gate_hash, job, s, (cudaStream_t)stream);
}

extern "C" const char *blg_error_string(int code) {
    return cudaGetErrorString(static_cast<cudaError_t>(code));
}
