#!/usr/bin/env bash
# One device call of timings: an earlier binary (OLD, e.g. .gpu-pack/old-mlafuse) against the
# pack's, interleaved so both see the same GPU state; the row-layout sweep; the fp8 cache formats.
#   OLD=.gpu-pack/old-mlafuse bash dev/gpu_ab.sh [steps]   steps: ab sweep fp8 (default all)
# Packs every JSON into $OUT/ab.tgz (or /tmp/mlaf-ab) and prints a short table per step last.
set -uo pipefail
cd "$(dirname "$0")/.."
FINAL=${OUT:-/tmp/mlaf-ab}; mkdir -p "$FINAL"; DEST=$(mktemp -d)
trap 'tar czf "$FINAL/ab.tgz" -C "$DEST" .' EXIT # one file back, also when cut short
steps=${*:-ab sweep fp8}
P=/tmp/mlaf-prebuilt; rm -rf $P; mkdir -p $P; tar xJf .gpu-pack/pack.tar.xz -C $P
export LD_LIBRARY_PATH=$P/lib
NEW=$P/tools/mlafuse; OLD=${OLD:-.gpu-pack/old-mlafuse}
b() { local out=$1; shift; timeout 150 "$@" --backend cuda --json ${REPS:+--reps $REPS} > "$DEST/$out.json" 2> "$DEST/$out.err" || echo "$out: rc=$?"; }
for s in $steps; do case $s in
  ab) for p in glm-4.7-flash deepseek-v3; do
        b ab-new-$p $NEW bench --op all --preset $p; b ab-old-$p $OLD bench --op all --preset $p
      done ;;
  sweep) for op in split_qk_norm mla_kv_cache; do
        b sweep-$op $NEW bench --op $op --sweep --tokens 4096,32768; done ;;
  fp8) for p in glm-4.7-flash deepseek-v3; do for c in fp8 fp8_ds_mla; do
        b fp8-$c-$p $NEW bench --op mla_kv_cache --preset $p --cache $c; done; done ;;
esac; done
for s in $steps; do echo "== $s"; python3 scripts/bench_table.py "$DEST"/$s-*.json; done
