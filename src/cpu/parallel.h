/*
 * parallel.h — the CPU backend's one threading rule and its parallel-for (parallel.c).
 *
 * Every CPU op cuts its call into independent items (tokens, or token x head) and says how many
 * bytes the call moves (read + written). From that alone:
 *   - threads: 1 below 2 * MLAF_PAR_BYTES_PER_THREAD bytes (the calling thread runs the call
 *     alone: no wake-up, no barrier); above, one thread per MLAF_PAR_BYTES_PER_THREAD bytes,
 *     at most the context's count and at most one per chunk;
 *   - chunks: about MLAF_PAR_CHUNK_BYTES of work each (at least one item), cut into one
 *     contiguous home range per thread; each thread claims its own range's chunks in order, then
 *     whatever is left of the others' (an idle machine streams contiguous parts, as a static split
 *     does). The calling thread claims too and waits only for chunks another thread has already
 *     claimed, never for a thread that has not started: on a busy machine a worker that wakes
 *     late finds its range taken.
 */
#ifndef MLAF_CPU_PARALLEL_H
#define MLAF_CPU_PARALLEL_H

#include "../internal.h"

/* A second thread from 2x this many bytes per call. On the 2-core development VM (dev/cpu_load.sh,
 * every op of GLM-4.7-Flash): at 128 KiB, calls of 344-370 KB (split_qk_norm, mla_kv_cache,
 * rope_q at T = 64) took 1.0-2.2x their one-thread time on two threads (47-59 us against 23-29:
 * waking a sleeping worker costs the caller more than half of such a call), so they stay on one
 * thread; from 4096 tokens (22 MB) two threads pay (1.9 ms against 1.8 ms idle, 1.6 ms against
 * 3.4 ms under two busy processes). */
#ifndef MLAF_PAR_BYTES_PER_THREAD
#define MLAF_PAR_BYTES_PER_THREAD ((int64_t)256 << 10)
#endif
/* Work per chunk: small enough that a worker preempted in the middle of one costs little (40-80
 * us at 3-6 GB/s a thread), large enough that a chunk's start (the claim, the hardware prefetchers'
 * ramp on a new range, the software prefetch stopping at its end) vanishes. At T = 4096 (GLM-4.7-
 * Flash, two threads, 2-core VM) 64 KiB chunks took split_qk_norm / mla_kv_cache / rope_q to
 * 1.2-1.4 ms against 0.9-1.1 ms with one contiguous half a thread (OpenMP static); 256 KiB: 1.0-1.1. */
#ifndef MLAF_PAR_CHUNK_BYTES
#define MLAF_PAR_CHUNK_BYTES ((int64_t)256 << 10)
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
