/*
 * cli.h — what the pieces of the `mlafuse` command share: option parsing helpers, lists of
 * token counts / presets / dtypes, the Hugging Face config loader and the commands.
 *
 * Exit codes of every command: 0 success, 1 a case failed or the work could not run
 * (a clear message says why), 2 a usage error (unknown option, bad value).
 */
#ifndef MLAF_CLI_H
#define MLAF_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "mlafuse.h"

#define CLI_EXIT_OK 0
#define CLI_EXIT_FAIL 1
#define CLI_EXIT_USAGE 2

#define CLI_MAX_LIST 64

/* ---- values ------------------------------------------------------------------------------ */
/* Parses "1,7,64" (also "1k"/"64K" = x1024 and "1m" = x1048576) into out[]; every value in
 * [min_value, 2^31). Returns the count, or -1 after printing a message naming `opt`. */
int cli_parse_int_list(const char *opt, const char *text, int64_t min_value, int64_t *out,
                       int cap);
/* A whole number in [lo, hi]; -1 result + message on error (returns 0 ok). */
int cli_parse_int(const char *opt, const char *text, long long lo, long long hi,
                  long long *out);
/* "f32" | "f16" | "bf16"; returns 0 ok, -1 after a message. */
int cli_parse_dtype(const char *opt, const char *text, mlaf_dtype *out);
/* "cpu" | "cuda"; returns 0 ok, -1 after a message. */
int cli_parse_backend(const char *opt, const char *text, mlaf_backend *out);
/* One of the op names (mlaf_op_name); returns 0 ok, -1 after a message. */
int cli_parse_op(const char *opt, const char *text, mlaf_op *out);
/* "NAME" or "all" into want_op[MLAF_OP_COUNT_] (1 = selected); 0, or -1 after a message. */
int cli_parse_op_set(const char *opt, const char *text, int *want_op);
/* "NAME" or "all" for --preset: 0 when valid, else prints a usage error for `cmd` and
 * returns CLI_EXIT_USAGE. */
int cli_check_preset(const char *cmd, const char *text);
/* The model --preset NAME names, and its kv_rope_tail (DeepSeek-V4: 64, else 0). Returns 0, or
 * -1 for an unknown name. */
int cli_find_model(const char *name, mlaf_model_config *cfg, int32_t *kv_rope_tail);

/* Prints "mlafuse <cmd>: <message>\n" on stderr; returns CLI_EXIT_USAGE. */
/* The path of the running binary as invoked (main's argv[0]; "mlafuse" until main sets it), for
 * command lines printed to be pasted back (bench's "# reproduce:"). */
extern const char *cli_program;

int cli_usage_error(const char *cmd, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* For a loop over argv: if argv[*i] is `name`, stores the next argument in *value and
 * advances *i (also accepts "--name=value"). Returns 1 matched, 0 not this option, -1 when
 * the value is missing (after a message). */
int cli_take_value(int argc, char **argv, int *i, const char *name, const char **value);

/* ---- models -------------------------------------------------------------------------------- */
/* Reads a Hugging Face config.json into *cfg. Returns 0, or -1 after printing a message
 * (missing file, bad JSON, missing key, value out of range, or built without cJSON). */
int cli_load_hf_config(const char *path, mlaf_model_config *cfg);
/* The model's RoPE as its config.json gives it: rope_theta [10000] and rope_scaling (or
 * transformers' newer rope_parameters): absent, null or type "default" is plain RoPE; "yarn"
 * fills a YaRN scaling; any other type is an error. cli_load_hf_config checks the same keys. */
typedef struct cli_rope {
    double theta;
    int theta_given; /* 0: the config has no rope_theta (theta is the default) */
    mlaf_rope_scaling scaling;
} cli_rope;
/* cli_load_hf_config plus the RoPE numbers (rope may be NULL). Returns 0, or -1 after a message. */
int cli_load_hf_config_rope(const char *path, mlaf_model_config *cfg, cli_rope *rope);

/* --sweep: the row layouts every norm kernel must serve, as models derived from `base`:
 * q_lora_rank Q in {0, 512, 768, 1024, 1536, 2048, 3072}, kv_lora_rank 512, qk_rope_head_dim
 * R in {0, 64}, named "sweep-qQ-rR". Fills up to cap models and returns how many. */
int cli_sweep_models(const mlaf_model_config *base, mlaf_model_config *out, int cap);
/* A short text for the router: "sigmoid+bias", "softmax", ... (mlaf_score_func_name; a
 * static buffer, valid until the next call). */
const char *cli_score_text(const mlaf_model_config *cfg);

/* `verify --op rms_norm_quant` (verify_rms_norm_quant.c): its cases for every hidden size, dtype and
 * token count, one line each, counted into passed / failed / skipped. */
void verify_rms_norm_quant(mlaf_context *ctx, const int64_t *hidden, int nh, const mlaf_dtype *dts, int ndt,
                           const int64_t *tokens, int ntok, uint64_t seed, float eps, int *passed, int *failed,
                           int *skipped);
/* `verify --op gemm_quant` (verify_gemm_quant.c): every format and rounding for every hidden size,
 * dtype and token count, one line each, counted into passed / failed / skipped. */
void verify_gemm_quant(mlaf_context *ctx, const int64_t *hidden, int nh, const mlaf_dtype *dts, int ndt,
                       const int64_t *tokens, int ntok, uint64_t seed, int *passed, int *failed, int *skipped);

/* ---- commands ------------------------------------------------------------------------------ */
int cmd_presets(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_bench(int argc, char **argv);

#endif
