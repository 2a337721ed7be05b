/*
 * test_fuzz_split_qk_norm.c — random calls of mlaf_split_qk_norm (generator: fuzz_norm.c).
 * The driver, the harness and what every call must satisfy: fuzz_common.h.
 */
#include "fuzz_common.h"



static int run_split(fz *f) { return fuzz_norm(f, 0); }

int main(void) {
    static const fuzz_entry ops[] = {{0, run_split}};
    return fuzz_main(ops, (int)(sizeof ops / sizeof ops[0]));
}
