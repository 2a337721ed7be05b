/* PLACEHOLDER (replaced by the mlafuse command) */
#include <stdio.h>
#include "mlafuse.h"
int main(void) { printf("mlafuse %s\n", mlaf_version_string()); return 0; }
