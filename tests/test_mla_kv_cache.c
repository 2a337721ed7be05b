/*
 * test_mla_kv_cache.c — mla_kv_cache against the float64 oracle on every backend: presets x
 * dtypes x T x layout with canary-filled caches, padding slots (-1), repeated positions,
 * position max_pos - 1, out-of-range slots and positions (counted), block sizes 1 / 16 / 64,
 * both RoPE styles (and Kimi-K3's preset unrotated: style none, test_rope_none.c), cache dtype != latent dtype, i32 / i64 indices, Q = 0, R = 0, in place,
 * optional dense outputs omitted, every CPU instruction-set path; and the key written for a
 * position equals bit for bit the rope_q query rotated for that position.
 * (The slot / position patterns themselves are built by mlaf_verify_mla_kv_cache.)
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "testlib.h"

static const mlaf_dtype DTYPES[3] = {MLAF_F32, MLAF_F16, MLAF_BF16};
static const int64_t BLOCKS[3] = {1, 16, 64};

static int filtered_out(const char *name) {
    const char *f = getenv("MLAF_TEST_FILTER");
    return f && *f && !strstr(name, f);
}

static void run(mlaf_context *ctx, const char *tag, const mlaf_verify_case *c, const char *extra) {
    char name[320];
    snprintf(name, sizeof name,
             "%s(preset=%s,T=%lld,dtype=%s,backend=%s,cache=%s,block=%lld,rope=%s,index=%s%s%s%s%s%s%s)",
             tag, c->cfg.name, (long long)c->T, mlaf_dtype_name(c->dtype),
             mlaf_backend_name(mlaf_context_backend(ctx)), mlaf_dtype_name(c->cache_dtype),
             (long long)c->block_size, mlaf_rope_style_name(c->rope_style),
             mlaf_dtype_name(c->index_dtype), c->weight_dtype != c->dtype ? ",w=f32" : "",
             c->strided ? ",strided" : "", c->in_place ? ",in_place" : "",
             c->no_k_pe == 1 ? ",no_k_pe" : c->no_k_pe == 2 ? ",cache_only" : "", extra ? "," : "",
             extra ? extra : "");
    if (filtered_out(name)) return;
    mlaf_verify_result r;
    if (!mlaf_preset_plain_latent(&c->cfg)) {
        tl_skip(name, "DeepSeek-V4's latent (kv_rope_tail > 0): its cases are test_v4_attn's");
        return;
    }
    mlaf_status st = mlaf_verify_mla_kv_cache(ctx, c, &r);
    tl_case(st == MLAF_OK && r.passed, name, "%s [%s, worst %.3g units]", r.detail,
            mlaf_status_name(st), r.worst_units);
}

static uint64_t seed_of(int a, int b, int64_t c, int d) {
    return 0xcac4e000ull + (uint64_t)a * 1000003u + (uint64_t)b * 10007u + (uint64_t)c * 31u + (uint64_t)d;
}

static mlaf_verify_case make(const mlaf_model_config *cfg, int di, int64_t T, int variant, uint64_t seed) {
    mlaf_verify_case c = mlaf_verify_case_default(cfg, DTYPES[di], T, seed);
    c.strided = variant & 1;
    c.block_size = BLOCKS[variant % 3];
    if (cfg->rope_style != MLAF_ROPE_NONE) /* Kimi-K3's slot stays unrotated */
        c.rope_style = (variant / 2) % 2 ? MLAF_ROPE_NEOX : MLAF_ROPE_INTERLEAVED;
    c.index_dtype = (variant / 3) % 2 ? MLAF_I32 : MLAF_I64;
    c.cache_dtype = variant % 5 == 4 ? DTYPES[(di + 1) % 3] : DTYPES[di];
    return c;
}

/* Key == query: the same rope values go through mla_kv_cache (into the cache and the dense
 * k_pe) and through rope_q (as the rope part of two heads); all three must agree bit for bit.
 * On the CPU every pair of instruction-set paths is tried (key on one, query on another). */
static void key_equals_query(mlaf_context *ctx, mlaf_dtype dt, mlaf_rope_style style) {
    const mlaf_backend be = mlaf_context_backend(ctx);
    const int32_t C = 16, R = 64, NOPE = 8, D = NOPE + R, H = 2;
    const int64_t T = 37, MAXP = 300;
    const size_t es = mlaf_dtype_size(dt);
    char name[160];
    snprintf(name, sizeof name, "KEY_EQUALS_QUERY(T=%lld,dtype=%s,rope=%s,backend=%s)", (long long)T,
             mlaf_dtype_name(dt), style == MLAF_ROPE_NEOX ? "neox" : "interleaved", mlaf_backend_name(be));
    if (filtered_out(name)) return;
    unsigned char *lat = malloc((size_t)(T * (C + R)) * es), *qh = malloc((size_t)(T * H * D) * es);
    float *w = malloc(sizeof(float) * C), *cs = malloc(sizeof(float) * (size_t)(MAXP * R));
    int64_t pos[37], slot[37];
    mlaf_rng rng;
    mlaf_rng_seed(&rng, 4242 + (uint64_t)dt * 7 + (uint64_t)style);
    mlaf_fill_normal(&rng, lat, dt, (size_t)(T * (C + R)), 0.0, 3.0);
    mlaf_fill_normal(&rng, qh, dt, (size_t)(T * H * D), 0.0, 1.0);
    mlaf_fill_normal(&rng, w, MLAF_F32, C, 1.0, 0.1);
    mlaf_rope_table_init(cs, MAXP, R, 10000.0);
    for (int64_t t = 0; t < T; t++) {
        pos[t] = t % 4 == 1 ? pos[t - 1] : (int64_t)(mlaf_rng_u64(&rng) % MAXP);
        if (t == 5) pos[t] = MAXP - 1;
        slot[t] = t;
        for (int32_t h = 0; h < H; h++) /* the query's rope part = the key's rope input */
            memcpy(qh + (size_t)((t * H + h) * D + NOPE) * es, lat + (size_t)(t * (C + R) + C) * es, (size_t)R * es);
    }
    int isa_n = be == MLAF_BACKEND_CPU ? 3 : 1;
    static const mlaf_cpu_isa isas[3] = {MLAF_CPU_ISA_SCALAR, MLAF_CPU_ISA_AVX2, MLAF_CPU_ISA_AVX512};
    int ok = 1, pairs = 0;
    char why[256] = "";
    for (int ik = 0; ik < isa_n && ok; ik++)
        for (int iq = 0; iq < isa_n && ok; iq++) {
            if (be == MLAF_BACKEND_CPU &&
                (mlaf_context_set_cpu_isa(ctx, isas[ik]) != MLAF_OK ||
                 mlaf_context_set_cpu_isa(ctx, isas[iq]) != MLAF_OK))
                continue;
            mlaf_gbuf gl, gw, gp, gs, gcs, gc, gkp, gq, gpq;
            memset(&gl, 0, sizeof gl);
            int a = mlaf_gbuf_alloc(&gl, be, (size_t)(T * (C + R)) * es, lat, 0) == MLAF_OK &&
                    mlaf_gbuf_alloc(&gw, be, sizeof(float) * C, w, 0) == MLAF_OK &&
                    mlaf_gbuf_alloc(&gp, be, sizeof pos, pos, 0) == MLAF_OK &&
                    mlaf_gbuf_alloc(&gpq, be, sizeof pos, pos, 0) == MLAF_OK &&
                    mlaf_gbuf_alloc(&gs, be, sizeof slot, slot, 0) == MLAF_OK &&
                    mlaf_gbuf_alloc(&gcs, be, sizeof(float) * (size_t)(MAXP * R), cs, 0) == MLAF_OK &&
                    mlaf_gbuf_alloc(&gc, be, (size_t)(T * (C + R)) * es, NULL, 0) == MLAF_OK &&
                    mlaf_gbuf_alloc(&gkp, be, (size_t)(T * R) * es, NULL, 0) == MLAF_OK &&
                    mlaf_gbuf_alloc(&gq, be, (size_t)(T * H * D) * es, qh, 0) == MLAF_OK;
            if (!a) {
                ok = 0;
                snprintf(why, sizeof why, "allocation failed");
                break;
            }
            mlaf_mla_kv_cache_params p = {0, C, R, 1e-6f, 1e-6f, style};
            mlaf_tensor tl = mlaf_tensor_2d(gl.ptr, dt, T, C + R, C + R);
            mlaf_tensor tw = mlaf_tensor_1d(gw.ptr, MLAF_F32, C);
            mlaf_tensor tp = mlaf_tensor_1d(gp.ptr, MLAF_I64, T), tpq = mlaf_tensor_1d(gpq.ptr, MLAF_I64, T);
            mlaf_tensor ts = mlaf_tensor_1d(gs.ptr, MLAF_I64, T);
            mlaf_tensor tcs = mlaf_tensor_2d(gcs.ptr, MLAF_F32, MAXP, R, R);
            mlaf_tensor tc = mlaf_tensor_3d(gc.ptr, dt, T, 1, C + R, C + R, C + R);
            mlaf_tensor tkp = mlaf_tensor_2d(gkp.ptr, dt, T, R, R);
            mlaf_tensor tq = mlaf_tensor_3d(gq.ptr, dt, T, H, D, H * D, D);
            mlaf_rope_params rp = {R, style};
            if (be == MLAF_BACKEND_CPU) mlaf_context_set_cpu_isa(ctx, isas[ik]);
            mlaf_status st = mlaf_mla_kv_cache(ctx, &p, &tl, NULL, &tw, &tp, &tcs, &ts, &tc, NULL, NULL,
                                               &tkp, NULL);
            if (be == MLAF_BACKEND_CPU) mlaf_context_set_cpu_isa(ctx, isas[iq]);
            if (st == MLAF_OK) st = mlaf_rope_q(ctx, &rp, &tq, &tpq, &tcs, NULL);
            if (st == MLAF_OK) st = mlaf_context_sync(ctx);
            if (st == MLAF_OK) st = mlaf_gbuf_download(&gc);
            if (st == MLAF_OK) st = mlaf_gbuf_download(&gkp);
            if (st == MLAF_OK) st = mlaf_gbuf_download(&gq);
            if (st != MLAF_OK) {
                ok = 0;
                snprintf(why, sizeof why, "%s: %s", mlaf_status_name(st), mlaf_context_last_error(ctx));
            }
            for (int64_t t = 0; t < T && ok; t++) {
                const unsigned char *key = (const unsigned char *)gc.body + (size_t)(t * (C + R) + C) * es;
                const unsigned char *kpe = (const unsigned char *)gkp.body + (size_t)(t * R) * es;
                for (int32_t h = 0; h < H && ok; h++) {
                    const unsigned char *qr = (const unsigned char *)gq.body + (size_t)((t * H + h) * D + NOPE) * es;
                    if (memcmp(key, qr, (size_t)R * es) != 0 || memcmp(kpe, qr, (size_t)R * es) != 0) {
                        ok = 0;
                        snprintf(why, sizeof why, "token %lld head %d (position %lld): key and query rope "
                                 "bits differ (key isa %s, query isa %s)", (long long)t, (int)h,
                                 (long long)pos[t], mlaf_cpu_isa_name(isas[ik]), mlaf_cpu_isa_name(isas[iq]));
                    }
                }
            }
            pairs++;
            mlaf_gbuf_free(&gl);
            mlaf_gbuf_free(&gw);
            mlaf_gbuf_free(&gp);
            mlaf_gbuf_free(&gpq);
            mlaf_gbuf_free(&gs);
            mlaf_gbuf_free(&gcs);
            mlaf_gbuf_free(&gc);
            mlaf_gbuf_free(&gkp);
            mlaf_gbuf_free(&gq);
        }
    if (be == MLAF_BACKEND_CPU) mlaf_context_set_cpu_isa(ctx, MLAF_CPU_ISA_AUTO);
    tl_case(ok && pairs > 0, name, "%s", why);
    free(lat);
    free(qh);
    free(w);
    free(cs);
}

static void suite(mlaf_context *ctx, int quick, const char *extra) {
    const int64_t Ts[8] = {0, 1, 2, 7, 64, 257, 4096, 65537};
    const int nT = quick || extra ? 6 : 8;
    int variant = 0;
    /* 1. the sweep */
    for (int pi = 0; pi < mlaf_preset_count(); pi++)
        for (int di = 0; di < 3; di++)
            for (int ti = 0; ti < nT; ti++)
                for (int st = 0; st < 2; st++) {
                    if (Ts[ti] == 4096 && st != (pi + di) % 2) continue;
                    if (Ts[ti] > 65536 && (pi != (di == 0 ? 1 : di == 1 ? 4 : 0) || st != di % 2)) continue;
                    if (extra && (ti < 3 || st != (pi + di + ti) % 2)) continue; /* ISA runs: a subset */
                    if (extra && tl_quick() && Ts[ti] > 64) continue; /* sanitizers: the ISA paths on short calls */
                    variant++;
                    mlaf_verify_case c = make(mlaf_preset_at(pi), di, Ts[ti], (variant & ~1) | st,
                                              seed_of(pi, di, Ts[ti], st));
                    c.weight_dtype = variant % 7 == 3 ? MLAF_F32 : c.dtype;
                    run(ctx, "MLA_KV_CACHE", &c, extra);
                }
    /* 1b. the CUDA launch shapes between small and large T (H200, 132 SMs: T = 300 / 600 BLKR
     * with 128 norm threads (4 vectors per thread for f32 rows), 1000 with 64, 1500 / 2000 the
     * PIPE kernel for rows of the KF layout (bf16 / f16, interleaved) and WAVEW (weights staged
     * per block) for the others, 3500 / 4600 the prefetching persistent grid for DeepSeek-V3 /
     * GLM-4.7-Flash rows), every dtype, both styles */
    if (!quick && !extra) {
        static const int64_t mid[7] = {300, 600, 1000, 1500, 2000, 3500, 4600};
        const char *names[2] = {"glm-4.7-flash", "deepseek-v3"};
        for (int m = 0; m < 2; m++)
            for (int di = 0; di < 3; di++)
                for (int ti = 0; ti < 7; ti++) {
                    const int st = (m + di + ti) % 2;
                    mlaf_verify_case c = make(mlaf_preset_find(names[m]), di, mid[ti], 4 * ti + 2 * st,
                                              seed_of(11 + m, di, mid[ti], st));
                    run(ctx, "MLA_KV_CACHE", &c, extra);
                }
        /* large T (many waves of the CUDA row kernel): a bf16 GLM-4.7-Flash row, interleaved;
         * an f16 DeepSeek-V3 row, NeoX, strided, int32 indices */
        for (int m = 0; m < 2; m++) {
            mlaf_verify_case c = make(mlaf_preset_find(names[m]), 2 - m, 32771, 3 * m, seed_of(13 + m, 2 - m, 32771, m));
            run(ctx, "MLA_KV_CACHE", &c, extra);
        }
    }
    /* 2. every block size x style x index dtype, cache dtype different from the latent's */
    for (int b = 0; b < 3; b++)
        for (int s = 0; s < 2; s++)
            for (int ix = 0; ix < 2; ix++)
                for (int di = 0; di < 3; di++) {
                    if (extra && di != 2) continue;
                    mlaf_verify_case c = make(mlaf_preset_at(0), di, 257, 0, seed_of(b, s, ix, di));
                    c.block_size = BLOCKS[b];
                    c.rope_style = s ? MLAF_ROPE_NEOX : MLAF_ROPE_INTERLEAVED;
                    c.index_dtype = ix ? MLAF_I32 : MLAF_I64;
                    c.cache_dtype = DTYPES[(di + 1 + b) % 3];
                    c.strided = (b + s + ix) % 2;
                    run(ctx, "MLA_KV_CACHE", &c, extra);
                }
    /* 3. Q = 0, R = 0, odd widths, in place, optional outputs omitted */
    const mlaf_model_config *lite = mlaf_preset_find("deepseek-v2-lite");
    static const int32_t dims[4][3] = {{0, 512, 0}, {67, 131, 10}, {0, 17, 2}, {5, 33, 0}};
    for (int di = 0; di < 3; di++) {
        mlaf_verify_case c = make(lite, di, 64, 1 + di, seed_of(7, di, 1, 0));
        run(ctx, "NO_Q_LORA", &c, extra);
        for (int k = 0; k < 4; k++) {
            mlaf_model_config cfg = *mlaf_preset_at(0);
            snprintf(cfg.name, sizeof cfg.name, "custom-%d-%d-%d", dims[k][0], dims[k][1], dims[k][2]);
            cfg.q_lora_rank = dims[k][0], cfg.kv_lora_rank = dims[k][1], cfg.qk_rope_head_dim = dims[k][2];
            mlaf_verify_case d = make(&cfg, di, 99, k + di, seed_of(8, di, k, 0));
            run(ctx, "MLA_KV_CACHE", &d, extra);
        }
        for (int m = 0; m < 4; m++) {
            mlaf_verify_case e = make(mlaf_preset_at(m), di, 257, m + 2 * di, seed_of(9, di, m, 0));
            e.in_place = m < 2;
            e.no_k_pe = m == 1 ? 1 : m == 2 ? 1 : m == 3 ? 2 : 0;
            run(ctx, m < 2 ? "IN_PLACE_CONTEXT_PARALLEL" : "MLA_KV_CACHE", &e, extra);
        }
    }
    if (!extra)
        for (int di = 0; di < 3; di++)
            for (int s = 0; s < 2; s++) key_equals_query(ctx, DTYPES[di], s ? MLAF_ROPE_NEOX : MLAF_ROPE_INTERLEAVED);
}

/* The CUDA kernels find a slot's cache block as (slot * mul) >> shift (mlaf_div_magic): equal to
 * slot / block_size for edge and pseudo-random block sizes and slots below 2^31, and no
 * constants for block sizes outside [1, 2^31). */
static void slot_division(void) {
    static const int64_t edge[] = {1,          2,          3,          5,          7,          16,
                                   17,         63,         64,         65,         255,        256,
                                   1000,       4095,       4096,       4097,       65535,      65537,
                                   1000003,    715827883,  1073741823, 1073741824, 1073741825, 2147483647};
    const int ne = (int)(sizeof edge / sizeof edge[0]);
    uint64_t r = 0x9e3779b97f4a7c15ull, checks = 0, bad = 0, bad_d = 0, bad_n = 0;
    for (int i = 0; i < ne + 300; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        const int64_t d = i < ne ? edge[i] : (int64_t)((r >> 33) % 2147483647u) + 1;
        uint64_t mul = 0;
        int32_t sh = 0;
        if (!mlaf_div_magic(d, &mul, &sh)) {
            bad++, bad_d = (uint64_t)d;
            continue;
        }
        const int64_t top = 2147483647, near = top / d * d;
        const int64_t fixed[] = {0, 1, d - 1, d, d + 1, 2 * d - 1, 2 * d, near - 1, near, top - 1, top};
        for (int k = 0; k < 11 + 2000; k++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            const int64_t n = k < 11 ? fixed[k] : (int64_t)((r >> 33) & 0x7fffffffu);
            if (n < 0 || n > top) continue;
            checks++;
            if ((((uint64_t)n * mul) >> sh) != (uint64_t)(n / d)) bad++, bad_d = (uint64_t)d, bad_n = (uint64_t)n;
        }
    }
    uint64_t m2 = 0;
    int32_t s2 = 0;
    const int refuse = !mlaf_div_magic(0, &m2, &s2) && !mlaf_div_magic(-5, &m2, &s2) &&
                       !mlaf_div_magic((int64_t)1 << 31, &m2, &s2);
    tl_case(bad == 0 && refuse, "CACHE_SLOT_DIVISION(block_size=1..2^31-1,slots<2^31)",
            "%llu of %llu checks wrong (first d=%llu n=%llu), out-of-range refused=%d", (unsigned long long)bad,
            (unsigned long long)checks, (unsigned long long)bad_d, (unsigned long long)bad_n, refuse);
}

int main(void) {
    slot_division();
    return tl_run_suite("MLA_KV_CACHE", suite);
}
