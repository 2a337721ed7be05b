/*
 * gemm_layout.h — the small example on which tests pin the GEMM-input layouts (docs/gemm_formats.md):
 * T = 3 rows of K = 640 values, each layout's scale offsets written out by hand, the rows' values
 * built so that every scale is a known power of two and every value byte a known e4m3 code.
 * Shared by test_gemm_formats (the CPU writers) and test_rms_norm_quant (the op, every backend).
 *
 * Group j of row t (g values: 128, or 32 for mxfp8) holds 448 * 2^k, -2^k and 1.5 * 2^k (times the
 * row's sign) and zeros, so its amax is 448 * 2^k and its scale 2^k in every rounding (f32:
 * 448 * 2^k / 448), its bytes 0x7E, 0xB8, 0x3C (signs flipped: 0xFE, 0x38, 0xBC), then 0x00. A zero
 * group takes the floor of its rounding: f32 1e-10 / 448, ue8m0 2^-42 (byte 0x55: 2^-43 <
 * 1e-10 / 448 <= 2^-42), mxfp8 2^-127 (byte 0x00).
 *   GL_WRITER  k = (j mod 6) - t - 2, sign +1, row 1's group 2 zero
 *   GL_OP      k = (j mod 6) - 2, row 0 sign +1, row 1 all zero, row 2 sign -1 (rms_norm_quant of
 *              x = 1, 0, -4 with weights w, bf16: RMSNorm of a constant row is its sign, and the
 *              rounding to bf16 absorbs rstd's 1 - eps / 2; signed zeros follow: the zero row's
 *              -2^k becomes -0 (0x80), and so do the zero weights of the row of sign -1)
 */
#ifndef MLAF_GEMM_LAYOUT_H
#define MLAF_GEMM_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "mlafuse.h"

enum { GL_T = 3, GL_K = 640, GL_LAYOUTS = 5, GL_MAXG = 20, GL_SCALE_BYTES = 256 };
enum { GL_WRITER = 0, GL_OP = 1 };

typedef struct gl_layout {
    mlaf_gemm_format format;
    int groups;                /* G: 640 / 128 or 640 / 32 */
    int64_t ld;                /* the scales' leading stride used here (elements) */
    int64_t off[GL_T][GL_MAXG]; /* byte offset of group j's scale of row t, by hand */
    int zero[12];              /* bytes the packed layout writes as 0 (-1 ends) */
    int untouched[12][2];      /* byte ranges [a, b) no call may write (MN padding rows, row
                                  padding), {-1, -1} ends */
    int scale_bytes;           /* bytes of the scales buffer */
} gl_layout;

extern const gl_layout gl_layouts[GL_LAYOUTS];

typedef struct gl_buffers {
    _Alignas(16) uint8_t data[GL_T * GL_K];
    _Alignas(16) uint8_t scales[GL_SCALE_BYTES];
} gl_buffers;

/* Both buffers poisoned with 0xA5. */
void gl_fill(gl_buffers *b, const gl_layout *L);
/* The output over b's host buffers (or over dev_data / dev_scales when not NULL). */
mlaf_gemm_out gl_out(const gl_layout *L, mlaf_gemm_scale s, gl_buffers *b, mlaf_tensor *td, mlaf_tensor *ts);
mlaf_gemm_out gl_out_at(const gl_layout *L, mlaf_gemm_scale s, void *data, void *scales, mlaf_tensor *td,
                        mlaf_tensor *ts);
/* Row t of example ex (640 floats): GL_WRITER's rows; GL_OP's weights are its row 0. */
void gl_row(const gl_layout *L, int ex, int t, float *y);
/* The bytes of b after all rows were written, against the hand-made expectation of example `ex`;
 * 1 when every byte is right, else 0 with the first difference in why. */
int gl_judge(const gl_layout *L, mlaf_gemm_scale s, const gl_buffers *b, int ex, char *why, size_t cap);

/* The unfused second step, written from the definitions (frexp for the exponents): T rows of K
 * values y (row stride ys elements, each value already in dt) quantized into data [T, K] (row
 * stride K) and the format's scales buffer of leading stride ld (a packed layout's bytes past a
 * row's last group written 0, other padding left alone). */
void gl_quantize_pass(mlaf_gemm_format f, mlaf_gemm_scale m, float eps, const void *y, mlaf_dtype dt, int64_t T,
                      int64_t K, int64_t ys, uint8_t *data, uint8_t *scales, int64_t ld);
#endif
