/*
 * split_qk_norm_v3 — the library's first shipped kernel: today's src/cuda/norm_common.cuh in its
 * WAVE mode (one row per warp, grid ceil(T / 4)), which v3 used for every T.
 *
 * What changed from v2 (see dev/README.md for the numbers):
 * 1. __launch_bounds__ with a minimum of resident blocks per SM chosen from NV (8 blocks of 4
 *    warps for NV <= 6, 6 for NV = 9): without it nvcc keeps the unpacked floats and all the
 *    hoisted weight vectors live (118-120 registers for GLM/DeepSeek rows, 16 warps per SM);
 *    capped, it re-derives them (64 / 80 registers, no spills) and the SM holds 32 / 24 rows
 *    of loads in flight.
 * 2. Every dtype (bf16, f16, f32), f32 or activation-dtype weights, any Q/C/R multiple of the
 *    vector width, optional k_pe, and an element-wise generic path for everything else.
 * 3. Correctly rounded rstd (IEEE sqrt and division) and one rounding per output.
 * Launch shapes compared: the library's (4 warps per block, one row per warp) and persistent
 * grids of the same kernel (it grid-strides over rows).
 */
#include "row_v1.cuh"
#include "split_bench.cuh"

static mlaf_row_args to_row_args(const split_args &s) {
    mlaf_row_args a = mlaf_row_args();
    a.T = s.T, a.Q = s.Q, a.C = s.C, a.R = s.R, a.eps_q = s.eps_q, a.eps_kv = s.eps_kv;
    a.latent = s.latent, a.ls = s.ls, a.w_q = s.wq, a.w_kv = s.wkv;
    a.q = s.q, a.qs = s.qs, a.k_nope = s.k_nope, a.ks = s.ks, a.k_pe = s.k_pe, a.ps = s.ps;
    return a;
}

static split_variant v3_library() {
    return {"v3 library (4 warps/block, row/warp)", [](const split_args &s, cudaStream_t st) {
                mlaf_row_policy pol;
                pol.mode = MLAF_ROW_WAVE; /* v3 shipped the WAVE mode for every T */
                CK(mlaf_row_launch<false>(to_row_args(s), MLAF_BF16, sm_count(), st, pol));
            }};
}
static split_variant v3_persistent(int k) {
    static const int sms = sm_count();
    return {"v3 persistent 4 warps, " + std::to_string(k) + "x SMs", [k](const split_args &s, cudaStream_t st) {
                const mlaf_row_args a = to_row_args(s);
                int64_t need = (s.T + 3) / 4, g = (int64_t)k * sms;
                const unsigned grid = (unsigned)(need < g ? need : g);
                if (mlaf_row_pick_nv((s.Q + s.C + s.R) / 8) == 6)
                    mlaf_row_fast_kernel<__nv_bfloat16, 6, false, MLAF_ROW_WAVE><<<grid, 128, 0, st>>>(a);
                else
                    mlaf_row_fast_kernel<__nv_bfloat16, 9, false, MLAF_ROW_WAVE><<<grid, 128, 0, st>>>(a);
            }};
}
static split_variant v3_generic() {
    return {"v3 library generic path (forced)", [](const split_args &s, cudaStream_t st) {
                mlaf_row_generic_kernel<__nv_bfloat16, false><<<(unsigned)((s.T + 3) / 4), 128, 0, st>>>(to_row_args(s));
            }};
}

int main(int argc, char **argv) {
    return run_split_bench("split_qk_norm v3: the library kernel",
                           {v3_library(), v3_persistent(8), v3_persistent(16), v3_generic()}, argc, argv);
}
