/*
 * bench_cpu.c — CPU timing for `mlafuse bench`.
 *
 * 1. Warm-up: two calls (page faults, thread pool start-up, caches) not timed.
 * 2. Each sample times one call with clock_gettime(CLOCK_MONOTONIC); calls rotate over the
 *    input/output sets the driver allocated, so at mid-size T the data of one call is not
 *    left hot in the last-level cache by the previous one (at large T one set alone is much
 *    larger than the cache).
 * 3. Median and p10 / p90 / min / max of the samples.
 * The copy reference is memcpy by all threads, each on its own contiguous slice of a buffer
 * several times the last-level cache, counting the bytes read plus the bytes written.
 */
#define _GNU_SOURCE /* sysconf(_SC_LEVEL3_CACHE_SIZE), clock_gettime */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "bench.h"

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(const double *sorted, int n, double p) {
    double pos = p * (n - 1);
    int lo = (int)pos;
    int hi = lo + 1 < n ? lo + 1 : lo;
    double f = pos - lo;
    return sorted[lo] * (1.0 - f) + sorted[hi] * f;
}

void bench_stats_from(double *us, int n, int calls_per_sample, bench_stats *out) {
    memset(out, 0, sizeof *out);
    out->calls_per_sample = calls_per_sample;
    if (n <= 0) return;
    qsort(us, (size_t)n, sizeof *us, cmp_double);
    out->samples = n;
    out->median_us = pct(us, n, 0.5);
    out->p10_us = pct(us, n, 0.1);
    out->p90_us = pct(us, n, 0.9);
    out->min_us = us[0];
    out->max_us = us[n - 1];
}

size_t bench_cpu_llc_bytes(void) {
    long v = -1;
#ifdef _SC_LEVEL3_CACHE_SIZE
    v = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (v <= 0) v = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    return v > 0 ? (size_t)v : ((size_t)32 << 20);
}

int bench_cpu_time(bench_call_fn fn, void *arg, int nsets, int reps, bench_stats *out, char *err,
                   size_t cap) {
    if (nsets < 1) nsets = 1;
    if (reps < 1) reps = 1;
    for (int w = 0; w < 2; w++)
        if (fn(arg, w % nsets, err, cap)) return -1;
    double *us = (double *)malloc(sizeof(double) * (size_t)reps);
    if (!us) {
        snprintf(err, cap, "out of host memory");
        return -1;
    }
    for (int i = 0; i < reps; i++) {
        int set = (i + 2) % nsets;
        double t0 = now_us();
        int r = fn(arg, set, err, cap);
        double t1 = now_us();
        if (r) {
            free(us);
            return -1;
        }
        us[i] = t1 - t0;
    }
    bench_stats_from(us, reps, 1, out);
    free(us);
    return 0;
}

/* The calling OpenMP thread's share [lo, hi) of `bytes` (the whole range outside a team). */
static void thread_slice(size_t bytes, size_t *lo, size_t *hi) {
    int id = 0, n = 1;
#ifdef _OPENMP
    id = omp_get_thread_num();
    n = omp_get_num_threads();
#endif
    *lo = bytes * (size_t)id / (size_t)n;
    *hi = bytes * (size_t)(id + 1) / (size_t)n;
}

double bench_cpu_copy_gbps(int threads, size_t bytes, int reps) {
    if (threads < 1) threads = 1;
    unsigned char *src = (unsigned char *)malloc(bytes);
    unsigned char *dst = (unsigned char *)malloc(bytes);
    if (!src || !dst) {
        free(src);
        free(dst);
        return 0.0;
    }
    /* First touch by the same threads and slices that copy, so pages are placed as they
     * will be used (NUMA) and no page fault is timed. */
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
#endif
    {
        size_t lo, hi;
        thread_slice(bytes, &lo, &hi);
        memset(src + lo, 1, hi - lo);
        memset(dst + lo, 0, hi - lo);
    }
    double best = 0.0;
    double *us = (double *)malloc(sizeof(double) * (size_t)(reps > 0 ? reps : 1));
    int n_us = 0;
    for (int r = -1; r < reps; r++) {
        double t0 = now_us();
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
#endif
        {
            size_t lo, hi;
            thread_slice(bytes, &lo, &hi);
            memcpy(dst + lo, src + lo, hi - lo);
        }
        double t1 = now_us();
        if (r >= 0 && us) us[n_us++] = t1 - t0;
    }
    if (us && n_us > 0) {
        bench_stats st;
        bench_stats_from(us, n_us, 1, &st);
        best = st.median_us > 0 ? 2.0 * (double)bytes / (st.median_us * 1e3) : 0.0;
    }
    free(us);
    free(src);
    free(dst);
    return best;
}

const char *bench_cpu_name(void) {
    static char name[128] = "";
    if (name[0]) return name;
    snprintf(name, sizeof name, "cpu");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return name;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            if (c) {
                c++;
                while (*c == ' ' || *c == '\t') c++;
                size_t n = strcspn(c, "\n");
                if (n >= sizeof name) n = sizeof name - 1;
                memcpy(name, c, n);
                name[n] = '\0';
            }
            break;
        }
    }
    fclose(f);
    return name;
}
