/*
 * rope_q_v1 — the library's rope_q kernels (src/cuda/rope_q.cu, included as shipped): RoPE in
 * place on the last R columns of every head of q [T, H, D].
 *
 * v1 "pair" (the first kernel; now the small-T and generic path): block (token, tile of 256 pairs), one
 * thread per rotation pair, interleaved pairs moved as one 4-byte word when aligned; ~30% of
 * copy bandwidth on the H200. v2 "vector" (the fast path since): one 16-byte vector per unit
 * (NeoX: vector j of each half together), up to 4 units per thread loaded before any
 * arithmetic, blocks of ~2048 units over whole tokens (replaced since by rope_q_v2's one-shot
 * shape). "v2 library" times the library's dispatch as it is now.
 * Tried and dropped: staging each block's cos/sin rows in shared memory behind a barrier
 * (57% / 69% of copy at T = 131072 vs 73% / 85% without; 71 registers, 3 blocks per SM). Validation (T = 333, both styles, a padded head
 * stride, and positions past the table): bit-exact against the host's fp32 rotation (the
 * same expression the keys of mla_kv_cache use), nope columns untouched, error count exact.
 * Timing: GB/s over the rope columns only (T * H * R * 2 bytes read + the same written) vs the
 * same-run D2D copy; T in {1, 8, 64} as us per call under graph replay.
 */
#include "cuda/rope_q.cu"
#include "common.cuh"

#include "rope_q_check.cuh"

/* pad 2: a head stride that is not 16-byte aligned (the pair path); pad 8: aligned (the
 * vector path). Both go through the library's dispatch. */
static bool validate(const dev_shape &s, int neox, int pad) {
    const rq_check_result r = rq_check(s, neox, 333, pad, [](const mlaf_rope_q_args &a) {
        CK(mlaf_rope_q_launch<__nv_bfloat16>(a, sm_count(), 0));
    });
    printf("  validate %-6s %-11s T=333 H=%d D=%d (head stride %d): mismatches %lld (bit-exact), error_count %d "
           "(want %d)  %s\n",
           pad % 8 ? "pair" : "vector", neox ? "neox" : "interleaved", s.H, s.nope + s.R, s.nope + s.R + pad,
           (long long)r.mismatches, r.err, r.want_err, r.pass ? "OK" : "FAIL");
    return r.pass;
}

int main(int argc, char **argv) {
    const bool quick = argc > 1 && !strcmp(argv[1], "--quick");
    printf("== rope_q v1: the library kernel\n");
    print_device();
    const double copy = copy_gbps();
    printf("device-to-device copy (same run): %.0f GB/s\n", copy);
    for (const dev_shape &s : dev_shapes) {
        const int64_t H = s.H, D = s.nope + s.R, R = s.R, max_pos = 131072;
        printf("\n-- %s: q [T, %lld, %lld], rope on the last %lld columns, bf16\n", s.name, (long long)H,
               (long long)D, (long long)R);
        for (int pad : {2, 8}) {
            validate(s, 0, pad);
            validate(s, 1, pad);
        }
        std::vector<float> cs;
        make_cos_sin(cs, (int)max_pos, (int)R);
        float *dcs;
        CK(cudaMalloc(&dcs, cs.size() * 4));
        CK(cudaMemcpy(dcs, cs.data(), cs.size() * 4, cudaMemcpyHostToDevice));
        printf("  %-19s %8s %10s %9s %8s\n", "kernel / style", "T", "time us", "GB/s", "% copy");
        std::vector<int64_t> Ts = {1, 8, 64, 4096, 32768};
        if (!quick) Ts.push_back(131072);
        for (int vec = 0; vec < 2; vec++)
        for (int neox = 0; neox < 2; neox++)
            for (int64_t T : Ts) {
                char label[32];
                snprintf(label, sizeof label, "%s %s", vec ? "v2 library" : "v1 pair", neox ? "neox" : "interleaved");
                const size_t q_bytes = (size_t)T * H * D * 2, bytes = (size_t)T * H * R * 4;
                const int nrot = T <= 64 ? 4 : rotations(q_bytes);
                __nv_bfloat16 *q;
                int64_t *dpos;
                CK(cudaMalloc(&q, q_bytes * nrot));
                CK(cudaMalloc(&dpos, T * 8));
                dev_fill_bf16(q, q_bytes / 2 * nrot);
                std::vector<int64_t> pos(T);
                for (int64_t t = 0; t < T; t++) pos[t] = t % max_pos;
                CK(cudaMemcpy(dpos, pos.data(), T * 8, cudaMemcpyHostToDevice));
                auto run = [&](cudaStream_t st, int i) {
                    const mlaf_rope_q_args a =
                        rq_args(q + (i % nrot) * T * H * D, T, H, D, (int)D, (int)R, neox, dpos, dcs, max_pos, nullptr);
                    CK(vec ? mlaf_rope_q_launch<__nv_bfloat16>(a, sm_count(), st) : mlaf_rope_q_pair_launch<__nv_bfloat16>(a, st));
                };
                if (T <= 64) {
                    printf("  %-19s %8lld %10.2f   (us per call, CUDA-graph replay)\n", label, (long long)T, graph_us(run));
                } else {
                    const double us = time_us([&](int i) { run(0, i); });
                    const double gbs = bytes / (us * 1e-6) / 1e9;
                    printf("  %-19s %8lld %10.2f %9.0f %7.1f%%\n", label, (long long)T, us, gbs,
                           100.0 * gbs / copy);
                }
                CK(cudaFree(q)); CK(cudaFree(dpos));
            }
        CK(cudaFree(dcs));
    }
    return dev_failures ? 1 : 0;
}
