/*
 * config_json.c — a model from a Hugging Face config.json (DeepSeek-V2/V3/V4, Kimi-K2/K3,
 * GLM-4.x / GLM-5 configs), parsed with cJSON.
 *
 * A config whose model keys sit in a "text_config" object (the multimodal wrappers: Kimi-K2.5,
 * Kimi-K3, GLM-5.3-Flash, DeepSeek-V4.1-Flash) is read from that object; the name and
 * model_type fall back to the outer object's when the inner one has none.
 * Mapping (keys absent from a config take the default in brackets):
 *   q_lora_rank (null -> 0) [0], kv_lora_rank (required), qk_rope_head_dim (required),
 *   qk_nope_head_dim (required), v_head_dim [qk_nope_head_dim], num_attention_heads (required),
 *   n_routed_experts (required), num_experts_per_tok (required), n_group [1], topk_group [1],
 *   (Kimi-Linear's names stand in for absent keys: num_experts, num_experts_per_token,
 *   num_shared_experts, num_expert_group, moe_renormalize, moe_router_activation_func),
 *   scoring_func "sigmoid" | "softmax" [sigmoid for noaux_tc, else softmax],
 *   topk_method: "noaux_tc" -> top-2 group sum with e_score_correction_bias,
 *                "group_limited_greedy" -> group max, no bias,
 *                "greedy" -> no group limit (n_group = topk_group = 1), no bias,
 *   norm_topk_prob [false], routed_scaling_factor [1.0], rms_norm_eps [1e-6],
 *   n_shared_experts [0], rope_interleave (bool) or rope_style "interleaved"|"neox"|"none"
 *   [interleaved], mla_use_nope true (Kimi-Linear, Kimi-K3) -> style none, name from _name_or_path, else model_type, else the file name.
 * The routed scaling factor is applied inside the router, as in every preset.
 * RoPE: rope_theta [10000]; rope_scaling (or rope_parameters, transformers' newer name) absent,
 *   null or {"type" | "rope_type": "default"}: plain; "yarn": factor (required),
 *   original_max_position_embeddings [max_position_embeddings, as transformers falls back],
 *   beta_fast [32], beta_slow [1] (0 also takes the default, as transformers reads them),
 *   mscale, mscale_all_dim, attention_factor [absent], truncate [true]. Any other type, a type
 *   that is not a string, or a key yarn does not have, is an error: a table built while
 *   ignoring it would be wrong.
 * Ranges: every integer key is checked on the JSON number (a double) before any conversion: a
 *   whole number in the key's range, else an error naming the key and the value. rope_theta in
 *   (1, 1e12], and yarn's numbers in the ranges mlaf_rope_table_init_scaled accepts (mla.h's
 *   MLAF_YARN_MAX_*): factor [1, 1e6], original_max_position_embeddings [1, 2^31 - 1],
 *   beta_fast and beta_slow (0, 1000], mscale, mscale_all_dim and attention_factor [0, 100].
 */
#define _POSIX_C_SOURCE 200809L /* strtok_r, strcasecmp */
#include <math.h>
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

/* v as the shortest %g text that reads back as v ("1e+19", "9.223372036854776e+18", "inf"). */
static const char *num_text(double v, char *buf, size_t cap) {
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        if (strtod(buf, NULL) == v || v != v) break;
    }
    return buf;
}

/* An integer key: the double is range-checked (and checked whole) before any conversion, so a
 * value no int32_t or long long holds (1e19, 1e300, 1e999 = inf, 2^63) is reported, not converted. */
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
    if (!(v >= (double)lo && v <= (double)hi) || v != floor(v)) {
        char buf[40];
        fprintf(stderr, "mlafuse: %s: \"%s\" = %s, expected an integer in [%d, %d]\n", path, key,
                num_text(v, buf, sizeof buf), lo, hi);
        return -1;
    }
    *out = (int32_t)v;
    return 0;
}

/* A number key of rope_scaling / rope_parameters (`what` names the object) in [lo, hi], or in
 * (lo, hi] when lo_open. 0 ok with *out set; 1 absent; -1 after a message. */
static int get_ranged(const cJSON *obj, const char *what, const char *key, const char *path,
                      double lo, int lo_open, double hi, double *out) {
    double v;
    int r = get_number(obj, key, path, &v);
    if (r != 0) return r;
    if (!((lo_open ? v > lo : v >= lo) && v <= hi)) {
        char buf[40];
        fprintf(stderr, "mlafuse: %s: %s\"%s\" = %s, expected a number in %c%g, %g]\n", path,
                what, key, num_text(v, buf, sizeof buf), lo_open ? '(' : '[', lo, hi);
        return -1;
    }
    *out = v;
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

/* 0 ok; -1 after a message. `obj` is the rope_scaling (or rope_parameters) object. */
static int parse_yarn(const cJSON *root, const cJSON *obj, const char *key, const char *path,
                      mlaf_rope_scaling *sc) {
    static const char *const known[] = {"type", "rope_type", "rope_theta", "factor",
                                        "original_max_position_embeddings", "beta_fast",
                                        "beta_slow", "mscale", "mscale_all_dim",
                                        "attention_factor", "truncate"};
    for (const cJSON *it = obj->child; it; it = it->next) {
        size_t k = 0;
        while (k < sizeof known / sizeof known[0] && strcmp(it->string, known[k])) k++;
        if (k == sizeof known / sizeof known[0]) {
            fprintf(stderr,
                    "mlafuse: %s: \"%s\" (yarn) has the key \"%s\", which yarn does not have; "
                    "expected factor, original_max_position_embeddings, beta_fast, beta_slow, "
                    "mscale, mscale_all_dim, attention_factor, truncate\n",
                    path, key, it->string);
            return -1;
        }
    }
    char what[64];
    snprintf(what, sizeof what, "\"%s\" (yarn): ", key);
    double factor = 0, orig = 0, v;
    int r = get_ranged(obj, what, "factor", path, 1.0, 0, MLAF_YARN_MAX_FACTOR, &factor);
    if (r < 0) return -1;
    if (r == 1) {
        fprintf(stderr, "mlafuse: %s: \"%s\" (yarn) has no \"factor\"\n", path, key);
        return -1;
    }
    const char *okey = "original_max_position_embeddings";
    r = get_number(obj, okey, path, &orig);
    if (r < 0) return -1;
    if (r == 1) {
        okey = "max_position_embeddings";
        if ((r = get_number(root, okey, path, &orig)) != 0) {
            if (r == 1)
                fprintf(stderr,
                        "mlafuse: %s: \"%s\" (yarn) has no \"original_max_position_embeddings\" "
                        "and the config no \"max_position_embeddings\"\n",
                        path, key);
            return -1;
        }
    }
    if (!(orig >= 1 && orig <= MLAF_YARN_MAX_ORIGINAL) || orig != floor(orig)) {
        char buf[40];
        fprintf(stderr, "mlafuse: %s: \"%s\" = %s, expected an integer in [1, %d]%s\n", path,
                okey, num_text(orig, buf, sizeof buf), MLAF_YARN_MAX_ORIGINAL,
                okey[0] == 'm' ? " (yarn's original_max_position_embeddings falls back to it)" : "");
        return -1;
    }
    *sc = mlaf_rope_scaling_yarn(factor, (int64_t)orig);
    /* beta 0 takes the default, as transformers reads it */
    if ((r = get_ranged(obj, what, "beta_fast", path, 0.0, 0, MLAF_YARN_MAX_BETA, &v)) < 0) return -1;
    if (r == 0 && v != 0) sc->beta_fast = v;
    if ((r = get_ranged(obj, what, "beta_slow", path, 0.0, 0, MLAF_YARN_MAX_BETA, &v)) < 0) return -1;
    if (r == 0 && v != 0) sc->beta_slow = v;
    if ((r = get_ranged(obj, what, "mscale", path, 0.0, 0, MLAF_YARN_MAX_MSCALE, &v)) < 0) return -1;
    if (r == 0) sc->mscale = v;
    if ((r = get_ranged(obj, what, "mscale_all_dim", path, 0.0, 0, MLAF_YARN_MAX_MSCALE, &v)) < 0)
        return -1;
    if (r == 0) sc->mscale_all_dim = v;
    if ((r = get_ranged(obj, what, "attention_factor", path, 0.0, 0, MLAF_YARN_MAX_MSCALE, &v)) < 0)
        return -1;
    if (r == 0) sc->attention_factor = v;
    int b;
    if (get_bool(obj, "truncate", path, 1, &b)) return -1;
    sc->truncate = b;
    if (isnan(mlaf_rope_scaling_attention_factor(sc))) {
        fprintf(stderr,
                "mlafuse: %s: \"%s\" (yarn): factor = %g, beta_fast = %g, beta_slow = %g, mscale "
                "= %g, mscale_all_dim = %g, attention_factor = %g; expected factor >= 1, betas > 0, "
                "the rest >= 0\n",
                path, key, sc->factor, sc->beta_fast, sc->beta_slow, sc->mscale,
                sc->mscale_all_dim, sc->attention_factor);
        return -1;
    }
    return 0;
}

/* rope_theta and rope_scaling / rope_parameters; 0 ok, -1 after a message. */
static int parse_rope(const cJSON *root, const char *path, cli_rope *rope) {
    memset(rope, 0, sizeof *rope);
    rope->theta = 10000.0;
    const char *key = "rope_scaling";
    const cJSON *obj = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!obj || cJSON_IsNull(obj)) {
        key = "rope_parameters";
        obj = cJSON_GetObjectItemCaseSensitive(root, key);
    }
    double theta = 0;
    int r = get_ranged(root, "", "rope_theta", path, 1.0, 1, MLAF_ROPE_MAX_BASE, &theta);
    if (r < 0) return -1;
    if (r == 1 && obj && cJSON_IsObject(obj)) {
        char what[64];
        snprintf(what, sizeof what, "\"%s\": ", key);
        if ((r = get_ranged(obj, what, "rope_theta", path, 1.0, 1, MLAF_ROPE_MAX_BASE, &theta)) < 0)
            return -1;
    }
    if (r == 0) {
        rope->theta = theta;
        rope->theta_given = 1;
    }
    if (!obj || cJSON_IsNull(obj)) return 0;
    if (!cJSON_IsObject(obj)) {
        fprintf(stderr, "mlafuse: %s: \"%s\" is not an object (or null)\n", path, key);
        return -1;
    }
    static const char *const type_keys[2] = {"rope_type", "type"};
    for (int k = 0; k < 2; k++) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(obj, type_keys[k]);
        if (t && !cJSON_IsString(t)) {
            char *txt = cJSON_PrintUnformatted(t);
            fprintf(stderr, "mlafuse: %s: \"%s\": \"%s\" = %.40s, expected a string (\"default\" or "
                    "\"yarn\")\n", path, key, type_keys[k], txt ? txt : "?");
            cJSON_free(txt);
            return -1;
        }
    }
    const char *type = get_string(obj, "rope_type");
    if (!type) type = get_string(obj, "type");
    if (!type) {
        fprintf(stderr, "mlafuse: %s: \"%s\" has no \"type\" (or \"rope_type\")\n", path, key);
        return -1;
    }
    if (!strcmp(type, "default")) {
        for (const cJSON *it = obj->child; it; it = it->next)
            if (strcmp(it->string, "type") && strcmp(it->string, "rope_type") &&
                strcmp(it->string, "rope_theta")) {
                fprintf(stderr, "mlafuse: %s: \"%s\" is of type \"default\" but sets \"%s\"\n",
                        path, key, it->string);
                return -1;
            }
        return 0;
    }
    if (strcmp(type, "yarn")) {
        fprintf(stderr,
                "mlafuse: %s: \"%s\" type \"%s\" is not supported (mlafuse builds plain RoPE "
                "and yarn tables); a table that ignored it would be wrong\n",
                path, key, type);
        return -1;
    }
    if (parse_yarn(root, obj, key, path, &rope->scaling)) return -1;
    return 0;
}

/* `key` when the config sets it, else `alias` (Kimi-Linear's name for it) when that is set, else
 * `key` (so that a missing required key is reported by its usual name). */
static const char *key_or_alias(const cJSON *root, const char *key, const char *alias) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    if (it && !cJSON_IsNull(it)) return key;
    it = cJSON_GetObjectItemCaseSensitive(root, alias);
    return it && !cJSON_IsNull(it) ? alias : key;
}

static int type_in(const char *mt, const char *const *types) {
    for (; mt && *types; types++)
        if (!strcmp(mt, *types)) return 1;
    return 0;
}

/* DeepSeek-V4's layout (head_dim, kv rope tail): V4 and V4.1 */
static const char *const v4_types[] = {"deepseek_v4", "deepseek_v41", "deepseek_v41_text", NULL};
/* indexers that are not the DSA indexer (docs/dsa.md), whose index_* keys are left out: V4's and
 * V4.1's over compressed keys, GLM-5.3-Flash's over pooled keys */
static const char *const pooled_index_types[] = {"deepseek_v4", "deepseek_v41", "deepseek_v41_text",
                                                 "glm5_next", "glm5_next_text", NULL};

/* root: the object holding the model keys (text_config's, or the config itself); outer: the
 * config's top-level object, for the name and model_type when root has none. */
static int parse_config(const cJSON *root, const cJSON *outer, const char *path, mlaf_model_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    const int32_t BIG = 1 << 20;
    if (get_int(root, "q_lora_rank", path, 0, 0, 0, BIG, &cfg->q_lora_rank)) return -1;
    const char *mt0 = get_string(root, "model_type");
    if (!mt0) mt0 = get_string(outer, "model_type");
    if (type_in(mt0, v4_types)) {
        /* DeepSeek-V4 (docs/models.md): one shared K = V head of head_dim [512] values whose last
         * qk_rope_head_dim [64] are rotated: the latent is [q_lora | head_dim] with no separate
         * rope part (R = 0, kv_rope_tail = qk_rope_head_dim). */
        int32_t hd = 0, rope = 0;
        if (get_int(root, "head_dim", path, 0, 512, 2, BIG, &hd)) return -1;
        if (get_int(root, "qk_rope_head_dim", path, 0, 64, 0, BIG, &rope)) return -1;
        if (rope % 2 || rope > hd) {
            fprintf(stderr, "mlafuse: %s: \"qk_rope_head_dim\" = %d, expected even and <= \"head_dim\" = %d\n",
                    path, rope, hd);
            return -1;
        }
        cfg->kv_lora_rank = hd;
        cfg->qk_rope_head_dim = 0;
        cfg->kv_rope_tail = rope;
        cfg->qk_nope_head_dim = hd - rope;
        cfg->v_head_dim = hd;
        if (get_int(root, "num_hash_layers", path, 0, 0, 0, BIG, &cfg->n_hash_layers)) return -1;
        if (cfg->n_hash_layers == 0 &&
            get_int(root, "n_hash_layers", path, 0, 0, 0, BIG, &cfg->n_hash_layers))
            return -1;
    } else {
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
    }
    if (get_int(root, "num_attention_heads", path, 1, 0, 1, BIG, &cfg->num_heads)) return -1;
    if (get_int(root, key_or_alias(root, "n_routed_experts", "num_experts"), path, 1, 0, 1, 2048,
                &cfg->n_routed_experts))
        return -1;
    if (get_int(root, key_or_alias(root, "num_experts_per_tok", "num_experts_per_token"), path, 1, 0, 1, 64,
                &cfg->top_k))
        return -1;
    if (get_int(root, key_or_alias(root, "n_group", "num_expert_group"), path, 0, 1, 1, 64, &cfg->n_group))
        return -1;
    if (get_int(root, "topk_group", path, 0, 1, 1, 64, &cfg->topk_group)) return -1;
    if (get_int(root, key_or_alias(root, "n_shared_experts", "num_shared_experts"), path, 0, 0, 0, 64,
                &cfg->n_shared_experts))
        return -1;

    const char *method = get_string(root, "topk_method");
    const char *scoring_key = key_or_alias(root, "scoring_func", "moe_router_activation_func");
    const char *scoring = get_string(root, scoring_key);
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
    else if (!strcasecmp(scoring, "sqrtsoftplus") || !strcasecmp(scoring, "sqrt_softplus"))
        cfg->score_func = MLAF_SCORE_SQRT_SOFTPLUS;
    else {
        fprintf(stderr, "mlafuse: %s: \"%s\" = \"%s\", expected sigmoid, softmax or sqrtsoftplus\n",
                path, scoring_key, scoring);
        return -1;
    }

    int b;
    if (get_bool(root, key_or_alias(root, "norm_topk_prob", "moe_renormalize"), path, 0, &b)) return -1;
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
        else if (!strcasecmp(style, "none"))
            cfg->rope_style = MLAF_ROPE_NONE;
        else {
            fprintf(stderr, "mlafuse: %s: \"rope_style\" = \"%s\", expected interleaved, neox or none\n",
                    path, style);
            return -1;
        }
    }
    /* Kimi-Linear / Kimi-K3: the rope slot is kept but never rotated */
    if (get_bool(root, "mla_use_nope", path, 0, &b)) return -1;
    if (b) cfg->rope_style = MLAF_ROPE_NONE;

    /* DSA indexer (glm_moe_dsa, deepseek_v32): index_n_heads, index_head_dim [128], index_topk
     * [2048], indexer_rope_interleave [false: NeoX] */
    if (get_int(root, "index_n_heads", path, 0, 0, 0, 1024, &cfg->index_n_heads)) return -1;
    if (get_int(root, "index_head_dim", path, 0, cfg->index_n_heads ? 128 : 0, 0, BIG, &cfg->index_head_dim))
        return -1;
    if (get_int(root, "index_topk", path, 0, cfg->index_n_heads ? 2048 : 0, 0, BIG, &cfg->index_topk)) return -1;
    if (get_bool(root, "indexer_rope_interleave", path, 0, &b)) return -1;
    cfg->index_rope_style = b ? MLAF_ROPE_INTERLEAVED : MLAF_ROPE_NEOX;
    static const char *const dsa_types[] = {"glm_moe_dsa", "deepseek_v32", NULL};
    if (type_in(mt0, dsa_types) && cfg->index_n_heads == 0) {
        fprintf(stderr, "mlafuse: %s: model_type \"%s\" is a DSA model but has no \"index_n_heads\"\n", path, mt0);
        return -1;
    }
    if (type_in(mt0, pooled_index_types)) /* not the DSA indexer (docs/dsa.md): no index fields */
        cfg->index_n_heads = cfg->index_head_dim = cfg->index_topk = 0;
    if (cfg->index_n_heads && cfg->index_head_dim < 64) {
        fprintf(stderr, "mlafuse: %s: \"index_head_dim\" = %d, expected at least 64 (RoPE on dims [0, 64))\n", path,
                cfg->index_head_dim);
        return -1;
    }

    /* The router's limits (docs/moe_gate.md), reported by key name rather than by parameter. */
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
    if (!name || !*name) name = get_string(outer, "_name_or_path");
    if (!name || !*name) name = mt0;
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

/* Where cJSON stopped, as line and column (1-based, columns in bytes) and byte offset, and the
 * text from there to the end of that line (at most 40 bytes). */
static void report_parse_error(const char *path, const char *text, size_t len, const char *at) {
    size_t off = at && at >= text && at <= text + len ? (size_t)(at - text) : len;
    size_t line = 1, col = 1;
    for (size_t i = 0; i < off; i++) {
        if (text[i] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    int n = 0;
    while (off + (size_t)n < len && n < 40 && text[off + n] != '\n' && text[off + n] != '\r') n++;
    if (off >= len)
        fprintf(stderr,
                "mlafuse: --config %s: JSON parse error at line %zu, column %zu (byte %zu): the "
                "text ends before the value does\n",
                path, line, col, off);
    else
        fprintf(stderr,
                "mlafuse: --config %s: JSON parse error at line %zu, column %zu (byte %zu), near: "
                "%.*s\n",
                path, line, col, off, n, text + off);
}

int cli_load_hf_config_rope(const char *path, mlaf_model_config *cfg, cli_rope *rope) {
    size_t len = 0;
    char *text = read_file(path, &len);
    if (!text) {
        fprintf(stderr, "mlafuse: --config %s: cannot read the file (or larger than 64 MB)\n",
                path);
        return -1;
    }
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root) {
        report_parse_error(path, text, len, cJSON_GetErrorPtr());
        free(text);
        return -1;
    }
    if (!cJSON_IsObject(root)) {
        fprintf(stderr, "mlafuse: --config %s: the top-level JSON value is not an object\n",
                path);
        cJSON_Delete(root);
        free(text);
        return -1;
    }
    cli_rope scratch;
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (tc && !cJSON_IsNull(tc) && !cJSON_IsObject(tc)) {
        fprintf(stderr, "mlafuse: %s: \"text_config\" is not an object (or null)\n", path);
        cJSON_Delete(root);
        free(text);
        return -1;
    }
    const cJSON *model = tc && cJSON_IsObject(tc) ? tc : root;
    int r = parse_config(model, root, path, cfg);
    if (r == 0) r = parse_rope(model, path, rope ? rope : &scratch);
    cJSON_Delete(root);
    free(text);
    return r;
}

int cli_load_hf_config(const char *path, mlaf_model_config *cfg) {
    return cli_load_hf_config_rope(path, cfg, NULL);
}

#else /* no cJSON */

int cli_load_hf_config_rope(const char *path, mlaf_model_config *cfg, cli_rope *rope) {
    (void)rope;
    return cli_load_hf_config(path, cfg);
}

int cli_load_hf_config(const char *path, mlaf_model_config *cfg) {
    (void)cfg;
    fprintf(stderr,
            "mlafuse: --config %s: this build has no JSON support; install cJSON "
            "(Debian/Ubuntu: apt-get install libcjson-dev) and re-run cmake\n",
            path);
    return -1;
}

#endif
