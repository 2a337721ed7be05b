/*
 * validate_common.h — what the argument checks share (validate*.c, kv_format.c, gemm_format.c):
 * dtype masks and the early return of a failed check.
 */
#ifndef MLAF_VALIDATE_COMMON_H
#define MLAF_VALIDATE_COMMON_H

#include "internal.h"

#define DT_(d) (1u << (d))
#define DT_FLOAT (DT_(MLAF_F32) | DT_(MLAF_F16) | DT_(MLAF_BF16))
#define DT_INDEX (DT_(MLAF_I32) | DT_(MLAF_I64))
#define DT_BYTES (DT_(MLAF_U8) | DT_(MLAF_FP8_E4M3))

#define TRY(expr)                          \
    do {                                   \
        mlaf_status st_ = (expr);          \
        if (st_ != MLAF_OK) return st_;    \
    } while (0)

#endif
