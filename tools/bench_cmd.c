/*
 * bench_cmd.c — `mlafuse bench`: fused op vs device copy bandwidth vs the unfused chain, all
 * measured in the same run.
 *
 * 1. Measure the copy reference once (CPU: memcpy by all threads on a buffer several times
 *    the last-level cache; CUDA: cudaMemcpyAsync device to device of 1 GB), read + write bytes.
 * 2. Per op and T: allocate inputs / outputs on the backend (CPU: several copies rotated so
 *    that consecutive calls do not hit in the LLC while one set is smaller than it), run the
 *    fused op once and the unfused chain once and compare their outputs (a warning on
 *    mismatch), then time both: CPU with clock_gettime over rotating sets; CUDA with events,
 *    L2 flushed before every sample, or (--graph, automatic for T <= 64) as replays of a
 *    CUDA graph of 100 calls, per-call time.
 * 3. Report median and p10 / p90, the op's minimal bytes (inputs read once + outputs written
 *    once), GB/s, % of the copy bandwidth, unfused time and speed-up; a table or --json.
 *    CUDA rows add a copy of the op's own bytes timed the same way (flush, events or graph):
 *    at mid T the 1 GB copy's bandwidth is out of reach even for the copy itself.
 * --hash: moe_gate rows run the hash-routed router (mlaf_moe_gate_hash: ids from a tid2eid table
 * of HASH_VOCAB token ids by random token ids) against the unfused chain score -> table lookup ->
 * gather -> normalize -> scale; its bytes are the token id, the k table entries and the k logits
 * it reads (the whole row for softmax) plus the outputs.
 * DeepSeek-V4 (--preset deepseek-v4-flash, kv_rope_tail 64): mla_kv_cache rotates the kv tail
 * (the unfused chain: the norms, RoPE on the dense k_nope's last 64 columns, the cache write) and
 * --cache fp8_v4 writes the 584-B page; rope_q runs head_norm (the chain: a norm pass, then the
 * gather / rotate / scatter).
 * --cache fp8 | fp8_ds_mla | fp8_v4: mla_kv_cache writes that cache format (fp8's scale lives in backend
 * memory, so graph replays read it like engines' k_scale); the unfused chain ends with a
 * separate quantize-and-write pass, and the check compares the two caches byte for byte.
 * --op rms_norm_quant (bench_rms_norm_quant.c): one row per T for the --hidden size and --q-format
 * (not per model: the op has no model dims), against the dense op followed by a quantize pass.
 * --q-format given: split_qk_norm and mla_kv_cache write q_norm in that format instead of the dense q
 * (mlaf_row_quant), against the dense op followed by the same quantize pass.
 * --op gemm_quant (bench_gemm_quant.c): x alone quantized into the --q-format, the same rows once per T,
 * against the bench's own quantize pass over the same x.
 */
#define _POSIX_C_SOURCE 200809L /* strcasecmp */
#include <strings.h>

#include "bench_op.h"

static void help(void) {
    printf(
        "usage: mlafuse bench [options]\n"
        "\n"
        "Times the fused ops against the copy bandwidth and the unfused chains engines run today,\n"
        "all measured in the same run.\n"
        "\n"
        "  --backend cpu|cuda   default: cuda when a GPU is visible, else cpu\n"
        "  --op NAME|all        split_qk_norm, mla_kv_cache, rope_q (models with rope; not NoPE ones),\n"
        "                       moe_gate (default all of these),\n"
        "                       indexer_q (models with a DSA indexer; timed against the same-run\n"
        "                       copy only: no unfused chain), rms_norm_quant (--hidden, --q-format),\n"
        "                       gemm_quant (--hidden, --q-format: x quantized alone)\n"
        "  --preset NAME        model preset (default glm-4.7-flash; 'all' for every preset)\n"
        "  --config FILE        the model of a Hugging Face config.json instead of a preset\n"
        "  --sweep              the row layouts of the family instead: q_lora_rank 0, 512, 768, 1024,\n"
        "                       1536, 2048, 3072 x kv_lora_rank 512 x rope 0, 64, from the model given\n"
        "  --dtype f32|f16|bf16 activation dtype (default bf16)\n"
        "  --tokens LIST        token counts (default cuda 1,8,64,512,4096,32768,131072;\n"
        "                       cpu 1,64,4096,65536)\n"
        "  --threads N          CPU threads for the op, the baselines and the copy (default all)\n"
        "  --reps N             timed samples per measurement (default cpu 10, cuda 100)\n"
        "  --graph              CUDA: time replays of a CUDA graph of 100 calls for every T\n"
        "                       (always done for T <= 64); per-call time\n"
        "  --pdl                CUDA: the ops launch as programmatic dependents\n"
        "                       (mlaf_context_set_cuda_pdl; sm_90+); a graph's calls then overlap\n"
        "  --json               print one JSON object with an array of rows instead of a table\n"
        "  --cache-order ORDER  mla_kv_cache's paged-cache blocks: shuffled (default: a random\n"
        "                       permutation of every block, as a long-running allocator hands\n"
        "                       them out), ordered (block i for tokens 64 i .. 64 i + 63),\n"
        "                       page-local (shuffled within each 2 MB of cache), page-groups\n"
        "                       (2 MB runs of blocks in order, the runs shuffled)\n"
        "  --cache FORMAT       mla_kv_cache's cache format: plain (default: the latent dtype),\n"
        "                       fp8 (per-tensor e4m3, e4m3(x / scale), one f32 scale in backend\n"
        "                       memory), fp8_ds_mla (FlashMLA's record: C e4m3 bytes, C/128 f32 tile\n"
        "                       scales, R bf16 rope values; --dtype bf16), fp8_v4 (DeepSeek-V4's\n"
        "                       584-B page; --preset deepseek-v4-flash --dtype bf16). The unfused chain ends\n"
        "                       with a separate quantize-and-write pass; its cache bytes are checked\n"
        "                       against the fused op's\n"
        "  --tile-scale MODE    fp8_ds_mla tile scales: amax (default: amax / 448), ue8m0,\n"
        "                       ue8m0_floor_scaled\n"
        "  --kv-scale X         fp8: the scale (default 1, what engines run without calibration)\n"
        "  --hash               moe_gate: the hash-routed router (mlaf_moe_gate_hash, DeepSeek-V4's\n"
        "                       first layers) instead of top-k: ids from a [129280, top_k] table\n"
        "  --hidden N           rms_norm_quant's and gemm_quant's K (default 7168)\n"
        "  --q-format NAME      their GEMM-input format: fp8_1x128, fp8_1x128_mn (default),\n"
        "                       fp8_1x128_ue8m0, mxfp8, fp8_1x128_cm, or none (rms_norm_quant dense only;\n"
        "                       the chain is then the residual add and the RMSNorm as two passes). Given,\n"
        "                       it also makes split_qk_norm and mla_kv_cache write q_norm in that format\n"
        "                       only (their chain: the dense op, then a quantize pass over q)\n"
        "  --q-scale NAME       its scale rounding: f32, ue8m0, mx_floor, mx_ceil (default: the\n"
        "                       format's first: f32, ue8m0 for fp8_1x128_ue8m0, mx_floor for mxfp8)\n"
        "  --indexer            mla_kv_cache with the DSA indexer key branch (docs/dsa.md; models with\n"
        "                       rope 64; the preset's indexer RoPE style, ue8m0, no Hadamard): the\n"
        "                       unfused chain adds LayerNorm, RoPE, quantize-and-write passes and\n"
        "                       the check compares the index caches byte for byte\n"
        "\n"
        "Bytes are the op's minimum: inputs read once + outputs written once (see docs/cli.md).\n"
        "CUDA rows also time a device-to-device copy of those same bytes the same way (copy_us;\n"
        "%%cpy= is copy_us / fused_us): the copy path's own time at that size. CUDA stream rows\n"
        "also time SM copy kernels moving those bytes (kcopy_us, the faster of two; %%kcpy= is\n"
        "kcopy_us / fused_us): what a kernel with no arithmetic reaches at that size; for rope_q,\n"
        "a copy of q's rope pieces at q's own strides (the op's access pattern).\n");
}

/* ---- the op registry: every op the bench times, in the order of its rows --------------------- */
static const bench_op_def *const bench_ops[] = {&bench_split_qk_norm_def, &bench_mla_kv_cache_def,
                                                &bench_rope_q_def,        &bench_moe_gate_def,
                                                &bench_indexer_q_def,     &bench_rms_norm_quant_def,
                                                &bench_gemm_quant_def};
#define N_BENCH_OPS ((int)(sizeof bench_ops / sizeof bench_ops[0]))


/* ---- the command ----------------------------------------------------------------------------- */
int cmd_bench(int argc, char **argv) {
    int backend_set = 0;
    mlaf_backend be = MLAF_BACKEND_CPU;
    int want_op[MLAF_OP_COUNT_] = {1, 1, 1, 1};
    const char *preset = NULL, *config = NULL;
    mlaf_dtype dt = MLAF_BF16;
    int64_t tokens[CLI_MAX_LIST];
    int ntok = 0;
    long long threads = 0, reps = 0;
    int graph = 0, pdl = 0, json = 0, cache_order = CO_SHUFFLED, sweep = 0, hash = 0, indexer = 0;
    cache_opt co = {0, MLAF_KV_PLAIN, MLAF_TILE_AMAX, 1.0};
    int tile_set = 0, kv_scale_set = 0;
    int op_all = 0; /* --op all: ops a model does not have are skipped with a note */
    long long hidden = 7168;
    mlaf_gemm_format q_fmt = MLAF_GEMM_FP8_1X128_MN;
    int q_scale = -1; /* the format's first rounding */
    int q_fmt_set = 0; /* --q-format given: split_qk_norm / mla_kv_cache write q quantized too */

    for (int i = 1; i < argc; i++) {
        const char *v;
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            help();
            return CLI_EXIT_OK;
        }
        if (!strcmp(argv[i], "--graph")) {
            graph = 1;
        } else if (!strcmp(argv[i], "--pdl")) {
            pdl = 1;
        } else if (!strcmp(argv[i], "--hash")) {
            hash = 1;
        } else if (!strcmp(argv[i], "--indexer")) {
            indexer = 1;
        } else if (!strcmp(argv[i], "--sweep")) {
            sweep = 1;
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if ((r = cli_take_value(argc, argv, &i, "--backend", &v)) != 0) {
            if (r < 0 || cli_parse_backend("--backend", v, &be)) return CLI_EXIT_USAGE;
            backend_set = 1;
        } else if ((r = cli_take_value(argc, argv, &i, "--op", &v)) != 0) {
            if (r < 0 || cli_parse_op_set("--op", v, want_op)) return CLI_EXIT_USAGE;
            op_all = !strcasecmp(v, "all");
        } else if ((r = cli_take_value(argc, argv, &i, "--preset", &v)) != 0) {
            if (r < 0) return CLI_EXIT_USAGE;
            if (cli_check_preset("bench", v)) return CLI_EXIT_USAGE;
            preset = v;
        } else if ((r = cli_take_value(argc, argv, &i, "--config", &v)) != 0) {
            if (r < 0) return CLI_EXIT_USAGE;
            config = v;
        } else if ((r = cli_take_value(argc, argv, &i, "--dtype", &v)) != 0) {
            if (r < 0 || cli_parse_dtype("--dtype", v, &dt)) return CLI_EXIT_USAGE;
        } else if ((r = cli_take_value(argc, argv, &i, "--tokens", &v)) != 0) {
            if (r < 0) return CLI_EXIT_USAGE;
            ntok = cli_parse_int_list("--tokens", v, 0, tokens, CLI_MAX_LIST);
            if (ntok < 0) return CLI_EXIT_USAGE;
        } else if ((r = cli_take_value(argc, argv, &i, "--threads", &v)) != 0) {
            if (r < 0 || cli_parse_int("--threads", v, 1, 4096, &threads)) return CLI_EXIT_USAGE;
        } else if ((r = cli_take_value(argc, argv, &i, "--reps", &v)) != 0) {
            if (r < 0 || cli_parse_int("--reps", v, 1, 100000, &reps)) return CLI_EXIT_USAGE;
        } else if ((r = cli_take_value(argc, argv, &i, "--cache-order", &v)) != 0) {
            if (r < 0) return CLI_EXIT_USAGE;
            for (cache_order = 0; cache_order < CO_COUNT; cache_order++)
                if (!strcmp(v, cache_order_names[cache_order])) break;
            if (cache_order == CO_COUNT)
                return cli_usage_error("bench", "--cache-order '%s': expected shuffled, ordered, page-local or page-groups", v);
        } else if ((r = cli_take_value(argc, argv, &i, "--cache", &v)) != 0) {
            if (r < 0) return CLI_EXIT_USAGE;
            int f = 0;
            char names[160];
            while (f < MLAF_KV_FORMAT_COUNT_ && strcmp(v, mlaf_kv_formats[f].name)) f++;
            if (f == MLAF_KV_FORMAT_COUNT_)
                return cli_usage_error("bench", "--cache '%s': expected %s", v, mlaf_kv_format_list(0, names, sizeof names, 0));
            co.show = 1;
            co.fmt = (mlaf_kv_format)f;
        } else if ((r = cli_take_value(argc, argv, &i, "--tile-scale", &v)) != 0) {
            if (r < 0) return CLI_EXIT_USAGE;
            int m = 0;
            while (m < 3 && strcmp(v, tile_scale_names[m])) m++;
            if (m == 3)
                return cli_usage_error("bench", "--tile-scale '%s': expected amax, ue8m0 or ue8m0_floor_scaled", v);
            co.tile_scale = (mlaf_tile_scale)m;
            tile_set = 1;
        } else if ((r = cli_take_value(argc, argv, &i, "--hidden", &v)) != 0) {
            if (r < 0 || cli_parse_int("--hidden", v, 1, (long long)1 << 20, &hidden)) return CLI_EXIT_USAGE;
        } else if ((r = cli_take_value(argc, argv, &i, "--q-format", &v)) != 0) {
            if (r < 0) return CLI_EXIT_USAGE;
            int f = 0;
            char names[160];
            while (f < MLAF_GEMM_FORMAT_COUNT_ && strcmp(v, mlaf_gemm_formats[f].name)) f++;
            if (f == MLAF_GEMM_FORMAT_COUNT_)
                return cli_usage_error("bench", "--q-format '%s': expected none, %s", v, mlaf_gemm_format_list(names, sizeof names));
            q_fmt = (mlaf_gemm_format)f;
            q_fmt_set = 1;
        } else if ((r = cli_take_value(argc, argv, &i, "--q-scale", &v)) != 0) {
            if (r < 0) return CLI_EXIT_USAGE;
            q_scale = 0;
            while (q_scale < MLAF_GEMM_SCALE_COUNT_ && strcmp(v, mlaf_gemm_scale_name((mlaf_gemm_scale)q_scale))) q_scale++;
            if (q_scale == MLAF_GEMM_SCALE_COUNT_)
                return cli_usage_error("bench", "--q-scale '%s': expected f32, ue8m0, mx_floor or mx_ceil", v);
        } else if ((r = cli_take_value(argc, argv, &i, "--kv-scale", &v)) != 0) {
            if (r < 0) return CLI_EXIT_USAGE;
            char *end = NULL;
            const double x = strtod(v, &end);
            if (end == v || *end || !(x > 0.0) || !isfinite((float)x))
                return cli_usage_error("bench", "--kv-scale '%s': expected a positive finite number", v);
            co.kv_scale = (float)x;
            kv_scale_set = 1;
        } else {
            return cli_usage_error("bench", "unknown option '%s' (see mlafuse bench --help)", argv[i]);
        }
    }
    if (preset && config)
        return cli_usage_error("bench", "--preset and --config are exclusive (pick one model source)");
    const mlaf_gemm_format_info *q_row = &mlaf_gemm_formats[q_fmt];
    if (q_scale < 0)
        for (q_scale = 0; q_fmt != MLAF_GEMM_NONE && !((q_row->scale_modes >> q_scale) & 1u); q_scale++) {
        }
    if (q_fmt != MLAF_GEMM_NONE && !((q_row->scale_modes >> q_scale) & 1u)) {
        char names[96];
        return cli_usage_error("bench", "--q-scale %s: format %s takes %s", mlaf_gemm_scale_name((mlaf_gemm_scale)q_scale),
                               q_row->name, mlaf_gemm_scale_list(q_row->scale_modes, names, sizeof names));
    }
    if (q_fmt != MLAF_GEMM_NONE && hidden % q_row->group != 0)
        return cli_usage_error("bench", "--hidden %lld: expected a multiple of %d for --q-format %s", hidden,
                               (int)q_row->group, q_row->name);
    if (q_fmt == MLAF_GEMM_NONE && want_op[MLAF_OP_GEMM_QUANT] && !op_all)
        return cli_usage_error("bench", "--op gemm_quant: --q-format none has nothing to write (name a format)");
    const mlaf_kv_format_info *fmt_row = &mlaf_kv_formats[co.fmt];
    if ((fmt_row->flags & MLAF_KVF_BF16_LATENT) && dt != MLAF_BF16 && want_op[MLAF_OP_MLA_KV_CACHE])
        return cli_usage_error("bench", "--cache %s needs --dtype bf16 (its rope values are bf16; got %s)",
                               mlaf_kv_format_name(co.fmt), mlaf_dtype_name(dt));
    if (co.show && !want_op[MLAF_OP_MLA_KV_CACHE])
        fprintf(stderr, "mlafuse bench: note: --cache applies to --op mla_kv_cache only; ignored\n");
    char fmt_names[160];
    if (tile_set && !(fmt_row->flags & MLAF_KVF_TILE_SCALE))
        fprintf(stderr, "mlafuse bench: note: --tile-scale applies to --cache %s only; ignored\n",
                mlaf_kv_format_list(MLAF_KVF_TILE_SCALE, fmt_names, sizeof fmt_names, 0));
    if (kv_scale_set && !(fmt_row->flags & MLAF_KVF_SCALE))
        fprintf(stderr, "mlafuse bench: note: --kv-scale applies to --cache %s only; ignored\n",
                mlaf_kv_format_list(MLAF_KVF_SCALE, fmt_names, sizeof fmt_names, 0));

    if (!backend_set) be = mlaf_backend_available(MLAF_BACKEND_CUDA) ? MLAF_BACKEND_CUDA : MLAF_BACKEND_CPU;
    if (be == MLAF_BACKEND_CUDA && !mlaf_backend_available(MLAF_BACKEND_CUDA)) {
#ifdef MLAF_WITH_CUDA
        fprintf(stderr, "mlafuse bench: --backend cuda: no CUDA device is visible\n");
#else
        fprintf(stderr, "mlafuse bench: --backend cuda: this build has no CUDA backend "
                        "(configure with -DMLAF_CUDA=ON)\n");
#endif
        return CLI_EXIT_FAIL;
    }
    if (graph && be != MLAF_BACKEND_CUDA)
        fprintf(stderr, "mlafuse bench: note: --graph applies to the cuda backend only; ignored\n");
    if (ntok == 0) {
        static const int64_t cuda_t[] = {1, 8, 64, 512, 4096, 32768, 131072};
        static const int64_t cpu_t[] = {1, 64, 4096, 65536};
        const int64_t *d = be == MLAF_BACKEND_CUDA ? cuda_t : cpu_t;
        ntok = be == MLAF_BACKEND_CUDA ? 7 : 4;
        memcpy(tokens, d, sizeof(int64_t) * (size_t)ntok);
    }
    if (reps == 0) reps = be == MLAF_BACKEND_CUDA ? 100 : 10;

    mlaf_model_config models[16];
    int32_t tails[16] = {0}; /* kv_rope_tail of each model (DeepSeek-V4: 64) */
    int nmodels = 0;
    if (config) {
        if (cli_load_hf_config(config, &models[0]) != 0) return CLI_EXIT_FAIL;
        tails[0] = models[0].kv_rope_tail;
        nmodels = 1;
    } else if (preset && !strcasecmp(preset, "all")) {
        for (int i = 0; i < mlaf_preset_count() && i < 16; i++)
            tails[nmodels] = mlaf_preset_at(i)->kv_rope_tail, models[nmodels++] = *mlaf_preset_at(i);
    } else if (preset) {
        (void)cli_find_model(preset, &models[0], &tails[0]); /* known: cli_check_preset */
        nmodels = 1;
    } else {
        models[nmodels++] = *mlaf_preset_at(0);
    }
    if (sweep) {
        nmodels = cli_sweep_models(&models[0], models, 16);
        memset(tails, 0, sizeof tails);
    }
    /* An op named by --op that the one model does not have is an error, not a skip. */
    for (int d = 0; d < N_BENCH_OPS; d++) {
        const bench_op_def *def = bench_ops[d];
        const char *why = def->skip ? def->skip(&models[0], tails[0]) : NULL;
        if (want_op[def->op] && def->skip_note && !op_all && nmodels == 1 && why)
            return cli_usage_error("bench", "--op %s: %s %s %s (see mlafuse presets)", mlaf_op_name(def->op),
                                   config ? "model" : "preset", models[0].name, why);
    }

    mlaf_context *ctx = NULL;
    mlaf_status st = mlaf_context_create(&ctx, be);
    if (st != MLAF_OK) {
        fprintf(stderr, "mlafuse bench: cannot create a %s context: %s\n", mlaf_backend_name(be),
                mlaf_status_message(st));
        return CLI_EXIT_FAIL;
    }
    char err[512] = "";
    char device[256];
    double copy_gbps = 0.0, copy_bytes = 0.0;
    size_t llc = bench_cpu_llc_bytes();
    if (be == MLAF_BACKEND_CPU) {
        if (pdl) fprintf(stderr, "mlafuse bench: note: --pdl applies to the cuda backend only\n");
        if (threads > 0 && mlaf_context_set_threads(ctx, (int)threads) != MLAF_OK) {
            fprintf(stderr, "mlafuse bench: --threads: %s\n", mlaf_context_last_error(ctx));
            mlaf_context_free(ctx);
            return CLI_EXIT_USAGE;
        }
        threads = mlaf_context_threads(ctx);
        snprintf(device, sizeof device, "%s (%lld threads, isa %s)", bench_cpu_name(), threads,
                 mlaf_cpu_isa_name(mlaf_context_cpu_isa(ctx)));
        size_t cb = 4 * llc;
        if (cb < ((size_t)256 << 20)) cb = (size_t)256 << 20;
        if (cb > ((size_t)2 << 30)) cb = (size_t)2 << 30;
        copy_gbps = bench_cpu_copy_gbps((int)threads, cb, reps < 5 ? 5 : (int)reps);
        copy_bytes = 2.0 * (double)cb;
        if (copy_gbps <= 0.0) fprintf(stderr, "mlafuse bench: warning: the copy reference could not be measured\n");
    } else {
#ifdef MLAF_WITH_CUDA
        if (threads > 0) fprintf(stderr, "mlafuse bench: note: --threads applies to the cpu backend only\n");
        threads = 0;
        if (bcu_setup(err, sizeof err) ||
            mlaf_context_set_cuda_stream(ctx, bcu_stream()) != MLAF_OK) {
            fprintf(stderr, "mlafuse bench: cuda setup failed: %s\n", err[0] ? err : mlaf_context_last_error(ctx));
            bcu_teardown();
            mlaf_context_free(ctx);
            return CLI_EXIT_FAIL;
        }
        if (pdl && mlaf_context_set_cuda_pdl(ctx, 1) != MLAF_OK) {
            fprintf(stderr, "mlafuse bench: --pdl: %s\n", mlaf_context_last_error(ctx));
            bcu_teardown();
            mlaf_context_free(ctx);
            return CLI_EXIT_USAGE;
        }
        snprintf(device, sizeof device, "%s", bcu_device_name());
        size_t cb = (size_t)1 << 30;
        if (bcu_copy_gbps(cb, 20, &copy_gbps, err, sizeof err)) {
            fprintf(stderr, "mlafuse bench: warning: copy reference failed: %s\n", err);
            copy_gbps = 0.0;
        }
        copy_bytes = 2.0 * (double)cb;
#endif
    }

    char model_list[1200] = "";
    for (int m = 0; m < nmodels; m++) {
        size_t len = strlen(model_list);
        snprintf(model_list + len, sizeof model_list - len, "%s%.63s", m ? "," : "", models[m].name);
    }
    if (!json) {
        printf("# mlafuse bench %s: backend=%s device=%s dtype=%s model=%s\n", mlaf_version_string(),
               mlaf_backend_name(be), device, mlaf_dtype_name(dt), model_list);
        printf("# copy reference: %.1f GB/s (%s, %.0f MB read + written)\n", copy_gbps,
               be == MLAF_BACKEND_CUDA ? "cudaMemcpyAsync device to device" : "memcpy, all threads",
               copy_bytes / 1e6);
        if (co.show) {
            printf("# cache: %s (%s", fmt_row->name, fmt_row->summary);
            if (fmt_row->flags & MLAF_KVF_SCALE) printf("; scale %g in %s memory", co.kv_scale, mlaf_backend_name(be));
            if (fmt_row->flags & MLAF_KVF_TILE_SCALE) printf("; tile scales %s", tile_scale_names[co.tile_scale]);
            if (!(fmt_row->cache_dtypes & (1u << MLAF_U8))) printf("; %s", mlaf_dtype_name(dt));
            printf(")\n");
        }
        printf("# reproduce: %s bench --backend %s --dtype %s --reps %lld", cli_program, mlaf_backend_name(be),
               mlaf_dtype_name(dt), reps);
        if (config) printf(" --config %s", config);
        else printf(" --preset %s", preset ? preset : models[0].name);
        if (be == MLAF_BACKEND_CPU) printf(" --threads %lld", threads);
        if (graph) printf(" --graph");
        if (pdl) printf(" --pdl");
        if (hash) printf(" --hash");
        if (cache_order != CO_SHUFFLED) printf(" --cache-order %s", cache_order_names[cache_order]);
        if (co.show) printf(" --cache %s", mlaf_kv_format_name(co.fmt));
        if (co.show && (fmt_row->flags & MLAF_KVF_TILE_SCALE) && co.tile_scale != MLAF_TILE_AMAX)
            printf(" --tile-scale %s", tile_scale_names[co.tile_scale]);
        if (co.show && (fmt_row->flags & MLAF_KVF_SCALE) && co.kv_scale != 1.0) printf(" --kv-scale %g", co.kv_scale);
        if (indexer) printf(" --indexer");
        if (want_op[MLAF_OP_RMS_NORM_QUANT] || want_op[MLAF_OP_GEMM_QUANT])
            printf(" --hidden %lld", hidden);
        if (want_op[MLAF_OP_RMS_NORM_QUANT] || want_op[MLAF_OP_GEMM_QUANT] || q_fmt_set)
            printf(" --q-format %s%s%s", q_row->name, q_fmt ? " --q-scale " : "",
                   q_fmt ? mlaf_gemm_scale_name((mlaf_gemm_scale)q_scale) : "");
        printf(" --tokens ");
        for (int t = 0; t < ntok; t++) printf("%s%lld", t ? "," : "", (long long)tokens[t]);
        int nops = 0;
        for (int o = 0; o < MLAF_OP_COUNT_; o++) nops += want_op[o];
        if (nops == 1)
            for (int o = 0; o < MLAF_OP_COUNT_; o++)
                if (want_op[o]) printf(" --op %s", mlaf_op_name((mlaf_op)o));
        printf("\n");
        print_header(co.show);
    }

    int cap_rows = MLAF_OP_COUNT_ * ntok * nmodels;
    row *rows = (row *)calloc((size_t)cap_rows, sizeof(row));
    int nrows = 0, any_error = 0;
    if (!rows) {
        fprintf(stderr, "mlafuse bench: out of host memory\n");
        mlaf_context_free(ctx);
        return CLI_EXIT_FAIL;
    }
    for (int m = 0; m < nmodels; m++)
        for (int d = 0; d < N_BENCH_OPS; d++) {
            const bench_op_def *def = bench_ops[d];
            const int oi = (int)def->op;
            if (!want_op[oi]) continue;
            const int no_dims = def->op == MLAF_OP_RMS_NORM_QUANT || def->op == MLAF_OP_GEMM_QUANT;
            if (no_dims && m > 0) continue; /* no model dims: its rows once */
            if (def->op == MLAF_OP_GEMM_QUANT && q_fmt == MLAF_GEMM_NONE) { /* --op all --q-format none */
                fprintf(json ? stderr : stdout, "# gemm_quant skipped: --q-format none\n");
                continue;
            }
            const char *why = def->skip_note && def->skip ? def->skip(&models[m], tails[m]) : NULL;
            if (why) { /* one note line for the model, instead of a skipped row per T */
                fprintf(json ? stderr : stdout, "# %s skipped: %s %s %s\n", mlaf_op_name(def->op),
                        config ? "model" : "preset", models[m].name, why);
                continue;
            }
            for (int ti = 0; ti < ntok; ti++) {
                row *r = &rows[nrows++];
                memset(r, 0, sizeof *r);
                r->op = (mlaf_op)oi;
                snprintf(r->model, sizeof r->model, "%.55s%s", models[m].name,
                         indexer && r->op == MLAF_OP_MLA_KV_CACHE ? "+indexer" : "");
                const int row_q = q_fmt_set && q_fmt && (r->op == MLAF_OP_SPLIT_QK_NORM || r->op == MLAF_OP_MLA_KV_CACHE);
                if (no_dims) /* the hidden size and the format name the row */
                    snprintf(r->model, sizeof r->model, "k%lld/%s%s%s", hidden, q_row->name, q_fmt ? "/" : "",
                             q_fmt ? mlaf_gemm_scale_name((mlaf_gemm_scale)q_scale) : "");
                else if (row_q) /* q written quantized: the format names the row */
                    snprintf(r->model, sizeof r->model, "%.40s%s+q:%s", models[m].name,
                             indexer && r->op == MLAF_OP_MLA_KV_CACHE ? "+indexer" : "", q_row->name);
                r->T = tokens[ti];
                if (co.show && r->op == MLAF_OP_MLA_KV_CACHE) r->cache = mlaf_kv_format_name(co.fmt);
                r->hash = hash && r->op == MLAF_OP_MOE_GATE;
                r->gbps = r->pct = r->speedup = r->pct_scopy = r->pct_kcopy = NAN;
                snprintf(r->check, sizeof r->check, "-");
                int graph_calls = 0;
                r->mode = "wall";
                if (be == MLAF_BACKEND_CUDA) {
                    graph_calls = (graph || r->T <= 64) ? 100 : 0;
                    r->mode = graph_calls ? "graph" : "stream";
                }
                if (!mlaf_backend_supports(be, r->op)) {
                    snprintf(r->check, sizeof r->check, "skipped");
                    snprintf(r->error, sizeof r->error, "%s is not supported by the %s backend",
                             mlaf_op_name(r->op), mlaf_backend_name(be));
                    if (!json) print_row(r, co.show);
                    continue;
                }
                const char *skip = def->skip ? def->skip(&models[m], tails[m]) : NULL;
                if (skip) {
                    snprintf(r->check, sizeof r->check, "skipped");
                    snprintf(r->error, sizeof r->error, "%s", skip);
                    if (!json) print_row(r, co.show);
                    continue;
                }
                bench_op o;
                memset(&o, 0, sizeof o);
                o.op = r->op;
                o.def = def;
                o.be = be;
                o.ctx = ctx;
                o.cfg = models[m];
                o.tail = tails[m];
                o.dt = dt;
                o.T = r->T;
                o.threads = (int)(threads > 0 ? threads : 1);
                o.cache_order = cache_order;
                o.hash = r->hash;
                o.kv_fmt = r->op == MLAF_OP_MLA_KV_CACHE ? co.fmt : MLAF_KV_PLAIN;
                o.indexer = indexer && r->op == MLAF_OP_MLA_KV_CACHE;
                o.tile_scale = co.tile_scale;
                o.hidden = hidden;
                o.q_fmt = no_dims || row_q ? q_fmt : MLAF_GEMM_NONE;
                o.q_scale = (mlaf_gemm_scale)q_scale;
                o.kv_scale = (float)co.kv_scale;
                err[0] = '\0';
                if (setup(&o, llc, err, sizeof err)) {
                    snprintf(r->error, sizeof r->error, "setup: %s", err);
                    any_error = 1;
                    op_free(&o);
                    if (!json) print_row(r, co.show);
                    continue;
                }
                r->bytes = o.bytes;
                char cerr[512] = "";
                /* compared with the same-run copy only: an op without an unfused chain, or a case its
                 * chain does not cover (a cache format without a separate pass) */
                const int no_baseline = def->unfused == NULL || (def->has_unfused && !def->has_unfused(&o));
                if (no_baseline) {
                    snprintf(r->check, sizeof r->check, "no baseline");
                } else if (check_baseline(&o, r->check, sizeof r->check, cerr, sizeof cerr)) {
                    if (!strcmp(r->check, "ok")) snprintf(r->check, sizeof r->check, "not checked");
                } else if (strncmp(r->check, "ok", 2)) { /* "ok (N near-tie rows)" is ok */
                    fprintf(stderr, "mlafuse bench: warning: the unfused baseline of %s (T=%lld) "
                                    "differs from the fused op: %s\n",
                            mlaf_op_name(o.op), (long long)o.T, r->check);
                }
                err[0] = '\0';
                int fr, ur;
#ifdef MLAF_WITH_CUDA
                if (be == MLAF_BACKEND_CUDA) {
                    fr = bcu_time(def->fused, &o, (int)reps, graph_calls, &r->fused, err, sizeof err);
                } else
#endif
                    fr = bench_cpu_time(def->fused, &o, o.nsets, (int)reps, &r->fused, err, sizeof err);
                if (fr) {
                    snprintf(r->error, sizeof r->error, "%s", err);
                    any_error = 1;
                } else {
                    r->have_fused = 1;
                }
                err[0] = '\0';
                ur = 0;
#ifdef MLAF_WITH_CUDA
                if (no_baseline) {
                } else if (be == MLAF_BACKEND_CUDA) {
                    ur = bcu_time(def->unfused, &o, (int)reps, graph_calls, &r->unfused, err, sizeof err);
                } else
#else
                if (!no_baseline)
#endif
                    ur = bench_cpu_time(def->unfused, &o, o.nsets, (int)reps, &r->unfused, err, sizeof err);
                if (no_baseline) {
                } else if (ur) {
                    size_t len = strlen(r->error);
                    snprintf(r->error + len, sizeof r->error - len, "%s%s", len ? "; " : "", err);
                    any_error = 1;
                } else {
                    r->have_unfused = 1;
                }
#ifdef MLAF_WITH_CUDA
                /* the same bytes through cudaMemcpyAsync, timed like the op (the same-run copy of docs/conventions.md,
                 * at this size: what ramp-up and tail leave of the copy bandwidth) */
                if (be == MLAF_BACKEND_CUDA && r->bytes > 0) {
                    err[0] = '\0';
                    if (bcu_copy_time(r->bytes, (int)reps, graph_calls, &r->scopy, err, sizeof err) == 0)
                        r->have_scopy = 1;
                    else
                        fprintf(stderr, "mlafuse bench: warning: same-bytes copy failed: %s\n", err);
                }
                /* and through SM copy kernels (stream rows): the ceiling of a kernel at this size */
                if (be == MLAF_BACKEND_CUDA && r->bytes > 0 && graph_calls == 0) {
                    err[0] = '\0';
                    /* rope_q reads and writes the R rope values of each head row: its ceiling is a copy of
                     * those pieces at q's strides, not a contiguous run of the same bytes */
                    const int64_t es = (int64_t)mlaf_dtype_size(o.dt);
                    const int pieces = o.op == MLAF_OP_ROPE_Q && o.tail == 0;
                    if (pieces ? bcu_piece_copy_time(o.T * o.H, o.RP * es, o.D * es, (o.D - o.RP) * es, (int)reps,
                                                     &r->kcopy, err, sizeof err) == 0
                               : bcu_kcopy_time(r->bytes, (int)reps, &r->kcopy, err, sizeof err) == 0)
                        r->have_kcopy = 1;
                    else
                        fprintf(stderr, "mlafuse bench: warning: kernel copy failed: %s\n", err);
                }
#endif
                if (!r->have_fused && cerr[0] && !r->error[0]) snprintf(r->error, sizeof r->error, "%s", cerr);
                if (r->have_fused && r->fused.median_us > 0) {
                    r->gbps = r->bytes / (r->fused.median_us * 1e3);
                    if (copy_gbps > 0) r->pct = 100.0 * r->gbps / copy_gbps;
                    if (r->have_unfused) r->speedup = r->unfused.median_us / r->fused.median_us;
                    if (r->have_scopy) r->pct_scopy = 100.0 * r->scopy.median_us / r->fused.median_us;
                    if (r->have_kcopy) r->pct_kcopy = 100.0 * r->kcopy.median_us / r->fused.median_us;
                }
                op_free(&o);
                if (!json) print_row(r, co.show);
            }
        }
    if (json) print_json(mlaf_backend_name(be), device, (int)threads, model_list, dt, cache_order, &co, copy_gbps,
                         copy_bytes, rows, nrows);
    print_summary(json ? stderr : stdout, rows, nrows);
    free(rows);
#ifdef MLAF_WITH_CUDA
    if (be == MLAF_BACKEND_CUDA) bcu_teardown();
#endif
    mlaf_context_free(ctx);
    return any_error ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}
