/*
 * verify_gemm_quant.c — `mlafuse verify --op gemm_quant`: its cases against the GEMM-input encoder
 * (src/ref/verify_gemm_quant.c), one line each:
 *   GEMM_QUANT(hidden=7168,T=7,dtype=bf16,backend=cpu,fp8_1x128_mn/ue8m0,strided): OK
 * Per hidden size, dtype and T: every format of src/gemm_format.h in each rounding it takes,
 * contiguous and strided (padded, misaligned x and q rows, wider scale strides) in turn; x's rows
 * carry NaN, infinities, subnormal and zero rows among ordinary values. A format whose group does
 * not divide the hidden size is skipped with a line.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "gemm_format.h"
#include "ref/verify.h"

void verify_gemm_quant(mlaf_context *ctx, const int64_t *hidden, int nh, const mlaf_dtype *dts, int ndt,
                       const int64_t *tokens, int ntok, uint64_t seed, int *passed, int *failed, int *skipped) {
    for (int h = 0; h < nh; h++)
        for (int d = 0; d < ndt; d++)
            for (int t = 0; t < ntok; t++) {
                int k = 0; /* the case's index among the format x rounding pairs: strided every other one */
                for (int f = 1; f < MLAF_GEMM_FORMAT_COUNT_; f++)
                    for (int m = 0; m < MLAF_GEMM_SCALE_COUNT_; m++) {
                        if (!((mlaf_gemm_formats[f].scale_modes >> m) & 1u)) continue;
                        const int strided = (k + t + d) % 2;
                        k++;
                        const int32_t g = mlaf_gemm_formats[f].group;
                        char label[96];
                        snprintf(label, sizeof label, "%s/%s%s", mlaf_gemm_formats[f].name,
                                 mlaf_gemm_scale_name((mlaf_gemm_scale)m), strided ? ",strided" : "");
                        if (hidden[h] % g != 0) {
                            if (d == 0 && t == 0) {
                                printf("SKIP: gemm_quant hidden=%lld %s/%s: the hidden size is not a multiple of %d\n",
                                       (long long)hidden[h], mlaf_gemm_formats[f].name,
                                       mlaf_gemm_scale_name((mlaf_gemm_scale)m), (int)g);
                                (*skipped)++;
                            }
                            continue;
                        }
                        mlaf_verify_case c = mlaf_verify_case_default(
                            NULL, dts[d], tokens[t],
                            seed + 7919u * (uint64_t)k + 131u * (uint64_t)t + 17u * (uint64_t)d + 3u * (uint64_t)h);
                        c.hidden = hidden[h];
                        c.q_format = (mlaf_gemm_format)f;
                        c.q_scale = (mlaf_gemm_scale)m;
                        c.strided = strided;
                        printf("GEMM_QUANT(hidden=%lld,T=%lld,dtype=%s,backend=%s,%s): ", (long long)hidden[h],
                               (long long)tokens[t], mlaf_dtype_name(dts[d]), mlaf_backend_name(mlaf_context_backend(ctx)),
                               label);
                        fflush(stdout);
                        mlaf_verify_result r;
                        memset(&r, 0, sizeof r);
                        const mlaf_status st = mlaf_verify_gemm_quant(ctx, &c, &r);
                        if (st == MLAF_OK && r.passed) {
                            printf("OK\n");
                            (*passed)++;
                        } else if (st == MLAF_OK) {
                            printf("FAIL %s\n", r.detail);
                            (*failed)++;
                        } else {
                            const char *why = r.detail[0] ? r.detail : mlaf_context_last_error(ctx);
                            printf("FAIL %s: %s\n", mlaf_status_name(st), why[0] ? why : mlaf_status_message(st));
                            (*failed)++;
                        }
                        fflush(stdout);
                    }
            }
}
