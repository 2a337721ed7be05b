/*
 * gemm_quant.cu — CUDA gemm_quant (include/mlafuse/quant.h, docs/gemm_formats.md).
 *
 * The grid is (T, C): block (t, c) quantizes vectors [c BS, c BS + BS) of row t, a vector being W
 * values (16 bytes of the dtype) and thread tid of the block owning vector c BS + tid. BS is a
 * multiple of 32, so a format's group (g / W vectors: 16 or 32 lanes for 1x128, 4 or 8 for mxfp8)
 * lies in consecutive lanes of one warp, and each vector goes through mlaf_gemm_put_vec
 * (gemm_writers.cuh), the code rms_norm_quant's output pass uses: the group's amax a shuffle max,
 * its scale, the e4m3 bytes, the scale stored by the group's first lane where the format's row
 * says. C = ceil(nvec / 256) blocks a row, BS = round_up(ceil(nvec / C), 32) threads (K = 7168
 * in bf16: 4 blocks of 224). K is a multiple of every group, hence of W. The vector path needs x's
 * rows 16-byte aligned and q.data's rows aligned to W bytes; any other call takes the element
 * path (the same thread map, element loads and byte stores), which gives the same bits.
 */
#include "gemm_writers.cuh"

namespace {

template <typename T, int F, bool VEC>
__global__ void __launch_bounds__(256) gq_kernel(const mlaf_gemm_quant_job j, int32_t nvec) {
    mlaf_pdl_begin();
    constexpr int W = mlaf_vec<T>::W;
    const int64_t t = blockIdx.x, v = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
    const bool ok = v < nvec;
    const T *x = static_cast<const T *>(j.x) + t * j.x_stride + v * W;
    float f[W];
    if (ok && VEC) {
        mlaf_vec<T>::unpack(*reinterpret_cast<const uint4 *>(x), f);
    } else {
#pragma unroll
        for (int i = 0; i < W; i++) f[i] = ok ? mlaf_ld(x + i) : 0.0f;
    }
    mlaf_gemm_put_vec<F, W, VEC>(j.q, t, v, j.K, ok, f);
}

/* The launch of one format: the shape from nvec alone, the vector or the element path. */
template <typename T, int F> cudaError_t gq_launch(const mlaf_gemm_quant_job *j, cudaStream_t stream) {
    constexpr int W = mlaf_vec<T>::W;
    const int32_t nvec = j->K / W;
    const int32_t chunks = (nvec + 255) / 256;
    const int32_t bs = ((nvec + chunks - 1) / chunks + 31) / 32 * 32;
    const bool vec = mlaf_aligned(j->x, j->x_stride * (int64_t)sizeof(T), 16) &&
                     mlaf_aligned(j->q.data, j->q.data_stride, W);
    const dim3 grid((unsigned)j->T, (unsigned)chunks), block((unsigned)bs);
    if (vec) mlaf_launch(gq_kernel<T, F, true>, grid, block, 0, stream, *j, nvec);
    else mlaf_launch(gq_kernel<T, F, false>, grid, block, 0, stream, *j, nvec);
    return cudaGetLastError();
}

/* The launch for the job's format: the rows of the format table walked from F = 1 (NONE never
 * reaches a backend: validation requires a format). */
template <typename T, int F = 1> cudaError_t gq_dispatch(const mlaf_gemm_quant_job *j, cudaStream_t s) {
    if constexpr (F == MLAF_GEMM_FORMAT_COUNT_) {
        return cudaErrorInvalidValue;
    } else {
        if (j->q.format != F) return gq_dispatch<T, F + 1>(j, s);
        if (!mlaf_gemm_writer_matches_row<F>()) return cudaErrorInvalidValue;
        return gq_launch<T, F>(j, s);
    }
}

} // namespace

extern "C" mlaf_status mlaf_cuda_gemm_quant(mlaf_context *ctx, const mlaf_gemm_quant_job *job) {
    if (job->T == 0) return MLAF_OK;
    mlaf_cuda_device_guard guard(ctx);
    const cudaStream_t s = (cudaStream_t)ctx->cuda_stream;
    const cudaError_t e = job->dt == MLAF_F32   ? gq_dispatch<float>(job, s)
                          : job->dt == MLAF_F16 ? gq_dispatch<__half>(job, s)
                                                : gq_dispatch<__nv_bfloat16>(job, s);
    if (e != cudaSuccess)
        return mlaf_fail(ctx, MLAF_ERR_DEVICE, "gemm_quant: kernel launch failed: %s", cudaGetErrorString(e));
    return MLAF_OK;
}
