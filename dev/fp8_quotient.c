/*
 * fp8_quotient.c — checks the two-fma quotient of mlaf_quant_e4m3 (src/cuda/row_writers_fp8.cuh)
 * against the IEEE division it replaces: for a scale s = RN(a / 448) in [2^-97, 2^126) and a value
 * |x| <= a (or NaN), q0 = RN(x r) with r = RN(1 / s), q = q0 when q0 is zero, else
 * RN(q0 + RN-exact(x - q0 s) r) by two fmas; the e4m3 byte of q must be that of RN(x / s).
 * Pass 1: every bf16 x against every positive finite bf16 a; pass 2: 20000 random f32 a, each
 * with 65536 random f32 x in [-a, a]. Not built by CMake; build by hand (no FMA contraction):
 *
 *   cc -O2 -std=c11 -ffp-contract=off -Iinclude -Iinclude/mlafuse -Isrc dev/fp8_quotient.c -lm \
 *      -o /tmp/fp8_quotient && /tmp/fp8_quotient
 *
 * Prints the pairs tried, how many f32 quotients differ (where x - q0 s underflows), the largest
 * such |x / s| and how many e4m3 bytes differ (must be 0; exit status 1 otherwise).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "fp8.h"

static float f_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t u_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static uint64_t rs = 88172645463325252ull;
static uint32_t rnd(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)rs;
}

int main(void) {
    volatile float k448 = 448.0f, one = 1.0f;
    uint64_t n = 0, f32_diff = 0, e4_diff = 0, outside = 0;
    float widest = 0.0f;
    for (int pass = 0; pass < 2; pass++) {
        const int na = pass == 0 ? 0x7f80 : 20000;
        for (int ai = 1; ai < na; ai++) {
            const float a = pass == 0 ? f_of((uint32_t)ai << 16) : f_of(rnd() % 0x7f800000u);
            const float s = a / k448;
            const uint32_t ef = u_of(s) >> 23;
            if (ef < 30u || ef > 252u) { /* the division's range */
                outside++;
                continue;
            }
            const float r = one / s;
            for (int xi = 0; xi < 65536; xi++) {
                const float x = pass == 0 ? f_of((uint32_t)xi << 16)
                                          : (float)((double)a * ((double)(int32_t)rnd() / 2147483648.0));
                if (!(fabsf(x) <= a) && !isnan(x)) continue;
                volatile float xv = x;
                const float ref = xv / s;
                const float q0 = xv * r;
                const float q = q0 == 0.0f ? q0 : fmaf(fmaf(-q0, s, xv), r, q0);
                n++;
                if (u_of(q) == u_of(ref) || (isnan(q) && isnan(ref))) continue;
                f32_diff++;
                if (fabsf(ref) > widest) widest = fabsf(ref);
                if (mlaf_f32_to_e4m3(q) != mlaf_f32_to_e4m3(ref)) {
                    if (e4_diff < 10) printf("e4m3 differs: x = %a, s = %a, x / s = %a, q = %a\n", x, s, ref, q);
                    e4_diff++;
                }
            }
        }
    }
    printf("pairs %llu; f32 quotients differ %llu (largest |x / s| %a); e4m3 bytes differ %llu; scales "
           "left to the division %llu\n",
           (unsigned long long)n, (unsigned long long)f32_diff, widest, (unsigned long long)e4_diff,
           (unsigned long long)outside);
    return e4_diff != 0;
}
