/*
 * backend.cu — CUDA backend core: device discovery, the op table, memory helpers for the
 * tools and tests, and the launch guard that puts a call on the context's device.
 *
 * Ops never allocate, synchronize or read device memory on the host; they only enqueue
 * kernels on ctx->cuda_stream, so they can be captured in a CUDA graph.
 */
#include <cuda_runtime.h>

#include "cuda_common.cuh"

extern "C" {

const mlaf_backend_iface mlaf_cuda_backend = {
    mlaf_cuda_split_qk_norm,
    mlaf_cuda_mla_kv_cache,
    mlaf_cuda_rope_q,
    mlaf_cuda_moe_gate,
    mlaf_cuda_mla_kv_cache_dsa,
    mlaf_cuda_indexer_q,
    mlaf_cuda_rms_norm_quant,
    mlaf_cuda_gemm_quant,
};

int mlaf_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* no driver / no device: clear the sticky-free error */
        return 0;
    }
    return n;
}

mlaf_status mlaf_cuda_bind_device(mlaf_context *ctx, int device) {
    int sms = 0, major = 0, minor = 0;
    cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return mlaf_fail(ctx, MLAF_ERR_DEVICE, "cuda device %d: %s", device, cudaGetErrorString(e));
    }
    ctx->cuda_device = device;
    ctx->cuda_sm_count = sms;
    ctx->cuda_cc = major * 10 + minor;
    return MLAF_OK;
}

mlaf_status mlaf_cuda_mem_alloc(void **p, size_t bytes) {
    cudaError_t e = cudaMalloc(p, bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *p = NULL;
        return MLAF_ERR_DEVICE;
    }
    return MLAF_OK;
}

void mlaf_cuda_mem_free(void *p) { (void)cudaFree(p); }

mlaf_status mlaf_cuda_mem_copy(void *dst, const void *src, size_t bytes, int to_device) {
    cudaError_t e = cudaMemcpy(dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost);
    return e == cudaSuccess ? MLAF_OK : MLAF_ERR_DEVICE;
}

mlaf_status mlaf_cuda_sync(mlaf_context *ctx) {
    mlaf_cuda_device_guard g(ctx);
    cudaError_t e = cudaStreamSynchronize((cudaStream_t)ctx->cuda_stream);
    if (e != cudaSuccess)
        return mlaf_fail(ctx, MLAF_ERR_DEVICE, "cuda stream: %s", cudaGetErrorString(e));
    return MLAF_OK;
}

} /* extern "C" */

mlaf_status mlaf_cuda_check_launch(mlaf_context *ctx, const char *op) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return mlaf_fail(ctx, MLAF_ERR_DEVICE, "%s: kernel launch failed: %s", op, cudaGetErrorString(e));
    return MLAF_OK;
}
