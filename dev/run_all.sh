#!/bin/sh
# Runs every dev/cuda program (validation, then the timing tables). Builds nothing.
#   dev/run_all.sh [BUILD_DIR]        BUILD_DIR defaults to ./build (binaries in BUILD_DIR/dev/cuda)
#   QUICK=1 dev/run_all.sh ...        skips T = 131072 (each program then takes a few seconds)
# Exit status: 1 if any program failed its validation or could not run, else 0.
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
bindir="$build/dev/cuda"
flag=""
[ -n "$QUICK" ] && flag="--quick"
status=0
for src in "$here"/cuda/*.cu; do
    name=$(basename "$src" .cu)
    bin="$bindir/$name"
    if [ ! -x "$bin" ]; then
        echo "### $name: not built ($bin missing)"
        status=1
        continue
    fi
    echo "### $name $flag"
    start=$(date +%s)
    if ! "$bin" $flag; then
        echo "### $name: FAILED"
        status=1
    fi
    echo "### $name: $(( $(date +%s) - start )) s"
    echo
done
exit $status
