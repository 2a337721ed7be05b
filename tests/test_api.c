#include "testlib.h"
int main(void) {
    TL_CHECK(mlaf_version_number() == MLAF_VERSION_NUMBER, "VERSION(header==library)");
    return tl_finish();
}
