#include "testlib.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

int tl_passed, tl_failed, tl_skipped;

int tl_case(int ok, const char *name, const char *fmt, ...) {
    if (ok) {
        tl_passed++;
        printf("%s: OK\n", name);
    } else {
        tl_failed++;
        printf("%s: FAIL ", name);
        va_list ap;
        va_start(ap, fmt);
        vprintf(fmt, ap);
        va_end(ap);
        printf("\n");
    }
    fflush(stdout);
    return ok;
}

void tl_skip(const char *name, const char *why) {
    tl_skipped++;
    printf("%s: SKIP %s\n", name, why);
    fflush(stdout);
}

int tl_finish(void) {
    printf("%d passed, %d failed, %d skipped\n", tl_passed, tl_failed, tl_skipped);
    return tl_failed == 0 ? 0 : 1;
}

int tl_backends(mlaf_backend *out) {
    int n = 0;
    /* MLAF_TEST_BACKEND=cuda (or cpu) restricts the run to one backend, e.g. under
     * compute-sanitizer on the GPU machine. */
    const char *only = getenv("MLAF_TEST_BACKEND");
    if (only && strcmp(only, "cuda") == 0) {
        if (mlaf_backend_available(MLAF_BACKEND_CUDA)) {
            out[n++] = MLAF_BACKEND_CUDA;
        } else {
            printf("SKIP: cuda backend: MLAF_TEST_BACKEND=cuda but no CUDA device is visible\n");
            tl_skipped++;
        }
        return n;
    }
    out[n++] = MLAF_BACKEND_CPU;
    if (only && strcmp(only, "cpu") == 0) return n;
    if (mlaf_backend_available(MLAF_BACKEND_CUDA)) {
        out[n++] = MLAF_BACKEND_CUDA;
    } else {
#ifdef MLAF_WITH_CUDA
        printf("SKIP: cuda backend: built, but no CUDA device is visible on this machine; "
               "GPU cases skipped\n");
#else
        printf("SKIP: cuda backend: not built (no nvcc at configure time); GPU cases skipped\n");
#endif
        tl_skipped++;
    }
    return n;
}

int tl_cuda(void) {
    mlaf_backend bs[MLAF_BACKEND_COUNT_];
    const int nb = tl_backends(bs);
    for (int i = 0; i < nb; i++)
        if (bs[i] == MLAF_BACKEND_CUDA) return 1;
    return 0;
}

int tl_quick(void) {
    const char *q = getenv("MLAF_TEST_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

mlaf_context *tl_context(mlaf_backend b) {
    mlaf_context *ctx = NULL;
    mlaf_status st = mlaf_context_create(&ctx, b);
    if (st != MLAF_OK) {
        tl_case(0, "context_create", "backend %s: %s", mlaf_backend_name(b), mlaf_status_name(st));
        return NULL;
    }
    return ctx;
}

int tl_run_suite(const char *op, tl_suite_fn suite) {
    mlaf_backend bes[MLAF_BACKEND_COUNT_];
    int nb = tl_backends(bes);
    int quick = tl_quick();
    for (int bi = 0; bi < nb; bi++) {
        mlaf_context *ctx = tl_context(bes[bi]);
        if (!ctx) continue;
        suite(ctx, quick, NULL);
        if (bes[bi] == MLAF_BACKEND_CPU) {
            static const mlaf_cpu_isa isas[3] = {MLAF_CPU_ISA_SCALAR, MLAF_CPU_ISA_AVX2,
                                                 MLAF_CPU_ISA_AVX512};
            for (int k = 0; k < 3; k++) {
                char tag[64];
                snprintf(tag, sizeof tag, "isa=%s", mlaf_cpu_isa_name(isas[k]));
                if (mlaf_context_set_cpu_isa(ctx, isas[k]) != MLAF_OK) {
                    char name[96];
                    snprintf(name, sizeof name, "%s(%s,backend=cpu)", op, tag);
                    tl_skip(name, "this machine or build lacks the instruction set");
                    continue;
                }
                suite(ctx, 1, tag);
            }
            mlaf_context_set_cpu_isa(ctx, MLAF_CPU_ISA_AUTO);
        }
        mlaf_context_free(ctx);
    }
    return tl_finish();
}
