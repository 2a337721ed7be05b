/*
 * rope_q_check.cuh — what the rope_q dev programs share: their argument block and the check of
 * one launch against the host's fp32 rotation (the same expression the keys of mla_kv_cache
 * use): T tokens of q [T, H, D] with head stride D + pad, positions in [0, 500) and every 41st
 * past the table; bit-exact rope columns, nope columns untouched, the error count exact.
 * Include after src/cuda/rope_q.cu and common.cuh.
 */
#pragma once

#include <functional>

static mlaf_rope_q_args rq_args(__nv_bfloat16 *q, int64_t T, int64_t H, int64_t s1, int D, int R, int neox,
                                const int64_t *pos, const float *cs, int64_t max_pos, int32_t *err) {
    mlaf_rope_q_args a;
    a.q = q, a.T = T, a.H = H, a.s0 = H * s1, a.s1 = s1, a.D = D, a.R = R, a.neox = neox;
    a.pairvec = !neox && s1 % 2 == 0 && (D - R) % 2 == 0;
    a.pos = pos, a.pos64 = 1, a.cos_sin = cs, a.cs_stride = R, a.max_pos = max_pos, a.err = err;
    return a;
}

struct rq_check_result {
    int64_t mismatches;
    int32_t err, want_err;
    bool pass;
};

/* Runs launch(args) once on fresh data and compares; counts a failure in dev_failures. */
static rq_check_result rq_check(const dev_shape &s, int neox, int64_t T, int pad,
                                const std::function<void(const mlaf_rope_q_args &)> &launch) {
    const int64_t H = s.H, D = s.nope + s.R, s1 = D + pad, max_pos = 500, R = s.R, h = R / 2;
    const size_t n = (size_t)T * H * s1;
    dev_rng rng(5 + neox);
    std::vector<uint16_t> q(n), out(n);
    for (auto &x : q) x = f2bf((float)rng.normal());
    std::vector<int64_t> pos(T);
    int32_t want_err = 0, err = 0;
    for (int64_t t = 0; t < T; t++) {
        pos[t] = t % 41 == 3 ? max_pos + t : (int64_t)(rng.uniform() * max_pos);
        want_err += pos[t] >= max_pos;
    }
    std::vector<float> cs;
    make_cos_sin(cs, (int)max_pos, (int)R);
    __nv_bfloat16 *dq;
    int64_t *dpos;
    float *dcs;
    int32_t *derr;
    CK(cudaMalloc(&dq, n * 2));
    CK(cudaMalloc(&dpos, T * 8));
    CK(cudaMalloc(&dcs, cs.size() * 4));
    CK(cudaMalloc(&derr, 4));
    CK(cudaMemcpy(dq, q.data(), n * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dpos, pos.data(), T * 8, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dcs, cs.data(), cs.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(derr, 0, 4));
    launch(rq_args(dq, T, H, s1, (int)D, (int)R, neox, dpos, dcs, max_pos, derr));
    CK(cudaDeviceSynchronize());
    CK(cudaGetLastError());
    CK(cudaMemcpy(out.data(), dq, n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&err, derr, 4, cudaMemcpyDeviceToHost));
    std::vector<uint16_t> want = q;
    for (int64_t t = 0; t < T; t++) {
        if (pos[t] >= max_pos) continue;
        for (int64_t hd = 0; hd < H; hd++) {
            uint16_t *x = &want[(t * H + hd) * s1 + D - R];
            const uint16_t *x_in = &q[(t * H + hd) * s1 + D - R];
            for (int64_t i = 0; i < h; i++) {
                const int64_t i0 = neox ? i : 2 * i, i1 = neox ? i + h : 2 * i + 1;
                float y0, y1;
                ref_rope_pair(bf2f(x_in[i0]), bf2f(x_in[i1]), cs[pos[t] * R + i], cs[pos[t] * R + h + i], &y0, &y1);
                x[i0] = f2bf(y0), x[i1] = f2bf(y1);
            }
        }
    }
    rq_check_result r;
    r.mismatches = 0;
    for (size_t i = 0; i < n; i++) r.mismatches += out[i] != want[i];
    r.err = err, r.want_err = want_err;
    r.pass = r.mismatches == 0 && err == want_err;
    CK(cudaFree(dq)); CK(cudaFree(dpos)); CK(cudaFree(dcs)); CK(cudaFree(derr));
    dev_failures += !r.pass;
    return r;
}
