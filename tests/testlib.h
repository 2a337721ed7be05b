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

/* 1 when the quick mode is asked for (MLAF_TEST_QUICK=1, e.g. under sanitizers). */
int tl_quick(void);

/* Creates a context or reports a failed case and returns NULL. */
mlaf_context *tl_context(mlaf_backend b);

#define TL_CHECK(cond, name) tl_case((cond), (name), "%s", #cond)

#endif
