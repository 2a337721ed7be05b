/*
 * parallel.c — the CPU backend's worker pool and parallel-for (the rule: parallel.h).
 *
 * One pool per context, created on the first call that uses more than one thread: workers
 * 1 .. threads-1 (pthreads), the caller is participant 0. A call's chunks are cut into nt
 * contiguous home ranges, one per participant (range q: chunks [q n / nt, (q + 1) n / nt)), each
 * with its claim word (generation << 32 | next chunk of the range) on a line of its own. A call
 * publishes its description, then the claim words with release; a participant claims the chunks
 * of its own range in order by compare-and-swap on its word, then those left in the others'
 * ranges (the next ones after it first), so a claim names its call: a worker that read an old
 * generation fails its CAS and never runs a chunk of a later call. On an idle machine every
 * thread streams one contiguous part of the rows (as a static split does); on a busy one a
 * worker that wakes late finds its range taken: the caller claims like the others and, when none
 * is left, waits only for the chunks others hold (their count `done`). Workers spin briefly after
 * a call, then sleep on a futex (Linux; elsewhere they poll with sched_yield) until the next
 * generation.
 *
 * The description fields are atomics read relaxed: a late worker may read a newer call's fields
 * while it still holds an older generation, but then its CAS fails and it discards them; a CAS
 * that succeeds proves its call is still running (its chunk was unclaimed), so the fields read
 * before it were that call's.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* syscall */
#endif
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "parallel.h"

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* A worker between calls: pause rounds before it sleeps (tens of microseconds, so back-to-back
 * calls find it awake; longer only takes cores from others on a busy machine). The caller
 * waiting for chunks others hold: pause rounds, then yields (the holder may be waiting for this
 * very core), then a futex sleep until the last one is done. */
#define SPIN_IDLE 2000
#define SPIN_WAIT 1000
#define YIELD_WAIT 16

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void futex_wait(_Atomic uint32_t *addr, uint32_t val) {
#ifdef __linux__
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
#else
    (void)addr, (void)val;
    sched_yield();
#endif
}

static void futex_wake(_Atomic uint32_t *addr, int n) {
#ifdef __linux__
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
#else
    (void)addr, (void)n;
#endif
}

typedef struct mlaf_cpu_pool mlaf_cpu_pool;

typedef struct worker_arg {
    mlaf_cpu_pool *pool;
    int index;     /* 1 .. nworkers */
    uint32_t seen; /* the generation current when it was created */
} worker_arg;

/* A home range's claim word: generation << 32 | its next chunk; its end. One line each. */
typedef struct home_range {
    _Alignas(64) _Atomic uint64_t claim;
    _Atomic uint32_t end;
} home_range;

struct mlaf_cpu_pool {
    /* written by the caller, one line each so claims and completions do not share a line */
    home_range range[MLAF_MAX_THREADS];  /* the current call's nt home ranges */
    _Alignas(64) _Atomic uint32_t done;  /* chunks finished in the current call */
    _Atomic uint32_t waiting;            /* the caller sleeps on `done` */
    _Alignas(64) _Atomic uint32_t gen;   /* the current call's generation: workers sleep on it */
    _Atomic uint32_t sleepers;
    _Atomic int stop;
    /* the current call (see the file comment) */
    _Atomic(mlaf_cpu_range_fn) fn;
    _Atomic(void *) arg;
    _Atomic int64_t items, chunk;
    _Atomic uint32_t nchunks;
    _Atomic int nt;
    _Atomic int64_t sum;
    int nworkers;
    int last_nt; /* the previous call's home ranges (the caller's own field) */
    pthread_t th[MLAF_MAX_THREADS];
    worker_arg wa[MLAF_MAX_THREADS];
};

/* Claims and runs the chunks of home range q of generation g as participant `me` until none is
 * left there; returns 0 when the call is over for `me` (a later generation, or me not in it). */
static int run_range(mlaf_cpu_pool *p, uint32_t g, int me, int q) {
    home_range *r = &p->range[q];
    uint64_t c = atomic_load_explicit(&r->claim, memory_order_acquire);
    for (;;) {
        if ((uint32_t)(c >> 32) != g) return 0;
        const uint32_t i = (uint32_t)c, end = atomic_load_explicit(&r->end, memory_order_relaxed);
        if (me >= atomic_load_explicit(&p->nt, memory_order_relaxed)) return 0;
        if (i >= end) return 1;
        const uint32_t n = atomic_load_explicit(&p->nchunks, memory_order_relaxed);
        const mlaf_cpu_range_fn fn = atomic_load_explicit(&p->fn, memory_order_relaxed);
        void *arg = atomic_load_explicit(&p->arg, memory_order_relaxed);
        const int64_t items = atomic_load_explicit(&p->items, memory_order_relaxed);
        const int64_t chunk = atomic_load_explicit(&p->chunk, memory_order_relaxed);
        if (!atomic_compare_exchange_weak_explicit(&r->claim, &c, c + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue; /* c reloaded: another claim, or a later call */
        const int64_t lo = (int64_t)i * chunk, hi = lo + chunk < items ? lo + chunk : items;
        const int64_t s = fn(arg, lo, hi, me);
        if (s) atomic_fetch_add_explicit(&p->sum, s, memory_order_relaxed);
        /* release: the chunk's stores and its count before the caller sees it finished */
        if (atomic_fetch_add(&p->done, 1) + 1 == n && atomic_load(&p->waiting)) futex_wake(&p->done, 1);
        c = atomic_load_explicit(&r->claim, memory_order_acquire);
    }
}

/* Participant `me`'s part of generation g: its home range, then what is left of the others'. */
static void run_chunks(mlaf_cpu_pool *p, uint32_t g, int me) {
    const int nt = atomic_load_explicit(&p->nt, memory_order_relaxed);
    if (me >= nt) return;
    for (int k = 0; k < nt; k++)
        if (!run_range(p, g, me, (me + k) % nt)) return;
}

static void *worker_main(void *v) {
    worker_arg *w = (worker_arg *)v;
    mlaf_cpu_pool *p = w->pool;
    uint32_t seen = w->seen;
    for (;;) {
        uint32_t g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
            if (++spins < SPIN_IDLE) {
                cpu_relax();
                continue;
            }
            atomic_fetch_add(&p->sleepers, 1);
            if (atomic_load(&p->gen) == seen) futex_wait(&p->gen, seen);
            atomic_fetch_sub(&p->sleepers, 1);
            spins = 0;
        }
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) return NULL;
        seen = g;
        run_chunks(p, g, w->index);
    }
}

/* The pool with at least `want` workers (fewer if a thread cannot be created); NULL if none. */
static mlaf_cpu_pool *pool_get(mlaf_context *ctx, int want) {
    mlaf_cpu_pool *p = (mlaf_cpu_pool *)ctx->cpu_pool;
    if (!p) {
        p = (mlaf_cpu_pool *)aligned_alloc(64, (sizeof *p + 63) / 64 * 64);
        if (!p) return NULL;
        memset((void *)p, 0, sizeof *p);
        for (int q = 0; q < MLAF_MAX_THREADS; q++) atomic_init(&p->range[q].claim, 0), atomic_init(&p->range[q].end, 0);
        atomic_init(&p->done, 0);
        atomic_init(&p->waiting, 0);
        atomic_init(&p->gen, 0);
        atomic_init(&p->sleepers, 0);
        atomic_init(&p->stop, 0);
        atomic_init(&p->sum, 0);
        ctx->cpu_pool = p;
    }
    while (p->nworkers < want) {
        worker_arg *w = &p->wa[p->nworkers];
        w->pool = p;
        w->index = p->nworkers + 1;
        w->seen = atomic_load(&p->gen);
        if (pthread_create(&p->th[p->nworkers], NULL, worker_main, w) != 0) break;
        p->nworkers++;
    }
    return p;
}

void mlaf_cpu_pool_free(mlaf_context *ctx) {
    mlaf_cpu_pool *p = ctx ? (mlaf_cpu_pool *)ctx->cpu_pool : NULL;
    if (!p) return;
    atomic_store_explicit(&p->stop, 1, memory_order_release);
    atomic_fetch_add(&p->gen, 1);
    futex_wake(&p->gen, INT_MAX);
    for (int i = 0; i < p->nworkers; i++) pthread_join(p->th[i], NULL);
    free(p);
    ctx->cpu_pool = NULL;
}

int mlaf_cpu_threads_for(const mlaf_context *ctx, int64_t items, int64_t bytes) {
    int64_t nt = bytes / MLAF_PAR_BYTES_PER_THREAD;
    const int64_t per_item = items > 0 && bytes / items > 0 ? bytes / items : 1;
    const int64_t chunk = MLAF_PAR_CHUNK_BYTES / per_item > 0 ? MLAF_PAR_CHUNK_BYTES / per_item : 1;
    const int64_t nchunks = items > 0 ? (items + chunk - 1) / chunk : 0;
    if (nt > ctx->threads) nt = ctx->threads;
    if (nt > nchunks) nt = nchunks;
    return nt > 1 ? (int)nt : 1;
}

int64_t mlaf_cpu_parallel_for(const mlaf_context *cctx, int64_t items, int64_t bytes, mlaf_cpu_range_fn fn,
                              void *arg) {
    if (items <= 0) return 0;
    const int nt = mlaf_cpu_threads_for(cctx, items, bytes);
    if (nt == 1) return fn(arg, 0, items, 0);
    /* The pool is the context's own state, created here on first use; the context itself was
     * allocated non-const (mlaf_context_create), and one context serves one call at a time. */
    mlaf_context *ctx = (mlaf_context *)cctx;
    mlaf_cpu_pool *p = pool_get(ctx, nt - 1); /* workers 1 .. nt-1; more only when a call needs them */
    if (!p || p->nworkers == 0) return fn(arg, 0, items, 0);
    const int64_t per_item = bytes / items > 0 ? bytes / items : 1;
    int64_t chunk = MLAF_PAR_CHUNK_BYTES / per_item > 0 ? MLAF_PAR_CHUNK_BYTES / per_item : 1;
    if ((items + chunk - 1) / chunk > UINT32_MAX / 2) chunk = (items + UINT32_MAX / 2 - 1) / (UINT32_MAX / 2);
    const uint32_t nchunks = (uint32_t)((items + chunk - 1) / chunk);

    /* publish: the previous call's claim words closed under the new generation (a worker still in
     * that call fails its CAS from here on, before it could pair an old word with this call's
     * fields), the description, the claim words (release), then the generation */
    const uint32_t g = atomic_load_explicit(&p->gen, memory_order_relaxed) + 1;
    for (int q = 0; q < p->last_nt; q++)
        atomic_store_explicit(&p->range[q].claim, (uint64_t)g << 32 | UINT32_MAX, memory_order_seq_cst);
    p->last_nt = nt;
    atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&p->arg, arg, memory_order_relaxed);
    atomic_store_explicit(&p->items, items, memory_order_relaxed);
    atomic_store_explicit(&p->chunk, chunk, memory_order_relaxed);
    atomic_store_explicit(&p->nchunks, nchunks, memory_order_relaxed);
    atomic_store_explicit(&p->nt, nt, memory_order_relaxed);
    atomic_store_explicit(&p->sum, 0, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->waiting, 0, memory_order_relaxed);
    for (int q = 0; q < nt; q++) { /* the home ranges: contiguous, as even as the chunks allow */
        const uint32_t s = (uint32_t)((uint64_t)nchunks * (uint64_t)q / (uint64_t)nt);
        atomic_store_explicit(&p->range[q].end, (uint32_t)((uint64_t)nchunks * (uint64_t)(q + 1) / (uint64_t)nt),
                              memory_order_relaxed);
        atomic_store_explicit(&p->range[q].claim, (uint64_t)g << 32 | s, memory_order_release);
    }
    atomic_store(&p->gen, g);
    if (atomic_load(&p->sleepers)) futex_wake(&p->gen, INT_MAX);

    run_chunks(p, g, 0);

    /* wait for the chunks others claimed (none unclaimed is left) */
    int spins = 0;
    uint32_t d;
    while ((d = atomic_load_explicit(&p->done, memory_order_acquire)) != nchunks) {
        if (++spins < SPIN_WAIT) {
            cpu_relax();
            continue;
        }
        if (spins < SPIN_WAIT + YIELD_WAIT) {
            sched_yield();
            continue;
        }
        atomic_store(&p->waiting, 1);
        if ((d = atomic_load(&p->done)) != nchunks) futex_wait(&p->done, d);
    }
    return atomic_load_explicit(&p->sum, memory_order_relaxed);
}
