/*
 * test_norm_kern.c — the CPU row kernels of every instruction-set path give the same bits as
 * the portable path, whichever path the machine would pick by itself. The op tests run each
 * path through the public API, but on a CPU with AVX512_BF16 the AVX-512 path always takes
 * its VCVTNE2PS2BF16 table, so the plain AVX-512 bf16 rounding would only ever see the blocks
 * that hold denormals; here every table is called directly:
 *   scale  y = (x * rstd) * w to one or two outputs, every dtype pairing the driver uses,
 *          lengths around the vector widths, unaligned rows, streamed and plain stores, rows
 *          with NaN / inf and rows whose outputs are denormal;
 *   copy   the k_pe bytes, streamed and plain, aligned or not;
 *   rope   both styles, R from 2 to 128;
 *   convert fp32 values (NaN, inf, tiny ones too) to every dtype, streamed and plain, at
 *          aligned and unaligned addresses, every length up to 100 and a few longer ones;
 *   round_amax, e4m3  the fp8 writers' steps: every e4m3 value, the ties between them and the
 *          floats beside both, bit patterns over the whole f32 range, specials.
 * Bytes past the row must stay untouched. One case line per table x function x dtypes.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/norm_kern.h"
#include "fp8.h"
#include "half.h"
#include "testlib.h"

enum { MAXN = 1600, PAD = 64, GUARD = 0x5a };

typedef struct {
    const char *name;
    const mlaf_norm_kern *k;
} table;

static int tables(table *t) {
    int n = 0;
    t[n++] = (table){"scalar", &mlaf_norm_kern_scalar};
#if defined(MLAF_HAVE_X86_PATHS)
    if (mlaf_cpu_isa_supported(MLAF_CPU_ISA_AVX2)) t[n++] = (table){"avx2", &mlaf_norm_kern_avx2};
    if (mlaf_cpu_isa_supported(MLAF_CPU_ISA_AVX512)) {
        t[n++] = (table){"avx512", &mlaf_norm_kern_avx512};
        if (mlaf_norm_avx512_bf16_supported())
            t[n++] = (table){"avx512_bf16", &mlaf_norm_kern_avx512_bf16};
        else
            tl_skip("NORM_KERN(table=avx512_bf16)", "this CPU has no AVX512_BF16");
    } else {
        tl_skip("NORM_KERN(table=avx512)", "this CPU has no AVX-512");
    }
#endif
    return n;
}

/* x values: normal(0, 1.5), with NaN / +-inf sprinkled in some rows and whole rows of tiny
 * values (their outputs are denormal in every dtype that has denormals). */
static void fill_row(mlaf_rng *rng, void *x, mlaf_dtype dt, int n, int kind) {
    mlaf_fill_normal(rng, x, dt, (size_t)n, 0.0, 1.5);
    if (kind == 1) {
        for (int i = 0; i < n; i += 7) mlaf_store_f32(x, dt, i, i % 3 ? NAN : (i % 2 ? INFINITY : -INFINITY));
    } else if (kind == 2) {
        const double tiny = dt == MLAF_F16 ? 3e-7 : 2e-39;
        for (int i = 0; i < n; i++) mlaf_store_f32(x, dt, i, (float)(tiny * (double)((i % 13) - 6)));
    }
}

static int bytes_equal(const unsigned char *a, const unsigned char *b, size_t n) {
    return memcmp(a, b, n) == 0;
}

static int guard_ok(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != GUARD) return 0;
    return 1;
}

/* One scale call on table k: outputs at out_off bytes past 64-byte aligned buffers. */
static void run_scale(const mlaf_norm_kern *k, const void *x, mlaf_dtype dt, int n, float rstd,
                      const float *w, unsigned char *o1, mlaf_dtype odt, unsigned char *o2,
                      mlaf_dtype o2dt, int stream, const void *pf) {
    k->scale(x, dt, n, rstd, w, o1, odt, o2, o2dt, stream, pf);
    if (stream) k->fence();
}

static void test_scale(const table *tb, int nt, int quick) {
    static const int lens[] = {1, 5, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 512, 768, 1536};
    static const mlaf_dtype dts[] = {MLAF_F32, MLAF_F16, MLAF_BF16};
    /* (out dtype, out2 dtype): same as x, two outputs, f32 next to x's dtype, no out2 */
    mlaf_rng rng;
    mlaf_rng_seed(&rng, 77);
    unsigned char *x = aligned_alloc(64, (MAXN + PAD) * 4);
    float *w = aligned_alloc(64, (MAXN + PAD) * 4);
    unsigned char *ref1 = aligned_alloc(64, (MAXN + PAD) * 4 + 64), *ref2 = aligned_alloc(64, (MAXN + PAD) * 4 + 64);
    unsigned char *got1 = aligned_alloc(64, (MAXN + PAD) * 4 + 64), *got2 = aligned_alloc(64, (MAXN + PAD) * 4 + 64);
    for (int ti = 1; ti < nt; ti++) {
        for (int d = 0; d < 3; d++) {
            const mlaf_dtype dt = dts[d];
            for (int combo = 0; combo < 4; combo++) {
                const mlaf_dtype odt = combo == 2 ? MLAF_F32 : dt;
                const mlaf_dtype o2dt = combo == 3 ? MLAF_F32 : dt;
                const int two = combo == 1 || combo == 3;
                long cases = 0, bad = 0;
                char first[160] = "";
                for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
                    const int n = lens[li];
                    for (int kind = 0; kind < 3; kind++) {
                        for (int variant = 0; variant < (quick ? 2 : 4); variant++) {
                            const int stream = variant & 1;
                            const int off = (variant & 2) ? 16 : 0; /* output bytes past a line */
                            const int xoff = (variant & 2) ? 1 : 0; /* input elements past a line */
                            const size_t esz = mlaf_dtype_size(dt);
                            fill_row(&rng, x + xoff * esz, dt, n, kind);
                            mlaf_fill_normal(&rng, w, MLAF_F32, (size_t)n, 1.0, 0.3);
                            const float rstd = (float)(0.5 + (double)(mlaf_rng_u64(&rng) % 1000) / 500.0);
                            const size_t b1 = (size_t)n * mlaf_dtype_size(odt);
                            const size_t b2 = (size_t)n * mlaf_dtype_size(o2dt);
                            memset(ref1, GUARD, b1 + off + PAD);
                            memset(got1, GUARD, b1 + off + PAD);
                            memset(ref2, GUARD, b2 + off + PAD);
                            memset(got2, GUARD, b2 + off + PAD);
                            const void *xs = x + xoff * esz;
                            run_scale(tb[0].k, xs, dt, n, rstd, w, ref1 + off, odt,
                                      two ? ref2 + off : NULL, o2dt, 0, NULL);
                            run_scale(tb[ti].k, xs, dt, n, rstd, w, got1 + off, odt,
                                      two ? got2 + off : NULL, o2dt, stream, stream ? xs : NULL);
                            int ok = bytes_equal(ref1, got1, b1 + off + PAD) &&
                                     guard_ok(got1 + off + b1, PAD) && guard_ok(got1, (size_t)off);
                            if (two)
                                ok = ok && bytes_equal(ref2, got2, b2 + off + PAD) &&
                                     guard_ok(got2 + off + b2, PAD);
                            cases++;
                            if (!ok && bad++ == 0)
                                snprintf(first, sizeof first, "first at n=%d kind=%d stream=%d off=%d",
                                         n, kind, stream, off);
                        }
                    }
                }
                char name[160];
                snprintf(name, sizeof name, "NORM_KERN(table=%s,fn=scale,x=%s,out=%s%s%s)", tb[ti].name,
                         mlaf_dtype_name(dt), mlaf_dtype_name(odt), two ? ",out2=" : "",
                         two ? mlaf_dtype_name(o2dt) : "");
                tl_case(bad == 0, name, "%ld of %ld calls differ from the portable path; %s", bad,
                        cases, first);
            }
        }
    }
    free(x);
    free(w);
    free(ref1);
    free(ref2);
    free(got1);
    free(got2);
}

static void test_copy(const table *tb, int nt) {
    static const size_t sizes[] = {1, 2, 63, 64, 65, 128, 192, 200, 4096};
    mlaf_rng rng;
    mlaf_rng_seed(&rng, 78);
    unsigned char *src = aligned_alloc(64, 8192), *dst = aligned_alloc(64, 8192);
    for (size_t i = 0; i < 8192; i++) src[i] = (unsigned char)mlaf_rng_u64(&rng);
    for (int ti = 1; ti < nt; ti++) {
        long cases = 0, bad = 0;
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            for (int variant = 0; variant < 4; variant++) {
                const int stream = variant & 1, off = (variant & 2) ? 8 : 0;
                const size_t n = sizes[si];
                memset(dst, GUARD, n + off + PAD);
                tb[ti].k->copy(src + off, n, dst + off, stream);
                if (stream) tb[ti].k->fence();
                cases++;
                if (memcmp(src + off, dst + off, n) || !guard_ok(dst, (size_t)off) ||
                    !guard_ok(dst + off + n, PAD))
                    bad++;
            }
        }
        char name[96];
        snprintf(name, sizeof name, "NORM_KERN(table=%s,fn=copy)", tb[ti].name);
        tl_case(bad == 0, name, "%ld of %ld copies wrong", bad, cases);
    }
    free(src);
    free(dst);
}

static void test_rope(const table *tb, int nt) {
    static const int32_t Rs[] = {2, 6, 16, 32, 34, 64, 128};
    static const mlaf_dtype dts[] = {MLAF_F32, MLAF_F16, MLAF_BF16};
    mlaf_rng rng;
    mlaf_rng_seed(&rng, 79);
    enum { MAXPOS = 37 };
    float *cs = malloc(sizeof(float) * MAXPOS * 128);
    unsigned char *x = malloc(128 * 4), *ref = malloc(128 * 4 + PAD), *got = malloc(128 * 4 + PAD);
    for (int ti = 1; ti < nt; ti++) {
        for (int d = 0; d < 3; d++) {
            long cases = 0, bad = 0;
            for (size_t ri = 0; ri < sizeof Rs / sizeof Rs[0]; ri++) {
                const int32_t R = Rs[ri];
                mlaf_rope_table_init(cs, MAXPOS, R, 10000.0);
                for (int style = 0; style < 2; style++) {
                    for (int pos = 0; pos < MAXPOS; pos += 6) {
                        const mlaf_rope_style st = style ? MLAF_ROPE_NEOX : MLAF_ROPE_INTERLEAVED;
                        mlaf_fill_normal(&rng, x, dts[d], (size_t)R, 0.0, 2.0);
                        const size_t b = (size_t)R * mlaf_dtype_size(dts[d]);
                        memset(ref, GUARD, b + PAD);
                        memset(got, GUARD, b + PAD);
                        tb[0].k->rope(x, dts[d], R, st, cs + (size_t)pos * R, ref, dts[d], NULL, dts[d]);
                        tb[ti].k->rope(x, dts[d], R, st, cs + (size_t)pos * R, got, dts[d], NULL, dts[d]);
                        cases++;
                        if (memcmp(ref, got, b + PAD)) bad++;
                    }
                }
            }
            char name[96];
            snprintf(name, sizeof name, "NORM_KERN(table=%s,fn=rope,dtype=%s)", tb[ti].name,
                     mlaf_dtype_name(dts[d]));
            tl_case(bad == 0, name, "%ld of %ld rotations differ from the portable path", bad, cases);
        }
    }
    free(cs);
    free(x);
    free(ref);
    free(got);
}

static void test_convert(const table *tb, int nt) {
    static const mlaf_dtype dts[] = {MLAF_F32, MLAF_F16, MLAF_BF16};
    mlaf_rng rng;
    mlaf_rng_seed(&rng, 80);
    enum { NMAX = 1100 };
    float *v = malloc(sizeof(float) * NMAX);
    unsigned char *ref = aligned_alloc(64, 4608), *got = aligned_alloc(64, 4608); /* NMAX * 4 + offset + PAD, in lines */
    for (int ti = 1; ti < nt; ti++) {
        for (int d = 0; d < 3; d++) {
            long cases = 0, bad = 0;
            for (int n = 1; n <= NMAX; n += n < 100 ? 1 : 333) {
                for (int kind = 0; kind < 3; kind++) {
                    fill_row(&rng, v, MLAF_F32, n, kind);
                    for (int variant = 0; variant < 4; variant++) {
                        /* off: an element-aligned address that is not a line's start */
                        const int stream = variant & 1, off = (variant & 2) ? 3 * (int)mlaf_dtype_size(dts[d]) : 0;
                        const size_t b = (size_t)n * mlaf_dtype_size(dts[d]);
                        memset(ref, GUARD, b + off + PAD);
                        memset(got, GUARD, b + off + PAD);
                        tb[0].k->convert(v, n, ref + off, dts[d], 0);
                        tb[ti].k->convert(v, n, got + off, dts[d], stream);
                        if (stream) tb[ti].k->fence();
                        cases++;
                        if (memcmp(ref, got, b + off + PAD)) bad++;
                    }
                }
            }
            char name[96];
            snprintf(name, sizeof name, "NORM_KERN(table=%s,fn=convert,out=%s)", tb[ti].name, mlaf_dtype_name(dts[d]));
            tl_case(bad == 0, name, "%ld of %ld conversions differ from the portable path", bad, cases);
        }
    }
    free(v);
    free(ref);
    free(got);
}

/* fp8 inputs: every e4m3 code's value, the halfway points between neighbours and the floats on
 * either side of both (ties and the saturation edge at 464), values halfway between bf16 / f16
 * neighbours, f32 bit patterns spread over the whole range, and specials; half of them negated. */
static int fp8_values(float *v, int cap) {
    int n = 0;
    for (int c = 0; c < 0x7f && n + 8 <= cap; c++) {
        const float a = mlaf_e4m3_to_f32((uint8_t)c), b = c < 0x7e ? mlaf_e4m3_to_f32((uint8_t)(c + 1)) : 512.0f;
        const float mid = (a + b) * 0.5f; /* exact: neighbours differ in their last bits only */
        v[n++] = a, v[n++] = nextafterf(a, 0.0f), v[n++] = nextafterf(a, 1e9f);
        v[n++] = mid, v[n++] = nextafterf(mid, 0.0f), v[n++] = nextafterf(mid, 1e9f);
    }
    static const float sp[] = {0.0f, 464.0f, 463.99997f, 448.0f, 1e30f, 1e-40f, 1e-45f, 0.0009765625f, 0.00048828125f};
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) v[n++] = sp[i];
    v[n++] = INFINITY, v[n++] = NAN, v[n++] = mlaf_bits_f32(0x7f800001u), v[n++] = mlaf_bits_f32(0xffc00123u);
    for (uint32_t k = 0; k < 64; k++) { /* bf16 and f16 ties, both parities of the kept bit */
        const uint32_t u = 0x3a000000u + k * 0x00351000u;
        v[n++] = mlaf_bits_f32((u & ~0xffffu) | 0x8000u), v[n++] = mlaf_bits_f32((u & ~0x1fffu) | 0x1000u);
    }
    for (uint32_t u = 0x00000400u; n < cap && u < 0x7f800000u; u += 0x00012345u) v[n++] = mlaf_bits_f32(u);
    for (int i = 0; i < n; i += 2) v[i] = -v[i];
    return n;
}

/* lengths 0 ... 100, then 257, 1000, 4096 and the whole pool */
enum { FP8_LENS = 105 };
static int fp8_len(int i, int npool) { return i <= 100 ? i : i == 101 ? 257 : i == 102 ? 1000 : i == 103 ? 4096 : npool; }

/* round_amax and e4m3 (the fp8 writers' steps): values, amax and bytes equal to the portable
 * path's for every dtype, scale and mode, lengths 0 ... 100 and longer runs, guard bytes kept. */
static void test_fp8(const table *tb, int nt) {
    static const mlaf_dtype dts[] = {MLAF_F32, MLAF_F16, MLAF_BF16};
    static const float scales[] = {1.0f, 0.01f, 3.0f, 0.125f, 50.0f, 1e-30f, 0.0f, 0x1p-126f, 0x1p127f, 0x1p-20f};
    enum { NV = 8192 };
    float *pool = malloc(sizeof(float) * NV), *xr = malloc(sizeof(float) * NV), *xg = malloc(sizeof(float) * NV);
    unsigned char *br = malloc(NV + PAD), *bg = malloc(NV + PAD);
    const int npool = fp8_values(pool, NV);
    mlaf_rng rng;
    mlaf_rng_seed(&rng, 81);
    for (int ti = 1; ti < nt; ti++) {
        long cases = 0, bad = 0;
        for (int d = 0; d < 3; d++) {
            for (int li = 0; li < FP8_LENS; li++) {
                const int n = fp8_len(li, npool);
                const int o = n ? (int)(mlaf_rng_u64(&rng) % (uint64_t)(npool - n + 1)) : 0;
                for (int mi = 0; mi < 2; mi++) {
                    const float m0 = mi ? 5.0f : 0.0f;
                    const float mr = tb[0].k->round_amax(pool + o, n, dts[d], xr, m0);
                    const float mg = tb[ti].k->round_amax(pool + o, n, dts[d], xg, m0);
                    int same = mlaf_f32_bits(mr) == mlaf_f32_bits(mg);
                    for (int i = 0; i < n && same; i++)
                        same = mlaf_f32_bits(xr[i]) == mlaf_f32_bits(xg[i]) || (isnan(xr[i]) && isnan(xg[i]));
                    cases++, bad += !same;
                }
            }
        }
        char name[96];
        snprintf(name, sizeof name, "NORM_KERN(table=%s,fn=round_amax)", tb[ti].name);
        tl_case(bad == 0, name, "%ld of %ld calls differ from the portable path (values or amax)", bad, cases);
        cases = bad = 0;
        for (size_t si = 0; si < sizeof scales / sizeof scales[0]; si++) {
            for (int div = 0; div < 2; div++) {
                for (int li = 0; li < FP8_LENS; li++) {
                const int n = fp8_len(li, npool);
                    const int o = n ? (int)(mlaf_rng_u64(&rng) % (uint64_t)(npool - n + 1)) : 0;
                    memset(br, GUARD, (size_t)n + PAD);
                    memset(bg, GUARD, (size_t)n + PAD);
                    tb[0].k->e4m3(pool + o, n, scales[si], div, br);
                    tb[ti].k->e4m3(pool + o, n, scales[si], div, bg);
                    cases++, bad += memcmp(br, bg, (size_t)n + PAD) != 0 || !guard_ok(bg + n, PAD);
                }
            }
        }
        snprintf(name, sizeof name, "NORM_KERN(table=%s,fn=e4m3)", tb[ti].name);
        tl_case(bad == 0, name, "%ld of %ld calls differ from the portable path", bad, cases);
    }
    /* the portable path itself against fp8.h's conversion of the quotient or product, value by
     * value over the whole pool (powers of two divide by a product there: this checks it) */
    static const float ref_scales[] = {1.0f, 0.125f, 0x1p-20f, 0x1p100f, 0x1p-126f, 0x1p127f, 3.0f, 0.01f};
    long bad = 0, cases = 0;
    unsigned char *b = malloc((size_t)npool);
    for (size_t si = 0; si < sizeof ref_scales / sizeof ref_scales[0]; si++) {
        const float sc = ref_scales[si];
        for (int div = 0; div < 2; div++) {
            tb[0].k->e4m3(pool, npool, sc, div, b);
            for (int i = 0; i < npool; i++, cases++) bad += b[i] != mlaf_f32_to_e4m3(div ? pool[i] / sc : pool[i] * sc);
        }
    }
    free(b);
    tl_case(bad == 0, "NORM_KERN(table=scalar,fn=e4m3,against=fp8.h)", "%ld of %ld values differ", bad, cases);
    free(pool), free(xr), free(xg), free(br), free(bg);
}

int main(void) {
    table tb[4];
    const int nt = tables(tb);
    if (nt < 2) tl_skip("NORM_KERN", "only the portable path exists on this machine");
    test_scale(tb, nt, tl_quick());
    test_copy(tb, nt);
    test_rope(tb, nt);
    test_convert(tb, nt);
    test_fp8(tb, nt);
    return tl_finish();
}
