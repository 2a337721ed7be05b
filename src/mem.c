/*
 * mem.c — backend memory helpers for the tools and tests (hidden from the public API).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

mlaf_status mlaf_mem_alloc(mlaf_backend b, void **p, size_t bytes) {
    if (!p) return MLAF_ERR_NULL_POINTER;
    *p = NULL;
    if (bytes == 0) bytes = 1;
    if (b == MLAF_BACKEND_CPU) {
        /* 256-byte aligned, as cudaMalloc is and as tensor allocators are (PyTorch's CPU
         * allocator aligns to 64 bytes): the tools then lay out host and device buffers alike,
         * and whole output rows start on cache lines. */
        const size_t align = 256;
        if (bytes > SIZE_MAX - align) return MLAF_ERR_OUT_OF_MEMORY;
        *p = aligned_alloc(align, (bytes + align - 1) / align * align);
        return *p ? MLAF_OK : MLAF_ERR_OUT_OF_MEMORY;
    }
#ifdef MLAF_WITH_CUDA
    if (b == MLAF_BACKEND_CUDA) return mlaf_cuda_mem_alloc(p, bytes);
#endif
    return MLAF_ERR_BACKEND_UNAVAILABLE;
}

void mlaf_mem_free(mlaf_backend b, void *p) {
    if (!p) return;
    if (b == MLAF_BACKEND_CPU) free(p);
#ifdef MLAF_WITH_CUDA
    else if (b == MLAF_BACKEND_CUDA) mlaf_cuda_mem_free(p);
#endif
}

mlaf_status mlaf_mem_upload(mlaf_backend b, void *dst, const void *src_host, size_t bytes) {
    if (bytes == 0) return MLAF_OK;
    if (b == MLAF_BACKEND_CPU) {
        memcpy(dst, src_host, bytes);
        return MLAF_OK;
    }
#ifdef MLAF_WITH_CUDA
    if (b == MLAF_BACKEND_CUDA) return mlaf_cuda_mem_copy(dst, src_host, bytes, 1);
#endif
    return MLAF_ERR_BACKEND_UNAVAILABLE;
}

mlaf_status mlaf_mem_download(mlaf_backend b, void *dst_host, const void *src, size_t bytes) {
    if (bytes == 0) return MLAF_OK;
    if (b == MLAF_BACKEND_CPU) {
        memcpy(dst_host, src, bytes);
        return MLAF_OK;
    }
#ifdef MLAF_WITH_CUDA
    if (b == MLAF_BACKEND_CUDA) return mlaf_cuda_mem_copy(dst_host, src, bytes, 0);
#endif
    return MLAF_ERR_BACKEND_UNAVAILABLE;
}

mlaf_status mlaf_context_sync(mlaf_context *ctx) {
    if (!ctx) return MLAF_ERR_NULL_POINTER;
#ifdef MLAF_WITH_CUDA
    if (ctx->backend == MLAF_BACKEND_CUDA) return mlaf_cuda_sync(ctx);
#endif
    return MLAF_OK;
}
