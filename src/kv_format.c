/*
 * kv_format.c — the rows of the KV-cache format table (kv_format.h): per format, its name, the
 * cache dtypes, what its description carries, its record's bytes and its layout rules.
 * The byte layouts themselves are stated in docs/kv_formats.md.
 */
#include <stdio.h>
#include <string.h>

#include "kv_format.h"
#include "validate_common.h"

/* ---- plain: [C | R] values in the cache dtype, or [C] with the R values in kpe ----------- */
static int64_t plain_bytes(mlaf_dtype dt, int32_t C, int32_t R) {
    return DT_FLOAT & DT_(dt) ? ((int64_t)C + R) * (int64_t)mlaf_dtype_size(dt) : 0;
}

/* plain and fp8 share their shape: one value (element) a column */
static mlaf_status columns_check(mlaf_context *ctx, const mlaf_tensor *cache, const mlaf_tensor *kpe, int32_t C,
                                 int32_t R, const char *what, unsigned dts) {
    char wexpr[96];
    snprintf(wexpr, sizeof wexpr, "%s%s", what, kpe ? "kv_lora_rank (rope part in kpe)" : "kv_lora_rank + rope_dim");
    return mlaf_vcheck_cache_view(ctx, cache, "kv_cache", dts, kpe ? C : (int64_t)C + R, wexpr);
}

static mlaf_status plain_check(mlaf_context *ctx, const mlaf_tensor *cache, const mlaf_tensor *kpe, int32_t C,
                               int32_t R) {
    return columns_check(ctx, cache, kpe, C, R, "", DT_FLOAT);
}

/* ---- fp8: the same columns as e4m3 bytes, one per-tensor scale ---------------------------- */
static int64_t fp8_bytes(mlaf_dtype dt, int32_t C, int32_t R) { return DT_BYTES & DT_(dt) ? (int64_t)C + R : 0; }

static mlaf_status fp8_check(mlaf_context *ctx, const mlaf_tensor *cache, const mlaf_tensor *kpe, int32_t C,
                             int32_t R) {
    return columns_check(ctx, cache, kpe, C, R, "fp8 bytes ", DT_BYTES);
}

/* ---- fp8_ds_mla: [C e4m3 | C/128 f32 tile scales | R bf16] ------------------------------- */
static int64_t ds_mla_bytes(mlaf_dtype dt, int32_t C, int32_t R) {
    return DT_BYTES & DT_(dt) && C % 128 == 0 ? (int64_t)C + C / 32 + 2 * (int64_t)R : 0;
}

static mlaf_status ds_mla_dims(mlaf_context *ctx, int32_t C, int32_t R, int32_t tail) {
    (void)R, (void)tail;
    if (C % 128 != 0)
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                         "kv_lora_rank = %d, expected a multiple of 128 for cache format fp8_ds_mla "
                         "(one scale per 128 values)",
                         C);
    return MLAF_OK;
}

static mlaf_status ds_mla_check(mlaf_context *ctx, const mlaf_tensor *cache, const mlaf_tensor *kpe, int32_t C,
                                int32_t R) {
    (void)kpe;
    TRY(mlaf_vcheck_cache_view(ctx, cache, "kv_cache", DT_BYTES, ds_mla_bytes(MLAF_U8, C, R),
                               "fp8_ds_mla record bytes kv_lora_rank + kv_lora_rank / 32 + 2 rope_dim"));
    if ((uintptr_t)cache->data % 16 || cache->stride[0] % 16 || cache->stride[1] % 16)
        return mlaf_fail(ctx, MLAF_ERR_STRIDE,
                         "kv_cache: data = %p, strides (%lld, %lld) bytes, expected 16-byte aligned data "
                         "and strides multiples of 16 for fp8_ds_mla",
                         cache->data, (long long)cache->stride[0], (long long)cache->stride[1]);
    return MLAF_OK;
}

/* ---- fp8_v4: planar pages of [448 e4m3 | 64 bf16] data rows, then [7 UE8M0 | 0] scale rows -- */
static int64_t v4_bytes(mlaf_dtype dt, int32_t C, int32_t R) {
    return DT_BYTES & DT_(dt) && C == 512 && R == 0 ? 584 : 0;
}

static mlaf_status v4_dims(mlaf_context *ctx, int32_t C, int32_t R, int32_t tail) {
    if (C != 512 || R != 0 || tail != 64)
        return mlaf_fail(ctx, MLAF_ERR_INVALID_ARGUMENT,
                         "kv_lora_rank = %d, rope_dim = %d, kv_rope_tail = %d, expected 512, 0 and 64 for "
                         "cache format fp8_v4 (DeepSeek-V4's 584-byte record)",
                         C, R, tail);
    return MLAF_OK;
}

static mlaf_status v4_check(mlaf_context *ctx, const mlaf_tensor *cache, const mlaf_tensor *kpe, int32_t C,
                            int32_t R) {
    (void)kpe, (void)C, (void)R;
    TRY(mlaf_vcheck_cache_view(ctx, cache, "kv_cache", DT_BYTES, 584, "fp8_v4 record bytes 584"));
    if (cache->stride[1] != 584)
        return mlaf_fail(ctx, MLAF_ERR_STRIDE,
                         "kv_cache.stride[1] = %lld, expected 584 for fp8_v4 (a page is planar: the "
                         "pages' stride is stride[0])",
                         (long long)cache->stride[1]);
    if ((uintptr_t)cache->data % 16 || cache->stride[0] % 16 || cache->stride[0] < cache->shape[1] * 584)
        return mlaf_fail(ctx, MLAF_ERR_STRIDE,
                         "kv_cache: data = %p, stride[0] = %lld bytes, expected 16-byte aligned data and "
                         "a page stride >= block_size * 584 = %lld, a multiple of 16, for fp8_v4",
                         cache->data, (long long)cache->stride[0], (long long)(cache->shape[1] * 584));
    return MLAF_OK;
}

/* ---- the table -------------------------------------------------------------------------- */
const mlaf_kv_format_info mlaf_kv_formats[MLAF_KV_FORMAT_COUNT_] = {
    [MLAF_KV_PLAIN] = {"plain", "the values in bf16 / f16 / f32, [k_nope | k_pe] per token (k_pe apart with kpe)",
                       DT_FLOAT, MLAF_KVF_KPE | MLAF_KVF_TAIL, plain_bytes, NULL, plain_check},
    [MLAF_KV_FP8] = {"fp8", "per-tensor e4m3, one f32 scale (x / scale or x * scale), k_pe apart with kpe",
                     DT_BYTES, MLAF_KVF_KPE | MLAF_KVF_SCALE | MLAF_KVF_TAIL, fp8_bytes, NULL, fp8_check},
    [MLAF_KV_FP8_DS_MLA] = {"fp8_ds_mla",
                            "FlashMLA's sparse record: e4m3 tiles of 128 with f32 scales, then k_pe in bf16 (656 B)",
                            DT_BYTES, MLAF_KVF_TILE_SCALE | MLAF_KVF_BF16_LATENT, ds_mla_bytes, ds_mla_dims, ds_mla_check},
    [MLAF_KV_FP8_V4] = {"fp8_v4",
                        "DeepSeek-V4's FlashMLA page: 448 e4m3 + 64 bf16, UE8M0 scales per 64 (584 B)",
                        DT_BYTES, MLAF_KVF_BF16_LATENT | MLAF_KVF_TAIL, v4_bytes, v4_dims, v4_check},
};

int mlaf_kv_format_fits(mlaf_kv_format f, mlaf_dtype latent_dt, int32_t C, int32_t R, int32_t tail) {
    const mlaf_kv_format_info *k = mlaf_kv_format_row(f);
    if (!k || C <= 0 || R < 0 || R % 2 != 0) return 0;
    if ((k->flags & MLAF_KVF_BF16_LATENT) && latent_dt != MLAF_BF16) return 0;
    if (tail > 0 && !(k->flags & MLAF_KVF_TAIL)) return 0;
    if (k->check_dims && k->check_dims(NULL, C, R, tail) != MLAF_OK) return 0;
    for (int d = 0; d < MLAF_DTYPE_COUNT_; d++)
        if ((k->cache_dtypes & DT_(d)) && k->record_bytes((mlaf_dtype)d, C, R) > 0) return 1;
    return 0;
}

const char *mlaf_kv_format_list(unsigned need, char *buf, size_t cap, int with_values) {
    int n = 0, total = 0;
    for (int f = 0; f < MLAF_KV_FORMAT_COUNT_; f++) total += (mlaf_kv_formats[f].flags & need) == need;
    buf[0] = '\0';
    for (int f = 0; f < MLAF_KV_FORMAT_COUNT_; f++) {
        if ((mlaf_kv_formats[f].flags & need) != need) continue;
        const size_t len = strlen(buf);
        const char *sep = n == 0 ? "" : n == total - 1 ? " or " : ", ";
        if (with_values)
            snprintf(buf + len, cap - len, "%s%d (%s)", sep, f, mlaf_kv_formats[f].name);
        else
            snprintf(buf + len, cap - len, "%s%s", sep, mlaf_kv_formats[f].name);
        n++;
    }
    return buf;
}
