/*
 * rope_q_norm.cuh — rope_q's DeepSeek-V4 forms (docs/mla.md, head_norm): head_norm (V4's
 * weightless per-head RMSNorm before the rotation) and the out-of-place q_out [T, Hpad, D] with
 * zeroed padding heads (mlaf_rope_q_out). Included by rope_q.cu.
 *
 * Per item (token t, head h < Hpad), one warp:
 *   1. A position outside [0, max_pos): nothing of the token is written; item (t, 0) counts it.
 *   2. h >= H: the head of q_out is stored as +0.0 (zero bytes).
 *   3. head_norm: sum of squares of the head's D values in fp32 (warp reduction), rstd with IEEE
 *      sqrt and division (as the row kernel's), y = x * rstd; otherwise y = x.
 *   4. The last R values of y rotated in fp32 (mlaf_rope_x0 / x1: no FMA), every value rounded
 *      once to q's dtype and stored.
 * Vector path (16-byte aligned heads of both tensors, D and D - R multiples of the vector width,
 * interleaved pairs): lane l owns vectors l, l + 32, ...; the first MLAF_RQN_REGV of them stay in
 * registers between the sum and the store (V4's 512 bf16 values are two per lane), later ones are
 * read again. Otherwise value by value. Every value is read and written by the lane that owns it
 * (the sum's reads end at the warp reduction), so in place is safe. Items are spread over a
 * grid-stride loop of warps (64-bit item index: T * Hpad may pass 2^31).
 */
#pragma once

#include "row_math.cuh"

struct mlaf_rope_qn_args {
    const void *q;
    void *out; /* q itself (in place) or q_out */
    int64_t T, H, HP, s0, s1, o0, o1;
    int32_t D, R, neox, norm;
    int32_t norot; /* rope style none: the rope part as the nope part, positions not read */
    float eps;
    const void *pos;
    int32_t pos64;
    const float *cos_sin;
    int64_t cs_stride, max_pos;
    int32_t *err;
};

#define MLAF_RQN_WARPS 4
#define MLAF_RQN_REGV 4

template <typename T, bool VEC>
__global__ void __launch_bounds__(MLAF_RQN_WARPS * 32) mlaf_rope_qn_kernel(const mlaf_rope_qn_args a) {
    mlaf_pdl_begin();
    constexpr int W = mlaf_vec<T>::W;
    const int lane = threadIdx.x & 31;
    const int64_t items = a.T * a.HP, step = (int64_t)gridDim.x * MLAF_RQN_WARPS;
    const int nope = a.D - a.R, hr = a.R / 2;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (int64_t it = (int64_t)blockIdx.x * MLAF_RQN_WARPS + (threadIdx.x >> 5); it < items; it += step) {
        const int64_t t = it / a.HP, h = it % a.HP;
        const int64_t p = a.norot ? 0 : mlaf_ld_index(a.pos, a.pos64, t);
        if (!a.norot && (p < 0 || p >= a.max_pos)) {
            if (h == 0 && lane == 0 && a.err) mlaf_cuda_error_count_add(a.err, 1);
            continue;
        }
        T *o = static_cast<T *>(a.out) + t * a.o0 + h * a.o1;
        if (h >= a.H) {
            if constexpr (VEC)
                for (int v = lane; v < a.D / W; v += 32) reinterpret_cast<uint4 *>(o)[v] = zero;
            else
                for (int i = lane; i < a.D; i += 32) mlaf_st(o + i, 0.0f);
            continue;
        }
        const T *x = static_cast<const T *>(a.q) + t * a.s0 + h * a.s1;
        const float *cs = a.norot ? nullptr : a.cos_sin + p * a.cs_stride;
        if constexpr (VEC) {
            const int nv = a.D / W;
            const uint4 *xv = reinterpret_cast<const uint4 *>(x);
            uint4 reg[MLAF_RQN_REGV];
            float ss = 0.0f;
#pragma unroll
            for (int k = 0; k < MLAF_RQN_REGV; k++) {
                const int v = lane + 32 * k;
                reg[k] = v < nv ? __ldcg(xv + v) : zero;
                float f[W];
                mlaf_vec<T>::unpack(reg[k], f);
                ss += mlaf_sumsq<W>(f);
            }
            if (a.norm)
                for (int v = lane + 32 * MLAF_RQN_REGV; v < nv; v += 32) {
                    float f[W];
                    mlaf_vec<T>::unpack(__ldcg(xv + v), f);
                    ss += mlaf_sumsq<W>(f);
                }
            const float r = a.norm ? mlaf_rstd(mlaf_warp_sum(ss), a.D, a.eps) : 1.0f;
            auto put = [&](int v, uint4 raw) {
                float f[W];
                mlaf_vec<T>::unpack(raw, f);
                if (a.norm)
#pragma unroll
                    for (int k = 0; k < W; k++) f[k] = __fmul_rn(f[k], r);
                const int e0 = v * W - nope;
                if (e0 >= 0 && !a.norot)
#pragma unroll
                    for (int k = 0; k < W / 2; k++) {
                        const int pr = (e0 >> 1) + k;
                        const float c = __ldg(cs + pr), s = __ldg(cs + hr + pr), x0 = f[2 * k], x1 = f[2 * k + 1];
                        f[2 * k] = mlaf_rope_x0(x0, x1, c, s);
                        f[2 * k + 1] = mlaf_rope_x1(x0, x1, c, s);
                    }
                reinterpret_cast<uint4 *>(o)[v] = mlaf_vec<T>::pack(f);
            };
#pragma unroll
            for (int k = 0; k < MLAF_RQN_REGV; k++)
                if (lane + 32 * k < nv) put(lane + 32 * k, reg[k]);
            for (int v = lane + 32 * MLAF_RQN_REGV; v < nv; v += 32) put(v, __ldcg(xv + v));
        } else {
            float ss = 0.0f;
            if (a.norm)
                for (int i = lane; i < a.D; i += 32) {
                    const float v = mlaf_ld(x + i);
                    ss = fmaf(v, v, ss);
                }
            const float r = a.norm ? mlaf_rstd(mlaf_warp_sum(ss), a.D, a.eps) : 1.0f;
            for (int i = lane; i < nope; i += 32) {
                const float v = mlaf_ld(x + i);
                mlaf_st(o + i, a.norm ? __fmul_rn(v, r) : v);
            }
            for (int pp = lane; pp < hr; pp += 32) {
                const int ia = nope + (a.neox ? pp : 2 * pp), ib = a.neox ? ia + hr : ia + 1;
                float x0 = mlaf_ld(x + ia), x1 = mlaf_ld(x + ib);
                if (a.norm) x0 = __fmul_rn(x0, r), x1 = __fmul_rn(x1, r);
                if (a.norot) {
                    mlaf_st(o + ia, x0);
                    mlaf_st(o + ib, x1);
                    continue;
                }
                const float c = __ldg(cs + pp), s = __ldg(cs + hr + pp);
                const float y0 = mlaf_rope_x0(x0, x1, c, s), y1 = mlaf_rope_x1(x0, x1, c, s);
                mlaf_st(o + ia, y0);
                mlaf_st(o + ib, y1);
            }
        }
    }
}

template <typename T>
static cudaError_t mlaf_rope_qn_launch(const mlaf_rope_qn_args &a, int sms, cudaStream_t stream) {
    constexpr int W = mlaf_vec<T>::W;
    const int64_t es = sizeof(T);
    const bool vec = !a.neox && a.D % W == 0 && (a.D - a.R) % W == 0 && (uintptr_t)a.q % 16 == 0 &&
                     (uintptr_t)a.out % 16 == 0 && (a.s0 * es) % 16 == 0 && (a.s1 * es) % 16 == 0 &&
                     (a.o0 * es) % 16 == 0 && (a.o1 * es) % 16 == 0;
    const int64_t items = a.T * a.HP, want = (items + MLAF_RQN_WARPS - 1) / MLAF_RQN_WARPS,
                  cap = (int64_t)(sms > 0 ? sms : 132) * 64;
    const unsigned blocks = (unsigned)(want < cap ? want : cap);
    if (vec) mlaf_launch(mlaf_rope_qn_kernel<T, true>, blocks, MLAF_RQN_WARPS * 32, 0, stream, a);
    else mlaf_launch(mlaf_rope_qn_kernel<T, false>, blocks, MLAF_RQN_WARPS * 32, 0, stream, a);
    return cudaGetLastError();
}

/* The head_norm / q_out forms (docs/mla.md) of a validated job (head_norm or q_out). */
static cudaError_t mlaf_rope_qn_run(const mlaf_rope_q_job *job, int sms, cudaStream_t stream) {
    mlaf_rope_qn_args a;
    a.q = job->q;
    a.out = job->q_out ? job->q_out : job->q;
    a.T = job->T, a.H = job->H, a.HP = job->Hpad, a.s0 = job->s0, a.s1 = job->s1;
    a.o0 = job->q_out ? job->o0 : job->s0, a.o1 = job->q_out ? job->o1 : job->s1;
    a.D = job->D, a.R = job->rope.R;
    a.neox = job->rope.style == MLAF_ROPE_NEOX;
    a.norot = job->rope.style == MLAF_ROPE_NONE;
    a.norm = job->head_norm;
    a.eps = job->head_eps;
    a.pos = job->rope.positions;
    a.pos64 = job->rope.pos_dt == MLAF_I64;
    a.cos_sin = job->rope.cos_sin;
    a.cs_stride = job->rope.cos_sin_stride;
    a.max_pos = job->rope.max_pos;
    a.err = job->error_count;
    if (job->dt == MLAF_F32) return mlaf_rope_qn_launch<float>(a, sms, stream);
    if (job->dt == MLAF_F16) return mlaf_rope_qn_launch<__half>(a, sms, stream);
    return mlaf_rope_qn_launch<__nv_bfloat16>(a, sms, stream);
}
