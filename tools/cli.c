/*
 * cli.c — small chores shared by the commands: parsing option values into checked numbers,
 * dtypes, backends and ops, with one message naming the option for every bad value.
 */
#define _POSIX_C_SOURCE 200809L /* strtok_r, strcasecmp */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli.h"
#include "ref/verify.h"

const char *cli_program = "mlafuse";

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "mlafuse %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return CLI_EXIT_USAGE;
}

int cli_take_value(int argc, char **argv, int *i, const char *name, const char **value) {
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0) return 0;
    if (a[n] == '=') {
        *value = a + n + 1;
        return 1;
    }
    if (a[n] != '\0') return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "mlafuse: option %s needs a value\n", name);
        return -1;
    }
    *value = argv[++*i];
    return 1;
}

/* strtoll with an optional k / m suffix; 0 on success. */
static int parse_ll(const char *s, long long *out) {
    if (!s || !*s) return -1;
    errno = 0;
    char *end = NULL;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || end == s) return -1;
    long long mul = 1;
    if (*end == 'k' || *end == 'K') {
        mul = 1024;
        end++;
    } else if (*end == 'm' || *end == 'M') {
        mul = 1024 * 1024;
        end++;
    }
    if (*end != '\0') return -1;
    if (v > (long long)1 << 40 || v < -((long long)1 << 40)) return -1;
    *out = v * mul;
    return 0;
}

int cli_parse_int(const char *opt, const char *text, long long lo, long long hi,
                  long long *out) {
    long long v;
    if (parse_ll(text, &v) != 0) {
        fprintf(stderr, "mlafuse: %s = '%s', expected a whole number\n", opt, text ? text : "");
        return -1;
    }
    if (v < lo || v > hi) {
        fprintf(stderr, "mlafuse: %s = %lld, expected %lld .. %lld\n", opt, v, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_int_list(const char *opt, const char *text, int64_t min_value, int64_t *out,
                       int cap) {
    if (!text || !*text) {
        fprintf(stderr, "mlafuse: %s is empty, expected a comma-separated list like 1,7,64\n",
                opt);
        return -1;
    }
    char buf[1024];
    if (strlen(text) >= sizeof buf) {
        fprintf(stderr, "mlafuse: %s is too long\n", opt);
        return -1;
    }
    strcpy(buf, text);
    int n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        long long v;
        if (n >= cap) {
            fprintf(stderr, "mlafuse: %s has more than %d values\n", opt, cap);
            return -1;
        }
        if (cli_parse_int(opt, tok, min_value, ((long long)1 << 31) - 1, &v) != 0) return -1;
        out[n++] = v;
    }
    if (n == 0) {
        fprintf(stderr, "mlafuse: %s = '%s', expected a comma-separated list like 1,7,64\n", opt,
                text);
        return -1;
    }
    return n;
}

int cli_parse_dtype(const char *opt, const char *text, mlaf_dtype *out) {
    static const mlaf_dtype dts[3] = {MLAF_F32, MLAF_F16, MLAF_BF16};
    for (int i = 0; i < 3; i++)
        if (strcasecmp(text, mlaf_dtype_name(dts[i])) == 0) {
            *out = dts[i];
            return 0;
        }
    fprintf(stderr, "mlafuse: %s = '%s', expected f32, f16 or bf16\n", opt, text);
    return -1;
}

int cli_parse_backend(const char *opt, const char *text, mlaf_backend *out) {
    for (int b = 0; b < MLAF_BACKEND_COUNT_; b++)
        if (strcasecmp(text, mlaf_backend_name((mlaf_backend)b)) == 0) {
            *out = (mlaf_backend)b;
            return 0;
        }
    fprintf(stderr, "mlafuse: %s = '%s', expected cpu or cuda\n", opt, text);
    return -1;
}

int cli_parse_op(const char *opt, const char *text, mlaf_op *out) {
    for (int o = 0; o < MLAF_OP_COUNT_; o++)
        if (strcasecmp(text, mlaf_op_name((mlaf_op)o)) == 0) {
            *out = (mlaf_op)o;
            return 0;
        }
    fprintf(stderr,
            "mlafuse: %s = '%s', expected split_qk_norm, mla_kv_cache, rope_q, moe_gate, indexer_q or all\n",
            opt, text);
    return -1;
}

int cli_parse_op_set(const char *opt, const char *text, int *want_op) {
    if (strcasecmp(text, "all") == 0) {
        for (int o = 0; o < MLAF_OP_COUNT_; o++) want_op[o] = 1;
        return 0;
    }
    mlaf_op op;
    if (cli_parse_op(opt, text, &op)) return -1;
    for (int o = 0; o < MLAF_OP_COUNT_; o++) want_op[o] = (o == (int)op);
    return 0;
}

int cli_find_model(const char *name, mlaf_model_config *cfg, int32_t *kv_rope_tail) {
    const mlaf_model_config *p = mlaf_preset_find(name);
    *kv_rope_tail = 0;
    if (!p) return -1;
    *cfg = *p;
    *kv_rope_tail = p->kv_rope_tail;
    return 0;
}

int cli_check_preset(const char *cmd, const char *text) {
    mlaf_model_config m;
    int32_t tail;
    if (strcasecmp(text, "all") && cli_find_model(text, &m, &tail))
        return cli_usage_error(cmd, "--preset = '%s' is not a preset (see mlafuse presets)", text);
    return 0;
}

const char *cli_score_text(const mlaf_model_config *cfg) {
    static char text[48];
    snprintf(text, sizeof text, "%s%s", mlaf_score_func_name(cfg->score_func),
             cfg->has_score_bias ? "+bias" : "");
    return text;
}

int cli_sweep_models(const mlaf_model_config *base, mlaf_model_config *out, int cap) {
    static const int32_t qs[] = {0, 512, 768, 1024, 1536, 2048, 3072}, rs[] = {0, 64};
    int n = 0;
    for (int r = 0; r < 2; r++)
        for (int q = 0; q < 7 && n < cap; q++) {
            mlaf_model_config m = *base;
            m.q_lora_rank = qs[q], m.kv_lora_rank = 512, m.qk_rope_head_dim = rs[r];
            snprintf(m.name, sizeof m.name, "sweep-q%d-r%d", qs[q], rs[r]);
            out[n++] = m;
        }
    return n;
}
