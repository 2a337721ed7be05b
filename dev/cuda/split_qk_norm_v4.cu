/*
 * split_qk_norm_v4 — the library kernel with three launch modes (src/cuda/norm_common.cuh):
 *   WAVE  v3: one row per warp, grid ceil(T / 4), register cap for 8 (GLM) / 6 (DeepSeek)
 *         resident blocks.
 *   PIPE  persistent grid of resident blocks x SMs (x1 or x2); each warp prefetches its next
 *         row into a second register set before reducing and storing the current one, so its
 *         load and store phases overlap and no block launch is paid per 4 rows.
 *   LAT   the weights are loaded into registers with the row, before any arithmetic (v3
 *         re-loaded one weight vector per store under its register cap: one dependent L1/L2
 *         latency per vector), no register cap; for small T.
 *   BLK   one 256-thread block per row: the weights and indices loaded with the row, one
 *         barrier joins the warp sums; the shortest chain for a handful of rows.
 *   auto  what the library does: BLK for T <= 4 rows per SM, else WAVE.
 * The question each row answers: which mode and grid the library should use at each T.
 */
#define MLAF_ROW_DEV_MODES /* PIPE and LAT too */
#include "row_v1.cuh"
#include "split_bench.cuh"

static mlaf_row_args to_row_args(const split_args &s) {
    mlaf_row_args a = mlaf_row_args();
    a.T = s.T, a.Q = s.Q, a.C = s.C, a.R = s.R, a.eps_q = s.eps_q, a.eps_kv = s.eps_kv;
    a.latent = s.latent, a.ls = s.ls, a.w_q = s.wq, a.w_kv = s.wkv;
    a.q = s.q, a.qs = s.qs, a.k_nope = s.k_nope, a.ks = s.ks, a.k_pe = s.k_pe, a.ps = s.ps;
    return a;
}

static split_variant v4(const char *name, int mode, int mult = 1, bool persist = false, int64_t max_blocks = 0) {
    return {name, [mode, mult, persist, max_blocks](const split_args &s, cudaStream_t st) {
                static const int sms = sm_count();
                mlaf_row_policy pol;
                pol.mode = mode, pol.grid_mult = mult, pol.persist = persist, pol.max_blocks = max_blocks;
                CK(mlaf_row_launch<false>(to_row_args(s), MLAF_BF16, sms, st, pol));
            }};
}

int main(int argc, char **argv) {
    return run_split_bench("split_qk_norm v4: launch modes of the library kernel",
                           {v4("v4 auto (library)", -1), v4("WAVE (v3)", MLAF_ROW_WAVE),
                            v4("WAVE persistent x2 resident", MLAF_ROW_WAVE, 2, true),
                            v4("PIPE x1 resident", MLAF_ROW_PIPE, 1), v4("PIPE x2 resident", MLAF_ROW_PIPE, 2),
                            v4("LAT", MLAF_ROW_LAT), v4("BLK (block per row)", MLAF_ROW_BLK),
                            /* many rows per warp: validates the prefetch path (slow, not a candidate) */
                            v4("PIPE 7 blocks (validation)", MLAF_ROW_PIPE, 1, false, 7)},
                           argc, argv);
}
