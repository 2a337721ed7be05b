/*
 * main.c — the `mlafuse` command: dispatch to presets | verify | bench.
 *
 *   mlafuse presets [--config F]      the built-in models (docs/models.md), or one from config.json
 *   mlafuse verify  [...]             every op x model x dtype x T x layout vs the oracle
 *   mlafuse bench   [...]             fused vs unfused vs copy bandwidth, in one run
 *
 * Exit codes: 0 ok, 1 failure, 2 usage error. See docs/cli.md.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: mlafuse <command> [options]\n"
            "\n"
            "commands:\n"
            "  presets   list the built-in model presets (or a model from --config config.json)\n"
            "  verify    check every op against the float64 oracle\n"
            "  bench     time the fused ops against copy bandwidth and unfused baselines\n"
            "\n"
            "  mlafuse <command> --help   options of a command\n"
            "  mlafuse --version          version of the command and the library\n");
}

int main(int argc, char **argv) {
    if (argc > 0 && argv[0] && argv[0][0]) cli_program = argv[0];
    if (argc < 2) {
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage(stdout);
        return CLI_EXIT_OK;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        printf("mlafuse %s (library %s, header %s)\n", MLAF_VERSION_STRING,
               mlaf_version_string(), MLAF_VERSION_STRING);
#ifdef MLAF_WITH_CUDA
        printf("backends: cpu, cuda (built; %s)\n",
               mlaf_backend_available(MLAF_BACKEND_CUDA) ? "a GPU is visible" : "no GPU visible");
#else
        printf("backends: cpu (built without CUDA)\n");
#endif
        return CLI_EXIT_OK;
    }
    if (!strcmp(cmd, "presets")) return cmd_presets(argc - 1, argv + 1);
    if (!strcmp(cmd, "verify")) return cmd_verify(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return cmd_bench(argc - 1, argv + 1);
    fprintf(stderr, "mlafuse: unknown command '%s', expected presets, verify or bench\n", cmd);
    usage(stderr);
    return CLI_EXIT_USAGE;
}
