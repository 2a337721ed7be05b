# Runs a command and fails unless it exits with EXPECT (ctest: cmake -DCMD=... -DARGS=a;b
# -DEXPECT=2 -P expect_exit.cmake). WILL_FAIL alone would also pass on a crash.
execute_process(COMMAND ${CMD} ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT "${rc}" STREQUAL "${EXPECT}")
  message(FATAL_ERROR "'${CMD} ${ARGS}' exited with '${rc}', expected ${EXPECT}\n${out}${err}")
endif()
message(STATUS "exit ${rc} as expected: ${err}")
