/*
 * test_fuzz_mla_kv_cache.c — random calls of mlaf_mla_kv_cache (generator: fuzz_norm.c); the fp8_v4 format and
 * the DSA key branch: test_fuzz_mla_kv_cache_dsa.
 * The driver, the harness and what every call must satisfy: fuzz_common.h.
 */
#include "fuzz_common.h"



static int run_kv(fz *f) { return fuzz_norm(f, 1); }

int main(void) {
    static const fuzz_entry ops[] = {{1, run_kv}};
    return fuzz_main(ops, (int)(sizeof ops / sizeof ops[0]));
}
