/* baselines_cuda_rms_norm_quant.cu — rms_norm_quant's unfused CUDA passes (see bench.h): the residual
 * add and the RMSNorm as kernels of their own, and the per-token-group quantize kernel engines run
 * after their norm (SGLang's per_token_group_quant: a group of g values on g / 8 lanes of a warp,
 * 16-byte loads where the rows allow them, the amax a shuffle max over those lanes). */
#include "baselines_cuda.cuh"
#include "gemm_format.h"

namespace {

__global__ void __launch_bounds__(kThreads) add_kernel(const void *x, int64_t xs, void *r, int64_t rs, mlaf_dtype dt,
                                                       int64_t T, int32_t K) {
    const int64_t n = T * K;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / K, k = i % K;
        st_any(r, dt, t * rs + k, ld_any(x, dt, t * xs + k) + ld_any(r, dt, t * rs + k));
    }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) norm_kernel(const T *x, int64_t xs, T *y, int64_t ys, const void *w,
                                                        mlaf_dtype wdt, int32_t n, float eps) {
    const int64_t t = blockIdx.x;
    const T *xr = x + t * xs;
    T *yr = y + t * ys;
    float ss = 0.0f;
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = io<T>::ld(xr + i);
        ss += v * v;
    }
    ss = block_sum(ss);
    const float rstd = 1.0f / sqrtf(ss / (float)n + eps);
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x) io<T>::st(yr + i, io<T>::ld(xr + i) * rstd * ld_any(w, wdt, i));
}

template <typename T> int add_rmsnorm(const mlaf_rms_norm_quant_job *j, cudaStream_t s) {
    if (j->residual)
        add_kernel<<<grid_for(j->T * j->K, kThreads), kThreads, 0, s>>>(j->x, j->x_stride, j->residual, j->r_stride, j->dt,
                                                                        j->T, j->K);
    const bool r = j->residual != nullptr;
    norm_kernel<T><<<(unsigned)j->T, kThreads, 0, s>>>(static_cast<const T *>(r ? j->residual : j->x),
                                                      r ? j->r_stride : j->x_stride, static_cast<T *>(j->y),
                                                      j->y_stride, j->w, j->w_dt, j->K, j->eps);
    return (int)cudaGetLastError();
}

/* ---- the quantize pass -------------------------------------------------------------------- */
__device__ __forceinline__ int ceil_log2(float v) {
    const uint32_t u = __float_as_uint(v);
    return u == 0x7f800000u ? 128 : (int)(u >> 23) - 127 + ((u & 0x7fffffu) != 0);
}

/* A group's scale (docs/gemm_formats.md) from its NaN-free amax, and its UE8M0 byte. */
__device__ __forceinline__ float group_scale(int mode, float amax, float eps, uint32_t *byte) {
    if (mode == MLAF_GEMM_SCALE_F32) {
        *byte = 0;
        return __fdiv_rn(fmaxf(amax, eps), 448.0f);
    }
    int e;
    if (mode == MLAF_GEMM_SCALE_UE8M0) {
        e = ceil_log2(__fdiv_rn(fmaxf(amax, eps), 448.0f));
    } else if (isinf(amax)) {
        e = 128;
    } else if (mode == MLAF_GEMM_SCALE_MX_FLOOR) {
        e = amax < FLT_MIN ? -127 : max(ilogbf(amax) - 8, -127);
    } else {
        const float q = __fdiv_rn(amax, 448.0f);
        e = q >= FLT_MIN ? ceil_log2(q) : q > 0x1p-127f ? -126 : -127;
    }
    *byte = (uint32_t)(e + 127);
    return e >= -126 ? __uint_as_float((uint32_t)(e + 127) << 23) : __uint_as_float(1u << (e + 149));
}

template <typename T>
__global__ void __launch_bounds__(kThreads) quant_kernel(mlaf_gemm_out_job q, const T *y, int64_t ys, int64_t T_,
                                                         int32_t K, int vec, int pack, int mn, int f32) {
    constexpr int N = 16 / sizeof(T); /* values per lane */
    const int32_t g = q.group, lanes = g / N, G = K / g;
    const int64_t ngroups = T_ * G;
    const int64_t per_block = kThreads / lanes;
    const int lane = threadIdx.x % lanes;
    /* the warp's first group decides the trip: every lane of a warp takes part in the shuffles */
    for (int64_t gw = (int64_t)blockIdx.x * per_block + (threadIdx.x / 32) * (32 / lanes); gw < ngroups;
         gw += (int64_t)gridDim.x * per_block) {
        const int64_t gi = gw + (threadIdx.x % 32) / lanes;
        const bool ok = gi < ngroups;
        const int64_t t = ok ? gi / G : 0, j = ok ? gi % G : 0;
        float x[N];
        const T *src = y + t * ys + j * g + lane * N;
        if (ok && vec) {
            const uint4 v = *reinterpret_cast<const uint4 *>(src);
            const T *e = reinterpret_cast<const T *>(&v);
            for (int k = 0; k < N; k++) x[k] = io<T>::ld(e + k);
        } else {
            for (int k = 0; k < N; k++) x[k] = ok ? io<T>::ld(src + k) : 0.0f;
        }
        float m = 0.0f;
        for (int k = 0; k < N; k++) m = fmaxf(m, fabsf(x[k]));
        for (int o = lanes / 2; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (!ok) continue;
        uint32_t byte;
        const float s = group_scale((int)q.scale, m, q.eps, &byte);
        uint8_t *d = q.data + t * q.data_stride + j * g + lane * N;
        for (int k = 0; k < N; k++) d[k] = (uint8_t)__nv_cvt_float_to_fp8(__fdiv_rn(x[k], s), __NV_SATFINITE, __NV_E4M3);
        if (lane != 0) continue;
        /* the scale where the format's row says (docs/gemm_formats.md) */
        const int64_t c = j / pack, e = mn ? c * q.scale_ld + t : t * q.scale_ld + c;
        if (f32) {
            static_cast<float *>(q.scales)[e] = s;
        } else {
            uint8_t *p = static_cast<uint8_t *>(q.scales) + e * pack;
            p[j % pack] = (uint8_t)byte;
            if (j == G - 1)
                for (int64_t b = j % pack + 1; b < pack; b++) p[b] = 0;
        }
    }
}

template <typename T>
int gemm_quant(const mlaf_gemm_out_job *q, const void *y, int64_t T_, int64_t K, int64_t stride, cudaStream_t s) {
    const int vec = ((uintptr_t)y % 16 == 0) && ((stride * (int64_t)sizeof(T)) % 16 == 0);
    const int64_t lanes = q->group / (16 / (int64_t)sizeof(T)), groups = T_ * (K / q->group);
    const mlaf_gemm_format_info *r = mlaf_gemm_format_row(q->format);
    quant_kernel<T><<<grid_for(groups, (int)(kThreads / lanes)), kThreads, 0, s>>>(
        *q, static_cast<const T *>(y), stride, T_, (int32_t)K, vec, r->pack, r->mn_major, r->scale_dt == MLAF_F32);
    return (int)cudaGetLastError();
}

} // namespace

extern "C" int blg_add_rmsnorm(const mlaf_rms_norm_quant_job *job, void *stream) {
    if (job->T == 0) return 0;
    return BY_DTYPE(job->dt, add_rmsnorm, job, (cudaStream_t)stream);
}

extern "C" int blg_gemm_quant(const mlaf_gemm_out_job *q, const void *y, mlaf_dtype dt, int64_t T, int64_t K,
                              int64_t stride, void *stream) {
    if (T == 0 || q->format == MLAF_GEMM_NONE) return 0;
    return BY_DTYPE(dt, gemm_quant, q, y, T, K, stride, (cudaStream_t)stream);
}
