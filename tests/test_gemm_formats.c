/*
 * test_gemm_formats.c — the GEMM-input format table (src/gemm_format.h, docs/gemm_formats.md):
 *   FORMAT_TABLE   every format has its row, a CPU writer and an oracle encoder; names distinct;
 *   LAYOUT         each layout's byte offsets pinned on a small example (T = 3, K = 640) with
 *                  offsets and bytes written out by hand here: the oracle's addressing, then the
 *                  CPU writer's bytes (scales, values, the packed layout's zero bytes, the
 *                  MN-major padding rows left alone) on every instruction-set table;
 *   WRITER         the CPU writers against the float64 encoder on random rows with zeros, NaN,
 *                  +-inf, subnormals and huge values, every format x rounding x dtype x table,
 *                  bit for bit, and every unsaturated value within half an e4m3 step;
 *   VALIDATE       mlaf_vcheck_gemm_out's rejections name the argument; the shape helper.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../src/cpu/gemm_writers.h"
#include "../src/gemm_format.h"
#include "../src/ref/verify.h"
#include "gemm_layout.h"
#include "testlib.h"

typedef struct {
    const char *name;
    const mlaf_norm_kern *k;
} table;

static int tables(table *t) {
    int n = 0;
    t[n++] = (table){"scalar", &mlaf_norm_kern_scalar};
#if defined(MLAF_HAVE_X86_PATHS)
    if (mlaf_cpu_isa_supported(MLAF_CPU_ISA_AVX2)) t[n++] = (table){"avx2", &mlaf_norm_kern_avx2};
    if (mlaf_cpu_isa_supported(MLAF_CPU_ISA_AVX512)) t[n++] = (table){"avx512", &mlaf_norm_kern_avx512};
#endif
    return n;
}

static void format_table(void) {
    int rows = 1;
    for (int f = 1; f < MLAF_GEMM_FORMAT_COUNT_; f++) {
        const mlaf_gemm_format_info *r = &mlaf_gemm_formats[f];
        rows = rows && r->name && r->summary && r->readers && (r->group == 128 || r->group == 32) && r->scale_modes &&
               (r->pack == 1 || r->pack == 4) && !strcmp(mlaf_gemm_format_name((mlaf_gemm_format)f), r->name) &&
               mlaf_gemm_format_group((mlaf_gemm_format)f) == r->group;
        for (int g = 0; g < f; g++) rows = rows && strcmp(mlaf_gemm_formats[g].name, r->name);
    }
    const int cpu = mlaf_cpu_gemm_writer_count(), ref = mlaf_ref_gemm_encoder_count();
    tl_case(rows && cpu == MLAF_GEMM_FORMAT_COUNT_ - 1 && ref == MLAF_GEMM_FORMAT_COUNT_, "FORMAT_TABLE(gemm)",
            "%d formats: rows %s, %d CPU writers (all but none), %d oracle encoders", MLAF_GEMM_FORMAT_COUNT_ - 1,
            rows ? "complete" : "INCOMPLETE", cpu, ref);
}

/* ---- LAYOUT: the oracle's offsets and the CPU writer's bytes on the hand-written example ----- */
static void layout(void) {
    mlaf_context *ctx = tl_context(MLAF_BACKEND_CPU);
    if (!ctx) return;
    table tb[4];
    const int nt = tables(tb);
    for (int li = 0; li < GL_LAYOUTS; li++) {
        const gl_layout *L = &gl_layouts[li];
        char name[128];
        /* the oracle's addressing, against the hand-written offsets */
        int off_ok = 1;
        for (int t = 0; t < GL_T; t++)
            for (int j = 0; j < L->groups; j++)
                off_ok = off_ok && mlaf_ref_gemm_scale_offset(L->format, t, j, L->ld) == L->off[t][j];
        snprintf(name, sizeof name, "LAYOUT(format=%s,offsets=oracle)", mlaf_gemm_format_name(L->format));
        tl_case(off_ok, name, "offsets %s the hand-written ones", off_ok ? "match" : "DIFFER from");
        for (int ti = 0; ti < nt; ti++)
            for (int si = 0; si < MLAF_GEMM_SCALE_COUNT_; si++) {
                if (!((mlaf_gemm_formats[L->format].scale_modes >> si) & 1u)) continue;
                gl_buffers b;
                gl_fill(&b, L);
                mlaf_tensor td, ts;
                mlaf_gemm_out q = gl_out(L, (mlaf_gemm_scale)si, &b, &td, &ts);
                mlaf_gemm_out_job j;
                mlaf_status st = mlaf_vcheck_gemm_out(ctx, &q, "q", GL_T, GL_K, &j);
                snprintf(name, sizeof name, "LAYOUT(format=%s,scale=%s,table=%s,writer=cpu)",
                         mlaf_gemm_format_name(L->format), mlaf_gemm_scale_name((mlaf_gemm_scale)si), tb[ti].name);
                if (st != MLAF_OK) {
                    tl_case(0, name, "%s: %s", mlaf_status_name(st), mlaf_context_last_error(ctx));
                    continue;
                }
                float y[GL_K];
                for (int t = 0; t < GL_T; t++) {
                    gl_row(L, GL_WRITER, t, y);
                    mlaf_cpu_gemm_writer_of(L->format)(tb[ti].k, &j, MLAF_BF16, t, L->groups, 0, GL_K, y);
                }
                char why[256];
                const int ok = gl_judge(L, (mlaf_gemm_scale)si, &b, GL_WRITER, why, sizeof why);
                tl_case(ok, name, "%s", why);
            }
    }
    mlaf_context_free(ctx);
}

/* ---- WRITER: the CPU writers against the encoder on random rows -------------------------- */
static float special_value(mlaf_rng *r, mlaf_dtype dt) {
    switch (mlaf_rng_u64(r) % 9) {
    case 0: return NAN;
    case 1: return INFINITY;
    case 2: return -INFINITY;
    case 3: return 0.0f;
    case 4: return -0.0f;
    case 5: return dt == MLAF_F16 ? 6e-8f : 3e-39f; /* subnormal in the dtype */
    case 6: return dt == MLAF_F16 ? 65504.0f : 3e38f;
    case 7: return dt == MLAF_F16 ? 1e-4f : 1e-30f;
    default: return 448.0f * (float)(mlaf_rng_uniform(r) - 0.5);
    }
}

static void writers(void) {
    mlaf_context *ctx = tl_context(MLAF_BACKEND_CPU);
    if (!ctx) return;
    table tb[4];
    const int nt = tables(tb);
    static const mlaf_dtype dts[3] = {MLAF_F32, MLAF_F16, MLAF_BF16};
    enum { T = 24, K = 1536 };
    float *v = malloc(sizeof(float) * T * K), *x = malloc(sizeof(float) * K), *sf = malloc(sizeof(float) * K);
    uint8_t *data = malloc((size_t)T * K), *rd = malloc(K), *sb = malloc(K);
    uint8_t *scales = malloc(4 * (size_t)(K / 32) * 32); /* the largest scales buffer, 16-byte aligned */
    for (int f = 1; f < MLAF_GEMM_FORMAT_COUNT_; f++)
        for (int si = 0; si < MLAF_GEMM_SCALE_COUNT_; si++) {
            const mlaf_gemm_format_info *row = &mlaf_gemm_formats[f];
            if (!((row->scale_modes >> si) & 1u)) continue;
            for (int di = 0; di < 3; di++)
                for (int ti = 0; ti < nt; ti++) {
                    mlaf_rng rng;
                    mlaf_rng_seed(&rng, 1000u * (unsigned)f + 100u * (unsigned)si + 10u * (unsigned)di);
                    const mlaf_dtype dt = dts[di];
                    for (int64_t i = 0; i < (int64_t)T * K; i++) { /* group magnitudes 2^-40 .. 2^40 */
                        const int64_t grp = i / 32;
                        /* groups of 2^-118: their amax / 448 is subnormal (f32, bf16) */
                        const double mag = ldexp(1.0, grp % 31 == 11 ? -118 : (int)(grp * 7 % 81) - 40);
                        v[i] = (float)(mlaf_rng_normal(&rng) * mag);
                        if (mlaf_rng_u64(&rng) % 97 == 0) v[i] = special_value(&rng, dt);
                        if (grp % 23 == 5) v[i] = 0.0f;               /* all-zero groups */
                        if (grp % 29 == 7) v[i] = (float)(i % 2) * NAN; /* all-NaN groups (0 * NaN: NaN) */
                        v[i] = (float)mlaf_round_to(v[i], dt);
                    }
                    int64_t shape[2], ld;
                    mlaf_dtype sdt;
                    mlaf_gemm_scales_shape((mlaf_gemm_format)f, T, K, &sdt, shape, &ld);
                    mlaf_tensor td = mlaf_tensor_2d(data, MLAF_U8, T, K, K);
                    mlaf_tensor ts = mlaf_tensor_2d(scales, sdt, shape[0], shape[1], ld);
                    const mlaf_gemm_out q = {(mlaf_gemm_format)f, (mlaf_gemm_scale)si, &td, &ts, si == 1 && f == 1 ? 1e-4f : 0.0f};
                    mlaf_gemm_out_job j;
                    memset(data, 0xA5, (size_t)T * K);
                    memset(scales, 0xA5, 4 * (size_t)(K / 32) * 32);
                    mlaf_status st = mlaf_vcheck_gemm_out(ctx, &q, "q", T, K, &j);
                    char name[160];
                    snprintf(name, sizeof name, "WRITER(format=%s,scale=%s,dtype=%s,table=%s)", row->name,
                             mlaf_gemm_scale_name((mlaf_gemm_scale)si), mlaf_dtype_name(dt), tb[ti].name);
                    if (st != MLAF_OK) {
                        tl_case(0, name, "%s", mlaf_context_last_error(ctx));
                        continue;
                    }
                    const int64_t G = K / row->group;
                    for (int t = 0; t < T; t++) /* in two pieces: the writer takes any group-aligned run */
                        for (int64_t a = 0; a < K; a += 512)
                            mlaf_cpu_gemm_writer_of((mlaf_gemm_format)f)(tb[ti].k, &j, dt, t, G, a, 512, v + (int64_t)t * K + a);
                    const mlaf_gemm_encoding e = {(mlaf_gemm_format)f, (mlaf_gemm_scale)si, j.eps};
                    int64_t bad = 0, far = 0, judged = 0;
                    char why[200] = "";
                    double worst = 0.0;
                    for (int t = 0; t < T; t++) {
                        mlaf_ref_gemm_encode_row(&e, v + (int64_t)t * K, K, rd, sf, sb);
                        for (int64_t i = 0; i < K; i++) {
                            const uint8_t got = data[t * K + i];
                            if (got != rd[i] && !bad++)
                                snprintf(why, sizeof why, "value byte t=%d i=%lld: 0x%02x, expected 0x%02x", t,
                                         (long long)i, got, rd[i]);
                            double ratio;
                            const int c = mlaf_ref_fp8_decode_check(got, v[(int64_t)t * K + i], sf[i / row->group],
                                                                    MLAF_FP8_DIV, &ratio);
                            judged += c >= 0;
                            far += c == 0;
                            if (c >= 0 && ratio > worst) worst = ratio;
                        }
                        for (int64_t g = 0; g < G; g++) {
                            const int64_t o = mlaf_ref_gemm_scale_offset((mlaf_gemm_format)f, t, g, ld);
                            const int f32 = row->scale_dt == MLAF_F32;
                            uint8_t want[4];
                            if (f32) memcpy(want, &sf[g], 4);
                            else want[0] = sb[g];
                            if (memcmp(scales + o, want, f32 ? 4 : 1) && !bad++)
                                snprintf(why, sizeof why, "scale t=%d group %lld: byte 0x%02x at %lld, expected 0x%02x", t,
                                         (long long)g, scales[o], (long long)o, want[0]);
                        }
                    }
                    tl_case(bad == 0 && far == 0, name,
                            "%lld bytes differ from the encoder%s%s; %lld of %lld judged values beyond half an e4m3 "
                            "step (worst %.3g of the bound)",
                            (long long)bad, bad ? ", first: " : "", why, (long long)far, (long long)judged, worst);
                }
        }
    free(v), free(x), free(sf), free(data), free(rd), free(sb), free(scales);
    mlaf_context_free(ctx);
}

/* ---- VALIDATE: the rejections and the shape helper --------------------------------------- */
static void expect_reject(mlaf_context *ctx, const char *what, const mlaf_gemm_out *q, int64_t T, int64_t K,
                          mlaf_status want, const char *needle) {
    mlaf_gemm_out_job j;
    const mlaf_status st = mlaf_vcheck_gemm_out(ctx, q, "q", T, K, &j);
    const char *msg = mlaf_context_last_error(ctx);
    char name[128];
    snprintf(name, sizeof name, "VALIDATE(%s)", what);
    tl_case(st == want && strstr(msg, needle) != NULL, name, "%s (want %s): %s", mlaf_status_name(st),
            mlaf_status_name(want), msg);
}

static void validate(void) {
    mlaf_context *ctx = tl_context(MLAF_BACKEND_CPU);
    if (!ctx) return;
    enum { T = 5, K = 1024 };
    static _Alignas(16) uint8_t data[T * K + 64], scales[4096 + 64];
    mlaf_tensor td = mlaf_tensor_2d(data, MLAF_FP8_E4M3, T, K, K);
    mlaf_tensor rm = mlaf_tensor_2d(scales, MLAF_F32, T, K / 128, K / 128);
    mlaf_tensor mn = mlaf_tensor_2d(scales, MLAF_F32, K / 128, T, 8);
    mlaf_tensor pk = mlaf_tensor_2d(scales, MLAF_I32, 2, T, 8);
    mlaf_tensor mx = mlaf_tensor_2d(scales, MLAF_U8, T, K / 32, K / 32);
    mlaf_gemm_out q = {MLAF_GEMM_FP8_1X128, MLAF_GEMM_SCALE_F32, &td, &rm, 0.0f};
    mlaf_gemm_out_job j;
    tl_case(mlaf_vcheck_gemm_out(ctx, &q, "q", T, K, &j) == MLAF_OK && j.eps == 1e-10f && j.group == 128,
            "VALIDATE(valid fp8_1x128, eps 0 = 1e-10)", "%s", mlaf_context_last_error(ctx));
    q.format = (mlaf_gemm_format)9;
    expect_reject(ctx, "unknown format", &q, T, K, MLAF_ERR_INVALID_ARGUMENT, "q.format = 9, expected 0 (none), fp8_1x128");
    q.format = MLAF_GEMM_NONE;
    expect_reject(ctx, "none with tensors", &q, T, K, MLAF_ERR_INVALID_ARGUMENT, "q.data is given");
    q.format = MLAF_GEMM_FP8_1X128, q.scale = MLAF_GEMM_SCALE_MX_FLOOR;
    expect_reject(ctx, "rounding of another format", &q, T, K, MLAF_ERR_INVALID_ARGUMENT,
                  "q.scale = 2 (mx_floor), expected 0 (f32) or 1 (ue8m0) for format fp8_1x128");
    q.scale = MLAF_GEMM_SCALE_F32, q.eps = 1e-31f;
    expect_reject(ctx, "eps", &q, T, K, MLAF_ERR_INVALID_ARGUMENT, "q.eps = 1e-31");
    q.eps = NAN;
    expect_reject(ctx, "eps NaN", &q, T, K, MLAF_ERR_INVALID_ARGUMENT, "q.eps = nan");
    q.eps = 0.0f;
    expect_reject(ctx, "K not a multiple of the group", &q, T, 1000, MLAF_ERR_SHAPE,
                  "q: K = 1000 values a row, expected a multiple of 128 for format fp8_1x128");
    rm.dtype = MLAF_F16;
    expect_reject(ctx, "scales dtype", &q, T, K, MLAF_ERR_DTYPE, "q.scales.dtype = f16, expected f32");
    rm.dtype = MLAF_F32, rm.shape[1] = 7;
    expect_reject(ctx, "scales shape", &q, T, K, MLAF_ERR_SHAPE, "q.scales.shape[1] = 7, expected K / 128 = 8");
    rm.shape[1] = 8, td.shape[1] = 512;
    expect_reject(ctx, "data shape", &q, T, K, MLAF_ERR_SHAPE, "q.data.shape[1] = 512, expected K = 1024");
    td.shape[1] = K, td.dtype = MLAF_BF16;
    expect_reject(ctx, "data dtype", &q, T, K, MLAF_ERR_DTYPE, "q.data.dtype = bf16");
    td.dtype = MLAF_U8;
    q.format = MLAF_GEMM_FP8_1X128_MN, q.scales = &mn, mn.stride[0] = 6;
    expect_reject(ctx, "mn leading stride", &q, T, K, MLAF_ERR_STRIDE,
                  "q.scales.stride[0] = 6, expected a multiple of 4 and >= round_up(tokens, 4) = 8");
    mn.stride[0] = 8, mn.data = scales + 4;
    expect_reject(ctx, "mn alignment", &q, T, K, MLAF_ERR_STRIDE, "expected 16-byte aligned for format fp8_1x128_mn");
    mn.data = scales;
    tl_case(mlaf_vcheck_gemm_out(ctx, &q, "q", T, K, &j) == MLAF_OK && j.scale_ld == 8, "VALIDATE(valid fp8_1x128_mn)",
            "%s", mlaf_context_last_error(ctx));
    q.format = MLAF_GEMM_FP8_1X128_UE8M0, q.scales = &pk;
    expect_reject(ctx, "packed takes ue8m0 only", &q, T, K, MLAF_ERR_INVALID_ARGUMENT, "expected 1 (ue8m0) for format");
    q.scale = MLAF_GEMM_SCALE_UE8M0, pk.shape[0] = 1;
    expect_reject(ctx, "packed shape", &q, T, K, MLAF_ERR_SHAPE, "q.scales.shape[0] = 1, expected ceil(K / 512) = 2");
    pk.shape[0] = 2;
    tl_case(mlaf_vcheck_gemm_out(ctx, &q, "q", T, K, &j) == MLAF_OK, "VALIDATE(valid fp8_1x128_ue8m0)", "%s",
            mlaf_context_last_error(ctx));
    q.format = MLAF_GEMM_MXFP8, q.scales = &mx;
    expect_reject(ctx, "mxfp8 takes mx roundings", &q, T, K, MLAF_ERR_INVALID_ARGUMENT,
                  "expected 2 (mx_floor) or 3 (mx_ceil) for format mxfp8");
    q.scale = MLAF_GEMM_SCALE_MX_CEIL, mx.data = data;
    expect_reject(ctx, "scales overlap data", &q, T, K, MLAF_ERR_OVERLAP, "q.scales overlaps q.data");
    mx.data = scales;
    tl_case(mlaf_vcheck_gemm_out(ctx, &q, "q", T, K, &j) == MLAF_OK && j.group == 32, "VALIDATE(valid mxfp8)", "%s",
            mlaf_context_last_error(ctx));
    /* column-major without the TMA rules: any ld >= T (below: the rows of the view overlap), any
     * 4-byte alignment */
    q.format = MLAF_GEMM_FP8_1X128_CM, q.scale = MLAF_GEMM_SCALE_F32, q.scales = &mn, mn.stride[0] = T - 1;
    expect_reject(ctx, "cm leading stride below T", &q, T, K, MLAF_ERR_STRIDE,
                  "q.scales.stride[0] = 4, expected >= the row width 5");
    mn.stride[0] = T, mn.data = scales + 4;
    tl_case(mlaf_vcheck_gemm_out(ctx, &q, "q", T, K, &j) == MLAF_OK && j.scale_ld == T,
            "VALIDATE(valid fp8_1x128_cm, ld = T = 5, 4-byte aligned)", "%s", mlaf_context_last_error(ctx));
    mn.data = scales;
    /* the shape helper: dtype, shape, least leading stride */
    mlaf_dtype d;
    int64_t sh[2], ld;
    int ok = mlaf_gemm_scales_shape(MLAF_GEMM_FP8_1X128_UE8M0, 5, 640, &d, sh, &ld) == MLAF_OK && d == MLAF_I32 &&
             sh[0] == 2 && sh[1] == 5 && ld == 8;
    ok = ok && mlaf_gemm_scales_shape(MLAF_GEMM_FP8_1X128_MN, 4, 256, &d, sh, &ld) == MLAF_OK && d == MLAF_F32 &&
         sh[0] == 2 && sh[1] == 4 && ld == 4;
    ok = ok && mlaf_gemm_scales_shape(MLAF_GEMM_MXFP8, 3, 96, &d, sh, &ld) == MLAF_OK && d == MLAF_U8 && sh[0] == 3 &&
         sh[1] == 3 && ld == 3;
    ok = ok && mlaf_gemm_scales_shape(MLAF_GEMM_FP8_1X128, 3, 100, &d, sh, &ld) == MLAF_ERR_INVALID_ARGUMENT &&
         mlaf_gemm_scales_shape(MLAF_GEMM_NONE, 3, 128, &d, sh, &ld) == MLAF_ERR_INVALID_ARGUMENT;
    ok = ok && !strcmp(mlaf_gemm_scale_name(MLAF_GEMM_SCALE_MX_CEIL), "mx_ceil") &&
         !strcmp(mlaf_gemm_format_name((mlaf_gemm_format)77), "unknown") && mlaf_gemm_format_group(MLAF_GEMM_MXFP8) == 32;
    tl_case(ok, "VALIDATE(mlaf_gemm_scales_shape and names)", "shapes, strides and names as the header says");
    mlaf_context_free(ctx);
}

int main(void) {
    format_table();
    layout();
    writers();
    validate();
    return tl_finish();
}
