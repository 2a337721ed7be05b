/*
 * parallel.h — the CPU backend's one threading rule and its parallel-for (parallel.c).
 *
 * Every CPU op cuts its call into independent items (tokens, or token x head) and says how many
 * bytes the call moves (read + written). From that alone:
 *   - threads: 1 below 2 * MLAF_PAR_BYTES_PER_THREAD bytes (the calling thread runs the call
 *     alone: no wake-up, no barrier); above, one thread per MLAF_PAR_BYTES_PER_THREAD bytes,
 *     at most the context's count and at most one per chunk;
 *   - chunks: about MLAF_PAR_CHUNK_BYTES of work each (at least one item), claimed one at a
 *     time from a counter by whichever participant is free. The calling thread claims too and
 *     waits only for chunks another thread has already claimed, never for a thread that has not
 *     started: on a busy machine a worker that wakes late finds nothing left.
 */
#ifndef MLAF_CPU_PARALLEL_H
#define MLAF_CPU_PARALLEL_H

#include "../internal.h"

/* A second thread pays from 2x this many bytes per call (dev/README.md, "CPU threads": with
 * threads kept awake a second one already paid at 344 KB, GLM-4.7-Flash split_qk_norm T = 64,
 * 12-13 us against 16-22 us on one, on the 2-core development VM). */
#ifndef MLAF_PAR_BYTES_PER_THREAD
#define MLAF_PAR_BYTES_PER_THREAD ((int64_t)128 << 10)
#endif
/* Work per chunk: small enough that a worker preempted in the middle of one costs little (10-20
 * us at 3-6 GB/s a thread), large enough that the claim (one compare-and-swap) vanishes. */
#ifndef MLAF_PAR_CHUNK_BYTES
#define MLAF_PAR_CHUNK_BYTES ((int64_t)64 << 10)
#endif

/* Items [lo, hi) of a call; `worker` in [0, threads) names the running thread (0: the caller)
 * for per-thread scratch. Returns a count summed over the call (errors; 0 if none). */
typedef int64_t (*mlaf_cpu_range_fn)(void *arg, int64_t lo, int64_t hi, int worker);

/* The threads a call of `items` items moving `bytes` bytes runs on (the rule above). */
int mlaf_cpu_threads_for(const mlaf_context *ctx, int64_t items, int64_t bytes);

/* Runs fn over [0, items) as the rule says (one thread: fn(arg, 0, items, 0) on the caller) and
 * returns the sum of fn's results. The context's worker pool is created on its first use (a
 * worker that cannot be created is simply not there: the caller does its share). */
int64_t mlaf_cpu_parallel_for(const mlaf_context *ctx, int64_t items, int64_t bytes, mlaf_cpu_range_fn fn,
                              void *arg);

/* mlaf_cpu_pool_free (internal.h) stops and joins the workers: mlaf_context_free calls it. */

#endif
