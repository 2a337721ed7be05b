/*
 * indexer_q.cu — CUDA indexer_q (docs/dsa.md). Per indexer head of 128 values, with index_row.cuh's
 * arithmetic in the same order (the CPU's bits; dev/cuda/indexer_q_v1 checks every byte):
 *   1. half a warp per head: lane l of the half holds values [8 l, 8 l + 8) (one 16-byte load
 *      when q_idx allows it, two for f32);
 *   2. RoPE on [0, 64): interleaved pairs inside a lane, NeoX pairs (i, i + 32) between lanes l
 *      and l ^ 4 of the half; rounded to q_idx's dtype;
 *   3. the optional Hadamard: strides 1, 2, 4 inside the lane, 8 .. 64 between lanes l and
 *      l ^ 1 .. 8 (lower index a + b, upper a - b), then * f32(128^-0.5), rounded;
 *   4. amax by a half-warp max, the scale (UE8M0 or f32), e4m3(y / s) as 8 bytes a lane; for a
 *      UE8M0 scale s = 2^e, y * 2^-e (the same real, so the same rounded value);
 *   5. the folded weight w · s · w_fold · h_fold.
 * Launch: a warp takes hg heads of one token, four per step (two per half), and issues the next
 * step's loads before it computes the current one; hg is the largest of H, 32, 16, 8, 4 that still
 * gives two waves of resident warps. w is read and w_out written once per 32 heads, coalesced.
 * With q_pe, the MLA query heads are items after the indexer's: a warp per (token, head) rotates
 * the head's last 64 columns in place (rope_q's rotation, lane l pair l). A token whose position
 * is invalid is counted once and nothing of it is written. Grid-stride over items (64-bit).
 */
#include "index_row.cuh"

#include <atomic>

#define IQ_WARPS 4
#define IQ_FULL 0xffffffffu

namespace {

struct iq_cfg {
    int64_t items;   /* T * ngroups indexer items, then T * pe_H q_pe items */
    int64_t n_idx;   /* T * ngroups */
    int32_t hg;      /* heads per indexer item (a multiple of 4) */
    int32_t ngroups; /* ceil(H / hg) */
    int32_t qvec;    /* q_idx by 16-byte loads */
    int32_t fw;      /* e4m3 stores of 8, 4 or 1 byte(s) */
    int32_t csvec;   /* cos / sin by float4 loads */
};

/* A lane's 8 values of a head as loaded: 4 words of two 16-bit values, or 8 f32 words. */
template <typename T> struct iq_raw {
    uint32_t w[2 * sizeof(T)];
};

template <typename T> __device__ __forceinline__ void iq_load(const T *p, bool vec, iq_raw<T> &r) {
    if (vec) {
#pragma unroll
        for (int i = 0; i < (int)sizeof(T) / 2; i++) {
            const uint4 u = reinterpret_cast<const uint4 *>(p)[i];
            r.w[4 * i] = u.x, r.w[4 * i + 1] = u.y, r.w[4 * i + 2] = u.z, r.w[4 * i + 3] = u.w;
        }
    } else if constexpr (sizeof(T) == 4) {
#pragma unroll
        for (int k = 0; k < 8; k++) r.w[k] = __float_as_uint(p[k]);
    } else {
        const unsigned short *e = reinterpret_cast<const unsigned short *>(p);
#pragma unroll
        for (int k = 0; k < 4; k++) r.w[k] = (uint32_t)e[2 * k] | ((uint32_t)e[2 * k + 1] << 16);
    }
}

template <typename T> __device__ __forceinline__ void iq_zero(iq_raw<T> &r) {
#pragma unroll
    for (int k = 0; k < 2 * (int)sizeof(T); k++) r.w[k] = 0u;
}

template <typename T> __device__ __forceinline__ void iq_unpack(const iq_raw<T> &r, float *v) {
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if constexpr (sizeof(T) == 4) {
            v[2 * k] = __uint_as_float(r.w[2 * k]), v[2 * k + 1] = __uint_as_float(r.w[2 * k + 1]);
        } else if constexpr (std::is_same<T, __nv_bfloat16>::value) {
            v[2 * k] = __uint_as_float(r.w[k] << 16), v[2 * k + 1] = __uint_as_float(r.w[k] & 0xffff0000u);
        } else {
            v[2 * k] = __half2float(__ushort_as_half((unsigned short)(r.w[k] & 0xffffu)));
            v[2 * k + 1] = __half2float(__ushort_as_half((unsigned short)(r.w[k] >> 16)));
        }
    }
}

__device__ __forceinline__ void iq_store8(uint8_t *p, const uint32_t *w, int fw) {
    if (fw == 8) {
        *reinterpret_cast<uint2 *>(p) = make_uint2(w[0], w[1]);
    } else if (fw == 4) {
        reinterpret_cast<uint32_t *>(p)[0] = w[0], reinterpret_cast<uint32_t *>(p)[1] = w[1];
    } else {
#pragma unroll
        for (int b = 0; b < 8; b++) p[b] = (uint8_t)(w[b >> 2] >> (8 * (b & 3)));
    }
}

/* One q_pe head: pair l of its last 64 columns by lane l. */
template <typename P>
__device__ __forceinline__ void iq_pe_head(const mlaf_indexer_q_job &j, int64_t t, int64_t h, const float *cs,
                                           int lane) {
    P *x = static_cast<P *>(j.q_pe) + t * j.pe_s0 + h * j.pe_s1 + (j.pe_D - MLAF_INDEX_ROPE_DIM);
    const bool neox = j.pe_style == MLAF_ROPE_NEOX;
    const int a = neox ? lane : 2 * lane, b = neox ? lane + 32 : 2 * lane + 1;
    const float x0 = mlaf_ld(x + a), x1 = mlaf_ld(x + b), c = __ldg(cs + lane), s = __ldg(cs + 32 + lane);
    mlaf_st(x + a, mlaf_rope_x0(x0, x1, c, s));
    mlaf_st(x + b, mlaf_rope_x1(x0, x1, c, s));
}

template <typename T, typename P>
__global__ void __launch_bounds__(IQ_WARPS * 32) mlaf_indexer_q_kernel(const mlaf_indexer_q_job j, const iq_cfg c) {
    mlaf_pdl_begin();
    const int lane = threadIdx.x & 31, half = lane >> 4, hl = lane & 15;
    const int64_t step = (int64_t)gridDim.x * IQ_WARPS;
    for (int64_t it = (int64_t)blockIdx.x * IQ_WARPS + (threadIdx.x >> 5); it < c.items; it += step) {
        if (it >= c.n_idx) { /* a q_pe head */
            const int64_t k = it - c.n_idx, t = k / j.pe_H, h = k - t * j.pe_H;
            const int64_t pos = mlaf_ld_index(j.rope.positions, j.rope.pos_dt == MLAF_I64, t);
            if (pos < 0 || pos >= j.rope.max_pos) { /* counted by the token's first item */
                if (c.n_idx == 0 && h == 0 && lane == 0 && j.error_count) mlaf_cuda_error_count_add(j.error_count, 1);
                continue;
            }
            iq_pe_head<P>(j, t, h, j.rope.cos_sin + pos * j.rope.cos_sin_stride, lane);
            continue;
        }
        const int64_t t = it / c.ngroups;
        const int g = (int)(it - t * c.ngroups);
        const int h0 = g * c.hg, h1 = min((int)j.H, h0 + c.hg);
        const T *qt = static_cast<const T *>(j.q) + t * j.q_s0 + 8 * hl;
        const bool qvec = c.qvec != 0;
        auto load = [&](int h, iq_raw<T> &x) { /* the lane's 8 values of head h; zeros past the item */
            if (h < h1) iq_load<T>(qt + (int64_t)h * j.q_s1, qvec, x);
            else iq_zero<T>(x);
        };
        iq_raw<T> cur[2], nxt[2];
        load(h0 + half, cur[0]);
        load(h0 + 2 + half, cur[1]);
        const int64_t pos = mlaf_ld_index(j.rope.positions, j.rope.pos_dt == MLAF_I64, t);
        if (pos < 0 || pos >= j.rope.max_pos) {
            if (g == 0 && lane == 0 && j.error_count) mlaf_cuda_error_count_add(j.error_count, 1);
            continue;
        }
        const bool neox = j.rope.style == MLAF_ROPE_NEOX;
        float cc[8], ss[8];
        mlaf_idx_cs8(j.rope.cos_sin + pos * j.rope.cos_sin_stride, hl, neox, c.csvec != 0, cc, ss);
        const bool wf32 = j.w_dt == MLAF_F32;
        const char *wrow = static_cast<const char *>(j.w) + t * j.w_stride * (int64_t)(wf32 ? 4 : sizeof(T));
        uint8_t *ft = j.q_fp8 + t * j.f_s0 + 8 * hl;
        float *wo = j.w_out + t * j.wo_stride;
        float wv = 0.0f, my_s = 0.0f;
        for (int hb = h0; hb < h1; hb += 4) {
            const int c0 = h0 + ((hb - h0) & ~31); /* this 32-head chunk: w in, w_out out */
            if (hb == c0) wv = c0 + lane < h1 ? mlaf_ld_weight<T>(wrow, wf32, c0 + lane) : 0.0f;
            load(hb + 4 + half, nxt[0]);
            load(hb + 6 + half, nxt[1]);
#pragma unroll
            for (int u = 0; u < 2; u++) {
                const int hs = hb + 2 * u; /* heads hs (half 0) and hs + 1 (half 1) */
                if (hs < h1) {             /* warp-uniform */
                    const int h = hs + half;
                    float v[8];
                    iq_unpack<T>(cur[u], v);
                    mlaf_idx_rope8<T>(v, hl, neox, cc, ss);
                    if (j.hadamard) mlaf_idx_hadamard8<T>(v, hl);
                    const float s = mlaf_idx_scale8(v, j.amax_eps, (int)j.scale);
                    if (h < h1) {
                        uint32_t q[2];
                        mlaf_quant_e4m3<8>(v, s, q);
                        iq_store8(ft + (int64_t)h * j.f_s1, q, c.fw);
                    }
                    const float s_lo = __shfl_sync(IQ_FULL, s, 0), s_hi = __shfl_sync(IQ_FULL, s, 16);
                    if (lane == hs - c0) my_s = s_lo;
                    if (lane == hs + 1 - c0) my_s = s_hi;
                }
            }
            if (hb + 4 >= h1 || ((hb + 4 - h0) & 31) == 0)
                if (c0 + lane < h1)
                    wo[c0 + lane] = __fmul_rn(__fmul_rn(__fmul_rn(wv, my_s), j.w_fold), j.h_fold);
            cur[0] = nxt[0], cur[1] = nxt[1];
        }
    }
}

template <typename T, typename P> static int iq_resident_warps(int sms) {
    static std::atomic<int> cached{0};
    int v = cached.load(std::memory_order_relaxed);
    if (v == 0) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, mlaf_indexer_q_kernel<T, P>, IQ_WARPS * 32, 0) !=
                cudaSuccess ||
            v < 1) {
            (void)cudaGetLastError();
            v = 4;
        }
        cached.store(v, std::memory_order_relaxed);
    }
    return v * IQ_WARPS * (sms > 0 ? sms : 132);
}

template <typename T> static bool iq_aligned(const void *p, int64_t s0, int64_t s1, int64_t a) {
    return (uintptr_t)p % a == 0 && (s0 * (int64_t)sizeof(T)) % a == 0 && (s1 * (int64_t)sizeof(T)) % a == 0;
}

template <typename T, typename P> static cudaError_t iq_go(const mlaf_indexer_q_job *job, int sms, cudaStream_t stream) {
    iq_cfg c;
    const int64_t T_ = job->T, H = job->H;
    /* heads per item: the largest of H (rounded up to a multiple of 4), 32, 16, 8, 4 that leaves
     * two waves of resident warps */
    const int64_t resident = iq_resident_warps<T, P>(sms);
    const int64_t hmax = H < 1 ? 4 : (H + 3) / 4 * 4;
    const int64_t cand[5] = {hmax, 32, 16, 8, 4};
    int64_t hg = 4;
    for (int i = 0; i < 5; i++) {
        if (cand[i] > hmax || (i > 0 && cand[i] == hmax)) continue;
        if (T_ * ((H + cand[i] - 1) / cand[i]) >= 2 * resident) {
            hg = cand[i];
            break;
        }
    }
    c.hg = (int32_t)hg;
    c.ngroups = H > 0 ? (int32_t)((H + hg - 1) / hg) : 0;
    c.n_idx = T_ * c.ngroups;
    c.items = c.n_idx + (job->q_pe ? T_ * job->pe_H : 0);
    c.qvec = iq_aligned<T>(job->q, job->q_s0, job->q_s1, 16);
    const uintptr_t f = (uintptr_t)job->q_fp8;
    c.fw = f % 8 == 0 && job->f_s0 % 8 == 0 && job->f_s1 % 8 == 0   ? 8
           : f % 4 == 0 && job->f_s0 % 4 == 0 && job->f_s1 % 4 == 0 ? 4
                                                                    : 1;
    c.csvec = (uintptr_t)job->rope.cos_sin % 16 == 0 && job->rope.cos_sin_stride % 4 == 0;
    int64_t blocks = (c.items + IQ_WARPS - 1) / IQ_WARPS;
    if (blocks > ((int64_t)1 << 24)) blocks = (int64_t)1 << 24;
    mlaf_launch(mlaf_indexer_q_kernel<T, P>, (unsigned)blocks, IQ_WARPS * 32, 0, stream, *job, c);
    return cudaGetLastError();
}

template <typename T> static cudaError_t iq_launch_pe(const mlaf_indexer_q_job *job, int sms, cudaStream_t stream) {
    const mlaf_dtype pdt = job->q_pe ? job->pe_dt : job->dt;
    if (pdt == MLAF_F32) return iq_go<T, float>(job, sms, stream);
    if (pdt == MLAF_F16) return iq_go<T, __half>(job, sms, stream);
    return iq_go<T, __nv_bfloat16>(job, sms, stream);
}

} // namespace

extern "C" mlaf_status mlaf_cuda_indexer_q(mlaf_context *ctx, const mlaf_indexer_q_job *job) {
    if (job->T == 0 || job->H + job->pe_H == 0) return MLAF_OK;
    mlaf_cuda_device_guard guard(ctx);
    const cudaStream_t stream = (cudaStream_t)ctx->cuda_stream;
    const int sms = ctx->cuda_sm_count;
    const cudaError_t e = job->dt == MLAF_F32   ? iq_launch_pe<float>(job, sms, stream)
                          : job->dt == MLAF_F16 ? iq_launch_pe<__half>(job, sms, stream)
                                                : iq_launch_pe<__nv_bfloat16>(job, sms, stream);
    if (e != cudaSuccess)
        return mlaf_fail(ctx, MLAF_ERR_DEVICE, "indexer_q: kernel launch failed: %s", cudaGetErrorString(e));
    return MLAF_OK;
}
