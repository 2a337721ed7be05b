/*
 * test_fp8.c — the shared fp8 numerics (src/fp8.h) against references written from the format's
 * definition: every f32 whose magnitude lies in [2^-12, 2^10) (both signs; a stride in quick
 * mode) and samples of the rest encode to the nearest finite e4m3 value with ties to the even
 * code, saturating at 448; NaN and the infinities as docs/kv_formats.md says; every code decodes exactly and
 * re-encodes to itself; ceil_log2 and the UE8M0 exponent on powers of two and their neighbours, and
 * the UE8M0 exponent against its definition's division for every f32 of positive sign (a stride in
 * quick mode).
 */
#include <math.h>

#include "../src/fp8.h"
#include "testlib.h"

static double val[127]; /* the finite non-negative e4m3 values, codes 0 .. 0x7E (increasing) */

static double e4m3_value(int c) {
    const int e = (c >> 3) & 15, m = c & 7;
    return e == 0 ? ldexp(m / 8.0, -6) : ldexp(1.0 + m / 8.0, e - 7);
}

/* nearest finite code to |x| (ties to the even code), with x's sign */
static uint8_t ref_encode(float x) {
    if (isnan(x)) return 0x7f;
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    const double a = fabs((double)x);
    if (a >= 464.0) return sign | 0x7e;
    int lo = 0, hi = 126;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (val[mid] <= a) lo = mid;
        else hi = mid;
    }
    int c;
    if (a >= val[hi]) c = hi;
    else {
        const double dl = a - val[lo], dh = val[hi] - a;
        c = dl < dh ? lo : dh < dl ? hi : (lo % 2 == 0 ? lo : hi);
    }
    return (uint8_t)(sign | c);
}

int main(void) {
    for (int c = 0; c < 127; c++) val[c] = e4m3_value(c);
    const int quick = tl_quick();
    /* 1. encode, exhaustively over the interesting exponents */
    long bad = 0, n = 0;
    const uint32_t step = quick ? 61 : 1;
    for (uint32_t be = 127 - 12; be < 127 + 10; be++)
        for (uint32_t s = 0; s < 2; s++)
            for (uint32_t m = 0; m < (1u << 23); m += step) {
                const float x = mlaf_bits_f32((s << 31) | (be << 23) | m);
                n++;
                if (mlaf_f32_to_e4m3(x) != ref_encode(x)) bad++;
            }
    tl_case(bad == 0, "FP8(e4m3 encode, |x| in [2^-12, 2^10))", "%ld of %ld values differ from the nearest-even reference", bad, n);
    /* the rest: samples, zeros, infinities, NaNs */
    bad = n = 0;
    mlaf_rng rng;
    mlaf_rng_seed(&rng, 7);
    for (int i = 0; i < 2000000; i++) {
        const float x = mlaf_bits_f32((uint32_t)mlaf_rng_u64(&rng));
        n++;
        if (mlaf_f32_to_e4m3(x) != ref_encode(x)) bad++;
    }
    const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 448.0f, 464.0f, -464.0f, 463.99997f,
                             1e30f, -1e30f, 0x1p-10f, -0x1p-10f, 0x1.000002p-10f, 0x1p-9f, 0x1.8p-9f, 0x1p-149f};
    const uint8_t want[] = {0x00, 0x80, 0x7e, 0xfe, 0x7f, 0x7f, 0x7e, 0x7e, 0xfe, 0x7e,
                            0x7e, 0xfe, 0x00, 0x80, 0x01, 0x01, 0x02, 0x00};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) {
        n++;
        if (mlaf_f32_to_e4m3(special[i]) != want[i]) bad++;
    }
    tl_case(bad == 0, "FP8(e4m3 encode, random bits and special values)", "%ld of %ld differ", bad, n);
    /* 2. decode: exact values, and encode(decode(c)) == c */
    bad = 0;
    for (int c = 0; c < 256; c++) {
        const float f = mlaf_e4m3_to_f32((uint8_t)c);
        if ((c & 0x7f) == 0x7f) {
            if (!isnan(f)) bad++;
            continue;
        }
        const double v = (c & 0x80 ? -1.0 : 1.0) * e4m3_value(c & 0x7f);
        if ((double)f != v || mlaf_f32_to_e4m3(f) != (c == 0x80 ? 0x80 : c)) bad++;
    }
    tl_case(bad == 0, "FP8(e4m3 decode, all 256 codes)", "%ld codes wrong", bad);
    /* 3. ceil_log2 and the UE8M0 exponent */
    bad = 0;
    for (int e = -126; e <= 127; e++) {
        const float p = ldexpf(1.0f, e);
        if (mlaf_ceil_log2_f32(p) != e) bad++;
        if (e < 127 && mlaf_ceil_log2_f32(nextafterf(p, INFINITY)) != e + 1) bad++;
    }
    if (mlaf_ceil_log2_f32(INFINITY) != 128) bad++;
    const float amaxes[] = {0.0f, 1e-5f, 1e-4f, 0.5f, 1.0f, 448.0f, 449.0f, 896.0f, 3e4f, NAN};
    for (size_t i = 0; i < sizeof amaxes / sizeof amaxes[0]; i++) {
        const int e = mlaf_ue8m0_exponent(amaxes[i]);
        const double a = isnan(amaxes[i]) || amaxes[i] < 1e-4f ? (double)(1e-4f / 448.0f) : (double)(amaxes[i] / 448.0f);
        if (!(ldexp(1.0, e) >= a && ldexp(1.0, e - 1) < a)) bad++;
    }
    tl_case(bad == 0, "FP8(ceil_log2, ue8m0 exponent)", "%ld wrong", bad);
    /* 4. the UE8M0 exponent (computed without a division) against ceil_log2 of the correctly
     * rounded max(amax, 1e-4) / 448: every non-negative f32 and NaN bit pattern (a stride in
     * quick mode), a stride of the negative ones (all of them the floor's) */
    bad = n = 0;
    for (uint64_t u = 0; u <= 0xffffffffu; u += u < 0x80000000u && !quick ? 1 : 4099) {
        const float a = mlaf_bits_f32((uint32_t)u), fl = a > 1e-4f ? a : 1e-4f;
        n++;
        if (mlaf_ue8m0_exponent(a) != mlaf_ceil_log2_f32(fl / 448.0f)) bad++;
    }
    const uint32_t edge[] = {0, 1, 0x5fffff, 0x600000, 0x600001, 0x7fffff}; /* m = 1.75: a / 448 = 2^k */
    for (uint32_t be = 0; be < 256; be++)
        for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) {
            const float a = mlaf_bits_f32((be << 23) | edge[i]), fl = a > 1e-4f ? a : 1e-4f;
            n++;
            if (mlaf_ue8m0_exponent(a) != mlaf_ceil_log2_f32(fl / 448.0f)) bad++;
        }
    tl_case(bad == 0, "FP8(ue8m0 exponent without the division, all f32)", "%ld of %ld differ", bad, n);
    return tl_finish();
}
