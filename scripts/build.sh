# Sourced by scripts/bench and scripts/test: one build configuration for both, so whichever runs
# second reuses what the first compiled (same directory, same CMake options, no reconfigure).
#   mlaf_build [TARGET ...]   configure build/ if needed, build the targets (default: all);
#                             ninja's progress lines are shown, and the whole output is kept in
#                             build/logs/ (configure.log, build.log); prints the time it took.
# CUDA targets: the GPU this machine has, else sm_90 alone (a compile check: CI has the toolkit
# but no GPU); MLAF_CUDA_ARCHS overrides.
MLAF_BUILD_DIR=${MLAF_BUILD_DIR:-build}

mlaf_cuda_archs() {
  if [ -n "${MLAF_CUDA_ARCHS:-}" ]; then echo "$MLAF_CUDA_ARCHS"
  elif nvidia-smi -L >/dev/null 2>&1; then echo native
  else echo 90; fi
}

mlaf_build() {
  local b=$MLAF_BUILD_DIR t0=$SECONDS jobs
  jobs=$(nproc 2>/dev/null || echo 2)
  mkdir -p "$b/logs"
  echo "build: configuring $b/ (log: $b/logs/configure.log)"
  if ! cmake -S . -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLAF_BUILD_DEV=OFF \
       -DCMAKE_CUDA_ARCHITECTURES="$(mlaf_cuda_archs)" >"$b/logs/configure.log" 2>&1; then
    tail -n 30 "$b/logs/configure.log"; echo "build: configure FAILED (log: $b/logs/configure.log)"; return 1
  fi
  grep -m1 "CUDA backend" "$b/logs/configure.log" | sed 's/^-- /build: /'
  local tgt=(); for t in "$@"; do tgt+=(--target "$t"); done
  echo "build: compiling with $jobs jobs (a first build takes minutes, most of it nvcc; log: $b/logs/build.log)"
  # ninja prints one [done/total] line per step; the log keeps every compiler message
  cmake --build "$b" -j "$jobs" "${tgt[@]}" 2>&1 | tee "$b/logs/build.log" | grep --line-buffered -E '^\[[0-9]+/[0-9]+\]|error|FAILED'
  local rc=${PIPESTATUS[0]}
  echo "build: $([ "$rc" = 0 ] && echo done || echo FAILED) in $(( (SECONDS - t0) / 60 ))m$(( (SECONDS - t0) % 60 ))s"
  [ "$rc" = 0 ] || { tail -n 40 "$b/logs/build.log"; return 1; }
}
