/*
 * indexer_q.cu — CUDA indexer_q (SPEC §10): one warp per item of the flattened [T, H + Hq]:
 * an indexer head (RoPE on [0, 64), the optional Hadamard, the UE8M0 / f32 scale, 128 e4m3 bytes
 * and the folded weight; index_row.cuh's arithmetic, the CPU's bits) or, with q_pe, an MLA
 * query head whose last 64 columns are rotated in place (rope_q's rotation: lane l takes pair l).
 * A streaming kernel: 512 bytes in (bf16) and 132 out per indexer head; 4 warps a block and a
 * grid-stride loop (items may exceed a grid). A token whose position is invalid is counted once
 * (by its item 0) and nothing of it is written.
 */
#include "index_row.cuh"

#define IQ_WARPS 4

template <typename T, typename P>
__global__ void __launch_bounds__(IQ_WARPS * 32) mlaf_indexer_q_kernel(const mlaf_indexer_q_job j) {
    const int lane = threadIdx.x & 31;
    const int64_t HH = j.H + j.pe_H, n = j.T * HH;
    const int64_t step = (int64_t)gridDim.x * IQ_WARPS;
    for (int64_t it = (int64_t)blockIdx.x * IQ_WARPS + (threadIdx.x >> 5); it < n; it += step) {
        const int64_t t = it / HH, h = it % HH;
        const int64_t pos = mlaf_ld_index(j.rope.positions, j.rope.pos_dt == MLAF_I64, t);
        if (pos < 0 || pos >= j.rope.max_pos) {
            if (h == 0 && lane == 0 && j.error_count) mlaf_cuda_error_count_add(j.error_count, 1);
            continue;
        }
        const float *cs = j.rope.cos_sin + pos * j.rope.cos_sin_stride;
        if (h >= j.H) { /* the MLA q_pe head: pair l of its last 64 columns */
            P *x = static_cast<P *>(j.q_pe) + t * j.pe_s0 + (h - j.H) * j.pe_s1 + (j.pe_D - MLAF_INDEX_ROPE_DIM);
            const bool neox = j.pe_style == MLAF_ROPE_NEOX;
            const int a = neox ? lane : 2 * lane, b = neox ? lane + 32 : 2 * lane + 1;
            const float x0 = mlaf_ld(x + a), x1 = mlaf_ld(x + b), c = __ldg(cs + lane), s = __ldg(cs + 32 + lane);
            mlaf_st(x + a, mlaf_rope_x0(x0, x1, c, s));
            mlaf_st(x + b, mlaf_rope_x1(x0, x1, c, s));
            continue;
        }
        float v[4];
        mlaf_idx_load(static_cast<const T *>(j.q) + t * j.q_s0 + h * j.q_s1, lane, v);
        mlaf_idx_rope<T>(v, lane, j.rope.style == MLAF_ROPE_NEOX, cs);
        if (j.hadamard) mlaf_idx_hadamard<T>(v, lane);
        const float s = mlaf_idx_scale(v, j.amax_eps, (int)j.scale);
        mlaf_idx_store_e4m3(j.q_fp8 + t * j.f_s0 + h * j.f_s1 + 4 * lane, v, s);
        if (lane == 0) {
            const float w = mlaf_ld_weight<T>(static_cast<const char *>(j.w) +
                                                  t * j.w_stride * (int64_t)(j.w_dt == MLAF_F32 ? 4 : sizeof(T)),
                                              j.w_dt == MLAF_F32, h);
            j.w_out[t * j.wo_stride + h] = __fmul_rn(__fmul_rn(__fmul_rn(w, s), j.w_fold), j.h_fold);
        }
    }
}

template <typename T> static cudaError_t iq_launch_pe(const mlaf_indexer_q_job *job, cudaStream_t stream) {
    const int64_t items = job->T * (job->H + job->pe_H);
    int64_t blocks = (items + IQ_WARPS - 1) / IQ_WARPS;
    if (blocks > ((int64_t)1 << 24)) blocks = (int64_t)1 << 24;
    const mlaf_dtype pdt = job->q_pe ? job->pe_dt : job->dt;
    if (pdt == MLAF_F32) mlaf_indexer_q_kernel<T, float><<<(unsigned)blocks, IQ_WARPS * 32, 0, stream>>>(*job);
    else if (pdt == MLAF_F16) mlaf_indexer_q_kernel<T, __half><<<(unsigned)blocks, IQ_WARPS * 32, 0, stream>>>(*job);
    else mlaf_indexer_q_kernel<T, __nv_bfloat16><<<(unsigned)blocks, IQ_WARPS * 32, 0, stream>>>(*job);
    return cudaGetLastError();
}

extern "C" mlaf_status mlaf_cuda_indexer_q(mlaf_context *ctx, const mlaf_indexer_q_job *job) {
    if (job->T == 0 || job->H + job->pe_H == 0) return MLAF_OK;
    mlaf_cuda_device_guard guard(ctx);
    const cudaStream_t stream = (cudaStream_t)ctx->cuda_stream;
    const cudaError_t e = job->dt == MLAF_F32   ? iq_launch_pe<float>(job, stream)
                          : job->dt == MLAF_F16 ? iq_launch_pe<__half>(job, stream)
                                                : iq_launch_pe<__nv_bfloat16>(job, stream);
    if (e != cudaSuccess)
        return mlaf_fail(ctx, MLAF_ERR_DEVICE, "indexer_q: kernel launch failed: %s", cudaGetErrorString(e));
    return MLAF_OK;
}
