/*
 * test_row_writers.c — the CPU row loop with a writer of the test's choosing: mlaf_cpu_writer_rstd
 * stores each row's two rstd values beside the dense writer, on every instruction-set path; they
 * must be the float64 values within 1e-5 relative, and the dense outputs those of the op itself.
 * FORMAT_TABLE: every KV-cache format of src/kv_format.h has its row (a name, cache dtypes, a
 * record size and checks), a CPU writer and an oracle encoder, and the names are distinct.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../src/cpu/norm_writers.h"
#include "../src/kv_format.h"
#include "../src/ref/verify.h"
#include "testlib.h"

static void format_table(void) {
    int rows = 1;
    for (int f = 0; f < MLAF_KV_FORMAT_COUNT_; f++) {
        const mlaf_kv_format_info *k = &mlaf_kv_formats[f];
        rows = rows && k->name && k->summary && k->cache_dtypes && k->record_bytes && k->check_cache &&
               !strcmp(mlaf_kv_format_name((mlaf_kv_format)f), k->name);
        for (int g = 0; g < f; g++) rows = rows && k->name && strcmp(mlaf_kv_formats[g].name, k->name);
    }
    const int cpu = mlaf_cpu_cache_writer_count(), ref = mlaf_ref_kv_encoder_count();
    tl_case(rows && cpu == MLAF_KV_FORMAT_COUNT_ && ref == MLAF_KV_FORMAT_COUNT_, "FORMAT_TABLE(kv_cache)",
            "%d formats: rows %s, %d CPU writers, %d oracle encoders", MLAF_KV_FORMAT_COUNT_,
            rows ? "complete" : "INCOMPLETE", cpu, ref);
}

int main(void) {
    format_table();
    static const mlaf_cpu_isa isas[] = {MLAF_CPU_ISA_SCALAR, MLAF_CPU_ISA_AVX2, MLAF_CPU_ISA_AVX512};
    static const char *isa_names[] = {"portable", "avx2", "avx512"};
    const int32_t Q = 768, C = 512, R = 64, W = Q + C + R;
    const int64_t T = 300;
    mlaf_rng rng;
    mlaf_rng_seed(&rng, 91);
    float *lat = malloc(sizeof(float) * (size_t)(T * W)), *w = malloc(sizeof(float) * (size_t)(Q + C));
    float *q = malloc(sizeof(float) * (size_t)(T * Q)), *k = malloc(sizeof(float) * (size_t)(T * C));
    float *q2 = malloc(sizeof(float) * (size_t)(T * Q)), *k2 = malloc(sizeof(float) * (size_t)(T * C));
    float *rs = malloc(sizeof(float) * (size_t)(T * 2));
    mlaf_fill_normal(&rng, lat, MLAF_F32, (size_t)(T * W), 0.0, 1.0);
    mlaf_fill_normal(&rng, w, MLAF_F32, (size_t)(Q + C), 1.0, 0.2);
    mlaf_norm_job j;
    memset(&j, 0, sizeof j);
    j.T = T, j.Q = Q, j.C = C, j.R = R, j.eps_q = 1e-6f, j.eps_kv = 1e-5f, j.dt = MLAF_F32;
    j.latent = lat, j.latent_stride = W, j.w_q = w, j.w_q_dt = MLAF_F32, j.w_kv = w + Q, j.w_kv_dt = MLAF_F32;
    j.q = q, j.q_stride = Q, j.k_nope = k, j.k_nope_stride = C;
    for (int i = 0; i < 3; i++) {
        char name[96];
        snprintf(name, sizeof name, "ROW_WRITERS(writer=rstd,isa=%s,backend=cpu)", isa_names[i]);
        mlaf_context *ctx = tl_context(MLAF_BACKEND_CPU);
        if (!ctx) continue;
        if (mlaf_context_set_cpu_isa(ctx, isas[i]) != MLAF_OK) {
            tl_skip(name, "this CPU lacks the path");
            mlaf_context_free(ctx);
            continue;
        }
        const mlaf_norm_kern *kern = mlaf_cpu_norm_kern(ctx);
        const mlaf_cpu_writer wr[2] = {mlaf_cpu_writer_dense(kern, &j), mlaf_cpu_writer_rstd(kern, rs)};
        memset(rs, 0xff, sizeof(float) * (size_t)(T * 2));
        mlaf_cpu_norm_run(ctx, &j, NULL, wr, 2);
        memcpy(q2, q, sizeof(float) * (size_t)(T * Q)), memcpy(k2, k, sizeof(float) * (size_t)(T * C));
        const mlaf_cpu_writer dense[1] = {mlaf_cpu_writer_dense(kern, &j)};
        mlaf_cpu_norm_run(ctx, &j, NULL, dense, 1);
        double worst = 0;
        for (int64_t t = 0; t < T; t++) {
            double sq = 0, skv = 0;
            for (int e = 0; e < Q + C; e++) {
                const double x = lat[t * W + e];
                if (e < Q) sq += x * x;
                else skv += x * x;
            }
            const double r[2] = {1.0 / sqrt(sq / Q + 1e-6f), 1.0 / sqrt(skv / C + 1e-5f)};
            for (int h = 0; h < 2; h++) {
                const double u = fabs(rs[2 * t + h] - r[h]) / r[h];
                if (!(u <= worst)) worst = u;
            }
        }
        const int same = !memcmp(q, q2, sizeof(float) * (size_t)(T * Q)) && !memcmp(k, k2, sizeof(float) * (size_t)(T * C));
        tl_case(worst <= 1e-5 && same, name, "rstd %.2g relative, dense outputs %s", worst, same ? "same" : "differ");
        mlaf_context_free(ctx);
    }
    free(lat), free(w), free(q), free(k), free(q2), free(k2), free(rs);
    return tl_finish();
}
