/*
 * fuzz_main.c — the fuzz tests' driver (see fuzz_common.h): per backend and per op of the test,
 * MLAF_FUZZ_CALLS calls, each from its own seed, judged and counted; a crash names the call.
 */
#define _POSIX_C_SOURCE 200809L /* sigaction, write */
#include <signal.h>
#include <unistd.h>

#include "fuzz_common.h"

/* ---- the driver --------------------------------------------------------------------------- */
/* A crash names the call to replay (the sanitizer build keeps its own, fuller report). */
static volatile sig_atomic_t CUR_OP = -1;
static volatile int64_t CUR_CALL = -1;
#if !defined(__SANITIZE_ADDRESS__)
static void on_crash(int sig) {
    static const char *const ops[FZ_NOPS] = {"split", "kv", "rope", "gate", "ctx", "ropeout", "idxq", "hash", "dsa", "v4", "rnq", "gq"};
    char line[160];
    int n = 0;
    const char *a = "\nFUZZ: crashed in call MLAF_FUZZ_ONLY=";
    while (*a && n < 100) line[n++] = *a++;
    for (const char *o = CUR_OP >= 0 && CUR_OP < FZ_NOPS ? ops[CUR_OP] : "?"; *o; o++) line[n++] = *o;
    line[n++] = ':';
    char digits[24];
    int d = 0;
    int64_t v = CUR_CALL < 0 ? 0 : CUR_CALL;
    do digits[d++] = (char)('0' + v % 10), v /= 10;
    while (v && d < 20);
    while (d) line[n++] = digits[--d];
    line[n++] = '\n';
    if (write(2, line, (size_t)n) < 0) _exit(128 + sig);
    _exit(128 + sig);
}
#endif

static const char *const OPS[FZ_NOPS] = {"split", "kv", "rope", "gate", "ctx", "ropeout", "idxq", "hash", "dsa", "v4", "rnq", "gq"};
static const char *const OP_NAMES[FZ_NOPS] = {"split_qk_norm", "mla_kv_cache", "rope_q", "moe_gate", "context_and_tables",
                                              "rope_q_out", "indexer_q", "moe_gate_hash", "mla_kv_cache_dsa", "mla_kv_cache_fp8_v4",
                                              "rms_norm_quant", "gemm_quant"};

static uint64_t call_seed(uint64_t base, int op, int64_t i) {
    return base ^ ((uint64_t)(op + 1) << 56) ^ ((uint64_t)i * 0x9E3779B97F4A7C15ull);
}
int fuzz_main(const fuzz_entry *ops, int nops) {
    setvbuf(stdout, NULL, _IOLBF, 0);
#if !defined(__SANITIZE_ADDRESS__)
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_crash;
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
    sigaction(SIGFPE, &sa, NULL);
    sigaction(SIGABRT, &sa, NULL);
#endif
    const char *e = getenv("MLAF_FUZZ_CALLS");
    const int64_t calls = e && atoll(e) > 0 ? atoll(e) : 4000;
    e = getenv("MLAF_FUZZ_SEED");
    const uint64_t seed = e ? strtoull(e, NULL, 0) : 31;
    int only_op = -1;
    int64_t only_i = -1;
    if ((e = getenv("MLAF_FUZZ_ONLY")) != NULL) {
        for (int k = 0; k < FZ_NOPS; k++) {
            size_t n = strlen(OPS[k]);
            if (!strncmp(e, OPS[k], n) && e[n] == ':') only_op = k, only_i = atoll(e + n + 1);
        }
        if (only_op < 0) {
            printf("MLAF_FUZZ_ONLY=%s: expected op:index, op one of split, kv, rope, gate, ctx, ropeout, idxq, hash, dsa, v4, rnq, gq\n", e);
            return 2;
        }
        int here = 0;
        for (int k = 0; k < nops; k++) here |= ops[k].op == only_op;
        if (!here) { /* another test_fuzz_<op> runs that op */
            printf("MLAF_FUZZ_ONLY=%s: op %s (%s) is not in this test; see its test_fuzz_<op>\n", e, OPS[only_op],
                   OP_NAMES[only_op]);
            return 2;
        }
    }
    mlaf_backend bes[MLAF_BACKEND_COUNT_];
    int nbe = tl_backends(bes);
    mlaf_context *host = tl_context(MLAF_BACKEND_CPU);
    if (!host) return tl_finish();
    for (int bi = 0; bi < nbe; bi++) {
        fz f;
        memset(&f, 0, sizeof f);
        f.be = bes[bi];
        f.host = host;
        f.ctx = tl_context(f.be);
        if (!f.ctx) continue;
        for (int k = 0; k < nops; k++) {
            const int op = ops[k].op;
            if (only_op >= 0 && op != only_op) continue;
            int64_t ok_calls = 0, rejected = 0, failures = 0, by_status[MLAF_STATUS_COUNT_] = {0};
            char first[1200] = "";
            for (int64_t i = only_i >= 0 ? only_i : 0; i < (only_i >= 0 ? only_i + 1 : calls); i++) {
                CUR_OP = op, CUR_CALL = i;
                fz_reset(&f, call_seed(seed, op, i));
                int res = ops[k].run(&f);
                if (only_i >= 0) describe(&f);
                if (res < 0) fail(&f, "buffer allocation failed");
                if (f.failed) {
                    char line[1200];
                    snprintf(line, sizeof line, "call %lld:%s: %s (replay: MLAF_FUZZ_SEED=%llu MLAF_FUZZ_ONLY=%s:%lld)", (long long)i,
                             f.mut[0] ? f.mut : " no mutation", f.why, (unsigned long long)seed, OPS[op], (long long)i);
                    if (failures < FZ_SHOW_FAILS) printf("  FUZZ(op=%s,backend=%s) %s\n", OP_NAMES[op], mlaf_backend_name(f.be), line);
                    if (!failures) snprintf(first, sizeof first, "%s", line);
                    failures++;
                } else if (res == 1) {
                    ok_calls++;
                } else {
                    rejected++;
                    if ((int)f.status > 0 && (int)f.status < MLAF_STATUS_COUNT_) by_status[f.status]++;
                }
            }
            fz_reset(&f, 0);
            char name[200];
            snprintf(name, sizeof name, "FUZZ(op=%s,calls=%lld,seed=%llu,backend=%s)", OP_NAMES[op],
                     (long long)(only_i >= 0 ? 1 : calls), (unsigned long long)seed, mlaf_backend_name(f.be));
            if (tl_case(failures == 0, name, "%lld of the calls failed; first: %s", (long long)failures, first)) {
                if (op == 4)
                    printf("  %lld helper calls, each status and result as the header says", (long long)ok_calls);
                else if (op > 4 && op < 10) /* rms_norm_quant (10) and gemm_quant (11): by the oracle */
                    printf("  %lld succeeded with every write inside the views the header lets it write, %lld rejected with a "
                           "message and nothing written",
                           (long long)ok_calls, (long long)rejected);
                else
                    printf("  %lld succeeded and matched the oracle, %lld rejected with a message and nothing written",
                           (long long)ok_calls, (long long)rejected);
                for (int k = 1; k < MLAF_STATUS_COUNT_; k++)
                    if (by_status[k]) printf("%s %s %lld", k == 1 ? ":" : "", mlaf_status_name((mlaf_status)k) + 9, (long long)by_status[k]);
                printf("\n");
            }
        }
        mlaf_context_free(f.ctx);
    }
    mlaf_context_free(host);
    return tl_finish();
}
