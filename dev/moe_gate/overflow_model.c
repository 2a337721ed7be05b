/*
 * overflow_model.c — which tokens of `mlafuse bench`'s router rows leave the solo kernel's fast
 * path: a host model of its steps 1-4 (moe_gate_solo.cuh) on the bench's own logits and bias.
 *
 *   cc -O2 -Iinclude -Isrc dev/moe_gate/overflow_model.c -lm -o /tmp/overflow_model
 *   /tmp/overflow_model T [f32|bf16] [deepseek-v3|glm-4.7-flash]
 *
 * The rows are drawn as tools/bench_cmd.c draws them (seed 0x6d6c6166 + T, logits uniform in
 * [-4, 4) rounded to the dtype, then the bias uniform in [-0.05, 0.05)); s = 1 / (1 + exp(-x))
 * in f32 (the kernel's sigmoid differs by ~1e-7, so a borderline count may differ by one).
 * Per token: the best two c of each unit of VB experts, groups by top-2 sum, tau = the k-th
 * largest best-two value of the kept units, the candidates c >= tau of kept groups; more than
 * the list holds (kCap) sends the token to the exact path. Prints the count of such tokens and
 * the largest candidate count. On the bench's rows, DeepSeek-V3 f32 T = 63360 / 101376 / 126720
 * have one each (the T that were 2x slow while the exact path ran on one lane); 50688, 76032,
 * 88704, 114048 and 131072 none; GLM-4.7-Flash T = 32768 one.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"

/* the bench's generator (mlaf_rng of src/ref/verify_util.c: splitmix64), standalone here */
typedef struct {
    uint64_t s;
} rng64;
static double uniform(rng64 *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (double)((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
}

static float draw(rng64 *r, double lo, double hi, mlaf_dtype dt) {
    float f = (float)(lo + (hi - lo) * uniform(r));
    return dt == MLAF_BF16 ? mlaf_bf16_to_f32(mlaf_f32_to_bf16(f)) : f;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s T [f32|bf16] [deepseek-v3|glm-4.7-flash]\n", argv[0]);
        return 2;
    }
    const int64_t T = atoll(argv[1]);
    const mlaf_dtype dt = argc > 2 && !strcmp(argv[2], "bf16") ? MLAF_BF16 : MLAF_F32;
    const int glm = argc > 3 && !strcmp(argv[3], "glm-4.7-flash");
    /* the solo kernel's shapes (try_solo): E, groups, kept groups, unit, k, list entries */
    const int E = glm ? 64 : 256, G = glm ? 1 : 8, KG = glm ? 1 : 4, VB = glm ? 8 : 16;
    const int K = glm ? 4 : 8, CAP = glm ? 8 : 16, P = E / G, U = E / VB;
    if (T < 1) return 2;
    float *x = malloc(sizeof(float) * (size_t)(T * E));
    if (!x) return 1;
    rng64 r = {(0x6d6c6166ull + (uint64_t)T) ^ 0x9E3779B97F4A7C15ull}; /* mlaf_rng_seed */
    for (int64_t i = 0; i < T * E; i++) x[i] = draw(&r, -4.0, 4.0, dt);
    float b[256];
    for (int e = 0; e < E; e++) b[e] = draw(&r, -0.05, 0.05, MLAF_F32);
    int64_t over = 0;
    int maxn = 0;
    for (int64_t t = 0; t < T; t++) {
        float c[256], tv[64];
        int kept[8];
        for (int e = 0; e < E; e++) c[e] = 1.0f / (1.0f + expf(-x[t * E + e])) + b[e];
        for (int u = 0; u < U; u++) {
            float m1 = -INFINITY, m2 = -INFINITY;
            for (int i = 0; i < VB; i++) {
                m2 = fmaxf(m2, fminf(m1, c[u * VB + i]));
                m1 = fmaxf(m1, c[u * VB + i]);
            }
            tv[2 * u] = m1, tv[2 * u + 1] = m2;
        }
        for (int g = 0; g < G; g++) kept[g] = 1;
        if (G > 1) {
            float gs[8];
            for (int g = 0; g < G; g++) {
                float m1 = -INFINITY, m2 = -INFINITY;
                for (int e = g * P; e < g * P + P; e++) {
                    m2 = fmaxf(m2, fminf(m1, c[e]));
                    m1 = fmaxf(m1, c[e]);
                }
                gs[g] = m1 + m2;
            }
            for (int g = 0; g < G; g++) {
                int better = 0;
                for (int h = 0; h < G; h++) better += gs[h] > gs[g] || (gs[h] == gs[g] && h < g);
                kept[g] = better < KG;
            }
            for (int u = 0; u < U; u++)
                if (!kept[u * VB / P]) tv[2 * u] = tv[2 * u + 1] = -INFINITY;
        }
        for (int i = 0; i < K; i++) /* tau: the K-th largest of tv (partial selection sort) */
            for (int j = i + 1; j < 2 * U; j++)
                if (tv[j] > tv[i]) {
                    const float q = tv[i];
                    tv[i] = tv[j], tv[j] = q;
                }
        int n = 0;
        for (int e = 0; e < E; e++) n += kept[e / P] && c[e] >= tv[K - 1];
        if (n > maxn) maxn = n;
        over += n > CAP;
    }
    printf("%s %s T=%lld: %lld tokens over the %d-entry list, at most %d candidates\n",
           glm ? "glm-4.7-flash" : "deepseek-v3", dt == MLAF_BF16 ? "bf16" : "f32", (long long)T,
           (long long)over, CAP, maxn);
    free(x);
    return 0;
}
