# A consumer's static link through pkg-config, as a test: installs the build into a scratch
# prefix, removes the shared library there (so only libmlafuse.a can be found), then compiles,
# links and runs a small program with `pkg-config --static --cflags --libs mlafuse`. Fails when
# Libs.private misses a library the archive needs (undefined pthread_* / cuda* symbols).
#   cmake -DBUILD=<build dir> -DCC=<C compiler> -DPKG_CONFIG=<pkg-config> -P check_pkgconfig_static.cmake
set(prefix "${BUILD}/pkgconfig-static-check")
file(REMOVE_RECURSE "${prefix}")
execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BUILD}" --prefix "${prefix}"
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "install into ${prefix} failed: ${err}")
endif()
file(GLOB_RECURSE pc "${prefix}/*/mlafuse.pc")
if(NOT pc)
  message(FATAL_ERROR "no mlafuse.pc under ${prefix}")
endif()
list(GET pc 0 pc)
get_filename_component(pcdir "${pc}" DIRECTORY)
get_filename_component(libdir "${pcdir}" DIRECTORY)
file(GLOB shared "${libdir}/libmlafuse.so*" "${libdir}/libmlafuse*.dylib")
if(shared)
  file(REMOVE ${shared})
endif()

execute_process(COMMAND "${CMAKE_COMMAND}" -E env "PKG_CONFIG_PATH=${pcdir}"
                        "${PKG_CONFIG}" --static --cflags --libs mlafuse
                OUTPUT_VARIABLE flags RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config --static --cflags --libs mlafuse failed")
endif()
message(STATUS "pkg-config --static: ${flags}")
separate_arguments(flags UNIX_COMMAND "${flags}")

# Creates a CPU context and runs one op: the archive's threading code (src/cpu/parallel.c) is linked in.
file(WRITE "${prefix}/consumer.c" [=[
#include <mlafuse.h>
#include <stdio.h>
int main(void) {
    mlaf_context *ctx = NULL;
    if (mlaf_context_create(&ctx, MLAF_BACKEND_CPU) != MLAF_OK) return 1;
    if (mlaf_context_set_threads(ctx, 2) != MLAF_OK) return 2;
    static float latent[64][8], w_kv[4] = {1, 1, 1, 1}, k_nope[64][4];
    for (int t = 0; t < 64; t++)
        for (int i = 0; i < 8; i++) latent[t][i] = (float)(t + i);
    mlaf_split_qk_norm_params p = {0, 4, 4, 1e-6f, 1e-6f};
    mlaf_tensor L = mlaf_tensor_2d(latent, MLAF_F32, 64, 8, 8), W = mlaf_tensor_1d(w_kv, MLAF_F32, 4),
                K = mlaf_tensor_2d(k_nope, MLAF_F32, 64, 4, 4);
    mlaf_status st = mlaf_split_qk_norm(ctx, &p, &L, NULL, &W, NULL, &K, NULL);
    printf("mlafuse %s, static link: %s\n", mlaf_version_string(), mlaf_status_name(st));
    mlaf_context_free(ctx);
    return st == MLAF_OK ? 0 : 3;
}
]=])
execute_process(COMMAND "${CC}" "${prefix}/consumer.c" -o "${prefix}/consumer" ${flags}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "static link through pkg-config failed:\n${out}")
endif()
execute_process(COMMAND "${prefix}/consumer" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
message(STATUS "${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the statically linked program failed (exit ${rc})")
endif()
