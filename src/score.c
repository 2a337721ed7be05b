/*
 * score.c — the router's score functions table (score.h).
 */
#include "score.h"

#include <stdio.h>

const mlaf_score_info mlaf_score_table[] = {
    [MLAF_SCORE_SIGMOID] = {"sigmoid", 0},
    [MLAF_SCORE_SOFTMAX] = {"softmax", 1},
    [MLAF_SCORE_SQRT_SOFTPLUS] = {"sqrt_softplus", 0},
};
const int mlaf_score_count = (int)(sizeof mlaf_score_table / sizeof mlaf_score_table[0]);

const mlaf_score_info *mlaf_score_of(mlaf_score_func f) {
    const int i = (int)f;
    return i >= 0 && i < mlaf_score_count && mlaf_score_table[i].name ? &mlaf_score_table[i] : NULL;
}

const char *mlaf_score_func_name(mlaf_score_func f) {
    const mlaf_score_info *i = mlaf_score_of(f);
    return i ? i->name : "unknown";
}

void mlaf_score_list(char *buf, size_t cap) {
    size_t n = 0;
    if (cap) buf[0] = '\0';
    for (int i = 0; i < mlaf_score_count && n < cap; i++) {
        const char *sep = i == 0 ? "" : i + 1 < mlaf_score_count ? ", " : " or ";
        const int w = snprintf(buf + n, cap - n, "%s%d (%s)", sep, i, mlaf_score_table[i].name);
        if (w < 0) break;
        n += (size_t)w;
    }
}
