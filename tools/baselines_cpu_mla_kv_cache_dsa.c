/* baselines_cpu_mla_kv_cache_dsa.c — mla_kv_cache's DSA indexer key branch as unfused CPU passes (see
 * baselines_cpu.h). */
#include "baselines_cpu.h"

/* ---- the DSA indexer key chain (docs/dsa.md), as separate passes ------------------------------ */
/* 1. LayerNorm of index_k into dense rows [T, 128] (rounded to the latent dtype); 2. RoPE of their
 * first 64 columns (blc_rope_rows with the indexer's style); 3. the Hadamard, when on; 4. the
 * quantize-and-write pass: each row's scale and e4m3 bytes into the block-planar index cache at
 * its slot (tokens t >= n_map and slots outside the cache skipped). index_math.h's arithmetic,
 * its LayerNorm and quantization by the fused op's own functions (k: its kernels), so the cache
 * bytes equal the fused op's and the passes are compared, not the conversion code. */
#include "index_math.h"

int blc_index_k(const mlaf_kv_cache_job *kv, const mlaf_index_job *ix, void *dense, int threads,
                const mlaf_norm_kern *k) {
    const mlaf_dtype dt = kv->norm.dt;
    const int64_t T = kv->norm.T, cap = kv->num_blocks * kv->block_size;
    const int th = team(T, MLAF_IDX_D, threads);
    float w[MLAF_IDX_D], b[MLAF_IDX_D];
    for (int i = 0; i < MLAF_IDX_D; i++) w[i] = mlaf_load_f32(ix->w, ix->w_dt, i), b[i] = mlaf_load_f32(ix->b, ix->w_dt, i);
#ifdef _OPENMP
#pragma omp parallel for num_threads(th) schedule(static)
#endif
    for (int64_t t = 0; t < T; t++) {
        float x[MLAF_IDX_D], y[MLAF_IDX_D];
        for (int i = 0; i < MLAF_IDX_D; i++) x[i] = mlaf_load_f32(CROW(ix->k, dt, t, ix->k_stride), dt, i);
        mlaf_cpu_index_layernorm(k, x, w, b, ix->ln_eps, dt, y);
        for (int i = 0; i < MLAF_IDX_D; i++) mlaf_store_f32(ROW(dense, dt, t, MLAF_IDX_D), dt, i, y[i]);
    }
    mlaf_rope_job r = kv->rope;
    r.style = ix->style;
    int rc = blc_rope_rows(dense, dt, T, MLAF_IDX_D, &r, threads);
    if (rc) return rc;
    if (ix->hadamard) {
#ifdef _OPENMP
#pragma omp parallel for num_threads(th) schedule(static)
#endif
        for (int64_t t = 0; t < T; t++) {
            float y[MLAF_IDX_D];
            for (int i = 0; i < MLAF_IDX_D; i++) y[i] = mlaf_load_f32(CROW(dense, dt, t, MLAF_IDX_D), dt, i);
            mlaf_index_hadamard(y, dt);
            for (int i = 0; i < MLAF_IDX_D; i++) mlaf_store_f32(ROW(dense, dt, t, MLAF_IDX_D), dt, i, y[i]);
        }
    }
#ifdef _OPENMP
#pragma omp parallel for num_threads(th) schedule(static)
#endif
    for (int64_t t = 0; t < kv->n_map; t++) {
        const int64_t slot = mlaf_load_index(kv->slots, kv->slot_dt, t);
        if (slot < 0 || slot >= cap) continue;
        float y[MLAF_IDX_D];
        for (int i = 0; i < MLAF_IDX_D; i++) y[i] = mlaf_load_f32(CROW(dense, dt, t, MLAF_IDX_D), dt, i);
        uint8_t *base = ix->cache + (slot / kv->block_size) * ix->block_stride;
        const int64_t off = slot % kv->block_size;
        const float s = mlaf_cpu_index_quantize(k, y, ix->amax_eps, ix->scale, base + off * MLAF_IDX_D);
        mlaf_index_put_f32(base + kv->block_size * MLAF_IDX_D + 4 * off, s);
    }
    return 0;
}
