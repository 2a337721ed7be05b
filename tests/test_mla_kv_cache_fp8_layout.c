/*
 * test_mla_kv_cache_fp8_layout.c — the fp8 and fp8_ds_mla records byte by byte (LAYOUT_*), and every written record
 * decoded back, with the same cache bytes from a call without the dense outputs (DECODE /
 * SAME_BYTES), every format.
 * The formats and the direct call: mla_kv_cache_fmt_common.h.
 */
#include "mla_kv_cache_fmt_common.h"

/* ---- 2. the record layouts, by hand ------------------------------------------------------ */

/* C = 512, R = 64 (or R = 0, NoPE: no rope part), Q = 0, bf16, two tokens at position 0 (cos 1,
 * sin 0: the rope part is the latent's, unrotated). The latent's kv part is all 1 (token 0) or
 * all -1 (token 1), so the normalized row is +-w (within a bf16 rounding of 1 - 5e-7): w holds, per tile,
 *   tile 0: 448, 1.5, -2, then 0.25   (amax 448)
 *   tile 1: 224, 1, then 0            (amax 224)
 *   tile 2: 300, then 0.5             (amax 300)
 *   tile 3: 0                         (amax 0: the floors)
 * and the rope part holds r + 1 (token 0) or -(r + 1) (token 1). Token 0 takes slot 3, token 1
 * slot 0 of one block of 4. */
static int layout_inputs(kv_call *k, mlaf_backend be, mlaf_kv_format f, int32_t R) {
    if (!kv_make(k, be, 0, 512, R, 2, 4, MLAF_BF16, f, 5)) return 0;
    k->nb = 1;
    for (int i = 0; i < 512; i++) {
        float w = 0.0f;
        if (i < 128) w = i == 0 ? 448.0f : i == 1 ? 1.5f : i == 2 ? -2.0f : 0.25f;
        else if (i < 256) w = i == 128 ? 224.0f : i == 129 ? 1.0f : 0.0f;
        else if (i < 384) w = i == 256 ? 300.0f : 0.5f;
        k->wkv[i] = w;
    }
    uint16_t *lat = (uint16_t *)k->lat;
    for (int t = 0; t < 2; t++) {
        for (int i = 0; i < 512; i++) lat[t * (512 + R) + i] = mlaf_f32_to_bf16(t ? -1.0f : 1.0f);
        for (int r = 0; r < R; r++) lat[t * (512 + R) + 512 + r] = mlaf_f32_to_bf16((t ? -1.0f : 1.0f) * (float)(r + 1));
        k->pos[t] = 0;
    }
    k->slot[0] = 3, k->slot[1] = 0;
    return 1;
}

typedef struct pin {
    int64_t at;
    uint8_t b;
} pin;

static void check_pins(const char *name, const unsigned char *rec, const pin *pins, int n, char *why, size_t cap,
                       int *ok) {
    for (int i = 0; i < n && *ok; i++)
        if (rec[pins[i].at] != pins[i].b) {
            *ok = 0;
            snprintf(why, cap, "%s: byte %lld = 0x%02x, expected 0x%02x", name, (long long)pins[i].at,
                     rec[pins[i].at], pins[i].b);
        }
}

/* R = 64: the 656-B record; R = 0 (NoPE, GLM-5.3-Flash): 528 B, the e4m3 values and the tile scales
 * alone, at a row stride S of 528 (packed) or 656 (the DeepSeek row some NoPE readers take, its
 * rope bytes [528, 656) the caller's: left as they were). Nothing past byte 527 of a NoPE record
 * is written. */
static void layout_ds_mla(mlaf_context *ctx, mlaf_tile_scale mode, int32_t R, int64_t S) {
    const mlaf_backend be = mlaf_context_backend(ctx);
    static const char *mn[3] = {"amax", "ue8m0", "ue8m0_floor_scaled"};
    const int64_t W = 528 + 2 * R; /* 656 or 528 */
    char name[160], why[256] = "";
    snprintf(name, sizeof name, "LAYOUT_FP8_DS_MLA(C=512,R=%d,%lld bytes,row stride %lld,tile_scale=%s,backend=%s)",
             (int)R, (long long)W, (long long)S, mn[mode], mlaf_backend_name(be));
    if (filtered_out(name)) return;
    kv_call k;
    int ok = layout_inputs(&k, be, MLAF_KV_FP8_DS_MLA, R);
    k.tile = mode;
    ok = ok && k.width == W && k.s1 == W && mlaf_kv_record_bytes(MLAF_KV_FP8_DS_MLA, MLAF_U8, 512, R) == W;
    k.s1 = S, k.s0 = 4 * S;
    ok = ok && kv_alloc(&k);
    if (!ok) snprintf(why, sizeof why, "setup (record %lld bytes)", (long long)k.width);
    kv_args a;
    mlaf_status st = MLAF_OK;
    if (ok) {
        kv_args_of(&k, 0, &a);
        st = kv_invoke(ctx, &k, &a);
        if (st == MLAF_OK) st = kv_download(&k);
        if (st != MLAF_OK) {
            ok = 0;
            snprintf(why, sizeof why, "%s: %s", mlaf_status_name(st), mlaf_context_last_error(ctx));
        }
    }
    /* tile scales, little-endian f32, by mode: tile 2's amax scale is 300 / 448 in f32 */
    static const uint32_t scales[3][4] = {{0x3F800000u, 0x3F000000u, 0x3F2B6DB7u, 0x00800000u},
                                          {0x3F800000u, 0x3F000000u, 0x3F800000u, 0x34800000u},
                                          {0x3F800000u, 0x3F000000u, 0x3F800000u, 0x39000000u}};
    for (int t = 0; t < 2 && ok; t++) {
        const unsigned char *rec = (const unsigned char *)k.gcache.body + (t ? 0 : 3 * S);
        const uint8_t sg = t ? 0x80 : 0x00;
        pin pins[40];
        int n = 0;
        /* tile 0, scale 1: 448 -> 0x7E, 1.5 -> 0x3C, -2 -> 0xC0, 0.25 -> 0x28 */
        pins[n++] = (pin){0, (uint8_t)(sg | 0x7E)};
        pins[n++] = (pin){1, (uint8_t)(sg | 0x3C)};
        pins[n++] = (pin){2, (uint8_t)(0xC0 ^ sg)};
        pins[n++] = (pin){127, (uint8_t)(sg | 0x28)};
        /* tile 1, scale 0.5: 224 -> 448, 1 -> 2 (0x40), 0 -> 0 */
        pins[n++] = (pin){128, (uint8_t)(sg | 0x7E)};
        pins[n++] = (pin){129, (uint8_t)(sg | 0x40)};
        pins[n++] = (pin){200, sg}; /* +-0: a signed zero */
        /* tile 2: amax scale 300/448 -> 300 maps to 448 (0x7E), 0.5 to 0.75 (0x34); power-of-two
         * scale 1 -> 300 rounds to 288 (0x79), 0.5 is 0x30 */
        pins[n++] = (pin){256, (uint8_t)(sg | (mode == MLAF_TILE_AMAX ? 0x7E : 0x79))};
        pins[n++] = (pin){300, (uint8_t)(sg | (mode == MLAF_TILE_AMAX ? 0x34 : 0x30))};
        /* tile 3: zeros */
        pins[n++] = (pin){384, sg};
        pins[n++] = (pin){511, sg};
        for (int s = 0; s < 4; s++)
            for (int b = 0; b < 4; b++) pins[n++] = (pin){512 + 4 * s + b, (uint8_t)(scales[mode][s] >> (8 * b))};
        /* rope bf16 at 528: 1.0 = 0x3F80 (80 3F), 2.0 = 0x4000 (00 40), 64.0 = 0x4280 at 654 */
        if (R == 64) {
            pins[n++] = (pin){528, 0x80};
            pins[n++] = (pin){529, (uint8_t)(0x3F | sg)};
            pins[n++] = (pin){530, 0x00};
            pins[n++] = (pin){531, (uint8_t)(0x40 | sg)};
            pins[n++] = (pin){654, 0x80};
            pins[n++] = (pin){655, (uint8_t)(0x42 | sg)};
        }
        check_pins(t ? "token 1 (slot 0)" : "token 0 (slot 3)", rec, pins, n, why, sizeof why, &ok);
    }
    /* slots 1 and 2 untouched, and the bytes of slots 0 and 3 past the record */
    const unsigned char *body = (const unsigned char *)k.gcache.body;
    if (ok && memcmp(body + S, k.canary + S, (size_t)(2 * S)) != 0) {
        ok = 0;
        snprintf(why, sizeof why, "slots 1, 2 (no token) changed");
    }
    if (ok && S > W &&
        (memcmp(body + W, k.canary + W, (size_t)(S - W)) ||
         memcmp(body + 3 * S + W, k.canary + 3 * S + W, (size_t)(S - W)))) {
        ok = 0;
        snprintf(why, sizeof why, "bytes past the %lld-byte record written", (long long)W);
    }
    tl_case(ok, name, "%s", why);
    kv_free(&k);
}

static void layout_fp8(mlaf_context *ctx, mlaf_fp8_conv conv) {
    const mlaf_backend be = mlaf_context_backend(ctx);
    char name[160], why[256] = "";
    snprintf(name, sizeof name, "LAYOUT_FP8(C=512,R=64,576 bytes,%s,backend=%s)",
             conv == MLAF_FP8_DIV ? "x/scale scale=2" : "x*scale scale=0.5", mlaf_backend_name(be));
    if (filtered_out(name)) return;
    kv_call k;
    int ok = layout_inputs(&k, be, MLAF_KV_FP8, 64);
    k.conv = conv;
    k.scale = conv == MLAF_FP8_DIV ? 2.0f : 0.5f;
    k.amax = 1;
    ok = ok && k.width == 576 && mlaf_kv_record_bytes(MLAF_KV_FP8, MLAF_FP8_E4M3, 512, 64) == 576 && kv_alloc(&k);
    if (!ok) snprintf(why, sizeof why, "setup");
    kv_args a;
    if (ok) {
        kv_args_of(&k, 0, &a);
        mlaf_status st = kv_invoke(ctx, &k, &a);
        if (st == MLAF_OK) st = kv_download(&k);
        if (st != MLAF_OK) {
            ok = 0;
            snprintf(why, sizeof why, "%s: %s", mlaf_status_name(st), mlaf_context_last_error(ctx));
        }
    }
    for (int t = 0; t < 2 && ok; t++) {
        const unsigned char *rec = (const unsigned char *)k.gcache.body + (t ? 0 : 3 * 576);
        const uint8_t sg = t ? 0x80 : 0x00;
        /* values / 2: 448 -> 224 (0x76), 1.5 -> 0.75 (0x34), -2 -> -1 (0xB8), 0.25 -> 0.125
         * (0x20), 300 -> 150 (0x71: 144 and 160 are the neighbours, 144 = 0x71 nearer), 0 -> +-0
         * (token 1's -0 is 0x80), rope
         * 1 -> 0.5 (0x30) at 512, 2 -> 1 (0x38), 64 -> 32 (0x60) at 575 */
        const pin pins[] = {{0, (uint8_t)(sg | 0x76)},   {1, (uint8_t)(sg | 0x34)},   {2, (uint8_t)(0xB8 ^ sg)},
                            {3, (uint8_t)(sg | 0x20)},   {256, (uint8_t)(sg | 0x71)}, {384, sg},
                            {512, (uint8_t)(sg | 0x30)}, {513, (uint8_t)(sg | 0x38)}, {575, (uint8_t)(sg | 0x60)}};
        check_pins(t ? "token 1 (slot 0)" : "token 0 (slot 3)", rec, pins, (int)(sizeof pins / sizeof pins[0]), why,
                   sizeof why, &ok);
    }
    float amax;
    memcpy(&amax, k.gamax.body, sizeof amax);
    if (ok && amax != 448.0f) {
        ok = 0;
        snprintf(why, sizeof why, "amax_out = %.9g, expected 448", amax);
    }
    tl_case(ok, name, "%s", why);
    kv_free(&k);
}

/* ---- 3. decode back, and the same bytes without the dense outputs -------------------------- */

/* Every written record of the first call decoded against the dense row (k->gk, k->gp). */
static int decode_rows(const kv_call *k, char *why, size_t cap) {
    const int32_t C = k->C, R = k->R;
    for (int64_t t = 0; t < k->N; t++) {
        const int64_t slot = k->slot[t];
        if (slot < 0) continue;
        for (int64_t i = 0; i < (int64_t)C + R; i++) {
            const float x = i < C ? mlaf_load_f32(k->gk.body, k->dt, t * C + i)
                                  : mlaf_load_f32(k->gp.body, k->dt, t * R + (i - C));
            if (k->format == MLAF_KV_FP8_DS_MLA && i >= C) { /* rope: the dense bf16 bits */
                const unsigned char *p = rec_byte(k, &k->gcache, &k->gkpe, slot, C + C / 32 + 2 * (i - C));
                const uint16_t got = (uint16_t)(p[0] | p[1] << 8), want = mlaf_f32_to_bf16(x);
                if (got != want) {
                    snprintf(why, cap, "token %lld rope[%lld]: bf16 0x%04x, dense 0x%04x", (long long)t,
                             (long long)(i - C), got, want);
                    return 0;
                }
                continue;
            }
            float s = k->scale;
            int mul = k->format == MLAF_KV_FP8 && k->conv == MLAF_FP8_MUL;
            if (k->format == MLAF_KV_FP8_DS_MLA) {
                const unsigned char *p = rec_byte(k, &k->gcache, &k->gkpe, slot, C + 4 * (i / 128));
                s = mlaf_bits_f32((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
            }
            const double y = mul ? (double)x * s : (double)x / s; /* the exact quantized value */
            const uint8_t b = *rec_byte(k, &k->gcache, &k->gkpe, slot, i);
            if (fabs(y) >= 464.0) { /* saturated */
                if (b != (x < 0 ? 0xFE : 0x7E)) {
                    snprintf(why, cap, "token %lld value %lld: x = %.9g saturates, byte 0x%02x", (long long)t,
                             (long long)i, x, b);
                    return 0;
                }
                continue;
            }
            const double d = mlaf_e4m3_to_f32(b);
            if (!(fabs(d - y) <= e4m3_bound(y))) {
                snprintf(why, cap,
                         "token %lld value %lld: x = %.9g, scale %.9g: byte 0x%02x decodes to %.9g, beyond half an "
                         "e4m3 ulp of %.9g",
                         (long long)t, (long long)i, x, s, b, mul ? d / s : d * s, x);
                return 0;
            }
        }
    }
    return 1;
}

static void decode_and_same_bytes(mlaf_context *ctx, const fmt_case *f, mlaf_dtype dt, int64_t T, uint64_t seed,
                                  int32_t R) {
    const mlaf_backend be = mlaf_context_backend(ctx);
    char name[200], why[320] = "";
    snprintf(name, sizeof name, "DECODE_SAME_BYTES(cache=%s,dtype=%s,T=%lld,R=%d,backend=%s)", f->label,
             mlaf_dtype_name(dt), (long long)T, (int)R, mlaf_backend_name(be));
    if (filtered_out(name)) return;
    kv_call k;
    const int32_t Q = f->format == MLAF_KV_FP8 ? 0 : 96;
    int ok = kv_make(&k, be, Q, 512, R, T, 16, dt, f->format, seed);
    k.conv = f->conv, k.tile = f->tile, k.kpe = f->kpe;
    k.amax = f->format == MLAF_KV_FP8;
    /* scale 0.5 (DIV) or 2 (MUL): the loud rows' rope values (~N(0, 40)) reach e4m3's top, and a
     * few saturate */
    k.scale = f->conv == MLAF_FP8_MUL ? 2.0f : 0.5f;
    ok = ok && kv_alloc(&k);
    kv_args a, b;
    mlaf_status st = MLAF_ERR_OUT_OF_MEMORY;
    if (ok) {
        kv_args_of(&k, 0, &a);
        st = kv_invoke(ctx, &k, &a);
        kv_args_of(&k, 1, &b);
        b.use_k = b.use_pe = 0;
        if (st == MLAF_OK) st = kv_invoke(ctx, &k, &b);
        if (st == MLAF_OK) st = kv_download(&k);
    }
    if (st != MLAF_OK) {
        ok = 0;
        snprintf(why, sizeof why, "%s: %s", mlaf_status_name(st), mlaf_context_last_error(ctx));
    }
    if (ok && f->format != MLAF_KV_PLAIN) ok = decode_rows(&k, why, sizeof why);
    if (ok && (memcmp(k.gcache.body, k.gcache2.body, cache_bytes(&k)) != 0 ||
               memcmp(k.gkpe.body, k.gkpe2.body, kpe_bytes(&k)) != 0 || memcmp(k.gamax.body, k.gamax2.body, 4) != 0)) {
        ok = 0;
        snprintf(why, sizeof why, "the cache bytes (or amax_out) differ without the dense outputs");
    }
    if (ok && !(mlaf_gbuf_guards_ok(&k.gcache) && mlaf_gbuf_guards_ok(&k.gcache2) && mlaf_gbuf_guards_ok(&k.gkpe))) {
        ok = 0;
        snprintf(why, sizeof why, "a guard zone was written");
    }
    tl_case(ok, name, "%s", why);
    kv_free(&k);
}

/* ---- the suite ------------------------------------------------------------------------- */

static void suite(mlaf_context *ctx, int quick, const char *tag) {
    if (tag) return; /* the instruction-set runs: the verified cases only (test_mla_kv_cache_formats) */
    for (int m = 0; m < 3; m++) layout_ds_mla(ctx, (mlaf_tile_scale)m, 64, 656);
    for (int m = 0; m < 3; m++) layout_ds_mla(ctx, (mlaf_tile_scale)m, 0, 528);
    layout_ds_mla(ctx, MLAF_TILE_UE8M0, 0, 656);
    layout_fp8(ctx, MLAF_FP8_DIV);
    layout_fp8(ctx, MLAF_FP8_MUL);
    static const fmt_case plain = {"plain", MLAF_KV_PLAIN, MLAF_FP8_DIV, MLAF_TILE_AMAX, 0};
    decode_and_same_bytes(ctx, &plain, MLAF_F16, 77, 31, 64);
    for (int f = 0; f < NFORMATS; f++) {
        const int ds = FORMATS[f].format == MLAF_KV_FP8_DS_MLA;
        decode_and_same_bytes(ctx, &FORMATS[f], ds || f % 2 ? MLAF_BF16 : MLAF_F16, 203 + f, 40 + (uint64_t)f, 64);
        if (!quick && !ds) decode_and_same_bytes(ctx, &FORMATS[f], MLAF_F32, 64, 60 + (uint64_t)f, 64);
        /* NoPE (R = 0): fp8 at C bytes a token, fp8_ds_mla at 528 */
        if (!FORMATS[f].kpe && f % 2 == 1) decode_and_same_bytes(ctx, &FORMATS[f], MLAF_BF16, 131, 80 + (uint64_t)f, 0);
    }
}

int main(void) { return tl_run_suite("KV_FORMATS", suite); }
