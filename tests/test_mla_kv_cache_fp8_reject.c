/*
 * test_mla_kv_cache_fp8_reject.c — bad cache descriptions rejected with nothing written (REJECT), and slot_mapping
 * shorter than T (SHORT_MAP), every format.
 * The formats and the direct call: mla_kv_cache_fmt_common.h.
 */
#include "mla_kv_cache_fmt_common.h"

/* ---- 4. rejections ----------------------------------------------------------------------- */

/* 1 when no output buffer changed (and guards are intact). */
static int nothing_written(kv_call *k) {
    if (kv_download(k) != MLAF_OK) return 0;
    const mlaf_gbuf *poisoned[3] = {&k->gq, &k->gk, &k->gp};
    for (int i = 0; i < 3; i++)
        for (size_t j = 0; j < poisoned[i]->bytes; j++)
            if (((const unsigned char *)poisoned[i]->body)[j] != 0xFF) return 0;
    int32_t ec;
    float amax;
    memcpy(&ec, k->gec.body, 4);
    memcpy(&amax, k->gamax.body, 4);
    const mlaf_gbuf *all[] = {&k->gq, &k->gk, &k->gp, &k->gec, &k->gcache, &k->gkpe, &k->gamax};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (!mlaf_gbuf_guards_ok(all[i])) return 0;
    return ec == 0 && mlaf_f32_bits(amax) == mlaf_f32_bits(k->amax_init) && mlaf_gbuf_equals(&k->gcache, k->canary) &&
           mlaf_gbuf_equals(&k->gkpe, k->kcanary);
}

typedef enum spoil {
    SP_FP8_WIDTH,
    SP_DS_WIDTH,
    SP_NO_SCALE,
    SP_SCALE_DTYPE,
    SP_SCALE_SHAPE,
    SP_DS_LATENT_F16,
    SP_DS_C192,
    SP_DS_KPE,
    SP_BAD_FORMAT,
    SP_BAD_CONV,
    SP_BAD_TILE,
    SP_SCALE_FOR_DS,
    SP_AMAX_FOR_PLAIN,
    SP_FP8_CACHE_BF16,
    SP_DS_STRIDE,
    SP_KPE_DTYPE,
    SP_KPE_BLOCKS,
    SP_NO_DESC,
    SP_COUNT
} spoil;

typedef struct reject_case {
    const char *what;
    mlaf_kv_format format;
    mlaf_status want;
    const char *needle; /* the argument the message must name */
} reject_case;

static const reject_case REJECTS[SP_COUNT] = {
    {"fp8 record width C + R - 1", MLAF_KV_FP8, MLAF_ERR_SHAPE, "kv_cache.shape[2]"},
    {"fp8_ds_mla record width 655", MLAF_KV_FP8_DS_MLA, MLAF_ERR_SHAPE, "kv_cache.shape[2]"},
    {"fp8 without a scale", MLAF_KV_FP8, MLAF_ERR_NULL_POINTER, "cache.scale"},
    {"fp8 scale in f16", MLAF_KV_FP8, MLAF_ERR_DTYPE, "scale.dtype"},
    {"fp8 scale of 2 values", MLAF_KV_FP8, MLAF_ERR_SHAPE, "scale.shape[0]"},
    {"fp8_ds_mla with an f16 latent", MLAF_KV_FP8_DS_MLA, MLAF_ERR_DTYPE, "latent.dtype"},
    {"fp8_ds_mla with C = 192", MLAF_KV_FP8_DS_MLA, MLAF_ERR_INVALID_ARGUMENT, "kv_lora_rank"},
    {"fp8_ds_mla with a kpe array", MLAF_KV_FP8_DS_MLA, MLAF_ERR_INVALID_ARGUMENT, "cache.kpe"},
    {"format 4", MLAF_KV_FP8, MLAF_ERR_INVALID_ARGUMENT, "cache.format"},
    {"conv 2", MLAF_KV_FP8, MLAF_ERR_INVALID_ARGUMENT, "cache.conv"},
    {"tile_scale 3", MLAF_KV_FP8_DS_MLA, MLAF_ERR_INVALID_ARGUMENT, "cache.tile_scale"},
    {"a scale for fp8_ds_mla", MLAF_KV_FP8_DS_MLA, MLAF_ERR_INVALID_ARGUMENT, "cache.scale"},
    {"amax_out for plain", MLAF_KV_PLAIN, MLAF_ERR_INVALID_ARGUMENT, "cache.amax_out"},
    {"fp8 cache in bf16", MLAF_KV_FP8, MLAF_ERR_DTYPE, "kv_cache.dtype"},
    {"fp8_ds_mla row stride 664 (not a multiple of 16)", MLAF_KV_FP8_DS_MLA, MLAF_ERR_STRIDE, "kv_cache"},
    {"kpe in another dtype", MLAF_KV_FP8, MLAF_ERR_DTYPE, "kpe.dtype"},
    {"kpe with other block count", MLAF_KV_FP8, MLAF_ERR_SHAPE, "kpe.shape[0]"},
    {"no cache description", MLAF_KV_FP8, MLAF_ERR_NULL_POINTER, "cache"},
};

static void rejections(mlaf_context *ctx) {
    const mlaf_backend be = mlaf_context_backend(ctx);
    for (int sp = 0; sp < SP_COUNT; sp++) {
        const reject_case *rc = &REJECTS[sp];
        char name[200], why[400] = "";
        snprintf(name, sizeof name, "REJECT(%s,backend=%s)", rc->what, mlaf_backend_name(be));
        if (filtered_out(name)) continue;
        kv_call k;
        const int32_t C = sp == SP_DS_C192 ? 192 : 512;
        const mlaf_dtype dt = sp == SP_DS_LATENT_F16 ? MLAF_F16 : MLAF_BF16;
        int ok = kv_make(&k, be, 32, C, 64, 5, 4, dt, rc->format, 900 + (uint64_t)sp);
        if (sp == SP_DS_KPE || sp == SP_KPE_DTYPE || sp == SP_KPE_BLOCKS) k.kpe = 1;
        if (sp == SP_DS_STRIDE) k.s1 = 664, k.s0 = 4 * 664;
        if (sp == SP_FP8_CACHE_BF16) k.cdt = MLAF_BF16;
        k.amax_init = 0.5f;
        ok = ok && kv_alloc(&k);
        if (!ok) {
            tl_case(0, name, "setup");
            kv_free(&k);
            continue;
        }
        kv_args a;
        kv_args_of(&k, 0, &a);
        const mlaf_tensor scale2 = mlaf_tensor_1d(k.gscale.ptr, MLAF_F16, 1);
        const mlaf_tensor scale3 = mlaf_tensor_1d(k.gscale.ptr, MLAF_F32, 2);
        switch ((spoil)sp) {
        case SP_FP8_WIDTH: a.cache.shape[2] = 575; break;
        case SP_DS_WIDTH: a.cache.shape[2] = 655; break;
        case SP_NO_SCALE: a.d.scale = NULL; break;
        case SP_SCALE_DTYPE: a.d.scale = &scale2; break;
        case SP_SCALE_SHAPE: a.d.scale = &scale3; break;
        case SP_BAD_FORMAT: a.d.format = (mlaf_kv_format)4; break;
        case SP_BAD_CONV: a.d.conv = (mlaf_fp8_conv)2; break;
        case SP_BAD_TILE: a.d.tile_scale = (mlaf_tile_scale)3; break;
        case SP_SCALE_FOR_DS: a.d.scale = &a.scale; break;
        case SP_AMAX_FOR_PLAIN: a.d.amax_out = &a.amax; break;
        case SP_KPE_DTYPE: a.kpe.dtype = MLAF_U8; break;
        case SP_KPE_BLOCKS: a.kpe.shape[0] = k.nb - 1; break;
        default: break;
        }
        if (sp == SP_DS_KPE) a.d.kpe = &a.kpe;
        mlaf_status st = sp == SP_NO_DESC
                             ? mlaf_mla_kv_cache_fmt(ctx, &a.p, &a.lat, &a.wq, &a.wkv, &a.pos, &a.cs, &a.slot, NULL,
                                                     &a.q, &a.k, &a.pe, &a.ec)
                             : kv_invoke(ctx, &k, &a);
        const char *msg = mlaf_context_last_error(ctx);
        if (st != rc->want)
            snprintf(why, sizeof why, "status %s, expected %s (%s)", mlaf_status_name(st), mlaf_status_name(rc->want), msg);
        else if (!strstr(msg, rc->needle))
            snprintf(why, sizeof why, "message \"%s\" does not name %s", msg, rc->needle);
        else if (!nothing_written(&k))
            snprintf(why, sizeof why, "an output changed (message \"%s\")", msg);
        tl_case(why[0] == '\0', name, "%s", why);
        kv_free(&k);
    }
}

/* ---- 5. slot_mapping shorter than T ----------------------------------------------------- */

static void short_map(mlaf_context *ctx, const fmt_case *f) {
    const mlaf_backend be = mlaf_context_backend(ctx);
    char name[200], why[320] = "";
    const int64_t T = 37, N = 4;
    snprintf(name, sizeof name, "SHORT_MAP(cache=%s,T=%lld,N=%lld,backend=%s)", f->label, (long long)T, (long long)N,
             mlaf_backend_name(be));
    if (filtered_out(name)) return;
    kv_call k;
    int ok = kv_make(&k, be, 48, 512, 64, T, 8, MLAF_BF16, f->format, 4242);
    k.conv = f->conv, k.tile = f->tile, k.kpe = f->kpe, k.amax = f->format == MLAF_KV_FP8;
    for (int64_t t = 0; t < T; t++) k.slot[t] = t; /* rows t >= N would name slot t, if read */
    k.N = N;
    ok = ok && kv_alloc(&k);
    kv_args a;
    mlaf_status st = MLAF_ERR_OUT_OF_MEMORY;
    if (ok) {
        kv_args_of(&k, 0, &a);
        st = kv_invoke(ctx, &k, &a);
        if (st == MLAF_OK) st = kv_download(&k);
    }
    if (st != MLAF_OK) {
        ok = 0;
        snprintf(why, sizeof why, "%s: %s", mlaf_status_name(st), mlaf_context_last_error(ctx));
    }
    const size_t es = mlaf_dtype_size(k.cdt);
    for (int64_t t = 0; t < T && ok; t++) {
        int changed = 0, kept = 1;
        const int64_t rb = (k.kpe ? k.C : k.width) * (int64_t)es, kb = k.R * (int64_t)es;
        const size_t at = (size_t)((t / k.bs) * k.s0 + (t % k.bs) * k.s1) * es;
        for (int64_t i = 0; i < rb; i++)
            changed |= ((unsigned char *)k.gcache.body)[at + i] != k.canary[at + i];
        kept = !changed;
        if (k.kpe) {
            const size_t ka = (size_t)((t / k.bs) * k.ks0 + (t % k.bs) * k.ks1) * es;
            for (int64_t i = 0; i < kb; i++)
                if (((unsigned char *)k.gkpe.body)[ka + i] != k.kcanary[ka + i]) changed = 1, kept = 0;
        }
        if (t < N ? !changed : !kept) {
            ok = 0;
            snprintf(why, sizeof why, "token %lld: cache row %s", (long long)t,
                     t < N ? "not written (it has a slot)" : "written (it is past slot_mapping's end)");
        }
        for (int32_t i = 0; i < k.Q && ok; i++)
            if (!isfinite(mlaf_load_f32(k.gq.body, k.dt, t * k.Q + i))) {
                ok = 0;
                snprintf(why, sizeof why, "token %lld: q[%d] not written", (long long)t, (int)i);
            }
        for (int32_t i = 0; i < k.R && ok; i++)
            if (!isfinite(mlaf_load_f32(k.gp.body, k.dt, t * k.R + i))) {
                ok = 0;
                snprintf(why, sizeof why, "token %lld: k_pe[%d] not written", (long long)t, (int)i);
            }
    }
    int32_t ec;
    memcpy(&ec, k.gec.body, 4);
    if (ok && ec != 0) {
        ok = 0;
        snprintf(why, sizeof why, "error_count %d, expected 0 (rows past the end are skipped, not errors)", (int)ec);
    }
    tl_case(ok, name, "%s", why);
    kv_free(&k);
}

/* ---- the suite ------------------------------------------------------------------------- */

static void suite(mlaf_context *ctx, int quick, const char *tag) {
    (void)quick;
    if (tag) return; /* the instruction-set runs: the verified cases only (test_mla_kv_cache_formats) */
    rejections(ctx);
    static const fmt_case plain = {"plain", MLAF_KV_PLAIN, MLAF_FP8_DIV, MLAF_TILE_AMAX, 0};
    short_map(ctx, &plain);
    for (int f = 0; f < NFORMATS; f++) short_map(ctx, &FORMATS[f]);
}

int main(void) { return tl_run_suite("KV_FORMATS", suite); }
