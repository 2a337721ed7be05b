/*
 * verify_cmd.c — `mlafuse verify`: every op x model x dtype x token count x layout on each
 * backend against the float64 oracle, through the shared harness of src/ref/verify.h (the
 * same rules the C tests use: poisoned outputs, guard zones, docs/conventions.md tolerances).
 *
 * One greppable line per case, e.g.
 *   SPLIT_QK_NORM(preset=glm-4.7-flash,T=7,dtype=bf16,backend=cpu,strided): OK worst=0.50ulp
 * then "N passed, N failed, N skipped"; exit 1 on any failure, 2 on a usage error.
 *
 * Cases per op (every model, dtype and T):
 *   split_qk_norm  contiguous | strided | strided with f32 weights | without k_pe | in place
 *   mla_kv_cache   {contiguous (block 16, i64 indices) | strided (flat block 1, i32 indices,
 *                  cache in another dtype) | in place (block 64)} x {interleaved, neox}
 *   rope_q         {contiguous (i64) | strided (i32)} x {interleaved, neox}
 *   mla_kv_cache with --cache: the cache formats of docs/kv_formats.md instead, each x block size
 *                  {1, 16, 64} x {contiguous, strided} (below, kv_fmts and run_kv_formats)
 *   mla_kv_cache with --indexer: the DSA indexer key branch (verify_indexer.c) over the caches
 *                  of --cache (default plain) x four indexer settings (run_indexer_cases)
 *   indexer_q      models with an indexer: {contiguous, ue8m0 | strided, Hadamard, q_pe |
 *                  strided, f32 scale} in the preset's indexer RoPE style
 *   rms_norm_quant every --hidden size (default 2048, 7168) x dtype x T: dense only and every
 *                  GEMM-input format in each rounding (verify_rms_norm_quant.c); its own token counts
 *                  by default (0,1,7,64,257,4099), once per backend whatever the models
 *   gemm_quant     every --hidden size x dtype x T: every GEMM-input format in each rounding, contiguous
 *                  and strided in turn (verify_gemm_quant.c); the tokens and the once-per-backend rule of
 *                  rms_norm_quant
 *   moe_gate       contiguous | strided with the score output | NaN / inf logits; with
 *                  --preset all also the router shapes engines get wrong (E = 160 softmax
 *                  group max, E = 384, E = 2048, 64 experts in one group, top_k 16 / 32,
 *                  no bias).
 *                  Routers with a sqrt_softplus score (DeepSeek-V4) also get large |logits|
 *                  (",wide"), and presets with hash-routed layers (n_hash_layers > 0) the hash
 *                  router: contiguous | strided (i32 / i64 table and ids) with the score output |
 *                  bad rows of every kind. Their lines name the score and "hash".
 * A model with kv_rope_tail > 0 (DeepSeek-V4) gets its own attention cases (run_v4).
 */
#define _POSIX_C_SOURCE 200809L /* strtok_r, strcasecmp */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "cli.h"
#include "kv_format.h"
#include "ref/verify.h"

static void help(void) {
    printf(
        "usage: mlafuse verify [options]\n"
        "\n"
        "Checks every op against the float64 oracle (docs/conventions.md) and prints one line per case.\n"
        "\n"
        "  --backend cpu|cuda|all   backends to check (default all: cpu, and cuda when a GPU is visible)\n"
        "  --op NAME|all            split_qk_norm, mla_kv_cache, rope_q, moe_gate, indexer_q,\n"
        "                           rms_norm_quant, gemm_quant (default all)\n"
        "  --preset NAME|all        model preset (default all; see mlafuse presets)\n"
        "  --config FILE            the model of a Hugging Face config.json instead of the presets\n"
        "  --sweep                  the row layouts of the family instead: q_lora_rank 0 .. 3072 x\n"
        "                           kv_lora_rank 512 x rope 0, 64, from the model given (default the first)\n"
        "  --dtype f32|f16|bf16|all activation dtype (default all)\n"
        "  --tokens LIST            token counts, e.g. 0,1,7 (default 0,1,2,7,64,257,4096,65537;\n"
        "                           with --cache, mla_kv_cache's default is 0,1,7,257,4099,65537)\n"
        "  --cache LIST             mla_kv_cache's cache formats (mlafuse presets lists them) or all\n"
        "                           (comma-separated), each x block size 1, 16, 64 x contiguous,\n"
        "                           strided; without it, the plain cache cases above\n"
        "  --indexer                mla_kv_cache with the DSA indexer key branch (docs/dsa.md) instead:\n"
        "                           models with rope 64, the caches of --cache (default plain), each x\n"
        "                           four indexer settings (rope style, Hadamard, scale, layout)\n"
        "  --hidden LIST            rms_norm_quant's and gemm_quant's K (default 2048,7168; their tokens\n"
        "                           default to 0,1,7,64,257,4099), e.g. 7168,16384\n"
        "  --seed N                 random seed of the inputs (default 1)\n"
        "\n"
        "Exit status: 0 all passed, 1 a case failed (or a requested backend is missing), 2 usage.\n");
}

typedef struct variant {
    const char *label;
    int strided, in_place, no_k_pe, f32_weights;
    int style;       /* -1: not a rope op; else mlaf_rope_style */
    int64_t block;   /* mla_kv_cache block size (0 = default) */
    int index_i32;
    int other_cache; /* cache dtype differs from the activations' */
    int want_scores, nonfinite;
} variant;

/* Router shapes of the moe issue beyond the presets (run with --preset all). */
typedef struct moe_extra {
    const char *name;
    int32_t E, top_k, n_group, topk_group;
    mlaf_score_func score;
    mlaf_group_score group;
    int bias, renorm, shared;
    float scaling;
} moe_extra;

static const moe_extra moe_extras[] = {
    {"moe:e160-softmax-g8-max", 160, 6, 8, 3, MLAF_SCORE_SOFTMAX, MLAF_GROUP_MAX, 0, 0, 0, 16.0f},
    {"moe:e384-g1", 384, 8, 1, 1, MLAF_SCORE_SIGMOID, MLAF_GROUP_TOP2_SUM, 1, 1, 0, 2.827f},
    {"moe:e2048-g8", 2048, 8, 8, 4, MLAF_SCORE_SIGMOID, MLAF_GROUP_TOP2_SUM, 1, 1, 0, 2.5f},
    {"moe:e2048-g1-softmax", 2048, 8, 1, 1, MLAF_SCORE_SOFTMAX, MLAF_GROUP_TOP2_SUM, 0, 1, 0, 1.0f},
    {"moe:e64-g1-shared1", 64, 8, 1, 1, MLAF_SCORE_SIGMOID, MLAF_GROUP_TOP2_SUM, 1, 1, 1, 1.8f},
    {"moe:e256-topk16", 256, 16, 8, 4, MLAF_SCORE_SIGMOID, MLAF_GROUP_TOP2_SUM, 1, 1, 0, 2.5f},
    {"moe:e256-topk32", 256, 32, 1, 1, MLAF_SCORE_SOFTMAX, MLAF_GROUP_TOP2_SUM, 0, 1, 0, 1.0f},
    {"moe:e256-g8-nobias", 256, 8, 8, 4, MLAF_SCORE_SIGMOID, MLAF_GROUP_TOP2_SUM, 0, 1, 0, 2.5f},
};

typedef struct counters {
    int passed, failed, skipped;
} counters;

static void upper(const char *s, char *out, size_t cap) {
    size_t i = 0;
    for (; s[i] && i + 1 < cap; i++) out[i] = (char)(s[i] >= 'a' && s[i] <= 'z' ? s[i] - 32 : s[i]);
    out[i] = '\0';
}

static void run_case(mlaf_context *ctx, mlaf_op op, const char *model, const mlaf_verify_case *c,
                     const char *label, counters *n) {
    char opname[32];
    upper(mlaf_op_name(op), opname, sizeof opname);
    printf("%s(preset=%s,T=%lld,dtype=%s,backend=%s,%s): ", opname, model, (long long)c->T,
           mlaf_dtype_name(c->dtype), mlaf_backend_name(mlaf_context_backend(ctx)), label);
    fflush(stdout);
    mlaf_verify_result r;
    memset(&r, 0, sizeof r);
    mlaf_status st = mlaf_verify_op(ctx, op, c, &r);
    const char *unit = (op == MLAF_OP_MOE_GATE || c->dtype == MLAF_F32) ? "u" : "ulp";
    if (st == MLAF_OK && r.passed) {
        printf("OK worst=%.2f%s\n", r.worst_units, unit);
        n->passed++;
    } else if (st == MLAF_OK) {
        printf("FAIL worst=%.3g%s %s\n", r.worst_units, unit, r.detail);
        n->failed++;
    } else if (st == MLAF_ERR_UNSUPPORTED) {
        const char *why = mlaf_context_last_error(ctx);
        printf("FAIL unsupported (%s%s)\n", r.detail[0] ? r.detail : why,
               (r.detail[0] || why[0]) ? "" : "not implemented yet");
        n->failed++;
    } else {
        const char *why = r.detail[0] ? r.detail : mlaf_context_last_error(ctx);
        printf("FAIL %s: %s\n", mlaf_status_name(st), why[0] ? why : mlaf_status_message(st));
        n->failed++;
    }
    fflush(stdout);
}

static mlaf_dtype other_dtype(mlaf_dtype dt) { return dt == MLAF_F32 ? MLAF_BF16 : MLAF_F32; }

/* Runs one op's cases for one model / dtype / T. */
static void run_op(mlaf_context *ctx, mlaf_op op, const mlaf_model_config *cfg, mlaf_dtype dt,
                   int64_t T, uint64_t seed, int with_extras, counters *n) {
    static const variant norm_v[] = {
        {"contiguous", 0, 0, 0, 0, -1, 0, 0, 0, 0, 0},
        {"strided", 1, 0, 0, 0, -1, 0, 0, 0, 0, 0},
        {"strided,w=f32", 1, 0, 0, 1, -1, 0, 0, 0, 0, 0},
        {"contiguous,no-k_pe", 0, 0, 1, 0, -1, 0, 0, 0, 0, 0},
        {"in-place", 0, 1, 0, 0, -1, 0, 0, 0, 0, 0},
    };
    static const variant kv_v[] = {
        {"contiguous,bs=16,i64", 0, 0, 0, 0, MLAF_ROPE_INTERLEAVED, 16, 0, 0, 0, 0},
        {"contiguous,bs=16,i64", 0, 0, 0, 0, MLAF_ROPE_NEOX, 16, 0, 0, 0, 0},
        {"strided,bs=1,i32,cache=other", 1, 0, 0, 0, MLAF_ROPE_INTERLEAVED, 1, 1, 1, 0, 0},
        {"strided,bs=1,i32,cache=other", 1, 0, 0, 0, MLAF_ROPE_NEOX, 1, 1, 1, 0, 0},
        {"in-place,bs=64", 0, 1, 0, 0, MLAF_ROPE_INTERLEAVED, 64, 0, 0, 0, 0},
        {"in-place,bs=64", 0, 1, 0, 0, MLAF_ROPE_NEOX, 64, 0, 0, 0, 0},
    };
    static const variant rope_v[] = {
        {"contiguous,i64", 0, 0, 0, 0, MLAF_ROPE_INTERLEAVED, 0, 0, 0, 0, 0},
        {"contiguous,i64", 0, 0, 0, 0, MLAF_ROPE_NEOX, 0, 0, 0, 0, 0},
        {"strided,i32", 1, 0, 0, 0, MLAF_ROPE_INTERLEAVED, 0, 1, 0, 0, 0},
        {"strided,i32", 1, 0, 0, 0, MLAF_ROPE_NEOX, 0, 1, 0, 0, 0},
    };
    static const variant moe_v[] = {
        {"contiguous", 0, 0, 0, 0, -1, 0, 0, 0, 0, 0},
        {"strided,scores", 1, 0, 0, 0, -1, 0, 0, 0, 1, 0},
        {"contiguous,nonfinite", 0, 0, 0, 0, -1, 0, 0, 0, 1, 1},
    };
    const variant *vs;
    int nv;
    switch (op) {
    case MLAF_OP_SPLIT_QK_NORM: vs = norm_v; nv = (int)(sizeof norm_v / sizeof norm_v[0]); break;
    case MLAF_OP_MLA_KV_CACHE: vs = kv_v; nv = (int)(sizeof kv_v / sizeof kv_v[0]); break;
    case MLAF_OP_ROPE_Q: vs = rope_v; nv = (int)(sizeof rope_v / sizeof rope_v[0]); break;
    default: vs = moe_v; nv = (int)(sizeof moe_v / sizeof moe_v[0]); break;
    }
    if (op == MLAF_OP_ROPE_Q && cfg->qk_rope_head_dim <= 0) {
        printf("SKIP: rope_q for %s: qk_rope_head_dim = 0 (nothing to rotate)\n", cfg->name);
        n->skipped++;
        return;
    }
    for (int i = 0; i < nv; i++) {
        const variant *v = &vs[i];
        if (v->f32_weights && dt == MLAF_F32) continue; /* same case as "strided" */
        const int unrotated = cfg->qk_rope_head_dim == 0 || cfg->rope_style == MLAF_ROPE_NONE;
        if (op != MLAF_OP_SPLIT_QK_NORM && unrotated && v->style == MLAF_ROPE_NEOX)
            continue; /* NoPE / style none: nothing rotates, the style's two cases would be one */
        mlaf_verify_case c = mlaf_verify_case_default(cfg, dt, T, seed + 7919u * (uint64_t)i);
        c.strided = v->strided;
        c.in_place = v->in_place;
        c.no_k_pe = v->no_k_pe;
        if (v->f32_weights) c.weight_dtype = MLAF_F32;
        if (v->style >= 0) c.rope_style = cfg->rope_style == MLAF_ROPE_NONE ? MLAF_ROPE_NONE : (mlaf_rope_style)v->style;
        if (v->block > 0) c.block_size = v->block;
        c.index_dtype = v->index_i32 ? MLAF_I32 : MLAF_I64;
        if (v->other_cache) c.cache_dtype = other_dtype(dt);
        c.want_scores = v->want_scores;
        c.nonfinite = v->nonfinite;
        const int sp = op == MLAF_OP_MOE_GATE && cfg->score_func == MLAF_SCORE_SQRT_SOFTPLUS;
        c.moe_wide = sp && v->strided; /* large |logits| across sqrt_softplus's three ranges */
        char label[96];
        if (sp)
            snprintf(label, sizeof label, "%s%s,score=sqrt_softplus", v->label, c.moe_wide ? ",wide" : "");
        else if (v->style >= 0)
            snprintf(label, sizeof label, "%s,%s", v->label, mlaf_rope_style_name(c.rope_style));
        else
            snprintf(label, sizeof label, "%s", v->label);
        if (v->other_cache) {
            char *p = strstr(label, "cache=other");
            if (p) snprintf(p, sizeof label - (size_t)(p - label), "cache=%s,%s",
                            mlaf_dtype_name(c.cache_dtype), mlaf_rope_style_name(c.rope_style));
        }
        run_case(ctx, op, cfg->name, &c, label, n);
    }
    if (op != MLAF_OP_MOE_GATE) return;
    if (cfg->n_hash_layers > 0) {
        /* the hash-routed layers: {contiguous, i64} | {strided, i32 table, i64 ids, scores} |
         * {bad rows, i32} */
        static const char *const hv[3] = {"contiguous", "strided,scores", "bad-rows"};
        for (int h = 0; h < 3; h++) {
            mlaf_verify_case c = mlaf_verify_case_default(cfg, dt, T, seed + 7919u * (uint64_t)(h + 16));
            c.moe_hash = h == 2 ? 2 : 1;
            c.strided = h == 1;
            c.want_scores = h == 1;
            c.moe_wide = h == 1;
            c.index_dtype = h == 0 ? MLAF_I64 : MLAF_I32;
            char label[96];
            snprintf(label, sizeof label, "hash,%s,score=%s", hv[h], mlaf_score_func_name(cfg->score_func));
            run_case(ctx, op, cfg->name, &c, label, n);
        }
    }
    if (!with_extras) return;
    for (size_t e = 0; e < sizeof moe_extras / sizeof moe_extras[0]; e++) {
        const moe_extra *x = &moe_extras[e];
        for (int s = 0; s < 2; s++) {
            mlaf_verify_case c =
                mlaf_verify_case_default(cfg, dt, T, seed + 104729u * (uint64_t)(e + 1) + (uint64_t)s);
            c.moe_override = 1;
            c.experts = x->E;
            c.moe.top_k = x->top_k;
            c.moe.n_group = x->n_group;
            c.moe.topk_group = x->topk_group;
            c.moe.score_func = x->score;
            c.moe.group_score = x->group;
            c.moe.renormalize = x->renorm;
            c.moe.routed_scaling_factor = x->scaling;
            c.moe.apply_routed_scaling = 1;
            c.moe.eps = 1e-20f;
            c.moe.n_shared_experts = x->shared;
            c.moe_bias = x->bias;
            c.strided = s;
            c.want_scores = s;
            run_case(ctx, op, x->name, &c, s ? "strided,scores" : "contiguous", n);
        }
    }
}

/* indexer_q's cases for one model / dtype / T (models without an indexer: one skip line). */
static void run_indexer_q(mlaf_context *ctx, const mlaf_model_config *cfg, mlaf_dtype dt, int64_t T, uint64_t seed,
                          counters *n) {
    if (cfg->index_n_heads <= 0) {
        printf("SKIP: indexer_q for %s: the model has no DSA indexer\n", cfg->name);
        n->skipped++;
        return;
    }
    for (int i = 0; i < 3; i++) {
        mlaf_verify_case c = mlaf_verify_case_default(cfg, dt, T, seed + 7919u * (uint64_t)i);
        c.strided = i > 0;
        c.index_hadamard = i == 1;
        c.index_q_pe = i == 1;
        c.index_scale = i == 2 ? MLAF_INDEX_SCALE_F32 : MLAF_INDEX_SCALE_UE8M0;
        c.index_dtype = i == 2 ? MLAF_I32 : MLAF_I64;
        char label[128];
        snprintf(label, sizeof label, "H=%d,index_rope=%s,hadamard=%d,scale=%s,%s%s", (int)cfg->index_n_heads,
                 c.index_style == MLAF_ROPE_NEOX ? "neox" : "interleaved", c.index_hadamard,
                 c.index_scale == MLAF_INDEX_SCALE_F32 ? "f32" : "ue8m0", c.strided ? "strided" : "contiguous",
                 c.index_q_pe ? ",q_pe" : "");
        run_case(ctx, MLAF_OP_INDEXER_Q, cfg->name, &c, label, n);
    }
}

/* --indexer: mla_kv_cache with the key branch, every format of mask x four indexer settings
 * (the model's RoPE style or the other one, Hadamard, ue8m0 / f32 scale, layout: contiguous
 * block 64; strided with an odd index-cache block stride, block 16; the dense index output in
 * place, block 1; strided with a short slot_mapping, block 64). */
static void run_indexer_cases(mlaf_context *ctx, unsigned mask, const mlaf_model_config *cfg, mlaf_dtype dt,
                              int64_t T, uint64_t seed, counters *n) {
    if (cfg->qk_rope_head_dim != MLAF_INDEX_ROPE_DIM) {
        printf("SKIP: mla_kv_cache --indexer for %s: qk_rope_head_dim = %d, the indexer needs 64\n", cfg->name,
               (int)cfg->qk_rope_head_dim);
        n->skipped++;
        return;
    }
    const mlaf_rope_style own = cfg->index_n_heads > 0 ? cfg->index_rope_style : MLAF_ROPE_NEOX;
    for (int f = 0; f < MLAF_KV_FORMAT_COUNT_; f++) {
        if (!(mask & (1u << f))) continue;
        if (!mlaf_kv_format_fits((mlaf_kv_format)f, dt, cfg->kv_lora_rank, cfg->qk_rope_head_dim, 0)) {
            printf("SKIP: mla_kv_cache --indexer cache=%s for %s, dtype %s: not a format of these dims and dtype "
                   "(mlafuse presets lists what each needs)\n",
                   mlaf_kv_formats[f].name, cfg->name, mlaf_dtype_name(dt));
            n->skipped++;
            continue;
        }
        for (int i = 0; i < 4; i++) {
            mlaf_verify_case c = mlaf_verify_case_default(cfg, dt, T, seed + 7919u * (uint64_t)(i + 4 * f));
            c.indexer = 1;
            c.kv_format = (mlaf_kv_format)f;
            c.cache_dtype = mlaf_kv_formats[f].cache_dtypes & (1u << dt) ? dt : MLAF_U8;
            c.index_style = i == 2 ? (mlaf_rope_style)(1 - own) : own;
            c.index_hadamard = i == 1 || i == 3;
            c.index_scale = i >= 2 ? MLAF_INDEX_SCALE_F32 : MLAF_INDEX_SCALE_UE8M0;
            c.strided = i == 1 || i == 3;
            c.in_place = i == 2;
            c.map_short = i == 3 ? 3 : 0;
            c.block_size = i == 1 ? 16 : i == 2 ? 1 : 64;
            c.index_dtype = i == 1 ? MLAF_I32 : MLAF_I64;
            c.tile_scale = (mlaf_tile_scale)(i % 3);
            char label[160];
            snprintf(label, sizeof label, "cache=%s,bs=%lld,index_rope=%s,hadamard=%d,scale=%s,%s",
                     mlaf_kv_format_name(c.kv_format), (long long)c.block_size,
                     c.index_style == MLAF_ROPE_NEOX ? "neox" : "interleaved", c.index_hadamard,
                     c.index_scale == MLAF_INDEX_SCALE_F32 ? "f32" : "ue8m0",
                     i == 0 ? "contiguous" : i == 1 ? "strided,odd-block-stride" : i == 2 ? "index-out-in-place"
                                                                                          : "strided,short-map");
            run_case(ctx, MLAF_OP_MLA_KV_CACHE, cfg->name, &c, label, n);
        }
    }
}

/* --cache: the cache formats of src/kv_format.h, each in the variants its row's flags open: the
 * two fp8 conventions of a per-tensor scale, the tile scale modes, the rope part apart in kpe. */
typedef struct kv_fmt {
    char label[64];
    mlaf_kv_format format;
    mlaf_fp8_conv conv;
    mlaf_tile_scale tile;
    int kpe; /* the rope part in its own array */
} kv_fmt;

static int kv_variants(kv_fmt *out, int cap) {
    static const char *tiles[3] = {"amax", "ue8m0", "ue8m0_floor_scaled"};
    int n = 0;
    for (int f = 0; f < MLAF_KV_FORMAT_COUNT_; f++) {
        const mlaf_kv_format_info *k = &mlaf_kv_formats[f];
        const int nconv = k->flags & MLAF_KVF_SCALE ? 2 : 1, ntile = k->flags & MLAF_KVF_TILE_SCALE ? 3 : 1;
        for (int kpe = 0; kpe <= (k->flags & MLAF_KVF_KPE ? 1 : 0); kpe++)
            for (int tl = 0; tl < ntile; tl++)
                for (int cv = 0; cv < nconv && n < cap; cv++) {
                    kv_fmt *v = &out[n++];
                    v->format = (mlaf_kv_format)f, v->conv = (mlaf_fp8_conv)cv, v->tile = (mlaf_tile_scale)tl;
                    v->kpe = kpe;
                    snprintf(v->label, sizeof v->label, "%s%s%s%s", k->name,
                             nconv > 1 ? (cv ? ",mul" : ",div") : "", ntile > 1 ? "," : "", ntile > 1 ? tiles[tl] : "");
                    if (kpe) snprintf(v->label + strlen(v->label), sizeof v->label - strlen(v->label), ",kpe");
                }
    }
    return n;
}

/* "plain,fp8" -> one bit per format (1 << its enum value); -1 after a usage error. */
static int parse_cache_set(const char *v) {
    char buf[128], names[160];
    snprintf(buf, sizeof buf, "%s", v);
    mlaf_kv_format_list(0, names, sizeof names, 0);
    unsigned mask = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int f = 0;
        if (!strcasecmp(tok, "all")) {
            mask |= (1u << MLAF_KV_FORMAT_COUNT_) - 1;
            continue;
        }
        while (f < MLAF_KV_FORMAT_COUNT_ && strcasecmp(tok, mlaf_kv_formats[f].name)) f++;
        if (f == MLAF_KV_FORMAT_COUNT_)
            return cli_usage_error("verify", "--cache: unknown format '%s' (%s or all)", tok, names), -1;
        mask |= 1u << f;
    }
    if (!mask) return cli_usage_error("verify", "--cache: no format given (%s or all)", names), -1;
    return (int)mask;
}

/* mla_kv_cache's cases for --cache, one model and dtype: every chosen format x T x block size
 * {1, 16, 64} x {contiguous, strided}. The six layouts of a format also take turns at the
 * other knobs: RoPE style, i32 / i64 indices, and per format
 *   plain  a cache dtype other than the activations' (layouts 1, 3)
 *   fp8    the scale fitted to map max |x| near 300, 1.0, or fitted near 4000 (the top values
 *          saturate), by layout % 3; amax_out on even layouts (starting at 0.25); e4m3 / u8
 *          cache dtype
 *   fp8 and fp8_ds_mla  in place (layout 2), cache-only second call (4: no dense k_nope or
 *          k_pe; 5: no dense k_pe), slot_mapping shorter than T (3: T / 3 rows without a slot)
 * fp8_ds_mla needs a bf16 latent and kv_lora_rank % 128 == 0: one SKIP line otherwise. */
static void run_kv_formats(mlaf_context *ctx, unsigned mask, const mlaf_model_config *cfg, mlaf_dtype dt,
                           const int64_t *tokens, int ntok, uint64_t seed, counters *n) {
    static const int64_t blocks[3] = {1, 16, 64};
    kv_fmt kv_fmts[32];
    const int nfmt = kv_variants(kv_fmts, 32);
    for (int f = 0; f < nfmt; f++) {
        const kv_fmt *k = &kv_fmts[f];
        const mlaf_kv_format_info *row = &mlaf_kv_formats[k->format];
        if (!(mask & (1u << k->format))) continue;
        if (!mlaf_kv_format_fits(k->format, dt, cfg->kv_lora_rank, cfg->qk_rope_head_dim, 0)) {
            char why[200];
            if (row->flags & MLAF_KVF_BF16_LATENT && dt != MLAF_BF16)
                snprintf(why, sizeof why, "a bf16 latent");
            else if (row->check_dims && row->check_dims(ctx, cfg->kv_lora_rank, cfg->qk_rope_head_dim, 0) != MLAF_OK)
                snprintf(why, sizeof why, "other dims: %.160s", mlaf_context_last_error(ctx));
            else
                snprintf(why, sizeof why, "other dims");
            printf("SKIP: mla_kv_cache cache=%s for preset %s, dtype %s: %s needs %s\n", k->label, cfg->name,
                   mlaf_dtype_name(dt), row->name, why);
            n->skipped++;
            continue;
        }
        if (k->kpe && cfg->qk_rope_head_dim == 0) {
            printf("SKIP: mla_kv_cache cache=%s for preset %s: qk_rope_head_dim = 0 (no rope part to keep apart)\n",
                   k->label, cfg->name);
            n->skipped++;
            continue;
        }
        const int values = (row->cache_dtypes & (1u << MLAF_U8)) == 0; /* the cache holds latent-like values */
        for (int t = 0; t < ntok; t++)
            for (int li = 0; li < 6; li++) {
                const int st = li % 2;
                const int64_t bs = blocks[li / 2];
                mlaf_verify_case c =
                    mlaf_verify_case_default(cfg, dt, tokens[t], seed + 7919u * (uint64_t)(f * 6 + li) + 131u * (uint64_t)t);
                c.strided = st;
                c.block_size = bs;
                c.rope_style = cfg->rope_style == MLAF_ROPE_NONE ? MLAF_ROPE_NONE
                               : (li / 2 + st) % 2                ? MLAF_ROPE_NEOX
                                                                  : MLAF_ROPE_INTERLEAVED;
                c.index_dtype = st ? MLAF_I32 : MLAF_I64;
                c.kv_format = k->format;
                c.fp8_conv = k->conv;
                c.tile_scale = k->tile;
                c.kpe_separate = k->kpe;
                char label[192], extra[96] = "";
                size_t el = 0;
                if (values) {
                    if (li == 1 || li == 3) c.cache_dtype = other_dtype(dt);
                    el += (size_t)snprintf(extra + el, sizeof extra - el, ",%s", mlaf_dtype_name(c.cache_dtype));
                } else {
                    if (row->flags & MLAF_KVF_SCALE) {
                        static const float scales[3] = {0.0f, 1.0f, -4000.0f};
                        static const char *names[3] = {"fit300", "1", "fit4000"};
                        c.fp8_scale = scales[li % 3];
                        c.want_amax = li % 2 == 0;
                        c.amax_init = 0.25f;
                        el += (size_t)snprintf(extra + el, sizeof extra - el, ",scale=%s%s", names[li % 3],
                                               c.want_amax ? ",amax_out" : "");
                    }
                    c.cache_dtype = li < 3 ? MLAF_FP8_E4M3 : MLAF_U8;
                    el += (size_t)snprintf(extra + el, sizeof extra - el, ",%s", mlaf_dtype_name(c.cache_dtype));
                    if (li == 2) c.in_place = 1;
                    if (li == 4) c.no_k_pe = 2;
                    if (li == 5) c.no_k_pe = 1;
                    if (li == 3) c.map_short = tokens[t] / 3;
                    el += (size_t)snprintf(extra + el, sizeof extra - el, "%s",
                                           li == 2 ? ",in-place" : li == 4 ? ",cache-only" : li == 5 ? ",no-k_pe"
                                                   : li == 3 ? ",slots=T-T/3" : "");
                }
                snprintf(label, sizeof label, "cache=%.63s%s,bs=%lld,%s,%s,%s", k->label, extra, (long long)bs,
                         st ? "strided" : "contiguous", st ? "i32" : "i64", mlaf_rope_style_name(c.rope_style));
                run_case(ctx, MLAF_OP_MLA_KV_CACHE, cfg->name, &c, label, n);
            }
    }
}

/* DeepSeek-V4's attention cases (docs/mla.md) for a model with a kv_rope_tail, one dtype and
 * T: split_qk_norm as any model (R = 0); mla_kv_cache with the tail into the plain cache (the
 * latent dtype and f32), the roped in-place form, per-tensor fp8 and, for bf16, fp8_v4 (block
 * sizes 1, 64 and 3, contiguous / strided, cache-only, slot_mapping shorter than T); rope_q with
 * head_norm in place and into q_out of 128 heads, and without head_norm into q_out of 64 heads. */
static void run_v4(mlaf_context *ctx, mlaf_op op, const mlaf_model_config *cfg, int32_t tail, mlaf_dtype dt,
                   int64_t T, uint64_t seed, counters *n) {
    if (op == MLAF_OP_SPLIT_QK_NORM) {
        run_op(ctx, op, cfg, dt, T, seed, 0, n);
        return;
    }
    if (op == MLAF_OP_ROPE_Q) {
        /* with head_norm (V4's q) in place and into q_out; and plain RoPE on the tail (V4.1's q as
         * transformers' port has it, no head norm: docs/models.md) */
        static const char *const qv[3] = {"head_norm,in-place-heads", "head_norm,q_out=128,strided",
                                          "no-head_norm,q_out=64,strided"};
        for (int k = 0; k < 3; k++) {
            mlaf_verify_case c = mlaf_verify_case_default(cfg, dt, T, seed + 17u * (uint64_t)k);
            c.kv_rope_tail = tail;
            c.head_norm = k < 2;
            c.q_out_heads = k == 1 ? 128 : k == 2 ? 64 : 0;
            c.strided = k > 0;
            run_case(ctx, op, cfg->name, &c, qv[k], n);
        }
        return;
    }
    /* every format that takes a rope tail, in the layouts of its kind: values (plain) or bytes */
    static const struct {
        const char *label;
        int bytes, cache_f32, in_place, strided, cache_only, short_map;
        int64_t bs;
    } v[] = {
        {"", 0, 0, 0, 0, 0, 0, 64},
        {",f32,strided", 0, 1, 0, 1, 0, 1, 1},
        {",in-place-roped", 0, 0, 1, 1, 0, 0, 3},
        {"", 1, 0, 0, 0, 0, 0, 64},
        {",strided,short-map", 1, 0, 0, 1, 0, 1, 1},
        {",in-place-roped", 1, 0, 1, 0, 0, 0, 3},
        {",cache-only", 1, 0, 0, 1, 1, 0, 64},
    };
    int k = 0;
    for (int f = 0; f < MLAF_KV_FORMAT_COUNT_; f++) {
        const mlaf_kv_format_info *row = &mlaf_kv_formats[f];
        if (!(row->flags & MLAF_KVF_TAIL)) continue;
        if (!mlaf_kv_format_fits((mlaf_kv_format)f, dt, cfg->kv_lora_rank, cfg->qk_rope_head_dim, tail)) {
            if (T == 0) { /* said once */
                printf("SKIP: mla_kv_cache cache=%s for preset %s, dtype %s: %s\n", row->name, cfg->name,
                       mlaf_dtype_name(dt),
                       row->flags & MLAF_KVF_BF16_LATENT && dt != MLAF_BF16 ? "needs a bf16 latent" : "other dims");
                n->skipped++;
            }
            continue;
        }
        const int bytes = (row->cache_dtypes & (1u << MLAF_U8)) != 0;
        for (size_t i = 0; i < sizeof v / sizeof v[0]; i++, k++) {
            if (v[i].bytes != bytes) continue;
            mlaf_verify_case c = mlaf_verify_case_default(cfg, dt, T, seed + 7919u * (uint64_t)k);
            c.kv_rope_tail = tail;
            c.kv_format = (mlaf_kv_format)f;
            c.cache_dtype = bytes ? MLAF_U8 : v[i].cache_f32 ? MLAF_F32 : dt;
            c.in_place = v[i].in_place;
            c.strided = v[i].strided;
            c.no_k_pe = v[i].cache_only ? 2 : 0;
            c.map_short = v[i].short_map ? T / 3 : 0;
            c.block_size = v[i].bs;
            c.index_dtype = k % 2 ? MLAF_I32 : MLAF_I64;
            char label[160];
            snprintf(label, sizeof label, "kv_rope_tail=%d,cache=%s%s,bs=%lld", (int)tail, row->name, v[i].label,
                     (long long)v[i].bs);
            run_case(ctx, op, cfg->name, &c, label, n);
        }
    }
}

int cmd_verify(int argc, char **argv) {
    int want_backend[MLAF_BACKEND_COUNT_] = {1, 1};
    int backend_explicit = 0;
    int want_op[MLAF_OP_COUNT_] = {1, 1, 1, 1, 1, 1, 1};
    const char *preset = NULL, *config = NULL;
    int64_t hidden[CLI_MAX_LIST] = {2048, 7168};
    int nhidden = 2;
    const int64_t rnq_tokens[6] = {0, 1, 7, 64, 257, 4099};
    mlaf_dtype dts[3] = {MLAF_F32, MLAF_F16, MLAF_BF16};
    int ndt = 3;
    int64_t tokens[CLI_MAX_LIST] = {0, 1, 2, 7, 64, 257, 4096, 65537};
    int ntok = 8, tokens_given = 0;
    int64_t cache_tokens[6] = {0, 1, 7, 257, 4099, 65537};
    int cache_mask = 0;
    long long seed = 1;
    int sweep = 0, indexer = 0;

    for (int i = 1; i < argc; i++) {
        const char *v;
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            help();
            return CLI_EXIT_OK;
        }
        if (!strcmp(argv[i], "--indexer")) {
            indexer = 1;
        } else if (!strcmp(argv[i], "--sweep")) {
            sweep = 1;
        } else if ((r = cli_take_value(argc, argv, &i, "--backend", &v)) != 0) {
            if (r < 0) return CLI_EXIT_USAGE;
            if (!strcasecmp(v, "all")) {
                want_backend[0] = want_backend[1] = 1;
                backend_explicit = 0;
            } else {
                mlaf_backend b;
                if (cli_parse_backend("--backend", v, &b)) return CLI_EXIT_USAGE;
                want_backend[0] = want_backend[1] = 0;
                want_backend[b] = 1;
                backend_explicit = 1;
            }
        } else if ((r = cli_take_value(argc, argv, &i, "--op", &v)) != 0) {
            if (r < 0 || cli_parse_op_set("--op", v, want_op)) return CLI_EXIT_USAGE;
        } else if ((r = cli_take_value(argc, argv, &i, "--preset", &v)) != 0) {
            if (r < 0) return CLI_EXIT_USAGE;
            if (cli_check_preset("verify", v)) return CLI_EXIT_USAGE;
            preset = v;
        } else if ((r = cli_take_value(argc, argv, &i, "--config", &v)) != 0) {
            if (r < 0) return CLI_EXIT_USAGE;
            config = v;
        } else if ((r = cli_take_value(argc, argv, &i, "--dtype", &v)) != 0) {
            if (r < 0) return CLI_EXIT_USAGE;
            if (!strcasecmp(v, "all")) {
                ndt = 3;
                dts[0] = MLAF_F32, dts[1] = MLAF_F16, dts[2] = MLAF_BF16;
            } else {
                if (cli_parse_dtype("--dtype", v, &dts[0])) return CLI_EXIT_USAGE;
                ndt = 1;
            }
        } else if ((r = cli_take_value(argc, argv, &i, "--tokens", &v)) != 0) {
            if (r < 0) return CLI_EXIT_USAGE;
            ntok = cli_parse_int_list("--tokens", v, 0, tokens, CLI_MAX_LIST);
            if (ntok < 0) return CLI_EXIT_USAGE;
            tokens_given = 1;
        } else if ((r = cli_take_value(argc, argv, &i, "--cache", &v)) != 0) {
            if (r < 0 || (cache_mask = parse_cache_set(v)) < 0) return CLI_EXIT_USAGE;
        } else if ((r = cli_take_value(argc, argv, &i, "--hidden", &v)) != 0) {
            if (r < 0) return CLI_EXIT_USAGE;
            nhidden = cli_parse_int_list("--hidden", v, 1, hidden, CLI_MAX_LIST);
            if (nhidden < 0) return CLI_EXIT_USAGE;
            for (int h = 0; h < nhidden; h++)
                if (hidden[h] > ((int64_t)1 << 20))
                    return cli_usage_error("verify", "--hidden %lld: expected at most 1048576", (long long)hidden[h]);
        } else if ((r = cli_take_value(argc, argv, &i, "--seed", &v)) != 0) {
            if (r < 0) return CLI_EXIT_USAGE;
            if (cli_parse_int("--seed", v, 0, ((long long)1 << 40), &seed)) return CLI_EXIT_USAGE;
        } else {
            return cli_usage_error("verify", "unknown option '%s' (see mlafuse verify --help)",
                                   argv[i]);
        }
    }
    if (preset && config)
        return cli_usage_error("verify", "--preset and --config are exclusive (pick one model source)");

    /* Models. */
    mlaf_model_config models[16];
    int32_t tails[16] = {0}; /* kv_rope_tail of each model (DeepSeek-V4: 64) */
    int nmodels = 0;
    if (config) {
        if (cli_load_hf_config(config, &models[0]) != 0) return CLI_EXIT_FAIL;
        tails[0] = models[0].kv_rope_tail;
        nmodels = 1;
    } else if (preset && strcasecmp(preset, "all")) {
        (void)cli_find_model(preset, &models[0], &tails[0]); /* known: cli_check_preset */
        nmodels = 1;
    } else {
        for (int i = 0; i < mlaf_preset_count() && nmodels < 16; i++)
            tails[nmodels] = mlaf_preset_at(i)->kv_rope_tail, models[nmodels++] = *mlaf_preset_at(i);
    }
    if (sweep) {
        nmodels = cli_sweep_models(&models[0], models, 16);
        memset(tails, 0, sizeof tails);
    }
    int with_extras = !sweep && !config && !(preset && strcasecmp(preset, "all"));

    printf("# mlafuse verify: worst error in ulp of the output dtype (f16 / bf16) or u = 1e-5 "
           "relative (f32, router weights); <= 1 passes\n");
    counters n = {0, 0, 0};
    int backend_missing = 0;
    for (int b = 0; b < MLAF_BACKEND_COUNT_; b++) {
        if (!want_backend[b]) continue;
        mlaf_backend be = (mlaf_backend)b;
        mlaf_context *ctx = NULL;
        mlaf_status st = mlaf_context_create(&ctx, be);
        if (st != MLAF_OK) {
#ifdef MLAF_WITH_CUDA
            const char *why = be == MLAF_BACKEND_CUDA ? "no CUDA device is visible" : mlaf_status_message(st);
#else
            const char *why = be == MLAF_BACKEND_CUDA ? "this build has no CUDA backend (configure with -DMLAF_CUDA=ON)"
                                                      : mlaf_status_message(st);
#endif
            printf("SKIP: %s backend: %s (%s)\n", mlaf_backend_name(be), why, mlaf_status_name(st));
            n.skipped++;
            if (backend_explicit) backend_missing = 1;
            continue;
        }
        for (int o = 0; o < MLAF_OP_COUNT_; o++) {
            if (!want_op[o]) continue;
            mlaf_op op = (mlaf_op)o;
            if (!mlaf_backend_supports(be, op)) {
                printf("SKIP: %s on the %s backend: not supported by this backend\n",
                       mlaf_op_name(op), mlaf_backend_name(be));
                n.skipped++;
                continue;
            }
            if (op == MLAF_OP_RMS_NORM_QUANT) { /* no model dims: once per backend, eps of the first model */
                verify_rms_norm_quant(ctx, hidden, nhidden, dts, ndt, tokens_given ? tokens : rnq_tokens,
                                      tokens_given ? ntok : 6, (uint64_t)seed * 1000003u + 0x9a7u,
                                      models[0].rms_norm_eps > 0.0f ? models[0].rms_norm_eps : 1e-6f, &n.passed,
                                      &n.failed, &n.skipped);
                continue;
            }
            if (op == MLAF_OP_GEMM_QUANT) { /* as rms_norm_quant: once per backend */
                verify_gemm_quant(ctx, hidden, nhidden, dts, ndt, tokens_given ? tokens : rnq_tokens, tokens_given ? ntok : 6,
                                  (uint64_t)seed * 1000003u + 0x6a1u, &n.passed, &n.failed, &n.skipped);
                continue;
            }
            /* models whose kv carries the rope (DeepSeek-V4): their own attention cases (run_v4);
             * the loops below skip them for the attention ops and route them as any model */
            int plain = 0;
            for (int m = 0; m < nmodels; m++) {
                if (tails[m] <= 0 || op == MLAF_OP_MOE_GATE || op == MLAF_OP_INDEXER_Q) {
                    plain++;
                    continue;
                }
                for (int d = 0; d < ndt; d++)
                    for (int t = 0; t < ntok; t++)
                        run_v4(ctx, op, &models[m], tails[m], dts[d], tokens[t],
                               (uint64_t)seed * 1000003u + (uint64_t)t * 131u + (uint64_t)d * 17u + 0x7a11u, &n);
            }
            if (!plain) continue;
            if (op == MLAF_OP_MLA_KV_CACHE && indexer) {
                for (int m = 0; m < nmodels; m++)
                    for (int d = 0; d < ndt; d++)
                        for (int t = 0; t < ntok; t++)
                            run_indexer_cases(ctx, cache_mask ? (unsigned)cache_mask : 1u, &models[m], dts[d], tokens[t],
                                              (uint64_t)seed * 1000003u + (uint64_t)t * 131u + (uint64_t)d * 17u +
                                                  (uint64_t)m * 7u + 0xd5au,
                                              &n);
                continue;
            }
            if (op == MLAF_OP_INDEXER_Q) {
                for (int m = 0; m < nmodels; m++)
                    for (int d = 0; d < (models[m].index_n_heads > 0 ? ndt : 1); d++) /* one skip line */
                        for (int t = 0; t < (models[m].index_n_heads > 0 ? ntok : 1); t++)
                            run_indexer_q(ctx, &models[m], dts[d], tokens[t],
                                          (uint64_t)seed * 1000003u + (uint64_t)t * 131u + (uint64_t)d * 17u +
                                              (uint64_t)m * 7u + 0xd5bu,
                                          &n);
                continue;
            }
            if (op == MLAF_OP_MLA_KV_CACHE && cache_mask) {
                for (int m = 0; m < nmodels; m++)
                    for (int d = 0; d < ndt && tails[m] <= 0; d++)
                        run_kv_formats(ctx, (unsigned)cache_mask, &models[m], dts[d],
                                       tokens_given ? tokens : cache_tokens, tokens_given ? ntok : 6,
                                       (uint64_t)seed * 1000003u + (uint64_t)d * 17u + (uint64_t)m * 7u + 0x5eedu, &n);
                continue;
            }
            for (int m = 0; m < nmodels; m++) {
                /* NoPE: rope_q's skip line once, not per dtype and T */
                const int once = op == MLAF_OP_ROPE_Q && models[m].qk_rope_head_dim <= 0;
                for (int d = 0; d < (once ? 1 : ndt) && (tails[m] <= 0 || op == MLAF_OP_MOE_GATE); d++)
                    for (int t = 0; t < (once ? 1 : ntok); t++)
                        run_op(ctx, op, &models[m], dts[d], tokens[t],
                               (uint64_t)seed * 1000003u + (uint64_t)t * 131u + (uint64_t)d * 17u +
                                   (uint64_t)m * 7u,
                               with_extras && m == 0, &n);
            }
        }
        mlaf_context_free(ctx);
    }
    printf("%d passed, %d failed, %d skipped\n", n.passed, n.failed, n.skipped);
    if (backend_missing) {
        fprintf(stderr, "mlafuse verify: the requested backend is not available\n");
        return CLI_EXIT_FAIL;
    }
    return n.failed ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}
