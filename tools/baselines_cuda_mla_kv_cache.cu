/* baselines_cuda_mla_kv_cache.cu — mla_kv_cache's unfused CUDA passes after the library's split_qk_norm:
 * RoPE of dense rows, the plain cache write and the fp8 quantize-and-write kernels (see baselines_cuda.cuh). */
#include "baselines_cuda.cuh"

namespace {

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

/* CUDA's own conversion (the reference of docs/kv_formats.md): nearest even, satfinite, NaN -> 0x7F. */
__device__ __forceinline__ uint32_t e4m3(float x) {
    return (uint32_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

/* The fp8_ds_mla tile scale of a NaN-free amax (docs/kv_formats.md): amax max(amax / 448, FLT_MIN); ue8m0
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

/* fp8_v4 (docs/kv_formats.md): a warp per token over its dense bf16 row of 512 (the last 64 roped): lane l
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

template <typename T> int cache_write_by_cache(const mlaf_kv_cache_job *j, const void *kn, const void *kp, cudaStream_t s) {
    switch (j->cache_dt) {
    case MLAF_F16: return cache_write<T, __half>(j, kn, kp, s);
    case MLAF_BF16: return cache_write<T, __nv_bfloat16>(j, kn, kp, s);
    default: return cache_write<T, float>(j, kn, kp, s);
    }
}

} // namespace

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
