/*
 * test_v4_attn.c — DeepSeek-V4's attention parts (docs/mla.md) on every backend, at the V4-Flash
 * numbers of mlaf_v4_flash_attn_config (src/ref/verify_util.c) and at smaller odd shapes:
 *
 *   KV_TAIL        mla_kv_cache with kv_rope_tail through the oracle harness: the kv part
 *                  normalized, rounded, its tail rotated and rounded again, into the dense k_nope
 *                  and a plain (any dtype) or per-tensor fp8 cache; strided rows, i32 / i64
 *                  indices, short slot_mapping, any block_size, rejected positions and slots
 *   KV_TAIL_INPLACE the roped in-place form (docs/mla.md, in-place forms): k_nope given as the latent's own kv
 *                  columns, the row ending as [q_norm | rope-tailed kv_norm]
 *   FP8_V4         the 584-B record through the harness (every byte against the reference
 *                  encoder applied to the op's own dense row, decoding within half an e4m3 ulp)
 *   FP8_V4_LAYOUT  a direct call whose record bytes are found by the planar offsets alone (data
 *                  row at page * stride + o * 576, scale row at page * stride + block_size * 576 +
 *                  o * 8) and decoded back; every other cache byte unchanged
 *   HEAD_NORM      rope_q with head_norm, in place and into q_out with padding heads (+0.0), and
 *                  rope_q_out without head_norm
 *   HARNESS        the harness's own test: a corrupted output must fail the case
 *   REJECT         bad calls: the status, a message naming the argument, nothing written
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fp8.h"
#include "half.h"
#include "testlib.h"

static int filtered_out(const char *name) {
    const char *f = getenv("MLAF_TEST_FILTER");
    return f && *f && !strstr(name, f);
}

static void run_case(mlaf_context *ctx, mlaf_op op, const mlaf_verify_case *c, const char *kind, const char *tag,
                     int expect_pass) {
    char name[384];
    snprintf(name, sizeof name, "%s(preset=%s,T=%lld,dtype=%s,backend=%s,cache=%s,%s,bs=%lld,%s%s%s%s%s%s%s)", kind,
             c->cfg.name, (long long)c->T, mlaf_dtype_name(c->dtype), mlaf_backend_name(mlaf_context_backend(ctx)),
             op == MLAF_OP_MLA_KV_CACHE ? mlaf_kv_format_name(c->kv_format) : "none", mlaf_dtype_name(c->cache_dtype),
             (long long)c->block_size, c->strided ? "strided" : "contiguous", c->in_place ? ",in-place" : "",
             c->no_k_pe == 2 ? ",cache-only" : "", c->map_short ? ",short-map" : "",
             c->head_norm ? ",head_norm" : "", c->q_out_heads ? ",q_out" : "", tag ? tag : "");
    if (filtered_out(name)) return;
    mlaf_verify_result r;
    const mlaf_status st = mlaf_verify_op(ctx, op, c, &r);
    if (expect_pass)
        tl_case(st == MLAF_OK && r.passed, name, "%s [%s, worst %.3g units]", r.detail, mlaf_status_name(st),
                r.worst_units);
    else
        tl_case(st == MLAF_OK && !r.passed && strstr(r.detail, "t=") != NULL, name,
                "a corrupted output passed or was not named: %s [%s]", r.detail, mlaf_status_name(st));
}

/* A V4-like config of other widths: Q, C (tail 64 inside), eps. */
static mlaf_model_config small_cfg(int32_t Q, int32_t C) {
    mlaf_model_config m = mlaf_v4_flash_attn_config(NULL);
    snprintf(m.name, sizeof m.name, "v4-like-q%d-c%d", Q, C);
    m.q_lora_rank = Q;
    m.kv_lora_rank = C;
    m.rms_norm_eps = 1e-5f;
    return m;
}

static void verify_cases(mlaf_context *ctx, int quick, const char *tag) {
    int32_t tail = 0;
    const mlaf_model_config v4 = mlaf_v4_flash_attn_config(&tail);
    const mlaf_model_config cfgs[3] = {v4, small_cfg(0, 512), small_cfg(40, 200)};
    static const mlaf_dtype dts[3] = {MLAF_BF16, MLAF_F16, MLAF_F32};
    static const int64_t blocks[4] = {1, 16, 64, 3};
    const int64_t Ts[4] = {0, 7, 300, 1031};
    const int nT = tag ? 2 : quick ? 3 : 4;
    int v = 0;
    /* plain and per-tensor fp8 caches */
    for (int f = 0; f < 2; f++)
        for (int ci = 0; ci < 3; ci++)
            for (int d = 0; d < 3; d++)
                for (int ti = 0; ti < nT; ti++) {
                    if ((tag || quick) && (ti + d + ci) % 2) continue;
                    v++;
                    const int64_t T = Ts[ti] + (ti == 3 ? 0 : v % 3);
                    mlaf_verify_case c = mlaf_verify_case_default(&cfgs[ci], dts[d], T, 0x7a11000ull + 17u * (uint64_t)v);
                    c.kv_rope_tail = tail;
                    c.kv_format = f ? MLAF_KV_FP8 : MLAF_KV_PLAIN;
                    c.block_size = blocks[v % 4];
                    c.strided = v % 2;
                    c.index_dtype = (v / 2) % 2 ? MLAF_I32 : MLAF_I64;
                    c.map_short = v % 4 == 3 ? T / 3 + 1 : 0;
                    c.weight_dtype = v % 5 == 1 ? MLAF_F32 : dts[d];
                    if (f) {
                        c.cache_dtype = v % 2 ? MLAF_U8 : MLAF_FP8_E4M3;
                        c.fp8_conv = v % 3 == 1 ? MLAF_FP8_MUL : MLAF_FP8_DIV;
                        c.want_amax = v % 2;
                        c.no_k_pe = v % 3 == 2 ? 2 : 0;
                    } else {
                        c.cache_dtype = dts[(d + v) % 3];
                        c.no_k_pe = v % 5 == 4 ? 2 : 0;
                    }
                    run_case(ctx, MLAF_OP_MLA_KV_CACHE, &c, "KV_TAIL", tag, 1);
                    c.in_place = 1;
                    c.no_k_pe = 0;
                    run_case(ctx, MLAF_OP_MLA_KV_CACHE, &c, "KV_TAIL_INPLACE", tag, 1);
                }
    /* fp8_v4 */
    const int64_t Tv[4] = {1, 64, 300, 1031};
    for (int ti = 0; ti < nT; ti++)
        for (int k = 0; k < 4; k++) {
            if ((tag || quick) && (ti + k) % 2) continue;
            v++;
            mlaf_verify_case c = mlaf_verify_case_default(&cfgs[k % 2], MLAF_BF16, Tv[ti] + k % 2, 0x5840000ull + 29u * (uint64_t)v);
            c.kv_rope_tail = tail;
            c.kv_format = MLAF_KV_FP8_V4;
            c.cache_dtype = k % 2 ? MLAF_U8 : MLAF_FP8_E4M3;
            c.block_size = blocks[(v + k) % 4];
            c.strided = k / 2;
            c.in_place = k == 3;
            c.no_k_pe = k == 1 ? 2 : 0;
            c.map_short = k == 2 ? c.T / 4 + 1 : 0;
            c.weight_dtype = k == 2 ? MLAF_F32 : MLAF_BF16;
            c.index_dtype = k % 2 ? MLAF_I32 : MLAF_I64;
            run_case(ctx, MLAF_OP_MLA_KV_CACHE, &c, "FP8_V4", tag, 1);
        }
    /* rope_q head_norm (V4: 64 heads of 448 + 64) and q_out */
    const int64_t Tq[3] = {0, 5, 67};
    for (int ti = 0; ti < (quick || tag ? 2 : 3); ti++)
        for (int d = 0; d < 3; d++)
            for (int k = 0; k < 3; k++) {
                v++;
                mlaf_model_config m = v4;
                if (k == 2) m.num_heads = 5, m.qk_nope_head_dim = 40, m.rms_norm_eps = 1e-5f;
                mlaf_verify_case c = mlaf_verify_case_default(&m, dts[d], Tq[ti], 0x4e0b000ull + 7u * (uint64_t)v);
                c.kv_rope_tail = tail;
                c.head_norm = k != 1 || d != 0;
                c.q_out_heads = k == 0 ? 0 : k == 1 ? 128 : 8;
                c.strided = v % 2;
                c.index_dtype = v % 3 ? MLAF_I64 : MLAF_I32;
                run_case(ctx, MLAF_OP_ROPE_Q, &c, "HEAD_NORM", tag, 1);
            }
    if (tag) return;
    /* the harness catches a corrupted output in each new form */
    mlaf_verify_case c = mlaf_verify_case_default(&v4, MLAF_BF16, 40, 99);
    c.kv_rope_tail = tail;
    c.corrupt_from = 2;
    run_case(ctx, MLAF_OP_MLA_KV_CACHE, &c, "HARNESS_KV_TAIL", NULL, 0);
    c.kv_format = MLAF_KV_FP8_V4;
    c.cache_dtype = MLAF_U8;
    run_case(ctx, MLAF_OP_MLA_KV_CACHE, &c, "HARNESS_FP8_V4", NULL, 0);
    c.head_norm = 1;
    c.q_out_heads = 128;
    run_case(ctx, MLAF_OP_ROPE_Q, &c, "HARNESS_HEAD_NORM", NULL, 0);
}

/* ---- fp8_v4's planar page, found by its offsets alone ---------------------------------- */

static void layout_case(mlaf_context *ctx, const char *tag) {
    char name[160];
    const mlaf_backend be = mlaf_context_backend(ctx);
    snprintf(name, sizeof name, "FP8_V4_LAYOUT(backend=%s%s%s)", mlaf_backend_name(be), tag ? "," : "", tag ? tag : "");
    if (filtered_out(name)) return;
    int32_t tail = 0;
    const mlaf_model_config m = mlaf_v4_flash_attn_config(&tail);
    const int32_t Q = m.q_lora_rank, C = m.kv_lora_rank;
    enum { T = 6, BS = 3, NB = 3, MAXPOS = 64 };
    const int64_t stride = (BS * 584 + 15) / 16 * 16 + 48; /* a page stride with room past the rows */
    const int64_t slot[T] = {4, 0, -1, 8, 2, 99};          /* 99: past the cache (counted) */
    const int64_t pos[T] = {3, 0, 7, 63, 12, 5};
    mlaf_rng rng;
    mlaf_rng_seed(&rng, 584);
    uint16_t *lat = (uint16_t *)malloc(sizeof(uint16_t) * T * (Q + C)), *w = (uint16_t *)malloc(sizeof(uint16_t) * (Q + C));
    float *cs = (float *)malloc(sizeof(float) * MAXPOS * 64);
    uint8_t *canary = (uint8_t *)malloc((size_t)(NB * stride));
    uint16_t *kn = (uint16_t *)malloc(sizeof(uint16_t) * T * C);
    if (!lat || !w || !cs || !canary || !kn) {
        tl_case(0, name, "out of memory");
        goto out0;
    }
    mlaf_fill_normal(&rng, lat, MLAF_BF16, (size_t)T * (Q + C), 0.0, 1.0);
    for (int64_t i = 0; i < C; i++) lat[i + Q] = mlaf_f32_to_bf16(i < 64 ? 1e-6f * (float)i : 1.0f); /* a tiny block */
    mlaf_fill_normal(&rng, w, MLAF_BF16, (size_t)(Q + C), 1.0, 0.2);
    mlaf_rope_table_init(cs, MAXPOS, 64, 10000.0);
    for (int64_t i = 0; i < NB * stride; i++) canary[i] = (uint8_t)(0xA5 ^ (i * 7));
    mlaf_gbuf gl, gw, gcs, gpos, gslot, gc, gq, gk, gec;
    memset(&gl, 0, sizeof gl), gw = gcs = gpos = gslot = gc = gq = gk = gec = gl;
    const int32_t zero = 0;
    mlaf_status st = mlaf_gbuf_alloc(&gl, be, sizeof(uint16_t) * T * (Q + C), lat, 0);
    if (st == MLAF_OK) st = mlaf_gbuf_alloc(&gw, be, sizeof(uint16_t) * (Q + C), w, 0);
    if (st == MLAF_OK) st = mlaf_gbuf_alloc(&gcs, be, sizeof(float) * MAXPOS * 64, cs, 0);
    if (st == MLAF_OK) st = mlaf_gbuf_alloc(&gpos, be, sizeof pos, pos, 0);
    if (st == MLAF_OK) st = mlaf_gbuf_alloc(&gslot, be, sizeof slot, slot, 0);
    if (st == MLAF_OK) st = mlaf_gbuf_alloc(&gc, be, (size_t)(NB * stride), canary, 0);
    if (st == MLAF_OK) st = mlaf_gbuf_alloc(&gq, be, sizeof(uint16_t) * T * Q, NULL, 0);
    if (st == MLAF_OK) st = mlaf_gbuf_alloc(&gk, be, sizeof(uint16_t) * T * C, NULL, 0);
    if (st == MLAF_OK) st = mlaf_gbuf_alloc(&gec, be, sizeof zero, &zero, 0);
    if (st != MLAF_OK) {
        tl_case(0, name, "buffers: %s", mlaf_status_name(st));
        goto out;
    }
    mlaf_mla_kv_cache_params p = {Q, C, 0, m.rms_norm_eps, m.rms_norm_eps, MLAF_ROPE_INTERLEAVED, tail};
    mlaf_tensor tl = mlaf_tensor_2d(gl.ptr, MLAF_BF16, T, Q + C, Q + C);
    mlaf_tensor twq = mlaf_tensor_1d(gw.ptr, MLAF_BF16, Q), twkv = mlaf_tensor_1d((uint16_t *)gw.ptr + Q, MLAF_BF16, C);
    mlaf_tensor tpos = mlaf_tensor_1d(gpos.ptr, MLAF_I64, T), tslot = mlaf_tensor_1d(gslot.ptr, MLAF_I64, T);
    mlaf_tensor tcs = mlaf_tensor_2d(gcs.ptr, MLAF_F32, MAXPOS, 64, 64);
    mlaf_tensor tc = mlaf_tensor_3d(gc.ptr, MLAF_U8, NB, BS, 584, stride, 584);
    mlaf_tensor tq = mlaf_tensor_2d(gq.ptr, MLAF_BF16, T, Q, Q), tk = mlaf_tensor_2d(gk.ptr, MLAF_BF16, T, C, C);
    mlaf_tensor tec = mlaf_tensor_1d(gec.ptr, MLAF_I32, 1);
    mlaf_kv_cache_desc d = {MLAF_KV_FP8_V4, &tc};
    st = mlaf_mla_kv_cache_fmt(ctx, &p, &tl, &twq, &twkv, &tpos, &tcs, &tslot, &d, &tq, &tk, NULL, &tec);
    if (st == MLAF_OK) st = mlaf_context_sync(ctx);
    if (st == MLAF_OK) st = mlaf_gbuf_download(&gc);
    if (st == MLAF_OK) st = mlaf_gbuf_download(&gk);
    if (st == MLAF_OK) st = mlaf_gbuf_download(&gec);
    if (st != MLAF_OK) {
        tl_case(0, name, "call: %s: %s", mlaf_status_name(st), mlaf_context_last_error(ctx));
        goto out;
    }
    memcpy(kn, gk.body, sizeof(uint16_t) * T * C);
    const uint8_t *cache = (const uint8_t *)gc.body;
    uint8_t *mine = (uint8_t *)calloc((size_t)(NB * stride), 1);
    int bad = !mine || !mlaf_gbuf_guards_ok(&gc);
    char why[256] = "";
    if (bad) snprintf(why, sizeof why, "guards or memory");
    int32_t ec;
    memcpy(&ec, gec.body, sizeof ec);
    if (!bad && ec != 1) bad = 1, snprintf(why, sizeof why, "error_count = %d, expected 1 (slot 99)", ec);
    for (int t = 0; t < T && !bad; t++) {
        if (slot[t] < 0 || slot[t] >= NB * BS) continue;
        const int64_t page = (slot[t] / BS) * stride, o = slot[t] % BS;
        const int64_t drow = page + o * 576, srow = page + BS * 576 + o * 8;
        for (int64_t i = 0; i < 576; i++) mine[drow + i] = 1;
        for (int64_t i = 0; i < 8; i++) mine[srow + i] = 1;
        if (cache[srow + 7] != 0) bad = 1, snprintf(why, sizeof why, "t=%d: scale row byte 7 = 0x%02x, expected 0", t, cache[srow + 7]);
        for (int i = 0; i < 448 && !bad; i++) {
            const float x = mlaf_bf16_to_f32(kn[t * C + i]), s = ldexpf(1.0f, (int)cache[srow + i / 64] - 127);
            double ratio;
            if (mlaf_ref_fp8_decode_check(cache[drow + i], x, s, MLAF_FP8_DIV, &ratio) == 0)
                bad = 1, snprintf(why, sizeof why, "t=%d i=%d: byte 0x%02x x 2^%d does not decode to %g", t, i, cache[drow + i],
                                  (int)cache[srow + i / 64] - 127, x);
        }
        for (int i = 0; i < 64 && !bad; i++) {
            const uint16_t h = (uint16_t)(cache[drow + 448 + 2 * i] | cache[drow + 449 + 2 * i] << 8);
            if (h != kn[t * C + 448 + i])
                bad = 1, snprintf(why, sizeof why, "t=%d: rope value %d = 0x%04x, dense k_nope 0x%04x", t, i, h, kn[t * C + 448 + i]);
        }
        if (!bad && t == 0 && cache[srow] != (uint8_t)(127 + mlaf_ceil_log2_f32(1e-4f / 448.0f)))
            bad = 1, snprintf(why, sizeof why, "t=0: a block of |x| < 1e-4 has scale byte %d, expected the floor's", cache[srow]);
    }
    for (int64_t i = 0; i < NB * stride && !bad; i++)
        if (!mine[i] && cache[i] != canary[i])
            bad = 1, snprintf(why, sizeof why, "cache byte %lld written, no token's record holds it", (long long)i);
    free(mine);
    tl_case(!bad, name, "%s", why);
out:
    mlaf_gbuf_free(&gl), mlaf_gbuf_free(&gw), mlaf_gbuf_free(&gcs), mlaf_gbuf_free(&gpos), mlaf_gbuf_free(&gslot);
    mlaf_gbuf_free(&gc), mlaf_gbuf_free(&gq), mlaf_gbuf_free(&gk), mlaf_gbuf_free(&gec);
out0:
    free(lat), free(w), free(cs), free(canary), free(kn);
}

/* ---- rejections (validation is shared by the backends; checked on host memory) ----------- */

static void reject_cases(void) {
    mlaf_context *ctx = tl_context(MLAF_BACKEND_CPU);
    if (!ctx) return;
    enum { T = 2, Q = 8, C = 512 };
    static uint16_t lat[T * (Q + C)], w[Q + C], kn[T * C], q[T * Q], qh[T * 2 * 64], qo[T * 4 * 64];
    static uint8_t cache[2 * 4 * 600 + 64];
    static float cs[16 * 64];
    static int64_t pos[T], slot[T];
    memset(kn, 0xFF, sizeof kn);
    mlaf_tensor tl = mlaf_tensor_2d(lat, MLAF_BF16, T, Q + C, Q + C), tlf = tl;
    tlf.dtype = MLAF_F16;
    mlaf_tensor twq = mlaf_tensor_1d(w, MLAF_BF16, Q), twkv = mlaf_tensor_1d(w + Q, MLAF_BF16, C);
    mlaf_tensor twkvf = twkv;
    twkvf.dtype = MLAF_F16;
    mlaf_tensor twqf = twq;
    twqf.dtype = MLAF_F16;
    mlaf_tensor tpos = mlaf_tensor_1d(pos, MLAF_I64, T), tslot = mlaf_tensor_1d(slot, MLAF_I64, T);
    mlaf_tensor tcs = mlaf_tensor_2d(cs, MLAF_F32, 16, 64, 64);
    mlaf_tensor tq = mlaf_tensor_2d(q, MLAF_BF16, T, Q, Q), tk = mlaf_tensor_2d(kn, MLAF_BF16, T, C, C);
    mlaf_tensor tkf = tk, tqf = tq;
    tkf.dtype = MLAF_F16, tqf.dtype = MLAF_F16;
    mlaf_tensor tkp = mlaf_tensor_2d(q, MLAF_BF16, T, 0, 1);
    mlaf_tensor tc = mlaf_tensor_3d(cache, MLAF_U8, 2, 4, 584, 4 * 584, 584);
    mlaf_tensor tc_s1 = mlaf_tensor_3d(cache, MLAF_U8, 1, 4, 584, 4 * 600, 600);
    mlaf_tensor tc_s0 = mlaf_tensor_3d(cache, MLAF_U8, 2, 4, 584, 4 * 584 + 8, 584);
    mlaf_kv_cache_desc dv4 = {MLAF_KV_FP8_V4, &tc}, dv4s1 = {MLAF_KV_FP8_V4, &tc_s1}, dv4s0 = {MLAF_KV_FP8_V4, &tc_s0};
    mlaf_tensor tplain = mlaf_tensor_3d(cache, MLAF_U8, 1, 1, 656, 656, 656);
    mlaf_kv_cache_desc dds = {MLAF_KV_FP8_DS_MLA, &tplain};
    const mlaf_mla_kv_cache_params good = {Q, C, 0, 1e-6f, 1e-6f, MLAF_ROPE_INTERLEAVED, 64};
    struct {
        const char *label;
        mlaf_mla_kv_cache_params p;
        const mlaf_tensor *lat, *wq, *wkv, *q, *k_pe;
        const mlaf_kv_cache_desc *d;
        mlaf_status want;
        const char *names;
    } kc[] = {
        {"odd tail", {Q, C, 0, 1e-6f, 1e-6f, MLAF_ROPE_INTERLEAVED, 63}, &tl, &twq, &twkv, &tq, NULL, &dv4, MLAF_ERR_INVALID_ARGUMENT, "kv_rope_tail"},
        {"tail > C", {Q, C, 0, 1e-6f, 1e-6f, MLAF_ROPE_INTERLEAVED, 514}, &tl, &twq, &twkv, &tq, NULL, &dv4, MLAF_ERR_INVALID_ARGUMENT, "kv_rope_tail"},
        {"tail and R", {Q, C - 64, 64, 1e-6f, 1e-6f, MLAF_ROPE_INTERLEAVED, 64}, &tl, &twq, &twkv, &tq, NULL, &dv4, MLAF_ERR_INVALID_ARGUMENT, "rope_dim"},
        {"tail and neox", {Q, C, 0, 1e-6f, 1e-6f, MLAF_ROPE_NEOX, 64}, &tl, &twq, &twkv, &tq, NULL, &dv4, MLAF_ERR_INVALID_ARGUMENT, "rope style"},
        {"tail and k_pe", good, &tl, &twq, &twkv, &tq, &tkp, &dv4, MLAF_ERR_INVALID_ARGUMENT, "k_pe"},
        {"tail and fp8_ds_mla", good, &tl, &twq, &twkv, &tq, NULL, &dds, MLAF_ERR_INVALID_ARGUMENT, "fp8_ds_mla"},
        {"fp8_v4 without a tail", {Q, C, 0, 1e-6f, 1e-6f, MLAF_ROPE_INTERLEAVED, 0}, &tl, &twq, &twkv, &tq, NULL, &dv4, MLAF_ERR_INVALID_ARGUMENT, "kv_rope_tail"},
        {"fp8_v4 with tail 32", {Q, C, 0, 1e-6f, 1e-6f, MLAF_ROPE_INTERLEAVED, 32}, &tl, &twq, &twkv, &tq, NULL, &dv4, MLAF_ERR_INVALID_ARGUMENT, "fp8_v4"},
        {"fp8_v4 with f16", good, &tlf, &twqf, &twkvf, &tqf, NULL, &dv4, MLAF_ERR_DTYPE, "latent.dtype"},
        {"fp8_v4 stride[1] 600", good, &tl, &twq, &twkv, &tq, NULL, &dv4s1, MLAF_ERR_STRIDE, "stride[1]"},
        {"fp8_v4 page stride", good, &tl, &twq, &twkv, &tq, NULL, &dv4s0, MLAF_ERR_STRIDE, "stride[0]"},
    };
    for (size_t i = 0; i < sizeof kc / sizeof kc[0]; i++) {
        char name[128];
        snprintf(name, sizeof name, "REJECT(%s,backend=cpu)", kc[i].label);
        if (filtered_out(name)) continue;
        memset(cache, 0x3C, sizeof cache);
        const mlaf_tensor *kout = kc[i].lat == &tlf ? &tkf : &tk;
        mlaf_tensor tcs_i = tcs;
        if (kc[i].p.kv_rope_tail == 32) tcs_i.shape[1] = 32; /* a table of the tail's width */
        mlaf_status st = mlaf_mla_kv_cache_fmt(ctx, &kc[i].p, kc[i].lat, kc[i].wq, kc[i].wkv, &tpos, &tcs_i, &tslot, kc[i].d,
                                               kc[i].q, kout, kc[i].k_pe, NULL);
        int untouched = 1;
        for (size_t k = 0; k < sizeof cache; k++) untouched &= cache[k] == 0x3C;
        for (size_t k = 0; k < T * C; k++) untouched &= kn[k] == 0xFFFF;
        const char *msg = mlaf_context_last_error(ctx);
        tl_case(st == kc[i].want && strstr(msg, kc[i].names) && untouched, name, "%s: \"%s\" (want %s naming %s)%s",
                mlaf_status_name(st), msg, mlaf_status_name(kc[i].want), kc[i].names, untouched ? "" : ", wrote");
    }
    {
        mlaf_split_qk_norm_params sp = {Q, C, 0, 1e-6f, 1e-6f, 64};
        mlaf_status st = mlaf_split_qk_norm(ctx, &sp, &tl, &twq, &twkv, &tq, &tk, NULL);
        int untouched = 1;
        for (size_t k = 0; k < T * C; k++) untouched &= kn[k] == 0xFFFF;
        tl_case(st == MLAF_ERR_INVALID_ARGUMENT && strstr(mlaf_context_last_error(ctx), "kv_rope_tail") && untouched,
                "REJECT(split_qk_norm with kv_rope_tail,backend=cpu)", "%s: %s", mlaf_status_name(st),
                mlaf_context_last_error(ctx));
    }
    {
        mlaf_tensor tqh = mlaf_tensor_3d(qh, MLAF_BF16, T, 2, 64, 128, 64);
        mlaf_tensor to_small = mlaf_tensor_3d(qo, MLAF_BF16, T, 1, 64, 64, 64);
        mlaf_tensor to_d = mlaf_tensor_3d(qo, MLAF_BF16, T, 4, 32, 128, 32);
        mlaf_tensor to_f = mlaf_tensor_3d(qo, MLAF_F16, T, 4, 64, 256, 64);
        mlaf_tensor to_ov = mlaf_tensor_3d(qh, MLAF_BF16, T, 2, 64, 128, 64);
        const mlaf_rope_params rp = {64, MLAF_ROPE_INTERLEAVED, 1, 0.0f}, rbad = {64, MLAF_ROPE_INTERLEAVED, 1, -1.0f};
        struct {
            const char *label;
            const mlaf_rope_params *p;
            const mlaf_tensor *o;
            mlaf_status want;
            const char *names;
        } rc[] = {
            {"head_norm_eps < 0", &rbad, NULL, MLAF_ERR_INVALID_ARGUMENT, "head_norm_eps"},
            {"q_out with fewer heads", &rp, &to_small, MLAF_ERR_SHAPE, "q_out.shape[1]"},
            {"q_out of another head dim", &rp, &to_d, MLAF_ERR_SHAPE, "q_out.shape[2]"},
            {"q_out in f16", &rp, &to_f, MLAF_ERR_DTYPE, "q_out.dtype"},
            {"q_out over q", &rp, &to_ov, MLAF_ERR_OVERLAP, "q_out"},
        };
        for (size_t i = 0; i < sizeof rc / sizeof rc[0]; i++) {
            char name[128];
            snprintf(name, sizeof name, "REJECT(rope_q %s,backend=cpu)", rc[i].label);
            memset(qh, 0x11, sizeof qh), memset(qo, 0x22, sizeof qo);
            for (int t = 0; t < T; t++) pos[t] = t;
            mlaf_status st = mlaf_rope_q_out(ctx, rc[i].p, &tqh, &tpos, &tcs, rc[i].o, NULL);
            int untouched = 1;
            for (size_t k = 0; k < sizeof qh / 2; k++) untouched &= qh[k] == 0x1111;
            for (size_t k = 0; k < sizeof qo / 2; k++) untouched &= qo[k] == 0x2222;
            const char *msg = mlaf_context_last_error(ctx);
            tl_case(st == rc[i].want && strstr(msg, rc[i].names) && untouched, name, "%s: \"%s\"%s", mlaf_status_name(st),
                    msg, untouched ? "" : ", wrote");
        }
    }
    mlaf_context_free(ctx);
}

static void suite(mlaf_context *ctx, int quick, const char *tag) {
    verify_cases(ctx, quick, tag);
    layout_case(ctx, tag);
}

int main(void) {
    reject_cases();
    return tl_run_suite("V4_ATTN", suite);
}
