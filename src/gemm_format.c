/*
 * gemm_format.c — the rows of the GEMM-input format table (gemm_format.h): per format, its name,
 * group width, scale roundings and scales tensor; the validation of a quantized output those rows
 * drive; the public name and shape helpers. The byte layouts are stated in docs/gemm_formats.md.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "gemm_format.h"
#include "validate_common.h"

#define SM_(m) (1u << (m))

/* ---- the table -------------------------------------------------------------------------- */
const mlaf_gemm_format_info mlaf_gemm_formats[MLAF_GEMM_FORMAT_COUNT_] = {
    [MLAF_GEMM_NONE] = {"none", "no quantized output", 0, 0, MLAF_F32, 1, 0, 0, "-"},
    [MLAF_GEMM_FP8_1X128] = {"fp8_1x128", "e4m3, one f32 scale per 1x128 group, scales row-major [T, K/128]", 128,
                             SM_(MLAF_GEMM_SCALE_F32) | SM_(MLAF_GEMM_SCALE_UE8M0), MLAF_F32, 1, 0, 0,
                             "block-scaled fp8 GEMMs with K-major activation scales (DeepGEMM / CUTLASS, SGLang's "
                             "default per-token-group quant)"},
    [MLAF_GEMM_FP8_1X128_MN] = {"fp8_1x128_mn",
                                "e4m3, one f32 scale per 1x128 group, scales MN-major TMA-aligned [K/128, T] "
                                "(ld >= round_up(T, 4))",
                                128, SM_(MLAF_GEMM_SCALE_F32) | SM_(MLAF_GEMM_SCALE_UE8M0), MLAF_F32, 1, 1, 1,
                                "DeepGEMM's sm90 kernels, FlashInfer's DeepGEMM wrapper and fused add + RMSNorm + "
                                "block quant"},
    [MLAF_GEMM_FP8_1X128_UE8M0] = {"fp8_1x128_ue8m0",
                                   "e4m3, one UE8M0 byte per 1x128 group, four packed in an i32, MN-major "
                                   "TMA-aligned [ceil(K/512), T]",
                                   128, SM_(MLAF_GEMM_SCALE_UE8M0), MLAF_I32, 4, 1, 1, "DeepGEMM's sm100 kernels"},
    [MLAF_GEMM_MXFP8] = {"mxfp8", "OCP MXFP8: e4m3, one UE8M0 byte per 1x32 group, scales row-major [T, K/32]", 32,
                         SM_(MLAF_GEMM_SCALE_MX_FLOOR) | SM_(MLAF_GEMM_SCALE_MX_CEIL), MLAF_U8, 1, 0, 0,
                         "MX block-scaled GEMMs (OCP Microscaling v1.0)"},
    [MLAF_GEMM_FP8_1X128_CM] = {"fp8_1x128_cm",
                                "e4m3, one f32 scale per 1x128 group, scales column-major [K/128, T] (ld >= T, "
                                "no alignment)",
                                128, SM_(MLAF_GEMM_SCALE_F32) | SM_(MLAF_GEMM_SCALE_UE8M0), MLAF_F32, 1, 1, 0,
                                "SGLang's per-token-group quant with column-major scales, not TMA-aligned"},
};

static const char *const scale_names[MLAF_GEMM_SCALE_COUNT_] = {"f32", "ue8m0", "mx_floor", "mx_ceil"};

const char *mlaf_gemm_format_list(char *buf, size_t cap) {
    buf[0] = '\0';
    for (int f = 1; f < MLAF_GEMM_FORMAT_COUNT_; f++) {
        const size_t len = strlen(buf);
        snprintf(buf + len, cap - len, "%s%s", f == 1 ? "" : f == MLAF_GEMM_FORMAT_COUNT_ - 1 ? " or " : ", ",
                 mlaf_gemm_formats[f].name);
    }
    return buf;
}

const char *mlaf_gemm_scale_list(unsigned mask, char *buf, size_t cap) {
    int n = 0, total = 0;
    for (int m = 0; m < MLAF_GEMM_SCALE_COUNT_; m++) total += (mask >> m) & 1u;
    buf[0] = '\0';
    for (int m = 0; m < MLAF_GEMM_SCALE_COUNT_; m++) {
        if (!((mask >> m) & 1u)) continue;
        const size_t len = strlen(buf);
        snprintf(buf + len, cap - len, "%s%d (%s)", n == 0 ? "" : n == total - 1 ? " or " : ", ", m, scale_names[m]);
        n++;
    }
    return buf;
}

/* ---- public helpers --------------------------------------------------------------------- */
const char *mlaf_gemm_format_name(mlaf_gemm_format f) {
    const mlaf_gemm_format_info *r = mlaf_gemm_format_row(f);
    return r ? r->name : "unknown";
}

const char *mlaf_gemm_scale_name(mlaf_gemm_scale s) {
    return (unsigned)s < MLAF_GEMM_SCALE_COUNT_ ? scale_names[s] : "unknown";
}

int32_t mlaf_gemm_format_group(mlaf_gemm_format f) {
    const mlaf_gemm_format_info *r = mlaf_gemm_format_row(f);
    return r ? r->group : 0;
}

/* The scales tensor's shape and least leading stride for T rows of G groups. */
static void scales_dims(const mlaf_gemm_format_info *r, int64_t T, int64_t G, int64_t shape[2], int64_t *min_ld) {
    const int64_t cols = (G + r->pack - 1) / r->pack;
    if (r->mn_major) {
        shape[0] = cols, shape[1] = T;
        *min_ld = r->tma ? (T + 3) / 4 * 4 : T;
    } else {
        shape[0] = T, shape[1] = cols;
        *min_ld = cols;
    }
}

mlaf_status mlaf_gemm_scales_shape(mlaf_gemm_format f, int64_t T, int64_t K, mlaf_dtype *dtype, int64_t shape[2],
                                   int64_t *min_ld) {
    const mlaf_gemm_format_info *r = mlaf_gemm_format_row(f);
    if (!dtype || !shape || !min_ld) return MLAF_ERR_NULL_POINTER;
    if (!r || r->group == 0 || T < 0 || K < 0 || K % r->group != 0) return MLAF_ERR_INVALID_ARGUMENT;
    *dtype = r->scale_dt;
    scales_dims(r, T, K / r->group, shape, min_ld);
    return MLAF_OK;
}

/* ---- validation ------------------------------------------------------------------------- */
mlaf_status mlaf_vcheck_gemm_out(mlaf_context *ctx, const mlaf_gemm_out *q, const char *name, int64_t T, int64_t K,
                                 mlaf_gemm_out_job *job) {
    char buf[160], what[64];
    memset(job, 0, sizeof *job);
    job->format = MLAF_GEMM_NONE;
    if (!q) return MLAF_OK;
    const mlaf_gemm_format_info *r = mlaf_gemm_format_row(q->format);
    if (!r)
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT, "%s.format = %d, expected 0 (none), %s", name, (int)q->format,
                         mlaf_gemm_format_list(buf, sizeof buf));
    if (q->format == MLAF_GEMM_NONE) {
        if (q->data || q->scales)
            return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                             "%s.format = 0 (none) but %s.%s is given; pass NULL or set a format", name, name,
                             q->data ? "data" : "scales");
        return MLAF_OK;
    }
    if ((unsigned)q->scale >= MLAF_GEMM_SCALE_COUNT_ || !((r->scale_modes >> q->scale) & 1u))
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT, "%s.scale = %d (%s), expected %s for format %s", name,
                         (int)q->scale, mlaf_gemm_scale_name(q->scale), mlaf_gemm_scale_list(r->scale_modes, buf, sizeof buf),
                         r->name);
    const float eps = q->eps == 0.0f ? MLAF_GEMM_DEFAULT_EPS : q->eps;
    if (!(isfinite(eps) && eps >= 1e-30f))
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                         "%s.eps = %g, expected 0 (the default 1e-10) or finite and >= 1e-30", name, (double)q->eps);
    if (K % r->group != 0)
        return mlaf_fail(ctx, MLAF_ERR_SHAPE,
                         "%s: K = %lld values a row, expected a multiple of %d for format %s (one scale per 1x%d "
                         "group)",
                         name, (long long)K, (int)r->group, r->name, (int)r->group);

    /* data [T, K] e4m3 bytes */
    static const char *const data_expr[2] = {"tokens", "K"};
    const int64_t wd[2] = {T, K};
    snprintf(what, sizeof what, "%s.data", name);
    TRY(mlaf_vcheck_tensor(ctx, q->data, what, (1u << MLAF_U8) | (1u << MLAF_FP8_E4M3), 2, wd, data_expr));

    /* scales: the format's dtype and shape, then its layout rules */
    int64_t ws[2], min_ld;
    scales_dims(r, T, K / r->group, ws, &min_ld);
    char e0[96], e1[96];
    const char *groups = r->pack == 4 ? "ceil(K / 512)" : r->group == 128 ? "K / 128" : "K / 32";
    snprintf(e0, sizeof e0, "%s", r->mn_major ? groups : "tokens");
    snprintf(e1, sizeof e1, "%s", r->mn_major ? "tokens" : groups);
    const char *const scale_expr[2] = {e0, e1};
    snprintf(what, sizeof what, "%s.scales", name);
    TRY(mlaf_vcheck_tensor(ctx, q->scales, what, 1u << r->scale_dt, 2, ws, scale_expr));
    const mlaf_tensor *s = q->scales;
    if (r->mn_major && T > 0 && r->tma) { /* an empty view addresses nothing; a single row's stride is never stepped */
        if (s->shape[0] > 1 && (s->stride[0] < min_ld || s->stride[0] % 4 != 0))
            return mlaf_fail(ctx, MLAF_ERR_STRIDE,
                             "%s.stride[0] = %lld, expected a multiple of 4 and >= round_up(tokens, 4) = %lld for "
                             "format %s (MN-major, TMA-aligned: each group's column of scales starts 16-byte "
                             "aligned)",
                             what, (long long)s->stride[0], (long long)min_ld, r->name);
        if ((uintptr_t)s->data % 16 != 0)
            return mlaf_fail(ctx, MLAF_ERR_STRIDE, "%s.data = %p, expected 16-byte aligned for format %s (TMA-aligned)",
                             what, s->data, r->name);
    }
    char dname[64];
    snprintf(dname, sizeof dname, "%s.data", name);
    TRY(mlaf_vcheck_no_overlap(ctx, q->scales, what, q->data, dname));

    job->format = q->format;
    job->scale = q->scale;
    job->eps = eps;
    job->group = r->group;
    job->data = (uint8_t *)q->data->data;
    job->data_stride = q->data->stride[0];
    job->scales = s->data;
    job->scale_ld = s->stride[0];
    return MLAF_OK;
}
