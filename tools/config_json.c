/*
 * config_json.c — a model from a Hugging Face config.json (DeepSeek-V2/V3, Kimi-K2,
 * GLM-4.x MoE-Lite configs), parsed with cJSON.
 *
 * Mapping (keys absent from a config take the default in brackets):
 *   q_lora_rank (null -> 0) [0], kv_lora_rank (required), qk_rope_head_dim (required),
 *   qk_nope_head_dim (required), v_head_dim [qk_nope_head_dim], num_attention_heads (required),
 *   n_routed_experts (required), num_experts_per_tok (required), n_group [1], topk_group [1],
 *   scoring_func "sigmoid" | "softmax" [sigmoid for noaux_tc, else softmax],
 *   topk_method: "noaux_tc" -> top-2 group sum with e_score_correction_bias,
 *                "group_limited_greedy" -> group max, no bias,
 *                "greedy" -> no group limit (n_group = topk_group = 1), no bias,
 *   norm_topk_prob [false], routed_scaling_factor [1.0], rms_norm_eps [1e-6],
 *   n_shared_experts [0], rope_interleave (bool) or rope_style "interleaved"|"neox"
 *   [interleaved], name from _name_or_path, else model_type, else the file name.
 * The routed scaling factor is applied inside the router, as in every preset.
 */
#define _POSIX_C_SOURCE 200809L /* strtok_r, strcasecmp */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli.h"

#ifdef MLAF_HAVE_CJSON
#include <cjson/cJSON.h>

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = (char *)malloc(cap + 1);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap) break;
        if (cap >= ((size_t)64 << 20)) { /* a config.json is a few KB; refuse giants */
            free(buf);
            buf = NULL;
            break;
        }
        char *nb = (char *)realloc(buf, cap * 2 + 1);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        *len = n;
    }
    return buf;
}

/* 0 ok with *out set; 1 absent; -1 wrong type (message printed). */
static int get_number(const cJSON *root, const char *key, const char *path, double *out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!it || cJSON_IsNull(it)) return 1;
    if (!cJSON_IsNumber(it)) {
        fprintf(stderr, "mlafuse: %s: \"%s\" is not a number\n", path, key);
        return -1;
    }
    *out = it->valuedouble;
    return 0;
}

static int get_int(const cJSON *root, const char *key, const char *path, int required,
                   int32_t dflt, int32_t lo, int32_t hi, int32_t *out) {
    double v;
    int r = get_number(root, key, path, &v);
    if (r < 0) return -1;
    if (r == 1) {
        if (required) {
            fprintf(stderr, "mlafuse: %s: key \"%s\" is missing (required for an MLA/MoE model)\n",
                    path, key);
            return -1;
        }
        *out = dflt;
        return 0;
    }
    if (v != (double)(long long)v || v < lo || v > hi) {
        fprintf(stderr, "mlafuse: %s: \"%s\" = %g, expected a whole number in %d .. %d\n", path,
                key, v, lo, hi);
        return -1;
    }
    *out = (int32_t)v;
    return 0;
}

static int get_bool(const cJSON *root, const char *key, const char *path, int dflt, int *out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!it || cJSON_IsNull(it)) {
        *out = dflt;
        return 0;
    }
    if (cJSON_IsBool(it)) {
        *out = cJSON_IsTrue(it);
        return 0;
    }
    fprintf(stderr, "mlafuse: %s: \"%s\" is not true/false\n", path, key);
    return -1;
}

static const char *get_string(const cJSON *root, const char *key) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    return cJSON_IsString(it) ? it->valuestring : NULL;
}

static int parse_config(const cJSON *root, const char *path, mlaf_model_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    const int32_t BIG = 1 << 20;
    if (get_int(root, "q_lora_rank", path, 0, 0, 0, BIG, &cfg->q_lora_rank)) return -1;
    if (get_int(root, "kv_lora_rank", path, 1, 0, 1, BIG, &cfg->kv_lora_rank)) return -1;
    if (get_int(root, "qk_rope_head_dim", path, 1, 0, 0, BIG, &cfg->qk_rope_head_dim)) return -1;
    if (cfg->qk_rope_head_dim % 2) {
        fprintf(stderr, "mlafuse: %s: \"qk_rope_head_dim\" = %d, expected even\n", path,
                cfg->qk_rope_head_dim);
        return -1;
    }
    if (get_int(root, "qk_nope_head_dim", path, 1, 0, 0, BIG, &cfg->qk_nope_head_dim)) return -1;
    if (get_int(root, "v_head_dim", path, 0, cfg->qk_nope_head_dim, 0, BIG, &cfg->v_head_dim))
        return -1;
    if (get_int(root, "num_attention_heads", path, 1, 0, 1, BIG, &cfg->num_heads)) return -1;
    if (get_int(root, "n_routed_experts", path, 1, 0, 1, 2048, &cfg->n_routed_experts)) return -1;
    if (get_int(root, "num_experts_per_tok", path, 1, 0, 1, 64, &cfg->top_k)) return -1;
    if (get_int(root, "n_group", path, 0, 1, 1, 64, &cfg->n_group)) return -1;
    if (get_int(root, "topk_group", path, 0, 1, 1, 64, &cfg->topk_group)) return -1;
    if (get_int(root, "n_shared_experts", path, 0, 0, 0, 64, &cfg->n_shared_experts)) return -1;

    const char *method = get_string(root, "topk_method");
    const char *scoring = get_string(root, "scoring_func");
    cfg->group_score = MLAF_GROUP_TOP2_SUM;
    cfg->has_score_bias = 0;
    if (!method || !strcasecmp(method, "noaux_tc")) {
        /* noaux_tc, and GLM-4.x configs that name no method, route with the bias. */
        cfg->has_score_bias = 1;
        if (!method && scoring && !strcasecmp(scoring, "softmax")) cfg->has_score_bias = 0;
    } else if (!strcasecmp(method, "group_limited_greedy")) {
        cfg->group_score = MLAF_GROUP_MAX;
    } else if (!strcasecmp(method, "greedy")) {
        cfg->group_score = MLAF_GROUP_MAX;
        cfg->n_group = cfg->topk_group = 1;
    } else {
        fprintf(stderr,
                "mlafuse: %s: \"topk_method\" = \"%s\", expected noaux_tc, group_limited_greedy "
                "or greedy\n",
                path, method);
        return -1;
    }
    if (!scoring)
        cfg->score_func = cfg->has_score_bias ? MLAF_SCORE_SIGMOID : MLAF_SCORE_SOFTMAX;
    else if (!strcasecmp(scoring, "sigmoid"))
        cfg->score_func = MLAF_SCORE_SIGMOID;
    else if (!strcasecmp(scoring, "softmax"))
        cfg->score_func = MLAF_SCORE_SOFTMAX;
    else {
        fprintf(stderr, "mlafuse: %s: \"scoring_func\" = \"%s\", expected sigmoid or softmax\n",
                path, scoring);
        return -1;
    }

    int b;
    if (get_bool(root, "norm_topk_prob", path, 0, &b)) return -1;
    cfg->norm_topk_prob = b;
    double d = 1.0;
    if (get_number(root, "routed_scaling_factor", path, &d) < 0) return -1;
    if (!(d > 0.0 && d < 1e30)) {
        fprintf(stderr, "mlafuse: %s: \"routed_scaling_factor\" = %g, expected > 0\n", path, d);
        return -1;
    }
    cfg->routed_scaling_factor = (float)d;
    cfg->apply_routed_scaling = 1;
    d = 1e-6;
    if (get_number(root, "rms_norm_eps", path, &d) < 0) return -1;
    if (!(d > 0.0 && d < 1.0)) {
        fprintf(stderr, "mlafuse: %s: \"rms_norm_eps\" = %g, expected 0 < eps < 1\n", path, d);
        return -1;
    }
    cfg->rms_norm_eps = (float)d;

    cfg->rope_style = MLAF_ROPE_INTERLEAVED;
    if (get_bool(root, "rope_interleave", path, 1, &b)) return -1;
    if (!b) cfg->rope_style = MLAF_ROPE_NEOX;
    const char *style = get_string(root, "rope_style");
    if (style) {
        if (!strcasecmp(style, "neox"))
            cfg->rope_style = MLAF_ROPE_NEOX;
        else if (!strcasecmp(style, "interleaved") || !strcasecmp(style, "gptj"))
            cfg->rope_style = MLAF_ROPE_INTERLEAVED;
        else {
            fprintf(stderr, "mlafuse: %s: \"rope_style\" = \"%s\", expected interleaved or neox\n",
                    path, style);
            return -1;
        }
    }

    /* The router's limits (SPEC §4), reported by key name rather than by parameter. */
    if (cfg->n_routed_experts % cfg->n_group) {
        fprintf(stderr, "mlafuse: %s: \"n_group\" = %d does not divide \"n_routed_experts\" = %d\n",
                path, cfg->n_group, cfg->n_routed_experts);
        return -1;
    }
    if (cfg->topk_group > cfg->n_group) {
        fprintf(stderr, "mlafuse: %s: \"topk_group\" = %d, expected <= \"n_group\" = %d\n", path,
                cfg->topk_group, cfg->n_group);
        return -1;
    }
    int32_t kept = cfg->topk_group * (cfg->n_routed_experts / cfg->n_group);
    if (cfg->top_k > cfg->n_routed_experts || cfg->top_k > kept) {
        fprintf(stderr,
                "mlafuse: %s: \"num_experts_per_tok\" = %d, expected <= the %d experts of the "
                "kept groups\n",
                path, cfg->top_k, kept);
        return -1;
    }
    if (cfg->n_group > 1 && cfg->group_score == MLAF_GROUP_TOP2_SUM &&
        cfg->n_routed_experts / cfg->n_group < 2) {
        fprintf(stderr, "mlafuse: %s: noaux_tc needs >= 2 experts per group\n", path);
        return -1;
    }

    const char *name = get_string(root, "_name_or_path");
    if (!name || !*name) name = get_string(root, "model_type");
    if (name && *name) {
        const char *slash = strrchr(name, '/'); /* "org/model" -> "model" */
        if (slash && slash[1]) name = slash + 1;
        snprintf(cfg->name, sizeof cfg->name, "%s", name);
    } else {
        const char *base = strrchr(path, '/');
        snprintf(cfg->name, sizeof cfg->name, "%s", base ? base + 1 : path);
    }
    return 0;
}

int cli_load_hf_config(const char *path, mlaf_model_config *cfg) {
    size_t len = 0;
    char *text = read_file(path, &len);
    if (!text) {
        fprintf(stderr, "mlafuse: --config %s: cannot read the file (or larger than 64 MB)\n",
                path);
        return -1;
    }
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root || !cJSON_IsObject(root)) {
        const char *at = cJSON_GetErrorPtr();
        fprintf(stderr, "mlafuse: --config %s: not a JSON object%s%.40s%s\n", path,
                at ? " (near: " : "", at ? at : "", at ? ")" : "");
        cJSON_Delete(root);
        free(text);
        return -1;
    }
    int r = parse_config(root, path, cfg);
    cJSON_Delete(root);
    free(text);
    return r;
}

#else /* no cJSON */

int cli_load_hf_config(const char *path, mlaf_model_config *cfg) {
    (void)cfg;
    fprintf(stderr,
            "mlafuse: --config %s: this build has no JSON support; install cJSON "
            "(Debian/Ubuntu: apt-get install libcjson-dev) and re-run cmake\n",
            path);
    return -1;
}

#endif
