/*
 * verify_case.h — what the op verifiers (verify_split_qk_norm.c, verify_mla_kv_cache.c,
 * verify_rope_q.c) share: buffers that remember their initial image, the judge, the chunk loop
 * on all threads (verify_judge.c), and the inputs of the norm and RoPE cases
 * (verify_inputs.c). Internal to the oracle; tests and tools use verify.h.
 *
 * Every buffer is an mlaf_gbuf (guard zones, backend memory). Outputs start poisoned (0xFF,
 * NaN in every float dtype), inputs random (seeded). After the run each buffer is downloaded
 * and every byte is accounted for: a byte some check "claims" (an output value compared with
 * the oracle) is judged by that check; every other byte — inputs, row padding, cache rows no
 * valid slot names, the nope columns of rope_q, the rope part of rejected tokens — must equal
 * its initial value bit for bit. Guards must be intact.
 *
 * Tolerance (docs/conventions.md): output values within 1 unit (mlaf_err_units) of the oracle; copies bit
 * exact. RoPE outputs: the contract fixes the rotation as separate fp32 products and one
 * add / subtract, whose rounding (at most 2^-23 of |x0*c| + |x1*s|) can dwarf an ulp of a
 * result that cancels to near zero; that allowance (rope_allowance) is granted before
 * counting units.
 *
 * Case knobs used by these verifiers: cfg (Q, C, R, heads, nope dim, eps), dtype,
 * weight_dtype, T, strided (padded rows, odd element offsets, misaligned bases), in_place
 * (dense outputs are the latent's own columns), no_k_pe (1: omit the dense k_pe output; 2,
 * mla_kv_cache only: omit both dense k_nope and k_pe — the cache-only call), seed, rope_style,
 * block_size, cache_dtype, index_dtype; mla_kv_cache also map_short and the cache format
 * (kv_format, fp8_conv, fp8_scale, want_amax, amax_init, kpe_separate, tile_scale: how its
 * records are judged is in verify_mla_kv_cache.c).
 */
#ifndef MLAF_VERIFY_CASE_H
#define MLAF_VERIFY_CASE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "../half.h"
#include "verify.h"

#define CHUNK_TOKENS 256
#define VERIFY_MAX_POS 2048

/* ---- buffers with an initial image and a claim mask (verify_judge.c) -------------------- */
typedef struct vbuf {
    const char *name;
    mlaf_gbuf g;
    unsigned char *init;    /* the usable part as uploaded */
    unsigned char *claimed; /* after fetch: 1 per byte some check owns */
    size_t bytes;
    int live;
} vbuf;

/* `bytes` on backend be, uploaded from init (NULL: the 0xFF poison), shifted by misalign. */
mlaf_status vbuf_alloc(vbuf *b, const char *name, mlaf_backend be, size_t bytes,
                       const void *init, size_t misalign);
void vbuf_free(vbuf *b);
/* Downloads a live buffer and gives it an empty claim mask. */
mlaf_status vbuf_fetch(vbuf *b);
mlaf_status fetch_all(vbuf **bufs, int n);

/* A 2-D strided view into a vbuf: element (t, i) at body + (off + t * stride + i) * es. */
typedef struct vview {
    vbuf *b;
    mlaf_dtype dt;
    int64_t off, stride;
} vview;

static inline size_t vv_byte(const vview *v, int64_t t, int64_t i) {
    return (size_t)((v->off + t * v->stride + i) * (int64_t)mlaf_dtype_size(v->dt));
}
static inline void *vv_dev(const vview *v) {
    if (!v->b->g.ptr) return NULL; /* an empty buffer (no offset may be applied to NULL) */
    return (char *)v->b->g.ptr + v->off * (int64_t)mlaf_dtype_size(v->dt);
}

/* ---- the judge (verify_judge.c) ------------------------------------------------------- */
typedef struct judge {
    mlaf_verify_result *r;
    int failed;
    double worst;
    int64_t values;
} judge;

/* Counts a failure; the first one's text goes to the result. */
void judge_fail(judge *j, const char *fmt, ...);

/* mlaf_err_units with frexp instead of log2 (same value; many millions of calls per case, so
 * it and judge_value stay inline in every verifier). */
static inline double units(double got, double ref, mlaf_dtype dt, double scale) {
    if (dt == MLAF_F32 || isnan(ref) || isnan(got) || isinf(ref) || isinf(got))
        return mlaf_err_units(got, ref, dt, scale);
    int mant = dt == MLAF_F16 ? 10 : 7, min_exp = dt == MLAF_F16 ? -14 : -126;
    int e = min_exp;
    if (ref != 0.0) {
        frexp(ref, &e);
        e -= 1;
        if (e < min_exp) e = min_exp;
    }
    return fabs(got - ref) / ldexp(1.0, e - mant);
}

/* Compares out(t, i) with ref; `allow` is an absolute slack granted before counting units
 * (0 except for RoPE results). Claims the element. */
static inline void judge_value(judge *j, const vview *v, const char *what, int64_t t, int64_t i,
                               double ref, double allow) {
    size_t at = vv_byte(v, t, i), es = mlaf_dtype_size(v->dt);
    for (size_t k = 0; k < es; k++) v->b->claimed[at + k] = 1;
    double got = mlaf_load_f32(v->b->g.body, v->dt, v->off + t * v->stride + i);
    double ref_near = ref;
    if (allow > 0 && isfinite(got) && isfinite(ref))
        ref_near = got > ref ? (got - ref > allow ? ref + allow : got)
                             : (ref - got > allow ? ref - allow : got);
    double u = units(got, ref_near, v->dt, fabs(ref));
    j->values++;
    if (u > j->worst || u != u) j->worst = u != u ? INFINITY : u;
    if (!(u <= 1.0))
        judge_fail(j, "%s[t=%lld,i=%lld]: got %.9g, expected %.9g (%.3g units, %s)", what,
                   (long long)t, (long long)i, got, ref, u, mlaf_dtype_name(v->dt));
}

/* Every unclaimed byte equals its initial value; guards intact. Returns the bytes so judged. */
int64_t judge_untouched(judge *j, const vbuf *b);
/* The verdict into j->r (and its one-line summary when it passed). */
void judge_finish(judge *j, const char *op, const mlaf_verify_case *c, int64_t extra);
/* Row t of a quantized GEMM-input output (format f; e4m3 bytes qd with row stride DS bytes, scales qs
 * of dtype sdt with leading stride ld) against the encoder's row: its bytes rd, f32 scales sf and
 * UE8M0 bytes sb for the K values `row` (each byte also decoded within half an e4m3 step of its
 * value), the packed layout's zero bytes past the last group too; every byte checked is claimed.
 * what: how the messages name row's values ("x", "the dense value"). */
void judge_gemm_row(judge *j, const vbuf *qd, const vbuf *qs, int64_t DS, int64_t ld, mlaf_dtype sdt,
                    mlaf_gemm_format f, int64_t t, int64_t K, const float *row, const uint8_t *rd, const float *sf,
                    const uint8_t *sb, const char *what);
/* The error_count output (error_count_buf) is 3 + the tokens the oracle rejected. */
void judge_error_count(judge *j, vbuf *b, int64_t expected_errors);
/* The case's corrupt_from (the harness's own test): element (t, 0) of v raised by 1 for
 * t = corrupt_from - 1, then every 500th token. */
void corrupt_outputs(const mlaf_verify_case *c, const vview *v);
/* Absolute fp32 rounding allowance for each rotated value (see the opening comment). */
void rope_allowance(const double *x, int32_t R, mlaf_rope_style style, const float *cs,
                    double *allow);

/* The allowance of a kv_rope_tail's r rotated values (interleaved) from the oracle's unrounded
 * normalized tail raw[r] (see verify_mla_kv_cache.c). */
void tail_allowance(const double *raw, int32_t r, mlaf_dtype dt, const float *cs, double *allow);
/* ---- the chunk loops, on all threads (verify_judge.c) ----------------------------------- *
 * A check walks [0, T) in chunks: the oracle for the chunk, then every output value judged.
 * The chunks are mlaf_run_items' items, each with its own judge; the merge gives what the loop
 * in token order gives. Claims are per token (distinct bytes), so threads never claim the same
 * byte. */
typedef void (*chunk_body)(const void *arg, void *scratch, int64_t t0, int64_t n, judge *j,
                           int64_t *errors);
/* body over [0, T) in chunks of `chunk` tokens, scratch_bytes per thread; merged into j and
 * *errors. */
mlaf_status run_chunks(int64_t T, int64_t chunk, size_t scratch_bytes, chunk_body body,
                       const void *arg, judge *j, int64_t *errors);

/* ---- case inputs (verify_inputs.c) ------------------------------------------------------ */
/* Zeroes r; MLAF_ERR_INVALID_ARGUMENT unless the norm dims and T make a case. */
mlaf_status check_case_common(const mlaf_verify_case *c, mlaf_verify_result *r);

/* fill_fast_normal (approximately N(mean, sd), rounded to dt) over n elements in blocks on
 * all threads. */
void fill_fast_normal_par(mlaf_rng *rng, void *p, mlaf_dtype dt, int64_t n, double mean,
                          double sd);

/* The norm ops' inputs and dense outputs. */
typedef struct norm_bufs {
    vbuf latent, w_q, w_kv, q, k_nope, k_pe;
    vview vq, vk, vp;
    int64_t LS;
} norm_bufs;

void norm_bufs_free(norm_bufs *n);
/* Inputs and the dense outputs (want_* says which exist). */
mlaf_status norm_bufs_make(norm_bufs *n, mlaf_backend be, const mlaf_verify_case *c,
                           mlaf_rng *rng, int want_k_nope, int want_k_pe);
mlaf_tensor tensor_of(const vview *v, int64_t T, int64_t width);
/* Host copy of the job for the oracle, on the initial images, for tokens [t0, t0 + n). */
mlaf_norm_job host_norm_job(const norm_bufs *b, const mlaf_verify_case *c, int64_t t0,
                            int64_t n);

/* RoPE inputs shared by mla_kv_cache and rope_q. Positions: mostly random, with
 * max_pos - 1, repeats and rejected ones mixed in. */
void make_positions(mlaf_rng *rng, int64_t *pos, int64_t T, int64_t max_pos);
/* T indices in dtype dt (I32 or I64). */
mlaf_status index_buf(vbuf *b, const char *name, mlaf_backend be, const int64_t *v, int64_t T,
                      mlaf_dtype dt, int misalign);
/* cos_sin [VERIFY_MAX_POS, R] with row stride cs_stride (f32). */
mlaf_status cos_sin_buf(vbuf *b, mlaf_backend be, int32_t R, int64_t cs_stride, int strided);
/* The error_count output, starting at 3: the op adds to whatever the caller left there. */
mlaf_status error_count_buf(vbuf *b, mlaf_backend be);

#endif /* MLAF_VERIFY_CASE_H */
