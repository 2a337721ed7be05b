/*
 * gemm_layout.c — the hand-written layout example (gemm_layout.h). Every offset below is written
 * out, not computed from a formula of the library or the oracle.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../src/fp8.h"
#include "../src/half.h"
#include "gemm_layout.h"
#include "ref/verify.h"

const gl_layout gl_layouts[GL_LAYOUTS] = {
    /* fp8_1x128, f32 [3, 5] row-major, ld 7: 4 (7 t + j) */
    {MLAF_GEMM_FP8_1X128, 5, 7,
     {{0, 4, 8, 12, 16}, {28, 32, 36, 40, 44}, {56, 60, 64, 68, 72}},
     {-1},
     {{20, 28}, {48, 56}, {76, 84}, {-1, -1}},
     84},
    /* fp8_1x128_mn, f32 [5, 3] token-contiguous, ld 8: 4 (8 j + t); rows t = 3 .. 7 padding */
    {MLAF_GEMM_FP8_1X128_MN, 5, 8,
     {{0, 32, 64, 96, 128}, {4, 36, 68, 100, 132}, {8, 40, 72, 104, 136}},
     {-1},
     {{12, 32}, {44, 64}, {76, 96}, {108, 128}, {140, 160}, {-1, -1}},
     160},
    /* fp8_1x128_ue8m0, i32 [2, 3], ld 4: byte j mod 4 of element (j / 4, t), at 4 (4 (j / 4) + t) + j mod 4;
     * groups 5 .. 7 of each row's second element are zero bytes; t = 3 padding */
    {MLAF_GEMM_FP8_1X128_UE8M0, 5, 4,
     {{0, 1, 2, 3, 16}, {4, 5, 6, 7, 20}, {8, 9, 10, 11, 24}},
     {17, 18, 19, 21, 22, 23, 25, 26, 27, -1},
     {{12, 16}, {28, 32}, {-1, -1}},
     32},
    /* mxfp8, u8 [3, 20] row-major, ld 21: 21 t + j */
    {MLAF_GEMM_MXFP8, 20, 21,
     {{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19},
      {21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40},
      {42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61}},
     {-1},
     {{20, 21}, {41, 42}, {62, 63}, {-1, -1}},
     63},
    /* fp8_1x128_cm, f32 [5, 3] token-contiguous, ld 3 = T (no padding): 4 (3 j + t) */
    {MLAF_GEMM_FP8_1X128_CM, 5, 3,
     {{0, 12, 24, 36, 48}, {4, 16, 28, 40, 52}, {8, 20, 32, 44, 56}},
     {-1},
     {{-1, -1}},
     60},
};

void gl_fill(gl_buffers *b, const gl_layout *L) {
    (void)L;
    memset(b->data, 0xA5, sizeof b->data);
    memset(b->scales, 0xA5, sizeof b->scales);
}

mlaf_gemm_out gl_out_at(const gl_layout *L, mlaf_gemm_scale s, void *data, void *scales, mlaf_tensor *td,
                        mlaf_tensor *ts) {
    *td = mlaf_tensor_2d(data, MLAF_FP8_E4M3, GL_T, GL_K, GL_K);
    switch (L->format) {
    case MLAF_GEMM_FP8_1X128: *ts = mlaf_tensor_2d(scales, MLAF_F32, GL_T, 5, 7); break;
    case MLAF_GEMM_FP8_1X128_MN: *ts = mlaf_tensor_2d(scales, MLAF_F32, 5, GL_T, 8); break;
    case MLAF_GEMM_FP8_1X128_UE8M0: *ts = mlaf_tensor_2d(scales, MLAF_I32, 2, GL_T, 4); break;
    case MLAF_GEMM_FP8_1X128_CM: *ts = mlaf_tensor_2d(scales, MLAF_F32, 5, GL_T, 3); break;
    default: *ts = mlaf_tensor_2d(scales, MLAF_U8, GL_T, 20, 21); break;
    }
    mlaf_gemm_out q = {L->format, s, td, ts, 0.0f};
    return q;
}

mlaf_gemm_out gl_out(const gl_layout *L, mlaf_gemm_scale s, gl_buffers *b, mlaf_tensor *td, mlaf_tensor *ts) {
    return gl_out_at(L, s, b->data, b->scales, td, ts);
}

static int group_size(const gl_layout *L) { return GL_K / L->groups; }

/* k, the sign and whether the group is zero, for group j of row t in example ex */
static int group_k(int ex, int t, int j) { return ex == GL_WRITER ? j % 6 - t - 2 : j % 6 - 2; }
static int group_zero(int ex, int t, int j) { return ex == GL_WRITER ? t == 1 && j == 2 : t == 1; }
static int row_sign(int ex, int t) { return ex == GL_OP && t == 2 ? -1 : 1; }

void gl_row(const gl_layout *L, int ex, int t, float *y) {
    const int g = group_size(L);
    memset(y, 0, sizeof(float) * GL_K);
    for (int j = 0; j < L->groups; j++) {
        if (group_zero(ex, t, j)) continue;
        const int k = group_k(ex, t, j);
        y[j * g] = ldexpf(448.0f, k), y[j * g + 1] = -ldexpf(1.0f, k), y[j * g + 2] = ldexpf(1.5f, k);
    }
}

int gl_judge(const gl_layout *L, mlaf_gemm_scale s, const gl_buffers *b, int ex, char *why, size_t cap) {
    const int g = group_size(L);
    const int f32 = L->format == MLAF_GEMM_FP8_1X128 || L->format == MLAF_GEMM_FP8_1X128_MN ||
                    L->format == MLAF_GEMM_FP8_1X128_CM;
    for (int t = 0; t < GL_T; t++)
        for (int j = 0; j < L->groups; j++) {
            const int zero = group_zero(ex, t, j), sg = row_sign(ex, t);
            /* GL_OP's zero row is 0 times the weights: -0 where the weight is negative (0x80); its row
             * of sign -1 makes the zero weights -0 */
            const uint8_t want_v[3] = {zero ? 0x00 : sg > 0 ? 0x7E : 0xFE,
                                       zero ? (ex == GL_OP ? 0x80 : 0x00) : sg > 0 ? 0xB8 : 0x38,
                                       zero ? 0x00 : sg > 0 ? 0x3C : 0xBC};
            for (int i = 0; i < g; i++) {
                const uint8_t got = b->data[t * GL_K + j * g + i], want = i < 3 ? want_v[i] : sg < 0 ? 0x80 : 0x00;
                if (got != want) {
                    snprintf(why, cap, "value byte of row %d, group %d, value %d: 0x%02x, expected 0x%02x", t, j, i, got,
                             want);
                    return 0;
                }
            }
            /* the scale: 2^k, or the rounding's floor for a zero group */
            float sv;
            uint8_t sb;
            if (!zero) sv = ldexpf(1.0f, group_k(ex, t, j)), sb = (uint8_t)(group_k(ex, t, j) + 127);
            else if (s == MLAF_GEMM_SCALE_F32) sv = 1e-10f / 448.0f, sb = 0;
            else if (s == MLAF_GEMM_SCALE_UE8M0) sv = ldexpf(1.0f, -42), sb = 0x55;
            else sv = ldexpf(1.0f, -127), sb = 0x00;
            uint8_t want[4];
            memcpy(want, &sv, 4);
            if (!f32) want[0] = sb;
            const int64_t o = L->off[t][j];
            if (memcmp(b->scales + o, want, f32 ? 4 : 1)) {
                snprintf(why, cap, "scale of row %d, group %d at byte %lld: 0x%02x.., expected 0x%02x..", t, j,
                         (long long)o, b->scales[o], want[0]);
                return 0;
            }
        }
    for (int z = 0; L->zero[z] >= 0; z++)
        if (b->scales[L->zero[z]] != 0) {
            snprintf(why, cap, "scales byte %d (past the last group of its i32): 0x%02x, expected 0", L->zero[z],
                     b->scales[L->zero[z]]);
            return 0;
        }
    for (int u = 0; L->untouched[u][0] >= 0; u++)
        for (int k = L->untouched[u][0]; k < L->untouched[u][1]; k++)
            if (b->scales[k] != 0xA5) {
                snprintf(why, cap, "scales byte %d (padding) written: 0x%02x", k, b->scales[k]);
                return 0;
            }
    for (int k = L->scale_bytes; k < GL_SCALE_BYTES; k++)
        if (b->scales[k] != 0xA5) {
            snprintf(why, cap, "scales byte %d past the buffer written", k);
            return 0;
        }
    snprintf(why, cap, "%d groups: scales, value bytes, zero and padding bytes as written by hand", GL_T * L->groups);
    return 1;
}

/* ---- the separate quantize pass (gemm_layout.h) ---- */
static float pass_scale(mlaf_gemm_scale m, float amax, float eps, uint8_t *byte) {
    int e;
    if (m == MLAF_GEMM_SCALE_F32) {
        *byte = 0;
        return fmaxf(amax, eps) / 448.0f;
    }
    if (isinf(amax)) {
        e = 128;
    } else if (m == MLAF_GEMM_SCALE_UE8M0) {
        const float m2 = frexpf(fmaxf(amax, eps) / 448.0f, &e);
        e = m2 == 0.5f ? e - 1 : e;
    } else if (m == MLAF_GEMM_SCALE_MX_FLOOR) {
        frexpf(amax, &e);
        e = amax == 0.0f ? -127 : e - 1 - 8;
    } else {
        const float q = amax / 448.0f;
        const float m2 = frexpf(q, &e);
        e = q == 0.0f ? -127 : m2 == 0.5f ? e - 1 : e;
    }
    if (e < -127) e = -127;
    *byte = (uint8_t)(e + 127);
    return e == 128 ? INFINITY : ldexpf(1.0f, e);
}

void gl_quantize_pass(mlaf_gemm_format f, mlaf_gemm_scale m, float eps, const void *y, mlaf_dtype dt, int64_t T,
                      int64_t K, int64_t ys, uint8_t *data, uint8_t *scales, int64_t ld) {
    const int32_t g = mlaf_gemm_format_group(f);
    const int64_t G = K / g, Gp = f == MLAF_GEMM_FP8_1X128_UE8M0 ? (G + 3) / 4 * 4 : G;
    mlaf_dtype sdt;
    int64_t sh[2], min_ld;
    mlaf_gemm_scales_shape(f, T, K, &sdt, sh, &min_ld);
    const int f32 = sdt == MLAF_F32;
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < Gp; j++) {
            const int64_t o = mlaf_ref_gemm_scale_offset(f, t, j, ld);
            if (j >= G) {
                scales[o] = 0;
                continue;
            }
            float amax = 0.0f;
            for (int32_t i = 0; i < g; i++) amax = fmaxf(amax, fabsf(mlaf_load_f32(y, dt, t * ys + j * g + i)));
            uint8_t b;
            const float s = pass_scale(m, amax, eps, &b);
            for (int32_t i = 0; i < g; i++) data[t * K + j * g + i] = mlaf_f32_to_e4m3(mlaf_load_f32(y, dt, t * ys + j * g + i) / s);
            if (f32) memcpy(scales + o, &s, 4);
            else scales[o] = b;
        }
}
