/*
 * cpu_norm_bench.c — micro-benchmark of the CPU split_qk_norm / mla_kv_cache paths against
 * a parallel memcpy of the same bytes (read + written) and against the unfused passes
 * (split copy, then an RMSNorm pass per part). Not built by CMake; build by hand:
 *
 *   cc -O2 -fopenmp -Iinclude -Isrc dev/cpu_norm_bench.c build-a/libmlafuse.a -lm \
 *      -o /tmp/cpu_norm_bench && /tmp/cpu_norm_bench [T] [preset]
 *
 * Prints GB/s and the fraction of memcpy bandwidth for every ISA path and thread count.
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "internal.h"

static double now(void) { return omp_get_wtime(); }

static double best_of(int reps, void (*fn)(void *), void *arg) {
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        fn(arg);
        double t = now() - t0;
        if (t < best) best = t;
    }
    return best;
}

typedef struct cpy {
    char *dst;
    const char *src;
    size_t n;
    int threads;
} cpy;

static void run_memcpy(void *a) {
    cpy *c = (cpy *)a;
#pragma omp parallel num_threads(c->threads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        size_t lo = c->n * (size_t)t / (size_t)nt, hi = c->n * (size_t)(t + 1) / (size_t)nt;
        memcpy(c->dst + lo, c->src + lo, hi - lo);
    }
}

typedef struct op {
    mlaf_context *ctx;
    mlaf_split_qk_norm_params p;
    mlaf_tensor lat, wq, wkv, q, kn, kp;
} op;

static void run_split(void *a) {
    op *o = (op *)a;
    mlaf_status s = mlaf_split_qk_norm(o->ctx, &o->p, &o->lat, &o->wq, &o->wkv, &o->q, &o->kn, &o->kp);
    if (s != MLAF_OK) printf("error %s\n", mlaf_context_last_error(o->ctx));
}

/* Unfused: split into three buffers, then normalize q and k_nope in place (reading them
 * again), the way separate kernels would. */
static void run_unfused(void *a) {
    op *o = (op *)a;
    const int64_t T = o->lat.shape[0];
    const int Q = o->p.q_lora_rank, C = o->p.kv_lora_rank, R = o->p.rope_dim, W = Q + C + R;
    const uint16_t *L = o->lat.data;
    uint16_t *q = o->q.data, *k = o->kn.data, *pe = o->kp.data;
    const uint16_t *wq = o->wq.data, *wk = o->wkv.data;
#pragma omp parallel for num_threads(o->ctx->threads) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        memcpy(q + t * Q, L + t * W, (size_t)Q * 2);
        memcpy(k + t * C, L + t * W + Q, (size_t)C * 2);
        memcpy(pe + t * R, L + t * W + Q + C, (size_t)R * 2);
    }
    for (int part = 0; part < 2; part++) {
        uint16_t *x = part ? k : q;
        const uint16_t *w = part ? wk : wq;
        int n = part ? C : Q;
#pragma omp parallel for num_threads(o->ctx->threads) schedule(static)
        for (int64_t t = 0; t < T; t++) {
            uint16_t *row = x + t * n;
            float ss = 0;
            for (int i = 0; i < n; i++) {
                float v = mlaf_bf16_to_f32(row[i]);
                ss += v * v;
            }
            float r = 1.0f / sqrtf(ss / n + 1e-5f);
            for (int i = 0; i < n; i++)
                row[i] = mlaf_f32_to_bf16(mlaf_bf16_to_f32(row[i]) * r * mlaf_bf16_to_f32(w[i]));
        }
    }
}

static void *fill(size_t bytes) {
    unsigned char *p = malloc(bytes);
    for (size_t i = 0; i < bytes; i += 2) { p[i] = (unsigned char)(i * 7); p[i + 1] = 0x3f; }
    return p;
}

int main(int argc, char **argv) {
    int64_t T = argc > 1 ? atoll(argv[1]) : 65536;
    const mlaf_model_config *cfg = mlaf_preset_find(argc > 2 ? argv[2] : "glm-4.7-flash");
    const int Q = cfg->q_lora_rank, C = cfg->kv_lora_rank, R = cfg->qk_rope_head_dim, W = Q + C + R;
    const int reps = argc > 3 ? atoi(argv[3]) : 9;
    size_t in_b = (size_t)(T * W) * 2, out_b = in_b, moved = in_b + out_b;
    void *lat = fill(in_b), *wq = fill((size_t)Q * 2 + 2), *wk = fill((size_t)C * 2);
    void *q = fill((size_t)(T * Q) * 2 + 2), *kn = fill((size_t)(T * C) * 2), *kp = fill((size_t)(T * R) * 2 + 2);
    void *dst = fill(in_b);
    int ncore = mlaf_cpu_core_count();
    printf("preset %s, T = %lld, bf16: %.1f MB read + %.1f MB written per call, best of %d\n",
           cfg->name, (long long)T, in_b / 1e6, out_b / 1e6, reps);
    /* memcpy and the op alternate, best of `reps` each, so that a machine busy with other work
     * slows both alike. */
    for (int th = 1; th <= ncore; th *= 2) {
        cpy c = {dst, lat, in_b, th};
        op o;
        mlaf_context_create(&o.ctx, MLAF_BACKEND_CPU);
        mlaf_context_set_threads(o.ctx, th);
        o.p = (mlaf_split_qk_norm_params){Q, C, R, 1e-5f, 1e-5f};
        o.lat = mlaf_tensor_2d(lat, MLAF_BF16, T, W, W);
        o.wq = mlaf_tensor_1d(wq, MLAF_BF16, Q);
        o.wkv = mlaf_tensor_1d(wk, MLAF_BF16, C);
        o.q = mlaf_tensor_2d(q, MLAF_BF16, T, Q, Q);
        o.kn = mlaf_tensor_2d(kn, MLAF_BF16, T, C, C);
        o.kp = mlaf_tensor_2d(kp, MLAF_BF16, T, R, R);
        double tm = 1e30;
        for (int isa = MLAF_CPU_ISA_SCALAR; isa < MLAF_CPU_ISA_COUNT_; isa++) {
            if (mlaf_context_set_cpu_isa(o.ctx, (mlaf_cpu_isa)isa) != MLAF_OK) continue;
            run_split(&o);
            double t = 1e30;
            for (int r = 0; r < reps; r++) {
                double a = best_of(1, run_memcpy, &c), b = best_of(1, run_split, &o);
                if (a < tm) tm = a;
                if (b < t) t = b;
            }
            printf("threads %d: split_qk_norm %-7s %8.1f us  %.2f GB/s  %.0f%% of memcpy (%.2f GB/s)\n", th,
                   mlaf_cpu_isa_name((mlaf_cpu_isa)isa), t * 1e6, moved / t / 1e9, 100.0 * tm / t,
                   moved / tm / 1e9);
        }
        double tu = best_of(3, run_unfused, &o);
        printf("threads %d: unfused passes  %8.1f us\n", th, tu * 1e6);
        mlaf_context_free(o.ctx);
    }
    return 0;
}
