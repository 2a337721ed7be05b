/*
 * cuda_common.cuh — what the CUDA kernels share: the op entry points, the device guard,
 * launch-error check, and dtype load/store helpers (fp32 in registers, one rounding at the
 * store). C++ only inside .cu files; the library's face stays extern "C".
 */
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "../internal.h"
mlaf_status mlaf_cuda_split_qk_norm(mlaf_context *ctx, const mlaf_norm_job *job);
mlaf_status mlaf_cuda_mla_kv_cache(mlaf_context *ctx, const mlaf_kv_cache_job *job);
mlaf_status mlaf_cuda_rope_q(mlaf_context *ctx, const mlaf_rope_q_job *job);
mlaf_status mlaf_cuda_mla_kv_cache_dsa(mlaf_context *ctx, const mlaf_kv_cache_job *job, const mlaf_index_job *ix);
mlaf_status mlaf_cuda_indexer_q(mlaf_context *ctx, const mlaf_indexer_q_job *job);
mlaf_status mlaf_cuda_moe_gate(mlaf_context *ctx, const mlaf_moe_gate_job *job);
mlaf_status mlaf_cuda_rms_norm_quant(mlaf_context *ctx, const mlaf_rms_norm_quant_job *job);
mlaf_status mlaf_cuda_gemm_quant(mlaf_context *ctx, const mlaf_gemm_quant_job *job);
}

/* Returns MLAF_ERR_DEVICE with a message if the last launch failed. */
mlaf_status mlaf_cuda_check_launch(mlaf_context *ctx, const char *op);

/* Whether the launches of the op running on this thread are programmatic dependents (the
 * context's mlaf_context_set_cuda_pdl on an sm_90+ device); set by mlaf_cuda_device_guard. */
inline thread_local bool mlaf_cuda_pdl_now = false;
/* ... and whether the row ops may read their non-activation inputs before the wait (setting 2). */
inline thread_local bool mlaf_cuda_pdl_early_now = false;

/* Makes ctx's device current for the scope of a call and restores the caller's after:
 * the op runs on the context's device without changing the calling thread's state. Also
 * carries the context's launch attribute to mlaf_launch for the call's scope. */
struct mlaf_cuda_device_guard {
    int prev = -1;
    bool switched = false;
    bool prev_pdl = false, prev_early = false;
    explicit mlaf_cuda_device_guard(const mlaf_context *ctx) {
        if (cudaGetDevice(&prev) == cudaSuccess && prev != ctx->cuda_device) {
            switched = cudaSetDevice(ctx->cuda_device) == cudaSuccess;
        }
        prev_pdl = mlaf_cuda_pdl_now, prev_early = mlaf_cuda_pdl_early_now;
        mlaf_cuda_pdl_now = ctx->cuda_pdl && ctx->cuda_cc >= 90;
        mlaf_cuda_pdl_early_now = ctx->cuda_pdl == 2 && ctx->cuda_cc >= 90;
    }
    ~mlaf_cuda_device_guard() {
        mlaf_cuda_pdl_now = prev_pdl, mlaf_cuda_pdl_early_now = prev_early;
        if (switched) (void)cudaSetDevice(prev);
    }
};

/* Launches kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent when
 * the call's context asks for it. Errors surface through cudaGetLastError, as for <<<>>>. */
template <typename... KArgs, typename... Args>
inline void mlaf_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                        cudaStream_t stream, Args... args) {
    if (!mlaf_cuda_pdl_now) {
        kernel<<<grid, block, smem, stream>>>(args...);
        return;
    }
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    (void)cudaLaunchKernelEx(&cfg, kernel, args...);
}

/* Every kernel's first statement. Launched as a programmatic dependent, the kernel waits here
 * for the grids before it to complete and their writes to be visible, then lets the next
 * dependent launch; otherwise both are no-ops. Before sm_90: nothing. */
__device__ __forceinline__ void mlaf_pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Adds n >= 1 to a caller's error counter, atomically and saturating at INT32_MAX: a counter
 * at the top stays there instead of wrapping negative (the header's promise). A CAS loop, as
 * atomicAdd then a clamp would let other threads see the wrapped value in between. */
__device__ __forceinline__ void mlaf_cuda_error_count_add(int32_t *ec, int32_t n) {
    int32_t old = *(volatile int32_t *)ec;
    for (;;) {
        const int32_t want = old > INT32_MAX - n ? INT32_MAX : old + n;
        if (want == old) return;
        const int32_t seen = atomicCAS(ec, old, want);
        if (seen == old) return;
        old = seen;
    }
}

/* ---- element access by dtype ---------------------------------------------------------- */
template <typename T> struct mlaf_elem;
template <> struct mlaf_elem<float> {
    static __device__ __forceinline__ float load(float v) { return v; }
    static __device__ __forceinline__ float store(float v) { return v; }
};
template <> struct mlaf_elem<__half> {
    static __device__ __forceinline__ float load(__half v) { return __half2float(v); }
    static __device__ __forceinline__ __half store(float v) { return __float2half_rn(v); }
};
template <> struct mlaf_elem<__nv_bfloat16> {
    static __device__ __forceinline__ float load(__nv_bfloat16 v) { return __bfloat162float(v); }
    static __device__ __forceinline__ __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};

template <typename T> __device__ __forceinline__ float mlaf_ld(const T *p) {
    return mlaf_elem<T>::load(*p);
}
template <typename T> __device__ __forceinline__ void mlaf_st(T *p, float v) {
    *p = mlaf_elem<T>::store(v);
}

/* Loads element i of a weight vector stored in f32 or in the activation dtype T. */
template <typename T>
__device__ __forceinline__ float mlaf_ld_weight(const void *w, bool w_is_f32, int64_t i) {
    return w_is_f32 ? static_cast<const float *>(w)[i] : mlaf_ld(static_cast<const T *>(w) + i);
}

/* ---- sm_90 bulk copies counted on an mbarrier (no-ops below sm_90: callers take another path
 * there). bar, dst: shared-memory addresses (__cvta_generic_to_shared). ------------------------ */
__device__ __forceinline__ void mlaf_bar_init(uint32_t bar, uint32_t count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
/* The calling thread arrives on bar expecting `bytes` more bytes in this phase (0: an arrival
 * only). */
__device__ __forceinline__ void mlaf_bar_expect(uint32_t bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
/* bytes (> 0, a multiple of 16, 16-byte aligned ends) global -> shared, counted on bar. */
__device__ __forceinline__ void mlaf_bulk_copy(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
#endif
}
/* Both: the calling thread arrives with `bytes` (0: an arrival only, no copy). */
__device__ __forceinline__ void mlaf_bulk_load(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
    mlaf_bar_expect(bar, bytes);
    if (bytes) mlaf_bulk_copy(dst, src, bytes, bar);
}
/* Asks L2 to fetch bytes (a multiple of 16, 16-byte aligned) of global memory; no completion
 * to wait for. sm_90; a no-op elsewhere. */
__device__ __forceinline__ void mlaf_prefetch_l2(const void *src, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
#endif
}
/* Asks L2 to fetch the line holding one address (prefetch.global.L2, every arch): a hint,
 * nothing to wait for. */
__device__ __forceinline__ void mlaf_prefetch_line_l2(const void *p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}
/* Returns once the phase `parity` of bar has completed. */
__device__ __forceinline__ void mlaf_bar_wait(uint32_t bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    uint32_t ok = 0;
    do {
        asm volatile("{\n\t.reg .pred p;\n\t"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
    } while (!ok);
#endif
}
/* This thread's earlier shared-memory accesses are ordered before its later bulk copies. */
__device__ __forceinline__ void mlaf_fence_async() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}
/* bytes (> 0, a multiple of 16, both ends 16-byte aligned) shared -> global, in the calling
 * thread's current bulk group. */
__device__ __forceinline__ void mlaf_bulk_store(void *dst, uint32_t src, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(src), "r"(bytes)
                 : "memory");
#endif
}
/* Closes the calling thread's current bulk group. */
__device__ __forceinline__ void mlaf_bulk_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
#endif
}
/* Returns once at most N of the calling thread's bulk groups still read shared memory. */
template <int N> __device__ __forceinline__ void mlaf_bulk_wait_read() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
#endif
}
/* Returns once every bulk group of the calling thread has completed (its writes done). */
__device__ __forceinline__ void mlaf_bulk_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#endif
}
