/*
 * norm_avx2.c — AVX2 + FMA + F16C row kernels for the CPU norm ops (see norm_kern.h).
 *
 * 1. Loads widen 8 elements to fp32: f32 as is, bf16 by a 16-bit shift, f16 with vcvtph2ps.
 * 2. sumsq: two fp32 FMA accumulators over 16 elements per step; the < 8 leftover elements
 *    are added in scalar code (AVX2 has no cheap masked 16-bit loads).
 * 3. Stores narrow once: bf16 by integer round-to-nearest-even with NaNs kept quiet exactly as
 *    half.h does, then packed (values fit 16 bits, so the saturating pack is exact); f16 with
 *    vcvtps2ph in round-to-nearest-even mode. Leftovers use half.h itself.
 * 4. RoPE: interleaved pairs 4 per vector, NeoX pairs 8 per vector; separate products and one
 *    add / subtract (no FMA) so the bits equal the portable path; leftover pairs go through
 *    the portable code.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "../fp8.h"
#include "../half.h"
#include "norm_kern.h"

static inline __m256 ld8(const void *p, mlaf_dtype dt, int64_t i) {
    if (dt == MLAF_F32) return _mm256_loadu_ps((const float *)p + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
    if (dt == MLAF_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

/* u + 0x7fff + lsb(u >> 16): the bf16 rounding of each lane, left in the high 16 bits; NaNs
 * become the quiet NaN half.h makes. */
static inline __m256i bf16_biased(__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)), nan);
}

static inline __m128i to_bf16(__m256 v) {
    const __m256i r = _mm256_srli_epi32(bf16_biased(v), 16);
    __m256i packed = _mm256_packus_epi32(r, r); /* per 128-bit lane: r0..r3 r0..r3 */
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

static inline void st8(void *p, mlaf_dtype dt, int64_t i, __m256 v) {
    if (dt == MLAF_F32) {
        _mm256_storeu_ps((float *)p + i, v);
        return;
    }
    __m128i h = dt == MLAF_BF16 ? to_bf16(v) : _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128((__m128i *)((uint16_t *)p + i), h);
}

static float sumsq_avx2(const void *x, mlaf_dtype dt, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 v0 = ld8(x, dt, i), v1 = ld8(x, dt, i + 8);
        a0 = _mm256_fmadd_ps(v0, v0, a0);
        a1 = _mm256_fmadd_ps(v1, v1, a1);
    }
    if (i + 8 <= n) {
        __m256 v = ld8(x, dt, i);
        a0 = _mm256_fmadd_ps(v, v, a0);
        i += 8;
    }
    __m256 a = _mm256_add_ps(a0, a1);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    float sum = _mm_cvtss_f32(s);
    for (; i < n; i++) {
        float v = mlaf_load_f32(x, dt, i);
        sum += v * v;
    }
    return sum;
}

/* The lines of pf holding elements [i, i + 32) (one line of 16-bit values, two of f32). */
static inline void prefetch32(const void *pf, mlaf_dtype dt, int64_t i) {
    const char *p = (const char *)pf + i * (dt == MLAF_F32 ? 4 : 2);
    _mm_prefetch(p, _MM_HINT_T0);
    if (dt == MLAF_F32) _mm_prefetch(p + 64, _MM_HINT_T0);
}

static void scale_avx2(const void *x, mlaf_dtype dt, int64_t n, float rstd, const float *w,
                       void *out, mlaf_dtype odt, void *out2, mlaf_dtype o2dt, int stream,
                       const void *pf) {
    (void)stream;
    const __m256 r = _mm256_set1_ps(rstd);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        if (pf && i % 32 == 0) prefetch32(pf, dt, i);
        __m256 y = _mm256_mul_ps(_mm256_mul_ps(ld8(x, dt, i), r), _mm256_loadu_ps(w + i));
        if (out) st8(out, odt, i, y);
        if (out2) st8(out2, o2dt, i, y);
    }
    for (; i < n; i++) {
        float y = (mlaf_load_f32(x, dt, i) * rstd) * w[i];
        if (out) mlaf_store_f32(out, odt, i, y);
        if (out2) mlaf_store_f32(out2, o2dt, i, y);
    }
}

static void rope_avx2(const void *x, mlaf_dtype dt, int32_t R, mlaf_rope_style style,
                      const float *cs, void *out, mlaf_dtype odt, void *out2, mlaf_dtype o2dt) {
    const int32_t h = R / 2;
    int32_t i = 0; /* pairs done */
    if (style == MLAF_ROPE_NEOX) {
        for (; i + 8 <= h; i += 8) {
            __m256 x0 = ld8(x, dt, i), x1 = ld8(x, dt, (int64_t)h + i);
            __m256 c = _mm256_loadu_ps(cs + i), s = _mm256_loadu_ps(cs + h + i);
            __m256 y0 = _mm256_sub_ps(_mm256_mul_ps(x0, c), _mm256_mul_ps(x1, s));
            __m256 y1 = _mm256_add_ps(_mm256_mul_ps(x1, c), _mm256_mul_ps(x0, s));
            if (out) {
                st8(out, odt, i, y0);
                st8(out, odt, (int64_t)h + i, y1);
            }
            if (out2) {
                st8(out2, o2dt, i, y0);
                st8(out2, o2dt, (int64_t)h + i, y1);
            }
        }
    } else {
        const __m256i dup = _mm256_set_epi32(3, 3, 2, 2, 1, 1, 0, 0);
        const __m256 sign = _mm256_castsi256_ps(
            _mm256_set_epi32(0, (int)0x80000000u, 0, (int)0x80000000u, 0, (int)0x80000000u, 0,
                             (int)0x80000000u));
        for (; i + 4 <= h; i += 4) {
            __m256 v = ld8(x, dt, 2 * (int64_t)i);
            __m256 sw = _mm256_permute_ps(v, 0xB1); /* (x1, x0) in each pair */
            __m256 c = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(cs + i)), dup);
            __m256 s = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(cs + h + i)), dup);
            __m256 a = _mm256_mul_ps(v, c);  /* even: x0*c, odd: x1*c */
            __m256 b = _mm256_mul_ps(sw, s); /* even: x1*s, odd: x0*s */
            /* a - b on even lanes, a + b on odd ones: flipping b's sign is exact, so this is
             * the same single rounding as the portable subtraction. */
            __m256 y = _mm256_add_ps(a, _mm256_xor_ps(b, sign));
            if (out) st8(out, odt, 2 * (int64_t)i, y);
            if (out2) st8(out2, o2dt, 2 * (int64_t)i, y);
        }
    }
    if (i < h) mlaf_norm_rope_pairs(x, dt, R, style, cs, i, out, odt, out2, o2dt);
}

static void fence_avx2(void) {}

static void copy_avx2(const void *x, size_t bytes, void *out, int stream) {
    (void)stream;
    memcpy(out, x, bytes);
}

static void convert_avx2(const float *v, int64_t n, void *out, mlaf_dtype odt, int stream) {
    (void)stream;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) st8(out, odt, i, _mm256_loadu_ps(v + i));
    for (; i < n; i++) mlaf_store_f32(out, odt, i, v[i]);
}

/* ---- fp8 writers' steps (norm_avx512.c says how; leftovers through fp8.h / half.h) ----------- */

static inline __m256 round_to(__m256 v, mlaf_dtype dt) {
    if (dt == MLAF_F16) return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    return _mm256_castsi256_ps(_mm256_and_si256(bf16_biased(v), _mm256_set1_epi32((int)0xffff0000u)));
}

static float round_amax_avx2(const float *v, int64_t n, mlaf_dtype dt, float *x, float m) {
    __m256 acc = _mm256_setzero_ps();
    const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 y = _mm256_loadu_ps(v + i);
        if (dt != MLAF_F32) y = round_to(y, dt);
        _mm256_storeu_ps(x + i, y);
        acc = _mm256_max_ps(_mm256_and_ps(y, abs), acc); /* a NaN lane keeps acc's (second operand) */
    }
    float l[8];
    _mm256_storeu_ps(l, acc);
    for (int k = 0; k < 8; k++) m = l[k] > m ? l[k] : m;
    for (; i < n; i++) {
        x[i] = dt == MLAF_BF16 ? mlaf_bf16_to_f32(mlaf_f32_to_bf16(v[i]))
               : dt == MLAF_F16 ? mlaf_f16_to_f32(mlaf_f32_to_f16(v[i]))
                                : v[i];
        const float a = fabsf(x[i]);
        m = a > m ? a : m;
    }
    return m;
}

static inline __m128i e4m3x8(__m256 y) { /* 8 codes in the low 8 bytes */
    const __m256i u = _mm256_castps_si256(y), a = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(a, 20), _mm256_set1_epi32(1));
    const __m256i rn = _mm256_add_epi32(a, _mm256_add_epi32(_mm256_set1_epi32(0x7ffff), lsb));
    const __m256i cn = _mm256_sub_epi32(_mm256_srli_epi32(rn, 20), _mm256_set1_epi32(960));
    const __m256 sub = _mm256_round_ps(_mm256_mul_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(512.0f)),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i cs = _mm256_cvttps_epi32(sub);
    __m256i c = _mm256_blendv_epi8(cs, cn, _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x3c7fffff)));
    c = _mm256_blendv_epi8(c, _mm256_set1_epi32(0x7e), _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x43e7ffff)));
    c = _mm256_or_si256(c, sign);
    c = _mm256_blendv_epi8(c, _mm256_set1_epi32(0x7f), _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7f800000)));
    const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
    return _mm_packus_epi16(w, w);
}

static void e4m3_avx2(const float *x, int64_t n, float s, int div, uint8_t *out) {
    if (div && mlaf_pow2_recip(s, &s)) div = 0; /* the same bits, without the divisions */
    const __m256 sv = _mm256_set1_ps(s);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        _mm_storel_epi64((__m128i *)(out + i), e4m3x8(div ? _mm256_div_ps(v, sv) : _mm256_mul_ps(v, sv)));
    }
    for (; i < n; i++) out[i] = mlaf_f32_to_e4m3(div ? x[i] / s : x[i] * s);
}

const mlaf_norm_kern mlaf_norm_kern_avx2 = {sumsq_avx2, scale_avx2, rope_avx2, fence_avx2, copy_avx2, convert_avx2,
                                            round_amax_avx2, e4m3_avx2};
