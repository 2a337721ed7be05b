/*
 * norm_avx512.c — AVX-512 (F/BW/VL) row kernels for the CPU norm ops (see norm_kern.h).
 *
 * 1. Loads widen 16 elements to fp32: f32 as is, bf16 by a 16-bit shift, f16 with vcvtph2ps.
 *    Row tails use masked loads / stores (rows need no alignment, widths no padding).
 * 2. sumsq: two fp32 FMA accumulators over 32 elements per step; bf16 rows four accumulators
 *    over 64 elements, widened without a conversion instruction (sumsq_bf16).
 * 3. Stores narrow once: bf16 by integer round-to-nearest-even with NaNs kept quiet exactly as
 *    half.h does, or, on CPUs with AVX512_BF16 (the mlaf_norm_kern_avx512_bf16 table), by
 *    VCVTNE2PS2BF16, which gives the same bits except that it flushes denormals, so blocks
 *    holding one fall back to the integer rounding; f16 with vcvtps2ph in round-to-nearest-even
 *    mode (exact RNE, same bits).
 * 4. The scale loop prefetches the caller's later row one line per 32 elements (norm.c).
 * 5. RoPE: interleaved pairs rotate 8 pairs per vector (cos/sin duplicated to both lanes of a
 *    pair, partner value from an in-pair swap); NeoX pairs 16 at a time. Products and the
 *    add / subtract are separate instructions (no FMA), so the bits equal the portable path;
 *    leftover pairs go through the portable code.
 * The caller runs one row at a time per thread; the row (a few KB) stays in L1 between the
 * sumsq pass and the scale pass.
 */
#include <immintrin.h>
#include <string.h>

#include "../fp8.h"
#include "norm_kern.h"

/* Functions that may use AVX512_BF16 instructions (the build enables F/BW/VL/DQ only). */
#define BF16_TARGET __attribute__((target("avx512bf16")))

static inline __m512 ld16(const void *p, mlaf_dtype dt, int64_t i) {
    if (dt == MLAF_F32) return _mm512_loadu_ps((const float *)p + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
    if (dt == MLAF_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

static inline __m512 ld16m(const void *p, mlaf_dtype dt, int64_t i, __mmask16 m) {
    if (dt == MLAF_F32) return _mm512_maskz_loadu_ps(m, (const float *)p + i);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i);
    if (dt == MLAF_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

static inline __m256i to_bf16(__m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i hi = _mm512_srli_epi32(u, 16);
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                                     _mm512_and_si512(hi, _mm512_set1_epi32(1))));
    r = _mm512_srli_epi32(r, 16);
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    if (__builtin_expect(nan != 0, 0)) /* rare: keep NaNs quiet exactly as half.h does */
        r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
}

static inline __m256i narrow(__m512 v, mlaf_dtype dt) {
    if (dt == MLAF_BF16) return to_bf16(v);
    return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

static inline void st16(void *p, mlaf_dtype dt, int64_t i, __m512 v) {
    if (dt == MLAF_F32)
        _mm512_storeu_ps((float *)p + i, v);
    else
        _mm256_storeu_si256((__m256i *)((uint16_t *)p + i), narrow(v, dt));
}

static inline void st16m(void *p, mlaf_dtype dt, int64_t i, __m512 v, __mmask16 m) {
    if (dt == MLAF_F32)
        _mm512_mask_storeu_ps((float *)p + i, m, v);
    else
        _mm256_mask_storeu_epi16((uint16_t *)p + i, m, narrow(v, dt));
}

static inline __mmask16 tail_mask(int64_t left) { return (__mmask16)((1u << left) - 1u); }

static inline __attribute__((always_inline)) float sumsq_body(const void *x, mlaf_dtype dt, int64_t n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 v0 = ld16(x, dt, i), v1 = ld16(x, dt, i + 16);
        a0 = _mm512_fmadd_ps(v0, v0, a0);
        a1 = _mm512_fmadd_ps(v1, v1, a1);
    }
    if (i + 16 <= n) {
        __m512 v = ld16(x, dt, i);
        a0 = _mm512_fmadd_ps(v, v, a0);
        i += 16;
    }
    if (i < n) {
        __m512 v = ld16m(x, dt, i, tail_mask(n - i));
        a1 = _mm512_fmadd_ps(v, v, a1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

/* bf16 needs no widening instruction: of the 32 values in a 64-byte load, the even-indexed
 * ones become fp32 by a 16-bit shift and the odd-indexed ones by clearing their neighbour's
 * bits. Four accumulators cover the FMA latency. */
static float sumsq_bf16(const uint16_t *x, int64_t n) {
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512i u = _mm512_loadu_si512(x + i), v = _mm512_loadu_si512(x + i + 32);
        __m512 ue = _mm512_castsi512_ps(_mm512_slli_epi32(u, 16)), uo = _mm512_castsi512_ps(_mm512_and_si512(u, hi));
        __m512 ve = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), vo = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
        a0 = _mm512_fmadd_ps(ue, ue, a0);
        a1 = _mm512_fmadd_ps(uo, uo, a1);
        a2 = _mm512_fmadd_ps(ve, ve, a2);
        a3 = _mm512_fmadd_ps(vo, vo, a3);
    }
    for (; i < n; i += 32) {
        __mmask32 m = n - i >= 32 ? 0xffffffffu : (__mmask32)((1u << (n - i)) - 1u);
        __m512i u = _mm512_maskz_loadu_epi16(m, x + i);
        __m512 ue = _mm512_castsi512_ps(_mm512_slli_epi32(u, 16)), uo = _mm512_castsi512_ps(_mm512_and_si512(u, hi));
        a0 = _mm512_fmadd_ps(ue, ue, a0);
        a1 = _mm512_fmadd_ps(uo, uo, a1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

static float sumsq_avx512(const void *x, mlaf_dtype dt, int64_t n) {
    switch (dt) {
    case MLAF_F32: return sumsq_body(x, MLAF_F32, n);
    case MLAF_F16: return sumsq_body(x, MLAF_F16, n);
    default: return sumsq_bf16((const uint16_t *)x, n);
    }
}

#define AI static inline __attribute__((always_inline))

/* u + 0x7fff + lsb(u >> 16): the bf16 rounding of each lane, left in the high 16 bits;
 * NaNs (rare, tested once per vector) become the quiet NaN half.h makes. */
AI __m512i bf16_biased(__m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    if (__builtin_expect(nan != 0, 0))
        r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(u, _mm512_set1_epi32(0x400000)));
    return r;
}

/* a (first 16) and b (next 16) narrowed to 32 bf16 by integer rounding: one two-source word
 * permute picks the 32 high halves (cheaper than two narrowing moves). */
AI __m512i bf16x32_int(__m512 a, __m512 b) {
    const __m512i odd = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33,
                                         31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    return _mm512_permutex2var_epi16(bf16_biased(a), odd, bf16_biased(b));
}

/* The same with AVX512_BF16's VCVTNE2PS2BF16: one instruction for the 32 values, rounding to
 * nearest even and quieting NaNs exactly as half.h does (checked over all 2^32 inputs), except
 * that it flushes fp32 denormals to zero; a block holding one (rare) takes the integer
 * rounding instead. Only called from functions compiled for AVX512_BF16. */
static inline BF16_TARGET __m512i bf16x32_cvt(__m512 a, __m512 b) {
    __mmask16 da = _mm512_fpclass_ps_mask(a, 0x20), db = _mm512_fpclass_ps_mask(b, 0x20);
    if (__builtin_expect(!_kortestz_mask16_u8(da, db), 0)) return bf16x32_int(a, b);
    __m512bh h = _mm512_cvtne2ps_pbh(b, a); /* b to the high half, a to the low */
    return (__m512i)h;
}

/* 32 consecutive values a (first 16) and b (next 16) stored as f32 / f16 / bf16 at element i;
 * `cvt`: bf16 by bf16x32_cvt (callers compiled for AVX512_BF16 only), else bf16x32_int.
 * `stream`: non-temporal stores, only called when p + i is 64-byte aligned. */
AI void st32(void *p, mlaf_dtype dt, int64_t i, __m512 a, __m512 b, int stream, int cvt) {
    if (dt == MLAF_F32) {
        float *f = (float *)p + i;
        if (stream) {
            _mm512_stream_ps(f, a);
            _mm512_stream_ps(f + 16, b);
        } else {
            _mm512_storeu_ps(f, a);
            _mm512_storeu_ps(f + 16, b);
        }
        return;
    }
    __m512i h;
    if (dt == MLAF_BF16) {
        h = cvt ? bf16x32_cvt(a, b) : bf16x32_int(a, b);
    } else {
        h = _mm512_inserti64x4(_mm512_castsi256_si512(narrow(a, dt)), narrow(b, dt), 1);
    }
    if (stream)
        _mm512_stream_si512((__m512i *)((uint16_t *)p + i), h);
    else
        _mm512_storeu_si512((uint16_t *)p + i, h);
}

/* The lines of pf holding elements [i, i + 32) (one line of 16-bit values, two of f32). */
AI void prefetch32(const void *pf, mlaf_dtype dt, int64_t i) {
    const char *p = (const char *)pf + i * (dt == MLAF_F32 ? 4 : 2);
    _mm_prefetch(p, _MM_HINT_T0);
    if (dt == MLAF_F32) _mm_prefetch(p + 64, _MM_HINT_T0);
}

/* The body is inlined with constant dtypes for the common combinations (see scale_avx512) so
 * the loop carries no per-vector dtype tests. */
AI void scale_body(const void *x, mlaf_dtype dt, int64_t n, float rstd, const float *w, void *out,
                   mlaf_dtype odt, void *out2, mlaf_dtype o2dt, int stream, const void *pf, int cvt) {
    const __m512 r = _mm512_set1_ps(rstd);
    int64_t i = 0;
    if (stream) {
        /* Streaming needs whole aligned lines: peel up to the first 64-byte boundary of the
         * output (both outputs, when there are two, share that offset — checked by the caller). */
        const void *al = out ? out : out2;
        size_t es = mlaf_dtype_size(out ? odt : o2dt);
        int64_t head = (int64_t)(((64 - (uintptr_t)al % 64) % 64) / es);
        if (head > n) head = n;
        while (i < head) {
            int64_t m = head - i < 16 ? head - i : 16;
            __mmask16 k = tail_mask(m);
            __m512 y = _mm512_mul_ps(_mm512_mul_ps(ld16m(x, dt, i, k), r), _mm512_maskz_loadu_ps(k, w + i));
            if (out) st16m(out, odt, i, y, k);
            if (out2) st16m(out2, o2dt, i, y, k);
            i += m;
        }
    }
    for (; i + 32 <= n; i += 32) {
        if (pf) prefetch32(pf, dt, i);
        __m512 y0 = _mm512_mul_ps(_mm512_mul_ps(ld16(x, dt, i), r), _mm512_loadu_ps(w + i));
        __m512 y1 = _mm512_mul_ps(_mm512_mul_ps(ld16(x, dt, i + 16), r), _mm512_loadu_ps(w + i + 16));
        if (out) st32(out, odt, i, y0, y1, stream, cvt);
        if (out2) st32(out2, o2dt, i, y0, y1, stream, cvt);
    }
    if (pf && i < n) prefetch32(pf, dt, i);
    for (; i < n; i += 16) {
        __mmask16 k = tail_mask(n - i < 16 ? n - i : 16);
        __m512 y = _mm512_mul_ps(_mm512_mul_ps(ld16m(x, dt, i, k), r), _mm512_maskz_loadu_ps(k, w + i));
        if (out) st16m(out, odt, i, y, k);
        if (out2) st16m(out2, o2dt, i, y, k);
    }
}

#define SCALE_SAME(DT, OUT, OUT2, S) scale_body(x, DT, n, rstd, w, OUT, DT, OUT2, DT, S, pf, 0)
#define SCALE_BY_DT(OUT, OUT2, S)                                           \
    switch (dt) {                                                           \
    case MLAF_F32: SCALE_SAME(MLAF_F32, OUT, OUT2, S); return;              \
    case MLAF_F16: SCALE_SAME(MLAF_F16, OUT, OUT2, S); return;              \
    default: SCALE_SAME(MLAF_BF16, OUT, OUT2, S); return;                   \
    }

/* Streaming stays on only when the two outputs (if two) reach a line boundary at the same
 * element, since scale_body peels one head for both. */
static int stream_ok(int stream, const void *out, mlaf_dtype odt, const void *out2, mlaf_dtype o2dt) {
    return stream && !(out && out2 &&
                       ((64 - (uintptr_t)out % 64) % 64) / mlaf_dtype_size(odt) !=
                           ((64 - (uintptr_t)out2 % 64) % 64) / mlaf_dtype_size(o2dt));
}

static void scale_avx512(const void *x, mlaf_dtype dt, int64_t n, float rstd, const float *w,
                         void *out, mlaf_dtype odt, void *out2, mlaf_dtype o2dt, int stream,
                         const void *pf) {
    stream = stream_ok(stream, out, odt, out2, o2dt);
    if (odt == dt && (!out2 || o2dt == dt)) {
        if (!out2) {
            if (stream) SCALE_BY_DT(out, NULL, 1)
            SCALE_BY_DT(out, NULL, 0)
        }
        if (stream) SCALE_BY_DT(out, out2, 1)
        SCALE_BY_DT(out, out2, 0)
    }
    scale_body(x, dt, n, rstd, w, out, odt, out2, o2dt, stream, pf, 0); /* a cache dtype of its own */
}

/* scale_avx512 with bf16 outputs narrowed by bf16x32_cvt: all-bf16 calls (the common case) get
 * their own inlined bodies, everything else goes to scale_avx512. */
static BF16_TARGET void scale_avx512_bf16(const void *x, mlaf_dtype dt, int64_t n, float rstd,
                                          const float *w, void *out, mlaf_dtype odt, void *out2,
                                          mlaf_dtype o2dt, int stream, const void *pf) {
    const mlaf_dtype B = MLAF_BF16;
    if (dt != B || (out && odt != B) || (out2 && o2dt != B)) {
        scale_avx512(x, dt, n, rstd, w, out, odt, out2, o2dt, stream, pf);
        return;
    }
    stream = stream_ok(stream, out, odt, out2, o2dt);
    if (out && !out2) {
        if (stream)
            scale_body(x, B, n, rstd, w, out, B, NULL, B, 1, pf, 1);
        else
            scale_body(x, B, n, rstd, w, out, B, NULL, B, 0, pf, 1);
    } else {
        scale_body(x, B, n, rstd, w, out, B, out2, B, stream, pf, 1);
    }
}

static void fence_avx512(void) { _mm_sfence(); }

/* k_pe rows: whole aligned lines stream (no read-for-ownership), anything else is memcpy. */
static void copy_avx512(const void *x, size_t bytes, void *out, int stream) {
    if (!stream || (uintptr_t)out % 64 != 0 || bytes % 64 != 0) {
        memcpy(out, x, bytes);
        return;
    }
    for (size_t b = 0; b < bytes; b += 64)
        _mm512_stream_si512((__m512i *)((char *)out + b), _mm512_loadu_si512((const char *)x + b));
}

static void rope_avx512(const void *x, mlaf_dtype dt, int32_t R, mlaf_rope_style style,
                        const float *cs, void *out, mlaf_dtype odt, void *out2, mlaf_dtype o2dt) {
    const int32_t h = R / 2;
    int32_t i = 0; /* pairs done */
    if (style == MLAF_ROPE_NEOX) {
        for (; i + 16 <= h; i += 16) {
            __m512 x0 = ld16(x, dt, i), x1 = ld16(x, dt, (int64_t)h + i);
            __m512 c = _mm512_loadu_ps(cs + i), s = _mm512_loadu_ps(cs + h + i);
            __m512 y0 = _mm512_sub_ps(_mm512_mul_ps(x0, c), _mm512_mul_ps(x1, s));
            __m512 y1 = _mm512_add_ps(_mm512_mul_ps(x1, c), _mm512_mul_ps(x0, s));
            if (out) {
                st16(out, odt, i, y0);
                st16(out, odt, (int64_t)h + i, y1);
            }
            if (out2) {
                st16(out2, o2dt, i, y0);
                st16(out2, o2dt, (int64_t)h + i, y1);
            }
        }
    } else {
        const __m512i dup = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
        for (; i + 8 <= h; i += 8) {
            __m512 v = ld16(x, dt, 2 * (int64_t)i);
            __m512 sw = _mm512_permute_ps(v, 0xB1); /* (x1, x0) in each pair */
            __m512 c = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(cs + i)));
            __m512 s = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(cs + h + i)));
            __m512 a = _mm512_mul_ps(v, c);  /* even: x0*c, odd: x1*c */
            __m512 b = _mm512_mul_ps(sw, s); /* even: x1*s, odd: x0*s */
            __m512 y = _mm512_mask_sub_ps(_mm512_add_ps(a, b), 0x5555, a, b);
            if (out) st16(out, odt, 2 * (int64_t)i, y);
            if (out2) st16(out2, o2dt, 2 * (int64_t)i, y);
        }
    }
    if (i < h) mlaf_norm_rope_pairs(x, dt, R, style, cs, i, out, odt, out2, o2dt);
}

/* convert: scale_body's stores without the products. `cvt` as in st32. */
AI void convert_body(const float *v, int64_t n, void *out, mlaf_dtype odt, int stream, int cvt) {
    int64_t i = 0;
    if (stream) { /* whole aligned lines only: peel up to the first 64-byte boundary */
        int64_t head = (int64_t)(((64 - (uintptr_t)out % 64) % 64) / mlaf_dtype_size(odt));
        if (head > n) head = n;
        for (; i < head; i += 16) {
            const int64_t m = head - i < 16 ? head - i : 16;
            st16m(out, odt, i, _mm512_maskz_loadu_ps(tail_mask(m), v + i), tail_mask(m));
        }
        i = head;
    }
    for (; i + 32 <= n; i += 32) st32(out, odt, i, _mm512_loadu_ps(v + i), _mm512_loadu_ps(v + i + 16), stream, cvt);
    for (; i < n; i += 16) {
        const __mmask16 k = tail_mask(n - i < 16 ? n - i : 16);
        st16m(out, odt, i, _mm512_maskz_loadu_ps(k, v + i), k);
    }
}

static void convert_avx512(const float *v, int64_t n, void *out, mlaf_dtype odt, int stream) {
    switch (odt) { /* constant dtypes: the loop carries no per-vector dtype tests */
    case MLAF_F32: stream ? convert_body(v, n, out, MLAF_F32, 1, 0) : convert_body(v, n, out, MLAF_F32, 0, 0); return;
    case MLAF_F16: stream ? convert_body(v, n, out, MLAF_F16, 1, 0) : convert_body(v, n, out, MLAF_F16, 0, 0); return;
    default: stream ? convert_body(v, n, out, MLAF_BF16, 1, 0) : convert_body(v, n, out, MLAF_BF16, 0, 0); return;
    }
}

static BF16_TARGET void convert_avx512_bf16(const float *v, int64_t n, void *out, mlaf_dtype odt, int stream) {
    if (odt != MLAF_BF16) convert_avx512(v, n, out, odt, stream);
    else if (stream) convert_body(v, n, out, MLAF_BF16, 1, 1);
    else convert_body(v, n, out, MLAF_BF16, 0, 1);
}

/* ---- fp8 writers' steps ------------------------------------------------------------------ */

/* v rounded to dt and widened back: bf16 by bf16_biased's integer rounding (NaNs kept quiet, as
 * half.h), f16 through vcvtps2ph in round-to-nearest-even mode. */
AI __m512 round_to(__m512 v, mlaf_dtype dt) {
    if (dt == MLAF_F16) return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    return _mm512_castsi512_ps(_mm512_and_si512(bf16_biased(v), _mm512_set1_epi32((int)0xffff0000u)));
}

AI float round_amax_body(const float *v, int64_t n, mlaf_dtype dt, float *x, float m) {
    __m512 acc = _mm512_setzero_ps(), acc2 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) { /* a NaN lane keeps acc's value (max's second operand) */
        __m512 y = _mm512_loadu_ps(v + i), z = _mm512_loadu_ps(v + i + 16);
        if (dt != MLAF_F32) y = round_to(y, dt), z = round_to(z, dt);
        _mm512_storeu_ps(x + i, y);
        _mm512_storeu_ps(x + i + 16, z);
        acc = _mm512_max_ps(_mm512_abs_ps(y), acc);
        acc2 = _mm512_max_ps(_mm512_abs_ps(z), acc2);
    }
    acc = _mm512_max_ps(acc, acc2);
    for (; i < n; i += 16) {
        const __mmask16 k = tail_mask(n - i < 16 ? n - i : 16);
        __m512 y = _mm512_maskz_loadu_ps(k, v + i);
        if (dt != MLAF_F32) y = round_to(y, dt);
        _mm512_mask_storeu_ps(x + i, k, y);
        acc = _mm512_max_ps(_mm512_abs_ps(y), acc);
    }
    const float r = _mm512_reduce_max_ps(acc);
    return r > m ? r : m;
}

static float round_amax_avx512(const float *v, int64_t n, mlaf_dtype dt, float *x, float m) {
    switch (dt) {
    case MLAF_F32: return round_amax_body(v, n, MLAF_F32, x, m);
    case MLAF_F16: return round_amax_body(v, n, MLAF_F16, x, m);
    default: return round_amax_body(v, n, MLAF_BF16, x, m);
    }
}

/* 16 e4m3 codes of y (fp8.h's mlaf_f32_to_e4m3) as 32-bit lanes: normal codes (|y| >= 2^-6) by
 * rounding the f32 bits to 3 fraction bits, subnormal ones as |y| * 2^9 rounded to an integer
 * (an exact product); codes rise with |y|, so one minimum saturates |y| >= 464 and inf to 0x7E;
 * NaN gives 0x7F. */
AI __m512i e4m3x16(__m512 y) {
    const __m512i u = _mm512_castps_si512(y), a = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(a, 20), _mm512_set1_epi32(1));
    const __m512i rn = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(a, _mm512_set1_epi32(0x7ffff)), lsb), 20);
    __m512i c = _mm512_cvt_roundps_epi32(_mm512_mul_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(512.0f)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    c = _mm512_mask_sub_epi32(c, _mm512_cmpge_epi32_mask(a, _mm512_set1_epi32(0x3c800000)), rn,
                              _mm512_set1_epi32(960)); /* (127 - 7) << 3 */
    c = _mm512_min_epi32(c, _mm512_set1_epi32(0x7e));
    c = _mm512_ternarylogic_epi32(c, _mm512_srli_epi32(u, 24), _mm512_set1_epi32(0x80), 0xf8); /* c | (sign & 0x80) */
    return _mm512_mask_mov_epi32(c, _mm512_cmpgt_epi32_mask(a, _mm512_set1_epi32(0x7f800000)), _mm512_set1_epi32(0x7f));
}

AI __m512 quot(__m512 v, __m512 s, int div) { return div ? _mm512_div_ps(v, s) : _mm512_mul_ps(v, s); }

static void e4m3_avx512(const float *x, int64_t n, float s, int div, uint8_t *out) {
    if (div && mlaf_pow2_recip(s, &s)) div = 0; /* the same bits, without the divisions */
    const __m512 sv = _mm512_set1_ps(s);
    int64_t i = 0;
    /* 64 values: two saturating packs give each 128-bit lane four codes of every vector, one
     * dword permutation puts them in order (codes are 0 .. 255: the packs are exact) */
    const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    for (; i + 64 <= n; i += 64) {
        const __m512i c0 = e4m3x16(quot(_mm512_loadu_ps(x + i), sv, div));
        const __m512i c1 = e4m3x16(quot(_mm512_loadu_ps(x + i + 16), sv, div));
        const __m512i c2 = e4m3x16(quot(_mm512_loadu_ps(x + i + 32), sv, div));
        const __m512i c3 = e4m3x16(quot(_mm512_loadu_ps(x + i + 48), sv, div));
        const __m512i b = _mm512_packus_epi16(_mm512_packus_epi32(c0, c1), _mm512_packus_epi32(c2, c3));
        _mm512_storeu_si512(out + i, _mm512_permutexvar_epi32(order, b));
    }
    for (; i < n; i += 16) {
        const __mmask16 k = tail_mask(n - i < 16 ? n - i : 16);
        _mm_mask_storeu_epi8(out + i, k, _mm512_cvtepi32_epi8(e4m3x16(quot(_mm512_maskz_loadu_ps(k, x + i), sv, div))));
    }
}

const mlaf_norm_kern mlaf_norm_kern_avx512 = {sumsq_avx512, scale_avx512, rope_avx512, fence_avx512,
                                              copy_avx512, convert_avx512, round_amax_avx512, e4m3_avx512};
const mlaf_norm_kern mlaf_norm_kern_avx512_bf16 = {sumsq_avx512, scale_avx512_bf16, rope_avx512,
                                                   fence_avx512, copy_avx512, convert_avx512_bf16,
                                                   round_amax_avx512, e4m3_avx512};

int mlaf_norm_avx512_bf16_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16");
}
