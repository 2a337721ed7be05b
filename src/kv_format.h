/*
 * kv_format.h — the KV-cache formats of mla_kv_cache, one descriptor row each.
 *
 * Everything the library and its tools need to know about a format and that is not its
 * arithmetic lives in its row of mlaf_kv_formats[] (kv_format.c): the name, what the cache
 * tensor may be, which parts of mlaf_kv_cache_desc it takes, the bytes of one token's record and
 * the layout rules (with their messages). Validation (validate.c), mlaf_kv_format_name,
 * mlaf_kv_record_bytes, the tools' lists and loops and the Python names read the rows.
 *
 * Beside this table, each format has, under the same enum value:
 *   - its CPU writer            src/cpu/norm_writers.c   (mlaf_cpu_cache_writers[])
 *   - its CUDA writer           src/cuda/row_writers*.cuh (mlaf_kv_writer_of<F>, one specialization)
 *   - its oracle encoder        src/ref/ref_kv_format.c  (mlaf_ref_kv_formats[])
 * and its tests. Adding a format is: the enum value (include/mlafuse/mla.h), a row here, those
 * three, and its tests. A table whose size is not MLAF_KV_FORMAT_COUNT_ does not compile.
 */
#ifndef MLAF_KV_FORMAT_H
#define MLAF_KV_FORMAT_H

#include "internal.h"

/* What a format's description (mlaf_kv_cache_desc) and its call may carry. */
enum {
    MLAF_KVF_KPE = 1u << 0,         /* the rope part may live in a separate kpe array */
    MLAF_KVF_SCALE = 1u << 1,       /* a per-tensor scale [1] f32 (required), conv, optional amax_out */
    MLAF_KVF_TILE_SCALE = 1u << 2,  /* desc.tile_scale picks the scale mode of its tiles */
    MLAF_KVF_BF16_LATENT = 1u << 3, /* the latent (and so every value it stores) is bf16 */
    MLAF_KVF_TAIL = 1u << 4,        /* accepts kv_rope_tail > 0 */
};

typedef struct mlaf_kv_format_info {
    const char *name;     /* as mlaf_kv_format_name returns it and the tools / Python spell it */
    const char *summary;  /* one line for lists and help texts */
    unsigned cache_dtypes; /* dtypes the cache (and kpe) tensor may have, a mask of 1 << dtype */
    unsigned flags;        /* MLAF_KVF_* */
    /* Bytes of one token's record in a cache of dtype dt (plain: its C + R elements' bytes), 0 when
     * the dtype or the dims do not suit the format. Called with C > 0, 0 <= R even. */
    int64_t (*record_bytes)(mlaf_dtype dt, int32_t C, int32_t R);
    /* The format's own rules, after the shared ones (the format index, the flags above) held:
     * on the dims (NULL: none), then on the cache view and its layout. Each records a message
     * naming the argument (when ctx is not NULL) and returns the error, else MLAF_OK. kpe: the
     * separate rope array or NULL (only with MLAF_KVF_KPE). */
    mlaf_status (*check_dims)(mlaf_context *ctx, int32_t C, int32_t R, int32_t tail);
    mlaf_status (*check_cache)(mlaf_context *ctx, const mlaf_tensor *cache, const mlaf_tensor *kpe, int32_t C,
                               int32_t R);
} mlaf_kv_format_info;

extern const mlaf_kv_format_info mlaf_kv_formats[MLAF_KV_FORMAT_COUNT_];

/* The row of f, or NULL for a value outside the enum. */
static inline const mlaf_kv_format_info *mlaf_kv_format_row(mlaf_kv_format f) {
    return (unsigned)f < MLAF_KV_FORMAT_COUNT_ ? &mlaf_kv_formats[f] : (const mlaf_kv_format_info *)0;
}

/* Whether format f can hold the rows of a model with these dims and this latent dtype (the
 * rules a tool uses to pick the formats of a preset; validation says why not). */
int mlaf_kv_format_fits(mlaf_kv_format f, mlaf_dtype latent_dt, int32_t C, int32_t R, int32_t tail);

/* "0 (plain), 1 (fp8), 2 (fp8_ds_mla) or 3 (fp8_v4)": the formats with all of the flags in `need`,
 * for messages. */
const char *mlaf_kv_format_list(unsigned need, char *buf, size_t cap, int with_values);

#endif
