/*
 * mla_kv_cache_fmt_common.h — what the cache-format tests of mla_kv_cache share
 * (test_mla_kv_cache_formats, test_mla_kv_cache_fp8_layout, test_mla_kv_cache_fp8_reject): the
 * formats they run, and one direct mla_kv_cache_fmt call with guarded buffers
 * (mla_kv_cache_fmt_common.c). The formats (docs/kv_formats.md), on every backend: plain with the separate
 * kpe array, fp8 per-tensor (DIV / MUL, amax_out, separate kpe) and fp8_ds_mla (amax / ue8m0 /
 * ue8m0_floor_scaled tile scales). The cases, by test:
 *
 *   VERIFY         the oracle harness (mlaf_verify_mla_kv_cache): dense outputs against float64,
 *                  every record byte against the reference encoder applied to the op's own
 *                  dense row, decoding within half an e4m3 ulp, amax_out, canaries; presets x
 *                  dtypes x T x block size x layout, slot_mapping shorter than T
 *   LAYOUT_*       hand-built rows whose bytes are known: the 656-B fp8_ds_mla record (tile
 *                  scales at byte 512, rope bf16 at byte 528) in every tile-scale mode, the
 *                  576-B fp8 record (rope e4m3 at byte 512) in both conventions
 *   DECODE /       a direct call: every written record decoded back (e4m3 x scale, or / for MUL;
 *   SAME_BYTES     x the record's tile scale) within half an e4m3 ulp of the dense row, the
 *                  ds_mla rope part equal to the dense bf16 bits; the cache bytes of the same
 *                  call without the dense outputs identical
 *   REJECT         bad descriptions: the status, a message naming the argument, nothing written
 *   SHORT_MAP      slot_mapping with N < T entries: rows t >= N write no cache row, q is written
 *   DECODE_BOUND   the harness's half-ulp bound accepts the converter's bytes, not their
 *                  neighbours
 */
#ifndef MLAF_MLA_KV_CACHE_FMT_COMMON_H
#define MLAF_MLA_KV_CACHE_FMT_COMMON_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fp8.h"
#include "testlib.h"

static inline int filtered_out(const char *name) {
    const char *f = getenv("MLAF_TEST_FILTER");
    return f && *f && !strstr(name, f);
}

typedef struct fmt_case {
    const char *label;
    mlaf_kv_format format;
    mlaf_fp8_conv conv;
    mlaf_tile_scale tile;
    int kpe;
} fmt_case;

static const fmt_case FORMATS[] = {
    {"plain,kpe", MLAF_KV_PLAIN, MLAF_FP8_DIV, MLAF_TILE_AMAX, 1},
    {"fp8,div", MLAF_KV_FP8, MLAF_FP8_DIV, MLAF_TILE_AMAX, 0},
    {"fp8,mul", MLAF_KV_FP8, MLAF_FP8_MUL, MLAF_TILE_AMAX, 0},
    {"fp8,div,kpe", MLAF_KV_FP8, MLAF_FP8_DIV, MLAF_TILE_AMAX, 1},
    {"fp8,mul,kpe", MLAF_KV_FP8, MLAF_FP8_MUL, MLAF_TILE_AMAX, 1},
    {"fp8_ds_mla,amax", MLAF_KV_FP8_DS_MLA, MLAF_FP8_DIV, MLAF_TILE_AMAX, 0},
    {"fp8_ds_mla,ue8m0", MLAF_KV_FP8_DS_MLA, MLAF_FP8_DIV, MLAF_TILE_UE8M0, 0},
    {"fp8_ds_mla,ue8m0_floor_scaled", MLAF_KV_FP8_DS_MLA, MLAF_FP8_DIV, MLAF_TILE_UE8M0_FLOOR_SCALED, 0},
};
#define NFORMATS ((int)(sizeof FORMATS / sizeof FORMATS[0]))
/* ---- direct calls ------------------------------------------------------------------------ */

/* One mla_kv_cache_fmt call: host images (random unless a test sets them), then backend
 * buffers. Outputs start as 0xFF (q, k_nope, k_pe), canary bytes (the caches), amax_init and 0
 * (error_count); cache2 / kpe2 / amax2 are a second set with the same start, for a second
 * call. */
typedef struct kv_call {
    mlaf_backend be;
    int32_t Q, C, R;
    int64_t T, N, bs, nb, maxpos;
    mlaf_dtype dt, cdt;
    mlaf_kv_format format;
    mlaf_fp8_conv conv;
    mlaf_tile_scale tile;
    int kpe, amax;
    float scale, amax_init;
    int64_t width, s0, s1, ks0, ks1;
    unsigned char *lat, *canary, *kcanary;
    float *wq, *wkv, *cs;
    int64_t *pos, *slot;
    mlaf_gbuf gl, gwq, gwkv, gpos, gslot, gcs, gscale, gq, gk, gp, gec;
    mlaf_gbuf gcache, gkpe, gamax, gcache2, gkpe2, gamax2;
} kv_call;

/* The call's arguments as tensors; a test may spoil any of them before kv_invoke. */
typedef struct kv_args {
    mlaf_mla_kv_cache_params p;
    mlaf_tensor lat, wq, wkv, pos, cs, slot, cache, kpe, scale, amax, q, k, pe, ec;
    mlaf_kv_cache_desc d;
    int use_q, use_k, use_pe, use_ec;
} kv_args;

size_t cache_bytes(const kv_call *k);
size_t kpe_bytes(const kv_call *k);
int kv_make(kv_call *k, mlaf_backend be, int32_t Q, int32_t C, int32_t R, int64_t T, int64_t bs,
            mlaf_dtype dt, mlaf_kv_format f, uint64_t seed);
unsigned char *canary_image(size_t n, uint64_t seed);
int kv_alloc(kv_call *k);
void kv_free(kv_call *k);
void kv_args_of(const kv_call *k, int second, kv_args *a);
mlaf_status kv_invoke(mlaf_context *ctx, const kv_call *k, kv_args *a);
mlaf_status kv_download(kv_call *k);
const unsigned char *rec_byte(const kv_call *k, const mlaf_gbuf *cache, const mlaf_gbuf *kpe, int64_t slot,
                              int64_t i);
double e4m3_bound(double y);

#endif
