/* baselines_cpu_mla_kv_cache.c — mla_kv_cache's unfused CPU passes after the library's split_qk_norm:
 * RoPE of dense rows, the plain cache write and the fp8 quantize-and-write pass (see baselines_cpu.h). */
#include "baselines_cpu.h"

int blc_rope_rows(void *x, mlaf_dtype dt, int64_t T, int64_t stride, const mlaf_rope_job *rope,
                  int threads) {
    if (rope->R <= 0) return 0;
    threads = team(T, rope->R, threads);
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int64_t t = 0; t < T; t++) {
        int64_t pos = mlaf_load_index(rope->positions, rope->pos_dt, t);
        if (pos < 0 || pos >= rope->max_pos) continue;
        rope_row(ROW(x, dt, t, stride), dt, rope->R, rope->style,
                 rope->cos_sin + pos * rope->cos_sin_stride);
    }
    return 0;
}

int bl_cache_fmt_has_pass(mlaf_kv_format f) {
    return f == MLAF_KV_PLAIN || f == MLAF_KV_FP8 || f == MLAF_KV_FP8_DS_MLA || f == MLAF_KV_FP8_V4;
}

int blc_cache_write(const mlaf_kv_cache_job *j, const void *k_nope, const void *k_pe,
                    int threads) {
    const mlaf_dtype dt = j->norm.dt, cdt = j->cache_dt;
    const int32_t C = j->norm.C, R = j->norm.R;
    const int64_t nslots = j->num_blocks * j->block_size;
    const size_t ces = mlaf_dtype_size(cdt);
    threads = team(j->norm.T, C + R, threads);
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int64_t t = 0; t < j->norm.T; t++) {
        int64_t slot = t < j->n_map ? mlaf_load_index(j->slots, j->slot_dt, t) : -1;
        if (slot < 0 || slot >= nslots) continue;
        char *dst = (char *)j->cache +
                    (size_t)((slot / j->block_size) * j->cache_s0 + (slot % j->block_size) * j->cache_s1) * ces;
        const void *kn = CROW(k_nope, dt, t, C), *kp = CROW(k_pe, dt, t, R);
        if (cdt == dt) {
            memcpy(dst, kn, (size_t)C * ces);
            if (R > 0) memcpy(dst + (size_t)C * ces, kp, (size_t)R * ces);
        } else {
            for (int32_t i = 0; i < C; i++) mlaf_store_f32(dst, cdt, i, mlaf_load_f32(kn, dt, i));
            for (int32_t i = 0; i < R; i++) mlaf_store_f32(dst, cdt, C + i, mlaf_load_f32(kp, dt, i));
        }
    }
    return 0;
}

/* The scale of an fp8_ds_mla tile from its (NaN-free) amax, per mode (docs/kv_formats.md): amax
 * max(amax / 448, FLT_MIN); ue8m0 2^ceil_log2(max(amax, 1e-4) / 448); ue8m0_floor_scaled
 * 2^ceil_log2(max(amax / 448, 1e-4)). The power of two is built from its exponent bits
 * (ceil_log2 of +inf is 128, whose 2^128 is +inf). */
static float tile_scale(float amax, mlaf_tile_scale mode) {
    if (mode == MLAF_TILE_AMAX) return fmaxf(amax / 448.0f, FLT_MIN);
    const float v = mode == MLAF_TILE_UE8M0 ? fmaxf(amax, 1e-4f) / 448.0f : fmaxf(amax / 448.0f, 1e-4f);
    return mlaf_bits_f32((uint32_t)(mlaf_ceil_log2_f32(v) + 127) << 23);
}

/* n values of a dense row widened to fp32 */
static void widen(const void *src, mlaf_dtype dt, int32_t n, float *x) {
    for (int32_t i = 0; i < n; i++) x[i] = mlaf_load_f32(src, dt, i);
}

int blc_cache_write_fp8(const mlaf_kv_cache_job *j, const void *k_nope, const void *k_pe, int threads,
                        const mlaf_norm_kern *k) {
    const mlaf_dtype dt = j->norm.dt;
    const size_t es = mlaf_dtype_size(dt);
    const int32_t C = j->norm.C, R = j->norm.R;
    const int64_t nslots = j->num_blocks * j->block_size;
    const int ds = j->format == MLAF_KV_FP8_DS_MLA, v4 = j->format == MLAF_KV_FP8_V4;
    if (j->format != MLAF_KV_FP8 && !ds && !v4) return -1;
    if (C > 4096 || R > 4096) return -1; /* the rows' fp32 buffers */
    /* the CPU backend's memory is host memory: the scale is read here, once per call */
    const float scale = ds || v4 ? 1.0f : *j->scale;
    const int div = j->conv != MLAF_FP8_MUL;
    threads = team(j->norm.T, C + R, threads);
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int64_t t = 0; t < j->norm.T; t++) {
        const int64_t slot = t < j->n_map ? mlaf_load_index(j->slots, j->slot_dt, t) : -1;
        if (slot < 0 || slot >= nslots) continue;
        const int64_t blk = slot / j->block_size, off = slot % j->block_size;
        /* cache dtypes u8 / fp8_e4m3: strides in elements are strides in bytes */
        uint8_t *dst = (uint8_t *)j->cache + blk * j->cache_s0 + off * j->cache_s1;
        const char *kn = CROW(k_nope, dt, t, C), *kp = CROW(k_pe, dt, t, R);
        float x[4096]; /* the row as stored, in fp32 (round_amax rounds it in place: no change
                        * to a stored row's values, only its amax is used) */
        if (v4) { /* docs/kv_formats.md, fp8_v4 (bf16 rows of 512, the last 64 roped): a planar page */
            uint8_t *page = (uint8_t *)j->cache + blk * j->cache_s0;
            uint8_t *data = page + off * 576, *sc = page + j->block_size * 576 + off * 8;
            widen(kn, dt, 448, x);
            for (int32_t b = 0; b < 7; b++) {
                const int e = mlaf_ue8m0_exponent(k->round_amax(x + 64 * b, 64, dt, x + 64 * b, 0.0f));
                k->e4m3(x + 64 * b, 64, mlaf_exp2_neg_f32(e), 0, data + 64 * b);
                sc[b] = mlaf_ue8m0_byte(e);
            }
            sc[7] = 0;
            memcpy(data + 448, kn + 448 * es, 64 * es);
            continue;
        }
        if (!ds) {
            widen(kn, dt, C, x);
            k->e4m3(x, C, scale, div, dst);
            if (R > 0) {
                widen(kp, dt, R, x);
                k->e4m3(x, R, scale, div, j->kpe ? (uint8_t *)j->kpe + blk * j->kpe_s0 + off * j->kpe_s1 : dst + C);
            }
            continue;
        }
        /* fp8_ds_mla (bf16 rows): [C e4m3 | C/128 f32 scales | R bf16 rope values] */
        widen(kn, dt, C, x);
        for (int32_t tile = 0; tile < C / 128; tile++) {
            float *xt = x + 128 * tile;
            const float s = tile_scale(k->round_amax(xt, 128, dt, xt, 0.0f), j->tile_scale); /* NaN ignored */
            k->e4m3(xt, 128, s, 1, dst + 128 * tile);
            const uint32_t sb = mlaf_f32_bits(s);
            for (int q = 0; q < 4; q++) dst[C + 4 * tile + q] = (uint8_t)(sb >> (8 * q)); /* little-endian */
        }
        if (R > 0) memcpy(dst + C + C / 32, kp, (size_t)R * es);
    }
    return 0;
}
