/*
 * rms_norm_quant.cu — CUDA rms_norm_quant (include/mlafuse/quant.h, docs/gemm_formats.md).
 *
 * One block per row. The row is nvec = ceil(K / W) vectors of W values (16 bytes of the dtype).
 * The canonical map, which fixes the order of the sum of squares: NVC = 2, 4 or 8 vectors a thread
 * for nvec up to 512, 1024, 2048 (K up to 16384 in bf16 / f16, 8192 in f32), BSC =
 * round_up(ceil(nvec / NVC), 32) threads, thread c owning vectors c + k * BSC. Per row:
 *   1. h = x, or round(x + residual) stored back into the residual (fp32 sum, one rounding);
 *      each vector's sum of h^2 (an fmaf chain from 0); canonical thread c adds those of its
 *      vectors in k order, the warps' sums by butterfly shuffles, the block's by warp 0's butterfly
 *      over them: one fixed order per (K, dtype), whatever T, the alignment or the call's outputs;
 *   2. rstd = 1 / sqrt(sum / K + eps) (IEEE sqrt and division);
 *   3. y = (h * rstd) * w, rounded once to the dtype and stored; with a quantized output the
 *      rounded values go to the format's writer (gemm_writers.cuh).
 * The vector path (rows up to 2048 vectors) runs one vector a thread (two past 1024 vectors: NV = 1
 * or 2, round_up(ceil(nvec / NV), 32) threads, thread tid owning vectors tid + k * BS): the row in
 * registers between the passes, every load of the row (x, the residual, weights of the row's dtype)
 * issued before anything is computed or stored (the residual's store would otherwise order the next
 * vector's loads after it: the two may alias, as far as the compiler knows), each vector's sum of
 * squares through shared memory to the canonical threads. A group of g values (g / W vectors) sits in
 * g / W consecutive lanes of one warp and its amax is a shuffle max over them. At K = 7168 (bf16,
 * H200) this shape against the canonical one as its own launch: 3.45 against 4.45 us a call at T = 1,
 * 87 against 78% of copy at T = 131072 (fp8_1x128_mn; dev/README.md). Longer rows, and the element
 * path, loop over the canonical map with BSC threads (256 past 2048 vectors) and read x (or the
 * residual they wrote) again. The vector path needs 16-byte aligned rows, weights and y, K a multiple
 * of W and the e4m3 rows aligned to W bytes; any other call takes the element path: per-element loads
 * and stores in the same order of operations, so every path gives the same bits, and the fused bytes
 * equal those of a dense call followed by a quantize pass.
 */
#include "gemm_writers.cuh"

namespace {

/* The sum of each thread's v over the first nw warps of the block, in a fixed order: warp sums, then
 * warp 0's butterfly over them (zeros past nw; a sum of squares has no -0 to lose), not a serial
 * chain of nw shared loads. sh: 33 floats of shared memory. */
__device__ __forceinline__ float warps_sum(float v, int nw, float *sh) {
    v = mlaf_warp_sum(v);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0 && warp < nw) sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        const float s = mlaf_warp_sum(lane < nw ? sh[lane] : 0.0f);
        if (lane == 0) sh[32] = s;
    }
    __syncthreads();
    return sh[32];
}

/* The block's sum of each thread's v, in a fixed order. */
__device__ __forceinline__ float block_sum(float v, float *sh) { return warps_sum(v, blockDim.x >> 5, sh); }

/* The block's sum of squares in the order of the canonical shape (nvc vectors a thread over bsc
 * threads, see the launch) from the per-vector sums sq[v] (shared memory, written before the
 * barrier this starts with): a launch with fewer vectors a thread gives the same bits. */
__device__ __forceinline__ float canon_sum(const float *sq, int32_t nvec, int nvc, int bsc, float *sh) {
    __syncthreads();
    const int tid = threadIdx.x;
    float acc = 0.0f;
    if (tid < bsc)
        for (int k = 0; k < nvc; k++) {
            const int v = tid + k * bsc;
            if (v < nvec) acc = __fadd_rn(acc, sq[v]);
        }
    return warps_sum(acc, bsc >> 5, sh);
}

/* W values of a row at vector v: one 16-byte load, or up to W elements below K (zeros past it). */
template <typename T, bool VEC>
__device__ __forceinline__ void load_vec(const T *row, int64_t v, int64_t K, float *f) {
    constexpr int W = mlaf_vec<T>::W;
    if constexpr (VEC) {
        mlaf_vec<T>::unpack(*reinterpret_cast<const uint4 *>(row + v * W), f);
    } else {
#pragma unroll
        for (int i = 0; i < W; i++) f[i] = v * W + i < K ? mlaf_ld(row + v * W + i) : 0.0f;
    }
}

/* W values rounded to T stored at vector v (the values as stored come back in f). */
template <typename T, bool VEC>
__device__ __forceinline__ void store_vec(T *row, int64_t v, int64_t K, float *f) {
    constexpr int W = mlaf_vec<T>::W;
    const uint4 p = mlaf_vec<T>::pack(f);
    if constexpr (VEC) {
        *reinterpret_cast<uint4 *>(row + v * W) = p;
    } else {
#pragma unroll
        for (int i = 0; i < W; i++)
            if (v * W + i < K) mlaf_st(row + v * W + i, f[i]);
    }
    mlaf_vec<T>::unpack(p, f);
}

/* h of vector v: x, or round(x + residual) with the residual updated. */
template <typename T, bool VEC>
__device__ __forceinline__ void load_h(const mlaf_rms_norm_quant_job &j, const T *x, T *r, int64_t v, float *h) {
    constexpr int W = mlaf_vec<T>::W;
    load_vec<T, VEC>(x, v, j.K, h);
    if (!r) return;
    float a[W];
    load_vec<T, VEC>(r, v, j.K, a);
#pragma unroll
    for (int i = 0; i < W; i++) h[i] = __fadd_rn(h[i], a[i]);
    store_vec<T, VEC>(r, v, j.K, h);
}

/* Pass 2 of vector v: y = (h * rstd) * w rounded and stored, then the quantized output. Every lane of
 * the block calls it the same number of times (ok: v is a vector of the row). */
template <typename T, int F, bool VEC>
__device__ __forceinline__ void rnq_out(const mlaf_rms_norm_quant_job &j, int64_t t, T *y, int64_t v, bool ok,
                                        float rstd, float *f, const uint4 *wpre = nullptr) {
    constexpr int W = mlaf_vec<T>::W;
    const int64_t K = j.K;
    if (ok) {
        float w[W];
        if (VEC && wpre) {
            mlaf_vec<T>::unpack(*wpre, w);
        } else if constexpr (VEC) {
            mlaf_ld_weights_vec<T>(j.w, j.w_dt == MLAF_F32, v * W, w);
        } else {
#pragma unroll
            for (int i = 0; i < W; i++)
                w[i] = v * W + i < K ? mlaf_ld_weight<T>(j.w, j.w_dt == MLAF_F32, v * W + i) : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < W; i++) f[i] = __fmul_rn(__fmul_rn(f[i], rstd), w[i]);
        if (y) {
            store_vec<T, VEC>(y, v, K, f);
        } else {
#pragma unroll
            for (int i = 0; i < W; i++) f[i] = mlaf_round_as<T>(f[i]);
        }
    }
    if constexpr (F != MLAF_GEMM_NONE) mlaf_gemm_put_vec<F, W, VEC>(j.q, t, v, K, ok, f);
}

/* Pass 1 of vector v into f (zeros past the row); returns the vector's sum of squares. */
template <typename T, bool VEC>
__device__ __forceinline__ float rnq_in(const mlaf_rms_norm_quant_job &j, const T *x, T *r, int64_t v, bool ok,
                                        float *f) {
    constexpr int W = mlaf_vec<T>::W;
    if (ok) {
        load_h<T, VEC>(j, x, r, v, f);
    } else {
#pragma unroll
        for (int i = 0; i < W; i++) f[i] = 0.0f;
    }
    return mlaf_sumsq<W>(f);
}

template <typename T, int F, int NV, bool VEC>
__global__ void __launch_bounds__(NV > 0 ? 1024 : 256) rnq_kernel(const mlaf_rms_norm_quant_job j, int32_t nvec, int nvc) {
    mlaf_pdl_begin();
    constexpr int W = mlaf_vec<T>::W;
    __shared__ float sh[33];
    __shared__ float sq[NV > 0 ? 1024 * NV : 1]; /* the per-vector sums of squares */
    const int64_t t = blockIdx.x;
    const int bs = blockDim.x, tid = threadIdx.x;
    const T *x = static_cast<const T *>(j.x) + t * j.x_stride;
    T *r = j.residual ? static_cast<T *>(j.residual) + t * j.r_stride : nullptr;
    T *y = j.y ? static_cast<T *>(j.y) + t * j.y_stride : nullptr;
    static_assert(NV == 0 || VEC, "the element path loops over the canonical map (NV = 0)");
    if constexpr (NV > 0) { /* the row in registers between the passes, every load issued first */
        float h[NV][W];
        uint4 xv[NV], rv[NV], wv[NV];
        const bool wt = j.w_dt != MLAF_F32; /* weights of the row's dtype: loaded with the row */
        const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int64_t v = tid + (int64_t)k * bs;
            const bool ok = v < nvec;
            xv[k] = ok ? *reinterpret_cast<const uint4 *>(x + v * W) : zero;
            rv[k] = ok && r ? *reinterpret_cast<const uint4 *>(r + v * W) : zero;
            wv[k] = ok && wt ? __ldg(reinterpret_cast<const uint4 *>(static_cast<const T *>(j.w) + v * W)) : zero;
        }
#pragma unroll
        for (int k = 0; k < NV; k++) { /* h = x, or round(x + residual) stored back; then the sum */
            const int64_t v = tid + (int64_t)k * bs;
            mlaf_vec<T>::unpack(xv[k], h[k]);
            if (r && v < nvec) {
                float a[W];
                mlaf_vec<T>::unpack(rv[k], a);
#pragma unroll
                for (int i = 0; i < W; i++) h[k][i] = __fadd_rn(h[k][i], a[i]);
                store_vec<T, true>(r, v, j.K, h[k]);
            }
            if (v < nvec) sq[v] = mlaf_sumsq<W>(h[k]);
        }
        const float rstd = mlaf_rstd(canon_sum(sq, nvec, nvc, ((nvec + nvc - 1) / nvc + 31) / 32 * 32, sh), j.K, j.eps);
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int64_t v = tid + (int64_t)k * bs;
            rnq_out<T, F, VEC>(j, t, y, v, v < nvec, rstd, h[k], wt ? &wv[k] : nullptr);
        }
    } else { /* long rows and the element path: the source read again in the second pass (the residual as
              * written) */
        const int nk = (nvec + bs - 1) / bs;
        float f[W], acc = 0.0f;
        for (int k = 0; k < nk; k++) {
            const int64_t v = tid + (int64_t)k * bs;
            acc = __fadd_rn(acc, rnq_in<T, VEC>(j, x, r, v, v < nvec, f));
        }
        const float rstd = mlaf_rstd(block_sum(acc, sh), j.K, j.eps);
        for (int k = 0; k < nk; k++) {
            const int64_t v = tid + (int64_t)k * bs;
            const bool ok = v < nvec;
            if (ok) load_vec<T, VEC>(r ? r : x, v, j.K, f);
            rnq_out<T, F, VEC>(j, t, y, v, ok, rstd, f);
        }
    }
}

/* The launch of one format: the shape from nvec alone, the vector or element path. */
template <typename T, int F>
cudaError_t rnq_launch(const mlaf_rms_norm_quant_job *j, cudaStream_t stream) {
    constexpr int W = mlaf_vec<T>::W;
    const int64_t es = sizeof(T);
    const int32_t nvec = (int32_t)((j->K + W - 1) / W);
    const int NVC = nvec <= 512 ? 2 : nvec <= 1024 ? 4 : nvec <= 2048 ? 8 : 0; /* the canonical shape */
    const bool vec = j->K % W == 0 && mlaf_aligned(j->x, j->x_stride * es, 16) &&
                     (!j->residual || mlaf_aligned(j->residual, j->r_stride * es, 16)) &&
                     (!j->y || mlaf_aligned(j->y, j->y_stride * es, 16)) && mlaf_aligned(j->w, 0, 16) &&
                     (j->q.format == MLAF_GEMM_NONE || mlaf_aligned(j->q.data, j->q.data_stride, W));
    /* vector rows up to 2048 vectors: one vector a thread (two past 1024), the canonical order kept */
    const int NV = vec && NVC > 0 ? (nvec <= 1024 ? 1 : 2) : 0;
    const int bs = NV ? ((nvec + NV - 1) / NV + 31) / 32 * 32 : NVC ? ((nvec + NVC - 1) / NVC + 31) / 32 * 32 : 256;
    const dim3 grid((unsigned)j->T), block((unsigned)bs);
    if (!vec) mlaf_launch(rnq_kernel<T, F, 0, false>, grid, block, 0, stream, *j, nvec, NVC);
    else if (NV == 1) mlaf_launch(rnq_kernel<T, F, 1, true>, grid, block, 0, stream, *j, nvec, NVC);
    else if (NV == 2) mlaf_launch(rnq_kernel<T, F, 2, true>, grid, block, 0, stream, *j, nvec, NVC);
    else mlaf_launch(rnq_kernel<T, F, 0, true>, grid, block, 0, stream, *j, nvec, NVC);
    return cudaGetLastError();
}

/* The launch for the job's format: the rows of the format table walked from F = 1 (no quantized
 * output: NONE). */
template <typename T, int F = 1> cudaError_t rnq_dispatch(const mlaf_rms_norm_quant_job *j, cudaStream_t s) {
    if constexpr (F == MLAF_GEMM_FORMAT_COUNT_) {
        return j->q.format == MLAF_GEMM_NONE ? rnq_launch<T, MLAF_GEMM_NONE>(j, s) : cudaErrorInvalidValue;
    } else {
        if (j->q.format != F) return rnq_dispatch<T, F + 1>(j, s);
        if (!mlaf_gemm_writer_matches_row<F>()) return cudaErrorInvalidValue;
        return rnq_launch<T, F>(j, s);
    }
}

} // namespace

extern "C" mlaf_status mlaf_cuda_rms_norm_quant(mlaf_context *ctx, const mlaf_rms_norm_quant_job *job) {
    if (job->T == 0) return MLAF_OK;
    mlaf_cuda_device_guard guard(ctx);
    const cudaStream_t s = (cudaStream_t)ctx->cuda_stream;
    const cudaError_t e = job->dt == MLAF_F32   ? rnq_dispatch<float>(job, s)
                          : job->dt == MLAF_F16 ? rnq_dispatch<__half>(job, s)
                                                : rnq_dispatch<__nv_bfloat16>(job, s);
    if (e != cudaSuccess)
        return mlaf_fail(ctx, MLAF_ERR_DEVICE, "rms_norm_quant: kernel launch failed: %s", cudaGetErrorString(e));
    return MLAF_OK;
}
