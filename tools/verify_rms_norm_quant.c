/*
 * verify_rms_norm_quant.c — `mlafuse verify --op rms_norm_quant`: its cases against the float64 oracle
 * and the GEMM-input encoder (src/ref/verify_rms_norm_quant.c), one line each:
 *   RMS_NORM_QUANT(hidden=7168,T=7,dtype=bf16,backend=cpu,fp8_1x128_mn/ue8m0,residual,in-place): OK worst=0.50ulp
 * Per hidden size, dtype and T, the cases below: dense only, every format of src/gemm_format.h in
 * each rounding it takes, with and without the residual, strided, in place (y = x), q alone, f32
 * weights. A format whose group does not divide the hidden size is skipped with a line.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "gemm_format.h"
#include "ref/verify.h"

typedef struct rnq_variant {
    mlaf_gemm_format format;
    mlaf_gemm_scale scale;
    int residual, strided, in_place, no_dense, f32_weights;
} rnq_variant;

/* The flag patterns the cases take in turn: each format of the table gets one per rounding it
 * takes, so a format added to the table is verified without a line here. */
static const int patterns[][5] = {
    /* residual, strided, in_place, no_dense, f32_weights */
    {1, 1, 0, 0, 0}, {0, 0, 0, 0, 0}, {1, 0, 0, 1, 0}, {1, 1, 1, 0, 0}, {1, 0, 0, 0, 1}, {0, 1, 0, 1, 0}, {1, 0, 1, 0, 0},
};

/* The cases: dense only (plain; residual, strided, f32 weights), then every format of the table in
 * each rounding it takes. Returns their number (at most cap). */
static int make_variants(rnq_variant *v, int cap) {
    const int np = (int)(sizeof patterns / sizeof patterns[0]);
    int n = 0;
    v[n++] = (rnq_variant){MLAF_GEMM_NONE, MLAF_GEMM_SCALE_F32, 0, 0, 0, 0, 0};
    v[n++] = (rnq_variant){MLAF_GEMM_NONE, MLAF_GEMM_SCALE_F32, 1, 1, 0, 0, 1};
    for (int f = 1; f < MLAF_GEMM_FORMAT_COUNT_; f++)
        for (int m = 0; m < MLAF_GEMM_SCALE_COUNT_ && n < cap; m++) {
            if (!((mlaf_gemm_formats[f].scale_modes >> m) & 1u)) continue;
            const int *pt = patterns[(n - 2) % np];
            v[n++] = (rnq_variant){(mlaf_gemm_format)f, (mlaf_gemm_scale)m, pt[0], pt[1], pt[2], pt[3], pt[4]};
        }
    return n;
}

void verify_rms_norm_quant(mlaf_context *ctx, const int64_t *hidden, int nh, const mlaf_dtype *dts, int ndt,
                           const int64_t *tokens, int ntok, uint64_t seed, float eps, int *passed, int *failed,
                           int *skipped) {
    rnq_variant variants[2 + MLAF_GEMM_FORMAT_COUNT_ * MLAF_GEMM_SCALE_COUNT_];
    const int nv = make_variants(variants, (int)(sizeof variants / sizeof variants[0]));
    for (int h = 0; h < nh; h++)
        for (int d = 0; d < ndt; d++)
            for (int t = 0; t < ntok; t++)
                for (int k = 0; k < nv; k++) {
                    const rnq_variant *v = &variants[k];
                    const int32_t g = mlaf_gemm_format_group(v->format);
                    char label[160];
                    snprintf(label, sizeof label, "%s%s%s%s%s%s%s%s", v->format ? mlaf_gemm_format_name(v->format) : "dense",
                             v->format ? "/" : "", v->format ? mlaf_gemm_scale_name(v->scale) : "",
                             v->residual ? ",residual" : "", v->strided ? ",strided" : "", v->in_place ? ",in-place" : "",
                             v->no_dense ? ",q-only" : "", v->f32_weights && dts[d] != MLAF_F32 ? ",w=f32" : "");
                    if (g > 0 && hidden[h] % g != 0) {
                        if (d == 0 && t == 0) {
                            printf("SKIP: rms_norm_quant hidden=%lld %s: the hidden size is not a multiple of %d\n",
                                   (long long)hidden[h], label, (int)g);
                            (*skipped)++;
                        }
                        continue;
                    }
                    mlaf_verify_case c = mlaf_verify_case_default(NULL, dts[d], tokens[t],
                                                                  seed + 7919u * (uint64_t)k + 131u * (uint64_t)t +
                                                                      17u * (uint64_t)d + 3u * (uint64_t)h);
                    c.cfg.rms_norm_eps = eps;
                    c.hidden = hidden[h];
                    c.q_format = v->format;
                    c.q_scale = v->scale;
                    c.residual = v->residual;
                    c.strided = v->strided;
                    c.in_place = v->in_place;
                    c.no_dense = v->no_dense;
                    if (v->f32_weights) c.weight_dtype = MLAF_F32;
                    printf("RMS_NORM_QUANT(hidden=%lld,T=%lld,dtype=%s,backend=%s,%s): ", (long long)hidden[h],
                           (long long)tokens[t], mlaf_dtype_name(dts[d]), mlaf_backend_name(mlaf_context_backend(ctx)),
                           label);
                    fflush(stdout);
                    mlaf_verify_result r;
                    memset(&r, 0, sizeof r);
                    const mlaf_status st = mlaf_verify_rms_norm_quant(ctx, &c, &r);
                    const char *unit = dts[d] == MLAF_F32 ? "u" : "ulp";
                    if (st == MLAF_OK && r.passed) {
                        printf("OK worst=%.2f%s\n", r.worst_units, unit);
                        (*passed)++;
                    } else if (st == MLAF_OK) {
                        printf("FAIL worst=%.3g%s %s\n", r.worst_units, unit, r.detail);
                        (*failed)++;
                    } else {
                        const char *why = r.detail[0] ? r.detail : mlaf_context_last_error(ctx);
                        printf("FAIL %s: %s\n", mlaf_status_name(st), why[0] ? why : mlaf_status_message(st));
                        (*failed)++;
                    }
                    fflush(stdout);
                }
}
