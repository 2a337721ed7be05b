/*
 * presets_cmd.c — `mlafuse presets`: the built-in models as a table, every column of
 * SPEC §1, or the one model a Hugging Face config.json describes (--config).
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static void help(void) {
    printf("usage: mlafuse presets [--config path/config.json]\n"
           "\n"
           "Lists the built-in model presets (every column of SPEC section 1). With --config, shows\n"
           "the model a Hugging Face config.json describes instead, as the other commands use it.\n");
}

static void header(void) {
    printf("%-22s %6s %7s %5s %5s %6s %5s %5s %5s %8s %-13s %-6s %5s %7s %7s %6s %-11s\n",
           "preset", "q_lora", "kv_lora", "rope", "nope", "v_head", "heads", "E", "top_k",
           "groups", "score", "group", "norm", "scaling", "eps", "shared", "rope_style");
}

static void row(const mlaf_model_config *c) {
    char groups[32];
    snprintf(groups, sizeof groups, "%d/%d", c->n_group, c->topk_group);
    printf("%-22s %6d %7d %5d %5d %6d %5d %5d %5d %8s %-13s %-6s %5s %7g %7g %6d %-11s\n",
           c->name, c->q_lora_rank, c->kv_lora_rank, c->qk_rope_head_dim, c->qk_nope_head_dim,
           c->v_head_dim, c->num_heads, c->n_routed_experts, c->top_k, groups, cli_score_text(c),
           c->n_group > 1 ? (c->group_score == MLAF_GROUP_MAX ? "max" : "top2") : "-",
           c->norm_topk_prob ? "true" : "false", (double)c->routed_scaling_factor,
           (double)c->rms_norm_eps, c->n_shared_experts,
           c->rope_style == MLAF_ROPE_NEOX ? "neox" : "interleaved");
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
        if (cli_load_hf_config(config, &cfg) != 0) return CLI_EXIT_FAIL;
        header();
        row(&cfg);
        printf("(from %s; latent row = q_lora + kv_lora + rope = %d)\n", config,
               cfg.q_lora_rank + cfg.kv_lora_rank + cfg.qk_rope_head_dim);
        return CLI_EXIT_OK;
    }
    header();
    for (int i = 0; i < mlaf_preset_count(); i++) row(mlaf_preset_at(i));
    printf("(deepseek-r1 is an alias of deepseek-v3; groups = n_group/topk_group; group = group "
           "score when n_group > 1; norm = norm_topk_prob)\n");
    return CLI_EXIT_OK;
}
