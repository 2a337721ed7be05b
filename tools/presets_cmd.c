/*
 * presets_cmd.c — `mlafuse presets`: the built-in models as a table, every column of
 * docs/models.md's preset tables, or the one model a Hugging Face config.json describes
 * (--config), with the RoPE table its rope_theta and rope_scaling ask for.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

static void help(void) {
    printf("usage: mlafuse presets [--config path/config.json]\n"
           "\n"
           "Lists the built-in model presets (every column of docs/models.md). With --config, shows\n"
           "the model a Hugging Face config.json describes instead, as the other commands use it,\n"
           "and its RoPE: rope_theta and rope_scaling (plain or yarn; other types are rejected).\n");
}

/* Column widths: the preset column as wide as the longest name shown (at least 22), the score
 * column as wide as the longest score text ("sqrt_softplus+bias"), so every row aligns. */
enum { SCORE_W = 18 };

static void header(int name_w) {
    printf("%-*s %6s %7s %5s %5s %6s %5s %5s %5s %8s %-*s %-6s %5s %7s %7s %6s %-11s %s\n", name_w,
           "preset", "q_lora", "kv_lora", "rope", "nope", "v_head", "heads", "E", "top_k",
           "groups", SCORE_W, "score", "group", "norm", "scaling", "eps", "shared", "rope_style",
           "indexer");
}

static void row(const mlaf_model_config *c, int name_w) {
    char groups[32];
    snprintf(groups, sizeof groups, "%d/%d", c->n_group, c->topk_group);
    char idx[64] = "-";
    if (c->index_n_heads)
        snprintf(idx, sizeof idx, "%dx%d top-%d %s", c->index_n_heads, c->index_head_dim, c->index_topk,
                 mlaf_rope_style_name(c->index_rope_style));
    char v4[64] = "";
    if (c->kv_rope_tail || c->n_hash_layers)
        snprintf(v4, sizeof v4, " kv_rope_tail=%d hash_layers=%d", c->kv_rope_tail, c->n_hash_layers);
    printf("%-*s %6d %7d %5d %5d %6d %5d %5d %5d %8s %-*s %-6s %5s %7g %7g %6d %-11s %s%s\n",
           name_w, c->name, c->q_lora_rank, c->kv_lora_rank, c->qk_rope_head_dim,
           c->qk_nope_head_dim, c->v_head_dim, c->num_heads, c->n_routed_experts, c->top_k, groups,
           SCORE_W, cli_score_text(c),
           c->n_group > 1 ? (c->group_score == MLAF_GROUP_MAX ? "max" : "top2") : "-",
           c->norm_topk_prob ? "true" : "false", (double)c->routed_scaling_factor,
           (double)c->rms_norm_eps, c->n_shared_experts,
           mlaf_rope_style_name(c->rope_style), idx, v4);
}

static int name_width(const mlaf_model_config *c, int w) {
    int n = (int)strlen(c->name);
    return n > w ? n : w;
}

/* The RoPE table the config asks for, as mlaf_rope_table_init_scaled builds it; none for a NoPE
 * model (no rope part and no kv rope tail: the ops take no positions or table) or one whose rope
 * slot is not rotated (rope style none). */
static void rope_lines(const cli_rope *r, const mlaf_model_config *c) {
    const mlaf_rope_scaling *y = &r->scaling;
    if (c->qk_rope_head_dim == 0 && c->kv_rope_tail == 0) {
        printf("rope: none (NoPE: qk_rope_head_dim = 0 and no kv_rope_tail; mla_kv_cache takes no positions "
               "or cos_sin%s)\n",
               r->theta_given || y->type != MLAF_ROPE_SCALING_NONE ? "; the config's rope keys are unused" : "");
        return;
    }
    if (c->rope_style == MLAF_ROPE_NONE && c->kv_rope_tail == 0) {
        printf("rope: none (the %d-wide rope slot is kept unrotated: mla_kv_cache and rope_q read no positions or "
               "cos_sin%s)\n",
               c->qk_rope_head_dim,
               r->theta_given || y->type != MLAF_ROPE_SCALING_NONE ? "; the config's rope keys are unused" : "");
        return;
    }
    if (y->type == MLAF_ROPE_SCALING_NONE) {
        printf("rope: rope_theta %g%s, no rope_scaling (plain table: mlaf_rope_table_init)\n",
               r->theta, r->theta_given ? "" : " (the default: the config has none)");
        return;
    }
    /* The factor the table applies: the config's attention_factor, else derived (mla.h's
     * rules); printed as that value in both lines. */
    const double a = mlaf_rope_scaling_attention_factor(y);
    const char *how = y->attention_factor > 0                    ? ""
                      : y->mscale > 0 && y->mscale_all_dim > 0 ? " (derived from mscale / mscale_all_dim)"
                                                               : " (derived from the factor: 0.1 ln(factor) + 1)";
    printf("rope: rope_theta %g%s, rope_scaling yarn: factor %g, original_max_position_embeddings "
           "%lld, beta_fast %g, beta_slow %g, mscale %g, mscale_all_dim %g, attention_factor %.9g%s, "
           "truncate %s\n",
           r->theta, r->theta_given ? "" : " (the default: the config has none)", y->factor,
           (long long)y->original_max_position_embeddings, y->beta_fast, y->beta_slow, y->mscale,
           y->mscale_all_dim, a, how, y->truncate ? "true" : "false");
    printf("rope: cos and sin scaled by the attention factor %.9g (mlaf_rope_table_init_scaled; "
           "table rows up to factor x original = %.0f positions)\n",
           a, y->factor * (double)y->original_max_position_embeddings);
    if (y->mscale_all_dim > 0 && y->factor > 1)
        printf("rope: DeepSeek's attention multiplies its softmax scale by (0.1 x mscale_all_dim x "
               "ln(factor) + 1)^2 = %.9g (outside the table)\n",
               (0.1 * y->mscale_all_dim * log(y->factor) + 1) *
                   (0.1 * y->mscale_all_dim * log(y->factor) + 1));
}

int cmd_presets(int argc, char **argv) {
    const char *config = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v;
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            help();
            return CLI_EXIT_OK;
        }
        if ((r = cli_take_value(argc, argv, &i, "--config", &v)) != 0) {
            if (r < 0) return CLI_EXIT_USAGE;
            config = v;
            continue;
        }
        return cli_usage_error("presets", "unknown option '%s' (see mlafuse presets --help)",
                               argv[i]);
    }
    if (config) {
        mlaf_model_config cfg;
        cli_rope rope;
        if (cli_load_hf_config_rope(config, &cfg, &rope) != 0) return CLI_EXIT_FAIL;
        const int w = name_width(&cfg, 22);
        header(w);
        row(&cfg, w);
        printf("(from %s; latent row = q_lora + kv_lora + rope = %d)\n", config,
               cfg.q_lora_rank + cfg.kv_lora_rank + cfg.qk_rope_head_dim);
        rope_lines(&rope, &cfg);
        return CLI_EXIT_OK;
    }
    int w = 22;
    for (int i = 0; i < mlaf_preset_count(); i++) w = name_width(mlaf_preset_at(i), w);
    header(w);
    for (int i = 0; i < mlaf_preset_count(); i++) row(mlaf_preset_at(i), w);
    printf("(deepseek-r1 is an alias of deepseek-v3; groups = n_group/topk_group; group = group "
           "score when n_group > 1; norm = norm_topk_prob; kv_rope_tail: RoPE on the last values of\n"
           "the kv part, no separate rope part; hash_layers: the first MoE layers route by token id)\n");
    return CLI_EXIT_OK;
}
