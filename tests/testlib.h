/*
 * testlib.h — the tests' tiny harness: one greppable line per case
 * ("SPLIT_QK_NORM(preset=glm-4.7-flash,T=7,dtype=bf16,backend=cpu): OK"), counters, a closing
 * "N passed, N failed" line, and the list of backends to run (CUDA only when a GPU is
 * visible; otherwise one clear skip line).
 */
#ifndef MLAF_TESTLIB_H
#define MLAF_TESTLIB_H

#include <stdio.h>

#include "mlafuse.h"
#include "ref/verify.h"

extern int tl_passed, tl_failed, tl_skipped;

/* Records one case: prints "<name>: OK" or "<name>: FAIL <why>". Returns ok. */
int tl_case(int ok, const char *name, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Records a skipped case with its reason. */
void tl_skip(const char *name, const char *why);
/* Prints the closing line and returns the process exit code (0 when nothing failed). */
int tl_finish(void);

/* Backends to test: fills out[] (CPU always; CUDA when available) and returns the count.
 * Prints one "SKIP: cuda backend: ..." line when CUDA is not built or no GPU is visible. */
int tl_backends(mlaf_backend *out);
/* Whether tl_backends lists CUDA (its skip line printed otherwise): for CUDA-only programs. */
int tl_cuda(void);

/* 1 when the quick mode is asked for (MLAF_TEST_QUICK=1, e.g. under sanitizers). */
int tl_quick(void);

/* Creates a context or reports a failed case and returns NULL. */
mlaf_context *tl_context(mlaf_backend b);

/* Runs suite(ctx, quick, NULL) on every backend, then, on the CPU, suite(ctx, 1, "isa=...")
 * once per forced instruction-set path (a skip line for paths this machine lacks). `op` names
 * the skip lines, e.g. "ROPE_Q". Returns tl_finish(). */
typedef void (*tl_suite_fn)(mlaf_context *ctx, int quick, const char *tag);
int tl_run_suite(const char *op, tl_suite_fn suite);

#define TL_CHECK(cond, name) tl_case((cond), (name), "%s", #cond)

#endif
